//! Forward steps replayed from CUDA graphs against the same steps issued op by op, on a golden
//! fixture model: several sequences decoding together, a sequence leaving and coming back
//! (a different token count), contexts crossing page boundaries and a context bucket, block
//! tables outgrowing the step-input buffers; the same with programmatic edges between the
//! recorded kernels (`WEFT_CUDA_PDL=1`). On a machine without CUDA it prints SKIPPED.
#![cfg(feature = "cuda")]

use weft_backend::{AttnRow, Backend, StepBatch};
use weft_cuda::CudaBackend;
use weft_model::LoadedModel;

/// `pdl`: programmatic edges in the recorded graphs (Hopper and later; `WEFT_CUDA_PDL`).
fn open(graphs: bool, pdl: bool) -> Option<LoadedModel<CudaBackend>> {
    std::env::set_var("WEFT_CUDA_POISON", "1");
    std::env::set_var("WEFT_CUDA_PDL", if pdl { "1" } else { "0" });
    let be = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e @ weft_backend::BackendError::Unavailable { .. }) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED (no usable CUDA device here): {e}");
            return None;
        }
        Err(e) => panic!("the CUDA backend failed to start: {e}"),
    };
    be.set_step_graphs(graphs);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/v3-qlora-yarn-groups");
    Some(LoadedModel::open(&dir, be).unwrap())
}

struct Seq {
    tokens: Vec<u32>,
    pages: Vec<u32>,
}

const PAGE: usize = 4;

/// Runs `steps` (lists of sequences taking part) on `lm`: each sequence's pending tokens go
/// through the model, one next token (a fixed function of the step) is appended. Returns every
/// step's hidden states.
fn run(lm: &LoadedModel<CudaBackend>, plan: &[Vec<usize>]) -> Vec<Vec<f32>> {
    let m = &lm.model;
    let mut pool = m.backend.alloc_kv_pool(m.kv_layout(1024, PAGE)).unwrap();
    let vocab = m.cfg.vocab_size as u32;
    let mut seqs: Vec<Seq> = [5usize, 250, 17]
        .iter()
        .enumerate()
        .map(|(i, &n)| Seq { tokens: (0..n as u32).map(|t| (t * 7 + i as u32 * 13) % vocab).collect(), pages: (0..300).map(|p| (i * 300 + p) as u32).collect() })
        .collect();
    let mut done = vec![0usize; seqs.len()];
    let mut outs = vec![];
    for (si, members) in plan.iter().enumerate() {
        let (mut tokens, mut positions, mut slots, mut owner) = (vec![], vec![], vec![], vec![]);
        for &q in members {
            let s = &seqs[q];
            for p in done[q]..s.tokens.len() {
                tokens.push(s.tokens[p]);
                positions.push(p as u32);
                slots.push(s.pages[p / PAGE] * PAGE as u32 + (p % PAGE) as u32);
                owner.push((q, p));
            }
        }
        let attn: Vec<AttnRow> = owner.iter().map(|&(q, p)| AttnRow { block_table: &seqs[q].pages[..p / PAGE + 1], ctx_len: p + 1 }).collect();
        let batch = StepBatch { tokens: &tokens, positions: &positions, slots: &slots, attn: &attn, exact_rows: &[] };
        let h = m.forward_hidden(&mut pool, &batch).unwrap();
        outs.push(m.backend.download(&h).unwrap());
        drop(attn);
        for &q in members {
            done[q] = seqs[q].tokens.len();
            let next = (si as u32 * 31 + q as u32 * 5 + 1) % vocab;
            seqs[q].tokens.push(next);
        }
    }
    outs
}

#[test]
fn replayed_steps_equal_op_by_op_steps() {
    // One test, so that the environment each backend starts with is not raced.
    let (Some(graphs), Some(ops), Some(pdl)) = (open(true, false), open(false, false), open(true, true)) else { return };
    // Prefill each sequence alone, then decode: all three, then two, then all three again.
    let mut plan: Vec<Vec<usize>> = vec![vec![0], vec![1], vec![2]];
    plan.extend((0..12).map(|_| vec![0, 1, 2]));
    plan.extend((0..6).map(|_| vec![0, 2]));
    plan.extend((0..14).map(|_| vec![0, 1, 2]));
    let a = run(&graphs, &plan);
    let b = run(&ops, &plan);
    let c = run(&pdl, &plan);
    for (i, (x, y)) in a.iter().chain(&c).zip(b.iter().chain(&b)).enumerate() {
        let i = i % plan.len();
        assert_eq!(x.len(), y.len());
        let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
        // (A NaN on either side is infinitely far: `f32::max` alone would drop it.)
        let worst = x.iter().zip(y).fold(0f32, |m, (p, q)| if (p - q).is_nan() { f32::INFINITY } else { m.max((p - q).abs()) });
        assert!(worst.is_finite() && worst <= 1e-4 * scale.max(1.0), "step {i} ({:?}): differs by {worst} (scale {scale})", plan[i]);
    }
    let st = graphs.model.backend.graph_stats();
    eprintln!("{st:?}");
    // Three tokens in buckets 256 and 512 (the 250-token sequence passes 256), two tokens.
    assert!(st.recorded >= 3, "{st:?}");
    assert!(st.replayed >= 20, "{st:?}");
    assert_eq!(st.failed, 0, "{st:?}");
    assert_eq!(ops.model.backend.graph_stats().recorded, 0);
    let st = pdl.model.backend.graph_stats();
    eprintln!("with programmatic edges: {st:?}");
    assert_eq!((st.failed, st.last_failure.as_deref()), (0, None), "{st:?}");
    if pdl.model.backend.pdl() {
        assert!(st.programmatic_edges > 0 && st.memory_nodes == 0, "{st:?}");
    }
}
