//! The engine serving a model split over 2 and 4 tensor-parallel ranks (threads of this
//! process, CPU backend, rank 0 driving the others): batched greedy output under concurrency
//! and a pool small enough to force preemption equals the unsplit engine's, token for token;
//! the pool returns to full; the MTP drafter is refused with a clear error rather than hanging.

mod common;
use common::{collect, greedy_request as request, wait_idle};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weft_backend::cpu::CpuBackend;
use weft_backend::Backend;
use weft_engine::{Engine, EngineConfig, Event, FinishReason};
use weft_model::{LoadOptions, LoadedModel};
use weft_plugin_host::{Registry, SandboxLimits};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/v3-qlora-yarn-groups")
}

/// Every prompt's tokens, and how many preemptions the run had.
fn run(lm: LoadedModel<CpuBackend>, cfg: EngineConfig, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, u64) {
    let registry = Arc::new(Registry::with_defaults(SandboxLimits::default()).unwrap());
    let engine = Engine::start(lm, registry, cfg).unwrap();
    let mut rxs: Vec<_> = prompts.iter().map(|p| engine.submit(request(p.clone(), 24)).unwrap().1).collect();
    let out = rxs
        .iter_mut()
        .map(|rx| {
            let (ids, _, fin) = collect(rx);
            assert!(matches!(fin, Some(Event::Finished { reason: FinishReason::Length, completion_tokens: 24, .. })), "{fin:?}");
            ids
        })
        .collect();
    wait_idle(&engine);
    let s = engine.stats();
    assert_eq!(s.free_pages, s.total_pages, "page leak: {s:?}");
    (out, s.preemptions as u64)
}

#[test]
fn split_engine_serves_what_the_whole_engine_serves() {
    let dir = fixture();
    let vocab = 200u32;
    let prompts: Vec<Vec<u32>> = (0..6u32).map(|i| (0..(9 + 5 * i)).map(|t| (t * 13 + i * 7 + 3) % vocab).collect()).collect();
    // 10 pages of 8 tokens for 6 sequences of up to ~58 tokens: preemption.
    for cfg in
        [EngineConfig { num_pages: 64, page_size: 8, token_budget: 48, max_sequences: 6, spec: None }, EngineConfig { num_pages: 10, page_size: 8, token_budget: 24, max_sequences: 6, spec: None }]
    {
        let (want, preempted) = run(LoadedModel::open(&dir, CpuBackend::new()).unwrap(), cfg.clone(), &prompts);
        assert!(cfg.num_pages > 10 || preempted > 0, "the small pool must force preemption");
        for (size, expert_parallel) in [(2, false), (4, false), (4, true)] {
            let opts = LoadOptions { expert_parallel, ..Default::default() };
            let lm = LoadedModel::open_tensor_parallel(&dir, size, opts, CpuBackend::new(), |_| Ok(CpuBackend::new())).unwrap();
            let (got, _) = run(lm, cfg.clone(), &prompts);
            assert_eq!(got, want, "TP={size} (expert-parallel: {expert_parallel}) with {cfg:?}");
        }
    }
}

#[test]
fn mtp_drafting_under_tensor_parallelism_fails_clearly() {
    let lm = LoadedModel::open_tensor_parallel(&fixture(), 2, LoadOptions::default(), CpuBackend::new(), |_| Ok(CpuBackend::new())).unwrap();
    let m = &lm.model;
    let mut pool = m.alloc_kv_pool(4, 8).unwrap();
    let batch = weft_model::StepBatch { tokens: &[1], positions: &[0], slots: &[0], attn: &[weft_backend::AttnRow { block_table: &[0], ctx_len: 1 }], exact_rows: &[] };
    let hidden = m.forward_hidden(&mut pool, &batch).unwrap();
    let mut mtp_pool = m.backend.alloc_kv_pool(m.mtp_kv_layout(4, 8)).unwrap();
    let err = m.mtp_forward(0, &mut mtp_pool, &batch, &hidden).err().expect("refused").to_string();
    assert!(err.contains("tensor parallelism"), "{err}");
}
