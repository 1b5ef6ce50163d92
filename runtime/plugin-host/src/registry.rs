//! The versioned plugin registry. A plugin is loaded from bytes or a path, compiled (cached by
//! sha256), checked (`describe`, interface version, a self-check call on synthetic input) and
//! only then registered; a slot (kind + name) holds its versions, one active. Requests resolve
//! a slot once and keep the `Arc` of that version for their whole life (drain semantics);
//! activating another version affects new requests only. Inactive versions nobody uses release
//! their instances; `unload` forgets a version entirely.

use crate::bindings::{self, Candidates, Capacity, DraftStep, SamplingParams, Sequence, Waiting};
use crate::engine::{PluginEngine, SandboxLimits};
use crate::plugin::{LoadedPlugin, Pre};
use crate::{calls, defaults, FailurePolicy, Fault, PluginError, PluginId, PluginKind, INTERFACE_VERSION};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

struct Slot {
    versions: Vec<Arc<LoadedPlugin>>,
    active: usize,
    /// Previously active versions, most recent last (for rollback).
    history: Vec<String>,
    policy: FailurePolicy,
}

/// A version as listed by the admin API.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VersionSummary {
    pub version: String,
    pub sha256: String,
    pub active: bool,
    /// Requests (and other holders) currently bound to this version.
    pub in_use: usize,
    pub calls: u64,
    pub mean_call_us: f64,
    pub faults: u64,
    pub fallbacks: u64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct PluginSummary {
    pub kind: &'static str,
    pub name: String,
    pub default: bool,
    pub failure_policy: &'static str,
    pub versions: Vec<VersionSummary>,
}

pub struct Registry {
    engine: Arc<PluginEngine>,
    slots: RwLock<BTreeMap<(PluginKind, String), Slot>>,
    defaults: RwLock<HashMap<PluginKind, String>>,
}

/// Synthetic inputs for the self-check a plugin must pass before activation.
fn probe_params() -> SamplingParams {
    SamplingParams { temperature: 0.7, top_p: 0.9, eos_tokens: vec![0], extra: "{}".into(), ..bindings::neutral_params(16) }
}

fn probe_candidates() -> Candidates {
    let logits: Vec<f32> = (0..16).map(|i| 2.0 - i as f32 * 0.25).collect();
    let m = logits[0] as f64;
    let lse = (m + logits.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln()) as f32;
    Candidates { ids: (0..16).collect(), logits, logsumexp: lse, complete: true }
}

impl Registry {
    /// An empty registry (tests); `with_defaults` is what servers use.
    pub fn new(limits: SandboxLimits) -> Result<Self, PluginError> {
        Ok(Registry { engine: Arc::new(PluginEngine::new(limits)?), slots: RwLock::new(BTreeMap::new()), defaults: RwLock::new(HashMap::new()) })
    }

    /// A registry with the embedded default sampler, verifier and admission plugins active
    /// and set as defaults.
    pub fn with_defaults(limits: SandboxLimits) -> Result<Self, PluginError> {
        let r = Self::new(limits)?;
        for bytes in [defaults::SAMPLER, defaults::VERIFIER, defaults::ADMISSION] {
            let id = r.load_bytes(bytes, None, None)?;
            r.set_default(id.kind, &id.name)?;
        }
        Ok(r)
    }

    pub fn engine(&self) -> &PluginEngine {
        &self.engine
    }

    /// Loads, checks and activates a plugin. `sha256` (hex), when given, must match the bytes.
    /// `options` are an admission plugin's configuration JSON.
    pub fn load_bytes(&self, bytes: &[u8], sha256: Option<&str>, options: Option<&str>) -> Result<PluginId, PluginError> {
        let (sha, component) = self.engine.compile(bytes)?;
        if let Some(want) = sha256 {
            if !want.eq_ignore_ascii_case(&sha) {
                return Err(PluginError::Invalid(format!("sha256 mismatch: expected {want}, the bytes hash to {sha}")));
            }
        }
        let pre = self.engine.instantiate_pre(&component)?;
        let typed = if let Ok(p) = bindings::sampler::SamplerPluginPre::new(pre.clone()) {
            Pre::Sampler(p)
        } else if let Ok(p) = bindings::verifier::VerifierPluginPre::new(pre.clone()) {
            Pre::Verifier(p)
        } else if let Ok(p) = bindings::admission::AdmissionPluginPre::new(pre) {
            Pre::Admission(p)
        } else {
            return Err(PluginError::Invalid("the component exports none of weft:plugin/sampler, verifier or admission (interface 0.1.0)".into()));
        };
        let kind = match typed {
            Pre::Sampler(_) => PluginKind::Sampler,
            Pre::Verifier(_) => PluginKind::Verifier,
            Pre::Admission(_) => PluginKind::Admission,
        };
        let provisional = PluginId { kind, name: "?".into(), version: "?".into(), sha256: sha.clone() };
        let mut plugin = LoadedPlugin::new(provisional, self.engine.clone(), typed, options.unwrap_or("{}").to_string());
        let info = plugin.describe().map_err(|f| PluginError::Invalid(format!("describe() failed: {f}")))?;
        if info.interface_version != INTERFACE_VERSION {
            return Err(PluginError::Invalid(format!("plugin `{}` speaks interface {}, this host speaks {INTERFACE_VERSION}", info.name, info.interface_version)));
        }
        let described = match info.kind {
            bindings::PluginKind::Sampler => PluginKind::Sampler,
            bindings::PluginKind::Verifier => PluginKind::Verifier,
            bindings::PluginKind::Admission => PluginKind::Admission,
        };
        if described != kind {
            return Err(PluginError::Invalid(format!("plugin `{}` describes itself as a {described} but exports the {kind} interface", info.name)));
        }
        if info.name.is_empty() || info.name.len() > 64 || !info.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(PluginError::Invalid(format!("plugin name {:?} must be 1-64 characters of [A-Za-z0-9-_.]", info.name)));
        }
        plugin.id = PluginId { kind, name: info.name.clone(), version: info.version.clone(), sha256: sha.clone() };
        Self::self_check(&plugin).map_err(|f| PluginError::Invalid(format!("{} failed its self-check: {f}", plugin.id)))?;
        self.register(Arc::new(plugin))
    }

    pub fn load_path(&self, path: &Path, sha256: Option<&str>, options: Option<&str>) -> Result<PluginId, PluginError> {
        let bytes = std::fs::read(path).map_err(|e| PluginError::Invalid(format!("{}: {e}", path.display())))?;
        self.load_bytes(&bytes, sha256, options)
    }

    fn self_check(p: &LoadedPlugin) -> Result<(), Fault> {
        match p.id.kind {
            PluginKind::Sampler => {
                let params = probe_params();
                let plan = match p.sampler_configure(&params)? {
                    Ok(plan) => plan,
                    Err(msg) => return Err(Fault::Invalid(format!("configure refused ordinary parameters: {msg}"))),
                };
                let batch = vec![Sequence { request_id: 1, state: plan.state, candidates: probe_candidates(), uniforms: vec![0.5, 0.25], history: Some(vec![1, 2]) }];
                let out = calls::sample(p, FailurePolicy::Fail, &batch, &[&params], 16).map_err(|e| Fault::Invalid(e.to_string()))?;
                if !matches!(out[0], bindings::Decision::Token(_)) {
                    return Err(Fault::Invalid("no token for a complete distribution".into()));
                }
            }
            PluginKind::Verifier => {
                let c = probe_candidates();
                let step = DraftStep {
                    request_id: 1,
                    draft_tokens: vec![0, 3],
                    draft_probs: vec![0.5, 0.5],
                    draft_candidates: None,
                    target: vec![c.clone(), c.clone(), c],
                    uniforms: vec![0.5; 4],
                    greedy: false,
                };
                calls::verify(p, FailurePolicy::Fail, &[step], 16).map_err(|e| Fault::Invalid(e.to_string()))?;
            }
            PluginKind::Admission => {
                let w = Waiting { id: 1, arrival_ms: 0, prompt_tokens: 10, cached_prefix_tokens: 0, max_tokens: 10, priority: 0, tenant: "t".into() };
                let cap = Capacity { free_pages: 8, total_pages: 8, page_size: 64, token_budget: 512, max_sequences: 4 };
                calls::schedule(p, FailurePolicy::Fail, &[w], &[], cap).map_err(|e| Fault::Invalid(e.to_string()))?;
            }
        }
        Ok(())
    }

    fn register(&self, p: Arc<LoadedPlugin>) -> Result<PluginId, PluginError> {
        let id = p.id.clone();
        let mut slots = self.slots.write().unwrap();
        let slot = slots.entry((id.kind, id.name.clone())).or_insert_with(|| Slot { versions: vec![], active: 0, history: vec![], policy: FailurePolicy::Fallback });
        if let Some(i) = slot.versions.iter().position(|v| v.id.version == id.version) {
            if slot.versions[i].id.sha256 != id.sha256 {
                return Err(PluginError::Conflict(format!("{} is already loaded with different bytes (sha256 {}); bump the version", id, slot.versions[i].id.sha256)));
            }
            if slot.versions[i].options != p.options {
                // Same bytes, new operator options: a fresh entry (requests bound to the old
                // one keep it until they finish).
                slot.versions[i] = p;
            }
            Self::switch(slot, i);
        } else {
            slot.versions.push(p);
            let i = slot.versions.len() - 1;
            Self::switch(slot, i);
        }
        drop(slots);
        self.defaults.write().unwrap().entry(id.kind).or_insert_with(|| id.name.clone());
        self.gc();
        tracing::info!(plugin = %id, sha256 = %id.sha256, "plugin active");
        Ok(id)
    }

    fn switch(slot: &mut Slot, to: usize) {
        if !slot.versions.is_empty() && slot.active != to && slot.active < slot.versions.len() {
            let prev = slot.versions[slot.active].id.version.clone();
            slot.history.push(prev);
        }
        slot.active = to;
    }

    /// Makes an already loaded version the active one of its slot.
    pub fn activate(&self, kind: PluginKind, name: &str, version: &str) -> Result<(), PluginError> {
        let mut slots = self.slots.write().unwrap();
        let slot = slots.get_mut(&(kind, name.to_string())).ok_or_else(|| PluginError::NotFound(format!("no {kind} plugin named `{name}`")))?;
        let i = slot.versions.iter().position(|v| v.id.version == version).ok_or_else(|| PluginError::NotFound(format!("{kind} plugin `{name}` has no version {version}")))?;
        Self::switch(slot, i);
        Ok(())
    }

    /// Re-activates the version that was active before the current one.
    pub fn rollback(&self, kind: PluginKind, name: &str) -> Result<String, PluginError> {
        let mut slots = self.slots.write().unwrap();
        let slot = slots.get_mut(&(kind, name.to_string())).ok_or_else(|| PluginError::NotFound(format!("no {kind} plugin named `{name}`")))?;
        while let Some(prev) = slot.history.pop() {
            if let Some(i) = slot.versions.iter().position(|v| v.id.version == prev) {
                slot.active = i;
                return Ok(prev);
            }
        }
        Err(PluginError::Conflict(format!("{kind} plugin `{name}` has no earlier version to roll back to")))
    }

    /// Forgets a version (the active one only if it is the slot's last). Requests bound to it
    /// finish on it; it is freed when the last of them ends.
    pub fn unload(&self, kind: PluginKind, name: &str, version: &str) -> Result<(), PluginError> {
        let mut slots = self.slots.write().unwrap();
        let key = (kind, name.to_string());
        let slot = slots.get_mut(&key).ok_or_else(|| PluginError::NotFound(format!("no {kind} plugin named `{name}`")))?;
        let i = slot.versions.iter().position(|v| v.id.version == version).ok_or_else(|| PluginError::NotFound(format!("{kind} plugin `{name}` has no version {version}")))?;
        if i == slot.active && slot.versions.len() > 1 {
            return Err(PluginError::Conflict(format!("{kind} plugin `{name}@{version}` is active: activate or roll back to another version first")));
        }
        if slot.versions.len() == 1 && self.defaults.read().unwrap().get(&kind).map(|d| d == name).unwrap_or(false) {
            return Err(PluginError::Conflict(format!("`{name}` is the default {kind}: set another default first")));
        }
        let active_version = slot.versions[slot.active].id.version.clone();
        slot.versions.remove(i);
        slot.history.retain(|v| v != version);
        if slot.versions.is_empty() {
            slots.remove(&key);
        } else {
            slot.active = slot.versions.iter().position(|v| v.id.version == active_version).unwrap_or(0);
        }
        Ok(())
    }

    pub fn set_default(&self, kind: PluginKind, name: &str) -> Result<(), PluginError> {
        if !self.slots.read().unwrap().contains_key(&(kind, name.to_string())) {
            return Err(PluginError::NotFound(format!("no {kind} plugin named `{name}`")));
        }
        self.defaults.write().unwrap().insert(kind, name.to_string());
        Ok(())
    }

    pub fn set_policy(&self, kind: PluginKind, name: &str, policy: FailurePolicy) -> Result<(), PluginError> {
        let mut slots = self.slots.write().unwrap();
        let slot = slots.get_mut(&(kind, name.to_string())).ok_or_else(|| PluginError::NotFound(format!("no {kind} plugin named `{name}`")))?;
        slot.policy = policy;
        Ok(())
    }

    /// The active version of slot `name` (or of the kind's default) and the slot's policy.
    /// Callers keep the `Arc` for the life of a request.
    pub fn resolve(&self, kind: PluginKind, name: Option<&str>) -> Result<(Arc<LoadedPlugin>, FailurePolicy), PluginError> {
        let name = match name {
            Some(n) => n.to_string(),
            None => self.defaults.read().unwrap().get(&kind).cloned().ok_or_else(|| PluginError::NotFound(format!("no default {kind} plugin")))?,
        };
        let slots = self.slots.read().unwrap();
        let slot = slots.get(&(kind, name.clone())).ok_or_else(|| PluginError::NotFound(format!("unknown {kind} plugin `{name}`")))?;
        Ok((slot.versions[slot.active].clone(), slot.policy))
    }

    /// Releases the instances of inactive versions no request holds any more.
    pub fn gc(&self) {
        let slots = self.slots.read().unwrap();
        for slot in slots.values() {
            for (i, v) in slot.versions.iter().enumerate() {
                if i != slot.active && Arc::strong_count(v) == 1 {
                    v.release_instances();
                }
            }
        }
    }

    pub fn list(&self) -> Vec<PluginSummary> {
        let defaults = self.defaults.read().unwrap().clone();
        let slots = self.slots.read().unwrap();
        slots
            .iter()
            .map(|((kind, name), slot)| PluginSummary {
                kind: kind.as_str(),
                name: name.clone(),
                default: defaults.get(kind) == Some(name),
                failure_policy: slot.policy.as_str(),
                versions: slot
                    .versions
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let calls = v.stats.calls.load(Ordering::Relaxed);
                        VersionSummary {
                            version: v.id.version.clone(),
                            sha256: v.id.sha256.clone(),
                            active: i == slot.active,
                            in_use: Arc::strong_count(v) - 1,
                            calls,
                            mean_call_us: if calls == 0 { 0.0 } else { v.stats.call_nanos.load(Ordering::Relaxed) as f64 / calls as f64 / 1000.0 },
                            faults: v.stats.faults(),
                            fallbacks: v.stats.fallbacks.load(Ordering::Relaxed),
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    /// Watches `dir` for `*.wasm` files (new or modified) and loads them, every `interval`,
    /// until the registry is dropped. Failed loads are logged; they never become active.
    pub fn watch_dir(self: &Arc<Self>, dir: PathBuf, interval: Duration) {
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("weft-plugin-watch".into())
            .spawn(move || {
                let mut seen: HashMap<PathBuf, SystemTime> = HashMap::new();
                loop {
                    let Some(reg) = weak.upgrade() else { return };
                    for (path, err) in reg.scan_dir(&dir, &mut seen) {
                        tracing::warn!(path = %path.display(), error = %err, "plugin in watched directory refused");
                    }
                    drop(reg);
                    std::thread::sleep(interval);
                }
            })
            .expect("spawning the plugin directory watcher");
    }

    /// One pass over `dir`: loads `*.wasm` files whose modification time changed. Returns the
    /// files that failed to load.
    pub fn scan_dir(&self, dir: &Path, seen: &mut HashMap<PathBuf, SystemTime>) -> Vec<(PathBuf, PluginError)> {
        let mut failed = vec![];
        let Ok(rd) = std::fs::read_dir(dir) else { return failed };
        let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "wasm")).collect();
        files.sort();
        for path in files {
            let Ok(mtime) = std::fs::metadata(&path).and_then(|m| m.modified()) else { continue };
            if seen.get(&path) == Some(&mtime) {
                continue;
            }
            seen.insert(path.clone(), mtime);
            if let Err(e) = self.load_path(&path, None, None) {
                failed.push((path, e));
            }
        }
        failed
    }
}
