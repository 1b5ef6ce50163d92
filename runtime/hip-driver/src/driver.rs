//! cudarc's `driver` module as weft-cuda uses it — contexts, streams, typed device buffers and
//! views, kernel launches with pushed arguments, stream capture — over `Api`. Names follow
//! cudarc so the backend's host code is the same source for CUDA and HIP.

pub use crate::api::DriverError;
use crate::api::{Api, DeviceAttr, Launch, Res};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

fn api() -> &'static dyn Api {
    crate::api()
}

thread_local! {
    /// The device this thread last made current (HIP's current device is per thread).
    static CURRENT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Makes `ordinal` the calling thread's current device, once per change: the backend is made
/// on one thread and driven from the engine's, and HIP starts every thread on device 0.
fn bind(ordinal: usize) -> Res<()> {
    if CURRENT.with(|c| c.get()) != Some(ordinal) {
        api().set_device(ordinal)?;
        CURRENT.with(|c| c.set(Some(ordinal)));
    }
    Ok(())
}

/// The device attributes the backend reads, under cudarc's names.
pub mod sys {
    #[allow(non_camel_case_types)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum CUdevice_attribute {
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        CU_DEVICE_ATTRIBUTE_WARP_SIZE,
    }
    #[allow(non_camel_case_types)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum CUfunction_attribute {
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    }
    #[allow(non_camel_case_types)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum CUstreamCaptureMode {
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    }
    #[allow(non_camel_case_types)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum CUgraphInstantiate_flags {
        CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
    }
    /// Linked at build time (`sdk`) or built in (`mock`): always there once the crate links.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match cudarc's signature.
    pub unsafe fn is_culib_present() -> bool {
        true
    }
}

pub mod result {
    /// (free, total) bytes of the current device.
    pub fn mem_get_info() -> super::Res<(usize, usize)> {
        super::api().mem_info()
    }
}

/// One device, made current on the calling thread.
#[derive(Debug)]
pub struct CudaContext {
    ordinal: usize,
}

impl CudaContext {
    pub fn new(ordinal: usize) -> Res<Arc<Self>> {
        let n = api().device_count()?;
        if ordinal >= n {
            return Err(DriverError(format!("device {ordinal} does not exist ({n} HIP devices)")));
        }
        bind(ordinal)?;
        Ok(Arc::new(CudaContext { ordinal }))
    }

    /// Makes this device current on the calling thread.
    pub fn bind_to_thread(&self) -> Res<()> {
        bind(self.ordinal)
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn name(&self) -> Res<String> {
        api().device_name(self.ordinal)
    }

    /// The gfx target the kernels are compiled for, e.g. "gfx942".
    pub fn gcn_arch(&self) -> Res<String> {
        api().gcn_arch(self.ordinal)
    }

    pub fn compute_capability(&self) -> Res<(i32, i32)> {
        Ok((api().attribute(self.ordinal, DeviceAttr::ComputeCapabilityMajor)?, api().attribute(self.ordinal, DeviceAttr::ComputeCapabilityMinor)?))
    }

    pub fn attribute(&self, attr: sys::CUdevice_attribute) -> Res<i32> {
        use sys::CUdevice_attribute::*;
        let a = match attr {
            CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => DeviceAttr::MultiprocessorCount,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => DeviceAttr::SharedMemPerBlockOptin,
            CU_DEVICE_ATTRIBUTE_WARP_SIZE => DeviceAttr::WarpSize,
        };
        api().attribute(self.ordinal, a)
    }

    pub fn load_module(self: &Arc<Self>, code: crate::nvrtc::Ptx) -> Res<Arc<CudaModule>> {
        bind(self.ordinal)?;
        Ok(Arc::new(CudaModule { raw: api().module_load(&code.0)?, _ctx: self.clone() }))
    }

    /// cudarc records events per argument to order streams; one stream needs none here.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match cudarc's signature.
    pub unsafe fn disable_event_tracking(&self) {}

    pub fn new_stream(self: &Arc<Self>) -> Res<Arc<CudaStream>> {
        bind(self.ordinal)?;
        Ok(Arc::new(CudaStream { raw: api().stream_create()?, _ctx: self.clone() }))
    }
}

#[derive(Debug)]
pub struct CudaModule {
    raw: u64,
    _ctx: Arc<CudaContext>,
}

impl CudaModule {
    pub fn load_function(self: &Arc<Self>, name: &str) -> Res<CudaFunction> {
        Ok(CudaFunction { raw: api().module_function(self.raw, name)?, _module: self.clone() })
    }
}

#[derive(Clone, Debug)]
pub struct CudaFunction {
    raw: u64,
    _module: Arc<CudaModule>,
}

impl CudaFunction {
    pub fn max_threads_per_block(&self) -> Res<i32> {
        api().function_max_threads(self.raw)
    }

    /// AMD GPUs give every block its whole LDS allowance without opting in: nothing to set.
    pub fn set_attribute(&self, _attr: sys::CUfunction_attribute, _value: i32) -> Res<()> {
        Ok(())
    }
}

/// The one stream every buffer of a backend lives on.
#[derive(Debug)]
pub struct CudaStream {
    raw: u64,
    _ctx: Arc<CudaContext>,
}

/// Element types that cross to the device as raw bytes.
///
/// # Safety
/// Implementors are plain data: any bit pattern of their size is a value.
pub unsafe trait DeviceRepr: Copy + 'static {}
macro_rules! device_repr {
    ($($t:ty),*) => { $(unsafe impl DeviceRepr for $t {})* };
}
device_repr!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, usize, isize, bool);

/// Host memory a copy reads from.
pub trait HostSlice<T> {
    fn host(&self) -> &[T];
}
impl<T> HostSlice<T> for [T] {
    fn host(&self) -> &[T] {
        self
    }
}
impl<T> HostSlice<T> for Vec<T> {
    fn host(&self) -> &[T] {
        self
    }
}

fn bytes_of<T: DeviceRepr>(v: &[T]) -> &[u8] {
    // SAFETY: DeviceRepr types are plain data.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// cudarc's guard returned with a device pointer; nothing to synchronize on one stream.
pub struct SyncOnDrop<'a>(PhantomData<&'a ()>);

/// A device range readable by kernels and copies.
pub trait DevicePtr<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>);
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A device range writable by kernels and copies.
pub trait DevicePtrMut<T>: DevicePtr<T> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>);
}

/// A typed device allocation, freed on the stream that made it.
#[derive(Debug)]
pub struct CudaSlice<T> {
    ptr: u64,
    len: usize,
    stream: Arc<CudaStream>,
    _t: PhantomData<T>,
}

// SAFETY: the slice owns device memory; the handle is an address.
unsafe impl<T> Send for CudaSlice<T> {}
unsafe impl<T> Sync for CudaSlice<T> {}

impl<T> Drop for CudaSlice<T> {
    fn drop(&mut self) {
        api().free(self.ptr, self.stream.raw);
    }
}

/// A borrowed part of a device buffer.
#[derive(Debug)]
pub struct CudaView<'a, T> {
    ptr: u64,
    len: usize,
    _t: PhantomData<&'a T>,
}

/// A mutably borrowed part of a device buffer.
#[derive(Debug)]
pub struct CudaViewMut<'a, T> {
    ptr: u64,
    len: usize,
    _t: PhantomData<&'a mut T>,
}

fn bounds(r: impl RangeBounds<usize>, len: usize) -> (usize, usize) {
    let s = match r.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s + 1,
        Bound::Unbounded => 0,
    };
    let e = match r.end_bound() {
        Bound::Included(&e) => e + 1,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    assert!(s <= e && e <= len, "device range {s}..{e} out of a buffer of {len}");
    (s, e)
}

impl<T> CudaSlice<T> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    pub fn slice(&self, r: impl RangeBounds<usize>) -> CudaView<'_, T> {
        let (s, e) = bounds(r, self.len);
        CudaView { ptr: self.ptr + (s * std::mem::size_of::<T>()) as u64, len: e - s, _t: PhantomData }
    }
    pub fn slice_mut(&mut self, r: impl RangeBounds<usize>) -> CudaViewMut<'_, T> {
        let (s, e) = bounds(r, self.len);
        CudaViewMut { ptr: self.ptr + (s * std::mem::size_of::<T>()) as u64, len: e - s, _t: PhantomData }
    }
    pub fn split_at_mut(&mut self, mid: usize) -> (CudaViewMut<'_, T>, CudaViewMut<'_, T>) {
        assert!(mid <= self.len, "split at {mid} of a buffer of {}", self.len);
        let b = self.ptr + (mid * std::mem::size_of::<T>()) as u64;
        (CudaViewMut { ptr: self.ptr, len: mid, _t: PhantomData }, CudaViewMut { ptr: b, len: self.len - mid, _t: PhantomData })
    }
}

impl<T> CudaViewMut<'_, T> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn slice_mut(&mut self, r: impl RangeBounds<usize>) -> CudaViewMut<'_, T> {
        let (s, e) = bounds(r, self.len);
        CudaViewMut { ptr: self.ptr + (s * std::mem::size_of::<T>()) as u64, len: e - s, _t: PhantomData }
    }
}

macro_rules! device_ptr_impls {
    ($($ty:ident $(<$l:lifetime>)?),*) => {$(
        impl<$($l,)? T> DevicePtr<T> for $ty<$($l,)? T> {
            fn device_ptr<'s>(&'s self, _stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
                (self.ptr, SyncOnDrop(PhantomData))
            }
            fn len(&self) -> usize {
                self.len
            }
        }
    )*};
}
device_ptr_impls!(CudaSlice, CudaView<'v>, CudaViewMut<'v>);

impl<T> DevicePtrMut<T> for CudaSlice<T> {
    fn device_ptr_mut<'s>(&'s mut self, _stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        (self.ptr, SyncOnDrop(PhantomData))
    }
}
impl<T> DevicePtrMut<T> for CudaViewMut<'_, T> {
    fn device_ptr_mut<'s>(&'s mut self, _stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        (self.ptr, SyncOnDrop(PhantomData))
    }
}

fn check_len(what: &str, src: usize, dst: usize) -> Res<()> {
    if src > dst {
        return Err(DriverError(format!("{what}: {src} elements into a buffer of {dst}")));
    }
    Ok(())
}

impl CudaStream {
    pub fn raw(&self) -> u64 {
        self.raw
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self._ctx
    }

    /// # Safety
    /// The contents are uninitialised.
    pub unsafe fn alloc<T: DeviceRepr>(self: &Arc<Self>, len: usize) -> Res<CudaSlice<T>> {
        self.bind()?;
        let ptr = api().malloc(len * std::mem::size_of::<T>(), self.raw)?;
        Ok(CudaSlice { ptr, len, stream: self.clone(), _t: PhantomData })
    }

    pub fn alloc_zeros<T: DeviceRepr>(self: &Arc<Self>, len: usize) -> Res<CudaSlice<T>> {
        let s = unsafe { self.alloc::<T>(len) }?;
        api().memset_zero(s.ptr, s.num_bytes(), self.raw)?;
        Ok(s)
    }

    pub fn clone_htod<T: DeviceRepr, S: HostSlice<T> + ?Sized>(self: &Arc<Self>, src: &S) -> Res<CudaSlice<T>> {
        let h = src.host();
        let mut d = unsafe { self.alloc::<T>(h.len()) }?;
        self.memcpy_htod(h, &mut d)?;
        Ok(d)
    }

    pub fn memcpy_htod<T: DeviceRepr, S: HostSlice<T> + ?Sized, D: DevicePtrMut<T>>(&self, src: &S, dst: &mut D) -> Res<()> {
        let h = src.host();
        check_len("host-to-device copy", h.len(), dst.len())?;
        self.bind()?;
        let (p, _g) = dst.device_ptr_mut(self);
        api().htod(p, bytes_of(h), self.raw)?;
        // The host buffer may be freed when this returns: wait for the copy.
        api().stream_synchronize(self.raw)
    }

    pub fn clone_dtoh<T: DeviceRepr + Default, S: DevicePtr<T>>(&self, src: &S) -> Res<Vec<T>> {
        self.bind()?;
        let mut v = vec![T::default(); src.len()];
        let (p, _g) = src.device_ptr(self);
        // SAFETY: DeviceRepr types are plain data.
        let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v.as_slice())) };
        api().dtoh(bytes, p, self.raw)?;
        api().stream_synchronize(self.raw)?;
        Ok(v)
    }

    pub fn memcpy_dtod<T, S: DevicePtr<T>, D: DevicePtrMut<T>>(&self, src: &S, dst: &mut D) -> Res<()> {
        check_len("device-to-device copy", src.len(), dst.len())?;
        self.bind()?;
        let n = src.len() * std::mem::size_of::<T>();
        let (s, _gs) = src.device_ptr(self);
        let (d, _gd) = dst.device_ptr_mut(self);
        api().dtod(d, s, n, self.raw)
    }

    pub fn clone_dtod<T: DeviceRepr, S: DevicePtr<T>>(self: &Arc<Self>, src: &S) -> Res<CudaSlice<T>> {
        let mut d = unsafe { self.alloc::<T>(src.len()) }?;
        self.memcpy_dtod(src, &mut d)?;
        Ok(d)
    }

    pub fn synchronize(&self) -> Res<()> {
        self.bind()?;
        api().stream_synchronize(self.raw)
    }

    fn bind(&self) -> Res<()> {
        bind(self._ctx.ordinal)
    }

    pub fn launch_builder<'a>(&'a self, func: &'a CudaFunction) -> LaunchArgs<'a> {
        LaunchArgs { stream: self, func, args: Vec::new() }
    }

    pub fn begin_capture(&self, _mode: sys::CUstreamCaptureMode) -> Res<()> {
        self.bind()?;
        api().begin_capture(self.raw)
    }

    pub fn end_capture(self: &Arc<Self>, _flags: sys::CUgraphInstantiate_flags) -> Res<Option<CudaGraph>> {
        Ok(api().end_capture(self.raw)?.map(|raw| CudaGraph { raw, stream: self.clone() }))
    }
}

/// An instantiated recording of a stream's work.
pub struct CudaGraph {
    raw: u64,
    stream: Arc<CudaStream>,
}

// SAFETY: a handle; replays are ordered on the backend's stream.
unsafe impl Send for CudaGraph {}
unsafe impl Sync for CudaGraph {}

impl CudaGraph {
    pub fn launch(&self) -> Res<()> {
        self.stream.bind()?;
        api().graph_launch(self.raw, self.stream.raw)
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        api().graph_destroy(self.raw);
    }
}

/// Grid, block and dynamic shared memory of a launch, as cudarc spells them.
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    pub grid_dim: (u32, u32, u32),
    pub block_dim: (u32, u32, u32),
    pub shared_mem_bytes: u32,
}

/// A launch being assembled: each argument is kept as the bytes of its value (at most 8, every
/// kernel parameter of weft is a pointer or a scalar) until `launch` passes their addresses.
pub struct LaunchArgs<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    args: Vec<u64>,
}

/// Pushes one kernel argument (cudarc's trait name).
pub trait PushKernelArg<T> {
    fn arg(&mut self, arg: T) -> &mut Self;
}

impl<'a, T: DeviceRepr> PushKernelArg<&T> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &T) -> &mut Self {
        assert!(std::mem::size_of::<T>() <= 8, "kernel arguments are at most 8 bytes");
        let mut slot = 0u64;
        // SAFETY: T is plain data of at most 8 bytes; the slot is 8 bytes.
        unsafe { std::ptr::copy_nonoverlapping(arg as *const T as *const u8, &mut slot as *mut u64 as *mut u8, std::mem::size_of::<T>()) };
        self.args.push(slot);
        self
    }
}

macro_rules! push_device_arg {
    ($($ty:ty),*) => {$(
        impl<'a, 'b, 'v, T> PushKernelArg<$ty> for LaunchArgs<'a> {
            fn arg(&mut self, arg: $ty) -> &mut Self {
                self.args.push(arg.ptr);
                self
            }
        }
    )*};
}
push_device_arg!(&'b CudaSlice<T>, &'b mut CudaSlice<T>, &'b CudaView<'v, T>, &'b mut CudaViewMut<'v, T>);

impl LaunchArgs<'_> {
    /// # Safety
    /// The pushed arguments must match the kernel's parameters.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Res<()> {
        let mut ptrs: Vec<*mut c_void> = self.args.iter_mut().map(|a| a as *mut u64 as *mut c_void).collect();
        let l = Launch { grid: cfg.grid_dim, block: cfg.block_dim, shared: cfg.shared_mem_bytes };
        self.stream.bind()?;
        api().launch(self.func.raw, l, self.stream.raw, &mut ptrs)
    }
}
