//! Chat templates: the input (lossy UTF-8) is a Jinja template rendered with a four-message
//! conversation by the same minijinja environment the server uses. It must render or return an
//! error; a panic, an abort or a hang (libFuzzer's -timeout) is a crash.

#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_model::tokenizer::{render_template, ChatMessage};

fuzz_target!(|data: &[u8]| {
    let tmpl = String::from_utf8_lossy(data);
    let msgs = [("system", "Be brief."), ("user", "Hi {{ there }} {% raw %}"), ("assistant", "Hello."), ("user", "And?")]
        .map(|(role, content)| ChatMessage { role: role.into(), content: content.into() });
    if let Err(e) = render_template(&tmpl, &msgs, true, "<s>", "</s>") {
        assert!(!e.to_string().is_empty());
    }
});
