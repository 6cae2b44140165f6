//! Loss rows, each `torch.nn.functional`'s loss of the same name, run by the `nn` crate's
//! `loss` module: `mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`, `kl_div`, `bce`,
//! `bce_with_logits`, `cross_entropy` and `nll_loss`. REDUCTION is PyTorch's `reduction`: 0
//! `"none"`, 1 `"mean"`, 2 `"sum"` (and for `kl_div` 3 `"batchmean"`). The class targets of
//! `cross_entropy` and `nll_loss` are a tensor of whole numbers (a `const`, as random programs
//! make it), read as the `i64` tensor PyTorch takes.

use arenagrad_graph::{Graph, GraphError, Tensor};
use arenagrad_nn::loss::{self, CrossEntropyOptions, Reduction};
use arenagrad_nn::NnError;

use super::{
    count, flag_at, float, from_nn, int, whole_values, Arity, Draw, Drawn, Gen, OpRow, Param,
    Refusal,
};

/// The reduction in parameter `p` (at argument `k`), of the first `n` of none, mean, sum and
/// batchmean.
fn reduction_at(p: Param, k: usize, n: usize) -> Result<usize, Refusal> {
    let r = p.as_usize();
    if r >= n {
        let names = ["0 (none)", "1 (mean)", "2 (sum)", "3 (batchmean)"];
        return Err(Refusal::at(
            k,
            format!("reduction {p}: expected {}", names[..n].join(", ")),
        ));
    }
    Ok(r)
}

/// nn's reduction for parameter `p` (0 none, 1 mean, 2 sum; batchmean is `kl_div`'s own).
fn reduction(p: Param) -> Reduction {
    match p.as_usize() {
        0 => Reduction::None,
        2 => Reduction::Sum,
        _ => Reduction::Mean,
    }
}

/// The output's shape: the per-element (or per-sample) shape unreduced, a scalar reduced.
fn reduced(per: &[usize], r: usize) -> Vec<usize> {
    if r == 0 {
        per.to_vec()
    } else {
        Vec::new()
    }
}

/// The shape rule of an elementwise loss of `a` against `b` (equal shapes) whose reduction is
/// parameter 0 (of the first `n`).
fn pointwise(s: &[&[usize]], p: &[Param], n: usize) -> Result<Vec<usize>, Refusal> {
    let r = reduction_at(p[0], 2, n)?;
    if s[0] != s[1] {
        return Err(Refusal::at(
            1,
            format!(
                "the target {:?} must have the input's shape {:?}",
                s[1], s[0]
            ),
        ));
    }
    Ok(reduced(s[0], r))
}

/// Random elementwise losses: the operand drawn against a fresh input of its shape, the
/// reduction from the attributes, then `extra`.
fn pointwise_draw(d: &mut Draw<'_>, extra: Vec<f64>) -> Option<Drawn> {
    let shape = d.shape(d.a).to_vec();
    let t = d.fresh_input(shape);
    Some((
        vec![d.a, t],
        [vec![f64::from(d.attrs[0] % 3)], extra].concat(),
    ))
}

/// `mse_loss a b REDUCTION`: PyTorch's `F.mse_loss(a, b, reduction=…)`.
pub(super) const MSE_LOSS: OpRow = OpRow::new(
    "mse_loss",
    |s, p| pointwise(s, p, 3),
    |_, x, p| loss::mse_loss_with(x[0], x[1], reduction(p[0])).map_err(from_nn),
)
.arity(Arity::Exactly(2))
.params(&[count("the reduction", "REDUCTION")])
.gen(Gen::Operands(|d| pointwise_draw(d, Vec::new())));

/// `l1_loss a b REDUCTION`: PyTorch's `F.l1_loss` (gradient 0 where `a = b`).
pub(super) const L1_LOSS: OpRow = OpRow::new(
    "l1_loss",
    |s, p| pointwise(s, p, 3),
    |_, x, p| loss::l1_loss_with(x[0], x[1], reduction(p[0])).map_err(from_nn),
)
.arity(Arity::Exactly(2))
.params(&[count("the reduction", "REDUCTION")])
.kinked()
.gen(Gen::Operands(|d| pointwise_draw(d, Vec::new())));

/// A finite parameter at argument `k`, positive (or, with `zero_ok`, not negative).
fn positive_at(p: Param, k: usize, what: &str, zero_ok: bool) -> Result<(), Refusal> {
    let v = p.as_f64();
    let ok = v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0));
    if !ok {
        let want = if zero_ok { "non-negative" } else { "positive" };
        return Err(Refusal::at(
            k,
            format!("{what} {p}: expected a finite {want} number"),
        ));
    }
    Ok(())
}

/// The thresholds random programs draw for `smooth_l1_loss` and `huber_loss`.
const THRESHOLDS: [f64; 4] = [1.0, 0.5, 2.0, 0.25];

/// `smooth_l1_loss a b REDUCTION BETA`: PyTorch's `F.smooth_l1_loss(a, b, reduction=…,
/// beta=BETA)`, BETA ≥ 0 (0: the L1 loss).
pub(super) const SMOOTH_L1_LOSS: OpRow = OpRow::new(
    "smooth_l1_loss",
    |s, p| {
        positive_at(p[1], 3, "beta", true)?;
        pointwise(s, p, 3)
    },
    |_, x, p| loss::smooth_l1_loss(x[0], x[1], p[1].as_f64(), reduction(p[0])).map_err(from_nn),
)
.arity(Arity::Exactly(2))
.params(&[count("the reduction", "REDUCTION"), float("beta", "BETA")])
.kinked()
.gen(Gen::Operands(|d| {
    let beta = THRESHOLDS[usize::from(d.attrs[1]) % 4];
    pointwise_draw(d, vec![beta])
}));

/// `huber_loss a b REDUCTION DELTA`: PyTorch's `F.huber_loss(a, b, reduction=…, delta=DELTA)`,
/// DELTA > 0.
pub(super) const HUBER_LOSS: OpRow = OpRow::new(
    "huber_loss",
    |s, p| {
        positive_at(p[1], 3, "delta", false)?;
        pointwise(s, p, 3)
    },
    |_, x, p| loss::huber_loss(x[0], x[1], p[1].as_f64(), reduction(p[0])).map_err(from_nn),
)
.arity(Arity::Exactly(2))
.params(&[count("the reduction", "REDUCTION"), float("delta", "DELTA")])
.kinked()
.gen(Gen::Operands(|d| {
    let delta = THRESHOLDS[usize::from(d.attrs[1]) % 4];
    pointwise_draw(d, vec![delta])
}));

/// `kl_div a b REDUCTION LOG_TARGET`: PyTorch's `F.kl_div(a, b, reduction=…,
/// log_target=LOG_TARGET)`, `a` log-probabilities, `b` probabilities (log-probabilities when
/// LOG_TARGET is 1); REDUCTION 3 is `"batchmean"` (the sum over the first axis's extent).
pub(super) const KL_DIV: OpRow = OpRow::new(
    "kl_div",
    |s, p| {
        flag_at(p[1], 3, "log_target")?;
        pointwise(s, p, 4)
    },
    |_, x, p| {
        let log_target = p[1].as_usize() == 1;
        if p[0].as_usize() != 3 {
            return loss::kl_div_with(x[0], x[1], log_target, reduction(p[0])).map_err(from_nn);
        }
        // PyTorch's batchmean: the sum over the first axis's extent (a scalar's over 1; an
        // empty batch's 0/0, NaN).
        let n = x[0].try_shape()?.first().copied().unwrap_or(1);
        loss::kl_div_with(x[0], x[1], log_target, Reduction::Sum)
            .map_err(from_nn)?
            .scale(1.0 / n as f64)
    },
)
.arity(Arity::Exactly(2))
.params(&[
    count("the reduction", "REDUCTION"),
    count("log_target", "LOG_TARGET"),
])
.gen(Gen::Operands(|d| {
    // A target of probabilities, or of any values read as log-probabilities.
    let shape = d.shape(d.a).to_vec();
    let log_target = d.attrs[1] & 1;
    let t = if log_target == 1 {
        d.fresh_input(shape)
    } else {
        d.fresh_probabilities(shape)
    };
    let r = f64::from(d.attrs[0] % 4);
    Some((vec![d.a, t], vec![r, f64::from(log_target)]))
}));

/// `bce a b REDUCTION`: PyTorch's `F.binary_cross_entropy(a, b, reduction=…)`, `a`
/// probabilities in `[0, 1]` (each logarithm clamped at −100, as PyTorch's), `b` targets in
/// `[0, 1]` (a value of either outside is refused when the statement runs, as PyTorch refuses
/// it).
pub(super) const BCE: OpRow = OpRow::new(
    "bce",
    |s, p| pointwise(s, p, 3),
    |_, x, p| {
        loss::bce_with(x[0], x[1], reduction(p[0])).map_err(|e| match e {
            NnError::BadData { reason, .. } => GraphError::BadArgument {
                op: "bce",
                what: if reason.starts_with("input") {
                    "an input outside [0, 1]"
                } else {
                    "a target outside [0, 1]"
                },
            },
            e => from_nn(e),
        })
    },
)
.arity(Arity::Exactly(2))
.params(&[count("the reduction", "REDUCTION")])
.gen(Gen::Operands(|d| {
    // Fresh probabilities and targets of the drawn operand's shape: neither domain holds every
    // value a program makes.
    let shape = d.shape(d.a).to_vec();
    let x = d.fresh_probabilities(shape.clone());
    let t = d.fresh_probabilities(shape);
    Some((vec![x, t], vec![f64::from(d.attrs[0] % 3)]))
}));

/// `bce_with_logits a b REDUCTION`: PyTorch's `F.binary_cross_entropy_with_logits(a, b,
/// reduction=…)`.
pub(super) const BCE_WITH_LOGITS: OpRow = OpRow::new(
    "bce_with_logits",
    |s, p| pointwise(s, p, 3),
    |_, x, p| loss::bce_with_logits_with(x[0], x[1], reduction(p[0])).map_err(from_nn),
)
.arity(Arity::Exactly(2))
.params(&[count("the reduction", "REDUCTION")])
.gen(Gen::Operands(|d| {
    let shape = d.shape(d.a).to_vec();
    let t = d.fresh_probabilities(shape);
    Some((vec![d.a, t], vec![f64::from(d.attrs[0] % 3)]))
}));

/// The shape rule of a loss over classes: `a` `[C]` with a scalar target, `[N, C]` with `[N]`,
/// or `[N, C, d…]` with `[N, d…]`; at least one class.
fn classes(s: &[&[usize]], r: usize) -> Result<Vec<usize>, Refusal> {
    let (a, t) = (s[0], s[1]);
    let want: Vec<usize> = match a.len() {
        0 => {
            return Err(Refusal::at(
                0,
                format!("the input {a:?} must be [C], [N, C] or [N, C, d…]"),
            ))
        }
        1 => Vec::new(),
        _ => std::iter::once(a[0])
            .chain(a[2..].iter().copied())
            .collect(),
    };
    let c = if a.len() == 1 { a[0] } else { a[1] };
    if c == 0 {
        return Err(Refusal::at(0, format!("the input {a:?} has no classes")));
    }
    if t != want.as_slice() {
        return Err(Refusal::at(
            1,
            format!("the target {t:?}: expected {want:?} for an input of shape {a:?}"),
        ));
    }
    Ok(reduced(t, r))
}

/// The class targets `t` as the `i64` tensor nn takes: each a whole number (the range, and a
/// negative value other than the ignored one, are nn's to refuse). Targets that would take a
/// gradient (an `input`, or a value computed from one) are refused: class indices have none,
/// and PyTorch refuses floating-point class targets.
fn as_targets<'g>(g: &'g Graph, t: Tensor<'g>, op: &'static str) -> Result<Tensor<'g>, GraphError> {
    if t.requires_grad() {
        return Err(GraphError::BadArgument {
            op,
            what: "class targets that take a gradient (make them a const, or detach them)",
        });
    }
    let what = "a class target that is not a whole number";
    g.from_slice(&whole_values(t, op, what, true)?, &t.try_shape()?)
}

/// nn's refusal of a target's value as the graph's (`ignoring`: the op has an ignored value).
fn target_error(op: &'static str, ignoring: bool, e: NnError) -> GraphError {
    match e {
        NnError::IndexOutOfRange { .. } | NnError::NotAnIndex { .. } => GraphError::BadArgument {
            op,
            what: if ignoring {
                "a class target outside 0..C that is not the ignored value"
            } else {
                "a class target outside 0..C"
            },
        },
        e => from_nn(e),
    }
}

/// Random class losses: the operand drawn as the scores, fresh targets in range; `extra`
/// after the reduction.
fn classes_draw(d: &mut Draw<'_>, r: u8, extra: Vec<f64>) -> Option<Drawn> {
    let a = d.shape(d.a).to_vec();
    let (c, t) = match a.len() {
        0 => return None,
        1 => (a[0], Vec::new()),
        _ => (
            a[1],
            std::iter::once(a[0])
                .chain(a[2..].iter().copied())
                .collect(),
        ),
    };
    if c == 0 {
        return None;
    }
    let i = d.fresh_indices(t, c);
    Some((vec![d.a, i], [vec![f64::from(r)], extra].concat()))
}

/// `cross_entropy a t REDUCTION LABEL_SMOOTHING IGNORE_INDEX`: PyTorch's `F.cross_entropy(a, t,
/// reduction=…, label_smoothing=…, ignore_index=…)` with class-index targets (PyTorch's default
/// IGNORE_INDEX is −100).
pub(super) const CROSS_ENTROPY: OpRow = OpRow::new(
    "cross_entropy",
    |s, p| {
        let r = reduction_at(p[0], 2, 3)?;
        let eps = p[1].as_f64();
        if !(0.0..=1.0).contains(&eps) {
            return Err(Refusal::at(
                3,
                format!("label_smoothing {}: expected a number in [0, 1]", p[1]),
            ));
        }
        classes(s, r)
    },
    |g, x, p| {
        let opts = CrossEntropyOptions {
            label_smoothing: p[1].as_f64(),
            reduction: reduction(p[0]),
            ignore_index: Some(p[2].as_i64()),
        };
        let t = as_targets(g, x[1], "cross_entropy")?;
        loss::cross_entropy_by(x[0], t, opts).map_err(|e| target_error("cross_entropy", true, e))
    },
)
.integers(&[(1, super::TARGET)])
.arity(Arity::Exactly(2))
.params(&[
    count("the reduction", "REDUCTION"),
    float("the label smoothing", "LABEL_SMOOTHING"),
    int("the ignored index", "IGNORE_INDEX"),
])
.gen(Gen::Operands(|d| {
    let t = d.attrs;
    let r = t[0] % 3;
    let eps = [0.0, 0.1, 0.25][usize::from(t[1]) % 3];
    // Class 0 ignored where no mean is taken (a mean over no samples is NaN, as PyTorch's).
    let ignore = if r != 1 && t[2] & 1 == 1 { 0.0 } else { -100.0 };
    classes_draw(d, r, vec![eps, ignore])
}));

/// `nll_loss a t REDUCTION`: PyTorch's `F.nll_loss(a, t, reduction=…)`, `a` log-probabilities,
/// without an ignored index (PyTorch ignores −100 by default; this row refuses it as out of
/// range, and `cross_entropy` has IGNORE_INDEX).
pub(super) const NLL_LOSS: OpRow = OpRow::new(
    "nll_loss",
    |s, p| classes(s, reduction_at(p[0], 2, 3)?),
    |g, x, p| {
        let t = as_targets(g, x[1], "nll_loss")?;
        loss::nll_loss_by(x[0], t, reduction(p[0])).map_err(|e| target_error("nll_loss", false, e))
    },
)
.integers(&[(1, super::TARGET)])
.arity(Arity::Exactly(2))
.params(&[count("the reduction", "REDUCTION")])
.gen(Gen::Operands(|d| {
    let r = d.attrs[0] % 3;
    classes_draw(d, r, Vec::new())
}));
