//! Splitting large work across a few threads.
//!
//! Each call gets the thread count its graph was configured with; the threads are parked
//! workers ([`super::thread_pool`]), so a split costs a wake-up rather than a spawn. Still, only work
//! above [`PAR_MIN_ELEMS`] elements is split.

/// Below this many elements an elementwise kernel runs on the calling thread.
pub const PAR_MIN_ELEMS: usize = 1 << 16;

/// Runs `f(start, out_chunk)` over `out` split into contiguous chunks, run by up to `threads`
/// threads. What `f` computes for an element must not depend on the chunk it comes in.
///
/// Work too small to split (nearly every call) runs `f` in line, decided without a division:
/// a chain of tiny tensors pays no call and no split logic per kernel.
#[inline(always)]
pub fn par_chunks_mut<T: Send>(
    out: &mut [T],
    threads: usize,
    min: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if threads <= 1 || out.len() < min.saturating_mul(2) {
        f(0, out);
        return;
    }
    split_chunks_mut(out, threads, min, f);
}

fn split_chunks_mut<T: Send>(
    out: &mut [T],
    threads: usize,
    min: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let n = out.len();
    let t = threads.max(1).min(n / min.max(1)).max(1);
    if t <= 1 {
        f(0, out);
        return;
    }
    // A few chunks a thread (each at least `min`), claimed one at a time: a thread slowed by
    // other work on its core takes fewer. Large chunks in whole cache lines (of any element
    // type), so that no two threads write one.
    let parts = (t * CHUNKS_PER_THREAD).min(n / min.max(1)).max(t);
    let chunk = n.div_ceil(parts);
    let chunk = if chunk >= 4096 {
        chunk.next_multiple_of(64)
    } else {
        chunk
    };
    let parts: Vec<&mut [T]> = out.chunks_mut(chunk).collect();
    claim_each(parts, t, |j, part| f(j * chunk, part));
}

/// How many chunks [`par_chunks_mut`] makes per thread where the work allows.
const CHUNKS_PER_THREAD: usize = 4;

/// Runs `f(index, row)` for every `row_len`-sized row of `out`, splitting whole rows across up
/// to `threads` threads once there are at least `min_elems` elements (images of a batch, say).
pub fn par_rows_mut<T: Send>(
    out: &mut [T],
    row_len: usize,
    threads: usize,
    min_elems: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let Some((rows, t)) = row_split(out, row_len, threads, min_elems, &f) else {
        return;
    };
    let per = rows.div_ceil(t);
    let parts: Vec<&mut [T]> = out.chunks_mut(per * row_len).collect();
    super::thread_pool::for_each_part(parts, |j, chunk| {
        for (k, r) in chunk.chunks_mut(row_len).enumerate() {
            f(j * per + k, r);
        }
    });
}

/// [`par_rows_mut`] over two outputs cut at the same rows: `f(index, a_row, b_row)` for each of
/// `rows` rows, `a`'s of `a_len` elements and `b`'s of `b_len` (a row's results and something
/// kept per row beside them, say its statistics). Split across up to `threads` threads once `a`
/// holds at least `min_elems` elements. Either length may be zero.
pub fn par_rows_pair_mut<A: Send, B: Send>(
    rows: usize,
    (a, a_len): (&mut [A], usize),
    (b, b_len): (&mut [B], usize),
    threads: usize,
    min_elems: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    assert!(
        a.len() == rows * a_len && b.len() == rows * b_len,
        "par_rows_pair_mut: outputs of {} and {} elements for {rows} rows of {a_len} and {b_len}",
        a.len(),
        b.len()
    );
    let run = |start: usize, count: usize, a: &mut [A], b: &mut [B]| {
        let (mut a, mut b) = (a, b);
        for i in start..start + count {
            let (ar, at) = std::mem::take(&mut a).split_at_mut(a_len);
            let (br, bt) = std::mem::take(&mut b).split_at_mut(b_len);
            f(i, ar, br);
            (a, b) = (at, bt);
        }
    };
    let t = if a.len() >= min_elems {
        threads.clamp(1, rows.max(1))
    } else {
        1
    };
    if t <= 1 {
        run(0, rows, a, b);
        return;
    }
    let per = rows.div_ceil(t);
    let mut parts = Vec::with_capacity(t);
    let (mut a, mut b, mut start) = (a, b, 0);
    while start < rows {
        let count = per.min(rows - start);
        let (ah, at) = std::mem::take(&mut a).split_at_mut(count * a_len);
        let (bh, bt) = std::mem::take(&mut b).split_at_mut(count * b_len);
        parts.push((start, count, ah, bh));
        (a, b, start) = (at, bt, start + count);
    }
    super::thread_pool::for_each_owned(parts, |_, (start, count, a, b)| run(*start, *count, a, b));
}

/// How many of `threads` split `out`'s rows (`Some((rows, t))`, `t ≥ 2`); or `None` once the
/// rows have run in line (one thread, or fewer than `min_elems` elements) or there are none.
fn row_split<T>(
    out: &mut [T],
    row_len: usize,
    threads: usize,
    min_elems: usize,
    f: &impl Fn(usize, &mut [T]),
) -> Option<(usize, usize)> {
    if row_len == 0 {
        return None;
    }
    let rows = out.len() / row_len;
    let t = if out.len() >= min_elems {
        threads.clamp(1, rows.max(1))
    } else {
        1
    };
    if t <= 1 {
        for (k, r) in out.chunks_mut(row_len).enumerate() {
            f(k, r);
        }
        return None;
    }
    Some((rows, t))
}

/// [`par_rows_mut`] for rows that each hold much work (the images of a batch): the threads
/// claim rows one at a time from a shared count, so that a thread slowed by other work on its
/// core (another process, the application's own threads) takes fewer rows instead of holding
/// the others up at the end. What `f` computes for a row must not depend on which thread runs
/// it.
pub fn par_rows_claimed<T: Send>(
    out: &mut [T],
    row_len: usize,
    threads: usize,
    min_elems: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let Some((_, t)) = row_split(out, row_len, threads, min_elems, &f) else {
        return;
    };
    claim_each(
        out.chunks_mut(row_len).collect(),
        t,
        |i, row: &mut &mut [T]| f(i, row),
    );
}

/// Runs `f(i, &mut parts[i])` for every part on up to `threads` threads, which claim parts one
/// at a time from a shared count: a thread slowed by other work on its core takes fewer parts
/// instead of holding the others up at the end. What `f` computes for a part must not depend
/// on which thread runs it.
pub fn claim_each<P: Send>(parts: Vec<P>, threads: usize, f: impl Fn(usize, &mut P) + Sync) {
    let t = threads.clamp(1, parts.len().max(1));
    // Each part behind its own lock, which only the thread that claimed it ever takes.
    let parts: Vec<std::sync::Mutex<P>> = parts.into_iter().map(std::sync::Mutex::new).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    super::thread_pool::fork(t, &|_| loop {
        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(part) = parts.get(i) else {
            break;
        };
        let mut part = part.lock().unwrap_or_else(|e| e.into_inner());
        f(i, &mut part);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element is handed to `f` once, in a chunk whose start is its own: sizes too small
    /// to split, sizes split into more chunks than threads (small and whole-line chunks), and
    /// a few outputs of much work each (`min` 1).
    #[test]
    fn chunks_cover_every_element_once_at_their_start() {
        // Under Miri (interpreted) smaller sizes of the same kinds: one whole-line chunk size
        // (33,001 in chunks of 4,160, the last shorter) and the rest small.
        let cases: &[(usize, usize, usize)] = if cfg!(miri) {
            &[
                (1000, 2, 1 << 16),
                (33_001, 2, 4000),
                (3_001, 3, 10),
                (5, 2, 1),
            ]
        } else {
            &[
                (1000, 2, 1 << 16),
                (300_001, 2, 1000),
                (300_001, 3, 1 << 16),
                (5, 2, 1),
                (40_000, 3, 1),
            ]
        };
        for &(n, threads, min) in cases {
            let mut out = vec![0usize; n];
            par_chunks_mut(&mut out, threads, min, |start, o| {
                for (k, v) in o.iter_mut().enumerate() {
                    *v += start + k + 1;
                }
            });
            assert!(
                out.iter().enumerate().all(|(i, &v)| v == i + 1),
                "{n} on {threads} threads, min {min}"
            );
        }
    }

    /// Every row is handed to `f` once, with its own index, on one thread or several (more
    /// threads than rows included); rows too small to split run in line.
    #[test]
    fn claimed_rows_each_run_once_with_their_index() {
        for (rows, threads, min) in [(7, 1, 0), (7, 2, 0), (7, 3, 0), (2, 8, 0), (5, 2, 1 << 20)] {
            let mut out = vec![0usize; rows * 3];
            par_rows_claimed(&mut out, 3, threads, min, |i, row| {
                for v in row.iter_mut() {
                    *v += i + 1;
                }
            });
            let want: Vec<usize> = (0..rows).flat_map(|i| [i + 1; 3]).collect();
            assert_eq!(out, want, "{rows} rows on {threads} threads");
        }
    }
}
