//! Running a loop compiled for the widest vector unit the CPU has.
//!
//! The crate is built for the baseline x86-64 target, where the compiler vectorises loops with
//! 4-lane SSE; AVX2 doubles the lanes and AVX-512 quadruples them. [`wide`] detects the features
//! at run time and calls its closure through a function compiled with them, so the closure's
//! loops, inlined there, use the wider registers — without a `target-cpu` flag, which would make
//! the library's users' binaries unportable. Miri and other architectures call the closure
//! directly.
//!
//! The level can be capped: by the environment variable `ARENAGRAD_SIMD` (`avx512`, `avx2` or
//! `baseline`, read on first use) or by [`set_simd`] — for CPUs that lower their clock under
//! 512-bit work, or to compare the builds. Every level computes the same operations in the same
//! order (the loops do not fuse multiply-adds), so results do not depend on it.

use std::sync::atomic::{AtomicU8, Ordering};

/// Below this many elements a loop is too short for wider registers to repay the detour.
pub const WIDE_MIN_ELEMS: usize = 16;

/// A build of the vectorised loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Simd {
    /// The target's baseline (SSE2 on x86-64).
    Baseline,
    /// AVX2.
    Avx2,
    /// AVX-512 (F).
    Avx512,
}

const UNSET: u8 = u8::MAX;
/// The level in force, as `Simd as u8`; never above what the CPU reports.
static LEVEL: AtomicU8 = AtomicU8::new(UNSET);

/// The widest level this CPU has.
pub fn simd_available() -> Simd {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Simd::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return Simd::Avx2;
        }
    }
    Simd::Baseline
}

/// The level [`wide`] uses: the widest the CPU has, capped by `ARENAGRAD_SIMD` or [`set_simd`].
pub fn simd() -> Simd {
    match LEVEL.load(Ordering::Relaxed) {
        UNSET => {
            let cap = match std::env::var("ARENAGRAD_SIMD").as_deref() {
                Ok("baseline") | Ok("sse") => Simd::Baseline,
                Ok("avx2") => Simd::Avx2,
                _ => Simd::Avx512,
            };
            set_simd(cap)
        }
        l => from_u8(l),
    }
}

/// Caps the level [`wide`] uses at `level` (or at what the CPU has, if that is less) for the
/// whole process; returns the level now in force.
pub fn set_simd(level: Simd) -> Simd {
    let level = level.min(simd_available());
    LEVEL.store(level as u8, Ordering::Relaxed);
    level
}

fn from_u8(l: u8) -> Simd {
    match l {
        2 => Simd::Avx512,
        1 => Simd::Avx2,
        _ => Simd::Baseline,
    }
}

/// Calls `f()` from a function compiled with AVX-512 or AVX2 enabled when the CPU has them (see
/// [`simd`]) and the loop is long enough to gain (`len` elements, at least [`WIDE_MIN_ELEMS`]);
/// otherwise directly. `f` should hold the hot loop itself, with `#[inline(always)]` helpers:
/// what it calls across a non-inlined boundary runs in the baseline build. Make it a `move`
/// closure over copies of its scalars, so that the loop reads them from registers rather than
/// through the closure.
#[inline(always)]
pub fn wide<R>(len: usize, f: impl FnOnce() -> R) -> R {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if len >= WIDE_MIN_ELEMS {
        match simd() {
            // SAFETY: `with_avx512` is compiled with `avx512f` enabled, and the level is never
            // above what the CPU reports (`set_simd` caps it).
            Simd::Avx512 => return unsafe { with_avx512(f) },
            // SAFETY: as above, for `avx2`.
            Simd::Avx2 => return unsafe { with_avx2(f) },
            Simd::Baseline => {}
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = len;
    f()
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f")]
pub(crate) fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx2")]
pub(crate) fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Asks the CPU to bring the cache line at `p` closer, ahead of a read. Any address will do:
/// a prefetch reads nothing the program can see and never faults.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `_mm_prefetch` needs SSE, which every x86-64 CPU has; it is a hint that does not
    // access memory architecturally, so no validity is required of `p`.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}

/// Held by the tests that change the level, so that they do not race one another's changes
/// (tests that only read it run at whatever level is set: their results do not depend on it).
#[cfg(test)]
pub(crate) fn level_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{binary, reduce, softmax, softmax_grad, unary, unary_grad, Operand, ReduceOp};
    use crate::{BinaryOp, UnaryOp};

    /// The kernels that go through `wide`, run at every level this CPU has: each level gives the
    /// baseline's bits. (Other tests may run meanwhile at whatever level is set; results do not
    /// depend on it, which is what this checks.)
    #[test]
    fn every_level_gives_the_same_bits() {
        let n = 4 * 37;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 29) % 53) as f32 * 0.17 - 4.5)
            .collect();
        let y: Vec<f32> = (0..n)
            .map(|i| ((i * 13) % 41) as f32 * 0.05 + 0.1)
            .collect();
        let run = || {
            let mut outs: Vec<Vec<f32>> = Vec::new();
            for op in [
                UnaryOp::Tanh,
                UnaryOp::Exp,
                UnaryOp::Sigmoid,
                UnaryOp::Relu,
                UnaryOp::Scale(1.5),
            ] {
                let mut o = vec![0.0; n];
                unary(op, &x, &mut o, 1);
                let mut d = vec![0.0; n];
                unary_grad(op, &x, &o, &y, &mut d, 1);
                outs.extend([o, d]);
            }
            for op in [
                BinaryOp::Add,
                BinaryOp::Mul,
                BinaryOp::Div,
                BinaryOp::Maximum,
            ] {
                let mut o = vec![0.0; n];
                let sh = [4, 37];
                binary(
                    op,
                    Operand::new(&x, &sh),
                    Operand::new(&y, &sh),
                    Operand::new(&mut o, &sh),
                    1,
                );
                outs.push(o);
            }
            for reduced in [[true, false], [false, true], [true, true]] {
                for op in [ReduceOp::Sum, ReduceOp::Max] {
                    let len = if reduced == [true, false] { 37 } else { 4 };
                    let mut o = vec![0.0; if reduced == [true, true] { 1 } else { len }];
                    reduce(op, &x, &[4, 37], &reduced, &mut o);
                    outs.push(o);
                }
            }
            for shape in [[4usize, 37], [37, 4]] {
                for log in [false, true] {
                    let mut o = vec![0.0; n];
                    softmax(&x, &shape, 1, log, &mut o);
                    let mut d = vec![0.0; n];
                    softmax_grad(&o, &y, &shape, 1, log, &mut d);
                    outs.extend([o, d]);
                }
            }
            outs.into_iter()
                .map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        let _levels = level_lock();
        let before = simd();
        set_simd(Simd::Baseline);
        let want = run();
        for level in [Simd::Avx2, Simd::Avx512] {
            if set_simd(level) == level {
                assert_eq!(run(), want, "{level:?}");
            }
        }
        set_simd(before);
    }
}
