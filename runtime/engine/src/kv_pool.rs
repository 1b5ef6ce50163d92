//! The paged latent KV pool's bookkeeping (the memory itself belongs to the backend): fixed
//! pages, reference counts, prefix reuse by hashing full pages chained on their parent, and LRU
//! eviction of cached pages nobody references. Pages are freed on finish, abort and
//! preemption; `free_pages() == capacity()` when idle is the leak check the tests use.

use std::collections::{BTreeMap, HashMap};
use weft_backend::AttnRow;
use weft_model::StepBatch;

#[derive(Clone, Copy, Debug, Default)]
struct PageMeta {
    refs: u32,
    /// Chained hash of the tokens this page holds, when it is full and published.
    hash: Option<u64>,
    /// LRU stamp while cached and unreferenced.
    stamp: u64,
}

pub struct PagePool {
    page_size: usize,
    meta: Vec<PageMeta>,
    free: Vec<u32>,
    /// Cached pages with no references, oldest first: stamp → page.
    lru: BTreeMap<u64, u32>,
    by_hash: HashMap<u64, u32>,
    clock: u64,
    pub prefix_hit_tokens: u64,
    pub prefix_query_tokens: u64,
}

/// FNV-1a over the parent hash and the page's tokens.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = 0xcbf29ce484222325u64 ^ parent.rotate_left(17);
    for &t in tokens {
        for b in t.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// The rows of one forward pass over new tokens of several sequences in a paged cache (the
/// drafters' own caches build their passes with it): tokens, positions, cache slots, attention
/// rows (each sees its sequence up to and including itself) and each feed's last row.
pub struct PassRows<'a> {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub slots: Vec<u32>,
    pub attn: Vec<AttnRow<'a>>,
    pub last: Vec<u32>,
}

impl<'a> PassRows<'a> {
    /// `feeds`: (the sequence's pages, its first new position, the new tokens) each.
    pub fn new(page_size: usize, feeds: impl IntoIterator<Item = (&'a [u32], usize, &'a [u32])>) -> Self {
        let mut r = PassRows { tokens: vec![], positions: vec![], slots: vec![], attn: vec![], last: vec![] };
        for (pages, start, tokens) in feeds {
            for (j, &t) in tokens.iter().enumerate() {
                let p = start + j;
                r.tokens.push(t);
                r.positions.push(p as u32);
                r.slots.push(pages[p / page_size] * page_size as u32 + (p % page_size) as u32);
                r.attn.push(AttnRow { block_table: pages, ctx_len: p + 1 });
            }
            r.last.push(r.tokens.len() as u32 - 1);
        }
        r
    }

    pub fn batch(&self) -> StepBatch<'_> {
        StepBatch { tokens: &self.tokens, positions: &self.positions, slots: &self.slots, attn: &self.attn, exact_rows: &[] }
    }
}

impl PagePool {
    pub fn new(num_pages: usize, page_size: usize) -> Self {
        PagePool {
            page_size,
            meta: vec![PageMeta::default(); num_pages],
            free: (0..num_pages as u32).rev().collect(),
            lru: BTreeMap::new(),
            by_hash: HashMap::new(),
            clock: 0,
            prefix_hit_tokens: 0,
            prefix_query_tokens: 0,
        }
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }
    pub fn capacity(&self) -> usize {
        self.meta.len()
    }
    /// Pages available to new work: never-used or released, plus evictable cached pages.
    pub fn free_pages(&self) -> usize {
        self.free.len() + self.lru.len()
    }
    pub fn cached_pages(&self) -> usize {
        self.by_hash.len()
    }

    /// A page for exclusive use (refcount 1), evicting the least recently used cached page
    /// when nothing is free.
    pub fn alloc(&mut self) -> Option<u32> {
        let p = match self.free.pop() {
            Some(p) => p,
            None => {
                let (&stamp, &p) = self.lru.iter().next()?;
                self.lru.remove(&stamp);
                if let Some(h) = self.meta[p as usize].hash.take() {
                    self.by_hash.remove(&h);
                }
                p
            }
        };
        self.meta[p as usize] = PageMeta { refs: 1, hash: None, stamp: 0 };
        Some(p)
    }

    fn retain(&mut self, p: u32) {
        let m = &mut self.meta[p as usize];
        if m.refs == 0 {
            self.lru.remove(&m.stamp);
        }
        m.refs += 1;
    }

    /// Drops one reference; an unreferenced page stays cached (if published) or is freed.
    /// Grows `pages` to cover `positions` token positions; all or nothing (false, `pages`
    /// unchanged, when the pool runs short).
    pub fn grow(&mut self, pages: &mut Vec<u32>, positions: usize) -> bool {
        let need = positions.div_ceil(self.page_size).saturating_sub(pages.len());
        let mut got = Vec::with_capacity(need);
        while got.len() < need {
            match self.alloc() {
                Some(p) => got.push(p),
                None => {
                    self.release_all(&got);
                    return false;
                }
            }
        }
        pages.extend(got);
        true
    }

    pub fn release(&mut self, p: u32) {
        let m = &mut self.meta[p as usize];
        assert!(m.refs > 0, "page {p} released more often than retained");
        m.refs -= 1;
        if m.refs == 0 {
            if m.hash.is_some() {
                self.clock += 1;
                m.stamp = self.clock;
                self.lru.insert(self.clock, p);
            } else {
                self.free.push(p);
            }
        }
    }

    pub fn release_all(&mut self, pages: &[u32]) {
        for &p in pages {
            self.release(p);
        }
    }

    /// Publishes a full page under its chained hash so later requests can reuse it.
    pub fn publish(&mut self, p: u32, hash: u64) {
        if self.by_hash.contains_key(&hash) || self.meta[p as usize].hash.is_some() {
            return;
        }
        self.meta[p as usize].hash = Some(hash);
        self.by_hash.insert(hash, p);
    }

    /// The longest run of cached full pages matching `tokens` from the start, retained for the
    /// caller, with the chained hashes of those pages. At most `max_pages` pages.
    pub fn lookup_prefix(&mut self, tokens: &[u32], max_pages: usize) -> (Vec<u32>, Vec<u64>) {
        let mut pages = vec![];
        let mut hashes = vec![];
        let mut parent = 0u64;
        for chunk in tokens.chunks_exact(self.page_size).take(max_pages) {
            let h = chain_hash(parent, chunk);
            match self.by_hash.get(&h).copied() {
                Some(p) => {
                    self.retain(p);
                    pages.push(p);
                    hashes.push(h);
                    parent = h;
                }
                None => break,
            }
        }
        self.prefix_query_tokens += tokens.len() as u64;
        self.prefix_hit_tokens += (pages.len() * self.page_size) as u64;
        (pages, hashes)
    }

    pub fn refs(&self, p: u32) -> u32 {
        self.meta[p as usize].refs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_release_and_capacity() {
        let mut pool = PagePool::new(4, 2);
        let a: Vec<u32> = (0..4).map(|_| pool.alloc().unwrap()).collect();
        assert!(pool.alloc().is_none());
        assert_eq!(pool.free_pages(), 0);
        pool.release_all(&a);
        assert_eq!(pool.free_pages(), 4);
    }

    #[test]
    fn prefix_reuse_shares_pages_and_evicts_lru() {
        let mut pool = PagePool::new(3, 2);
        let toks = [1, 2, 3, 4, 5];
        let p0 = pool.alloc().unwrap();
        let p1 = pool.alloc().unwrap();
        let h0 = chain_hash(0, &toks[0..2]);
        let h1 = chain_hash(h0, &toks[2..4]);
        pool.publish(p0, h0);
        pool.publish(p1, h1);
        // A second sequence with the same first 4 tokens shares both pages.
        let (pages, _) = pool.lookup_prefix(&[1, 2, 3, 4, 9], 8);
        assert_eq!(pages, vec![p0, p1]);
        assert_eq!(pool.refs(p0), 2);
        // Different second page: only the first is shared.
        pool.release_all(&pages);
        let (pages, _) = pool.lookup_prefix(&[1, 2, 7, 7], 8);
        assert_eq!(pages, vec![p0]);
        pool.release_all(&pages);
        // Owner finishes: the pages stay cached but count as free (evictable).
        pool.release_all(&[p0, p1]);
        assert_eq!(pool.free_pages(), 3);
        assert_eq!(pool.cached_pages(), 2);
        // Allocating everything evicts cached pages, least recently released first.
        let _x = pool.alloc().unwrap();
        let _y = pool.alloc().unwrap();
        assert_eq!(pool.cached_pages(), 1, "p0 (released first) was evicted");
        let (pages, _) = pool.lookup_prefix(&[1, 2, 3, 4], 8);
        assert!(pages.is_empty(), "the chain starts with the evicted page");
    }

    /// `grow` covers the positions asked for and takes nothing when the pool cannot.
    #[test]
    fn grow_is_all_or_nothing() {
        let mut pool = PagePool::new(4, 16);
        let mut pages = vec![];
        assert!(pool.grow(&mut pages, 17));
        assert_eq!(pages.len(), 2);
        assert!(pool.grow(&mut pages, 32), "already covered");
        assert_eq!(pages.len(), 2);
        assert!(!pool.grow(&mut pages, 16 * 5), "needs 3 more, 2 free");
        assert_eq!((pages.len(), pool.free_pages()), (2, 2));
        assert!(pool.grow(&mut pages, 64));
        assert_eq!((pages.len(), pool.free_pages()), (4, 0));
    }
}
