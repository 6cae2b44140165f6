//! What the models built after `transformers`' share: reading its `config.json`, its
//! activations by name, and weights drawn at random or left zero for a checkpoint to fill.

use arenagrad_graph::Tensor;

#[cfg(feature = "checkpoint")]
use crate::error::config;
use crate::error::Result;
use crate::init::Init;

/// An activation, by `transformers`' names for it (`activation_function`, `hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `gelu_new` (GPT-2's own), `gelu_pytorch_tanh`, `gelu_fast`: GELU's tanh approximation.
    GeluTanh,
    /// `gelu`: exact GELU (BERT's).
    Gelu,
    /// `relu`.
    Relu,
    /// `silu` or `swish`.
    Silu,
}

impl Activation {
    /// The activation `transformers` calls `name`; `None` for one this crate lacks.
    pub fn from_hf_name(name: &str) -> Option<Self> {
        Some(match name {
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Self::GeluTanh,
            "gelu" => Self::Gelu,
            "relu" => Self::Relu,
            "silu" | "swish" => Self::Silu,
            _ => return None,
        })
    }

    /// The activation of `x`.
    pub fn apply<'g>(self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(match self {
            Self::GeluTanh => x.gelu_tanh()?,
            Self::Gelu => x.gelu()?,
            Self::Relu => x.relu()?,
            Self::Silu => x.silu()?,
        })
    }
}

/// `dtype` when it can hold a model's parameters (a float), else a configuration error naming
/// `who`: what `from_pretrained_as` checks before building.
#[cfg(feature = "checkpoint")]
pub(crate) fn parameter_dtype(
    who: &'static str,
    dtype: arenagrad_graph::DType,
) -> Result<arenagrad_graph::DType> {
    if dtype.is_float() {
        Ok(dtype)
    } else {
        Err(config(
            who,
            format!("the parameters' dtype must be a float, not {dtype:?}"),
        ))
    }
}

/// `Normal(0, std)` when drawing at random, zeros for a model a checkpoint is about to fill
/// (no draws to pay for).
pub(crate) fn normal_or_zeros(random: bool, std: f64) -> Init {
    if random {
        Init::Normal { mean: 0.0, std }
    } else {
        Init::Zeros
    }
}

/// A `config.json` as `transformers` writes it, read for the configuration `model` names in
/// its errors. A key that is absent or `null` takes the default.
#[cfg(feature = "checkpoint")]
pub(crate) struct HfJson {
    model: &'static str,
    v: serde_json::Value,
}

#[cfg(feature = "checkpoint")]
impl HfJson {
    /// `dir/config.json`.
    pub(crate) fn read(model: &'static str, dir: &std::path::Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(crate::files::io(&path))?;
        Self::parse(model, &text)
    }

    /// The file's text.
    pub(crate) fn parse(model: &'static str, text: &str) -> Result<Self> {
        let v = serde_json::from_str(text)
            .map_err(|e| config(model, format!("config.json is not JSON: {e}")))?;
        Ok(HfJson { model, v })
    }

    /// `key`'s value, unless absent or `null`.
    pub(crate) fn get(&self, key: &str) -> Option<&serde_json::Value> {
        self.v.get(key).filter(|x| !x.is_null())
    }

    /// A count.
    pub(crate) fn count(&self, key: &str, default: usize) -> Result<usize> {
        match self.get(key) {
            None => Ok(default),
            Some(x) => x
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| config(self.model, format!("{key} is not a count: {x}"))),
        }
    }

    /// A number: `x` (the value at `key`, or found elsewhere), or the default.
    pub(crate) fn real_of(
        &self,
        x: Option<&serde_json::Value>,
        key: &str,
        default: f64,
    ) -> Result<f64> {
        match x {
            None => Ok(default),
            Some(x) => x
                .as_f64()
                .ok_or_else(|| config(self.model, format!("{key} is not a number: {x}"))),
        }
    }

    /// A number.
    pub(crate) fn real(&self, key: &str, default: f64) -> Result<f64> {
        self.real_of(self.get(key), key, default)
    }

    /// A flag.
    pub(crate) fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(x) => x
                .as_bool()
                .ok_or_else(|| config(self.model, format!("{key} is not true or false: {x}"))),
        }
    }

    /// A string (`None` when absent or not a string).
    pub(crate) fn text(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(|x| x.as_str())
    }

    /// Refuses `key` set to `value`: an option this implementation does not have.
    pub(crate) fn refuse(&self, key: &str, value: bool, default: bool) -> Result<()> {
        if self.flag(key, default)? == value {
            return Err(config(
                self.model,
                format!("{key} = {value} is not supported"),
            ));
        }
        Ok(())
    }

    /// The activation named at `key`, or the default.
    pub(crate) fn activation(&self, key: &str, default: Activation) -> Result<Activation> {
        match self.text(key) {
            None => Ok(default),
            Some(name) => Activation::from_hf_name(name)
                .ok_or_else(|| config(self.model, format!("{key} {name:?} is not supported"))),
        }
    }
}
