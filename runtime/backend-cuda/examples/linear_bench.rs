//! Decode-batch linears alone, against the measured copy bandwidth: each projection of a
//! Moonlight layer (and the dense layer-0 MLP and lm_head) at `--rows` activation rows, on every
//! path the backend can take past 32 rows — cuBLAS (the split cast, one stacked GEMM of both
//! bf16 parts, `add_halves`) and the one-pass tensor-core kernel (`gemv_mma_bf16_n8`) with thread
//! block clusters of 1, the default and 8 blocks and 1, 2 or 4 units a block. Each path runs as
//! the engine runs a step: `--reps` calls recorded into one CUDA graph (programmatic edges
//! between weft's kernels, as in a step graph) and replayed; the weights rotate through copies
//! of at least 512 MB in all, so they come from HBM as in a step. Bytes = weights + f32
//! activations read + f32 outputs written. Synthetic weights (`dummy_matrix`).
//!
//! `cargo run --release -p weft-cuda --example linear_bench -- [--rows 48,64] [--reps 64] [--big]`
//! (`--big`: also the dense layer-0 MLP and lm_head, which stay on cuBLAS by default).

use std::time::Instant;
use weft_backend::dummy::DummySpec;
use weft_backend::Backend;
use weft_cuda::{CudaBackend, CudaMatrix};

fn list(args: &[String], flag: &str, default: &[usize]) -> Vec<usize> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or_else(|| default.to_vec())
}

/// How a projection is applied: a plain linear, one per head group (`head_linear`), or gate|up
/// with SiLU (`gated_up`; its rows are the intermediate size, the weight twice that).
#[derive(Clone, Copy)]
enum Op {
    Plain,
    Heads(usize),
    Gated,
}

struct Path {
    name: &'static str,
    max_m: usize,
    cluster: usize,
    ub: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rows_list = list(&args, "--rows", &[48, 64]);
    let reps = list(&args, "--reps", &[64])[0].max(1);
    let mut be = CudaBackend::new(0).expect("a CUDA device");
    let copy_bw = be.measure_copy_bandwidth().unwrap();
    let auto_cluster = be.mma_cluster;
    println!("GPU: {}; measured copy bandwidth {:.0} GB/s; {} SMs; default cluster bound {auto_cluster}", be.device_name, copy_bw / 1e9, be.num_sms);
    let mut shapes: Vec<(&str, usize, usize, Op)> = vec![
        ("q_proj", 3072, 2048, Op::Plain),
        ("kv_a", 576, 2048, Op::Plain),
        ("o_proj", 2048, 2048, Op::Plain),
        ("shared gate|up (2816)", 2816, 2048, Op::Gated),
        ("shared down", 2048, 2816, Op::Plain),
        ("shared chunk gate|up (1408)", 1408, 2048, Op::Gated),
        ("shared chunk down", 2048, 1408, Op::Plain),
        ("W_UK (16 heads)", 16 * 512, 128, Op::Heads(16)),
        ("W_UV (16 heads)", 16 * 128, 512, Op::Heads(16)),
    ];
    if args.iter().any(|a| a == "--big") {
        shapes.extend([("dense gate|up (11264)", 11264, 2048, Op::Gated), ("dense down", 2048, 11264, Op::Plain), ("lm_head", 163840, 2048, Op::Plain)]);
    }
    let paths = [
        Path { name: "cuBLAS (split cast, stacked GEMM, add_halves)", max_m: 32, cluster: 1, ub: 1 },
        Path { name: "n8, no cluster, 1 unit a block", max_m: 64, cluster: 1, ub: 1 },
        Path { name: "n8, default clusters, 1 unit", max_m: 64, cluster: auto_cluster, ub: 1 },
        Path { name: "n8, default clusters, 2 units", max_m: 64, cluster: auto_cluster, ub: 2 },
        Path { name: "n8, default clusters, 4 units", max_m: 64, cluster: auto_cluster, ub: 4 },
        Path { name: "n8, clusters of up to 8, 4 units", max_m: 64, cluster: if auto_cluster > 1 { 8 } else { 1 }, ub: 4 },
    ];
    println!("\n| projection | rows × cols | m | path | µs | GB/s | % of copy BW | vs cuBLAS |");
    println!("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |");
    for &(name, rows, cols, op) in &shapes {
        let wrows = if matches!(op, Op::Gated) { 2 * rows } else { rows };
        let wbytes = wrows * cols * 2;
        let copies = (512usize << 20).div_ceil(wbytes).max(2);
        let ws: Vec<CudaMatrix> = (0..copies)
            .map(|c| {
                let spec = DummySpec::new(format!("{name} {c}"), vec![(0x9e37_79b9 ^ c as u64, wrows)], cols, 0.02, None);
                be.dummy_matrix(&spec).expect("the CUDA backend makes dummy weights").unwrap()
            })
            .collect();
        for &m in &rows_list {
            let xcols = match op {
                Op::Heads(h) => h * cols,
                _ => cols,
            };
            let x = be.upload(&(0..m * xcols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect::<Vec<_>>()).unwrap();
            let bytes = (wbytes + m * xcols * 4 + m * rows * 4) as f64;
            let mut base = None;
            for p in &paths {
                (be.mma_max_m[0], be.mma_cluster, be.mma_wide_ub) = (p.max_m, p.cluster, p.ub);
                let run = |be: &CudaBackend, w: &CudaMatrix| match op {
                    Op::Plain => be.linear(&x, w).map(drop),
                    Op::Heads(h) => be.head_linear(&x, h, w).map(drop),
                    Op::Gated => be.gated_up(&x, w, rows).map(drop),
                };
                // once outside a recording (a path that cannot run says so), then recorded
                if let Err(e) = run(&be, &ws[0]).and_then(|()| be.synchronize()) {
                    println!("| {name} | {wrows} × {cols} | {m} | {} | failed: {e} | | | |", p.name);
                    continue;
                }
                be.begin_capture().unwrap();
                let recorded = (0..reps).try_for_each(|i| run(&be, &ws[i % copies]));
                let graph = be.end_capture();
                let graph = match (recorded, graph) {
                    (Ok(()), Ok(g)) => g,
                    (Err(e), _) | (_, Err(e)) => {
                        println!("| {name} | {wrows} × {cols} | {m} | {} | not recorded: {e} | | | |", p.name);
                        continue;
                    }
                };
                graph.launch().unwrap();
                be.synchronize().unwrap();
                let t = Instant::now();
                for _ in 0..5 {
                    graph.launch().unwrap();
                }
                be.synchronize().unwrap();
                let secs = t.elapsed().as_secs_f64() / (5 * reps) as f64;
                let vs = base.map_or("1.00×".to_string(), |b: f64| format!("{:.2}×", b / secs));
                base.get_or_insert(secs);
                let kernel = be.describe_linear(&ws[0], m, matches!(op, Op::Gated));
                println!("| {name} | {wrows} × {cols} | {m} | {}: {kernel} | {:.2} | {:.0} | {:.1} % | {vs} |", p.name, secs * 1e6, bytes / secs / 1e9, 100.0 * bytes / secs / copy_bw);
            }
        }
    }
}
