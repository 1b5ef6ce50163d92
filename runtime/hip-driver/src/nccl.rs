//! The part of cudarc's `nccl` API weft-cuda's tensor-parallel group uses (`weft_cuda::nccl`),
//! over RCCL — AMD's NCCL, the same C API on HIP streams — or, with the `mock` runtime, over a
//! host-memory group whose ranks are threads of the process (every mock device shares host
//! memory), so the HIP build's collective path runs in tests without AMD GPUs.
//!
//! RCCL is opened at run time (`librccl.so`, then `librccl.so.1`), like cudarc opens NCCL: a
//! machine without it gets `is_culib_present() == false` and weft reports the group unavailable.
//! What the mock cannot show: RCCL's own behaviour, its transports and timing.

pub mod sys {
    /// Whether the collective library can be used here (RCCL on the loader path; always with
    /// the mock).
    ///
    /// # Safety
    /// Only opens the library; `unsafe` to match cudarc's signature.
    pub unsafe fn is_culib_present() -> bool {
        super::imp::present()
    }
}

pub mod safe {
    use crate::driver::{CudaSlice, CudaStream, DevicePtrMut};
    use std::sync::Arc;

    /// An RCCL (or mock) error, with the library's message.
    #[derive(Debug)]
    pub struct NcclError(pub String);

    #[derive(Debug, Clone, Copy)]
    pub enum ReduceOp {
        Sum,
    }

    /// One rank's communicator, bound to its stream.
    pub struct Comm {
        inner: super::imp::Comm,
        stream: Arc<CudaStream>,
        rank: usize,
        size: usize,
    }

    impl Comm {
        /// One communicator per stream, rank = position, over the streams' devices (distinct).
        pub fn from_devices(streams: Vec<Arc<CudaStream>>) -> Result<Vec<Comm>, NcclError> {
            let devices: Vec<usize> = streams.iter().map(|s| s.context().ordinal()).collect();
            let inner = super::imp::init_all(&devices)?;
            let size = streams.len();
            Ok(inner.into_iter().zip(streams).enumerate().map(|(rank, (inner, stream))| Comm { inner, stream, rank, size }).collect())
        }

        pub fn rank(&self) -> usize {
            self.rank
        }

        pub fn world_size(&self) -> usize {
            self.size
        }

        /// `buf` summed over the group, in place, ordered on this rank's stream.
        pub fn all_reduce_in_place(&self, buf: &mut CudaSlice<f32>, op: &ReduceOp) -> Result<(), NcclError> {
            let ReduceOp::Sum = op;
            let len = buf.len();
            let (ptr, _sync) = buf.device_ptr_mut(&self.stream);
            super::imp::all_reduce_sum_f32(&self.inner, ptr, len, &self.stream)
        }
    }
}

#[cfg(feature = "sdk")]
mod imp {
    //! RCCL through its C API, loaded at run time.
    use super::safe::NcclError;
    use crate::driver::CudaStream;
    use std::ffi::{c_char, c_int, c_void, CStr};
    use std::sync::OnceLock;

    type RcclComm = *mut c_void;
    /// ncclFloat32 and ncclSum in nccl.h / rccl.h.
    const NCCL_FLOAT32: c_int = 7;
    const NCCL_SUM: c_int = 0;

    struct Lib {
        _lib: libloading::Library,
        init_all: unsafe extern "C" fn(*mut RcclComm, c_int, *const c_int) -> c_int,
        all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RcclComm, *mut c_void) -> c_int,
        destroy: unsafe extern "C" fn(RcclComm) -> c_int,
        error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    }

    fn lib() -> Result<&'static Lib, NcclError> {
        static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
        LIB.get_or_init(|| {
            // SAFETY: loading RCCL runs its initialisers only; the symbols are its public C API
            // with the signatures of rccl.h.
            unsafe {
                let lib = libloading::Library::new("librccl.so").or_else(|_| libloading::Library::new("librccl.so.1")).map_err(|e| format!("RCCL (librccl.so) is not on the loader path: {e}"))?;
                let sym = |name: &[u8]| -> Result<*const c_void, String> { lib.get::<*const c_void>(name).map(|s| *s).map_err(|e| format!("RCCL lacks {}: {e}", String::from_utf8_lossy(name))) };
                let (init_all, all_reduce, destroy, error_string) = (sym(b"ncclCommInitAll\0")?, sym(b"ncclAllReduce\0")?, sym(b"ncclCommDestroy\0")?, sym(b"ncclGetErrorString\0")?);
                Ok(Lib {
                    init_all: std::mem::transmute::<*const c_void, _>(init_all),
                    all_reduce: std::mem::transmute::<*const c_void, _>(all_reduce),
                    destroy: std::mem::transmute::<*const c_void, _>(destroy),
                    error_string: std::mem::transmute::<*const c_void, _>(error_string),
                    _lib: lib,
                })
            }
        })
        .as_ref()
        .map_err(|e| NcclError(e.clone()))
    }

    fn check(l: &Lib, call: &str, r: c_int) -> Result<(), NcclError> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let msg = unsafe { CStr::from_ptr((l.error_string)(r)) }.to_string_lossy().into_owned();
        Err(NcclError(format!("{call}: {msg} ({r})")))
    }

    pub(super) fn present() -> bool {
        lib().is_ok()
    }

    pub(super) struct Comm(RcclComm);

    // SAFETY: an RCCL communicator may be used from any thread, one call at a time (the
    // caller, weft_cuda::nccl::NcclRank, serialises calls).
    unsafe impl Send for Comm {}
    unsafe impl Sync for Comm {}

    impl Drop for Comm {
        fn drop(&mut self) {
            if let Ok(l) = lib() {
                // SAFETY: the communicator came from ncclCommInitAll and is destroyed once.
                unsafe { (l.destroy)(self.0) };
            }
        }
    }

    pub(super) fn init_all(devices: &[usize]) -> Result<Vec<Comm>, NcclError> {
        let l = lib()?;
        let list: Vec<c_int> = devices.iter().map(|&d| d as c_int).collect();
        let mut comms = vec![std::ptr::null_mut(); list.len()];
        // SAFETY: `comms` has room for one communicator per listed device.
        check(l, "ncclCommInitAll", unsafe { (l.init_all)(comms.as_mut_ptr(), list.len() as c_int, list.as_ptr()) })?;
        Ok(comms.into_iter().map(Comm).collect())
    }

    pub(super) fn all_reduce_sum_f32(c: &Comm, ptr: u64, len: usize, stream: &CudaStream) -> Result<(), NcclError> {
        let l = lib()?;
        stream.context().bind_to_thread().map_err(|e| NcclError(e.0))?;
        let p = ptr as *mut c_void;
        // SAFETY: `p` is `len` f32 of device memory on this communicator's device; the stream
        // is the rank's (a hipStream_t).
        check(l, "ncclAllReduce", unsafe { (l.all_reduce)(p, p, len, NCCL_FLOAT32, NCCL_SUM, c.0, stream.raw() as *mut c_void) })
    }
}

#[cfg(all(feature = "mock", not(feature = "sdk")))]
mod imp {
    //! A group of mock devices summing through host memory: each rank deposits its buffer,
    //! waits for the others, and writes back the rank-ordered sum (the mock runs every call
    //! synchronously, so a rank's buffer is final when it calls).
    use super::safe::NcclError;
    use crate::api;
    use crate::driver::CudaStream;
    use std::sync::{Arc, Barrier, Mutex};

    struct Group {
        barrier: Barrier,
        slots: Mutex<Vec<Vec<f32>>>,
    }

    pub(super) struct Comm {
        group: Arc<Group>,
        rank: usize,
    }

    pub(super) fn present() -> bool {
        true
    }

    pub(super) fn init_all(devices: &[usize]) -> Result<Vec<Comm>, NcclError> {
        let n = api().device_count().map_err(|e| NcclError(e.0))?;
        if let Some(d) = devices.iter().find(|&&d| d >= n) {
            return Err(NcclError(format!("ncclCommInitAll: device {d} of {n}")));
        }
        let group = Arc::new(Group { barrier: Barrier::new(devices.len()), slots: Mutex::new(vec![vec![]; devices.len()]) });
        Ok((0..devices.len()).map(|rank| Comm { group: group.clone(), rank }).collect())
    }

    pub(super) fn all_reduce_sum_f32(c: &Comm, ptr: u64, len: usize, stream: &CudaStream) -> Result<(), NcclError> {
        let mut bytes = vec![0u8; len * 4];
        api().dtoh(&mut bytes, ptr, stream.raw()).map_err(|e| NcclError(e.0))?;
        c.group.slots.lock().unwrap()[c.rank] = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        c.group.barrier.wait();
        let sum = {
            let slots = c.group.slots.lock().unwrap();
            if slots.iter().any(|s| s.len() != len) {
                drop(slots);
                c.group.barrier.wait();
                return Err(NcclError(format!("ncclAllReduce: ranks passed different lengths (rank {} {len})", c.rank)));
            }
            (0..len).map(|i| slots.iter().map(|s| s[i]).sum::<f32>()).collect::<Vec<f32>>()
        };
        // Nobody deposits the next call's buffer before every rank has read this one's.
        c.group.barrier.wait();
        let out: Vec<u8> = sum.iter().flat_map(|v| v.to_le_bytes()).collect();
        api().htod(ptr, &out, stream.raw()).map_err(|e| NcclError(e.0))
    }
}
