//! Integer and boolean operands in the elementwise ops.
//!
//! `i64`, `i32`, `u8` and `bool` tensors hold indices, labels, masks and raw bytes: no gradient
//! flows through them. The elementwise ops take them by PyTorch's promotion rules:
//!
//! * with a floating operand, an integer one is converted to the floating one's dtype
//!   (`mask * x`, `x + labels`);
//! * between integers, `add`, `sub`, `mul`, `pow`, `maximum`, `minimum` run in `f64` and store
//!   the promoted integer dtype — exact while values stay below 2⁵³ in magnitude; `div` is true
//!   division and gives `f32` (PyTorch's default dtype); `sub` of two `bool` tensors is refused
//!   as PyTorch refuses it;
//! * `neg`, `abs`, `sign`, `relu`, `step`, and `scale`/`shift` by a whole number or `powf` by a
//!   whole non-negative power keep the integer dtype; the other functions (`exp`, `log`,
//!   `sigmoid`, a fractional `scale`, …) give `f32`, as PyTorch's do for integer input;
//! * comparisons give `bool` whatever their operands.

use arenagrad_exec::{BinaryOp, DType, UnaryOp};

use crate::error::{GraphError, Result};
use crate::Tensor;

/// Whether `op` is one of the public comparisons, whose result is `bool`.
pub(crate) fn is_comparison(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
    )
}

fn whole(v: f64) -> bool {
    v.is_finite() && v.fract() == 0.0
}

impl<'g> Tensor<'g> {
    /// `op` with at least one integer operand (`da`, `db` their dtypes), by the rules above.
    pub(crate) fn integer_binary(
        self,
        op: BinaryOp,
        other: Tensor<'g>,
        (da, db): (DType, DType),
    ) -> Result<Tensor<'g>> {
        if da.is_float() {
            return self.binary(op, other.to_dtype(da)?);
        }
        if db.is_float() {
            return self.to_dtype(db)?.binary(op, other);
        }
        let p = da.promote(db);
        let in_dtype = |d: DType| -> Result<(Tensor<'g>, Tensor<'g>)> {
            Ok((self.to_dtype(d)?, other.to_dtype(d)?))
        };
        match op {
            BinaryOp::Div => {
                let (a, b) = in_dtype(DType::F32)?;
                a.binary(op, b)
            }
            BinaryOp::Sub if p == DType::Bool => Err(GraphError::UnsupportedDType {
                op: op.name(),
                dtype: p,
            }),
            _ if is_comparison(op) => {
                let (a, b) = in_dtype(DType::F64)?;
                a.binary(op, b)
            }
            // In f64 (their compute dtype), stored back in the promoted integer dtype.
            _ => Tensor::lower([self, other], |[a, b]| a.binary(op, b)),
        }
    }

    /// `op` on an integer tensor of dtype `d`, by the rules above.
    pub(crate) fn integer_unary(self, op: UnaryOp, d: DType) -> Result<Tensor<'g>> {
        if d == DType::Bool && op == UnaryOp::Neg {
            return Err(GraphError::UnsupportedDType {
                op: op.name(),
                dtype: d,
            });
        }
        let keeps = match op {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu | UnaryOp::Step => true,
            UnaryOp::Scale(s) | UnaryOp::Shift(s) => whole(s),
            UnaryOp::Powf(p) => whole(p) && p >= 0.0,
            _ => false,
        };
        if keeps {
            Tensor::lower([self], |[x]| x.unary(op))
        } else {
            self.to_dtype(DType::F32)?.unary(op)
        }
    }
}

impl crate::Graph {
    /// Indices as an `i64` tensor of `shape` (what [`Tensor::sort`], [`Tensor::topk`] and
    /// [`Tensor::max_dim`] return as a vector, for ops that take an index tensor).
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.leaf(&[0.5, 2.0, -1.0, 7.0], &[4], DType::F32)?;
    /// let (v, i) = x.topk(2, 0, true)?;
    /// let i = g.indices(&i, &v.shape())?;
    /// assert_eq!(i.to_vec::<i64>()?, [3, 1]);
    /// assert_eq!(x.gather_by(0, i)?.to_vec::<f32>()?, v.to_vec::<f32>()?);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn indices(&self, idx: &[usize], shape: &[usize]) -> Result<Tensor<'_>> {
        let v: Vec<i64> = idx
            .iter()
            .map(|&k| i64::try_from(k).unwrap_or(i64::MAX))
            .collect();
        self.from_slice(&v, shape)
    }
}

impl<'g> Tensor<'g> {
    /// This tensor's values as indices for `op`: an integer tensor (`i64`, `i32` or `u8`; a
    /// floating or `bool` one is refused, as PyTorch refuses it), no value negative.
    pub fn index_values(self, op: &'static str) -> Result<Vec<usize>> {
        self.integer_values(op)?
            .into_iter()
            .map(|k| {
                usize::try_from(k).map_err(|_| GraphError::BadArgument {
                    op,
                    what: "an index is negative",
                })
            })
            .collect()
    }

    /// This tensor's values as `i64`, exactly, for `op`: an integer tensor (`i64`, `i32` or
    /// `u8`; a floating or `bool` one is refused). What reads indices or class targets that
    /// may hold a negative marker (−100) reads them through here.
    pub fn integer_values(self, op: &'static str) -> Result<Vec<i64>> {
        match self.dtype_of(op)? {
            DType::I64 => self.to_vec::<i64>(),
            DType::I32 => Ok(self.to_vec::<i32>()?.into_iter().map(i64::from).collect()),
            DType::U8 => Ok(self.to_vec::<u8>()?.into_iter().map(i64::from).collect()),
            dtype => Err(GraphError::UnsupportedDType { op, dtype }),
        }
    }

    /// [`Tensor::gather`] with the indices in an integer tensor (PyTorch's `gather(dim, index)`):
    /// the output has the index's shape.
    pub fn gather_by(self, axis: isize, index: Tensor<'g>) -> Result<Tensor<'g>> {
        self.g.owns("gather", &index)?;
        let ishape = index.try_shape()?;
        self.gather(axis, &index.index_values("gather")?, &ishape)
    }

    /// [`Tensor::index_select`] with the indices in a 1-D integer tensor (PyTorch's
    /// `index_select(dim, index)`).
    pub fn index_select_by(self, axis: isize, index: Tensor<'g>) -> Result<Tensor<'g>> {
        self.g.owns("index_select", &index)?;
        let ishape = index.try_shape()?;
        if ishape.len() > 1 {
            return Err(GraphError::BadArgument {
                op: "index_select",
                what: "the index must have one dimension (or none)",
            });
        }
        self.index_select(axis, &index.index_values("index_select")?)
    }

    /// The index of each maximum along `axis` as an `i64` tensor (PyTorch's `argmax(dim,
    /// keepdim)`): the first on ties, the first NaN where there is one.
    pub fn argmax_dim(self, axis: isize, keepdim: bool) -> Result<Tensor<'g>> {
        let idx = self.argmax_axis(axis)?;
        self.g
            .indices(&idx, &self.extreme_shape("argmax", axis, keepdim)?)
    }

    /// The index of each minimum along `axis` as an `i64` tensor (PyTorch's `argmin(dim,
    /// keepdim)`).
    pub fn argmin_dim(self, axis: isize, keepdim: bool) -> Result<Tensor<'g>> {
        let idx = self.argmin_axis(axis)?;
        self.g
            .indices(&idx, &self.extreme_shape("argmin", axis, keepdim)?)
    }

    /// One-hot rows of this integer tensor's values (PyTorch's `F.one_hot`): shape
    /// `[…self, classes]`, `i64`. A value not below `classes` is an error naming it.
    pub fn one_hot(self, classes: usize) -> Result<Tensor<'g>> {
        let labels = self.index_values("one_hot")?;
        let mut shape = self.try_shape()?.to_vec();
        let t = self.g.one_hot(&labels, classes, DType::I64)?;
        shape.push(classes);
        let shape: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
        t.reshape(&shape)
    }
}

/// How [`Tensor::scatter_reduce`] combines the values that land on one position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScatterReduce {
    /// Their sum (`"sum"`).
    Sum,
    /// Their mean (`"mean"`): with `include_self`, self counts as one of them; a position no
    /// value lands on keeps self's value.
    Mean,
    /// Their maximum (`"amax"`); the gradient is shared evenly among the values equal to it
    /// (self among them with `include_self`), as PyTorch's. Without `include_self`, PyTorch
    /// still counts a self equal to the maximum among the ties and so drops its share of the
    /// gradient; here the values that were reduced share all of it.
    Amax,
    /// Their minimum (`"amin"`), the gradient shared as for [`ScatterReduce::Amax`].
    Amin,
}

impl<'g> Tensor<'g> {
    /// Index values for `op` checked below `bound`, as the shared list an index op records.
    fn checked_indices(
        self,
        op: &'static str,
        index: Tensor<'g>,
        axis: usize,
        shape: &[usize],
    ) -> Result<std::sync::Arc<[usize]>> {
        self.g.owns(op, &index)?;
        let idx = index.index_values(op)?;
        if let Some(&bad) = idx.iter().find(|&&k| k >= shape[axis]) {
            return Err(GraphError::IndexOutOfRange {
                op,
                index: bad,
                axis,
                shape: shape.into(),
            });
        }
        Ok(idx.into())
    }

    /// PyTorch's `index_add(dim, index, source)`: self plus `source`'s slices along `axis`
    /// added at the positions `index` (1-D, an integer tensor) names, repeats accumulating.
    /// `source` has self's shape but `index.len()` along `axis`. The gradient reaches self
    /// whole and `source` as the slices it was added to (`index_select` of the incoming one).
    pub fn index_add(
        self,
        axis: isize,
        index: Tensor<'g>,
        source: Tensor<'g>,
    ) -> Result<Tensor<'g>> {
        const OP: &str = "index_add";
        self.g.owns(OP, &source)?;
        self.g.owns(OP, &index)?;
        let shape = self.try_shape()?;
        let ax = crate::shape::norm_axis(OP, axis, &shape)?;
        let ishape = index.try_shape()?;
        if ishape.len() > 1 {
            return Err(GraphError::BadArgument {
                op: OP,
                what: "the index must have one dimension (or none)",
            });
        }
        let sshape = source.try_shape()?;
        let n: usize = ishape.iter().product();
        super::shape::same_but_axis(OP, &shape, &sshape, ax)?;
        if sshape[ax] != n {
            return Err(GraphError::ShapeMismatch {
                op: OP,
                lhs: sshape.to_vec(),
                rhs: ishape.to_vec(),
            });
        }
        let idx = self.checked_indices(OP, index, ax, &shape)?;
        self.add(source.index_add_into(ax, idx, shape[ax])?)
    }

    /// PyTorch's `scatter_add(dim, index, src)`: self plus each `src` element added at the
    /// position of self that `index` (an integer tensor) names along `axis` (the element's own
    /// position along the other axes). As in PyTorch, `index` has the rank of both, is no
    /// larger than `src` anywhere and no larger than self off `axis`: only `src`'s leading part
    /// of `index`'s shape is scattered. The gradient reaches self whole and `src` gathered from
    /// the incoming one (zero where `index` does not reach).
    pub fn scatter_add(
        self,
        axis: isize,
        index: Tensor<'g>,
        src: Tensor<'g>,
    ) -> Result<Tensor<'g>> {
        const OP: &str = "scatter_add";
        if let Some(r) = self.scatter_in_part(OP, axis, index, src, |x, src| {
            x.scatter_add(axis, index, src)
        })? {
            return Ok(r);
        }
        let (ax, landing) = self.scatter_landing(OP, axis, index, src)?;
        let full = crate::shape::copy_of(&self.try_shape()?);
        self.add(landing.add(src, ax, &full)?)
    }

    /// A scatter's checked axis ([`Tensor::scatter_checked`]) and where `src` lands: whole
    /// slices at the rows an index constant off `axis` names (message passing's
    /// `dst.unsqueeze(1).expand(-1, F)`: `index_add`'s kernel and backward, which move slices
    /// rather than single elements), else each element at its index, every one checked.
    fn scatter_landing(
        self,
        op: &'static str,
        axis: isize,
        index: Tensor<'g>,
        src: Tensor<'g>,
    ) -> Result<(usize, Landing)> {
        let ax = self.scatter_checked(op, axis, index, src)?;
        let shape = self.try_shape()?;
        let landing = match self.constant_rows(op, index, ax, shape[ax])? {
            Some(rows) => Landing::Slices(rows),
            None => Landing::Elements(self.checked_indices(op, index, ax, &shape)?),
        };
        Ok((ax, landing))
    }

    /// For a checked scatter ([`Tensor::scatter_checked`]) whose `i64` index is the same all
    /// across every slice off `axis`, each within `extent`: the index of each slice, read in
    /// place (an expanded index of 10⁶ × 64 is not copied out). `None` where it is not; the
    /// element path then reads the index (and refuses an entry out of range).
    fn constant_rows(
        self,
        op: &'static str,
        index: Tensor<'g>,
        ax: usize,
        extent: usize,
    ) -> Result<Option<std::sync::Arc<[usize]>>> {
        if index.dtype_of(op)? != DType::I64 {
            return Ok(None);
        }
        let ishape = index.try_shape()?;
        let inner = self.g.inner.borrow();
        let idx = inner.read::<i64>(op, index.id)?;
        Ok(rows_of(&idx, &ishape, ax, extent, self.g.threads()))
    }

    /// A scatter whose `index` is smaller than `src`, or than self off `axis` (PyTorch takes
    /// both): `scatter` run on the parts the index addresses — `src`'s leading part of the
    /// index's shape, and self's off `axis` — and its result put in that part of self, the rest
    /// of self kept as it is. `None` when the index has `src`'s shape and self's off `axis`
    /// (the scatter itself checks the rest).
    fn scatter_in_part(
        self,
        op: &'static str,
        axis: isize,
        index: Tensor<'g>,
        src: Tensor<'g>,
        scatter: impl FnOnce(Tensor<'g>, Tensor<'g>) -> Result<Tensor<'g>>,
    ) -> Result<Option<Tensor<'g>>> {
        self.g.owns(op, &src)?;
        self.g.owns(op, &index)?;
        let shape = self.try_shape()?;
        let ax = crate::shape::norm_axis(op, axis, &shape)?;
        let (ishape, sshape) = (index.try_shape()?, src.try_shape()?);
        let within_src =
            ishape.len() == sshape.len() && ishape.iter().zip(sshape.iter()).all(|(a, b)| a <= b);
        if !within_src {
            return Err(GraphError::ShapeMismatch {
                op,
                lhs: ishape.to_vec(),
                rhs: sshape.to_vec(),
            });
        }
        // Self's part first: its check is the one left that can refuse, before anything is
        // recorded (src's, checked above, cannot). Along `axis`, src is read up to the index's
        // extent as well.
        let self_part = super::shape::leading_part(op, Some(self), &shape, &ishape, ax)?;
        let src_part = super::shape::leading_part(op, Some(src), &sshape, &ishape, usize::MAX)?;
        if src_part.is_none() && self_part.is_none() {
            return Ok(None);
        }
        let part = scatter(self_part.unwrap_or(self), src_part.unwrap_or(src))?;
        if self_part.is_none() {
            return Ok(Some(part));
        }
        // The scattered part in its place, self elsewhere: zeros around the part and a mask of
        // where it lies, then a select (exact: no arithmetic on self's values).
        let (mut placed, mut mask) = {
            let _no_grad = self.g.no_grad();
            (part, self.g.ones(&part.try_shape()?, part.dtype())?)
        };
        for (d, &extent) in shape.iter().enumerate() {
            if placed.try_shape()?[d] < extent {
                placed = placed.place(d, 0, extent)?;
                let _no_grad = self.g.no_grad();
                mask = mask.place(d, 0, extent)?;
            }
        }
        Ok(Some(self.g.where_cond(mask, placed, self)?))
    }

    /// The axis of a scatter into self of `src` at `index`, once both are this graph's, the
    /// index has `src`'s shape and both have self's off `axis` (the index's values unread).
    fn scatter_checked(
        self,
        op: &'static str,
        axis: isize,
        index: Tensor<'g>,
        src: Tensor<'g>,
    ) -> Result<usize> {
        self.g.owns(op, &src)?;
        self.g.owns(op, &index)?;
        let shape = self.try_shape()?;
        let ax = crate::shape::norm_axis(op, axis, &shape)?;
        let (ishape, sshape) = (index.try_shape()?, src.try_shape()?);
        if ishape != sshape {
            return Err(GraphError::ShapeMismatch {
                op,
                lhs: ishape.to_vec(),
                rhs: sshape.to_vec(),
            });
        }
        super::shape::same_but_axis(op, &shape, &sshape, ax)?;
        Ok(ax)
    }

    /// [`Tensor::scatter_checked`], then the index's values, each within self along the axis.
    fn scatter_indices(
        self,
        op: &'static str,
        axis: isize,
        index: Tensor<'g>,
        src: Tensor<'g>,
    ) -> Result<(usize, std::sync::Arc<[usize]>)> {
        let ax = self.scatter_checked(op, axis, index, src)?;
        let shape = self.try_shape()?;
        Ok((ax, self.checked_indices(op, index, ax, &shape)?))
    }

    /// PyTorch's `scatter_reduce(dim, index, src, reduce, include_self)` ([`ScatterReduce`]:
    /// sum, mean, amax, amin), `index` shaped as in [`Tensor::scatter_add`] (smaller than `src`
    /// or self as PyTorch allows). A position no value
    /// lands on keeps self's value whatever `include_self`. The mean divides by the number of
    /// values landing on each position (plus one for self with `include_self`) — PyTorch's
    /// floor division for integer dtypes is not reproduced: the floating dtypes are taken.
    pub fn scatter_reduce(
        self,
        axis: isize,
        index: Tensor<'g>,
        src: Tensor<'g>,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Result<Tensor<'g>> {
        const OP: &str = "scatter_reduce";
        if let Some(r) = self.scatter_in_part(OP, axis, index, src, |x, src| {
            x.scatter_reduce(axis, index, src, reduce, include_self)
        })? {
            return Ok(r);
        }
        let full = crate::shape::copy_of(&self.try_shape()?);
        if matches!(reduce, ScatterReduce::Amax | ScatterReduce::Amin) {
            let (ax, idx) = self.scatter_indices(OP, axis, index, src)?;
            return self.scatter_extreme((ax, idx, full), src, reduce, include_self);
        }
        // Each source slice or element added where it lands (as `scatter_add`'s), and the
        // counts from one value a slice where whole slices land.
        let (ax, landing) = self.scatter_landing(OP, axis, index, src)?;
        let sshape = src.try_shape()?;
        let ones_shape: Vec<usize> = match landing {
            Landing::Slices(_) => {
                let mut one_a_slice = vec![1; sshape.len()];
                one_a_slice[ax] = sshape[ax];
                one_a_slice
            }
            Landing::Elements(_) => sshape.to_vec(),
        };
        let landed = landing.add(src, ax, &full)?;
        // How many values land on each position: needed by the mean, and without self by both
        // (self is kept only where nothing lands). Made outside the recording.
        let landed_count = if reduce == ScatterReduce::Mean || !include_self {
            let _no_grad = self.g.no_grad();
            let ones = self.g.ones(&ones_shape, src.dtype())?;
            Some(landing.add(ones, ax, &full)?.broadcast_to(&full)?)
        } else {
            None
        };
        let base = match landed_count {
            Some(counts) if !include_self => {
                let zero = self.g.scalar(0.0, self.dtype())?;
                let none = counts.eq(zero)?;
                self.g.where_cond(none, self, zero)?
            }
            _ => self,
        };
        let sum = base.add(landed)?;
        match (reduce, landed_count) {
            (ScatterReduce::Mean, Some(c)) => {
                let counts = {
                    let _no_grad = self.g.no_grad();
                    let c = if include_self { c.shift(1.0)? } else { c };
                    // A position nothing lands on (without self) divides by one.
                    let one = self.g.scalar(1.0, self.dtype())?;
                    c.maximum(one)?
                };
                sum.div(counts)
            }
            _ => Ok(sum),
        }
    }

    /// `amax`/`amin` of [`Tensor::scatter_reduce`]: the extremes found on the host, then the
    /// output written differentiably as `(self·s + Σ src·t) / N`, where `s` and `t` mark the
    /// values equal to their position's extreme and `N` counts them — the extreme itself, with
    /// PyTorch's gradient (shared evenly among the ties).
    fn scatter_extreme(
        self,
        (ax, idx, full): (usize, std::sync::Arc<[usize]>, crate::shape::Shape),
        src: Tensor<'g>,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Result<Tensor<'g>> {
        let g = self.g;
        let (sv, xv) = (self.to_vec_f64()?, src.to_vec_f64()?);
        let ishape = src.try_shape()?;
        let outer: usize = full[..ax].iter().product();
        let (ext, iext) = (full[ax], ishape[ax]);
        let inner: usize = full[ax + 1..].iter().product();
        let better = |a: f64, b: f64| {
            // NaN wins, as it propagates.
            b.is_nan()
                || (!a.is_nan()
                    && if reduce == ScatterReduce::Amax {
                        b > a
                    } else {
                        b < a
                    })
        };
        // The position of self that element `p` (at `o`, `t` around the axis) lands on.
        let at = |p: usize, o: usize, t: usize| (o * ext + idx[p]) * inner + t;
        let mut best: Vec<Option<f64>> = if include_self {
            sv.iter().map(|&v| Some(v)).collect()
        } else {
            vec![None; sv.len()]
        };
        for o in 0..outer {
            for j in 0..iext {
                for t in 0..inner {
                    let p = (o * iext + j) * inner + t;
                    let q = at(p, o, t);
                    best[q] = Some(match best[q] {
                        Some(b) if !better(b, xv[p]) => b,
                        _ => xv[p],
                    });
                }
            }
        }
        // Where nothing landed (without self), self stays: its mark is 1.
        let result: Vec<f64> = best.iter().zip(&sv).map(|(b, &v)| b.unwrap_or(v)).collect();
        let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
        let self_mark: Vec<f64> = best
            .iter()
            .zip(&sv)
            .zip(&result)
            .map(|((b, &v), &r)| f64::from(u8::from(b.is_none() || (include_self && same(v, r)))))
            .collect();
        let mut src_mark = vec![0.0; xv.len()];
        let mut count = self_mark.clone();
        for o in 0..outer {
            for j in 0..iext {
                for t in 0..inner {
                    let p = (o * iext + j) * inner + t;
                    let q = at(p, o, t);
                    if same(xv[p], result[q]) {
                        src_mark[p] = 1.0;
                        count[q] += 1.0;
                    }
                }
            }
        }
        let dt = self.dtype();
        let share: Vec<f64> = self_mark.iter().zip(&count).map(|(m, c)| m / c).collect();
        let src_share: Vec<f64> = (0..xv.len())
            .map(|p| src_mark[p] / count[at(p, p / (iext * inner), p % inner)])
            .collect();
        let dev = self.device();
        let share = g.from_f64(&share, &full, dt)?.to_device(dev)?;
        let src_share = g.from_f64(&src_share, &ishape, dt)?.to_device(dev)?;
        let shared = self.mul(share)?.add(src.mul(src_share)?.scatter_add_into(
            ax,
            idx,
            full.clone(),
        )?)?;
        // The extreme exactly (the shares' sum may be an ulp off it), the gradient through
        // the shares: `r + (d − detach(d))`.
        let r = g.from_f64(&result, &full, dt)?.to_device(dev)?;
        r.add(shared.sub(shared.detach()?)?)
    }
}

/// Where a scatter's source lands along its axis ([`Tensor::scatter_landing`]).
enum Landing {
    /// Whole slices, at these positions along the axis (one per slice of the source).
    Slices(std::sync::Arc<[usize]>),
    /// Each element at its own position along the axis (one per element of the source).
    Elements(std::sync::Arc<[usize]>),
}

impl Landing {
    /// `t` (shaped as the scatter's source) added into zeros of `full` where it lands.
    fn add<'g>(&self, t: Tensor<'g>, ax: usize, full: &crate::shape::Shape) -> Result<Tensor<'g>> {
        match self {
            Landing::Slices(rows) => t.index_add_into(ax, rows.clone(), full[ax]),
            Landing::Elements(idx) => t.scatter_add_into(ax, idx.clone(), full.clone()),
        }
    }
}

/// The index along `axis` of each slice, where a scatter's `idx` (row-major in `shape`) is the
/// same all across every slice (constant off `axis`) and each within `0..extent`; `None` where
/// it is not, or where `shape` has nothing off `axis` to be constant across.
fn rows_of(
    idx: &[i64],
    shape: &[usize],
    axis: usize,
    extent: usize,
    threads: usize,
) -> Option<std::sync::Arc<[usize]>> {
    let (outer, n, inner) = arenagrad_exec::cpu::reduce::around_axis(shape, axis);
    if outer * inner <= 1 || idx.len() != outer * n * inner {
        return None;
    }
    // The first slice's values, each checked in range, before the whole index is read.
    let rows = (0..n)
        .map(|k| usize::try_from(idx[k * inner]).ok().filter(|&r| r < extent))
        .collect::<Option<Vec<usize>>>()?;
    arenagrad_exec::cpu::shape::constant_off_axis(idx, shape, axis, threads).then(|| rows.into())
}
