//! How fast this machine reads memory: the floor of a kernel that must read its operands once
//! (a token of batch-1 generation reads every weight).
//!
//! [`read_once`] reads every word of its parts once, each part split across the threads, as the
//! engine's kernels read a weight: sums of 32-bit words (integer adds, which keep up with
//! memory) with each thread asking for its lines 2 KB ahead, as the batch-1 products do. Without
//! that request this machine's reads ran at 60–70% of the speed with it, so a read without it
//! would be a floor the kernels beat.

use super::wide::prefetch;

/// Words ahead of the one read that each thread asks for (2 KB).
const AHEAD: usize = 512;

/// Reads every word of `parts` once on up to `threads` threads (the engine's pool) and returns
/// their wrapping sum (so that nothing is skipped).
pub fn read_once(parts: &[&[u32]], threads: usize) -> u32 {
    let t = threads.max(1);
    let sums: Vec<std::sync::atomic::AtomicU32> = (0..t)
        .map(|_| std::sync::atomic::AtomicU32::new(0))
        .collect();
    super::thread_pool::fork(t, &|k| {
        let mut total = 0u32;
        for part in parts {
            let per = part.len().div_ceil(t);
            let mine = &part[(k * per).min(part.len())..((k + 1) * per).min(part.len())];
            total = total.wrapping_add(super::wide::wide(
                mine.len(),
                #[inline(always)]
                || sum_words(mine),
            ));
        }
        sums[k].store(total, std::sync::atomic::Ordering::Relaxed);
    });
    sums.iter()
        .map(|s| s.load(std::sync::atomic::Ordering::Relaxed))
        .fold(0, u32::wrapping_add)
}

#[inline(always)]
fn sum_words(w: &[u32]) -> u32 {
    let mut acc = [0u32; 16];
    let chunks = w.chunks_exact(16);
    let tail = chunks.remainder();
    for (i, c) in chunks.enumerate() {
        prefetch(w.as_ptr().wrapping_add(i * 16 + AHEAD));
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(x);
        }
    }
    acc.iter().chain(tail).fold(0u32, |s, &x| s.wrapping_add(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every word is read once: the sum is the sum of the words, on any number of threads and
    /// with parts of every length.
    #[test]
    fn reads_every_word_once() {
        let parts: Vec<Vec<u32>> = [0usize, 1, 15, 16, 17, 1000, 4099]
            .iter()
            .map(|&n| (0..n as u32).map(|x| x.wrapping_mul(2654435761)).collect())
            .collect();
        let views: Vec<&[u32]> = parts.iter().map(|p| &p[..]).collect();
        let want = parts.iter().flatten().fold(0u32, |s, &x| s.wrapping_add(x));
        for threads in [1, 2, 3] {
            assert_eq!(read_once(&views, threads), want, "{threads} threads");
        }
    }
}
