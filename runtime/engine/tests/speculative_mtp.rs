//! The MTP drafter on the CPU backend, on the golden fixture that ships a multi-token-prediction
//! layer (tests/golden/v3-qlora-yarn-groups; its module matches transformers in
//! runtime/model/tests/golden_mtp.rs): greedy output with MTP drafts is token-for-token the
//! output without them — whole prefills, prefills in chunks (the module catches up chunk by
//! chunk), a tiny pool that forces preemption (the module's cache is rebuilt), fixed and adaptive
//! draft lengths, several sequences per step, a prompt that starts from another's cached pages —
//! with drafts made, and every page of both caches back when the engine is idle. A checkpoint without the module is refused at start.

mod common;
use common::{collect, wait_idle};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weft_backend::cpu::CpuBackend;
use weft_engine::{DrafterKind, Engine, EngineConfig, GenerationRequest, SpecConfig};
use weft_model::LoadedModel;
use weft_plugin_host::{Registry, SamplingParams, SandboxLimits};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/v3-qlora-yarn-groups")
}

fn mtp(k: usize, adaptive: bool) -> Option<SpecConfig> {
    Some(SpecConfig { drafter: DrafterKind::Mtp, num_draft_tokens: k, adaptive, max_batch: 0 })
}

fn run(cfg: EngineConfig, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, weft_engine::EngineStats) {
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let engine = Engine::start(LoadedModel::open(&fixture(), CpuBackend::new()).unwrap(), registry, cfg).unwrap();
    let greedy = SamplingParams { temperature: 0.0, ..weft_plugin_host::neutral_params(0) };
    let mut rxs: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let r = GenerationRequest {
                prompt: p.clone(),
                params: greedy.clone(),
                max_tokens: 24 + 4 * i,
                stop_token_ids: vec![],
                stop: vec![],
                ignore_eos: true,
                seed: i as u64,
                sampler: None,
                logprobs: None,
                priority: 0,
                tenant: "t".into(),
                speculative: true,
            };
            engine.submit(r).unwrap().1
        })
        .collect();
    let out = rxs.iter_mut().map(|rx| collect(rx).0).collect();
    wait_idle(&engine);
    let stats = engine.stats();
    assert_eq!(stats.free_pages, stats.total_pages, "pages leaked: {stats:?}");
    assert_eq!(stats.draft_pages_held, 0, "the MTP cache kept pages of finished sequences: {stats:?}");
    (out, stats)
}

#[test]
fn greedy_mtp_speculation_is_token_for_token_plain_greedy() {
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap()).unwrap();
    let prompts: Vec<Vec<u32>> = reference["cases"].as_array().unwrap().iter().map(|c| c["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()).collect();
    assert!(prompts.iter().any(|p| p.len() > 100), "a prompt long enough to be prefilled in chunks");
    let plain = EngineConfig { num_pages: 64, page_size: 16, token_budget: 512, max_sequences: 8, spec: None };
    let (want, _) = run(plain.clone(), &prompts);
    // (name, config, how many of the prompts)
    for (name, cfg, n) in [
        ("fixed 1", EngineConfig { spec: mtp(1, false), ..plain.clone() }, prompts.len()),
        ("fixed 3", EngineConfig { spec: mtp(3, false), ..plain.clone() }, prompts.len()),
        ("adaptive 4, prefill in chunks of 48", EngineConfig { token_budget: 48, spec: mtp(4, true), ..plain.clone() }, prompts.len()),
        // 8 pages of 16 tokens for the 4 short prompts, which end on 4 + 3 + 4 + 5 pages: preemption.
        ("tiny pool", EngineConfig { num_pages: 8, token_budget: 64, spec: mtp(2, false), ..plain.clone() }, 4),
    ] {
        let (got, stats) = run(cfg, &prompts[..n]);
        if name == "tiny pool" {
            assert!(stats.preemptions > 0, "{name}: no preemption: {stats:?}");
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: request {i} differs from plain greedy");
        }
        assert!(stats.spec_rounds > 0 && stats.spec_drafted > 0, "{name}: no MTP drafts: {stats:?}");
        eprintln!(
            "{name}: {} verify steps, {} drafts, {} accepted ({:.0}%; random weights), {} preemptions, {} steps",
            stats.spec_rounds,
            stats.spec_drafted,
            stats.spec_accepted,
            100.0 * stats.spec_accepted as f64 / stats.spec_drafted.max(1) as f64,
            stats.preemptions,
            stats.steps
        );
    }
}

/// A request whose prompt shares 300 tokens with a finished one starts from cached pages: the
/// target never computes those positions, and the module fills them from embeddings alone, then
/// drafts — output still plain greedy.
#[test]
fn mtp_drafts_after_a_prefix_cache_hit() {
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap()).unwrap();
    let long: Vec<u32> = reference["cases"][4]["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    assert!(long.len() > 300);
    let second: Vec<u32> = long[..300].iter().copied().chain([7, 8, 9]).collect();
    let one_by_one = |spec: Option<SpecConfig>| {
        let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
        let cfg = EngineConfig { num_pages: 64, page_size: 16, token_budget: 512, max_sequences: 8, spec };
        let engine = Engine::start(LoadedModel::open(&fixture(), CpuBackend::new()).unwrap(), registry, cfg).unwrap();
        let greedy = SamplingParams { temperature: 0.0, ..weft_plugin_host::neutral_params(0) };
        let mut outs = vec![];
        let mut drafted = vec![];
        for p in [&long, &second] {
            let r = GenerationRequest {
                prompt: p.clone(),
                params: greedy.clone(),
                max_tokens: 24,
                stop_token_ids: vec![],
                stop: vec![],
                ignore_eos: true,
                seed: 0,
                sampler: None,
                logprobs: None,
                priority: 0,
                tenant: "t".into(),
                speculative: true,
            };
            outs.push(collect(&mut engine.submit(r).unwrap().1).0);
            wait_idle(&engine);
            drafted.push(engine.stats().spec_drafted);
        }
        (outs, drafted, engine.stats())
    };
    let (want, _, plain) = one_by_one(None);
    assert!(plain.prefix_hit_tokens >= 288, "the second prompt reuses the first one's pages: {plain:?}");
    let (got, drafted, stats) = one_by_one(mtp(2, false));
    assert_eq!(got, want, "MTP speculation after a prefix hit differs from plain greedy");
    assert!(stats.prefix_hit_tokens >= 288, "{stats:?}");
    assert!(drafted[1] > drafted[0], "no MTP drafts for the request that started from cached pages: {drafted:?}");
    assert_eq!(stats.draft_pages_held, 0);
}

#[test]
fn mtp_drafter_needs_an_mtp_module() {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let err = Engine::start(LoadedModel::open(&demo, CpuBackend::new()).unwrap(), registry, EngineConfig { spec: mtp(2, false), ..Default::default() }).err().expect("refused");
    assert!(err.to_string().contains("multi-token-prediction"), "{err}");
}
