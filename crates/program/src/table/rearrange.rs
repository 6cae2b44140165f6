//! Rows that reorder or tile elements: `flip`, `roll`, `repeat`, the values of `sort` and
//! `topk`, `repeat_interleave`, `unsqueeze`, `squeeze`.

use arenagrad_exec::Positive;

use super::{
    ax, axis_and_extent, axis_at, count, flag_at, gen_axis, int, norm_axis, same, Gen, OpRow,
    Refusal,
};

/// `flip a AXIS...`: reversed along each axis (an axis given twice flips back).
pub(super) const FLIP: OpRow = OpRow::new(
    "flip",
    |s, p| {
        for (k, &a) in p.iter().enumerate() {
            axis_at(s[0], a, 1 + k)?;
        }
        Ok(s[0].to_vec())
    },
    |_, x, p| {
        let axes: Vec<isize> = p.iter().map(|&a| ax(a)).collect();
        x[0].flip(&axes)
    },
)
.rest(int("an axis", "AXIS"))
.positive(Positive::IfInput)
.gen(Gen::Params(|s, t| Some(vec![gen_axis(s, t[0])?])));

/// `roll a SHIFT AXIS`: shifted along the axis, wrapping around.
pub(super) const ROLL: OpRow = OpRow::new(
    "roll",
    |s, p| {
        axis_at(s[0], p[1], 2)?;
        same(s, p)
    },
    |_, x, p| x[0].roll(ax(p[0]), ax(p[1])),
)
.params(&[int("the shift", "SHIFT"), int("the axis", "AXIS")])
.positive(Positive::IfInput)
.gen(Gen::Params(|s, t| {
    Some(vec![f64::from(t[1] % 7) - 3.0, gen_axis(s, t[0])?])
}));

/// `repeat a R...`: tiled `R` times along each axis, extra leading counts adding axes.
pub(super) const REPEAT: OpRow = OpRow::new(
    "repeat",
    |s, p| {
        let s = s[0];
        if p.len() < s.len() {
            return Err(Refusal::op(format!(
                "{} repeats for shape {s:?} (expected at least one per axis)",
                p.len()
            )));
        }
        let extra = p.len() - s.len();
        let mut out = Vec::with_capacity(p.len());
        for (k, r) in p.iter().enumerate() {
            let d = if k < extra { 1 } else { s[k - extra] };
            out.push(
                d.checked_mul(r.as_usize())
                    .ok_or_else(|| Refusal::at(1 + k, format!("{d} × {r} overflows an extent")))?,
            );
        }
        Ok(out)
    },
    |_, x, p| {
        let reps: Vec<usize> = p.iter().map(|r| r.as_usize()).collect();
        x[0].repeat(&reps)
    },
)
.rest(count("a repeat count", "R"))
.positive(Positive::IfInput)
.gen(Gen::Params(|s, [t0, t1, t2, _]| {
    // Twice or three times along one axis, sometimes with a new leading axis of 2.
    let mut reps = vec![1.0; s.len()];
    if !s.is_empty() {
        reps[usize::from(t0) % s.len()] = 2.0 + f64::from(t1 % 2);
    }
    if t2 & 1 == 1 || s.is_empty() {
        reps.insert(0, 2.0);
    }
    Some(reps)
}));

/// `sort a AXIS DESC`: the values in order along the axis (DESC 1: descending; ties keep their
/// order, NaN counts as the largest).
pub(super) const SORT: OpRow = OpRow::new(
    "sort",
    |s, p| {
        axis_at(s[0], p[0], 1)?;
        if p[1].as_usize() > 1 {
            return Err(Refusal::at(
                2,
                format!("DESC is {} (expected 0 or 1)", p[1]),
            ));
        }
        same(s, p)
    },
    |_, x, p| Ok(x[0].sort(ax(p[0]), p[1].as_usize() == 1)?.0),
)
.params(&[
    int("the axis", "AXIS"),
    count("descending (0 or 1)", "DESC"),
])
.kinked()
.positive(Positive::IfInput)
.gen(Gen::Params(|s, t| {
    Some(vec![gen_axis(s, t[0])?, f64::from(t[1] & 1)])
}));

/// `topk a K AXIS LARGEST`: the `K` largest values along the axis, largest first (LARGEST 1),
/// or the `K` smallest, smallest first (LARGEST 0), as PyTorch's `torch.topk(a, K, AXIS,
/// largest)`.
pub(super) const TOPK: OpRow = OpRow::new(
    "topk",
    |s, p| {
        let d = axis_at(s[0], p[1], 2)?;
        flag_at(p[2], 3, "LARGEST")?;
        let k = p[0].as_usize();
        if k > s[0][d] {
            return Err(Refusal::at(
                1,
                format!(
                    "K {k} is past axis {} of shape {:?} (expected at most {})",
                    p[1], s[0], s[0][d]
                ),
            ));
        }
        let mut out = s[0].to_vec();
        out[d] = k;
        Ok(out)
    },
    |_, x, p| {
        Ok(x[0]
            .topk(p[0].as_usize(), ax(p[1]), p[2].as_usize() == 1)?
            .0)
    },
)
.params(&[
    count("how many", "K"),
    int("the axis", "AXIS"),
    count("largest (0 or 1)", "LARGEST"),
])
.kinked()
.positive(Positive::IfInput)
.gen(Gen::Params(|s, [t0, t1, t2, _]| {
    let (axis, ext) = axis_and_extent(s, t0, t2 & 1 == 1)?;
    let largest = if t2 & 2 == 0 { 1.0 } else { 0.0 };
    Some(vec![
        (usize::from(t1) % (ext + 1)) as f64,
        axis as f64,
        largest,
    ])
}));

/// `repeat_interleave a R AXIS`: each element `R` times in a row along the axis.
pub(super) const REPEAT_INTERLEAVE: OpRow = OpRow::new(
    "repeat_interleave",
    |s, p| {
        let d = axis_at(s[0], p[1], 2)?;
        let mut out = s[0].to_vec();
        out[d] = out[d].checked_mul(p[0].as_usize()).ok_or_else(|| {
            Refusal::too_large(1, format!("{} × {} overflows an extent", s[0][d], p[0]))
        })?;
        Ok(out)
    },
    |_, x, p| x[0].repeat_interleave(p[0].as_usize(), ax(p[1])),
)
.params(&[count("the repeat count", "R"), int("the axis", "AXIS")])
.positive(Positive::IfInput)
.gen(Gen::Params(|s, [t0, t1, _, _]| {
    Some(vec![1.0 + f64::from(t1 % 3), gen_axis(s, t0)?])
}));

/// `unsqueeze a AXIS`: a new axis of extent 1 at AXIS (−1: after the last).
pub(super) const UNSQUEEZE: OpRow = OpRow::new(
    "unsqueeze",
    |s, p| {
        let r = s[0].len();
        let a = p[0].as_i64();
        // An axis of the result, whose rank is one more.
        match norm_axis(a, r + 1) {
            Some(at) => {
                let mut out = s[0].to_vec();
                out.insert(at, 1);
                Ok(out)
            }
            None => Err(Refusal::at(
                1,
                format!(
                    "axis {a} is out of range for shape {:?}: expected -{}..={r}",
                    s[0],
                    r + 1
                ),
            )),
        }
    },
    |_, x, p| x[0].unsqueeze(ax(p[0])),
)
.params(&[int("the axis", "AXIS")])
.positive(Positive::IfInput)
.gen(Gen::Params(|s, [t0, _, _, _]| {
    Some(vec![(usize::from(t0) % (s.len() + 1)) as f64])
}));

/// `squeeze a AXIS`: without AXIS when its extent is 1 (the same otherwise).
pub(super) const SQUEEZE: OpRow = OpRow::new(
    "squeeze",
    |s, p| {
        let d = axis_at(s[0], p[0], 1)?;
        let mut out = s[0].to_vec();
        if out[d] == 1 {
            out.remove(d);
        }
        Ok(out)
    },
    |_, x, p| x[0].squeeze(Some(ax(p[0]))),
)
.params(&[int("the axis", "AXIS")])
.positive(Positive::IfInput)
.gen(Gen::Params(|s, [t0, _, _, _]| Some(vec![gen_axis(s, t0)?])));
