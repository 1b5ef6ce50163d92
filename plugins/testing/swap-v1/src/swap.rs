//! Test sampler "swap", built twice (1.0.0 and 2.0.0) from this one source: version 1 picks
//! the best candidate, version 2 the second best, so a test can tell which version answered.

use weft_plugin_sdk::sampler::exports::weft::plugin::sampler::{Decision, Guest, SamplingParams, SamplingPlan, StepBatch};
use weft_plugin_sdk::sampler::weft::plugin::types::{PluginInfo, PluginKind};

struct Swap;

const PICK: usize = if env!("CARGO_PKG_VERSION_MAJOR").as_bytes()[0] == b'1' { 0 } else { 1 };

impl Guest for Swap {
    fn describe() -> PluginInfo {
        PluginInfo { name: "swap".into(), version: env!("CARGO_PKG_VERSION").into(), interface_version: weft_plugin_sdk::INTERFACE_VERSION.into(), kind: PluginKind::Sampler }
    }
    fn configure(p: SamplingParams) -> Result<SamplingPlan, String> {
        Ok(SamplingPlan { temperature: 1.0, repetition_penalty: 1.0, presence_penalty: 0.0, frequency_penalty: 0.0, logit_bias: vec![], banned_tokens: p.banned_tokens, min_tokens: 0, candidates: 2, wants_history: false, state: vec![PICK as u8] })
    }
    fn sample(batch: StepBatch) -> Vec<Decision> {
        weft_plugin_sdk::batch::sequences(&batch).map(|s| Decision::Token(s.ids[PICK.min(s.ids.len() - 1)])).collect()
    }
}

weft_plugin_sdk::sampler::export_sampler!(Swap);
