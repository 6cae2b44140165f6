//! Gradient checkpointing: a block recorded as one node that keeps only its inputs and output;
//! backward runs the block again, recording this time, and walks the fresh nodes before going on
//! below the block (see `autodiff`), freeing each fresh node's output as soon as its own step is
//! done. What stays until the reset: fresh values no gradient reaches (constants, masks), and
//! the buffers a fused op keeps beside its output (an LSTM's saved gates, a norm's statistics).
//! The second run's work counts as forward work in the FLOP counts (it is a forward).
//!
//! The block's forward runs in a scope ([`Graph::try_scope`]): what it makes is freed at once,
//! its output kept as a copy. The graph's generator is saved with the node and replayed for the
//! second run, so dropout draws the same masks and the gradients are the ones the block would
//! have without checkpointing, bit for bit.

use std::sync::Arc;

use super::{check_pair, Op};
use crate::error::{GraphError, Result};
use crate::graph::NodeId;
use crate::rng::Rng;
use crate::shape::copy_of;
use crate::{Graph, Parameter, Tensor};

/// A checkpointed block: its output from its inputs, on any iteration of any graph.
pub type CheckpointFn =
    Arc<dyn for<'a> Fn(&'a Graph, &[Tensor<'a>]) -> Result<Tensor<'a>> + Send + Sync>;

/// What a checkpoint node keeps: the block, the generator as the block found it, and the
/// parameters the block brought in (directly or through checkpoints of its own).
pub(crate) struct CheckpointNode {
    pub f: CheckpointFn,
    pub rng: Rng,
    /// Each once, in the order first brought in. Their leaves go with the first run's scope;
    /// backward's param hooks learn of them from here (see `param::params_to_tell`).
    pub params: Vec<Parameter>,
}

impl Graph {
    /// `f(inputs)` recorded as one node whose activations are not kept: backward runs `f` again
    /// to make them (PyTorch's `torch.utils.checkpoint`). The gradients are those of `f`
    /// itself, bit for bit — dropout inside draws the same masks the second time — and
    /// parameters used inside receive theirs as usual. Works under `create_graph`. The inputs
    /// and the output share one dtype and device.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use arenagrad_graph::{CheckpointFn, DType, Graph};
    /// let block: CheckpointFn = Arc::new(|_g, x| x[0].tanh()?.mul(x[0])?.sin());
    /// let g = Graph::new();
    /// let x = g.leaf(&[0.5, -1.0], &[2], DType::F64)?;
    /// g.checkpoint(block.clone(), &[x])?.sum()?.backward()?;
    /// let with = x.grad()?.unwrap().to_vec::<f64>()?;
    /// x.zero_grad()?;
    /// block(&g, &[x])?.sum()?.backward()?;
    /// assert_eq!(with, x.grad()?.unwrap().to_vec::<f64>()?);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn checkpoint<'g>(&'g self, f: CheckpointFn, inputs: &[Tensor<'g>]) -> Result<Tensor<'g>> {
        let op = "checkpoint";
        let ids = self.owns_all(op, inputs)?;
        let (rng, leaves_from, tape_from) = {
            let i = self.inner.borrow();
            (i.rng.clone(), i.param_leaves.len(), i.tape.len())
        };
        let recording = self.is_grad_enabled();
        // Run in a scope, recording as the caller is, to learn whether the output needs a
        // gradient (it does when the block uses parameters, whatever its inputs) and which
        // parameters it uses.
        let mut params = Vec::new();
        let (value, needs_grad) = self.try_scope(|g| {
            let _mode = recording.then(|| g.enable_grad());
            let y = f(g, inputs)?;
            g.owns(op, &y)?;
            params = params_since(&g.inner.borrow(), leaves_from, tape_from);
            Ok::<_, GraphError>((y, y.requires_grad()))
        })?;
        for x in inputs {
            check_pair(op, &value, x)?;
        }
        let mut i = self.inner();
        let (shape, dtype, buf) = {
            let n = i.node(op, value.id)?;
            (copy_of(&n.shape), n.dtype, n.buf)
        };
        let dev = i.device_of(op, value.id)?;
        i.retain_buf(op, dev, buf)?;
        let uses_params = !params.is_empty();
        let node = CheckpointNode { f, rng, params };
        let needs_grad = needs_grad || ids.iter().any(|&x| i.nodes[x].requires_grad);
        let op = move || Op::Checkpoint(Arc::new(node));
        let id = i.push_with(dev, shape, dtype, buf, op, &ids, needs_grad);
        if uses_params && i.nodes[id].tape_pos != crate::graph::NO_POS {
            // Listed with the parameters' leaves, so that the param hooks hear of the
            // parameters only the block uses: their gradients are final once backward has
            // passed this node (its second run included).
            i.param_leaves.push(id);
        }
        drop(i);
        Ok(self.handle(id))
    }
}

/// The parameters a block's first run brought in: through the leaves [`Graph::param`] made
/// since `leaves_from`, and the checkpoints recorded since `tape_from` (whose own leaves went
/// with their scopes). Each once, in the order first brought in.
fn params_since(i: &crate::graph::Inner, leaves_from: usize, tape_from: usize) -> Vec<Parameter> {
    let mut out: Vec<Parameter> = Vec::new();
    let leaves = i.param_leaves.get(leaves_from..).unwrap_or(&[]);
    let tape = i.tape.get(tape_from..).unwrap_or(&[]);
    for id in leaves.iter().chain(tape) {
        let found: &[Parameter] = match i.nodes.get(*id).map(|n| &n.op) {
            Some(Op::Param(p)) => std::slice::from_ref(p),
            Some(Op::Checkpoint(ck)) => &ck.params,
            _ => &[],
        };
        for p in found {
            if !out.iter().any(|q| q.same(p)) {
                out.push(p.clone());
            }
        }
    }
    out
}

/// Backward's second run of a checkpointed block on its input nodes, recorded, the generator
/// replayed. Returns the tape's length before the run and the recorded output (`None` when it
/// needs no gradient).
pub(crate) fn rerun(
    g: &Graph,
    node: &CheckpointNode,
    out: NodeId,
    inputs: &[NodeId],
) -> Result<(usize, Option<NodeId>)> {
    let op = "checkpoint";
    let (start, restore) = {
        let mut i = g.inner();
        let modes = (i.grad_mode, i.temp_mode, i.in_backward);
        (i.grad_mode, i.temp_mode, i.in_backward) = (true, false, false);
        let rng = std::mem::replace(&mut i.rng, node.rng.clone());
        let restore = Restore {
            g,
            modes,
            rng: Some(rng),
        };
        (i.tape.len(), restore)
    };
    let handles: Vec<Tensor<'_>> = inputs.iter().map(|&id| g.handle(id)).collect();
    let y = (node.f)(g, &handles).and_then(|y| {
        g.owns(op, &y)?;
        // A block that hands back one of its inputs (an identity) made no node of its own: a
        // copy is one, so that the gradient has a slot of the second run's to go in.
        let earlier = {
            let i = g.inner.borrow();
            let pos = i.node(op, y.id)?.tape_pos;
            pos != crate::graph::NO_POS && (pos as usize) < start
        };
        if earlier {
            y.scale(1.0)
        } else {
            Ok(y)
        }
    });
    drop(restore);
    let i = g.inner();
    let y = y?;
    let (want, got) = (i.node(op, out)?, i.node(op, y.id)?);
    if want.shape != got.shape || want.dtype != got.dtype || want.device() != got.device() {
        return Err(GraphError::BadArgument {
            op,
            what: "the block's second run gave another shape, dtype or device than its first",
        });
    }
    let recorded = got.requires_grad && got.tape_pos != crate::graph::NO_POS;
    Ok((start, recorded.then_some(y.id)))
}

/// Puts back what a second run changed — the modes, and the generator, which the run rewound to
/// where the block found it — however the run ends: a block that panics (a caller may catch
/// it) must not leave later draws repeating earlier ones.
struct Restore<'a> {
    g: &'a Graph,
    modes: (bool, bool, bool),
    rng: Option<Rng>,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        // `try_borrow_mut`: a panic while the graph was borrowed leaves it borrowed during the
        // unwind; a second panic here would abort.
        if let Ok(mut i) = self.g.inner.try_borrow_mut() {
            (i.grad_mode, i.temp_mode, i.in_backward) = self.modes;
            if let Some(rng) = self.rng.take() {
                i.rng = rng;
            }
        }
    }
}
