//! Golden tests: every fixture under `tests/golden/` (a tiny checkpoint in the published layout
//! plus `reference.json` from transformers in float64) must be reproduced by the CPU backend:
//! prompt log-probabilities within 1e-3, greedy continuations identical wherever the
//! reference's top-2 margin is clear.

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use weft_backend::cpu::CpuBackend;
use weft_model::generate::{generate, GenerateRequest};
use weft_model::sampling::SamplingParams;
use weft_model::LoadedModel;

const LOGPROB_TOL: f64 = 1e-3;
const MARGIN: f64 = 1e-3;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

fn fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(golden_dir()).unwrap().filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("reference.json").exists()).collect();
    v.sort();
    assert!(v.len() >= 2, "expected the committed golden fixtures in {}", golden_dir().display());
    v
}

fn check_fixture(dir: &Path) {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let lm = LoadedModel::open(dir, CpuBackend::new()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let mut worst = 0f64;
    let mut compared_greedy = 0;
    for (ci, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
        let prompt: Vec<u32> = case["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let want_greedy: Vec<u32> = case["greedy_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let margins: Vec<f64> = case["greedy_margins"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let req =
            GenerateRequest { prompt_ids: prompt.clone(), max_tokens: want_greedy.len(), params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: Some(20), stop_ids: vec![] };
        let out = generate(&lm.model, &req).unwrap();
        // Prompt log-probabilities.
        let plp = case["prompt_logprobs"].as_array().unwrap();
        assert_eq!(out.prompt_logprobs.len(), prompt.len(), "{name} case {ci}");
        assert!(out.prompt_logprobs[0].is_none() && plp[0].is_null());
        for i in 1..prompt.len() {
            let ours: HashMap<u32, f64> = out.prompt_logprobs[i].as_ref().unwrap().iter().copied().collect();
            let want_tok = plp[i]["token"].as_f64().unwrap();
            let got_tok = ours[&prompt[i]];
            worst = worst.max((got_tok - want_tok).abs());
            assert!((got_tok - want_tok).abs() < LOGPROB_TOL, "{name} case {ci} position {i}: logprob of prompt token {} is {got_tok}, reference {want_tok}", prompt[i]);
            for (id, lp) in plp[i]["top"].as_object().unwrap() {
                let id: u32 = id.parse().unwrap();
                let want = lp.as_f64().unwrap();
                let got = *ours.get(&id).unwrap_or_else(|| panic!("{name} case {ci} position {i}: reference top token {id} ({want}) missing from our top 20"));
                worst = worst.max((got - want).abs());
                assert!((got - want).abs() < LOGPROB_TOL, "{name} case {ci} position {i}: token {id} logprob {got} vs reference {want}");
            }
        }
        // Greedy continuation: identical until the first position whose reference margin is
        // within noise (after that the two runs may legitimately condition on different text).
        for (j, (&g, &w)) in out.token_ids.iter().zip(&want_greedy).enumerate() {
            if margins[j] <= MARGIN {
                break;
            }
            assert_eq!(g, w, "{name} case {ci}: greedy token {j} differs (reference margin {})", margins[j]);
            compared_greedy += 1;
        }
    }
    eprintln!("{name}: worst logprob error {worst:.2e}, {compared_greedy} greedy tokens compared");
    assert!(compared_greedy > 40, "{name}: too few greedy tokens had a clear margin ({compared_greedy})");
}

#[test]
fn golden_fixtures_match_transformers_float64() {
    for dir in fixtures() {
        check_fixture(&dir);
    }
}

/// A bf16 latent cache (`set_kv_dtype`) reaches the CPU backend's store: prompt log-probabilities
/// move off the f32 cache's (the rounding happened) and stay within bf16 tolerance of the float64
/// reference.
#[test]
fn golden_fixtures_with_a_bf16_latent_cache() {
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let mut lm = LoadedModel::open(&dir, CpuBackend::new()).unwrap();
        let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
        let (mut from_ref, mut from_f32) = (0f64, 0f64);
        for case in reference["cases"].as_array().unwrap().iter().take(2) {
            let prompt: Vec<u32> = case["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            let req = GenerateRequest { prompt_ids: prompt.clone(), max_tokens: 1, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: Some(1), stop_ids: vec![] };
            let mut runs = vec![];
            for dtype in [weft_backend::KvDtype::F32, weft_backend::KvDtype::Bf16] {
                lm.model.set_kv_dtype(dtype);
                let out = generate(&lm.model, &req).unwrap();
                runs.push((1..prompt.len()).map(|i| out.prompt_logprobs[i].as_ref().unwrap().iter().find(|(id, _)| *id == prompt[i]).unwrap().1).collect::<Vec<f64>>());
            }
            let plp = case["prompt_logprobs"].as_array().unwrap();
            for (i, (&a, &b)) in runs[0].iter().zip(&runs[1]).enumerate() {
                from_ref = from_ref.max((b - plp[i + 1]["token"].as_f64().unwrap()).abs());
                from_f32 = from_f32.max((b - a).abs());
            }
        }
        eprintln!("{name}: bf16 latent cache, worst prompt logprob error {from_ref:.2e} (from the f32 cache's: {from_f32:.2e})");
        assert!(from_f32 > 1e-6, "{name}: the bf16 cache changed nothing ({from_f32:e}): was it used?");
        assert!(from_ref < 5e-2, "{name}: bf16 cache logprob error {from_ref} above 5e-2");
    }
}
