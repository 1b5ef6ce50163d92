//! GPU kernels run on the CPU (`kernels/emu`: a fiber per lane, NaN-filled shared memory), so
//! their logic is checked on machines without a GPU too. Needs a C++20 compiler (`c++`, or
//! `$CXX`); without one the test says so and passes.

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// Builds and runs `kernels/emu/<test>.cpp`; its exit status is its number of failures.
fn run_emulated(test: &str) {
    run_emulated_with(test, &[]);
}

/// `run_emulated` with the kernels compiled with `defines` (their variants, `-DNAME[=value]`).
fn run_emulated_with(test: &str, defines: &[&str]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/emu");
    let exe = std::env::temp_dir().join(format!("weft-{test}-{}", std::process::id()));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx).args(defines).args(["-std=c++20", "-O2", "-fno-strict-aliasing", "-pthread", "-o"]).arg(&exe).arg(dir.join(format!("{test}.cpp"))).output();
    match built {
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "SKIPPED (no C++ compiler `{cxx}`: {e})");
            return;
        }
        Ok(o) if !o.status.success() => {
            let err = String::from_utf8_lossy(&o.stderr);
            if err.contains("barrier") && err.contains("No such file") {
                let _ = writeln!(std::io::stderr(), "SKIPPED (`{cxx}` has no C++20 <barrier>)");
                return;
            }
            panic!("kernels/emu/{test}.cpp does not compile:\n{err}");
        }
        Ok(_) => {}
    }
    let run = Command::new(&exe).output().expect("run the emulated kernel test");
    let _ = std::fs::remove_file(&exe);
    let stdout = String::from_utf8_lossy(&run.stdout);
    eprintln!("{stdout}");
    assert!(run.status.success(), "emulated kernels of {test} disagree with the reference:\n{stdout}{}", String::from_utf8_lossy(&run.stderr));
}

#[test]
fn mla_decode_on_the_cpu_emulator() {
    run_emulated("mla_test");
}

/// Prefill attention in one pass (kernels/mla_flash.cu) against a float64 causal softmax.
#[test]
fn prefill_flash_attention_on_the_cpu_emulator() {
    run_emulated("flash_test");
}

/// The 64-row pass of the dense tensor-core linears (kernels/mma.cu), alone and over thread
/// block clusters (emulated) that split each unit's columns, against a float64 reference.
#[test]
fn decode_batch_linears_on_the_cpu_emulator() {
    run_emulated("gemv_test");
}

#[test]
fn sampling_front_end_on_the_cpu_emulator() {
    run_emulated("front_test");
}

/// The grouped GEMM as built by default, and its measured variants: cp.async stages over
/// two-part bf16 operands, 64-column stages; and moe_wgmma.cu's kernels (wgmma emulated), one
/// warpgroup a tile and two a tile pair (slice-major blocks).
#[test]
fn prefill_moe_gemm_on_the_cpu_emulator() {
    run_emulated("moe_gemm_test");
    run_emulated_with("moe_gemm_test", &["-DWEFT_MG_ASYNC"]);
    run_emulated_with("moe_gemm_test", &["-DWEFT_MG_ASYNC", "-DWEFT_MG_BK=64", "-DWEFT_MG_STAGES=4"]);
    run_emulated_with("moe_gemm_test", &["-DWEFT_MG_WG"]);
    run_emulated_with("moe_gemm_test", &["-DWEFT_MG_WG2"]);
}
