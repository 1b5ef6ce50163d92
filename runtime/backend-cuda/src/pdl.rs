//! Recorded step graphs with programmatic dependent launch (Hopper and later): owns the
//! instantiated graph ([`StepGraph`]) and the rewrite that lets each weft kernel's blocks start
//! while the kernel before it drains.
//!
//! A captured decode step is a chain of kernels. Every weft kernel begins with
//! `WEFT_PDL_ENTRY()` (kernels/weft_port.h: `griddepcontrol.wait`), so an edge between two
//! kernels may be *programmatic*: the second grid is launched as the first one's blocks exit,
//! takes the SMs they leave, prefetches its static weights, and waits in hardware for the
//! first to finish and flush — instead of being launched after that.
//! [`make_programmatic`] turns every kernel → weft-kernel edge of a recorded graph into one;
//! edges into kernels weft did not write (cuBLAS) stay full dependencies, since those kernels
//! do not wait. Stream capture would put a memory node (an op's output allocated or freed)
//! between almost every pair of kernels, and the driver refuses edge changes in a graph that
//! has one: while recording, ops allocate from a [`RecordingArena`] instead.
//! `WEFT_CUDA_PDL=0` records plain graphs (for comparisons).

use crate::dev;
use cudarc::driver::sys::{self, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphNode, CUgraphNodeType};
use cudarc::driver::CudaStream;
use std::collections::HashSet;
use std::ptr::null_mut;
use std::sync::Arc;
use weft_backend::{BackendError, Result};

/// An instantiated step graph (what `CudaBackend::end_capture` returns on NVIDIA).
pub struct StepGraph {
    graph: CUgraph,
    exec: CUgraphExec,
    stream: Arc<CudaStream>,
    /// Edges made programmatic when it was recorded.
    pub programmatic: usize,
    /// Memory nodes it holds (an allocation the recording arena did not make); edges are
    /// left alone when there is one.
    pub memory_nodes: usize,
}

// The handles are only used through the backend, which serialises its stream's work.
unsafe impl Send for StepGraph {}
unsafe impl Sync for StepGraph {}

impl StepGraph {
    /// Ends the capture on `stream`, rewrites the edges (when `ours` is non-empty: the weft
    /// kernels' function handles) and instantiates the graph with `flags`.
    pub(crate) fn end_capture(stream: &Arc<CudaStream>, ours: &HashSet<usize>, flags: sys::CUgraphInstantiate_flags) -> Result<Option<StepGraph>> {
        stream.context().bind_to_thread().map_err(dev)?;
        let mut graph: CUgraph = null_mut();
        unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) }.named("cuStreamEndCapture")?;
        if graph.is_null() {
            return Ok(None);
        }
        let built = (|| {
            let (programmatic, memory_nodes) = if ours.is_empty() { (0, 0) } else { unsafe { make_programmatic(graph, ours)? } };
            let mut exec: CUgraphExec = null_mut();
            unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags.0 as u64) }.named("cuGraphInstantiateWithFlags")?;
            Ok(StepGraph { graph, exec, stream: stream.clone(), programmatic, memory_nodes })
        })();
        if built.is_err() {
            unsafe { sys::cuGraphDestroy(graph) };
        }
        built.map(Some)
    }

    /// Replays the graph on the stream it was recorded from.
    pub fn launch(&self) -> Result<()> {
        self.stream.context().bind_to_thread().map_err(dev)?;
        unsafe { sys::cuGraphLaunch(self.exec, self.stream.cu_stream()) }.named("cuGraphLaunch")
    }
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}

/// A driver call's result, naming the call when it failed.
trait Named {
    fn named(self, call: &str) -> Result<()>;
}
impl Named for sys::CUresult {
    fn named(self, call: &str) -> Result<()> {
        self.result().map_err(|e| BackendError::Device(format!("{call}: {e:?}")))
    }
}

const DEFAULT_EDGE: CUgraphEdgeData = CUgraphEdgeData { from_port: 0, to_port: 0, type_: 0, reserved: [0; 5] };

fn node_type(n: CUgraphNode) -> Result<CUgraphNodeType> {
    let mut t = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    unsafe { sys::cuGraphNodeGetType(n, &mut t) }.named("cuGraphNodeGetType")?;
    Ok(t)
}

/// The kernel's function handle, or None for a node whose function cannot be read.
fn kernel_function(n: CUgraphNode) -> Option<usize> {
    let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    unsafe { sys::cuGraphKernelNodeGetParams_v2(n, &mut p) }.named("cuGraphKernelNodeGetParams_v2").ok()?;
    (!p.func.is_null()).then_some(p.func as usize)
}

fn edges(g: CUgraph) -> Result<Vec<(CUgraphNode, CUgraphNode, CUgraphEdgeData)>> {
    let mut n = 0usize;
    unsafe { sys::cuGraphGetEdges_v2(g, null_mut(), null_mut(), null_mut(), &mut n) }.named("cuGraphGetEdges_v2")?;
    let (mut from, mut to, mut data) = (vec![null_mut(); n], vec![null_mut(); n], vec![DEFAULT_EDGE; n]);
    unsafe { sys::cuGraphGetEdges_v2(g, from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut n) }.named("cuGraphGetEdges_v2")?;
    Ok((0..n).map(|i| (from[i], to[i], data[i])).collect())
}

fn remove(g: CUgraph, from: CUgraphNode, to: CUgraphNode, data: &CUgraphEdgeData) -> Result<()> {
    unsafe { sys::cuGraphRemoveDependencies_v2(g, &from, &to, data, 1) }.named("cuGraphRemoveDependencies_v2")
}

fn add(g: CUgraph, from: CUgraphNode, to: CUgraphNode, data: &CUgraphEdgeData) -> Result<()> {
    unsafe { sys::cuGraphAddDependencies_v2(g, &from, &to, data, 1) }.named("cuGraphAddDependencies_v2")
}

/// Turns every kernel → weft-kernel edge programmatic; returns how many, and how many memory
/// nodes the graph has: one is enough for it to be left as it is (the driver refuses to
/// remove edges there).
///
/// # Safety
/// `g` is a valid graph not yet instantiated, used by no other thread.
unsafe fn make_programmatic(g: CUgraph, ours: &HashSet<usize>) -> Result<(usize, usize)> {
    use CUgraphNodeType::*;
    let all = edges(g)?;
    let mut kinds = std::collections::HashMap::new();
    for &(f, t, _) in &all {
        for n in [f, t] {
            if let std::collections::hash_map::Entry::Vacant(e) = kinds.entry(n as usize) {
                e.insert(node_type(n)?);
            }
        }
    }
    let memory = kinds.values().filter(|k| **k == CU_GRAPH_NODE_TYPE_MEM_ALLOC || **k == CU_GRAPH_NODE_TYPE_MEM_FREE).count();
    if memory > 0 {
        return Ok((0, memory));
    }
    let kernel = |n: CUgraphNode| kinds.get(&(n as usize)) == Some(&CU_GRAPH_NODE_TYPE_KERNEL);
    let programmatic =
        CUgraphEdgeData { from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8, to_port: 0, type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8, reserved: [0; 5] };
    let mut made = 0;
    for (f, t, d) in all {
        if d.type_ != 0 || !kernel(f) || !kernel(t) || !kernel_function(t).is_some_and(|fun| ours.contains(&fun)) {
            continue;
        }
        remove(g, f, t, &d)?;
        add(g, f, t, &programmatic)?;
        made += 1;
    }
    Ok((made, 0))
}

/// Device memory for the ops of a step while it is recorded: a memory pool of its own and a
/// stream that is never captured, so that allocating and freeing an op's output leaves no
/// memory node in the graph (edges cannot be rewritten in a graph that has one). The graph
/// keeps the addresses it recorded. A buffer freed during the recording goes back to this
/// pool at once and may be handed to a later buffer of the same or of another recording:
/// within one recording, in program order, exactly as the stream-ordered allocator would
/// reuse it; across recordings, only intermediates, which are dead outside their graph's
/// replay, and replays run one after another on the backend's stream.
pub(crate) struct RecordingArena {
    pool: sys::CUmemoryPool,
    stream: Arc<CudaStream>,
}

unsafe impl Send for RecordingArena {}
unsafe impl Sync for RecordingArena {}

impl RecordingArena {
    pub(crate) fn new(ctx: &Arc<cudarc::driver::CudaContext>) -> Result<Self> {
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location = sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ctx.ordinal() as i32 };
        let mut pool: sys::CUmemoryPool = null_mut();
        ctx.bind_to_thread().map_err(dev)?;
        unsafe { sys::cuMemPoolCreate(&mut pool, &props) }.named("cuMemPoolCreate")?;
        let mut max = u64::MAX;
        unsafe { sys::cuMemPoolSetAttribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &mut max as *mut u64 as *mut std::ffi::c_void) }.named("cuMemPoolSetAttribute")?;
        Ok(RecordingArena { pool, stream: ctx.new_stream().map_err(dev)? })
    }

    /// `n` elements (at least one) from the arena; freed to it when the slice drops.
    pub(crate) fn alloc<T: cudarc::driver::DeviceRepr>(&self, n: usize) -> Result<cudarc::driver::CudaSlice<T>> {
        let n = n.max(1);
        let mut ptr: sys::CUdeviceptr = 0;
        self.stream.context().bind_to_thread().map_err(dev)?;
        unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, n * std::mem::size_of::<T>(), self.pool, self.stream.cu_stream()) }.named("cuMemAllocFromPoolAsync")?;
        // SAFETY: `ptr` holds `n` elements of T, allocated on `self.stream`, whose drop frees
        // it there (back to this pool).
        Ok(unsafe { self.stream.upgrade_device_ptr(ptr, n) })
    }
}

impl Drop for RecordingArena {
    fn drop(&mut self) {
        // Outstanding buffers keep the pool alive until they are freed (the driver defers).
        unsafe { sys::cuMemPoolDestroy(self.pool) };
    }
}
