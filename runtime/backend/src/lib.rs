//! The compute interface the DeepSeek-V3 graph is written against, and the CPU reference
//! backend. Every GPU backend implements [`Backend`] and is checked against [`cpu::CpuBackend`].
//!
//! Ops are coarse and fused where a GPU wants them fused (residual add + RMSNorm, RoPE + cache
//! store, routing + experts + combine), so the graph never touches element layouts itself.

pub mod collective;
pub mod cpu;
pub mod dtype;
pub mod dummy;
pub mod front;
pub mod rng;

pub use collective::{Collective, LocalGroup, LocalRank, Shard};
pub use dtype::{BlockScales, HostMatrix, WeightDtype};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("weight {name}: {reason}")]
    BadWeight { name: String, reason: String },
    #[error("{op}: {reason}")]
    Shape { op: &'static str, reason: String },
    #[error("backend {backend} unavailable: {reason}")]
    Unavailable { backend: &'static str, reason: String },
    #[error("device error: {0}")]
    Device(String),
}

pub type Result<T> = std::result::Result<T, BackendError>;

/// `Backend::moe`'s check of the optional shared-expert output: as many values as the input
/// (every backend rejects a mismatch the same way).
/// The expert range a [`Backend::moe_local`] call holds fits the router's experts.
pub fn check_local_experts(first: usize, held: usize, cfg: &RouterConfig, bias_len: usize) -> Result<()> {
    if held == 0 || first + held > cfg.n_experts || bias_len != cfg.n_experts {
        return Err(BackendError::Shape { op: "moe_local", reason: format!("experts {first}..{} of {} ({bias_len} biases)", first + held, cfg.n_experts) });
    }
    Ok(())
}

/// The shared experts' chunks on `x` one after another, each a gated MLP, their outputs summed
/// (`None` without any).
pub fn shared_experts_apart<B: Backend + ?Sized>(be: &B, x: &B::Buf, shared: &[ExpertWeights<B::Matrix>]) -> Result<Option<B::Buf>> {
    let mut sum: Option<B::Buf> = None;
    for w in shared {
        let y = be.linear(&be.gated_up(x, &w.gate_up, w.inter)?, &w.down)?;
        match sum.as_mut() {
            None => sum = Some(y),
            Some(s) => be.add_inplace(s, &y)?,
        }
    }
    Ok(sum)
}

pub fn check_moe_shared(shared_len: Option<usize>, x_len: usize) -> Result<()> {
    match shared_len {
        Some(n) if n != x_len => Err(BackendError::Shape { op: "moe", reason: format!("shared output of {n} values for {x_len} inputs") }),
        _ => Ok(()),
    }
}

/// Rotary embedding parameters, computed once by the model from its config.
#[derive(Clone, Debug)]
pub struct RopeParams {
    /// `rope_dim / 2` inverse frequencies (YaRN-corrected when configured), f32 as the reference.
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN `attention_factor`; 1 otherwise).
    pub attention_factor: f32,
    /// DeepSeek's published layout: rotary pairs are adjacent `(x[2i], x[2i+1])`. The roped
    /// output is written de-interleaved (first half / second half), identically for q and k.
    pub interleaved: bool,
}

/// Element type of the cached latent vectors. `Bf16` halves the bytes every decode step reads
/// and doubles the tokens a pool holds; values are rounded to bf16 when stored (attention
/// still computes in f32). The CPU backend stores f32 values rounded the same way, so it stays
/// the reference for either type. Ordinary-attention (GQA) pools are f32 only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    #[default]
    F32,
    Bf16,
}

impl KvDtype {
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 => 2,
        }
    }

    /// `f32` or `bf16` (as `--kv-cache-dtype` takes it).
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" | "float32" => Ok(KvDtype::F32),
            "bf16" | "bfloat16" => Ok(KvDtype::Bf16),
            other => Err(format!("KV cache dtype {other:?}: expected f32 or bf16")),
        }
    }

    /// `x` as this type stores it (bf16: round to nearest even, NaN kept).
    pub fn round(self, x: f32) -> f32 {
        match self {
            KvDtype::F32 => x,
            KvDtype::Bf16 => half::bf16::from_f32(x).to_f32(),
        }
    }
}

/// Shape of the paged latent KV pool: per layer, per token, one vector of
/// `latent_dim` (kv_lora_rank, normalized) followed by `rope_dim` (roped shared key), each
/// value a `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub layers: usize,
    pub num_pages: usize,
    pub page_size: usize,
    pub latent_dim: usize,
    pub rope_dim: usize,
    pub dtype: KvDtype,
}

impl KvLayout {
    pub fn width(&self) -> usize {
        self.latent_dim + self.rope_dim
    }
    /// Bytes of one page over all layers (what sizing the pool from free memory divides by).
    pub fn bytes_per_page(&self) -> usize {
        self.layers * self.page_size * self.width() * self.dtype.size()
    }
    /// A pool of ordinary attention's keys and values (`Backend::kv_store`,
    /// `Backend::gqa_attention`): per layer, per entry, `kv_heads · head_dim` key values then
    /// as many value values.
    pub fn gqa(layers: usize, num_pages: usize, page_size: usize, kv_heads: usize, head_dim: usize) -> Self {
        KvLayout { layers, num_pages, page_size, latent_dim: 2 * kv_heads * head_dim, rope_dim: 0, dtype: KvDtype::F32 }
    }
}

/// Checks a [`Backend::gqa_attention`] call against its pool; returns the head dimension.
pub fn check_gqa(pool: KvLayout, layer: usize, q_len: usize, heads: usize, kv_heads: usize, rows: &[AttnRow<'_>]) -> Result<usize> {
    let bad = |reason: String| BackendError::Shape { op: "gqa_attention", reason };
    if kv_heads == 0 || heads % kv_heads != 0 || pool.rope_dim != 0 || pool.dtype != KvDtype::F32 || pool.latent_dim % (2 * kv_heads) != 0 || layer >= pool.layers {
        return Err(bad(format!("{heads} heads over {kv_heads} key/value heads, layer {layer}, pool {pool:?}")));
    }
    let d = pool.latent_dim / (2 * kv_heads);
    if q_len != rows.len() * heads * d {
        return Err(bad(format!("{q_len} query values for {} rows x {heads} heads x {d}", rows.len())));
    }
    for r in rows {
        if r.ctx_len == 0 || r.ctx_len.div_ceil(pool.page_size) > r.block_table.len() {
            return Err(bad(format!("context {} not covered by {} pages", r.ctx_len, r.block_table.len())));
        }
        if let Some(p) = r.block_table[..r.ctx_len.div_ceil(pool.page_size)].iter().find(|&&p| p as usize >= pool.num_pages) {
            return Err(bad(format!("page {p} outside pool")));
        }
    }
    Ok(d)
}

/// Checks a [`Backend::kv_store`] call against its pool; returns the rows.
pub fn check_kv_store(pool: KvLayout, layer: usize, k_len: usize, v_len: usize, slots: &[u32]) -> Result<usize> {
    let kw = pool.latent_dim / 2;
    let m = slots.len();
    if pool.rope_dim != 0 || pool.dtype != KvDtype::F32 || kw == 0 || k_len != m * kw || v_len != m * kw || layer >= pool.layers {
        return Err(BackendError::Shape { op: "kv_store", reason: format!("{k_len}/{v_len} values for {m} slots of width {kw}, layer {layer}") });
    }
    if let Some(bad) = slots.iter().find(|&&s| s as usize >= pool.num_pages * pool.page_size) {
        return Err(BackendError::Shape { op: "kv_store", reason: format!("slot {bad} outside pool") });
    }
    Ok(m)
}

/// What one query row may attend to: the sequence's pages and the number of cached tokens
/// visible to it (positions `0..ctx_len`, its own included).
#[derive(Clone, Copy, Debug)]
pub struct AttnRow<'a> {
    pub block_table: &'a [u32],
    pub ctx_len: usize,
}

/// One forward step's tokens (prefill chunks and decode tokens of any number of sequences).
/// The per-token slices have one entry per token.
pub struct StepBatch<'a> {
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    /// Pool slot (`page * page_size + offset`) where each token's latent is stored.
    pub slots: &'a [u32],
    /// What each token attends to (its sequence's pages, context up to and including itself).
    pub attn: &'a [AttnRow<'a>],
    /// Rows `start..end` that must compute exactly as decode rows do although they sit in a
    /// prefill chunk: speculative drafts scored in the pass of a prompt's last chunk. A backend
    /// that gives prompt rows less precise arithmetic than decode rows (the CUDA backend's one
    /// bf16 activation part) keeps these at decode precision, so greedy speculative output stays
    /// plain greedy output. Usually empty.
    pub exact_rows: &'a [(u32, u32)],
}

/// How many forward steps a backend recorded (as replayable graphs), replayed, and failed to
/// record (they ran op by op); all zero for a backend that does not record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepRecordings {
    pub recorded: u64,
    pub replayed: u64,
    pub failed: u64,
}

/// Routing configuration of one MoE layer, exactly as DeepSeek-V3 publishes it.
#[derive(Clone, Debug)]
pub struct RouterConfig {
    pub n_experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
}

/// An expert's weights: `gate_up` is `[2*inter, hidden]` (gate rows then up rows), `down` is
/// `[hidden, inter]`.
pub struct ExpertWeights<M> {
    pub gate_up: M,
    pub down: M,
    pub inter: usize,
}

/// The compute interface. Buffers are flat row-major f32 activations in device memory; shapes
/// are passed explicitly. A GPU backend serves `Buf`s from a workspace sized at start-up.
pub trait Backend: Send + Sync + 'static {
    type Buf: Send + Sync;
    type Matrix: Send + Sync;
    type KvPool: Send + Sync;

    fn name(&self) -> &'static str;

    /// `(free, total)` bytes of the memory this backend allocates from, when it can tell
    /// (sizing the KV pool from a memory fraction).
    fn memory_info(&self) -> Option<(usize, usize)> {
        None
    }

    /// Runs one forward step: `run` issues the step's ops on `pool` for `step` and returns a
    /// buffer of `out_len` values. A backend that records steps (CUDA graphs) may replay an
    /// earlier recording of a step of the same shape instead, with `step`'s tokens, positions,
    /// slots and block tables as its inputs; the result must equal what `run` would return.
    /// The default runs `run`.
    fn run_step(&self, pool: &mut Self::KvPool, step: &StepBatch<'_>, out_len: usize, run: &mut dyn FnMut(&mut Self::KvPool) -> Result<Self::Buf>) -> Result<Self::Buf> {
        let _ = (step, out_len);
        run(pool)
    }

    /// Counts of `run_step` recordings and replays so far.
    fn step_recordings(&self) -> StepRecordings {
        StepRecordings::default()
    }

    /// The fewest consecutive rows of one sequence in a step (a prefill chunk) that this
    /// backend computes at prompt precision, coarser than decode rows' (`run_step`); `None`
    /// when every row computes alike. A prompt's rows then round as the chunk they sit in does:
    /// the engine keeps speculative drafts from lengthening a chunk to this size, so a prompt
    /// computes the same with and without speculation.
    fn prompt_run_rows(&self) -> Option<usize> {
        None
    }

    // ---- memory ----
    fn upload_matrix(&self, m: &HostMatrix<'_>) -> Result<Self::Matrix>;
    /// A `--load-format dummy` weight made in backend memory without a host copy; `None`
    /// when the backend has no generator of its own (the caller generates on the host and
    /// uploads, which gives the same values).
    fn dummy_matrix(&self, _spec: &dummy::DummySpec) -> Option<Result<Self::Matrix>> {
        None
    }
    fn upload(&self, data: &[f32]) -> Result<Self::Buf>;
    fn download(&self, buf: &Self::Buf) -> Result<Vec<f32>>;
    fn alloc_kv_pool(&self, layout: KvLayout) -> Result<Self::KvPool>;
    /// Copies whole pages inside the pool (copy-on-write of shared prefix pages).
    fn copy_kv_pages(&self, pool: &mut Self::KvPool, pairs: &[(u32, u32)]) -> Result<()>;

    // ---- dense ops ----
    /// `out[i] = table[ids[i]]`, `[ids.len(), hidden]`.
    fn embed(&self, table: &Self::Matrix, ids: &[u32]) -> Result<Self::Buf>;
    /// Selected `dim`-wide rows of `x`, in the order given.
    fn gather_rows(&self, x: &Self::Buf, dim: usize, rows: &[u32]) -> Result<Self::Buf>;
    /// RMSNorm of each `dim`-wide row.
    fn rms_norm(&self, x: &Self::Buf, dim: usize, weight: &Self::Buf, eps: f32) -> Result<Self::Buf>;
    /// `residual += delta`, then returns RMSNorm(residual).
    fn add_rms_norm(&self, residual: &mut Self::Buf, delta: &Self::Buf, dim: usize, weight: &Self::Buf, eps: f32) -> Result<Self::Buf>;
    /// `out[m, n] = Σ_k x[m, k] · w[n, k]`.
    fn linear(&self, x: &Self::Buf, w: &Self::Matrix) -> Result<Self::Buf>;
    /// `(linear(x, a), linear(x, b))`: two weights on the same activations (an attention block's
    /// query and latent projections), in one pass where a backend can.
    fn linear_pair(&self, x: &Self::Buf, a: &Self::Matrix, b: &Self::Matrix) -> Result<(Self::Buf, Self::Buf)> {
        Ok((self.linear(x, a)?, self.linear(x, b)?))
    }
    /// `add_rms_norm(residual, linear(x, w))`: a block's output projection added into the
    /// residual stream and normed (a layer's attention output), in fewer passes where a backend
    /// can.
    fn linear_add_rms_norm(&self, x: &Self::Buf, w: &Self::Matrix, residual: &mut Self::Buf, dim: usize, weight: &Self::Buf, eps: f32) -> Result<Self::Buf> {
        let delta = self.linear(x, w)?;
        self.add_rms_norm(residual, &delta, dim, weight, eps)
    }
    /// Per-head linear: `w` stacks `heads` matrices `[n, k]`; `out[m, h, :] = w_h · x[m, h, :]`.
    fn head_linear(&self, x: &Self::Buf, heads: usize, w: &Self::Matrix) -> Result<Self::Buf>;
    /// `x += y`.
    fn add_inplace(&self, x: &mut Self::Buf, y: &Self::Buf) -> Result<()>;
    /// `[m, 2*inter]` (gate | up) → `[m, inter]`, `silu(gate) * up`.
    fn silu_mul(&self, gate_up: &Self::Buf, inter: usize) -> Result<Self::Buf>;
    /// `silu(x · gateᵀ) * (x · upᵀ)` for a stacked `[2*inter, k]` gate|up weight: `linear` then
    /// `silu_mul`, unless a backend fuses the two (one pass, no `[m, 2*inter]` intermediate).
    fn gated_up(&self, x: &Self::Buf, gate_up: &Self::Matrix, inter: usize) -> Result<Self::Buf> {
        let gu = self.linear(x, gate_up)?;
        self.silu_mul(&gu, inter)
    }

    // ---- MLA ----
    /// Splits `q` `[m, heads, nope + rope]` into `q_nope [m, heads, nope]` and roped
    /// `q_pe [m, heads, rope]`.
    fn mla_split_rope_q(&self, q: &Self::Buf, heads: usize, nope: usize, rope_dim: usize, positions: &[u32], rope: &RopeParams) -> Result<(Self::Buf, Self::Buf)>;
    /// From `kv_a` `[m, latent + rope]`: RMSNorm the latent part, rope the key part, and store
    /// both in the pool at `slots` (page * page_size + offset) of `layer`.
    #[allow(clippy::too_many_arguments)]
    fn mla_store_kv(&self, pool: &mut Self::KvPool, layer: usize, kv_a: &Self::Buf, norm_w: &Self::Buf, eps: f32, positions: &[u32], slots: &[u32], rope: &RopeParams) -> Result<()>;
    /// `mla_split_rope_q` of `q` and `mla_store_kv` of `kv_a`, the same `m` rows: what a layer
    /// does with its two first projections before attention. Returns `(q_nope, q_pe)`. A
    /// backend may do both in one pass (the CUDA one launches one kernel).
    #[allow(clippy::too_many_arguments)]
    fn mla_rope_q_store_kv(
        &self,
        q: &Self::Buf,
        heads: usize,
        nope: usize,
        rope_dim: usize,
        pool: &mut Self::KvPool,
        layer: usize,
        kv_a: &Self::Buf,
        norm_w: &Self::Buf,
        eps: f32,
        positions: &[u32],
        slots: &[u32],
        rope: &RopeParams,
    ) -> Result<(Self::Buf, Self::Buf)> {
        let q = self.mla_split_rope_q(q, heads, nope, rope_dim, positions, rope)?;
        self.mla_store_kv(pool, layer, kv_a, norm_w, eps, positions, slots, rope)?;
        Ok(q)
    }
    /// Absorbed MLA attention over the latent pool. `q_lat [m, heads, latent]`,
    /// `q_pe [m, heads, rope]`; returns `o_lat [m, heads, latent]` (before W_UV).
    #[allow(clippy::too_many_arguments)]
    fn mla_attention(&self, pool: &Self::KvPool, layer: usize, q_lat: &Self::Buf, q_pe: &Self::Buf, heads: usize, rows: &[AttnRow<'_>], scale: f32) -> Result<Self::Buf>;
    /// MLA attention from the queries to each head's values: `q_nope [m, heads, nope]`,
    /// `q_pe [m, heads, rope]`, `w_uk_t` / `w_uv` the per-head up-projections as `head_linear`
    /// takes them (`[heads·latent, nope]`, `[heads·v, latent]`); returns `[m, heads, v]`. The
    /// default is the absorbed form (W_UK into the query, attention over the latents, W_UV
    /// after). A backend may decompress the context's keys and values per head instead where
    /// that costs less (long prefill runs: 192 + 128 products per query, key and head against
    /// 576 + 512 absorbed).
    #[allow(clippy::too_many_arguments)]
    fn mla_attention_heads(
        &self,
        pool: &Self::KvPool,
        layer: usize,
        q_nope: &Self::Buf,
        q_pe: &Self::Buf,
        w_uk_t: &Self::Matrix,
        w_uv: &Self::Matrix,
        heads: usize,
        rows: &[AttnRow<'_>],
        scale: f32,
    ) -> Result<Self::Buf> {
        let q_lat = self.head_linear(q_nope, heads, w_uk_t)?;
        let o_lat = self.mla_attention(pool, layer, &q_lat, q_pe, heads, rows, scale)?;
        self.head_linear(&o_lat, heads, w_uv)
    }

    /// A layer's MLA from its query and latent projections to the heads' values (before
    /// o_proj): [`Self::mla_rope_q_store_kv`], then [`Self::mla_attention_heads`] — the default.
    /// A backend may absorb the queries (W_UK) in the pass that ropes them and stores the
    /// latents.
    #[allow(clippy::too_many_arguments)]
    fn mla_attention_projected(
        &self,
        q: &Self::Buf,
        (heads, nope, rope_dim): (usize, usize, usize),
        pool: &mut Self::KvPool,
        layer: usize,
        kv_a: &Self::Buf,
        norm_w: &Self::Buf,
        eps: f32,
        positions: &[u32],
        slots: &[u32],
        rope: &RopeParams,
        (w_uk_t, w_uv): (&Self::Matrix, &Self::Matrix),
        rows: &[AttnRow<'_>],
        scale: f32,
    ) -> Result<Self::Buf> {
        let (q_nope, q_pe) = self.mla_rope_q_store_kv(q, heads, nope, rope_dim, pool, layer, kv_a, norm_w, eps, positions, slots, rope)?;
        self.mla_attention_heads(pool, layer, &q_nope, &q_pe, w_uk_t, w_uv, heads, rows, scale)
    }

    // ---- grouped-query attention (draft models with ordinary attention: DFlash) ----
    /// Stores `k` and `v` (`[m, kv_width]` each) at `slots` of `layer`, in a pool laid out as
    /// [`KvLayout::gqa`]: each entry is the K row then the V row.
    fn kv_store(&self, pool: &mut Self::KvPool, layer: usize, k: &Self::Buf, v: &Self::Buf, slots: &[u32]) -> Result<()>;
    /// Softmax attention of `q [m, heads, head_dim]` over a [`KvLayout::gqa`] pool: query head
    /// h reads key/value group `h / (heads / kv_heads)`; row i sees the entries `0..ctx_len`
    /// of its block table, whatever their positions (no causal mask beyond that: a block of
    /// rows given one `ctx_len` attends bidirectionally). Returns `[m, heads, head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn gqa_attention(&self, pool: &Self::KvPool, layer: usize, q: &Self::Buf, heads: usize, kv_heads: usize, rows: &[AttnRow<'_>], scale: f32) -> Result<Self::Buf>;
    /// The buffers one after another in a new buffer (one part: a copy that later in-place
    /// ops on the original do not touch).
    fn concat(&self, parts: &[&Self::Buf]) -> Result<Self::Buf>;

    // ---- MoE ----
    /// Routing (sigmoid scores, bias for selection, group-limited top-k, normalisation,
    /// scaling) of `gate_logits [m, n_experts]`, then the selected experts on `x [m, hidden]`,
    /// combined, plus `shared` (the shared experts' output `[m, hidden]`) when given — added
    /// after the routed sum, in the pass that combines it on backends that fuse the two.
    #[allow(clippy::too_many_arguments)]
    fn moe(&self, x: &Self::Buf, gate_logits: &Self::Buf, bias: &Self::Buf, cfg: &RouterConfig, experts: &[ExpertWeights<Self::Matrix>], shared: Option<&Self::Buf>) -> Result<Self::Buf>;

    /// [`Self::moe`] on a rank of an expert-parallel group: `experts` are routed experts
    /// `first..first + experts.len()` only. Routing still ranks all `n_experts`; a token's
    /// experts held elsewhere contribute nothing here (the group's all-reduce adds them).
    #[allow(clippy::too_many_arguments)]
    fn moe_local(
        &self,
        x: &Self::Buf,
        gate_logits: &Self::Buf,
        bias: &Self::Buf,
        cfg: &RouterConfig,
        experts: &[ExpertWeights<Self::Matrix>],
        first: usize,
        shared: Option<&Self::Buf>,
    ) -> Result<Self::Buf> {
        if first == 0 && experts.len() == cfg.n_experts {
            return self.moe(x, gate_logits, bias, cfg, experts, shared);
        }
        Err(BackendError::Shape { op: "moe_local", reason: format!("the {} backend holds all {} experts or none", self.name(), cfg.n_experts) })
    }

    /// A model's MoE block: the routed experts `first..` as [`Self::moe_local`], plus the shared
    /// experts given as weights — their intermediate dimension in `shared.len()` chunks (each a
    /// gated MLP; their outputs add up to the shared experts'). The default runs the chunks apart
    /// and hands their sum to the combine; a backend may run them with the routed experts
    /// instead, as experts every token takes with weight 1.
    #[allow(clippy::too_many_arguments)]
    fn moe_block(
        &self,
        x: &Self::Buf,
        gate_logits: &Self::Buf,
        bias: &Self::Buf,
        cfg: &RouterConfig,
        experts: &[ExpertWeights<Self::Matrix>],
        first: usize,
        shared: &[ExpertWeights<Self::Matrix>],
    ) -> Result<Self::Buf> {
        let sum = self.shared_experts(x, shared)?;
        self.moe_local(x, gate_logits, bias, cfg, experts, first, sum.as_ref())
    }

    /// [`Self::moe_block`] with the router too: its gate logits are `x · routerᵀ`
    /// (`router [n_experts, hidden]`). The default multiplies first ([`Self::linear`]); a
    /// backend may take the product in the routing's own pass.
    #[allow(clippy::too_many_arguments)]
    fn moe_block_routed(
        &self,
        x: &Self::Buf,
        router: &Self::Matrix,
        bias: &Self::Buf,
        cfg: &RouterConfig,
        experts: &[ExpertWeights<Self::Matrix>],
        first: usize,
        shared: &[ExpertWeights<Self::Matrix>],
    ) -> Result<Self::Buf> {
        let logits = self.linear(x, router)?;
        self.moe_block(x, &logits, bias, cfg, experts, first, shared)
    }

    /// [`Self::moe_block_routed`] added into the residual stream (rows `dim` wide) and normed
    /// with `weight` (the next layer's input norm, or the model's last): returns what
    /// [`Self::add_rms_norm`] of the block's output returns. The default runs the two; a
    /// backend may add and norm in the pass that combines the experts' outputs.
    #[allow(clippy::too_many_arguments)]
    fn moe_block_routed_add_norm(
        &self,
        x: &Self::Buf,
        router: &Self::Matrix,
        bias: &Self::Buf,
        cfg: &RouterConfig,
        (experts, first): (&[ExpertWeights<Self::Matrix>], usize),
        shared: &[ExpertWeights<Self::Matrix>],
        (residual, dim, weight, eps): (&mut Self::Buf, usize, &Self::Buf, f32),
    ) -> Result<Self::Buf> {
        let delta = self.moe_block_routed(x, router, bias, cfg, experts, first, shared)?;
        self.add_rms_norm(residual, &delta, dim, weight, eps)
    }

    /// The shared experts' output on `x`: each chunk's gated MLP, summed (`None` without any;
    /// [`shared_experts_apart`] unless a backend shares work between the chunks).
    fn shared_experts(&self, x: &Self::Buf, shared: &[ExpertWeights<Self::Matrix>]) -> Result<Option<Self::Buf>> {
        shared_experts_apart(self, x, shared)
    }

    // ---- sampling front end ----
    /// For each row of `logits [rows.len(), vocab]`: applies the row's token edits in place,
    /// then returns its top-`k` candidates after temperature and the full-row log-sum-exp
    /// ([`front`] is the reference). GPU backends run it on the device so that only the
    /// candidates cross to the host; this default runs it on a host copy.
    fn sampling_front(&self, logits: &mut Self::Buf, vocab: usize, rows: &[front::FrontRow]) -> Result<Vec<front::FrontOut>> {
        let mut host = self.download(logits)?;
        front::check("sampling_front", host.len(), vocab, rows)?;
        let out = front::run_on_host(&mut host, vocab, rows);
        *logits = self.upload(&host)?;
        Ok(out)
    }
    /// Selected `dim`-wide rows of `x` on the host, in the order given.
    fn download_rows(&self, x: &Self::Buf, dim: usize, rows: &[u32]) -> Result<Vec<f32>> {
        self.download(&self.gather_rows(x, dim, rows)?)
    }
}

#[cfg(test)]
mod kv_dtype_tests {
    use super::KvDtype;

    #[test]
    fn kv_dtype_parses_sizes_and_rounds() {
        assert_eq!(KvDtype::parse("bf16"), Ok(KvDtype::Bf16));
        assert_eq!(KvDtype::parse("f32"), Ok(KvDtype::F32));
        assert!(KvDtype::parse("fp8").unwrap_err().contains("expected f32 or bf16"));
        assert_eq!((KvDtype::F32.size(), KvDtype::Bf16.size()), (4, 2));
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1); 1 + 3·2^-9 rounds up.
        assert_eq!(KvDtype::Bf16.round(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(KvDtype::Bf16.round(1.0 + 3.0 / 512.0), 1.0 + 1.0 / 128.0);
        assert_eq!(KvDtype::F32.round(0.1), 0.1);
    }
}
