//! The element types kernels run on.

use std::fmt::{Debug, Display};
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

use arenagrad_alloc::Pod;

/// The element type of a tensor.
///
/// The floating dtypes carry values and gradients. The integer and boolean dtypes ([`DType::I64`],
/// [`DType::I32`], [`DType::U8`], [`DType::Bool`]) hold indices, labels, masks and raw image
/// bytes: no gradient flows through them, and the arithmetic that PyTorch defines on them runs
/// in `f64` and stores its result in their dtype (exact while magnitudes stay below 2⁵³).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float: slower, but exact enough to trust a finite-difference gradient check.
    F64,
    /// bfloat16: f32's exponent range with an 8-bit significand (storage only: ops compute in
    /// f32 and round once when they store, as PyTorch's CPU kernels do).
    BF16,
    /// IEEE half precision (binary16; storage only, as [`DType::BF16`]).
    F16,
    /// 64-bit signed integers (PyTorch's `long`: indices, labels, counts).
    I64,
    /// 32-bit signed integers.
    I32,
    /// Unsigned bytes (images as decoded).
    U8,
    /// Booleans, one byte each (comparisons' results, masks).
    Bool,
}

impl DType {
    /// Every dtype: the floating ones widest first, then the integer ones.
    pub const ALL: [DType; 8] = [
        DType::F64,
        DType::F32,
        DType::BF16,
        DType::F16,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ];
    /// The floating dtypes, widest first: those that carry gradients.
    pub const FLOATS: [DType; 4] = [DType::F64, DType::F32, DType::BF16, DType::F16];
    /// The integer and boolean dtypes, widest first.
    pub const INTEGERS: [DType; 4] = [DType::I64, DType::I32, DType::U8, DType::Bool];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::BF16 | DType::F16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }
    /// The machine epsilon, the gap between 1 and the next value (PyTorch's `finfo(dtype).eps`);
    /// 1 for the integer dtypes, whose values are that far apart.
    pub fn epsilon(self) -> f64 {
        match self {
            DType::F32 => f64::from(f32::EPSILON),
            DType::F64 => f64::EPSILON,
            DType::BF16 => 0.0078125,
            DType::F16 => 0.0009765625,
            DType::I64 | DType::I32 | DType::U8 | DType::Bool => 1.0,
        }
    }
    /// The name used in errors and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
    /// The dtype named `name` ([`DType::name`], or PyTorch's `float32`, `float64`, `bfloat16`,
    /// `float16`, `half`, `float`, `double`, `int64`, `long`, `int32`, `int`, `uint8`).
    pub fn parse(name: &str) -> Option<DType> {
        Some(match name {
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            "bf16" | "bfloat16" => DType::BF16,
            "f16" | "float16" | "half" => DType::F16,
            "i64" | "int64" | "long" => DType::I64,
            "i32" | "int32" | "int" => DType::I32,
            "u8" | "uint8" => DType::U8,
            "bool" => DType::Bool,
            _ => return None,
        })
    }
    /// Whether this is a 16-bit storage dtype (`bf16` or `f16`).
    pub fn is_half(self) -> bool {
        matches!(self, DType::BF16 | DType::F16)
    }
    /// Whether this is a floating dtype (one that can carry a gradient).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }
    /// Whether this is an integer or boolean dtype.
    pub fn is_integer(self) -> bool {
        !self.is_float()
    }
    /// Whether kernels compute in this dtype directly (`f32`, `f64`); the others are lowered.
    pub fn is_native(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }
    /// The dtype its arithmetic runs in: `f32` for the 16-bit dtypes, `f64` for the integer
    /// ones (exact below 2⁵³), itself otherwise.
    pub fn compute(self) -> DType {
        match self {
            DType::BF16 | DType::F16 => DType::F32,
            DType::I64 | DType::I32 | DType::U8 | DType::Bool => DType::F64,
            d => d,
        }
    }
    /// The dtype two operands meet in (PyTorch's promotion): among floats the wider, `bf16`
    /// with `f16` in `f32` as neither holds the other; a float with an integer in the float;
    /// among integers the wider, `u8` with a signed one in the signed one, and `bool` below all.
    pub fn promote(self, other: DType) -> DType {
        fn rank(d: DType) -> u8 {
            match d {
                DType::Bool => 0,
                DType::U8 => 1,
                DType::I32 => 2,
                _ => 3,
            }
        }
        match (self, other) {
            (a, b) if a == b => a,
            (a, b) if a.is_float() && b.is_integer() => a,
            (a, b) if a.is_integer() && b.is_float() => b,
            (a, b) if a.is_integer() => {
                if rank(a) >= rank(b) {
                    a
                } else {
                    b
                }
            }
            (DType::F64, _) | (_, DType::F64) => DType::F64,
            _ => DType::F32,
        }
    }
}

impl Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A floating-point element type: `f32` or `f64`.
pub trait Float:
    Pod
    + crate::Storage
    + crate::cpu::fastmath::FastMath
    + crate::cpu::Gemm
    + PartialOrd
    + Debug
    + Display
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Converts (rounding for `f32`).
    fn from_f64(v: f64) -> Self;
    /// Widens to `f64`.
    fn to_f64(self) -> f64;
    /// e^x.
    fn exp(self) -> Self;
    /// e^x as a branch-free formula, so that a loop of it vectorises: for `f32` the
    /// polynomial of `cpu::fastmath` over the whole range (within 4 ulp of the correctly
    /// rounded value, 0 and +inf where those are the answers); libm's for `f64`.
    fn exp_lanes(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// tanh x as a branch-free formula, so that a loop of it vectorises: for `f32` the
    /// formulas of `cpu::fastmath` (a few ulp from libm's, the bits of the `tanh` op's
    /// kernel); libm's for `f64`.
    fn tanh_lanes(self) -> Self;
    /// ln(1 + x), accurate near 0.
    fn ln_1p(self) -> Self;
    /// The error function: libm's for `f64`; for `f32` a branch-free version within a few ulp
    /// of libm's `erff` that vectorises (`cpu::fastmath`).
    fn erf(self) -> Self;
    /// (Φ(x), e^(−x²/2)): the standard normal's distribution function and its density's shape
    /// (the density is e^(−x²/2)/√(2π)), for exact GELU and its derivative. For `f64`
    /// ½·erfc(−x/√2) through libm; for `f32` a branch-free formula that vectorises; both keep
    /// the left tail's relative accuracy (`cpu::fastmath`).
    fn normal_cdf_lanes(self) -> (Self, Self);
    /// Sine.
    fn sin(self) -> Self;
    /// Cosine.
    fn cos(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// x^p.
    fn powf(self, p: Self) -> Self;
    /// Larger of two (NaN-propagating through `>`).
    fn max(self, o: Self) -> Self;
    /// Smaller of two.
    fn min(self, o: Self) -> Self;
    /// -inf.
    fn neg_infinity() -> Self;
    /// `self·a + b` rounded once (a fused multiply-add: one instruction where the code is
    /// compiled with FMA, a correctly rounded library call otherwise).
    fn mul_add(self, a: Self, b: Self) -> Self;
}

macro_rules! float_impl {
    ($t:ty, $erf:path, $exp_lanes:path, $tanh_lanes:path, $normal_cdf:path) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn exp_lanes(self) -> Self {
                $exp_lanes(self)
            }
            #[inline(always)]
            fn tanh_lanes(self) -> Self {
                $tanh_lanes(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline(always)]
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn normal_cdf_lanes(self) -> (Self, Self) {
                $normal_cdf(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn powf(self, p: Self) -> Self {
                <$t>::powf(self, p)
            }
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                if self >= o || self.is_nan() {
                    self
                } else {
                    o
                }
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                if self <= o || self.is_nan() {
                    self
                } else {
                    o
                }
            }
            #[inline(always)]
            fn neg_infinity() -> Self {
                <$t>::NEG_INFINITY
            }
        }
    };
}
float_impl!(
    f32,
    crate::cpu::fastmath::erf_f32,
    crate::cpu::fastmath::exp_full_f32,
    crate::cpu::fastmath::tanh_f32,
    crate::cpu::fastmath::normal_cdf_f32
);
float_impl!(f64, libm::erf, f64::exp, f64::tanh, normal_cdf_f64);

/// [`Float::normal_cdf_lanes`] for `f64`: ½·erfc(−x/√2) and e^(−x²/2) through libm. (PyTorch's
/// ½(1 + erf(x/√2)) is the same within an ulp or two near the middle, and 0 from x ≈ −8.3 on,
/// where erfc keeps the left tail's relative accuracy.)
#[inline(always)]
fn normal_cdf_f64(x: f64) -> (f64, f64) {
    let cdf = 0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2);
    (cdf, (-0.5 * x * x).exp())
}
