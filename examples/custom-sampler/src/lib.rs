//! A custom sampler in a dozen lines: "top-a" sampling (keep tokens with p >= a * p_max^2),
//! with `a` from the request's `extra` JSON, e.g. `{"sampler": "top-a", "top_a": 0.2}`.
//! Build: `cargo build --release --target wasm32-wasip2` in plugins/ (it is a member there).

use weft_plugin_sdk::math;
use weft_plugin_sdk::sampler::exports::weft::plugin::sampler::{Decision, Guest, SamplingParams, SamplingPlan, StepBatch};
use weft_plugin_sdk::sampler::weft::plugin::types::{PluginInfo, PluginKind};

struct TopA;

impl Guest for TopA {
    fn describe() -> PluginInfo {
        PluginInfo { name: "top-a".into(), version: "0.1.0".into(), interface_version: weft_plugin_sdk::INTERFACE_VERSION.into(), kind: PluginKind::Sampler }
    }
    fn configure(p: SamplingParams) -> Result<SamplingPlan, String> {
        let a: f32 = p.extra.split("\"top_a\"").nth(1).and_then(|r| r.trim_start_matches([':', ' ']).split([',', '}']).next()?.trim().parse().ok()).unwrap_or(0.2);
        Ok(SamplingPlan { temperature: p.temperature.max(1e-3), repetition_penalty: 1.0, presence_penalty: 0.0, frequency_penalty: 0.0, logit_bias: p.logit_bias, banned_tokens: p.banned_tokens, min_tokens: p.min_tokens, candidates: 64, wants_history: false, state: a.to_le_bytes().to_vec() })
    }
    fn sample(batch: StepBatch) -> Vec<Decision> {
        weft_plugin_sdk::batch::sequences(&batch).map(|s| {
            let a = f32::from_le_bytes(s.state[..4].try_into().unwrap()) as f64;
            let mut p: Vec<f64> = s.logits.iter().map(|&l| (l as f64 - s.logsumexp as f64).exp()).collect();
            let thr = a * p[0] * p[0];
            p.iter_mut().for_each(|x| if *x < thr { *x = 0.0 });
            Decision::Token(s.ids[math::sample_index(&p, s.uniforms[0])])
        }).collect()
    }
}

weft_plugin_sdk::sampler::export_sampler!(TopA);
