//! The model's weights in backend memory, loaded tensor by tensor from the published
//! DeepSeek-V3 names, with the host-side re-layouts the graph wants (W_UK/W_UV split out of
//! `kv_b_proj` for absorbed MLA, gate and up projections stacked into one matrix).

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use std::borrow::Cow;
use weft_backend::{Backend, BackendError, ExpertWeights, HostMatrix};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

type Result<T> = std::result::Result<T, LoadError>;

pub enum QueryProj<B: Backend> {
    Direct { q_proj: B::Matrix },
    LoRA { q_a_proj: B::Matrix, q_a_layernorm: B::Buf, q_b_proj: B::Matrix },
}

pub struct AttentionWeights<B: Backend> {
    pub q: QueryProj<B>,
    pub kv_a_proj: B::Matrix,
    pub kv_a_layernorm: B::Buf,
    /// `[heads * kv_lora, nope]`: W_UKᵀ per head, absorbs the query into latent space.
    pub w_uk_t: B::Matrix,
    /// `[heads * v, kv_lora]`: W_UV per head, lifts attended latents to values.
    pub w_uv: B::Matrix,
    pub o_proj: B::Matrix,
}

pub struct MoeWeights<B: Backend> {
    pub router: B::Matrix,
    pub bias: B::Buf,
    pub experts: Vec<ExpertWeights<B::Matrix>>,
    pub shared: Option<ExpertWeights<B::Matrix>>,
}

pub enum FeedForward<B: Backend> {
    Dense(ExpertWeights<B::Matrix>),
    Moe(MoeWeights<B>),
}

pub struct LayerWeights<B: Backend> {
    pub input_layernorm: B::Buf,
    pub post_attention_layernorm: B::Buf,
    pub attn: AttentionWeights<B>,
    pub ffn: FeedForward<B>,
}

/// The multi-token-prediction module (`num_nextn_predict_layers`), kept for speculative
/// decoding.
pub struct MtpWeights<B: Backend> {
    pub enorm: B::Buf,
    pub hnorm: B::Buf,
    pub eh_proj: B::Matrix,
    pub layer: LayerWeights<B>,
    pub norm: B::Buf,
    pub head: Option<B::Matrix>,
}

pub struct ModelWeights<B: Backend> {
    pub embed: B::Matrix,
    pub layers: Vec<LayerWeights<B>>,
    pub norm: B::Buf,
    pub lm_head: B::Matrix,
    pub mtp: Vec<MtpWeights<B>>,
}

struct Loader<'a, B: Backend> {
    ck: &'a Checkpoint,
    be: &'a B,
    cfg: &'a ModelConfig,
}

impl<'a, B: Backend> Loader<'a, B> {
    fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<B::Matrix> {
        Ok(self.be.upload_matrix(&self.ck.matrix(name, rows, cols)?)?)
    }
    fn vec(&self, name: &str, len: usize) -> Result<B::Buf> {
        Ok(self.be.upload(&self.ck.vector(name, len)?)?)
    }

    /// gate_proj and up_proj stacked into `[2*inter, hidden]`, in checkpoint format when the
    /// block grid allows it.
    fn gate_up(&self, prefix: &str, inter: usize) -> Result<ExpertWeights<B::Matrix>> {
        let h = self.cfg.hidden_size;
        let g = self.ck.matrix(&format!("{prefix}.gate_proj.weight"), inter, h)?;
        let u = self.ck.matrix(&format!("{prefix}.up_proj.weight"), inter, h)?;
        let gate_up = self.be.upload_matrix(&stack_rows(&format!("{prefix}.gate_up"), &g, &u)?)?;
        let down = self.mat(&format!("{prefix}.down_proj.weight"), h, inter)?;
        Ok(ExpertWeights { gate_up, down, inter })
    }

    fn layer(&self, i: usize) -> Result<LayerWeights<B>> {
        let c = self.cfg;
        let p = format!("model.layers.{i}");
        let (h, heads) = (c.hidden_size, c.num_attention_heads);
        let qk = c.qk_head_dim();
        let q = match c.q_lora_rank {
            None => QueryProj::Direct { q_proj: self.mat(&format!("{p}.self_attn.q_proj.weight"), heads * qk, h)? },
            Some(r) => QueryProj::LoRA {
                q_a_proj: self.mat(&format!("{p}.self_attn.q_a_proj.weight"), r, h)?,
                q_a_layernorm: self.vec(&format!("{p}.self_attn.q_a_layernorm.weight"), r)?,
                q_b_proj: self.mat(&format!("{p}.self_attn.q_b_proj.weight"), heads * qk, r)?,
            },
        };
        let (lora, nope, v) = (c.kv_lora_rank, c.qk_nope_head_dim, c.v_head_dim);
        let kvb = self.ck.matrix(&format!("{p}.self_attn.kv_b_proj.weight"), heads * (nope + v), lora)?;
        let kvb = kvb.to_f32().map_err(LoadError::Backend)?;
        let mut uk_t = vec![0f32; heads * lora * nope];
        let mut uv = vec![0f32; heads * v * lora];
        for hh in 0..heads {
            let base = hh * (nope + v);
            for n in 0..nope {
                for l in 0..lora {
                    uk_t[(hh * lora + l) * nope + n] = kvb[(base + n) * lora + l];
                }
            }
            for j in 0..v {
                let src = &kvb[(base + nope + j) * lora..(base + nope + j + 1) * lora];
                uv[(hh * v + j) * lora..(hh * v + j + 1) * lora].copy_from_slice(src);
            }
        }
        let attn = AttentionWeights {
            q,
            kv_a_proj: self.mat(&format!("{p}.self_attn.kv_a_proj_with_mqa.weight"), lora + c.qk_rope_head_dim, h)?,
            kv_a_layernorm: self.vec(&format!("{p}.self_attn.kv_a_layernorm.weight"), lora)?,
            w_uk_t: self.be.upload_matrix(&HostMatrix::from_f32(format!("{p}.w_uk_t"), heads * lora, nope, &uk_t))?,
            w_uv: self.be.upload_matrix(&HostMatrix::from_f32(format!("{p}.w_uv"), heads * v, lora, &uv))?,
            o_proj: self.mat(&format!("{p}.self_attn.o_proj.weight"), h, heads * v)?,
        };
        let ffn = if c.is_moe_layer(i) {
            let e = c.n_routed_experts;
            let experts = (0..e).map(|x| self.gate_up(&format!("{p}.mlp.experts.{x}"), c.moe_intermediate_size)).collect::<Result<Vec<_>>>()?;
            let shared = if c.n_shared_experts > 0 { Some(self.gate_up(&format!("{p}.mlp.shared_experts"), c.moe_intermediate_size * c.n_shared_experts)?) } else { None };
            FeedForward::Moe(MoeWeights {
                router: self.mat(&format!("{p}.mlp.gate.weight"), e, h)?,
                bias: self.vec(&format!("{p}.mlp.gate.e_score_correction_bias"), e)?,
                experts,
                shared,
            })
        } else {
            FeedForward::Dense(self.gate_up(&format!("{p}.mlp"), c.intermediate_size)?)
        };
        Ok(LayerWeights {
            input_layernorm: self.vec(&format!("{p}.input_layernorm.weight"), h)?,
            post_attention_layernorm: self.vec(&format!("{p}.post_attention_layernorm.weight"), h)?,
            attn,
            ffn,
        })
    }
}

/// Stacks two matrices of equal width row-wise, keeping the checkpoint format when both share
/// a dtype and (for fp8) the first ends on a block boundary; otherwise in f32.
fn stack_rows(name: &str, a: &HostMatrix<'_>, b: &HostMatrix<'_>) -> Result<HostMatrix<'static>> {
    a.validate()?;
    b.validate()?;
    let same = a.dtype == b.dtype && a.cols == b.cols;
    let blocks_align = match (&a.scales, &b.scales) {
        (Some(sa), Some(sb)) => sa.block_rows == sb.block_rows && sa.block_cols == sb.block_cols && a.rows % sa.block_rows == 0,
        (None, None) => true,
        _ => false,
    };
    if same && blocks_align {
        let mut bytes = Vec::with_capacity(a.bytes.len() + b.bytes.len());
        bytes.extend_from_slice(&a.bytes);
        bytes.extend_from_slice(&b.bytes);
        let scales = match (&a.scales, &b.scales) {
            (Some(sa), Some(sb)) => {
                let mut s = sa.clone();
                s.scales.extend_from_slice(&sb.scales);
                Some(s)
            }
            _ => None,
        };
        return Ok(HostMatrix { name: name.into(), rows: a.rows + b.rows, cols: a.cols, dtype: a.dtype, bytes: Cow::Owned(bytes), scales });
    }
    let mut v = a.to_f32()?;
    v.extend(b.to_f32()?);
    Ok(HostMatrix::from_f32(name, a.rows + b.rows, a.cols, &v))
}

impl<B: Backend> ModelWeights<B> {
    pub fn load(ck: &Checkpoint, cfg: &ModelConfig, be: &B) -> Result<Self> {
        let l = Loader { ck, be, cfg };
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed = l.mat("model.embed_tokens.weight", v, h)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            tracing::debug!(layer = i, "loading layer");
            layers.push(l.layer(i)?);
        }
        let lm_head = if cfg.tie_word_embeddings && !ck.contains("lm_head.weight") {
            l.mat("model.embed_tokens.weight", v, h)?
        } else {
            l.mat("lm_head.weight", v, h)?
        };
        let mut mtp = Vec::new();
        for k in 0..cfg.num_nextn_predict_layers {
            let i = cfg.num_hidden_layers + k;
            let p = format!("model.layers.{i}");
            if !ck.contains(&format!("{p}.eh_proj.weight")) {
                tracing::info!("config declares {} MTP layer(s) but the checkpoint has none; speculative MTP disabled", cfg.num_nextn_predict_layers);
                break;
            }
            let head_name = format!("{p}.shared_head.head.weight");
            mtp.push(MtpWeights {
                enorm: l.vec(&format!("{p}.enorm.weight"), h)?,
                hnorm: l.vec(&format!("{p}.hnorm.weight"), h)?,
                eh_proj: l.mat(&format!("{p}.eh_proj.weight"), h, 2 * h)?,
                layer: l.layer(i)?,
                norm: l.vec(&format!("{p}.shared_head.norm.weight"), h)?,
                head: if ck.contains(&head_name) { Some(l.mat(&head_name, v, h)?) } else { None },
            });
        }
        Ok(ModelWeights { embed, layers, norm: l.vec("model.norm.weight", h)?, lm_head, mtp })
    }
}

/// Whether a checkpoint stores fp8 weights (for logs and tolerance choices).
pub fn has_fp8(ck: &Checkpoint) -> bool {
    ck.tensor_names().any(|n| n.ends_with("_scale_inv"))
}

