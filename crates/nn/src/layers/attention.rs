//! Self-attention and the pre-norm transformer block, with PyTorch's parameter names
//! (`nn.MultiheadAttention`, `nn.TransformerEncoderLayer(norm_first=True, batch_first=True)`),
//! so that a PyTorch state dict loads by name.

use arenagrad_graph::{AttentionOptions, DType, Graph, Tensor};

use crate::error::{config, input_shape, Result};
use crate::init::Init;
use crate::layers::basic::Dropout;
use crate::layers::linear::{Linear, LinearConfig};
use crate::layers::norm::{LayerNorm, LayerNormConfig};
use crate::module::{Module, Visitor};
use crate::Rng;

/// Multi-head self-attention over `[batch, len, dim]`: one fused projection to queries, keys
/// and values (`in_proj_weight` `[3·dim, dim]`, `in_proj_bias`), `heads` heads of
/// `dim/heads` through [`Tensor::attention_packed`] (causal when asked), and the
/// output projection `out_proj`. Attention weights are dropped with probability `dropout` in
/// training mode. Initialised as PyTorch's: Xavier-uniform `in_proj_weight`, zero biases.
///
/// ```
/// use arenagrad_nn::{DType, Graph, Module, MultiheadAttention, Rng};
/// let mut rng = Rng::seed(0);
/// let attn = MultiheadAttention::new(16, 4, true, &mut rng)?;
/// let g = Graph::new();
/// let y = attn.forward(&g, g.randn(&[2, 5, 16], DType::F32)?)?;
/// assert_eq!(y.shape().as_slice(), &[2, 5, 16]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct MultiheadAttention {
    in_proj: Linear,
    out_proj: Linear,
    heads: usize,
    causal: bool,
    dropout: f64,
    training: bool,
}

impl MultiheadAttention {
    /// `heads` heads over width `dim` (a multiple of `heads`), f32, no dropout.
    pub fn new(dim: usize, heads: usize, causal: bool, rng: &mut Rng) -> Result<Self> {
        Self::with_options(dim, heads, causal, 0.0, DType::F32, rng)
    }

    /// With attention dropout `dropout` (in `[0, 1)`) and the parameters' dtype.
    pub fn with_options(
        dim: usize,
        heads: usize,
        causal: bool,
        dropout: f64,
        dtype: DType,
        rng: &mut Rng,
    ) -> Result<Self> {
        if heads == 0 || dim == 0 || !dim.is_multiple_of(heads) {
            return Err(config(
                "MultiheadAttention",
                format!("dim {dim} must be a positive multiple of heads {heads}"),
            ));
        }
        if !(0.0..1.0).contains(&dropout) {
            return Err(config(
                "MultiheadAttention",
                format!("dropout must be in [0, 1), got {dropout}"),
            ));
        }
        let in_cfg = LinearConfig {
            bias: true,
            dtype,
            weight_init: Init::XavierUniform { gain: 1.0 },
            bias_init: Init::Zeros,
        };
        let out_cfg = LinearConfig {
            bias_init: Init::Zeros,
            dtype,
            ..LinearConfig::default()
        };
        Ok(MultiheadAttention {
            in_proj: Linear::with_config(dim, 3 * dim, in_cfg, rng)?,
            out_proj: Linear::with_config(dim, dim, out_cfg, rng)?,
            heads,
            causal,
            dropout,
            training: true,
        })
    }

    /// The number of heads.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// The fused query/key/value projection (`[3·dim, dim]`, PyTorch's `in_proj_weight`).
    pub fn in_proj(&self) -> &Linear {
        &self.in_proj
    }

    /// The output projection.
    pub fn out_proj(&self) -> &Linear {
        &self.out_proj
    }
}

/// The keys and values a [`MultiheadAttention`] has seen, for generation: each step attends
/// over them and appends its own, so a new token costs one step, not a re-run over the whole
/// prefix. The buffers (`[batch, heads, max_len, head_dim]`) belong to the iteration they were
/// made in and are written in place ([`Tensor::slice_write`]), so the steps can run in nested
/// [`Graph::scope`]s and leave nothing behind.
#[derive(Debug)]
pub struct KvCache<'g> {
    k: Tensor<'g>,
    v: Tensor<'g>,
    len: usize,
}

impl<'g> KvCache<'g> {
    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most positions it holds.
    pub fn capacity(&self) -> usize {
        self.k.shape()[2]
    }

    /// Forgets what it holds (the buffers stay).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl MultiheadAttention {
    /// An empty cache for `batch` sequences of up to `max_len` positions, on `g` (make it
    /// outside the scopes of the steps that fill it).
    pub fn new_cache<'g>(&self, g: &'g Graph, batch: usize, max_len: usize) -> Result<KvCache<'g>> {
        let dim = self.out_proj.out_features();
        let dtype = self.in_proj.weight().dtype();
        KvCache::new(g, [batch, self.heads, max_len, dim / self.heads], dtype)
    }

    /// Self-attention of `x` (`[batch, new, dim]`, the positions after those in `cache`) over
    /// the cached positions and its own (causally among its own), appending its keys and values
    /// to the cache. The same output as [`Module::forward`] over the whole sequence, for these
    /// positions. Runs without dropout.
    pub fn forward_cached<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        cache: &mut KvCache<'g>,
    ) -> Result<Tensor<'g>> {
        let dim = self.out_proj.out_features();
        check_width("MultiheadAttention", x, dim)?;
        let qkv = self.in_proj.forward(g, x)?;
        let o = cache.attend(qkv, self.heads, self.causal)?;
        self.out_proj.forward(g, o)
    }
}

/// `x` is `[batch, len, dim]`.
fn check_width(op: &'static str, x: Tensor<'_>, dim: usize) -> Result<()> {
    let s = x.try_shape()?;
    if s.len() != 3 || s[2] != dim {
        return Err(input_shape(op, &format!("[batch, len, {dim}]"), &s));
    }
    Ok(())
}

impl<'g> KvCache<'g> {
    /// An empty cache of `[batch, heads, max_len, head_dim]` keys and values.
    pub(crate) fn new(g: &'g Graph, shape: [usize; 4], dtype: DType) -> Result<Self> {
        Ok(KvCache {
            k: g.zeros(&shape, dtype)?,
            v: g.zeros(&shape, dtype)?,
            len: 0,
        })
    }

    /// Attention of the packed projection `qkv` (`[batch, new, 3·dim]`: queries, keys and
    /// values side by side, each `heads` heads of `dim/heads`) over the cached positions and
    /// its own (causally among its own when `causal`), its keys and values appended: the heads
    /// merged back, `[batch, new, dim]`, before any output projection.
    pub(crate) fn attend(
        &mut self,
        qkv: Tensor<'g>,
        heads: usize,
        causal: bool,
    ) -> Result<Tensor<'g>> {
        let s = qkv.try_shape()?;
        let [b, new, d3] = s[..] else {
            return Err(input_shape("KvCache", "[batch, len, 3·dim]", &s));
        };
        let cs = self.k.try_shape()?;
        let (dim, hd) = (d3 / 3, cs[3]);
        if d3 % 3 != 0 || cs[1] != heads || dim != heads * hd {
            return Err(input_shape(
                "KvCache",
                &format!("[batch, len, {}]", 3 * cs[1] * hd),
                &s,
            ));
        }
        let (bi, li, hi, hdi) = (b as isize, new as isize, heads as isize, hd as isize);
        // [b, l, 3d] → [b, l, 3, h, hd] → [3, b, h, l, hd].
        let parts = qkv
            .reshape(&[bi, li, 3, hi, hdi])?
            .permute(&[2, 0, 3, 1, 4])?;
        let part = |k: usize| -> Result<Tensor<'g>> {
            Ok(parts.slice(0, k, k + 1)?.reshape(&[bi, hi, li, hdi])?)
        };
        let o = self.attend_heads([part(0)?, part(1)?, part(2)?], causal)?;
        // [b, h, l, hd] → [b, l, d].
        Ok(o.permute(&[0, 2, 1, 3])?.reshape(&[bi, li, dim as isize])?)
    }

    /// Attention of queries `q` (`[batch, heads, new, head_dim]`) over the cached positions
    /// and the new keys and values `k`, `v` (`[batch, kv_heads, new, head_dim]`, the cache's
    /// heads; each serves `heads / kv_heads` query heads, grouped-query attention), causal
    /// among the new ones when `causal`; `k` and `v` are appended. The output is
    /// `[batch, heads, new, head_dim]`.
    pub(crate) fn attend_heads(
        &mut self,
        [q, k, v]: [Tensor<'g>; 3],
        causal: bool,
    ) -> Result<Tensor<'g>> {
        let (qs, ks) = (q.try_shape()?, k.try_shape()?);
        let cs = self.k.try_shape()?;
        let [b, heads, new, hd] = qs[..] else {
            return Err(input_shape(
                "KvCache",
                "queries [batch, heads, len, head_dim]",
                &qs,
            ));
        };
        let kv = cs[1];
        if hd != cs[3] || heads % kv != 0 || ks[..] != [b, kv, new, hd] {
            return Err(input_shape(
                "KvCache",
                &format!("keys [{b}, {kv}, {new}, {}] beside queries {qs:?}", cs[3]),
                &ks,
            ));
        }
        let (past, total) = (self.len, self.len + new);
        if cs[0] != b || total > cs[2] {
            return Err(config(
                "KvCache",
                format!(
                    "the cache holds {} sequences of {} positions; {b} sequences need {total}",
                    cs[0], cs[2]
                ),
            ));
        }
        self.k.slice_write(2, past, k)?;
        self.v.slice_write(2, past, v)?;
        self.len = total;
        // The cache read where it lies (its first `total` positions), query i (position
        // past + i) seeing keys j ≤ past + i.
        Ok(q.attend_cache(self.k, self.v, total, causal)?)
    }
}

/// Keys or values `[b, kv_heads, l, d]` with each head repeated `n` times in place
/// (`[b, kv_heads·n, l, d]`, head `h` serving query heads `h·n..(h + 1)·n`): `transformers`'
/// `repeat_kv`, for grouped-query attention. Itself when `n` is 1.
pub(crate) fn repeat_kv(x: Tensor<'_>, n: usize) -> Result<Tensor<'_>> {
    if n == 1 {
        return Ok(x);
    }
    let s = x.try_shape()?;
    let [b, kv, l, d] = s[..] else {
        return Err(input_shape(
            "repeat_kv",
            "[batch, heads, len, head_dim]",
            &s,
        ));
    };
    Ok(
        x.reshape(&[b as isize, kv as isize, 1, l as isize, d as isize])?
            .broadcast_to(&[b, kv, n, l, d])?
            .reshape(&[b as isize, (kv * n) as isize, l as isize, d as isize])?,
    )
}

impl Module for MultiheadAttention {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        check_width("MultiheadAttention", x, self.out_proj.out_features())?;
        let opts = AttentionOptions {
            causal: self.causal,
            dropout_p: if self.training { self.dropout } else { 0.0 },
            ..Default::default()
        };
        // One product for the three parts, and attention reading its heads straight out of
        // the product's output: no copy of the parts is kept for backward.
        let o = self
            .in_proj
            .forward(g, x)?
            .attention_packed(self.heads, opts)?;
        self.out_proj.forward(g, o)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("in_proj_weight", self.in_proj.weight());
        if let Some(bias) = self.in_proj.bias() {
            v.param("in_proj_bias", bias);
        }
        v.child("out_proj", &self.out_proj);
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// Options of a [`TransformerBlock`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransformerConfig {
    /// Attention heads (default 4).
    pub heads: usize,
    /// The MLP's hidden width as a multiple of the model width (default 4).
    pub mlp_ratio: usize,
    /// Dropout on the attention weights and after each residual branch (default 0.1).
    pub dropout: f64,
    /// Whether each position sees only the positions before it (default true).
    pub causal: bool,
    /// LayerNorm's `eps` (default 1e-5).
    pub eps: f64,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
}

impl Default for TransformerConfig {
    fn default() -> Self {
        TransformerConfig {
            heads: 4,
            mlp_ratio: 4,
            dropout: 0.1,
            causal: true,
            eps: 1e-5,
            dtype: DType::F32,
        }
    }
}

/// A pre-norm transformer block over `[batch, len, dim]`, PyTorch's
/// `TransformerEncoderLayer(norm_first=True, activation="gelu", batch_first=True)`:
/// `x + drop(attn(norm1(x)))`, then `x + drop(linear2(drop(gelu(linear1(norm2(x))))))`, with
/// its parameter names (`self_attn.*`, `linear1`, `linear2`, `norm1`, `norm2`).
///
/// ```
/// use arenagrad_nn::{DType, Graph, Module, Rng, TransformerBlock, TransformerConfig};
/// let mut rng = Rng::seed(0);
/// let block = TransformerBlock::new(32, TransformerConfig::default(), &mut rng)?;
/// let g = Graph::new();
/// let y = block.forward(&g, g.randn(&[2, 7, 32], DType::F32)?)?;
/// assert_eq!(y.shape().as_slice(), &[2, 7, 32]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: MultiheadAttention,
    linear1: Linear,
    linear2: Linear,
    norm1: LayerNorm,
    norm2: LayerNorm,
    dropout: Dropout,
}

impl TransformerBlock {
    /// A block of width `dim` with the given options.
    pub fn new(dim: usize, cfg: TransformerConfig, rng: &mut Rng) -> Result<Self> {
        if cfg.mlp_ratio == 0 {
            return Err(config("TransformerBlock", "mlp_ratio must be ≥ 1"));
        }
        let hidden = dim
            .checked_mul(cfg.mlp_ratio)
            .ok_or_else(|| config("TransformerBlock", "dim · mlp_ratio overflows"))?;
        let lin = LinearConfig {
            dtype: cfg.dtype,
            ..LinearConfig::default()
        };
        let norm = LayerNormConfig {
            eps: cfg.eps,
            elementwise_affine: true,
            dtype: cfg.dtype,
        };
        Ok(TransformerBlock {
            self_attn: MultiheadAttention::with_options(
                dim,
                cfg.heads,
                cfg.causal,
                cfg.dropout,
                cfg.dtype,
                rng,
            )?,
            linear1: Linear::with_config(dim, hidden, lin, rng)?,
            linear2: Linear::with_config(hidden, dim, lin, rng)?,
            norm1: LayerNorm::with_config(&[dim], norm)?,
            norm2: LayerNorm::with_config(&[dim], norm)?,
            dropout: Dropout::new(cfg.dropout)?,
        })
    }

    /// The attention sublayer.
    pub fn self_attn(&self) -> &MultiheadAttention {
        &self.self_attn
    }
}

impl TransformerBlock {
    /// The block over new positions `x` (`[batch, new, dim]`) with the attention's keys and
    /// values cached ([`MultiheadAttention::forward_cached`]); without dropout.
    pub fn forward_cached<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        cache: &mut KvCache<'g>,
    ) -> Result<Tensor<'g>> {
        let a = self
            .self_attn
            .forward_cached(g, self.norm1.forward_for_product(g, x)?, cache)?;
        let x = x.add(a)?;
        let h = self
            .linear1
            .forward(g, self.norm2.forward_for_product(g, x)?)?
            .gelu()?;
        Ok(x.add(self.linear2.forward(g, h)?)?)
    }
}

impl Module for TransformerBlock {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        // Each norm feeds a product: under autocast it stores what the product reads.
        let a = self
            .self_attn
            .forward(g, self.norm1.forward_for_product(g, x)?)?;
        let x = x.add(self.dropout.forward(g, a)?)?;
        let h = self
            .linear1
            .forward(g, self.norm2.forward_for_product(g, x)?)?
            .gelu()?;
        let h = self.linear2.forward(g, self.dropout.forward(g, h)?)?;
        Ok(x.add(self.dropout.forward(g, h)?)?)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("self_attn", &self.self_attn);
        v.child("linear1", &self.linear1);
        v.child("linear2", &self.linear2);
        v.child("norm1", &self.norm1);
        v.child("norm2", &self.norm2);
    }

    fn set_training(&mut self, training: bool) {
        self.self_attn.set_training(training);
        self.dropout.set_training(training);
    }
}
