//! The one shared wasmtime engine: component compilation cached by sha256, a WASI p2 linker
//! that grants guests nothing (no files, environment, network, clocks beyond WASI's
//! defaults), per-store memory caps, and an epoch ticker that enforces per-call deadlines.

use crate::PluginError;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::component::{Component, InstancePre, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// Sandbox limits applied to every plugin instance.
#[derive(Clone, Copy, Debug)]
pub struct SandboxLimits {
    /// Linear memory cap per instance.
    pub memory_bytes: usize,
    /// Wall-clock budget of one call.
    pub deadline: Duration,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits { memory_bytes: 64 << 20, deadline: Duration::from_millis(50) }
    }
}

/// Per-store state: an empty WASI context and the memory limiter.
pub struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

const TICK: Duration = Duration::from_millis(1);

pub struct PluginEngine {
    engine: Engine,
    linker: Linker<GuestState>,
    cache: Mutex<HashMap<String, Component>>,
    pub limits: SandboxLimits,
    stop: Arc<AtomicBool>,
}

impl Drop for PluginEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl PluginEngine {
    pub fn new(limits: SandboxLimits) -> Result<Self, PluginError> {
        let mut cfg = Config::new();
        cfg.wasm_component_model(true).epoch_interruption(true);
        let engine = Engine::new(&cfg).map_err(|e| PluginError::Host(format!("wasmtime engine: {e}")))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| PluginError::Host(format!("WASI linker: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (e2, s2) = (engine.clone(), stop.clone());
        std::thread::Builder::new()
            .name("weft-plugin-epoch".into())
            .spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    e2.increment_epoch();
                }
            })
            .map_err(|e| PluginError::Host(format!("epoch thread: {e}")))?;
        Ok(PluginEngine { engine, linker, cache: Mutex::new(HashMap::new()), limits, stop })
    }

    /// Compiles a component (or returns the cached compilation of the same bytes).
    pub fn compile(&self, bytes: &[u8]) -> Result<(String, Component), PluginError> {
        let sha = sha256_hex(bytes);
        if let Some(c) = self.cache.lock().unwrap().get(&sha) {
            return Ok((sha, c.clone()));
        }
        if bytes.len() < 8 || &bytes[0..4] != b"\0asm" {
            return Err(PluginError::Invalid("not a WebAssembly binary (no \\0asm header)".into()));
        }
        // Component binaries have layer 1 in bytes 6..8; core modules have 0.
        if bytes[6..8] != [1, 0] {
            return Err(PluginError::Invalid("a core WebAssembly module, not a component: build the plugin for wasm32-wasip2 (or wrap it with `wasm-tools component new`)".into()));
        }
        let c = Component::new(&self.engine, bytes).map_err(|e| PluginError::Invalid(format!("component does not compile: {e}")))?;
        self.cache.lock().unwrap().insert(sha.clone(), c.clone());
        Ok((sha, c))
    }

    pub fn instantiate_pre(&self, c: &Component) -> Result<InstancePre<GuestState>, PluginError> {
        self.linker.instantiate_pre(c).map_err(|e| PluginError::Invalid(format!("component imports something weft does not provide: {e}")))
    }

    /// A fresh store: no WASI capabilities, memory capped, trapping at the epoch deadline.
    pub fn new_store(&self) -> Store<GuestState> {
        let wasi = WasiCtxBuilder::new().allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false).build();
        let limits = StoreLimitsBuilder::new().memory_size(self.limits.memory_bytes).instances(16).tables(64).memories(16).trap_on_grow_failure(true).build();
        let mut store = Store::new(&self.engine, GuestState { wasi, table: ResourceTable::new(), limits });
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.deadline_ticks());
        store
    }

    pub fn deadline_ticks(&self) -> u64 {
        (self.limits.deadline.as_micros() / TICK.as_micros()).max(1) as u64 + 1
    }
}
