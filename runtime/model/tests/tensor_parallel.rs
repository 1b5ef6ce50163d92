//! Tensor parallelism on the CPU: each golden fixture split over 2 and 4 ranks (threads of one
//! process, a `LocalGroup` summing through host memory) must produce what the unsplit model
//! produces — prompt log-probabilities within 1e-4, the same greedy tokens — on every rank, and
//! still match transformers' float64 reference — with routed experts sliced (tensor parallel) and
//! whole (expert parallel). A model that does not split evenly is refused.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weft_backend::cpu::CpuBackend;
use weft_backend::{Collective, LocalGroup};
use weft_model::generate::{generate, GenerateOutput, GenerateRequest};
use weft_model::sampling::SamplingParams;
use weft_model::{LoadOptions, LoadedModel};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden").join(name)
}

fn requests(dir: &Path) -> Vec<GenerateRequest> {
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let prompt_ids = case["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            GenerateRequest { prompt_ids, max_tokens: 12, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: Some(5), stop_ids: vec![] }
        })
        .collect()
}

/// Every rank's outputs for `reqs`, the ranks running concurrently.
fn run_group(dir: &Path, size: usize, reqs: &[GenerateRequest], expert_parallel: bool) -> Vec<Vec<GenerateOutput>> {
    let group = LocalGroup::new(size);
    let handles: Vec<_> = (0..size)
        .map(|r| {
            let (dir, reqs, rank) = (dir.to_path_buf(), reqs.to_vec(), group.rank(r));
            std::thread::spawn(move || {
                let rank: Arc<dyn Collective<CpuBackend>> = Arc::new(rank);
                let opts = LoadOptions { expert_parallel, ..Default::default() };
                let lm = LoadedModel::open_shard(&dir, CpuBackend::new(), opts, rank).unwrap();
                reqs.iter().map(|q| generate(&lm.model, q).unwrap()).collect::<Vec<_>>()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn prompt_logprob(out: &GenerateOutput, i: usize, tok: u32) -> f64 {
    out.prompt_logprobs[i].as_ref().unwrap().iter().find(|(id, _)| *id == tok).map(|p| p.1).unwrap_or_else(|| panic!("token {tok} not in the top logprobs at {i}"))
}

#[test]
fn split_models_reproduce_the_whole_model_on_every_rank() {
    for name in ["v3-qlora-yarn-groups", "kimi-fp8-partial-blocks"] {
        let dir = fixture(name);
        let reqs = requests(&dir);
        let whole = LoadedModel::open(&dir, CpuBackend::new()).unwrap();
        let want: Vec<GenerateOutput> = reqs.iter().map(|q| generate(&whole.model, q).unwrap()).collect();
        for (size, ep) in [(2, false), (4, false), (2, true), (4, true)] {
            let ranks = run_group(&dir, size, &reqs, ep);
            let mut worst = 0f64;
            for (r, outs) in ranks.iter().enumerate() {
                for (ci, (got, want)) in outs.iter().zip(&want).enumerate() {
                    assert_eq!(got.token_ids, want.token_ids, "{name} TP={size} EP={ep} rank {r} case {ci}: greedy tokens");
                    for i in 1..reqs[ci].prompt_ids.len() {
                        let tok = reqs[ci].prompt_ids[i];
                        let (g, w) = (prompt_logprob(got, i, tok), prompt_logprob(want, i, tok));
                        worst = worst.max((g - w).abs());
                        assert!((g - w).abs() < 1e-4, "{name} TP={size} EP={ep} rank {r} case {ci} position {i}: {g} vs {w}");
                    }
                    assert_eq!(got.token_ids, ranks[0][ci].token_ids, "ranks agree");
                }
            }
            eprintln!("{name}: TP={size} (experts {}) equals TP=1 on every rank (worst prompt logprob difference {worst:.1e})", if ep { "whole, expert-parallel" } else { "sliced" });
        }
    }
}

#[test]
fn a_model_that_does_not_split_evenly_is_refused() {
    // 4 heads do not split over 3 ranks: every rank errors at load, none hangs.
    let group = LocalGroup::new(3);
    let handles: Vec<_> = (0..3)
        .map(|r| {
            let rank: Arc<dyn Collective<CpuBackend>> = Arc::new(group.rank(r));
            std::thread::spawn(move || LoadedModel::open_shard(&fixture("v3-qlora-yarn-groups"), CpuBackend::new(), LoadOptions::default(), rank).err().map(|e| e.to_string()))
        })
        .collect();
    for h in handles {
        let err = h.join().unwrap().expect("a 3-way split of 4 heads must fail");
        assert!(err.contains("num_attention_heads") && err.contains("3 ranks"), "{err}");
    }
}

/// `--load-format dummy` split over ranks: each rank synthesizes only its shard (on the host
/// here: the CPU backend has no generator of its own), the values the unsplit dummy model holds
/// there — the same greedy tokens and prompt log-probabilities as TP=1, experts sliced and whole.
#[test]
fn dummy_models_split_like_checkpoints() {
    let dir = fixture("v3-qlora-yarn-groups");
    let reqs: Vec<GenerateRequest> = requests(&dir).into_iter().take(2).map(|q| GenerateRequest { max_tokens: 6, ..q }).collect();
    let whole = LoadedModel::open_dummy(&dir, CpuBackend::new(), &dir).unwrap();
    let want: Vec<GenerateOutput> = reqs.iter().map(|q| generate(&whole.model, q).unwrap()).collect();
    for ep in [false, true] {
        let lm = LoadedModel::open_dummy_tensor_parallel(&dir, &dir, 2, LoadOptions { expert_parallel: ep, ..Default::default() }, CpuBackend::new(), |_| Ok(CpuBackend::new())).unwrap();
        for (ci, (q, want)) in reqs.iter().zip(&want).enumerate() {
            let got = generate(&lm.model, q).unwrap();
            assert_eq!(got.token_ids, want.token_ids, "dummy TP=2 EP={ep} case {ci}: greedy tokens");
            for i in 1..q.prompt_ids.len() {
                let (g, w) = (prompt_logprob(&got, i, q.prompt_ids[i]), prompt_logprob(want, i, q.prompt_ids[i]));
                assert!((g - w).abs() < 1e-4, "dummy TP=2 EP={ep} case {ci} position {i}: {g} vs {w}");
            }
        }
    }
}

/// A rank that gives up fails the whole group: rank 0's next step returns an error (a clear
/// one, naming the reason) instead of waiting for the missing rank, and so do later steps.
#[test]
fn an_aborted_group_fails_its_next_steps() {
    let dir = fixture("v3-qlora-yarn-groups");
    let req = GenerateRequest { max_tokens: 2, ..requests(&dir).remove(0) };
    let group = LocalGroup::new(2);
    let ranks: Vec<Arc<dyn Collective<CpuBackend>>> = (0..2).map(|r| -> Arc<dyn Collective<CpuBackend>> { Arc::new(group.rank(r)) }).collect();
    let follower = ranks[1].clone();
    let lm = LoadedModel::open_tensor_parallel_group(&dir, LoadOptions::default(), vec![CpuBackend::new(), CpuBackend::new()], ranks).unwrap();
    assert!(generate(&lm.model, &req).is_ok());
    follower.abort("out of device memory (test)");
    for _ in 0..2 {
        let err = generate(&lm.model, &req).expect_err("an aborted group must fail").to_string();
        assert!(err.contains("group failed") && err.contains("out of device memory"), "{err}");
    }
}
