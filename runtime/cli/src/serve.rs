//! `weft serve`: loads a model (the bundled demo when none is given), starts the engine with
//! the default plugins (plus any in `--plugin-dir`, watched for changes) and serves the
//! OpenAI-compatible API until SIGTERM or Ctrl-C, then drains and exits 0.

use crate::backend::Chosen;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use weft_backend::Backend;
use weft_engine::{DrafterKind, Engine, EngineConfig, SpecConfig};
use weft_model::dflash::DFlashModel;
use weft_model::tokenizer::TextTokenizer;
use weft_model::{LoadOptions, LoadedModel};
use weft_plugin_host::{Registry, SandboxLimits};
use weft_server::{AppState, ServerConfig};

#[derive(Args)]
pub struct ServeArgs {
    /// Model directory in the Hugging Face layout (default: the bundled demo model).
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// TCP port (0 picks a free one; the address is printed on stdout).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The `model` name clients use (default: the model directory's name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// KV cache pool size in pages (default 512, or what --kv-memory-fraction allows).
    #[arg(long, conflicts_with = "kv_memory_fraction")]
    num_pages: Option<usize>,
    /// Size the KV pool so that this process uses at most this fraction of the backend's total
    /// memory (device memory on a GPU), weights included — vLLM's --gpu-memory-utilization.
    #[arg(long)]
    kv_memory_fraction: Option<f64>,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 64)]
    page_size: usize,
    /// Element type of the latent KV cache: f32, or bf16 (half the bytes each decode step
    /// reads, twice the tokens per GiB; values rounded to bf16 when stored).
    #[arg(long, default_value = "f32", value_parser = weft_backend::KvDtype::parse)]
    kv_cache_dtype: weft_backend::KvDtype,
    /// Tokens per forward pass (decodes plus prefill chunks).
    #[arg(long, default_value_t = 512)]
    token_budget: usize,
    /// Sequences running at once.
    #[arg(long, default_value_t = 64)]
    max_sequences: usize,
    /// Bearer token of the admin API (disabled when unset).
    #[arg(long, env = "WEFT_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Load every *.wasm plugin in this directory at start and reload on change.
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// Request body limit in bytes for the OpenAI routes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Memory cap of one plugin instance, MiB.
    #[arg(long, default_value_t = 64)]
    plugin_memory_mib: usize,
    /// Deadline of one plugin call, milliseconds.
    #[arg(long, default_value_t = 50)]
    plugin_deadline_ms: u64,
    /// After SIGTERM, how long in-flight requests may run before they are aborted.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_secs: u64,
    /// Compute backend: cpu, cuda (hip in a HIP build), or auto (the GPU when one is there,
    /// else the CPU).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// The GPU for the cuda backend.
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// `safetensors` (the checkpoint's files) or `dummy` (random weights of the config's
    /// shapes, for benchmarks; the tokenizer comes from the demo model when DIR has none).
    #[arg(long, default_value = "safetensors")]
    load_format: String,
    /// Speculative decoding drafter: `ngram` (prompt lookup), `draft-model` (--draft-model DIR, a
    /// small model with the same vocabulary), `mtp` (the checkpoint's multi-token-prediction
    /// module, DeepSeek-V3's `num_nextn_predict_layers`), `dflash` (--draft-model DIR, a DFlash
    /// block-diffusion draft for this target; drafts at most its block size − 1), or `oracle` (a benchmark
    /// instrument: each draft accepted with probability --oracle-acceptance at the real cost of
    /// verification; its text is not the model's output). Off when not given.
    #[arg(long)]
    speculative: Option<String>,
    /// Drafts per verify step, at most.
    #[arg(long, default_value_t = 4)]
    num_draft_tokens: usize,
    /// Prompt lookup: longest and shortest n-gram matched.
    #[arg(long, default_value_t = 4)]
    ngram_max: usize,
    #[arg(long, default_value_t = 1)]
    ngram_min: usize,
    /// Keep the draft length fixed (default: adapt it to the acceptance rate, pausing drafting
    /// while acceptance stays low).
    #[arg(long)]
    fixed_draft_length: bool,
    /// The draft model's or DFlash draft's checkpoint directory (with --load-format dummy: its
    /// config, weights synthesized).
    #[arg(long)]
    draft_model: Option<PathBuf>,
    /// No drafting in steps where more than this many sequences decode (0: no limit).
    #[arg(long, default_value_t = 0)]
    speculative_disable_batch: usize,
    /// The oracle's per-draft acceptance probability.
    #[arg(long, default_value_t = 0.7)]
    oracle_acceptance: f64,
    /// Split the model over this many tensor-parallel ranks, threads of this process, each
    /// with its own backend: with `--collective local` all on the same device, summing through
    /// host memory (the sharded math of a multi-GPU deployment, for checking it — slower than
    /// one rank); with `--collective nccl` one GPU per rank. The MTP drafter is not supported
    /// with it.
    #[arg(long, default_value_t = 1)]
    tensor_parallel: usize,
    /// How tensor-parallel ranks sum partial results: `local` (threads on the one --device,
    /// through host memory: checks the sharded math anywhere) or `nccl` (one GPU per rank — RCCL
    /// in the AMD build, librccl.so on the loader path — on
    /// devices N..N+size-1 from --device cuda:N; step graphs record the all-reduces; needs
    /// libnccl.so on the loader path).
    #[arg(long, default_value = "local")]
    collective: String,
    /// With --tensor-parallel: each rank holds whole routed experts (an even range of them)
    /// instead of a slice of every expert; attention, dense and shared experts stay split.
    #[arg(long)]
    expert_parallel: bool,
}

pub fn run(a: ServeArgs) -> Result<()> {
    let chosen = crate::backend::choose(&a.backend, &a.device)?;
    let what = if a.tensor_parallel > 1 { format!("{}, {} tensor-parallel ranks", chosen.describe(), a.tensor_parallel) } else { chosen.describe() };
    // A draft model gets a backend of its own on the same device.
    let device = a.device.clone();
    match (a.collective.as_str(), chosen) {
        ("local", Chosen::Cpu(b)) => run_on(a, b, what, || Ok(weft_backend::cpu::CpuBackend::new()), None),
        ("local", Chosen::Cuda(b)) => run_on(a, b, what, move || crate::backend::cuda(&device), None),
        ("nccl", Chosen::Cuda(b)) if a.tensor_parallel > 1 => {
            let ranks = nccl_ranks(b, a.tensor_parallel)?;
            let what = format!("{what}, NCCL");
            run_on(a, ranks.0, what, move || crate::backend::cuda(&device), Some((ranks.1, ranks.2)))
        }
        ("nccl", _) => bail!("--collective nccl needs a GPU backend (cuda, or hip with RCCL) and --tensor-parallel of at least 2"),
        (other, _) => bail!("--collective {other}: expected local or nccl"),
    }
}

/// Rank 0 on `lead`'s device, ranks 1.. on the devices after it, and their NCCL group.
#[allow(clippy::type_complexity)]
fn nccl_ranks(lead: weft_cuda::CudaBackend, size: usize) -> Result<(weft_cuda::CudaBackend, Vec<weft_cuda::CudaBackend>, Vec<Arc<dyn weft_backend::Collective<weft_cuda::CudaBackend>>>)> {
    // NCCL on NVIDIA; the HIP build's `weft_cuda::nccl` is RCCL.
    let first = lead.stream.context().ordinal();
    let followers = (1..size).map(|r| weft_cuda::CudaBackend::new(first + r).with_context(|| format!("tensor-parallel rank {r} on device {}", first + r))).collect::<Result<Vec<_>>>()?;
    let all: Vec<&weft_cuda::CudaBackend> = std::iter::once(&lead).chain(followers.iter()).collect();
    let group = weft_cuda::nccl::nccl_group(&all)?;
    let ranks = group.into_iter().map(|g| -> Arc<dyn weft_backend::Collective<weft_cuda::CudaBackend>> { g }).collect();
    Ok((lead, followers, ranks))
}

/// `group`: the other ranks' backends and every rank's collective, when the caller built the
/// tensor-parallel group (NCCL); else `--tensor-parallel` ranks share `backend`'s device.
#[allow(clippy::type_complexity)]
fn run_on<B: Backend>(a: ServeArgs, backend: B, what: String, second: impl Fn() -> Result<B>, group: Option<(Vec<B>, Vec<Arc<dyn weft_backend::Collective<B>>>)>) -> Result<()> {
    if a.page_size == 0 || a.num_pages == Some(0) || a.token_budget == 0 || a.max_sequences == 0 {
        bail!("--num-pages, --page-size, --token-budget and --max-sequences must all be at least 1");
    }
    if a.tensor_parallel == 0 {
        bail!("--tensor-parallel must be at least 1");
    }
    if a.expert_parallel && a.tensor_parallel < 2 {
        bail!("--expert-parallel splits the experts over --tensor-parallel ranks: give it at least 2");
    }
    if a.tensor_parallel > 1 && a.speculative.as_deref() == Some("mtp") {
        bail!("--tensor-parallel {} works without --speculative mtp (the MTP drafter is not split yet)", a.tensor_parallel);
    }
    let dir = a.model.clone().unwrap_or_else(crate::default_model_dir);
    let name = a.served_model_name.clone().unwrap_or_else(|| std::fs::canonicalize(&dir).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).unwrap_or_else(|| "weft".into()));
    // The checkpoint's MTP layers take memory only when they draft.
    let opts = LoadOptions { mtp: a.speculative.as_deref() == Some("mtp"), expert_parallel: a.expert_parallel };
    let mut lm = match (a.load_format.as_str(), group) {
        ("safetensors" | "auto", Some((followers, ranks))) => LoadedModel::open_tensor_parallel_group(&dir, opts, std::iter::once(backend).chain(followers).collect(), ranks),
        ("safetensors" | "auto", None) if a.tensor_parallel > 1 => {
            LoadedModel::open_tensor_parallel(&dir, a.tensor_parallel, opts, backend, |_| second().map_err(|e| weft_backend::BackendError::Device(format!("{e:#}"))))
        }
        ("safetensors" | "auto", None) => LoadedModel::open_with(&dir, backend, opts),
        ("dummy", Some((followers, ranks))) => LoadedModel::open_dummy_tensor_parallel_group(&dir, &crate::default_model_dir(), opts, std::iter::once(backend).chain(followers).collect(), ranks),
        ("dummy", None) if a.tensor_parallel > 1 => {
            LoadedModel::open_dummy_tensor_parallel(&dir, &crate::default_model_dir(), a.tensor_parallel, opts, backend, |_| second().map_err(|e| weft_backend::BackendError::Device(format!("{e:#}"))))
        }
        ("dummy", None) => LoadedModel::open_dummy_with(&dir, backend, &crate::default_model_dir(), opts),
        (other, _) => bail!("--load-format {other}: expected safetensors or dummy"),
    }
    .with_context(|| format!("loading model from {}", dir.display()))?;
    lm.model.set_kv_dtype(a.kv_cache_dtype);
    let tdir = if dir.join("tokenizer.json").exists() { dir.clone() } else { crate::default_model_dir() };
    let tokenizer = Arc::new(TextTokenizer::from_dir(&tdir)?);
    let defaults = lm.defaults.clone();
    let spec = match a.speculative.as_deref() {
        None | Some("off") | Some("none") => None,
        Some("ngram") => {
            if a.ngram_min == 0 || a.ngram_min > a.ngram_max || a.num_draft_tokens == 0 || a.num_draft_tokens > 64 {
                bail!("--speculative ngram needs 1 <= --ngram-min <= --ngram-max and --num-draft-tokens in 1..=64");
            }
            Some(SpecConfig {
                drafter: DrafterKind::Ngram { min_n: a.ngram_min, max_n: a.ngram_max },
                num_draft_tokens: a.num_draft_tokens,
                adaptive: !a.fixed_draft_length,
                max_batch: a.speculative_disable_batch,
            })
        }
        Some(name @ ("draft-model" | "mtp" | "dflash")) => {
            if a.num_draft_tokens == 0 || a.num_draft_tokens > 64 {
                bail!("--num-draft-tokens must be in 1..=64");
            }
            let drafter = match name {
                "mtp" => DrafterKind::Mtp,
                "dflash" => DrafterKind::DFlash,
                _ => DrafterKind::Model,
            };
            Some(SpecConfig { drafter, num_draft_tokens: a.num_draft_tokens, adaptive: !a.fixed_draft_length, max_batch: a.speculative_disable_batch })
        }
        Some("oracle") => {
            if !(0.0..=1.0).contains(&a.oracle_acceptance) || a.num_draft_tokens == 0 || a.num_draft_tokens > 64 {
                bail!("--speculative oracle needs --oracle-acceptance in [0, 1] and --num-draft-tokens in 1..=64");
            }
            Some(SpecConfig {
                drafter: DrafterKind::Oracle { acceptance: a.oracle_acceptance },
                num_draft_tokens: a.num_draft_tokens,
                adaptive: !a.fixed_draft_length,
                max_batch: a.speculative_disable_batch,
            })
        }
        Some(other) => bail!("--speculative {other:?}: the drafters are `ngram`, `draft-model`, `mtp`, `dflash` and `oracle` (a benchmark instrument), or `off`"),
    };
    let draft = match (&spec, &a.draft_model) {
        (Some(SpecConfig { drafter: DrafterKind::Model, .. }), Some(d)) => {
            let b = second().context("a backend for the draft model")?;
            let lm = match a.load_format.as_str() {
                "dummy" => LoadedModel::open_dummy(d, b, &crate::default_model_dir()),
                _ => LoadedModel::open(d, b),
            }
            .with_context(|| format!("loading the draft model from {}", d.display()))?;
            Some(lm)
        }
        (Some(SpecConfig { drafter: DrafterKind::Model, .. }), None) => bail!("--speculative draft-model needs --draft-model DIR"),
        (Some(SpecConfig { drafter: DrafterKind::DFlash, .. }), _) => None,
        (_, Some(_)) => bail!("--draft-model is only used with --speculative draft-model or dflash"),
        _ => None,
    };
    // A DFlash draft runs on the target's backend (it uses the target's embedding and head).
    let dflash = match (&spec, &a.draft_model) {
        (Some(SpecConfig { drafter: DrafterKind::DFlash, .. }), Some(d)) => Some(
            match a.load_format.as_str() {
                "dummy" => DFlashModel::open_dummy(d, &lm.model.backend, &lm.model.cfg),
                _ => DFlashModel::open(d, &lm.model.backend, &lm.model.cfg),
            }
            .with_context(|| format!("loading the DFlash draft from {}", d.display()))?,
        ),
        (Some(SpecConfig { drafter: DrafterKind::DFlash, .. }), None) => bail!("--speculative dflash needs --draft-model DIR (a DFlash draft checkpoint)"),
        _ => None,
    };
    let num_pages = match (a.num_pages, a.kv_memory_fraction) {
        (Some(n), _) => n,
        (None, None) => 512,
        (None, Some(f)) => {
            if !(f > 0.0 && f <= 1.0) {
                bail!("--kv-memory-fraction {f}: must be in (0, 1]");
            }
            let (free, total) = lm.model.backend.memory_info().with_context(|| format!("--kv-memory-fraction: the {} backend cannot report its memory; use --num-pages", lm.model.backend.name()))?;
            // A draft model's cache gets as many pages as the target's; every tensor-parallel
            // rank holds a whole latent pool on this device.
            let per_page = lm.model.kv_layout(1, a.page_size).bytes_per_page() * a.tensor_parallel
                + draft.as_ref().map_or(0, |d| d.model.kv_layout(1, a.page_size).bytes_per_page())
                + dflash.as_ref().map_or(0, |d| d.kv_layout(1, a.page_size).bytes_per_page());
            let budget = (total as f64 * f) as i64 - (total - free) as i64;
            let n = budget.max(0) as usize / per_page;
            if n == 0 {
                bail!(
                    "--kv-memory-fraction {f}: {:.1} GiB of {:.1} GiB are already in use, nothing is left for the KV cache",
                    (total - free) as f64 / (1u64 << 30) as f64,
                    total as f64 / (1u64 << 30) as f64
                );
            }
            tracing::info!(pages = n, page_bytes = per_page, "KV pool sized from --kv-memory-fraction");
            n
        }
    };
    let limits = SandboxLimits { memory_bytes: a.plugin_memory_mib << 20, deadline: Duration::from_millis(a.plugin_deadline_ms) };
    let registry = Arc::new(Registry::with_defaults(limits).context("loading the default plugins")?);
    if let Some(pd) = &a.plugin_dir {
        if !pd.is_dir() {
            bail!("--plugin-dir {}: not a directory", pd.display());
        }
        for (p, e) in registry.scan_dir(pd, &mut Default::default()) {
            eprintln!("warning: plugin {} not loaded: {e}", p.display());
        }
        registry.watch_dir(pd.clone(), Duration::from_secs(2));
    }
    let cfg = EngineConfig { num_pages, page_size: a.page_size, token_budget: a.token_budget, max_sequences: a.max_sequences, spec };
    let engine = Arc::new(match dflash {
        Some(d) => Engine::start_with_dflash(lm, d, registry, cfg)?,
        None => Engine::start_with_draft(lm, draft, registry, cfg)?,
    });
    let server_cfg = ServerConfig { model_name: name.clone(), max_body_bytes: a.max_body_bytes, admin_token: a.admin_token.clone().filter(|t| !t.is_empty()), ..Default::default() };
    let admin = if server_cfg.admin_token.is_some() { "on" } else { "off (set --admin-token)" };
    let state = Arc::new(AppState::new(engine.clone(), tokenizer, defaults, server_cfg));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get().min(4))).enable_all().build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port)).await.with_context(|| format!("binding {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        println!("weft: serving `{name}` on http://{addr} ({what}, {num_pages} KV pages of {} tokens, admin API {admin})", a.page_size);
        use std::io::Write;
        std::io::stdout().flush()?;
        weft_server::serve(listener, state, shutdown_signal(), Duration::from_secs(a.shutdown_grace_secs)).await?;
        anyhow::Ok(())
    })?;
    rt.shutdown_timeout(Duration::from_secs(1));
    engine.shutdown();
    println!("weft: stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
