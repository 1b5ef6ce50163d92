//! Native (in-process) implementations of the default policies: the fallback when a plugin
//! faults under the `fallback` policy, and the reference the default plugins are tested
//! against. Sampling here works on the *full* distribution, so it is the ground truth for the
//! plugin's incremental candidate logic.

use crate::bindings::{Candidates, Capacity, Decision, DraftStep, Running, SamplingParams, SamplingPlan, ScheduleDecision, Verdict, Waiting};

/// The plan the native core uses when no plugin plans for a request.
pub fn plan(p: &SamplingParams) -> SamplingPlan {
    let greedy = p.temperature == 0.0 || p.top_k == 1;
    SamplingPlan {
        temperature: if greedy { 1.0 } else { p.temperature },
        repetition_penalty: p.repetition_penalty,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        logit_bias: p.logit_bias.clone(),
        banned_tokens: p.banned_tokens.clone(),
        min_tokens: p.min_tokens,
        candidates: if greedy {
            1
        } else if p.top_k > 0 {
            p.top_k
        } else {
            0
        },
        wants_history: false,
        state: vec![],
    }
}

/// Reference sampler over a full distribution (`logits` indexed by token id, already divided
/// by the temperature): top-k, then typical-p, then top-p on the renormalised remainder, then
/// min-p; inverse CDF with `u` over what is kept (tokens sorted by logit, ties by id).
pub fn sample_full(p: &SamplingParams, logits: &[f32], u: f64) -> u32 {
    if p.temperature == 0.0 || p.top_k == 1 {
        return kept_weights(p, logits).0[0];
    }
    let (order, w, truncated) = kept_weights(p, logits);
    let target = if truncated { u * w.iter().sum::<f64>() } else { u };
    let mut acc = 0.0;
    let mut last = order[0];
    for (i, &x) in w.iter().enumerate() {
        if x > 0.0 {
            acc += x;
            last = order[i];
            if target < acc {
                return order[i];
            }
        }
    }
    last
}

/// The distribution [`sample_full`] draws from: token ids by logit (ties by id), their
/// probabilities after top-k, typical-p, top-p and min-p (unnormalised where `truncated`),
/// and whether anything was cut. Greedy parameters are not special-cased here.
pub fn kept_weights(p: &SamplingParams, logits: &[f32]) -> (Vec<u32>, Vec<f64>, bool) {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    if order.is_empty() {
        return (order, vec![], false);
    }
    let m = logits[order[0] as usize] as f64;
    let lse = m + logits.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln();
    let mut w: Vec<f64> = order.iter().map(|&i| (logits[i as usize] as f64 - lse).exp()).collect();
    let mut truncated = false;
    if p.top_k > 0 && (p.top_k as usize) < w.len() {
        for x in &mut w[p.top_k as usize..] {
            *x = 0.0;
        }
        truncated = true;
    } else if p.top_k > 0 {
        truncated = true;
    }
    if p.typical_p < 1.0 {
        let s: f64 = w.iter().sum();
        let h: f64 = w.iter().filter(|&&x| x > 0.0).map(|&x| -(x / s) * (x / s).ln()).sum();
        let mut by_dev: Vec<usize> = (0..w.len()).filter(|&i| w[i] > 0.0).collect();
        by_dev.sort_by(|&a, &b| ((-(w[a] / s).ln() - h).abs()).total_cmp(&(-(w[b] / s).ln() - h).abs()).then(a.cmp(&b)));
        let mut keep = vec![false; w.len()];
        let mut acc = 0.0;
        for i in by_dev {
            keep[i] = true;
            acc += w[i] / s;
            if acc >= p.typical_p as f64 {
                break;
            }
        }
        w.iter_mut().zip(keep).for_each(|(x, k)| *x = if k { *x } else { 0.0 });
        truncated = true;
    }
    if p.top_p < 1.0 {
        let s: f64 = if truncated { w.iter().sum() } else { 1.0 };
        let mut acc = 0.0;
        let mut cut = w.len();
        for (i, x) in w.iter().enumerate() {
            acc += x / s;
            if acc >= p.top_p as f64 {
                cut = i + 1;
                break;
            }
        }
        for x in &mut w[cut..] {
            *x = 0.0;
        }
        truncated = true;
    }
    if p.min_p > 0.0 {
        let thr = p.min_p as f64 * w.iter().copied().fold(0.0, f64::max);
        w.iter_mut().for_each(|x| *x = if *x < thr { 0.0 } else { *x });
        truncated = true;
    }
    (order, w, truncated)
}

/// `c` (a complete distribution) as the distribution the sampler keeps: top-k / typical-p /
/// top-p / min-p applied and renormalised (`top_k_renorm_prob` semantics), so a verifier that
/// samples from the result samples exactly what the sampler would.
pub fn truncate_candidates(p: &SamplingParams, c: &Candidates) -> Candidates {
    let (order, w, _) = kept_weights(p, &c.logits);
    let (mut ids, mut logits) = (vec![], vec![]);
    for (&i, &x) in order.iter().zip(&w) {
        if x > 0.0 {
            ids.push(c.ids[i as usize]);
            logits.push(x.ln() as f32);
        }
    }
    let lse = w.iter().sum::<f64>().ln() as f32;
    Candidates { ids, logits, logsumexp: lse, complete: true }
}

/// Native fallback for one sequence's candidates.
pub fn sample_candidates(p: &SamplingParams, c: &Candidates, u: f64) -> Decision {
    if c.ids.is_empty() {
        return Decision::FullVocabulary;
    }
    if p.temperature == 0.0 || p.top_k == 1 {
        return Decision::Token(c.ids[0]);
    }
    if !c.complete && !(p.top_k > 0 && c.ids.len() >= p.top_k as usize) {
        return Decision::FullVocabulary;
    }
    // The candidates are the whole (truncated) distribution: sample over them by position.
    let local: Vec<f32> = c.logits.clone();
    let idx = sample_full(p, &local, u) as usize;
    Decision::Token(c.ids[idx])
}

fn prob(c: &Candidates, id: u32) -> Option<f64> {
    match c.ids.iter().position(|&x| x == id) {
        Some(i) => Some((c.logits[i] as f64 - c.logsumexp as f64).exp()),
        None => c.complete.then_some(0.0),
    }
}

fn draw(c: &Candidates, w: &[f64], u: f64) -> u32 {
    let t = u * w.iter().sum::<f64>();
    let mut acc = 0.0;
    let mut last = c.ids[0];
    for (i, &x) in w.iter().enumerate() {
        if x > 0.0 {
            acc += x;
            last = c.ids[i];
            if t < acc {
                return c.ids[i];
            }
        }
    }
    last
}

/// Native verifier: greedy prefix match, or chain rejection sampling on complete distributions.
pub fn verify(s: &DraftStep) -> Verdict {
    let k = s.draft_tokens.len();
    if s.target.len() != k + 1 || s.target.iter().any(|t| t.ids.is_empty()) {
        return Verdict::FullVocabulary;
    }
    if s.greedy {
        let n = (0..k).take_while(|&i| s.draft_tokens[i] == s.target[i].ids[0]).count();
        return Verdict::Accept((n as u32, s.target[n].ids[0]));
    }
    if s.target.iter().any(|t| !t.complete) {
        return Verdict::FullVocabulary;
    }
    let u = |i: usize| s.uniforms.get(i).copied().unwrap_or(0.5);
    for i in 0..k {
        let d = s.draft_tokens[i];
        let t = &s.target[i];
        let p_d = prob(t, d).unwrap_or(0.0);
        let q_d = s.draft_probs.get(i).copied().unwrap_or(1.0) as f64;
        if u(i) * q_d < p_d {
            continue;
        }
        let mut w = Vec::with_capacity(t.ids.len());
        for (j, &id) in t.ids.iter().enumerate() {
            let pj = (t.logits[j] as f64 - t.logsumexp as f64).exp();
            let qj = match &s.draft_candidates {
                Some(dc) => match dc.get(i).and_then(|c| prob(c, id)) {
                    Some(q) => q,
                    None => return Verdict::FullVocabulary,
                },
                None => {
                    if id == d {
                        q_d
                    } else {
                        0.0
                    }
                }
            };
            w.push((pj - qj).max(0.0));
        }
        if w.iter().sum::<f64>() <= 0.0 {
            w = t.logits.iter().map(|&l| (l as f64 - t.logsumexp as f64).exp()).collect();
        }
        return Verdict::Accept((i as u32, draw(t, &w, u(k + 1))));
    }
    let t = &s.target[k];
    let w: Vec<f64> = t.logits.iter().map(|&l| (l as f64 - t.logsumexp as f64).exp()).collect();
    Verdict::Accept((k as u32, draw(t, &w, u(k + 1))))
}

/// Native admission: first come, first served within pages and sequence slots.
pub fn schedule(waiting: &[Waiting], running: &[Running], cap: &Capacity) -> ScheduleDecision {
    let mut order: Vec<&Waiting> = waiting.iter().collect();
    order.sort_by_key(|w| (w.arrival_ms, w.id));
    let mut d = ScheduleDecision { admit: vec![], preempt: vec![], reject: vec![] };
    let mut free = cap.free_pages;
    let mut slots = cap.max_sequences.saturating_sub(running.len() as u32);
    let ps = cap.page_size.max(1);
    for w in order {
        let full = (w.prompt_tokens + 1).div_ceil(ps);
        if full > cap.total_pages {
            d.reject.push(crate::bindings::Rejection { id: w.id, reason: format!("prompt of {} tokens needs more KV pages than the pool holds ({})", w.prompt_tokens, cap.total_pages), retry: false });
            continue;
        }
        let need = full.saturating_sub(w.cached_prefix_tokens / ps);
        if need > free || slots == 0 || cap.token_budget == 0 {
            break;
        }
        free -= need;
        slots -= 1;
        d.admit.push(w.id);
    }
    d
}
