//! Choosing the compute backend from `--backend cpu|cuda|hip|auto` and `--device cuda:N`
//! (`hip:N`). The GPU backend is the one this binary was built for (`weft_cuda::BACKEND`:
//! "cuda", or "hip" from `--no-default-features --features hip`); naming the other is an error
//! that says how to build it.

use anyhow::{bail, Result};
use weft_backend::cpu::CpuBackend;
use weft_cuda::CudaBackend;

pub enum Chosen {
    Cpu(CpuBackend),
    Cuda(CudaBackend),
}

fn ordinal(device: &str) -> Result<usize> {
    let n = ["cuda", "hip"].iter().find_map(|p| device.strip_prefix(p)).map(|rest| rest.strip_prefix(':').unwrap_or(if rest.is_empty() { "0" } else { rest }));
    match n {
        Some(n) => n.parse().map_err(|_| anyhow::anyhow!("--device {device}: expected cuda:N or hip:N")),
        None => bail!("--device {device}: expected cuda:N or hip:N"),
    }
}

/// The GPU backend on `--device cuda:N` / `hip:N` (an error where there is none).
pub fn cuda(device: &str) -> Result<CudaBackend> {
    Ok(CudaBackend::new(ordinal(device)?)?)
}

/// `auto` takes CUDA when a device and its libraries are there, else the CPU (saying why).
pub fn choose(backend: &str, device: &str) -> Result<Chosen> {
    match backend {
        "cpu" => Ok(Chosen::Cpu(CpuBackend::new())),
        gpu if gpu == weft_cuda::BACKEND => Ok(Chosen::Cuda(cuda(device)?)),
        "cuda" => bail!("--backend cuda: this weft was built for AMD GPUs (hip); build it with default features for NVIDIA"),
        "hip" => bail!("--backend hip: this weft was built for NVIDIA GPUs; build it with `cargo build --release -p weft --no-default-features --features hip` (needs a HIP SDK) for AMD"),
        "auto" => match CudaBackend::new(ordinal(device)?) {
            Ok(b) => Ok(Chosen::Cuda(b)),
            Err(e) => {
                tracing::info!("using the CPU backend: {e}");
                Ok(Chosen::Cpu(CpuBackend::new()))
            }
        },
        other => bail!("--backend {other}: expected cpu, cuda, hip or auto"),
    }
}

impl Chosen {
    pub fn describe(&self) -> String {
        match self {
            Chosen::Cpu(_) => "cpu backend".into(),
            Chosen::Cuda(b) => format!("{} backend on {} ({})", weft_cuda::BACKEND, b.device_name, b.arch),
        }
    }
}
