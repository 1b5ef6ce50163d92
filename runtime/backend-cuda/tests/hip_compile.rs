//! The kernels in `kernels/` are one source for CUDA and HIP (`weft_port.h`): this compiles all
//! of them with hipcc for AMD Instinct targets, device code only, and checks every kernel the
//! backend loads is in each code object — on a machine without an AMD GPU. `scripts/test.sh`
//! installs hipcc from Debian's ROCm packages (`scripts/setup-hip.sh`) and sets
//! `WEFT_REQUIRE_HIPCC=1` when it could, so a kernel that does not compile for AMD fails CI.
//! Targets the toolchain does not know (Debian's ROCm 5.2 stops at gfx940; gfx942 and gfx950
//! need ROCm 6+/7) are reported and skipped; gfx90a is required.

use std::path::PathBuf;
use std::process::Command;
use weft_cuda::{KERNELS, KERNEL_SOURCE};

const TARGETS: &[&str] = &["gfx90a", "gfx940", "gfx942", "gfx950"];

fn hipcc() -> Option<String> {
    let cmd = std::env::var("HIPCC").unwrap_or_else(|_| "hipcc".into());
    Command::new(&cmd).arg("--version").output().ok().filter(|o| o.status.success()).map(|_| cmd)
}

/// Global function symbols of an AMD GPU code object (ELF), through llvm-readelf.
fn symbols(code_object: &PathBuf) -> Option<String> {
    for tool in ["llvm-readelf", "llvm-readelf-15", "/usr/lib/llvm-15/bin/llvm-readelf", "/opt/rocm/llvm/bin/llvm-readelf"] {
        if let Ok(o) = Command::new(tool).arg("-s").arg(code_object).output() {
            if o.status.success() {
                return Some(String::from_utf8_lossy(&o.stdout).into_owned());
            }
        }
    }
    None
}

#[test]
fn kernels_compile_for_amd_targets() {
    let Some(hipcc) = hipcc() else {
        assert!(std::env::var("WEFT_REQUIRE_HIPCC").is_err(), "WEFT_REQUIRE_HIPCC is set but hipcc was not found (bash scripts/setup-hip.sh)");
        eprintln!("SKIPPED: no hipcc (scripts/setup-hip.sh installs Debian's as root)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("weft-hip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("kernels.hip");
    std::fs::write(&src, KERNEL_SOURCE).unwrap();
    let mut compiled = vec![];
    for arch in TARGETS {
        let out = dir.join(format!("kernels.{arch}.co"));
        let o = Command::new(&hipcc)
            .args(["-x", "hip", "--offload-device-only", "--no-gpu-bundle-output", "-O3", "-std=c++17", "-include", "hip/hip_runtime.h", "-Wno-pragma-once-outside-header", "-c"])
            .arg(format!("--offload-arch={arch}"))
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .output()
            .expect("run hipcc");
        let log = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            let unknown_target =
                log.contains("invalid target ID") || log.contains("Unsupported") || log.contains("unknown target") || (log.contains("oclc_isa_version") && log.contains("No such file"));
            if unknown_target && *arch != "gfx90a" {
                eprintln!("{arch}: not supported by this toolchain, skipped ({})", log.lines().find(|l| l.contains("error")).unwrap_or("").trim());
                continue;
            }
            panic!("kernels/ do not compile for {arch}:\n{log}");
        }
        match symbols(&out) {
            Some(syms) => {
                for k in KERNELS {
                    assert!(syms.split_whitespace().any(|w| w == *k), "{arch}: kernel {k} is not in the code object");
                }
            }
            None => eprintln!("{arch}: no llvm-readelf, kernel names not checked"),
        }
        eprintln!("{arch}: {} kernels compiled ({} bytes of code object)", KERNELS.len(), std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0));
        compiled.push(*arch);
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(compiled.contains(&"gfx90a"), "gfx90a must compile");
}
