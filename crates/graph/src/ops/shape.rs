//! Ops that move data: reshape, permute/transpose, broadcast, concat, slice, index-select, gather.
//! `reshape` is a view (a new node on the same buffer); the others copy into a fresh contiguous
//! buffer, so every tensor is contiguous and kernels need no stride logic beyond broadcasting.
//! (Matmul reads transposes as strides on its own.)

use std::sync::Arc;

use arenagrad_alloc::BufId;
use arenagrad_exec::cpu;
use arenagrad_exec::layout::broadcast_shapes;
#[cfg(feature = "cuda")]
use arenagrad_exec::layout::{broadcast_strides, contiguous_strides};
use arenagrad_exec::{bf16, f16, Bool, DType, Storage};
use smallvec::{smallvec, SmallVec};

use super::{check_pair, Ctx, Grads, Op};
use crate::device::on_cuda;
use crate::error::{GraphError, Result};
use crate::graph::Inner;
use crate::host::try_vec;
use crate::shape::{checked_numel, copy_of, norm_axis, Shape};
use crate::{Device, Graph, Tensor};

impl<'g> Tensor<'g> {
    /// Runs `kernel(x, out)` into a new buffer of `out_shape` and records `op`.
    pub(crate) fn data_op(
        self,
        name: &'static str,
        out_shape: Shape,
        op: Op,
        zeroed: bool,
        kernel: impl FnOnce(KernelArgs<'_>),
    ) -> Result<Tensor<'g>> {
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (shape, dtype, dev, xb) = {
            let n = i.node(name, self.id)?;
            (copy_of(&n.shape), n.dtype, n.device(), n.buf)
        };
        if !dtype.is_native() && dev != Device::Cpu {
            drop(guard);
            return Tensor::lower([self], |[x]| x.data_op(name, out_shape, op, zeroed, kernel));
        }
        let len = checked_numel(name, &out_shape)?;
        let out = if zeroed {
            i.alloc_zeroed_on(name, dev, dtype, len)?
        } else {
            i.alloc_on(name, dev, dtype, len)?
        };
        match dev {
            // An empty result is computed by doing nothing: a kernel's loops over the other
            // axes (2^40 rows of nothing, say) would take hours to write no element.
            _ if len == 0 => {}
            Device::Cpu => with_storage!(dtype, T, {
                let (o, [x]) = i.split_mut::<T, 1>(name, out, [xb])?;
                kernel(T::args(x, o, &shape));
            }),
            Device::Cuda(_) => {
                device_move(i, name, dev, dtype, &op, (&shape, xb), (&out_shape, out))?
            }
        }
        let id = i.push(out_shape, dtype, out, op, &[self.id]);
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// The same elements in another shape; one extent may be `-1` (inferred).
    pub fn reshape(self, shape: &[isize]) -> Result<Tensor<'g>> {
        let op = "reshape";
        let from = self.try_shape()?;
        let n: usize = from.iter().product();
        let bad = || GraphError::BadReshape {
            op,
            from: from.to_vec(),
            to: shape.to_vec(),
        };
        let mut infer = None;
        let mut known = 1usize;
        let mut out: Shape = SmallVec::with_capacity(shape.len());
        for (k, &d) in shape.iter().enumerate() {
            match d {
                -1 if infer.is_none() => {
                    infer = Some(k);
                    out.push(0);
                }
                d if d >= 0 => {
                    known = known.checked_mul(d as usize).ok_or_else(bad)?;
                    out.push(d as usize);
                }
                _ => return Err(bad()),
            }
        }
        if let Some(k) = infer {
            if known == 0 || !n.is_multiple_of(known) {
                return Err(bad());
            }
            out[k] = n / known;
        } else if known != n {
            return Err(bad());
        }
        // zeros' check: a shape of no elements can still have extents whose strides overflow
        // (`[0, 2^62, 2^62]`), which no op could then index.
        checked_numel(op, &out)?;
        if out == from {
            return Ok(self);
        }
        // Tensors are contiguous, so a reshape is a view: a new node sharing the buffer.
        let mut i = self.g.inner();
        let (dtype, buf) = {
            let n = i.node(op, self.id)?;
            (n.dtype, n.buf)
        };
        let dev = i.device_of(op, self.id)?;
        i.retain_buf(op, dev, buf)?;
        let id = i.push(out, dtype, buf, Op::Reshape, &[self.id]);
        drop(i);
        Ok(self.g.handle(id))
    }

    /// Flattens to one dimension.
    pub fn flatten(self) -> Result<Tensor<'g>> {
        self.reshape(&[-1])
    }

    /// Reorders the axes: output axis `k` is input axis `perm[k]`.
    pub fn permute(self, perm: &[usize]) -> Result<Tensor<'g>> {
        let op = "permute";
        let shape = self.try_shape()?;
        let mut seen = vec![false; shape.len()];
        let valid = perm.len() == shape.len()
            && perm
                .iter()
                .all(|&p| p < shape.len() && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(GraphError::BadPermutation {
                op,
                perm: perm.to_vec(),
                shape: shape.to_vec(),
            });
        }
        let out: Shape = perm.iter().map(|&p| shape[p]).collect();
        let p: Arc<[usize]> = Arc::from(perm);
        let pk = p.clone();
        let threads = self.g.threads();
        self.data_op(op, out, Op::Permute(p), false, move |a| {
            a.permute(&pk, threads)
        })
    }

    /// Swaps two axes (negative axes count from the end).
    pub fn transpose(self, d0: isize, d1: isize) -> Result<Tensor<'g>> {
        let shape = self.try_shape()?;
        let a = norm_axis("transpose", d0, &shape)?;
        let b = norm_axis("transpose", d1, &shape)?;
        let mut perm: Vec<usize> = (0..shape.len()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Swaps the last two axes.
    pub fn t(self) -> Result<Tensor<'g>> {
        self.transpose(-2, -1)
    }

    /// Broadcasts to `shape` (numpy rules).
    pub fn broadcast_to(self, shape: &[usize]) -> Result<Tensor<'g>> {
        let op = "broadcast";
        let from = self.try_shape()?;
        if from.as_slice() == shape {
            return Ok(self);
        }
        match broadcast_shapes(&from, shape) {
            Some(b) if b == shape => {}
            _ => {
                return Err(GraphError::ShapeMismatch {
                    op,
                    lhs: from.to_vec(),
                    rhs: shape.to_vec(),
                })
            }
        }
        let to = copy_of(shape);
        let tk = to.clone();
        let threads = self.g.threads();
        self.data_op(op, to, Op::BroadcastTo, false, move |a| {
            a.broadcast(&tk, threads)
        })
    }

    /// Elements `start..end` along `axis`.
    pub fn slice(self, axis: isize, start: usize, end: usize) -> Result<Tensor<'g>> {
        let op = "slice";
        let shape = self.try_shape()?;
        let ax = norm_axis(op, axis, &shape)?;
        check_range(op, &shape, ax, start, end)?;
        let mut out = shape.clone();
        out[ax] = end - start;
        self.data_op(op, out, Op::Slice { axis: ax, start }, false, move |a| {
            a.narrow(ax, start, end - start)
        })
    }

    /// Every `step`-th element of `start..end` along `axis`, PyTorch's `x[start:end:step]`
    /// (`step ≥ 1`). A gather of those entries, so the gradient is scattered back to them.
    pub fn slice_step(
        self,
        axis: isize,
        start: usize,
        end: usize,
        step: usize,
    ) -> Result<Tensor<'g>> {
        let op = "slice_step";
        let shape = self.try_shape()?;
        let ax = norm_axis(op, axis, &shape)?;
        if step == 0 {
            return Err(GraphError::BadArgument {
                op,
                what: "the step must be at least 1",
            });
        }
        check_range(op, &shape, ax, start, end)?;
        let count = (end - start).div_ceil(step);
        let mut out = shape.clone();
        out[ax] = count;
        if step == 1 || out.contains(&0) {
            // No elements picked (or all of a run): the plain slice of as many is the same
            // tensor with the same (zero) gradient, and needs no index list, which for an
            // empty result of a long axis would be the only large thing made.
            return self.slice(axis, start, start + count);
        }
        let mut idx = try_vec(op, &out, count)?;
        idx.extend((start..end).step_by(step));
        self.index_select(axis, &idx)
    }

    /// `len` elements from `start` along `axis` (PyTorch's `narrow`).
    pub fn narrow(self, axis: isize, start: usize, len: usize) -> Result<Tensor<'g>> {
        let end = start.checked_add(len).ok_or(GraphError::BadArgument {
            op: "narrow",
            what: "start + len overflows",
        })?;
        self.slice(axis, start, end)
    }

    /// Overwrites `self[…, start..start + n, …]` along `axis` with `src` (of `self`'s shape but
    /// `n` along `axis`), in place: PyTorch's `x[..., a:b] = src` on a tensor that does not
    /// require grad. What a loop writes into a buffer of an enclosing [`Graph::scope`] (a
    /// key/value cache filled one position per step). Refused, with nothing written, when
    /// `self` requires grad or an op recorded for backward reads its memory (its gradient would
    /// silently change). `src` of another dtype is converted to `self`'s first, as PyTorch's
    /// assignment converts; a 16-bit `self` is written on the host only (a CUDA device holds no
    /// 16-bit tensors).
    pub fn slice_write(self, axis: isize, start: usize, src: Tensor<'g>) -> Result<()> {
        let op = "slice_write";
        super::pair_dtypes(op, &self, &src)?;
        let dtype = self.dtype_of(op)?;
        if dtype.is_half() && self.device() != Device::Cpu {
            return Err(GraphError::UnsupportedDType { op, dtype });
        }
        let (ds, ss) = (self.try_shape()?, src.try_shape()?);
        let ax = norm_axis(op, axis, &ds)?;
        same_but_axis(op, &ds, &ss, ax)?;
        let end = start.checked_add(ss[ax]).filter(|&e| e <= ds[ax]);
        let Some(end) = end else {
            return Err(GraphError::BadRange {
                op,
                axis: ax,
                start,
                end: start.saturating_add(ss[ax]),
                shape: ds.to_vec(),
            });
        };
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (db, dtype, dev, needs) = {
            let n = i.node(op, self.id)?;
            (n.buf, n.dtype, n.device(), n.requires_grad)
        };
        if needs {
            return Err(GraphError::BadArgument {
                op,
                what: "writes into a tensor that requires grad",
            });
        }
        let read_by_tape = i.tape.iter().any(|&t| {
            i.nodes.get(t).is_some_and(|n| {
                n.inputs.iter().any(|&x| {
                    i.nodes
                        .get(x)
                        .is_some_and(|xn| xn.buf == db && xn.device() == dev)
                })
            })
        });
        if read_by_tape {
            return Err(GraphError::BadArgument {
                op,
                what: "an op recorded for backward reads this tensor; write before recording",
            });
        }
        if start == end {
            return Ok(());
        }
        drop(guard);
        let src = if src.dtype_of(op)? == dtype {
            src
        } else {
            src.to_dtype(dtype)?
        };
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let sb = i.node(op, src.id)?.buf;
        match dev {
            Device::Cpu => with_storage!(dtype, T, {
                let (d, [x]) = i.split_mut::<T, 1>(op, db, [sb])?;
                cpu::place_along(x, &ss, ax, d, ds[ax], start);
            }),
            Device::Cuda(_) => {
                on_cuda!(i, op, dev, [sb, db], |be, [x, o]| {
                    let dst_st = arenagrad_exec::layout::contiguous_strides(&ds);
                    let src_st = arenagrad_exec::layout::contiguous_strides(&ss);
                    let off = start * dst_st[ax];
                    be.copy_strided(
                        dtype,
                        &ss,
                        cpu::Strided::new(x, 0, &src_st),
                        cpu::Strided::new(o, off, &dst_st),
                    )
                });
            }
        }
        Ok(())
    }

    /// Zeros of `extent` along `axis` with `self` placed at `start` (slice's adjoint).
    pub(crate) fn place(self, axis: usize, start: usize, extent: usize) -> Result<Tensor<'g>> {
        let mut out = self.try_shape()?;
        out[axis] = extent;
        self.data_op(
            "slice_backward",
            out,
            Op::SliceBackward { axis, start },
            true,
            move |a| a.place(axis, extent, start),
        )
    }

    /// The entries `idx` along `axis`, in that order (indices may repeat).
    pub fn index_select(self, axis: isize, idx: &[usize]) -> Result<Tensor<'g>> {
        let op = "index_select";
        let shape = self.try_shape()?;
        let ax = norm_axis(op, axis, &shape)?;
        if let Some(&bad) = idx.iter().find(|&&k| k >= shape[ax]) {
            return Err(GraphError::IndexOutOfRange {
                op,
                index: bad,
                axis: ax,
                shape: shape.to_vec(),
            });
        }
        let mut out = shape.clone();
        out[ax] = idx.len();
        let idx: Arc<[usize]> = Arc::from(idx);
        let ik = idx.clone();
        let threads = self.g.threads();
        self.data_op(
            op,
            out,
            Op::IndexSelect { axis: ax, idx },
            false,
            move |a| a.index_select(ax, &ik, threads),
        )
    }

    pub(crate) fn index_add_into(
        self,
        axis: usize,
        idx: Arc<[usize]>,
        extent: usize,
    ) -> Result<Tensor<'g>> {
        let mut out = self.try_shape()?;
        out[axis] = extent;
        let full = out.clone();
        let ik = idx.clone();
        let threads = self.g.threads();
        self.data_op(
            "index_add",
            out,
            Op::IndexAdd { axis, idx },
            true,
            move |a| a.index_add(axis, &ik, &full, threads),
        )
    }

    /// PyTorch's gather: `out[p] = self[p with axis coordinate idx[p]]`. `idx` is row-major with
    /// shape `idx_shape`, which has this shape's rank and along every other axis no more than
    /// this shape's extent (as PyTorch's: the output reads the leading part there); along
    /// `axis` any extent.
    pub fn gather(self, axis: isize, idx: &[usize], idx_shape: &[usize]) -> Result<Tensor<'g>> {
        let op = "gather";
        let shape = self.try_shape()?;
        let ax = norm_axis(op, axis, &shape)?;
        leading_part(op, None, &shape, idx_shape, ax)?;
        let n = checked_numel(op, idx_shape)?;
        if n != idx.len() {
            return Err(GraphError::DataLength {
                op,
                shape: idx_shape.to_vec(),
                expected: n,
                got: idx.len(),
            });
        }
        if let Some(&bad) = idx.iter().find(|&&k| k >= shape[ax]) {
            return Err(GraphError::IndexOutOfRange {
                op,
                index: bad,
                axis: ax,
                shape: shape.to_vec(),
            });
        }
        // Checked whole before anything is recorded; then the part the index reads.
        if let Some(part) = leading_part(op, Some(self), &shape, idx_shape, ax)? {
            return part.gather(axis, idx, idx_shape);
        }
        let out = copy_of(idx_shape);
        let idx: Arc<[usize]> = Arc::from(idx);
        let (ik, ish) = (idx.clone(), out.clone());
        self.data_op(op, out, Op::Gather { axis: ax, idx }, false, move |a| {
            a.gather(ax, &ik, &ish)
        })
    }

    pub(crate) fn scatter_add_into(
        self,
        axis: usize,
        idx: Arc<[usize]>,
        full: Shape,
    ) -> Result<Tensor<'g>> {
        let ish = self.try_shape()?;
        let ik = idx.clone();
        let fk = full.clone();
        self.data_op(
            "scatter_add",
            full,
            Op::ScatterAdd { axis, idx },
            true,
            move |a| a.scatter_add(axis, &ik, &ish, &fk),
        )
    }
}

impl Graph {
    /// [`Graph::concat`] of parts some of which are stored in a 16-bit dtype: joined in their
    /// promoted dtype (as [`Tensor::to_dtype`] and PyTorch's `cat` promote).
    fn concat_lowered<'g>(
        &'g self,
        op: &'static str,
        parts: &[Tensor<'g>],
        axis: isize,
    ) -> Result<Tensor<'g>> {
        let out = super::half::promoted_of(op, parts)?;
        let wide = parts
            .iter()
            .map(|p| p.to_dtype(out.compute()))
            .collect::<Result<Vec<_>>>()?;
        self.concat_as(op, &wide, axis)?.to_dtype(out)
    }

    /// Joins tensors along `axis`; all other extents must agree.
    pub fn concat<'g>(&'g self, parts: &[Tensor<'g>], axis: isize) -> Result<Tensor<'g>> {
        self.concat_as("concat", parts, axis)
    }

    /// [`Graph::concat`], its errors naming `op` (the op the user called: `stack` joins
    /// through here).
    fn concat_as<'g>(
        &'g self,
        op: &'static str,
        parts: &[Tensor<'g>],
        axis: isize,
    ) -> Result<Tensor<'g>> {
        let first = parts.first().ok_or(GraphError::BadArgument {
            op,
            what: "needs at least one tensor",
        })?;
        let ids = self.owns_all(op, parts)?;
        // Parts of one 16-bit dtype on the host join as stored; mixed with another dtype (or
        // on a device) they meet in the promoted dtype.
        let d0 = first.dtype_of(op)?;
        let mut mixed_half = false;
        for p in parts {
            let d = p.dtype_of(op)?;
            mixed_half |=
                (d.is_half() || d0.is_half()) && (d != d0 || first.device() != Device::Cpu);
        }
        if mixed_half {
            return self.concat_lowered(op, parts, axis);
        }
        let s0 = first.try_shape()?;
        let ax = norm_axis(op, axis, &s0)?;
        let mut total = 0usize;
        for p in parts {
            check_pair(op, first, p)?;
            let s = p.try_shape()?;
            let ok = s.len() == s0.len()
                && s.iter()
                    .zip(&s0)
                    .enumerate()
                    .all(|(d, (a, b))| d == ax || a == b);
            if !ok {
                return Err(GraphError::ShapeMismatch {
                    op,
                    lhs: s0.to_vec(),
                    rhs: s.to_vec(),
                });
            }
            total = total.checked_add(s[ax]).ok_or(GraphError::TooLarge {
                op,
                shape: s0.to_vec(),
            })?;
        }
        let mut out_shape = s0.clone();
        out_shape[ax] = total;
        let mut guard = self.inner();
        let i = &mut *guard;
        let (dtype, dev) = {
            let n = i.node(op, first.id)?;
            (n.dtype, n.device())
        };
        let len = checked_numel(op, &out_shape)?;
        let out = i.alloc_on(op, dev, dtype, len)?;
        let mut start = 0;
        // An empty result takes nothing from its parts (placing 2^40 rows of nothing took
        // hours).
        let parts = if len == 0 { &[][..] } else { parts };
        for p in parts {
            let (shape, buf) = {
                let n = i.node(op, p.id)?;
                (copy_of(&n.shape), n.buf)
            };
            match dev {
                Device::Cpu => with_storage!(dtype, T, {
                    let (o, [x]) = i.split_mut::<T, 1>(op, out, [buf])?;
                    cpu::place_along(x, &shape, ax, o, total, start);
                }),
                Device::Cuda(_) => device_move(
                    i,
                    op,
                    dev,
                    dtype,
                    &Op::SliceBackward { axis: ax, start },
                    (&shape, buf),
                    (&out_shape, out),
                )?,
            }
            start += shape[ax];
        }
        let id = i.push(out_shape, dtype, out, Op::Concat { axis: ax }, &ids);
        drop(guard);
        Ok(self.handle(id))
    }
}

/// Refuses `start..end` unless it lies within axis `axis` of `shape`.
fn check_range(
    op: &'static str,
    shape: &[usize],
    axis: usize,
    start: usize,
    end: usize,
) -> Result<()> {
    if start > end || end > shape[axis] {
        return Err(GraphError::BadRange {
            op,
            axis,
            start,
            end,
            shape: shape.to_vec(),
        });
    }
    Ok(())
}

/// `t` (of `shape`) narrowed to `to`'s extents on every axis but `axis` when `to` is smaller
/// somewhere there — the part of `t` an index of shape `to` addresses, as PyTorch's gather and
/// scatter read it — or `None` when `to` matches `shape` but along `axis` (or `t` is `None`:
/// the check alone, recording nothing). `to` must have `shape`'s rank and no larger extent off
/// `axis`, else a shape mismatch naming `op`.
pub(crate) fn leading_part<'g>(
    op: &'static str,
    t: Option<Tensor<'g>>,
    shape: &[usize],
    to: &[usize],
    axis: usize,
) -> Result<Option<Tensor<'g>>> {
    let fits = to.len() == shape.len()
        && to
            .iter()
            .zip(shape)
            .enumerate()
            .all(|(d, (a, b))| d == axis || a <= b);
    if !fits {
        return Err(GraphError::ShapeMismatch {
            op,
            lhs: shape.to_vec(),
            rhs: to.to_vec(),
        });
    }
    let Some(t) = t else {
        return Ok(None);
    };
    let mut part = None;
    for (d, (&a, &b)) in to.iter().zip(shape).enumerate() {
        if d != axis && a < b {
            part = Some(part.unwrap_or(t).narrow(d as isize, 0, a)?);
        }
    }
    Ok(part)
}

/// Refuses `other` unless it has `shape`'s rank and extents, except along `axis`.
pub(crate) fn same_but_axis(
    op: &'static str,
    shape: &[usize],
    other: &[usize],
    axis: usize,
) -> Result<()> {
    let same = other.len() == shape.len()
        && other
            .iter()
            .zip(shape)
            .enumerate()
            .all(|(d, (a, b))| d == axis || a == b);
    if same {
        Ok(())
    } else {
        Err(GraphError::ShapeMismatch {
            op,
            lhs: shape.to_vec(),
            rhs: other.to_vec(),
        })
    }
}

/// A data-moving op on a device, read from its recorded [`Op`]: permute, broadcast, narrow and
/// place are strided copies; the index ops upload their indices as `u32`. The input and the
/// output are each a shape with its buffer.
#[cfg(not(feature = "cuda"))]
fn device_move(
    _i: &mut Inner,
    _name: &'static str,
    dev: Device,
    _dtype: DType,
    _op: &Op,
    _x: (&[usize], BufId),
    _out: (&[usize], BufId),
) -> Result<()> {
    Err(crate::device::no_cuda_dev(dev))
}

/// See the other `device_move`.
#[cfg(feature = "cuda")]
fn device_move(
    i: &mut Inner,
    name: &'static str,
    dev: Device,
    dtype: DType,
    op: &Op,
    (xs, xb): (&[usize], BufId),
    (os, out): (&[usize], BufId),
) -> Result<()> {
    let xst = contiguous_strides(xs);
    let ost = contiguous_strides(os);
    let split = |axis: usize, s: &[usize]| -> (usize, usize) {
        (s[..axis].iter().product(), s[axis + 1..].iter().product())
    };
    match op {
        Op::Permute(perm) => {
            let src: Vec<usize> = perm.iter().map(|&p| xst[p]).collect();
            on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be.copy_strided(
                dtype,
                os,
                cpu::Strided::new(x, 0, &src),
                cpu::Strided::new(o, 0, &ost)
            ));
        }
        Op::BroadcastTo => {
            let src = broadcast_strides(xs, os);
            on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be.copy_strided(
                dtype,
                os,
                cpu::Strided::new(x, 0, &src),
                cpu::Strided::new(o, 0, &ost)
            ));
        }
        Op::Slice { axis, start } => {
            let off = start * xst[*axis];
            on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be.copy_strided(
                dtype,
                os,
                cpu::Strided::new(x, off, &xst),
                cpu::Strided::new(o, 0, &ost)
            ));
        }
        Op::SliceBackward { axis, start } => {
            let off = start * ost[*axis];
            on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be.copy_strided(
                dtype,
                xs,
                cpu::Strided::new(x, 0, &xst),
                cpu::Strided::new(o, off, &ost)
            ));
        }
        Op::IndexSelect { axis, idx } => {
            let (outer, inner) = split(*axis, xs);
            let ib = i.upload_indices(name, dev, idx)?;
            let len = xs[*axis];
            on_cuda!(i, name, dev, [xb, ib, out], |be, [x, p, o]| be
                .index_select(dtype, x, [outer, len, inner], p, idx.len(), o));
            i.release_buf(dev, ib)?;
        }
        Op::IndexAdd { axis, idx } => {
            let (outer, inner) = split(*axis, xs);
            let ib = i.upload_indices(name, dev, idx)?;
            let len = os[*axis];
            on_cuda!(i, name, dev, [xb, ib, out], |be, [x, p, o]| be.index_add(
                dtype,
                x,
                [outer, idx.len(), inner],
                p,
                len,
                o
            ));
            i.release_buf(dev, ib)?;
        }
        Op::Gather { axis, idx } => {
            let ib = i.upload_indices(name, dev, idx)?;
            on_cuda!(i, name, dev, [xb, ib, out], |be, [x, p, o]| be.gather(
                dtype,
                cpu::Operand::new(x, xs),
                *axis,
                cpu::Operand::new(p, os),
                o
            ));
            i.release_buf(dev, ib)?;
        }
        Op::ScatterAdd { axis, idx } => {
            let ib = i.upload_indices(name, dev, idx)?;
            on_cuda!(i, name, dev, [xb, ib, out], |be, [x, p, o]| be.scatter_add(
                dtype,
                cpu::Operand::new(x, xs),
                *axis,
                p,
                cpu::Operand::new(o, os)
            ));
            i.release_buf(dev, ib)?;
        }
        Op::Unfold(_) | Op::Fold(_) => {
            super::conv::fold_on_cuda(i, name, dev, dtype, op, (xs, xb), (os, out))?
        }
        _ => {
            return Err(GraphError::BadArgument {
                op: name,
                what: "not a data-moving op",
            })
        }
    }
    Ok(())
}

/// The slices a data-moving kernel gets, typed by the dtype dispatch.
pub(crate) enum KernelArgs<'a> {
    F32(&'a [f32], &'a mut [f32], &'a [usize]),
    F64(&'a [f64], &'a mut [f64], &'a [usize]),
    BF16(&'a [bf16], &'a mut [bf16], &'a [usize]),
    F16(&'a [f16], &'a mut [f16], &'a [usize]),
    I64(&'a [i64], &'a mut [i64], &'a [usize]),
    I32(&'a [i32], &'a mut [i32], &'a [usize]),
    U8(&'a [u8], &'a mut [u8], &'a [usize]),
    Bool(&'a [Bool], &'a mut [Bool], &'a [usize]),
}

pub(crate) trait IntoArgs: Sized {
    fn args<'a>(x: &'a [Self], o: &'a mut [Self], shape: &'a [usize]) -> KernelArgs<'a>;
}

macro_rules! into_args {
    ($($t:ty => $v:ident),*) => {$(
        impl IntoArgs for $t {
            fn args<'a>(x: &'a [$t], o: &'a mut [$t], shape: &'a [usize]) -> KernelArgs<'a> {
                KernelArgs::$v(x, o, shape)
            }
        }
    )*};
}
into_args!(f32 => F32, f64 => F64, bf16 => BF16, f16 => F16, i64 => I64, i32 => I32, u8 => U8, Bool => Bool);

/// Runs `$body` on the slices of a kernel that only moves elements: for every dtype as stored.
macro_rules! moves {
    ($self:expr, $x:ident, $o:ident, $s:ident => $body:expr) => {
        match $self {
            KernelArgs::F32($x, $o, $s) => $body,
            KernelArgs::F64($x, $o, $s) => $body,
            KernelArgs::BF16($x, $o, $s) => $body,
            KernelArgs::F16($x, $o, $s) => $body,
            KernelArgs::I64($x, $o, $s) => $body,
            KernelArgs::I32($x, $o, $s) => $body,
            KernelArgs::U8($x, $o, $s) => $body,
            KernelArgs::Bool($x, $o, $s) => $body,
        }
    };
}

/// Runs `$body` on the slices of a kernel that adds: `f32` and `f64` as stored, the 16-bit
/// dtypes on f32 copies of the input and the output, whose sums are rounded once into it.
macro_rules! both {
    ($self:expr, $x:ident, $o:ident, $s:ident => $body:expr) => {
        match $self {
            KernelArgs::F32($x, $o, $s) => $body,
            KernelArgs::F64($x, $o, $s) => $body,
            KernelArgs::BF16(x, o, $s) => $crate::ops::shape::through_f32(x, o, |$x, $o| $body),
            KernelArgs::F16(x, o, $s) => $crate::ops::shape::through_f32(x, o, |$x, $o| $body),
            KernelArgs::I64(x, o, $s) => $crate::ops::shape::through_f64(x, o, |$x, $o| $body),
            KernelArgs::I32(x, o, $s) => $crate::ops::shape::through_f64(x, o, |$x, $o| $body),
            KernelArgs::U8(x, o, $s) => $crate::ops::shape::through_f64(x, o, |$x, $o| $body),
            KernelArgs::Bool(x, o, $s) => $crate::ops::shape::through_f64(x, o, |$x, $o| $body),
        }
    };
}
pub(crate) use {both, moves};

/// `f` on f32 copies of a 16-bit input and output (the output's values kept: an adding kernel
/// adds into it), the output rounded back once.
pub(crate) fn through_f32<H: Storage>(x: &[H], o: &mut [H], f: impl FnOnce(&[f32], &mut [f32])) {
    let wx = cpu::cast::widened(x);
    cpu::cast::update_in_f32(o, |wo| f(&wx, wo))
}

/// `f` on f64 copies of an integer input and output, the output's sums stored back (exact
/// while they stay below 2⁵³; a `bool` output holds whether its sum is non-zero).
pub(crate) fn through_f64<I: Storage>(x: &[I], o: &mut [I], f: impl FnOnce(&[f64], &mut [f64])) {
    let wx: Vec<f64> = x.iter().map(|v| v.widen()).collect();
    let mut wo: Vec<f64> = o.iter().map(|v| v.widen()).collect();
    f(&wx, &mut wo);
    for (d, &v) in o.iter_mut().zip(&wo) {
        *d = I::narrow(v);
    }
}

impl KernelArgs<'_> {
    fn permute(self, perm: &[usize], threads: usize) {
        moves!(self, x, o, s => cpu::permute_par(x, s, perm, o, threads))
    }
    fn broadcast(self, to: &[usize], threads: usize) {
        moves!(self, x, o, s => cpu::broadcast_to_par(x, s, to, o, threads))
    }
    fn narrow(self, axis: usize, start: usize, len: usize) {
        moves!(self, x, o, s => cpu::narrow(x, s, axis, start, len, o))
    }
    fn place(self, axis: usize, extent: usize, start: usize) {
        moves!(self, x, o, s => cpu::place_along(x, s, axis, o, extent, start))
    }
    fn index_select(self, axis: usize, idx: &[usize], threads: usize) {
        moves!(self, x, o, s => cpu::index_select_par(x, s, axis, idx, o, threads))
    }
    fn index_add(self, axis: usize, idx: &[usize], full: &[usize], threads: usize) {
        both!(self, x, o, _s => cpu::index_add_par(x, full, axis, idx, o, threads))
    }
    fn gather(self, axis: usize, idx: &[usize], ishape: &[usize]) {
        moves!(self, x, o, s => cpu::gather(x, s, axis, idx, ishape, o))
    }
    fn scatter_add(self, axis: usize, idx: &[usize], ishape: &[usize], full: &[usize]) {
        both!(self, x, o, _s => cpu::scatter_add(x, full, axis, idx, ishape, o))
    }
}

/// The backward rules of the shape ops, one function per op (dispatched from [`super::backward`]).
fn one<'g>(g: Tensor<'g>) -> Result<Grads<'g>> {
    Ok(smallvec![Some(g)])
}

pub(crate) fn reshape_backward<'g>(c: &Ctx<'g>) -> Result<Grads<'g>> {
    let s: Vec<isize> = c.input(0).shape().iter().map(|&d| d as isize).collect();
    one(c.gy.reshape(&s)?)
}

pub(crate) fn permute_backward<'g>(p: &[usize], c: &Ctx<'g>) -> Result<Grads<'g>> {
    let mut inv = vec![0; p.len()];
    for (k, &pk) in p.iter().enumerate() {
        inv[pk] = k;
    }
    one(c.gy.permute(&inv)?)
}

pub(crate) fn broadcast_backward<'g>(c: &Ctx<'g>) -> Result<Grads<'g>> {
    one(c.gy.sum_to(&c.input(0).shape())?)
}

pub(crate) fn slice_backward<'g>(axis: usize, start: usize, c: &Ctx<'g>) -> Result<Grads<'g>> {
    one(c.gy.place(axis, start, c.input(0).shape()[axis])?)
}

/// Slice's backward added straight into the gradient its input already holds, when that
/// gradient is a temporary only the walk holds (as the other slices of one tensor — a fused
/// projection's queries, keys and values — find it): no zeroed full-size gradient per slice,
/// and the same sums (the other elements add zeros). `gid` is the slice's incoming gradient;
/// `false` when the input holds no such gradient yet.
pub(crate) fn slice_backward_into_slot(
    i: &mut Inner,
    (axis, start): (usize, usize),
    input: crate::graph::NodeId,
    gid: crate::graph::NodeId,
) -> Result<bool> {
    let op = "slice_backward";
    let n = i.node(op, input)?;
    if !n.requires_grad || n.tape_pos == crate::graph::NO_POS {
        return Ok(false);
    }
    let (full, dtype) = (copy_of(&n.shape), n.dtype);
    let Some(&Some(old)) = i.grad_slots.get(n.tape_pos as usize) else {
        return Ok(false);
    };
    let (on, gn) = (i.node(op, old)?, i.node(op, gid)?);
    if !on.temp
        || on.grad_refs != 1
        || on.device() != Device::Cpu
        || gn.device() != Device::Cpu
        || on.dtype != dtype
        || gn.dtype != dtype
        || on.shape[..] != full[..]
    {
        return Ok(false);
    }
    let (ob, gb, len) = (on.buf, gn.buf, gn.shape.get(axis).copied().unwrap_or(0));
    // The slice's gradient has the slice's shape (a rule handing back another is left to the
    // checked path, which reports it).
    let fits = gn.shape.len() == full.len()
        && start + len <= full[axis]
        && gn
            .shape
            .iter()
            .zip(&full)
            .enumerate()
            .all(|(a, (g, f))| a == axis || g == f);
    if !fits {
        return Ok(false);
    }
    let outer: usize = full[..axis].iter().product();
    let inner: usize = full[axis + 1..].iter().product();
    let (row, part) = (full[axis] * inner, len * inner);
    with_storage!(dtype, T, {
        match i.arena.split_unique::<T, 1>(ob, [gb]) {
            Ok((acc, [src])) => {
                for o in 0..outer {
                    let dst = &mut acc[o * row + start * inner..][..part];
                    for (a, &b) in dst.iter_mut().zip(&src[o * part..(o + 1) * part]) {
                        *a = T::sum_of(*a, b);
                    }
                }
            }
            // A view shares the gradient's buffer.
            Err(arenagrad_alloc::AllocError::NotUnique { .. }) => return Ok(false),
            Err(source) => return Err(GraphError::Alloc { op, source }),
        }
    });
    Ok(true)
}

/// The backward of slice's adjoint: slicing again.
pub(crate) fn slice_backward_backward<'g>(
    axis: usize,
    start: usize,
    c: &Ctx<'g>,
) -> Result<Grads<'g>> {
    let len = c.input(0).shape()[axis];
    one(c.gy.slice(axis as isize, start, start + len)?)
}

pub(crate) fn index_select_backward<'g>(
    axis: usize,
    idx: &Arc<[usize]>,
    c: &Ctx<'g>,
) -> Result<Grads<'g>> {
    one(c
        .gy
        .index_add_into(axis, idx.clone(), c.input(0).shape()[axis])?)
}

pub(crate) fn index_add_backward<'g>(
    axis: usize,
    idx: &Arc<[usize]>,
    c: &Ctx<'g>,
) -> Result<Grads<'g>> {
    one(c.gy.index_select(axis as isize, idx)?)
}

pub(crate) fn gather_backward<'g>(
    axis: usize,
    idx: &Arc<[usize]>,
    c: &Ctx<'g>,
) -> Result<Grads<'g>> {
    one(c
        .gy
        .scatter_add_into(axis, idx.clone(), c.input(0).shape())?)
}

pub(crate) fn scatter_add_backward<'g>(
    axis: usize,
    idx: &Arc<[usize]>,
    c: &Ctx<'g>,
) -> Result<Grads<'g>> {
    one(c.gy.gather(axis as isize, idx, &c.input(0).shape())?)
}

pub(crate) fn concat_backward<'g>(axis: usize, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let mut grads: Grads<'g> = SmallVec::new();
    let mut start = 0;
    for k in 0..c.inputs.len() {
        let p = c.input(k);
        let len = p.shape()[axis];
        grads.push(if p.requires_grad() {
            Some(c.gy.slice(axis as isize, start, start + len)?)
        } else {
            None
        });
        start += len;
    }
    Ok(grads)
}

impl<'g> Tensor<'g> {
    /// Pieces of `sizes[k]` elements along `axis`, in order (PyTorch's `split` with a list of
    /// sizes); the sizes must add up to the axis' extent. Each piece is a slice: gradients of
    /// the pieces land in their places.
    pub fn split(self, sizes: &[usize], axis: isize) -> Result<Vec<Tensor<'g>>> {
        let op = "split";
        let shape = self.try_shape()?;
        let ax = norm_axis(op, axis, &shape)?;
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if total != Some(shape[ax]) {
            return Err(GraphError::BadArgument {
                op,
                what: "the sizes must add up to the axis' extent",
            });
        }
        self.g.inner().reserve_nodes(op, sizes.len(), &shape)?;
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                let piece = self.slice(ax as isize, start, start + s);
                start += s;
                piece
            })
            .collect()
    }

    /// Up to `n` pieces along `axis` of ⌈extent / n⌉ elements, the last one smaller (PyTorch's
    /// `chunk`: fewer than `n` pieces when the extent runs out first; `n` empty pieces of an
    /// empty axis). `n` must be positive.
    pub fn chunk(self, n: usize, axis: isize) -> Result<Vec<Tensor<'g>>> {
        let op = "chunk";
        if n == 0 {
            return Err(GraphError::BadArgument {
                op,
                what: "needs at least one chunk",
            });
        }
        let shape = self.try_shape()?;
        let ax = norm_axis(op, axis, &shape)?;
        let d = shape[ax];
        // n empty pieces of an empty axis, as PyTorch; otherwise pieces of ⌈d/n⌉.
        let size = d.div_ceil(n);
        let pieces = if d == 0 { n } else { d.div_ceil(size) };
        // Each piece is a node: a count that one iteration cannot hold (a chunk of a
        // [2^40, 0] tensor into 2^40 pieces) is an error before the list of sizes is built.
        self.g.inner().reserve_nodes(op, pieces, &shape)?;
        let mut sizes = try_vec(op, &shape, pieces)?;
        if d == 0 {
            sizes.resize(n, 0);
        } else {
            sizes.extend((0..d).step_by(size).map(|s| size.min(d - s)));
        }
        self.split(&sizes, ax as isize)
    }

    /// The slices along `axis`, each without that axis (PyTorch's `unbind`).
    pub fn unbind(self, axis: isize) -> Result<Vec<Tensor<'g>>> {
        let shape = self.try_shape()?;
        let ax = norm_axis("unbind", axis, &shape)?;
        // A slice and a reshape per piece.
        self.g
            .inner()
            .reserve_nodes("unbind", shape[ax].saturating_mul(2), &shape)?;
        let rest: Vec<isize> = shape
            .iter()
            .enumerate()
            .filter(|&(k, _)| k != ax)
            .map(|(_, &d)| d as isize)
            .collect();
        (0..shape[ax])
            .map(|i| self.slice(ax as isize, i, i + 1)?.reshape(&rest))
            .collect()
    }
}

impl Graph {
    /// Joins tensors of one shape along a new axis (PyTorch's `stack`): `axis` ranges over
    /// `0..=rank`, or from −(rank + 1) counting back.
    pub fn stack<'g>(&'g self, parts: &[Tensor<'g>], axis: isize) -> Result<Tensor<'g>> {
        let op = "stack";
        let first = parts.first().ok_or(GraphError::BadArgument {
            op,
            what: "needs at least one tensor",
        })?;
        self.owns_all(op, parts)?;
        let s0 = first.try_shape()?;
        let mut grown = s0.to_vec();
        grown.push(1);
        let ax = norm_axis(op, axis, &grown)?;
        let mut expanded: Vec<isize> = s0.iter().map(|&d| d as isize).collect();
        expanded.insert(ax, 1);
        let mut views = Vec::with_capacity(parts.len());
        for p in parts {
            let s = p.try_shape()?;
            if s != s0 {
                return Err(GraphError::ShapeMismatch {
                    op,
                    lhs: s0.to_vec(),
                    rhs: s.to_vec(),
                });
            }
            views.push(p.reshape(&expanded)?);
        }
        self.concat_as(op, &views, ax as isize)
    }
}
