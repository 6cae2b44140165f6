//! Dropout's keep/drop decisions from a counter-based hash, and the fused dropout kernel.
//!
//! Element `i` of a dropout with seed `s` is kept when a 32-bit hash of `i` and `s` (two rounds
//! of Wellons' `lowbias32` mixer, 32-bit multiplies and shifts that vectorise 8 lanes wide on
//! AVX2) is at least `⌈p·2³²⌉`. Nothing is stored: backward and the CUDA kernel compute the same
//! decisions from `(s, i)`, in any order and on any thread. (A 64-bit SplitMix finaliser cost a
//! fifth of the character GPT's step in forward and backward together; this one a few percent.)

use std::ops::Range;

use super::cast::Storage;
use super::par::{par_chunks_mut, PAR_MIN_ELEMS};
use crate::Float;

/// The multiplier of the mixer's first round (the CUDA kernels' `DROPOUT_MIX_1`).
pub(crate) const MIX_1: u32 = 0x7feb_352d;
/// The multiplier of the mixer's second round (`DROPOUT_MIX_2`).
pub(crate) const MIX_2: u32 = 0x846c_a68b;
/// The odd multiplier (⌊2³²/φ⌋) that spreads the counter's high word (`DROPOUT_HIGH_WORD`).
pub(crate) const HIGH_WORD: u32 = 0x9E37_79B9;

/// One round of the mixer.
#[inline(always)]
fn mix(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(MIX_1);
    x ^= x >> 15;
    x = x.wrapping_mul(MIX_2);
    x ^ (x >> 16)
}

/// The hash's two 32-bit inputs for element `counter` under `seed`: the low word (which steps
/// with the counter) and the high word (constant across 2³² consecutive counters).
#[inline(always)]
fn words(seed: u64, counter: u64) -> (u32, u32) {
    let lo = (counter as u32).wrapping_add(seed as u32);
    let hi = ((seed >> 32) as u32) ^ ((counter >> 32) as u32).wrapping_mul(HIGH_WORD);
    (lo, hi)
}

/// The 32-bit hash of element `counter` under `seed`.
#[inline(always)]
pub fn hash32(seed: u64, counter: u64) -> u32 {
    let (lo, hi) = words(seed, counter);
    mix(mix(lo) ^ hi)
}

/// `out[c] = scale` where element `start + c` of the dropout seeded `seed` is kept at threshold
/// `t` ([`threshold`]), else 0: a row of keep decisions as multipliers, vectorised (the counter's
/// high word is constant within each run of 2³² counters, so the lanes step only the low word).
pub fn keep_scales<T: Float>(seed: u64, start: u64, t: u64, scale: T, out: &mut [T]) {
    let Ok(t) = u32::try_from(t) else {
        // p = 1: nothing is kept.
        out.fill(T::ZERO);
        return;
    };
    for_each_run(seed, start, out.len(), |run, (lo, hi)| {
        let part = &mut out[run];
        super::wide::wide(
            part.len(),
            #[inline(always)]
            move || {
                for (c, o) in part.iter_mut().enumerate() {
                    let h = mix(mix(lo.wrapping_add(c as u32)) ^ hi);
                    *o = if h >= t { scale } else { T::ZERO };
                }
            },
        );
    });
}

/// Elements `start..start + len` in runs within which the counter's high word is constant:
/// `f(run, (lo, hi))` for each, `run` relative to `start` and `(lo, hi)` the hash's words
/// ([`words`]) of the run's first element. Element `c` of a run hashes to
/// `mix(mix(lo + c) ^ hi)`, which the lanes step without 64-bit arithmetic.
fn for_each_run(seed: u64, start: u64, len: usize, mut f: impl FnMut(Range<usize>, (u32, u32))) {
    let mut done = 0;
    while done < len {
        let at = start.wrapping_add(done as u64);
        let room = (1u64 << 32) - (at & 0xffff_ffff);
        let n = (len - done).min(usize::try_from(room).unwrap_or(usize::MAX));
        f(done..done + n, words(seed, at));
        done += n;
    }
}

/// The hash value below which an element is dropped: `⌈p·2³²⌉` (saturating).
#[inline(always)]
pub fn threshold(p: f64) -> u64 {
    (p * 4_294_967_296.0).ceil().clamp(0.0, 4_294_967_296.0) as u64
}

/// Whether element `counter` of the dropout seeded `seed` is kept at drop probability `p`.
#[inline(always)]
pub fn keeps(seed: u64, counter: u64, p: f64) -> bool {
    u64::from(hash32(seed, counter)) >= threshold(p)
}

/// `out[i] = x[i]·scale` where element `i` is kept, else 0 (inverted dropout: `scale` is
/// `1/(1 − p)`). Threaded over chunks for large tensors, vectorised within each.
pub fn dropout<T: Float>(x: &[T], seed: u64, p: f64, scale: T, out: &mut [T], threads: usize) {
    let t = threshold(p);
    par_chunks_mut(out, threads, PAR_MIN_ELEMS, |start, o| {
        dropout_serial(&x[start..start + o.len()], (seed, start), t, scale, o)
    });
}

/// [`dropout`] on elements `at..at + out.len()` of the whole (`x` is their part).
#[inline(always)]
fn dropout_serial<T: Float>(x: &[T], (seed, at): (u64, usize), t: u64, scale: T, out: &mut [T]) {
    let Ok(t) = u32::try_from(t) else {
        // p = 1: nothing is kept.
        out.fill(T::ZERO);
        return;
    };
    for_each_run(seed, at as u64, out.len(), |run, (lo, hi)| {
        let (x, out) = (&x[run.clone()], &mut out[run]);
        super::wide::wide(
            out.len(),
            #[inline(always)]
            move || {
                for (c, (o, &v)) in out.iter_mut().zip(x).enumerate() {
                    let h = mix(mix(lo.wrapping_add(c as u32)) ^ hi);
                    *o = if h >= t { v * scale } else { T::ZERO };
                }
            },
        )
    });
}

/// [`dropout`] for 16-bit storage ([`super::cast::blockwise`]): each block widened to f32,
/// scaled there and rounded once — the values of the f32 kernel on the widened tensor,
/// rounded, without an f32 copy of it.
pub fn dropout_half<H: Storage>(x: &[H], seed: u64, p: f64, out: &mut [H], threads: usize) {
    let t = threshold(p);
    let scale = (1.0 / (1.0 - p)) as f32;
    super::cast::blockwise([x], out, threads, |at, [x], o| {
        dropout_serial(x, (seed, at), t, scale, o)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised row of multipliers makes each decision `keeps` makes, across a change of
    /// the counter's high word and at the edge probabilities.
    #[test]
    fn keep_scales_are_the_decisions_of_keeps() {
        for (seed, start) in [(7u64, 0u64), (0x1234_5678_9abc_def0, (1 << 32) - 37)] {
            for p in [0.0, 0.1, 0.5, 1.0] {
                let mut out = vec![9.0f32; 100];
                keep_scales(seed, start, threshold(p), 2.5, &mut out);
                for (c, &o) in out.iter().enumerate() {
                    let want = if keeps(seed, start + c as u64, p) {
                        2.5
                    } else {
                        0.0
                    };
                    assert_eq!(o, want, "seed {seed} element {} p {p}", start + c as u64);
                }
            }
        }
    }

    /// The kernel keeps exactly the elements `keeps` keeps, scaled, across a change of the
    /// counter's high word and at the edge probabilities.
    #[test]
    fn dropout_keeps_the_decisions_of_keeps() {
        let x: Vec<f32> = (0..100).map(|i| i as f32 - 40.5).collect();
        for (seed, at) in [(7u64, 0usize), (0x1234_5678_9abc_def0, (1 << 32) - 37)] {
            for p in [0.0, 0.1, 0.5, 1.0] {
                let mut out = vec![9.0f32; x.len()];
                dropout_serial(&x, (seed, at), threshold(p), 2.5, &mut out);
                for (c, (&o, &v)) in out.iter().zip(&x).enumerate() {
                    let kept = keeps(seed, (at + c) as u64, p);
                    let want = if kept { v * 2.5 } else { 0.0 };
                    assert_eq!(o, want, "seed {seed} element {} p {p}", at + c);
                }
            }
        }
    }

    #[test]
    fn drops_about_p_and_scales_the_rest() {
        let x = vec![1.0f32; if cfg!(miri) { 4_000 } else { 100_000 }];
        let mut o = vec![0.0f32; x.len()];
        dropout(&x, 7, 0.3, 1.0 / 0.7, &mut o, 2);
        let kept = o.iter().filter(|&&v| v != 0.0).count() as f64 / x.len() as f64;
        let tol = if cfg!(miri) { 0.03 } else { 0.01 };
        assert!((kept - 0.7).abs() < tol, "{kept}");
        assert!(o.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.7).abs() < 1e-6));
        // The same seed, the same mask; another seed, another.
        let mut o2 = vec![0.0f32; x.len()];
        dropout(&x, 7, 0.3, 1.0 / 0.7, &mut o2, 1);
        assert_eq!(o, o2);
        dropout(&x, 8, 0.3, 1.0 / 0.7, &mut o2, 1);
        assert_ne!(o, o2);
    }
}
