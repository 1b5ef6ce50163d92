//! Mutation fuzzing of what a checkpoint directory feeds the loader, on stable Rust (the CI
//! stand-in for cargo-fuzz targets): `config.json` (JSON-level: a field set to a hostile value
//! or removed; byte-level: flips, cuts, junk), the safetensors header (bytes of its length
//! prefix and JSON), and chat templates (byte-level mutations of the demo's template, rendered
//! with a conversation). Every case must load/render or fail with an error — never panic —
//! and a case that loads must be able to run a forward step. `WEFT_FUZZ_CASES` scales the run.

mod common;
use common::*;
use serde_json::{json, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use weft_backend::cpu::CpuBackend;
use weft_model::generate::{generate, GenerateRequest};
use weft_model::sampling::SamplingParams;
use weft_model::tokenizer::{render_template, ChatMessage};
use weft_model::LoadedModel;

fn cases(default: usize) -> usize {
    std::env::var("WEFT_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).map_or(default, |n: usize| n.max(1))
}

/// Byte-level mutations: flip bits, cut, duplicate a span, insert junk.
fn mutate_bytes(r: &mut Rng, b: &mut Vec<u8>, range: std::ops::Range<usize>) {
    let (lo, hi) = (range.start, range.end.min(b.len()).max(range.start + 1));
    for _ in 0..1 + r.below(4) {
        if b.len() <= lo {
            return;
        }
        let i = lo + r.below(hi.min(b.len()) - lo);
        match r.below(4) {
            0 => b[i] ^= 1 << r.below(8),
            1 => b[i] = [b'{', b'}', b'"', b'0', b'9', b'-', b',', b':', b'[', 0, 0xff][r.below(11)],
            2 => {
                let n = 1 + r.below(8).min(b.len() - i);
                let span: Vec<u8> = b[i..(i + n).min(b.len())].to_vec();
                b.splice(i..i, span);
            }
            _ => {
                let n = 1 + r.below(16);
                b.drain(i..(i + n).min(b.len()));
            }
        }
    }
}

fn hostile(r: &mut Rng) -> Value {
    [
        json!(-1),
        json!(0),
        json!(1),
        json!(3),
        json!(2147483648u64),
        json!(18446744073709551615u64),
        json!(1e308),
        json!(-1e308),
        json!(0.5),
        json!("7"),
        json!(null),
        json!(true),
        json!([]),
        json!({}),
        json!([128, 128]),
        json!("x"),
    ][r.below(16)]
    .clone()
}

/// Loads `dir`: whether it loaded (and ran), or a panic as an error string starting "PANIC".
fn load(dir: &Path) -> Result<bool, String> {
    match catch_unwind(AssertUnwindSafe(|| LoadedModel::open(dir, CpuBackend::new()))) {
        Err(p) => Err(format!("PANIC {:?}", p.downcast_ref::<String>().map(String::as_str).or(p.downcast_ref::<&str>().copied()))),
        Ok(Err(e)) => {
            let e = e.to_string();
            assert!(!e.is_empty());
            Ok(false)
        }
        Ok(Ok(lm)) => {
            // It loaded: a forward step over two tokens must work or fail cleanly.
            let req = GenerateRequest { prompt_ids: vec![0, 1], max_tokens: 2, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: None, stop_ids: vec![] };
            match catch_unwind(AssertUnwindSafe(|| generate(&lm.model, &req))) {
                Err(_) => Err("PANIC in a forward step of a model that loaded".into()),
                Ok(_) => Ok(true),
            }
        }
    }
}

fn report(what: &str, n: usize, loaded: usize, failures: Vec<String>) {
    eprintln!("{what}: {n} cases, {loaded} accepted (loaded and ran, or rendered), {} panics", failures.len());
    assert!(failures.is_empty(), "{what}: {} of {n} cases panicked, e.g.:\n{}", failures.len(), failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n"));
}

#[test]
fn mutated_configs_load_or_fail_cleanly() {
    let t = copy_fixture();
    let path = t.path().join("config.json");
    let orig = std::fs::read(&path).unwrap();
    let base: Value = serde_json::from_slice(&orig).unwrap();
    let keys: Vec<String> = base.as_object().unwrap().keys().cloned().collect();
    let mut r = Rng(0xc0f1);
    let n = cases(400);
    let (mut failures, mut loaded) = (vec![], 0);
    for case in 0..n {
        let bytes = if case % 3 == 2 {
            let mut b = orig.clone();
            let len = b.len();
            mutate_bytes(&mut r, &mut b, 0..len);
            b
        } else {
            let mut v = base.clone();
            for _ in 0..1 + r.below(3) {
                let k = &keys[r.below(keys.len())];
                if r.below(5) == 0 {
                    v.as_object_mut().unwrap().remove(k);
                } else {
                    v[k] = hostile(&mut r);
                }
            }
            serde_json::to_vec(&v).unwrap()
        };
        std::fs::write(&path, &bytes).unwrap();
        if std::env::var("WEFT_FUZZ_TRACE").is_ok() {
            std::fs::write("/tmp/fuzz-last-config.json", &bytes).unwrap();
        }
        match load(t.path()) {
            Ok(ok) => loaded += ok as usize,
            Err(e) => failures.push(format!("{e}: {}", String::from_utf8_lossy(&bytes))),
        }
    }
    report("config.json", n, loaded, failures);
}

#[test]
fn mutated_safetensors_headers_load_or_fail_cleanly() {
    let t = copy_fixture();
    let path = t.path().join("model.safetensors");
    let orig = std::fs::read(&path).unwrap();
    let header_end = 8 + u64::from_le_bytes(orig[..8].try_into().unwrap()) as usize;
    let mut r = Rng(0x5afe);
    let n = cases(300);
    let (mut failures, mut loaded) = (vec![], 0);
    for case in 0..n {
        let mut b = orig.clone();
        // Mostly the JSON header (names, dtypes, shapes, offsets); sometimes the length prefix.
        let range = if case % 5 == 0 { 0..8 } else { 8..header_end };
        mutate_bytes(&mut r, &mut b, range);
        std::fs::write(&path, &b).unwrap();
        match load(t.path()) {
            Ok(ok) => loaded += ok as usize,
            Err(e) => {
                let hdr = String::from_utf8_lossy(&b[8..header_end.min(b.len())]).chars().take(300).collect::<String>();
                failures.push(format!("{e}: {hdr}"));
            }
        }
    }
    report("safetensors header", n, loaded, failures);
}

#[test]
fn mutated_chat_templates_render_or_fail_cleanly() {
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo/tokenizer_config.json")).unwrap()).unwrap();
    let tmpl = cfg["chat_template"].as_str().expect("the demo has a chat template").as_bytes().to_vec();
    let msgs = vec![
        ChatMessage { role: "system".into(), content: "Be brief.".into() },
        ChatMessage { role: "user".into(), content: "Hi {{ there }} {% raw %}".into() },
        ChatMessage { role: "assistant".into(), content: "Hello.".into() },
        ChatMessage { role: "user".into(), content: "And?".into() },
    ];
    let mut r = Rng(0x7e39);
    let n = cases(2000);
    let (mut failures, mut rendered) = (vec![], 0);
    for _ in 0..n {
        let mut b = tmpl.clone();
        let len = b.len();
        mutate_bytes(&mut r, &mut b, 0..len);
        let s = String::from_utf8_lossy(&b).into_owned();
        match catch_unwind(AssertUnwindSafe(|| render_template(&s, &msgs, true, "<s>", "</s>"))) {
            Err(_) => failures.push(format!("PANIC rendering {s:?}")),
            Ok(Ok(_)) => rendered += 1,
            Ok(Err(e)) => assert!(!e.to_string().is_empty()),
        }
    }
    report("chat template", n, rendered, failures);
}
