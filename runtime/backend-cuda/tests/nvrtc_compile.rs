//! Every kernel in `kernels/` compiles with NVRTC for each NVIDIA architecture weft targets,
//! and every kernel the backend loads by name is in the result — on a machine without a GPU.
//! `scripts/test.sh` installs NVRTC from PyPI (`scripts/setup-nvrtc.sh`) and sets
//! `WEFT_REQUIRE_NVRTC=1`, so in CI a missing NVRTC fails instead of skipping.
//! `WEFT_DUMP_PTX=DIR` keeps each target's PTX.
#![cfg(feature = "cuda")]

use weft_cuda::{compile_kernels, KERNELS};

/// Ampere, Ada, Hopper (with its architecture-specific features), Blackwell datacenter and
/// consumer parts.
const TARGETS: &[&str] = &["sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"];

#[test]
fn kernels_compile_for_every_nvidia_target() {
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        assert!(std::env::var("WEFT_REQUIRE_NVRTC").is_err(), "WEFT_REQUIRE_NVRTC is set but NVRTC was not found (bash scripts/setup-nvrtc.sh; LD_LIBRARY_PATH)");
        eprintln!("SKIPPED: NVRTC not found (scripts/test.sh installs it)");
        return;
    }
    for arch in TARGETS {
        let ptx = compile_kernels(arch).unwrap_or_else(|e| panic!("{e}")).to_src();
        for k in KERNELS {
            assert!(ptx.contains(&format!(".entry {k}(")), "{arch}: kernel {k} is not in the compiled module");
        }
        eprintln!("{arch}: {} kernels, {} bytes of PTX", KERNELS.len(), ptx.len());
        // For register and spill counts: `ptxas -arch=sm_90a -v DIR/sm_90a.ptx`.
        if let Ok(dir) = std::env::var("WEFT_DUMP_PTX") {
            std::fs::write(std::path::Path::new(&dir).join(format!("{arch}.ptx")), &ptx).unwrap();
        }
    }
}
