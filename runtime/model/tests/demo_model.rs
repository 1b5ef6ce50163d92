//! The bundled demo model (`models/demo`, trained by `scripts/demo/train_demo.py`): its held-out
//! negative log-likelihood, recomputed by weft, equals what the training script measured on the
//! same saved weights — the committed perplexity figure is weft's own.

use serde_json::Value;
use std::path::Path;
use weft_backend::cpu::CpuBackend;
use weft_model::generate::{generate, GenerateRequest};
use weft_model::sampling::SamplingParams;
use weft_model::LoadedModel;

#[test]
fn heldout_nll_matches_training_script() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("heldout.json")).unwrap()).unwrap();
    let lm = LoadedModel::open(&dir, CpuBackend::new()).unwrap();
    let check = &report["check"];
    let (mut ours_total, mut theirs_total, mut tokens) = (0f64, 0f64, 0usize);
    for (i, doc) in check["documents"].as_array().unwrap().iter().enumerate() {
        let ids: Vec<u32> = doc.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let req = GenerateRequest { prompt_ids: ids.clone(), max_tokens: 0, params: SamplingParams::default(), logprobs: Some(1), stop_ids: vec![] };
        let out = generate(&lm.model, &req).unwrap();
        let nll: f64 = (1..ids.len()).map(|p| -out.prompt_logprobs[p].as_ref().unwrap().iter().find(|(t, _)| *t == ids[p]).unwrap().1).sum();
        let theirs = check["nll"][i].as_f64().unwrap();
        assert_eq!(check["tokens"][i].as_u64().unwrap() as usize, ids.len() - 1);
        assert!((nll - theirs).abs() < 2e-3 * theirs.max(1.0), "document {i}: weft NLL {nll}, training script {theirs}");
        ours_total += nll;
        theirs_total += theirs;
        tokens += ids.len() - 1;
    }
    let (ppl_ours, ppl_theirs) = ((ours_total / tokens as f64).exp(), (theirs_total / tokens as f64).exp());
    eprintln!("demo held-out sample: {tokens} tokens, perplexity weft {ppl_ours:.4} vs training script {ppl_theirs:.4}");
    assert!((ppl_ours / ppl_theirs - 1.0).abs() < 1e-3);
    // The model is meant to write English: far below a uniform guess over its vocabulary.
    let full_ppl = report["demo"]["heldout_ppl"].as_f64().unwrap();
    assert!(full_ppl < 100.0, "held-out perplexity {full_ppl}");
}

#[test]
fn demo_draft_model_loads_and_shares_the_tokenizer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let target = LoadedModel::open(&root.join("demo"), CpuBackend::new()).unwrap();
    let draft = LoadedModel::open(&root.join("demo-draft"), CpuBackend::new()).unwrap();
    assert_eq!(target.model.cfg.vocab_size, draft.model.cfg.vocab_size);
    let text = "The quick brown fox";
    assert_eq!(target.tokenizer.encode(text, true).unwrap(), draft.tokenizer.encode(text, true).unwrap());
}
