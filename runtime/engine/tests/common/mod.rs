//! Helpers shared by the engine tests: draining a request's events and waiting for the step
//! loop to go idle.

#![allow(dead_code)]

use std::time::{Duration, Instant};
use weft_engine::{Engine, Event, GenerationRequest};

pub fn collect(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Event>) -> (Vec<u32>, String, Option<Event>) {
    let (mut ids, mut text) = (vec![], String::new());
    while let Some(e) = rx.blocking_recv() {
        match e {
            Event::Token { id, text: t, .. } => {
                ids.push(id);
                text.push_str(&t);
            }
            fin @ (Event::Finished { .. } | Event::Error { .. }) => {
                if let Event::Finished { text_tail, .. } = &fin {
                    text.push_str(text_tail);
                }
                return (ids, text, Some(fin));
            }
        }
    }
    (ids, text, None)
}

/// A greedy request for `max_tokens` tokens that ignores EOS (seed 1, tenant "t").
pub fn greedy_request(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt,
        params: weft_plugin_host::SamplingParams { temperature: 0.0, ..weft_plugin_host::neutral_params(0) },
        max_tokens,
        stop_token_ids: vec![],
        stop: vec![],
        ignore_eos: true,
        seed: 1,
        sampler: None,
        logprobs: None,
        priority: 0,
        tenant: "t".into(),
        speculative: true,
    }
}

pub fn wait_idle(engine: &Engine) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let s = engine.stats();
        if s.running == 0 && s.waiting == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("engine did not go idle: {:?}", engine.stats());
}

/// Pearson's chi-square of `counts` (n samples) against the distribution `p`, over tokens
/// expected at least 5 times (the rest merged into one bin): (chi2, bins, the 99.9th
/// percentile of chi-square with bins − 1 degrees of freedom by Wilson-Hilferty).
pub fn chi_square(counts: &[usize], p: &[f64], n: usize) -> (f64, usize, f64) {
    let (mut chi2, mut df, mut rest_obs, mut rest_exp) = (0.0, 0usize, 0.0, 0.0);
    for (o, q) in counts.iter().zip(p) {
        let e = q * n as f64;
        if e >= 5.0 {
            chi2 += (*o as f64 - e).powi(2) / e;
            df += 1;
        } else {
            rest_obs += *o as f64;
            rest_exp += e;
        }
    }
    if rest_exp >= 1.0 {
        chi2 += (rest_obs - rest_exp).powi(2) / rest_exp;
        df += 1;
    }
    let k = (df - 1) as f64;
    (chi2, df, k * (1.0 - 2.0 / (9.0 * k) + 3.09 * (2.0 / (9.0 * k)).sqrt()).powi(3))
}
