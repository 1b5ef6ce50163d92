//! `POST /v1/chat/completions`: messages rendered with the checkpoint's chat template, `n`
//! choices, `logprobs`/`top_logprobs`, streaming deltas with `stream_options.include_usage`.
//! Tool calls and structured output formats are refused with a reason.

use crate::body;
use crate::choices::{self, Collected, TokenOut, Usage};
use crate::error::ApiError;
use crate::logprobs;
use crate::params::{self, MAX_LOGPROBS};
use crate::protocol::{ChatMessageIn, ChatRequest, Sampling};
use crate::state::{unix_now, AppState};
use crate::stream::{self, ChunkFormat};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;
use weft_engine::FinishReason;
use weft_model::tokenizer::ChatMessage;

pub async fn handler(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match run(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// A message's text: a string, or a list of `{"type": "text", "text": ...}` parts.
fn content_text(i: usize, m: &ChatMessageIn) -> Result<String, ApiError> {
    let field = format!("messages[{i}].content");
    match &m.content {
        Value::String(s) => Ok(s.clone()),
        Value::Null if m.role == "assistant" => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (Some(t), _) if t != "text" => return Err(ApiError::param(&format!("{field}[{j}]"), format!("`{field}[{j}]` is a `{t}` part; this model takes text parts only"))),
                    _ => return Err(ApiError::param(&format!("{field}[{j}]"), format!("`{field}[{j}]` must be {{\"type\": \"text\", \"text\": \"...\"}}"))),
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::param(&field, format!("`{field}` must be a string or a list of text parts"))),
    }
}

fn messages(msgs: &[ChatMessageIn]) -> Result<Vec<ChatMessage>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::param("messages", "`messages` is empty"));
    }
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                other => return Err(ApiError::param(&format!("messages[{i}].role"), format!("`messages[{i}].role` is {other:?}; supported roles are system, developer, user and assistant"))),
            };
            Ok(ChatMessage { role: role.into(), content: content_text(i, m)? })
        })
        .collect()
}

async fn run(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let bytes = body::bytes(body, state.cfg.max_body_bytes)?;
    let req: ChatRequest = body::json(&bytes)?;
    let sampling: Sampling = body::json(&bytes)?;
    params::check_model(&state, req.model.as_deref())?;
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::param("tools", "`tools` (function calling) is not supported by this server yet"));
    }
    if let Some(f) = &req.response_format {
        if f.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::param("response_format", "only `{\"type\": \"text\"}` is supported as `response_format`"));
        }
    }
    let n = params::choices(req.n)?;
    let want_logprobs = req.logprobs.unwrap_or(false);
    let top = match req.top_logprobs {
        Some(_) if !want_logprobs => return Err(ApiError::param("top_logprobs", "`top_logprobs` needs `logprobs` set to true")),
        Some(k) if !(0..=MAX_LOGPROBS).contains(&k) => return Err(ApiError::param("top_logprobs", format!("`top_logprobs` is {k}; it must be between 0 and {MAX_LOGPROBS}"))),
        Some(k) => k as usize,
        None => 0,
    };
    let logprobs = want_logprobs.then_some(top);
    let streaming = req.stream.unwrap_or(false);
    if req.stream_options.is_some() && !streaming {
        return Err(ApiError::param("stream_options", "`stream_options` is only allowed when `stream` is true"));
    }
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let plan = params::plan(&state, &sampling, &bytes)?;
    let msgs = messages(&req.messages)?;
    let rendered = state.tokenizer.render_chat(&msgs, true).map_err(|e| ApiError::param("messages", format!("the chat template refused these messages: {e}")))?;
    let prompt = state.tokenizer.encode(&rendered, false).map_err(|e| ApiError::param("messages", format!("could not tokenize the rendered chat: {e}")))?;
    if prompt.is_empty() {
        return Err(ApiError::param("messages", "the rendered chat is empty"));
    }
    let (name, given) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", Some(m)),
        (None, m) => ("max_tokens", m),
    };
    let max_tokens = params::max_tokens(name, given, None, prompt.len(), state.engine.max_context())?;
    let reqs = plan.requests(&prompt, max_tokens, n, logprobs).into_iter().enumerate().map(|(i, r)| (i, i == 0, r)).collect();
    let runs = choices::submit(&state, reqs).await?;
    let fmt = Format { id: state.response_id("chatcmpl"), created: unix_now(), model: state.model_name.clone(), logprobs: logprobs.is_some() };
    if streaming {
        return Ok(stream::sse(state, runs, fmt, include_usage));
    }
    let (done, usage) = choices::collect_all(&state, runs).await?;
    let choices: Vec<Value> = done.iter().map(|c| fmt.choice(&state, c)).collect();
    Ok(axum::Json(json!({"id": fmt.id, "object": "chat.completion", "created": fmt.created, "model": fmt.model, "choices": choices, "usage": usage.json()})).into_response())
}

struct Format {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
}

impl Format {
    fn chunk(&self, index: usize, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
    }

    fn choice(&self, state: &AppState, c: &Collected) -> Value {
        let lp = if self.logprobs { logprobs::chat(state, &c.tokens) } else { Value::Null };
        json!({"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": lp, "finish_reason": c.finish.as_str()})
    }
}

impl ChunkFormat for Format {
    fn start(&mut self, _: &AppState, index: usize) -> Option<Value> {
        Some(self.chunk(index, json!({"role": "assistant", "content": ""}), Value::Null, None))
    }

    fn token(&mut self, state: &AppState, index: usize, text: &str, tok: &TokenOut) -> Option<Value> {
        // One chunk per generated token, its text possibly empty (a token that completes no
        // character yet, or an id the tokenizer lacks): clients can time every token.
        let lp = if self.logprobs { json!({"content": [logprobs::chat_entry(state, tok)]}) } else { Value::Null };
        Some(self.chunk(index, json!({"content": text}), lp, None))
    }

    fn finish(&mut self, _: &AppState, index: usize, tail: &str, reason: FinishReason) -> Value {
        let delta = if tail.is_empty() { json!({}) } else { json!({"content": tail}) };
        self.chunk(index, delta, Value::Null, Some(reason.as_str()))
    }

    fn usage(&mut self, usage: &Usage) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model, "choices": [], "usage": usage.json()})
    }
}
