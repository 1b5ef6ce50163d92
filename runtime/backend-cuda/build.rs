//! With `hip-mock`: builds the CPU emulator of every kernel (`kernels/emu/launch.cpp`) into
//! this crate, with a launch table of the kernels the backend loads (`KERNELS` in src/kernel_build.rs, read
//! from the source so the two cannot drift) plus the GEMM kernel the HIP driver loads.
fn main() {
    if std::env::var_os("CARGO_FEATURE_HIP_MOCK").is_none() {
        return;
    }
    #[cfg(feature = "hip-mock")]
    build_emulator();
}

#[cfg(feature = "hip-mock")]
fn build_emulator() {
    use std::path::Path;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let kernels = root.join("../../kernels");
    let lib = std::fs::read_to_string(root.join("src/kernel_build.rs")).expect("read src/kernel_build.rs");
    let start = lib.find("pub const KERNELS: &[&str] = &[").expect("KERNELS in src/kernel_build.rs");
    let list = &lib[start..start + lib[start..].find("];").expect("end of KERNELS")];
    let mut table: String = list.split('"').skip(1).step_by(2).map(|n| format!("K({n})\n")).collect();
    table.push_str("K(gemm_strided)\n");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    std::fs::write(out.join("emu_kernels.inc"), table).expect("write the launch table");
    for f in std::fs::read_dir(&kernels).unwrap().chain(std::fs::read_dir(kernels.join("emu")).unwrap()) {
        println!("cargo:rerun-if-changed={}", f.unwrap().path().display());
    }
    println!("cargo:rerun-if-changed=src/kernel_build.rs");
    cc::Build::new().cpp(true).std("c++20").opt_level(2).flag("-fno-strict-aliasing").flag("-pthread").warnings(false).include(&out).file(kernels.join("emu/launch.cpp")).compile("weft_emu");
    println!("cargo:rustc-link-lib=stdc++");
}
