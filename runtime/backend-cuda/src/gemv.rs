//! Weight-streaming linear layers for decode-sized batches (`kernels/gemv.cu`): a sub-group
//! per 1, 2 or 4 weight rows, so a step reads each weight once whatever the batch's few rows
//! are; bf16, fp8 and f32 (router) weights read in their stored format. Larger batches go to
//! cuBLAS (`ops.rs`), fp8 weights through a bf16 scratch copy (`dequant`).

use crate::ops::flat;
use crate::{dev, CudaBackend, CudaMatrix};
use cudarc::driver::{CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg};
use weft_backend::Result;

/// Largest batch the bf16 weight-streaming path takes (beyond it tensor cores win).
pub const GEMV_MAX_M_BF16: usize = 8;
/// fp8 weights stay on the weight-streaming path longer: the alternative first writes a bf16
/// copy of the weight (3 extra bytes of traffic per element).
pub const GEMV_MAX_M_FP8: usize = 32;
const THREADS: u32 = 256;
/// Largest batch the tensor-core weight-streaming kernels (`kernels/mma.cu`) take; beyond it
/// cuBLAS. They start at 2 rows (one row is the CUDA-core kernels' case; `WEFT_CUDA_MMA_MIN_M`
/// moves that, for measurements).
pub const MMA_MAX_M: usize = 64;
/// Most activation rows the tensor-core kernels take by default, for [bf16, fp8] weights. Past
/// 32 rows a bf16 matrix goes to cuBLAS: there each activation is re-read by every 32-row block
/// and the weights once per 32-row pass, and at 64 rows cuBLAS's two bf16 passes (plus the
/// split cast) take 15–29 µs where these took 20–45 µs per Moonlight projection; the step at
/// batch 64 went 21.4 → 19.5 ms (results/roofline-h200.md, round 7). The one-pass 64-row kernel
/// (`gemv_mma_bf16_n8`, optionally over clusters: `mma_launch`; `WEFT_CUDA_MMA_MAX_M=64`) lost
/// to cuBLAS too (round 17, H100: batch 64 17.72 against 17.18 ms; it wins only on the per-head
/// matrices), so the bound stays at 32. fp8 weights keep them up to 64: cuBLAS would first write a bf16
/// copy (batch-64 Kimi slice 30.7 → 32.7 ms when moved).
pub const MMA_DEFAULT_MAX_M: [usize; 2] = [32, MMA_MAX_M];
/// Floats of the dense tensor-core kernels' shared reduction buffer (`MMA_SPLIT_FLOATS`): a
/// sub-group's partial sums take 256 per 8 activation rows of a pass.
const MMA_SPLIT_FLOATS: usize = 8192;
/// The same for the 64-row pass (`gemv_mma_bf16_n8`), whose buffer is dynamic: 16 sub-groups
/// of 2048 floats (128 KB).
const MMA_SPLIT_FLOATS_WIDE: usize = 32768;
/// Index of the 64-row pass in the kernel tables (bf16 weights only).
const WIDE: usize = 3;
/// Most sub-groups a block of the 64-row pass holds (its reduction buffer).
const WIDE_SUB_GROUPS: usize = MMA_SPLIT_FLOATS_WIDE / (256 << WIDE);

/// Dynamic shared bytes of a 64-row-pass block of `sub_groups` sub-groups over `ub` units: the
/// sub-groups' sums, and in a cluster the block's partial sums of each unit.
fn wide_smem(sub_groups: usize, ub: usize, clustered: bool) -> usize {
    (sub_groups + if clustered { ub } else { 0 }) * (256 << WIDE) * 4
}
/// Weight rows per sub-group in the dense tensor-core kernels (two 16-row tiles).
const MMA_UNIT: usize = 32;
/// The 64-row pass by cluster size 1, 2, 4, 8 (plain, gated).
pub(crate) const GEMV_MMA_WIDE: [[&str; 2]; 4] = [
    ["gemv_mma_bf16_n8", "gemv_gated_mma_bf16_n8"],
    ["gemv_mma_bf16_n8_c2", "gemv_gated_mma_bf16_n8_c2"],
    ["gemv_mma_bf16_n8_c4", "gemv_gated_mma_bf16_n8_c4"],
    ["gemv_mma_bf16_n8_c8", "gemv_gated_mma_bf16_n8_c8"],
];
/// Tensor-core kernels by [bf16, fp8][8, 16, 32 activation rows per pass] (the 64-row pass of
/// bf16 weights: `GEMV_MMA_WIDE`; fp8 takes two 32-row passes there).
const GEMV_MMA: [[&str; 3]; 2] = [["gemv_mma_bf16_n1", "gemv_mma_bf16_n2", "gemv_mma_bf16_n4"], ["gemv_mma_fp8_n1", "gemv_mma_fp8_n2", "gemv_mma_fp8_n4"]];
const GEMV_GATED_MMA: [[&str; 3]; 2] = [["gemv_gated_mma_bf16_n1", "gemv_gated_mma_bf16_n2", "gemv_gated_mma_bf16_n4"], ["gemv_gated_mma_fp8_n1", "gemv_gated_mma_fp8_n2", "gemv_gated_mma_fp8_n4"]];

/// The kernel arguments a weight contributes: its bf16 data, or its fp8 bytes, scales and
/// scale grid (columns, block rows, block columns).
pub(crate) struct WeightArgs<'a> {
    w: &'a CudaMatrix,
    grid: [u32; 3],
}

impl<'a> WeightArgs<'a> {
    pub(crate) fn new(w: &'a CudaMatrix) -> Self {
        let grid = w.fp8.as_ref().map_or([0; 3], |f| [f.grid_cols(w.cols) as u32, f.block_rows as u32, f.block_cols as u32]);
        WeightArgs { w, grid }
    }
    pub(crate) fn push(&'a self, l: &mut LaunchArgs<'a>) {
        match &self.w.fp8 {
            None => l.arg(&self.w.data),
            Some(f) => l.arg(&f.bytes).arg(&f.scales).arg(&self.grid[0]).arg(&self.grid[1]).arg(&self.grid[2]),
        };
    }
}

/// Sub-groups per unit of the dense tensor-core kernels: enough that the GPU holds about 16
/// sub-groups' loads in flight per SM (a 2048-row projection is only 64 units), each still
/// taking at least two column chunks (one loop trip), at most what the shared reduction buffer
/// holds for `m` rows (32, 16 or 8 sub-groups) and what the kernel's registers allow in one
/// block (`max_threads`).
pub(crate) fn mma_split(units: usize, chunks: usize, variant: usize, num_sms: usize, max_threads: usize) -> usize {
    let floats = if variant == WIDE { MMA_SPLIT_FLOATS_WIDE } else { MMA_SPLIT_FLOATS };
    let max = (floats / (256 << variant)).min(max_threads / 32);
    let mut split = 1;
    while 2 * split <= max && units * split < 16 * num_sms && chunks >= 4 * split {
        split *= 2;
    }
    split
}

/// Blocks per cluster (1, 2, 4 or 8, at most `max`) splitting the columns of a 64-row pass over
/// `units` 32-row units of `chunks` column chunks: doubled while the blocks still fit the SMs
/// once each and every block keeps at least four chunks.
fn mma_cluster_size(units: usize, chunks: usize, num_sms: usize, max: usize) -> usize {
    let mut cl = 1;
    while 2 * cl <= max && units * 2 * cl <= num_sms && chunks >= 8 * cl {
        cl *= 2;
    }
    cl
}

/// The largest cluster (a power of two, at most `max`) of the 64-row pass the device can
/// schedule with that pass's largest blocks (`cuOccupancyMaxActiveClusters` > 0: a cluster's
/// blocks must fit one GPC at once), so a launch never asks for one it cannot run; 1 when none
/// fits or the query fails.
#[cfg(feature = "cuda")]
pub(crate) fn schedulable_cluster(
    funcs: &std::collections::HashMap<&'static str, cudarc::driver::CudaFunction>,
    max_threads: &std::collections::HashMap<&'static str, usize>,
    smem_optin: usize,
    max: usize,
) -> usize {
    use cudarc::driver::sys;
    let mut cl = 1usize << max.clamp(1, 8).ilog2();
    while cl > 1 {
        let name = GEMV_MMA_WIDE[cl.trailing_zeros() as usize][0];
        let warps = 1usize << (max_threads[name] / 32).clamp(1, WIDE_SUB_GROUPS).ilog2();
        let smem = wide_smem(warps, 4, true).min(smem_optin);
        let cfg = sys::CUlaunchConfig {
            gridDimX: 1,
            gridDimY: cl as u32,
            gridDimZ: 1,
            blockDimX: 32 * warps as u32,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem as u32,
            hStream: std::ptr::null_mut(),
            attrs: std::ptr::null_mut(),
            numAttrs: 0,
        };
        let mut n = 0;
        let ok = unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, funcs[name].cu_function(), &cfg) } == sys::CUresult::CUDA_SUCCESS;
        if ok && n > 0 {
            break;
        }
        cl /= 2;
    }
    cl
}

/// Index of the tensor-core kernel variant for `m` rows: passes of 8, 16, 32 or (bf16) 64.
fn mma_variant(m: usize, fp8: bool) -> usize {
    match m {
        0..=8 => 0,
        9..=16 => 1,
        17..=32 => 2,
        _ if fp8 => 2,
        _ => WIDE,
    }
}
/// Kernels by [rows per sub-group 1/2/4][activation rows per pass 1 / GEMV_TB].
const GEMV_BF16: [[&str; 2]; 3] = [["gemv_bf16_r1_t1", "gemv_bf16_r1_t8"], ["gemv_bf16_r2_t1", "gemv_bf16_r2_t8"], ["gemv_bf16_r4_t1", "gemv_bf16_r4_t8"]];
/// `gemv_add_rms_norm_*` by [bf16, fp8][rows per sub-group 1 / 2 / 4].
const GEMV_NORM: [[&str; 3]; 2] =
    [["gemv_add_rms_norm_bf16_r1", "gemv_add_rms_norm_bf16_r2", "gemv_add_rms_norm_bf16_r4"], ["gemv_add_rms_norm_fp8_r1", "gemv_add_rms_norm_fp8_r2", "gemv_add_rms_norm_fp8_r4"]];
const GEMV_FP8: [[&str; 2]; 3] = [["gemv_fp8_r1_t1", "gemv_fp8_r1_t8"], ["gemv_fp8_r2_t1", "gemv_fp8_r2_t8"], ["gemv_fp8_r4_t1", "gemv_fp8_r4_t8"]];
/// Two weights in one launch (`gemv_pair`), by [bf16, fp8][rows per sub-group][rows per pass].
const GEMV2: [[[&str; 2]; 3]; 2] = [
    [["gemv2_bf16_r1_t1", "gemv2_bf16_r1_t8"], ["gemv2_bf16_r2_t1", "gemv2_bf16_r2_t8"], ["gemv2_bf16_r4_t1", "gemv2_bf16_r4_t8"]],
    [["gemv2_fp8_r1_t1", "gemv2_fp8_r1_t8"], ["gemv2_fp8_r2_t1", "gemv2_fp8_r2_t8"], ["gemv2_fp8_r4_t1", "gemv2_fp8_r4_t8"]],
];

/// Weight rows per sub-group: more rows share each activation read (what limits batches of
/// several rows), fewer rows spread a small matrix over more sub-groups (what a single row
/// needs to have enough loads in flight). A sub-group's rows stay inside one head group.
pub(crate) fn rows_per_subgroup(rows: usize, group_rows: usize, m: usize, num_sms: usize) -> usize {
    let warps_per_block = (THREADS / crate::SUBGROUP) as usize;
    // Sub-groups for two full blocks per multiprocessor at least.
    let enough = |r: usize| rows / r >= 2 * warps_per_block * num_sms;
    for r in [4, 2] {
        if group_rows % r == 0 && (enough(r) || (m >= 4 && rows / r >= warps_per_block * num_sms / 2)) {
            return r;
        }
    }
    1
}

impl CudaBackend {
    /// Whether `w` can be multiplied by `m` activation rows on the weight-streaming path.
    pub(crate) fn gemv_fits(&self, w: &CudaMatrix, m: usize) -> bool {
        if self.slow_paths || m == 0 {
            return false;
        }
        if w.f32_data.is_some() {
            return m <= GEMV_MAX_M_BF16 && w.cols % 4 == 0;
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
        if let (Some(f), true) = (&w.f32_data, m == 1 && groups == 1 && self.router_pre && w.rows > 0) {
            // The router of one token: its rows loaded before the wait, two sub-groups a block.
            let (rows, cols) = (w.rows as u32, w.cols as u32);
            let cfg = LaunchConfig { grid_dim: (w.rows.div_ceil(2) as u32, 1, 1), block_dim: (2 * crate::SUBGROUP, 1, 1), shared_mem_bytes: 0 };
            let mut l = self.stream.launch_builder(self.func("gemv_f32_pre_t1"));
            l.arg(f).arg(x).arg(&mut out).arg(&rows).arg(&cols);
            unsafe { l.launch(cfg) }.map_err(dev)?;
            return Ok(out);
        }
        let warps = (THREADS / crate::SUBGROUP) as usize;
        let group_rows = w.rows / groups;
        let r = if w.f32_data.is_some() { 1 } else { rows_per_subgroup(w.rows, group_rows, m, self.num_sms) };
        let cfg = LaunchConfig { grid_dim: (w.rows.div_ceil(warps * r) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let (m32, rows, cols, grp, xs) = (m as u32, w.rows as u32, w.cols as u32, group_rows as u32, (groups * w.cols) as u32);
        match (&w.f32_data, &w.fp8) {
            (Some(f), _) => {
                let mut l = self.stream.launch_builder(self.func(if m == 1 { "gemv_f32_t1" } else { "gemv_f32_t8" }));
                l.arg(f).arg(x).arg(&mut out).arg(&m32).arg(&rows).arg(&cols).arg(&grp).arg(&xs);
                unsafe { l.launch(cfg) }.map_err(dev)?;
            }
            (None, None) => {
                let mut l = self.stream.launch_builder(self.func(GEMV_BF16[r.trailing_zeros() as usize][(m > 1) as usize]));
                l.arg(&w.data).arg(x).arg(&mut out).arg(&m32).arg(&rows).arg(&cols).arg(&grp).arg(&xs);
                unsafe { l.launch(cfg) }.map_err(dev)?;
            }
            (None, Some(f)) => {
                let (sc_cols, br, bc) = (f.grid_cols(w.cols) as u32, f.block_rows as u32, f.block_cols as u32);
                let mut l = self.stream.launch_builder(self.func(GEMV_FP8[r.trailing_zeros() as usize][(m > 1) as usize]));
                l.arg(&f.bytes).arg(&f.scales).arg(&sc_cols).arg(&br).arg(&bc).arg(x).arg(&mut out).arg(&m32).arg(&rows).arg(&cols).arg(&grp).arg(&xs);
                unsafe { l.launch(cfg) }.map_err(dev)?;
            }
        }
        Ok(out)
    }

    /// `x · wᵀ` added into `residual` and its RMSNorm in one launch (`gemv_add_rms_norm_*`:
    /// the last block to finish the GEMV adds and norms) for at most `gemv_norm_fused` rows
    /// whose product takes the CUDA-core weight-streaming path and whose rows `rms_row_v4` takes
    /// in one block (a multiple of 4, at most 8 values a thread); `None` where it does not apply.
    pub(crate) fn gemv_add_rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaMatrix,
        residual: &mut CudaSlice<f32>,
        (dim, weight, eps): (usize, &CudaSlice<f32>, f32),
        m: usize,
    ) -> Result<Option<CudaSlice<f32>>> {
        let fits = (1..=self.gemv_norm_fused).contains(&m)
            && w.f32_data.is_none()
            && w.rows == dim
            && dim % 4 == 0
            && dim <= 8 * THREADS as usize
            && residual.len() == m * dim
            && weight.len() == dim
            && self.gemv_fits(w, m)
            && !self.gemv_mma_fits(w, m, w.rows);
        if !fits {
            return Ok(None);
        }
        let mut delta = self.out(m * dim)?;
        let mut out = self.out(m * dim)?;
        let warps = (THREADS / crate::SUBGROUP) as usize;
        let r = rows_per_subgroup(w.rows, w.rows, m, self.num_sms);
        let cfg = LaunchConfig { grid_dim: (w.rows.div_ceil(warps * r) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let (m32, rows, cols) = (m as u32, w.rows as u32, w.cols as u32);
        let counter = self.gemv_counter.lock().unwrap();
        let name = GEMV_NORM[w.fp8.is_some() as usize][r.trailing_zeros() as usize];
        let mut l = self.stream.launch_builder(self.func(name));
        let wa = WeightArgs::new(w);
        wa.push(&mut l);
        l.arg(x).arg(&mut delta).arg(&m32).arg(&rows).arg(&cols).arg(residual).arg(weight).arg(&mut out).arg(&eps).arg(&*counter);
        unsafe { l.launch(cfg) }.map_err(dev)?;
        Ok(Some(out))
    }

    /// Whether `a` and `b` on the same `m` rows go through one weight-streaming launch
    /// (`gemv_pair`): both on the CUDA-core path (not the tensor cores'), both bf16 or both fp8,
    /// the same width.
    pub fn gemv_pair_fits(&self, a: &CudaMatrix, b: &CudaMatrix, m: usize) -> bool {
        let cuda_cores = |w: &CudaMatrix| w.f32_data.is_none() && self.gemv_fits(w, m) && !self.gemv_mma_fits(w, m, w.rows);
        self.gemv_pair && a.cols == b.cols && a.fp8.is_some() == b.fp8.is_some() && cuda_cores(a) && cuda_cores(b)
    }

    /// `(x · aᵀ, x · bᵀ)` in one launch (`gemv_pair_fits`): a decoding step's query and latent
    /// projections of the same normed hidden state, one kernel's ramp and tail instead of two.
    pub(crate) fn gemv_pair(&self, a: &CudaMatrix, b: &CudaMatrix, x: &CudaSlice<f32>, m: usize) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
        let (mut oa, mut ob) = (self.out(m * a.rows)?, self.out(m * b.rows)?);
        let warps = (THREADS / crate::SUBGROUP) as usize;
        // Rows per sub-group for the two as one matrix, dividing both.
        let (mut g, mut h) = (a.rows, b.rows);
        while h != 0 {
            (g, h) = (h, g % h);
        }
        let r = rows_per_subgroup(a.rows + b.rows, g, m, self.num_sms);
        let blocks = a.rows.div_ceil(warps * r) + b.rows.div_ceil(warps * r);
        let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let (wa, wb) = (WeightArgs::new(a), WeightArgs::new(b));
        let (ra, rb, m32, cols) = (a.rows as u32, b.rows as u32, m as u32, a.cols as u32);
        let mut l = self.stream.launch_builder(self.func(GEMV2[a.fp8.is_some() as usize][r.trailing_zeros() as usize][(m > 1) as usize]));
        wa.push(&mut l);
        l.arg(&mut oa).arg(&ra);
        wb.push(&mut l);
        l.arg(&mut ob).arg(&rb).arg(x).arg(&m32).arg(&cols);
        unsafe { l.launch(cfg) }.map_err(dev)?;
        Ok((oa, ob))
    }

    /// `silu(gate · x) * (up · x)` for a stacked `[2*inter, cols]` gate|up weight, on the
    /// weight-streaming path (`gemv_fits`; not for f32 weights).
    pub(crate) fn gemv_gated(&self, w: &CudaMatrix, x: &CudaSlice<f32>, m: usize, inter: usize) -> Result<CudaSlice<f32>> {
        let mut out = self.out(m * inter)?;
        let warps = (THREADS / crate::SUBGROUP) as usize;
        let cfg = LaunchConfig { grid_dim: (inter.div_ceil(warps) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let (m32, i32_, cols) = (m as u32, inter as u32, w.cols as u32);
        let t8 = m > 1;
        match &w.fp8 {
            None => {
                let mut l = self.stream.launch_builder(self.func(if t8 { "gemv_gated_bf16_t8" } else { "gemv_gated_bf16_t1" }));
                l.arg(&w.data).arg(x).arg(&mut out).arg(&m32).arg(&i32_).arg(&cols);
                unsafe { l.launch(cfg) }.map_err(dev)?;
            }
            Some(f) => {
                let (sc_cols, br, bc) = (f.grid_cols(w.cols) as u32, f.block_rows as u32, f.block_cols as u32);
                let mut l = self.stream.launch_builder(self.func(if t8 { "gemv_gated_fp8_t8" } else { "gemv_gated_fp8_t1" }));
                l.arg(&f.bytes).arg(&f.scales).arg(&sc_cols).arg(&br).arg(&bc).arg(x).arg(&mut out).arg(&m32).arg(&i32_).arg(&cols);
                unsafe { l.launch(cfg) }.map_err(dev)?;
            }
        }
        Ok(out)
    }

    /// Whether `w`, rows in groups of `group_rows`, goes through the tensor-core kernels for
    /// `m` activation rows: whole 16-byte-per-lane chunks along each row (32 bf16 or 64 fp8
    /// columns), whole 32-row units inside one group, one fp8 scale per 16-row tile and chunk;
    /// past 32 rows of bf16 weights, at most `mma_wide_max_units` units.
    pub(crate) fn gemv_mma_fits(&self, w: &CudaMatrix, m: usize, group_rows: usize) -> bool {
        self.gemv_mma_fits_upto(w, m, group_rows, self.mma_max_m[w.fp8.is_some() as usize])
    }

    /// [`Self::gemv_mma_fits`] for the per-head absorbed matrices (`head_linear`), whose bf16
    /// 64-row pass is taken up to `mma_heads_max_m` rows.
    pub(crate) fn gemv_mma_heads_fits(&self, w: &CudaMatrix, m: usize, group_rows: usize) -> bool {
        let fp8 = w.fp8.is_some() as usize;
        self.gemv_mma_fits_upto(w, m, group_rows, self.mma_max_m[fp8].max(if fp8 == 0 { self.mma_heads_max_m } else { 0 }))
    }

    fn gemv_mma_fits_upto(&self, w: &CudaMatrix, m: usize, group_rows: usize, max_m: usize) -> bool {
        if !self.mma || self.slow_paths || !(self.mma_min_m..=max_m).contains(&m) || w.f32_data.is_some() {
            return false;
        }
        let wide = m > 32 && w.fp8.is_none();
        mma_takes(w) && w.rows % MMA_UNIT == 0 && group_rows % MMA_UNIT == 0 && (!wide || w.rows / MMA_UNIT <= self.mma_wide_max_units)
    }

    /// `gemv` on tensor cores (`gemv_mma_fits`).
    pub(crate) fn gemv_mma(&self, w: &CudaMatrix, x: &CudaSlice<f32>, m: usize, groups: usize) -> Result<CudaSlice<f32>> {
        let mut out = self.out(m * w.rows)?;
        let (name, cfg, ub) = self.mma_launch(w.rows / MMA_UNIT, w, m, false);
        let (m32, rows, cols, grp, xs) = (m as u32, w.rows as u32, w.cols as u32, (w.rows / groups) as u32, (groups * w.cols) as u32);
        let wa = WeightArgs::new(w);
        let mut l = self.stream.launch_builder(self.func(name));
        wa.push(&mut l);
        l.arg(x).arg(&mut out).arg(&m32).arg(&rows).arg(&cols).arg(&grp).arg(&xs);
        if let Some(ub) = &ub {
            l.arg(ub);
        }
        unsafe { l.launch(cfg) }.map_err(dev)?;
        Ok(out)
    }

    /// `gemv_gated` on tensor cores (`gemv_mma_fits` of the stacked weight as one group).
    pub(crate) fn gemv_gated_mma(&self, w: &CudaMatrix, x: &CudaSlice<f32>, m: usize, inter: usize) -> Result<CudaSlice<f32>> {
        let mut out = self.out(m * inter)?;
        let (name, cfg, ub) = self.mma_launch(inter / 16, w, m, true);
        let (m32, i32_, cols) = (m as u32, inter as u32, w.cols as u32);
        let wa = WeightArgs::new(w);
        let mut l = self.stream.launch_builder(self.func(name));
        wa.push(&mut l);
        l.arg(x).arg(&mut out).arg(&m32).arg(&i32_).arg(&cols);
        if let Some(ub) = &ub {
            l.arg(ub);
        }
        unsafe { l.launch(cfg) }.map_err(dev)?;
        Ok(out)
    }

    /// A block per unit (two 16-row tiles), split over `mma_split` sub-groups along the columns.
    /// The 64-row pass takes `ub` units a block (`mma_wide_ub`, where it divides the units;
    /// returned as the kernel's last argument) and, over fewer blocks than SMs, also splits the
    /// columns over a cluster of blocks (`mma_cluster_size`). The kernel to launch (plain or
    /// `gated`, for `m` rows of `w`) and how.
    fn mma_launch(&self, units: usize, w: &CudaMatrix, m: usize, gated: bool) -> (&'static str, LaunchConfig, Option<u32>) {
        let variant = mma_variant(m, w.fp8.is_some());
        let chunks = w.cols / mma_chunk_cols(w);
        if variant != WIDE {
            let kernel = [GEMV_MMA, GEMV_GATED_MMA][gated as usize][w.fp8.is_some() as usize][variant];
            let split = mma_split(units, chunks, variant, self.num_sms, self.max_threads[kernel]);
            return (kernel, LaunchConfig { grid_dim: (units as u32, 1, 1), block_dim: (32 * split as u32, 1, 1), shared_mem_bytes: 0 }, None);
        }
        let mut ub = 1 << self.mma_wide_ub.clamp(1, 4).ilog2();
        while units % ub != 0 {
            ub /= 2;
        }
        let cl = mma_cluster_size(units / ub, chunks, self.num_sms, self.mma_cluster);
        let kernel = GEMV_MMA_WIDE[cl.trailing_zeros() as usize][gated as usize];
        let split = mma_split(units * cl, chunks.div_ceil(cl), WIDE, self.num_sms, self.max_threads[kernel] / ub).min(WIDE_SUB_GROUPS / ub);
        let smem = wide_smem(ub * split, ub, cl > 1);
        let cfg = LaunchConfig { grid_dim: ((units / ub) as u32, cl as u32, 1), block_dim: (32 * (ub * split) as u32, 1, 1), shared_mem_bytes: smem as u32 };
        (kernel, cfg, Some(ub as u32))
    }

    /// Which kernel a linear (`gated`: `gated_up`) of `w` over `m` rows launches and how
    /// (grid, block, shared memory, units a block), or the CUDA-core / cuBLAS path: for
    /// benchmark tables (`examples/linear_bench.rs`).
    pub fn describe_linear(&self, w: &CudaMatrix, m: usize, gated: bool) -> String {
        let units = w.rows / MMA_UNIT;
        if !self.gemv_mma_fits(w, m, w.rows) {
            return if self.gemv_fits(w, m) { "CUDA cores".into() } else { "cuBLAS".into() };
        }
        let (name, cfg, ub) = self.mma_launch(units, w, m, gated);
        format!("{name} grid {}×{} × {} threads, {} KB shared, {} unit(s) a block", cfg.grid_dim.0, cfg.grid_dim.1, cfg.block_dim.0, cfg.shared_mem_bytes / 1024, ub.unwrap_or(1))
    }

    /// A bf16 copy of an fp8 weight (scratch for the cuBLAS path).
    pub(crate) fn dequant(&self, w: &CudaMatrix) -> Result<Option<CudaSlice<u16>>> {
        let Some(f) = &w.fp8 else { return Ok(None) };
        let n = w.rows * w.cols;
        let mut out = self.alloc::<u16>(n)?;
        let (sc_cols, br, bc, rows, cols) = (f.grid_cols(w.cols) as u32, f.block_rows as u32, f.block_cols as u32, w.rows as u32, w.cols as u32);
        let mut l = self.stream.launch_builder(self.func("dequant_fp8_bf16"));
        l.arg(&f.bytes).arg(&f.scales).arg(&sc_cols).arg(&br).arg(&bc).arg(&mut out).arg(&rows).arg(&cols);
        unsafe { l.launch(flat(n)) }.map_err(dev)?;
        Ok(Some(out))
    }
}

/// Columns of one tensor-core chunk (16 bytes per lane, four lanes): 32 bf16 or 64 fp8.
pub(crate) fn mma_chunk_cols(w: &CudaMatrix) -> usize {
    if w.fp8.is_some() {
        64
    } else {
        32
    }
}

/// Whether the tensor-core kernels can stream `w` along its columns: whole chunks in every row
/// and, for fp8, one block scale per 16-row tile and chunk. Row tiling is the caller's test.
pub(crate) fn mma_takes(w: &CudaMatrix) -> bool {
    w.cols % mma_chunk_cols(w) == 0 && w.fp8.as_ref().is_none_or(|f| f.block_rows % 16 == 0 && f.block_cols % 64 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split never outgrows the shared buffer or leaves a sub-group under two column
    /// chunks, and short matrices get split while tall ones (lm_head) do not.
    #[test]
    fn mma_split_bounds() {
        for units in [1usize, 16, 64, 88, 176, 704, 5120] {
            for chunks in [1usize, 2, 4, 16, 64, 112, 224] {
                for m in [2usize, 8, 9, 16, 17, 33, 64] {
                    for fp8 in [false, true] {
                        let v = mma_variant(m, fp8);
                        let floats = if v == WIDE { MMA_SPLIT_FLOATS_WIDE } else { MMA_SPLIT_FLOATS };
                        let s = mma_split(units, chunks, v, 132, 1024);
                        assert!(mma_split(units, chunks, v, 132, 384) <= 8);
                        assert!(s.is_power_of_two() && s * (256 << v) <= floats, "{units} {chunks} {m}: {s}");
                        assert!(s == 1 || chunks >= 2 * s, "{units} {chunks} {m}: {s}");
                        assert!((v == WIDE && !fp8) || (GEMV_MMA[fp8 as usize][v].contains(["n1", "n2", "n4"][v]) && GEMV_GATED_MMA[fp8 as usize][v].contains(["n1", "n2", "n4"][v])));
                    }
                }
            }
        }
        assert_eq!(mma_split(64, 64, 0, 132, 1024), 32); // o_proj 2048x2048 bf16, decode batch 8
        assert_eq!(mma_split(64, 64, 0, 132, 512), 16); // registers for 512 threads only
        assert_eq!(mma_split(64, 64, 2, 132, 1024), 8); // 32 rows a pass
        assert_eq!(mma_split(64, 64, WIDE, 132, 1024), 16); // 64 rows: the dynamic buffer
        assert_eq!(mma_split(5120, 64, 0, 132, 1024), 1); // lm_head 163840 rows

        // Clusters: o_proj (64 units, 64 chunks) over pairs, kv_a (18 units) over four, the
        // 128-column W_UK (4 chunks) and lm_head over none.
        assert_eq!(mma_cluster_size(64, 64, 132, 4), 2);
        assert_eq!(mma_cluster_size(18, 64, 132, 4), 4);
        assert_eq!(mma_cluster_size(18, 64, 132, 1), 1);
        assert_eq!(mma_cluster_size(256, 4, 132, 4), 1);
        assert_eq!(mma_cluster_size(64, 8, 132, 4), 2); // four chunks a block
        assert_eq!(mma_cluster_size(64, 7, 132, 4), 1);
        assert_eq!(mma_cluster_size(5120, 64, 132, 4), 1);
        // o_proj four units a block (16 blocks): clusters of eight where allowed
        assert_eq!(mma_cluster_size(16, 64, 132, 8), 8);
        assert_eq!(mma_cluster_size(16, 64, 132, 4), 4);
    }
}
