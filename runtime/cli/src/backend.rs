//! Choosing the compute backend from `--backend cpu|cuda|auto` and `--device cuda:N`.

use anyhow::{bail, Result};
use weft_backend::cpu::CpuBackend;
use weft_cuda::CudaBackend;

pub enum Chosen {
    Cpu(CpuBackend),
    Cuda(CudaBackend),
}

fn ordinal(device: &str) -> Result<usize> {
    match device.strip_prefix("cuda:").or(if device == "cuda" { Some("0") } else { None }) {
        Some(n) => n.parse().map_err(|_| anyhow::anyhow!("--device {device}: expected cuda:N")),
        None => bail!("--device {device}: expected cuda:N"),
    }
}

/// A CUDA backend on `--device cuda:N` (an error where there is none).
pub fn cuda(device: &str) -> Result<CudaBackend> {
    Ok(CudaBackend::new(ordinal(device)?)?)
}

/// `auto` takes CUDA when a device and its libraries are there, else the CPU (saying why).
pub fn choose(backend: &str, device: &str) -> Result<Chosen> {
    match backend {
        "cpu" => Ok(Chosen::Cpu(CpuBackend::new())),
        "cuda" => Ok(Chosen::Cuda(cuda(device)?)),
        "auto" => match CudaBackend::new(ordinal(device)?) {
            Ok(b) => Ok(Chosen::Cuda(b)),
            Err(e) => {
                tracing::info!("using the CPU backend: {e}");
                Ok(Chosen::Cpu(CpuBackend::new()))
            }
        },
        other => bail!("--backend {other}: expected cpu, cuda or auto"),
    }
}

impl Chosen {
    pub fn describe(&self) -> String {
        match self {
            Chosen::Cpu(_) => "cpu backend".into(),
            Chosen::Cuda(b) => format!("cuda backend on {} ({})", b.device_name, b.arch),
        }
    }
}
