//! The FFI boundary: every HIP runtime call the driver types make goes through `Api`, so the
//! same types run over libamdhip64 (`sdk`) or over host memory (`mock`). Handles are plain
//! integers (device addresses, stream/module/function/graph handles as the runtime gives them).

use std::ffi::c_void;

/// An error from the HIP runtime or hiprtc, with the call that returned it.
#[derive(Clone, PartialEq, Eq)]
pub struct DriverError(pub String);

impl std::fmt::Debug for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DriverError {}

pub type Res<T> = std::result::Result<T, DriverError>;

/// The device properties the backend asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceAttr {
    MultiprocessorCount,
    /// Largest dynamic shared memory (LDS) one block may use.
    SharedMemPerBlockOptin,
    WarpSize,
    ComputeCapabilityMajor,
    ComputeCapabilityMinor,
}

/// A kernel launch: grid, block, dynamic shared memory bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared: u32,
}

/// The HIP runtime calls, one method each. `stream` 0 is never used (the backend makes its own).
pub trait Api: Send + Sync {
    fn device_count(&self) -> Res<usize>;
    fn set_device(&self, ordinal: usize) -> Res<()>;
    fn device_name(&self, ordinal: usize) -> Res<String>;
    /// The device's gfx target, e.g. "gfx942" (features such as ":sramecc+" stripped).
    fn gcn_arch(&self, ordinal: usize) -> Res<String>;
    fn attribute(&self, ordinal: usize, attr: DeviceAttr) -> Res<i32>;
    fn mem_info(&self) -> Res<(usize, usize)>;
    fn stream_create(&self) -> Res<u64>;
    fn stream_synchronize(&self, stream: u64) -> Res<()>;
    fn malloc(&self, bytes: usize, stream: u64) -> Res<u64>;
    fn free(&self, ptr: u64, stream: u64);
    fn memset_zero(&self, ptr: u64, bytes: usize, stream: u64) -> Res<()>;
    /// Host to device; the host buffer must stay alive until the stream has run the copy (the
    /// driver types synchronize before returning, as cudarc's do for pageable memory).
    fn htod(&self, dst: u64, src: &[u8], stream: u64) -> Res<()>;
    fn dtoh(&self, dst: &mut [u8], src: u64, stream: u64) -> Res<()>;
    fn dtod(&self, dst: u64, src: u64, bytes: usize, stream: u64) -> Res<()>;
    /// hiprtc: `source` compiled with `options` into a code object; errors carry the log.
    fn compile(&self, source: &str, name: &str, options: &[String]) -> Res<Vec<u8>>;
    fn module_load(&self, image: &[u8]) -> Res<u64>;
    fn module_function(&self, module: u64, name: &str) -> Res<u64>;
    fn function_max_threads(&self, func: u64) -> Res<i32>;
    /// # Safety
    /// `args` point at values laid out as the kernel's parameters, alive for the call.
    unsafe fn launch(&self, func: u64, launch: Launch, stream: u64, args: &mut [*mut c_void]) -> Res<()>;
    fn begin_capture(&self, stream: u64) -> Res<()>;
    /// The recorded graph, instantiated (None when nothing was recorded).
    fn end_capture(&self, stream: u64) -> Res<Option<u64>>;
    fn graph_launch(&self, graph: u64, stream: u64) -> Res<()>;
    fn graph_destroy(&self, graph: u64);
}
