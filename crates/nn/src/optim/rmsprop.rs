//! RMSprop.

use arenagrad_graph::{Elem, HostData, HostDataMut, HostTensor, Parameter};

use super::in_f32;
use super::state::{buffer_tensor, f64_tensor, StateReader};
use super::{
    check_learning_rate, check_non_negative, dedup, flatten_groups, grad_dtype_error, GroupOptions,
    Optimizer, ParamGroup,
};
use crate::error::{config, Result};

/// Options of [`RmsProp`]; build with [`RmsPropConfig::new`] and the setters (PyTorch's
/// defaults: α 0.99, ε 1e-8, no momentum, not centred, no weight decay).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsPropConfig {
    /// Learning rate (PyTorch's default 0.01).
    pub lr: f64,
    /// Decay of the squared-gradient average (0.99).
    pub alpha: f64,
    /// Added to the root of the average (1e-8).
    pub eps: f64,
    /// L2 penalty added to the gradient, `g + wd·p` (0).
    pub weight_decay: f64,
    /// Momentum factor (0).
    pub momentum: f64,
    /// Divide by the gradient's estimated variance rather than its mean square (false).
    pub centered: bool,
}

impl RmsPropConfig {
    /// RMSprop with learning rate `lr` and PyTorch's other defaults.
    pub fn new(lr: f64) -> Self {
        RmsPropConfig {
            lr,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
        }
    }
    /// With smoothing constant `alpha`.
    pub fn alpha(mut self, alpha: f64) -> Self {
        self.alpha = alpha;
        self
    }
    /// With `eps`.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    /// With weight decay `wd`.
    pub fn weight_decay(mut self, wd: f64) -> Self {
        self.weight_decay = wd;
        self
    }
    /// With momentum `m`.
    pub fn momentum(mut self, m: f64) -> Self {
        self.momentum = m;
        self
    }
    /// Centred or not.
    pub fn centered(mut self, on: bool) -> Self {
        self.centered = on;
        self
    }
}

/// RMSprop — PyTorch's `torch.optim.RMSprop`, step for step:
///
/// ```text
/// g = g + wd·p
/// v = α·v + (1 − α)·g²                          (v starts at 0)
/// a = lerp(a, g, 1 − α);  s = √(v − a²) + ε    (centred)   or   s = √v + ε
/// b = μ·b + g/s;  p = p − lr·b                  (momentum)  or   p = p − lr·g/s
/// ```
///
/// ```
/// use arenagrad_nn::optim::{Optimizer, RmsProp, RmsPropConfig};
/// use arenagrad_nn::{HostTensor, Parameter};
/// let p = Parameter::new("p", HostTensor::new(vec![1.0f64], &[1])?);
/// let mut opt = RmsProp::new([p.clone()], RmsPropConfig::new(0.01))?;
/// let g = arenagrad_nn::Graph::new();
/// g.param(&p)?.sum()?.backward()?; // gradient 1
/// opt.step()?;
/// // v = 0.01, s = 0.1 + 1e-8: p = 1 − 0.01·1/s
/// assert!((p.value().to_f64_vec()[0] - (1.0 - 0.01 / (0.1 + 1e-8))).abs() < 1e-12);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct RmsProp {
    params: Vec<Parameter>,
    cfg: RmsPropConfig,
    /// Per parameter: the squared-gradient average, the momentum buffer, the gradient average.
    state: Vec<[Option<HostData>; 3]>,
    group_of: Vec<usize>,
    groups: Vec<GroupOptions>,
}

/// The state buffers' names, as PyTorch's `state_dict` names them.
const NAMES: [&str; 3] = ["square_avg", "momentum_buffer", "grad_avg"];

impl RmsProp {
    /// An optimiser over `params` (repeated handles are updated once).
    pub fn new(params: impl IntoIterator<Item = Parameter>, cfg: RmsPropConfig) -> Result<Self> {
        Self::with_groups([ParamGroup::new(dedup(params))], cfg)
    }

    /// An optimiser over parameter groups, each with its own learning rate and weight decay
    /// where it says so ([`ParamGroup`]).
    pub fn with_groups(
        groups: impl IntoIterator<Item = ParamGroup>,
        cfg: RmsPropConfig,
    ) -> Result<Self> {
        let c = "RmsProp";
        check_non_negative(c, "lr", cfg.lr)?;
        check_non_negative(c, "momentum", cfg.momentum)?;
        check_non_negative(c, "weight_decay", cfg.weight_decay)?;
        if !((0.0..=1.0).contains(&cfg.alpha) && cfg.eps >= 0.0 && cfg.eps.is_finite()) {
            return Err(config(
                c,
                format!(
                    "alpha must be in [0, 1] and eps finite and non-negative, got {} and {}",
                    cfg.alpha, cfg.eps
                ),
            ));
        }
        let (params, group_of, groups) = flatten_groups(c, groups, cfg.lr, cfg.weight_decay)?;
        let state = (0..params.len()).map(|_| [None, None, None]).collect();
        Ok(RmsProp {
            params,
            cfg,
            state,
            group_of,
            groups,
        })
    }

    /// The options.
    pub fn config(&self) -> &RmsPropConfig {
        &self.cfg
    }

    /// Parameter `index`'s squared-gradient average (none before its first step).
    pub fn square_avg(&self, index: usize) -> Option<&HostData> {
        self.state.get(index).and_then(|s| s[0].as_ref())
    }
}

/// A fresh zero buffer of `n` elements in `T`'s dtype.
fn zeros<T: Elem>(n: usize) -> Result<HostData> {
    Ok(HostData::zeros("RmsProp::step", T::DTYPE, n, &[n])?)
}

/// A state buffer's values in `T`, if it exists.
fn slice<T: Elem>(s: &mut Option<HostData>) -> Option<&mut [T]> {
    s.as_mut().and_then(|d| d.as_mut_slice::<T>())
}

fn rmsprop_kernel<T: Elem>(
    p: &mut [T],
    g: &[T],
    state: &mut [Option<HostData>; 3],
    c: &RmsPropConfig,
) -> Result<()> {
    // Every buffer this step needs is made before any value changes: one the host cannot
    // hold is an error, and the parameter stays as it was.
    let n = p.len();
    let needed = [true, c.momentum > 0.0, c.centered];
    for (slot, &need) in state.iter_mut().zip(&needed) {
        if need && slot.is_none() {
            *slot = Some(zeros::<T>(n)?);
        }
    }
    let [sq, mom, avg] = state;
    let sq = slice(sq).expect("invariant: made above in the parameter's dtype");
    let (mut mom, mut avg) = (slice(mom), slice(avg));
    let (alpha, one_m) = (T::from_f64(c.alpha), T::from_f64(1.0 - c.alpha));
    let neg_lr = T::from_f64(-c.lr);
    let (eps, wd, mu) = (
        T::from_f64(c.eps),
        T::from_f64(c.weight_decay),
        T::from_f64(c.momentum),
    );
    for i in 0..n {
        let mut gi = g[i];
        if c.weight_decay != 0.0 {
            gi += wd * p[i];
        }
        sq[i] = alpha * sq[i] + one_m * gi * gi;
        let denom = match avg.as_deref_mut() {
            Some(a) => {
                // PyTorch's `lerp_(g, w)` with w = 1 − α as its CPU kernel computes it: one
                // fused multiply-add from the nearer end, `fma(w, g − a, a)` for w < 0.5,
                // `fma(w − 1, g − a, g)` otherwise.
                a[i] = if c.alpha > 0.5 {
                    one_m.mul_add(gi - a[i], a[i])
                } else {
                    (one_m - T::ONE).mul_add(gi - a[i], gi)
                };
                T::from_f64((sq[i] - a[i] * a[i]).to_f64().sqrt()) + eps
            }
            None => T::from_f64(sq[i].to_f64().sqrt()) + eps,
        };
        match mom.as_deref_mut() {
            Some(b) => {
                b[i] = mu * b[i] + gi / denom;
                // PyTorch's `add_(b, alpha=−lr)`, a fused multiply-add in its CPU kernel.
                p[i] = neg_lr.mul_add(b[i], p[i]);
            }
            // PyTorch's `addcdiv_(g, s, value=−lr)`: (−lr·g)/s, in that order.
            None => p[i] += (neg_lr * gi) / denom,
        }
    }
    Ok(())
}

impl Optimizer for RmsProp {
    fn step(&mut self) -> Result<()> {
        for (i, (p, st)) in self.params.iter().zip(self.state.iter_mut()).enumerate() {
            let g = self.groups[self.group_of[i]];
            let cfg = RmsPropConfig {
                lr: self.cfg.lr * g.lr_scale,
                weight_decay: g.weight_decay,
                ..self.cfg
            };
            p.update(|value, grad| {
                let Some(grad) = grad else { return Ok(()) };
                match (value, grad) {
                    (HostDataMut::F32(v), HostData::F32(g)) => rmsprop_kernel(v, g, st, &cfg)?,
                    (HostDataMut::F64(v), HostData::F64(g)) => rmsprop_kernel(v, g, st, &cfg)?,
                    (HostDataMut::BF16(v), HostData::BF16(g)) => {
                        in_f32(v, g, |v, g| rmsprop_kernel(v, g, st, &cfg))?
                    }
                    (HostDataMut::F16(v), HostData::F16(g)) => {
                        in_f32(v, g, |v, g| rmsprop_kernel(v, g, st, &cfg))?
                    }
                    (v, g) => return Err(grad_dtype_error("RmsProp::step", &v, g)),
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn parameters(&self) -> &[Parameter] {
        &self.params
    }

    fn learning_rate(&self) -> f64 {
        self.cfg.lr
    }

    fn set_learning_rate(&mut self, lr: f64) -> Result<()> {
        check_learning_rate("RmsProp", lr, &self.groups)?;
        self.cfg.lr = lr;
        Ok(())
    }

    fn state_tensors(&self) -> Result<Vec<(String, HostTensor)>> {
        let mut out = vec![("lr".to_string(), f64_tensor(self.cfg.lr))];
        for (i, (p, st)) in self.params.iter().zip(&self.state).enumerate() {
            for (name, b) in NAMES.iter().zip(st) {
                if let Some(b) = b {
                    out.push((format!("{i}.{name}"), buffer_tensor(b, p)?));
                }
            }
        }
        Ok(out)
    }

    fn load_state_tensors(&mut self, tensors: &[(String, HostTensor)]) -> Result<()> {
        let mut r = StateReader::new("RmsProp::load_state_tensors", tensors);
        let lr = r.lr()?;
        let mut state = Vec::with_capacity(self.params.len());
        for (i, p) in self.params.iter().enumerate() {
            let [a, b, c] = NAMES.map(|name| r.buffer(&format!("{i}.{name}"), p));
            state.push([a?, b?, c?]);
        }
        r.finish()?;
        self.state = state;
        self.cfg.lr = lr;
        Ok(())
    }
}
