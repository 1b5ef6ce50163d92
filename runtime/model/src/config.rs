//! `config.json` of a DeepSeek-V3-family checkpoint (deepseek_v3, kimi_k2): parsing every field
//! that changes the math, validating it, and deriving RoPE/YaRN parameters. Unknown model types
//! and unsupported values are refused with an error naming the field.

use serde_json::{Map, Value};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not valid JSON: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("config.json: missing required field `{0}`")]
    Missing(&'static str),
    #[error("config.json: field `{field}` has the wrong type: {reason}")]
    Type { field: String, reason: String },
    #[error("config.json: unsupported `{field}` = {value}: {reason}")]
    Unsupported { field: String, value: String, reason: String },
}

type Result<T> = std::result::Result<T, ConfigError>;

/// Rotary scaling as configured (`rope_scaling` in v4 style, `rope_parameters` in v5 style).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Linear { factor: f64 },
    Yarn { factor: f64, original_max_position_embeddings: usize, beta_fast: f64, beta_slow: f64, mscale: Option<f64>, mscale_all_dim: Option<f64>, attention_factor: Option<f64>, truncate: bool },
}

/// The validated model configuration.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    pub first_k_dense_replace: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub rope_interleave: bool,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub num_nextn_predict_layers: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// fp8 block size `[rows, cols]` from `quantization_config.weight_block_size`.
    pub fp8_block: Option<(usize, usize)>,
}

pub(crate) fn get<'a>(m: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    m.get(k).filter(|v| !v.is_null())
}

pub(crate) fn usize_field(m: &Map<String, Value>, k: &'static str) -> Result<usize> {
    opt_usize(m, k)?.ok_or(ConfigError::Missing(k))
}

pub(crate) fn opt_usize(m: &Map<String, Value>, k: &str) -> Result<Option<usize>> {
    match get(m, k) {
        None => Ok(None),
        Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| ConfigError::Type { field: k.into(), reason: format!("expected a non-negative integer, got {v}") }),
    }
}

pub(crate) fn f64_field(m: &Map<String, Value>, k: &str, default: Option<f64>) -> Result<f64> {
    match get(m, k) {
        None => default.ok_or_else(|| ConfigError::Type { field: k.into(), reason: "missing".into() }),
        Some(v) => v.as_f64().ok_or_else(|| ConfigError::Type { field: k.into(), reason: format!("expected a number, got {v}") }),
    }
}

pub(crate) fn bool_field(m: &Map<String, Value>, k: &str, default: bool) -> Result<bool> {
    match get(m, k) {
        None => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| ConfigError::Type { field: k.into(), reason: format!("expected true/false, got {v}") }),
    }
}

pub(crate) fn str_field<'a>(m: &'a Map<String, Value>, k: &str) -> Result<Option<&'a str>> {
    match get(m, k) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or_else(|| ConfigError::Type { field: k.into(), reason: format!("expected a string, got {v}") }),
    }
}

pub(crate) fn unsupported(field: &str, value: impl std::fmt::Display, reason: &str) -> ConfigError {
    ConfigError::Unsupported { field: field.into(), value: value.to_string(), reason: reason.into() }
}

fn token_ids(v: Option<&Value>, field: &str) -> Result<Vec<u32>> {
    match v {
        None => Ok(vec![]),
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).ok_or_else(|| ConfigError::Type { field: field.into(), reason: format!("bad token id {n}") }),
        Some(Value::Array(a)) => a.iter().map(|x| x.as_u64().map(|y| y as u32).ok_or_else(|| ConfigError::Type { field: field.into(), reason: format!("bad token id {x}") })).collect(),
        Some(other) => Err(ConfigError::Type { field: field.into(), reason: format!("expected a token id or list, got {other}") }),
    }
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io { path: path.display().to_string(), source })?;
        let v: Value = serde_json::from_str(&text).map_err(|source| ConfigError::Json { path: path.display().to_string(), source })?;
        Self::from_json(&v)
    }

    pub fn from_json(v: &Value) -> Result<Self> {
        let m = v.as_object().ok_or_else(|| ConfigError::Type { field: "<root>".into(), reason: "expected a JSON object".into() })?;
        let model_type = str_field(m, "model_type")?.ok_or(ConfigError::Missing("model_type"))?.to_string();
        if !matches!(model_type.as_str(), "deepseek_v3" | "kimi_k2") {
            return Err(unsupported("model_type", &model_type, "weft serves the DeepSeek-V3 family: deepseek_v3 or kimi_k2"));
        }
        if let Some(archs) = get(m, "architectures") {
            let ok = archs.as_array().map(|a| a.iter().any(|x| x.as_str() == Some("DeepseekV3ForCausalLM"))).unwrap_or(false);
            if !ok {
                return Err(unsupported("architectures", archs, "expected DeepseekV3ForCausalLM"));
            }
        }
        if let Some(act) = str_field(m, "hidden_act")? {
            if act != "silu" {
                return Err(unsupported("hidden_act", act, "only silu is used by this architecture"));
            }
        }
        if bool_field(m, "attention_bias", false)? {
            return Err(unsupported("attention_bias", true, "no published DeepSeek-V3/Kimi checkpoint uses attention biases"));
        }
        let scoring = str_field(m, "scoring_func")?.unwrap_or("sigmoid");
        if scoring != "sigmoid" {
            return Err(unsupported("scoring_func", scoring, "DeepSeek-V3 routing uses sigmoid scores"));
        }
        let topk_method = str_field(m, "topk_method")?.unwrap_or("noaux_tc");
        if topk_method != "noaux_tc" {
            return Err(unsupported("topk_method", topk_method, "DeepSeek-V3 routing is noaux_tc (bias-corrected, group-limited top-k)"));
        }
        let moe_layer_freq = opt_usize(m, "moe_layer_freq")?.unwrap_or(1);
        if moe_layer_freq != 1 {
            return Err(unsupported("moe_layer_freq", moe_layer_freq, "every published checkpoint of this family uses 1"));
        }

        let heads = usize_field(m, "num_attention_heads")?;
        let n_routed = usize_field(m, "n_routed_experts")?;
        let n_group = opt_usize(m, "n_group")?.unwrap_or(1);
        let topk_group = opt_usize(m, "topk_group")?.unwrap_or(1);
        let top_k = usize_field(m, "num_experts_per_tok")?;
        let rope_dim = usize_field(m, "qk_rope_head_dim")?;
        if n_group == 0 || n_routed % n_group != 0 {
            return Err(unsupported("n_group", n_group, &format!("must divide n_routed_experts ({n_routed})")));
        }
        if topk_group == 0 || topk_group > n_group {
            return Err(unsupported("topk_group", topk_group, &format!("must be in 1..=n_group ({n_group})")));
        }
        if top_k == 0 || top_k > topk_group * (n_routed / n_group) {
            return Err(unsupported("num_experts_per_tok", top_k, "must be at least 1 and fit in the selected groups"));
        }
        if rope_dim == 0 || rope_dim % 2 != 0 {
            return Err(unsupported("qk_rope_head_dim", rope_dim, "must be even and positive"));
        }
        if heads == 0 {
            return Err(unsupported("num_attention_heads", 0, "must be positive"));
        }
        let nkv = opt_usize(m, "num_key_value_heads")?.unwrap_or(heads);
        if nkv != heads {
            return Err(unsupported("num_key_value_heads", nkv, "MLA needs num_key_value_heads == num_attention_heads"));
        }

        let max_pos = opt_usize(m, "max_position_embeddings")?.unwrap_or(4096);
        let (rope_theta, rope_scaling) = parse_rope(m, max_pos)?;
        let fp8_block = parse_quantization(m)?;
        let q_lora_rank = opt_usize(m, "q_lora_rank")?;
        if q_lora_rank == Some(0) {
            return Err(unsupported("q_lora_rank", 0, "use null for no q LoRA"));
        }
        let cfg = ModelConfig {
            vocab_size: usize_field(m, "vocab_size")?,
            hidden_size: usize_field(m, "hidden_size")?,
            intermediate_size: usize_field(m, "intermediate_size")?,
            moe_intermediate_size: usize_field(m, "moe_intermediate_size")?,
            num_hidden_layers: usize_field(m, "num_hidden_layers")?,
            num_attention_heads: heads,
            q_lora_rank,
            kv_lora_rank: usize_field(m, "kv_lora_rank")?,
            qk_nope_head_dim: usize_field(m, "qk_nope_head_dim")?,
            qk_rope_head_dim: rope_dim,
            v_head_dim: usize_field(m, "v_head_dim")?,
            n_routed_experts: n_routed,
            num_experts_per_tok: top_k,
            n_shared_experts: opt_usize(m, "n_shared_experts")?.unwrap_or(0),
            first_k_dense_replace: opt_usize(m, "first_k_dense_replace")?.unwrap_or(0),
            n_group,
            topk_group,
            norm_topk_prob: bool_field(m, "norm_topk_prob", true)?,
            routed_scaling_factor: f64_field(m, "routed_scaling_factor", Some(1.0))?,
            rms_norm_eps: f64_field(m, "rms_norm_eps", Some(1e-6))?,
            rope_theta,
            rope_scaling,
            rope_interleave: bool_field(m, "rope_interleave", true)?,
            max_position_embeddings: max_pos,
            tie_word_embeddings: bool_field(m, "tie_word_embeddings", false)?,
            num_nextn_predict_layers: opt_usize(m, "num_nextn_predict_layers")?.unwrap_or(0),
            bos_token_id: token_ids(get(m, "bos_token_id"), "bos_token_id")?.first().copied(),
            eos_token_ids: token_ids(get(m, "eos_token_id"), "eos_token_id")?,
            fp8_block,
            model_type,
        };
        for (f, v) in [
            ("vocab_size", cfg.vocab_size),
            ("hidden_size", cfg.hidden_size),
            ("num_hidden_layers", cfg.num_hidden_layers),
            ("kv_lora_rank", cfg.kv_lora_rank),
            ("v_head_dim", cfg.v_head_dim),
            ("moe_intermediate_size", cfg.moe_intermediate_size),
        ] {
            if v == 0 {
                return Err(unsupported(f, 0, "must be positive"));
            }
        }
        // Bounds far above any published model that keep sizes computed from the config
        // (weights, caches, per-layer tables) from overflowing or asking for absurd memory.
        const DIM: usize = 1 << 24;
        for (f, v, max) in [
            ("vocab_size", cfg.vocab_size, DIM),
            ("hidden_size", cfg.hidden_size, DIM),
            ("intermediate_size", cfg.intermediate_size, DIM),
            ("moe_intermediate_size", cfg.moe_intermediate_size, DIM),
            ("num_hidden_layers", cfg.num_hidden_layers, 4096),
            ("num_attention_heads", cfg.num_attention_heads, 4096),
            ("q_lora_rank", cfg.q_lora_rank.unwrap_or(0), DIM),
            ("kv_lora_rank", cfg.kv_lora_rank, DIM),
            ("qk_nope_head_dim", cfg.qk_nope_head_dim, 65536),
            ("qk_rope_head_dim", cfg.qk_rope_head_dim, 65536),
            ("v_head_dim", cfg.v_head_dim, 65536),
            ("n_routed_experts", cfg.n_routed_experts, 65536),
            ("n_shared_experts", cfg.n_shared_experts, 65536),
            ("num_nextn_predict_layers", cfg.num_nextn_predict_layers, 4096),
            ("max_position_embeddings", cfg.max_position_embeddings, 1 << 30),
        ] {
            if v > max {
                return Err(unsupported(f, v, &format!("larger than weft accepts ({max})")));
            }
        }
        Ok(cfg)
    }

    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    pub fn is_moe_layer(&self, layer: usize) -> bool {
        layer >= self.first_k_dense_replace
    }

    /// Softmax scale of attention: `qk_head_dim^-0.5`, times `mscale(factor, mscale_all_dim)²`
    /// under YaRN, as the reference implementation does.
    pub fn softmax_scale(&self) -> f64 {
        let mut s = (self.qk_head_dim() as f64).powf(-0.5);
        if let RopeScaling::Yarn { factor, mscale_all_dim, .. } = self.rope_scaling {
            if let Some(all) = mscale_all_dim.filter(|x| *x != 0.0) {
                let m = yarn_mscale(factor, all);
                s *= m * m;
            }
        }
        s
    }

    /// Inverse frequencies (f32, as the reference computes them) and the cos/sin attention
    /// factor.
    pub fn rope_inv_freq(&self) -> (Vec<f32>, f32) {
        rope_inv_freq(self.qk_rope_head_dim, self.rope_theta, &self.rope_scaling)
    }
}

/// RoPE inverse frequencies over `dim` rotated dimensions and the attention factor (1 unless
/// YaRN), from the base `theta` and the configured scaling, in f32 as transformers computes them.
pub fn rope_inv_freq(dim: usize, theta: f64, scaling: &RopeScaling) -> (Vec<f32>, f32) {
    // pos_freqs in f32 as torch does: base ** (arange(0, dim, 2).float() / dim)
    let pos_freqs: Vec<f32> = (0..dim / 2).map(|i| (theta as f32).powf((2 * i) as f32 / dim as f32)).collect();
    match scaling {
        RopeScaling::None => (pos_freqs.iter().map(|p| 1.0 / p).collect(), 1.0),
        RopeScaling::Linear { factor } => (pos_freqs.iter().map(|p| 1.0 / p / *factor as f32).collect(), 1.0),
        RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor, truncate } => {
            let af = attention_factor.unwrap_or_else(|| {
                // As the reference: both present and non-zero → their ratio.
                if let (Some(m), Some(a)) = (mscale.filter(|x| *x != 0.0), mscale_all_dim.filter(|x| *x != 0.0)) {
                    yarn_mscale(*factor, m) / yarn_mscale(*factor, a)
                } else {
                    yarn_mscale(*factor, 1.0)
                }
            });
            let corr = |rot: f64| (dim as f64 * ((*original_max_position_embeddings as f64) / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln());
            let (mut low, mut high) = (corr(*beta_fast), corr(*beta_slow));
            if *truncate {
                low = low.floor();
                high = high.ceil();
            }
            let low = low.max(0.0);
            let high = high.min(dim as f64 - 1.0);
            let high = if low == high { high + 0.001 } else { high };
            let inv: Vec<f32> = (0..dim / 2)
                .map(|i| {
                    let ramp = (((i as f32) - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                    let extrap_factor = 1.0 - ramp;
                    let extrap = 1.0 / pos_freqs[i];
                    let interp = 1.0 / (*factor as f32 * pos_freqs[i]);
                    interp * (1.0 - extrap_factor) + extrap * extrap_factor
                })
                .collect();
            (inv, af as f32)
        }
    }
}

/// YaRN's `0.1 · m · ln(scale) + 1` (1 for scale ≤ 1).
pub fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

pub(crate) fn parse_rope(m: &Map<String, Value>, max_pos: usize) -> Result<(f64, RopeScaling)> {
    // v5 style: rope_parameters { rope_type, rope_theta, factor, ... }; v4 style: rope_theta +
    // rope_scaling { type | rope_type, factor, ... }.
    let (field, params) = match (get(m, "rope_parameters"), get(m, "rope_scaling")) {
        (Some(p), _) => ("rope_parameters", Some(p)),
        (None, Some(s)) => ("rope_scaling", Some(s)),
        (None, None) => ("rope_scaling", None),
    };
    let p = match params {
        None => return Ok((f64_field(m, "rope_theta", Some(10000.0))?, RopeScaling::None)),
        Some(p) => p.as_object().ok_or_else(|| ConfigError::Type { field: field.into(), reason: "expected an object".into() })?,
    };
    let theta = match get(p, "rope_theta") {
        Some(_) => f64_field(p, "rope_theta", None)?,
        None => f64_field(m, "rope_theta", Some(10000.0))?,
    };
    let kind = str_field(p, "rope_type")?.or(str_field(p, "type")?).unwrap_or("default");
    let fname = |k: &str| format!("{field}.{k}");
    let num = |k: &str, d: Option<f64>| -> Result<f64> {
        match get(p, k) {
            None => d.ok_or_else(|| ConfigError::Type { field: fname(k), reason: "missing".into() }),
            Some(v) => v.as_f64().ok_or_else(|| ConfigError::Type { field: fname(k), reason: format!("expected a number, got {v}") }),
        }
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: num("factor", None)? },
        "yarn" => {
            let orig = match get(p, "original_max_position_embeddings") {
                Some(v) => v.as_u64().ok_or_else(|| ConfigError::Type { field: fname("original_max_position_embeddings"), reason: format!("expected an integer, got {v}") })? as usize,
                None => max_pos,
            };
            // As the reference: the ratio of context lengths only when no factor is given.
            let factor = match get(p, "factor") {
                Some(_) => num("factor", None)?,
                None => max_pos as f64 / orig as f64,
            };
            if factor <= 0.0 {
                return Err(unsupported(&fname("factor"), factor, "must be positive"));
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: orig,
                beta_fast: num("beta_fast", Some(32.0))?,
                beta_slow: num("beta_slow", Some(1.0))?,
                mscale: get(p, "mscale").map(|_| num("mscale", None)).transpose()?,
                mscale_all_dim: get(p, "mscale_all_dim").map(|_| num("mscale_all_dim", None)).transpose()?,
                attention_factor: get(p, "attention_factor").and_then(|v| v.as_f64()),
                truncate: bool_field(p, "truncate", true)?,
            }
        }
        other => return Err(unsupported(&fname("rope_type"), other, "supported: default, linear, yarn")),
    };
    Ok((theta, scaling))
}

fn parse_quantization(m: &Map<String, Value>) -> Result<Option<(usize, usize)>> {
    let Some(q) = get(m, "quantization_config") else { return Ok(None) };
    let q = q.as_object().ok_or_else(|| ConfigError::Type { field: "quantization_config".into(), reason: "expected an object".into() })?;
    let method = str_field(q, "quant_method")?.unwrap_or("");
    if method != "fp8" {
        return Err(unsupported("quantization_config.quant_method", method, "supported: fp8 (e4m3, 128x128 block scales)"));
    }
    if let Some(fmt) = str_field(q, "fmt")? {
        if fmt != "e4m3" {
            return Err(unsupported("quantization_config.fmt", fmt, "supported: e4m3"));
        }
    }
    let bs = get(q, "weight_block_size").ok_or(ConfigError::Missing("quantization_config.weight_block_size"))?;
    let arr = bs.as_array().filter(|a| a.len() == 2).ok_or_else(|| ConfigError::Type { field: "quantization_config.weight_block_size".into(), reason: format!("expected [rows, cols], got {bs}") })?;
    let r = arr[0].as_u64().unwrap_or(0) as usize;
    let c = arr[1].as_u64().unwrap_or(0) as usize;
    if r == 0 || c == 0 {
        return Err(unsupported("quantization_config.weight_block_size", bs, "block sizes must be positive integers"));
    }
    Ok(Some((r, c)))
}
