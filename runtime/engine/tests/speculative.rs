//! Speculative decoding on the demo model (CPU): greedy output with prompt-lookup drafts or the
//! demo's draft model is
//! token-for-token the output without them — under penalties, min-tokens, stop strings, a tiny
//! page pool that forces preemption, and fixed or adaptive draft lengths — with drafts actually
//! accepted and the pool back to full; sampled output keeps the target distribution (a
//! chi-square test at fixed seeds on the token where a draft was verified).

mod common;
use common::{collect, wait_idle};
use std::path::Path;
use std::sync::Arc;
use weft_backend::cpu::CpuBackend;
use weft_engine::{DrafterKind, Engine, EngineConfig, Event, GenerationRequest, SpecConfig};
use weft_model::LoadedModel;
use weft_plugin_host::{Registry, SamplingParams, SandboxLimits};

fn demo() -> LoadedModel<CpuBackend> {
    LoadedModel::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo"), CpuBackend::new()).unwrap()
}

fn request(prompt: Vec<u32>, max_tokens: usize, params: SamplingParams, seed: u64) -> GenerationRequest {
    GenerationRequest { prompt, params, max_tokens, stop_token_ids: vec![], stop: vec![], ignore_eos: true, seed, sampler: None, logprobs: None, priority: 0, tenant: "t".into(), speculative: true }
}

fn ngram(k: usize, adaptive: bool) -> Option<SpecConfig> {
    Some(SpecConfig { drafter: DrafterKind::Ngram { min_n: 1, max_n: 3 }, num_draft_tokens: k, adaptive, max_batch: 0 })
}

fn model_drafts(k: usize, adaptive: bool) -> Option<SpecConfig> {
    Some(SpecConfig { drafter: DrafterKind::Model, num_draft_tokens: k, adaptive, max_batch: 0 })
}

fn draft_model() -> LoadedModel<CpuBackend> {
    LoadedModel::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo-draft"), CpuBackend::new()).unwrap()
}

/// Runs every request on a fresh engine (with the demo's draft model when the drafter is
/// `Model`) and returns (tokens, text, finish) per request.
fn run(cfg: EngineConfig, reqs: &[GenerationRequest]) -> (Vec<(Vec<u32>, String, String)>, weft_engine::EngineStats) {
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let draft = matches!(cfg.spec, Some(SpecConfig { drafter: DrafterKind::Model, .. })).then(draft_model);
    let engine = Engine::start_with_draft(demo(), draft, registry, cfg).unwrap();
    let mut rxs: Vec<_> = reqs.iter().map(|r| engine.submit(r.clone()).unwrap().1).collect();
    let out = rxs
        .iter_mut()
        .map(|rx| {
            let (ids, text, fin) = collect(rx);
            (ids, text, format!("{fin:?}").split(',').next().unwrap_or_default().to_string())
        })
        .collect();
    wait_idle(&engine);
    let stats = engine.stats();
    assert_eq!(stats.free_pages, stats.total_pages, "pages leaked: {stats:?}");
    assert_eq!(stats.draft_pages_held, 0, "the draft model kept pages of finished sequences: {stats:?}");
    (out, stats)
}

#[test]
fn greedy_speculation_is_token_for_token_plain_greedy() {
    let lm = demo();
    let texts = ["the cat sat on the mat. the cat sat on the", "A B C D E F A B C D E F A B C", "Love is", "Q: What is the meaning of life?\nA:", "one two three one two three one two"];
    let greedy = SamplingParams { temperature: 0.0, ..weft_plugin_host::neutral_params(0) };
    let mut reqs = vec![];
    for (i, t) in texts.iter().enumerate() {
        let p = lm.tokenizer.encode(t, true).unwrap();
        reqs.push(request(p.clone(), 48, greedy.clone(), i as u64));
        // Edits that depend on the history up to each draft.
        reqs.push(request(p.clone(), 40, SamplingParams { repetition_penalty: 1.3, presence_penalty: 0.4, frequency_penalty: 0.2, ..greedy.clone() }, 7));
        let mut eos = request(p.clone(), 40, SamplingParams { min_tokens: 5, ..greedy.clone() }, 9);
        eos.ignore_eos = false;
        eos.stop = vec![".".into()];
        reqs.push(eos);
    }
    let plain = EngineConfig { num_pages: 64, page_size: 16, token_budget: 256, max_sequences: 16, spec: None };
    let (want, _) = run(plain.clone(), &reqs);
    for (name, cfg) in [
        ("fixed 4", EngineConfig { spec: ngram(4, false), ..plain.clone() }),
        ("adaptive 6", EngineConfig { spec: ngram(6, true), ..plain.clone() }),
        // 10 pages of 16 tokens for 15 sequences: preemption and draft dropping under pressure.
        ("tiny pool", EngineConfig { num_pages: 10, token_budget: 48, spec: ngram(5, false), ..plain.clone() }),
        ("draft model 4", EngineConfig { spec: model_drafts(4, false), ..plain.clone() }),
        ("draft model, tiny pool", EngineConfig { num_pages: 10, token_budget: 48, spec: model_drafts(3, true), ..plain.clone() }),
    ] {
        let (got, stats) = run(cfg, &reqs);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: request {i} differs from plain greedy");
        }
        assert!(stats.spec_rounds > 0 && stats.spec_accepted > 0, "{name}: no draft was accepted: {stats:?}");
        eprintln!(
            "{name}: {} verify steps, {} drafts, {} accepted ({:.0}%), {:.2} tokens per verify step, {} steps in all",
            stats.spec_rounds,
            stats.spec_drafted,
            stats.spec_accepted,
            100.0 * stats.spec_accepted as f64 / stats.spec_drafted.max(1) as f64,
            (stats.spec_accepted + stats.spec_rounds) as f64 / stats.spec_rounds as f64,
            stats.steps
        );
    }
}

#[test]
fn sampled_speculation_keeps_the_target_distribution() {
    let lm = demo();
    let vocab = lm.model.cfg.vocab_size;
    // Ends with a token seen before, so prompt lookup drafts at the first generated position.
    let prompt = lm.tokenizer.encode("one two three one two three one two", true).unwrap();
    let draft = weft_engine::spec::ngram_draft(&prompt, 1, 3, 1)[0];
    // The model's whole distribution at the first position (raw: temperature 1, no edits).
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let engine = Engine::start(demo(), registry, EngineConfig { num_pages: 256, page_size: 16, token_budget: 1024, max_sequences: 64, spec: None }).unwrap();
    let temp = SamplingParams { temperature: 1.0, ..weft_plugin_host::neutral_params(0) };
    let mut r = request(prompt.clone(), 1, temp.clone(), 0);
    r.logprobs = Some(vocab);
    let (_, mut rx) = engine.submit(r).unwrap();
    let all: Vec<(u32, f64)> = match rx.blocking_recv().expect("an event") {
        Event::Token { top_logprobs, .. } => top_logprobs.expect("log-probabilities"),
        e => panic!("{e:?}"),
    };
    drop(engine);
    // A logit bias (a front-end edit, so part of the target) gives the draft probability ~0.4:
    // both the acceptance and the rejection path of the verifier are exercised.
    let p_d = all.iter().find(|t| t.0 == draft).unwrap().1.exp();
    let bias = ((0.4 / 0.6) * (1.0 - p_d) / p_d).ln();
    // The target: (raw + bias) / temperature, truncated as the default sampler truncates.
    let target = |params: &SamplingParams| -> Vec<f64> {
        let mut l = vec![f32::NEG_INFINITY; vocab];
        for &(t, lp) in &all {
            l[t as usize] = ((lp + if t == draft { bias } else { 0.0 }) / params.temperature as f64) as f32;
        }
        let (order, w, _) = weft_plugin_host::native::kept_weights(params, &l);
        let z: f64 = w.iter().sum();
        let mut p = vec![0.0f64; vocab];
        for (&t, &x) in order.iter().zip(&w) {
            p[t as usize] = x / z;
        }
        p
    };
    // 3000 samples of the first token, each request with its own seed; max_tokens 2 leaves room
    // for one draft, verified in the prefill's pass.
    const N: usize = 3000;
    let cfg = EngineConfig { num_pages: 512, page_size: 16, token_budget: 2048, max_sequences: 64, spec: ngram(1, false) };
    let plain = SamplingParams { logit_bias: vec![(draft, bias as f32)], ..temp };
    // Truncated: the verifier gets the renormalised kept set (top_k_renorm_prob semantics).
    let truncated = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.9, ..plain.clone() };
    for (name, params, acceptance) in [("temperature 1", &plain, 0.25..0.55), ("temperature 0.8, top-k 40, top-p 0.9", &truncated, 0.3..0.95)] {
        let reqs: Vec<_> = (0..N as u64).map(|s| request(prompt.clone(), 2, params.clone(), 1000 + s)).collect();
        let p = target(params);
        eprintln!("{name}:");
        let (got, stats) = run(cfg.clone(), &reqs);
        check_distribution(&got, &stats, &p, draft, N, acceptance);
        // The draft model proposes its own greedy token (whatever the bias): same distribution.
        let (got, stats) = run(EngineConfig { spec: model_drafts(1, false), ..cfg.clone() }, &reqs);
        check_distribution(&got, &stats, &p, draft, N, 0.0..1.0);
    }
}

#[test]
fn draft_model_rejects_the_engine_without_a_matching_setup() {
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let cfg = EngineConfig { spec: model_drafts(4, true), ..Default::default() };
    assert!(Engine::start_with_draft(demo(), None, registry.clone(), cfg.clone()).is_err(), "no draft model");
    assert!(Engine::start_with_draft(demo(), Some(draft_model()), registry.clone(), EngineConfig { spec: ngram(4, true), ..cfg.clone() }).is_err(), "a draft model the drafter does not use");
    // A draft model with another vocabulary: the golden fixture (a different tokenizer size).
    let other = LoadedModel::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/kimi-fp8-partial-blocks"), CpuBackend::new()).unwrap();
    let e = Engine::start_with_draft(demo(), Some(other), registry, cfg).err().expect("a vocabulary mismatch is refused");
    assert!(e.to_string().contains("vocabulary"), "{e}");
}

fn check_distribution(got: &[(Vec<u32>, String, String)], stats: &weft_engine::EngineStats, p: &[f64], draft: u32, n: usize, acceptance: std::ops::Range<f64>) {
    assert!(stats.spec_drafted as usize >= n, "every request should have verified a draft at its first token: {stats:?}");
    let mut counts = vec![0usize; p.len()];
    for (ids, _, _) in got {
        counts[ids[0] as usize] += 1;
    }
    let (chi2, df, limit) = common::chi_square(&counts, p, n);
    let accepted = stats.spec_accepted as f64 / stats.spec_drafted as f64;
    eprintln!(
        "chi-square {chi2:.1} over {df} bins; draft {draft} target p {:.3}, observed {:.3}; {:.0}% of drafts accepted",
        p[draft as usize],
        counts[draft as usize] as f64 / n as f64,
        100.0 * accepted
    );
    assert!(chi2 < limit, "speculative samples do not follow the target distribution: chi2 {chi2:.1} over {df} bins (limit {limit:.1})");
    assert!(acceptance.contains(&accepted), "the draft (p ~0.4) should be accepted about that often: {accepted}");
}

#[test]
fn requests_can_opt_out_and_busy_steps_do_not_draft() {
    let lm = demo();
    let greedy = SamplingParams { temperature: 0.0, ..weft_plugin_host::neutral_params(0) };
    let p = lm.tokenizer.encode("one two three one two three one two", true).unwrap();
    let reqs: Vec<_> = (0..6).map(|i| request(p.clone(), 24, greedy.clone(), i)).collect();
    let cfg = EngineConfig { num_pages: 64, page_size: 16, token_budget: 256, max_sequences: 16, spec: ngram(4, false) };
    let (want, all) = run(cfg.clone(), &reqs);
    assert!(all.spec_rounds > 0);
    let opted_out: Vec<_> = reqs.iter().map(|r| GenerationRequest { speculative: false, ..r.clone() }).collect();
    let (got, none) = run(cfg.clone(), &opted_out);
    assert_eq!(none.spec_rounds, 0, "{none:?}");
    assert_eq!(got, want);
    // Six sequences decode together; with a limit of 2 no step drafts once all are decoding.
    let (got, limited) = run(EngineConfig { spec: Some(SpecConfig { max_batch: 2, ..ngram(4, false).unwrap() }), ..cfg }, &reqs);
    assert_eq!(got, want);
    assert!(limited.spec_rounds < all.spec_rounds / 2, "{} verify steps with the limit vs {}", limited.spec_rounds, all.spec_rounds);
}
