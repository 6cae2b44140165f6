//! Neural networks on arenagrad: modules, losses, optimisers, checkpoints and data.
//!
//! * [`Module`] — a forward pass over an iteration's tensors, parameters visited by hierarchical
//!   name (`0.weight`, `conv1.bias`), and a train/eval mode. Parameters are
//!   [`Parameter`]s: they live outside the graph's arena, persist across iterations, and
//!   accumulate their gradients until cleared.
//! * Layers — [`Linear`], [`Conv2d`], [`MaxPool2d`], [`AvgPool2d`], [`BatchNorm1d`],
//!   [`BatchNorm2d`], [`LayerNorm`], [`RMSNorm`], [`Dropout`], [`Embedding`], [`Flatten`], [`Sequential`],
//!   the activations [`ReLU`], [`LeakyReLU`], [`Tanh`], [`Sigmoid`], [`GELU`], [`GELUTanh`], and [`Lambda`]
//!   for a closure; their math as plain functions in [`functional`].
//! * Attention — [`MultiheadAttention`] (PyTorch's packed `in_proj` weights, masks, a [`KvCache`]
//!   for generation) and the pre-norm [`TransformerBlock`].
//! * Recurrent layers — [`RNNCell`], [`LSTMCell`], [`GRUCell`] and the multi-layer,
//!   bidirectional [`RNN`], [`LSTM`], [`GRU`] ([`RnnConfig`]), with PyTorch's parameter names and
//!   gate orders; the LSTM's recurrence is one fused node per layer.
//! * Models — [`Gpt`], a decoder-only transformer with tied embeddings and cached generation.
//! * [`Hooked`] — forward pre-hooks and hooks on any module (PyTorch's `register_forward_hook`).
//! * [`init`] — uniform, normal, Xavier and Kaiming initialisers on a seeded [`Rng`], and the gain
//!   of each [`Nonlinearity`].
//! * [`loss`] — MSE, cross-entropy from logits (with label smoothing), NLL, BCE with logits.
//! * [`optim`] — SGD (momentum, Nesterov, weight decay), Adam, AdamW, learning-rate
//!   schedules, gradient clipping; their state in training checkpoints.
//! * [`checkpoint`] — safetensors files, saved atomically and loaded with typed errors
//!   (feature `checkpoint`, on by default).
//! * [`data`] — seeded shuffled mini-batches of images from IDX files (MNIST, Fashion-MNIST),
//!   of rows from CSV tables (feature `csv`, with standardisation) and of windows of text
//!   (character language models, e.g. Debian's fortunes).
//! * [`metrics`] — argmax and accuracy.
//! * [`check`] — gradient checks of whole modules against finite differences.
//!
//! nn speaks only to `arenagrad-graph`: tensors, parameters and the graph's threads, never exec's
//! kernels or alloc's arenas.
//!
//! Reproducibility: initialisers and batch shuffling draw from an [`Rng`] you seed
//! ([`Rng::seed`]); Dropout draws from the graph's generator ([`Graph::seed`]). With both seeded,
//! a run's losses are the same bit for bit every time.
//!
//! A training loop, end to end:
//!
//! ```
//! use arenagrad_nn::optim::{Optimizer, Sgd, SgdConfig};
//! use arenagrad_nn::{loss, DType, Graph, Linear, Module, ReLU, Rng, Sequential};
//!
//! let mut rng = Rng::seed(42);
//! let model = Sequential::new()
//!     .add(Linear::new(2, 16, &mut rng)?)
//!     .add(ReLU)
//!     .add(Linear::new(16, 2, &mut rng)?);
//! let mut opt = Sgd::new(model.parameters(), SgdConfig::new(0.5).momentum(0.9))?;
//!
//! // XOR as a two-class problem.
//! let xs = [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0];
//! let ys = [0, 1, 1, 0];
//! let mut g = Graph::new();
//! let mut last = f64::INFINITY;
//! for _ in 0..200 {
//!     opt.zero_grad();
//!     let x = g.from_f64(&xs, &[4, 2], DType::F32)?;
//!     let l = loss::cross_entropy(model.forward(&g, x)?, &ys)?;
//!     l.backward()?;
//!     last = l.item()?;
//!     g.reset(); // frees the iteration; the parameters keep their gradients
//!     opt.step()?;
//! }
//! assert!(last < 0.05, "{last}");
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```
#![forbid(unsafe_code)]

pub mod check;
#[cfg(feature = "checkpoint")]
pub mod checkpoint;
pub mod data;
mod error;
mod files;
pub mod functional;
mod hooks;
pub mod init;
mod layers;
pub mod loss;
pub mod metrics;
pub mod models;
mod module;
pub mod optim;
pub mod spatial;
pub mod summary;

/// `#[derive(Module)]`: the fields as children, parameters and buffers (see [`Module`]).
pub use arenagrad_derive::Module;
pub use arenagrad_graph::Rng;
pub use arenagrad_graph::{
    bf16, f16, AttentionOptions, DType, Graph, GraphError, HostData, HostDataMut, HostTensor,
    Parameter, Tensor,
};
pub use error::{NnError, Result, ShapeConflict, StateMismatch};
pub use hooks::{ForwardHook, ForwardPreHook, Hooked};
pub use init::Nonlinearity;
pub use layers::attention::{KvCache, MultiheadAttention, TransformerBlock, TransformerConfig};
pub use layers::basic::{Dropout, Flatten, GELUTanh, Lambda, LeakyReLU, ReLU, Sigmoid, Tanh, GELU};
pub use layers::conv::{AvgPool2d, Conv2d, Conv2dConfig, MaxPool2d};
pub use layers::linear::{Embedding, EmbeddingConfig, Linear, LinearConfig, Lora};
pub use layers::norm::{
    BatchNorm1d, BatchNorm2d, BatchNormConfig, LayerNorm, LayerNormConfig, RMSNorm, RMSNormConfig,
};
pub use layers::rnn::{GRUCell, LSTMCell, RNNCell, RnnConfig, RnnOutput, GRU, LSTM, RNN};
pub use layers::sequential::Sequential;
pub use models::bert::{Bert, BertConfig, BertInput};
pub use models::gpt::{Gpt, GptConfig, Sampling};
pub use models::gpt2::{Gpt2, Gpt2Activation, Gpt2Config};
pub use models::llama::{Llama, LlamaConfig};
pub use models::resnet::ResNet;
pub use models::{generate, Activation, CausalLm};
pub use module::{Module, Slot, Visitor};
pub use spatial::{
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, Conv1d, ConvTranspose1d, ConvTranspose1dConfig,
    ConvTranspose2d, ConvTransposeConfig, GroupNorm, InstanceNorm2d, Interpolation, Resize,
    Upsample,
};

// The derive's generated code names this crate `::arenagrad_nn`, here as in other crates.
extern crate self as arenagrad_nn;

/// The names a training program needs. Its [`Result`] is nn's, whose error
/// defaults to [`NnError`] (a second parameter names another: `Result<(), Box<dyn Error>>`).
pub mod prelude {
    #[cfg(feature = "checkpoint")]
    pub use crate::checkpoint;
    pub use crate::data::Dataset;
    pub use crate::loss;
    pub use crate::metrics;
    pub use crate::optim::{
        clip_grad_norm, Adam, AdamConfig, AdamW, CosineAnnealingLr, LrSchedule, Optimizer,
        ParamGroup, Sgd, SgdConfig, StepLr, WarmupCosineLr,
    };
    pub use crate::{
        AvgPool2d, BatchNorm1d, BatchNorm2d, CausalLm, Conv2d, Conv2dConfig, DType, Dropout,
        Embedding, Flatten, GRUCell, Gpt, Gpt2, Gpt2Config, GptConfig, Graph, Hooked, HostTensor,
        LSTMCell, LayerNorm, LeakyReLU, Linear, LinearConfig, MaxPool2d, Module,
        MultiheadAttention, NnError, Nonlinearity, Parameter, RMSNorm, RNNCell, ReLU, Result, Rng,
        RnnConfig, Sequential, Sigmoid, Tanh, Tensor, TransformerBlock, TransformerConfig, GELU,
        GRU, LSTM, RNN,
    };
    pub use arenagrad_graph::AttentionOptions;
}
