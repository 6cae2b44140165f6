//! `--precision f32|bf16|f16` of the training examples: the forward (and the evaluation) under
//! autocast to the 16-bit dtype, the parameters and the optimiser in f32; f16 scales its loss
//! (a `GradScaler`, as PyTorch's `torch.amp` recipe), bf16 needs no scaling.
#![allow(dead_code)]

use arenagrad::nn::optim::{clip_grad_norm, GradScaler, GradScalerConfig, Optimizer};
use arenagrad::nn::NnError;
use arenagrad::prelude::*;
use arenagrad::AutocastGuard;

/// The precision a training example runs its forward in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    /// Everything in f32.
    F32,
    /// Matrix products, convolutions and attention in bf16 (autocast).
    Bf16,
    /// The same in f16, with loss scaling.
    F16,
}

impl Precision {
    /// How the header line names it.
    pub fn describe(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16 autocast (f32 weights and optimiser)",
            Precision::F16 => "f16 autocast with loss scaling (f32 weights and optimiser)",
        }
    }

    /// The autocast scope for this precision (none for f32); the forward runs while it lives.
    pub fn autocast(self, g: &Graph) -> Result<Option<AutocastGuard<'_>>, NnError> {
        Ok(match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(g.autocast(DType::BF16)?),
            Precision::F16 => Some(g.autocast(DType::F16)?),
        })
    }

    /// The loss scaler this precision trains with (f16's, PyTorch's defaults).
    pub fn scaler(self) -> Result<Option<GradScaler>, NnError> {
        match self {
            Precision::F16 => Ok(Some(GradScaler::new(GradScalerConfig::default())?)),
            _ => Ok(None),
        }
    }
}

/// Backward from `loss` (scaled first when there is a scaler); returns the unscaled loss.
pub fn backward(loss: Tensor<'_>, scaler: Option<&GradScaler>) -> Result<f64, NnError> {
    match scaler {
        Some(s) => s.scale_loss(loss)?.backward()?,
        None => loss.backward()?,
    }
    Ok(loss.item()?)
}

/// The optimiser's step after [`backward`] (and the graph's reset): gradients unscaled, then
/// clipped to `clip` when given, then the step — skipped, with a smaller scale, when a scaled
/// gradient overflowed. Returns whether the weights changed.
pub fn step(
    opt: &mut dyn Optimizer,
    scaler: Option<&mut GradScaler>,
    clip: Option<f64>,
) -> Result<bool, NnError> {
    match scaler {
        Some(s) => {
            s.unscale(&*opt)?;
            if let Some(c) = clip {
                clip_grad_norm(opt.parameters(), c)?;
            }
            let stepped = s.step(opt)?;
            s.update();
            Ok(stepped)
        }
        None => {
            if let Some(c) = clip {
                clip_grad_norm(opt.parameters(), c)?;
            }
            opt.step()?;
            Ok(true)
        }
    }
}
