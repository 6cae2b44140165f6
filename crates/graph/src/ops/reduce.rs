//! Reductions: sum, mean, max — over everything or over given axes, with or without keepdim.

use arenagrad_exec::cpu::{self, ReduceOp};
use arenagrad_exec::BinaryOp;
use smallvec::smallvec;

use super::{Ctx, Grads, Op};
use crate::device::on_cuda;
use crate::error::{GraphError, Result};
use crate::shape::{axes_mask, copy_of, Shape};
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
        match dev {
            Device::Cpu => with_float!(dtype, T, {
                let (o, [x]) = i.split_mut::<T, 1>(name, out, [xb])?;
                if mask.iter().all(|&m| m) && op == ReduceOp::Sum {
                    o[0] = cpu::sum_row(x);
                } else {
                    cpu::reduce(op, x, &shape, &mask, o);
                }
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
    pub fn mean_axes(self, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
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

    /// `log Σ exp` over `axes` (empty means all), PyTorch's `logsumexp`: computed as
    /// `m + log Σ exp(x − m)` with `m` the (unrecorded) maximum, so that large values do not
    /// overflow. Where the maximum is infinite `m` is taken as 0, so a slice of −inf gives −inf
    /// and one holding +inf gives +inf; NaN propagates. The gradient is the softmax over `axes`.
    pub fn logsumexp(self, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        let m = {
            let _no_grad = self.g.no_grad();
            let m = self.max_axes(axes, true)?;
            let inf = self
                .g
                .full_on(&[], f64::INFINITY, self.dtype(), self.device())?;
            m.masked_fill(m.abs()?.eq(inf)?, 0.0)?
        };
        let lse = self.sub(m)?.exp()?.sum_axes(axes, keepdim)?.log()?;
        let out: Vec<isize> = lse.shape().iter().map(|&d| d as isize).collect();
        lse.add(m.reshape(&out)?)
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
