//! Reductions over any set of axes, and softmax along one axis.

use super::wide::wide;
use crate::layout::{contiguous_strides, walk};
use crate::Float;

use crate::ops::ReduceKernel;
pub use crate::ops::ReduceOp;

/// Reduces `x` of `shape` over the axes where `reduced[d]` is true. `out` is laid out as the
/// keep-dim result (reduced axes of extent 1), so its length is the product of the kept extents.
/// The identity and the step are the op's row of the reduction table ([`ReduceOp`]).
pub fn reduce<T: Float>(op: ReduceOp, x: &[T], shape: &[usize], reduced: &[bool], out: &mut [T]) {
    op.with_combine(Reduce {
        x,
        shape,
        reduced,
        out,
    })
}

/// [`reduce`]'s arguments, run with one row's identity and step.
struct Reduce<'a, T> {
    x: &'a [T],
    shape: &'a [usize],
    reduced: &'a [bool],
    out: &'a mut [T],
}

impl<T: Float> ReduceKernel<T> for Reduce<'_, T> {
    type Out = ();

    #[inline(always)]
    fn run<F: Fn(T, T) -> T + Sync + Copy>(self, init: T, f: F) {
        let Reduce {
            x,
            shape,
            reduced,
            out,
        } = self;
        out.fill(init);
        if let Some((lead, outer, inner)) = reduced_block(shape, reduced) {
            // The reduced axes form one leading or one trailing block (a bias gradient, a
            // loss's mean, a row sum): plain loops over rows, no index bookkeeping.
            let rows = x.chunks_exact(inner.max(1)).take(outer);
            wide(
                x.len(),
                #[inline(always)]
                move || {
                    if lead {
                        rows.for_each(|r| out.iter_mut().zip(r).for_each(|(o, &v)| *o = f(*o, v)))
                    } else {
                        out.iter_mut()
                            .zip(rows)
                            .for_each(|(o, r)| *o = fold_row(r, init, f))
                    }
                },
            );
            return;
        }
        let out_shape: Vec<usize> = shape
            .iter()
            .zip(reduced)
            .map(|(&d, &r)| if r { 1 } else { d })
            .collect();
        let os = contiguous_strides(&out_shape);
        let os: Vec<usize> = os
            .iter()
            .zip(reduced)
            .map(|(&s, &r)| if r { 0 } else { s })
            .collect();
        let xs = contiguous_strides(shape);
        if x.is_empty() {
            return;
        }
        walk(shape, [&xs, &os], |[ox, oo], n, [ix, io]| {
            debug_assert!(ix == 1 || n == 1, "the input is contiguous");
            let row = &x[ox..ox + n];
            match io {
                0 => out[oo] = f(out[oo], fold_row(row, init, f)),
                // Reducing a leading axis: whole rows fold into the output row (vectorises).
                1 => {
                    for (o, &v) in out[oo..oo + n].iter_mut().zip(row) {
                        *o = f(*o, v);
                    }
                }
                _ => {
                    for (i, &v) in row.iter().enumerate() {
                        let o = &mut out[oo + i * io];
                        *o = f(*o, v);
                    }
                }
            }
        });
    }
}

/// When the reduced axes (of extent above 1) are all before the kept ones or all after them:
/// `(leading, outer, inner)`, the input seen as `outer` rows of `inner` elements, where the rows
/// are what a leading block sums over and what a trailing block sums along.
fn reduced_block(shape: &[usize], reduced: &[bool]) -> Option<(bool, usize, usize)> {
    let (mut first, mut second, mut switches, mut prev) = (1usize, 1usize, 0, None);
    let mut leading = false;
    for (&d, &r) in shape.iter().zip(reduced).filter(|(&d, _)| d != 1) {
        match prev {
            None => leading = r,
            Some(p) if p != r => switches += 1,
            _ => {}
        }
        prev = Some(r);
        if switches == 0 {
            first *= d;
        } else {
            second *= d;
        }
    }
    if shape.contains(&0) || switches > 1 {
        return None;
    }
    // Everything reduced: one row along which to sum.
    Some(if switches == 0 && leading {
        (false, 1, first)
    } else {
        (leading, first, second)
    })
}

/// `row` folded by `f` from `init` in eight independent lanes, the lanes then joined in pairs
/// (0 with 4, 1 with 5, ...) and the tail folded in order: the lanes vectorise and do not wait
/// on one another, and a sum loses less precision than one running sum on long rows.
#[inline(always)]
fn fold_row<T: Float, F: Fn(T, T) -> T>(row: &[T], init: T, f: F) -> T {
    let mut acc = [init; 8];
    let chunks = row.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] = f(acc[i], c[i]);
        }
    }
    let mut s = f(
        f(f(acc[0], acc[4]), f(acc[1], acc[5])),
        f(f(acc[2], acc[6]), f(acc[3], acc[7])),
    );
    for &v in rem {
        s = f(s, v);
    }
    s
}

/// Sum with eight independent accumulators (`fold_row` with the sum's row).
#[inline(always)]
pub fn sum_row<T: Float>(row: &[T]) -> T {
    let op = ReduceOp::Sum;
    fold_row(row, op.identity(), |a, v| op.combine(a, v))
}

/// Maximum with eight independent lanes (NaN propagates through each): `fold_row` with the
/// maximum's row.
#[inline(always)]
fn max_row<T: Float>(row: &[T]) -> T {
    let op = ReduceOp::Max;
    fold_row(row, op.identity(), |a, v| op.combine(a, v))
}

/// Splits a shape around `axis` into (outer, extent, inner).
pub fn around_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// Running sums along `axis` of the contiguous `x` of `shape`: `out[k] = x[0] + … + x[k]`, or
/// from the end (`out[k] = x[k] + … + x[len − 1]`) when `reverse` (the adjoint). Sums in index
/// order, as PyTorch's CPU `cumsum`.
pub fn cumsum<T: Float>(x: &[T], shape: &[usize], axis: usize, reverse: bool, out: &mut [T]) {
    let (outer, len, inner) = around_axis(shape, axis);
    for o in 0..outer {
        let base = o * len * inner;
        for step in 0..len {
            let k = if reverse { len - 1 - step } else { step };
            let row = base + k * inner;
            if step == 0 {
                out[row..row + inner].copy_from_slice(&x[row..row + inner]);
                continue;
            }
            let prev = if reverse { row + inner } else { row - inner };
            for t in 0..inner {
                out[row + t] = out[prev + t] + x[row + t];
            }
        }
    }
}

/// Softmax (or log-softmax) along `axis`, stable: the row maximum is subtracted first.
pub fn softmax<T: Float>(x: &[T], shape: &[usize], axis: usize, log: bool, out: &mut [T]) {
    let (outer, len, inner) = around_axis(shape, axis);
    if len == 0 {
        return;
    }
    if inner == 1 {
        // Along the last axis: contiguous rows, each shifted by its maximum, exponentiated and
        // normalised. Short rows (class scores, say) go a group at a time: all shifted first,
        // then one exp over the group — row by row, each call would pay the kernel's setup and
        // scalar tail for a handful of elements. The group's maxima stay on the stack, so each
        // is found once. Long rows go one at a time, while the row is in cache.
        wide(
            x.len(),
            #[inline(always)]
            move || {
                if len < 64 {
                    const GROUP: usize = 256;
                    let per = (GROUP / len).max(1);
                    let mut maxima = [T::ZERO; GROUP];
                    for (xg, og) in x.chunks(per * len).zip(out.chunks_mut(per * len)) {
                        let rows = xg.chunks_exact(len).zip(og.chunks_exact_mut(len));
                        for ((xr, or), m) in rows.zip(maxima.iter_mut()) {
                            *m = stable_max(xr);
                            shift_row(xr, or, *m);
                        }
                        exp_in_place(og);
                        let rows = xg.chunks_exact(len).zip(og.chunks_exact_mut(len));
                        for ((xr, or), &m) in rows.zip(maxima.iter()) {
                            normalise_row(xr, or, m, log);
                        }
                    }
                } else {
                    let rows = x.chunks_exact(len).zip(out.chunks_exact_mut(len));
                    for (xr, or) in rows {
                        let m = stable_max(xr);
                        shift_row(xr, or, m);
                        exp_in_place(or);
                        normalise_row(xr, or, m, log);
                    }
                }
            },
        );
        return;
    }
    for o in 0..outer {
        for i in 0..inner {
            let base = o * len * inner + i;
            let at = |j: usize| base + j * inner;
            let mut m = T::neg_infinity();
            for j in 0..len {
                m = m.max(x[at(j)]);
            }
            if m == T::neg_infinity() {
                m = T::ZERO;
            }
            let mut s = T::ZERO;
            for j in 0..len {
                let e = (x[at(j)] - m).exp();
                out[at(j)] = e;
                s += e;
            }
            if log {
                // `(v − m) − ln s`, not `v − (ln s + m)`: for large logits `ln s + m` rounds
                // `ln s` away (see `normalise_row`).
                let ls = s.ln();
                for j in 0..len {
                    out[at(j)] = (x[at(j)] - m) - ls;
                }
            } else {
                let inv = T::ONE / s;
                for j in 0..len {
                    out[at(j)] *= inv;
                }
            }
        }
    }
}

/// A row's maximum, or zero for a row of `-inf` (so that shifting it leaves `-inf`, not NaN).
#[inline(always)]
fn stable_max<T: Float>(xr: &[T]) -> T {
    let m = max_row(xr);
    if m == T::neg_infinity() {
        T::ZERO
    } else {
        m
    }
}

/// `or = xr - m`.
#[inline(always)]
fn shift_row<T: Float>(xr: &[T], or: &mut [T], m: T) {
    for (o, &v) in or.iter_mut().zip(xr) {
        *o = v - m;
    }
}

/// Given `or = e^(xr - m)`: softmax `or / Σor`, or log-softmax `(xr − m) − ln Σor`.
///
/// The log-softmax subtracts the maximum first, as PyTorch does: `xr − (ln Σ + m)` adds a small
/// `ln Σ` to a large `m` and rounds it away (logits of 1e7 in f32 gave −1 for −ln 2).
#[inline(always)]
fn normalise_row<T: Float>(xr: &[T], or: &mut [T], m: T, log: bool) {
    let s = sum_row(or);
    if log {
        let ls = s.ln();
        for (o, &v) in or.iter_mut().zip(xr) {
            *o = (v - m) - ls;
        }
    } else {
        let inv = T::ONE / s;
        for o in or.iter_mut() {
            *o *= inv;
        }
    }
}

/// `v[i] = e^v[i]`, through a stack buffer so the kernel can read and write separate slices.
#[inline(always)]
fn exp_in_place<T: Float>(v: &mut [T]) {
    let mut buf = [T::ZERO; 256];
    for c in v.chunks_mut(256) {
        let b = &mut buf[..c.len()];
        b.copy_from_slice(c);
        T::exp_into(b, c);
    }
}

/// The mean negative log-likelihood of `targets` in log-probability rows `lsm` of `classes`
/// entries: `−Σ_r lsm[r, targets[r]] / m`, summed in the lanes [`sum_row`] uses (so it equals
/// the composed `gather`, `neg`, `sum`, `scale`). `targets` are in range.
pub fn nll_mean<T: Float>(lsm: &[T], classes: usize, targets: &[usize]) -> T {
    let m = targets.len();
    let picked = |r: usize| -lsm[r * classes + targets[r]];
    let full = m / 8 * 8;
    let mut acc = [T::ZERO; 8];
    for base in (0..full).step_by(8) {
        for (k, a) in acc.iter_mut().enumerate() {
            *a += picked(base + k);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for r in full..m {
        s += picked(r);
    }
    s * T::from_f64(1.0 / m as f64)
}

/// The derivative of [`nll_mean`] of `log_softmax(x)` in `x`, times `k`: `(e^lsm − onehot)·k`,
/// in one pass after one vectorised exp.
pub fn nll_mean_grad<T: Float>(lsm: &[T], classes: usize, targets: &[usize], k: T, out: &mut [T]) {
    T::exp_into(lsm, out);
    for (r, &t) in targets.iter().enumerate() {
        out[r * classes + t] -= T::ONE;
    }
    out.iter_mut().for_each(|v| *v *= k);
}

/// The fused softmax derivatives along `axis`, given the forward output `y` and upstream `g`:
/// softmax: `g·y - y·Σ(g·y)`; log-softmax: `g - softmax·Σg` with softmax = e^y.
pub fn softmax_grad<T: Float>(
    y: &[T],
    g: &[T],
    shape: &[usize],
    axis: usize,
    log: bool,
    out: &mut [T],
) {
    let (outer, len, inner) = around_axis(shape, axis);
    if inner == 1 && len > 0 {
        // Along the last axis: contiguous rows; for log-softmax one vectorised exp over the
        // whole buffer first (the softmax itself, e^y).
        wide(
            y.len(),
            #[inline(always)]
            move || {
                if log {
                    T::exp_into(y, out);
                }
                let rows = y.chunks_exact(len).zip(g.chunks_exact(len));
                for ((yr, gr), or) in rows.zip(out.chunks_exact_mut(len)) {
                    if log {
                        let s = sum_row(gr);
                        for (o, &gv) in or.iter_mut().zip(gr) {
                            *o = gv - *o * s;
                        }
                    } else {
                        let mut s = T::ZERO;
                        for (&gv, &yv) in gr.iter().zip(yr) {
                            s += gv * yv;
                        }
                        for ((o, &yv), &gv) in or.iter_mut().zip(yr).zip(gr) {
                            *o = yv * (gv - s);
                        }
                    }
                }
            },
        );
        return;
    }
    for o in 0..outer {
        for i in 0..inner {
            let base = o * len * inner + i;
            let at = |j: usize| base + j * inner;
            if log {
                let mut s = T::ZERO;
                for j in 0..len {
                    s += g[at(j)];
                }
                for j in 0..len {
                    out[at(j)] = g[at(j)] - y[at(j)].exp() * s;
                }
            } else {
                let mut s = T::ZERO;
                for j in 0..len {
                    s += g[at(j)] * y[at(j)];
                }
                for j in 0..len {
                    out[at(j)] = y[at(j)] * (g[at(j)] - s);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_and_max_over_axes() {
        let x: Vec<f64> = (0..24).map(f64::from).collect();
        let mut o = vec![0.0; 4];
        reduce(ReduceOp::Sum, &x, &[2, 3, 4], &[true, true, false], &mut o);
        assert_eq!(o, vec![60.0, 66.0, 72.0, 78.0]);
        let mut o = vec![0.0; 6];
        reduce(ReduceOp::Max, &x, &[2, 3, 4], &[false, false, true], &mut o);
        assert_eq!(o, vec![3.0, 7.0, 11.0, 15.0, 19.0, 23.0]);
        let mut o = vec![0.0; 1];
        reduce(ReduceOp::Sum, &x, &[2, 3, 4], &[true, true, true], &mut o);
        assert_eq!(o, vec![276.0]);
    }

    /// Every subset of axes of a few shapes (extent-1 axes among them, so that blocks of reduced
    /// axes are interrupted by axes that do not count): the result equals a sum or maximum taken
    /// element by element over the input's multi-indices.
    #[test]
    fn every_axis_subset_matches_an_index_by_index_reduction() {
        for shape in [
            vec![3, 1, 4, 5],
            vec![2, 3, 1],
            vec![1, 6],
            vec![4],
            vec![2, 1, 3, 1, 2],
        ] {
            let n: usize = shape.iter().product();
            let x: Vec<f64> = (0..n).map(|i| ((i * 7919) % 23) as f64 - 11.0).collect();
            let strides = contiguous_strides(&shape);
            for mask in 0..1u32 << shape.len() {
                let reduced: Vec<bool> = (0..shape.len()).map(|d| mask >> d & 1 == 1).collect();
                let kept: Vec<usize> = (0..shape.len())
                    .map(|d| if reduced[d] { 1 } else { shape[d] })
                    .collect();
                let ks = contiguous_strides(&kept);
                let mut sum = vec![0.0; kept.iter().product()];
                let mut max = vec![f64::NEG_INFINITY; sum.len()];
                for (i, &v) in x.iter().enumerate() {
                    let o: usize = (0..shape.len())
                        .filter(|&d| !reduced[d])
                        .map(|d| (i / strides[d]) % shape[d] * ks[d])
                        .sum();
                    sum[o] += v;
                    max[o] = max[o].max(v);
                }
                let mut got = vec![0.0; sum.len()];
                reduce(ReduceOp::Sum, &x, &shape, &reduced, &mut got);
                assert_eq!(got, sum, "sum of {shape:?} over {reduced:?}");
                reduce(ReduceOp::Max, &x, &shape, &reduced, &mut got);
                assert_eq!(got, max, "max of {shape:?} over {reduced:?}");
                // Every row of the reduction table, against its own identity and step taken
                // element by element (exact here: small integers, in any order).
                for &op in ReduceOp::KINDS {
                    let mut want = vec![op.identity::<f64>(); sum.len()];
                    for (i, &v) in x.iter().enumerate() {
                        let o: usize = (0..shape.len())
                            .filter(|&d| !reduced[d])
                            .map(|d| (i / strides[d]) % shape[d] * ks[d])
                            .sum();
                        want[o] = op.combine(want[o], v);
                    }
                    reduce(op, &x, &shape, &reduced, &mut got);
                    assert_eq!(got, want, "{} of {shape:?} over {reduced:?}", op.name());
                }
            }
        }
    }

    #[test]
    fn max_propagates_nan_from_any_lane() {
        for at in 0..19 {
            let mut x = vec![1.0f32; 19];
            x[at] = f32::NAN;
            let mut o = [0.0f32];
            reduce(ReduceOp::Max, &x, &[19], &[true], &mut o);
            assert!(o[0].is_nan(), "NaN at {at}");
        }
    }

    /// Short rows go through the grouped path: more rows than fit one group, a ragged last
    /// group, a row of `-inf` and a row holding NaN; each row equals its own softmax.
    #[test]
    fn grouped_short_rows_match_row_by_row() {
        let (rows, len) = (77, 10);
        let mut x: Vec<f64> = (0..rows * len)
            .map(|i| ((i * 37) % 101) as f64 * 0.3 - 15.0)
            .collect();
        x[30..40].fill(f64::NEG_INFINITY);
        x[55] = f64::NAN;
        for log in [false, true] {
            let mut o = vec![0.0; x.len()];
            softmax(&x, &[rows, len], 1, log, &mut o);
            for (r, (xr, or)) in x.chunks(len).zip(o.chunks(len)).enumerate() {
                let m = xr.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let m = if m == f64::NEG_INFINITY { 0.0 } else { m };
                let s: f64 = xr.iter().map(|v| (v - m).exp()).sum();
                for (&v, &got) in xr.iter().zip(or) {
                    let want = if log {
                        v - m - s.ln()
                    } else {
                        (v - m).exp() / s
                    };
                    match r {
                        3 => assert!(got.is_nan() || got == want, "row 3: {got}"),
                        5 => assert!(got.is_nan(), "a NaN row gives NaN, not {got}"),
                        _ => assert!((got - want).abs() < 1e-12, "row {r}: {got} vs {want}"),
                    }
                }
            }
        }
    }

    #[test]
    fn softmax_is_stable_and_normalised() {
        let x = [1000.0f64, 1001.0, 1002.0, -1.0, 0.0, 1.0];
        let mut o = [0.0; 6];
        softmax(&x, &[2, 3], 1, false, &mut o);
        assert!((o[..3].iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!((o[0] - o[3]).abs() < 1e-12);
        let mut l = [0.0; 6];
        softmax(&x, &[2, 3], 0, true, &mut l);
        assert!(l.iter().all(|v| v.is_finite()));
    }
}
