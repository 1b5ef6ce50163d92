//! `POST /v1/completions`: prompts in any of the four shapes, `n` choices per prompt,
//! `echo`, `logprobs` (top-N, 0..=20), streaming with `stream_options.include_usage`.
//! `best_of` other than `n` and `suffix` are refused with a reason.

use crate::body;
use crate::choices::{self, Collected, TokenOut, Usage};
use crate::error::ApiError;
use crate::logprobs;
use crate::params::{self, MAX_CHOICES, MAX_LOGPROBS};
use crate::protocol::{CompletionRequest, Sampling};
use crate::state::{unix_now, AppState};
use crate::stream::{self, ChunkFormat};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;
use weft_engine::FinishReason;

pub async fn handler(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match run(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let bytes = body::bytes(body, state.cfg.max_body_bytes)?;
    let req: CompletionRequest = body::json(&bytes)?;
    let sampling: Sampling = body::json(&bytes)?;
    params::check_model(&state, req.model.as_deref())?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::param("suffix", "`suffix` (fill-in-the-middle) is not supported by this model"));
    }
    let n = params::choices(req.n)?;
    if let Some(b) = req.best_of {
        if b != n as i64 {
            return Err(ApiError::param("best_of", format!("`best_of` ({b}) must equal `n` ({n}): weft does not rank hidden candidates; ask for `n` choices with `logprobs` and rank them yourself")));
        }
    }
    let logprobs = match req.logprobs {
        None => None,
        Some(k) if (0..=MAX_LOGPROBS).contains(&k) => Some(k as usize),
        Some(k) => return Err(ApiError::param("logprobs", format!("`logprobs` is {k}; it must be between 0 and {MAX_LOGPROBS}"))),
    };
    let echo = req.echo.unwrap_or(false);
    if echo && logprobs.is_some() {
        return Err(ApiError::param("echo", "`echo` together with `logprobs` needs prompt log-probabilities, which this server does not compute; use one or the other"));
    }
    let streaming = req.stream.unwrap_or(false);
    if req.stream_options.is_some() && !streaming {
        return Err(ApiError::param("stream_options", "`stream_options` is only allowed when `stream` is true"));
    }
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let plan = params::plan(&state, &sampling, &bytes)?;
    let prompts = params::prompts(&state, &req.prompt)?;
    if prompts.len() * n > MAX_CHOICES {
        return Err(ApiError::param("n", format!("{} prompts × n={n} is more than {MAX_CHOICES} choices in one request", prompts.len())));
    }
    let ctx = state.engine.max_context();
    let mut reqs = vec![];
    for (pi, p) in prompts.iter().enumerate() {
        let max_tokens = params::max_tokens("max_tokens", req.max_tokens, Some(16), p.len(), ctx)?;
        for (i, r) in plan.requests(p, max_tokens, n, logprobs).into_iter().enumerate() {
            reqs.push((pi * n + i, i == 0, r));
        }
    }
    let echoed: Vec<String> = if echo { prompts.iter().map(|p| state.tokenizer.decode(p, true).unwrap_or_default()).collect() } else { vec![] };
    let runs = choices::submit(&state, reqs).await?;
    let fmt = Format { id: state.response_id("cmpl"), created: unix_now(), model: state.model_name.clone(), echoed, n, logprobs: logprobs.is_some() };
    if streaming {
        return Ok(stream::sse(state, runs, fmt, include_usage));
    }
    let (done, usage) = choices::collect_all(&state, runs).await?;
    let choices: Vec<Value> = done.iter().map(|c| fmt.choice(&state, c)).collect();
    Ok(axum::Json(json!({"id": fmt.id, "object": "text_completion", "created": fmt.created, "model": fmt.model, "choices": choices, "usage": usage.json()})).into_response())
}

struct Format {
    id: String,
    created: u64,
    model: String,
    echoed: Vec<String>,
    n: usize,
    logprobs: bool,
}

impl Format {
    fn chunk(&self, choice: Value) -> Value {
        json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model, "choices": [choice]})
    }

    fn choice(&self, state: &AppState, c: &Collected) -> Value {
        let mut text = self.echoed.get(c.index / self.n).cloned().unwrap_or_default();
        text.push_str(&c.text);
        let lp = if self.logprobs { logprobs::completion(state, &c.tokens) } else { Value::Null };
        json!({"index": c.index, "text": text, "logprobs": lp, "finish_reason": c.finish.as_str()})
    }
}

impl ChunkFormat for Format {
    fn start(&mut self, _: &AppState, index: usize) -> Option<Value> {
        let e = self.echoed.get(index / self.n)?;
        Some(self.chunk(json!({"index": index, "text": e, "logprobs": null, "finish_reason": null})))
    }

    fn token(&mut self, state: &AppState, index: usize, text: &str, tok: &TokenOut) -> Option<Value> {
        // One chunk per generated token, its text possibly empty (a token that completes no
        // character yet, or an id the tokenizer lacks): clients can time every token.
        let lp = if self.logprobs { logprobs::completion(state, std::slice::from_ref(tok)) } else { Value::Null };
        Some(self.chunk(json!({"index": index, "text": text, "logprobs": lp, "finish_reason": null})))
    }

    fn finish(&mut self, _: &AppState, index: usize, tail: &str, reason: FinishReason) -> Value {
        self.chunk(json!({"index": index, "text": tail, "logprobs": null, "finish_reason": reason.as_str()}))
    }

    fn usage(&mut self, usage: &Usage) -> Value {
        json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model, "choices": [], "usage": usage.json()})
    }
}
