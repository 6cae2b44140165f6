//! Softmax and log-softmax along one axis, numerically stable (the row maximum is subtracted),
//! and the mean cross-entropy of class-score rows (log-softmax and the targets' negative
//! log-likelihood as one op, as PyTorch fuses them).

use std::sync::Arc;

use arenagrad_exec::{cpu, Float};
use smallvec::{smallvec, SmallVec};

use super::{Ctx, Grads, Op};
use crate::device::on_cuda;
use crate::error::{GraphError, Result};
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
        if dtype.is_half() {
            drop(guard);
            return Tensor::lower([self], |[x]| x.softmax_impl(axis, log));
        }
        let ax = norm_axis(name, axis, &shape)?;
        let out = i.alloc_on(name, dev, dtype, shape.iter().product())?;
        match dev {
            Device::Cpu => with_float!(dtype, T, {
                let (o, [x]) = i.split_mut::<T, 1>(name, out, [xb])?;
                cpu::softmax(x, &shape, ax, log, o);
            }),
            Device::Cuda(_) => {
                on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be.softmax(
                    dtype,
                    cpu::Operand::new(x, &shape),
                    ax,
                    log,
                    o
                ))
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
                    .softmax_grad(
                        dtype,
                        cpu::Operand::new(ys, &shape),
                        gs,
                        axis,
                        log,
                        o
                    ))
            }
        }
        let id = i.push_on(dev, shape, dtype, out, Op::Leaf, &[]);
        drop(guard);
        Ok(y.g.handle(id))
    }
}

impl<'g> Tensor<'g> {
    /// The mean cross-entropy of class-score rows `[m, c]` (logits) against class indices, one
    /// per row: `−mean_r log_softmax(self)[r, targets[r]]`, a scalar. One recorded op: on the
    /// host, forward is one log-softmax pass and the targets' mean, backward one pass
    /// `(softmax − onehot)·gy/m`; under `create_graph` the same written in tensor ops. On a CUDA
    /// device the forward and backward run the softmax, gather and reduction kernels.
    pub fn cross_entropy_mean(self, targets: &[usize]) -> Result<Tensor<'g>> {
        const OP: &str = "cross_entropy";
        if let Some([Some(x)]) = Tensor::autocast_f32(self.g, [Some(self)])? {
            return x.cross_entropy_mean(targets);
        }
        if self.dtype_of(OP)?.is_half() {
            return Tensor::lower([self], |[x]| x.cross_entropy_mean(targets));
        }
        let shape = self.try_shape()?;
        let [m, c] = shape[..] else {
            return Err(GraphError::BadArgument {
                op: OP,
                what: "expects class scores of shape [m, c]",
            });
        };
        if targets.len() != m {
            return Err(GraphError::ShapeMismatch {
                op: OP,
                lhs: shape.to_vec(),
                rhs: vec![targets.len()],
            });
        }
        if let Some(&index) = targets.iter().find(|&&t| t >= c) {
            return Err(GraphError::IndexOutOfRange {
                op: OP,
                index,
                axis: 1,
                shape: shape.to_vec(),
            });
        }
        let targets: Arc<[usize]> = Arc::from(targets);
        let (lsm, loss) = {
            let _ng = self.g.no_grad();
            if self.device() == Device::Cpu {
                self.cross_entropy_host(&targets)?
            } else {
                let lsm = self.log_softmax(-1)?;
                let picked = lsm.gather(1, &targets, &[m, 1])?.reshape(&[m as isize])?;
                (lsm, picked.neg()?.sum()?.scale(1.0 / m as f64)?)
            }
        };
        // The loss's value, recorded as this op with the log-probabilities as a second input
        // (a constant: what backward reads).
        let mut i = self.g.inner();
        let (dtype, buf) = {
            let n = i.node(OP, loss.id)?;
            (n.dtype, n.buf)
        };
        let dev = i.device_of(OP, loss.id)?;
        i.retain_buf(OP, dev, buf)?;
        let id = i.push(
            SmallVec::new(),
            dtype,
            buf,
            Op::CrossEntropy { targets },
            &[self.id, lsm.id],
        );
        drop(i);
        Ok(self.g.handle(id))
    }

    /// The host forward: the rows' log-softmax and the mean of the targets' negated entries.
    fn cross_entropy_host(self, targets: &[usize]) -> Result<(Tensor<'g>, Tensor<'g>)> {
        const OP: &str = "cross_entropy";
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (shape, dtype, xb) = {
            let n = i.node(OP, self.id)?;
            (copy_of(&n.shape), n.dtype, n.buf)
        };
        let c = shape[1];
        let lb = i.alloc_on(OP, Device::Cpu, dtype, shape.iter().product())?;
        let out = i.alloc_on(OP, Device::Cpu, dtype, 1)?;
        with_float!(dtype, T, {
            let (l, [x]) = i.split_mut::<T, 1>(OP, lb, [xb])?;
            cpu::softmax(x, &shape, 1, true, l);
            let (o, [l]) = i.split_mut::<T, 1>(OP, out, [lb])?;
            o[0] = cpu::nll_mean(l, c, targets);
        });
        let lsm = i.push_on(Device::Cpu, shape, dtype, lb, Op::Leaf, &[]);
        let loss = i.push_on(Device::Cpu, SmallVec::new(), dtype, out, Op::Leaf, &[]);
        drop(guard);
        Ok((self.g.handle(lsm), self.g.handle(loss)))
    }
}

/// The backward of [`Tensor::cross_entropy_mean`]: `(e^lsm − onehot)·gy/m` for the rows, none
/// for the log-probabilities (a constant).
pub(crate) fn cross_entropy_backward<'g>(targets: &[usize], c: &Ctx<'g>) -> Result<Grads<'g>> {
    const OP: &str = "cross_entropy";
    let (x, lsm, gy) = (c.input(0), c.input(1), c.gy);
    let shape = lsm.try_shape()?;
    let (m, classes) = (shape[0], shape[1]);
    let inv_m = 1.0 / m as f64;
    let onehot = || -> Result<Tensor<'g>> {
        let mut v = vec![0.0; m * classes];
        for (r, &t) in targets.iter().enumerate() {
            v[r * classes + t] = 1.0;
        }
        c.g.from_f64(&v, &shape, x.dtype())?.to_device(x.device())
    };
    let gx = if c.create_graph {
        // Differentiable in x (through softmax) and in gy.
        x.softmax(-1)?.sub(onehot()?)?.mul(gy.scale(inv_m)?)?
    } else if x.device() == Device::Cpu {
        let k = gy.item()? * inv_m;
        let mut guard = c.g.inner();
        let i = &mut *guard;
        let (dtype, lb) = {
            let n = i.node(OP, lsm.id)?;
            (n.dtype, n.buf)
        };
        let out = i.alloc_on(OP, Device::Cpu, dtype, m * classes)?;
        with_float!(dtype, T, {
            let (o, [l]) = i.split_mut::<T, 1>(OP, out, [lb])?;
            cpu::nll_mean_grad(l, classes, targets, T::from_f64(k), o);
        });
        let id = i.push_on(Device::Cpu, shape, dtype, out, Op::Leaf, &[]);
        drop(guard);
        c.g.handle(id)
    } else {
        lsm.exp()?.sub(onehot()?)?.mul(gy.scale(inv_m)?)?
    };
    Ok(smallvec![Some(gx), None])
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
