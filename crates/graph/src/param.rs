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
}

/// A trainable value that lives outside the iteration arena.
///
/// Cloning a `Parameter` clones the handle (both name the same storage), which is how a module,
/// an optimiser and a checkpoint writer all see one value. Each iteration brings it into the graph
/// with [`Graph::param`]; backward accumulates its gradient here, across backward calls and
/// iterations, until [`Parameter::zero_grad`] — PyTorch's semantics.
#[derive(Debug, Clone)]
pub struct Parameter(Arc<Mutex<ParamInner>>);

impl Parameter {
    /// A parameter with a name and an initial value.
    pub fn new(name: impl Into<String>, value: HostTensor) -> Self {
        Parameter(Arc::new(Mutex::new(ParamInner {
            name: name.into(),
            value: Arc::new(value),
            grad: None,
            spare: None,
        })))
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
        if v.shape() != p.value.shape() {
            return Err(GraphError::ShapeMismatch {
                op: "Parameter::set_value",
                lhs: p.value.shape().to_vec(),
                rhs: v.shape().to_vec(),
            });
        }
        if v.dtype() != p.value.dtype() {
            return Err(GraphError::DTypeMismatch {
                op: "Parameter::set_value",
                lhs: p.value.dtype(),
                rhs: v.dtype(),
            });
        }
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
    pub(crate) fn accumulate_with<T: crate::Elem>(
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
            _ => T::into_host(vec![T::ZERO; len]),
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
    pub fn param(&self, p: &Parameter) -> Result<Tensor<'_>> {
        let op = "param";
        let guard = p.lock();
        let mut i = self.inner();
        let value = Arc::clone(&guard.value);
        let buf = match guard.value.data() {
            HostData::F32(_) => i.arena.alloc_shared(value, f32_elems),
            HostData::F64(_) => i.arena.alloc_shared(value, f64_elems),
        }
        .map_err(|source| GraphError::Alloc { op, source })?;
        let shape = copy_of(guard.value.shape());
        let dtype = guard.value.dtype();
        drop(guard);
        let id = i.push(shape, dtype, buf, Op::Leaf, &[]);
        let dev = i.device;
        i.settle(op, id, dev)?;
        let pos = i.tape.len() as u32;
        i.tape.push(id);
        let n = &mut i.nodes[id];
        n.requires_grad = true;
        n.tape_pos = pos;
        i.nodes.set_op(id, Op::Param(p.clone()));
        drop(i);
        Ok(self.handle(id))
    }
}

/// The `f32` elements of a host tensor (none if it holds `f64`).
fn f32_elems(t: &HostTensor) -> &[f32] {
    t.as_slice::<f32>().unwrap_or(&[])
}

/// The `f64` elements of a host tensor (none if it holds `f32`).
fn f64_elems(t: &HostTensor) -> &[f64] {
    t.as_slice::<f64>().unwrap_or(&[])
}
