//! With `sdk`: ROCm 6 moved hiprtc out of libamdhip64 into libhiprtc; link it where it exists
//! (hip-sys links libamdhip64, which holds hiprtc up to ROCm 5.x, e.g. Debian's 5.2).
fn main() {
    println!("cargo:rerun-if-env-changed=HIP_PATH");
    println!("cargo:rerun-if-env-changed=ROCM_PATH");
    if std::env::var_os("CARGO_FEATURE_SDK").is_none() {
        return;
    }
    let mut dirs: Vec<std::path::PathBuf> = ["HIP_PATH", "ROCM_PATH"].iter().filter_map(|v| std::env::var_os(v)).map(|p| std::path::PathBuf::from(p).join("lib")).collect();
    dirs.extend(["/opt/rocm/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"].iter().map(std::path::PathBuf::from));
    if let Some(d) = dirs.iter().find(|d| d.join("libhiprtc.so").exists()) {
        println!("cargo:rustc-link-search=native={}", d.display());
        println!("cargo:rustc-link-lib=dylib=hiprtc");
    }
}
