//! Routed experts for prefill-sized batches (NVIDIA): the active experts' gate|up products as a
//! few batched cuBLAS GEMMs (`cublasGemmBatchedEx` over pointer arrays, one call per
//! power-of-two bucket of experts' token counts, each expert's rows padded to its bucket), SiLU,
//! the down products likewise, and a per-token weighted sum — about a dozen launches per layer
//! where the per-expert path (`ops.rs`, `moe_host_routed`) took about ten per active expert (640
//! for a 1024-token Moonlight prefill). (`cublasGemmGroupedBatchedEx` would need no padding but
//! refuses f32 outputs from bf16 inputs: CUBLAS_STATUS_NOT_SUPPORTED on the H200, CUDA 13.)
//!
//! Activations keep the numerics of every other cuBLAS GEMM here (`gemm_split`): each is two bf16
//! parts, and a pair (token, expert) owns two rows of its expert's operand, so one GEMM per expert
//! takes both parts (kernels `moe_pairs_*` in kernels/moe.cu). Only bf16 expert weights take this
//! path; fp8 ones would first need bf16 copies of every active expert.

use crate::ops::cfg;
use crate::{dev, CudaBackend, CudaMatrix};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasGemmBatchedEx, cublasOperation_t, cublasStatus_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};
use std::ffi::c_void;
use weft_backend::{BackendError, ExpertWeights, Result};

/// A token's empty pair place (its expert is on another rank); `moe_pairs_combine` skips it.
const NO_PAIR: u32 = u32::MAX;

/// Where each pair's rows lie: pairs in expert order; an expert with `c` pairs gets a slot of
/// `2b` rows, `b` the power of two at or above `c` (at least 8): its pairs take rows
/// `row0..row0 + c` (hi parts) and `row0 + b..row0 + b + c` (lo parts); the other rows are
/// padding, computed and never read.
struct PairLayout {
    tok: Vec<u32>,
    hi: Vec<u32>,
    lo: Vec<u32>,
    /// (expert, first row, bucket) per active expert.
    groups: Vec<(usize, usize, usize)>,
    rows: usize,
    /// Per token, its pairs in ascending expert order, and their routing weights; `k` entries
    /// each, the missing ones (experts another rank holds) `NO_PAIR` with weight 0.
    tpair: Vec<u32>,
    tw: Vec<f32>,
}

impl PairLayout {
    /// `exact`: every token must have all `k` pairs here (a rank holding every expert).
    fn new(assigned: &[Vec<(u32, f32)>], m: usize, k: usize, exact: bool) -> Result<Self> {
        let mut l = PairLayout { tok: vec![], hi: vec![], lo: vec![], groups: vec![], rows: 0, tpair: vec![], tw: vec![] };
        let mut per_token: Vec<Vec<(u32, f32)>> = vec![Vec::with_capacity(k); m];
        let mut row = 0usize;
        for (e, toks) in assigned.iter().enumerate() {
            let c = toks.len();
            if c == 0 {
                continue;
            }
            let b = c.next_power_of_two().max(8);
            for (j, &(t, w)) in toks.iter().enumerate() {
                per_token[t as usize].push((l.tok.len() as u32, w));
                l.tok.push(t);
                l.hi.push((row + j) as u32);
                l.lo.push((row + b + j) as u32);
            }
            l.groups.push((e, row, b));
            row += 2 * b;
        }
        l.rows = row;
        for (t, pairs) in per_token.iter().enumerate() {
            if pairs.len() > k || (exact && pairs.len() != k) {
                return Err(BackendError::Device(format!("moe: token {t} routed to {} experts, not {k}", pairs.len())));
            }
            l.tpair.extend(pairs.iter().map(|p| p.0).chain(std::iter::repeat_n(NO_PAIR, k - pairs.len())));
            l.tw.extend(pairs.iter().map(|p| p.1).chain(std::iter::repeat_n(0.0, k - pairs.len())));
        }
        Ok(l)
    }

    fn rows(&self) -> usize {
        self.rows
    }
}

impl CudaBackend {
    /// Whether the grouped path takes these experts: bf16 weights (no fp8, no f32 copies) and
    /// split activations, the numerics every other GEMM of a bf16 model has.
    pub(crate) fn moe_grouped_fits(&self, experts: &[ExpertWeights<CudaMatrix>]) -> bool {
        let bf16 = |w: &CudaMatrix| w.fp8.is_none() && w.f32_data.is_none();
        self.moe_grouped && self.gemm_split && !self.slow_paths && experts.iter().all(|w| bf16(&w.gate_up) && bf16(&w.down))
    }

    /// Routed experts of `m` tokens (`assigned[e]`: expert e's tokens and routing weights, from
    /// the host routing), `k` per token (`all`: every one of them held here); the shared expert
    /// is the caller's.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_grouped(&self, x: &CudaSlice<f32>, assigned: &[Vec<(u32, f32)>], experts: &[ExpertWeights<CudaMatrix>], m: usize, hidden: usize, k: usize, all: bool) -> Result<CudaSlice<f32>> {
        let l = PairLayout::new(assigned, m, k, all)?;
        if l.tok.is_empty() {
            // No token chose an expert of this rank.
            return self.stream.alloc_zeros::<f32>((m * hidden).max(1)).map_err(dev);
        }
        let inter = experts[0].inter;
        if experts.iter().any(|w| w.inter != inter) {
            return Err(BackendError::Shape { op: "moe", reason: "experts of different intermediate sizes".into() });
        }
        let pairs = l.tok.len();
        // Pair indices and routing weights (as their bits): one upload.
        let mut idx = Vec::with_capacity(3 * pairs + 2 * l.tpair.len());
        for v in [&l.tok, &l.hi, &l.lo, &l.tpair] {
            idx.extend_from_slice(v);
        }
        idx.extend(l.tw.iter().map(|w| w.to_bits()));
        let idx = self.up_u32(&idx)?;
        let (tok, rest) = idx.split_at(pairs);
        let (hi, rest) = rest.split_at(pairs);
        let (lo, rest) = rest.split_at(pairs);
        let (tpair, tw) = rest.split_at(l.tpair.len());
        let (d, i32_, k32) = (hidden as u32, inter as u32, k as u32);

        let mut xs = self.alloc::<u16>(l.rows() * hidden)?;
        let gu = self.alloc::<f32>(l.rows() * 2 * inter)?;
        let mut h = self.alloc::<u16>(l.rows() * inter)?;
        let y = self.alloc::<f32>(l.rows() * hidden)?;
        // Both GEMMs' pointer arrays: one upload.
        let mut ptrs = self.gemm_ptrs(&l, experts.iter().map(|w| &w.gate_up).collect(), &xs, &gu, 2 * inter, hidden);
        let first = ptrs.len();
        ptrs.extend(self.gemm_ptrs(&l, experts.iter().map(|w| &w.down).collect(), &h, &y, hidden, inter));
        self.no_capture("a batched GEMM's pointer upload")?;
        let dptrs = self.stream.clone_htod(&ptrs).map_err(dev)?;
        let (pp, _gp) = dptrs.device_ptr(&self.stream);

        let mut b = self.stream.launch_builder(self.func("moe_pairs_split"));
        b.arg(x).arg(&tok).arg(&hi).arg(&lo).arg(&mut xs).arg(&d);
        unsafe { b.launch(cfg(pairs, 0)) }.map_err(dev)?;
        self.grouped_gemm(&l, pp, 2 * inter, hidden)?;
        let mut b = self.stream.launch_builder(self.func("moe_pairs_silu_split"));
        b.arg(&gu).arg(&hi).arg(&lo).arg(&mut h).arg(&i32_);
        unsafe { b.launch(cfg(pairs, 0)) }.map_err(dev)?;
        self.grouped_gemm(&l, pp + 8 * first as u64, hidden, inter)?;
        let mut out = self.out(m * hidden)?;
        let mut b = self.stream.launch_builder(self.func("moe_pairs_combine"));
        b.arg(&y).arg(&hi).arg(&lo).arg(&tpair).arg(&tw).arg(&mut out).arg(&k32).arg(&d);
        unsafe { b.launch(cfg(m, 0)) }.map_err(dev)?;
        Ok(out)
    }

    /// The pointer arrays of `grouped_gemm` for `c = b · Wᵀ` (`n` outputs per row, `kdim`
    /// inputs): [A.. | B.. | C..] per bucket size, buckets ascending.
    fn gemm_ptrs(&self, l: &PairLayout, w: Vec<&CudaMatrix>, b: &CudaSlice<u16>, c: &CudaSlice<f32>, n: usize, kdim: usize) -> Vec<u64> {
        let (pb, _gb) = b.device_ptr(&self.stream);
        let (pc, _gc) = c.device_ptr(&self.stream);
        let mut ptrs = Vec::with_capacity(3 * l.groups.len());
        for bk in buckets(l) {
            let members: Vec<&(usize, usize, usize)> = l.groups.iter().filter(|g| g.2 == bk).collect();
            for &&(e, _, _) in &members {
                let (pa, _ga) = w[e].data.device_ptr(&self.stream);
                ptrs.push(pa);
            }
            ptrs.extend(members.iter().map(|&&(_, row0, _)| pb + (row0 * kdim * 2) as u64));
            ptrs.extend(members.iter().map(|&&(_, row0, _)| pc + (row0 * n * 4) as u64));
        }
        ptrs
    }

    /// `c[slot rows of expert e] = b[slot rows of e] · W_eᵀ` for every active expert: `n` outputs
    /// per row, `kdim` inputs, bf16 × bf16 with f32 accumulation and output; one batched GEMM per
    /// bucket size, its pointers from `gemm_ptrs` on the device at `at`.
    fn grouped_gemm(&self, l: &PairLayout, mut at: u64, n: usize, kdim: usize) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let blas = self.blas.lock().unwrap();
        for bk in buckets(l) {
            let g = l.groups.iter().filter(|x| x.2 == bk).count();
            let status = unsafe {
                cublasGemmBatchedEx(
                    *blas.handle(),
                    cublasOperation_t::CUBLAS_OP_T,
                    cublasOperation_t::CUBLAS_OP_N,
                    n as i32,
                    (2 * bk) as i32,
                    kdim as i32,
                    &alpha as *const f32 as *const c_void,
                    at as *const *const c_void,
                    cudaDataType::CUDA_R_16BF,
                    kdim as i32,
                    (at + 8 * g as u64) as *const *const c_void,
                    cudaDataType::CUDA_R_16BF,
                    kdim as i32,
                    &beta as *const f32 as *const c_void,
                    (at + 16 * g as u64) as *const *mut c_void,
                    cudaDataType::CUDA_R_32F,
                    n as i32,
                    g as i32,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            };
            if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(BackendError::Device(format!("cublasGemmBatchedEx ({g} experts of {bk} rows, {n}x{kdim}): {status:?}")));
            }
            at += 24 * g as u64;
        }
        Ok(())
    }
}

/// The slot sizes in use, ascending (one batched GEMM each).
fn buckets(l: &PairLayout) -> Vec<usize> {
    let mut b: Vec<usize> = l.groups.iter().map(|g| g.2).collect();
    b.sort_unstable();
    b.dedup();
    b
}

#[cfg(test)]
mod tests {
    use super::PairLayout;

    /// Every pair gets two distinct rows inside its expert's slot, slots do not overlap, each
    /// token lists its k pairs in ascending expert order with its routing weights.
    #[test]
    fn pair_rows_lie_in_disjoint_slots() {
        let (m, k, e) = (40usize, 3usize, 7usize);
        let mut assigned: Vec<Vec<(u32, f32)>> = vec![vec![]; e];
        for t in 0..m {
            for q in 0..k {
                let ex = (t * 5 + q * 2 + t / 7) % e;
                let ex = if assigned[ex].iter().any(|p| p.0 == t as u32) { (ex + 1) % e } else { ex };
                assigned[ex].push((t as u32, (t * 10 + ex) as f32));
            }
        }
        let l = PairLayout::new(&assigned, m, k, true).unwrap();
        let mut used = vec![false; l.rows()];
        for &(ex, row0, b) in &l.groups {
            assert!(b >= assigned[ex].len() && b.is_power_of_two() && b >= 8);
            for r in row0..row0 + 2 * b {
                assert!(!used[r], "row {r} in two slots");
                used[r] = true;
            }
        }
        for p in 0..l.tok.len() {
            let (hi, lo) = (l.hi[p] as usize, l.lo[p] as usize);
            let (_, row0, b) = *l.groups.iter().find(|g| (g.1..g.1 + 2 * g.2).contains(&hi)).unwrap();
            assert!(hi < row0 + b && lo == hi + b, "pair {p}: hi {hi} lo {lo} slot {row0}+2x{b}");
        }
        for t in 0..m {
            let pairs = &l.tpair[t * k..(t + 1) * k];
            let experts: Vec<usize> = pairs.iter().map(|&p| l.groups.iter().find(|g| (g.1..g.1 + 2 * g.2).contains(&(l.hi[p as usize] as usize))).unwrap().0).collect();
            assert!(experts.windows(2).all(|w| w[0] < w[1]), "token {t}: experts {experts:?}");
            for (q, &p) in pairs.iter().enumerate() {
                assert_eq!(l.tok[p as usize], t as u32);
                assert_eq!(l.tw[t * k + q], (t * 10 + experts[q]) as f32);
            }
        }
        // A token routed to fewer than k experts is an error, not a wrong sum.
        let mut short = assigned.clone();
        let drop_tok = short[0][0].0;
        short[0].retain(|p| p.0 != drop_tok);
        assert!(PairLayout::new(&short, m, k, true).is_err());
        // On an expert-parallel rank the missing place is padding.
        let l = PairLayout::new(&short, m, k, false).unwrap();
        let t = drop_tok as usize;
        assert_eq!((l.tpair[t * k + k - 1], l.tw[t * k + k - 1]), (super::NO_PAIR, 0.0));
    }
}
