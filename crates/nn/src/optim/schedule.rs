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

/// How [`OneCycleLr`] moves between two rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Anneal {
    /// Half a cosine (PyTorch's default `"cos"`).
    #[default]
    Cos,
    /// A straight line (`"linear"`).
    Linear,
}

/// The one-cycle policy, per step (PyTorch's `OneCycleLR`, without its momentum cycling): from
/// `max_lr / div_factor` up to `max_lr` over the first `pct_start` of `total_steps`, then down
/// to `max_lr / div_factor / final_div_factor` at the last step (with `three_phase`, back down
/// to the start over as many steps, then to the final rate). Past the last step the final rate.
///
/// ```
/// use arenagrad_nn::optim::{LrSchedule, OneCycleLr};
/// let s = OneCycleLr::new(0.1, 100)?; // torch: OneCycleLR(opt, max_lr=0.1, total_steps=100)
/// assert!((s.lr_at(0) - 0.004).abs() < 1e-15);
/// assert!((s.lr_at(29) - 0.1).abs() < 1e-15);
/// assert!((s.lr_at(99) - 4e-7).abs() < 1e-18);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OneCycleLr {
    /// The peak rate.
    pub max_lr: f64,
    /// Steps in the cycle.
    pub total_steps: usize,
    /// The fraction of the steps spent rising (0.3).
    pub pct_start: f64,
    /// The shape of each phase (cosine).
    pub anneal: Anneal,
    /// `max_lr / div_factor` is the starting rate (25).
    pub div_factor: f64,
    /// The final rate is the starting one over this (1e4).
    pub final_div_factor: f64,
    /// Three phases instead of two (false).
    pub three_phase: bool,
}

impl OneCycleLr {
    /// A cycle peaking at `max_lr` over `total_steps` steps, with PyTorch's other defaults
    /// (the fields, public, change them; [`OneCycleLr::check`] then says whether they fit).
    pub fn new(max_lr: f64, total_steps: usize) -> Result<Self> {
        let s = OneCycleLr {
            max_lr,
            total_steps,
            pct_start: 0.3,
            anneal: Anneal::Cos,
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        };
        s.check()?;
        Ok(s)
    }

    /// Refuses what PyTorch refuses: no steps, a `pct_start` outside [0, 1], rates or
    /// factors that are not finite and positive.
    pub fn check(&self) -> Result<()> {
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if self.total_steps == 0
            || !(0.0..=1.0).contains(&self.pct_start)
            || !positive(self.max_lr)
            || !positive(self.div_factor)
            || !positive(self.final_div_factor)
        {
            return Err(config(
                "OneCycleLr",
                format!(
                    "need total_steps > 0, pct_start in [0, 1] and positive rates; got {self:?}"
                ),
            ));
        }
        Ok(())
    }

    /// The phases: (last step, starting rate, ending rate), as PyTorch lays them out.
    fn phases(&self) -> Vec<(f64, f64, f64)> {
        let initial = self.max_lr / self.div_factor;
        let min = initial / self.final_div_factor;
        let t = self.total_steps as f64;
        if self.three_phase {
            vec![
                (self.pct_start * t - 1.0, initial, self.max_lr),
                (2.0 * self.pct_start * t - 2.0, self.max_lr, initial),
                (t - 1.0, initial, min),
            ]
        } else {
            vec![
                (self.pct_start * t - 1.0, initial, self.max_lr),
                (t - 1.0, self.max_lr, min),
            ]
        }
    }
}

impl LrSchedule for OneCycleLr {
    fn lr_at(&self, step: usize) -> f64 {
        let phases = self.phases();
        let s = (step.min(self.total_steps - 1)) as f64;
        let mut start = 0.0;
        for (i, &(end, from, to)) in phases.iter().enumerate() {
            if s <= end || i == phases.len() - 1 {
                let pct = (s - start) / (end - start);
                return match self.anneal {
                    Anneal::Cos => {
                        to + (from - to) / 2.0 * ((std::f64::consts::PI * pct).cos() + 1.0)
                    }
                    Anneal::Linear => (to - from) * pct + from,
                };
            }
            start = end;
        }
        unreachable!("invariant: the last phase takes every step")
    }
}

/// Whether a smaller or a larger metric is better, for [`ReduceLrOnPlateau`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlateauMode {
    /// A loss: smaller is better (the default).
    #[default]
    Min,
    /// An accuracy: larger is better.
    Max,
}

/// Options of [`ReduceLrOnPlateau`], PyTorch's defaults by [`Default`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlateauConfig {
    /// Min or max (min).
    pub mode: PlateauMode,
    /// The rate is multiplied by this on a plateau (0.1).
    pub factor: f64,
    /// Epochs without improvement tolerated (10).
    pub patience: u64,
    /// What counts as an improvement (1e-4).
    pub threshold: f64,
    /// The threshold relative to the best (`true`, PyTorch's `"rel"`) or absolute (`"abs"`).
    pub relative: bool,
    /// Epochs to wait after a reduction before counting again (0).
    pub cooldown: u64,
    /// The rate is never brought below this (0).
    pub min_lr: f64,
    /// A reduction smaller than this is skipped (1e-8).
    pub eps: f64,
}

impl Default for PlateauConfig {
    fn default() -> Self {
        PlateauConfig {
            mode: PlateauMode::Min,
            factor: 0.1,
            patience: 10,
            threshold: 1e-4,
            relative: true,
            cooldown: 0,
            min_lr: 0.0,
            eps: 1e-8,
        }
    }
}

/// What [`ReduceLrOnPlateau`] remembers between epochs: kept in a training checkpoint
/// (`checkpoint::Progress::plateau`) so that a resumed run reduces when the uninterrupted one
/// would.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlateauState {
    /// The best metric so far (±∞ before the first).
    pub best: f64,
    /// Epochs since it improved.
    pub num_bad_epochs: u64,
    /// Epochs of cooldown left.
    pub cooldown_counter: u64,
    /// Epochs seen.
    pub last_epoch: u64,
}

/// Lowers the learning rate when a metric stops improving (PyTorch's `ReduceLROnPlateau`):
/// after more than `patience` epochs without an improvement beyond `threshold`, the optimiser's
/// rate is multiplied by `factor` (not below `min_lr`; parameter groups keep their ratios), then
/// `cooldown` epochs pass before counting again.
///
/// ```
/// use arenagrad_nn::optim::{Optimizer, PlateauConfig, ReduceLrOnPlateau, Sgd, SgdConfig};
/// use arenagrad_nn::{HostTensor, Parameter};
/// let p = Parameter::new("p", HostTensor::new(vec![1.0f32], &[1])?);
/// let mut opt = Sgd::new([p], SgdConfig::new(0.1))?;
/// let mut plateau = ReduceLrOnPlateau::new(PlateauConfig { patience: 2, ..Default::default() })?;
/// for loss in [1.0, 0.9, 0.9, 0.9, 0.9] {
///     plateau.step(loss, &mut opt)?;
/// }
/// assert!((opt.learning_rate() - 0.01).abs() < 1e-15); // the third epoch without progress
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ReduceLrOnPlateau {
    cfg: PlateauConfig,
    state: PlateauState,
}

impl ReduceLrOnPlateau {
    /// A scheduler with options `cfg` (`factor` in [0, 1), the others finite and
    /// non-negative, as PyTorch requires).
    pub fn new(cfg: PlateauConfig) -> Result<Self> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !((0.0..1.0).contains(&cfg.factor) && ok(cfg.threshold) && ok(cfg.min_lr) && ok(cfg.eps))
        {
            return Err(config(
                "ReduceLrOnPlateau",
                format!("factor must be in [0, 1) and the rest finite and non-negative: {cfg:?}"),
            ));
        }
        let best = match cfg.mode {
            PlateauMode::Min => f64::INFINITY,
            PlateauMode::Max => f64::NEG_INFINITY,
        };
        Ok(ReduceLrOnPlateau {
            cfg,
            state: PlateauState {
                best,
                num_bad_epochs: 0,
                cooldown_counter: 0,
                last_epoch: 0,
            },
        })
    }

    fn is_better(&self, a: f64) -> bool {
        let (best, t) = (self.state.best, self.cfg.threshold);
        match (self.cfg.mode, self.cfg.relative) {
            (PlateauMode::Min, true) => a < best * (1.0 - t),
            (PlateauMode::Min, false) => a < best - t,
            (PlateauMode::Max, true) => a > best * (t + 1.0),
            (PlateauMode::Max, false) => a > best + t,
        }
    }

    /// Takes the epoch's `metric` and lowers `opt`'s rate if it has stalled; returns the rate
    /// now. (A NaN metric is never an improvement.)
    pub fn step<O: Optimizer + ?Sized>(&mut self, metric: f64, opt: &mut O) -> Result<f64> {
        self.state.last_epoch += 1;
        let better = self.is_better(metric);
        let s = &mut self.state;
        if better {
            s.best = metric;
            s.num_bad_epochs = 0;
        } else {
            s.num_bad_epochs += 1;
        }
        if s.cooldown_counter > 0 {
            s.cooldown_counter -= 1;
            s.num_bad_epochs = 0;
        }
        if s.num_bad_epochs > self.cfg.patience {
            let old = opt.learning_rate();
            let new = (old * self.cfg.factor).max(self.cfg.min_lr);
            if old - new > self.cfg.eps {
                opt.set_learning_rate(new)?;
            }
            s.cooldown_counter = self.cfg.cooldown;
            s.num_bad_epochs = 0;
        }
        Ok(opt.learning_rate())
    }

    /// The state to keep in a checkpoint.
    pub fn state(&self) -> PlateauState {
        self.state
    }

    /// Resumes from a saved state.
    pub fn load_state(&mut self, state: PlateauState) {
        self.state = state;
    }
}
