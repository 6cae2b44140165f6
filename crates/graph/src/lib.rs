//! arenagrad's graph: tensors, the op set, and reverse-mode automatic differentiation.
//!
//! An iteration builds a graph eagerly: each op checks its operands, allocates its output from
//! the [`Graph`]'s bump arena, runs its kernel, and — when an input requires grad and grad mode is
//! on — records a node. Nodes live in a generational slot map and point at their inputs by
//! [`NodeId`], never by reference, so a graph cannot form the reference cycles that make
//! ref-counted graphs leak. [`Graph::reset`] frees the whole iteration (nodes and buffers) at once,
//! whether or not backward ran.
//!
//! * [`Tensor`] — a `Copy` handle borrowing the graph: it cannot outlive the iteration.
//! * [`Tensor::backward`] / [`BackwardOptions`] — PyTorch semantics: the graph is consumed unless
//!   `retain_graph`; `create_graph` records the backward for higher-order gradients; gradients
//!   accumulate into leaves and [`Parameter`]s until cleared.
//! * [`Graph::no_grad`], [`Tensor::detach`] — stop recording.
//! * [`Parameter`] — values that persist across iterations (outside the arena).
//!
//! ```
//! use arenagrad_graph::{DType, Graph};
//! let g = Graph::new();
//! let x = g.leaf(&[0.5, -1.0, 2.0], &[3], DType::F64).unwrap();
//! let y = (x * x).sum().unwrap(); // Σ x²
//! y.backward().unwrap();
//! assert_eq!(x.grad().unwrap().unwrap().to_vec::<f64>().unwrap(), vec![1.0, -2.0, 4.0]);
//! ```
#![forbid(unsafe_code)]
// `a.add(b)?` returns a Result while `a + b` panics: both forms are deliberate (see `overload`).
#![allow(clippy::should_implement_trait)]

/// Runs a block with `$T` bound to the Rust type of an arithmetic [`DType`] (`f32`, `f64`). The
/// 16-bit dtypes compute in `f32` by running an op on widened copies of their operands (see
/// `ops::half`) and never reach a kernel's block: if one did, the enclosing function returns
/// [`GraphError::UnsupportedDType`].
#[macro_export]
#[doc(hidden)]
macro_rules! with_float {
    ($dt:expr, $T:ident, $body:block) => {
        match $dt {
            dtype @ ($crate::DType::BF16
            | $crate::DType::F16
            | $crate::DType::I64
            | $crate::DType::I32
            | $crate::DType::U8
            | $crate::DType::Bool) => {
                return Err($crate::GraphError::UnsupportedDType {
                    op: "kernel",
                    dtype,
                }
                .into())
            }
            $crate::DType::F32 => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }
        }
    };
}

/// Runs a block with `$T` bound to the Rust type that stores a [`DType`] (any of them).
#[macro_export]
#[doc(hidden)]
macro_rules! with_storage {
    ($dt:expr, $T:ident, $body:block) => {
        match $dt {
            $crate::DType::F32 => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }
            $crate::DType::BF16 => {
                #[allow(dead_code)]
                type $T = $crate::exec::bf16;
                $body
            }
            $crate::DType::F16 => {
                #[allow(dead_code)]
                type $T = $crate::exec::f16;
                $body
            }
            $crate::DType::I64 => {
                #[allow(dead_code)]
                type $T = i64;
                $body
            }
            $crate::DType::I32 => {
                #[allow(dead_code)]
                type $T = i32;
                $body
            }
            $crate::DType::U8 => {
                #[allow(dead_code)]
                type $T = u8;
                $body
            }
            $crate::DType::Bool => {
                #[allow(dead_code)]
                type $T = $crate::exec::Bool;
                $body
            }
        }
    };
}

/// Runs a block with `$T` bound to the Rust type of a 16-bit [`DType`] (`bf16`, `f16`); any
/// other dtype makes the enclosing function return [`GraphError::UnsupportedDType`].
#[macro_export]
#[doc(hidden)]
macro_rules! with_half {
    ($dt:expr, $T:ident, $body:block) => {
        match $dt {
            $crate::DType::BF16 => {
                #[allow(dead_code)]
                type $T = $crate::exec::bf16;
                $body
            }
            $crate::DType::F16 => {
                #[allow(dead_code)]
                type $T = $crate::exec::f16;
                $body
            }
            dtype => {
                return Err($crate::GraphError::UnsupportedDType {
                    op: "kernel",
                    dtype,
                }
                .into())
            }
        }
    };
}

mod autocast;
mod autodiff;
pub mod check;
mod device;
mod display;
mod error;
mod flops;
mod graph;
mod host;
mod ops;
mod overload;
mod param;
mod rng;
mod scope;
mod shape;
mod store;
mod tensor;
pub mod testing;

/// The kernels the graph runs, for applications that call one directly.
pub use arenagrad_exec as exec;
/// Converts a slice of one storage type into another (`f32`, `f64`, `bf16`, `f16`), rounding to
/// nearest even when narrowing, on up to `threads` threads: what an optimiser updating a 16-bit
/// parameter in f32, or a transport reducing a 16-bit buffer, converts with. See
/// [`arenagrad_exec::cpu::cast()`].
pub use arenagrad_exec::cpu::cast as convert;
/// A slice of any storage type widened to f32, and an update of one in f32 rounded back once:
/// see [`arenagrad_exec::cpu::cast::update_in_f32`].
pub use arenagrad_exec::cpu::cast::{update_in_f32, widened};
/// Runs a loop over parameters at the widest SIMD level the CPU has (optimisers' updates, which
/// work on host data outside any graph): see [`arenagrad_exec::cpu::wide()`].
pub use arenagrad_exec::cpu::wide;
pub use arenagrad_exec::{bf16, f16, BinaryOp, Bool, DType, Float, Storage, UnaryOp};
pub use autocast::{AutocastGuard, CastPolicy, AUTOCAST_OPS};
pub use autodiff::{grad, BackwardOptions};
pub use device::{
    check_device, cuda_device_count, empty_cache, memory_stats, reset_peak_stats, synchronize,
};
pub use error::{GraphError, Result, ShapeVec};
pub use flops::{FlopStats, OpFlops};
pub use graph::{
    default_threads, update_in_chunks, update_parts, Device, GradModeGuard, Graph, GraphStats,
    IterationId, NodeId,
};
pub use host::{HostData, HostDataMut, HostElem, HostTensor};
pub use ops::attention::AttentionOptions;
pub use ops::checkpoint::CheckpointFn;
pub use ops::custom::CustomOp;
pub use ops::einsum::einsum_shape;
pub use ops::integer::ScatterReduce;
pub use ops::rnn::LstmSequenceOptions;
pub use param::{ParamOutput, Parameter};
pub use rng::Rng;
pub use scope::Keep;
pub use shape::Shape;
pub use tensor::{Tensor, TensorId};

/// The element types kernels compute in: `f32` and `f64`. Tensors also store `bf16` and `f16`
/// ([`DType::BF16`], [`DType::F16`]), computed in `f32`; what reads or writes stored elements
/// takes any [`HostElem`].
pub trait Elem: Float + HostElem {}
impl<T: Float + HostElem> Elem for T {}
