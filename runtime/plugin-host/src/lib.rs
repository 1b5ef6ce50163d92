//! The plugin host: the only crate that depends on wasmtime. It loads sampler, verifier and
//! admission components (`wit/weft-plugin.wit`), runs them sandboxed (no files, environment or
//! network; memory cap; per-call deadline), validates every answer, contains faults according
//! to each slot's failure policy, and keeps a versioned registry with hot swap, rollback and
//! drain semantics. The default plugins are embedded in this crate.

pub mod bindings;
pub mod calls;
pub mod engine;
pub mod native;
pub mod plugin;
pub mod registry;

pub use bindings::{neutral_params, Candidates, Capacity, Decision, DraftStep, PluginInfo, Rejection, Running, SamplingParams, SamplingPlan, ScheduleDecision, Sequence, Verdict, Waiting};
pub use engine::{PluginEngine, SandboxLimits};
pub use plugin::{LoadedPlugin, PluginId, PluginStats};
pub use registry::{PluginSummary, Registry, VersionSummary};

/// The interface version this host speaks (the WIT package version).
pub const INTERFACE_VERSION: &str = "0.1.0";

/// The default plugins, built from `plugins/` for wasm32-wasip2 and embedded.
pub mod defaults {
    pub const SAMPLER: &[u8] = include_bytes!(concat!(env!("WEFT_PLUGIN_DIR"), "/weft_sampler_default.wasm"));
    pub const VERIFIER: &[u8] = include_bytes!(concat!(env!("WEFT_PLUGIN_DIR"), "/weft_verifier_default.wasm"));
    pub const ADMISSION: &[u8] = include_bytes!(concat!(env!("WEFT_PLUGIN_DIR"), "/weft_admission_default.wasm"));
}

/// Where the build put every guest (defaults, examples and test plugins).
pub fn built_plugin_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("WEFT_PLUGIN_DIR"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PluginKind {
    Sampler,
    Verifier,
    Admission,
}

impl PluginKind {
    pub const ALL: [PluginKind; 3] = [PluginKind::Sampler, PluginKind::Verifier, PluginKind::Admission];
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Sampler => "sampler",
            PluginKind::Verifier => "verifier",
            PluginKind::Admission => "admission",
        }
    }
    pub fn parse(s: &str) -> Option<PluginKind> {
        PluginKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for PluginKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a slot does when its plugin faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Answer with the built-in native policy for this call.
    Fallback,
    /// Fail the affected requests with a clear error.
    Fail,
    /// Re-instantiate and retry once; if that faults too, fail the affected requests.
    Reload,
}

impl FailurePolicy {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fallback" => Some(Self::Fallback),
            "fail" => Some(Self::Fail),
            "reload" => Some(Self::Reload),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fallback => "fallback",
            Self::Fail => "fail",
            Self::Reload => "reload",
        }
    }
}

/// A contained plugin misbehaviour.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Fault {
    #[error("trapped: {0}")]
    Trap(String),
    #[error("exceeded its deadline")]
    Deadline,
    #[error("exceeded its memory cap")]
    Memory,
    #[error("gave an invalid answer: {0}")]
    Invalid(String),
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The bytes are not a loadable plugin (never becomes active).
    #[error("plugin refused: {0}")]
    Invalid(String),
    /// A running plugin faulted and the slot's policy is to fail.
    #[error("{plugin} {fault}")]
    Faulted { plugin: String, fault: Fault },
    /// The plugin rejected the request's parameters (a client error).
    #[error("{0}")]
    Rejected(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("plugin host: {0}")]
    Host(String),
}
