//! What the GPU op tests share (`kernels.rs`, `kernels_moe.rs`): the device (or a skip where
//! there is none), a deterministic generator, weights both backends load identically, and the
//! comparison with its tolerances.
#![allow(dead_code)]

use std::borrow::Cow;
use weft_backend::{HostMatrix, WeightDtype};
use weft_cuda::CudaBackend;

pub fn gpu() -> Option<CudaBackend> {
    std::env::set_var("WEFT_CUDA_POISON", "1");
    match CudaBackend::new(0) {
        Ok(b) => {
            eprintln!("cuda: {} ({})", b.device_name, b.arch);
            Some(b)
        }
        // Only a machine without CUDA skips; any other failure (a kernel that does not
        // compile, a device error) fails the test.
        Err(e @ weft_backend::BackendError::Unavailable { .. }) => {
            // Straight to the stream, past the test harness's capture, so CI logs show it.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED (no usable CUDA device here): {e}");
            None
        }
        Err(e) => panic!("the CUDA backend failed to start: {e}"),
    }
}

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A bf16 matrix both backends load identically.
pub fn bf16_matrix(rng: &mut Rng, rows: usize, cols: usize, scale: f32) -> HostMatrix<'static> {
    let bytes: Vec<u8> = (0..rows * cols).flat_map(|_| half::bf16::from_f32(rng.f() * scale).to_bits().to_le_bytes()).collect();
    HostMatrix { name: "w".into(), rows, cols, dtype: WeightDtype::Bf16, bytes: Cow::Owned(bytes), scales: None }
}

/// An fp8 e4m3 matrix with 128×128 block scales, both backends load identically.
pub fn fp8_matrix(rng: &mut Rng, rows: usize, cols: usize) -> HostMatrix<'static> {
    let h = rng.next();
    let spec = weft_backend::dummy::DummySpec::new("w_fp8", vec![(h, rows)], cols, 1.0 / (cols as f32).sqrt(), Some((128, 128)));
    let mut m = spec.host();
    // vary the scales so a wrong block index shows
    if let Some(s) = m.scales.as_mut() {
        for v in s.scales.iter_mut() {
            *v *= 0.5 + rng.f().abs();
        }
    }
    m
}

/// max |a - b| / max |b|, failing on any NaN (an unwritten or broken element).
pub fn rel_err(op: &str, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "{op}: length");
    if let Some(i) = a.iter().position(|v| !v.is_finite()) {
        panic!("{op}: element {i} is {} (unwritten?)", a[i]);
    }
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-20);
    let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    err / scale
}

pub fn check(op: &str, a: &[f32], b: &[f32], tol: f32) {
    let e = rel_err(op, a, b);
    eprintln!("  {op:<22} rel err {e:.2e} (tol {tol:.0e})");
    assert!(e <= tol, "{op}: relative error {e} above {tol}");
}

// cuBLAS GEMMs take activations as two bf16 parts (`gemm_split`, on by default; outside a step
// every row, inside one all but prompt rows of long runs): f32-accumulation distance from the CPU;
// one bf16 part measured ~2e-3.
pub const GEMM_TOL: f32 = 1e-4;
// fp8 weights for cuBLAS are first copied to bf16 (code × block scale, rounded): the weights, not
// the activations, then carry ~2^-9 relative error (measured 1.8e-3 at 40 rows). Only batches
// past the tensor-core kernels' 64 rows take that path.
pub const FP8_COPY_TOL: f32 = 5e-3;
pub const F32_TOL: f32 = 1e-4;
/// The tensor-core kernels feed each activation as two bf16 parts (the rounded value and its
/// rounding error: 16 mantissa bits; weights are exact), so they stay within f32-accumulation
/// distance of the CUDA-core kernels (a single bf16 part measured up to 2.9e-3).
pub const MMA_TOL: f32 = 1e-4;

/// The tolerance of a product on `m` activation rows in these tests: weight streaming (CUDA or
/// tensor cores) below 100 rows, cuBLAS from there (fp8 weights through bf16 copies).
pub fn rows_tol(m: usize, fp8: bool) -> f32 {
    if m < 100 {
        MMA_TOL
    } else if fp8 {
        FP8_COPY_TOL
    } else {
        GEMM_TOL
    }
}

/// `rel_err` of rows `rows` (each `width` wide) against the whole reference's largest value.
pub fn rows_err(op: &str, a: &[f32], b: &[f32], width: usize, rows: std::ops::Range<usize>) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-20);
    let r = rows.start * width..rows.end * width;
    rel_err(op, &a[r.clone()], &b[r.clone()]) * b[r].iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-20) / scale
}
