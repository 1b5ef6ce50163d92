//! MLA attention for prefill chunks (NVIDIA; the mock HIP build for tests): a long run of one
//! sequence's query rows attends through cuBLAS on tensor cores instead of the decode kernel,
//! which re-reads the whole context for every row (1.47 ms per Moonlight layer for a 1024-token
//! prompt, against 21 µs for PyTorch's SDPA on the decompressed heads; results/roofline-h200.md).
//!
//! Two forms. Per head (`mla_attention_heads`, the default where the up-projections are bf16):
//! the run's context gathered from its pages as bf16 parts (`mla_gather_split`), its keys and
//! values decompressed per head (`k_nope = c·W_UKᵀ`, `v = c·W_UVᵀ`, one product per latent
//! part), keys with the shared rotary part and queries split into parts (`mla_k_split`,
//! `mla_q_split`), scores `S = Q·Kᵀ` over 192 columns, values over 128 — 3.4× fewer products
//! per query, key and head than absorbed. Absorbed (`mla_attention`, and where the per-head
//! form does not apply): scores against the latents and rotary keys as stored (576 columns),
//! `O = P·C_lat` (512). Either way operands are two bf16 parts (products hi·hi + hi·lo + lo·hi,
//! f32 accumulation; a bf16 cache is its own single part), the causal softmax's weights are
//! split again, and query rows go in tiles of at most `mla_prefill_tile` rows within the
//! backend's `mla_score_bytes`, each multiplying only the keys its last row sees. Rows outside
//! long runs (decodes, short chunks, speculative verification) take the decode kernels. Inside
//! a step, a run's prompt rows take one bf16 part (`precision.rs`, the default): every operand's
//! second part is left out for their tiles, one product instead of three; a precise tail (drafts
//! scored in the run's pass) keeps them. Those one-part rows of the per-head form attend in one
//! pass (`mla_flash_bf16`, kernels/mla_flash.cu: scores, causal softmax and values per 64 rows
//! and head in registers and shared memory, nothing materialised) where the widths are
//! DeepSeek-V3's (192-wide keys, 128-wide values) and `WEFT_CUDA_MLA_FLASH` is not 0.

use crate::mla::MlaArgs;
use crate::ops::cfg;
pub(crate) use crate::precision::{long_runs, Run};
use crate::{dev, CudaBackend, CudaKvPool, CudaMatrix};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut, PushKernelArg};
use std::ffi::c_void;
use weft_backend::{AttnRow, Result};

/// One strided-batched bf16 GEMM with f32 output, column-major as cuBLAS sees it:
/// `C = op(A)·B (+ C)` with `m×k` op(A) (`ta`: A stored `k×m`), `k×n` B.
struct Gemm {
    ta: bool,
    m: usize,
    n: usize,
    k: usize,
    a: (u64, usize, i64),
    b: (u64, usize, i64),
    c: (u64, usize, i64),
    batch: usize,
    accumulate: bool,
}

impl CudaBackend {
    /// Runs of this step that take the GEMM path (none while a step graph is recorded: the path
    /// uploads the run's block table).
    pub(crate) fn mla_gemm_runs(&self, rows: &[AttnRow<'_>]) -> Vec<Run> {
        if self.slow_paths || !self.gemm_split || self.mla_gemm_min_rows == 0 || self.capturing.load(std::sync::atomic::Ordering::Relaxed) {
            return vec![];
        }
        long_runs(rows, self.mla_gemm_min_rows)
    }

    fn gemm_bf16(&self, g: Gemm) -> Result<()> {
        let blas = self.blas.lock().unwrap();
        let (alpha, beta) = (1.0f32, if g.accumulate { 1.0f32 } else { 0.0 });
        unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                *blas.handle(),
                if g.ta { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N },
                cublasOperation_t::CUBLAS_OP_N,
                g.m as i32,
                g.n as i32,
                g.k as i32,
                &alpha as *const f32 as *const c_void,
                g.a.0 as *const c_void,
                cudaDataType::CUDA_R_16BF,
                g.a.1 as i32,
                g.a.2,
                g.b.0 as *const c_void,
                cudaDataType::CUDA_R_16BF,
                g.b.1 as i32,
                g.b.2,
                &beta as *const f32 as *const c_void,
                g.c.0 as *mut c_void,
                cudaDataType::CUDA_R_32F,
                g.c.1 as i32,
                g.c.2,
                g.batch as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(dev)
    }

    /// Query rows per tile of a run of `len` rows over `total` keys: within the score budget
    /// and at most `mla_prefill_tile` (each tile multiplies only the keys its last row sees).
    fn query_tile(&self, heads: usize, total: usize, len: usize) -> usize {
        (self.mla_score_bytes / (8 * heads * total).max(1)).clamp(1, len).min(self.mla_prefill_tile)
    }

    /// The context of `run` (everything its last row sees) gathered from its pages as bf16
    /// parts `[total][w]`: a bf16 cache is its own first part and has no second.
    fn gather_context(&self, pool: &CudaKvPool, layer: usize, rows: &[AttnRow<'_>], run: Run) -> Result<Context> {
        let l = pool.layout;
        let w = l.width();
        let first = &rows[run.start];
        let ctx0 = first.ctx_len - 1; // context before the run's first row
        let total = ctx0 + run.len;
        let table = self.up_u32(&first.block_table[..total.div_ceil(l.page_size)])?;
        let view = pool.layer(layer);
        let bf = pool.bf16();
        let mut c = self.alloc::<u16>(if bf { total * w } else { 2 * total * w })?;
        let (ps, w32) = (l.page_size as u32, w as u32);
        if bf {
            let mut b = self.stream.launch_builder(self.func("mla_gather_bf16"));
            b.arg(&view).arg(&table).arg(&mut c).arg(&ps).arg(&w32);
            unsafe { b.launch(cfg(total, 0)) }.map_err(dev)?;
        } else {
            let (mut hi, mut lo) = c.split_at_mut(total * w);
            let mut b = self.stream.launch_builder(self.func("mla_gather_split"));
            b.arg(&view).arg(&table).arg(&mut hi).arg(&mut lo).arg(&ps).arg(&w32);
            unsafe { b.launch(cfg(total, 0)) }.map_err(dev)?;
        }
        Ok(Context { c, ctx0, total, lo: !bf })
    }

    /// `len` query rows attending causally over keys and values, per head, in query tiles:
    /// `S = Q·Kᵀ` from the parts (hi·hi + hi·lo + lo·hi, f32 accumulation), the causal softmax
    /// split into parts, `O = P·V` the same way into `out` (`[rows][heads][vw]`, `out.ld` apart).
    /// Rows before `split` take every operand's first part alone (`precision.rs`); no tile
    /// spans it. Rows before `from` are left alone (`mla_flash_bf16` attended them).
    #[allow(clippy::too_many_arguments)]
    fn attend(&self, keys: Parts, kw: usize, queries: Parts, values: Parts, vw: usize, out: Parts, heads: usize, ctx0: usize, (from, len, split): (usize, usize, usize), scale: f32) -> Result<()> {
        let total = ctx0 + len;
        let tile = self.query_tile(heads, total, len);
        let mut i0 = from;
        while i0 < len {
            let one = i0 < split;
            let r = tile.min(if one { split } else { len } - i0);
            let [keys, queries, values] = [keys, queries, values].map(|p| if one { Parts { lo: None, ..p } } else { p });
            let t = ctx0 + i0 + r; // context the tile's last row sees
            let mut s = self.alloc::<f32>(heads * r * t)?;
            let ps = {
                let (p, _g) = s.device_ptr_mut(&self.stream);
                p
            };
            // S_h [r × t] = Q_h · K_h[..t]ᵀ, scores of head h `r · t` apart.
            let q0 = (i0 * queries.ld * 2) as u64;
            for (i, (a, b)) in products(keys, queries).into_iter().enumerate() {
                self.gemm_bf16(Gemm { ta: true, m: t, n: r, k: kw, a: (a, keys.ld, keys.head), b: (b + q0, queries.ld, queries.head), c: (ps, t, (r * t) as i64), batch: heads, accumulate: i > 0 })?;
            }
            // The weights' second part only for a two-part tile (one spare element otherwise).
            let np = heads * r * t;
            let mut p = self.alloc::<u16>(np + if one { 1 } else { np })?;
            {
                let (mut hi, mut lo) = p.split_at_mut(np);
                let (r32, t32, c32, lo_out) = (r as u32, t as u32, (ctx0 + i0) as u32, (!one) as i32);
                let mut b = self.stream.launch_builder(self.func("mla_softmax_split"));
                b.arg(&s).arg(&mut hi).arg(&mut lo).arg(&r32).arg(&t32).arg(&c32).arg(&scale).arg(&lo_out);
                unsafe { b.launch(cfg(heads * r, 0)) }.map_err(dev)?;
            }
            let (pp, _gp) = p.device_ptr(&self.stream);
            let weights = Parts { hi: pp, lo: (!one).then_some(pp + (heads * r * t * 2) as u64), ld: t, head: (r * t) as i64 };
            // O_h [r × vw] = P_h · V_h[..t], into the tile's rows of `out`.
            let o0 = out.hi + (i0 * out.ld * 4) as u64;
            for (i, (a, b)) in products(values, weights).into_iter().enumerate() {
                self.gemm_bf16(Gemm { ta: false, m: vw, n: r, k: t, a: (a, values.ld, values.head), b: (b, t, weights.head), c: (o0, out.ld, out.head), batch: heads, accumulate: i > 0 })?;
            }
            i0 += r;
        }
        Ok(())
    }

    /// Whether a run's one-part rows can take `mla_flash_bf16` (kernels/mla_flash.cu): the
    /// kernel on, the per-head widths it is built for (`nope` + `rd` query and key columns, `vw`
    /// value columns).
    fn flash_applies(&self, nope: usize, rd: usize, vw: usize) -> bool {
        self.mla_flash && flash_smem() as usize <= self.smem_optin && (nope, rd, vw) == (FLASH_NOPE, FLASH_KW - FLASH_NOPE, FLASH_VW)
    }

    /// Rows `0..rows` of a run attending causally in one pass per 64 rows and head: queries f32
    /// (`q`: the run's first rows of q_nope and q_pe, rounded by the kernel), keys and values
    /// the first parts `[key][head][width]`, into `out` (f32, `out.ld` apart).
    #[allow(clippy::too_many_arguments)]
    fn flash(&self, keys: u64, q: (u64, u64), values: u64, out: Parts, heads: usize, ctx0: usize, rows: usize, scale: f32) -> Result<()> {
        let (r32, c32, h32, ld32) = (rows as u32, ctx0 as u32, heads as u32, out.ld as u32);
        let mut b = self.stream.launch_builder(self.func("mla_flash_bf16"));
        b.arg(&q.0).arg(&q.1).arg(&keys).arg(&values).arg(&out.hi).arg(&r32).arg(&c32).arg(&h32).arg(&ld32).arg(&scale);
        let grid = (rows.div_ceil(FLASH_ROWS) as u32, heads as u32, 1);
        unsafe { b.launch(cudarc::driver::LaunchConfig { grid_dim: grid, block_dim: (128, 1, 1), shared_mem_bytes: flash_smem() }) }.map_err(dev)?;
        Ok(())
    }

    /// `run`'s queries as two bf16 parts `[rows · heads][d + rd]`: each (row, head)'s `d`
    /// columns of `q` (`q_lat`, or `q_nope` in the per-head form), then its `rd` of `q_pe`.
    fn split_queries(&self, q: &CudaSlice<f32>, d: usize, q_pe: &CudaSlice<f32>, rd: usize, run: Run, heads: usize) -> Result<CudaSlice<u16>> {
        let rh = run.len * heads;
        let mut out = self.alloc::<u16>(2 * rh * (d + rd))?;
        let qa = q.slice(run.start * heads * d..(run.start + run.len) * heads * d);
        let qp = q_pe.slice(run.start * heads * rd..(run.start + run.len) * heads * rd);
        let (mut hi, mut lo) = out.split_at_mut(rh * (d + rd));
        let (d32, rd32) = (d as u32, rd as u32);
        let mut b = self.stream.launch_builder(self.func("mla_q_split"));
        b.arg(&qa).arg(&qp).arg(&mut hi).arg(&mut lo).arg(&d32).arg(&rd32);
        unsafe { b.launch(cfg(rh, 0)) }.map_err(dev)?;
        Ok(out)
    }

    /// Absorbed attention of `run`'s rows into their rows of `out` (`[rows][heads][latent]`):
    /// scores against the latents and rotary keys as stored, values the latents.
    pub(crate) fn mla_run(&self, a: MlaArgs<'_>, run: Run, out: &mut CudaSlice<f32>) -> Result<()> {
        let MlaArgs { pool, layer, q_lat, q_pe, heads, rows, scale } = a;
        let l = pool.layout;
        let (lat, rd, w) = (l.latent_dim, l.rope_dim, l.width());
        let ctx = self.gather_context(pool, layer, rows, run)?;
        let rh = run.len * heads;
        let q = self.split_queries(q_lat, lat, q_pe, rd, run, heads)?;
        let (pc, _gc) = ctx.c.device_ptr(&self.stream);
        let (pq, _gq) = q.device_ptr(&self.stream);
        let (po, _go) = out.device_ptr_mut(&self.stream);
        let latents = Parts { hi: pc, lo: ctx.lo.then_some(pc + (ctx.total * w * 2) as u64), ld: w, head: 0 };
        let queries = Parts { hi: pq, lo: Some(pq + (rh * w * 2) as u64), ld: heads * w, head: w as i64 };
        let out = Parts { hi: po + (run.start * heads * lat * 4) as u64, lo: None, ld: heads * lat, head: lat as i64 };
        let split = run.len - self.run_precise_tail(rows.len(), run);
        self.attend(latents, w, queries, latents, lat, out, heads, ctx.ctx0, (0, run.len, split), scale)
    }

    /// Attention of `run`'s rows with the context's keys and values decompressed per head
    /// (`k_nope = W_UK·c`, `v = W_UV·c` over the latents' parts), into their rows of `out`
    /// (`[rows][heads][v]`). `q_nope [rows][heads][nope]`.
    fn mla_run_heads(&self, a: HeadsArgs<'_>, run: Run, out: &mut CudaSlice<f32>) -> Result<()> {
        let HeadsArgs { pool, layer, q_nope, q_pe, w_uk_t, w_uv, heads, rows, scale } = a;
        let l = pool.layout;
        let (lat, rd, w) = (l.latent_dim, l.rope_dim, l.width());
        let (nope, v) = (w_uk_t.cols, w_uv.rows / heads);
        let kw = nope + rd;
        let ctx = self.gather_context(pool, layer, rows, run)?;
        let total = ctx.total;
        let (pc, _gc) = ctx.c.device_ptr(&self.stream);
        // The latents' second part only where some of the run's rows take two parts.
        let split = run.len - self.run_precise_tail(rows.len(), run);
        let latents = [Some(pc), (ctx.lo && split < run.len).then_some(pc + (total * w * 2) as u64)];
        let (puk, _guk) = w_uk_t.data.device_ptr(&self.stream);
        let (puv, _guv) = w_uv.data.device_ptr(&self.stream);
        // Keys as parts [total][heads][nope + rd], values as parts [total][heads][v], made in
        // blocks of keys so the f32 products stay within `mla_decompress_block_bytes`; the
        // second parts only where some row takes two (one spare element otherwise).
        let two = split < run.len;
        let (kn, vn) = (total * heads * kw, total * heads * v);
        let mut k = self.alloc::<u16>(kn + if two { kn } else { 1 })?;
        let mut vp = self.alloc::<u16>(vn + if two { vn } else { 1 })?;
        let block = (self.mla_decompress_block_bytes / (4 * heads * (nope + v))).clamp(1, total);
        let mut k_nope = self.alloc::<f32>(block * heads * nope)?;
        let mut vals = self.alloc::<f32>(block * heads * v)?;
        let (h32, n32, lat32, rd32, w32, has_lo, lo_out) = (heads as u32, nope as u32, lat as u32, rd as u32, w as u32, ctx.lo as i32, two as i32);
        for k0 in (0..total).step_by(block) {
            let nk = block.min(total - k0);
            // k_nope [nk][heads][nope] = c · W_UK,hᵀ per head, v [nk][heads][v] = c · W_UV,hᵀ:
            // one product per latent part (the weights are bf16, exact).
            {
                let (pk, _gk) = k_nope.device_ptr_mut(&self.stream);
                let (pv, _gv) = vals.device_ptr_mut(&self.stream);
                for (i, c) in latents.into_iter().flatten().enumerate() {
                    let c = c + (k0 * w * 2) as u64;
                    self.gemm_bf16(Gemm { ta: false, m: nope, n: nk, k: lat, a: (puk, nope, (lat * nope) as i64), b: (c, w, 0), c: (pk, heads * nope, nope as i64), batch: heads, accumulate: i > 0 })?;
                    self.gemm_bf16(Gemm { ta: true, m: v, n: nk, k: lat, a: (puv, lat, (v * lat) as i64), b: (c, w, 0), c: (pv, heads * v, v as i64), batch: heads, accumulate: i > 0 })?;
                }
            }
            // k_nope split and the shared rotary key copied; the values split.
            let (mut hi, mut lo) = k.split_at_mut(kn);
            let block_lo = if two { k0 * heads * kw..(k0 + nk) * heads * kw } else { 0..1 };
            let (mut hi, mut lo) = (hi.slice_mut(k0 * heads * kw..(k0 + nk) * heads * kw), lo.slice_mut(block_lo));
            let c_hi = ctx.c.slice(k0 * w..(k0 + nk) * w);
            let c_lo = if ctx.lo { ctx.c.slice((total + k0) * w..(total + k0 + nk) * w) } else { ctx.c.slice(k0 * w..(k0 + nk) * w) };
            let mut b = self.stream.launch_builder(self.func("mla_k_split"));
            b.arg(&k_nope).arg(&c_hi).arg(&c_lo).arg(&has_lo).arg(&mut hi).arg(&mut lo).arg(&h32).arg(&n32).arg(&lat32).arg(&rd32).arg(&w32).arg(&lo_out);
            unsafe { b.launch(cfg(nk * heads, 0)) }.map_err(dev)?;
            let (mut vhi, mut vlo) = vp.split_at_mut(vn);
            let mut vhi = vhi.slice_mut(k0 * heads * v..(k0 + nk) * heads * v);
            let n64 = (nk * heads * v) as i64;
            let mut b = self.stream.launch_builder(self.func(if two { "cast_f32_bf16_split" } else { "cast_f32_bf16" }));
            b.arg(&vals).arg(&mut vhi);
            let mut vlo = two.then(|| vlo.slice_mut(k0 * heads * v..(k0 + nk) * heads * v));
            if let Some(vlo) = vlo.as_mut() {
                b.arg(vlo);
            }
            b.arg(&n64);
            unsafe { b.launch(crate::ops::flat((nk * heads * v).div_ceil(4))) }.map_err(dev)?;
            // four values a thread
        }
        drop((k_nope, vals));
        let rh = run.len * heads;
        let (pk, _gk) = k.device_ptr(&self.stream);
        let (pvp, _gvp) = vp.device_ptr(&self.stream);
        let (po, _go) = out.device_ptr_mut(&self.stream);
        let keys = Parts { hi: pk, lo: two.then_some(pk + (kn * 2) as u64), ld: heads * kw, head: kw as i64 };
        let values = Parts { hi: pvp, lo: two.then_some(pvp + (vn * 2) as u64), ld: heads * v, head: v as i64 };
        let out = Parts { hi: po + (run.start * heads * v * 4) as u64, lo: None, ld: heads * v, head: v as i64 };
        // The one-part rows in one pass from the f32 queries; the queries split into parts
        // only for the rows left (a precise tail, or every row where the kernel does not apply).
        let mut from = 0;
        if split > 0 && self.flash_applies(nope, rd, v) {
            let (qn, _gn) = q_nope.device_ptr(&self.stream);
            let (qp, _gp) = q_pe.device_ptr(&self.stream);
            let q = (qn + (run.start * heads * nope * 4) as u64, qp + (run.start * heads * rd * 4) as u64);
            self.flash(pk, q, pvp, out, heads, ctx.ctx0, split, scale)?;
            from = split;
        }
        if from == run.len {
            return Ok(());
        }
        let q = self.split_queries(q_nope, nope, q_pe, rd, run, heads)?;
        let (pq, _gq) = q.device_ptr(&self.stream);
        let queries = Parts { hi: pq, lo: Some(pq + (rh * kw * 2) as u64), ld: heads * kw, head: kw as i64 };
        self.attend(keys, kw, queries, values, v, out, heads, ctx.ctx0, (from, run.len, split), scale)
    }
}

/// `kernels/mla_flash.cu`'s shape: query rows per block, key width (and its non-rotary part),
/// value width.
const FLASH_ROWS: usize = 64;
const FLASH_KW: usize = 192;
const FLASH_NOPE: usize = 128;
const FLASH_VW: usize = 128;

/// `mla_flash_bf16`'s shared bytes (`FA_SMEM_BYTES`: the query tile and two stages of keys and
/// values, rows padded by 8), with the keys per tile it was compiled for (`WEFT_FA_BN`).
fn flash_smem() -> u32 {
    static BYTES: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let keys = crate::kernel_define("WEFT_FA_BN").and_then(|v| v.parse().ok()).unwrap_or(64u32);
        2 * (FLASH_ROWS as u32 * (FLASH_KW as u32 + 8) + 2 * keys * (FLASH_KW as u32 + 8 + FLASH_VW as u32 + 8))
    })
}

/// A run's gathered context: `c` holds `[total][w]` bf16 values, then (`lo`) the second parts.
struct Context {
    c: CudaSlice<u16>,
    ctx0: usize,
    total: usize,
    lo: bool,
}

/// A GEMM operand in bf16 parts: device addresses of the first and (if any) second part, the
/// elements between rows (`ld`) and between heads (`head`; 0: shared by every head).
#[derive(Clone, Copy)]
struct Parts {
    hi: u64,
    lo: Option<u64>,
    ld: usize,
    head: i64,
}

/// The products that make an f32-grade result from parts: hi·hi, hi·lo, lo·hi (the lo·lo term
/// is below f32 rounding), leaving out those with an absent part.
fn products(a: Parts, b: Parts) -> Vec<(u64, u64)> {
    let mut v = vec![(a.hi, b.hi)];
    v.extend(b.lo.map(|lo| (a.hi, lo)));
    v.extend(a.lo.map(|lo| (lo, b.hi)));
    v
}

/// `mla_attention_heads`'s operands.
#[derive(Clone, Copy)]
pub(crate) struct HeadsArgs<'a> {
    pub pool: &'a CudaKvPool,
    pub layer: usize,
    pub q_nope: &'a CudaSlice<f32>,
    pub q_pe: &'a CudaSlice<f32>,
    pub w_uk_t: &'a CudaMatrix,
    pub w_uv: &'a CudaMatrix,
    pub heads: usize,
    pub rows: &'a [AttnRow<'a>],
    pub scale: f32,
}

/// Rows of `0..n` outside `runs` (sorted, disjoint).
fn outside(runs: &[Run], n: usize) -> Vec<u32> {
    let mut others = Vec::new();
    let mut next = runs.iter().peekable();
    let mut i = 0;
    while i < n {
        match next.peek() {
            Some(r) if r.start == i => {
                i += r.len;
                next.next();
            }
            _ => {
                others.push(i as u32);
                i += 1;
            }
        }
    }
    others
}

impl CudaBackend {
    /// `mla_attention` when the step has long runs: those through `mla_run`, the other rows
    /// gathered, through the decode kernels, and scattered back.
    pub(crate) fn mla_with_runs(&self, a: MlaArgs<'_>, runs: &[Run]) -> Result<CudaSlice<f32>> {
        let MlaArgs { pool, q_lat, q_pe, heads, rows, .. } = a;
        let l = pool.layout;
        let width = heads * l.latent_dim;
        let mut out = self.out(rows.len() * width)?;
        for &run in runs {
            self.mla_run(a, run, &mut out)?;
        }
        let others = outside(runs, rows.len());
        if others.is_empty() {
            return Ok(out);
        }
        use weft_backend::Backend;
        let sub: Vec<AttnRow<'_>> = others.iter().map(|&i| rows[i as usize]).collect();
        let ql = self.gather_rows(q_lat, width, &others)?;
        let qp = self.gather_rows(q_pe, heads * l.rope_dim, &others)?;
        // The other rows' block tables, their offsets, lengths and places: one upload.
        let [bt, off, ctx] = crate::graphs::pack_tables(&sub);
        let (nb, no) = (bt.len(), off.len());
        let packed = self.up_u32(&[&bt[..], &off, &ctx, &others].concat())?;
        let (bt, off, ctx, idx) = (packed.slice(..nb), packed.slice(nb..nb + no), packed.slice(nb + no..nb + 2 * no), packed.slice(nb + 2 * no..));
        let o = self.mla_kernels(MlaArgs { q_lat: &ql, q_pe: &qp, rows: &sub, ..a }, [&bt, &off, &ctx])?;
        self.scatter_into(&o, &idx, &mut out, width, others.len())?;
        Ok(out)
    }

    fn scatter_into(&self, x: &CudaSlice<f32>, idx: &CudaView<'_, u32>, out: &mut CudaSlice<f32>, width: usize, n: usize) -> Result<()> {
        let d = width as u32;
        let mut b = self.stream.launch_builder(self.func("scatter_rows"));
        b.arg(x).arg(idx).arg(out).arg(&d);
        unsafe { b.launch(cfg(n, 0)) }.map_err(dev)?;
        Ok(())
    }

    /// `mla_attention_heads` through decompressed keys and values for the step's long runs
    /// (the other rows absorbed, scattered back); `None` where it does not apply: no long runs,
    /// the path off, up-projections not bf16, or a run's decompressed context past
    /// `mla_decompress_bytes`. Shapes are checked by the caller.
    pub(crate) fn mla_heads_with_runs(&self, a: HeadsArgs<'_>) -> Result<Option<CudaSlice<f32>>> {
        let HeadsArgs { pool, layer, q_nope, q_pe, w_uk_t, w_uv, heads, rows, scale } = a;
        let bf16 = |m: &CudaMatrix| m.fp8.is_none() && m.f32_data.is_none();
        if !self.mla_decompress || !bf16(w_uk_t) || !bf16(w_uv) {
            return Ok(None);
        }
        let runs = self.mla_gemm_runs(rows);
        let l = pool.layout;
        let (nope, v) = (w_uk_t.cols, w_uv.rows / heads);
        // Keys and values in one or two bf16 parts (the f32 products are made in blocks of keys).
        let bytes = |r: &Run| {
            let parts = if self.run_precise_tail(rows.len(), *r) > 0 { 2 } else { 1 };
            (rows[r.start].ctx_len - 1 + r.len) * heads * parts * 2 * (nope + l.rope_dim + v)
        };
        if runs.is_empty() || runs.iter().any(|r| bytes(r) > self.mla_decompress_bytes) {
            return Ok(None);
        }
        let width = heads * v;
        let mut out = self.out(rows.len() * width)?;
        for &run in &runs {
            self.mla_run_heads(a, run, &mut out)?;
        }
        let others = outside(&runs, rows.len());
        if others.is_empty() {
            return Ok(Some(out));
        }
        use weft_backend::Backend;
        let sub: Vec<AttnRow<'_>> = others.iter().map(|&i| rows[i as usize]).collect();
        let qn = self.gather_rows(q_nope, heads * nope, &others)?;
        let qp = self.gather_rows(q_pe, heads * l.rope_dim, &others)?;
        let q_lat = self.head_linear(&qn, heads, w_uk_t)?;
        let o_lat = self.mla_attention(pool, layer, &q_lat, &qp, heads, &sub, scale)?;
        let o = self.head_linear(&o_lat, heads, w_uv)?;
        let idx = self.up_u32(&others)?;
        self.scatter_into(&o, &idx.slice(..), &mut out, width, others.len())?;
        Ok(Some(out))
    }
}
