//! Running the choices of one HTTP request: submitting them to the engine (all or none),
//! collecting each to completion, or merging their event streams for SSE; timing each for
//! /metrics; and the `usage` object. Dropping a receiver aborts its engine request, so a
//! client that disconnects frees its KV pages at the next step.

use crate::error::ApiError;
use crate::metrics::RequestTimer;
use crate::state::AppState;
use futures_util::stream::{select_all, Stream, StreamExt};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use weft_engine::{Event, FinishReason, GenerationRequest};

/// One submitted choice.
pub struct ChoiceRun {
    pub index: usize,
    /// The first choice of its prompt (its prompt tokens count once in `usage`).
    pub counts_prompt: bool,
    pub rx: UnboundedReceiver<Event>,
}

/// Submits every choice or none: if one is refused, the ones already queued are dropped
/// (aborted) and the refusal is returned. Runs on a blocking thread: submitting calls the
/// sampler plugin's `configure`, and a guest that writes to stderr (a panicking plugin does)
/// makes WASI block on the runtime, which must not happen on an async worker.
pub async fn submit(state: &Arc<AppState>, reqs: Vec<(usize, bool, GenerationRequest)>) -> Result<Vec<ChoiceRun>, ApiError> {
    let st = state.clone();
    tokio::task::spawn_blocking(move || {
        let mut runs = Vec::with_capacity(reqs.len());
        for (index, counts_prompt, r) in reqs {
            let (_, rx) = st.engine.submit(r).map_err(|e| {
                st.metrics.request_failed();
                ApiError::from(e)
            })?;
            runs.push(ChoiceRun { index, counts_prompt, rx });
        }
        Ok(runs)
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::from_kind(weft_engine::ErrorKind::Internal, format!("submitting the request failed: {e}"))))
}

pub struct TokenOut {
    pub id: u32,
    pub logprob: Option<f64>,
    pub top: Option<Vec<(u32, f64)>>,
    /// Length of the completion text before this token's text (completions' `text_offset`).
    pub offset: usize,
}

pub struct Collected {
    pub index: usize,
    pub text: String,
    pub tokens: Vec<TokenOut>,
    pub finish: FinishReason,
    pub usage: Usage,
}

#[derive(Clone, Copy, Default, Debug)]
pub struct Usage {
    pub prompt: usize,
    pub completion: usize,
    pub cached: usize,
}

impl Usage {
    pub fn add(&mut self, o: Usage) {
        self.prompt += o.prompt;
        self.completion += o.completion;
        self.cached += o.cached;
    }
    pub fn json(&self) -> Value {
        json!({"prompt_tokens": self.prompt, "completion_tokens": self.completion, "total_tokens": self.prompt + self.completion, "prompt_tokens_details": {"cached_tokens": self.cached}})
    }
    /// What a finished choice adds to its request's usage.
    pub fn of(counts_prompt: bool, prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Usage {
        if counts_prompt {
            Usage { prompt: prompt_tokens, completion: completion_tokens, cached: cached_tokens }
        } else {
            Usage { prompt: 0, completion: completion_tokens, cached: 0 }
        }
    }
}

/// Runs one choice to its end.
pub async fn collect(state: &AppState, mut run: ChoiceRun) -> Result<Collected, ApiError> {
    let mut timer = RequestTimer::start(state.metrics.clone());
    let (mut text, mut tokens) = (String::new(), vec![]);
    while let Some(ev) = run.rx.recv().await {
        match ev {
            Event::Token { id, text: t, logprob, top_logprobs } => {
                timer.token();
                tokens.push(TokenOut { id, logprob, top: top_logprobs, offset: text.len() });
                text.push_str(&t);
            }
            Event::Finished { reason, prompt_tokens, completion_tokens, cached_tokens, text_tail } => {
                timer.finish(reason);
                text.push_str(&text_tail);
                let usage = Usage::of(run.counts_prompt, prompt_tokens, completion_tokens, cached_tokens);
                return Ok(Collected { index: run.index, text, tokens, finish: reason, usage });
            }
            Event::Error { message, kind } => {
                timer.fail();
                return Err(ApiError::from_kind(kind, message));
            }
        }
    }
    timer.fail();
    Err(ApiError::from_kind(weft_engine::ErrorKind::Unavailable, "the engine stopped before the request finished".into()))
}

/// Collects every choice concurrently, ordered by index; the first failure fails the request
/// (and drops, so aborts, the others).
pub async fn collect_all(state: &AppState, runs: Vec<ChoiceRun>) -> Result<(Vec<Collected>, Usage), ApiError> {
    let mut out = futures_util::future::try_join_all(runs.into_iter().map(|r| collect(state, r))).await?;
    out.sort_by_key(|c| c.index);
    let mut usage = Usage::default();
    for c in &out {
        usage.add(c.usage);
    }
    Ok((out, usage))
}

/// All choices' events as one stream of `(choice index, counts_prompt, event)`.
pub fn merged(runs: Vec<ChoiceRun>) -> impl Stream<Item = (usize, bool, Event)> + Send {
    select_all(runs.into_iter().map(|r| {
        let (i, c) = (r.index, r.counts_prompt);
        UnboundedReceiverStream::new(r.rx).map(move |e| (i, c, e))
    }))
}

/// JSON cannot carry -inf; OpenAI reports impossible tokens as -9999.
pub fn finite(lp: f64) -> f64 {
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}
