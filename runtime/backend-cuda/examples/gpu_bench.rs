//! Single-stream prefill and decode speed of a model on the CUDA backend (or the CPU with
//! `--cpu`), through the reference generator: one load, then a 1-token generation (prefill
//! time) and an N+1-token one (decode time = the difference / N), three times each.
//!
//! `cargo run --release -p weft-cuda --example gpu_bench -- DIR [--dummy] [--prompt 1024] [--gen 128] [--cpu]`

use std::path::PathBuf;
use std::time::Instant;
use weft_backend::Backend;
use weft_model::generate::{generate, GenerateRequest};
use weft_model::sampling::SamplingParams;
use weft_model::LoadedModel;

fn run<B: Backend>(dir: &PathBuf, dummy: bool, backend: B, prompt_len: usize, gen: usize, label: &str) {
    let t = Instant::now();
    let demo = PathBuf::from(std::env::var("WEFT_DEMO_MODEL").unwrap_or_else(|_| "models/demo".into()));
    let lm = if dummy { LoadedModel::open_dummy(dir, backend, &demo) } else { LoadedModel::open(dir, backend) }.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let load = t.elapsed().as_secs_f64();
    let vocab = lm.model.cfg.vocab_size as u64;
    let prompt: Vec<u32> = (0..prompt_len as u64).map(|i| ((i * 2654435761 + 17) % (vocab - 200) + 100) as u32).collect();
    let req = |n: usize| GenerateRequest { prompt_ids: prompt.clone(), max_tokens: n, params: SamplingParams { temperature: 0.0, ..Default::default() }, logprobs: None, stop_ids: vec![] };
    // warm-up (kernel caches, cuBLAS heuristics)
    generate(&lm.model, &req(2)).unwrap();
    let (mut pre, mut dec) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        let t = Instant::now();
        generate(&lm.model, &req(1)).unwrap();
        let p = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let out = generate(&lm.model, &req(gen + 1)).unwrap();
        let total = t.elapsed().as_secs_f64();
        assert_eq!(out.token_ids.len(), gen + 1);
        pre = pre.min(p);
        dec = dec.min((total - p).max(1e-9) / gen as f64);
    }
    println!("| {label} | {} | {:.1} | {prompt_len} | {:.0} | {:.1} | {:.2} |", dir.display(), load, prompt_len as f64 / pre, 1.0 / dec, dec * 1e3);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(args.first().expect("usage: gpu_bench DIR [--dummy] [--prompt N] [--gen N] [--cpu]"));
    let flag = |f: &str| args.iter().any(|a| a == f);
    let num = |f: &str, d: usize| args.iter().position(|a| a == f).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (p, g) = (num("--prompt", 1024), num("--gen", 128));
    println!("| backend | model | load s | prompt | prefill tok/s | decode tok/s | ms/token |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    if flag("--cpu") {
        run(&dir, flag("--dummy"), weft_backend::cpu::CpuBackend::new(), p, g, "cpu");
    } else {
        let b = weft_cuda::CudaBackend::new(0).expect("CUDA device");
        let label = format!("cuda {}", b.device_name);
        run(&dir, flag("--dummy"), b, p, g, &label);
    }
}
