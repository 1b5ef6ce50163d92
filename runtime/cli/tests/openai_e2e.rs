//! The server end to end over real HTTP: starts `weft serve` on the demo model and runs the
//! Python suite in `tests/e2e` with the official `openai` client (installed by
//! `scripts/setup-e2e.sh` into `.venv-e2e`): completions and chat, streaming, `n`, stop
//! strings, seeds, logprobs, greedy output identical to `weft generate`, the bad-input table,
//! the admin API, prefix caching, and 64 concurrent streams with disconnects and a plugin
//! swap. Then SIGTERM with a stream in flight: the stream completes and the server exits 0.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "e2e-admin-token";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Kills the server if a test fails before it shut it down.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--port", "0", "--admin-token", TOKEN])
        .args(if extra.iter().any(|a| a.starts_with("--kv-memory")) { &[][..] } else { &["--num-pages", "256"][..] })
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let addr = line.split("http://").nth(1).and_then(|s| s.split_whitespace().next()).unwrap_or_else(|| panic!("no address in {line:?}")).to_string();
    Server { child, addr }
}

fn generate(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_weft")).arg("generate").args(args).args(["--json", "--temperature", "0", "--ignore-eos"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn python() -> String {
    let out = Command::new("bash").arg(root().join("scripts/setup-e2e.sh")).output().expect("running scripts/setup-e2e.sh");
    assert!(out.status.success(), "scripts/setup-e2e.sh failed (it installs the openai client from PyPI):\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn openai_client_suite_against_a_live_server() {
    let py = python();
    // References from `weft generate` (the single-sequence reference path).
    let mut completions = vec![];
    for (prompt, n) in [("A fool and his money", "24"), ("Q: Why did the chicken cross the road?\nA:", "20")] {
        let mut v = generate(&["--prompt", prompt, "--max-tokens", n]);
        v["prompt"] = json!(prompt);
        completions.push(v);
    }
    let mut chat = generate(&["--prompt", "Tell me my fortune.", "--chat", "--max-tokens", "16"]);
    chat["prompt"] = json!("Tell me my fortune.");
    let refs = std::env::temp_dir().join(format!("weft-e2e-refs-{}.json", std::process::id()));
    std::fs::write(&refs, json!({"completions": completions, "chat": chat}).to_string()).unwrap();

    let server = start(&[]);
    let status = Command::new(&py)
        .args(["-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/e2e"])
        .current_dir(root())
        .env("WEFT_URL", format!("http://{}", server.addr))
        .env("WEFT_ADMIN_TOKEN", TOKEN)
        .env("WEFT_MODEL", "demo")
        .env("WEFT_PLUGIN_DIR", weft_plugin_host::built_plugin_dir())
        .env("WEFT_GREEDY_REF", &refs)
        .env("WEFT_SERVER_PID", server.child.id().to_string())
        .status()
        .unwrap();
    let _ = std::fs::remove_file(&refs);
    assert!(status.success(), "the Python end-to-end suite failed (output above)");
}

fn http_post_stream(addr: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    s
}

#[test]
fn sigterm_lets_in_flight_streams_finish_then_exits_zero() {
    let mut server = start(&["--shutdown-grace-secs", "60"]);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 150, "temperature": 0, "stream": true, "ignore_eos": true}).to_string();
    let mut s = http_post_stream(&server.addr, &body);
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    // Wait for the first event: the request is in flight.
    let mut got = vec![];
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("data: ") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let t = Instant::now();
    let kill = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("\"finish_reason\":\"length\""), "the in-flight stream did not finish: {text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    // New connections are refused once shutdown began.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = server.child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status after SIGTERM: {status:?}");
    assert!(TcpStream::connect(&server.addr).is_err(), "still accepting after exit");
    eprintln!("SIGTERM → in-flight stream finished and the server exited 0 in {:.2}s", t.elapsed().as_secs_f64());
}

#[test]
fn sigterm_grace_period_aborts_what_is_left() {
    let mut server = start(&["--shutdown-grace-secs", "1"]);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 1900, "temperature": 0, "stream": true, "ignore_eos": true}).to_string();
    let mut s = http_post_stream(&server.addr, &body);
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    assert!(n > 0);
    let t = Instant::now();
    Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?}", t.elapsed());
}

fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    text.lines().find(|l| l.starts_with(key)).unwrap().split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn kv_pool_sized_from_a_memory_fraction() {
    let bad = Command::new(env!("CARGO_BIN_EXE_weft")).args(["serve", "--port", "0", "--kv-memory-fraction", "1.5"]).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("must be in (0, 1]"));
    let tiny = Command::new(env!("CARGO_BIN_EXE_weft")).args(["serve", "--port", "0", "--kv-memory-fraction", "0.000001"]).output().unwrap();
    assert!(!tiny.status.success() && String::from_utf8_lossy(&tiny.stderr).contains("nothing is left for the KV cache"), "{}", String::from_utf8_lossy(&tiny.stderr));
    // Room for about 1 GiB of KV cache beyond what is in use now.
    let (total, avail) = (meminfo("MemTotal:"), meminfo("MemAvailable:"));
    let f = ((total - avail + (1 << 30)) as f64 / total as f64).min(1.0);
    let s = start(&["--kv-memory-fraction", &format!("{f:.6}")]);
    let mut line = String::new();
    // `start` consumed the banner; ask the server for its pool size instead.
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(c, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    c.read_to_string(&mut line).unwrap();
    let body: Value = serde_json::from_str(line.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let pages = body["engine"]["kv_pages"]["total"].as_u64().unwrap();
    // The demo model's page is 4 layers x 64 tokens x (latent + rope) f32: about 1 GiB / page
    // bytes pages, give or take what other processes did meanwhile.
    assert!(pages > 1000, "{pages} pages from --kv-memory-fraction {f}");
}

#[test]
fn bench_serve_drives_a_live_server() {
    let s = start(&[]);
    let json_path = std::env::temp_dir().join(format!("weft-bench-{}.json", std::process::id()));
    let png_path = json_path.with_extension("png");
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["bench", "serve", "--url", &format!("http://{}", s.addr), "--input-len", "32", "--output-len", "8", "--concurrency", "1,4", "--num-prompts", "6", "--request-rate", "50", "--json"])
        .arg(&json_path)
        .arg("--plot")
        .arg(&png_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("| conc |") && table.lines().filter(|l| l.starts_with("| 1 |") || l.starts_with("| 4 |")).count() == 2, "{table}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let png = std::fs::read(&png_path).expect("--plot wrote the chart");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "{} bytes", png.len());
    // `bench plot` redraws it from the JSON (a sweep per file).
    let replot = Command::new(env!("CARGO_BIN_EXE_weft")).args(["bench", "plot"]).arg(&json_path).arg(&json_path).arg("-o").arg(&png_path).output().unwrap();
    assert!(replot.status.success(), "{}", String::from_utf8_lossy(&replot.stderr));
    let _ = std::fs::remove_file(&json_path);
    let _ = std::fs::remove_file(&png_path);
    for level in v["results"].as_array().unwrap() {
        assert_eq!(level["completed"], 6, "{level}");
        assert_eq!(level["failed"], 0, "{level}");
        assert!(level["ttft_ms"]["median"].as_f64().unwrap() > 0.0);
        // 8 output tokens per request, as asked (ignore_eos).
        let per_req = level["output_tokens_per_s"].as_f64().unwrap() * level["duration_s"].as_f64().unwrap() / 6.0;
        assert!((per_req - 8.0).abs() < 1e-6, "{per_req}");
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_weft")).args(["bench", "serve", "--url", &format!("http://{}", s.addr), "--request-rate", "0"]).output().unwrap();
    assert!(!bad.status.success());
}

fn get_json(addr: &str, path: &str) -> Value {
    let mut c = TcpStream::connect(addr).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap()
}

/// Schemathesis (installed by scripts/setup-e2e.sh) against the server's own OpenAPI
/// description: generated valid and invalid requests on every operation, the admin API with
/// and without the token. Checks: no 5xx, every status, content type and response body as
/// documented, schema-invalid input refused, admin calls without the token refused. Left out:
/// `positive_data_acceptance`, since rules across fields (prompt plus `max_tokens` within the
/// context, token ids below the vocabulary size, `top_logprobs` only with `logprobs`) answer a
/// documented 400 naming the field to requests whose shape the schema allows.
#[test]
fn schemathesis_finds_no_server_error_and_no_schema_violation() {
    let py = python();
    let st = Path::new(&py).with_file_name("schemathesis");
    let s = start(&[]);
    let examples = std::env::var("WEFT_SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| "30".into());
    let out = Command::new(&st)
        .args(["run", &format!("http://{}/openapi.json", s.addr), "--checks", "all", "--exclude-checks", "positive_data_acceptance"])
        .args(["-n", &examples, "--seed", "1", "--generation-database", "none", "--request-timeout", "120", "--no-color"])
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}", text.lines().rev().take(14).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n"));
    assert!(out.status.success(), "schemathesis found problems:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("passed"), "{text}");
    // Nothing was lost: the server answers, nothing is left running and the pool is whole.
    let h = get_json(&s.addr, "/health");
    assert_eq!(h["status"], "ok", "{h}");
    let e = &h["engine"];
    assert_eq!((e["running"].as_u64(), e["waiting"].as_u64()), (Some(0), Some(0)), "{h}");
    assert_eq!(e["kv_pages"]["free"], e["kv_pages"]["total"], "pages leaked: {h}");
}
