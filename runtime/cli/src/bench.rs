//! `weft bench serve`: drives any OpenAI-compatible completions endpoint (weft, vLLM, SGLang)
//! with random-token prompts of fixed input/output lengths (`ignore_eos` so lengths hold) at
//! each max-concurrency of a sweep (optionally with Poisson arrivals at a request rate), and reports request and token throughput with mean /
//! median / p99 TTFT, TPOT, ITL and end-to-end latency, as a table and as JSON.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_backend::rng::splitmix64;

#[derive(Args)]
pub struct BenchServeArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Model name (default: the first one /v1/models lists).
    #[arg(long)]
    model: Option<String>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 1024)]
    input_len: usize,
    /// Generated tokens per request.
    #[arg(long, default_value_t = 400)]
    output_len: usize,
    /// Max concurrent requests; a comma-separated list runs a sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    concurrency: Vec<usize>,
    /// Poisson arrivals at this many requests/s (default: all at once, limited by concurrency).
    #[arg(long)]
    request_rate: Option<f64>,
    /// Requests per concurrency level (default: `--waves` × the concurrency, at least 4).
    #[arg(long)]
    num_prompts: Option<usize>,
    /// Without --num-prompts: each level sends this many requests per concurrent slot.
    #[arg(long, default_value_t = 4)]
    waves: usize,
    /// Prompt token ids are drawn uniformly from [100, vocab-size).
    #[arg(long, default_value_t = 2000)]
    vocab_size: u32,
    /// `random` token prompts (the common harness), or `repeat`: a random block of
    /// --repeat-block tokens repeated to the input length (where prompt-lookup drafting helps).
    #[arg(long, default_value = "random")]
    prompt_style: String,
    #[arg(long, default_value_t = 32)]
    repeat_block: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sampling temperature of every request (0 = greedy, what vLLM's and SGLang's benchmark
    /// clients send by default).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// GPUs serving the endpoint (for tokens/s per GPU).
    #[arg(long)]
    gpus: Option<f64>,
    /// Price of one GPU-hour in dollars (for tokens per dollar).
    #[arg(long)]
    price_per_gpu_hour: Option<f64>,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also draw the latency-vs-throughput chart of the sweep as a PNG here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Legend label of this sweep in JSON and plots (default: the model name).
    #[arg(long)]
    label: Option<String>,
}

struct Record {
    ok: bool,
    error: Option<String>,
    ttft: f64,
    e2e: f64,
    itl: Vec<f64>,
    out_tokens: usize,
    in_tokens: usize,
}

fn one_request(agent: &ureq::Agent, url: &str, body: &Value, in_tokens: usize) -> Record {
    let t0 = Instant::now();
    let mut rec = Record { ok: false, error: None, ttft: 0.0, e2e: 0.0, itl: vec![], out_tokens: 0, in_tokens };
    let resp = match agent.post(&format!("{url}/v1/completions")).send_json(body.clone()) {
        Ok(r) => r,
        Err(ureq::Error::Status(code, r)) => {
            rec.error = Some(format!("HTTP {code}: {}", r.into_string().unwrap_or_default()));
            return rec;
        }
        Err(e) => {
            rec.error = Some(e.to_string());
            return rec;
        }
    };
    let mut last: Option<Instant> = None;
    let mut usage_tokens = None;
    for line in BufReader::new(resp.into_reader()).lines() {
        let Ok(line) = line else {
            rec.error = Some("the stream broke".into());
            return rec;
        };
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data.trim() == "[DONE]" {
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else { continue };
        if let Some(e) = v.get("error") {
            rec.error = Some(e.to_string());
            return rec;
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            usage_tokens = Some(n as usize);
        }
        // A token chunk: text (weft sends one chunk per token, its text possibly empty), or a
        // last chunk that still carries text.
        let choice = v["choices"].as_array().and_then(|c| c.first());
        let is_token = choice.is_some_and(|c| c["text"].as_str().is_some_and(|t| !t.is_empty() || c["finish_reason"].is_null()));
        if is_token {
            let now = Instant::now();
            match last {
                None => rec.ttft = now.duration_since(t0).as_secs_f64(),
                Some(l) => rec.itl.push(now.duration_since(l).as_secs_f64()),
            }
            last = Some(now);
            rec.out_tokens += 1;
        }
    }
    rec.e2e = t0.elapsed().as_secs_f64();
    rec.out_tokens = usage_tokens.unwrap_or(rec.out_tokens);
    // A server that sends no chunk for tokens without text: the request still succeeded if the
    // usage says it generated, but its TTFT is the end.
    rec.ok = last.is_some() || rec.out_tokens > 0;
    if last.is_none() {
        rec.ttft = rec.e2e;
    }
    if !rec.ok {
        rec.error = Some("no tokens received".into());
    }
    rec
}

fn stats(mut v: Vec<f64>) -> Value {
    if v.is_empty() {
        return json!({"mean": null, "median": null, "p99": null});
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    json!({"mean": v.iter().sum::<f64>() / v.len() as f64 * 1e3, "median": q(0.5) * 1e3, "p99": q(0.99) * 1e3})
}

fn run_level(a: &BenchServeArgs, model: &str, c: usize) -> Value {
    let n = a.num_prompts.unwrap_or((a.waves * c).max(4));
    let mut rng = a.seed ^ (c as u64) << 32;
    let bodies: Vec<Value> = (0..n)
        .map(|_| {
            let block = if a.prompt_style == "repeat" { a.repeat_block.clamp(1, a.input_len) } else { a.input_len };
            let fresh: Vec<u32> = (0..block).map(|_| 100 + (splitmix64(&mut rng) % (a.vocab_size.max(101) as u64 - 100)) as u32).collect();
            let ids: Vec<u32> = fresh.iter().copied().cycle().take(a.input_len).collect();
            json!({"model": model, "prompt": ids, "max_tokens": a.output_len, "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true, "temperature": a.temperature, "seed": splitmix64(&mut rng) >> 1})
        })
        .collect();
    // Arrival offsets: exponential gaps at --request-rate, else all at t=0.
    let mut t = 0.0f64;
    let arrivals: Vec<f64> = (0..n)
        .map(|_| {
            let at = t;
            if let Some(r) = a.request_rate {
                let u = ((splitmix64(&mut rng) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                t += -u.ln() / r;
            }
            at
        })
        .collect();
    let arrivals = Arc::new(arrivals);
    let bodies = Arc::new(bodies);
    let next = Arc::new(AtomicUsize::new(0));
    let records = Arc::new(Mutex::new(vec![]));
    let t0 = Instant::now();
    let threads: Vec<_> = (0..c.min(n))
        .map(|_| {
            let (bodies, next, records, url, in_len, arrivals) = (bodies.clone(), next.clone(), records.clone(), a.url.trim_end_matches('/').to_string(), a.input_len, arrivals.clone());
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new().timeout_read(Duration::from_secs(600)).build();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= bodies.len() {
                        break;
                    }
                    let wait = arrivals[i] - t0.elapsed().as_secs_f64();
                    if wait > 0.0 {
                        std::thread::sleep(Duration::from_secs_f64(wait));
                    }
                    let r = one_request(&agent, &url, &bodies[i], in_len);
                    let done = {
                        let mut recs = records.lock().unwrap();
                        recs.push(r);
                        recs.len()
                    };
                    progress(c, done, bodies.len(), t0.elapsed().as_secs_f64());
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    eprintln!();
    let secs = t0.elapsed().as_secs_f64();
    let recs = std::mem::take(&mut *records.lock().unwrap());
    let ok: Vec<&Record> = recs.iter().filter(|r| r.ok).collect();
    let failed = recs.len() - ok.len();
    if let Some(e) = recs.iter().find_map(|r| r.error.as_ref()) {
        eprintln!("  first error: {e}");
    }
    let out: usize = ok.iter().map(|r| r.out_tokens).sum();
    let inp: usize = ok.iter().map(|r| r.in_tokens).sum();
    let tpot: Vec<f64> = ok.iter().filter(|r| r.out_tokens > 1).map(|r| (r.e2e - r.ttft) / (r.out_tokens - 1) as f64).collect();
    let per_stream = if tpot.is_empty() { 0.0 } else { tpot.len() as f64 / tpot.iter().sum::<f64>() };
    let mut v = json!({
        "concurrency": c, "completed": ok.len(), "failed": failed, "duration_s": secs,
        "request_throughput": ok.len() as f64 / secs, "output_tokens_per_s": out as f64 / secs,
        "total_tokens_per_s": (out + inp) as f64 / secs, "per_stream_decode_tokens_per_s": per_stream,
        "ttft_ms": stats(ok.iter().map(|r| r.ttft).collect()), "tpot_ms": stats(tpot),
        "itl_ms": stats(ok.iter().flat_map(|r| r.itl.iter().copied()).collect()), "e2e_ms": stats(ok.iter().map(|r| r.e2e).collect()),
    });
    if let Some(g) = a.gpus {
        v["output_tokens_per_s_per_gpu"] = json!(out as f64 / secs / g);
        if let Some(p) = a.price_per_gpu_hour {
            v["output_tokens_per_dollar"] = json!(out as f64 / secs / g * 3600.0 / p);
        }
    }
    v
}

/// A progress bar on a terminal; on a pipe or file, a line at every quarter (logs stay short).
fn progress(c: usize, done: usize, n: usize, secs: f64) {
    use std::io::IsTerminal;
    const WIDTH: usize = 30;
    if std::io::stderr().is_terminal() {
        let fill = WIDTH * done / n.max(1);
        eprint!("\r  concurrency {c:>4} [{}{}] {done}/{n} requests, {secs:.0} s", "#".repeat(fill), ".".repeat(WIDTH - fill));
    } else if (4 * done) / n.max(1) != (4 * (done - 1)) / n.max(1) {
        eprintln!("  concurrency {c}: {done}/{n} requests, {secs:.0} s");
    }
}

/// A weft server's speculative counters from /metrics: (drafter, verify steps, drafts,
/// accepted). None for other servers or when speculation is off.
fn spec_counters(agent: &ureq::Agent, url: &str) -> Option<(String, f64, f64, f64)> {
    let text = agent.get(&format!("{}/metrics", url.trim_end_matches('/'))).timeout(Duration::from_secs(5)).call().ok()?.into_string().ok()?;
    let counter = |event: &str| -> Option<f64> {
        let key = format!("weft_engine_events_total{{event=\"{event}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(key.as_str())).and_then(|v| v.trim().parse().ok())
    };
    let drafter = text.lines().find_map(|l| l.strip_prefix("weft_speculative{drafter=\"")).and_then(|r| r.split('"').next())?.to_string();
    Some((drafter, counter("spec_verify_steps")?, counter("spec_draft_tokens")?, counter("spec_accepted_tokens")?))
}

fn f(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |x| if x >= 100.0 { format!("{x:.0}") } else { format!("{x:.1}") })
}

pub fn run(a: BenchServeArgs) -> Result<()> {
    if a.concurrency.iter().any(|&c| c == 0) || a.input_len == 0 || a.output_len == 0 {
        bail!("--concurrency, --input-len and --output-len must be at least 1");
    }
    if a.prompt_style != "random" && a.prompt_style != "repeat" {
        bail!("--prompt-style is `random` or `repeat`");
    }
    if a.request_rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        bail!("--request-rate must be a positive number of requests per second");
    }
    let agent = ureq::AgentBuilder::new().build();
    let model = match &a.model {
        Some(m) => m.clone(),
        None => {
            let v: Value = agent.get(&format!("{}/v1/models", a.url.trim_end_matches('/'))).call().with_context(|| format!("GET {}/v1/models", a.url))?.into_json()?;
            v["data"][0]["id"].as_str().context("/v1/models lists no model")?.to_string()
        }
    };
    eprintln!("bench serve: {} `{model}`, {} input + {} output tokens, concurrency {:?}", a.url, a.input_len, a.output_len, a.concurrency);
    println!("| conc | done | fail | req/s | out tok/s | total tok/s | stream tok/s | TTFT mean / p50 / p99 ms | TPOT mean / p50 / p99 ms | ITL p50 / p99 ms | e2e p50 / p99 ms |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- |");
    // Each level's row is printed as soon as it finishes (a sweep cut short keeps its rows).
    let mut levels: Vec<Value> = vec![];
    for &c in &a.concurrency {
        let before = spec_counters(&agent, &a.url);
        let mut l = run_level(&a, &model, c);
        // A weft server with speculative decoding: acceptance during this level.
        if let (Some(b), Some(e)) = (before, spec_counters(&agent, &a.url)) {
            let (rounds, drafted, accepted) = (e.1 - b.1, e.2 - b.2, e.3 - b.3);
            if rounds > 0.0 {
                l["speculative"] = json!({"drafter": e.0, "verify_steps": rounds, "draft_tokens": drafted, "accepted_tokens": accepted, "acceptance_rate": accepted / drafted.max(1.0), "mean_accepted_length": (accepted + rounds) / rounds});
            }
        }
        println!(
            "| {} | {} | {} | {:.2} | {} | {} | {} | {} / {} / {} | {} / {} / {} | {} / {} | {} / {} |",
            l["concurrency"],
            l["completed"],
            l["failed"],
            l["request_throughput"].as_f64().unwrap_or(0.0),
            f(&l["output_tokens_per_s"]),
            f(&l["total_tokens_per_s"]),
            f(&l["per_stream_decode_tokens_per_s"]),
            f(&l["ttft_ms"]["mean"]),
            f(&l["ttft_ms"]["median"]),
            f(&l["ttft_ms"]["p99"]),
            f(&l["tpot_ms"]["mean"]),
            f(&l["tpot_ms"]["median"]),
            f(&l["tpot_ms"]["p99"]),
            f(&l["itl_ms"]["median"]),
            f(&l["itl_ms"]["p99"]),
            f(&l["e2e_ms"]["median"]),
            f(&l["e2e_ms"]["p99"]),
        );
        if let Some(sp) = l.get("speculative") {
            println!(
                "|   | speculative ({}): {:.0}% of drafts accepted, {:.2} tokens per verify step |",
                sp["drafter"].as_str().unwrap_or("?"),
                100.0 * sp["acceptance_rate"].as_f64().unwrap_or(0.0),
                sp["mean_accepted_length"].as_f64().unwrap_or(0.0)
            );
        }
        let _ = std::io::Write::flush(&mut std::io::stdout());
        levels.push(l);
    }
    let doc = json!({"url": a.url, "model": model, "label": a.label.as_deref().unwrap_or(&model), "input_len": a.input_len, "output_len": a.output_len, "request_rate": a.request_rate, "temperature": a.temperature, "prompt_style": a.prompt_style, "results": levels});
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&doc)?).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        crate::plot::draw(&[crate::plot::Series::from_doc(&doc, &model)?], &crate::plot::title_of(&doc), p)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}
