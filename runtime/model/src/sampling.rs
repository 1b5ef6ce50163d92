//! Native reference sampling: counter-based uniforms derived from (seed, position), log-softmax
//! and top-K summaries of logits, and the classic policies (greedy, temperature, top-k, top-p,
//! min-p). The sampler plugin implements the same policies; this is what it is checked against.

/// One SplitMix64 step from state `z` (`weft_backend::rng`), used as a counter-based RNG.
fn mix64(z: u64) -> u64 {
    let mut state = z;
    weft_backend::rng::splitmix64(&mut state)
}

/// The uniform in `[0, 1)` for `(seed, position, stream)`: the same request seed gives the same
/// numbers at the same positions, independent of batching and of which plugin consumes them.
pub fn uniform(seed: u64, position: u64, stream: u64) -> f64 {
    let z = mix64(mix64(seed ^ 0x5EED).wrapping_add(position.wrapping_mul(0xD1B5_4A32_D192_ED03)).wrapping_add(stream.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7)));
    (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means disabled.
    pub top_k: usize,
    /// 1 means disabled.
    pub top_p: f32,
    /// 0 means disabled.
    pub min_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 }
    }
}

/// `log Σ exp(x)`, computed stably in f64.
pub fn logsumexp(logits: &[f32]) -> f64 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    if !m.is_finite() {
        return m;
    }
    m + logits.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
}

/// The `k` highest-logit token ids, highest first (ties: lower id first).
pub fn top_k_ids(logits: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(logits.len());
    if k == 0 {
        return vec![];
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx
}

/// Samples one token from `logits` with `params`, using uniform `u`.
pub fn sample(logits: &[f32], params: &SamplingParams, u: f64) -> u32 {
    if params.temperature <= 0.0 || params.top_k == 1 {
        return top_k_ids(logits, 1)[0];
    }
    let k = if params.top_k == 0 { logits.len() } else { params.top_k.min(logits.len()) };
    let ids = top_k_ids(logits, k);
    let t = params.temperature as f64;
    let m = logits[ids[0] as usize] as f64 / t;
    let mut probs: Vec<f64> = ids.iter().map(|&i| (logits[i as usize] as f64 / t - m).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    let mut keep = probs.len();
    if params.min_p > 0.0 {
        let thr = params.min_p as f64 * probs[0];
        keep = keep.min(probs.iter().take_while(|&&p| p >= thr).count().max(1));
    }
    if params.top_p < 1.0 {
        let mut cum = 0.0;
        let mut n = 0;
        for p in &probs[..keep] {
            cum += p;
            n += 1;
            if cum >= params.top_p as f64 {
                break;
            }
        }
        keep = n.max(1);
    }
    let kept: f64 = probs[..keep].iter().sum();
    let target = u * kept;
    let mut acc = 0.0;
    for (i, p) in probs[..keep].iter().enumerate() {
        acc += p;
        if target < acc {
            return ids[i];
        }
    }
    ids[keep - 1]
}

/// Top-`k` log-probabilities of `logits` plus the `extra` token's, vLLM-style: ids as keys.
pub fn top_logprobs(logits: &[f32], k: usize, extra: Option<u32>) -> Vec<(u32, f64)> {
    let lse = logsumexp(logits);
    let mut ids = top_k_ids(logits, k);
    if let Some(e) = extra {
        if !ids.contains(&e) {
            ids.push(e);
        }
    }
    ids.into_iter().map(|i| (i, logits[i as usize] as f64 - lse)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_are_deterministic_and_spread() {
        assert_eq!(uniform(7, 3, 0), uniform(7, 3, 0));
        assert_ne!(uniform(7, 3, 0), uniform(7, 4, 0));
        assert_ne!(uniform(7, 3, 0), uniform(8, 3, 0));
        let n = 100_000;
        let mean: f64 = (0..n).map(|i| uniform(1, i, 0)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "{mean}");
    }

    #[test]
    fn greedy_and_truncations() {
        let logits = [0.0f32, 3.0, 2.0, 1.0];
        let g = SamplingParams { temperature: 0.0, ..Default::default() };
        assert_eq!(sample(&logits, &g, 0.99), 1);
        let k2 = SamplingParams { top_k: 2, ..Default::default() };
        for i in 0..100 {
            let t = sample(&logits, &k2, i as f64 / 100.0);
            assert!(t == 1 || t == 2);
        }
        let p = SamplingParams { top_p: 0.5, ..Default::default() };
        assert_eq!(sample(&logits, &p, 0.999), 1, "top-p 0.5 keeps only the top token here");
    }

    #[test]
    fn sampled_frequencies_follow_softmax() {
        let logits = [1.0f32, 0.0, -1.0];
        let params = SamplingParams::default();
        let n = 200_000u64;
        let mut counts = [0usize; 3];
        for i in 0..n {
            counts[sample(&logits, &params, uniform(42, i, 0)) as usize] += 1;
        }
        let lse = logsumexp(&logits);
        for (i, &c) in counts.iter().enumerate() {
            let p = (logits[i] as f64 - lse).exp();
            assert!((c as f64 / n as f64 - p).abs() < 0.005, "token {i}: {c} vs p={p}");
        }
    }

    #[test]
    fn top_logprobs_includes_the_chosen_token() {
        let logits = [0.0f32, 3.0, 2.0, 1.0];
        let lp = top_logprobs(&logits, 2, Some(0));
        assert_eq!(lp.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2, 0]);
        let total: f64 = (0..4).map(|i| (logits[i] as f64 - logsumexp(&logits)).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
    }
}
