//! Reductions over any set of axes, and softmax along one axis.

use super::cast::{Storage, BLOCK};
use super::par::{par_chunks_mut, PAR_MIN_ELEMS};
use super::wide::wide;
use crate::layout::{contiguous_strides, walk};
use crate::Float;

use crate::ops::ReduceKernel;
pub use crate::ops::ReduceOp;

/// Reduces `x` of `shape` over the axes where `reduced[d]` is true. `out` is laid out as the
/// keep-dim result (reduced axes of extent 1), so its length is the product of the kept extents.
/// The identity and the step are the op's row of the reduction table ([`ReduceOp`]).
pub fn reduce<T: Float>(op: ReduceOp, x: &[T], shape: &[usize], reduced: &[bool], out: &mut [T]) {
    reduce_on(op, x, shape, reduced, out, 1)
}

/// [`reduce`] over up to `threads` threads, split by outputs or, for a tall reduction into few
/// outputs, by fixed blocks of rows whose results are combined in block order: each output
/// combines its values in the same order on any number of threads, so the bits do not depend
/// on it.
pub fn reduce_on<T: Float>(
    op: ReduceOp,
    x: &[T],
    shape: &[usize],
    reduced: &[bool],
    out: &mut [T],
    threads: usize,
) {
    op.with_combine(Reduce {
        x: Plain(x),
        shape,
        reduced,
        out,
        threads,
    })
}

/// [`reduce_on`] of `x` in any float storage into f32 sums: `x` is widened a block at a time
/// as it is read, not copied whole, and the result is what widening all of `x` first and
/// reducing that gives, bit for bit (a 16-bit tensor's sums accumulate in f32, as PyTorch's).
pub fn reduce_widened<H: Storage>(
    op: ReduceOp,
    x: &[H],
    shape: &[usize],
    reduced: &[bool],
    out: &mut [f32],
    threads: usize,
) {
    match H::as_f32(x) {
        Some(x) => reduce_on(op, x, shape, reduced, out, threads),
        None => op.with_combine(Reduce {
            x: Widened(x),
            shape,
            reduced,
            out,
            threads,
        }),
    }
}

/// Where a reduction reads its input: runs of `T` values, in order.
trait Source<T>: Copy + Sync {
    /// The number of elements.
    fn len(self) -> usize;
    /// Calls `f` on `x[at..at + len]` in order, in runs whose lengths are multiples of eight
    /// but for the last (so that [`Lanes`] fed run by run gives the bits of one whole row).
    fn runs(self, at: usize, len: usize, f: impl FnMut(&[T]));
    /// Calls `f` on all of it as `T`.
    fn whole<R>(self, f: impl FnOnce(&[T]) -> R) -> R;
}

/// A slice read where it lies.
#[derive(Clone, Copy)]
struct Plain<'a, T>(&'a [T]);

impl<T: Float> Source<T> for Plain<'_, T> {
    #[inline(always)]
    fn len(self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn runs(self, at: usize, len: usize, mut f: impl FnMut(&[T])) {
        f(&self.0[at..at + len])
    }
    fn whole<R>(self, f: impl FnOnce(&[T]) -> R) -> R {
        f(self.0)
    }
}

/// A slice of another storage type, widened to f32 [`BLOCK`] elements at a time (in the
/// caller's vectorised loop: [`Storage::load_block`]; the reductions read runs only inside
/// [`wide`]).
#[derive(Clone, Copy)]
struct Widened<'a, H>(&'a [H]);

impl<H: Storage + Sync> Source<f32> for Widened<'_, H> {
    #[inline(always)]
    fn len(self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn runs(self, at: usize, len: usize, mut f: impl FnMut(&[f32])) {
        let x = &self.0[at..at + len];
        // A short run (a thread's columns of a bias gradient's row, say) in a buffer of its
        // size: clearing the whole block for it cost more than widening and adding it.
        if len <= SHORT_RUN {
            let mut buf = [0f32; SHORT_RUN];
            let b = &mut buf[..len];
            H::load_block(x, b);
            return f(b);
        }
        let mut buf = [0f32; BLOCK];
        for s in x.chunks(BLOCK) {
            let b = &mut buf[..s.len()];
            H::load_block(s, b);
            f(b)
        }
    }
    fn whole<R>(self, f: impl FnOnce(&[f32]) -> R) -> R {
        let mut w = vec![0f32; self.0.len()];
        H::load_f32(self.0, &mut w);
        f(&w)
    }
}

/// The longest run [`Widened`] widens into a buffer of this size rather than a whole block.
const SHORT_RUN: usize = 64;

/// [`reduce`]'s arguments, run with one row's identity and step.
struct Reduce<'a, S, T> {
    x: S,
    shape: &'a [usize],
    reduced: &'a [bool],
    out: &'a mut [T],
    threads: usize,
}

impl<T: Float, S: Source<T>> ReduceKernel<T> for Reduce<'_, S, T> {
    type Out = ();

    #[inline(always)]
    fn run<F: Fn(T, T) -> T + Sync + Copy>(self, init: T, f: F) {
        let Reduce {
            x,
            shape,
            reduced,
            out,
            threads,
        } = self;
        out.fill(init);
        if x.len() == 0 {
            return;
        }
        // The axes of extent above 1, runs of reduced or kept ones merged: most reductions
        // are one of two patterns, each a few plain loops with no index bookkeeping.
        let mut blocks: Vec<(usize, bool)> = Vec::with_capacity(shape.len());
        for (&d, &r) in shape.iter().zip(reduced).filter(|(&d, _)| d != 1) {
            match blocks.last_mut() {
                Some((e, last)) if *last == r => *e *= d,
                _ => blocks.push((d, r)),
            }
        }
        match blocks[..] {
            // All of it along one row, the rows of a trailing block (a row sum, a loss's
            // mean), or whole rows folded into a kept block between reduced ones (the bias of a
            // convolution: `[n, c, h·w]` over `n` and `h·w`).
            [] => around_kept(x, (1, 1, 1), true, out, threads, init, f),
            [(n, true)] => around_kept(x, (1, 1, n), true, out, threads, init, f),
            [(a, false), (b, true)] => around_kept(x, (1, a, b), true, out, threads, init, f),
            [(a, true), (b, false), (c, true)] => {
                around_kept(x, (a, b, c), false, out, threads, init, f)
            }
            // Rows added into kept rows: nothing reduced, a leading block (a bias gradient
            // over a batch's rows), or a block between kept ones.
            [(n, false)] => between_kept(x, (1, n), out, threads, f),
            [(a, true), (b, false)] => between_kept(x, (a, b), out, threads, f),
            [(_, false), (b, true), (c, false)] => between_kept(x, (b, c), out, threads, f),
            _ => x.whole(|x| general(x, shape, reduced, out, init, f)),
        }
    }
}

/// `x` as `[a, b, c]` reduced over `a` and `c` into `out[b]`: for each `i` in order, each
/// output combined with the fold of its row of `c` (`first`: the first row's fold is the
/// output, as for a reduction along rows). Split by outputs over threads.
#[inline(always)]
fn around_kept<T: Float, S: Source<T>, F: Fn(T, T) -> T + Sync + Copy>(
    x: S,
    (a, b, c): (usize, usize, usize),
    first: bool,
    out: &mut [T],
    threads: usize,
    init: T,
    f: F,
) {
    let per = PAR_MIN_ELEMS.div_ceil((a * c).max(1));
    par_chunks_mut(out, threads, per, |j0, o| {
        wide(
            a * c * o.len(),
            #[inline(always)]
            || {
                for i in 0..a {
                    for (j, o) in o.iter_mut().enumerate() {
                        let s = fold_runs(x, (i * b + j0 + j) * c, c, init, f);
                        *o = if first && i == 0 { s } else { f(*o, s) };
                    }
                }
            },
        )
    });
}

/// `x` as `[out.len() / c, b, c]` reduced over `b` into `out`: each row of `c` added into its
/// output row in order of `b`, or, for many rows into few outputs ([`kept_row_blocks`]), each
/// of a few fixed blocks of rows so, and the blocks' results combined into `out` in block
/// order. Split by outputs or by blocks over threads; the bits are the same on any number.
#[inline(always)]
fn between_kept<T: Float, S: Source<T>, F: Fn(T, T) -> T + Sync + Copy>(
    x: S,
    (b, c): (usize, usize),
    out: &mut [T],
    threads: usize,
    f: F,
) {
    let blocks = kept_row_blocks(b, out.len());
    if blocks > 1 {
        return row_blocks_kept(x, (b, c), blocks, out, threads, f);
    }
    par_chunks_mut(out, threads, PAR_MIN_ELEMS.div_ceil(b), |o0, o| {
        wide(
            b * o.len(),
            #[inline(always)]
            || {
                // The outputs `o0..o0 + o.len()`, a part of a row of `c` at a time.
                let (mut at, len) = (0, o.len());
                while at < len {
                    let (i, j) = ((o0 + at) / c, (o0 + at) % c);
                    let part = &mut o[at..(at + c - j).min(len)];
                    for r in 0..b {
                        let mut k = 0;
                        x.runs((i * b + r) * c + j, part.len(), |run| {
                            for (o, &v) in part[k..k + run.len()].iter_mut().zip(run) {
                                *o = f(*o, v);
                            }
                            k += run.len();
                        });
                    }
                    at += part.len();
                }
            },
        )
    });
}

/// How many blocks of rows [`between_kept`] folds separately: one (every output's rows in
/// order) but for a tall reduction into few outputs (a bias gradient: `[4096, 384]` over its
/// rows), where splitting the outputs over threads gives each a narrow strip of every row, read
/// row by row: two threads took longer than one. Then up to [`KEPT_ROW_BLOCKS`] blocks of at
/// least [`KEPT_BLOCK_ROWS`] rows, each a contiguous run of memory. A function of the sizes
/// alone, so that every thread count sums in the same order.
fn kept_row_blocks(b: usize, outputs: usize) -> usize {
    if outputs > KEPT_MAX_OUTPUTS
        || b < 2 * KEPT_BLOCK_ROWS
        || b.saturating_mul(outputs) < PAR_MIN_ELEMS
    {
        return 1;
    }
    (b / KEPT_BLOCK_ROWS).min(KEPT_ROW_BLOCKS)
}

/// The most blocks [`kept_row_blocks`] makes (and so the most threads that share a tall
/// reduction).
const KEPT_ROW_BLOCKS: usize = 16;
/// The fewest rows in a block of [`kept_row_blocks`].
const KEPT_BLOCK_ROWS: usize = 64;
/// Above this many outputs the outputs alone split into strips wide enough to read well (and
/// the blocks' partial results, one set each, would grow): no blocks.
const KEPT_MAX_OUTPUTS: usize = 2048;

/// [`between_kept`] in `blocks` blocks of rows: block `j` folds rows `j·b/blocks..(j+1)·b/blocks`
/// of every `[b, c]` slab into a set of partial results of its own (from the identity, which
/// `out` holds), the threads claiming blocks; then `out` combines the blocks' sets in order.
#[inline(always)]
fn row_blocks_kept<T: Float, S: Source<T>, F: Fn(T, T) -> T + Sync + Copy>(
    x: S,
    (b, c): (usize, usize),
    blocks: usize,
    out: &mut [T],
    threads: usize,
    f: F,
) {
    let len = out.len();
    let mut partial = out.repeat(blocks);
    let parts: Vec<&mut [T]> = partial.chunks_mut(len).collect();
    super::par::claim_each(parts, threads, |j, part| {
        let (r0, r1) = (j * b / blocks, (j + 1) * b / blocks);
        wide(
            (r1 - r0) * len,
            #[inline(always)]
            || {
                for (i, part) in part.chunks_mut(c).enumerate() {
                    // Rows r0..r1 of slab i lie one after another: read as one run, each piece
                    // of it added into the columns it covers.
                    let mut col = 0;
                    x.runs((i * b + r0) * c, (r1 - r0) * c, |mut run| {
                        while !run.is_empty() {
                            let take = run.len().min(c - col);
                            for (o, &v) in part[col..col + take].iter_mut().zip(&run[..take]) {
                                *o = f(*o, v);
                            }
                            run = &run[take..];
                            col = if col + take == c { 0 } else { col + take };
                        }
                    });
                }
            },
        )
    });
    for part in partial.chunks_exact(len) {
        wide(
            len,
            #[inline(always)]
            || {
                for (o, &v) in out.iter_mut().zip(part) {
                    *o = f(*o, v);
                }
            },
        );
    }
}

/// Any other set of axes: an odometer over the rows, in memory order, on one thread.
fn general<T: Float, F: Fn(T, T) -> T + Copy>(
    x: &[T],
    shape: &[usize],
    reduced: &[bool],
    out: &mut [T],
    init: T,
    f: F,
) {
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

/// A fold in eight independent lanes (see [`fold_row`]), fed a run at a time.
struct Lanes<T>([T; 8]);

impl<T: Float> Lanes<T> {
    /// Folds `run`'s whole groups of eight into the lanes; returns the rest.
    #[inline(always)]
    fn feed<'r, F: Fn(T, T) -> T>(&mut self, run: &'r [T], f: F) -> &'r [T] {
        let chunks = run.chunks_exact(8);
        let rem = chunks.remainder();
        for c in chunks {
            for (a, &v) in self.0.iter_mut().zip(c) {
                *a = f(*a, v);
            }
        }
        rem
    }
    /// The lanes joined in pairs (0 with 4, 1 with 5, ...), then `tail` folded in order.
    #[inline(always)]
    fn finish<F: Fn(T, T) -> T>(&self, tail: &[T], f: F) -> T {
        let acc = &self.0;
        let mut s = f(
            f(f(acc[0], acc[4]), f(acc[1], acc[5])),
            f(f(acc[2], acc[6]), f(acc[3], acc[7])),
        );
        for &v in tail {
            s = f(s, v);
        }
        s
    }
}

/// `x[at..at + len]` folded as [`fold_row`] folds a slice, read run by run.
#[inline(always)]
fn fold_runs<T: Float, S: Source<T>, F: Fn(T, T) -> T + Copy>(
    x: S,
    at: usize,
    len: usize,
    init: T,
    f: F,
) -> T {
    let mut lanes = Lanes([init; 8]);
    let mut done = None;
    x.runs(at, len, |run| {
        let tail = lanes.feed(run, f);
        // Only the last run can leave a tail.
        if !tail.is_empty() {
            done = Some(lanes.finish(tail, f));
        }
    });
    done.unwrap_or_else(|| lanes.finish(&[], f))
}

/// `row` folded by `f` from `init` in eight independent lanes, the lanes then joined in pairs
/// (0 with 4, 1 with 5, ...) and the tail folded in order: the lanes vectorise and do not wait
/// on one another, and a sum loses less precision than one running sum on long rows.
#[inline(always)]
fn fold_row<T: Float, F: Fn(T, T) -> T>(row: &[T], init: T, f: F) -> T {
    let mut lanes = Lanes([init; 8]);
    let tail = lanes.feed(row, &f);
    lanes.finish(tail, &f)
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

    /// Pseudo-random values of mixed sign and magnitude, so that the order of a sum shows in
    /// its bits.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let bits = crate::cpu::bf16::tests::bits(seed, n);
        let scale = [1.0, 1e-3, 37.0, 1e4];
        bits.iter()
            .enumerate()
            .map(|(i, v)| v.to_f32() * scale[i * 7 % 4])
            .collect()
    }

    /// Every pattern of reduced and kept blocks (and one the odometer takes), at sizes that the
    /// threads split, with rows that are not whole blocks of widening: one to three threads
    /// give one thread's bits, and a 16-bit input read block by block gives the bits of
    /// reducing its f32 widening.
    #[test]
    fn threads_and_widening_keep_the_bits() {
        // Under Miri, small enough to finish (the thread splits need the full sizes).
        let (big, row) = if cfg!(miri) { (1, 261) } else { (67, 2003) };
        let cases: [(&[usize], &[bool]); 9] = [
            (&[big * row], &[true]),
            // Past the size where a tall reduction folds blocks of rows (not under Miri).
            (&[3, 24 * big, 29], &[false, true, false]),
            (&[big * 3, row], &[false, true]),
            (&[row, big * 3], &[true, false]),
            (&[5, big, 7, 2 * big + 1], &[true, false, true, true]),
            (&[big, 2 * big + 3, 7], &[false, true, false]),
            (&[big * 3, 1, row], &[false, true, false]),
            (&[4, 5, 6, 7], &[true, false, true, false]),
            (&[big * 3, row], &[false, false]),
        ];
        for (k, &(shape, reduced)) in cases.iter().enumerate() {
            let n: usize = shape.iter().product();
            let x = values(n, k as u64);
            let half: Vec<crate::bf16> = x.iter().map(|&v| crate::bf16::from_f32(v)).collect();
            let wide: Vec<f32> = half.iter().map(|v| v.to_f32()).collect();
            let len: usize = shape
                .iter()
                .zip(reduced)
                .map(|(&d, &r)| if r { 1 } else { d })
                .product();
            for &op in ReduceOp::KINDS {
                let mut one = vec![0f32; len];
                reduce(op, &x, shape, reduced, &mut one);
                let mut want = vec![0f32; len];
                reduce(op, &wide, shape, reduced, &mut want);
                for threads in 1..=3 {
                    let mut got = vec![0f32; len];
                    reduce_on(op, &x, shape, reduced, &mut got, threads);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&one), "{shape:?} {reduced:?} on {threads}");
                    reduce_widened(op, &half, shape, reduced, &mut got, threads);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "bf16 {shape:?} {reduced:?} on {threads}"
                    );
                }
            }
        }
    }

    /// Tall reductions into few outputs (a bias gradient's shape), which fold blocks of rows
    /// separately: against an element-by-element reduction (small integers, exact in any
    /// order), on one to three threads, from f32 and from bf16, with every row of the table.
    /// (Not under Miri: the blocks start at 2¹⁶ elements, minutes there; the code is safe Rust
    /// on `claim_each`, which Miri checks through the other split tests.)
    #[test]
    #[cfg_attr(miri, ignore)]
    fn tall_reductions_match_an_index_by_index_reduction() {
        let cases: [(&[usize], &[bool]); 3] = [
            (&[4099, 37], &[true, false]),
            (&[3, 1500, 29], &[false, true, false]),
            (&[1, 70_000, 3], &[false, true, false]),
        ];
        for (shape, reduced) in cases {
            let n: usize = shape.iter().product();
            let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
            let half: Vec<crate::bf16> = x.iter().map(|&v| crate::bf16::from_f32(v)).collect();
            let c = *shape.last().unwrap();
            let b = shape[shape.len() - 2];
            let len = n / b;
            assert!(
                kept_row_blocks(b, len) > 1,
                "{shape:?} takes the row blocks"
            );
            for &op in ReduceOp::KINDS {
                let mut want = vec![op.identity::<f32>(); len];
                for (i, &v) in x.iter().enumerate() {
                    let o = i / (b * c) * c + i % c;
                    want[o] = op.combine(want[o], v);
                }
                for threads in 1..=3 {
                    let mut got = vec![0f32; len];
                    reduce_on(op, &x, shape, reduced, &mut got, threads);
                    assert_eq!(got, want, "{} of {shape:?} on {threads}", op.name());
                    reduce_widened(op, &half, shape, reduced, &mut got, threads);
                    assert_eq!(got, want, "bf16 {} of {shape:?} on {threads}", op.name());
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
