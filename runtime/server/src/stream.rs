//! Server-sent events for both endpoints: the choices' events merged into chunks (the shape
//! of each chunk is the endpoint's [`ChunkFormat`]), an optional final `usage` chunk, then
//! `data: [DONE]`. A failure mid-stream is sent as an `{"error": ...}` event before `[DONE]`.
//! When the client disconnects the stream is dropped, which aborts every choice.

use crate::choices::{merged, ChoiceRun, TokenOut, Usage};
use crate::metrics::RequestTimer;
use crate::state::AppState;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::Value;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use weft_engine::{Event, FinishReason};

/// How one endpoint shapes its chunks.
pub trait ChunkFormat: Send + 'static {
    /// A chunk sent when a choice starts (chat's role, an echoed prompt), if any.
    fn start(&mut self, state: &AppState, index: usize) -> Option<Value>;
    /// A chunk for one generated token, if there is something to send.
    fn token(&mut self, state: &AppState, index: usize, text: &str, tok: &TokenOut) -> Option<Value>;
    /// The choice's last chunk.
    fn finish(&mut self, state: &AppState, index: usize, tail: &str, reason: FinishReason) -> Value;
    /// The usage-only chunk (`stream_options.include_usage`).
    fn usage(&mut self, usage: &Usage) -> Value;
}

fn data(v: &Value) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().data(v.to_string()))
}

pub fn sse<F: ChunkFormat>(state: Arc<AppState>, runs: Vec<ChoiceRun>, mut fmt: F, include_usage: bool) -> Response {
    let total = runs.len();
    let indices: Vec<usize> = runs.iter().map(|r| r.index).collect();
    let s = async_stream::stream! {
        let mut timers: HashMap<usize, RequestTimer> = indices.iter().map(|&i| (i, RequestTimer::start(state.metrics.clone()))).collect();
        let mut offsets: HashMap<usize, usize> = HashMap::new();
        for &i in &indices {
            if let Some(v) = fmt.start(&state, i) {
                yield data(&v);
            }
        }
        let mut usage = Usage::default();
        let mut left = total;
        let mut events = merged(runs);
        let mut failed = false;
        while let Some((i, counts_prompt, ev)) = events.next().await {
            match ev {
                Event::Token { id, text, logprob, top_logprobs } => {
                    if let Some(t) = timers.get_mut(&i) {
                        t.token();
                    }
                    let off = offsets.entry(i).or_insert(0);
                    let tok = TokenOut { id, logprob, top: top_logprobs, offset: *off };
                    *off += text.len();
                    if let Some(v) = fmt.token(&state, i, &text, &tok) {
                        yield data(&v);
                    }
                }
                Event::Finished { reason, prompt_tokens, completion_tokens, cached_tokens, text_tail } => {
                    if let Some(mut t) = timers.remove(&i) {
                        t.finish(reason);
                    }
                    usage.add(Usage::of(counts_prompt, prompt_tokens, completion_tokens, cached_tokens));
                    yield data(&fmt.finish(&state, i, &text_tail, reason));
                    left -= 1;
                    if left == 0 {
                        break;
                    }
                }
                Event::Error { message, kind } => {
                    if let Some(mut t) = timers.remove(&i) {
                        t.fail();
                    }
                    yield data(&crate::error::ApiError::from_kind(kind, message).body());
                    failed = true;
                    break;
                }
            }
        }
        if left > 0 && !failed {
            yield data(&crate::error::ApiError::from_kind(weft_engine::ErrorKind::Unavailable, "the engine stopped before the request finished".into()).body());
        } else if include_usage && !failed {
            yield data(&fmt.usage(&usage));
        }
        yield Ok(SseEvent::default().data("[DONE]"));
    };
    Sse::new(s).keep_alive(KeepAlive::default()).into_response()
}
