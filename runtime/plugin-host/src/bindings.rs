//! Host bindings generated from `wit/weft-plugin.wit`, one module per world.

pub mod sampler {
    wasmtime::component::bindgen!({ path: "../../wit", world: "sampler-plugin", additional_derives: [PartialEq] });
}

pub mod verifier {
    wasmtime::component::bindgen!({ path: "../../wit", world: "verifier-plugin", additional_derives: [PartialEq], with: { "weft:plugin/types": super::sampler::weft::plugin::types } });
}

pub mod admission {
    wasmtime::component::bindgen!({ path: "../../wit", world: "admission-plugin", additional_derives: [PartialEq], with: { "weft:plugin/types": super::sampler::weft::plugin::types } });
}

pub use sampler::exports::weft::plugin::sampler::{Decision, SamplingParams, SamplingPlan, StepBatch};

/// Parameters that ask for nothing: temperature 1, no truncation, no penalties.
pub fn neutral_params(vocab_size: u32) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.0,
        typical_p: 1.0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        logit_bias: vec![],
        banned_tokens: vec![],
        min_tokens: 0,
        vocab_size,
        eos_tokens: vec![],
        extra: String::new(),
    }
}

/// One sequence of a sampling step as the engine hands it over; flattened into a
/// [`StepBatch`] for the call.
#[derive(Clone, Debug, PartialEq)]
pub struct Sequence {
    pub request_id: u64,
    pub state: Vec<u8>,
    pub candidates: Candidates,
    pub uniforms: Vec<f64>,
    pub history: Option<Vec<u32>>,
}

/// Flattens sequences into the WIT batch layout (a few copies per call, not per sequence).
pub fn flatten(batch: &[Sequence]) -> StepBatch {
    let per = batch.iter().map(|s| s.uniforms.len()).max().unwrap_or(0);
    let n: usize = batch.iter().map(|s| s.candidates.ids.len()).sum();
    let mut b = StepBatch {
        request_ids: Vec::with_capacity(batch.len()),
        offsets: Vec::with_capacity(batch.len() + 1),
        ids: Vec::with_capacity(n),
        logits: Vec::with_capacity(n),
        logsumexps: Vec::with_capacity(batch.len()),
        complete: Vec::with_capacity(batch.len()),
        state_offsets: Vec::with_capacity(batch.len() + 1),
        states: Vec::new(),
        uniforms_per_sequence: per as u32,
        uniforms: Vec::with_capacity(batch.len() * per),
        history_offsets: Vec::with_capacity(batch.len() + 1),
        history: Vec::new(),
    };
    b.offsets.push(0);
    b.state_offsets.push(0);
    b.history_offsets.push(0);
    for s in batch {
        b.request_ids.push(s.request_id);
        b.ids.extend_from_slice(&s.candidates.ids);
        b.logits.extend_from_slice(&s.candidates.logits);
        b.offsets.push(b.ids.len() as u32);
        b.logsumexps.push(s.candidates.logsumexp);
        b.complete.push(s.candidates.complete);
        b.states.extend_from_slice(&s.state);
        b.state_offsets.push(b.states.len() as u32);
        b.uniforms.extend_from_slice(&s.uniforms);
        b.uniforms.resize(b.uniforms.len() + per - s.uniforms.len(), 0.0);
        if let Some(h) = &s.history {
            b.history.extend_from_slice(h);
        }
        b.history_offsets.push(b.history.len() as u32);
    }
    b
}
pub use admission::exports::weft::plugin::admission::{Capacity, Rejection, Running, ScheduleDecision, Waiting};
pub use sampler::weft::plugin::types::{Candidates, PluginInfo, PluginKind};
pub use verifier::exports::weft::plugin::verifier::{DraftStep, Verdict};
