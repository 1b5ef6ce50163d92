//! The DFlash drafter: a block-diffusion draft model (`weft_model::dflash`) drafts a whole
//! block per sequence in one pass, conditioned on outputs of several target layers, which the
//! target captures in every forward pass ([`weft_model::DeepseekV3::set_capture`]).
//!
//! Its cache holds, per draft layer, keys and values of committed positions computed from
//! those target features. Entries are packed — entry index is not position; RoPE carries the
//! position — so positions the target never ran (a prefix-cache hit) are simply absent: an
//! approximation that can cost acceptance, never correctness. After every target step the
//! engine keeps the step's hidden states ([`LastHidden`]); at the next drafting point each
//! speculating sequence's cache catches up on the positions whose tokens are committed (the
//! rows of rejected drafts are skipped). A sequence whose cache reaches its last committed
//! token drafts: the block `[last token, mask × (block_size − 1)]` at the next positions
//! attends to every entry and to itself; the target's lm_head on rows 1..=k gives k greedy
//! drafts. The block's own entries sit past the committed ones and are overwritten by the next
//! catch-up, as the reference crops its cache. Drafts are deterministic, so the verifier treats
//! them as certain, which keeps sampled verification exact.

use crate::kv_pool::PagePool;
use crate::mtp::LastHidden;
use std::collections::HashMap;
use weft_backend::front::FrontRow;
use weft_backend::{AttnRow, Backend};
use weft_model::dflash::DFlashModel;
use weft_model::DeepseekV3;

/// One speculating sequence at a drafting point: catch up, then draft up to `k` tokens (0:
/// catch up only).
pub struct DFlashRequest<'a> {
    pub id: u64,
    pub tokens: &'a [u32],
    pub k: usize,
}

struct Seq {
    pages: Vec<u32>,
    /// Cache entries of committed positions.
    entries: usize,
    /// The next position whose entry the cache expects (all before it are there or skipped).
    next_pos: usize,
}

pub struct DFlashDrafter<B: Backend> {
    model: DFlashModel<B>,
    kv: B::KvPool,
    pool: PagePool,
    seqs: HashMap<u64, Seq>,
}

/// Cache slots of entries `from..from + n` on `pages`.
fn slots_of(pages: &[u32], ps: usize, from: usize, n: usize) -> Vec<u32> {
    (from..from + n).map(|e| pages[e / ps] * ps as u32 + (e % ps) as u32).collect()
}

impl<B: Backend> DFlashDrafter<B> {
    /// The draft's cache: `num_pages` pages of `page_size` entries, every draft layer. The
    /// target must capture the draft's layers (`set_capture(&model.cfg.target_layer_ids)`).
    pub fn new(target: &DeepseekV3<B>, model: DFlashModel<B>, num_pages: usize, page_size: usize) -> Result<Self, String> {
        if target.captured_layers() != model.cfg.target_layer_ids.as_slice() {
            return Err(format!("the target captures layers {:?}; the DFlash draft reads {:?}", target.captured_layers(), model.cfg.target_layer_ids));
        }
        if model.cfg.hidden_size != target.cfg.hidden_size || model.cfg.mask_token_id as usize >= target.cfg.vocab_size {
            return Err("the DFlash draft does not fit the target (hidden size or mask token)".into());
        }
        let kv = target.backend.alloc_kv_pool(model.kv_layout(num_pages, page_size)).map_err(|e| format!("DFlash KV pool ({num_pages} pages): {e}"))?;
        Ok(DFlashDrafter { model, kv, pool: PagePool::new(num_pages, page_size), seqs: HashMap::new() })
    }

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

    /// Catches every request up on `last`, then drafts up to `k` tokens for each request whose
    /// cache reaches its last committed token. Errors cost the drafts and the affected
    /// sequences' caches (rebuilt from their next target rows).
    pub fn draft(&mut self, target: &DeepseekV3<B>, last: Option<&LastHidden<B>>, reqs: &[DFlashRequest]) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = vec![vec![]; reqs.len()];
        let done = self.catch_up(target, last, reqs).and_then(|()| self.run_blocks(target, reqs, &mut out));
        if let Err(e) = done {
            tracing::warn!(error = %e, "DFlash drafting failed; no drafts this step");
            for (i, r) in reqs.iter().enumerate() {
                out[i].clear();
                self.forget(r.id);
            }
        }
        out
    }

    fn catch_up(&mut self, target: &DeepseekV3<B>, last: Option<&LastHidden<B>>, reqs: &[DFlashRequest]) -> Result<(), String> {
        let Some(last) = last else { return Ok(()) };
        let n_feat = self.model.cfg.target_layer_ids.len();
        let (mut rows, mut positions, mut slots): (Vec<Vec<u32>>, Vec<u32>, Vec<u32>) = (vec![vec![]; n_feat], vec![], vec![]);
        let mut grown = vec![];
        let ps = self.pool.page_size();
        for r in reqs {
            let len = r.tokens.len();
            let Some(&(p0, row0, n)) = last.spans.get(&r.id) else { continue };
            let s = self.seqs.entry(r.id).or_insert(Seq { pages: vec![], entries: 0, next_pos: 0 });
            // Positions the target skipped (prefix-cache hits) stay absent.
            let from = s.next_pos.max(p0);
            let to = (p0 + n).min(len.saturating_sub(1));
            if from >= to {
                continue;
            }
            let e0 = s.entries;
            if !self.pool.grow(&mut s.pages, e0 + (to - from)) {
                continue; // pool short: no entries now, the sequence drafts again once it has some
            }
            for (j, rs) in rows.iter_mut().enumerate() {
                rs.extend((from..to).map(|p| ((1 + j) * last.rows + row0 + p - p0) as u32));
            }
            positions.extend((from..to).map(|p| p as u32));
            slots.extend(slots_of(&s.pages, ps, e0, to - from));
            grown.push((r.id, e0 + (to - from), to));
        }
        if positions.is_empty() {
            return Ok(());
        }
        let (be, h) = (&target.backend, target.cfg.hidden_size);
        let feats = rows.iter().map(|rs| be.gather_rows(&last.buf, h, rs)).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
        self.model.store_context(be, &mut self.kv, &feats, &positions, &slots).map_err(|e| e.to_string())?;
        for (id, entries, next_pos) in grown {
            let s = self.seqs.get_mut(&id).unwrap();
            (s.entries, s.next_pos) = (entries, next_pos);
        }
        Ok(())
    }

    fn run_blocks(&mut self, target: &DeepseekV3<B>, reqs: &[DFlashRequest], out: &mut [Vec<u32>]) -> Result<(), String> {
        let bs = self.model.cfg.block_size;
        let mask = self.model.cfg.mask_token_id;
        let mut drafting = vec![]; // (request, drafts)
        for (i, r) in reqs.iter().enumerate() {
            let len = r.tokens.len();
            let Some(s) = self.seqs.get_mut(&r.id) else { continue };
            if r.k == 0 || s.entries == 0 || s.next_pos + 1 != len || !self.pool.grow(&mut s.pages, s.entries + bs) {
                continue;
            }
            drafting.push((i, r.k.min(bs - 1)));
        }
        if drafting.is_empty() {
            return Ok(());
        }
        let (mut tokens, mut positions, mut slots) = (vec![], vec![], vec![]);
        let ps = self.pool.page_size();
        for &(i, _) in &drafting {
            let r = &reqs[i];
            let len = r.tokens.len();
            tokens.push(r.tokens[len - 1]);
            tokens.extend(std::iter::repeat_n(mask, bs - 1));
            positions.extend((len - 1..len - 1 + bs).map(|p| p as u32));
            let s = &self.seqs[&r.id];
            slots.extend(slots_of(&s.pages, ps, s.entries, bs));
        }
        let attn: Vec<AttnRow> = drafting
            .iter()
            .flat_map(|&(i, _)| {
                let s = &self.seqs[&reqs[i].id];
                std::iter::repeat_n(AttnRow { block_table: &s.pages, ctx_len: s.entries + bs }, bs)
            })
            .collect();
        let be = &target.backend;
        let x = be.embed(&target.weights.embed, &tokens).map_err(|e| e.to_string())?;
        let hidden = self.model.block_hidden(be, &mut self.kv, x, &positions, &slots, &attn).map_err(|e| e.to_string())?;
        let rows: Vec<u32> = drafting.iter().enumerate().flat_map(|(b, &(_, k))| (1..=k).map(move |r| (b * bs + r) as u32)).collect();
        let mut logits = target.logits(&be.gather_rows(&hidden, target.cfg.hidden_size, &rows).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        let fronts: Vec<FrontRow> = rows.iter().map(|_| FrontRow { k: 1, temperature: 1.0, edits: vec![] }).collect();
        let picks = be.sampling_front(&mut logits, target.cfg.vocab_size, &fronts).map_err(|e| e.to_string())?;
        let mut picks = picks.into_iter();
        for &(i, k) in &drafting {
            for p in picks.by_ref().take(k) {
                out[i].push(*p.ids.first().ok_or("the target's head gave no candidate for a DFlash row")?);
            }
        }
        Ok(())
    }
}
