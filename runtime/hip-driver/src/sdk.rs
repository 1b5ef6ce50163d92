//! `Api` over the HIP runtime (libamdhip64, linked through hip-sys) and hiprtc (inside
//! libamdhip64 up to ROCm 5.x; ROCm 6 moved it to libhiprtc, which build.rs links when present).
//! Allocations are stream-ordered (`hipMallocAsync`), as cudarc's are on CUDA.

use crate::api::{Api, DeviceAttr, DriverError, Launch, Res};
use hip_sys::hiprt as h;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

pub struct Sdk;

fn check(call: &str, e: h::hipError_t) -> Res<()> {
    if e == h::hipError_t::hipSuccess {
        return Ok(());
    }
    // SAFETY: hipGetErrorString returns a static string for any code.
    let msg = unsafe { CStr::from_ptr(h::hipGetErrorString(e)) }.to_string_lossy().into_owned();
    Err(DriverError(format!("{call}: {msg} ({e:?})")))
}

#[allow(non_camel_case_types)]
type hiprtcProgram = *mut c_void;

// hiprtc's C API (hip-sys binds the runtime only). Status 0 is HIPRTC_SUCCESS.
extern "C" {
    fn hiprtcCreateProgram(prog: *mut hiprtcProgram, src: *const c_char, name: *const c_char, num_headers: c_int, headers: *const *const c_char, names: *const *const c_char) -> c_int;
    fn hiprtcCompileProgram(prog: hiprtcProgram, num_options: c_int, options: *const *const c_char) -> c_int;
    fn hiprtcGetProgramLogSize(prog: hiprtcProgram, size: *mut usize) -> c_int;
    fn hiprtcGetProgramLog(prog: hiprtcProgram, log: *mut c_char) -> c_int;
    fn hiprtcGetCodeSize(prog: hiprtcProgram, size: *mut usize) -> c_int;
    fn hiprtcGetCode(prog: hiprtcProgram, code: *mut c_char) -> c_int;
    fn hiprtcDestroyProgram(prog: *mut hiprtcProgram) -> c_int;
    fn hiprtcGetErrorString(status: c_int) -> *const c_char;
}

fn rtc(call: &str, status: c_int) -> Res<()> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: returns a static string for any status.
    let msg = unsafe { CStr::from_ptr(hiprtcGetErrorString(status)) }.to_string_lossy().into_owned();
    Err(DriverError(format!("{call}: {msg}")))
}

fn stream(s: u64) -> h::hipStream_t {
    s as h::hipStream_t
}

impl Api for Sdk {
    fn device_count(&self) -> Res<usize> {
        let mut n: c_int = 0;
        // SAFETY: out-pointer to a local.
        check("hipGetDeviceCount", unsafe { h::hipGetDeviceCount(&mut n) })?;
        Ok(n.max(0) as usize)
    }

    fn set_device(&self, ordinal: usize) -> Res<()> {
        check("hipSetDevice", unsafe { h::hipSetDevice(ordinal as c_int) })
    }

    fn device_name(&self, ordinal: usize) -> Res<String> {
        let mut buf = [0 as c_char; 256];
        check("hipDeviceGetName", unsafe { h::hipDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, ordinal as c_int) })?;
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    fn gcn_arch(&self, ordinal: usize) -> Res<String> {
        // The runtime writes its own version's hipDeviceProp_t, which may be larger than the
        // bindings' (ROCm releases grew it): give it room. gcnArchName sits early in every
        // layout the unversioned `hipGetDeviceProperties` symbol uses.
        #[repr(C)]
        struct Props {
            p: h::hipDeviceProp_t,
            _room: [u8; 8192],
        }
        // SAFETY: plain data; the runtime fills it.
        let mut props: Box<Props> = Box::new(unsafe { std::mem::zeroed() });
        check("hipGetDeviceProperties", unsafe { h::hipGetDeviceProperties(&mut props.p, ordinal as c_int) })?;
        let name = &props.p.gcnArchName;
        let len = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        let full = String::from_utf8_lossy(&name[..len].iter().map(|&c| c as u8).collect::<Vec<u8>>()).into_owned();
        Ok(full.split(':').next().unwrap_or_default().to_string())
    }

    fn attribute(&self, ordinal: usize, attr: DeviceAttr) -> Res<i32> {
        use h::hipDeviceAttribute_t as A;
        let a = match attr {
            DeviceAttr::MultiprocessorCount => A::hipDeviceAttributeMultiprocessorCount,
            DeviceAttr::SharedMemPerBlockOptin => A::hipDeviceAttributeMaxSharedMemoryPerBlock,
            DeviceAttr::WarpSize => A::hipDeviceAttributeWarpSize,
            DeviceAttr::ComputeCapabilityMajor => A::hipDeviceAttributeComputeCapabilityMajor,
            DeviceAttr::ComputeCapabilityMinor => A::hipDeviceAttributeComputeCapabilityMinor,
        };
        let mut v: c_int = 0;
        check("hipDeviceGetAttribute", unsafe { h::hipDeviceGetAttribute(&mut v, a, ordinal as c_int) })?;
        Ok(v)
    }

    fn mem_info(&self) -> Res<(usize, usize)> {
        let (mut free, mut total) = (0usize, 0usize);
        check("hipMemGetInfo", unsafe { h::hipMemGetInfo(&mut free, &mut total) })?;
        Ok((free, total))
    }

    fn stream_create(&self) -> Res<u64> {
        let mut s: h::hipStream_t = std::ptr::null_mut();
        // hipStreamNonBlocking: no implicit ordering with the legacy default stream.
        check("hipStreamCreateWithFlags", unsafe { h::hipStreamCreateWithFlags(&mut s, 1) })?;
        Ok(s as u64)
    }

    fn stream_synchronize(&self, s: u64) -> Res<()> {
        check("hipStreamSynchronize", unsafe { h::hipStreamSynchronize(stream(s)) })
    }

    fn malloc(&self, bytes: usize, s: u64) -> Res<u64> {
        let mut p: *mut c_void = std::ptr::null_mut();
        check(&format!("hipMallocAsync({bytes} bytes)"), unsafe { h::hipMallocAsync(&mut p, bytes.max(1), stream(s)) })?;
        Ok(p as u64)
    }

    fn free(&self, ptr: u64, s: u64) {
        // A failed free at drop has nowhere to go; the runtime reports it on the next call.
        let _ = unsafe { h::hipFreeAsync(ptr as *mut c_void, stream(s)) };
    }

    fn memset_zero(&self, ptr: u64, bytes: usize, s: u64) -> Res<()> {
        check("hipMemsetAsync", unsafe { h::hipMemsetAsync(ptr as *mut c_void, 0, bytes, stream(s)) })
    }

    fn htod(&self, dst: u64, src: &[u8], s: u64) -> Res<()> {
        check("hipMemcpyAsync(host to device)", unsafe { h::hipMemcpyAsync(dst as *mut c_void, src.as_ptr() as *const c_void, src.len(), h::hipMemcpyKind::hipMemcpyHostToDevice, stream(s)) })
    }

    fn dtoh(&self, dst: &mut [u8], src: u64, s: u64) -> Res<()> {
        check("hipMemcpyAsync(device to host)", unsafe { h::hipMemcpyAsync(dst.as_mut_ptr() as *mut c_void, src as *const c_void, dst.len(), h::hipMemcpyKind::hipMemcpyDeviceToHost, stream(s)) })
    }

    fn dtod(&self, dst: u64, src: u64, bytes: usize, s: u64) -> Res<()> {
        check("hipMemcpyAsync(device to device)", unsafe { h::hipMemcpyAsync(dst as *mut c_void, src as *const c_void, bytes, h::hipMemcpyKind::hipMemcpyDeviceToDevice, stream(s)) })
    }

    fn compile(&self, source: &str, name: &str, options: &[String]) -> Res<Vec<u8>> {
        let (src, name) = (CString::new(source).map_err(|e| DriverError(format!("kernel source: {e}")))?, CString::new(name).unwrap_or_default());
        let opts: Vec<CString> = options.iter().map(|o| CString::new(o.as_str()).unwrap_or_default()).collect();
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: hiprtcProgram = std::ptr::null_mut();
        unsafe {
            rtc("hiprtcCreateProgram", hiprtcCreateProgram(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()))?;
            let compiled = hiprtcCompileProgram(prog, ptrs.len() as c_int, ptrs.as_ptr());
            let result = if compiled != 0 {
                let mut n = 0usize;
                hiprtcGetProgramLogSize(prog, &mut n);
                let mut log = vec![0u8; n.max(1)];
                hiprtcGetProgramLog(prog, log.as_mut_ptr() as *mut c_char);
                let log = String::from_utf8_lossy(&log).trim_end_matches('\0').to_string();
                rtc("hiprtcCompileProgram", compiled).map_err(|e| DriverError(format!("{e}\n{log}"))).map(|_| Vec::new())
            } else {
                let mut n = 0usize;
                rtc("hiprtcGetCodeSize", hiprtcGetCodeSize(prog, &mut n))?;
                let mut code = vec![0u8; n];
                rtc("hiprtcGetCode", hiprtcGetCode(prog, code.as_mut_ptr() as *mut c_char)).map(|_| code)
            };
            hiprtcDestroyProgram(&mut prog);
            result.and_then(|c| if c.is_empty() { Err(DriverError("hiprtc produced no code".into())) } else { Ok(c) })
        }
    }

    fn module_load(&self, image: &[u8]) -> Res<u64> {
        let mut m: h::hipModule_t = std::ptr::null_mut();
        check("hipModuleLoadData", unsafe { h::hipModuleLoadData(&mut m, image.as_ptr() as *const c_void) })?;
        Ok(m as u64)
    }

    fn module_function(&self, module: u64, name: &str) -> Res<u64> {
        let c = CString::new(name).map_err(|e| DriverError(format!("kernel name {name:?}: {e}")))?;
        let mut f: h::hipFunction_t = std::ptr::null_mut();
        check(&format!("hipModuleGetFunction({name})"), unsafe { h::hipModuleGetFunction(&mut f, module as h::hipModule_t, c.as_ptr()) })?;
        Ok(f as u64)
    }

    fn function_max_threads(&self, func: u64) -> Res<i32> {
        let mut v: c_int = 0;
        check("hipFuncGetAttribute", unsafe { h::hipFuncGetAttribute(&mut v, h::hipFunction_attribute::HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, func as h::hipFunction_t) })?;
        Ok(v)
    }

    unsafe fn launch(&self, func: u64, l: Launch, s: u64, args: &mut [*mut c_void]) -> Res<()> {
        check(
            "hipModuleLaunchKernel",
            h::hipModuleLaunchKernel(func as h::hipFunction_t, l.grid.0, l.grid.1, l.grid.2, l.block.0, l.block.1, l.block.2, l.shared, stream(s), args.as_mut_ptr(), std::ptr::null_mut()),
        )
    }

    fn begin_capture(&self, s: u64) -> Res<()> {
        check("hipStreamBeginCapture", unsafe { h::hipStreamBeginCapture(stream(s), h::hipStreamCaptureMode::hipStreamCaptureModeThreadLocal) })
    }

    fn end_capture(&self, s: u64) -> Res<Option<u64>> {
        let mut g: h::hipGraph_t = std::ptr::null_mut();
        check("hipStreamEndCapture", unsafe { h::hipStreamEndCapture(stream(s), &mut g) })?;
        if g.is_null() {
            return Ok(None);
        }
        let mut exec: h::hipGraphExec_t = std::ptr::null_mut();
        let r = check("hipGraphInstantiate", unsafe { h::hipGraphInstantiate(&mut exec, g, std::ptr::null_mut(), std::ptr::null_mut(), 0) });
        unsafe { h::hipGraphDestroy(g) };
        r.map(|_| Some(exec as u64))
    }

    fn graph_launch(&self, graph: u64, s: u64) -> Res<()> {
        check("hipGraphLaunch", unsafe { h::hipGraphLaunch(graph as h::hipGraphExec_t, stream(s)) })
    }

    fn graph_destroy(&self, graph: u64) {
        let _ = unsafe { h::hipGraphExecDestroy(graph as h::hipGraphExec_t) };
    }
}
