//! The graph of one iteration: node storage, the tape, the arena, grad mode.

use std::cell::{RefCell, RefMut};
use std::sync::atomic::{AtomicU64, Ordering};

use arenagrad_alloc::{AllocSplit, Arena, ArenaStats, BufId};
use arenagrad_exec::DType;
use smallvec::SmallVec;

use crate::error::{GraphError, Result};
use crate::ops::Op;
use crate::shape::Shape;
pub use crate::store::NodeId;
use crate::store::NodeStore;
use crate::{Rng, Tensor};

/// Where a tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// What the core of a hot op returns: the new node's id as one integer, or the error boxed.
///
/// Both halves travel in registers (a `Result<Tensor, GraphError>` is returned through memory,
/// and reading it back right after the callee's narrower stores stalls the caller); the op's
/// public method, inlined into its caller, turns it into a [`Tensor`] with [`Graph::finish`].
pub(crate) type RawResult = std::result::Result<u64, Box<GraphError>>;

/// A tensor result as a [`RawResult`] (an op whose raw core hands its work to tensor ops).
pub(crate) fn into_raw(r: Result<crate::Tensor<'_>>) -> RawResult {
    match r {
        Ok(t) => Ok(t.id.to_bits()),
        Err(e) => Err(Box::new(e)),
    }
}

/// Not on the tape.
pub(crate) const NO_POS: u32 = u32::MAX;

pub(crate) struct Node {
    pub shape: Shape,
    pub dtype: DType,
    /// The device, packed (see [`DevCode`]) to keep the node small.
    pub dev: DevCode,
    /// The node's buffer; the node holds one claim on it (views take their own with
    /// `Arena::retain`).
    pub buf: BufId,
    pub requires_grad: bool,
    pub op: Op,
    pub inputs: SmallVec<[NodeId; 2]>,
    /// Position on the tape, or [`NO_POS`].
    pub tape_pos: u32,
    /// A backward pass has consumed this node (and retain_graph was false).
    pub spent: bool,
    /// The accumulated gradient, for leaves and nodes with `retain_grad`.
    pub grad: Option<NodeId>,
    pub retain_grad: bool,
    /// A gradient temporary of a backward pass without `create_graph`: freed once dead.
    pub temp: bool,
    /// How many gradient slots of the running backward pass hold this node.
    pub grad_refs: u32,
    /// The iteration the node was made in (set by [`NodeStore::insert_with`]), or 0 once freed.
    pub epoch: u32,
}

/// A [`Device`] in two bytes: 0 is the host, `k + 1` is CUDA device `k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DevCode(u16);

impl DevCode {
    /// Packs a device. Ordinals past `u16::MAX - 1` are refused before any node is made (see
    /// [`crate::check_device`]).
    #[inline]
    pub fn of(d: Device) -> Self {
        match d {
            Device::Cpu => DevCode(0),
            Device::Cuda(k) => DevCode(u16::try_from(k).unwrap_or(u16::MAX - 1).saturating_add(1)),
        }
    }
    /// Unpacks it.
    #[inline]
    pub fn get(self) -> Device {
        match self.0 {
            0 => Device::Cpu,
            k => Device::Cuda(k as usize - 1),
        }
    }
}

impl Node {
    /// A node with no data yet: [`Inner::push_on`] fills it in where it lies.
    pub(crate) const BLANK: Node = Node {
        shape: Shape::new_const(),
        dtype: DType::F32,
        dev: DevCode(0),
        buf: BufId::NONE,
        requires_grad: false,
        op: Op::Leaf,
        inputs: SmallVec::new_const(),
        tape_pos: NO_POS,
        spent: false,
        grad: None,
        retain_grad: false,
        temp: false,
        grad_refs: 0,
        epoch: 0,
    };

    /// Where the node's buffer lives.
    #[inline]
    pub fn device(&self) -> Device {
        self.dev.get()
    }

    /// Whether the node holds heap memory (see [`NodeStore`]).
    #[inline(always)]
    pub fn holds_heap(&self) -> bool {
        self.op.holds_heap() || self.inputs.spilled() || self.shape.spilled()
    }

    /// Lets go of the node's heap memory, leaving a husk for its slot's next node.
    pub fn release_heap(&mut self) {
        self.op = Op::Leaf;
        self.inputs = SmallVec::new();
        self.shape = Shape::new();
    }
}

pub(crate) struct Inner {
    pub nodes: NodeStore,
    pub tape: Vec<NodeId>,
    pub arena: Arena,
    pub grad_mode: bool,
    /// Nodes created now are backward temporaries.
    pub temp_mode: bool,
    pub temp_log: Vec<NodeId>,
    pub threads: usize,
    pub rng: Rng,
    pub grad_slots: Vec<Option<NodeId>>,
    /// Floating-point work since the reset.
    pub flops: crate::flops::FlopCounter,
    /// Gradient hooks of this iteration's nodes ([`Tensor::register_hook`]), in the order
    /// registered.
    pub hooks: Vec<(NodeId, crate::tensor::GradHook)>,
    /// Hooks told when backward is done with a parameter ([`Graph::register_param_hook`]).
    pub param_hooks: Vec<crate::param::ParamHook>,
    /// The leaves [`Graph::param`] made and the recorded checkpoints whose blocks use
    /// parameters, in the order made (what `param_hooks` watch).
    pub param_leaves: Vec<NodeId>,
    /// How many times the graph has been reset ([`Graph::iteration_id`]).
    pub resets: u64,
    /// A backward pass is running: its rules' ops count as their node's backward, not as
    /// forward work of their own.
    pub in_backward: bool,
    /// Where new leaves are made.
    pub device: Device,
    /// The dtype of the autocast scope in force ([`Graph::autocast`]).
    pub autocast: Option<DType>,
    /// Casts of parameters made under autocast in this iteration, for reuse.
    pub cast_cache: Vec<crate::autocast::CachedCast>,
    /// This graph's memory on each CUDA device it has used.
    #[cfg(feature = "cuda")]
    pub cuda: Vec<crate::device::CudaSide>,
}

impl Inner {
    /// Looks a node up, or says the handle is stale.
    #[inline]
    pub fn node(&self, op: &'static str, id: NodeId) -> Result<&Node> {
        // Not `ok_or`: that builds the error (and drops it) on every successful lookup.
        match self.nodes.get(id) {
            Some(n) => Ok(n),
            None => Err(GraphError::StaleTensor { op }),
        }
    }

    /// Whether an op over `inputs` (ids already looked up) is recorded for backward: grad mode is
    /// on and an input requires grad. A fused op keeps what its backward reads only then.
    #[inline]
    pub fn records(&self, inputs: &[NodeId]) -> bool {
        self.grad_mode && inputs.iter().any(|&x| self.nodes[x].requires_grad)
    }

    /// Reserves room for the `more` nodes `op` is about to make over a tensor of `shape` (a
    /// piece or a step each): [`GraphError::TooLarge`] when one iteration cannot hold them.
    pub fn reserve_nodes(&mut self, op: &'static str, more: usize, shape: &[usize]) -> Result<()> {
        if self.nodes.try_reserve(more) {
            Ok(())
        } else {
            Err(GraphError::TooLarge {
                op,
                shape: shape.to_vec(),
            })
        }
    }

    /// Inserts a node for a freshly computed buffer on the device of its first input (the host
    /// when it has none). Records it on the tape when grad mode is on and an input requires grad;
    /// otherwise it is a constant and its op is forgotten.
    #[inline(always)]
    pub fn push(
        &mut self,
        shape: Shape,
        dtype: DType,
        buf: BufId,
        op: Op,
        inputs: &[NodeId],
    ) -> NodeId {
        let device = inputs
            .first()
            .map_or(Device::Cpu, |i| self.nodes[*i].device());
        self.push_on(device, shape, dtype, buf, op, inputs)
    }

    /// [`Inner::push`] for a buffer on `device`.
    #[inline(always)]
    pub fn push_on(
        &mut self,
        device: Device,
        shape: Shape,
        dtype: DType,
        buf: BufId,
        op: Op,
        inputs: &[NodeId],
    ) -> NodeId {
        let needs_grad = inputs.iter().any(|i| self.nodes[*i].requires_grad);
        if !self.in_backward {
            self.count_forward(&op, &shape, inputs);
        }
        self.push_with(device, shape, dtype, buf, move || op, inputs, needs_grad)
    }

    /// Whether node `id` has gradient hooks.
    #[inline]
    pub fn has_hook(&self, id: NodeId) -> bool {
        !self.hooks.is_empty() && self.hooks.iter().any(|(h, _)| *h == id)
    }

    /// Adds an op's forward work to the counts.
    #[inline]
    fn count_forward(&mut self, op: &Op, out: &[usize], inputs: &[NodeId]) {
        match op {
            Op::Binary(b) => {
                let n = out.iter().product::<usize>() as u64;
                return self.flops.binary(*b, 0, n);
            }
            Op::Leaf | Op::Reshape | Op::Slice { .. } | Op::Concat { .. } | Op::Permute(_) => {
                return;
            }
            _ => {}
        }
        let shapes: SmallVec<[(&[usize], bool); 4]> = inputs
            .iter()
            .map(|&i| (&self.nodes[i].shape[..], false))
            .collect();
        let (f, _) = crate::flops::of(
            op,
            &crate::flops::Shapes {
                out,
                inputs: &shapes,
            },
        );
        self.flops.add(op.name(), f, 0);
    }

    /// Adds the backward work of node `id`, whose rule has just run.
    pub fn count_backward(&mut self, op: &Op, id: NodeId) {
        let n = &self.nodes[id];
        if let Op::Binary(b) = op {
            let len = n.shape.iter().product::<usize>() as u64;
            let needing = n
                .inputs
                .iter()
                .filter(|&&x| self.nodes[x].requires_grad)
                .count();
            return self.flops.binary(*b, 1, len * needing as u64);
        }
        let shapes: SmallVec<[(&[usize], bool); 4]> = n
            .inputs
            .iter()
            .map(|&i| (&self.nodes[i].shape[..], self.nodes[i].requires_grad))
            .collect();
        let (_, b) = crate::flops::of(
            op,
            &crate::flops::Shapes {
                out: &n.shape,
                inputs: &shapes,
            },
        );
        self.flops.add(op.name(), 0, b);
    }

    /// [`Inner::push_on`] for a caller that has just looked its inputs up and knows whether one
    /// requires grad (`needs_grad`), with the op made by `op()` only when it is recorded, right
    /// where the node keeps it (the hot elementwise ops build it there rather than copy it in).
    #[inline(always)]
    // A node's fields as the hot ops hold them; a struct would only be taken apart again.
    #[allow(clippy::too_many_arguments)]
    pub fn push_with(
        &mut self,
        device: Device,
        shape: Shape,
        dtype: DType,
        buf: BufId,
        op: impl FnOnce() -> Op,
        inputs: &[NodeId],
        needs_grad: bool,
    ) -> NodeId {
        // An integer or boolean result never carries a gradient (indices, masks, casts).
        let record = self.grad_mode && needs_grad && dtype.is_float();
        let temp = self.temp_mode;
        let tape_pos = if record {
            self.tape.len() as u32
        } else {
            NO_POS
        };
        // Every field written once, where it lives (the slot is a blank node or one of an
        // earlier iteration), instead of building the node on the stack and copying it in (a
        // copy that reads back, in wide loads, what was just stored in narrow ones).
        let id = self.nodes.insert_with(|n| {
            // Destructured, so that a field added to `Node` must be given its value here.
            let Node {
                shape: n_shape,
                dtype: n_dtype,
                dev,
                buf: n_buf,
                requires_grad,
                op: n_op,
                inputs: n_inputs,
                tape_pos: n_tape_pos,
                spent,
                grad,
                retain_grad,
                temp: n_temp,
                grad_refs,
                epoch: _,
            } = n;
            // The slot holds no heap memory (the reset let go of any: see `NodeStore`), so its
            // old values are written over without being read or dropped. Reading them (to drop
            // them) would wait on a cache line of the last iteration's, in every op.
            debug_assert!(!n_op.holds_heap() && !n_inputs.spilled() && !n_shape.spilled());
            overwrite(n_shape, shape);
            *n_dtype = dtype;
            *dev = DevCode::of(device);
            *n_buf = buf;
            *requires_grad = record;
            overwrite(n_op, if record { op() } else { Op::Leaf });
            let mut ids = SmallVec::new();
            if record {
                // One push at a time: `extend_from_slice` reserves and calls `memcpy`.
                for &x in inputs {
                    ids.push(x);
                }
            }
            overwrite(n_inputs, ids);
            *n_tape_pos = tape_pos;
            *spent = false;
            *grad = None;
            *retain_grad = false;
            *n_temp = temp;
            *grad_refs = 0;
        });
        if record {
            self.tape.push(id);
        }
        if temp {
            self.temp_log.push(id);
        }
        id
    }

    /// Frees a gradient temporary: its id goes stale and its buffer is reused.
    pub fn free_temp(&mut self, id: NodeId) {
        // Every node holds one claim on its buffer (views take their own with `Arena::retain`).
        if let Some((dev, buf)) = self.nodes.remove(id).map(|n| (n.device(), n.buf)) {
            self.release_buf(dev, buf)
                .expect("invariant: a live temporary owns a live buffer");
        }
    }

    /// One host buffer to write and `N` to read, as [`Arena::split_mut`], with an error that
    /// names `op`.
    #[inline(always)]
    pub fn split_mut<T: arenagrad_alloc::Pod, const N: usize>(
        &mut self,
        op: &'static str,
        out: BufId,
        inputs: [BufId; N],
    ) -> Result<(&mut [T], [&[T]; N])> {
        self.arena
            .split_mut(out, inputs)
            .map_err(|source| GraphError::Alloc { op, source })
    }

    /// Two host buffers to write and `N` to read, as [`Arena::split_two_mut`], with an error
    /// that names `op`.
    pub fn split_two_mut<T: arenagrad_alloc::Pod, const N: usize>(
        &mut self,
        op: &'static str,
        outs: [BufId; 2],
        inputs: [BufId; N],
    ) -> Result<arenagrad_alloc::TwoOuts<'_, T, N>> {
        self.arena
            .split_two_mut(outs, inputs)
            .map_err(|source| GraphError::Alloc { op, source })
    }

    /// A new host buffer of `len` elements to write and `N` to read, as [`Arena::alloc_split`],
    /// with an error that names `op`.
    #[inline(always)]
    pub fn alloc_split<T: arenagrad_alloc::Pod, const N: usize>(
        &mut self,
        op: &'static str,
        len: usize,
        inputs: [BufId; N],
    ) -> Result<AllocSplit<'_, T, N>> {
        self.arena
            .alloc_split(len, inputs)
            .map_err(|source| GraphError::Alloc { op, source })
    }

    /// A scratch buffer of `n` elements of `dtype`.
    #[inline]
    pub fn alloc(&mut self, op: &'static str, dtype: DType, n: usize) -> Result<BufId> {
        let r = with_storage!(dtype, T, { self.arena.alloc_scratch::<T>(n) });
        r.map_err(|source| GraphError::Alloc { op, source })
    }

    /// A zeroed buffer of `n` elements of `dtype`.
    pub fn alloc_zeroed(&mut self, op: &'static str, dtype: DType, n: usize) -> Result<BufId> {
        let r = with_storage!(dtype, T, { self.arena.alloc_zeroed::<T>(n) });
        r.map_err(|source| GraphError::Alloc { op, source })
    }
}

/// Writes `value` over `slot` without dropping (or reading) what was there: for a slot known to
/// hold no heap memory. (A forgotten `replace`: the read of the old value is dead, and goes.)
#[inline(always)]
fn overwrite<T>(slot: &mut T, value: T) {
    std::mem::forget(std::mem::replace(slot, value));
}

static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

/// The graph of one training iteration, and the arena its tensors live in.
///
/// Tensors are [`Tensor`] handles that borrow the graph, so [`Graph::reset`] — which frees every
/// node and every buffer of the iteration at once — can only be called when no handle is alive;
/// the compiler checks it. Ids stored as data ([`crate::TensorId`]) are checked at run time and
/// come back as [`GraphError::StaleTensor`] after a reset.
///
/// ```
/// use arenagrad_graph::{DType, Graph};
/// let mut g = Graph::new();
/// for _ in 0..3 {
///     let x = g.randn(&[4, 4], DType::F32)?.set_requires_grad(true)?;
///     let loss = x.matmul(x)?.sum()?;
///     loss.backward()?;
///     let dx = x.grad()?.map(|d| d.shape());
///     assert_eq!(dx.as_deref(), Some(&[4, 4][..]));
///     g.reset(); // the whole iteration is freed here
/// }
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
pub struct Graph {
    pub(crate) inner: RefCell<Inner>,
    pub(crate) uid: u64,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("uid", &self.uid)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for Graph {
    fn default() -> Self {
        Self::new()
    }
}

/// One iteration of one graph ([`Graph::iteration_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IterationId {
    graph: u64,
    resets: u64,
}

/// Counters of a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphStats {
    /// Live nodes in this iteration.
    pub nodes: usize,
    /// Nodes recorded for backward in this iteration.
    pub tape_len: usize,
    /// The arena's counters.
    pub arena: ArenaStats,
    /// Floating-point work since the last reset, per op kind, forward and backward.
    pub flops: crate::flops::FlopStats,
}

/// The default thread count: `ARENAGRAD_NUM_THREADS`, else the CPUs this process may use — std's
/// `available_parallelism`, which reads the process's affinity mask (`taskset`, a container's
/// cpuset) and its cgroup CPU quota — not the machine's core count. More threads than that only
/// take turns on the same cores.
pub fn default_threads() -> usize {
    std::env::var("ARENAGRAD_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs an optimiser's update, `f(start, chunk)`, over a parameter's values outside any graph:
/// a large parameter is split into contiguous chunks across [`default_threads`] (read once: it
/// looks at the CPU quota, too slow to ask at every step), a small one (under 2¹⁷ values) runs on
/// the calling thread. `start` is the chunk's offset in `values`, for the matching slice of the
/// gradient. The split never changes the arithmetic, so the result does not depend on the
/// thread count.
///
/// # Examples
///
/// ```
/// let mut w = vec![1.0f32; 300_000];
/// let g = vec![0.5f32; 300_000];
/// arenagrad_graph::update_in_chunks(&mut w, |at, w| {
///     let g = &g[at..at + w.len()];
///     for (w, g) in w.iter_mut().zip(g) {
///         *w -= 0.1 * g;
///     }
/// });
/// assert!(w.iter().all(|&v| v == 1.0 - 0.1 * 0.5));
/// ```
pub fn update_in_chunks<T: Send>(values: &mut [T], f: impl Fn(usize, &mut [T]) + Sync) {
    use arenagrad_exec::cpu::par;
    par::par_chunks_mut(values, update_threads(), par::PAR_MIN_ELEMS, f);
}

/// [`default_threads`], read once for the optimisers' updates.
fn update_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(default_threads)
}

/// Runs `f(i, &mut parts[i])` for every part of an update outside any graph (an optimiser's
/// chunks of values with their gradients and state), the parts claimed one at a time by up to
/// [`default_threads`] threads, the calling thread among them: a thread slowed by other work on
/// its core takes fewer. What `f` computes for a part must not depend on the thread that runs it.
///
/// # Examples
///
/// ```
/// let mut w = vec![1.0f32; 100_000];
/// let mut m = vec![0.0f32; 100_000];
/// let parts: Vec<_> = w.chunks_mut(25_000).zip(m.chunks_mut(25_000)).collect();
/// arenagrad_graph::update_parts(parts, |_, (w, m)| {
///     for (w, m) in w.iter_mut().zip(m.iter_mut()) {
///         *m = 0.5 * *w;
///         *w -= *m;
///     }
/// });
/// assert!(w.iter().all(|&v| v == 0.5) && m.iter().all(|&v| v == 0.5));
/// ```
pub fn update_parts<P: Send>(parts: Vec<P>, f: impl Fn(usize, &mut P) + Sync) {
    arenagrad_exec::cpu::par::claim_each(parts, update_threads(), f);
}

impl Graph {
    /// An empty graph with the default thread count ([`default_threads`]) and RNG seed 0.
    ///
    /// # Examples
    ///
    /// One graph serves every iteration of a training loop: [`Graph::reset`] frees what an
    /// iteration made, and the next starts from an empty graph (PyTorch has no such object:
    /// its graph hangs off the tensors and is freed as they are dropped).
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let mut g = Graph::new();
    /// let x = g.randn(&[2, 3], DType::F32)?;
    /// x.exp()?.sum()?;
    /// assert_eq!(g.stats().nodes, 3);
    /// g.reset();
    /// assert_eq!(g.stats().nodes, 0);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn new() -> Self {
        Self::with_threads(default_threads())
    }

    /// An empty graph whose large kernels use up to `threads` threads.
    pub fn with_threads(threads: usize) -> Self {
        Graph {
            inner: RefCell::new(Inner {
                nodes: NodeStore::new(),
                tape: Vec::new(),
                arena: Arena::new(),
                grad_mode: true,
                temp_mode: false,
                temp_log: Vec::new(),
                threads: threads.max(1),
                rng: Rng::seed(0),
                grad_slots: Vec::new(),
                flops: Default::default(),
                hooks: Vec::new(),
                param_hooks: Vec::new(),
                param_leaves: Vec::new(),
                resets: 0,
                in_backward: false,
                autocast: None,
                cast_cache: Vec::new(),
                device: Device::Cpu,
                #[cfg(feature = "cuda")]
                cuda: Vec::new(),
            }),
            uid: NEXT_GRAPH.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub(crate) fn inner(&self) -> RefMut<'_, Inner> {
        self.inner.borrow_mut()
    }

    /// Sets the number of threads large kernels may use.
    pub fn set_threads(&self, threads: usize) {
        self.inner().threads = threads.max(1);
    }

    /// The number of threads large kernels may use.
    pub fn threads(&self) -> usize {
        self.inner.borrow().threads
    }

    /// Reseeds the graph's random number generator (used by `randn`, `rand`, dropout).
    ///
    /// # Examples
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// g.seed(7); // torch.manual_seed(7)
    /// let a = g.randn(&[4], DType::F64)?.to_vec::<f64>()?;
    /// let b = g.randn(&[4], DType::F64)?.to_vec::<f64>()?;
    /// assert_ne!(a, b); // the stream goes on
    /// g.seed(7);
    /// assert_eq!(g.randn(&[4], DType::F64)?.to_vec::<f64>()?, a); // and starts again
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn seed(&self, seed: u64) {
        self.inner().rng = Rng::seed(seed);
    }

    /// Ends the iteration: frees every node and every buffer at once. Handles cannot be alive
    /// (they borrow the graph); stored [`crate::TensorId`]s go stale.
    ///
    /// # Examples
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph, GraphError};
    /// let mut g = Graph::new();
    /// let id = g.ones(&[3], DType::F32)?.id(); // an id kept as plain data
    /// assert_eq!(g.get(id)?.to_vec::<f32>()?, vec![1.0; 3]);
    /// g.reset();
    /// // The id's iteration has ended: a typed error, never someone else's data.
    /// assert!(matches!(g.get(id), Err(GraphError::StaleTensor { .. })));
    /// assert_eq!(g.stats().nodes, 0);
    /// # Ok::<(), GraphError>(())
    /// ```
    pub fn reset(&mut self) {
        let inner = self.inner.get_mut();
        inner.nodes.clear();
        inner.tape.clear();
        inner.temp_log.clear();
        inner.grad_slots.clear();
        inner.arena.reset();
        inner.reset_devices();
        inner.grad_mode = true;
        inner.temp_mode = false;
        inner.flops.clear();
        inner.hooks.clear();
        inner.param_hooks.clear();
        inner.param_leaves.clear();
        inner.cast_cache.clear();
        inner.resets += 1;
    }

    /// Names the current iteration: equal ids mean the same graph with no reset in between.
    /// What something that registers per-iteration state (a hook) checks to do it once.
    pub fn iteration_id(&self) -> IterationId {
        IterationId {
            graph: self.uid,
            resets: self.inner.borrow().resets,
        }
    }

    /// Runs one iteration: `f` builds and differentiates a graph, its result is returned, and the
    /// graph is reset afterwards whatever `f` did (or did not do).
    pub fn iteration<R>(&mut self, f: impl FnOnce(&Graph) -> R) -> R {
        let r = f(self);
        self.reset();
        r
    }

    /// Counters: nodes, tape length, arena memory.
    pub fn stats(&self) -> GraphStats {
        let i = self.inner.borrow();
        GraphStats {
            nodes: i.nodes.len(),
            tape_len: i.tape.len(),
            arena: i.arena.stats(),
            flops: i.flops.stats(),
        }
    }

    /// Restarts the arena's peak counters.
    pub fn reset_peak_stats(&self) {
        self.inner().arena.reset_peak();
    }

    /// Whether ops record for backward right now.
    pub fn is_grad_enabled(&self) -> bool {
        self.inner.borrow().grad_mode
    }

    /// Turns recording off until the guard drops: nothing created meanwhile needs grad (PyTorch's
    /// `torch.no_grad()`), so evaluation and in-loop metrics record no nodes.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let w = g.leaf(&[1.0, 2.0], &[2], DType::F64)?;
    /// {
    ///     let _guard = g.no_grad();
    ///     assert!(!w.scale(2.0)?.requires_grad());
    /// }
    /// assert!(w.scale(2.0)?.requires_grad());
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn no_grad(&self) -> GradModeGuard<'_> {
        self.set_grad_mode(false)
    }

    /// Turns recording on until the guard drops (inside a `no_grad` region).
    pub fn enable_grad(&self) -> GradModeGuard<'_> {
        self.set_grad_mode(true)
    }

    fn set_grad_mode(&self, on: bool) -> GradModeGuard<'_> {
        let mut i = self.inner();
        let prev = i.grad_mode;
        i.grad_mode = on;
        GradModeGuard { g: self, prev }
    }

    /// The one check that a tensor handed to an op of this graph belongs to it: its id, or
    /// [`GraphError::GraphMismatch`]. Every entry point that takes a [`Tensor`] besides its
    /// receiver resolves it through here (directly, through [`Graph::owns_all`], or through
    /// `ops::check_pair`); `tests/graph_mismatch.rs` calls each such method with a tensor of
    /// another graph, and fails when a public method taking a tensor is missing from its list.
    #[inline(always)]
    pub(crate) fn owns(&self, op: &'static str, t: &Tensor<'_>) -> Result<NodeId> {
        if std::ptr::eq(self, t.g) {
            Ok(t.id)
        } else {
            Err(GraphError::GraphMismatch { op })
        }
    }

    /// [`Graph::owns`] for a list of tensors.
    pub(crate) fn owns_all(
        &self,
        op: &'static str,
        ts: &[Tensor<'_>],
    ) -> Result<SmallVec<[NodeId; 2]>> {
        ts.iter().map(|t| self.owns(op, t)).collect()
    }

    pub(crate) fn handle(&self, id: NodeId) -> Tensor<'_> {
        Tensor { g: self, id }
    }

    /// The handle for what an op's core returned (see [`RawResult`]).
    #[inline(always)]
    pub(crate) fn finish(&self, r: RawResult) -> Result<Tensor<'_>> {
        match r {
            Ok(k) => Ok(self.handle(NodeId::from_bits(k))),
            Err(e) => Err(*e),
        }
    }

    /// Resolves an id stored as data back into a handle, checking that it belongs to this graph
    /// and to the current iteration.
    pub fn get(&self, id: crate::TensorId) -> Result<Tensor<'_>> {
        if id.graph != self.uid || !self.inner.borrow().nodes.contains_key(id.node) {
            return Err(GraphError::StaleTensor { op: "Graph::get" });
        }
        Ok(self.handle(id.node))
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // Device blocks go back to their device's cache (host memory goes with the arena).
        self.inner.get_mut().reset_devices();
    }
}

/// Restores the previous grad mode when dropped.
#[must_use = "grad mode is restored when the guard drops"]
pub struct GradModeGuard<'g> {
    g: &'g Graph,
    prev: bool,
}

impl Drop for GradModeGuard<'_> {
    fn drop(&mut self) {
        self.g.inner().grad_mode = self.prev;
    }
}

#[cfg(test)]
mod size_tests {
    #[test]
    fn node_stays_small() {
        let n = std::mem::size_of::<super::Node>();
        let op = std::mem::size_of::<crate::ops::Op>();
        assert!(op <= 32, "Op is {op} bytes");
        // Two cache lines and the store's epoch word (the layout rounds it to 136).
        assert!(n <= 136, "Node is {n} bytes");
    }
}
