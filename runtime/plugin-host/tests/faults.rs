//! Each fault kind is refused at load or contained at run time, with the registry and the
//! default plugins still serving afterwards.

mod common;
use common::*;
use std::time::{Duration, Instant};
use weft_plugin_host::{calls, Decision, FailurePolicy, PluginError, PluginKind, Registry, SandboxLimits, Sequence};

fn registry() -> Registry {
    Registry::with_defaults(SandboxLimits { memory_bytes: 32 << 20, deadline: Duration::from_millis(100) }).unwrap()
}

fn run_faulty(r: &Registry, mode: &str, policy: FailurePolicy) -> Result<Vec<Decision>, PluginError> {
    r.set_policy(PluginKind::Sampler, "faulty", policy).unwrap();
    let (p, pol) = r.resolve(PluginKind::Sampler, Some("faulty")).unwrap();
    let mut prm = params();
    prm.vocab_size = 8;
    prm.temperature = 0.0;
    prm.extra = mode.into();
    let (plan, _) = calls::configure(&p, pol, &prm).unwrap();
    let logits: Vec<f32> = (0..8).map(|i| -(i as f32)).collect();
    let s = Sequence { request_id: 1, state: plan.state, candidates: candidates(&logits, 0), uniforms: vec![0.5], history: None };
    calls::sample(&p, pol, &[s], &[&prm], 8)
}

/// The default sampler still answers correctly: server-side state intact.
fn defaults_still_serve(r: &Registry) {
    let (p, pol) = r.resolve(PluginKind::Sampler, None).unwrap();
    let mut prm = params();
    prm.vocab_size = 8;
    prm.temperature = 0.0;
    let (plan, _) = calls::configure(&p, pol, &prm).unwrap();
    let logits: Vec<f32> = vec![0.0, 5.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let s = Sequence { request_id: 2, state: plan.state, candidates: candidates(&logits, 1), uniforms: vec![0.5], history: None };
    assert_eq!(calls::sample(&p, pol, &[s], &[&prm], 8).unwrap(), vec![Decision::Token(1)]);
}

#[test]
fn runtime_faults_are_contained_under_each_policy() {
    let r = registry();
    r.load_bytes(&plugin_bytes("weft_test_faulty"), None, None).unwrap();
    assert_eq!(run_faulty(&r, "fine", FailurePolicy::Fail).unwrap(), vec![Decision::Token(0)]);
    for mode in ["trap", "loop", "memory", "bad-token", "short-answer"] {
        let t0 = Instant::now();
        // fail: the affected requests get a clear error naming the plugin and the fault
        let e = run_faulty(&r, mode, FailurePolicy::Fail).unwrap_err().to_string();
        assert!(e.contains("faulty@0.1.0"), "{mode}: {e}");
        let want = match mode {
            "trap" => "trapped",
            "loop" => "deadline",
            "memory" => "memory",
            _ => "invalid answer",
        };
        assert!(e.contains(want), "{mode}: {e}");
        // fallback: the native policy answers (greedy here)
        assert_eq!(run_faulty(&r, mode, FailurePolicy::Fallback).unwrap(), vec![Decision::Token(0)], "{mode}");
        // reload: a fresh instance retries once and faults again (deterministic fault) -> error
        assert!(run_faulty(&r, mode, FailurePolicy::Reload).is_err(), "{mode}");
        assert!(t0.elapsed() < Duration::from_secs(10), "{mode} took {:?}", t0.elapsed());
        defaults_still_serve(&r);
    }
    let listed = r.list();
    let faulty = listed.iter().find(|p| p.name == "faulty").unwrap();
    assert!(faulty.versions[0].faults >= 15, "faults counted: {:?}", faulty.versions[0]);
    assert!(faulty.versions[0].fallbacks >= 5);
    // After all that the plugin still works for well-behaved requests.
    assert_eq!(run_faulty(&r, "fine", FailurePolicy::Fail).unwrap(), vec![Decision::Token(0)]);
}

#[test]
fn configure_trap_is_contained() {
    let r = registry();
    r.load_bytes(&plugin_bytes("weft_test_faulty"), None, None).unwrap();
    let (p, _) = r.resolve(PluginKind::Sampler, Some("faulty")).unwrap();
    let mut prm = params();
    prm.vocab_size = 8;
    prm.extra = "configure-trap".into();
    let e = calls::configure(&p, FailurePolicy::Fail, &prm).unwrap_err().to_string();
    assert!(e.contains("trapped"), "{e}");
    let (_, native) = calls::configure(&p, FailurePolicy::Fallback, &prm).unwrap();
    assert!(native, "fallback marks the request as natively sampled");
    defaults_still_serve(&r);
}

#[test]
fn bad_plugins_never_become_active() {
    let r = registry();
    let before = r.list().len();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage", b"definitely not wasm".to_vec(), "not a WebAssembly binary"),
        ("empty", vec![], "not a WebAssembly binary"),
        ("core module", b"\0asm\x01\0\0\0".to_vec(), "core WebAssembly module"),
        ("truncated component", plugin_bytes("weft_sampler_default")[..5000].to_vec(), "does not compile"),
        ("wrong interface version", plugin_bytes("weft_test_old_interface"), "speaks interface 0.0.9"),
    ];
    for (what, bytes, needle) in cases {
        let e = r.load_bytes(&bytes, None, None).unwrap_err();
        assert!(matches!(e, PluginError::Invalid(_)), "{what}: {e}");
        assert!(e.to_string().contains(needle), "{what}: {e}");
    }
    let e = r.load_bytes(&plugin_bytes("weft_sampler_default"), Some("00ff"), None).unwrap_err();
    assert!(e.to_string().contains("sha256 mismatch"), "{e}");
    assert_eq!(r.list().len(), before);
    defaults_still_serve(&r);
}

#[test]
fn guests_cannot_read_files_environment_or_network() {
    let r = registry();
    r.load_bytes(&plugin_bytes("weft_test_faulty"), None, None).unwrap();
    // Candidate index = bitmask of escapes that worked; 0 means every attempt was refused.
    let mut logits = vec![0f32; 16];
    for (i, l) in logits.iter_mut().enumerate() {
        *l = -(i as f32);
    }
    r.set_policy(PluginKind::Sampler, "faulty", FailurePolicy::Fail).unwrap();
    let (p, pol) = r.resolve(PluginKind::Sampler, Some("faulty")).unwrap();
    let mut prm = params();
    prm.vocab_size = 16;
    prm.extra = "escape".into();
    let (plan, _) = calls::configure(&p, pol, &prm).unwrap();
    let s = Sequence { request_id: 1, state: plan.state, candidates: candidates(&logits, 0), uniforms: vec![0.5], history: None };
    assert_eq!(calls::sample(&p, pol, &[s], &[&prm], 16).unwrap(), vec![Decision::Token(0)], "a sandbox escape succeeded (bitmask = token id)");
}
