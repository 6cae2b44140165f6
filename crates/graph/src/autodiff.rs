//! Reverse-mode differentiation: one reverse loop over the tape.
//!
//! Nodes are appended to the tape as they are created, so creation order is a topological order
//! and backward needs no sort and no recursion: it walks tape positions from the root down,
//! skipping every position that received no gradient (which is what lets several backward passes
//! over disjoint parts of one iteration coexist, as in a GAN step).
//!
//! Gradients live in a side table indexed by tape position. Without `create_graph`, every
//! gradient tensor is a temporary: it is freed — its id goes stale and its buffer returns to the
//! arena's free list — as soon as the last gradient slot holding it is consumed, so backward's
//! memory is the forward's activations plus the live gradient frontier.

use std::cell::RefMut;

use smallvec::SmallVec;

use crate::error::{GraphError, Result};
use crate::graph::{Inner, NodeId, NO_POS};
use crate::ops::{self, Ctx, Op};
use crate::shape::copy_of;
use crate::{Graph, Tensor};
use crate::{Parameter, Storage};

/// Options of [`Tensor::backward_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BackwardOptions<'g> {
    /// Keep the graph so that another backward can run through it.
    pub retain_graph: bool,
    /// Record the backward computation, so gradients can be differentiated again.
    /// Implies `retain_graph`, as in PyTorch.
    pub create_graph: bool,
    /// The gradient of the output; required when the output has more than one element.
    pub grad: Option<Tensor<'g>>,
}

impl<'g> Tensor<'g> {
    /// Backpropagates from this one-element tensor into every leaf that requires grad, then frees
    /// the graph for backward: a second backward through the same nodes is an error.
    ///
    /// # Examples
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph, GraphError};
    /// let g = Graph::new();
    /// let x = g.leaf(&[3.0], &[1], DType::F64)?;
    /// let y = x.mul(x)?.sum()?; // x²
    /// y.backward()?; // torch: y.backward()
    /// assert_eq!(x.grad()?.map(|d| d.item()).transpose()?, Some(6.0)); // 2x
    /// // The pass consumed the graph, as in PyTorch without retain_graph=True.
    /// assert!(matches!(y.backward(), Err(GraphError::GraphSpent { .. })));
    /// # Ok::<(), GraphError>(())
    /// ```
    pub fn backward(self) -> Result<()> {
        self.backward_with(BackwardOptions::default())
    }

    /// [`Tensor::backward`] with options.
    ///
    /// # Examples
    ///
    /// ```
    /// use arenagrad_graph::{BackwardOptions, DType, Graph};
    /// let g = Graph::new();
    /// let x = g.leaf(&[3.0], &[1], DType::F64)?;
    /// let y = x.mul(x)?.sum()?; // x²
    /// // torch: y.backward(retain_graph=True); y.backward()
    /// y.backward_with(BackwardOptions { retain_graph: true, ..Default::default() })?;
    /// y.backward()?;
    /// // Each pass added 2x = 6 into x's gradient.
    /// assert_eq!(x.grad()?.map(|d| d.item()).transpose()?, Some(12.0));
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn backward_with(self, opts: BackwardOptions<'g>) -> Result<()> {
        run(self.g, self, opts, None).map(|_| ())
    }
}

/// The gradients of `output` with respect to `inputs`, returned rather than accumulated into
/// leaves (PyTorch's `torch.autograd.grad`). `None` where no path leads to an input.
///
/// With `create_graph` the gradients are recorded tensors themselves, so they can be
/// differentiated again (a second derivative, a gradient penalty):
///
/// ```
/// use arenagrad_graph::{grad, BackwardOptions, DType, Graph};
/// let g = Graph::new();
/// let x = g.leaf(&[2.0], &[1], DType::F64)?;
/// let y = x.mul(x)?.mul(x)?.sum()?; // x³
/// let record = BackwardOptions { create_graph: true, ..Default::default() };
/// let dy = grad(y, &[x], record)?[0].unwrap(); // 3x²
/// assert_eq!(dy.to_vec::<f64>()?, vec![12.0]);
/// let d2y = grad(dy.sum()?, &[x], BackwardOptions::default())?[0].unwrap(); // 6x
/// assert_eq!(d2y.to_vec::<f64>()?, vec![12.0]);
/// // grad returned the gradients: nothing accumulated into x.
/// assert!(x.grad()?.is_none());
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
pub fn grad<'g>(
    output: Tensor<'g>,
    inputs: &[Tensor<'g>],
    opts: BackwardOptions<'g>,
) -> Result<Vec<Option<Tensor<'g>>>> {
    let ids = output.g.owns_all("grad", inputs)?;
    let got = run(output.g, output, opts, Some(&ids))?;
    Ok(got
        .into_iter()
        .map(|o| o.map(|id| output.g.handle(id)))
        .collect())
}

/// Restores grad mode and clears the slots however the loop ends.
struct ModeRestore<'g> {
    g: &'g Graph,
    grad_mode: bool,
    in_backward: bool,
}

impl Drop for ModeRestore<'_> {
    fn drop(&mut self) {
        let mut i = self.g.inner();
        i.grad_mode = self.grad_mode;
        i.in_backward = self.in_backward;
        i.temp_mode = false;
        i.temp_log.clear();
        i.grad_slots.clear();
    }
}

fn release(i: &mut Inner, id: NodeId) {
    if let Some(n) = i.nodes.get_mut(id) {
        n.grad_refs = n.grad_refs.saturating_sub(1);
        if n.grad_refs == 0 && n.temp {
            i.free_temp(id);
        }
    }
}

fn keep(i: &mut Inner, id: NodeId) {
    if let Some(n) = i.nodes.get_mut(id) {
        n.temp = false;
    }
}

/// One backward pass: seeds the root's slot ([`seed`], [`begin`]), then walks the tape down,
/// running each step's rule, adding its gradients into the inputs' slots ([`accumulate`]) and
/// freeing the temporaries nobody holds ([`free_temporaries`]). `capture`: the nodes whose
/// gradients [`grad`] hands back instead of accumulating them into leaves.
fn run<'g>(
    g: &'g Graph,
    root: Tensor<'g>,
    opts: BackwardOptions<'g>,
    capture: Option<&[NodeId]>,
) -> Result<Vec<Option<NodeId>>> {
    let retain = opts.retain_graph || opts.create_graph;
    let create = opts.create_graph;
    // Nothing recorded and no gradients handed back: the fast paths (gradients rewritten in
    // place, weight gradients straight into parameters) may run.
    let plain = !create && capture.is_none();
    let (root_pos, seed_t) = seed(g, root, &opts)?;
    // The parameters whose hooks hear when the walk is done with them (none for `grad`, which
    // adds into no parameter).
    let mut tell = match capture {
        None => crate::param::params_to_tell(&g.inner.borrow(), root_pos),
        Some(_) => Vec::new(),
    };
    let _restore = begin(g, root_pos, seed_t, create, opts.grad.is_none());
    let mut captured: Vec<Option<NodeId>> = vec![None; capture.map_or(0, <[NodeId]>::len)];

    // Tape positions not yet visited: the walk goes down from the root. A checkpoint's second
    // run appends nodes to the tape; the walk goes down through them to `floor` (where they
    // begin), then back to where it left off (`resume`).
    let mut left = root_pos + 1;
    let mut floor = 0usize;
    let mut resume: Vec<(usize, usize)> = Vec::new();
    loop {
        let (gid, node_id, op, inputs, spent, retain_grad) = {
            let mut i = g.inner();
            let Some((gid, node_id)) = next_step(&mut i, &mut left, floor, plain, retain)? else {
                match resume.pop() {
                    Some((l, f)) => {
                        (left, floor) = (l, f);
                        continue;
                    }
                    None => break,
                }
            };
            let n = &i.nodes[node_id];
            (
                gid,
                node_id,
                n.op.clone(),
                SmallVec::from_slice(&n.inputs),
                n.spent,
                n.retain_grad,
            )
        };
        // Every step above this one is done: so are the parameters whose leaves lie there.
        crate::param::tell_params(g, &mut tell, left + 1);
        let gid = run_hooks(g, node_id, gid)?;
        if let Some(c) = capture {
            capture_grad(g, c, &mut captured, node_id, gid)?;
        }
        let is_leaf = matches!(op, Op::Leaf | Op::Param(_));
        if is_leaf || retain_grad {
            if capture.is_none() {
                deliver(g, &op, node_id, gid, create)?;
            }
            if is_leaf {
                release(&mut g.inner(), gid);
                continue;
            }
        }
        if spent {
            return Err(GraphError::GraphSpent { op: op.name() });
        }
        if let Op::Checkpoint(ck) = &op {
            let (start, y) = ops::checkpoint::rerun(g, ck, node_id, &inputs)?;
            let mut i = g.inner();
            if !retain {
                i.nodes[node_id].spent = true;
            }
            match y {
                Some(y) => {
                    // The block's gradient seeds its second run's output, claim and all.
                    let (pos, len) = (i.nodes[y].tape_pos as usize, i.tape.len());
                    i.grad_slots.resize(len, None);
                    i.grad_slots[pos] = Some(gid);
                    resume.push((left, floor));
                    (left, floor) = (len, start);
                }
                None => release(&mut i, gid),
            }
            continue;
        }
        let ctx = Ctx {
            g,
            out: g.handle(node_id),
            inputs,
            gy: g.handle(gid),
            create_graph: create,
            into_params: plain,
        };
        let in_place = match &op {
            Op::Unary(u) if !create => {
                ops::unary::backward_in_place(&mut g.inner(), *u, ctx.inputs[0], node_id, gid)?
            }
            _ => false,
        };
        // A slice whose input holds a gradient already adds into it (nothing to accumulate).
        let added = match &op {
            Op::Slice { axis, start } if plain => ops::shape::slice_backward_into_slot(
                &mut g.inner(),
                (*axis, *start),
                ctx.inputs[0],
                gid,
            )?,
            _ => false,
        };
        let grads = if in_place {
            smallvec::smallvec![Some(ctx.gy)]
        } else if added {
            smallvec::smallvec![None]
        } else {
            ops::backward(&op, &ctx)?
        };
        let mut i = g.inner();
        i.count_backward(&op, node_id);
        if !retain {
            i.nodes[node_id].spent = true;
        }
        i = accumulate(g, i, &op, &ctx.inputs, grads)?;
        free_temporaries(&mut i);
        release(&mut i, gid);
        if floor > 0 && plain && !retain {
            // A checkpoint's second-run activation: its consumers and itself are done.
            i.free_temp(node_id);
        }
    }
    crate::param::tell_params(g, &mut tell, 0);
    Ok(captured)
}

/// Runs node `node_id`'s gradient hooks on its gradient `gid`; returns the gradient that goes
/// on (a hook's replacement, which takes over the slot's claim).
fn run_hooks(g: &Graph, node_id: NodeId, gid: NodeId) -> Result<NodeId> {
    const OP: &str = "register_hook";
    let hooks: Vec<_> = {
        let i = g.inner.borrow();
        if !i.has_hook(node_id) {
            return Ok(gid);
        }
        i.hooks
            .iter()
            .filter(|(id, _)| *id == node_id)
            .map(|(_, h)| h.clone())
            .collect()
    };
    let mut gid = gid;
    for hook in hooks {
        let Some(new) = hook(g.handle(gid))? else {
            continue;
        };
        g.owns(OP, &new)?;
        let mut i = g.inner();
        let (want, got) = (i.node(OP, gid)?, i.node(OP, new.id)?);
        if want.shape != got.shape {
            return Err(GraphError::ShapeMismatch {
                op: OP,
                lhs: want.shape.to_vec(),
                rhs: got.shape.to_vec(),
            });
        }
        if want.dtype != got.dtype {
            return Err(GraphError::DTypeMismatch {
                op: OP,
                lhs: want.dtype,
                rhs: got.dtype,
            });
        }
        if want.device() != got.device() {
            return Err(GraphError::DeviceMismatch {
                op: OP,
                lhs: want.device(),
                rhs: got.device(),
            });
        }
        i.nodes[new.id].grad_refs += 1;
        release(&mut i, gid);
        gid = new.id;
    }
    Ok(gid)
}

/// Checks the root and makes the gradient the walk starts from: the user's (same graph, device,
/// shape and dtype as the root) or, for a one-element root, a one. Returns the root's tape
/// position with it.
fn seed<'g>(
    g: &'g Graph,
    root: Tensor<'g>,
    opts: &BackwardOptions<'g>,
) -> Result<(usize, Tensor<'g>)> {
    const OP: &str = "backward";
    let (root_pos, root_shape, root_dtype, root_dev) = {
        let i = g.inner.borrow();
        let n = i.node(OP, root.id)?;
        if !n.requires_grad || n.tape_pos == NO_POS {
            return Err(GraphError::NoGradFn);
        }
        (n.tape_pos as usize, copy_of(&n.shape), n.dtype, n.device())
    };
    let seed = match opts.grad {
        Some(s) => {
            g.owns(OP, &s)?;
            let sh = s.try_shape()?;
            if s.device() != root_dev {
                return Err(GraphError::DeviceMismatch {
                    op: OP,
                    lhs: root_dev,
                    rhs: s.device(),
                });
            }
            if sh != root_shape {
                return Err(GraphError::ShapeMismatch {
                    op: OP,
                    lhs: root_shape.to_vec(),
                    rhs: sh.to_vec(),
                });
            }
            if s.dtype() != root_dtype {
                return Err(GraphError::DTypeMismatch {
                    op: OP,
                    lhs: root_dtype,
                    rhs: s.dtype(),
                });
            }
            s
        }
        None => {
            if root_shape.iter().product::<usize>() != 1 {
                return Err(GraphError::NotScalar {
                    op: OP,
                    shape: root_shape.to_vec(),
                });
            }
            let _ng = g.no_grad();
            g.full_on(&root_shape, 1.0, root_dtype, root_dev)?
        }
    };
    Ok((root_pos, seed))
}

/// Sets the graph up for the walk (grad mode as `create` asks, gradients made as temporaries
/// unless recorded) and puts the seed in the root's slot; the guard undoes it however the walk
/// ends. A seed the engine made is itself a temporary.
fn begin<'g>(
    g: &'g Graph,
    root_pos: usize,
    seed: Tensor<'g>,
    create: bool,
    own_seed: bool,
) -> ModeRestore<'g> {
    let mut i = g.inner();
    let prev = i.grad_mode;
    i.grad_mode = create;
    i.temp_mode = !create;
    if own_seed && !create {
        i.nodes[seed.id].temp = true;
    }
    i.grad_slots.clear();
    i.grad_slots.resize(root_pos + 1, None);
    i.grad_slots[root_pos] = Some(seed.id);
    i.nodes[seed.id].grad_refs += 1;
    let in_backward = std::mem::replace(&mut i.in_backward, true);
    ModeRestore {
        g,
        grad_mode: prev,
        in_backward,
    }
}

/// [`grad`]'s side: keeps the gradient arriving at a node it asked for (summed when the node
/// appears twice in its list's positions).
fn capture_grad(
    g: &Graph,
    capture: &[NodeId],
    captured: &mut [Option<NodeId>],
    node_id: NodeId,
    gid: NodeId,
) -> Result<()> {
    for (k, want) in capture.iter().enumerate() {
        if *want == node_id {
            let mut i = g.inner();
            keep(&mut i, gid);
            captured[k] = Some(match captured[k] {
                None => gid,
                Some(prev) => {
                    drop(i);
                    g.handle(prev).add(g.handle(gid))?.id
                }
            });
        }
    }
    Ok(())
}

/// A leaf's (or a `retain_grad` node's) gradient into its `.grad`. A parameter's goes straight
/// into the parameter; the arena keeps no copy (`Tensor::grad` of its leaf reads the
/// parameter's). Only a differentiable gradient (create_graph) also stays on the leaf.
fn deliver(g: &Graph, op: &Op, node_id: NodeId, gid: NodeId, create: bool) -> Result<()> {
    match op {
        Op::Param(p) => {
            if create {
                accumulate_into_node(g, node_id, gid)?;
            }
            accumulate_into_param(g, p, gid)
        }
        _ => accumulate_into_node(g, node_id, gid),
    }
}

/// Adds a rule's gradients into its inputs' slots (summing with what a slot holds), after
/// checking that each lives where its input does. Takes and gives back the caller's borrow.
fn accumulate<'a>(
    g: &'a Graph,
    mut i: RefMut<'a, Inner>,
    op: &Op,
    inputs: &[NodeId],
    grads: ops::Grads<'a>,
) -> Result<RefMut<'a, Inner>> {
    for (k, gi) in grads.into_iter().enumerate() {
        let Some(t) = gi else { continue };
        let input = inputs[k];
        let n = &i.nodes[input];
        if !n.requires_grad || n.tape_pos == NO_POS {
            continue;
        }
        // A rule (a custom op's, say) must hand back a gradient where its input lives:
        // kernels read both buffers with the input's dtype on the input's device.
        let gn = i.node(op.name(), t.id)?;
        if gn.device() != n.device() {
            return Err(GraphError::DeviceMismatch {
                op: op.name(),
                lhs: n.device(),
                rhs: gn.device(),
            });
        }
        if gn.dtype != n.dtype {
            return Err(GraphError::DTypeMismatch {
                op: op.name(),
                lhs: n.dtype,
                rhs: gn.dtype,
            });
        }
        let ipos = n.tape_pos as usize;
        // A leaf set to require grad after this pass began (by a hook) lies past its slots: as
        // in PyTorch, which fixes at the forward what needs a gradient, it sits this pass out.
        let Some(&slot) = i.grad_slots.get(ipos) else {
            continue;
        };
        match slot {
            None => {
                i.grad_slots[ipos] = Some(t.id);
                i.nodes[t.id].grad_refs += 1;
            }
            Some(old) => {
                drop(i);
                let sum = g.handle(old).add(t)?;
                i = g.inner();
                i.grad_slots[ipos] = Some(sum.id);
                i.nodes[sum.id].grad_refs += 1;
                release(&mut i, old);
                // `t` may be held elsewhere (a pass-through gradient); free it only if not.
                if i.nodes
                    .get(t.id)
                    .is_some_and(|n| n.grad_refs == 0 && n.temp)
                {
                    i.free_temp(t.id);
                }
            }
        }
    }
    Ok(i)
}

/// Frees the intermediates a rule made that no slot holds.
fn free_temporaries(i: &mut Inner) {
    if i.temp_log.is_empty() {
        return;
    }
    let mut log = std::mem::take(&mut i.temp_log);
    for &id in &log {
        if i.nodes.get(id).is_some_and(|n| n.grad_refs == 0 && n.temp) {
            i.free_temp(id);
        }
    }
    log.clear();
    i.temp_log = log;
}

/// How far ahead of the walk [`next_step`] prefetches nodes: a chain's nodes were written long
/// ago, in creation order, and the walk reads them back in reverse.
const PREFETCH_STEPS: usize = 8;

/// Walks the tape down from position `left - 1` past the steps that need no rule — empty
/// gradient slots, and (when `plain`) elementwise steps done in place ([`unary_fast_path`]) — all
/// under the caller's one borrow of the graph. Returns the next step that needs its rule, its
/// gradient taken out of the slot, or `None` once the tape is done.
fn next_step(
    i: &mut Inner,
    left: &mut usize,
    floor: usize,
    plain: bool,
    retain: bool,
) -> Result<Option<(NodeId, NodeId)>> {
    while *left > floor {
        *left -= 1;
        let pos = *left;
        if let Some(&ahead) = i.tape.get(pos.wrapping_sub(PREFETCH_STEPS)) {
            i.nodes.prefetch(ahead);
        }
        let Some(gid) = i.grad_slots[pos].take() else {
            continue;
        };
        let node_id = i.tape[pos];
        if plain && !i.has_hook(node_id) && unary_fast_path(i, node_id, gid, retain)? {
            if floor > 0 && !retain {
                // A checkpoint's second-run activation, done with (see `run`).
                i.free_temp(node_id);
            }
            continue;
        }
        return Ok(Some((gid, node_id)));
    }
    Ok(None)
}

/// The common step of a plain backward through an elementwise op: its gradient `gid` is
/// rewritten in place for the input ([`ops::unary::backward_in_place`]) and moves, with its one
/// claim, into the input's slot, which is empty — nothing to build, add, check or free. Returns
/// false, having changed nothing, where that does not apply.
fn unary_fast_path(i: &mut Inner, node_id: NodeId, gid: NodeId, retain: bool) -> Result<bool> {
    let n = &mut i.nodes[node_id];
    let Op::Unary(u) = n.op else {
        return Ok(false);
    };
    if n.spent || n.retain_grad {
        return Ok(false);
    }
    let (x, yb) = (n.inputs[0], n.buf);
    let len = n.shape.iter().product::<usize>() as u64;
    // Marked while the node is at hand, and unmarked below where the step is not done here.
    n.spent = !retain;
    let slot = i
        .nodes
        .get(x)
        .filter(|xn| xn.requires_grad && xn.tape_pos != NO_POS)
        .map(|xn| (xn.tape_pos as usize, xn.buf))
        .filter(|&(p, _)| i.grad_slots.get(p).is_some_and(Option::is_none));
    let done = match slot {
        Some((slot, xb)) if ops::unary::backward_in_place_bufs(i, u, xb, yb, gid)? => {
            i.grad_slots[slot] = Some(gid);
            i.flops.unary(u, 1, len);
            true
        }
        _ => false,
    };
    if !done {
        i.nodes[node_id].spent = false;
    }
    Ok(done)
}

/// `p.grad += g` (or `= g`) on the parameter's own storage.
fn accumulate_into_param(g: &Graph, p: &Parameter, gid: NodeId) -> Result<()> {
    let i = g.inner.borrow();
    // A 16-bit gradient adds in f32 and rounds once per element, as PyTorch's `+=` on `.grad`.
    with_storage!(i.node("backward", gid)?.dtype, T, {
        let src = i.read::<T>("backward", gid)?;
        p.accumulate_with::<T>(src.len(), |acc, fresh| {
            if fresh {
                acc.copy_from_slice(&src);
            } else {
                acc.iter_mut()
                    .zip(src.iter())
                    .for_each(|(a, &b)| *a = T::sum_of(*a, b));
            }
        });
    });
    Ok(())
}

/// `node.grad += g` (or `= g`), PyTorch's accumulation into `.grad`.
fn accumulate_into_node(g: &Graph, node: NodeId, gid: NodeId) -> Result<()> {
    let prev = g.inner.borrow().node("backward", node)?.grad;
    let new = match prev {
        None => gid,
        Some(p) => g.handle(p).add(g.handle(gid))?.id,
    };
    let mut i = g.inner();
    keep(&mut i, new);
    i.nodes[node].grad = Some(new);
    Ok(())
}
