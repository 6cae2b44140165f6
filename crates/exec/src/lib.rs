//! Kernels for arenagrad.
//!
//! This crate knows nothing of graphs or gradients: it turns slices and shapes into slices. The
//! graph crate checks every shape, allocates the output from the iteration's arena and calls one
//! function here.
//!
//! The front door is [`ops`]: the tables of elementwise ops ([`UnaryOp`], [`BinaryOp`]) and
//! reductions ([`ReduceOp`]). A row holds the op's name, its CPU forward, its derivative, its
//! valid domain and the CUDA C of both, side by side; the CPU loops, the CUDA kernel source, the
//! graph's backward rules, the text format and the tests all read the rows, so a new
//! elementwise op or reduction is one row (and a forgotten rule does not compile). The other
//! kernels are grouped by what they do (`cpu::matmul`, `cpu::conv`, `cpu::attention`,
//! `cpu::rnn`, `cpu::shape`, …); an op's kernel carries the op's name, and takes its operands as
//! values of [`cpu::operand`]'s types (data with its shape and strides) rather than loose
//! pointers and sizes.
//!
//! * Elementwise and reduction loops are written so that the compiler vectorises them, and hot
//!   ones run through [`cpu::wide()`] in an AVX-512 or AVX2 build when the CPU has one; `tanh` and
//!   `exp` in `f32` have branch-free versions ([`cpu::fastmath`]) because libm's are scalar calls.
//! * Matmul goes through strided GEMM kernels (the `gemm` crate's; matrixmultiply's under Miri):
//!   transposes are strides (a small product copies a transposed right operand once, which costs
//!   less than the kernel's repacking).
//! * Large work is split across the number of threads the caller passes, on the parked workers
//!   of [`cpu::thread_pool`] (one pool per process, started on first use).
//! * With the `cuda` feature, `cuda` runs the same kernels on an NVIDIA GPU: CUDA C compiled
//!   at run time with NVRTC, matrix products through cuBLAS, memory from the block cache of
//!   `arenagrad-alloc`. The CUDA libraries are loaded at run time, so the feature builds without
//!   them.
//! * [`testing`] lets a test that needs what a machine may lack (a GPU, a compiler, a data
//!   package) skip visibly, or fail where a switch says the machine has it.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod float;
pub mod layout;
pub mod ops;
pub mod testing;

pub use cpu::cast::{bf16, f16, Bool, Storage};
pub use float::{DType, Float};

pub use ops::{BinaryOp, Domain, Positive, ReduceOp, UnaryOp};
