//! What a client asks of the engine and what it streams back.

use weft_plugin_host::SamplingParams;

#[derive(Clone, Debug)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    /// Sampling parameters as the client sent them (the sampler plugin plans from these).
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub stop_token_ids: Vec<u32>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub seed: u64,
    /// Sampler plugin by name (None: the default).
    pub sampler: Option<String>,
    /// Top-N log-probabilities per generated token.
    pub logprobs: Option<usize>,
    pub priority: i32,
    pub tenant: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// One generated token and the text it completed (possibly empty while a character or a
    /// possible stop string is pending).
    Token { id: u32, text: String, logprobs: Option<Vec<(u32, f64)>> },
    Finished { reason: FinishReason, prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize, text_tail: String },
    /// The request failed; `retry` distinguishes overload (429) from unavailability (503).
    Error { message: String, retry: bool, client_error: bool },
}
