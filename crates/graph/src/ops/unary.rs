//! Elementwise functions of one tensor, and the scalar forms (`x * s`, `x + s`, `x^p`).

use arenagrad_alloc::{AllocError, BufId};
use arenagrad_exec::ops::{
    FRAC_1_SQRT_2, FRAC_1_SQRT_2PI, GELU_C, SOFTPLUS_THRESHOLD, SQRT_2_OVER_PI, TWO_OVER_SQRT_PI,
};
use arenagrad_exec::{cpu, UnaryOp};
use smallvec::smallvec;

use super::{Ctx, Grads, Op};
use crate::device::on_cuda;
use crate::error::{GraphError, Result};
use crate::graph::{Inner, NodeId, RawResult};
use crate::shape::{copy_and_numel, copy_of};
use crate::{Device, Tensor};

impl<'g> Tensor<'g> {
    /// Applies an elementwise function.
    #[inline]
    pub fn unary(self, op: UnaryOp) -> Result<Tensor<'g>> {
        self.g.finish(self.unary_raw(op))
    }

    fn unary_raw(self, op: UnaryOp) -> RawResult {
        let name = op.name();
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let n = i.node(name, self.id)?;
        let ((shape, len), dtype, dev, xb) = (copy_and_numel(&n.shape), n.dtype, n.device(), n.buf);
        if dtype.is_half() {
            drop(guard);
            return self.unary_half_raw(op);
        }
        if dtype.is_integer() {
            drop(guard);
            return crate::graph::into_raw(self.integer_unary(op, dtype));
        }
        let needs_grad = n.requires_grad;
        let threads = i.threads;
        let out = match dev {
            Device::Cpu => with_float!(dtype, T, {
                let (out, o, [x]) = i.alloc_split::<T, 1>(name, len, [xb])?;
                cpu::unary(op, x, o, threads);
                out
            }),
            Device::Cuda(_) => {
                let out = i.alloc_on(name, dev, dtype, len)?;
                on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be
                    .unary(dtype, op, x, o, len));
                out
            }
        };
        if !i.in_backward {
            i.flops.unary(op, 0, len as u64);
        }
        let id = i.push_with(
            dev,
            shape,
            dtype,
            out,
            || Op::Unary(op),
            &[self.id],
            needs_grad,
        );
        drop(guard);
        Ok(id.to_bits())
    }

    /// [`Tensor::unary`] of a 16-bit tensor, out of the f32 path's line: on the host computed
    /// in f32 a block at a time and rounded once; on a device through f32 copies.
    #[cold]
    #[inline(never)]
    fn unary_half_raw(self, op: UnaryOp) -> RawResult {
        let name = op.name();
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let n = i.node(name, self.id)?;
        let ((shape, len), dtype, dev, xb) = (copy_and_numel(&n.shape), n.dtype, n.device(), n.buf);
        if dev != Device::Cpu {
            drop(guard);
            return Tensor::lower_raw([self], |[x]| x.unary(op));
        }
        let needs_grad = n.requires_grad;
        let threads = i.threads;
        let out = with_half!(dtype, H, {
            let (out, o, [x]) = i.alloc_split::<H, 1>(name, len, [xb])?;
            cpu::cast::unary_half(op, x, o, threads);
            out
        });
        if !i.in_backward {
            i.flops.unary(op, 0, len as u64);
        }
        let id = i.push_with(
            dev,
            shape,
            dtype,
            out,
            || Op::Unary(op),
            &[self.id],
            needs_grad,
        );
        drop(guard);
        Ok(id.to_bits())
    }

    /// The fused derivative `gy · op'(x)` (never recorded).
    pub(crate) fn unary_grad_fused(
        op: UnaryOp,
        x: Tensor<'g>,
        y: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> Result<Tensor<'g>> {
        let name = op.name();
        let mut guard = x.g.inner();
        let i = &mut *guard;
        let (shape, dtype, dev, xb) = {
            let n = i.node(name, x.id)?;
            (copy_of(&n.shape), n.dtype, n.device(), n.buf)
        };
        let yb = i.node(name, y.id)?.buf;
        let gb = i.node(name, gy.id)?.buf;
        let len = shape.iter().product();
        let out = i.alloc_on(name, dev, dtype, len)?;
        let threads = i.threads;
        match dev {
            Device::Cpu if dtype.is_half() => with_half!(dtype, H, {
                let (o, [xs, ys, gs]) = i.split_mut::<H, 3>(name, out, [xb, yb, gb])?;
                cpu::cast::unary_grad_half(op, xs, ys, gs, o, threads);
            }),
            Device::Cpu => with_float!(dtype, T, {
                let (o, [xs, ys, gs]) = i.split_mut::<T, 3>(name, out, [xb, yb, gb])?;
                cpu::unary_grad(op, xs, ys, gs, o, threads);
            }),
            Device::Cuda(_) => {
                on_cuda!(i, name, dev, [xb, yb, gb, out], |be, [xs, ys, gs, o]| be
                    .unary_grad(dtype, op, (xs, ys), gs, o, len))
            }
        }
        let id = i.push_on(dev, shape, dtype, out, Op::Leaf, &[]);
        drop(guard);
        Ok(x.g.handle(id))
    }

    /// -x
    #[inline]
    pub fn neg(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Neg)
    }
    /// e^x
    #[inline]
    pub fn exp(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Exp)
    }
    /// ln x
    #[inline]
    pub fn log(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Log)
    }
    /// √x
    #[inline]
    pub fn sqrt(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Sqrt)
    }
    /// |x|
    #[inline]
    pub fn abs(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Abs)
    }
    /// sin x
    #[inline]
    pub fn sin(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Sin)
    }
    /// cos x
    #[inline]
    pub fn cos(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Cos)
    }
    /// tanh x
    #[inline]
    pub fn tanh(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Tanh)
    }
    /// 1 / (1 + e^-x)
    #[inline]
    pub fn sigmoid(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Sigmoid)
    }
    /// max(x, 0)
    #[inline]
    pub fn relu(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Relu)
    }
    /// GELU, exact: x·Φ(x) = ½x(1 + erf(x/√2)), PyTorch's default `gelu`.
    #[inline]
    pub fn gelu(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Gelu)
    }
    /// GELU, tanh approximation: ½x(1 + tanh(√(2/π)(x + 0.044715x³))), PyTorch's
    /// `gelu(x, approximate="tanh")`.
    #[inline]
    pub fn gelu_tanh(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::GeluTanh)
    }
    /// SiLU (swish): x · σ(x).
    #[inline]
    pub fn silu(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Silu)
    }
    /// softplus: ln(1 + eˣ), and `x` itself above 20 (PyTorch's default threshold).
    #[inline]
    pub fn softplus(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Softplus)
    }
    /// The error function.
    #[inline]
    pub fn erf(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Erf)
    }
    /// x · s
    #[inline]
    pub fn scale(self, s: f64) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Scale(s))
    }
    /// x + s
    #[inline]
    pub fn shift(self, s: f64) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Shift(s))
    }
    /// x^p for a constant p.
    #[inline]
    pub fn powf(self, p: f64) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Powf(p))
    }
    /// x · x
    #[inline]
    pub fn square(self) -> Result<Tensor<'g>> {
        self.unary(UnaryOp::Powf(2.0))
    }
}

/// Backward of an elementwise op written over its incoming gradient `gid`, when nothing is being
/// recorded and backward holds the only claim on it: a temporary in one gradient slot whose
/// buffer no view shares. A chain of elementwise ops then needs no buffer and no node per step.
/// Returns false where it does not apply; the rule then runs as usual.
pub(crate) fn backward_in_place(
    i: &mut Inner,
    op: UnaryOp,
    x: NodeId,
    y: NodeId,
    gid: NodeId,
) -> Result<bool> {
    let name = op.name();
    let (xb, yb) = (i.node(name, x)?.buf, i.node(name, y)?.buf);
    backward_in_place_bufs(i, op, xb, yb, gid)
}

/// [`backward_in_place`] for a caller that has the input's and the output's buffers at hand.
#[inline(always)]
pub(crate) fn backward_in_place_bufs(
    i: &mut Inner,
    op: UnaryOp,
    xb: BufId,
    yb: BufId,
    gid: NodeId,
) -> Result<bool> {
    if matches!(op, UnaryOp::Sign | UnaryOp::Step) {
        return Ok(false);
    }
    let name = op.name();
    let gn = i.node(name, gid)?;
    if !gn.temp || gn.grad_refs != 1 || gn.device() != Device::Cpu {
        return Ok(false);
    }
    let (gb, dtype) = (gn.buf, gn.dtype);
    if dtype.is_half() {
        return Ok(false);
    }
    let threads = i.threads;
    with_float!(dtype, T, {
        match i.arena.split_unique::<T, 2>(gb, [xb, yb]) {
            Ok((g, [xs, ys])) => cpu::unary_grad_in_place(op, xs, ys, g, threads),
            // A view shares the gradient's buffer.
            Err(AllocError::NotUnique { .. }) => return Ok(false),
            Err(source) => return Err(GraphError::Alloc { op: name, source }),
        }
    });
    Ok(true)
}

/// Exact gelu'(x) = Φ(x) + x·φ(x), written in differentiable ops (the create_graph rule).
fn gelu_erf_grad_graph<'g>(x: Tensor<'g>) -> Result<Tensor<'g>> {
    let cdf = x.scale(FRAC_1_SQRT_2)?.erf()?.shift(1.0)?.scale(0.5)?;
    let pdf = x.mul(x)?.scale(-0.5)?.exp()?.scale(FRAC_1_SQRT_2PI)?;
    cdf.add(x.mul(pdf)?)
}

/// Tanh-approximate gelu'(x) written in differentiable ops (the create_graph rule).
fn gelu_grad_graph<'g>(x: Tensor<'g>) -> Result<Tensor<'g>> {
    let x2 = x.mul(x)?;
    let x3 = x2.mul(x)?;
    let t = x.add(x3.scale(GELU_C)?)?.scale(SQRT_2_OVER_PI)?.tanh()?;
    let left = t.shift(1.0)?.scale(0.5)?;
    let sech2 = t.mul(t)?.neg()?.shift(1.0)?;
    let inner = x2.scale(3.0 * GELU_C)?.shift(1.0)?.scale(SQRT_2_OVER_PI)?;
    let right = x.mul(sech2)?.mul(inner)?.scale(0.5)?;
    left.add(right)
}

/// The backward rule. Without `create_graph`, one fused kernel (the op table's derivative);
/// with it, the derivative written in differentiable ops, one arm per op: the match has no
/// catch-all, so an op without a rule does not compile.
pub(crate) fn backward<'g>(op: UnaryOp, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let (x, y, gy) = (c.input(0), c.out, c.gy);
    let gx = match op {
        // Piecewise constant: no gradient flows (PyTorch's `sign`).
        UnaryOp::Sign | UnaryOp::Step => return Ok(smallvec![None]),
        UnaryOp::Shift(_) => gy,
        UnaryOp::Scale(s) => gy.scale(s)?,
        UnaryOp::Neg => gy.neg()?,
        _ if !c.create_graph => Tensor::unary_grad_fused(op, x, y, gy)?,
        UnaryOp::Exp => gy.mul(y)?,
        UnaryOp::Log => gy.div(x)?,
        UnaryOp::Sqrt => gy.scale(0.5)?.div(y)?,
        UnaryOp::Abs => gy.mul(x.unary(UnaryOp::Sign)?.detach()?)?,
        UnaryOp::Sin => gy.mul(x.cos()?)?,
        UnaryOp::Cos => gy.mul(x.sin()?)?.neg()?,
        UnaryOp::Tanh => gy.mul(y.mul(y)?.neg()?.shift(1.0)?)?,
        UnaryOp::Sigmoid => gy.mul(y.mul(y.neg()?.shift(1.0)?)?)?,
        UnaryOp::Relu => gy.mul(x.unary(UnaryOp::Step)?.detach()?)?,
        UnaryOp::Gelu => gy.mul(gelu_erf_grad_graph(x)?)?,
        UnaryOp::GeluTanh => gy.mul(gelu_grad_graph(x)?)?,
        UnaryOp::Silu => {
            let s = x.sigmoid()?;
            gy.mul(s.mul(x.mul(s.neg()?.shift(1.0)?)?.shift(1.0)?)?)?
        }
        UnaryOp::Softplus => {
            // σ(x), and exactly 1 above the threshold (where the forward is x): σ + m·(1 − σ)
            // with m the threshold's mask, a constant.
            let s = x.sigmoid()?;
            let m = x
                .shift(-SOFTPLUS_THRESHOLD)?
                .unary(UnaryOp::Step)?
                .detach()?;
            gy.mul(s.add(m.mul(s.neg()?.shift(1.0)?)?)?)?
        }
        UnaryOp::Erf => gy.mul(x.mul(x)?.neg()?.exp()?.scale(TWO_OVER_SQRT_PI)?)?,
        // x⁰ is constant: a zero gradient, not 0·x⁻¹ (NaN at 0), as PyTorch.
        UnaryOp::Powf(0.0) => c.g.full_on(&x.shape(), 0.0, x.dtype(), x.device())?,
        UnaryOp::Powf(p) => gy.mul(x.powf(p - 1.0)?.scale(p)?)?,
    };
    Ok(smallvec![Some(gx)])
}
