//! Reductions over any set of axes, and softmax along one axis.

use crate::layout::{contiguous_strides, walk};
use crate::Float;

/// What a reduction computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Maximum (NaN propagates).
    Max,
}

/// Reduces `x` of `shape` over the axes where `reduced[d]` is true. `out` is laid out as the
/// keep-dim result (reduced axes of extent 1), so its length is the product of the kept extents.
pub fn reduce<T: Float>(op: ReduceOp, x: &[T], shape: &[usize], reduced: &[bool], out: &mut [T]) {
    let init = match op {
        ReduceOp::Sum => T::ZERO,
        ReduceOp::Max => T::neg_infinity(),
    };
    out.fill(init);
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
        match (op, io) {
            (ReduceOp::Sum, 0) => out[oo] += sum_row(row),
            (ReduceOp::Max, 0) => out[oo] = out[oo].max(max_row(row)),
            // Reducing a leading axis: whole rows add into the output row (vectorises).
            (ReduceOp::Sum, 1) => {
                for (o, &v) in out[oo..oo + n].iter_mut().zip(row) {
                    *o += v;
                }
            }
            (ReduceOp::Max, 1) => {
                for (o, &v) in out[oo..oo + n].iter_mut().zip(row) {
                    *o = o.max(v);
                }
            }
            (ReduceOp::Sum, _) => {
                for (i, &v) in row.iter().enumerate() {
                    out[oo + i * io] += v;
                }
            }
            (ReduceOp::Max, _) => {
                for (i, &v) in row.iter().enumerate() {
                    let o = &mut out[oo + i * io];
                    *o = o.max(v);
                }
            }
        }
    });
}

/// Sum with eight independent accumulators: vectorises, and loses less precision than a single
/// running sum on long rows.
#[inline]
pub fn sum_row<T: Float>(row: &[T]) -> T {
    let mut acc = [T::ZERO; 8];
    let chunks = row.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &v in rem {
        s += v;
    }
    s
}

#[inline]
fn max_row<T: Float>(row: &[T]) -> T {
    row.iter().fold(T::neg_infinity(), |m, &v| m.max(v))
}

/// Splits a shape around `axis` into (outer, extent, inner).
pub fn around_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// Softmax (or log-softmax) along `axis`, stable: the row maximum is subtracted first.
pub fn softmax<T: Float>(x: &[T], shape: &[usize], axis: usize, log: bool, out: &mut [T]) {
    let (outer, len, inner) = around_axis(shape, axis);
    if len == 0 {
        return;
    }
    if inner == 1 {
        // Along the last axis: contiguous rows, each shifted by its maximum, exponentiated and
        // normalised. Short rows (class scores, say) are all shifted first and take one exp over
        // the whole buffer — row by row, each call would pay the kernel's setup and scalar tail
        // for a handful of elements; long rows go one at a time, while the row is in cache.
        let rows = x.chunks_exact(len).zip(out.chunks_exact_mut(len));
        if len < 64 {
            for (xr, or) in rows {
                shift_row(xr, or, stable_max(xr));
            }
            exp_in_place(out);
            for (xr, or) in x.chunks_exact(len).zip(out.chunks_exact_mut(len)) {
                normalise_row(xr, or, stable_max(xr), log);
            }
        } else {
            for (xr, or) in rows {
                let m = stable_max(xr);
                shift_row(xr, or, m);
                exp_in_place(or);
                normalise_row(xr, or, m, log);
            }
        }
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
                let ls = s.ln() + m;
                for j in 0..len {
                    out[at(j)] = x[at(j)] - ls;
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
fn stable_max<T: Float>(xr: &[T]) -> T {
    let m = max_row(xr);
    if m == T::neg_infinity() {
        T::ZERO
    } else {
        m
    }
}

/// `or = xr - m`.
fn shift_row<T: Float>(xr: &[T], or: &mut [T], m: T) {
    for (o, &v) in or.iter_mut().zip(xr) {
        *o = v - m;
    }
}

/// Given `or = e^(xr - m)`: softmax `or / Σor`, or log-softmax `xr - (ln Σor + m)`.
fn normalise_row<T: Float>(xr: &[T], or: &mut [T], m: T, log: bool) {
    let s = sum_row(or);
    if log {
        let ls = s.ln() + m;
        for (o, &v) in or.iter_mut().zip(xr) {
            *o = v - ls;
        }
    } else {
        let inv = T::ONE / s;
        for o in or.iter_mut() {
            *o *= inv;
        }
    }
}

/// `v[i] = e^v[i]`, through a stack buffer so the kernel can read and write separate slices.
fn exp_in_place<T: Float>(v: &mut [T]) {
    let mut buf = [T::ZERO; 256];
    for c in v.chunks_mut(256) {
        let b = &mut buf[..c.len()];
        b.copy_from_slice(c);
        T::exp_into(b, c);
    }
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
