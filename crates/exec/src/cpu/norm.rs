//! Layer and RMS normalisation over rows, fused: one pass for each row's statistics, one for
//! the output, and for backward one pass for the input's gradient and one for the weight's and
//! the bias's.
//! Group normalisation ([`group_norm`]) is the same over a sample's group of channels, with a
//! weight and bias per channel, each row's passes made while it is in cache.
//!
//! A row is the `n` trailing elements being normalised. Statistics are kept per row as
//! `[mean, rstd]` (mean 0 for RMS), `rstd = 1/√(var + eps)` with the biased variance (the mean
//! square for RMS), accumulated in f64 whatever the element type.

use super::par::{par_rows_mut, PAR_MIN_ELEMS};
use super::wide::wide;
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
        let (mean, rstd) = wide(
            n,
            #[inline(always)]
            move || row_stats(row, eps, rms),
        );
        st[0] = T::from_f64(mean);
        st[1] = T::from_f64(rstd);
    });
}

/// A row's mean (0 for RMS) and `rstd`: the mean, then the squared deviations from it (the
/// squares for RMS), each summed in f64 in [`lane_sum`]'s order.
#[inline(always)]
fn row_stats<T: Float>(row: &[T], eps: f64, rms: bool) -> (f64, f64) {
    let inv = 1.0 / row.len() as f64;
    let (mean, var) = if rms {
        (0.0, lane_sum(row, |v| v * v) * inv)
    } else {
        let mean = lane_sum(row, |v| v) * inv;
        (mean, lane_sum(row, |v| (v - mean) * (v - mean)) * inv)
    };
    (mean, 1.0 / (var + eps).sqrt())
}

/// `y = (x − mean)·rstd·w + b` for one row, `w` and `b` optional.
#[inline(always)]
fn apply_row<T: Float>(row: &[T], (m, s): (T, T), w: Option<&[T]>, b: Option<&[T]>, yr: &mut [T]) {
    match (w, b) {
        (Some(w), Some(b)) => {
            for (((o, &v), &w), &b) in yr.iter_mut().zip(row).zip(w).zip(b) {
                *o = (v - m) * s * w + b;
            }
        }
        (Some(w), None) => {
            for ((o, &v), &w) in yr.iter_mut().zip(row).zip(w) {
                *o = (v - m) * s * w;
            }
        }
        (None, Some(b)) => {
            for ((o, &v), &b) in yr.iter_mut().zip(row).zip(b) {
                *o = (v - m) * s + b;
            }
        }
        (None, None) => {
            for (o, &v) in yr.iter_mut().zip(row) {
                *o = (v - m) * s;
            }
        }
    }
}

/// [`norm_stats`] and [`norm_apply`] in one pass over the rows: each row's statistics, then
/// its output while the row is still in cache. The same values as the two calls.
pub fn norm_forward<T: Float>(
    (x, n): (&[T], usize),
    (eps, rms): (f64, bool),
    (w, b): (Option<&[T]>, Option<&[T]>),
    (y, stats): (&mut [T], &mut [T]),
    threads: usize,
) {
    let rows = stats.len() / 2;
    super::par::par_rows_pair_mut(
        rows,
        (y, n),
        (stats, 2),
        threads,
        PAR_MIN_ELEMS,
        |r, yr, st| {
            let row = &x[r * n..(r + 1) * n];
            wide(
                n,
                #[inline(always)]
                move || {
                    let (mean, rstd) = row_stats(row, eps, rms);
                    st[0] = T::from_f64(mean);
                    st[1] = T::from_f64(rstd);
                    apply_row(row, (st[0], st[1]), w, b, yr);
                },
            )
        },
    );
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
        let ms = (stats[2 * r], stats[2 * r + 1]);
        wide(
            n,
            #[inline(always)]
            move || apply_row(row, ms, w, b, yr),
        );
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
        wide(
            n,
            #[inline(always)]
            move || {
                let (sg, sgx) = match w {
                    Some(w) => grad_sums(row, gr, w, (m, s)),
                    None => grad_sums(row, gr, &[], (m, s)),
                };
                let inv = 1.0 / n as f64;
                let mg = if rms { 0.0 } else { sg * inv };
                let mgx = sgx * inv;
                match w {
                    Some(w) => {
                        for (((d, &v), &gv), &wv) in dr.iter_mut().zip(row).zip(gr).zip(w) {
                            let xh = (v.to_f64() - m) * s;
                            *d = T::from_f64(s * (gv.to_f64() * wv.to_f64() - mg - xh * mgx));
                        }
                    }
                    None => {
                        for ((d, &v), &gv) in dr.iter_mut().zip(row).zip(gr) {
                            let xh = (v.to_f64() - m) * s;
                            *d = T::from_f64(s * (gv.to_f64() - mg - xh * mgx));
                        }
                    }
                }
            },
        )
    });
}

/// A row's `Σ g` and `Σ g·x̂` with `g = gy·w` (`w` empty: 1) and `x̂ = (x − m)·s`, in eight
/// lanes each joined as [`lane_sum`]'s.
#[inline(always)]
fn grad_sums<T: Float>(row: &[T], gr: &[T], w: &[T], (m, s): (f64, f64)) -> (f64, f64) {
    let (mut sg, mut sgx) = ([0.0f64; 8], [0.0f64; 8]);
    let n = row.len();
    let body = n - n % 8;
    let (xs, gs) = (row[..body].chunks_exact(8), gr[..body].chunks_exact(8));
    if w.is_empty() {
        for (xc, gc) in xs.zip(gs) {
            for i in 0..8 {
                let g = gc[i].to_f64();
                sg[i] += g;
                sgx[i] += g * ((xc[i].to_f64() - m) * s);
            }
        }
    } else {
        for ((xc, gc), wc) in xs.zip(gs).zip(w[..body].chunks_exact(8)) {
            for i in 0..8 {
                let g = gc[i].to_f64() * wc[i].to_f64();
                sg[i] += g;
                sgx[i] += g * ((xc[i].to_f64() - m) * s);
            }
        }
    }
    let (mut a, mut b) = (join_lanes(sg), join_lanes(sgx));
    for j in body..n {
        let g = gr[j].to_f64() * if w.is_empty() { 1.0 } else { w[j].to_f64() };
        a += g;
        b += g * ((row[j].to_f64() - m) * s);
    }
    (a, b)
}

/// The affine parameters' gradients in one pass over the rows of `n`: `dw[j] = Σ_rows gy·x̂`
/// and `db[j] = Σ_rows gy`, each summed in f64 in the rows' order. Threads take blocks of
/// columns (each reads its block of every row), so every sum runs in the same order on any
/// number of threads.
pub fn norm_grad_params<T: Float>(
    (x, gy, stats): (&[T], &[T], &[T]),
    n: usize,
    dw: Option<&mut [T]>,
    db: Option<&mut [T]>,
    threads: usize,
) {
    if n == 0 || (dw.is_none() && db.is_none()) {
        // Rows of no elements: empty parameters, empty gradients.
        return;
    }
    // Blocks of whole cache lines of f64 sums, at least two of them per thread.
    const LINE: usize = 8;
    let t = if gy.len() >= PAR_MIN_ELEMS {
        threads.clamp(1, (n / (2 * LINE)).max(1))
    } else {
        1
    };
    let block = n.div_ceil(t).next_multiple_of(LINE).min(n);
    let (mut dws, mut dbs) = (
        dw.map(|d| d.chunks_mut(block)),
        db.map(|d| d.chunks_mut(block)),
    );
    let mut parts: Vec<ParamsPart<'_, T>> = (0..n.div_ceil(block))
        .map(|b| {
            let dw = dws.as_mut().and_then(Iterator::next);
            (b * block, dw, dbs.as_mut().and_then(Iterator::next))
        })
        .collect();
    let run = |(j0, dw, db): &mut ParamsPart<'_, T>| {
        wide(
            block * gy.len() / n,
            #[inline(always)]
            || {
                param_sums(
                    (x, gy, stats),
                    (n, *j0),
                    dw.as_deref_mut(),
                    db.as_deref_mut(),
                )
            },
        )
    };
    if parts.len() == 1 {
        run(&mut parts[0]);
    } else {
        super::thread_pool::for_each_owned(parts, |_, p| run(p));
    }
}

/// A block of columns of [`norm_grad_params`]: its first column and its parts of the weight's
/// and the bias's gradients.
type ParamsPart<'a, T> = (usize, Option<&'a mut [T]>, Option<&'a mut [T]>);

/// [`norm_grad_params`] for the columns `j0..` that its outputs cover.
#[inline(always)]
fn param_sums<T: Float>(
    (x, gy, stats): (&[T], &[T], &[T]),
    (n, j0): (usize, usize),
    dw: Option<&mut [T]>,
    db: Option<&mut [T]>,
) {
    let w = dw.as_ref().or(db.as_ref()).map_or(0, |d| d.len());
    let (mut aw, mut ab) = (vec![0.0f64; w], vec![0.0f64; w]);
    for (r, (row, gr)) in x.chunks_exact(n).zip(gy.chunks_exact(n)).enumerate() {
        let (row, gr) = (&row[j0..j0 + w], &gr[j0..j0 + w]);
        if dw.is_some() {
            let (m, s) = (stats[2 * r].to_f64(), stats[2 * r + 1].to_f64());
            for ((a, &g), &v) in aw.iter_mut().zip(gr).zip(row) {
                *a += g.to_f64() * (v.to_f64() - m) * s;
            }
        }
        if db.is_some() {
            for (a, &g) in ab.iter_mut().zip(gr) {
                *a += g.to_f64();
            }
        }
    }
    for (d, acc) in [(dw, aw), (db, ab)] {
        if let Some(d) = d {
            for (d, a) in d.iter_mut().zip(acc) {
                *d = T::from_f64(a);
            }
        }
    }
}

/// The extents of a group normalisation: `batch` samples of `channels` channels, each of
/// `positions` elements (`[N, C, …]` contiguous), the channels in `groups` groups of equal
/// size. A row — what one mean and deviation cover — is a sample's group, `channels / groups ×
/// positions` contiguous elements; rows are numbered `sample · groups + group`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSpec {
    /// Samples (`N`).
    pub batch: usize,
    /// Channels (`C`), a multiple of `groups`.
    pub channels: usize,
    /// Elements per channel (the product of the axes after the channels).
    pub positions: usize,
    /// Groups (at least 1).
    pub groups: usize,
}

impl GroupSpec {
    /// Channels per group.
    pub fn per_group(&self) -> usize {
        self.channels / self.groups
    }

    /// Elements per row (a sample's group).
    pub fn row_len(&self) -> usize {
        self.per_group() * self.positions
    }

    /// Rows (samples × groups).
    pub fn rows(&self) -> usize {
        self.batch * self.groups
    }
}

/// `Σ f(v)` over `row` in f64, in eight independent lanes joined in pairs (0 with 4, 1 with 5,
/// …) and the tail in order: the same order at every vector width.
#[inline(always)]
fn lane_sum<T: Float>(row: &[T], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = row.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += f(c[i].to_f64());
        }
    }
    let mut s = join_lanes(acc);
    for v in rem {
        s += f(v.to_f64());
    }
    s
}

/// Eight lanes joined in pairs: 0 with 4, 1 with 5, …, then the pairs' sums.
#[inline(always)]
fn join_lanes(a: [f64; 8]) -> f64 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

/// `(Σ g, Σ g·x)` over a channel's elements in f64, in [`lane_sum`]'s order.
#[inline(always)]
fn lane_sums2<T: Float>(g: &[T], x: &[T]) -> (f64, f64) {
    let (mut sg, mut sgx) = ([0.0f64; 8], [0.0f64; 8]);
    let (gc, xc) = (g.chunks_exact(8), x.chunks_exact(8));
    let (gr, xr) = (gc.remainder(), xc.remainder());
    for (a, b) in gc.zip(xc) {
        for i in 0..8 {
            let v = a[i].to_f64();
            sg[i] += v;
            sgx[i] += v * b[i].to_f64();
        }
    }
    let (mut s, mut t) = (join_lanes(sg), join_lanes(sgx));
    for (a, b) in gr.iter().zip(xr) {
        s += a.to_f64();
        t += a.to_f64() * b.to_f64();
    }
    (s, t)
}

/// Group normalisation (PyTorch's `F.group_norm`): each row's `[mean, rstd]` into `stats` (two
/// per row) and `y = (x − mean)·rstd·w[c] + b[c]`, computed as `x·a + s` with the channel's
/// `a = rstd·w[c]` and `s = b[c] − mean·a` (PyTorch's form), `w` and `b` (length `channels`)
/// optional. The statistics sum in f64 (the mean, then the squared deviations from it); each
/// row is read from memory once and its output written once.
pub fn group_norm<T: Float>(
    spec: GroupSpec,
    x: &[T],
    eps: f64,
    (w, b): (Option<&[T]>, Option<&[T]>),
    (y, stats): (&mut [T], &mut [T]),
    threads: usize,
) {
    assert!(spec.groups > 0, "group_norm: {spec:?} has no groups");
    let (m, pos, cpg) = (spec.row_len(), spec.positions, spec.per_group());
    super::par::par_rows_pair_mut(
        spec.rows(),
        (y, m),
        (stats, 2),
        threads,
        PAR_MIN_ELEMS,
        |r, yr, st| {
            let row = &x[r * m..(r + 1) * m];
            let first = (r % spec.groups) * cpg;
            wide(
                m,
                #[inline(always)]
                move || {
                    let (mean, rstd) = if m == 0 {
                        (0.0, 1.0 / eps.sqrt())
                    } else {
                        let mean = lane_sum(row, |v| v) / m as f64;
                        let var = lane_sum(row, |v| (v - mean) * (v - mean)) / m as f64;
                        (mean, 1.0 / (var + eps).sqrt())
                    };
                    st[0] = T::from_f64(mean);
                    st[1] = T::from_f64(rstd);
                    for ci in 0..cpg {
                        let c = first + ci;
                        let a = rstd * w.map_or(1.0, |w| w[c].to_f64());
                        let s = b.map_or(0.0, |b| b[c].to_f64()) - mean * a;
                        let (a, s) = (T::from_f64(a), T::from_f64(s));
                        let seg = ci * pos..(ci + 1) * pos;
                        for (o, &v) in yr[seg.clone()].iter_mut().zip(&row[seg]) {
                            *o = v * a + s;
                        }
                    }
                },
            )
        },
    );
}

/// [`group_norm`]'s gradients from `gy` and the forward's `stats`: the input's always, the
/// weight's and the bias's (length `channels`) when asked. Each row is read once for its
/// channels' `Σ g` and `Σ g·x` and once more, from cache, for
/// `dx = rstd·(g·w − mean(g·w) − x̂·mean(g·w·x̂))`, written as `dx = k₁·g + k₂·x + k₃` with
/// per-channel `k₁` and per-row `k₂`, `k₃` (PyTorch's form); the parameters' gradients sum
/// the rows' channel sums over the batch in order, so no result depends on the thread count.
pub fn group_norm_grad<T: Float>(
    spec: GroupSpec,
    (x, gy, stats): (&[T], &[T], &[T]),
    w: Option<&[T]>,
    dx: &mut [T],
    (dw, db): (Option<&mut [T]>, Option<&mut [T]>),
    threads: usize,
) {
    assert!(spec.groups > 0, "group_norm_grad: {spec:?} has no groups");
    let (m, pos, cpg) = (spec.row_len(), spec.positions, spec.per_group());
    if m == 0 {
        // Rows of no elements: nothing reaches the input, and the parameters' gradients are
        // sums of nothing (whatever the statistics of an empty row, `1/√eps` included).
        for d in [dw, db].into_iter().flatten() {
            d.fill(T::ZERO);
        }
        return;
    }
    // Each row's channels' (Σ g, Σ g·x), for the parameters' gradients.
    let mut sums = vec![0.0f64; spec.rows() * 2 * cpg];
    super::par::par_rows_pair_mut(
        spec.rows(),
        (dx, m),
        (&mut sums, 2 * cpg),
        threads,
        PAR_MIN_ELEMS,
        |r, dr, sr| {
            let (xr, gr) = (&x[r * m..(r + 1) * m], &gy[r * m..(r + 1) * m]);
            let first = (r % spec.groups) * cpg;
            let (mean, rstd) = (stats[2 * r].to_f64(), stats[2 * r + 1].to_f64());
            wide(
                m,
                #[inline(always)]
                move || {
                    let wc = |ci: usize| w.map_or(1.0, |w| w[first + ci].to_f64());
                    // Σ g·w and Σ g·w·x over the row.
                    let (mut a, mut bsum) = (0.0, 0.0);
                    for ci in 0..cpg {
                        let seg = ci * pos..(ci + 1) * pos;
                        let (sg, sgx) = lane_sums2(&gr[seg.clone()], &xr[seg]);
                        sr[2 * ci] = sg;
                        sr[2 * ci + 1] = sgx;
                        a += wc(ci) * sg;
                        bsum += wc(ci) * sgx;
                    }
                    let inv = if m == 0 { 0.0 } else { 1.0 / m as f64 };
                    let k2 = (mean * a - bsum) * rstd * rstd * rstd * inv;
                    let k3 = -k2 * mean - a * rstd * inv;
                    let (k2, k3) = (T::from_f64(k2), T::from_f64(k3));
                    for ci in 0..cpg {
                        let k1 = T::from_f64(rstd * wc(ci));
                        let seg = ci * pos..(ci + 1) * pos;
                        let (g, xs) = (&gr[seg.clone()], &xr[seg.clone()]);
                        for ((o, &gv), &xv) in dr[seg].iter_mut().zip(g).zip(xs) {
                            *o = k1 * gv + k2 * xv + k3;
                        }
                    }
                },
            )
        },
    );
    let channels = spec.channels;
    if let Some(dw) = dw {
        for (c, d) in dw.iter_mut().enumerate().take(channels) {
            let (grp, ci) = (c / cpg.max(1), c % cpg.max(1));
            let mut acc = 0.0;
            for n in 0..spec.batch {
                let r = n * spec.groups + grp;
                let (mean, rstd) = (stats[2 * r].to_f64(), stats[2 * r + 1].to_f64());
                let s = &sums[r * 2 * cpg + 2 * ci..];
                acc += rstd * (s[1] - mean * s[0]);
            }
            *d = T::from_f64(acc);
        }
    }
    if let Some(db) = db {
        for (c, d) in db.iter_mut().enumerate().take(channels) {
            let (grp, ci) = (c / cpg.max(1), c % cpg.max(1));
            let acc: f64 = (0..spec.batch)
                .map(|n| sums[(n * spec.groups + grp) * 2 * cpg + 2 * ci])
                .sum();
            *d = T::from_f64(acc);
        }
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

    /// The parameters' gradients by their definition (each column summed over the rows in
    /// order, in f64) equal the kernel's bits on one thread and several, each gradient alone
    /// or both, at widths that fill no whole block of columns and sizes that split.
    #[test]
    fn parameter_gradients_are_the_column_sums_on_any_thread_count() {
        // Under Miri (interpreted: minutes at the sizes that split) the sizes that do not.
        let shapes: &[(usize, usize)] = if cfg!(miri) {
            &[(9, 100), (40, 7)]
        } else {
            &[(700, 100), (100, 1000), (9, 1000), (40, 7)]
        };
        for &(rows, n) in shapes {
            let (x, gy) = (values(rows * n, 1), values(rows * n, 2));
            let mut st = vec![0.0; 2 * rows];
            norm_stats(&x, n, 1e-5, false, &mut st, 1);
            let (mut want_w, mut want_b) = (vec![0.0f64; n], vec![0.0f64; n]);
            for r in 0..rows {
                let (m, s) = (st[2 * r], st[2 * r + 1]);
                for j in 0..n {
                    let (v, g) = (x[r * n + j], gy[r * n + j]);
                    want_w[j] += g * (v - m) * s;
                    want_b[j] += g;
                }
            }
            for threads in [1, 2, 3] {
                let (mut dw, mut db) = (vec![0.0; n], vec![0.0; n]);
                let what = format!("{rows}×{n} on {threads} threads");
                norm_grad_params((&x, &gy, &st), n, Some(&mut dw), Some(&mut db), threads);
                assert_eq!((&dw, &db), (&want_w, &want_b), "{what}");
                let mut alone = vec![0.0; n];
                norm_grad_params((&x, &gy, &st), n, Some(&mut alone), None, threads);
                assert_eq!(alone, want_w, "{what}: the weight's alone");
                norm_grad_params((&x, &gy, &st), n, None, Some(&mut alone), threads);
                assert_eq!(alone, want_b, "{what}: the bias's alone");
            }
        }
    }

    /// `n` values in [-2, 2) from the crate's test generator.
    fn values(n: usize, seed: u64) -> Vec<f64> {
        crate::cpu::test_data::values(n, seed, 2.0)
    }

    /// Group normalisation and its gradients by the definition: each row's statistics in
    /// two passes, `x̂`, and `dx = rstd·(g − mean(g) − x̂·mean(g·x̂))` with `g = gy·w`.
    #[allow(clippy::type_complexity)]
    fn group_norm_by_definition(
        spec: GroupSpec,
        x: &[f64],
        gy: &[f64],
        w: &[f64],
        b: &[f64],
        eps: f64,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let (m, pos, cpg) = (spec.row_len(), spec.positions, spec.per_group());
        let mut y = vec![0.0; x.len()];
        let mut dx = vec![0.0; x.len()];
        let (mut dw, mut db) = (vec![0.0; spec.channels], vec![0.0; spec.channels]);
        for r in 0..spec.rows() {
            let row = &x[r * m..(r + 1) * m];
            let mean = row.iter().sum::<f64>() / m as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / m as f64;
            let rstd = 1.0 / (var + eps).sqrt();
            let ch = |j: usize| (r % spec.groups) * cpg + j / pos;
            let xh: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
            let g: Vec<f64> = (0..m).map(|j| gy[r * m + j] * w[ch(j)]).collect();
            let mg = g.iter().sum::<f64>() / m as f64;
            let mgx = g.iter().zip(&xh).map(|(a, b)| a * b).sum::<f64>() / m as f64;
            for j in 0..m {
                y[r * m + j] = xh[j] * w[ch(j)] + b[ch(j)];
                dx[r * m + j] = rstd * (g[j] - mg - xh[j] * mgx);
                dw[ch(j)] += gy[r * m + j] * xh[j];
                db[ch(j)] += gy[r * m + j];
            }
        }
        (y, dx, dw, db)
    }

    /// The fused group normalisation and its gradients equal the definition (to rounding), on
    /// one group, several, a group per channel, single positions and odd lengths; the bits
    /// are the same on one, two and three threads; without weight and bias they are 1 and 0.
    #[test]
    fn group_norm_matches_its_definition_on_any_thread_count() {
        // The last is large enough to be split across threads (too slow under Miri, which
        // splits nothing: its thread pool runs the parts in turn).
        let specs = [
            (2, 6, 37, 3),
            (3, 4, 1, 1),
            (1, 8, 64, 8),
            (5, 2, 300, 1),
            (4, 6, 9, 2),
            (5, 8, 2100, 2),
        ];
        let specs = if cfg!(miri) { &specs[..4] } else { &specs[..] };
        for (k, &(batch, channels, positions, groups)) in specs.iter().enumerate() {
            let spec = GroupSpec {
                batch,
                channels,
                positions,
                groups,
            };
            let n = batch * channels * positions;
            let (x, gy) = (values(n, 2 * k as u64 + 1), values(n, 2 * k as u64 + 2));
            let (w, b) = (values(channels, 97), values(channels, 98));
            let want = group_norm_by_definition(spec, &x, &gy, &w, &b, 1e-5);
            let mut first = None;
            for threads in [1, 2, 3] {
                let (mut y, mut st) = (vec![0.0; n], vec![0.0; 2 * spec.rows()]);
                group_norm(
                    spec,
                    &x,
                    1e-5,
                    (Some(&w), Some(&b)),
                    (&mut y, &mut st),
                    threads,
                );
                let mut dx = vec![0.0; n];
                let (mut dw, mut db) = (vec![0.0; channels], vec![0.0; channels]);
                group_norm_grad(
                    spec,
                    (&x, &gy, &st),
                    Some(&w),
                    &mut dx,
                    (Some(&mut dw), Some(&mut db)),
                    threads,
                );
                for (got, want, what) in [
                    (&y, &want.0, "y"),
                    (&dx, &want.1, "dx"),
                    (&dw, &want.2, "dw"),
                    (&db, &want.3, "db"),
                ] {
                    for (a, b) in got.iter().zip(want.iter()) {
                        assert!(
                            (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                            "{spec:?} {what}: {a} vs {b}"
                        );
                    }
                }
                let bits = (y, dx, dw, db);
                match &first {
                    None => first = Some(bits),
                    Some(f) => assert!(*f == bits, "{spec:?}: {threads} threads change the bits"),
                }
            }
            // No weight and no bias: the weight 1 and the bias 0.
            let (ones, zeros) = (vec![1.0; channels], vec![0.0; channels]);
            let want = group_norm_by_definition(spec, &x, &gy, &ones, &zeros, 1e-5);
            let (mut y, mut st) = (vec![0.0; n], vec![0.0; 2 * spec.rows()]);
            group_norm(spec, &x, 1e-5, (None, None), (&mut y, &mut st), 2);
            let mut dx = vec![0.0; n];
            group_norm_grad(spec, (&x, &gy, &st), None, &mut dx, (None, None), 2);
            for (got, want) in [(&y, &want.0), (&dx, &want.1)] {
                for (a, b) in got.iter().zip(want.iter()) {
                    assert!(
                        (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                        "{spec:?}: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// No positions or no samples: nothing to write, and the parameters' gradients are zeros
    /// (PyTorch's for an empty input), never NaN.
    #[test]
    fn empty_group_norms_give_zero_parameter_gradients() {
        for (batch, positions) in [(0, 5), (3, 0)] {
            let spec = GroupSpec {
                batch,
                channels: 4,
                positions,
                groups: 2,
            };
            // eps 0: an empty row's rstd is 1/√0, which must not reach the gradients.
            let (mut y, mut st) = (vec![], vec![0.0f32; 2 * spec.rows()]);
            group_norm(spec, &[], 0.0, (None, None), (&mut y, &mut st), 2);
            let (mut dw, mut db) = (vec![f32::NAN; 4], vec![f32::NAN; 4]);
            let w = [1.0f32; 4];
            group_norm_grad(
                spec,
                (&[], &[], &st),
                Some(&w),
                &mut [],
                (Some(&mut dw), Some(&mut db)),
                2,
            );
            assert_eq!((dw, db), (vec![0.0; 4], vec![0.0; 4]));
        }
    }

    /// The fused forward gives the bits of `norm_stats` then `norm_apply`, for layer and RMS
    /// norms, with and without weight and bias, on one to three threads (the last rows long
    /// and many enough to be split).
    #[test]
    fn norm_forward_is_norm_stats_then_norm_apply() {
        // The last is split across threads; too slow under Miri, which splits nothing.
        let cases = [(3usize, 5usize), (7, 33), (40, 2000)];
        let cases = if cfg!(miri) { &cases[..2] } else { &cases[..] };
        for &(rows, n) in cases {
            let x: Vec<f32> = values(rows * n, 5)
                .iter()
                .map(|&v| v as f32 + 0.25)
                .collect();
            let w: Vec<f32> = values(n, 6).iter().map(|&v| v as f32).collect();
            let b: Vec<f32> = values(n, 7).iter().map(|&v| v as f32).collect();
            for rms in [false, true] {
                for (wo, bo) in [
                    (Some(&w[..]), Some(&b[..])),
                    (None, None),
                    (Some(&w[..]), None),
                ] {
                    let mut st = vec![0.0f32; 2 * rows];
                    norm_stats(&x, n, 1e-5, rms, &mut st, 1);
                    let mut want = vec![0.0f32; rows * n];
                    norm_apply(&x, n, &st, wo, bo, &mut want, 1);
                    for threads in [1, 2, 3] {
                        let (mut y, mut st2) = (vec![0.0f32; rows * n], vec![0.0f32; 2 * rows]);
                        norm_forward((&x, n), (1e-5, rms), (wo, bo), (&mut y, &mut st2), threads);
                        assert!(
                            st2 == st && y == want,
                            "{rows}×{n}, rms {rms}, {threads} threads"
                        );
                    }
                }
            }
        }
    }
}
