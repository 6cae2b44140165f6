//! bf16 convolutions on the host that keep no patch matrix, as the f32 ones
//! ([`crate::cpu::patch_products`], [`crate::cpu::fold_products`]): each image's patches are
//! made in the thread's memory and multiplied while they are in its cache by [`gemm_bf16`]
//! (bf16 pairs, f32 sums). Every result is rounded to bf16 once, from its f32 sum: an output
//! after its bias is added, a weight gradient after the images' sums are added, an input
//! gradient after its patches are folded (the batch-wide form rounded the patches of the input
//! gradient to bf16 before folding them).
//!
//! The weight gradient is summed per block of images, a number of blocks fixed by the batch
//! (as the f32 form), the blocks' sums added in block order: the bits do not depend on the
//! number of threads, and the product's do not depend on the SIMD level (its definition).

use half::bf16;

use super::{gemm_bf16, to_bf16};
use crate::cpu::cast::Storage;
use crate::cpu::conv::{col2im, im2col, ConvDims, Window, WEIGHT_GRAD_BLOCKS};
use crate::cpu::matmul::{MatView, Mnk};
use crate::cpu::Gemm;

/// `out_b = w·P_b + bias`, rounded once to bf16.
pub struct PatchProduct<'a> {
    /// `[o, k]`.
    pub w: &'a [bf16],
    /// `[o]`, widened.
    pub bias: Option<&'a [f32]>,
    /// `[n, o, l]`.
    pub out: &'a mut [bf16],
}

/// `dw = Σ_b a_b·P_bᵀ`, rounded once to bf16.
pub struct PatchWeightGrad<'a> {
    /// `[n, o, l]`: the output's gradient.
    pub a: &'a [bf16],
    /// `[o, k]`.
    pub dw: &'a mut [bf16],
}

/// One image's work: the product into `out` and the block's weight-gradient sum `part`
/// (`[k, o]`, overwritten at the block's first image).
type Job<'a> = (usize, usize, Option<&'a mut [bf16]>, &'a mut [f32]);

/// The bf16 form of [`crate::cpu::patch_products`]: the convolution's output and/or its
/// weight's gradient from the patches of `src` (`[n, win.c, win.h, win.w]`) under `win`.
pub fn patch_products(
    src: &[bf16],
    win: &Window,
    d: ConvDims,
    mut product: Option<PatchProduct<'_>>,
    weight_grad: Option<PatchWeightGrad<'_>>,
    threads: usize,
) {
    let ConvDims { o, k, l, n } = d;
    let plane = win.c * win.h * win.w;
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
    let (dw, a) = match weight_grad {
        Some(g) => (Some(&mut g.dw[..o * k]), g.a),
        None => (None, &[][..]),
    };
    if n == 0 || k == 0 || l == 0 || o == 0 {
        // Every product is empty: the output is its bias, the gradient zero.
        if let Some(p) = product {
            for (r, row) in p.out[..n * o * l].chunks_mut(l.max(1)).enumerate() {
                row.fill(to_bf16(p.bias.map_or(0.0, |b| b[r % o])));
            }
        }
        if let Some(dw) = dw {
            dw.fill(bf16::ZERO);
        }
        return;
    }
    let want_dw = dw.is_some();
    let per = if want_dw {
        n.div_ceil(WEIGHT_GRAD_BLOCKS.min(n))
    } else {
        1
    };
    let blocks = n.div_ceil(per);
    let mut partials = if want_dw {
        vec![0f32; blocks * o * k]
    } else {
        Vec::new()
    };
    let w_bias = product.as_ref().map(|p| (p.w, p.bias));
    let t = if n * (plane + o * l) >= crate::cpu::par::PAR_MIN_ELEMS {
        threads.clamp(1, blocks)
    } else {
        1
    };
    // Whole blocks to each thread: its images' outputs and its blocks' sums.
    let mut out_rest: Option<&mut [bf16]> = product.as_mut().map(|p| &mut p.out[..n * o * l]);
    let mut part_rest: &mut [f32] = &mut partials;
    let mut jobs: Vec<Job<'_>> = Vec::with_capacity(t);
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
    let run = |_: usize, job: &mut Job<'_>| {
        let (b0, b1) = (job.0, job.1);
        let i0 = b0 * per;
        let mut patches = vec![bf16::ZERO; k * l];
        f32::with_scratch(if w_bias.is_some() { o * l } else { 0 }, |sums| {
            for blk in b0..b1 {
                for b in blk * per..((blk + 1) * per).min(n) {
                    im2col(
                        &src[b * plane..(b + 1) * plane],
                        win,
                        bf16::ZERO,
                        &mut patches,
                    );
                    if let (Some(out), Some((w, bias))) = (job.2.as_deref_mut(), w_bias) {
                        let out_b = &mut out[(b - i0) * o * l..][..o * l];
                        gemm_bf16(
                            Mnk::new(o, k, l),
                            MatView::row_major(w, 0, k, false),
                            MatView::row_major(&patches, 0, l, false),
                            sums,
                            false,
                            1,
                        );
                        // Each channel's row plus its bias, rounded, in one pass at the
                        // widest vector level (the bias loop alone had run at the baseline's).
                        let rows = sums.chunks_exact_mut(l).zip(out_b.chunks_exact_mut(l));
                        crate::cpu::wide::wide(
                            o * l,
                            #[inline(always)]
                            move || {
                                for (c, (row, y)) in rows.enumerate() {
                                    if let Some(bias) = bias {
                                        let add = bias[c];
                                        row.iter_mut().for_each(|v| *v += add);
                                    }
                                    bf16::store_block(row, y);
                                }
                            },
                        );
                    }
                    if want_dw {
                        let part = &mut job.3[(blk - b0) * o * k..][..o * k];
                        gemm_bf16(
                            Mnk::new(k, l, o),
                            MatView::row_major(&patches, 0, l, false),
                            MatView::row_major(a, b * o * l, l, true),
                            part,
                            b != blk * per,
                            1,
                        );
                    }
                }
            }
        })
    };
    if t <= 1 {
        jobs.iter_mut().for_each(|j| run(0, j));
    } else {
        crate::cpu::thread_pool::for_each_owned(jobs, run);
    }
    if let Some(dw) = dw {
        // The blocks' sums added in block order into the first, then transposed and rounded.
        let (sum, rest) = partials.split_at_mut(o * k);
        for p in rest.chunks_exact(o * k) {
            for (acc, &v) in sum.iter_mut().zip(p) {
                *acc += v;
            }
        }
        for (r, row) in dw.chunks_exact_mut(k).enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                *x = to_bf16(sum[j * o + r]);
            }
        }
    }
}

/// The bf16 form of [`crate::cpu::fold_products`] without a bias: `y_b = col2im(wᵀ·a_b)`, a
/// convolution's input gradient (`a` its output's gradient `[n, o, l]`, `w` `[o, k]`, `y`
/// `[n, win.c, win.h, win.w]`), each image's patches and fold in f32, rounded once.
pub fn fold_products(
    a: &[bf16],
    w: &[bf16],
    win: &Window,
    d: ConvDims,
    y: &mut [bf16],
    threads: usize,
) {
    let ConvDims { o, k, l, n } = d;
    let plane = win.c * win.h * win.w;
    assert!(
        win.out_hw().map(|(ho, wo)| ho * wo) == Some(l)
            && win.patch_len() == k
            && a.len() >= n * o * l
            && w.len() >= o * k
            && y.len() >= n * plane,
        "invariant: convolution operand out of bounds"
    );
    if plane == 0 {
        return;
    }
    crate::cpu::par::par_rows_mut(
        &mut y[..n * plane],
        plane,
        threads,
        crate::cpu::par::PAR_MIN_ELEMS,
        |b, yb| {
            if k == 0 || l == 0 || o == 0 {
                yb.fill(bf16::ZERO);
                return;
            }
            f32::with_scratch(k * l + plane, |s| {
                let (patches, image) = s.split_at_mut(k * l);
                gemm_bf16(
                    Mnk::new(k, o, l),
                    MatView::row_major(w, 0, k, true),
                    MatView::row_major(a, b * o * l, l, false),
                    patches,
                    false,
                    1,
                );
                image.fill(0.0);
                col2im(patches, win, image);
                bf16::store_f32(image, yb);
            })
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::bf16::from_bf16;

    fn values(len: usize, seed: u32) -> Vec<bf16> {
        (0..len as u32)
            .map(|i| {
                let h = (i ^ seed).wrapping_mul(2654435761) >> 16;
                to_bf16((h % 201) as f32 / 50.0 - 2.0)
            })
            .collect()
    }

    /// 3×3 taps, stride 2, padding 1 over `c` channels of `h × w`.
    fn window(c: usize, h: usize, w: usize) -> Window {
        Window {
            c,
            h,
            w,
            kh: 3,
            kw: 3,
            sh: 2,
            sw: 2,
            ph: 1,
            pw: 1,
            dh: 1,
            dw: 1,
        }
    }

    /// The operands of a small convolution: input, weight, output gradient, bias.
    struct Case {
        win: Window,
        d: ConvDims,
        x: Vec<bf16>,
        w: Vec<bf16>,
        gy: Vec<bf16>,
        bias: Vec<f32>,
    }

    fn case(n: usize, c: usize, o: usize, (h, w): (usize, usize)) -> Case {
        let win = window(c, h, w);
        let (ho, wo) = win.out_hw().unwrap();
        let d = ConvDims {
            o,
            k: win.patch_len(),
            l: ho * wo,
            n,
        };
        Case {
            win,
            d,
            x: values(n * c * h * w, 1),
            w: values(o * d.k, 2),
            gy: values(n * o * d.l, 3),
            bias: (0..o).map(|i| i as f32 * 0.25 - 0.5).collect(),
        }
    }

    /// The output, weight gradient and input gradient in f64 from the definition (each image's
    /// patches, then sums over them).
    fn reference(t: &Case) -> [Vec<f64>; 3] {
        let ConvDims { o, k, l, n } = t.d;
        let plane = t.win.c * t.win.h * t.win.w;
        let wide = |v: &[bf16]| {
            v.iter()
                .map(|&h| f64::from(from_bf16(h)))
                .collect::<Vec<_>>()
        };
        let (x, w, gy) = (wide(&t.x), wide(&t.w), wide(&t.gy));
        let mut y = vec![0f64; n * o * l];
        let mut dw = vec![0f64; o * k];
        let mut dx = vec![0f64; n * plane];
        for b in 0..n {
            let mut p = vec![0f64; k * l];
            im2col(&x[b * plane..][..plane], &t.win, 0.0, &mut p);
            let mut dcols = vec![0f64; k * l];
            for oc in 0..o {
                for pos in 0..l {
                    let g = gy[(b * o + oc) * l + pos];
                    let mut s = f64::from(t.bias[oc]);
                    for kk in 0..k {
                        s += w[oc * k + kk] * p[kk * l + pos];
                        dw[oc * k + kk] += g * p[kk * l + pos];
                        dcols[kk * l + pos] += w[oc * k + kk] * g;
                    }
                    y[(b * o + oc) * l + pos] = s;
                }
            }
            col2im(&dcols, &t.win, &mut dx[b * plane..][..plane]);
        }
        [y, dw, dx]
    }

    /// The first element of `got` farther from `want` than PyTorch's bf16 tolerance (atol
    /// 1e-2, rtol 1.6e-2).
    fn off(got: &[bf16], want: &[f64]) -> Option<usize> {
        assert_eq!(got.len(), want.len());
        got.iter().zip(want).position(|(&g, &e)| {
            let g = f64::from(from_bf16(g));
            (g - e).abs() > 1e-2 + 1.6e-2 * e.abs()
        })
    }

    /// The kernels on `t`: output, weight gradient, input gradient.
    fn run(t: &Case, threads: usize) -> [Vec<bf16>; 3] {
        let ConvDims { o, k, l, n } = t.d;
        let mut y = vec![bf16::ZERO; n * o * l];
        let mut dw = vec![bf16::ZERO; o * k];
        let mut dx = vec![bf16::ZERO; t.x.len()];
        let product = PatchProduct {
            w: &t.w,
            bias: Some(&t.bias),
            out: &mut y,
        };
        patch_products(&t.x, &t.win, t.d, Some(product), None, threads);
        let grad = PatchWeightGrad {
            a: &t.gy,
            dw: &mut dw,
        };
        patch_products(&t.x, &t.win, t.d, None, Some(grad), threads);
        fold_products(&t.gy, &t.w, &t.win, t.d, &mut dx, threads);
        [y, dw, dx]
    }

    #[test]
    fn products_match_the_definition_with_the_same_bits_on_every_thread_count() {
        // The last is large enough for the threads to split it (each kernel's threshold); Miri
        // interprets a smaller one (on one thread: too small to split).
        let (cases, threads): (&[_], &[usize]) = if cfg!(miri) {
            (&[(2, 2, 3, (7, 6))], &[2])
        } else {
            (
                &[
                    (5, 3, 4, (7, 6)),
                    (9, 2, 70, (7, 6)),
                    (1, 1, 1, (7, 6)),
                    (17, 5, 8, (30, 28)),
                ],
                &[2, 3, 8],
            )
        };
        for &(n, c, o, hw) in cases {
            let t = case(n, c, o, hw);
            let want = reference(&t);
            let first = run(&t, 1);
            for (what, (got, want)) in ["y", "dw", "dx"].iter().zip(first.iter().zip(&want)) {
                assert_eq!(off(got, want), None, "{what} of {n}×{c} → {o}");
            }
            if hw == (30, 28) {
                // Both kernels split this one over the threads.
                let min = crate::cpu::par::PAR_MIN_ELEMS;
                assert!(t.x.len() >= min && t.x.len() + n * o * t.d.l >= min);
            }
            let bits = |r: &[Vec<bf16>; 3]| {
                r.each_ref()
                    .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            };
            for &threads in threads {
                assert!(
                    bits(&run(&t, threads)) == bits(&first),
                    "{threads} threads changed the bits"
                );
            }
        }
    }

    /// The comparison above catches a weight gradient missing one image's share.
    #[test]
    fn a_missing_image_is_caught() {
        let t = case(3, 2, 2, (7, 6));
        let [_, want, _] = reference(&t);
        let mut short = vec![bf16::ZERO; t.d.o * t.d.k];
        let grad = PatchWeightGrad {
            a: &t.gy,
            dw: &mut short,
        };
        let d = ConvDims { n: 2, ..t.d };
        patch_products(&t.x, &t.win, d, None, Some(grad), 1);
        assert!(off(&short, &want).is_some());
    }
}
