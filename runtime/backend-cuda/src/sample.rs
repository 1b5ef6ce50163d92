//! The sampling front end on the device (`kernels/sample.cu`): token edits in place, then per
//! row the top-k candidates and the full-row log-sum-exp, so a step downloads `k` candidates
//! per sequence instead of the whole vocabulary (163,840 logits for Kimi / DeepSeek).

use crate::{dev, ops::flat, CudaBackend};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use weft_backend::front::{self, FrontOut, FrontRow, MAX_DEVICE_K};
use weft_backend::Result;

/// Threads per row of `front_topk` (a power of two, at most `MAX_DEVICE_K`).
const THREADS: u32 = 1024;
/// Matches FRONT_COPIES in kernels/sample.cu.
const HIST_COPIES: usize = 8;

impl CudaBackend {
    pub(crate) fn front(&self, logits: &mut CudaSlice<f32>, vocab: usize, rows: &[FrontRow]) -> Result<Vec<FrontOut>> {
        front::check("sampling_front", logits.len(), vocab, rows)?;
        if rows.is_empty() {
            return Ok(vec![]);
        }
        let edits: Vec<(u32, &front::TokenEdit)> = rows.iter().enumerate().flat_map(|(r, row)| row.edits.iter().map(move |e| (r as u32, e))).collect();
        if !edits.is_empty() {
            let row = self.up_u32(&edits.iter().map(|e| e.0).collect::<Vec<_>>())?;
            let tok = self.up_u32(&edits.iter().map(|e| e.1.token).collect::<Vec<_>>())?;
            let ban = self.up_u32(&edits.iter().map(|e| e.1.banned as u32).collect::<Vec<_>>())?;
            let rep = self.up_f32(&edits.iter().map(|e| e.1.repetition).collect::<Vec<_>>())?;
            let sub = self.up_f32(&edits.iter().map(|e| e.1.subtract).collect::<Vec<_>>())?;
            let bias = self.up_f32(&edits.iter().map(|e| e.1.bias).collect::<Vec<_>>())?;
            let (n, v) = (edits.len() as u32, vocab as u32);
            let mut l = self.stream.launch_builder(self.func("front_edits"));
            l.arg(&mut *logits).arg(&row).arg(&tok).arg(&rep).arg(&sub).arg(&bias).arg(&ban).arg(&n).arg(&v);
            unsafe { l.launch(flat(edits.len())) }.map_err(dev)?;
        }
        let ks: Vec<u32> = rows.iter().map(|r| r.k as u32).collect();
        let scales: Vec<f32> = rows.iter().map(FrontRow::scale).collect();
        let mut offsets = Vec::with_capacity(rows.len());
        let mut total = 0u32;
        for &k in &ks {
            offsets.push(total);
            total += 2 + 2 * k;
        }
        let (ks_d, scales_d, off_d) = (self.up_u32(&ks)?, self.up_f32(&scales)?, self.up_u32(&offsets)?);
        let mut out = unsafe { self.stream.alloc::<u32>(total as usize) }.map_err(dev)?;
        let smem = (MAX_DEVICE_K * 8 + HIST_COPIES * 256 * 4 + THREADS as usize * 4 + 16) as u32;
        let v = vocab as u32;
        let mut l = self.stream.launch_builder(self.func("front_topk"));
        l.arg(&*logits).arg(&ks_d).arg(&scales_d).arg(&off_d).arg(&mut out).arg(&v);
        unsafe { l.launch(LaunchConfig { grid_dim: (rows.len() as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: smem }) }.map_err(dev)?;
        self.no_capture("the sampling front end's candidates")?;
        let host = self.stream.clone_dtoh(&out).map_err(dev)?;
        Ok(rows
            .iter()
            .zip(&offsets)
            .map(|(r, &o)| {
                let o = &host[o as usize..];
                let finite = o[0] as usize;
                let n = r.k.min(finite);
                FrontOut { ids: o[2..2 + n].to_vec(), logits: o[2 + r.k..2 + r.k + n].iter().map(|&b| f32::from_bits(b)).collect(), logsumexp: f32::from_bits(o[1]), finite }
            })
            .collect())
    }
}
