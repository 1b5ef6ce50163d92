//! Safetensors shards: the input is the whole `model.safetensors` of the small fp8 golden
//! fixture (its own config beside it), so the length prefix, the JSON header (names, dtypes,
//! shapes, offsets) and the data are all under the fuzzer's control. Seed the corpus with the
//! fixture's file (scripts/fuzz.sh does). Loading must succeed or fail with an error; a model
//! that loads must run a forward step.

#![no_main]
#[path = "common/fixture.rs"]
mod fixture;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fixture::load_with("model.safetensors", data));
