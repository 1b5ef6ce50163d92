//! The small routes: `/v1/models`, `/health`, `/metrics`, and the JSON 404/405 answers.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": state.started, "owned_by": "weft",
        "max_model_len": state.engine.max_context(),
    }]}))
    .into_response()
}

pub fn engine_json(state: &AppState) -> Value {
    let s = state.engine.stats();
    json!({
        "running": s.running, "waiting": s.waiting,
        "kv_pages": {"total": s.total_pages, "free": s.free_pages, "cached": s.cached_pages},
        "prefix_cache": {"hit_tokens": s.prefix_hit_tokens, "query_tokens": s.prefix_query_tokens},
        "prompt_tokens": s.prompt_tokens, "generated_tokens": s.generated_tokens, "steps": s.steps,
        "preemptions": s.preemptions, "finished": s.finished, "aborted": s.aborted, "failed": s.failed,
        "speculative": {"drafter": (!s.spec_drafter.is_empty()).then_some(s.spec_drafter), "verify_steps": s.spec_rounds, "draft_tokens": s.spec_drafted, "accepted_tokens": s.spec_accepted},
        "recorded_steps": {"recorded": s.steps_recorded, "replayed": s.steps_replayed, "failed": s.steps_record_failed},
    })
}

pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.engine.is_running() {
        Json(json!({"status": "ok", "model": state.model_name, "engine": engine_json(&state)})).into_response()
    } else {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine's step loop is not running").into_response()
    }
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let text = state.metrics.render(&state.engine.stats(), &state.engine.registry().list());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

pub async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::new(StatusCode::NOT_FOUND, format!("no route {}", uri.path())).into_response()
}

pub async fn method_not_allowed() -> Response {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route").into_response()
}
