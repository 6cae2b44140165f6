//! The layers' computations as plain functions of tensors, for models that hold their weights as
//! tensors (or want to apply a layer's math to weights computed on the fly). The modules call
//! these with their parameters brought into the iteration.
//!
//! ```
//! use arenagrad_nn::{functional as F, DType, Graph};
//! let g = Graph::new();
//! let x = g.from_f64(&[1.0, 2.0], &[1, 2], DType::F64)?;
//! let w = g.from_f64(&[1.0, 0.0, 1.0, 1.0], &[2, 2], DType::F64)?; // [out, in]
//! let b = g.from_f64(&[0.5, -0.5], &[2], DType::F64)?;
//! let y = F::linear(x, w, Some(b))?;
//! assert_eq!(y.to_vec::<f64>()?, vec![1.5, 2.5]);
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use arenagrad_graph::{DType, Graph, GraphError, HostDataMut, Parameter, Storage, Tensor};

use crate::error::{input_shape, NnError, Result};

/// `x · wᵀ + b` over the last axis: `x` is `[…, in]`, `weight` `[out, in]`, `bias` `[out]`.
pub fn linear<'g>(
    x: Tensor<'g>,
    weight: Tensor<'g>,
    bias: Option<Tensor<'g>>,
) -> Result<Tensor<'g>> {
    linear_laid_out(x, weight, bias, true)
}

/// `x · w + b` over the last axis with `weight` stored `[in, out]` (transformers' `Conv1D`,
/// GPT-2's layout): `x` is `[…, in]`, `bias` `[out]`.
pub fn linear_in_out<'g>(
    x: Tensor<'g>,
    weight: Tensor<'g>,
    bias: Option<Tensor<'g>>,
) -> Result<Tensor<'g>> {
    linear_laid_out(x, weight, bias, false)
}

/// [`linear`] (`out_in`: weight `[out, in]`) or [`linear_in_out`].
fn linear_laid_out<'g>(
    x: Tensor<'g>,
    weight: Tensor<'g>,
    bias: Option<Tensor<'g>>,
    out_in: bool,
) -> Result<Tensor<'g>> {
    let (xs, ws) = (x.try_shape()?, weight.try_shape()?);
    let (in_at, out_at) = if out_in { (1, 0) } else { (0, 1) };
    if ws.len() != 2 || xs.is_empty() || xs[xs.len() - 1] != ws[in_at] {
        return Err(input_shape(
            "linear",
            &format!("[…, {}]", ws.get(in_at).copied().unwrap_or(0)),
            &xs,
        ));
    }
    let (in_f, out_f) = (ws[in_at], ws[out_at]);
    let x2 = if xs.len() == 2 {
        x
    } else {
        x.reshape(&[-1, in_f as isize])?
    };
    // x·Wᵀ with W read through transposed strides: no copy here, and none in backward either
    // (`gx = gy·W`, `gW = gyᵀ·x` are GEMMs with swapped strides too).
    // With a bias the GEMM adds its product onto the broadcast bias (`addmm`): no extra pass.
    let y = match bias {
        Some(b) => b.addmm_t(x2, weight, false, out_in)?,
        None => x2.matmul_t(weight, false, out_in)?,
    };
    Ok(if xs.len() == 2 {
        y
    } else {
        let mut shape: Vec<isize> = xs[..xs.len() - 1].iter().map(|&d| d as isize).collect();
        shape.push(out_f as isize);
        y.reshape(&shape)?
    })
}

/// A 2-D convolution with an optional bias: `x` `[N, C, H, W]`, `weight` `[O, C/groups, kh, kw]`,
/// `bias` `[O]`.
pub fn conv2d<'g>(
    x: Tensor<'g>,
    weight: Tensor<'g>,
    bias: Option<Tensor<'g>>,
    stride: (usize, usize),
    padding: (usize, usize),
    dilation: (usize, usize),
    groups: usize,
) -> Result<Tensor<'g>> {
    let (xs, ws) = (x.try_shape()?, weight.try_shape()?);
    if xs.len() != 4 || ws.len() != 4 || xs[1] != ws[1] * groups {
        return Err(input_shape(
            "conv2d",
            &format!("[N, {}, H, W]", ws.get(1).copied().unwrap_or(0) * groups),
            &xs,
        ));
    }
    Ok(x.conv2d_bias(weight, bias, stride, padding, dilation, groups)?)
}

/// The axes a batch norm reduces over for an input of rank `rank` (all but the channel axis 1).
fn bn_axes(rank: usize) -> Vec<isize> {
    std::iter::once(0)
        .chain(2..rank as isize)
        .collect::<Vec<isize>>()
}

/// The shape that broadcasts a per-channel `[C]` vector against an input of rank `rank`.
fn channel_shape(rank: usize) -> Vec<isize> {
    let mut s = vec![1isize; rank];
    s[1] = -1;
    s
}

/// Running statistics of a batch norm: `[C]` buffers updated in training mode.
#[derive(Debug, Clone, Copy)]
pub struct RunningStats<'a> {
    /// The running mean.
    pub mean: &'a Parameter,
    /// The running (unbiased) variance.
    pub var: &'a Parameter,
    /// Weight of the new batch's statistics: `running = (1 − momentum)·running + momentum·batch`.
    pub momentum: f64,
}

/// Batch normalisation over axis 1 of an `[N, C, …]` input (PyTorch's `F.batch_norm`).
///
/// With `training` (or without running statistics), normalises with the batch's mean and biased
/// variance, and — when `running` is given and `training` — updates the running mean and the
/// running *unbiased* variance. Otherwise normalises with the running statistics.
/// `weight` and `bias` (`[C]`) apply the affine transform.
pub fn batch_norm<'g>(
    g: &'g Graph,
    x: Tensor<'g>,
    running: Option<RunningStats<'_>>,
    weight: Option<Tensor<'g>>,
    bias: Option<Tensor<'g>>,
    training: bool,
    eps: f64,
) -> Result<Tensor<'g>> {
    // Before the running statistics move: a refused call changes nothing.
    let foreign = [Some(x), weight, bias]
        .into_iter()
        .flatten()
        .any(|t| !std::ptr::eq(t.graph(), g));
    if foreign {
        return Err(GraphError::GraphMismatch { op: "batch_norm" }.into());
    }
    let xs = x.try_shape()?;
    if xs.len() < 2 {
        return Err(input_shape("batch_norm", "[N, C, …]", &xs));
    }
    let rank = xs.len();
    let c = xs[1];
    if let Some(r) = &running {
        if r.mean.shape() != [c] || r.var.shape() != [c] {
            return Err(input_shape(
                "batch_norm",
                &format!(
                    "[N, {}, …] (the running statistics' length)",
                    r.mean.numel()
                ),
                &xs,
            ));
        }
    }
    let cs = channel_shape(rank);
    let axes = bn_axes(rank);
    let normalised = if let (false, Some(r)) = (training, &running) {
        let mean = r.mean.value();
        let var = r.var.value();
        let inv: Vec<f64> = var
            .to_f64_vec()
            .iter()
            .map(|v| 1.0 / (v + eps).sqrt())
            .collect();
        let dt = x.dtype();
        let dev = x.device();
        let mean_t = g
            .from_f64(&mean.to_f64_vec(), &[c], dt)?
            .to_device(dev)?
            .reshape(&cs)?;
        let inv_t = g.from_f64(&inv, &[c], dt)?.to_device(dev)?.reshape(&cs)?;
        x.sub(mean_t)?.mul(inv_t)?
    } else {
        let count = xs.iter().product::<usize>() / c.max(1);
        if count <= 1 && training {
            return Err(NnError::InputShape {
                op: "batch_norm",
                expected: "more than one value per channel in training mode".into(),
                got: xs.to_vec(),
            });
        }
        let mean = x.mean_axes(&axes, true)?;
        let xc = x.sub(mean)?;
        let var = xc.square()?.mean_axes(&axes, true)?;
        if let (Some(r), true) = (&running, training) {
            let m = mean.to_vec_f64()?;
            let v = var.to_vec_f64()?;
            let unbias = count as f64 / (count as f64 - 1.0);
            let mo = r.momentum;
            update_running(r.mean, &m, mo, 1.0);
            update_running(r.var, &v, mo, unbias);
        }
        xc.mul(var.shift(eps)?.powf(-0.5)?)?
    };
    let y = match weight {
        Some(w) => normalised.mul(w.reshape(&cs)?)?,
        None => normalised,
    };
    Ok(match bias {
        Some(b) => y.add(b.reshape(&cs)?)?,
        None => y,
    })
}

fn update_running(p: &Parameter, batch: &[f64], momentum: f64, factor: f64) {
    p.update(|v, _| match v {
        HostDataMut::F32(r) => r.iter_mut().zip(batch).for_each(|(r, &b)| {
            *r = (1.0 - momentum as f32) * *r + momentum as f32 * (b * factor) as f32
        }),
        HostDataMut::F64(r) => r
            .iter_mut()
            .zip(batch)
            .for_each(|(r, &b)| *r = (1.0 - momentum) * *r + momentum * (b * factor)),
        HostDataMut::BF16(r) => r
            .iter_mut()
            .zip(batch)
            .for_each(|(r, &b)| *r = Storage::narrow(blend(r.widen(), b * factor, momentum))),
        HostDataMut::F16(r) => r
            .iter_mut()
            .zip(batch)
            .for_each(|(r, &b)| *r = Storage::narrow(blend(r.widen(), b * factor, momentum))),
        // Running statistics are floating (an integer buffer is never made by the layers).
        _ => {}
    });
}

/// A running statistic's update in f32 (how PyTorch updates a 16-bit buffer), widened back.
fn blend(r: f64, batch: f64, momentum: f64) -> f64 {
    let m = momentum as f32;
    f64::from((1.0 - m) * r as f32 + m * batch as f32)
}

/// Layer normalisation over the last `normalized_ndim` axes, with an optional elementwise affine
/// transform (`weight` and `bias` have the shape of those axes): one fused op on the host
/// ([`Tensor::layer_norm`]).
pub fn layer_norm<'g>(
    x: Tensor<'g>,
    normalized_ndim: usize,
    weight: Option<Tensor<'g>>,
    bias: Option<Tensor<'g>>,
    eps: f64,
) -> Result<Tensor<'g>> {
    trailing_axes("layer_norm", x, normalized_ndim)?;
    Ok(x.layer_norm(normalized_ndim, weight, bias, eps)?)
}

/// [`layer_norm`] with its output stored in `dtype` (rounded once): what a product under
/// autocast would cast it to, without the full-precision copy ([`Tensor::layer_norm_as`]).
pub fn layer_norm_as<'g>(
    x: Tensor<'g>,
    normalized_ndim: usize,
    (weight, bias): (Option<Tensor<'g>>, Option<Tensor<'g>>),
    eps: f64,
    dtype: DType,
) -> Result<Tensor<'g>> {
    trailing_axes("layer_norm", x, normalized_ndim)?;
    Ok(x.layer_norm_as(normalized_ndim, weight, bias, eps, dtype)?)
}

/// Refuses normalising `ndim` trailing axes of `x` when it has fewer (or `ndim` is 0).
fn trailing_axes(op: &'static str, x: Tensor<'_>, ndim: usize) -> Result<()> {
    let xs = x.try_shape()?;
    if ndim == 0 || ndim > xs.len() {
        return Err(input_shape(
            op,
            &format!("a tensor of rank ≥ {ndim} (and ≥ 1)"),
            &xs,
        ));
    }
    Ok(())
}

/// RMS normalisation over the last `normalized_ndim` axes, `x/√(mean(x²) + eps)·weight`
/// (PyTorch's `rms_norm`), with an optional elementwise scale of the shape of those axes.
pub fn rms_norm<'g>(
    x: Tensor<'g>,
    normalized_ndim: usize,
    weight: Option<Tensor<'g>>,
    eps: f64,
) -> Result<Tensor<'g>> {
    trailing_axes("rms_norm", x, normalized_ndim)?;
    Ok(x.rms_norm(normalized_ndim, weight, eps)?)
}

/// Rows `indices` of `weight` (`[num, dim]`), shaped `[index_shape…, dim]`.
pub fn embedding<'g>(
    weight: Tensor<'g>,
    indices: &[usize],
    index_shape: &[usize],
) -> Result<Tensor<'g>> {
    let ws = weight.try_shape()?;
    if ws.len() != 2 {
        return Err(input_shape(
            "embedding",
            "a weight of shape [num, dim]",
            &ws,
        ));
    }
    if index_shape.iter().product::<usize>() != indices.len() {
        return Err(NnError::InvalidConfig {
            component: "embedding",
            reason: format!("{} indices for index shape {index_shape:?}", indices.len()),
        });
    }
    if let Some((position, &index)) = indices.iter().enumerate().find(|(_, &i)| i >= ws[0]) {
        return Err(NnError::IndexOutOfRange {
            op: "embedding",
            position,
            index,
            bound: ws[0],
        });
    }
    let rows = weight.index_select(0, indices)?;
    let mut shape: Vec<isize> = index_shape.iter().map(|&d| d as isize).collect();
    shape.push(ws[1] as isize);
    Ok(rows.reshape(&shape)?)
}

/// Reads a tensor of integer-valued floats as indices (what an embedding's input holds).
pub fn tensor_to_indices(op: &'static str, x: Tensor<'_>) -> Result<Vec<usize>> {
    x.to_vec_f64()?
        .into_iter()
        .enumerate()
        .map(|(position, v)| {
            if v >= 0.0 && v.fract() == 0.0 && v < usize::MAX as f64 {
                Ok(v as usize)
            } else {
                Err(NnError::NotAnIndex {
                    op,
                    position,
                    value: v,
                })
            }
        })
        .collect()
}

/// Max pooling of an `[N, C, H, W]` input over `kernel` windows, with implicit `−∞` padding of
/// `padding` (at most half the kernel) on each side. The outputs are input elements exactly.
pub fn max_pool2d<'g>(
    x: Tensor<'g>,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> Result<Tensor<'g>> {
    let xs = x.try_shape()?;
    if xs.len() != 4 {
        return Err(input_shape("max_pool2d", "[N, C, H, W]", &xs));
    }
    if padding.0 > kernel.0 / 2 || padding.1 > kernel.1 / 2 {
        return Err(NnError::InvalidConfig {
            component: "max_pool2d",
            reason: format!("padding {padding:?} must be at most half the kernel {kernel:?}"),
        });
    }
    // The graph op never picks padding, so the output holds input elements exactly.
    Ok(x.max_pool2d(kernel, stride, padding)?)
}

/// `block(x)` with gradient checkpointing (PyTorch's `torch.utils.checkpoint.checkpoint`):
/// recorded as one node that keeps only `x` and the output; backward runs the block again to
/// rebuild its activations, each freed once its own backward step is done. Gradients — the block's parameters' and
/// `x`'s — are those without checkpointing, bit for bit, dropout masks included (the graph's
/// generator is replayed); `create_graph` works through it.
///
/// The block is shared through an `Arc` because backward calls it after this call returns,
/// from the graph's tape, as late as the iteration's reset.
///
/// ```
/// use std::sync::Arc;
/// use arenagrad_nn::{functional as F, DType, Graph, Linear, Module, Rng, Sequential, Tanh};
/// let mut rng = Rng::seed(0);
/// let block = Arc::new(Sequential::new().add(Linear::new(8, 8, &mut rng)?).add(Tanh));
/// let g = Graph::new();
/// let x = g.ones(&[4, 8], DType::F32)?;
/// let y = F::checkpoint(&g, &block, x)?; // the activations inside are not kept
/// y.sum()?.backward()?; // ... but made again here
/// assert!(block.parameters()[0].grad().is_some());
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub fn checkpoint<'g, M>(
    g: &'g Graph,
    block: &std::sync::Arc<M>,
    x: Tensor<'g>,
) -> Result<Tensor<'g>>
where
    M: crate::Module + Send + Sync + 'static,
{
    let b = std::sync::Arc::clone(block);
    let f: arenagrad_graph::CheckpointFn = std::sync::Arc::new(move |g, xs| {
        b.forward(g, xs[0]).map_err(|e| match e {
            NnError::Graph(e) => e,
            other => GraphError::Checkpoint {
                msg: other.to_string(),
            },
        })
    });
    Ok(g.checkpoint(f, &[x])?)
}
