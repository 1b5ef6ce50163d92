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
    let r = generate(
        &real.model,
        &GenerateRequest { prompt_ids: vec![0, 75, 76, 300, 1200], max_tokens: 6, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: None, stop_ids: vec![] },
    )
    .unwrap();
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

/// With a `quantization_config`, the dummy stores what a block-fp8 checkpoint stores in fp8
/// (the layers' projections) as fp8 e4m3 with block scales, and the rest in bf16; the model
/// still runs and stays finite.
#[test]
fn fp8_config_gives_fp8_projections() {
    use weft_backend::WeightDtype;
    use weft_model::checkpoint::Checkpoint;
    let ck = Checkpoint::dummy(7, Some((128, 128)));
    let proj = ck.matrix("model.layers.1.mlp.experts.0.gate_proj.weight", 256, 384).unwrap();
    assert_eq!(proj.dtype, WeightDtype::Fp8E4M3);
    assert_eq!(proj.scales.as_ref().unwrap().scales.len(), 2 * 3);
    for name in ["model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.gate.weight"] {
        assert_eq!(ck.matrix(name, 64, 256).unwrap().dtype, WeightDtype::Bf16, "{name}");
    }
    // the demo architecture with fp8 blocks of 32 (its widths are 64-256)
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let dir = std::env::temp_dir().join(format!("weft-dummy-fp8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(demo.join("config.json")).unwrap()).unwrap();
    cfg["quantization_config"] = serde_json::json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [32, 32]});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let lm = LoadedModel::open_dummy(&dir, CpuBackend::new(), &demo).unwrap();
    let req = GenerateRequest { prompt_ids: vec![0, 75, 76, 300], max_tokens: 4, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: Some(2), stop_ids: vec![] };
    let out = generate(&lm.model, &req).unwrap();
    assert_eq!(out.token_ids.len(), 4);
    assert!(out.logprobs.iter().flatten().all(|lp| lp.1.is_finite()));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Shared experts twice a routed expert's width load as two chunks of a routed expert's width
/// (`MoeWeights::shared`, for backends that run them with the routed experts): chunk c holds
/// rows c·w.. of gate and up and columns c·w.. of down, exactly; in bf16 and in fp8 when the
/// chunks cut on the block grid, whole when they would not.
#[test]
fn shared_experts_load_in_routed_expert_chunks() {
    use weft_model::checkpoint::Checkpoint;
    use weft_model::weights::FeedForward;
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(demo.join("config.json")).unwrap()).unwrap();
    let (h, w) = (cfg["hidden_size"].as_u64().unwrap() as usize, cfg["moe_intermediate_size"].as_u64().unwrap() as usize);
    cfg["n_shared_experts"] = 2.into();
    for (block, chunks) in [(None, 2), (Some(32usize), 2), (Some(256), 1)] {
        let dir = std::env::temp_dir().join(format!("weft-dummy-shared-{}-{block:?}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = cfg.clone();
        if let Some(b) = block {
            c["quantization_config"] = serde_json::json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [b, b]});
        }
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
        let lm = LoadedModel::open_dummy(&dir, CpuBackend::new(), &demo).unwrap();
        let ck = Checkpoint::dummy(0x5eed, block.map(|b| (b, b)));
        let mut seen = 0;
        for (i, layer) in lm.model.weights.layers.iter().enumerate() {
            let FeedForward::Moe(m) = &layer.ffn else { continue };
            seen += 1;
            assert_eq!(m.shared.len(), chunks, "layer {i}, fp8 block {block:?}");
            let p = format!("model.layers.{i}.mlp.shared_experts");
            let full = |n: &str, rows: usize, cols: usize| ck.matrix(&format!("{p}.{n}.weight"), rows, cols).unwrap().to_f32().unwrap();
            let (gate, up, down) = (full("gate_proj", 2 * w, h), full("up_proj", 2 * w, h), full("down_proj", h, 2 * w));
            let cw = 2 * w / chunks;
            for (k, x) in m.shared.iter().enumerate() {
                assert_eq!(x.inter, cw);
                let rows = |v: &[f32]| v[k * cw * h..(k + 1) * cw * h].to_vec();
                assert_eq!(x.gate_up.data, [rows(&gate), rows(&up)].concat(), "layer {i} chunk {k}: gate|up");
                let cols: Vec<f32> = down.chunks(2 * w).flat_map(|r| r[k * cw..(k + 1) * cw].iter().copied()).collect();
                assert_eq!(x.down.data, cols, "layer {i} chunk {k}: down");
            }
        }
        assert!(seen > 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
