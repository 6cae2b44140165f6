//! Adam and AdamW.

use arenagrad_graph::{Elem, HostData, HostDataMut, HostTensor, Parameter};

use super::in_f32;

use super::state::{buffer_tensor, f64_tensor, u64_tensor, StateReader};
use super::{
    check_learning_rate, check_non_negative, dedup, flatten_groups, grad_dtype_error, GroupOptions,
    Optimizer, ParamGroup,
};
use crate::error::{config, Result};

/// Options of [`Adam`] and [`AdamW`]; build with [`AdamConfig::new`] and the setters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f64,
    /// Decay rates of the first and second moment estimates (default `(0.9, 0.999)`).
    pub betas: (f64, f64),
    /// Added to the denominator (default 1e-8).
    pub eps: f64,
    /// Weight decay: an L2 term `g + wd·p` for [`Adam`] (default 0), a decoupled decay
    /// `p·(1 − lr·wd)` for [`AdamW`] (default 0.01 via [`AdamConfig::adamw`]).
    pub weight_decay: f64,
    /// Use the running maximum of the second moment (AMSGrad; default false).
    pub amsgrad: bool,
}

impl AdamConfig {
    /// Adam's defaults with learning rate `lr`: betas (0.9, 0.999), eps 1e-8, no weight decay.
    pub fn new(lr: f64) -> Self {
        AdamConfig {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
        }
    }
    /// AdamW's defaults with learning rate `lr`: as [`AdamConfig::new`] with weight decay 0.01.
    pub fn adamw(lr: f64) -> Self {
        AdamConfig {
            weight_decay: 0.01,
            ..Self::new(lr)
        }
    }
    /// With these betas.
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Self {
        self.betas = (beta1, beta2);
        self
    }
    /// With this eps.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    /// With this weight decay.
    pub fn weight_decay(mut self, wd: f64) -> Self {
        self.weight_decay = wd;
        self
    }
    /// With or without AMSGrad.
    pub fn amsgrad(mut self, on: bool) -> Self {
        self.amsgrad = on;
        self
    }

    fn check(&self, c: &'static str) -> Result<()> {
        check_non_negative(c, "lr", self.lr)?;
        check_non_negative(c, "eps", self.eps)?;
        check_non_negative(c, "weight_decay", self.weight_decay)?;
        let (b1, b2) = self.betas;
        if !(0.0..1.0).contains(&b1) || !(0.0..1.0).contains(&b2) {
            return Err(config(
                c,
                format!("betas must be in [0, 1), got ({b1}, {b2})"),
            ));
        }
        Ok(())
    }
}

/// The state Adam keeps for one parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamState {
    /// Steps taken for this parameter.
    pub step: u64,
    /// First moment estimate `m`.
    pub exp_avg: HostData,
    /// Second moment estimate `v`.
    pub exp_avg_sq: HostData,
    /// Running maximum of `v` (AMSGrad only).
    pub max_exp_avg_sq: Option<HostData>,
}

/// PyTorch's `torch.lerp` for a scalar weight, rounding as it does.
#[inline(always)]
fn lerp<T: Elem>(a: T, b: T, w: T, w_small: bool, one_minus_w: T) -> T {
    if w_small {
        a + w * (b - a)
    } else {
        b - (b - a) * one_minus_w
    }
}

fn adam_kernel<T: Elem>(p: &mut [T], g: &[T], st: &mut AdamState, c: &AdamConfig, decoupled: bool) {
    st.step += 1;
    let t = st.step as f64;
    let (b1, b2) = c.betas;
    if decoupled && c.weight_decay != 0.0 {
        let f = T::from_f64(1.0 - c.lr * c.weight_decay);
        p.iter_mut().for_each(|p| *p *= f);
    }
    let l2 = !decoupled && c.weight_decay != 0.0;
    let wd = T::from_f64(c.weight_decay);
    let bias_correction1 = 1.0 - b1.powf(t);
    let bias_correction2 = 1.0 - b2.powf(t);
    let neg_step = T::from_f64(-(c.lr / bias_correction1));
    let bc2_sqrt = T::from_f64(bias_correction2.sqrt());
    let eps = T::from_f64(c.eps);
    let w1 = T::from_f64(1.0 - b1);
    let w1_small = (1.0 - b1) < 0.5;
    let one_minus_w1 = T::ONE - w1;
    let b2t = T::from_f64(b2);
    let w2 = T::from_f64(1.0 - b2);
    let m = st
        .exp_avg
        .as_mut_slice::<T>()
        .expect("invariant: state has the parameter's dtype");
    let v = st
        .exp_avg_sq
        .as_mut_slice::<T>()
        .expect("invariant: state has the parameter's dtype");
    match st
        .max_exp_avg_sq
        .as_mut()
        .and_then(|x| x.as_mut_slice::<T>())
    {
        None => {
            let tiny = T::from_f64(1e-30);
            let chunk = |p: &mut [T], g: &[T], m: &mut [T], v: &mut [T]| {
                arenagrad_graph::wide(
                    p.len(),
                    #[inline(always)]
                    move || {
                        for (((p, &g), m), v) in
                            p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut())
                        {
                            let d = if l2 { g + wd * *p } else { g };
                            let nm = lerp(*m, d, w1, w1_small, one_minus_w1);
                            // Moments of a parameter whose gradient stays zero decay into
                            // subnormals, which are ~100× slower on x86: flush them (m/√v is
                            // unchanged where it matters).
                            *m = if nm.abs() < tiny { T::ZERO } else { nm };
                            let nv = *v * b2t + w2 * d * d;
                            *v = if nv < tiny { T::ZERO } else { nv };
                            let denom = v.sqrt() / bc2_sqrt + eps;
                            *p += neg_step * *m / denom;
                        }
                    },
                )
            };
            in_chunks((p, g, m, v), chunk);
        }
        Some(vmax) => {
            for ((((p, &g), m), v), vm) in p
                .iter_mut()
                .zip(g)
                .zip(m.iter_mut())
                .zip(v.iter_mut())
                .zip(vmax.iter_mut())
            {
                let d = if l2 { g + wd * *p } else { g };
                *m = lerp(*m, d, w1, w1_small, one_minus_w1);
                *v = *v * b2t + w2 * d * d;
                if *v > *vm {
                    *vm = *v;
                }
                let denom = vm.sqrt() / bc2_sqrt + eps;
                *p += neg_step * *m / denom;
            }
        }
    }
}

/// `f` over the parameter's values `p`, gradient `g` and moments `m` and `v` (all as long as
/// `p`): on the calling thread below twice [`CHUNK_MIN`] values, otherwise in contiguous chunks
/// of at least that many (at most [`CHUNKS`], of nearly equal sizes), claimed by the threads
/// ([`arenagrad_graph::update_parts`]). Each value's update reads and writes only its own
/// position, so the split never changes a bit. PyTorch's Adam runs its per-element updates on
/// its intra-op threads too; on one thread the update of a 400k-value layer was 4–5% of a small
/// CNN's training step here.
fn in_chunks<T: Send + Sync>(
    (p, g, m, v): (&mut [T], &[T], &mut [T], &mut [T]),
    f: impl Fn(&mut [T], &[T], &mut [T], &mut [T]) + Sync,
) {
    let n = p.len();
    if n < 2 * CHUNK_MIN {
        return f(p, g, m, v);
    }
    let per = n.div_ceil((n / CHUNK_MIN).min(CHUNKS));
    let parts: Vec<_> = p
        .chunks_mut(per)
        .zip(g.chunks(per))
        .zip(m.chunks_mut(per))
        .zip(v.chunks_mut(per))
        .map(|(((p, g), m), v)| (p, g, m, v))
        .collect();
    arenagrad_graph::update_parts(parts, |_, (p, g, m, v)| f(p, g, m, v));
}

/// The fewest values [`in_chunks`] hands a thread at once (a fork costs a few microseconds;
/// this many updates take tens).
const CHUNK_MIN: usize = 1 << 15;

/// The most chunks [`in_chunks`] makes (a function of the size alone): several per thread, so
/// that a thread slowed by other work on its core takes fewer of them.
const CHUNKS: usize = 16;

fn step_all(
    params: &[Parameter],
    states: &mut [Option<AdamState>],
    cfg_of: impl Fn(usize) -> AdamConfig,
    decoupled: bool,
    op: &'static str,
) -> Result<()> {
    // A step counter that cannot count one more step (only a loaded state can be that far on)
    // would wrap to 0 and the bias corrections to 0/0: refused before any parameter is written.
    for (i, (p, st)) in params.iter().zip(states.iter()).enumerate() {
        if st.as_ref().is_some_and(|st| st.step == u64::MAX) && p.update_grad(|g| g.is_some()) {
            return Err(config(op, step_count_full(i)));
        }
    }
    for (i, (p, st)) in params.iter().zip(states.iter_mut()).enumerate() {
        let cfg = &cfg_of(i);
        if st.is_none() && p.update_grad(|g| g.is_some()) {
            // The moments are made fallibly, before the value is touched: a parameter whose
            // state the host cannot hold is an error and is left as it was.
            // A 16-bit parameter's moments are kept in f32 (its update is computed there).
            let (dtype, n, shape) = (p.dtype().compute(), p.numel(), p.shape());
            let zeros = || HostData::zeros(op, dtype, n, &shape);
            *st = Some(AdamState {
                step: 0,
                exp_avg: zeros()?,
                exp_avg_sq: zeros()?,
                max_exp_avg_sq: if cfg.amsgrad { Some(zeros()?) } else { None },
            });
        }
        p.update(|value, grad| {
            let Some(st) = st.as_mut() else { return Ok(()) };
            let Some(grad) = grad else { return Ok(()) };
            match (value, grad) {
                (HostDataMut::F32(v), HostData::F32(g)) => adam_kernel(v, g, st, cfg, decoupled),
                (HostDataMut::F64(v), HostData::F64(g)) => adam_kernel(v, g, st, cfg, decoupled),
                (HostDataMut::BF16(v), HostData::BF16(g)) => {
                    in_f32(v, g, |v, g| adam_kernel(v, g, st, cfg, decoupled))
                }
                (HostDataMut::F16(v), HostData::F16(g)) => {
                    in_f32(v, g, |v, g| adam_kernel(v, g, st, cfg, decoupled))
                }
                (v, g) => return Err(grad_dtype_error(op, &v, g)),
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Why parameter `i`'s state cannot take another step.
fn step_count_full(i: usize) -> String {
    format!(
        "the state of parameter {i} has taken {} steps: its step counter cannot count another",
        u64::MAX
    )
}

/// Adam's state as named tensors (see [`Optimizer::state_tensors`]).
fn adam_state_tensors(
    params: &[Parameter],
    states: &[Option<AdamState>],
    lr: f64,
) -> Result<Vec<(String, HostTensor)>> {
    let mut out = vec![("lr".to_string(), f64_tensor(lr))];
    for (i, (p, st)) in params.iter().zip(states).enumerate() {
        let Some(st) = st else { continue };
        out.push((format!("{i}.step"), u64_tensor(st.step)));
        out.push((format!("{i}.exp_avg"), buffer_tensor(&st.exp_avg, p)?));
        out.push((format!("{i}.exp_avg_sq"), buffer_tensor(&st.exp_avg_sq, p)?));
        if let Some(m) = &st.max_exp_avg_sq {
            out.push((format!("{i}.max_exp_avg_sq"), buffer_tensor(m, p)?));
        }
    }
    Ok(out)
}

/// The states and learning rate [`adam_state_tensors`] wrote, checked against `params` and
/// `cfg` (AMSGrad's buffer present exactly when it is on).
fn adam_load(
    op: &'static str,
    params: &[Parameter],
    cfg: &AdamConfig,
    tensors: &[(String, HostTensor)],
) -> Result<(Vec<Option<AdamState>>, f64)> {
    let mut r = StateReader::new(op, tensors);
    let lr = r.lr()?;
    let mut states = Vec::with_capacity(params.len());
    for (i, p) in params.iter().enumerate() {
        let step = r.counter(&format!("{i}.step"))?;
        if step == Some(u64::MAX) {
            return Err(config(op, step_count_full(i)));
        }
        let m = r.buffer(&format!("{i}.exp_avg"), p)?;
        let v = r.buffer(&format!("{i}.exp_avg_sq"), p)?;
        let vmax = r.buffer(&format!("{i}.max_exp_avg_sq"), p)?;
        states.push(match (step, m, v) {
            (None, None, None) if vmax.is_none() => None,
            (Some(step), Some(exp_avg), Some(exp_avg_sq)) if vmax.is_some() == cfg.amsgrad => {
                Some(AdamState {
                    step,
                    exp_avg,
                    exp_avg_sq,
                    max_exp_avg_sq: vmax,
                })
            }
            _ => {
                return Err(config(
                    op,
                    format!("the state of parameter {i} is incomplete (or AMSGrad's differs)"),
                ))
            }
        });
    }
    r.finish()?;
    Ok((states, lr))
}

/// Adam and AdamW differ only in how weight decay enters (`decoupled`); one definition serves both.
macro_rules! adam_optimizer {
    ($(#[$doc:meta])* $name:ident, decoupled: $decoupled:expr, new_doc: $new_doc:literal) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name {
            params: Vec<Parameter>,
            cfg: AdamConfig,
            states: Vec<Option<AdamState>>,
            group_of: Vec<usize>,
            groups: Vec<GroupOptions>,
        }

        impl $name {
            #[doc = $new_doc]
            pub fn new(params: impl IntoIterator<Item = Parameter>, cfg: AdamConfig) -> Result<Self> {
                Self::with_groups([ParamGroup::new(dedup(params))], cfg)
            }

            /// An optimiser over parameter groups, each with its own learning rate and weight
            /// decay where it says so and `cfg`'s otherwise ([`ParamGroup`]).
            pub fn with_groups(
                groups: impl IntoIterator<Item = ParamGroup>,
                cfg: AdamConfig,
            ) -> Result<Self> {
                cfg.check(stringify!($name))?;
                let (params, group_of, groups) =
                    flatten_groups(stringify!($name), groups, cfg.lr, cfg.weight_decay)?;
                let states = vec![None; params.len()];
                Ok($name { params, cfg, states, group_of, groups })
            }

            /// The options (group 0's learning rate and weight decay unless it sets its own).
            pub fn config(&self) -> &AdamConfig {
                &self.cfg
            }

            /// Group `k`'s learning rate and weight decay now (`(0, 0)` for no such group).
            pub fn group_options(&self, k: usize) -> (f64, f64) {
                super::group_options(&self.groups, self.cfg.lr, k)
            }

            /// The number of parameter groups.
            pub fn num_groups(&self) -> usize {
                self.groups.len()
            }

            /// The state of parameter `index` (none before its first step).
            pub fn state(&self, index: usize) -> Option<&AdamState> {
                self.states.get(index).and_then(Option::as_ref)
            }
        }

        impl Optimizer for $name {
            fn step(&mut self) -> Result<()> {
                let (cfg, groups, group_of) = (self.cfg, &self.groups, &self.group_of);
                step_all(
                    &self.params,
                    &mut self.states,
                    |i| {
                        let g = groups[group_of[i]];
                        AdamConfig {
                            lr: cfg.lr * g.lr_scale,
                            weight_decay: g.weight_decay,
                            ..cfg
                        }
                    },
                    $decoupled,
                    concat!(stringify!($name), "::step"),
                )
            }
            fn parameters(&self) -> &[Parameter] {
                &self.params
            }
            fn learning_rate(&self) -> f64 {
                self.cfg.lr
            }
            fn set_learning_rate(&mut self, lr: f64) -> Result<()> {
                check_learning_rate(stringify!($name), lr, &self.groups)?;
                self.cfg.lr = lr;
                Ok(())
            }
            fn state_tensors(&self) -> Result<Vec<(String, HostTensor)>> {
                adam_state_tensors(&self.params, &self.states, self.cfg.lr)
            }
            fn load_state_tensors(&mut self, tensors: &[(String, HostTensor)]) -> Result<()> {
                let op = concat!(stringify!($name), "::load_state_tensors");
                let (states, lr) = adam_load(op, &self.params, &self.cfg, tensors)?;
                self.states = states;
                self.cfg.lr = lr;
                Ok(())
            }
        }
    };
}

adam_optimizer!(
/// Adam — PyTorch's `torch.optim.Adam`, with bias correction and optional L2 weight decay and
/// AMSGrad. For each parameter at step `t`:
///
/// ```text
/// d = g + wd·p
/// m = β₁·m + (1 − β₁)·d
/// v = β₂·v + (1 − β₂)·d²
/// p = p − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)
/// ```
///
/// # Examples
///
/// ```
/// use arenagrad_nn::optim::{Adam, AdamConfig, Optimizer};
/// use arenagrad_nn::{Graph, HostTensor, Parameter};
/// // Minimise (w − 3)² from w = 0. torch: opt = torch.optim.Adam([w], lr=0.1)
/// let w = Parameter::new("w", HostTensor::new(vec![0.0f64], &[1])?);
/// let mut opt = Adam::new([w.clone()], AdamConfig::new(0.1))?;
/// let mut g = Graph::new();
/// let mut losses = Vec::new();
/// for _ in 0..100 {
///     let loss = g.param(&w)?.shift(-3.0)?.square()?.sum()?;
///     losses.push(loss.item()?);
///     loss.backward()?;
///     g.reset();
///     opt.step()?; // torch: opt.step(); opt.zero_grad()
///     opt.zero_grad();
/// }
/// // Each step moves w by about lr towards 3 until it gets there.
/// assert!(losses.windows(2).take(20).all(|l| l[1] < l[0]), "{losses:?}");
/// assert!(losses[99] < 1e-2 && (w.value().to_f64_vec()[0] - 3.0).abs() < 0.1);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
    Adam,
    decoupled: false,
    new_doc: "An optimiser over `params` (repeated handles are updated once)."
);

adam_optimizer!(
/// AdamW — Adam with decoupled weight decay, PyTorch's `torch.optim.AdamW`: each step first
/// shrinks the parameter, `p = p·(1 − lr·wd)`, then applies Adam's update without an L2 term.
///
/// ```
/// use arenagrad_nn::optim::{AdamConfig, AdamW, Optimizer};
/// use arenagrad_nn::{Graph, HostTensor, Parameter};
/// let p = Parameter::new("p", HostTensor::new(vec![1.0f64], &[1])?);
/// let mut opt = AdamW::new([p.clone()], AdamConfig::adamw(0.1))?;
/// let g = Graph::new();
/// g.param(&p)?.sum()?.backward()?; // gradient 1
/// opt.step()?;
/// // p·(1 − 0.1·0.01) − 0.1 · m̂/(√v̂ + ε) with m̂ = v̂ = 1
/// let want = 1.0 * (1.0 - 0.001) - 0.1 * 1.0 / (1.0 + 1e-8);
/// assert!((p.value().to_f64_vec()[0] - want).abs() < 1e-12);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
    AdamW,
    decoupled: true,
    new_doc: "An optimiser over `params` (repeated handles are updated once). Use\n[`AdamConfig::adamw`] for PyTorch's default weight decay of 0.01."
);
