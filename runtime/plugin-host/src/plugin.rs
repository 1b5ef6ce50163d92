//! One loaded plugin version: its compiled component, a pool of instances (one Store each,
//! used by one call at a time), typed calls with per-call deadlines, fault classification and
//! counters. A faulted instance is discarded; the next call gets a fresh one.

use crate::bindings::{self, admission, sampler, verifier};
use crate::engine::{GuestState, PluginEngine};
use crate::{Fault, PluginKind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use wasmtime::Store;

pub(crate) enum Pre {
    Sampler(sampler::SamplerPluginPre<GuestState>),
    Verifier(verifier::VerifierPluginPre<GuestState>),
    Admission(admission::AdmissionPluginPre<GuestState>),
}

pub(crate) enum Bound {
    Sampler(sampler::SamplerPlugin),
    Verifier(verifier::VerifierPlugin),
    Admission(admission::AdmissionPlugin),
}

struct Instance {
    store: Store<GuestState>,
    bound: Bound,
}

/// Counters of one plugin version (exported to /metrics by the server).
#[derive(Default, Debug)]
pub struct PluginStats {
    pub calls: AtomicU64,
    pub call_nanos: AtomicU64,
    pub traps: AtomicU64,
    pub deadlines: AtomicU64,
    pub memory_faults: AtomicU64,
    pub invalid_answers: AtomicU64,
    pub fallbacks: AtomicU64,
    pub reloads: AtomicU64,
}

impl PluginStats {
    pub fn faults(&self) -> u64 {
        self.traps.load(Ordering::Relaxed) + self.deadlines.load(Ordering::Relaxed) + self.memory_faults.load(Ordering::Relaxed) + self.invalid_answers.load(Ordering::Relaxed)
    }
    pub(crate) fn count(&self, f: &Fault) {
        let c = match f {
            Fault::Trap(_) => &self.traps,
            Fault::Deadline => &self.deadlines,
            Fault::Memory => &self.memory_faults,
            Fault::Invalid(_) => &self.invalid_answers,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Identity of a loaded plugin version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginId {
    pub kind: PluginKind,
    pub name: String,
    pub version: String,
    pub sha256: String,
}

impl std::fmt::Display for PluginId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} plugin `{}@{}`", self.kind, self.name, self.version)
    }
}

pub struct LoadedPlugin {
    pub id: PluginId,
    engine: Arc<PluginEngine>,
    pre: Pre,
    pool: Mutex<Vec<Instance>>,
    /// Operator options passed to an admission plugin's `configure` on every new instance.
    pub(crate) options: String,
    pub stats: PluginStats,
}

fn classify(e: wasmtime::Error) -> Fault {
    if let Some(t) = e.downcast_ref::<wasmtime::Trap>() {
        if *t == wasmtime::Trap::Interrupt {
            return Fault::Deadline;
        }
    }
    let msg = format!("{e:#}");
    if msg.contains("growing memory") || msg.contains("memory minimum size") {
        return Fault::Memory;
    }
    Fault::Trap(msg.lines().next().unwrap_or("trap").to_string())
}

impl LoadedPlugin {
    pub(crate) fn new(id: PluginId, engine: Arc<PluginEngine>, pre: Pre, options: String) -> Self {
        LoadedPlugin { id, engine, pre, pool: Mutex::new(Vec::new()), options, stats: PluginStats::default() }
    }

    fn instantiate(&self) -> Result<Instance, Fault> {
        let mut store = self.engine.new_store();
        let bound = match &self.pre {
            Pre::Sampler(p) => Bound::Sampler(p.instantiate(&mut store).map_err(classify)?),
            Pre::Verifier(p) => Bound::Verifier(p.instantiate(&mut store).map_err(classify)?),
            Pre::Admission(p) => {
                let b = p.instantiate(&mut store).map_err(classify)?;
                store.set_epoch_deadline(self.engine.deadline_ticks());
                match b.weft_plugin_admission().call_configure(&mut store, &self.options).map_err(classify)? {
                    Ok(()) => Bound::Admission(b),
                    Err(msg) => return Err(Fault::Invalid(format!("configure rejected its options: {msg}"))),
                }
            }
        };
        Ok(Instance { store, bound })
    }

    /// Runs `f` on a pooled instance with a fresh deadline. A faulted instance is dropped.
    pub(crate) fn call<R>(&self, f: impl FnOnce(&mut Store<GuestState>, &Bound) -> wasmtime::Result<R>) -> Result<R, Fault> {
        let pooled = self.pool.lock().unwrap().pop();
        let mut inst = match pooled {
            Some(i) => i,
            None => self.instantiate().inspect_err(|f| self.stats.count(f))?,
        };
        inst.store.set_epoch_deadline(self.engine.deadline_ticks());
        let t0 = Instant::now();
        let r = f(&mut inst.store, &inst.bound);
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        self.stats.call_nanos.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match r {
            Ok(v) => {
                self.pool.lock().unwrap().push(inst);
                Ok(v)
            }
            Err(e) => {
                let f = classify(e);
                self.stats.count(&f);
                tracing::warn!(plugin = %self.id, fault = %f, "plugin fault; instance discarded");
                Err(f)
            }
        }
    }

    /// Drops pooled instances (memory) without unloading the version.
    pub fn release_instances(&self) {
        self.pool.lock().unwrap().clear();
    }

    pub fn describe(&self) -> Result<bindings::PluginInfo, Fault> {
        self.call(|s, b| match b {
            Bound::Sampler(x) => x.weft_plugin_sampler().call_describe(s),
            Bound::Verifier(x) => x.weft_plugin_verifier().call_describe(s),
            Bound::Admission(x) => x.weft_plugin_admission().call_describe(s),
        })
    }

    pub fn sampler_configure(&self, p: &bindings::SamplingParams) -> Result<Result<bindings::SamplingPlan, String>, Fault> {
        self.call(|s, b| match b {
            Bound::Sampler(x) => x.weft_plugin_sampler().call_configure(s, p),
            _ => unreachable!("kind checked at load"),
        })
    }

    pub fn sampler_sample(&self, batch: &[bindings::Sequence]) -> Result<Vec<bindings::Decision>, Fault> {
        let flat = bindings::flatten(batch);
        self.call(|s, b| match b {
            Bound::Sampler(x) => x.weft_plugin_sampler().call_sample(s, &flat),
            _ => unreachable!("kind checked at load"),
        })
    }

    pub fn verifier_verify(&self, batch: &[bindings::DraftStep]) -> Result<Vec<bindings::Verdict>, Fault> {
        self.call(|s, b| match b {
            Bound::Verifier(x) => x.weft_plugin_verifier().call_verify(s, batch),
            _ => unreachable!("kind checked at load"),
        })
    }

    pub fn admission_on_arrival(&self, w: &bindings::Waiting, queue: u32) -> Result<Option<bindings::Rejection>, Fault> {
        self.call(|s, b| match b {
            Bound::Admission(x) => x.weft_plugin_admission().call_on_arrival(s, w, queue),
            _ => unreachable!("kind checked at load"),
        })
    }

    pub fn admission_schedule(&self, w: &[bindings::Waiting], r: &[bindings::Running], c: bindings::Capacity) -> Result<bindings::ScheduleDecision, Fault> {
        self.call(|s, b| match b {
            Bound::Admission(x) => x.weft_plugin_admission().call_schedule(s, w, r, c),
            _ => unreachable!("kind checked at load"),
        })
    }
}
