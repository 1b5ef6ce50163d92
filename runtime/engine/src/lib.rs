//! weft's serving engine: requests in, token streams out. A step loop on its own thread owns
//! the batch (continuous batching: requests join and leave every step), the paged latent KV
//! pool (prefix reuse, LRU eviction, preemption by recompute), admission through the admission
//! plugin and sampling through the sampler plugin, one batch call per step.

pub mod detok;
pub mod dflash;
pub mod draft_model;
pub mod engine;
pub mod frontend;
pub mod kv_pool;
pub mod mtp;
pub mod request;
pub mod spec;
pub mod step_logits;

pub use engine::{Engine, EngineConfig, EngineStats, SubmitError};
pub use request::{ErrorKind, Event, FinishReason, GenerationRequest};
pub use spec::{DrafterKind, SpecConfig};
