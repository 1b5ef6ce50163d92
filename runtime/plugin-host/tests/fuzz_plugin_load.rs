//! Mutation fuzzing of plugin loading, on stable Rust (the CI stand-in for a cargo-fuzz
//! target): the default sampler's component bytes with bits flipped, bytes replaced, spans
//! cut or duplicated, or the file truncated, fed to `Registry::load_bytes`. Each must load
//! (a mutation the validator accepts, then the load-time self-check) or fail with an error —
//! never panic — and afterwards the registry's default sampler still answers.
//! `WEFT_FUZZ_CASES` scales the run.

mod common;
use common::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use weft_plugin_host::{calls, Decision, PluginKind, Registry, SandboxLimits, Sequence};

#[test]
fn mutated_components_load_or_fail_cleanly() {
    let r = Registry::with_defaults(SandboxLimits::default()).unwrap();
    let orig = plugin_bytes("weft_sampler_default");
    let n = std::env::var("WEFT_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(150usize);
    let mut rng = Rng(0xf00d);
    let (mut loaded, mut panics) = (0, vec![]);
    let mut errors: std::collections::BTreeMap<String, usize> = Default::default();
    for case in 0..n {
        let mut b = orig.clone();
        match case % 5 {
            0 => b.truncate(rng.below(b.len() as u64) as usize),
            1 => {
                // The component's first section headers: kinds and lengths.
                let i = 8 + rng.below(64) as usize;
                b[i] ^= 1 << rng.below(8);
            }
            _ => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(b.len() as u64) as usize;
                    match rng.below(3) {
                        0 => b[i] ^= 1 << rng.below(8),
                        1 => b[i] = rng.below(256) as u8,
                        _ => {
                            let end = (i + 1 + rng.below(32) as usize).min(b.len());
                            if rng.below(2) == 0 {
                                b.drain(i..end);
                            } else {
                                let span = b[i..end].to_vec();
                                b.splice(i..i, span);
                            }
                        }
                    }
                }
            }
        }
        match catch_unwind(AssertUnwindSafe(|| r.load_bytes(&b, None, None))) {
            Err(_) => panics.push(format!("case {case}: load_bytes panicked")),
            Ok(Ok(id)) => {
                loaded += 1;
                let _ = r.unload(id.kind, &id.name, &id.version);
            }
            Ok(Err(e)) => {
                let e = e.to_string();
                assert!(!e.is_empty());
                *errors.entry(e.chars().take(40).collect()).or_default() += 1;
            }
        }
    }
    eprintln!("plugin loading: {n} mutated components, {loaded} accepted, {} panics; errors: {errors:?}", panics.len());
    assert!(panics.is_empty(), "{panics:?}");
    // The registry still serves its default sampler.
    let (p, pol) = r.resolve(PluginKind::Sampler, None).unwrap();
    let mut prm = params();
    prm.vocab_size = 8;
    prm.temperature = 0.0;
    let (plan, _) = calls::configure(&p, pol, &prm).unwrap();
    let logits = vec![0.0, 5.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let s = Sequence { request_id: 1, state: plan.state, candidates: candidates(&logits, 1), uniforms: vec![0.5], history: None };
    assert_eq!(calls::sample(&p, pol, &[s], &[&prm], 8).unwrap(), vec![Decision::Token(1)]);
}
