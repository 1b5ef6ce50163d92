//! Reading request bodies: the size limit and JSON errors become OpenAI-shaped errors, and a
//! value of the wrong type is reported with the path of the field that holds it.

use crate::error::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

/// How far past its limit an oversize body is still read (and dropped) before the 413 goes
/// out, in multiples of the limit.
const DRAIN_FACTOR: usize = 4;

fn too_large(limit: usize) -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is larger than the server's limit of {limit} bytes")).with_code("body_too_large")
}

/// Middleware for routes with a body limit: reads the whole body first. One over `limit` is
/// read on and dropped (up to `DRAIN_FACTOR` × the limit) before the 413 is sent: answering
/// while the client is still sending makes the server close a connection with unread data, and
/// the client then sees a reset instead of the answer. A body within the limit goes on as is.
pub async fn limit_body(State(limit): State<usize>, req: Request, next: Next) -> Response {
    use futures_util::StreamExt;
    let (parts, body) = req.into_parts();
    let mut stream = body.into_data_stream();
    let (mut kept, mut seen) = (Vec::new(), 0usize);
    while let Some(chunk) = stream.next().await {
        let Ok(data) = chunk else { return ApiError::bad_request("could not read the request body").into_response() };
        seen += data.len();
        if seen <= limit {
            kept.extend_from_slice(&data);
        } else if seen > limit.saturating_mul(DRAIN_FACTOR) {
            break;
        }
    }
    if seen > limit {
        return too_large(limit).into_response();
    }
    next.run(Request::from_parts(parts, Body::from(kept))).await
}

/// The body bytes, or 413 when the body is over the route's limit.
pub fn bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|e| if e.status() == StatusCode::PAYLOAD_TOO_LARGE { too_large(limit) } else { ApiError::bad_request(format!("could not read the request body: {e}")) })
}

/// Parses JSON into `T`; a type error names the field (`messages[0].content: invalid type ...`).
pub fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::bad_request("the request body is empty; expected a JSON object").with_code("invalid_json"));
    }
    // Syntax errors first, so they are not reported as type errors of some field.
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")).with_code("invalid_json"))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object").with_code("invalid_json"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." {
            ApiError::bad_request(format!("invalid request: {inner}"))
        } else {
            ApiError::param(&path, format!("invalid value for `{path}`: {inner}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct R {
        a: Option<u32>,
        b: Vec<Inner>,
    }
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Inner {
        c: String,
    }

    #[test]
    fn type_errors_name_the_field() {
        let e = json::<R>(br#"{"a": "x", "b": []}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("a"));
        let e = json::<R>(br#"{"b": [{"c": 3}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("b[0].c"), "{}", e.message);
        let e = json::<R>(br#"{"a": 1"#).unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = json::<R>(br#"[1]"#).unwrap_err();
        assert!(e.message.contains("JSON object"));
        let e = json::<R>(br#"{}"#).unwrap_err();
        assert!(e.message.contains("missing field `b`"), "{}", e.message);
    }
}
