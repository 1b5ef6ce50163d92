//! Golden test of the multi-token-prediction module: every fixture whose config declares MTP
//! layers carries `mtp_reference.json` (tests/golden/make_mtp_reference.py: transformers'
//! decoder block in float64 fed eh_proj's output), and the CPU backend must reproduce its
//! next-next-token log-probabilities within 1e-3, with the MTP cache filled in one pass or in
//! two (the drafter catches up step by step).

use serde_json::Value;
use std::path::{Path, PathBuf};
use weft_backend::cpu::CpuBackend;
use weft_backend::{AttnRow, Backend};
use weft_model::{LoadedModel, StepBatch};

const LOGPROB_TOL: f64 = 1e-3;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let z = row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
    row.iter().map(|&x| x as f64 - z).collect()
}

/// The MTP module's log-probabilities at positions 0..n-2 of `ids`, its input fed in pieces
/// split at `cuts`.
fn mtp_logprobs(lm: &LoadedModel<CpuBackend>, ids: &[u32], cuts: &[usize]) -> Vec<Vec<f64>> {
    let m = &lm.model;
    let (be, h, n) = (&m.backend, m.cfg.hidden_size, ids.len());
    let table: Vec<u32> = vec![0];
    let page = n.next_power_of_two().max(16);
    let positions: Vec<u32> = (0..n as u32).collect();
    let mut pool = be.alloc_kv_pool(m.kv_layout(1, page)).unwrap();
    let attn: Vec<AttnRow> = (0..n).map(|p| AttnRow { block_table: &table, ctx_len: p + 1 }).collect();
    let hidden = m.forward_hidden(&mut pool, &StepBatch { tokens: ids, positions: &positions, slots: &positions, attn: &attn, exact_rows: &[] }).unwrap();
    let mut mtp_pool = be.alloc_kv_pool(m.mtp_kv_layout(1, page)).unwrap();
    let mut bounds = vec![0];
    bounds.extend(cuts.iter().copied().filter(|&c| c > 0 && c < n - 1));
    bounds.push(n - 1);
    let mut out = vec![];
    for w in bounds.windows(2) {
        let (a, b) = (w[0], w[1]);
        let prev = be.gather_rows(&hidden, h, &positions[a..b]).unwrap();
        let batch = StepBatch { tokens: &ids[a + 1..b + 1], positions: &positions[a..b], slots: &positions[a..b], attn: &attn[a..b], exact_rows: &[] };
        let g = m.mtp_forward(0, &mut mtp_pool, &batch, &prev).unwrap();
        let logits = be.download(&m.mtp_logits(0, &g).unwrap()).unwrap();
        out.extend(logits.chunks(m.cfg.vocab_size).map(log_softmax));
    }
    out
}

#[test]
fn mtp_module_matches_transformers_float64() {
    let mut checked = 0;
    for dir in std::fs::read_dir(golden_dir()).unwrap().map(|e| e.unwrap().path()) {
        let Ok(cfg) = std::fs::read_to_string(dir.join("config.json")) else { continue };
        let cfg: Value = serde_json::from_str(&cfg).unwrap();
        if cfg["num_nextn_predict_layers"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let reference: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("mtp_reference.json")).unwrap_or_else(|e| panic!("{name}: declares MTP layers but has no mtp_reference.json ({e})"))).unwrap();
        let lm = LoadedModel::open(&dir, CpuBackend::new()).unwrap();
        assert_eq!(lm.model.mtp_layers(), 1, "{name}");
        let mut worst = 0f64;
        for (ci, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
            let ids: Vec<u32> = case["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            let want = case["mtp_logprobs"].as_array().unwrap();
            let whole = mtp_logprobs(&lm, &ids, &[]);
            let pieces = mtp_logprobs(&lm, &ids, &[1, ids.len() / 2]);
            assert_eq!(whole.len(), want.len(), "{name} case {ci}");
            for (p, row) in want.iter().enumerate() {
                for (id, lp) in row["top"].as_object().unwrap() {
                    let (id, lp) = (id.parse::<usize>().unwrap(), lp.as_f64().unwrap());
                    let err = (whole[p][id] - lp).abs();
                    worst = worst.max(err);
                    assert!(err < LOGPROB_TOL, "{name} case {ci} position {p}: token {id} MTP logprob {} vs reference {lp}", whole[p][id]);
                    assert!((pieces[p][id] - whole[p][id]).abs() < 1e-5, "{name} case {ci} position {p}: the MTP cache filled in pieces disagrees");
                }
            }
        }
        eprintln!("{name}: MTP worst logprob error {worst:.2e}");
        checked += 1;
    }
    assert!(checked > 0, "no golden fixture has an MTP layer");
}

/// `LoadOptions { mtp: false }` leaves the MTP layer on disk; the forward pass is unchanged.
#[test]
fn mtp_layers_load_only_when_asked() {
    let dir = golden_dir().join("v3-qlora-yarn-groups");
    let without = LoadedModel::open_with(&dir, CpuBackend::new(), weft_model::LoadOptions { mtp: false, ..Default::default() }).unwrap();
    assert_eq!(without.model.mtp_layers(), 0);
    assert!(without.model.mtp_logits(0, &without.model.backend.upload(&vec![0.0; without.model.cfg.hidden_size]).unwrap()).is_err());
    let with = LoadedModel::open(&dir, CpuBackend::new()).unwrap();
    assert_eq!(with.model.mtp_layers(), 1);
}
