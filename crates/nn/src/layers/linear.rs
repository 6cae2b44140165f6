//! Fully connected layers and embeddings.

use arenagrad_graph::{DType, Graph, Parameter, Tensor};

use crate::error::{config, Result};
use crate::functional as F;
use crate::init::Init;
use crate::module::{Module, Visitor};
use crate::Rng;

/// Options of a [`Linear`] layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearConfig {
    /// Whether to add a bias (default true).
    pub bias: bool,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
    /// How to fill the weight (default [`Init::FanInUniform`], PyTorch's).
    pub weight_init: Init,
    /// How to fill the bias, with the weight's fans (default [`Init::FanInUniform`], PyTorch's).
    pub bias_init: Init,
}

impl Default for LinearConfig {
    fn default() -> Self {
        LinearConfig {
            bias: true,
            dtype: DType::F32,
            weight_init: Init::PYTORCH_DEFAULT,
            bias_init: Init::PYTORCH_DEFAULT,
        }
    }
}

/// `y = x·Wᵀ + b` over the last axis: input `[…, in]`, output `[…, out]`; `weight` is
/// `[out, in]` and `bias` `[out]` (PyTorch's layout and names, so checkpoints line up).
///
/// ```
/// use arenagrad_nn::{DType, Graph, HostTensor, Linear, Module, Parameter, Rng};
/// let mut rng = Rng::seed(0);
/// let fc = Linear::new(3, 2, &mut rng)?; // torch: nn.Linear(3, 2)
/// let g = Graph::new();
/// let y = fc.forward(&g, g.ones(&[5, 3], DType::F32)?)?;
/// assert_eq!(y.shape().as_slice(), &[5, 2]);
///
/// // The same layer with its weight and bias set by hand: y = x·Wᵀ + b.
/// let w = HostTensor::new(vec![1.0f32, 0.0, 2.0, 0.0, 1.0, -1.0], &[2, 3])?;
/// let b = HostTensor::new(vec![0.5f32, -0.5], &[2])?;
/// let fc = Linear::from_parameters(Parameter::new("weight", w), Some(Parameter::new("bias", b)))?;
/// let y = fc.forward(&g, g.from_slice(&[1.0f32, 2.0, 3.0], &[1, 3])?)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![1.0 + 6.0 + 0.5, 2.0 - 3.0 - 0.5]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct Linear {
    weight: Parameter,
    bias: Option<Parameter>,
    /// The weight is `[in, out]` ([`Linear::in_out`]), not `[out, in]`.
    in_out: bool,
    /// A low-rank adapter beside the weight ([`Linear::add_lora`]).
    lora: Option<Lora>,
}

/// A low-rank adapter of a [`Linear`] layer (LoRA, as PEFT's `LoraLayer`): `x·Aᵀ·Bᵀ·(α/r)`
/// added to the layer's output, `A` (`lora_A.weight`, `[r, in]`) drawn as `nn.Linear`'s
/// weight, `B` (`lora_B.weight`, `[out, r]`) zero, so that a fresh adapter changes nothing.
/// Merged into the weight ([`Linear::merge_lora`]) it costs nothing at inference.
#[derive(Debug)]
pub struct Lora {
    a: Parameter,
    b: Parameter,
    scale: f64,
    merged: bool,
}

impl Lora {
    /// `A`, `[r, in]`.
    pub fn a(&self) -> &Parameter {
        &self.a
    }

    /// `B`, `[out, r]`.
    pub fn b(&self) -> &Parameter {
        &self.b
    }

    /// `α / r`.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Whether `B·A·(α/r)` is in the weight now (and the adapter skipped in the forward).
    pub fn is_merged(&self) -> bool {
        self.merged
    }
}

impl Linear {
    /// An f32 layer with a bias, initialised as PyTorch does.
    pub fn new(in_features: usize, out_features: usize, rng: &mut Rng) -> Result<Self> {
        Self::with_config(in_features, out_features, LinearConfig::default(), rng)
    }

    /// A layer with the given options.
    pub fn with_config(
        in_features: usize,
        out_features: usize,
        cfg: LinearConfig,
        rng: &mut Rng,
    ) -> Result<Self> {
        Self::laid_out(in_features, out_features, cfg, rng, false)
    }

    /// A layer storing its weight `[out, in]`, or `[in, out]` when `in_out`; drawn in the
    /// stored order with the `[out, in]` layer's fans.
    fn laid_out(
        in_features: usize,
        out_features: usize,
        cfg: LinearConfig,
        rng: &mut Rng,
        in_out: bool,
    ) -> Result<Self> {
        if in_features == 0 || out_features == 0 {
            return Err(config(
                "Linear",
                format!("features must be positive, got {in_features} → {out_features}"),
            ));
        }
        let shape = [out_features, in_features];
        let stored = if in_out {
            [in_features, out_features]
        } else {
            shape
        };
        let (weight, bias) = crate::init::weight_and_bias_stored(
            &shape,
            &stored,
            (cfg.weight_init, cfg.bias_init),
            cfg.bias,
            cfg.dtype,
            rng,
        )?;
        Ok(Linear {
            weight,
            bias,
            in_out,
            lora: None,
        })
    }

    /// A layer whose weight is stored `[in, out]`, as transformers' `Conv1D` stores GPT-2's
    /// (the same function, `y = x·W + b`, and the same names, `weight` and `bias`, so such
    /// checkpoints load as they are). Initialised from the same distributions as
    /// [`Linear::with_config`] (the `[out, in]` layer's fans), drawn in the stored order.
    ///
    /// ```
    /// use arenagrad_nn::{Graph, Linear, LinearConfig, Module, Rng};
    /// let io = Linear::in_out(3, 2, LinearConfig::default(), &mut Rng::seed(4))?;
    /// assert_eq!(io.weight().shape(), vec![3, 2]);
    /// assert_eq!((io.in_features(), io.out_features()), (3, 2));
    /// // The same function as the [out, in] layer with the transposed weight.
    /// let w = io.weight().value().transposed()?;
    /// let oi = Linear::from_parameters(
    ///     arenagrad_nn::Parameter::new("weight", w),
    ///     io.bias().cloned(),
    /// )?;
    /// let g = Graph::new();
    /// let x = g.from_slice(&[0.5f32, -1.0, 2.0, 1.5, 0.0, -0.25], &[2, 3])?;
    /// let (a, b) = (io.forward(&g, x)?.to_vec::<f32>()?, oi.forward(&g, x)?.to_vec::<f32>()?);
    /// // (Summed in another order: equal to rounding.)
    /// assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= 1e-6 * (1.0 + q.abs())));
    /// # Ok::<(), arenagrad_nn::NnError>(())
    /// ```
    pub fn in_out(
        in_features: usize,
        out_features: usize,
        cfg: LinearConfig,
        rng: &mut Rng,
    ) -> Result<Self> {
        Self::laid_out(in_features, out_features, cfg, rng, true)
    }

    /// A layer over existing parameters (shared weights, or values built elsewhere): `weight`
    /// `[out, in]`, `bias` `[out]`, of one dtype.
    pub fn from_parameters(weight: Parameter, bias: Option<Parameter>) -> Result<Self> {
        let ws = weight.shape();
        if ws.len() != 2 {
            return Err(config(
                "Linear",
                format!("weight shape {ws:?} is not [out, in]"),
            ));
        }
        if let Some(b) = &bias {
            if b.shape() != [ws[0]] || b.dtype() != weight.dtype() {
                return Err(config(
                    "Linear",
                    format!(
                        "bias {:?} {} does not fit weight {ws:?} {}",
                        b.shape(),
                        b.dtype(),
                        weight.dtype()
                    ),
                ));
            }
        }
        Ok(Linear {
            weight,
            bias,
            in_out: false,
            lora: None,
        })
    }

    /// The weight, `[out, in]` (`[in, out]` for a layer made by [`Linear::in_out`]).
    pub fn weight(&self) -> &Parameter {
        &self.weight
    }

    /// The bias, `[out]`, if any.
    pub fn bias(&self) -> Option<&Parameter> {
        self.bias.as_ref()
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[usize::from(!self.in_out)]
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[usize::from(self.in_out)]
    }

    /// Whether the weight is stored `[in, out]` ([`Linear::in_out`]).
    pub fn is_in_out(&self) -> bool {
        self.in_out
    }

    /// Adds a low-rank adapter of rank `r` and scale `alpha / r` ([`Lora`]) in the weight's
    /// dtype, and freezes the weight and bias (PEFT's default: only adapters train). An
    /// error for a rank of 0, a non-finite `alpha`, or a layer that has one already.
    pub fn add_lora(&mut self, r: usize, alpha: f64, rng: &mut Rng) -> Result<()> {
        if r == 0 || !alpha.is_finite() {
            return Err(config(
                "Linear::add_lora",
                format!("the rank must be positive and alpha finite, got r = {r}, alpha = {alpha}"),
            ));
        }
        if self.lora.is_some() {
            return Err(config(
                "Linear::add_lora",
                "the layer has an adapter already",
            ));
        }
        let (i, o, dtype) = (self.in_features(), self.out_features(), self.weight.dtype());
        let a = Init::PYTORCH_DEFAULT.tensor(&[r, i], dtype, rng)?;
        let b = Init::Zeros.tensor(&[o, r], dtype, rng)?;
        self.weight.set_requires_grad(false);
        if let Some(bias) = &self.bias {
            bias.set_requires_grad(false);
        }
        self.lora = Some(Lora {
            a: Parameter::new("lora_A.weight", a),
            b: Parameter::new("lora_B.weight", b),
            scale: alpha / r as f64,
            merged: false,
        });
        Ok(())
    }

    /// The adapter, if any.
    pub fn lora(&self) -> Option<&Lora> {
        self.lora.as_ref()
    }

    /// Adds `B·A·(α/r)` into the weight (in f64, rounded once to the weight's dtype); the
    /// forward then skips the adapter. An error without an adapter or when merged already.
    pub fn merge_lora(&mut self) -> Result<()> {
        self.shift_by_lora(true)
    }

    /// Takes `B·A·(α/r)` back out of the weight (exact up to the rounding of each step).
    pub fn unmerge_lora(&mut self) -> Result<()> {
        self.shift_by_lora(false)
    }

    fn shift_by_lora(&mut self, merge: bool) -> Result<()> {
        let op = if merge {
            "Linear::merge_lora"
        } else {
            "Linear::unmerge_lora"
        };
        let Some(l) = &mut self.lora else {
            return Err(config(op, "the layer has no adapter"));
        };
        if l.merged == merge {
            return Err(config(
                op,
                if merge {
                    "the adapter is merged already"
                } else {
                    "the adapter is not merged"
                },
            ));
        }
        let (a, b) = (l.a.value().to_f64_vec(), l.b.value().to_f64_vec());
        let r = l.a.shape()[0];
        let (i, o) = (self.weight.shape()[1], self.weight.shape()[0]);
        let (n_in, n_out) = if self.in_out { (o, i) } else { (i, o) };
        let w = self.weight.value();
        let mut v = w.to_f64_vec();
        let sign = if merge { l.scale } else { -l.scale };
        for row in 0..n_out {
            for col in 0..n_in {
                let d: f64 = (0..r).map(|k| b[row * r + k] * a[k * n_in + col]).sum();
                let at = if self.in_out {
                    col * n_out + row
                } else {
                    row * n_in + col
                };
                v[at] += sign * d;
            }
        }
        self.weight
            .set_value(arenagrad_graph::HostTensor::from_f64(
                &v,
                w.shape(),
                w.dtype(),
            )?)?;
        l.merged = merge;
        Ok(())
    }
}

impl Module for Linear {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let b = match &self.bias {
            Some(b) => Some(g.param(b)?),
            None => None,
        };
        let w = g.param(&self.weight)?;
        let y = if self.in_out {
            F::linear_in_out(x, w, b)?
        } else {
            F::linear(x, w, b)?
        };
        match &self.lora {
            Some(l) if !l.merged => {
                let down = F::linear(x, g.param(&l.a)?, None)?;
                let up = F::linear(down, g.param(&l.b)?, None)?;
                Ok(y.add(up.scale(l.scale)?)?)
            }
            _ => Ok(y),
        }
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("weight", &self.weight);
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
        if let Some(l) = &self.lora {
            v.param("lora_A.weight", &l.a);
            v.param("lora_B.weight", &l.b);
        }
    }
}

/// Options of an [`Embedding`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmbeddingConfig {
    /// The weight's dtype (default f32).
    pub dtype: DType,
    /// How to fill the weight (default `N(0, 1)`, PyTorch's).
    pub init: Init,
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        EmbeddingConfig {
            dtype: DType::F32,
            init: Init::Normal {
                mean: 0.0,
                std: 1.0,
            },
        }
    }
}

/// A lookup table: index `i` ↦ row `i` of `weight` (`[num_embeddings, dim]`).
///
/// [`Module::forward`] reads its input's values as indices (non-negative integers stored as
/// floats) and returns `[input shape…, dim]`; [`Embedding::lookup`] takes indices directly.
///
/// ```
/// use arenagrad_nn::{Embedding, Graph, Rng};
/// let mut rng = Rng::seed(0);
/// let emb = Embedding::new(10, 4, &mut rng)?;
/// let g = Graph::new();
/// let e = emb.lookup(&g, &[1, 7, 1], &[3])?;
/// assert_eq!(e.shape().as_slice(), &[3, 4]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct Embedding {
    weight: Parameter,
}

impl Embedding {
    /// An f32 table of `num` rows of `dim` values, drawn from `N(0, 1)`.
    pub fn new(num: usize, dim: usize, rng: &mut Rng) -> Result<Self> {
        Self::with_config(num, dim, EmbeddingConfig::default(), rng)
    }

    /// A table with the given options.
    pub fn with_config(
        num: usize,
        dim: usize,
        cfg: EmbeddingConfig,
        rng: &mut Rng,
    ) -> Result<Self> {
        if num == 0 || dim == 0 {
            return Err(config(
                "Embedding",
                format!("sizes must be positive, got {num} × {dim}"),
            ));
        }
        Ok(Embedding {
            weight: Parameter::new("weight", cfg.init.tensor(&[num, dim], cfg.dtype, rng)?),
        })
    }

    /// A table over an existing `[num, dim]` parameter.
    pub fn from_parameter(weight: Parameter) -> Result<Self> {
        if weight.shape().len() != 2 {
            return Err(config(
                "Embedding",
                format!("weight shape {:?} is not [num, dim]", weight.shape()),
            ));
        }
        Ok(Embedding { weight })
    }

    /// The table, `[num, dim]`.
    pub fn weight(&self) -> &Parameter {
        &self.weight
    }

    /// The rows `indices`, shaped `[index_shape…, dim]`.
    pub fn lookup<'g>(
        &self,
        g: &'g Graph,
        indices: &[usize],
        index_shape: &[usize],
    ) -> Result<Tensor<'g>> {
        F::embedding(g.param(&self.weight)?, indices, index_shape)
    }
}

impl Module for Embedding {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let idx = F::tensor_to_indices("Embedding", x)?;
        self.lookup(g, &idx, &x.shape())
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("weight", &self.weight);
    }
}
