//! Stochastic gradient descent.

use arenagrad_graph::{Elem, HostData, HostDataMut, HostTensor, Parameter};

use super::in_f32;

use super::state::{buffer_tensor, f64_tensor, StateReader};
use super::{
    check_learning_rate, check_non_negative, dedup, flatten_groups, grad_dtype_error, GroupOptions,
    Optimizer, ParamGroup,
};
use crate::error::{config, Result};

/// Options of [`Sgd`]; build with [`SgdConfig::new`] and the setters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (default 0: plain SGD).
    pub momentum: f64,
    /// Dampening of the momentum's new-gradient term (default 0).
    pub dampening: f64,
    /// L2 penalty added to the gradient, `g + wd·p` (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum (default false; needs momentum > 0 and dampening 0).
    pub nesterov: bool,
}

impl SgdConfig {
    /// Plain SGD with learning rate `lr`.
    pub fn new(lr: f64) -> Self {
        SgdConfig {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
    /// With momentum `m`.
    pub fn momentum(mut self, m: f64) -> Self {
        self.momentum = m;
        self
    }
    /// With dampening `d`.
    pub fn dampening(mut self, d: f64) -> Self {
        self.dampening = d;
        self
    }
    /// With weight decay `wd`.
    pub fn weight_decay(mut self, wd: f64) -> Self {
        self.weight_decay = wd;
        self
    }
    /// With or without Nesterov momentum.
    pub fn nesterov(mut self, on: bool) -> Self {
        self.nesterov = on;
        self
    }
}

/// SGD with optional momentum, dampening, Nesterov momentum and weight decay — PyTorch's
/// `torch.optim.SGD`:
///
/// ```text
/// d = g + wd·p
/// b = d                       (first step)
/// b = μ·b + (1 − dampening)·d (later steps)
/// d = d + μ·b  (Nesterov)  or  d = b
/// p = p − lr·d
/// ```
///
/// ```
/// use arenagrad_nn::optim::{Optimizer, Sgd, SgdConfig};
/// use arenagrad_nn::{HostData, HostTensor, Parameter};
/// let p = Parameter::new("p", HostTensor::new(vec![1.0f64], &[1])?);
/// let mut opt = Sgd::new([p.clone()], SgdConfig::new(0.1).momentum(0.9))?;
/// for _ in 0..2 {
///     let g = arenagrad_nn::Graph::new();
///     let t = g.param(&p)?;
///     t.sum()?.backward()?; // gradient 1
///     opt.step()?;
///     opt.zero_grad();
/// }
/// // step 1: b = 1, p = 0.9; step 2: b = 1.9, p = 0.71
/// assert!((p.value().to_f64_vec()[0] - 0.71).abs() < 1e-12);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Parameter>,
    cfg: SgdConfig,
    momentum: Vec<Option<HostData>>,
    group_of: Vec<usize>,
    groups: Vec<GroupOptions>,
}

impl Sgd {
    /// An optimiser over `params` (repeated handles are updated once).
    pub fn new(params: impl IntoIterator<Item = Parameter>, cfg: SgdConfig) -> Result<Self> {
        Self::with_groups([ParamGroup::new(dedup(params))], cfg)
    }

    /// An optimiser over parameter groups, each with its own learning rate and weight decay
    /// where it says so and `cfg`'s otherwise ([`ParamGroup`]; PyTorch's `param_groups`).
    ///
    /// ```
    /// use arenagrad_nn::optim::{ParamGroup, Sgd, SgdConfig};
    /// use arenagrad_nn::{HostTensor, Parameter};
    /// let w = Parameter::new("w", HostTensor::new(vec![1.0f32; 4], &[2, 2])?);
    /// let b = Parameter::new("b", HostTensor::new(vec![0.0f32; 2], &[2])?);
    /// let groups = [ParamGroup::new([w]), ParamGroup::new([b]).lr(0.5).weight_decay(0.0)];
    /// let opt = Sgd::with_groups(groups, SgdConfig::new(0.1).weight_decay(1e-4))?;
    /// assert_eq!(opt.group_options(0), (0.1, 1e-4));
    /// assert_eq!(opt.group_options(1), (0.5, 0.0));
    /// # Ok::<(), arenagrad_nn::NnError>(())
    /// ```
    pub fn with_groups(
        groups: impl IntoIterator<Item = ParamGroup>,
        cfg: SgdConfig,
    ) -> Result<Self> {
        let c = "Sgd";
        check_non_negative(c, "lr", cfg.lr)?;
        check_non_negative(c, "momentum", cfg.momentum)?;
        check_non_negative(c, "dampening", cfg.dampening)?;
        check_non_negative(c, "weight_decay", cfg.weight_decay)?;
        if cfg.nesterov && (cfg.momentum <= 0.0 || cfg.dampening != 0.0) {
            return Err(config(
                c,
                "Nesterov momentum requires momentum > 0 and dampening 0",
            ));
        }
        let (params, group_of, groups) = flatten_groups(c, groups, cfg.lr, cfg.weight_decay)?;
        let momentum = vec![None; params.len()];
        Ok(Sgd {
            params,
            cfg,
            momentum,
            group_of,
            groups,
        })
    }

    /// Group `k`'s learning rate and weight decay now (`(0, 0)` for no such group).
    pub fn group_options(&self, k: usize) -> (f64, f64) {
        super::group_options(&self.groups, self.cfg.lr, k)
    }

    /// The number of parameter groups.
    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// The options.
    pub fn config(&self) -> &SgdConfig {
        &self.cfg
    }

    /// The momentum buffer of parameter `index` (none before its first step, or without
    /// momentum).
    pub fn momentum_buffer(&self, index: usize) -> Option<&HostData> {
        self.momentum.get(index).and_then(Option::as_ref)
    }
}

/// Momentum values below this magnitude are flushed to zero (far above the subnormal range of
/// `f32`, far below anything that moves a weight).
const FLUSH_BELOW: f64 = 1e-30;

fn sgd_kernel<T: Elem>(
    p: &mut [T],
    g: &[T],
    buf: &mut Option<HostData>,
    c: &SgdConfig,
) -> Result<()> {
    let lr = T::from_f64(c.lr);
    let wd = T::from_f64(c.weight_decay);
    let decay = c.weight_decay != 0.0;
    // `move` (here and below): the loop then reads these scalars from registers, not through
    // references the closures would otherwise hold.
    let d_of = move |g: T, p: T| if decay { g + wd * p } else { g };
    if c.momentum == 0.0 {
        // A large parameter is split across the threads (a streaming update bound by memory:
        // one core cannot draw what two do), each element the same arithmetic.
        arenagrad_graph::update_in_chunks(p, |at, p| {
            let g = &g[at..at + p.len()];
            arenagrad_graph::wide(
                p.len(),
                #[inline(always)]
                move || {
                    for (p, &g) in p.iter_mut().zip(g) {
                        *p -= lr * d_of(g, *p);
                    }
                },
            );
        });
        return Ok(());
    }
    let mu = T::from_f64(c.momentum);
    let keep = T::from_f64(1.0 - c.dampening);
    match buf.as_mut().and_then(|b| b.as_mut_slice::<T>()) {
        Some(b) => {
            let tiny = T::from_f64(FLUSH_BELOW);
            for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
                let d = d_of(g, *p);
                let nb = mu * *b + keep * d;
                // A buffer whose gradient stays zero decays geometrically into subnormal numbers,
                // which cost ~100× per operation on x86; flush it to zero before it gets there.
                *b = if nb.abs() < tiny { T::ZERO } else { nb };
                let step = if c.nesterov { d + mu * *b } else { *b };
                *p -= lr * step;
            }
        }
        None => {
            // The momentum buffer is reserved before the value is touched: a parameter whose
            // buffer the host cannot hold is an error and stays as it was.
            let mut fresh = HostData::zeros("Sgd::step", T::DTYPE, p.len(), &[p.len()])?;
            let b = fresh
                .as_mut_slice::<T>()
                .expect("invariant: made with the parameter's dtype");
            for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
                let d = d_of(g, *p);
                *b = d;
                let step = if c.nesterov { d + mu * d } else { d };
                *p -= lr * step;
            }
            *buf = Some(fresh);
        }
    }
    Ok(())
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        for (i, (p, buf)) in self.params.iter().zip(self.momentum.iter_mut()).enumerate() {
            let g = self.groups[self.group_of[i]];
            let cfg = SgdConfig {
                lr: self.cfg.lr * g.lr_scale,
                weight_decay: g.weight_decay,
                ..self.cfg
            };
            p.update(|value, grad| {
                let Some(grad) = grad else { return Ok(()) };
                match (value, grad) {
                    (HostDataMut::F32(v), HostData::F32(g)) => sgd_kernel(v, g, buf, &cfg)?,
                    (HostDataMut::F64(v), HostData::F64(g)) => sgd_kernel(v, g, buf, &cfg)?,
                    (HostDataMut::BF16(v), HostData::BF16(g)) => {
                        in_f32(v, g, |v, g| sgd_kernel(v, g, buf, &cfg))?
                    }
                    (HostDataMut::F16(v), HostData::F16(g)) => {
                        in_f32(v, g, |v, g| sgd_kernel(v, g, buf, &cfg))?
                    }
                    (v, g) => return Err(grad_dtype_error("Sgd::step", &v, g)),
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
        check_learning_rate("Sgd", lr, &self.groups)?;
        self.cfg.lr = lr;
        Ok(())
    }

    fn state_tensors(&self) -> Result<Vec<(String, HostTensor)>> {
        let mut out = vec![("lr".to_string(), f64_tensor(self.cfg.lr))];
        for (i, (p, b)) in self.params.iter().zip(&self.momentum).enumerate() {
            if let Some(b) = b {
                out.push((format!("{i}.momentum_buffer"), buffer_tensor(b, p)?));
            }
        }
        Ok(out)
    }

    fn load_state_tensors(&mut self, tensors: &[(String, HostTensor)]) -> Result<()> {
        let mut r = StateReader::new("Sgd::load_state_tensors", tensors);
        let lr = r.lr()?;
        let momentum = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| r.buffer(&format!("{i}.momentum_buffer"), p))
            .collect::<Result<Vec<_>>>()?;
        r.finish()?;
        self.momentum = momentum;
        self.cfg.lr = lr;
        Ok(())
    }
}
