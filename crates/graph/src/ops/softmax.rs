//! Softmax and log-softmax along one axis, numerically stable (the row maximum is subtracted).

use arenagrad_exec::cpu;
use smallvec::smallvec;

use super::{Ctx, Grads, Op};
use crate::device::on_cuda;
use crate::error::Result;
use crate::shape::copy_of;
use crate::shape::norm_axis;
use crate::{Device, Tensor};

impl<'g> Tensor<'g> {
    fn softmax_impl(self, axis: isize, log: bool) -> Result<Tensor<'g>> {
        let name = if log { "log_softmax" } else { "softmax" };
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (shape, dtype, dev, xb) = {
            let n = i.node(name, self.id)?;
            (copy_of(&n.shape), n.dtype, n.device(), n.buf)
        };
        let ax = norm_axis(name, axis, &shape)?;
        let out = i.alloc_on(name, dev, dtype, shape.iter().product())?;
        match dev {
            Device::Cpu => with_float!(dtype, T, {
                let (o, [x]) = i.split_mut::<T, 1>(name, out, [xb])?;
                cpu::softmax(x, &shape, ax, log, o);
            }),
            Device::Cuda(_) => {
                on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be
                    .softmax(dtype, x, &shape, ax, log, o))
            }
        }
        let id = i.push(shape, dtype, out, Op::Softmax { axis: ax, log }, &[self.id]);
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// e^x / Σ e^x along `axis`.
    pub fn softmax(self, axis: isize) -> Result<Tensor<'g>> {
        self.softmax_impl(axis, false)
    }

    /// x - log Σ e^x along `axis`.
    pub fn log_softmax(self, axis: isize) -> Result<Tensor<'g>> {
        self.softmax_impl(axis, true)
    }

    /// The fused derivative (never recorded).
    fn softmax_grad_fused(
        y: Tensor<'g>,
        g: Tensor<'g>,
        axis: usize,
        log: bool,
    ) -> Result<Tensor<'g>> {
        let name = "softmax_backward";
        let mut guard = y.g.inner();
        let i = &mut *guard;
        let (shape, dtype, dev, yb) = {
            let n = i.node(name, y.id)?;
            (copy_of(&n.shape), n.dtype, n.device(), n.buf)
        };
        let gb = i.node(name, g.id)?.buf;
        let out = i.alloc_on(name, dev, dtype, shape.iter().product())?;
        match dev {
            Device::Cpu => with_float!(dtype, T, {
                let (o, [ys, gs]) = i.split_mut::<T, 2>(name, out, [yb, gb])?;
                cpu::softmax_grad(ys, gs, &shape, axis, log, o);
            }),
            Device::Cuda(_) => {
                on_cuda!(i, name, dev, [yb, gb, out], |be, [ys, gs, o]| be
                    .softmax_grad(dtype, ys, gs, &shape, axis, log, o))
            }
        }
        let id = i.push_on(dev, shape, dtype, out, Op::Leaf, &[]);
        drop(guard);
        Ok(y.g.handle(id))
    }
}

pub(crate) fn backward<'g>(axis: usize, log: bool, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let (y, g) = (c.out, c.gy);
    let ax = axis as isize;
    let gx = if !c.create_graph {
        Tensor::softmax_grad_fused(y, g, axis, log)?
    } else if log {
        g.sub(y.exp()?.mul(g.sum_axes(&[ax], true)?)?)?
    } else {
        let gy = g.mul(y)?;
        gy.sub(y.mul(gy.sum_axes(&[ax], true)?)?)?
    };
    Ok(smallvec![Some(gx)])
}
