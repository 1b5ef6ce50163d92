//! Text side of a checkpoint: `tokenizer.json` (HF `tokenizers`), the Jinja chat template and
//! special tokens from `tokenizer_config.json` (rendered with minijinja, Python string methods
//! included), and `generation_config.json` defaults.

use serde::Serialize;
use serde_json::Value;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("tokenizer: {0}")]
    Tokenize(String),
    #[error("chat template: {0}")]
    Template(String),
}

type Result<T> = std::result::Result<T, TokenizerError>;

/// One chat message as the template sees it.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    chat_template: Option<String>,
}

/// `"<s>"` or `{"content": "<s>", ...}` (an AddedToken dict), as tokenizer_config.json has both.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}

impl TextTokenizer {
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tpath = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&tpath).map_err(|e| TokenizerError::File { path: tpath.display().to_string(), reason: e.to_string() })?;
        let cpath = dir.join("tokenizer_config.json");
        let (mut bos, mut eos, mut tmpl) = (None, None, None);
        if cpath.exists() {
            let text = std::fs::read_to_string(&cpath).map_err(|e| TokenizerError::File { path: cpath.display().to_string(), reason: e.to_string() })?;
            let v: Value = serde_json::from_str(&text).map_err(|e| TokenizerError::File { path: cpath.display().to_string(), reason: format!("not valid JSON: {e}") })?;
            bos = token_string(v.get("bos_token"));
            eos = token_string(v.get("eos_token"));
            tmpl = match v.get("chat_template") {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: take "default".
                Some(Value::Array(a)) => a.iter().find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default")).and_then(|t| t.get("template")?.as_str().map(String::from)),
                _ => None,
            };
        }
        if tmpl.is_none() {
            let jpath = dir.join("chat_template.jinja");
            if jpath.exists() {
                tmpl = std::fs::read_to_string(&jpath).ok();
            }
        }
        Ok(TextTokenizer { inner, bos_token: bos, eos_token: eos, chat_template: tmpl })
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encodes text; `add_special` applies the tokenizer's post-processor (e.g. BOS).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, add_special).map_err(|e| TokenizerError::Tokenize(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(|e| TokenizerError::Tokenize(e.to_string()))
    }

    pub fn token_to_id(&self, tok: &str) -> Option<u32> {
        self.inner.token_to_id(tok)
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Renders the chat template with `messages`, `bos_token`, `eos_token` and
    /// `add_generation_prompt`, as transformers' `apply_chat_template` does.
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self.chat_template.as_deref().ok_or_else(|| TokenizerError::Template("this checkpoint has no chat template (tokenizer_config.json chat_template)".into()))?;
        render_template(tmpl, messages, add_generation_prompt, self.bos_token.as_deref().unwrap_or(""), self.eos_token.as_deref().unwrap_or(""))
    }
}

/// Renders a HF chat template. Exposed separately so templates can be tested without a
/// tokenizer.
pub fn render_template(tmpl: &str, messages: &[ChatMessage], add_generation_prompt: bool, bos: &str, eos: &str) -> Result<String> {
    let mut env = minijinja::Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> { Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg)) });
    env.add_template("chat", tmpl).map_err(|e| TokenizerError::Template(e.to_string()))?;
    let t = env.get_template("chat").map_err(|e| TokenizerError::Template(e.to_string()))?;
    t.render(minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    })
    .map_err(|e| TokenizerError::Template(e.to_string()))
}

/// Sampling defaults and stop tokens from `generation_config.json`.
#[derive(Clone, Debug, Default)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
}

impl GenerationDefaults {
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let p = dir.join("generation_config.json");
        if !p.exists() {
            return Ok(Self::default());
        }
        let text = std::fs::read_to_string(&p).map_err(|e| TokenizerError::File { path: p.display().to_string(), reason: e.to_string() })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| TokenizerError::File { path: p.display().to_string(), reason: format!("not valid JSON: {e}") })?;
        let ids = |k: &str| -> Vec<u32> {
            match v.get(k) {
                Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
                Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|y| y as u32)).collect(),
                _ => vec![],
            }
        };
        let sample = v.get("do_sample").and_then(|x| x.as_bool()).unwrap_or(true);
        Ok(GenerationDefaults {
            temperature: if sample { v.get("temperature").and_then(|x| x.as_f64()).map(|x| x as f32) } else { Some(0.0) },
            top_p: v.get("top_p").and_then(|x| x.as_f64()).map(|x| x as f32),
            top_k: v.get("top_k").and_then(|x| x.as_u64()).map(|x| x as usize),
            eos_token_ids: ids("eos_token_id"),
            bos_token_id: ids("bos_token_id").first().copied(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DeepSeek-V3-style template: namespaces, loops, Python string methods, generation prompt.
    const DS_LIKE: &str = r#"{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'].strip() }}{%- endif %}{%- if message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}{%- endif %}{%- endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"#;

    fn msgs() -> Vec<ChatMessage> {
        vec![
            ChatMessage { role: "system".into(), content: "Be brief.".into() },
            ChatMessage { role: "user".into(), content: "  Hi there \n".into() },
            ChatMessage { role: "assistant".into(), content: "Hello.".into() },
            ChatMessage { role: "user".into(), content: "Bye".into() },
        ]
    }

    #[test]
    fn deepseek_style_template_renders() {
        let s = render_template(DS_LIKE, &msgs(), true, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>").unwrap();
        assert_eq!(s, "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi there<｜Assistant｜>Hello.<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜>");
        let s = render_template(DS_LIKE, &msgs(), false, "<s>", "</s>").unwrap();
        assert!(s.ends_with("<｜User｜>Bye"));
    }

    #[test]
    fn raise_exception_surfaces_as_error() {
        let t = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok";
        let e = render_template(t, &msgs(), true, "", "").unwrap_err().to_string();
        assert!(e.contains("first message must be from the user"), "{e}");
    }

    #[test]
    fn broken_template_is_an_error_not_a_panic() {
        let e = render_template("{% for x in %}", &msgs(), true, "", "").unwrap_err();
        assert!(e.to_string().starts_with("chat template"));
    }
}
