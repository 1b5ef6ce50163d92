//! Grouped-query attention for draft models with ordinary attention (DFlash): storing K/V
//! rows into a [`weft_backend::KvLayout::gqa`] pool and attending over it (`kv_store_rows`,
//! `gqa_attention` in `kernels/weft.cu`), and joining buffers end to end.

use crate::graphs::StepArray;
use crate::{dev, CudaBackend, CudaKvPool};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use weft_backend::{AttnRow, BackendError, Result};

const THREADS: u32 = 256;

fn grid(n: usize, smem: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (n.max(1) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: smem }
}

impl CudaBackend {
    pub(crate) fn gqa_store(&self, pool: &mut CudaKvPool, layer: usize, k: &CudaSlice<f32>, v: &CudaSlice<f32>, slots: &[u32]) -> Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let l = pool.layout;
        let m = weft_backend::check_kv_store(l, layer, self.len(k), self.len(v), slots)?;
        let sb = self.step_array(StepArray::Slots, slots)?;
        let kw = (l.latent_dim / 2) as u32;
        let mut view = pool.layer_mut(layer);
        let mut b = self.stream.launch_builder(self.func("kv_store_rows"));
        b.arg(&mut view).arg(k).arg(v).arg(&*sb).arg(&kw);
        unsafe { b.launch(grid(m, 0)) }.map_err(dev)?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gqa(&self, pool: &CudaKvPool, layer: usize, q: &CudaSlice<f32>, heads: usize, kv_heads: usize, rows: &[AttnRow<'_>], scale: f32) -> Result<CudaSlice<f32>> {
        let l = pool.layout;
        let d = weft_backend::check_gqa(l, layer, self.len(q), heads, kv_heads, rows)?;
        if d > THREADS as usize {
            return Err(BackendError::Shape { op: "gqa_attention", reason: format!("head dimension {d} above {THREADS}") });
        }
        let mut out = self.out(rows.len() * heads * d)?;
        if rows.is_empty() {
            return Ok(out);
        }
        let [btb, offb, ctxb] = self.row_tables(rows)?;
        let view = pool.layer(layer);
        let (h, g, d32, kw, ps) = (heads as u32, (heads / kv_heads) as u32, d as u32, (l.latent_dim / 2) as u32, l.page_size as u32);
        let mut b = self.stream.launch_builder(self.func("gqa_attention"));
        b.arg(&view).arg(q).arg(&*btb).arg(&*offb).arg(&*ctxb).arg(&mut out).arg(&h).arg(&g).arg(&d32).arg(&kw).arg(&ps).arg(&scale);
        unsafe { b.launch(grid(rows.len() * heads, (d * 4) as u32)) }.map_err(dev)?;
        Ok(out)
    }

    /// Device-to-device copies into one new buffer (capturable: no host round trip).
    pub(crate) fn concat_bufs(&self, parts: &[&CudaSlice<f32>]) -> Result<CudaSlice<f32>> {
        let lens: Vec<usize> = parts.iter().map(|p| self.len(p)).collect();
        let mut out = self.out(lens.iter().sum())?;
        let mut at = 0;
        for (p, n) in parts.iter().zip(lens) {
            if n > 0 {
                self.stream.memcpy_dtod(&p.slice(0..n), &mut out.slice_mut(at..at + n)).map_err(dev)?;
            }
            at += n;
        }
        Ok(out)
    }
}
