//! Builds the guest plugins (`plugins/`, a separate wasm32-wasip2 workspace) so the host can
//! embed the defaults and its tests can load the fault-injection plugins.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.join("../..").canonicalize().unwrap();
    let plugins = root.join("plugins");
    let target_dir = root.join("target").join("plugins");
    for p in ["plugins", "wit", "examples/custom-sampler"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=WEFT_GUEST_TOOLCHAIN");
    // WEFT_GUEST_TOOLCHAIN=stable builds the guests with that rustup toolchain instead of the
    // one building the host: cargo-fuzz builds the host with a nightly that may lack the
    // wasm32-wasip2 target.
    let guest_toolchain = std::env::var("WEFT_GUEST_TOOLCHAIN").ok().filter(|t| !t.is_empty());
    ensure_wasm_target(&root, guest_toolchain.as_deref());
    let mut cmd = match &guest_toolchain {
        Some(t) => {
            let mut c = Command::new("cargo");
            c.arg(format!("+{t}")).env_remove("RUSTUP_TOOLCHAIN").env_remove("RUSTC").env_remove("RUSTDOC");
            c
        }
        _ => Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())),
    };
    cmd.current_dir(&plugins).args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"]).arg(&target_dir);
    // The outer build's flags and target are for the host, not for the guests.
    for v in ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "CARGO_BUILD_TARGET", "CARGO_TARGET_DIR", "CARGO_BUILD_RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "CARGO_PRIMARY_PACKAGE"] {
        cmd.env_remove(v);
    }
    let status = cmd.status().expect("running cargo to build the wasm32-wasip2 plugins");
    if !status.success() {
        panic!("building the plugins for wasm32-wasip2 failed (is the target installed? `rustup target add wasm32-wasip2`; rust-toolchain.toml asks for it)");
    }
    let out = target_dir.join("wasm32-wasip2/release");
    println!("cargo:rustc-env=WEFT_PLUGIN_DIR={}", out.display());
}

/// A toolchain that rustup installed before rust-toolchain.toml asked for the wasm32-wasip2
/// target lacks it: add it (one download, once) instead of failing the build.
fn ensure_wasm_target(root: &std::path::Path, toolchain: Option<&str>) {
    let mut rustc = match toolchain {
        Some(t) => {
            let mut c = Command::new("rustc");
            c.arg(format!("+{t}")).env_remove("RUSTUP_TOOLCHAIN");
            c
        }
        None => Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into())),
    };
    let sysroot = match rustc.current_dir(root).args(["--print", "sysroot"]).output() {
        Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
        _ => return,
    };
    if sysroot.join("lib/rustlib/wasm32-wasip2").exists() {
        return;
    }
    let mut add = Command::new("rustup");
    add.current_dir(root).args(["target", "add", "wasm32-wasip2"]);
    if let Some(t) = toolchain {
        add.args(["--toolchain", t]);
    }
    // Without rustup (or offline) the plugin build below fails with its own clear message.
    let _ = add.status();
}
