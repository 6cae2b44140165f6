//! A BERT encoder as Hugging Face's `transformers` defines it (`BertModel`): word, position
//! and token-type embeddings summed and normalised, post-norm blocks (self-attention over all
//! positions but the padding, `x = norm(x + attention)`, `x = norm(x + mlp)`), and an optional
//! pooler (`tanh(dense(first token))`). Parameters carry `transformers`' names
//! (`embeddings.word_embeddings.weight`, `encoder.layer.0.attention.self.query.weight`, …), so
//! a directory `save_pretrained` wrote — a `BertModel`, or a task model's `bert.` part — loads
//! as it is ([`Bert::from_pretrained`]). Sentence embeddings as `sentence-transformers` makes
//! them from such an encoder (all-MiniLM-L6-v2, for one): the last hidden states averaged over
//! each sentence's tokens, then scaled to unit length ([`Bert::sentence_embeddings`]).
//!
//! ```
//! use arenagrad_nn::models::bert::{Bert, BertConfig, BertInput};
//! use arenagrad_nn::{Graph, Rng};
//! let cfg = BertConfig { vocab_size: 50, hidden_size: 8, num_hidden_layers: 2,
//!     num_attention_heads: 2, intermediate_size: 16, ..BertConfig::default() };
//! let model = Bert::new(cfg, &mut Rng::seed(0))?;
//! let g = Graph::new();
//! // Two sentences of 3 and 2 tokens, the second padded.
//! let mask = [true, true, true, true, true, false];
//! let input = BertInput::new(&[1, 2, 3, 4, 5, 0], 2, 3).attention_mask(&mask);
//! let hidden = model.encode(&g, &input)?;
//! assert_eq!(hidden.shape().as_slice(), &[2, 3, 8]);
//! let emb = model.sentence_embeddings(&g, &input)?;
//! assert_eq!(emb.shape().as_slice(), &[2, 8]);
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use arenagrad_graph::{AttentionOptions, DType, Graph, Tensor};

use super::hf::{normal_or_zeros, Activation};
use crate::error::{config, input_shape, Result};
use crate::functional as F;
use crate::init::Init;
use crate::layers::basic::Dropout;
use crate::layers::linear::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use crate::layers::norm::{LayerNorm, LayerNormConfig};
use crate::module::{Module, Visitor};
use crate::{HostTensor, Rng};

/// The shape and options of a [`Bert`], with `transformers`' `BertConfig` names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BertConfig {
    /// Tokens in the vocabulary (30522).
    pub vocab_size: usize,
    /// The model width (768).
    pub hidden_size: usize,
    /// Blocks (12).
    pub num_hidden_layers: usize,
    /// Attention heads per block (12).
    pub num_attention_heads: usize,
    /// The MLP's hidden width (3072).
    pub intermediate_size: usize,
    /// The MLP's activation (`gelu`, exact).
    pub hidden_act: Activation,
    /// The longest sequence (512).
    pub max_position_embeddings: usize,
    /// Segment types (2).
    pub type_vocab_size: usize,
    /// LayerNorm's ε (1e-12).
    pub layer_norm_eps: f64,
    /// Dropout after the embeddings and each block's two branches (0.1; training mode only).
    pub hidden_dropout_prob: f64,
    /// Dropout on the attention weights (0.1).
    pub attention_probs_dropout_prob: f64,
    /// The standard deviation of the initial weights (0.02).
    pub initializer_range: f64,
    /// Whether the model has the pooler (`pooler.dense`; true, as `BertModel`'s default).
    pub add_pooling_layer: bool,
    /// The parameters' dtype (f32).
    pub dtype: DType,
}

impl Default for BertConfig {
    /// BERT-base's shape.
    fn default() -> Self {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: Activation::Gelu,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            initializer_range: 0.02,
            add_pooling_layer: true,
            dtype: DType::F32,
        }
    }
}

impl BertConfig {
    /// The shape of all-MiniLM-L6-v2 (`sentence-transformers`' small sentence encoder): width
    /// 384, 6 blocks of 12 heads, MLP width 1536, BERT's vocabulary.
    pub fn mini_lm_l6() -> Self {
        BertConfig {
            hidden_size: 384,
            num_hidden_layers: 6,
            intermediate_size: 1536,
            ..BertConfig::default()
        }
    }

    /// The configuration `transformers` wrote to `config.json` (its text): the fields above
    /// where present (defaults otherwise; the pooler is assumed present — see
    /// [`Bert::from_pretrained`], which looks at the weights). Options this implementation does
    /// not have (relative position embeddings, a decoder's cross-attention) are refused
    /// rather than ignored.
    #[cfg(feature = "checkpoint")]
    pub fn from_json(text: &str) -> Result<Self> {
        Self::from_hf(&super::hf::HfJson::parse("BertConfig", text)?)
    }

    #[cfg(feature = "checkpoint")]
    fn from_hf(j: &super::hf::HfJson) -> Result<Self> {
        let d = BertConfig::default();
        j.refuse("is_decoder", true, false)?;
        j.refuse("add_cross_attention", true, false)?;
        if let Some(kind) = j.text("position_embedding_type") {
            if kind != "absolute" {
                return Err(config(
                    "BertConfig",
                    format!(
                        "position_embedding_type {kind:?} is not supported (only \"absolute\")"
                    ),
                ));
            }
        }
        let cfg = BertConfig {
            vocab_size: j.count("vocab_size", d.vocab_size)?,
            hidden_size: j.count("hidden_size", d.hidden_size)?,
            num_hidden_layers: j.count("num_hidden_layers", d.num_hidden_layers)?,
            num_attention_heads: j.count("num_attention_heads", d.num_attention_heads)?,
            intermediate_size: j.count("intermediate_size", d.intermediate_size)?,
            hidden_act: j.activation("hidden_act", d.hidden_act)?,
            max_position_embeddings: j
                .count("max_position_embeddings", d.max_position_embeddings)?,
            type_vocab_size: j.count("type_vocab_size", d.type_vocab_size)?,
            layer_norm_eps: j.real("layer_norm_eps", d.layer_norm_eps)?,
            hidden_dropout_prob: j.real("hidden_dropout_prob", d.hidden_dropout_prob)?,
            attention_probs_dropout_prob: j.real(
                "attention_probs_dropout_prob",
                d.attention_probs_dropout_prob,
            )?,
            initializer_range: j.real("initializer_range", d.initializer_range)?,
            add_pooling_layer: true,
            dtype: DType::F32,
        };
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        let sizes = [
            self.vocab_size,
            self.hidden_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.intermediate_size,
            self.max_position_embeddings,
            self.type_vocab_size,
        ];
        if sizes.contains(&0) {
            return Err(config("BertConfig", "every size must be positive"));
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(config(
                "BertConfig",
                format!(
                    "hidden_size {} must be a multiple of num_attention_heads {}",
                    self.hidden_size, self.num_attention_heads
                ),
            ));
        }
        for (name, p) in [
            ("hidden_dropout_prob", self.hidden_dropout_prob),
            (
                "attention_probs_dropout_prob",
                self.attention_probs_dropout_prob,
            ),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(config(
                    "BertConfig",
                    format!("{name} must be in [0, 1), got {p}"),
                ));
            }
        }
        if !(self.layer_norm_eps > 0.0 && self.initializer_range >= 0.0) {
            return Err(config(
                "BertConfig",
                "layer_norm_eps must be positive and initializer_range non-negative",
            ));
        }
        Ok(())
    }
}

/// What a [`Bert`] reads: `batch` sequences of `len` token ids (`[batch, len]`, row-major),
/// and optionally which positions are real tokens (`attention_mask`, false for padding: no
/// position attends to them; all real without one) and each token's segment
/// (`token_type_ids`; all 0 without).
#[derive(Debug, Clone, Copy)]
pub struct BertInput<'a> {
    /// Token ids, `[batch, len]`.
    pub ids: &'a [usize],
    /// Sequences.
    pub batch: usize,
    /// Positions per sequence (padding included).
    pub len: usize,
    /// Which positions are tokens (`[batch, len]`); `None`: all.
    pub mask: Option<&'a [bool]>,
    /// Segment ids (`[batch, len]`); `None`: all 0.
    pub token_types: Option<&'a [usize]>,
}

impl<'a> BertInput<'a> {
    /// `batch` sequences of `len` tokens, none of them padding, all of segment 0.
    pub fn new(ids: &'a [usize], batch: usize, len: usize) -> Self {
        BertInput {
            ids,
            batch,
            len,
            mask: None,
            token_types: None,
        }
    }

    /// With `mask` (`[batch, len]`, false for padding).
    pub fn attention_mask(mut self, mask: &'a [bool]) -> Self {
        self.mask = Some(mask);
        self
    }

    /// With segment ids `types` (`[batch, len]`).
    pub fn token_type_ids(mut self, types: &'a [usize]) -> Self {
        self.token_types = Some(types);
        self
    }

    /// Every list holds `batch · len` entries, each sequence at least one real token.
    fn check(&self) -> Result<()> {
        let n = self.batch * self.len;
        if self.batch == 0 || self.len == 0 || self.ids.len() != n {
            return Err(input_shape(
                "Bert",
                &format!("{n} token ids as [{}, {}]", self.batch, self.len),
                &[self.ids.len()],
            ));
        }
        for (what, got) in [
            ("attention_mask", self.mask.map(<[bool]>::len)),
            ("token_type_ids", self.token_types.map(<[usize]>::len)),
        ] {
            if let Some(got) = got.filter(|&m| m != n) {
                return Err(input_shape(
                    "Bert",
                    &format!("{what} of [{}, {}]", self.batch, self.len),
                    &[got],
                ));
            }
        }
        if let Some(m) = self.mask {
            if let Some(row) = m.chunks(self.len).position(|r| !r.contains(&true)) {
                return Err(config(
                    "Bert",
                    format!("sequence {row} has no token its attention mask lets through"),
                ));
            }
        }
        Ok(())
    }
}

/// The embeddings: word + position + token type, normalised, dropped out.
#[derive(Debug)]
struct BertEmbeddings {
    word_embeddings: Embedding,
    position_embeddings: Embedding,
    token_type_embeddings: Embedding,
    layer_norm: LayerNorm,
    drop: Dropout,
}

impl BertEmbeddings {
    fn embed<'g>(&self, g: &'g Graph, input: &BertInput<'_>) -> Result<Tensor<'g>> {
        let (b, l) = (input.batch, input.len);
        let words = self.word_embeddings.lookup(g, input.ids, &[b, l])?;
        let positions: Vec<usize> = (0..l).collect();
        let pos = self.position_embeddings.lookup(g, &positions, &[l])?;
        let types = match input.token_types {
            Some(t) => self.token_type_embeddings.lookup(g, t, &[b, l])?,
            None => self.token_type_embeddings.lookup(g, &[0], &[1])?,
        };
        let x = words.add(pos)?.add(types)?;
        self.drop.forward(g, self.layer_norm.forward(g, x)?)
    }
}

impl Module for BertEmbeddings {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("word_embeddings", &self.word_embeddings);
        v.child("position_embeddings", &self.position_embeddings);
        v.child("token_type_embeddings", &self.token_type_embeddings);
        v.child("LayerNorm", &self.layer_norm);
    }

    fn set_training(&mut self, training: bool) {
        self.drop.set_training(training);
    }
}

/// `attention.self`: the query, key and value projections.
#[derive(Debug)]
struct BertSelfAttention {
    query: Linear,
    key: Linear,
    value: Linear,
}

impl Module for BertSelfAttention {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("query", &self.query);
        v.child("key", &self.key);
        v.child("value", &self.value);
    }
}

/// A dense layer, dropout, and the norm of the residual sum (`attention.output` and
/// `output` in `transformers`' names).
#[derive(Debug)]
struct BertOutput {
    dense: Linear,
    layer_norm: LayerNorm,
    drop: Dropout,
}

impl BertOutput {
    /// `norm(residual + drop(dense(x)))`.
    fn run<'g>(&self, g: &'g Graph, x: Tensor<'g>, residual: Tensor<'g>) -> Result<Tensor<'g>> {
        let y = self.drop.forward(g, self.dense.forward(g, x)?)?;
        self.layer_norm.forward(g, residual.add(y)?)
    }
}

impl Module for BertOutput {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("dense", &self.dense);
        v.child("LayerNorm", &self.layer_norm);
    }

    fn set_training(&mut self, training: bool) {
        self.drop.set_training(training);
    }
}

/// `attention` (`self` and `output`).
#[derive(Debug)]
struct BertAttention {
    this: BertSelfAttention,
    output: BertOutput,
}

impl Module for BertAttention {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("self", &self.this);
        v.child("output", &self.output);
    }

    fn set_training(&mut self, training: bool) {
        self.output.set_training(training);
    }
}

/// The MLP's first layer (`intermediate.dense`) and its activation.
#[derive(Debug)]
struct BertIntermediate {
    dense: Linear,
    act: Activation,
}

impl Module for BertIntermediate {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        self.act.apply(self.dense.forward(g, x)?)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("dense", &self.dense);
    }
}

/// One block (`encoder.layer.{i}`).
#[derive(Debug)]
struct BertLayer {
    attention: BertAttention,
    intermediate: BertIntermediate,
    output: BertOutput,
    heads: usize,
    attn_pdrop: f64,
    training: bool,
}

impl BertLayer {
    /// The block over `x` (`[b, l, h]`); `mask` the additive key mask `[b, 1, 1, l]`.
    fn run<'g>(&self, g: &'g Graph, x: Tensor<'g>, mask: Option<Tensor<'g>>) -> Result<Tensor<'g>> {
        // The three projections as one product (their weights joined: one pass over `x`,
        // a wider output), and attention over the packed result.
        let sa = &self.attention.this;
        let joined = |p: [&crate::Parameter; 3]| -> Result<Tensor<'g>> {
            Ok(g.concat(&[g.param(p[0])?, g.param(p[1])?, g.param(p[2])?], 0)?)
        };
        let w = joined([sa.query.weight(), sa.key.weight(), sa.value.weight()])?;
        let b = match (sa.query.bias(), sa.key.bias(), sa.value.bias()) {
            (Some(q), Some(k), Some(v)) => Some(joined([q, k, v])?),
            _ => None,
        };
        let opts = AttentionOptions {
            mask,
            dropout_p: if self.training { self.attn_pdrop } else { 0.0 },
            ..Default::default()
        };
        let o = F::linear(x, w, b)?.attention_packed(self.heads, opts)?;
        let x = self.attention.output.run(g, o, x)?;
        let m = self.intermediate.forward(g, x)?;
        self.output.run(g, m, x)
    }
}

impl Module for BertLayer {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        self.run(g, x, None)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("attention", &self.attention);
        v.child("intermediate", &self.intermediate);
        v.child("output", &self.output);
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
        self.attention.set_training(training);
        self.output.set_training(training);
    }
}

/// `encoder` (its `layer.{i}`).
struct Encoder<'a>(&'a [BertLayer]);

impl Module for Encoder<'_> {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        for (i, l) in self.0.iter().enumerate() {
            v.child(&format!("layer.{i}"), l);
        }
    }
}

/// The BERT encoder (see the module documentation). Made in training mode by [`Bert::new`]
/// (as a PyTorch module is), in evaluation mode by [`Bert::from_pretrained`].
#[derive(Debug)]
pub struct Bert {
    cfg: BertConfig,
    embeddings: BertEmbeddings,
    layers: Vec<BertLayer>,
    /// `pooler.dense`, when the model has the pooler.
    pooler: Option<Linear>,
}

impl Bert {
    /// A model of shape `cfg`, initialised as `transformers` initialises BERT: weights
    /// `N(0, initializer_range)`, biases 0, norms 1 and 0.
    pub fn new(cfg: BertConfig, rng: &mut Rng) -> Result<Self> {
        Self::build(cfg, Some(rng))
    }

    fn build(cfg: BertConfig, rng: Option<&mut Rng>) -> Result<Self> {
        cfg.check()?;
        let init = normal_or_zeros(rng.is_some(), cfg.initializer_range);
        let mut zero_rng = Rng::seed(0);
        let rng = rng.unwrap_or(&mut zero_rng);
        let lin = LinearConfig {
            bias: true,
            dtype: cfg.dtype,
            weight_init: init,
            bias_init: Init::Zeros,
        };
        let emb = EmbeddingConfig {
            dtype: cfg.dtype,
            init,
        };
        let norm = LayerNormConfig {
            eps: cfg.layer_norm_eps,
            dtype: cfg.dtype,
            ..LayerNormConfig::default()
        };
        let (h, inner) = (cfg.hidden_size, cfg.intermediate_size);
        let output = |from: usize, rng: &mut Rng| -> Result<BertOutput> {
            Ok(BertOutput {
                dense: Linear::with_config(from, h, lin, rng)?,
                layer_norm: LayerNorm::with_config(&[h], norm)?,
                drop: Dropout::new(cfg.hidden_dropout_prob)?,
            })
        };
        let embeddings = BertEmbeddings {
            word_embeddings: Embedding::with_config(cfg.vocab_size, h, emb, rng)?,
            position_embeddings: Embedding::with_config(cfg.max_position_embeddings, h, emb, rng)?,
            token_type_embeddings: Embedding::with_config(cfg.type_vocab_size, h, emb, rng)?,
            layer_norm: LayerNorm::with_config(&[h], norm)?,
            drop: Dropout::new(cfg.hidden_dropout_prob)?,
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            layers.push(BertLayer {
                attention: BertAttention {
                    this: BertSelfAttention {
                        query: Linear::with_config(h, h, lin, rng)?,
                        key: Linear::with_config(h, h, lin, rng)?,
                        value: Linear::with_config(h, h, lin, rng)?,
                    },
                    output: output(h, rng)?,
                },
                intermediate: BertIntermediate {
                    dense: Linear::with_config(h, inner, lin, rng)?,
                    act: cfg.hidden_act,
                },
                output: output(inner, rng)?,
                heads: cfg.num_attention_heads,
                attn_pdrop: cfg.attention_probs_dropout_prob,
                training: true,
            });
        }
        let pooler = if cfg.add_pooling_layer {
            Some(Linear::with_config(h, h, lin, rng)?)
        } else {
            None
        };
        Ok(Bert {
            cfg,
            embeddings,
            layers,
            pooler,
        })
    }

    /// The model `save_pretrained` wrote to `dir` (`config.json`, and `model.safetensors` or
    /// its shards), in evaluation mode. The weights load by their own names, strictly: those of
    /// a `BertModel`, or the `bert.` part of a task model's checkpoint (its heads — `cls.*`,
    /// `classifier.*`, `qa_outputs.*` — left out), with the pooler when the checkpoint has
    /// one (the model then has it) and older checkpoints' `gamma`/`beta` norm names and
    /// `position_ids` buffer understood; any other missing, unexpected or mis-shaped name is
    /// an error listing them all, and nothing is loaded then.
    #[cfg(feature = "checkpoint")]
    pub fn from_pretrained(dir: impl AsRef<std::path::Path>) -> Result<Self> {
        Self::from_pretrained_as(dir, DType::F32)
    }

    /// [`Bert::from_pretrained`] with parameters of `dtype` (f32, f64, bf16 or f16): the
    /// checkpoint's values are converted as they load (rounded to nearest even where the dtype
    /// is narrower), and the model runs in that dtype, as `BertModel.from_pretrained(dir,
    /// dtype=...)` does.
    #[cfg(feature = "checkpoint")]
    pub fn from_pretrained_as(dir: impl AsRef<std::path::Path>, dtype: DType) -> Result<Self> {
        let dir = dir.as_ref();
        let mut cfg = BertConfig::from_hf(&super::hf::HfJson::read("BertConfig", dir)?)?;
        cfg.dtype = super::hf::parameter_dtype("Bert::from_pretrained_as", dtype)?;
        let tensors = Self::hf_names().read(dir)?;
        cfg.add_pooling_layer = tensors.iter().any(|(n, _)| n.starts_with("pooler."));
        let mut model = Bert::build(cfg, None)?;
        crate::checkpoint::load_state_dict(&model, tensors, true, dir)?;
        model.set_training(false);
        Ok(model)
    }

    /// Loads the weights of a `transformers` BERT checkpoint (a file, a shard index or a
    /// directory; see [`Bert::from_pretrained`] for the names) into this model, strictly.
    #[cfg(feature = "checkpoint")]
    pub fn load_hf(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        let tensors = Self::hf_names().read(path)?;
        crate::checkpoint::load_state_dict(self, tensors, true, path).map(|_| ())
    }

    /// `transformers`' names (old and new, a base model's or a task model's) as this model's.
    #[cfg(feature = "checkpoint")]
    fn hf_names() -> crate::checkpoint::KeyMap {
        crate::checkpoint::KeyMap::new()
            .drop("cls.*")
            .drop("classifier.*")
            .drop("qa_outputs.*")
            .drop("*position_ids")
            .strip_prefix("bert.")
            .rename("LayerNorm.gamma", "LayerNorm.weight")
            .rename("LayerNorm.beta", "LayerNorm.bias")
    }

    /// The parameters by `transformers`' names: what `BertModel.load_state_dict(...,
    /// strict=True)` takes (with `add_pooling_layer` as this model has the pooler).
    pub fn hf_state_dict(&self) -> Vec<(String, HostTensor)> {
        self.named_state()
            .into_iter()
            .map(|(n, p, _)| (n, p.value()))
            .collect()
    }

    /// The model's configuration.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// The last hidden states `[batch, len, hidden]` (`last_hidden_state`).
    pub fn encode<'g>(&self, g: &'g Graph, input: &BertInput<'_>) -> Result<Tensor<'g>> {
        input.check()?;
        if input.len > self.cfg.max_position_embeddings {
            return Err(config(
                "Bert",
                format!(
                    "{} positions exceed max_position_embeddings {}",
                    input.len, self.cfg.max_position_embeddings
                ),
            ));
        }
        if let Some(&t) = input
            .token_types
            .and_then(|t| t.iter().find(|&&t| t >= self.cfg.type_vocab_size))
        {
            return Err(config(
                "Bert",
                format!(
                    "token type {t} is not below type_vocab_size {}",
                    self.cfg.type_vocab_size
                ),
            ));
        }
        let dtype = self.embeddings.word_embeddings.weight().dtype();
        let mask = match input.mask {
            Some(m) if m.contains(&false) => {
                let add: Vec<f32> = m
                    .iter()
                    .map(|&keep| if keep { 0.0 } else { f32::NEG_INFINITY })
                    .collect();
                let t = g.from_slice(&add, &[input.batch, 1, 1, input.len])?;
                Some(if dtype == DType::F32 {
                    t
                } else {
                    t.to_dtype(dtype)?
                })
            }
            _ => None,
        };
        let mut x = self.embeddings.embed(g, input)?;
        for l in &self.layers {
            x = l.run(g, x, mask)?;
        }
        Ok(x)
    }

    /// The pooler's output `[batch, hidden]` (`pooler_output`: `tanh(dense(first token))`)
    /// from hidden states `[batch, len, hidden]`. An error for a model without the pooler.
    pub fn pool<'g>(&self, g: &'g Graph, hidden: Tensor<'g>) -> Result<Tensor<'g>> {
        let Some(dense) = &self.pooler else {
            return Err(config("Bert", "this model has no pooler (pooler.dense)"));
        };
        let s = hidden.try_shape()?;
        if s.len() != 3 || s[1] == 0 {
            return Err(input_shape("Bert::pool", "[batch, len ≥ 1, hidden]", &s));
        }
        let first = hidden
            .slice(1, 0, 1)?
            .reshape(&[s[0] as isize, s[2] as isize])?;
        Ok(dense.forward(g, first)?.tanh()?)
    }

    /// Sentence embeddings `[batch, hidden]`: the last hidden states averaged over each
    /// sequence's real tokens ([`mean_pool`]) and scaled to unit length, as
    /// `sentence-transformers` pools and normalises (all-MiniLM-L6-v2's pipeline).
    pub fn sentence_embeddings<'g>(
        &self,
        g: &'g Graph,
        input: &BertInput<'_>,
    ) -> Result<Tensor<'g>> {
        let hidden = self.encode(g, input)?;
        l2_normalize(mean_pool(g, hidden, input.mask)?)
    }
}

/// The mean of `hidden` (`[batch, len, width]`) over the positions `mask` (`[batch, len]`)
/// lets through (all without one): `[batch, width]`, as `sentence-transformers`' mean
/// pooling (the count clamped to at least 1e-9).
pub fn mean_pool<'g>(
    g: &'g Graph,
    hidden: Tensor<'g>,
    mask: Option<&[bool]>,
) -> Result<Tensor<'g>> {
    let s = hidden.try_shape()?;
    let [b, l, _] = s[..] else {
        return Err(input_shape("mean_pool", "[batch, len, width]", &s));
    };
    let Some(mask) = mask else {
        return Ok(hidden.mean_axes(&[1], false)?);
    };
    if mask.len() != b * l {
        return Err(input_shape(
            "mean_pool",
            &format!("a mask of [{b}, {l}]"),
            &[mask.len()],
        ));
    }
    let m: Vec<f32> = mask.iter().map(|&k| f32::from(u8::from(k))).collect();
    let m = g.from_slice(&m, &[b, l, 1])?.to_dtype(hidden.dtype())?;
    let sum = hidden.mul(m)?.sum_axes(&[1], false)?;
    let count = m.sum_axes(&[1], false)?.clamp(Some(1e-9), None)?;
    Ok(sum.div(count)?)
}

/// `x / max(‖x‖₂, 1e-12)` along the last axis (`torch.nn.functional.normalize`).
pub fn l2_normalize(x: Tensor<'_>) -> Result<Tensor<'_>> {
    let n = x.norm(2.0, &[-1], true)?.clamp(Some(1e-12), None)?;
    Ok(x.div(n)?)
}

impl Module for Bert {
    /// `x`: token ids `[batch, len]` as floats, no padding, segment 0; the last hidden states.
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let s = x.try_shape()?;
        let [b, l] = s[..] else {
            return Err(input_shape("Bert", "[batch, len] token ids", &s));
        };
        let ids = F::tensor_to_indices("Bert", x)?;
        self.encode(g, &BertInput::new(&ids, b, l))
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("embeddings", &self.embeddings);
        v.child("encoder", &Encoder(&self.layers));
        if let Some(p) = &self.pooler {
            v.child("pooler.dense", p);
        }
    }

    fn set_training(&mut self, training: bool) {
        self.embeddings.set_training(training);
        for l in &mut self.layers {
            l.set_training(training);
        }
    }
}
