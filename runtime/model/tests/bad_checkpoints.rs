//! Every broken-checkpoint case gives a one-line error naming the problem, never a panic.
//! Each case copies a golden fixture into a temporary directory and breaks one thing.

mod common;
use common::*;
use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;
use weft_backend::cpu::CpuBackend;
use weft_model::LoadedModel;

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(p, serde_json::to_string(&v).unwrap()).unwrap();
}

/// Rewrites model.safetensors with `f` applied to the (name, dtype, shape, bytes) list.
fn edit_tensors(dir: &Path, f: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut ts: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st.tensors().into_iter().map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    f(&mut ts);
    let views: Vec<(String, TensorView)> = ts.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &p).unwrap();
}

fn load_error(dir: &Path) -> String {
    match LoadedModel::open(dir, CpuBackend::new()) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn expect(dir: &Path, needles: &[&str]) {
    let e = load_error(dir);
    assert!(!e.contains('\n'), "error should be one line: {e}");
    for n in needles {
        assert!(e.contains(n), "error `{e}` should mention `{n}`");
    }
}

#[test]
fn the_fixture_itself_loads() {
    LoadedModel::open(&fixture(), CpuBackend::new()).unwrap();
}

#[test]
fn missing_directory() {
    expect(Path::new("/nonexistent/weft-model"), &["/nonexistent/weft-model", "does not exist"]);
}

#[test]
fn missing_config() {
    let t = copy_fixture();
    std::fs::remove_file(t.path().join("config.json")).unwrap();
    expect(t.path(), &["config.json"]);
}

#[test]
fn config_not_json() {
    let t = copy_fixture();
    std::fs::write(t.path().join("config.json"), "{ \"model_type\": ").unwrap();
    expect(t.path(), &["config.json", "not valid JSON"]);
}

#[test]
fn unknown_model_type() {
    let t = copy_fixture();
    edit_config(t.path(), |v| v["model_type"] = "llama".into());
    expect(t.path(), &["model_type", "llama"]);
}

#[test]
fn missing_required_field() {
    let t = copy_fixture();
    edit_config(t.path(), |v| {
        v.as_object_mut().unwrap().remove("kv_lora_rank");
    });
    expect(t.path(), &["kv_lora_rank"]);
}

#[test]
fn unsupported_values_name_their_field() {
    for (field, value) in [("scoring_func", serde_json::json!("softmax")), ("topk_group", serde_json::json!(5)), ("moe_layer_freq", serde_json::json!(2)), ("hidden_size", serde_json::json!("wide"))] {
        let t = copy_fixture();
        edit_config(t.path(), |v| v[field] = value.clone());
        expect(t.path(), &[field]);
    }
    let t = copy_fixture();
    edit_config(t.path(), |v| v["rope_scaling"] = serde_json::json!({"type": "longrope", "factor": 2.0}));
    expect(t.path(), &["rope_scaling.rope_type", "longrope"]);
}

#[test]
fn config_shape_disagrees_with_tensors() {
    let t = copy_fixture();
    edit_config(t.path(), |v| v["kv_lora_rank"] = 48.into());
    expect(t.path(), &["kv_b_proj.weight", "shape [128, 64], expected [128, 48]", "model.safetensors"]);
}

#[test]
fn missing_tensor() {
    let t = copy_fixture();
    edit_tensors(t.path(), |ts| ts.retain(|(n, ..)| n != "model.layers.1.mlp.experts.3.up_proj.weight"));
    expect(t.path(), &["model.layers.1.mlp.experts.3.up_proj.weight", "not found"]);
}

#[test]
fn missing_fp8_scale() {
    let t = copy_fixture();
    edit_tensors(t.path(), |ts| ts.retain(|(n, ..)| n != "model.layers.0.self_attn.o_proj.weight_scale_inv"));
    expect(t.path(), &["model.layers.0.self_attn.o_proj.weight_scale_inv", "not found"]);
}

#[test]
fn wrong_dtype() {
    let t = copy_fixture();
    edit_tensors(t.path(), |ts| {
        let e = ts.iter_mut().find(|(n, ..)| n == "model.norm.weight").unwrap();
        e.1 = Dtype::I16;
    });
    expect(t.path(), &["model.norm.weight", "I16"]);
}

#[test]
fn truncated_file() {
    let t = copy_fixture();
    let p = t.path().join("model.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 1000).unwrap();
    expect(t.path(), &["model.safetensors", "truncated"]);
}

#[test]
fn garbage_header() {
    let t = copy_fixture();
    let p = t.path().join("model.safetensors");
    let mut b = std::fs::read(&p).unwrap();
    for x in b[8..40].iter_mut() {
        *x = b'#';
    }
    std::fs::write(&p, b).unwrap();
    expect(t.path(), &["model.safetensors", "corrupt"]);
}

#[test]
fn index_names_a_missing_shard() {
    let t = copy_fixture();
    std::fs::write(t.path().join("model.safetensors.index.json"), r#"{"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}"#).unwrap();
    expect(t.path(), &["model-00001-of-00002.safetensors", "cannot open"]);
}

#[test]
fn missing_tokenizer() {
    let t = copy_fixture();
    std::fs::remove_file(t.path().join("tokenizer.json")).unwrap();
    expect(t.path(), &["tokenizer.json"]);
}
