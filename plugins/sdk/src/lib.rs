//! The guest side of weft's plugin interfaces (`wit/weft-plugin.wit`, `weft:plugin@0.1.0`):
//! generated bindings for the three worlds, export macros, and the probability helpers the
//! default plugins are built from.
//!
//! A custom sampler:
//! ```ignore
//! use weft_plugin_sdk::sampler::{exports::weft::plugin::sampler::*, Guest};
//! struct Mine;
//! impl Guest for Mine { /* describe, configure, sample */ }
//! weft_plugin_sdk::sampler::export_sampler!(Mine);
//! ```

/// The interface version this SDK speaks; `describe()` must report it.
pub const INTERFACE_VERSION: &str = "0.1.0";

pub mod sampler {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "sampler-plugin",
        pub_export_macro: true,
        export_macro_name: "export_sampler",
        default_bindings_module: "weft_plugin_sdk::sampler",
    });
}

pub mod verifier {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "verifier-plugin",
        pub_export_macro: true,
        export_macro_name: "export_verifier",
        default_bindings_module: "weft_plugin_sdk::verifier",
    });
}

pub mod admission {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "admission-plugin",
        pub_export_macro: true,
        export_macro_name: "export_admission",
        default_bindings_module: "weft_plugin_sdk::admission",
    });
}

pub mod batch;
pub mod math;
