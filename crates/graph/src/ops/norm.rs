//! Layer normalisation and RMS normalisation over the trailing axes, and group normalisation
//! over each sample's groups of channels, each one recorded op.
//!
//! On the host the forward is two passes over each row (its mean and `rstd = 1/√(var + eps)`,
//! then the output, while the row is in cache), keeping only the two statistics per row besides the output (and those only
//! when the op is recorded: under `no_grad` they are scratch); backward is one
//! pass for the input's gradient and one each for the weight's and the bias's. Under
//! `create_graph` the rule is written in tensor ops instead, so it can be differentiated again.
//! On a CUDA device the same two passes and backward run as the fused kernels of
//! `arenagrad_exec::cuda` (`fused.cu`, one thread per row; checked against these CPU kernels on
//! the host by `crates/exec/tests/cuda_kernels_on_host.rs`, and against the CPU on a device by
//! the device parity tests). A group norm on a CUDA device is a layer norm over each sample's
//! groups and the per-channel affine in tensor ops; on the host it is fused as the others,
//! each row's passes made while the row is in cache.

use arenagrad_alloc::BufId;
use arenagrad_exec::cpu::norm as k;
use smallvec::{smallvec, SmallVec};

use super::{check_pair, Ctx, Grads, Op};
use crate::device::on_cuda;
use crate::error::{GraphError, Result};
use crate::host::try_vec;
use crate::shape::{copy_of, Shape};
use crate::{DType, Device, Tensor};

/// What the norm's node keeps: its kind, `eps`, the row length, which affine inputs follow `x`,
/// and the per-row statistics `[mean, rstd]` (`None` when the op is not recorded: then they
/// are scratch, and the node is only counted).
#[derive(Clone, Copy)]
pub(crate) struct NormNode {
    pub eps: f64,
    pub stats: Option<BufId>,
    /// The number of trailing axes normalised (at most the rank: small); for a group norm
    /// (`group`), its number of groups.
    pub ndim: u32,
    pub rms: bool,
    pub weight: bool,
    pub bias: bool,
    /// A group normalisation: its rows are a sample's group of channels, its weight and bias
    /// per channel ([`Tensor::group_norm`]), and `ndim` counts its groups.
    pub group: bool,
}

impl<'g> Tensor<'g> {
    /// Layer normalisation over the last `normalized_ndim` axes, PyTorch's `layer_norm`:
    /// `(x − mean)/√(var + eps)·weight + bias`, with the biased variance; `weight` and `bias`
    /// (optional) have the shape of those axes.
    pub fn layer_norm(
        self,
        normalized_ndim: usize,
        weight: Option<Tensor<'g>>,
        bias: Option<Tensor<'g>>,
        eps: f64,
    ) -> Result<Tensor<'g>> {
        self.norm_impl("layer_norm", false, normalized_ndim, weight, bias, eps)
    }

    /// [`Tensor::layer_norm`] with its output stored in `dtype`: computed as `layer_norm` and
    /// rounded once, the values `layer_norm(…).to_dtype(dtype)` gives, without keeping the
    /// full-precision output. What a norm feeding a product under [`crate::Graph::autocast`]
    /// wants: the product would cast its operand to the 16-bit dtype anyway (PyTorch runs
    /// `layer_norm` in f32 there and casts). The gradient flows back in the input's dtype.
    pub fn layer_norm_as(
        self,
        normalized_ndim: usize,
        weight: Option<Tensor<'g>>,
        bias: Option<Tensor<'g>>,
        eps: f64,
        dtype: DType,
    ) -> Result<Tensor<'g>> {
        let x = self.dtype_of("layer_norm")?;
        let params = [weight, bias];
        let all_f32 = params.iter().flatten().try_fold(true, |all, t| {
            Ok::<_, GraphError>(all && t.dtype_of("layer_norm")? == DType::F32)
        })?;
        if x == dtype || x != DType::F32 || !all_f32 || self.device() != Device::Cpu {
            return self
                .layer_norm(normalized_ndim, weight, bias, eps)?
                .to_dtype(dtype);
        }
        self.norm_impl_as(
            ("layer_norm", false),
            normalized_ndim,
            (weight, bias),
            eps,
            dtype,
        )
    }

    /// RMS normalisation over the last `normalized_ndim` axes, PyTorch's `rms_norm`:
    /// `x/√(mean(x²) + eps)·weight`, `weight` (optional) of the shape of those axes. PyTorch's
    /// `eps=None` is the dtype's machine epsilon, [`crate::DType::epsilon`].
    pub fn rms_norm(
        self,
        normalized_ndim: usize,
        weight: Option<Tensor<'g>>,
        eps: f64,
    ) -> Result<Tensor<'g>> {
        self.norm_impl("rms_norm", true, normalized_ndim, weight, None, eps)
    }

    fn norm_impl(
        self,
        op: &'static str,
        rms: bool,
        ndim: usize,
        weight: Option<Tensor<'g>>,
        bias: Option<Tensor<'g>>,
        eps: f64,
    ) -> Result<Tensor<'g>> {
        let dtype = self.dtype_of(op)?;
        self.norm_impl_as((op, rms), ndim, (weight, bias), eps, dtype)
    }

    /// The norm, its output stored in `out` (the input's dtype, or a 16-bit one for an f32
    /// input on the host: [`Tensor::layer_norm_as`]).
    fn norm_impl_as(
        self,
        (op, rms): (&'static str, bool),
        ndim: usize,
        (weight, bias): (Option<Tensor<'g>>, Option<Tensor<'g>>),
        eps: f64,
        out_dtype: DType,
    ) -> Result<Tensor<'g>> {
        if Tensor::any_half(&[Some(self), weight, bias])? {
            return lowered(self, (weight, bias), |x, w, b| {
                x.norm_impl(op, rms, ndim, w, b, eps)
            });
        }
        let shape = self.try_shape()?;
        if ndim == 0 || ndim > shape.len() {
            return Err(GraphError::BadArgument {
                op,
                what: "normalized_ndim must be between 1 and the input's rank",
            });
        }
        let trailing = &shape[shape.len() - ndim..];
        check_eps_and_affine(op, self, (&shape, trailing), (weight, bias), eps)?;
        let dev = self.device();
        let n: usize = trailing.iter().product();
        let numel: usize = shape.iter().product();
        let rows = numel.checked_div(n).unwrap_or(0);
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let NormInputs {
            dtype,
            xb,
            wb,
            bb,
            inputs,
        } = norm_inputs(i, op, self, weight, bias)?;
        // The statistics are kept for backward only when the op is recorded; otherwise they
        // are scratch, let go of before the op returns (on the host, not in the arena at all).
        let record = i.records(&inputs);
        let threads = i.threads;
        let (out, stats) = match dev {
            Device::Cpu if !record => with_float!(dtype, T, {
                let mut st = try_vec::<T>(op, &shape, 2 * rows)?;
                st.resize(2 * rows, <T as arenagrad_exec::Float>::ZERO);
                let out = i.alloc_on(op, dev, dtype, numel)?;
                let (y, [x, w, b]) =
                    i.split_mut::<T, 3>(op, out, [xb, wb.unwrap_or(xb), bb.unwrap_or(xb)])?;
                let (w, b) = (wb.map(|_| w), bb.map(|_| b));
                k::norm_forward((x, n), (eps, rms), (w, b), (y, &mut st), threads);
                (out, None)
            }),
            Device::Cpu => with_float!(dtype, T, {
                let stats = i.alloc_on(op, dev, dtype, 2 * rows)?;
                let out = i.alloc_on(op, dev, dtype, numel)?;
                let ([y, st], [x, w, b]) = i.split_two_mut::<T, 3>(
                    op,
                    [out, stats],
                    [xb, wb.unwrap_or(xb), bb.unwrap_or(xb)],
                )?;
                let (w, b) = (wb.map(|_| w), bb.map(|_| b));
                k::norm_forward((x, n), (eps, rms), (w, b), (y, st), threads);
                (out, Some(stats))
            }),
            Device::Cuda(_) => {
                let stats = i.alloc_on(op, dev, dtype, 2 * rows)?;
                let out = i.alloc_on(op, dev, dtype, numel)?;
                let (wd, bd) = (wb.unwrap_or(xb), bb.unwrap_or(xb));
                on_cuda!(
                    i,
                    op,
                    dev,
                    [xb, stats, out, wd, bd],
                    |be, [x, st, y, w, b]| {
                        let (w, b) = (wb.map(|_| w), bb.map(|_| b));
                        be.norm_stats(dtype, x, rows, k::NormSpec { n, rms }, eps, st)
                            .and_then(|()| be.norm_apply(dtype, x, [rows, n], st, (w, b), y))
                    }
                );
                if record {
                    (out, Some(stats))
                } else {
                    i.release_buf(dev, stats)?;
                    (out, None)
                }
            }
        };
        let out = if out_dtype == dtype {
            out
        } else {
            // Rounded once into the asked dtype; the full-precision output was scratch.
            let narrow = i.alloc(op, out_dtype, numel)?;
            i.cast_into(op, (out, dtype), (narrow, out_dtype))?;
            i.release_buf(Device::Cpu, out)?;
            narrow
        };
        let node = NormNode {
            rms,
            eps,
            ndim: ndim as u32,
            weight: weight.is_some(),
            bias: bias.is_some(),
            stats,
            group: false,
        };
        let id = i.push(copy_of(&shape), out_dtype, out, Op::Norm(node), &inputs);
        drop(guard);
        Ok(self.g.handle(id))
    }
}

impl<'g> Tensor<'g> {
    /// Group normalisation, PyTorch's `F.group_norm`: `x` `[N, C, …]` with its `C` channels in
    /// `groups` groups of equal size, each sample's group normalised over its channels and
    /// positions (the biased variance), then scaled and shifted per channel by `weight` and
    /// `bias` (optional, `[C]` each). On the host one recorded op, fused: one pass over each
    /// row for its statistics and output, two for the backward (see
    /// `arenagrad_exec::cpu::norm::group_norm`); on a CUDA device, and under `create_graph`,
    /// the same formula in tensor ops.
    pub fn group_norm(
        self,
        groups: usize,
        weight: Option<Tensor<'g>>,
        bias: Option<Tensor<'g>>,
        eps: f64,
    ) -> Result<Tensor<'g>> {
        const OP: &str = "group_norm";
        if Tensor::any_half(&[Some(self), weight, bias])? {
            return lowered(self, (weight, bias), |x, w, b| {
                x.group_norm(groups, w, b, eps)
            });
        }
        let dtype = self.dtype_of(OP)?;
        if !matches!(dtype, DType::F32 | DType::F64) {
            return Err(GraphError::UnsupportedDType { op: OP, dtype });
        }
        let shape = self.try_shape()?;
        // At most one group per channel (one group when there are none: more would only be
        // empty rows).
        if shape.len() < 2
            || groups == 0
            || groups > shape[1].max(1)
            || !shape[1].is_multiple_of(groups)
        {
            return Err(GraphError::BadArgument {
                op: OP,
                what: "expects an input [N, C, …] with C a multiple of groups, and 1 ≤ groups ≤ C",
            });
        }
        check_eps_and_affine(OP, self, (&shape, &shape[1..2]), (weight, bias), eps)?;
        let spec = k::GroupSpec {
            batch: shape[0],
            channels: shape[1],
            positions: shape[2..].iter().product(),
            groups,
        };
        let Ok(groups_u32) = u32::try_from(groups) else {
            return Err(GraphError::BadArgument {
                op: OP,
                what: "2³² groups or more",
            });
        };
        if self.device() != Device::Cpu {
            return group_norm_in_ops(self, spec, (weight, bias), eps);
        }
        let numel: usize = shape.iter().product();
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let NormInputs {
            dtype,
            xb,
            wb,
            bb,
            inputs,
        } = norm_inputs(i, OP, self, weight, bias)?;
        let record = i.records(&inputs);
        let threads = i.threads;
        let stats = i.alloc_on(OP, Device::Cpu, dtype, 2 * spec.rows())?;
        let out = i.alloc_on(OP, Device::Cpu, dtype, numel)?;
        with_float!(dtype, T, {
            let ([y, st], [x, w, b]) = i.split_two_mut::<T, 3>(
                OP,
                [out, stats],
                [xb, wb.unwrap_or(xb), bb.unwrap_or(xb)],
            )?;
            let (w, b) = (wb.map(|_| w), bb.map(|_| b));
            k::group_norm(spec, x, eps, (w, b), (y, st), threads);
        });
        let stats = if record {
            Some(stats)
        } else {
            i.release_buf(Device::Cpu, stats)?;
            None
        };
        let node = NormNode {
            rms: false,
            eps,
            ndim: groups_u32,
            weight: weight.is_some(),
            bias: bias.is_some(),
            stats,
            group: true,
        };
        let id = i.push(copy_of(&shape), dtype, out, Op::Norm(node), &inputs);
        drop(guard);
        Ok(self.g.handle(id))
    }
}

/// A norm with a 16-bit operand: `norm` run on the operands widened, its result stored in their
/// promoted dtype ([`Tensor::lower`] over whichever of the weight and bias are given).
fn lowered<'g>(
    x: Tensor<'g>,
    (weight, bias): (Option<Tensor<'g>>, Option<Tensor<'g>>),
    norm: impl FnOnce(Tensor<'g>, Option<Tensor<'g>>, Option<Tensor<'g>>) -> Result<Tensor<'g>>,
) -> Result<Tensor<'g>> {
    match (weight, bias) {
        (Some(w), Some(b)) => Tensor::lower([x, w, b], |[x, w, b]| norm(x, Some(w), Some(b))),
        (Some(w), None) => Tensor::lower([x, w], |[x, w]| norm(x, Some(w), None)),
        (None, Some(b)) => Tensor::lower([x, b], |[x, b]| norm(x, None, Some(b))),
        (None, None) => Tensor::lower([x], |[x]| norm(x, None, None)),
    }
}

/// A norm's `eps` (≥ 0) and its weight and bias: of `x`'s graph, device and dtype, each of
/// shape `want` (an error names `x`'s `shape` beside theirs).
fn check_eps_and_affine(
    op: &'static str,
    x: Tensor<'_>,
    (shape, want): (&[usize], &[usize]),
    (weight, bias): (Option<Tensor<'_>>, Option<Tensor<'_>>),
    eps: f64,
) -> Result<()> {
    if eps.is_nan() || eps < 0.0 {
        return Err(GraphError::BadArgument {
            op,
            what: "eps must be ≥ 0",
        });
    }
    for t in weight.iter().chain(bias.iter()) {
        check_pair(op, &x, t)?;
        let ts = t.try_shape()?;
        if ts[..] != *want {
            return Err(GraphError::ShapeMismatch {
                op,
                lhs: shape.to_vec(),
                rhs: ts.to_vec(),
            });
        }
    }
    Ok(())
}

/// A norm's operands as the kernels take them: the input's dtype and buffer, the weight's and
/// bias's buffers, and the node ids the op records.
struct NormInputs {
    dtype: DType,
    xb: BufId,
    wb: Option<BufId>,
    bb: Option<BufId>,
    inputs: SmallVec<[crate::store::NodeId; 3]>,
}

fn norm_inputs(
    i: &crate::graph::Inner,
    op: &'static str,
    x: Tensor<'_>,
    weight: Option<Tensor<'_>>,
    bias: Option<Tensor<'_>>,
) -> Result<NormInputs> {
    let (dtype, xb) = {
        let nd = i.node(op, x.id)?;
        (nd.dtype, nd.buf)
    };
    let buf = |t: Option<Tensor<'_>>| t.map(|t| i.node(op, t.id).map(|nd| nd.buf)).transpose();
    let mut inputs: SmallVec<[_; 3]> = smallvec![x.id];
    inputs.extend(weight.map(|w| w.id));
    inputs.extend(bias.map(|b| b.id));
    Ok(NormInputs {
        dtype,
        xb,
        wb: buf(weight)?,
        bb: buf(bias)?,
        inputs,
    })
}

/// `[1, C, 1, …]`: a per-channel tensor shaped to broadcast against `[N, C, …]`.
fn per_channel<'g>(t: Tensor<'g>, rank: usize, channels: usize) -> Result<Tensor<'g>> {
    let mut s = vec![1isize; rank];
    s[1] = channels as isize;
    t.reshape(&s)
}

/// The input viewed as its rows `[N, groups, C/groups · positions]`.
fn as_rows<'g>(t: Tensor<'g>, spec: k::GroupSpec) -> Result<Tensor<'g>> {
    t.reshape(&[
        spec.batch as isize,
        spec.groups as isize,
        spec.row_len() as isize,
    ])
}

/// Group normalisation in differentiable tensor ops: a layer norm over each row, then the
/// per-channel affine (the device's form; the host's fused op computes the same).
fn group_norm_in_ops<'g>(
    x: Tensor<'g>,
    spec: k::GroupSpec,
    (weight, bias): (Option<Tensor<'g>>, Option<Tensor<'g>>),
    eps: f64,
) -> Result<Tensor<'g>> {
    let shape: Vec<isize> = x.try_shape()?.iter().map(|&d| d as isize).collect();
    let mut y = as_rows(x, spec)?
        .layer_norm(1, None, None, eps)?
        .reshape(&shape)?;
    if let Some(w) = weight {
        y = y.mul(per_channel(w, shape.len(), spec.channels)?)?;
    }
    if let Some(b) = bias {
        y = y.add(per_channel(b, shape.len(), spec.channels)?)?;
    }
    Ok(y)
}

/// The fused group norm's backward: the host kernel, or under `create_graph` the rule in
/// tensor ops (`dx = rstd·(g − mean(g) − x̂·mean(g·x̂))` over each row with `g = gy·w`, the
/// weight's gradient `Σ gy·x̂` and the bias's `Σ gy` over all but the channel axis).
fn group_backward<'g>(nd: &NormNode, c: &Ctx<'g>) -> Result<Grads<'g>> {
    const OP: &str = "group_norm";
    let x = c.input(0);
    let w = nd.weight.then(|| c.input(1));
    let shape = x.try_shape()?;
    let spec = k::GroupSpec {
        batch: shape[0],
        channels: shape[1],
        positions: shape[2..].iter().product(),
        groups: nd.ndim as usize,
    };
    let gy = c.gy;
    if c.create_graph {
        let full: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
        let (xhat, rstd) = normalized(as_rows(x, spec)?, false, 1, nd.eps)?;
        let g = match w {
            Some(w) => gy.mul(per_channel(w, shape.len(), spec.channels)?)?,
            None => gy,
        };
        let g = as_rows(g, spec)?;
        let inner = g
            .sub(xhat.mul(g.mul(xhat)?.mean_axes(&[2], true)?)?)?
            .sub(g.mean_axes(&[2], true)?)?;
        let mut out: Grads<'g> = smallvec![Some(rstd.mul(inner)?.reshape(&full)?)];
        let others: Vec<isize> = (0..shape.len() as isize).filter(|&a| a != 1).collect();
        if nd.weight {
            let xhat = xhat.reshape(&full)?;
            out.push(Some(gy.mul(xhat)?.sum_axes(&others, false)?));
        }
        if nd.bias {
            out.push(Some(gy.sum_axes(&others, false)?));
        }
        return Ok(out);
    }
    if x.device() != Device::Cpu {
        // The fused op is only made on the host.
        return Err(GraphError::UnsupportedDType {
            op: OP,
            dtype: x.dtype_of(OP)?,
        });
    }
    let numel: usize = shape.iter().product();
    let mut guard = c.g.inner();
    let i = &mut *guard;
    let (dtype, xb) = {
        let xn = i.node(OP, x.id)?;
        (xn.dtype, xn.buf)
    };
    let gb = i.node(OP, gy.id)?.buf;
    let wb = w.map(|w| i.node(OP, w.id).map(|wn| wn.buf)).transpose()?;
    let stats = nd
        .stats
        .expect("invariant: a recorded norm keeps its statistics");
    let threads = i.threads;
    let dx = i.alloc_on(OP, Device::Cpu, dtype, numel)?;
    let dw = nd
        .weight
        .then(|| i.alloc_on(OP, Device::Cpu, dtype, spec.channels))
        .transpose()?;
    let db = nd
        .bias
        .then(|| i.alloc_on(OP, Device::Cpu, dtype, spec.channels))
        .transpose()?;
    with_float!(dtype, T, {
        let zero = <T as arenagrad_exec::Float>::ZERO;
        let (mut gw, mut gbias) = (vec![zero; spec.channels], vec![zero; spec.channels]);
        {
            let (d, [xs, gs, st, ws]) =
                i.split_mut::<T, 4>(OP, dx, [xb, gb, stats, wb.unwrap_or(xb)])?;
            let (dwv, dbv) = (dw.map(|_| &mut gw[..]), db.map(|_| &mut gbias[..]));
            k::group_norm_grad(spec, (xs, gs, st), wb.map(|_| ws), d, (dwv, dbv), threads);
        }
        for (buf, v) in [(dw, &gw), (db, &gbias)] {
            if let Some(buf) = buf {
                let (d, []) = i.split_mut::<T, 0>(OP, buf, [])?;
                d.copy_from_slice(v);
            }
        }
    });
    let mut out: Grads<'g> = SmallVec::new();
    let dx = i.push_on(Device::Cpu, copy_of(&shape), dtype, dx, Op::Leaf, &[]);
    out.push(Some(c.g.handle(dx)));
    for buf in [dw, db].into_iter().flatten() {
        let id = i.push_on(
            Device::Cpu,
            copy_of(&shape[1..2]),
            dtype,
            buf,
            Op::Leaf,
            &[],
        );
        out.push(Some(c.g.handle(id)));
    }
    drop(guard);
    Ok(out)
}

/// `(x̂, rstd)` for the last `ndim` axes, in differentiable ops (rstd keeps those axes as 1s).
fn normalized<'g>(
    x: Tensor<'g>,
    rms: bool,
    ndim: usize,
    eps: f64,
) -> Result<(Tensor<'g>, Tensor<'g>)> {
    let axes = trailing_axes(x.try_shape()?.len(), ndim);
    let xc = if rms {
        x
    } else {
        x.sub(x.mean_axes(&axes, true)?)?
    };
    let rstd = xc.mul(xc)?.mean_axes(&axes, true)?.shift(eps)?.powf(-0.5)?;
    Ok((xc.mul(rstd)?, rstd))
}

fn trailing_axes(rank: usize, ndim: usize) -> Vec<isize> {
    (rank - ndim..rank).map(|a| a as isize).collect()
}

/// The gradient of an affine parameter: `t` summed over the leading axes, in tensor ops.
fn over_rows<'g>(t: Tensor<'g>, ndim: usize) -> Result<Tensor<'g>> {
    let rank = t.try_shape()?.len();
    if rank == ndim {
        return Ok(t);
    }
    let lead: Vec<isize> = (0..rank - ndim).map(|a| a as isize).collect();
    t.sum_axes(&lead, false)
}

pub(crate) fn backward<'g>(nd: &NormNode, c: &Ctx<'g>) -> Result<Grads<'g>> {
    if nd.group {
        return group_backward(nd, c);
    }
    let x = c.input(0);
    let w = nd.weight.then(|| c.input(1));
    if c.create_graph {
        // A norm that stored its output in 16 bits gets its gradient so: the rule runs in the
        // input's dtype, and the gradients reach the f32 input and parameters in theirs.
        let gy = if c.gy.dtype_of("layer_norm")? == x.dtype_of("layer_norm")? {
            c.gy
        } else {
            c.gy.to_dtype(x.dtype_of("layer_norm")?)?
        };
        let ndim = nd.ndim as usize;
        let (xhat, rstd) = normalized(x, nd.rms, ndim, nd.eps)?;
        let axes = trailing_axes(x.try_shape()?.len(), ndim);
        let g = match w {
            Some(w) => gy.mul(w)?,
            None => gy,
        };
        let mut inner = g.sub(xhat.mul(g.mul(xhat)?.mean_axes(&axes, true)?)?)?;
        if !nd.rms {
            inner = inner.sub(g.mean_axes(&axes, true)?)?;
        }
        let mut out: Grads<'g> = smallvec![Some(rstd.mul(inner)?)];
        if nd.weight {
            out.push(Some(over_rows(gy.mul(xhat)?, ndim)?));
        }
        if nd.bias {
            out.push(Some(over_rows(gy, ndim)?));
        }
        return Ok(out);
    }
    let shape = x.try_shape()?;
    let trailing: Shape = copy_of(&shape[shape.len() - nd.ndim as usize..]);
    let n: usize = trailing.iter().product();
    let numel: usize = shape.iter().product();
    let op = if nd.rms { "rms_norm" } else { "layer_norm" };
    let dev = x.device();
    let mut guard = c.g.inner();
    let i = &mut *guard;
    let (dtype, xb) = {
        let xn = i.node(op, x.id)?;
        (xn.dtype, xn.buf)
    };
    // A norm that stored its output in a 16-bit dtype ([`Tensor::layer_norm_as`]) gets its
    // gradient in that dtype: widened into scratch for the f32 kernels.
    let (gb, widened) = {
        let gn = i.node(op, c.gy.id)?;
        let (gb, gd) = (gn.buf, gn.dtype);
        if gd == dtype {
            (gb, false)
        } else {
            i.widen_scratch(op, gb, gd)?
        }
    };
    let wb = w.map(|w| i.node(op, w.id).map(|wn| wn.buf)).transpose()?;
    let stats = nd
        .stats
        .expect("invariant: a recorded norm keeps its statistics");
    let threads = i.threads;
    let dx = i.alloc_on(op, dev, dtype, numel)?;
    let dw = if nd.weight {
        Some(i.alloc_on(op, dev, dtype, n)?)
    } else {
        None
    };
    let db = if nd.bias {
        Some(i.alloc_on(op, dev, dtype, n)?)
    } else {
        None
    };
    match dev {
        Device::Cpu => with_float!(dtype, T, {
            let (d, [xs, gs, st, ws]) =
                i.split_mut::<T, 4>(op, dx, [xb, gb, stats, wb.unwrap_or(xb)])?;
            let spec = k::NormSpec { n, rms: nd.rms };
            k::norm_grad_input(spec, xs, gs, st, wb.map(|_| ws), d, threads);
            let ins = [xb, gb, stats];
            match (dw, db) {
                (Some(dw), Some(db)) => {
                    let ([dw, db], [xs, gs, st]) = i.split_two_mut::<T, 3>(op, [dw, db], ins)?;
                    k::norm_grad_params((xs, gs, st), n, Some(dw), Some(db), threads);
                }
                (Some(dw), None) => {
                    let (dw, [xs, gs, st]) = i.split_mut::<T, 3>(op, dw, ins)?;
                    k::norm_grad_params((xs, gs, st), n, Some(dw), None, threads);
                }
                (None, Some(db)) => {
                    let (db, [xs, gs, st]) = i.split_mut::<T, 3>(op, db, ins)?;
                    k::norm_grad_params((xs, gs, st), n, None, Some(db), threads);
                }
                (None, None) => {}
            }
        }),
        Device::Cuda(_) => {
            let (wd, dwd, dbd) = (wb.unwrap_or(xb), dw.unwrap_or(dx), db.unwrap_or(dx));
            let st = stats;
            on_cuda!(
                i,
                op,
                dev,
                [xb, gb, st, dx, wd, dwd, dbd],
                |be, [xp, gp, sp, dxp, wp, dwp, dbp]| {
                    let rows = numel.checked_div(n).unwrap_or(0);
                    let (w, dw, db) = (wb.map(|_| wp), dw.map(|_| dwp), db.map(|_| dbp));
                    be.norm_grad_input(
                        dtype,
                        (xp, sp),
                        gp,
                        (rows, k::NormSpec { n, rms: nd.rms }),
                        w,
                        dxp,
                    )
                    .and_then(|()| be.norm_grad_params(dtype, (xp, sp), gp, [rows, n], (dw, db)))
                }
            )
        }
    }
    if widened {
        i.release_buf(Device::Cpu, gb)?;
    }
    let mut out: Grads<'g> = SmallVec::new();
    let dx = i.push_on(dev, shape, dtype, dx, Op::Leaf, &[]);
    out.push(Some(c.g.handle(dx)));
    for buf in [dw, db].into_iter().flatten() {
        let id = i.push_on(dev, trailing.clone(), dtype, buf, Op::Leaf, &[]);
        out.push(Some(c.g.handle(id)));
    }
    debug_assert_eq!(out.len(), 1 + usize::from(nd.weight) + usize::from(nd.bias));
    drop(guard);
    Ok(out)
}
