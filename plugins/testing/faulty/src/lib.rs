//! Test sampler "faulty": misbehaves on demand so the host's containment can be tested.
//! `extra` selects the fault: `trap`, `loop`, `memory`, `bad-token`, `short-answer`, `escape`
//! (tries files, environment and network) in `sample`, `configure-trap` in `configure`;
//! anything else behaves greedily.

use weft_plugin_sdk::sampler::exports::weft::plugin::sampler::{Decision, Guest, SamplingParams, SamplingPlan, StepBatch};
use weft_plugin_sdk::sampler::weft::plugin::types::{PluginInfo, PluginKind};

struct Faulty;

impl Guest for Faulty {
    fn describe() -> PluginInfo {
        PluginInfo { name: "faulty".into(), version: "0.1.0".into(), interface_version: weft_plugin_sdk::INTERFACE_VERSION.into(), kind: PluginKind::Sampler }
    }
    fn configure(p: SamplingParams) -> Result<SamplingPlan, String> {
        if p.extra.contains("configure-trap") {
            panic!("configure exploded");
        }
        Ok(SamplingPlan { temperature: 1.0, repetition_penalty: 1.0, presence_penalty: 0.0, frequency_penalty: 0.0, logit_bias: vec![], banned_tokens: vec![], min_tokens: 0, candidates: 4, wants_history: false, state: p.extra.into_bytes() })
    }
    fn sample(batch: StepBatch) -> Vec<Decision> {
        let mut out = Vec::new();
        for s in weft_plugin_sdk::batch::sequences(&batch) {
            let mode = String::from_utf8_lossy(s.state).to_string();
            if mode.contains("trap") {
                panic!("sampler trapped");
            } else if mode.contains("loop") {
                let mut x: u64 = 1;
                loop {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    if x == 0 {
                        break;
                    }
                }
                out.push(Decision::Token(x as u32));
            } else if mode.contains("memory") {
                let mut hog: Vec<Vec<u8>> = Vec::new();
                loop {
                    hog.push(vec![1u8; 16 << 20]);
                    if hog.len() > 1 << 20 {
                        break;
                    }
                }
                out.push(Decision::Token(hog.len() as u32));
            } else if mode.contains("bad-token") {
                out.push(Decision::Token(u32::MAX));
            } else if mode.contains("escape") {
                // Tries to reach outside the sandbox; answers with candidate index = bitmask of
                // what succeeded (1 file read, 2 directory listing, 4 environment, 8 TCP connect).
                let mut got = 0usize;
                if std::fs::read("/etc/hostname").is_ok() || std::fs::read("/etc/passwd").is_ok() {
                    got |= 1;
                }
                if std::fs::read_dir("/").is_ok() || std::fs::read_dir(".").is_ok() {
                    got |= 2;
                }
                if std::env::vars().count() > 0 || std::env::var("PATH").is_ok() {
                    got |= 4;
                }
                if std::net::TcpStream::connect("127.0.0.1:1").is_ok() || std::net::TcpStream::connect("127.0.0.1:8000").is_ok() {
                    got |= 8;
                }
                out.push(Decision::Token(s.ids[got.min(s.ids.len() - 1)]));
            } else if mode.contains("short-answer") {
                return out;
            } else {
                out.push(Decision::Token(s.ids[0]));
            }
        }
        out
    }
}

weft_plugin_sdk::sampler::export_sampler!(Faulty);
