//! `weft generate` end to end: the JSON output's shape and content on a golden fixture, text
//! prompts through the tokenizer and chat template, and bad arguments as one-line errors.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden").join(name)
}

fn weft(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn json_output_matches_reference_greedy_and_logprobs() {
    let dir = fixture("v3-qlora-yarn-groups");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let case = &reference["cases"][1];
    let ids: Vec<String> = case["prompt_ids"].as_array().unwrap().iter().map(|x| x.to_string()).collect();
    let (ok, stdout, stderr) =
        weft(&["generate", "--model", dir.to_str().unwrap(), "--prompt-ids", &ids.join(","), "--max-tokens", "8", "--temperature", "0", "--logprobs", "3", "--json", "--ignore-eos"]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["prompt_token_ids"], case["prompt_ids"]);
    let want: Vec<Value> = case["greedy_ids"].as_array().unwrap()[..8].to_vec();
    assert_eq!(v["token_ids"].as_array().unwrap(), &want);
    assert!(v["text"].is_string());
    let plp = v["prompt_logprobs"].as_array().unwrap();
    assert_eq!(plp.len(), ids.len());
    assert!(plp[0].is_null());
    // Each later entry holds the top 3 plus the actual prompt token, ids as strings.
    for (i, entry) in plp.iter().enumerate().skip(1) {
        let m = entry.as_object().unwrap();
        assert!(m.len() == 3 || m.len() == 4);
        let tok = &ids[i];
        let want = case["prompt_logprobs"][i]["token"].as_f64().unwrap();
        assert!((m[tok].as_f64().unwrap() - want).abs() < 1e-3);
    }
    let lp = v["logprobs"].as_array().unwrap();
    assert_eq!(lp.len(), 8);
    for (j, m) in lp.iter().enumerate() {
        let tok = want[j].to_string();
        let m = m.as_object().unwrap();
        assert!(m.contains_key(&tok), "generated token must be in its logprobs map");
        assert!(m.values().all(|x| x.as_f64().unwrap() <= 0.0));
    }
}

#[test]
fn text_prompt_and_chat_template() {
    let dir = fixture("kimi-fp8-partial-blocks");
    let (ok, stdout, stderr) = weft(&["generate", "--model", dir.to_str().unwrap(), "--prompt", "We hold these truths", "--max-tokens", "4", "--temperature", "0", "--json"]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["prompt_token_ids"][0], 0, "BOS added by the tokenizer's post-processor");
    let (ok, stdout, stderr) = weft(&["generate", "--model", dir.to_str().unwrap(), "--prompt", "Hi", "--chat", "--max-tokens", "2", "--seed", "1", "--temperature", "0.7", "--json"]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    let p: Vec<u64> = v["prompt_token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(p[0], 0, "chat template starts with bos_token");
    assert_eq!(p[1], 2, "then the user marker");
    assert_eq!(*p.last().unwrap(), 3, "generation prompt: the assistant marker");
}

#[test]
fn seeded_sampling_is_reproducible() {
    let dir = fixture("kimi-fp8-partial-blocks");
    let args = ["generate", "--model", dir.to_str().unwrap(), "--prompt-ids", "0,5,6,7", "--max-tokens", "12", "--temperature", "1.0", "--top-p", "0.9", "--seed", "1234", "--json", "--ignore-eos"];
    let (ok1, a, _) = weft(&args);
    let (ok2, b, _) = weft(&args);
    assert!(ok1 && ok2);
    assert_eq!(a, b);
}

#[test]
fn bad_arguments_are_clear_one_line_errors() {
    let dir = fixture("kimi-fp8-partial-blocks");
    let d = dir.to_str().unwrap();
    for (args, needle) in [
        (vec!["generate", "--model", d, "--prompt-ids", "0,99999"], "99999"),
        (vec!["generate", "--model", d, "--prompt-ids", "0,1", "--temperature=-1"], "--temperature"),
        (vec!["generate", "--model", d, "--prompt-ids", "0,1", "--top-p", "0"], "--top-p"),
        (vec!["generate", "--model", d, "--prompt-ids", "0,1", "--max-tokens", "5000"], "context length"),
        (vec!["generate", "--model", "/no/such/dir", "--prompt", "x"], "/no/such/dir"),
        (vec!["generate", "--model", d], "--prompt"),
    ] {
        let (ok, _, stderr) = weft(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
