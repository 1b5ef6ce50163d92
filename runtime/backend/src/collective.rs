//! Collectives for tensor parallelism, as one rank sees its group: the [`Collective`] trait the
//! sharded forward pass calls (after each row-parallel product: attention's `o_proj`, the
//! MLP's and MoE's down projections), and [`LocalGroup`], a group of ranks that are threads of
//! one process, exchanging through host memory. `LocalGroup` is what tests and single-GPU
//! machines run the sharded math with (every rank on the CPU backend, or every rank on the same
//! GPU); a multi-GPU group implements the same trait over NCCL/RCCL.

use crate::{Backend, BackendError, Result};
use std::sync::{Arc, Condvar, Mutex};

/// One rank's view of a tensor-parallel group.
pub trait Collective<B: Backend>: Send + Sync {
    /// This rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// Replaces `x` on every rank by the elementwise sum of every rank's `x` (same length on
    /// every rank; summed in rank order, so every rank gets bit-identical values).
    fn all_reduce_sum(&self, be: &B, x: &mut B::Buf) -> Result<()>;
    /// Whether the collective can be recorded into a step graph with the kernels around it
    /// (NCCL on a stream can; an exchange through host memory cannot, so steps of a model in
    /// such a group run op by op).
    fn recordable(&self) -> bool {
        false
    }
    /// Fails the group: this rank cannot go on (an op failed before its next collective), so
    /// every rank's current and later collectives return an error instead of waiting for it or
    /// pairing mismatched steps.
    fn abort(&self, reason: &str);
    /// Why the group failed, once it has ([`Self::abort`] or a failed collective). A rank
    /// checks it before each step: a recorded step replays its collectives without calling
    /// [`Self::all_reduce_sum`], so only this keeps a failed group from replaying them.
    fn failure(&self) -> Option<String> {
        None
    }
}

/// Which slice of the model a rank holds: rank `rank` of `size`. Attention heads and dense
/// and shared-expert intermediates are split evenly; routed experts too (each expert's
/// intermediate dimension), or — `expert_parallel` — whole experts, `size` even ranges of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub size: usize,
    pub expert_parallel: bool,
}

impl Shard {
    /// The whole model (no parallelism).
    pub const WHOLE: Shard = Shard { rank: 0, size: 1, expert_parallel: false };

    /// Rank `rank` of a tensor-parallel group of `size`, routed experts split as `expert_parallel`
    /// says.
    pub fn of(rank: usize, size: usize, expert_parallel: bool) -> Shard {
        Shard { rank, size, expert_parallel: expert_parallel && size > 1 }
    }

    /// `[start, end)` of this rank's even share of `n` (which the caller has checked divides).
    pub fn range(&self, n: usize) -> std::ops::Range<usize> {
        let per = n / self.size.max(1);
        self.rank * per..(self.rank + 1) * per
    }
}

/// A group of `size` ranks in one process. Each rank takes its handle with [`LocalGroup::rank`]
/// and calls the collectives from its own thread; a call returns once every rank has made it.
pub struct LocalGroup {
    size: usize,
    state: Mutex<Exchange>,
    turn: Condvar,
}

struct Exchange {
    /// Contributions of the current round, by rank.
    parts: Vec<Option<Vec<f32>>>,
    /// The current round's sum, once every rank has contributed.
    sum: Option<Arc<Vec<f32>>>,
    /// Ranks that have taken the current sum.
    taken: usize,
    /// Rounds completed (a rank waits for its round, not a later one).
    round: u64,
    /// A rank gave up (mismatched lengths, a failed download): every rank errors from then on.
    poisoned: Option<String>,
}

impl LocalGroup {
    pub fn new(size: usize) -> Arc<LocalGroup> {
        assert!(size > 0, "a group has at least one rank");
        Arc::new(LocalGroup { size, state: Mutex::new(Exchange { parts: vec![None; size], sum: None, taken: 0, round: 0, poisoned: None }), turn: Condvar::new() })
    }

    /// The handle of rank `rank`.
    pub fn rank(self: &Arc<Self>, rank: usize) -> LocalRank {
        assert!(rank < self.size, "rank {rank} of a group of {}", self.size);
        LocalRank { group: self.clone(), rank }
    }

    fn poison(&self, why: String) -> BackendError {
        let mut st = self.state.lock().unwrap();
        st.poisoned.get_or_insert(why.clone());
        self.turn.notify_all();
        BackendError::Device(format!("all-reduce: {why}"))
    }

    fn sum(&self, rank: usize, mine: Vec<f32>) -> Result<Vec<f32>> {
        let mut st = self.state.lock().unwrap();
        // A rank that comes back before the others took the last sum waits for that round.
        while st.sum.is_some() && st.poisoned.is_none() {
            st = self.turn.wait(st).unwrap();
        }
        if let Some(p) = &st.poisoned {
            return Err(BackendError::Device(format!("all-reduce: {p}")));
        }
        if st.parts[rank].is_some() {
            drop(st);
            return Err(self.poison(format!("rank {rank} joined the same round twice")));
        }
        let round = st.round;
        st.parts[rank] = Some(mine);
        if st.parts.iter().all(Option::is_some) {
            let parts: Vec<Vec<f32>> = st.parts.iter_mut().map(|p| p.take().unwrap()).collect();
            let n = parts[0].len();
            if let Some((r, p)) = parts.iter().enumerate().find(|(_, p)| p.len() != n) {
                drop(st);
                return Err(self.poison(format!("rank {r} contributed {} values, rank 0 {n}", p.len())));
            }
            let mut total = parts[0].clone();
            for p in &parts[1..] {
                for (t, v) in total.iter_mut().zip(p) {
                    *t += v;
                }
            }
            st.sum = Some(Arc::new(total));
            self.turn.notify_all();
        }
        while st.round == round && st.sum.is_none() && st.poisoned.is_none() {
            st = self.turn.wait(st).unwrap();
        }
        if let Some(p) = &st.poisoned {
            return Err(BackendError::Device(format!("all-reduce: {p}")));
        }
        let sum = st.sum.clone().expect("the round's sum");
        st.taken += 1;
        if st.taken == self.size {
            st.sum = None;
            st.taken = 0;
            st.round += 1;
            self.turn.notify_all();
        }
        Ok(sum.as_ref().clone())
    }
}

/// One rank of a [`LocalGroup`].
pub struct LocalRank {
    group: Arc<LocalGroup>,
    rank: usize,
}

impl<B: Backend> Collective<B> for LocalRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.group.size
    }

    fn abort(&self, reason: &str) {
        let _ = self.group.poison(format!("rank {}: {reason}", self.rank));
    }

    fn failure(&self) -> Option<String> {
        self.group.state.lock().unwrap().poisoned.clone()
    }

    fn all_reduce_sum(&self, be: &B, x: &mut B::Buf) -> Result<()> {
        if self.group.size == 1 {
            return Ok(());
        }
        let mine = match be.download(x) {
            Ok(v) => v,
            Err(e) => return Err(self.group.poison(format!("rank {}: {e}", self.rank))),
        };
        let total = self.group.sum(self.rank, mine)?;
        *x = be.upload(&total)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuBackend;

    #[test]
    fn every_rank_gets_the_rank_ordered_sum_round_after_round() {
        let g = LocalGroup::new(4);
        let handles: Vec<_> = (0..4)
            .map(|r| {
                let rank = g.rank(r);
                std::thread::spawn(move || {
                    let be = CpuBackend::new();
                    (0..50)
                        .map(|round| {
                            let mut x = be.upload(&[r as f32 + round as f32, 1.0, 0.1 * r as f32]).unwrap();
                            Collective::<CpuBackend>::all_reduce_sum(&rank, &be, &mut x).unwrap();
                            be.download(&x).unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let results: Vec<Vec<Vec<f32>>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for round in 0..50 {
            let want = [(0..4).map(|r| (r + round) as f32).sum::<f32>(), 4.0, 0.0 + 0.1 + 0.2 + 0.3];
            for r in &results {
                assert_eq!(r[round][0], want[0]);
                assert_eq!(r[round][1], want[1]);
                assert!((r[round][2] - want[2]).abs() < 1e-6);
                assert_eq!(r[round], results[0][round], "ranks see bit-identical sums");
            }
        }
    }

    #[test]
    fn mismatched_lengths_fail_every_rank_instead_of_hanging() {
        let g = LocalGroup::new(2);
        let handles: Vec<_> = (0..2)
            .map(|r| {
                let rank = g.rank(r);
                std::thread::spawn(move || {
                    let be = CpuBackend::new();
                    let mut x = be.upload(&vec![1.0; 3 + r]).unwrap();
                    Collective::<CpuBackend>::all_reduce_sum(&rank, &be, &mut x)
                })
            })
            .collect();
        for h in handles {
            assert!(h.join().unwrap().is_err());
        }
    }

    #[test]
    fn shard_ranges_tile_the_dimension() {
        let parts: Vec<_> = (0..4).map(|rank| Shard::of(rank, 4, false).range(16)).collect();
        assert_eq!(parts, vec![0..4, 4..8, 8..12, 12..16]);
        assert_eq!(Shard::WHOLE.range(7), 0..7);
    }
}
