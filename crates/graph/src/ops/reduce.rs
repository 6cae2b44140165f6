//! Reductions: sum, mean, max — over everything or over given axes, with or without keepdim.

use arenagrad_exec::cpu::{self, ReduceOp};
use arenagrad_exec::{BinaryOp, DType};
use smallvec::smallvec;

use super::{Ctx, Grads, Op};
use crate::device::on_cuda;
use crate::error::{GraphError, Result};
use crate::shape::{axes_mask, copy_of, norm_axis, Shape};
use crate::{Device, Tensor};

impl<'g> Tensor<'g> {
    fn reduce(self, op: ReduceOp, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        let name = match op {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        };
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (shape, dtype, dev, xb) = {
            let n = i.node(name, self.id)?;
            (copy_of(&n.shape), n.dtype, n.device(), n.buf)
        };
        // Integers are computed in f64: a maximum is lowered (stored back in its dtype), a sum
        // is stored as i64 (PyTorch's rule).
        if dtype.is_integer() {
            drop(guard);
            if op == ReduceOp::Sum {
                let sum = self.to_dtype(DType::F64)?.reduce(op, axes, keepdim)?;
                return sum.to_dtype(DType::I64);
            }
            return Tensor::lower([self], |[x]| x.reduce(op, axes, keepdim));
        }
        // A 16-bit sum on the host accumulates in f32 as it reads (below); the maximum's backward compares and counts ties, which stays with the f32 rule.
        if dtype.is_half() && (op == ReduceOp::Max || dev != Device::Cpu) {
            drop(guard);
            return Tensor::lower([self], |[x]| x.reduce(op, axes, keepdim));
        }
        let mask = axes_mask(name, axes, &shape)?;
        if op == ReduceOp::Max && mask.iter().zip(&shape).any(|(&m, &d)| m && d == 0) {
            return Err(GraphError::BadArgument {
                op: name,
                what: "max over an empty axis has no value",
            });
        }
        let kept: Shape = shape
            .iter()
            .zip(&mask)
            .map(|(&d, &m)| if m { 1 } else { d })
            .collect();
        let out_shape: Shape = if keepdim {
            kept.clone()
        } else {
            shape
                .iter()
                .zip(&mask)
                .filter(|(_, &m)| !m)
                .map(|(&d, _)| d)
                .collect()
        };
        let len = kept.iter().product();
        let out = i.alloc_on(name, dev, dtype, len)?;
        let threads = i.threads;
        match dev {
            // A 16-bit sum accumulates in f32, its input widened block by block as it is read.
            Device::Cpu if dtype.is_half() => with_half!(dtype, H, {
                let (o, [x]) = i.split_mut::<H, 1>(name, out, [xb])?;
                let mut sums = vec![0f32; o.len()];
                cpu::reduce::reduce_widened(op, x, &shape, &mask, &mut sums, threads);
                cpu::cast(&sums, o, 1);
            }),
            Device::Cpu => with_float!(dtype, T, {
                let (o, [x]) = i.split_mut::<T, 1>(name, out, [xb])?;
                cpu::reduce::reduce_on(op, x, &shape, &mask, o, threads);
            }),
            Device::Cuda(_) => {
                on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be
                    .reduce(dtype, op, x, &shape, &mask, o))
            }
        }
        let id = i.push(
            out_shape,
            dtype,
            out,
            Op::Reduce {
                op,
                mask: mask.as_slice().into(),
                keepdim,
            },
            &[self.id],
        );
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// Sum of all elements (a 0-D tensor).
    ///
    /// # Examples
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.leaf(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F64)?;
    /// let s = x.sum()?; // torch: x.sum()
    /// assert_eq!(s.rank(), 0);
    /// assert_eq!(s.item()?, 10.0);
    /// s.backward()?; // each element counts once
    /// assert_eq!(x.grad()?.map(|d| d.to_vec::<f64>()).transpose()?, Some(vec![1.0; 4]));
    /// // torch: x.sum(dim=1, keepdim=True)
    /// assert_eq!(x.sum_axes(&[1], true)?.to_vec::<f64>()?, vec![3.0, 7.0]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn sum(self) -> Result<Tensor<'g>> {
        self.reduce(ReduceOp::Sum, &[], false)
    }
    /// Sum over `axes` (negative axes count from the end; empty means all).
    pub fn sum_axes(self, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        self.reduce(ReduceOp::Sum, axes, keepdim)
    }
    /// Mean of all elements.
    pub fn mean(self) -> Result<Tensor<'g>> {
        self.mean_axes(&[], false)
    }
    /// Mean over `axes` (empty means all).
    /// An integer tensor is refused, as PyTorch refuses it (convert it with
    /// [`Tensor::to_dtype`] first).
    pub fn mean_axes(self, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        let dtype = self.dtype_of("mean")?;
        if dtype.is_integer() {
            return Err(GraphError::UnsupportedDType { op: "mean", dtype });
        }
        let shape = self.try_shape()?;
        let mask = axes_mask("mean", axes, &shape)?;
        let count: usize = shape
            .iter()
            .zip(&mask)
            .filter(|(_, &m)| m)
            .map(|(&d, _)| d)
            .product();
        self.reduce(ReduceOp::Sum, axes, keepdim)?
            .scale(1.0 / count as f64)
    }
    /// Maximum of all elements.
    pub fn max(self) -> Result<Tensor<'g>> {
        self.reduce(ReduceOp::Max, &[], false)
    }
    /// Maximum over `axes` (empty means all). Ties share the gradient evenly.
    pub fn max_axes(self, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        self.reduce(ReduceOp::Max, axes, keepdim)
    }

    /// Minimum of all elements (NaN propagates). Written as `−max(−x)`, so ties share the
    /// gradient evenly, as PyTorch's full `min()`.
    pub fn min(self) -> Result<Tensor<'g>> {
        self.min_axes(&[], false)
    }
    /// Minimum over `axes` (empty means all). Ties share the gradient evenly.
    pub fn min_axes(self, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        let shape = self.try_shape()?;
        let mask = axes_mask("min", axes, &shape)?;
        if mask.iter().zip(&shape).any(|(&m, &d)| m && d == 0) {
            return Err(GraphError::BadArgument {
                op: "min",
                what: "min over an empty axis has no value",
            });
        }
        if self.dtype_of("min")?.is_integer() {
            // −x would wrap in u8 and is refused for bool: lowered to f64.
            return Tensor::lower([self], |[x]| x.min_axes(axes, keepdim));
        }
        self.neg()?.max_axes(axes, keepdim)?.neg()
    }

    /// The maximum along `axis` and where it lies, PyTorch's `max(dim)`: the values as a
    /// tensor (the axis dropped unless `keepdim`) and, row-major in the same order, the index
    /// along `axis` of each — the first maximum on ties, the first NaN where there is one. The
    /// gradient flows to those positions only (PyTorch's rule for `max(dim)`, unlike the full
    /// `max()`, which splits it among ties).
    pub fn max_dim(self, axis: isize, keepdim: bool) -> Result<(Tensor<'g>, Vec<usize>)> {
        self.extreme_dim("max_dim", axis, keepdim, false)
    }
    /// The minimum along `axis` and where it lies, as [`Tensor::max_dim`].
    pub fn min_dim(self, axis: isize, keepdim: bool) -> Result<(Tensor<'g>, Vec<usize>)> {
        self.extreme_dim("min_dim", axis, keepdim, true)
    }
    /// The index along `axis` of each maximum (first on ties, the first NaN where there is
    /// one), row-major over the other axes; PyTorch's `argmax(dim)`.
    pub fn argmax_axis(self, axis: isize) -> Result<Vec<usize>> {
        let (shape, ax) = self.axis_of("argmax", axis)?;
        Ok(extreme_indices(&self.to_vec_f64()?, &shape, ax, false))
    }
    /// The index along `axis` of each minimum, as [`Tensor::argmax_axis`].
    pub fn argmin_axis(self, axis: isize) -> Result<Vec<usize>> {
        let (shape, ax) = self.axis_of("argmin", axis)?;
        Ok(extreme_indices(&self.to_vec_f64()?, &shape, ax, true))
    }
    /// The flat (row-major) index of the maximum, PyTorch's `argmax()`.
    pub fn argmax(self) -> Result<usize> {
        self.flatten()?.argmax_axis(0).map(|v| v[0])
    }
    /// The flat (row-major) index of the minimum, PyTorch's `argmin()`.
    pub fn argmin(self) -> Result<usize> {
        self.flatten()?.argmin_axis(0).map(|v| v[0])
    }

    fn axis_of(self, op: &'static str, axis: isize) -> Result<(Shape, usize)> {
        let shape = self.try_shape()?;
        let shape = if shape.is_empty() {
            copy_of(&[1])
        } else {
            copy_of(&shape)
        };
        let ax = norm_axis(op, axis, &shape)?;
        if shape[ax] == 0 {
            return Err(GraphError::BadArgument {
                op,
                what: "an empty axis has no extreme value",
            });
        }
        Ok((shape, ax))
    }

    fn extreme_dim(
        self,
        op: &'static str,
        axis: isize,
        keepdim: bool,
        min: bool,
    ) -> Result<(Tensor<'g>, Vec<usize>)> {
        let (shape, ax) = self.axis_of(op, axis)?;
        let idx = {
            let _ng = self.g.no_grad();
            extreme_indices(&self.to_vec_f64()?, &shape, ax, min)
        };
        let mut kept = shape.clone();
        kept[ax] = 1;
        let x = if self.try_shape()?.is_empty() {
            self.reshape(&[1])?
        } else {
            self
        };
        let v = x.gather(ax as isize, &idx, &kept)?;
        if keepdim && !self.try_shape()?.is_empty() {
            return Ok((v, idx));
        }
        let out: Vec<isize> = self
            .extreme_shape(op, axis, keepdim)?
            .iter()
            .map(|&e| e as isize)
            .collect();
        Ok((v.reshape(&out)?, idx))
    }

    /// The shape of a reduction along `axis` (`max_dim`, `argmax_dim`): the axis kept as 1
    /// with `keepdim`, else dropped; a 0-D tensor's is 0-D either way.
    pub(crate) fn extreme_shape(
        self,
        op: &'static str,
        axis: isize,
        keepdim: bool,
    ) -> Result<Vec<usize>> {
        let mut shape = self.try_shape()?.to_vec();
        if shape.is_empty() {
            return Ok(shape);
        }
        let ax = crate::shape::norm_axis(op, axis, &shape)?;
        if keepdim {
            shape[ax] = 1;
        } else {
            shape.remove(ax);
        }
        Ok(shape)
    }

    /// The vector `p`-norm over `axes` (empty means all), PyTorch's `linalg.vector_norm`:
    /// `p = 1` the sum of magnitudes, `p = 2` the Euclidean norm, `p = ∞` the largest magnitude,
    /// and any other finite `p > 0` as `(Σ|x|^p)^(1/p)`. Gradients follow PyTorch's at the edges:
    /// 0 where the norm is 0 (no 0/0), and for `p = ∞` split evenly among the entries of
    /// largest magnitude. Differentiable again under `create_graph`.
    pub fn norm(self, p: f64, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        const OP: &str = "norm";
        if p.is_nan() || p <= 0.0 {
            return Err(GraphError::BadArgument {
                op: OP,
                what: "the order p must be > 0 (or +inf)",
            });
        }
        let shape = self.try_shape()?;
        let mask = axes_mask(OP, axes, &shape)?;
        if p == f64::INFINITY && mask.iter().zip(&shape).any(|(&m, &d)| m && d == 0) {
            // PyTorch refuses it too: the largest magnitude of nothing has no value.
            return Err(GraphError::BadArgument {
                op: OP,
                what: "the inf norm over an empty axis has no value",
            });
        }
        let value = {
            let _ng = self.g.no_grad();
            norm_forward(self, p, axes, keepdim)?
        };
        let op = std::sync::Arc::new(NormOp {
            p,
            mask: mask.to_vec(),
        });
        self.g.custom(op, &[self], value)
    }

    /// `log Σ exp` over `axes` (empty means all), PyTorch's `logsumexp`: computed as
    /// `m + log Σ exp(x − m)` with `m` the (unrecorded) maximum, so that large values do not
    /// overflow. Where the maximum is infinite `m` is taken as 0, so a slice of −inf gives −inf
    /// and one holding +inf gives +inf; NaN propagates; over an empty axis it is −inf (the log
    /// of an empty sum), as PyTorch's. The gradient is the softmax over `axes`.
    pub fn logsumexp(self, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        const OP: &str = "logsumexp";
        let shape = self.try_shape()?;
        let mask = axes_mask(OP, axes, &shape)?;
        let m = {
            let _no_grad = self.g.no_grad();
            if mask.iter().zip(&shape).any(|(&m, &d)| m && d == 0) {
                // An empty axis has no maximum; its sum of exponentials is 0, and the result
                // −∞, as PyTorch's. The shift is 0 there (it changes nothing).
                let kept: Vec<usize> = shape
                    .iter()
                    .zip(&mask)
                    .map(|(&d, &m)| if m { 1 } else { d })
                    .collect();
                self.g.full_on(&kept, 0.0, self.dtype(), self.device())?
            } else {
                let m = self.max_axes(axes, true)?;
                let inf = self
                    .g
                    .full_on(&[], f64::INFINITY, self.dtype(), self.device())?;
                m.masked_fill(m.abs()?.eq(inf)?, 0.0)?
            }
        };
        let lse = self.sub(m)?.exp()?.sum_axes(axes, keepdim)?.log()?;
        let out: Vec<isize> = lse.shape().iter().map(|&d| d as isize).collect();
        lse.add(m.reshape(&out)?)
    }

    /// Running sums along `axis`, PyTorch's `cumsum`: `out[k] = x[0] + … + x[k]`. The gradient
    /// is the running sum of the gradient from the end. A 0-D tensor scans as one element
    /// (axis 0 or −1), as PyTorch's: its value, gradient 1.
    pub fn cumsum(self, axis: isize) -> Result<Tensor<'g>> {
        let shape = self.try_shape()?;
        if shape.is_empty() {
            norm_axis("cumsum", axis, &[1]).map_err(|_| GraphError::BadAxis {
                op: "cumsum",
                axis,
                shape: Vec::new(),
            })?;
            return self.reshape(&[1])?.scan(0, false)?.reshape(&[]);
        }
        let ax = norm_axis("cumsum", axis, &shape)?;
        self.scan(ax, false)
    }

    /// Running sums along `axis` (a valid axis), from the end when `reverse`.
    pub(crate) fn scan(self, axis: usize, reverse: bool) -> Result<Tensor<'g>> {
        let name = if reverse { "cumsum_reverse" } else { "cumsum" };
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (shape, dtype, dev, xb) = {
            let n = i.node(name, self.id)?;
            (copy_of(&n.shape), n.dtype, n.device(), n.buf)
        };
        if dtype.is_half() {
            drop(guard);
            return Tensor::lower([self], |[x]| x.scan(axis, reverse));
        }
        let len = shape.iter().product();
        let out = i.alloc_on(name, dev, dtype, len)?;
        match dev {
            // Nothing to sum into an empty result (not 2^40 runs of nothing).
            _ if len == 0 => {}
            Device::Cpu => with_float!(dtype, T, {
                let (o, [x]) = i.split_mut::<T, 1>(name, out, [xb])?;
                cpu::cumsum(x, &shape, axis, reverse, o);
            }),
            Device::Cuda(_) => {
                on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be
                    .cumsum(dtype, x, &shape, axis, reverse, o))
            }
        }
        let id = i.push(shape, dtype, out, Op::Cumsum { axis, reverse }, &[self.id]);
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// Broadcasts a reduction's gradient (shape without or with the reduced axes) back to `full`.
    pub(crate) fn expand_reduced(self, full: &[usize], mask: &[bool]) -> Result<Tensor<'g>> {
        let kept: Vec<isize> = full
            .iter()
            .zip(mask)
            .map(|(&d, &m)| if m { 1 } else { d as isize })
            .collect();
        let k = if self.shape().len() == kept.len() {
            self
        } else {
            self.reshape(&kept)?
        };
        k.broadcast_to(full)
    }
}

/// For each row along `axis` of `v` (shape `shape`), the index of its maximum (or minimum):
/// the first on ties, the first NaN where there is one.
fn extreme_indices(v: &[f64], shape: &[usize], axis: usize, min: bool) -> Vec<usize> {
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for t in 0..inner {
            let at = |k: usize| v[(o * len + k) * inner + t];
            let mut best = 0;
            for k in 1..len {
                let (x, b) = (at(k), at(best));
                if b.is_nan() {
                    break;
                }
                if x.is_nan() || (if min { x < b } else { x > b }) {
                    best = k;
                }
            }
            out.push(best);
        }
    }
    out
}

/// The norm's value (under no-grad).
fn norm_forward<'g>(x: Tensor<'g>, p: f64, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
    if p == f64::INFINITY {
        x.abs()?.max_axes(axes, keepdim)
    } else if p == 1.0 {
        x.abs()?.sum_axes(axes, keepdim)
    } else if p == 2.0 {
        x.mul(x)?.sum_axes(axes, keepdim)?.sqrt()
    } else {
        x.abs()?.powf(p)?.sum_axes(axes, keepdim)?.powf(1.0 / p)
    }
}

/// The norm as a recorded op: its backward, in tensor ops.
struct NormOp {
    p: f64,
    mask: Vec<bool>,
}

impl super::custom::CustomOp for NormOp {
    fn name(&self) -> &'static str {
        "norm"
    }

    fn backward<'g>(
        &self,
        _g: &'g crate::Graph,
        inputs: &[Tensor<'g>],
        output: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> Result<Vec<Option<Tensor<'g>>>> {
        let x = inputs[0];
        let full = x.try_shape()?;
        let n = output.expand_reduced(&full, &self.mask)?;
        let g = gy.expand_reduced(&full, &self.mask)?;
        let sign = || x.unary(arenagrad_exec::UnaryOp::Sign)?.detach();
        let zero = || -> Result<Tensor<'g>> {
            let z = x.g.full_on(&[], 0.0, x.dtype(), x.device())?;
            n.eq(z)
        };
        let gx = if self.p == 1.0 {
            g.mul(sign()?)?
        } else if self.p == 2.0 {
            x.mul(g.div(n)?.masked_fill(zero()?, 0.0)?)?
        } else if self.p == f64::INFINITY {
            let hit = x.abs()?.binary(BinaryOp::EqMask, n)?.detach()?;
            let axes: Vec<isize> = (0..full.len())
                .filter(|&d| self.mask[d])
                .map(|d| d as isize)
                .collect();
            let count = hit.sum_axes(&axes, true)?.broadcast_to(&full)?;
            g.mul(sign()?)?.mul(hit.div(count)?)?
        } else {
            // x·|x|^(p−2)·g / n^(p−1), 0 where n = 0; and 0 at an entry x = 0, as PyTorch
            // (for p < 1, |0|^(p−1) is inf and inf·sign(0) NaN). The zeros are taken as 1
            // before the power rather than masked after it, so that no inf is made at all and
            // a second derivative through here stays finite at them too.
            let p = self.p;
            let at_zero = x.eq(x.g.full_on(&[], 0.0, x.dtype(), x.device())?)?;
            let safe = x.masked_fill(at_zero, 1.0)?;
            let w = safe.abs()?.powf(p - 1.0)?.mul(sign()?)?;
            w.mul(g.div(n.powf(p - 1.0)?)?.masked_fill(zero()?, 0.0)?)?
        };
        Ok(vec![Some(gx)])
    }
}

pub(crate) fn backward<'g>(
    op: ReduceOp,
    mask: &[bool],
    _keepdim: bool,
    c: &Ctx<'g>,
) -> Result<Grads<'g>> {
    let x = c.input(0);
    let full = x.shape();
    let g = c.gy.expand_reduced(&full, mask)?;
    let gx = match op {
        ReduceOp::Sum => g,
        ReduceOp::Max => {
            // The tie rule: the gradient is split evenly among the positions equal to the
            // maximum — and, where the maximum is NaN, among the NaNs (EqMask matches NaN with
            // NaN), as PyTorch's full `max()`; never 0/0.
            let y = c.out.expand_reduced(&full, mask)?;
            let hit = x.binary(BinaryOp::EqMask, y)?.detach()?;
            let axes: Vec<isize> = mask
                .iter()
                .enumerate()
                .filter(|(_, &m)| m)
                .map(|(d, _)| d as isize)
                .collect();
            let count = hit.sum_axes(&axes, true)?.broadcast_to(&full)?;
            g.mul(hit.div(count)?)?
        }
    };
    Ok(smallvec![Some(gx)])
}
