//! Elementwise kernels: unary maps, their fused derivatives, and broadcasting binary maps.

use super::par::{par_chunks_mut, PAR_MIN_ELEMS};
use super::wide::{wide, WIDE_MIN_ELEMS};
use crate::layout::{broadcast_strides, contiguous_strides, walk};
use crate::{BinaryOp, Float, UnaryOp};

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044_715;

/// `x^p` as PyTorch computes a power with a scalar exponent: `±0.5` through the square root
/// (so `(-inf)^0.5` is NaN, not C's `+inf`), every other exponent through `pow`.
#[inline(always)]
fn pow_scalar<T: Float>(x: T, p: f64) -> T {
    if p == 0.5 {
        x.sqrt()
    } else if p == -0.5 {
        T::ONE / x.sqrt()
    } else {
        x.powf(T::from_f64(p))
    }
}

#[inline(always)]
fn sigmoid<T: Float>(x: T) -> T {
    // Stable on both tails: never exponentiates a large positive number.
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

#[inline(always)]
fn gelu<T: Float>(x: T) -> T {
    let c = T::from_f64(SQRT_2_OVER_PI);
    let u = c * (x + T::from_f64(GELU_C) * x * x * x);
    T::from_f64(0.5) * x * (T::ONE + u.tanh())
}

#[inline(always)]
fn gelu_grad<T: Float>(x: T) -> T {
    let c = T::from_f64(SQRT_2_OVER_PI);
    let k = T::from_f64(GELU_C);
    let t = (c * (x + k * x * x * x)).tanh();
    let half = T::from_f64(0.5);
    half * (T::ONE + t) + half * x * (T::ONE - t * t) * c * (T::ONE + T::from_f64(3.0) * k * x * x)
}

/// Below this many elements an elementwise kernel is one plain loop, with no thread split and no
/// width dispatch, in a function small enough to need no saved registers: at that size (the
/// tiny-op chain's) the call around the loop is most of the cost.
const TINY_ELEMS: usize = WIDE_MIN_ELEMS;

/// Runs `f`, the hot loop over `len` elements, at the widest SIMD level, or when `tiny` as a
/// plain [`tiny_loop`].
#[inline(always)]
fn wide_unless<R>(tiny: bool, len: usize, f: impl FnOnce() -> R) -> R {
    if tiny {
        tiny_loop(f)
    } else {
        wide(len, f)
    }
}

/// A tiny kernel's loop, in a function of its own: the dispatching function then makes no call
/// it must come back from (each arm jumps to its loop), so it saves no registers. [`map_tiny`]
/// and [`zip3_tiny`] take their slices as arguments, in registers.
#[inline(never)]
fn tiny_loop<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// [`map_into`]'s tiny loop (see [`tiny_loop`]).
#[inline(never)]
fn map_tiny<T: Float>(x: &[T], out: &mut [T], f: impl Fn(T) -> T) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
}

/// [`zip3_in_place`]'s tiny loop (see [`tiny_loop`]).
#[inline(never)]
fn zip3_tiny<T: Float, F: Fn(T, T, T) -> T + ?Sized>(x: &[T], y: &[T], g: &mut [T], f: &F) {
    for ((o, &xv), &yv) in g.iter_mut().zip(x).zip(y) {
        *o = f(xv, yv, *o);
    }
}

#[inline(always)]
fn map_into<T: Float>(
    x: &[T],
    out: &mut [T],
    threads: usize,
    tiny: bool,
    f: impl Fn(T) -> T + Sync + Copy,
) {
    if tiny {
        return map_tiny(x, out, f);
    }
    par_chunks_mut(out, threads, PAR_MIN_ELEMS, |start, o| {
        let xs = &x[start..start + o.len()];
        wide(
            o.len(),
            #[inline(always)]
            move || {
                for (o, &v) in o.iter_mut().zip(xs) {
                    *o = f(v);
                }
            },
        )
    });
}

/// `out[i] = op(x[i])`. `x` and `out` have the same length.
#[inline(always)]
pub fn unary<T: Float>(op: UnaryOp, x: &[T], out: &mut [T], threads: usize) {
    if out.len() < TINY_ELEMS {
        unary_tiny(op, x, out)
    } else {
        unary_wide(op, x, out, threads)
    }
}

#[inline(never)]
fn unary_tiny<T: Float>(op: UnaryOp, x: &[T], out: &mut [T]) {
    unary_any(op, x, out, 1, true)
}

#[inline(never)]
fn unary_wide<T: Float>(op: UnaryOp, x: &[T], out: &mut [T], threads: usize) {
    unary_any(op, x, out, threads, false)
}

#[inline(always)]
fn unary_any<T: Float>(op: UnaryOp, x: &[T], out: &mut [T], threads: usize, tiny: bool) {
    debug_assert_eq!(x.len(), out.len());
    match op {
        UnaryOp::Neg => map_into(x, out, threads, tiny, |v| -v),
        UnaryOp::Exp if tiny => T::exp_into(x, out),
        UnaryOp::Exp => super::fastmath::exp_slice(x, out, threads),
        UnaryOp::Log => map_into(x, out, threads, tiny, |v| v.ln()),
        UnaryOp::Sqrt => map_into(x, out, threads, tiny, |v| v.sqrt()),
        UnaryOp::Abs => map_into(x, out, threads, tiny, |v| v.abs()),
        UnaryOp::Sin => map_into(x, out, threads, tiny, |v| v.sin()),
        UnaryOp::Cos => map_into(x, out, threads, tiny, |v| v.cos()),
        UnaryOp::Tanh if tiny => T::tanh_into(x, out),
        UnaryOp::Tanh => super::fastmath::tanh_slice(x, out, threads),
        UnaryOp::Sigmoid => map_into(x, out, threads, tiny, sigmoid),
        // `v < 0`, so that NaN stays NaN (as PyTorch's relu) and −0 stays −0.
        UnaryOp::Relu => map_into(
            x,
            out,
            threads,
            tiny,
            |v| if v < T::ZERO { T::ZERO } else { v },
        ),
        UnaryOp::Gelu => map_into(x, out, threads, tiny, gelu),
        UnaryOp::Sign => map_into(x, out, threads, tiny, |v| {
            if v > T::ZERO {
                T::ONE
            } else if v < T::ZERO {
                -T::ONE
            } else {
                T::ZERO
            }
        }),
        // relu's derivative as a value: 0 where `v <= 0`, else 1 (NaN included, as PyTorch's
        // `threshold_backward` passes the gradient through a NaN).
        UnaryOp::Step => map_into(x, out, threads, tiny, |v| {
            if v <= T::ZERO {
                T::ZERO
            } else {
                T::ONE
            }
        }),
        UnaryOp::Scale(s) => {
            let s = T::from_f64(s);
            map_into(x, out, threads, tiny, move |v| v * s)
        }
        UnaryOp::Shift(s) => {
            let s = T::from_f64(s);
            map_into(x, out, threads, tiny, move |v| v + s)
        }
        UnaryOp::Powf(p) => {
            if p == 2.0 {
                map_into(x, out, threads, tiny, |v| v * v)
            } else {
                map_into(x, out, threads, tiny, move |v| pow_scalar(v, p))
            }
        }
        UnaryOp::GeluGrad => map_into(x, out, threads, tiny, gelu_grad),
    }
}

/// `g[i] = f(x[i], y[i], g[i])`, monomorphised per `f` so the loop inlines and vectorises.
#[inline(always)]
fn zip3_in_place<T: Float, F: Fn(T, T, T) -> T + Sync + ?Sized>(
    x: &[T],
    y: &[T],
    g: &mut [T],
    threads: usize,
    tiny: bool,
    f: &F,
) {
    if tiny {
        return zip3_tiny(x, y, g, f);
    }
    par_chunks_mut(g, threads, PAR_MIN_ELEMS, |start, o| {
        let end = start + o.len();
        let (x, y) = (&x[start..end], &y[start..end]);
        wide(
            o.len(),
            #[inline(always)]
            move || {
                for ((o, &xv), &yv) in o.iter_mut().zip(x).zip(y) {
                    *o = f(xv, yv, *o);
                }
            },
        )
    })
}

/// The fused derivative: `out[i] = gy[i] * op'(x[i])`, where `y` is the forward output (the
/// derivatives of `exp`, `tanh`, `sigmoid` and `sqrt` are cheapest written in it).
pub fn unary_grad<T: Float>(
    op: UnaryOp,
    x: &[T],
    y: &[T],
    gy: &[T],
    out: &mut [T],
    threads: usize,
) {
    debug_assert!(gy.len() == out.len());
    out.copy_from_slice(gy);
    unary_grad_in_place(op, x, y, out, threads);
}

/// [`unary_grad`] written over the incoming gradient: `g[i] = g[i] * op'(x[i])`. Backward uses
/// it when it holds the only claim on the gradient, so a chain of elementwise ops needs no new
/// buffer per step.
#[inline(always)]
pub fn unary_grad_in_place<T: Float>(op: UnaryOp, x: &[T], y: &[T], g: &mut [T], threads: usize) {
    if g.len() < TINY_ELEMS {
        unary_grad_tiny(op, x, y, g)
    } else {
        unary_grad_wide(op, x, y, g, threads)
    }
}

#[inline(never)]
fn unary_grad_tiny<T: Float>(op: UnaryOp, x: &[T], y: &[T], g: &mut [T]) {
    unary_grad_any(op, x, y, g, 1, true)
}

#[inline(never)]
fn unary_grad_wide<T: Float>(op: UnaryOp, x: &[T], y: &[T], g: &mut [T], threads: usize) {
    unary_grad_any(op, x, y, g, threads, false)
}

#[inline(always)]
fn unary_grad_any<T: Float>(
    op: UnaryOp,
    x: &[T],
    y: &[T],
    g: &mut [T],
    threads: usize,
    tiny: bool,
) {
    debug_assert!(x.len() == g.len() && y.len() == g.len());
    match op {
        UnaryOp::Neg => {
            for v in g.iter_mut() {
                *v = -*v;
            }
        }
        UnaryOp::Exp => zip3_in_place(x, y, g, threads, tiny, &|_, y, g| g * y),
        UnaryOp::Log => zip3_in_place(x, y, g, threads, tiny, &|x, _, g| g / x),
        UnaryOp::Sqrt => zip3_in_place(x, y, g, threads, tiny, &|_, y, g| g * T::from_f64(0.5) / y),
        UnaryOp::Abs | UnaryOp::Sign => zip3_in_place(x, y, g, threads, tiny, &|x, _, g| {
            if x > T::ZERO {
                g
            } else if x < T::ZERO {
                -g
            } else {
                T::ZERO
            }
        }),
        UnaryOp::Sin => zip3_in_place(x, y, g, threads, tiny, &|x, _, g| g * x.cos()),
        UnaryOp::Cos => zip3_in_place(x, y, g, threads, tiny, &|x, _, g| -(g * x.sin())),
        UnaryOp::Tanh => {
            // The hot case of the tiny-op chain: a plain loop the compiler vectorises.
            wide_unless(
                tiny,
                g.len(),
                #[inline(always)]
                move || {
                    for (o, &yv) in g.iter_mut().zip(y) {
                        *o *= T::ONE - yv * yv;
                    }
                },
            )
        }
        UnaryOp::Sigmoid => zip3_in_place(x, y, g, threads, tiny, &|_, y, g| g * y * (T::ONE - y)),
        UnaryOp::Relu | UnaryOp::Step => zip3_in_place(x, y, g, threads, tiny, &|x, _, g| {
            if x <= T::ZERO {
                T::ZERO
            } else {
                g
            }
        }),
        UnaryOp::Gelu => zip3_in_place(x, y, g, threads, tiny, &|x, _, g| g * gelu_grad(x)),
        UnaryOp::Scale(s) => {
            let s = T::from_f64(s);
            wide_unless(
                tiny,
                g.len(),
                #[inline(always)]
                move || {
                    for v in g.iter_mut() {
                        *v *= s;
                    }
                },
            )
        }
        UnaryOp::Shift(_) => {}
        // x⁰ is constant: its derivative is 0 everywhere, also where `0·x⁻¹` would be NaN
        // (PyTorch's rule).
        UnaryOp::Powf(0.0) => g.fill(T::ZERO),
        UnaryOp::Powf(p) => {
            let pm1 = p - 1.0;
            let pt = T::from_f64(p);
            zip3_in_place(x, y, g, threads, tiny, &move |x, _, g| {
                g * pt * pow_scalar(x, pm1)
            })
        }
        UnaryOp::GeluGrad => {
            // d/dx gelu'(x), by central difference of the closed form would lose precision; the
            // graph never asks for it (gelu's create_graph rule is written in primitive ops).
            unreachable!("invariant: GeluGrad has no fused derivative")
        }
    }
}

#[inline(always)]
fn binary_fn<T: Float>(op: BinaryOp) -> fn(T, T) -> T {
    match op {
        BinaryOp::Add => |a, b| a + b,
        BinaryOp::Sub => |a, b| a - b,
        BinaryOp::Mul => |a, b| a * b,
        BinaryOp::Div => |a, b| a / b,
        BinaryOp::Pow => |a, b| a.powf(b),
        BinaryOp::Maximum => |a: T, b| a.max(b),
        BinaryOp::Minimum => |a: T, b| a.min(b),
        // maximum's share of the gradient for `a`: none where `a < b`, half on a tie, all
        // otherwise (a NaN on either side included, as PyTorch's rule).
        BinaryOp::GtMask => |a, b| {
            if a < b {
                T::ZERO
            } else if a == b {
                T::from_f64(0.5)
            } else {
                T::ONE
            }
        },
        // NaN matches NaN, so the maximum of a slice holding NaN is found among its NaNs.
        #[allow(clippy::eq_op)]
        BinaryOp::EqMask => |a, b| {
            if a == b || (a != a && b != b) {
                T::ONE
            } else {
                T::ZERO
            }
        },
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn binary_rows<T: Float, F: Fn(T, T) -> T + Sync + Copy>(
    f: F,
    a: &[T],
    ash: &[usize],
    b: &[T],
    bsh: &[usize],
    out: &mut [T],
    osh: &[usize],
    threads: usize,
) {
    if ash == osh && bsh == osh {
        par_chunks_mut(out, threads, PAR_MIN_ELEMS, |start, o| {
            let end = start + o.len();
            let (a, b) = (&a[start..end], &b[start..end]);
            wide(
                o.len(),
                #[inline(always)]
                move || {
                    for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
                        *o = f(x, y);
                    }
                },
            )
        });
        return;
    }
    if b.len() == 1 && ash == osh {
        let y = b[0];
        par_chunks_mut(out, threads, PAR_MIN_ELEMS, |start, o| {
            let a = &a[start..start + o.len()];
            wide(
                o.len(),
                #[inline(always)]
                move || {
                    for (o, &x) in o.iter_mut().zip(a) {
                        *o = f(x, y);
                    }
                },
            )
        });
        return;
    }
    if a.len() == 1 && bsh == osh {
        let x = a[0];
        par_chunks_mut(out, threads, PAR_MIN_ELEMS, |start, o| {
            let b = &b[start..start + o.len()];
            wide(
                o.len(),
                #[inline(always)]
                move || {
                    for (o, &y) in o.iter_mut().zip(b) {
                        *o = f(x, y);
                    }
                },
            )
        });
        return;
    }
    let sa = broadcast_strides(ash, osh);
    let sb = broadcast_strides(bsh, osh);
    let so = contiguous_strides(osh);
    walk(osh, [&so, &sa, &sb], |[oo, oa, ob], n, [_, ia, ib]| {
        let o = &mut out[oo..oo + n];
        match (ia, ib) {
            (1, 1) => {
                for ((o, &x), &y) in o.iter_mut().zip(&a[oa..oa + n]).zip(&b[ob..ob + n]) {
                    *o = f(x, y);
                }
            }
            (1, 0) => {
                let y = b[ob];
                for (o, &x) in o.iter_mut().zip(&a[oa..oa + n]) {
                    *o = f(x, y);
                }
            }
            (0, 1) => {
                let x = a[oa];
                for (o, &y) in o.iter_mut().zip(&b[ob..ob + n]) {
                    *o = f(x, y);
                }
            }
            _ => {
                for (i, o) in o.iter_mut().enumerate() {
                    *o = f(a[oa + i * ia], b[ob + i * ib]);
                }
            }
        }
    });
}

/// `out = op(a, b)` with numpy broadcasting; `osh` is the broadcast of `ash` and `bsh`.
#[allow(clippy::too_many_arguments)]
pub fn binary<T: Float>(
    op: BinaryOp,
    a: &[T],
    ash: &[usize],
    b: &[T],
    bsh: &[usize],
    out: &mut [T],
    osh: &[usize],
    threads: usize,
) {
    match op {
        BinaryOp::Add => binary_rows(|x, y| x + y, a, ash, b, bsh, out, osh, threads),
        BinaryOp::Sub => binary_rows(|x, y| x - y, a, ash, b, bsh, out, osh, threads),
        BinaryOp::Mul => binary_rows(|x, y| x * y, a, ash, b, bsh, out, osh, threads),
        BinaryOp::Div => binary_rows(|x, y| x / y, a, ash, b, bsh, out, osh, threads),
        _ => binary_rows(binary_fn::<T>(op), a, ash, b, bsh, out, osh, threads),
    }
}

/// `out = cond != 0 ? a : b`, all three broadcast to `osh`.
#[allow(clippy::too_many_arguments)]
pub fn select<T: Float>(
    cond: &[T],
    csh: &[usize],
    a: &[T],
    ash: &[usize],
    b: &[T],
    bsh: &[usize],
    out: &mut [T],
    osh: &[usize],
) {
    let sc = broadcast_strides(csh, osh);
    let sa = broadcast_strides(ash, osh);
    let sb = broadcast_strides(bsh, osh);
    let so = contiguous_strides(osh);
    walk(
        osh,
        [&so, &sc, &sa, &sb],
        |[oo, oc, oa, ob], n, [_, ic, ia, ib]| {
            for i in 0..n {
                out[oo + i] = if cond[oc + i * ic] != T::ZERO {
                    a[oa + i * ia]
                } else {
                    b[ob + i * ib]
                };
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernels under `TINY_ELEMS` elements take their own loops: each element must come out as
    /// it does in a long slice (the vectorised, possibly threaded path), bit for bit.
    fn tiny_matches_wide<T: Float + std::fmt::Debug>(vals: &[T]) {
        // Long enough for the threaded path natively; under Miri, for the vectorised one.
        let long_len = if cfg!(miri) { 67 } else { 4 * 1024 + 3 };
        let long: Vec<T> = vals.iter().cycle().take(long_len).copied().collect();
        let y_of = |op, x: &[T]| {
            let mut y = vec![T::ZERO; x.len()];
            unary(op, x, &mut y, 2);
            y
        };
        // Bit for bit (any NaN for a NaN).
        let same = |a: &[T], b: &[T]| {
            a.len() == b.len()
                && a.iter().zip(b).all(|(a, b)| {
                    let (a, b) = (a.to_f64(), b.to_f64());
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
                })
        };
        // Miri makes libm's functions return slightly different results from call to call:
        // there the comparison takes the ops computed without them.
        let libm_free = |op| {
            use UnaryOp::*;
            matches!(
                op,
                Neg | Abs | Sqrt | Relu | Sign | Step | Scale(_) | Shift(_)
            )
        };
        for op in crate::ALL_UNARY_OPS {
            if cfg!(miri) && !libm_free(op) {
                continue;
            }
            let y_long = y_of(op, &long);
            // The incoming gradient of the in-place derivative: distinct values per element.
            let g_long: Vec<T> = (0..long.len())
                .map(|i| T::from_f64(0.5 + (i % 7) as f64 * 0.25))
                .collect();
            let mut dg_long = g_long.clone();
            if op != UnaryOp::GeluGrad {
                unary_grad_in_place(op, &long, &y_long, &mut dg_long, 2);
            }
            for n in 1..TINY_ELEMS {
                let (x, y) = (&long[..n], y_of(op, &long[..n]));
                assert!(same(&y, &y_long[..n]), "{op:?} forward, {n} elements");
                if op != UnaryOp::GeluGrad {
                    let mut dg = g_long[..n].to_vec();
                    unary_grad_in_place(op, x, &y_long[..n], &mut dg, 2);
                    assert!(same(&dg, &dg_long[..n]), "{op:?} backward, {n} elements");
                }
            }
        }
    }

    #[test]
    fn tiny_kernels_give_the_long_kernels_bits() {
        let vals = [
            0.3, -0.2, 1.7, -2.5, 0.0, 9.0, -0.01, 0.45, -7.25, 3.5, 0.999, -1.0, 20.0, 1e-3, -40.0,
        ];
        tiny_matches_wide::<f64>(&vals);
        tiny_matches_wide::<f32>(&vals.map(|v| v as f32));
    }

    #[test]
    fn broadcast_add_rows_and_columns() {
        let a = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
        let col = [10.0, 20.0];
        let mut out = [0.0; 6];
        binary(
            BinaryOp::Add,
            &a,
            &[2, 3],
            &col,
            &[2, 1],
            &mut out,
            &[2, 3],
            1,
        );
        assert_eq!(out, [11.0, 12.0, 13.0, 24.0, 25.0, 26.0]);
        let row = [100.0, 200.0, 300.0];
        binary(BinaryOp::Sub, &row, &[3], &a, &[2, 3], &mut out, &[2, 3], 1);
        assert_eq!(out, [99.0, 198.0, 297.0, 96.0, 195.0, 294.0]);
    }

    #[test]
    fn outer_product_by_broadcast() {
        let mut out = [0.0f32; 6];
        binary(
            BinaryOp::Mul,
            &[1.0, 2.0],
            &[2, 1],
            &[1.0, 2.0, 3.0],
            &[1, 3],
            &mut out,
            &[2, 3],
            1,
        );
        assert_eq!(out, [1.0, 2.0, 3.0, 2.0, 4.0, 6.0]);
    }

    #[test]
    fn unary_values() {
        let x = [-1.0f64, 0.0, 2.0];
        let mut o = [0.0; 3];
        unary(UnaryOp::Relu, &x, &mut o, 1);
        assert_eq!(o, [0.0, 0.0, 2.0]);
        unary(UnaryOp::Sigmoid, &[-1000.0, 0.0, 1000.0], &mut o, 1);
        assert_eq!(o, [0.0, 0.5, 1.0]);
        unary(UnaryOp::Gelu, &[0.0, 1.0, -1.0], &mut o, 1);
        assert!((o[1] - 0.841_191_990_607_9).abs() < 1e-12);
    }

    #[test]
    #[cfg_attr(miri, ignore)] // hundreds of thousands of elements: too slow to interpret
    fn large_parallel_matches_serial() {
        let n = PAR_MIN_ELEMS * 3 + 7;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 1e-4).sin()).collect();
        let mut a = vec![0.0; n];
        let mut b = vec![0.0; n];
        unary(UnaryOp::Exp, &x, &mut a, 1);
        unary(UnaryOp::Exp, &x, &mut b, 2);
        assert_eq!(a, b);
    }
}
