//! Ranks 1.. of a tensor-parallel group, driven by rank 0: one thread per rank, each owning its
//! shard of the model, its backend and its copy of the latent pool. Rank 0 is the model the
//! engine holds; every forward step it runs is sent to the followers first (the batch, owned)
//! and they run it too, meeting rank 0 at each all-reduce; only rank 0 computes logits and
//! samples. Pools are allocated together ([`Followers::alloc_pools`]) so that the page numbers
//! the engine hands out mean the same on every rank. A failure on any rank aborts the group:
//! every later step fails with that reason, none hangs or pairs mismatched steps.

use crate::graph::StepBatch;
use crate::LoadedModel;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use weft_backend::{AttnRow, Backend};

/// A step batch that owns its arrays (what crosses to a follower thread).
struct OwnedBatch {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<u32>,
    attn: Vec<(Vec<u32>, usize)>,
    exact_rows: Vec<(u32, u32)>,
}

impl OwnedBatch {
    fn of(b: &StepBatch<'_>) -> Self {
        OwnedBatch {
            tokens: b.tokens.to_vec(),
            positions: b.positions.to_vec(),
            slots: b.slots.to_vec(),
            attn: b.attn.iter().map(|r| (r.block_table.to_vec(), r.ctx_len)).collect(),
            exact_rows: b.exact_rows.to_vec(),
        }
    }
}

enum Msg {
    Pool { num_pages: usize, page_size: usize, dtype: weft_backend::KvDtype, reply: Sender<Result<(), String>> },
    Step(OwnedBatch),
}

/// The follower ranks of a group, as rank 0 holds them.
pub struct Followers {
    senders: Vec<Sender<Msg>>,
    threads: Vec<JoinHandle<()>>,
}

impl Followers {
    /// Starts one thread per model in `ranks` (ranks 1.. of the group, in order, each opened
    /// with its shard and its group handle).
    pub fn start<B: Backend>(ranks: Vec<LoadedModel<B>>) -> std::io::Result<Followers> {
        let (mut senders, mut threads) = (vec![], vec![]);
        for (i, lm) in ranks.into_iter().enumerate() {
            let (tx, rx) = channel();
            senders.push(tx);
            threads.push(std::thread::Builder::new().name(format!("weft-tp-rank-{}", i + 1)).spawn(move || follow(lm, rx))?);
        }
        Ok(Followers { senders, threads })
    }

    /// Every follower allocates its latent pool of `num_pages` pages of `page_size` tokens of
    /// `dtype` values.
    pub fn alloc_pools(&self, num_pages: usize, page_size: usize, dtype: weft_backend::KvDtype) -> Result<(), String> {
        let replies: Vec<Receiver<Result<(), String>>> = self
            .senders
            .iter()
            .map(|s| {
                let (reply, rx) = channel();
                s.send(Msg::Pool { num_pages, page_size, dtype, reply }).map(|()| rx).map_err(|_| "a tensor-parallel rank has exited".to_string())
            })
            .collect::<Result<_, _>>()?;
        for (i, r) in replies.into_iter().enumerate() {
            r.recv().map_err(|_| format!("tensor-parallel rank {} exited", i + 1))??;
        }
        Ok(())
    }

    /// Sends a forward step to every follower (they run it while rank 0 does).
    pub(crate) fn step(&self, batch: &StepBatch<'_>) -> Result<(), String> {
        for (i, s) in self.senders.iter().enumerate() {
            s.send(Msg::Step(OwnedBatch::of(batch))).map_err(|_| format!("tensor-parallel rank {} exited", i + 1))?;
        }
        Ok(())
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        // Closing the channels ends each follower's loop once it has finished the steps sent.
        self.senders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A follower's loop: allocate the pool when told, run each step; any failure aborts the group.
fn follow<B: Backend>(lm: LoadedModel<B>, rx: Receiver<Msg>) {
    let m = &lm.model;
    let mut pool: Option<B::KvPool> = None;
    for msg in rx {
        match msg {
            Msg::Pool { num_pages, page_size, dtype, reply } => {
                let r = m.backend.alloc_kv_pool(weft_backend::KvLayout { dtype, ..m.kv_layout(num_pages, page_size) }).map(|p| pool = Some(p)).map_err(|e| e.to_string());
                let _ = reply.send(r);
            }
            Msg::Step(b) => {
                let attn: Vec<AttnRow<'_>> = b.attn.iter().map(|(t, n)| AttnRow { block_table: t, ctx_len: *n }).collect();
                let batch = StepBatch { tokens: &b.tokens, positions: &b.positions, slots: &b.slots, attn: &attn, exact_rows: &b.exact_rows };
                let r = match pool.as_mut() {
                    Some(p) => m.forward_hidden(p, &batch).map(drop).map_err(|e| e.to_string()),
                    None => Err("a step before the pool was allocated".to_string()),
                };
                if let (Err(e), Some(g)) = (r, m.group()) {
                    g.abort(&e);
                }
            }
        }
    }
}
