//! A GPT: token and learned position embeddings, pre-norm transformer blocks, a final
//! LayerNorm, and an output projection tied to the token embedding (one [`Parameter`] in two
//! places, whose gradient collects both uses). Generation samples with temperature and top-k
//! and keeps each block's keys and values, so a new token costs one step.

use arenagrad_graph::{DType, Graph, Parameter, Tensor};

use crate::error::{config, input_shape, Result};
use crate::functional as F;
use crate::layers::attention::{KvCache, TransformerBlock, TransformerConfig};
use crate::layers::basic::Dropout;
use crate::layers::linear::{Embedding, EmbeddingConfig};
use crate::layers::norm::{LayerNorm, LayerNormConfig};
use crate::module::{Module, Visitor};
use crate::optim::ParamGroup;
use crate::{HostTensor, Rng};

/// The shape of a [`Gpt`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// The longest sequence (positions with an embedding).
    pub context: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block.
    pub heads: usize,
    /// The model width.
    pub dim: usize,
    /// The MLP's hidden width over `dim`.
    pub mlp_ratio: usize,
    /// Dropout after the embeddings, on attention weights and after each residual branch.
    pub dropout: f64,
    /// The parameters' dtype.
    pub dtype: DType,
}

impl GptConfig {
    /// The character model of the `char_gpt` example: 256 byte tokens, context 128, 4 layers,
    /// 4 heads, width 128, MLP ×4, dropout 0.1, f32.
    pub fn char_default() -> Self {
        GptConfig {
            vocab: 256,
            context: 128,
            layers: 4,
            heads: 4,
            dim: 128,
            mlp_ratio: 4,
            dropout: 0.1,
            dtype: DType::F32,
        }
    }
}

/// A decoder-only transformer language model (see the module documentation). Parameter names:
/// `tok_emb.weight`, `pos_emb.weight`, `blocks.{i}.…` ([`TransformerBlock`]'s), `ln_f.weight`,
/// `ln_f.bias`. Initialised as GPT-2: weights `N(0, 0.02)`, the residual projections'
/// (`out_proj`, `linear2`) scaled by `1/√(2·layers)`, biases 0, norms 1.
///
/// ```
/// use arenagrad_nn::{Gpt, GptConfig, Graph, Rng};
/// let cfg = GptConfig { vocab: 10, context: 8, layers: 1, heads: 2, dim: 8, ..GptConfig::char_default() };
/// let mut rng = Rng::seed(0);
/// let model = Gpt::new(cfg, &mut rng)?;
/// let g = Graph::new();
/// let logits = model.forward_tokens(&g, &[1, 2, 3, 4, 5, 6], 2, 3)?;
/// assert_eq!(logits.shape().as_slice(), &[2, 3, 10]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct Gpt {
    cfg: GptConfig,
    tok_emb: Embedding,
    pos_emb: Embedding,
    blocks: Vec<TransformerBlock>,
    ln_f: LayerNorm,
    dropout: Dropout,
}

impl Gpt {
    /// A model of shape `cfg`, initialised from `rng`.
    pub fn new(cfg: GptConfig, rng: &mut Rng) -> Result<Self> {
        if cfg.vocab == 0 || cfg.context == 0 || cfg.layers == 0 {
            return Err(config("Gpt", "vocab, context and layers must be positive"));
        }
        let emb = EmbeddingConfig {
            dtype: cfg.dtype,
            ..EmbeddingConfig::default()
        };
        let block = TransformerConfig {
            heads: cfg.heads,
            mlp_ratio: cfg.mlp_ratio,
            dropout: cfg.dropout,
            causal: true,
            eps: 1e-5,
            dtype: cfg.dtype,
        };
        let model = Gpt {
            cfg,
            tok_emb: Embedding::with_config(cfg.vocab, cfg.dim, emb, rng)?,
            pos_emb: Embedding::with_config(cfg.context, cfg.dim, emb, rng)?,
            blocks: (0..cfg.layers)
                .map(|_| TransformerBlock::new(cfg.dim, block, rng))
                .collect::<Result<_>>()?,
            ln_f: LayerNorm::with_config(
                &[cfg.dim],
                LayerNormConfig {
                    dtype: cfg.dtype,
                    ..LayerNormConfig::default()
                },
            )?,
            dropout: Dropout::new(cfg.dropout)?,
        };
        let resid_std = 0.02 / (2.0 * cfg.layers as f64).sqrt();
        for (name, p) in model.named_parameters() {
            let shape = p.shape();
            let std = if name.ends_with("out_proj.weight") || name.ends_with("linear2.weight") {
                resid_std
            } else {
                0.02
            };
            let v: Vec<f64> = if shape.len() == 2 {
                (0..p.numel()).map(|_| rng.normal() * std).collect()
            } else if name.contains("norm") || name.starts_with("ln_f") {
                let fill = if name.ends_with("weight") { 1.0 } else { 0.0 };
                vec![fill; p.numel()]
            } else {
                vec![0.0; p.numel()]
            };
            p.set_value(HostTensor::from_f64(&v, &shape, cfg.dtype)?)?;
        }
        Ok(model)
    }

    /// The model's shape.
    pub fn config(&self) -> &GptConfig {
        &self.cfg
    }

    /// The token embedding, also the output projection's weight.
    pub fn token_embedding(&self) -> &Parameter {
        self.tok_emb.weight()
    }

    /// The two groups of the usual recipe: weight matrices of the blocks, decayed by
    /// `weight_decay`; embeddings, biases and norms, not decayed.
    pub fn param_groups(&self, weight_decay: f64) -> [ParamGroup; 2] {
        let (mut decay, mut rest) = (Vec::new(), Vec::new());
        for (name, p) in self.named_parameters() {
            if p.shape().len() == 2 && name.starts_with("blocks.") {
                decay.push(p);
            } else {
                rest.push(p);
            }
        }
        [
            ParamGroup::new(decay).weight_decay(weight_decay),
            ParamGroup::new(rest).weight_decay(0.0),
        ]
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

impl super::CausalLm for Gpt {
    fn context(&self) -> usize {
        self.cfg.context
    }

    fn new_caches<'g>(&self, g: &'g Graph, batch: usize) -> Result<Vec<KvCache<'g>>> {
        self.blocks
            .iter()
            .map(|b| b.self_attn().new_cache(g, batch, self.cfg.context))
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

impl super::Decoder for Gpt {
    type Block = TransformerBlock;
    const NAME: &'static str = "Gpt";
    fn embeddings(&self) -> (&Embedding, &Embedding) {
        (&self.tok_emb, &self.pos_emb)
    }
    fn embedding_dropout(&self) -> &Dropout {
        &self.dropout
    }
    fn blocks(&self) -> &[TransformerBlock] {
        &self.blocks
    }
    fn final_norm(&self) -> &LayerNorm {
        &self.ln_f
    }
}

impl super::CachedBlock for TransformerBlock {
    fn forward_cached<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        cache: &mut KvCache<'g>,
    ) -> Result<Tensor<'g>> {
        TransformerBlock::forward_cached(self, g, x, cache)
    }
}

impl Module for Gpt {
    /// `x`: token indices `[batch, len]` as floats; the logits `[batch, len, vocab]`.
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let s = x.try_shape()?;
        let [b, l] = s[..] else {
            return Err(input_shape("Gpt", "[batch, len] token indices", &s));
        };
        let tokens = F::tensor_to_indices("Gpt", x)?;
        self.forward_tokens(g, &tokens, b, l)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("tok_emb", &self.tok_emb);
        v.child("pos_emb", &self.pos_emb);
        for (i, b) in self.blocks.iter().enumerate() {
            v.child(&format!("blocks.{i}"), b);
        }
        v.child("ln_f", &self.ln_f);
    }

    fn set_training(&mut self, training: bool) {
        self.dropout.set_training(training);
        for b in &mut self.blocks {
            b.set_training(training);
        }
    }
}

/// How to pick the next token from logits: softmax at `temperature`, restricted to the `top_k`
/// most likely (all when `None`) and then to the smallest set of the most likely whose
/// probability reaches `top_p` (nucleus sampling; all when `None`), as `transformers`' logits
/// warpers apply them; a temperature of 0 takes the most likely (greedy).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Divides the logits (default 1; 0 is greedy).
    pub temperature: f64,
    /// Keeps only the `k` largest logits (default none).
    pub top_k: Option<usize>,
    /// Keeps only the most likely tokens whose probabilities sum to at least `p` (in `(0, 1]`;
    /// default none).
    pub top_p: Option<f64>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_k: None,
            top_p: None,
        }
    }
}

impl Sampling {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        Sampling {
            temperature: 0.0,
            ..Sampling::default()
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        let p_ok = self.top_p.is_none_or(|p| p > 0.0 && p <= 1.0);
        if !self.temperature.is_finite() || self.temperature < 0.0 || self.top_k == Some(0) || !p_ok
        {
            return Err(config(
                "Sampling",
                format!(
                    "temperature must be finite and ≥ 0, top_k ≥ 1, top_p in (0, 1]; got {}, \
                     {:?} and {:?}",
                    self.temperature, self.top_k, self.top_p
                ),
            ));
        }
        Ok(())
    }

    /// A token drawn from `logits` (one row) with `rng`.
    ///
    /// ```
    /// use arenagrad_nn::{Rng, Sampling};
    /// let mut rng = Rng::seed(0);
    /// let logits = [0.0, 5.0, 1.0, 4.9];
    /// assert_eq!(Sampling::greedy().sample(&logits, &mut rng), 1);
    /// let top2 = Sampling { top_k: Some(2), ..Sampling::default() };
    /// for _ in 0..100 {
    ///     let t = top2.sample(&logits, &mut rng);
    ///     assert!(t == 1 || t == 3);
    /// }
    /// // 5.0 alone has probability 0.51 of the four: a nucleus of 0.5 holds it only.
    /// let nucleus = Sampling { top_p: Some(0.5), ..Sampling::default() };
    /// for _ in 0..100 {
    ///     assert_eq!(nucleus.sample(&logits, &mut rng), 1);
    /// }
    /// ```
    pub fn sample(&self, logits: &[f64], rng: &mut Rng) -> usize {
        let best = |a: usize, b: usize| if logits[b] > logits[a] { b } else { a };
        if self.temperature == 0.0 || logits.len() <= 1 {
            return (0..logits.len()).fold(0, best);
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        if let Some(k) = self.top_k.filter(|&k| k < logits.len()) {
            order.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
            order.truncate(k);
        }
        let m = order
            .iter()
            .map(|&i| logits[i])
            .fold(f64::NEG_INFINITY, f64::max);
        let mut w: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i] - m) / self.temperature).exp())
            .collect();
        if let Some(p) = self.top_p.filter(|&p| p < 1.0) {
            // The most likely first (ties by index, a stable order), kept until their share
            // reaches p; at least one.
            let mut ranked: Vec<(usize, f64)> =
                order.iter().copied().zip(w.iter().copied()).collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let total: f64 = ranked.iter().map(|r| r.1).sum();
            let mut acc = 0.0;
            let keep = ranked
                .iter()
                .position(|r| {
                    acc += r.1;
                    acc >= p * total
                })
                .map_or(ranked.len(), |at| at + 1);
            ranked.truncate(keep);
            (order, w) = ranked.into_iter().unzip();
        }
        let total: f64 = w.iter().sum();
        if !(total.is_finite() && total > 0.0) {
            return (0..logits.len()).fold(0, best);
        }
        let mut u = rng.uniform() * total;
        for (&i, &wi) in order.iter().zip(&w) {
            if u < wi {
                return i;
            }
            u -= wi;
        }
        order[order.len() - 1]
    }
}
