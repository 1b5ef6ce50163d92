//! MoE entirely on the device (`kernels/moe.cu`): routing, a plan of active experts and the
//! (token, slot) entries each serves (and the entries cut into tiles of 64), then the experts
//! over a per-layer table of expert weight pointers — weight-streaming kernels while experts see
//! few tokens each (decode), a grouped GEMM over the plan's tiles past `moe_gemm_tokens` per
//! expert (prefill; `kernels/moe_gemm.cu`) — and a combine that sums each token's slots in
//! order. The launch grids are sized for the worst case (every selected expert distinct, every
//! expert's last tile partial), so nothing waits for the host.

use crate::ops::cfg;
use crate::precision::TokenParts;
use crate::{dev, CudaBackend, CudaMatrix};
use cudarc::driver::{CudaSlice, DevicePtr, LaunchArgs, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use weft_backend::{Backend, ExpertWeights, Result, RouterConfig};

const THREADS: u32 = 256;
const MAX_EXPERTS: usize = 1024;
const MAX_GROUPS: usize = 64;
/// The device path is taken while experts see few tokens each on average (weight streaming
/// beats per-expert GEMMs after host routing there): 8 on CUDA cores; with the tensor-core
/// expert kernels, the backend's `moe_device_tokens`.
const MAX_AVG_TOKENS_PER_EXPERT: usize = 8;

/// Down-projection rows per sub-group in the CUDA-core expert kernels (`MOE_DOWN_ROWS` in moe.cu).
const DOWN_ROWS: usize = 2;
/// Counters of `moe_down_combine_*` (one a tile of down rows): hidden sizes up to 32,768.
pub(crate) const MOE_SEM: usize = 2048;
/// Weight rows per tensor-core tile (`MMA_ROWS` in mma.cu) and threads per block there.
const MMA_ROWS: usize = 16;
const MMA_THREADS: u32 = 128;
/// The grouped GEMM (`kernels/moe_gemm.cu`): plan rows per tile (`MOE_TILE_ROWS` in moe.cu),
/// weight rows per block, threads per block.
const TILE_ROWS: usize = 64;
const GEMM_ROWS: usize = 128;
const GEMM_THREADS: u32 = 128;

/// How the grouped GEMM was compiled: columns per stage (`MG_BK`: 32, or `WEFT_MG_BK=N`), and
/// with `WEFT_MG_ASYNC` its bf16 kernels' cp.async stages (`WEFT_MG_STAGES`, default 3) over
/// two-part bf16 operands.
struct GemmVariant {
    k: usize,
    async_stages: Option<usize>,
}

fn gemm_variant() -> &'static GemmVariant {
    static V: std::sync::OnceLock<GemmVariant> = std::sync::OnceLock::new();
    V.get_or_init(|| GemmVariant {
        k: crate::kernel_define("WEFT_MG_BK").and_then(|v| v.parse().ok()).unwrap_or(32),
        async_stages: crate::kernel_define("WEFT_MG_ASYNC").map(|_| crate::kernel_define("WEFT_MG_STAGES").and_then(|v| v.parse().ok()).unwrap_or(3)),
    })
}

/// Shared bytes per block of the grouped GEMM: per stage both activation parts (64 rows) and
/// 128 weight rows, rows of `k + 8` bf16; two stages, or the cp.async variant's (bf16 weights).
fn gemm_smem(fp8: bool) -> u32 {
    let v = gemm_variant();
    let stages = if fp8 { 2 } else { v.async_stages.unwrap_or(2) };
    (stages * (2 * TILE_ROWS + GEMM_ROWS) * (v.k + 8) * 2) as u32
}

/// Columns per stage of the wgmma expert GEMM (`WG_BK`).
const WG_COLS: usize = 64;

/// Warpgroups per block of the wgmma expert GEMM: 2 (`moe_wg2_*`, two consecutive 64-row
/// tiles of one expert a block, sharing the weight loads; 1.03–1.04× the prefill of one
/// warpgroup a tile on an H100, results/roofline-h200.md round 15) or, with
/// `WEFT_CUDA_WG_PAIRS=0`, 1 (`moe_wg_*`).
fn wg_groups() -> usize {
    static W: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *W.get_or_init(|| if std::env::var("WEFT_CUDA_WG_PAIRS").is_ok_and(|v| v == "0") { 1 } else { 2 })
}

/// Block order of the wgmma expert GEMM's (gate|up, down) launches: 0 tile-major (grid
/// (tiles, slices)), 1 slice-major (grid (slices, tiles): a tile's weight slices run together
/// and share its activation rows in L2). `WEFT_CUDA_WG_ORDER=tiles|down|slices`: both
/// tile-major, down slice-major (default: down's h outgrows L2 at a few thousand tokens; 1.09×
/// a prefill of four 1024-token prompts on an H100, round 15), both slice-major (no further
/// gain).
fn wg_order() -> (u32, u32) {
    static O: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *O.get_or_init(|| match std::env::var("WEFT_CUDA_WG_ORDER").as_deref() {
        Ok("tiles") => (0, 0),
        Ok("slices") => (1, 1),
        _ => (0, 1),
    })
}

/// Dynamic shared bytes per block of the wgmma expert GEMM (`WG_SMEM_BYTES(parts, groups)`):
/// its stages (`WEFT_WG_STAGES`, default 3) of 128 weight rows and `parts` activation parts of
/// 64 rows per warpgroup, 128 bytes a row, plus 1 KiB to align them. One-part launches (mode 0)
/// ask for one-part stages, so three one-warpgroup blocks share an SM instead of two
/// (`WEFT_CUDA_WG_TIGHT=0`: the two-part size always, for A/B runs).
fn wg_smem(parts: usize, groups: usize) -> u32 {
    static TIGHT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let tight = *TIGHT.get_or_init(|| std::env::var("WEFT_CUDA_WG_TIGHT").map_or(true, |v| v != "0"));
    let parts = if tight { parts } else { 2 };
    let stages: usize = crate::kernel_define("WEFT_WG_STAGES").and_then(|v| v.parse().ok()).unwrap_or(3);
    (stages * (GEMM_ROWS + parts * groups * TILE_ROWS) * 128 + 1024) as u32
}

/// How the expert kernels run: one entry per active expert (a single decoding token), a few
/// entries on CUDA cores, tensor cores, or the grouped GEMM.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    One = 0,
    Few = 1,
    Mma = 2,
    Gemm = 3,
}

/// `[gate_up, down][bf16, fp8][Path]` kernel names.
const EXPERT_KERNELS: [[[&str; 3]; 2]; 2] = [
    [["moe_gate_up_bf16_t1", "moe_gate_up_bf16_t8", "moe_gate_up_bf16_mma"], ["moe_gate_up_fp8_t1", "moe_gate_up_fp8_t8", "moe_gate_up_fp8_mma"]],
    [["moe_down_bf16_t1", "moe_down_bf16_t8", "moe_down_bf16_mma"], ["moe_down_fp8_t1", "moe_down_fp8_t8", "moe_down_fp8_mma"]],
];

/// Most experts the routing in the experts' launch takes (moe.cu `MOE_ROUTE_FUSED_MAX`: its
/// scratch in every block's shared memory).
const ROUTE_FUSED_MAX: usize = 512;

/// The shared experts of a device MoE call: none, their output (computed apart, added by the
/// combine), or their intermediate chunks to run with the routed experts (each an expert every
/// token takes with weight 1: one launch pair reads all of them).
#[derive(Clone, Copy)]
pub(crate) enum Shared<'a> {
    Output(Option<&'a CudaSlice<f32>>),
    Fused(&'a [ExpertWeights<CudaMatrix>]),
}

/// Where the routing's logits come from: computed before (`linear` of the router); made from x
/// by the launch just before the routing's (`moe_block_routed`'s router GEMV: then the routing
/// kernel brings the experts' launch in early, whose shared-chunk blocks read x while the
/// router and the routing run — moe.cu `moe_gate_up_body`; only sound when x was complete
/// before that launch began); or the router's f32 weights, multiplied in the routing kernel's
/// own launch (`moe_router_route_plan`; `CudaBackend::router_fuses`).
#[derive(Clone, Copy)]
pub(crate) enum Gate<'a> {
    Logits(&'a CudaSlice<f32>),
    LogitsOfX(&'a CudaSlice<f32>),
    Router(&'a CudaSlice<f32>),
}

/// What follows an MoE block when the model asks for it (`Backend::moe_block_routed_add_norm`):
/// its output added into `residual` and the rows normed with `weight`, the block's result
/// then being the normed rows — in the combine's launch where it can (`moe_combine_add_rms_norm`).
pub(crate) struct NormAfter<'a> {
    pub residual: &'a mut CudaSlice<f32>,
    pub weight: &'a CudaSlice<f32>,
    pub eps: f32,
}

/// Device arrays of every expert's weight (and fp8 scale) pointers for one layer.
pub struct ExpertTables {
    gate_up: CudaSlice<u64>,
    gate_up_sc: CudaSlice<u64>,
    down: CudaSlice<u64>,
    down_sc: CudaSlice<u64>,
    /// (scale grid columns, block rows, block cols) of gate_up and down when fp8.
    fp8: Option<[(u32, u32, u32); 2]>,
    /// What the tables were made from (host copy, compared on reuse).
    ptrs: Vec<u64>,
}

impl ExpertTables {
    /// The kernel arguments of the gate|up (or down) weights: the pointer table, and for fp8 the
    /// scale table and the scale grid (columns, block rows, block columns).
    fn push<'a>(&'a self, l: &mut LaunchArgs<'a>, down: bool) {
        l.arg(if down { &self.down } else { &self.gate_up });
        if let Some(grids) = &self.fp8 {
            let (scc, br, bc) = &grids[down as usize];
            l.arg(if down { &self.down_sc } else { &self.gate_up_sc }).arg(scc).arg(br).arg(bc);
        }
    }
}

/// Whether expert `x` has `first`'s shapes and storage (bf16, or fp8 with the same scale
/// blocks, gate|up and down alike: one kernel reads both), so one pointer table and one kernel
/// serve both.
fn same_kind(x: &ExpertWeights<CudaMatrix>, first: &ExpertWeights<CudaMatrix>) -> bool {
    let same = |a: &CudaMatrix, b: &CudaMatrix| {
        a.rows == b.rows
            && a.cols == b.cols
            && a.f32_data.is_none()
            && a.fp8.is_some() == b.fp8.is_some()
            && match (&a.fp8, &b.fp8) {
                (Some(p), Some(q)) => p.block_rows == q.block_rows && p.block_cols == q.block_cols && p.block_cols % 16 == 0,
                _ => true,
            }
    };
    x.inter == first.inter && x.gate_up.fp8.is_some() == x.down.fp8.is_some() && same(&x.gate_up, &first.gate_up) && same(&x.down, &first.down)
}

fn ptr_of<T>(be: &CudaBackend, s: &CudaSlice<T>) -> u64 {
    let (p, _g) = s.device_ptr(&be.stream);
    p
}

impl CudaBackend {
    /// Whether the tensor-core expert kernels take these shapes: whole 16-byte-per-lane chunks
    /// along every row (32 bf16 or 64 fp8 columns), whole row tiles, one fp8 scale per tile
    /// and chunk. `WEFT_CUDA_MMA=0` (the backend's `mma` flag) keeps the CUDA-core kernels.
    fn moe_mma_fits(&self, first: &ExpertWeights<CudaMatrix>) -> bool {
        let (hidden, inter) = (first.gate_up.cols, first.inter);
        self.mma && crate::gemv::mma_takes(&first.gate_up) && crate::gemv::mma_takes(&first.down) && hidden % (2 * MMA_ROWS) == 0 && inter % MMA_ROWS == 0
    }

    /// Whether the grouped GEMM takes these experts: tensor cores, whole 32-column stages along
    /// both products, even row counts (results leave in pairs), fp8 scale blocks of whole stages.
    fn moe_gemm_fits(&self, first: &ExpertWeights<CudaMatrix>) -> bool {
        let (hidden, inter) = (first.gate_up.cols, first.inter);
        let bk = gemm_variant().k;
        let stages = |m: &CudaMatrix| m.fp8.as_ref().is_none_or(|f| f.block_cols % bk == 0);
        self.mma && self.moe_gemm_tokens > 0 && hidden % bk == 0 && inter % bk == 0 && stages(&first.gate_up) && stages(&first.down)
    }

    /// Whether the device MoE path handles this layer and batch.
    pub(crate) fn moe_on_device_fits(&self, cfg: &RouterConfig, experts: &[ExpertWeights<CudaMatrix>], m: usize) -> bool {
        let e = cfg.n_experts;
        if self.slow_paths || m == 0 || e == 0 || e > MAX_EXPERTS || cfg.top_k == 0 || cfg.top_k > 64 || cfg.top_k > e {
            return false;
        }
        if cfg.n_group > 1 && (cfg.n_group > MAX_GROUPS || e % cfg.n_group != 0 || cfg.topk_group == 0 || cfg.topk_group > cfg.n_group) {
            return false;
        }
        let max_avg = if self.moe_mma_fits(&experts[0]) { self.moe_device_tokens } else { MAX_AVG_TOKENS_PER_EXPERT };
        if m * cfg.top_k > max_avg * e && !self.moe_gemm_fits(&experts[0]) {
            return false;
        }
        let first = &experts[0];
        let align = if first.gate_up.fp8.is_some() { 16 } else { 8 };
        experts.iter().all(|x| same_kind(x, first)) && first.gate_up.rows == 2 * first.inter && first.gate_up.cols % align == 0 && first.inter % align == 0
    }

    /// Whether the router's product runs in the routing's launch (`moe_router_route_plan`) for
    /// `m` tokens: at most `moe_router_fused` (the last block routes them one after another),
    /// f32 router rows on the weight-streaming path, the device MoE path taking the batch.
    pub fn router_fuses(&self, router: &CudaMatrix, cfg: &RouterConfig, experts: &[ExpertWeights<CudaMatrix>], m: usize) -> bool {
        m <= self.moe_router_fused && router.f32_data.is_some() && self.gemv_fits(router, m) && !experts.is_empty() && self.moe_on_device_fits(cfg, experts, m)
    }

    /// The expert kernels for `m` tokens routed `k` ways over `e` experts shaped as `first`.
    fn moe_path(&self, first: &ExpertWeights<CudaMatrix>, m: usize, k: usize, e: usize) -> Path {
        if m == 1 {
            Path::One
        } else if self.moe_gemm_fits(first) && m * k >= self.moe_gemm_tokens * e {
            Path::Gemm
        } else if self.moe_mma_fits(first) {
            Path::Mma
        } else {
            Path::Few
        }
    }

    /// Whether the shared experts' chunks run with the routed experts on the device for `m`
    /// tokens (at most `moe_shared_fused`): the device path takes the batch with the
    /// weight-streaming kernels (the grouped GEMM leaves them to cuBLAS, which multiplies every
    /// token by them faster), and each chunk is shaped and stored as the routed experts are.
    pub(crate) fn moe_fuses_shared(&self, cfg: &RouterConfig, experts: &[ExpertWeights<CudaMatrix>], shared: &[ExpertWeights<CudaMatrix>], m: usize) -> bool {
        m <= self.moe_shared_fused
            && !experts.is_empty()
            && !shared.is_empty()
            && experts.len() + shared.len() <= MAX_EXPERTS
            && cfg.top_k + shared.len() <= 64
            && self.moe_on_device_fits(cfg, experts, m)
            && self.moe_path(&experts[0], m, cfg.top_k, cfg.n_experts) != Path::Gemm
            && shared.iter().all(|s| same_kind(s, &experts[0]))
    }

    /// The layer's pointer tables, made once and reused while the experts' device pointers are
    /// the same (checked on every call: a reloaded model at reused addresses gets the same
    /// table contents, so a hit is always right).
    fn expert_tables(&self, experts: &[&ExpertWeights<CudaMatrix>]) -> Result<Arc<ExpertTables>> {
        let pick = |m: &CudaMatrix| -> (u64, u64) {
            match &m.fp8 {
                Some(f) => (ptr_of(self, &f.bytes), ptr_of(self, &f.scales)),
                None => (ptr_of(self, &m.data), 0),
            }
        };
        let grid = |m: &CudaMatrix| m.fp8.as_ref().map(|f| (f.grid_cols(m.cols) as u32, f.block_rows as u32, f.block_cols as u32));
        let first = &experts[0];
        let fp8 = match (grid(&first.gate_up), grid(&first.down)) {
            (Some(a), Some(b)) => Some([a, b]),
            _ => None,
        };
        let mut ptrs: Vec<u64> = Vec::with_capacity(4 * experts.len() + 6);
        for x in experts {
            let (a, b) = pick(&x.gate_up);
            let (c, d) = pick(&x.down);
            ptrs.extend([a, b, c, d]);
        }
        if let Some(f) = fp8 {
            ptrs.extend(f.iter().flat_map(|g| [g.0 as u64, g.1 as u64, g.2 as u64]));
        }
        // The same layer has a table with its shared chunks and one without.
        let key = (ptrs[0], ptrs.len());
        let mut cache = self.expert_tables.lock().unwrap();
        if let Some(t) = cache.get(&key).filter(|t| t.ptrs == ptrs).cloned() {
            drop(cache);
            // A step being recorded reads these tables on every replay.
            if let Some(rec) = self.recording.lock().unwrap().as_mut() {
                rec.keep_tables.push(t.clone());
            }
            return Ok(t);
        }
        self.no_capture("the experts' pointer tables")?;
        let col = |i: usize| -> Result<CudaSlice<u64>> { self.stream.clone_htod(&ptrs.iter().skip(i).step_by(4).take(experts.len()).copied().collect::<Vec<u64>>()).map_err(dev) };
        let t = Arc::new(ExpertTables { gate_up: col(0)?, gate_up_sc: col(1)?, down: col(2)?, down_sc: col(3)?, fp8, ptrs });
        if cache.len() > 4096 {
            cache.clear();
        }
        cache.insert(key, t.clone());
        Ok(t)
    }

    /// Routing, experts and combine (plus the shared experts, apart or with the routed ones) on
    /// the device; `[m, hidden]`. `experts` are the routed experts `first..` (all of them, or an
    /// expert-parallel rank's range): every token is routed over all experts, only pairs whose
    /// expert is held here are computed and combined.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_on_device(
        &self,
        x: &CudaSlice<f32>,
        gate: Gate<'_>,
        bias: &CudaSlice<f32>,
        cfg: &RouterConfig,
        experts: &[ExpertWeights<CudaMatrix>],
        first: usize,
        m: usize,
        hidden: usize,
        shared: Shared<'_>,
        norm: Option<NormAfter<'_>>,
    ) -> Result<CudaSlice<f32>> {
        // Shared chunks run with the routed experts take S slots after each token's k.
        let (fused, add): (&[ExpertWeights<CudaMatrix>], _) = match shared {
            Shared::Output(o) => (&[], o),
            Shared::Fused(w) => (w, None),
        };
        let (e, s) = (cfg.n_experts, fused.len());
        let k = cfg.top_k + s;
        let n = m * k;
        let maxa = (experts.len() + s).min(n);
        let (first32, held32) = (first as u32, experts.len() as u32);
        let inter = experts[0].inter;
        let tables = self.expert_tables(&experts.iter().chain(fused).collect::<Vec<_>>())?;
        let mut ids = self.alloc::<u32>(n)?;
        let mut wts = self.out(n)?;
        let (e32, k32, s32, ng, tg, norm_p, sc) = (e as u32, k as u32, s as u32, cfg.n_group.max(1) as u32, cfg.topk_group as u32, cfg.norm_topk_prob as i32, cfg.routed_scaling_factor);
        let top32 = cfg.top_k as u32;
        // Active experts, offsets, entries, then the GEMM's tile list (moe.cu `plan_experts`).
        let mut plan = self.alloc::<u32>(2 + 2 * maxa + n + 1 + 2 * (n / TILE_ROWS + maxa))?;
        let maxa32 = maxa as u32;
        let counter = self.moe_counter.lock().unwrap();
        // The router's product in the same launch: a sub-group a router row, the last block
        // routing; else a block a token over logits computed before.
        let (m32, h32) = (m as u32, hidden as u32);
        let mut logits = match gate {
            Gate::Router(_) => Some(self.out(m * e)?),
            Gate::Logits(_) | Gate::LogitsOfX(_) => None,
        };
        // Kernel shape: one entry per expert (a single decoding token), a few on CUDA cores,
        // or tensor cores (a sub-group per 16 gate|up rows or 32 down rows, 16 tokens a pass).
        let path = self.moe_path(&experts[0], m, cfg.top_k, e);
        // A single token whose logits were just made from x: its routing in the experts'
        // gate|up launch (moe.cu `moe_gate_up_route_body`) rather than a launch of its own.
        let routes_in_experts = match gate {
            Gate::LogitsOfX(g) if e <= self.moe_route_fused.min(ROUTE_FUSED_MAX) && path == Path::One && k <= THREADS as usize => Some(g),
            _ => None,
        };
        if routes_in_experts.is_none() {
            let mut l = self.stream.launch_builder(self.func(if logits.is_some() { "moe_router_route_plan" } else { "moe_route_plan" }));
            let route_grid = match gate {
                Gate::Router(w) => {
                    l.arg(w).arg(x).arg(&m32).arg(&h32).arg(logits.as_mut().expect("allocated above"));
                    e.div_ceil((THREADS / crate::SUBGROUP) as usize) as u32
                }
                Gate::Logits(g) | Gate::LogitsOfX(g) => {
                    l.arg(g);
                    m as u32
                }
            };
            // moe_route_plan triggers the experts' launch at its start when x is known complete —
            // for a single token: at batch 8 the early launch (its waiting blocks, the shared
            // chunks' stream beside a multi-block routing) took a Moonlight step 8.88 -> 9.84 ms
            // (round 30, H100), at batch 1 2.877 -> 2.851.
            let early = (matches!(gate, Gate::LogitsOfX(_)) && m == 1) as i32;
            l.arg(bias).arg(&e32).arg(&top32).arg(&s32).arg(&ng).arg(&tg).arg(&norm_p).arg(&sc).arg(&mut ids).arg(&mut wts).arg(&first32).arg(&held32).arg(&maxa32).arg(&mut plan).arg(&*counter);
            if !matches!(gate, Gate::Router(_)) {
                l.arg(&early);
            }
            unsafe { l.launch(LaunchConfig { grid_dim: (route_grid, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }) }.map_err(dev)?;
        }
        drop(counter);
        // `logits` (the fused router's) lives to the end: the experts' shared-chunk blocks run
        // while that launch still does, so h must not be handed its memory (the recording arena
        // reuses a freed buffer at once).

        let fp8 = tables.fp8.is_some() as usize;
        let (h32, i32_) = (hidden as u32, inter as u32);
        if let Path::Gemm = path {
            let y = self.moe_gemm(&tables, &plan, maxa, n, x, (k, &self.moe_token_parts(m)?), hidden, inter)?;
            return self.moe_combine(&y, &wts, &ids, (e, s, first, experts.len()), add, m, k, hidden, norm);
        }
        let grid = |units: usize, threads: u32| {
            let per_block = (threads / crate::SUBGROUP) as usize;
            LaunchConfig { grid_dim: ((maxa * units.div_ceil(per_block)) as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
        };
        let (gu_grid, down_grid) = match path {
            Path::Mma => (grid(inter / MMA_ROWS, MMA_THREADS), grid(hidden / (2 * MMA_ROWS), MMA_THREADS)),
            _ => (grid(inter, THREADS), grid(hidden.div_ceil(DOWN_ROWS), THREADS)),
        };
        let mut h = self.out(n * inter)?;
        if let Some(g) = routes_in_experts {
            let mut l = self.stream.launch_builder(self.func(["moe_gate_up_route_bf16_t1", "moe_gate_up_route_fp8_t1"][fp8]));
            tables.push(&mut l, false);
            l.arg(g).arg(bias).arg(&e32).arg(&top32).arg(&s32).arg(&ng).arg(&tg).arg(&norm_p).arg(&sc).arg(&mut ids).arg(&mut wts);
            l.arg(&first32).arg(&held32).arg(&maxa32).arg(&mut plan).arg(x).arg(&mut h).arg(&h32).arg(&i32_);
            unsafe { l.launch(gu_grid) }.map_err(dev)?;
        } else {
            let mut l = self.stream.launch_builder(self.func(EXPERT_KERNELS[0][fp8][path as usize]));
            tables.push(&mut l, false);
            l.arg(&plan).arg(&maxa32).arg(x).arg(&mut h).arg(&k32).arg(&h32).arg(&i32_);
            // The kernel takes the shared chunks in its first blocks, from x alone (before its
            // wait): the tokens, the chunks and where they start in the table.
            l.arg(&m32).arg(&s32).arg(&held32);
            unsafe { l.launch(gu_grid) }.map_err(dev)?;
        }
        let mut y = self.out(n * hidden)?;
        // A single token's down products and combine in one launch (the last block of each
        // tile of rows sums them), where the tiles have counters.
        let tiles = hidden.div_ceil(DOWN_ROWS).div_ceil((THREADS / crate::SUBGROUP) as usize);
        if path == Path::One && self.moe_down_combine && tiles <= MOE_SEM {
            let mut out = self.out(m * hidden)?;
            let (e32, first32, has_add, m32) = (e as u32, first as u32, add.is_some() as i32, m as u32);
            let sem = self.moe_sem.lock().unwrap();
            let mut l = self.stream.launch_builder(self.func(["moe_down_combine_bf16_t1", "moe_down_combine_fp8_t1"][fp8]));
            tables.push(&mut l, true);
            l.arg(&plan).arg(&maxa32).arg(&h).arg(&mut y).arg(&h32).arg(&i32_);
            l.arg(&wts).arg(&ids).arg(&e32).arg(&s32).arg(&first32).arg(&held32).arg(add.unwrap_or(&wts)).arg(&has_add).arg(&mut out).arg(&m32).arg(&k32).arg(&*sem);
            unsafe { l.launch(down_grid) }.map_err(dev)?;
            return self.then_norm(out, norm, hidden);
        }
        let mut l = self.stream.launch_builder(self.func(EXPERT_KERNELS[1][fp8][path as usize]));
        tables.push(&mut l, true);
        l.arg(&plan).arg(&maxa32).arg(&h).arg(&mut y).arg(&h32).arg(&i32_);
        unsafe { l.launch(down_grid) }.map_err(dev)?;
        self.moe_combine(&y, &wts, &ids, (e, s, first, experts.len()), add, m, k, hidden, norm)
    }

    /// The experts as the grouped GEMM over the plan's tiles: gate|up with SiLU into `h`
    /// (plan rows), then down into `y` (entries). Grids are sized for the most tiles the plan
    /// can hold; blocks past its tile count exit. `(k, parts)`: entries per token, and
    /// which tiles take two activation parts (`precision.rs`).
    #[allow(clippy::too_many_arguments)]
    fn moe_gemm(
        &self,
        tables: &ExpertTables,
        plan: &CudaSlice<u32>,
        maxa: usize,
        n: usize,
        x: &CudaSlice<f32>,
        (k, parts): (usize, &TokenParts),
        hidden: usize,
        inter: usize,
    ) -> Result<CudaSlice<f32>> {
        let fp8 = tables.fp8.is_some() as usize;
        let (h32, i32_, k32, n32, maxa32) = (hidden as u32, inter as u32, k as u32, n as u32, maxa as u32);
        // Kernel arguments: the flags (any buffer where unused) and the mode: 0 one part, 1 two,
        // 2 by the flags.
        let (flags, mode) = match parts {
            TokenParts::One => (plan, 0u32),
            TokenParts::Two => (plan, 1),
            TokenParts::Flags(f) => (&**f, 2),
        };
        let tiles = (n / TILE_ROWS + maxa) as u32;
        // bf16 experts on sm_90a: the wgmma kernels (the same arguments and the block order; the
        // same grids, transposed for a slice-major launch), whose stages are 64 columns of both
        // products.
        let wg = self.wgmma && fp8 == 0 && hidden % WG_COLS == 0 && inter % WG_COLS == 0;
        let groups = if wg { wg_groups() } else { 1 };
        let smem = if wg { wg_smem(if mode == 0 { 1 } else { 2 }, groups) } else { gemm_smem(fp8 == 1) };
        let threads = GEMM_THREADS * groups as u32;
        // Slice-major grids put the tiles in y (at most 65,535 blocks): past that, tile-major.
        let (gu_order, down_order) = if wg && tiles <= 65_535 { wg_order() } else { (0, 0) };
        let cfg = |slices: usize, order: u32| {
            let grid_dim = if order == 1 { (slices as u32, tiles, 1) } else { (tiles, slices as u32, 1) };
            LaunchConfig { grid_dim, block_dim: (threads, 1, 1), shared_mem_bytes: smem }
        };
        // The wgmma kernels take the tokens' bf16 parts (a split pass per token) and give h as
        // bf16 parts; the cp.async variant's bf16 kernels take two-part bf16 rows in plan order
        // (the split pass for gate|up, h as gate|up writes it); both in the bytes of f32 rows.
        // f32 rows otherwise.
        let parts = fp8 == 0 && !wg && gemm_variant().async_stages.is_some();
        let xs = if wg {
            let tokens = n / k;
            let mut xs = self.alloc::<u32>(tokens * hidden)?;
            let hidden32 = hidden as u32;
            let mut l = self.stream.launch_builder(self.func("moe_wg_split"));
            l.arg(x).arg(&hidden32).arg(&mut xs);
            unsafe { l.launch(LaunchConfig { grid_dim: (tokens as u32, 1, 1), block_dim: (GEMM_THREADS, 1, 1), shared_mem_bytes: 0 }) }.map_err(dev)?;
            Some(xs)
        } else if parts {
            let mut xs = self.alloc::<u32>(n * hidden)?;
            let hidden32 = hidden as u32;
            let mut l = self.stream.launch_builder(self.func("moe_gemm_split"));
            l.arg(plan).arg(&maxa32).arg(x).arg(&k32).arg(&hidden32).arg(&mut xs);
            unsafe { l.launch(LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (GEMM_THREADS, 1, 1), shared_mem_bytes: 0 }) }.map_err(dev)?;
            Some(xs)
        } else {
            None
        };
        // f32 rows, or the same bytes as two-part bf16 rows.
        let mut h = self.out(n * inter)?;
        let mut l = self.stream.launch_builder(self.func(if wg { ["moe_wg_gate_up_bf16", "moe_wg2_gate_up_bf16"][groups - 1] } else { ["moe_gemm_gate_up_bf16", "moe_gemm_gate_up_fp8"][fp8] }));
        tables.push(&mut l, false);
        l.arg(plan).arg(&maxa32).arg(&n32);
        match &xs {
            Some(xs) => l.arg(xs),
            None => l.arg(x),
        };
        l.arg(&mut h).arg(&k32).arg(&h32).arg(&i32_).arg(flags).arg(&mode);
        if wg {
            l.arg(&gu_order);
        }
        unsafe { l.launch(cfg(inter.div_ceil(GEMM_ROWS / 2), gu_order)) }.map_err(dev)?;
        let mut y = self.out(n * hidden)?;
        let mut l = self.stream.launch_builder(self.func(if wg { ["moe_wg_down_bf16", "moe_wg2_down_bf16"][groups - 1] } else { ["moe_gemm_down_bf16", "moe_gemm_down_fp8"][fp8] }));
        tables.push(&mut l, true);
        l.arg(plan).arg(&maxa32).arg(&n32).arg(&h).arg(&mut y).arg(&h32).arg(&i32_).arg(&k32).arg(flags).arg(&mode);
        if wg {
            l.arg(&down_order);
        }
        unsafe { l.launch(cfg(hidden.div_ceil(GEMM_ROWS), down_order)) }.map_err(dev)?;
        Ok(y)
    }

    /// `out[t] = Σ_j wts[t, j] · y[t·k + j]` over the token's entries held here (`experts`: the
    /// routed count, shared chunks run with them, first held, held), plus the shared experts'
    /// output when they ran apart; with `norm`, added into the residual and normed, in the same
    /// launch where the rows fit `rms_row_v4` (kernels/weft.cu), else by `add_rms_norm` after.
    #[allow(clippy::too_many_arguments)]
    fn moe_combine(
        &self,
        y: &CudaSlice<f32>,
        wts: &CudaSlice<f32>,
        ids: &CudaSlice<u32>,
        experts: (usize, usize, usize, usize),
        shared: Option<&CudaSlice<f32>>,
        m: usize,
        k: usize,
        hidden: usize,
        norm: Option<NormAfter<'_>>,
    ) -> Result<CudaSlice<f32>> {
        let (e, s, first, held) = experts;
        let (e32, s32, first32, held32, k32, h32) = (e as u32, s as u32, first as u32, held as u32, k as u32, hidden as u32);
        let mut out = self.out(m * hidden)?;
        // Without a shared output the kernel is told so and reads nothing from `add`.
        let add = shared.unwrap_or(y);
        let has_add = shared.is_some() as i32;
        // (The block as the norms size it, within what the kernel's registers allow.)
        let ncfg = crate::ops::norm_cfg(m, hidden);
        let block = ncfg.block_dim.0 as usize;
        let launches = self.max_threads.get("moe_combine_add_rms_norm").is_some_and(|&t| block <= t);
        let norm = match norm {
            Some(n) if self.moe_combine_norm && launches && hidden % 4 == 0 && hidden <= 8 * 1024 && n.residual.len() == m * hidden && n.weight.len() >= hidden => {
                let early = (m == 1 && self.norm_trigger & 2 != 0) as i32;
                let mut l = self.stream.launch_builder(self.func("moe_combine_add_rms_norm"));
                l.arg(y).arg(wts).arg(ids).arg(&e32).arg(&s32).arg(&first32).arg(&held32).arg(add).arg(&has_add);
                l.arg(n.residual).arg(n.weight).arg(&mut out).arg(&k32).arg(&h32).arg(&n.eps).arg(&early);
                unsafe { l.launch(ncfg) }.map_err(dev)?;
                return Ok(out);
            }
            other => other,
        };
        let mut l = self.stream.launch_builder(self.func("moe_combine"));
        l.arg(y).arg(wts).arg(ids).arg(&e32).arg(&s32).arg(&first32).arg(&held32).arg(add).arg(&has_add).arg(&mut out).arg(&k32).arg(&h32);
        let combine_threads = 128u32;
        // Four dims a thread where the rows allow (kernels/moe.cu).
        let per = if hidden % 4 == 0 { 4 } else { 1 };
        let blocks = m * hidden.div_ceil(per * combine_threads as usize);
        unsafe { l.launch(LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (combine_threads, 1, 1), shared_mem_bytes: 0 }) }.map_err(dev)?;
        self.then_norm(out, norm, hidden)
    }

    /// `out`, or (with `norm`) `add_rms_norm` of it into the residual: the block's result then.
    fn then_norm(&self, out: CudaSlice<f32>, norm: Option<NormAfter<'_>>, hidden: usize) -> Result<CudaSlice<f32>> {
        match norm {
            None => Ok(out),
            Some(n) => self.add_rms_norm(n.residual, &out, hidden, n.weight, n.eps),
        }
    }

    /// `moe_block_routed` (with `norm`, `moe_block_routed_add_norm`): the router's product
    /// by `linear` and then the block, or in the routing's launch (`router_fuses`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_routed(
        &self,
        x: &CudaSlice<f32>,
        router: &CudaMatrix,
        bias: &CudaSlice<f32>,
        cfg_r: &RouterConfig,
        (experts, first): (&[ExpertWeights<CudaMatrix>], usize),
        shared: &[ExpertWeights<CudaMatrix>],
        norm: Option<NormAfter<'_>>,
    ) -> Result<CudaSlice<f32>> {
        let hidden = router.cols;
        let m = if hidden == 0 { 0 } else { x.len() / hidden };
        let fuses = x.len() == m * hidden && router.rows == cfg_r.n_experts && self.router_fuses(router, cfg_r, experts, m);
        let Some(w) = router.f32_data.as_ref().filter(|_| fuses) else {
            // The logits made from x by the launch just before the routing's (Gate::LogitsOfX).
            let logits = self.linear(x, router)?;
            weft_backend::check_local_experts(first, experts.len(), cfg_r, bias.len())?;
            let m = crate::ops::check_rows("moe", logits.len(), cfg_r.n_experts)?;
            let hidden = crate::ops::check_rows("moe", x.len(), m.max(1))?;
            return self.moe_block_gated(x, Gate::LogitsOfX(&logits), bias, cfg_r, (experts, first), shared, (m, hidden), norm);
        };
        weft_backend::check_local_experts(first, experts.len(), cfg_r, bias.len())?;
        self.moe_block_gated(x, Gate::Router(w), bias, cfg_r, (experts, first), shared, (m, hidden), norm)
    }

    /// `moe_block` (and `moe_block_routed`, whose router then runs in the routing's launch):
    /// the shared chunks with the routed experts where `moe_fuses_shared`, else apart and added
    /// in the combine.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_block_gated(
        &self,
        x: &CudaSlice<f32>,
        gate: Gate<'_>,
        bias: &CudaSlice<f32>,
        cfg_r: &RouterConfig,
        (experts, first): (&[ExpertWeights<CudaMatrix>], usize),
        shared: &[ExpertWeights<CudaMatrix>],
        (m, hidden): (usize, usize),
        norm: Option<NormAfter<'_>>,
    ) -> Result<CudaSlice<f32>> {
        if shared.iter().all(|w| w.gate_up.cols == hidden) && self.moe_fuses_shared(cfg_r, experts, shared, m) {
            return self.moe_on_device(x, gate, bias, cfg_r, experts, first, m, hidden, Shared::Fused(shared), norm);
        }
        let sum = Backend::shared_experts(self, x, shared)?;
        match gate {
            Gate::Logits(logits) | Gate::LogitsOfX(logits) => {
                let out = self.moe_held(x, logits, bias, cfg_r, experts, first, sum.as_ref())?;
                self.then_norm(out, norm, hidden)
            }
            Gate::Router(_) => {
                weft_backend::check_moe_shared(sum.as_ref().map(|s| s.len()), x.len())?;
                self.moe_on_device(x, gate, bias, cfg_r, experts, first, m, hidden, Shared::Output(sum.as_ref()), norm)
            }
        }
    }

    /// MoE of the routed experts `first..` this backend holds (all of them unless
    /// expert-parallel): the device path when the batch fits it (it routes over every expert
    /// and computes the pairs of the ones held), else routing on the host.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_held(
        &self,
        x: &CudaSlice<f32>,
        gate_logits: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        cfg_r: &RouterConfig,
        experts: &[ExpertWeights<CudaMatrix>],
        first: usize,
        shared: Option<&CudaSlice<f32>>,
    ) -> Result<CudaSlice<f32>> {
        let m = crate::ops::check_rows("moe", gate_logits.len(), cfg_r.n_experts)?;
        let hidden = crate::ops::check_rows("moe", x.len(), m.max(1))?;
        weft_backend::check_moe_shared(shared.map(|s| s.len()), x.len())?;
        if !experts.is_empty() && self.moe_on_device_fits(cfg_r, experts, m) {
            return self.moe_on_device(x, Gate::Logits(gate_logits), bias, cfg_r, experts, first, m, hidden, Shared::Output(shared), None);
        }
        let mut out = self.moe_host_routed(x, gate_logits, bias, cfg_r, experts, first, m, hidden)?;
        if let Some(s) = shared {
            self.add_inplace(&mut out, s)?;
        }
        Ok(out)
    }

    /// MoE with routing on the host (batches past the device path, and expert-parallel ranks
    /// holding experts `first..first + experts.len()`): the batched GEMMs of `moe_grouped.rs`
    /// for bf16 experts, else one GEMM pair per active expert, scattered back with the routing
    /// weights.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_host_routed(
        &self,
        x: &CudaSlice<f32>,
        gate_logits: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        cfg_r: &RouterConfig,
        experts: &[ExpertWeights<CudaMatrix>],
        first: usize,
        m: usize,
        hidden: usize,
    ) -> Result<CudaSlice<f32>> {
        let e = cfg_r.n_experts;
        // Routing on the host (small: m × n_experts), experts on the device.
        let logits = self.download(gate_logits)?;
        let bias_h = self.download(bias)?;
        // Indexed by this rank's experts (all of them unless expert-parallel).
        let mut assigned: Vec<Vec<(u32, f32)>> = vec![Vec::new(); experts.len()];
        for (t, r) in weft_backend::cpu::route_all(&logits[..m * e], &bias_h, cfg_r).into_iter().enumerate() {
            for (ex, w) in r {
                if (first..first + experts.len()).contains(&ex) {
                    assigned[ex - first].push((t as u32, w));
                }
            }
        }
        #[cfg(feature = "cuda")]
        if m > 0 && self.moe_grouped_fits(experts) {
            return self.moe_grouped(x, &assigned, experts, m, hidden, cfg_r.top_k, experts.len() == e);
        }
        let mut out = self.stream.alloc_zeros::<f32>((m * hidden).max(1)).map_err(dev)?;
        let d = hidden as u32;
        for (ex, toks) in assigned.iter().enumerate() {
            if toks.is_empty() {
                continue;
            }
            let ids: Vec<u32> = toks.iter().map(|t| t.0).collect();
            let wts: Vec<f32> = toks.iter().map(|t| t.1).collect();
            let xs = self.gather_rows(x, hidden, &ids)?;
            let w = &experts[ex];
            let gu = self.linear(&xs, &w.gate_up)?;
            let h = self.silu_mul(&gu, w.inter)?;
            let y = self.linear(&h, &w.down)?;
            let (tb, wb) = (self.up_u32(&ids)?, self.up_f32(&wts)?);
            let mut l = self.stream.launch_builder(self.func("scatter_add_weighted"));
            l.arg(&y).arg(&tb).arg(&wb).arg(&mut out).arg(&d);
            unsafe { l.launch(cfg(ids.len(), 0)) }.map_err(dev)?;
        }
        Ok(out)
    }
}
