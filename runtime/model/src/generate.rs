//! Single-sequence reference generation: chunked prefill into a private latent cache, then
//! token-by-token decode with native sampling. `weft generate` and the golden tests use it;
//! the serving engine batches the same graph calls across sequences.

use crate::graph::{DeepseekV3, StepBatch};
use crate::sampling::{self, SamplingParams};
use crate::ModelError;
use weft_backend::{AttnRow, Backend};

pub const PAGE_SIZE: usize = 64;
const PREFILL_CHUNK: usize = 256;

#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    /// Top-K log-probabilities to report for each prompt and generated position.
    pub logprobs: Option<usize>,
    pub stop_ids: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum FinishReason {
    Stop,
    Length,
}

#[derive(Clone, Debug)]
pub struct GenerateOutput {
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    /// `prompt_logprobs[i]` is the distribution that predicted prompt token i (None for i = 0).
    pub prompt_logprobs: Vec<Option<Vec<(u32, f64)>>>,
    pub logprobs: Vec<Vec<(u32, f64)>>,
    pub finish_reason: FinishReason,
}

pub fn generate<B: Backend>(model: &DeepseekV3<B>, req: &GenerateRequest) -> Result<GenerateOutput, ModelError> {
    let n = req.prompt_ids.len();
    let vocab = model.cfg.vocab_size;
    if n == 0 {
        return Err(ModelError::Request("the prompt is empty".into()));
    }
    if let Some(bad) = req.prompt_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::Request(format!("prompt token id {bad} is outside the vocabulary (size {vocab})")));
    }
    let total = n + req.max_tokens;
    if total > model.cfg.max_position_embeddings {
        return Err(ModelError::Request(format!("prompt ({n} tokens) + max_tokens ({}) exceeds the context length {}", req.max_tokens, model.cfg.max_position_embeddings)));
    }
    let pages = total.div_ceil(PAGE_SIZE).max(1);
    let be = &model.backend;
    // On every rank when this model drives tensor-parallel followers.
    let mut pool = model.alloc_kv_pool(pages, PAGE_SIZE)?;
    let table: Vec<u32> = (0..pages as u32).collect();
    let mut out = GenerateOutput { prompt_token_ids: req.prompt_ids.clone(), token_ids: vec![], prompt_logprobs: vec![None], logprobs: vec![], finish_reason: FinishReason::Length };

    // Prefill in chunks; keep logits of every row when prompt logprobs are wanted.
    let mut last_logits = Vec::new();
    for start in (0..n).step_by(PREFILL_CHUNK) {
        let end = (start + PREFILL_CHUNK).min(n);
        let positions: Vec<u32> = (start as u32..end as u32).collect();
        let rows: Vec<AttnRow> = positions.iter().map(|&p| AttnRow { block_table: &table, ctx_len: p as usize + 1 }).collect();
        let batch = StepBatch { tokens: &req.prompt_ids[start..end], positions: &positions, slots: &positions, attn: &rows, exact_rows: &[] };
        let hidden = model.forward_hidden(&mut pool, &batch)?;
        let hidden = if req.logprobs.is_some() || end == n {
            if req.logprobs.is_some() {
                hidden
            } else {
                be.gather_rows(&hidden, model.cfg.hidden_size, &[(end - start - 1) as u32])?
            }
        } else {
            continue;
        };
        let logits = be.download(&model.logits(&hidden)?)?;
        let rows_out = logits.len() / vocab;
        if let Some(k) = req.logprobs {
            for r in 0..rows_out {
                let pos = start + r;
                if pos + 1 < n {
                    out.prompt_logprobs.push(Some(sampling::top_logprobs(&logits[r * vocab..(r + 1) * vocab], k, Some(req.prompt_ids[pos + 1]))));
                }
            }
        }
        if end == n {
            last_logits = logits[(rows_out - 1) * vocab..].to_vec();
        }
    }

    let mut pos = n;
    let mut logits = last_logits;
    while out.token_ids.len() < req.max_tokens {
        let u = sampling::uniform(req.params.seed, pos as u64, 0);
        let tok = sampling::sample(&logits, &req.params, u);
        if let Some(k) = req.logprobs {
            out.logprobs.push(sampling::top_logprobs(&logits, k, Some(tok)));
        }
        out.token_ids.push(tok);
        if req.stop_ids.contains(&tok) {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        if out.token_ids.len() == req.max_tokens {
            break;
        }
        let p = [pos as u32];
        let rows = [AttnRow { block_table: &table, ctx_len: pos + 1 }];
        let batch = StepBatch { tokens: &[tok], positions: &p, slots: &p, attn: &rows, exact_rows: &[] };
        let hidden = model.forward_hidden(&mut pool, &batch)?;
        logits = be.download(&model.logits(&hidden)?)?;
        pos += 1;
    }
    Ok(out)
}
