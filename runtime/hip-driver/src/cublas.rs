//! cudarc's `cublas` GEMM call as weft-cuda uses it (strided batched, bf16 or f32 inputs, f32
//! output and accumulation), served by the project's own tiled kernel (`kernels/gemm.cu`):
//! Debian's ROCm has no hipBLAS and hip-sys binds none for hipBLASLt. Column-major with
//! cuBLAS's transposition rules, so the backend's call is the same on both vendors.

use crate::api::{DriverError, Res};
use crate::driver::{CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};
use std::ffi::c_void;
use std::sync::Arc;

/// The kernel's source: the portability header and the GEMM.
pub const GEMM_SOURCE: &str = concat!(include_str!("../../../kernels/weft_port.h"), "\n", include_str!("../../../kernels/gemm.cu"));
/// Output tile edge of `gemm_strided` (one 256-thread block per 16×16 tile).
pub const GEMM_TILE: u32 = 16;

#[allow(non_camel_case_types)]
pub mod sys {
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum cublasOperation_t {
        CUBLAS_OP_N,
        CUBLAS_OP_T,
    }
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum cudaDataType {
        CUDA_R_16BF,
        CUDA_R_32F,
    }
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum cublasComputeType_t {
        CUBLAS_COMPUTE_32F,
    }
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum cublasGemmAlgo_t {
        CUBLAS_GEMM_DEFAULT,
    }
    /// # Safety
    /// None needed; `unsafe` only to match cudarc's signature.
    pub unsafe fn is_culib_present() -> bool {
        true
    }
}

/// The GEMM kernel, compiled for the stream's device.
pub struct CudaBlas {
    _inner: Arc<Blas>,
    handle: Handle,
}

pub struct Blas {
    stream: Arc<CudaStream>,
    func: CudaFunction,
    _module: Arc<CudaModule>,
}

/// What `gemm_strided_batched_ex` takes as its first argument: the kernel and its stream.
#[derive(Clone, Copy)]
pub struct Handle(*const Blas);

// SAFETY: points into the `Arc<Blas>` its `CudaBlas` keeps alive; `Blas` is only read.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl CudaBlas {
    /// Compiles `kernels/gemm.cu` for the gfx target of the device the stream is on.
    pub fn new(stream: Arc<CudaStream>) -> Res<Self> {
        let ctx = stream.context().clone();
        let arch: &'static str = Box::leak(ctx.gcn_arch()?.into_boxed_str());
        let code = crate::nvrtc::compile_ptx_with_opts(GEMM_SOURCE, crate::nvrtc::CompileOptions { arch: Some(arch), options: vec!["-std=c++17".into()] })?;
        let module = ctx.load_module(code)?;
        let func = module.load_function("gemm_strided")?;
        let inner = Arc::new(Blas { stream, func, _module: module });
        let handle = Handle(Arc::as_ptr(&inner));
        Ok(CudaBlas { _inner: inner, handle })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

pub mod result {
    use super::*;
    use sys::*;

    /// `C[i] = alpha·op(A[i])·op(B[i]) + beta·C[i]` for `batch` strided matrices, column-major
    /// as cuBLAS; A and B share one input type (bf16 or f32), C is f32.
    ///
    /// # Safety
    /// The pointers are device addresses of buffers large enough for the shapes and strides.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_strided_batched_ex(
        handle: Handle,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i32,
        n: i32,
        k: i32,
        alpha: *const c_void,
        a: *const c_void,
        atype: cudaDataType,
        lda: i32,
        stride_a: i64,
        b: *const c_void,
        btype: cudaDataType,
        ldb: i32,
        stride_b: i64,
        beta: *const c_void,
        c: *mut c_void,
        ctype: cudaDataType,
        ldc: i32,
        stride_c: i64,
        batch: i32,
        _compute: cublasComputeType_t,
        _algo: cublasGemmAlgo_t,
    ) -> Res<()> {
        if atype != btype || ctype != cudaDataType::CUDA_R_32F {
            return Err(DriverError(format!("gemm: inputs {atype:?}×{btype:?} into {ctype:?} are not supported (bf16 or f32 inputs, f32 output)")));
        }
        if m < 0 || n < 0 || k < 0 || batch < 0 {
            return Err(DriverError(format!("gemm: negative shape m {m} n {n} k {k} batch {batch}")));
        }
        if m == 0 || n == 0 || batch == 0 {
            return Ok(());
        }
        let blas = &*handle.0;
        let (alpha, beta) = (*(alpha as *const f32), *(beta as *const f32));
        let (ta, tb, bf16) = ((transa == cublasOperation_t::CUBLAS_OP_T) as i32, (transb == cublasOperation_t::CUBLAS_OP_T) as i32, (atype == cudaDataType::CUDA_R_16BF) as i32);
        let (mu, nu, ku, lda, ldb, ldc) = (m as u32, n as u32, k as u32, lda as u32, ldb as u32, ldc as u32);
        let (pa, pb, pc) = (a as u64, b as u64, c as u64);
        let mut l = blas.stream.launch_builder(&blas.func);
        l.arg(&ta).arg(&tb).arg(&bf16).arg(&mu).arg(&nu).arg(&ku).arg(&alpha).arg(&pa).arg(&lda).arg(&stride_a).arg(&pb).arg(&ldb).arg(&stride_b).arg(&beta).arg(&pc).arg(&ldc).arg(&stride_c);
        let grid = (mu.div_ceil(GEMM_TILE), nu.div_ceil(GEMM_TILE), batch as u32);
        l.launch(LaunchConfig { grid_dim: grid, block_dim: (GEMM_TILE * GEMM_TILE, 1, 1), shared_mem_bytes: 0 })
    }
}
