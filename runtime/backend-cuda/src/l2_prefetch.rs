//! Weights towards L2 beside a recorded step (`Backend::prefetch_weights`). At a few decoding
//! rows a layer is a chain of kernels of which only the weight-streaming ones keep the memory
//! busy: the rope/store, attention, merge, router and routing kernels are short and bound by
//! their latency, and each kernel's own prefetch (`weft_prefetch_l2`, issued as its blocks
//! start) only overlaps the tail of the kernel before it. When the model hints which weights
//! come next, this module adds a kernel node (`l2_prefetch`, kernels/weft.cu) to the graph
//! being recorded, depending on the kernel captured last, with nothing depending on it: it
//! moves those weights into L2 while the chain goes on, and the kernels that read them find
//! them there. Outside a recording (ops run one by one) the hint is ignored.
//!
//! `WEFT_CUDA_L2_PREFETCH_MB` caps the bytes of one hint (the weights in the order given, the
//! last one cut short; 0 = off), `WEFT_CUDA_L2_PREFETCH_BLOCKS` is the prefetch grid (128
//! threads a block), `WEFT_CUDA_L2_PREFETCH_TOKENS` the largest step that takes them (default:
//! any recorded), and `WEFT_CUDA_L2_PERSIST_MB` sets the device's persisting-L2 limit at
//! start-up (for the `WEFT_L2PF_EVICT_LAST` kernel variant; unset: left alone). NVIDIA only
//! (the kernel is a no-op without PTX; HIP keeps the trait's default).

use crate::{CudaBackend, CudaMatrix};
use weft_backend::Result;

/// Most ranges one prefetch node takes (`L2PF_RANGES` in kernels/weft.cu).
pub(crate) const RANGES: usize = 8;

/// `struct L2Ranges` of kernels/weft.cu, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct L2Ranges {
    pub ptr: [u64; RANGES],
    pub bytes: [u64; RANGES],
}

/// The prefetch settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct L2Prefetch {
    /// Bytes one hint may prefetch (0: hints ignored).
    pub bytes: usize,
    /// Blocks of the prefetch kernel.
    pub blocks: u32,
    /// Largest step (tokens) that takes the hints.
    pub max_tokens: usize,
}

impl L2Prefetch {
    pub(crate) fn from_env() -> Self {
        let mb = std::env::var("WEFT_CUDA_L2_PREFETCH_MB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(DEFAULT_MB);
        let blocks = std::env::var("WEFT_CUDA_L2_PREFETCH_BLOCKS").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(32).clamp(1, 1024);
        let max_tokens = std::env::var("WEFT_CUDA_L2_PREFETCH_TOKENS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(usize::MAX);
        L2Prefetch { bytes: mb << 20, blocks, max_tokens }
    }
}

/// Default cap of one hint, MiB.
const DEFAULT_MB: usize = 32;

/// The ranges to prefetch of `weights` (device address and bytes, in the order given): each
/// whole until `cap` bytes in all, the last one cut short; empty weights skipped; at most
/// [`RANGES`].
pub(crate) fn prefetch_ranges(weights: &[(u64, usize)], cap: usize) -> L2Ranges {
    let mut r = L2Ranges::default();
    let (mut n, mut left) = (0, cap);
    for &(ptr, bytes) in weights {
        if n == RANGES || left == 0 {
            break;
        }
        let take = bytes.min(left);
        if take == 0 {
            continue;
        }
        (r.ptr[n], r.bytes[n]) = (ptr, take as u64);
        n += 1;
        left -= take;
    }
    r
}

impl CudaBackend {
    /// `Backend::prefetch_weights`: an `l2_prefetch` node in the graph being recorded, after
    /// the last kernel captured, which nothing waits for; nothing when not recording.
    pub(crate) fn prefetch_into_l2(&self, ws: &[&CudaMatrix]) -> Result<()> {
        if self.l2.bytes == 0 || !self.recording.lock().unwrap().as_ref().is_some_and(|r| r.tokens() <= self.l2.max_tokens) {
            return Ok(());
        }
        use cudarc::driver::DevicePtr;
        let read: Vec<(u64, usize)> = ws
            .iter()
            .map(|w| match (&w.fp8, &w.f32_data) {
                (Some(f), _) => (f.bytes.device_ptr(&self.stream).0, f.bytes.len()),
                (None, Some(f)) if w.data.is_empty() => (f.device_ptr(&self.stream).0, f.len() * 4),
                _ => (w.data.device_ptr(&self.stream).0, w.data.len() * 2),
            })
            .collect();
        let ranges = prefetch_ranges(&read, self.l2.bytes);
        if ranges.bytes[0] == 0 {
            return Ok(());
        }
        if unsafe { self.add_prefetch_node(ranges) }? {
            if let Some(rec) = self.recording.lock().unwrap().as_mut() {
                rec.prefetch_nodes += 1;
            }
        }
        Ok(())
    }

    /// Whether a node was added (the stream was capturing).
    ///
    /// # Safety
    /// `ranges` are device memory that outlives the graph (weights).
    unsafe fn add_prefetch_node(&self, mut ranges: L2Ranges) -> Result<bool> {
        use cudarc::driver::sys;
        use std::ptr::{null, null_mut};
        let named = |r: sys::CUresult, call: &str| r.result().map_err(|e| weft_backend::BackendError::Device(format!("{call}: {e:?}")));
        self.ctx.bind_to_thread().map_err(crate::dev)?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (mut graph, mut deps, mut edges, mut n): (sys::CUgraph, *const sys::CUgraphNode, *const sys::CUgraphEdgeData, usize) = (null_mut(), null(), null(), 0);
        named(sys::cuStreamGetCaptureInfo_v3(self.stream.cu_stream(), &mut status, null_mut(), &mut graph, &mut deps, &mut edges, &mut n), "cuStreamGetCaptureInfo_v3")?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || graph.is_null() {
            return Ok(false);
        }
        // The node copies its parameters when it is added.
        let mut arg = &mut ranges as *mut L2Ranges as *mut std::ffi::c_void;
        let params = sys::CUDA_KERNEL_NODE_PARAMS {
            func: self.func("l2_prefetch").cu_function(),
            gridDimX: self.l2.blocks,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 128,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            kernelParams: &mut arg,
            extra: null_mut(),
            kern: null_mut(),
            ctx: null_mut(),
        };
        let mut node: sys::CUgraphNode = null_mut();
        named(sys::cuGraphAddKernelNode_v2(&mut node, graph, deps, n, &params), "cuGraphAddKernelNode_v2")?;
        Ok(true)
    }
}

/// Sets the device's persisting-L2 limit from `WEFT_CUDA_L2_PERSIST_MB`, at most the device's
/// largest (unset: nothing).
pub(crate) fn set_persisting_limit(ctx: &cudarc::driver::CudaContext) -> Result<()> {
    let Some(mb) = std::env::var("WEFT_CUDA_L2_PERSIST_MB").ok().and_then(|v| v.parse::<usize>().ok()) else {
        return Ok(());
    };
    use cudarc::driver::sys;
    let most = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE).map_err(crate::dev)?.max(0) as usize;
    ctx.bind_to_thread().map_err(crate::dev)?;
    unsafe { sys::cuCtxSetLimit(sys::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE, (mb << 20).min(most)) }.result().map_err(crate::dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_the_hint_up_to_the_cap() {
        let ws = [(0x1000, 100), (0x2000, 0), (0x3000, 300), (0x4000, 500)];
        let r = prefetch_ranges(&ws, 600);
        assert_eq!(&r.ptr[..4], &[0x1000, 0x3000, 0x4000, 0]);
        assert_eq!(&r.bytes[..4], &[100, 300, 200, 0]);
        assert_eq!(prefetch_ranges(&ws, 0), L2Ranges::default());
        let many: Vec<(u64, usize)> = (0..12).map(|i| (i * 64, 16)).collect();
        let r = prefetch_ranges(&many, usize::MAX);
        assert_eq!(r.bytes, [16; RANGES]);
        assert_eq!(r.ptr[RANGES - 1], (RANGES as u64 - 1) * 64);
    }
}
