//! What the request fuzzers share (the stable mutation fuzzer in `tests/fuzz_requests.rs` and
//! the cargo-fuzz target `fuzz/fuzz_targets/openai_request.rs`): the demo model served from the
//! CPU backend in process, and the clamp that keeps a fuzzed request's generation short.
//! Not for serving.

use crate::{AppState, ServerConfig};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use weft_engine::{Engine, EngineConfig};
use weft_model::tokenizer::TextTokenizer;
use weft_model::LoadedModel;
use weft_plugin_host::Registry;

/// The server state over the model in `model_dir` on the CPU backend, with a small engine
/// (128 pages of 64, 512-token budget, 32 sequences) and the default plugins.
pub fn cpu_state(model_dir: &Path) -> Arc<AppState> {
    let lm = LoadedModel::open(model_dir, weft_backend::cpu::CpuBackend::new()).unwrap_or_else(|e| panic!("{}: {e}", model_dir.display()));
    let tokenizer = Arc::new(TextTokenizer::from_dir(model_dir).unwrap());
    let defaults = lm.defaults.clone();
    let registry = Arc::new(Registry::with_defaults(Default::default()).unwrap());
    let engine = Arc::new(Engine::start(lm, registry, EngineConfig { num_pages: 128, page_size: 64, token_budget: 512, max_sequences: 32, spec: None }).unwrap());
    Arc::new(AppState::new(engine, tokenizer, defaults, ServerConfig { model_name: "demo".into(), ..Default::default() }))
}

/// Keeps a fuzzed body's generation short: numbers in the length fields are clamped and a
/// missing length becomes 4 (the length checks themselves are in the end-to-end bad-input table).
pub fn clamp_lengths(v: &mut Value) {
    if let Value::Object(m) = v {
        for (k, lim) in [("max_tokens", 4.0), ("max_completion_tokens", 4.0), ("n", 2.0), ("best_of", 2.0), ("logprobs", 3.0), ("top_logprobs", 3.0)] {
            if m.get(k).and_then(Value::as_f64).is_some_and(|x| x > lim) {
                m.insert(k.into(), json!(lim as u64));
            }
        }
        if m.get("max_tokens").is_none() && m.get("max_completion_tokens").is_none() {
            m.insert("max_tokens".into(), json!(4));
        }
    }
}
