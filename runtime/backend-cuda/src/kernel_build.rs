//! The kernels as the backend builds them: their source (`kernels/`, built in, or read from
//! `WEFT_CUDA_KERNEL_DIR`), the entries it loads by name (`KERNELS`), the kernel variant's
//! defines (`WEFT_CUDA_KERNEL_DEFINES`), and the NVRTC / hiprtc compile for the device's
//! target (sm_90a etc., or the gfx target on AMD).
#[cfg(feature = "hip-mock")]
use crate::emu;
#[cfg(not(feature = "cuda"))]
use crate::SUBGROUP;
use crate::{dev, unavailable, BackendError, CudaContext, Result};

/// The kernel files in the order they are joined (also the emulator's, kernels/emu/launch.cpp):
/// `KERNEL_SOURCE`, the built-in source, each file followed by a newline, and `KERNEL_FILES`,
/// the names `WEFT_CUDA_KERNEL_DIR` reads.
macro_rules! kernel_files {
    ($($f:literal),* $(,)?) => {
        pub const KERNEL_SOURCE: &str = concat!($(include_str!(concat!("../../../kernels/", $f)), "\n"),*);
        const KERNEL_FILES: &[&str] = &[$($f),*];
    };
}
kernel_files!(
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
    "moe_gate_up_route_bf16_t1",
    "moe_gate_up_route_fp8_t1",
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

/// The compile options of the kernels: C++17 and a kernel variant's defines (`NAME` or
/// `NAME=VALUE`, comma-separated; anything else is dropped).
fn compile_options(defines: &str) -> Vec<String> {
    let mut options = vec!["--std=c++17".to_string()];
    options.extend(defines.split(',').filter(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '=')).map(|d| format!("-D{d}")));
    options
}

/// Compiles every kernel in `kernels/` with NVRTC for `arch` (e.g. "sm_90a"), as the backend
/// does when it starts. Needs only NVRTC, no GPU (the compile test runs it for every target).
pub fn compile_kernels(arch: &'static str) -> Result<cudarc::nvrtc::Ptx> {
    // Kernel variants for comparisons: `WEFT_CUDA_KERNEL_DEFINES=WEFT_PDL_EARLY,WEFT_FP8_SOFT` (NAME or NAME=VALUE).
    let options = compile_options(&std::env::var("WEFT_CUDA_KERNEL_DEFINES").unwrap_or_default());
    let opts = cudarc::nvrtc::CompileOptions { arch: Some(arch), options, ..Default::default() };
    let source = kernel_source()?;
    std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(&*source, opts))
        .map_err(|_| unavailable("NVRTC could not be loaded".into()))?
        .map_err(|e| BackendError::Device(format!("compiling kernels/ for {arch}: {e}")))
}

/// What ptxas gave one kernel entry for a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryResources {
    pub name: String,
    /// Registers a thread.
    pub registers: u32,
    /// Local memory a thread holds for values the compiler could not keep in registers (an
    /// array indexed at run time, an object reached through a pointer it cannot resolve).
    pub stack_bytes: u32,
    /// Bytes a thread spills (stores) to local memory for want of registers.
    pub spill_bytes: u32,
}

/// Compiles the built-in kernels for the real target `arch` ("sm_90a") with the kernel
/// variant's `defines` (as `WEFT_CUDA_KERNEL_DEFINES` takes them) down to machine code, and
/// returns ptxas's account of every entry (`--ptxas-options=-v`): no GPU needed, only NVRTC.
#[cfg(feature = "cuda")]
pub fn entry_resources(arch: &str, defines: &str) -> Result<Vec<EntryResources>> {
    use cudarc::nvrtc::result as nvrtc;
    let mut options = compile_options(defines);
    options.extend([format!("--gpu-architecture={arch}"), "--ptxas-options=-v".to_string()]);
    let src = std::ffi::CString::new(KERNEL_SOURCE).map_err(|e| BackendError::Device(format!("{e}")))?;
    let err = |what: &str, e: nvrtc::NvrtcError| BackendError::Device(format!("{what} for {arch}: {e:?}"));
    let log = std::panic::catch_unwind(|| -> Result<String> {
        let prog = nvrtc::create_program(&src, None).map_err(|e| err("creating the NVRTC program", e))?;
        let compiled = unsafe { nvrtc::compile_program(prog, &options) };
        let log = unsafe { nvrtc::get_program_log(prog) }.map_err(|e| err("reading the NVRTC log", e))?;
        let log = unsafe { std::ffi::CStr::from_ptr(log.as_ptr()) }.to_string_lossy().into_owned();
        unsafe { nvrtc::destroy_program(prog) }.map_err(|e| err("destroying the NVRTC program", e))?;
        compiled.map_err(|e| BackendError::Device(format!("compiling kernels/ for {arch}: {e:?}\n{log}")))?;
        Ok(log)
    })
    .map_err(|_| unavailable("NVRTC could not be loaded".into()))??;
    Ok(parse_ptxas_log(&log))
}

/// Each entry of a `ptxas -v` log: "Compiling entry function 'NAME' for 'sm_90a'", then its
/// "N bytes stack frame, S bytes spill stores, ..." and "Used R registers" lines.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn parse_ptxas_log(log: &str) -> Vec<EntryResources> {
    let number_before = |line: &str, word: &str| -> Option<u32> { line.split(word).next()?.split_whitespace().last()?.parse().ok() };
    let mut out: Vec<EntryResources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(EntryResources { name, registers: 0, stack_bytes: 0, spill_bytes: 0 });
        } else if let Some(e) = out.last_mut() {
            if line.contains("bytes stack frame") {
                e.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                e.spill_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
            } else if line.contains(" registers") && line.contains("Used ") {
                e.registers = number_before(line, "registers").unwrap_or(0);
            }
        }
    }
    out
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
        let joined: String = super::KERNEL_FILES.iter().map(|f| std::fs::read_to_string(dir.join(f)).unwrap() + "\n").collect();
        assert_eq!(joined, super::KERNEL_SOURCE);
    }

    /// The parser reads ptxas's lines as NVRTC 13 writes them.
    #[test]
    fn ptxas_log_gives_each_entry() {
        let log = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'good' for 'sm_90a'
ptxas info    : Function properties for good
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compiling entry function 'bad_one' for 'sm_90a'
ptxas info    : Function properties for bad_one
ptxas         .     176 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 176 bytes cumulative stack size
";
        let e = super::parse_ptxas_log(log);
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].name.as_str(), e[0].registers, e[0].stack_bytes, e[0].spill_bytes), ("good", 8, 0, 0));
        assert_eq!((e[1].name.as_str(), e[1].registers, e[1].stack_bytes, e[1].spill_bytes), ("bad_one", 64, 176, 12));
    }
}
