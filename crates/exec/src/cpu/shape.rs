//! Kernels that move data: permute, broadcast, concat, narrow, index-select, gather, scatter-add.

use crate::layout::{broadcast_strides, coalesce, contiguous_strides, walk};
use crate::Float;

/// `out` (contiguous, shape `shape` permuted by `perm`) = `x` permuted: out dim i is x dim `perm[i]`.
///
/// When the permutation moves the input's contiguous axis away from the innermost position (a
/// transpose), rows are copied in 32×32 tiles so that both the reads and the writes stay in cache.
pub fn permute<T: Copy + Send + Sync>(x: &[T], shape: &[usize], perm: &[usize], out: &mut [T]) {
    permute_par(x, shape, perm, out, 1);
}

/// [`permute`] with the output's first axis split across up to `threads` threads once the
/// tensor is large.
pub fn permute_par<T: Copy + Send + Sync>(
    x: &[T],
    shape: &[usize],
    perm: &[usize],
    out: &mut [T],
    threads: usize,
) {
    let xs = contiguous_strides(shape);
    let oshape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let src: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    let rows = oshape.first().copied().unwrap_or(1);
    let t = if out.len() >= super::par::PAR_MIN_ELEMS {
        threads.clamp(1, rows.max(1))
    } else {
        1
    };
    if t <= 1 || oshape.len() < 2 {
        permute_block(x, 0, &oshape, &src, out);
        return;
    }
    let per_row = out.len() / rows;
    let per = rows.div_ceil(t);
    let parts: Vec<&mut [T]> = out.chunks_mut(per * per_row).collect();
    super::thread_pool::for_each_part(parts, |j, block| {
        let mut sub = oshape.clone();
        sub[0] = block.len() / per_row;
        permute_block(x, j * per * src[0], &sub, &src, block);
    });
}

/// `out[i] = x[base + Σ i_d·src[d]]` over the index space `oshape` (row-major `out`).
fn permute_block<T: Copy + Send + Sync>(
    x: &[T],
    base: usize,
    oshape: &[usize],
    src: &[usize],
    out: &mut [T],
) {
    let x = &x[base..];
    let os = contiguous_strides(oshape);
    let (csh, [cos, csrc]) = coalesce(oshape, [&os, src]);
    let r = csh.len();
    if r >= 2 && csrc[r - 1] != 1 && csrc[r - 2] == 1 {
        // Batched transpose: out[.., i, j] = x[.., j, i] with i over dim r-2 (source stride 1).
        // The output is contiguous, so its rows (over i) are nj apart: each batch entry is the
        // transpose of an nj × ni source matrix with row stride sj.
        let (ni, nj) = (csh[r - 2], csh[r - 1]);
        let sj = csrc[r - 1];
        debug_assert_eq!(cos[r - 2], nj);
        walk(
            &csh[..r - 2],
            [&cos[..r - 2], &csrc[..r - 2]],
            |[oo, ox], n, [io, ix]| {
                for t in 0..n {
                    let (ob, xb) = (oo + t * io, ox + t * ix);
                    super::transpose::transpose(&x[xb..], nj, ni, sj, &mut out[ob..ob + ni * nj]);
                }
            },
        );
        return;
    }
    walk(oshape, [&os, src], |[oo, ox], n, [_, ix]| {
        if ix == 1 {
            out[oo..oo + n].copy_from_slice(&x[ox..ox + n]);
        } else {
            for i in 0..n {
                out[oo + i] = x[ox + i * ix];
            }
        }
    });
}

/// `dst`'s runs of `len` elements, in order, copied from `src`: run `r` from `src[at(r)..][..len]`
/// (a gather of heads' rows, or their merge back). Runs of 8, 16, 32, 64 or 128 elements are
/// copied as fixed-size arrays by a loop made for that length, which the compiler turns into a
/// few vector moves in place for the shorter ones (the longest copies may still call `memcpy`);
/// `copy_from_slice` calls `memcpy` for each run, whose call and size dispatch cost more than a
/// short run's copy (attention's gathers of 64-byte head rows took twice as long through it, in
/// a probe from the cache). Other lengths take `copy_from_slice`.
///
/// # Panics
/// If `len` is 0 while `dst` is not empty, or if `len` does not divide `dst.len()`, or a run
/// lies outside `src`.
#[inline(always)]
pub fn fill_runs<T: Copy>(dst: &mut [T], len: usize, src: &[T], at: impl Fn(usize) -> usize) {
    /// The loop for runs of `N`, so that each length's copy stays its own constant-size move.
    #[inline(always)]
    fn runs<T: Copy, const N: usize>(dst: &mut [T], src: &[T], at: impl Fn(usize) -> usize) {
        for (r, run) in dst.chunks_exact_mut(N).enumerate() {
            let from = at(r);
            let (Ok(d), Ok(s)) = (
                <&mut [T; N]>::try_from(run),
                <&[T; N]>::try_from(&src[from..from + N]),
            ) else {
                unreachable!("chunks of N elements")
            };
            *d = *s;
        }
    }
    if dst.is_empty() {
        return;
    }
    assert!(
        len > 0 && dst.len().is_multiple_of(len),
        "fill_runs: {} elements in runs of {len}",
        dst.len()
    );
    match len {
        8 => runs::<T, 8>(dst, src, at),
        16 => runs::<T, 16>(dst, src, at),
        32 => runs::<T, 32>(dst, src, at),
        64 => runs::<T, 64>(dst, src, at),
        128 => runs::<T, 128>(dst, src, at),
        _ => {
            for (r, run) in dst.chunks_exact_mut(len).enumerate() {
                let from = at(r);
                run.copy_from_slice(&src[from..from + len]);
            }
        }
    }
}

/// Fills `out` with copies of `row` (`out.len()` a multiple of `row.len()`), doubling the filled
/// prefix at each step: a handful of long copies instead of one short copy per row.
pub fn repeat_rows<T: Copy>(row: &[T], out: &mut [T]) {
    let n = row.len();
    if n == 0 || out.is_empty() {
        return;
    }
    debug_assert_eq!(out.len() % n, 0);
    out[..n].copy_from_slice(row);
    let mut filled = n;
    while filled < out.len() {
        let more = filled.min(out.len() - filled);
        out.copy_within(0..more, filled);
        filled += more;
    }
}

/// [`broadcast_to`] on up to `threads` threads where `x` is one value (a sum's gradient spread
/// back over its input): a fill in chunks. A walk of the output's innermost runs (28 floats
/// each for a `[64, 32, 28, 28]` gradient) on one thread was 5.6% of a transposed
/// convolution's training step.
pub fn broadcast_to_par<T: Copy + Send + Sync>(
    x: &[T],
    from: &[usize],
    to: &[usize],
    out: &mut [T],
    threads: usize,
) {
    if let [v] = *x {
        super::par::par_chunks_mut(out, threads, super::par::PAR_MIN_ELEMS, |_, c| c.fill(v));
        return;
    }
    broadcast_to(x, from, to, out)
}

/// `out` (shape `to`) = `x` (shape `from`) broadcast.
pub fn broadcast_to<T: Copy + Send + Sync>(x: &[T], from: &[usize], to: &[usize], out: &mut [T]) {
    let src = broadcast_strides(from, to);
    let os = contiguous_strides(to);
    walk(to, [&os, &src], |[oo, ox], n, [_, ix]| match ix {
        1 => out[oo..oo + n].copy_from_slice(&x[ox..ox + n]),
        0 => out[oo..oo + n].fill(x[ox]),
        _ => {
            for i in 0..n {
                out[oo + i] = x[ox + i * ix];
            }
        }
    });
}

/// Copies `x` (shape `shape`) into the region of `out` (shape `shape` with `out_extent` at `axis`)
/// that starts at `start` along `axis`. The building block of concat and of narrow's backward.
pub fn place_along<T: Copy + Send + Sync>(
    x: &[T],
    shape: &[usize],
    axis: usize,
    out: &mut [T],
    out_extent: usize,
    start: usize,
) {
    let (outer, len, inner) = super::reduce::around_axis(shape, axis);
    let chunk = len * inner;
    for o in 0..outer {
        let dst = o * out_extent * inner + start * inner;
        out[dst..dst + chunk].copy_from_slice(&x[o * chunk..o * chunk + chunk]);
    }
}

/// `out` = `x[.., start..start+len, ..]` along `axis` (x has `shape`).
pub fn narrow<T: Copy + Send + Sync>(
    x: &[T],
    shape: &[usize],
    axis: usize,
    start: usize,
    len: usize,
    out: &mut [T],
) {
    let (outer, ext, inner) = super::reduce::around_axis(shape, axis);
    let chunk = len * inner;
    for o in 0..outer {
        let src = o * ext * inner + start * inner;
        out[o * chunk..o * chunk + chunk].copy_from_slice(&x[src..src + chunk]);
    }
}

/// `out` = `x` with only the entries `idx` along `axis`, in that order.
pub fn index_select<T: Copy + Send + Sync>(
    x: &[T],
    shape: &[usize],
    axis: usize,
    idx: &[usize],
    out: &mut [T],
) {
    index_select_par(x, shape, axis, idx, out, 1)
}

/// [`index_select`] on up to `threads` threads (the output's rows split among them).
pub fn index_select_par<T: Copy + Send + Sync>(
    x: &[T],
    shape: &[usize],
    axis: usize,
    idx: &[usize],
    out: &mut [T],
    threads: usize,
) {
    let (outer, ext, inner) = super::reduce::around_axis(shape, axis);
    if inner == 0 {
        return;
    }
    if outer == 1 {
        // One row of `inner` per index: rows split among the threads.
        super::par::par_rows_mut(out, inner, threads, super::par::PAR_MIN_ELEMS, |j, row| {
            let src = idx[j] * inner;
            row.copy_from_slice(&x[src..src + inner]);
        });
        return;
    }
    let block = idx.len() * inner;
    super::par::par_rows_mut(out, block, threads, super::par::PAR_MIN_ELEMS, |o, ob| {
        for (j, &i) in idx.iter().enumerate() {
            let src = (o * ext + i) * inner;
            ob[j * inner..(j + 1) * inner].copy_from_slice(&x[src..src + inner]);
        }
    });
}

/// The adjoint of [`index_select`]: `out[.., idx[j], ..] += g[.., j, ..]` (out has `shape`).
pub fn index_add<T: Float>(g: &[T], shape: &[usize], axis: usize, idx: &[usize], out: &mut [T]) {
    index_add_par(g, shape, axis, idx, out, 1)
}

/// [`index_add`] on up to `threads` threads without races: along a leading axis each thread
/// owns a range of the output's rows and adds, in index order, the rows of `g` that land there
/// (every thread reads all of `idx`); otherwise the blocks of the leading axes are split.
/// Each output element receives its additions in the order of `idx`, whatever the threads.
pub fn index_add_par<T: Float>(
    g: &[T],
    shape: &[usize],
    axis: usize,
    idx: &[usize],
    out: &mut [T],
    threads: usize,
) {
    let (outer, ext, inner) = super::reduce::around_axis(shape, axis);
    if inner == 0 || ext == 0 {
        return;
    }
    let add_row = |o: &mut [T], x: &[T]| {
        for (a, &b) in o.iter_mut().zip(x) {
            *a += b;
        }
    };
    if outer == 1 {
        let t = if g.len() >= 2 * super::par::PAR_MIN_ELEMS {
            threads.clamp(1, ext)
        } else {
            1
        };
        let per = ext.div_ceil(t);
        let parts: Vec<&mut [T]> = out.chunks_mut(per * inner).collect();
        super::thread_pool::for_each_part(parts, |p, part| {
            let (lo, hi) = (p * per, p * per + part.len() / inner);
            for (j, &i) in idx.iter().enumerate() {
                if (lo..hi).contains(&i) {
                    let d = (i - lo) * inner;
                    add_row(&mut part[d..d + inner], &g[j * inner..(j + 1) * inner]);
                }
            }
        });
        return;
    }
    let n = idx.len();
    super::par::par_rows_mut(
        out,
        ext * inner,
        threads,
        super::par::PAR_MIN_ELEMS,
        |o, ob| {
            for (j, &i) in idx.iter().enumerate() {
                let src = (o * n + j) * inner;
                add_row(&mut ob[i * inner..(i + 1) * inner], &g[src..src + inner]);
            }
        },
    );
}

/// Whether `idx` (row-major, of `shape`) is the same all across every slice off `axis`: each
/// `idx[.., k, ..]` equal to the first, `idx[0, .., 0, k, 0, .., 0]` (a scatter's index expanded
/// from one value per row, as `dst.unsqueeze(1).expand(-1, F)`). Read on up to `threads`
/// threads, in cache-sized runs compared without a branch per element; the answer does not
/// depend on the threads.
pub fn constant_off_axis<T: Copy + Eq + Send + Sync>(
    idx: &[T],
    shape: &[usize],
    axis: usize,
    threads: usize,
) -> bool {
    let (outer, n, inner) = super::reduce::around_axis(shape, axis);
    let numel = outer * n * inner;
    if idx.len() != numel {
        return false;
    }
    if numel == 0 {
        return true;
    }
    let first = |k: usize| idx[k * inner];
    // The flat index space in runs of whole `inner` slices, each run checked by one task.
    let slices = outer * n;
    let per = (super::par::PAR_MIN_ELEMS / inner).max(1);
    let runs = slices.div_ceil(per);
    let threads = if numel >= 2 * super::par::PAR_MIN_ELEMS {
        threads
    } else {
        1
    };
    let differs = std::sync::atomic::AtomicBool::new(false);
    let run = |r: usize| {
        if differs.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let (lo, hi) = (r * per, ((r + 1) * per).min(slices));
        let (mut same, mut k) = (true, lo % n);
        for slice in idx[lo * inner..hi * inner].chunks_exact(inner) {
            let v = first(k);
            // `&` over the slice, not `all`: no early exit inside it, so it vectorises.
            same &= slice.iter().fold(true, |acc, &x| acc & (x == v));
            k = if k + 1 == n { 0 } else { k + 1 };
        }
        if !same {
            differs.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let tasks: Vec<usize> = (0..runs).collect();
    super::par::claim_each(tasks, threads, |_, &mut r| run(r));
    !differs.load(std::sync::atomic::Ordering::Relaxed)
}

/// PyTorch's gather: `out[p] = x[p with coordinate axis replaced by idx[p]]`, where `idx` and `out`
/// have shape `ishape` (equal to `shape` except possibly at `axis`).
pub fn gather<T: Copy + Send + Sync>(
    x: &[T],
    shape: &[usize],
    axis: usize,
    idx: &[usize],
    ishape: &[usize],
    out: &mut [T],
) {
    let (outer, ext, inner) = super::reduce::around_axis(shape, axis);
    let iext = ishape[axis];
    for o in 0..outer {
        for j in 0..iext {
            for t in 0..inner {
                let p = (o * iext + j) * inner + t;
                out[p] = x[(o * ext + idx[p]) * inner + t];
            }
        }
    }
}

/// The adjoint of [`gather`]: `out[.. idx[p] ..] += g[p]` (out has `shape`).
pub fn scatter_add<T: Float>(
    g: &[T],
    shape: &[usize],
    axis: usize,
    idx: &[usize],
    ishape: &[usize],
    out: &mut [T],
) {
    let (outer, ext, inner) = super::reduce::around_axis(shape, axis);
    let iext = ishape[axis];
    for o in 0..outer {
        for j in 0..iext {
            for t in 0..inner {
                let p = (o * iext + j) * inner + t;
                out[(o * ext + idx[p]) * inner + t] += g[p];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index expanded off its axis is found constant on any thread count, at any size (one
    /// run and many); a single entry changed anywhere — first slice, last, a middle run — is
    /// found, as is a length that does not match the shape.
    #[test]
    fn constant_off_axis_finds_any_difference() {
        let rows = if cfg!(miri) { 5 } else { 3 * 65_536 / 8 + 3 };
        for (shape, axis) in [
            (vec![rows, 8], 0),
            (vec![3, rows, 2], 1),
            (vec![4, 7], 1),
            (vec![2, 3, 0], 1),
        ] {
            let (outer, n, inner) = super::super::reduce::around_axis(&shape, axis);
            let base: Vec<i64> = (0..n as i64).map(|k| (k * 7919) % 1000).collect();
            let idx: Vec<i64> = (0..outer * n * inner)
                .map(|p| base[(p / inner) % n])
                .collect();
            for threads in [1, 2, 3] {
                assert!(constant_off_axis(&idx, &shape, axis, threads), "{shape:?}");
                if idx.is_empty() {
                    assert!(!constant_off_axis(&[0], &shape, axis, threads));
                    continue;
                }
                assert!(!constant_off_axis(&idx[1..], &shape, axis, threads));
                for at in [1, idx.len() / 2, idx.len() - 1] {
                    // Changed where the reference is read too: then the other copies differ.
                    let mut bad = idx.clone();
                    bad[at] += 1;
                    assert!(
                        !constant_off_axis(&bad, &shape, axis, threads),
                        "{shape:?} {at}"
                    );
                }
            }
        }
    }

    /// One value broadcast on threads fills every element of any shape (large enough to split,
    /// and empty); other sources take the walk, the same as on one thread.
    #[test]
    fn broadcast_on_threads_is_the_walk() {
        let big: usize = if cfg!(miri) {
            40
        } else {
            3 * super::super::par::PAR_MIN_ELEMS + 5
        };
        for (x, from, to) in [
            (vec![2.5f32], vec![], vec![big]),
            (vec![-1.0], vec![1, 1], vec![3, big / 3]),
            (vec![7.0], vec![1], vec![0, 4]),
            (
                (0..6).map(|v| v as f32).collect(),
                vec![2, 1, 3],
                vec![2, 5, 3],
            ),
        ] {
            let n: usize = to.iter().product();
            let mut want = vec![f32::NAN; n];
            broadcast_to(&x, &from, &to, &mut want);
            for threads in [1, 2, 3] {
                let mut got = vec![f32::NAN; n];
                broadcast_to_par(&x, &from, &to, &mut got, threads);
                assert_eq!(got, want, "{from:?} -> {to:?} on {threads} threads");
            }
            if let [v] = *x {
                assert!(want.iter().all(|&w| w == v));
            }
        }
    }

    /// Every run length, those with a loop of their own (8–128) and others, copies each run
    /// from where `at` says, in order; an empty destination copies nothing.
    #[test]
    fn fill_runs_copies_each_run_from_its_place() {
        let src: Vec<u32> = (0..1000).collect();
        for len in [1, 5, 8, 16, 31, 32, 64, 100, 128] {
            let runs = 3;
            // Runs taken backwards and spaced: run r from (runs − 1 − r)·(len + 7) + 3.
            let at = |r: usize| (runs - 1 - r) * (len + 7) + 3;
            let mut dst = vec![0u32; runs * len];
            fill_runs(&mut dst, len, &src, at);
            let want: Vec<u32> = (0..runs)
                .flat_map(|r| src[at(r)..at(r) + len].iter().copied())
                .collect();
            assert_eq!(dst, want, "runs of {len}");
        }
        fill_runs(&mut [0u32; 0], 0, &src, |_| 0);
    }

    #[test]
    // Not under Miri: safe code (the threads take disjoint slices), four minutes there.
    #[cfg_attr(miri, ignore)]
    fn threaded_index_ops_equal_the_serial_loops_bit_for_bit() {
        // Large enough to be split; repeated and unordered indices along each axis.
        for (shape, axis) in [
            ([1usize, 600, 70], 1usize),
            ([3, 500, 40], 1),
            ([900, 70, 1], 0),
        ] {
            let ext = shape[axis];
            let idx: Vec<usize> = (0..2 * ext).map(|k| (k * 7919 + k / 3) % ext).collect();
            let mut gshape = shape;
            gshape[axis] = idx.len();
            let n: usize = gshape.iter().product();
            let g: Vec<f32> = (0..n)
                .map(|k| ((k * 37) % 101) as f32 * 0.37 - 9.0)
                .collect();
            let len: usize = shape.iter().product();
            let (mut serial, mut threaded) = (vec![0.5f32; len], vec![0.5f32; len]);
            index_add_par(&g, &shape, axis, &idx, &mut serial, 1);
            index_add_par(&g, &shape, axis, &idx, &mut threaded, 3);
            assert_eq!(serial, threaded, "index_add {shape:?} axis {axis}");
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            index_select_par(&serial, &shape, axis, &idx, &mut a, 1);
            index_select_par(&serial, &shape, axis, &idx, &mut b, 3);
            assert_eq!(a, b, "index_select {shape:?} axis {axis}");
        }
    }

    #[test]
    fn repeat_rows_fills_every_row() {
        for rows in [1, 2, 3, 5, 8, 13] {
            let row = [1.0f32, 2.0, 3.0];
            let mut out = vec![0.0f32; rows * 3];
            repeat_rows(&row, &mut out);
            assert!(out.chunks(3).all(|r| r == row), "{rows} rows: {out:?}");
        }
    }

    #[test]
    fn tiled_transpose_matches_naive() {
        for (b, r, c) in [(1usize, 70usize, 45usize), (3, 33, 64), (2, 1, 5)] {
            let x: Vec<f32> = (0..b * r * c).map(|i| i as f32).collect();
            let mut o = vec![0.0; x.len()];
            permute(&x, &[b, r, c], &[0, 2, 1], &mut o);
            for bi in 0..b {
                for i in 0..r {
                    for j in 0..c {
                        assert_eq!(o[(bi * c + j) * r + i], x[(bi * r + i) * c + j]);
                    }
                }
            }
        }
        let x: Vec<f64> = (0..24).map(f64::from).collect();
        let mut o = vec![0.0; 24];
        permute(&x, &[2, 3, 4], &[2, 0, 1], &mut o);
        assert_eq!(o[1], 4.0);
        assert_eq!(o[6], 1.0);
    }

    #[test]
    fn permute_transposes() {
        let x: Vec<f64> = (0..6).map(f64::from).collect();
        let mut o = vec![0.0; 6];
        permute(&x, &[2, 3], &[1, 0], &mut o);
        assert_eq!(o, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn threaded_permute_matches() {
        let shape = [7, 64, 200];
        let n: usize = shape.iter().product();
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        for perm in [[1, 0, 2], [2, 0, 1], [0, 2, 1], [1, 2, 0]] {
            let mut want = vec![0.0; n];
            permute(&x, &shape, &perm, &mut want);
            let mut got = vec![0.0; n];
            permute_par(&x, &shape, &perm, &mut got, 3);
            assert_eq!(got, want, "{perm:?}");
        }
    }

    #[test]
    fn narrow_place_and_index() {
        let x: Vec<f64> = (0..12).map(f64::from).collect(); // 3x4
        let mut o = vec![0.0; 6];
        narrow(&x, &[3, 4], 1, 1, 2, &mut o);
        assert_eq!(o, vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
        let mut back = vec![0.0; 12];
        place_along(&o, &[3, 2], 1, &mut back, 4, 1);
        assert_eq!(back[1], 1.0);
        assert_eq!(back[0], 0.0);
        let mut sel = vec![0.0; 8];
        index_select(&x, &[3, 4], 0, &[2, 0], &mut sel);
        assert_eq!(sel, vec![8.0, 9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 3.0]);
        let mut acc = vec![0.0; 12];
        index_add(&sel, &[3, 4], 0, &[2, 2], &mut acc);
        assert_eq!(acc[8], 8.0 + 0.0);
        assert_eq!(acc[11], 11.0 + 3.0);
        let mut g = vec![0.0; 3];
        gather(&x, &[3, 4], 1, &[3, 0, 2], &[3, 1], &mut g);
        assert_eq!(g, vec![3.0, 4.0, 10.0]);
    }
}
