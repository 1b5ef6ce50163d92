//! Per-sequence views over a sampler's flattened step batch.

use crate::sampler::exports::weft::plugin::sampler::StepBatch;

/// One sequence of a step batch, borrowed from the flat arrays.
pub struct SeqView<'a> {
    pub request_id: u64,
    pub state: &'a [u8],
    /// Candidate ids, highest logit first.
    pub ids: &'a [u32],
    pub logits: &'a [f32],
    /// Log-sum-exp over the full vocabulary: `p(ids[i]) = exp(logits[i] - logsumexp)`.
    pub logsumexp: f32,
    /// Every token outside `ids` has probability zero.
    pub complete: bool,
    pub uniforms: &'a [f64],
    pub history: &'a [u32],
}

fn range(off: &[u32], i: usize) -> std::ops::Range<usize> {
    let a = off.get(i).copied().unwrap_or(0) as usize;
    let b = off.get(i + 1).copied().unwrap_or(a as u32) as usize;
    a..b.max(a)
}

/// Iterates the sequences of `b` in order.
pub fn sequences(b: &StepBatch) -> impl Iterator<Item = SeqView<'_>> {
    let per = b.uniforms_per_sequence as usize;
    (0..b.request_ids.len()).map(move |i| SeqView {
        request_id: b.request_ids[i],
        state: b.states.get(range(&b.state_offsets, i)).unwrap_or(&[]),
        ids: b.ids.get(range(&b.offsets, i)).unwrap_or(&[]),
        logits: b.logits.get(range(&b.offsets, i)).unwrap_or(&[]),
        logsumexp: b.logsumexps.get(i).copied().unwrap_or(0.0),
        complete: b.complete.get(i).copied().unwrap_or(false),
        uniforms: b.uniforms.get(i * per..(i + 1) * per).unwrap_or(&[]),
        history: b.history.get(range(&b.history_offsets, i)).unwrap_or(&[]),
    })
}
