//! `weft generate`: one prompt through the single-sequence reference generator, printed as
//! text or as the JSON object the golden tests and scripts consume.

use crate::backend::Chosen;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use weft_backend::Backend;
use weft_model::generate::{generate, GenerateRequest};
use weft_model::sampling::SamplingParams;
use weft_model::tokenizer::ChatMessage;
use weft_model::{LoadOptions, LoadedModel};

#[derive(Args)]
pub struct GenerateArgs {
    /// Model directory in the Hugging Face layout (default: the bundled demo model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// 0 is greedy (default: generation_config.json, else 1.0).
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Report the top-K log-probabilities of every prompt and generated position.
    #[arg(long)]
    logprobs: Option<usize>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Compute backend: cpu, cuda (hip in a HIP build), or auto (the GPU when one is there,
    /// else the CPU).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// The GPU for the cuda backend.
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// `safetensors` (the checkpoint's files) or `dummy` (random weights of the config's
    /// shapes, for benchmarks; the tokenizer comes from the demo model when DIR has none).
    #[arg(long, default_value = "safetensors")]
    load_format: String,
    /// Element type of the latent KV cache: f32 or bf16 (as `weft serve`).
    #[arg(long, default_value = "f32", value_parser = weft_backend::KvDtype::parse)]
    kv_cache_dtype: weft_backend::KvDtype,
}

fn logprob_map(lp: &[(u32, f64)]) -> Value {
    let mut m = Map::new();
    for (id, v) in lp {
        m.insert(id.to_string(), json!(v));
    }
    Value::Object(m)
}

fn check_param(name: &str, ok: bool, v: impl std::fmt::Display, want: &str) -> Result<()> {
    if !ok {
        bail!("--{name} {v} is out of range: {want}");
    }
    Ok(())
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let chosen = crate::backend::choose(&a.backend, &a.device)?;
    tracing::info!("{}", chosen.describe());
    match chosen {
        Chosen::Cpu(b) => run_on(a, b),
        Chosen::Cuda(b) => run_on(a, b),
    }
}

fn run_on<B: Backend>(a: GenerateArgs, backend: B) -> Result<()> {
    let dir = a.model.clone().unwrap_or_else(crate::default_model_dir);
    let t0 = std::time::Instant::now();
    let mut lm = match a.load_format.as_str() {
        "safetensors" | "auto" => LoadedModel::open_with(&dir, backend, LoadOptions { mtp: false, ..Default::default() }),
        "dummy" => LoadedModel::open_dummy_with(&dir, backend, &crate::default_model_dir(), LoadOptions { mtp: false, ..Default::default() }),
        other => bail!("--load-format {other}: expected safetensors or dummy"),
    }
    .with_context(|| format!("loading model from {}", dir.display()))?;
    lm.model.set_kv_dtype(a.kv_cache_dtype);
    tracing::info!(secs = t0.elapsed().as_secs_f64(), "model loaded");

    let prompt_ids = match (&a.prompt, &a.prompt_ids) {
        (Some(text), None) => {
            if a.chat {
                let rendered = lm.tokenizer.render_chat(&[ChatMessage { role: "user".into(), content: text.clone() }], true)?;
                lm.tokenizer.encode(&rendered, false)?
            } else {
                lm.tokenizer.encode(text, true)?
            }
        }
        (None, Some(ids)) => ids.clone(),
        _ => bail!("give exactly one of --prompt or --prompt-ids"),
    };
    let temperature = a.temperature.or(lm.defaults.temperature).unwrap_or(1.0);
    let top_p = a.top_p.or(lm.defaults.top_p).unwrap_or(1.0);
    let top_k = a.top_k.or(lm.defaults.top_k).unwrap_or(0);
    check_param("temperature", temperature.is_finite() && temperature >= 0.0, temperature, "must be >= 0")?;
    check_param("top-p", top_p > 0.0 && top_p <= 1.0, top_p, "must be in (0, 1]")?;
    check_param("min-p", (0.0..=1.0).contains(&a.min_p), a.min_p, "must be in [0, 1]")?;
    let seed = a.seed.unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0));
    let req = GenerateRequest {
        prompt_ids,
        max_tokens: a.max_tokens,
        params: SamplingParams { temperature, top_k, top_p, min_p: a.min_p, seed },
        logprobs: a.logprobs,
        stop_ids: if a.ignore_eos { vec![] } else { lm.eos_ids() },
    };
    let t1 = std::time::Instant::now();
    let out = generate(&lm.model, &req)?;
    let secs = t1.elapsed().as_secs_f64();
    let text = lm.tokenizer.decode(&out.token_ids, true)?;
    if a.json {
        let mut obj = json!({
            "prompt_token_ids": out.prompt_token_ids,
            "token_ids": out.token_ids,
            "text": text,
            "finish_reason": match out.finish_reason { weft_model::generate::FinishReason::Stop => "stop", _ => "length" },
        });
        if a.logprobs.is_some() {
            obj["prompt_logprobs"] = Value::Array(out.prompt_logprobs.iter().map(|p| p.as_ref().map_or(Value::Null, |v| logprob_map(v))).collect());
            obj["logprobs"] = Value::Array(out.logprobs.iter().map(|v| logprob_map(v)).collect());
        }
        println!("{}", serde_json::to_string(&obj)?);
    } else {
        println!("{text}");
        eprintln!("[{} prompt + {} generated tokens in {:.2}s: {:.1} tokens/s]", out.prompt_token_ids.len(), out.token_ids.len(), secs, out.token_ids.len() as f64 / secs.max(1e-9));
    }
    Ok(())
}
