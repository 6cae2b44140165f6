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
use crate::{Graph, Tensor};

/// A checkpointed block: its output from its inputs, on any iteration of any graph.
pub type CheckpointFn =
    Arc<dyn for<'a> Fn(&'a Graph, &[Tensor<'a>]) -> Result<Tensor<'a>> + Send + Sync>;

/// What a checkpoint node keeps: the block and the generator as the block found it.
pub(crate) struct CheckpointNode {
    pub f: CheckpointFn,
    pub rng: Rng,
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
    /// let x = g.var(&[0.5, -1.0], &[2], DType::F64)?;
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
        let rng = self.inner().rng.clone();
        let recording = self.is_grad_enabled();
        // Run in a scope, recording as the caller is, to learn whether the output needs a
        // gradient (it does when the block uses parameters, whatever its inputs).
        let (value, needs_grad) = self.try_scope(|g| {
            let _mode = recording.then(|| g.enable_grad());
            let y = f(g, inputs)?;
            g.owns(op, &y)?;
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
        let node = CheckpointNode { f, rng };
        let needs_grad = needs_grad || ids.iter().any(|&x| i.nodes[x].requires_grad);
        let op = move || Op::Checkpoint(Arc::new(node));
        let id = i.push_with(dev, shape, dtype, buf, op, &ids, needs_grad);
        drop(i);
        Ok(self.handle(id))
    }
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
    let (start, modes, rng) = {
        let mut i = g.inner();
        let modes = (i.grad_mode, i.temp_mode, i.in_backward);
        (i.grad_mode, i.temp_mode, i.in_backward) = (true, false, false);
        let rng = std::mem::replace(&mut i.rng, node.rng.clone());
        (i.tape.len(), modes, rng)
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
    let mut i = g.inner();
    (i.grad_mode, i.temp_mode, i.in_backward) = modes;
    i.rng = rng;
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
