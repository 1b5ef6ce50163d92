//! MLA attention for prefill chunks (NVIDIA): a long run of one sequence's query rows attends
//! through cuBLAS on tensor cores instead of the decode kernel, which re-reads the whole context
//! for every row (1.47 ms per Moonlight layer for a 1024-token prompt, against 21 µs for
//! PyTorch's SDPA on the decompressed heads; results/roofline-h200.md).
//!
//! Per run: the context gathered from its pages and the queries as two bf16 parts each
//! (`mla_gather_split`, `mla_q_split` in kernels/mla.cu), scores `S = Q·Cᵀ` as three products
//! (hi·hi + lo·hi + hi·lo, f32 accumulation), a causal softmax whose weights are split again,
//! and `O = P·C_lat` as three products written straight into the op's output rows. Rows outside
//! long runs (decodes, short chunks, speculative verification) take the decode kernel. Query rows
//! go in tiles so the score buffers stay within the backend's `mla_score_bytes` (1 GiB).

use crate::mla::MlaArgs;
use crate::ops::cfg;
use crate::{dev, CudaBackend};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use std::ffi::c_void;
use weft_backend::{AttnRow, Result};

/// Rows `start..start + len` of a step: one sequence's consecutive positions (same block table,
/// each row seeing one more token than the one before).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub start: usize,
    pub len: usize,
}

/// The step's runs of at least `min` rows.
pub(crate) fn long_runs(rows: &[AttnRow<'_>], min: usize) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=rows.len() {
        let continues = i < rows.len() && {
            let (a, b) = (&rows[i - 1], &rows[i]);
            std::ptr::eq(a.block_table, b.block_table) && b.ctx_len == a.ctx_len + 1
        };
        if !continues {
            if i - start >= min {
                runs.push(Run { start, len: i - start });
            }
            start = i;
        }
    }
    runs
}

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

    /// Attention of `run`'s rows into their rows of `out` (`[rows][heads][latent]`).
    pub(crate) fn mla_run(&self, a: MlaArgs<'_>, run: Run, out: &mut CudaSlice<f32>) -> Result<()> {
        let MlaArgs { pool, layer, q_lat, q_pe, heads, rows, scale } = a;
        let l = pool.layout;
        let (lat, rd, w) = (l.latent_dim, l.rope_dim, l.width());
        let first = &rows[run.start];
        let ctx0 = first.ctx_len - 1; // context before the run's first row
        let total = ctx0 + run.len;
        let table = self.up_u32(&first.block_table[..total.div_ceil(l.page_size)])?;
        let view = pool.layer(layer);
        // Context parts [T][w] and query parts [run rows · heads][w]. A bf16 cache is its own
        // first part and has no second: the products with it are left out.
        let bf = pool.bf16();
        let mut c = self.alloc::<u16>(if bf { total * w } else { 2 * total * w })?;
        {
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
        }
        let products = if bf { 2 } else { 3 };
        let rh = run.len * heads;
        let mut q = self.alloc::<u16>(2 * rh * w)?;
        {
            let ql = q_lat.slice(run.start * heads * lat..(run.start + run.len) * heads * lat);
            let qp = q_pe.slice(run.start * heads * rd..(run.start + run.len) * heads * rd);
            let (mut hi, mut lo) = q.split_at_mut(rh * w);
            let (lat32, rd32) = (lat as u32, rd as u32);
            let mut b = self.stream.launch_builder(self.func("mla_q_split"));
            b.arg(&ql).arg(&qp).arg(&mut hi).arg(&mut lo).arg(&lat32).arg(&rd32);
            unsafe { b.launch(cfg(rh, 0)) }.map_err(dev)?;
        }
        let (pc, _gc) = c.device_ptr(&self.stream);
        let (pq, _gq) = q.device_ptr(&self.stream);
        let (c_hi, c_lo) = (pc, pc + (total * w * 2) as u64);
        let (q_hi, q_lo) = (pq, pq + (rh * w * 2) as u64);
        let (po, _go) = out.device_ptr_mut(&self.stream);
        // Query tiles: at most `mla_score_bytes` of scores (4 bytes) and split weights (2 × 2).
        let tile = (self.mla_score_bytes / (8 * heads * total)).clamp(1, run.len);
        let mut i0 = 0;
        while i0 < run.len {
            let r = tile.min(run.len - i0);
            let t = ctx0 + i0 + r; // context the tile's last row sees
            let mut s = self.alloc::<f32>(heads * r * t)?;
            let ps = {
                let (p, _g) = s.device_ptr_mut(&self.stream);
                p
            };
            // S_h [r × t] = Q_h · C[..t]ᵀ: per head, query rows are `heads · w` apart.
            let qrow = (i0 * heads * w * 2) as u64;
            for (i, (a, b)) in [(c_hi, q_hi), (c_hi, q_lo), (c_lo, q_hi)].into_iter().take(products).enumerate() {
                self.gemm_bf16(Gemm { ta: true, m: t, n: r, k: w, a: (a, w, 0), b: (b + qrow, heads * w, w as i64), c: (ps, t, (r * t) as i64), batch: heads, accumulate: i > 0 })?;
            }
            let mut p = self.alloc::<u16>(2 * heads * r * t)?;
            {
                let (mut hi, mut lo) = p.split_at_mut(heads * r * t);
                let (r32, t32, c32) = (r as u32, t as u32, (ctx0 + i0) as u32);
                let mut b = self.stream.launch_builder(self.func("mla_softmax_split"));
                b.arg(&s).arg(&mut hi).arg(&mut lo).arg(&r32).arg(&t32).arg(&c32).arg(&scale);
                unsafe { b.launch(cfg(heads * r, 0)) }.map_err(dev)?;
            }
            let (pp, _gp) = p.device_ptr(&self.stream);
            let (p_hi, p_lo) = (pp, pp + (heads * r * t * 2) as u64);
            // O_h [r × lat] = P_h · C[..t, ..lat], written into rows start + i0.. of `out`.
            let orow = po + (((run.start + i0) * heads * lat) * 4) as u64;
            for (i, (a, b)) in [(c_hi, p_hi), (c_hi, p_lo), (c_lo, p_hi)].into_iter().take(products).enumerate() {
                self.gemm_bf16(Gemm { ta: false, m: lat, n: r, k: t, a: (a, w, 0), b: (b, t, (r * t) as i64), c: (orow, heads * lat, lat as i64), batch: heads, accumulate: i > 0 })?;
            }
            i0 += r;
        }
        Ok(())
    }
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
        let mut others: Vec<u32> = Vec::new();
        let mut next = runs.iter().peekable();
        let mut i = 0;
        while i < rows.len() {
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
        let d = width as u32;
        let mut b = self.stream.launch_builder(self.func("scatter_rows"));
        b.arg(&o).arg(&idx).arg(&mut out).arg(&d);
        unsafe { b.launch(cfg(others.len(), 0)) }.map_err(dev)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_are_consecutive_rows_of_one_table() {
        let (a, b) = (vec![0u32, 1, 2], vec![3u32, 4]);
        let mut rows: Vec<AttnRow<'_>> = vec![AttnRow { block_table: &a, ctx_len: 9 }, AttnRow { block_table: &b, ctx_len: 4 }];
        rows.extend((0..5).map(|i| AttnRow { block_table: &a, ctx_len: 10 + i }));
        rows.push(AttnRow { block_table: &a, ctx_len: 14 }); // not one more: a new run
        rows.extend((0..3).map(|i| AttnRow { block_table: &b, ctx_len: 5 + i }));
        assert_eq!(long_runs(&rows, 3), vec![Run { start: 2, len: 5 }, Run { start: 8, len: 3 }]);
        assert_eq!(long_runs(&rows, 4), vec![Run { start: 2, len: 5 }]);
        assert!(long_runs(&rows[..2], 1).len() == 2);
    }
}
