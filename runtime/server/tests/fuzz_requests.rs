//! Mutation fuzzing of the OpenAI routes, in process and on stable Rust (the CI stand-in for a
//! cargo-fuzz target): a few thousand bodies made from valid completions and chat requests by
//! byte-level mutations (flips, cuts, duplications, junk) and JSON-level ones (a field replaced
//! by a hostile value, removed, or an unknown one added). Every answer must be a success or an
//! OpenAI-shaped 4xx — never a 5xx, a panic or a malformed error — and afterwards the server is
//! healthy with its KV pool back to full. Generation lengths are clamped so the run stays short.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use tower::ServiceExt;
use weft_server::testing::clamp_lengths;
use weft_server::AppState;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds() -> Vec<(&'static str, Value)> {
    vec![
        ("/v1/completions", json!({"model": "demo", "prompt": "Once upon a time", "max_tokens": 3, "temperature": 0})),
        ("/v1/completions", json!({"model": "demo", "prompt": ["a", "b"], "max_tokens": 2, "n": 2, "stop": ["\n", "x"], "logprobs": 2, "echo": true, "seed": 5})),
        ("/v1/completions", json!({"model": "demo", "prompt": [1, 2, 3], "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}, "top_p": 0.9, "top_k": 5, "min_p": 0.1})),
        (
            "/v1/completions",
            json!({"model": "demo", "prompt": "hi", "max_tokens": 2, "logit_bias": {"5": 10}, "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1, "stop_token_ids": [7], "sampler": "default"}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "demo", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}], "max_tokens": 3, "logprobs": true, "top_logprobs": 2}),
        ),
        ("/v1/chat/completions", json!({"model": "demo", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_completion_tokens": 2, "stream": true, "n": 2})),
    ]
}

fn hostile(r: &mut Rng) -> Value {
    let long_list: Vec<Value> = (0..300).map(|i| json!(i)).collect();
    let pool = [
        Value::Null,
        json!(-1),
        json!(0),
        json!(1e308),
        json!(-1e308),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(0.5),
        json!(""),
        json!("x".repeat(2000)),
        json!("\u{0000}\u{ffff}\u{1F600}"),
        json!([]),
        json!({}),
        json!(true),
        json!([[[[[]]]]]),
        json!({"a": {"b": {"c": []}}}),
        json!([1, "two", null, {}]),
        json!(vec!["stop"; 40]),
        Value::Array(long_list),
        json!({"role": "tool", "content": null}),
        json!([{"role": "user"}]),
        json!([{"content": "no role"}]),
        json!({"5": "ten"}),
        json!({"-3": 1}),
        json!("NaN"),
    ];
    pool[r.below(pool.len())].clone()
}

/// A random position in the JSON tree: replace, delete or add there.
fn mutate_json(v: &mut Value, r: &mut Rng, depth: usize) {
    match v {
        Value::Object(m) if !m.is_empty() && depth < 3 && r.below(3) > 0 => {
            let keys: Vec<String> = m.keys().cloned().collect();
            let k = keys[r.below(keys.len())].clone();
            match r.below(4) {
                0 => {
                    m.remove(&k);
                }
                1 => {
                    m.insert(format!("unknown_{}", r.below(100)), hostile(r));
                }
                _ => mutate_json(m.get_mut(&k).unwrap(), r, depth + 1),
            }
        }
        Value::Array(a) if !a.is_empty() && r.below(2) == 0 => {
            let i = r.below(a.len());
            mutate_json(&mut a[i], r, depth + 1)
        }
        _ => *v = hostile(r),
    }
}

fn mutate_bytes(b: &mut Vec<u8>, r: &mut Rng) {
    for _ in 0..1 + r.below(4) {
        if b.is_empty() {
            b.push(b'{');
        }
        let i = r.below(b.len());
        match r.below(5) {
            0 => b[i] ^= 1 << r.below(8),
            1 => {
                let j = (i + r.below(16)).min(b.len());
                b.drain(i..j);
            }
            2 => {
                let j = (i + r.below(16)).min(b.len());
                let dup: Vec<u8> = b[i..j].to_vec();
                b.splice(i..i, dup);
            }
            3 => b.truncate(i),
            _ => {
                let junk = [b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', 0xff, 0xc3, b'0', b'e', b'-'];
                b.insert(i, junk[r.below(junk.len())]);
            }
        }
    }
}

fn state() -> Arc<AppState> {
    weft_server::testing::cpu_state(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_requests_get_success_or_a_clear_4xx() {
    let st = state();
    let app = weft_server::router(st.clone());
    let mut r = Rng(20261202);
    let cases = std::env::var("WEFT_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000usize);
    let (mut ok, mut rejected) = (0, 0);
    let mut by_status = std::collections::BTreeMap::new();
    for case in 0..cases {
        let seeds = seeds();
        let (route, mut v) = seeds[r.below(seeds.len())].clone();
        let body: Vec<u8> = if r.below(3) == 0 {
            let mut b = serde_json::to_vec(&v).unwrap();
            mutate_bytes(&mut b, &mut r);
            // a byte mutation that still parses gets its lengths clamped too
            match serde_json::from_slice::<Value>(&b) {
                Ok(mut p) => {
                    clamp_lengths(&mut p);
                    serde_json::to_vec(&p).unwrap()
                }
                Err(_) => b,
            }
        } else {
            for _ in 0..1 + r.below(3) {
                mutate_json(&mut v, &mut r, 0);
            }
            clamp_lengths(&mut v);
            serde_json::to_vec(&v).unwrap()
        };
        let req = Request::post(route).header("content-type", "application/json").body(Body::from(body.clone())).unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        *by_status.entry(status.as_u16()).or_insert(0) += 1;
        let shown = || {
            format!(
                "case {case}: {route} {}\n-> {status} {}",
                String::from_utf8_lossy(&body).chars().take(400).collect::<String>(),
                String::from_utf8_lossy(&bytes).chars().take(400).collect::<String>()
            )
        };
        assert!(!status.is_server_error(), "server error: {}", shown());
        if status == StatusCode::OK {
            ok += 1;
            let text = String::from_utf8_lossy(&bytes);
            let good = if text.starts_with("data: ") {
                text.trim_end().ends_with("data: [DONE]")
            } else {
                serde_json::from_slice::<Value>(&bytes).is_ok_and(|j| j["choices"].is_array() && j["usage"].is_object())
            };
            assert!(good, "malformed success: {}", shown());
        } else {
            rejected += 1;
            let j: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("error body is not JSON: {}", shown()));
            assert!(j["error"]["message"].as_str().is_some_and(|m| !m.is_empty()) && j["error"]["type"].is_string(), "not an OpenAI error: {}", shown());
        }
    }
    eprintln!("{cases} mutated requests: {ok} succeeded, {rejected} rejected; by status {by_status:?}");
    assert!(ok > cases / 20 && rejected > cases / 4, "the mutations should exercise both paths: {ok} ok, {rejected} rejected");
    // Healthy afterwards, nothing leaked.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let s = st.engine.stats();
        if s.running == 0 && s.waiting == 0 {
            assert_eq!(s.free_pages, s.total_pages, "pages leaked");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "engine still busy");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let h = app.oneshot(Request::get("/health").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(h.status(), StatusCode::OK);
}
