//! The HIP build's host logic without an AMD GPU (`--no-default-features --features hip-mock`):
//! weft-cuda's backend over weft-hip-driver's mock runtime — device memory in host memory,
//! every copy checked to stay inside its allocation, kernels run by the CPU emulator with
//! 64-lane sub-groups (AMD wavefronts). What this shows: with HIP's sub-group width, launch
//! shapes, argument lists, buffer sizes, the GEMM kernel that stands in for hipBLAS and the
//! paths the HIP build takes (no tensor-core kernels, no step graphs), every op agrees with the
//! CPU reference and the golden fixtures come out as transformers float64 says. What it does
//! not show: that AMD's compiler builds the same arithmetic (tests/hip_compile.rs only checks
//! the sources compile), the real HIP runtime's behaviour, or any speed.
#![cfg(feature = "hip-mock")]

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use weft_backend::cpu::CpuBackend;
use weft_backend::{AttnRow, Backend, HostMatrix, KvDtype, KvLayout, RopeParams, WeightDtype};
use weft_cuda::CudaBackend;

mod moe;

fn mock() -> CudaBackend {
    std::env::set_var("WEFT_CUDA_POISON", "1");
    let be = CudaBackend::new(0).expect("the HIP backend starts on the mock runtime");
    assert_eq!(be.name(), "hip");
    assert_eq!(be.arch, "gfx942");
    assert!(!be.mma, "no tensor-core kernels on HIP");
    be
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

/// A fixture through the HIP build: prompt log-probabilities against transformers float64
/// (worst error returned), greedy tokens equal to the reference's.
fn golden(dir: &Path, all_f32: bool, tokens: usize) -> f64 {
    use weft_model::generate::{generate, GenerateRequest};
    use weft_model::sampling::SamplingParams;
    let mut be = mock();
    be.all_f32 = all_f32;
    let lm = weft_model::LoadedModel::open(dir, be).unwrap();
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let case = &reference["cases"][0];
    let ids = |k: &str| -> Vec<u32> { case[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let (prompt, want) = (ids("prompt_ids"), ids("greedy_ids"));
    let req = GenerateRequest { prompt_ids: prompt.clone(), max_tokens: tokens, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: Some(20), stop_ids: vec![] };
    let out = generate(&lm.model, &req).unwrap();
    let plp = case["prompt_logprobs"].as_array().unwrap();
    let mut worst = 0f64;
    for i in 1..prompt.len() {
        let ours: std::collections::HashMap<u32, f64> = out.prompt_logprobs[i].as_ref().unwrap().iter().copied().collect();
        worst = worst.max((ours[&prompt[i]] - plp[i]["token"].as_f64().unwrap()).abs());
    }
    assert_eq!(out.token_ids[..], want[..tokens], "{}: greedy tokens", dir.display());
    eprintln!(
        "{} through HIP (mock, {}): worst prompt logprob error {worst:.2e} over {} positions, {tokens} greedy tokens equal",
        dir.display(),
        if all_f32 { "f32" } else { "bf16" },
        prompt.len() - 1
    );
    worst
}

/// f32 weights: as tight as the CPU reference (the CUDA f32 test's tolerance).
#[test]
fn golden_fixtures_through_the_hip_build() {
    for name in ["kimi-fp8-partial-blocks", "v3-qlora-yarn-groups"] {
        let worst = golden(&golden_dir().join(name), true, 4);
        assert!(worst < 1e-3, "{name}: worst logprob error {worst}");
    }
}

/// The serving configuration (bf16 and fp8 weights as the checkpoint has them).
#[test]
fn golden_fixture_with_checkpoint_weights() {
    let worst = golden(&golden_dir().join("kimi-fp8-partial-blocks"), false, 4);
    assert!(worst < 5e-2, "worst logprob error {worst}");
}

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

/// The largest difference, where a NaN on either side counts as infinite (`f32::max` would
/// drop it: with poisoned allocations an unwritten output is NaN and must fail).
fn worst_gap(got: &[f32], want: &[f32]) -> f32 {
    got.iter().zip(want).fold(0f32, |m, (a, b)| {
        let d = (a - b).abs();
        if d.is_nan() {
            f32::INFINITY
        } else {
            m.max(d)
        }
    })
}

fn check(op: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{op}: length");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let err = worst_gap(got, want) / scale;
    eprintln!("{op}: rel err {err:.2e}");
    assert!(err <= tol, "{op}: relative error {err} > {tol}");
}

fn bf16_matrix(r: &mut Rng, name: &str, rows: usize, cols: usize) -> HostMatrix<'static> {
    let bytes: Vec<u8> = (0..rows * cols).flat_map(|_| half::bf16::from_f32(r.f() * 0.1).to_bits().to_le_bytes()).collect();
    HostMatrix { name: name.into(), rows, cols, dtype: WeightDtype::Bf16, bytes: Cow::Owned(bytes), scales: None }
}

/// Linears on every path the HIP build has: one row and a few rows (weight streaming with
/// 64-lane sub-groups), past 64 rows (the GEMM kernel in place of hipBLAS, activations in two
/// bf16 parts), fp8 weights with block scales, the f32 router gate, per-head products.
#[test]
fn linears_on_every_hip_path_match_cpu() {
    let (g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(3);
    let (n, k) = (96, 256);
    for (name, w) in [("bf16", bf16_matrix(&mut r, "w", n, k)), ("router f32", bf16_matrix(&mut r, "model.layers.1.mlp.gate.weight", n, k))] {
        let (wg, wc) = (g.upload_matrix(&w).unwrap(), c.upload_matrix(&w).unwrap());
        for m in [1usize, 3, 8, 70] {
            let x = r.vec(m * k, 1.0);
            check(&format!("linear {name} {m} rows"), &g.download(&g.linear(&g.upload(&x).unwrap(), &wg).unwrap()).unwrap(), &c.linear(&x, &wc).unwrap(), 1e-4);
        }
    }
    let spec = weft_backend::dummy::DummySpec::new("w_fp8", vec![(7, 200)], k, 0.06, Some((128, 128)));
    let f = spec.host();
    let (wg, wc) = (g.upload_matrix(&f).unwrap(), c.upload_matrix(&f).unwrap());
    for m in [1usize, 5, 70] {
        let x = r.vec(m * k, 1.0);
        check(&format!("linear fp8 {m} rows"), &g.download(&g.linear(&g.upload(&x).unwrap(), &wg).unwrap()).unwrap(), &c.linear(&x, &wc).unwrap(), 5e-3);
    }
    let (heads, out) = (4, 32);
    let w = bf16_matrix(&mut r, "w_uk", heads * out, k);
    let x = r.vec(3 * heads * k, 1.0);
    let got = g.download(&g.head_linear(&g.upload(&x).unwrap(), heads, &g.upload_matrix(&w).unwrap()).unwrap()).unwrap();
    check("head_linear", &got, &c.head_linear(&x, heads, &c.upload_matrix(&w).unwrap()).unwrap(), 1e-4);
}

/// Two weights on the same rows (`linear_pair`, an attention block's query and latent
/// projections): one launch on the weight-streaming path (bf16, fp8 with different scale grids;
/// row counts that leave partial sub-groups), two linears for mixed kinds; past it (70 rows) the
/// GEMMs share one split of the activations; each output as the CPU's linear.
#[test]
fn linear_pairs_match_two_linears() {
    let (g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(31);
    let k = 256;
    let fp8 = |seed: u64, rows: usize| weft_backend::dummy::DummySpec::new("w_fp8", vec![(seed, rows)], k, 0.06, Some((128, 128))).host();
    let pairs = [("bf16", bf16_matrix(&mut r, "a", 100, k), bf16_matrix(&mut r, "b", 36, k)), ("fp8", fp8(41, 200), fp8(42, 72)), ("mixed", bf16_matrix(&mut r, "a", 64, k), fp8(43, 40))];
    for (name, a, b) in &pairs {
        let (ag, bg, ac, bc) = (g.upload_matrix(a).unwrap(), g.upload_matrix(b).unwrap(), c.upload_matrix(a).unwrap(), c.upload_matrix(b).unwrap());
        for m in [1usize, 3, 70] {
            // 70 rows: cuBLAS's stand-in, x split once for both (fp8 weights as bf16 copies).
            let tol = if m == 70 && *name != "bf16" { 5e-3 } else { 1e-4 };
            assert_eq!(g.gemv_pair_fits(&ag, &bg, m), *name != "mixed" && m < 70, "{name}: one launch for a pair of one kind");
            let x = r.vec(m * k, 1.0);
            let (ya, yb) = g.linear_pair(&g.upload(&x).unwrap(), &ag, &bg).unwrap();
            check(&format!("linear_pair {name} {m} rows, first"), &g.download(&ya).unwrap(), &c.linear(&x, &ac).unwrap(), tol);
            check(&format!("linear_pair {name} {m} rows, second"), &g.download(&yb).unwrap(), &c.linear(&x, &bc).unwrap(), tol);
        }
    }
}

/// Two-part GEMM products whose halves their consumers add (`halves.rs`): a gated MLP's
/// silu · up (f32, and as the down product's bf16 parts for the shared experts, one chunk and
/// two), a query / latent pair added in one launch, an output projection added in the residual's
/// norm (`linear_add_rms_norm`) — at rows that stack (12, 40, 64: cuBLAS's
/// stand-in, every row two parts), bf16 and fp8 (its bf16 copy) weights. The same bits as the
/// ops apart (`halves` off), and the CPU's values; 70 rows (no stacking) too.
#[test]
fn stacked_halves_added_by_their_consumers_equal_the_ops_apart() {
    use weft_backend::ExpertWeights;
    let (mut g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(57);
    let (hidden, inter) = (256, 96);
    let fp8 = |seed: u64, rows: usize, cols: usize| weft_backend::dummy::DummySpec::new("w_fp8", vec![(seed, rows)], cols, 0.06, Some((128, 128))).host();
    for kind in ["bf16", "fp8"] {
        let mut seed = 200;
        let mut make = |r: &mut Rng, rows: usize, cols: usize| {
            seed += 1;
            if kind == "fp8" {
                fp8(seed, rows, cols)
            } else {
                bf16_matrix(r, "w", rows, cols)
            }
        };
        let host: Vec<_> = (0..2).map(|_| (make(&mut r, 2 * inter, hidden), make(&mut r, hidden, inter))).collect();
        let (qa, kv) = (make(&mut r, 192, hidden), make(&mut r, 64, hidden));
        let sg: Vec<_> = host.iter().map(|(gu, dn)| ExpertWeights { gate_up: g.upload_matrix(gu).unwrap(), down: g.upload_matrix(dn).unwrap(), inter }).collect();
        let sc: Vec<_> = host.iter().map(|(gu, dn)| ExpertWeights { gate_up: c.upload_matrix(gu).unwrap(), down: c.upload_matrix(dn).unwrap(), inter }).collect();
        let (qg, kg, qc, kc) = (g.upload_matrix(&qa).unwrap(), g.upload_matrix(&kv).unwrap(), c.upload_matrix(&qa).unwrap(), c.upload_matrix(&kv).unwrap());
        for m in [12usize, 40, 64, 70] {
            let tol = if kind == "fp8" { 5e-3 } else { 1e-4 };
            let x = r.vec(m * hidden, 1.0);
            let xg = g.upload(&x).unwrap();
            let (o, resid, nw) = (r.vec(m * inter, 1.0), r.vec(m * hidden, 1.0), r.vec(hidden, 1.0));
            let (og, nwg) = (g.upload(&o).unwrap(), g.upload(&nw).unwrap());
            let mut runs = vec![];
            for halves in [true, false] {
                g.halves = halves;
                let gated = g.download(&g.gated_up(&xg, &sg[0].gate_up, inter).unwrap()).unwrap();
                let (ya, yb) = g.linear_pair(&xg, &qg, &kg).unwrap();
                let pair = [g.download(&ya).unwrap(), g.download(&yb).unwrap()];
                let one = g.download(&g.shared_experts(&xg, &sg[..1]).unwrap().unwrap()).unwrap();
                let two = g.download(&g.shared_experts(&xg, &sg).unwrap().unwrap()).unwrap();
                // An output projection (the shared down's shape, inter -> hidden)
                // added into a residual and normed.
                let mut res = g.upload(&resid).unwrap();
                let normed = g.download(&g.linear_add_rms_norm(&og, &sg[0].down, &mut res, hidden, &nwg, 1e-5).unwrap()).unwrap();
                runs.push((gated, pair, one, two, [normed, g.download(&res).unwrap()]));
            }
            let what = format!("{kind}, {m} rows");
            let ((gated, pair, one, two, normed), apart) = (&runs[0], &runs[1]);
            assert!(gated == &apart.0 && pair == &apart.1 && one == &apart.2 && two == &apart.3 && normed == &apart.4, "{what}: halves added by their consumers differ from the ops apart");
            let mut res_c = resid.clone();
            let want = c.linear_add_rms_norm(&o, &sc[0].down, &mut res_c, hidden, &nw, 1e-5).unwrap();
            check(&format!("linear_add_rms_norm {what}, normed"), &normed[0], &want, tol);
            check(&format!("linear_add_rms_norm {what}, residual"), &normed[1], &res_c, tol);
            check(&format!("gated_up {what}"), gated, &c.gated_up(&x, &sc[0].gate_up, inter).unwrap(), tol);
            check(&format!("linear_pair {what}, first"), &pair[0], &c.linear(&x, &qc).unwrap(), tol);
            check(&format!("linear_pair {what}, second"), &pair[1], &c.linear(&x, &kc).unwrap(), tol);
            check(&format!("shared_experts {what}, one chunk"), one, &c.shared_experts(&x, &sc[..1]).unwrap().unwrap(), tol);
            check(&format!("shared_experts {what}, two chunks"), two, &c.shared_experts(&x, &sc).unwrap().unwrap(), tol);
        }
    }
}

/// MLA decode attention for the head counts Kimi/DeepSeek leave per GPU under tensor
/// parallelism (and 20: two groups of 10), one decode row and three query rows of one sequence
/// (verification); over an f32 and a bf16 latent cache; each also through the single-pass
/// kernel that shapes outside the split kernel take (`slow_paths`).
#[test]
fn mla_attention_for_8_12_16_20_heads() {
    let (mut g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(5);
    let (rd, latent, n) = (64, 512, 300usize);
    for dtype in [KvDtype::F32, KvDtype::Bf16] {
        let layout = KvLayout { layers: 1, num_pages: 8, page_size: 64, latent_dim: latent, rope_dim: rd, dtype };
        let (mut pg, mut pc) = (g.alloc_kv_pool(layout).unwrap(), c.alloc_kv_pool(layout).unwrap());
        let table: Vec<u32> = (0..n.div_ceil(64) as u32).rev().collect();
        let kv = r.vec(n * (latent + rd), 2.0);
        let pos: Vec<u32> = (0..n as u32).collect();
        let slots: Vec<u32> = (0..n).map(|t| table[t / 64] * 64 + (t % 64) as u32).collect();
        let rp = RopeParams { inv_freq: (0..rd / 2).map(|i| 50000f32.powf(-(2.0 * i as f32) / rd as f32)).collect(), attention_factor: 1.0, interleaved: true };
        let norm_w = r.vec(latent, 1.0);
        g.mla_store_kv(&mut pg, 0, &g.upload(&kv).unwrap(), &g.upload(&norm_w).unwrap(), 1e-6, &pos, &slots, &rp).unwrap();
        c.mla_store_kv(&mut pc, 0, &kv, &norm_w, 1e-6, &pos, &slots, &rp).unwrap();
        let words = g.download(&pg.data).unwrap();
        let stored: Vec<f32> = match dtype {
            KvDtype::F32 => words,
            KvDtype::Bf16 => words.iter().flat_map(|w| [f32::from_bits(w.to_bits() << 16), f32::from_bits(w.to_bits() & 0xffff_0000)]).collect(),
        };
        // bf16: a value may round one unit (2^-8) apart where the two sides' f32 results straddle a tie.
        check(&format!("store_kv ({dtype:?})"), &stored, &pc.data, if dtype == KvDtype::F32 { 1e-5 } else { 8e-3 });
        // ... and only there: nearly every value rounds the same (a rounding mode bug would not).
        let same = stored.iter().zip(&pc.data).filter(|(a, b)| a == b).count() as f64 / stored.len() as f64;
        assert!(dtype == KvDtype::F32 || same > 0.98, "bf16 store: only {:.1} % of values equal the CPU's", 100.0 * same);
        eprintln!("store_kv ({dtype:?}): {:.2} % of values identical", 100.0 * same);
        if dtype == KvDtype::Bf16 {
            // Attention on both sides over the same (CPU-stored) values.
            let words: Vec<f32> = pc.data.chunks(2).map(|v| f32::from_bits((v[0].to_bits() >> 16) | (v[1].to_bits() & 0xffff_0000))).collect();
            g.stream.memcpy_htod(&words, &mut pg.data).unwrap();
        }
        for heads in [8usize, 12, 16, 20] {
            for ctxs in [vec![n], vec![n - 2, n - 1, n]] {
                let rows: Vec<AttnRow<'_>> = ctxs.iter().map(|&c| AttnRow { block_table: &table, ctx_len: c }).collect();
                let (q_lat, q_pe) = (r.vec(rows.len() * heads * latent, 0.5), r.vec(rows.len() * heads * rd, 0.5));
                let want = c.mla_attention(&pc, 0, &q_lat, &q_pe, heads, &rows, 0.06).unwrap();
                for slow in [false, true] {
                    g.slow_paths = slow;
                    let got = g.download(&g.mla_attention(&pg, 0, &g.upload(&q_lat).unwrap(), &g.upload(&q_pe).unwrap(), heads, &rows, 0.06).unwrap()).unwrap();
                    check(&format!("mla ({dtype:?} cache{}) {heads} heads x {} rows", if slow { ", single pass" } else { "" }, rows.len()), &got, &want, 1e-4);
                }
                g.slow_paths = false;
            }
        }
    }
}

/// A layer's query split/rope and latent store in one launch (`rope_q_store_kv`): the same
/// queries and the same pool, bit for bit, as the two kernels apart; near the CPU's (the trait's
/// default: the two ops); f32 and bf16 caches, one and five rows over scattered slots; a slot
/// outside the pool is an error.
#[test]
fn rope_q_and_latent_store_in_one_launch_equal_the_two_ops() {
    let (mut g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(31);
    let (heads, nope, rd, latent) = (12, 128, 64, 512);
    let rp = RopeParams { inv_freq: (0..rd / 2).map(|i| 50000f32.powf(-(2.0 * i as f32) / rd as f32)).collect(), attention_factor: 1.1, interleaved: true };
    for dtype in [KvDtype::F32, KvDtype::Bf16] {
        let layout = KvLayout { layers: 2, num_pages: 4, page_size: 16, latent_dim: latent, rope_dim: rd, dtype };
        for m in [1usize, 5] {
            let (q, kv, norm_w) = (r.vec(m * heads * (nope + rd), 1.0), r.vec(m * (latent + rd), 2.0), r.vec(latent, 1.0));
            let pos: Vec<u32> = (0..m as u32).map(|i| 7 + 3 * i).collect();
            let slots: Vec<u32> = (0..m as u32).map(|i| 63 - 5 * i).collect();
            let (qg, kvg, nwg) = (g.upload(&q).unwrap(), g.upload(&kv).unwrap(), g.upload(&norm_w).unwrap());
            let mut outs = vec![];
            for fused in [true, false] {
                g.fused_rope_store = fused;
                let mut pool = g.alloc_kv_pool(layout).unwrap();
                let (qn, qp) = g.mla_rope_q_store_kv(&qg, heads, nope, rd, &mut pool, 1, &kvg, &nwg, 1e-6, &pos, &slots, &rp).unwrap();
                outs.push((g.download(&qn).unwrap(), g.download(&qp).unwrap(), g.download(&pool.data).unwrap()));
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (i, what) in ["q_nope", "q_pe", "pool"].iter().enumerate() {
                let (a, b) = match i {
                    0 => (&outs[0].0, &outs[1].0),
                    1 => (&outs[0].1, &outs[1].1),
                    _ => (&outs[0].2, &outs[1].2),
                };
                assert!(bits(a) == bits(b), "{dtype:?} m={m}: {what} of the one launch differs from the two kernels'");
            }
            assert!(outs[0].2.iter().any(|&v| v != 0.0), "{dtype:?} m={m}: nothing stored");
            let mut pc = c.alloc_kv_pool(layout).unwrap();
            let (qn, qp) = c.mla_rope_q_store_kv(&q, heads, nope, rd, &mut pc, 1, &kv, &norm_w, 1e-6, &pos, &slots, &rp).unwrap();
            check(&format!("q_nope ({dtype:?}, m={m})"), &outs[0].0, &qn, 1e-6);
            check(&format!("q_pe ({dtype:?}, m={m})"), &outs[0].1, &qp, 1e-5);
            if dtype == KvDtype::F32 {
                check(&format!("stored latents (m={m})"), &outs[0].2, &pc.data, 1e-5);
            }
        }
        g.fused_rope_store = true;
        let mut pool = g.alloc_kv_pool(layout).unwrap();
        let (q, kv) = (g.upload(&r.vec(heads * (nope + rd), 1.0)).unwrap(), g.upload(&r.vec(latent + rd, 1.0)).unwrap());
        let err = g.mla_rope_q_store_kv(&q, heads, nope, rd, &mut pool, 0, &kv, &g.upload(&r.vec(latent, 1.0)).unwrap(), 1e-6, &[0], &[64], &rp).err().expect("slot outside the pool");
        assert!(err.to_string().contains("outside pool"), "{err}");
    }
}

/// o_proj and the post-attention norm in one launch (`linear_add_rms_norm` through
/// `gemv_add_rms_norm_*`: the GEMV's last block adds and norms): one and two rows, rows of 256
/// and 2048 values, bf16 and fp8 weights — the same bits (output and residual) as the GEMV and
/// `add_rms_norm` apart, and the CPU's result.
#[test]
fn projection_and_norm_in_one_launch() {
    let (mut g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(41);
    for (dim, cols) in [(256usize, 512usize), (2048, 256)] {
        for fp8 in [false, true] {
            let w = if fp8 { weft_backend::dummy::DummySpec::new("o_fp8", vec![(dim as u64, dim)], cols, 0.08, Some((128, 128))).host() } else { bf16_matrix(&mut r, "o_proj", dim, cols) };
            let (wg, wc) = (g.upload_matrix(&w).unwrap(), c.upload_matrix(&w).unwrap());
            let nw = r.vec(dim, 1.0);
            let nwg = g.upload(&nw).unwrap();
            for m in [1usize, 2] {
                let (x, res) = (r.vec(m * cols, 1.0), r.vec(m * dim, 1.0));
                let mut rc = res.clone();
                let want = c.linear_add_rms_norm(&x, &wc, &mut rc, dim, &nw, 1e-5).unwrap();
                let xg = g.upload(&x).unwrap();
                let mut outs = vec![];
                for fused in [0, 8] {
                    g.gemv_norm_fused = fused;
                    let mut rg = g.upload(&res).unwrap();
                    let got = g.download(&g.linear_add_rms_norm(&xg, &wg, &mut rg, dim, &nwg, 1e-5).unwrap()).unwrap();
                    let rgot = g.download(&rg).unwrap();
                    check(&format!("linear_add_rms_norm dim {dim} fp8 {fp8} m={m} fused up to {fused}"), &got, &want, 1e-5);
                    check(&format!("its residual, dim {dim} fp8 {fp8} m={m} fused up to {fused}"), &rgot, &rc, 1e-5);
                    outs.push((got, rgot));
                }
                assert!(outs[0] == outs[1], "dim {dim} fp8 {fp8} m={m}: one launch must give the GEMV's and the norm's bits");
            }
        }
    }
    g.gemv_norm_fused = 0;
}

/// A layer's MLA from its projections (`Backend::mla_attention_projected`) with the queries'
/// absorption in the launch that ropes them and stores the latents (`rope_store_absorb_*`), and
/// with the split merge inside W_UV's launch too: one and three decoding rows over contexts of
/// earlier latents, f32 and bf16 caches, 4 and 16 heads, bf16 and fp8 W_UK — the same bits
/// (values and stored latents) as the ops apart, and the CPU's result.
#[test]
fn mla_from_projections_absorbs_beside_the_rope_and_store() {
    let (mut g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(37);
    let (rd, latent, nope, v, ps) = (32, 128, 48, 64, 64usize);
    let rp = RopeParams { inv_freq: (0..rd / 2).map(|i| 50000f32.powf(-(2.0 * i as f32) / rd as f32)).collect(), attention_factor: 1.1, interleaved: true };
    let tables: [Vec<u32>; 3] = [vec![2, 5, 0, 7, 1], vec![6, 3], vec![4]];
    let lens = [300usize, 77, 9];
    for dtype in [KvDtype::F32, KvDtype::Bf16] {
        let layout = KvLayout { layers: 2, num_pages: 8, page_size: ps, latent_dim: latent, rope_dim: rd, dtype };
        let (mut pg, mut pc) = (g.alloc_kv_pool(layout).unwrap(), c.alloc_kv_pool(layout).unwrap());
        let n = 8 * ps;
        let slots: Vec<u32> = (0..n as u32).collect();
        let norm_w = r.vec(latent, 1.0);
        c.mla_store_kv(&mut pc, 1, &r.vec(n * (latent + rd), 2.0), &norm_w, 1e-6, &slots.iter().map(|s| s % 300).collect::<Vec<_>>(), &slots, &rp).unwrap();
        let words: Vec<f32> = match dtype {
            KvDtype::F32 => pc.data.clone(),
            KvDtype::Bf16 => pc.data.chunks(2).map(|v| f32::from_bits((v[0].to_bits() >> 16) | (v[1].to_bits() & 0xffff_0000))).collect(),
        };
        g.stream.memcpy_htod(&words, &mut pg.data).unwrap();
        for m in [1usize, 3] {
            let rows: Vec<AttnRow<'_>> = (0..m).map(|i| AttnRow { block_table: &tables[i], ctx_len: lens[i] }).collect();
            let pos: Vec<u32> = (0..m).map(|i| lens[i] as u32 - 1).collect();
            let row_slots: Vec<u32> = (0..m).map(|i| tables[i][(lens[i] - 1) / ps] * ps as u32 + ((lens[i] - 1) % ps) as u32).collect();
            for heads in [4usize, 16] {
                for fp8 in [false, true] {
                    let uk = if fp8 {
                        weft_backend::dummy::DummySpec::new("w_uk_fp8", vec![(heads as u64, heads * latent)], nope, 0.08, Some((128, 128))).host()
                    } else {
                        bf16_matrix(&mut r, "w_uk_t", heads * latent, nope)
                    };
                    let uv = bf16_matrix(&mut r, "w_uv", heads * v, latent);
                    let (guk, guv) = (g.upload_matrix(&uk).unwrap(), g.upload_matrix(&uv).unwrap());
                    let (cuk, cuv) = (c.upload_matrix(&uk).unwrap(), c.upload_matrix(&uv).unwrap());
                    let (q, kv) = (r.vec(m * heads * (nope + rd), 0.5), r.vec(m * (latent + rd), 2.0));
                    let want = c.mla_attention_projected(&q, (heads, nope, rd), &mut pc, 1, &kv, &norm_w, 1e-6, &pos, &row_slots, &rp, (&cuk, &cuv), &rows, 0.06).unwrap();
                    let (qg, kvg, nwg) = (g.upload(&q).unwrap(), g.upload(&kv).unwrap(), g.upload(&norm_w).unwrap());
                    let mut outs = vec![];
                    for (absorb, uv_merge) in [(0, 0), (8, 0), (8, 8)] {
                        (g.mla_absorb_fused, g.mla_uv_merge) = (absorb, uv_merge);
                        let got = g.download(&g.mla_attention_projected(&qg, (heads, nope, rd), &mut pg, 1, &kvg, &nwg, 1e-6, &pos, &row_slots, &rp, (&guk, &guv), &rows, 0.06).unwrap()).unwrap();
                        let name = format!("mla_attention_projected ({dtype:?} cache) m={m} {heads} heads fp8 W_UK {fp8}, absorbed with the rope up to {absorb} rows, merged in W_UV up to {uv_merge}");
                        check(&name, &got, &want, 1e-4);
                        outs.push((got, g.download(&pg.data).unwrap()));
                    }
                    assert!(outs.iter().all(|o| o == &outs[0]), "{dtype:?} m={m} {heads} heads fp8 {fp8}: the fused launches must give the ops' bits, values and stored latents");
                }
            }
        }
    }
    (g.mla_absorb_fused, g.mla_uv_merge) = (1, 1);
}

/// Decode rows' MLA with the merge of the context splits inside W_UV's launch
/// (`mla_uv_merge_*`): one, three and eight rows of contexts up to 1,000 tokens over a bf16
/// cache, 4 and 16 heads, bf16 and fp8 W_UV — the same bits as `mla_combine` and then the GEMV,
/// and the CPU's result.
#[test]
fn mla_splits_merge_inside_w_uv() {
    let (mut g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(31);
    let (rd, latent, nope, v, ps) = (32, 128, 48, 64, 64usize);
    let layout = KvLayout { layers: 1, num_pages: 16, page_size: ps, latent_dim: latent, rope_dim: rd, dtype: KvDtype::Bf16 };
    let (mut pg, mut pc) = (g.alloc_kv_pool(layout).unwrap(), c.alloc_kv_pool(layout).unwrap());
    let n = 16 * ps;
    let kv = r.vec(n * (latent + rd), 2.0);
    let pos: Vec<u32> = (0..n as u32).map(|s| s % 1000).collect();
    let slots: Vec<u32> = (0..n as u32).collect();
    let rp = RopeParams { inv_freq: (0..rd / 2).map(|i| 50000f32.powf(-(2.0 * i as f32) / rd as f32)).collect(), attention_factor: 1.0, interleaved: true };
    c.mla_store_kv(&mut pc, 0, &kv, &r.vec(latent, 1.0), 1e-6, &pos, &slots, &rp).unwrap();
    let words: Vec<f32> = pc.data.chunks(2).map(|v| f32::from_bits((v[0].to_bits() >> 16) | (v[1].to_bits() & 0xffff_0000))).collect();
    g.stream.memcpy_htod(&words, &mut pg.data).unwrap();
    let (ta, tb): (Vec<u32>, Vec<u32>) = ((0..16).rev().collect(), vec![3, 9, 4]);
    for m in [1usize, 3, 8] {
        let rows: Vec<AttnRow<'_>> = (0..m).map(|i| if i % 2 == 0 { AttnRow { block_table: &ta, ctx_len: 1000 - 37 * i } } else { AttnRow { block_table: &tb, ctx_len: 150 + i } }).collect();
        for heads in [4usize, 16] {
            for fp8 in [false, true] {
                let uk = bf16_matrix(&mut r, "w_uk_t", heads * latent, nope);
                let uv = if fp8 {
                    weft_backend::dummy::DummySpec::new("w_uv_fp8", vec![(heads as u64, heads * v)], latent, 0.08, Some((128, 128))).host()
                } else {
                    bf16_matrix(&mut r, "w_uv", heads * v, latent)
                };
                let (guk, guv) = (g.upload_matrix(&uk).unwrap(), g.upload_matrix(&uv).unwrap());
                let (cuk, cuv) = (c.upload_matrix(&uk).unwrap(), c.upload_matrix(&uv).unwrap());
                let (q_nope, q_pe) = (r.vec(m * heads * nope, 0.5), r.vec(m * heads * rd, 0.5));
                let want = c.mla_attention_heads(&pc, 0, &q_nope, &q_pe, &cuk, &cuv, heads, &rows, 0.06).unwrap();
                let (gq, gp) = (g.upload(&q_nope).unwrap(), g.upload(&q_pe).unwrap());
                let mut outs = vec![];
                for most in [8, 0] {
                    g.mla_uv_merge = most;
                    let got = g.download(&g.mla_attention_heads(&pg, 0, &gq, &gp, &guk, &guv, heads, &rows, 0.06).unwrap()).unwrap();
                    check(&format!("mla_attention_heads m={m} {heads} heads fp8 W_UV {fp8}, merged in W_UV up to {most} rows"), &got, &want, 1e-4);
                    outs.push(got);
                }
                assert!(outs[0] == outs[1], "m={m} {heads} heads fp8 {fp8}: the merge inside W_UV must give mla_combine's bits");
            }
        }
    }
    g.mla_uv_merge = 1;
}

/// Prefill runs through the GEMM path (`mla_prefill.rs`, served here by the stand-in GEMM the
/// mock build has; real HIP builds keep the decode kernels): a run of 72 rows attending in query
/// tiles of 32 (tiles multiply only the keys their last row sees), beside a decode row and a
/// short run of another two sequences and a fresh 64-token prompt (a second run, from position
/// 0), as `mla_attention_heads` (keys decompressed in blocks of 64 at 16 heads, 256 at 4) — per head over decompressed
/// keys and values, and absorbed over the latents — against the CPU's absorbed ops; over f32
/// and bf16 latent caches. Also `mla_attention` alone with the same runs.
#[test]
fn mla_prefill_runs_decompressed_and_absorbed() {
    let (mut g, c) = (mock(), CpuBackend::new());
    g.mla_prefill_tile = 32;
    // Keys decompressed in blocks of 64 (f32 products of 64 keys × 16 heads × (48 + 40) columns).
    g.mla_decompress_block_bytes = 64 * 16 * (48 + 40) * 4;
    let mut r = Rng(11);
    let (rd, latent, nope, v, ps) = (32, 128, 48, 40, 64usize);
    let (ta, tb, tc, td): (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>) = (vec![3, 0, 7, 1], vec![2, 5], vec![6], vec![8]);
    let mut rows: Vec<AttnRow<'_>> = vec![AttnRow { block_table: &tb, ctx_len: 90 }];
    rows.extend((129..=200).map(|n| AttnRow { block_table: &ta, ctx_len: n }));
    rows.extend((10..=12).map(|n| AttnRow { block_table: &tc, ctx_len: n }));
    rows.extend((1..=64).map(|n| AttnRow { block_table: &td, ctx_len: n }));
    for dtype in [KvDtype::F32, KvDtype::Bf16] {
        let layout = KvLayout { layers: 1, num_pages: 9, page_size: ps, latent_dim: latent, rope_dim: rd, dtype };
        let (mut pg, mut pc) = (g.alloc_kv_pool(layout).unwrap(), c.alloc_kv_pool(layout).unwrap());
        let n = 9 * ps;
        let kv = r.vec(n * (latent + rd), 2.0);
        let pos: Vec<u32> = (0..n as u32).map(|s| s % 200).collect();
        let slots: Vec<u32> = (0..n as u32).collect();
        let rp = RopeParams { inv_freq: (0..rd / 2).map(|i| 50000f32.powf(-(2.0 * i as f32) / rd as f32)).collect(), attention_factor: 1.0, interleaved: true };
        let norm_w = r.vec(latent, 1.0);
        c.mla_store_kv(&mut pc, 0, &kv, &norm_w, 1e-6, &pos, &slots, &rp).unwrap();
        // Both sides attend over the same stored values (the CPU's, bf16 words packed in pairs).
        let words: Vec<f32> = match dtype {
            KvDtype::F32 => pc.data.clone(),
            KvDtype::Bf16 => pc.data.chunks(2).map(|v| f32::from_bits((v[0].to_bits() >> 16) | (v[1].to_bits() & 0xffff_0000))).collect(),
        };
        g.stream.memcpy_htod(&words, &mut pg.data).unwrap();
        for heads in [4usize, 16] {
            let (uk, uv) = (bf16_matrix(&mut r, "w_uk_t", heads * latent, nope), bf16_matrix(&mut r, "w_uv", heads * v, latent));
            let (guk, guv) = (g.upload_matrix(&uk).unwrap(), g.upload_matrix(&uv).unwrap());
            let (cuk, cuv) = (c.upload_matrix(&uk).unwrap(), c.upload_matrix(&uv).unwrap());
            let (q_nope, q_pe) = (r.vec(rows.len() * heads * nope, 0.5), r.vec(rows.len() * heads * rd, 0.5));
            let want = c.mla_attention_heads(&pc, 0, &q_nope, &q_pe, &cuk, &cuv, heads, &rows, 0.06).unwrap();
            let (gq, gp) = (g.upload(&q_nope).unwrap(), g.upload(&q_pe).unwrap());
            let run = heads * v..73 * heads * v;
            let mut outs = vec![];
            for (decompress, min_rows) in [(true, 64), (false, 64), (true, 0)] {
                (g.mla_decompress, g.mla_gemm_min_rows) = (decompress, min_rows);
                let got = g.download(&g.mla_attention_heads(&pg, 0, &gq, &gp, &guk, &guv, heads, &rows, 0.06).unwrap()).unwrap();
                let path = if min_rows == 0 {
                    "decode kernels"
                } else if decompress {
                    "decompressed"
                } else {
                    "absorbed"
                };
                check(&format!("mla_attention_heads ({dtype:?} cache, {path}) {heads} heads"), &got, &want, 1e-4);
                check(&format!("mla_attention_heads ({dtype:?} cache, {path}) {heads} heads, the run's rows"), &got[run.clone()], &want[run.clone()], 1e-4);
                outs.push(got);
            }
            // Three paths, three roundings of the run's rows (a path not taken would repeat one).
            assert!(outs[0][run.clone()] != outs[2][run.clone()] && outs[1][run.clone()] != outs[2][run.clone()] && outs[0][run.clone()] != outs[1][run.clone()], "a path was not taken");
            // The absorbed op alone, runs on.
            let q_lat = r.vec(rows.len() * heads * latent, 0.5);
            let want = c.mla_attention(&pc, 0, &q_lat, &q_pe, heads, &rows, 0.06).unwrap();
            g.mla_gemm_min_rows = 64;
            let got = g.download(&g.mla_attention(&pg, 0, &g.upload(&q_lat).unwrap(), &gp, heads, &rows, 0.06).unwrap()).unwrap();
            check(&format!("mla_attention ({dtype:?} cache, runs in tiles) {heads} heads"), &got, &want, 1e-4);
        }
    }
    (g.mla_decompress, g.mla_gemm_min_rows) = (true, 0);
}

/// Relative error of rows `rows` (each `width` wide) against the reference's largest value.
fn rows_err(got: &[f32], want: &[f32], width: usize, rows: std::ops::Range<usize>) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let r = rows.start * width..rows.end * width;
    worst_gap(&got[r.clone()], &want[r]) / scale
}

/// Inside a step (`run_step`), prompt rows in long runs take one bf16 activation part and the
/// step's other rows two (`precision.rs`): a decode row before a 72-row prompt run stays
/// f32-grade in a GEMM over the step's rows and in attention, the run's rows come out
/// bf16-grade — and visibly so, so the one-part path was taken — except its last three when
/// they are the step's `exact_rows` (drafts); with `prefill_parts = 2`, and outside a step,
/// every row is f32-grade.
#[test]
fn prompt_rows_take_one_part_inside_a_step() {
    let (mut g, c) = (mock(), CpuBackend::new());
    g.mla_gemm_min_rows = 64;
    let mut r = Rng(31);
    let (rd, latent, nope, v, ps, heads) = (32, 128, 48, 40, 64usize, 4usize);
    let (ta, tb): (Vec<u32>, Vec<u32>) = (vec![3, 0, 2, 1], vec![4, 5]);
    let mut rows: Vec<AttnRow<'_>> = vec![AttnRow { block_table: &tb, ctx_len: 90 }];
    rows.extend((129..=200).map(|n| AttnRow { block_table: &ta, ctx_len: n }));
    let m = rows.len();
    let layout = KvLayout { layers: 1, num_pages: 6, page_size: ps, latent_dim: latent, rope_dim: rd, dtype: KvDtype::F32 };
    let (mut pg, mut pc) = (g.alloc_kv_pool(layout).unwrap(), c.alloc_kv_pool(layout).unwrap());
    let n = 6 * ps;
    let kv = r.vec(n * (latent + rd), 2.0);
    let pos: Vec<u32> = (0..n as u32).map(|s| s % 200).collect();
    let slots: Vec<u32> = (0..n as u32).collect();
    let rp = RopeParams { inv_freq: (0..rd / 2).map(|i| 50000f32.powf(-(2.0 * i as f32) / rd as f32)).collect(), attention_factor: 1.0, interleaved: true };
    c.mla_store_kv(&mut pc, 0, &kv, &r.vec(latent, 1.0), 1e-6, &pos, &slots, &rp).unwrap();
    g.stream.memcpy_htod(&pc.data, &mut pg.data).unwrap();
    let (uk, uv) = (bf16_matrix(&mut r, "w_uk_t", heads * latent, nope), bf16_matrix(&mut r, "w_uv", heads * v, latent));
    let (guk, guv, cuk, cuv) = (g.upload_matrix(&uk).unwrap(), g.upload_matrix(&uv).unwrap(), c.upload_matrix(&uk).unwrap(), c.upload_matrix(&uv).unwrap());
    let (q_nope, q_pe) = (r.vec(m * heads * nope, 0.5), r.vec(m * heads * rd, 0.5));
    let want_attn = c.mla_attention_heads(&pc, 0, &q_nope, &q_pe, &cuk, &cuv, heads, &rows, 0.06).unwrap();
    let (gq, gp) = (g.upload(&q_nope).unwrap(), g.upload(&q_pe).unwrap());
    let (wn, wk) = (96, 256);
    let w = bf16_matrix(&mut r, "w", wn, wk);
    let (wg, wc) = (g.upload_matrix(&w).unwrap(), c.upload_matrix(&w).unwrap());
    let x = r.vec(m * wk, 1.0);
    let want_lin = c.linear(&x, &wc).unwrap();
    let gx = g.upload(&x).unwrap();
    let zeros = vec![0u32; m];
    for (parts, inside, exact) in [(1, true, &[][..]), (1, true, &[(70u32, 73u32)][..]), (2, true, &[][..]), (1, false, &[][..])] {
        let step = weft_backend::StepBatch { tokens: &zeros, positions: &zeros, slots: &zeros, attn: &rows, exact_rows: exact };
        g.prefill_parts = parts;
        let mut attn = None;
        let lin = if inside {
            let mut run = |pool: &mut weft_cuda::CudaKvPool| {
                attn = Some(g.mla_attention_heads(pool, 0, &gq, &gp, &guk, &guv, heads, &rows, 0.06)?);
                g.linear(&gx, &wg)
            };
            g.run_step(&mut pg, &step, m * wn, &mut run).unwrap()
        } else {
            attn = Some(g.mla_attention_heads(&pg, 0, &gq, &gp, &guk, &guv, heads, &rows, 0.06).unwrap());
            g.linear(&gx, &wg).unwrap()
        };
        let (lin, attn) = (g.download(&lin).unwrap(), g.download(&attn.unwrap()).unwrap());
        // The decode row, the run's rows before any exact tail, the exact tail.
        let one_end = if exact.is_empty() { m } else { 70 };
        let e = |rows: std::ops::Range<usize>| [rows_err(&lin, &want_lin, wn, rows.clone()), rows_err(&attn, &want_attn, heads * v, rows)];
        let (dec, run, tail) = (e(0..1), e(1..one_end), if exact.is_empty() { [0.0; 2] } else { e(70..m) });
        eprintln!("parts {parts}, inside a step {inside}, exact rows {exact:?}: linear / attention — decode row {dec:?}, run rows {run:?}, exact tail {tail:?}");
        assert!(dec.iter().chain(&tail).all(|&x| x < 2e-5), "the decode row and exact rows must stay f32-grade");
        if parts == 1 && inside {
            assert!(run.iter().all(|&x| x > 1e-4 && x < 1e-2), "the run's rows take one bf16 part: {run:?}");
        } else {
            assert!(run.iter().all(|&x| x < 2e-5), "every row f32-grade: {run:?}");
        }
    }
    g.prefill_parts = 1;
    g.mla_gemm_min_rows = 0;
}

/// The sampling front end on the device (token edits, temperature, top-K, log-sum-exp): the
/// same candidates and statistics as the CPU's.
#[test]
fn sampling_front_matches_cpu() {
    use weft_backend::front::FrontRow;
    let (g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(9);
    let vocab = 3000;
    let x = r.vec(3 * vocab, 8.0);
    let rows: Vec<FrontRow> = (0..3).map(|i| FrontRow { k: [1, 40, 0][i], temperature: [1.0, 0.7, 0.0][i], edits: vec![] }).collect();
    let mut xg = g.upload(&x).unwrap();
    let mut xc = x.clone();
    let (og, oc) = (g.sampling_front(&mut xg, vocab, &rows).unwrap(), c.sampling_front(&mut xc, vocab, &rows).unwrap());
    for (i, (a, b)) in og.iter().zip(&oc).enumerate() {
        assert_eq!((&a.ids, a.finite), (&b.ids, b.finite), "row {i}: candidates");
        assert!((a.logsumexp - b.logsumexp).abs() < 1e-4 * b.logsumexp.abs().max(1.0), "row {i}: log-sum-exp {} vs {}", a.logsumexp, b.logsumexp);
    }
}

/// The engine makes the backend on one thread and drives it from its step loop's: every
/// thread must make the device current before its first call (HIP's current device is per
/// thread; the mock refuses calls from a thread that did not).
#[test]
fn a_backend_made_on_one_thread_works_on_another() {
    let g = std::sync::Arc::new(mock());
    let x: Vec<f32> = (0..512).map(|i| i as f32 * 0.01).collect();
    let w = vec![1.0f32; 256];
    let h = {
        let g = g.clone();
        std::thread::spawn(move || g.download(&g.rms_norm(&g.upload(&x).unwrap(), 256, &g.upload(&w).unwrap(), 1e-6).unwrap()).unwrap())
    };
    let got = h.join().expect("ops from another thread");
    let want = CpuBackend::new().rms_norm(&(0..512).map(|i| i as f32 * 0.01).collect::<Vec<_>>(), 256, &vec![1.0; 256], 1e-6).unwrap();
    check("rms_norm from another thread", &got, &want, 1e-5);
}

/// Grouped-query attention (DFlash draft layers): K/V rows stored at scattered slots, then 8
/// query heads over 2 and 8 key/value groups, one row and a bidirectional block of four rows
/// sharing one context, head dims 16 and 128; `concat` joins buffers.
#[test]
fn gqa_attention_and_kv_store_match_cpu() {
    let (g, c) = (mock(), CpuBackend::new());
    let mut r = Rng(11);
    let n: usize = 150;
    for (kvh, d) in [(2usize, 16usize), (8, 128)] {
        let layout = KvLayout::gqa(2, n.div_ceil(32) + 1, 32, kvh, d);
        let (mut pg, mut pc) = (g.alloc_kv_pool(layout).unwrap(), c.alloc_kv_pool(layout).unwrap());
        let table: Vec<u32> = (0..layout.num_pages as u32).rev().collect();
        let slots: Vec<u32> = (0..n).map(|t| table[t / 32] * 32 + (t % 32) as u32).collect();
        let (k, v) = (r.vec(n * kvh * d, 1.0), r.vec(n * kvh * d, 1.0));
        g.kv_store(&mut pg, 1, &g.upload(&k).unwrap(), &g.upload(&v).unwrap(), &slots).unwrap();
        c.kv_store(&mut pc, 1, &k, &v, &slots).unwrap();
        for ctxs in [vec![n], vec![n - 3; 4]] {
            let rows: Vec<AttnRow<'_>> = ctxs.iter().map(|&c| AttnRow { block_table: &table, ctx_len: c }).collect();
            let q = r.vec(rows.len() * 8 * d, 0.5);
            let got = g.download(&g.gqa_attention(&pg, 1, &g.upload(&q).unwrap(), 8, kvh, &rows, 0.25).unwrap()).unwrap();
            check(&format!("gqa {kvh}x{d}, {} rows", rows.len()), &got, &c.gqa_attention(&pc, 1, &q, 8, kvh, &rows, 0.25).unwrap(), 1e-4);
        }
        assert!(g.gqa_attention(&pg, 1, &g.upload(&r.vec(8 * d, 0.5)).unwrap(), 8, 3, &[AttnRow { block_table: &table, ctx_len: 1 }], 0.25).is_err(), "8 heads over 3 groups");
    }
    let (a, b) = (r.vec(70, 1.0), r.vec(33, 1.0));
    let got = g.download(&g.concat(&[&g.upload(&a).unwrap(), &g.upload(&b).unwrap()]).unwrap()).unwrap();
    assert_eq!(got, [a, b].concat());
}

/// The HIP build's tensor-parallel group (`weft_cuda::nccl` over `weft_hip_driver::nccl`: RCCL
/// on AMD GPUs, here the mock's host-memory group on mock devices 0..size): TP=2 and 4, experts
/// sliced and whole, reproduce the unsplit model's prompt log-probabilities and greedy tokens.
/// Shows the rank/stream/device bookkeeping and argument lists of the RCCL path; RCCL itself
/// (its transports, its timing) only runs on AMD GPUs.
#[test]
fn tensor_parallel_over_the_rccl_path() {
    use std::sync::Arc;
    use weft_backend::Collective;
    use weft_model::generate::{generate, GenerateRequest};
    use weft_model::sampling::SamplingParams;
    let dir = golden_dir().join("v3-qlora-yarn-groups");
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let prompt: Vec<u32> = reference["cases"][0]["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let req = GenerateRequest { prompt_ids: prompt.clone(), max_tokens: 4, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: Some(5), stop_ids: vec![] };
    let want = generate(&weft_model::LoadedModel::open(&dir, mock()).unwrap().model, &req).unwrap();
    assert!(weft_cuda::nccl::nccl_available());
    for (size, ep) in [(2usize, false), (2, true), (4, false)] {
        let backends: Vec<CudaBackend> = (0..size).map(|d| CudaBackend::new(d).unwrap()).collect();
        let group = weft_cuda::nccl::nccl_group(&backends.iter().collect::<Vec<_>>()).unwrap();
        let ranks: Vec<Arc<dyn Collective<CudaBackend>>> = group.into_iter().map(|g| -> Arc<dyn Collective<CudaBackend>> { g }).collect();
        let last = ranks[size - 1].clone();
        let lm = weft_model::LoadedModel::open_tensor_parallel_group(&dir, weft_model::LoadOptions { expert_parallel: ep, ..Default::default() }, backends, ranks).unwrap();
        let got = generate(&lm.model, &req).unwrap();
        let mut worst = 0f64;
        for i in 1..prompt.len() {
            let lp = |o: &weft_model::generate::GenerateOutput| o.prompt_logprobs[i].as_ref().unwrap().iter().find(|p| p.0 == prompt[i]).unwrap().1;
            worst = worst.max((lp(&got) - lp(&want)).abs());
        }
        eprintln!("TP={size} (expert-parallel: {ep}) over the HIP build's collective (mock RCCL): worst prompt logprob difference {worst:.1e}, greedy {:?}", got.token_ids);
        assert!(worst < 1e-3, "TP={size} EP={ep}: prompt logprobs differ by {worst}");
        assert_eq!(got.token_ids, want.token_ids, "TP={size} EP={ep}: greedy tokens");
        last.abort("test: the last rank gave up");
        let err = generate(&lm.model, &req).expect_err("an aborted group must fail its next step").to_string();
        assert!(err.contains("group failed"), "{err}");
    }
}
