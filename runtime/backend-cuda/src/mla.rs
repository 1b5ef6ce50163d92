//! Split-context MLA attention (`kernels/mla.cu`): the launch shape (head groups, context
//! splits sized so the whole GPU is busy even for one decoding sequence) and the merge of the
//! splits. The single-pass kernel in `weft.cu` remains for shapes this one does not take.

use crate::{dev, CudaBackend, CudaKvPool};
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use weft_backend::{AttnRow, Result};

/// Tokens per shared-memory tile and heads per block (`MLA_T`, `MLA_HG` in mla.cu).
const TILE: usize = 16;
const HEAD_GROUP: usize = 16;
const THREADS: u32 = 256;

/// Heads per block: as few groups as keep each at most `HEAD_GROUP` heads, sized evenly (the
/// last may be smaller): 12 heads are one group of 12, 20 two of 10, 40 three of 14/14/12, 128
/// eight of 16 — so the head counts tensor parallelism leaves (8, 12, 16, 64, 128 and any
/// other) need neither padding nor a slower kernel. Returns (groups, heads per group).
pub(crate) fn head_groups(heads: usize) -> (usize, usize) {
    head_groups_of(heads, HEAD_GROUP)
}

/// The same with groups of at most `most` heads.
fn head_groups_of(heads: usize, most: usize) -> (usize, usize) {
    let groups = heads.div_ceil(most.max(1)).max(1);
    let size = heads.div_ceil(groups).max(1);
    (heads.div_ceil(size).max(1), size)
}

/// One MLA attention call's inputs (`Backend::mla_attention`'s arguments), as the paths that
/// serve it (decode kernels here, GEMMs in `mla_prefill.rs`) pass them on.
#[derive(Clone, Copy)]
pub(crate) struct MlaArgs<'a> {
    pub pool: &'a CudaKvPool,
    pub layer: usize,
    pub q_lat: &'a CudaSlice<f32>,
    pub q_pe: &'a CudaSlice<f32>,
    pub heads: usize,
    pub rows: &'a [AttnRow<'a>],
    pub scale: f32,
}

impl CudaBackend {
    fn mla_smem(&self, width: usize, hg: usize) -> usize {
        (hg * width + TILE * (width + 4) + HEAD_GROUP * TILE + 3 * HEAD_GROUP) * 4
    }

    /// Whether the split kernel takes this shape (latent ≤ 2 × threads, latent and rope widths
    /// in whole float4s, tiles fit in shared memory). Any head count does.
    pub(crate) fn mla_split_fits(&self, pool: &CudaKvPool, heads: usize) -> bool {
        let l = pool.layout;
        !self.slow_paths && heads > 0 && l.latent_dim <= 2 * THREADS as usize && l.latent_dim % 4 == 0 && l.rope_dim % 4 == 0 && self.mla_smem(l.width(), head_groups(heads).1) <= self.smem_optin
    }

    /// `tables`: the rows' concatenated block tables, their offsets and visible lengths.
    pub(crate) fn mla_split(&self, a: MlaArgs<'_>, tables: [&CudaView<'_, u32>; 3]) -> Result<CudaSlice<f32>> {
        let MlaArgs { pool, layer, q_lat, q_pe, heads, rows, scale } = a;
        let l = pool.layout;
        let (mut groups, mut hg) = head_groups(heads);
        // While a step is recorded, sized for its context bucket (the graph serves every step
        // up to it; splits past a row's context are empty).
        let max_ctx = self.split_context(rows.iter().map(|r| r.ctx_len).max().unwrap_or(1));
        // A few rows of short context leave SMs idle even at one tile per split: halve the head
        // groups (down to `mla_min_group` heads) so that more, shorter blocks share the work.
        let tiles = max_ctx.div_ceil(TILE);
        while rows.len() * groups * tiles < self.num_sms && hg / 2 >= self.mla_min_group {
            (groups, hg) = head_groups_of(heads, hg / 2);
        }
        // Enough blocks for a few waves over every SM; each split at least one tile.
        let base = rows.len() * groups;
        let want = (self.mla_waves * self.num_sms).div_ceil(base.max(1));
        let mut nsplit = want.clamp(1, max_ctx.div_ceil(TILE));
        let chunk = (max_ctx.div_ceil(nsplit).div_ceil(TILE) * TILE).max(self.mla_split_tiles * TILE);
        nsplit = max_ctx.div_ceil(chunk);
        let parts = rows.len() * heads * nsplit;
        let mut o_part = self.out(parts * l.latent_dim)?;
        let mut ml_part = self.out(parts * 2)?;
        let stride = l.num_pages * l.page_size * l.width();
        let view = pool.data.slice(layer * stride..(layer + 1) * stride);
        let (h32, g32, gs, lat, rd, ps, ch) = (heads as u32, groups as u32, hg as u32, l.latent_dim as u32, l.rope_dim as u32, l.page_size as u32, chunk as u32);
        let smem = self.mla_smem(l.width(), hg) as u32;
        let mut b = self.stream.launch_builder(self.func("mla_decode"));
        b.arg(&view).arg(q_lat).arg(q_pe).arg(tables[0]).arg(tables[1]).arg(tables[2]).arg(&mut o_part).arg(&mut ml_part).arg(&h32).arg(&g32).arg(&gs).arg(&lat).arg(&rd).arg(&ps).arg(&scale).arg(&ch);
        unsafe { b.launch(LaunchConfig { grid_dim: (base as u32, nsplit as u32, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: smem }) }.map_err(dev)?;
        let mut out = self.out(rows.len() * heads * l.latent_dim)?;
        let ns = nsplit as u32;
        let mut b = self.stream.launch_builder(self.func("mla_combine"));
        b.arg(&o_part).arg(&ml_part).arg(&mut out).arg(&ns).arg(&lat);
        // Shared memory: the block's reduction scratch, then one weight per split.
        let smem = ((THREADS as usize + nsplit) * 4) as u32;
        unsafe { b.launch(LaunchConfig { grid_dim: ((rows.len() * heads) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: smem }) }.map_err(dev)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn head_groups_cover_every_head_once_within_the_kernel_limit() {
        for heads in 1..=160 {
            let (groups, size) = super::head_groups(heads);
            assert!(size <= super::HEAD_GROUP && size > 0, "{heads}: group size {size}");
            assert!(groups * size >= heads && (groups - 1) * size < heads, "{heads}: {groups} groups of {size}");
        }
        assert_eq!(super::head_groups(12), (1, 12));
        assert_eq!(super::head_groups(20), (2, 10));
        assert_eq!(super::head_groups(128), (8, 16));
    }
}
