//! The kernels of [`CudaBackend`]: each method checks its shapes, packs the parameters and queues
//! one launch (two for a long reduction) on the backend's stream; none waits for the device.
//!
//! Pointers are device addresses from the backend's block cache holding elements of `dt` (or
//! `u32` where documented); outputs must not overlap inputs unless a method says otherwise.

use arenagrad_alloc::block_cache::DevicePtr;

use super::params::{
    self, around_axis, blocks_for, blocks_per_item, check_broadcast, count, invalid, strided, K,
};
use super::{launch, CudaBackend, CudaError};
use crate::cpu::{Operand, ReduceOp, Strided, Window};
use crate::layout::{broadcast_strides, contiguous_strides};
use crate::{BinaryOp, DType, UnaryOp};

/// Reduced extents below this run one thread per output; longer ones one block per output.
const BLOCK_REDUCE_MIN: u64 = 256;
/// Reduced elements per block in the first pass of a two-pass reduction.
const REDUCE_CHUNK: u64 = 4096;
/// Most partial results per output in a two-pass reduction.
const MAX_CHUNKS: u64 = 1024;
/// Softmax rows at least this long run one block per row.
const BLOCK_SOFTMAX_MIN: u64 = 256;

impl CudaBackend {
    /// `out[i] = value` (rounded to `dt`) for `i < n`.
    pub fn fill(&self, dt: DType, out: DevicePtr, n: usize, value: f64) -> Result<(), CudaError> {
        let n = n as u64;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::Fill, dt, "fill", blocks_for(n); out.0, n, value)
    }

    /// `out[i] = op(x[i])` for `i < n`, as [`crate::cpu::unary`]. `out` may be `x`.
    pub fn unary(
        &self,
        dt: DType,
        op: UnaryOp,
        x: DevicePtr,
        out: DevicePtr,
        n: usize,
    ) -> Result<(), CudaError> {
        let n = n as u64;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let (code, p) = (op.code(), op.param().unwrap_or(0.0));
        launch!(self, K::Unary, dt, "unary", blocks_for(n); x.0, out.0, n, code, p)
    }

    /// `out[i] = gy[i]·op'(x[i])` for `i < n`, with `(x, y)` the forward's input and output
    /// (`y = op(x)`), as [`crate::cpu::unary_grad`].
    pub fn unary_grad(
        &self,
        dt: DType,
        op: UnaryOp,
        (x, y): (DevicePtr, DevicePtr),
        gy: DevicePtr,
        out: DevicePtr,
        n: usize,
    ) -> Result<(), CudaError> {
        let n = n as u64;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let (code, p) = (op.code(), op.param().unwrap_or(0.0));
        launch!(self, K::UnaryGrad, dt, "unary_grad", blocks_for(n);
            x.0, y.0, gy.0, out.0, n, code, p)
    }

    /// `out = op(a, b)` with numpy broadcasting, as [`crate::cpu::binary`]: `a`'s and `b`'s
    /// shapes must broadcast to `out`'s (right-aligned; a dimension of extent 1 is repeated).
    /// `out` is contiguous.
    pub fn binary(
        &self,
        dt: DType,
        op: BinaryOp,
        a: Operand<'_, DevicePtr>,
        b: Operand<'_, DevicePtr>,
        out: Operand<'_, DevicePtr>,
    ) -> Result<(), CudaError> {
        const OP: &str = "binary";
        let (a, a_shape, b, b_shape) = (a.data, a.shape, b.data, b.shape);
        let (out, out_shape) = (out.data, out.shape);
        check_broadcast(OP, a_shape, out_shape)?;
        check_broadcast(OP, b_shape, out_shape)?;
        let n = count(OP, out_shape)?;
        if n == 0 {
            return Ok(());
        }
        let so = contiguous_strides(out_shape);
        let sa = broadcast_strides(a_shape, out_shape);
        let sb = broadcast_strides(b_shape, out_shape);
        let p = strided(OP, out_shape, [&so, &sa, &sb])?;
        self.bind()?;
        launch!(self, K::Binary, dt, "binary", blocks_for(n);
            a.0, b.0, out.0, n, p, op.code())
    }

    /// `out = cond != 0 ? a : b`, the three broadcast to `out`'s shape, as
    /// [`crate::cpu::select`].
    pub fn select(
        &self,
        dt: DType,
        cond: Operand<'_, DevicePtr>,
        a: Operand<'_, DevicePtr>,
        b: Operand<'_, DevicePtr>,
        out: Operand<'_, DevicePtr>,
    ) -> Result<(), CudaError> {
        const OP: &str = "select";
        let (cond, c_shape, a, a_shape) = (cond.data, cond.shape, a.data, a.shape);
        let (b, b_shape, out, out_shape) = (b.data, b.shape, out.data, out.shape);
        for s in [c_shape, a_shape, b_shape] {
            check_broadcast(OP, s, out_shape)?;
        }
        let n = count(OP, out_shape)?;
        if n == 0 {
            return Ok(());
        }
        let so = contiguous_strides(out_shape);
        let sc = broadcast_strides(c_shape, out_shape);
        let sa = broadcast_strides(a_shape, out_shape);
        let sb = broadcast_strides(b_shape, out_shape);
        let p = strided(OP, out_shape, [&so, &sc, &sa, &sb])?;
        self.bind()?;
        launch!(self, K::Select, dt, "select", blocks_for(n);
            cond.0, a.0, b.0, out.0, n, p)
    }

    /// `dst[dst.offset + Σ i_d·dst.strides[d]] = src[src.offset + Σ i_d·src.strides[d]]` for
    /// every index `i` of `shape`; offsets and strides in elements, strides may be 0.
    /// Destinations reached by several indices get one of the values, unspecified which.
    pub fn copy_strided(
        &self,
        dt: DType,
        shape: &[usize],
        src: Strided<'_, DevicePtr>,
        dst: Strided<'_, DevicePtr>,
    ) -> Result<(), CudaError> {
        const OP: &str = "copy_strided";
        let (src_off, src_strides, src) = (src.offset, src.strides, src.data);
        let (dst_off, dst_strides, dst) = (dst.offset, dst.strides, dst.data);
        let n = count(OP, shape)?;
        let p = strided(OP, shape, [src_strides, dst_strides])?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::CopyStrided, dt, "copy_strided", blocks_for(n);
            src.0, src_off as u64, dst.0, dst_off as u64, n, p)
    }

    /// Reduces the contiguous `x` of `shape` over the axes where `mask` is true, as
    /// [`crate::cpu::reduce()`]: `out` is contiguous over the kept axes in order (the keep-dim
    /// layout). An empty reduction gives 0 (sum) or -inf (max); max propagates NaN.
    ///
    /// Short reductions run one thread per output, long ones one block per output; a long
    /// reduction to few outputs is split over many blocks and finished by a second launch,
    /// through a scratch buffer from the block cache.
    pub fn reduce(
        &self,
        dt: DType,
        op: ReduceOp,
        x: DevicePtr,
        shape: &[usize],
        mask: &[bool],
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        let p = params::reduce_params("reduce", shape, mask)?;
        let code = op.code();
        if p.n_out == 0 {
            return Ok(());
        }
        self.bind()?;
        if p.n_red < BLOCK_REDUCE_MIN {
            return launch!(self, K::ReduceThread, dt, "reduce", blocks_for(p.n_out);
                x.0, out.0, p, code);
        }
        let chunks = p.n_red.div_ceil(REDUCE_CHUNK).min(MAX_CHUNKS);
        if p.n_out >= 2 * self.sm_count || chunks < 2 {
            return launch!(self, K::ReduceBlock, dt, "reduce", blocks_per_item(p.n_out);
                x.0, out.0, p, code, p.n_red, 1u64);
        }
        let chunk = p.n_red.div_ceil(chunks);
        let bytes = (p.n_out * chunks) as usize * dt.size();
        let scratch = self.cache().alloc(bytes, self.stream_id())?;
        let partials = params::partials_params(p.n_out, chunks);
        let run = || {
            launch!(self, K::ReduceBlock, dt, "reduce", blocks_per_item(p.n_out * chunks);
                x.0, scratch.ptr.0, p, code, chunk, chunks)?;
            launch!(self, K::ReduceBlock, dt, "reduce", blocks_per_item(p.n_out);
                scratch.ptr.0, out.0, partials, code, chunks, 1u64)
        };
        let result = run();
        // Stream order makes the immediate free safe: whatever reuses the block runs after the
        // two launches above.
        self.cache().free(scratch)?;
        result
    }

    /// Softmax (or log-softmax when `log`) of the contiguous `x` along `axis`,
    /// subtracting each row's maximum first, as [`crate::cpu::softmax`].
    pub fn softmax(
        &self,
        dt: DType,
        x: Operand<'_, DevicePtr>,
        axis: usize,
        log: bool,
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        let (x, shape) = (x.data, x.shape);
        let (outer, len, inner) = around_axis("softmax", shape, axis)?;
        let rows = outer * inner;
        if rows == 0 || len == 0 {
            return Ok(());
        }
        self.bind()?;
        let log = u64::from(log);
        if len >= BLOCK_SOFTMAX_MIN {
            launch!(self, K::SoftmaxBlock, dt, "softmax", blocks_per_item(rows);
                x.0, out.0, outer, len, inner, log)
        } else {
            launch!(self, K::SoftmaxThread, dt, "softmax", blocks_for(rows);
                x.0, out.0, outer, len, inner, log)
        }
    }

    /// Inverted dropout of the `n` elements of `x` into `out`, as [`crate::cpu::dropout::dropout`]
    /// (the same decisions from the same `seed`): each dropped with probability `p`, the kept
    /// multiplied by `scale`.
    pub fn dropout(
        &self,
        dt: DType,
        x: DevicePtr,
        n: usize,
        (seed, p, scale): (u64, f64, f64),
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let threshold = crate::cpu::dropout::threshold(p);
        launch!(self, K::Dropout, dt, "dropout", blocks_for(n as u64);
            x.0, n as u64, seed, threshold, scale, out.0)
    }

    /// Running sums along `axis` of the contiguous `x` of `shape` (from the end when
    /// `reverse`), as [`crate::cpu::cumsum`].
    pub fn cumsum(
        &self,
        dt: DType,
        x: DevicePtr,
        shape: &[usize],
        axis: usize,
        reverse: bool,
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        let (outer, len, inner) = around_axis("cumsum", shape, axis)?;
        let lines = outer * inner;
        if lines == 0 || len == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::Cumsum, dt, "cumsum", blocks_for(lines);
            x.0, outer, len, inner, u64::from(reverse), out.0)
    }

    /// The fused softmax derivative along `axis` from the forward output `y` and the upstream
    /// gradient `gy`, as [`crate::cpu::softmax_grad`]: softmax `y·(gy - Σ gy·y)`, log-softmax
    /// `gy - e^y·Σ gy`. `y` and `gy` both have `y`'s shape.
    pub fn softmax_grad(
        &self,
        dt: DType,
        y: Operand<'_, DevicePtr>,
        gy: DevicePtr,
        axis: usize,
        log: bool,
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        let (y, shape) = (y.data, y.shape);
        let (outer, len, inner) = around_axis("softmax_grad", shape, axis)?;
        let rows = outer * inner;
        if rows == 0 || len == 0 {
            return Ok(());
        }
        self.bind()?;
        let log = u64::from(log);
        if len >= BLOCK_SOFTMAX_MIN {
            launch!(self, K::SoftmaxGradBlock, dt, "softmax_grad", blocks_per_item(rows);
                y.0, gy.0, out.0, outer, len, inner, log)
        } else {
            launch!(self, K::SoftmaxGradThread, dt, "softmax_grad", blocks_for(rows);
                y.0, gy.0, out.0, outer, len, inner, log)
        }
    }

    /// `x` viewed as `[outer, axis_len, inner]`; `out [outer, n_idx, inner]` takes the entries
    /// `idx` (`n_idx` `u32`s on the device) along the middle axis, as
    /// [`crate::cpu::index_select`]. An index `>= axis_len` gives NaN.
    pub fn index_select(
        &self,
        dt: DType,
        x: DevicePtr,
        [outer, axis_len, inner]: [usize; 3],
        idx: DevicePtr,
        n_idx: usize,
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        let n = count("index_select", &[outer, n_idx, inner])?;
        count("index_select", &[outer, axis_len, inner])?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::IndexSelect, dt, "index_select", blocks_for(n);
            x.0, outer as u64, axis_len as u64, inner as u64, idx.0, n_idx as u64, out.0)
    }

    /// The adjoint of [`CudaBackend::index_select`]: `g [outer, n_idx, inner]` is added into
    /// `out [outer, axis_len, inner]` at `idx` along the middle axis (atomically, so repeated
    /// indices accumulate). The caller zeroes `out`. Indices `>= axis_len` add nothing.
    pub fn index_add(
        &self,
        dt: DType,
        g: DevicePtr,
        [outer, n_idx, inner]: [usize; 3],
        idx: DevicePtr,
        axis_len: usize,
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        let n = count("index_add", &[outer, n_idx, inner])?;
        count("index_add", &[outer, axis_len, inner])?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::IndexAdd, dt, "index_add", blocks_for(n);
            g.0, outer as u64, n_idx as u64, inner as u64, idx.0, axis_len as u64, out.0)
    }

    /// PyTorch's gather, as [`crate::cpu::gather`]: `out[p] = x[p with coordinate axis
    /// replaced by idx[p]]`. `idx` (`u32`) and `out` have `idx`'s shape, which equals `x`'s
    /// except at `axis`. An index out of range gives NaN.
    pub fn gather(
        &self,
        dt: DType,
        x: Operand<'_, DevicePtr>,
        axis: usize,
        idx: Operand<'_, DevicePtr>,
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        let (x, xshape, idx, ishape) = (x.data, x.shape, idx.data, idx.shape);
        let (outer, ext, inner, iext) = gather_geometry("gather", xshape, axis, ishape)?;
        let n = outer * iext * inner;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::Gather, dt, "gather", blocks_for(n);
            x.0, outer, ext, inner, idx.0, iext, out.0)
    }

    /// The adjoint of [`CudaBackend::gather`], as [`crate::cpu::scatter_add`]: `g` (of the
    /// indices' shape, as `idx`) is added into `out` (zeroed by the caller) at the places gather
    /// reads, atomically. Indices out of range add nothing.
    pub fn scatter_add(
        &self,
        dt: DType,
        g: Operand<'_, DevicePtr>,
        axis: usize,
        idx: DevicePtr,
        out: Operand<'_, DevicePtr>,
    ) -> Result<(), CudaError> {
        let (g, ishape, out, full) = (g.data, g.shape, out.data, out.shape);
        let (outer, ext, inner, iext) = gather_geometry("scatter_add", full, axis, ishape)?;
        let n = outer * iext * inner;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::ScatterAdd, dt, "scatter_add", blocks_for(n);
            g.0, outer, ext, inner, idx.0, iext, out.0)
    }

    /// For a batch of `n` images `[n, c, h, w]`, the columns of each image exactly as
    /// [`crate::cpu::im2col`] with zero padding lays them out: `out` is `n × patch_len × ho·wo`.
    pub fn im2col(
        &self,
        dt: DType,
        x: DevicePtr,
        n: usize,
        win: &Window,
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        let (w, cols) = params::window("im2col", n, win)?;
        if cols == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::Im2col, dt, "im2col", blocks_for(cols); x.0, n as u64, w, out.0)
    }

    /// The adjoint of [`CudaBackend::im2col`], as [`crate::cpu::col2im`] over a zeroed image:
    /// each element of `out [n, c, h, w]` is written with the sum of the column entries that
    /// read it (no zeroing needed; no atomics: each output element gathers its own taps).
    pub fn col2im(
        &self,
        dt: DType,
        cols: DevicePtr,
        n: usize,
        win: &Window,
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        let (w, _) = params::window("col2im", n, win)?;
        let total = count("col2im", &[n, win.c, win.h, win.w])?;
        if total == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::Col2im, dt, "col2im", blocks_for(total); cols.0, n as u64, w, out.0)
    }

    /// For each pooling window of `x [n, c, h, w]`, the flat index into `x` (as `u32`) of its
    /// maximum, as [`crate::cpu::max_pool_indices`] with `base` the image's offset: `idx` is
    /// `[n, c, ho, wo]`. `x` must have at most 2³² elements, and every window must overlap the
    /// image (padding is never chosen).
    pub fn max_pool_indices(
        &self,
        dt: DType,
        x: DevicePtr,
        n: usize,
        win: &Window,
        idx: DevicePtr,
    ) -> Result<(), CudaError> {
        const OP: &str = "max_pool_indices";
        let (w, _) = params::window(OP, n, win)?;
        let total_in = count(OP, &[n, win.c, win.h, win.w])?;
        if total_in > 1 << 32 {
            return Err(invalid(
                OP,
                format!("{total_in} input elements cannot be indexed by u32"),
            ));
        }
        let (ho, wo) = (w.ho as usize, w.wo as usize);
        let touches = params::every_window_touches_input(win.h, win.kh, win.sh, win.ph, win.dh, ho)
            && params::every_window_touches_input(win.w, win.kw, win.sw, win.pw, win.dw, wo);
        if !touches {
            return Err(invalid(
                OP,
                format!("{win:?} has a window wholly in the padding"),
            ));
        }
        let total = count(OP, &[n, win.c, ho, wo])?;
        if total == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::MaxPoolIndices, dt, "max_pool_indices", blocks_for(total);
            x.0, n as u64, w, idx.0)
    }

    /// `out[i] = x[idx[i]]` for `i < n` (`idx`: `u32`), as [`crate::cpu::take`], with `x` of
    /// `x_len` elements: an index past it reads NaN (checked on the device, as `gather`), so a
    /// bad index cannot fault the context.
    pub fn take(
        &self,
        dt: DType,
        x: DevicePtr,
        x_len: usize,
        idx: DevicePtr,
        n: usize,
        out: DevicePtr,
    ) -> Result<(), CudaError> {
        let n = n as u64;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::Take, dt, "take", blocks_for(n); x.0, x_len as u64, idx.0, n, out.0)
    }

    /// `out[idx[i]] += g[i]` for `i < n`, atomically (`idx`: `u32`; `out` of `out_len`
    /// elements, zeroed by the caller), as [`crate::cpu::put_add`]: an index past `out` adds
    /// nothing (checked on the device).
    pub fn put_add(
        &self,
        dt: DType,
        g: DevicePtr,
        idx: DevicePtr,
        n: usize,
        out: DevicePtr,
        out_len: usize,
    ) -> Result<(), CudaError> {
        let n = n as u64;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::PutAdd, dt, "put_add", blocks_for(n); g.0, idx.0, n, out.0, out_len as u64)
    }
}

/// (outer, extent, inner, index extent) of a gather over `shape` along `axis` with indices of
/// `ishape`, which must equal `shape` except at `axis`.
fn gather_geometry(
    op: &'static str,
    shape: &[usize],
    axis: usize,
    ishape: &[usize],
) -> Result<(u64, u64, u64, u64), CudaError> {
    let (outer, ext, inner) = around_axis(op, shape, axis)?;
    let same_elsewhere = ishape.len() == shape.len()
        && shape
            .iter()
            .zip(ishape)
            .enumerate()
            .all(|(d, (a, b))| d == axis || a == b);
    if !same_elsewhere {
        return Err(invalid(
            op,
            format!("index shape {ishape:?} differs from {shape:?} away from axis {axis}"),
        ));
    }
    count(op, ishape)?;
    Ok((outer, ext, inner, ishape[axis] as u64))
}
