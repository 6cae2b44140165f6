//! Out-of-place matrix transposition.

/// Writes the transpose of `src` — `rows × cols`, row-major with row stride `ld` — into `dst`,
/// row-major `cols × rows`. Panics if `src` is shorter than `(rows − 1)·ld + cols` or `dst` than
/// `rows·cols` (an internal invariant: callers size both).
pub fn transpose<T: Copy>(src: &[T], rows: usize, cols: usize, ld: usize, dst: &mut [T]) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        ld >= cols && src.len() > (rows - 1) * ld + cols - 1 && dst.len() >= rows * cols,
        "invariant: transpose operand out of bounds"
    );
    // Square blocks, so that both the rows read and the rows written stay in cache.
    const B: usize = 32;
    for i0 in (0..rows).step_by(B) {
        for j0 in (0..cols).step_by(B) {
            for j in j0..(j0 + B).min(cols) {
                let out = &mut dst[j * rows..(j + 1) * rows];
                for i in i0..(i0 + B).min(rows) {
                    out[i] = src[i * ld + j];
                }
            }
        }
    }
}

/// [`transpose`] for `f32`, eight by eight in AVX registers where the CPU has AVX (the edges,
/// and CPUs without it, take the portable loop).
pub fn transpose_f32(src: &[f32], rows: usize, cols: usize, ld: usize, dst: &mut [f32]) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        ld >= cols && src.len() > (rows - 1) * ld + cols - 1 && dst.len() >= rows * cols,
        "invariant: transpose operand out of bounds"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if rows >= 8 && cols >= 8 && std::arch::is_x86_feature_detected!("avx") {
        let (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
        for i0 in (0..r8).step_by(8) {
            for j0 in (0..c8).step_by(8) {
                // SAFETY: the CPU reports AVX. The block's source rows i0..i0+8, columns
                // j0..j0+8 lie inside `src` (i0 + 7 < rows, j0 + 7 < cols ≤ ld, and `src` holds
                // (rows − 1)·ld + cols elements, checked above); its destination rows j0..j0+8,
                // columns i0..i0+8 lie inside `dst` (rows·cols elements, checked above).
                unsafe {
                    avx::transpose8x8(
                        src.as_ptr().add(i0 * ld + j0),
                        ld,
                        dst.as_mut_ptr().add(j0 * rows + i0),
                        rows,
                    )
                }
            }
        }
        // The ragged right columns (all rows) and bottom rows (the blocked columns).
        for j in c8..cols {
            for i in 0..rows {
                dst[j * rows + i] = src[i * ld + j];
            }
        }
        for j in 0..c8 {
            for i in r8..rows {
                dst[j * rows + i] = src[i * ld + j];
            }
        }
        return;
    }
    transpose(src, rows, cols, ld, dst)
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
pub(super) mod avx {
    use std::arch::x86_64::*;

    /// Transposes the 8×8 block at `src` (row stride `ls`) into `dst` (row stride `ld`).
    ///
    /// # Safety
    /// The CPU must have AVX; `src + i·ls + j` must be readable and `dst + j·ld + i` writable for
    /// all i, j in 0..8, and the two blocks must not overlap.
    #[target_feature(enable = "avx")]
    pub(in crate::cpu) unsafe fn transpose8x8(
        src: *const f32,
        ls: usize,
        dst: *mut f32,
        ld: usize,
    ) {
        // Each register holds a 4-column half row of row i (low lane) and of row i + 4 (high
        // lane), loaded straight into place: the lane crossing costs loads, not shuffles.
        let half = |i: usize, h: usize| {
            // SAFETY: rows 0..8, columns 0..8 of the source block are readable (the caller's
            // contract); this reads row i + (0 or 4), columns 4h..4h+4.
            unsafe {
                _mm256_insertf128_ps::<1>(
                    _mm256_castps128_ps256(_mm_loadu_ps(src.add(i * ls + 4 * h))),
                    _mm_loadu_ps(src.add((i + 4) * ls + 4 * h)),
                )
            }
        };
        for h in 0..2 {
            let (r0, r1, r2, r3) = (half(0, h), half(1, h), half(2, h), half(3, h));
            // Within each lane a 4×4 transpose: t0 = [r00 r10 r01 r11 | r40 r50 r41 r51], …
            let t0 = _mm256_unpacklo_ps(r0, r1);
            let t1 = _mm256_unpackhi_ps(r0, r1);
            let t2 = _mm256_unpacklo_ps(r2, r3);
            let t3 = _mm256_unpackhi_ps(r2, r3);
            // … then column 4h + c = [r0c r1c r2c r3c | r4c r5c r6c r7c].
            let cols = [
                _mm256_shuffle_ps::<0x44>(t0, t2),
                _mm256_shuffle_ps::<0xEE>(t0, t2),
                _mm256_shuffle_ps::<0x44>(t1, t3),
                _mm256_shuffle_ps::<0xEE>(t1, t3),
            ];
            for (c, v) in cols.into_iter().enumerate() {
                // SAFETY: rows 0..8 of the destination block are writable (the caller's
                // contract); this writes row 4h + c.
                unsafe { _mm256_storeu_ps(dst.add((4 * h + c) * ld), v) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape up to 19 × 19 (all the ragged edges around the 8×8 blocks), with a row stride
    /// wider than the row: both versions give the element-by-element transpose.
    #[test]
    fn transposes_match_the_definition() {
        let max = if cfg!(miri) { 10 } else { 19 };
        for rows in 0..=max {
            for cols in 0..=max {
                let ld = cols + 3;
                let src: Vec<f32> = (0..rows * ld).map(|i| i as f32).collect();
                let want: Vec<f32> = (0..rows * cols)
                    .map(|o| src[(o % rows.max(1)) * ld + o / rows.max(1)])
                    .collect();
                let mut got = vec![f32::NAN; rows * cols];
                transpose_f32(&src, rows, cols, ld, &mut got);
                assert_eq!(got, want, "f32 {rows}×{cols}");
                let mut got = vec![f32::NAN; rows * cols];
                transpose(&src, rows, cols, ld, &mut got);
                assert_eq!(got, want, "portable {rows}×{cols}");
            }
        }
    }
}
