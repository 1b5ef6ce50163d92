//! Plugin loading: the input is a component's bytes, given to `Registry::load_bytes` (compile
//! with the sandbox's limits, interface check, describe, self-check). It must load or fail with
//! an error; a panic is a crash. A version that loads is unloaded again, and the registry's
//! default sampler must still answer afterwards. Seed the corpus with the built plugins
//! (scripts/fuzz.sh does).

#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use weft_plugin_host::{PluginKind, Registry, SandboxLimits};

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry::with_defaults(SandboxLimits::default()).unwrap())
}

fuzz_target!(|data: &[u8]| {
    let r = registry();
    match r.load_bytes(data, None, None) {
        Ok(id) => {
            let _ = r.unload(id.kind, &id.name, &id.version);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    assert!(r.resolve(PluginKind::Sampler, None).is_ok(), "the default sampler is gone");
});
