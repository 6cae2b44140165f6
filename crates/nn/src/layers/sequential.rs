//! A chain of modules.

use arenagrad_graph::{Graph, Tensor};

use crate::error::Result;
use crate::module::{Module, Visitor};

/// Modules applied in order, each to the previous one's output. Children are named by position,
/// so parameters read `0.weight`, `0.bias`, `2.weight`, … (PyTorch's names).
///
/// ```
/// use arenagrad_nn::{DType, Graph, Linear, Module, ReLU, Rng, Sequential};
/// let mut rng = Rng::seed(0);
/// // torch: nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
/// let mlp = Sequential::new()
///     .add(Linear::new(4, 16, &mut rng)?)
///     .add(ReLU)
///     .add(Linear::new(16, 3, &mut rng)?);
/// let names: Vec<String> = mlp.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
/// let g = Graph::new();
/// let logits = mlp.forward(&g, g.randn(&[8, 4], DType::F32)?)?;
/// assert_eq!(logits.shape().as_slice(), &[8, 3]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module + Send + Sync>>,
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequential")
            .field("layers", &self.layers.len())
            .finish()
    }
}

impl Sequential {
    /// An empty chain (the identity).
    pub fn new() -> Self {
        Self::default()
    }

    /// The chain with `m` appended (builder style).
    #[allow(clippy::should_implement_trait)]
    pub fn add<M: Module + Send + Sync + 'static>(mut self, m: M) -> Self {
        self.push(m);
        self
    }

    /// Appends `m`.
    pub fn push<M: Module + Send + Sync + 'static>(&mut self, m: M) {
        self.layers.push(Box::new(m));
    }

    /// Appends an already boxed module.
    pub fn push_boxed(&mut self, m: Box<dyn Module + Send + Sync>) {
        self.layers.push(m);
    }

    /// The number of modules.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether the chain is empty.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The module at `index`.
    pub fn get(&self, index: usize) -> Option<&(dyn Module + Send + Sync)> {
        self.layers.get(index).map(|b| &**b)
    }

    /// The module at `index`, mutably.
    pub fn get_mut(&mut self, index: usize) -> Option<&mut (dyn Module + Send + Sync)> {
        match self.layers.get_mut(index) {
            Some(b) => Some(&mut **b),
            None => None,
        }
    }
}

impl Module for Sequential {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        self.layers.iter().try_fold(x, |h, m| m.forward(g, h))
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        let mut name = String::new();
        for (k, m) in self.layers.iter().enumerate() {
            name.clear();
            use std::fmt::Write;
            let _ = write!(name, "{k}");
            v.child(&name, &**m);
        }
    }

    fn set_training(&mut self, training: bool) {
        for m in &mut self.layers {
            m.set_training(training);
        }
    }
}
