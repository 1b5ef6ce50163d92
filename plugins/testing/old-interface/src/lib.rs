//! Test sampler that claims an older interface version: the host must refuse to load it.

use weft_plugin_sdk::sampler::exports::weft::plugin::sampler::{Decision, Guest, SamplingParams, SamplingPlan, StepBatch};
use weft_plugin_sdk::sampler::weft::plugin::types::{PluginInfo, PluginKind};

struct Old;

impl Guest for Old {
    fn describe() -> PluginInfo {
        PluginInfo { name: "old".into(), version: "0.0.1".into(), interface_version: "0.0.9".into(), kind: PluginKind::Sampler }
    }
    fn configure(_p: SamplingParams) -> Result<SamplingPlan, String> {
        Err("unused".into())
    }
    fn sample(batch: StepBatch) -> Vec<Decision> {
        weft_plugin_sdk::batch::sequences(&batch).map(|s| Decision::Token(s.ids[0])).collect()
    }
}

weft_plugin_sdk::sampler::export_sampler!(Old);
