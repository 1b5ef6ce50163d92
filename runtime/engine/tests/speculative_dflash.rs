//! The DFlash drafter on the CPU backend: the golden target (tests/golden/v3-qlora-yarn-groups)
//! with the tiny random DFlash draft whose blocks match z-lab's reference implementation
//! (runtime/model/tests/golden_dflash.rs). Greedy output with DFlash drafts is token-for-token
//! the output without them — whole prefills, prefills in chunks (the draft's cache catches up
//! chunk by chunk), a tiny pool that forces preemption (the cache is rebuilt), fixed and
//! adaptive draft lengths, several sequences per step, a prompt that starts from another's
//! cached pages — with every page of both caches back when the engine is idle; with the
//! reference's own prompts and a full block of drafts per step the engine accepts exactly the
//! drafts the reference accepted.

mod common;
use common::{collect, wait_idle};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weft_backend::cpu::CpuBackend;
use weft_engine::{DrafterKind, Engine, EngineConfig, GenerationRequest, SpecConfig};
use weft_model::dflash::DFlashModel;
use weft_model::LoadedModel;
use weft_plugin_host::{Registry, SamplingParams, SandboxLimits};

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

fn dflash(k: usize, adaptive: bool) -> Option<SpecConfig> {
    Some(SpecConfig { drafter: DrafterKind::DFlash, num_draft_tokens: k, adaptive, max_batch: 0 })
}

fn engine(cfg: EngineConfig) -> Engine {
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let lm = LoadedModel::open(&golden().join("v3-qlora-yarn-groups"), CpuBackend::new()).unwrap();
    if cfg.spec.is_none() {
        return Engine::start(lm, registry, cfg).unwrap();
    }
    let d = DFlashModel::open(&golden().join("dflash-v3"), &lm.model.backend, &lm.model.cfg).unwrap();
    Engine::start_with_dflash(lm, d, registry, cfg).unwrap()
}

fn request(prompt: &[u32], max_tokens: usize, seed: u64) -> GenerationRequest {
    GenerationRequest {
        prompt: prompt.to_vec(),
        params: SamplingParams { temperature: 0.0, ..weft_plugin_host::neutral_params(0) },
        max_tokens,
        stop_token_ids: vec![],
        stop: vec![],
        ignore_eos: true,
        seed,
        sampler: None,
        logprobs: None,
        priority: 0,
        tenant: "t".into(),
        speculative: true,
    }
}

fn run(cfg: EngineConfig, prompts: &[Vec<u32>], max_tokens: impl Fn(usize) -> usize) -> (Vec<Vec<u32>>, weft_engine::EngineStats) {
    let engine = engine(cfg);
    let mut rxs: Vec<_> = prompts.iter().enumerate().map(|(i, p)| engine.submit(request(p, max_tokens(i), i as u64)).unwrap().1).collect();
    let out = rxs.iter_mut().map(|rx| collect(rx).0).collect();
    wait_idle(&engine);
    let stats = engine.stats();
    assert_eq!(stats.free_pages, stats.total_pages, "pages leaked: {stats:?}");
    assert_eq!(stats.draft_pages_held, 0, "the DFlash cache kept pages of finished sequences: {stats:?}");
    (out, stats)
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn greedy_dflash_speculation_is_token_for_token_plain_greedy() {
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden().join("v3-qlora-yarn-groups/reference.json")).unwrap()).unwrap();
    let prompts: Vec<Vec<u32>> = reference["cases"].as_array().unwrap().iter().map(|c| ids(&c["prompt_ids"])).collect();
    assert!(prompts.iter().any(|p| p.len() > 100), "a prompt long enough to be prefilled in chunks");
    let plain = EngineConfig { num_pages: 64, page_size: 16, token_budget: 512, max_sequences: 8, spec: None };
    let budget = |i: usize| 24 + 4 * i;
    let (want, _) = run(plain.clone(), &prompts, budget);
    for (name, cfg, n) in [
        ("fixed 7 (a full block)", EngineConfig { spec: dflash(7, false), ..plain.clone() }, prompts.len()),
        ("fixed 12 (clamped to the block)", EngineConfig { spec: dflash(12, false), ..plain.clone() }, prompts.len()),
        ("adaptive 4, prefill in chunks of 48", EngineConfig { token_budget: 48, spec: dflash(4, true), ..plain.clone() }, prompts.len()),
        // 8 pages of 16 tokens for the 4 short prompts: preemption.
        ("tiny pool", EngineConfig { num_pages: 8, token_budget: 64, spec: dflash(2, false), ..plain.clone() }, 4),
    ] {
        let (got, stats) = run(cfg, &prompts[..n], budget);
        if name == "tiny pool" {
            assert!(stats.preemptions > 0, "{name}: no preemption: {stats:?}");
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: request {i} differs from plain greedy");
        }
        assert!(stats.spec_rounds > 0 && stats.spec_drafted > 0, "{name}: no DFlash drafts: {stats:?}");
        assert_eq!(stats.spec_drafter, "dflash");
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

/// The reference's prompts, one at a time, a full block of drafts every step: the same output
/// and the same accepted drafts as `dflash_generate`.
#[test]
fn dflash_engine_accepts_what_the_reference_accepted() {
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden().join("dflash-v3/dflash_reference.json")).unwrap()).unwrap();
    for (ci, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
        let (prompt, want) = (ids(&case["prompt_ids"]), ids(&case["output_ids"]));
        let new = want.len() - prompt.len();
        let accepted: u64 = case["acceptance_lengths"].as_array().unwrap().iter().map(|a| a.as_u64().unwrap() - 1).sum();
        let cfg = EngineConfig { num_pages: 16, page_size: 16, token_budget: 256, max_sequences: 4, spec: dflash(7, false) };
        let (got, stats) = run(cfg, std::slice::from_ref(&prompt), |_| new);
        assert_eq!(got[0], want[prompt.len()..], "case {ci}: output");
        assert_eq!(stats.spec_accepted, accepted, "case {ci}: accepted drafts ({stats:?})");
        eprintln!("case {ci}: {} verify steps, {} drafts, {} accepted (reference: {accepted})", stats.spec_rounds, stats.spec_drafted, stats.spec_accepted);
    }
}

/// A request whose prompt shares 300 tokens with a finished one starts from cached pages: the
/// target never computes those positions, the draft's cache has no entries for them, and it
/// drafts from what it has — output still plain greedy.
#[test]
fn dflash_drafts_after_a_prefix_cache_hit() {
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden().join("v3-qlora-yarn-groups/reference.json")).unwrap()).unwrap();
    let long = ids(&reference["cases"][4]["prompt_ids"]);
    assert!(long.len() > 300);
    let second: Vec<u32> = long[..300].iter().copied().chain([7, 8, 9]).collect();
    let one_by_one = |spec: Option<SpecConfig>| {
        let engine = engine(EngineConfig { num_pages: 64, page_size: 16, token_budget: 512, max_sequences: 8, spec });
        let (mut outs, mut drafted) = (vec![], vec![]);
        for p in [&long, &second] {
            outs.push(collect(&mut engine.submit(request(p, 24, 0)).unwrap().1).0);
            wait_idle(&engine);
            drafted.push(engine.stats().spec_drafted);
        }
        (outs, drafted, engine.stats())
    };
    let (want, _, plain) = one_by_one(None);
    assert!(plain.prefix_hit_tokens >= 288, "{plain:?}");
    let (got, drafted, stats) = one_by_one(dflash(3, false));
    assert_eq!(got, want, "DFlash speculation after a prefix hit differs from plain greedy");
    assert!(drafted[1] > drafted[0], "no DFlash drafts for the request that started from cached pages: {drafted:?}");
    assert_eq!(stats.draft_pages_held, 0);
}

#[test]
fn dflash_drafter_is_started_with_its_draft() {
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let lm = LoadedModel::open(&golden().join("v3-qlora-yarn-groups"), CpuBackend::new()).unwrap();
    let err = Engine::start(lm, registry, EngineConfig { spec: dflash(4, false), ..Default::default() }).err().expect("refused");
    assert!(err.to_string().contains("DFlash"), "{err}");
}
