//! The draft-model drafter: a small model of the same family and vocabulary (e.g.
//! `models/demo-draft` for the demo model) with its own paged latent KV pool. Each step it
//! catches every drafting sequence up on the tokens its cache has not seen (the whole prompt the
//! first time, afterwards the last verify step's accepted tokens), then drafts greedily one
//! token per pass, all sequences batched in each pass. After verification its cache keeps only
//! positions whose tokens were accepted. Drafts are deterministic, so the verifier treats them
//! as certain (draft probability 1), which keeps sampled verification exact.

use crate::kv_pool::{PagePool, PassRows};
use std::collections::HashMap;
use weft_backend::front::FrontRow;
use weft_backend::Backend;
use weft_model::LoadedModel;

struct DraftSeq {
    pages: Vec<u32>,
    /// Positions of the sequence held in the draft cache, all matching the sequence's tokens.
    computed: usize,
}

pub struct DraftModel<B: Backend> {
    lm: LoadedModel<B>,
    kv: B::KvPool,
    pool: PagePool,
    seqs: HashMap<u64, DraftSeq>,
}

/// One sequence that wants drafts this step.
pub struct DraftRequest<'a> {
    pub id: u64,
    pub tokens: &'a [u32],
    pub k: usize,
}

impl<B: Backend> DraftModel<B> {
    /// `num_pages` pages of `page_size` tokens for the draft model's cache.
    pub fn new(lm: LoadedModel<B>, num_pages: usize, page_size: usize) -> Result<Self, String> {
        let kv = lm.model.backend.alloc_kv_pool(lm.model.kv_layout(num_pages, page_size)).map_err(|e| format!("draft model KV pool: {e}"))?;
        Ok(DraftModel { lm, kv, pool: PagePool::new(num_pages, page_size), seqs: HashMap::new() })
    }

    pub fn vocab_size(&self) -> usize {
        self.lm.model.cfg.vocab_size
    }

    /// Pages of the draft model's cache held by sequences (0 when every one was forgotten).
    pub fn pages_held(&self) -> usize {
        self.pool.capacity() - self.pool.free_pages()
    }

    /// Forgets sequence `id` (finished, failed, aborted or preempted), freeing its pages; a
    /// preempted sequence catches up from the start when it drafts again.
    pub fn forget(&mut self, id: u64) {
        if let Some(s) = self.seqs.remove(&id) {
            self.pool.release_all(&s.pages);
        }
    }

    /// After verification: the first `valid` positions of sequence `id` are what it kept.
    pub fn rollback(&mut self, id: u64, valid: usize) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.computed = s.computed.min(valid);
            let keep = s.computed.div_ceil(self.pool.page_size());
            self.pool.release_all(&s.pages[keep..]);
            s.pages.truncate(keep);
        }
    }

    /// Makes sure `id` has pages for `positions` positions; false (nothing held back) when the
    /// pool is short.
    fn reserve(&mut self, id: u64, positions: usize) -> bool {
        let s = self.seqs.entry(id).or_insert(DraftSeq { pages: vec![], computed: 0 });
        self.pool.grow(&mut s.pages, positions)
    }

    /// One forward pass over `feeds` (sequence id, first position, tokens) and the draft
    /// model's best next token after each feed's last token.
    fn pass(&mut self, feeds: &[(u64, usize, Vec<u32>)]) -> Result<Vec<u32>, String> {
        let seqs = &self.seqs;
        let pass = PassRows::new(self.pool.page_size(), feeds.iter().map(|(id, start, toks)| (seqs[id].pages.as_slice(), *start, toks.as_slice())));
        let m = &self.lm.model;
        let hidden = m.forward_hidden(&mut self.kv, &pass.batch()).map_err(|e| e.to_string())?;
        let h = m.backend.gather_rows(&hidden, m.cfg.hidden_size, &pass.last).map_err(|e| e.to_string())?;
        let mut logits = m.logits(&h).map_err(|e| e.to_string())?;
        let rows: Vec<FrontRow> = pass.last.iter().map(|_| FrontRow { k: 1, temperature: 1.0, edits: vec![] }).collect();
        let outs = m.backend.sampling_front(&mut logits, m.cfg.vocab_size, &rows).map_err(|e| e.to_string())?;
        outs.into_iter().map(|o| o.ids.first().copied().ok_or_else(|| "the draft model gave no candidate".to_string())).collect()
    }

    /// Greedy drafts for each request (an empty list where the pool or `budget` — tokens of
    /// catch-up per step — ran short). Errors in the draft model only cost the drafts.
    pub fn draft(&mut self, reqs: &[DraftRequest], budget: usize) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = vec![vec![]; reqs.len()];
        // Pass 1: catch up on unseen tokens, draft the first token.
        let (mut feeds, mut who, mut used) = (vec![], vec![], 0usize);
        for (i, r) in reqs.iter().enumerate() {
            if r.k == 0 || r.tokens.is_empty() {
                continue;
            }
            let computed = self.seqs.get(&r.id).map_or(0, |s| s.computed).min(r.tokens.len() - 1);
            let feed = r.tokens.len() - computed;
            if used + feed > budget || !self.reserve(r.id, r.tokens.len() + r.k - 1) {
                continue;
            }
            used += feed;
            self.seqs.get_mut(&r.id).unwrap().computed = computed;
            feeds.push((r.id, computed, r.tokens[computed..].to_vec()));
            who.push(i);
        }
        let mut step = 1;
        while !feeds.is_empty() {
            let next = match self.pass(&feeds) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "draft model pass failed; no drafts this step");
                    for &i in &who {
                        out[i].clear();
                        self.rollback(reqs[i].id, 0);
                    }
                    return out;
                }
            };
            let (mut more_feeds, mut more_who) = (vec![], vec![]);
            for ((id, start, toks), (&i, t)) in feeds.iter().zip(who.iter().zip(next)) {
                self.seqs.get_mut(id).unwrap().computed = start + toks.len();
                out[i].push(t);
                if step < reqs[i].k {
                    more_feeds.push((*id, start + toks.len(), vec![t]));
                    more_who.push(i);
                }
            }
            feeds = more_feeds;
            who = more_who;
            step += 1;
        }
        out
    }
}
