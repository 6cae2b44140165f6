//! Whole models built from the layers: a character-level GPT, and GPT-2, a Llama-family
//! decoder and a BERT encoder as Hugging Face's `transformers` defines them, and ResNet as
//! torchvision defines it (loading their checkpoints by their own names).

pub mod bert;
pub mod gpt;
pub mod gpt2;
mod hf;
pub mod llama;
pub mod resnet;

pub use hf::Activation;

use arenagrad_graph::{Graph, Tensor};

use crate::error::{config, Result};
use crate::layers::attention::KvCache;
use crate::layers::basic::Dropout;
use crate::layers::linear::Embedding;
use crate::layers::norm::LayerNorm;
use crate::module::Module;
use crate::{Rng, Sampling};

/// A language model that predicts the next token from the ones before it and keeps each
/// layer's keys and values ([`KvCache`]) so that a new token costs one step: what
/// [`generate`] drives.
pub trait CausalLm {
    /// The most positions a sequence may have.
    fn context(&self) -> usize;
    /// One empty cache per layer for `batch` sequences of up to the context.
    fn new_caches<'g>(&self, g: &'g Graph, batch: usize) -> Result<Vec<KvCache<'g>>>;
    /// Logits `[batch, new, vocab]` for `tokens` (`[batch, new]`, row-major) following what
    /// `caches` hold, which they then hold too. Without dropout.
    fn forward_cached<'g>(
        &self,
        g: &'g Graph,
        tokens: &[usize],
        batch: usize,
        caches: &mut [KvCache<'g>],
    ) -> Result<Tensor<'g>>;
    /// `n` tokens after `prompt` ([`generate`]): one cached step per token.
    fn generate(
        &self,
        g: &Graph,
        prompt: &[usize],
        n: usize,
        sampling: Sampling,
        rng: &mut Rng,
    ) -> Result<Vec<usize>> {
        generate(self, g, prompt, n, sampling, rng)
    }
}

/// What GPT-style decoders share (token and learned position embeddings, dropout, blocks,
/// a final norm and an output layer tied to the token embedding): their forward passes, with
/// and without the key/value cache, written once over these parts.
pub(crate) trait Decoder {
    /// A block: its full forward ([`Module::forward`]) and its cached one.
    type Block: Module + CachedBlock;
    /// The model's name in errors.
    const NAME: &'static str;
    /// Token embeddings, position embeddings (one row per position of the context).
    fn embeddings(&self) -> (&Embedding, &Embedding);
    /// Dropout after the embeddings.
    fn embedding_dropout(&self) -> &Dropout;
    /// The blocks in order.
    fn blocks(&self) -> &[Self::Block];
    /// The final norm.
    fn final_norm(&self) -> &LayerNorm;
}

/// A block run over the positions after those its cache holds.
pub(crate) trait CachedBlock {
    fn forward_cached<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        cache: &mut KvCache<'g>,
    ) -> Result<Tensor<'g>>;
}

/// `tokens` hold `batch` sequences of `len` (`[batch, len]`, row-major), and positions
/// `past..past + len` fit in `context`.
pub(crate) fn check_tokens(
    model: &'static str,
    tokens: &[usize],
    (batch, len, past): (usize, usize, usize),
    context: usize,
) -> Result<()> {
    if batch == 0 || tokens.len() != batch * len {
        return Err(crate::error::input_shape(
            model,
            &format!("{} tokens as [{batch}, {len}]", batch * len),
            &[tokens.len()],
        ));
    }
    if past + len > context {
        return Err(config(
            model,
            format!("{} positions exceed the context of {context}", past + len),
        ));
    }
    Ok(())
}

/// One cache per block (and at least one block).
pub(crate) fn check_caches(
    model: &'static str,
    caches: &[KvCache<'_>],
    layers: usize,
) -> Result<()> {
    if caches.len() != layers || layers == 0 {
        return Err(config(
            model,
            format!(
                "one cache per block ({layers}) is needed, got {}",
                caches.len()
            ),
        ));
    }
    Ok(())
}

/// Embeddings of `tokens` (`[batch, len]`, row-major) at positions `past..past + len`.
fn embed<'g, M: Decoder>(
    m: &M,
    g: &'g Graph,
    tokens: &[usize],
    (batch, len, past): (usize, usize, usize),
) -> Result<Tensor<'g>> {
    let (tok, pos) = m.embeddings();
    check_tokens(M::NAME, tokens, (batch, len, past), pos.weight().shape()[0])?;
    let t = tok.lookup(g, tokens, &[batch, len])?;
    let positions: Vec<usize> = (past..past + len).collect();
    Ok(t.add(pos.lookup(g, &positions, &[len])?)?)
}

/// The final norm and the output layer tied to the token embedding: `[b, l, d]` →
/// `[b, l, vocab]`.
fn head<'g, M: Decoder>(m: &M, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
    let x = m.final_norm().forward_for_product(g, x)?;
    crate::functional::linear(x, g.param(m.embeddings().0.weight())?, None)
}

/// Logits `[batch, len, vocab]` for `tokens` (`[batch, len]`, row-major).
pub(crate) fn decode<'g, M: Decoder>(
    m: &M,
    g: &'g Graph,
    tokens: &[usize],
    (batch, len): (usize, usize),
) -> Result<Tensor<'g>> {
    let mut x = m
        .embedding_dropout()
        .forward(g, embed(m, g, tokens, (batch, len, 0))?)?;
    for b in m.blocks() {
        x = b.forward(g, x)?;
    }
    head(m, g, x)
}

/// [`CausalLm::forward_cached`] of a decoder.
pub(crate) fn decode_cached<'g, M: Decoder>(
    m: &M,
    g: &'g Graph,
    tokens: &[usize],
    batch: usize,
    caches: &mut [KvCache<'g>],
) -> Result<Tensor<'g>> {
    check_caches(M::NAME, caches, m.blocks().len())?;
    let past = caches[0].len();
    let len = tokens.len() / batch.max(1);
    let mut x = embed(m, g, tokens, (batch, len, past))?;
    for (b, c) in m.blocks().iter().zip(caches.iter_mut()) {
        x = b.forward_cached(g, x, c)?;
    }
    head(m, g, x)
}

/// The mean cross-entropy of `logits` (`[batch, len, vocab]`) against `targets` (`batch·len`
/// next tokens).
pub(crate) fn next_token_loss<'g>(logits: Tensor<'g>, targets: &[usize]) -> Result<Tensor<'g>> {
    let s = logits.try_shape()?;
    let flat = logits.reshape(&[(s[0] * s[1]) as isize, s[2] as isize])?;
    crate::loss::cross_entropy(flat, targets)
}

/// `n` tokens after `prompt`, sampled one at a time with `sampling`, each step one cached
/// forward in its own [`Graph::scope`] (memory stays flat however long the text). Past the
/// context the cache restarts from the last half-context of tokens. The same as
/// [`CausalLm::generate`].
pub fn generate<M: CausalLm + ?Sized>(
    model: &M,
    g: &Graph,
    prompt: &[usize],
    n: usize,
    sampling: Sampling,
    rng: &mut Rng,
) -> Result<Vec<usize>> {
    if prompt.is_empty() {
        return Err(config("generate", "the prompt must hold a token"));
    }
    sampling.check()?;
    let ctx = model.context();
    let mut text: Vec<usize> = prompt.to_vec();
    let mut caches = model.new_caches(g, 1)?;
    // The tokens not yet in the cache.
    let mut pending: Vec<usize> = prompt[prompt.len().saturating_sub(ctx)..].to_vec();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if caches[0].len() + pending.len() > ctx {
            for c in &mut caches {
                c.clear();
            }
            let keep = (ctx / 2).max(1);
            pending = text[text.len().saturating_sub(keep)..].to_vec();
        }
        let row = g.try_scope(|g| -> Result<Vec<f64>> {
            let logits = model.forward_cached(g, &pending, 1, &mut caches)?;
            let last = logits.shape()[1] - 1;
            let row = logits.slice(1, last, last + 1)?;
            Ok(row.to_vec_f64()?)
        })?;
        let t = sampling.sample(&row, rng);
        out.push(t);
        text.push(t);
        pending = vec![t];
    }
    Ok(out)
}
