//! Log-probabilities in the two OpenAI shapes: the legacy completions object (`tokens`,
//! `token_logprobs`, `top_logprobs` maps, `text_offset`) and chat's per-token `content`
//! entries with `bytes`.

use crate::choices::{finite, TokenOut};
use crate::state::AppState;
use serde_json::{json, Map, Value};

/// The completions `logprobs` object for `tokens`.
pub fn completion(state: &AppState, tokens: &[TokenOut]) -> Value {
    let mut strs = vec![];
    let mut lps = vec![];
    let mut tops = vec![];
    let mut offsets = vec![];
    for t in tokens {
        strs.push(Value::String(state.token_str(t.id)));
        lps.push(json!(finite(t.logprob.unwrap_or(f64::NEG_INFINITY))));
        let mut m = Map::new();
        for &(id, lp) in t.top.iter().flatten() {
            m.entry(state.token_str(id)).or_insert(json!(finite(lp)));
        }
        tops.push(Value::Object(m));
        offsets.push(json!(t.offset));
    }
    json!({"tokens": strs, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

fn chat_one(state: &AppState, id: u32, lp: f64) -> Value {
    let s = state.token_str(id);
    json!({"token": s, "logprob": finite(lp), "bytes": s.as_bytes()})
}

/// One chat `logprobs.content` entry.
pub fn chat_entry(state: &AppState, t: &TokenOut) -> Value {
    let mut e = chat_one(state, t.id, t.logprob.unwrap_or(f64::NEG_INFINITY));
    let top: Vec<Value> = t.top.iter().flatten().map(|&(id, lp)| chat_one(state, id, lp)).collect();
    e["top_logprobs"] = Value::Array(top);
    e
}

pub fn chat(state: &AppState, tokens: &[TokenOut]) -> Value {
    json!({"content": tokens.iter().map(|t| chat_entry(state, t)).collect::<Vec<_>>()})
}
