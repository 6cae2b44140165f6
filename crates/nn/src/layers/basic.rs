//! Parameter-free layers: activations, dropout, flatten, and closures as modules.

use arenagrad_graph::{BinaryOp, Graph, Tensor, UnaryOp};

use crate::error::{config, input_shape, Result};
use crate::module::Module;

macro_rules! activation {
    ($(#[$doc:meta])* $name:ident, $method:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name;

        impl Module for $name {
            fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
                Ok(x.$method()?)
            }
        }
    };
}

activation!(
    /// `max(x, 0)`, elementwise.
    ReLU,
    relu
);
activation!(
    /// `tanh x`, elementwise.
    Tanh,
    tanh
);
activation!(
    /// `1 / (1 + e^−x)`, elementwise.
    Sigmoid,
    sigmoid
);
activation!(
    /// GELU, exact: `x·Φ(x) = ½x(1 + erf(x/√2))` (PyTorch's default `GELU()`), elementwise.
    GELU,
    gelu
);
activation!(
    /// GELU in its tanh approximation, `½x(1 + tanh(√(2/π)(x + 0.044715x³)))` (PyTorch's
    /// `GELU(approximate="tanh")`), elementwise.
    GELUTanh,
    gelu_tanh
);

/// `x` where `x > 0`, `slope·x` elsewhere (PyTorch's `LeakyReLU`; default slope 0.01).
///
/// ```
/// use arenagrad_nn::{DType, Graph, LeakyReLU, Module};
/// let g = Graph::new();
/// let x = g.from_f64(&[-2.0, 3.0], &[2], DType::F64)?;
/// assert_eq!(LeakyReLU::new(0.2).forward(&g, x)?.to_vec::<f64>()?, vec![-0.4, 3.0]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeakyReLU {
    slope: f64,
}

impl Default for LeakyReLU {
    fn default() -> Self {
        LeakyReLU { slope: 0.01 }
    }
}

impl LeakyReLU {
    /// A leaky ReLU with negative slope `slope`.
    pub fn new(slope: f64) -> Self {
        LeakyReLU { slope }
    }
}

impl Module for LeakyReLU {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        // PyTorch's rule: x where x > 0, else slope·x — at 0 and at NaN the gradient is the
        // slope. `sign(x) == 1` marks exactly x > 0 (sign is 0 at NaN).
        let one = g.full_on(&[], 1.0, x.dtype(), x.device())?;
        let positive = x.unary(UnaryOp::Sign)?.binary(BinaryOp::EqMask, one)?;
        Ok(g.where_cond(positive, x, x.scale(self.slope)?)?)
    }
}

/// Inverted dropout: in training mode each element is zeroed with probability `p` and the rest
/// are scaled by `1/(1 − p)`; in evaluation mode, the identity. Draws from the graph's seeded
/// generator ([`Graph::seed`]), so a seeded run drops the same elements every time.
///
/// ```
/// use arenagrad_nn::{DType, Dropout, Graph, Module};
/// let mut d = Dropout::new(0.5)?;
/// let g = Graph::new();
/// g.seed(1);
/// let y = d.forward(&g, g.ones(&[1000], DType::F32)?)?.to_vec::<f32>()?;
/// assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
/// d.eval();
/// let y = d.forward(&g, g.ones(&[3], DType::F32)?)?.to_vec::<f32>()?;
/// assert_eq!(y, vec![1.0; 3]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    p: f64,
    training: bool,
}

impl Dropout {
    /// Dropout with drop probability `p` in `[0, 1)`, in training mode.
    pub fn new(p: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(config("Dropout", format!("p must be in [0, 1), got {p}")));
        }
        Ok(Dropout { p, training: true })
    }

    /// The drop probability.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }
}

impl Module for Dropout {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(x.dropout(self.p, self.training)?)
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// Merges axes `start..=end` into one (default: everything after the batch axis, giving
/// `[N, −1]`). Negative axes count from the end.
///
/// ```
/// use arenagrad_nn::{DType, Flatten, Graph, Module};
/// let g = Graph::new();
/// let y = Flatten::new().forward(&g, g.zeros(&[2, 3, 4, 5], DType::F32)?)?;
/// assert_eq!(y.shape().as_slice(), &[2, 60]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flatten {
    start: isize,
    end: isize,
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten { start: 1, end: -1 }
    }
}

impl Flatten {
    /// Flattens all axes after the first.
    pub fn new() -> Self {
        Self::default()
    }

    /// Flattens axes `start..=end`.
    pub fn range(start: isize, end: isize) -> Self {
        Flatten { start, end }
    }
}

impl Module for Flatten {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let s = x.try_shape()?;
        let r = s.len() as isize;
        let norm = |a: isize| if a < 0 { a + r } else { a };
        let (a, b) = (norm(self.start), norm(self.end));
        if r == 0 || a < 0 || b >= r || a > b {
            return Err(input_shape(
                "Flatten",
                &format!("a tensor with axes {}..={}", self.start, self.end),
                &s,
            ));
        }
        let (a, b) = (a as usize, b as usize);
        let mut out: Vec<isize> = s[..a].iter().map(|&d| d as isize).collect();
        out.push(s[a..=b].iter().product::<usize>() as isize);
        out.extend(s[b + 1..].iter().map(|&d| d as isize));
        Ok(x.reshape(&out)?)
    }
}

/// A function of one tensor as a module without parameters (a reshape, a scaling, a custom
/// activation inside a [`crate::Sequential`]).
///
/// ```
/// use arenagrad_nn::{DType, Graph, Lambda, Module};
/// let half = Lambda::new(|_g, x| Ok(x.scale(0.5)?));
/// let g = Graph::new();
/// assert_eq!(half.forward(&g, g.ones(&[2], DType::F64)?)?.to_vec::<f64>()?, vec![0.5, 0.5]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub struct Lambda<F> {
    f: F,
}

impl<F> Lambda<F>
where
    F: for<'g> Fn(&'g Graph, Tensor<'g>) -> Result<Tensor<'g>>,
{
    /// Wraps `f`.
    pub fn new(f: F) -> Self {
        Lambda { f }
    }
}

impl<F> std::fmt::Debug for Lambda<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lambda")
    }
}

impl<F> Module for Lambda<F>
where
    F: for<'g> Fn(&'g Graph, Tensor<'g>) -> Result<Tensor<'g>>,
{
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        (self.f)(g, x)
    }
}
