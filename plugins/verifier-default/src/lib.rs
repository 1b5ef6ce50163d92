//! weft's default speculative verifier. Greedy requests: accept the longest prefix of drafts
//! equal to the target's argmax, then the target's argmax. Sampled requests: chain rejection
//! sampling, which is lossless — accept draft d_i while u_i · q(d_i) < p(d_i); on the first
//! rejection sample from normalise(max(p − q, 0)); if all k are accepted, sample the bonus token
//! from the target's last distribution.

use weft_plugin_sdk::math;
use weft_plugin_sdk::verifier::exports::weft::plugin::verifier::{DraftStep, Guest, Verdict};
use weft_plugin_sdk::verifier::weft::plugin::types::{Candidates, PluginInfo, PluginKind};

struct DefaultVerifier;

fn prob_of(c: &Candidates, id: u32) -> Option<f64> {
    match c.ids.iter().position(|&x| x == id) {
        Some(i) => Some((c.logits[i] as f64 - c.logsumexp as f64).exp()),
        None if c.complete => Some(0.0),
        None => None,
    }
}

fn verify_one(s: &DraftStep) -> Verdict {
    let k = s.draft_tokens.len();
    if s.target.len() != k + 1 || s.target.iter().any(|t| t.ids.is_empty()) {
        return Verdict::FullVocabulary;
    }
    if s.greedy {
        let mut n = 0;
        while n < k && s.draft_tokens[n] == s.target[n].ids[0] {
            n += 1;
        }
        return Verdict::Accept((n as u32, s.target[n].ids[0]));
    }
    let u = |i: usize| s.uniforms.get(i).copied().unwrap_or(0.5);
    for i in 0..k {
        let d = s.draft_tokens[i];
        let Some(p) = prob_of(&s.target[i], d) else { return Verdict::FullVocabulary };
        let q = s.draft_probs.get(i).copied().unwrap_or(1.0) as f64;
        if u(i) * q < p {
            continue;
        }
        // Rejected at i: residual max(p - q, 0) over the union of both supports.
        let t = &s.target[i];
        if !t.complete {
            return Verdict::FullVocabulary;
        }
        let q_of = |id: u32| -> Option<f64> {
            match &s.draft_candidates {
                Some(dc) => {
                    let c = dc.get(i)?;
                    match prob_of(c, id) {
                        Some(x) => Some(x),
                        None => None,
                    }
                }
                // No draft distribution: the drafter proposed d deterministically with prob q.
                None => Some(if id == d { q } else { 0.0 }),
            }
        };
        let mut residual = Vec::with_capacity(t.ids.len());
        for (j, &id) in t.ids.iter().enumerate() {
            let pj = (t.logits[j] as f64 - t.logsumexp as f64).exp();
            let Some(qj) = q_of(id) else { return Verdict::FullVocabulary };
            residual.push((pj - qj).max(0.0));
        }
        if residual.iter().sum::<f64>() <= 0.0 {
            // p == q exactly: any sample from p is correct.
            return Verdict::Accept((i as u32, t.ids[math::sample_index(&t.logits.iter().map(|&l| (l as f64 - t.logsumexp as f64).exp()).collect::<Vec<_>>(), u(k + 1))]));
        }
        return Verdict::Accept((i as u32, t.ids[math::sample_index(&residual, u(k + 1))]));
    }
    let last = &s.target[k];
    if !last.complete {
        // Bonus token from p: candidates suffice when u lands inside their mass.
        let mut acc = 0.0;
        for (j, &l) in last.logits.iter().enumerate() {
            acc += (l as f64 - last.logsumexp as f64).exp();
            if u(k + 1) < acc {
                return Verdict::Accept((k as u32, last.ids[j]));
            }
        }
        return Verdict::FullVocabulary;
    }
    let p: Vec<f64> = last.logits.iter().map(|&l| (l as f64 - last.logsumexp as f64).exp()).collect();
    Verdict::Accept((k as u32, last.ids[math::sample_index(&p, u(k + 1))]))
}

impl Guest for DefaultVerifier {
    fn describe() -> PluginInfo {
        PluginInfo { name: "default".into(), version: env!("CARGO_PKG_VERSION").into(), interface_version: weft_plugin_sdk::INTERFACE_VERSION.into(), kind: PluginKind::Verifier }
    }

    fn verify(batch: Vec<DraftStep>) -> Vec<Verdict> {
        batch.iter().map(verify_one).collect()
    }
}

weft_plugin_sdk::verifier::export_verifier!(DefaultVerifier);
