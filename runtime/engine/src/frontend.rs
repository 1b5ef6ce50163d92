//! The sampling front end the native core runs before a sampler plugin sees anything: the
//! plan's transforms on one logits row (repetition/presence/frequency penalties, logit bias,
//! banned tokens, min-tokens EOS suppression, temperature), then top-K extraction and the
//! full-vocabulary log-sum-exp. (On a GPU backend this runs on the device.)

use weft_plugin_host::{Candidates, SamplingPlan};

/// Applies `plan` to `logits` in place. `tokens` are the request's prompt + generated tokens,
/// `generated` how many of them were generated.
pub fn apply_plan(logits: &mut [f32], plan: &SamplingPlan, tokens: &[u32], generated: usize, eos: &[u32]) {
    let vocab = logits.len();
    if plan.repetition_penalty != 1.0 {
        let mut seen = vec![false; vocab];
        for &t in tokens {
            let t = t as usize;
            if t < vocab && !seen[t] {
                seen[t] = true;
                let l = &mut logits[t];
                *l = if *l > 0.0 { *l / plan.repetition_penalty } else { *l * plan.repetition_penalty };
            }
        }
    }
    if plan.presence_penalty != 0.0 || plan.frequency_penalty != 0.0 {
        let mut counts = std::collections::HashMap::new();
        for &t in &tokens[tokens.len() - generated..] {
            *counts.entry(t).or_insert(0u32) += 1;
        }
        for (t, c) in counts {
            if (t as usize) < vocab {
                logits[t as usize] -= plan.presence_penalty + plan.frequency_penalty * c as f32;
            }
        }
    }
    for &(t, b) in &plan.logit_bias {
        if (t as usize) < vocab {
            logits[t as usize] += b;
        }
    }
    for &t in &plan.banned_tokens {
        if (t as usize) < vocab {
            logits[t as usize] = f32::NEG_INFINITY;
        }
    }
    if (generated as u32) < plan.min_tokens {
        for &t in eos {
            if (t as usize) < vocab {
                logits[t as usize] = f32::NEG_INFINITY;
            }
        }
    }
    if plan.temperature > 0.0 && plan.temperature != 1.0 {
        let inv = 1.0 / plan.temperature;
        logits.iter_mut().for_each(|l| *l *= inv);
    }
}

/// The top `k` (0 = all) finite logits, highest first (ties by id), with the log-sum-exp over
/// the whole row. `complete` when nothing with non-zero probability is left out.
pub fn extract(logits: &[f32], k: usize) -> Candidates {
    let finite: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize].is_finite()).collect();
    let k = if k == 0 { finite.len() } else { k.min(finite.len()) };
    let cmp = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    let mut ids = finite;
    let n_finite = ids.len();
    if k < ids.len() && k > 0 {
        ids.select_nth_unstable_by(k - 1, cmp);
        ids.truncate(k);
    }
    ids.sort_by(cmp);
    let m = ids.first().map(|&i| logits[i as usize]).unwrap_or(0.0) as f64;
    let lse = m + logits.iter().filter(|l| l.is_finite()).map(|&l| (l as f64 - m).exp()).sum::<f64>().ln();
    Candidates { logits: ids.iter().map(|&i| logits[i as usize]).collect(), complete: ids.len() == n_finite, ids, logsumexp: lse as f32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> SamplingPlan {
        SamplingPlan { temperature: 1.0, repetition_penalty: 1.0, presence_penalty: 0.0, frequency_penalty: 0.0, logit_bias: vec![], banned_tokens: vec![], min_tokens: 0, candidates: 0, wants_history: false, state: vec![] }
    }

    #[test]
    fn transforms() {
        let mut l = vec![1.0f32, 2.0, -1.0, 0.5];
        let mut p = plan();
        p.repetition_penalty = 2.0;
        p.presence_penalty = 0.5;
        p.frequency_penalty = 0.25;
        p.logit_bias = vec![(3, 1.0)];
        p.banned_tokens = vec![0];
        p.min_tokens = 5;
        // tokens: prompt [1], generated [2, 2]
        apply_plan(&mut l, &p, &[1, 2, 2], 2, &[3]);
        assert_eq!(l[0], f32::NEG_INFINITY, "banned");
        assert_eq!(l[1], 1.0, "repetition: 2.0 / 2");
        assert_eq!(l[2], -2.0 - 0.5 - 0.5, "repetition then presence + 2 x frequency");
        assert_eq!(l[3], f32::NEG_INFINITY, "EOS suppressed before min_tokens");
    }

    #[test]
    fn extraction() {
        let l = vec![0.0f32, 3.0, f32::NEG_INFINITY, 3.0, 1.0];
        let c = extract(&l, 2);
        assert_eq!(c.ids, vec![1, 3]);
        assert!(!c.complete);
        let lse = (1.0f64 + 2.0 * 3f64.exp() + 1f64.exp()).ln();
        assert!((c.logsumexp as f64 - lse).abs() < 1e-5);
        let all = extract(&l, 0);
        assert_eq!(all.ids, vec![1, 3, 4, 0]);
        assert!(all.complete, "the banned token has zero probability");
    }
}
