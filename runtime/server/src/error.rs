//! Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status a client expects (400 invalid parameter naming it, 404 unknown model, 413 oversize
//! body, 429 overload, 503 unavailable, 500 internal).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use weft_engine::{ErrorKind, SubmitError};

#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None, code: None }
    }

    /// 400 for a parameter: the message names it and `param` carries it.
    pub fn param(param: &str, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: Some(param.to_string()), code: Some("invalid_parameter") }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn error_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.error_type(), "param": self.param, "code": self.code}})
    }

    /// A failure of a queued request, by kind.
    pub fn from_kind(kind: ErrorKind, message: String) -> Self {
        let (status, code) = match kind {
            ErrorKind::Overloaded => (StatusCode::TOO_MANY_REQUESTS, "overloaded"),
            ErrorKind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ErrorKind::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "kv_cache_too_small"),
            ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        };
        ApiError { status, message, param: None, code: Some(code) }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Invalid(m) => ApiError::bad_request(m),
            SubmitError::Rejected { reason, retry } => ApiError::from_kind(if retry { ErrorKind::Overloaded } else { ErrorKind::Unavailable }, reason),
            SubmitError::Unavailable(m) => ApiError::from_kind(ErrorKind::Unavailable, m),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = self.status.as_u16(), message = %self.message, "request failed");
        }
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}
