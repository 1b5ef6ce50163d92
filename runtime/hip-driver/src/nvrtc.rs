//! cudarc's `nvrtc` module as weft-cuda uses it, over hiprtc: kernel sources compiled at start-up
//! into a code object for the device's gfx target.

use crate::api::Res;

/// A compiled code object (cudarc's name: on CUDA it holds PTX).
#[derive(Clone, Debug)]
pub struct Ptx(pub Vec<u8>);

/// cudarc's options: `arch` is a gfx target ("gfx942"), `options` are passed on to hiprtc.
#[derive(Clone, Debug, Default)]
pub struct CompileOptions {
    pub arch: Option<&'static str>,
    pub options: Vec<String>,
}

pub type CompileError = crate::api::DriverError;

pub mod sys {
    /// hiprtc is part of the linked runtime (`sdk`) or not needed (`mock`).
    ///
    /// # Safety
    /// None needed; `unsafe` only to match cudarc's signature.
    pub unsafe fn is_culib_present() -> bool {
        true
    }
}

/// hiprtc options for `opts`: the target as `--offload-arch`, then the caller's options.
pub fn hiprtc_options(opts: &CompileOptions) -> Vec<String> {
    let mut o: Vec<String> = opts.arch.map(|a| format!("--offload-arch={a}")).into_iter().collect();
    o.extend(opts.options.iter().cloned());
    o
}

pub fn compile_ptx_with_opts(source: &str, opts: CompileOptions) -> Res<Ptx> {
    Ok(Ptx(crate::api().compile(source, "weft.hip", &hiprtc_options(&opts))?))
}
