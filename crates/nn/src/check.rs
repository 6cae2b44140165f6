//! Gradient checking of whole modules, with respect to the input and to every parameter.
//!
//! [`arenagrad_graph::check::gradcheck`] checks functions of tensors; a module's parameters are
//! [`Parameter`]s brought in by [`Graph::param`], so [`gradcheck_module`] perturbs them in place
//! instead: it compares the gradient backward accumulates into each parameter (and into the
//! input) with central finite differences of `L = Σ w·module(x)` for fixed random weights `w`.
//!
//! ```
//! use arenagrad_nn::check::gradcheck_module;
//! use arenagrad_nn::{DType, HostTensor, Linear, LinearConfig, Rng};
//! let mut rng = Rng::seed(0);
//! let fc = Linear::with_config(3, 2, LinearConfig { dtype: DType::F64, ..Default::default() }, &mut rng)?;
//! let x = HostTensor::new(vec![0.1f64, -0.2, 0.3, 0.5, 0.0, -1.0], &[2, 3])?;
//! let report = gradcheck_module(&fc, &x, Default::default())?;
//! assert!(report.passed, "{report}");
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use arenagrad_graph::check::GradcheckOptions;
use arenagrad_graph::{DType, Graph, HostDataMut, HostTensor, Parameter};

use crate::error::{NnError, Result};
use crate::module::Module;
use crate::Rng;

/// The worst element found for one checked tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorReport {
    /// `"input"` or the parameter's hierarchical name.
    pub name: String,
    /// Flat index of the worst element.
    pub worst_index: usize,
    /// Analytic gradient there.
    pub analytic: f64,
    /// Numerical gradient there.
    pub numerical: f64,
    /// `|analytic − numerical| − rtol·|numerical|` (at most `atol` passes).
    pub excess: f64,
}

/// The result of [`gradcheck_module`].
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleGradcheckReport {
    /// The input first, then each parameter.
    pub tensors: Vec<TensorReport>,
    /// Whether every element is within tolerance.
    pub passed: bool,
}

impl std::fmt::Display for ModuleGradcheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for r in &self.tensors {
            writeln!(
                f,
                "{}: worst element {} analytic {:.9e} numerical {:.9e}",
                r.name, r.worst_index, r.analytic, r.numerical
            )?;
        }
        f.write_str(if self.passed {
            "gradcheck passed"
        } else {
            "gradcheck FAILED"
        })
    }
}

/// `L = Σ w·module(x)` without recording, with the graph's generator reseeded (so Dropout draws
/// the same mask every evaluation).
fn loss_value<M: Module + ?Sized>(
    g: &mut Graph,
    m: &M,
    x: &HostTensor,
    w: &[f64],
    seed: u64,
) -> Result<f64> {
    g.seed(seed);
    let r = (|| {
        let _ng = g.no_grad();
        let xt = g.from_host(x)?;
        let y = m.forward(g, xt)?.to_vec_f64()?;
        Ok(y.iter().zip(w).map(|(a, b)| a * b).sum())
    })();
    g.reset();
    r
}

/// Checks a module's gradients with respect to its input and every parameter that is not
/// frozen, in `f64`.
///
/// The module's parameters must be f64 (build it with an f64 config); `input` is converted to
/// f64. Every parameter's accumulated gradient is cleared on return, and parameter values are
/// restored bit for bit. Buffers (BatchNorm's running statistics) are updated by the forward
/// passes in training mode, as in any forward; they do not affect training-mode outputs.
pub fn gradcheck_module<M: Module + ?Sized>(
    module: &M,
    input: &HostTensor,
    opts: GradcheckOptions,
) -> Result<ModuleGradcheckReport> {
    // Frozen parameters take no gradient: only those that require one are checked.
    let params: Vec<(String, Parameter)> = module
        .named_parameters()
        .into_iter()
        .filter(|(_, p)| p.requires_grad())
        .collect();
    for (_, p) in &params {
        if p.dtype() != DType::F64 {
            return Err(NnError::DType {
                op: "gradcheck_module",
                expected: DType::F64,
                got: p.dtype(),
            });
        }
    }
    let x = HostTensor::new(input.to_f64_vec(), input.shape())?;
    let mut g = Graph::with_threads(1);
    module.zero_grad();
    // Analytic gradients from one backward pass.
    g.seed(opts.seed);
    let (w, gx) = {
        let r = (|| -> Result<(Vec<f64>, Vec<f64>)> {
            let xt = g.leaf(&x.to_f64_vec(), x.shape(), DType::F64)?;
            let y = module.forward(&g, xt)?;
            let mut rng = Rng::seed(opts.seed);
            let w: Vec<f64> = (0..y.numel()).map(|_| rng.normal()).collect();
            let wt = g.from_f64(&w, &y.shape(), DType::F64)?;
            let l = y.mul(wt)?.sum()?;
            if l.requires_grad() {
                l.backward()?;
            }
            let gx = match xt.grad()? {
                Some(t) => t.to_vec_f64()?,
                None => vec![0.0; xt.numel()],
            };
            Ok((w, gx))
        })();
        g.reset();
        r?
    };
    let analytic: Vec<Vec<f64>> = std::iter::once(gx)
        .chain(params.iter().map(|(_, p)| match p.grad() {
            Some(t) => t.to_f64_vec(),
            None => vec![0.0; p.numel()],
        }))
        .collect();
    module.zero_grad();

    let mut reports = Vec::new();
    let mut passed = true;
    let mut judge =
        |name: &str, a: &[f64], nums: &mut dyn FnMut(usize) -> Result<f64>| -> Result<()> {
            let mut worst = TensorReport {
                name: name.to_string(),
                worst_index: 0,
                analytic: 0.0,
                numerical: 0.0,
                excess: f64::NEG_INFINITY,
            };
            for (j, &aj) in a.iter().enumerate() {
                let num = nums(j)?;
                let excess = (aj - num).abs() - opts.rtol * num.abs();
                if excess.is_nan() || excess > opts.atol {
                    passed = false;
                }
                if excess > worst.excess || excess.is_nan() {
                    worst = TensorReport {
                        name: name.to_string(),
                        worst_index: j,
                        analytic: aj,
                        numerical: num,
                        excess,
                    };
                }
            }
            reports.push(worst);
            Ok(())
        };

    // The input.
    let mut xw = x.clone();
    judge("input", &analytic[0], &mut |j| {
        let HostDataMut::F64(v) = xw.data_mut() else {
            unreachable!("invariant: converted to f64 above")
        };
        let orig = v[j];
        v[j] = orig + opts.eps;
        let lp = loss_value(&mut g, module, &xw, &w, opts.seed)?;
        if let HostDataMut::F64(v) = xw.data_mut() {
            v[j] = orig - opts.eps;
        }
        let lm = loss_value(&mut g, module, &xw, &w, opts.seed)?;
        if let HostDataMut::F64(v) = xw.data_mut() {
            v[j] = orig;
        }
        Ok((lp - lm) / (2.0 * opts.eps))
    })?;

    // Each parameter, perturbed in place and restored exactly.
    for (k, (name, p)) in params.iter().enumerate() {
        judge(name, &analytic[k + 1], &mut |j| {
            let set = |p: &Parameter, val: Option<f64>| -> f64 {
                p.update(|v, _| {
                    let HostDataMut::F64(v) = v else {
                        unreachable!("invariant: checked f64 above")
                    };
                    let orig = v[j];
                    if let Some(val) = val {
                        v[j] = val;
                    }
                    orig
                })
            };
            let orig = set(p, None);
            set(p, Some(orig + opts.eps));
            let lp = loss_value(&mut g, module, &x, &w, opts.seed);
            set(p, Some(orig - opts.eps));
            let lm = loss_value(&mut g, module, &x, &w, opts.seed);
            set(p, Some(orig));
            Ok((lp? - lm?) / (2.0 * opts.eps))
        })?;
    }
    module.zero_grad();
    Ok(ModuleGradcheckReport {
        tensors: reports,
        passed,
    })
}
