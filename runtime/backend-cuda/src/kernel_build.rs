//! The kernels as the backend builds them: their source (`kernels/`, built in, or read from
//! `WEFT_CUDA_KERNEL_DIR`), the entries it loads by name (`KERNELS`), the kernel variant's
//! defines (`WEFT_CUDA_KERNEL_DEFINES`), and the NVRTC / hiprtc compile for the device's
//! target (sm_90a etc., or the gfx target on AMD).
#[cfg(feature = "hip-mock")]
use crate::emu;
#[cfg(not(feature = "cuda"))]
use crate::SUBGROUP;
use crate::{dev, unavailable, BackendError, CudaContext, Result};

pub const KERNEL_SOURCE: &str = concat!(
    include_str!("../../../kernels/weft_port.h"),
    "\n",
    include_str!("../../../kernels/weft.cu"),
    "\n",
    include_str!("../../../kernels/gemv.cu"),
    "\n",
    include_str!("../../../kernels/moe.cu"),
    "\n",
    include_str!("../../../kernels/mma.cu"),
    "\n",
    include_str!("../../../kernels/moe_gemm.cu"),
    "\n",
    include_str!("../../../kernels/moe_wgmma.cu"),
    "\n",
    include_str!("../../../kernels/mla.cu"),
    "\n",
    include_str!("../../../kernels/mla_grouped.cu"),
    "\n",
    include_str!("../../../kernels/mla_wgmma.cu"),
    "\n",
    include_str!("../../../kernels/mla_pair.cu"),
    "\n",
    include_str!("../../../kernels/mla_flash.cu"),
    "\n",
    include_str!("../../../kernels/dummy.cu"),
    "\n",
    include_str!("../../../kernels/sample.cu"),
    "\n",
    include_str!("../../../kernels/gemm.cu"),
);
/// Every kernel the backend loads by name (a missing one fails `CudaBackend::new`).
pub const KERNELS: &[&str] = &[
    "cast_f32_bf16",
    "cast_f32_bf16_split",
    "embed_bf16",
    "gather_rows",
    "rms_norm",
    "add_rms_norm",
    "add_inplace",
    "add_halves",
    "add_halves2",
    "add_rms_norm_halves",
    "silu_mul_halves",
    "silu_mul_split",
    "moe_pairs_split",
    "moe_pairs_silu_split",
    "moe_pairs_combine",
    "mla_gather_split",
    "mla_gather_bf16",
    "mla_q_split",
    "mla_k_split",
    "mla_softmax_split",
    "scatter_rows",
    "silu_mul",
    "split_rope_q",
    "store_kv",
    "store_kv_bf16",
    "rope_q_store_kv",
    "rope_q_store_kv_bf16",
    "mla_attention",
    "mla_attention_bf16",
    "kv_store_rows",
    "gqa_attention",
    "scatter_add_weighted",
    "fill_f32",
    "gemv_bf16_r1_t1",
    "gemv_bf16_r2_t1",
    "gemv_bf16_r4_t1",
    "gemv_fp8_r1_t1",
    "gemv_fp8_r2_t1",
    "gemv_fp8_r4_t1",
    "gemv_bf16_r1_t8",
    "gemv_bf16_r2_t8",
    "gemv_bf16_r4_t8",
    "gemv_fp8_r1_t8",
    "gemv_fp8_r2_t8",
    "gemv_fp8_r4_t8",
    "gemv2_bf16_r1_t1",
    "gemv2_bf16_r2_t1",
    "gemv2_bf16_r4_t1",
    "gemv2_fp8_r1_t1",
    "gemv2_fp8_r2_t1",
    "gemv2_fp8_r4_t1",
    "gemv2_bf16_r1_t8",
    "gemv2_bf16_r2_t8",
    "gemv2_bf16_r4_t8",
    "gemv2_fp8_r1_t8",
    "gemv2_fp8_r2_t8",
    "gemv2_fp8_r4_t8",
    "gemv_gated_bf16_t1",
    "gemv_gated_fp8_t1",
    "gemv_gated_bf16_t8",
    "gemv_gated_fp8_t8",
    "gemv_add_rms_norm_bf16_r1",
    "gemv_add_rms_norm_bf16_r2",
    "gemv_add_rms_norm_bf16_r4",
    "gemv_add_rms_norm_fp8_r1",
    "gemv_add_rms_norm_fp8_r2",
    "gemv_add_rms_norm_fp8_r4",
    "gemv_f32_t1",
    "gemv_f32_t8",
    "gemv_f32_pre_t1",
    "dequant_fp8_bf16",
    "moe_route_plan",
    "moe_router_route_plan",
    "moe_gate_up_bf16_t1",
    "moe_gate_up_fp8_t1",
    "moe_down_bf16_t1",
    "moe_down_fp8_t1",
    "moe_gate_up_bf16_t8",
    "moe_gate_up_fp8_t8",
    "moe_down_bf16_t8",
    "moe_down_fp8_t8",
    "gemv_mma_bf16_n1",
    "gemv_mma_bf16_n2",
    "gemv_mma_bf16_n4",
    "gemv_mma_bf16_n8",
    "gemv_mma_bf16_n8_c2",
    "gemv_mma_bf16_n8_c4",
    "gemv_mma_bf16_n8_c8",
    "gemv_mma_fp8_n1",
    "gemv_mma_fp8_n2",
    "gemv_mma_fp8_n4",
    "gemv_gated_mma_bf16_n1",
    "gemv_gated_mma_bf16_n2",
    "gemv_gated_mma_bf16_n4",
    "gemv_gated_mma_bf16_n8",
    "gemv_gated_mma_bf16_n8_c2",
    "gemv_gated_mma_bf16_n8_c4",
    "gemv_gated_mma_bf16_n8_c8",
    "gemv_gated_mma_fp8_n1",
    "gemv_gated_mma_fp8_n2",
    "gemv_gated_mma_fp8_n4",
    "moe_gate_up_bf16_mma",
    "moe_gate_up_fp8_mma",
    "moe_down_bf16_mma",
    "moe_down_fp8_mma",
    "moe_gemm_gate_up_bf16",
    "moe_gemm_gate_up_fp8",
    "moe_gemm_down_bf16",
    "moe_gemm_down_fp8",
    "moe_gemm_split",
    "moe_wg_gate_up_bf16",
    "moe_wg_down_bf16",
    "moe_wg2_gate_up_bf16",
    "moe_wg2_down_bf16",
    "moe_wg_split",
    "moe_combine",
    "moe_combine_add_rms_norm",
    "moe_down_combine_bf16_t1",
    "moe_down_combine_fp8_t1",
    "mla_decode",
    "mla_decode_bf16",
    "mla_decode_mma",
    "mla_decode_mma_bf16",
    "mla_decode_mmg4w_bf16",
    "mla_decode_mmg2_bf16",
    "mla_decode_mmg1w_bf16",
    "mla_decode_mmg2w",
    "mla_decode_mmg4wq1_bf16",
    "mla_decode_wg_bf16",
    "mla_decode_wg2_bf16",
    "mla_decode_wgh_bf16",
    "mla_decode_wgh1_bf16",
    "mla_decode_wgs_bf16",
    "mla_decode_wgp_bf16",
    "mla_combine",
    "rope_store_absorb_bf16_r1",
    "rope_store_absorb_bf16_r2",
    "rope_store_absorb_bf16_r4",
    "rope_store_absorb_fp8_r1",
    "rope_store_absorb_fp8_r2",
    "rope_store_absorb_fp8_r4",
    "rope_store_absorb_kvbf16_bf16_r1",
    "rope_store_absorb_kvbf16_bf16_r2",
    "rope_store_absorb_kvbf16_bf16_r4",
    "rope_store_absorb_kvbf16_fp8_r1",
    "rope_store_absorb_kvbf16_fp8_r2",
    "rope_store_absorb_kvbf16_fp8_r4",
    "mla_uv_merge_bf16_r1_t1",
    "mla_uv_merge_fp8_r1_t1",
    "mla_uv_merge_bf16_r2_t1",
    "mla_uv_merge_fp8_r2_t1",
    "mla_uv_merge_bf16_r4_t1",
    "mla_uv_merge_fp8_r4_t1",
    "mla_uv_merge_bf16_r1_t8",
    "mla_uv_merge_fp8_r1_t8",
    "mla_uv_merge_bf16_r2_t8",
    "mla_uv_merge_fp8_r2_t8",
    "mla_uv_merge_bf16_r4_t8",
    "mla_uv_merge_fp8_r4_t8",
    "mla_flash_bf16",
    "dummy_bf16",
    "dummy_fp8",
    "front_edits",
    "front_topk",
];

/// 90 for "sm_90a", 100 for "sm_100a"; 0 for anything else (AMD's gfx targets).
pub(crate) fn arch_number(arch: &str) -> u32 {
    arch.strip_prefix("sm_").map_or(0, |a| a.trim_end_matches(|c: char| c.is_ascii_alphabetic()).parse().unwrap_or(0))
}

#[cfg(feature = "cuda")]
fn arch_name(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (9, 0) => "sm_90a",
        (10, 0) => "sm_100a",
        (8, 9) => "sm_89",
        (8, 6) => "sm_86",
        (8, 0) => "sm_80",
        (12, 0) => "sm_120a",
        _ => "sm_80",
    }
}

/// The files of `KERNEL_SOURCE`, in its order.
const KERNEL_FILES: &[&str] = &[
    "weft_port.h",
    "weft.cu",
    "gemv.cu",
    "moe.cu",
    "mma.cu",
    "moe_gemm.cu",
    "moe_wgmma.cu",
    "mla.cu",
    "mla_grouped.cu",
    "mla_wgmma.cu",
    "mla_pair.cu",
    "mla_flash.cu",
    "dummy.cu",
    "sample.cu",
    "gemm.cu",
];

/// The kernels' source: the built-in one, or with `WEFT_CUDA_KERNEL_DIR=<dir>` the files of
/// `KERNEL_FILES` read from that folder at start-up — for kernel experiments on a GPU machine
/// that has no Rust toolchain (the host code's launches must still match the kernels).
fn kernel_source() -> Result<std::borrow::Cow<'static, str>> {
    let Ok(dir) = std::env::var("WEFT_CUDA_KERNEL_DIR") else { return Ok(KERNEL_SOURCE.into()) };
    let mut s = String::new();
    for f in KERNEL_FILES {
        let p = std::path::Path::new(&dir).join(f);
        s += &std::fs::read_to_string(&p).map_err(|e| BackendError::Device(format!("WEFT_CUDA_KERNEL_DIR: reading {}: {e}", p.display())))?;
        s.push('\n');
    }
    Ok(s.into())
}

/// The kernel variant's setting `name` in `WEFT_CUDA_KERNEL_DEFINES` (`NAME` or `NAME=value`;
/// "" for a bare name), as `compile_kernels` compiled the kernels with it: the host code sizes
/// launches of variant kernels by it (moe.rs, mla_prefill.rs).
pub(crate) fn kernel_define(name: &str) -> Option<String> {
    let defs = std::env::var("WEFT_CUDA_KERNEL_DEFINES").ok()?;
    defs.split(',').find_map(|d| if d == name { Some(String::new()) } else { d.strip_prefix(name)?.strip_prefix('=').map(str::to_string) })
}

/// Compiles every kernel in `kernels/` with NVRTC for `arch` (e.g. "sm_90a"), as the backend
/// does when it starts. Needs only NVRTC, no GPU (the compile test runs it for every target).
pub fn compile_kernels(arch: &'static str) -> Result<cudarc::nvrtc::Ptx> {
    let mut options = vec!["--std=c++17".to_string()];
    // Kernel variants for comparisons: `WEFT_CUDA_KERNEL_DEFINES=WEFT_PDL_EARLY,WEFT_FP8_SOFT` (NAME or NAME=VALUE).
    if let Ok(defs) = std::env::var("WEFT_CUDA_KERNEL_DEFINES") {
        options.extend(defs.split(',').filter(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '=')).map(|d| format!("-D{d}")));
    }
    let opts = cudarc::nvrtc::CompileOptions { arch: Some(arch), options, ..Default::default() };
    let source = kernel_source()?;
    std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(&*source, opts))
        .map_err(|_| unavailable("NVRTC could not be loaded".into()))?
        .map_err(|e| BackendError::Device(format!("compiling kernels/ for {arch}: {e}")))
}

/// The target the kernels are compiled for: "sm_90a" etc. on NVIDIA.
#[cfg(feature = "cuda")]
pub(crate) fn device_arch(ctx: &CudaContext) -> Result<&'static str> {
    let (major, minor) = ctx.compute_capability().map_err(dev)?;
    Ok(arch_name(major, minor))
}

/// The gfx target ("gfx942") on AMD, which must have 64-lane wavefronts (`SUBGROUP`).
#[cfg(not(feature = "cuda"))]
pub(crate) fn device_arch(ctx: &CudaContext) -> Result<&'static str> {
    #[cfg(feature = "hip-mock")]
    emu::install(SUBGROUP);
    let lanes = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_WARP_SIZE).map_err(dev)?;
    if lanes != SUBGROUP as i32 {
        return Err(unavailable(format!("the device runs {lanes}-lane wavefronts; weft's HIP kernels are built for {SUBGROUP} (AMD Instinct)")));
    }
    Ok(Box::leak(ctx.gcn_arch().map_err(dev)?.into_boxed_str()))
}

#[cfg(test)]
mod tests {
    /// `WEFT_CUDA_KERNEL_DIR` reads the same files in the same order as the built-in source.
    #[test]
    fn kernel_files_make_the_built_in_source() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let joined: Vec<String> = super::KERNEL_FILES.iter().map(|f| std::fs::read_to_string(dir.join(f)).unwrap()).collect();
        assert_eq!(joined.join("\n"), super::KERNEL_SOURCE);
    }
}
