//! Convolution and pooling over `[N, C, H, W]` images.
//!
//! One primitive, `unfold` (im2col: every kernel-sized patch laid out as a column), and its
//! adjoint `fold` (col2im) carry convolution and average pooling: a convolution is `unfold`
//! followed by a batched GEMM with the weight, average pooling is `unfold` followed by a mean over
//! the patch axis, and their gradients (and second derivatives) come from ops that already have
//! them. Max pooling is its own op: it keeps the argmax of each window as an index buffer in the
//! arena, and its backward scatters through it (the first maximum of a window takes the gradient,
//! as in PyTorch).

use std::sync::Arc;

use arenagrad_alloc::BufId;
use arenagrad_exec::cpu::{self, Window};
use arenagrad_exec::Float;
use smallvec::{smallvec, SmallVec};

use super::shape::{both, moves, KernelArgs};
use super::{check_pair, Ctx, Grads, Op};
use crate::device::on_cuda;
use crate::error::{GraphError, Result};
use crate::graph::NodeId;
use crate::shape::{checked_numel, copy_of, Shape};
use crate::{DType, Device, Tensor};

fn window(
    op: &'static str,
    shape: &[usize],
    k: (usize, usize),
    s: (usize, usize),
    p: (usize, usize),
    d: (usize, usize),
) -> Result<Window> {
    if shape.len() != 4 {
        return Err(GraphError::BadArgument {
            op,
            what: "expects an input of shape [N, C, H, W]",
        });
    }
    let win = Window {
        c: shape[1],
        h: shape[2],
        w: shape[3],
        kh: k.0,
        kw: k.1,
        sh: s.0,
        sw: s.1,
        ph: p.0,
        pw: p.1,
        dh: d.0,
        dw: d.1,
    };
    if win.out_hw().is_none() {
        return Err(GraphError::BadArgument {
            op,
            what: "kernel, stride, padding or dilation do not fit the input (stride and dilation must be ≥ 1)",
        });
    }
    Ok(win)
}

/// A bf16 convolution on the host without a patch matrix ([`cpu::bf16::conv::patch_products`]):
/// input `xb` `[n, c, h, w]`, weight `wb` `[o, k]`, optional bias `bb` `[o]`, output `out`
/// `[n, o, l]`.
fn conv_bf16(
    i: &mut crate::graph::Inner,
    [xb, wb, out]: [BufId; 3],
    bb: Option<BufId>,
    win: Window,
    d: cpu::ConvDims,
) -> Result<()> {
    use arenagrad_exec::bf16;
    let op = "conv2d";
    let threads = i.threads;
    let bias = match bb {
        Some(bb) => Some(cpu::cast::widened(
            i.arena
                .slice::<bf16>(bb)
                .map_err(|source| GraphError::Alloc { op, source })?,
        )),
        None => None,
    };
    let (y, [xv, wv]) = i.split_mut::<bf16, 2>(op, out, [xb, wb])?;
    let product = cpu::bf16::conv::PatchProduct {
        w: wv,
        bias: bias.as_deref(),
        out: y,
    };
    cpu::bf16::conv::patch_products(xv, &win, d, Some(product), None, threads);
    Ok(())
}

impl<'g> Tensor<'g> {
    /// im2col: `[N, C, H, W]` → `[N, C·kh·kw, Ho·Wo]`, zero padding outside the image.
    pub fn unfold2d(
        self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
    ) -> Result<Tensor<'g>> {
        let op = "unfold";
        let shape = self.try_shape()?;
        let win = window(op, &shape, kernel, stride, padding, dilation)?;
        self.unfold_win(win, shape[0])
    }

    /// col2im, the adjoint of [`Tensor::unfold2d`] (PyTorch's `F.fold`): patches `[N, C·kh·kw,
    /// L]` summed into an image `[N, C, H, W]` of `output` size `(H, W)`, where `L` is the
    /// number of windows `unfold2d` makes of such an image. Overlapping windows add.
    pub fn fold2d(
        self,
        output: (usize, usize),
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
    ) -> Result<Tensor<'g>> {
        let op = "fold";
        let shape = self.try_shape()?;
        let patch = kernel.0.saturating_mul(kernel.1);
        let &[n, rows, l] = &shape[..] else {
            return Err(GraphError::BadArgument {
                op,
                what: "expects patches of shape [N, C·kh·kw, L]",
            });
        };
        if patch == 0 || !rows.is_multiple_of(patch) {
            return Err(GraphError::BadArgument {
                op,
                what: "the patch rows must be a multiple of kh·kw",
            });
        }
        let image = [n, rows / patch, output.0, output.1];
        let win = window(op, &image, kernel, stride, padding, dilation)?;
        let (ho, wo) = win.out_hw().expect("invariant: checked window");
        if ho.checked_mul(wo) != Some(l) {
            return Err(GraphError::ShapeMismatch {
                op,
                lhs: shape.to_vec(),
                rhs: image.to_vec(),
            });
        }
        self.fold_win(win, n)
    }

    fn unfold_win(self, win: Window, n: usize) -> Result<Tensor<'g>> {
        let threads = self.g.threads();
        let (ho, wo) = win.out_hw().expect("invariant: checked window");
        let out: Shape = smallvec![n, win.patch_len(), ho * wo];
        checked_numel("unfold", &out)?;
        self.data_op("unfold", out, Op::Unfold(Arc::new(win)), false, move |a| {
            a.unfold(&win, threads)
        })
    }

    fn fold_win(self, win: Window, n: usize) -> Result<Tensor<'g>> {
        let threads = self.g.threads();
        let out: Shape = smallvec![n, win.c, win.h, win.w];
        checked_numel("fold", &out)?;
        self.data_op("fold", out, Op::Fold(Arc::new(win)), true, move |a| {
            a.fold(&win, threads)
        })
    }

    /// im2col of the batch into one `[C·kh·kw, N·Ho·Wo]` matrix (host tensors only).
    fn unfold_batch_win(self, win: Window, n: usize) -> Result<Tensor<'g>> {
        let threads = self.g.threads();
        let (ho, wo) = win.out_hw().expect("invariant: checked window");
        let out: Shape = smallvec![win.patch_len(), n * ho * wo];
        checked_numel("unfold_batch", &out)?;
        self.data_op(
            "unfold_batch",
            out,
            Op::UnfoldBatch(Arc::new(win)),
            false,
            move |a| a.unfold_batch(&win, n, threads),
        )
    }

    /// `w · cols_b (+ bias)` for each of the `n` images of a patch matrix `self` `[k, n·l]`,
    /// image-major: output `[n, o, l]`, `w` `[o, k]`, `bias` `[o]` (host only).
    fn conv_gemm(
        self,
        w: Tensor<'g>,
        bias: Option<Tensor<'g>>,
        n: usize,
        l: usize,
    ) -> Result<Tensor<'g>> {
        let op = "conv2d";
        check_pair(op, &self, &w)?;
        if let Some(b) = bias {
            check_pair(op, &self, &b)?;
        }
        let (ws, cs) = (w.try_shape()?, self.try_shape()?);
        let bad = || GraphError::ShapeMismatch {
            op,
            lhs: ws.to_vec(),
            rhs: cs.to_vec(),
        };
        let &[o, k] = &ws[..] else {
            return Err(bad());
        };
        if cs[..] != [k, n * l] {
            return Err(bad());
        }
        let shape: Shape = smallvec![n, o, l];
        let len = checked_numel(op, &shape)?;
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (dtype, [cb, wb], bb) = operand_bufs(i, op, [self, w], bias)?;
        let out = i.alloc(op, dtype, len)?;
        let threads = i.threads;
        let d = cpu::ConvDims { o, k, l, n };
        with_float!(dtype, T, {
            match bb {
                Some(bb) => {
                    let (y, [wv, cv, bv]) = i.split_mut::<T, 3>(op, out, [wb, cb, bb])?;
                    cpu::conv_gemm_forward(wv, cv, Some(bv), d, y, threads);
                }
                None => {
                    let (y, [wv, cv]) = i.split_mut::<T, 2>(op, out, [wb, cb])?;
                    cpu::conv_gemm_forward(wv, cv, None, d, y, threads);
                }
            }
        });
        let inputs: SmallVec<[NodeId; 3]> = match bias {
            Some(b) => smallvec![w.id, self.id, b.id],
            None => smallvec![w.id, self.id],
        };
        let id = i.push(shape, dtype, out, Op::Conv2d { n, l }, &inputs);
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// A host convolution node of f32, f64 or (not `transposed`) bf16 `self` by `w` `[o, k]`
    /// (`k` the window's patch length) that keeps no patch matrix, and `bias`. Not
    /// `transposed`: `self` `[n, c, h, w]` is the window's input, the output `[n, o, l]`
    /// (`Op::ConvPatches`), each image's patches made and multiplied in the cache
    /// ([`cpu::patch_products`], [`cpu::bf16::conv::patch_products`]) and made again by the
    /// backward for the weight's gradient. `transposed`: `self` `[n, o, ho, wo]` is over the
    /// window's output positions, the output `[n, win.c, win.h, win.w]` (`Op::ConvTranspose`),
    /// each image's patches folded from the cache ([`cpu::fold_products`]). The caller has
    /// checked the shapes and dtypes.
    fn host_conv(
        self,
        w: Tensor<'g>,
        bias: Option<Tensor<'g>>,
        win: Window,
        d: cpu::ConvDims,
        transposed: bool,
    ) -> Result<Tensor<'g>> {
        let cpu::ConvDims { o, l, n, .. } = d;
        let (op, y_shape): (_, Shape) = if transposed {
            ("conv_transpose2d", smallvec![n, win.c, win.h, win.w])
        } else {
            ("conv2d", smallvec![n, o, l])
        };
        let y_len = checked_numel(op, &y_shape)?;
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (dtype, [xb, wb], bb) = operand_bufs(i, op, [self, w], bias)?;
        let out = i.alloc(op, dtype, y_len)?;
        let threads = i.threads;
        if dtype == DType::BF16 && !transposed {
            conv_bf16(i, [xb, wb, out], bb, win, d)?;
        } else {
            with_float!(dtype, T, {
                let (y, [xv, wv, bv]) = match bb {
                    Some(bb) => i.split_mut::<T, 3>(op, out, [xb, wb, bb])?,
                    None => {
                        let (y, [xv, wv]) = i.split_mut::<T, 2>(op, out, [xb, wb])?;
                        (y, [xv, wv, &[][..]])
                    }
                };
                let bias = bb.map(|_| bv);
                if transposed {
                    cpu::fold_products(xv, wv, bias, &win, d, y, threads);
                } else {
                    let product = cpu::PatchProduct {
                        w: wv,
                        bias,
                        out: y,
                    };
                    let outs = cpu::PatchOut {
                        product: Some(product),
                        weight_grad: None,
                    };
                    cpu::patch_products(xv, &win, d, outs, threads);
                }
            });
        }
        let inputs: SmallVec<[NodeId; 3]> = match bias {
            Some(b) => smallvec![self.id, w.id, b.id],
            None => smallvec![self.id, w.id],
        };
        let win = Arc::new(win);
        let node = if transposed {
            Op::ConvTranspose(win)
        } else {
            Op::ConvPatches(win)
        };
        let id = i.push(y_shape, dtype, out, node, &inputs);
        drop(guard);
        Ok(self.g.handle(id))
    }

    fn fold_batch_win(self, win: Window, n: usize) -> Result<Tensor<'g>> {
        let threads = self.g.threads();
        let out: Shape = smallvec![n, win.c, win.h, win.w];
        checked_numel("fold_batch", &out)?;
        self.data_op(
            "fold_batch",
            out,
            Op::FoldBatch(Arc::new(win)),
            true,
            move |a| a.fold_batch(&win, n, threads),
        )
    }

    /// 2-D convolution (cross-correlation, as in PyTorch): input `[N, C, H, W]`, weight
    /// `[O, C/groups, kh, kw]`, output `[N, O, Ho, Wo]`. Add a bias by broadcasting `[1, O, 1, 1]`.
    pub fn conv2d(
        self,
        weight: Tensor<'g>,
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
    ) -> Result<Tensor<'g>> {
        self.conv2d_bias(weight, None, stride, padding, dilation, groups)
    }

    /// [`Tensor::conv2d`] plus a per-channel `bias` of shape `[out_channels]`. On the host each
    /// image's product starts from the bias in the output (in bf16, the bias joins the f32 sum
    /// before it is rounded), so it costs no pass of its own.
    pub fn conv2d_bias(
        self,
        weight: Tensor<'g>,
        bias: Option<Tensor<'g>>,
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
    ) -> Result<Tensor<'g>> {
        let op = "conv2d";
        if let Some([Some(x), Some(w), b]) =
            Tensor::autocast_lower(self.g, [Some(self), Some(weight), bias])?
        {
            return x.conv2d_bias(w, b, stride, padding, dilation, groups);
        }
        // bf16 on the host takes the bf16 product below (bf16 pairs, f32 sums, each result
        // rounded once); other 16-bit cases run the f32 convolution on widened copies.
        let bf16_host = groups == 1
            && self.device() == Device::Cpu
            && [Some(self), Some(weight), bias]
                .iter()
                .flatten()
                .try_fold(true, |all, t| {
                    Ok::<_, GraphError>(all && t.dtype_of(op)? == DType::BF16)
                })?;
        if !bf16_host && Tensor::any_half(&[Some(self), Some(weight), bias])? {
            return match bias {
                Some(b) => Tensor::lower([self, weight, b], |[x, w, b]| {
                    x.conv2d_bias(w, Some(b), stride, padding, dilation, groups)
                }),
                None => Tensor::lower([self, weight], |[x, w]| {
                    x.conv2d_bias(w, None, stride, padding, dilation, groups)
                }),
            };
        }
        // Before anything is recorded: a refused call leaves both graphs as they were.
        check_pair(op, &self, &weight)?;
        if let Some(b) = bias {
            check_pair(op, &self, &b)?;
        }
        let (xs, ws) = (self.try_shape()?, weight.try_shape()?);
        let bad = || GraphError::ShapeMismatch {
            op,
            lhs: xs.to_vec(),
            rhs: ws.to_vec(),
        };
        if xs.len() != 4 || ws.len() != 4 || groups == 0 {
            return Err(bad());
        }
        let (n, c, o) = (xs[0], xs[1], ws[0]);
        if c % groups != 0 || o % groups != 0 || ws[1] * groups != c {
            return Err(bad());
        }
        if let Some(b) = bias {
            let bs = b.try_shape()?;
            if bs[..] != [o] {
                return Err(GraphError::ShapeMismatch {
                    op,
                    lhs: ws.to_vec(),
                    rhs: bs.to_vec(),
                });
            }
        }
        let win = window(op, &xs, (ws[2], ws[3]), stride, padding, dilation)?;
        let (ho, wo) = win.out_hw().expect("invariant: checked window");
        let l = (ho * wo) as isize;
        let g = groups as isize;
        let kk = (ws[1] * ws[2] * ws[3]) as isize;
        if groups == 1 && self.device() == Device::Cpu {
            // On the host, one node that keeps no patches: each image's made and multiplied in
            // the cache, and made again for the weight's gradient (bf16 through the bf16
            // product, f32 sums rounded once).
            let w = weight.reshape(&[o as isize, kk])?;
            let d = cpu::ConvDims {
                o,
                k: win.patch_len(),
                l: ho * wo,
                n,
            };
            let y = self.host_conv(w, bias, win, d, false)?;
            return y.reshape(&[n as isize, o as isize, ho as isize, wo as isize]);
        }
        let cols = self.unfold_win(win, n)?; // [N, C·kh·kw, L]
        let y = if groups == 1 {
            weight.reshape(&[o as isize, kk])?.matmul(cols)? // [N, O, L]
        } else {
            let cols = cols.reshape(&[n as isize, g, kk, l])?;
            let w = weight.reshape(&[g, (o / groups) as isize, kk])?;
            w.matmul(cols)? // [N, g, O/g, L]
        };
        let y = y.reshape(&[n as isize, o as isize, ho as isize, wo as isize])?;
        match bias {
            Some(b) => y.add(b.reshape(&[1, -1, 1, 1])?),
            None => Ok(y),
        }
    }

    /// 2-D transposed convolution (PyTorch's `F.conv_transpose2d`, the gradient of a
    /// convolution with respect to its input): input `[N, C_in, H, W]`, weight
    /// `[C_in, C_out/groups, kh, kw]` (PyTorch's layout), `bias` `[C_out]`; the output is
    /// `(H − 1)·stride − 2·padding + dilation·(kh − 1) + output_padding + 1` high (likewise
    /// wide). `output_padding` must stay below the stride or the dilation, as PyTorch asks.
    ///
    /// Each input pixel's channels times the weight give a patch, and fold (col2im) adds the
    /// patches into the output at the windows of the convolution this one transposes. On the
    /// host without groups, in f32 and f64, that is one node: each image's patches,
    /// `weightᵀ [C_out·kh·kw, C_in]` times the image `[C_in, H·W]`, are made and folded in the
    /// thread's cache, and the backward makes the output gradient's patches once per image for
    /// both gradients; no patch matrix of the batch is written or kept. 16-bit tensors take
    /// one batch-wide product folded from that layout.
    #[allow(clippy::too_many_arguments)]
    pub fn conv_transpose2d(
        self,
        weight: Tensor<'g>,
        bias: Option<Tensor<'g>>,
        stride: (usize, usize),
        padding: (usize, usize),
        output_padding: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
    ) -> Result<Tensor<'g>> {
        const OP: &str = "conv_transpose2d";
        if let Some([Some(x), Some(w), b]) =
            Tensor::autocast_lower(self.g, [Some(self), Some(weight), bias])?
        {
            return x.conv_transpose2d(w, b, stride, padding, output_padding, dilation, groups);
        }
        // Before anything is recorded: a refused call leaves both graphs as they were.
        check_pair(OP, &self, &weight)?;
        if let Some(b) = bias {
            check_pair(OP, &self, &b)?;
        }
        let (xs, ws) = (self.try_shape()?, weight.try_shape()?);
        let bad = || GraphError::ShapeMismatch {
            op: OP,
            lhs: xs.to_vec(),
            rhs: ws.to_vec(),
        };
        let (&[n, cin, h, w], &[wcin, cout_g, kh, kw]) = (&xs[..], &ws[..]) else {
            return Err(bad());
        };
        if groups == 0
            || cin != wcin
            || !cin.is_multiple_of(groups)
            || [h, w, cout_g, kh, kw].contains(&0)
        {
            return Err(bad());
        }
        let cout = cout_g * groups;
        if let Some(b) = bias {
            let bs = b.try_shape()?;
            if bs[..] != [cout] {
                return Err(GraphError::ShapeMismatch {
                    op: OP,
                    lhs: ws.to_vec(),
                    rhs: bs.to_vec(),
                });
            }
        }
        let positive = stride.0 > 0 && stride.1 > 0 && dilation.0 > 0 && dilation.1 > 0;
        let out_pad_ok = (output_padding.0 < stride.0 || output_padding.0 < dilation.0)
            && (output_padding.1 < stride.1 || output_padding.1 < dilation.1);
        if !positive || !out_pad_ok {
            return Err(GraphError::BadArgument {
                op: OP,
                what: "stride and dilation must be ≥ 1 and the output padding below the stride \
                       or the dilation",
            });
        }
        // (H − 1)·s + d·(k − 1) + output padding + 1 − 2p, which must be positive.
        let extent = |n: usize, s: usize, p: usize, d: usize, k: usize, op: usize| {
            (n - 1)
                .checked_mul(s)
                .and_then(|v| v.checked_add(d.checked_mul(k.checked_sub(1)?)?))
                .and_then(|v| v.checked_add(op + 1))
                .and_then(|v| v.checked_sub(p.checked_mul(2)?))
                .filter(|&v| v > 0)
        };
        let (Some(ho), Some(wo)) = (
            extent(h, stride.0, padding.0, dilation.0, kh, output_padding.0),
            extent(w, stride.1, padding.1, dilation.1, kw, output_padding.1),
        ) else {
            return Err(GraphError::BadArgument {
                op: OP,
                what: "the padding leaves no output (or the output's size overflows)",
            });
        };
        let win = window(OP, &[n, cout, ho, wo], (kh, kw), stride, padding, dilation)?;
        let (hw, ww) = win.out_hw().expect("invariant: checked window");
        // The convolution of an output this size makes H + ⌊output padding / stride⌋ windows
        // down (likewise across): an output padding past the stride (allowed below the
        // dilation) adds windows whose input pixels are zeros.
        if hw != h + output_padding.0 / stride.0 || ww != w + output_padding.1 / stride.1 {
            return Err(bad());
        }
        // Sizes that overflow are refused before anything is recorded.
        checked_numel(OP, &[n, cout, ho, wo])?;
        checked_numel(OP, &[n, cin, hw, ww])?;
        checked_numel(OP, &[n, cout, kh, kw, hw, ww])?;
        let mut x = self;
        for (axis, extra) in [(2usize, hw - h), (3, ww - w)] {
            if extra > 0 {
                let mut zs = copy_of(&x.try_shape()?);
                zs[axis] = extra;
                let zeros = self.g.zeros(&zs, x.dtype_of(OP)?)?;
                x = self.g.concat(&[x, zeros], axis as isize)?;
            }
        }
        let (l, patch) = ((hw * ww) as isize, (cout_g * kh * kw) as isize);
        if groups == 1
            && self.device() == Device::Cpu
            && matches!(x.dtype_of(OP)?, DType::F32 | DType::F64)
        {
            let w2 = weight.reshape(&[cin as isize, patch])?;
            let d = cpu::ConvDims {
                o: cin,
                k: win.patch_len(),
                l: hw * ww,
                n,
            };
            return x.host_conv(w2, bias, win, d, true);
        }
        let y = if groups == 1 && self.device() == Device::Cpu {
            let xp = x
                .permute(&[1, 0, 2, 3])?
                .reshape(&[cin as isize, n as isize * l])?;
            weight
                .reshape(&[cin as isize, patch])?
                .matmul_t(xp, true, false)?
                .fold_batch_win(win, n)?
        } else {
            let (gi, cin_g) = (groups as isize, (cin / groups) as isize);
            let wt = weight.reshape(&[gi, cin_g, patch])?.permute(&[0, 2, 1])?;
            wt.matmul(x.reshape(&[n as isize, gi, cin_g, l])?)?
                .reshape(&[n as isize, gi * patch, l])?
                .fold_win(win, n)?
        };
        match bias {
            Some(b) => y.add(b.reshape(&[1, cout as isize, 1, 1])?),
            None => Ok(y),
        }
    }

    /// Max pooling over `kernel` windows. Padding is never the maximum (padding is limited to
    /// half the kernel, so every window holds a real element); on ties the first element in the
    /// window takes the gradient, as in PyTorch. The argmax indices live in the arena beside the
    /// output and serve backward.
    pub fn max_pool2d(
        self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<Tensor<'g>> {
        let op = "max_pool2d";
        let (dtype, dev) = self.with_node(op, |n| (n.dtype, n.device()))?;
        // 16-bit pooling on the host picks and copies its elements as stored, and its gradient
        // lands on distinct elements where the windows are disjoint (each sum exact): overlapping
        // windows, and CUDA, pool in f32.
        let disjoint = stride.0 >= kernel.0 && stride.1 >= kernel.1;
        if dtype.is_half() && !(disjoint && dev == Device::Cpu) {
            return Tensor::lower([self], |[x]| x.max_pool2d(kernel, stride, padding));
        }
        if padding.0 > kernel.0 / 2 || padding.1 > kernel.1 / 2 {
            return Err(GraphError::BadArgument {
                op,
                what: "padding must be at most half the kernel",
            });
        }
        let xs = self.try_shape()?;
        let win = window(op, &xs, kernel, stride, padding, (1, 1))?;
        let (ho, wo) = win.out_hw().expect("invariant: checked window");
        let (n, c) = (xs[0], xs[1]);
        let out_shape: Shape = smallvec![n, c, ho, wo];
        let total = checked_numel(op, &out_shape)?;
        let per_in = c * win.h * win.w;
        if (n * per_in) > u32::MAX as usize {
            return Err(GraphError::TooLarge {
                op,
                shape: xs.to_vec(),
            });
        }
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (dtype, dev, xb) = {
            let nd = i.node(op, self.id)?;
            (nd.dtype, nd.device(), nd.buf)
        };
        let alloc_err = |source| GraphError::Alloc { op, source };
        if let Device::Cuda(_) = dev {
            // The u32 indices take a buffer of 4-byte elements.
            let idx = i.alloc_on(op, dev, DType::F32, total)?;
            let out = i.alloc_on(op, dev, dtype, total)?;
            on_cuda!(i, op, dev, [xb, idx, out], |be, [x, ix, o]| be
                .max_pool_indices(dtype, x, n, &win, ix)
                .and_then(|()| be.take(dtype, x, n * per_in, ix, total, o)));
            let id = i.push(out_shape, dtype, out, Op::MaxPool2d { idx }, &[self.id]);
            drop(guard);
            return Ok(self.g.handle(id));
        }
        let idx = i.arena.alloc_scratch::<u32>(total).map_err(alloc_err)?;
        let out = i.alloc(op, dtype, total)?;
        let per_out = c * ho * wo;
        let threads = i.threads;
        macro_rules! indices {
            ($T:ident, $pick:path) => {{
                let (ix, x, _) = i
                    .arena
                    .split_mixed::<u32, $T, $T>(idx, xb, xb)
                    .map_err(alloc_err)?;
                cpu::par::par_rows_mut(ix, per_out, threads, cpu::par::PAR_MIN_ELEMS, |b, ib| {
                    $pick(&x[b * per_in..(b + 1) * per_in], &win, b * per_in, ib);
                });
            }};
        }
        if dtype.is_half() {
            with_half!(dtype, H, { indices!(H, cpu::max_pool_indices_half) });
        } else {
            with_float!(dtype, T, { indices!(T, cpu::max_pool_indices) });
        }
        with_storage!(dtype, T, {
            let (o, x, ix) = i
                .arena
                .split_mixed::<T, T, u32>(out, xb, idx)
                .map_err(alloc_err)?;
            cpu::par::par_rows_mut(o, per_out, threads, cpu::par::PAR_MIN_ELEMS, |b, ob| {
                cpu::take(x, &ix[b * per_out..(b + 1) * per_out], ob);
            });
        });
        let id = i.push(out_shape, dtype, out, Op::MaxPool2d { idx }, &[self.id]);
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// `out[i] = self[idx[i]]` (flat indices), or with `put` the adjoint: zeros of `shape` with
    /// `out[idx[i]] += self[i]`.
    fn take_or_put(self, idx: BufId, shape: Shape, put: bool) -> Result<Tensor<'g>> {
        let op = if put { "max_pool2d_backward" } else { "take" };
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (dtype, dev, xb, xlen, planes) = {
            let nd = i.node(op, self.id)?;
            // A pooling's planes: the gradient's `[n, c, ho, wo]` and the input's `[n, c, h, w]`.
            let plane = |s: &[usize]| s.iter().skip(2).product::<usize>();
            (
                nd.dtype,
                nd.device(),
                nd.buf,
                nd.shape.iter().product::<usize>(),
                (plane(&nd.shape), plane(&shape)),
            )
        };
        let len = checked_numel(op, &shape)?;
        // On the host `put_into` clears the output itself (in parallel, plane by plane).
        let out = if put && dev != Device::Cpu {
            i.alloc_zeroed_on(op, dev, dtype, len)?
        } else {
            i.alloc_on(op, dev, dtype, len)?
        };
        let threads = i.threads;
        match dev {
            Device::Cpu => with_storage!(dtype, T, {
                let (o, x, ix) = i
                    .arena
                    .split_mixed::<T, T, u32>(out, xb, idx)
                    .map_err(|source| GraphError::Alloc { op, source })?;
                // One index per gathered element: the input's for put, the output's for take.
                debug_assert_eq!(ix.len(), if put { xlen } else { len });
                if put {
                    cpu::put_into(x, ix, planes, o, threads);
                } else {
                    cpu::take_par(x, ix, o, threads);
                }
            }),
            Device::Cuda(_) => {
                on_cuda!(i, op, dev, [xb, idx, out], |be, [x, ix, o]| if put {
                    be.put_add(dtype, x, ix, xlen, o, len)
                } else {
                    be.take(dtype, x, xlen, ix, len, o)
                })
            }
        }
        let rec = if put {
            Op::MaxPool2dBackward { idx }
        } else {
            Op::MaxPool2d { idx }
        };
        let id = i.push(shape, dtype, out, rec, &[self.id]);
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// Average pooling over `kernel` windows; zero padding counts toward the average
    /// (PyTorch's `count_include_pad = true`).
    pub fn avg_pool2d(
        self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<Tensor<'g>> {
        let xs = self.try_shape()?;
        let win = window("avg_pool2d", &xs, kernel, stride, padding, (1, 1))?;
        let (ho, wo) = win.out_hw().expect("invariant: checked window");
        let (n, c) = (xs[0], xs[1]);
        // Every channel as its own one-channel image, so the patches of each plane average alone.
        let planes = self.reshape(&[(n * c) as isize, 1, xs[2] as isize, xs[3] as isize])?;
        let cols = planes.unfold_win(Window { c: 1, ..win }, n * c)?; // [N·C, kh·kw, L]
        cols.mean_axes(&[1], false)?
            .reshape(&[n as isize, c as isize, ho as isize, wo as isize])
    }

    /// Inverted dropout: zeroes each element with probability `p` and scales the rest by
    /// `1/(1−p)`. The identity when `!train` or `p == 0`; all zeros when `p == 1`. One pass:
    /// the decisions come from a counter-based hash of a seed drawn from the graph's generator
    /// and each element's position ([`arenagrad_exec::cpu::dropout::keeps`]), so no mask is
    /// stored and backward (the same dropout of the gradient) makes the same decisions.
    pub fn dropout(self, p: f64, train: bool) -> Result<Tensor<'g>> {
        if !(0.0..=1.0).contains(&p) {
            return Err(GraphError::BadArgument {
                op: "dropout",
                what: "p must be in [0, 1]",
            });
        }
        if !train || p == 0.0 {
            return Ok(self);
        }
        if p == 1.0 {
            return self.scale(0.0);
        }
        let seed = self.g.inner().rng.next_u64();
        self.dropout_seeded(p, seed)
    }

    /// Dropout with the decisions of `seed` (forward and backward alike).
    pub(crate) fn dropout_seeded(self, p: f64, seed: u64) -> Result<Tensor<'g>> {
        let name = "dropout";
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (shape, dtype, dev, xb) = {
            let n = i.node(name, self.id)?;
            (copy_of(&n.shape), n.dtype, n.device(), n.buf)
        };
        if dtype.is_half() && dev != Device::Cpu {
            drop(guard);
            return Tensor::lower([self], |[x]| x.dropout_seeded(p, seed));
        }
        let len: usize = shape.iter().product();
        let out = i.alloc_on(name, dev, dtype, len)?;
        let threads = i.threads;
        let scale = 1.0 / (1.0 - p);
        match dev {
            Device::Cpu if dtype.is_half() => with_half!(dtype, H, {
                let (o, [x]) = i.split_mut::<H, 1>(name, out, [xb])?;
                cpu::dropout::dropout_half(x, seed, p, o, threads);
            }),
            Device::Cpu => with_float!(dtype, T, {
                let (o, [x]) = i.split_mut::<T, 1>(name, out, [xb])?;
                cpu::dropout::dropout(x, seed, p, T::from_f64(scale), o, threads);
            }),
            Device::Cuda(_) => {
                on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be.dropout(
                    dtype,
                    x,
                    len,
                    (seed, p, scale),
                    o
                ))
            }
        }
        let id = i.push(shape, dtype, out, Op::Dropout { p, seed }, &[self.id]);
        drop(guard);
        Ok(self.g.handle(id))
    }
}

pub(crate) fn take_backward<'g>(idx: BufId, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let shape = c.input(0).try_shape()?;
    Ok(smallvec![Some(c.gy.take_or_put(idx, shape, true)?)])
}

pub(crate) fn put_backward<'g>(idx: BufId, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let shape = c.input(0).try_shape()?;
    Ok(smallvec![Some(c.gy.take_or_put(idx, shape, false)?)])
}

pub(crate) fn conv_gemm_backward<'g>(n: usize, l: usize, c: &Ctx<'g>) -> Result<Grads<'g>> {
    // The image-major gradient back to [o, n·l] (one threaded copy), then two batch-wide GEMMs:
    // measured faster than a product per image, whose small GEMMs each pack the weight again.
    let (w, cols) = (c.input(0), c.input(1));
    let o = w.try_shape()?[0];
    let gyp =
        c.gy.permute(&[1, 0, 2])?
            .reshape(&[o as isize, (n * l) as isize])?;
    let mut grads: Grads<'g> = smallvec![None, None];
    if w.requires_grad() {
        grads[0] = Some(gyp.matmul_t(cols, false, true)?);
    }
    if cols.requires_grad() {
        grads[1] = Some(w.matmul_t(gyp, true, false)?);
    }
    if c.inputs.len() > 2 {
        let b = c.input(2);
        grads.push(if b.requires_grad() {
            Some(gyp.sum_axes(&[1], false)?)
        } else {
            None
        });
    }
    Ok(grads)
}

/// The rule of [`Tensor::host_conv`]'s transposed node: the input's gradient is the convolution of the
/// output's gradient by the weight, and the weight's the sum over images of the input times
/// that gradient's patches. On a plain backward both come from one host kernel that makes each
/// image's patches once, in its cache ([`cpu::patch_products`]); under `create_graph` they are
/// recorded as the batch-wide im2col and two products, differentiable again.
pub(crate) fn conv_transpose_backward<'g>(win: &Window, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let (x, w) = (c.input(0), c.input(1));
    let xs = x.try_shape()?;
    let (n, o, l) = (xs[0], xs[1], xs[2] * xs[3]);
    let mut grads: Grads<'g> = smallvec![None, None];
    if c.create_graph {
        let u = c.gy.unfold_batch_win(*win, n)?; // [k, n·l]
        if x.requires_grad() {
            let dims: Vec<isize> = xs.iter().map(|&v| v as isize).collect();
            grads[0] = Some(u.conv_gemm(w, None, n, l)?.reshape(&dims)?);
        }
        if w.requires_grad() {
            let xp = x
                .reshape(&[n as isize, o as isize, l as isize])?
                .permute(&[1, 0, 2])?
                .reshape(&[o as isize, (n * l) as isize])?;
            grads[1] = Some(xp.matmul_t(u, false, true)?);
        }
    } else {
        let d = cpu::ConvDims {
            o,
            k: win.patch_len(),
            l,
            n,
        };
        // The input's gradient: the products of the output gradient's patches; the weight's:
        // the input times them.
        let [dx, dw] = host_grads(
            c,
            "conv_transpose2d",
            [x.requires_grad(), w.requires_grad()],
            |bufs, i| patch_grads(i, *win, d, bufs, [c.gy, w, x]),
        )?;
        grads = smallvec![dx, dw];
    }
    grads.extend(bias_grad(c, &[0, 2, 3])?);
    Ok(grads)
}

/// The rule of [`Tensor::host_conv`]'s convolution node: the input's gradient is the transposed convolution of the
/// output's gradient ([`cpu::fold_products`]), the weight's the sum over images of that
/// gradient times the input's patches, made again image by image ([`cpu::patch_products`]).
/// Under `create_graph`, the batch-wide im2col and products of the convolution's other form.
pub(crate) fn conv_patches_backward<'g>(win: &Window, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let (x, w) = (c.input(0), c.input(1));
    let xs = x.try_shape()?;
    let n = xs[0];
    let (o, l) = {
        let gs = c.gy.try_shape()?;
        (gs[1], gs[2])
    };
    let mut grads: Grads<'g> = smallvec![None, None];
    if c.create_graph {
        let gyp =
            c.gy.permute(&[1, 0, 2])?
                .reshape(&[o as isize, (n * l) as isize])?;
        if x.requires_grad() {
            grads[0] = Some(w.matmul_t(gyp, true, false)?.fold_batch_win(*win, n)?);
        }
        if w.requires_grad() {
            let u = x.unfold_batch_win(*win, n)?;
            grads[1] = Some(gyp.matmul_t(u, false, true)?);
        }
    } else {
        let d = cpu::ConvDims {
            o,
            k: win.patch_len(),
            l,
            n,
        };
        const OP: &str = "conv2d";
        let [dx, dw] = host_grads(
            c,
            OP,
            [x.requires_grad(), w.requires_grad()],
            |[dx, dw], i| {
                let threads = i.threads;
                if i.node(OP, x.id)?.dtype == DType::BF16 {
                    return conv_grads_bf16(i, win, d, [dx, dw], [x, w, c.gy]);
                }
                with_float!(i.node(OP, x.id)?.dtype, T, {
                    if let Some(dx) = dx {
                        let bufs = [buf(i, OP, c.gy)?, buf(i, OP, w)?];
                        let (dxv, [gv, wv]) = i.split_mut::<T, 2>(OP, dx, bufs)?;
                        cpu::conv_input_grad(gv, wv, win, d, dxv, threads);
                    }
                    if let Some(dw) = dw {
                        let bufs = [buf(i, OP, x)?, buf(i, OP, c.gy)?];
                        let (dwv, [xv, gv]) = i.split_mut::<T, 2>(OP, dw, bufs)?;
                        let outs = cpu::PatchOut {
                            product: None,
                            weight_grad: Some(cpu::PatchWeightGrad { a: gv, dw: dwv }),
                        };
                        cpu::patch_products(xv, win, d, outs, threads);
                    }
                });
                Ok(())
            },
        )?;
        grads = smallvec![dx, dw];
    }
    grads.extend(bias_grad(c, &[0, 2])?);
    Ok(grads)
}

/// [`conv_patches_backward`]'s host gradients in bf16: the input's
/// ([`cpu::bf16::conv::fold_products`]) and the weight's
/// ([`cpu::bf16::conv::patch_products`]), into `dx` and `dw` where given.
fn conv_grads_bf16(
    i: &mut crate::graph::Inner,
    win: &Window,
    d: cpu::ConvDims,
    [dx, dw]: [Option<BufId>; 2],
    [x, w, gy]: [Tensor<'_>; 3],
) -> Result<()> {
    use arenagrad_exec::bf16;
    const OP: &str = "conv2d";
    let threads = i.threads;
    if let Some(dx) = dx {
        let bufs = [buf(i, OP, gy)?, buf(i, OP, w)?];
        let (dxv, [gv, wv]) = i.split_mut::<bf16, 2>(OP, dx, bufs)?;
        cpu::bf16::conv::fold_products(gv, wv, win, d, dxv, threads);
    }
    if let Some(dw) = dw {
        let bufs = [buf(i, OP, x)?, buf(i, OP, gy)?];
        let (dwv, [xv, gv]) = i.split_mut::<bf16, 2>(OP, dw, bufs)?;
        let grad = cpu::bf16::conv::PatchWeightGrad { a: gv, dw: dwv };
        cpu::bf16::conv::patch_products(xv, win, d, None, Some(grad), threads);
    }
    Ok(())
}

/// The buffer of `t`'s node (an error naming `op` if it is gone).
fn buf(i: &crate::graph::Inner, op: &'static str, t: Tensor<'_>) -> Result<BufId> {
    Ok(i.node(op, t.id)?.buf)
}

/// The dtype of a convolution's first operand and the buffers of its operands and its bias.
fn operand_bufs(
    i: &crate::graph::Inner,
    op: &'static str,
    [x, w]: [Tensor<'_>; 2],
    bias: Option<Tensor<'_>>,
) -> Result<(DType, [BufId; 2], Option<BufId>)> {
    let dtype = i.node(op, x.id)?.dtype;
    let b = match bias {
        Some(b) => Some(buf(i, op, b)?),
        None => None,
    };
    Ok((dtype, [buf(i, op, x)?, buf(i, op, w)?], b))
}

/// The transposed convolution's two gradients from one pass over the images: `src` the
/// output's gradient (whose patches are made), `w` the weight (the input's gradient is their
/// product with it), `a` the input (the weight's gradient is its product with them).
fn patch_grads(
    i: &mut crate::graph::Inner,
    win: Window,
    d: cpu::ConvDims,
    [dx, dw]: [Option<BufId>; 2],
    [src, w, a]: [Tensor<'_>; 3],
) -> Result<()> {
    let op = "conv_transpose2d";
    let dtype = i.node(op, src.id)?.dtype;
    let ins = [buf(i, op, src)?, buf(i, op, w)?, buf(i, op, a)?];
    let threads = i.threads;
    with_float!(dtype, T, {
        let (dxv, dwv, [sv, wv, av]) = match (dx, dw) {
            (Some(dx), Some(dw)) => {
                let ([dxv, dwv], vs) = i.split_two_mut::<T, 3>(op, [dx, dw], ins)?;
                (Some(dxv), Some(dwv), vs)
            }
            (Some(dx), None) => {
                let (dxv, vs) = i.split_mut::<T, 3>(op, dx, ins)?;
                (Some(dxv), None, vs)
            }
            (None, Some(dw)) => {
                let (dwv, vs) = i.split_mut::<T, 3>(op, dw, ins)?;
                (None, Some(dwv), vs)
            }
            (None, None) => return Ok(()),
        };
        let outs = cpu::PatchOut {
            product: dxv.map(|out| cpu::PatchProduct {
                w: wv,
                bias: None,
                out,
            }),
            weight_grad: dwv.map(|dw| cpu::PatchWeightGrad { a: av, dw }),
        };
        cpu::patch_products(sv, &win, d, outs, threads);
    });
    Ok(())
}

/// Host gradients for the node's first two inputs where `need` says, each a fresh buffer of
/// the input's shape that `fill` writes, returned as constants (a plain backward records
/// nothing).
fn host_grads<'g>(
    c: &Ctx<'g>,
    op: &'static str,
    need: [bool; 2],
    fill: impl FnOnce([Option<BufId>; 2], &mut crate::graph::Inner) -> Result<()>,
) -> Result<[Option<Tensor<'g>>; 2]> {
    if !need[0] && !need[1] {
        return Ok([None, None]);
    }
    let mut guard = c.g.inner();
    let i = &mut *guard;
    let mut bufs = [None, None];
    let mut shapes: [Shape; 2] = Default::default();
    for k in 0..2 {
        let nd = i.node(op, c.inputs[k])?;
        let (dtype, shape) = (nd.dtype, nd.shape.clone());
        if need[k] {
            bufs[k] = Some(i.alloc(op, dtype, shape.iter().product())?);
        }
        shapes[k] = shape;
    }
    fill(bufs, i)?;
    let dtype = i.node(op, c.inputs[0])?.dtype;
    let mut out = [None, None];
    for k in 0..2 {
        if let Some(b) = bufs[k] {
            let shape = std::mem::take(&mut shapes[k]);
            let id = i.push_on(Device::Cpu, shape, dtype, b, Op::Leaf, &[]);
            out[k] = Some(c.g.handle(id));
        }
    }
    Ok(out)
}

/// The bias's gradient (the output's gradient summed over `axes`) when the node has a bias
/// (its third input): one entry, `None` where the bias takes no gradient; none without one.
fn bias_grad<'g>(c: &Ctx<'g>, axes: &[isize]) -> Result<Option<Option<Tensor<'g>>>> {
    if c.inputs.len() <= 2 {
        return Ok(None);
    }
    let b = c.input(2);
    Ok(Some(if b.requires_grad() {
        Some(c.gy.sum_axes(axes, false)?)
    } else {
        None
    }))
}

pub(crate) fn unfold_backward<'g>(win: &Window, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let n = c.input(0).shape()[0];
    Ok(smallvec![Some(c.gy.fold_win(*win, n)?)])
}

pub(crate) fn unfold_batch_backward<'g>(win: &Window, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let n = c.input(0).shape()[0];
    Ok(smallvec![Some(c.gy.fold_batch_win(*win, n)?)])
}

pub(crate) fn fold_batch_backward<'g>(win: &Window, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let n = c.out.shape()[0];
    Ok(smallvec![Some(c.gy.unfold_batch_win(*win, n)?)])
}

pub(crate) fn fold_backward<'g>(win: &Window, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let n = c.input(0).shape()[0];
    Ok(smallvec![Some(c.gy.unfold_win(*win, n)?)])
}

/// The host kernels of unfold and fold (im2col, col2im), per image or for a whole batch.
impl KernelArgs<'_> {
    pub(crate) fn unfold(self, win: &cpu::Window, threads: usize) {
        let (ho, wo) = win.out_hw().expect("invariant: checked window");
        let (pi, po) = (win.c * win.h * win.w, win.patch_len() * ho * wo);
        // Unfolding only moves elements (padding is zero in every dtype): 16-bit as stored.
        moves!(self, x, o, _s => {
            cpu::par::par_rows_mut(o, po, threads, cpu::par::PAR_MIN_ELEMS, |b, ob| {
                cpu::im2col(&x[b * pi..(b + 1) * pi], win, Default::default(), ob);
            })
        })
    }
    pub(crate) fn unfold_batch(self, win: &cpu::Window, n: usize, threads: usize) {
        moves!(self, x, o, _s => cpu::im2col_batch(x, n, win, Default::default(), o, threads))
    }
    pub(crate) fn fold_batch(self, win: &cpu::Window, n: usize, threads: usize) {
        // Folding adds into the zeroed output: 16-bit columns are widened as they are added
        // into f32 sums of the (smaller) output, rounded once.
        match self {
            KernelArgs::F32(x, o, _) => cpu::col2im_batch(x, n, win, o, threads),
            KernelArgs::F64(x, o, _) => cpu::col2im_batch(x, n, win, o, threads),
            KernelArgs::BF16(x, o, _) => cpu::conv::col2im_batch_half(x, n, win, o, threads),
            KernelArgs::F16(x, o, _) => cpu::conv::col2im_batch_half(x, n, win, o, threads),
            args => args.fold(win, threads),
        }
    }
    pub(crate) fn fold(self, win: &cpu::Window, threads: usize) {
        let (ho, wo) = win.out_hw().expect("invariant: checked window");
        let (pi, po) = (win.patch_len() * ho * wo, win.c * win.h * win.w);
        both!(self, x, o, _s => {
            cpu::par::par_rows_mut(o, po, threads, cpu::par::PAR_MIN_ELEMS, |b, ob| {
                cpu::col2im(&x[b * pi..(b + 1) * pi], win, ob);
            })
        })
    }
}

/// Unfold and fold on a CUDA device (what `data_op` runs for them there): `op` is the unfold
/// or fold, the input and the output each a shape with its buffer.
#[cfg(feature = "cuda")]
pub(crate) fn fold_on_cuda(
    i: &mut crate::graph::Inner,
    name: &'static str,
    dev: Device,
    dtype: DType,
    op: &Op,
    (xs, xb): (&[usize], BufId),
    (os, out): (&[usize], BufId),
) -> Result<()> {
    match op {
        Op::Unfold(w) => on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be
            .im2col(dtype, x, xs[0], w, o)),
        Op::Fold(w) => on_cuda!(i, name, dev, [xb, out], |be, [x, o]| be
            .col2im(dtype, x, os[0], w, o)),
        _ => {
            return Err(GraphError::BadArgument {
                op: name,
                what: "not an unfold or a fold",
            })
        }
    }
    Ok(())
}
