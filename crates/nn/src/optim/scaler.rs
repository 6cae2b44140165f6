//! Loss scaling for f16 training: PyTorch's `torch.amp.GradScaler`.
//!
//! f16's smallest normal number is 6.1·10⁻⁵: small gradients flush to zero when they are
//! computed in it. The scaler multiplies the loss by a large factor before backward (so every
//! gradient is that much larger), divides the gradients by it again before the optimiser sees
//! them, and skips a step whose gradients overflowed, shrinking the factor; after
//! `growth_interval` good steps in a row it grows the factor again. The loop, as in PyTorch:
//!
//! ```
//! use arenagrad_nn::optim::{GradScaler, GradScalerConfig, Optimizer, Sgd, SgdConfig};
//! use arenagrad_nn::{DType, Graph, HostTensor, Parameter};
//! let w = Parameter::new("w", HostTensor::new(vec![0.5f32, -1.0], &[2])?);
//! let mut opt = Sgd::new([w.clone()], SgdConfig::new(0.1))?;
//! let mut scaler = GradScaler::new(GradScalerConfig::default())?;
//! let mut g = Graph::new();
//! for _ in 0..3 {
//!     let loss = g.param(&w)?.square()?.sum()?;
//!     scaler.scale_loss(loss)?.backward()?; // torch: scaler.scale(loss).backward()
//!     g.reset();
//!     scaler.unscale(&opt)?; // before clipping, if you clip
//!     scaler.step(&mut opt)?; // skipped if a gradient overflowed
//!     scaler.update(); // shrink or grow the scale
//!     opt.zero_grad();
//! }
//! assert_eq!(scaler.scale(), 65536.0);
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use arenagrad_graph::{HostDataMut, Storage, Tensor};

use super::Optimizer;
use crate::error::{config, Result};

/// How a [`GradScaler`] sets its scale; PyTorch's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradScalerConfig {
    /// The first scale (2¹⁶).
    pub init_scale: f32,
    /// The factor the scale grows by after `growth_interval` steps without overflow (2).
    pub growth_factor: f32,
    /// The factor the scale shrinks by at a step that overflowed (0.5).
    pub backoff_factor: f32,
    /// Good steps in a row before the scale grows (2000).
    pub growth_interval: u64,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        GradScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// What a [`GradScaler`] carries from one step to the next: what a training checkpoint keeps
/// (`checkpoint::Progress::scaler`) so that a resumed run scales as the uninterrupted one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradScalerState {
    /// The scale.
    pub scale: f32,
    /// Good steps in a row since the scale last changed.
    pub growth_tracker: u64,
}

/// PyTorch's `torch.amp.GradScaler` (see the module documentation).
#[derive(Debug, Clone)]
pub struct GradScaler {
    cfg: GradScalerConfig,
    state: GradScalerState,
    /// This step's gradients are unscaled already.
    unscaled: bool,
    /// A gradient of this step was infinite or NaN.
    found_inf: bool,
}

impl GradScaler {
    /// A scaler; a scale that is not finite and positive, a growth factor not above 1, a
    /// backoff factor outside (0, 1) or a zero interval is [`crate::NnError::InvalidConfig`].
    pub fn new(cfg: GradScalerConfig) -> Result<Self> {
        let op = "GradScaler::new";
        if !(cfg.init_scale.is_finite() && cfg.init_scale > 0.0) {
            return Err(config(
                op,
                format!(
                    "init_scale must be finite and positive, got {}",
                    cfg.init_scale
                ),
            ));
        }
        if !(cfg.growth_factor > 1.0 && cfg.growth_factor.is_finite()) {
            return Err(config(
                op,
                format!("growth_factor must be above 1, got {}", cfg.growth_factor),
            ));
        }
        if !(cfg.backoff_factor > 0.0 && cfg.backoff_factor < 1.0) {
            return Err(config(
                op,
                format!(
                    "backoff_factor must be in (0, 1), got {}",
                    cfg.backoff_factor
                ),
            ));
        }
        if cfg.growth_interval == 0 {
            return Err(config(op, "growth_interval must be at least 1".to_string()));
        }
        Ok(GradScaler {
            cfg,
            state: GradScalerState {
                scale: cfg.init_scale,
                growth_tracker: 0,
            },
            unscaled: false,
            found_inf: false,
        })
    }

    /// The scale now.
    pub fn scale(&self) -> f32 {
        self.state.scale
    }

    /// The state to save ([`GradScalerState`]).
    pub fn state(&self) -> GradScalerState {
        self.state
    }

    /// Restores a saved state; one whose scale is not finite and positive is refused and
    /// nothing changes.
    pub fn load_state(&mut self, state: GradScalerState) -> Result<()> {
        if !(state.scale.is_finite() && state.scale > 0.0) {
            return Err(config(
                "GradScaler::load_state",
                format!("the scale must be finite and positive, got {}", state.scale),
            ));
        }
        self.state = state;
        Ok(())
    }

    /// `loss · scale`, to run backward from (PyTorch's `scaler.scale(loss)`).
    pub fn scale_loss<'g>(&self, loss: Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(loss.scale(f64::from(self.state.scale))?)
    }

    /// Divides every gradient of `optimizer`'s parameters by the scale, in place (in f32 for
    /// 16-bit gradients, rounded once), and notes whether any is infinite or NaN. Call it before
    /// clipping gradients; [`GradScaler::step`] calls it if you did not. A second call before
    /// [`GradScaler::update`] is refused, as PyTorch refuses it.
    pub fn unscale<O: Optimizer + ?Sized>(&mut self, optimizer: &O) -> Result<()> {
        if self.unscaled {
            return Err(config(
                "GradScaler::unscale",
                "unscale was already called since the last update".to_string(),
            ));
        }
        let inv = 1.0 / self.state.scale;
        let mut found = false;
        for p in optimizer.parameters() {
            p.update_grad(|g| match g {
                Some(HostDataMut::F32(v)) => found |= unscale_f32(v, inv),
                Some(HostDataMut::F64(v)) => {
                    let inv = f64::from(inv);
                    v.iter_mut().for_each(|x| {
                        *x *= inv;
                        found |= !x.is_finite();
                    })
                }
                Some(HostDataMut::BF16(v)) => found |= unscale_half(v, inv),
                Some(HostDataMut::F16(v)) => found |= unscale_half(v, inv),
                // Only floating tensors carry gradients.
                Some(_) | None => {}
            });
        }
        self.found_inf = found;
        self.unscaled = true;
        Ok(())
    }

    /// Unscales the gradients if [`GradScaler::unscale`] was not called, then takes the
    /// optimiser's step unless a gradient was infinite or NaN. Returns whether it stepped.
    pub fn step<O: Optimizer + ?Sized>(&mut self, optimizer: &mut O) -> Result<bool> {
        if !self.unscaled {
            self.unscale(optimizer)?;
        }
        if self.found_inf {
            return Ok(false);
        }
        optimizer.step()?;
        Ok(true)
    }

    /// Ends the step: after an overflow the scale shrinks by `backoff_factor`; after
    /// `growth_interval` good steps in a row it grows by `growth_factor` (if that stays
    /// finite), as PyTorch's `_amp_update_scale_`.
    pub fn update(&mut self) {
        let s = &mut self.state;
        if self.found_inf {
            s.scale *= self.cfg.backoff_factor;
            s.growth_tracker = 0;
        } else {
            let good = s.growth_tracker + 1;
            if good == self.cfg.growth_interval {
                let grown = s.scale * self.cfg.growth_factor;
                if grown.is_finite() {
                    s.scale = grown;
                }
                s.growth_tracker = 0;
            } else {
                s.growth_tracker = good;
            }
        }
        self.unscaled = false;
        self.found_inf = false;
    }
}

/// `v ·= inv`; whether any element is not finite.
fn unscale_f32(v: &mut [f32], inv: f32) -> bool {
    let mut found = false;
    for x in v.iter_mut() {
        *x *= inv;
        found |= !x.is_finite();
    }
    found
}

/// [`unscale_f32`] for 16-bit gradients: multiplied in f32, rounded once.
fn unscale_half<T: Storage>(v: &mut [T], inv: f32) -> bool {
    let mut found = false;
    for x in v.iter_mut() {
        let y = x.widen() as f32 * inv;
        found |= !y.is_finite();
        *x = T::narrow(f64::from(y));
    }
    found
}
