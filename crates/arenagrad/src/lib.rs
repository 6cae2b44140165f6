//! # arenagrad
//!
//! An eager (define-by-run) automatic-differentiation and deep-learning engine, built so that a
//! training iteration's whole graph — nodes and intermediate buffers — lives in one arena and is
//! freed by one reset. Nodes sit in a generational slot map and refer to their inputs by id, so no
//! graph can leak through reference cycles, even one that never reaches backward, and a handle
//! from an ended iteration is a typed error rather than a read of someone else's data.
//!
//! ```
//! use arenagrad::prelude::*;
//!
//! let mut g = Graph::new();
//! let w = Parameter::new("w", HostTensor::new(vec![0.5f32, -0.25], &[2, 1]).unwrap());
//! for _ in 0..3 {
//!     let x = g.randn(&[8, 2], DType::F32).unwrap();
//!     let y = x.matmul(g.param(&w).unwrap()).unwrap().tanh().unwrap();
//!     let loss = y.mul(y).unwrap().mean().unwrap();
//!     loss.backward().unwrap();
//!     g.reset(); // frees the iteration; w keeps its accumulated gradient
//! }
//! assert_eq!(w.grad().unwrap().shape(), &[2, 1]);
//! ```
//!
//! The crates underneath, from the bottom: `arenagrad-alloc` (the host bump arena and the GPU
//! block cache), `arenagrad-exec` (kernels and the op tables), `arenagrad-graph` (tensors, ops,
//! autodiff), `arenagrad-nn` (modules, losses, optimisers), `arenagrad-dist` (`dist`:
//! data-parallel training) and `arenagrad-program` (feature `program`: tensor programs as text,
//! run, checked and generated; the `arenagrad` command-line tool is its binary).
//!
//! Features: `checkpoint` (default; `nn::checkpoint`, safetensors files), `program` (default),
//! `proptest` (`check::strategy`), `cuda` (CUDA devices), `mpi` and `nccl` (`dist`'s transports:
//! the system's Open MPI, NCCL loaded at run time). An application that only trains can
//! turn the defaults off: it then builds no JSON or command-line code.
#![forbid(unsafe_code)]

pub use arenagrad_alloc as alloc;
/// Data-parallel training over MPI (feature `mpi`) and NCCL (feature `nccl`).
pub use arenagrad_dist as dist;
pub use arenagrad_exec as exec;
pub use arenagrad_graph as graph;
pub use arenagrad_nn as nn;

pub use arenagrad_graph::{
    bf16, f16, grad, AttentionOptions, AutocastGuard, BackwardOptions, CastPolicy, CheckpointFn,
    CustomOp, DType, Device, FlopStats, Graph, GraphError, HostData, HostDataMut, HostTensor,
    LstmSequenceOptions, OpFlops, Parameter, Result, Tensor, TensorId, AUTOCAST_OPS,
};
pub use arenagrad_graph::{
    check_device, cuda_device_count, device_test, empty_cache, memory_stats, reset_peak_stats,
    synchronize,
};

/// Gradient checking against finite differences (`gradcheck`, `gradgradcheck`).
pub mod check {
    pub use arenagrad_graph::check::*;

    /// proptest strategies: shapes, broadcast pairs, tensors and well-typed random programs.
    #[cfg(feature = "proptest")]
    pub use arenagrad_program::strategy;
}

/// Tensor programs as text: parse, run, gradient-check, generate, fuzz.
#[cfg(feature = "program")]
pub use arenagrad_program as program;

/// The names most programs need.
///
/// One `use arenagrad::prelude::*;` brings what a training loop needs: graphs and tensors, and
/// nn's modules, losses, metrics, optimisers, schedules, checkpoints and datasets.
///
/// ```
/// use arenagrad::prelude::*;
///
/// let mut rng = Rng::seed(0);
/// let model = Sequential::new().add(Linear::new(4, 2, &mut rng)?).add(ReLU);
/// let mut opt = Adam::new(model.parameters(), AdamConfig::new(1e-3))?;
/// let mut g = Graph::new();
/// let x = g.randn(&[8, 4], DType::F32)?;
/// let l = loss::cross_entropy(model.forward(&g, x)?, &[0, 1, 0, 1, 0, 1, 0, 1])?;
/// l.backward()?;
/// // Reset, then step: the gradients live in the parameters, not the graph. Stepping first works
/// // too, but while a graph still holds a parameter's value the step copies it before writing
/// // (the graph must not see its inputs change); after the reset it writes in place.
/// g.reset();
/// opt.step()?;
/// opt.zero_grad();
/// # Ok::<(), NnError>(())
/// ```
pub mod prelude {
    pub use arenagrad_graph::{
        BackwardOptions, DType, Device, Graph, GraphError, HostData, HostDataMut, HostTensor,
        Parameter, Tensor,
    };
    pub use arenagrad_nn::prelude::*;
}

/// The crate's README, whose example is compiled and run as a doctest so that it cannot rot
/// (the repository's README shows the same example, held to it by a test).
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctest;
