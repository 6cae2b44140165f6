//! Kernels for arenagrad.
//!
//! This crate knows nothing of graphs or gradients: it turns slices and shapes into slices. The
//! graph crate checks every shape, allocates the output from the iteration's arena and calls one
//! function here. Kernels are grouped by what they do (`cpu::elementwise`, `cpu::reduce`,
//! `cpu::matmul`, `cpu::shape`); an op's kernel carries the op's name.
//!
//! * Elementwise and reduction loops are written so that the compiler vectorises them, and hot
//!   ones run through [`cpu::wide()`] in an AVX-512 or AVX2 build when the CPU has one; `tanh` and
//!   `exp` in `f32` have branch-free versions ([`cpu::fastmath`]) because libm's are scalar calls.
//! * Matmul goes through strided GEMM kernels (the `gemm` crate's; matrixmultiply's under Miri):
//!   transposes are strides (a small product copies a transposed right operand once, which costs
//!   less than the kernel's repacking).
//! * Large work is split across the number of threads the caller passes — no global pool.
//! * With the `cuda` feature, `cuda` runs the same kernels on an NVIDIA GPU: CUDA C compiled
//!   at run time with NVRTC, matrix products through cuBLAS, memory from the block cache of
//!   `arenagrad-alloc`. The CUDA libraries are loaded at run time, so the feature builds without
//!   them.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod float;
pub mod layout;

pub use float::{DType, Float};

/// Elementwise functions of one tensor. Scalar parameters travel as `f64` and are rounded to the
/// element type by the kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryOp {
    /// -x
    Neg,
    /// e^x
    Exp,
    /// ln x
    Log,
    /// √x
    Sqrt,
    /// |x|
    Abs,
    /// sin x
    Sin,
    /// cos x
    Cos,
    /// tanh x
    Tanh,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// max(x, 0); NaN stays NaN (PyTorch's rule: a diverging run must not look healthy).
    Relu,
    /// GELU, tanh approximation.
    Gelu,
    /// The derivative of [`UnaryOp::Gelu`] (used by its second-order rule).
    GeluGrad,
    /// sign(x) ∈ {-1, 0, 1}; 0 for NaN (as PyTorch's `sign`).
    Sign,
    /// 0 where x ≤ 0, else 1 (NaN included): relu's derivative as a value.
    Step,
    /// x · s
    Scale(f64),
    /// x + s
    Shift(f64),
    /// x^p
    Powf(f64),
}

/// Every unary op, with scalars and powers that exercise their cases (for tests that go
/// through all of them).
#[cfg(test)]
pub(crate) const ALL_UNARY_OPS: [UnaryOp; 19] = [
    UnaryOp::Neg,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Abs,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::GeluGrad,
    UnaryOp::Sign,
    UnaryOp::Step,
    UnaryOp::Scale(-1.7),
    UnaryOp::Shift(0.3),
    UnaryOp::Powf(2.0),
    UnaryOp::Powf(3.0),
    UnaryOp::Powf(0.7),
];

impl UnaryOp {
    /// The op's name as the program format spells it.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Abs => "abs",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluGrad => "gelu_grad",
            UnaryOp::Sign => "sign",
            UnaryOp::Step => "step",
            UnaryOp::Scale(_) => "scale",
            UnaryOp::Shift(_) => "shift",
            UnaryOp::Powf(_) => "powf",
        }
    }
}

/// Elementwise functions of two broadcast tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a · b
    Mul,
    /// a / b
    Div,
    /// a^b
    Pow,
    /// max(a, b)
    Maximum,
    /// min(a, b)
    Minimum,
    /// 0 where a < b, ½ where a = b, else 1 (a NaN on either side included): how
    /// `maximum`/`minimum` split their gradient, as PyTorch does.
    GtMask,
    /// 1 where a = b or both are NaN, else 0 (how a max reduction finds its maxima).
    EqMask,
}

impl BinaryOp {
    /// The op's name as the program format spells it.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::GtMask => "gt_mask",
            BinaryOp::EqMask => "eq_mask",
        }
    }
}
