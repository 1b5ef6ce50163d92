//! weft-cuda's host code drives AMD GPUs through this crate: it implements the part of
//! cudarc's API that weft-cuda uses (`driver`, `nvrtc`, `cublas`, `nccl` — RCCL) over HIP, and weft-cuda's
//! `hip` feature names it in cudarc's place. Underneath, every runtime call goes through one
//! `Api` (the FFI boundary): `sdk` is libamdhip64 + hiprtc through hip-sys, `mock` keeps device
//! memory in host memory and hands kernel launches to a launcher the embedding crate installs
//! (weft-cuda's tests install the `kernels/emu` CPU emulator), so the HIP build's host logic —
//! buffer sizes, launch shapes for 64-lane wavefronts, argument lists, copies — runs in tests
//! on machines without an AMD GPU. What the mock cannot show: anything about AMD's compiler
//! output, timing, or the real runtime's behaviour.

mod api;
pub mod cublas;
pub mod driver;
#[cfg(feature = "mock")]
pub mod mock;
pub mod nccl;
pub mod nvrtc;
#[cfg(feature = "sdk")]
mod sdk;

pub use api::{Api, DeviceAttr, DriverError, Launch, Res};

#[cfg(not(any(feature = "sdk", feature = "mock")))]
compile_error!("weft-hip-driver needs a runtime: feature `sdk` (libamdhip64) or `mock` (host memory)");

/// The runtime every driver call goes through: the HIP SDK when built with `sdk`, else the mock.
pub fn api() -> &'static dyn Api {
    #[cfg(feature = "sdk")]
    {
        &sdk::Sdk
    }
    #[cfg(all(feature = "mock", not(feature = "sdk")))]
    {
        mock::get()
    }
}
