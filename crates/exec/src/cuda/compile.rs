//! Building the kernels: the CUDA C source ([`kernel_source`]), its compilation with NVRTC to
//! PTX ([`compile_kernels`]) or to machine code ([`compile_cubin`]), each cached once per
//! process and architecture, and the choice between the two for a device ([`load_kernels`]).
//!
//! Where the source comes from: `crate::ops::cuda_defines()` writes the numbers the kernels
//! share with Rust and the op tables' CUDA columns as `#define`s, then come `prelude.cu`,
//! `kernels.cu` and `fused.cu`. Which kernels the backend loads from the compiled module is the
//! list in `params.rs` (`params::K`).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{sys as dsys, CudaContext};
use cudarc::nvrtc::{CompileError, CompileOptions};

#[cfg(test)]
use super::params::KERNEL_BASES;
use super::{driver_present, nvrtc_present, CudaError};

/// The CUDA C source of the kernels: the definitions generated from Rust
/// ([`crate::ops::cuda_defines`]: the shared numbers, the op tables' codes and `switch` cases)
/// followed by `prelude.cu` (types, math, dropout's hash), `kernels.cu` and `fused.cu` (the
/// fused normalisations and attention).
pub fn kernel_source() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| {
        crate::ops::cuda_defines()
            + include_str!("prelude.cu")
            + include_str!("kernels.cu")
            + include_str!("fused.cu")
    })
}

/// The names of every kernel the backend loads.
#[cfg(test)]
pub(crate) fn kernel_names() -> Vec<String> {
    KERNEL_BASES
        .iter()
        .flat_map(|b| [format!("{b}_f32"), format!("{b}_f64")])
        .collect()
}

/// Compiles [`kernel_source`] with NVRTC for `arch` (e.g. `"compute_90"`; `None`: NVRTC's
/// default) and returns the PTX. Compiled once per process and architecture, then cached.
/// Needs NVRTC only, no device.
pub fn compile_kernels(arch: Option<&'static str>) -> Result<String, CudaError> {
    static PTX: Compiled<Option<&'static str>, String> = OnceLock::new();
    compiled_once(&PTX, arch, || compile_ptx(arch))
}

/// Compiled kernel images by architecture, one map per kind of image.
type Compiled<K, V> = OnceLock<Mutex<HashMap<K, V>>>;

/// The image for `key` from `cache`, compiled by `compile` the first time (under the lock, so
/// each architecture is compiled once per process); [`CudaError::Compile`] without NVRTC.
fn compiled_once<K: Eq + std::hash::Hash, V: Clone>(
    cache: &Compiled<K, V>,
    key: K,
    compile: impl FnOnce() -> Result<V, CudaError>,
) -> Result<V, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::Compile {
            log: "NVRTC (libnvrtc) could not be loaded".into(),
        });
    }
    let mut cache = cache
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(image) = cache.get(&key) {
        return Ok(image.clone());
    }
    let image = compile()?;
    cache.insert(key, image.clone());
    Ok(image)
}

/// [`compile_kernels`]' compilation itself.
fn compile_ptx(arch: Option<&'static str>) -> Result<String, CudaError> {
    let opts = CompileOptions {
        arch,
        // No contraction of a·b + c into one rounding: the results stay those of the CPU code.
        fmad: Some(false),
        name: Some("arenagrad_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(kernel_source(), opts).map_err(|e| {
        CudaError::Compile {
            log: match e {
                CompileError::CompileError { log, options, .. } => {
                    format!("{} (options {options:?})", log.to_string_lossy())
                }
                other => other.to_string(),
            },
        }
    })?;
    Ok(ptx.to_src())
}

/// Compiles [`kernel_source`] with NVRTC to machine code for `sm` (e.g. `"sm_90"`) and returns
/// the cubin (an ELF image the driver loads as it is). Compiled once per process and
/// architecture, then cached. Needs NVRTC only, no device.
pub fn compile_cubin(sm: &'static str) -> Result<Vec<u8>, CudaError> {
    static CUBIN: Compiled<&'static str, Vec<u8>> = OnceLock::new();
    compiled_once(&CUBIN, sm, || compile_sm(sm))
}

/// [`compile_cubin`]'s compilation itself: cudarc compiles only to PTX, so the program is
/// driven through NVRTC's own calls.
fn compile_sm(sm: &'static str) -> Result<Vec<u8>, CudaError> {
    use cudarc::nvrtc::{result as nr, sys as ns};
    let fail = |what: &str, e: &dyn fmt::Display| CudaError::Compile {
        log: format!("{what} ({sm}): {e}"),
    };
    let src = std::ffi::CString::new(kernel_source()).expect("invariant: no NUL in kernels.cu");
    let name = c"arenagrad_kernels.cu";
    let prog = nr::create_program(&src, Some(name)).map_err(|e| fail("nvrtcCreateProgram", &e))?;
    /// Destroys the program however compilation ends.
    struct Prog(ns::nvrtcProgram);
    impl Drop for Prog {
        fn drop(&mut self) {
            // SAFETY: the program came from `create_program` and is destroyed only here.
            let _ = unsafe { nr::destroy_program(self.0) };
        }
    }
    let prog = Prog(prog);
    // No contraction of a·b + c into one rounding, as for the PTX (see `compile_kernels`).
    let options = [format!("--gpu-architecture={sm}"), "--fmad=false".into()];
    // SAFETY: `prog` is a live program (destroyed only when `Prog` drops, after this).
    if let Err(e) = unsafe { nr::compile_program(prog.0, &options) } {
        // SAFETY: as above; the log is a NUL-terminated string NVRTC wrote for this program.
        let log = unsafe { nr::get_program_log(prog.0) }
            .map(|l| {
                // SAFETY: `get_program_log` returns the log with its terminating NUL.
                unsafe { std::ffi::CStr::from_ptr(l.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        return Err(fail(
            "nvrtcCompileProgram",
            &format!("{e:?}: {log} (options {options:?})"),
        ));
    }
    let mut size = 0usize;
    // SAFETY: a compiled live program; NVRTC writes one usize through a valid pointer.
    let r = unsafe { ns::nvrtcGetCUBINSize(prog.0, &mut size) };
    if r != ns::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(fail("nvrtcGetCUBINSize", &format!("{r:?}, {size} bytes")));
    }
    let mut bin = vec![0u8; size];
    // SAFETY: `bin` has room for the `size` bytes NVRTC just said the cubin takes.
    let r = unsafe { ns::nvrtcGetCUBIN(prog.0, bin.as_mut_ptr().cast()) };
    if r != ns::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail("nvrtcGetCUBIN", &format!("{r:?}")));
    }
    Ok(bin)
}

/// The NVRTC and driver versions found, for logs: e.g. `"NVRTC 13.2; driver CUDA 13.0"`, with
/// "not found" for a library that cannot be loaded.
pub fn versions() -> String {
    let nvrtc = if nvrtc_present() {
        let (mut major, mut minor) = (0i32, 0i32);
        // SAFETY: NVRTC can be loaded (checked just before); it writes two ints through valid
        // pointers.
        match unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) } {
            cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS => format!("NVRTC {major}.{minor}"),
            r => format!("NVRTC (version unknown: {r:?})"),
        }
    } else {
        "NVRTC not found".into()
    };
    let driver = if driver_present() {
        let mut v = 0i32;
        // SAFETY: the driver library can be loaded; cuDriverGetVersion needs no cuInit and
        // writes one int through a valid pointer.
        match unsafe { dsys::cuDriverGetVersion(&mut v) } {
            dsys::CUresult::CUDA_SUCCESS => {
                format!("driver CUDA {}.{}", v / 1000, (v % 1000) / 10)
            }
            r => format!("driver (version unknown: {r:?})"),
        }
    } else {
        "driver not found".into()
    };
    format!("{nvrtc}; {driver}")
}

/// How a device's kernels were built: machine code for its architecture, or PTX the driver
/// compiled at load time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelImage {
    /// A cubin for `sm_XY`.
    Cubin(&'static str),
    /// PTX for `compute_XY`, with why no cubin was used.
    Ptx(&'static str, String),
}

impl fmt::Display for KernelImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelImage::Cubin(sm) => write!(f, "{sm} machine code"),
            KernelImage::Ptx(arch, why) => write!(f, "{arch} PTX ({why})"),
        }
    }
}

/// A static name for an architecture (`"sm_90"`, `"compute_90"`), leaked once per value.
fn arch_name(prefix: &'static str, cc: i32) -> &'static str {
    static NAMES: OnceLock<Mutex<HashMap<(&'static str, i32), &'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    names
        .entry((prefix, cc))
        .or_insert_with(|| Box::leak(format!("{prefix}_{cc}").into_boxed_str()))
}

/// The device's kernels: a cubin for its own architecture when NVRTC supports it and it loads,
/// else PTX for the newest virtual architecture NVRTC supports that the device runs.
pub(super) fn load_kernels(
    ctx: &Arc<CudaContext>,
    major: i32,
    minor: i32,
) -> Result<(Arc<cudarc::driver::CudaModule>, KernelImage), CudaError> {
    let cc = major * 10 + minor;
    let archs = nvrtc_archs();
    let why = if archs.contains(&cc) {
        let sm = arch_name("sm", cc);
        match compile_cubin(sm) {
            Ok(bin) => match ctx.load_module(cudarc::nvrtc::Ptx::from_binary(bin)) {
                Ok(m) => return Ok((m, KernelImage::Cubin(sm))),
                Err(e) => format!("the {sm} cubin did not load: {e}"),
            },
            Err(e) => format!("no {sm} cubin: {e}"),
        }
    } else {
        format!("NVRTC cannot emit machine code for sm_{cc}")
    };
    let arch = arch_for(&archs, cc);
    let ptx = compile_kernels(Some(arch))?;
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
        .map_err(|e| CudaError::Driver {
            op: "cuModuleLoadData",
            msg: format!("{e} (kernels as {arch} PTX, since {why}; {})", versions()),
        })?;
    Ok((module, KernelImage::Ptx(arch, why)))
}

/// The newest virtual architecture among NVRTC's `archs` that a device of compute capability
/// `cc` (`10·major + minor`) runs, as `"compute_XY"` (`cc` itself when NVRTC cannot say).
pub(super) fn arch_for(archs: &[i32], cc: i32) -> &'static str {
    let best = archs
        .iter()
        .copied()
        .filter(|&a| a <= cc)
        .max()
        .unwrap_or(cc);
    arch_name("compute", best)
}

/// The architectures NVRTC supports (as `10·major + minor`), or none if it cannot say.
fn nvrtc_archs() -> Vec<i32> {
    use cudarc::nvrtc::sys::{nvrtcGetNumSupportedArchs, nvrtcGetSupportedArchs, nvrtcResult};
    let mut n = 0i32;
    // SAFETY: NVRTC can be loaded (checked just before, so the call does not panic); it writes
    // one int through a valid pointer.
    let ok = nvrtc_present()
        && unsafe { nvrtcGetNumSupportedArchs(&mut n) } == nvrtcResult::NVRTC_SUCCESS;
    if !ok || n <= 0 {
        return Vec::new();
    }
    let mut archs = vec![0i32; n as usize];
    // SAFETY: `archs` has room for the `n` ints NVRTC just said it would write.
    if unsafe { nvrtcGetSupportedArchs(archs.as_mut_ptr()) } != nvrtcResult::NVRTC_SUCCESS {
        return Vec::new();
    }
    archs
}
