//! Rows that move, select, copy or join elements: `detach`, `transpose`, `permute`, `reshape`,
//! `broadcast`, `concat`, `slice`, `tril`, `triu`, `stack`, `slice_step`, `chunk`, `split`,
//! `unbind`.

use arenagrad_exec::layout::broadcast_shapes;
use arenagrad_exec::Positive;

use super::{
    all_ones, ax, axis, axis_and_extent, axis_at, axis_of, bad, count, gen_axis, int, norm_axis,
    reshape_to, same, without, Arity, Gen, OpRow, Param, Refusal,
};

/// `detach a`: the same values, with no gradient flowing back.
pub(super) const DETACH: OpRow = OpRow::new("detach", same, |_, x, _| x[0].detach())
    .detaching()
    .positive(Positive::IfInput)
    .gen(Gen::Params(|_, _| Some(Vec::new())));

/// `transpose a D0 D1`.
pub(super) const TRANSPOSE: OpRow = OpRow::new(
    "transpose",
    |s, p| {
        let s = s[0];
        let a = axis_at(s, p[0], 1)?;
        let b = axis_at(s, p[1], 2)?;
        let mut out = s.to_vec();
        out.swap(a, b);
        Ok(out)
    },
    |_, x, p| x[0].transpose(ax(p[0]), ax(p[1])),
)
.params(&[int("the first axis", "D0"), int("the second axis", "D1")])
.positive(Positive::IfInput)
.gen(Gen::Params(|sa, [t0, t1, t2, _]| {
    let r = sa.len();
    (r >= 2).then(|| {
        vec![
            axis_of(r, t0, t2 & 1 == 1) as f64,
            axis_of(r, t1, t2 & 2 == 2) as f64,
        ]
    })
}));

/// `permute a P0 P1 ...`: output axis k is input axis `Pk`.
pub(super) const PERMUTE: OpRow = OpRow::new(
    "permute",
    |s, p| {
        let s = s[0];
        if p.len() != s.len() {
            return Err(Refusal::op(format!(
                "{} axes given for shape {s:?} (expected a permutation of all {} axes)",
                p.len(),
                s.len()
            )));
        }
        let mut seen = vec![false; s.len()];
        let mut out = Vec::with_capacity(s.len());
        for (k, &a) in p.iter().enumerate() {
            let d = axis_at(s, a, 1 + k)?;
            if std::mem::replace(&mut seen[d], true) {
                return Err(Refusal::at(
                    1 + k,
                    format!("axis {a} is repeated (expected each axis once)"),
                ));
            }
            out.push(s[d]);
        }
        Ok(out)
    },
    |_, x, p| {
        let rank = x[0].try_shape()?.len();
        let perm = p
            .iter()
            .map(|&d| norm_axis(d.as_i64(), rank).ok_or(bad("axis out of range")))
            .collect::<Result<Vec<_>, _>>()?;
        x[0].permute(&perm)
    },
)
.rest(int("an axis", "P"))
.positive(Positive::IfInput)
.gen(Gen::Params(|sa, attrs| {
    let r = sa.len();
    if r < 2 {
        return None;
    }
    let mut perm: Vec<usize> = (0..r).collect();
    for k in (1..r).rev() {
        let j = usize::from(attrs[k % 4]) % (k + 1);
        perm.swap(k, j);
    }
    Some(perm.iter().map(|&d| d as f64).collect())
}));

/// `reshape a D0 D1 ...`: one extent may be -1.
pub(super) const RESHAPE: OpRow = OpRow::new(
    "reshape",
    |s, p| {
        let s = s[0];
        let n = s
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .unwrap_or(usize::MAX);
        let shape: Vec<String> = p.iter().map(|d| d.to_string()).collect();
        let shape = format!("[{}]", shape.join(", "));
        let mut infer: Option<usize> = None;
        let mut known: usize = 1;
        let mut out = Vec::with_capacity(p.len());
        for (k, &d) in p.iter().enumerate() {
            let d = d.as_i64();
            if d == -1 && infer.is_none() {
                infer = Some(k);
                out.push(0);
            } else if let Ok(du) = usize::try_from(d) {
                known = known.checked_mul(du).ok_or_else(|| {
                    Refusal::too_large(1 + k, "the shape's element count overflows")
                })?;
                out.push(du);
            } else {
                return Err(Refusal::at(
                    1 + k,
                    format!(
                        "expected a non-negative extent{}, found {d}",
                        if infer.is_none() {
                            " or -1"
                        } else {
                            " (-1 is already used)"
                        }
                    ),
                ));
            }
        }
        if let Some(k) = infer {
            if known == 0 || !n.is_multiple_of(known) {
                return Err(Refusal::at(
                    1 + k,
                    format!("cannot infer -1 when reshaping {s:?} into {shape}"),
                ));
            }
            out[k] = n / known;
        } else if known != n {
            return Err(Refusal::op(format!(
                "cannot reshape {s:?} ({n} elements) into {shape} ({known} elements)"
            )));
        }
        Ok(out)
    },
    |_, x, p| {
        let s: Vec<isize> = p.iter().map(|&d| ax(d)).collect();
        x[0].reshape(&s)
    },
)
.rest(int("an extent", "D"))
.positive(Positive::IfInput)
.gen(Gen::Params(|sa, [t0, t1, _, _]| {
    let total: usize = sa.iter().product();
    Some(match t0 % 4 {
        0 => vec![-1.0],
        1 => vec![total as f64],
        2 => {
            let divs: Vec<usize> = (1..=total).filter(|&d| total.is_multiple_of(d)).collect();
            let d = divs
                .get(usize::from(t1) % divs.len().max(1))
                .copied()
                .unwrap_or(1);
            vec![d as f64, -1.0]
        }
        _ => std::iter::once(1.0)
            .chain(sa.iter().map(|&d| d as f64))
            .collect(),
    })
}));

/// `broadcast a D0 D1 ...`: numpy broadcasting to the shape.
pub(super) const BROADCAST: OpRow = OpRow::new(
    "broadcast",
    |s, p| {
        let s = s[0];
        let to: Vec<usize> = p.iter().map(|d| d.as_usize()).collect();
        if s != to.as_slice() && broadcast_shapes(s, &to).as_deref() != Some(to.as_slice()) {
            return Err(Refusal::op(format!(
                "{s:?} does not broadcast to {to:?} (expected each trailing extent to match or \
                 be 1)"
            )));
        }
        Ok(to)
    },
    |_, x, p| {
        let to: Vec<usize> = p.iter().map(|d| d.as_usize()).collect();
        let from = x[0].try_shape()?.to_vec();
        // A broadcast to all ones is a reshape, which keeps the engine's reduction kernel out
        // of the backward rule (see `sum`'s row).
        let valid = broadcast_shapes(&from, &to).as_deref() == Some(to.as_slice());
        if all_ones(&to) && valid && from != to {
            return reshape_to(x[0], &to);
        }
        x[0].broadcast_to(&to)
    },
)
.rest(count("an extent", "D"))
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| {
    let [t0, t1, t2, t3] = d.attrs;
    let max_dim = d.max_dim.max(1);
    let mut shape: Vec<usize> = d
        .shape(d.a)
        .iter()
        .enumerate()
        .map(|(k, &e)| {
            if e == 1 && (t1 >> (k % 8)) & 1 == 1 {
                1 + usize::from(t2.wrapping_add(k as u8)) % max_dim
            } else {
                e
            }
        })
        .collect();
    if t0 & 1 == 1 {
        shape.insert(0, 1 + usize::from(t3) % max_dim);
    }
    Some((vec![d.a], shape.iter().map(|&e| e as f64).collect()))
}));

/// `concat AXIS a b ...`: joined along the axis.
pub(super) const CONCAT: OpRow = OpRow::new(
    "concat",
    |s, p| {
        let Some(&s0) = s.first() else {
            return Err(Refusal::op("expected at least one operand"));
        };
        let d = axis_at(s0, p[0], 0)?;
        let mut along: usize = 0;
        for (k, x) in s.iter().enumerate() {
            let fits = x.len() == s0.len()
                && x.iter()
                    .zip(s0)
                    .enumerate()
                    .all(|(j, (a, b))| j == d || a == b);
            if !fits {
                return Err(Refusal::at(
                    1 + k,
                    format!(
                        "shape {x:?} does not match {s0:?} (expected equal extents except along \
                         axis {})",
                        p[0]
                    ),
                ));
            }
            along = along
                .checked_add(x[d])
                .ok_or_else(|| Refusal::too_large(1 + k, "the concatenated extent overflows"))?;
        }
        let mut out = s0.to_vec();
        out[d] = along;
        Ok(out)
    },
    |g, x, p| g.concat(x, ax(p[0])),
)
.arity(Arity::AtLeast(1))
.params(&[int("the axis", "AXIS")])
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| {
    let sa = d.shape(d.a).to_vec();
    let r = sa.len();
    if r == 0 {
        return None;
    }
    let [t0, t1, t2, t3] = d.attrs;
    let axis = axis_of(r, t0, t1 & 1 == 1);
    let along = norm_axis(axis, r)?;
    let fits = |s: &[usize]| {
        s.len() == r
            && s.iter()
                .zip(&sa)
                .enumerate()
                .all(|(k, (x, y))| k == along || x == y)
    };
    let mut xs = vec![d.a];
    for k in 0..1 + usize::from(t2 % 2) {
        if let Some(j) = d.pick(fits, if k == 0 { d.b } else { t3 }) {
            xs.push(j);
        }
    }
    Some((xs, vec![axis as f64]))
}));

/// `slice a AXIS START END`: elements START..END along the axis.
pub(super) const SLICE: OpRow = OpRow::new(
    "slice",
    |s, p| {
        let s = s[0];
        let d = axis_at(s, p[0], 1)?;
        let (start, end) = (p[1].as_usize(), p[2].as_usize());
        if start > end || end > s[d] {
            return Err(Refusal::at(
                if start > end { 2 } else { 3 },
                format!(
                    "range {start}..{end} is outside axis {} of shape {s:?} (expected START <= \
                     END <= {})",
                    p[0], s[d]
                ),
            ));
        }
        let mut out = s.to_vec();
        out[d] = end - start;
        Ok(out)
    },
    |_, x, p| x[0].slice(ax(p[0]), p[1].as_usize(), p[2].as_usize()),
)
.params(&[
    int("the axis", "AXIS"),
    count("the start", "START"),
    count("the end", "END"),
])
.positive(Positive::IfInput)
.gen(Gen::Params(|sa, [t0, t1, t2, t3]| {
    let (axis, ext) = axis_and_extent(sa, t0, t3 & 1 == 1)?;
    if ext == 0 {
        return None;
    }
    let start = usize::from(t1) % ext;
    let end = start + 1 + usize::from(t2) % (ext - start);
    Some(vec![axis as f64, start as f64, end as f64])
}));

/// Rank 2 or more, shape unchanged (`tril`, `triu`).
fn rank2(s: &[&[usize]], _p: &[Param]) -> Result<Vec<usize>, Refusal> {
    if s[0].len() < 2 {
        return Err(format!("expected rank 2 or more, found shape {:?}", s[0]).into());
    }
    Ok(s[0].to_vec())
}

/// A diagonal offset in -2..=2, for operands of rank 2 or more (`tril`, `triu`).
fn gen_diagonal(s: &[usize], t: [u8; 4]) -> Option<Vec<f64>> {
    (s.len() >= 2).then(|| vec![f64::from(t[0] % 5) - 2.0])
}

/// `tril a K`: the lower triangle from diagonal K.
pub(super) const TRIL: OpRow = OpRow::new("tril", rank2, |_, x, p| x[0].tril(ax(p[0])))
    .params(&[int("the diagonal", "K")])
    .gen(Gen::Params(gen_diagonal));

/// `triu a K`: the upper triangle from diagonal K.
pub(super) const TRIU: OpRow = OpRow::new("triu", rank2, |_, x, p| x[0].triu(ax(p[0])))
    .params(&[int("the diagonal", "K")])
    .gen(Gen::Params(gen_diagonal));

/// `stack a b AXIS`: joined along a new axis.
pub(super) const STACK: OpRow = OpRow::new(
    "stack",
    |s, p| {
        if !s.iter().all(|x| *x == s[0]) {
            return Err(format!("expected operands of one shape, found {s:?}").into());
        }
        let r = s[0].len() + 1;
        let d = norm_axis(p[0].as_i64(), r)
            .ok_or_else(|| format!("axis {} is out of range for rank {r}", p[0]))?;
        let mut o = s[0].to_vec();
        o.insert(d, s.len());
        Ok(o)
    },
    |g, x, p| g.stack(x, ax(p[0])),
)
.arity(Arity::Exactly(2))
.params(&[int("the axis", "AXIS")])
.gen(Gen::Params(|s, t| {
    let r = s.len() + 1;
    Some(vec![(usize::from(t[0]) % r) as f64])
}));

/// `slice_step a AXIS START END STEP`.
pub(super) const SLICE_STEP: OpRow = OpRow::new(
    "slice_step",
    |s, p| {
        let d = axis(s[0], p[0])?;
        let (start, end, step) = (p[1].as_usize(), p[2].as_usize(), p[3].as_usize());
        if step == 0 || start > end || end > s[0][d] {
            return Err(format!(
                "{start}..{end} by {step} does not fit axis {} of {:?}",
                p[0], s[0]
            )
            .into());
        }
        let mut o = s[0].to_vec();
        o[d] = (end - start).div_ceil(step);
        Ok(o)
    },
    |_, x, p| {
        let (start, end, step) = (p[1].as_usize(), p[2].as_usize(), p[3].as_usize());
        x[0].slice_step(ax(p[0]), start, end, step)
    },
)
.params(&[
    int("the axis", "AXIS"),
    count("the start", "START"),
    count("the end", "END"),
    count("the step", "STEP"),
])
.gen(Gen::Params(|s, t| {
    let a = gen_axis(s, t[0])?;
    let ext = s[norm_axis(a as i64, s.len())?];
    let start = usize::from(t[1]) % ext.max(1);
    Some(vec![a, start as f64, ext as f64, f64::from(1 + t[2] % 3)])
}));

/// Pieces of `size` along axis `d` of `s`.
fn pieces(s: &[usize], d: usize, size: usize) -> usize {
    s[d].div_ceil(size.max(1))
}

/// The `k`-th piece of `size` along axis `p_axis` alone (a slice; never all of them, whose
/// number may be huge on an empty axis).
fn piece<'g>(
    x: arenagrad_graph::Tensor<'g>,
    p_axis: Param,
    size: usize,
    k: usize,
) -> Result<arenagrad_graph::Tensor<'g>, arenagrad_graph::GraphError> {
    let s = x.try_shape()?;
    let d = norm_axis(p_axis.as_i64(), s.len()).ok_or(bad("axis out of range"))?;
    let start = k.saturating_mul(size).min(s[d]);
    x.slice(d as isize, start, start.saturating_add(size).min(s[d]))
}

/// `chunk a N AXIS K`: the K-th of N chunks along the axis.
pub(super) const CHUNK: OpRow = OpRow::new(
    "chunk",
    |s, p| {
        let d = axis(s[0], p[1])?;
        let (n, k) = (p[0].as_usize(), p[2].as_usize());
        if n == 0 {
            return Err("the number of chunks must be ≥ 1".to_string().into());
        }
        let size = s[0][d].div_ceil(n);
        let count = if s[0][d] == 0 {
            n
        } else {
            pieces(s[0], d, size)
        };
        if k >= count {
            return Err(format!("chunk {k} of {count} along axis {}", p[1]).into());
        }
        let mut o = s[0].to_vec();
        o[d] = if s[0][d] == 0 {
            0
        } else {
            size.min(s[0][d] - k * size)
        };
        Ok(o)
    },
    |_, x, p| {
        let s = x[0].try_shape()?;
        let d = norm_axis(p[1].as_i64(), s.len()).ok_or(bad("axis out of range"))?;
        let size = s[d].div_ceil(p[0].as_usize().max(1));
        piece(x[0], p[1], size, p[2].as_usize())
    },
)
.params(&[
    count("the number of chunks", "N"),
    int("the axis", "AXIS"),
    count("which chunk", "K"),
])
.gen(Gen::Params(|s, t| {
    let a = gen_axis(s, t[0])?;
    let ext = s[norm_axis(a as i64, s.len())?];
    let n = 1 + usize::from(t[1]) % 3;
    let size = ext.div_ceil(n);
    let count = if ext == 0 {
        n
    } else {
        ext.div_ceil(size.max(1))
    };
    Some(vec![n as f64, a, (usize::from(t[2]) % count) as f64])
}));

/// `split a SIZE AXIS K`: the K-th piece of SIZE along the axis.
pub(super) const SPLIT: OpRow = OpRow::new(
    "split",
    |s, p| {
        let d = axis(s[0], p[1])?;
        let (size, k) = (p[0].as_usize(), p[2].as_usize());
        if size == 0 {
            return Err("the piece size must be ≥ 1".to_string().into());
        }
        let count = pieces(s[0], d, size).max(1);
        if k >= count {
            return Err(format!("piece {k} of {count} along axis {}", p[1]).into());
        }
        let mut o = s[0].to_vec();
        o[d] = size.min(s[0][d].saturating_sub(k * size));
        Ok(o)
    },
    |_, x, p| piece(x[0], p[1], p[0].as_usize(), p[2].as_usize()),
)
.params(&[
    count("the piece size", "SIZE"),
    int("the axis", "AXIS"),
    count("which piece", "K"),
])
.gen(Gen::Params(|s, t| {
    let a = gen_axis(s, t[0])?;
    let ext = s[norm_axis(a as i64, s.len())?];
    let size = 1 + usize::from(t[1]) % ext.max(1);
    let count = ext.div_ceil(size).max(1);
    Some(vec![size as f64, a, (usize::from(t[2]) % count) as f64])
}));

/// `unbind a AXIS K`: the K-th slice along the axis, the axis removed.
pub(super) const UNBIND: OpRow = OpRow::new(
    "unbind",
    |s, p| {
        let d = axis(s[0], p[0])?;
        if p[1].as_usize() >= s[0][d] {
            return Err(format!("slice {} of {} along axis {}", p[1], s[0][d], p[0]).into());
        }
        Ok(without(s[0], d))
    },
    |_, x, p| {
        let s = x[0].try_shape()?;
        let d = norm_axis(p[0].as_i64(), s.len()).ok_or(bad("axis out of range"))?;
        let k = p[1].as_usize();
        let mut out: Vec<isize> = s.iter().map(|&e| e as isize).collect();
        out.remove(d);
        x[0].slice(d as isize, k, k + 1)?.reshape(&out)
    },
)
.params(&[int("the axis", "AXIS"), count("which slice", "K")])
.gen(Gen::Params(|s, t| {
    let a = gen_axis(s, t[0])?;
    let ext = s[norm_axis(a as i64, s.len())?];
    (ext > 0).then(|| vec![a, (usize::from(t[1]) % ext) as f64])
}));
