//! Parameter initialisers: constant, uniform, normal, Xavier (Glorot) and Kaiming (He), with
//! PyTorch's fan and gain conventions, drawn from a seeded [`Rng`].
//!
//! ```
//! use arenagrad_nn::init::{FanMode, Init, Nonlinearity};
//! use arenagrad_nn::{DType, Rng};
//! let mut rng = Rng::seed(0);
//! let w = Init::KaimingNormal { a: 0.0, mode: FanMode::FanIn, nonlinearity: Nonlinearity::ReLU }
//!     .tensor(&[256, 128], DType::F32, &mut rng)
//!     .unwrap();
//! assert_eq!(w.shape(), &[256, 128]);
//! ```

use arenagrad_graph::{DType, HostDataMut, HostTensor, Storage};

use crate::error::{config, Result};
use crate::Rng;

/// Which fan an initialiser scales by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FanMode {
    /// Inputs per output (preserves the forward pass's variance).
    #[default]
    FanIn,
    /// Outputs per input (preserves the backward pass's variance).
    FanOut,
}

/// A nonlinearity, by PyTorch's names: what an Elman [`RNN`](crate::RNN) or
/// [`RNNCell`](crate::RNNCell) applies (`Tanh`, PyTorch's default, or `ReLU`; others are refused
/// as PyTorch refuses them), and what a layer feeds, for [`calculate_gain`] (PyTorch's
/// `nonlinearity` strings `"linear"`, `"sigmoid"`, `"tanh"`, `"relu"`, `"leaky_relu"`, `"selu"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nonlinearity {
    /// Identity, linear and convolution layers: gain 1.
    Linear,
    /// Sigmoid: gain 1.
    Sigmoid,
    /// Tanh: gain 5/3.
    Tanh,
    /// ReLU: gain √2.
    ReLU,
    /// Leaky ReLU with negative slope `a`: gain √(2 / (1 + a²)) (the Kaiming initialisers'
    /// default, as PyTorch's).
    LeakyReLU,
    /// SELU: gain 3/4.
    SELU,
}

impl Nonlinearity {
    /// PyTorch's string for it (`"leaky_relu"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Nonlinearity::Linear => "linear",
            Nonlinearity::Sigmoid => "sigmoid",
            Nonlinearity::Tanh => "tanh",
            Nonlinearity::ReLU => "relu",
            Nonlinearity::LeakyReLU => "leaky_relu",
            Nonlinearity::SELU => "selu",
        }
    }
}

/// The recommended gain for a nonlinearity; `a` is the leaky ReLU's negative slope (ignored by
/// the others).
pub fn calculate_gain(nonlinearity: Nonlinearity, a: f64) -> f64 {
    match nonlinearity {
        Nonlinearity::Linear | Nonlinearity::Sigmoid => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::ReLU => 2f64.sqrt(),
        Nonlinearity::LeakyReLU => (2.0 / (1.0 + a * a)).sqrt(),
        Nonlinearity::SELU => 0.75,
    }
}

/// `(fan_in, fan_out)` of a weight shape, as PyTorch computes them: for `[out, in, k...]`,
/// `fan_in = in · Πk` and `fan_out = out · Πk`; a 1-D shape has both equal to its length.
pub fn fans(shape: &[usize]) -> (usize, usize) {
    match shape.len() {
        0 => (1, 1),
        1 => (shape[0], shape[0]),
        _ => {
            let receptive = shape[2..].iter().fold(1usize, |a, &d| a.saturating_mul(d));
            (
                shape[1].saturating_mul(receptive),
                shape[0].saturating_mul(receptive),
            )
        }
    }
}

/// How to fill a parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Every element equal to the value.
    Constant(f64),
    /// Uniform in `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f64,
        /// Upper bound.
        high: f64,
    },
    /// Normal with the given mean and standard deviation.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// Glorot uniform: `U(−b, b)` with `b = gain · √(6 / (fan_in + fan_out))`.
    XavierUniform {
        /// Scale factor (see [`calculate_gain`]).
        gain: f64,
    },
    /// Glorot normal: `N(0, σ²)` with `σ = gain · √(2 / (fan_in + fan_out))`.
    XavierNormal {
        /// Scale factor (see [`calculate_gain`]).
        gain: f64,
    },
    /// He uniform: `U(−b, b)` with `b = √3 · gain / √fan`, `gain = calculate_gain(nonlinearity, a)`.
    KaimingUniform {
        /// Negative slope for [`Nonlinearity::LeakyReLU`].
        a: f64,
        /// Which fan.
        mode: FanMode,
        /// The nonlinearity that follows.
        nonlinearity: Nonlinearity,
    },
    /// He normal: `N(0, σ²)` with `σ = gain / √fan`.
    KaimingNormal {
        /// Negative slope for [`Nonlinearity::LeakyReLU`].
        a: f64,
        /// Which fan.
        mode: FanMode,
        /// The nonlinearity that follows.
        nonlinearity: Nonlinearity,
    },
    /// `U(−1/√fan_in, 1/√fan_in)`: PyTorch's default for linear and convolution weights
    /// (`kaiming_uniform_(a=√5)` reduces to this) and biases, with the fan of the weight.
    FanInUniform,
}

impl Init {
    /// PyTorch's default for `Linear` and `Conv2d` weights and biases ([`Init::FanInUniform`]).
    pub const PYTORCH_DEFAULT: Init = Init::FanInUniform;

    /// Kaiming uniform for a ReLU network (fan in).
    pub fn kaiming_uniform_relu() -> Init {
        Init::KaimingUniform {
            a: 0.0,
            mode: FanMode::FanIn,
            nonlinearity: Nonlinearity::ReLU,
        }
    }

    /// Xavier uniform with gain 1.
    pub fn xavier_uniform() -> Init {
        Init::XavierUniform { gain: 1.0 }
    }

    /// Fills a tensor of `shape`, with fans computed from `shape` itself (see [`fans`]).
    pub fn tensor(&self, shape: &[usize], dtype: DType, rng: &mut Rng) -> Result<HostTensor> {
        self.tensor_with_fans(shape, fans(shape), dtype, rng)
    }

    /// Fills a tensor of `shape` using the given `(fan_in, fan_out)` — how a layer initialises a
    /// bias with its weight's fans.
    pub fn tensor_with_fans(
        &self,
        shape: &[usize],
        (fan_in, fan_out): (usize, usize),
        dtype: DType,
        rng: &mut Rng,
    ) -> Result<HostTensor> {
        shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| config("Init", format!("shape {shape:?} is too large")))?;
        let fan = |mode: FanMode| match mode {
            FanMode::FanIn => fan_in,
            FanMode::FanOut => fan_out,
        } as f64;
        let nonzero = |f: f64| -> Result<f64> {
            if f > 0.0 {
                Ok(f)
            } else {
                Err(config(
                    "Init",
                    format!(
                        "fan of shape {shape:?} is zero; this initialiser needs a positive fan"
                    ),
                ))
            }
        };
        // The constants need no draws: one fill.
        let constant = match *self {
            Init::Zeros => Some(0.0),
            Init::Ones => Some(1.0),
            Init::Constant(c) => Some(c),
            _ => None,
        };
        if let Some(c) = constant {
            return Ok(HostTensor::full(shape, c, dtype)?);
        }
        // Each initialiser as one draw per element, in order; the tensor is reserved fallibly
        // (a shape the host cannot hold is `OutOfMemory`, not an abort) and filled in place.
        let mut draw: Draw = match *self {
            Init::Zeros => Box::new(|_| 0.0),
            Init::Ones => Box::new(|_| 1.0),
            Init::Constant(c) => Box::new(move |_| c),
            Init::Uniform { low, high } => {
                if low.is_nan() || high.is_nan() || low > high {
                    return Err(config("Init::Uniform", format!("low {low} > high {high}")));
                }
                Box::new(move |r| r.uniform_range(low, high))
            }
            Init::Normal { mean, std } => normal(mean, std)?,
            Init::XavierUniform { gain } => {
                let b = gain * (6.0 / nonzero((fan_in + fan_out) as f64)?).sqrt();
                Box::new(move |r| r.uniform_range(-b, b))
            }
            Init::XavierNormal { gain } => {
                let s = gain * (2.0 / nonzero((fan_in + fan_out) as f64)?).sqrt();
                normal(0.0, s)?
            }
            Init::KaimingUniform {
                a,
                mode,
                nonlinearity,
            } => {
                let std = calculate_gain(nonlinearity, a) / nonzero(fan(mode))?.sqrt();
                let b = 3f64.sqrt() * std;
                Box::new(move |r| r.uniform_range(-b, b))
            }
            Init::KaimingNormal {
                a,
                mode,
                nonlinearity,
            } => {
                let std = calculate_gain(nonlinearity, a) / nonzero(fan(mode))?.sqrt();
                normal(0.0, std)?
            }
            Init::FanInUniform => {
                let b = 1.0 / nonzero(fan_in as f64)?.sqrt();
                Box::new(move |r| r.uniform_range(-b, b))
            }
        };
        let mut t = HostTensor::zeros(shape, dtype)?;
        match t.data_mut() {
            HostDataMut::F32(v) => v.iter_mut().for_each(|x| *x = draw(rng) as f32),
            HostDataMut::F64(v) => v.iter_mut().for_each(|x| *x = draw(rng)),
            HostDataMut::BF16(v) => v.iter_mut().for_each(|x| *x = Storage::narrow(draw(rng))),
            HostDataMut::F16(v) => v.iter_mut().for_each(|x| *x = Storage::narrow(draw(rng))),
            // Integer tensors take the draws truncated toward zero, as a cast would.
            HostDataMut::I64(v) => v.iter_mut().for_each(|x| *x = Storage::narrow(draw(rng))),
            HostDataMut::I32(v) => v.iter_mut().for_each(|x| *x = Storage::narrow(draw(rng))),
            HostDataMut::U8(v) => v.iter_mut().for_each(|x| *x = Storage::narrow(draw(rng))),
            HostDataMut::Bool(v) => v.iter_mut().for_each(|x| *x = Storage::narrow(draw(rng))),
        }
        Ok(t)
    }
}

/// One element's value, drawn from the generator (or not, for constants).
type Draw = Box<dyn FnMut(&mut Rng) -> f64>;

/// One draw of `N(mean, std²)`.
fn normal(mean: f64, std: f64) -> Result<Draw> {
    if std.is_nan() || std < 0.0 {
        return Err(config("Init::Normal", format!("std {std} is negative")));
    }
    Ok(Box::new(move |r| mean + std * r.normal()))
}

/// A layer's weight of `shape` and, when `bias`, its bias `[shape[0]]`, both drawn from their
/// initialisers with the weight's fans (PyTorch's rule for linear and convolution layers). The
/// weight is drawn first, so a seed gives the same values as drawing them one by one.
pub(crate) fn weight_and_bias(
    shape: &[usize],
    (weight_init, bias_init): (Init, Init),
    bias: bool,
    dtype: DType,
    rng: &mut Rng,
) -> Result<(
    arenagrad_graph::Parameter,
    Option<arenagrad_graph::Parameter>,
)> {
    weight_and_bias_stored(shape, shape, (weight_init, bias_init), bias, dtype, rng)
}

/// [`weight_and_bias`] for a weight of logical shape `shape` (`[out, in, …]`: its fans and the
/// bias's length) stored as `stored` (the same elements in another layout, as a linear layer
/// stored `[in, out]`; every initialiser draws its elements independently, so the layout does
/// not change their distribution).
pub(crate) fn weight_and_bias_stored(
    shape: &[usize],
    stored: &[usize],
    (weight_init, bias_init): (Init, Init),
    bias: bool,
    dtype: DType,
    rng: &mut Rng,
) -> Result<(
    arenagrad_graph::Parameter,
    Option<arenagrad_graph::Parameter>,
)> {
    use arenagrad_graph::Parameter;
    let f = fans(shape);
    let weight = Parameter::new(
        "weight",
        weight_init.tensor_with_fans(stored, f, dtype, rng)?,
    );
    let bias = if bias {
        let b = bias_init.tensor_with_fans(&shape[..1], f, dtype, rng)?;
        Some(Parameter::new("bias", b))
    } else {
        None
    };
    Ok((weight, bias))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fans_follow_pytorch() {
        assert_eq!(fans(&[10, 4]), (4, 10));
        assert_eq!(fans(&[8, 3, 5, 5]), (75, 200));
        assert_eq!(fans(&[7]), (7, 7));
    }

    #[test]
    fn bounds_and_spread() {
        let mut r = Rng::seed(0);
        let t = Init::FanInUniform
            .tensor(&[50, 100], DType::F64, &mut r)
            .unwrap();
        let v = t.to_f64_vec();
        assert!(v.iter().all(|x| x.abs() < 0.1));
        assert!(v.iter().any(|x| x.abs() > 0.09));
        let t = Init::kaiming_uniform_relu()
            .tensor(&[50, 100], DType::F64, &mut r)
            .unwrap();
        let b = 3f64.sqrt() * 2f64.sqrt() / 10.0;
        assert!(t.to_f64_vec().iter().all(|x| x.abs() < b));
        let t = Init::XavierNormal { gain: 1.0 }
            .tensor(&[200, 300], DType::F64, &mut r)
            .unwrap();
        let v = t.to_f64_vec();
        let var = v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64;
        assert!((var / (2.0 / 500.0) - 1.0).abs() < 0.05, "{var}");
        // The default linear weight init (kaiming_uniform with a = √5) equals FanInUniform's bound.
        let k = calculate_gain(Nonlinearity::LeakyReLU, 5f64.sqrt()) * 3f64.sqrt();
        assert!((k - 1.0).abs() < 1e-15);
    }

    #[test]
    fn bad_options_are_errors() {
        let mut r = Rng::seed(0);
        assert!(Init::Normal {
            mean: 0.0,
            std: -1.0
        }
        .tensor(&[2], DType::F32, &mut r)
        .is_err());
        assert!(Init::FanInUniform
            .tensor(&[3, 0], DType::F32, &mut r)
            .is_err());
        assert!(Init::Uniform {
            low: 1.0,
            high: 0.0
        }
        .tensor(&[2], DType::F32, &mut r)
        .is_err());
    }
}
