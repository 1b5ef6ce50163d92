//! Request fields → engine requests: defaults (request, then generation_config.json, then
//! OpenAI's), range checks that name the offending field, prompt shapes, stop sequences,
//! logit bias, `n` copies with seeds `seed + i`.

use crate::error::ApiError;
use crate::protocol::Sampling;
use crate::state::AppState;
use axum::http::StatusCode;
use serde_json::Value;
use weft_engine::GenerationRequest;
use weft_plugin_host::{neutral_params, PluginKind, SamplingParams};

pub const MAX_STOP: usize = 16;
pub const MAX_LOGPROBS: i64 = 20;
pub const MAX_CHOICES: usize = 128;

/// Everything about a request except its prompt and length.
pub struct Plan {
    pub params: SamplingParams,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub seed: u64,
    pub sampler: Option<String>,
    pub priority: i32,
    pub tenant: String,
    pub speculative: bool,
}

impl Plan {
    /// `n` engine requests for one prompt; choice `i` samples with seed `seed + i`.
    pub fn requests(&self, prompt: &[u32], max_tokens: usize, n: usize, logprobs: Option<usize>) -> Vec<GenerationRequest> {
        (0..n)
            .map(|i| GenerationRequest {
                prompt: prompt.to_vec(),
                params: self.params.clone(),
                max_tokens,
                stop_token_ids: self.stop_token_ids.clone(),
                stop: self.stop.clone(),
                ignore_eos: self.ignore_eos,
                seed: self.seed.wrapping_add(i as u64),
                sampler: self.sampler.clone(),
                logprobs,
                priority: self.priority,
                tenant: self.tenant.clone(),
                speculative: self.speculative,
            })
            .collect()
    }
}

fn in_range(name: &str, v: Option<f64>, ok: impl Fn(f64) -> bool, want: &str) -> Result<Option<f64>, ApiError> {
    match v {
        Some(x) if !x.is_finite() || !ok(x) => Err(ApiError::param(name, format!("`{name}` is {x}; it must be {want}"))),
        _ => Ok(v),
    }
}

fn token_id(name: &str, v: i64, vocab: usize) -> Result<u32, ApiError> {
    if v < 0 || v as u64 >= vocab as u64 {
        return Err(ApiError::param(name, format!("`{name}` contains token id {v}, outside the vocabulary [0, {vocab})")));
    }
    Ok(v as u32)
}

/// 404 unless `model` is absent or names the served model.
pub fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != state.model_name => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{m}` does not exist; this server serves `{}`", state.model_name),
            param: Some("model".into()),
            code: Some("model_not_found"),
        }),
        _ => Ok(()),
    }
}

/// `n`: 1 by default, at most `MAX_CHOICES`.
pub fn choices(n: Option<i64>) -> Result<usize, ApiError> {
    match n {
        None => Ok(1),
        Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::param("n", format!("`n` is {n}; it must be between 1 and {MAX_CHOICES}"))),
    }
}

/// The completion length: the request's, else `default` (clamped to the context), checked
/// against the context length.
pub fn max_tokens(name: &str, given: Option<i64>, default: Option<usize>, prompt_len: usize, ctx: usize) -> Result<usize, ApiError> {
    if prompt_len >= ctx {
        return Err(ApiError::param("prompt", format!("the prompt is {prompt_len} tokens; this model's context length is {ctx} tokens")).with_code("context_length_exceeded"));
    }
    let room = ctx - prompt_len;
    match given {
        Some(m) if m < 1 => Err(ApiError::param(name, format!("`{name}` is {m}; it must be at least 1"))),
        Some(m) if m as u64 > room as u64 => {
            Err(ApiError::param(name, format!("the prompt ({prompt_len} tokens) plus `{name}` ({m}) exceeds this model's context length of {ctx} tokens")).with_code("context_length_exceeded"))
        }
        Some(m) => Ok(m as usize),
        None => Ok(default.unwrap_or(room).min(room)),
    }
}

/// The stop sequences: a string or a list of up to `MAX_STOP` non-empty strings.
fn stop_strings(v: &Option<Value>) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::param("stop", format!("`stop` must be a string or a list of at most {MAX_STOP} non-empty strings"));
    let list = match v {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a.iter().map(|x| x.as_str().map(String::from).ok_or_else(bad)).collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if list.len() > MAX_STOP || list.iter().any(|s| s.is_empty()) {
        return Err(bad());
    }
    Ok(list)
}

/// Checks the shared sampling fields and turns them into a plan. `raw_body` goes to the
/// sampler plugin as its `extra` JSON, so custom plugins can read their own fields.
pub fn plan(state: &AppState, s: &Sampling, raw_body: &[u8]) -> Result<Plan, ApiError> {
    let vocab = state.engine.vocab_size();
    let d = &state.defaults;
    let temperature = in_range("temperature", s.temperature, |x| (0.0..=100.0).contains(&x), "between 0 and 100")?.or(d.temperature.map(f64::from)).unwrap_or(1.0);
    let top_p = in_range("top_p", s.top_p, |x| x > 0.0 && x <= 1.0, "in (0, 1]")?.or(d.top_p.map(f64::from)).unwrap_or(1.0);
    let top_k = match s.top_k {
        None => d.top_k.unwrap_or(0) as u32,
        Some(-1) | Some(0) => 0,
        Some(k) if k > 0 && k as u64 <= vocab as u64 => k as u32,
        Some(k) => return Err(ApiError::param("top_k", format!("`top_k` is {k}; it must be -1 or 0 (disabled) or between 1 and the vocabulary size {vocab}"))),
    };
    let min_p = in_range("min_p", s.min_p, |x| (0.0..=1.0).contains(&x), "in [0, 1]")?.unwrap_or(0.0);
    let typical_p = in_range("typical_p", s.typical_p, |x| x > 0.0 && x <= 1.0, "in (0, 1]")?.unwrap_or(1.0);
    let repetition_penalty = in_range("repetition_penalty", s.repetition_penalty, |x| x > 0.0 && x <= 10.0, "in (0, 10]")?.unwrap_or(1.0);
    let presence_penalty = in_range("presence_penalty", s.presence_penalty, |x| (-2.0..=2.0).contains(&x), "between -2 and 2")?.unwrap_or(0.0);
    let frequency_penalty = in_range("frequency_penalty", s.frequency_penalty, |x| (-2.0..=2.0).contains(&x), "between -2 and 2")?.unwrap_or(0.0);
    let mut logit_bias = vec![];
    for (k, &v) in s.logit_bias.iter().flatten() {
        let id: i64 = k.trim().parse().map_err(|_| ApiError::param("logit_bias", format!("`logit_bias` key {k:?} is not a token id")))?;
        let id = token_id("logit_bias", id, vocab)?;
        in_range("logit_bias", Some(v), |x| (-100.0..=100.0).contains(&x), "between -100 and 100 for every token")?;
        logit_bias.push((id, v as f32));
    }
    let min_tokens = match s.min_tokens {
        None => 0,
        Some(m) if (0..=u32::MAX as i64).contains(&m) => m as u32,
        Some(m) => return Err(ApiError::param("min_tokens", format!("`min_tokens` is {m}; it must be >= 0"))),
    };
    let stop_token_ids = s.stop_token_ids.iter().flatten().map(|&t| token_id("stop_token_ids", t, vocab)).collect::<Result<Vec<_>, _>>()?;
    if let Some(name) = &s.sampler {
        state.engine.registry().resolve(PluginKind::Sampler, Some(name)).map_err(|e| ApiError::param("sampler", format!("`sampler`: {e}")))?;
    }
    let seed = match s.seed {
        Some(x) => x as u64,
        None => state.fresh_seed(),
    };
    let params = SamplingParams {
        temperature: temperature as f32,
        top_p: top_p as f32,
        top_k,
        min_p: min_p as f32,
        typical_p: typical_p as f32,
        repetition_penalty: repetition_penalty as f32,
        presence_penalty: presence_penalty as f32,
        frequency_penalty: frequency_penalty as f32,
        logit_bias,
        min_tokens,
        extra: String::from_utf8_lossy(raw_body).into_owned(),
        ..neutral_params(vocab as u32)
    };
    Ok(Plan {
        params,
        stop: stop_strings(&s.stop)?,
        stop_token_ids,
        ignore_eos: s.ignore_eos.unwrap_or(false),
        seed,
        sampler: s.sampler.clone(),
        priority: s.priority.unwrap_or(0),
        tenant: s.user.clone().unwrap_or_default(),
        speculative: s.speculative.unwrap_or(true),
    })
}

/// The prompts of a completion request: a string, a list of strings, a list of token ids, or
/// a list of token-id lists. Text is encoded as `weft generate` does (special tokens added).
pub fn prompts(state: &AppState, v: &Option<Value>) -> Result<Vec<Vec<u32>>, ApiError> {
    let shape = || ApiError::param("prompt", "`prompt` must be a string, a list of strings, a list of token ids, or a list of token-id lists");
    let vocab = state.engine.vocab_size();
    let encode = |s: &str| -> Result<Vec<u32>, ApiError> {
        if s.is_empty() {
            return Err(ApiError::param("prompt", "`prompt` is empty"));
        }
        state.tokenizer.encode(s, true).map_err(|e| ApiError::param("prompt", format!("`prompt` could not be tokenized: {e}")))
    };
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        if a.is_empty() {
            return Err(ApiError::param("prompt", "`prompt` is an empty list of token ids"));
        }
        a.iter().map(|x| x.as_i64().ok_or_else(shape).and_then(|t| token_id("prompt", t, vocab))).collect()
    };
    let out = match v {
        None | Some(Value::Null) => return Err(ApiError::param("prompt", "`prompt` is required")),
        Some(Value::String(s)) => vec![encode(s)?],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::param("prompt", "`prompt` is an empty list")),
        Some(Value::Array(a)) => match &a[0] {
            Value::String(_) => a.iter().map(|x| x.as_str().ok_or_else(shape).and_then(encode)).collect::<Result<_, _>>()?,
            Value::Number(_) => vec![ids(a)?],
            Value::Array(_) => a.iter().map(|x| x.as_array().ok_or_else(shape).and_then(|l| ids(l))).collect::<Result<_, _>>()?,
            _ => return Err(shape()),
        },
        Some(_) => return Err(shape()),
    };
    Ok(out)
}
