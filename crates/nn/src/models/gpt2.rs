//! GPT-2 as Hugging Face's `transformers` defines it (`GPT2LMHeadModel`): token and learned
//! position embeddings, pre-norm blocks (`ln_1`, attention through one fused `c_attn`
//! projection and `c_proj`; `ln_2`, an MLP `c_fc` → activation → `c_proj`), a final `ln_f`, and
//! an output layer tied to the token embedding. Its parameters carry `transformers`' own names
//! (`transformer.h.0.attn.c_attn.weight`, …) and layout (the projections' weights stored
//! `[in, out]`, as its `Conv1D` stores them, through [`Linear::in_out`]), so a directory that
//! `save_pretrained` wrote loads as it is ([`Gpt2::from_pretrained`]) and
//! [`Gpt2::hf_state_dict`] is what PyTorch's `load_state_dict(strict=True)` takes back.
//!
//! ```
//! use arenagrad_nn::models::gpt2::{Gpt2, Gpt2Config};
//! use arenagrad_nn::{Graph, Rng};
//! let cfg = Gpt2Config { vocab_size: 50, n_positions: 16, n_embd: 8, n_layer: 2, n_head: 2, ..Gpt2Config::default() };
//! let model = Gpt2::new(cfg, &mut Rng::seed(0))?;
//! let g = Graph::new();
//! let logits = model.forward_tokens(&g, &[1, 2, 3, 4, 5, 6], 2, 3)?;
//! assert_eq!(logits.shape().as_slice(), &[2, 3, 50]);
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use arenagrad_graph::{AttentionOptions, DType, Graph, Tensor};

use super::hf::Activation;
use crate::error::{config, input_shape, Result};
use crate::functional as F;
use crate::init::Init;
use crate::layers::attention::KvCache;
use crate::layers::basic::Dropout;
use crate::layers::linear::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use crate::layers::norm::{LayerNorm, LayerNormConfig};
use crate::module::{Module, Visitor};
use crate::{HostTensor, Rng};

/// The MLP's activation (by `transformers`' names): the models' shared [`Activation`].
pub type Gpt2Activation = Activation;

/// The shape and options of a [`Gpt2`], with `transformers`' `GPT2Config` names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpt2Config {
    /// Tokens in the vocabulary (50257 for GPT-2's tokenizer).
    pub vocab_size: usize,
    /// Positions with an embedding: the longest sequence (1024).
    pub n_positions: usize,
    /// The model width (768).
    pub n_embd: usize,
    /// Blocks (12).
    pub n_layer: usize,
    /// Attention heads per block (12).
    pub n_head: usize,
    /// The MLP's hidden width (`None`: 4 × `n_embd`).
    pub n_inner: Option<usize>,
    /// The MLP's activation (`gelu_new`).
    pub activation: Gpt2Activation,
    /// LayerNorm's ε (1e-5).
    pub layer_norm_epsilon: f64,
    /// Dropout after each residual branch (0.1; active in training mode only).
    pub resid_pdrop: f64,
    /// Dropout after the embeddings (0.1).
    pub embd_pdrop: f64,
    /// Dropout on the attention weights (0.1).
    pub attn_pdrop: f64,
    /// The standard deviation of the initial weights (0.02).
    pub initializer_range: f64,
    /// The parameters' dtype (f32).
    pub dtype: DType,
}

impl Default for Gpt2Config {
    /// The 124M-parameter GPT-2.
    fn default() -> Self {
        Gpt2Config {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            n_inner: None,
            activation: Gpt2Activation::GeluTanh,
            layer_norm_epsilon: 1e-5,
            resid_pdrop: 0.1,
            embd_pdrop: 0.1,
            attn_pdrop: 0.1,
            initializer_range: 0.02,
            dtype: DType::F32,
        }
    }
}

impl Gpt2Config {
    /// The configuration `transformers` wrote to `config.json` (its text): the fields above
    /// where present (defaults otherwise). Options this implementation does not have
    /// (cross-attention, per-layer attention scaling, unscaled attention, attention upcast
    /// and reordering, untied output embeddings) are refused rather than ignored.
    #[cfg(feature = "checkpoint")]
    pub fn from_json(text: &str) -> Result<Self> {
        Self::from_hf(&super::hf::HfJson::parse("Gpt2Config", text)?)
    }

    #[cfg(feature = "checkpoint")]
    pub(crate) fn from_hf(j: &super::hf::HfJson) -> Result<Self> {
        let d = Gpt2Config::default();
        j.refuse("add_cross_attention", true, false)?;
        j.refuse("scale_attn_by_inverse_layer_idx", true, false)?;
        j.refuse("reorder_and_upcast_attn", true, false)?;
        j.refuse("scale_attn_weights", false, true)?;
        j.refuse("tie_word_embeddings", false, true)?;
        let activation = j.activation("activation_function", d.activation)?;
        let inner = j.count("n_inner", 0)?;
        let cfg = Gpt2Config {
            vocab_size: j.count("vocab_size", d.vocab_size)?,
            n_positions: j.count("n_positions", d.n_positions)?,
            n_embd: j.count("n_embd", d.n_embd)?,
            n_layer: j.count("n_layer", d.n_layer)?,
            n_head: j.count("n_head", d.n_head)?,
            n_inner: (inner > 0).then_some(inner),
            activation,
            layer_norm_epsilon: j.real("layer_norm_epsilon", d.layer_norm_epsilon)?,
            resid_pdrop: j.real("resid_pdrop", d.resid_pdrop)?,
            embd_pdrop: j.real("embd_pdrop", d.embd_pdrop)?,
            attn_pdrop: j.real("attn_pdrop", d.attn_pdrop)?,
            initializer_range: j.real("initializer_range", d.initializer_range)?,
            dtype: DType::F32,
        };
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        if self.vocab_size == 0 || self.n_positions == 0 || self.n_layer == 0 {
            return Err(config(
                "Gpt2Config",
                "vocab_size, n_positions and n_layer must be positive",
            ));
        }
        if self.n_head == 0 || self.n_embd == 0 || !self.n_embd.is_multiple_of(self.n_head) {
            return Err(config(
                "Gpt2Config",
                format!(
                    "n_embd {} must be a positive multiple of n_head {}",
                    self.n_embd, self.n_head
                ),
            ));
        }
        for (name, p) in [
            ("resid_pdrop", self.resid_pdrop),
            ("embd_pdrop", self.embd_pdrop),
            ("attn_pdrop", self.attn_pdrop),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(config(
                    "Gpt2Config",
                    format!("{name} must be in [0, 1), got {p}"),
                ));
            }
        }
        if !(self.layer_norm_epsilon > 0.0 && self.initializer_range >= 0.0) {
            return Err(config(
                "Gpt2Config",
                "layer_norm_epsilon must be positive and initializer_range non-negative",
            ));
        }
        Ok(())
    }
}

/// One block's attention: the fused projection `c_attn` (`[n_embd, 3·n_embd]`), causal
/// attention over its packed output, the output projection `c_proj`.
#[derive(Debug)]
struct Gpt2Attention {
    c_attn: Linear,
    c_proj: Linear,
    heads: usize,
    pdrop: f64,
    training: bool,
}

impl Module for Gpt2Attention {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let opts = AttentionOptions {
            causal: true,
            dropout_p: if self.training { self.pdrop } else { 0.0 },
            ..Default::default()
        };
        let o = self
            .c_attn
            .forward(g, x)?
            .attention_packed(self.heads, opts)?;
        self.c_proj.forward(g, o)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("c_attn", &self.c_attn);
        v.child("c_proj", &self.c_proj);
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// One block's MLP: `c_fc`, the activation, `c_proj`.
#[derive(Debug)]
struct Gpt2Mlp {
    c_fc: Linear,
    c_proj: Linear,
    act: Gpt2Activation,
}

impl Module for Gpt2Mlp {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let h = self.act.apply(self.c_fc.forward(g, x)?)?;
        self.c_proj.forward(g, h)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("c_fc", &self.c_fc);
        v.child("c_proj", &self.c_proj);
    }
}

/// `x + drop(attn(ln_1(x)))`, then `x + drop(mlp(ln_2(x)))`.
#[derive(Debug)]
pub(crate) struct Gpt2Block {
    ln_1: LayerNorm,
    attn: Gpt2Attention,
    ln_2: LayerNorm,
    mlp: Gpt2Mlp,
    drop: Dropout,
}

impl super::CachedBlock for Gpt2Block {
    /// The block over positions after those in `cache` (without dropout).
    fn forward_cached<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        cache: &mut KvCache<'g>,
    ) -> Result<Tensor<'g>> {
        let qkv = self
            .attn
            .c_attn
            .forward(g, self.ln_1.forward_for_product(g, x)?)?;
        let a = self
            .attn
            .c_proj
            .forward(g, cache.attend(qkv, self.attn.heads, true)?)?;
        let x = x.add(a)?;
        Ok(x.add(self.mlp.forward(g, self.ln_2.forward_for_product(g, x)?)?)?)
    }
}

impl Module for Gpt2Block {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let a = self.attn.forward(g, self.ln_1.forward_for_product(g, x)?)?;
        let x = x.add(self.drop.forward(g, a)?)?;
        let m = self.mlp.forward(g, self.ln_2.forward_for_product(g, x)?)?;
        Ok(x.add(self.drop.forward(g, m)?)?)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("ln_1", &self.ln_1);
        v.child("attn", &self.attn);
        v.child("ln_2", &self.ln_2);
        v.child("mlp", &self.mlp);
    }

    fn set_training(&mut self, training: bool) {
        self.attn.set_training(training);
        self.drop.set_training(training);
    }
}

/// GPT-2 with its language-model head (see the module documentation). Made in training mode
/// by [`Gpt2::new`] (as a PyTorch module is), in evaluation mode by [`Gpt2::from_pretrained`]
/// (as `from_pretrained` returns it).
#[derive(Debug)]
pub struct Gpt2 {
    cfg: Gpt2Config,
    wte: Embedding,
    wpe: Embedding,
    h: Vec<Gpt2Block>,
    ln_f: LayerNorm,
    drop: Dropout,
}

/// The `transformer.` part of the names (`GPT2Model` inside `GPT2LMHeadModel`).
struct Body<'a>(&'a Gpt2);

impl Module for Body<'_> {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        let m = self.0;
        v.child("wte", &m.wte);
        v.child("wpe", &m.wpe);
        for (i, b) in m.h.iter().enumerate() {
            v.child(&format!("h.{i}"), b);
        }
        v.child("ln_f", &m.ln_f);
    }
}

impl Gpt2 {
    /// A model of shape `cfg`, initialised as `transformers` initialises GPT-2: weights
    /// `N(0, initializer_range)`, the residual projections' (`c_proj`) divided by
    /// `√(2·n_layer)`, biases 0, norms 1 and 0.
    pub fn new(cfg: Gpt2Config, rng: &mut Rng) -> Result<Self> {
        Self::build(cfg, Some(rng))
    }

    /// A model of shape `cfg`: initialised as [`Gpt2::new`] from `rng`, or (without one) with
    /// zeros for weights a checkpoint is about to fill (no random draws to pay for).
    fn build(cfg: Gpt2Config, rng: Option<&mut Rng>) -> Result<Self> {
        cfg.check()?;
        let random = rng.is_some();
        let mut zero_rng = Rng::seed(0);
        let rng = rng.unwrap_or(&mut zero_rng);
        let std = cfg.initializer_range;
        let normal = |std: f64| super::hf::normal_or_zeros(random, std);
        let emb = EmbeddingConfig {
            dtype: cfg.dtype,
            init: normal(std),
        };
        let proj = |std: f64| LinearConfig {
            bias: true,
            dtype: cfg.dtype,
            weight_init: normal(std),
            bias_init: Init::Zeros,
        };
        let resid = std / (2.0 * cfg.n_layer as f64).sqrt();
        let norm = LayerNormConfig {
            eps: cfg.layer_norm_epsilon,
            dtype: cfg.dtype,
            ..LayerNormConfig::default()
        };
        let (d, inner) = (cfg.n_embd, cfg.n_inner.unwrap_or(4 * cfg.n_embd));
        let mut h = Vec::with_capacity(cfg.n_layer);
        for _ in 0..cfg.n_layer {
            h.push(Gpt2Block {
                ln_1: LayerNorm::with_config(&[d], norm)?,
                attn: Gpt2Attention {
                    c_attn: Linear::in_out(d, 3 * d, proj(std), rng)?,
                    c_proj: Linear::in_out(d, d, proj(resid), rng)?,
                    heads: cfg.n_head,
                    pdrop: cfg.attn_pdrop,
                    training: true,
                },
                ln_2: LayerNorm::with_config(&[d], norm)?,
                mlp: Gpt2Mlp {
                    c_fc: Linear::in_out(d, inner, proj(std), rng)?,
                    c_proj: Linear::in_out(inner, d, proj(resid), rng)?,
                    act: cfg.activation,
                },
                drop: Dropout::new(cfg.resid_pdrop)?,
            });
        }
        Ok(Gpt2 {
            cfg,
            wte: Embedding::with_config(cfg.vocab_size, d, emb, rng)?,
            wpe: Embedding::with_config(cfg.n_positions, d, emb, rng)?,
            h,
            ln_f: LayerNorm::with_config(&[d], norm)?,
            drop: Dropout::new(cfg.embd_pdrop)?,
        })
    }

    /// The model `save_pretrained` wrote to `dir` (`config.json`, and `model.safetensors` or
    /// its shards with `model.safetensors.index.json`), in evaluation mode. The weights load
    /// by their own names: with or without the `transformer.` prefix (older checkpoints lack
    /// it), the tied `lm_head.weight` and the attention-mask buffers of older checkpoints
    /// (`attn.bias`, `attn.masked_bias`) left out; any other missing, unexpected or mis-shaped
    /// name is an error listing them all, and nothing is loaded then.
    #[cfg(feature = "checkpoint")]
    pub fn from_pretrained(dir: impl AsRef<std::path::Path>) -> Result<Self> {
        Self::from_pretrained_as(dir, DType::F32)
    }

    /// [`Gpt2::from_pretrained`] with parameters of `dtype` (f32, f64, bf16 or f16): the
    /// checkpoint's values are converted as they load (rounded to nearest even where the
    /// dtype is narrower), and the model runs in that dtype — bf16 halves the bytes a token
    /// reads in generation, where each token reads every weight.
    #[cfg(feature = "checkpoint")]
    pub fn from_pretrained_as(dir: impl AsRef<std::path::Path>, dtype: DType) -> Result<Self> {
        let dir = dir.as_ref();
        let mut cfg = Gpt2Config::from_hf(&super::hf::HfJson::read("Gpt2Config", dir)?)?;
        cfg.dtype = super::hf::parameter_dtype("Gpt2::from_pretrained_as", dtype)?;
        let mut model = Gpt2::build(cfg, None)?;
        model.load_hf(dir)?;
        model.set_training(false);
        Ok(model)
    }

    /// Loads the weights of a `transformers` GPT-2 checkpoint (a file, a shard index or a
    /// directory; see [`Gpt2::from_pretrained`] for the names) into this model, strictly.
    #[cfg(feature = "checkpoint")]
    pub fn load_hf(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        use crate::checkpoint::{self, KeyMap};
        let path = path.as_ref();
        let map = KeyMap::new()
            .drop("lm_head.weight")
            .drop("*.attn.bias")
            .drop("*.attn.masked_bias")
            .add_prefix("transformer.");
        let tensors = map.read(path)?;
        checkpoint::load_state_dict(self, tensors, true, path).map(|_| ())
    }

    /// The parameters by `transformers`' names, the tied `lm_head.weight` included: what
    /// `GPT2LMHeadModel.load_state_dict(..., strict=True)` takes.
    pub fn hf_state_dict(&self) -> Vec<(String, HostTensor)> {
        let mut s: Vec<(String, HostTensor)> = self
            .named_state()
            .into_iter()
            .map(|(n, p, _)| (n, p.value()))
            .collect();
        s.push(("lm_head.weight".into(), self.wte.weight().value()));
        s
    }

    /// The model's configuration.
    pub fn config(&self) -> &Gpt2Config {
        &self.cfg
    }

    /// Logits `[batch, len, vocab]` for `tokens` (`[batch, len]`, row-major).
    pub fn forward_tokens<'g>(
        &self,
        g: &'g Graph,
        tokens: &[usize],
        batch: usize,
        len: usize,
    ) -> Result<Tensor<'g>> {
        super::decode(self, g, tokens, (batch, len))
    }

    /// The mean cross-entropy of predicting `targets` from `tokens` (both `[batch, len]`).
    pub fn loss<'g>(
        &self,
        g: &'g Graph,
        tokens: &[usize],
        targets: &[usize],
        batch: usize,
        len: usize,
    ) -> Result<Tensor<'g>> {
        super::next_token_loss(self.forward_tokens(g, tokens, batch, len)?, targets)
    }
}

impl super::CausalLm for Gpt2 {
    fn context(&self) -> usize {
        self.cfg.n_positions
    }

    fn new_caches<'g>(&self, g: &'g Graph, batch: usize) -> Result<Vec<KvCache<'g>>> {
        let (h, d) = (self.cfg.n_head, self.cfg.n_embd);
        let dtype = self.wte.weight().dtype();
        (0..self.cfg.n_layer)
            .map(|_| KvCache::new(g, [batch, h, self.cfg.n_positions, d / h], dtype))
            .collect()
    }

    fn forward_cached<'g>(
        &self,
        g: &'g Graph,
        tokens: &[usize],
        batch: usize,
        caches: &mut [KvCache<'g>],
    ) -> Result<Tensor<'g>> {
        super::decode_cached(self, g, tokens, batch, caches)
    }
}

impl super::Decoder for Gpt2 {
    type Block = Gpt2Block;
    const NAME: &'static str = "Gpt2";
    fn embeddings(&self) -> (&Embedding, &Embedding) {
        (&self.wte, &self.wpe)
    }
    fn embedding_dropout(&self) -> &Dropout {
        &self.drop
    }
    fn blocks(&self) -> &[Gpt2Block] {
        &self.h
    }
    fn final_norm(&self) -> &LayerNorm {
        &self.ln_f
    }
}

impl Module for Gpt2 {
    /// `x`: token indices `[batch, len]` as floats; the logits `[batch, len, vocab]`.
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let s = x.try_shape()?;
        let [b, l] = s[..] else {
            return Err(input_shape("Gpt2", "[batch, len] token indices", &s));
        };
        let tokens = F::tensor_to_indices("Gpt2", x)?;
        self.forward_tokens(g, &tokens, b, l)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("transformer", &Body(self));
    }

    fn set_training(&mut self, training: bool) {
        self.drop.set_training(training);
        for b in &mut self.h {
            b.set_training(training);
        }
    }
}
