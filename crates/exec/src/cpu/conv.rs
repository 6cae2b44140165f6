//! im2col and col2im: the patch layout that turns a 2-D convolution into one GEMM per image.

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
    /// Output height and width, or `None` when the (dilated) kernel does not fit the padded input
    /// or a stride/dilation is zero.
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
        let eh = self.dh.checked_mul(self.kh - 1)? + 1;
        let ew = self.dw.checked_mul(self.kw - 1)? + 1;
        let hp = self.h.checked_add(self.ph.checked_mul(2)?)?;
        let wp = self.w.checked_add(self.pw.checked_mul(2)?)?;
        if hp < eh || wp < ew {
            return None;
        }
        Some(((hp - eh) / self.sh + 1, (wp - ew) / self.sw + 1))
    }

    /// Rows of the patch matrix: `c · kh · kw`.
    pub fn patch_len(&self) -> usize {
        self.c * self.kh * self.kw
    }

    /// For each kernel tap and output position, the input offset it reads (or `None` in padding):
    /// calls `f(row, col, Some(input_index))`.
    #[inline]
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
pub fn im2col<T: Float>(x: &[T], win: &Window, pad: T, cols: &mut [T]) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    let l = ho * wo;
    // Fast path: stride 1, no padding, no dilation — rows are shifted copies of input rows.
    if win.sh == 1 && win.sw == 1 && win.ph == 0 && win.pw == 0 && win.dh == 1 && win.dw == 1 {
        for c in 0..win.c {
            for ki in 0..win.kh {
                for kj in 0..win.kw {
                    let row = (c * win.kh + ki) * win.kw + kj;
                    for oh in 0..ho {
                        let src = (c * win.h + oh + ki) * win.w + kj;
                        let dst = row * l + oh * wo;
                        cols[dst..dst + wo].copy_from_slice(&x[src..src + wo]);
                    }
                }
            }
        }
        return;
    }
    win.for_each(|row, col, src| cols[row * l + col] = src.map_or(pad, |s| x[s]));
}

/// The adjoint of [`im2col`]: `x[src] += cols[row, col]` for every tap that reads `src`.
pub fn col2im<T: Float>(cols: &[T], win: &Window, x: &mut [T]) {
    let (ho, wo) = win.out_hw().expect("invariant: window checked before use");
    let l = ho * wo;
    win.for_each(|row, col, src| {
        if let Some(s) = src {
            x[s] += cols[row * l + col];
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn fast_path_matches_general() {
        let win = Window {
            c: 3,
            h: 6,
            w: 5,
            kh: 3,
            kw: 3,
            sh: 1,
            sw: 1,
            ph: 0,
            pw: 0,
            dh: 1,
            dw: 1,
        };
        let (ho, wo) = win.out_hw().unwrap();
        let x: Vec<f32> = (0..90).map(|i| i as f32).collect();
        let mut fast = vec![0.0; win.patch_len() * ho * wo];
        im2col(&x, &win, 0.0, &mut fast);
        let mut slow = vec![0.0; fast.len()];
        win.for_each(|row, col, src| slow[row * ho * wo + col] = src.map_or(0.0, |s| x[s]));
        assert_eq!(fast, slow);
    }
}
