//! im2col and col2im: the patch layout that turns a 2-D convolution into one GEMM per image.

use super::cast::Storage;
use super::Gemm;
use crate::Float;

/// The geometry of a 2-D sliding window over `[channels, h, w]` images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// Channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Vertical stride.
    pub sh: usize,
    /// Horizontal stride.
    pub sw: usize,
    /// Vertical zero padding (each side).
    pub ph: usize,
    /// Horizontal zero padding (each side).
    pub pw: usize,
    /// Vertical dilation.
    pub dh: usize,
    /// Horizontal dilation.
    pub dw: usize,
}

impl Window {
    /// Output height and width, or `None` when the (dilated) kernel does not fit the padded input,
    /// a stride/dilation/kernel extent is zero, or any of the window's arithmetic (the dilated
    /// kernel, the padded input, the patch length `c·kh·kw`, an input offset as `isize`)
    /// overflows — every later index computation stays within these bounds.
    pub fn out_hw(&self) -> Option<(usize, usize)> {
        if self.sh == 0
            || self.sw == 0
            || self.dh == 0
            || self.dw == 0
            || self.kh == 0
            || self.kw == 0
        {
            return None;
        }
        let eh = self.dh.checked_mul(self.kh - 1)?.checked_add(1)?;
        let ew = self.dw.checked_mul(self.kw - 1)?.checked_add(1)?;
        let hp = self.h.checked_add(self.ph.checked_mul(2)?)?;
        let wp = self.w.checked_add(self.pw.checked_mul(2)?)?;
        if hp < eh || wp < ew {
            return None;
        }
        // Offsets are computed as `isize` (padding makes them negative), and the patch matrix
        // has `c·kh·kw` rows.
        let limit = isize::MAX as usize;
        if hp > limit || wp > limit {
            return None;
        }
        self.c.checked_mul(self.kh)?.checked_mul(self.kw)?;
        Some(((hp - eh) / self.sh + 1, (wp - ew) / self.sw + 1))
    }

    /// Rows of the patch matrix: `c · kh · kw`.
    pub fn patch_len(&self) -> usize {
        self.c * self.kh * self.kw
    }

    /// For each kernel tap and output position, the input offset it reads (or `None` in padding):
    /// calls `f(row, col, Some(input_index))`. The definition, element by element: the tests'
    /// reference for the runs the kernels walk.
    #[cfg(test)]
    fn for_each(&self, mut f: impl FnMut(usize, usize, Option<usize>)) {
        let (ho, wo) = self.out_hw().expect("invariant: window checked before use");
        for c in 0..self.c {
            for ki in 0..self.kh {
                for kj in 0..self.kw {
                    let row = (c * self.kh + ki) * self.kw + kj;
                    for oh in 0..ho {
                        let ih = (oh * self.sh + ki * self.dh) as isize - self.ph as isize;
                        for ow in 0..wo {
                            let iw = (ow * self.sw + kj * self.dw) as isize - self.pw as isize;
                            let inside = ih >= 0
                                && (ih as usize) < self.h
                                && iw >= 0
                                && (iw as usize) < self.w;
                            let src =
                                inside.then(|| (c * self.h + ih as usize) * self.w + iw as usize);
                            f(row, oh * wo + ow, src);
                        }
                    }
                }
            }
        }
    }
}

/// `cols[row, col]` (`patch_len × ho·wo`, row-major) = the input value under kernel tap `row` at
/// output position `col`, `pad` in the padding. One image.
pub fn im2col<T: Copy>(x: &[T], win: &Window, pad: T, cols: &mut [T]) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    im2col_ld(x, win, pad, cols, ho * wo, 0);
}

/// [`im2col`] into a wider matrix: row `r` of the patch matrix starts at `off + r·ld`.
fn im2col_ld<T: Copy>(x: &[T], win: &Window, pad: T, cols: &mut [T], ld: usize, off: usize) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    if let Some(p) = Phases::of(win) {
        // A horizontal stride: the image split into its phases first, where every tap reads
        // runs of one plane at stride 1.
        let mut planes = vec![pad; p.len];
        p.split(x, win, &mut planes);
        p.for_each_tap(win, ho, wo, |t| {
            copy_tap(&planes, pad, &mut cols[off..], ld, (ho, wo), t)
        });
        return;
    }
    for_each_tap(win, ho, wo, |t| {
        copy_tap(x, pad, &mut cols[off..], ld, (ho, wo), t)
    });
}

/// One tap's row of the patch matrix (row `t.row`, `ld` apart) from `x`: each output row of
/// the tap reads a run of one input row, every `step`-th element (a shifted copy at stride 1),
/// with `pad` where it hangs over an edge.
#[inline(always)]
fn copy_tap<T: Copy>(
    x: &[T],
    pad: T,
    cols: &mut [T],
    ld: usize,
    (ho, wo): (usize, usize),
    t: TapRows,
) {
    let dst = &mut cols[t.row * ld..][..ho * wo];
    let (top, rest) = dst.split_at_mut(t.oh.0 * wo);
    let (mid, bottom) = rest.split_at_mut((t.oh.1 - t.oh.0) * wo);
    top.fill(pad);
    bottom.fill(pad);
    if t.lo >= t.hi {
        mid.fill(pad);
        return;
    }
    let rows = t.oh.1 - t.oh.0;
    if t.step == 1 && t.src_step == wo && rows > 0 {
        // Input rows as wide as the output rows and read one after the other (stride 1,
        // "same" padding): the tap's rows are one run of the input, copied at once; the
        // columns that hang over an edge read a neighbouring row's end and are padded after.
        let len = (rows - 1) * wo + (t.hi - t.lo);
        mid[t.lo..t.lo + len].copy_from_slice(&x[t.src..t.src + len]);
        if t.lo > 0 || t.hi < wo {
            for out in mid.chunks_exact_mut(wo) {
                out[..t.lo].fill(pad);
                out[t.hi..].fill(pad);
            }
        }
        return;
    }
    let span = (t.hi - t.lo - 1) * t.step + 1;
    for (q, out) in mid.chunks_exact_mut(wo).enumerate() {
        let from = &x[t.src + q * t.src_step..][..span];
        out[..t.lo].fill(pad);
        out[t.hi..].fill(pad);
        let run = &mut out[t.lo..t.hi];
        if t.step == 1 {
            zip_run(run, from, |o, v| *o = v);
        } else {
            strided_run(run, from, t.step, |o, v| *o = v);
        }
    }
}

/// A strided window's image split into phases: plane `(a, b)` of channel `c` holds the input's
/// rows `a, a + sh, …` and, of those, the columns `b, b + sw, …` (`hp × wp`, padded past the
/// edge), laid out `[c, sh, sw, hp, wp]`. A tap at stride `(sh, sw)` over the image is a tap at
/// stride 1 over one plane: output `(oh, ow)` reads the plane's `(oh + ri, ow + sj)`. Its runs
/// are then contiguous, and all of a tap's rows one run of its plane where `wp` is the output's
/// width (a stride-2 window with "same"-style padding, as a transposed convolution's). Only
/// im2col reads them: folding into the phases and adding them back measured slower than
/// col2im's own strided runs.
struct Phases {
    hp: usize,
    wp: usize,
    len: usize,
}

impl Phases {
    /// The split of `win`'s image, for horizontal strides 2 to 4 (a stride past them skips most
    /// of the image, and one of 1 has contiguous runs already).
    fn of(win: &Window) -> Option<Phases> {
        if !(2..=4).contains(&win.sw) || win.sh > 4 {
            return None;
        }
        let (hp, wp) = (win.h.div_ceil(win.sh), win.w.div_ceil(win.sw));
        let len = win
            .c
            .checked_mul(win.sh * win.sw)?
            .checked_mul(hp)?
            .checked_mul(wp)?;
        Some(Phases { hp, wp, len })
    }

    /// Where plane `(a, b)` of channel `c` starts.
    fn plane(&self, win: &Window, c: usize, a: usize, b: usize) -> usize {
        ((c * win.sh + a) * win.sw + b) * self.hp * self.wp
    }

    /// Fills `planes` (`self.len` long, holding `pad`) from the image `x`: each plane row's
    /// entries inside the image, every `sw`-th element of an image row.
    fn split<T: Copy>(&self, x: &[T], win: &Window, planes: &mut [T]) {
        for c in 0..win.c {
            for a in 0..win.sh {
                for i in 0..self.hp {
                    let row = i * win.sh + a;
                    if row >= win.h {
                        break;
                    }
                    for b in 0..win.sw.min(win.w) {
                        let n = (win.w - b).div_ceil(win.sw);
                        let dst = self.plane(win, c, a, b) + i * self.wp;
                        let src = (c * win.h + row) * win.w + b;
                        let from = &x[src..src + (n - 1) * win.sw + 1];
                        strided_run(&mut planes[dst..dst + n], from, win.sw, |o, v| *o = v);
                    }
                }
            }
        }
    }

    /// Every tap of `win` (output `ho × wo`) as a stride-1 tap over one plane, in the patch
    /// matrix's row order, as [`for_each_tap`] gives them over the image.
    fn for_each_tap(&self, win: &Window, ho: usize, wo: usize, mut f: impl FnMut(TapRows)) {
        // Offsets as isize: `out_hw` keeps the padded extents within it.
        let split = |shift: usize, pad: usize, stride: usize| {
            let r = shift as isize - pad as isize;
            (
                r.rem_euclid(stride as isize) as usize,
                r.div_euclid(stride as isize),
            )
        };
        // The output indices q whose plane index q + off lies in [0, extent), within 0..out.
        let inside = |off: isize, extent: usize, out: usize| {
            let lo = (-off).max(0) as usize;
            let hi = (extent as isize - off).max(0) as usize;
            (lo.min(out), hi.min(out).max(lo.min(out)))
        };
        for c in 0..win.c {
            for ki in 0..win.kh {
                let (a, ri) = split(ki * win.dh, win.ph, win.sh);
                let rows = win.h.saturating_sub(a).div_ceil(win.sh);
                let oh = inside(ri, rows, ho);
                for kj in 0..win.kw {
                    let (b, sj) = split(kj * win.dw, win.pw, win.sw);
                    let cols = win.w.saturating_sub(b).div_ceil(win.sw);
                    let (lo, hi) = inside(sj, cols, wo);
                    let src = if oh.0 < oh.1 && lo < hi {
                        self.plane(win, c, a, b)
                            + (oh.0 as isize + ri) as usize * self.wp
                            + (lo as isize + sj) as usize
                    } else {
                        0
                    };
                    f(TapRows {
                        row: (c * win.kh + ki) * win.kw + kj,
                        oh,
                        lo,
                        hi,
                        step: 1,
                        src,
                        src_step: self.wp,
                    });
                }
            }
        }
    }
}

/// The adjoint of [`im2col`]: `x[src] += cols[row, col]` for every tap that reads `src`.
pub fn col2im<T: Float>(cols: &[T], win: &Window, x: &mut [T]) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    col2im_ld(cols, win, x, (ho * wo, 0), |v| v);
}

/// One kernel tap: row `row` of the patch matrix. Its output rows `oh.0..oh.1` read input rows
/// (the others hang over the top or bottom edge: padding); in each, the columns `lo..hi` read
/// every `step`-th element (the horizontal stride) of the input from `src` on, for the first of
/// those rows, and `src_step` elements further for each next one; the columns outside that
/// range hang over the left or right edge (`lo == hi`: all of them).
struct TapRows {
    row: usize,
    oh: (usize, usize),
    lo: usize,
    hi: usize,
    step: usize,
    src: usize,
    src_step: usize,
}

/// Every [`TapRows`] of a window with output `ho × wo`, channel by channel and tap by tap (the
/// patch matrix's row order): the bounds im2col and col2im share, worked out once per tap.
fn for_each_tap(win: &Window, ho: usize, wo: usize, mut f: impl FnMut(TapRows)) {
    // The first output index at or past `edge` (in input units, counted from the padded
    // edge) for a tap `shift` in: ⌈(edge − shift) / stride⌉, 0 when the tap starts past it.
    // `out_hw` bounds every term, so nothing overflows.
    let first_past =
        |edge: usize, shift: usize, stride: usize| edge.saturating_sub(shift).div_ceil(stride);
    // The input index read at output index `first`: first·stride + shift − pad. It saturates
    // only where no row or no column lies inside, when it goes unused (a stride wider than the
    // input, say).
    let start = |first: usize, stride: usize, shift: usize, pad: usize| {
        first
            .saturating_mul(stride)
            .saturating_add(shift)
            .saturating_sub(pad)
    };
    for c in 0..win.c {
        for ki in 0..win.kh {
            let down = ki * win.dh;
            // Output rows oh whose input row oh·sh + ki·dh − ph lies inside [0, h).
            let oh0 = first_past(win.ph, down, win.sh).min(ho);
            let oh1 = first_past(win.h + win.ph, down, win.sh).min(ho).max(oh0);
            // The first of them reads input row oh0·sh + ki·dh − ph (when there is one).
            let ih0 = start(oh0, win.sh, down, win.ph);
            for kj in 0..win.kw {
                let row = (c * win.kh + ki) * win.kw + kj;
                let shift = kj * win.dw;
                // Output columns ow whose input column ow·sw + kj·dw − pw lies inside [0, w).
                let lo = first_past(win.pw, shift, win.sw).min(wo);
                let hi = first_past(win.w + win.pw, shift, win.sw).min(wo).max(lo);
                let col = start(lo, win.sw, shift, win.pw);
                let src = (c * win.h)
                    .saturating_add(ih0)
                    .saturating_mul(win.w)
                    .saturating_add(col);
                f(TapRows {
                    row,
                    oh: (oh0, oh1),
                    lo,
                    hi,
                    step: win.sw,
                    src,
                    src_step: win.sh.saturating_mul(win.w),
                });
            }
        }
    }
}

/// `f(&mut dst[i], src[i])` over one row of a patch (a few dozen elements at most), in fixed
/// blocks of four that compile to vector code: a plain loop over a run shorter than its vector
/// width falls through to the scalar tail, and `copy_from_slice` would call `memcpy`, whose call
/// costs more than such a copy.
#[inline(always)]
pub(super) fn zip_run<D, S: Copy>(dst: &mut [D], src: &[S], f: impl Fn(&mut D, S)) {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    let mut d = dst.chunks_exact_mut(4);
    let mut s = src.chunks_exact(4);
    for (a, b) in (&mut d).zip(&mut s) {
        if let (Ok(a), Ok(b)) = (<&mut [D; 4]>::try_from(a), <&[S; 4]>::try_from(b)) {
            for k in 0..4 {
                f(&mut a[k], b[k]);
            }
        }
    }
    for (a, &b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        f(a, b);
    }
}

/// `f(&mut dst[q], src[q·step])` for every `q` (`src` holds `(dst.len() − 1)·step + 1`
/// elements): a window's run at a horizontal stride. A stride of 2 (nearly every strided
/// window) reads the run as pairs, which compiles to vector code; `step_by` would recompute the
/// iterator's bounds at every element (it measured half of a stride-2 im2col's time).
#[inline(always)]
fn strided_run<D, S: Copy>(dst: &mut [D], src: &[S], step: usize, f: impl Fn(&mut D, S)) {
    let Some((last, body)) = dst.split_last_mut() else {
        return;
    };
    if step == 2 {
        for (o, pair) in body.iter_mut().zip(src.chunks_exact(2)) {
            f(o, pair[0]);
        }
    } else {
        for (q, o) in body.iter_mut().enumerate() {
            f(o, src[q * step]);
        }
    }
    f(last, src[body.len() * step]);
}

/// The adjoint walk of [`strided_run`]: `f(&mut dst[q·step], src[q])` for every `q`.
#[inline(always)]
fn strided_run_mut<D, S: Copy>(dst: &mut [D], src: &[S], step: usize, f: impl Fn(&mut D, S)) {
    let Some((&last, body)) = src.split_last() else {
        return;
    };
    if step == 2 {
        for (pair, &v) in dst.chunks_exact_mut(2).zip(body) {
            f(&mut pair[0], v);
        }
    } else {
        for (q, &v) in body.iter().enumerate() {
            f(&mut dst[q * step], v);
        }
    }
    f(&mut dst[body.len() * step], last);
}

/// [`col2im`] from a wider matrix: row `r` of the patch matrix starts at `off + r·ld`.
fn col2im_ld<S: Copy, T: Float>(
    cols: &[S],
    win: &Window,
    x: &mut [T],
    (ld, off): (usize, usize),
    widen: impl Fn(S) -> T,
) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    // (Folding into the image's phases and adding them back, as im2col reads them, measured
    // slower at stride 2: the planes cost a zeroing and a pass of their own.)
    let cols = &cols[off..];
    for_each_tap(win, ho, wo, |t| fold_tap(cols, x, ld, (ho, wo), t, &widen));
}

/// The mirror of [`copy_tap`]: each output row of a kernel tap adds into every `step`-th
/// element of a run of one input row.
#[inline(always)]
fn fold_tap<S: Copy, T: Float>(
    cols: &[S],
    x: &mut [T],
    ld: usize,
    (_, wo): (usize, usize),
    t: TapRows,
    widen: &impl Fn(S) -> T,
) {
    if t.lo >= t.hi || t.oh.0 >= t.oh.1 {
        return;
    }
    let span = (t.hi - t.lo - 1) * t.step + 1;
    let rows = &cols[t.row * ld + t.oh.0 * wo..][..(t.oh.1 - t.oh.0) * wo];
    for (q, r) in rows.chunks_exact(wo).enumerate() {
        let to = &mut x[t.src + q * t.src_step..][..span];
        let run = &r[t.lo..t.hi];
        if t.step == 1 {
            zip_run(to, run, |o, v| *o += widen(v));
        } else {
            strided_run_mut(to, run, t.step, |o, v| *o += widen(v));
        }
    }
}

/// im2col of a batch `[n, c, h, w]` into one matrix with the images side by side:
/// `cols[row, b·L + col]` (`patch_len × n·L`, `L = ho·wo`), so that one GEMM convolves the whole
/// batch. Work splits over channels (each owns `kh·kw` whole rows).
pub fn im2col_batch<T: Copy + Send + Sync>(
    x: &[T],
    n: usize,
    win: &Window,
    pad: T,
    cols: &mut [T],
    threads: usize,
) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    let l = ho * wo;
    let ld = n * l;
    let plane = win.h * win.w;
    let one = Window { c: 1, ..*win };
    let rows = win.kh * win.kw;
    super::par::par_rows_mut(
        cols,
        rows * ld,
        threads,
        super::par::PAR_MIN_ELEMS,
        |c, blk| {
            for b in 0..n {
                let img = &x[(b * win.c + c) * plane..(b * win.c + c + 1) * plane];
                im2col_ld(img, &one, pad, blk, ld, b * l);
            }
        },
    );
}

/// The adjoint of [`im2col_batch`]: adds each image's columns back into `x` (`[n, c, h, w]`,
/// cleared by the caller). Work splits over channels, and each channel's `kh·kw` rows are read
/// from start to end, image after image: a handful of sequential streams rather than a jump of a
/// whole row (`n·L` elements) between every two runs.
pub fn col2im_batch<T: Float>(cols: &[T], n: usize, win: &Window, x: &mut [T], threads: usize) {
    col2im_batch_from(cols, n, win, x, threads, |v| v)
}

/// [`col2im_batch`] of 16-bit columns into an f32 `x`: each value widened as it is added, so
/// that the sums run in f32 without an f32 copy of the (larger) columns.
pub fn col2im_batch_widening<H: super::cast::Storage + Send + Sync>(
    cols: &[H],
    n: usize,
    win: &Window,
    x: &mut [f32],
    threads: usize,
) {
    // Exact: a 16-bit value is an f32 value.
    col2im_batch_from(cols, n, win, x, threads, |v| v.widen() as f32)
}

/// [`col2im_batch`] of 16-bit columns into a 16-bit `x` that holds zeros (fold's fresh output):
/// the sums run in an f32 image widened from the columns as they are added
/// ([`col2im_batch_widening`]), each rounded once into `x`.
pub fn col2im_batch_half<H: super::cast::Storage + Send + Sync>(
    cols: &[H],
    n: usize,
    win: &Window,
    x: &mut [H],
    threads: usize,
) {
    let mut sums = vec![0f32; x.len()];
    col2im_batch_widening(cols, n, win, &mut sums, threads);
    super::cast::cast(&sums, x, threads);
}

fn col2im_batch_from<S: Copy + Send + Sync, T: Float>(
    cols: &[S],
    n: usize,
    win: &Window,
    x: &mut [T],
    threads: usize,
    widen: impl Fn(S) -> T + Sync,
) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    let l = ho * wo;
    let ld = n * l;
    let plane = win.h * win.w;
    let rows = win.kh * win.kw;
    if plane == 0 || win.c == 0 {
        return;
    }
    let one = Window { c: 1, ..*win };
    let t = if x.len() >= super::par::PAR_MIN_ELEMS {
        threads.clamp(1, win.c)
    } else {
        1
    };
    let per = win.c.div_ceil(t);
    // Each channel's planes, image after image; thread j owns channels [j·per, (j+1)·per).
    let mut channels: Vec<Vec<&mut [T]>> = (0..win.c).map(|_| Vec::with_capacity(n)).collect();
    for (k, p) in x.chunks_mut(plane).enumerate() {
        channels[k % win.c].push(p);
    }
    let mut groups: Vec<Vec<Vec<&mut [T]>>> = Vec::with_capacity(t);
    let mut rest = channels.into_iter();
    while rest.len() > 0 {
        groups.push(rest.by_ref().take(per).collect());
    }
    let run = |j: usize, g: &mut Vec<Vec<&mut [T]>>| {
        for (dc, planes) in g.iter_mut().enumerate() {
            let c = j * per + dc;
            for (b, p) in planes.iter_mut().enumerate() {
                col2im_ld(cols, &one, p, (ld, c * rows * ld + b * l), &widen);
            }
        }
    };
    if t <= 1 {
        groups.iter_mut().for_each(|g| run(0, g));
    } else {
        super::thread_pool::for_each_owned(groups, run);
    }
}

/// Max pooling of one `[c, h, w]` image: `idx[o]` gets the flat input index (plus `base`) of
/// each output's maximum (the first one on ties; a NaN is taken). Padding is never chosen.
#[allow(clippy::eq_op)] // `v != v` is the NaN test on a generic float
pub fn max_pool_indices<T: Float>(x: &[T], win: &Window, base: usize, idx: &mut [u32]) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    let plain = win.ph == 0 && win.pw == 0 && win.dh == 1 && win.dw == 1;
    if plain && (win.kh, win.kw, win.sh, win.sw) == (2, 2, 2, 2) {
        // The common 2×2/2 pooling: two input rows give one output row, read as pairs, in the
        // same order and with the same rule as the general loop below.
        let w = win.w;
        for c in 0..win.c {
            for oh in 0..ho {
                let r0 = (c * win.h + 2 * oh) * w;
                let top = &x[r0..r0 + 2 * wo];
                let bot = &x[r0 + w..r0 + w + 2 * wo];
                let out = &mut idx[(c * ho + oh) * wo..(c * ho + oh + 1) * wo];
                let k0 = (base + r0) as u32;
                pool2x2_row(top, bot, k0, w as u32, out);
            }
        }
        return;
    }
    if win.ph == 0 && win.pw == 0 {
        // Every window lies inside the image: no bounds tests in the inner loop.
        for c in 0..win.c {
            for oh in 0..ho {
                let r0 = (c * win.h + oh * win.sh) * win.w;
                let orow = (c * ho + oh) * wo;
                for ow in 0..wo {
                    let start = r0 + ow * win.sw;
                    let mut bk = start;
                    let mut bv = x[start];
                    for ki in 0..win.kh {
                        let r = start + ki * win.dh * win.w;
                        for kj in 0..win.kw {
                            let k = r + kj * win.dw;
                            let v = x[k];
                            // Branch-free select (a data-dependent branch mispredicts half the
                            // time on real images); a NaN is taken, so it propagates.
                            let take = (v > bv) | (v != v);
                            bv = if take { v } else { bv };
                            bk = if take { k } else { bk };
                        }
                    }
                    idx[orow + ow] = (base + bk) as u32;
                }
            }
        }
        return;
    }
    for c in 0..win.c {
        for oh in 0..ho {
            for ow in 0..wo {
                let mut best: Option<(T, usize)> = None;
                for ki in 0..win.kh {
                    let ih = (oh * win.sh + ki * win.dh) as isize - win.ph as isize;
                    if ih < 0 || ih as usize >= win.h {
                        continue;
                    }
                    for kj in 0..win.kw {
                        let iw = (ow * win.sw + kj * win.dw) as isize - win.pw as isize;
                        if iw < 0 || iw as usize >= win.w {
                            continue;
                        }
                        let k = (c * win.h + ih as usize) * win.w + iw as usize;
                        let v = x[k];
                        let better = match best {
                            None => true,
                            Some((b, _)) => v > b || (v != v && b == b),
                        };
                        if better {
                            best = Some((v, k));
                        }
                    }
                }
                let (_, k) = best.expect("invariant: every window holds an input element");
                idx[(c * ho + oh) * wo + ow] = (base + k) as u32;
            }
        }
    }
}

/// One output row of 2×2/2 max pooling: `top` and `bot` are the two input rows (`2·out.len()`
/// elements each), `k0` the flat index of `top[0]`, `w` the input row length. Eight outputs at a
/// time as separate passes over fixed-size arrays, which the compiler turns into vector code.
#[allow(clippy::eq_op)] // `v != v` is the NaN test on a generic float
fn pool2x2_row<T: Float>(top: &[T], bot: &[T], k0: u32, w: u32, out: &mut [u32]) {
    const L: usize = 8;
    let n = out.len();
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if T::DTYPE == crate::DType::F32 && super::wide::simd() == super::wide::Simd::Avx512 {
        // SAFETY: `T` is `f32`: its DTYPE says so, and `Float` has only this crate's f32 and
        // f64 implementations (it requires the sealed `Pod`); the slices reinterpret to `f32`
        // slices of the same length. The level is AVX-512 only where the CPU reports AVX-512F
        // (`wide::simd` never reports more than the CPU has).
        unsafe {
            let f = |s: &[T]| std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len());
            pool2x2_row_avx512(f(top), f(bot), k0, w, out);
        }
        return;
    }
    let full = n / L * L;
    for (blk, o) in out[..full].chunks_exact_mut(L).enumerate() {
        let j0 = blk * L;
        let t = &top[2 * j0..2 * j0 + 2 * L];
        let b = &bot[2 * j0..2 * j0 + 2 * L];
        let mut bv = [T::ZERO; L];
        let mut off = [0u32; L];
        for j in 0..L {
            bv[j] = t[2 * j];
        }
        // The rest of each window in the order the general loop visits it: (row, column, offset).
        for (src, col, dk) in [(t, 1, 1), (b, 0, w), (b, 1, w + 1)] {
            for j in 0..L {
                let v = src[2 * j + col];
                let take = (v > bv[j]) | (v != v);
                bv[j] = if take { v } else { bv[j] };
                off[j] = if take { dk } else { off[j] };
            }
        }
        for j in 0..L {
            o[j] = k0 + 2 * (j0 + j) as u32 + off[j];
        }
    }
    for (j, o) in out.iter_mut().enumerate().skip(full) {
        let k = k0 + 2 * j as u32;
        let (mut bv, mut bk) = (top[2 * j], k);
        for (v, kv) in [
            (top[2 * j + 1], k + 1),
            (bot[2 * j], k + w),
            (bot[2 * j + 1], k + w + 1),
        ] {
            let take = (v > bv) | (v != v);
            bv = if take { v } else { bv };
            bk = if take { kv } else { bk };
        }
        *o = bk;
    }
}

/// [`pool2x2_row`] on f32 in AVX-512 registers, sixteen outputs at a time (the last run
/// masked, so that a short row of a small image, 7 or 14 outputs, is one step rather than a
/// scalar tail): each row pair's even and odd columns split apart with `vpermt2ps`, then the
/// same three comparisons in the same order (a larger value or a NaN takes the place).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f")]
unsafe fn pool2x2_row_avx512(top: &[f32], bot: &[f32], k0: u32, w: u32, out: &mut [u32]) {
    use std::arch::x86_64::*;
    let n = out.len();
    assert!(top.len() >= 2 * n && bot.len() >= 2 * n);
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let lanes = |c: usize| -> u16 {
        if c >= 16 {
            u16::MAX
        } else {
            (1u16 << c) - 1
        }
    };
    let mut j = 0;
    while j < n {
        let c = (n - j).min(16);
        let (out_mask, lo, hi) = (lanes(c), lanes(2 * c), lanes((2 * c).saturating_sub(16)));
        // SAFETY: the masked loads read inputs 2·j .. 2·(j + c) ≤ 2·n of each row (the
        // assertion; masked-off lanes are not read), the masked store outputs j .. j + c ≤ n.
        unsafe {
            let (pt, pb) = (top.as_ptr().add(2 * j), bot.as_ptr().add(2 * j));
            let (t0, t1) = (
                _mm512_maskz_loadu_ps(lo, pt),
                _mm512_maskz_loadu_ps(hi, pt.wrapping_add(16)),
            );
            let (b0, b1) = (
                _mm512_maskz_loadu_ps(lo, pb),
                _mm512_maskz_loadu_ps(hi, pb.wrapping_add(16)),
            );
            let mut bv = _mm512_permutex2var_ps(t0, even, t1);
            let mut off = _mm512_setzero_si512();
            for (v, dk) in [
                (_mm512_permutex2var_ps(t0, odd, t1), 1),
                (_mm512_permutex2var_ps(b0, even, b1), w),
                (_mm512_permutex2var_ps(b0, odd, b1), w + 1),
            ] {
                let take = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, bv)
                    | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                bv = _mm512_mask_mov_ps(bv, take, v);
                off = _mm512_mask_mov_epi32(off, take, _mm512_set1_epi32(dk as i32));
            }
            // Output j + q starts at input k0 + 2·(j + q).
            let first = _mm512_set1_epi32(k0.wrapping_add(2 * j as u32) as i32);
            let idx = _mm512_add_epi32(
                _mm512_add_epi32(
                    first,
                    _mm512_slli_epi32::<1>(_mm512_setr_epi32(
                        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                    )),
                ),
                off,
            );
            _mm512_mask_storeu_epi32(out.as_mut_ptr().add(j).cast(), out_mask, idx);
        }
        j += c;
    }
}

/// [`max_pool_indices`] over 16-bit images: each channel's plane widened (exactly) into a
/// buffer of this thread's that stays in the L1 cache, so the same comparisons choose the same
/// indices as on the values in f32.
pub fn max_pool_indices_half<H: Storage>(x: &[H], win: &Window, base: usize, idx: &mut [u32]) {
    thread_local! {
        static WIDE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    let (plane, per_out) = (win.h * win.w, ho * wo);
    let one = Window { c: 1, ..*win };
    WIDE.with(|w| {
        let mut fresh = Vec::new();
        let mut held = w.try_borrow_mut();
        let w = held.as_deref_mut().unwrap_or(&mut fresh);
        w.resize(plane, 0.0);
        for c in 0..win.c {
            H::load_f32(&x[c * plane..(c + 1) * plane], w);
            let out = &mut idx[c * per_out..(c + 1) * per_out];
            max_pool_indices(w, &one, base + c * plane, out);
        }
    })
}

/// `out[i] = x[idx[i]]`.
pub fn take<T: Copy>(x: &[T], idx: &[u32], out: &mut [T]) {
    for (o, &k) in out.iter_mut().zip(idx) {
        *o = x[k as usize];
    }
}

/// `out[idx[i]] += g[i]` (`out` cleared by the caller), each sum rounded to `T` (for 16-bit
/// types exact where no index repeats, as a pooling of disjoint windows gives).
pub fn put_add<T: Storage>(g: &[T], idx: &[u32], out: &mut [T]) {
    for (&v, &k) in g.iter().zip(idx) {
        out[k as usize] = T::sum_of(out[k as usize], v);
    }
}

/// [`take`] split across threads when large.
pub fn take_par<T: Copy + Send + Sync>(x: &[T], idx: &[u32], out: &mut [T], threads: usize) {
    let idx = &idx[..out.len().min(idx.len())];
    super::par::par_chunks_mut(out, threads, super::par::PAR_MIN_ELEMS, |s, o| {
        take(x, &idx[s..s + o.len()], o)
    });
}

/// `out = 0`, then `out[idx[i]] += g[i]`: the scatter that is a gather's gradient (max pooling's
/// backward), plane by plane. `g` and `idx` hold planes of `per_g` elements and `out` planes of
/// `per_out` (a pooling's output and input planes), and the indices of `g`'s plane `p` point
/// into `out`'s plane `p`: each plane is cleared and filled while it is in the level-1 cache, on
/// the threads a plane at a time, with the sums of the whole scatter in the same order. An index
/// outside its plane sends the whole scatter to one thread, plane by plane no more.
pub fn put_into<T: Storage>(
    g: &[T],
    idx: &[u32],
    (per_g, per_out): (usize, usize),
    out: &mut [T],
    threads: usize,
) {
    let n = g.len().min(idx.len());
    let zero = T::narrow(0.0);
    let planes = if per_g == 0 || per_out == 0 {
        0
    } else {
        (n / per_g).min(out.len() / per_out)
    };
    let stray = std::sync::atomic::AtomicBool::new(planes * per_g != n);
    let done = planes * per_out;
    super::par::par_rows_mut(
        &mut out[..done],
        per_out.max(1),
        threads,
        super::par::PAR_MIN_ELEMS,
        |p, o| {
            o.fill(zero);
            let base = (p * per_out) as u64;
            let at = p * per_g;
            for (&v, &k) in g[at..at + per_g].iter().zip(&idx[at..at + per_g]) {
                let i = u64::from(k).wrapping_sub(base);
                if i < per_out as u64 {
                    o[i as usize] = T::sum_of(o[i as usize], v);
                } else {
                    stray.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        },
    );
    if stray.into_inner() || done < out.len() {
        out.fill(zero);
        put_add(&g[..n], &idx[..n], out);
    }
}

/// The shape of a host convolution's products over a batch: weight `[o, k]`, patch matrix
/// `[k, n·l]` with the `n` images side by side (`im2col_batch`), output `[n, o, l]` image-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvDims {
    /// Output channels.
    pub o: usize,
    /// Patch length (`C·kh·kw`).
    pub k: usize,
    /// Output positions per image (`Ho·Wo`).
    pub l: usize,
    /// Images.
    pub n: usize,
}

impl ConvDims {
    fn check(&self, w: usize, cols: usize, y: usize) {
        let ConvDims { o, k, l, n } = *self;
        assert!(
            w >= o * k && cols >= k * n * l && y >= n * o * l,
            "invariant: convolution operand out of bounds"
        );
    }
}

/// `y[b] = w · cols_b (+ bias)` for each image `b`, written straight into the image-major
/// output (`cols_b` is columns `b·l..(b+1)·l` of the patch matrix, read in place through its row
/// stride): no permute after a batch-wide product. Images split over threads.
pub fn conv_gemm_forward<T: Float + Gemm>(
    w: &[T],
    cols: &[T],
    bias: Option<&[T]>,
    d: ConvDims,
    y: &mut [T],
    threads: usize,
) {
    let ConvDims { o, k, l, n } = d;
    d.check(w.len(), cols.len(), y.len());
    if o == 0 || l == 0 {
        return;
    }
    let y = &mut y[..n * o * l];
    super::par::par_rows_mut(y, o * l, threads, super::par::PAR_MIN_ELEMS, |b, yb| {
        if let Some(bias) = bias {
            for (row, &v) in yb.chunks_mut(l).zip(bias) {
                row.fill(v);
            }
        }
        super::gemm(
            super::Mnk::new(o, k, l),
            super::MatView::row_major(w, 0, k, false),
            super::MatView::row_major(cols, b * l, n * l, false),
            yb,
            bias.is_some(),
            1,
        );
    });
}

/// The fixed number of image blocks whose weight gradients [`patch_products`] sums separately
/// (then in block order): set by the batch alone, so that the bits do not depend on the thread
/// count.
pub(crate) const WEIGHT_GRAD_BLOCKS: usize = 8;

/// What [`patch_products`] computes from each image's patches `P_b = im2col(src_b)` (`[k, l]`).
pub struct PatchOut<'a, T> {
    /// A convolution's output, or the input gradient of the transposed convolution.
    pub product: Option<PatchProduct<'a, T>>,
    /// A convolution's weight gradient (`a` the output's gradient, `src` the input), or the
    /// transposed convolution's (`a` its input, `src` its output's gradient).
    pub weight_grad: Option<PatchWeightGrad<'a, T>>,
}

/// `out_b = w·P_b`, each row starting from its channel's bias (or zero).
pub struct PatchProduct<'a, T> {
    /// `[o, k]`.
    pub w: &'a [T],
    /// `[o]`.
    pub bias: Option<&'a [T]>,
    /// `[n, o, l]`.
    pub out: &'a mut [T],
}

/// `dw = Σ_b a_b·P_bᵀ`.
pub struct PatchWeightGrad<'a, T> {
    /// `[n, o, l]`.
    pub a: &'a [T],
    /// `[o, k]`.
    pub dw: &'a mut [T],
}

/// The products of each image's patches `im2col(src_b)` under the window `win` (`src`
/// `[n, win.c, win.h, win.w]`, `d.k` its patch length, `d.l` its output positions), made once
/// per image in the thread's scratch and read by both products from its cache: the batch's
/// patch matrix (`k × n·l`) is never written out. The weight gradient is summed per block of
/// images (eight blocks, or one per image in a smaller batch: fixed by the batch), the blocks' sums
/// added in block order: the same bits on any number of threads.
pub fn patch_products<T: Float + Gemm>(
    src: &[T],
    win: &Window,
    d: ConvDims,
    outs: PatchOut<'_, T>,
    threads: usize,
) {
    let ConvDims { o, k, l, n } = d;
    let plane = win.c * win.h * win.w;
    let PatchOut {
        mut product,
        weight_grad,
    } = outs;
    assert!(
        win.out_hw().map(|(ho, wo)| ho * wo) == Some(l)
            && win.patch_len() == k
            && src.len() >= n * plane
            && product.as_ref().is_none_or(|p| {
                p.w.len() >= o * k
                    && p.out.len() >= n * o * l
                    && p.bias.is_none_or(|b| b.len() >= o)
            })
            && weight_grad
                .as_ref()
                .is_none_or(|g| g.a.len() >= n * o * l && g.dw.len() >= o * k),
        "invariant: convolution operand out of bounds"
    );
    let (mut dw, a) = match weight_grad {
        Some(g) => (Some(&mut g.dw[..o * k]), g.a),
        None => (None, &[][..]),
    };
    if n == 0 || k == 0 || l == 0 || o == 0 {
        // Every product is empty: the output is its bias, the gradient zero.
        if let Some(p) = product {
            fill_channels(&mut p.out[..n * o * l], l, o, p.bias);
        }
        if let Some(dw) = dw {
            dw.fill(T::ZERO);
        }
        return;
    }
    // Without the patches where the direct kernels run (both products then read the image
    // where it lies, one after the other).
    let direct = super::conv_direct::direct_applies::<T>(o)
        && match (product.as_mut(), dw.as_deref_mut()) {
            (Some(p), None) => {
                super::conv_direct::conv_direct(src, win, p.w, p.bias, d, p.out, threads)
            }
            (None, Some(dw)) => {
                super::conv_direct::conv_weight_grad_direct(src, win, a, d, dw, threads)
            }
            (Some(p), Some(dw)) => {
                super::conv_direct::conv_direct(src, win, p.w, p.bias, d, p.out, threads)
                    && super::conv_direct::conv_weight_grad_direct(src, win, a, d, dw, threads)
            }
            (None, None) => false,
        };
    if direct {
        return;
    }
    let want_dw = dw.is_some();
    // Blocks of images: for the weight gradient a fixed number; otherwise one image each.
    let per = if want_dw {
        n.div_ceil(WEIGHT_GRAD_BLOCKS.min(n))
    } else {
        1
    };
    let blocks = n.div_ceil(per);
    let mut partials = if want_dw {
        vec![T::ZERO; blocks * o * k]
    } else {
        Vec::new()
    };
    let w_bias = product.as_ref().map(|p| (p.w, p.bias));
    // One image: its patches in the scratch, then its product and its block's share of the
    // weight gradient (`first`: the block's first image, which overwrites the sum), kept
    // transposed (`[k, o]`) so that the product reads the patches as they lie and the
    // (smaller) `a_b` transposed.
    let image = |b: usize, out_b: Option<&mut [T]>, part: Option<&mut [T]>, first: bool| {
        T::with_scratch(k * l, |s| {
            im2col(&src[b * plane..(b + 1) * plane], win, T::ZERO, s);
            if let (Some(out_b), Some((w, bias))) = (out_b, w_bias) {
                if let Some(bias) = bias {
                    fill_channels(out_b, l, o, Some(bias));
                }
                super::gemm(
                    super::Mnk::new(o, k, l),
                    super::MatView::row_major(w, 0, k, false),
                    super::MatView::row_major(s, 0, l, false),
                    out_b,
                    bias.is_some(),
                    1,
                );
            }
            if let Some(part) = part {
                super::gemm(
                    super::Mnk::new(k, l, o),
                    super::MatView::row_major(s, 0, l, false),
                    super::MatView::row_major(a, b * o * l, l, true),
                    part,
                    !first,
                    1,
                );
            }
        })
    };
    // Whole blocks to each thread: its images' outputs and its blocks' partial sums.
    let t = if n * (plane + o * l) >= super::par::PAR_MIN_ELEMS {
        threads.clamp(1, blocks)
    } else {
        1
    };
    let mut out_rest: Option<&mut [T]> = product.as_mut().map(|p| &mut p.out[..n * o * l]);
    let mut part_rest: &mut [T] = &mut partials;
    let mut jobs = Vec::with_capacity(t);
    for j in 0..t {
        let (b0, b1) = (j * blocks / t, (j + 1) * blocks / t);
        let images = (b1 * per).min(n) - b0 * per;
        let out_part = out_rest.take().map(|v| {
            let (head, tail) = v.split_at_mut(images * o * l);
            out_rest = Some(tail);
            head
        });
        let len = if want_dw { (b1 - b0) * o * k } else { 0 };
        let (head, tail) = std::mem::take(&mut part_rest).split_at_mut(len);
        part_rest = tail;
        jobs.push((b0, b1, out_part, head));
    }
    let run = |_: usize, job: &mut (usize, usize, Option<&mut [T]>, &mut [T])| {
        let (b0, b1) = (job.0, job.1);
        let i0 = b0 * per;
        for blk in b0..b1 {
            for b in blk * per..((blk + 1) * per).min(n) {
                let out_b = job
                    .2
                    .as_deref_mut()
                    .map(|v| &mut v[(b - i0) * o * l..][..o * l]);
                let part = want_dw.then(|| &mut job.3[(blk - b0) * o * k..][..o * k]);
                image(b, out_b, part, b == blk * per);
            }
        }
    };
    if t <= 1 {
        jobs.iter_mut().for_each(|j| run(0, j));
    } else {
        super::thread_pool::for_each_owned(jobs, run);
    }
    if let Some(dw) = dw {
        // The blocks' sums added in block order into the first, which is then transposed.
        let (sum, rest) = partials.split_at_mut(o * k);
        for p in rest.chunks_exact(o * k) {
            for (acc, &v) in sum.iter_mut().zip(p) {
                *acc += v;
            }
        }
        T::transpose(sum, k, o, o, dw);
    }
}

/// Each `len`-element row of `out` (a plane of one of `channels` channels, channel after
/// channel, image after image) filled with its channel's bias, or zero.
fn fill_channels<T: Float>(out: &mut [T], len: usize, channels: usize, bias: Option<&[T]>) {
    if len == 0 || channels == 0 {
        return;
    }
    for (r, row) in out.chunks_mut(len).enumerate() {
        row.fill(bias.map_or(T::ZERO, |b| b[r % channels]));
    }
}

/// The adjoint of [`patch_products`]' product: `y_b = col2im(wᵀ·a_b)` under the window `win`,
/// starting from `bias` (`[win.c]`) or zero: `a` `[n, o, l]`, `w` `[o, k]`, `y`
/// `[n, win.c, win.h, win.w]`. A transposed convolution, or a convolution's input gradient.
/// Each image's patches `wᵀ·a_b` (`[k, l]`) are made in the thread's scratch and folded while
/// they are in its cache. Images split over threads; an image's bits do not depend on them.
#[allow(clippy::too_many_arguments)]
pub fn fold_products<T: Float + Gemm>(
    a: &[T],
    w: &[T],
    bias: Option<&[T]>,
    win: &Window,
    d: ConvDims,
    y: &mut [T],
    threads: usize,
) {
    let ConvDims { o, k, l, n } = d;
    let plane = win.c * win.h * win.w;
    assert!(
        win.out_hw().map(|(ho, wo)| ho * wo) == Some(l)
            && win.patch_len() == k
            && a.len() >= n * o * l
            && w.len() >= o * k
            && y.len() >= n * plane
            && bias.is_none_or(|b| b.len() >= win.c),
        "invariant: convolution operand out of bounds"
    );
    if plane == 0 {
        return;
    }
    let hw = win.h * win.w;
    super::par::par_rows_mut(
        &mut y[..n * plane],
        plane,
        threads,
        super::par::PAR_MIN_ELEMS,
        |b, yb| {
            fill_channels(yb, hw, win.c, bias);
            if k == 0 || l == 0 || o == 0 {
                return;
            }
            T::with_scratch(k * l, |s| {
                super::gemm(
                    super::Mnk::new(k, o, l),
                    super::MatView::row_major(w, 0, k, true),
                    super::MatView::row_major(a, b * o * l, l, false),
                    s,
                    false,
                    1,
                );
                col2im(s, win, yb);
            })
        },
    );
}

/// A convolution's input gradient `dx` (`[n, win.c, win.h, win.w]`) from its output's gradient
/// `gy` (`[n, o, l]`) and weight `w` (`[o, k]`): [`fold_products`] in general. At stride 1 with
/// a padding within the dilated kernel's reach it is itself a convolution — of `gy`, padded by
/// the reach less the padding, with the kernel flipped and its channel axes swapped — and runs
/// as one ([`patch_products`]) where it has no more output channels than input channels: the
/// output gradient's `o·kh·kw` patch rows (at "same" padding, one run per tap) and a product
/// over all of them, where folding takes a product over only `o` and a col2im of `k` rows. (With
/// more output channels, its patches outgrow the fold's, which measured faster.) The diffusion
/// example's U-Net step measured 4–8% faster this way.
pub fn conv_input_grad<T: Float + Gemm>(
    gy: &[T],
    w: &[T],
    win: &Window,
    d: ConvDims,
    dx: &mut [T],
    threads: usize,
) {
    let ConvDims { o, k, l, n } = d;
    let (reach_h, reach_w) = (win.dh * (win.kh - 1), win.dw * (win.kw - 1));
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    let as_conv =
        win.sh == 1 && win.sw == 1 && win.ph <= reach_h && win.pw <= reach_w && o <= win.c;
    if !as_conv || o == 0 || n == 0 || ho * wo != l || k != win.patch_len() {
        fold_products(gy, w, None, win, d, dx, threads);
        return;
    }
    let flipped = Window {
        c: o,
        h: ho,
        w: wo,
        ph: reach_h - win.ph,
        pw: reach_w - win.pw,
        ..*win
    };
    let (c, kh, kw) = (win.c, win.kh, win.kw);
    // wf[ci, oi, i, j] = w[oi, ci, kh − 1 − i, kw − 1 − j].
    let mut wf = vec![T::ZERO; o * k];
    for oi in 0..o {
        for ci in 0..c {
            for i in 0..kh {
                for j in 0..kw {
                    wf[((ci * o + oi) * kh + kh - 1 - i) * kw + kw - 1 - j] =
                        w[((oi * c + ci) * kh + i) * kw + j];
                }
            }
        }
    }
    let d2 = ConvDims {
        o: c,
        k: flipped.patch_len(),
        l: win.h * win.w,
        n,
    };
    let product = PatchProduct {
        w: &wf,
        bias: None,
        out: dx,
    };
    let outs = PatchOut {
        product: Some(product),
        weight_grad: None,
    };
    patch_products(gy, &flipped, d2, outs, threads);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both products in one `patch_products` call (`w`, `bias`, `gy` their operands) give the
    /// bits each gives alone (`y`, `dw`).
    fn both_in_one_call<T: Float + Gemm>(
        x: &[T],
        win: &Window,
        d: ConvDims,
        (w, bias, gy): (&[T], &[T], &[T]),
        (y, dw): (&[T], &[T]),
        threads: usize,
    ) {
        let (mut y2, mut dw2) = (vec![T::ZERO; y.len()], vec![T::ZERO; dw.len()]);
        let outs = PatchOut {
            product: Some(PatchProduct {
                w,
                bias: Some(bias),
                out: &mut y2,
            }),
            weight_grad: Some(PatchWeightGrad {
                a: gy,
                dw: &mut dw2,
            }),
        };
        patch_products(x, win, d, outs, threads);
        // Widening to f64 is exact, so equal bits there are equal bits.
        let same = |a: &[T], b: &[T]| {
            a.iter()
                .zip(b)
                .all(|(p, q)| p.widen().to_bits() == q.widen().to_bits())
        };
        assert!(
            same(&y2, y) && same(&dw2, dw),
            "{win:?}: both products in one call"
        );
    }

    /// The batch-wide references in f64 for the window `win` and sizes `d`: `y = w·cols + bias`,
    /// `dw = Σ_b gy_b·cols_bᵀ` and `dx = col2im(wᵀ·gy_b)` (also the transposed convolution of
    /// `gy`), with `cols` the batch's im2col.
    fn batch_wide(
        x: &[f64],
        w: &[f64],
        gy: &[f64],
        bias: &[f64],
        win: &Window,
        d: ConvDims,
    ) -> [Vec<f64>; 3] {
        let ConvDims { o, k, l, n } = d;
        let mut cols = vec![0.0; k * n * l];
        im2col_batch(x, n, win, 0.0, &mut cols, 1);
        let mut y = vec![0.0; n * o * l];
        conv_gemm_forward(w, &cols, Some(bias), d, &mut y, 1);
        let mut dw = vec![0.0; o * k];
        let mut dcols = vec![0.0; k * n * l];
        for b in 0..n {
            for r in 0..o {
                for p in 0..l {
                    let g = gy[(b * o + r) * l + p];
                    for j in 0..k {
                        dw[r * k + j] += g * cols[j * n * l + b * l + p];
                        dcols[j * n * l + b * l + p] += w[r * k + j] * g;
                    }
                }
            }
        }
        let mut dx = vec![0.0; n * win.c * win.h * win.w];
        col2im_batch(&dcols, n, win, &mut dx, 1);
        [y, dw, dx]
    }

    /// In f32 with enough output channels for the direct kernels (AVX-512): the products
    /// through `patch_products` — the output, the weight gradient, both in one call — and the
    /// input gradient through `conv_input_grad` against the batch-wide passes in f64, within
    /// f32 rounding; both in one call give the bits of each alone.
    #[test]
    #[cfg_attr(miri, ignore = "the direct kernels never run under Miri")]
    fn f32_products_through_the_direct_kernels_are_the_batch_wide_passes() {
        // The level decides which kernels run: no other test may change it meanwhile.
        let _levels = super::super::wide::level_lock();
        let val = |i: usize, s: f64| ((i as f64 * s).sin() * 8.0).round() / 8.0 + 0.001 * s;
        let wins = [
            Window {
                c: 3,
                h: 6,
                w: 7,
                kh: 3,
                kw: 3,
                sh: 1,
                sw: 1,
                ph: 1,
                pw: 1,
                dh: 1,
                dw: 1,
            },
            Window {
                c: 2,
                h: 9,
                w: 8,
                kh: 3,
                kw: 2,
                sh: 2,
                sw: 1,
                ph: 0,
                pw: 2,
                dh: 1,
                dw: 2,
            },
            Window {
                c: 40,
                h: 5,
                w: 4,
                kh: 3,
                kw: 3,
                sh: 1,
                sw: 1,
                ph: 1,
                pw: 1,
                dh: 1,
                dw: 1,
            },
        ];
        let (n, o) = (3, 40);
        for win in wins {
            let (c, h, wd) = (win.c, win.h, win.w);
            let (ho, wo) = win.out_hw().unwrap();
            let (k, l) = (win.patch_len(), ho * wo);
            let d = ConvDims { o, k, l, n };
            let x: Vec<f64> = (0..n * c * h * wd).map(|i| val(i, 0.37)).collect();
            let w: Vec<f64> = (0..o * k).map(|i| val(i, 0.53)).collect();
            let gy: Vec<f64> = (0..n * o * l).map(|i| val(i, 0.29)).collect();
            let bias: Vec<f64> = (0..o).map(|i| val(i, 1.7)).collect();
            let [y_want, dw_want, dx_want] = batch_wide(&x, &w, &gy, &bias, &win, d);
            let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
            let (xf, wf, gf, bf) = (f(&x), f(&w), f(&gy), f(&bias));
            let close = |got: &[f32], want: &[f64], what: &str| {
                for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{what}: {a} against {b} at {i}, {win:?}"
                    );
                }
            };
            for threads in [1, 2] {
                let (mut y, mut dw) = (vec![f32::NAN; n * o * l], vec![f32::NAN; o * k]);
                let product = Some(PatchProduct {
                    w: &wf,
                    bias: Some(&bf[..]),
                    out: &mut y,
                });
                patch_products(
                    &xf,
                    &win,
                    d,
                    PatchOut {
                        product,
                        weight_grad: None,
                    },
                    threads,
                );
                let weight_grad = Some(PatchWeightGrad {
                    a: &gf,
                    dw: &mut dw,
                });
                patch_products(
                    &xf,
                    &win,
                    d,
                    PatchOut {
                        product: None,
                        weight_grad,
                    },
                    threads,
                );
                close(&y, &y_want, "product");
                close(&dw, &dw_want, "weight gradient");
                both_in_one_call(&xf, &win, d, (&wf, &bf, &gf), (&y, &dw), threads);
                let mut dx = vec![f32::NAN; n * c * h * wd];
                conv_input_grad(&gf, &wf, &win, d, &mut dx, threads);
                close(&dx, &dx_want, "input gradient");
            }
        }
    }

    /// The per-image kernels against the batch-wide passes (im2col of the whole batch, then
    /// one product; col2im of the whole batch): the same values within rounding, and the same
    /// bits on one, two and three threads. Padded, strided and dilated windows, with and
    /// without a bias, small batches, the largest past the size that splits over threads and
    /// with more images than weight-gradient blocks, no output channels, an empty batch.
    #[test]
    fn the_per_image_kernels_are_the_batch_wide_passes() {
        let val = |i: usize, s: f64| ((i as f64 * s).sin() * 8.0).round() / 8.0 + 0.001 * s;
        let wins = [
            (3, 6, 7, (3, 3), (1, 1), (1, 1), (1, 1)),
            (2, 9, 8, (3, 2), (2, 1), (0, 2), (1, 2)),
            (4, 5, 5, (1, 1), (1, 1), (0, 0), (1, 1)),
            (1, 7, 9, (2, 3), (3, 2), (2, 1), (2, 1)),
            (2, 8, 8, (4, 4), (2, 2), (1, 1), (1, 1)),
            // Stride 1, dilated, and with a padding past the kernel's reach (folded).
            (2, 6, 7, (3, 2), (1, 1), (2, 1), (2, 3)),
            (2, 4, 5, (1, 2), (1, 1), (1, 0), (1, 1)),
        ];
        let (sizes, thread_counts): (&[(usize, usize)], &[usize]) = if cfg!(miri) {
            (&[(2, 2)], &[2])
        } else {
            (&[(3, 5), (0, 3), (2, 0), (1, 1), (37, 48)], &[1, 2, 3])
        };
        for (c, h, wd, (kh, kw), (sh, sw), (ph, pw), (dh, dw)) in wins {
            let win = Window {
                c,
                h,
                w: wd,
                kh,
                kw,
                sh,
                sw,
                ph,
                pw,
                dh,
                dw,
            };
            let (ho, wo) = win.out_hw().unwrap();
            let (k, l) = (win.patch_len(), ho * wo);
            for &(n, o) in sizes {
                let d = ConvDims { o, k, l, n };
                let x: Vec<f64> = (0..n * c * h * wd).map(|i| val(i, 0.37)).collect();
                let w: Vec<f64> = (0..o * k).map(|i| val(i, 0.53)).collect();
                let gy: Vec<f64> = (0..n * o * l).map(|i| val(i, 0.29)).collect();
                let bias: Vec<f64> = (0..o.max(c)).map(|i| val(i, 1.7)).collect();
                let [y_want, dw_want, dx_want] = batch_wide(&x, &w, &gy, &bias[..o], &win, d);
                let close = |got: &[f64], want: &[f64], what: &str| {
                    for (i, (a, b)) in got.iter().zip(want).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                            "{what}: {a} against {b} at {i}, {win:?} n {n} o {o}"
                        );
                    }
                };
                let mut first: Option<[Vec<f64>; 3]> = None;
                for &threads in thread_counts {
                    let mut y = vec![f64::NAN; n * o * l];
                    let mut dw = vec![f64::NAN; o * k];
                    let outs = PatchOut {
                        product: Some(PatchProduct {
                            w: &w,
                            bias: Some(&bias[..o]),
                            out: &mut y,
                        }),
                        weight_grad: None,
                    };
                    patch_products(&x, &win, d, outs, threads);
                    let outs = PatchOut {
                        product: None,
                        weight_grad: Some(PatchWeightGrad {
                            a: &gy,
                            dw: &mut dw,
                        }),
                    };
                    patch_products(&x, &win, d, outs, threads);
                    let mut dx = vec![f64::NAN; n * c * h * wd];
                    fold_products(&gy, &w, None, &win, d, &mut dx, threads);
                    // The input gradient as a convolution where it is one (stride 1).
                    let mut dx2 = vec![f64::NAN; n * c * h * wd];
                    conv_input_grad(&gy, &w, &win, d, &mut dx2, threads);
                    close(&dx2, &dx_want, "input gradient");
                    close(&y, &y_want, "product");
                    close(&dw, &dw_want, "weight gradient");
                    close(&dx, &dx_want, "fold");
                    // Both products in one pass give what each gives alone.
                    both_in_one_call(&x, &win, d, (&w, &bias[..o], &gy), (&y, &dw), threads);
                    // With a bias, the fold starts from it.
                    let mut dxb = vec![f64::NAN; n * c * h * wd];
                    fold_products(&gy, &w, Some(&bias[..c]), &win, d, &mut dxb, threads);
                    let plane = h * wd;
                    let shifted: Vec<f64> = dx
                        .iter()
                        .enumerate()
                        .map(|(i, v)| v + bias[(i / plane) % c])
                        .collect();
                    close(&dxb, &shifted, "fold from the bias");
                    let all = [y, dw, dx];
                    match &first {
                        None => first = Some(all),
                        Some(f) => {
                            for (got, want) in all.iter().zip(f) {
                                let same = got
                                    .iter()
                                    .zip(want)
                                    .all(|(a, b)| a.to_bits() == b.to_bits());
                                assert!(same, "{threads} threads: other bits, {win:?} n {n}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn convolution_forward_matches_naive_loops() {
        // Large enough (past PAR_MIN_FLOPS) to split over threads, small under Miri.
        let (o, k, l, n) = if cfg!(miri) {
            (3, 4, 5, 3)
        } else {
            (24, 36, 49, 61)
        };
        let d = ConvDims { o, k, l, n };
        let val = |i: usize, s: f64| ((i as f64 * s).sin() * 4.0).round() / 4.0;
        let w: Vec<f64> = (0..o * k).map(|i| val(i, 0.37)).collect();
        let cols: Vec<f64> = (0..k * n * l).map(|i| val(i, 0.11)).collect();
        let bias: Vec<f64> = (0..o).map(|i| i as f64 - 2.0).collect();
        // Naive: y[b][r][p] = bias[r] + Σ_j w[r][j]·cols[j][b·l + p].
        let mut y_want = vec![0.0; n * o * l];
        for b in 0..n {
            for r in 0..o {
                for p in 0..l {
                    let mut acc = bias[r];
                    for j in 0..k {
                        acc += w[r * k + j] * cols[j * n * l + b * l + p];
                    }
                    y_want[(b * o + r) * l + p] = acc;
                }
            }
        }
        for threads in [1, 2, 3] {
            let mut y = vec![f64::NAN; n * o * l];
            conv_gemm_forward(&w, &cols, Some(&bias), d, &mut y, threads);
            assert_eq!(y, y_want, "forward, {threads} threads");
            let mut y0 = vec![f64::NAN; n * o * l];
            conv_gemm_forward(&w, &cols, None, d, &mut y0, threads);
            let no_bias: Vec<f64> = (0..n * o * l)
                .map(|i| y_want[i] - bias[(i / l) % o])
                .collect();
            assert_eq!(y0, no_bias, "forward without bias, {threads} threads");
        }
    }

    #[test]
    fn im2col_and_col2im_are_adjoint() {
        let win = Window {
            c: 2,
            h: 5,
            w: 4,
            kh: 3,
            kw: 2,
            sh: 2,
            sw: 1,
            ph: 1,
            pw: 1,
            dh: 1,
            dw: 2,
        };
        let (ho, wo) = win.out_hw().unwrap();
        let n_in = 2 * 5 * 4;
        let n_cols = win.patch_len() * ho * wo;
        let x: Vec<f64> = (0..n_in).map(|i| (i as f64 * 0.7).sin()).collect();
        let y: Vec<f64> = (0..n_cols).map(|i| (i as f64 * 0.3).cos()).collect();
        let mut cols = vec![0.0; n_cols];
        im2col(&x, &win, 0.0, &mut cols);
        let mut back = vec![0.0; n_in];
        col2im(&y, &win, &mut back);
        // <im2col(x), y> == <x, col2im(y)>
        let lhs: f64 = cols.iter().zip(&y).map(|(a, b)| a * b).sum();
        let rhs: f64 = x.iter().zip(&back).map(|(a, b)| a * b).sum();
        assert!((lhs - rhs).abs() < 1e-12);
    }

    #[test]
    fn batch_layout_matches_per_image() {
        for (sh, ph) in [(1, 1), (2, 0)] {
            let win = Window {
                c: 3,
                h: 6,
                w: 5,
                kh: 3,
                kw: 2,
                sh,
                sw: sh,
                ph,
                pw: ph,
                dh: 1,
                dw: 1,
            };
            let n = 4;
            let (ho, wo) = win.out_hw().unwrap();
            let (l, k, per) = (ho * wo, win.patch_len(), 3 * 6 * 5);
            let x: Vec<f64> = (0..n * per).map(|i| (i as f64 * 0.61).sin()).collect();
            for threads in [1, 3] {
                let mut all = vec![0.0; k * n * l];
                im2col_batch(&x, n, &win, 0.0, &mut all, threads);
                for b in 0..n {
                    let mut one = vec![0.0; k * l];
                    im2col(&x[b * per..(b + 1) * per], &win, 0.0, &mut one);
                    assert_eq!(image_cols(&all, b, n, k, l), one, "image {b}");
                }
                let y: Vec<f64> = (0..k * n * l).map(|i| (i as f64 * 0.29).cos()).collect();
                let mut back = vec![0.0; n * per];
                col2im_batch(&y, n, &win, &mut back, threads);
                for b in 0..n {
                    let mut want = vec![0.0; per];
                    col2im(&image_cols(&y, b, n, k, l), &win, &mut want);
                    assert_eq!(&back[b * per..(b + 1) * per], &want[..]);
                }
            }
        }
    }

    /// Image `b`'s `[k, l]` patch matrix, cut out of a batch's `[k, n·l]` one.
    fn image_cols<T: Copy>(batch: &[T], b: usize, n: usize, k: usize, l: usize) -> Vec<T> {
        (0..k)
            .flat_map(|r| &batch[r * n * l + b * l..][..l])
            .copied()
            .collect()
    }

    #[test]
    #[cfg_attr(miri, ignore)] // large; the split itself is safe code over the pool Miri tests
    fn threaded_col2im_batch_matches_one_image_at_a_time() {
        // Large enough to split over threads, with a channel count the threads do not divide.
        let win = Window {
            c: 5,
            h: 12,
            w: 11,
            kh: 3,
            kw: 3,
            sh: 1,
            sw: 1,
            ph: 1,
            pw: 1,
            dh: 1,
            dw: 1,
        };
        let per = 5 * 12 * 11;
        let n = crate::cpu::par::PAR_MIN_ELEMS / per + 2;
        let (ho, wo) = win.out_hw().unwrap();
        let (l, k) = (ho * wo, win.patch_len());
        let y: Vec<f32> = (0..k * n * l).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut want = vec![0.0f32; n * per];
        col2im_batch(&y, n, &win, &mut want, 1);
        for b in 0..n {
            let mut one = vec![0.0; per];
            col2im(&image_cols(&y, b, n, k, l), &win, &mut one);
            assert_eq!(&want[b * per..(b + 1) * per], &one[..]);
        }
        for threads in [2, 3, 8] {
            let mut got = vec![0.0f32; n * per];
            col2im_batch(&y, n, &win, &mut got, threads);
            assert_eq!(got, want, "{threads} threads");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // large enough to split over threads
    fn put_into_and_take_par_match_the_sequential_loops() {
        // Planes of 20 gradients into planes of 81 elements, as a 3x3 pooling of 9x9 images
        // with padding picks them (some elements twice), then indices that leave their plane.
        let (per_g, per_out) = (20, 81);
        let planes = crate::cpu::par::PAR_MIN_ELEMS / 10;
        let n = planes * per_g;
        let g: Vec<f64> = (0..n).map(|i| (i as f64 * 0.7).sin()).collect();
        let pooled: Vec<u32> = (0..n as u32)
            .map(|i| (i / 20) * 81 + ((i % 20) * 4 + i % 3) / 2)
            .collect();
        let scattered: Vec<u32> = (0..n as u32).map(|i| (i * 7919) % (n as u32 / 2)).collect();
        for idx in [&pooled, &scattered] {
            let len = planes * per_out;
            let mut want = vec![0.0; len];
            put_add(&g, idx, &mut want);
            for threads in [1, 2, 3] {
                let mut got = vec![f64::NAN; len];
                put_into(&g, idx, (per_g, per_out), &mut got, threads);
                assert_eq!(got, want, "{threads} threads");
                let mut t1 = vec![0.0; n];
                take(&want, idx, &mut t1);
                let mut tp = vec![0.0; n];
                take_par(&want, idx, &mut tp, threads);
                assert_eq!(tp, t1);
            }
        }
    }

    #[test]
    fn runs_match_the_definition() {
        // (padding, kernel, stride, dilation): stride 1, then the strided and dilated windows
        // (a transposed convolution's k4 s2 p1, padding past the kernel's reach, wide strides
        // that skip columns, a dilated tap that lands past the right edge).
        for (ph, pw, kh, kw, sh, sw, dh, dw) in [
            (0, 0, 3, 3, 1, 1, 1, 1),
            (1, 1, 3, 3, 1, 1, 1, 1),
            (2, 1, 3, 2, 1, 1, 1, 1),
            (0, 3, 2, 5, 1, 1, 1, 1),
            (1, 0, 1, 1, 1, 1, 1, 1),
            (1, 1, 4, 4, 2, 2, 1, 1),
            (0, 0, 2, 2, 2, 2, 1, 1),
            (2, 3, 2, 3, 3, 2, 1, 1),
            (1, 2, 3, 2, 2, 3, 2, 2),
            (0, 4, 1, 2, 1, 4, 1, 3),
            (3, 0, 2, 1, 5, 1, 3, 1),
        ] {
            let win = Window {
                c: 3,
                h: 6,
                w: 5,
                kh,
                kw,
                sh,
                sw,
                ph,
                pw,
                dh,
                dw,
            };
            let (ho, wo) = win.out_hw().unwrap();
            let x: Vec<f32> = (0..90).map(|i| i as f32).collect();
            let mut fast = vec![0.0; win.patch_len() * ho * wo];
            im2col(&x, &win, -7.0, &mut fast);
            let mut slow = vec![0.0; fast.len()];
            win.for_each(|row, col, src| slow[row * ho * wo + col] = src.map_or(-7.0, |s| x[s]));
            let what =
                format!("padding {ph},{pw} kernel {kh}x{kw} stride {sh},{sw} dilation {dh},{dw}");
            assert_eq!(fast, slow, "{what}");
            // col2im's fast path against the general loop.
            let y: Vec<f64> = (0..fast.len()).map(|i| (i as f64 * 0.37).sin()).collect();
            let mut back = vec![0.0; 90];
            col2im(&y, &win, &mut back);
            let mut want = vec![0.0; 90];
            win.for_each(|row, col, src| {
                if let Some(s) = src {
                    want[s] += y[row * ho * wo + col];
                }
            });
            for (a, b) in back.iter().zip(&want) {
                assert!((a - b).abs() < 1e-12, "col2im {what}");
            }
        }
    }

    /// The 2×2/2 pooling of f32 at every SIMD level (the AVX-512 rows, masked at their ends)
    /// picks what the definition picks — the first maximum in window order, a NaN wherever
    /// one is — for every row length from 1 to 40 outputs, ties and NaN included.
    #[test]
    fn f32_pooling_picks_the_first_maximum_at_every_level() {
        use super::super::wide::{level_lock, set_simd, simd, simd_available, Simd};
        let _levels = level_lock();
        let before = simd();
        // Miri: up to one masked run past a full one.
        let widest = if cfg!(miri) { 17 } else { 40 };
        for wo in 1..=widest {
            let (c, h, w) = (3, 6, 2 * wo + wo % 2);
            // Small integers tie often; every 13th value is a NaN.
            let x: Vec<f32> = (0..c * h * w)
                .map(|i| {
                    if i % 13 == 5 {
                        f32::NAN
                    } else {
                        ((i * 7919) % 5) as f32
                    }
                })
                .collect();
            let win = Window {
                c,
                h,
                w,
                kh: 2,
                kw: 2,
                sh: 2,
                sw: 2,
                ph: 0,
                pw: 0,
                dh: 1,
                dw: 1,
            };
            let (ho, wo) = win.out_hw().unwrap();
            let mut want = vec![0u32; c * ho * wo];
            for ch in 0..c {
                for oh in 0..ho {
                    for ow in 0..wo {
                        let mut best: Option<(f32, usize)> = None;
                        for (ki, kj) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                            let at = (ch * h + 2 * oh + ki) * w + 2 * ow + kj;
                            let v = x[at];
                            let take = best.is_none_or(|(b, _)| v > b || v.is_nan());
                            if take {
                                best = Some((v, at));
                            }
                        }
                        want[(ch * ho + oh) * wo + ow] = 3 + best.unwrap().1 as u32;
                    }
                }
            }
            for level in [Simd::Baseline, Simd::Avx2, Simd::Avx512] {
                if level > simd_available() {
                    continue;
                }
                set_simd(level);
                let mut got = vec![0u32; c * ho * wo];
                max_pool_indices(&x, &win, 3, &mut got);
                set_simd(before);
                assert_eq!(got, want, "{wo} outputs a row, {level:?}");
            }
        }
    }

    #[test]
    fn max_pool_fast_path_matches_first_maximum() {
        let (h, w) = (7, 38);
        let x: Vec<f64> = (0..2 * h * w).map(|i| ((i * 37) % 11) as f64).collect();
        for (k, s) in [((2, 2), (2, 2)), ((3, 2), (2, 1)), ((1, 3), (1, 3))] {
            let win = Window {
                c: 2,
                h,
                w,
                kh: k.0,
                kw: k.1,
                sh: s.0,
                sw: s.1,
                ph: 0,
                pw: 0,
                dh: 1,
                dw: 1,
            };
            let (ho, wo) = win.out_hw().unwrap();
            let mut fast = vec![0u32; 2 * ho * wo];
            max_pool_indices(&x, &win, 5, &mut fast);
            for c in 0..2 {
                for oh in 0..ho {
                    for ow in 0..wo {
                        let mut best = (f64::NEG_INFINITY, 0);
                        for ki in 0..k.0 {
                            for kj in 0..k.1 {
                                let at = (c * h + oh * s.0 + ki) * w + ow * s.1 + kj;
                                if x[at] > best.0 {
                                    best = (x[at], at);
                                }
                            }
                        }
                        assert_eq!(fast[(c * ho + oh) * wo + ow] as usize, best.1 + 5);
                    }
                }
            }
        }
    }
}
