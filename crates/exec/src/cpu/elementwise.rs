//! Elementwise kernels: unary maps, their fused derivatives, and broadcasting binary maps.
//!
//! The per-element functions are the op tables' rows ([`crate::ops`]); this file has the loops
//! (tiny, vectorised, threaded) they run in. A few ops take a hand-written path instead of their
//! row (`exp` and `tanh` through [`super::fastmath`], the derivatives of `tanh` and `scale` as
//! single-slice loops, `shift`'s derivative of 1 as no pass at all); a test holds each such path
//! to its row.

use super::operand::Operand;
use super::par::{par_chunks_mut, PAR_MIN_ELEMS};
use super::wide::{wide, WIDE_MIN_ELEMS};
use crate::layout::{broadcast_strides, contiguous_strides, walk};
use crate::ops::{BinaryKernel, UnaryGradKernel, UnaryKernel};
use crate::{BinaryOp, Float, UnaryOp};

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
/// it must come back from (each arm jumps to its loop), so it saves no registers.
#[inline(never)]
fn tiny_loop<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// [`map_into`]'s tiny loop, in a function of its own: the dispatching function then makes no
/// call it must come back from (each arm jumps to its loop), so it saves no registers; the
/// slices come as arguments, in registers.
#[inline(never)]
fn map_tiny<T: Float>(x: &[T], out: &mut [T], f: impl Fn(T) -> T) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
}

/// [`zip3_in_place`]'s tiny loop (see [`map_tiny`]).
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

/// [`map_into`] over one slice, as a [`UnaryKernel`].
struct Map<'a, T> {
    x: &'a [T],
    out: &'a mut [T],
    threads: usize,
    tiny: bool,
}

impl<T: Float> UnaryKernel<T> for Map<'_, T> {
    type Out = ();
    #[inline(always)]
    fn run<F: Fn(T) -> T + Sync + Copy>(self, f: F) {
        map_into(self.x, self.out, self.threads, self.tiny, f)
    }
}

#[inline(always)]
fn unary_any<T: Float>(op: UnaryOp, x: &[T], out: &mut [T], threads: usize, tiny: bool) {
    debug_assert_eq!(x.len(), out.len());
    match op {
        UnaryOp::Exp if tiny => T::exp_into(x, out),
        UnaryOp::Exp => super::fastmath::exp_slice(x, out, threads),
        UnaryOp::Tanh if tiny => T::tanh_into(x, out),
        UnaryOp::Tanh => super::fastmath::tanh_slice(x, out, threads),
        _ => unary_row(op, x, out, threads, tiny),
    }
}

/// The unary op as its table row writes it (no hand-written path).
#[inline(always)]
fn unary_row<T: Float>(op: UnaryOp, x: &[T], out: &mut [T], threads: usize, tiny: bool) {
    op.with_forward(Map {
        x,
        out,
        threads,
        tiny,
    })
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

/// [`zip3_in_place`] over one gradient, as a [`UnaryGradKernel`].
struct Zip3<'a, T> {
    x: &'a [T],
    y: &'a [T],
    g: &'a mut [T],
    threads: usize,
    tiny: bool,
}

impl<T: Float> UnaryGradKernel<T> for Zip3<'_, T> {
    type Out = ();
    #[inline(always)]
    fn run<F: Fn(T, T, T) -> T + Sync + Copy>(self, f: F) {
        zip3_in_place(self.x, self.y, self.g, self.threads, self.tiny, &f)
    }
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
        // A derivative of 1 leaves the gradient as it is.
        UnaryOp::Shift(_) => {}
        // The tiny-op chain's hot cases: one slice's plain loop, no thread split.
        UnaryOp::Tanh => wide_unless(
            tiny,
            g.len(),
            #[inline(always)]
            move || {
                for (o, &yv) in g.iter_mut().zip(y) {
                    *o *= T::ONE - yv * yv;
                }
            },
        ),
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
        _ => unary_grad_row(op, x, y, g, threads, tiny),
    }
}

/// The unary derivative as its table row writes it.
#[inline(always)]
fn unary_grad_row<T: Float>(
    op: UnaryOp,
    x: &[T],
    y: &[T],
    g: &mut [T],
    threads: usize,
    tiny: bool,
) {
    op.with_grad(Zip3 {
        x,
        y,
        g,
        threads,
        tiny,
    })
}

#[inline(always)]
fn binary_rows<T: Float, F: Fn(T, T) -> T + Sync + Copy>(
    f: F,
    a: Operand<'_, &[T]>,
    b: Operand<'_, &[T]>,
    out: Operand<'_, &mut [T]>,
    threads: usize,
) {
    let (
        Operand {
            data: a,
            shape: ash,
        },
        Operand {
            data: b,
            shape: bsh,
        },
    ) = (a, b);
    let Operand {
        data: out,
        shape: osh,
    } = out;
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

/// `out = op(a, b)` with numpy broadcasting; `out`'s shape is the broadcast of `a`'s and `b`'s.
pub fn binary<T: Float>(
    op: BinaryOp,
    a: Operand<'_, &[T]>,
    b: Operand<'_, &[T]>,
    out: Operand<'_, &mut [T]>,
    threads: usize,
) {
    op.with_fn(Rows { a, b, out, threads })
}

/// [`binary_rows`] over one broadcast pair, as a [`BinaryKernel`].
struct Rows<'a, T> {
    a: Operand<'a, &'a [T]>,
    b: Operand<'a, &'a [T]>,
    out: Operand<'a, &'a mut [T]>,
    threads: usize,
}

impl<T: Float> BinaryKernel<T> for Rows<'_, T> {
    type Out = ();
    #[inline(always)]
    fn run<F: Fn(T, T) -> T + Sync + Copy>(self, f: F) {
        let Rows { a, b, out, threads } = self;
        binary_rows(f, a, b, out, threads)
    }
}

/// `out = cond != 0 ? a : b`, all three broadcast to `out`'s shape.
pub fn select<T: Float>(
    cond: Operand<'_, &[T]>,
    a: Operand<'_, &[T]>,
    b: Operand<'_, &[T]>,
    out: Operand<'_, &mut [T]>,
) {
    let osh = out.shape;
    let sc = broadcast_strides(cond.shape, osh);
    let sa = broadcast_strides(a.shape, osh);
    let sb = broadcast_strides(b.shape, osh);
    let so = contiguous_strides(osh);
    let (cond, a, b, out) = (cond.data, a.data, b.data, out.data);
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
        for &op in UnaryOp::SAMPLES {
            if cfg!(miri) && !libm_free(op) {
                continue;
            }
            let y_long = y_of(op, &long);
            // The incoming gradient of the in-place derivative: distinct values per element.
            let g_long: Vec<T> = (0..long.len())
                .map(|i| T::from_f64(0.5 + (i % 7) as f64 * 0.25))
                .collect();
            let mut dg_long = g_long.clone();
            unary_grad_in_place(op, &long, &y_long, &mut dg_long, 2);
            for n in 1..TINY_ELEMS {
                let (x, y) = (&long[..n], y_of(op, &long[..n]));
                assert!(same(&y, &y_long[..n]), "{op:?} forward, {n} elements");
                let mut dg = g_long[..n].to_vec();
                unary_grad_in_place(op, x, &y_long[..n], &mut dg, 2);
                assert!(same(&dg, &dg_long[..n]), "{op:?} backward, {n} elements");
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

    /// The hand-written paths (fastmath's `exp` and `tanh`, the `tanh` and `scale` derivative
    /// loops, `shift`'s empty derivative) give what the table's rows give: within a few units in the last place for the approximations,
    /// bit for bit otherwise.
    #[test]
    #[cfg_attr(miri, ignore)] // libm differs from call to call under Miri
    fn hand_written_paths_match_their_rows() {
        fn check<T: Float>(tol: f64) {
            let x: Vec<T> = (0..300)
                .map(|i| T::from_f64((i as f64 - 150.0) * 0.07))
                .collect();
            for &op in UnaryOp::SAMPLES {
                for tiny in [true, false] {
                    let (mut a, mut b) = (vec![T::ZERO; x.len()], vec![T::ZERO; x.len()]);
                    unary_any(op, &x, &mut a, 2, tiny);
                    unary_row(op, &x, &mut b, 2, tiny);
                    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                        let (a, b) = (a.to_f64(), b.to_f64());
                        let ok = a == b
                            || (a.is_nan() && b.is_nan())
                            || (a - b).abs() <= tol * b.abs().max(1e-30);
                        assert!(ok, "{op:?} forward at {}: {a} vs row {b}", x[i]);
                    }
                    let y = b;
                    let g0: Vec<T> = (0..x.len())
                        .map(|i| T::from_f64(0.5 + i as f64 * 0.01))
                        .collect();
                    let (mut ga, mut gb) = (g0.clone(), g0);
                    unary_grad_any(op, &x, &y, &mut ga, 2, tiny);
                    unary_grad_row(op, &x, &y, &mut gb, 2, tiny);
                    for (a, b) in ga.iter().zip(&gb) {
                        assert!(
                            a.to_f64().to_bits() == b.to_f64().to_bits()
                                || (a.to_f64().is_nan() && b.to_f64().is_nan()),
                            "{op:?} derivative"
                        );
                    }
                }
            }
        }
        check::<f32>(4.0 * f32::EPSILON as f64);
        check::<f64>(4.0 * f64::EPSILON);
    }

    #[test]
    fn broadcast_add_rows_and_columns() {
        let a = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
        let col = [10.0, 20.0];
        let mut out = [0.0; 6];
        binary(
            BinaryOp::Add,
            Operand::new(&a, &[2, 3]),
            Operand::new(&col, &[2, 1]),
            Operand::new(&mut out, &[2, 3]),
            1,
        );
        assert_eq!(out, [11.0, 12.0, 13.0, 24.0, 25.0, 26.0]);
        let row = [100.0, 200.0, 300.0];
        binary(
            BinaryOp::Sub,
            Operand::new(&row, &[3]),
            Operand::new(&a, &[2, 3]),
            Operand::new(&mut out, &[2, 3]),
            1,
        );
        assert_eq!(out, [99.0, 198.0, 297.0, 96.0, 195.0, 294.0]);
    }

    #[test]
    fn outer_product_by_broadcast() {
        let mut out = [0.0f32; 6];
        binary(
            BinaryOp::Mul,
            Operand::new(&[1.0, 2.0], &[2, 1]),
            Operand::new(&[1.0, 2.0, 3.0], &[1, 3]),
            Operand::new(&mut out, &[2, 3]),
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
        unary(UnaryOp::GeluTanh, &[0.0, 1.0, -1.0], &mut o, 1);
        assert!((o[1] - 0.841_191_990_607_9).abs() < 1e-12);
        unary(UnaryOp::Gelu, &[0.0, 1.0, -1.0], &mut o, 1);
        assert!((o[1] - 0.841_344_746_068_542_9).abs() < 1e-12);
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
