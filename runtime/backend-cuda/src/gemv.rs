//! Weight-streaming linear layers for decode-sized batches (`kernels/gemv.cu`): one sub-group
//! per weight row, so a step reads each weight once whatever the batch's few rows are; bf16 or
//! fp8 weights read in their stored format. Larger batches go to cuBLAS (`ops.rs`), fp8
//! weights through a bf16 scratch copy (`dequant`).

use crate::ops::flat;
use crate::{dev, CudaBackend, CudaMatrix};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use weft_backend::Result;

/// Largest batch the bf16 weight-streaming path takes (beyond it tensor cores win).
pub const GEMV_MAX_M_BF16: usize = 8;
/// fp8 weights stay on the weight-streaming path longer: the alternative first writes a bf16
/// copy of the weight (3 extra bytes of traffic per element).
pub const GEMV_MAX_M_FP8: usize = 32;
const THREADS: u32 = 256;

impl CudaBackend {
    /// Whether `w` can be multiplied by `m` activation rows on the weight-streaming path.
    pub(crate) fn gemv_fits(&self, w: &CudaMatrix, m: usize) -> bool {
        if self.slow_paths || w.f32_data.is_some() || m == 0 {
            return false;
        }
        match &w.fp8 {
            Some(f) => m <= GEMV_MAX_M_FP8 && w.cols % 16 == 0 && f.block_cols % 16 == 0,
            None => m <= GEMV_MAX_M_BF16 && w.cols % 8 == 0,
        }
    }

    /// `out[i, r] = w[r, :] · x[i, g(r)*cols ..]`, rows in `groups` groups of `rows / groups`
    /// (the heads of a per-head linear; 1 for a plain linear), x rows `groups * cols` wide.
    pub(crate) fn gemv(&self, w: &CudaMatrix, x: &CudaSlice<f32>, m: usize, groups: usize) -> Result<CudaSlice<f32>> {
        let mut out = self.out(m * w.rows)?;
        let warps = (THREADS / crate::SUBGROUP) as usize;
        let cfg = LaunchConfig { grid_dim: (w.rows.div_ceil(warps) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let (m32, rows, cols, grp, xs) = (m as u32, w.rows as u32, w.cols as u32, (w.rows / groups) as u32, (groups * w.cols) as u32);
        match &w.fp8 {
            None => {
                let mut l = self.stream.launch_builder(self.func("gemv_bf16"));
                l.arg(&w.data).arg(x).arg(&mut out).arg(&m32).arg(&rows).arg(&cols).arg(&grp).arg(&xs);
                unsafe { l.launch(cfg) }.map_err(dev)?;
            }
            Some(f) => {
                let (sc_cols, br, bc) = (f.grid_cols(w.cols) as u32, f.block_rows as u32, f.block_cols as u32);
                let mut l = self.stream.launch_builder(self.func("gemv_fp8"));
                l.arg(&f.bytes).arg(&f.scales).arg(&sc_cols).arg(&br).arg(&bc).arg(x).arg(&mut out).arg(&m32).arg(&rows).arg(&cols).arg(&grp).arg(&xs);
                unsafe { l.launch(cfg) }.map_err(dev)?;
            }
        }
        Ok(out)
    }

    /// A bf16 copy of an fp8 weight (scratch for the cuBLAS path).
    pub(crate) fn dequant(&self, w: &CudaMatrix) -> Result<Option<CudaSlice<u16>>> {
        let Some(f) = &w.fp8 else { return Ok(None) };
        let n = w.rows * w.cols;
        let mut out = unsafe { self.stream.alloc::<u16>(n.max(1)) }.map_err(dev)?;
        let (sc_cols, br, bc, rows, cols) = (f.grid_cols(w.cols) as u32, f.block_rows as u32, f.block_cols as u32, w.rows as u32, w.cols as u32);
        let mut l = self.stream.launch_builder(self.func("dequant_fp8_bf16"));
        l.arg(&f.bytes).arg(&f.scales).arg(&sc_cols).arg(&br).arg(&bc).arg(&mut out).arg(&rows).arg(&cols);
        unsafe { l.launch(flat(n)) }.map_err(dev)?;
        Ok(Some(out))
    }
}
