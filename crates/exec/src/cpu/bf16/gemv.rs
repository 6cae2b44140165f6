//! A few rows of bf16 against a bf16 matrix read where it lies (batch-1 generation, where each
//! token reads every weight once): `vdpbf16ps` on the matrix's own layout, nothing packed.
//!
//! The products are the module's definition, pair after pair along `k` for each output, so the
//! bits are those of every other path. Row-major `b` (a weight kept `[in, out]`): rows `2p` and
//! `2p + 1` interleaved into pairs in registers, sixteen columns per register in a fixed order
//! of their own, put back in order once at the end. Transposed `b` (a linear layer's `[out, in]`
//! weight, a tied output layer): sixteen columns' runs of sixteen pairs transposed in registers,
//! so that each lane carries one column's accumulator. Threads take blocks of columns.

use half::bf16;

use super::super::matmul::{MatView, Mnk};
use super::{column_parts, columns_back, pair, Bf16Kernel};

/// The most rows of `a` this path takes (each row's outputs are separate accumulators against
/// the same reads of `b`).
pub(super) const MAX_M: usize = 4;

/// Columns in a block of the row-major kernel (32 bf16 of a row: one 512-bit load).
const ROW_BLOCK: usize = 32;
/// Columns in a block of the transposed kernel (one register of accumulators).
const COL_BLOCK: usize = 16;
/// `k · n` from which the columns are split across threads.
const PAR_MIN: usize = 1 << 16;

/// Whether [`gemv`] computes this product: the `vdpbf16ps` kernel, at most [`MAX_M`] rows of
/// a `k`-contiguous `a`, and `b` row-major or transposed.
pub(super) fn takes(
    kernel: Bf16Kernel,
    dims: Mnk,
    a: &MatView<'_, bf16>,
    b: &MatView<'_, bf16>,
) -> bool {
    let Mnk { m, k, n } = dims;
    // `available` is false off x86-64 and under Miri.
    kernel == Bf16Kernel::Avx512Bf16
        && kernel.available()
        && (1..=MAX_M).contains(&m)
        && k > 0
        && n > 0
        && a.cs == 1
        && (b.cs == 1 || b.rs == 1)
}

/// `c[..m×n] (+)= a · b` where [`takes`] holds, on up to `threads` threads.
pub(super) fn gemv(
    dims: Mnk,
    a: MatView<'_, bf16>,
    b: MatView<'_, bf16>,
    c: &mut [f32],
    accumulate: bool,
    threads: usize,
) {
    let Mnk { m, k, n } = dims;
    assert!(a.fits(m, k) && b.fits(k, n) && c.len() >= m * n);
    let k2 = k.div_ceil(2);
    // Each row's pairs, the last padded with a zero where `k` is odd.
    let zero = bf16::from_bits(0);
    let apairs: Vec<u32> = (0..m)
        .flat_map(|i| {
            let row = &a.data[a.offset + i * a.rs..][..k];
            (0..k2).map(move |p| pair(row[2 * p], row.get(2 * p + 1).copied().unwrap_or(zero)))
        })
        .collect();
    let row_major = b.cs == 1;
    let block = if row_major { ROW_BLOCK } else { COL_BLOCK };
    let t = if threads > 1 && k * n >= PAR_MIN {
        threads.min(n.div_ceil(block))
    } else {
        1
    };
    let per = n.div_ceil(t).div_ceil(block) * block;
    // Each thread's columns go to a buffer of its own (m × its columns), copied into `c` after.
    let mut parts = column_parts(c, (m, n), per, accumulate);
    let run = |p: usize, part: &mut Vec<f32>| {
        let (j0, w) = (p * per, part.len() / m);
        let cols = MatView {
            offset: b.offset + j0 * b.cs,
            ..b
        };
        if row_major {
            rows_part(m, k, &apairs, cols, w, part, accumulate);
        } else {
            columns_part(m, k, &apairs, cols, w, part);
        }
    };
    if parts.len() == 1 {
        run(0, &mut parts[0]);
    } else {
        super::super::thread_pool::for_each_owned(parts.iter_mut().collect(), |p, part| {
            run(p, part)
        });
    }
    columns_back(&parts, c, (m, n), per);
}

/// Where the row-major kernel keeps column `l` of a block of [`ROW_BLOCK`]: interleaving two
/// rows' 32 values (`vpunpcklwd` / `vpunpckhwd`) works within 128-bit lanes, so the first
/// register holds columns 0–3, 8–11, 16–19, 24–27 and the second the others.
fn slot(l: usize) -> usize {
    let (lane, within) = (l / 8, l % 8);
    if within < 4 {
        4 * lane + within
    } else {
        16 + 4 * lane + within - 4
    }
}

/// Columns `0..w` of the row-major `b` (their first at `b.offset`): `out` (m × w) holds the
/// starting accumulators when `load`.
fn rows_part(
    m: usize,
    k: usize,
    apairs: &[u32],
    b: MatView<'_, bf16>,
    w: usize,
    out: &mut [f32],
    load: bool,
) {
    let blocks = w.div_ceil(ROW_BLOCK);
    // The accumulators in the kernel's order (block after block of ROW_BLOCK slots), each row's
    // after the other's.
    let mut acc = vec![0f32; m * blocks * ROW_BLOCK];
    if load {
        for i in 0..m {
            for j in 0..w {
                acc[(i * blocks + j / ROW_BLOCK) * ROW_BLOCK + slot(j % ROW_BLOCK)] =
                    out[i * w + j];
            }
        }
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `takes` admitted this path only where `available` found AVX-512 F, BW and BF16;
    // the kernel checks its slices' extents against `b`, `k` and `w`.
    unsafe {
        x86::rows(m, k, apairs, b, w, &mut acc)
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    unreachable!("`takes` admits this path only on x86-64 with AVX-512 BF16");
    for i in 0..m {
        for j in 0..w {
            out[i * w + j] = acc[(i * blocks + j / ROW_BLOCK) * ROW_BLOCK + slot(j % ROW_BLOCK)];
        }
    }
}

/// Columns `0..w` of the transposed `b` (column `j`'s `k` values from `b.offset + j·b.cs`):
/// `out` (m × w) holds the starting accumulators (zeros when not accumulating).
fn columns_part(
    m: usize,
    k: usize,
    apairs: &[u32],
    b: MatView<'_, bf16>,
    w: usize,
    out: &mut [f32],
) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: as in `rows_part`.
    unsafe {
        x86::columns(m, k, apairs, b, w, out)
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    unreachable!("`takes` admits this path only on x86-64 with AVX-512 BF16");
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;

    use half::bf16;

    use super::{MatView, COL_BLOCK, MAX_M, ROW_BLOCK};

    /// How far ahead the row-major kernel asks for its rows: sixteen rows (eight pairs) below
    /// the ones it reads (measured on the reference machine against 0, 8 and 32: without it a
    /// thread's short runs of each row leave the hardware's prefetcher behind).
    const AHEAD_ROWS: usize = 16;
    /// How far ahead (in values) the transposed kernel asks for each column's next values
    /// (measured against 0, 128 and 512).
    const AHEAD_VALUES: usize = 256;

    /// A mask of the first `n` of 32 lanes.
    fn first(n: usize) -> u32 {
        if n >= 32 {
            u32::MAX
        } else {
            (1u32 << n) - 1
        }
    }

    /// The row-major kernel: for each pair of `k`, rows `2p` and `2p + 1` of the `w` columns
    /// interleaved into pairs and taken by every row's accumulators (`acc`: row after row of
    /// `w.div_ceil(32)` blocks of 32 slots, in the order of [`super::slot`]). Two pairs (four rows
    /// of `b`) at a time across all the columns, so that the rows stream in order.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) fn rows(
        m: usize,
        k: usize,
        apairs: &[u32],
        b: MatView<'_, bf16>,
        w: usize,
        acc: &mut [f32],
    ) {
        let k2 = k.div_ceil(2);
        let blocks = w.div_ceil(ROW_BLOCK);
        assert!(m <= MAX_M && apairs.len() >= m * k2 && acc.len() >= m * blocks * ROW_BLOCK);
        assert!(k >= 1 && b.offset + (k - 1) * b.rs + w <= b.data.len());
        let base = b.data.as_ptr();
        let row_at = |r: usize| base.wrapping_add(b.offset + r * b.rs).cast::<i16>();
        let last = first(w - (blocks - 1) * ROW_BLOCK);
        let ap = apairs.as_ptr();
        let out = acc.as_mut_ptr();
        let mut p = 0;
        while p < k2 {
            let pairs = (k2 - p).min(2);
            for q in 0..blocks {
                let mask = if q + 1 == blocks { last } else { u32::MAX };
                // SAFETY: rows 2p..2p + 2·pairs (the odd row of a last pair only when it is < k)
                // exist (the assertion), and the masked loads read columns q·32.. below `w`
                // only; `acc` holds m × blocks × 32 slots; `apairs` m × k2 pairs.
                unsafe {
                    for r in 2 * p + AHEAD_ROWS..(2 * p + AHEAD_ROWS + 2 * pairs).min(k) {
                        _mm_prefetch::<_MM_HINT_T0>(row_at(r).wrapping_add(q * ROW_BLOCK).cast());
                    }
                    let mut bv = [_mm512_setzero_si512(); 4];
                    for s in 0..pairs {
                        let r = 2 * (p + s);
                        let even = _mm512_maskz_loadu_epi16(mask, row_at(r).add(q * ROW_BLOCK));
                        let odd = if r + 1 < k {
                            _mm512_maskz_loadu_epi16(mask, row_at(r + 1).add(q * ROW_BLOCK))
                        } else {
                            _mm512_setzero_si512()
                        };
                        bv[2 * s] = _mm512_unpacklo_epi16(even, odd);
                        bv[2 * s + 1] = _mm512_unpackhi_epi16(even, odd);
                    }
                    for i in 0..m {
                        let o = out.add((i * blocks + q) * ROW_BLOCK);
                        let (mut lo, mut hi) = (_mm512_loadu_ps(o), _mm512_loadu_ps(o.add(16)));
                        for s in 0..pairs {
                            let two = *ap.add(i * k2 + p + s);
                            let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(two as i32));
                            lo = _mm512_dpbf16_ps(
                                lo,
                                av,
                                std::mem::transmute::<__m512i, __m512bh>(bv[2 * s]),
                            );
                            hi = _mm512_dpbf16_ps(
                                hi,
                                av,
                                std::mem::transmute::<__m512i, __m512bh>(bv[2 * s + 1]),
                            );
                        }
                        _mm512_storeu_ps(o, lo);
                        _mm512_storeu_ps(o.add(16), hi);
                    }
                }
            }
            p += pairs;
        }
    }

    /// The transposed kernel: blocks of 16 columns, each column's `k` values contiguous; runs
    /// of 16 pairs of the 16 columns transposed in registers (lane `j` of register `t`: column
    /// `j`'s pair `t`), taken in order by every row's register of 16 accumulators. `out`
    /// (m × w) holds the starting accumulators.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) fn columns(
        m: usize,
        k: usize,
        apairs: &[u32],
        b: MatView<'_, bf16>,
        w: usize,
        out: &mut [f32],
    ) {
        match m {
            1 => columns_m::<1>(k, apairs, b, w, out),
            2 => columns_m::<2>(k, apairs, b, w, out),
            3 => columns_m::<3>(k, apairs, b, w, out),
            _ => columns_m::<MAX_M>(k, apairs, b, w, out),
        }
    }

    /// [`columns`] for `M` rows, their accumulators in registers.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn columns_m<const M: usize>(
        k: usize,
        apairs: &[u32],
        b: MatView<'_, bf16>,
        w: usize,
        out: &mut [f32],
    ) {
        let k2 = k.div_ceil(2);
        assert!(M <= MAX_M && apairs.len() >= M * k2 && out.len() >= M * w);
        assert!(w >= 1 && b.offset + (w - 1) * b.cs + k <= b.data.len());
        let base = b.data.as_ptr();
        let ap = apairs.as_ptr();
        let o = out.as_mut_ptr();
        let mut j0 = 0;
        while j0 < w {
            let cols = (w - j0).min(COL_BLOCK);
            let cmask = ((1u32 << cols) - 1) as u16;
            let mut acc = [_mm512_setzero_ps(); M];
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: row i's columns j0..j0 + cols lie within `out` (M × w).
                *a = unsafe { _mm512_maskz_loadu_ps(cmask, o.add(i * w + j0)) };
            }
            let first_col = base.wrapping_add(b.offset + j0 * b.cs);
            let mut p0 = 0;
            while p0 < k2 {
                let pairs = (k2 - p0).min(16);
                let vmask = first(k - 2 * p0);
                // Near a column's end, the same column of the next block is asked for.
                let ahead = 2 * p0 + AHEAD_VALUES;
                let ahead = if ahead < k {
                    ahead
                } else {
                    COL_BLOCK * b.cs + ahead - k
                };
                let mut r = [_mm512_setzero_si512(); 16];
                for (c, x) in r.iter_mut().enumerate().take(cols) {
                    let at = first_col.wrapping_add(c * b.cs + 2 * p0);
                    crate::cpu::wide::prefetch(first_col.wrapping_add(c * b.cs + ahead));
                    // SAFETY: column j0 + c (c < cols) has k values from offset + (j0 + c)·cs
                    // (the assertion); the masked load reads values 2·p0.. below k only.
                    *x = unsafe { _mm512_maskz_loadu_epi16(vmask, at.cast::<i16>()) };
                }
                let v = transpose16(r);
                if pairs == 16 {
                    for (t, &vt) in v.iter().enumerate() {
                        // SAFETY: pair p0 + t < k2 of each row < M, within `apairs`.
                        unsafe { take_pair(&mut acc, vt, ap.add(p0 + t), k2) };
                    }
                } else {
                    for (t, &vt) in v.iter().enumerate().take(pairs) {
                        // SAFETY: as above.
                        unsafe { take_pair(&mut acc, vt, ap.add(p0 + t), k2) };
                    }
                }
                p0 += pairs;
            }
            for (i, a) in acc.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm512_mask_storeu_ps(o.add(i * w + j0), cmask, *a) };
            }
            j0 += cols;
        }
    }

    /// One pair of `k` into every row's accumulators: row `i`'s pair is at `ap + i·k2`.
    ///
    /// # Safety
    /// `ap + i·k2` is readable for every `i < M`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn take_pair<const M: usize>(
        acc: &mut [__m512; M],
        bt: __m512i,
        ap: *const u32,
        k2: usize,
    ) {
        // SAFETY: same-size reinterpretations of register types.
        let bt: __m512bh = unsafe { std::mem::transmute(bt) };
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's.
            let two = unsafe { *ap.add(i * k2) };
            // SAFETY: a same-size reinterpretation of a register type.
            let av: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(two as i32)) };
            *a = _mm512_dpbf16_ps(*a, av, bt);
        }
    }

    /// A 16 × 16 transposition of 32-bit elements: lane `j` of the result's register `t` is
    /// lane `t` of `r[j]`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
        // Within 128-bit lanes: 2×2 blocks of dwords, then of qwords.
        let mut t = [_mm512_setzero_si512(); 16];
        for x in 0..8 {
            t[2 * x] = _mm512_unpacklo_epi32(r[2 * x], r[2 * x + 1]);
            t[2 * x + 1] = _mm512_unpackhi_epi32(r[2 * x], r[2 * x + 1]);
        }
        let mut u = [_mm512_setzero_si512(); 16];
        for g in 0..4 {
            for h in 0..2 {
                let (a, b) = (t[4 * g + h], t[4 * g + h + 2]);
                u[4 * g + 2 * h] = _mm512_unpacklo_epi64(a, b);
                u[4 * g + 2 * h + 1] = _mm512_unpackhi_epi64(a, b);
            }
        }
        // Lane L of u[4g + j] holds element 4L + j of rows 4g..4g + 4; gather the four groups'
        // lanes L into the result's register 4L + j.
        let mut out = [_mm512_setzero_si512(); 16];
        for j in 0..4 {
            let x0 = _mm512_shuffle_i32x4::<0x44>(u[j], u[4 + j]);
            let x1 = _mm512_shuffle_i32x4::<0xEE>(u[j], u[4 + j]);
            let y0 = _mm512_shuffle_i32x4::<0x44>(u[8 + j], u[12 + j]);
            let y1 = _mm512_shuffle_i32x4::<0xEE>(u[8 + j], u[12 + j]);
            out[j] = _mm512_shuffle_i32x4::<0x88>(x0, y0);
            out[4 + j] = _mm512_shuffle_i32x4::<0xDD>(x0, y0);
            out[8 + j] = _mm512_shuffle_i32x4::<0x88>(x1, y1);
            out[12 + j] = _mm512_shuffle_i32x4::<0xDD>(x1, y1);
        }
        out
    }
}
