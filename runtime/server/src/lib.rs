//! weft's OpenAI-compatible HTTP server. Routes: `POST /v1/completions`,
//! `POST /v1/chat/completions` (both with SSE streaming), `GET /v1/models`, `GET /health`,
//! `GET /metrics` (Prometheus), `GET /openapi.json` (this API's description), and the operator's
//! `/admin` API. Handlers validate and turn
//! requests into engine requests; the engine (its own thread) does the work; dropping a
//! request's event receiver (client gone) aborts it.

pub mod admin;
pub mod body;
pub mod chat;
pub mod choices;
pub mod completions;
pub mod error;
pub mod logprobs;
pub mod metrics;
pub mod openapi;
pub mod params;
pub mod protocol;
pub mod routes;
pub mod state;
pub mod stream;
#[doc(hidden)]
pub mod testing;

pub use state::{AppState, ServerConfig};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Every route of the server.
pub fn router(state: Arc<AppState>) -> Router {
    let openai = Router::new()
        .route("/v1/completions", post(completions::handler))
        .route("/v1/chat/completions", post(chat::handler))
        .layer(DefaultBodyLimit::max(state.cfg.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(state.cfg.max_body_bytes, body::limit_body));
    Router::new()
        .merge(openai)
        .route("/v1/models", get(routes::models))
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .route("/openapi.json", get(openapi::handler))
        .merge(admin::routes(state.clone()))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .with_state(state)
}

/// Serves until `shutdown` resolves, then stops accepting connections and lets in-flight
/// requests finish for up to `grace`; whatever is still running after that is dropped
/// (its engine requests abort). The caller shuts the engine down afterwards.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<AppState>, shutdown: impl Future<Output = ()> + Send + 'static, grace: Duration) -> std::io::Result<()> {
    let sampler = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                state.metrics.sample_tokens(state.engine.stats().generated_tokens);
            }
        })
    };
    let signalled = Arc::new(tokio::sync::Notify::new());
    let notify = signalled.clone();
    let server = axum::serve(listener, router(state)).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: no new connections; waiting for in-flight requests");
        notify.notify_one();
    });
    let res = tokio::select! {
        r = server => r,
        _ = async { signalled.notified().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(grace_secs = grace.as_secs_f64(), "grace period over: aborting the requests still in flight");
            Ok(())
        }
    };
    sampler.abort();
    res
}
