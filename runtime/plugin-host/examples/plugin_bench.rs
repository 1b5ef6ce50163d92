//! Plugin cost benchmark: the default sampler plugin's cost per engine step (one batch call)
//! and per sequence, against the native implementation of the same policy, for batch sizes
//! 1/8/64/256 and K = 64/256/163840 candidates; then how fast a swap takes effect.
//!
//!     cargo run --release -p weft-plugin-host --example plugin_bench

use std::time::{Duration, Instant};
use weft_plugin_host::{calls, native, Candidates, PluginKind, Registry, SamplingParams, SandboxLimits, Sequence};

fn candidates(k: usize, seed: u64) -> Candidates {
    let mut s = seed | 1;
    let mut logits: Vec<f32> = (0..k)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect();
    logits.sort_by(|a, b| b.total_cmp(a));
    let m = logits[0] as f64;
    let lse = (m + logits.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln()) as f32;
    Candidates { ids: (0..k as u32).collect(), logits, logsumexp: lse, complete: k == 163_840 }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let reg = Registry::with_defaults(SandboxLimits { memory_bytes: 512 << 20, deadline: Duration::from_secs(5) }).unwrap();
    let (plugin, policy) = reg.resolve(PluginKind::Sampler, None).unwrap();
    let params = SamplingParams { temperature: 0.8, top_p: 0.9, top_k: 50, ..weft_plugin_host::neutral_params(163_840) };
    let (plan, _) = calls::configure(&plugin, policy, &params).unwrap();
    println!("default sampler plugin vs native, policy: temperature 0.8, top-k 50, top-p 0.9 (vocab 163840)");
    println!("{:>6} {:>7} | {:>12} {:>10} | {:>12} {:>10} | {:>8} {:>13}", "batch", "K", "plugin/step", "per seq", "native/step", "per seq", "ratio", "added/step");
    for &k in &[64usize, 256, 163_840] {
        let base: Vec<Candidates> = (0..4).map(|i| candidates(k, 7 + i)).collect();
        for &b in &[1usize, 8, 64, 256] {
            let batch: Vec<Sequence> =
                (0..b).map(|i| Sequence { request_id: i as u64, state: plan.state.clone(), candidates: base[i % 4].clone(), uniforms: vec![(i as f64 * 0.37) % 1.0], history: None }).collect();
            let prms: Vec<&SamplingParams> = (0..b).map(|_| &params).collect();
            let iters = if k > 10_000 { (64 / b).clamp(3, 20) } else { 200 };
            let mut tp = Vec::new();
            let mut tn = Vec::new();
            for _ in 0..3 {
                calls::sample(&plugin, policy, &batch, &prms, 163_840).unwrap();
            }
            for _ in 0..iters {
                let t0 = Instant::now();
                let out = calls::sample(&plugin, policy, &batch, &prms, 163_840).unwrap();
                tp.push(t0.elapsed());
                std::hint::black_box(out);
                let t0 = Instant::now();
                let out: Vec<_> = batch.iter().map(|s| native::sample_candidates(&params, &s.candidates, s.uniforms[0])).collect();
                tn.push(t0.elapsed());
                std::hint::black_box(out);
            }
            let (p, n) = (median(tp), median(tn));
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!("{:>6} {:>7} | {:>10.1}µs {:>8.2}µs | {:>10.1}µs {:>8.2}µs | {:>7.2}x {:>11.1}µs", b, k, us(p), us(p) / b as f64, us(n), us(n) / b as f64, us(p) / us(n).max(1e-3), us(p) - us(n));
            if b == 64 && k == 64 {
                let added = us(p) - us(n);
                println!("       -> target: at batch 64, K=64 the plugin adds <= 50 µs per step over the native policy: {added:.1} µs, {}", if added <= 50.0 { "met" } else { "NOT met" });
            }
        }
    }

    // Swap latency: a precompiled component (bytes seen before) becomes active for new requests.
    let dir = weft_plugin_host::built_plugin_dir();
    let v1 = std::fs::read(dir.join("weft_test_swap_v1.wasm")).unwrap();
    let v2 = std::fs::read(dir.join("weft_test_swap_v2.wasm")).unwrap();
    let t0 = Instant::now();
    reg.load_bytes(&v1, None, None).unwrap();
    let cold = t0.elapsed();
    reg.load_bytes(&v2, None, None).unwrap();
    let mut warm = Vec::new();
    let mut activate = Vec::new();
    for i in 0..20 {
        let bytes = if i % 2 == 0 { &v1 } else { &v2 };
        let t0 = Instant::now();
        reg.load_bytes(bytes, None, None).unwrap();
        let (p, _) = reg.resolve(PluginKind::Sampler, Some("swap")).unwrap();
        warm.push(t0.elapsed());
        assert_eq!(p.id.version, if i % 2 == 0 { "1.0.0" } else { "2.0.0" });
        let t0 = Instant::now();
        reg.activate(PluginKind::Sampler, "swap", if i % 2 == 0 { "2.0.0" } else { "1.0.0" }).unwrap();
        reg.resolve(PluginKind::Sampler, Some("swap")).unwrap();
        activate.push(t0.elapsed());
    }
    println!();
    println!("swap latency (until resolve() hands new requests the new version):");
    println!("  first load, compile included:          {:>8.2} ms", cold.as_secs_f64() * 1e3);
    println!(
        "  load of precompiled bytes (self-check): {:>8.2} ms (median of 20)  target < 100 ms: {}",
        median(warm.clone()).as_secs_f64() * 1e3,
        if median(warm).as_millis() < 100 { "met" } else { "NOT met" }
    );
    println!("  activate a loaded version:              {:>8.3} ms (median of 20)", median(activate).as_secs_f64() * 1e3);
}
