//! `--load-format dummy`: a model built from config.json alone runs, is deterministic, and its
//! logits stay finite through every layer (weights scaled by 1/sqrt(fan-in)).

use std::path::Path;
use weft_backend::cpu::CpuBackend;
use weft_model::generate::{generate, GenerateRequest};
use weft_model::sampling::SamplingParams;
use weft_model::LoadedModel;

#[test]
fn dummy_weights_run_deterministically() {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let run = || {
        let lm = LoadedModel::open_dummy(&demo, CpuBackend::new(), &demo).unwrap();
        let req = GenerateRequest { prompt_ids: vec![0, 75, 76, 300, 1200], max_tokens: 6, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: Some(3), stop_ids: vec![] };
        generate(&lm.model, &req).unwrap()
    };
    let (a, b) = (run(), run());
    assert_eq!(a.token_ids, b.token_ids);
    assert_eq!(a.token_ids.len(), 6);
    for lp in a.logprobs.iter().flatten() {
        assert!(lp.1.is_finite() && lp.1 <= 0.0, "{lp:?}");
    }
    // Not the trained weights: the dummy model does not continue the way the demo model does.
    let real = LoadedModel::open(&demo, CpuBackend::new()).unwrap();
    let r = generate(&real.model, &GenerateRequest { prompt_ids: vec![0, 75, 76, 300, 1200], max_tokens: 6, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: None, stop_ids: vec![] }).unwrap();
    assert_ne!(r.token_ids, a.token_ids);
}

#[test]
fn dummy_needs_a_config() {
    let dir = std::env::temp_dir().join(format!("weft-dummy-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let err = LoadedModel::open_dummy(&dir, CpuBackend::new(), &demo).err().expect("no config.json");
    assert!(err.to_string().contains("config.json"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
