//! Rows whose second operand holds indices: `gather`, `index_select`, `scatter_add`,
//! `index_add`, `scatter_reduce`. An index operand is an integer `const` (`const i64 …`, `i32`,
//! `u8`) or a tensor of whole numbers of the program's floating dtype, either read as the `i64`
//! tensor PyTorch's ops take; a value that is not a whole number, or is out of range, is refused
//! when the statement runs, naming the op.

use arenagrad_graph::{Graph, GraphError, ScatterReduce, Tensor};

use super::{
    ax, axis_at, count, flag_at, gen_axis, int, whole_values, Arity, Draw, Drawn, Gen, OpRow,
    Param, Refusal,
};

/// `t`'s values as an `i64` index tensor of its shape, for `op`: each a whole number, 0 or
/// more (the range is the op's to check).
fn as_index<'g>(g: &'g Graph, t: Tensor<'g>, op: &'static str) -> Result<Tensor<'g>, GraphError> {
    let what = "an index that is not a whole number of at least 0";
    g.from_slice(&whole_values(t, op, what, false)?, &t.try_shape()?)
}

/// Whether `small` has `big`'s rank and is no larger on any axis but `skip` (`usize::MAX`:
/// none skipped).
fn within(small: &[usize], big: &[usize], skip: usize) -> bool {
    small.len() == big.len()
        && small
            .iter()
            .zip(big)
            .enumerate()
            .all(|(d, (a, b))| d == skip || a <= b)
}

/// The index (operand 1) within `of` off axis `d` ([`within`]), or a refusal pointing at it.
fn within_off_axis(idx: &[usize], of: &[usize], d: usize) -> Result<(), Refusal> {
    if within(idx, of, d) {
        return Ok(());
    }
    Err(Refusal::at(
        1,
        format!("the index {idx:?} must have the rank of {of:?} and be no larger off axis {d}"),
    ))
}

/// A 1-D (or 0-D) index, or why not.
fn one_dim(idx: &[usize]) -> Result<usize, Refusal> {
    if idx.len() > 1 {
        return Err(Refusal::at(
            1,
            format!("the index {idx:?} must have one dimension (or none)"),
        ));
    }
    Ok(idx.iter().product())
}

/// `gather a idx AXIS`: PyTorch's `torch.gather(a, AXIS, idx)`: the output has `idx`'s shape,
/// whose rank is `a`'s and which is no larger than `a` off AXIS.
pub(super) const GATHER: OpRow = OpRow::new(
    "gather",
    |s, p| {
        let d = axis_at(s[0], p[0], 2)?;
        within_off_axis(s[1], s[0], d)?;
        Ok(s[1].to_vec())
    },
    |g, x, p| x[0].gather_by(ax(p[0]), as_index(g, x[1], "gather")?),
)
.integers(&[(1, super::INDEX)])
.arity(Arity::Exactly(2))
.params(&[int("the axis", "AXIS")])
.gen(Gen::Operands(|d| {
    let a = d.shape(d.a).to_vec();
    let t = d.attrs;
    let axis = gen_axis(&a, t[0])?;
    let k = super::norm_axis(axis as i64, a.len())?;
    let mut idx = a.clone();
    idx[k] = 1 + usize::from(t[1]) % d.max_dim.max(1);
    shrink_one(&mut idx, &a, Some(k), t[2]);
    index_draw(d, idx, a[k], vec![axis])
}));

/// With the attribute byte's low bit set, one axis (other than `skip`) made smaller: an index
/// no larger than its source, as PyTorch allows.
fn shrink_one(idx: &mut [usize], of: &[usize], skip: Option<usize>, t: u8) {
    let r = idx.len();
    let j = match skip {
        Some(k) if r > 1 => (k + 1 + usize::from(t >> 1) % (r - 1)) % r,
        None if r > 0 => usize::from(t >> 1) % r,
        _ => return,
    };
    if t & 1 == 1 && of[j] > 0 {
        idx[j] = 1 + usize::from(t >> 4) % of[j];
    }
}

/// The drawn operand, fresh indices of `shape` below `bound`, and `params`, where they fit.
fn index_draw(
    d: &mut Draw<'_>,
    shape: Vec<usize>,
    bound: usize,
    params: Vec<f64>,
) -> Option<Drawn> {
    if bound == 0 || !d.fits(&shape) {
        return None;
    }
    let i = d.fresh_indices(shape, bound);
    Some((vec![d.a, i], params))
}

/// `index_select a idx AXIS`: PyTorch's `torch.index_select(a, AXIS, idx)`, `idx` 1-D.
pub(super) const INDEX_SELECT: OpRow = OpRow::new(
    "index_select",
    |s, p| {
        let d = axis_at(s[0], p[0], 2)?;
        let n = one_dim(s[1])?;
        let mut out = s[0].to_vec();
        out[d] = n;
        Ok(out)
    },
    |g, x, p| x[0].index_select_by(ax(p[0]), as_index(g, x[1], "index_select")?),
)
.integers(&[(1, super::INDEX)])
.arity(Arity::Exactly(2))
.params(&[int("the axis", "AXIS")])
.gen(Gen::Operands(|d| {
    let a = d.shape(d.a).to_vec();
    let t = d.attrs;
    let axis = gen_axis(&a, t[0])?;
    let k = super::norm_axis(axis as i64, a.len())?;
    let n = 1 + usize::from(t[1]) % d.max_dim.max(1);
    let mut out = a.clone();
    out[k] = n;
    if !d.fits(&out) {
        return None;
    }
    index_draw(d, vec![n], a[k], vec![axis])
}));

/// The shape rule of a scatter (`self`, `idx`, `src` and the axis in parameter 0): `idx` has
/// the rank of both, is no larger than `src` and no larger than `self` off the axis.
fn scatter_shape(s: &[&[usize]], p: &[Param]) -> Result<Vec<usize>, Refusal> {
    let d = axis_at(s[0], p[0], 3)?;
    if !within(s[1], s[2], usize::MAX) {
        return Err(Refusal::at(
            1,
            format!(
                "the index {:?} must have the rank of src {:?} and be no larger",
                s[1], s[2]
            ),
        ));
    }
    within_off_axis(s[1], s[0], d)?;
    Ok(s[0].to_vec())
}

/// Random scatters: into the operand drawn, from a fresh source whose extent along the axis is
/// drawn, at fresh indices of the source's shape (one axis smaller, sometimes); `extra` after
/// the axis.
fn scatter_draw(d: &mut Draw<'_>, extra: Vec<f64>) -> Option<Drawn> {
    let a = d.shape(d.a).to_vec();
    let t = d.attrs;
    let axis = gen_axis(&a, t[0])?;
    let k = super::norm_axis(axis as i64, a.len())?;
    let mut src = a.clone();
    src[k] = 1 + usize::from(t[1]) % d.max_dim.max(1);
    if a[k] == 0 || !d.fits(&src) {
        return None;
    }
    let mut idx = src.clone();
    shrink_one(&mut idx, &src, None, t[2]);
    let si = d.fresh_input(src);
    let ii = d.fresh_indices(idx, a[k]);
    Some((vec![d.a, ii, si], [vec![axis], extra].concat()))
}

/// `scatter_add a idx src AXIS`: PyTorch's `a.scatter_add(AXIS, idx, src)`.
pub(super) const SCATTER_ADD: OpRow = OpRow::new("scatter_add", scatter_shape, |g, x, p| {
    x[0].scatter_add(ax(p[0]), as_index(g, x[1], "scatter_add")?, x[2])
})
.integers(&[(1, super::INDEX)])
.arity(Arity::Exactly(3))
.params(&[int("the axis", "AXIS")])
.gen(Gen::Operands(|d| scatter_draw(d, Vec::new())));

/// `scatter_reduce a idx src AXIS REDUCE INCLUDE_SELF`: PyTorch's `a.scatter_reduce(AXIS, idx,
/// src, reduce, include_self=INCLUDE_SELF)`, REDUCE 0 `"sum"`, 1 `"mean"`, 2 `"amax"`, 3
/// `"amin"`, INCLUDE_SELF 0 or 1.
pub(super) const SCATTER_REDUCE: OpRow = OpRow::new(
    "scatter_reduce",
    |s, p| {
        if p[1].as_usize() > 3 {
            return Err(Refusal::at(
                4,
                format!(
                    "reduce {}: expected 0 (sum), 1 (mean), 2 (amax) or 3 (amin)",
                    p[1]
                ),
            ));
        }
        flag_at(p[2], 5, "include_self")?;
        scatter_shape(s, p)
    },
    |g, x, p| {
        let reduce = [
            ScatterReduce::Sum,
            ScatterReduce::Mean,
            ScatterReduce::Amax,
            ScatterReduce::Amin,
        ][p[1].as_usize().min(3)];
        let idx = as_index(g, x[1], "scatter_reduce")?;
        x[0].scatter_reduce(ax(p[0]), idx, x[2], reduce, p[2].as_usize() == 1)
    },
)
.integers(&[(1, super::INDEX)])
.arity(Arity::Exactly(3))
.params(&[
    int("the axis", "AXIS"),
    count("the reduction", "REDUCE"),
    count("include_self", "INCLUDE_SELF"),
])
.kinked()
.gen(Gen::Operands(|d| {
    let t = d.attrs[3];
    scatter_draw(d, vec![f64::from(t % 4), f64::from((t >> 2) & 1)])
}));

/// `index_add a idx src AXIS`: PyTorch's `a.index_add(AXIS, idx, src)`, `idx` 1-D and `src`
/// `a`'s shape but `idx`'s length along AXIS.
pub(super) const INDEX_ADD: OpRow = OpRow::new(
    "index_add",
    |s, p| {
        let d = axis_at(s[0], p[0], 3)?;
        let n = one_dim(s[1])?;
        let mut want = s[0].to_vec();
        want[d] = n;
        if s[2] != want.as_slice() {
            return Err(Refusal::at(
                2,
                format!(
                    "src {:?}: expected {want:?} (the index's length along axis {d})",
                    s[2]
                ),
            ));
        }
        Ok(s[0].to_vec())
    },
    |g, x, p| x[0].index_add(ax(p[0]), as_index(g, x[1], "index_add")?, x[2]),
)
.integers(&[(1, super::INDEX)])
.arity(Arity::Exactly(3))
.params(&[int("the axis", "AXIS")])
.gen(Gen::Operands(|d| {
    let a = d.shape(d.a).to_vec();
    let t = d.attrs;
    let axis = gen_axis(&a, t[0])?;
    let k = super::norm_axis(axis as i64, a.len())?;
    let n = 1 + usize::from(t[1]) % d.max_dim.max(1);
    let mut src = a.clone();
    src[k] = n;
    if a[k] == 0 || !d.fits(&src) {
        return None;
    }
    let si = d.fresh_input(src);
    let ii = d.fresh_indices(vec![n], a[k]);
    Some((vec![d.a, ii, si], vec![axis]))
}));
