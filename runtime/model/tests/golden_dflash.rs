//! Golden test of the DFlash block-diffusion drafter against z-lab's reference implementation
//! (tests/golden/make_dflash_fixture.py: `DFlashDraftModel` + `dflash_generate` over
//! transformers' DeepseekV3ForCausalLM, float64, random bf16 draft weights). For every block
//! the reference drafted, the CPU backend rebuilds the draft's context from the target's
//! captured layer outputs — in one pass, or in the pieces the reference's cache grew in — runs
//! the block and must give the same drafts (where the reference's top two are apart) and
//! log-probabilities within 1e-3. A malformed draft config is refused with the field named.

use serde_json::Value;
use std::path::{Path, PathBuf};
use weft_backend::cpu::CpuBackend;
use weft_backend::{AttnRow, Backend};
use weft_model::dflash::{DFlashConfig, DFlashModel};
use weft_model::{LoadedModel, StepBatch};

const LOGPROB_TOL: f64 = 1e-3;

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let z = row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
    row.iter().map(|&x| x as f64 - z).collect()
}

/// The draft's log-probabilities for block rows 1.. of a block at `start` over `ids[..=start]`,
/// its context stored in pieces ending at `cuts` (then `start`).
fn block_logprobs(lm: &LoadedModel<CpuBackend>, d: &DFlashModel<CpuBackend>, ids: &[u32], start: usize, cuts: &[usize]) -> Vec<Vec<f64>> {
    let m = &lm.model;
    let (be, h) = (&m.backend, m.cfg.hidden_size);
    let bs = d.cfg.block_size;
    let table = vec![0u32];
    let page = (start + bs).next_power_of_two().max(16);
    let pos: Vec<u32> = (0..(start + bs) as u32).collect();
    // The target over the committed positions 0..start; its captured layers follow its output.
    let mut pool = be.alloc_kv_pool(m.kv_layout(1, page)).unwrap();
    let attn: Vec<AttnRow> = (0..start).map(|p| AttnRow { block_table: &table, ctx_len: p + 1 }).collect();
    let hidden = m.forward_hidden(&mut pool, &StepBatch { tokens: &ids[..start], positions: &pos[..start], slots: &pos[..start], attn: &attn, exact_rows: &[] }).unwrap();
    assert_eq!(hidden.len(), start * h * (1 + d.cfg.target_layer_ids.len()));
    let mut dpool = be.alloc_kv_pool(d.kv_layout(1, page)).unwrap();
    let mut bounds = vec![0];
    bounds.extend(cuts.iter().copied().filter(|&c| c > 0 && c < start));
    bounds.push(start);
    // (rows of capture j for positions a..b: (1 + j)·start + a .. (1 + j)·start + b)
    for w in bounds.windows(2) {
        let (a, b) = (w[0], w[1]);
        let feats: Vec<Vec<f32>> = (0..d.cfg.target_layer_ids.len())
            .map(|j| {
                let rows: Vec<u32> = (a..b).map(|p| ((1 + j) * start + p) as u32).collect();
                be.gather_rows(&hidden, h, &rows).unwrap()
            })
            .collect();
        d.store_context(be, &mut dpool, &feats, &pos[a..b], &pos[a..b]).unwrap();
    }
    let mut block = vec![d.cfg.mask_token_id; bs];
    block[0] = ids[start];
    let x = be.embed(&m.weights.embed, &block).unwrap();
    let battn: Vec<AttnRow> = (0..bs).map(|_| AttnRow { block_table: &table, ctx_len: start + bs }).collect();
    let out = d.block_hidden(be, &mut dpool, x, &pos[start..start + bs], &pos[start..start + bs], &battn).unwrap();
    let rows: Vec<u32> = (1..bs as u32).collect();
    let logits = be.download(&m.logits(&be.gather_rows(&out, h, &rows).unwrap()).unwrap()).unwrap();
    logits.chunks(m.cfg.vocab_size).map(log_softmax).collect()
}

#[test]
fn dflash_drafts_match_the_reference_implementation() {
    let dir = golden().join("dflash-v3");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("dflash_reference.json")).unwrap()).unwrap();
    let mut lm = LoadedModel::open(&golden().join(reference["target"].as_str().unwrap()), CpuBackend::new()).unwrap();
    let d = DFlashModel::open(&dir, &lm.model.backend, &lm.model.cfg).unwrap();
    assert_eq!((d.cfg.block_size, d.cfg.mask_token_id, &d.cfg.target_layer_ids[..]), (8, 5, &[0usize, 1][..]));
    lm.model.set_capture(&d.cfg.target_layer_ids).unwrap();
    let (mut worst, mut blocks, mut agreed) = (0f64, 0, 0);
    for (ci, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
        let ids: Vec<u32> = case["output_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let mut prev_start = None;
        for (bi, b) in case["blocks"].as_array().unwrap().iter().enumerate() {
            let start = b["start"].as_u64().unwrap() as usize;
            // The reference's cache grew block by block: ctx_from is where this block's context
            // piece begins; rebuild with that cut for every other block, in one pass otherwise.
            let cuts: Vec<usize> = if bi % 2 == 1 { vec![b["ctx_from"].as_u64().unwrap() as usize] } else { vec![] };
            if bi > 0 && bi % 5 != 0 && bi + 1 != case["blocks"].as_array().unwrap().len() {
                continue; // every fifth block and the last: enough coverage, quick enough
            }
            assert!(prev_start.is_none_or(|p| p < start));
            prev_start = Some(start);
            let got = block_logprobs(&lm, &d, &ids, start, &cuts);
            for (r, row) in b["rows"].as_array().unwrap().iter().enumerate() {
                let top = row["top"].as_object().unwrap();
                for (id, lp) in top {
                    let (id, lp) = (id.parse::<usize>().unwrap(), lp.as_f64().unwrap());
                    let err = (got[r][id] - lp).abs();
                    worst = worst.max(err);
                    assert!(err < LOGPROB_TOL, "case {ci} block {bi} (start {start}) row {r}: token {id} logprob {} vs reference {lp}", got[r][id]);
                }
                let want = b["drafts"][r].as_u64().unwrap() as usize;
                let ours = (0..got[r].len()).max_by(|&a, &b| got[r][a].total_cmp(&got[r][b])).unwrap();
                if row["margin"].as_f64().unwrap() > 1e-2 {
                    assert_eq!(ours, want, "case {ci} block {bi} row {r}: draft");
                    agreed += 1;
                }
            }
            blocks += 1;
        }
    }
    eprintln!("DFlash vs reference: {blocks} blocks, {agreed} drafts equal, worst logprob error {worst:.2e}");
    assert!(blocks >= 10 && agreed >= 50);
}

#[test]
fn bad_dflash_configs_are_refused_naming_the_field() {
    let dir = golden().join("dflash-v3");
    let target = weft_model::ModelConfig::from_file(&golden().join("v3-qlora-yarn-groups/config.json")).unwrap();
    let good: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    DFlashConfig::from_json(&good, &target).unwrap();
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        DFlashConfig::from_json(&v, &target).unwrap_err().to_string()
    };
    assert!(edit(&|v| v["hidden_size"] = 128.into()).contains("hidden_size"));
    assert!(edit(&|v| v["num_key_value_heads"] = 3.into()).contains("num_key_value_heads"));
    assert!(edit(&|v| v["dflash_config"]["mask_token_id"] = 320.into()).contains("mask_token_id"));
    assert!(edit(&|v| v["dflash_config"]["target_layer_ids"] = serde_json::json!([0, 3])).contains("target_layer_ids"));
    assert!(edit(&|v| v["layer_types"][1] = "sliding_attention".into()).contains("layer_types"));
    assert!(edit(&|v| v["block_size"] = 1.into()).contains("block_size"));
    assert!(edit(&|v| v["hidden_act"] = "gelu".into()).contains("hidden_act"));
    assert!(edit(&|v| {
        v.as_object_mut().unwrap().remove("dflash_config");
    })
    .contains("dflash_config"));
    // Missing weights name the tensor.
    let be = CpuBackend::new();
    let tmp = std::env::temp_dir().join(format!("weft-dflash-bad-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("config.json"), serde_json::to_string(&good).unwrap()).unwrap();
    std::fs::write(tmp.join("model.safetensors"), b"\x08\0\0\0\0\0\0\0{}      ").unwrap();
    let err = DFlashModel::open(&tmp, &be, &target).err().unwrap().to_string();
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(err.contains("fc.weight") || err.contains("safetensors"), "{err}");
}

/// z-lab's default target layers (Python rounding: 12.5 → 12), and the bundled dummy draft for
/// the Moonlight-shaped target parses against it.
#[test]
fn default_target_layers_and_the_moonlight_dummy_draft() {
    assert_eq!(weft_model::dflash::default_target_layer_ids(27, 5), [1, 7, 12, 18, 24]);
    assert_eq!(weft_model::dflash::default_target_layer_ids(36, 5), [1, 9, 17, 25, 33]);
    assert_eq!(weft_model::dflash::default_target_layer_ids(36, 1), [18]);
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/dummy");
    let target = weft_model::ModelConfig::from_file(&models.join("moonlight-16b-a3b/config.json")).unwrap();
    let d = DFlashConfig::from_file(&models.join("dflash-moonlight/config.json"), &target).unwrap();
    assert_eq!((d.block_size, d.head_dim, &d.target_layer_ids[..]), (16, 128, &[1usize, 7, 12, 18, 24][..]));
}
