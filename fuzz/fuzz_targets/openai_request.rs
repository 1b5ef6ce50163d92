//! The OpenAI routes in process (the demo model on the CPU backend): the input is a request body
//! sent to both `/v1/completions` and `/v1/chat/completions`. Every answer must be a success or
//! an OpenAI-shaped 4xx; a 5xx, a panic or an error body that is not the error object is a
//! crash. Generation lengths of bodies that parse as JSON are clamped so an input runs in
//! milliseconds (the length checks themselves are in the end-to-end bad-input table).

#![no_main]
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::path::Path;
use std::sync::OnceLock;
use tower::ServiceExt;
use weft_server::testing::clamp_lengths;

struct World {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let state = weft_server::testing::cpu_state(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo"));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        World { rt, app: weft_server::router(state) }
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let body = match serde_json::from_slice::<Value>(data) {
        Ok(mut v) => {
            clamp_lengths(&mut v);
            serde_json::to_vec(&v).unwrap()
        }
        Err(_) => data.to_vec(),
    };
    for route in ["/v1/completions", "/v1/chat/completions"] {
        let req = Request::post(route).header("content-type", "application/json").body(Body::from(body.clone())).unwrap();
        let (status, bytes) = w.rt.block_on(async {
            let resp = w.app.clone().oneshot(req).await.unwrap();
            let status = resp.status();
            (status, resp.into_body().collect().await.unwrap().to_bytes())
        });
        assert!(!status.is_server_error(), "{route} answered {status}: {}", String::from_utf8_lossy(&bytes));
        if !status.is_success() {
            let j: Value = serde_json::from_slice(&bytes).expect("an error body is JSON");
            assert!(j["error"]["message"].as_str().is_some_and(|m| !m.is_empty()) && j["error"]["type"].is_string(), "not an OpenAI error: {j}");
        }
    }
});
