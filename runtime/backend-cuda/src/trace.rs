//! The kernel trace (`WEFT_CUDA_KERNEL_DEFINES=WEFT_TRACE`, a measurement variant): every
//! block's thread 0 records, just past its `griddepcontrol.wait`, the hash of its function's
//! name, its block and `%globaltimer` (kernels/weft_port.h). Nsight runs kernels one at a time,
//! which hides what a recorded step with programmatic edges does; this trace reads the replayed
//! step itself. In a chain each grid passes its wait only once the kernel before has finished
//! and flushed, so the first block past it marks where the kernel joined the critical path, and
//! the gap to the next kernel's mark is what the kernel added to the step ([`launches`]).

use crate::{dev, CudaBackend};
use std::collections::{HashMap, HashSet};
use weft_backend::Result;

/// Records the device buffer holds (`WEFT_TRACE_CAP`).
const CAP: usize = 1 << 18;

/// One block past its wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    /// FNV-1a of the function that waited (the kernel, or the helper that waits for it).
    pub hash: u32,
    pub block: u32,
    pub t_ns: u64,
}

/// One grid of a traced step: its blocks' records, consecutive in time.
#[derive(Clone, Debug, PartialEq)]
pub struct TracedLaunch {
    pub name: String,
    pub blocks: usize,
    /// The first block past the wait.
    pub first_ns: u64,
    /// The last block past the wait.
    pub last_ns: u64,
    /// From this grid's first block past the wait to the next grid's (0 for the last grid).
    pub critical_ns: u64,
}

/// FNV-1a, as `weft_trace` hashes `__func__`.
pub fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(2166136261u32, |h, b| (h ^ b as u32).wrapping_mul(16777619))
}

/// The names of every kernel the backend loads and of every function the kernel source
/// defines or calls, by hash (what `__func__` may be: a kernel — also one a macro names —, or
/// the helper template its wait is in).
pub fn names_by_hash(source: &str) -> HashMap<u32, String> {
    let mut out: HashMap<u32, String> = crate::KERNELS.iter().map(|k| (fnv1a(k), k.to_string())).collect();
    let b = source.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_alphabetic() || b[i] == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let mut j = i;
            while j < b.len() && b[j] == b' ' {
                j += 1;
            }
            if j < b.len() && (b[j] == b'(' || b[j] == b'<') {
                let name = &source[start..i];
                out.entry(fnv1a(name)).or_insert_with(|| name.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Groups a step's records into grids: sorted by time, a run of records of one function in
/// which no block comes twice (in a chain a grid's blocks pass the wait only after the grid
/// before has finished, so grids do not interleave; a grid of several waves stays one, and the
/// next launch of the same kernel starts at a block already seen). Time spent in kernels that
/// are not traced (cuBLAS) counts to the traced grid before them.
pub fn launches(mut recs: Vec<TraceRecord>, names: &HashMap<u32, String>) -> Vec<TracedLaunch> {
    recs.sort_by_key(|r| r.t_ns);
    let mut out: Vec<TracedLaunch> = Vec::new();
    let (mut last_hash, mut seen) = (None, HashSet::new());
    for r in recs {
        match out.last_mut() {
            Some(l) if last_hash == Some(r.hash) && seen.insert(r.block) => {
                l.blocks += 1;
                l.last_ns = r.t_ns;
            }
            _ => {
                let name = names.get(&r.hash).cloned().unwrap_or_else(|| format!("{:08x}", r.hash));
                out.push(TracedLaunch { name, blocks: 1, first_ns: r.t_ns, last_ns: r.t_ns, critical_ns: 0 });
                seen = HashSet::from([r.block]);
            }
        }
        last_hash = Some(r.hash);
    }
    for i in 1..out.len() {
        out[i - 1].critical_ns = out[i].first_ns - out[i - 1].first_ns;
    }
    out
}

impl CudaBackend {
    /// Whether the kernels were compiled with `WEFT_TRACE`.
    pub fn trace_on(&self) -> bool {
        self._module.get_global("weft_trace_n", &self.stream).is_ok()
    }

    /// Empties the trace buffer (after the work queued so far).
    pub fn trace_reset(&self) -> Result<()> {
        let mut n = self._module.get_global("weft_trace_n", &self.stream).map_err(dev)?;
        self.stream.memcpy_htod(&[0u8; 8], &mut n).map_err(dev)
    }

    /// The records since [`Self::trace_reset`] (waits for the stream).
    pub fn trace_take(&self) -> Result<Vec<TraceRecord>> {
        let n = self._module.get_global("weft_trace_n", &self.stream).map_err(dev)?;
        let buf = self._module.get_global("weft_trace_buf", &self.stream).map_err(dev)?;
        let mut count = [0u8; 8];
        self.stream.memcpy_dtoh(&n, &mut count).map_err(dev)?;
        let count = (u64::from_le_bytes(count) as usize).min(CAP);
        let mut raw = vec![0u8; 16 * count];
        self.stream.memcpy_dtoh(&buf.slice(..raw.len()), &mut raw).map_err(dev)?;
        let word = |i: usize| u64::from_le_bytes(raw[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        Ok((0..count).map(|i| TraceRecord { hash: (word(2 * i) >> 32) as u32, block: word(2 * i) as u32, t_ns: word(2 * i + 1) }).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_group_into_grids_in_time_order() {
        let names = names_by_hash("extern \"C\" __global__ void rms_norm(const float* x) {}\ntemplate <int R> __device__ void rows_dot<R>(int a) { x = gemv(a); }");
        assert_eq!(names.get(&fnv1a("rms_norm")).map(String::as_str), Some("rms_norm"));
        assert_eq!(names.get(&fnv1a("gemv")).map(String::as_str), Some("gemv"));
        assert_eq!(names.get(&fnv1a("rows_dot")).map(String::as_str), Some("rows_dot"));
        let (a, b) = (fnv1a("rms_norm"), fnv1a("gemv"));
        assert_eq!(names.get(&fnv1a("moe_route_plan")).map(String::as_str), Some("moe_route_plan"));
        let r = |hash, block, t_ns| TraceRecord { hash, block, t_ns };
        // A grid of two blocks, a gemv grid whose second wave comes late, then two launches of
        // the first kernel back to back (block 0 again starts the second).
        let recs = vec![r(a, 1, 1_300), r(a, 0, 1_000), r(b, 0, 5_000), r(b, 1, 5_200), r(b, 2, 8_000), r(a, 0, 9_000), r(a, 1, 9_100), r(a, 0, 20_000)];
        let l = launches(recs, &names);
        let got: Vec<(&str, usize, u64)> = l.iter().map(|l| (l.name.as_str(), l.blocks, l.critical_ns)).collect();
        assert_eq!(got, vec![("rms_norm", 2, 4_000), ("gemv", 3, 4_000), ("rms_norm", 2, 11_000), ("rms_norm", 1, 0)]);
        assert_eq!((l[1].first_ns, l[1].last_ns), (5_000, 8_000));
    }
}
