//! A small GEMM for the recurrences' per-step products, in which every output is one chain of
//! fused multiply-adds over `k` in order, starting from zero.
//!
//! The per-step products of a recurrent layer are small (a few rows against a slice of the
//! recurrent weight) and run 2·T times a sequence. Their right operand is packed or laid out
//! once per sequence by the caller, so the kernel reads it as it is: no packing per call, which
//! is what a general GEMM would spend most of such a product on. Register tiles of `MR` rows by
//! `NR` columns accumulate a `k` loop of broadcasts and fused multiply-adds.
//!
//! Because each output is the same chain of roundings however the product is tiled, the
//! result has the same bits at every vector width (AVX-512, AVX2 with FMA, or the portable
//! build, where `mul_add` is a correctly rounded library call: slow, but the same numbers) and
//! however the rows or columns are divided between threads.

use super::matmul::Mnk;
use crate::Float;

/// `c[i·ldc + j] = Σ_kk a[i·lda + kk]·b[kk·ldb + j]` for `i < m`, `j < n`: each output a chain
/// of fused multiply-adds in `kk` order from zero (zero when `k` is 0). Each operand is a slice
/// with its row stride (`(a, lda)`, …). Panics if an operand does not hold its extent (an
/// internal invariant).
pub fn chain_gemm<T: Float>(
    dims: Mnk,
    (a, lda): (&[T], usize),
    (b, ldb): (&[T], usize),
    (c, ldc): (&mut [T], usize),
) {
    let Mnk { m, k, n } = dims;
    if m == 0 || n == 0 {
        return;
    }
    // The extent of `rows` rows of `width` at stride `ld`, or `None` when it overflows (so no
    // stride can wrap the checks below around).
    let extent = |rows: usize, ld: usize, width: usize| {
        (width <= ld).then_some(())?;
        (rows - 1).checked_mul(ld)?.checked_add(width)
    };
    assert!(
        extent(m, ldc, n).is_some_and(|e| c.len() >= e),
        "invariant: chain_gemm output out of bounds"
    );
    if k == 0 {
        for i in 0..m {
            c[i * ldc..i * ldc + n].fill(T::ZERO);
        }
        return;
    }
    assert!(
        extent(m, lda, k).is_some_and(|e| a.len() >= e)
            && extent(k, ldb, n).is_some_and(|e| b.len() >= e),
        "invariant: chain_gemm operand out of bounds"
    );
    let v = Views {
        m,
        k,
        n,
        a: a.as_ptr(),
        lda,
        b: b.as_ptr(),
        ldb,
        c: c.as_mut_ptr(),
        ldc,
    };
    let wide32 = std::mem::size_of::<T>() == 4;
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    match super::wide::simd() {
        super::wide::Simd::Avx512 => {
            // SAFETY: `v` satisfies `drive`'s contract (the extents were checked above against
            // the slices it points into, and `c` is a unique borrow that overlaps neither input);
            // the CPU has AVX-512F (`simd` never reports more than it has), which implies FMA.
            unsafe {
                if wide32 {
                    drive::<Avx512, T, 32, 64, 128, 128>(&v)
                } else {
                    drive::<Avx512, T, 16, 32, 64, 64>(&v)
                }
            };
            return;
        }
        super::wide::Simd::Avx2 if std::arch::is_x86_feature_detected!("fma") => {
            // SAFETY: as above; the CPU has AVX2 (`simd`) and FMA (detected just above).
            unsafe {
                if wide32 {
                    drive::<Avx2Fma, T, 8, 16, 32, 64>(&v)
                } else {
                    drive::<Avx2Fma, T, 4, 8, 16, 32>(&v)
                }
            };
            return;
        }
        _ => {}
    }
    // SAFETY: as above.
    unsafe {
        if wide32 {
            drive::<Portable, T, 8, 8, 16, 32>(&v)
        } else {
            drive::<Portable, T, 4, 4, 8, 16>(&v)
        }
    }
}

/// The operands of one [`chain_gemm`], as pointers and leading dimensions.
struct Views<T> {
    m: usize,
    k: usize,
    n: usize,
    a: *const T,
    lda: usize,
    b: *const T,
    ldb: usize,
    c: *mut T,
    ldc: usize,
}

/// How one build runs a [`tile`]: each tile is its own function, compiled with the build's
/// features, so that its accumulators get the whole register file.
trait Tiles {
    /// [`tile`], in this build.
    ///
    /// # Safety
    /// As [`tile`]; and the CPU must have the build's features.
    unsafe fn tile<T: Float, const MR: usize, const NR: usize>(
        v: &Views<T>,
        a: *const T,
        b: *const T,
        c: *mut T,
    );
}

macro_rules! tiles {
    ($(#[$m:meta])* $build:ident, $f:ident $(, $feature:literal)?) => {
        $(#[$m])*
        struct $build;

        $(#[$m])*
        $(#[target_feature(enable = $feature)])?
        #[inline(never)]
        unsafe fn $f<T: Float, const MR: usize, const NR: usize>(
            v: &Views<T>,
            a: *const T,
            b: *const T,
            c: *mut T,
        ) {
            // SAFETY: forwarded; the caller upholds `tile`'s contract.
            unsafe { tile::<T, MR, NR>(v, a, b, c) }
        }

        $(#[$m])*
        impl Tiles for $build {
            unsafe fn tile<T: Float, const MR: usize, const NR: usize>(
                v: &Views<T>,
                a: *const T,
                b: *const T,
                c: *mut T,
            ) {
                // SAFETY: forwarded; the caller upholds the contract, features included.
                unsafe { $f::<T, MR, NR>(v, a, b, c) }
            }
        }
    };
}

tiles!(
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    Avx512,
    tile_avx512,
    "avx512f"
);
tiles!(
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    Avx2Fma,
    tile_avx2,
    "avx2,fma"
);
tiles!(Portable, tile_portable);

/// Covers the `m × n` output with tiles: blocks of 8 rows by `N8` columns (each column tile
/// across all of them before the next, so that the tile's columns of `b`, k × N8, come from
/// memory once and from the nearest cache after), then the rows left in blocks of 4, 2 and 1 by
/// `N4`, `N2` and `N1` columns — each block reading `b` once, with accumulators enough in
/// flight to hide the multiply-add's latency. Columns left over go one at a time.
///
/// # Safety
/// `a` must be valid for reads at `i·lda + kk` (`i < m`, `kk < k`), `b` at `kk·ldb + j`, and
/// `c` for writes at `i·ldc + j` (`j < n`), with `c` overlapping neither input.
#[inline(always)]
unsafe fn drive<
    L: Tiles,
    T: Float,
    const N8: usize,
    const N4: usize,
    const N2: usize,
    const N1: usize,
>(
    v: &Views<T>,
) {
    let blocks = v.m / 8;
    let mut j = 0;
    while j + N8 <= v.n {
        for blk in 0..blocks {
            // SAFETY: rows 8·blk..8·blk+8 ≤ m and columns j..j+N8 ≤ n are inside the extents
            // the caller vouches for.
            unsafe { block::<L, T, 8, N8>(v, blk * 8, j) };
        }
        j += N8;
    }
    while j < v.n {
        for blk in 0..blocks {
            // SAFETY: as above, for one column.
            unsafe { block::<L, T, 8, 1>(v, blk * 8, j) };
        }
        j += 1;
    }
    let mut i = blocks * 8;
    if v.m - i >= 4 {
        // SAFETY: rows i..i+4 ≤ m (checked just above).
        unsafe { rows::<L, T, 4, N4>(v, i) };
        i += 4;
    }
    if v.m - i >= 2 {
        // SAFETY: rows i..i+2 ≤ m.
        unsafe { rows::<L, T, 2, N2>(v, i) };
        i += 2;
    }
    if v.m - i >= 1 {
        // SAFETY: row i < m.
        unsafe { rows::<L, T, 1, N1>(v, i) };
    }
}

/// The tile of rows `i..i + MR`, columns `j..j + NR`.
///
/// # Safety
/// As [`drive`], and the tile inside the `m × n` output.
#[inline(always)]
unsafe fn block<L: Tiles, T: Float, const MR: usize, const NR: usize>(
    v: &Views<T>,
    i: usize,
    j: usize,
) {
    let (a, b) = (v.a.wrapping_add(i * v.lda), v.b.wrapping_add(j));
    // SAFETY: the caller's contract; `c.add` stays inside the output.
    unsafe { L::tile::<T, MR, NR>(v, a, b, v.c.add(i * v.ldc + j)) };
}

/// Rows `i..i + MR` across all the columns, `NR` at a time and the rest one by one.
///
/// # Safety
/// As [`drive`], and `i + MR ≤ m`.
#[inline(always)]
unsafe fn rows<L: Tiles, T: Float, const MR: usize, const NR: usize>(v: &Views<T>, i: usize) {
    let mut j = 0;
    while j + NR <= v.n {
        // SAFETY: columns j..j+NR ≤ n of rows inside the output.
        unsafe { block::<L, T, MR, NR>(v, i, j) };
        j += NR;
    }
    while j < v.n {
        // SAFETY: column j < n.
        unsafe { block::<L, T, MR, 1>(v, i, j) };
        j += 1;
    }
}

/// One `MR × NR` tile: `MR` rows of `a` from `a`, the tile's columns of `b` from `b`, written
/// at `c` (row stride `ldc`).
///
/// # Safety
/// `a.add(r·lda + kk)` readable for `r < MR`, `kk < k`; `b.add(kk·ldb + j)` readable for
/// `j < NR`; `c.add(r·ldc + j)` writable and not aliasing either.
#[inline(always)]
unsafe fn tile<T: Float, const MR: usize, const NR: usize>(
    v: &Views<T>,
    a: *const T,
    b: *const T,
    c: *mut T,
) {
    // Scalars copied out of `v` and index loops over a local array, so that the accumulators
    // live in registers for the whole `k` loop.
    let (k, lda, ldb, ldc) = (v.k, v.lda, v.ldb, v.ldc);
    let mut acc = [[T::ZERO; NR]; MR];
    for kk in 0..k {
        let mut bv = [T::ZERO; NR];
        #[allow(clippy::needless_range_loop)]
        for j in 0..NR {
            // SAFETY: row kk < k of `b`, column j < NR (the caller's contract).
            bv[j] = unsafe { *b.add(kk * ldb + j) };
        }
        #[allow(clippy::needless_range_loop)]
        for r in 0..MR {
            // SAFETY: row r < MR of `a`, column kk < k.
            let av = unsafe { *a.add(r * lda + kk) };
            for j in 0..NR {
                acc[r][j] = av.mul_add(bv[j], acc[r][j]);
            }
        }
    }
    #[allow(clippy::needless_range_loop)]
    for r in 0..MR {
        for j in 0..NR {
            // SAFETY: row r < MR, column j < NR of the tile's output (the caller's contract).
            unsafe { *c.add(r * ldc + j) = acc[r][j] };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::wide::{set_simd, simd, simd_available, Simd};

    fn reference<T: Float>(
        m: usize,
        k: usize,
        n: usize,
        a: &[T],
        lda: usize,
        b: &[T],
        ldb: usize,
    ) -> Vec<T> {
        let mut c = vec![T::ZERO; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = T::ZERO;
                for kk in 0..k {
                    s = a[i * lda + kk].mul_add(b[kk * ldb + j], s);
                }
                c[i * n + j] = s;
            }
        }
        c
    }

    fn data<T: Float>(len: usize, seed: u64) -> Vec<T> {
        crate::cpu::test_data::values(len, seed, 1.0)
    }

    /// Every shape the tiling distinguishes (one and two rows, whole and partial row blocks,
    /// whole and ragged column tiles, strided operands) gives the reference's bits: each output
    /// one fused chain in k order. At every SIMD level this CPU has.
    fn same_bits_as_the_chain<T: Float>() {
        let shapes: &[(usize, usize, usize)] = if cfg!(miri) {
            &[(1, 5, 3), (3, 4, 17), (9, 2, 33)]
        } else {
            &[
                (1, 256, 128),
                (2, 7, 130),
                (3, 5, 33),
                (8, 256, 64),
                (13, 31, 97),
                (6, 9, 70),
                (7, 3, 129),
                (32, 64, 32),
                (1, 1, 1),
                (5, 0, 4),
            ]
        };
        let levels = [Simd::Baseline, Simd::Avx2, Simd::Avx512];
        for &(m, k, n) in shapes {
            let (lda, ldb, ldc) = (k + 3, n + 5, n + 2);
            let a = data::<T>(m * lda, 1);
            let b = data::<T>(k.max(1) * ldb, 2);
            let want = reference(m, k, n, &a, lda, &b, ldb);
            let _levels = crate::cpu::wide::level_lock();
            for level in levels.into_iter().filter(|&l| l <= simd_available()) {
                let before = simd();
                set_simd(level);
                let mut c = vec![T::from_f64(7.0); m * ldc];
                chain_gemm(Mnk::new(m, k, n), (&a, lda), (&b, ldb), (&mut c, ldc));
                set_simd(before);
                for i in 0..m {
                    for j in 0..n {
                        assert_eq!(
                            c[i * ldc + j].to_f64().to_bits(),
                            want[i * n + j].to_f64().to_bits(),
                            "{m}×{k}×{n} at ({i}, {j}), {level:?}"
                        );
                    }
                    // The padding between rows is not written.
                    for j in n..ldc.min(c.len() - i * ldc) {
                        assert_eq!(c[i * ldc + j].to_f64(), 7.0);
                    }
                }
            }
        }
    }

    #[test]
    fn f32_outputs_are_fused_chains() {
        same_bits_as_the_chain::<f32>();
    }

    #[test]
    fn f64_outputs_are_fused_chains() {
        same_bits_as_the_chain::<f64>();
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn a_stride_that_wraps_the_extent_is_refused() {
        // (m − 1)·ldc + n wraps to 1 in 64 bits: the check must not pass.
        let (a, b) = ([1.0f32; 3], [1.0f32; 1]);
        let mut c = [0.0f32; 1];
        chain_gemm(Mnk::new(3, 1, 1), (&a, 1), (&b, 1), (&mut c, 1 << 63));
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn a_short_operand_is_refused() {
        let a = [1.0f32; 3];
        let b = [1.0f32; 4];
        let mut c = [0.0f32; 4];
        chain_gemm(Mnk::new(2, 2, 2), (&a, 2), (&b, 2), (&mut c, 2));
    }
}
