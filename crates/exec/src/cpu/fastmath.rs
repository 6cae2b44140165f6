//! Vectorisable transcendental functions for `f32`.
//!
//! libm's `tanhf` is a scalar call per element (about 2 ns each), which dominates small-tensor
//! chains. These versions are branch-free over a slice, so the compiler turns them into SIMD
//! loops: `exp` by Cody–Waite range reduction and a degree-6 polynomial, `tanh` by an odd Taylor
//! polynomial near zero and `1 - 2/(e^{2|x|}+1)` elsewhere. Both stay within a few ulps of libm in
//! `f32`. `f64` keeps libm: it is the type for gradient checks, where the last digit matters.

use super::par::{par_chunks_mut, PAR_MIN_ELEMS};
use super::wide::{wide, WIDE_MIN_ELEMS};
use crate::Float;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// 1.5 · 2^23: adding and subtracting it rounds an `f32` to the nearest integer without `roundps`.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// The bits of `ROUND_MAGIC`: a float `ROUND_MAGIC + n` (|n| < 2^22) has the bits
/// `ROUND_MAGIC_BITS + n`, so the rounded integer is read off with integer arithmetic.
const ROUND_MAGIC_BITS: u32 = 0x4B40_0000;
/// Inputs whose e^y the polynomial and the exponent trick give as a normal `f32`:
/// below, 2^n would be subnormal; above, n would be 128 (2^128 is not an `f32`).
const EXP_TAME: std::ops::RangeInclusive<f32> = -87.3..=88.3;

/// e^y for y in [`EXP_TAME`]; callers clamp.
#[inline(always)]
fn exp_f32(y: f32) -> f32 {
    let (p, t) = exp_parts(y);
    // 2^n, its exponent field built from t's bits: integer lanes only, no float-to-int
    // conversion (whose saturating semantics keep a loop from vectorising).
    let bits = t.to_bits().wrapping_sub(ROUND_MAGIC_BITS).wrapping_add(127) << 23;
    p * f32::from_bits(bits)
}

/// `(e^r, t)` for `y = n·ln2 + r`, |r| ≤ ln2/2, where `t = ROUND_MAGIC + n` carries `n` in its
/// low bits.
#[inline(always)]
fn exp_parts(y: f32) -> (f32, f32) {
    let t = y * LOG2E + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    let r = (y - n * LN2_HI) - n * LN2_LO;
    // e^r on |r| <= ln2/2
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_67
                    + r * (0.041_666_668 + r * (0.008_333_452 + r * 0.001_388_893_6)))));
    (p, t)
}

/// At or below this, e^y rounds to 0 in f32 (e^−104 < 2^−150, half the least subnormal).
const EXP_ZERO: f32 = -104.0;

/// e^y over the whole f32 range, branch-free (a loop of it vectorises): [`exp_f32`]'s
/// polynomial, scaled by 2^n as two normal factors 2^⌊n/2⌋·2^(n−⌊n/2⌋), so that a subnormal
/// result is rounded once and a result past f32::MAX is +inf; 0 at and below [`EXP_ZERO`]
/// (−inf included), NaN for NaN. Where [`exp_f32`] is defined the two agree bit for bit (both
/// scalings are exact there).
#[inline(always)]
pub(crate) fn exp_full_f32(y: f32) -> f32 {
    // Clamped, n stays within [−150, 128]; each half-exponent within [−75, 64].
    let (p, t) = exp_parts(y.clamp(EXP_ZERO, 89.0));
    let n = t.to_bits().wrapping_sub(ROUND_MAGIC_BITS) as i32;
    let half = n >> 1;
    let scale = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    let e = p * scale(half) * scale(n - half);
    if y <= EXP_ZERO {
        0.0
    } else {
        e
    }
}

/// erf x in `f32`, branch-free (a loop of it vectorises): Juffa's two minimax fits, an odd
/// polynomial below |x| = 0.927734375 and `1 − e^(poly(|x|))` above (at most ~1 ulp each with
/// fused multiply-adds; within a few ulp of libm's `erff` without, as here), both computed and
/// one selected. ±inf gives ±1, NaN stays NaN.
#[inline(always)]
pub(crate) fn erf_f32(a: f32) -> f32 {
    let t = a.abs();
    let s = a * a;
    // Small |x|: a·(1 + s·P(s)).
    let mut lo = -5.967_617e-4_f32;
    lo = lo * s + 4.991_194_2e-3;
    lo = lo * s + -2.676_813_5e-2;
    lo = lo * s + 1.128_199_3e-1;
    lo = lo * s + -3.761_253_4e-1;
    lo = lo * s + 1.283_791_7e-1;
    let lo = lo * a + a;
    // Large |x|: 1 − e^r, r a polynomial in |x| (clamped: erf is 1 in f32 from 4 on).
    let tc = t.min(8.0);
    let sc = tc * tc;
    let mut r = -1.728_534_7e-5_f32 * tc + 3.831_971_3e-4;
    let u = -3.883_964_4e-3_f32 * tc + 2.425_462_2e-2;
    r = r * sc + u;
    r = r * tc + -1.067_778_8e-1;
    r = r * tc + -6.348_467e-1;
    r = r * tc + -1.287_175_1e-1;
    r = r * tc + -tc;
    let hi = (1.0 - exp_f32(r.max(*EXP_TAME.start()))).copysign(a);
    if t > 0.927_734_4 {
        hi
    } else {
        lo
    }
}

/// R(t) = P(t)/Q(t) ≈ (1 − Φ(t))·e^(t²/2) = ½·erfcx(t/√2) for t in [0, 14]: the standard normal's
/// upper tail over e^(−t²/2), a smooth ratio that falls from ½ like 1/(t√(2π)). A minimax fit of
/// the relative error (5.6e-9 in exact arithmetic), its coefficients rounded to `f32` one at a
/// time with the others refitted; evaluated by Horner's rule in `f32` its relative error stays
/// below 4ε (ε = 2⁻²³: 4 to 8 ulp; 1 ulp on average).
const TAIL_P: [f32; 5] = [
    0.5,
    0.437_267_8,
    0.182_475_85,
    0.040_377_695,
    0.004_078_495_3,
];
/// R's denominator (see [`TAIL_P`]).
const TAIL_Q: [f32; 6] = [
    1.0,
    1.672_420_6,
    1.199_345_7,
    0.467_466_44,
    0.101_218_69,
    0.010_223_143,
];
/// R(t) ([`TAIL_P`]) by Horner's rule, for finite t ≥ 0.
#[inline(always)]
fn tail_ratio_f32(t: f32) -> f32 {
    let mut p = TAIL_P[4];
    p = p * t + TAIL_P[3];
    p = p * t + TAIL_P[2];
    p = p * t + TAIL_P[1];
    p = p * t + TAIL_P[0];
    let mut q = TAIL_Q[5];
    q = q * t + TAIL_Q[4];
    q = q * t + TAIL_Q[3];
    q = q * t + TAIL_Q[2];
    q = q * t + TAIL_Q[1];
    q = q * t + TAIL_Q[0];
    p / q
}

/// Past this |x| the normal's tail is below 4·10⁻⁴⁰ (e^(−x²/2) below `f32`'s normal range):
/// [`normal_cdf_f32`] gives it, and e^(−x²/2), as 0 (so GELU's derivative there is 0 or 1,
/// where x·φ(x) is still about 10⁻³⁷ at x = 13.2).
const TAIL_ZERO: f32 = 13.2;

/// (Φ(x), e^(−x²/2)) in `f32`, branch-free (a loop of it vectorises): Φ the standard normal's
/// distribution function, e^(−x²/2) the shape of its density, for exact GELU (`x·Φ(x)`) and
/// its derivative (`Φ(x) + x·φ(x)`). The tail beyond |x| is e^(−x²/2)·R(|x|) ([`TAIL_P`]):
/// Φ(x) for x < 0, 1 − Φ(x) for x ≥ 0. One exponential and one division, where
/// ½(1 + erf(x/√2)) takes erf's two branches and an exponential, and loses the left tail
/// to cancellation (PyTorch's `f32` GELU gives 0 from x = −6 on; this keeps a relative error
/// of a few 10⁻⁶ down to x = −13). Both ±inf give e = 0 (so that GELU's derivative there is
/// PyTorch's NaN); NaN gives finite parts (the caller's product with x carries the NaN).
#[inline(always)]
pub(crate) fn normal_cdf_f32(x: f32) -> (f32, f32) {
    let t = x.abs();
    // Past TAIL_ZERO e is 0; the clamp keeps inf and NaN out of the ratio.
    let tc = t.min(13.25);
    let e = exp_f32((-0.5 * tc * tc).max(*EXP_TAME.start()));
    let e = if t > TAIL_ZERO { 0.0 } else { e };
    let tail = e * tail_ratio_f32(tc);
    let cdf = if x < 0.0 { tail } else { 1.0 - tail };
    (cdf, e)
}

/// tanh x for |x| < 0.4: the odd Taylor series (error < 1e-9 there), its polynomial in x²
/// evaluated by Estrin's scheme: half the dependent steps of Horner's, which is what a chain of
/// small tensors waits on.
#[inline(always)]
fn tanh_small_f32(x: f32) -> f32 {
    let y = x * x;
    let y2 = y * y;
    let y4 = y2 * y2;
    let a = 1.0 + y * -0.333_333_34;
    let b = 0.133_333_33 + y * -0.053_968_254;
    let c = (0.021_869_488 + y * -0.008_863_236) + y2 * 0.003_592_128;
    x * ((a + y2 * b) + y4 * c)
}

/// tanh x for |x| ≥ 0.4 (and NaN, which it returns): `±(1 - 2/(e^{2|x|}+1))`.
#[inline(always)]
fn tanh_big_f32(x: f32) -> f32 {
    let e = exp_f32((2.0 * x.abs()).min(20.0));
    let big = 1.0 - 2.0 / (e + 1.0);
    let big = if x < 0.0 { -big } else { big };
    if x.is_nan() {
        x
    } else {
        big
    }
}

/// tanh x, branch-free: the series below 0.4 in magnitude, the exponential form above.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    let (small, big) = (tanh_small_f32(x), tanh_big_f32(x));
    if x.abs() < 0.4 {
        small
    } else {
        big
    }
}

/// Element types with a slice-at-a-time `tanh` and `exp`.
pub trait FastMath: Sized {
    /// `out[i] = tanh(x[i])`.
    fn tanh_into(x: &[Self], out: &mut [Self]);
    /// `out[i] = exp(x[i])`.
    fn exp_into(x: &[Self], out: &mut [Self]);
}

impl FastMath for f32 {
    fn tanh_into(x: &[f32], out: &mut [f32]) {
        if out.len() < WIDE_MIN_ELEMS {
            // A few elements: each takes its own branch (the same formulas, so the same bits).
            for (o, &v) in out.iter_mut().zip(x) {
                *o = if v.abs() < 0.4 {
                    tanh_small_f32(v)
                } else {
                    tanh_big_f32(v)
                };
            }
            return;
        }
        wide(
            out.len(),
            #[inline(always)]
            move || tanh_slice_f32(x, out),
        )
    }
    fn exp_into(x: &[f32], out: &mut [f32]) {
        wide(
            out.len(),
            #[inline(always)]
            move || exp_slice_f32(x, out),
        )
    }
}

#[inline(always)]
fn tanh_slice_f32(x: &[f32], out: &mut [f32]) {
    // When every input is near zero (as in a deep chain of small activations) only the series is
    // needed, and its latency is a quarter of the exponential's; otherwise both branches run
    // in every lane and each lane keeps its own.
    if x.iter().fold(true, |s, v| s & (v.abs() < 0.4)) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = tanh_small_f32(v);
        }
    } else {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = tanh_f32(v);
        }
    }
}

#[inline(always)]
fn exp_slice_f32(x: &[f32], out: &mut [f32]) {
    // One branch-free pass the compiler vectorises, right over the whole range: the −∞ of a
    // causal mask and the underflow of a far-off score cost nothing extra.
    for (o, &v) in out.iter_mut().zip(x) {
        *o = exp_full_f32(v);
    }
}

impl FastMath for f64 {
    fn tanh_into(x: &[f64], out: &mut [f64]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v.tanh();
        }
    }
    fn exp_into(x: &[f64], out: &mut [f64]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v.exp();
        }
    }
}

/// `tanh` over a slice, split across threads when large.
pub fn tanh_slice<T: Float>(x: &[T], out: &mut [T], threads: usize) {
    par_chunks_mut(out, threads, PAR_MIN_ELEMS, |s, o| {
        T::tanh_into(&x[s..s + o.len()], o)
    });
}

/// `exp` over a slice, split across threads when large.
pub fn exp_slice<T: Float>(x: &[T], out: &mut [T], threads: usize) {
    par_chunks_mut(out, threads, PAR_MIN_ELEMS, |s, o| {
        T::exp_into(&x[s..s + o.len()], o)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> i64 {
        (a.to_bits() as i64 - b.to_bits() as i64).abs()
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn erf_close_to_libm() {
        let mut worst = 0i64;
        let steps = 400_000;
        for i in 0..=steps {
            let x = -6.0 + 12.0 * i as f32 / steps as f32;
            let (got, want) = (erf_f32(x), libm::erff(x));
            worst = worst.max(ulps(got, want));
        }
        // Tiny arguments, where erf x ≈ 2x/√π and relative accuracy matters.
        for e in -40..0 {
            let x = 2f32.powi(e);
            assert!(ulps(erf_f32(x), libm::erff(x)) <= 2, "{x}");
            assert!(ulps(erf_f32(-x), libm::erff(-x)) <= 2, "{x}");
        }
        assert!(worst <= 4, "worst error {worst} ulp");
        assert_eq!(erf_f32(0.0), 0.0);
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
        assert!(erf_f32(-0.0).is_sign_negative());
    }

    #[test]
    fn normal_cdf_keeps_its_tail() {
        // Φ against ½·erfc(−x/√2) in f64: relative error where Φ(x) < ½ (the left tail, which
        // ½(1 + erf(x/√2)) loses to cancellation), absolute where it is near 1; e^(−x²/2)
        // relative, 0 past TAIL_ZERO.
        let steps = if cfg!(miri) { 300 } else { 400_000 };
        let (mut left, mut right, mut shape) = (0f64, 0f64, 0f64);
        for i in 0..=steps {
            let x = -14.0 + 28.0 * i as f32 / steps as f32;
            let (cdf, e) = normal_cdf_f32(x);
            let xd = x as f64;
            let want = 0.5 * libm::erfc(-xd * std::f64::consts::FRAC_1_SQRT_2);
            let want_e = (-0.5 * xd * xd).exp();
            if x.abs() > TAIL_ZERO {
                assert_eq!(e, 0.0, "{x}");
                assert_eq!(cdf, if x < 0.0 { 0.0 } else { 1.0 }, "{x}");
                continue;
            }
            shape = shape.max((e as f64 - want_e).abs() / want_e);
            if x < 0.0 {
                left = left.max((cdf as f64 - want).abs() / want);
            } else {
                right = right.max((cdf as f64 - want).abs());
            }
        }
        // Most of the left tail's error is e^(−x²/2)'s, from x² rounded to f32 (4·10⁻⁶ at
        // x = −13); the ratio's own below 4ε (ε = 2⁻²³).
        assert!(left < 6e-6, "left tail: relative error {left:e}");
        assert!(right < 2.5e-7, "right side: absolute error {right:e}");
        assert!(shape < 5e-6, "e^(−x²/2): relative error {shape:e}");
        let mut worst = 0f64;
        for i in 0..=steps {
            let t = 13.25 * i as f32 / steps as f32;
            let td = t as f64;
            let want =
                0.5 * libm::erfc(td * std::f64::consts::FRAC_1_SQRT_2) * (0.5 * td * td).exp();
            worst = worst.max((tail_ratio_f32(t) as f64 - want).abs() / want);
        }
        assert!(
            worst < 4.0 * f32::EPSILON as f64,
            "the tail's ratio: relative error {worst:e}"
        );
        // Near the middle the tail's ratio is exact enough for Φ to be within an ulp or two.
        assert_eq!(normal_cdf_f32(0.0), (0.5, 1.0));
        assert_eq!(normal_cdf_f32(-0.0), (0.5, 1.0));
        assert!((normal_cdf_f32(-1.0).0 - 0.158_655_26).abs() < 3e-8);
        assert_eq!(normal_cdf_f32(f32::INFINITY), (1.0, 0.0));
        assert_eq!(normal_cdf_f32(f32::NEG_INFINITY), (0.0, 0.0));
        let (cdf, e) = normal_cdf_f32(f32::NAN);
        assert!(cdf.is_finite() && e.is_finite());
        // f64 through erfc keeps the tail too (mpmath's ncdf, 30 digits), within the error of
        // x/√2 rounded (relative, about x² ulp there); ½(1 + erf) gives 0.
        for (x, want) in [
            (-1.0, 0.158_655_253_931_457_05),
            (-10.0, 7.619_853_024_160_526e-24),
            (-30.0, 4.906_713_927_148_187e-198),
        ] {
            let (cdf, e) = <f64 as Float>::normal_cdf_lanes(x);
            let tol = (2.0 + x * x) * f64::EPSILON * want;
            assert!((cdf - want).abs() <= tol, "Φ({x}) = {cdf:e}");
            // (Not bit for bit: Miri perturbs `exp` call by call, by more than a few ulp.)
            let e_want = (-0.5 * x * x).exp();
            let near = (e - e_want).abs() <= 1e-9 * e_want;
            assert!(near, "e at {x}: {e:e} against {e_want:e}");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn tanh_close_to_libm() {
        let mut worst = 0.0f64;
        let steps = if cfg!(miri) { 200 } else { 200_000 };
        for i in 0..=steps {
            let x = -12.0 + 24.0 * i as f32 / steps as f32;
            let got = tanh_f32(x) as f64;
            let want = (x as f64).tanh();
            let rel = (got - want).abs() / want.abs().max(1e-30);
            worst = worst.max(if want.abs() < 1e-30 { 0.0 } else { rel });
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert_eq!(tanh_f32(0.0), 0.0);
        assert_eq!(tanh_f32(30.0), 1.0);
        assert_eq!(tanh_f32(-30.0), -1.0);
        let mut o = [0.0f32; 3];
        f32::tanh_into(&[f32::NAN, 0.1, f32::NEG_INFINITY], &mut o);
        assert!(o[0].is_nan(), "tanh(NaN) = {}", o[0]);
        assert_eq!(o[1], tanh_small_f32(0.1));
        assert_eq!(o[2], -1.0);
    }

    /// The wide builds compute the same operations in more lanes: their results are the
    /// portable build's, bit for bit, on tame, wild and special inputs, at every length a tail
    /// could take.
    #[test]
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    fn wide_builds_agree_with_the_portable_one() {
        let x: Vec<f32> = (0..4099)
            .map(|i| match i % 97 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => 88.5,
                4 => -100.0,
                _ => (i as f32 * 0.0137).sin() * 95.0,
            })
            .collect();
        // NaN payloads aside: every NaN compares as one value.
        let bits = |v: &[f32]| {
            v.iter()
                .map(|f| if f.is_nan() { u32::MAX } else { f.to_bits() })
                .collect::<Vec<_>>()
        };
        for len in [0, 1, 7, 15, 16, 17, 33, 4099] {
            let x = &x[..len];
            let (mut e, mut t) = (vec![0.0; len], vec![0.0; len]);
            exp_slice_f32(x, &mut e);
            tanh_slice_f32(x, &mut t);
            let mut o = vec![0.0; len];
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU reports AVX2.
                unsafe { super::super::wide::with_avx2(|| exp_slice_f32(x, &mut o)) };
                assert_eq!(bits(&o), bits(&e), "avx2 exp, length {len}");
                // SAFETY: as above.
                unsafe { super::super::wide::with_avx2(|| tanh_slice_f32(x, &mut o)) };
                assert_eq!(bits(&o), bits(&t), "avx2 tanh, length {len}");
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU reports AVX-512F.
                unsafe { super::super::wide::with_avx512(|| exp_slice_f32(x, &mut o)) };
                assert_eq!(bits(&o), bits(&e), "avx512 exp, length {len}");
                // SAFETY: as above.
                unsafe { super::super::wide::with_avx512(|| tanh_slice_f32(x, &mut o)) };
                assert_eq!(bits(&o), bits(&t), "avx512 tanh, length {len}");
            }
        }
    }

    /// Short slices take each element's branch, long ones compute both and select: the same bits.
    #[test]
    fn short_and_long_slices_give_the_same_tanh() {
        let x: Vec<f32> = [
            0.0,
            -0.0,
            0.399_999_98,
            0.4,
            -0.4,
            0.400_000_03,
            1.5,
            -7.25,
            9.5,
            30.0,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0137,
            -0.2,
        ]
        .into_iter()
        .cycle()
        .take(40)
        .collect();
        let mut long = vec![0.0f32; x.len()];
        f32::tanh_into(&x, &mut long);
        for (k, (&v, &want)) in x.iter().zip(&long).enumerate() {
            let mut one = [0.0f32];
            f32::tanh_into(&[v], &mut one);
            if want.is_nan() {
                assert!(one[0].is_nan(), "tanh({v}) at {k}");
            } else {
                assert_eq!(one[0].to_bits(), want.to_bits(), "tanh({v}) at {k}");
            }
        }
    }

    #[test]
    // Miri perturbs the results of transcendental functions by a few ulps on purpose, so the
    // reference itself is off there.
    #[cfg_attr(miri, ignore)]
    fn exp_close_to_libm() {
        let steps = if cfg!(miri) { 200 } else { 100_000 };
        for i in 0..=steps {
            let x = -80.0 + 160.0 * i as f32 / steps as f32;
            let got = exp_f32(x);
            let want = x.exp();
            assert!(ulps(got, want) <= 4, "exp({x}) = {got}, libm {want}");
        }
        let mut o = [0.0f32; 3];
        f32::exp_into(&[100.0, -100.0, 0.0], &mut o);
        assert_eq!(o[0], f32::INFINITY);
        assert!(o[1] >= 0.0 && o[1] < 1e-38);
        assert_eq!(o[2], 1.0);
        // A long slice with a few wild values among tame ones: each comes out right.
        let x: Vec<f32> = (0..37)
            .map(|i| match i {
                5 => f32::NAN,
                11 => -88.0,
                20 => 89.0,
                23 => 88.5,
                24 => 88.72,
                29 => f32::NEG_INFINITY,
                _ => i as f32 * 0.25 - 4.0,
            })
            .collect();
        let mut o = vec![0.0f32; x.len()];
        f32::exp_into(&x, &mut o);
        for (&v, &e) in x.iter().zip(&o) {
            let want = (v as f64).exp() as f32;
            if v.is_nan() {
                assert!(e.is_nan());
            } else if want == 0.0 || want.is_infinite() {
                assert_eq!(e, want, "exp({v})");
            } else if want < f32::MIN_POSITIVE {
                // A subnormal: rounded once from the polynomial's value.
                assert!(ulps(e, want) <= 1, "exp({v}) = {e:e}, want {want:e}");
            } else {
                assert!(ulps(e, want) <= 4, "exp({v}) = {e}, want {want}");
            }
        }
    }

    /// The whole-range exponential: the tame range's bits where that is defined, within 4 ulp
    /// of the correctly rounded value where the result is normal, 1 where it is subnormal,
    /// exactly 0 and +inf where those are the answers.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn exp_over_the_whole_range() {
        let steps = 400_000;
        for i in 0..=steps {
            let x = -110.0 + 200.0 * i as f32 / steps as f32;
            let got = exp_full_f32(x);
            let want = (x as f64).exp() as f32;
            if EXP_TAME.contains(&x) {
                assert_eq!(got.to_bits(), exp_f32(x).to_bits(), "exp({x})");
            }
            if want == 0.0 || want.is_infinite() {
                assert_eq!(got, want, "exp({x})");
            } else if want < f32::MIN_POSITIVE {
                assert!(ulps(got, want) <= 1, "exp({x}) = {got:e}, want {want:e}");
            } else {
                assert!(ulps(got, want) <= 4, "exp({x}) = {got:e}, want {want:e}");
            }
        }
        // The edges: the least subnormal's neighbourhood, the largest finite result, specials.
        for x in [-103.97, -103.9, -103.28, -87.34, 88.72, 88.7228, 88.7229] {
            let (got, want) = (exp_full_f32(x), (x as f64).exp() as f32);
            assert!(ulps(got, want) <= 1, "exp({x}) = {got:e}, want {want:e}");
        }
        assert_eq!(exp_full_f32(EXP_ZERO), 0.0);
        assert_eq!(exp_full_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_full_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_full_f32(89.0), f32::INFINITY);
        assert!(exp_full_f32(f32::NAN).is_nan());
        assert_eq!(exp_full_f32(0.0), 1.0);
        assert_eq!(exp_full_f32(-0.0), 1.0);
    }
}
