//! Gradient checking against central finite differences.
//!
//! [`gradcheck`] evaluates a function of tensors in `f64`, projects its output onto fixed random
//! weights (so one backward pass checks a random vector–Jacobian product, which catches a wrong
//! derivative with probability one), and compares every input element's analytic gradient with
//! `(L(x+ε) − L(x−ε)) / 2ε`. Tolerances default to PyTorch's: ε = 1e-6, atol = 1e-5,
//! rtol = 1e-3. [`gradgradcheck`] does the same for the gradient itself (built with
//! `create_graph`), which checks second derivatives.

use crate::{Rng, Storage};

use crate::error::Result;
use crate::{BackwardOptions, DType, Graph, HostTensor, Tensor};

/// Tolerances and seed of a check.
#[derive(Debug, Clone, Copy)]
pub struct GradcheckOptions {
    /// Finite-difference step.
    pub eps: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
    /// Seed of the projection weights.
    pub seed: u64,
    /// Where the function runs: its inputs are made on this device.
    pub device: crate::Device,
}

impl GradcheckOptions {
    /// Refuses a step that is not a positive finite number and tolerances that are negative or
    /// NaN: with them every comparison would fail (or pass) whatever the gradients are.
    pub fn validate(&self) -> Result<()> {
        let bad = |what| {
            Err(crate::GraphError::BadArgument {
                op: "gradcheck",
                what,
            })
        };
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("eps must be a positive finite step");
        }
        if self.atol.is_nan() || self.atol < 0.0 || self.rtol.is_nan() || self.rtol < 0.0 {
            return bad("atol and rtol must be non-negative numbers");
        }
        Ok(())
    }
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions {
            eps: 1e-6,
            atol: 1e-5,
            rtol: 1e-3,
            seed: 0x5eed,
            device: crate::Device::Cpu,
        }
    }
}

/// The worst element found, per input.
#[derive(Debug, Clone, PartialEq)]
pub struct InputReport {
    /// Index of the input.
    pub input: usize,
    /// Flat index of the worst element.
    pub worst_index: usize,
    /// Analytic gradient there.
    pub analytic: f64,
    /// Numerical gradient there.
    pub numerical: f64,
    /// `|analytic − numerical| − rtol·|numerical|`, the amount over `atol` (≤ atol passes).
    pub excess: f64,
}

/// The result of a check.
#[derive(Debug, Clone, PartialEq)]
pub struct GradcheckReport {
    /// One entry per input.
    pub inputs: Vec<InputReport>,
    /// Whether every element is within tolerance.
    pub passed: bool,
}

impl std::fmt::Display for GradcheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for r in &self.inputs {
            writeln!(
                f,
                "input {}: worst element {} analytic {:.9e} numerical {:.9e}",
                r.input, r.worst_index, r.analytic, r.numerical
            )?;
        }
        write!(
            f,
            "{}",
            if self.passed {
                "gradcheck passed"
            } else {
                "gradcheck FAILED"
            }
        )
    }
}

/// A function under test: builds its output from its inputs on the given graph.
pub trait CheckFn: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>> {}
impl<F: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>> CheckFn for F {}

/// Pins a closure to the higher-ranked signature of [`CheckFn`] (closures infer it only from a
/// direct `Fn` bound). Wrap a closure in it wherever it is stored or passed on before
/// [`gradcheck`] sees it:
///
/// ```
/// use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, GradcheckOptions};
/// use arenagrad_graph::{DType, HostTensor, UnaryOp};
/// // f(a, b) = Σ tanh(a) · b, checked at a random point in both inputs, to second order too.
/// let f = check_fn(|_g, xs| xs[0].unary(UnaryOp::Tanh)?.mul(xs[1])?.sum());
/// let at = [
///     HostTensor::from_f64(&[0.1, -0.4, 0.9], &[3], DType::F64)?,
///     HostTensor::from_f64(&[1.5, 0.2, -0.7], &[3], DType::F64)?,
/// ];
/// let report = gradcheck(&f, &at, GradcheckOptions::default())?;
/// assert!(report.passed, "{report}");
/// assert!(gradgradcheck(&f, &at, GradcheckOptions::default())?.passed);
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
pub fn check_fn<F>(f: F) -> F
where
    F: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
{
    f
}

fn weights(n: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng::seed(seed);
    (0..n).map(|_| r.normal()).collect()
}

/// f(x) as `f64` values, evaluated without recording.
fn outputs(g: &mut Graph, f: &impl CheckFn, inputs: &[HostTensor]) -> Result<Vec<f64>> {
    let r = (|| {
        // Inputs require grad so that functions which differentiate internally (gradgradcheck)
        // evaluate the same way here as in the analytic pass.
        let xs = inputs
            .iter()
            .map(|h| g.leaf(&h.to_f64_vec(), h.shape(), DType::F64))
            .collect::<Result<Vec<_>>>()?;
        f(g, &xs)?.to_vec_f64()
    })();
    g.reset();
    r
}

/// The central difference of Σ w·f along one input element: each output's difference first,
/// then the projection, so that a small output's change is not lost in a large output's
/// rounding (as differencing the projected sums would lose it).
fn projected_difference(plus: &[f64], minus: &[f64], w: &[f64], eps: f64) -> f64 {
    plus.iter()
        .zip(minus)
        .zip(w)
        .map(|((p, m), w)| w * (p - m))
        .sum::<f64>()
        / (2.0 * eps)
}

/// Checks the gradients of `f` at `inputs` (converted to `f64`).
///
/// # Examples
///
/// Backward's gradient of `Σ w·f` (with random weights `w`) is held to central differences,
/// element by element; a gradient that goes wrong anywhere on the way back fails the check:
///
/// ```
/// use arenagrad_graph::check::{check_fn, gradcheck, GradcheckOptions};
/// use arenagrad_graph::{DType, HostTensor};
/// // torch.autograd.gradcheck(lambda x: (x.sin() * x).sum(), (x,))
/// let at = [HostTensor::from_f64(&[0.3, -1.2, 2.0], &[3], DType::F64)?];
/// let report = gradcheck(|_g, xs| xs[0].sin()?.mul(xs[0])?.sum(), &at, GradcheckOptions::default())?;
/// assert!(report.passed, "{report}");
/// // The same function with sin's gradient doubled by a hook on its way back: caught.
/// let doubled = check_fn(|_g, xs| {
///     let s = xs[0].sin()?;
///     s.register_hook(|gs| Ok(Some(gs.scale(2.0)?)))?;
///     s.mul(xs[0])?.sum()
/// });
/// let report = gradcheck(doubled, &at, GradcheckOptions::default())?;
/// assert!(!report.passed, "the check must catch a doubled gradient");
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
pub fn gradcheck<F>(f: F, inputs: &[HostTensor], opts: GradcheckOptions) -> Result<GradcheckReport>
where
    F: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
{
    opts.validate()?;
    let mut g = Graph::with_threads(1);
    g.set_device(opts.device)?;
    // Analytic: one backward of Σ w·f.
    let mut w: Vec<f64> = Vec::new();
    let analytic: Vec<Vec<f64>> = {
        let r = (|| {
            let xs = inputs
                .iter()
                .map(|h| g.leaf(&h.to_f64_vec(), h.shape(), DType::F64))
                .collect::<Result<Vec<_>>>()?;
            let y = f(&g, &xs)?;
            let ws = weights(y.numel(), opts.seed);
            let wt = g.from_f64(&ws, &y.shape(), DType::F64)?;
            w = ws;
            let l = y.mul(wt)?.sum()?;
            if l.requires_grad() {
                l.backward()?;
            }
            xs.iter()
                .map(|x| match x.grad()? {
                    Some(gr) => gr.to_vec_f64(),
                    None => Ok(vec![0.0; x.numel()]),
                })
                .collect::<Result<Vec<_>>>()
        })();
        g.reset();
        r?
    };
    let mut reports = Vec::new();
    let mut passed = true;
    let mut work: Vec<HostTensor> = inputs
        .iter()
        .map(|h| HostTensor::new(h.to_f64_vec(), h.shape()))
        .collect::<Result<_>>()?;
    for (k, a) in analytic.iter().enumerate() {
        let mut worst = InputReport {
            input: k,
            worst_index: 0,
            analytic: 0.0,
            numerical: 0.0,
            excess: f64::NEG_INFINITY,
        };
        #[allow(clippy::needless_range_loop)]
        for j in 0..a.len() {
            let orig = get(&work[k], j);
            set(&mut work[k], j, orig + opts.eps);
            let yp = outputs(&mut g, &f, &work)?;
            set(&mut work[k], j, orig - opts.eps);
            let ym = outputs(&mut g, &f, &work)?;
            set(&mut work[k], j, orig);
            if yp.len() != w.len() || ym.len() != w.len() {
                return Err(crate::GraphError::BadArgument {
                    op: "gradcheck",
                    what: "the function's output changed size between evaluations",
                });
            }
            let num = projected_difference(&yp, &ym, &w, opts.eps);
            let excess = (a[j] - num).abs() - opts.rtol * num.abs();
            // NaN counts as a failure.
            let bad = excess.is_nan() || excess > opts.atol;
            if bad {
                passed = false;
            }
            if excess > worst.excess || excess.is_nan() {
                worst = InputReport {
                    input: k,
                    worst_index: j,
                    analytic: a[j],
                    numerical: num,
                    excess,
                };
            }
        }
        reports.push(worst);
    }
    Ok(GradcheckReport {
        inputs: reports,
        passed,
    })
}

fn get(h: &HostTensor, j: usize) -> f64 {
    with_storage!(h.dtype(), T, {
        h.as_slice::<T>().map_or(f64::NAN, |v| v[j].widen())
    })
}

fn set(h: &mut HostTensor, j: usize, x: f64) {
    with_storage!(h.dtype(), T, {
        if let Some(v) = h.as_mut_slice::<T>() {
            v[j] = T::narrow(x);
        }
    })
}

/// Checks second derivatives: gradchecks `x ↦ Σ v·∇ₓ(Σ w·f(x))` for fixed random `v`, with the
/// inner gradient built by a `create_graph` backward.
pub fn gradgradcheck<F>(
    f: F,
    inputs: &[HostTensor],
    opts: GradcheckOptions,
) -> Result<GradcheckReport>
where
    F: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
{
    let seed = opts.seed;
    let inner = check_fn(move |g, xs| {
        let y = f(g, xs)?;
        let wt = g.from_f64(&weights(y.numel(), seed), &y.shape(), DType::F64)?;
        let l = y.mul(wt)?.sum()?;
        if !l.requires_grad() {
            return g.scalar(0.0, DType::F64);
        }
        let grads = crate::grad(
            l,
            xs,
            BackwardOptions {
                create_graph: true,
                ..Default::default()
            },
        )?;
        let mut total: Option<Tensor<'_>> = None;
        for (k, (gr, x)) in grads.into_iter().zip(xs).enumerate() {
            let gr = match gr {
                Some(t) => t,
                None => continue,
            };
            let v = g.from_f64(
                &weights(x.numel(), seed ^ ((k as u64 + 1) * 0x9E37)),
                &x.shape(),
                DType::F64,
            )?;
            let term = gr.mul(v)?.sum()?;
            total = Some(match total {
                None => term,
                Some(t) => t.add(term)?,
            });
        }
        match total {
            Some(t) => Ok(t),
            None => g.scalar(0.0, DType::F64),
        }
    });
    gradcheck(inner, inputs, opts)
}
