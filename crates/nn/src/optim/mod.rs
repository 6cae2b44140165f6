//! Optimisers (SGD with momentum and Nesterov, Adam, AdamW, RMSprop), learning-rate schedules, and
//! gradient clipping.
//!
//! An optimiser holds [`Parameter`] handles (the same storage the model's layers use) and
//! updates their values in place from their accumulated gradients. Its state — momentum buffers,
//! Adam's moments — is plain host vectors of the parameter's dtype (f32 for a bf16 or f16
//! parameter, whose update is computed in f32 and rounded once into the stored weights). The
//! update rules are PyTorch's, step for step.
//!
//! `g.reset()` may come before or after `opt.step()`; both are correct. A step writes each value
//! in place unless a graph that has not been reset still reads it (the graph then keeps the old
//! value, and the parameter gets a new copy: see [`Parameter::update`]). Resetting first, as
//! below, lets every step update in place; stepping first costs one copy of each parameter per
//! step, and is what a loop needs when it still reads the iteration's tensors after the step.
//!
//! ```
//! use arenagrad_nn::optim::{Adam, AdamConfig, Optimizer};
//! use arenagrad_nn::{loss, DType, Graph, Linear, Module, Rng};
//! let mut rng = Rng::seed(0);
//! let model = Linear::new(2, 1, &mut rng)?;
//! let mut opt = Adam::new(model.parameters(), AdamConfig::new(0.1))?;
//! let mut g = Graph::new();
//! let mut last = f64::INFINITY;
//! for _ in 0..50 {
//!     opt.zero_grad();
//!     let x = g.from_f64(&[1.0, 2.0, -1.0, 0.5], &[2, 2], DType::F32)?;
//!     let y = g.from_f64(&[3.0, -1.0], &[2, 1], DType::F32)?;
//!     let l = loss::mse_loss(model.forward(&g, x)?, y)?;
//!     l.backward()?;
//!     last = l.item()?;
//!     g.reset();
//!     opt.step()?;
//! }
//! assert!(last < 0.05, "{last}");
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

mod adam;
mod rmsprop;
mod scaler;
mod schedule;
mod sgd;
mod state;

pub use adam::{Adam, AdamConfig, AdamState, AdamW};
pub use rmsprop::{RmsProp, RmsPropConfig};
pub use scaler::{GradScaler, GradScalerConfig, GradScalerState};
pub use schedule::{
    Anneal, CosineAnnealingLr, LrSchedule, OneCycleLr, PlateauConfig, PlateauMode, PlateauState,
    ReduceLrOnPlateau, StepLr, WarmupCosineLr,
};
pub use sgd::{Sgd, SgdConfig};
#[cfg(feature = "checkpoint")]
pub(crate) use state::{tensor_u64, tensor_u64s, u64_tensor, u64s_tensor};

use arenagrad_graph::{HostData, HostDataMut, HostTensor, Parameter, Storage};

use crate::error::{config, NnError, Result};

/// An optimiser: updates its parameters from their gradients.
pub trait Optimizer {
    /// Applies one update to every parameter that has a gradient (parameters without one are
    /// skipped, as in PyTorch). Gradients are left in place: call [`Optimizer::zero_grad`]
    /// before the next accumulation.
    fn step(&mut self) -> Result<()>;

    /// The parameters being optimised.
    fn parameters(&self) -> &[Parameter];

    /// The current learning rate.
    fn learning_rate(&self) -> f64;

    /// Sets the learning rate (what a schedule does between steps). A rate the constructors
    /// refuse (NaN, infinite or negative), or one that makes a group's own rate (a multiple of
    /// it, [`ParamGroup`]) infinite, is refused with their error, [`NnError::InvalidConfig`], and
    /// the rate stays as it was.
    fn set_learning_rate(&mut self, lr: f64) -> Result<()>;

    /// Everything the optimiser carries from one step to the next — the learning rate, and per
    /// parameter its buffers and step count — as named tensors (a parameter is named by its
    /// position in [`Optimizer::parameters`]: `"0.exp_avg"`). What a checkpoint saves to resume
    /// a run exactly (`checkpoint::save_training`).
    fn state_tensors(&self) -> Result<Vec<(String, HostTensor)>>;

    /// Restores what [`Optimizer::state_tensors`] gave, into an optimiser over parameters of the
    /// same shapes and dtypes in the same order. Everything is checked before anything changes:
    /// on an error the optimiser is as it was.
    fn load_state_tensors(&mut self, tensors: &[(String, HostTensor)]) -> Result<()>;

    /// Clears every parameter's gradient.
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }
}

/// Parameters with their own learning rate and weight decay, PyTorch's `param_groups` (for
/// `Sgd`, `Adam` and `AdamW`: their `with_groups`): the usual transformer recipe decays the weight matrices but not biases, norms and embeddings.
/// A group's learning rate is a multiple of the optimiser's (its ratio to the configured rate at
/// construction), so a schedule that sets the optimiser's rate moves every group together, as
/// PyTorch's schedulers scale each group's initial rate.
///
/// ```
/// use arenagrad_nn::optim::{AdamConfig, AdamW, Optimizer, ParamGroup};
/// use arenagrad_nn::{HostTensor, Parameter};
/// let w = Parameter::new("w", HostTensor::new(vec![1.0f32; 4], &[2, 2])?);
/// let b = Parameter::new("b", HostTensor::new(vec![0.0f32; 2], &[2])?);
/// let opt = AdamW::with_groups(
///     [ParamGroup::new([w]), ParamGroup::new([b]).weight_decay(0.0)],
///     AdamConfig::adamw(3e-3).weight_decay(0.1),
/// )?;
/// assert_eq!(opt.group_options(1), (3e-3, 0.0));
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ParamGroup {
    params: Vec<Parameter>,
    lr: Option<f64>,
    weight_decay: Option<f64>,
}

impl ParamGroup {
    /// A group of `params` with the optimiser's options.
    pub fn new(params: impl IntoIterator<Item = Parameter>) -> Self {
        ParamGroup {
            params: params.into_iter().collect(),
            lr: None,
            weight_decay: None,
        }
    }
    /// With its own learning rate.
    pub fn lr(mut self, lr: f64) -> Self {
        self.lr = Some(lr);
        self
    }
    /// With its own weight decay.
    pub fn weight_decay(mut self, wd: f64) -> Self {
        self.weight_decay = Some(wd);
        self
    }
}

/// A group's options as the optimiser keeps them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GroupOptions {
    /// The group's rate over the optimiser's.
    pub lr_scale: f64,
    pub weight_decay: f64,
}

/// Group `k`'s learning rate (of an optimiser at `lr`) and weight decay, `(0, 0)` for no such
/// group.
pub(crate) fn group_options(groups: &[GroupOptions], lr: f64, k: usize) -> (f64, f64) {
    groups
        .get(k)
        .map_or((0.0, 0.0), |g| (lr * g.lr_scale, g.weight_decay))
}

/// The groups' parameters in order, each parameter's group, and the groups' options; a
/// parameter in two groups is an error (as PyTorch's), repeated within one group it counts once.
pub(crate) fn flatten_groups(
    component: &'static str,
    groups: impl IntoIterator<Item = ParamGroup>,
    lr: f64,
    weight_decay: f64,
) -> Result<(Vec<Parameter>, Vec<usize>, Vec<GroupOptions>)> {
    let (mut params, mut group_of, mut opts) = (Vec::new(), Vec::new(), Vec::new());
    for (k, g) in groups.into_iter().enumerate() {
        let glr = g.lr.unwrap_or(lr);
        check_non_negative(component, "a group's lr", glr)?;
        let wd = g.weight_decay.unwrap_or(weight_decay);
        check_non_negative(component, "a group's weight_decay", wd)?;
        if lr == 0.0 && glr != 0.0 {
            return Err(config(
                component,
                "a group's own lr is a multiple of the optimiser's, which must then be > 0",
            ));
        }
        let lr_scale = if lr == 0.0 { 1.0 } else { glr / lr };
        opts.push(GroupOptions {
            lr_scale,
            weight_decay: wd,
        });
        for p in dedup(g.params) {
            if let Some(j) = params.iter().position(|q: &Parameter| q.same(&p)) {
                return Err(config(
                    component,
                    format!(
                        "parameter {:?} is in groups {} and {k}",
                        p.name(),
                        group_of[j]
                    ),
                ));
            }
            params.push(p);
            group_of.push(k);
        }
    }
    Ok((params, group_of, opts))
}

/// Collects parameters, dropping repeated handles to the same storage (a shared parameter is
/// updated once per step).
pub(crate) fn dedup(params: impl IntoIterator<Item = Parameter>) -> Vec<Parameter> {
    let mut out: Vec<Parameter> = Vec::new();
    for p in params {
        if !out.iter().any(|q| q.same(&p)) {
            out.push(p);
        }
    }
    out
}

/// What [`Optimizer::set_learning_rate`] refuses: a rate the constructors refuse, or one that
/// makes a group's rate (`lr · lr_scale`) infinite.
pub(crate) fn check_learning_rate(
    component: &'static str,
    lr: f64,
    groups: &[GroupOptions],
) -> Result<()> {
    check_non_negative(component, "lr", lr)?;
    if let Some(k) = groups.iter().position(|g| !(lr * g.lr_scale).is_finite()) {
        return Err(config(
            component,
            format!(
                "lr {lr} makes group {k}'s rate ({} times it) infinite",
                groups[k].lr_scale
            ),
        ));
    }
    Ok(())
}

pub(crate) fn check_non_negative(component: &'static str, what: &str, v: f64) -> Result<()> {
    if !v.is_finite() || v < 0.0 {
        return Err(config(
            component,
            format!("{what} must be finite and ≥ 0, got {v}"),
        ));
    }
    Ok(())
}

/// Runs an update on a 16-bit parameter's values and gradient widened to f32, and rounds the
/// new values back once: the step is computed in f32 (its state, a momentum or Adam's moments,
/// is kept in f32 too), and only the stored weights are 16-bit.
pub(crate) fn in_f32<T: Storage, R>(
    value: &mut [T],
    grad: &[T],
    f: impl FnOnce(&mut [f32], &[f32]) -> R,
) -> R {
    let g = arenagrad_graph::widened(grad);
    arenagrad_graph::update_in_f32(value, |v| f(v, &g))
}

fn grad_dtype_error(op: &'static str, value: &HostDataMut<'_>, grad: &HostData) -> NnError {
    NnError::DType {
        op,
        expected: value.dtype(),
        got: grad.dtype(),
    }
}

/// Scales all gradients together so that their global L2 norm is at most `max_norm`; returns the
/// norm before clipping. As PyTorch's `clip_grad_norm_`: the factor is
/// `max_norm / (norm + 1e-6)` when that is below 1. Parameters without gradients are skipped.
///
/// ```
/// use arenagrad_nn::optim::clip_grad_norm;
/// use arenagrad_nn::{DType, Graph, HostTensor, Parameter};
/// let p = Parameter::new("p", HostTensor::new(vec![3.0f64, 4.0], &[2])?);
/// let g = Graph::new();
/// let t = g.param(&p)?;
/// t.mul(t)?.sum()?.scale(0.5)?.backward()?; // grad = value = [3, 4], norm 5
/// let norm = clip_grad_norm(&[p.clone()], 1.0)?;
/// assert_eq!(norm, 5.0);
/// let clipped = p.grad().unwrap().to_f64_vec();
/// assert!((clipped[0] - 0.6).abs() < 1e-6 && (clipped[1] - 0.8).abs() < 1e-6);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub fn clip_grad_norm(params: &[Parameter], max_norm: f64) -> Result<f64> {
    check_non_negative("clip_grad_norm", "max_norm", max_norm)?;
    let mut sq = 0.0f64;
    for p in params {
        p.update_grad(|g| match g {
            Some(HostDataMut::F32(v)) => {
                sq += v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>()
            }
            Some(HostDataMut::F64(v)) => sq += v.iter().map(|&x| x * x).sum::<f64>(),
            Some(HostDataMut::BF16(v)) => sq += v.iter().map(|&x| x.widen().powi(2)).sum::<f64>(),
            Some(HostDataMut::F16(v)) => sq += v.iter().map(|&x| x.widen().powi(2)).sum::<f64>(),
            // Only floating tensors carry gradients.
            Some(_) | None => {}
        });
    }
    let norm = sq.sqrt();
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        for p in params {
            p.update_grad(|g| match g {
                Some(HostDataMut::F32(v)) => v.iter_mut().for_each(|x| *x *= coef as f32),
                Some(HostDataMut::F64(v)) => v.iter_mut().for_each(|x| *x *= coef),
                Some(HostDataMut::BF16(v)) => v.iter_mut().for_each(|x| *x = scaled(*x, coef)),
                Some(HostDataMut::F16(v)) => v.iter_mut().for_each(|x| *x = scaled(*x, coef)),
                Some(_) | None => {}
            });
        }
    }
    Ok(norm)
}

/// Clamps every gradient element into `[−clip, clip]`.
pub fn clip_grad_value(params: &[Parameter], clip: f64) -> Result<()> {
    check_non_negative("clip_grad_value", "clip", clip)?;
    for p in params {
        p.update_grad(|g| match g {
            Some(HostDataMut::F32(v)) => {
                let c = clip as f32;
                v.iter_mut().for_each(|x| *x = x.clamp(-c, c))
            }
            Some(HostDataMut::F64(v)) => v.iter_mut().for_each(|x| *x = x.clamp(-clip, clip)),
            Some(HostDataMut::BF16(v)) => v.iter_mut().for_each(|x| *x = clamped(*x, clip)),
            Some(HostDataMut::F16(v)) => v.iter_mut().for_each(|x| *x = clamped(*x, clip)),
            // Only floating tensors carry gradients.
            Some(_) | None => {}
        });
    }
    Ok(())
}

/// A 16-bit gradient element times `coef`, computed in f32 and rounded once (as PyTorch's
/// `mul_` on a 16-bit tensor).
fn scaled<T: Storage>(x: T, coef: f64) -> T {
    T::narrow(f64::from(x.widen() as f32 * coef as f32))
}

/// A 16-bit gradient element clamped into `[−clip, clip]` (the bound rounded to the type, as
/// PyTorch's `clamp_` on a 16-bit tensor compares in f32).
fn clamped<T: Storage>(x: T, clip: f64) -> T {
    let c = clip as f32;
    T::narrow(f64::from((x.widen() as f32).clamp(-c, c)))
}
