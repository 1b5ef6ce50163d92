//! The `weft` binary: parses the command line and dispatches. No engine logic lives here.

mod backend;
mod bench;
mod generate;
mod plot;
mod plugin;
mod serve;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "weft", version, about = "Serving runtime for DeepSeek-V3 / Kimi-K2 MoE models")]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible API (default: the bundled demo model on 127.0.0.1:8000).
    Serve(serve::ServeArgs),
    /// Manage the plugins of a running server through its admin API.
    Plugin(plugin::PluginArgs),
    /// Benchmarks (`weft bench serve` drives an OpenAI-compatible endpoint).
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Generate a continuation of one prompt and print it (or JSON with --json).
    Generate(generate::GenerateArgs),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Load-test a running server: TTFT, TPOT, ITL, e2e percentiles and tokens/s per concurrency.
    Serve(bench::BenchServeArgs),
    /// Draw the latency-vs-throughput chart (PNG) of `bench serve --json` results.
    Plot(plot::BenchPlotArgs),
}

/// The demo checkpoint shipped in the repository, used when no `--model` is given.
pub fn default_model_dir() -> PathBuf {
    if let Ok(p) = std::env::var("WEFT_DEMO_MODEL") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

fn main() {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::try_from_env("WEFT_LOG").unwrap_or_else(|_| "warn,weft_server=info".into())).with_writer(std::io::stderr).init();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Command::Serve(a) => serve::run(a),
        Command::Plugin(a) => plugin::run(a),
        Command::Bench(BenchCmd::Serve(a)) => bench::run(a),
        Command::Bench(BenchCmd::Plot(a)) => plot::run(a),
        Command::Generate(a) => generate::run(a),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
