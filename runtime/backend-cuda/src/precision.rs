//! Which rows of the step being run take f32-grade activations (two bf16 parts) and which take
//! one bf16 part.
//!
//! Every product of f32 activations here can carry each value as hi = bf16(x) plus
//! lo = bf16(x − hi) (results ~1e-5 from f32), so that a decode row's result does not depend on
//! the batch shape that picked its kernel: greedy speculative decoding then equals plain greedy
//! decoding. That guarantee is about decode and verification rows. Prompt rows in long runs
//! (prefill chunks of at least `prefill_run_rows` consecutive rows of one sequence) are
//! compute-bound, where the second part doubles the tensor-core work; by default
//! (`WEFT_CUDA_PREFILL_PARTS=1`) they take one part, as every bf16 serving engine computes
//! (~1e-3 relative, the bf16 tolerance the GPU backends are held to).
//! `WEFT_CUDA_PREFILL_PARTS=2` keeps them f32-grade, as does `WEFT_CUDA_F32=1` (f32 weights:
//! the reference-precision mode).
//!
//! `run_step` records the step's rows and its precise row ranges: every row outside a long run
//! plus the step's `exact_rows` (drafts scored in a prompt chunk's pass). The engine keeps
//! drafts from lengthening a chunk to a long run (`Backend::prompt_run_rows`), so a prompt's
//! rows take the same parts with and without speculation. A GEMM over the
//! step's rows in step order multiplies the second part only over those ranges (`lo_ranges`);
//! the grouped expert GEMM multiplies it for flagged tokens' rows (`moe_token_parts`; a tile
//! without one runs one part, and a prompt row's bits do not depend on what shares its tile);
//! attention over a run takes one part for its rows before the run's precise tail
//! (`run_precise_tail`). Outside `run_step` (op tests, tools) and while a step is recorded as a
//! graph, every row takes two parts.

use crate::CudaBackend;
use cudarc::driver::CudaSlice;
use std::sync::{Arc, Mutex};
use weft_backend::{AttnRow, Result, StepBatch};

/// Rows `start..start + len` of a step: one sequence's consecutive positions (same block table,
/// each row seeing one more token than the one before).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub start: usize,
    pub len: usize,
}

/// The step's runs of at least `min` rows.
pub(crate) fn long_runs(rows: &[AttnRow<'_>], min: usize) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=rows.len() {
        let continues = i < rows.len() && {
            let (a, b) = (&rows[i - 1], &rows[i]);
            std::ptr::eq(a.block_table, b.block_table) && b.ctx_len == a.ctx_len + 1
        };
        if !continues {
            if i - start >= min {
                runs.push(Run { start, len: i - start });
            }
            start = i;
        }
    }
    runs
}

/// The current step's rows and precise ranges (no rows outside a step), and the per-token
/// flags uploaded for the expert GEMM (once per step, when asked for).
#[derive(Default)]
pub(crate) struct StepPrecision(Mutex<State>);

#[derive(Default)]
struct State {
    rows: usize,
    ranges: Vec<(usize, usize)>,
    flags: Option<Arc<CudaSlice<u32>>>,
}

/// Resets the step's precision when the step ends, however it ends.
pub(crate) struct StepGuard<'a>(&'a StepPrecision);

impl Drop for StepGuard<'_> {
    fn drop(&mut self) {
        *self.0 .0.lock().unwrap() = State::default();
    }
}

/// How the grouped expert GEMM's tiles pick their activation parts (`moe_gemm.cu`).
pub(crate) enum TokenParts {
    /// Every tile one part.
    One,
    /// Every tile two parts.
    Two,
    /// Two parts for tiles holding a token whose flag (one u32 per token) is set.
    Flags(Arc<CudaSlice<u32>>),
}

/// The row ranges of `step` that take two parts: rows outside runs of at least `min` rows, and
/// `exact_rows` (every row when `min` is 0).
pub(crate) fn precise_ranges(step: &StepBatch<'_>, min: usize) -> Vec<(usize, usize)> {
    let m = step.attn.len();
    let mut precise = vec![true; m];
    if min > 0 {
        for r in long_runs(step.attn, min) {
            precise[r.start..r.start + r.len].fill(false);
        }
        for &(a, b) in step.exact_rows {
            precise[(a as usize).min(m)..(b as usize).min(m)].fill(true);
        }
    }
    let mut ranges: Vec<(usize, usize)> = vec![];
    for (i, &p) in precise.iter().enumerate() {
        match ranges.last_mut() {
            Some(r) if p && r.1 == i => r.1 = i + 1,
            _ if p => ranges.push((i, i + 1)),
            _ => {}
        }
    }
    ranges
}

impl CudaBackend {
    /// The shortest run of prompt rows that takes one bf16 part, or `None` when every row takes
    /// two (two-part prefill, reference precision, or no split weights).
    pub(crate) fn one_part_run_rows(&self) -> Option<usize> {
        (self.gemm_split && self.prefill_parts < 2 && !self.all_f32 && self.prefill_run_rows > 0).then_some(self.prefill_run_rows)
    }

    /// Marks `step` as the step being run until the guard drops.
    pub(crate) fn begin_step_precision(&self, step: &StepBatch<'_>) -> StepGuard<'_> {
        let m = step.attn.len();
        let ranges = match self.one_part_run_rows() {
            Some(min) if m > 0 => precise_ranges(step, min),
            _ => vec![(0, m)],
        };
        *self.step_precision.0.lock().unwrap() = State { rows: m, ranges, flags: None };
        StepGuard(&self.step_precision)
    }

    /// Whether every row of the current step takes two parts (steps that do not are never
    /// recorded as graphs: a recording would fix one rounding for every later step of its shape).
    pub(crate) fn step_all_precise(&self) -> bool {
        let st = self.step_precision.0.lock().unwrap();
        matches!(st.ranges[..], [(0, b)] if b == st.rows) || st.rows == 0
    }

    /// The precise ranges when `m` rows are the current step's rows (not while it is recorded).
    fn step_ranges(&self, m: usize) -> Option<Vec<(usize, usize)>> {
        let st = self.step_precision.0.lock().unwrap();
        (st.rows == m && m > 0 && !self.capturing.load(std::sync::atomic::Ordering::Relaxed)).then(|| st.ranges.clone())
    }

    /// Of a GEMM's `m` activation rows, the ranges that take the second bf16 part: none without
    /// `gemm_split`; the step's precise ranges when the rows are the step's rows; else all.
    pub(crate) fn lo_ranges(&self, m: usize) -> Vec<(usize, usize)> {
        if !self.gemm_split || m == 0 {
            return vec![];
        }
        self.step_ranges(m).unwrap_or_else(|| vec![(0, m)])
    }

    /// How many rows at the end of `run` (rows of the current step) take two parts in
    /// attention; the rest take one. The whole run outside a step, and where its precise rows
    /// are not a tail.
    #[cfg_attr(not(any(feature = "cuda", feature = "hip-mock")), allow(dead_code))]
    pub(crate) fn run_precise_tail(&self, rows: usize, run: Run) -> usize {
        let Some(ranges) = self.step_ranges(rows) else { return run.len };
        let end = run.start + run.len;
        let inside: Vec<(usize, usize)> = ranges.iter().map(|&(a, b)| (a.max(run.start), b.min(end))).filter(|(a, b)| a < b).collect();
        match inside[..] {
            [] => 0,
            [(a, b)] if b == end => end - a,
            _ => run.len,
        }
    }

    /// The expert GEMM's parts for `m` tokens (the step's rows, or all two-part).
    pub(crate) fn moe_token_parts(&self, m: usize) -> Result<TokenParts> {
        if !self.gemm_split {
            return Ok(TokenParts::One);
        }
        let Some(ranges) = self.step_ranges(m) else { return Ok(TokenParts::Two) };
        match ranges[..] {
            [] => return Ok(TokenParts::One),
            [(0, b)] if b == m => return Ok(TokenParts::Two),
            _ => {}
        }
        if let Some(f) = self.step_precision.0.lock().unwrap().flags.clone() {
            return Ok(TokenParts::Flags(f));
        }
        let mut flags = vec![0u32; m];
        for (a, b) in ranges {
            flags[a..b].fill(1);
        }
        let f = Arc::new(self.up_u32(&flags)?);
        self.step_precision.0.lock().unwrap().flags = Some(f.clone());
        Ok(TokenParts::Flags(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_are_consecutive_rows_of_one_table() {
        let (a, b) = (vec![0u32, 1, 2], vec![3u32, 4]);
        let mut rows: Vec<AttnRow<'_>> = vec![AttnRow { block_table: &a, ctx_len: 9 }, AttnRow { block_table: &b, ctx_len: 4 }];
        rows.extend((0..5).map(|i| AttnRow { block_table: &a, ctx_len: 10 + i }));
        rows.push(AttnRow { block_table: &a, ctx_len: 14 }); // not one more: a new run
        rows.extend((0..3).map(|i| AttnRow { block_table: &b, ctx_len: 5 + i }));
        assert_eq!(long_runs(&rows, 3), vec![Run { start: 2, len: 5 }, Run { start: 8, len: 3 }]);
        assert_eq!(long_runs(&rows, 4), vec![Run { start: 2, len: 5 }]);
        assert!(long_runs(&rows[..2], 1).len() == 2);
    }

    /// `n` consecutive rows of the sequence with block table `t`, the first seeing `from` tokens.
    fn run(t: &[u32], from: usize, n: usize) -> impl Iterator<Item = AttnRow<'_>> {
        (0..n).map(move |i| AttnRow { block_table: t, ctx_len: from + i })
    }

    fn ranges(rows: &[AttnRow<'_>], exact: &[(u32, u32)], min: usize) -> Vec<(usize, usize)> {
        precise_ranges(&StepBatch { tokens: &[], positions: &[], slots: &[], attn: rows, exact_rows: exact }, min)
    }

    #[test]
    fn precise_ranges_are_the_rows_outside_long_runs_and_the_exact_rows() {
        let (a, b, c) = (vec![0u32], vec![1u32], vec![2u32]);
        // Two decode rows, then a 5-row prompt run.
        let rows: Vec<AttnRow<'_>> = run(&a, 9, 1).chain(run(&b, 4, 1)).chain(run(&c, 1, 5)).collect();
        assert_eq!(ranges(&rows, &[], 4), vec![(0, 2)]);
        assert_eq!(ranges(&rows, &[], 6), vec![(0, 7)], "a run shorter than the minimum is precise");
        assert_eq!(ranges(&rows, &[], 0), vec![(0, 7)], "0: every row precise");
        assert_eq!(ranges(&rows[2..], &[], 4), vec![], "a prompt run alone");
        // The run's last two rows are drafts.
        assert_eq!(ranges(&rows, &[(5, 7)], 4), vec![(0, 2), (5, 7)]);
        assert_eq!(ranges(&rows, &[(2, 3), (6, 9)], 4), vec![(0, 3), (6, 7)], "ranges past the rows are cut");
        // A decode row after the run.
        let rows: Vec<AttnRow<'_>> = run(&c, 1, 5).chain(run(&a, 9, 1)).collect();
        assert_eq!(ranges(&rows, &[], 4), vec![(5, 6)]);
        // Two runs back to back after a decode row.
        let rows: Vec<AttnRow<'_>> = run(&a, 9, 1).chain(run(&b, 1, 4)).chain(run(&c, 1, 4)).collect();
        assert_eq!(ranges(&rows, &[], 4), vec![(0, 1)]);
    }
}
