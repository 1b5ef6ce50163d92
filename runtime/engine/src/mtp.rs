//! The MTP drafter: the checkpoint's own multi-token-prediction module (DeepSeek-V3's
//! `num_nextn_predict_layers`) drafts from the target's hidden states, with a one-layer paged
//! latent cache of its own.
//!
//! The module's cache entry at position p is computed from the target's final-normed hidden
//! state h_p and the token at p+1; its output there predicts the token at p+2. After every
//! target step the engine keeps that step's hidden states ([`LastHidden`]); at the next
//! drafting point each speculating sequence catches the module up on every position whose
//! next token is now known (prefill chunks included, so nothing has to be recomputed later;
//! positions a prefix-cache hit spared the target get entries from their embeddings alone).
//! The output at the last such position gives the first draft; further drafts feed the
//! module its own output and the draft it just made (one module reused, as vLLM and SGLang do
//! when drafting past the checkpoint's module count). Those chained cache entries are
//! overwritten by the next catch-up. Drafts are greedy and deterministic, so the verifier
//! treats them as certain, which keeps sampled verification exact.

use crate::kv_pool::{PagePool, PassRows};
use std::collections::HashMap;
use weft_backend::front::FrontRow;
use weft_backend::Backend;
use weft_model::DeepseekV3;

/// The target's hidden states from its last forward pass, and where each sequence's rows are.
pub struct LastHidden<B: Backend> {
    /// `[rows, hidden]` final-normed states, then one `[rows, hidden]` block per layer the
    /// target captures (for the DFlash drafter).
    pub buf: B::Buf,
    /// Rows of the pass.
    pub rows: usize,
    /// Sequence id → (first position, first row in `buf`, rows).
    pub spans: HashMap<u64, (usize, usize, usize)>,
}

/// One speculating sequence at a drafting point: catch up, then draft up to `k` tokens (0:
/// catch up only).
pub struct MtpRequest<'a> {
    pub id: u64,
    pub tokens: &'a [u32],
    pub k: usize,
}

struct MtpSeq {
    pages: Vec<u32>,
    /// Positions whose cache entry came from the target's hidden state and the true next token.
    computed: usize,
}

pub struct MtpDrafter<B: Backend> {
    kv: B::KvPool,
    pool: PagePool,
    seqs: HashMap<u64, MtpSeq>,
}

/// A sequence's rows in one pass of the module: `tokens` at positions `start..`.
struct Feed {
    req: usize,
    id: u64,
    start: usize,
    tokens: Vec<u32>,
    /// Whether the pass's last row of this sequence makes a draft.
    drafting: bool,
}

impl<B: Backend> MtpDrafter<B> {
    /// `num_pages` pages of `page_size` tokens for the module's cache (one layer).
    pub fn new(model: &DeepseekV3<B>, num_pages: usize, page_size: usize) -> Result<Self, String> {
        if model.mtp_layers() == 0 {
            return Err(format!(
                "the `mtp` drafter needs a checkpoint with a multi-token-prediction module (config num_nextn_predict_layers > 0 and model.layers.{}.eh_proj.weight); this one has none",
                model.cfg.num_hidden_layers
            ));
        }
        let kv = model.backend.alloc_kv_pool(model.mtp_kv_layout(num_pages, page_size)).map_err(|e| format!("MTP KV pool ({num_pages} pages): {e}"))?;
        Ok(MtpDrafter { kv, pool: PagePool::new(num_pages, page_size), seqs: HashMap::new() })
    }

    /// Pages of the module's cache held by sequences.
    pub fn pages_held(&self) -> usize {
        self.pool.capacity() - self.pool.free_pages()
    }

    /// Forgets sequence `id` (finished, failed, aborted or preempted); a preempted sequence
    /// catches up again from its recomputed prefill.
    pub fn forget(&mut self, id: u64) {
        if let Some(s) = self.seqs.remove(&id) {
            self.pool.release_all(&s.pages);
        }
    }

    /// Makes sure `id` has pages for `positions` positions; false (nothing held back) when the
    /// pool is short.
    fn reserve(&mut self, id: u64, positions: usize) -> bool {
        let s = self.seqs.entry(id).or_insert(MtpSeq { pages: vec![], computed: 0 });
        self.pool.grow(&mut s.pages, positions)
    }

    /// Catches every request up on `last` and drafts greedily: up to `k` tokens for each request
    /// whose module cache reaches its last token, none for the others. Errors cost the drafts
    /// and the affected sequences' caches (refilled from embeddings by `fill_holes` next step).
    pub fn draft(&mut self, model: &DeepseekV3<B>, last: Option<&LastHidden<B>>, reqs: &[MtpRequest]) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = vec![vec![]; reqs.len()];
        self.fill_holes(model, last, reqs);
        let (mut feeds, mut hidden_rows) = (vec![], vec![]);
        for (i, r) in reqs.iter().enumerate() {
            let len = r.tokens.len();
            let (Some(last), true) = (last, len >= 2) else { continue };
            let Some(&(p0, row0, n)) = last.spans.get(&r.id) else { continue };
            let s = self.seqs.entry(r.id).or_insert(MtpSeq { pages: vec![], computed: 0 });
            // Entries at len-1 and beyond are chained drafts of the last round: stale.
            s.computed = s.computed.min(len - 1);
            let (from, to) = (s.computed, (p0 + n).min(len - 1));
            if from < p0 || from >= to {
                continue; // a hole `fill_holes` could not fill, or nothing new
            }
            let drafting = r.k > 0 && to == len - 1;
            if !self.reserve(r.id, if drafting { len + r.k } else { to }) {
                continue;
            }
            hidden_rows.extend((from..to).map(|p| (row0 + p - p0) as u32));
            feeds.push(Feed { req: i, id: r.id, start: from, tokens: r.tokens[from + 1..to + 1].to_vec(), drafting });
        }
        let Some(last) = last.filter(|_| !feeds.is_empty()) else { return out };
        if let Err(e) = self.run(model, reqs, &last.buf, &hidden_rows, feeds, &mut out) {
            tracing::warn!(error = %e, "MTP drafting failed; no drafts this step");
            for (i, r) in reqs.iter().enumerate() {
                out[i].clear();
                self.forget(r.id);
            }
        }
        out
    }

    /// Positions before the last step's rows that the module never saw — the target skipped them
    /// (a prefix-cache hit), so their hidden states never existed — get entries from the token
    /// embedding alone (previous hidden state zero). Such approximate entries can cost draft
    /// quality, never correctness: verification decides what is kept.
    fn fill_holes(&mut self, model: &DeepseekV3<B>, last: Option<&LastHidden<B>>, reqs: &[MtpRequest]) {
        let Some(last) = last else { return };
        let mut holes = vec![];
        for (i, r) in reqs.iter().enumerate() {
            let len = r.tokens.len();
            let Some(&(p0, _, _)) = last.spans.get(&r.id) else { continue };
            let s = self.seqs.entry(r.id).or_insert(MtpSeq { pages: vec![], computed: 0 });
            s.computed = s.computed.min(len.saturating_sub(1));
            let from = s.computed;
            if from < p0 && p0 < len && self.reserve(r.id, p0) {
                holes.push(Feed { req: i, id: r.id, start: from, tokens: r.tokens[from + 1..p0 + 1].to_vec(), drafting: false });
            }
        }
        if holes.is_empty() {
            return;
        }
        let rows: usize = holes.iter().map(|f| f.tokens.len()).sum();
        let done = model.backend.upload(&vec![0.0; rows * model.cfg.hidden_size]).map_err(|e| e.to_string()).and_then(|zero| self.pass(model, &holes, &zero));
        for f in &holes {
            match &done {
                Ok(_) => self.seqs.get_mut(&f.id).unwrap().computed = f.start + f.tokens.len(),
                Err(e) => {
                    tracing::warn!(error = %e, "MTP cache fill failed; no drafts for the sequence until a fill succeeds");
                    self.forget(f.id);
                }
            }
        }
    }

    /// The catch-up pass (previous hidden states: rows `hidden_rows` of the target's), then one
    /// chained pass per further draft (previous hidden states: the module's own outputs).
    fn run(&mut self, model: &DeepseekV3<B>, reqs: &[MtpRequest], hidden: &B::Buf, hidden_rows: &[u32], mut feeds: Vec<Feed>, out: &mut [Vec<u32>]) -> Result<(), String> {
        let (be, h) = (&model.backend, model.cfg.hidden_size);
        let mut prev = be.gather_rows(hidden, h, hidden_rows).map_err(|e| e.to_string())?;
        let mut catch_up = true;
        while !feeds.is_empty() {
            let g = self.pass(model, &feeds, &prev)?;
            if catch_up {
                for f in &feeds {
                    self.seqs.get_mut(&f.id).unwrap().computed = f.start + f.tokens.len();
                }
                catch_up = false;
            }
            // The rows that draft: each drafting sequence's last.
            let (mut ends, mut row) = (vec![], 0u32);
            feeds.retain(|f| {
                row += f.tokens.len() as u32;
                if f.drafting {
                    ends.push(row - 1);
                }
                f.drafting
            });
            if ends.is_empty() {
                break;
            }
            let gl = be.gather_rows(&g, h, &ends).map_err(|e| e.to_string())?;
            let mut logits = model.mtp_logits(0, &gl).map_err(|e| e.to_string())?;
            let rows: Vec<FrontRow> = ends.iter().map(|_| FrontRow { k: 1, temperature: 1.0, edits: vec![] }).collect();
            let picks = be.sampling_front(&mut logits, model.cfg.vocab_size, &rows).map_err(|e| e.to_string())?;
            let mut chained = vec![];
            for (f, p) in feeds.into_iter().zip(picks) {
                let t = *p.ids.first().ok_or("the MTP module gave no candidate")?;
                out[f.req].push(t);
                // Next: the draft just made, at the position after the row that made it, with
                // that row's output as its previous hidden state (row order = `gl`'s).
                chained.push(Feed { start: f.start + f.tokens.len(), tokens: vec![t], drafting: out[f.req].len() < reqs[f.req].k, ..f });
            }
            // Sequences done drafting still hold a row of `gl`: keep them out of the next pass
            // by gathering the rows of those that continue.
            let keep: Vec<u32> = chained.iter().enumerate().filter(|(_, f)| f.drafting).map(|(j, _)| j as u32).collect();
            chained.retain(|f| f.drafting);
            if chained.is_empty() {
                break;
            }
            prev = if keep.len() == ends.len() { gl } else { be.gather_rows(&gl, h, &keep).map_err(|e| e.to_string())? };
            feeds = chained;
        }
        Ok(())
    }

    /// One forward pass of the module over `feeds`, `prev` holding one hidden row per token.
    fn pass(&mut self, model: &DeepseekV3<B>, feeds: &[Feed], prev: &B::Buf) -> Result<B::Buf, String> {
        let seqs = &self.seqs;
        let rows = PassRows::new(self.pool.page_size(), feeds.iter().map(|f| (seqs[&f.id].pages.as_slice(), f.start, f.tokens.as_slice())));
        model.mtp_forward(0, &mut self.kv, &rows.batch(), prev).map_err(|e| e.to_string())
    }
}
