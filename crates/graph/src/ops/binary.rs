//! Elementwise functions of two tensors with numpy broadcasting, and `where`.

use arenagrad_exec::cpu::Operand;
use arenagrad_exec::layout::broadcast_shapes;
use arenagrad_exec::{cpu, BinaryOp, DType, UnaryOp};
use smallvec::smallvec;

use super::{check_pair, pair_dtypes, Ctx, Grads, Op};
use crate::device::on_cuda;
use crate::error::{GraphError, Result};
use crate::graph::RawResult;
use crate::shape::{checked_numel, copy_of, Shape};
use crate::{Device, Graph, Tensor};

impl<'g> Tensor<'g> {
    /// Applies an elementwise function of two broadcast tensors.
    /// Integer and boolean operands follow PyTorch's promotion (see `integer`); a comparison's
    /// result is `bool`.
    #[inline]
    pub fn binary(self, op: BinaryOp, other: Tensor<'g>) -> Result<Tensor<'g>> {
        let y = self.g.finish(self.binary_raw(op, other))?;
        if super::integer::is_comparison(op) && y.dtype() != DType::Bool {
            return y.to_dtype(DType::Bool);
        }
        Ok(y)
    }

    fn binary_raw(self, op: BinaryOp, other: Tensor<'g>) -> RawResult {
        let name = op.name();
        let (da, db) = pair_dtypes(name, &self, &other)?;
        if da.is_integer() || db.is_integer() {
            return crate::graph::into_raw(self.integer_binary(op, other, (da, db)));
        }
        // A 16-bit operand: computed in f32, stored in the operands' promoted dtype
        // (`bf16 · bf16` is bf16, `bf16 + f32` is f32).
        let half = da.is_half() || db.is_half();
        if !half && da != db {
            return Err(Box::new(GraphError::DTypeMismatch {
                op: name,
                lhs: da,
                rhs: db,
            }));
        }
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (ash, dtype, dev, ab) = {
            let n = i.node(name, self.id)?;
            (copy_of(&n.shape), n.dtype.promote(db), n.device(), n.buf)
        };
        if half && (dtype == DType::F64 || dev != Device::Cpu) {
            drop(guard);
            return Tensor::lower_raw([self, other], |[a, b]| a.binary(op, b));
        }
        let (bsh, bb) = {
            let n = i.node(name, other.id)?;
            (copy_of(&n.shape), n.buf)
        };
        let osh: Shape = if ash == bsh {
            ash.clone()
        } else {
            Shape::from_vec(broadcast_shapes(&ash, &bsh).ok_or_else(|| {
                GraphError::ShapeMismatch {
                    op: name,
                    lhs: ash.to_vec(),
                    rhs: bsh.to_vec(),
                }
            })?)
        };
        let len = checked_numel(name, &osh)?;
        let threads = i.threads;
        let out = match dev {
            // One 16-bit type on both sides, one shape: block by block, no f32 copies.
            Device::Cpu if half && ash == bsh && da == dtype && db == dtype => {
                with_half!(dtype, H, {
                    let (out, o, [a, b]) = i.alloc_split::<H, 2>(name, len, [ab, bb])?;
                    cpu::cast::binary_half(op, a, b, o, threads);
                    out
                })
            }
            Device::Cpu if half => {
                let out = i.alloc(name, dtype, len)?;
                i.in_f32(name, (out, dtype), [(ab, da), (bb, db)], |o, [a, b]| {
                    cpu::binary(
                        op,
                        Operand::new(a, &ash),
                        Operand::new(b, &bsh),
                        Operand::new(o, &osh),
                        threads,
                    )
                })?;
                out
            }
            Device::Cpu => with_float!(dtype, T, {
                let (out, o, [a, b]) = i.alloc_split::<T, 2>(name, len, [ab, bb])?;
                cpu::binary(
                    op,
                    Operand::new(a, &ash),
                    Operand::new(b, &bsh),
                    Operand::new(o, &osh),
                    threads,
                );
                out
            }),
            Device::Cuda(_) => {
                let out = i.alloc_on(name, dev, dtype, len)?;
                on_cuda!(i, name, dev, [ab, bb, out], |be, [a, b, o]| be.binary(
                    dtype,
                    op,
                    Operand::new(a, &ash),
                    Operand::new(b, &bsh),
                    Operand::new(o, &osh)
                ));
                out
            }
        };
        let ids = [self.id, other.id];
        let id = if op.has_grad() {
            i.push(osh, dtype, out, Op::Binary(op), &ids)
        } else {
            // A comparison's mask: never requires grad, so never recorded.
            if !i.in_backward {
                i.flops.binary(op, 0, len as u64);
            }
            i.push_with(dev, osh, dtype, out, || Op::Binary(op), &ids, false)
        };
        drop(guard);
        Ok(id.to_bits())
    }

    /// 1 where self = other, else 0 (broadcasting; NaN equals nothing). The mask has no
    /// gradient and never requires grad, as PyTorch's boolean results.
    #[inline]
    pub fn eq(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Eq, other)
    }
    /// 1 where self ≠ other (a NaN on either side included), else 0. No gradient.
    #[inline]
    pub fn ne(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Ne, other)
    }
    /// 1 where self < other, else 0 (0 at a NaN). No gradient.
    #[inline]
    pub fn lt(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Lt, other)
    }
    /// 1 where self ≤ other, else 0 (0 at a NaN). No gradient.
    #[inline]
    pub fn le(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Le, other)
    }
    /// 1 where self > other, else 0 (0 at a NaN). No gradient.
    #[inline]
    pub fn gt(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Gt, other)
    }
    /// 1 where self ≥ other, else 0 (0 at a NaN). No gradient.
    #[inline]
    pub fn ge(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Ge, other)
    }

    /// Each element clamped into `[min, max]` (either bound optional, but not both: neither is
    /// an error, as in PyTorch), PyTorch's `clamp`: NaN
    /// stays NaN, and where `min > max` every element becomes `max`. The gradient passes where
    /// `min ≤ x ≤ max`, the bounds included (PyTorch's rule), and is 0 elsewhere and at NaN.
    pub fn clamp(self, min: Option<f64>, max: Option<f64>) -> Result<Tensor<'g>> {
        if min.is_none() && max.is_none() {
            // PyTorch: "At least one of 'min' or 'max' must not be None".
            return Err(GraphError::BadArgument {
                op: "clamp",
                what: "at least one of min and max must be given",
            });
        }
        let g = self.g;
        let (values, keep) = {
            let _no_grad = g.no_grad();
            let (mut values, mut keep) = (self, None::<Tensor<'g>>);
            if let Some(lo) = min {
                let lo = g.full_on(&[], lo, self.dtype(), self.device())?;
                values = values.maximum(lo)?;
                keep = Some(self.ge(lo)?);
            }
            if let Some(hi) = max {
                let hi = g.full_on(&[], hi, self.dtype(), self.device())?;
                values = values.minimum(hi)?;
                let below = self.le(hi)?;
                keep = Some(match keep {
                    Some(k) => k.mul(below)?,
                    None => below,
                });
            }
            (values, keep)
        };
        match keep {
            Some(k) => g.select_as("clamp", k, self, values),
            None => Ok(self),
        }
    }

    /// The lower triangle of the last two dimensions: elements `[…, i, j]` with `j − i ≤ k`
    /// kept, the rest exactly 0 (NaN and infinities too, as PyTorch's `tril`); the gradient is
    /// the lower triangle of the incoming one. `k = 0` keeps the diagonal, `k < 0` drops it.
    pub fn tril(self, k: isize) -> Result<Tensor<'g>> {
        self.triangle("tril", k, true)
    }

    /// The upper triangle of the last two dimensions: elements with `j − i ≥ k` kept, the rest
    /// exactly 0 (PyTorch's `triu`).
    pub fn triu(self, k: isize) -> Result<Tensor<'g>> {
        self.triangle("triu", k, false)
    }

    fn triangle(self, op: &'static str, k: isize, lower: bool) -> Result<Tensor<'g>> {
        let shape = self.try_shape()?;
        if shape.len() < 2 {
            return Err(GraphError::BadArgument {
                op,
                what: "needs a tensor of at least two dimensions",
            });
        }
        let (r, c) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        let mask = self.g.filled_by(op, &[r, c], self.dtype(), |e| {
            let d = (e % c) as isize - (e / c) as isize;
            if (lower && d <= k) || (!lower && d >= k) {
                1.0
            } else {
                0.0
            }
        })?;
        let mask = mask.to_device(self.device())?;
        let zero = self.g.full_on(&[], 0.0, self.dtype(), self.device())?;
        self.g.where_cond(mask, self, zero)
    }

    /// `value` where `mask` is non-zero, self elsewhere (PyTorch's `masked_fill`; the mask
    /// broadcasts to self's shape, not beyond it). The gradient flows to self where the mask
    /// is zero. `value` may be infinite, as attention's `-inf` is.
    pub fn masked_fill(self, mask: Tensor<'g>, value: f64) -> Result<Tensor<'g>> {
        self.g.owns("masked_fill", &mask)?;
        let (shape, mshape) = (self.try_shape()?, mask.try_shape()?);
        if broadcast_shapes(&shape, &mshape).as_deref() != Some(&shape[..]) {
            return Err(GraphError::ShapeMismatch {
                op: "masked_fill",
                lhs: shape.to_vec(),
                rhs: mshape.to_vec(),
            });
        }
        let fill = self.g.full_on(&[], value, self.dtype(), self.device())?;
        self.g.select_as("masked_fill", mask, fill, self)
    }

    /// self + other (broadcasting).
    #[inline]
    pub fn add(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Add, other)
    }
    /// self - other (broadcasting).
    #[inline]
    pub fn sub(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Sub, other)
    }
    /// self · other (broadcasting).
    #[inline]
    pub fn mul(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Mul, other)
    }
    /// self / other (broadcasting).
    #[inline]
    pub fn div(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Div, other)
    }
    /// self ^ other (broadcasting). The gradient with respect to the exponent uses ln(self), so it
    /// is defined for positive bases.
    #[inline]
    pub fn pow(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Pow, other)
    }
    /// Elementwise maximum (broadcasting); ties split the gradient evenly.
    #[inline]
    pub fn maximum(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Maximum, other)
    }
    /// Elementwise minimum (broadcasting); ties split the gradient evenly.
    #[inline]
    pub fn minimum(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.binary(BinaryOp::Minimum, other)
    }

    /// Reduces a broadcast gradient back to `shape`: sums over the axes broadcasting added or
    /// stretched.
    pub(crate) fn sum_to(self, shape: &[usize]) -> Result<Tensor<'g>> {
        let sh = self.shape();
        if sh.as_slice() == shape {
            return Ok(self);
        }
        let lead = sh.len() - shape.len();
        let axes: Vec<isize> = (0..sh.len())
            .filter(|&d| d < lead || (shape[d - lead] == 1 && sh[d] != 1))
            .map(|d| d as isize)
            .collect();
        let s = if axes.is_empty() {
            self
        } else {
            self.sum_axes(&axes, true)?
        };
        s.reshape(&shape.iter().map(|&d| d as isize).collect::<Vec<_>>())
    }
}

impl<'g> Tensor<'g> {
    /// PyTorch's `Tensor.where(condition, other)`: self where `condition` is nonzero (or
    /// true), `other` elsewhere, with broadcasting — [`Graph::where_cond`]`(condition, self,
    /// other)` under PyTorch's name (a raw identifier: `where` is a Rust keyword), for
    /// `x.r#where(mask, y)`.
    pub fn r#where(self, condition: Tensor<'g>, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.g.where_cond(condition, self, other)
    }
}

impl Graph {
    /// `cond != 0 ? a : b`, elementwise with broadcasting of all three. No gradient flows to
    /// `cond`. PyTorch's `torch.where` (`where` is a Rust keyword).
    #[doc(alias = "where")]
    #[doc(alias = "select")]
    pub fn where_cond<'g>(
        &'g self,
        cond: Tensor<'g>,
        a: Tensor<'g>,
        b: Tensor<'g>,
    ) -> Result<Tensor<'g>> {
        self.select_as("where", cond, a, b)
    }

    /// [`Graph::where_cond`], its errors naming `name` (the op the user called: `masked_fill` and
    /// `clamp` select through here).
    pub(crate) fn select_as<'g>(
        &'g self,
        name: &'static str,
        cond: Tensor<'g>,
        a: Tensor<'g>,
        b: Tensor<'g>,
    ) -> Result<Tensor<'g>> {
        let ids = self.owns_all(name, &[cond, a, b])?;
        let (dc, da) = pair_dtypes(name, &cond, &a)?;
        let (_, db) = pair_dtypes(name, &a, &b)?;
        if !(dc == da && da == db && da.is_native()) {
            // A `bool` (or any other) condition, 16-bit or integer values: the values meet in
            // their promoted dtype, computed in its compute dtype with the condition converted
            // to it (non-zero is true), and stored back.
            if da.is_native() && db.is_native() && da != db {
                return Err(GraphError::DTypeMismatch {
                    op: name,
                    lhs: da,
                    rhs: db,
                });
            }
            let out = da.promote(db);
            let work = out.compute();
            let (c, x, y) = (cond.to_dtype(work)?, a.to_dtype(work)?, b.to_dtype(work)?);
            let r = {
                let _f32 = self.suspend_autocast();
                self.select_as(name, c, x, y)?
            };
            return r.to_dtype(out);
        }
        check_pair(name, &cond, &a)?;
        check_pair(name, &a, &b)?;
        let mut guard = self.inner();
        let i = &mut *guard;
        let (csh, dtype, dev, cb) = {
            let n = i.node(name, cond.id)?;
            (copy_of(&n.shape), n.dtype, n.device(), n.buf)
        };
        let (ash, ab) = {
            let n = i.node(name, a.id)?;
            (copy_of(&n.shape), n.buf)
        };
        let (bsh, bb) = {
            let n = i.node(name, b.id)?;
            (copy_of(&n.shape), n.buf)
        };
        let mismatch = |l: &[usize], r: &[usize]| GraphError::ShapeMismatch {
            op: name,
            lhs: l.to_vec(),
            rhs: r.to_vec(),
        };
        let ab_sh = broadcast_shapes(&ash, &bsh).ok_or_else(|| mismatch(&ash, &bsh))?;
        let osh = broadcast_shapes(&csh, &ab_sh).ok_or_else(|| mismatch(&csh, &ab_sh))?;
        let len = checked_numel(name, &osh)?;
        let out = i.alloc_on(name, dev, dtype, len)?;
        match dev {
            Device::Cpu => with_float!(dtype, T, {
                let (o, [c, x, y]) = i.split_mut::<T, 3>(name, out, [cb, ab, bb])?;
                cpu::select(
                    Operand::new(c, &csh),
                    Operand::new(x, &ash),
                    Operand::new(y, &bsh),
                    Operand::new(o, &osh),
                );
            }),
            Device::Cuda(_) => {
                on_cuda!(i, name, dev, [cb, ab, bb, out], |be, [c, x, y, o]| be
                    .select(
                        dtype,
                        Operand::new(c, &csh),
                        Operand::new(x, &ash),
                        Operand::new(y, &bsh),
                        Operand::new(o, &osh)
                    ))
            }
        }
        let id = i.push(Shape::from_vec(osh), dtype, out, Op::Where, &ids);
        drop(guard);
        Ok(self.handle(id))
    }
}

pub(crate) fn backward<'g>(op: BinaryOp, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let (a, b, y, gy) = (c.input(0), c.input(1), c.out, c.gy);
    let need_a = a.requires_grad();
    let need_b = b.requires_grad();
    let (ga, gb) = match op {
        BinaryOp::Add => (Some(gy), Some(gy)),
        BinaryOp::Sub => (Some(gy), if need_b { Some(gy.neg()?) } else { None }),
        // `x·x`: both gradients are `g·x`, and their sum `g·x + g·x` is `(g·x)·2` exactly; made
        // once and doubled, it is one product and one sum, where two products and their sum
        // had been (the same bits).
        BinaryOp::Mul if a.id == b.id && need_a => {
            let half = gy.mul(a)?;
            (Some(half.add(half)?), None)
        }
        BinaryOp::Mul => (
            if need_a { Some(gy.mul(b)?) } else { None },
            if need_b { Some(gy.mul(a)?) } else { None },
        ),
        BinaryOp::Div => {
            let ga = gy.div(b)?;
            let gb = if need_b {
                Some(ga.mul(y)?.neg()?)
            } else {
                None
            };
            (Some(ga), gb)
        }
        BinaryOp::Pow => {
            // PyTorch's masking: d/da is 0 where b = 0 (not 0·a⁻¹ = NaN at a = 0), and d/db is
            // 0 where a = 0 and b ≥ 0 (not 0·ln 0 = NaN, or 1·ln 0 = −inf at b = 0).
            let zero = c.g.full_on(&[], 0.0, gy.dtype(), gy.device())?;
            let ga = if need_a {
                let bm1 = b.shift(-1.0)?;
                let d = b.mul(a.pow(bm1)?)?;
                let b_zero = b.binary(BinaryOp::EqMask, zero)?.detach()?;
                Some(gy.mul(c.g.where_cond(b_zero, zero, d)?)?)
            } else {
                None
            };
            let gb = if need_b {
                let d = y.mul(a.log()?)?;
                // b ≥ 0, NaN excluded: 1 − step(−b), as step(−b) is 0 exactly where −b ≤ 0.
                let b_nonneg = b.neg()?.unary(UnaryOp::Step)?.neg()?.shift(1.0)?;
                let a_zero = a.binary(BinaryOp::EqMask, zero)?;
                let masked = a_zero.mul(b_nonneg)?.detach()?;
                Some(gy.mul(c.g.where_cond(masked, zero, d)?)?)
            } else {
                None
            };
            (ga, gb)
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            // Each side's share (PyTorch's rule): all of the gradient where it is the larger
            // (for maximum) or where either is NaN, half on a tie, none where it lost.
            // `share(p, q)`: the gradient times GtMask(p, q), p's part when p should win.
            let share = |p: Tensor<'g>, q: Tensor<'g>| -> Result<Tensor<'g>> {
                gy.mul(p.binary(BinaryOp::GtMask, q)?.detach()?)
            };
            let (first, second) = if op == BinaryOp::Maximum {
                ((a, b), (b, a))
            } else {
                ((b, a), (a, b))
            };
            let ga = if need_a {
                Some(share(first.0, first.1)?)
            } else {
                None
            };
            let gb = if need_b {
                Some(share(second.0, second.1)?)
            } else {
                None
            };
            (ga, gb)
        }
        BinaryOp::GtMask
        | BinaryOp::EqMask
        | BinaryOp::Eq
        | BinaryOp::Ne
        | BinaryOp::Lt
        | BinaryOp::Le
        | BinaryOp::Gt
        | BinaryOp::Ge => (None, None),
    };
    // Each gradient in its operand's dtype (one side of `bf16 + f32` is bf16).
    let ga = match ga {
        Some(t) if need_a => Some(t.sum_to(&a.shape())?.to_dtype(a.dtype_of("backward")?)?),
        _ => None,
    };
    let gb = match gb {
        Some(t) if need_b => Some(t.sum_to(&b.shape())?.to_dtype(b.dtype_of("backward")?)?),
        _ => None,
    };
    Ok(smallvec![ga, gb])
}

pub(crate) fn select_backward<'g>(c: &Ctx<'g>) -> Result<Grads<'g>> {
    let (cond, a, b, gy) = (c.input(0), c.input(1), c.input(2), c.gy);
    let zero = c.g.full_on(&[], 0.0, gy.dtype(), gy.device())?;
    let ga = if a.requires_grad() {
        Some(c.g.where_cond(cond, gy, zero)?.sum_to(&a.shape())?)
    } else {
        None
    };
    let gb = if b.requires_grad() {
        Some(c.g.where_cond(cond, zero, gy)?.sum_to(&b.shape())?)
    } else {
        None
    };
    Ok(smallvec![None, ga, gb])
}
