//! Rows that reduce, scan or normalise along axes: `sum`, `mean`, `max`, `softmax`,
//! `log_softmax`, `cumsum`, `logsumexp`, `min`, `max_dim`, `norm`.

use arenagrad_exec::Positive;
use arenagrad_graph::{GraphError, Tensor};

use super::{
    all_ones, ax, axis, axis_at, axis_of, float, gen_axis, gen_one_axis, int, norm_axis,
    reshape_to, without, Gen, OpRow, Param, Refusal,
};

/// `sum`/`mean`: the axes listed (none: every axis) are removed; each axis once.
fn reduced(s: &[&[usize]], p: &[Param]) -> Result<Vec<usize>, Refusal> {
    let s = s[0];
    let mut mask = vec![p.is_empty(); s.len()];
    for (k, &a) in p.iter().enumerate() {
        let d = axis_at(s, a, 1 + k)?;
        if std::mem::replace(&mut mask[d], true) {
            return Err(Refusal::at(
                1 + k,
                format!("axis {a} is repeated (expected each axis once)"),
            ));
        }
    }
    Ok(s.iter()
        .zip(&mask)
        .filter(|(_, &m)| !m)
        .map(|(&d, _)| d)
        .collect())
}

/// `sum`/`mean` on the engine. The engine's reduction kernel asserts (in builds with debug
/// assertions) that the innermost run it walks is contiguous, which fails when it reduces some
/// but not all axes of a tensor whose extents are all 1: there the reduction is a reshape, with
/// the same values and derivatives.
fn run_reduced<'g>(x: Tensor<'g>, p: &[Param], mean: bool) -> Result<Tensor<'g>, GraphError> {
    let s = x.try_shape()?.to_vec();
    if all_ones(&s) {
        let mut mask = vec![p.is_empty(); s.len()];
        let mut valid = true;
        for &a in p {
            match norm_axis(a.as_i64(), s.len()) {
                Some(d) if !mask[d] => mask[d] = true,
                // Let the engine report a bad or repeated axis.
                _ => valid = false,
            }
        }
        if valid {
            let out: Vec<usize> = (0..s.len()).filter(|&d| !mask[d]).map(|_| 1).collect();
            return reshape_to(x, &out);
        }
    }
    let axes: Vec<isize> = p.iter().map(|&a| ax(a)).collect();
    if mean {
        x.mean_axes(&axes, false)
    } else {
        x.sum_axes(&axes, false)
    }
}

/// Axes of `a` chosen by bit of the first attribute byte, written negative by bit of the second.
fn gen_reduced(sa: &[usize], t: [u8; 4]) -> Option<Vec<f64>> {
    let r = sa.len();
    Some(
        (0..r)
            .filter(|&d| d < 8 && (t[0] >> d) & 1 == 1)
            .map(|d| {
                if (t[1] >> d) & 1 == 1 {
                    d as f64 - r as f64
                } else {
                    d as f64
                }
            })
            .collect(),
    )
}

/// One axis of a non-scalar: the first attribute byte picks it, the second's low bit writes it
/// negative (`max`, `softmax`, `log_softmax`).
fn gen_axis_of(sa: &[usize], t: [u8; 4]) -> Option<Vec<f64>> {
    let r = sa.len();
    (r > 0).then(|| vec![axis_of(r, t[0], t[1] & 1 == 1) as f64])
}

/// The shape unchanged, along a valid axis (`softmax`, `log_softmax`).
fn along_axis(s: &[&[usize]], p: &[Param]) -> Result<Vec<usize>, Refusal> {
    axis_at(s[0], p[0], 1)?;
    Ok(s[0].to_vec())
}

/// A row's one parameter: an axis.
const AXIS: [super::ParamSpec; 1] = [int("the axis", "AXIS")];

/// One axis removed, which must not be empty (`min`, `max_dim`).
fn reduce_axis(s: &[&[usize]], p: &[Param]) -> Result<Vec<usize>, Refusal> {
    let d = axis(s[0], p[p.len() - 1])?;
    if s[0][d] == 0 {
        return Err(format!("axis {} of shape {:?} is empty", p[p.len() - 1], s[0]).into());
    }
    Ok(without(s[0], d))
}

/// `sum a [AXIS ...]`: over the axes (none: every element).
pub(super) const SUM: OpRow = OpRow::new("sum", reduced, |_, x, p| run_reduced(x[0], p, false))
    .rest(int("an axis", "AXIS"))
    .positive(Positive::IfInput)
    .gen(Gen::Params(gen_reduced));

/// `mean a [AXIS ...]`: over the axes (none: every element).
pub(super) const MEAN: OpRow = OpRow::new("mean", reduced, |_, x, p| run_reduced(x[0], p, true))
    .rest(int("an axis", "AXIS"))
    .positive(Positive::IfInput)
    .gen(Gen::Params(gen_reduced));

/// `max a AXIS`: the maximum along one axis (keepdim false).
pub(super) const MAX: OpRow = OpRow::new(
    "max",
    |s, p| {
        let s = s[0];
        let d = axis_at(s, p[0], 1)?;
        if s[d] == 0 {
            return Err(Refusal::at(
                1,
                format!(
                    "axis {} of shape {s:?} has no value to take the maximum of (expected a \
                     non-empty axis)",
                    p[0]
                ),
            ));
        }
        Ok(without(s, d))
    },
    |_, x, p| {
        // A reshape where the engine's kernel would reduce some axes of an all-ones shape (see
        // `run_reduced`).
        let s = x[0].try_shape()?.to_vec();
        if all_ones(&s) && norm_axis(p[0].as_i64(), s.len()).is_some() {
            return reshape_to(x[0], &vec![1; s.len() - 1]);
        }
        x[0].max_axes(&[ax(p[0])], false)
    },
)
.params(&AXIS)
.kinked()
.positive(Positive::IfInput)
.gen(Gen::Params(gen_axis_of));

/// `softmax a AXIS`.
pub(super) const SOFTMAX: OpRow =
    OpRow::new("softmax", along_axis, |_, x, p| x[0].softmax(ax(p[0])))
        .params(&AXIS)
        .positive(Positive::Always)
        .gen(Gen::Params(gen_axis_of));

/// `log_softmax a AXIS`.
pub(super) const LOG_SOFTMAX: OpRow = OpRow::new("log_softmax", along_axis, |_, x, p| {
    x[0].log_softmax(ax(p[0]))
})
.params(&AXIS)
.gen(Gen::Params(gen_axis_of));

/// `cumsum a AXIS`. A scalar scans as one element (axis 0 or -1), as the engine's (PyTorch's)
/// cumsum.
pub(super) const CUMSUM: OpRow = OpRow::new(
    "cumsum",
    |s, p| {
        if s[0].is_empty() {
            return axis(&[1], p[0])
                .map(|_| Vec::new())
                .map_err(|_| format!("axis {} is out of range for a scalar", p[0]).into());
        }
        Ok(axis(s[0], p[0]).map(|_| s[0].to_vec())?)
    },
    |_, x, p| x[0].cumsum(ax(p[0])),
)
.params(&AXIS)
.gen(Gen::Params(gen_one_axis));

/// `logsumexp a AXIS`. An empty axis is allowed: the engine gives −∞ there (PyTorch's answer).
pub(super) const LOGSUMEXP: OpRow = OpRow::new(
    "logsumexp",
    |s, p| Ok(axis(s[0], p[0]).map(|d| without(s[0], d))?),
    |_, x, p| x[0].logsumexp(&[ax(p[0])], false),
)
.params(&AXIS)
.gen(Gen::Params(gen_one_axis));

/// `min a AXIS`.
pub(super) const MIN: OpRow = OpRow::new("min", reduce_axis, |_, x, p| {
    x[0].min_axes(&[ax(p[0])], false)
})
.params(&AXIS)
.kinked()
.gen(Gen::Params(gen_one_axis));

/// `max_dim a AXIS`: the gradient to the first maximum, as PyTorch's `max(dim)`.
pub(super) const MAX_DIM: OpRow = OpRow::new("max_dim", reduce_axis, |_, x, p| {
    Ok(x[0].max_dim(ax(p[0]), false)?.0)
})
.params(&AXIS)
.kinked()
.gen(Gen::Params(gen_one_axis));

/// `norm a P AXIS`: the vector p-norm along an axis.
pub(super) const NORM: OpRow = OpRow::new(
    "norm",
    |s, p| {
        let order = p[0].as_f64();
        if order.is_nan() || order <= 0.0 {
            return Err(format!("the order p must be > 0, found {order}").into());
        }
        let d = axis(s[0], p[1])?;
        if order == f64::INFINITY && s[0][d] == 0 {
            // The engine refuses it, as PyTorch: the largest of no magnitudes.
            return Err(format!(
                "the inf norm over axis {} of shape {:?}, which is empty",
                p[1], s[0]
            )
            .into());
        }
        Ok(without(s[0], d))
    },
    |_, x, p| x[0].norm(p[0].as_f64(), &[ax(p[1])], false),
)
.params(&[float("the order p", "P"), int("the axis", "AXIS")])
.kinked()
.gen(Gen::Params(|s, t| {
    const P: [f64; 4] = [1.0, 2.0, f64::INFINITY, 3.0];
    Some(vec![P[usize::from(t[1]) % 4], gen_axis(s, t[0])?])
}));
