//! The checkpoint targets' shared part: a private copy of the small fp8 golden fixture (one
//! file of it replaced per input), loaded on the CPU backend; a model that loads must run a
//! two-token forward step. Errors are fine; a panic, an abort or a hang is a crash.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use weft_backend::cpu::CpuBackend;
use weft_model::generate::{generate, GenerateRequest};
use weft_model::sampling::SamplingParams;
use weft_model::LoadedModel;

fn dir() -> &'static PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/kimi-fp8-partial-blocks");
        let t = tempfile::tempdir().unwrap().keep();
        for e in std::fs::read_dir(&fixture).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, t.join(p.file_name().unwrap())).unwrap();
        }
        t
    })
}

/// Writes `data` as the fixture's `file` and loads (and runs) the result.
pub fn load_with(file: &str, data: &[u8]) {
    let d = dir();
    std::fs::write(d.join(file), data).unwrap();
    match LoadedModel::open(d, CpuBackend::new()) {
        Err(e) => assert!(!e.to_string().is_empty()),
        Ok(lm) => {
            let req = GenerateRequest { prompt_ids: vec![0, 1], max_tokens: 2, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: None, stop_ids: vec![] };
            let _ = generate(&lm.model, &req);
        }
    }
}
