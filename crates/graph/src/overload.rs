//! Operator overloading for tensor handles. The operators panic with the typed error's message on
//! bad input (as `Vec`'s indexing does); the methods (`a.add(b)?`) return it.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::Tensor;

macro_rules! binop {
    ($trait:ident, $method:ident) => {
        impl<'g> $trait<Tensor<'g>> for Tensor<'g> {
            type Output = Tensor<'g>;
            fn $method(self, rhs: Tensor<'g>) -> Tensor<'g> {
                Tensor::$method(self, rhs).unwrap_or_else(|e| panic!("{e}"))
            }
        }
        impl<'g> $trait<&Tensor<'g>> for &Tensor<'g> {
            type Output = Tensor<'g>;
            fn $method(self, rhs: &Tensor<'g>) -> Tensor<'g> {
                Tensor::$method(*self, *rhs).unwrap_or_else(|e| panic!("{e}"))
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
    fn mul(self, s: f64) -> Tensor<'g> {
        self.scale(s).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<'g> Div<f64> for Tensor<'g> {
    type Output = Tensor<'g>;
    fn div(self, s: f64) -> Tensor<'g> {
        self.scale(1.0 / s).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<'g> Add<f64> for Tensor<'g> {
    type Output = Tensor<'g>;
    fn add(self, s: f64) -> Tensor<'g> {
        self.shift(s).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<'g> Sub<f64> for Tensor<'g> {
    type Output = Tensor<'g>;
    fn sub(self, s: f64) -> Tensor<'g> {
        self.shift(-s).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<'g> Neg for Tensor<'g> {
    type Output = Tensor<'g>;
    fn neg(self) -> Tensor<'g> {
        Tensor::neg(self).unwrap_or_else(|e| panic!("{e}"))
    }
}
