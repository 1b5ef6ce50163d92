//! A DFlash block-diffusion draft model (z-lab's `DFlashDraftModel`): Qwen3-style decoder
//! layers (q/k/v/o projections, per-head q/k RMSNorm, rotate-half RoPE, SwiGLU MLP) that draft a
//! whole block of tokens in one pass, conditioned on hidden states taken from several of the
//! target's layers. Configuration, weights (the published names: `fc.weight`,
//! `hidden_norm.weight`, `layers.{i}.self_attn.q_proj.weight`, ..., `norm.weight`, with or
//! without a `model.` prefix) and the two halves of its forward pass over a [`Backend`]:
//!
//! - context: the target's captured features of committed positions become, through `fc` and
//!   `hidden_norm`, keys and values of every draft layer ([`DFlashModel::store_context`]) —
//!   the draft never runs its layers over context positions;
//! - block: the last committed token followed by `block_size - 1` mask tokens, embedded with
//!   the target's embedding table, attends bidirectionally to all context entries and to
//!   itself ([`DFlashModel::block_hidden`]); the target's lm_head on rows 1.. gives the drafts.
//!
//! The draft has no embedding or lm_head of its own; its hidden size must be the target's.

use crate::checkpoint::Checkpoint;
use crate::config::{self, ConfigError, ModelConfig};
use crate::weights::{stack_rows, LoadError};
use crate::ModelError;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::path::Path;
use weft_backend::{AttnRow, Backend, ExpertWeights, HostMatrix, KvLayout, Result, RopeParams, WeightDtype};

/// The validated `config.json` of a DFlash draft.
#[derive(Clone, Debug)]
pub struct DFlashConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: config::RopeScaling,
    /// Tokens per drafted block (the last committed token plus `block_size - 1` drafts).
    pub block_size: usize,
    pub mask_token_id: u32,
    /// Target layers whose outputs feed the draft (`hidden_states[id + 1]` in transformers).
    pub target_layer_ids: Vec<usize>,
}

/// z-lab's default choice of target layers for `draft_layers` draft layers (Python's `round`:
/// halves to even).
pub fn default_target_layer_ids(target_layers: usize, draft_layers: usize) -> Vec<usize> {
    if draft_layers == 1 {
        return vec![target_layers / 2];
    }
    let (start, end) = (1.0, target_layers as f64 - 3.0);
    (0..draft_layers).map(|i| (start + i as f64 * (end - start) / (draft_layers - 1) as f64).round_ties_even() as usize).collect()
}

impl DFlashConfig {
    pub fn from_file(path: &Path, target: &ModelConfig) -> std::result::Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io { path: path.display().to_string(), source })?;
        let v: Value = serde_json::from_str(&text).map_err(|source| ConfigError::Json { path: path.display().to_string(), source })?;
        Self::from_json(&v, target)
    }

    /// Parses and checks a draft config against the `target` it will draft for.
    pub fn from_json(v: &Value, target: &ModelConfig) -> std::result::Result<Self, ConfigError> {
        let m = v.as_object().ok_or_else(|| ConfigError::Type { field: "<root>".into(), reason: "expected a JSON object".into() })?;
        let unsupported = |f: &str, v: &dyn std::fmt::Display, why: &str| ConfigError::Unsupported { field: f.into(), value: v.to_string(), reason: why.into() };
        let dc: Map<String, Value> = match config::get(m, "dflash_config") {
            Some(Value::Object(o)) => o.clone(),
            Some(other) => return Err(ConfigError::Type { field: "dflash_config".into(), reason: format!("expected an object, got {other}") }),
            None => return Err(ConfigError::Missing("dflash_config (this is not a DFlash draft's config.json)")),
        };
        let hidden_size = config::usize_field(m, "hidden_size")?;
        let num_hidden_layers = config::usize_field(m, "num_hidden_layers")?;
        let heads = config::usize_field(m, "num_attention_heads")?;
        let kv_heads = config::opt_usize(m, "num_key_value_heads")?.unwrap_or(heads);
        let head_dim = config::opt_usize(m, "head_dim")?.unwrap_or(if heads > 0 { hidden_size / heads } else { 0 });
        let block_size = config::usize_field(m, "block_size")?;
        if hidden_size != target.hidden_size {
            return Err(unsupported("hidden_size", &hidden_size, &format!("the draft's hidden size must be the target's ({})", target.hidden_size)));
        }
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(unsupported("num_key_value_heads", &kv_heads, &format!("must divide num_attention_heads ({heads})")));
        }
        if head_dim == 0 || head_dim % 2 != 0 || head_dim > 256 {
            return Err(unsupported("head_dim", &head_dim, "must be even and at most 256"));
        }
        if num_hidden_layers == 0 {
            return Err(unsupported("num_hidden_layers", &0, "a draft needs at least one layer"));
        }
        if block_size < 2 {
            return Err(unsupported("block_size", &block_size, "a block drafts block_size - 1 tokens: at least 2"));
        }
        if let Some(act) = config::str_field(m, "hidden_act")? {
            if act != "silu" {
                return Err(unsupported("hidden_act", &act, "supported: silu"));
            }
        }
        if config::bool_field(m, "attention_bias", false)? {
            return Err(unsupported("attention_bias", &true, "attention projections with biases are not supported"));
        }
        if let Some(Value::Array(types)) = config::get(m, "layer_types") {
            if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                return Err(unsupported("layer_types", t, "supported: full_attention (no sliding-window draft layers)"));
            }
        } else if config::bool_field(m, "use_sliding_window", false)? {
            return Err(unsupported("use_sliding_window", &true, "sliding-window draft layers are not supported"));
        }
        let mask = config::get(&dc, "mask_token_id").ok_or(ConfigError::Missing("dflash_config.mask_token_id"))?;
        let mask_token_id = mask
            .as_u64()
            .filter(|&x| (x as usize) < target.vocab_size)
            .ok_or_else(|| unsupported("dflash_config.mask_token_id", mask, &format!("must be a token id below the target's vocabulary ({})", target.vocab_size)))? as u32;
        let target_layer_ids: Vec<usize> = match config::get(&dc, "target_layer_ids") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|y| y as usize).ok_or_else(|| ConfigError::Type { field: "dflash_config.target_layer_ids".into(), reason: format!("bad layer id {x}") }))
                .collect::<std::result::Result<_, _>>()?,
            Some(other) => return Err(ConfigError::Type { field: "dflash_config.target_layer_ids".into(), reason: format!("expected a list, got {other}") }),
            None => default_target_layer_ids(config::opt_usize(m, "num_target_layers")?.unwrap_or(target.num_hidden_layers), num_hidden_layers),
        };
        if target_layer_ids.is_empty() {
            return Err(unsupported("dflash_config.target_layer_ids", &"[]", "at least one target layer"));
        }
        if let Some(bad) = target_layer_ids.iter().find(|&&l| l >= target.num_hidden_layers) {
            return Err(unsupported("dflash_config.target_layer_ids", bad, &format!("the target has {} layers", target.num_hidden_layers)));
        }
        let max_pos = config::opt_usize(m, "max_position_embeddings")?.unwrap_or(target.max_position_embeddings);
        let (rope_theta, rope_scaling) = config::parse_rope(m, max_pos)?;
        Ok(DFlashConfig {
            hidden_size,
            num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            intermediate_size: config::usize_field(m, "intermediate_size")?,
            rms_norm_eps: config::f64_field(m, "rms_norm_eps", Some(1e-6))?,
            rope_theta,
            rope_scaling,
            block_size,
            mask_token_id,
            target_layer_ids,
        })
    }
}

pub struct DFlashLayer<B: Backend> {
    pub input_layernorm: B::Buf,
    pub post_attention_layernorm: B::Buf,
    pub q_proj: B::Matrix,
    pub k_proj: B::Matrix,
    pub v_proj: B::Matrix,
    pub o_proj: B::Matrix,
    pub q_norm: B::Buf,
    pub k_norm: B::Buf,
    pub mlp: ExpertWeights<B::Matrix>,
}

/// A loaded DFlash draft. `fc` is kept as one `[hidden, hidden]` column block per target
/// layer, so the concatenation of features becomes a sum of products.
pub struct DFlashModel<B: Backend> {
    pub cfg: DFlashConfig,
    pub fc: Vec<B::Matrix>,
    pub hidden_norm: B::Buf,
    pub layers: Vec<DFlashLayer<B>>,
    pub norm: B::Buf,
    rope: RopeParams,
    scale: f32,
}

/// Columns `c0..c0 + w` of a dense host matrix.
fn column_block(m: &HostMatrix<'_>, c0: usize, w: usize) -> std::result::Result<HostMatrix<'static>, LoadError> {
    if m.dtype == WeightDtype::Fp8E4M3 {
        return Err(LoadError::Backend(weft_backend::BackendError::Shape { op: "dflash fc", reason: format!("{}: fp8 DFlash weights are not supported (bf16, f16 or f32)", m.name) }));
    }
    m.validate()?;
    let es = m.dtype.size();
    let mut bytes = Vec::with_capacity(m.rows * w * es);
    for r in 0..m.rows {
        let at = (r * m.cols + c0) * es;
        bytes.extend_from_slice(&m.bytes[at..at + w * es]);
    }
    Ok(HostMatrix { name: format!("{}[:, {c0}..{}]", m.name, c0 + w), rows: m.rows, cols: w, dtype: m.dtype, bytes: Cow::Owned(bytes), scales: None })
}

impl<B: Backend> DFlashModel<B> {
    /// Loads the draft in `dir` for `target` onto `be`.
    pub fn open(dir: &Path, be: &B, target: &ModelConfig) -> std::result::Result<Self, ModelError> {
        Self::open_from(dir, be, target, false)
    }

    /// `--load-format dummy`: the architecture from `dir/config.json`, synthesized weights.
    pub fn open_dummy(dir: &Path, be: &B, target: &ModelConfig) -> std::result::Result<Self, ModelError> {
        Self::open_from(dir, be, target, true)
    }

    fn open_from(dir: &Path, be: &B, target: &ModelConfig, dummy: bool) -> std::result::Result<Self, ModelError> {
        if !dir.is_dir() {
            return Err(ModelError::NoDir(dir.display().to_string()));
        }
        let cfg = DFlashConfig::from_file(&dir.join("config.json"), target)?;
        let ck = if dummy { Checkpoint::dummy(0xdf1a5, None) } else { Checkpoint::open(dir, None)? };
        let prefix = if !dummy && ck.contains("model.fc.weight") { "model." } else { "" };
        let name = |n: &str| format!("{prefix}{n}");
        let (h, d, heads, kvh, inter) = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size);
        let mat = |n: &str, rows: usize, cols: usize| -> std::result::Result<B::Matrix, ModelError> { Ok(be.upload_matrix(&ck.matrix(&name(n), rows, cols).map_err(LoadError::from)?)?) };
        let vec = |n: &str, len: usize| -> std::result::Result<B::Buf, ModelError> { Ok(be.upload(&ck.vector(&name(n), len).map_err(LoadError::from)?)?) };
        let n = cfg.target_layer_ids.len();
        let fc_full = ck.matrix(&name("fc.weight"), h, n * h).map_err(LoadError::from)?;
        let fc = (0..n).map(|j| Ok(be.upload_matrix(&column_block(&fc_full, j * h, h)?)?)).collect::<std::result::Result<Vec<_>, ModelError>>()?;
        drop(fc_full);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("layers.{i}");
            let (gn, un) = (name(&format!("{p}.mlp.gate_proj.weight")), name(&format!("{p}.mlp.up_proj.weight")));
            let (g, u) = (ck.matrix(&gn, inter, h).map_err(LoadError::from)?, ck.matrix(&un, inter, h).map_err(LoadError::from)?);
            let gate_up = be.upload_matrix(&stack_rows(&format!("{p}.mlp.gate_up"), &g, &u)?)?;
            layers.push(DFlashLayer {
                input_layernorm: vec(&format!("{p}.input_layernorm.weight"), h)?,
                post_attention_layernorm: vec(&format!("{p}.post_attention_layernorm.weight"), h)?,
                q_proj: mat(&format!("{p}.self_attn.q_proj.weight"), heads * d, h)?,
                k_proj: mat(&format!("{p}.self_attn.k_proj.weight"), kvh * d, h)?,
                v_proj: mat(&format!("{p}.self_attn.v_proj.weight"), kvh * d, h)?,
                o_proj: mat(&format!("{p}.self_attn.o_proj.weight"), h, heads * d)?,
                q_norm: vec(&format!("{p}.self_attn.q_norm.weight"), d)?,
                k_norm: vec(&format!("{p}.self_attn.k_norm.weight"), d)?,
                mlp: ExpertWeights { gate_up, down: mat(&format!("{p}.mlp.down_proj.weight"), h, inter)?, inter },
            });
        }
        let (inv_freq, attention_factor) = config::rope_inv_freq(d, cfg.rope_theta, &cfg.rope_scaling);
        let rope = RopeParams { inv_freq, attention_factor, interleaved: false };
        Ok(DFlashModel { fc, hidden_norm: vec("hidden_norm.weight", h)?, norm: vec("norm.weight", h)?, layers, rope, scale: (d as f32).powf(-0.5), cfg })
    }

    /// The draft's cache: every layer's keys and values, `num_pages` pages of `page_size`.
    pub fn kv_layout(&self, num_pages: usize, page_size: usize) -> KvLayout {
        KvLayout::gqa(self.cfg.num_hidden_layers, num_pages, page_size, self.cfg.num_key_value_heads, self.cfg.head_dim)
    }

    /// RMSNorm per head, then RoPE at each row's position: `[m, heads, head_dim]`.
    fn norm_rope(&self, be: &B, x: &B::Buf, w: &B::Buf, heads: usize, positions: &[u32]) -> Result<B::Buf> {
        let n = be.rms_norm(x, self.cfg.head_dim, w, self.cfg.rms_norm_eps as f32)?;
        Ok(be.mla_split_rope_q(&n, heads, 0, self.cfg.head_dim, positions, &self.rope)?.1)
    }

    /// Keys and values of context positions: `features[j]` holds, for every position, the
    /// output of target layer `target_layer_ids[j]` (`[m, hidden]`); they are stored in every
    /// layer at `slots`.
    pub fn store_context(&self, be: &B, pool: &mut B::KvPool, features: &[B::Buf], positions: &[u32], slots: &[u32]) -> Result<()> {
        if features.len() != self.fc.len() {
            return Err(weft_backend::BackendError::Shape { op: "dflash context", reason: format!("{} feature blocks for {} target layers", features.len(), self.fc.len()) });
        }
        let mut th = be.linear(&features[0], &self.fc[0])?;
        for (f, w) in features.iter().zip(&self.fc).skip(1) {
            be.add_inplace(&mut th, &be.linear(f, w)?)?;
        }
        let th = be.rms_norm(&th, self.cfg.hidden_size, &self.hidden_norm, self.cfg.rms_norm_eps as f32)?;
        for (i, l) in self.layers.iter().enumerate() {
            let k = self.norm_rope(be, &be.linear(&th, &l.k_proj)?, &l.k_norm, self.cfg.num_key_value_heads, positions)?;
            be.kv_store(pool, i, &k, &be.linear(&th, &l.v_proj)?, slots)?;
        }
        Ok(())
    }

    /// The draft's final-normed hidden states `[m, hidden]` of block rows whose input
    /// embeddings are `x`: each layer stores the rows' own keys and values at `slots`, and
    /// every row attends to the entries its `attn` row allows (context and the whole block:
    /// no causal mask inside a block).
    pub fn block_hidden(&self, be: &B, pool: &mut B::KvPool, x: B::Buf, positions: &[u32], slots: &[u32], attn: &[AttnRow<'_>]) -> Result<B::Buf> {
        let (h, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps as f32);
        let (heads, kvh) = (self.cfg.num_attention_heads, self.cfg.num_key_value_heads);
        let mut residual = x;
        let mut delta: Option<B::Buf> = None;
        for (i, l) in self.layers.iter().enumerate() {
            let xn = match &delta {
                None => be.rms_norm(&residual, h, &l.input_layernorm, eps)?,
                Some(d) => be.add_rms_norm(&mut residual, d, h, &l.input_layernorm, eps)?,
            };
            let q = self.norm_rope(be, &be.linear(&xn, &l.q_proj)?, &l.q_norm, heads, positions)?;
            let k = self.norm_rope(be, &be.linear(&xn, &l.k_proj)?, &l.k_norm, kvh, positions)?;
            be.kv_store(pool, i, &k, &be.linear(&xn, &l.v_proj)?, slots)?;
            let o = be.gqa_attention(pool, i, &q, heads, kvh, attn, self.scale)?;
            let xn = be.add_rms_norm(&mut residual, &be.linear(&o, &l.o_proj)?, h, &l.post_attention_layernorm, eps)?;
            let hid = be.gated_up(&xn, &l.mlp.gate_up, l.mlp.inter)?;
            delta = Some(be.linear(&hid, &l.mlp.down)?);
        }
        match &delta {
            Some(d) => be.add_rms_norm(&mut residual, d, h, &self.norm, eps),
            None => be.rms_norm(&residual, h, &self.norm, eps),
        }
    }
}
