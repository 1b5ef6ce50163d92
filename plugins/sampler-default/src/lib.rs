//! weft's default sampler: greedy, temperature, top-k, top-p, min-p and typical-p over the
//! host's top-K candidates, with `top_k_renorm_prob` semantics (keep the top k, zero the rest,
//! renormalise; then top-p, min-p on what is left). It asks for more candidates, or the full
//! vocabulary, only when the candidates cannot decide exactly.

use weft_plugin_sdk::batch::{sequences, SeqView};
use weft_plugin_sdk::math;
use weft_plugin_sdk::sampler::exports::weft::plugin::sampler::{Decision, Guest, SamplingParams, SamplingPlan, StepBatch};
use weft_plugin_sdk::sampler::weft::plugin::types::{PluginInfo, PluginKind};

/// Candidates requested per step when no top-k bounds the distribution.
const DEFAULT_CANDIDATES: u32 = 64;
/// Past this many candidates an untruncated draw asks for the whole vocabulary at once.
const WIDEST_MORE: usize = 1024;

struct DefaultSampler;

/// Per-request policy, round-tripped through the host as `state`.
struct Policy {
    greedy: bool,
    top_k: u32,
    top_p: f32,
    min_p: f32,
    typical_p: f32,
}

impl Policy {
    fn encode(&self) -> Vec<u8> {
        let mut v = vec![self.greedy as u8];
        v.extend(self.top_k.to_le_bytes());
        v.extend(self.top_p.to_le_bytes());
        v.extend(self.min_p.to_le_bytes());
        v.extend(self.typical_p.to_le_bytes());
        v
    }
    fn decode(b: &[u8]) -> Option<Policy> {
        if b.len() != 17 {
            return None;
        }
        let f = |i: usize| f32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Policy { greedy: b[0] != 0, top_k: u32::from_le_bytes([b[1], b[2], b[3], b[4]]), top_p: f(5), min_p: f(9), typical_p: f(13) })
    }
}

fn check(ok: bool, name: &str, v: f32, want: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("{name} = {v} is out of range: {want}"))
    }
}

impl Guest for DefaultSampler {
    fn describe() -> PluginInfo {
        PluginInfo { name: "default".into(), version: env!("CARGO_PKG_VERSION").into(), interface_version: weft_plugin_sdk::INTERFACE_VERSION.into(), kind: PluginKind::Sampler }
    }

    fn configure(p: SamplingParams) -> Result<SamplingPlan, String> {
        check(p.temperature.is_finite() && p.temperature >= 0.0, "temperature", p.temperature, "must be >= 0")?;
        check(p.top_p > 0.0 && p.top_p <= 1.0, "top_p", p.top_p, "must be in (0, 1]")?;
        check((0.0..=1.0).contains(&p.min_p), "min_p", p.min_p, "must be in [0, 1]")?;
        check(p.typical_p > 0.0 && p.typical_p <= 1.0, "typical_p", p.typical_p, "must be in (0, 1]")?;
        check(p.repetition_penalty.is_finite() && p.repetition_penalty > 0.0, "repetition_penalty", p.repetition_penalty, "must be > 0")?;
        check((-2.0..=2.0).contains(&p.presence_penalty), "presence_penalty", p.presence_penalty, "must be in [-2, 2]")?;
        check((-2.0..=2.0).contains(&p.frequency_penalty), "frequency_penalty", p.frequency_penalty, "must be in [-2, 2]")?;
        let greedy = p.temperature == 0.0 || p.top_k == 1;
        let policy = Policy { greedy, top_k: p.top_k, top_p: p.top_p, min_p: p.min_p, typical_p: p.typical_p };
        let candidates = if greedy {
            1
        } else if p.top_k > 0 {
            p.top_k
        } else if p.typical_p < 1.0 {
            0
        } else {
            DEFAULT_CANDIDATES
        };
        Ok(SamplingPlan {
            temperature: if greedy { 1.0 } else { p.temperature },
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            logit_bias: p.logit_bias,
            banned_tokens: p.banned_tokens,
            min_tokens: p.min_tokens,
            candidates,
            wants_history: false,
            state: policy.encode(),
        })
    }

    fn sample(batch: StepBatch) -> Vec<Decision> {
        sequences(&batch).map(|s| decide(&s)).collect()
    }
}

fn decide(c: &SeqView) -> Decision {
    let Some(pol) = Policy::decode(c.state) else { return Decision::Token(c.ids.first().copied().unwrap_or(0)) };
    if c.ids.is_empty() {
        return Decision::FullVocabulary;
    }
    if pol.greedy {
        return Decision::Token(c.ids[0]);
    }
    let u = c.uniforms.first().copied().unwrap_or(0.0);
    let lse = c.logsumexp as f64;
    // Exact full-vocabulary probabilities of the candidates.
    let mut p: Vec<f64> = c.logits.iter().map(|&l| (l as f64 - lse).exp()).collect();
    let n = c.ids.len();
    let more = || Decision::MoreCandidates((n as u32).saturating_mul(4).max(DEFAULT_CANDIDATES));
    // Tokens outside the candidates have zero weight once a truncation bounds the set (top-k
    // with exactly k candidates) or the set is complete; otherwise each step below must be
    // decidable from the head of the distribution or it asks for more.
    let mut bounded = c.complete;
    let mut truncated = false;
    if pol.top_k > 0 {
        if n < pol.top_k as usize && !c.complete {
            return more();
        }
        math::keep_top_k(&mut p, pol.top_k as usize);
        bounded = true;
        truncated = true;
    }
    if pol.typical_p < 1.0 {
        if !bounded {
            return Decision::FullVocabulary;
        }
        math::keep_typical(&mut p, pol.typical_p);
        truncated = true;
    }
    if pol.top_p < 1.0 {
        // Cumulative mass relative to what survived so far (top_k_renorm_prob semantics).
        let denom: f64 = if bounded { p.iter().sum() } else { 1.0 };
        let mut cum = 0.0;
        let mut cut = None;
        for (i, x) in p.iter().enumerate() {
            cum += x / denom;
            if cum >= pol.top_p as f64 {
                cut = Some(i + 1);
                break;
            }
        }
        match cut {
            Some(k) => math::keep_top_k(&mut p, k),
            None if bounded => {}
            None => return more(),
        }
        bounded = true;
        truncated = true;
    }
    if pol.min_p > 0.0 {
        let thr = pol.min_p as f64 * p[0];
        if !bounded && p[n - 1] >= thr {
            return more();
        }
        math::keep_min_p(&mut p, pol.min_p);
        truncated = true;
    }
    if truncated {
        return Decision::Token(c.ids[math::sample_index(&p, u)]);
    }
    // Untruncated: inverse CDF over the exact probabilities; u beyond the candidates' mass
    // falls outside them.
    let mut acc = 0.0;
    for (i, x) in p.iter().enumerate() {
        acc += x;
        if u < acc {
            return Decision::Token(c.ids[i]);
        }
    }
    if c.complete {
        Decision::Token(c.ids[n - 1])
    } else if n < WIDEST_MORE {
        // Widen the head first: an engine extracts a few hundred candidates on the device far
        // cheaper than it ships the whole vocabulary (163,840 entries for Kimi).
        more()
    } else {
        Decision::FullVocabulary
    }
}

weft_plugin_sdk::sampler::export_sampler!(DefaultSampler);
