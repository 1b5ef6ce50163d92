//! The CUDA backend. Weights live on the device in bf16, or in fp8 e4m3 with their block
//! scales when the checkpoint is block-fp8 (read as fp8 by the weight-streaming kernels,
//! dequantized into a scratch buffer for the tensor-core GEMM of large batches); activations
//! are f32. Router gates stay f32. Kernels come from `kernels/` and are compiled with NVRTC for
//! the device's architecture when the backend starts; cudarc loads libcuda, NVRTC and cuBLAS
//! dynamically, so this crate builds everywhere and `CudaBackend::new` returns `Unavailable`
//! on machines without them.
//!
//! Decode-sized batches (a few tokens) take weight-streaming paths that read each weight once
//! per step (`gemv`, `moe`: routing, expert plan and experts on the device, no host round
//! trip); larger batches use cuBLAS bf16 GEMMs with f32 accumulation for dense weights, and
//! for the experts a grouped GEMM over the device's routing plan (`moe`, `kernels/moe_gemm.cu`;
//! routing on the host with batched cuBLAS GEMMs only where that GEMM does not fit). Attention
//! is split along the context (`mla`).
//! Every op is checked against the CPU reference (`tests/kernels.rs`).
//!
//! The same host code drives AMD GPUs: feature `hip` (or `hip-mock`, tests without a GPU)
//! puts `weft-hip-driver` — cudarc's API over HIP — where cudarc was, so `cudarc::` below
//! names it. What differs on HIP: 64-lane sub-groups (`SUBGROUP`), kernels compiled by hiprtc
//! for the device's gfx target, GEMMs by the project's kernel (`kernels/gemm.cu`) instead of
//! cuBLAS, no tensor-core (`mma.sync`) kernels, and step graphs off unless asked for.

#[cfg(all(feature = "cuda", any(feature = "hip", feature = "hip-mock")))]
compile_error!("weft-cuda: features `cuda` and `hip`/`hip-mock` exclude each other (build HIP with --no-default-features)");
#[cfg(not(any(feature = "cuda", feature = "hip", feature = "hip-mock")))]
compile_error!("weft-cuda: enable `cuda` (default), `hip` or `hip-mock`");
#[cfg(any(feature = "hip", feature = "hip-mock"))]
extern crate weft_hip_driver as cudarc;

mod cublas_gemm;
mod dummy;
#[cfg(feature = "hip-mock")]
mod emu;
mod gemv;
mod gqa;
mod graphs;
mod halves;
mod kernel_build;
#[cfg(feature = "cuda")]
pub use kernel_build::entry_resources;
pub(crate) use kernel_build::kernel_define;
use kernel_build::{arch_number, device_arch};
pub use kernel_build::{compile_kernels, EntryResources, KERNELS, KERNEL_SOURCE};
mod mla;
pub use mla::{MmgSpec, MMG_KERNELS};
#[cfg(any(feature = "cuda", feature = "hip-mock"))]
mod mla_prefill;
mod moe;
#[cfg(feature = "cuda")]
mod moe_grouped;
pub mod nccl;
mod ops;
#[cfg(feature = "cuda")]
mod pdl;
mod precision;
mod sample;
#[cfg(feature = "cuda")]
pub mod trace;
mod uploads;

use cudarc::cublas::CudaBlas;
#[cfg(not(feature = "cuda"))]
pub use cudarc::driver::CudaGraph as StepGraph;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};
pub use graphs::GraphStats;
/// A recorded, instantiated step graph: on NVIDIA with programmatic edges between weft's
/// kernels (`pdl`), on HIP the driver's plain graph.
#[cfg(feature = "cuda")]
pub use pdl::StepGraph;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use weft_backend::{BackendError, KvLayout, Result};

/// Whether this build drives AMD GPUs (features `hip`, `hip-mock`).
pub const HIP: bool = cfg!(any(feature = "hip", feature = "hip-mock"));

/// The backend's name in errors and `Backend::name`.
pub const BACKEND: &str = if HIP { "hip" } else { "cuda" };

/// Lanes per sub-group (`WEFT_WARP` in kernels/weft_port.h): 32 on NVIDIA, 64 on AMD Instinct
/// (CDNA wavefronts; `CudaBackend::new` refuses a HIP device reporting another width). Host
/// code that sizes a grid of one-sub-group-per-row kernels divides by this.
pub(crate) const SUBGROUP: u32 = if HIP { 64 } else { 32 };

/// A weight matrix `[rows, cols]` on the device: bf16 (`data`), or fp8 with block scales
/// (`fp8`; `data` is then a one-element placeholder), except MoE router gates, which are kept
/// in f32 and multiplied in f32 — expert selection is a discrete choice, and bf16 rounding of
/// the router's inputs flips near-tied experts (measured on the golden fixtures).
pub struct CudaMatrix {
    pub rows: usize,
    pub cols: usize,
    pub data: CudaSlice<u16>,
    pub f32_data: Option<CudaSlice<f32>>,
    pub fp8: Option<Fp8Weight>,
}

/// An fp8 e4m3 weight as the checkpoint stores it: one byte per element and f32 scales per
/// `block_rows × block_cols` block (`weight_scale_inv`; dequantized = fp8 × scale).
pub struct Fp8Weight {
    pub bytes: CudaSlice<u8>,
    pub scales: CudaSlice<f32>,
    pub block_rows: usize,
    pub block_cols: usize,
}

impl Fp8Weight {
    fn grid_cols(&self, cols: usize) -> usize {
        cols.div_ceil(self.block_cols)
    }
}

impl CudaMatrix {
    /// Device bytes this weight occupies.
    pub fn device_bytes(&self) -> usize {
        self.data.len() * 2 + self.f32_data.as_ref().map_or(0, |f| f.len() * 4) + self.fp8.as_ref().map_or(0, |f| f.bytes.len() + f.scales.len() * 4)
    }
}

/// Whether a weight is multiplied in f32 (the MoE router gate).
pub fn is_router(name: &str) -> bool {
    name.ends_with(".mlp.gate.weight")
}

/// The latent KV pool on the device: `[layer][slot][latent + rope]` of `layout.dtype` values,
/// held as 4-byte words (a bf16 pool packs two values per word; its widths are even). Kernels
/// take a layer's words as `const float*` or `const u16*` by the pool's type.
pub struct CudaKvPool {
    pub layout: KvLayout,
    pub data: CudaSlice<f32>,
}

impl CudaKvPool {
    /// Words per page of one layer.
    pub(crate) fn page_words(&self) -> usize {
        self.layout.page_size * self.layout.width() * self.layout.dtype.size() / 4
    }

    /// Words per layer.
    pub(crate) fn layer_words(&self) -> usize {
        self.layout.num_pages * self.page_words()
    }

    /// One layer's words.
    pub(crate) fn layer(&self, layer: usize) -> cudarc::driver::CudaView<'_, f32> {
        let n = self.layer_words();
        self.data.slice(layer * n..(layer + 1) * n)
    }

    pub(crate) fn layer_mut(&mut self, layer: usize) -> cudarc::driver::CudaViewMut<'_, f32> {
        let n = self.layer_words();
        self.data.slice_mut(layer * n..(layer + 1) * n)
    }

    /// Whether the cache holds bf16 values (kernels `*_bf16`).
    pub(crate) fn bf16(&self) -> bool {
        self.layout.dtype == weft_backend::KvDtype::Bf16
    }
}

pub struct CudaBackend {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    blas: Mutex<CudaBlas>,
    _module: Arc<CudaModule>,
    funcs: HashMap<&'static str, CudaFunction>,
    /// Most threads a block of each kernel may have (its registers decide), asked once.
    max_threads: HashMap<&'static str, usize>,
    /// e.g. "sm_90a"
    pub arch: String,
    pub device_name: String,
    /// Fill every output with NaN before a kernel writes it (tests: unwritten elements show).
    pub poison: bool,
    /// Keep every weight in f32 and multiply in f32 (`WEFT_CUDA_F32=1`): a debugging mode that
    /// separates precision effects from bugs when comparing with the CPU reference.
    pub all_f32: bool,
    /// Use only the large-batch paths (cuBLAS, host MoE routing, single-split attention):
    /// `WEFT_CUDA_SLOW=1`, for comparisons.
    pub slow_paths: bool,
    /// A layer's query split/rope and latent store in one launch (`rope_q_store_kv`;
    /// `WEFT_CUDA_ROPE_STORE=0`: the two kernels, for comparisons).
    pub fused_rope_store: bool,
    /// Stacked two-part GEMM outputs added by their consumers (`halves.rs`;
    /// `WEFT_CUDA_HALVES=0`: `add_halves` after each, for comparisons).
    pub halves: bool,
    /// Tensor-core expert kernels for several tokens per expert (`WEFT_CUDA_MMA=0`: the
    /// CUDA-core ones, for comparisons).
    pub mma: bool,
    /// The grouped expert GEMM of bf16 experts on Hopper's warpgroup tensor cores
    /// (`kernels/moe_wgmma.cu`; sm_90a only; `WEFT_CUDA_WGMMA=0`: `moe_gemm.cu`'s mma.sync).
    pub wgmma: bool,
    /// MLA decode attention on tensor cores (`mla_decode_mma`) where the shape fits
    /// (`WEFT_CUDA_MLA_MMA=0`: the CUDA-core `mla_decode`, for comparisons).
    pub mla_mma: bool,
    /// One-part rows of prefill runs attend in one pass on tensor cores (`mla_flash_bf16`,
    /// mla_prefill.rs) where the widths fit (`WEFT_CUDA_MLA_FLASH=0`: scores through cuBLAS and
    /// a softmax pass, for comparisons).
    pub mla_flash: bool,
    /// The grouped tensor-core MLA kernels (`mla_decode_mmg*`, mla_grouped.cu) where they were
    /// measured faster than `mla_decode_mma` (`WEFT_CUDA_MLA_GROUPED=0`: never, for
    /// comparisons).
    pub mla_grouped: bool,
    /// A grouped kernel by name (`mla::MMG_KERNELS`) for every head count over its cache type
    /// (`WEFT_CUDA_MLA_MMG`), for measurements.
    pub mla_mmg: Option<&'static str>,
    /// MLA decode over a bf16 cache on Hopper's warpgroup tensor cores (mla_wgmma.cu; sm_90a)
    /// where the layout fits: 16 heads a block with this many warpgroups (1, 2) for at most
    /// `mla_wgmma_max_heads` heads, 64 heads a block beyond, one bf16 part of queries and
    /// weights — FlashMLA's numerics, ~1e-3 from the other paths: `mla_decode_wgp_bf16`
    /// (mla_pair.cu: two tiles a step in ping-pong between the warpgroups) at DeepSeek-V3's
    /// width (512 + 64), `mla_decode_wgs_bf16` (the warpgroups split each tile's tokens) at
    /// others. Default: two warpgroups up to 16 heads, the 64-head kernels above (results
    /// rounds 19, 20, 24, 25).
    /// `WEFT_CUDA_MLA_WGMMA=0` never; `=1` / `=2` one 16-head variant for every head count;
    /// `=3` the two-part 64-head kernel (`mla_decode_wgh_bf16`: the warpgroups split each
    /// tile's width) for every head count, `=4` its one-part variant, `=5` `mla_decode_wgs_bf16`
    /// for every head count, `=6` `mla_decode_wgp_bf16` for every head count where it fits.
    pub mla_wgmma: Option<usize>,
    /// Most heads a row `mla_wgmma` takes (`mla::WG_DEFAULT_MAX_HEADS`; any when set).
    pub mla_wgmma_max_heads: usize,
    /// Most context splits the 64-head MLA kernels merge in the kernel instead of through
    /// `mla_combine` (`WEFT_CUDA_MLA_MERGE`, default 2; 0: never; the emulator checks up to 16):
    /// a single split writes its rows out at once; several share the merge, each split's block
    /// merging some of the 64-column tiles after waiting for the others' partials — so only
    /// where the launch's whole grid is resident at once, for head groups above 32
    /// (`mla::mlh_merges`). Two splits measured 1.07–1.09× the combine at 64 heads × 64 rows ×
    /// 4096; 16 (one row × 1024) 2× slower, as a merging thread reads the other splits one
    /// after another (round 27).
    pub mla_merge: usize,
    /// Decode batches of at most this many rows take a projection back to the residual stream
    /// and the norm after it (`linear_add_rms_norm`: o_proj, the post-attention norm) in one
    /// launch (`gemv_add_rms_norm_*`: the GEMV's last block adds and norms;
    /// `WEFT_CUDA_GEMV_NORM_FUSED`, default 0: never). Measured slower (round 29, H100: 9.0 µs a
    /// layer on the chain against 7.3 for o_proj's GEMV and the norm).
    pub gemv_norm_fused: usize,
    /// Decode batches of at most this many rows absorb their queries (W_UK) in the launch that
    /// ropes them and stores the latents (`rope_store_absorb_*`, mla.cu) instead of a GEMV
    /// after it (`WEFT_CUDA_MLA_ABSORB_FUSED`, default 1; 0: never). Only where W_UK takes the
    /// CUDA-core weight-streaming path. Round 29 (H100): 3.4 µs a layer on the chain against 5.4
    /// for the two launches; Moonlight batch 1 2.95 → 2.90 ms with the merge below.
    pub mla_absorb_fused: usize,
    /// Decode batches of at most this many rows merge MLA's context splits inside W_UV's launch
    /// (`mla_uv_merge_*`, mla.cu: each block merges its head's splits, then its rows' GEMV)
    /// instead of `mla_combine` and then the GEMV (`WEFT_CUDA_MLA_UV_MERGE`, default 1; 0:
    /// never). Only where W_UV takes the CUDA-core weight-streaming path. Round 29 (H100): 5.5 µs
    /// a layer on the chain against ~6 for the two launches (within noise end to end).
    pub mla_uv_merge: usize,
    /// Fewest activation rows the dense tensor-core kernels take (2; `WEFT_CUDA_MMA_MIN_M`).
    pub mma_min_m: usize,
    /// Most activation rows the dense tensor-core kernels take for bf16 / fp8 weights
    /// (`gemv::MMA_DEFAULT_MAX_M`: 32 / 64; `WEFT_CUDA_MMA_MAX_M` / `WEFT_CUDA_MMA_MAX_M_FP8`
    /// move them, up to 64, for measurements).
    pub mma_max_m: [usize; 2],
    /// Most rows the per-head absorbed matrices (`head_linear`: W_UK, W_UV) take the bf16
    /// tensor-core pass for — 64, where it beat cuBLAS's two passes (round 17: 1.2–1.4×) while
    /// the other projections stay on cuBLAS past 32 (`WEFT_CUDA_MMA_HEADS_MAX_M`).
    pub mma_heads_max_m: usize,
    /// Largest thread block cluster (1, 2, 4 or 8 blocks) that splits the columns of a 64-row
    /// tensor-core pass over too few 32-row units to fill the GPU (`gemv_mma_bf16_n8_c*`;
    /// sm_90 and later: 4, else 1; `WEFT_CUDA_MMA_CLUSTER`; never more than the device can
    /// schedule, `gemv::schedulable_cluster`).
    pub mma_cluster: usize,
    /// Most 32-row units (weight rows / 32) a bf16 matrix may have for the 64-row pass: it reads
    /// the activations once per unit (four times the weights' bytes, from L2), which pays where
    /// cuBLAS is bound by latency (the attention and shared-expert projections, not lm_head's
    /// 5,120 units). Default two per SM; `WEFT_CUDA_MMA_WIDE_MAX_UNITS`.
    pub mma_wide_max_units: usize,
    /// Units a block of the 64-row pass takes (1, 2 or 4; `WEFT_CUDA_MMA_WIDE_UB`, default 1):
    /// its sub-groups over one share of the columns read the same activations, so more units a
    /// block means fewer activation reads from L2 but fewer, larger blocks.
    pub mma_wide_ub: usize,
    /// cuBLAS GEMMs take f32 activations as two bf16 parts in two passes (default), so a row's
    /// result does not depend on which kernel its batch size picked, to f32-accumulation
    /// distance: greedy speculative decoding then matches plain decoding. Prompt rows of long
    /// runs take one part inside a step (`prefill_parts`, `precision.rs`).
    /// `WEFT_CUDA_GEMM_SPLIT=0`: one pass with bf16-rounded activations everywhere (~1e-3
    /// relative; half the GEMM work).
    pub gemm_split: bool,
    /// Activation parts of prompt rows in long runs (`precision.rs`): 1 (default) or 2
    /// (`WEFT_CUDA_PREFILL_PARTS`); decode and verification rows always take `gemm_split`'s.
    pub prefill_parts: usize,
    /// Fewest consecutive rows of one sequence that count as a prompt run for that (64;
    /// `WEFT_CUDA_PREFILL_RUN_ROWS`).
    pub prefill_run_rows: usize,
    /// Up to this many activation rows, a split cuBLAS GEMM of one weight takes the two parts as
    /// one GEMM of twice the rows (the weight read once, one GEMM launch) plus `add_halves`,
    /// instead of two accumulating passes (64; `WEFT_CUDA_GEMM_STACK_MAX_M`, 0 = always two
    /// passes). Larger GEMMs gain nothing from it and pay the extra pass over the output.
    pub gemm_stack_max_m: usize,
    /// Fewest heads per MLA block when splitting the head groups to fill the GPU (8;
    /// `WEFT_CUDA_MLA_MIN_GROUP`, 16 keeps whole groups).
    pub mla_min_group: usize,
    /// Where ops allocate while a step is recorded, when step graphs get programmatic edges
    /// ([`Self::pdl`]).
    #[cfg(feature = "cuda")]
    arena: Option<pdl::RecordingArena>,
    /// Fewest 16-token tiles per MLA context split (1; `WEFT_CUDA_MLA_SPLIT_TILES`): fewer,
    /// longer splits trade parallelism for less per-split work (query loads, partial outputs).
    pub mla_split_tiles: usize,
    /// MLA decode blocks wanted per SM (4; `WEFT_CUDA_MLA_WAVES`): the context is split until
    /// rows × head groups × splits reaches this many waves.
    pub mla_waves: usize,
    /// Most routed tokens per expert on average that the device MoE path takes with the
    /// tensor-core expert kernels (`WEFT_CUDA_MOE_DEVICE_TOKENS`, default 32) when the grouped
    /// GEMM below does not take the shapes; past it, routing on the host.
    pub moe_device_tokens: usize,
    /// Fewest routed tokens per expert on average at which the device MoE path runs the experts
    /// as a grouped GEMM over the device plan (`kernels/moe_gemm.cu`: tiles of 64 tokens through
    /// shared memory) instead of the weight-streaming kernels (`WEFT_CUDA_MOE_GEMM_TOKENS`,
    /// default 16; 0 = never). Where that GEMM takes the shapes, no batch leaves the device
    /// path.
    pub moe_gemm_tokens: usize,
    /// Past the device path, bf16 experts run as two grouped cuBLAS GEMMs over all active
    /// experts (`moe_grouped.rs`) instead of a GEMM pair per expert (`WEFT_CUDA_MOE_GROUPED=0`:
    /// the per-expert path, for comparisons).
    pub moe_grouped: bool,
    /// Batches of at most this many tokens run the shared experts' chunks with the routed
    /// experts, as experts every token takes with weight 1 — one launch pair over all of them
    /// instead of a gated linear and a linear apart (`WEFT_CUDA_MOE_SHARED_FUSED`, default 8;
    /// 0: always apart). Past a few tokens the chunks, which take every token, hold back the
    /// weight-streaming launch that spreads the routed experts' few tokens each (measured on an
    /// H100, Moonlight: 1.09× faster at batch 1, 1.34× slower at batch 64).
    pub moe_shared_fused: usize,
    /// Batches of at most this many tokens take the MoE router's product in the routing's own
    /// launch (`moe_router_route_plan`: a sub-group a router row, the last block to finish
    /// routing every token in turn and planning) instead of a GEMV before it
    /// (`WEFT_CUDA_MOE_ROUTER_FUSED`, default 0: never). Measured slower (round 29, H100 with
    /// programmatic edges: 14.5 µs a layer on the chain against 9.1 for the two launches — the
    /// last block's fence, count and serial tail cost more than the edge it saves).
    pub moe_router_fused: usize,
    /// A single decoding token's expert down products and their combine run in one launch
    /// (`moe_down_combine_*`: the last block of each tile of rows sums the tile's rows;
    /// `WEFT_CUDA_MOE_DOWN_COMBINE=1`). Off by default: measured slower (round 29, H100: 24.2 µs
    /// a layer on the chain against 22.0 for the down kernel and `moe_combine`).
    pub moe_down_combine: bool,
    /// Most experts for which a single decoding token's routing runs in the experts' gate|up
    /// launch (moe.cu `moe_gate_up_route_*`: every routed block picks the token's experts itself
    /// from the router's logits, the first also writing the routing and plan) instead of
    /// `moe_route_plan`'s launch before it (`WEFT_CUDA_MOE_ROUTE_FUSED`, 0 = never; at most 512).
    /// Default 64: Moonlight (64 experts) measured 2.83 → 2.72 ms a batch-1 step on an H100, the
    /// Kimi-K2 slice (384, fp8) 2.03 → 2.16 (results round 32).
    pub moe_route_fused: usize,
    /// The MoE combine adds its output into the residual stream and applies the next norm in
    /// the same launch (`moe_combine_add_rms_norm`, `Backend::moe_block_routed_add_norm`;
    /// `WEFT_CUDA_MOE_COMBINE_NORM=0` runs `moe_combine` and then `add_rms_norm`).
    pub moe_combine_norm: bool,
    /// The router of a single decoding token (f32 rows) by `gemv_f32_pre_t1`: its rows loaded
    /// into registers before the kernel's wait, two sub-groups a block (`WEFT_CUDA_ROUTER_PRE=1`;
    /// default off — `gemv_f32_t1`, eight sub-groups a block loading after the wait; the same
    /// bits. Within noise of it on an H100: Moonlight batch 1 2.799 / 2.839 ms against 2.807 /
    /// 2.813, results round 31).
    pub router_pre: bool,
    /// Which single-row norms let the next launch in at their start (`WEFT_CUDA_NORM_TRIGGER`,
    /// a bit mask; default 0 — bit 1 cost a Moonlight batch-1 step 30–45 µs on an H100, results
    /// round 31): 1 `add_rms_norm` (the post-attention norm,
    /// before the router), 2 `moe_combine_add_rms_norm` (before the next layer's first GEMV).
    /// The next kernel's blocks then load (the `WEFT_GEMV_PRELOAD` variant, `gemv_f32_pre_t1`)
    /// or prefetch their static weights while the norm's one block works.
    pub norm_trigger: u32,
    /// Two weights on the same rows (`linear_pair`) share one weight-streaming launch where both
    /// take the CUDA-core path (`WEFT_CUDA_GEMV_PAIR=0`: two launches, for comparisons).
    pub gemv_pair: bool,
    /// Fewest consecutive query rows of one sequence (a prefill chunk) that attend through
    /// cuBLAS (`mla_prefill.rs`) rather than the decode kernel (64; `WEFT_CUDA_MLA_GEMM_MIN_ROWS`,
    /// 0 = never).
    pub mla_gemm_min_rows: usize,
    /// Bytes of scores and split weights one query tile of that path may take (1 GiB).
    pub mla_score_bytes: usize,
    /// Most query rows per tile of that path (256; `WEFT_CUDA_MLA_PREFILL_TILE`): a tile
    /// multiplies only the keys its last row sees, so smaller tiles skip more of the causal
    /// triangle (one 1024-row tile computes 1024² scores per head, four 256-row tiles 62.5 % of
    /// that), at the price of smaller GEMMs.
    pub mla_prefill_tile: usize,
    /// Long runs decompress the context's keys and values per head (`mla_attention_heads`:
    /// 192 + 128 products per query, key and head instead of the absorbed 576 + 512) when the
    /// per-head up-projections are bf16 and the decompressed context fits `mla_decompress_bytes`
    /// (`WEFT_CUDA_MLA_DECOMPRESS=0`: absorbed, for comparisons).
    pub mla_decompress: bool,
    /// Bytes the decompressed keys and values (bf16 parts) of one run may take (4 GiB: ~420k
    /// tokens of context at 16 heads in one part, the prompt rows' default; ~210k in two).
    pub mla_decompress_bytes: usize,
    /// Bytes of f32 products one block of keys may take while they are decompressed (256 MiB).
    pub mla_decompress_block_bytes: usize,
    pub num_sms: usize,
    /// Largest dynamic shared memory a block may opt into.
    pub smem_optin: usize,
    uploads: uploads::UploadCache,
    expert_tables: Mutex<HashMap<(u64, usize), Arc<moe::ExpertTables>>>,
    /// The routing kernel's count of finished blocks (zero between launches).
    moe_counter: Mutex<CudaSlice<u32>>,
    /// The in-kernel MLA merge's counters: for each block (row × head group) of a launch that
    /// merges several splits — at most one an SM (`mla::mlh_merges`) — the splits whose partials
    /// are stored and those past the wait; zero between launches (the last split past the wait
    /// resets its pair).
    mla_sem: Mutex<CudaSlice<u32>>,
    /// `moe_down_combine_*`'s counters, one a tile of down rows (`moe::MOE_SEM`); zero between
    /// launches (each tile's last block resets its own).
    moe_sem: Mutex<CudaSlice<u32>>,
    /// `gemv_add_rms_norm_*`'s count of finished blocks (zero between launches).
    gemv_counter: Mutex<CudaSlice<u32>>,
    /// cuBLAS's workspace (kept alive while the handle uses it).
    #[cfg(feature = "cuda")]
    _blas_workspace: CudaSlice<u8>,
    /// Between `begin_capture` and `end_capture`: host copies are refused (see `no_capture`).
    capturing: std::sync::atomic::AtomicBool,
    /// Rows of the step being run and which of them take two activation parts.
    step_precision: precision::StepPrecision,
    /// Recorded forward steps (`Backend::run_step`).
    graphs: Mutex<graphs::StepGraphs>,
    /// The step being recorded, while one is.
    recording: Mutex<Option<graphs::Recording>>,
}

fn dev(e: impl std::fmt::Debug) -> BackendError {
    BackendError::Device(format!("{e:?}"))
}

fn unavailable(reason: String) -> BackendError {
    BackendError::Unavailable { backend: BACKEND, reason }
}

/// Kernels whose threads keep something in local memory (bytes a thread), by name: an array
/// indexed at run time, or a value reached through a pointer the compiler cannot resolve, lands
/// there, and every thread then writes and reads it through the caches — round 31's
/// pre-loaded GEMV pass sat in 176 bytes of it and cost a Moonlight step 0.45 ms on an H100.
/// No kernel of `KERNELS` should have any (the device test `kernels_keep_nothing_in_local_memory`).
#[cfg(feature = "cuda")]
fn local_memory(funcs: &HashMap<&'static str, CudaFunction>) -> Vec<(&'static str, usize)> {
    let mut v: Vec<_> = funcs.iter().filter_map(|(&k, f)| Some((k, f.local_size_bytes().ok().filter(|&b| b > 0)? as usize))).collect();
    v.sort();
    v
}

/// Says at start-up which kernels (of this build and kernel variant) use local memory.
#[cfg(feature = "cuda")]
fn warn_local_memory(funcs: &HashMap<&'static str, CudaFunction>) {
    let v = local_memory(funcs);
    if !v.is_empty() {
        tracing::warn!("kernels keeping values in local memory (bytes a thread; slow): {v:?}");
    }
}

/// cudarc allocates with `cuMemAllocAsync` from the device's default memory pool; by default
/// the pool hands freed memory back to the driver at every synchronisation, so each step would
/// allocate afresh. With the release threshold at its maximum the pool keeps what it has
/// served: after the first step of a shape, the step loop's activations come from the pool,
/// not from the driver.
#[cfg(feature = "cuda")]
fn keep_pool_memory(ctx: &CudaContext) {
    use cudarc::driver::sys;
    unsafe {
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS {
            let mut max = u64::MAX;
            let _ = sys::cuMemPoolSetAttribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &mut max as *mut u64 as *mut std::ffi::c_void);
        }
    }
}

impl CudaBackend {
    /// Kernels of this build (and kernel variant) that keep values in local memory, with the
    /// bytes a thread: `local_memory`.
    #[cfg(feature = "cuda")]
    pub fn kernels_in_local_memory(&self) -> Vec<(&'static str, usize)> {
        local_memory(&self.funcs)
    }

    /// Opens device `ordinal`, compiles the kernels for it and creates the cuBLAS handle.
    /// Machines without the CUDA driver (or NVRTC/cuBLAS) get `Unavailable`, not a panic.
    pub fn new(ordinal: usize) -> Result<Self> {
        // cudarc's dynamic loader panics when a library is missing: look for them first.
        for (lib, present) in [
            ("the CUDA driver (libcuda)", unsafe { cudarc::driver::sys::is_culib_present() }),
            ("NVRTC", unsafe { cudarc::nvrtc::sys::is_culib_present() }),
            ("cuBLAS", unsafe { cudarc::cublas::sys::is_culib_present() }),
        ] {
            if !present {
                return Err(unavailable(format!("{lib} is not installed")));
            }
        }
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|_| unavailable("the CUDA driver library (libcuda) could not be loaded".into()))?
            .map_err(|e| unavailable(format!("device {ordinal}: {e:?}")))?;
        let arch = device_arch(&ctx)?;
        let device_name = ctx.name().unwrap_or_else(|_| "unknown".into());
        let ptx = compile_kernels(arch)?;
        let module = ctx.load_module(ptx).map_err(dev)?;
        let (mut funcs, mut max_threads) = (HashMap::new(), HashMap::new());
        for &k in KERNELS {
            let f = module.load_function(k).map_err(|e| BackendError::Device(format!("kernel {k}: {e:?}")))?;
            max_threads.insert(k, f.max_threads_per_block().map_err(dev)? as usize);
            funcs.insert(k, f);
        }
        #[cfg(feature = "cuda")]
        warn_local_memory(&funcs);
        use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
        let num_sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(dev)? as usize;
        let smem_optin = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).map_err(dev)? as usize;
        for k in [
            "mla_decode",
            "mla_decode_bf16",
            "mla_decode_mma",
            "mla_decode_mma_bf16",
            "moe_gemm_gate_up_bf16",
            "moe_gemm_gate_up_fp8",
            "moe_gemm_down_bf16",
            "moe_gemm_down_fp8",
            "moe_wg_gate_up_bf16",
            "moe_wg_down_bf16",
            "moe_wg2_gate_up_bf16",
            "moe_wg2_down_bf16",
            "mla_flash_bf16",
            "mla_decode_wg_bf16",
            "mla_decode_wg2_bf16",
            "mla_decode_wgh_bf16",
            "mla_decode_wgh1_bf16",
            "mla_decode_wgs_bf16",
            "mla_decode_wgp_bf16",
        ]
        .into_iter()
        .chain(mla::MMG_KERNELS.iter().map(|k| k.name))
        .chain(gemv::GEMV_MMA_WIDE.iter().flatten().copied())
        {
            funcs[k].set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_optin as i32).map_err(dev)?;
        }
        // Clusters for the 64-row pass: sm_90 and later, as large as asked (default 4) and the
        // device can schedule.
        let mma_cluster = if arch_number(arch) >= 90 { std::env::var("WEFT_CUDA_MMA_CLUSTER").ok().and_then(|v| v.parse().ok()).unwrap_or(4).clamp(1, 8) } else { 1 };
        #[cfg(feature = "cuda")]
        let mma_cluster = if mma_cluster > 1 { gemv::schedulable_cluster(&funcs, &max_threads, smem_optin, mma_cluster) } else { 1 };
        // A stream of the backend's own (the legacy default stream cannot be captured into a
        // graph). Every buffer of this backend lives on this one stream, so cudarc's
        // cross-stream event tracking would only add two events per launch argument.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(dev)?;
        let moe_counter = stream.alloc_zeros::<u32>(1).map_err(dev)?;
        let mla_sem = stream.alloc_zeros::<u32>(2 * num_sms).map_err(dev)?;
        let moe_sem = stream.alloc_zeros::<u32>(moe::MOE_SEM).map_err(dev)?;
        let gemv_counter = stream.alloc_zeros::<u32>(1).map_err(dev)?;
        #[cfg(feature = "cuda")]
        keep_pool_memory(&ctx);
        let blas = std::panic::catch_unwind(|| CudaBlas::new(stream.clone())).map_err(|_| unavailable("cuBLAS could not be loaded".into()))?.map_err(dev)?;
        // A workspace of cuBLAS's own would be allocated inside every recorded GEMM (a memory
        // node in the step graph, which keeps the graph's edges from being made programmatic).
        #[cfg(feature = "cuda")]
        let blas_workspace = {
            const BYTES: usize = 32 << 20;
            let ws = stream.alloc_zeros::<u8>(BYTES).map_err(dev)?;
            let (ptr, guard) = cudarc::driver::DevicePtr::device_ptr(&ws, &stream);
            let st = unsafe { cudarc::cublas::sys::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut std::ffi::c_void, BYTES) };
            if st != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(BackendError::Device(format!("cublasSetWorkspace: {st:?}")));
            }
            drop(guard);
            ws
        };
        let poison = std::env::var("WEFT_CUDA_POISON").is_ok_and(|v| v == "1");
        let all_f32 = std::env::var("WEFT_CUDA_F32").is_ok_and(|v| v == "1");
        let slow_paths = std::env::var("WEFT_CUDA_SLOW").is_ok_and(|v| v == "1");
        // The tensor-core kernels are NVIDIA's `mma.sync` (trap stubs on HIP).
        let mma = !HIP && std::env::var("WEFT_CUDA_MMA").map_or(true, |v| v != "0");
        let wgmma_setting: Option<usize> = std::env::var("WEFT_CUDA_MLA_WGMMA").ok().and_then(|v| v.parse().ok());
        #[cfg(feature = "cuda")]
        let arena = (arch_number(arch) >= 90 && std::env::var("WEFT_CUDA_PDL").map_or(true, |v| v != "0")).then(|| pdl::RecordingArena::new(&ctx)).transpose()?;
        Ok(CudaBackend {
            ctx,
            stream,
            blas: Mutex::new(blas),
            _module: module,
            funcs,
            max_threads,
            arch: arch.to_string(),
            device_name,
            poison,
            all_f32,
            slow_paths,
            fused_rope_store: std::env::var("WEFT_CUDA_ROPE_STORE").map_or(true, |v| v != "0"),
            halves: std::env::var("WEFT_CUDA_HALVES").map_or(true, |v| v != "0"),
            mma,
            wgmma: mma && arch == "sm_90a" && std::env::var("WEFT_CUDA_WGMMA").map_or(true, |v| v != "0"),
            mla_mma: mma && std::env::var("WEFT_CUDA_MLA_MMA").map_or(true, |v| v != "0"),
            mla_flash: mma && std::env::var("WEFT_CUDA_MLA_FLASH").map_or(true, |v| v != "0"),
            mma_min_m: std::env::var("WEFT_CUDA_MMA_MIN_M").ok().and_then(|v| v.parse().ok()).unwrap_or(2),
            mma_max_m: [0, 1].map(|i| {
                let var = ["WEFT_CUDA_MMA_MAX_M", "WEFT_CUDA_MMA_MAX_M_FP8"][i];
                std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(gemv::MMA_DEFAULT_MAX_M[i]).min(gemv::MMA_MAX_M)
            }),
            mma_heads_max_m: std::env::var("WEFT_CUDA_MMA_HEADS_MAX_M").ok().and_then(|v| v.parse().ok()).unwrap_or(gemv::MMA_MAX_M).min(gemv::MMA_MAX_M),
            mma_cluster,
            mma_wide_max_units: std::env::var("WEFT_CUDA_MMA_WIDE_MAX_UNITS").ok().and_then(|v| v.parse().ok()).unwrap_or(2 * num_sms),
            mma_wide_ub: std::env::var("WEFT_CUDA_MMA_WIDE_UB").ok().and_then(|v| v.parse().ok()).unwrap_or(1).clamp(1, 4),
            #[cfg(feature = "cuda")]
            arena,
            gemm_split: std::env::var("WEFT_CUDA_GEMM_SPLIT").map_or(true, |v| v != "0"),
            prefill_parts: std::env::var("WEFT_CUDA_PREFILL_PARTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).clamp(1, 2),
            prefill_run_rows: std::env::var("WEFT_CUDA_PREFILL_RUN_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
            gemm_stack_max_m: std::env::var("WEFT_CUDA_GEMM_STACK_MAX_M").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
            mla_split_tiles: std::env::var("WEFT_CUDA_MLA_SPLIT_TILES").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1),
            mla_grouped: std::env::var("WEFT_CUDA_MLA_GROUPED").map_or(true, |v| v != "0"),
            mla_wgmma: wgmma_setting.map_or(Some(2), |n| Some(n).filter(|&n| (1..=6).contains(&n))).filter(|_| mma && arch == "sm_90a"),
            mla_wgmma_max_heads: if wgmma_setting.is_some() { usize::MAX } else { mla::WG_DEFAULT_MAX_HEADS },
            gemv_norm_fused: std::env::var("WEFT_CUDA_GEMV_NORM_FUSED").ok().and_then(|v| v.parse().ok()).unwrap_or(0),
            mla_absorb_fused: std::env::var("WEFT_CUDA_MLA_ABSORB_FUSED").ok().and_then(|v| v.parse().ok()).unwrap_or(1),
            mla_uv_merge: std::env::var("WEFT_CUDA_MLA_UV_MERGE").ok().and_then(|v| v.parse().ok()).unwrap_or(1),
            mla_merge: std::env::var("WEFT_CUDA_MLA_MERGE").ok().and_then(|v| v.parse().ok()).unwrap_or(2),
            mla_mmg: std::env::var("WEFT_CUDA_MLA_MMG").ok().and_then(|v| mla::MMG_KERNELS.iter().find(|k| k.name == v).map(|k| k.name)),
            mla_min_group: std::env::var("WEFT_CUDA_MLA_MIN_GROUP").ok().and_then(|v| v.parse().ok()).unwrap_or(8).max(1),
            mla_waves: std::env::var("WEFT_CUDA_MLA_WAVES").ok().and_then(|v| v.parse().ok()).unwrap_or(4).max(1),
            moe_device_tokens: std::env::var("WEFT_CUDA_MOE_DEVICE_TOKENS").ok().and_then(|v| v.parse().ok()).unwrap_or(32),
            moe_gemm_tokens: std::env::var("WEFT_CUDA_MOE_GEMM_TOKENS").ok().and_then(|v| v.parse().ok()).unwrap_or(16),
            moe_grouped: std::env::var("WEFT_CUDA_MOE_GROUPED").map_or(true, |v| v != "0"),
            moe_shared_fused: std::env::var("WEFT_CUDA_MOE_SHARED_FUSED").ok().and_then(|v| v.parse().ok()).unwrap_or(8),
            moe_router_fused: std::env::var("WEFT_CUDA_MOE_ROUTER_FUSED").ok().and_then(|v| v.parse().ok()).unwrap_or(0),
            moe_down_combine: std::env::var("WEFT_CUDA_MOE_DOWN_COMBINE").is_ok_and(|v| v != "0"),
            moe_route_fused: std::env::var("WEFT_CUDA_MOE_ROUTE_FUSED").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
            moe_combine_norm: std::env::var("WEFT_CUDA_MOE_COMBINE_NORM").map_or(true, |v| v != "0"),
            router_pre: std::env::var("WEFT_CUDA_ROUTER_PRE").is_ok_and(|v| v != "0"),
            norm_trigger: std::env::var("WEFT_CUDA_NORM_TRIGGER").ok().and_then(|v| v.parse().ok()).unwrap_or(0),
            gemv_pair: std::env::var("WEFT_CUDA_GEMV_PAIR").map_or(true, |v| v != "0"),
            // Not on HIP: its stand-in GEMM (kernels/gemm.cu) is slower than the decode kernel.
            // The mock build has the path for tests, off unless they turn it on.
            mla_gemm_min_rows: std::env::var("WEFT_CUDA_MLA_GEMM_MIN_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(if cfg!(feature = "cuda") { 64 } else { 0 }),
            mla_score_bytes: 1 << 30,
            mla_prefill_tile: std::env::var("WEFT_CUDA_MLA_PREFILL_TILE").ok().and_then(|v| v.parse().ok()).unwrap_or(256).max(1),
            mla_decompress: std::env::var("WEFT_CUDA_MLA_DECOMPRESS").map_or(true, |v| v != "0"),
            mla_decompress_bytes: 4 << 30,
            mla_decompress_block_bytes: 256 << 20,
            num_sms,
            smem_optin,
            uploads: uploads::UploadCache::default(),
            expert_tables: Mutex::new(HashMap::new()),
            moe_counter: Mutex::new(moe_counter),
            mla_sem: Mutex::new(mla_sem),
            moe_sem: Mutex::new(moe_sem),
            gemv_counter: Mutex::new(gemv_counter),
            #[cfg(feature = "cuda")]
            _blas_workspace: blas_workspace,
            capturing: std::sync::atomic::AtomicBool::new(false),
            step_precision: precision::StepPrecision::default(),
            graphs: Mutex::new(graphs::StepGraphs::from_env()),
            recording: Mutex::new(None),
        })
    }

    /// Whether step graphs get programmatic edges between weft's kernels (`pdl`): Hopper and
    /// later, unless `WEFT_CUDA_PDL=0`.
    pub fn pdl(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.arena.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    fn func(&self, name: &str) -> &CudaFunction {
        &self.funcs[name]
    }

    /// Waits for everything queued on the backend's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(dev)
    }

    /// The device's copy bandwidth (bytes read plus bytes written per second, a 1 GiB
    /// device-to-device copy five times after one warm-up): the ceiling benchmarks divide by.
    pub fn measure_copy_bandwidth(&self) -> Result<f64> {
        let n = 1usize << 28;
        let src = self.stream.alloc_zeros::<f32>(n).map_err(dev)?;
        let mut dst = self.stream.alloc_zeros::<f32>(n).map_err(dev)?;
        self.stream.memcpy_dtod(&src, &mut dst).map_err(dev)?;
        self.synchronize()?;
        let t = std::time::Instant::now();
        for _ in 0..5 {
            self.stream.memcpy_dtod(&src, &mut dst).map_err(dev)?;
        }
        self.synchronize()?;
        Ok(5.0 * 2.0 * (n * 4) as f64 / t.elapsed().as_secs_f64())
    }

    /// Starts recording the backend's stream into a CUDA graph: ops called until
    /// `end_capture` are recorded, not run. Every host array they take must already be on the
    /// device (an upload-cache hit), since a host-to-device copy cannot be recorded.
    pub fn begin_capture(&self) -> Result<()> {
        use cudarc::driver::sys::CUstreamCaptureMode::*;
        // The recording arena allocates on a stream of its own while this one records, which
        // the thread-local mode refuses; the backend's own checks (`no_capture`) keep host
        // copies out of a recording either way.
        #[cfg(feature = "cuda")]
        let mode = if self.arena.is_some() { CU_STREAM_CAPTURE_MODE_RELAXED } else { CU_STREAM_CAPTURE_MODE_THREAD_LOCAL };
        #[cfg(not(feature = "cuda"))]
        let mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.stream.begin_capture(mode).map_err(dev)?;
        self.capturing.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// An error for an op that must copy between host and device while a graph is being
    /// recorded. Such a copy would be recorded with the address of a temporary host buffer and
    /// replayed into (or from) freed memory, and a host decision made on its data (MoE routing
    /// of large batches) would be frozen into the graph — so those steps cannot be graphs.
    pub(crate) fn no_capture(&self, what: &str) -> Result<()> {
        if self.capturing.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(BackendError::Device(format!("{what} copies between host and device and cannot be recorded into a CUDA graph")));
        }
        Ok(())
    }

    /// The graph recorded since `begin_capture`, instantiated; `launch()` replays it.
    /// Buffers allocated while recording belong to the graph (same addresses every replay).
    pub fn end_capture(&self) -> Result<StepGraph> {
        self.capturing.store(false, std::sync::atomic::Ordering::Relaxed);
        let flags = cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        #[cfg(feature = "cuda")]
        let graph = {
            let ours: std::collections::HashSet<usize> = if self.pdl() { self.funcs.values().map(|f| f.cu_function() as usize).collect() } else { Default::default() };
            StepGraph::end_capture(&self.stream, &ours, flags)?
        };
        #[cfg(not(feature = "cuda"))]
        let graph = self.stream.end_capture(flags).map_err(dev)?;
        graph.ok_or_else(|| BackendError::Device("the capture recorded nothing".into()))
    }
}
