//! The MoE ops on the HIP build's paths (see main.rs): shared chunks with the routed experts,
//! the router (before its wait, and in the routing's launch), the combine with the next norm.

use super::*;
/// An MoE block whose shared experts come in chunks as wide as a routed expert
/// (`Backend::moe_block`): on the device path the chunks run with the routed experts, as
/// experts every token takes with weight 1 (one entry per expert for a single token, CUDA-core
/// passes for five), and apart with that off; 70 tokens route on the host and run the chunks
/// on the GEMM path (the activations split once for all chunks, the down products accumulated
/// into one output); bf16 and fp8 experts, a whole layer and an expert-parallel rank; against
/// the CPU's (chunks apart, summed into the combine).
#[test]
fn moe_block_runs_shared_chunks_with_the_routed_experts() {
    use weft_backend::{ExpertWeights, RouterConfig};
    let (mut g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(23);
    let (hidden, inter, e) = (256, 128, 8);
    let cfg = RouterConfig { n_experts: e, top_k: 3, n_group: 1, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 2.5 };
    for fp8 in [false, true] {
        let mut seed = 100;
        let mut make = |r: &mut Rng, rows: usize, cols: usize| {
            seed += 1;
            if fp8 {
                weft_backend::dummy::DummySpec::new("w_fp8", vec![(seed, rows)], cols, 0.08, Some((128, 128))).host()
            } else {
                bf16_matrix(r, "w", rows, cols)
            }
        };
        let (mut eg, mut ec) = (vec![], vec![]);
        for _ in 0..e + 2 {
            let (gu, dn) = (make(&mut r, 2 * inter, hidden), make(&mut r, hidden, inter));
            eg.push(ExpertWeights { gate_up: g.upload_matrix(&gu).unwrap(), down: g.upload_matrix(&dn).unwrap(), inter });
            ec.push(ExpertWeights { gate_up: c.upload_matrix(&gu).unwrap(), down: c.upload_matrix(&dn).unwrap(), inter });
        }
        // The last two are the shared experts' chunks.
        let (sg, sc) = (eg.split_off(e), ec.split_off(e));
        for m in [1usize, 5, 70] {
            // The GEMM path multiplies fp8 weights as bf16 copies.
            let tol = if m == 70 && fp8 { 5e-3 } else { 1e-4 };
            for (first, held) in [(0, e), (2, 4)] {
                let (x, logits, bias) = (r.vec(m * hidden, 1.0), r.vec(m * e, 3.0), r.vec(e, 0.3));
                let (xg, lg, bg) = (g.upload(&x).unwrap(), g.upload(&logits).unwrap(), g.upload(&bias).unwrap());
                let want = c.moe_block(&x, &logits, &bias, &cfg, &ec[first..first + held], first, &sc).unwrap();
                let mut outs = vec![];
                for fused in [true, false] {
                    g.moe_shared_fused = if fused { usize::MAX } else { 0 };
                    let got = g.download(&g.moe_block(&xg, &lg, &bg, &cfg, &eg[first..first + held], first, &sg).unwrap()).unwrap();
                    check(&format!("moe_block fp8={fp8} m={m} experts {first}..{} + 2 shared chunks, fused={fused}", first + held), &got, &want, tol);
                    outs.push(got);
                }
                assert!(m == 70 || outs[0] != outs[1], "fused and apart rounded alike: the fused path was not taken");
                // One chunk, as a DeepSeek-V3 / Kimi-K2 shared expert.
                let want = c.moe_block(&x, &logits, &bias, &cfg, &ec[first..first + held], first, &sc[..1]).unwrap();
                g.moe_shared_fused = usize::MAX;
                let got = g.download(&g.moe_block(&xg, &lg, &bg, &cfg, &eg[first..first + held], first, &sg[..1]).unwrap()).unwrap();
                check(&format!("moe_block fp8={fp8} m={m} experts {first}..{} + 1 shared chunk, fused", first + held), &got, &want, tol);
            }
        }
    }
    // A chunk whose width does not match the activations: an error on the GEMM path, not a read
    // past its buffer.
    let mut r = Rng(47);
    let chunk = |r: &mut Rng, cols: usize| ExpertWeights {
        gate_up: g.upload_matrix(&bf16_matrix(r, "gu", 2 * inter, cols)).unwrap(),
        down: g.upload_matrix(&bf16_matrix(r, "dn", hidden, inter)).unwrap(),
        inter,
    };
    let bad = vec![chunk(&mut r, hidden), chunk(&mut r, hidden + 32)];
    let m = 70;
    let err = g.shared_experts(&g.upload(&r.vec(m * hidden, 1.0)).unwrap(), &bad).err().expect("mismatched chunk");
    assert!(err.to_string().contains("are not rows of"), "{err}");
}

/// Sixteen bf16 experts (256 wide, 64 intermediate) and two shared chunks, on the mock and the
/// CPU, and an f32 router of a published name: (device experts, CPU experts, device chunks,
/// CPU chunks, device router, CPU router).
#[allow(clippy::type_complexity)]
fn moe_fixture(
    g: &CudaBackend,
    c: &CpuBackend,
    r: &mut Rng,
) -> (
    Vec<weft_backend::ExpertWeights<weft_cuda::CudaMatrix>>,
    Vec<weft_backend::ExpertWeights<<CpuBackend as Backend>::Matrix>>,
    Vec<weft_backend::ExpertWeights<weft_cuda::CudaMatrix>>,
    Vec<weft_backend::ExpertWeights<<CpuBackend as Backend>::Matrix>>,
    weft_cuda::CudaMatrix,
    <CpuBackend as Backend>::Matrix,
) {
    use weft_backend::ExpertWeights;
    let (hidden, inter, e) = (256, 64, 16);
    let (mut eg, mut ec) = (vec![], vec![]);
    for _ in 0..e + 2 {
        let (gu, dn) = (bf16_matrix(r, "w", 2 * inter, hidden), bf16_matrix(r, "w", hidden, inter));
        eg.push(ExpertWeights { gate_up: g.upload_matrix(&gu).unwrap(), down: g.upload_matrix(&dn).unwrap(), inter });
        ec.push(ExpertWeights { gate_up: c.upload_matrix(&gu).unwrap(), down: c.upload_matrix(&dn).unwrap(), inter });
    }
    let (sg, sc) = (eg.split_off(e), ec.split_off(e));
    // Router rows of a published name: kept (and multiplied) in f32.
    let router = HostMatrix::from_f32("model.layers.1.mlp.gate.weight", e, hidden, &r.vec(e * hidden, 0.2));
    let (rg, rc) = (g.upload_matrix(&router).unwrap(), c.upload_matrix(&router).unwrap());
    (eg, ec, sg, sc, rg, rc)
}

/// The router's product in the routing's launch (`Backend::moe_block_routed`,
/// `moe_router_route_plan`: a sub-group a router row, the last block routing each token in
/// turn and planning): for one and three tokens, plain and group-limited routing, a whole layer
/// and an expert-parallel rank, shared chunks with the routed experts and apart — the same bits
/// as the router's GEMV and then the routing, and the CPU's result; with a single token's down
/// products and combine in one launch (`moe_down_combine_*`) and apart, and a single token's
/// routing in the experts' gate|up launch (`moe_gate_up_route_*`), also the same bits.
#[test]
fn moe_router_runs_in_the_routing_launch() {
    use weft_backend::RouterConfig;
    let (mut g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(29);
    let (hidden, e) = (256, 16);
    let (eg, ec, sg, sc, rg, rc) = moe_fixture(&g, &c, &mut r);
    let bias = r.vec(e, 0.3);
    let bg = g.upload(&bias).unwrap();
    let plain = RouterConfig { n_experts: e, top_k: 4, n_group: 1, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 2.5 };
    let grouped = RouterConfig { n_group: 4, topk_group: 2, norm_topk_prob: false, ..plain.clone() };
    for cfg in [&plain, &grouped] {
        for m in [1usize, 3] {
            let x = r.vec(m * hidden, 1.0);
            let xg = g.upload(&x).unwrap();
            for (first, held) in [(0, e), (4, 8)] {
                for (shared_fused, chunks) in [(usize::MAX, 2), (0, 2), (usize::MAX, 0)] {
                    let want = c.moe_block_routed(&x, &rc, &bias, cfg, &ec[first..first + held], first, &sc[..chunks]).unwrap();
                    g.moe_shared_fused = shared_fused;
                    let mut outs = vec![];
                    for (fused, down_combine, route_fused) in [(0, false, false), (usize::MAX, false, false), (usize::MAX, true, false), (0, false, true), (0, true, true)] {
                        (g.moe_router_fused, g.moe_down_combine, g.moe_route_fused) = (fused, down_combine, if route_fused { usize::MAX } else { 0 });
                        assert_eq!(g.router_fuses(&rg, cfg, &eg[first..first + held], m), fused > 0);
                        let got = g.download(&g.moe_block_routed(&xg, &rg, &bg, cfg, &eg[first..first + held], first, &sg[..chunks]).unwrap()).unwrap();
                        let name = format!(
                            "moe_block_routed m={m} groups={} experts {first}..{} chunks {chunks} with the routed {shared_fused}, router fused {fused}, down + combine {down_combine}, routing in gate|up {route_fused}",
                            cfg.n_group,
                            first + held
                        );
                        check(&name, &got, &want, 1e-4);
                        outs.push(got);
                    }
                    // (A single token's down products and combine in one launch sum in moe_combine's order.)
                    assert!(outs.iter().all(|o| *o == outs[0]), "the router in the routing's launch and the routing in the experts' must give the launches apart's bits");
                }
            }
        }
    }
    (g.moe_router_fused, g.moe_down_combine, g.moe_shared_fused, g.moe_route_fused) = (0, false, 8, 64);
}

/// An MoE block added into the residual stream and normed in the combine's launch
/// (`Backend::moe_block_routed_add_norm`, `moe_combine_add_rms_norm`): for one and three tokens,
/// a whole layer and an expert-parallel rank, shared chunks with the routed experts and apart —
/// the same bits (normed rows and residual) as `moe_block_routed` and then `add_rms_norm`, and
/// the CPU's result; a norm of the wrong width is an error, as `add_rms_norm`'s.
#[test]
fn moe_combine_adds_and_norms_in_one_launch() {
    use weft_backend::RouterConfig;
    let (mut g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(31);
    let (hidden, e) = (256, 16);
    let (eg, ec, sg, sc, rg, rc) = moe_fixture(&g, &c, &mut r);
    let (bias, nw) = (r.vec(e, 0.3), r.vec(hidden, 1.0));
    let (bg, nwg) = (g.upload(&bias).unwrap(), g.upload(&nw).unwrap());
    let cfg = RouterConfig { n_experts: e, top_k: 4, n_group: 1, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 2.5 };
    for m in [1usize, 3] {
        let (x, res) = (r.vec(m * hidden, 1.0), r.vec(m * hidden, 2.0));
        let xg = g.upload(&x).unwrap();
        for (first, held) in [(0, e), (4, 8)] {
            for (shared_fused, chunks) in [(usize::MAX, 2), (0, 2), (usize::MAX, 0)] {
                g.moe_shared_fused = shared_fused;
                let (ex, sh) = ((&ec[first..first + held], first), &sc[..chunks]);
                let mut want_res = res.clone();
                let want = c.moe_block_routed_add_norm(&x, &rc, &bias, &cfg, ex, sh, (&mut want_res, hidden, &nw, 1e-5)).unwrap();
                let mut outs = vec![];
                for fused in [true, false] {
                    g.moe_combine_norm = fused;
                    let mut rg_ = g.upload(&res).unwrap();
                    let got = g.moe_block_routed_add_norm(&xg, &rg, &bg, &cfg, (&eg[first..first + held], first), &sg[..chunks], (&mut rg_, hidden, &nwg, 1e-5)).unwrap();
                    let (got, got_res) = (g.download(&got).unwrap(), g.download(&rg_).unwrap());
                    let name = format!("moe_block_routed_add_norm m={m} experts {first}..{} chunks {chunks} with the routed {shared_fused}, in the combine {fused}", first + held);
                    check(&name, &got, &want, 1e-4);
                    check(&format!("{name}: residual"), &got_res, &want_res, 1e-5);
                    outs.push((got, got_res));
                }
                assert!(outs[0] == outs[1], "the combine's add and norm must give add_rms_norm's bits (m={m}, chunks {chunks})");
            }
        }
        // A norm weight for rows of another width: the same error as add_rms_norm's.
        let mut rg_ = g.upload(&res).unwrap();
        let err = g.moe_block_routed_add_norm(&xg, &rg, &bg, &cfg, (&eg, 0), &sg, (&mut rg_, hidden + 8, &nwg, 1e-5)).err().expect("rows of another width");
        assert!(err.to_string().contains("add_rms_norm"), "{err}");
    }
    (g.moe_shared_fused, g.moe_combine_norm) = (8, true);
}

/// The router of a single token with its rows loaded before the kernel's wait
/// (`gemv_f32_pre_t1`, two sub-groups a block): rows that leave a block half empty, rows of
/// one pass and of two (a 64-lane sub-group loads 4,096 values a pass) — gemv_f32_t1's bits,
/// and the CPU's values; three tokens take gemv_f32_t8 either way.
#[test]
fn router_rows_load_before_the_wait() {
    let (mut g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(37);
    for (rows, cols) in [(13, 256), (64, 2048), (5, 4096 + 256)] {
        let router = HostMatrix::from_f32("model.layers.1.mlp.gate.weight", rows, cols, &r.vec(rows * cols, 0.2));
        let (wg, wc) = (g.upload_matrix(&router).unwrap(), c.upload_matrix(&router).unwrap());
        for m in [1usize, 3] {
            let x = r.vec(m * cols, 1.0);
            let xg = g.upload(&x).unwrap();
            let want = c.linear(&x, &wc).unwrap();
            let mut outs = vec![];
            for pre in [true, false] {
                g.router_pre = pre;
                let got = g.download(&g.linear(&xg, &wg).unwrap()).unwrap();
                check(&format!("router {rows}x{cols}, {m} tokens, rows before the wait {pre}"), &got, &want, 1e-5);
                outs.push(got);
            }
            assert!(outs[0] == outs[1], "the router's rows loaded before the wait must give gemv_f32_t1's bits ({rows}x{cols})");
        }
    }
    g.router_pre = false;
}
