//! Forward steps as CUDA graphs (`Backend::run_step`). A decode step is ~20 small kernels per
//! layer; issuing them one by one costs more host time than the GPU spends running them at
//! small batches. The second time a step shape is seen (tokens in the step, pool, context
//! bucket) the step's ops are recorded into a graph; later steps of that shape write their
//! inputs into the step-input buffers and replay the graph with one launch.
//!
//! What makes a recording valid for another step of the same shape:
//! - Every per-step host array an op takes (token ids, positions, slots, block tables and
//!   their offsets, visible lengths) comes from the step-input buffers while recording
//!   ([`CudaBackend::step_array`]), at fixed addresses, written before each launch. An op that
//!   passes anything else the recording cannot reproduce (an upload-cache miss, a download, a
//!   host routing decision) fails the recording and the step runs op by op.
//! - Launch shapes that depend on values, not only on the token count — the MLA context split —
//!   are taken from the step's context bucket (the next power of two of its longest context),
//!   which is part of the shape; splits past a row's context are empty.
//! - Buffers the graph reads that outlive one step (cached uploads such as RoPE frequencies)
//!   are kept alive by the recording.
//!
//! The step's result is copied out of the graph's output buffer into a buffer the caller owns.
//! `WEFT_CUDA_GRAPHS=0` turns recording off; `WEFT_CUDA_GRAPH_TOKENS` (default 64) is the
//! largest step recorded.

use crate::StepGraph;
use crate::{dev, CudaBackend, CudaKvPool};
use cudarc::driver::{CudaSlice, DevicePtr};
use std::collections::HashMap;
use std::sync::Arc;
use weft_backend::{AttnRow, BackendError, Result, StepBatch};

/// Smallest context bucket (below it, one bucket: the splits are few and short anyway).
const MIN_CTX_BUCKET: usize = 256;
/// Recordings kept; the least recently replayed goes first.
const MAX_GRAPHS: usize = 96;
/// Failed recordings of one shape before it always runs op by op.
const MAX_FAILURES: u32 = 2;

/// The per-step arrays ops take, in `step_array` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepArray {
    Ids = 0,
    Positions = 1,
    Slots = 2,
    /// Block tables of every row, concatenated.
    Tables = 3,
    /// Where each row's table starts in `Tables`.
    Offsets = 4,
    /// Visible context of each row.
    Lens = 5,
}
const ARRAYS: usize = 6;

/// The concatenated block tables, offsets and visible lengths of `rows` (as the attention
/// kernels read them).
pub(crate) fn pack_tables(rows: &[AttnRow<'_>]) -> [Vec<u32>; 3] {
    let (mut bt, mut off, mut ctx) = (Vec::new(), Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
    for r in rows {
        off.push(bt.len() as u32);
        bt.extend_from_slice(r.block_table);
        ctx.push(r.ctx_len as u32);
    }
    [bt, off, ctx]
}

fn host_arrays(step: &StepBatch<'_>) -> [Vec<u32>; ARRAYS] {
    let [bt, off, ctx] = pack_tables(step.attn);
    [step.tokens.to_vec(), step.positions.to_vec(), step.slots.to_vec(), bt, off, ctx]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    pool: u64,
    tokens: usize,
    ctx_bucket: usize,
}

/// A graph being recorded: what ops see instead of their own uploads.
pub(crate) struct Recording {
    pub ctx_bucket: usize,
    host: [Vec<u32>; ARRAYS],
    dev: [Arc<CudaSlice<u32>>; ARRAYS],
    /// Cached uploads and expert pointer tables the recorded ops read.
    pub keep: Vec<Arc<CudaSlice<u32>>>,
    pub keep_tables: Vec<Arc<crate::moe::ExpertTables>>,
}

struct Recorded {
    graph: StepGraph,
    out: CudaSlice<f32>,
    _keep: (Vec<Arc<CudaSlice<u32>>>, Vec<Arc<crate::moe::ExpertTables>>),
    used: u64,
}

/// Replay and recording counts, for benchmarks and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    pub recorded: u64,
    pub replayed: u64,
    /// Recordings that failed (the step ran op by op).
    pub failed: u64,
    pub held: usize,
    /// Programmatic (early-launch) edges in the latest recording (`pdl`; 0 when off or on HIP).
    pub programmatic_edges: usize,
    /// Memory nodes in the latest recording (none when every op allocated from the arena).
    pub memory_nodes: usize,
    /// Why the latest failed recording failed.
    pub last_failure: Option<String>,
}

/// One device buffer per step array and its capacity in elements.
type StepInputs = ([Arc<CudaSlice<u32>>; ARRAYS], [usize; ARRAYS]);

pub(crate) struct StepGraphs {
    enabled: bool,
    max_tokens: usize,
    graphs: HashMap<Shape, Recorded>,
    sightings: HashMap<Shape, u32>,
    failures: HashMap<Shape, u32>,
    /// Step-input buffers; every recording reads these.
    inputs: Option<StepInputs>,
    clock: u64,
    stats: GraphStats,
}

// SAFETY: the CUDA graph handles inside are only touched with the backend's `graphs` mutex
// held (CUDA requires graph objects not to be used from two threads at once; it does not tie
// them to a thread).
unsafe impl Send for StepGraphs {}

impl StepGraphs {
    pub fn from_env() -> Self {
        // Off by default on HIP: recording steps whose buffers are allocated while recording
        // is not verified on ROCm (`WEFT_CUDA_GRAPHS=1` asks for it).
        let enabled = std::env::var("WEFT_CUDA_GRAPHS").map_or(!crate::HIP, |v| v != "0");
        let max_tokens = std::env::var("WEFT_CUDA_GRAPH_TOKENS").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
        StepGraphs { enabled, max_tokens, graphs: HashMap::new(), sightings: HashMap::new(), failures: HashMap::new(), inputs: None, clock: 0, stats: GraphStats::default() }
    }
}

impl CudaBackend {
    /// Turns step recording on or off (benchmarks compare both); off drops every recording.
    pub fn set_step_graphs(&self, on: bool) {
        let mut g = self.graphs.lock().unwrap();
        g.enabled = on;
        if !on {
            g.graphs.clear();
            g.sightings.clear();
        }
    }

    pub fn graph_stats(&self) -> GraphStats {
        let g = self.graphs.lock().unwrap();
        GraphStats { held: g.graphs.len(), ..g.stats.clone() }
    }

    /// The device copy of a per-step array: while a step is being recorded, the step-input
    /// buffer for `which` (after checking `v` is what the step was given); otherwise a cached
    /// upload.
    pub(crate) fn step_array(&self, which: StepArray, v: &[u32]) -> Result<Arc<CudaSlice<u32>>> {
        if let Some(rec) = self.recording.lock().unwrap().as_ref() {
            let i = which as usize;
            if rec.host[i] != v {
                return Err(BackendError::Device(format!("{which:?} given to an op differ from the step's; the step cannot be recorded")));
            }
            return Ok(rec.dev[i].clone());
        }
        self.cached_u32(v)
    }

    /// The attention rows' packed block tables, their offsets and visible lengths
    /// (`pack_tables`) as step arrays on the device.
    pub(crate) fn row_tables(&self, rows: &[AttnRow<'_>]) -> Result<[Arc<CudaSlice<u32>>; 3]> {
        let [bt, off, ctx] = pack_tables(rows);
        Ok([self.step_array(StepArray::Tables, &bt)?, self.step_array(StepArray::Offsets, &off)?, self.step_array(StepArray::Lens, &ctx)?])
    }

    /// The context length the MLA split is sized for: the bucket while recording.
    pub(crate) fn split_context(&self, longest: usize) -> usize {
        self.recording.lock().unwrap().as_ref().map_or(longest, |r| r.ctx_bucket.max(longest))
    }

    pub(crate) fn run_step_graph(&self, pool: &mut CudaKvPool, step: &StepBatch<'_>, out_len: usize, run: &mut dyn FnMut(&mut CudaKvPool) -> Result<CudaSlice<f32>>) -> Result<CudaSlice<f32>> {
        let m = step.tokens.len();
        let mut g = self.graphs.lock().unwrap();
        if !g.enabled || m == 0 || !self.step_all_precise() || m > g.max_tokens || step.attn.len() != m || step.positions.len() != m || step.slots.len() != m {
            drop(g);
            return run(pool);
        }
        let longest = step.attn.iter().map(|r| r.ctx_len).max().unwrap_or(1);
        let shape = Shape { pool: pool.data.device_ptr(&self.stream).0, tokens: m, ctx_bucket: longest.next_power_of_two().max(MIN_CTX_BUCKET) };
        let host = host_arrays(step);
        g.clock += 1;
        let now = g.clock;
        // A recording whose inputs outgrew their buffers is dropped with them (write_inputs).
        if g.graphs.contains_key(&shape) && self.write_inputs(&mut g, &host)? {
            let rec = g.graphs.get_mut(&shape).expect("checked above");
            rec.used = now;
            rec.graph.launch().map_err(dev)?;
            let out = self.stream.clone_dtod(&rec.out).map_err(dev)?;
            g.stats.replayed += 1;
            return Ok(out);
        }
        let seen = g.sightings.entry(shape).or_insert(0);
        *seen += 1;
        if *seen < 2 || g.failures.get(&shape).copied().unwrap_or(0) >= MAX_FAILURES {
            drop(g);
            return run(pool);
        }
        match self.record(&mut g, pool, shape, host, out_len, run) {
            Ok(out) => Ok(out),
            Err(e) => {
                *g.failures.entry(shape).or_insert(0) += 1;
                g.stats.failed += 1;
                tracing::warn!("step of {m} tokens not recorded as a CUDA graph: {e}");
                g.stats.last_failure = Some(e.to_string());
                drop(g);
                run(pool)
            }
        }
    }

    /// Copies a step's arrays into the step-input buffers; `false` (and every recording
    /// dropped) when they do not fit and the buffers had to be replaced.
    fn write_inputs(&self, g: &mut StepGraphs, host: &[Vec<u32>; ARRAYS]) -> Result<bool> {
        let fits = g.inputs.as_ref().is_some_and(|(_, cap)| host.iter().zip(cap).all(|(h, &c)| h.len() <= c));
        if !fits {
            g.graphs.clear();
            let old = g.inputs.take().map_or([0; ARRAYS], |(_, c)| c);
            let mut caps = [0; ARRAYS];
            for i in 0..ARRAYS {
                caps[i] = old[i].max(host[i].len().max(1).next_power_of_two()).max(64);
            }
            let mut bufs = Vec::with_capacity(ARRAYS);
            for &c in &caps {
                bufs.push(Arc::new(self.stream.alloc_zeros::<u32>(c).map_err(dev)?));
            }
            g.inputs = Some((bufs.try_into().map_err(|_| BackendError::Device("step inputs".into()))?, caps));
        }
        let (bufs, _) = g.inputs.as_mut().expect("made above");
        for (b, h) in bufs.iter_mut().zip(host) {
            if h.is_empty() {
                continue;
            }
            let b = Arc::get_mut(b).ok_or_else(|| BackendError::Device("a step-input buffer is still shared after recording".into()))?;
            self.stream.memcpy_htod(h.as_slice(), &mut b.slice_mut(0..h.len())).map_err(dev)?;
        }
        Ok(fits)
    }

    fn record(
        &self,
        g: &mut StepGraphs,
        pool: &mut CudaKvPool,
        shape: Shape,
        host: [Vec<u32>; ARRAYS],
        out_len: usize,
        run: &mut dyn FnMut(&mut CudaKvPool) -> Result<CudaSlice<f32>>,
    ) -> Result<CudaSlice<f32>> {
        self.write_inputs(g, &host)?;
        let dev_inputs = g.inputs.as_ref().expect("written above").0.clone();
        let mut out = unsafe { self.stream.alloc::<f32>(out_len.max(1)) }.map_err(dev)?;
        *self.recording.lock().unwrap() = Some(Recording { ctx_bucket: shape.ctx_bucket, host, dev: dev_inputs, keep: Vec::new(), keep_tables: Vec::new() });
        let recorded = self.begin_capture().and_then(|()| {
            let result = run(pool).and_then(|h| {
                if h.len() != out_len {
                    return Err(BackendError::Device(format!("the step returned {} values, expected {out_len}", h.len())));
                }
                self.stream.memcpy_dtod(&h, &mut out).map_err(dev)
            });
            let graph = self.end_capture();
            result.and(graph)
        });
        let rec = self.recording.lock().unwrap().take();
        let graph = recorded?;
        let keep = rec.map(|r| (r.keep, r.keep_tables)).unwrap_or_default();
        graph.launch().map_err(dev)?;
        let result = self.stream.clone_dtod(&out).map_err(dev)?;
        if g.graphs.len() >= MAX_GRAPHS {
            if let Some(old) = g.graphs.iter().min_by_key(|(_, r)| r.used).map(|(s, _)| *s) {
                g.graphs.remove(&old);
            }
        }
        #[cfg(feature = "cuda")]
        {
            (g.stats.programmatic_edges, g.stats.memory_nodes) = (graph.programmatic, graph.memory_nodes);
        }
        let used = g.clock;
        g.graphs.insert(shape, Recorded { graph, out, _keep: keep, used });
        g.stats.recorded += 1;
        Ok(result)
    }
}
