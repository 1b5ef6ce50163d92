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
    /// Whether this request may use the server's speculative decoding (when eligible).
    pub speculative: bool,
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
    /// `logprob` (the token's own, under the raw model distribution) and `top_logprobs` are
    /// present when the request asked for log-probabilities.
    Token {
        id: u32,
        text: String,
        logprob: Option<f64>,
        top_logprobs: Option<Vec<(u32, f64)>>,
    },
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
        text_tail: String,
    },
    /// The request failed after it was queued.
    Error {
        message: String,
        kind: ErrorKind,
    },
}

/// Why a queued request failed; the server maps each to an HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Admission turned it away for now; retrying later may succeed (429).
    Overloaded,
    /// Admission refused it for good, or the engine is going away (503).
    Unavailable,
    /// It can never fit in the KV pool (413).
    TooLarge,
    /// A plugin with the `fail` policy faulted, or a forward pass failed (500).
    Internal,
}
