//! Forward hooks on a module (PyTorch's `register_forward_pre_hook` and `register_forward_hook`):
//! [`Hooked`] wraps any module, runs its pre-hooks on the input and its hooks on the output, and
//! is otherwise the module itself — the same parameters under the same names.

use arenagrad_graph::{Graph, GraphError, Tensor};

use crate::error::Result;
use crate::module::{Module, Visitor};

/// A hook on a module's input: `Some(x)` replaces it (a tensor of `x`'s graph: one of another
/// graph is [`GraphError::GraphMismatch`]).
pub type ForwardPreHook =
    Box<dyn for<'g> Fn(&'g Graph, Tensor<'g>) -> Result<Option<Tensor<'g>>> + Send + Sync>;

/// A hook on a module's output, given its input too: `Some(y)` replaces the output (a tensor of
/// `y`'s graph: one of another graph is [`GraphError::GraphMismatch`]).
pub type ForwardHook = Box<
    dyn for<'g> Fn(&'g Graph, Tensor<'g>, Tensor<'g>) -> Result<Option<Tensor<'g>>> + Send + Sync,
>;

/// `inner` with forward hooks, which run in the order registered.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use arenagrad_nn::{DType, Graph, Hooked, Linear, Module, Rng};
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let log = seen.clone();
/// let mut fc = Hooked::new(Linear::new(3, 2, &mut Rng::seed(0))?);
/// fc.register_forward_hook(move |_g, _x, y| {
///     log.lock().unwrap().push(y.shape().to_vec()); // inspect the activation
///     Ok(Some(y.relu()?)) // and replace it
/// });
/// let g = Graph::new();
/// let y = fc.forward(&g, g.ones(&[4, 3], DType::F32)?)?;
/// assert_eq!(*seen.lock().unwrap(), vec![vec![4, 2]]);
/// assert!(y.to_vec::<f32>()?.iter().all(|&v| v >= 0.0));
/// assert_eq!(fc.named_parameters()[0].0, "weight"); // the same names as the Linear's
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub struct Hooked<M> {
    inner: M,
    pre: Vec<ForwardPreHook>,
    post: Vec<ForwardHook>,
}

impl<M: std::fmt::Debug> std::fmt::Debug for Hooked<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooked")
            .field("inner", &self.inner)
            .field("pre_hooks", &self.pre.len())
            .field("hooks", &self.post.len())
            .finish()
    }
}

impl<M: Module> Hooked<M> {
    /// `inner` with no hooks yet.
    pub fn new(inner: M) -> Self {
        Hooked {
            inner,
            pre: Vec::new(),
            post: Vec::new(),
        }
    }

    /// Runs `hook` on each input before the module sees it.
    pub fn register_forward_pre_hook<F>(&mut self, hook: F) -> &mut Self
    where
        F: for<'g> Fn(&'g Graph, Tensor<'g>) -> Result<Option<Tensor<'g>>> + Send + Sync + 'static,
    {
        self.pre.push(Box::new(hook));
        self
    }

    /// Runs `hook` on each output (with the input that made it).
    pub fn register_forward_hook<F>(&mut self, hook: F) -> &mut Self
    where
        F: for<'g> Fn(&'g Graph, Tensor<'g>, Tensor<'g>) -> Result<Option<Tensor<'g>>>
            + Send
            + Sync
            + 'static,
    {
        self.post.push(Box::new(hook));
        self
    }

    /// Drops every hook.
    pub fn clear_hooks(&mut self) {
        self.pre.clear();
        self.post.clear();
    }

    /// The wrapped module.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// The wrapped module, mutably.
    pub fn inner_mut(&mut self) -> &mut M {
        &mut self.inner
    }

    /// The module without its hooks.
    pub fn into_inner(self) -> M {
        self.inner
    }
}

impl<M: Module> Module for Hooked<M> {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let mut x = x;
        for hook in &self.pre {
            if let Some(nx) = hook(g, x)? {
                x = own(g, nx)?;
            }
        }
        let mut y = self.inner.forward(g, x)?;
        for hook in &self.post {
            if let Some(ny) = hook(g, x, y)? {
                y = own(g, ny)?;
            }
        }
        Ok(y)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        self.inner.visit(v)
    }

    fn set_training(&mut self, training: bool) {
        self.inner.set_training(training)
    }
}

/// `t`, when it belongs to `g`: a hook's tensor of another graph (one that outlives the
/// iteration) is refused as [`Tensor::register_hook`] and `checkpoint` refuse theirs, rather than
/// handed on as if it were the iteration's.
fn own<'g>(g: &'g Graph, t: Tensor<'g>) -> Result<Tensor<'g>> {
    if std::ptr::eq(t.graph(), g) {
        Ok(t)
    } else {
        Err(GraphError::GraphMismatch {
            op: "Hooked::forward",
        }
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Linear, Rng, Sequential};
    use arenagrad_graph::DType;

    #[test]
    fn a_hook_returning_a_tensor_of_another_graph_is_refused() {
        // A graph that outlives every iteration: its tensors fit any hook's lifetime.
        fn other_graph(shape: &[usize]) -> Result<Tensor<'static>> {
            let other: &'static Graph = Box::leak(Box::new(Graph::new()));
            Ok(other.ones(shape, DType::F32)?)
        }
        let make = || Hooked::new(Linear::new(2, 2, &mut Rng::seed(0)).unwrap());
        let mut post = make();
        post.register_forward_hook(|_, _, y| Ok(Some(other_graph(&y.shape())?)));
        let mut pre = make();
        pre.register_forward_pre_hook(|_, x| Ok(Some(other_graph(&x.shape())?)));
        for (what, m) in [("hook", post), ("pre-hook", pre)] {
            let g = Graph::new();
            let x = g.ones(&[3, 2], DType::F32).unwrap();
            match m.forward(&g, x) {
                Err(crate::NnError::Graph(arenagrad_graph::GraphError::GraphMismatch { op })) => {
                    assert_eq!(op, "Hooked::forward", "{what}")
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn hooks_change_the_input_and_the_output_and_gradients_follow() {
        let mut fc = Hooked::new(Linear::new(2, 2, &mut Rng::seed(0)).unwrap());
        let plain =
            Linear::from_parameters(fc.inner().weight().clone(), fc.inner().bias().cloned())
                .unwrap();
        fc.register_forward_pre_hook(|_, x| Ok(Some(x.scale(2.0)?)));
        fc.register_forward_hook(|_, _, y| Ok(Some(y.scale(3.0)?)));
        fc.register_forward_hook(|_, x, y| Ok(Some(y.add(x.sum()?)?)));
        let model = Sequential::new().add(fc);
        let g = Graph::new();
        let x = g
            .from_f64(&[1.0, -0.5, 0.25, 2.0], &[2, 2], DType::F32)
            .unwrap();
        let y = model.forward(&g, x).unwrap();
        // 3·fc(2x) + Σ 2x, where the second hook sees the pre-hooked input.
        let x2 = x.scale(2.0).unwrap();
        let want = plain.forward(&g, x2).unwrap().scale(3.0).unwrap();
        let want = want.add(x2.sum().unwrap()).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        plain.weight().zero_grad();
        y.sum().unwrap().backward().unwrap();
        // d/dW Σ 3·(2x)·Wᵀ = 3 · Σ_rows 2x, for each output row.
        let gw = plain.weight().grad().unwrap().data().to_f64_vec();
        let col = [3.0 * 2.0 * (1.0 + 0.25), 3.0 * 2.0 * (-0.5 + 2.0)];
        assert_eq!(gw, vec![col[0], col[1], col[0], col[1]]);
    }
}
