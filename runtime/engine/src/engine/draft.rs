//! The start of a step: drafts for every speculating sequence — prompt lookup and the oracle
//! here, the draft model, the MTP module and the DFlash draft through their own caches (the
//! last two also catch up on the last step's hidden states for sequences that do not draft).

use super::StepLoop;
use crate::dflash::DFlashRequest;
use crate::draft_model::DraftRequest;
use crate::mtp::MtpRequest;
use crate::spec;
use weft_backend::Backend;

impl<B: Backend> StepLoop<B> {
    /// Drafts for every speculating sequence that can reach the end of its input this step — a
    /// decode, or the last chunk of a prefill (fewer where the request is about to end: a draft
    /// past `max_tokens` or the context could never be kept).
    pub(super) fn draft(&mut self) {
        let Some(cfg) = self.cfg.spec.clone() else { return };
        let max_ctx = self.lm.model.cfg.max_position_embeddings;
        let prompt_rows = self.lm.model.backend.prompt_run_rows();
        let decoding = self.running.iter().filter(|s| s.tokens.len() - s.computed == 1).count();
        let too_busy = cfg.max_batch > 0 && decoding > cfg.max_batch;
        let mut wanted: Vec<(usize, usize)> = vec![]; // (running index, k) for the draft model or MTP
                                                      // Drafters fed by the target's hidden states catch up on every step, drafting or not.
        let mtp = matches!(cfg.drafter, spec::DrafterKind::Mtp | spec::DrafterKind::DFlash);
        for (i, s) in self.running.iter_mut().enumerate() {
            s.spec.drafts.clear();
            if too_busy || !s.speculates || s.tokens.len() - s.computed > self.cfg.token_budget {
                if mtp && s.speculates {
                    wanted.push((i, 0)); // the MTP cache still catches up on the last step
                }
                continue;
            }
            let room = (s.req.max_tokens.saturating_sub(s.generated() + 1)).min(max_ctx.saturating_sub(s.tokens.len() + 1));
            // The input and its drafts stay under the backend's prompt-precision runs: a prompt
            // chunk of that size computes as it would without drafts (none), a shorter one
            // stays short.
            let input = s.tokens.len() - s.computed;
            let k = s.spec.draft_len(&cfg).min(room).min(prompt_rows.map_or(usize::MAX, |r| r.saturating_sub(input + 1)));
            s.spec.drafts = match cfg.drafter {
                spec::DrafterKind::Ngram { min_n, max_n } => spec::ngram_draft(&s.tokens, min_n, max_n, k),
                spec::DrafterKind::Oracle { .. } => vec![*s.tokens.last().unwrap_or(&0); k],
                spec::DrafterKind::Model => {
                    if k > 0 {
                        wanted.push((i, k));
                    }
                    vec![]
                }
                spec::DrafterKind::Mtp | spec::DrafterKind::DFlash => {
                    wanted.push((i, k));
                    vec![]
                }
            };
        }
        if let Some(m) = &mut self.mtp {
            let reqs: Vec<MtpRequest> = wanted.iter().map(|&(i, k)| MtpRequest { id: self.running[i].id, tokens: &self.running[i].tokens, k }).collect();
            let drafts = m.draft(&self.lm.model, self.last_hidden.as_ref(), &reqs);
            for (&(i, _), d) in wanted.iter().zip(drafts) {
                self.running[i].spec.drafts = d;
            }
            return;
        }
        if let Some(d) = &mut self.dflash {
            let reqs: Vec<DFlashRequest> = wanted.iter().map(|&(i, k)| DFlashRequest { id: self.running[i].id, tokens: &self.running[i].tokens, k }).collect();
            let drafts = d.draft(&self.lm.model, self.last_hidden.as_ref(), &reqs);
            for (&(i, _), d) in wanted.iter().zip(drafts) {
                self.running[i].spec.drafts = d;
            }
            return;
        }
        if let Some(dm) = &mut self.draft_model {
            let reqs: Vec<DraftRequest> = wanted.iter().map(|&(i, k)| DraftRequest { id: self.running[i].id, tokens: &self.running[i].tokens, k }).collect();
            let drafts = dm.draft(&reqs, self.cfg.token_budget);
            for (&(i, _), d) in wanted.iter().zip(drafts) {
                self.running[i].spec.drafts = d;
            }
        }
    }
}
