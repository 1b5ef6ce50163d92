//! What every handler shares: the engine, the tokenizer (prompts, chat template, token
//! strings for logprobs), generation defaults, metrics, and the server's settings.

use crate::metrics::Metrics;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use weft_engine::Engine;
use weft_model::tokenizer::{GenerationDefaults, TextTokenizer};

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name clients pass as `model` (default: the model directory's name).
    pub model_name: String,
    /// Request body limit for the OpenAI routes.
    pub max_body_bytes: usize,
    /// Body limit for plugin uploads on the admin API.
    pub max_plugin_bytes: usize,
    /// Bearer token for /admin; the admin API is off when None.
    pub admin_token: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig { model_name: "weft".into(), max_body_bytes: 4 << 20, max_plugin_bytes: 64 << 20, admin_token: None }
    }
}

pub struct AppState {
    pub engine: Arc<Engine>,
    pub tokenizer: Arc<TextTokenizer>,
    pub defaults: GenerationDefaults,
    pub model_name: String,
    pub cfg: ServerConfig,
    pub metrics: Arc<Metrics>,
    /// Unix time the server started (`created` of /v1/models).
    pub started: u64,
    counter: AtomicU64,
}

impl AppState {
    pub fn new(engine: Arc<Engine>, tokenizer: Arc<TextTokenizer>, defaults: GenerationDefaults, cfg: ServerConfig) -> Self {
        let started = unix_now();
        AppState { engine, tokenizer, defaults, model_name: cfg.model_name.clone(), cfg, metrics: Arc::new(Metrics::new()), started, counter: AtomicU64::new(0) }
    }

    /// A response id unique within this server's life (`cmpl-…`, `chatcmpl-…`).
    pub fn response_id(&self, prefix: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{:06x}", self.started, n)
    }

    /// A seed for requests that gave none (different per request).
    pub fn fresh_seed(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        (t ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9)
    }

    /// The text of one token as logprobs report it.
    pub fn token_str(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
