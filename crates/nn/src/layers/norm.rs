//! Normalisation layers: batch norm (1-D and 2-D) and layer norm.

use arenagrad_graph::{DType, Graph, HostTensor, Parameter, Tensor};

use crate::error::{config, input_shape, Result};
use crate::functional::{self as F, RunningStats};
use crate::module::{Module, Visitor};

/// Options of [`BatchNorm1d`] and [`BatchNorm2d`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNormConfig {
    /// Added to the variance before the square root (default 1e-5).
    pub eps: f64,
    /// Weight of each batch in the running statistics (default 0.1).
    pub momentum: f64,
    /// Whether to learn a per-channel scale (`weight`, ones) and shift (`bias`, zeros)
    /// (default true).
    pub affine: bool,
    /// Whether to keep running statistics for evaluation (default true). Without them the batch's
    /// statistics are used in both modes.
    pub track_running_stats: bool,
    /// The dtype of parameters and buffers (default f32).
    pub dtype: DType,
}

impl Default for BatchNormConfig {
    fn default() -> Self {
        BatchNormConfig {
            eps: 1e-5,
            momentum: 0.1,
            affine: true,
            track_running_stats: true,
            dtype: DType::F32,
        }
    }
}

/// The shared state of the batch norms.
#[derive(Debug)]
struct BatchNorm {
    weight: Option<Parameter>,
    bias: Option<Parameter>,
    running_mean: Option<Parameter>,
    running_var: Option<Parameter>,
    eps: f64,
    momentum: f64,
    training: bool,
}

impl BatchNorm {
    fn new(component: &'static str, channels: usize, cfg: BatchNormConfig) -> Result<Self> {
        if channels == 0 {
            return Err(config(component, "channels must be positive"));
        }
        if cfg.eps.is_nan() || cfg.eps < 0.0 || !(0.0..=1.0).contains(&cfg.momentum) {
            return Err(config(
                component,
                format!(
                    "eps must be ≥ 0 and momentum in [0, 1], got eps {} momentum {}",
                    cfg.eps, cfg.momentum
                ),
            ));
        }
        let fill = |on, name, v| filled(on, name, &[channels], v, cfg.dtype);
        Ok(BatchNorm {
            weight: fill(cfg.affine, "weight", 1.0)?,
            bias: fill(cfg.affine, "bias", 0.0)?,
            running_mean: fill(cfg.track_running_stats, "running_mean", 0.0)?,
            running_var: fill(cfg.track_running_stats, "running_var", 1.0)?,
            eps: cfg.eps,
            momentum: cfg.momentum,
            training: true,
        })
    }

    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let running = match (&self.running_mean, &self.running_var) {
            (Some(mean), Some(var)) => Some(RunningStats {
                mean,
                var,
                momentum: self.momentum,
            }),
            _ => None,
        };
        let w = self.weight.as_ref().map(|p| g.param(p)).transpose()?;
        let b = self.bias.as_ref().map(|p| g.param(p)).transpose()?;
        F::batch_norm(g, x, running, w, b, self.training, self.eps)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        if let Some(p) = &self.weight {
            v.param("weight", p);
        }
        if let Some(p) = &self.bias {
            v.param("bias", p);
        }
        if let Some(p) = &self.running_mean {
            v.buffer("running_mean", p);
        }
        if let Some(p) = &self.running_var {
            v.buffer("running_var", p);
        }
    }

    fn channels(&self) -> usize {
        self.weight
            .as_ref()
            .or(self.running_mean.as_ref())
            .map_or(0, |p| p.numel())
    }
}

macro_rules! batch_norm_type {
    ($name:ident, $label:literal, $ranks:pat, $expected:literal, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug)]
        pub struct $name(BatchNorm);

        impl $name {
            /// A batch norm over `channels` channels with the default options (eps 1e-5,
            /// momentum 0.1, affine, running statistics, f32).
            pub fn new(channels: usize) -> Result<Self> {
                Self::with_config(channels, BatchNormConfig::default())
            }

            /// A batch norm with the given options.
            pub fn with_config(channels: usize, cfg: BatchNormConfig) -> Result<Self> {
                Ok($name(BatchNorm::new($label, channels, cfg)?))
            }

            /// The per-channel scale, if affine.
            pub fn weight(&self) -> Option<&Parameter> {
                self.0.weight.as_ref()
            }

            /// The per-channel shift, if affine.
            pub fn bias(&self) -> Option<&Parameter> {
                self.0.bias.as_ref()
            }

            /// The running mean, if tracked.
            pub fn running_mean(&self) -> Option<&Parameter> {
                self.0.running_mean.as_ref()
            }

            /// The running unbiased variance, if tracked.
            pub fn running_var(&self) -> Option<&Parameter> {
                self.0.running_var.as_ref()
            }

            /// Whether the layer is in training mode.
            pub fn is_training(&self) -> bool {
                self.0.training
            }
        }

        impl Module for $name {
            fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
                let s = x.try_shape()?;
                if !matches!(s.len(), $ranks) || s[1] != self.0.channels() {
                    return Err(input_shape(
                        $label,
                        &format!($expected, self.0.channels()),
                        &s,
                    ));
                }
                self.0.forward(g, x)
            }

            fn visit(&self, v: &mut Visitor<'_>) {
                self.0.visit(v)
            }

            fn set_training(&mut self, training: bool) {
                self.0.training = training;
            }
        }
    };
}

batch_norm_type!(
    BatchNorm1d,
    "BatchNorm1d",
    2 | 3,
    "[N, {0}] or [N, {0}, L]",
    "Batch normalisation of `[N, C]` or `[N, C, L]` inputs per channel: `y = (x − μ) / √(σ² + ε) · γ + β`, \
     with the batch's statistics in training mode (updating the running ones with momentum 0.1 by \
     default) and the running statistics in evaluation mode. Parameters `weight` (γ) and `bias` \
     (β); buffers `running_mean` and `running_var`.\n\n\
     ```\n\
     use arenagrad_nn::{BatchNorm1d, DType, Graph, Module};\n\
     let mut bn = BatchNorm1d::new(2)?;\n\
     let g = Graph::new();\n\
     let x = g.from_f64(&[1.0, 10.0, 3.0, 30.0], &[2, 2], DType::F32)?;\n\
     let y = bn.forward(&g, x)?.to_vec::<f32>()?;\n\
     assert!((y[0] + 1.0).abs() < 1e-4 && (y[1] + 1.0).abs() < 1e-4);\n\
     // running_mean moved 10% toward the batch mean [2, 20]\n\
     assert_eq!(bn.running_mean().unwrap().value().to_f64_vec(), vec![0.2f32 as f64, 2.0]);\n\
     bn.eval(); // now normalises with the running statistics\n\
     # Ok::<(), arenagrad_nn::NnError>(())\n\
     ```"
);

batch_norm_type!(
    BatchNorm2d,
    "BatchNorm2d",
    4,
    "[N, {}, H, W]",
    "Batch normalisation of `[N, C, H, W]` images per channel (statistics over `N`, `H` and `W`); \
     otherwise as [`BatchNorm1d`]."
);

/// Options of a [`LayerNorm`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormConfig {
    /// Added to the variance before the square root (default 1e-5).
    pub eps: f64,
    /// Whether to learn an elementwise scale and shift (default true).
    pub elementwise_affine: bool,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
}

impl Default for LayerNormConfig {
    fn default() -> Self {
        LayerNormConfig {
            eps: 1e-5,
            elementwise_affine: true,
            dtype: DType::F32,
        }
    }
}

/// Normalisation over the trailing axes `normalized_shape` of each sample, with an elementwise
/// scale (`weight`, ones) and shift (`bias`, zeros). The same in both modes.
///
/// ```
/// use arenagrad_nn::{DType, Graph, LayerNorm, Module};
/// let ln = LayerNorm::new(&[2])?;
/// let g = Graph::new();
/// let y = ln.forward(&g, g.from_f64(&[1.0, 3.0], &[1, 2], DType::F32)?)?;
/// let v = y.to_vec::<f32>()?;
/// assert!((v[0] + 1.0).abs() < 1e-4 && (v[1] - 1.0).abs() < 1e-4);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct LayerNorm {
    normalized_shape: Vec<usize>,
    weight: Option<Parameter>,
    bias: Option<Parameter>,
    eps: f64,
    /// RMS normalisation instead (an [`RMSNorm`]'s inside: no centring, no bias).
    rms: bool,
}

impl LayerNorm {
    /// A layer norm over trailing axes of shape `normalized_shape`, default options.
    pub fn new(normalized_shape: &[usize]) -> Result<Self> {
        Self::with_config(normalized_shape, LayerNormConfig::default())
    }

    /// A layer norm with the given options.
    pub fn with_config(normalized_shape: &[usize], cfg: LayerNormConfig) -> Result<Self> {
        Self::build("LayerNorm", normalized_shape, cfg, false)
    }

    fn build(
        name: &'static str,
        normalized_shape: &[usize],
        cfg: LayerNormConfig,
        rms: bool,
    ) -> Result<Self> {
        if normalized_shape.is_empty() || normalized_shape.contains(&0) {
            return Err(config(
                name,
                format!("normalized_shape {normalized_shape:?} must be non-empty and positive"),
            ));
        }
        if cfg.eps.is_nan() || cfg.eps < 0.0 {
            return Err(config(name, format!("eps {} must be ≥ 0", cfg.eps)));
        }
        normalized_shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| config(name, format!("{normalized_shape:?} is too large")))?;
        let on = cfg.elementwise_affine;
        Ok(LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            weight: filled(on, "weight", normalized_shape, 1.0, cfg.dtype)?,
            bias: filled(on && !rms, "bias", normalized_shape, 0.0, cfg.dtype)?,
            eps: cfg.eps,
            rms,
        })
    }

    /// The scale, if affine.
    pub fn weight(&self) -> Option<&Parameter> {
        self.weight.as_ref()
    }

    /// The shift, if affine.
    pub fn bias(&self) -> Option<&Parameter> {
        self.bias.as_ref()
    }
}

impl LayerNorm {
    /// The output as the matrix product after the norm will read it: under
    /// [`Graph::autocast`] to a 16-bit dtype, a layer norm of an f32 input stores its output in
    /// that dtype — the values the product's cast would make (PyTorch computes the norm in f32
    /// and casts), without an f32 copy kept for the iteration. Otherwise [`Module::forward`].
    pub fn forward_for_product<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        match g.autocast_dtype() {
            Some(d) if !self.rms && x.dtype() == DType::F32 => self.apply(g, x, Some(d)),
            _ => self.apply(g, x, None),
        }
    }

    /// The norm, its output stored in `out` when given.
    fn apply<'g>(&self, g: &'g Graph, x: Tensor<'g>, out: Option<DType>) -> Result<Tensor<'g>> {
        let s = x.try_shape()?;
        let k = self.normalized_shape.len();
        if s.len() < k || s[s.len() - k..] != self.normalized_shape[..] {
            return Err(input_shape(
                if self.rms { "RMSNorm" } else { "LayerNorm" },
                &format!(
                    "[…, {}]",
                    self.normalized_shape
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                &s,
            ));
        }
        let w = self.weight.as_ref().map(|p| g.param(p)).transpose()?;
        if self.rms {
            return F::rms_norm(x, k, w, self.eps);
        }
        let b = self.bias.as_ref().map(|p| g.param(p)).transpose()?;
        match out {
            Some(d) => F::layer_norm_as(x, k, (w, b), self.eps, d),
            None => F::layer_norm(x, k, w, b, self.eps),
        }
    }
}

impl Module for LayerNorm {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        self.apply(g, x, None)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        if let Some(p) = &self.weight {
            v.param("weight", p);
        }
        if let Some(p) = &self.bias {
            v.param("bias", p);
        }
    }
}

/// Options of an [`RMSNorm`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RMSNormConfig {
    /// Added to the mean square before the square root; `None` (the default) is the dtype's
    /// machine epsilon, as PyTorch's `eps=None`.
    pub eps: Option<f64>,
    /// Whether to learn an elementwise scale (default true).
    pub elementwise_affine: bool,
    /// The parameter's dtype (default f32).
    pub dtype: DType,
}

impl Default for RMSNormConfig {
    fn default() -> Self {
        RMSNormConfig {
            eps: None,
            elementwise_affine: true,
            dtype: DType::F32,
        }
    }
}

/// RMS normalisation over the trailing axes `normalized_shape`, `x/√(mean(x²) + eps)·weight`
/// (PyTorch's `RMSNorm`; `weight` starts at ones). One fused op on the host.
///
/// ```
/// use arenagrad_nn::{DType, Graph, Module, RMSNorm};
/// let norm = RMSNorm::new(&[2])?;
/// let g = Graph::new();
/// let y = norm.forward(&g, g.from_f64(&[3.0, 4.0], &[1, 2], DType::F32)?)?;
/// let v = y.to_vec::<f32>()?; // ÷ √((9 + 16)/2)
/// assert!((v[0] - 0.848_528).abs() < 1e-5 && (v[1] - 1.131_371).abs() < 1e-5);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct RMSNorm(LayerNorm);

impl RMSNorm {
    /// An RMS norm over trailing axes of shape `normalized_shape`, default options.
    pub fn new(normalized_shape: &[usize]) -> Result<Self> {
        Self::with_config(normalized_shape, RMSNormConfig::default())
    }

    /// An RMS norm with the given options.
    pub fn with_config(normalized_shape: &[usize], cfg: RMSNormConfig) -> Result<Self> {
        let ln = LayerNormConfig {
            eps: cfg.eps.unwrap_or(cfg.dtype.epsilon()),
            elementwise_affine: cfg.elementwise_affine,
            dtype: cfg.dtype,
        };
        LayerNorm::build("RMSNorm", normalized_shape, ln, true).map(RMSNorm)
    }

    /// The scale, if affine.
    pub fn weight(&self) -> Option<&Parameter> {
        self.0.weight()
    }

    /// The `eps` in use.
    pub fn eps(&self) -> f64 {
        self.0.eps
    }
}

impl Module for RMSNorm {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        self.0.forward(g, x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        self.0.visit(v);
    }
}

/// When `on`, a parameter `name` of `shape` with every element `value` (reserved fallibly, as
/// [`HostTensor::full`]); the optional weights and statistics of the norm layers.
fn filled(
    on: bool,
    name: &str,
    shape: &[usize],
    value: f64,
    dtype: arenagrad_graph::DType,
) -> Result<Option<Parameter>> {
    if !on {
        return Ok(None);
    }
    Ok(Some(Parameter::new(
        name,
        HostTensor::full(shape, value, dtype)?,
    )))
}
