//! Tests of the CUDA backend.
//!
//! Without a driver they check the typed errors, the NVRTC build of the kernels (when NVRTC can
//! be loaded) and the host-side parameter packing. With a device they compare every kernel with
//! the CPU kernel of the same name on random inputs: within 1e-5 (f32) or 1e-12 (f64), relative
//! to the larger of |expected|, 1 and, for sums, the sum of the magnitudes of the terms.

use std::sync::Arc;

use arenagrad_alloc::block_cache::{BlockHandle, DevicePtr};

use super::params::{self, GemmPlan};
use super::*;
use crate::cpu::{self, Operand, ReduceOp, Strided, Window};
use crate::layout::{broadcast_shapes, contiguous_strides};
use crate::testing;
use crate::{BinaryOp, DType, Float, UnaryOp};

// ---------------------------------------------------------------------------------------------
// Helpers.

/// xorshift64*: deterministic inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn vec<T: Float>(&mut self, n: usize, lo: f64, hi: f64) -> Vec<T> {
        (0..n).map(|_| T::from_f64(self.uniform(lo, hi))).collect()
    }
    /// Values from a small set, so that ties and equalities occur.
    fn discrete<T: Float>(&mut self, n: usize) -> Vec<T> {
        const SET: [f64; 5] = [-1.0, 0.0, 0.5, 1.0, 2.0];
        (0..n).map(|_| T::from_f64(SET[self.below(5)])).collect()
    }
}

fn tol<T: Float>() -> f64 {
    match T::DTYPE {
        DType::F32 => 1e-5,
        DType::F64 => 1e-12,
        // The CUDA kernels take no 16-bit or integer tensors yet.
        _ => 1e-2,
    }
}

fn assert_close<T: Float>(what: &str, got: &[T], want: &[T], scale: Option<&[T]>) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f64(), w.to_f64());
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g}, want NaN");
            continue;
        }
        if w.is_infinite() {
            assert_eq!(g, w, "{what}[{i}]");
            continue;
        }
        let s = scale.map_or(0.0, |s| s[i].to_f64().abs());
        let bound = tol::<T>() * w.abs().max(1.0).max(s);
        assert!(
            (g - w).abs() <= bound,
            "{what}[{i}] ({}): got {g}, want {w} (bound {bound:e})",
            T::DTYPE
        );
    }
}

/// The backend of device 0, or `None` (the skip reported, with its reason) on a machine without
/// one. Any other failure to start it fails the test.
fn gpu() -> Option<Arc<CudaBackend>> {
    match CudaBackend::get(0) {
        Ok(be) => Some(be),
        Err(CudaError::NoCudaDevice { reason, .. }) => {
            // A machine that promises a GPU must not pass by skipping.
            testing::skip_or_fail(
                testing::TEST_CUDA,
                format_args!("no CUDA device ({reason})"),
            );
            None
        }
        Err(e) => panic!("a CUDA driver is present but the backend failed to start: {e}"),
    }
}

/// A block of the backend's cache, freed on drop.
struct Dev<'a> {
    be: &'a CudaBackend,
    h: BlockHandle,
}

impl Dev<'_> {
    fn ptr(&self) -> DevicePtr {
        self.h.ptr
    }
}

impl Drop for Dev<'_> {
    fn drop(&mut self) {
        self.be.cache().free(self.h).unwrap();
    }
}

fn alloc(be: &CudaBackend, bytes: usize) -> Dev<'_> {
    let h = be.cache().alloc(bytes, be.stream_id()).unwrap();
    Dev { be, h }
}

fn up<'a, T: Float>(be: &'a CudaBackend, data: &[T]) -> Dev<'a> {
    let d = alloc(be, std::mem::size_of_val(data));
    be.htod(data, d.ptr()).unwrap();
    d
}

fn up_u32<'a>(be: &'a CudaBackend, data: &[u32]) -> Dev<'a> {
    let d = alloc(be, std::mem::size_of_val(data));
    be.htod_u32(data, d.ptr()).unwrap();
    d
}

fn zeros<T: Float>(be: &CudaBackend, n: usize) -> Dev<'_> {
    let d = alloc(be, n * T::DTYPE.size());
    be.fill(T::DTYPE, d.ptr(), n, 0.0).unwrap();
    d
}

fn down<T: Float>(be: &CudaBackend, d: &Dev<'_>, n: usize) -> Vec<T> {
    let mut v = vec![T::ZERO; n];
    be.dtoh(d.ptr(), &mut v).unwrap();
    v
}

fn down_u32(be: &CudaBackend, d: &Dev<'_>, n: usize) -> Vec<u32> {
    let mut v = vec![0u32; n];
    be.dtoh_u32(d.ptr(), &mut v).unwrap();
    v
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn abs<T: Float>(v: &[T]) -> Vec<T> {
    v.iter().map(|x| x.abs()).collect()
}

// ---------------------------------------------------------------------------------------------
// Without a device.

#[test]
#[cfg_attr(miri, ignore)]
fn missing_driver_is_a_typed_error_and_a_device_works() {
    if !driver_present() {
        assert!(
            matches!(
                device_count(),
                Err(CudaError::NoCudaDevice { ordinal: 0, .. })
            ),
            "{:?}",
            device_count()
        );
        assert!(matches!(
            CudaBackend::get(0),
            Err(CudaError::NoCudaDevice { ordinal: 0, .. })
        ));
        assert!(matches!(
            CudaBackend::get(3),
            Err(CudaError::NoCudaDevice { ordinal: 3, .. })
        ));
        // The failed start is remembered: asking again does not try again.
        let tried = INIT_ATTEMPTS.load(std::sync::atomic::Ordering::Relaxed);
        for _ in 0..3 {
            assert!(CudaBackend::get(3).is_err());
        }
        assert_eq!(
            INIT_ATTEMPTS.load(std::sync::atomic::Ordering::Relaxed),
            tried,
            "a failed start is not repeated"
        );
        return;
    }
    let n = match device_count() {
        Ok(n) => n,
        Err(e) => {
            // The library loads but the driver cannot start (e.g. a stub library): the backend
            // reports the device as unusable.
            assert!(
                matches!(CudaBackend::get(0), Err(CudaError::NoCudaDevice { .. })),
                "{e}"
            );
            return;
        }
    };
    assert!(matches!(
        CudaBackend::get(n),
        Err(CudaError::NoCudaDevice { .. })
    ));
    if n == 0 {
        assert!(matches!(
            CudaBackend::get(0),
            Err(CudaError::NoCudaDevice { .. })
        ));
        return;
    }
    let be = CudaBackend::get(0).unwrap();
    assert!(
        Arc::ptr_eq(&be, &CudaBackend::get(0).unwrap()),
        "one backend per device"
    );
    assert_eq!(be.ordinal(), 0);
    assert!(!be.name().is_empty());
    let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.01 - 5.0).collect();
    let dx = up(&be, &x);
    let dy = alloc(&be, 4000);
    be.unary(DType::F32, UnaryOp::Neg, dx.ptr(), dy.ptr(), 1000)
        .unwrap();
    let y: Vec<f32> = down(&be, &dy, 1000);
    assert!(y.iter().zip(&x).all(|(a, b)| *a == -*b));
    // Other tests share the backend, so only a lower bound is certain.
    assert!(be.memory_stats()["allocated_bytes.all.current"] >= 8000);
    drop((dx, dy));
    be.synchronize().unwrap();
}

/// The kernels `source` defines: `<base>_f32` and `<base>_f64` for each `BOTH(base, ...)` entry
/// point, and any `extern "C" __global__` function written out by hand.
fn defined_kernels(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in source.lines().map(str::trim_start) {
        if let Some(rest) = line.strip_prefix("BOTH(") {
            let base = rest.split(',').next().unwrap_or_default().trim();
            names.extend([format!("{base}_f32"), format!("{base}_f64")]);
        } else if let Some(rest) = line.split("__global__ void ").nth(1) {
            let name: String = rest
                .chars()
                .take_while(|&c| c.is_ascii_alphanumeric() || c == '_' || c == '#')
                .collect();
            // The two functions of the `BOTH` macro itself.
            if !name.starts_with("NAME##") {
                names.push(name);
            }
        }
    }
    names
}

/// The kernel list of `params.rs` ([`params::K`], [`KERNEL_BASES`]) and the CUDA source agree:
/// every listed kernel is defined for both types, and the source defines no kernel the list
/// lacks (one the backend would never load). Needs no NVRTC: the source is read as text.
#[test]
fn the_kernel_list_is_what_the_source_defines() {
    let defined = defined_kernels(kernel_source());
    let listed = kernel_names();
    for name in &listed {
        assert!(
            defined.contains(name),
            "params.rs lists kernel {name}, which the CUDA source does not define"
        );
    }
    for name in &defined {
        assert!(
            listed.contains(name),
            "the CUDA source defines kernel {name}, which params.rs does not list"
        );
    }
    assert_eq!(
        defined.len(),
        listed.len(),
        "a kernel defined twice: {defined:?}"
    );
    assert_eq!(params::K::ALL.len(), KERNEL_BASES.len());
    for (i, &k) in params::K::ALL.iter().enumerate() {
        assert_eq!(k as usize, i, "{k:?}");
        assert_eq!(KERNEL_BASES[i], k.base(), "{k:?}");
        // The variant is the base name in camel case (`AttnDkdv` for `attn_dkdv`).
        let camel: String = k
            .base()
            .split('_')
            .map(|w| w[..1].to_uppercase() + &w[1..])
            .collect();
        assert_eq!(format!("{k:?}"), camel, "kernel {}", k.base());
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn kernels_compile_with_nvrtc() {
    if !nvrtc_present() {
        testing::skip_or_fail(
            testing::TEST_NVRTC,
            "NVRTC (libnvrtc) cannot be loaded; set LD_LIBRARY_PATH to its folder",
        );
        assert!(matches!(
            compile_kernels(None),
            Err(CudaError::Compile { .. })
        ));
        return;
    }
    // NVRTC's default architecture (below sm_60 in CUDA 12: no native f64 atomicAdd) and one
    // with it that CUDA 11 to 13 all support.
    for arch in [None, Some("compute_75")] {
        let ptx = compile_kernels(arch).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
        for name in kernel_names() {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{arch:?}: the PTX lacks kernel {name}"
            );
        }
        assert_eq!(compile_kernels(arch).unwrap(), ptx, "cached");
    }
    // Machine code for the H100/H200's architecture: an ELF image holding every kernel, which
    // a driver of any NVRTC's age loads (no PTX ISA version to outrun it).
    eprintln!("{}", versions());
    let bin = compile_cubin("sm_90").unwrap_or_else(|e| panic!("sm_90: {e}"));
    assert_eq!(&bin[..4], b"\x7fELF", "a cubin is an ELF image");
    for name in kernel_names() {
        let sym = format!("{name}\0");
        assert!(
            bin.windows(sym.len()).any(|w| w == sym.as_bytes()),
            "the sm_90 cubin lacks kernel {name}"
        );
    }
    assert_eq!(compile_cubin("sm_90").unwrap(), bin, "cached");
    assert!(matches!(
        compile_cubin("sm_1"),
        Err(CudaError::Compile { .. })
    ));
}

#[test]
#[cfg_attr(miri, ignore)]
fn strided_params_merge_contiguous_dims() {
    let shape = [2, 3, 4, 5];
    let c = contiguous_strides(&shape);
    let p = params::strided("t", &shape, [&c[..], &c[..]]).unwrap();
    assert_eq!(p.rank, 1);
    assert_eq!(p.shape[0], 120);
    assert_eq!(p.st[0][0], 1);
    assert_eq!(p.st[2][0], 0, "operands past N get zero strides");
    // Broadcast of a [3, 1] against [2, 3, 4]: dims 0 and 2 stay apart.
    let b = crate::layout::broadcast_strides(&[3, 1], &[2, 3, 4]);
    let o = contiguous_strides(&[2, 3, 4]);
    let p = params::strided("t", &[2, 3, 4], [&o[..], &b[..]]).unwrap();
    assert_eq!(p.rank, 3);
    assert_eq!(&p.st[1][..3], &[0, 1, 0]);
    // Eleven alternating broadcast dimensions cannot merge.
    let a: Vec<usize> = (0..11).map(|i| if i % 2 == 0 { 2 } else { 1 }).collect();
    let bb: Vec<usize> = (0..11).map(|i| if i % 2 == 0 { 1 } else { 2 }).collect();
    let out = vec![2; 11];
    let sa = crate::layout::broadcast_strides(&a, &out);
    let sb = crate::layout::broadcast_strides(&bb, &out);
    let so = contiguous_strides(&out);
    assert!(matches!(
        params::strided("binary", &out, [&so[..], &sa[..], &sb[..]]),
        Err(CudaError::TooManyDims {
            op: "binary",
            dims: 11
        })
    ));
    assert!(params::check_broadcast("t", &[3, 1], &[2, 3, 4]).is_ok());
    assert!(params::check_broadcast("t", &[2, 4], &[2, 3, 4]).is_err());
    assert!(params::check_broadcast("t", &[1, 2, 3, 4], &[2, 3, 4]).is_err());
}

#[test]
#[cfg_attr(miri, ignore)]
fn reduce_params_split_kept_and_reduced_axes() {
    let p = params::reduce_params("r", &[2, 3, 4, 5], &[false, true, true, false]).unwrap();
    assert_eq!((p.n_out, p.n_red), (10, 12));
    assert_eq!(p.kept_rank, 2);
    assert_eq!(&p.kept_shape[..2], &[2, 5]);
    assert_eq!(&p.kept_stride[..2], &[60, 1]);
    assert_eq!(p.red_rank, 1, "axes 1 and 2 are contiguous");
    assert_eq!((p.red_shape[0], p.red_stride[0]), (12, 5));
    let p = params::reduce_params("r", &[3, 0], &[false, true]).unwrap();
    assert_eq!((p.n_out, p.n_red), (3, 0));
    assert!(matches!(
        params::reduce_params("r", &[3, 4], &[true]),
        Err(CudaError::InvalidArgument { .. })
    ));
}

#[test]
#[cfg_attr(miri, ignore)]
fn windows_are_checked() {
    let win = Window {
        c: 1,
        h: 4,
        w: 4,
        kh: 2,
        kw: 2,
        sh: 2,
        sw: 2,
        ph: 0,
        pw: 0,
        dh: 1,
        dw: 1,
    };
    let (w, cols) = params::window("t", 3, &win).unwrap();
    assert_eq!((w.ho, w.wo, cols), (2, 2, 3 * 4 * 4));
    assert!(params::window("t", 1, &Window { kh: 5, ..win }).is_err());
    assert!(params::every_window_touches_input(4, 2, 2, 0, 1, 2));
    // A 1-tap window with padding 1: the first and last outputs lie wholly in the padding.
    assert!(!params::every_window_touches_input(4, 1, 1, 1, 1, 6));
}

/// cuBLAS's column-major strided-batched GEMM, written out.
fn colmajor_gemm(
    p: &GemmPlan,
    first: &[f64],
    second: &[f64],
    c: &mut [f64],
    alpha: f64,
    beta: f64,
) {
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    for bi in 0..p.batch as usize {
        let f0 = bi * p.stride_first as usize;
        let s0 = bi * p.stride_second as usize;
        let c0 = bi * p.stride_c as usize;
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                for l in 0..k {
                    // op(first)[i, l] and op(second)[l, j], column-major.
                    let f = if p.trans_first {
                        first[f0 + l + i * p.ld_first as usize]
                    } else {
                        first[f0 + i + l * p.ld_first as usize]
                    };
                    let s = if p.trans_second {
                        second[s0 + j + l * p.ld_second as usize]
                    } else {
                        second[s0 + l + j * p.ld_second as usize]
                    };
                    acc += f * s;
                }
                let at = c0 + i + j * p.ldc as usize;
                c[at] = alpha * acc + beta * c[at];
            }
        }
    }
}

/// Row-major reference: C_b = alpha·op(A_b)·op(B_b) + beta·C_b.
// Every operand of `gemm_plan`'s product spelled out, as an independent reference.
#[allow(clippy::too_many_arguments)]
fn rowmajor_gemm(
    batch: usize,
    (m, n, k): (usize, usize, usize),
    a: &[f64],
    a_stride: usize,
    ta: bool,
    b: &[f64],
    b_stride: usize,
    tb: bool,
    c: &mut [f64],
    alpha: f64,
    beta: f64,
) {
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                for l in 0..k {
                    let av = if ta {
                        a[bi * a_stride + l * m + i]
                    } else {
                        a[bi * a_stride + i * k + l]
                    };
                    let bv = if tb {
                        b[bi * b_stride + j * k + l]
                    } else {
                        b[bi * b_stride + l * n + j]
                    };
                    acc += av * bv;
                }
                let at = bi * m * n + i * n + j;
                c[at] = alpha * acc + beta * c[at];
            }
        }
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn gemm_plan_is_the_row_major_product() {
    let mut rng = Rng::new(7);
    let (batch, m, n, k) = (3, 4, 5, 6);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        for (a_stride, b_stride) in [(m * k, k * n), (0, k * n), (m * k, 0)] {
            let a: Vec<f64> = rng.vec(m * k * batch, -1.0, 1.0);
            let b: Vec<f64> = rng.vec(k * n * batch, -1.0, 1.0);
            let c0: Vec<f64> = rng.vec(m * n * batch, -1.0, 1.0);
            let p = params::gemm_plan(batch, m, n, k, a_stride, ta, b_stride, tb, m * n).unwrap();
            let mut got = c0.clone();
            colmajor_gemm(&p, &b, &a, &mut got, 1.5, 0.5);
            let mut want = c0.clone();
            rowmajor_gemm(
                batch,
                (m, n, k),
                &a,
                a_stride,
                ta,
                &b,
                b_stride,
                tb,
                &mut want,
                1.5,
                0.5,
            );
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-12, "ta {ta} tb {tb}: {g} vs {w}");
            }
        }
    }
    assert!(matches!(
        params::gemm_plan(1, 1 << 31, 1, 1, 0, false, 0, false, 0),
        Err(CudaError::Blas { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// On a device: every kernel against its CPU counterpart, in f32 and f64.

fn unary_inputs<T: Float>(rng: &mut Rng, op: UnaryOp, n: usize) -> Vec<T> {
    let mut x: Vec<T> = match op {
        _ if op.domain() == crate::Domain::Positive => rng.vec(n, 0.05, 4.0),
        // Both tails, and softplus's threshold at 20.
        UnaryOp::Exp | UnaryOp::Sigmoid | UnaryOp::Softplus => rng.vec(n, -30.0, 30.0),
        _ => rng.vec(n, -4.0, 4.0),
    };
    // Exact zeros exercise the branches of sign, step and relu.
    for v in x.iter_mut().step_by(17) {
        *v = T::ZERO;
    }
    if op.domain() == crate::Domain::Positive {
        for v in x.iter_mut().step_by(17) {
            *v = T::ONE;
        }
    }
    x
}

fn check_unary<T: Float>(be: &CudaBackend) {
    let mut rng = Rng::new(1);
    let n = 3001;
    for &op in UnaryOp::SAMPLES {
        let x: Vec<T> = unary_inputs(&mut rng, op, n);
        let mut want = vec![T::ZERO; n];
        cpu::unary(op, &x, &mut want, 1);
        let dx = up(be, &x);
        let dout = alloc(be, n * T::DTYPE.size());
        be.unary(T::DTYPE, op, dx.ptr(), dout.ptr(), n).unwrap();
        assert_close(
            &format!("unary {op:?}"),
            &down::<T>(be, &dout, n),
            &want,
            None,
        );
        // In place.
        be.unary(T::DTYPE, op, dx.ptr(), dx.ptr(), n).unwrap();
        assert_close(
            &format!("unary {op:?} in place"),
            &down::<T>(be, &dx, n),
            &want,
            None,
        );
    }
}

fn check_unary_grad<T: Float>(be: &CudaBackend) {
    let mut rng = Rng::new(2);
    let n = 2003;
    for &op in UnaryOp::SAMPLES {
        let x: Vec<T> = unary_inputs(&mut rng, op, n);
        let mut y = vec![T::ZERO; n];
        cpu::unary(op, &x, &mut y, 1);
        let gy: Vec<T> = rng.vec(n, -2.0, 2.0);
        let (dx, dy, dg) = (up(be, &x), up(be, &y), up(be, &gy));
        let dout = alloc(be, n * T::DTYPE.size());
        be.unary_grad(T::DTYPE, op, (dx.ptr(), dy.ptr()), dg.ptr(), dout.ptr(), n)
            .unwrap();
        let mut want = vec![T::ZERO; n];
        cpu::unary_grad(op, &x, &y, &gy, &mut want, 1);
        assert_close(
            &format!("unary_grad {op:?}"),
            &down::<T>(be, &dout, n),
            &want,
            None,
        );
    }
}

const SHAPE_PAIRS: [(&[usize], &[usize]); 8] = [
    (&[2, 3, 4], &[2, 3, 4]),
    (&[2, 3, 4], &[4]),
    (&[4], &[2, 3, 4]),
    (&[3, 1], &[1, 4]),
    (&[2, 1, 4], &[3, 1]),
    (&[], &[2, 3]),
    (&[5, 1, 1, 3], &[1, 6, 2, 1]),
    (&[2, 1, 2, 1, 2, 1, 2, 1, 2], &[1, 2, 1, 2, 1, 2, 1, 2, 1]),
];

fn check_binary<T: Float>(be: &CudaBackend) {
    let mut rng = Rng::new(3);
    for (ash, bsh) in SHAPE_PAIRS {
        let osh = broadcast_shapes(ash, bsh).unwrap();
        let (na, nb, no) = (numel(ash), numel(bsh), numel(&osh));
        for &op in BinaryOp::KINDS {
            let (a, b): (Vec<T>, Vec<T>) = match op {
                BinaryOp::Pow => (rng.vec(na, 0.1, 3.0), rng.vec(nb, -2.0, 2.0)),
                BinaryOp::GtMask | BinaryOp::EqMask | BinaryOp::Maximum | BinaryOp::Minimum => {
                    (rng.discrete(na), rng.discrete(nb))
                }
                BinaryOp::Div => (rng.vec(na, -3.0, 3.0), rng.vec(nb, 0.5, 3.0)),
                _ => (rng.vec(na, -3.0, 3.0), rng.vec(nb, -3.0, 3.0)),
            };
            let mut want = vec![T::ZERO; no];
            cpu::binary(
                op,
                Operand::new(&a, ash),
                Operand::new(&b, bsh),
                Operand::new(&mut want, &osh),
                1,
            );
            let (da, db) = (up(be, &a), up(be, &b));
            let dout = alloc(be, no * T::DTYPE.size());
            let r = be.binary(
                T::DTYPE,
                op,
                Operand::new(da.ptr(), ash),
                Operand::new(db.ptr(), bsh),
                Operand::new(dout.ptr(), &osh),
            );
            if osh.len() > MAX_DIMS && ash.len() == 9 {
                // Nine alternating broadcast dimensions do not merge.
                assert!(matches!(r, Err(CudaError::TooManyDims { .. })));
                continue;
            }
            r.unwrap();
            let what = format!("binary {op:?} {ash:?} {bsh:?}");
            assert_close(&what, &down::<T>(be, &dout, no), &want, None);
        }
    }
    // NaN propagation of maximum/minimum.
    let a = [T::from_f64(f64::NAN), T::ONE, T::ZERO];
    let b = [T::ONE, T::from_f64(f64::NAN), T::ZERO];
    for op in [BinaryOp::Maximum, BinaryOp::Minimum, BinaryOp::GtMask] {
        let mut want = [T::ZERO; 3];
        cpu::binary(
            op,
            Operand::new(&a, &[3]),
            Operand::new(&b, &[3]),
            Operand::new(&mut want, &[3]),
            1,
        );
        let (da, db, dout) = (up(be, &a), up(be, &b), alloc(be, 3 * T::DTYPE.size()));
        be.binary(
            T::DTYPE,
            op,
            Operand::new(da.ptr(), &[3]),
            Operand::new(db.ptr(), &[3]),
            Operand::new(dout.ptr(), &[3]),
        )
        .unwrap();
        assert_close(
            &format!("{op:?} NaN"),
            &down::<T>(be, &dout, 3),
            &want,
            None,
        );
    }
    let (da, db) = (up(be, &a), up(be, &b));
    let r = be.binary(
        T::DTYPE,
        BinaryOp::Add,
        Operand::new(da.ptr(), &[3]),
        Operand::new(db.ptr(), &[2]),
        Operand::new(da.ptr(), &[3]),
    );
    assert!(matches!(r, Err(CudaError::InvalidArgument { .. })));
}

fn check_select<T: Float>(be: &CudaBackend) {
    let mut rng = Rng::new(4);
    let cases: [(&[usize], &[usize], &[usize]); 3] = [
        (&[2, 3, 4], &[2, 3, 4], &[2, 3, 4]),
        (&[3, 1], &[2, 1, 4], &[4]),
        (&[], &[3, 2], &[1, 2]),
    ];
    for (csh, ash, bsh) in cases {
        let osh = broadcast_shapes(&broadcast_shapes(csh, ash).unwrap(), bsh).unwrap();
        let mut cond: Vec<T> = rng.discrete(numel(csh));
        if let Some(c) = cond.first_mut() {
            *c = T::from_f64(f64::NAN);
        }
        let a: Vec<T> = rng.vec(numel(ash), -1.0, 1.0);
        let b: Vec<T> = rng.vec(numel(bsh), -1.0, 1.0);
        let no = numel(&osh);
        let mut want = vec![T::ZERO; no];
        cpu::select(
            Operand::new(&cond, csh),
            Operand::new(&a, ash),
            Operand::new(&b, bsh),
            Operand::new(&mut want, &osh),
        );
        let (dc, da, db) = (up(be, &cond), up(be, &a), up(be, &b));
        let dout = alloc(be, no * T::DTYPE.size());
        be.select(
            T::DTYPE,
            Operand::new(dc.ptr(), csh),
            Operand::new(da.ptr(), ash),
            Operand::new(db.ptr(), bsh),
            Operand::new(dout.ptr(), &osh),
        )
        .unwrap();
        assert_close("select", &down::<T>(be, &dout, no), &want, None);
    }
}

fn check_copy_strided<T: Float>(be: &CudaBackend) {
    let mut rng = Rng::new(5);
    // A [3, 4, 5] tensor permuted to [5, 3, 4] (read strided, written contiguously) at offsets,
    // and a row broadcast (source stride 0).
    let x: Vec<T> = rng.vec(3 * 4 * 5 + 7, -1.0, 1.0);
    let dx = up(be, &x);
    let shape = [5, 3, 4];
    let src_strides = [1, 20, 5];
    let dst_strides = [12, 4, 1];
    let dout = zeros::<T>(be, 60 + 2);
    be.copy_strided(
        T::DTYPE,
        &shape,
        Strided::new(dx.ptr(), 7, &src_strides),
        Strided::new(dout.ptr(), 2, &dst_strides),
    )
    .unwrap();
    let got: Vec<T> = down(be, &dout, 62);
    let mut want = vec![T::ZERO; 62];
    for i in 0..5 {
        for j in 0..3 {
            for k in 0..4 {
                want[2 + i * 12 + j * 4 + k] = x[7 + i + j * 20 + k * 5];
            }
        }
    }
    assert_close("copy_strided permute", &got, &want, None);
    let drow = zeros::<T>(be, 12);
    be.copy_strided(
        T::DTYPE,
        &[3, 4],
        Strided::new(dx.ptr(), 0, &[0, 1]),
        Strided::new(drow.ptr(), 0, &[4, 1]),
    )
    .unwrap();
    let got: Vec<T> = down(be, &drow, 12);
    let want: Vec<T> = (0..12).map(|i| x[i % 4]).collect();
    assert_close("copy_strided broadcast", &got, &want, None);
}

fn check_reduce<T: Float>(be: &CudaBackend) {
    let mut rng = Rng::new(6);
    let cases: [(&[usize], &[bool]); 10] = [
        (&[3, 5, 7, 2], &[false, true, false, true]),
        (&[3, 5, 7, 2], &[true, false, true, false]),
        (&[3, 5, 7, 2], &[true, true, true, true]),
        (&[3, 5, 7, 2], &[false, false, false, false]),
        (&[4, 300], &[false, true]),
        (&[300, 4], &[true, false]),
        (&[2, 50_000], &[false, true]),
        (&[1, 300_001], &[false, true]),
        (&[600, 1000], &[false, true]),
        (&[3, 0], &[false, true]),
    ];
    for (shape, mask) in cases {
        let x: Vec<T> = rng.vec(numel(shape), -1.0, 1.0);
        let n_out: usize = shape
            .iter()
            .zip(mask)
            .map(|(&d, &r)| if r { 1 } else { d })
            .product();
        let dx = up(be, &x);
        let dout = alloc(be, n_out.max(1) * T::DTYPE.size());
        // Every row of the reduction table (a new row is checked here without more code).
        for &op in ReduceOp::KINDS {
            let mut want = vec![T::ZERO; n_out];
            cpu::reduce(op, &x, shape, mask, &mut want);
            let mut scale = vec![T::ZERO; n_out];
            cpu::reduce(ReduceOp::Sum, &abs(&x), shape, mask, &mut scale);
            be.reduce(T::DTYPE, op, dx.ptr(), shape, mask, dout.ptr())
                .unwrap();
            let what = format!("reduce {op:?} {shape:?} {mask:?}");
            assert_close(&what, &down::<T>(be, &dout, n_out), &want, Some(&scale));
        }
    }
    // Max propagates NaN wherever it sits.
    let mut x: Vec<T> = rng.vec(2 * 1000, -1.0, 1.0);
    x[777] = T::from_f64(f64::NAN);
    let dx = up(be, &x);
    let dout = alloc(be, 2 * T::DTYPE.size());
    be.reduce(
        T::DTYPE,
        ReduceOp::Max,
        dx.ptr(),
        &[2, 1000],
        &[false, true],
        dout.ptr(),
    )
    .unwrap();
    let got: Vec<T> = down(be, &dout, 2);
    assert!(got[0].to_f64().is_nan() && !got[1].to_f64().is_nan());
}

fn check_softmax<T: Float>(be: &CudaBackend) {
    let mut rng = Rng::new(8);
    let cases: [(&[usize], usize); 5] = [
        (&[4, 7], 1),
        (&[3, 5, 6], 1),
        (&[2, 300], 1),
        (&[300, 3], 0),
        (&[2, 3, 4], 2),
    ];
    for (shape, axis) in cases {
        let n = numel(shape);
        let mut x: Vec<T> = rng.vec(n, -5.0, 5.0);
        // A row of large values (stability) and, along the last axis, a row of -inf.
        let (outer, len, inner) = cpu::reduce::around_axis(shape, axis);
        for j in 0..len {
            x[j * inner] = T::from_f64(1000.0 + j as f64);
            if outer > 1 && inner == 1 {
                x[len * inner + j] = T::neg_infinity();
            }
        }
        let dx = up(be, &x);
        let dout = alloc(be, n * T::DTYPE.size());
        for log in [false, true] {
            let mut want = vec![T::ZERO; n];
            cpu::softmax(&x, shape, axis, log, &mut want);
            be.softmax(
                T::DTYPE,
                Operand::new(dx.ptr(), shape),
                axis,
                log,
                dout.ptr(),
            )
            .unwrap();
            let what = format!("softmax log={log} {shape:?} axis {axis}");
            // log-softmax is x - log Σ e^x: the rounding of a large x bounds the error.
            let scale = if log { abs(&x) } else { vec![T::ZERO; n] };
            assert_close(&what, &down::<T>(be, &dout, n), &want, Some(&scale));

            let mut y = vec![T::ZERO; n];
            cpu::softmax(&rng.vec::<T>(n, -2.0, 2.0), shape, axis, log, &mut y);
            let g: Vec<T> = rng.vec(n, -1.0, 1.0);
            let mut want = vec![T::ZERO; n];
            cpu::softmax_grad(&y, &g, shape, axis, log, &mut want);
            let (dy, dg) = (up(be, &y), up(be, &g));
            be.softmax_grad(
                T::DTYPE,
                Operand::new(dy.ptr(), shape),
                dg.ptr(),
                axis,
                log,
                dout.ptr(),
            )
            .unwrap();
            let what = format!("softmax_grad log={log} {shape:?} axis {axis}");
            // The sums along the axis bound the error.
            let scale = vec![T::from_f64(len as f64); n];
            assert_close(&what, &down::<T>(be, &dout, n), &want, Some(&scale));
        }
    }
    let dx = zeros::<T>(be, 4);
    let r = be.softmax(
        T::DTYPE,
        Operand::new(dx.ptr(), &[2, 2]),
        2,
        false,
        dx.ptr(),
    );
    assert!(matches!(r, Err(CudaError::InvalidArgument { .. })));
}

fn check_indexing<T: Float>(be: &CudaBackend) {
    let mut rng = Rng::new(9);
    // index_select / index_add over x [3, 5, 4] along axis 1, with a repeated index.
    let (outer, ext, inner) = (3, 5, 4);
    let x: Vec<T> = rng.vec(outer * ext * inner, -1.0, 1.0);
    let idx = [4usize, 0, 4, 2];
    let idx32: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
    let (dx, didx) = (up(be, &x), up_u32(be, &idx32));
    let n_sel = outer * idx.len() * inner;
    let mut want = vec![T::ZERO; n_sel];
    cpu::index_select(&x, &[outer, ext, inner], 1, &idx, &mut want);
    let dsel = alloc(be, n_sel * T::DTYPE.size());
    be.index_select(
        T::DTYPE,
        dx.ptr(),
        [outer, ext, inner],
        didx.ptr(),
        idx.len(),
        dsel.ptr(),
    )
    .unwrap();
    assert_close("index_select", &down::<T>(be, &dsel, n_sel), &want, None);
    let g: Vec<T> = rng.vec(n_sel, -1.0, 1.0);
    let dg = up(be, &g);
    let mut want = vec![T::ZERO; x.len()];
    cpu::index_add(&g, &[outer, ext, inner], 1, &idx, &mut want);
    let dacc = zeros::<T>(be, x.len());
    be.index_add(
        T::DTYPE,
        dg.ptr(),
        [outer, idx.len(), inner],
        didx.ptr(),
        ext,
        dacc.ptr(),
    )
    .unwrap();
    let scale = vec![T::from_f64(4.0); x.len()];
    assert_close(
        "index_add",
        &down::<T>(be, &dacc, x.len()),
        &want,
        Some(&scale),
    );

    // gather / scatter_add along each axis of [3, 5, 4].
    let xshape = [3usize, 5, 4];
    for axis in 0..3 {
        let mut ishape = xshape;
        ishape[axis] = 2 + axis;
        let ni = numel(&ishape);
        let idx: Vec<usize> = (0..ni).map(|_| rng.below(xshape[axis])).collect();
        let idx32: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
        let didx = up_u32(be, &idx32);
        let mut want = vec![T::ZERO; ni];
        cpu::gather(&x, &xshape, axis, &idx, &ishape, &mut want);
        let dout = alloc(be, ni * T::DTYPE.size());
        be.gather(
            T::DTYPE,
            Operand::new(dx.ptr(), &xshape),
            axis,
            Operand::new(didx.ptr(), &ishape),
            dout.ptr(),
        )
        .unwrap();
        assert_close(
            &format!("gather axis {axis}"),
            &down::<T>(be, &dout, ni),
            &want,
            None,
        );
        let g: Vec<T> = rng.vec(ni, -1.0, 1.0);
        let dg = up(be, &g);
        let mut want = vec![T::ZERO; x.len()];
        cpu::scatter_add(&g, &xshape, axis, &idx, &ishape, &mut want);
        let dacc = zeros::<T>(be, x.len());
        be.scatter_add(
            T::DTYPE,
            Operand::new(dg.ptr(), &ishape),
            axis,
            didx.ptr(),
            Operand::new(dacc.ptr(), &xshape),
        )
        .unwrap();
        let scale = vec![T::from_f64(ni as f64); x.len()];
        let what = format!("scatter_add axis {axis}");
        assert_close(&what, &down::<T>(be, &dacc, x.len()), &want, Some(&scale));
    }
    let r = be.gather(
        T::DTYPE,
        Operand::new(dx.ptr(), &xshape),
        1,
        Operand::new(dx.ptr(), &[3, 2, 3]),
        dx.ptr(),
    );
    assert!(matches!(r, Err(CudaError::InvalidArgument { .. })));

    // take / put_add.
    let n = 500;
    let idx32: Vec<u32> = (0..n).map(|_| rng.below(x.len()) as u32).collect();
    let didx = up_u32(be, &idx32);
    let mut want = vec![T::ZERO; n];
    cpu::take(&x, &idx32, &mut want);
    let dout = alloc(be, n * T::DTYPE.size());
    be.take(T::DTYPE, dx.ptr(), x.len(), didx.ptr(), n, dout.ptr())
        .unwrap();
    assert_close("take", &down::<T>(be, &dout, n), &want, None);
    let g: Vec<T> = rng.vec(n, -1.0, 1.0);
    let dg = up(be, &g);
    let mut want = vec![T::ZERO; x.len()];
    cpu::put_add(&g, &idx32, &mut want);
    let dacc = zeros::<T>(be, x.len());
    be.put_add(T::DTYPE, dg.ptr(), didx.ptr(), n, dacc.ptr(), x.len())
        .unwrap();
    let scale = vec![T::from_f64(n as f64); x.len()];
    assert_close(
        "put_add",
        &down::<T>(be, &dacc, x.len()),
        &want,
        Some(&scale),
    );
    // An index past the data reads NaN (take) and adds nothing (put_add): checked on the
    // device, so one bad index cannot fault the context.
    let bad = up_u32(be, &[x.len() as u32, 0, u32::MAX]);
    be.take(T::DTYPE, dx.ptr(), x.len(), bad.ptr(), 3, dout.ptr())
        .unwrap();
    let got = down::<T>(be, &dout, 3);
    #[allow(clippy::eq_op)]
    let nan = |v: T| v != v;
    assert!(
        nan(got[0]) && got[1] == x[0] && nan(got[2]),
        "take: {got:?}"
    );
    let dacc = zeros::<T>(be, x.len());
    be.put_add(T::DTYPE, dg.ptr(), bad.ptr(), 3, dacc.ptr(), x.len())
        .unwrap();
    let acc = down::<T>(be, &dacc, x.len());
    assert!(
        acc[0] == g[1] && acc[1..].iter().all(|&v| v == T::ZERO),
        "put_add: {acc:?}"
    );
}

fn windows() -> Vec<Window> {
    let base = Window {
        c: 2,
        h: 7,
        w: 6,
        kh: 3,
        kw: 2,
        sh: 1,
        sw: 1,
        ph: 0,
        pw: 0,
        dh: 1,
        dw: 1,
    };
    vec![
        base,
        Window {
            ph: 1,
            pw: 1,
            ..base
        },
        Window {
            sh: 2,
            sw: 3,
            ..base
        },
        Window {
            sh: 2,
            sw: 1,
            ph: 1,
            pw: 1,
            dh: 2,
            dw: 1,
            ..base
        },
        Window {
            kh: 2,
            kw: 2,
            sh: 2,
            sw: 2,
            ..base
        },
        Window {
            c: 3,
            h: 5,
            w: 4,
            kh: 3,
            kw: 2,
            sh: 2,
            sw: 1,
            ph: 1,
            pw: 1,
            dh: 1,
            dw: 2,
        },
        Window {
            kh: 1,
            kw: 1,
            ..base
        },
    ]
}

fn check_conv<T: Float>(be: &CudaBackend) {
    let mut rng = Rng::new(10);
    let n = 2;
    for win in windows() {
        let (ho, wo) = win.out_hw().unwrap();
        let img = win.c * win.h * win.w;
        let plen = win.patch_len();
        let l = ho * wo;
        let x: Vec<T> = rng.vec(n * img, -1.0, 1.0);
        let dx = up(be, &x);
        let dcols = alloc(be, n * plen * l * T::DTYPE.size());
        be.im2col(T::DTYPE, dx.ptr(), n, &win, dcols.ptr()).unwrap();
        let mut want = vec![T::ZERO; n * plen * l];
        for b in 0..n {
            cpu::im2col(
                &x[b * img..(b + 1) * img],
                &win,
                T::ZERO,
                &mut want[b * plen * l..(b + 1) * plen * l],
            );
        }
        assert_close(
            &format!("im2col {win:?}"),
            &down::<T>(be, &dcols, n * plen * l),
            &want,
            None,
        );

        let cols: Vec<T> = rng.vec(n * plen * l, -1.0, 1.0);
        let dcols = up(be, &cols);
        let dimg = up(be, &rng.vec::<T>(n * img, 5.0, 6.0)); // overwritten, not accumulated
        be.col2im(T::DTYPE, dcols.ptr(), n, &win, dimg.ptr())
            .unwrap();
        let mut want = vec![T::ZERO; n * img];
        for b in 0..n {
            cpu::col2im(
                &cols[b * plen * l..(b + 1) * plen * l],
                &win,
                &mut want[b * img..(b + 1) * img],
            );
        }
        let scale = vec![T::from_f64((win.kh * win.kw) as f64); n * img];
        assert_close(
            &format!("col2im {win:?}"),
            &down::<T>(be, &dimg, n * img),
            &want,
            Some(&scale),
        );

        // Max pooling, with ties and NaNs.
        let mut x: Vec<T> = rng.discrete(n * img);
        for i in (0..x.len()).step_by(23) {
            x[i] = T::from_f64(f64::NAN);
        }
        let dx = up(be, &x);
        let didx = alloc(be, n * win.c * l * 4);
        be.max_pool_indices(T::DTYPE, dx.ptr(), n, &win, didx.ptr())
            .unwrap();
        let mut want = vec![0u32; n * win.c * l];
        for b in 0..n {
            cpu::max_pool_indices(
                &x[b * img..(b + 1) * img],
                &win,
                b * img,
                &mut want[b * win.c * l..(b + 1) * win.c * l],
            );
        }
        assert_eq!(
            down_u32(be, &didx, want.len()),
            want,
            "max_pool_indices {win:?}"
        );
    }
    let bad = Window {
        kh: 1,
        kw: 1,
        ph: 1,
        pw: 0,
        ..windows()[0]
    };
    let dx = zeros::<T>(be, 1);
    let r = be.max_pool_indices(T::DTYPE, dx.ptr(), 1, &bad, dx.ptr());
    assert!(matches!(r, Err(CudaError::InvalidArgument { .. })));
}

fn check_gemm<T: Float>(be: &CudaBackend) {
    let mut rng = Rng::new(11);
    for (batch, m, n, k) in [(3, 5, 7, 4), (1, 1, 1, 1), (2, 33, 17, 65), (2, 3, 4, 0)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for (a_stride, b_stride) in [(m * k, k * n), (0, k * n), (m * k, 0)] {
                let a: Vec<T> = rng.vec(m * k * batch, -1.0, 1.0);
                let b: Vec<T> = rng.vec(k * n * batch, -1.0, 1.0);
                let c0: Vec<T> = rng.vec(m * n * batch, -1.0, 1.0);
                let f = |v: &[T]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
                let mut want = f(&c0);
                let dims = (m, n, k);
                rowmajor_gemm(
                    batch,
                    dims,
                    &f(&a),
                    a_stride,
                    ta,
                    &f(&b),
                    b_stride,
                    tb,
                    &mut want,
                    1.5,
                    0.5,
                );
                let mut scale = f(&abs(&c0));
                let (aa, ab) = (f(&abs(&a)), f(&abs(&b)));
                rowmajor_gemm(
                    batch, dims, &aa, a_stride, ta, &ab, b_stride, tb, &mut scale, 1.5, 0.5,
                );
                let (da, db, dc) = (up(be, &a), up(be, &b), up(be, &c0));
                be.gemm(
                    T::DTYPE,
                    batch,
                    m,
                    n,
                    k,
                    da.ptr(),
                    a_stride,
                    ta,
                    db.ptr(),
                    b_stride,
                    tb,
                    dc.ptr(),
                    m * n,
                    1.5,
                    0.5,
                )
                .unwrap();
                let got: Vec<T> = down(be, &dc, m * n * batch);
                let want: Vec<T> = want.into_iter().map(T::from_f64).collect();
                let scale: Vec<T> = scale.into_iter().map(T::from_f64).collect();
                let what = format!(
                    "gemm {batch}x{m}x{n}x{k} ta {ta} tb {tb} strides {a_stride} {b_stride}"
                );
                assert_close(&what, &got, &want, Some(&scale));
            }
        }
    }
}

fn check_fill_and_copies<T: Float>(be: &CudaBackend) {
    let n = 1000;
    let d = alloc(be, n * T::DTYPE.size());
    be.fill(T::DTYPE, d.ptr(), n, 0.1).unwrap();
    assert!(down::<T>(be, &d, n).iter().all(|&v| v == T::from_f64(0.1)));
    let x: Vec<T> = Rng::new(12).vec(n, -1.0, 1.0);
    let dx = up(be, &x);
    be.dtod(dx.ptr(), d.ptr(), n * T::DTYPE.size()).unwrap();
    assert_eq!(down::<T>(be, &d, n), x);
}

fn on_gpu(check: impl Fn(&CudaBackend)) {
    let Some(be) = gpu() else { return };
    check(&be);
    be.synchronize().unwrap();
}

#[test]
#[cfg_attr(miri, ignore)]
fn gpu_unary_matches_cpu() {
    on_gpu(|be| {
        check_unary::<f32>(be);
        check_unary::<f64>(be);
        check_unary_grad::<f32>(be);
        check_unary_grad::<f64>(be);
    });
}

#[test]
#[cfg_attr(miri, ignore)]
fn gpu_binary_and_select_match_cpu() {
    on_gpu(|be| {
        check_binary::<f32>(be);
        check_binary::<f64>(be);
        check_select::<f32>(be);
        check_select::<f64>(be);
        check_copy_strided::<f32>(be);
        check_copy_strided::<f64>(be);
    });
}

#[test]
#[cfg_attr(miri, ignore)]
fn gpu_reduce_and_softmax_match_cpu() {
    on_gpu(|be| {
        check_reduce::<f32>(be);
        check_reduce::<f64>(be);
        check_softmax::<f32>(be);
        check_softmax::<f64>(be);
    });
}

#[test]
#[cfg_attr(miri, ignore)]
fn gpu_indexing_matches_cpu() {
    on_gpu(|be| {
        check_indexing::<f32>(be);
        check_indexing::<f64>(be);
    });
}

#[test]
#[cfg_attr(miri, ignore)]
fn gpu_im2col_col2im_and_pooling_match_cpu() {
    on_gpu(|be| {
        check_conv::<f32>(be);
        check_conv::<f64>(be);
    });
}

#[test]
#[cfg_attr(miri, ignore)]
fn gpu_gemm_matches_cpu() {
    on_gpu(|be| {
        check_gemm::<f32>(be);
        check_gemm::<f64>(be);
    });
}

#[test]
#[cfg_attr(miri, ignore)]
fn gpu_fill_copies_events_and_cache() {
    on_gpu(|be| {
        let start = be.record_event().unwrap();
        check_fill_and_copies::<f32>(be);
        check_fill_and_copies::<f64>(be);
        let end = be.record_event().unwrap();
        end.synchronize().unwrap();
        assert!(start.elapsed_ms(&end).unwrap() >= 0.0);
        let stats = be.memory_stats();
        assert!(stats.contains_key("reserved_bytes.all.current"));
        be.empty_cache();
    });
}

/// `params::AttnParams` is laid out as `struct AttnParams` in fused.cu, which takes it by value:
/// the same fields in the same order at the offsets the C types give (every scalar 8 bytes, the
/// arrays `MAX_DIMS` of them), read from the kernel source itself.
#[test]
fn attn_params_is_laid_out_as_the_kernels_struct() {
    use std::mem::offset_of;
    let src = include_str!("fused.cu");
    let body = &src[src
        .find("struct AttnParams {")
        .expect("the struct in fused.cu")..];
    let body = &body[..body.find("};").unwrap()];
    let mut c_fields = Vec::new();
    let mut at = 0;
    for line in body.lines().skip(1) {
        let line = line.trim().trim_end_matches(';');
        let Some((ty, names)) = line.split_once(' ') else {
            continue;
        };
        assert!(
            matches!(ty, "u64" | "i64" | "double"),
            "a field of type {ty}"
        );
        for name in names.split(',') {
            let (name, width) = match name.trim().split_once('[') {
                Some((n, "MAX_DIMS]")) => (n, 8 * MAX_DIMS),
                Some((n, other)) => panic!("{n}: an array of {other}"),
                None => (name.trim(), 8),
            };
            c_fields.push((name.to_string(), at));
            at += width;
        }
    }
    let rust = [
        ("bh", offset_of!(params::AttnParams, bh)),
        ("lq", offset_of!(params::AttnParams, lq)),
        ("lk", offset_of!(params::AttnParams, lk)),
        ("d", offset_of!(params::AttnParams, d)),
        ("dv", offset_of!(params::AttnParams, dv)),
        ("causal", offset_of!(params::AttnParams, causal)),
        ("has_mask", offset_of!(params::AttnParams, has_mask)),
        ("dropout", offset_of!(params::AttnParams, dropout)),
        ("seed", offset_of!(params::AttnParams, seed)),
        ("threshold", offset_of!(params::AttnParams, threshold)),
        ("scale", offset_of!(params::AttnParams, scale)),
        ("keep_scale", offset_of!(params::AttnParams, keep_scale)),
        ("mask_rs", offset_of!(params::AttnParams, mask_rs)),
        ("mask_cs", offset_of!(params::AttnParams, mask_cs)),
        ("lead_rank", offset_of!(params::AttnParams, lead_rank)),
        ("lead_shape", offset_of!(params::AttnParams, lead_shape)),
        ("lead_stride", offset_of!(params::AttnParams, lead_stride)),
    ]
    .map(|(n, o)| (n.to_string(), o));
    assert_eq!(c_fields, rust.to_vec());
    assert_eq!(std::mem::size_of::<params::AttnParams>(), at);
}
