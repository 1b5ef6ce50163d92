//! Decode and prefill of a model on the CUDA backend against the GPU's measured ceilings.
//!
//! Measures the device-to-device copy bandwidth and the bf16 GEMM rate (through the backend's
//! own `linear`, 8192³), then, for each batch × context, times the real forward step (all
//! layers, lm_head) of `batch` sequences that each have `ctx` tokens cached, and divides the
//! bytes the step must move by its time: weights of attention, dense layers, shared experts and
//! the expected number of distinct routed experts the batch selects (uniform routing:
//! E·(1−(1−k/E)^B) per layer; dummy weights route close to uniformly), the lm_head, the KV
//! cache read and written. The step is timed as the engine runs it (recorded as a CUDA graph on
//! its second occurrence, replayed after: `Backend::run_step`) and op by op, with how long the
//! host took to enqueue it (an op-by-op step whose enqueue is as long as the step waits on
//! the host's launches). Prefill:
//! one sequence of `--prefill` tokens, FLOPs of the matmuls and attention over the step time,
//! against the GEMM rate, with the host's enqueue time of the best run (close to the step's
//! time: the GPU waited for the host, e.g. on a download inside the step).
//!
//! The KV cache holds synthetic contents (its values do not change the work), so no prefill
//! is needed to time decode at long contexts.
//!
//! With `--tensor-parallel N` (one GPU per rank, devices 0..N, NCCL; `--expert-parallel` for
//! whole experts per rank) the model is split as `weft serve --collective nccl` splits it, the
//! bytes are those rank 0 moves (its shard, the replicated latent projection, router, cache
//! and lm_head), and a table of NCCL all-reduce times at each batch's size comes first: per
//! call and per step (two all-reduces a layer).
//!
//! With kernels compiled with `WEFT_CUDA_KERNEL_DEFINES=WEFT_TRACE` and `--trace`, one more
//! replayed step of each batch × context is traced (`weft_cuda::trace`): for each kernel, the
//! time from its first block past the wait to the next kernel's — what it adds to the step's
//! chain — summed by kernel, and one stretch of the chain in order.
//!
//! `roofline DIR --dummy [--batch 1,8,32,64] [--ctx 1024,4096] [--prefill 1024,1024x4] [--steps 8] [--kv-cache-dtype f32|bf16] [--tensor-parallel N [--expert-parallel] [--allreduce-only]] [--trace]`

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Instant;
use weft_backend::{AttnRow, Backend, Collective, HostMatrix, KvDtype};
use weft_cuda::nccl::NcclRank;
use weft_cuda::CudaBackend;
use weft_model::{LoadOptions, LoadedModel, ModelConfig, StepBatch};

const PAGE: usize = 64;

fn list(args: &[String], flag: &str, default: &[usize]) -> Vec<usize> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or_else(|| default.to_vec())
}

/// `--prefill 1024,4096,1024x4`: (tokens per prompt, prompts) of each prefill step; `NxP` is P
/// prompts of N tokens in one step (chunked prefill of several requests, as the engine batches
/// them), plain `N` one prompt.
fn prefill_list(args: &[String]) -> Vec<(usize, usize)> {
    let Some(v) = args.iter().position(|a| a == "--prefill").and_then(|i| args.get(i + 1)) else { return vec![(1024, 1)] };
    v.split(',')
        .filter_map(|x| match x.split_once('x') {
            Some((n, p)) => Some((n.parse().ok()?, p.parse().ok()?)),
            None => Some((x.parse().ok()?, 1)),
        })
        .filter(|&(n, p)| n > 0 && p > 0)
        .collect()
}

/// Bytes per element of the decoder layers' projections (fp8 checkpoints keep them in fp8).
fn proj_bytes(c: &ModelConfig) -> f64 {
    if c.fp8_block.is_some() {
        1.0 + 4.0 / (128.0 * 128.0)
    } else {
        2.0
    }
}

/// Parameters of one layer's attention projections.
fn attn_params(c: &ModelConfig) -> f64 {
    attn_params_split(c, 1)
}

/// Parameters of one layer's attention projections one of `n` tensor-parallel ranks holds:
/// its heads' part of q (or q_b), W_UK/W_UV and o_proj; q_a and the latent projection whole.
fn attn_params_split(c: &ModelConfig, n: usize) -> f64 {
    let (h, heads) = (c.hidden_size as f64, (c.num_attention_heads / n) as f64);
    let qk = (c.qk_nope_head_dim + c.qk_rope_head_dim) as f64;
    let q = match c.q_lora_rank {
        None => heads * qk * h,
        Some(r) => r as f64 * h + heads * qk * r as f64,
    };
    let lora = c.kv_lora_rank as f64;
    q + (lora + c.qk_rope_head_dim as f64) * h + heads * lora * (c.qk_nope_head_dim + c.v_head_dim) as f64 + h * heads * c.v_head_dim as f64
}

fn expert_params(c: &ModelConfig, inter: usize) -> f64 {
    3.0 * (c.hidden_size * inter) as f64
}

/// Bytes one decode step of `b` tokens at context `ctx` must move on rank 0 of `n`
/// tensor-parallel ranks (the whole step for `n` = 1): its shard of the split weights (a
/// `1/n` slice of each distinct expert; under expert parallelism the distinct experts among
/// its whole ones, the same expected bytes under uniform routing), the replicated ones, the
/// whole latent cache (every rank reads it for its heads) and the lm_head (rank 0 computes the
/// logits).
fn step_bytes_rank(c: &ModelConfig, b: usize, ctx: usize, kv: KvDtype, n: usize) -> f64 {
    let pb = proj_bytes(c);
    let e = c.n_routed_experts as f64;
    let k = c.num_experts_per_tok as f64;
    let distinct = if e > 0.0 { e * (1.0 - (1.0 - k / e).powi(b as i32)) } else { 0.0 };
    let mut total = 0.0;
    for l in 0..c.num_hidden_layers {
        total += attn_params_split(c, n) * pb;
        if c.is_moe_layer(l) {
            total += (c.n_routed_experts * c.hidden_size) as f64 * 4.0; // f32 router
            total += expert_params(c, c.moe_intermediate_size * c.n_shared_experts) * pb / n as f64;
            total += distinct * expert_params(c, c.moe_intermediate_size) * pb / n as f64;
        } else {
            total += expert_params(c, c.intermediate_size) * pb / n as f64;
        }
    }
    let width = ((c.kv_lora_rank + c.qk_rope_head_dim) * kv.size()) as f64; // latent cache entry
    total += (c.vocab_size * c.hidden_size) as f64 * 2.0; // lm_head (bf16)
    total += (b * ctx) as f64 * width * c.num_hidden_layers as f64; // KV read
    total += b as f64 * width * c.num_hidden_layers as f64; // KV written
    total
}

/// NCCL all-reduce (sum, in place) of `floats` f32 on every rank at once: mean µs per call
/// over `reps` calls after a warm-up, rank 0's clock (each rank synchronizes its stream).
fn allreduce_us(bes: &[CudaBackend], ranks: &[Arc<NcclRank>], floats: usize, reps: usize) -> f64 {
    let barrier = Barrier::new(bes.len());
    std::thread::scope(|s| {
        let runs: Vec<_> = bes
            .iter()
            .zip(ranks)
            .map(|(be, rank)| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut x = be.upload(&vec![1.0; floats]).unwrap();
                    for _ in 0..3 {
                        rank.all_reduce_sum(be, &mut x).unwrap();
                    }
                    be.synchronize().unwrap();
                    barrier.wait();
                    let t = Instant::now();
                    for _ in 0..reps {
                        rank.all_reduce_sum(be, &mut x).unwrap();
                    }
                    be.synchronize().unwrap();
                    let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
                    barrier.wait();
                    us
                })
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap()).next().unwrap()
    })
}

/// Matmul + attention FLOPs of a prefill of `n` tokens (one sequence, causal), the model's
/// own form: W_UK and W_UV applied once per token (in the parameters), then per query, key and
/// head the 192-wide score and 128-wide value products (before 2026-12-05 the pairs were
/// counted absorbed, 2·512 + 64 wide: 3.4× the attention term).
fn prefill_flops(c: &ModelConfig, n: usize) -> f64 {
    let mut params = 0.0;
    for l in 0..c.num_hidden_layers {
        params += attn_params(c);
        params += if c.is_moe_layer(l) {
            expert_params(c, c.moe_intermediate_size * (c.n_shared_experts + c.num_experts_per_tok)) + (c.n_routed_experts * c.hidden_size) as f64
        } else {
            expert_params(c, c.intermediate_size)
        };
    }
    let heads = c.num_attention_heads as f64;
    let per_pair = heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim) as f64 * 2.0;
    let pairs = (n * (n + 1) / 2) as f64;
    2.0 * params * n as f64 + per_pair * pairs * c.num_hidden_layers as f64 + 2.0 * (c.vocab_size * c.hidden_size) as f64
}

/// Tokens, positions and cache slots of a decode step: every sequence (one block table each)
/// writes position `pos`; tokens vary with the sequence and the step.
fn step_inputs(tables: &[Vec<u32>], pos: usize, step: usize, vocab: u64) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let tokens = (0..tables.len() as u64).map(|s| ((s * 7919 + step as u64 * 104729) % (vocab - 10)) as u32).collect();
    let slots = tables.iter().map(|t| t[pos / PAGE] * PAGE as u32 + (pos % PAGE) as u32).collect();
    (tokens, vec![pos as u32; tables.len()], slots)
}

/// Records `step` into a CUDA graph and returns the mean time of a replay (launch to
/// completion, 16 replays after one warm-up).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(args.first().expect("usage: roofline DIR [--dummy] [--batch 1,8] [--ctx 1024] [--prefill 1024] [--steps 8]"));
    let dummy = args.iter().any(|a| a == "--dummy");
    let batches = list(&args, "--batch", &[1, 8, 32, 64]);
    let ctxs = list(&args, "--ctx", &[1024, 4096]);
    let prefill = prefill_list(&args);
    let steps = list(&args, "--steps", &[8])[0];
    let kv = args.iter().position(|a| a == "--kv-cache-dtype").map_or(KvDtype::F32, |i| KvDtype::parse(args.get(i + 1).map_or("", |s| s.as_str())).unwrap());
    let tp = list(&args, "--tensor-parallel", &[1])[0].max(1);
    let ep = args.iter().any(|a| a == "--expert-parallel");
    let mut be = CudaBackend::new(0).expect("a CUDA device");
    let name = be.device_name.clone();
    // The GEMM ceiling is the hardware's one-pass bf16 rate; the engine's GEMMs then run with
    // the backend's settings (`WEFT_CUDA_GEMM_SPLIT`: two passes for decode rows by default;
    // `WEFT_CUDA_PREFILL_PARTS`: one for prompt rows of long runs by default).
    let split = std::mem::replace(&mut be.gemm_split, false);

    // Ceilings: copy bandwidth (read + write) and bf16 GEMM rate through `linear`.
    let copy_bw = be.measure_copy_bandwidth().unwrap();
    let d = 8192;
    let w = be.upload_matrix(&HostMatrix::from_f32("bench.gemm", d, d, &vec![0.01; d * d])).unwrap();
    let x = be.upload(&vec![0.5; d * d]).unwrap();
    be.linear(&x, &w).unwrap();
    be.synchronize().unwrap();
    let t = Instant::now();
    for _ in 0..5 {
        be.linear(&x, &w).unwrap();
    }
    be.synchronize().unwrap();
    let gemm_rate = 5.0 * 2.0 * (d as f64).powi(3) / t.elapsed().as_secs_f64();
    drop((w, x));
    be.gemm_split = split;
    println!(
        "GPU: {name}; measured copy bandwidth {:.0} GB/s; bf16 GEMM (8192³ through `linear`, one pass, incl. activation cast) {:.0} TFLOP/s; engine GEMMs in {} pass(es) for decode rows, {} for prompt runs",
        copy_bw / 1e9,
        gemm_rate / 1e12,
        if split { 2 } else { 1 },
        if split { be.prefill_parts } else { 1 }
    );

    let demo = PathBuf::from(std::env::var("WEFT_DEMO_MODEL").unwrap_or_else(|_| "models/demo".into()));
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let t = Instant::now();
    let mut lm = if tp == 1 {
        if dummy { LoadedModel::open_dummy(&dir, be, &demo) } else { LoadedModel::open(&dir, be) }.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
    } else {
        // One GPU per rank, NCCL; the all-reduce sizes a decode step of each batch uses.
        let mut bes = vec![be];
        for r in 1..tp {
            bes.push(CudaBackend::new(r).unwrap_or_else(|e| panic!("tensor-parallel rank {r} on device {r}: {e}")));
        }
        let group = weft_cuda::nccl::nccl_group(&bes.iter().collect::<Vec<_>>()).expect("an NCCL group");
        println!();
        println!("NCCL all-reduce (f32 sum in place, {tp} GPUs; a decode step makes two per layer: after attention and after the MLP/MoE):");
        println!("| batch | floats | µs per all-reduce | bus GB/s | all-reduces per step | ms per step |");
        println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
        for &b in &batches {
            let floats = b * cfg.hidden_size;
            let us = allreduce_us(&bes, &group, floats, 200);
            let per_step = 2 * cfg.num_hidden_layers;
            // NCCL's bus bandwidth of a ring all-reduce: 2(n-1)/n of the buffer per rank.
            let bus = (floats * 4) as f64 * 2.0 * (tp - 1) as f64 / tp as f64 / (us * 1e-6) / 1e9;
            println!("| {b} | {floats} | {us:.1} | {bus:.1} | {per_step} | {:.3} |", us * per_step as f64 / 1e3);
        }
        if args.iter().any(|a| a == "--allreduce-only") {
            return;
        }
        let ranks = group.into_iter().map(|g| -> Arc<dyn Collective<CudaBackend>> { g }).collect();
        let opts = LoadOptions { mtp: false, expert_parallel: ep };
        if dummy { LoadedModel::open_dummy_tensor_parallel_group(&dir, &demo, opts, bes, ranks) } else { LoadedModel::open_tensor_parallel_group(&dir, opts, bes, ranks) }
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
    };
    lm.model.set_kv_dtype(kv);
    let model = &lm.model;
    let c = &model.cfg;
    println!(
        "model: {} ({} layers, hidden {}, {} experts top-{}, {}, {:?} latent cache){}; loaded in {:.1} s",
        dir.display(),
        c.num_hidden_layers,
        c.hidden_size,
        c.n_routed_experts,
        c.num_experts_per_tok,
        if c.fp8_block.is_some() { "fp8 block weights" } else { "bf16 weights" },
        kv,
        if tp > 1 { format!(", tensor-parallel over {tp} GPUs (NCCL{})", if ep { ", whole experts per rank" } else { "" }) } else { String::new() },
        t.elapsed().as_secs_f64()
    );
    let be = &model.backend;

    // Pool big enough for the largest batch × context that fits in free memory.
    let width_bytes = model.kv_layout(1, PAGE).bytes_per_page();
    let (free, _) = be.memory_info().unwrap_or((0, 0));
    let budget_pages = (free.saturating_sub(6 << 30)) / width_bytes;
    let need = |b: usize, ctx: usize| b * (ctx + 2 * steps + 4).div_ceil(PAGE);
    let max_pages = batches
        .iter()
        .flat_map(|&b| ctxs.iter().map(move |&x| need(b, x)))
        .filter(|&p| p <= budget_pages)
        .max()
        .unwrap_or(0)
        .max(prefill.iter().map(|&(n, p)| p * n.div_ceil(PAGE)).max().unwrap_or(0));
    let mut pool = model.alloc_kv_pool(max_pages, PAGE).unwrap();

    println!();
    println!(
        "| batch | context | step ms | out tok/s | bytes/step GB | achieved GB/s | % of copy BW | op-by-op step ms | op-by-op host enqueue ms | logits download ms | device front end ms (top-64) |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!("(step ms: the serving configuration, the step recorded as a CUDA graph and replayed; op by op: every kernel launched from the host)");
    if tp > 1 {
        println!("(tensor-parallel: bytes and % of copy BW are rank 0's — one GPU's; out tok/s is the group's)");
    }
    let trace = (args.iter().any(|a| a == "--trace") && be.trace_on()).then(|| weft_cuda::trace::names_by_hash(weft_cuda::KERNEL_SOURCE));
    let mut traces = vec![];
    for &ctx in &ctxs {
        for &b in &batches {
            if need(b, ctx) > max_pages {
                println!("| {b} | {ctx} | skipped: the KV cache needs {:.0} GB | | | | | | | | |", (need(b, ctx) * width_bytes) as f64 / 1e9);
                continue;
            }
            let per_seq = (ctx + 2 * steps + 4).div_ceil(PAGE);
            let tables: Vec<Vec<u32>> = (0..b).map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect()).collect();
            let vocab = c.vocab_size as u64;
            // The sampling front end as the engine runs it for a plugin sampler: top-64 per row.
            let fronts = vec![weft_backend::front::FrontRow { k: 64, temperature: 0.7, edits: vec![] }; b];
            let mut run_step = |step: usize, download: bool| -> (f64, f64, f64, f64) {
                let (tokens, positions, slots) = step_inputs(&tables, ctx + step, step, vocab);
                let attn: Vec<AttnRow<'_>> = tables.iter().map(|t| AttnRow { block_table: t, ctx_len: ctx + step + 1 }).collect();
                let batch = StepBatch { tokens: &tokens, positions: &positions, slots: &slots, attn: &attn, exact_rows: &[] };
                let t = Instant::now();
                let hidden = model.forward_hidden(&mut pool, &batch).unwrap();
                let mut logits = model.logits(&hidden).unwrap();
                let enqueue_s = t.elapsed().as_secs_f64();
                be.synchronize().unwrap();
                let step_s = t.elapsed().as_secs_f64();
                if !download {
                    return (step_s, enqueue_s, 0.0, 0.0);
                }
                let t = Instant::now();
                be.download(&logits).unwrap();
                let dl = t.elapsed().as_secs_f64();
                let t = Instant::now();
                be.sampling_front(&mut logits, c.vocab_size, &fronts).unwrap();
                (step_s, enqueue_s, dl, t.elapsed().as_secs_f64())
            };
            // Op by op (every kernel launched from the host), then as the engine runs it:
            // recorded as a CUDA graph on the second step of the shape and replayed after.
            let mut measure = |graphs: bool, first: usize| -> (f64, f64, f64, f64) {
                be.set_step_graphs(graphs);
                run_step(first, true);
                run_step(first + 1, false);
                let (mut tot, mut enq, mut dl, mut fe) = (0.0, 0.0, 0.0, 0.0);
                for s in 0..steps {
                    let (a, q, d, f) = run_step(first + 2 + s, s == 0);
                    tot += a;
                    enq += q;
                    if s == 0 {
                        (dl, fe) = (d, f);
                    }
                }
                (tot / steps as f64, enq / steps as f64, dl, fe)
            };
            // Op by op is measured on one GPU only (rank 0 alone cannot leave graphs under TP).
            let (ops_step, ops_enq, _, _) = if tp == 1 { measure(false, 0) } else { (f64::NAN, f64::NAN, 0.0, 0.0) };
            let before = be.graph_stats();
            let (step, _, dl, fe) = measure(true, 2 + steps);
            let after = be.graph_stats();
            let recorded = after.replayed >= before.replayed + steps as u64;
            if let Some(names) = trace.as_ref().filter(|_| recorded) {
                // The last measured step's positions again: a replay, its KV slots rewritten.
                be.trace_reset().unwrap();
                run_step(2 * steps + 3, false);
                traces.push((b, ctx, weft_cuda::trace::launches(be.trace_take().unwrap(), names)));
            }
            let bytes = step_bytes_rank(c, b, ctx, kv, tp);
            println!(
                "| {b} | {ctx} | {:.3}{} | {:.0} | {:.2} | {:.0} | {:.1} % | {:.3} | {:.3} | {:.2} | {:.2} |",
                step * 1e3,
                if !recorded {
                    " (not recorded)".to_string()
                } else if be.pdl() {
                    format!(" [pdl {}/{}]", after.programmatic_edges, after.memory_nodes)
                } else {
                    String::new()
                },
                b as f64 / step,
                bytes / 1e9,
                bytes / step / 1e9,
                100.0 * bytes / step / copy_bw,
                ops_step * 1e3,
                ops_enq * 1e3,
                dl * 1e3,
                fe * 1e3
            );
        }
    }

    for (b, ctx, grids) in &traces {
        print_trace(*b, *ctx, grids);
    }
    let st = be.graph_stats();
    println!("(step graphs: {} programmatic kernel-to-kernel edges in the latest recording; WEFT_CUDA_PDL={})", st.programmatic_edges, be.pdl() as u8);
    if let Some(e) = st.last_failure {
        println!("(a step graph failed to record: {e})");
    }
    println!();
    println!("| prefill tokens | ms | tok/s | TFLOP/s | % of GEMM rate | host enqueue ms |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for &(n, prompts) in &prefill {
        // Prompt j: its own pages, positions 0..n, rows j·n.. of the step.
        let pages = n.div_ceil(PAGE);
        let tables: Vec<Vec<u32>> = (0..prompts).map(|j| ((j * pages) as u32..((j + 1) * pages) as u32).collect()).collect();
        let tokens: Vec<u32> = (0..(n * prompts) as u64).map(|i| ((i * 2654435761 + 17) % (c.vocab_size as u64 - 200) + 100) as u32).collect();
        let positions: Vec<u32> = (0..prompts).flat_map(|_| 0..n as u32).collect();
        let slots: Vec<u32> = (0..n * prompts).map(|r| tables[r / n][(r % n) / PAGE] * PAGE as u32 + ((r % n) % PAGE) as u32).collect();
        let attn: Vec<AttnRow<'_>> = (0..n * prompts).map(|r| AttnRow { block_table: &tables[r / n], ctx_len: r % n + 1 }).collect();
        let batch = StepBatch { tokens: &tokens, positions: &positions, slots: &slots, attn: &attn, exact_rows: &[] };
        let lasts: Vec<u32> = (1..=prompts).map(|j| (j * n - 1) as u32).collect();
        let (mut best, mut enqueue) = (f64::MAX, 0.0);
        for _ in 0..3 {
            let t = Instant::now();
            let hidden = model.forward_hidden(&mut pool, &batch).unwrap();
            let last = be.gather_rows(&hidden, c.hidden_size, &lasts).unwrap();
            let logits = model.logits(&last).unwrap();
            let queued = t.elapsed().as_secs_f64();
            be.download(&logits).unwrap();
            let took = t.elapsed().as_secs_f64();
            if took < best {
                (best, enqueue) = (took, queued);
            }
        }
        let flops = prefill_flops(c, n) * prompts as f64;
        let label = if prompts == 1 { n.to_string() } else { format!("{n} × {prompts}") };
        println!("| {label} | {:.1} | {:.0} | {:.1} | {:.1} % | {:.1} |", best * 1e3, (n * prompts) as f64 / best, flops / best / 1e12, 100.0 * flops / best / gemm_rate, enqueue * 1e3);
    }
}

/// A traced step: time on the chain by kernel, then the middle 28 grids in order.
fn print_trace(b: usize, ctx: usize, grids: &[weft_cuda::trace::TracedLaunch]) {
    let total: u64 = grids.iter().map(|g| g.critical_ns).sum();
    println!();
    println!("(trace, batch {b} × {ctx}: {} grids, {:.1} µs from the first past its wait to the last)", grids.len(), total as f64 / 1e3);
    println!("| function past the wait | grids | blocks a grid | µs on the chain a grid | µs a step | share |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let mut by: std::collections::HashMap<&str, (usize, usize, u64)> = std::collections::HashMap::new();
    for g in grids {
        let e = by.entry(g.name.as_str()).or_default();
        *e = (e.0 + 1, e.1 + g.blocks, e.2 + g.critical_ns);
    }
    let mut rows: Vec<_> = by.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1 .2));
    for (name, (n, blocks, ns)) in rows {
        println!("| {name} | {n} | {:.0} | {:.2} | {:.1} | {:.1} % |", blocks as f64 / n as f64, ns as f64 / n as f64 / 1e3, ns as f64 / 1e3, 100.0 * ns as f64 / total.max(1) as f64);
    }
    let mid = grids.len().saturating_sub(28) / 2;
    let chain: Vec<String> = grids[mid..(mid + 28).min(grids.len())].iter().map(|g| format!("{} {:.1}", g.name, g.critical_ns as f64 / 1e3)).collect();
    println!("(grids {mid}.. in order, µs on the chain: {})", chain.join(", "));
}
