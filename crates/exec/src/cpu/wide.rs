//! Running a loop compiled for the widest vector unit the CPU has.
//!
//! The crate is built for the baseline x86-64 target, where the compiler vectorises loops with
//! 4-lane SSE; AVX2 doubles the lanes and AVX-512 quadruples them. [`wide`] detects the features
//! at run time (std caches the answer) and calls its closure through a function compiled with
//! them, so the closure's loops, inlined there, use the wider registers — without a
//! `target-cpu` flag, which would make the library's users' binaries unportable. Miri and other
//! architectures call the closure directly.

/// Below this many elements a loop is too short for wider registers to repay the detour.
pub const WIDE_MIN_ELEMS: usize = 16;

/// Calls `f()` from a function compiled with AVX-512 or AVX2 enabled when the CPU has them and
/// the loop is long enough to gain (`len` elements, at least [`WIDE_MIN_ELEMS`]); otherwise
/// directly. `f` should hold the hot loop itself, with `#[inline]` helpers: what it calls across
/// a non-inlined boundary runs in the baseline build. Make it a `move` closure over copies of
/// its scalars, so that the loop reads them from registers rather than through the closure.
#[inline(always)]
pub fn wide<R>(len: usize, f: impl FnOnce() -> R) -> R {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if len >= WIDE_MIN_ELEMS {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: `with_avx512` is compiled with `avx512f` enabled, and the CPU reports it.
            return unsafe { with_avx512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `with_avx2` is compiled with `avx2` enabled, and the CPU reports it.
            return unsafe { with_avx2(f) };
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
