//! Mixture-of-Experts on the CPU: DeepSeek-V3 routing (sigmoid scores, correction bias for
//! selection only, group-limited top-k, normalisation, scaling) and the routed experts,
//! gathered per expert so each expert's weights are read once per call.

use super::CpuBackend;
use crate::{Backend, ExpertWeights, Result, RouterConfig};

/// Routing of one token: `(expert, weight)` for each of the `top_k` selected experts.
pub fn route(logits: &[f32], bias: &[f32], cfg: &RouterConfig) -> Vec<(usize, f32)> {
    let e = cfg.n_experts;
    let scores: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
    let mut choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    if cfg.n_group > 1 {
        let gsize = e / cfg.n_group;
        // Group score: sum of the group's two best biased scores.
        let gscore: Vec<f32> = (0..cfg.n_group)
            .map(|g| {
                let mut v: Vec<f32> = choice[g * gsize..(g + 1) * gsize].to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                v.iter().take(2).sum()
            })
            .collect();
        let keep = top_indices(&gscore, cfg.topk_group);
        for g in 0..cfg.n_group {
            if !keep.contains(&g) {
                choice[g * gsize..(g + 1) * gsize].iter_mut().for_each(|c| *c = f32::NEG_INFINITY);
            }
        }
    }
    let sel = top_indices(&choice, cfg.top_k);
    let mut w: Vec<f32> = sel.iter().map(|&i| scores[i]).collect();
    if cfg.norm_topk_prob {
        let d = w.iter().sum::<f32>() + 1e-20;
        w.iter_mut().for_each(|x| *x /= d);
    }
    sel.into_iter().zip(w).map(|(i, x)| (i, x * cfg.routed_scaling_factor)).collect()
}

/// Indices of the `k` largest values in descending order, ties broken by lower index (a
/// selection, then a sort of the `k` chosen: routing 1024 tokens over 384 experts is on the
/// host's path of every prefill layer).
fn top_indices(v: &[f32], k: usize) -> Vec<usize> {
    let order = |&a: &usize, &b: &usize| v[b].total_cmp(&v[a]).then(a.cmp(&b));
    let mut idx: Vec<usize> = (0..v.len()).collect();
    if k == 0 {
        return vec![];
    }
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_by(order);
    idx
}

/// [`route`] of every token of `logits` (`[tokens, n_experts]`), in token order; long batches
/// (prefill chunks) are split over the host's cores.
pub fn route_all(logits: &[f32], bias: &[f32], cfg: &RouterConfig) -> Vec<Vec<(usize, f32)>> {
    let e = cfg.n_experts.max(1);
    let m = logits.len() / e;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(m / 128).max(1);
    if threads == 1 {
        return (0..m).map(|t| route(&logits[t * e..(t + 1) * e], bias, cfg)).collect();
    }
    let per = m.div_ceil(threads);
    std::thread::scope(|sc| {
        let parts: Vec<_> = logits.chunks(per * e).map(|chunk| sc.spawn(move || chunk.chunks(e).map(|l| route(l, bias, cfg)).collect::<Vec<_>>())).collect();
        parts.into_iter().flat_map(|h| h.join().expect("routing thread panicked")).collect()
    })
}

/// The routed experts' sum for every token; `experts` are experts `first..` (all of them on an
/// unsplit model), tokens' other experts are skipped.
pub(crate) fn experts(be: &CpuBackend, x: &[f32], gate_logits: &[f32], bias: &[f32], cfg: &RouterConfig, experts: &[ExpertWeights<super::CpuMatrix>], first: usize) -> Result<Vec<f32>> {
    let e = cfg.n_experts;
    let m = gate_logits.len() / e;
    let hidden = x.len() / m.max(1);
    let mut assigned: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
    for (t, r) in route_all(&gate_logits[..m * e], bias, cfg).into_iter().enumerate() {
        for (ex, w) in r {
            if (first..first + experts.len()).contains(&ex) {
                assigned[ex - first].push((t, w));
            }
        }
    }
    let mut out = vec![0f32; m * hidden];
    for (ex, toks) in assigned.iter().enumerate() {
        if toks.is_empty() {
            continue;
        }
        let mut xs = Vec::with_capacity(toks.len() * hidden);
        for &(t, _) in toks {
            xs.extend_from_slice(&x[t * hidden..(t + 1) * hidden]);
        }
        let w = &experts[ex];
        let gu = be.linear(&xs, &w.gate_up)?;
        let h = be.silu_mul(&gu, w.inter)?;
        let y = be.linear(&h, &w.down)?;
        for (i, &(t, wt)) in toks.iter().enumerate() {
            for (o, v) in out[t * hidden..(t + 1) * hidden].iter_mut().zip(&y[i * hidden..(i + 1) * hidden]) {
                *o += wt * v;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(n_group: usize, topk_group: usize, norm: bool) -> RouterConfig {
        RouterConfig { n_experts: 8, top_k: 2, n_group, topk_group, norm_topk_prob: norm, routed_scaling_factor: 2.5 }
    }

    #[test]
    fn bias_selects_but_does_not_weight() {
        let logits = [0.0f32; 8];
        let mut bias = [0.0f32; 8];
        bias[5] = 1.0;
        bias[2] = 0.5;
        let r = route(&logits, &bias, &cfg(1, 1, false));
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![5, 2]);
        // weight = sigmoid(0) * scale, bias not included
        assert!((r[0].1 - 0.5 * 2.5).abs() < 1e-6);
    }

    #[test]
    fn group_limit_excludes_other_groups() {
        // 4 groups of 2. Best single expert (7) is in group 3, but groups 0 and 1 have the best pair sums.
        let logits = [2.0, 2.0, 1.9, 1.9, -5.0, -5.0, -5.0, 3.0];
        let r = route(&logits, &[0.0; 8], &cfg(4, 2, true));
        let ids: Vec<usize> = r.iter().map(|x| x.0).collect();
        assert_eq!(ids, vec![0, 1]);
        let s: f32 = r.iter().map(|x| x.1).sum();
        assert!((s - 2.5).abs() < 1e-5, "normalised then scaled: {s}");
    }
}

#[cfg(test)]
mod selection_tests {
    /// The selection gives what a full sort would: descending, ties to the lower index.
    #[test]
    fn top_indices_match_a_full_sort() {
        let mut s = 7u64;
        for n in [1usize, 5, 64, 384] {
            for k in [0usize, 1, 6, 8, n] {
                let k = k.min(n);
                // Few distinct values, so ties are common.
                let v: Vec<f32> = (0..n)
                    .map(|_| {
                        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        ((s >> 60) as f32) * 0.25
                    })
                    .collect();
                let mut want: Vec<usize> = (0..n).collect();
                want.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
                want.truncate(k);
                assert_eq!(super::top_indices(&v, k), want, "n={n} k={k}");
            }
        }
    }
}
