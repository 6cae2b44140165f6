//! Splitting large work across a few scoped threads.
//!
//! The engine never owns a global pool: each call gets the thread count its graph was configured
//! with, and threads are scoped to the call. Spawning costs tens of microseconds, so only work
//! above [`PAR_MIN_ELEMS`] elements is split.

/// Below this many elements an elementwise kernel runs on the calling thread.
pub const PAR_MIN_ELEMS: usize = 1 << 16;

/// Runs `f(start, out_chunk)` over `out` split into up to `threads` contiguous chunks.
pub fn par_chunks_mut<T: Send>(
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
    let chunk = n.div_ceil(t);
    std::thread::scope(|s| {
        let f = &f;
        let mut rest = out;
        let mut start = 0;
        let mut handles = Vec::new();
        while rest.len() > chunk {
            let (head, tail) = rest.split_at_mut(chunk);
            let st = start;
            handles.push(s.spawn(move || f(st, head)));
            rest = tail;
            start += chunk;
        }
        f(start, rest);
        for h in handles {
            h.join().expect("invariant: kernel threads do not panic");
        }
    });
}

/// Runs `f(index, row)` for every `row_len`-sized row of `out`, splitting whole rows across up
/// to `threads` threads once there are at least `min_elems` elements (images of a batch, say).
pub fn par_rows_mut<T: Send>(
    out: &mut [T],
    row_len: usize,
    threads: usize,
    min_elems: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if row_len == 0 {
        return;
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
        return;
    }
    let per = rows.div_ceil(t);
    std::thread::scope(|s| {
        let f = &f;
        let mut hs = Vec::new();
        for (j, chunk) in out.chunks_mut(per * row_len).enumerate() {
            hs.push(s.spawn(move || {
                for (k, r) in chunk.chunks_mut(row_len).enumerate() {
                    f(j * per + k, r);
                }
            }));
        }
        for h in hs {
            h.join().expect("invariant: kernel threads do not panic");
        }
    });
}
