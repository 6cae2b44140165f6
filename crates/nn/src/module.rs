//! The [`Module`] trait: a forward pass over an iteration's tensors, named parameters and
//! buffers, and a train/eval mode.

use arenagrad_graph::{Graph, Parameter, Tensor};

use crate::error::Result;

/// Whether a visited value is trained or only carried along.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A trainable [`Parameter`]: optimisers update it, checkpoints save it.
    Parameter,
    /// State that is not trained by gradients (BatchNorm's running statistics): checkpoints save
    /// it, optimisers leave it alone.
    Buffer,
}

/// Walks a module tree, handing every parameter and buffer to a callback with its hierarchical
/// name (`0.weight`, `encoder.conv1.bias`). A module's [`Module::visit`] calls
/// [`Visitor::param`] and [`Visitor::buffer`] for its own values and [`Visitor::child`] for each
/// submodule; the visitor keeps the name prefix.
pub struct Visitor<'a> {
    prefix: String,
    f: &'a mut dyn FnMut(&str, &Parameter, Slot),
}

impl<'a> Visitor<'a> {
    /// A visitor calling `f(name, value, slot)` for each value reached.
    pub fn new(f: &'a mut dyn FnMut(&str, &Parameter, Slot)) -> Self {
        Visitor {
            prefix: String::new(),
            f,
        }
    }

    fn emit(&mut self, name: &str, p: &Parameter, slot: Slot) {
        let len = self.prefix.len();
        self.prefix.push_str(name);
        (self.f)(&self.prefix, p, slot);
        self.prefix.truncate(len);
    }

    /// Visits a trainable parameter named `name` within the current module.
    pub fn param(&mut self, name: &str, p: &Parameter) {
        self.emit(name, p, Slot::Parameter);
    }

    /// Visits a buffer (state saved by checkpoints but not trained) named `name`.
    pub fn buffer(&mut self, name: &str, p: &Parameter) {
        self.emit(name, p, Slot::Buffer);
    }

    /// Visits a submodule under the name `name` (its values are named `name.…`).
    pub fn child<M: Module + ?Sized>(&mut self, name: &str, m: &M) {
        let len = self.prefix.len();
        self.prefix.push_str(name);
        self.prefix.push('.');
        m.visit(self);
        self.prefix.truncate(len);
    }
}

/// A layer or a model: a function of an iteration's tensors with persistent parameters.
///
/// Parameters are [`Parameter`]s: they live outside the graph's arena, persist across
/// iterations, and collect gradients (each forward brings them into the iteration with
/// [`Graph::param`]). The mode ([`Module::train`] / [`Module::eval`]) changes what BatchNorm and
/// Dropout do; every module starts in training mode.
///
/// Implementing a module means writing [`Module::forward`], and [`Module::visit`] if it has
/// parameters or submodules (and [`Module::set_training`] if any submodule cares about the mode):
///
/// ```
/// use arenagrad_nn::{Graph, Linear, Module, Result, Rng, Tensor, Visitor};
///
/// /// x ↦ fc2(tanh(fc1(x))) + x. In PyTorch, an nn.Module whose __init__ sets self.fc1 and
/// /// self.fc2: here `visit` names the children, and the names come out the same.
/// struct Residual { fc1: Linear, fc2: Linear }
///
/// impl Module for Residual {
///     fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
///         let h = self.fc1.forward(g, x)?.tanh()?;
///         Ok(self.fc2.forward(g, h)?.add(x)?)
///     }
///     fn visit(&self, v: &mut Visitor<'_>) {
///         v.child("fc1", &self.fc1);
///         v.child("fc2", &self.fc2);
///     }
/// }
///
/// let mut rng = Rng::seed(0);
/// let m = Residual { fc1: Linear::new(4, 8, &mut rng)?, fc2: Linear::new(8, 4, &mut rng)? };
/// let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
///
/// let g = Graph::new();
/// let x = g.randn(&[2, 4], arenagrad_nn::DType::F32)?;
/// let loss = m.forward(&g, x)?.square()?.mean()?;
/// loss.backward()?;
/// assert!(m.parameters().iter().all(|p| p.grad().is_some()));
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
///
/// Or `#[derive(Module)]` writes `visit` and `set_training` from the fields, so that none is
/// forgotten (a child left out of a hand-written `visit` would go untrained and unsaved
/// without a word); the forward pass is an inherent method `forward`. Each field is a child
/// under its own name — `Option`s when `Some`, `Vec`s and arrays element by element (`blocks.0`,
/// `blocks.1`, …) — a [`Parameter`] a parameter (`#[module(buffer)]`: a buffer);
/// `#[module(rename = "…")]` names it otherwise and `#[module(skip)]` leaves it out; plain
/// values (numbers, `bool`, `String`, `DType`) are not parts; a `training: bool` field follows
/// the mode:
///
/// ```
/// use arenagrad_nn::{DType, Dropout, Graph, LayerNorm, Linear, Module, Parameter, Result, Rng, Tensor};
///
/// #[derive(Module)]
/// struct Mlp {
///     blocks: Vec<Linear>,
///     #[module(rename = "LayerNorm")]
///     norm: LayerNorm,
///     head: Option<Linear>,
///     gain: Parameter,
///     drop: Dropout,
///     #[module(skip)]
///     scratch: Vec<f64>,
///     width: usize,
/// }
///
/// impl Mlp {
///     fn forward<'g>(&self, g: &'g Graph, mut x: Tensor<'g>) -> Result<Tensor<'g>> {
///         for b in &self.blocks {
///             x = b.forward(g, x)?.relu()?;
///         }
///         let x = self.drop.forward(g, self.norm.forward(g, x)?)?.mul(g.param(&self.gain)?)?;
///         match &self.head {
///             Some(h) => h.forward(g, x),
///             None => Ok(x),
///         }
///     }
/// }
///
/// let mut rng = Rng::seed(0);
/// let mut m = Mlp {
///     blocks: vec![Linear::new(4, 8, &mut rng)?, Linear::new(8, 8, &mut rng)?],
///     norm: LayerNorm::new(&[8])?,
///     head: Some(Linear::new(8, 2, &mut rng)?),
///     gain: Parameter::new("gain", arenagrad_nn::HostTensor::new(vec![1.0f32; 8], &[8])?),
///     drop: Dropout::new(0.5)?,
///     scratch: Vec::new(),
///     width: 8,
/// };
/// let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias",
///     "LayerNorm.weight", "LayerNorm.bias", "head.weight", "head.bias", "gain"]);
/// m.eval(); // reaches the dropout: two forwards agree
/// let g = Graph::new();
/// let x = g.randn(&[3, 4], DType::F32)?;
/// assert_eq!(m.forward(&g, x)?.to_vec::<f32>()?, m.forward(&g, x)?.to_vec::<f32>()?);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
///
/// A struct without its `forward` does not compile (the error names
/// `DeriveModuleNeedsAnInherentForwardMethodOrModuleForwardAttribute`; `#[module(forward =
/// "Self::run")]` names another method) — rather than a `Module::forward` that calls itself:
///
/// ```compile_fail,E0034
/// use arenagrad_nn::{Linear, Module};
/// #[derive(Module)]
/// struct NoForward { fc: Linear }
/// ```
pub trait Module {
    /// Computes the output for `x` on the iteration `g`.
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>>;

    /// Hands every parameter, buffer and submodule to `v` (the default: none).
    fn visit(&self, v: &mut Visitor<'_>) {
        let _ = v;
    }

    /// Switches training mode on or off, in this module and its submodules (the default: no
    /// mode-dependent behaviour).
    fn set_training(&mut self, training: bool) {
        let _ = training;
    }

    /// Training mode: BatchNorm uses (and updates) batch statistics, Dropout drops.
    fn train(&mut self) {
        self.set_training(true);
    }

    /// Evaluation mode: BatchNorm uses its running statistics, Dropout is the identity.
    fn eval(&mut self) {
        self.set_training(false);
    }

    /// Every parameter and buffer with its name and slot, in visiting order.
    fn named_state(&self) -> Vec<(String, Parameter, Slot)> {
        let mut out = Vec::new();
        self.visit(&mut Visitor::new(&mut |n, p, s| {
            out.push((n.to_string(), p.clone(), s))
        }));
        out
    }

    /// The trainable parameters with their names, in visiting order; a parameter reached twice
    /// (shared between submodules) is listed once, under its first name.
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut out: Vec<(String, Parameter)> = Vec::new();
        self.visit(&mut Visitor::new(&mut |n, p, s| {
            if s == Slot::Parameter && !out.iter().any(|(_, q)| q.same(p)) {
                out.push((n.to_string(), p.clone()));
            }
        }));
        out
    }

    /// The trainable parameters (what an optimiser takes).
    fn parameters(&self) -> Vec<Parameter> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// The buffers with their names, in visiting order.
    fn named_buffers(&self) -> Vec<(String, Parameter)> {
        let mut out = Vec::new();
        self.visit(&mut Visitor::new(&mut |n, p, s| {
            if s == Slot::Buffer {
                out.push((n.to_string(), p.clone()));
            }
        }));
        out
    }

    /// The number of trainable scalars.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Parameter::numel).sum()
    }

    /// The parameters that are not frozen ([`Parameter::requires_grad`]), in visiting order:
    /// what a fine-tuning optimiser takes.
    fn trainable_parameters(&self) -> Vec<Parameter> {
        self.parameters()
            .into_iter()
            .filter(Parameter::requires_grad)
            .collect()
    }

    /// The number of scalars in [`Module::trainable_parameters`].
    fn num_trainable_parameters(&self) -> usize {
        self.trainable_parameters()
            .iter()
            .map(Parameter::numel)
            .sum()
    }

    /// Freezes every parameter (PyTorch's `requires_grad_(False)` on each): backward computes
    /// no gradient for them and keeps no gradient buffer, optimisers skip them.
    fn freeze(&self) {
        for p in self.parameters() {
            p.set_requires_grad(false);
        }
    }

    /// Thaws every parameter ([`Module::freeze`] undone).
    fn unfreeze(&self) {
        for p in self.parameters() {
            p.set_requires_grad(true);
        }
    }

    /// Clears every parameter's accumulated gradient.
    fn zero_grad(&self) {
        self.visit(&mut Visitor::new(&mut |_, p, s| {
            if s == Slot::Parameter {
                p.zero_grad();
            }
        }));
    }

    /// Renames every parameter and buffer to its hierarchical name (what
    /// [`Parameter::name`] then reports, in optimiser errors for instance).
    fn assign_names(&self) {
        self.visit(&mut Visitor::new(&mut |n, p, _| p.set_name(n)));
    }
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        (**self).forward(g, x)
    }
    fn visit(&self, v: &mut Visitor<'_>) {
        (**self).visit(v)
    }
    fn set_training(&mut self, training: bool) {
        (**self).set_training(training)
    }
}
