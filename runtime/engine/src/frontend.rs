//! The sampling front end the native core runs before a sampler sees anything, as the engine
//! asks the backend for it: a request's plan becomes a [`FrontRow`] (token edits for
//! repetition/presence/frequency penalties, logit bias, banned tokens and min-tokens EOS
//! suppression; the temperature; how many candidates), the backend applies it to the step's
//! logits and extracts the top-K with the full-vocabulary log-sum-exp (on the device for GPU
//! backends: only the candidates cross to the host). `weft_backend::front` holds the math.

use std::collections::BTreeMap;
use weft_backend::front::{self, FrontOut, FrontRow, TokenEdit};
use weft_plugin_host::{Candidates, SamplingParams, SamplingPlan};

/// The front-end row for one request: `tokens` are its prompt + generated tokens, `generated`
/// how many of them were generated, `k` the candidates wanted (0 or more than a device
/// extracts: the engine finishes the row on the host). Edits of ids outside the vocabulary are
/// dropped (a plan may name any id; the backend refuses them).
pub fn front_row(plan: &SamplingPlan, tokens: &[u32], generated: usize, eos: &[u32], k: usize, vocab: usize) -> FrontRow {
    let mut edits: BTreeMap<u32, TokenEdit> = BTreeMap::new();
    fn at(edits: &mut BTreeMap<u32, TokenEdit>, t: u32) -> &mut TokenEdit {
        edits.entry(t).or_insert(TokenEdit { token: t, repetition: 1.0, subtract: 0.0, bias: 0.0, banned: false })
    }
    if plan.repetition_penalty != 1.0 {
        for &t in tokens {
            at(&mut edits, t).repetition = plan.repetition_penalty;
        }
    }
    if plan.presence_penalty != 0.0 || plan.frequency_penalty != 0.0 {
        let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
        for &t in &tokens[tokens.len() - generated..] {
            *counts.entry(t).or_insert(0) += 1;
        }
        for (t, c) in counts {
            at(&mut edits, t).subtract = plan.presence_penalty + plan.frequency_penalty * c as f32;
        }
    }
    for &(t, b) in &plan.logit_bias {
        at(&mut edits, t).bias += b;
    }
    for &t in &plan.banned_tokens {
        at(&mut edits, t).banned = true;
    }
    if (generated as u32) < plan.min_tokens {
        for &t in eos {
            at(&mut edits, t).banned = true;
        }
    }
    FrontRow { k: front::device_k(k), temperature: plan.temperature, edits: edits.into_values().filter(|e| (e.token as usize) < vocab).collect() }
}

/// How many candidates the native sampler needs to decide without the whole vocabulary:
/// one when greedy, `top_k` when set; 0 (everything) otherwise.
pub fn native_k(p: &SamplingParams) -> usize {
    if p.temperature == 0.0 || p.top_k == 1 {
        1
    } else {
        p.top_k as usize
    }
}

/// A backend's answer as the plugins' candidate list.
pub fn candidates(o: FrontOut) -> Candidates {
    Candidates { complete: o.ids.len() == o.finite, ids: o.ids, logits: o.logits, logsumexp: o.logsumexp }
}

/// The top `k` (0 = all) of an edited host row, after the row's temperature.
pub fn extract(edited: &[f32], row: &FrontRow, k: usize) -> Candidates {
    candidates(front::top_k(&front::scaled(edited, row), k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> SamplingPlan {
        SamplingPlan {
            temperature: 1.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: vec![],
            banned_tokens: vec![],
            min_tokens: 0,
            candidates: 0,
            wants_history: false,
            state: vec![],
        }
    }

    #[test]
    fn plan_to_edits() {
        let mut l = vec![1.0f32, 2.0, -1.0, 0.5];
        let mut p = plan();
        p.repetition_penalty = 2.0;
        p.presence_penalty = 0.5;
        p.frequency_penalty = 0.25;
        p.logit_bias = vec![(3, 1.0)];
        p.banned_tokens = vec![0];
        p.min_tokens = 5;
        // tokens: prompt [1], generated [2, 2]
        let row = front_row(&p, &[1, 2, 2], 2, &[3], 8, 100);
        assert_eq!(row.edits.len(), 4, "one edit per token");
        front::apply_edits(&mut l, &row);
        assert_eq!(l[0], f32::NEG_INFINITY, "banned");
        assert_eq!(l[1], 1.0, "repetition: 2.0 / 2");
        assert_eq!(l[2], -2.0 - 0.5 - 0.5, "repetition then presence + 2 x frequency");
        assert_eq!(l[3], f32::NEG_INFINITY, "EOS suppressed before min_tokens");
        let all = extract(&l, &row, 0);
        assert_eq!(all.ids, vec![1, 2]);
        assert!(all.complete, "the banned tokens have zero probability");
        assert_eq!(front_row(&p, &[1], 0, &[], front::MAX_DEVICE_K + 1, 100).k, 0, "more than a device extracts: the whole row");
        assert!(front_row(&SamplingPlan { banned_tokens: vec![5, 500], ..p.clone() }, &[1], 0, &[], 1, 100).edits.iter().all(|e| e.token < 100), "ids outside the vocabulary are dropped");
    }

    #[test]
    fn native_needs() {
        let mut p = weft_plugin_host::neutral_params(100);
        p.temperature = 0.0;
        assert_eq!(native_k(&p), 1);
        p.temperature = 0.8;
        p.top_k = 40;
        assert_eq!(native_k(&p), 40);
        p.top_k = 0;
        assert_eq!(native_k(&p), 0);
    }
}
