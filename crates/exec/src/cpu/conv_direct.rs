//! Direct f32 convolution on AVX-512: each output position's patch read where it lies, in a
//! zero-padded copy of the image, with no patch matrix.
//!
//! [`super::patch_products`] writes each image's patch matrix (`k × l`, im2col) and multiplies
//! the weight by it. At a U-Net's lower levels (14×14 and 7×7 images of 64 channels) writing the
//! patches costs a fifth to a third of the product, and the product's tiles over a few dozen
//! positions run part empty. Here a register tile of `MR` output positions by 64 (or 32) output
//! channels accumulates, for each element of the patch in turn, the input value under it — read
//! through a table of offsets into the padded image — times a row of the weight packed `[k, o]`.
//! The channels lie side by side in the vector registers, so an image's positions cut into
//! tiles with only the last one short.
//!
//! Each output is one chain of fused multiply-adds over its patch in order from zero, and the
//! bias is added after it: the same bits on any number of threads, however the tiles fall.
//! Elsewhere (f64, other vector levels, Miri, fewer than 32 output channels) the callers keep
//! the patch-matrix product.

use super::conv::{ConvDims, Window};
use super::matmul::Gemm;
use crate::Float;

/// Output channels a tile covers at most (four AVX-512 registers of f32).
const WIDE: usize = 64;
/// Output channels a narrow tile covers (two registers): the packed weight's rows are padded to
/// a multiple of this.
const NARROW: usize = 32;

/// Whether [`conv_direct`] runs a convolution of `o` output channels in `T`: f32, AVX-512 in
/// force (see [`super::wide::simd`]), and at least a narrow tile's worth of channels (fewer would
/// leave most of each tile empty).
pub fn direct_applies<T: 'static>(o: usize) -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && o >= NARROW && avx512()
}

/// Whether the CPU has AVX-512F: what the kernels' `unsafe` needs. (Whether they run is
/// [`direct_applies`]' choice, made once per call from the level in force, which another
/// thread may change meanwhile through `set_simd`.)
fn cpu_has_avx512() -> bool {
    super::wide::simd_available() == super::wide::Simd::Avx512
}

/// Whether the AVX-512 build runs.
fn avx512() -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if super::wide::simd() == super::wide::Simd::Avx512 {
        return true;
    }
    false
}

/// `y_b = w·patches(x_b) + bias` for each image `b` of `x` (`[n, win.c, win.h, win.w]`) under
/// the window `win`, into `y` (`[n, o, l]`), `w` `[o, k]`, `bias` `[o]`: each output a chain of
/// fused multiply-adds over its patch in order from zero, then the bias added. The threads claim
/// images one at a time. Returns `false`, and writes nothing, where [`direct_applies`] does not hold.
pub fn conv_direct<T: Float>(
    x: &[T],
    win: &Window,
    w: &[T],
    bias: Option<&[T]>,
    d: ConvDims,
    y: &mut [T],
    threads: usize,
) -> bool {
    let ConvDims { o, k, l, n } = d;
    if !direct_applies::<T>(o) {
        return false;
    }
    // `T` is f32 (`direct_applies`): the same slices, typed.
    let (Some(x), Some(w), Some(y)) = (T::as_f32(x), T::as_f32(w), T::as_f32_mut(y)) else {
        return false;
    };
    let bias = bias.and_then(T::as_f32);
    let plane = win.c * win.h * win.w;
    assert!(
        win.out_hw().map(|(ho, wo)| ho * wo) == Some(l)
            && win.patch_len() == k
            && x.len() >= n * plane
            && w.len() >= o * k
            && y.len() >= n * o * l
            && bias.is_none_or(|b| b.len() >= o),
        "invariant: convolution operand out of bounds"
    );
    if n == 0 || l == 0 {
        return true;
    }
    if k == 0 {
        // Empty patches: each output is its bias.
        for (r, row) in y[..n * o * l].chunks_exact_mut(l).enumerate() {
            row.fill(bias.map_or(0.0, |b| b[r % o]));
        }
        return true;
    }
    // The weight packed `[k, op]`, its rows padded with zeros to whole narrow tiles.
    let op = o.div_ceil(NARROW) * NARROW;
    let mut packed = vec![0f32; k * op];
    for (j, row) in w[..o * k].chunks_exact(k).enumerate() {
        for (kk, &v) in row.iter().enumerate() {
            packed[kk * op + j] = v;
        }
    }
    let Some((g, scratch)) = geometry(win, l, op) else {
        return false;
    };
    let (koff, pos) = (g.patch_offsets(win), g.position_offsets(win));
    let y = &mut y[..n * o * l];
    let min = split_above(n, plane, o * l);
    super::par::par_rows_claimed(y, o * l, threads, min, |b, yb| {
        f32::with_scratch(scratch, |s| {
            let (xp, ct) = s.split_at_mut(g.len);
            g.pad(&x[b * plane..(b + 1) * plane], win, xp);
            let t = Tiles {
                x: xp,
                bases: &pos,
                steps: &koff,
                w: &packed,
                c: ct,
                ld: op,
            };
            t.run(false);
            // `ct` is `[l, op]`: each channel's row of the output from its column.
            f32::transpose(ct, l, o, op, yb);
            if let Some(bias) = bias {
                for (row, &bv) in yb.chunks_exact_mut(l).zip(bias) {
                    row.iter_mut().for_each(|v| *v += bv);
                }
            }
        })
    });
    true
}

/// A convolution's weight gradient `dw = Σ_b a_b·patches(x_b)ᵀ` (`a` `[n, o, l]` the output's
/// gradient, `x` `[n, win.c, win.h, win.w]`, `dw` `[o, k]`) without the patches: each weight's
/// sum one chain of fused multiply-adds over a block's images and their positions in order,
/// the blocks' sums (a number fixed by the batch, as [`super::patch_products`]' are) added in
/// block order. The threads claim blocks one at a time; the bits do not depend on which. Returns `false`, and
/// writes nothing, where [`direct_applies`] does not hold.
pub fn conv_weight_grad_direct<T: Float>(
    x: &[T],
    win: &Window,
    a: &[T],
    d: ConvDims,
    dw: &mut [T],
    threads: usize,
) -> bool {
    let ConvDims { o, k, l, n } = d;
    if !direct_applies::<T>(o) {
        return false;
    }
    let (Some(x), Some(a), Some(dw)) = (T::as_f32(x), T::as_f32(a), T::as_f32_mut(dw)) else {
        return false;
    };
    let plane = win.c * win.h * win.w;
    assert!(
        win.out_hw().map(|(ho, wo)| ho * wo) == Some(l)
            && win.patch_len() == k
            && x.len() >= n * plane
            && a.len() >= n * o * l
            && dw.len() >= o * k,
        "invariant: convolution operand out of bounds"
    );
    let dw = &mut dw[..o * k];
    if n == 0 || l == 0 || k == 0 {
        dw.fill(0.0);
        return true;
    }
    let op = o.div_ceil(NARROW) * NARROW;
    let per = n.div_ceil(super::conv::WEIGHT_GRAD_BLOCKS.min(n));
    let blocks = n.div_ceil(per);
    let Some((g, scratch)) = geometry(win, l, op) else {
        return false;
    };
    let (koff, pos) = (g.patch_offsets(win), g.position_offsets(win));
    // Each block's sum, `[k, op]`: the patch elements as the tiles' rows, the positions as
    // their steps, the output's gradient transposed (`[l, op]`) as the rows they take.
    let mut partials = vec![0f32; blocks * k * op];
    let min = split_above(n, plane, o * l);
    super::par::par_rows_claimed(&mut partials, k * op, threads, min, |blk, part| {
        f32::with_scratch(scratch, |s| {
            let (xp, at) = s.split_at_mut(g.len);
            if op != o {
                at.fill(0.0);
            }
            for b in blk * per..((blk + 1) * per).min(n) {
                g.pad(&x[b * plane..(b + 1) * plane], win, xp);
                let a_b = &a[b * o * l..(b + 1) * o * l];
                if op == o {
                    f32::transpose(a_b, o, l, l, at);
                } else {
                    for (j, row) in a_b.chunks_exact(l).enumerate() {
                        for (p, &v) in row.iter().enumerate() {
                            at[p * op + j] = v;
                        }
                    }
                }
                Tiles {
                    x: xp,
                    bases: &koff,
                    steps: &pos,
                    w: at,
                    c: part,
                    ld: op,
                }
                .run(b > blk * per);
            }
        })
    });
    let (sum, rest) = partials.split_at_mut(k * op);
    for p in rest.chunks_exact(k * op) {
        for (acc, &v) in sum.iter_mut().zip(p) {
            *acc += v;
        }
    }
    f32::transpose(sum, k, o, op, dw);
    true
}

/// The padded image's geometry and a thread's scratch (the padded image, then `l × op`), or
/// `None` where a size does not fit a `usize`.
fn geometry(win: &Window, l: usize, op: usize) -> Option<(PaddedGeometry, usize)> {
    let g = PaddedGeometry::of(win)?;
    let scratch = l.checked_mul(op)?.checked_add(g.len)?;
    Some((g, scratch))
}

/// The `min_elems` for [`super::par::par_rows_claimed`] that splits a batch of `n` images
/// (`plane` input and `out` output elements each) over threads where [`super::patch_products`]
/// would: at [`super::par::PAR_MIN_ELEMS`] elements read and written.
fn split_above(n: usize, plane: usize, out: usize) -> usize {
    if n.saturating_mul(plane.saturating_add(out)) >= super::par::PAR_MIN_ELEMS {
        0
    } else {
        usize::MAX
    }
}

/// A window's image padded with zeros: `[c, hp, wp]`, `len` elements.
struct PaddedGeometry {
    hp: usize,
    wp: usize,
    len: usize,
}

impl PaddedGeometry {
    /// The geometry, or `None` where the padded image's size does not fit a `usize` (the
    /// callers then decline: the patch path checks its own sizes).
    fn of(win: &Window) -> Option<Self> {
        let hp = win.ph.checked_mul(2)?.checked_add(win.h)?;
        let wp = win.pw.checked_mul(2)?.checked_add(win.w)?;
        let len = win.c.checked_mul(hp)?.checked_mul(wp)?;
        Some(PaddedGeometry { hp, wp, len })
    }

    /// Each patch element's offset in the padded image from its position's first element.
    fn patch_offsets(&self, win: &Window) -> Vec<usize> {
        let mut koff = Vec::with_capacity(win.patch_len());
        for ci in 0..win.c {
            for ky in 0..win.kh {
                for kx in 0..win.kw {
                    koff.push(ci * self.hp * self.wp + ky * win.dh * self.wp + kx * win.dw);
                }
            }
        }
        koff
    }

    /// Each output position's first element in the padded image.
    fn position_offsets(&self, win: &Window) -> Vec<usize> {
        let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
        (0..ho * wo)
            .map(|p| (p / wo) * win.sh * self.wp + (p % wo) * win.sw)
            .collect()
    }

    /// `xp` = the image `x` (`[c, h, w]`) with `ph` rows of zeros above and below and `pw`
    /// columns either side, each element written once: the rows above and below each plane
    /// cleared at once, then each image row copied and the `2·pw` zeros between it and the
    /// next (its right border, the next row's left) written in AVX-512 registers, masked at
    /// their ends. Rows of a small image are a few dozen elements, where `copy_from_slice` and
    /// `fill` called `memcpy` and `memset` for each (most of the time), and clearing the plane
    /// first wrote it twice.
    fn pad(&self, x: &[f32], win: &Window, xp: &mut [f32]) {
        let (h, w, wp, pw, ph) = (win.h, win.w, self.wp, win.pw, win.ph);
        if h == 0 || w == 0 {
            // All padding (a window wider than its empty image).
            xp.fill(0.0);
            return;
        }
        // Elements of `x` whose lines have been asked for: each plane's copy waited on its
        // reads from memory (a convolution's input is the batch's activation, megabytes), so
        // the lines PAD_AHEAD elements past each plane's end are asked for before it is copied.
        let mut asked = 0;
        for (p, (src, dst)) in x
            .chunks_exact(h * w)
            .zip(xp.chunks_exact_mut(self.hp * wp))
            .enumerate()
        {
            let want = ((p + 1) * h * w + PAD_AHEAD).min(x.len());
            while asked < want {
                super::wide::prefetch(x.as_ptr().wrapping_add(asked));
                asked += 16;
            }
            let (top, rest) = dst.split_at_mut(ph * wp + pw);
            top.fill(0.0);
            let (body, bottom) = rest.split_at_mut(h * wp - pw);
            bottom.fill(0.0);
            // `body` starts at the first row's first element: each row, then its gap.
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            {
                assert!(
                    cpu_has_avx512(),
                    "invariant: the direct convolution runs on AVX-512"
                );
                // SAFETY: `src` holds `h` rows of `w` and `body` `h·wp − pw` elements, which
                // `rows_with_gaps` writes exactly (`wp = w + 2·pw`); the CPU has AVX-512F.
                unsafe { rows_with_gaps(src, body, w, wp) };
            }
            #[cfg(not(all(target_arch = "x86_64", not(miri))))]
            for (row, out) in src.chunks_exact(w).zip(body.chunks_mut(wp)) {
                let (inside, gap) = out.split_at_mut(w);
                inside.copy_from_slice(row);
                gap.fill(0.0);
            }
        }
    }
}

/// How far past the plane it copies [`PaddedGeometry::pad`] asks for the image's lines, in f32
/// elements (8 KB). Padding 64 images of `[32, 28, 28]` from memory, in a probe: 1.10 → 0.57 ms
/// (4 KB ahead: 0.90; 16 KB: as 8); `[64, 14, 14]` 0.82 → 0.40 ms; `[64, 7, 7]` alike.
const PAD_AHEAD: usize = 2048;

/// `body[r·wp..][..w] = src[r·w..][..w]` and the `wp − w` elements after each such run (fewer
/// after the last: `body` ends at `h·wp − (wp − w)/2`) set to zero, for the `h` rows of `src`.
///
/// # Safety
/// `src.len() == h·w`, `body.len() == h·wp − (wp − w)/2` with `wp ≥ w` and `wp − w` even;
/// the CPU must have AVX-512F.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f")]
unsafe fn rows_with_gaps(src: &[f32], body: &mut [f32], w: usize, wp: usize) {
    use std::arch::x86_64::*;
    let (s, d) = (src.as_ptr(), body.as_mut_ptr());
    let len = body.len();
    for r in 0..src.len() / w {
        let (from, to) = (r * w, r * wp);
        let mut i = 0;
        while i < w {
            let m: __mmask16 = if w - i >= 16 { !0 } else { (1 << (w - i)) - 1 };
            // SAFETY: elements from + i.. of `src` and to + i.. of `body` under the mask lie
            // in row r (w elements), inside both (the caller's contract).
            unsafe {
                let v = _mm512_maskz_loadu_ps(m, s.add(from + i));
                _mm512_mask_storeu_ps(d.add(to + i), m, v);
            }
            i += 16;
        }
        // The gap: up to the next row's first element, or the end.
        let end = (to + wp).min(len);
        let mut j = to + w;
        while j < end {
            let m: __mmask16 = if end - j >= 16 {
                !0
            } else {
                (1 << (end - j)) - 1
            };
            // SAFETY: the masked elements j.. lie before `end` ≤ `body.len()`.
            unsafe { _mm512_mask_storeu_ps(d.add(j), m, _mm512_setzero_ps()) };
            j += 16;
        }
    }
}

/// One product of the padded image's elements: `c[r, j] (+)= Σ_s x[bases[r] + steps[s]] ·
/// w[s, j]` for every row `r` of `bases` and column `j < ld` (`c` and `w` of row stride `ld`, a
/// multiple of [`NARROW`]), each output one chain of fused multiply-adds over `s` in order.
/// A convolution's output: `bases` its positions, `steps` its patch.
struct Tiles<'a> {
    x: &'a [f32],
    bases: &'a [usize],
    steps: &'a [usize],
    w: &'a [f32],
    c: &'a mut [f32],
    ld: usize,
}

impl Tiles<'_> {
    /// Runs the product; `accumulate`: the chains continue from `c`'s values rather than zero.
    fn run(self, accumulate: bool) {
        let (rows, s) = (self.bases.len(), self.steps.len());
        let reach = |offsets: &[usize]| offsets.iter().copied().max().unwrap_or(0);
        assert!(
            self.ld.is_multiple_of(NARROW)
                && self.w.len() >= s * self.ld
                && self.c.len() >= rows * self.ld
                && (rows == 0
                    || s == 0
                    || reach(self.bases)
                        .checked_add(reach(self.steps))
                        .is_some_and(|e| e < self.x.len())),
            "invariant: direct convolution operand out of bounds"
        );
        if rows == 0 {
            return;
        }
        if s == 0 {
            // No steps: each chain is empty, its value zero (or `c`'s own).
            if !accumulate {
                self.c[..rows * self.ld].fill(0.0);
            }
            return;
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            assert!(
                cpu_has_avx512(),
                "invariant: the direct convolution runs on AVX-512"
            );
            let c = self.c.as_mut_ptr();
            let ops = Operands {
                x: self.x,
                bases: self.bases,
                steps: self.steps,
                w: self.w,
                ld: self.ld,
            };
            // SAFETY: every read `x[bases[r] + steps[s]]` is in bounds (the largest of each
            // table sums to less than `x.len()`, checked above), as are `w`'s rows `s` and
            // `c`'s rows `r` over `ld` columns; `c` comes from a unique borrow; the CPU has
            // AVX-512F (asserted just above).
            unsafe { drive(&ops, c, accumulate) };
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        let _ = accumulate;
    }
}

/// A [`Tiles`]' operands but its output.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[derive(Clone, Copy)]
struct Operands<'a> {
    x: &'a [f32],
    bases: &'a [usize],
    steps: &'a [usize],
    w: &'a [f32],
    ld: usize,
}

/// [`Tiles::run`] in blocks of steps whose rows of `w` fill about a third of the L1 cache (and,
/// in a convolution's output, whose patch elements' channels of the image about as much): each
/// block over every row before the next, the chains carried from one block to the next through
/// `c` (stored and loaded exactly, so the bits are a single chain's). In each block, channels
/// in wide tiles of 64, the rest (32) in a narrow one; rows in tiles of `MR`, the rest in tiles
/// of 4, 2 and 1.
///
/// # Safety
/// As [`Tiles::run`] checks, `c` its output (`bases.len()` rows of `ld`), borrowed uniquely;
/// the CPU must have AVX-512F.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f")]
unsafe fn drive(t: &Operands<'_>, c: *mut f32, accumulate: bool) {
    let block = (STEP_BLOCK_BYTES / (4 * t.ld)).max(8);
    let mut s0 = 0;
    while s0 < t.steps.len() {
        let s1 = (s0 + block).min(t.steps.len());
        let part = Operands {
            steps: &t.steps[s0..s1],
            w: &t.w[s0 * t.ld..],
            ..*t
        };
        let carry = accumulate || s0 > 0;
        let mut j0 = 0;
        while j0 + WIDE <= t.ld {
            // SAFETY: channels j0..j0+64 ≤ ld; the block's steps are some of the checked ones,
            // its rows of `w` the matching ones.
            unsafe { rows::<6, 4>(&part, c, j0, carry) };
            j0 += WIDE;
        }
        if j0 < t.ld {
            // SAFETY: as above; `ld` is a multiple of 32, so channels j0..j0+32 ≤ ld.
            unsafe { rows::<8, 2>(&part, c, j0, carry) };
        }
        s0 = s1;
    }
}

/// The bytes of `w`'s rows one block of steps reads.
const STEP_BLOCK_BYTES: usize = 16 << 10;

/// Rows in tiles of `MR` (the rest in tiles of 4, 2 and 1) by channels `j0..j0 + 16·NV`.
///
/// # Safety
/// As [`drive`], and `j0 + 16·NV ≤ ld`.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn rows<const MR: usize, const NV: usize>(
    t: &Operands<'_>,
    c: *mut f32,
    j0: usize,
    accumulate: bool,
) {
    let n = t.bases.len();
    let mut r = 0;
    while r + MR <= n {
        // SAFETY: rows r..r+MR ≤ n (the caller's contract for the channels).
        unsafe { tile::<MR, NV>(t, c, r, j0, accumulate) };
        r += MR;
    }
    for mr in [4, 2, 1] {
        if mr < MR && n - r >= mr {
            // SAFETY: as above, rows r..r+mr ≤ n.
            unsafe {
                match mr {
                    4 => tile::<4, NV>(t, c, r, j0, accumulate),
                    2 => tile::<2, NV>(t, c, r, j0, accumulate),
                    _ => tile::<1, NV>(t, c, r, j0, accumulate),
                }
            };
            r += mr;
        }
    }
}

/// Rows `r0..r0 + MR` by channels `j0..j0 + 16·NV`: for each step `s` in order, each row's
/// element `x[bases[r] + steps[s]]` times `w`'s row `s`, fused into accumulators that start at
/// zero (or at `c`'s values). `MR·NV` accumulators, `NV` registers of `w` and one broadcast:
/// at most 29 of the 32 registers, so that none spills.
///
/// # Safety
/// As [`drive`], for the tile's rows and channels.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const MR: usize, const NV: usize>(
    t: &Operands<'_>,
    c: *mut f32,
    r0: usize,
    j0: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    let ld = t.ld;
    let c = c.wrapping_add(r0 * ld + j0);
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    if accumulate {
        for (r, row) in acc.iter_mut().enumerate() {
            for (q, v) in row.iter_mut().enumerate() {
                // SAFETY: row r0 + r < rows, channels j0 + 16q..+16 ≤ ld of `c`.
                *v = unsafe { _mm512_loadu_ps(c.add(r * ld + 16 * q)) };
            }
        }
    }
    // Each row's base in the image: plain pointers, so that the loop's loads need no bounds
    // checks (the caller checked the largest base and step).
    let mut at = [t.x.as_ptr(); MR];
    for (r, a) in at.iter_mut().enumerate() {
        *a = t.x.as_ptr().wrapping_add(t.bases[r0 + r]);
    }
    let w = t.w.as_ptr().wrapping_add(j0);
    for (s, &off) in t.steps.iter().enumerate() {
        // SAFETY: `w`'s row s holds channels j0..j0+16·NV ≤ ld; each row's element at step s,
        // `x[bases[r] + steps[s]]`, is in bounds (the caller's contract).
        unsafe {
            let mut b = [_mm512_setzero_ps(); NV];
            for (q, bq) in b.iter_mut().enumerate() {
                *bq = _mm512_loadu_ps(w.add(s * ld + 16 * q));
            }
            for r in 0..MR {
                let a = _mm512_set1_ps(*at[r].add(off));
                for q in 0..NV {
                    acc[r][q] = _mm512_fmadd_ps(a, b[q], acc[r][q]);
                }
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (q, &v) in row.iter().enumerate() {
            // SAFETY: row r0 + r, channels j0 + 16q..+16 ≤ ld of `c`, borrowed uniquely.
            unsafe { _mm512_storeu_ps(c.add(r * ld + 16 * q), v) };
        }
    }
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    /// The windows the tests run: `(c, h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw))` — "same"
    /// 3×3, strided, dilated, padding wider than the kernel's reach, 1×1, a kernel as wide as
    /// the padded image, images too small for a whole tile of positions, and an empty image
    /// whose padding alone makes an output.
    /// `(c, h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw))`.
    type Shape = (
        usize,
        usize,
        usize,
        (usize, usize),
        (usize, usize),
        (usize, usize),
        (usize, usize),
    );

    const WINDOWS: [Shape; 9] = [
        (3, 7, 7, (3, 3), (1, 1), (1, 1), (1, 1)),
        (2, 9, 8, (3, 2), (2, 1), (0, 2), (1, 2)),
        (4, 5, 6, (1, 1), (1, 1), (0, 0), (1, 1)),
        (1, 7, 9, (2, 3), (3, 2), (2, 1), (2, 1)),
        (2, 8, 8, (4, 4), (2, 2), (1, 1), (1, 1)),
        (2, 6, 7, (3, 2), (1, 1), (4, 3), (2, 3)),
        (3, 2, 3, (4, 5), (1, 1), (1, 1), (1, 1)),
        (5, 1, 2, (1, 2), (1, 1), (0, 0), (1, 1)),
        (2, 0, 3, (1, 1), (1, 1), (1, 1), (1, 1)),
    ];

    fn window(i: usize) -> Window {
        let (c, h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw)) = WINDOWS[i];
        Window {
            c,
            h,
            w,
            kh,
            kw,
            sh,
            sw,
            ph,
            pw,
            dh,
            dw,
        }
    }

    fn data(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104729) % 1999) as f32 / 999.5 - 1.0) * 0.75)
            .collect()
    }

    /// The input element under patch element `kk` at output position `p`, or `None` in the
    /// padding: the definition, read from the unpadded image.
    fn under(win: &Window, x: &[f32], kk: usize, p: usize) -> Option<f32> {
        let (_, wo) = win.out_hw().unwrap();
        let (ci, ky, kx) = (kk / (win.kh * win.kw), kk / win.kw % win.kh, kk % win.kw);
        let iy = (p / wo * win.sh + ky * win.dh).checked_sub(win.ph)?;
        let ix = (p % wo * win.sw + kx * win.dw).checked_sub(win.pw)?;
        (iy < win.h && ix < win.w).then(|| x[(ci * win.h + iy) * win.w + ix])
    }

    /// The level lock (another test caps the level), or `None` where the CPU lacks AVX-512 —
    /// said on the output, as a skip.
    fn avx512_held() -> Option<std::sync::MutexGuard<'static, ()>> {
        let lock = super::super::wide::level_lock();
        if direct_applies::<f32>(NARROW) {
            return Some(lock);
        }
        crate::testing::skip("the direct convolution needs AVX-512, which this CPU lacks");
        None
    }

    /// `run(threads)` on one, two and three threads: the bits must not depend on them.
    fn on_threads(what: &str, run: impl Fn(usize) -> Vec<f32>) -> Vec<f32> {
        let one = run(1);
        for threads in [2, 3] {
            let again = run(threads);
            let same = again
                .iter()
                .zip(&one)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{what}: the bits on {threads} threads differ from one's"
            );
        }
        one
    }

    /// Each output against the definition summed in f64, within f32 rounding of the sum of the
    /// terms' magnitudes; the same bits on one, two and three threads. Output channel counts
    /// that fill whole wide tiles, leave a narrow one, and pad the last.
    #[test]
    fn outputs_are_the_definition() {
        let Some(_levels) = avx512_held() else {
            return;
        };
        for wi in 0..WINDOWS.len() {
            let win = window(wi);
            let (ho, wo) = win.out_hw().unwrap();
            let (k, l) = (win.patch_len(), ho * wo);
            for (o, n, with_bias) in [
                (32, 1, false),
                (64, 3, true),
                (40, 2, true),
                (130, 2, false),
            ] {
                let plane = win.c * win.h * win.w;
                let x = data(n * plane, wi);
                let w = data(o * k, wi + 1);
                let bias = data(o, wi + 2);
                let bias = with_bias.then_some(&bias[..]);
                let d = ConvDims { o, k, l, n };
                let got = on_threads(&format!("window {wi}, o {o}"), |threads| {
                    let mut y = vec![f32::NAN; n * o * l];
                    assert!(conv_direct(&x, &win, &w, bias, d, &mut y, threads));
                    y
                });
                for b in 0..n {
                    for j in 0..o {
                        for p in 0..l {
                            let (mut sum, mut mag) = (bias.map_or(0.0, |bv| bv[j] as f64), 0.0);
                            for kk in 0..k {
                                if let Some(v) = under(&win, &x[b * plane..], kk, p) {
                                    let t = v as f64 * w[j * k + kk] as f64;
                                    sum += t;
                                    mag += t.abs();
                                }
                            }
                            let got = got[(b * o + j) * l + p] as f64;
                            let tol = 1e-6 * (mag + sum.abs()) + 1e-30;
                            assert!(
                                (got - sum).abs() <= tol,
                                "window {wi}, o {o}, image {b}, channel {j}, position {p}: {got} vs {sum}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The weight gradient against the definition (`Σ_b Σ_p a[b, j, p]·x_b under kk at p`) in
    /// f64; the same bits on one, two and three threads, with batches of one image, fewer than
    /// the blocks, and more.
    #[test]
    fn weight_gradients_are_the_definition() {
        let Some(_levels) = avx512_held() else {
            return;
        };
        for wi in 0..WINDOWS.len() {
            let win = window(wi);
            let (ho, wo) = win.out_hw().unwrap();
            let (k, l) = (win.patch_len(), ho * wo);
            for (o, n) in [(32, 1), (64, 5), (40, 17), (130, 3)] {
                let plane = win.c * win.h * win.w;
                let x = data(n * plane, wi + 3);
                let a = data(n * o * l, wi + 4);
                let d = ConvDims { o, k, l, n };
                let got = on_threads(&format!("window {wi}, o {o}, n {n}"), |threads| {
                    let mut dw = vec![f32::NAN; o * k];
                    assert!(conv_weight_grad_direct(&x, &win, &a, d, &mut dw, threads));
                    dw
                });
                for j in 0..o {
                    for kk in 0..k {
                        let (mut sum, mut mag) = (0.0f64, 0.0f64);
                        for b in 0..n {
                            for p in 0..l {
                                if let Some(v) = under(&win, &x[b * plane..], kk, p) {
                                    let t = v as f64 * a[(b * o + j) * l + p] as f64;
                                    sum += t;
                                    mag += t.abs();
                                }
                            }
                        }
                        let got = got[j * k + kk] as f64;
                        let tol = 1e-6 * (mag + sum.abs()) + 1e-30;
                        assert!(
                            (got - sum).abs() <= tol,
                            "window {wi}, o {o}, n {n}, weight ({j}, {kk}): {got} vs {sum}"
                        );
                    }
                }
            }
        }
    }

    /// A window over no input channels: every output is its channel's bias (zero without one),
    /// and the weight's gradient is empty.
    #[test]
    fn empty_patches_give_the_bias() {
        let Some(_levels) = avx512_held() else {
            return;
        };
        let win = Window { c: 0, ..window(0) };
        let (ho, wo) = win.out_hw().unwrap();
        let (o, n, l) = (33, 2, ho * wo);
        let d = ConvDims { o, k: 0, l, n };
        let bias = data(o, 5);
        for b in [Some(&bias[..]), None] {
            let mut y = vec![f32::NAN; n * o * l];
            assert!(conv_direct(&[], &win, &[], b, d, &mut y, 2));
            for (r, row) in y.chunks_exact(l).enumerate() {
                let want = b.map_or(0.0, |b| b[r % o]);
                assert!(row.iter().all(|&v| v == want), "row {r}");
            }
        }
        let mut dw: Vec<f32> = Vec::new();
        assert!(conv_weight_grad_direct(
            &[],
            &win,
            &data(n * o * l, 6),
            d,
            &mut dw,
            2
        ));
    }

    /// Fewer output channels than a narrow tile, f64, and a level capped below AVX-512: not run
    /// here (`false`, the output untouched), so the callers keep the patch-matrix product.
    #[test]
    fn declines_what_it_does_not_run() {
        let win = window(0);
        let (ho, wo) = win.out_hw().unwrap();
        let (k, l) = (win.patch_len(), ho * wo);
        let d = ConvDims { o: 31, k, l, n: 1 };
        let x = data(win.c * win.h * win.w, 0);
        let mut y = vec![7.0f32; 31 * l];
        assert!(!conv_direct(&x, &win, &data(31 * k, 1), None, d, &mut y, 1));
        assert!(y.iter().all(|&v| v == 7.0));
        let d64 = ConvDims { o: 32, ..d };
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let mut y64 = vec![7.0f64; 32 * l];
        assert!(!conv_direct(
            &x64,
            &win,
            &vec![0.5; 32 * k],
            None,
            d64,
            &mut y64,
            1
        ));
        assert!(y64.iter().all(|&v| v == 7.0));
        use super::super::wide::{level_lock, set_simd, simd, Simd};
        let _levels = level_lock();
        let before = simd();
        set_simd(Simd::Avx2);
        let mut y = vec![7.0f32; 32 * l];
        let ran = conv_direct(&x, &win, &data(32 * k, 1), None, d64, &mut y, 1);
        set_simd(before);
        assert!(!ran && y.iter().all(|&v| v == 7.0));
    }
}
