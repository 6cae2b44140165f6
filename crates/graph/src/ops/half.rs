//! Changing a tensor's dtype, and how ops take the 16-bit dtypes.
//!
//! `bf16` and `f16` are storage dtypes: an op whose operands are stored in them computes in
//! `f32` and rounds its result once when it stores it, as PyTorch's CPU kernels do. Ops with a
//! 16-bit path of their own (elementwise ops, dropout, data movement, bf16 products and
//! convolutions, attention, sums) widen block by block or into scratch ([`Inner::in_f32`]);
//! the others reach the rule through [`Tensor::lower`]: their 16-bit operands are widened to
//! `f32` (exactly), the `f32` op runs, and its output is rounded back — recorded as casts, so
//! the gradient takes the same path backwards (a 16-bit tensor's gradient is stored in its
//! dtype, rounded once from the `f32` rule's result, as in PyTorch). Operands of different
//! dtypes meet in the wider ([`DType::promote`]): `bf16` with `f32` computes and stores `f32`.

use arenagrad_exec::{cpu, DType};

use super::{Ctx, Grads, Op};
use crate::error::{GraphError, Result};
use crate::graph::{Inner, RawResult};
use crate::shape::copy_of;
use crate::{Device, Tensor};
use arenagrad_alloc::BufId;

impl<'g> Tensor<'g> {
    /// The tensor converted to `dtype` (PyTorch's `.to(dtype)`): exact when widening, rounded to
    /// nearest even when narrowing (`f64` narrows to the 16-bit dtypes through `f32`, as in
    /// PyTorch). The gradient flows back converted to this tensor's dtype. A tensor already of
    /// `dtype` is returned as it is.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.leaf(&[1.0 + 1.0 / 512.0, 3.0], &[2], DType::F32).unwrap();
    /// let h = x.to_dtype(DType::BF16).unwrap(); // 8 significant bits: 1 + 2⁻⁹ rounds to 1
    /// assert_eq!(h.to_vec_f64().unwrap(), vec![1.0, 3.0]);
    /// (h * h).sum().unwrap().backward().unwrap();
    /// assert_eq!(x.grad().unwrap().unwrap().to_vec_f64().unwrap(), vec![2.0, 6.0]);
    /// ```
    pub fn to_dtype(self, dtype: DType) -> Result<Tensor<'g>> {
        let op = "to_dtype";
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let n = i.node(op, self.id)?;
        let (shape, from, dev, xb) = (copy_of(&n.shape), n.dtype, n.device(), n.buf);
        if from == dtype {
            return Ok(self);
        }
        let len: usize = shape.iter().product();
        let threads = i.threads;
        let out = match dev {
            Device::Cpu => {
                let out = i.alloc(op, dtype, len)?;
                i.cast_into(op, (xb, from), (out, dtype))?;
                out
            }
            Device::Cuda(_) => {
                if from.is_half() || dtype.is_half() {
                    return Err(GraphError::UnsupportedDType {
                        op,
                        dtype: if dtype.is_half() { dtype } else { from },
                    });
                }
                // Between f32, f64 and the integer dtypes on a device: through the host (no
                // conversion kernel yet).
                with_storage!(from, S, {
                    let v = i.read::<S>(op, self.id)?.into_owned();
                    with_storage!(dtype, D, {
                        let mut w = crate::host::try_filled(op, len, D::default(), &shape)?;
                        cpu::cast(&v, &mut w, threads);
                        i.upload(op, dev, &w)?
                    })
                })
            }
        };
        let id = i.push_on(dev, shape, dtype, out, Op::Cast { from }, &[self.id]);
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// The op `f` on `xs`, run in the operands' compute dtype and its result stored in their
    /// promoted dtype (see the module documentation). An op's core calls this once it has seen
    /// a 16-bit operand (computed in f32) or, for the integer arithmetic that keeps its dtype,
    /// an integer one (computed in f64); the casts are ordinary recorded ops, so the gradient
    /// follows them back.
    pub(crate) fn lower<const N: usize>(
        xs: [Tensor<'g>; N],
        f: impl FnOnce([Tensor<'g>; N]) -> Result<Tensor<'g>>,
    ) -> Result<Tensor<'g>> {
        let out = promoted_of("dtype", &xs)?;
        let mut wide = xs;
        for x in wide.iter_mut() {
            *x = x.to_dtype(out.compute())?;
        }
        let y = {
            let _f32 = xs[0].g.suspend_autocast();
            f(wide)?
        };
        y.to_dtype(out)
    }

    /// This tensor in `out`'s compute dtype (an operand of an op lowered by hand: one with
    /// several outputs).
    pub(crate) fn widened(self, out: DType) -> Result<Tensor<'g>> {
        self.to_dtype(out.compute())
    }

    /// Attention with a 16-bit operand: queries, keys, values and an additive mask widened,
    /// the output stored in their promoted dtype.
    pub(crate) fn attention_lowered(
        self,
        k: Tensor<'g>,
        v: Tensor<'g>,
        opts: crate::AttentionOptions<'g>,
    ) -> Result<Tensor<'g>> {
        let mut operands = vec![self, k, v];
        operands.extend(opts.mask);
        let out = promoted_of("scaled_dot_product_attention", &operands)?;
        let mask = opts.mask.map(|m| m.widened(out)).transpose()?;
        let wide = crate::AttentionOptions { mask, ..opts };
        let (q, k, v) = (self.widened(out)?, k.widened(out)?, v.widened(out)?);
        let y = {
            let _f32 = self.g.suspend_autocast();
            q.scaled_dot_product_attention(k, v, wide)?
        };
        y.to_dtype(out)
    }

    /// Whether any of `xs` (optional operands included) is stored in a 16-bit dtype.
    pub(crate) fn any_half(xs: &[Option<Tensor<'g>>]) -> Result<bool> {
        for x in xs.iter().flatten() {
            if x.dtype_of("dtype")?.is_half() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// [`Tensor::lower`] in the form an op's register-returned core returns.
    pub(crate) fn lower_raw<const N: usize>(
        xs: [Tensor<'g>; N],
        f: impl FnOnce([Tensor<'g>; N]) -> Result<Tensor<'g>>,
    ) -> RawResult {
        crate::graph::into_raw(Self::lower(xs, f))
    }
}

impl Inner {
    /// Runs an f32 kernel for an op with 16-bit operands: `f(out, inputs)` on the inputs as
    /// f32 (each 16-bit one widened into a scratch buffer) writing an f32 result, which is
    /// rounded once into `out` (of its own dtype; written directly when that is f32). The
    /// scratch buffers go back to the arena's free lists at once: the op's node keeps only its
    /// 16-bit buffers.
    pub(crate) fn in_f32<const N: usize>(
        &mut self,
        op: &'static str,
        (out, out_dtype): (BufId, DType),
        inputs: [(BufId, DType); N],
        f: impl FnOnce(&mut [f32], [&[f32]; N]),
    ) -> Result<()> {
        let mut wide = [out; N];
        let mut scratch = Vec::with_capacity(N + 1);
        for (w, &(buf, dtype)) in wide.iter_mut().zip(&inputs) {
            let (b, fresh) = self.widen_scratch(op, buf, dtype)?;
            *w = b;
            if fresh {
                scratch.push(b);
            }
        }
        let wo = if out_dtype == DType::F32 {
            out
        } else {
            let n = self
                .arena
                .len_of(out)
                .map_err(|source| GraphError::Alloc { op, source })?;
            let b = self.alloc(op, DType::F32, n)?;
            scratch.push(b);
            b
        };
        {
            let (o, ins) = self.split_mut::<f32, N>(op, wo, wide)?;
            f(o, ins);
        }
        if wo != out {
            self.cast_into(op, (wo, DType::F32), (out, out_dtype))?;
        }
        for b in scratch {
            self.release_buf(Device::Cpu, b)?;
        }
        Ok(())
    }

    /// `buf` (of `dtype`) as an f32 buffer: itself when it is f32, else a new widened copy
    /// (`true`: scratch the caller releases).
    pub(crate) fn widen_scratch(
        &mut self,
        op: &'static str,
        buf: BufId,
        dtype: DType,
    ) -> Result<(BufId, bool)> {
        if dtype == DType::F32 {
            return Ok((buf, false));
        }
        let n = self
            .arena
            .len_of(buf)
            .map_err(|source| GraphError::Alloc { op, source })?;
        let b = self.alloc(op, DType::F32, n)?;
        self.cast_into(op, (buf, dtype), (b, DType::F32))?;
        Ok((b, true))
    }

    /// Host buffer `src` converted into `dst` (same length; [`cpu::cast`]).
    pub(crate) fn cast_into(
        &mut self,
        op: &'static str,
        (src, from): (BufId, DType),
        (dst, to): (BufId, DType),
    ) -> Result<()> {
        let threads = self.threads;
        with_storage!(from, S, {
            with_storage!(to, D, {
                let (o, x, _) = self
                    .arena
                    .split_mixed::<D, S, S>(dst, src, src)
                    .map_err(|source| GraphError::Alloc { op, source })?;
                cpu::cast(x, o, threads);
            })
        });
        Ok(())
    }
}

/// The dtype `xs` meet in ([`DType::promote`]), their handles checked live for `op`.
pub(crate) fn promoted_of(op: &'static str, xs: &[Tensor<'_>]) -> Result<DType> {
    let mut out: Option<DType> = None;
    for x in xs {
        let d = x.dtype_of(op)?;
        out = Some(out.map_or(d, |o| o.promote(d)));
    }
    Ok(out.unwrap_or(DType::F32))
}

/// The gradient of a cast: the incoming gradient converted back to the input's dtype.
pub(crate) fn cast_backward<'g>(from: DType, c: &Ctx<'g>) -> Result<Grads<'g>> {
    Ok(smallvec::smallvec![Some(c.gy.to_dtype(from)?)])
}
