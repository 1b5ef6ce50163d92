//! The OpenAI request bodies weft accepts, with weft's extensions (vLLM names where vLLM has
//! one). Fields that accept several shapes (`prompt`, `stop`, message `content`) stay JSON
//! values here and are checked in `params`, so every error can name its field. The shared
//! [`Sampling`] fields are read from the same body in a second pass (not `#[serde(flatten)]`,
//! which would lose the field path of a type error).

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Deserialize, Debug, Default, Clone)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and stopping fields shared by both endpoints.
#[derive(Deserialize, Debug, Default, Clone)]
pub struct Sampling {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub typical_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: Option<BTreeMap<String, f64>>,
    pub seed: Option<i64>,
    pub stop: Option<Value>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    /// A sampler plugin by name (default: the registry's default sampler).
    pub sampler: Option<String>,
    pub priority: Option<i32>,
    pub user: Option<String>,
    /// `false` opts this request out of the server's speculative decoding.
    pub speculative: Option<bool>,
}

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Option<Value>,
    pub max_tokens: Option<i64>,
    pub n: Option<i64>,
    pub best_of: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessageIn>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub response_format: Option<Value>,
}

#[derive(Deserialize, Debug)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Value,
    pub name: Option<String>,
}
