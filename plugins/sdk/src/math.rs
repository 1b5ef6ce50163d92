//! Probability helpers over candidate sets: exact probabilities from logits and the
//! full-vocabulary log-sum-exp, truncations (top-k, top-p, min-p, typical-p) with
//! `top_k_renorm_prob` semantics (keep, zero the rest, renormalise), and inverse-CDF sampling.

/// Probabilities of `logits` (sorted highest first) at `temperature` (> 0), normalised over
/// the candidates. With `lse` given and temperature 1 they are the exact full-vocabulary
/// probabilities before renormalisation.
pub fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    if logits.is_empty() {
        return vec![];
    }
    let t = temperature as f64;
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut p: Vec<f64> = logits.iter().map(|&l| ((l as f64 - m) / t).exp()).collect();
    let s: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= s);
    p
}

/// Keeps the first `k` entries (probabilities sorted descending), zeroes the rest.
pub fn keep_top_k(p: &mut [f64], k: usize) {
    if k > 0 && k < p.len() {
        p[k..].iter_mut().for_each(|x| *x = 0.0);
    }
}

/// Keeps the smallest prefix whose mass reaches `top_p` (sorted descending).
pub fn keep_top_p(p: &mut [f64], top_p: f32) {
    if top_p >= 1.0 {
        return;
    }
    let total: f64 = p.iter().sum();
    let mut cum = 0.0;
    let mut cut = p.len();
    for (i, x) in p.iter().enumerate() {
        cum += x / total;
        if cum >= top_p as f64 {
            cut = i + 1;
            break;
        }
    }
    p[cut..].iter_mut().for_each(|x| *x = 0.0);
}

/// Keeps entries with probability at least `min_p` times the largest.
pub fn keep_min_p(p: &mut [f64], min_p: f32) {
    if min_p <= 0.0 || p.is_empty() {
        return;
    }
    let thr = min_p as f64 * p.iter().copied().fold(0.0, f64::max);
    p.iter_mut().for_each(|x| {
        if *x < thr {
            *x = 0.0
        }
    });
}

/// Typical sampling: keeps the tokens closest to the distribution's entropy until their
/// mass reaches `typical_p`.
pub fn keep_typical(p: &mut [f64], typical_p: f32) {
    if typical_p >= 1.0 || p.is_empty() {
        return;
    }
    let total: f64 = p.iter().sum();
    let ent: f64 = p.iter().filter(|&&x| x > 0.0).map(|&x| -(x / total) * (x / total).ln()).sum();
    let mut order: Vec<usize> = (0..p.len()).filter(|&i| p[i] > 0.0).collect();
    order.sort_by(|&a, &b| {
        let da = (-(p[a] / total).ln() - ent).abs();
        let db = (-(p[b] / total).ln() - ent).abs();
        da.total_cmp(&db).then(a.cmp(&b))
    });
    let mut keep = vec![false; p.len()];
    let mut cum = 0.0;
    for &i in &order {
        keep[i] = true;
        cum += p[i] / total;
        if cum >= typical_p as f64 {
            break;
        }
    }
    for (x, k) in p.iter_mut().zip(keep) {
        if !k {
            *x = 0.0;
        }
    }
}

/// Inverse-CDF sample of index with weights `p` (need not be normalised) and uniform `u`.
pub fn sample_index(p: &[f64], u: f64) -> usize {
    let total: f64 = p.iter().sum();
    let target = u * total;
    let mut acc = 0.0;
    let mut last = 0;
    for (i, &x) in p.iter().enumerate() {
        if x > 0.0 {
            acc += x;
            last = i;
            if target < acc {
                return i;
            }
        }
    }
    last
}
