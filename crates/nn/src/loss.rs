//! Loss functions: mean squared error, cross-entropy from logits (with label smoothing), negative
//! log-likelihood, and binary cross-entropy from logits.
//!
//! Each plain function averages over the batch (PyTorch's default `reduction="mean"`); the `_with`
//! forms take a [`Reduction`] (and, for cross-entropy, [`CrossEntropyOptions`]).
//!
//! ```
//! use arenagrad_nn::{loss, DType, Graph};
//! let g = Graph::new();
//! let logits = g.from_f64(&[2.0, 0.0, 0.0, 0.0, 3.0, 0.0], &[2, 3], DType::F64)?;
//! let l = loss::cross_entropy(logits, &[0, 1])?.item()?;
//! let want = ((1.0 + 2.0 * (-2f64).exp()).ln() + (1.0 + 2.0 * (-3f64).exp()).ln()) / 2.0;
//! assert!((l - want).abs() < 1e-12);
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use std::sync::Arc;

use arenagrad_graph::exec::cpu;
use arenagrad_graph::{CustomOp, DType, Device, Elem, Graph, HostData, Tensor};

use crate::error::{config, input_shape, NnError, Result};

/// How per-element losses are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The mean (the default).
    #[default]
    Mean,
    /// The sum.
    Sum,
    /// No reduction: one loss per element (per sample for cross-entropy and NLL).
    None,
}

fn reduce<'g>(l: Tensor<'g>, r: Reduction) -> Result<Tensor<'g>> {
    Ok(match r {
        Reduction::Mean => l.mean()?,
        Reduction::Sum => l.sum()?,
        Reduction::None => l,
    })
}

fn same_shape(op: &'static str, a: &Tensor<'_>, b: &Tensor<'_>) -> Result<()> {
    let (sa, sb) = (a.try_shape()?, b.try_shape()?);
    if sa != sb {
        return Err(input_shape(op, &format!("a target of shape {sa:?}"), &sb));
    }
    Ok(())
}

/// Mean of `(pred − target)²`; the shapes must be equal.
pub fn mse_loss<'g>(pred: Tensor<'g>, target: Tensor<'g>) -> Result<Tensor<'g>> {
    mse_loss_with(pred, target, Reduction::Mean)
}

/// `(pred − target)²` reduced by `reduction`.
pub fn mse_loss_with<'g>(
    pred: Tensor<'g>,
    target: Tensor<'g>,
    reduction: Reduction,
) -> Result<Tensor<'g>> {
    same_shape("mse_loss", &pred, &target)?;
    reduce(pred.sub(target)?.square()?, reduction)
}

/// Options of [`cross_entropy_with`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CrossEntropyOptions {
    /// ε in `[0, 1]`: the target distribution is `(1 − ε)·onehot + ε/C` (default 0).
    pub label_smoothing: f64,
    /// How per-sample losses are combined (default mean).
    pub reduction: Reduction,
}

/// Brings class scores `[N, C]`, `[N, C, d…]` or `[C]` to rows `[M, C]`, checking the targets;
/// returns the rows and the shape a `Reduction::None` result takes.
fn class_rows<'g>(
    op: &'static str,
    x: Tensor<'g>,
    targets: &[usize],
) -> Result<(Tensor<'g>, Vec<isize>)> {
    let s = x.try_shape()?;
    let (rows, out_shape): (Tensor<'g>, Vec<isize>) = match s.len() {
        0 => return Err(input_shape(op, "[N, C], [N, C, d…] or [C]", &s)),
        1 => (x.reshape(&[1, s[0] as isize])?, vec![]),
        2 => (x, vec![s[0] as isize]),
        r => {
            let mut perm: Vec<usize> = vec![0];
            perm.extend(2..r);
            perm.push(1);
            let out: Vec<isize> = std::iter::once(s[0])
                .chain(s[2..].iter().copied())
                .map(|d| d as isize)
                .collect();
            (x.permute(&perm)?.reshape(&[-1, s[1] as isize])?, out)
        }
    };
    let rs = rows.try_shape()?;
    let (m, c) = (rs[0], rs[1]);
    if targets.len() != m {
        return Err(NnError::TargetCount {
            op,
            predictions: m,
            targets: targets.len(),
        });
    }
    if let Some((position, &index)) = targets.iter().enumerate().find(|(_, &t)| t >= c) {
        return Err(NnError::IndexOutOfRange {
            op,
            position,
            index,
            bound: c,
        });
    }
    Ok((rows, out_shape))
}

/// Cross-entropy of class scores (logits, before softmax) against class indices, averaged over
/// the samples. `logits` is `[N, C]` (or `[N, C, d…]` with targets in `[N, d…]` row-major order,
/// or `[C]` with one target).
pub fn cross_entropy<'g>(logits: Tensor<'g>, targets: &[usize]) -> Result<Tensor<'g>> {
    cross_entropy_with(logits, targets, CrossEntropyOptions::default())
}

/// [`cross_entropy`] with label smoothing and a reduction: per sample,
/// `(1 − ε)·(−log p[target]) + ε·mean_c(−log p[c])`, as PyTorch computes it.
pub fn cross_entropy_with<'g>(
    logits: Tensor<'g>,
    targets: &[usize],
    opts: CrossEntropyOptions,
) -> Result<Tensor<'g>> {
    let eps = opts.label_smoothing;
    if !(0.0..=1.0).contains(&eps) {
        return Err(config(
            "cross_entropy",
            format!("label_smoothing must be in [0, 1], got {eps}"),
        ));
    }
    let (rows, out_shape) = class_rows("cross_entropy", logits, targets)?;
    if eps == 0.0 && opts.reduction == Reduction::Mean && rows.device() == Device::Cpu {
        return fused_cross_entropy(rows, targets);
    }
    let lsm = rows.log_softmax(-1)?;
    let nll = pick_neg(lsm, targets)?;
    let per_sample = if eps > 0.0 {
        let smooth = lsm.mean_axes(&[1], false)?.neg()?;
        nll.scale(1.0 - eps)?.add(smooth.scale(eps)?)?
    } else {
        nll
    };
    finish(per_sample, &out_shape, opts.reduction)
}

/// The mean cross-entropy of host class-score rows `[m, c]` as one recorded op, as PyTorch fuses
/// log-softmax and NLL: forward is one log-softmax pass over the rows and the mean of the targets'
/// entries; backward is `(softmax − onehot)·gy/m` in one pass — or, under `create_graph`, the
/// same written in tensor ops, so that it can be differentiated again. The composed form
/// (`log_softmax`, `gather`, `neg`, `mean`) records five nodes and runs five backward kernels.
fn fused_cross_entropy<'g>(rows: Tensor<'g>, targets: &[usize]) -> Result<Tensor<'g>> {
    match rows.dtype() {
        DType::F32 => fused_cross_entropy_as::<f32>(rows, targets),
        DType::F64 => fused_cross_entropy_as::<f64>(rows, targets),
    }
}

fn fused_cross_entropy_as<'g, T: Elem>(rows: Tensor<'g>, targets: &[usize]) -> Result<Tensor<'g>> {
    let g = rows.graph();
    let (m, c) = (targets.len(), rows.try_shape()?[1]);
    let x = rows.to_vec::<T>()?;
    let mut lsm = vec![T::ZERO; x.len()];
    cpu::softmax(&x, &[m, c], 1, true, &mut lsm);
    // As the composed form computes it: the negated entries summed, then scaled by 1/m.
    let picked: Vec<T> = targets
        .iter()
        .enumerate()
        .map(|(r, &t)| -lsm[r * c + t])
        .collect();
    let loss = cpu::sum_row(&picked) * T::from_f64(1.0 / m as f64);
    let value = {
        let _ng = g.no_grad();
        g.from_slice(&[loss], &[])?
    };
    let op = FusedCrossEntropy {
        targets: targets.to_vec(),
        classes: c,
        log_probs: T::into_host(lsm),
    };
    Ok(g.custom(Arc::new(op), &[rows], value)?)
}

/// The backward rule of [`fused_cross_entropy`], with what the forward computed.
struct FusedCrossEntropy {
    targets: Vec<usize>,
    classes: usize,
    /// The rows' log-softmax.
    log_probs: HostData,
}

impl FusedCrossEntropy {
    /// `(e^lsm − onehot)·k` as a `[m, c]` tensor.
    fn grad<'g, T: Elem>(&self, g: &'g Graph, k: f64) -> arenagrad_graph::Result<Tensor<'g>> {
        let lsm =
            T::host_slice(&self.log_probs).expect("invariant: log-probs have the rows' dtype");
        let mut gx = vec![T::ZERO; lsm.len()];
        T::exp_into(lsm, &mut gx);
        for (r, &t) in self.targets.iter().enumerate() {
            gx[r * self.classes + t] -= T::ONE;
        }
        let k = T::from_f64(k);
        gx.iter_mut().for_each(|v| *v *= k);
        g.from_slice(&gx, &[self.targets.len(), self.classes])
    }
}

impl CustomOp for FusedCrossEntropy {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }

    fn backward<'g>(
        &self,
        g: &'g Graph,
        inputs: &[Tensor<'g>],
        _output: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> arenagrad_graph::Result<Vec<Option<Tensor<'g>>>> {
        let x = inputs[0];
        if !x.requires_grad() {
            return Ok(vec![None]);
        }
        let (m, c) = (self.targets.len(), self.classes);
        let inv_m = 1.0 / m as f64;
        if g.is_grad_enabled() {
            // create_graph: differentiable in x (through softmax) and in gy.
            let mut onehot = vec![0.0; m * c];
            for (r, &t) in self.targets.iter().enumerate() {
                onehot[r * c + t] = 1.0;
            }
            let onehot = g.from_f64(&onehot, &[m, c], x.dtype())?;
            let gx = x.softmax(-1)?.sub(onehot)?.mul(gy.scale(inv_m)?)?;
            return Ok(vec![Some(gx)]);
        }
        let k = gy.item()? * inv_m;
        let gx = match x.dtype() {
            DType::F32 => self.grad::<f32>(g, k)?,
            DType::F64 => self.grad::<f64>(g, k)?,
        };
        Ok(vec![Some(gx)])
    }
}

/// `−rows[i, targets[i]]` as a vector `[M]`.
fn pick_neg<'g>(rows: Tensor<'g>, targets: &[usize]) -> Result<Tensor<'g>> {
    let m = targets.len();
    Ok(rows
        .gather(1, targets, &[m, 1])?
        .reshape(&[m as isize])?
        .neg()?)
}

fn finish<'g>(per_sample: Tensor<'g>, out_shape: &[isize], r: Reduction) -> Result<Tensor<'g>> {
    match r {
        Reduction::None => Ok(per_sample.reshape(out_shape)?),
        r => reduce(per_sample, r),
    }
}

/// Negative log-likelihood of log-probabilities (`[N, C]`, say from `log_softmax`) against class
/// indices, averaged over the samples.
pub fn nll_loss<'g>(log_probs: Tensor<'g>, targets: &[usize]) -> Result<Tensor<'g>> {
    nll_loss_with(log_probs, targets, Reduction::Mean)
}

/// [`nll_loss`] with a reduction.
pub fn nll_loss_with<'g>(
    log_probs: Tensor<'g>,
    targets: &[usize],
    reduction: Reduction,
) -> Result<Tensor<'g>> {
    let (rows, out_shape) = class_rows("nll_loss", log_probs, targets)?;
    finish(pick_neg(rows, targets)?, &out_shape, reduction)
}

/// Binary cross-entropy of logits `x` against targets `y` in `[0, 1]` (same shape), averaged:
/// `max(x, 0) − x·y + log(1 + e^−|x|)`, which never overflows. Its gradient is
/// `σ(x) − y` exactly, including at `x = 0`.
pub fn bce_with_logits<'g>(logits: Tensor<'g>, targets: Tensor<'g>) -> Result<Tensor<'g>> {
    bce_with_logits_with(logits, targets, Reduction::Mean)
}

/// [`bce_with_logits`] with a reduction.
pub fn bce_with_logits_with<'g>(
    logits: Tensor<'g>,
    targets: Tensor<'g>,
    reduction: Reduction,
) -> Result<Tensor<'g>> {
    same_shape("bce_with_logits", &logits, &targets)?;
    let g = logits.graph();
    let value = {
        let _ng = g.no_grad();
        bce_value(logits, targets)?
    };
    let per_element = g.custom(Arc::new(BceWithLogits), &[logits, targets], value)?;
    reduce(per_element, reduction)
}

fn bce_value<'g>(x: Tensor<'g>, y: Tensor<'g>) -> arenagrad_graph::Result<Tensor<'g>> {
    let softplus = x.abs()?.neg()?.exp()?.shift(1.0)?.log()?;
    x.relu()?.sub(x.mul(y)?)?.add(softplus)
}

/// The elementwise BCE-with-logits op: its backward is `gy·(σ(x) − y)` for the logits and
/// `−gy·x` for the targets.
struct BceWithLogits;

impl CustomOp for BceWithLogits {
    fn name(&self) -> &'static str {
        "bce_with_logits"
    }

    fn backward<'g>(
        &self,
        _g: &'g Graph,
        inputs: &[Tensor<'g>],
        _output: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> arenagrad_graph::Result<Vec<Option<Tensor<'g>>>> {
        let (x, y) = (inputs[0], inputs[1]);
        let gx = if x.requires_grad() {
            Some(gy.mul(x.sigmoid()?.sub(y)?)?)
        } else {
            None
        };
        let gt = if y.requires_grad() {
            Some(gy.mul(x)?.neg()?)
        } else {
            None
        };
        Ok(vec![gx, gt])
    }
}
