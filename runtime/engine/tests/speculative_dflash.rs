//! The DFlash drafter on the CPU backend: the golden target (tests/golden/v3-qlora-yarn-groups)
//! with the tiny random DFlash draft whose blocks match z-lab's reference implementation
//! (runtime/model/tests/golden_dflash.rs). Greedy output with DFlash drafts is token-for-token
//! the output without them — whole prefills, prefills in chunks (the draft's cache catches up
//! chunk by chunk), a tiny pool that forces preemption (the cache is rebuilt), fixed and
//! adaptive draft lengths, several sequences per step, a prompt that starts from another's
//! cached pages — with every page of both caches back when the engine is idle; with the
//! reference's own prompts and a full block of drafts per step the engine accepts exactly the
//! drafts the reference accepted; sampled output with DFlash drafts keeps the target
//! distribution (a chi-square test at fixed seeds on the token where a draft was verified).

mod common;
use common::{collect, wait_idle};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weft_backend::cpu::CpuBackend;
use weft_engine::Event;
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

/// The raw (temperature 1, no edits) log-probabilities of every token after `prompt`.
fn raw_logprobs(prompt: &[u32]) -> Vec<(u32, f64)> {
    let engine = engine(EngineConfig { num_pages: 16, page_size: 16, token_budget: 256, max_sequences: 4, spec: None });
    let mut r = request(prompt, 1, 0);
    r.params = SamplingParams { temperature: 1.0, ..weft_plugin_host::neutral_params(0) };
    r.logprobs = Some(320);
    let (_, mut rx) = engine.submit(r).unwrap();
    match rx.blocking_recv().expect("an event") {
        Event::Token { top_logprobs, .. } => top_logprobs.expect("log-probabilities"),
        e => panic!("{e:?}"),
    }
}

/// Sampling with DFlash drafts: the second generated token, where the first draft is verified,
/// follows the target distribution. The prompt is the reference's first; its first block
/// (context = the prompt, block token A = the greedy first token) drafted d. Logit biases
/// make A the first token about half the time and give d probability 0.4 after it, so the
/// verifier both accepts and rejects; samples whose first token is A are tested against the
/// target's distribution after `prompt + [A]` (biased, tempered and truncated as the sampler
/// does).
#[test]
fn sampled_dflash_speculation_keeps_the_target_distribution() {
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden().join("dflash-v3/dflash_reference.json")).unwrap()).unwrap();
    let case = &reference["cases"][0];
    let prompt = ids(&case["prompt_ids"]);
    let a = ids(&case["output_ids"])[prompt.len()];
    let block = &case["blocks"][0];
    assert_eq!(block["start"].as_u64().unwrap() as usize, prompt.len());
    let d = block["drafts"][0].as_u64().unwrap() as u32;
    assert_ne!(a, d, "the fixture's first draft differs from its block token");
    let (all1, all2) = (raw_logprobs(&prompt), raw_logprobs(&[prompt.clone(), vec![a]].concat()));
    let lp = |all: &[(u32, f64)], t: u32| all.iter().find(|x| x.0 == t).unwrap().1;
    let b_a = (lp(&all1, a).exp().recip() - 1.0).ln(); // p(A) = 1/2 at the first position
    let others: f64 = all2.iter().filter(|x| x.0 != d).map(|x| (x.1 + if x.0 == a { b_a } else { 0.0 }).exp()).sum();
    let b_d = (0.4 / 0.6 * others).ln() - lp(&all2, d); // p(d | A) = 0.4
    let target = |params: &SamplingParams| -> Vec<f64> {
        let mut l = vec![f32::NEG_INFINITY; 320];
        for &(t, x) in &all2 {
            let bias = if t == a {
                b_a
            } else if t == d {
                b_d
            } else {
                0.0
            };
            l[t as usize] = ((x + bias) / params.temperature as f64) as f32;
        }
        let (order, w, _) = weft_plugin_host::native::kept_weights(params, &l);
        let z: f64 = w.iter().sum();
        let mut p = vec![0.0f64; 320];
        for (&t, &x) in order.iter().zip(&w) {
            p[t as usize] = x / z;
        }
        p
    };
    const N: usize = 4000;
    let plain = SamplingParams { temperature: 1.0, logit_bias: vec![(a, b_a as f32), (d, b_d as f32)], ..weft_plugin_host::neutral_params(0) };
    let truncated = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.9, ..plain.clone() };
    for (name, params) in [("temperature 1", &plain), ("temperature 0.8, top-k 40, top-p 0.9", &truncated)] {
        let engine = engine(EngineConfig { num_pages: 512, page_size: 16, token_budget: 2048, max_sequences: 64, spec: dflash(1, false) });
        let mut rxs: Vec<_> = (0..N as u64)
            .map(|s| {
                let mut r = request(&prompt, 3, 1000 + s);
                r.params = params.clone();
                engine.submit(r).unwrap().1
            })
            .collect();
        let outs: Vec<Vec<u32>> = rxs.iter_mut().map(|rx| collect(rx).0).collect();
        wait_idle(&engine);
        let stats = engine.stats();
        assert_eq!(stats.free_pages, stats.total_pages);
        assert_eq!(stats.draft_pages_held, 0);
        let p = target(params);
        let after_a: Vec<u32> = outs.iter().filter(|o| o[0] == a).map(|o| o[1]).collect();
        let n = after_a.len();
        assert!(n > N / 4, "{name}: the first token should be A about half the time: {n} of {N}");
        assert!(stats.spec_drafted as usize >= N, "{name}: every request verifies a draft at its second token: {stats:?}");
        let mut counts = vec![0usize; 320];
        for &t in &after_a {
            counts[t as usize] += 1;
        }
        let (chi2, df, limit) = common::chi_square(&counts, &p, n);
        eprintln!(
            "{name}: {n} samples after A; chi-square {chi2:.1} over {df} bins (99.9% limit {limit:.1}); draft {d}: target p {:.3}, observed {:.3}; {:.0}% of all drafts accepted",
            p[d as usize],
            counts[d as usize] as f64 / n as f64,
            100.0 * stats.spec_accepted as f64 / stats.spec_drafted.max(1) as f64
        );
        assert!(chi2 < limit, "{name}: DFlash speculative samples do not follow the target distribution");
        assert!(counts[d as usize] > n / 5, "{name}: the draft should be kept about 40% of the time after A");
    }
}
