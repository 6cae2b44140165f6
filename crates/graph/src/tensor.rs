//! Tensor handles, leaves, and reading values out.

use std::borrow::Cow;

use crate::Rng;
use arenagrad_exec::DType;

use crate::error::{GraphError, Result};
use crate::graph::{Graph, NodeId, NO_POS};
use crate::host::HostElem;
use crate::host::{HostData, HostTensor};
use crate::ops::Op;
use crate::shape::{checked_numel, copy_of, Shape};
use arenagrad_exec::Storage;

/// A handle to a tensor of the current iteration: `Copy`, two words, and unable to outlive the
/// [`Graph`] borrow it came from — so it cannot outlive the iteration either.
///
/// # Examples
///
/// Tensors are made by the graph ([`Graph::leaf`], [`Graph::from_slice`], [`Graph::randn`], …)
/// and by the ops on them; backward fills the gradients of the leaves that require grad:
///
/// ```
/// use arenagrad_graph::{DType, Graph};
/// let g = Graph::new();
/// // torch: x = torch.tensor([[1., 2.], [3., 4.]], dtype=torch.float64, requires_grad=True)
/// let x = g.leaf(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F64)?;
/// let y = x.matmul(x)?.add(x)?; // x @ x + x
/// assert_eq!(y.shape().as_slice(), &[2, 2]);
/// assert_eq!(y.to_vec::<f64>()?, vec![8.0, 12.0, 18.0, 26.0]);
/// y.sum()?.backward()?;
/// // d/dx Σ(x·x + x) = 1·xᵀ + xᵀ·1 + 1, where 1 is the matrix of ones
/// let dx = x.grad()?.map(|d| d.to_vec::<f64>()).transpose()?;
/// assert_eq!(dx, Some(vec![8.0, 12.0, 10.0, 14.0]));
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
///
/// A handle borrows the graph, so the iteration cannot end while one is still in use:
///
/// ```compile_fail
/// use arenagrad_graph::{DType, Graph};
/// let mut g = Graph::new();
/// let x = g.ones(&[2], DType::F32)?;
/// g.reset(); // error: `g` is still borrowed by `x`
/// x.sum()?;
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Tensor<'g> {
    pub(crate) g: &'g Graph,
    pub(crate) id: NodeId,
}

/// A tensor's id as plain data (to keep in a map, a queue, a program). Resolve it with
/// [`Graph::get`]; after the iteration ends that is a [`GraphError::StaleTensor`] error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorId {
    pub(crate) graph: u64,
    pub(crate) node: NodeId,
}

impl std::fmt::Debug for Tensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.g.inner.borrow();
        match i.nodes.get(self.id) {
            Some(n) => write!(
                f,
                "Tensor({:?}, {}, requires_grad={})",
                n.shape.as_slice(),
                n.dtype,
                n.requires_grad
            ),
            None => f.write_str("Tensor(<stale>)"),
        }
    }
}

impl Graph {
    /// Makes a leaf from a buffer already filled.
    pub(crate) fn leaf_from(
        &self,
        op: &'static str,
        data: HostData,
        shape: &[usize],
    ) -> Result<Tensor<'_>> {
        let expected = checked_numel(op, shape)?;
        if expected != data.len() {
            return Err(GraphError::DataLength {
                op,
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        let mut i = self.inner();
        let buf = match &data {
            HostData::F32(v) => i.arena.alloc_from_slice(v),
            HostData::F64(v) => i.arena.alloc_from_slice(v),
            HostData::BF16(v) => i.arena.alloc_from_slice(v),
            HostData::F16(v) => i.arena.alloc_from_slice(v),
            HostData::I64(v) => i.arena.alloc_from_slice(v),
            HostData::I32(v) => i.arena.alloc_from_slice(v),
            HostData::U8(v) => i.arena.alloc_from_slice(v),
            HostData::Bool(v) => i.arena.alloc_from_slice(v),
        }
        .map_err(|source| GraphError::Alloc { op, source })?;
        let id = i.push(copy_of(shape), data.dtype(), buf, Op::Leaf, &[]);
        let dev = i.device;
        i.settle(op, id, dev)?;
        drop(i);
        Ok(self.handle(id))
    }

    /// A constant tensor copied from a slice of `f32`, `f64`, `bf16` or `f16`.
    pub fn from_slice<T: HostElem>(&self, data: &[T], shape: &[usize]) -> Result<Tensor<'_>> {
        self.slice_leaf("from_slice", data, shape)
    }

    /// [`Graph::from_slice`] under the name of the op that called it.
    fn slice_leaf<T: HostElem>(
        &self,
        op: &'static str,
        data: &[T],
        shape: &[usize],
    ) -> Result<Tensor<'_>> {
        let expected = checked_numel(op, shape)?;
        if expected != data.len() {
            return Err(GraphError::DataLength {
                op,
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        let mut i = self.inner();
        let buf = i
            .arena
            .alloc_from_slice(data)
            .map_err(|source| GraphError::Alloc { op, source })?;
        let id = i.push(copy_of(shape), T::DTYPE, buf, Op::Leaf, &[]);
        let dev = i.device;
        i.settle(op, id, dev)?;
        drop(i);
        Ok(self.handle(id))
    }

    /// A constant tensor from `f64` values, stored as `dtype`.
    pub fn from_f64(&self, data: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor<'_>> {
        match dtype {
            // Straight into the arena: no host copy on the way.
            DType::F64 => self.slice_leaf("from_f64", data, shape),
            _ => with_storage!(dtype, T, {
                let narrowed = owned("from_f64", shape, data, T::narrow)?;
                self.leaf_from("from_f64", T::into_host(narrowed), shape)
            }),
        }
    }

    /// A constant tensor from owned host data.
    pub fn from_host(&self, t: &HostTensor) -> Result<Tensor<'_>> {
        self.leaf_from("from_host", t.data().clone(), t.shape())
    }

    /// A tensor filled with `value`.
    pub fn full(&self, shape: &[usize], value: f64, dtype: DType) -> Result<Tensor<'_>> {
        self.full_on(shape, value, dtype, self.device())
    }

    /// A tensor filled with `value` on `dev`.
    pub fn full_on(
        &self,
        shape: &[usize],
        value: f64,
        dtype: DType,
        dev: crate::Device,
    ) -> Result<Tensor<'_>> {
        let op = "full";
        let n = checked_numel(op, shape)?;
        let mut i = self.inner();
        if let crate::Device::Cuda(_) = dev {
            let buf = i.alloc_on(op, dev, dtype, n)?;
            crate::device::on_cuda!(i, op, dev, [buf], |be, [p]| be.fill(dtype, p, n, value));
            let id = i.push_on(dev, copy_of(shape), dtype, buf, Op::Leaf, &[]);
            drop(i);
            return Ok(self.handle(id));
        }
        let buf = with_storage!(dtype, T, {
            let v = T::narrow(value);
            i.arena.alloc_with::<T>(n, |_| v)
        })
        .map_err(|source| GraphError::Alloc { op, source })?;
        let id = i.push(copy_of(shape), dtype, buf, Op::Leaf, &[]);
        drop(i);
        Ok(self.handle(id))
    }

    /// Zeros.
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor<'_>> {
        self.full(shape, 0.0, dtype)
    }

    /// Ones.
    pub fn ones(&self, shape: &[usize], dtype: DType) -> Result<Tensor<'_>> {
        self.full(shape, 1.0, dtype)
    }

    /// A 0-D tensor.
    pub fn scalar(&self, value: f64, dtype: DType) -> Result<Tensor<'_>> {
        self.full(&[], value, dtype)
    }

    /// Standard normal samples from the graph's seeded generator.
    pub fn randn(&self, shape: &[usize], dtype: DType) -> Result<Tensor<'_>> {
        self.random("randn", shape, dtype, crate::rng::normal_sampler())
    }

    /// `start, start + step, …` up to `end` (excluded): `⌈(end − start) / step⌉` values, as
    /// PyTorch's `arange` (computed in f64, then stored as `dtype`). A zero or non-finite step,
    /// or one pointing away from `end`, is an error.
    pub fn arange(&self, start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor<'_>> {
        let bad = |what| Err(GraphError::BadArgument { op: "arange", what });
        if !(start.is_finite() && end.is_finite() && step.is_finite()) {
            return bad("start, end and step must be finite");
        }
        if step == 0.0 {
            return bad("step must not be zero");
        }
        let n = ((end - start) / step).ceil();
        if n < 0.0 {
            return bad("step points away from end");
        }
        if n > isize::MAX as f64 {
            return Err(GraphError::TooLarge {
                op: "arange",
                shape: vec![usize::MAX],
            });
        }
        self.filled_by("arange", &[n as usize], dtype, |k| start + k as f64 * step)
    }

    /// `[labels.len(), classes]`: row `i` is 1 at `labels[i]` and 0 elsewhere (PyTorch's
    /// `one_hot`). A label not below `classes` is an error naming it.
    pub fn one_hot(&self, labels: &[usize], classes: usize, dtype: DType) -> Result<Tensor<'_>> {
        if let Some(&bad) = labels.iter().find(|&&l| l >= classes) {
            return Err(GraphError::IndexOutOfRange {
                op: "one_hot",
                index: bad,
                axis: 1,
                shape: vec![labels.len(), classes],
            });
        }
        self.filled_by("one_hot", &[labels.len(), classes], dtype, |e| {
            if labels[e / classes] == e % classes {
                1.0
            } else {
                0.0
            }
        })
    }

    /// Uniform samples in `[0, 1)` from the graph's seeded generator.
    pub fn rand(&self, shape: &[usize], dtype: DType) -> Result<Tensor<'_>> {
        self.random("rand", shape, dtype, Rng::uniform)
    }

    /// A leaf of `shape` whose element `k` (row-major) is `f(k)`, written straight into the
    /// arena (no host copy first) and moved to the graph's device.
    pub(crate) fn filled_by(
        &self,
        op: &'static str,
        shape: &[usize],
        dtype: DType,
        mut f: impl FnMut(usize) -> f64,
    ) -> Result<Tensor<'_>> {
        let n = checked_numel(op, shape)?;
        let mut guard = self.inner();
        let i = &mut *guard;
        let buf = with_storage!(dtype, T, {
            i.arena.alloc_with::<T>(n, |k| T::narrow(f(k)))
        })
        .map_err(|source| GraphError::Alloc { op, source })?;
        let id = i.push(copy_of(shape), dtype, buf, Op::Leaf, &[]);
        let dev = i.device;
        i.settle(op, id, dev)?;
        drop(guard);
        Ok(self.handle(id))
    }

    fn random(
        &self,
        op: &'static str,
        shape: &[usize],
        dtype: DType,
        f: impl Fn(&mut Rng) -> f64,
    ) -> Result<Tensor<'_>> {
        // A local copy of the state stays in registers through the loop; written back after
        // (unchanged if the allocation failed, as nothing was drawn).
        let mut rng = self.inner().rng.clone();
        let t = self.filled_by(op, shape, dtype, |_| f(&mut rng));
        self.inner().rng = rng;
        t
    }

    /// A leaf that requires grad, from `f64` values stored as `dtype` (PyTorch's
    /// `torch.tensor(data, requires_grad=True)`).
    #[doc(alias = "var")]
    #[doc(alias = "requires_grad")]
    pub fn leaf(&self, data: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor<'_>> {
        self.from_f64(data, shape, dtype)?.set_requires_grad(true)
    }
}

impl<'g> Tensor<'g> {
    /// The graph this tensor belongs to.
    pub fn graph(&self) -> &'g Graph {
        self.g
    }

    /// The id as plain data.
    pub fn id(&self) -> TensorId {
        TensorId {
            graph: self.g.uid,
            node: self.id,
        }
    }

    pub(crate) fn with_node<R>(
        &self,
        op: &'static str,
        f: impl FnOnce(&crate::graph::Node) -> R,
    ) -> Result<R> {
        let i = self.g.inner.borrow();
        i.node(op, self.id).map(f)
    }

    /// The shape, or a stale-handle error.
    pub fn try_shape(&self) -> Result<Shape> {
        self.with_node("shape", |n| copy_of(&n.shape))
    }

    /// The shape. A handle is valid for as long as it exists (it borrows the graph), so this
    /// cannot fail for handles the API gave out.
    pub fn shape(&self) -> Shape {
        self.try_shape()
            .expect("invariant: a live handle names a live node")
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// The element type, or a stale-handle error naming `op`.
    pub(crate) fn dtype_of(&self, op: &'static str) -> Result<DType> {
        self.with_node(op, |n| n.dtype)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.with_node("dtype", |n| n.dtype)
            .expect("invariant: a live handle names a live node")
    }

    /// Whether gradients flow to this tensor.
    pub fn requires_grad(&self) -> bool {
        self.with_node("requires_grad", |n| n.requires_grad)
            .unwrap_or(false)
    }

    /// Whether this is a leaf (made by the user, not by an op that was recorded).
    pub fn is_leaf(&self) -> bool {
        self.with_node("is_leaf", |n| n.tape_pos == NO_POS || n.inputs.is_empty())
            .unwrap_or(false)
    }

    /// Makes a leaf require (or stop requiring) grad. Errors on non-leaves, like PyTorch.
    pub fn set_requires_grad(self, on: bool) -> Result<Self> {
        let op = "set_requires_grad";
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let n = i
            .nodes
            .get_mut(self.id)
            .ok_or(GraphError::StaleTensor { op })?;
        if !n.inputs.is_empty() {
            return Err(GraphError::NotLeaf { op });
        }
        if on && n.dtype.is_integer() {
            return Err(GraphError::NoGradDType { op, dtype: n.dtype });
        }
        if on && n.tape_pos == NO_POS {
            n.tape_pos = i.tape.len() as u32;
            i.tape.push(self.id);
        }
        n.requires_grad = on;
        Ok(self)
    }

    /// Copies the values out as `T`, which must be the tensor's dtype.
    pub fn to_vec<T: HostElem>(&self) -> Result<Vec<T>> {
        let op = "to_vec";
        let i = self.g.inner.borrow();
        let n = i.node(op, self.id)?;
        copied(op, &n.shape, i.read::<T>(op, self.id)?)
    }

    /// Copies the values out widened to `f64`, whatever the dtype.
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        let op = "to_vec_f64";
        let i = self.g.inner.borrow();
        let n = i.node(op, self.id)?;
        with_storage!(n.dtype, T, {
            owned(op, &n.shape, &i.read::<T>(op, self.id)?, T::widen)
        })
    }

    /// Copies the tensor out of the iteration.
    pub fn to_host(&self) -> Result<HostTensor> {
        let op = "to_host";
        let i = self.g.inner.borrow();
        let n = i.node(op, self.id)?;
        let data = with_storage!(n.dtype, T, {
            T::into_host(copied(op, &n.shape, i.read::<T>(op, self.id)?)?)
        });
        HostTensor::checked(op, data, &n.shape)
    }

    /// The single value of a one-element tensor, as `f64`.
    pub fn item(&self) -> Result<f64> {
        let op = "item";
        let i = self.g.inner.borrow();
        let n = i.node(op, self.id)?;
        if n.shape.iter().product::<usize>() != 1 {
            return Err(GraphError::NotScalar {
                op,
                shape: n.shape.to_vec(),
            });
        }
        with_storage!(n.dtype, T, { Ok(i.read::<T>(op, self.id)?[0].widen()) })
    }

    /// The accumulated gradient of a leaf (or of a node with [`Tensor::retain_grad`]), if any.
    ///
    /// A parameter's leaf ([`Graph::param`]) answers with the parameter's own gradient, as in
    /// PyTorch where the leaf *is* the parameter: accumulated across backward passes and
    /// iterations until [`Parameter::zero_grad`](crate::Parameter::zero_grad), and copied into the arena when asked for. The
    /// one exception is a gradient made with `create_graph`, which stays on the leaf as a
    /// differentiable tensor.
    pub fn grad(&self) -> Result<Option<Tensor<'g>>> {
        let (g, param, dev) = self.with_node("grad", |n| {
            let param = match &n.op {
                Op::Param(p) => Some(p.clone()),
                _ => None,
            };
            (n.grad, param, n.device())
        })?;
        match (g, param) {
            (Some(id), _) => Ok(Some(self.g.handle(id))),
            (None, Some(p)) => match p.grad() {
                Some(h) => {
                    let t = self.g.from_host(&h)?;
                    Ok(Some(if t.device() == dev {
                        t
                    } else {
                        t.to_device(dev)?
                    }))
                }
                None => Ok(None),
            },
            (None, None) => Ok(None),
        }
    }

    /// Clears the accumulated gradient (of a parameter's leaf: the parameter's).
    pub fn zero_grad(&self) -> Result<()> {
        let mut i = self.g.inner();
        let n = i
            .nodes
            .get_mut(self.id)
            .ok_or(GraphError::StaleTensor { op: "zero_grad" })?;
        n.grad = None;
        if let Op::Param(p) = &n.op {
            p.zero_grad();
        }
        Ok(())
    }

    /// Calls `hook` with this tensor's gradient each time a backward pass has computed it (all
    /// contributions summed), before it flows on to the tensor's inputs or into a leaf's
    /// gradient (PyTorch's `Tensor.register_hook`). A hook that returns `Some(g)` replaces the
    /// gradient with `g` (of the same shape, dtype and device, made from this graph's tensors);
    /// `None` leaves it as it is. Hooks run in the order registered and last until the reset.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.leaf(&[1.0, 2.0], &[2], DType::F64)?;
    /// let y = x.mul(x)?; // dy/dx = 2x
    /// y.register_hook(|gy| Ok(Some(gy.scale(10.0)?)))?; // the gradient arriving at y, ×10
    /// y.sum()?.backward()?;
    /// assert_eq!(x.grad()?.unwrap().to_vec::<f64>()?, vec![20.0, 40.0]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn register_hook<F>(&self, hook: F) -> Result<()>
    where
        F: for<'a> Fn(Tensor<'a>) -> Result<Option<Tensor<'a>>> + Send + Sync + 'static,
    {
        let op = "register_hook";
        let mut i = self.g.inner();
        let n = i.node(op, self.id)?;
        if !n.requires_grad {
            return Err(GraphError::BadArgument {
                op,
                what: "cannot register a hook on a tensor that does not require grad",
            });
        }
        i.hooks.push((self.id, std::sync::Arc::new(hook)));
        Ok(())
    }

    /// Keeps this intermediate's gradient after backward (readable with [`Tensor::grad`]).
    /// As in PyTorch, a tensor that does not require grad has no gradient to keep:
    /// it is refused with [`GraphError::BadArgument`].
    ///
    /// # Examples
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.leaf(&[1.0, 2.0], &[2], DType::F64)?;
    /// let h = x.scale(3.0)?; // an intermediate: its gradient is dropped unless kept
    /// h.retain_grad()?; // torch: h.retain_grad()
    /// h.square()?.sum()?.backward()?;
    /// // d Σh² / dh = 2h = [6, 12]
    /// assert_eq!(h.grad()?.map(|d| d.to_vec::<f64>()).transpose()?, Some(vec![6.0, 12.0]));
    /// assert!(g.ones(&[2], DType::F64)?.retain_grad().is_err()); // no grad to keep
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn retain_grad(&self) -> Result<()> {
        let op = "retain_grad";
        let mut i = self.g.inner();
        let n = i
            .nodes
            .get_mut(self.id)
            .ok_or(GraphError::StaleTensor { op })?;
        if !n.requires_grad {
            return Err(GraphError::BadArgument {
                op,
                what: "can't retain_grad on a tensor that does not require grad",
            });
        }
        n.retain_grad = true;
        Ok(())
    }

    /// The same values, cut from the graph: no gradient flows through the result.
    ///
    /// # Examples
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.leaf(&[3.0], &[1], DType::F64)?;
    /// // x · stop_gradient(x): torch's x * x.detach()
    /// let y = x.mul(x.detach()?)?.sum()?;
    /// y.backward()?;
    /// // Only the first factor passes a gradient: 3, not 2x = 6.
    /// assert_eq!(x.grad()?.map(|d| d.item()).transpose()?, Some(3.0));
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn detach(&self) -> Result<Tensor<'g>> {
        let op = "detach";
        let mut i = self.g.inner();
        let n = i.node(op, self.id)?;
        let (shape, dtype, dev, buf) = (copy_of(&n.shape), n.dtype, n.device(), n.buf);
        i.retain_buf(op, dev, buf)?;
        let id = i.push_on(dev, shape, dtype, buf, Op::Leaf, &[]);
        drop(i);
        Ok(self.g.handle(id))
    }
}

/// The values of `src` mapped through `f` into a vector of their own, reserved fallibly
/// ([`crate::host::try_vec`]): a copy the host cannot hold is an error, not an abort.
fn owned<T: Copy, U>(
    op: &'static str,
    shape: &[usize],
    src: &[T],
    f: impl Fn(T) -> U,
) -> Result<Vec<U>> {
    let mut v = crate::host::try_vec(op, shape, src.len())?;
    v.extend(src.iter().map(|&x| f(x)));
    Ok(v)
}

/// The values of `src` as a vector of their own: taken as they are when the read already made
/// one (a device's values copied to the host), else copied by [`owned`].
fn copied<T: Copy>(op: &'static str, shape: &[usize], src: Cow<'_, [T]>) -> Result<Vec<T>> {
    match src {
        Cow::Owned(v) => Ok(v),
        Cow::Borrowed(s) => owned(op, shape, s, |v| v),
    }
}

/// A gradient hook ([`Tensor::register_hook`]).
pub(crate) type GradHook =
    std::sync::Arc<dyn for<'a> Fn(Tensor<'a>) -> Result<Option<Tensor<'a>>> + Send + Sync>;
