//! `Api` in host memory, for tests of the HIP build's host logic on machines without an AMD
//! GPU. Device addresses are host addresses of 8-byte-aligned allocations; every copy is
//! checked to lie inside one live allocation (a host-side size bug fails the copy instead of
//! passing by luck). Kernels run through the `Launcher` the embedding crate installs (weft-cuda
//! installs the kernels/emu CPU emulator, 64-lane sub-groups); one launch at a time. The device
//! it pretends to be is an MI300X-like gfx942: 304 compute units, 64-lane wavefronts, 64 KB of
//! LDS per block. Graph capture is not emulated (begin_capture fails; the backend then runs
//! steps op by op, as it does on a real HIP device by default).

use crate::api::{Api, DeviceAttr, DriverError, Launch, Res};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

/// Runs kernels by name for the mock.
pub trait Launcher: Send + Sync {
    fn has(&self, kernel: &str) -> bool;
    /// # Safety
    /// `args` point at values laid out as the kernel's parameters; pointer arguments are host
    /// addresses of live mock allocations.
    unsafe fn launch(&self, kernel: &str, launch: Launch, args: &mut [*mut c_void]) -> Res<()>;
}

#[derive(Default)]
struct State {
    /// start address → the allocation (u64 words: 8-byte alignment) and its size in bytes.
    allocs: BTreeMap<u64, (Box<[u64]>, usize)>,
    functions: Vec<String>,
    allocated: usize,
    launches: u64,
}

pub struct Mock {
    state: Mutex<State>,
    launcher: OnceLock<Box<dyn Launcher>>,
    /// Held for the length of a launch: the emulator has one set of block-wide globals.
    running: Mutex<()>,
}

pub const TOTAL_BYTES: usize = 192 << 30;

thread_local! {
    /// Whether this thread made the device current. Stricter than HIP (whose threads start on
    /// device 0): a call from a thread that never did fails, so a driver that forgets to bind
    /// a thread before using it — wrong on a machine with several GPUs — fails the tests.
    static BOUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn bound(call: &str) -> Res<()> {
    if BOUND.with(|b| b.get()) {
        Ok(())
    } else {
        Err(DriverError(format!("mock HIP: {call} on a thread that made no device current")))
    }
}

static MOCK: OnceLock<Mock> = OnceLock::new();

pub fn get() -> &'static Mock {
    MOCK.get_or_init(|| Mock { state: Mutex::new(State::default()), launcher: OnceLock::new(), running: Mutex::new(()) })
}

/// Installs the kernel launcher (the first one stays).
pub fn install(launcher: Box<dyn Launcher>) {
    let _ = get().launcher.set(launcher);
}

/// (live allocations, bytes allocated, kernels launched) — tests check nothing leaks.
pub fn stats() -> (usize, usize, u64) {
    let s = get().state.lock().unwrap();
    (s.allocs.len(), s.allocated, s.launches)
}

fn err(msg: String) -> DriverError {
    DriverError(msg)
}

impl State {
    /// The allocation holding [ptr, ptr + bytes).
    fn check(&self, what: &str, ptr: u64, bytes: usize) -> Res<()> {
        if bytes == 0 {
            return Ok(());
        }
        match self.allocs.range(..=ptr).next_back() {
            Some((&start, (_, size))) if ptr + bytes as u64 <= start + *size as u64 => Ok(()),
            Some((&start, (_, size))) => Err(err(format!("{what}: {bytes} bytes at {ptr:#x} run past the allocation of {size} bytes at {start:#x}"))),
            None => Err(err(format!("{what}: {ptr:#x} is not device memory"))),
        }
    }
}

/// Devices the mock reports (all sharing its host memory): enough for tensor-parallel groups
/// of 2 and 4 over the mock RCCL (`nccl.rs`).
const MOCK_DEVICES: usize = 4;

impl Api for Mock {
    fn device_count(&self) -> Res<usize> {
        Ok(MOCK_DEVICES)
    }
    fn set_device(&self, ordinal: usize) -> Res<()> {
        if ordinal < MOCK_DEVICES {
            BOUND.with(|b| b.set(true));
            Ok(())
        } else {
            Err(err(format!("hipSetDevice({ordinal}): the mock has {MOCK_DEVICES} devices")))
        }
    }
    fn device_name(&self, _ordinal: usize) -> Res<String> {
        Ok("weft mock HIP device (gfx942 in host memory, kernels on the CPU emulator)".into())
    }
    fn gcn_arch(&self, _ordinal: usize) -> Res<String> {
        Ok("gfx942".into())
    }
    fn attribute(&self, _ordinal: usize, attr: DeviceAttr) -> Res<i32> {
        Ok(match attr {
            DeviceAttr::MultiprocessorCount => 304,
            DeviceAttr::SharedMemPerBlockOptin => 65536,
            DeviceAttr::WarpSize => 64,
            DeviceAttr::ComputeCapabilityMajor => 9,
            DeviceAttr::ComputeCapabilityMinor => 4,
        })
    }
    fn mem_info(&self) -> Res<(usize, usize)> {
        let s = self.state.lock().unwrap();
        Ok((TOTAL_BYTES.saturating_sub(s.allocated), TOTAL_BYTES))
    }
    fn stream_create(&self) -> Res<u64> {
        Ok(1)
    }
    fn stream_synchronize(&self, _stream: u64) -> Res<()> {
        Ok(())
    }
    fn malloc(&self, bytes: usize, _stream: u64) -> Res<u64> {
        bound("hipMallocAsync")?;
        let mut s = self.state.lock().unwrap();
        if s.allocated + bytes > TOTAL_BYTES {
            return Err(err(format!("hipMallocAsync({bytes} bytes): out of memory")));
        }
        let buf = vec![0u64; bytes.div_ceil(8).max(1)].into_boxed_slice();
        let p = buf.as_ptr() as u64;
        s.allocs.insert(p, (buf, bytes));
        s.allocated += bytes;
        Ok(p)
    }
    fn free(&self, ptr: u64, _stream: u64) {
        let mut s = self.state.lock().unwrap();
        if let Some((_, bytes)) = s.allocs.remove(&ptr) {
            s.allocated -= bytes;
        }
    }
    fn memset_zero(&self, ptr: u64, bytes: usize, _stream: u64) -> Res<()> {
        self.state.lock().unwrap().check("hipMemsetAsync", ptr, bytes)?;
        // SAFETY: checked to lie inside a live allocation.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        Ok(())
    }
    fn htod(&self, dst: u64, src: &[u8], _stream: u64) -> Res<()> {
        bound("hipMemcpyAsync")?;
        self.state.lock().unwrap().check("host-to-device copy", dst, src.len())?;
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }
    fn dtoh(&self, dst: &mut [u8], src: u64, _stream: u64) -> Res<()> {
        bound("hipMemcpyAsync")?;
        self.state.lock().unwrap().check("device-to-host copy", src, dst.len())?;
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    fn dtod(&self, dst: u64, src: u64, bytes: usize, _stream: u64) -> Res<()> {
        let s = self.state.lock().unwrap();
        s.check("device-to-device copy (source)", src, bytes)?;
        s.check("device-to-device copy (destination)", dst, bytes)?;
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }
    fn compile(&self, source: &str, _name: &str, options: &[String]) -> Res<Vec<u8>> {
        if !options.iter().any(|o| o.starts_with("--offload-arch=gfx")) {
            return Err(err(format!("hiprtc: no gfx target among the options {options:?}")));
        }
        Ok(source.as_bytes().to_vec())
    }
    fn module_load(&self, image: &[u8]) -> Res<u64> {
        if image.is_empty() {
            return Err(err("hipModuleLoadData: empty code object".into()));
        }
        Ok(1)
    }
    fn module_function(&self, _module: u64, name: &str) -> Res<u64> {
        let l = self.launcher.get().ok_or_else(|| err("mock HIP: no kernel launcher installed".into()))?;
        if !l.has(name) {
            return Err(err(format!("hipModuleGetFunction({name}): no such kernel")));
        }
        let mut s = self.state.lock().unwrap();
        s.functions.push(name.to_string());
        Ok(s.functions.len() as u64)
    }
    fn function_max_threads(&self, _func: u64) -> Res<i32> {
        Ok(1024)
    }
    unsafe fn launch(&self, func: u64, l: Launch, _stream: u64, args: &mut [*mut c_void]) -> Res<()> {
        bound("hipModuleLaunchKernel")?;
        let name = {
            let mut s = self.state.lock().unwrap();
            s.launches += 1;
            s.functions.get((func as usize).wrapping_sub(1)).cloned().ok_or_else(|| err(format!("hipModuleLaunchKernel: unknown function {func}")))?
        };
        let threads = l.block.0 * l.block.1 * l.block.2;
        if threads == 0 || threads > 1024 || l.grid.0 == 0 || l.grid.1 == 0 || l.grid.2 == 0 || l.grid.1 > 65535 || l.grid.2 > 65535 {
            return Err(err(format!("hipModuleLaunchKernel({name}): invalid launch {l:?}")));
        }
        if l.shared > 65536 {
            return Err(err(format!("hipModuleLaunchKernel({name}): {} bytes of dynamic LDS, the device has 65536", l.shared)));
        }
        let _one = self.running.lock().unwrap_or_else(|e| e.into_inner());
        self.launcher.get().ok_or_else(|| err("mock HIP: no kernel launcher installed".into()))?.launch(&name, l, args)
    }
    fn begin_capture(&self, _stream: u64) -> Res<()> {
        Err(err("mock HIP: stream capture is not emulated".into()))
    }
    fn end_capture(&self, _stream: u64) -> Res<Option<u64>> {
        Err(err("mock HIP: stream capture is not emulated".into()))
    }
    fn graph_launch(&self, _graph: u64, _stream: u64) -> Res<()> {
        Err(err("mock HIP: graphs are not emulated".into()))
    }
    fn graph_destroy(&self, _graph: u64) {}
}
