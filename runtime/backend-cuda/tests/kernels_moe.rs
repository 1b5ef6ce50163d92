//! The MoE ops on the GPU against the CPU reference (routing, the expert plan, weight-streaming
//! and tensor-core experts, the grouped GEMM, host routing, expert-parallel ranks, shared experts
//! run with the routed ones), outputs poisoned (NaN-filled) so unwritten elements are caught. On
//! a machine without CUDA every test prints why it is skipped and passes.
#![cfg(feature = "cuda")]

use weft_backend::cpu::CpuBackend;
use weft_backend::{Backend, ExpertWeights, HostMatrix, RouterConfig};
use weft_cuda::CudaBackend;

mod gpu;
use gpu::*;

/// The same experts on both backends, each made by `make(rng, rows, cols)`.
type BothExperts = (Vec<ExpertWeights<weft_cuda::CudaMatrix>>, Vec<ExpertWeights<weft_backend::cpu::CpuMatrix>>);
fn experts_on_both(g: &CudaBackend, c: &CpuBackend, r: &mut Rng, e: usize, hidden: usize, inter: usize, make: impl Fn(&mut Rng, usize, usize) -> HostMatrix<'static>) -> BothExperts {
    let (mut eg, mut ec) = (vec![], vec![]);
    for _ in 0..e {
        let gu = make(r, 2 * inter, hidden);
        let dn = make(r, hidden, inter);
        eg.push(ExpertWeights { gate_up: g.upload_matrix(&gu).unwrap(), down: g.upload_matrix(&dn).unwrap(), inter });
        ec.push(ExpertWeights { gate_up: c.upload_matrix(&gu).unwrap(), down: c.upload_matrix(&dn).unwrap(), inter });
    }
    (eg, ec)
}

/// Random tokens, router logits and bias through both backends' `moe`, compared.
#[allow(clippy::too_many_arguments)]
fn check_moe(g: &CudaBackend, c: &CpuBackend, r: &mut Rng, cfg: &RouterConfig, experts: &BothExperts, m: usize, hidden: usize, name: &str, tol: f32) {
    check_moe_favouring(g, c, r, cfg, experts, m, hidden, name, tol, &[]);
}

/// `check_moe` with the experts in `favoured` chosen by every token (a large selection bias):
/// experts serving many entries, in several passes.
#[allow(clippy::too_many_arguments)]
fn check_moe_favouring(g: &CudaBackend, c: &CpuBackend, r: &mut Rng, cfg: &RouterConfig, experts: &BothExperts, m: usize, hidden: usize, name: &str, tol: f32, favoured: &[usize]) {
    let (x, logits, bias, shared) = moe_inputs(r, cfg.n_experts, m, hidden, favoured);
    let got =
        g.download(&g.moe(&g.upload(&x).unwrap(), &g.upload(&logits).unwrap(), &g.upload(&bias).unwrap(), cfg, &experts.0, shared.as_ref().map(|s| g.upload(s).unwrap()).as_ref()).unwrap()).unwrap();
    let want = c.moe(&x, &logits, &bias, cfg, &experts.1, shared.as_ref()).unwrap();
    check(name, &got, &want, tol);
}

/// Tokens, router logits and bias for `m` tokens over `e` experts, every token choosing those in
/// `favoured`; on even `m` a shared experts' output for the combine to add.
type MoeInputs = (Vec<f32>, Vec<f32>, Vec<f32>, Option<Vec<f32>>);
fn moe_inputs(r: &mut Rng, e: usize, m: usize, hidden: usize, favoured: &[usize]) -> MoeInputs {
    let x = r.vec(m * hidden, 1.0);
    let logits = r.vec(m * e, 3.0);
    let mut bias = r.vec(e, 0.3);
    for &f in favoured {
        bias[f] = 10.0;
    }
    let shared = (m % 2 == 0).then(|| r.vec(m * hidden, 1.0));
    (x, logits, bias, shared)
}

#[test]
fn moe_matches_cpu() {
    let Some(mut g) = gpu() else { return };
    let c = CpuBackend::new();
    let mut r = Rng(3);
    let (m, hidden, inter, e) = (37, 1024, 352, 32);
    let cfg = RouterConfig { n_experts: e, top_k: 6, n_group: 4, topk_group: 2, norm_topk_prob: true, routed_scaling_factor: 2.446 };
    let experts = experts_on_both(&g, &c, &mut r, e, hidden, inter, |r, rows, cols| bf16_matrix(r, rows, cols, 0.05));
    check_moe(&g, &c, &mut r, &cfg, &experts, m, hidden, "moe (route + experts)", GEMM_TOL);
    // Prefill-sized batches (~56 and ~60 tokens per expert, odd and even m for the shared-expert
    // add): the grouped GEMM over the device plan (kernels/moe_gemm.cu), then, with it off, routing
    // on the host: the grouped cuBLAS GEMMs, and the per-expert path.
    for m in [299usize, 320] {
        check_moe(&g, &c, &mut r, &cfg, &experts, m, hidden, &format!("moe device-planned GEMM m={m}"), MMA_TOL);
    }
    g.moe_gemm_tokens = 0;
    for grouped in [true, false] {
        g.moe_grouped = grouped;
        for m in [299usize, 320] {
            check_moe(&g, &c, &mut r, &cfg, &experts, m, hidden, &format!("moe host-routed m={m} grouped={grouped}"), GEMM_TOL);
        }
    }
}

#[test]
fn moe_decode_path_matches_cpu() {
    let Some(mut g) = gpu() else { return };
    let c = CpuBackend::new();
    let mut r = Rng(5);
    // bf16 experts, group-limited routing (device routing and weight-streaming experts); several
    // tokens per expert on CUDA cores (mma off) and on tensor cores, whose passes take 8 or 16
    // entries: three favoured experts serve all 40 tokens (passes of 16, 16, 8).
    let (hidden, inter, e) = (1024, 352, 32);
    let cfg = RouterConfig { n_experts: e, top_k: 6, n_group: 4, topk_group: 2, norm_topk_prob: true, routed_scaling_factor: 2.446 };
    let experts = experts_on_both(&g, &c, &mut r, e, hidden, inter, |r, rows, cols| bf16_matrix(r, rows, cols, 0.05));
    for mma in [false, true] {
        g.mma = mma;
        let tol = if mma { MMA_TOL } else { 1e-4 };
        for m in [1usize, 4, 16] {
            check_moe(&g, &c, &mut r, &cfg, &experts, m, hidden, &format!("moe device bf16 m={m} mma={mma}"), if m == 1 { 1e-4 } else { tol });
        }
        check_moe_favouring(&g, &c, &mut r, &cfg, &experts, 40, hidden, &format!("moe device bf16 m=40 favoured mma={mma}"), tol, &[0, 1, 2]);
    }
    // fp8 experts at Kimi-K2 widths (hidden 7168, inter 2048), 8 of 24 experts, no groups;
    // m = 1, 3, 20 and 40 take the weight-streaming kernels, m = 64 (21 tokens per expert) the
    // grouped GEMM over the device plan (with tensor cores).
    let (hidden, inter, e) = (7168, 2048, 24);
    let cfg = RouterConfig { n_experts: e, top_k: 8, n_group: 1, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 2.827 };
    let experts = experts_on_both(&g, &c, &mut r, e, hidden, inter, fp8_matrix);
    for mma in [false, true] {
        g.mma = mma;
        let tol = if mma { MMA_TOL } else { 1e-4 };
        for (m, tol) in [(1usize, 1e-4), (3, tol), (20, tol), (40, GEMM_TOL), (64, tol)] {
            if m == 64 && !mma {
                continue; // without tensor cores: host routing and bf16 copies (moe_expert_subsets)
            }
            check_moe(&g, &c, &mut r, &cfg, &experts, m, hidden, &format!("moe fp8 m={m} mma={mma}"), tol);
        }
    }
}

/// MoE blocks whose shared experts come in chunks as wide as a routed expert
/// (`Backend::moe_block`): decode-sized batches run the chunks with the routed experts (one
/// entry per expert, CUDA-core passes, tensor cores), prefill-sized ones (the grouped GEMM)
/// apart through cuBLAS; each also with the fusion off; bf16 (two chunks, as Moonlight's) and fp8
/// at Kimi-K2 widths (one chunk), a whole layer and an expert-parallel rank.
#[test]
fn moe_block_shared_chunks_match_cpu() {
    let Some(mut g) = gpu() else { return };
    let c = CpuBackend::new();
    let mut r = Rng(29);
    let has_mma = g.mma;
    for fp8 in [false, true] {
        let (hidden, inter, e, chunks) = if fp8 { (7168, 2048, 16, 1) } else { (1024, 352, 16, 2) };
        let cfg = RouterConfig { n_experts: e, top_k: 4, n_group: 1, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 2.5 };
        let (mut eg, mut ec) = if fp8 {
            experts_on_both(&g, &c, &mut r, e + chunks, hidden, inter, fp8_matrix)
        } else {
            experts_on_both(&g, &c, &mut r, e + chunks, hidden, inter, |r, rows, cols| bf16_matrix(r, rows, cols, 0.05))
        };
        let (sg, sc) = (eg.split_off(e), ec.split_off(e));
        for (mma, m) in [(true, 1usize), (false, 5), (true, 5), (true, 40), (true, 300)] {
            g.mma = mma && has_mma;
            // Prefill-sized: the shared chunks through cuBLAS (fp8 via bf16 copies).
            let tol = rows_tol(m, fp8);
            for (first, held) in [(0, e), (4, 8)] {
                let (x, logits, bias) = (r.vec(m * hidden, 1.0), r.vec(m * e, 3.0), r.vec(e, 0.3));
                let (xg, lg, bg) = (g.upload(&x).unwrap(), g.upload(&logits).unwrap(), g.upload(&bias).unwrap());
                let want = c.moe_block(&x, &logits, &bias, &cfg, &ec[first..first + held], first, &sc).unwrap();
                for fused in [true, false] {
                    g.moe_shared_fused = if fused { usize::MAX } else { 0 };
                    let got = g.download(&g.moe_block(&xg, &lg, &bg, &cfg, &eg[first..first + held], first, &sg).unwrap()).unwrap();
                    check(&format!("moe_block fp8={fp8} m={m} mma={mma} experts {first}..{} + {chunks} shared, fused={fused}", first + held), &got, &want, tol);
                }
            }
        }
        (g.mma, g.moe_shared_fused) = (has_mma, usize::MAX);
    }
}

/// The MoE combine with the residual add and the next norm in its launch
/// (`Backend::moe_block_routed_add_norm`, `moe_combine_add_rms_norm`) at Moonlight's and Kimi-K2's
/// widths (2048 and 7168: a block of 256 and of 896 threads), for one and three tokens: the
/// same bits as the block and `add_rms_norm` apart, residual included, and the CPU's result.
/// (Round 30: the first version took 128 registers a thread and failed to launch at 7168.)
#[test]
fn moe_combine_norm_takes_wide_rows() {
    let Some(mut g) = gpu() else { return };
    let c = CpuBackend::new();
    let mut r = Rng(41);
    let e = 8;
    let cfg = RouterConfig { n_experts: e, top_k: 4, n_group: 1, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 2.5 };
    for hidden in [2048usize, 7168] {
        let (mut eg, mut ec) = experts_on_both(&g, &c, &mut r, e + 1, hidden, 64, |r, rows, cols| bf16_matrix(r, rows, cols, 0.05));
        let (sg, sc) = (eg.split_off(e), ec.split_off(e));
        let router = HostMatrix::from_f32("model.layers.1.mlp.gate.weight", e, hidden, &r.vec(e * hidden, 0.05));
        let (rg, rc) = (g.upload_matrix(&router).unwrap(), c.upload_matrix(&router).unwrap());
        let (bias, nw) = (r.vec(e, 0.3), r.vec(hidden, 1.0));
        let (bg, nwg) = (g.upload(&bias).unwrap(), g.upload(&nw).unwrap());
        for m in [1usize, 3] {
            let (x, res) = (r.vec(m * hidden, 1.0), r.vec(m * hidden, 2.0));
            let xg = g.upload(&x).unwrap();
            let mut want_res = res.clone();
            let want = c.moe_block_routed_add_norm(&x, &rc, &bias, &cfg, (&ec, 0), &sc, (&mut want_res, hidden, &nw, 1e-5)).unwrap();
            let mut outs = vec![];
            for fused in [true, false] {
                g.moe_combine_norm = fused;
                let mut resg = g.upload(&res).unwrap();
                let got = g.moe_block_routed_add_norm(&xg, &rg, &bg, &cfg, (&eg, 0), &sg, (&mut resg, hidden, &nwg, 1e-5)).unwrap();
                let (got, got_res) = (g.download(&got).unwrap(), g.download(&resg).unwrap());
                let name = format!("moe_block_routed_add_norm hidden {hidden} m={m} in the combine {fused}");
                check(&name, &got, &want, 1e-3);
                check(&format!("{name}: residual"), &got_res, &want_res, 1e-4);
                outs.push((got, got_res));
            }
            assert!(outs[0] == outs[1], "hidden {hidden} m={m}: the combine's add and norm must give add_rms_norm's bits");
        }
    }
    g.moe_combine_norm = true;
}

/// A single token's routing in the experts' gate|up launch (`moe_gate_up_route_*`: every routed
/// block picks the experts itself, the first writes the routing and the plan) at the routing
/// shapes of Moonlight (64 experts, top 6, two shared chunks), Kimi-K2 (384, top 8, one chunk) and
/// DeepSeek-V3 (256, top 8 of 4 of 8 groups), bf16 and fp8 experts, shared chunks with the routed
/// experts and apart, a whole layer and an expert-parallel rank: the bits of `moe_route_plan`'s
/// launch and then the experts', and the CPU's result.
#[test]
fn routing_runs_in_the_experts_launch() {
    let Some(mut g) = gpu() else { return };
    let c = CpuBackend::new();
    let mut r = Rng(47);
    let (hidden, inter) = (1024usize, 128usize);
    let shapes = [(64usize, 6usize, 1usize, 1usize, 2usize), (384, 8, 1, 1, 1), (256, 8, 8, 4, 1)];
    for (fp8, &(e, k, groups, topk_group, chunks)) in [false, true].into_iter().flat_map(|f| shapes.iter().map(move |s| (f, s))) {
        let make = |r: &mut Rng, rows, cols| if fp8 { fp8_matrix(r, rows, cols) } else { bf16_matrix(r, rows, cols, 0.05) };
        let (mut eg, mut ec) = experts_on_both(&g, &c, &mut r, e + chunks, hidden, inter, make);
        let (sg, sc) = (eg.split_off(e), ec.split_off(e));
        let cfg = RouterConfig { n_experts: e, top_k: k, n_group: groups, topk_group, norm_topk_prob: true, routed_scaling_factor: 2.5 };
        let router = HostMatrix::from_f32("model.layers.1.mlp.gate.weight", e, hidden, &r.vec(e * hidden, 0.05));
        let (rg, rc) = (g.upload_matrix(&router).unwrap(), c.upload_matrix(&router).unwrap());
        let bias = r.vec(e, 0.3);
        let bg = g.upload(&bias).unwrap();
        let x = r.vec(hidden, 1.0);
        let xg = g.upload(&x).unwrap();
        for (first, held) in [(0, e), (e / 4, e / 2)] {
            for shared_fused in [usize::MAX, 0] {
                g.moe_shared_fused = shared_fused;
                let want = c.moe_block_routed(&x, &rc, &bias, &cfg, &ec[first..first + held], first, &sc).unwrap();
                let mut outs = vec![];
                for fused in [true, false] {
                    g.moe_route_fused = if fused { usize::MAX } else { 0 };
                    let got = g.download(&g.moe_block_routed(&xg, &rg, &bg, &cfg, &eg[first..first + held], first, &sg).unwrap()).unwrap();
                    let name = format!("fp8={fp8} {e} experts top {k} ({groups} groups) {first}..{} shared with the routed {shared_fused}, routing in gate|up {fused}", first + held);
                    check(&name, &got, &want, MMA_TOL);
                    outs.push(got);
                }
                assert!(outs[0] == outs[1], "fp8={fp8} {e} experts {first}..: the routing in the experts' launch must give the routing launch's bits");
            }
        }
    }
    (g.moe_route_fused, g.moe_shared_fused) = (64, 8);
}

/// The router of a single token with its rows loaded before the wait (`gemv_f32_pre_t1`) at
/// Moonlight's, DeepSeek-V3's and Kimi-K2's shapes (64 × 2048, 256 × 7168, 384 × 7168: one pass
/// and four), and a row count that leaves a block half empty: gemv_f32_t1's bits, the CPU's values.
#[test]
fn router_rows_load_before_the_wait() {
    let Some(mut g) = gpu() else { return };
    let c = CpuBackend::new();
    let mut r = Rng(43);
    for (rows, cols) in [(64usize, 2048usize), (256, 7168), (384, 7168), (7, 512)] {
        let router = HostMatrix::from_f32("model.layers.1.mlp.gate.weight", rows, cols, &r.vec(rows * cols, 0.05));
        let (wg, wc) = (g.upload_matrix(&router).unwrap(), c.upload_matrix(&router).unwrap());
        let x = r.vec(cols, 1.0);
        let xg = g.upload(&x).unwrap();
        let want = c.linear(&x, &wc).unwrap();
        let mut outs = vec![];
        for pre in [true, false] {
            g.router_pre = pre;
            let got = g.download(&g.linear(&xg, &wg).unwrap()).unwrap();
            check(&format!("router {rows}x{cols}, rows before the wait {pre}"), &got, &want, 1e-4);
            outs.push(got);
        }
        assert!(outs[0] == outs[1], "{rows}x{cols}: the router's rows loaded before the wait must give gemv_f32_t1's bits");
    }
    g.router_pre = false;
}

/// An expert-parallel rank's MoE (`moe_local`, experts `first..first + held`) against the CPU's,
/// on the device path (routing over every expert, only the held experts' pairs computed and
/// combined: m = 1, 5, 24, mma on and off; m = 300 through the grouped GEMM) and host routing
/// (m = 300 with that GEMM off); the ranks' outputs add up to the whole layer's. bf16 and fp8
/// experts.
#[test]
fn moe_expert_subsets_match_cpu() {
    let Some(mut g) = gpu() else { return };
    let c = CpuBackend::new();
    let mut r = Rng(17);
    for fp8 in [false, true] {
        let (hidden, inter, e) = if fp8 { (1024, 256, 16) } else { (1024, 352, 16) };
        let cfg = RouterConfig { n_experts: e, top_k: 4, n_group: 1, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 2.5 };
        let experts =
            if fp8 { experts_on_both(&g, &c, &mut r, e, hidden, inter, fp8_matrix) } else { experts_on_both(&g, &c, &mut r, e, hidden, inter, |r, rows, cols| bf16_matrix(r, rows, cols, 0.05)) };
        for (mma, m, gemm) in [(true, 1usize, 16), (true, 5, 16), (true, 24, 16), (false, 5, 16), (true, 300, 16), (true, 300, 0)] {
            g.mma = mma;
            g.moe_gemm_tokens = gemm;
            let x = r.vec(m * hidden, 1.0);
            let logits = r.vec(m * e, 3.0);
            let bias = r.vec(e, 0.3);
            let (xg, lg, bg) = (g.upload(&x).unwrap(), g.upload(&logits).unwrap(), g.upload(&bias).unwrap());
            let whole = c.moe(&x, &logits, &bias, &cfg, &experts.1, None).unwrap();
            let mut sum = vec![0f32; m * hidden];
            // Host routing dequantizes fp8 experts to bf16 for cuBLAS (FP8_COPY_TOL).
            let tol = if m <= 100 || gemm > 0 {
                MMA_TOL
            } else if fp8 {
                FP8_COPY_TOL
            } else {
                GEMM_TOL
            };
            for (first, held) in [(0, 8), (8, 8)] {
                let got = g.download(&g.moe_local(&xg, &lg, &bg, &cfg, &experts.0[first..first + held], first, None).unwrap()).unwrap();
                let want = c.moe_local(&x, &logits, &bias, &cfg, &experts.1[first..first + held], first, None).unwrap();
                check(&format!("moe_local fp8={fp8} experts {first}..{} m={m} mma={mma} gemm_tokens={gemm}", first + held), &got, &want, tol);
                sum.iter_mut().zip(&got).for_each(|(s, v)| *s += v);
            }
            check(&format!("moe_local fp8={fp8} m={m}: ranks add up to the whole layer"), &sum, &whole, tol);
        }
    }
}

/// The grouped expert GEMM on Hopper's warpgroup tensor cores (`kernels/moe_wgmma.cu`: sm_90a,
/// bf16 experts whose hidden and intermediate sizes are multiples of 64) against the CPU and
/// against `moe_gemm.cu`'s mma.sync kernels on the same inputs: batches of ~26 to ~240 entries
/// per expert, one expert favoured by every token (several tiles), shared-expert adds on even
/// batches; two activation parts outside a step, so f32-grade.
#[test]
fn moe_wgmma_matches_cpu_and_mma_sync() {
    let Some(mut g) = gpu() else { return };
    if !g.wgmma {
        eprintln!("SKIPPED: {} has no wgmma (sm_90a only)", g.arch);
        return;
    }
    let c = CpuBackend::new();
    let mut r = Rng(41);
    let (hidden, inter, e) = (1024, 384, 16);
    let cfg = RouterConfig { n_experts: e, top_k: 6, n_group: 1, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 2.446 };
    let experts = experts_on_both(&g, &c, &mut r, e, hidden, inter, |r, rows, cols| bf16_matrix(r, rows, cols, 0.05));
    for (m, favoured) in [(70usize, &[][..]), (299, &[5][..]), (640, &[][..])] {
        let (x, logits, bias, shared) = moe_inputs(&mut r, e, m, hidden, favoured);
        let want = c.moe(&x, &logits, &bias, &cfg, &experts.1, shared.as_ref()).unwrap();
        let (xg, lg, bg, sg) = (g.upload(&x).unwrap(), g.upload(&logits).unwrap(), g.upload(&bias).unwrap(), shared.as_ref().map(|s| g.upload(s).unwrap()));
        let mut got = vec![];
        for wg in [true, false] {
            g.wgmma = wg;
            got.push(g.download(&g.moe(&xg, &lg, &bg, &cfg, &experts.0, sg.as_ref()).unwrap()).unwrap());
            check(&format!("moe m={m} wgmma={wg}"), &got[got.len() - 1], &want, MMA_TOL);
        }
        check(&format!("moe m={m} wgmma vs mma.sync"), &got[0], &got[1], 1e-5);
        g.wgmma = true;
    }
}

/// Inside a step (`run_step`), prompt rows of a long run take one bf16 activation part and the
/// step's decode rows and `exact_rows` two (`precision.rs`): four decode rows before a 296-row
/// prompt run, through the grouped expert GEMM (its tiles decide from per-token flags; intermediate
/// size 352 on moe_gemm.cu's mma.sync kernels, 384 on moe_wgmma.cu's where sm_90a has them) and a
/// cuBLAS linear — the decode rows f32-grade, the run's rows bf16-grade and visibly so, except
/// its last four when they are exact rows (drafts); with `prefill_parts = 2` every row f32-grade.
#[test]
fn prompt_rows_take_one_part_inside_a_step() {
    use weft_backend::{AttnRow, KvDtype, KvLayout, StepBatch};
    let Some(mut g) = gpu() else { return };
    let c = CpuBackend::new();
    let mut r = Rng(37);
    let (hidden, e, m) = (1024, 32, 300);
    // 352: moe_gemm.cu's mma.sync kernels; 384: moe_wgmma.cu's on sm_90a.
    for inter in [352, 384] {
        let cfg = RouterConfig { n_experts: e, top_k: 6, n_group: 4, topk_group: 2, norm_topk_prob: true, routed_scaling_factor: 2.446 };
        let experts = experts_on_both(&g, &c, &mut r, e, hidden, inter, |r, rows, cols| bf16_matrix(r, rows, cols, 0.05));
        let w = bf16_matrix(&mut r, 512, hidden, 0.05);
        let (wg, wc) = (g.upload_matrix(&w).unwrap(), c.upload_matrix(&w).unwrap());
        let (x, logits, bias) = (r.vec(m * hidden, 1.0), r.vec(m * e, 3.0), r.vec(e, 0.3));
        let want_moe = c.moe(&x, &logits, &bias, &cfg, &experts.1, None).unwrap();
        let want_lin = c.linear(&x, &wc).unwrap();
        let (xg, lg, bg) = (g.upload(&x).unwrap(), g.upload(&logits).unwrap(), g.upload(&bias).unwrap());
        // Four decode rows (one table each), then one sequence's 296 prompt rows.
        let tables: Vec<Vec<u32>> = (0..5u32).map(|i| vec![i]).collect();
        let mut rows: Vec<AttnRow<'_>> = (0..4).map(|i| AttnRow { block_table: &tables[i], ctx_len: 10 + i }).collect();
        rows.extend((1..=296).map(|n| AttnRow { block_table: &tables[4], ctx_len: n }));
        let zeros = vec![0u32; m];
        let mut pool = g.alloc_kv_pool(KvLayout { layers: 1, num_pages: 8, page_size: 64, latent_dim: 512, rope_dim: 64, dtype: KvDtype::Bf16 }).unwrap();
        let mut alone: Option<(Vec<f32>, Vec<f32>)> = None; // one part, no exact rows
        for (parts, exact) in [(1, &[][..]), (1, &[(296u32, 300u32)][..]), (2, &[][..])] {
            g.prefill_parts = parts;
            let step = StepBatch { tokens: &zeros, positions: &zeros, slots: &zeros, attn: &rows, exact_rows: exact };
            let mut moe = None;
            let mut run = |_: &mut weft_cuda::CudaKvPool| {
                moe = Some(g.moe(&xg, &lg, &bg, &cfg, &experts.0, None)?);
                g.linear(&xg, &wg)
            };
            let lin = g.download(&g.run_step(&mut pool, &step, m * 512, &mut run).unwrap()).unwrap();
            let moe = g.download(&moe.unwrap()).unwrap();
            let one_end = if exact.is_empty() { m } else { 296 };
            let e = |rows: std::ops::Range<usize>| [rows_err("linear", &lin, &want_lin, 512, rows.clone()), rows_err("moe", &moe, &want_moe, hidden, rows)];
            let (dec, run, tail) = (e(0..4), e(4..one_end), if exact.is_empty() { [0.0; 2] } else { e(296..m) });
            eprintln!("  inter {inter}, prefill_parts {parts}, exact {exact:?}: linear / moe — decode rows {dec:?}, run rows {run:?}, exact tail {tail:?}");
            assert!(dec.iter().chain(&tail).all(|&x| x <= MMA_TOL), "decode and exact rows must stay f32-grade");
            if parts == 1 {
                assert!(run.iter().all(|&x| x > MMA_TOL && x < 1e-2), "the run's rows take one bf16 part: {run:?}");
                // Exact rows change no other row's bits, also where they share an expert's tile.
                match &alone {
                    None => alone = Some((lin.clone(), moe.clone())),
                    Some((l, o)) => {
                        let same = |a: &[f32], b: &[f32], w: usize| (4..296).filter(|&i| a[i * w..(i + 1) * w] != b[i * w..(i + 1) * w]).count();
                        assert_eq!((same(&lin, l, 512), same(&moe, o, hidden)), (0, 0), "prompt rows whose bits changed with exact rows after them (linear, moe)");
                    }
                }
            } else {
                assert!(run.iter().all(|&x| x <= MMA_TOL), "every row f32-grade: {run:?}");
            }
        }
        g.prefill_parts = 1;
    }
}
