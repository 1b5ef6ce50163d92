//! Dense GEMMs through cuBLAS (prefill-sized batches, and the per-head products past the
//! weight-streaming paths): bf16 weights against activations split into two bf16 parts
//! (`to_bf16_parts`: the rounding, then its error — f32-grade products on bf16 tensor cores),
//! the two parts of a few rows stacked into one GEMM where they can be (`stacks`; `halves.rs`
//! adds the halves), f32 weights (the router) as f32 × f32.

use crate::ops::{flat, shape};
use crate::{dev, CudaBackend, CudaMatrix};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use std::ffi::c_void;
use weft_backend::Result;

/// The device copy of a weight a GEMM reads.
enum Weight<'a> {
    Bf16(&'a CudaSlice<u16>),
    F32(&'a CudaSlice<f32>),
}

/// A GEMM's activations: f32, or already split into bf16 parts (`to_bf16_parts`).
#[derive(Clone, Copy)]
pub(crate) enum Act<'a> {
    F32(&'a CudaSlice<f32>),
    Parts(&'a CudaSlice<u16>),
}

impl CudaBackend {
    fn to_bf16(&self, x: &CudaSlice<f32>, n: usize) -> Result<CudaSlice<u16>> {
        let mut y = self.alloc::<u16>(n)?;
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(self.func("cast_f32_bf16"));
        l.arg(x).arg(&mut y).arg(&n64);
        unsafe { l.launch(flat(n.div_ceil(4))) }.map_err(dev)?;
        Ok(y)
    }

    /// x as bf16 (`gemm_split`: its rounding, then the rounding's error — `2n` values; with
    /// `lo` false the rounding alone, `n` values: no row takes the second part, `precision.rs`).
    pub(crate) fn to_bf16_parts(&self, x: &CudaSlice<f32>, n: usize, lo: bool) -> Result<CudaSlice<u16>> {
        if !self.gemm_split || !lo {
            return self.to_bf16(x, n);
        }
        let mut y = self.alloc::<u16>(2 * n.max(1))?;
        let n64 = n as i64;
        {
            let (mut hi, mut lo) = y.split_at_mut(n.max(1));
            let mut l = self.stream.launch_builder(self.func("cast_f32_bf16_split"));
            l.arg(x).arg(&mut hi).arg(&mut lo).arg(&n64);
            unsafe { l.launch(flat(n.div_ceil(4))) }.map_err(dev)?;
        }
        Ok(y)
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` (batched over `batch` heads with the given strides):
    /// bf16 × bf16 when the weight is bf16 (activations in two bf16 parts, two passes, unless
    /// `gemm_split` is off), else f32 × f32 (no TF32: the handle's default math mode); f32
    /// accumulation and output either way.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(&self, wm: &CudaMatrix, x: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: usize, m: usize, k: usize, batch: usize, ldb: usize, ldc: usize) -> Result<()> {
        self.gemm_from(wm, Act::F32(x), out, [n, m, k, batch, ldb, ldc], false)
    }

    /// [`Self::gemm`] of activations given as f32 or already as their bf16 parts
    /// (`to_bf16_parts`; bf16 weights only), `[n, m, k, batch, ldb, ldc]`; `accumulate` adds
    /// the product to `out` instead of overwriting it.
    pub(crate) fn gemm_from(&self, wm: &CudaMatrix, x: Act<'_>, out: &mut CudaSlice<f32>, dims: [usize; 6], accumulate: bool) -> Result<()> {
        self.gemm_core(wm, x, out, dims, accumulate, false)
    }

    /// Whether [`Self::gemm_from`] multiplies the two parts as one GEMM of 2m stacked rows
    /// (a plain linear of a few rows, every row taking the second part, bf16 weights).
    pub(crate) fn stacks(&self, wm: &CudaMatrix, dims: [usize; 6], accumulate: bool) -> bool {
        self.stacks_with(wm, dims, accumulate, &self.lo_ranges(dims[1]))
    }

    /// [`Self::stacks`] given the rows' `lo_ranges` (already taken by `gemm_core`).
    fn stacks_with(&self, wm: &CudaMatrix, dims: [usize; 6], accumulate: bool, lo_ranges: &[(usize, usize)]) -> bool {
        let [n, m, k, batch, ldb, ldc] = dims;
        wm.f32_data.is_none() && !accumulate && batch == 1 && ldb == k && ldc == n && m > 0 && m <= self.gemm_stack_max_m && lo_ranges == [(0, m)]
    }

    /// [`Self::gemm_from`]; with `halves`, where it stacks (`stacks`), the GEMM's `[2m, n]`
    /// output goes to `out` as it is, its halves left for the caller to add (`halves.rs`).
    pub(crate) fn gemm_core(&self, wm: &CudaMatrix, x: Act<'_>, out: &mut CudaSlice<f32>, dims: [usize; 6], accumulate: bool, halves: bool) -> Result<()> {
        let [n, m, k, batch, ldb, ldc] = dims;
        let scratch = if wm.f32_data.is_none() { self.dequant(wm)? } else { None };
        let w = match (&wm.f32_data, &scratch) {
            (Some(f), _) => Weight::F32(f),
            (None, Some(b)) => Weight::Bf16(b),
            (None, None) => Weight::Bf16(&wm.data),
        };
        let xb;
        let (pa, _ga, pb, _gb, ty);
        // Passes: (first row, rows, activation part offset in elements); the second part over
        // the rows that take it (`lo_ranges`).
        let lo_ranges = self.lo_ranges(m);
        let mut passes = vec![(0usize, m, 0usize)];
        match (w, x) {
            (Weight::Bf16(wb), x) => {
                let nx = m * batch * k;
                xb = match x {
                    Act::F32(x) => Some(self.to_bf16_parts(x, nx, !lo_ranges.is_empty())?),
                    Act::Parts(_) => None,
                };
                passes.extend(lo_ranges.iter().map(|&(a, b)| (a, b - a, nx.max(1))));
                (pa, _ga) = wb.device_ptr(&self.stream);
                (pb, _gb) = match (&xb, x) {
                    (Some(b), _) => b.device_ptr(&self.stream),
                    (None, Act::Parts(p)) => p.device_ptr(&self.stream),
                    (None, Act::F32(_)) => unreachable!("f32 activations were split above"),
                };
                ty = cudaDataType::CUDA_R_16BF;
            }
            (Weight::F32(wf), Act::F32(x)) => {
                (pa, _ga) = wf.device_ptr(&self.stream);
                (pb, _gb) = x.device_ptr(&self.stream);
                ty = cudaDataType::CUDA_R_32F;
            }
            (Weight::F32(_), Act::Parts(_)) => return Err(shape("gemm", "bf16 activation parts with f32 weights".into())),
        }
        let elem = if ty == cudaDataType::CUDA_R_16BF { 2 } else { 4 };
        // Two parts of a few rows (a plain linear): one GEMM over the parts stacked as 2m rows
        // (they lie one after the other, `m * ldb` elements apart), then add the halves.
        let stack = passes.len() == 2 && self.stacks_with(wm, dims, accumulate, &lo_ranges);
        if halves && (!stack || out.len() < 2 * m * n) {
            return Err(shape("gemm", format!("{m} rows x {n} as halves: the product does not stack into {} values", out.len())));
        }
        let mut stacked = if stack && !halves { Some(self.alloc::<f32>(2 * m * n)?) } else { None };
        {
            let blas = self.blas.lock().unwrap();
            let (pc, _gc) = match stacked.as_mut() {
                Some(st) => st.device_ptr_mut(&self.stream),
                None => out.device_ptr_mut(&self.stream),
            };
            let runs: Vec<(usize, usize, usize)> = if stack { vec![(0, 2 * m, 0)] } else { passes };
            for (i, &(row0, rows, off)) in runs.iter().enumerate() {
                let (alpha, beta) = (1.0f32, if i == 0 && !accumulate { 0.0f32 } else { 1.0 });
                unsafe {
                    cudarc::cublas::result::gemm_strided_batched_ex(
                        *blas.handle(),
                        cublasOperation_t::CUBLAS_OP_T,
                        cublasOperation_t::CUBLAS_OP_N,
                        n as i32,
                        rows as i32,
                        k as i32,
                        &alpha as *const f32 as *const c_void,
                        pa as *const c_void,
                        ty,
                        k as i32,
                        (n * k) as i64,
                        (pb + ((off + row0 * ldb) * elem) as u64) as *const c_void,
                        ty,
                        ldb as i32,
                        k as i64,
                        &beta as *const f32 as *const c_void,
                        (pc + (row0 * ldc * 4) as u64) as *mut c_void,
                        cudaDataType::CUDA_R_32F,
                        ldc as i32,
                        n as i64,
                        batch as i32,
                        cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(dev)?;
            }
        }
        if let Some(st) = &stacked {
            self.add_halves(st, out, m * n)?;
        }
        Ok(())
    }
}
