//! The engine end to end on the demo model (CPU): batched greedy output equals the
//! single-sequence reference generator token for token, under concurrency, a tiny page pool
//! that forces preemption, stop strings, prefix caching and aborts; the pool returns to full.

mod common;
use common::{collect, wait_idle};
use std::path::Path;
use std::sync::Arc;
use weft_backend::cpu::CpuBackend;
use weft_engine::{Engine, EngineConfig, Event, FinishReason, GenerationRequest};
use weft_model::generate::{generate, GenerateRequest};
use weft_model::sampling::SamplingParams as NativeParams;
use weft_model::LoadedModel;
use weft_plugin_host::{Registry, SamplingParams, SandboxLimits};

fn demo() -> LoadedModel<CpuBackend> {
    LoadedModel::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo"), CpuBackend::new()).unwrap()
}

fn params(temperature: f32) -> SamplingParams {
    SamplingParams { temperature, ..weft_plugin_host::neutral_params(0) }
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    common::greedy_request(prompt, max_tokens)
}

fn prompts(lm: &LoadedModel<CpuBackend>) -> Vec<Vec<u32>> {
    ["A wise man", "Love is", "The computer", "Never trust", "You will", "When in doubt", "The quick brown fox jumps over the lazy dog and then", "Q: What is the meaning of life?\nA:"]
        .iter()
        .map(|p| lm.tokenizer.encode(p, true).unwrap())
        .collect()
}

#[test]
fn batched_greedy_equals_single_sequence_even_with_preemption() {
    let lm = demo();
    let prompts = prompts(&lm);
    let reference: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            generate(&lm.model, &GenerateRequest { prompt_ids: p.clone(), max_tokens: 40, params: NativeParams { temperature: 0.0, ..Default::default() }, logprobs: None, stop_ids: vec![] })
                .unwrap()
                .token_ids
        })
        .collect();
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    // 12 pages of 16 tokens: 8 requests of ~50 tokens each cannot all fit -> preemption.
    for cfg in
        [EngineConfig { num_pages: 64, page_size: 16, token_budget: 64, max_sequences: 8, spec: None }, EngineConfig { num_pages: 12, page_size: 16, token_budget: 32, max_sequences: 8, spec: None }]
    {
        let engine = Engine::start(demo(), registry.clone(), cfg.clone()).unwrap();
        let mut rxs: Vec<_> = prompts.iter().map(|p| engine.submit(request(p.clone(), 40)).unwrap().1).collect();
        for (i, rx) in rxs.iter_mut().enumerate() {
            let (ids, _, fin) = collect(rx);
            assert_eq!(ids, reference[i], "prompt {i} with {cfg:?}");
            assert!(matches!(fin, Some(Event::Finished { reason: FinishReason::Length, completion_tokens: 40, .. })));
        }
        wait_idle(&engine);
        let s = engine.stats();
        assert_eq!(s.free_pages, s.total_pages, "page leak: {s:?}");
        if cfg.num_pages == 12 {
            assert!(s.preemptions > 0, "the small pool must have forced preemption: {s:?}");
        }
    }
}

#[test]
fn seeded_sampling_is_reproducible_and_text_matches_tokens() {
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let lm = demo();
    let p = lm.tokenizer.encode("Love is", true).unwrap();
    let engine = Engine::start(lm, registry, EngineConfig::default()).unwrap();
    let mut req = request(p, 30);
    req.params = params(0.9);
    req.params.top_p = 0.95;
    req.seed = 77;
    let a = collect(&mut engine.submit(req.clone()).unwrap().1);
    let b = collect(&mut engine.submit(req).unwrap().1);
    assert_eq!(a.0, b.0);
    let lm2 = demo();
    assert_eq!(a.1, lm2.tokenizer.decode(&a.0, true).unwrap(), "streamed deltas concatenate to the decoded text");
}

#[test]
fn stop_strings_eos_and_prefix_cache() {
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let lm = demo();
    let long: Vec<u32> = lm.tokenizer.encode(&"All work and no play makes Jack a dull boy. ".repeat(12), true).unwrap();
    let full_ref =
        generate(&lm.model, &GenerateRequest { prompt_ids: long.clone(), max_tokens: 20, params: NativeParams { temperature: 0.0, ..Default::default() }, logprobs: None, stop_ids: vec![] }).unwrap();
    let ref_text = lm.tokenizer.decode(&full_ref.token_ids, true).unwrap();
    let engine = Engine::start(lm, registry, EngineConfig { num_pages: 64, page_size: 16, token_budget: 256, max_sequences: 8, spec: None }).unwrap();
    // Stop string: pick a fragment of the reference continuation.
    let cut = ref_text.char_indices().nth(ref_text.chars().count() / 2).map(|x| x.0).unwrap_or(0);
    let stop: String = ref_text[cut..].chars().take(3).collect();
    let mut req = request(long.clone(), 20);
    req.stop = vec![stop.clone()];
    let (_, text, fin) = collect(&mut engine.submit(req).unwrap().1);
    assert!(matches!(fin, Some(Event::Finished { reason: FinishReason::Stop, .. })), "{fin:?}");
    assert_eq!(text, ref_text[..ref_text.find(&stop).unwrap()], "text stops right before the stop string");
    // The same long prompt again reuses its cached pages.
    let hits_before = engine.stats().prefix_hit_tokens;
    let (ids, _, fin) = collect(&mut engine.submit(request(long.clone(), 20)).unwrap().1);
    assert_eq!(ids, full_ref.token_ids, "prefix-cached request produces the same tokens");
    let Some(Event::Finished { cached_tokens, .. }) = fin else { panic!() };
    assert!(cached_tokens >= 16 * ((long.len() - 1) / 16) - 16 && cached_tokens > 0, "cached {cached_tokens} of {}", long.len());
    assert!(engine.stats().prefix_hit_tokens > hits_before);
    wait_idle(&engine);
    let s = engine.stats();
    assert_eq!(s.free_pages, s.total_pages);
}

#[test]
fn aborts_free_pages_and_bad_requests_are_refused() {
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let lm = demo();
    let p = lm.tokenizer.encode("A wise man", true).unwrap();
    let vocab = lm.model.cfg.vocab_size as u32;
    let engine = Engine::start(lm, registry, EngineConfig { num_pages: 32, page_size: 16, token_budget: 64, max_sequences: 8, spec: None }).unwrap();
    for _ in 0..4 {
        let (_, mut rx) = engine.submit(request(p.clone(), 500)).unwrap();
        // Read a couple of tokens, then hang up.
        rx.blocking_recv();
        rx.blocking_recv();
        drop(rx);
    }
    wait_idle(&engine);
    let s = engine.stats();
    assert_eq!(s.free_pages, s.total_pages, "aborted requests freed their pages: {s:?}");
    assert_eq!(s.aborted, 4);
    for (req, needle) in [
        (request(vec![], 5), "empty"),
        (request(vec![vocab + 5], 5), "outside the vocabulary"),
        (request(p.clone(), 1_000_000), "context length"),
        (GenerationRequest { sampler: Some("nope".into()), ..request(p.clone(), 5) }, "unknown sampler plugin `nope`"),
        (GenerationRequest { params: SamplingParams { top_p: 7.0, ..params(1.0) }, ..request(p.clone(), 5) }, "top_p"),
    ] {
        let e = engine.submit(req).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
}
