//! Storage types and conversions between them.
//!
//! A tensor stores `f32`, `f64`, `bf16`, `f16`, `i64`, `i32`, `u8` or [`Bool`] ([`Storage`]);
//! arithmetic runs in `f32` or `f64` ([`crate::Float`]). Floats convert to integers truncated
//! toward zero (through `i64`, saturating there, NaN to 0), to `bool` as "not zero" (NaN is
//! true); integers convert among themselves by wrapping, as PyTorch's casts do. Conversions follow PyTorch's: widening is exact, narrowing rounds to
//! nearest even, and `f64` narrows to the 16-bit types through `f32` (as `c10::BFloat16` and
//! `c10::Half` are built from a `float`), so a value rounds twice there exactly as it does in
//! PyTorch. NaN stays NaN (quiet, its sign kept); values past a type's range become infinities.

pub use arenagrad_alloc::Bool;
use arenagrad_alloc::Pod;
pub use half::{bf16, f16};

use crate::ops::{BinaryKernel, UnaryGradKernel, UnaryKernel};
use crate::{DType, Float, UnaryOp};

/// Elements rounded per block when a conversion goes through `f32`.
pub(crate) const BLOCK: usize = 256;

/// An element type a tensor can be stored in.
pub trait Storage: Pod + PartialEq + std::fmt::Debug {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// The value, exactly, as `f64`.
    fn widen(self) -> f64;
    /// `v` rounded to this type (through `f32` for the 16-bit types, as PyTorch rounds).
    fn narrow(v: f64) -> Self;
    /// `src` as `f32` into `dst` (rounded when `Self` is `f64`).
    fn load_f32(src: &[Self], dst: &mut [f32]);
    /// `src` rounded into `dst`.
    fn store_f32(src: &[f32], dst: &mut [Self]);
    /// [`Storage::load_f32`] for a block inside a caller's vectorised loop ([`blockwise`]): a
    /// plain loop inlined there, at the caller's vector width, where the conversion is
    /// arithmetic on lanes (`bf16`); otherwise `load_f32` itself.
    #[inline(always)]
    fn load_block(src: &[Self], dst: &mut [f32]) {
        Self::load_f32(src, dst)
    }
    /// [`Storage::store_f32`] for a block (see [`Storage::load_block`]).
    #[inline(always)]
    fn store_block(src: &[f32], dst: &mut [Self]) {
        Self::store_f32(src, dst)
    }
    /// `a + b` correctly rounded to this type. The 16-bit types add in `f32` and round again,
    /// which gives the same answer: f32's 24 significant bits are at least twice theirs plus
    /// two (bf16 has 8, f16 11), where rounding twice cannot differ from rounding once.
    fn sum_of(a: Self, b: Self) -> Self;
    /// `v` itself where `Self` is `f32` (conversions pass it straight through).
    fn as_f32(_v: &[Self]) -> Option<&[f32]> {
        None
    }
    /// [`Storage::as_f32`], writable.
    fn as_f32_mut(_v: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
    /// The value as `i64`: truncated toward zero from a float (saturating, NaN to 0), as it is
    /// from an integer type.
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self.widen() as i64
    }
    /// `v` in this type: wrapped into an integer type (as PyTorch's casts between integer
    /// types wrap), 0 or 1 in `bool`, rounded into a float type.
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        Self::narrow(v as f64)
    }
}

macro_rules! integer_storage {
    ($t:ty, $dt:expr) => {
        impl Storage for $t {
            const DTYPE: DType = $dt;
            #[inline(always)]
            fn widen(self) -> f64 {
                self as f64
            }
            /// Truncated toward zero, as PyTorch converts a float to an integer; through `i64`
            /// (saturating there, NaN to 0) and wrapped into the narrower types.
            #[inline(always)]
            fn narrow(v: f64) -> Self {
                v as i64 as $t
            }
            fn load_f32(src: &[$t], dst: &mut [f32]) {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = s as f32;
                }
            }
            fn store_f32(src: &[f32], dst: &mut [$t]) {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = s as i64 as $t;
                }
            }
            #[inline(always)]
            fn sum_of(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}

integer_storage!(i64, DType::I64);
integer_storage!(i32, DType::I32);
integer_storage!(u8, DType::U8);

impl Storage for Bool {
    const DTYPE: DType = DType::Bool;
    #[inline(always)]
    fn widen(self) -> f64 {
        if self.get() {
            1.0
        } else {
            0.0
        }
    }
    /// True where `v` is not 0 (NaN included), as PyTorch converts to `bool`.
    #[inline(always)]
    fn narrow(v: f64) -> Self {
        Bool::new(v != 0.0)
    }
    fn load_f32(src: &[Bool], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f32::from(u8::from(s.get()));
        }
    }
    fn store_f32(src: &[f32], dst: &mut [Bool]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Bool::new(s != 0.0);
        }
    }
    #[inline(always)]
    fn sum_of(a: Bool, b: Bool) -> Bool {
        Bool::new(a.get() || b.get())
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        i64::from(self.get())
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        Bool::new(v != 0)
    }
}

impl Storage for f32 {
    const DTYPE: DType = DType::F32;
    fn as_f32(v: &[f32]) -> Option<&[f32]> {
        Some(v)
    }
    fn as_f32_mut(v: &mut [f32]) -> Option<&mut [f32]> {
        Some(v)
    }
    #[inline(always)]
    fn widen(self) -> f64 {
        f64::from(self)
    }
    #[inline(always)]
    fn narrow(v: f64) -> Self {
        v as f32
    }
    fn load_f32(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn store_f32(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    fn sum_of(a: f32, b: f32) -> f32 {
        a + b
    }
}

impl Storage for f64 {
    const DTYPE: DType = DType::F64;
    #[inline(always)]
    fn widen(self) -> f64 {
        self
    }
    #[inline(always)]
    fn narrow(v: f64) -> Self {
        v
    }
    fn load_f32(src: &[f64], dst: &mut [f32]) {
        super::wide::wide(
            src.len(),
            #[inline(always)]
            move || {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = s as f32;
                }
            },
        )
    }
    fn store_f32(src: &[f32], dst: &mut [f64]) {
        super::wide::wide(
            src.len(),
            #[inline(always)]
            move || {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = f64::from(s);
                }
            },
        )
    }
    #[inline(always)]
    fn sum_of(a: f64, b: f64) -> f64 {
        a + b
    }
}

impl Storage for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn widen(self) -> f64 {
        f64::from(super::bf16::from_bf16(self))
    }
    #[inline(always)]
    fn narrow(v: f64) -> Self {
        super::bf16::to_bf16(v as f32)
    }
    fn load_f32(src: &[bf16], dst: &mut [f32]) {
        super::bf16::bf16_to_f32(src, dst)
    }
    fn store_f32(src: &[f32], dst: &mut [bf16]) {
        super::bf16::f32_to_bf16(src, dst)
    }
    #[inline(always)]
    fn load_block(src: &[bf16], dst: &mut [f32]) {
        super::bf16::bf16_to_f32_lanes(src, dst)
    }
    #[inline(always)]
    fn store_block(src: &[f32], dst: &mut [bf16]) {
        super::bf16::f32_to_bf16_lanes(src, dst)
    }
    #[inline(always)]
    fn sum_of(a: bf16, b: bf16) -> bf16 {
        if zero_plus_is_itself(a.to_bits(), b.to_bits(), b.is_nan()) {
            return b;
        }
        super::bf16::to_bf16(a.to_f32() + b.to_f32())
    }
}

impl Storage for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn widen(self) -> f64 {
        f64::from(self.to_f32())
    }
    #[inline(always)]
    fn narrow(v: f64) -> Self {
        f16::from_f32(v as f32)
    }
    fn load_f32(src: &[f16], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst)
    }
    fn store_f32(src: &[f32], dst: &mut [f16]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src)
    }
    #[inline(always)]
    fn sum_of(a: f16, b: f16) -> f16 {
        if zero_plus_is_itself(a.to_bits(), b.to_bits(), b.is_nan()) {
            return b;
        }
        f16::from_f32(a.to_f32() + b.to_f32())
    }
}

/// Whether `a + b` of two 16-bit floats (their bits) is `b` itself because `a` is +0: for
/// every `b` but −0 (+0 + −0 is +0) and NaN (which the f32 addition may quiet). A scatter into
/// zeros (a max pooling's backward: each input element receives at most one gradient) then
/// copies instead of widening, adding and rounding each element.
#[inline(always)]
fn zero_plus_is_itself(a: u16, b: u16, b_nan: bool) -> bool {
    a == 0 && b != 0x8000 && !b_nan
}

/// `src` converted into `dst` (same length): exact when `D` is at least as wide, else rounded
/// to nearest even (see the module documentation). The work is split over up to `threads`
/// threads when it is large.
///
/// # Panics
/// If the lengths differ (an internal invariant: callers allocate `dst` for `src`).
pub fn cast<S: Storage, D: Storage>(src: &[S], dst: &mut [D], threads: usize) {
    assert_eq!(
        src.len(),
        dst.len(),
        "invariant: cast to a buffer of the same length"
    );
    super::par::par_chunks_mut(dst, threads, super::par::PAR_MIN_ELEMS, |start, d| {
        cast_serial(&src[start..start + d.len()], d)
    });
}

fn cast_serial<S: Storage, D: Storage>(src: &[S], dst: &mut [D]) {
    if S::DTYPE.is_integer() && D::DTYPE.is_integer() {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = D::from_i64(s.to_i64());
        }
        return;
    }
    if S::DTYPE == DType::F64
        || D::DTYPE == DType::F64
        || S::DTYPE.is_integer()
        || D::DTYPE.is_integer()
    {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = D::narrow(s.widen());
        }
        return;
    }
    // One side already f32: straight through, without the block buffer's copy.
    if let Some(src) = S::as_f32(src) {
        return D::store_f32(src, dst);
    }
    if let Some(dst) = D::as_f32_mut(dst) {
        return S::load_f32(src, dst);
    }
    let mut buf = [0f32; BLOCK];
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        let b = &mut buf[..s.len()];
        S::load_f32(s, b);
        D::store_f32(b, d);
    }
}

/// `v`'s values as f32, in a new vector (exact for every storage type but `f64`).
pub fn widened<S: Storage>(v: &[S]) -> Vec<f32> {
    let mut w = vec![0f32; v.len()];
    cast(v, &mut w, 1);
    w
}

/// Runs `f` on `v`'s values widened to f32 and rounds what it leaves there back into `v`, once
/// per element: how code that has no 16-bit arithmetic updates 16-bit values in f32.
pub fn update_in_f32<S: Storage, R>(v: &mut [S], f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut w = widened(v);
    let r = f(&mut w);
    cast(&w, v, 1);
    r
}

/// `out` computed a block at a time in f32: each block's part of every input widened on the
/// stack, `f(at, inputs, result)` run on them (`at` the block's first element; the inputs and
/// the result the block's length), and the result rounded into `out` once. Split over threads
/// when large. How the 16-bit elementwise kernels run the f32 ones without f32 copies of their
/// tensors.
///
/// Each thread's blocks run in one loop compiled for the widest vector unit, the conversions
/// (and `f`, where it is inlined) in it: a block's calls through the width dispatch cost as much
/// as GELU's arithmetic on it.
#[inline(always)]
pub fn blockwise<H: Storage, const N: usize>(
    ins: [&[H]; N],
    out: &mut [H],
    threads: usize,
    f: impl Fn(usize, [&[f32]; N], &mut [f32]) + Sync,
) {
    assert!(
        ins.iter().all(|x| x.len() == out.len()),
        "invariant: an elementwise op's buffers agree"
    );
    super::par::par_chunks_mut(out, threads, super::par::PAR_MIN_ELEMS, |start, o| {
        super::wide::wide(
            o.len(),
            #[inline(always)]
            || {
                let (mut wide, mut wo) = ([[0f32; BLOCK]; N], [0f32; BLOCK]);
                for (k, ob) in o.chunks_mut(BLOCK).enumerate() {
                    let at = start + k * BLOCK;
                    let n = ob.len();
                    for (w, x) in wide.iter_mut().zip(&ins) {
                        H::load_block(&x[at..at + n], &mut w[..n]);
                    }
                    f(at, std::array::from_fn(|i| &wide[i][..n]), &mut wo[..n]);
                    H::store_block(&wo[..n], ob);
                }
            },
        )
    });
}

/// [`blockwise`] over `N` inputs of one shape with an op's function, as a [`UnaryKernel`] (one
/// input) or a [`BinaryKernel`] (two): the function is inlined in the blocks' loop.
struct HalfBlocks<'a, H, const N: usize> {
    ins: [&'a [H]; N],
    out: &'a mut [H],
    threads: usize,
}

impl<H: Storage, const N: usize> HalfBlocks<'_, H, N> {
    /// [`blockwise`] with `loop_` over each block's widened inputs and result.
    #[inline(always)]
    fn each(self, loop_: impl Fn([&[f32]; N], &mut [f32]) + Sync) {
        blockwise(self.ins, self.out, self.threads, |_, ins, o| loop_(ins, o))
    }
}

impl<H: Storage> UnaryKernel<f32> for HalfBlocks<'_, H, 1> {
    type Out = ();
    #[inline(always)]
    fn run<F: Fn(f32) -> f32 + Sync + Copy>(self, f: F) {
        self.each(
            #[inline(always)]
            |[x], o| {
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = f(v);
                }
            },
        )
    }
}

impl<H: Storage> BinaryKernel<f32> for HalfBlocks<'_, H, 2> {
    type Out = ();
    #[inline(always)]
    fn run<F: Fn(f32, f32) -> f32 + Sync + Copy>(self, f: F) {
        self.each(
            #[inline(always)]
            |[a, b], o| {
                for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
                    *o = f(x, y);
                }
            },
        )
    }
}

/// `out = op(x)` for 16-bit storage ([`blockwise`]): the same values as widening the whole
/// tensor, running [`super::unary`] and rounding, without an f32 copy of the tensor.
pub fn unary_half<H: Storage>(op: UnaryOp, x: &[H], out: &mut [H], threads: usize) {
    let k = HalfBlocks {
        ins: [x],
        out,
        threads,
    };
    match op {
        // The f32 kernel's own paths for these two (the rows write libm's `exp` and `tanh`).
        UnaryOp::Exp => k.run(|v: f32| v.exp_lanes()),
        UnaryOp::Tanh => k.run(|v: f32| v.tanh_lanes()),
        _ => op.with_forward(k),
    }
}

/// `out = op(a, b)` for 16-bit storage and operands of one shape ([`blockwise`]): the values
/// of widening both tensors, running [`super::binary`] and rounding, without f32 copies of them.
pub fn binary_half<H: Storage>(
    op: crate::BinaryOp,
    a: &[H],
    b: &[H],
    out: &mut [H],
    threads: usize,
) {
    op.with_fn(HalfBlocks {
        ins: [a, b],
        out,
        threads,
    })
}

/// The fused derivative `g = gy · op'(x)` for 16-bit storage, block by block in f32 as
/// [`unary_half`] computes, rounded once; `x` and `y` are the op's input and output.
pub fn unary_grad_half<H: Storage>(
    op: UnaryOp,
    x: &[H],
    y: &[H],
    gy: &[H],
    out: &mut [H],
    threads: usize,
) {
    op.with_grad(HalfZip3 {
        x,
        y,
        gy,
        out,
        threads,
        reads: (op.grad_reads_input(), op.grad_reads_output()),
    })
}

/// [`blockwise`] over `x`, `y` and `gy` with the op's derivative, as a [`UnaryGradKernel`]:
/// the derivative is inlined in the blocks' loop, and an operand it does not read is not
/// widened (the other's block stands in for it, unread).
struct HalfZip3<'a, H> {
    x: &'a [H],
    y: &'a [H],
    gy: &'a [H],
    out: &'a mut [H],
    threads: usize,
    /// Whether the derivative reads `x`, `y`.
    reads: (bool, bool),
}

impl<H: Storage> UnaryGradKernel<f32> for HalfZip3<'_, H> {
    type Out = ();
    #[inline(always)]
    fn run<F: Fn(f32, f32, f32) -> f32 + Sync + Copy>(self, f: F) {
        let Self {
            x,
            y,
            gy,
            out,
            threads,
            reads,
        } = self;
        #[inline(always)]
        fn zip<F: Fn(f32, f32, f32) -> f32>(f: F, x: &[f32], y: &[f32], gy: &[f32], o: &mut [f32]) {
            for (((o, &xv), &yv), &g) in o.iter_mut().zip(x).zip(y).zip(gy) {
                *o = f(xv, yv, g);
            }
        }
        match reads {
            (true, true) => blockwise([x, y, gy], out, threads, |_, [x, y, gy], o| {
                zip(f, x, y, gy, o)
            }),
            (true, false) => blockwise([x, gy], out, threads, |_, [x, gy], o| zip(f, x, x, gy, o)),
            (false, true) => blockwise([y, gy], out, threads, |_, [y, gy], o| zip(f, y, y, gy, o)),
            (false, false) => blockwise([gy], out, threads, |_, [gy], o| zip(f, gy, gy, gy, o)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sum_of(±0, b)` is the f32 sum rounded, for every 16-bit `b`: the +0 shortcut leaves
    /// +0 + −0's sign rule and NaN's quieting to the full route.
    #[test]
    // Not under Miri: it makes up each NaN's bits per operation (and 2^18 sums take minutes).
    #[cfg_attr(miri, ignore)]
    fn sums_with_a_zero_are_the_rounded_f32_sums() {
        for zero in [0u16, 0x8000] {
            for bits in 0..=u16::MAX {
                let (a, b) = (bf16::from_bits(zero), bf16::from_bits(bits));
                let want = crate::cpu::bf16::to_bf16(a.to_f32() + b.to_f32());
                assert_eq!(
                    bf16::sum_of(a, b).to_bits(),
                    want.to_bits(),
                    "bf16 {zero:#x} + {bits:#x}"
                );
                let (a, b) = (f16::from_bits(zero), f16::from_bits(bits));
                let want = f16::from_f32(a.to_f32() + b.to_f32());
                assert_eq!(
                    f16::sum_of(a, b).to_bits(),
                    want.to_bits(),
                    "f16 {zero:#x} + {bits:#x}"
                );
            }
        }
    }

    fn all_bits_round_trip<T: Storage>(from_bits: impl Fn(u16) -> T, to_bits: impl Fn(T) -> u16) {
        let src: Vec<T> = (0..=u16::MAX).map(&from_bits).collect();
        let mut wide = vec![0f32; src.len()];
        cast(&src, &mut wide, 1);
        let mut back = vec![from_bits(0); src.len()];
        cast(&wide, &mut back, 1);
        for (a, b) in src.iter().zip(&back) {
            let (a, b) = (to_bits(*a), to_bits(*b));
            let nan = f64::is_nan(from_bits(a).widen());
            assert!(
                a == b || nan && f64::is_nan(from_bits(b).widen()),
                "{a:#x} → {b:#x}"
            );
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // 2¹⁷ conversions: minutes interpreted
    fn every_16_bit_value_survives_a_round_trip_through_f32() {
        all_bits_round_trip(bf16::from_bits, bf16::to_bits);
        all_bits_round_trip(f16::from_bits, f16::to_bits);
    }

    #[test]
    fn narrowing_rounds_to_nearest_even_and_keeps_nan_and_overflow() {
        // Halfway between 1 and the next bf16 (1 + 2⁻⁷) rounds to the even neighbour, 1.
        let cases: [(f32, f32); 6] = [
            (1.0 + 2f32.powi(-8), 1.0),
            (1.0 + 3.0 * 2f32.powi(-8), 1.0 + 2.0 * 2f32.powi(-7)),
            (1.0 + 2f32.powi(-8) + 2f32.powi(-20), 1.0 + 2f32.powi(-7)),
            (f32::MAX, f32::INFINITY),
            (-0.0, -0.0),
            (f32::NEG_INFINITY, f32::NEG_INFINITY),
        ];
        let src: Vec<f32> = cases.iter().map(|c| c.0).collect();
        let mut out = vec![bf16::ZERO; src.len()];
        cast(&src, &mut out, 1);
        for ((x, want), got) in cases.iter().zip(&out) {
            assert_eq!(got.to_f32().to_bits(), want.to_bits(), "bf16({x})");
        }
        let mut h = [f16::ZERO; 3];
        cast(&[65520.0f32, 1.0 + 2f32.powi(-11), f32::NAN], &mut h, 1);
        assert_eq!(h[0], f16::INFINITY);
        assert_eq!(h[1], f16::ONE);
        assert!(h[2].is_nan());
        let mut b = [bf16::ZERO; 1];
        cast(&[-f32::NAN], &mut b, 1);
        assert!(b[0].is_nan() && b[0].is_sign_negative());
    }

    #[test]
    fn f64_rounds_through_f32_as_pytorch_does() {
        // 1 + 2⁻⁸ + 2⁻³⁰ rounds up to 1 + 2⁻⁷ in one step, but to f32 first it is 1 + 2⁻⁸ (the
        // 2⁻³⁰ is below f32's last place there), a tie that rounds to even: 1. PyTorch gives 1.
        let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-30);
        let mut out = [bf16::ZERO];
        cast(&[x], &mut out, 1);
        assert_eq!(out[0], bf16::ONE);
        assert_eq!(bf16::narrow(x), bf16::ONE);
        let mut h = [f16::ZERO];
        cast(&[1.0 + 2f64.powi(-11) + 2f64.powi(-40)], &mut h, 1);
        assert_eq!(h[0], f16::ONE);
    }

    #[test]
    fn half_elementwise_kernels_equal_widening_the_whole_tensor() {
        // Past three times the size from which kernels split (so that three threads take a
        // part each, cut off the blocks' edges).
        let n = if cfg!(miri) {
            300
        } else {
            3 * super::super::par::PAR_MIN_ELEMS + 11
        };
        // 1e-40 is subnormal in bf16 (and 0 in f16), 3e-6 subnormal in f16.
        let special = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            3e-6,
        ];
        let src: Vec<f32> = (0..n)
            .map(|k| match k % 89 {
                j if j < special.len() => special[j],
                _ => ((k * 37) % 1001) as f32 * 0.013 - 6.0,
            })
            .collect();
        // Every row of the table (each derivative reads some of x, y and g: the kernel widens
        // only those), and the f32 kernel's own paths for exp and tanh; under Miri a few.
        let ops: &[UnaryOp] = if cfg!(miri) {
            &[
                UnaryOp::Tanh,
                UnaryOp::Gelu,
                UnaryOp::Exp,
                UnaryOp::Scale(0.3),
            ]
        } else {
            UnaryOp::SAMPLES
        };
        fn check<H: Storage>(src: &[f32], ops: &[UnaryOp], bits: impl Fn(&H) -> u16) {
            let n = src.len();
            let same = |got: &[H], want: &[H], what: &str| {
                for (k, (a, b)) in got.iter().zip(want).enumerate() {
                    // Miri makes up a NaN's sign and payload afresh for each operation.
                    if cfg!(miri) && a.widen().is_nan() && b.widen().is_nan() {
                        continue;
                    }
                    assert_eq!(bits(a), bits(b), "{what}, element {k} ({})", src[k]);
                }
            };
            let mut x = vec![H::narrow(0.0); n];
            cast(src, &mut x, 1);
            let mut wide = vec![0f32; n];
            cast(&x, &mut wide, 1);
            for &op in ops {
                let mut y32 = vec![0f32; n];
                super::super::unary(op, &wide, &mut y32, 1);
                let mut want = vec![H::narrow(0.0); n];
                cast(&y32, &mut want, 1);
                for threads in [1, 3] {
                    let mut got = vec![H::narrow(0.0); n];
                    unary_half(op, &x, &mut got, threads);
                    same(&got, &want, &format!("{op:?}, {threads} threads"));
                }
                // The derivative, against the f32 one on the widened values, rounded.
                let y = want;
                let (mut yw, mut g32) = (vec![0f32; n], vec![0f32; n]);
                cast(&y, &mut yw, 1);
                let gy: Vec<H> = (0..n)
                    .map(|k| H::narrow(1.0 + (k % 7) as f64 * 0.25))
                    .collect();
                cast(&gy, &mut g32, 1);
                super::super::unary_grad_in_place(op, &wide, &yw, &mut g32, 1);
                let mut want_g = vec![H::narrow(0.0); n];
                cast(&g32, &mut want_g, 1);
                let mut got_g = vec![H::narrow(0.0); n];
                unary_grad_half(op, &x, &y, &gy, &mut got_g, 2);
                same(&got_g, &want_g, &format!("{op:?}'"));
            }
        }
        check::<bf16>(&src, ops, |v| v.to_bits());
        if !cfg!(miri) {
            check::<f16>(&src, ops, |v| v.to_bits());
        }
    }

    /// Every binary op on two 16-bit tensors of one shape, block by block and split over
    /// threads: the bits of widening both, the f32 kernel and one rounding (zeros of both
    /// signs, infinities and NaN among the values).
    #[test]
    fn half_binary_kernels_equal_widening_the_whole_tensors() {
        let n = if cfg!(miri) {
            300
        } else {
            2 * super::super::par::PAR_MIN_ELEMS + 77
        };
        let special = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40];
        let value = |k: usize, m: usize| match k % 97 {
            j if j < special.len() => special[j],
            _ => ((k * m) % 1009) as f32 * 0.031 - 15.0,
        };
        let (sa, sb): (Vec<f32>, Vec<f32>) =
            (0..n).map(|k| (value(k, 37), value(k + 3, 53))).unzip();
        fn check<H: Storage>(sa: &[f32], sb: &[f32], bits: impl Fn(&H) -> u16) {
            let n = sa.len();
            let (mut a, mut b) = (vec![H::narrow(0.0); n], vec![H::narrow(0.0); n]);
            cast(sa, &mut a, 1);
            cast(sb, &mut b, 1);
            let (mut wa, mut wb) = (vec![0f32; n], vec![0f32; n]);
            cast(&a, &mut wa, 1);
            cast(&b, &mut wb, 1);
            let shape = [n];
            for &op in crate::BinaryOp::KINDS {
                let mut y32 = vec![0f32; n];
                super::super::binary(
                    op,
                    super::super::Operand::new(&wa[..], &shape),
                    super::super::Operand::new(&wb[..], &shape),
                    super::super::Operand::new(&mut y32[..], &shape),
                    1,
                );
                let mut want = vec![H::narrow(0.0); n];
                cast(&y32, &mut want, 1);
                for threads in [1, 2, 3] {
                    let mut got = vec![H::narrow(0.0); n];
                    binary_half(op, &a, &b, &mut got, threads);
                    // Miri picks NaN payloads at random, and adds error of its own to libm's
                    // results (`powf`): there, any NaN for a NaN and a unit in the last place.
                    let close = |g: &H, w: &H| {
                        let (gw, ww) = (g.widen(), w.widen());
                        cfg!(miri)
                            && (gw.is_nan() && ww.is_nan()
                                || (gw - ww).abs() <= ww.abs() * 2f64.powi(-6))
                    };
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(g, w)| bits(g) == bits(w) || close(g, w));
                    assert!(same, "{op:?} in {:?} on {threads} threads", H::DTYPE);
                }
            }
        }
        check::<bf16>(&sa, &sb, |v| v.to_bits());
        check::<f16>(&sa, &sb, |v| v.to_bits());
    }

    #[test]
    fn threads_and_blocks_do_not_change_the_bits() {
        let n = if cfg!(miri) { 700 } else { 300_001 };
        let src: Vec<f32> = (0..n)
            .map(|k| ((k * 7919) % 10007) as f32 * 0.37 - 1800.0)
            .collect();
        let mut one = vec![bf16::ZERO; n];
        let mut many = vec![bf16::ZERO; n];
        cast(&src, &mut one, 1);
        cast(&src, &mut many, 4);
        assert_eq!(one, many);
        for (s, o) in src.iter().zip(&one) {
            assert_eq!(*o, bf16::from_f32(*s));
        }
        let mut h = vec![f16::ZERO; n];
        cast(&src, &mut h, 3);
        let mut hb = vec![bf16::ZERO; n];
        cast(&h, &mut hb, 2);
        for ((s, x), y) in src.iter().zip(&h).zip(&hb) {
            assert_eq!(*x, f16::from_f32(*s));
            assert_eq!(*y, bf16::from_f32(x.to_f32()));
        }
    }
}
