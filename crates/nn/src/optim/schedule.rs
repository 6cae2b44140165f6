//! Learning-rate schedules.

use super::Optimizer;
use crate::error::{config, Result};

/// A learning rate as a function of the epoch (or step) count.
///
/// ```
/// use arenagrad_nn::optim::{CosineAnnealingLr, LrSchedule, Optimizer, Sgd, SgdConfig, StepLr};
/// let step = StepLr::new(0.1, 10, 0.5)?;
/// assert_eq!(step.lr_at(0), 0.1);
/// assert_eq!(step.lr_at(25), 0.025);
/// let cos = CosineAnnealingLr::new(0.1, 100, 0.0)?;
/// assert!((cos.lr_at(50) - 0.05).abs() < 1e-12);
/// let mut opt = Sgd::new([], SgdConfig::new(0.1))?;
/// cos.apply(&mut opt, 100)?;
/// assert!(opt.learning_rate().abs() < 1e-12);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub trait LrSchedule {
    /// The learning rate for epoch `epoch` (0 is the first).
    fn lr_at(&self, epoch: usize) -> f64;

    /// Sets `opt`'s learning rate for epoch `epoch`; returns it. A rate the optimiser refuses
    /// ([`Optimizer::set_learning_rate`]: one grown infinite by a `γ > 1`, say) is an error, and
    /// the optimiser's rate stays as it was.
    fn apply<O: Optimizer + ?Sized>(&self, opt: &mut O, epoch: usize) -> Result<f64>
    where
        Self: Sized,
    {
        let lr = self.lr_at(epoch);
        opt.set_learning_rate(lr)?;
        Ok(lr)
    }
}

/// `base_lr · γ^⌊epoch / step_size⌋` (PyTorch's `StepLR`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLr {
    base_lr: f64,
    step_size: usize,
    gamma: f64,
}

impl StepLr {
    /// Decays by `gamma` every `step_size` epochs. A `gamma` above 1 grows the rate instead, up
    /// to infinity once `base_lr·γ^k` leaves `f64`'s range: [`LrSchedule::apply`] refuses that.
    pub fn new(base_lr: f64, step_size: usize, gamma: f64) -> Result<Self> {
        let finite = |v: f64| v.is_finite() && v >= 0.0;
        if step_size == 0 || !finite(gamma) || !finite(base_lr) {
            return Err(config(
                "StepLr",
                format!(
                    "need step_size > 0, finite gamma ≥ 0, finite base_lr ≥ 0; got {step_size}, \
                     {gamma}, {base_lr}"
                ),
            ));
        }
        Ok(StepLr {
            base_lr,
            step_size,
            gamma,
        })
    }
}

impl LrSchedule for StepLr {
    fn lr_at(&self, epoch: usize) -> f64 {
        let k = (epoch / self.step_size).min(i32::MAX as usize) as i32;
        self.base_lr * self.gamma.powi(k)
    }
}

/// `η_min + (base_lr − η_min)·(1 + cos(π·epoch / t_max)) / 2` (PyTorch's `CosineAnnealingLR`,
/// closed form): from `base_lr` at epoch 0 down to `η_min` at `t_max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CosineAnnealingLr {
    base_lr: f64,
    t_max: usize,
    eta_min: f64,
}

impl CosineAnnealingLr {
    /// Anneals from `base_lr` to `eta_min` over `t_max` epochs.
    pub fn new(base_lr: f64, t_max: usize, eta_min: f64) -> Result<Self> {
        let finite = |v: f64| v.is_finite() && v >= 0.0;
        if t_max == 0 || !finite(base_lr) || !finite(eta_min) {
            return Err(config(
                "CosineAnnealingLr",
                format!(
                    "need t_max > 0 and finite non-negative rates; got {t_max}, {base_lr}, \
                     {eta_min}"
                ),
            ));
        }
        Ok(CosineAnnealingLr {
            base_lr,
            t_max,
            eta_min,
        })
    }
}

impl LrSchedule for CosineAnnealingLr {
    fn lr_at(&self, epoch: usize) -> f64 {
        let c = (std::f64::consts::PI * epoch as f64 / self.t_max as f64).cos();
        between(self.eta_min, self.base_lr, c)
    }
}

/// Linear warmup then cosine decay, per step, the usual transformer recipe: `base_lr·(step + 1)
/// / warmup` for the first `warmup` steps, then `min_lr + (base_lr − min_lr)·(1 + cos(π·p))/2`
/// with `p` the fraction of the remaining `total − warmup` steps done, and `min_lr` from
/// `total` on.
///
/// ```
/// use arenagrad_nn::optim::{LrSchedule, WarmupCosineLr};
/// let s = WarmupCosineLr::new(1e-3, 100, 1100, 1e-4)?;
/// assert!((s.lr_at(0) - 1e-5).abs() < 1e-15);
/// assert!((s.lr_at(99) - 1e-3).abs() < 1e-15);
/// assert!((s.lr_at(600) - 5.5e-4).abs() < 1e-15); // halfway down
/// assert_eq!(s.lr_at(5000), 1e-4);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupCosineLr {
    base_lr: f64,
    warmup: usize,
    total: usize,
    min_lr: f64,
}

impl WarmupCosineLr {
    /// Warms up over `warmup` steps to `base_lr`, then decays to `min_lr` at step `total`.
    pub fn new(base_lr: f64, warmup: usize, total: usize, min_lr: f64) -> Result<Self> {
        let rates_ok = base_lr.is_finite() && base_lr >= 0.0 && min_lr.is_finite() && min_lr >= 0.0;
        if !rates_ok || total < warmup {
            return Err(config(
                "WarmupCosineLr",
                format!(
                    "need non-negative rates and total ≥ warmup; got {base_lr}, {min_lr}, \
                     warmup {warmup}, total {total}"
                ),
            ));
        }
        Ok(WarmupCosineLr {
            base_lr,
            warmup,
            total,
            min_lr,
        })
    }
}

impl LrSchedule for WarmupCosineLr {
    fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup {
            let (done, warmup) = ((step + 1) as f64, self.warmup as f64);
            let lr = self.base_lr * done / warmup;
            // As `between`: the division first where the product overflows.
            return if lr.is_finite() {
                lr
            } else {
                self.base_lr * (done / warmup)
            };
        }
        if step >= self.total {
            return self.min_lr;
        }
        let p = (step - self.warmup) as f64 / (self.total - self.warmup) as f64;
        let c = (std::f64::consts::PI * p).cos();
        between(self.min_lr, self.base_lr, c)
    }
}

/// `lo + (hi − lo)·(1 + c)/2`, the cosine schedules' rate, in PyTorch's order of operations
/// (the same bits as its closed form); where `(hi − lo)·(1 + c)` overflows (`hi` above half of
/// `f64::MAX`), the halving comes first, so that finite rates give a finite one.
fn between(lo: f64, hi: f64, c: f64) -> f64 {
    let d = hi - lo;
    let twice = d * (1.0 + c);
    if twice.is_finite() {
        lo + twice / 2.0
    } else {
        lo + d * ((1.0 + c) / 2.0)
    }
}
