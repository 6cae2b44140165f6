//! A Llama-family decoder as Hugging Face's `transformers` defines it (`LlamaForCausalLM`):
//! token embeddings, blocks of RMS-normalised attention with rotary position embeddings and
//! grouped-query heads (`num_key_value_heads` key/value heads shared by the query heads) and a
//! SwiGLU MLP (`down(silu(gate(x)) · up(x))`), a final RMS norm and an output layer (tied to the
//! embedding or not). Parameters carry `transformers`' names (`model.layers.0.self_attn.q_proj.
//! weight`, …, `lm_head.weight`), so a directory `save_pretrained` wrote loads as it is
//! ([`Llama::from_pretrained`]); generation keeps each layer's rotated keys and values
//! ([`KvCache`], at the key/value heads' count).
//!
//! ```
//! use arenagrad_nn::models::llama::{Llama, LlamaConfig};
//! use arenagrad_nn::{Graph, Rng};
//! let cfg = LlamaConfig { vocab_size: 50, hidden_size: 16, intermediate_size: 40,
//!     num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
//!     ..LlamaConfig::default() };
//! let model = Llama::new(cfg, &mut Rng::seed(0))?;
//! let g = Graph::new();
//! let logits = model.forward_tokens(&g, &[1, 2, 3, 4, 5, 6], 2, 3)?;
//! assert_eq!(logits.shape().as_slice(), &[2, 3, 50]);
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use arenagrad_graph::{AttentionOptions, DType, Graph, Tensor};

use crate::error::{config, input_shape, Result};
use crate::functional as F;
use crate::init::Init;
use crate::layers::attention::{repeat_kv, KvCache};
use crate::layers::linear::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use crate::layers::norm::{RMSNorm, RMSNormConfig};
use crate::module::{Module, Visitor};
use crate::Rng;

/// The shape and options of a [`Llama`], with `transformers`' `LlamaConfig` names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaConfig {
    /// Tokens in the vocabulary (32000).
    pub vocab_size: usize,
    /// The model width (4096).
    pub hidden_size: usize,
    /// The MLP's hidden width (11008).
    pub intermediate_size: usize,
    /// Blocks (32).
    pub num_hidden_layers: usize,
    /// Query heads per block (32).
    pub num_attention_heads: usize,
    /// Key and value heads per block, each shared by `num_attention_heads /
    /// num_key_value_heads` query heads (32: one each).
    pub num_key_value_heads: usize,
    /// A head's width (`None`: `hidden_size / num_attention_heads`).
    pub head_dim: Option<usize>,
    /// The longest sequence (2048).
    pub max_position_embeddings: usize,
    /// RMSNorm's ε (1e-6).
    pub rms_norm_eps: f64,
    /// The base of the rotary embeddings' frequencies (10000).
    pub rope_theta: f64,
    /// Whether the output layer is the token embedding (false).
    pub tie_word_embeddings: bool,
    /// The standard deviation of the initial weights (0.02).
    pub initializer_range: f64,
    /// The parameters' dtype (f32).
    pub dtype: DType,
}

impl Default for LlamaConfig {
    /// Llama 2 7B's shape.
    fn default() -> Self {
        LlamaConfig {
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 11008,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: 32,
            head_dim: None,
            max_position_embeddings: 2048,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            tie_word_embeddings: false,
            initializer_range: 0.02,
            dtype: DType::F32,
        }
    }
}

impl LlamaConfig {
    /// A head's width.
    pub fn head_width(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The configuration `transformers` wrote to `config.json` (its text). Options this
    /// implementation does not have (biases on the projections, an activation other than SiLU,
    /// scaled rotary embeddings) are refused rather than ignored.
    #[cfg(feature = "checkpoint")]
    pub fn from_json(text: &str) -> Result<Self> {
        Self::from_hf(&super::hf::HfJson::parse("LlamaConfig", text)?)
    }

    #[cfg(feature = "checkpoint")]
    pub(crate) fn from_hf(j: &super::hf::HfJson) -> Result<Self> {
        let d = LlamaConfig::default();
        j.refuse("attention_bias", true, false)?;
        j.refuse("mlp_bias", true, false)?;
        if let Some(act) = j.text("hidden_act") {
            if act != "silu" {
                return Err(config(
                    "LlamaConfig",
                    format!("hidden_act {act:?} is not supported (only \"silu\")"),
                ));
            }
        }
        // The rotary base: top-level (older files) or in `rope_parameters`; only the default
        // (unscaled) rotary embeddings are implemented.
        let rope = j.get("rope_parameters").or_else(|| j.get("rope_scaling"));
        if let Some(kind) = rope.and_then(|r| r.get("rope_type").or_else(|| r.get("type"))) {
            if kind.as_str() != Some("default") {
                return Err(config(
                    "LlamaConfig",
                    format!("rotary embeddings of type {kind} are not supported"),
                ));
            }
        }
        let theta = rope
            .and_then(|r| r.get("rope_theta"))
            .or_else(|| j.get("rope_theta"));
        let heads = j.count("num_attention_heads", d.num_attention_heads)?;
        let cfg = LlamaConfig {
            vocab_size: j.count("vocab_size", d.vocab_size)?,
            hidden_size: j.count("hidden_size", d.hidden_size)?,
            intermediate_size: j.count("intermediate_size", d.intermediate_size)?,
            num_hidden_layers: j.count("num_hidden_layers", d.num_hidden_layers)?,
            num_attention_heads: heads,
            num_key_value_heads: j.count("num_key_value_heads", heads)?,
            head_dim: match j.get("head_dim") {
                None => None,
                Some(_) => Some(j.count("head_dim", 0)?),
            },
            max_position_embeddings: j
                .count("max_position_embeddings", d.max_position_embeddings)?,
            rms_norm_eps: j.real("rms_norm_eps", d.rms_norm_eps)?,
            rope_theta: j.real_of(theta, "rope_theta", d.rope_theta)?,
            tie_word_embeddings: j.flag("tie_word_embeddings", d.tie_word_embeddings)?,
            initializer_range: j.real("initializer_range", d.initializer_range)?,
            dtype: DType::F32,
        };
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        let positive = [
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.max_position_embeddings,
            self.head_width(),
        ];
        if positive.contains(&0) {
            return Err(config("LlamaConfig", "every size must be positive"));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(config(
                "LlamaConfig",
                format!(
                    "num_attention_heads {} must be a multiple of num_key_value_heads {}",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        if !self.head_width().is_multiple_of(2) {
            return Err(config(
                "LlamaConfig",
                "rotary embeddings need an even head width",
            ));
        }
        if !(self.rms_norm_eps > 0.0 && self.rope_theta > 0.0 && self.initializer_range >= 0.0) {
            return Err(config(
                "LlamaConfig",
                "rms_norm_eps and rope_theta must be positive, initializer_range non-negative",
            ));
        }
        Ok(())
    }
}

/// One block's attention: projections without biases, rotary embeddings on queries and keys,
/// `kv_heads` key/value heads shared by `heads` query heads.
#[derive(Debug)]
struct LlamaAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// The rotary embeddings' base.
    theta: f64,
}

impl LlamaAttention {
    /// The rotary tables for positions `0..len` of `x` (`[b, len, …]`).
    fn rope_from_start<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Rope<'g>> {
        let l = x.try_shape()?.get(1).copied().unwrap_or(0);
        Rope::new(g, self.head_dim, self.theta, 0, l, x.dtype())
    }

    /// `x` `[b, l, d]` → rotated queries `[b, h, l, hd]`, rotated keys and values
    /// `[b, kv, l, hd]`.
    fn qkv<'g>(&self, g: &'g Graph, x: Tensor<'g>, rope: &Rope<'g>) -> Result<[Tensor<'g>; 3]> {
        let s = x.try_shape()?;
        let [b, l, _] = s[..] else {
            return Err(input_shape("LlamaAttention", "[batch, len, width]", &s));
        };
        let split = |t: Tensor<'g>, heads: usize| -> Result<Tensor<'g>> {
            Ok(t.reshape(&[
                b as isize,
                l as isize,
                heads as isize,
                self.head_dim as isize,
            ])?
            .permute(&[0, 2, 1, 3])?)
        };
        let q = rope.apply(split(self.q_proj.forward(g, x)?, self.heads)?)?;
        let k = rope.apply(split(self.k_proj.forward(g, x)?, self.kv_heads)?)?;
        let v = split(self.v_proj.forward(g, x)?, self.kv_heads)?;
        Ok([q, k, v])
    }

    /// `[b, h, l, hd]` → `[b, l, h·hd]`, through `o_proj`.
    fn merge<'g>(&self, g: &'g Graph, o: Tensor<'g>) -> Result<Tensor<'g>> {
        let s = o.try_shape()?;
        let o = o.permute(&[0, 2, 1, 3])?.reshape(&[
            s[0] as isize,
            s[2] as isize,
            (s[1] * s[3]) as isize,
        ])?;
        self.o_proj.forward(g, o)
    }

    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>, rope: &Rope<'g>) -> Result<Tensor<'g>> {
        let [q, k, v] = self.qkv(g, x, rope)?;
        let n = self.heads / self.kv_heads;
        let opts = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let o = q.scaled_dot_product_attention(repeat_kv(k, n)?, repeat_kv(v, n)?, opts)?;
        self.merge(g, o)
    }

    fn forward_cached<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        rope: &Rope<'g>,
        cache: &mut KvCache<'g>,
    ) -> Result<Tensor<'g>> {
        let qkv = self.qkv(g, x, rope)?;
        let o = cache.attend_heads(qkv, true)?;
        self.merge(g, o)
    }
}

impl Module for LlamaAttention {
    /// Over positions from 0.
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let rope = self.rope_from_start(g, x)?;
        LlamaAttention::forward(self, g, x, &rope)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("q_proj", &self.q_proj);
        v.child("k_proj", &self.k_proj);
        v.child("v_proj", &self.v_proj);
        v.child("o_proj", &self.o_proj);
    }
}

/// SwiGLU: `down_proj(silu(gate_proj(x)) · up_proj(x))`.
#[derive(Debug)]
struct LlamaMlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Module for LlamaMlp {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let h = self
            .gate_proj
            .forward(g, x)?
            .silu()?
            .mul(self.up_proj.forward(g, x)?)?;
        self.down_proj.forward(g, h)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("gate_proj", &self.gate_proj);
        v.child("up_proj", &self.up_proj);
        v.child("down_proj", &self.down_proj);
    }
}

/// `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Debug)]
struct LlamaBlock {
    input_layernorm: RMSNorm,
    self_attn: LlamaAttention,
    post_attention_layernorm: RMSNorm,
    mlp: LlamaMlp,
}

/// The projections of a block, by `transformers`' names.
const PROJECTIONS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

impl LlamaBlock {
    /// The block's projections with their names (as [`PROJECTIONS`] lists them).
    fn projections_mut(&mut self) -> [(&'static str, &mut Linear); 7] {
        let (a, m) = (&mut self.self_attn, &mut self.mlp);
        [
            ("q_proj", &mut a.q_proj),
            ("k_proj", &mut a.k_proj),
            ("v_proj", &mut a.v_proj),
            ("o_proj", &mut a.o_proj),
            ("gate_proj", &mut m.gate_proj),
            ("up_proj", &mut m.up_proj),
            ("down_proj", &mut m.down_proj),
        ]
    }

    fn run<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        rope: &Rope<'g>,
        cache: Option<&mut KvCache<'g>>,
    ) -> Result<Tensor<'g>> {
        let a = self.input_layernorm.forward(g, x)?;
        let a = match cache {
            Some(c) => self.self_attn.forward_cached(g, a, rope, c)?,
            None => self.self_attn.forward(g, a, rope)?,
        };
        let x = x.add(a)?;
        let m = self
            .mlp
            .forward(g, self.post_attention_layernorm.forward(g, x)?)?;
        Ok(x.add(m)?)
    }
}

impl Module for LlamaBlock {
    /// Over positions from 0.
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let rope = self.self_attn.rope_from_start(g, x)?;
        self.run(g, x, &rope, None)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("input_layernorm", &self.input_layernorm);
        v.child("self_attn", &self.self_attn);
        v.child("post_attention_layernorm", &self.post_attention_layernorm);
        v.child("mlp", &self.mlp);
    }
}

/// The rotary embeddings' `cos` and `sin` for positions `past..past + len`, `[len, head_dim]`
/// (each frequency twice, as `transformers` concatenates them), computed as `transformers`
/// computes them in f32: `inv_freq = 1 / θ^(2i/d)`, the angle `position · inv_freq` rounded
/// once, then its cosine and sine.
struct Rope<'g> {
    g: &'g Graph,
    cos: Tensor<'g>,
    sin: Tensor<'g>,
    half: usize,
}

impl<'g> Rope<'g> {
    fn new(
        g: &'g Graph,
        head_dim: usize,
        theta: f64,
        past: usize,
        len: usize,
        dtype: DType,
    ) -> Result<Self> {
        let half = head_dim / 2;
        // The frequencies as `transformers` computes them, in f32 throughout:
        // `1 / theta ** (arange(0, dim, 2) / dim)`.
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let (mut cos, mut sin) = (
            Vec::with_capacity(len * head_dim),
            Vec::with_capacity(len * head_dim),
        );
        for p in past..past + len {
            // The angles as `transformers` computes them: the f32 frequencies times the
            // position, in f32 — in f64 for an f64 model (where `transformers` would compute in
            // f32 all the same; its f64 reference is made with the f64 formula).
            let row: Vec<f64> = if dtype == DType::F64 {
                inv.iter().map(|&f| f64::from(f) * p as f64).collect()
            } else {
                inv.iter().map(|&f| f64::from(f * p as f32)).collect()
            };
            for _ in 0..2 {
                cos.extend(row.iter().map(|a| a.cos()));
                sin.extend(row.iter().map(|a| a.sin()));
            }
        }
        Ok(Rope {
            g,
            cos: g.from_f64(&cos, &[len, head_dim], dtype)?,
            sin: g.from_f64(&sin, &[len, head_dim], dtype)?,
            half,
        })
    }

    /// `x·cos + rotate_half(x)·sin` for `x` `[b, heads, len, head_dim]`, where
    /// `rotate_half(x) = [−x₂, x₁]` of its two halves.
    fn apply(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let d = 2 * self.half;
        let (x1, x2) = (x.slice(-1, 0, self.half)?, x.slice(-1, self.half, d)?);
        let rotated = self.g.concat(&[x2.neg()?, x1], -1)?;
        Ok(x.mul(self.cos)?.add(rotated.mul(self.sin)?)?)
    }
}

/// A Llama-family decoder with its language-model head (see the module documentation).
#[derive(Debug)]
pub struct Llama {
    cfg: LlamaConfig,
    embed_tokens: Embedding,
    layers: Vec<LlamaBlock>,
    norm: RMSNorm,
    /// The output layer; `None` when it is the token embedding.
    lm_head: Option<Linear>,
}

/// The `model.` part of the names (`LlamaModel` inside `LlamaForCausalLM`).
struct Body<'a>(&'a Llama);

impl Module for Body<'_> {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        let m = self.0;
        v.child("embed_tokens", &m.embed_tokens);
        for (i, b) in m.layers.iter().enumerate() {
            v.child(&format!("layers.{i}"), b);
        }
        v.child("norm", &m.norm);
    }
}

impl Llama {
    /// A model of shape `cfg`, initialised as `transformers` initialises Llama: weights
    /// `N(0, initializer_range)`, norms 1.
    pub fn new(cfg: LlamaConfig, rng: &mut Rng) -> Result<Self> {
        Self::build(cfg, Some(rng))
    }

    fn build(cfg: LlamaConfig, rng: Option<&mut Rng>) -> Result<Self> {
        cfg.check()?;
        let random = rng.is_some();
        let mut zero_rng = Rng::seed(0);
        let rng = rng.unwrap_or(&mut zero_rng);
        let init = super::hf::normal_or_zeros(random, cfg.initializer_range);
        let lin = LinearConfig {
            bias: false,
            dtype: cfg.dtype,
            weight_init: init,
            bias_init: Init::Zeros,
        };
        let norm = RMSNormConfig {
            eps: Some(cfg.rms_norm_eps),
            dtype: cfg.dtype,
            ..RMSNormConfig::default()
        };
        let (d, hd) = (cfg.hidden_size, cfg.head_width());
        let (h, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            layers.push(LlamaBlock {
                input_layernorm: RMSNorm::with_config(&[d], norm)?,
                self_attn: LlamaAttention {
                    q_proj: Linear::with_config(d, h * hd, lin, rng)?,
                    k_proj: Linear::with_config(d, kv * hd, lin, rng)?,
                    v_proj: Linear::with_config(d, kv * hd, lin, rng)?,
                    o_proj: Linear::with_config(h * hd, d, lin, rng)?,
                    heads: h,
                    kv_heads: kv,
                    head_dim: hd,
                    theta: cfg.rope_theta,
                },
                post_attention_layernorm: RMSNorm::with_config(&[d], norm)?,
                mlp: LlamaMlp {
                    gate_proj: Linear::with_config(d, cfg.intermediate_size, lin, rng)?,
                    up_proj: Linear::with_config(d, cfg.intermediate_size, lin, rng)?,
                    down_proj: Linear::with_config(cfg.intermediate_size, d, lin, rng)?,
                },
            });
        }
        let emb = EmbeddingConfig {
            dtype: cfg.dtype,
            init,
        };
        Ok(Llama {
            cfg,
            embed_tokens: Embedding::with_config(cfg.vocab_size, d, emb, rng)?,
            layers,
            norm: RMSNorm::with_config(&[d], norm)?,
            lm_head: if cfg.tie_word_embeddings {
                None
            } else {
                Some(Linear::with_config(d, cfg.vocab_size, lin, rng)?)
            },
        })
    }

    /// The model `save_pretrained` wrote to `dir` (`config.json`, and `model.safetensors` or
    /// its shards), by its own names, strictly: any missing, unexpected or mis-shaped name is
    /// an error listing them all, and nothing is loaded then (a tied model's file may carry
    /// `lm_head.weight`, which is left out).
    #[cfg(feature = "checkpoint")]
    pub fn from_pretrained(dir: impl AsRef<std::path::Path>) -> Result<Self> {
        Self::from_pretrained_as(dir, DType::F32)
    }

    /// [`Llama::from_pretrained`] with parameters of `dtype` (f32, f64, bf16 or f16): the
    /// checkpoint's values are converted as they load (rounded to nearest even where the
    /// dtype is narrower), and the model runs in that dtype — bf16 halves the bytes a token
    /// reads in generation, where each token reads every weight.
    #[cfg(feature = "checkpoint")]
    pub fn from_pretrained_as(dir: impl AsRef<std::path::Path>, dtype: DType) -> Result<Self> {
        let dir = dir.as_ref();
        let mut cfg = LlamaConfig::from_hf(&super::hf::HfJson::read("LlamaConfig", dir)?)?;
        cfg.dtype = super::hf::parameter_dtype("Llama::from_pretrained_as", dtype)?;
        let mut model = Llama::build(cfg, None)?;
        model.load_hf(dir)?;
        model.set_training(false);
        Ok(model)
    }

    /// Loads the weights of a `transformers` Llama checkpoint (a file, a shard index or a
    /// directory) into this model, strictly.
    #[cfg(feature = "checkpoint")]
    pub fn load_hf(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        use crate::checkpoint::{self, KeyMap};
        let path = path.as_ref();
        let mut map = KeyMap::new().drop("*.rotary_emb.inv_freq");
        if self.cfg.tie_word_embeddings {
            map = map.drop("lm_head.weight");
        }
        let tensors = map.read(path)?;
        checkpoint::load_state_dict(self, tensors, true, path).map(|_| ())
    }

    /// Adds LoRA adapters of rank `r` and scale `alpha / r` ([`Linear::add_lora`]) to every
    /// block's projections named in `targets` (`q_proj`, `k_proj`, `v_proj`, `o_proj`,
    /// `gate_proj`, `up_proj`, `down_proj`; PEFT's `target_modules`), after freezing the whole
    /// model: only the adapters train, and they start as no change. Their names are PEFT's
    /// (`model.layers.0.self_attn.q_proj.lora_A.weight`). An error for an unknown target (no
    /// adapter added then) or a projection that has one already.
    pub fn add_lora(
        &mut self,
        r: usize,
        alpha: f64,
        targets: &[&str],
        rng: &mut Rng,
    ) -> Result<()> {
        if let Some(t) = targets.iter().find(|t| !PROJECTIONS.contains(t)) {
            return Err(config(
                "Llama::add_lora",
                format!("{t:?} is not a projection (one of {PROJECTIONS:?})"),
            ));
        }
        self.freeze();
        for b in &mut self.layers {
            for (name, lin) in b.projections_mut() {
                if targets.contains(&name) {
                    lin.add_lora(r, alpha, rng)?;
                }
            }
        }
        Ok(())
    }

    /// Merges every adapter into its weight ([`Linear::merge_lora`]).
    pub fn merge_lora(&mut self) -> Result<()> {
        self.each_adapter(Linear::merge_lora)
    }

    /// Takes every adapter back out of its weight ([`Linear::unmerge_lora`]).
    pub fn unmerge_lora(&mut self) -> Result<()> {
        self.each_adapter(Linear::unmerge_lora)
    }

    fn each_adapter(&mut self, f: fn(&mut Linear) -> Result<()>) -> Result<()> {
        for b in &mut self.layers {
            for (_, lin) in b.projections_mut() {
                if lin.lora().is_some() {
                    f(lin)?;
                }
            }
        }
        Ok(())
    }

    /// The model's configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    fn run<'g>(
        &self,
        g: &'g Graph,
        tokens: &[usize],
        (batch, len): (usize, usize),
        caches: Option<&mut [KvCache<'g>]>,
    ) -> Result<Tensor<'g>> {
        let past = caches
            .as_ref()
            .map_or(0, |c| c.first().map_or(0, |c| c.len()));
        let context = self.cfg.max_position_embeddings;
        super::check_tokens("Llama", tokens, (batch, len, past), context)?;
        let mut x = self.embed_tokens.lookup(g, tokens, &[batch, len])?;
        let rope = Rope::new(
            g,
            self.cfg.head_width(),
            self.cfg.rope_theta,
            past,
            len,
            self.embed_tokens.weight().dtype(),
        )?;
        match caches {
            Some(caches) => {
                super::check_caches("Llama", caches, self.layers.len())?;
                for (b, c) in self.layers.iter().zip(caches.iter_mut()) {
                    x = b.run(g, x, &rope, Some(c))?;
                }
            }
            None => {
                for b in &self.layers {
                    x = b.run(g, x, &rope, None)?;
                }
            }
        }
        let x = self.norm.forward(g, x)?;
        match &self.lm_head {
            Some(head) => head.forward(g, x),
            None => F::linear(x, g.param(self.embed_tokens.weight())?, None),
        }
    }

    /// Logits `[batch, len, vocab]` for `tokens` (`[batch, len]`, row-major).
    pub fn forward_tokens<'g>(
        &self,
        g: &'g Graph,
        tokens: &[usize],
        batch: usize,
        len: usize,
    ) -> Result<Tensor<'g>> {
        self.run(g, tokens, (batch, len), None)
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

impl super::CausalLm for Llama {
    fn context(&self) -> usize {
        self.cfg.max_position_embeddings
    }

    fn new_caches<'g>(&self, g: &'g Graph, batch: usize) -> Result<Vec<KvCache<'g>>> {
        let shape = [
            batch,
            self.cfg.num_key_value_heads,
            self.cfg.max_position_embeddings,
            self.cfg.head_width(),
        ];
        let dtype = self.embed_tokens.weight().dtype();
        (0..self.cfg.num_hidden_layers)
            .map(|_| KvCache::new(g, shape, dtype))
            .collect()
    }

    fn forward_cached<'g>(
        &self,
        g: &'g Graph,
        tokens: &[usize],
        batch: usize,
        caches: &mut [KvCache<'g>],
    ) -> Result<Tensor<'g>> {
        let len = tokens.len() / batch.max(1);
        self.run(g, tokens, (batch, len), Some(caches))
    }
}

impl Module for Llama {
    /// `x`: token indices `[batch, len]` as floats; the logits `[batch, len, vocab]`.
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let s = x.try_shape()?;
        let [b, l] = s[..] else {
            return Err(input_shape("Llama", "[batch, len] token indices", &s));
        };
        let tokens = F::tensor_to_indices("Llama", x)?;
        self.forward_tokens(g, &tokens, b, l)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("model", &Body(self));
        if let Some(head) = &self.lm_head {
            v.child("lm_head", head);
        }
    }
}
