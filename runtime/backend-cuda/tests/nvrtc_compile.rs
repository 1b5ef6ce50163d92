//! Every kernel in `kernels/` compiles with NVRTC for each NVIDIA architecture weft targets,
//! and every kernel the backend loads by name is in the result — on a machine without a GPU.
//! `scripts/test.sh` installs NVRTC from PyPI (`scripts/setup-nvrtc.sh`) and sets
//! `WEFT_REQUIRE_NVRTC=1`, so in CI a missing NVRTC fails instead of skipping.
//! `WEFT_DUMP_PTX=DIR` keeps each target's PTX.
#![cfg(feature = "cuda")]

use weft_cuda::{compile_kernels, entry_resources, KERNELS};

/// Ampere, Ada, Hopper (with its architecture-specific features), Blackwell datacenter and
/// consumer parts.
const TARGETS: &[&str] = &["sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"];

/// Whether NVRTC loads (in CI it must: `WEFT_REQUIRE_NVRTC`).
fn nvrtc_present() -> bool {
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        assert!(std::env::var("WEFT_REQUIRE_NVRTC").is_err(), "WEFT_REQUIRE_NVRTC is set but NVRTC was not found (bash scripts/setup-nvrtc.sh; LD_LIBRARY_PATH)");
        eprintln!("SKIPPED: NVRTC not found (scripts/test.sh installs it)");
        return false;
    }
    true
}

#[test]
fn kernels_compile_for_every_nvidia_target() {
    if !nvrtc_present() {
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

/// On Hopper, where the fast kernels are tuned, no kernel entry keeps values in local memory or
/// spills registers — by ptxas's own account (NVRTC down to machine code, no GPU): a thread's
/// local memory is written and read through the caches, and round 31's pre-loaded GEMV pass
/// (176 bytes a thread, a pointer chosen at run time) cost a Moonlight step 0.45 ms on an H100
/// while ptxas's "0 bytes spill" hid it. The default kernels and the single-token variants
/// (`WEFT_GEMV_PRELOAD`, `WEFT_MLA_TRIGGER`).
#[test]
fn kernels_keep_their_values_in_registers() {
    if !nvrtc_present() {
        return;
    }
    for defines in ["", "WEFT_GEMV_PRELOAD,WEFT_MLA_TRIGGER"] {
        let entries = entry_resources("sm_90a", defines).unwrap_or_else(|e| panic!("{e}"));
        for k in KERNELS {
            assert!(entries.iter().any(|e| e.name == *k), "[{defines}] kernel {k} is not in ptxas's report");
        }
        let local: Vec<_> = entries.iter().filter(|e| e.stack_bytes > 0 || e.spill_bytes > 0).collect();
        assert!(local.is_empty(), "[{defines}] kernels with local memory (stack frame / spill bytes a thread): {local:?}");
        let most = entries.iter().max_by_key(|e| e.registers).unwrap();
        eprintln!("sm_90a [{defines}]: {} entries, none in local memory; most registers: {} ({})", entries.len(), most.registers, most.name);
    }
}
