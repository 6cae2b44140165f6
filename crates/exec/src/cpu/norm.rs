//! Layer and RMS normalisation over rows, fused: one pass for each row's statistics, one for
//! the output, and for backward one pass for the input's gradient and one for the weight's.
//!
//! A row is the `n` trailing elements being normalised. Statistics are kept per row as
//! `[mean, rstd]` (mean 0 for RMS), `rstd = 1/√(var + eps)` with the biased variance (the mean
//! square for RMS), accumulated in f64 whatever the element type.

use super::par::{par_rows_mut, PAR_MIN_ELEMS};
use crate::Float;

/// Rows per thread split, so that a split carries about [`PAR_MIN_ELEMS`] elements of work.
fn min_rows(n: usize) -> usize {
    (PAR_MIN_ELEMS / n.max(1)).max(1)
}

/// Each row's `[mean, rstd]` into `stats` (two per row of `x`, rows of `n`).
pub fn norm_stats<T: Float>(
    x: &[T],
    n: usize,
    eps: f64,
    rms: bool,
    stats: &mut [T],
    threads: usize,
) {
    par_rows_mut(stats, 2, threads, 2 * min_rows(n), |r, st| {
        let row = &x[r * n..(r + 1) * n];
        let inv = 1.0 / n as f64;
        let (mean, var) = if rms {
            (
                0.0,
                row.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() * inv,
            )
        } else {
            let mean = row.iter().map(|v| v.to_f64()).sum::<f64>() * inv;
            let var = row
                .iter()
                .map(|v| {
                    let d = v.to_f64() - mean;
                    d * d
                })
                .sum::<f64>()
                * inv;
            (mean, var)
        };
        st[0] = T::from_f64(mean);
        st[1] = T::from_f64(1.0 / (var + eps).sqrt());
    });
}

/// `y = (x − mean)·rstd·w + b` row by row, `w` and `b` (length `n`) optional.
pub fn norm_apply<T: Float>(
    x: &[T],
    n: usize,
    stats: &[T],
    w: Option<&[T]>,
    b: Option<&[T]>,
    y: &mut [T],
    threads: usize,
) {
    par_rows_mut(y, n, threads, PAR_MIN_ELEMS, |r, yr| {
        let row = &x[r * n..(r + 1) * n];
        let (m, s) = (stats[2 * r], stats[2 * r + 1]);
        match (w, b) {
            (Some(w), Some(b)) => {
                for j in 0..n {
                    yr[j] = (row[j] - m) * s * w[j] + b[j];
                }
            }
            (Some(w), None) => {
                for j in 0..n {
                    yr[j] = (row[j] - m) * s * w[j];
                }
            }
            (None, Some(b)) => {
                for j in 0..n {
                    yr[j] = (row[j] - m) * s + b[j];
                }
            }
            (None, None) => {
                for j in 0..n {
                    yr[j] = (row[j] - m) * s;
                }
            }
        }
    });
}

/// How a row is normalised: its `n` elements, and whether by their root mean square (RMS norm)
/// rather than their mean and deviation (layer norm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NormSpec {
    /// Elements per row.
    pub n: usize,
    /// RMS normalisation (no mean subtracted).
    pub rms: bool,
}

/// The input's gradient: with `x̂ = (x − mean)·rstd` and `g = gy·w`,
/// `dx = rstd·(g − mean(g) − x̂·mean(g·x̂))` (RMS: without the `mean(g)` term).
pub fn norm_grad_input<T: Float>(
    spec: NormSpec,
    x: &[T],
    gy: &[T],
    stats: &[T],
    w: Option<&[T]>,
    dx: &mut [T],
    threads: usize,
) {
    let NormSpec { n, rms } = spec;
    par_rows_mut(dx, n, threads, PAR_MIN_ELEMS, |r, dr| {
        let row = &x[r * n..(r + 1) * n];
        let gr = &gy[r * n..(r + 1) * n];
        let (m, s) = (stats[2 * r].to_f64(), stats[2 * r + 1].to_f64());
        let g = |j: usize| match w {
            Some(w) => gr[j].to_f64() * w[j].to_f64(),
            None => gr[j].to_f64(),
        };
        let (mut sg, mut sgx) = (0.0, 0.0);
        for (j, v) in row.iter().enumerate() {
            let gj = g(j);
            sg += gj;
            sgx += gj * (v.to_f64() - m) * s;
        }
        let inv = 1.0 / n as f64;
        let mg = if rms { 0.0 } else { sg * inv };
        let mgx = sgx * inv;
        for j in 0..n {
            let xh = (row[j].to_f64() - m) * s;
            dr[j] = T::from_f64(s * (g(j) - mg - xh * mgx));
        }
    });
}

/// The weight's gradient `dw[j] = Σ_rows gy·x̂` (rows of `n`), summed in f64.
pub fn norm_grad_weight<T: Float>(x: &[T], gy: &[T], stats: &[T], n: usize, dw: &mut [T]) {
    if n == 0 {
        // Rows of no elements: an empty weight, an empty gradient.
        return;
    }
    let mut acc = vec![0.0f64; n];
    for (r, (row, gr)) in x.chunks_exact(n).zip(gy.chunks_exact(n)).enumerate() {
        let (m, s) = (stats[2 * r].to_f64(), stats[2 * r + 1].to_f64());
        for j in 0..n {
            acc[j] += gr[j].to_f64() * (row[j].to_f64() - m) * s;
        }
    }
    for (d, a) in dw.iter_mut().zip(acc) {
        *d = T::from_f64(a);
    }
}

/// The bias's gradient `db[j] = Σ_rows gy` (rows of `n`), summed in f64.
pub fn norm_grad_bias<T: Float>(gy: &[T], n: usize, db: &mut [T]) {
    if n == 0 {
        return;
    }
    let mut acc = vec![0.0f64; n];
    for gr in gy.chunks_exact(n) {
        for j in 0..n {
            acc[j] += gr[j].to_f64();
        }
    }
    for (d, a) in db.iter_mut().zip(acc) {
        *d = T::from_f64(a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_centred_and_scaled() {
        let x = [1.0f64, 3.0, 2.0, 2.0];
        let mut st = [0.0; 4];
        norm_stats(&x, 2, 0.0, false, &mut st, 1);
        assert_eq!(st, [2.0, 1.0, 2.0, f64::INFINITY]);
        let mut y = [0.0; 2];
        norm_apply(
            &x[..2],
            2,
            &st,
            Some(&[2.0, 2.0]),
            Some(&[0.5, 0.5]),
            &mut y,
            1,
        );
        assert_eq!(y, [-1.5, 2.5]);
        norm_stats(&x[..2], 2, 0.0, true, &mut st[..2], 1);
        assert_eq!(st[..2], [0.0, 1.0 / 5f64.sqrt()]);
    }
}
