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
    // Each output row of a kernel tap reads a run of one input row, every `step`-th element
    // (a shifted copy at stride 1), with `pad` where it hangs over an edge.
    for_each_tap_run(win, ho, wo, |r| {
        let dst = off + r.row * ld + r.oh * wo;
        let out = &mut cols[dst..dst + wo];
        match r.src {
            None => out.fill(pad),
            Some(src) => {
                out[..r.lo].fill(pad);
                out[r.hi..].fill(pad);
                let run = &mut out[r.lo..r.hi];
                if r.step == 1 {
                    zip_run(run, &x[src..src + run.len()], |o, v| *o = v);
                } else {
                    let from = &x[src..src + (run.len() - 1) * r.step + 1];
                    for (o, &v) in run.iter_mut().zip(from.iter().step_by(r.step)) {
                        *o = v;
                    }
                }
            }
        }
    });
}

/// The adjoint of [`im2col`]: `x[src] += cols[row, col]` for every tap that reads `src`.
pub fn col2im<T: Float>(cols: &[T], win: &Window, x: &mut [T]) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    col2im_ld(cols, win, x, (ho * wo, 0), |v| v);
}

/// One output row of one kernel tap: row `row` of the patch matrix, output row `oh`. Its
/// columns `lo..hi` read the input from `src` on, every `step`-th element (the horizontal
/// stride); the columns outside that range hang over the left or right edge. `src` is `None`
/// when the whole row reads padding (it hangs over the top or bottom edge, or `lo == hi`).
struct TapRun {
    row: usize,
    oh: usize,
    lo: usize,
    hi: usize,
    step: usize,
    src: Option<usize>,
}

/// Every [`TapRun`] of a window with output `ho × wo`, channel by channel and tap by tap (the
/// patch matrix's row order): the bounds im2col and col2im share.
fn for_each_tap_run(win: &Window, ho: usize, wo: usize, mut f: impl FnMut(TapRun)) {
    // The first output column at or past `edge` (in input columns, counted from the padded
    // left edge) for a tap `shift` columns in: ⌈(edge − shift) / stride⌉, 0 when the tap
    // starts past it. `out_hw` bounds every term, so nothing overflows.
    let first_past = |edge: usize, shift: usize| edge.saturating_sub(shift).div_ceil(win.sw);
    for c in 0..win.c {
        for ki in 0..win.kh {
            for kj in 0..win.kw {
                let row = (c * win.kh + ki) * win.kw + kj;
                let shift = kj * win.dw;
                // Output columns ow whose input column ow·sw + kj·dw − pw lies inside [0, w).
                let lo = first_past(win.pw, shift).min(wo);
                let hi = first_past(win.w + win.pw, shift).min(wo).max(lo);
                for oh in 0..ho {
                    let ih = (oh * win.sh + ki * win.dh) as isize - win.ph as isize;
                    let inside = ih >= 0 && (ih as usize) < win.h && hi > lo;
                    let src = inside
                        .then(|| (c * win.h + ih as usize) * win.w + lo * win.sw + shift - win.pw);
                    f(TapRun {
                        row,
                        oh,
                        lo,
                        hi,
                        step: win.sw,
                        src,
                    });
                }
            }
        }
    }
}

/// `f(&mut dst[i], src[i])` over one row of a patch (a few dozen elements at most), in fixed
/// blocks of four that compile to vector code: a plain loop over a run shorter than its vector
/// width falls through to the scalar tail, and `copy_from_slice` would call `memcpy`, whose call
/// costs more than such a copy.
#[inline(always)]
fn zip_run<D, S: Copy>(dst: &mut [D], src: &[S], f: impl Fn(&mut D, S)) {
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

/// [`col2im`] from a wider matrix: row `r` of the patch matrix starts at `off + r·ld`.
fn col2im_ld<S: Copy, T: Float>(
    cols: &[S],
    win: &Window,
    x: &mut [T],
    (ld, off): (usize, usize),
    widen: impl Fn(S) -> T,
) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    // The mirror of im2col's runs: each output row of a kernel tap adds into every `step`-th
    // element of a run of one input row.
    for_each_tap_run(win, ho, wo, |r| {
        if let Some(src) = r.src {
            let dst = off + r.row * ld + r.oh * wo;
            let run = &cols[dst + r.lo..dst + r.hi];
            if r.step == 1 {
                zip_run(&mut x[src..src + run.len()], run, |o, v| *o += widen(v));
            } else {
                let to = &mut x[src..src + (run.len() - 1) * r.step + 1];
                for (o, &v) in to.iter_mut().step_by(r.step).zip(run) {
                    *o += widen(v);
                }
            }
        }
    });
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
/// backward). When the indices of consecutive chunks of `g` fall in ordered, disjoint ranges of
/// `out` — as pooling's do, window after window — each thread clears and fills its own range
/// of `out`; otherwise one thread does all of it.
pub fn put_into<T: Storage>(g: &[T], idx: &[u32], out: &mut [T], threads: usize) {
    let n = g.len().min(idx.len());
    let t = if n >= super::par::PAR_MIN_ELEMS {
        threads.clamp(1, n)
    } else {
        1
    };
    if t > 1 {
        let per = n.div_ceil(t);
        let ranges: Vec<(usize, usize)> = idx[..n]
            .chunks(per)
            .map(|c| {
                let lo = c.iter().copied().min().unwrap_or(0) as usize;
                let hi = c.iter().copied().max().unwrap_or(0) as usize;
                (lo, hi)
            })
            .collect();
        let ordered = ranges.windows(2).all(|w| w[0].1 < w[1].0)
            && ranges.last().is_some_and(|r| r.1 < out.len());
        if ordered {
            // Chunk j writes inside [start_j, start_{j+1}): start_0 = 0, start_j = its lowest
            // index, and the last range runs to the end of `out`.
            let mut parts = Vec::with_capacity(ranges.len());
            let mut rest = out;
            let mut start = 0;
            for j in 0..ranges.len() {
                let end = ranges.get(j + 1).map_or(start + rest.len(), |r| r.0);
                let (part, tail) = rest.split_at_mut(end - start);
                parts.push((start, part));
                rest = tail;
                start = end;
            }
            super::thread_pool::for_each_owned(parts, |j, (start, part)| {
                part.fill(T::narrow(0.0));
                let (lo, hi) = (j * per, ((j + 1) * per).min(n));
                for (&v, &k) in g[lo..hi].iter().zip(&idx[lo..hi]) {
                    let at = k as usize - *start;
                    part[at] = T::sum_of(part[at], v);
                }
            });
            return;
        }
    }
    out.fill(T::narrow(0.0));
    put_add(&g[..n], &idx[..n], out);
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

/// A convolution's output `y` `[n, o, l]` from its products laid out position-major, `rows`
/// `[n·l, o]` (`colsᵀ·wᵀ`), with `bias` (`[o]`) added and each value rounded once to `H`.
/// Images split over threads; each image's `[l, o]` block is read a band of positions at a
/// time, so that its lines stay in the cache while the band's channels are written.
pub fn conv_out_from_rows<H: Storage + Send>(
    rows: &[f32],
    bias: Option<&[f32]>,
    d: ConvDims,
    y: &mut [H],
    threads: usize,
) {
    let ConvDims { o, l, n, .. } = d;
    assert!(
        rows.len() >= n * l * o && y.len() >= n * o * l && bias.is_none_or(|b| b.len() >= o),
        "invariant: convolution output out of bounds"
    );
    const BAND: usize = 64;
    super::par::par_rows_mut(
        &mut y[..n * o * l],
        o * l,
        threads,
        super::par::PAR_MIN_ELEMS,
        |b, yb| {
            let src = &rows[b * l * o..(b + 1) * l * o];
            let mut tmp = [0f32; BAND];
            for p0 in (0..l).step_by(BAND) {
                let band = BAND.min(l - p0);
                for c in 0..o {
                    let add = bias.map_or(0.0, |bv| bv[c]);
                    for (q, t) in tmp[..band].iter_mut().enumerate() {
                        *t = src[(p0 + q) * o + c] + add;
                    }
                    H::store_f32(&tmp[..band], &mut yb[c * l + p0..c * l + p0 + band]);
                }
            }
        },
    );
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

/// The largest patch matrix of one image (`k·l` elements) that [`conv_im2col_gemm_forward`]
/// makes in a thread's scratch: 4 MiB of f32, within a core's L2 here, so that the product reads
/// it from the cache; larger ones are made batch-wide first ([`im2col_batch`]).
const FUSED_MAX: usize = 1 << 20;

/// Whether a convolution of these dimensions runs [`conv_im2col_gemm_forward`]: fewer than 64
/// output channels (a product that reads each patch value only `o` times, so that it runs at
/// the speed its operand arrives: 40 GFLOP/s on one thread from memory against 150 from the
/// cache, for 32 channels), and one image's patches fit `FUSED_MAX` (4 MiB of f32). With 64
/// channels or more the batch-wide pass measured as fast or faster.
///
/// And more than one output position per image: with one, the kernel's patches have a row
/// stride of 1 where the batch-wide matrix's is `n`, and a product of at most four channels
/// would sum them by another path (dot products), whose bits differ.
pub fn conv_fuses(d: ConvDims) -> bool {
    d.o < 64 && d.l > 1 && d.k.saturating_mul(d.l) <= FUSED_MAX
}

/// A pointer to the patch matrix shared by the threads of [`conv_im2col_gemm_forward`], each
/// writing the columns of its own images.
struct ColsOut<T>(*mut T);

// SAFETY: the pointer is only written through by `conv_im2col_gemm_forward`'s threads, each into
// the columns of its own images (disjoint ranges of one `&mut` buffer that outlives the fork);
// `T: Send` values may be written from other threads.
unsafe impl<T: Send> Send for ColsOut<T> {}
// SAFETY: as above; no thread reads through the pointer what another writes.
unsafe impl<T: Send> Sync for ColsOut<T> {}

/// Copies `src` to `dst` with non-temporal stores where the CPU has them (every x86-64): the
/// patches are read again only by the backward, long after, so they need not pass through the
/// cache, and a store that goes around it reads no line first (the copy measured about 6% of a
/// U-Net step with ordinary stores). [`store_fence`] before anyone else reads `dst`.
///
/// # Safety
///
/// `dst` must be valid for writes of `src.len()` elements and not overlap `src`.
unsafe fn copy_streaming<T: Copy>(src: &[T], dst: *mut T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let bytes = std::mem::size_of_val(src);
        let (s, d) = (src.as_ptr().cast::<u8>(), dst.cast::<u8>());
        let head = d.align_offset(16).min(bytes);
        // SAFETY: the caller's contract: `[d, d + bytes)` is writable and disjoint from
        // `[s, s + bytes)`; every access below stays within them, and the streamed stores are
        // to 16-byte aligned addresses (`head` aligns `d`), as `movntdq` requires. SSE2 is part
        // of every x86-64.
        unsafe {
            std::ptr::copy_nonoverlapping(s, d, head);
            let mut i = head;
            while i + 16 <= bytes {
                _mm_stream_si128(d.add(i).cast::<__m128i>(), _mm_loadu_si128(s.add(i).cast()));
                i += 16;
            }
            std::ptr::copy_nonoverlapping(s.add(i), d.add(i), bytes - i);
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
    };
}

/// Orders this thread's non-temporal stores ([`copy_streaming`]) before its later stores, so
/// that the fork's join publishes them.
fn store_fence() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `sfence` has no operands and is part of every x86-64 (SSE).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// [`im2col_batch`] and [`conv_gemm_forward`] in one pass over the images: each image's patches
/// `[k, l]` are made in the thread's scratch, multiplied from there while they are in its cache,
/// then copied into their columns of `cols` (`[k, n·l]`, as `im2col_batch` lays them out, kept for
/// the backward). `x` is `[n, c, h, w]`; `y`, `w` and `bias` as in `conv_gemm_forward`. The
/// values are `conv_gemm_forward`'s after `im2col_batch`, bit for bit (the same product of the
/// same operands, one thread each), where [`conv_fuses`] chooses it. Images split over threads.
#[allow(clippy::too_many_arguments)]
pub fn conv_im2col_gemm_forward<T: Float + Gemm>(
    x: &[T],
    win: &Window,
    w: &[T],
    bias: Option<&[T]>,
    d: ConvDims,
    cols: &mut [T],
    y: &mut [T],
    threads: usize,
) {
    let ConvDims { o, k, l, n } = d;
    d.check(w.len(), cols.len(), y.len());
    let plane = win.h * win.w;
    assert!(
        win.out_hw().map(|(ho, wo)| ho * wo) == Some(l)
            && win.patch_len() == k
            && x.len() >= n * win.c * plane
            && bias.is_none_or(|b| b.len() >= o),
        "invariant: convolution operand out of bounds"
    );
    if o == 0 || l == 0 {
        // Nothing to multiply; the patches are still the backward's.
        im2col_batch(x, n, win, T::ZERO, cols, threads);
        return;
    }
    let one = Window { c: 1, ..*win };
    let rows = win.kh * win.kw;
    let ld = n * l;
    let out = ColsOut(cols.as_mut_ptr());
    let out = &out;
    super::par::par_rows_mut(
        &mut y[..n * o * l],
        o * l,
        threads,
        super::par::PAR_MIN_ELEMS,
        |b, yb| {
            T::with_scratch(k * l, |s| {
                for c in 0..win.c {
                    let img = &x[(b * win.c + c) * plane..(b * win.c + c + 1) * plane];
                    im2col_ld(
                        img,
                        &one,
                        T::ZERO,
                        &mut s[c * rows * l..(c + 1) * rows * l],
                        l,
                        0,
                    );
                }
                if let Some(bias) = bias {
                    for (row, &v) in yb.chunks_mut(l).zip(bias) {
                        row.fill(v);
                    }
                }
                super::gemm(
                    super::Mnk::new(o, k, l),
                    super::MatView::row_major(w, 0, k, false),
                    super::MatView::row_major(s, 0, l, false),
                    yb,
                    bias.is_some(),
                    1,
                );
                for (r, src) in s.chunks_exact(l).enumerate() {
                    // SAFETY: `cols` holds at least `k·n·l` elements (`d.check`), and row `r < k`
                    // of image `b < n` is `[r·n·l + b·l, r·n·l + (b + 1)·l)`, inside it; only
                    // this thread (the one given image `b`) writes it, nobody reads it during
                    // the fork, and `src` (the scratch) does not overlap `cols`.
                    unsafe { copy_streaming(src, out.0.add(r * ld + b * l)) };
                }
                store_fence();
            })
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass convolution gives the two passes' patches and outputs bit for bit: padded,
    /// strided and dilated windows, with and without a bias, one to three threads (the largest
    /// batch past the size that splits over them), no output channels, an empty batch.
    #[test]
    fn the_one_pass_convolution_is_the_two_passes() {
        // One output position per image takes another product path in the one-pass kernel:
        // the batch-wide passes are chosen there.
        assert!(!conv_fuses(ConvDims {
            o: 3,
            k: 2,
            l: 1,
            n: 3
        }));
        assert!(conv_fuses(ConvDims {
            o: 3,
            k: 2,
            l: 2,
            n: 3
        }));
        let val = |i: usize, s: f32| ((i as f32 * s).sin() * 8.0).round() / 8.0 + 0.001 * s;
        let wins = [
            (3, 6, 7, (3, 3), (1, 1), (1, 1), (1, 1)),
            (2, 9, 8, (3, 2), (2, 1), (0, 2), (1, 2)),
            (4, 5, 5, (1, 1), (1, 1), (0, 0), (1, 1)),
            (1, 7, 9, (2, 3), (3, 2), (2, 1), (2, 1)),
        ];
        let (sizes, thread_counts): (&[(usize, usize)], &[usize]) = if cfg!(miri) {
            (&[(2, 2)], &[2])
        } else {
            (&[(3, 5), (0, 3), (2, 0), (96, 48)], &[1, 2, 3])
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
                let x: Vec<f32> = (0..n * c * h * wd).map(|i| val(i, 0.37)).collect();
                let w: Vec<f32> = (0..o * k).map(|i| val(i, 0.53)).collect();
                let bias: Vec<f32> = (0..o).map(|i| val(i, 1.7)).collect();
                let d = ConvDims { o, k, l, n };
                for &threads in thread_counts {
                    for b in [None, Some(&bias[..])] {
                        let mut cols = vec![f32::NAN; k * n * l];
                        let mut y = vec![f32::NAN; n * o * l];
                        im2col_batch(&x, n, &win, 0.0, &mut cols, threads);
                        conv_gemm_forward(&w, &cols, b, d, &mut y, threads);
                        let mut cols1 = vec![f32::NAN; k * n * l];
                        let mut y1 = vec![f32::NAN; n * o * l];
                        conv_im2col_gemm_forward(&x, &win, &w, b, d, &mut cols1, &mut y1, threads);
                        let what =
                            format!("{win:?} n {n} o {o} threads {threads} bias {}", b.is_some());
                        for (name, got, want) in [("patches", &cols1, &cols), ("outputs", &y1, &y)]
                        {
                            let first = got
                                .iter()
                                .zip(want.iter())
                                .position(|(a, b)| a.to_bits() != b.to_bits());
                            assert_eq!(first, None, "{name} differ first at that index, {what}");
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
        let n = crate::cpu::par::PAR_MIN_ELEMS * 2 + 5;
        let g: Vec<f64> = (0..n).map(|i| (i as f64 * 0.7).sin()).collect();
        // Pooling-like indices (increasing, some gaps) and scattered ones with repeats.
        let ordered: Vec<u32> = (0..n as u32).map(|i| i * 4 + (i % 3)).collect();
        let scattered: Vec<u32> = (0..n as u32).map(|i| (i * 7919) % (n as u32 / 2)).collect();
        for idx in [&ordered, &scattered] {
            let len = *idx.iter().max().unwrap() as usize + 3;
            let mut want = vec![0.0; len];
            put_add(&g, idx, &mut want);
            for threads in [1, 2, 3] {
                let mut got = vec![f64::NAN; len];
                put_into(&g, idx, &mut got, threads);
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
