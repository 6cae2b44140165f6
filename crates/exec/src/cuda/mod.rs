//! The CUDA backend: the same kernels as [`crate::cpu`], on an NVIDIA GPU.
//!
//! # Libraries
//!
//! The driver (`libcuda`), cuBLAS and NVRTC are loaded when first used, so the crate builds, and
//! its tests run, on machines without CUDA. Every entry point checks that the library it needs
//! can be loaded and returns a typed [`CudaError`] when it cannot ([`driver_present`],
//! [`nvrtc_present`]).
//!
//! # Kernels
//!
//! The kernels are CUDA C in `prelude.cu`, `kernels.cu` and `fused.cu` ([`kernel_source`]),
//! compiled with NVRTC (`compile.rs`) once per process and architecture and loaded into each
//! device's context: to machine code for the device's own architecture (an `sm_XY` cubin,
//! [`compile_cubin`]) when NVRTC can emit it, else to PTX for the newest virtual architecture it
//! supports ([`compile_kernels`]), which the driver compiles when loading. Machine code matters:
//! an NVRTC newer than the driver writes PTX of an ISA version the driver cannot read
//! (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`), while a cubin needs only a driver that knows the
//! architecture. [`versions`] says which NVRTC and driver were found.
//! Each kernel exists for `f32` and `f64` and computes what the CPU kernel of the same name
//! computes, element for element (reductions may add in another order). Matrix products go to
//! cuBLAS.
//!
//! Where each list lives, so that the Rust and CUDA sides cannot drift:
//! * the kernels the backend loads: one `Variant => "name"` list in `params.rs` (the enum `K`,
//!   the names, `K::base`), checked against the kernels the source defines;
//! * the elementwise ops and the reductions: the op tables in [`crate::ops`], whose CUDA columns
//!   become the op codes and `switch` cases prepended to the source;
//! * the numbers both sides use (threads per block, [`MAX_DIMS`], GELU's and softplus's
//!   constants, dropout's hash multipliers): Rust constants, prepended to the source as
//!   `#define`s by [`crate::ops::cuda_defines`]; no `.cu` file spells them;
//! * the parameter structs: `#[repr(C)]` mirrors in `params.rs` of the structs in the `.cu`
//!   files.
//!
//! # Devices, streams and memory
//!
//! [`CudaBackend::get`] returns the process-wide backend of one device: its context, one
//! non-default stream on which every copy and kernel is queued in submission order, a cuBLAS
//! handle bound to that stream, and the device's [`BlockCache`] over [`CudaRaw`]
//! (`cuMemAlloc`/`cuMemFree`). Since all work of a backend runs on its one stream, a block freed
//! to the cache can be handed out again at once: later work on the stream runs after the work
//! already queued.
//!
//! Kernels take [`DevicePtr`]s, addresses of memory from the backend's cache, and sizes in
//! elements. The backend cannot see the extent of an address: every pointer passed to it must
//! point to a live allocation of this device holding at least the elements the call documents
//! (the graph crate guarantees this). Shapes, axes, masks and windows are checked and rejected
//! with [`CudaError::InvalidArgument`]; index tensors are checked on the device where the
//! extent they index is known (an index out of range reads NaN and adds nothing).
//!
//! Kernels and device-to-device copies return as soon as they are queued. A failure of queued
//! work (a fault inside a kernel) is reported by the next call that waits for the stream
//! ([`CudaBackend::synchronize`], [`CudaBackend::dtoh`]) or queues more work.

mod compile;
mod fused;
pub use compile::{compile_cubin, compile_kernels, kernel_source, versions, KernelImage};
pub use fused::DeviceMask;
mod ops;
mod params;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use arenagrad_alloc::block_cache::{
    BlockCache, CacheError, DevicePtr, RawAllocError, RawDeviceAlloc, StreamId,
};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    result as dr, sys as dsys, CudaContext, CudaEvent, CudaFunction, CudaStream, DeviceRepr,
    DriverError,
};

use crate::DType;
#[cfg(test)]
use compile::kernel_names;
use compile::load_kernels;
use params::{AttnParams, ReduceParams, Strided, Win, K, KERNEL_BASES};

/// Calls of `CudaBackend::init`, so a test can see that a failed start is not repeated.
#[cfg(test)]
pub(crate) static INIT_ATTEMPTS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// The most dimensions a strided kernel takes, after merging the dimensions that are contiguous
/// for every operand (`MAX_DIMS` in the kernels, defined from this value).
pub const MAX_DIMS: usize = crate::ops::CUDA_MAX_DIMS;

/// Errors of the CUDA backend.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No usable device: the driver library is missing, there is no device, or the ordinal is
    /// out of range.
    #[error("no CUDA device {ordinal}: {reason}")]
    NoCudaDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Why it is unusable.
        reason: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call {op} failed: {msg}")]
    Driver {
        /// The operation that failed.
        op: &'static str,
        /// The driver's message.
        msg: String,
    },
    /// cuBLAS is missing, refused the sizes, or failed.
    #[error("cuBLAS {op} failed: {msg}")]
    Blas {
        /// The operation that failed.
        op: &'static str,
        /// What went wrong.
        msg: String,
    },
    /// NVRTC is missing or the kernels did not compile.
    #[error("compiling the CUDA kernels failed: {log}")]
    Compile {
        /// NVRTC's log, or why NVRTC could not run.
        log: String,
    },
    /// A dtype the CUDA kernels do not take yet (the 16-bit dtypes run on the host).
    #[error("{op}: {dtype} tensors are not supported on CUDA devices yet")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The dtype refused.
        dtype: DType,
    },
    /// The block cache failed, e.g. the device is out of memory.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// A shape that, after merging contiguous dimensions, still has more than [`MAX_DIMS`].
    #[error("{op}: {dims} dimensions after merging contiguous ones; the kernels take at most {MAX_DIMS}")]
    TooManyDims {
        /// The operation.
        op: &'static str,
        /// Dimensions left after merging.
        dims: usize,
    },
    /// Shapes, axes or sizes that do not fit together (the CPU kernels' preconditions).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        msg: String,
    },
}

impl CudaError {
    fn driver(op: &'static str, e: DriverError) -> Self {
        CudaError::Driver {
            op,
            msg: e.to_string(),
        }
    }
}

fn drv(op: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::driver(op, e)
}

/// Whether the CUDA driver library (`libcuda`) can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its usual names and closes it again; loading
    // libcuda runs no initialisers with preconditions of ours.
    unsafe { dsys::is_culib_present() }
}

/// Whether NVRTC (`libnvrtc`) can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: as in `driver_present`, for libnvrtc.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether NCCL (`libnccl`) can be loaded.
#[cfg(feature = "nccl")]
pub fn nccl_present() -> bool {
    // SAFETY: as in `driver_present`, for libnccl.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// Whether cuBLAS (`libcublas`) can be loaded.
pub fn cublas_present() -> bool {
    // SAFETY: as in `driver_present`, for libcublas.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// The number of CUDA devices. [`CudaError::NoCudaDevice`] when the driver library is missing;
/// `Ok(0)` when the driver finds no device.
pub fn device_count() -> Result<usize, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoCudaDevice {
            ordinal: 0,
            reason: "the CUDA driver library (libcuda) could not be loaded".into(),
        });
    }
    match CudaContext::device_count() {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(DriverError(dsys::CUresult::CUDA_ERROR_NO_DEVICE)) => Ok(0),
        Err(e) => Err(CudaError::driver("cuInit/cuDeviceGetCount", e)),
    }
}

/// Device memory straight from the driver (`cuMemAlloc`/`cuMemFree`): the raw allocator under
/// a device's [`BlockCache`].
pub struct CudaRaw {
    ctx: Arc<CudaContext>,
    last_error: Option<String>,
}

impl CudaRaw {
    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The last failure of `cuMemFree` (which the [`RawDeviceAlloc`] interface cannot report);
    /// failures of `cuMemAlloc` go back to the cache as [`RawAllocError::Device`].
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }
}

impl fmt::Debug for CudaRaw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaRaw")
            .field("ordinal", &self.ctx.ordinal())
            .field("last_error", &self.last_error)
            .finish()
    }
}

impl RawDeviceAlloc for CudaRaw {
    fn malloc(&mut self, bytes: usize) -> Result<DevicePtr, RawAllocError> {
        if let Err(e) = self.ctx.bind_to_thread() {
            return Err(RawAllocError::Device(format!("cuCtxSetCurrent: {e}")));
        }
        // SAFETY: the device's context is current on this thread; the memory comes back
        // uninitialised, which is how the cache hands it out.
        match unsafe { dr::malloc_sync(bytes) } {
            Ok(ptr) => Ok(DevicePtr(ptr)),
            Err(DriverError(dsys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                Err(RawAllocError::OutOfMemory)
            }
            // A sticky fault (an illegal address from a kernel) and every other driver error
            // are reported as what they are, not as a lack of memory.
            Err(e) => Err(RawAllocError::Device(format!("cuMemAlloc({bytes}): {e}"))),
        }
    }

    fn free(&mut self, ptr: DevicePtr) {
        if let Err(e) = self.ctx.bind_to_thread() {
            self.last_error = Some(format!("cuCtxSetCurrent: {e}"));
            return;
        }
        // Work queued before the segment's blocks were freed may still use it.
        if let Err(e) = dr::ctx::synchronize() {
            self.last_error = Some(format!("cuCtxSynchronize: {e}"));
        }
        // SAFETY: the cache frees only addresses `malloc` returned, each once, and the context
        // was just synchronised, so no queued work uses the segment.
        if let Err(e) = unsafe { dr::free_sync(ptr.0) } {
            self.last_error = Some(format!("cuMemFree({ptr}): {e}"));
        }
    }
}

// SAFETY: `Strided`, `ReduceParams` and `Win` are `#[repr(C)]` structs of 64-bit integers only,
// laid out exactly as the structs of the same names in kernels.cu, which take them by value.
unsafe impl DeviceRepr for Strided {}
// SAFETY: see `Strided`.
unsafe impl DeviceRepr for ReduceParams {}
// SAFETY: see `Strided`.
unsafe impl DeviceRepr for Win {}
// SAFETY: `AttnParams` is a `#[repr(C)]` struct of 64-bit integers and doubles only, laid out
// exactly as `struct AttnParams` in fused.cu, which takes it by value.
unsafe impl DeviceRepr for AttnParams {}

/// A point on a backend's stream, for timing: [`CudaBackend::record_event`].
#[derive(Debug)]
pub struct CudaTimer {
    event: CudaEvent,
}

impl CudaTimer {
    /// Milliseconds from this event to `end` (waits for both).
    pub fn elapsed_ms(&self, end: &CudaTimer) -> Result<f32, CudaError> {
        self.event
            .elapsed_ms(&end.event)
            .map_err(drv("cuEventElapsedTime"))
    }

    /// Waits until the work queued before the event has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.event.synchronize().map_err(drv("cuEventSynchronize"))
    }
}

/// The [`StreamId`] under which a backend's blocks are cached (its one stream).
const STREAM: StreamId = StreamId(1);

/// One CUDA device: its context, one stream for all work, a cuBLAS handle bound to that stream,
/// the loaded kernels and the device's block cache. See the [module documentation](self).
pub struct CudaBackend {
    ordinal: usize,
    name: String,
    /// How the kernels were built for this device.
    image: KernelImage,
    sm_count: u64,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The cuBLAS handle, or why there is none (cuBLAS missing or failing to start).
    blas: Result<Mutex<CudaBlas>, String>,
    /// `[f32, f64]` instances of each kernel, indexed by `K as usize`.
    funcs: Vec<[CudaFunction; 2]>,
    cache: Mutex<BlockCache<CudaRaw>>,
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("kernels", &self.image)
            .finish_non_exhaustive()
    }
}

/// Launches kernel `$k` for `$dt` on the backend's stream with `$blocks` blocks of `BLOCK`
/// threads, passing the arguments in order. Every argument must have exactly the type of the
/// kernel's parameter in kernels.cu: `u64` for pointers, sizes and codes, `f64` for `double`,
/// or a parameter struct.
macro_rules! launch {
    ($be:expr, $k:expr, $dt:expr, $op:literal, $blocks:expr; $($arg:expr),+ $(,)?) => {{
        let be: &$crate::cuda::CudaBackend = $be;
        match be.func($k, $dt, $op) {
        Err(e) => Err(e),
        Ok(func) => {
        let mut builder = be.stream.launch_builder(func);
        $(
            let arg = $arg;
            ::cudarc::driver::PushKernelArg::arg(&mut builder, &arg);
        )+
        let cfg = ::cudarc::driver::LaunchConfig {
            grid_dim: ($blocks, 1, 1),
            block_dim: ($crate::cuda::params::BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's parameter list in kernels.cu in number,
        // order and type (see the call site); the device addresses among them are live
        // allocations of this device of at least the sizes passed alongside (the documented
        // contract of every public method), and each kernel reads and writes only within those
        // sizes.
        unsafe { builder.launch(cfg) }
            .map(drop)
            .map_err(|e| $crate::cuda::CudaError::driver($op, e))
        }
        }
    }};
}
pub(crate) use launch;

impl CudaBackend {
    /// The backend of device `ordinal`, created on first use and shared by the whole process.
    ///
    /// [`CudaError::NoCudaDevice`] when the driver library is missing, the driver finds no
    /// device, or `ordinal` is out of range; [`CudaError::Compile`] when NVRTC is missing or
    /// fails. A missing cuBLAS is reported by [`CudaBackend::gemm`] only. A failed start is
    /// remembered, as PyTorch's lazy initialisation does: later calls for that device return the
    /// same error at once instead of loading libraries and compiling kernels again.
    pub fn get(ordinal: usize) -> Result<Arc<CudaBackend>, CudaError> {
        type Started = Result<Arc<CudaBackend>, CudaError>;
        static BACKENDS: OnceLock<Mutex<HashMap<usize, Started>>> = OnceLock::new();
        let mut all = BACKENDS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let started = all
            .entry(ordinal)
            .or_insert_with(|| CudaBackend::init(ordinal).map(Arc::new));
        let be = started.clone()?;
        be.bind()?;
        Ok(be)
    }

    fn init(ordinal: usize) -> Result<CudaBackend, CudaError> {
        #[cfg(test)]
        INIT_ATTEMPTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let none = |reason: String| CudaError::NoCudaDevice { ordinal, reason };
        let n = match device_count() {
            Ok(n) => n,
            Err(CudaError::NoCudaDevice { reason, .. }) => return Err(none(reason)),
            Err(e) => return Err(none(e.to_string())),
        };
        if ordinal >= n {
            return Err(none(format!("the driver reports {n} device(s)")));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
        let name = ctx.name().map_err(drv("cuDeviceGetName"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute"))?;
        let sm_count = ctx
            .attribute(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("cuDeviceGetAttribute"))?;
        let (module, image) = load_kernels(&ctx, major, minor)?;
        let funcs = KERNEL_BASES
            .iter()
            .map(|base| {
                let load = |suffix: &str| {
                    module
                        .load_function(&format!("{base}_{suffix}"))
                        .map_err(drv("cuModuleGetFunction"))
                };
                Ok([load("f32")?, load("f64")?])
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let blas = if cublas_present() {
            CudaBlas::new(stream.clone())
                .map(Mutex::new)
                .map_err(|e| format!("cublasCreate: {e}"))
        } else {
            Err("the cuBLAS library (libcublas) could not be loaded".into())
        };
        let raw = CudaRaw {
            ctx: ctx.clone(),
            last_error: None,
        };
        Ok(CudaBackend {
            ordinal,
            name,
            image,
            sm_count: u64::try_from(sm_count).unwrap_or(1).max(1),
            ctx,
            stream,
            blas,
            funcs,
            cache: Mutex::new(BlockCache::new(raw)),
        })
    }

    /// Makes the device's context current on the calling thread.
    fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    fn func(&self, k: K, dt: DType, op: &'static str) -> Result<&CudaFunction, CudaError> {
        let at = match dt {
            DType::F32 => 0,
            DType::F64 => 1,
            dt => return Err(CudaError::Unsupported { op, dtype: dt }),
        };
        Ok(&self.funcs[k as usize][at])
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name, as the driver reports it.
    pub fn name(&self) -> String {
        self.name.clone()
    }

    /// How the kernels were built for this device (machine code, or PTX and why).
    pub fn kernel_image(&self) -> &KernelImage {
        &self.image
    }

    /// The device's block cache. Allocate on [`CudaBackend::stream_id`].
    pub fn cache(&self) -> MutexGuard<'_, BlockCache<CudaRaw>> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The [`StreamId`] to use for every block-cache call: the backend's one stream.
    pub fn stream_id(&self) -> StreamId {
        STREAM
    }

    /// The block cache's statistics under PyTorch's `torch.cuda.memory_stats()` names.
    pub fn memory_stats(&self) -> BTreeMap<String, u64> {
        self.cache().memory_stats()
    }

    /// Waits for the queued work, then returns every fully free cached segment to the device.
    /// Returns the bytes given back.
    pub fn empty_cache(&self) -> usize {
        // A failed wait is not fatal here: `CudaRaw::free` synchronises the context again
        // before each `cuMemFree`.
        let _ = self.synchronize();
        self.cache().empty_cache()
    }

    /// Waits until every piece of work queued on the backend's stream has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))
    }

    /// Records an event on the stream: the time at which the work queued so far finishes.
    pub fn record_event(&self) -> Result<CudaTimer, CudaError> {
        self.bind()?;
        let event = self
            .stream
            .record_event(Some(dsys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("cuEventRecord"))?;
        Ok(CudaTimer { event })
    }

    /// Copies `src` to the device at `dst` (room for `src.len()` elements), in stream order.
    ///
    /// Ordinary (pageable) host memory is staged by the driver before this returns, though the
    /// transfer to the device may still be running; page-locked memory is waited for. Either
    /// way `src` may be changed or dropped as soon as this returns.
    pub fn htod<T: crate::Storage>(&self, src: &[T], dst: DevicePtr) -> Result<(), CudaError> {
        self.upload(src, dst)
    }

    /// [`CudaBackend::htod`] for `u32` indices.
    pub fn htod_u32(&self, src: &[u32], dst: DevicePtr) -> Result<(), CudaError> {
        self.upload(src, dst)
    }

    fn upload<T>(&self, src: &[T], dst: DevicePtr) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` is a device allocation with room for `size_of_val(src)` bytes (the
        // documented contract) and `src` is a live slice. The driver reads pageable memory
        // before returning; page-locked memory is read later, so that case is waited for below.
        unsafe { dr::memcpy_htod_async(dst.0, src, self.stream.cu_stream()) }
            .map_err(drv("cuMemcpyHtoDAsync"))?;
        if is_page_locked(src.as_ptr().cast()) {
            self.synchronize()?;
        }
        Ok(())
    }

    /// Copies `dst.len()` elements from the device at `src` into `dst`, after the work queued
    /// before; waits for the copy.
    pub fn dtoh<T: crate::Storage>(&self, src: DevicePtr, dst: &mut [T]) -> Result<(), CudaError> {
        self.download(src, dst)
    }

    /// [`CudaBackend::dtoh`] for `u32` indices.
    pub fn dtoh_u32(&self, src: DevicePtr, dst: &mut [u32]) -> Result<(), CudaError> {
        self.download(src, dst)
    }

    fn download<T>(&self, src: DevicePtr, dst: &mut [T]) -> Result<(), CudaError> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `src` is a device allocation holding at least `dst.len()` elements (the
        // documented contract); `dst` is exclusively borrowed until the stream is synchronised
        // below, after which the driver no longer writes to it.
        unsafe { dr::memcpy_dtoh_async(dst, src.0, self.stream.cu_stream()) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        self.synchronize()
    }

    /// Copies `bytes` bytes from `src` to `dst` on the device, in stream order.
    pub fn dtod(&self, src: DevicePtr, dst: DevicePtr, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both addresses are device allocations of at least `bytes` bytes (the
        // documented contract); the copy is ordered on the stream like every other use.
        unsafe { dr::memcpy_dtod_async(dst.0, src.0, bytes, self.stream.cu_stream()) }
            .map_err(drv("cuMemcpyDtoDAsync"))
    }

    /// Row-major batched GEMM through cuBLAS (strided batched): for each `b < batch`,
    /// `C_b (m×n) = alpha·op(A_b)·op(B_b) + beta·C_b`, where `A_b` is stored row-major as `m×k`
    /// (`k×m` when `ta`: `op` transposes it), `B_b` as `k×n` (`n×k` when `tb`), and `C_b` as
    /// `m×n`. `A_b` starts `b·a_stride` elements after `a` (likewise B and C); a stride of 0
    /// reuses one matrix for every batch (not for C). Sizes beyond cuBLAS's 32-bit integers are
    /// [`CudaError::Blas`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        dt: DType,
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
        a: DevicePtr,
        a_stride: usize,
        ta: bool,
        b: DevicePtr,
        b_stride: usize,
        tb: bool,
        c: DevicePtr,
        c_stride: usize,
        alpha: f64,
        beta: f64,
    ) -> Result<(), CudaError> {
        use cudarc::cublas::{result as br, sys::cublasOperation_t as Op};
        if batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            // An empty sum: C = β·C. cuBLAS's batched calls do not reliably write C here, so
            // the product is done by hand: zeros for β = 0, else a scale in place.
            let elem = dt.size() as u64;
            for t in 0..batch {
                let ct = DevicePtr(c.0 + (t * c_stride) as u64 * elem);
                if beta == 0.0 {
                    self.fill(dt, ct, m * n, 0.0)?;
                } else if beta != 1.0 {
                    self.unary(dt, crate::UnaryOp::Scale(beta), ct, ct, m * n)?;
                }
                if c_stride == 0 {
                    break;
                }
            }
            return Ok(());
        }
        let p = params::gemm_plan(batch, m, n, k, a_stride, ta, b_stride, tb, c_stride)?;
        self.bind()?;
        let blas = self.blas.as_ref().map_err(|msg| CudaError::Blas {
            op: "cublasCreate",
            msg: msg.clone(),
        })?;
        let blas = blas.lock().unwrap_or_else(PoisonError::into_inner);
        let op = |t: bool| if t { Op::CUBLAS_OP_T } else { Op::CUBLAS_OP_N };
        let (handle, first, second) = (*blas.handle(), op(p.trans_first), op(p.trans_second));
        // One call shape for both element types; the row-major operands go in swapped
        // (C = A·B is Cᵀ = Bᵀ·Aᵀ in cuBLAS's column-major terms).
        macro_rules! strided_batched {
            ($f:path, $t:ty) => {{
                let (alpha, beta) = (alpha as $t, beta as $t);
                // SAFETY: the handle is bound to the backend's stream and used under its lock;
                // `a`, `b`, `c` are device allocations holding every element the plan's sizes,
                // leading dimensions and batch strides reach (the documented contract); alpha
                // and beta are host values, as the handle's default pointer mode expects.
                unsafe {
                    $f(
                        handle,
                        first,
                        second,
                        p.m,
                        p.n,
                        p.k,
                        &alpha,
                        b.0 as *const $t,
                        p.ld_first,
                        p.stride_first,
                        a.0 as *const $t,
                        p.ld_second,
                        p.stride_second,
                        &beta,
                        c.0 as *mut $t,
                        p.ldc,
                        p.stride_c,
                        p.batch,
                    )
                }
            }};
        }
        let result = match dt {
            DType::F32 => strided_batched!(br::sgemm_strided_batched, f32),
            DType::F64 => strided_batched!(br::dgemm_strided_batched, f64),
            _ => {
                return Err(CudaError::Unsupported {
                    op: "gemm_strided_batched",
                    dtype: dt,
                })
            }
        };
        result.map_err(|e| CudaError::Blas {
            op: "gemm_strided_batched",
            msg: format!("{e:?}"),
        })
    }
}

/// Whether `ptr` is page-locked host memory known to the driver (the copy from it is truly
/// asynchronous).
fn is_page_locked(ptr: *const std::ffi::c_void) -> bool {
    let mut kind = 0u32;
    // SAFETY: the query writes one `CUmemorytype` (a 32-bit enum) through a valid pointer; for
    // memory the driver does not know it returns an error and writes nothing.
    let r = unsafe {
        dsys::cuPointerGetAttribute(
            (&mut kind as *mut u32).cast(),
            dsys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr as u64,
        )
    };
    r == dsys::CUresult::CUDA_SUCCESS && kind == dsys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
}
