//! Kernel parameters: the `#[repr(C)]` mirrors of the structs in `kernels.cu`, the
//! launch geometry, and the checks that turn shapes into them.

use super::{CudaError, MAX_DIMS};
use crate::cpu::Window;
use crate::layout::coalesce;

/// Threads per block of every launch (`BLOCK` in the kernels, defined from this value by
/// `crate::ops::cuda_defines`).
pub(crate) const BLOCK: u32 = crate::ops::CUDA_BLOCK;
/// Most blocks of one launch; the kernels' grid-stride loops cover any remaining work.
pub(crate) const MAX_GRID: u64 = 32 * 1024;

/// Blocks for `work` items at one item per thread.
pub(crate) fn blocks_for(work: u64) -> u32 {
    work.div_ceil(u64::from(BLOCK)).clamp(1, MAX_GRID) as u32
}

/// Blocks for `work` items at one item per block.
pub(crate) fn blocks_per_item(work: u64) -> u32 {
    work.clamp(1, MAX_GRID) as u32
}

/// `struct Strided` of `kernels.cu`: a shape and the element strides of up to four operands.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Strided {
    pub rank: i64,
    pub shape: [i64; MAX_DIMS],
    pub st: [[i64; MAX_DIMS]; 4],
}

/// `struct ReduceParams` of `kernels.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ReduceParams {
    pub kept_rank: i64,
    pub kept_shape: [i64; MAX_DIMS],
    pub kept_stride: [i64; MAX_DIMS],
    pub red_rank: i64,
    pub red_shape: [i64; MAX_DIMS],
    pub red_stride: [i64; MAX_DIMS],
    pub n_out: u64,
    pub n_red: u64,
}

/// `struct Win` of `kernels.cu`: a [`Window`] and its output size.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Win {
    pub c: i64,
    pub h: i64,
    pub w: i64,
    pub kh: i64,
    pub kw: i64,
    pub sh: i64,
    pub sw: i64,
    pub ph: i64,
    pub pw: i64,
    pub dh: i64,
    pub dw: i64,
    pub ho: i64,
    pub wo: i64,
}

/// Declares the kernels from one list of `Variant => "base"` rows: the enum [`K`], the names
/// [`KERNEL_BASES`] (indexed by `K as usize`) and [`K::base`]. A kernel's variant and its name sit
/// on one row, so the two cannot fall out of step (a swap would launch the wrong kernel, which
/// only a GPU would show).
macro_rules! kernels {
    ($($var:ident => $base:literal,)*) => {
        /// The kernels of `kernels.cu` and `fused.cu`; each exists as `<base>_f32` and
        /// `<base>_f64` ([`K::base`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum K {
            $($var,)*
        }

        /// The kernels' names without the type suffix, indexed by `K as usize`.
        pub(crate) const KERNEL_BASES: &[&str] = &[$($base,)*];

        impl K {
            /// Every kernel, in the order of [`KERNEL_BASES`].
            #[cfg_attr(not(test), allow(dead_code))]
            pub(crate) const ALL: &'static [K] = &[$(K::$var,)*];

            /// The kernel's name without the type suffix.
            #[cfg_attr(not(test), allow(dead_code))]
            pub(crate) fn base(self) -> &'static str {
                match self {
                    $(K::$var => $base,)*
                }
            }
        }
    };
}

kernels! {
    Fill => "fill",
    Unary => "unary",
    UnaryGrad => "unary_grad",
    Binary => "binary",
    Select => "select",
    CopyStrided => "copy_strided",
    ReduceThread => "reduce_thread",
    ReduceBlock => "reduce_block",
    SoftmaxThread => "softmax_thread",
    SoftmaxBlock => "softmax_block",
    SoftmaxGradThread => "softmax_grad_thread",
    SoftmaxGradBlock => "softmax_grad_block",
    IndexSelect => "index_select",
    IndexAdd => "index_add",
    Gather => "gather",
    ScatterAdd => "scatter_add",
    Take => "take",
    PutAdd => "put_add",
    Im2col => "im2col",
    Col2im => "col2im",
    MaxPoolIndices => "max_pool_indices",
    Cumsum => "cumsum",
    Dropout => "dropout",
    NormStats => "norm_stats",
    NormApply => "norm_apply",
    NormGradInput => "norm_grad_input",
    NormGradParams => "norm_grad_params",
    AttnForward => "attn_forward",
    AttnDelta => "attn_delta",
    AttnDq => "attn_dq",
    AttnDkdv => "attn_dkdv",
}

/// `struct AttnParams` of `fused.cu`: the attention problem ([`crate::cpu::attention::AttnDims`])
/// and the mask's layout, every field 64 bits wide.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AttnParams {
    pub bh: u64,
    pub lq: u64,
    pub lk: u64,
    pub d: u64,
    pub dv: u64,
    pub causal: u64,
    pub has_mask: u64,
    pub dropout: u64,
    pub seed: u64,
    pub threshold: u64,
    pub scale: f64,
    pub keep_scale: f64,
    pub mask_rs: i64,
    pub mask_cs: i64,
    pub lead_rank: i64,
    pub lead_shape: [i64; MAX_DIMS],
    pub lead_stride: [i64; MAX_DIMS],
}

pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> CudaError {
    CudaError::InvalidArgument {
        op,
        msg: msg.into(),
    }
}

/// The product of `dims`, or an error when it overflows 64 bits (or `usize`).
pub(crate) fn count(op: &'static str, dims: &[usize]) -> Result<u64, CudaError> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .map(|n| n as u64)
        .ok_or_else(|| {
            invalid(
                op,
                format!("{dims:?} holds more elements than usize can count"),
            )
        })
}

pub(crate) fn to_i64(op: &'static str, v: usize) -> Result<i64, CudaError> {
    i64::try_from(v).map_err(|_| invalid(op, format!("{v} does not fit in i64")))
}

/// Whether `from` broadcasts to `to` (numpy rules: right-aligned, each extent equal or 1).
pub(crate) fn check_broadcast(
    op: &'static str,
    from: &[usize],
    to: &[usize],
) -> Result<(), CudaError> {
    let ok = from.len() <= to.len()
        && from
            .iter()
            .rev()
            .zip(to.iter().rev())
            .all(|(&f, &t)| f == t || f == 1);
    if ok {
        Ok(())
    } else {
        Err(invalid(
            op,
            format!("shape {from:?} does not broadcast to {to:?}"),
        ))
    }
}

/// Merges the dimensions that are contiguous for every operand and packs the result into a
/// [`Strided`]; the operands past `N` get zero strides.
pub(crate) fn strided<const N: usize>(
    op: &'static str,
    shape: &[usize],
    strides: [&[usize]; N],
) -> Result<Strided, CudaError> {
    debug_assert!(N <= 4);
    for s in strides {
        if s.len() != shape.len() {
            return Err(invalid(
                op,
                format!("{} strides for a shape of rank {}", s.len(), shape.len()),
            ));
        }
    }
    let (sh, st) = coalesce(shape, strides);
    if sh.len() > MAX_DIMS {
        return Err(CudaError::TooManyDims { op, dims: sh.len() });
    }
    let mut p = Strided {
        rank: sh.len() as i64,
        ..Strided::default()
    };
    for (d, &extent) in sh.iter().enumerate() {
        p.shape[d] = to_i64(op, extent)?;
        for (dst, src) in p.st.iter_mut().zip(&st) {
            dst[d] = to_i64(op, src[d])?;
        }
    }
    Ok(p)
}

/// The parameters of a reduction of a contiguous `shape` over the axes where `mask` is true.
pub(crate) fn reduce_params(
    op: &'static str,
    shape: &[usize],
    mask: &[bool],
) -> Result<ReduceParams, CudaError> {
    if mask.len() != shape.len() {
        return Err(invalid(
            op,
            format!(
                "a mask of {} axes for a shape of rank {}",
                mask.len(),
                shape.len()
            ),
        ));
    }
    count(op, shape)?;
    let xs = crate::layout::contiguous_strides(shape);
    let pick = |reduced: bool| -> (Vec<usize>, Vec<usize>) {
        shape
            .iter()
            .zip(&xs)
            .zip(mask)
            .filter(|&(_, &m)| m == reduced)
            .map(|((&d, &s), _)| (d, s))
            .unzip()
    };
    let (kshape, kstride) = pick(false);
    let (rshape, rstride) = pick(true);
    let mut p = ReduceParams {
        n_out: count(op, &kshape)?,
        n_red: count(op, &rshape)?,
        ..ReduceParams::default()
    };
    let (ksh, [kst]) = coalesce(&kshape, [&kstride]);
    let (rsh, [rst]) = coalesce(&rshape, [&rstride]);
    for len in [ksh.len(), rsh.len()] {
        if len > MAX_DIMS {
            return Err(CudaError::TooManyDims { op, dims: len });
        }
    }
    p.kept_rank = ksh.len() as i64;
    p.red_rank = rsh.len() as i64;
    for d in 0..ksh.len() {
        p.kept_shape[d] = to_i64(op, ksh[d])?;
        p.kept_stride[d] = to_i64(op, kst[d])?;
    }
    for d in 0..rsh.len() {
        p.red_shape[d] = to_i64(op, rsh[d])?;
        p.red_stride[d] = to_i64(op, rst[d])?;
    }
    Ok(p)
}

/// The second pass of a two-pass reduction: `n_out` rows of `chunks` partial results each.
pub(crate) fn partials_params(n_out: u64, chunks: u64) -> ReduceParams {
    let mut p = ReduceParams {
        kept_rank: 1,
        red_rank: 1,
        n_out,
        n_red: chunks,
        ..ReduceParams::default()
    };
    p.kept_shape[0] = n_out as i64;
    p.kept_stride[0] = chunks as i64;
    p.red_shape[0] = chunks as i64;
    p.red_stride[0] = 1;
    p
}

/// A window as the kernels take it, after checking that it has an output and that `n` images of
/// it (and their columns) can be counted.
pub(crate) fn window(op: &'static str, n: usize, win: &Window) -> Result<(Win, u64), CudaError> {
    let Some((ho, wo)) = win.out_hw() else {
        return Err(invalid(op, format!("{win:?} has no output")));
    };
    count(op, &[n, win.c, win.h, win.w])?;
    let cols = count(op, &[n, win.c, win.kh, win.kw, ho, wo])?;
    let w = Win {
        c: to_i64(op, win.c)?,
        h: to_i64(op, win.h)?,
        w: to_i64(op, win.w)?,
        kh: to_i64(op, win.kh)?,
        kw: to_i64(op, win.kw)?,
        sh: to_i64(op, win.sh)?,
        sw: to_i64(op, win.sw)?,
        ph: to_i64(op, win.ph)?,
        pw: to_i64(op, win.pw)?,
        dh: to_i64(op, win.dh)?,
        dw: to_i64(op, win.dw)?,
        ho: to_i64(op, ho)?,
        wo: to_i64(op, wo)?,
    };
    Ok((w, cols))
}

/// Whether every output position along one axis has a kernel tap inside the input.
pub(crate) fn every_window_touches_input(
    size: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dil: usize,
    out: usize,
) -> bool {
    (0..out).all(|o| {
        (0..k).any(|t| {
            let at = o * stride + t * dil;
            at >= pad && at - pad < size
        })
    })
}

/// Splits a shape around `axis` into (outer, extent, inner), checking the axis.
pub(crate) fn around_axis(
    op: &'static str,
    shape: &[usize],
    axis: usize,
) -> Result<(u64, u64, u64), CudaError> {
    if axis >= shape.len() {
        return Err(invalid(
            op,
            format!("axis {axis} of a shape of rank {}", shape.len()),
        ));
    }
    count(op, shape)?;
    Ok((
        count(op, &shape[..axis])?,
        shape[axis] as u64,
        count(op, &shape[axis + 1..])?,
    ))
}

/// A row-major batched product expressed as the column-major call cuBLAS makes: row-major
/// `C = op(A)·op(B)` is column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`, so B comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GemmPlan {
    /// Whether cuBLAS transposes its first operand (our B).
    pub trans_first: bool,
    /// Whether cuBLAS transposes its second operand (our A).
    pub trans_second: bool,
    /// cuBLAS's m, n, k: our n, m, k.
    pub m: i32,
    pub n: i32,
    pub k: i32,
    /// Leading dimensions of the first operand (B), second (A) and C.
    pub ld_first: i32,
    pub ld_second: i32,
    pub ldc: i32,
    /// Batch strides of B, A and C, in elements.
    pub stride_first: i64,
    pub stride_second: i64,
    pub stride_c: i64,
    pub batch: i32,
}

/// The cuBLAS call for a row-major batched product (see `CudaBackend::gemm`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_plan(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a_stride: usize,
    ta: bool,
    b_stride: usize,
    tb: bool,
    c_stride: usize,
) -> Result<GemmPlan, CudaError> {
    let int = |what: &str, v: usize| {
        i32::try_from(v).map_err(|_| CudaError::Blas {
            op: "gemm",
            msg: format!("{what} = {v} exceeds cuBLAS's 32-bit sizes"),
        })
    };
    let long = |what: &str, v: usize| {
        i64::try_from(v).map_err(|_| CudaError::Blas {
            op: "gemm",
            msg: format!("{what} = {v} exceeds cuBLAS's 64-bit strides"),
        })
    };
    // B is k×n row-major (n×k when tb): read column-major it is Bᵀ with leading dimension n, or
    // (stored n×k) the transpose of what cuBLAS needs, with leading dimension k.
    let ld_first = if tb { k } else { n };
    // A is m×k row-major (k×m when ta): likewise leading dimension k, or m transposed.
    let ld_second = if ta { m } else { k };
    Ok(GemmPlan {
        trans_first: tb,
        trans_second: ta,
        m: int("n", n)?,
        n: int("m", m)?,
        k: int("k", k)?,
        ld_first: int("leading dimension of b", ld_first.max(1))?,
        ld_second: int("leading dimension of a", ld_second.max(1))?,
        ldc: int("leading dimension of c", n.max(1))?,
        stride_first: long("b_stride", b_stride)?,
        stride_second: long("a_stride", a_stride)?,
        stride_c: long("c_stride", c_stride)?,
        batch: int("batch", batch)?,
    })
}
