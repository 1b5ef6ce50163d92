//! The HIP build against a real HIP SDK (`--no-default-features --features hip`; CI installs
//! Debian's ROCm through scripts/setup-hip.sh): it compiles and links libamdhip64 (hiprtc
//! included), and on a machine without an AMD GPU the real runtime's answer becomes
//! `Unavailable` — the server then falls back to the CPU — rather than a panic. On an AMD GPU
//! it starts the backend: kernels compiled by hiprtc for the device's gfx target, and one
//! small op checked against the CPU reference.
#![cfg(feature = "hip")]

use weft_backend::cpu::CpuBackend;
use weft_backend::{Backend, BackendError};
use weft_cuda::CudaBackend;

#[test]
fn the_real_hip_runtime_starts_or_says_why_not() {
    match CudaBackend::new(0) {
        Err(BackendError::Unavailable { backend, reason }) => {
            assert_eq!(backend, "hip");
            eprintln!("no usable AMD GPU here (as expected on CI): {reason}");
        }
        Err(e) => panic!("the HIP backend failed on a device it found: {e}"),
        Ok(g) => {
            eprintln!("hip: {} ({})", g.device_name, g.arch);
            let x: Vec<f32> = (0..4096).map(|i| (i as f32 * 0.37).sin()).collect();
            let w: Vec<f32> = (0..2048).map(|i| (i as f32 * 0.11).cos()).collect();
            let got = g.download(&g.rms_norm(&g.upload(&x).unwrap(), 2048, &g.upload(&w).unwrap(), 1e-6).unwrap()).unwrap();
            let want = CpuBackend::new().rms_norm(&x, 2048, &w, 1e-6).unwrap();
            let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| if (a - b).is_nan() { f32::INFINITY } else { m.max((a - b).abs()) });
            assert!(err < 1e-4, "rms_norm on the AMD GPU: max error {err}");
        }
    }
}
