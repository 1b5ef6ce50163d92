//! The default verifier's chain rejection sampling is lossless: emitted tokens follow the
//! target distribution whatever the draft distribution (chi-square at a fixed seed).

mod common;
use common::*;
use weft_plugin_host::{calls, DraftStep, PluginKind, Registry, SandboxLimits, Verdict};

/// Chi-square statistic of `counts` against probabilities `p`.
fn chi2(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts.iter().zip(p).map(|(&c, &pi)| (c as f64 - n as f64 * pi).powi(2) / (n as f64 * pi)).sum()
}

fn sample(p: &[f64], u: f64) -> u32 {
    let mut acc = 0.0;
    for (i, x) in p.iter().enumerate() {
        acc += x;
        if u < acc {
            return i as u32;
        }
    }
    (p.len() - 1) as u32
}

#[test]
fn chain_rejection_sampling_preserves_the_target_distribution() {
    let r = Registry::with_defaults(SandboxLimits::default()).unwrap();
    let (plugin, pol) = r.resolve(PluginKind::Verifier, None).unwrap();
    let mut rng = Rng(0xC0FFEE);
    const V: usize = 6;
    let target_logits: Vec<Vec<f32>> = (0..3).map(|_| random_logits(&mut rng, V, 1.0)).collect();
    let draft_logits: Vec<Vec<f32>> = (0..2).map(|_| random_logits(&mut rng, V, 1.5)).collect();
    let tc: Vec<_> = target_logits.iter().map(|l| candidates(l, 0)).collect();
    let dc: Vec<_> = draft_logits.iter().map(|l| candidates(l, 0)).collect();
    let probs = |l: &[f32]| -> Vec<f64> {
        let m = l.iter().copied().fold(f32::MIN, f32::max) as f64;
        let s: f64 = l.iter().map(|&x| (x as f64 - m).exp()).sum();
        l.iter().map(|&x| (x as f64 - m).exp() / s).collect()
    };
    let p: Vec<Vec<f64>> = target_logits.iter().map(|l| probs(l)).collect();
    let q: Vec<Vec<f64>> = draft_logits.iter().map(|l| probs(l)).collect();
    let (mut first, mut second) = ([0u64; V], [0u64; V]);
    let mut accepted_total = 0u64;
    let n = 200_000;
    for _ in 0..n / 1000 {
        let batch: Vec<DraftStep> = (0..1000)
            .map(|i| {
                let d: Vec<u32> = (0..2).map(|j| sample(&q[j], rng.uniform())).collect();
                DraftStep {
                    request_id: i,
                    draft_probs: d.iter().enumerate().map(|(j, &t)| q[j][t as usize] as f32).collect(),
                    draft_tokens: d,
                    draft_candidates: Some(dc.clone()),
                    target: tc.clone(),
                    uniforms: (0..4).map(|_| rng.uniform()).collect(),
                    greedy: false,
                }
            })
            .collect();
        let out = calls::verify(&plugin, pol, &batch, V as u32).unwrap();
        for (s, v) in batch.iter().zip(out) {
            let Verdict::Accept((acc, next)) = v else { panic!("complete distributions were given") };
            accepted_total += acc as u64;
            let emitted: Vec<u32> = s.draft_tokens[..acc as usize].iter().copied().chain([next]).collect();
            first[emitted[0] as usize] += 1;
            if emitted.len() > 1 {
                second[emitted[1] as usize] += 1;
            }
        }
    }
    // df = 5; P(chi2 > 20.5) = 0.001.
    let c1 = chi2(&first, &p[0]);
    let c2 = chi2(&second, &p[1]);
    eprintln!("chi2 first token {c1:.2}, second token {c2:.2}, mean accepted {:.3}", accepted_total as f64 / n as f64);
    assert!(c1 < 20.5, "first emitted token is not distributed as the target: chi2 {c1}");
    assert!(c2 < 20.5, "second emitted token is not distributed as the target: chi2 {c2}");
    // Sanity: the test can fail. Emitting the draft token unconditionally is detected.
    let mut biased = [0u64; V];
    for _ in 0..n {
        biased[sample(&q[0], rng.uniform()) as usize] += 1;
    }
    assert!(chi2(&biased, &p[0]) > 100.0, "the draft distribution must be distinguishable from the target");
}
