//! Split-context MLA attention (`kernels/mla.cu`): the launch shape (head groups, context
//! splits sized so the whole GPU is busy even for one decoding sequence) and the merge of the
//! splits. The single-pass kernel in `weft.cu` remains for shapes this one does not take.

use crate::gemv::WeightArgs;
use crate::{dev, CudaBackend, CudaKvPool, CudaMatrix};
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use weft_backend::{AttnRow, Result, RopeParams};

/// Tokens per shared-memory tile and heads per block (`MLA_T`, `MLA_HG` in mla.cu).
const TILE: usize = 16;
const HEAD_GROUP: usize = 16;
const THREADS: u32 = 256;
/// Latent columns (and threads) per `mla_combine` block.
const COMBINE_COLS: usize = 128;

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

/// `mla_decode_mma`'s tile (tokens), warps (also `mla_decode_mmg*`'s), and the widest latent
/// their warps cover.
const MMA_TILE: usize = 32;
const MMA_WARPS: usize = 16;
const MMA_MAX_LATENT: usize = 512;
/// Tile buffers of the tensor-core kernels (`S` in mla.cu and mla_grouped.cu, both caches).
const MMA_STAGES: usize = 2;

/// Bytes per shared-memory row of `mla_decode_mma`'s tiles (`mlt_stride` in mla.cu): f32 rows
/// of ≡ 20 words (mod 32), bf16 rows of ≡ 4 words (mod 32), for conflict-free fragment reads.
fn mma_row_bytes(width: usize, bf16: bool) -> usize {
    if bf16 {
        let words = width / 2;
        4 * (words + (36 - words % 32) % 32)
    } else {
        4 * (width + (52 - width % 32) % 32)
    }
}

/// A tensor-core MLA decode kernel chosen for a call: its name, tile tokens, 16-head m-tiles
/// per block, threads and dynamic shared memory.
#[derive(Clone, Copy)]
struct MmaKernel {
    name: &'static str,
    tile: usize,
    m_tiles: usize,
    threads: usize,
    smem: usize,
}

/// `mla_decode_wg_bf16` / `mla_decode_wg2_bf16` (mla_wgmma.cu): one or two warpgroups, tiles
/// of `MLW_T` tokens, 16 heads.
const WG_NAMES: [&str; 2] = ["mla_decode_wg_bf16", "mla_decode_wg2_bf16"];
const WG_TILE: usize = 64;
/// Most heads the 16-head wgmma kernel takes by default: one block a row. At 32 (two blocks,
/// each reading the tile) the 64-head kernel beat it, 195.1 against 215.0 µs (round 20).
pub(crate) const WG_DEFAULT_MAX_HEADS: usize = HEAD_GROUP;

/// The wgmma kernel's shared memory for a cache row of `width` bf16 columns and `groups`
/// warpgroups: alignment slack, two tiles and Q^T in 64-column chunks (64 and 32 rows of 128
/// bytes), per warpgroup P^T (32 rows of 128 bytes) and the per-warp maxima (4 × 16 floats),
/// and with two warpgroups each one's partial scores (16 floats a thread).
fn wg_smem(width: usize, groups: usize) -> usize {
    let chunks = width.div_ceil(64);
    let partial_scores = if groups > 1 { groups * 16 * 128 * 4 } else { 0 };
    1024 + 2 * chunks * WG_TILE * 128 + chunks * 32 * 128 + groups * (32 * 128 + 4 * 16 * 4) + partial_scores
}

/// `mla_decode_wgh_bf16` (mla_wgmma.cu): up to 64 heads a block as the rows of every product,
/// two warpgroups, tiles of `WGH_TILE` tokens, latent at most `WGH_MAX_LATENT`; and
/// `mla_decode_wgh1_bf16`, its opt-in variant with one bf16 part of queries and weights.
const WGH_NAMES: [&str; 2] = ["mla_decode_wgh1_bf16", "mla_decode_wgh_bf16"];
const WGH_TILE: usize = 32;
const WGH_MAX_LATENT: usize = 512;

/// Its shared memory with `parts` query parts: alignment slack, two tiles, the queries' parts
/// (64 rows of 128 bytes a 64-column chunk each), the scores' exchange (16 floats a thread of a
/// warpgroup).
fn wgh_smem(width: usize, parts: usize) -> usize {
    let chunks = width.div_ceil(64);
    1024 + 2 * chunks * WGH_TILE * 128 + parts * chunks * 64 * 128 + 16 * 128 * 4
}

/// `mla_decode_wgs_bf16` (mla_wgmma.cu): up to 64 heads a block, each warpgroup scoring its
/// own 32 tokens of a `WG_TILE`-token tile; one bf16 part of queries and weights.
const WGS_NAME: &str = "mla_decode_wgs_bf16";

/// Its shared memory: alignment slack, two tiles, the queries (64 rows of 128 bytes a 64-column
/// chunk), P (64 rows of 128 bytes) and the two warpgroups' row maxima (64 floats each).
fn wgs_smem(width: usize) -> usize {
    let chunks = width.div_ceil(64);
    1024 + 2 * chunks * WG_TILE * 128 + chunks * 64 * 128 + 64 * 128 + 2 * 64 * 4
}

/// `mla_decode_wgp_bf16` (mla_pair.cu): up to 64 heads a block, two `WG_TILE`-token tiles a
/// step in ping-pong between the warpgroups (one's softmax while the other's products run),
/// tiles refilled by halves behind mbarriers; one bf16 part of queries and weights. DeepSeek-V3
/// / Kimi-K2's width only: latent `WGP_LATENT`, rope `WGP_ROPE`.
const WGP_NAME: &str = "mla_decode_wgp_bf16";
const WGP_LATENT: usize = 512;
const WGP_ROPE: usize = 64;

/// Its shared memory: alignment slack, two tiles and the queries (9 chunks of 64 rows of 128
/// bytes each; P_B lives in the queries' rope chunk), P_A (64 rows of 128 bytes), the running
/// max and two scale vectors (64 floats each), an mbarrier per half of each tile.
fn wgp_smem() -> usize {
    let chunks = (WGP_LATENT + WGP_ROPE) / 64;
    1024 + 3 * chunks * 64 * 128 + 64 * 128 + 3 * 64 * 4 + 2 * 2 * 8
}

/// Whether `name` is one of the 64-head kernels (mla_wgmma.cu `mlh_store`), which take `out` and
/// the counters and can merge their splits themselves.
fn mlh_kernel(name: &str) -> bool {
    name == WGS_NAME || name == WGP_NAME || WGH_NAMES.contains(&name)
}

/// Whether a 64-head launch of `base` blocks (rows × head groups of `hg` heads) by `nsplit`
/// splits merges in the kernel: at most `most` splits (`CudaBackend::mla_merge`); a single split
/// at any size (no counters, no wait); several — since a block waits there for the other
/// splits of its row and head group — only where the whole grid is resident at once (one block
/// an SM: their shared memory; so within the `num_sms` counter pairs of `CudaBackend::mla_sem`)
/// and the groups have more than 32 heads (at 32 two splits merged measured 1–2 %
/// slower than the combine, whose traffic shrinks with the heads; 1.07–1.16× at 64, round 27).
fn mlh_merges(base: usize, nsplit: usize, hg: usize, most: usize, num_sms: usize) -> bool {
    nsplit <= most && (nsplit == 1 || (hg > 32 && base * nsplit <= num_sms))
}

/// A grouped tensor-core kernel (`WEFT_MLA_MMG` in mla_grouped.cu): its cache type, tile
/// tokens, 16-head m-tiles per block, n-tiles per score warp and query parts.
pub struct MmgSpec {
    pub name: &'static str,
    pub bf16: bool,
    pub tile: usize,
    pub m_tiles: usize,
    pub n_tiles: usize,
    pub query_parts: usize,
}

const fn mmg(name: &'static str, bf16: bool, tile: usize, m_tiles: usize, n_tiles: usize, query_parts: usize) -> MmgSpec {
    MmgSpec { name, bf16, tile, m_tiles, n_tiles, query_parts }
}

/// Every grouped kernel, as instantiated in mla_grouped.cu.
pub const MMG_KERNELS: &[MmgSpec] = &[
    mmg("mla_decode_mmg4w_bf16", true, 16, 4, 2, 2),
    mmg("mla_decode_mmg2_bf16", true, 32, 2, 1, 2),
    mmg("mla_decode_mmg1w_bf16", true, 64, 1, 4, 2),
    mmg("mla_decode_mmg2w", false, 16, 2, 2, 2),
    mmg("mla_decode_mmg4wq1_bf16", true, 32, 4, 4, 1),
];

fn mmg_spec(name: &str) -> &'static MmgSpec {
    MMG_KERNELS.iter().find(|k| k.name == name).expect("a kernel of MMG_KERNELS")
}

/// The shared memory both tensor-core kernels lay out after their queries: `MMA_STAGES` tiles,
/// partial scores of `heads` rows over `parts` parts of the width, the weights' two parts, the
/// rescale factors (rows of tile + 8).
fn tile_smem(width: usize, tile: usize, bf16: bool, parts: usize, heads: usize) -> usize {
    MMA_STAGES * tile * mma_row_bytes(width, bf16) + parts * heads * (tile + 8) * 4 + 2 * heads * (tile + 8) * 2 + heads * 4
}

/// `mla_decode_mmg*`'s shared memory (16 warps): query fragments (16 bytes per part, 16-column
/// step, m-tile and lane), then `tile_smem`.
fn mmg_smem(width: usize, k: &MmgSpec) -> usize {
    let parts = MMA_WARPS / (k.m_tiles * k.tile / 8 / k.n_tiles);
    k.m_tiles * (width / 16) * k.query_parts * 32 * 16 + tile_smem(width, k.tile, k.bf16, parts, 16 * k.m_tiles)
}

/// Context splits for the tensor-core kernel, which runs one block per SM: the count whose
/// waves of blocks times tiles per block (plus about one tile of fixed cost per block: queries,
/// partial outputs) is least, the fewest splits among equals. 64 rows × 129 tiles on 132 SMs:
/// 2 splits (one wave of 128 blocks), not the 9 of four waves, whose fifth wave was a third full.
fn mma_splits(base: usize, tiles: usize, sms: usize) -> usize {
    (1..=tiles.max(1)).min_by_key(|&n| (base.max(1) * n).div_ceil(sms.max(1)) * (tiles.div_ceil(n) + 1)).unwrap_or(1)
}

impl CudaBackend {
    fn mla_smem(&self, width: usize, hg: usize) -> usize {
        (hg * width + TILE * (width + 4) + HEAD_GROUP * TILE + 3 * HEAD_GROUP) * 4
    }

    /// `mla_decode_mma`'s shared memory for tiles of `tile` tokens: its tile buffers, partial scores,
    /// the weights' two parts, the rescale factors.
    fn mla_mma_smem(width: usize, tile: usize, warps: usize, bf16: bool) -> usize {
        tile_smem(width, tile, bf16, warps / 2, 16)
    }

    /// Whether the tensor-core kernels take this layout: whole 16-column steps, latent columns
    /// in whole 8-column tiles within 16 warps × 32, a width of at most 4 × 9 steps.
    fn mla_mma_fits(&self, pool: &CudaKvPool) -> bool {
        let l = pool.layout;
        let w = l.width();
        self.mla_mma && w % 16 == 0 && w <= 576 && l.latent_dim % 8 == 0 && l.latent_dim <= MMA_MAX_LATENT && l.rope_dim % 4 == 0
    }

    /// The tensor-core kernel for `heads` heads over this pool, if one takes it: the grouped
    /// kernels (`mla_decode_mmg*`, mla_grouped.cu: queries in shared memory, several m-tiles of
    /// 16 heads per block — the tile loaded and each phase run once for all of them — and
    /// score warps over several n-tiles) where their shared memory fits and they were measured
    /// faster (every bf16 shape; f32 beyond 16 heads), else `mla_decode_mma` (one m-tile per
    /// block). `WEFT_CUDA_MLA_GROUPED=0`: `mla_decode_mma` always; `WEFT_CUDA_MLA_MMG`: one
    /// grouped kernel by name for every head count. Before all of them on sm_90a over a bf16
    /// cache whose latent is a multiple of 64: `mla_decode_wg2_bf16` up to
    /// `WG_DEFAULT_MAX_HEADS` heads, 64 heads a block beyond (one bf16 part of queries and
    /// weights): `mla_decode_wgp_bf16` (two tiles a step in ping-pong) at DeepSeek's width,
    /// `mla_decode_wgs_bf16` at others (`WEFT_CUDA_MLA_WGMMA=0`: never; `=1` / `=2`:
    /// `mla_decode_wg_bf16` / `_wg2_` for every head count; `=3`: `_wgh_` (two parts) for every
    /// head count; `=4`: `_wgh1_`; `=5`: `_wgs_` for every head count; `=6`: `_wgp_` for every
    /// head count where the width fits).
    fn mla_mma_kernel(&self, pool: &CudaKvPool, heads: usize) -> Option<MmaKernel> {
        if !self.mla_mma_fits(pool) {
            return None;
        }
        let (w, bf) = (pool.layout.width(), pool.bf16());
        let one = if bf { "mla_decode_mma_bf16" } else { "mla_decode_mma" };
        let threads = 32 * MMA_WARPS;
        let single = MmaKernel { name: one, tile: MMA_TILE, m_tiles: 1, threads, smem: Self::mla_mma_smem(w, MMA_TILE, MMA_WARPS, bf) };
        // Hopper's warpgroup kernels: a bf16 cache whose latent columns fill whole 64-column
        // value tiles; 16 heads a block up to `mla_wgmma_max_heads` (16 by default), 64 past it
        // (and for every head count with `mla_wgmma` 3, 4 or 5).
        let latent = pool.layout.latent_dim;
        let wg = self.mla_wgmma.filter(|_| bf && latent % 64 == 0).and_then(|n| match n {
            1 | 2 if heads <= self.mla_wgmma_max_heads => Some(MmaKernel { name: WG_NAMES[n - 1], tile: WG_TILE, m_tiles: 1, threads: 128 * n, smem: wg_smem(w, n) }),
            3 | 4 if latent <= WGH_MAX_LATENT => {
                let parts = if n == 4 { 1 } else { 2 };
                Some(MmaKernel { name: WGH_NAMES[parts - 1], tile: WGH_TILE, m_tiles: 4, threads: 256, smem: wgh_smem(w, parts) })
            }
            5 if latent <= WGH_MAX_LATENT => Some(MmaKernel { name: WGS_NAME, tile: WG_TILE, m_tiles: 4, threads: 256, smem: wgs_smem(w) }),
            _ if latent == WGP_LATENT && pool.layout.rope_dim == WGP_ROPE => Some(MmaKernel { name: WGP_NAME, tile: WG_TILE, m_tiles: 4, threads: 256, smem: wgp_smem() }),
            _ if latent <= WGH_MAX_LATENT => Some(MmaKernel { name: WGS_NAME, tile: WG_TILE, m_tiles: 4, threads: 256, smem: wgs_smem(w) }),
            _ => None,
        });
        let grouped = match (self.mla_mmg, bf) {
            (Some(name), _) if mmg_spec(name).bf16 == bf => Some(name),
            _ if !self.mla_grouped => None,
            (_, true) if heads > 2 * HEAD_GROUP => Some("mla_decode_mmg4w_bf16"),
            (_, true) if heads > HEAD_GROUP => Some("mla_decode_mmg2_bf16"),
            (_, true) => Some("mla_decode_mmg1w_bf16"),
            (_, false) if heads > HEAD_GROUP => Some("mla_decode_mmg2w"),
            (_, false) => None,
        };
        wg.into_iter()
            .chain(grouped.map(|name| {
                let k = mmg_spec(name);
                MmaKernel { name, tile: k.tile, m_tiles: k.m_tiles, threads, smem: mmg_smem(w, k) }
            }))
            .chain([single])
            .find(|k| k.smem <= self.smem_optin)
    }

    /// Whether the decode kernel for `heads` heads over this pool rounds queries and softmax
    /// weights to one bf16 part (FlashMLA's numerics: ~1e-3 from the f32 reference) instead of
    /// the hi / lo parts of every other path (~1e-6).
    pub fn mla_decode_one_part(&self, pool: &CudaKvPool, heads: usize) -> bool {
        let name = self.mla_decode_kernel(pool, heads);
        name == WGS_NAME || name == WGP_NAME || name == WGH_NAMES[0] || MMG_KERNELS.iter().any(|k| k.name == name && k.query_parts == 1)
    }

    /// The decode kernel `mla_attention` launches for `heads` heads over this pool (rows of
    /// short runs: prefill chunks may take the GEMM path instead), for benchmarks' tables.
    pub fn mla_decode_kernel(&self, pool: &CudaKvPool, heads: usize) -> &'static str {
        match self.mla_mma_kernel(pool, heads) {
            Some(k) => k.name,
            None if !self.mla_split_fits(pool, heads) => "mla_attention (single pass)",
            None if pool.bf16() => "mla_decode_bf16",
            None => "mla_decode",
        }
    }

    /// Whether the split kernel takes this shape (latent ≤ 2 × threads, latent and rope widths
    /// in whole float4s, tiles fit in shared memory). Any head count does.
    pub(crate) fn mla_split_fits(&self, pool: &CudaKvPool, heads: usize) -> bool {
        let l = pool.layout;
        !self.slow_paths && heads > 0 && l.latent_dim <= 2 * THREADS as usize && l.latent_dim % 4 == 0 && l.rope_dim % 4 == 0 && self.mla_smem(l.width(), head_groups(heads).1) <= self.smem_optin
    }

    /// `tables`: the rows' concatenated block tables, their offsets and visible lengths.
    /// Tensor cores (`mla_decode_mma`) where the layout fits, else `mla_decode`; both write the
    /// same partial outputs, merged by `mla_combine`.
    pub(crate) fn mla_split(&self, a: MlaArgs<'_>, tables: [&CudaView<'_, u32>; 3]) -> Result<CudaSlice<f32>> {
        match self.mla_split_parts(a, tables, false)? {
            MlaOut::Merged(out) => Ok(out),
            MlaOut::Parts { .. } => unreachable!("merged unless deferred"),
        }
    }

    /// `mla_split`, or with `defer` the splits' partials unmerged where the kernel leaves them
    /// so (for a consumer that merges them itself: `mla_uv_merged`).
    fn mla_split_parts(&self, a: MlaArgs<'_>, tables: [&CudaView<'_, u32>; 3], defer: bool) -> Result<MlaOut> {
        let MlaArgs { pool, layer, q_lat, q_pe, heads, rows, scale } = a;
        let l = pool.layout;
        let mma = self.mla_mma_kernel(pool, heads);
        let tile = mma.map_or(TILE, |k| k.tile);
        let (mut groups, mut hg) = match mma {
            Some(k) => head_groups_of(heads, HEAD_GROUP * k.m_tiles),
            _ => head_groups(heads),
        };
        // While a step is recorded, sized for its context bucket (the graph serves every step
        // up to it; splits past a row's context are empty).
        let max_ctx = self.split_context(rows.iter().map(|r| r.ctx_len).max().unwrap_or(1));
        // A few rows of short context leave SMs idle even at one tile per split: halve the head
        // groups (down to `mla_min_group` heads) so that more, shorter blocks share the work.
        // (Not on tensor cores: a block's work there is whole 16-row tiles whatever its heads.)
        let tiles = max_ctx.div_ceil(tile);
        while mma.is_none() && rows.len() * groups * tiles < self.num_sms && hg / 2 >= self.mla_min_group {
            (groups, hg) = head_groups_of(heads, hg / 2);
        }
        let base = rows.len() * groups;
        let mut nsplit = if mma.is_some() {
            mma_splits(base, tiles, self.num_sms)
        } else {
            // Enough blocks for a few waves over every SM; each split at least one tile.
            (self.mla_waves * self.num_sms).div_ceil(base.max(1)).clamp(1, tiles)
        };
        // Each row's own context is cut evenly over the splits in the kernel (`split_range`),
        // each split at least `min_chunk` tokens.
        let min_chunk = self.mla_split_tiles * tile;
        let chunk = (max_ctx.div_ceil(nsplit).div_ceil(tile) * tile).max(min_chunk);
        nsplit = max_ctx.div_ceil(chunk);
        let (h32, g32, gs, lat, rd, ps, ch) = (heads as u32, groups as u32, hg as u32, l.latent_dim as u32, l.rope_dim as u32, l.page_size as u32, min_chunk as u32);
        let bf = pool.bf16();
        let (kernel, threads, smem) = match mma {
            Some(k) => (k.name, k.threads as u32, k.smem),
            None => (if bf { "mla_decode_bf16" } else { "mla_decode" }, THREADS, self.mla_smem(l.width(), hg)),
        };
        // The 64-head kernels merge their splits themselves where `mlh_merges` allows
        // (mla_wgmma.cu `mlh_store`); a single split then writes no partials at all.
        let mlh = mlh_kernel(kernel);
        let merge = mlh && mlh_merges(base, nsplit, hg, self.mla_merge, self.num_sms);
        let parts = if merge && nsplit == 1 { 0 } else { rows.len() * heads * nsplit };
        let mut o_part = self.out(parts * l.latent_dim)?;
        let mut ml_part = self.out(parts * 2)?;
        let mut out = self.out(if merge || !defer { rows.len() * heads * l.latent_dim } else { 0 })?;
        let view = pool.layer(layer);
        // The counters only for several splits (a single one writes its rows out at once).
        let sem = (merge && nsplit > 1).then(|| self.mla_sem.lock().unwrap());
        let mut b = self.stream.launch_builder(self.func(kernel));
        b.arg(&view).arg(q_lat).arg(q_pe).arg(tables[0]).arg(tables[1]).arg(tables[2]).arg(&mut o_part).arg(&mut ml_part).arg(&h32).arg(&g32).arg(&gs).arg(&lat).arg(&rd).arg(&ps).arg(&scale).arg(&ch);
        let null = 0u64;
        if merge {
            b.arg(&mut out);
            match &sem {
                Some(sem) => b.arg(&**sem),
                None => b.arg(&null),
            };
        } else if mlh {
            b.arg(&null).arg(&null);
        }
        unsafe { b.launch(LaunchConfig { grid_dim: (base as u32, nsplit as u32, 1), block_dim: (threads, 1, 1), shared_mem_bytes: smem as u32 }) }.map_err(dev)?;
        drop(sem);
        if merge {
            return Ok(MlaOut::Merged(out));
        }
        if defer {
            return Ok(MlaOut::Parts { o: o_part, ml: ml_part, nsplit });
        }
        let ns = nsplit as u32;
        let mut b = self.stream.launch_builder(self.func("mla_combine"));
        b.arg(&o_part).arg(&ml_part).arg(&mut out).arg(&ns).arg(&lat);
        // Blocks of COMBINE_COLS latent columns of one row and head; shared memory: the
        // block's reduction scratch, then one weight per split.
        let smem = ((COMBINE_COLS + nsplit) * 4) as u32;
        let grid = ((rows.len() * heads) as u32, l.latent_dim.div_ceil(COMBINE_COLS) as u32, 1);
        unsafe { b.launch(LaunchConfig { grid_dim: grid, block_dim: (COMBINE_COLS as u32, 1, 1), shared_mem_bytes: smem }) }.map_err(dev)?;
        Ok(MlaOut::Merged(out))
    }

    /// Sub-group rows of W_UV for `mla_uv_merge_*`: the most (of 4, 2, 1) whose blocks lie
    /// within one head (each block merges its head's splits, so fewer blocks re-read fewer), and
    /// `None` where no count does or the weights are off the weight-streaming path.
    fn uv_merge_rows(&self, w_uv: &CudaMatrix, heads: usize, m: usize) -> Option<usize> {
        let warps = (THREADS / crate::SUBGROUP) as usize;
        let group_rows = w_uv.rows / heads.max(1);
        let fits = m >= 1 && m <= self.mla_uv_merge && w_uv.f32_data.is_none() && heads > 0 && w_uv.rows % heads == 0 && self.gemv_fits(w_uv, m) && !self.gemv_mma_heads_fits(w_uv, m, group_rows);
        [4, 2, 1].into_iter().find(|r| fits && group_rows % (warps * r) == 0)
    }

    /// Decode rows' MLA attention and then W_UV (`Backend::mla_attention_heads`' last two
    /// steps) with the merge of the context splits inside W_UV's launch (`mla_uv_merge_*`:
    /// one dependent step fewer than `mla_combine` and the GEMV) for at most `mla_uv_merge`
    /// rows; `None` where it does not apply (the caller takes the ops apart).
    pub(crate) fn mla_uv_merged(&self, a: MlaArgs<'_>, w_uv: &CudaMatrix) -> Result<Option<CudaSlice<f32>>> {
        let MlaArgs { pool, q_lat, q_pe, heads, rows, .. } = a;
        let l = pool.layout;
        let Some(r) = self.uv_merge_rows(w_uv, heads, rows.len()) else { return Ok(None) };
        if w_uv.cols != l.latent_dim || q_lat.len() != rows.len() * heads * l.latent_dim || q_pe.len() != rows.len() * heads * l.rope_dim || a.layer >= l.layers || !self.mla_split_fits(pool, heads) {
            return Ok(None);
        }
        if crate::ops::check_mla_rows(l, rows).is_err() {
            return Ok(None);
        }
        #[cfg(any(feature = "cuda", feature = "hip-mock"))]
        if !self.mla_gemm_runs(rows).is_empty() {
            return Ok(None);
        }
        let [btb, offb, ctxb] = self.row_tables(rows)?;
        let (o, ml, nsplit) = match self.mla_split_parts(a, [&btb.slice(..), &offb.slice(..), &ctxb.slice(..)], true)? {
            MlaOut::Merged(o_lat) => return weft_backend::Backend::head_linear(self, &o_lat, heads, w_uv).map(Some),
            MlaOut::Parts { o, ml, nsplit } => (o, ml, nsplit),
        };
        let m = rows.len();
        let mut out = self.out(m * w_uv.rows)?;
        let warps = (THREADS / crate::SUBGROUP) as usize;
        let cfg = LaunchConfig { grid_dim: (w_uv.rows.div_ceil(warps * r) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: ((m * w_uv.cols + THREADS as usize + nsplit) * 4) as u32 };
        let (m32, rows32, cols, grp, ns) = (m as u32, w_uv.rows as u32, w_uv.cols as u32, (w_uv.rows / heads) as u32, nsplit as u32);
        let name = UV_MERGE[w_uv.fp8.is_some() as usize][r.trailing_zeros() as usize][(m > 1) as usize];
        let mut b = self.stream.launch_builder(self.func(name));
        let wa = WeightArgs::new(w_uv);
        wa.push(&mut b);
        b.arg(&o).arg(&ml).arg(&mut out).arg(&m32).arg(&rows32).arg(&cols).arg(&grp).arg(&ns);
        unsafe { b.launch(cfg) }.map_err(dev)?;
        Ok(Some(out))
    }
}

/// Where and how a step's latents are stored (`Backend::mla_store_kv`'s arguments past the pool).
pub(crate) struct LatentStore<'a> {
    pub kv_a: &'a CudaSlice<f32>,
    pub norm_w: &'a CudaSlice<f32>,
    pub eps: f32,
    pub positions: &'a [u32],
    pub slots: &'a [u32],
    pub rope: &'a RopeParams,
}

impl CudaBackend {
    /// Sub-group rows of W_UK for `rope_store_absorb_*` for `m` decoding rows (the count
    /// `gemv` would take), or `None` where the launch does not apply: more rows than
    /// `mla_absorb_fused`, weights off the CUDA-core weight-streaming path, or rows that would
    /// attend through the GEMM path (which reads q_nope).
    fn absorb_rows(&self, w_uk_t: &CudaMatrix, heads: usize, latent: usize, m: usize, rows: &[AttnRow<'_>]) -> Option<usize> {
        let fits = (1..=self.mla_absorb_fused).contains(&m)
            && rows.len() == m
            && w_uk_t.f32_data.is_none()
            && w_uk_t.rows == heads * latent
            && self.gemv_fits(w_uk_t, m)
            && !self.gemv_mma_heads_fits(w_uk_t, m, latent);
        #[cfg(any(feature = "cuda", feature = "hip-mock"))]
        let fits = fits && self.mla_gemm_runs(rows).is_empty();
        let r = crate::gemv::rows_per_subgroup(w_uk_t.rows, latent, m, self.num_sms);
        fits.then_some(r)
    }

    /// `mla_rope_q_store_kv` and W_UK's product of the queries' nope parts in one launch
    /// (`rope_store_absorb_*`, mla.cu) for a few decoding rows: `(q_lat, q_pe)`, or `None` where
    /// it does not apply (`absorb_rows`; the rope's and the cache's widths agree, the rows
    /// match) — the caller takes the ops apart, whose checks say what is wrong, if anything.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_store_absorb(
        &self,
        q: &CudaSlice<f32>,
        (heads, nope, rope_dim): (usize, usize, usize),
        pool: &mut CudaKvPool,
        layer: usize,
        st: &LatentStore<'_>,
        w_uk_t: &CudaMatrix,
        rows: &[AttnRow<'_>],
    ) -> Result<Option<(CudaSlice<f32>, CudaSlice<f32>)>> {
        let lay = pool.layout;
        let width = heads * (nope + rope_dim);
        if !self.fused_rope_store || heads == 0 || width == 0 || q.len() % width != 0 || rope_dim != lay.rope_dim || w_uk_t.cols != nope {
            return Ok(None);
        }
        let m = q.len() / width;
        let Some(r) = self.absorb_rows(w_uk_t, heads, lay.latent_dim, m, rows) else { return Ok(None) };
        if crate::ops::check_store_kv(lay, layer, st.kv_a.len(), st.positions, st.slots).ok() != Some(m) {
            return Ok(None);
        }
        let [pb, sb, fb] = self.store_kv_arrays(st.positions, st.slots, st.rope)?;
        let (pb, sb, fb) = (&*pb, &*sb, &*fb);
        let mut q_lat = self.out(m * heads * lay.latent_dim)?;
        let mut q_pe = self.out(m * heads * rope_dim)?;
        let (m32, h, n, lat, rd, inter) = (m as u32, heads as u32, nope as u32, lay.latent_dim as u32, rope_dim as u32, st.rope.interleaved as i32);
        let fp8 = w_uk_t.fp8.is_some() as usize;
        let name = ROPE_ABSORB[pool.bf16() as usize][fp8][r.trailing_zeros() as usize];
        let mut view = pool.layer_mut(layer);
        let mut l = self.stream.launch_builder(self.func(name));
        l.arg(&mut view).arg(q).arg(&mut q_lat).arg(&mut q_pe).arg(st.kv_a).arg(st.norm_w).arg(pb).arg(sb).arg(fb);
        let wa = WeightArgs::new(w_uk_t);
        wa.push(&mut l);
        l.arg(&m32).arg(&h).arg(&n).arg(&lat).arg(&rd).arg(&st.eps).arg(&st.rope.attention_factor).arg(&inter);
        let warps = (THREADS / crate::SUBGROUP) as usize;
        let blocks = m * (heads + 1) + w_uk_t.rows.div_ceil(warps * r);
        unsafe { l.launch(LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }) }.map_err(dev)?;
        Ok(Some((q_lat, q_pe)))
    }
}

/// `rope_store_absorb*` by [f32, bf16 cache][bf16, fp8 W_UK][rows per sub-group 1 / 2 / 4].
const ROPE_ABSORB: [[[&str; 3]; 2]; 2] = [
    [["rope_store_absorb_bf16_r1", "rope_store_absorb_bf16_r2", "rope_store_absorb_bf16_r4"], ["rope_store_absorb_fp8_r1", "rope_store_absorb_fp8_r2", "rope_store_absorb_fp8_r4"]],
    [
        ["rope_store_absorb_kvbf16_bf16_r1", "rope_store_absorb_kvbf16_bf16_r2", "rope_store_absorb_kvbf16_bf16_r4"],
        ["rope_store_absorb_kvbf16_fp8_r1", "rope_store_absorb_kvbf16_fp8_r2", "rope_store_absorb_kvbf16_fp8_r4"],
    ],
];

/// A split launch's result: merged, or (deferred) the splits' partial outputs and (max, sum)
/// pairs for a consumer to merge.
enum MlaOut {
    Merged(CudaSlice<f32>),
    Parts { o: CudaSlice<f32>, ml: CudaSlice<f32>, nsplit: usize },
}

/// `mla_uv_merge_*` by [bf16, fp8][rows per sub-group 1 / 2 / 4][activation rows per pass 1 / 8].
const UV_MERGE: [[[&str; 2]; 3]; 2] = [
    [["mla_uv_merge_bf16_r1_t1", "mla_uv_merge_bf16_r1_t8"], ["mla_uv_merge_bf16_r2_t1", "mla_uv_merge_bf16_r2_t8"], ["mla_uv_merge_bf16_r4_t1", "mla_uv_merge_bf16_r4_t8"]],
    [["mla_uv_merge_fp8_r1_t1", "mla_uv_merge_fp8_r1_t8"], ["mla_uv_merge_fp8_r2_t1", "mla_uv_merge_fp8_r2_t8"], ["mla_uv_merge_fp8_r4_t1", "mla_uv_merge_fp8_r4_t8"]],
];

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

    /// The wgmma kernels' layouts (two 64-token tiles of the DeepSeek-V3 / Kimi width, Q^T, per
    /// warpgroup P^T and maxima; the 64-head kernel's) must fit Hopper's 227 KB of opt-in shared memory, or
    /// `mla_mma_kernel` would pass them over for the grouped kernels without a word.
    #[test]
    fn wgmma_kernels_fit_hopper_shared_memory() {
        const HOPPER_OPTIN: usize = 232_448;
        assert_eq!(super::wg_smem(576, 1), 1024 + 2 * 9 * 8192 + 9 * 4096 + 4096 + 256);
        for groups in [1, 2] {
            assert!(super::wg_smem(576, groups) <= HOPPER_OPTIN, "{groups} warpgroups: {} bytes", super::wg_smem(576, groups));
        }
        assert_eq!(super::wg_smem(96, 2) - super::wg_smem(96, 1), 32 * 128 + 256 + 2 * 16 * 128 * 4);
        // 64 heads a block: two 32-token tiles, both query parts, the exchange — 225 KB.
        assert_eq!(super::wgh_smem(576, 2), 1024 + 2 * 9 * 4096 + 2 * 9 * 8192 + 8192);
        assert!(super::wgh_smem(576, 2) <= HOPPER_OPTIN, "{} bytes", super::wgh_smem(576, 2));
        assert_eq!(super::wgh_smem(576, 2) - super::wgh_smem(576, 1), 9 * 8192);
        // Tokens split between the warpgroups: two 64-token tiles, one query part, P, the
        // maxima — 226 KB, within 1.5 KB of the limit.
        assert_eq!(super::wgs_smem(576), 1024 + 2 * 9 * 8192 + 9 * 8192 + 8192 + 512);
        assert!(super::wgs_smem(576) <= HOPPER_OPTIN, "{} bytes", super::wgs_smem(576));
        // Two tiles a step in ping-pong: the same plus two scale vectors and four mbarriers
        // (P_B in the queries' rope chunk) — the layout of mla_pair.cu, 1.2 KB from the limit.
        assert_eq!(super::wgp_smem(), super::wgs_smem(576) - 512 + 3 * 256 + 32);
        assert!(super::wgp_smem() <= HOPPER_OPTIN, "{} bytes", super::wgp_smem());
        // Nothing static: static shared memory beside a dynamic size opted in up to the whole
        // limit makes cuFuncSetAttribute fail at start-up (round 26's first run).
    }

    #[test]
    fn several_splits_merge_in_the_kernel_only_within_one_wave() {
        // One split: any grid, any heads.
        assert!(super::mlh_merges(4096, 1, 32, 1, 132));
        assert!(super::mlh_merges(10_000, 1, 64, 2, 132));
        assert!(!super::mlh_merges(10_000, 1, 64, 0, 132));
        // 64 heads x 64 rows x 2 splits: 128 blocks on 132 SMs.
        assert!(super::mlh_merges(64, 2, 64, 2, 132));
        assert!(!super::mlh_merges(64, 2, 64, 1, 132));
        assert!(!super::mlh_merges(67, 2, 64, 2, 132));
        // Not at 32 heads a group (slower than the combine there).
        assert!(!super::mlh_merges(64, 2, 32, 2, 132));
        assert!(super::mlh_merges(64, 2, 40, 2, 132));
        assert!(super::mlh_merges(1, 16, 64, 16, 132));
        assert!(!super::mlh_merges(1, 17, 64, 16, 132));
        assert!(!super::mlh_merges(1, 2, 64, 0, 132));
    }

    #[test]
    fn tensor_core_splits_fill_whole_waves() {
        assert_eq!(super::mma_splits(64, 129, 132), 2);
        assert_eq!(super::mma_splits(1, 33, 132), 33);
        assert_eq!(super::mma_splits(8, 33, 132), 11);
        assert_eq!(super::mma_splits(500, 4, 132), 1);
        for (base, tiles) in [(1, 1), (3, 1000), (128, 7), (64, 33)] {
            let n = super::mma_splits(base, tiles, 132);
            assert!((1..=tiles).contains(&n), "{base} x {tiles}: {n}");
        }
    }
}
