//! Loss functions: mean squared error, L1, smooth L1 and Huber, cross-entropy from logits (with
//! label smoothing), negative log-likelihood, Kullback–Leibler divergence, and binary
//! cross-entropy from logits and from probabilities.
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

use arenagrad_graph::{CustomOp, Graph, Tensor};

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
    let (pred, target) = (f32_under_autocast(pred)?, f32_under_autocast(target)?);
    same_shape("mse_loss", &pred, &target)?;
    reduce(pred.sub(target)?.square()?, reduction)
}

/// A 16-bit operand of a loss widened to f32 inside an autocast scope: losses are on autocast's
/// f32 list, as on PyTorch's (`mse_loss`, `cross_entropy_loss`, `nll_loss`,
/// `binary_cross_entropy_with_logits`), so a loss and its gradient are not rounded to 16 bits.
fn f32_under_autocast(t: Tensor<'_>) -> Result<Tensor<'_>> {
    Ok(t.autocast_f32_operand()?)
}

/// Options of [`cross_entropy_with`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CrossEntropyOptions {
    /// ε in `[0, 1]`: the target distribution is `(1 − ε)·onehot + ε/C` (default 0).
    pub label_smoothing: f64,
    /// How per-sample losses are combined (default mean).
    pub reduction: Reduction,
    /// A target value that contributes nothing (PyTorch's `ignore_index`, there −100 by
    /// default; here none by default): its samples' losses are 0, the mean is over the others
    /// (NaN when every target is ignored, as PyTorch's), and it need not be a class. A negative
    /// value (−100, as Hugging Face labels pad) is met only in an integer target tensor
    /// ([`cross_entropy_by`]).
    pub ignore_index: Option<i64>,
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
///
/// # Examples
///
/// ```
/// use arenagrad_nn::{loss, DType, Graph};
/// let g = Graph::new();
/// // Two samples, four classes, all scores equal: each class has probability 1/4.
/// let logits = g.leaf(&[0.0; 8], &[2, 4], DType::F64)?;
/// // torch: F.cross_entropy(logits, torch.tensor([0, 3]))
/// let l = loss::cross_entropy(logits, &[0, 3])?;
/// assert!((l.item()? - 4f64.ln()).abs() < 1e-12);
/// l.backward()?;
/// // The gradient is (softmax − one-hot) / N.
/// let want = [-0.375, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, -0.375];
/// let got = logits.grad()?.map(|d| d.to_vec::<f64>()).transpose()?.unwrap_or_default();
/// assert_eq!(got.len(), want.len());
/// assert!(got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12), "{got:?}");
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
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
    let logits = f32_under_autocast(logits)?;
    let ignored = opts
        .ignore_index
        .and_then(|ig| usize::try_from(ig).ok())
        .filter(|ig| targets.contains(ig));
    if let Some(ig) = ignored {
        // The ignored samples computed against class 0, then masked out.
        let safe: Vec<usize> = targets
            .iter()
            .map(|&t| if t == ig { 0 } else { t })
            .collect();
        let keep: Vec<f64> = targets
            .iter()
            .map(|&t| f64::from(u8::from(t != ig)))
            .collect();
        let per_sample = cross_entropy_with(
            logits,
            &safe,
            CrossEntropyOptions {
                reduction: Reduction::None,
                ignore_index: None,
                ..opts
            },
        )?;
        let shape = per_sample.try_shape()?;
        let mask = logits.graph().from_f64(&keep, &shape, per_sample.dtype())?;
        let masked = per_sample.mul(mask)?;
        return Ok(match opts.reduction {
            Reduction::None => masked,
            Reduction::Sum => masked.sum()?,
            Reduction::Mean => {
                let count = keep.iter().sum::<f64>();
                masked.sum()?.scale(1.0 / count)?
            }
        });
    }
    let (rows, out_shape) = class_rows("cross_entropy", logits, targets)?;
    if eps == 0.0 && opts.reduction == Reduction::Mean {
        // One recorded op (log-softmax and the targets' mean fused): the composed form below
        // records five nodes and runs five backward kernels.
        return Ok(rows.cross_entropy_mean(targets)?);
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

/// [`cross_entropy_with`] with the targets in an integer tensor (`i64`, `i32` or `u8`, PyTorch's
/// `target`), of the shape a `Reduction::None` result takes; entries equal to `ignore_index`
/// (−100, say) are ignored, other negative ones are an error.
///
/// ```
/// use arenagrad_nn::{loss, DType, Graph};
/// let g = Graph::new();
/// let logits = g.leaf(&[0.0; 8], &[2, 4], DType::F64)?;
/// let labels = g.from_slice(&[3i64, -100], &[2])?;
/// let opts = loss::CrossEntropyOptions { ignore_index: Some(-100), ..Default::default() };
/// let l = loss::cross_entropy_by(logits, labels, opts)?;
/// assert!((l.item()? - 4f64.ln()).abs() < 1e-12);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub fn cross_entropy_by<'g>(
    logits: Tensor<'g>,
    targets: Tensor<'g>,
    opts: CrossEntropyOptions,
) -> Result<Tensor<'g>> {
    let (t, ignore) = target_values("cross_entropy", targets, opts.ignore_index)?;
    cross_entropy_with(
        logits,
        &t,
        CrossEntropyOptions {
            ignore_index: ignore,
            ..opts
        },
    )
}

/// [`nll_loss_with`] with the targets in an integer tensor (as [`cross_entropy_by`], without
/// an ignored value).
pub fn nll_loss_by<'g>(
    log_probs: Tensor<'g>,
    targets: Tensor<'g>,
    reduction: Reduction,
) -> Result<Tensor<'g>> {
    let (t, _) = target_values("nll_loss", targets, None)?;
    nll_loss_with(log_probs, &t, reduction)
}

/// A target tensor's values as class indices, an ignored negative value mapped to one past
/// any class ([`IGNORED`]), which is then the value to ignore.
const IGNORED: usize = i64::MAX as usize;

fn target_values(
    op: &'static str,
    targets: Tensor<'_>,
    ignore: Option<i64>,
) -> Result<(Vec<usize>, Option<i64>)> {
    let raw = targets.integer_values(op)?;
    let mapped = match ignore {
        Some(ig) if ig < 0 && raw.contains(&ig) => {
            let t = raw
                .iter()
                .map(|&v| if v == ig { IGNORED } else { v as usize })
                .collect::<Vec<usize>>();
            (t, Some(IGNORED as i64))
        }
        _ => (raw.iter().map(|&v| v as usize).collect(), ignore),
    };
    if let Some(position) = raw
        .iter()
        .zip(&mapped.0)
        .position(|(&v, &t)| v < 0 && t != IGNORED)
    {
        return Err(NnError::NotAnIndex {
            op,
            position,
            value: raw[position] as f64,
        });
    }
    Ok(mapped)
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
    let log_probs = f32_under_autocast(log_probs)?;
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
    let (logits, targets) = (f32_under_autocast(logits)?, f32_under_autocast(targets)?);
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

/// Mean of `|pred − target|` (PyTorch's `l1_loss`); the shapes must be equal. Its gradient at
/// `pred = target` is 0, as PyTorch's.
pub fn l1_loss<'g>(pred: Tensor<'g>, target: Tensor<'g>) -> Result<Tensor<'g>> {
    l1_loss_with(pred, target, Reduction::Mean)
}

/// `|pred − target|` reduced by `reduction`.
pub fn l1_loss_with<'g>(
    pred: Tensor<'g>,
    target: Tensor<'g>,
    reduction: Reduction,
) -> Result<Tensor<'g>> {
    let (pred, target) = (f32_under_autocast(pred)?, f32_under_autocast(target)?);
    same_shape("l1_loss", &pred, &target)?;
    reduce(pred.sub(target)?.abs()?, reduction)
}

/// PyTorch's `smooth_l1_loss`: per element `0.5·d²/β` where `|d| < β`, `|d| − 0.5·β`
/// elsewhere (`d = pred − target`; β = 0 is the L1 loss), reduced by `reduction`. Written as
/// `0.5·min(|d|, β)²/β + (|d| − min(|d|, β))`, whose gradient is PyTorch's everywhere: `d/β`
/// inside, `sign(d)` outside and at `|d| = β`, 0 at `d = 0`.
pub fn smooth_l1_loss<'g>(
    pred: Tensor<'g>,
    target: Tensor<'g>,
    beta: f64,
    reduction: Reduction,
) -> Result<Tensor<'g>> {
    if !(beta >= 0.0 && beta.is_finite()) {
        return Err(config(
            "smooth_l1_loss",
            format!("beta must be finite and non-negative, got {beta}"),
        ));
    }
    if beta == 0.0 {
        return l1_loss_with(pred, target, reduction);
    }
    let (pred, target) = (f32_under_autocast(pred)?, f32_under_autocast(target)?);
    same_shape("smooth_l1_loss", &pred, &target)?;
    reduce(smooth_l1(pred.sub(target)?, beta)?, reduction)
}

/// `0.5·min(|d|, β)²/β + (|d| − min(|d|, β))`, elementwise.
fn smooth_l1(d: Tensor<'_>, beta: f64) -> Result<Tensor<'_>> {
    let a = d.abs()?;
    let inside = a.clamp(None, Some(beta))?;
    Ok(inside.square()?.scale(0.5 / beta)?.add(a.sub(inside)?)?)
}

/// PyTorch's `huber_loss`: per element `0.5·d²` where `|d| ≤ δ`, `δ·(|d| − 0.5·δ)` elsewhere
/// (`δ·smooth_l1` with β = δ), reduced by `reduction`; δ must be positive.
pub fn huber_loss<'g>(
    pred: Tensor<'g>,
    target: Tensor<'g>,
    delta: f64,
    reduction: Reduction,
) -> Result<Tensor<'g>> {
    if !(delta > 0.0 && delta.is_finite()) {
        return Err(config(
            "huber_loss",
            format!("delta must be finite and positive, got {delta}"),
        ));
    }
    let (pred, target) = (f32_under_autocast(pred)?, f32_under_autocast(target)?);
    same_shape("huber_loss", &pred, &target)?;
    reduce(
        smooth_l1(pred.sub(target)?, delta)?.scale(delta)?,
        reduction,
    )
}

/// The Kullback–Leibler divergence of `target` from the distribution whose log-probabilities
/// are `input` (PyTorch's `kl_div(input, target, reduction="batchmean")`): the sum over all
/// elements of `target·(log target − input)` (0 where `target` is 0), divided by the batch size
/// (`input`'s first extent; a scalar's by 1, an empty batch's 0 by 0, NaN, as PyTorch's) — the
/// KL divergence per sample. The shapes must be equal.
pub fn kl_div<'g>(input: Tensor<'g>, target: Tensor<'g>) -> Result<Tensor<'g>> {
    let n = input.try_shape()?.first().copied().unwrap_or(1);
    Ok(kl_div_with(input, target, false, Reduction::Sum)?.scale(1.0 / n as f64)?)
}

/// [`kl_div`]'s pointwise terms with the target given as log-probabilities when `log_target`
/// (`exp(t)·(t − input)`), reduced by `reduction` (`Mean` is PyTorch's `"mean"`, over every
/// element; [`kl_div`] is its `"batchmean"`).
///
/// Where a probability target is 0 its term is 0 and the target's gradient is finite,
/// `log(the smallest normal number) − input` (about −708 − input in f64); PyTorch's is NaN there
/// (its `xlogy` differentiates `0/0`). The input's gradient, `−target`, is PyTorch's.
pub fn kl_div_with<'g>(
    input: Tensor<'g>,
    target: Tensor<'g>,
    log_target: bool,
    reduction: Reduction,
) -> Result<Tensor<'g>> {
    let (input, target) = (f32_under_autocast(input)?, f32_under_autocast(target)?);
    same_shape("kl_div", &input, &target)?;
    let pointwise = if log_target {
        target.exp()?.mul(target.sub(input)?)?
    } else {
        // x·log x with 0·log 0 = 0 (PyTorch's xlogy): the logarithm of the target clamped to
        // the smallest normal number, which a zero target then multiplies away.
        let floor = match target.dtype() {
            arenagrad_graph::DType::F64 => f64::MIN_POSITIVE,
            _ => f64::from(f32::MIN_POSITIVE),
        };
        let log_t = target.clamp(Some(floor), None)?.log()?;
        target.mul(log_t.sub(input)?)?
    };
    reduce(pointwise, reduction)
}

/// Binary cross-entropy of probabilities `x` in `[0, 1]` against targets `y` (PyTorch's
/// `binary_cross_entropy`), averaged: `−(y·log x + (1 − y)·log(1 − x))`, each logarithm
/// clamped at −100 as PyTorch clamps it, so that `x` of exactly 0 or 1 gives a finite loss.
/// Its gradient is PyTorch's: `(x − y)/max(x·(1 − x), ε)` for `x` (ε its f32 `1e-12`), and
/// `log(1 − x) − log x` for `y` (unclamped: ±∞ at `x` of exactly 0 or 1). Prefer [`bce_with_logits`] on logits:
/// it never saturates.
///
/// Errors: an input or a target outside `[0, 1]` (or NaN) is [`NnError::BadData`], as PyTorch
/// refuses them.
pub fn bce<'g>(probs: Tensor<'g>, targets: Tensor<'g>) -> Result<Tensor<'g>> {
    bce_with(probs, targets, Reduction::Mean)
}

/// [`bce`] with a reduction.
pub fn bce_with<'g>(
    probs: Tensor<'g>,
    targets: Tensor<'g>,
    reduction: Reduction,
) -> Result<Tensor<'g>> {
    let (x, y) = (f32_under_autocast(probs)?, f32_under_autocast(targets)?);
    same_shape("bce", &x, &y)?;
    // PyTorch refuses an input or a target outside [0, 1] (NaN included), the input first;
    // so does this, reading both (a copy from the device on CUDA).
    for (t, name) in [(x, "input"), (y, "target")] {
        if let Some((position, v)) = t
            .to_vec_f64()?
            .into_iter()
            .enumerate()
            .find(|(_, v)| !(0.0..=1.0).contains(v))
        {
            return Err(NnError::BadData {
                what: "bce",
                reason: format!("{name} {v} at position {position} is not between 0 and 1"),
            });
        }
    }
    let g = x.graph();
    let value = {
        let _ng = g.no_grad();
        let (log_x, log_1mx) = clamped_logs(x)?;
        y.mul(log_x)?
            .add(y.neg()?.shift(1.0)?.mul(log_1mx)?)?
            .neg()?
    };
    let per_element = g.custom(Arc::new(Bce), &[x, y], value)?;
    reduce(per_element, reduction)
}

/// `max(log x, −100)` and `max(log(1 − x), −100)`.
fn clamped_logs(x: Tensor<'_>) -> arenagrad_graph::Result<(Tensor<'_>, Tensor<'_>)> {
    Ok((
        x.log()?.clamp(Some(-100.0), None)?,
        x.neg()?.shift(1.0)?.log()?.clamp(Some(-100.0), None)?,
    ))
}

/// The elementwise binary cross-entropy of probabilities, with PyTorch's backward.
struct Bce;

impl CustomOp for Bce {
    fn name(&self) -> &'static str {
        "bce"
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
            // PyTorch's ε is 1e-12 as an f32 constant (9.999999960e-13), in every dtype.
            let eps = f64::from(1e-12f32);
            let denom = x.mul(x.neg()?.shift(1.0)?)?.clamp(Some(eps), None)?;
            Some(gy.mul(x.sub(y)?.div(denom)?)?)
        } else {
            None
        };
        let gt = if y.requires_grad() {
            // PyTorch's: the logarithms unclamped (±inf at x of 0 or 1).
            let (log_x, log_1mx) = (x.log()?, x.neg()?.shift(1.0)?.log()?);
            Some(gy.mul(log_1mx.sub(log_x)?)?)
        } else {
            None
        };
        Ok(vec![gx, gt])
    }
}
