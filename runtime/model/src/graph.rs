//! The DeepSeek-V3 forward pass over a [`Backend`]: embedding, per layer RMSNorm → MLA
//! (absorbed, over the paged latent cache) → RMSNorm → dense MLP or MoE, final norm, lm_head.
//! One call runs a batch of tokens from any number of sequences (prefill chunks and decode
//! tokens mixed); which cache slots and context each token sees is the caller's business. The
//! checkpoint's multi-token-prediction modules run here too (`mtp_forward`, `mtp_logits`).

use crate::config::ModelConfig;
use crate::weights::{FeedForward, LayerWeights, ModelWeights, QueryProj};
use std::sync::Arc;
pub use weft_backend::StepBatch;
use weft_backend::{Backend, Collective, KvDtype, KvLayout, Result, RopeParams, RouterConfig};

/// A loaded model bound to its backend.
pub struct DeepseekV3<B: Backend> {
    pub cfg: ModelConfig,
    pub weights: ModelWeights<B>,
    pub backend: B,
    rope: RopeParams,
    router: RouterConfig,
    scale: f32,
    /// Decoder layers whose outputs [`Self::forward_hidden`] also returns (a DFlash drafter's
    /// context features), in order.
    capture: Vec<usize>,
    /// The tensor-parallel group this model is one rank of (weights from
    /// `ModelWeights::load_shard`); None for the whole model.
    group: Option<Arc<dyn Collective<B>>>,
    /// On rank 0 of a group run from one process: the other ranks, which run every step too.
    followers: Option<crate::tp::Followers>,
    /// Element type of the latent cache this model's pools hold (`--kv-cache-dtype`).
    kv_dtype: KvDtype,
}

impl<B: Backend> DeepseekV3<B> {
    pub fn new(cfg: ModelConfig, weights: ModelWeights<B>, backend: B) -> Self {
        let (inv_freq, attention_factor) = cfg.rope_inv_freq();
        let rope = RopeParams { inv_freq, attention_factor, interleaved: cfg.rope_interleave };
        let router = RouterConfig {
            n_experts: cfg.n_routed_experts,
            top_k: cfg.num_experts_per_tok,
            n_group: cfg.n_group,
            topk_group: cfg.topk_group,
            norm_topk_prob: cfg.norm_topk_prob,
            routed_scaling_factor: cfg.routed_scaling_factor as f32,
        };
        let scale = cfg.softmax_scale() as f32;
        DeepseekV3 { cfg, weights, backend, rope, router, scale, capture: vec![], group: None, followers: None, kv_dtype: KvDtype::F32 }
    }

    /// Makes this model rank `group.rank()` of a tensor-parallel group: its weights must be
    /// that rank's shard (`ModelWeights::load_shard` with the same rank and size). Attention
    /// output and every MLP/MoE output are then summed over the group.
    pub fn set_group(&mut self, group: Arc<dyn Collective<B>>) {
        self.group = Some(group);
    }

    /// The group this model is a rank of.
    pub fn group(&self) -> Option<&Arc<dyn Collective<B>>> {
        self.group.as_ref()
    }

    /// Makes this model (rank 0 of its group) drive `followers`, the group's other ranks:
    /// each forward step is sent to them before it runs here.
    pub fn set_followers(&mut self, followers: crate::tp::Followers) {
        self.followers = Some(followers);
    }

    /// The latent pool for `num_pages` pages of `page_size` tokens — on every rank of a group
    /// this model drives, so that page numbers mean the same everywhere.
    pub fn alloc_kv_pool(&self, num_pages: usize, page_size: usize) -> Result<B::KvPool> {
        if let Some(f) = &self.followers {
            f.alloc_pools(num_pages, page_size, self.kv_dtype).map_err(|e| weft_backend::BackendError::Device(format!("tensor-parallel ranks: {e}")))?;
        }
        self.backend.alloc_kv_pool(self.kv_layout(num_pages, page_size))
    }

    /// Attention heads this rank computes.
    fn local_heads(&self) -> usize {
        self.cfg.num_attention_heads / self.group.as_ref().map_or(1, |g| g.size())
    }

    /// `x` summed over the group (a row-parallel product's partial sums); as is without one.
    fn reduce(&self, mut x: B::Buf) -> Result<B::Buf> {
        if let Some(g) = &self.group {
            g.all_reduce_sum(&self.backend, &mut x)?;
        }
        Ok(x)
    }

    /// The latent pool layout for `num_pages` pages of `page_size` tokens.
    pub fn kv_layout(&self, num_pages: usize, page_size: usize) -> KvLayout {
        KvLayout { layers: self.cfg.num_hidden_layers, num_pages, page_size, latent_dim: self.cfg.kv_lora_rank, rope_dim: self.cfg.qk_rope_head_dim, dtype: self.kv_dtype }
    }

    /// Stores the latent cache of pools allocated from now on as `dtype` (f32 by default).
    pub fn set_kv_dtype(&mut self, dtype: KvDtype) {
        self.kv_dtype = dtype;
    }

    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// Makes [`Self::forward_hidden`] also return the outputs of decoder `layers` — what
    /// transformers calls `hidden_states[layer + 1]`: the residual stream after the layer,
    /// final-normed for the last layer. Errors on a layer the model does not have.
    pub fn set_capture(&mut self, layers: &[usize]) -> std::result::Result<(), String> {
        if let Some(&bad) = layers.iter().find(|&&l| l >= self.cfg.num_hidden_layers) {
            return Err(format!("layer {bad} of a {}-layer model", self.cfg.num_hidden_layers));
        }
        self.capture = layers.to_vec();
        Ok(())
    }

    /// The layers [`Self::forward_hidden`] captures.
    pub fn captured_layers(&self) -> &[usize] {
        &self.capture
    }

    /// Runs the decoder over `batch`, writing every token's latent into `pool`, and returns
    /// the final-normed hidden states `[tokens, hidden]`, followed by one `[tokens, hidden]`
    /// block per captured layer ([`Self::set_capture`]). The backend may replay a recorded
    /// step of the same shape instead of issuing each op ([`Backend::run_step`]).
    pub fn forward_hidden(&self, pool: &mut B::KvPool, batch: &StepBatch<'_>) -> Result<B::Buf> {
        let out_len = batch.tokens.len() * self.cfg.hidden_size * (1 + self.capture.len());
        let Some(g) = self.group.as_ref() else {
            return self.backend.run_step(pool, batch, out_len, &mut |pool| self.forward_ops(pool, batch));
        };
        if let Some(why) = g.failure() {
            return Err(weft_backend::BackendError::Device(format!("tensor-parallel group failed: {why}")));
        }
        if let Some(f) = &self.followers {
            if let Err(e) = f.step(batch) {
                g.abort(&e);
                return Err(weft_backend::BackendError::Device(e));
            }
        }
        // A collective through host memory cannot be recorded: such steps run op by op.
        let out = if g.recordable() { self.backend.run_step(pool, batch, out_len, &mut |pool| self.forward_ops(pool, batch)) } else { self.forward_ops(pool, batch) };
        if let (Err(e), Some(_)) = (&out, &self.followers) {
            // The followers would wait for this rank at the next all-reduce: fail them.
            g.abort(&e.to_string());
        }
        out
    }

    /// The step's ops, one by one.
    fn forward_ops(&self, pool: &mut B::KvPool, batch: &StepBatch<'_>) -> Result<B::Buf> {
        let be = &self.backend;
        let c = &self.cfg;
        let eps = c.rms_norm_eps as f32;
        let h = c.hidden_size;
        let mut residual = be.embed(&self.weights.embed, batch.tokens)?;
        let mut delta: Option<B::Buf> = None;
        // The next norm's output, where the layer before made it (an MoE block that added its
        // output into the residual stream and normed it in one op).
        let mut normed: Option<B::Buf> = None;
        let last = self.weights.layers.len().saturating_sub(1);
        let mut captured: Vec<(usize, B::Buf)> = vec![];
        for (i, lw) in self.weights.layers.iter().enumerate() {
            let x = match (normed.take(), &delta) {
                (Some(x), _) => x,
                (None, None) => be.rms_norm(&residual, h, &lw.input_layernorm, eps)?,
                (None, Some(d)) => be.add_rms_norm(&mut residual, d, h, &lw.input_layernorm, eps)?,
            };
            let o = self.attention(i, lw, &x, pool, batch)?;
            let x = self.attention_out(lw, &o, &mut residual)?;
            let capture = i != last && self.capture.contains(&i);
            let next_norm = if i == last { &self.weights.norm } else { &self.weights.layers[i + 1].input_layernorm };
            if let (FeedForward::Moe(m), None, false) = (&lw.ffn, &self.group, capture) {
                let after = (&mut residual, h, next_norm, eps);
                normed = Some(be.moe_block_routed_add_norm(&x, &m.router, &m.bias, &self.router, (&m.experts, m.first_expert), &m.shared, after)?);
                delta = None;
                continue;
            }
            let d = self.feed_forward(lw, &x)?;
            if capture {
                // The layer's output materialised (the next norm then has no delta to add).
                be.add_inplace(&mut residual, &d)?;
                captured.push((i, be.concat(&[&residual])?));
                delta = None;
            } else {
                delta = Some(d);
            }
        }
        let out = match (normed, &delta) {
            (Some(x), _) => x,
            (None, Some(d)) => be.add_rms_norm(&mut residual, d, h, &self.weights.norm, eps)?,
            (None, None) => be.rms_norm(&residual, h, &self.weights.norm, eps)?,
        };
        if self.capture.is_empty() {
            return Ok(out);
        }
        let parts: Vec<&B::Buf> = std::iter::once(&out).chain(self.capture.iter().map(|l| captured.iter().find(|c| c.0 == *l).map_or(&out, |c| &c.1))).collect();
        be.concat(&parts)
    }

    /// `[rows, vocab]` logits of final-normed hidden states.
    pub fn logits(&self, hidden: &B::Buf) -> Result<B::Buf> {
        self.backend.linear(hidden, &self.weights.lm_head)
    }

    /// Multi-token-prediction modules in the checkpoint (0 when it ships none).
    pub fn mtp_layers(&self) -> usize {
        self.weights.mtp.len()
    }

    /// The latent pool layout of one MTP module's own cache (its single attention layer).
    pub fn mtp_kv_layout(&self, num_pages: usize, page_size: usize) -> KvLayout {
        KvLayout { layers: 1, ..self.kv_layout(num_pages, page_size) }
    }

    /// MTP module `k` over `batch`: the token at row i is the one at `positions[i] + 1` in its
    /// sequence and `prev` row i the hidden state that predicted it (the model's final-normed
    /// output, or this module's own output when drafting further ahead). Writes the module's
    /// latents into `pool` (an [`Self::mtp_kv_layout`] pool) and returns its output hidden
    /// states (before `shared_head.norm`), which predict the token after `tokens[i]`.
    pub fn mtp_forward(&self, k: usize, pool: &mut B::KvPool, batch: &StepBatch<'_>, prev: &B::Buf) -> Result<B::Buf> {
        let be = &self.backend;
        let (h, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps as f32);
        let w = self.mtp_module(k)?;
        if self.followers.is_some() {
            // The follower ranks run forward steps only: an all-reduce here would wait forever.
            return Err(weft_backend::BackendError::Shape { op: "mtp", reason: "the MTP drafter does not run under tensor parallelism yet".into() });
        }
        let e = be.rms_norm(&be.embed(&self.weights.embed, batch.tokens)?, h, &w.enorm, eps)?;
        let hn = be.rms_norm(prev, h, &w.hnorm, eps)?;
        // eh_proj · concat(e, hn), as the sum of its two column halves' products.
        let mut residual = be.linear(&e, &w.eh_embed)?;
        be.add_inplace(&mut residual, &be.linear(&hn, &w.eh_hidden)?)?;
        let x = be.rms_norm(&residual, h, &w.layer.input_layernorm, eps)?;
        let o = self.attention(0, &w.layer, &x, pool, batch)?;
        let x = self.attention_out(&w.layer, &o, &mut residual)?;
        let d = self.feed_forward(&w.layer, &x)?;
        be.add_inplace(&mut residual, &d)?;
        Ok(residual)
    }

    /// `[rows, vocab]` logits of MTP module `k`'s output hidden states (`shared_head`: its norm,
    /// then its own head or the model's lm_head).
    pub fn mtp_logits(&self, k: usize, g: &B::Buf) -> Result<B::Buf> {
        let w = self.mtp_module(k)?;
        let n = self.backend.rms_norm(g, self.cfg.hidden_size, &w.norm, self.cfg.rms_norm_eps as f32)?;
        self.backend.linear(&n, w.head.as_ref().unwrap_or(&self.weights.lm_head))
    }

    fn mtp_module(&self, k: usize) -> Result<&crate::weights::MtpWeights<B>> {
        self.weights.mtp.get(k).ok_or_else(|| weft_backend::BackendError::Shape { op: "mtp", reason: format!("MTP module {k} of {} in the checkpoint", self.weights.mtp.len()) })
    }

    /// Layer `layer`'s MLA attention over the normed `x`: the heads' output, before `o_proj`
    /// (`attention_out` takes it on).
    fn attention(&self, layer: usize, lw: &LayerWeights<B>, x: &B::Buf, pool: &mut B::KvPool, batch: &StepBatch<'_>) -> Result<B::Buf> {
        let be = &self.backend;
        let c = &self.cfg;
        let a = &lw.attn;
        let eps = c.rms_norm_eps as f32;
        let heads = self.local_heads();
        // The query's first projection and the latent one read the same x: one pass.
        let (q, kv_a) = match &a.q {
            QueryProj::Direct { q_proj } => be.linear_pair(x, q_proj, &a.kv_a_proj)?,
            QueryProj::LoRA { q_a_proj, q_a_layernorm, q_b_proj } => {
                let (qa, kv_a) = be.linear_pair(x, q_a_proj, &a.kv_a_proj)?;
                let qa = be.rms_norm(&qa, c.q_lora_rank.unwrap_or(0), q_a_layernorm, eps)?;
                (be.linear(&qa, q_b_proj)?, kv_a)
            }
        };
        let dims = (heads, c.qk_nope_head_dim, c.qk_rope_head_dim);
        be.mla_attention_projected(&q, dims, pool, layer, &kv_a, &a.kv_a_layernorm, eps, batch.positions, batch.slots, &self.rope, (&a.w_uk_t, &a.w_uv), batch.attn, self.scale)
    }

    /// The attention heads' output `o` through `o_proj` (summed over the tensor-parallel
    /// group), added into the residual stream; the layer's post-attention norm of it. Without a
    /// group one backend op (`linear_add_rms_norm`), which may add the projection's pieces in
    /// the norm.
    fn attention_out(&self, lw: &LayerWeights<B>, o: &B::Buf, residual: &mut B::Buf) -> Result<B::Buf> {
        let (be, norm) = (&self.backend, &lw.post_attention_layernorm);
        let (h, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps as f32);
        if self.group.is_some() {
            let attn = self.reduce(be.linear(o, &lw.attn.o_proj)?)?;
            return be.add_rms_norm(residual, &attn, h, norm, eps);
        }
        be.linear_add_rms_norm(o, &lw.attn.o_proj, residual, h, norm, eps)
    }

    fn feed_forward(&self, lw: &LayerWeights<B>, x: &B::Buf) -> Result<B::Buf> {
        let be = &self.backend;
        let mlp = |w: &weft_backend::ExpertWeights<B::Matrix>| -> Result<B::Buf> {
            let hid = be.gated_up(x, &w.gate_up, w.inter)?;
            be.linear(&hid, &w.down)
        };
        let out = match &lw.ffn {
            FeedForward::Dense(w) => mlp(w)?,
            FeedForward::Moe(m) => be.moe_block_routed(x, &m.router, &m.bias, &self.router, &m.experts, m.first_expert, &m.shared)?,
        };
        self.reduce(out)
    }
}
