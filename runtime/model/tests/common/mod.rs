//! Helpers shared by the checkpoint tests: a golden fixture copied into a temporary directory
//! (to break one thing in it) and deterministic randomness.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The fp8 golden fixture: small, and it exercises every loader path (block scales included).
pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/kimi-fp8-partial-blocks")
}

pub fn copy_fixture() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture()).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, t.path().join(p.file_name().unwrap())).unwrap();
    }
    t
}

/// splitmix64.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        weft_backend::rng::splitmix64(&mut self.0)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
