//! Shared helpers for the plugin-host tests: built plugin bytes, synthetic distributions and
//! an engine-like driver that serves "more candidates" requests.

#![allow(dead_code)]

use weft_plugin_host::{built_plugin_dir, Candidates, SamplingParams};

pub fn plugin_bytes(stem: &str) -> Vec<u8> {
    let p = built_plugin_dir().join(format!("{stem}.wasm"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// xorshift64*: deterministic test randomness without extra dependencies.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

pub fn params() -> SamplingParams {
    weft_plugin_host::neutral_params(0)
}

/// Top-`k` candidates (0 = all) of `logits` sorted descending, ties by id, with the
/// full-vocabulary logsumexp.
pub fn candidates(logits: &[f32], k: usize) -> Candidates {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    let k = if k == 0 || k >= logits.len() { logits.len() } else { k };
    let m = logits[order[0] as usize] as f64;
    let lse = (m + logits.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln()) as f32;
    let ids: Vec<u32> = order[..k].to_vec();
    Candidates { logits: ids.iter().map(|&i| logits[i as usize]).collect(), ids, logsumexp: lse, complete: k == logits.len() }
}

pub fn random_logits(rng: &mut Rng, vocab: usize, scale: f64) -> Vec<f32> {
    (0..vocab).map(|_| (rng.normal() * scale) as f32).collect()
}
