//! The default sampler plugin, driven the way the engine drives it (top-K candidates, more on
//! request), picks exactly the token the native full-distribution reference picks for the same
//! uniform, over randomized distributions and parameter combinations (top_k_renorm_prob
//! included).

mod common;
use common::*;
use weft_plugin_host::{calls, native, Decision, PluginKind, Registry, SandboxLimits, Sequence};

#[test]
fn default_sampler_matches_native_reference() {
    let r = Registry::with_defaults(SandboxLimits::default()).unwrap();
    let (p, pol) = r.resolve(PluginKind::Sampler, None).unwrap();
    let mut rng = Rng(0x5eed);
    let (mut calls_made, mut asked_more) = (0, 0);
    for trial in 0..3000 {
        let vocab = 20 + rng.below(400) as usize;
        let scale = [0.5, 2.0, 5.0][rng.below(3) as usize];
        let logits = random_logits(&mut rng, vocab, scale);
        let mut prm = params();
        prm.vocab_size = vocab as u32;
        prm.temperature = [0.0, 0.5, 1.0, 1.7][rng.below(4) as usize];
        prm.top_k = [0, 0, 1, 5, 40][rng.below(5) as usize];
        prm.top_p = [1.0, 1.0, 0.9, 0.5][rng.below(4) as usize];
        prm.min_p = [0.0, 0.0, 0.05, 0.3][rng.below(4) as usize];
        prm.typical_p = if rng.below(6) == 0 { 0.8 } else { 1.0 };
        let (plan, native_flag) = calls::configure(&p, pol, &prm).unwrap();
        assert!(!native_flag);
        // The host applies the plan's temperature before extracting candidates.
        let t = plan.temperature;
        let scaled: Vec<f32> = logits.iter().map(|&l| l / t).collect();
        let u = rng.uniform();
        let want = native::sample_full(&prm, &scaled, u);
        let mut k = plan.candidates as usize;
        let got = loop {
            let s = Sequence { request_id: trial, state: plan.state.clone(), candidates: candidates(&scaled, k), uniforms: vec![u], history: None };
            calls_made += 1;
            match calls::sample(&p, pol, &[s], &[&prm], vocab as u32).unwrap()[0] {
                Decision::Token(t) => break t,
                Decision::MoreCandidates(n) => {
                    asked_more += 1;
                    k = n as usize
                }
                Decision::FullVocabulary => {
                    asked_more += 1;
                    k = 0
                }
            }
        };
        assert_eq!(got, want, "trial {trial}: vocab {vocab} params t={} k={} p={} min_p={} typical={} u={u}", prm.temperature, prm.top_k, prm.top_p, prm.min_p, prm.typical_p);
    }
    eprintln!("3000 trials, {calls_made} plugin calls, {asked_more} asked for more candidates");
    assert!(asked_more > 0, "the incremental path was exercised");
}

#[test]
fn top_k_renorm_prob_semantics() {
    // Keep the top k, zero the rest, renormalise: with k = 2 over p = (0.5, 0.3, 0.2) the kept
    // distribution is (0.625, 0.375): u below 0.625 picks the first, above the second.
    let r = Registry::with_defaults(SandboxLimits::default()).unwrap();
    let (p, pol) = r.resolve(PluginKind::Sampler, None).unwrap();
    let logits: Vec<f32> = [0.5f32, 0.3, 0.2].iter().map(|x| x.ln()).collect();
    let mut prm = params();
    prm.vocab_size = 3;
    prm.top_k = 2;
    let (plan, _) = calls::configure(&p, pol, &prm).unwrap();
    for (u, want) in [(0.0, 0), (0.62, 0), (0.63, 1), (0.999, 1)] {
        let s = Sequence { request_id: 1, state: plan.state.clone(), candidates: candidates(&logits, plan.candidates as usize), uniforms: vec![u], history: None };
        assert_eq!(calls::sample(&p, pol, &[s], &[&prm], 3).unwrap()[0], Decision::Token(want), "u={u}");
        assert_eq!(native::sample_full(&prm, &logits, u), want);
    }
}

/// A flat distribution over Kimi's 163,840-token vocabulary (what a random-weight model
/// produces): untruncated sampling must see the whole vocabulary, and that call has to fit in
/// the default 50 ms deadline. Prints what it took.
#[test]
fn full_vocabulary_call_fits_the_default_deadline() {
    let r = Registry::with_defaults(SandboxLimits::default()).unwrap();
    let (p, pol) = r.resolve(PluginKind::Sampler, None).unwrap();
    let vocab = 163_840;
    let mut rng = Rng(3);
    let logits = random_logits(&mut rng, vocab, 0.1);
    let mut prm = params();
    prm.vocab_size = vocab as u32;
    prm.temperature = 1.0;
    let (plan, _) = calls::configure(&p, pol, &prm).unwrap();
    let cands = candidates(&logits, 0);
    for round in 0..3 {
        let s = Sequence { request_id: 1, state: plan.state.clone(), candidates: cands.clone(), uniforms: vec![0.9], history: None };
        let t = std::time::Instant::now();
        let d = calls::sample(&p, pol, &[s], &[&prm], vocab as u32).unwrap();
        eprintln!("full-vocabulary sampler call {round}: {:.2} ms -> {:?}", t.elapsed().as_secs_f64() * 1e3, d[0]);
        assert!(matches!(d[0], Decision::Token(_)));
    }
}
