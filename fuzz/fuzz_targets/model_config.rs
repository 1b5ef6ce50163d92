//! `config.json`: the input replaces the config of the small fp8 golden fixture (its real
//! weights beside it). Loading must succeed or fail with an error; a config that loads must
//! run a forward step. A panic, an abort (a huge allocation) or a hang is a crash.

#![no_main]
#[path = "common/fixture.rs"]
mod fixture;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fixture::load_with("config.json", data));
