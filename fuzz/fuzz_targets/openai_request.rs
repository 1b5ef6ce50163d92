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
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use tower::ServiceExt;
use weft_engine::{Engine, EngineConfig};
use weft_model::tokenizer::TextTokenizer;
use weft_model::LoadedModel;
use weft_plugin_host::Registry;
use weft_server::{AppState, ServerConfig};

struct World {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo");
        let lm = LoadedModel::open(&demo, weft_backend::cpu::CpuBackend::new()).expect("the demo model loads");
        let tokenizer = Arc::new(TextTokenizer::from_dir(&demo).unwrap());
        let defaults = lm.defaults.clone();
        let registry = Arc::new(Registry::with_defaults(Default::default()).unwrap());
        let engine = Arc::new(Engine::start(lm, registry, EngineConfig { num_pages: 128, page_size: 64, token_budget: 512, max_sequences: 32, spec: None }).unwrap());
        let state = Arc::new(AppState::new(engine, tokenizer, defaults, ServerConfig { model_name: "demo".into(), ..Default::default() }));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        World { rt, app: weft_server::router(state) }
    })
}

fn clamp(v: &mut Value) {
    if let Value::Object(m) = v {
        for (k, lim) in [("max_tokens", 4.0), ("max_completion_tokens", 4.0), ("n", 2.0), ("best_of", 2.0), ("logprobs", 3.0), ("top_logprobs", 3.0)] {
            if m.get(k).and_then(Value::as_f64).is_some_and(|x| x > lim) {
                m.insert(k.into(), json!(lim as u64));
            }
        }
        if m.get("max_tokens").is_none() && m.get("max_completion_tokens").is_none() {
            m.insert("max_tokens".into(), json!(4));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let body = match serde_json::from_slice::<Value>(data) {
        Ok(mut v) => {
            clamp(&mut v);
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
