//! The op tables: one row per elementwise op and per reduction, and everything else comes from
//! the rows — the [`UnaryOp`]/[`BinaryOp`]/[`ReduceOp`] enums, their names and lists, the CPU
//! kernels' per-op closures (`cpu::elementwise` and `cpu::reduce` run them), the CUDA op codes
//! and `switch` cases prepended to the kernel source ([`cuda_defines`]), and what random
//! programs need to know (domain, positivity, smoothness). So the CPU and CUDA codes cannot
//! drift, and a derivative is written once per language. The macros that read the rows are in
//! `table.rs`.
//!
//! Adding a unary op: a row here; its `create_graph` rule (the derivative in differentiable
//! tensor ops) in `arenagrad-graph`'s `ops/unary.rs`, whose match does not compile until it has
//! one; and a test. The program format, its generator and the CUDA kernels pick the row up.
//!
//! Adding a reduction: a row of the reduction table (identity and step, for the CPU and in CUDA
//! C); `cpu::reduce`, the CUDA reduction kernels and their tests pick it up. `arenagrad-graph`
//! then needs its derivative and its backward flop count, whose matches do not compile until
//! they have one.
//!
//! The numbers the CUDA kernels share with Rust (threads per block, `MAX_DIMS`, GELU's and
//! softplus's constants, dropout's hash multipliers) are listed in `CUDA_CONSTANTS` and reach
//! the kernels as `#define`s from [`cuda_defines`]; the `.cu` files only name them.

mod table;

use crate::Float;
use table::{binary_table, reduce_table, unary_table};

/// Where an op's operand must lie for the op (and its derivative) to be defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// Any value.
    All,
    /// Positive values only (`log`, `sqrt`, fractional powers).
    Positive,
}

/// Whether an op's output is positive (random programs feed `log` and `sqrt` from such ops).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positive {
    /// Not in general.
    Never,
    /// Always.
    Always,
    /// When its operand is (both operands, for a binary op).
    IfInput,
    /// When either operand is.
    IfEither,
}

/// A kernel that runs a unary op's forward, given as a closure ([`UnaryOp::with_forward`]).
pub trait UnaryKernel<T: Float> {
    /// What the kernel returns.
    type Out;
    /// Runs the kernel with `f`, the op on one element.
    fn run<F: Fn(T) -> T + Sync + Copy>(self, f: F) -> Self::Out;
}

/// A kernel that runs a unary op's derivative ([`UnaryOp::with_grad`]).
pub trait UnaryGradKernel<T: Float> {
    /// What the kernel returns.
    type Out;
    /// Runs the kernel with `f(x, y, g) = g · op'(x)`, where `y = op(x)`.
    fn run<F: Fn(T, T, T) -> T + Sync + Copy>(self, f: F) -> Self::Out;
}

/// A kernel that runs a binary op ([`BinaryOp::with_fn`]).
pub trait BinaryKernel<T: Float> {
    /// What the kernel returns.
    type Out;
    /// Runs the kernel with `f`, the op on one pair.
    fn run<F: Fn(T, T) -> T + Sync + Copy>(self, f: F) -> Self::Out;
}

/// A kernel that runs a reduction ([`ReduceOp::with_combine`]).
pub trait ReduceKernel<T: Float> {
    /// What the kernel returns.
    type Out;
    /// Runs the kernel with the reduction's `identity` (the result over nothing) and `f`, one
    /// step `f(acc, v)`.
    fn run<F: Fn(T, T) -> T + Sync + Copy>(self, identity: T, f: F) -> Self::Out;
}

/// Threads per block of every CUDA launch (`BLOCK` in the kernels, whose block reductions are
/// sized by it).
pub(crate) const CUDA_BLOCK: u32 = 256;
/// The most dimensions a strided CUDA kernel takes, after merging the dimensions that are
/// contiguous for every operand (`MAX_DIMS` in the kernels and their parameter structs).
pub(crate) const CUDA_MAX_DIMS: usize = 8;

/// √(2/π), in GELU's tanh approximation.
pub const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of GELU's tanh approximation.
pub const GELU_C: f64 = 0.044_715;
/// 1/√2, exact GELU's argument scale: `Φ(x) = ½(1 + erf(x/√2))`.
pub const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// 1/√(2π), the standard normal density's peak.
pub const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;
/// 2/√π, erf's slope at 0.
pub const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;
/// Above this, softplus is `x` (PyTorch's default threshold).
pub const SOFTPLUS_THRESHOLD: f64 = 20.0;

/// `x^p` as PyTorch computes a power with a scalar exponent: `x` itself for 1, products for 2
/// and 3, reciprocals for −1 and −2, `±0.5` through the square root (so `(-inf)^0.5` is NaN,
/// not C's `+inf`), every other exponent through `pow`. The products are what PyTorch's CPU
/// kernel computes (`x·x`, `x·x·x`, `1/(x·x)`); they are also why a square's backward,
/// `g·2·x^1`, costs a multiply per element rather than a call of `pow` (8 times slower on a
/// `ConvTranspose2d`'s 1.6 million outputs).
#[inline(always)]
pub(crate) fn pow_scalar<T: Float>(x: T, p: f64) -> T {
    if p == 1.0 {
        x
    } else if p == 2.0 {
        x * x
    } else if p == 3.0 {
        x * x * x
    } else if p == -1.0 {
        T::ONE / x
    } else if p == -2.0 {
        T::ONE / (x * x)
    } else if p == 0.5 {
        x.sqrt()
    } else if p == -0.5 {
        T::ONE / x.sqrt()
    } else {
        x.powf(T::from_f64(p))
    }
}

/// 1 / (1 + e^-x), stable on both tails: never exponentiates a large positive number.
#[inline(always)]
pub(crate) fn sigmoid<T: Float>(x: T) -> T {
    // e^−|x| never overflows; both halves share it and the select is a blend, so that a loop
    // of it vectorises (`exp_lanes`: no libm call per element).
    let e = (-x.abs()).exp_lanes();
    let r = T::ONE / (T::ONE + e);
    if x >= T::ZERO {
        r
    } else {
        e * r
    }
}

/// Exact GELU, `x·Φ(x)`.
#[inline(always)]
fn gelu_erf<T: Float>(x: T) -> T {
    x * x.normal_cdf_lanes().0
}

/// Exact GELU's derivative, `Φ(x) + x·φ(x)`.
#[inline(always)]
fn gelu_erf_grad<T: Float>(x: T) -> T {
    let (cdf, e) = x.normal_cdf_lanes();
    cdf + x * T::from_f64(FRAC_1_SQRT_2PI) * e
}

#[inline(always)]
fn gelu<T: Float>(x: T) -> T {
    let c = T::from_f64(SQRT_2_OVER_PI);
    let u = c * (x + T::from_f64(GELU_C) * x * x * x);
    T::from_f64(0.5) * x * (T::ONE + u.tanh_lanes())
}

#[inline(always)]
fn gelu_grad<T: Float>(x: T) -> T {
    let c = T::from_f64(SQRT_2_OVER_PI);
    let k = T::from_f64(GELU_C);
    let t = (c * (x + k * x * x * x)).tanh_lanes();
    let half = T::from_f64(0.5);
    half * (T::ONE + t) + half * x * (T::ONE - t * t) * c * (T::ONE + T::from_f64(3.0) * k * x * x)
}

/// -1, 0 or 1 by the sign of `v` (0 for NaN); `d|x|/dx` times `g`, with 0 at 0.
#[inline(always)]
fn signed<T: Float>(v: T, g: T) -> T {
    if v > T::ZERO {
        g
    } else if v < T::ZERO {
        -g
    } else {
        T::ZERO
    }
}

unary_table! {
    /// -x
    Neg => "neg" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Never,
        cpu: |x| -x,
        grad: |_, _, g| -g,
        cuda: "-x",
        cuda_grad: "-g",
    }
    /// e^x
    Exp => "exp" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Always,
        cpu: |x| x.exp(),
        grad: |_, y, g| g * y,
        cuda: "M<T>::exp_(x)",
        cuda_grad: "g * y",
    }
    /// ln x
    Log => "log" {
        public: true, smooth: true, domain: Domain::Positive, positive: Positive::Never,
        cpu: |x| x.ln(),
        grad: |x, _, g| g / x,
        cuda: "M<T>::log_(x)",
        cuda_grad: "g / x",
    }
    /// √x
    Sqrt => "sqrt" {
        public: true, smooth: true, domain: Domain::Positive, positive: Positive::IfInput,
        cpu: |x| x.sqrt(),
        grad: |_, y, g| g * T::from_f64(0.5) / y,
        cuda: "M<T>::sqrt_(x)",
        cuda_grad: "g * (T)0.5 / y",
    }
    /// |x|; its derivative is 0 at 0 (PyTorch's).
    Abs => "abs" {
        public: true, smooth: false, domain: Domain::All, positive: Positive::Never,
        cpu: |x| x.abs(),
        grad: |x, _, g| signed(x, g),
        cuda: "M<T>::abs_(x)",
        cuda_grad: "x > (T)0 ? g : (x < (T)0 ? -g : (T)0)",
    }
    /// sin x
    Sin => "sin" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Never,
        cpu: |x| x.sin(),
        grad: |x, _, g| g * x.cos(),
        cuda: "M<T>::sin_(x)",
        cuda_grad: "g * M<T>::cos_(x)",
    }
    /// cos x
    Cos => "cos" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Never,
        cpu: |x| x.cos(),
        grad: |x, _, g| -(g * x.sin()),
        cuda: "M<T>::cos_(x)",
        cuda_grad: "-(g * M<T>::sin_(x))",
    }
    /// tanh x
    Tanh => "tanh" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Never,
        cpu: |x| x.tanh(),
        grad: |_, y, g| g * (T::ONE - y * y),
        cuda: "M<T>::tanh_(x)",
        cuda_grad: "g * ((T)1 - y * y)",
    }
    /// 1 / (1 + e^-x)
    Sigmoid => "sigmoid" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Always,
        cpu: |x| sigmoid(x),
        grad: |_, y, g| g * y * (T::ONE - y),
        cuda: "sigmoid_(x)",
        cuda_grad: "g * y * ((T)1 - y)",
    }
    /// max(x, 0); NaN stays NaN and the derivative at 0 is 0 (PyTorch's rules: a diverging run
    /// must not look healthy).
    Relu => "relu" {
        public: true, smooth: false, domain: Domain::All, positive: Positive::Never,
        // `x < 0`, so that NaN stays NaN and −0 stays −0.
        cpu: |x| if x < T::ZERO { T::ZERO } else { x },
        grad: |x, _, g| if x <= T::ZERO { T::ZERO } else { g },
        cuda: "x < (T)0 ? (T)0 : x",
        cuda_grad: "x <= (T)0 ? (T)0 : g",
    }
    /// GELU, exact: x·Φ(x) = ½x(1 + erf(x/√2)) (PyTorch's default `gelu`).
    Gelu => "gelu" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Never,
        cpu: |x| gelu_erf(x),
        grad: |x, _, g| g * gelu_erf_grad(x),
        cuda: "gelu_erf_(x)",
        cuda_grad: "g * gelu_erf_grad_(x)",
    }
    /// GELU, tanh approximation: ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (PyTorch's
    /// `gelu(x, approximate="tanh")`).
    GeluTanh => "gelu_tanh" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Never,
        cpu: |x| gelu(x),
        grad: |x, _, g| g * gelu_grad(x),
        cuda: "gelu_(x)",
        cuda_grad: "g * gelu_grad_(x)",
    }
    /// SiLU (swish): x · σ(x).
    Silu => "silu" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Never,
        cpu: |x| x * sigmoid(x),
        grad: |x, _, g| {
            let s = sigmoid(x);
            g * s * (T::ONE + x * (T::ONE - s))
        },
        cuda: "x * sigmoid_(x)",
        cuda_grad: "g * sigmoid_(x) * ((T)1 + x * ((T)1 - sigmoid_(x)))",
    }
    /// softplus: ln(1 + e^x), and `x` itself above 20 (PyTorch's default threshold, β = 1).
    Softplus => "softplus" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Always,
        cpu: |x| if x > T::from_f64(SOFTPLUS_THRESHOLD) { x } else { x.exp().ln_1p() },
        grad: |x, _, g| if x > T::from_f64(SOFTPLUS_THRESHOLD) { g } else { g * sigmoid(x) },
        cuda: "x > (T)SOFTPLUS_THRESHOLD ? x : M<T>::log1p_(M<T>::exp_(x))",
        cuda_grad: "x > (T)SOFTPLUS_THRESHOLD ? g : g * sigmoid_(x)",
    }
    /// The error function, erf x = 2/√π ∫₀ˣ e^(−t²) dt.
    Erf => "erf" {
        public: true, smooth: true, domain: Domain::All, positive: Positive::Never,
        cpu: |x| x.erf(),
        grad: |x, _, g| g * T::from_f64(TWO_OVER_SQRT_PI) * (-(x * x)).exp_lanes(),
        cuda: "M<T>::erf_(x)",
        cuda_grad: "g * (T)TWO_OVER_SQRT_PI * M<T>::exp_(-(x * x))",
    }
    /// sign(x) ∈ {-1, 0, 1}; 0 for NaN (as PyTorch's `sign`). Piecewise constant: no gradient.
    Sign => "sign" {
        public: false, smooth: false, domain: Domain::All, positive: Positive::Never,
        cpu: |x| signed(x, T::ONE),
        grad: |_, _, _| T::ZERO,
        cuda: "x > (T)0 ? (T)1 : (x < (T)0 ? (T)-1 : (T)0)",
        cuda_grad: "(T)0",
    }
    /// 0 where x ≤ 0, else 1 (NaN included): relu's derivative as a value (PyTorch's
    /// `threshold_backward` passes the gradient through a NaN). Piecewise constant.
    Step => "step" {
        public: false, smooth: false, domain: Domain::All, positive: Positive::Never,
        cpu: |x| if x <= T::ZERO { T::ZERO } else { T::ONE },
        grad: |_, _, _| T::ZERO,
        cuda: "x <= (T)0 ? (T)0 : (T)1",
        cuda_grad: "(T)0",
    }
    /// x · p
    Scale(p) samples [-1.7, 0.5] => "scale" {
        public: true, smooth: true, domain: Domain::All,
        positive: if p > 0.0 { Positive::IfInput } else { Positive::Never },
        cpu: |x| x * T::from_f64(p),
        grad: |_, _, g| g * T::from_f64(p),
        cuda: "x * (T)p",
        cuda_grad: "g * (T)p",
    }
    /// x + p
    Shift(p) samples [0.3] => "shift" {
        public: true, smooth: true, domain: Domain::All,
        positive: if p > 0.0 { Positive::IfInput } else { Positive::Never },
        cpu: |x| x + T::from_f64(p),
        grad: |_, _, g| g,
        cuda: "x + (T)p",
        cuda_grad: "g",
    }
    /// x^p. `±0.5` go through the square root (PyTorch's rule); x⁰'s derivative is 0
    /// everywhere, also where `0·x⁻¹` would be NaN.
    Powf(p) samples [2.0, 3.0, 0.7, 0.0, -0.5, 1.0, -1.0, -2.0] => "powf" {
        public: true, smooth: true,
        domain: if p.fract() == 0.0 && p >= 0.0 { Domain::All } else { Domain::Positive },
        positive: Positive::IfInput,
        cpu: |x| pow_scalar(x, p),
        grad: |x, _, g| if p == 0.0 { T::ZERO } else { g * T::from_f64(p) * pow_scalar(x, p - 1.0) },
        cuda: "pow_scalar_(x, p)",
        cuda_grad: "p == 0.0 ? (T)0 : g * (T)p * pow_scalar_(x, p - 1.0)",
    }
}

binary_table! {
    /// a + b
    Add => "add" {
        public: true, smooth: true, domain: (Domain::All, Domain::All),
        positive: Positive::IfInput,
        grad: true,
        cpu: |a, b| a + b,
        cuda: "a + b",
    }
    /// a - b
    Sub => "sub" {
        public: true, smooth: true, domain: (Domain::All, Domain::All),
        positive: Positive::Never,
        grad: true,
        cpu: |a, b| a - b,
        cuda: "a - b",
    }
    /// a · b
    Mul => "mul" {
        public: true, smooth: true, domain: (Domain::All, Domain::All),
        positive: Positive::IfInput,
        grad: true,
        cpu: |a, b| a * b,
        cuda: "a * b",
    }
    /// a / b
    Div => "div" {
        public: true, smooth: true, domain: (Domain::All, Domain::Positive),
        positive: Positive::IfInput,
        grad: true,
        cpu: |a, b| a / b,
        cuda: "a / b",
    }
    /// a^b
    Pow => "pow" {
        public: true, smooth: true, domain: (Domain::Positive, Domain::All),
        positive: Positive::Always,
        grad: true,
        cpu: |a, b| a.powf(b),
        cuda: "M<T>::pow_(a, b)",
    }
    /// max(a, b); NaN on either side wins.
    Maximum => "maximum" {
        public: true, smooth: false, domain: (Domain::All, Domain::All),
        positive: Positive::IfEither,
        grad: true,
        cpu: |a, b| a.max(b),
        cuda: "fmax_(a, b)",
    }
    /// min(a, b); NaN on either side wins.
    Minimum => "minimum" {
        public: true, smooth: false, domain: (Domain::All, Domain::All),
        positive: Positive::IfInput,
        grad: true,
        cpu: |a, b| a.min(b),
        cuda: "fmin_(a, b)",
    }
    /// 1 where a = b, else 0 (NaN equals nothing, itself included). No gradient.
    Eq => "eq" {
        public: true, smooth: false, domain: (Domain::All, Domain::All),
        positive: Positive::Never,
        grad: false,
        cpu: |a, b| if a == b { T::ONE } else { T::ZERO },
        cuda: "a == b ? (T)1 : (T)0",
    }
    /// 1 where a ≠ b (a NaN on either side included), else 0. No gradient.
    Ne => "ne" {
        public: true, smooth: false, domain: (Domain::All, Domain::All),
        positive: Positive::Never,
        grad: false,
        cpu: |a, b| if a != b { T::ONE } else { T::ZERO },
        cuda: "a != b ? (T)1 : (T)0",
    }
    /// 1 where a < b, else 0 (0 where either is NaN). No gradient.
    Lt => "lt" {
        public: true, smooth: false, domain: (Domain::All, Domain::All),
        positive: Positive::Never,
        grad: false,
        cpu: |a, b| if a < b { T::ONE } else { T::ZERO },
        cuda: "a < b ? (T)1 : (T)0",
    }
    /// 1 where a ≤ b, else 0 (0 where either is NaN). No gradient.
    Le => "le" {
        public: true, smooth: false, domain: (Domain::All, Domain::All),
        positive: Positive::Never,
        grad: false,
        cpu: |a, b| if a <= b { T::ONE } else { T::ZERO },
        cuda: "a <= b ? (T)1 : (T)0",
    }
    /// 1 where a > b, else 0 (0 where either is NaN). No gradient.
    Gt => "gt" {
        public: true, smooth: false, domain: (Domain::All, Domain::All),
        positive: Positive::Never,
        grad: false,
        cpu: |a, b| if a > b { T::ONE } else { T::ZERO },
        cuda: "a > b ? (T)1 : (T)0",
    }
    /// 1 where a ≥ b, else 0 (0 where either is NaN). No gradient.
    Ge => "ge" {
        public: true, smooth: false, domain: (Domain::All, Domain::All),
        positive: Positive::Never,
        grad: false,
        cpu: |a, b| if a >= b { T::ONE } else { T::ZERO },
        cuda: "a >= b ? (T)1 : (T)0",
    }
    /// 0 where a < b, ½ where a = b, else 1 (a NaN on either side included): how
    /// `maximum`/`minimum` split their gradient, as PyTorch does.
    GtMask => "gt_mask" {
        public: false, smooth: false, domain: (Domain::All, Domain::All),
        positive: Positive::Never,
        grad: false,
        cpu: |a, b| if a < b { T::ZERO } else if a == b { T::from_f64(0.5) } else { T::ONE },
        cuda: "a < b ? (T)0 : (a == b ? (T)0.5 : (T)1)",
    }
    /// 1 where a = b or both are NaN, else 0 (how a max reduction finds its maxima, NaN among
    /// them).
    EqMask => "eq_mask" {
        public: false, smooth: false, domain: (Domain::All, Domain::All),
        positive: Positive::Never,
        grad: false,
        cpu: |a, b| if a == b || (a != a && b != b) { T::ONE } else { T::ZERO },
        cuda: "(a == b || (a != a && b != b)) ? (T)1 : (T)0",
    }
}

reduce_table! {
    /// Sum.
    Sum => "sum" {
        identity: T::ZERO,
        combine: |acc, v| acc + v,
        cuda_identity: "(T)0",
        cuda_combine: "acc + v",
    }
    /// Maximum (NaN propagates).
    Max => "max" {
        identity: T::neg_infinity(),
        combine: |acc, v| acc.max(v),
        cuda_identity: "M<T>::neg_inf()",
        cuda_combine: "fmax_(acc, v)",
    }
}

/// A number the CUDA kernels share with the Rust code.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum CudaConst {
    /// An integer (a size).
    Int(u64),
    /// A real, written so that C reads back the same `double`.
    Real(f64),
    /// A 32-bit unsigned integer (a hash multiplier), written in hex as an `unsigned int`.
    U32(u32),
}

/// The numbers the CUDA kernels share with the Rust code, by the name the kernels use: written
/// into the kernel source as `#define`s by [`cuda_defines`], so no `.cu` file spells them. Each
/// value is defined once in Rust: the sizes and the math constants here, dropout's hash
/// multipliers in `cpu::dropout`.
pub(crate) const CUDA_CONSTANTS: &[(&str, CudaConst)] = &[
    ("BLOCK", CudaConst::Int(CUDA_BLOCK as u64)),
    ("MAX_DIMS", CudaConst::Int(CUDA_MAX_DIMS as u64)),
    ("SQRT_2_OVER_PI", CudaConst::Real(SQRT_2_OVER_PI)),
    ("GELU_C", CudaConst::Real(GELU_C)),
    ("FRAC_1_SQRT_2", CudaConst::Real(FRAC_1_SQRT_2)),
    ("FRAC_1_SQRT_2PI", CudaConst::Real(FRAC_1_SQRT_2PI)),
    ("TWO_OVER_SQRT_PI", CudaConst::Real(TWO_OVER_SQRT_PI)),
    ("SOFTPLUS_THRESHOLD", CudaConst::Real(SOFTPLUS_THRESHOLD)),
    ("DROPOUT_MIX_1", CudaConst::U32(crate::cpu::dropout::MIX_1)),
    ("DROPOUT_MIX_2", CudaConst::U32(crate::cpu::dropout::MIX_2)),
    (
        "DROPOUT_HIGH_WORD",
        CudaConst::U32(crate::cpu::dropout::HIGH_WORD),
    ),
];

impl std::fmt::Display for CudaConst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaConst::Int(v) => write!(f, "{v}"),
            // `{:?}` is the shortest decimal that reads back as the same `f64`, with a point
            // (`20.0`), as C parses it.
            CudaConst::Real(v) => write!(f, "{v:?}"),
            CudaConst::U32(v) => write!(f, "{v:#010x}u"),
        }
    }
}

/// The head of the CUDA kernel source, generated from the Rust side: the shared numbers
/// (`CUDA_CONSTANTS`: `BLOCK`, `MAX_DIMS`, GELU's and softplus's constants, dropout's hash
/// multipliers) and the op tables' CUDA columns as C preprocessor definitions — the op codes
/// (`U_NEG`, `B_ADD`, `R_SUM`, ...) and the `switch` cases of the unary forward (`UNARY_CASES`,
/// in `x` and `p`), the unary derivative (`UNARY_GRAD_CASES`, in `x`, `y`, `g`, `p`), the binary
/// function (`BINARY_CASES`, in `a`, `b`) and the reductions' identity
/// (`REDUCE_IDENTITY_CASES`) and step (`REDUCE_COMBINE_CASES`, in `acc`, `v`).
///
/// The CUDA backend puts it before `prelude.cu`, `kernels.cu` and `fused.cu`
/// (`cuda::kernel_source`); the host test of the fused kernels (`tests/cuda_kernels_on_host.rs`)
/// does the same, which is why it is public.
pub fn cuda_defines() -> String {
    use std::fmt::Write;
    let mut s =
        String::from("// Generated from arenagrad_exec::ops (shared numbers, op tables).\n");
    for (name, value) in CUDA_CONSTANTS {
        let _ = writeln!(s, "#define {name} {value}");
    }
    let codes = [
        ("U", UNARY_CUDA.iter().map(|r| r.0).collect::<Vec<_>>()),
        ("B", BINARY_CUDA.iter().map(|r| r.0).collect()),
        ("R", REDUCE_CUDA.iter().map(|r| r.0).collect()),
    ];
    for (prefix, names) in codes {
        for (k, name) in names.iter().enumerate() {
            let _ = writeln!(s, "#define {prefix}_{} {k}", name.to_uppercase());
        }
    }
    let cases = [
        (
            "UNARY_CASES",
            UNARY_CUDA.iter().map(|r| r.1).collect::<Vec<_>>(),
        ),
        ("UNARY_GRAD_CASES", UNARY_CUDA.iter().map(|r| r.2).collect()),
        ("BINARY_CASES", BINARY_CUDA.iter().map(|r| r.1).collect()),
        (
            "REDUCE_IDENTITY_CASES",
            REDUCE_CUDA.iter().map(|r| r.1).collect(),
        ),
        (
            "REDUCE_COMBINE_CASES",
            REDUCE_CUDA.iter().map(|r| r.2).collect(),
        ),
    ];
    for (name, exprs) in cases {
        let _ = writeln!(s, "#define {name} \\");
        for (k, expr) in exprs.iter().enumerate() {
            let _ = writeln!(s, "    case {k}: return ({expr}); \\");
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel sources, read as text (so this runs without the `cuda` feature).
    const CU_FILES: [(&str, &str); 3] = [
        ("prelude.cu", include_str!("../cuda/prelude.cu")),
        ("kernels.cu", include_str!("../cuda/kernels.cu")),
        ("fused.cu", include_str!("../cuda/fused.cu")),
    ];

    /// The shared numbers come only from [`CUDA_CONSTANTS`]: no `.cu` file defines one of their
    /// names (`#define NAME`, `NAME = ...`), and neither the files nor the tables' CUDA columns
    /// spell a real one's decimal or a hash multiplier's hex digits; the generated head defines
    /// each once.
    #[test]
    #[cfg_attr(miri, ignore)] // text scans: no unsafe code, and far too slow interpreted
    fn no_cuda_source_spells_a_shared_constant() {
        let columns = UNARY_CUDA
            .iter()
            .flat_map(|r| [r.1, r.2])
            .chain(BINARY_CUDA.iter().map(|r| r.1))
            .chain(REDUCE_CUDA.iter().flat_map(|r| [r.1, r.2]))
            .map(|c| ("an op table's CUDA column", c));
        for (file, text) in CU_FILES.into_iter().chain(columns) {
            for line in text.lines() {
                let words: Vec<&str> = line
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '#'))
                    .filter(|w| !w.is_empty())
                    .collect();
                for (name, value) in CUDA_CONSTANTS {
                    let defined = words.windows(2).any(|w| w == ["#define", *name])
                        || line.contains(&format!("{name} ="));
                    assert!(!defined, "{file} defines {name}: {line}");
                    // A real's decimal, or a hash multiplier's hex digits in either case.
                    let spelled = match value {
                        CudaConst::Int(_) => continue,
                        CudaConst::Real(v) => format!("{v:?}"),
                        CudaConst::U32(v) => format!("{v:x}"),
                    };
                    assert!(
                        !line.to_ascii_lowercase().contains(&spelled),
                        "{file} spells {name} ({spelled}) instead of naming it: {line}"
                    );
                }
            }
        }
        let head = cuda_defines();
        for (name, value) in CUDA_CONSTANTS {
            let line = format!("#define {name} {value}\n");
            assert_eq!(head.matches(&line).count(), 1, "{line}");
        }
    }

    /// Each reduction's CPU identity is what its combine step leaves unchanged, and the CUDA
    /// head has an identity and a step for every row, at the row's code.
    #[test]
    #[cfg_attr(miri, ignore)] // text scans: no unsafe code, and far too slow interpreted
    fn reductions_follow_their_rows() {
        let head = cuda_defines();
        for (k, &op) in ReduceOp::KINDS.iter().enumerate() {
            assert_eq!(op.code(), k as u64);
            let id: f64 = op.identity();
            for v in [-3.5, 0.0, 2.25] {
                assert_eq!(op.combine(id, v), v, "{}: identity then {v}", op.name());
            }
            let name = op.name().to_uppercase();
            assert!(head.contains(&format!("#define R_{name} {k}\n")), "{name}");
            let (_, cuda_id, cuda_step) = REDUCE_CUDA[k];
            assert_eq!(REDUCE_CUDA[k].0, op.name());
            let cases = |macro_name: &str| {
                let at = head.find(&format!("#define {macro_name} ")).unwrap();
                head[at..].split("\n\n").next().unwrap().to_string()
            };
            assert!(
                cases("REDUCE_IDENTITY_CASES").contains(&format!("case {k}: return ({cuda_id});"))
            );
            assert!(
                cases("REDUCE_COMBINE_CASES").contains(&format!("case {k}: return ({cuda_step});"))
            );
        }
        assert_eq!(REDUCE_CUDA.len(), ReduceOp::KINDS.len());
    }
}
