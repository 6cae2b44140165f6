//! Operator overloading for tensor handles. The operators panic with the typed error's message on
//! bad input (as `Vec`'s indexing does), reported at the caller's line (`#[track_caller]`); the
//! methods (`a.add(b)?`) return it.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::Tensor;

macro_rules! binop {
    ($trait:ident, $method:ident) => {
        impl<'g> $trait<Tensor<'g>> for Tensor<'g> {
            type Output = Tensor<'g>;
            #[track_caller]
            fn $method(self, rhs: Tensor<'g>) -> Tensor<'g> {
                or_panic(Tensor::$method(self, rhs))
            }
        }
        impl<'g> $trait<&Tensor<'g>> for &Tensor<'g> {
            type Output = Tensor<'g>;
            #[track_caller]
            fn $method(self, rhs: &Tensor<'g>) -> Tensor<'g> {
                or_panic(Tensor::$method(*self, *rhs))
            }
        }
    };
}
binop!(Add, add);
binop!(Sub, sub);
binop!(Mul, mul);
binop!(Div, div);

impl<'g> Mul<f64> for Tensor<'g> {
    type Output = Tensor<'g>;
    #[track_caller]
    fn mul(self, s: f64) -> Tensor<'g> {
        or_panic(self.scale(s))
    }
}

impl<'g> Div<f64> for Tensor<'g> {
    type Output = Tensor<'g>;
    #[track_caller]
    fn div(self, s: f64) -> Tensor<'g> {
        or_panic(self.scale(1.0 / s))
    }
}

impl<'g> Add<f64> for Tensor<'g> {
    type Output = Tensor<'g>;
    #[track_caller]
    fn add(self, s: f64) -> Tensor<'g> {
        or_panic(self.shift(s))
    }
}

impl<'g> Sub<f64> for Tensor<'g> {
    type Output = Tensor<'g>;
    #[track_caller]
    fn sub(self, s: f64) -> Tensor<'g> {
        or_panic(self.shift(-s))
    }
}

impl<'g> Neg for Tensor<'g> {
    type Output = Tensor<'g>;
    #[track_caller]
    fn neg(self) -> Tensor<'g> {
        or_panic(Tensor::neg(self))
    }
}

/// The tensor, or a panic with the error's message at the operator's caller.
#[track_caller]
#[inline]
fn or_panic(r: crate::Result<Tensor<'_>>) -> Tensor<'_> {
    match r {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}
