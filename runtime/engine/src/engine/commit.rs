//! The end of a step: sampled (or verified) tokens appended to their sequences — for a verify
//! step the rejected drafts' KV dropped first —, full pages published for prefix reuse, text
//! streamed through the detokenizer and stop matcher, and finished or failed sequences removed
//! with their pages freed.

use super::{Seq, StepLoop};
use crate::detok::StopOutcome;
use crate::kv_pool::chain_hash;
use crate::request::{ErrorKind, Event, FinishReason};
use weft_backend::Backend;
use weft_model::sampling::logsumexp;
use weft_model::LoadedModel;

impl<B: Backend> StepLoop<B> {
    /// Appends sampled tokens, publishes full pages, streams text, finishes what stopped.
    pub(super) fn commit(&mut self, picks: Vec<Pick>) {
        let ps = self.cfg.page_size;
        let max_ctx = self.lm.model.cfg.max_position_embeddings;
        let mut finished: Vec<(u64, Option<FinishReason>, Option<String>)> = vec![];
        for Pick { si, toks, mut lp, drafted } in picks {
            let s = &mut self.running[si];
            let toks = match toks {
                Ok(t) => t,
                Err(e) => {
                    finished.push((s.id, None, Some(e)));
                    continue;
                }
            };
            if drafted > 0 {
                // Keep the KV of the last token and the accepted drafts; drop the rest.
                let accepted = toks.len() - 1;
                s.computed -= drafted - accepted;
                let keep = s.computed.div_ceil(ps);
                self.pool.release_all(&s.pages[keep..]);
                s.pages.truncate(keep);
                if let Some(cfg) = &self.cfg.spec {
                    s.spec.record(cfg, drafted, accepted);
                }
                self.counters.spec_rounds += 1;
                self.counters.spec_drafted += drafted as u64;
                self.counters.spec_accepted += accepted as u64;
            }
            if let Some(dm) = &mut self.draft_model {
                // The draft cache keeps what the target kept (drafts scored but not verified —
                // dropped for budget or pages — are not part of the sequence).
                dm.rollback(s.id, s.computed);
            }
            for tok in toks {
                self.counters.generated_tokens += 1;
                if let Some(reason) = Self::append(&self.lm, &self.eos, max_ctx, s, tok, lp.take()) {
                    finished.push((s.id, Some(reason), None));
                    break;
                }
            }
            // Publish pages whose tokens are all computed (the new token's KV comes next step).
            while (s.page_hashes.len() + 1) * ps <= s.computed.min(s.tokens.len()) {
                let i = s.page_hashes.len();
                let parent = if i == 0 { 0 } else { s.page_hashes[i - 1] };
                let h = chain_hash(parent, &s.tokens[i * ps..(i + 1) * ps]);
                self.pool.publish(s.pages[i], h);
                s.page_hashes.push(h);
            }
        }
        self.finish(finished);
    }

    /// Appends one token to `s` and streams it; the finish reason if `s` stops here.
    fn append(lm: &LoadedModel<B>, eos: &[u32], max_ctx: usize, s: &mut Seq, tok: u32, lp: Option<(Vec<f32>, Vec<(u32, f64)>)>) -> Option<FinishReason> {
        s.tokens.push(tok);
        let is_eos = !s.req.ignore_eos && eos.contains(&tok);
        let stop_tok = s.req.stop_token_ids.contains(&tok);
        let mut reason = None;
        let mut text = String::new();
        if is_eos || stop_tok {
            reason = Some(FinishReason::Stop);
        } else {
            let delta = s.detok.step(&lm.tokenizer, &s.tokens[s.prompt_len..]);
            match s.stop.push(&delta) {
                StopOutcome::Emit(t) => text = t,
                StopOutcome::Stopped(t) => {
                    text = t;
                    reason = Some(FinishReason::Stop);
                }
            }
        }
        if reason.is_none() && (s.generated() >= s.req.max_tokens || s.tokens.len() >= max_ctx) {
            reason = Some(FinishReason::Length);
        }
        let (logprob, top_logprobs) = match lp {
            Some((raw, top)) => (Some(raw[tok as usize] as f64 - logsumexp(&raw)), Some(top)),
            None => (None, None),
        };
        let _ = s.tx.send(Event::Token { id: tok, text, logprob, top_logprobs });
        reason
    }

    /// Removes what stopped (finished or failed) from the running set and frees its pages.
    fn finish(&mut self, finished: Vec<(u64, Option<FinishReason>, Option<String>)>) {
        for (id, reason, err) in finished {
            let Some(i) = self.running.iter().position(|s| s.id == id) else { continue };
            let mut s = self.running.remove(i);
            match (reason, err) {
                (Some(r), _) => {
                    let tail = if r == FinishReason::Length { s.stop.flush() } else { String::new() };
                    self.pool.release_all(&s.pages);
                    self.forget_draft(s.id);
                    self.counters.finished += 1;
                    let _ = s.tx.send(Event::Finished { reason: r, prompt_tokens: s.prompt_len, completion_tokens: s.generated(), cached_tokens: s.cached_tokens, text_tail: tail });
                }
                (None, Some(e)) => self.fail(s, e, ErrorKind::Internal),
                (None, None) => unreachable!(),
            }
        }
    }
}

/// One sequence's sampling outcome this step; `lp` is (raw logits row, top-N) when it asked
/// for log-probabilities.
pub(super) struct Pick {
    pub(super) si: usize,
    /// The tokens to append: one, or after a verify step the accepted drafts and the
    /// correction or bonus token.
    pub(super) toks: Result<Vec<u32>, String>,
    pub(super) lp: Option<(Vec<f32>, Vec<(u32, f64)>)>,
    /// Drafts scored this step (their KV entries past the accepted ones are dropped).
    pub(super) drafted: usize,
}

pub(super) fn set_pick(picks: &mut [Pick], si: usize, v: Result<Vec<u32>, String>) {
    if let Some(p) = picks.iter_mut().find(|p| p.si == si) {
        p.toks = v;
    }
}
