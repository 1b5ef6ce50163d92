//! The operator's admin API under `/admin`, behind a bearer token (off when the server has
//! none): list plugins with versions and counters, load (upload the component bytes, or a
//! path on the server) with an optional sha256, activate a version, make a slot the default,
//! roll back, unload, set a slot's failure policy; and the engine's counters. Every change
//! is the registry's hot swap: requests in flight keep the version they started with.

use crate::body;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use weft_plugin_host::{FailurePolicy, PluginError, PluginId, PluginKind};

pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    Router::new()
        .route("/admin/plugins", get(list).post(load))
        .route("/admin/plugins/{kind}/{name}/activate", post(activate))
        .route("/admin/plugins/{kind}/{name}/rollback", post(rollback))
        .route("/admin/plugins/{kind}/{name}/default", post(set_default))
        .route("/admin/plugins/{kind}/{name}/policy", put(set_policy))
        .route("/admin/plugins/{kind}/{name}/{version}", delete(unload))
        .route("/admin/engine", get(engine))
        .layer(axum::extract::DefaultBodyLimit::max(state.cfg.max_plugin_bytes))
        .layer(axum::middleware::from_fn_with_state(state, authorize))
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authorize(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(token) = &state.cfg.admin_token else {
        return ApiError::new(StatusCode::NOT_FOUND, "the admin API is disabled; start the server with --admin-token (or WEFT_ADMIN_TOKEN) to enable it").into_response();
    };
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if ct_eq(g.trim().as_bytes(), token.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::new(StatusCode::UNAUTHORIZED, "wrong admin token").into_response(),
        None => ApiError::new(StatusCode::UNAUTHORIZED, "the admin API needs `Authorization: Bearer <admin token>`").into_response(),
    }
}

fn plugin_error(e: PluginError) -> ApiError {
    let status = match &e {
        PluginError::Invalid(_) | PluginError::Rejected(_) => StatusCode::BAD_REQUEST,
        PluginError::NotFound(_) => StatusCode::NOT_FOUND,
        PluginError::Conflict(_) => StatusCode::CONFLICT,
        PluginError::Faulted { .. } | PluginError::Host(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, e.to_string())
}

/// A path or query that axum could not decode (bad percent-encoding, a non-boolean `default`)
/// as a JSON 400 like every other error, not axum's plain-text rejection.
fn extracted<T>(r: Result<T, impl std::fmt::Display>, what: &str) -> Result<T, ApiError> {
    r.map_err(|e| ApiError::bad_request(format!("{what}: {e}")))
}

fn kind(s: &str) -> Result<PluginKind, ApiError> {
    PluginKind::parse(s).ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("unknown plugin kind {s:?}: sampler, verifier or admission")))
}

fn id_json(id: &PluginId) -> Value {
    json!({"kind": id.kind.as_str(), "name": id.name, "version": id.version, "sha256": id.sha256})
}

async fn list(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({"plugins": state.engine.registry().list()})).into_response()
}

#[derive(Deserialize, Default)]
struct LoadOptions {
    /// A path on the server (JSON body only; an uploaded body carries the bytes instead).
    path: Option<String>,
    sha256: Option<String>,
    /// An admission plugin's configuration, as JSON (a string in the query form).
    options: Option<Value>,
    /// Also make this plugin's slot the default of its kind.
    #[serde(default)]
    default: bool,
}

/// `POST /admin/plugins`: a JSON body `{"path", "sha256", "options", "default"}`, or the
/// component bytes (any other content type) with `?sha256=&options=&default=` in the query.
async fn load(State(state): State<Arc<AppState>>, q: Result<Query<LoadOptions>, QueryRejection>, headers: axum::http::HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    let res = async {
        let Query(q) = extracted(q, "the query string")?;
        let bytes = body::bytes(body, state.cfg.max_plugin_bytes)?;
        let is_json = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|c| c.starts_with("application/json"));
        let (o, wasm) = if is_json {
            let o: LoadOptions = body::json(&bytes)?;
            if o.path.is_none() {
                return Err(ApiError::param("path", "give `path` (a file on the server) or upload the component bytes with Content-Type application/wasm"));
            }
            (o, None)
        } else {
            if bytes.is_empty() {
                return Err(ApiError::bad_request("the body is empty: upload the component bytes, or send JSON with `path`"));
            }
            (q, Some(bytes))
        };
        let options = match &o.options {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => Some(v.to_string()),
        };
        let reg = state.engine.registry().clone();
        let (path, sha, default) = (o.path.clone(), o.sha256.clone(), o.default);
        // Compiling a component takes tens of milliseconds or more: off the async workers.
        let id = tokio::task::spawn_blocking(move || {
            let id = match (wasm, path) {
                (Some(b), _) => reg.load_bytes(&b, sha.as_deref(), options.as_deref()),
                (None, Some(p)) => reg.load_path(std::path::Path::new(&p), sha.as_deref(), options.as_deref()),
                (None, None) => unreachable!(),
            }?;
            if default {
                reg.set_default(id.kind, &id.name)?;
            }
            Ok::<_, PluginError>(id)
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("plugin load task: {e}")))?
        .map_err(plugin_error)?;
        tracing::info!(plugin = %id, sha256 = %id.sha256, "plugin loaded and activated");
        Ok::<_, ApiError>(Json(json!({"loaded": id_json(&id), "active": true, "default": default})).into_response())
    }
    .await;
    res.unwrap_or_else(|e| e.into_response())
}

#[derive(Deserialize)]
struct VersionBody {
    version: String,
}

async fn activate(State(state): State<Arc<AppState>>, path: Result<Path<(String, String)>, PathRejection>, body: Result<Bytes, BytesRejection>) -> Response {
    let res = (|| {
        let Path((k, name)) = extracted(path, "the path")?;
        let b: VersionBody = body::json(&body::bytes(body, state.cfg.max_body_bytes)?)?;
        let k = kind(&k)?;
        state.engine.registry().activate(k, &name, &b.version).map_err(plugin_error)?;
        Ok::<_, ApiError>(Json(json!({"kind": k.as_str(), "name": name, "active": b.version})))
    })();
    res.map(IntoResponse::into_response).unwrap_or_else(|e| e.into_response())
}

async fn rollback(State(state): State<Arc<AppState>>, path: Result<Path<(String, String)>, PathRejection>) -> Response {
    let res = (|| {
        let Path((k, name)) = extracted(path, "the path")?;
        let k = kind(&k)?;
        let v = state.engine.registry().rollback(k, &name).map_err(plugin_error)?;
        Ok::<_, ApiError>(Json(json!({"kind": k.as_str(), "name": name, "active": v})))
    })();
    res.map(IntoResponse::into_response).unwrap_or_else(|e| e.into_response())
}

async fn set_default(State(state): State<Arc<AppState>>, path: Result<Path<(String, String)>, PathRejection>) -> Response {
    let res = (|| {
        let Path((k, name)) = extracted(path, "the path")?;
        let k = kind(&k)?;
        state.engine.registry().set_default(k, &name).map_err(plugin_error)?;
        Ok::<_, ApiError>(Json(json!({"kind": k.as_str(), "default": name})))
    })();
    res.map(IntoResponse::into_response).unwrap_or_else(|e| e.into_response())
}

#[derive(Deserialize)]
struct PolicyBody {
    policy: String,
}

async fn set_policy(State(state): State<Arc<AppState>>, path: Result<Path<(String, String)>, PathRejection>, body: Result<Bytes, BytesRejection>) -> Response {
    let res = (|| {
        let Path((k, name)) = extracted(path, "the path")?;
        let b: PolicyBody = body::json(&body::bytes(body, state.cfg.max_body_bytes)?)?;
        let p = FailurePolicy::parse(&b.policy).ok_or_else(|| ApiError::param("policy", format!("`policy` is {:?}; it must be fallback, fail or reload", b.policy)))?;
        let k = kind(&k)?;
        state.engine.registry().set_policy(k, &name, p).map_err(plugin_error)?;
        Ok::<_, ApiError>(Json(json!({"kind": k.as_str(), "name": name, "failure_policy": p.as_str()})))
    })();
    res.map(IntoResponse::into_response).unwrap_or_else(|e| e.into_response())
}

async fn unload(State(state): State<Arc<AppState>>, path: Result<Path<(String, String, String)>, PathRejection>) -> Response {
    let res = (|| {
        let Path((k, name, version)) = extracted(path, "the path")?;
        let k = kind(&k)?;
        state.engine.registry().unload(k, &name, &version).map_err(plugin_error)?;
        Ok::<_, ApiError>(Json(json!({"kind": k.as_str(), "name": name, "unloaded": version})))
    })();
    res.map(IntoResponse::into_response).unwrap_or_else(|e| e.into_response())
}

async fn engine(State(state): State<Arc<AppState>>) -> Response {
    Json(crate::routes::engine_json(&state)).into_response()
}
