//! Parameters: values that persist across iterations and collect gradients.

use std::sync::{Arc, Mutex, MutexGuard};

use arenagrad_exec::DType;

use crate::error::{GraphError, Result};
use crate::host::{HostData, HostDataMut, HostTensor};
use crate::ops::Op;
use crate::shape::copy_of;
use crate::{Graph, Tensor};

#[derive(Debug)]
struct ParamInner {
    name: String,
    /// Shared with the arenas of the iterations that read it in place (see [`Graph::param`]);
    /// an update after their reset writes it in place, one before copies it first.
    value: Arc<HostTensor>,
    grad: Option<HostData>,
    /// The buffer of a cleared gradient, kept so the next backward writes into it instead of
    /// allocating (and faulting in) a fresh one every step.
    spare: Option<HostData>,
    /// Frozen ([`Parameter::set_requires_grad`] false): brought into an iteration as a constant.
    frozen: bool,
}

/// A trainable value that lives outside the iteration arena.
///
/// Cloning a `Parameter` clones the handle (both name the same storage), which is how a module,
/// an optimiser and a checkpoint writer all see one value. Each iteration brings it into the graph
/// with [`Graph::param`]; backward accumulates its gradient here, across backward calls and
/// iterations, until [`Parameter::zero_grad`] — PyTorch's semantics.
///
/// # Examples
///
/// ```
/// use arenagrad_graph::{DType, Graph, HostTensor, Parameter};
/// // torch: w = torch.nn.Parameter(torch.tensor([1., -2.], dtype=torch.float64))
/// let w = Parameter::new("w", HostTensor::from_f64(&[1.0, -2.0], &[2], DType::F64)?);
/// let alias = w.clone(); // the same storage, as a module and its optimiser both hold it
/// let mut g = Graph::new();
/// for _ in 0..2 {
///     let x = g.param(&w)?;
///     x.mul(x)?.sum()?.backward()?; // adds 2w to w's gradient
///     g.reset(); // the iteration ends; the parameter and its gradient stay
/// }
/// // No zero_grad between the iterations: the two gradients added up, as in PyTorch.
/// assert_eq!(alias.grad().map(|d| d.to_f64_vec()), Some(vec![4.0, -8.0]));
/// w.zero_grad();
/// assert!(alias.grad().is_none());
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Parameter(Arc<Mutex<ParamInner>>);

impl ParamInner {
    /// Refuses a tensor of another shape or dtype than the value's, naming `op`.
    fn check_like(&self, op: &'static str, t: &HostTensor) -> Result<()> {
        if t.shape() != self.value.shape() {
            return Err(GraphError::ShapeMismatch {
                op,
                lhs: self.value.shape().to_vec(),
                rhs: t.shape().to_vec(),
            });
        }
        if t.dtype() != self.value.dtype() {
            return Err(GraphError::DTypeMismatch {
                op,
                lhs: self.value.dtype(),
                rhs: t.dtype(),
            });
        }
        Ok(())
    }
}

impl Parameter {
    /// A parameter with a name and an initial value.
    pub fn new(name: impl Into<String>, value: HostTensor) -> Self {
        Parameter(Arc::new(Mutex::new(ParamInner {
            name: name.into(),
            value: Arc::new(value),
            grad: None,
            spare: None,
            frozen: false,
        })))
    }

    /// Whether gradients flow into this parameter (true unless frozen). PyTorch's
    /// `requires_grad`.
    pub fn requires_grad(&self) -> bool {
        !self.lock().frozen
    }

    /// Freezes the parameter (`false`) or thaws it (`true`), PyTorch's `requires_grad_`. A
    /// frozen parameter comes into an iteration ([`Graph::param`]) as a constant: backward
    /// computes no gradient for it and nothing flows past it, it keeps no gradient buffer (its
    /// gradient and the spare buffer are dropped here), and optimisers skip it.
    pub fn set_requires_grad(&self, requires_grad: bool) {
        let mut p = self.lock();
        p.frozen = !requires_grad;
        if p.frozen {
            p.grad = None;
            p.spare = None;
        }
    }

    fn lock(&self) -> MutexGuard<'_, ParamInner> {
        // A panic while holding the lock cannot leave the data half-written in a way that matters
        // more than the panic itself; keep going with what is there.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether two handles name the same storage.
    pub fn same(&self, other: &Parameter) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The name.
    pub fn name(&self) -> String {
        self.lock().name.clone()
    }

    /// Renames (modules prefix their children's names).
    pub fn set_name(&self, name: impl Into<String>) {
        self.lock().name = name.into();
    }

    /// The shape.
    pub fn shape(&self) -> Vec<usize> {
        self.lock().value.shape().to_vec()
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.lock().value.dtype()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.lock().value.numel()
    }

    /// A copy of the value.
    pub fn value(&self) -> HostTensor {
        HostTensor::clone(&self.lock().value)
    }

    /// Replaces the value; the shape and dtype must stay the same.
    pub fn set_value(&self, v: HostTensor) -> Result<()> {
        let mut p = self.lock();
        p.check_like("Parameter::set_value", &v)?;
        p.value = Arc::new(v);
        Ok(())
    }

    /// A copy of the accumulated gradient, if any backward reached this parameter.
    pub fn grad(&self) -> Option<HostTensor> {
        let p = self.lock();
        p.grad.as_ref().map(|g| {
            HostTensor::checked("Parameter::grad", g.clone(), p.value.shape())
                .expect("invariant: a gradient has its parameter's number of elements")
        })
    }

    /// Replaces the accumulated gradient (`None` forgets it); a gradient must have the value's
    /// shape and dtype. What a gradient all-reduce writes back.
    pub fn set_grad(&self, grad: Option<HostTensor>) -> Result<()> {
        let Some(g) = grad else {
            self.zero_grad();
            return Ok(());
        };
        let mut p = self.lock();
        p.check_like("Parameter::set_grad", &g)?;
        p.grad = Some(g.into_data());
        Ok(())
    }

    /// Forgets the accumulated gradient.
    pub fn zero_grad(&self) {
        let mut p = self.lock();
        if let Some(g) = p.grad.take() {
            p.spare = Some(g);
        }
    }

    /// Gives `f` the value's elements (mutably) and the gradient together — what an optimiser
    /// step needs, without copying either. The elements come as slices, so the value keeps its
    /// shape and dtype whatever `f` does. The value is written in place unless a graph that has
    /// not been reset still reads it: then that graph keeps the old value and the parameter a
    /// new copy.
    ///
    /// The optimisers of `arenagrad-nn` call this for each of their parameters (and keep their
    /// state in checkpoints); call it directly for an update rule of your own:
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph, HostDataMut, HostTensor, Parameter};
    /// let p = Parameter::new("w", HostTensor::from_f64(&[1.0, -2.0], &[2], DType::F64)?);
    /// let mut g = Graph::new();
    /// let w = g.param(&p)?;
    /// w.mul(w)?.sum()?.backward()?; // the gradient 2w accumulates into p
    /// g.reset();
    /// p.update(|value, grad| {
    ///     if let (HostDataMut::F64(v), Some(grad)) = (value, grad) {
    ///         for (v, d) in v.iter_mut().zip(grad.as_slice::<f64>().unwrap()) {
    ///             *v -= 0.1 * d; // plain SGD
    ///         }
    ///     }
    /// });
    /// p.zero_grad();
    /// assert_eq!(p.value().as_slice::<f64>().unwrap(), &[0.8, -1.6]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn update<R>(&self, f: impl FnOnce(HostDataMut<'_>, Option<&HostData>) -> R) -> R {
        let mut p = self.lock();
        let p = &mut *p;
        f(Arc::make_mut(&mut p.value).data_mut(), p.grad.as_ref())
    }

    /// Gives `f` the gradient's elements mutably (for clipping).
    pub fn update_grad<R>(&self, f: impl FnOnce(Option<HostDataMut<'_>>) -> R) -> R {
        f(self.lock().grad.as_mut().map(HostDataMut::of))
    }

    /// Adds into the gradient through `f(acc, fresh)`, where `acc` is the gradient's storage of
    /// `len` elements: `fresh` says it holds no gradient yet (old values that `f` must write
    /// over, as a GEMM without accumulation does). A gradient of another dtype or size is
    /// replaced. Backward adds every parameter gradient through it.
    pub(crate) fn accumulate_with<T: crate::HostElem>(
        &self,
        len: usize,
        f: impl FnOnce(&mut [T], bool),
    ) {
        let mut p = self.lock();
        let p = &mut *p;
        if let Some(acc) = p.grad.as_mut().and_then(HostData::as_mut_slice::<T>) {
            if acc.len() == len {
                f(acc, false);
                return;
            }
        }
        let mut buf = match p.spare.take() {
            Some(d) if d.as_slice::<T>().is_some_and(|s| s.len() == len) => d,
            // Backward has this many elements of gradient in its arena already; a failure to
            // reserve its host copy is as fatal as any other allocation failure of Vec.
            _ => T::into_host(vec![T::default(); len]),
        };
        if let Some(acc) = buf.as_mut_slice::<T>() {
            f(acc, true);
        }
        p.grad = Some(buf);
    }
}

impl Graph {
    /// Brings a parameter into this iteration as a leaf that requires grad. Its value is read in
    /// place, not copied: the arena holds it until [`Graph::reset`], and an optimiser step after
    /// the reset updates it in place (see [`Parameter::update`]). After backward its gradient is
    /// added to the parameter's own.
    ///
    /// A frozen parameter ([`Parameter::set_requires_grad`] false) comes in as a constant leaf,
    /// read in place as well: no gradient is computed for it.
    pub fn param(&self, p: &Parameter) -> Result<Tensor<'_>> {
        let op = "param";
        let guard = p.lock();
        let frozen = guard.frozen;
        let mut i = self.inner();
        let value = Arc::clone(&guard.value);
        let buf = with_storage!(guard.value.dtype(), T, {
            i.arena.alloc_shared(value, elems::<T>)
        })
        .map_err(|source| GraphError::Alloc { op, source })?;
        let shape = copy_of(guard.value.shape());
        let dtype = guard.value.dtype();
        drop(guard);
        let id = i.push(shape, dtype, buf, Op::Leaf, &[]);
        let dev = i.device;
        i.settle(op, id, dev)?;
        if frozen {
            drop(i);
            return Ok(self.handle(id));
        }
        let pos = i.tape.len() as u32;
        i.tape.push(id);
        let n = &mut i.nodes[id];
        n.requires_grad = true;
        n.tape_pos = pos;
        i.nodes.set_op(id, Op::Param(p.clone()));
        i.param_leaves.push(id);
        drop(i);
        Ok(self.handle(id))
    }
}

/// A hook told when backward is done with a parameter ([`Graph::register_param_hook`]).
pub(crate) type ParamHook = Arc<dyn Fn(&Parameter) + Send + Sync>;

impl Graph {
    /// Calls `hook` with each parameter of this iteration once a backward pass is done adding
    /// into its gradient — PyTorch's `register_post_accumulate_grad_hook`, for every parameter
    /// the iteration brought in with [`Graph::param`]. Backward walks the tape down from its
    /// root; a parameter is done when the walk has passed the first leaf the iteration made of
    /// it, so every contribution (of each of its leaves, by any path) is in
    /// [`Parameter::grad`]. Each backward pass tells each parameter of its part of the tape
    /// once, in the order their gradients became final (the last layer's first), whether or not
    /// a gradient reached it; [`grad`](crate::grad), which accumulates nothing, tells none. A
    /// parameter used inside a [checkpointed](Graph::checkpoint) block is told once backward
    /// has passed the lowest checkpoint using it (its second run done), or its own lowest leaf.
    /// Hooks last until the reset. A data-parallel wrapper starts each gradient all-reduce
    /// from here, while backward goes on with the layers below.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arenagrad_graph::{DType, Graph, HostTensor, Parameter};
    /// let w1 = Parameter::new("w1", HostTensor::from_f64(&[2.0], &[1], DType::F64)?);
    /// let w2 = Parameter::new("w2", HostTensor::from_f64(&[3.0], &[1], DType::F64)?);
    /// let g = Graph::new();
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = Arc::clone(&seen);
    /// g.register_param_hook(move |p| {
    ///     let grad = p.grad().map(|t| t.as_slice::<f64>().unwrap()[0]);
    ///     log.lock().unwrap().push((p.name(), grad));
    /// });
    /// let x = g.leaf(&[5.0], &[1], DType::F64)?;
    /// let y = x.mul(g.param(&w1)?)?.mul(g.param(&w2)?)?; // x·w1·w2
    /// y.sum()?.backward()?;
    /// // w2 came last in the forward, so its gradient is final first.
    /// assert_eq!(*seen.lock().unwrap(), [("w2".into(), Some(10.0)), ("w1".into(), Some(15.0))]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn register_param_hook<F>(&self, hook: F)
    where
        F: Fn(&Parameter) + Send + Sync + 'static,
    {
        self.inner().param_hooks.push(Arc::new(hook));
    }
}

/// The parameters whose gradients a backward pass from tape position `root_pos` finalises, for
/// its param hooks: each parameter once, at the tape position of its first leaf or of the
/// first checkpoint whose block uses it (a block's own leaves are made again by backward, past
/// the root, and the walk is done with them when it passes the checkpoint), highest position
/// first (the order the walk passes them). Empty when no hook listens.
pub(crate) fn params_to_tell(i: &crate::graph::Inner, root_pos: usize) -> Vec<(usize, Parameter)> {
    if i.param_hooks.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<(usize, Parameter)> = Vec::new();
    // `param_leaves` lists parameters' leaves and the checkpoints that use parameters.
    for &id in &i.param_leaves {
        let Some(n) = i.nodes.get(id) else { continue };
        let pos = n.tape_pos;
        if pos == crate::graph::NO_POS || pos as usize > root_pos {
            continue;
        }
        let params: &[Parameter] = match &n.op {
            Op::Param(p) => std::slice::from_ref(p),
            Op::Checkpoint(ck) => &ck.params,
            _ => continue,
        };
        // Listed in creation order: a parameter's first entry is its lowest.
        for p in params {
            if !out.iter().any(|(_, q)| q.same(p)) {
                out.push((pos as usize, p.clone()));
            }
        }
    }
    out.reverse();
    out
}

/// Tells the param hooks of every parameter in `pending` (highest position first) whose tape
/// position is at or above `above`, removing them from `pending`.
pub(crate) fn tell_params(g: &Graph, pending: &mut Vec<(usize, Parameter)>, above: usize) {
    if pending.is_empty() {
        return;
    }
    let hooks: Vec<ParamHook> = g.inner.borrow().param_hooks.clone();
    let k = pending.iter().take_while(|(pos, _)| *pos >= above).count();
    for (_, p) in pending.drain(..k) {
        for h in &hooks {
            h(&p);
        }
    }
}

/// The `f32` elements of a host tensor (none if it holds `f64`).
fn elems<T: crate::HostElem>(t: &HostTensor) -> &[T] {
    t.as_slice::<T>().unwrap_or(&[])
}

/// Where a parameter's value went last in an iteration ([`Graph::param_outputs`]).
#[derive(Debug, Clone)]
pub struct ParamOutput {
    /// The parameter.
    pub param: Parameter,
    /// The shape of the last recorded node that computed with it (past views of it).
    pub shape: Vec<usize>,
    /// That node's place on the tape (later nodes have larger places).
    pub at: usize,
}

impl Graph {
    /// For each parameter this iteration read ([`Graph::param`], not frozen), the last recorded
    /// node that computed with its value — through views of it (reshapes, permutations,
    /// broadcasts, slices, concatenations, casts, device copies), which are followed rather than
    /// counted, and on to a reshape to more axes made right after it of its result (a product
    /// reshaped back to the layer's shape) — in the order the parameters were first read. A linear layer's weight ends in
    /// its product's output, a norm's weight in the norm's: what a module summary reports as a
    /// layer's output shape. Nodes made under [`Graph::no_grad`] are not recorded, so neither
    /// are their uses.
    pub fn param_outputs(&self) -> Vec<ParamOutput> {
        let i = self.inner();
        // For each node reached so far: the parameters (indices into `out`) it is a view of.
        let mut views: std::collections::HashMap<crate::store::NodeId, Vec<usize>> =
            std::collections::HashMap::new();
        let mut out: Vec<ParamOutput> = Vec::new();
        // For each node that computed with parameters (or is a view of one that did): which.
        let mut results: std::collections::HashMap<crate::store::NodeId, Vec<usize>> =
            std::collections::HashMap::new();
        for (pos, &id) in i.tape.iter().enumerate() {
            let Ok(n) = i.node("param_outputs", id) else {
                continue;
            };
            if let Op::Param(p) = &n.op {
                let k = match out.iter().position(|o| o.param.same(p)) {
                    Some(k) => k,
                    None => {
                        out.push(ParamOutput {
                            param: p.clone(),
                            shape: n.shape.to_vec(),
                            at: pos,
                        });
                        out.len() - 1
                    }
                };
                views.insert(id, vec![k]);
                continue;
            }
            let is_view = matches!(
                n.op,
                Op::Reshape
                    | Op::Permute(_)
                    | Op::BroadcastTo
                    | Op::Slice { .. }
                    | Op::Concat { .. }
                    | Op::Cast { .. }
                    | Op::ToDevice { .. }
            );
            // A reshape to more axes made right after such a node, of its result, is still
            // that result (the product of a linear layer reshaped back to `[b, l, out]`, a
            // convolution's `[n, c, h·w]` to its image); a flattening is the next layer's.
            if matches!(n.op, Op::Reshape) && n.inputs.len() == 1 && pos > 0 {
                let src = n.inputs[0];
                let grows = i
                    .node("param_outputs", src)
                    .is_ok_and(|s| s.shape.len() < n.shape.len());
                if grows && i.tape[pos - 1] == src {
                    if let Some(ks) = results.get(&src) {
                        for &k in ks {
                            if out[k].at == pos - 1 {
                                out[k].shape = n.shape.to_vec();
                                out[k].at = pos;
                            }
                        }
                        continue;
                    }
                }
            }
            let read: Vec<usize> = n
                .inputs
                .iter()
                .filter_map(|x| views.get(x))
                .flatten()
                .copied()
                .collect();
            if read.is_empty() {
                continue;
            }
            if is_view && n.inputs.iter().all(|x| views.contains_key(x)) {
                views.insert(id, read);
            } else {
                for &k in &read {
                    out[k].shape = n.shape.to_vec();
                    out[k].at = pos;
                }
                results.insert(id, read);
            }
        }
        out
    }
}
