//! [`DataParallel`]: a module trained on several ranks, its gradients averaged in buckets that
//! start all-reducing while backward is still running.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arenagrad_graph::{DType, Graph, HostData, HostDataMut, IterationId, Parameter, Tensor};
use arenagrad_nn::optim::Optimizer;
use arenagrad_nn::Module;
use arenagrad_nn::{Slot, Visitor};

use crate::comm::{Communicator, Pending, Reduce};
use crate::error::{DistError, Result};

/// Options of [`DataParallel`].
#[derive(Debug, Clone, Copy)]
pub struct DdpConfig {
    /// The size a gradient bucket fills up to before it is all-reduced on its own (PyTorch's
    /// `bucket_cap_mb`, 25 MiB by default). Smaller buckets start sooner and overlap more of
    /// backward; each costs one collective's latency.
    pub bucket_bytes: usize,
    /// The first bucket's size (the last layers', whose gradients are ready first): 1 MiB, as
    /// PyTorch, so that communication starts early.
    pub first_bucket_bytes: usize,
    /// Broadcast rank 0's buffers (BatchNorm's running statistics) before each training
    /// forward, so that every rank evaluates with the same ones (PyTorch's default).
    pub broadcast_buffers: bool,
}

impl Default for DdpConfig {
    fn default() -> Self {
        DdpConfig {
            bucket_bytes: 25 << 20,
            first_bucket_bytes: 1 << 20,
            broadcast_buffers: true,
        }
    }
}

/// What one [`DataParallel::synchronize`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyncStats {
    /// How long the optimiser waited after backward: for the buckets still in flight and for
    /// those only started here.
    pub wait: Duration,
    /// The number of buckets (one all-reduce each).
    pub buckets: usize,
    /// How many of them started during backward, overlapping it.
    pub started_in_backward: usize,
    /// Gradient bytes all-reduced.
    pub bytes: usize,
    /// Rounds of all-reduces: 1, or 2 when several backward passes since the last
    /// `synchronize` added to gradients whose buckets had started (gradient accumulation).
    pub rounds: usize,
}

/// One bucket: parameters (indices into the wrapper's list) whose gradients travel together.
#[derive(Debug)]
struct Bucket {
    params: Vec<usize>,
    dtype: DType,
    len: usize,
}

/// Where the current step stands.
#[derive(Debug, Default)]
struct Round {
    /// The iteration whose graph has this wrapper's hook.
    hooked: Option<IterationId>,
    /// Per parameter: its gradient is final this step.
    ready: Vec<bool>,
    /// Per bucket: how many of its parameters are not yet ready.
    left: Vec<usize>,
    /// The buckets started, in bucket order (every rank starts them in the same order).
    started: Vec<Pending>,
    started_in_backward: usize,
    /// A parameter was told ready twice: a second backward pass added to gradients whose
    /// buckets may have started already, so `synchronize` reduces every bucket again.
    stale: bool,
    /// The first failure, reported by `synchronize`.
    error: Option<DistError>,
}

#[derive(Debug)]
struct Shared {
    comm: Arc<dyn Communicator>,
    params: Vec<Parameter>,
    /// Per parameter: its bucket.
    bucket_of: Vec<usize>,
    buckets: Vec<Bucket>,
    round: Mutex<Round>,
}

impl std::fmt::Debug for dyn Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator({}, rank {} of {})",
            self.backend(),
            self.rank(),
            self.world_size()
        )
    }
}

/// A module trained on every rank of a communicator, each rank on its own share of each batch
/// (PyTorch's `DistributedDataParallel`):
///
/// * at the start, rank 0's parameters and buffers are broadcast, so every rank begins equal
///   (after checking that every rank has the same parameters);
/// * in backward, the gradients are grouped in buckets (in reverse order of the parameters:
///   the last layers' are ready first); a bucket's all-reduce starts the moment its last
///   gradient is final ([`Graph::register_param_hook`]) and runs on the communicator's thread
///   while backward goes on with the layers below;
/// * [`DataParallel::synchronize`] (or [`DataParallel::step`], which then steps the optimiser)
///   waits for them and writes the average over the ranks into each parameter's gradient.
///
/// Averaged gradients are the same on every rank, so the optimisers take the same steps and the
/// ranks stay equal without exchanging weights again. Call [`DataParallel::forward`] (not the
/// inner module's) so that the graph gets the hook; checkpoints hold the inner module's names,
/// so they load into a model on any number of ranks, or none.
///
/// # Examples
///
/// One process runs as a world of one with [`Local`](crate::Local) (PyTorch:
/// `DistributedDataParallel(model)` in a process group of size 1); under `mpirun` the same code
/// takes an MPI communicator instead.
///
/// ```
/// use std::sync::Arc;
/// use arenagrad_dist::{DataParallel, DdpConfig, Local};
/// use arenagrad_nn::optim::{Sgd, SgdConfig};
/// use arenagrad_nn::{loss, DType, Graph, Linear, Module, Rng};
///
/// let mut rng = Rng::seed(0);
/// let model = DataParallel::new(Linear::new(3, 2, &mut rng)?, Arc::new(Local), DdpConfig::default())?;
/// let mut opt = Sgd::new(model.parameters(), SgdConfig::new(0.1))?;
/// let mut g = Graph::new();
/// let x = g.randn(&[4, 3], DType::F32)?;
/// loss::cross_entropy(model.forward(&g, x)?, &[0, 1, 1, 0])?.backward()?;
/// g.reset();
/// let w = model.parameters()[0].clone();
/// let before = w.value().to_f64_vec();
/// let grad = w.grad().map(|d| d.to_f64_vec()).unwrap_or_default();
/// assert_eq!(grad.len(), before.len());
/// let stats = model.step(&mut opt)?; // averaged over the ranks (one here), then a step
/// assert_eq!((stats.buckets, stats.started_in_backward), (1, 1));
/// // The mean over one rank is its own gradient, so the step is plain SGD's: w − 0.1·grad.
/// let after = w.value().to_f64_vec();
/// let sgd = before.iter().zip(&grad).map(|(w, d)| w - 0.1 * d);
/// assert!(after.iter().zip(sgd).all(|(a, want)| (a - want).abs() < 1e-6));
/// # Ok::<(), arenagrad_dist::DistError>(())
/// ```
pub struct DataParallel<M> {
    module: M,
    shared: Arc<Shared>,
    buffers: Vec<Parameter>,
    config: DdpConfig,
}

impl<M: std::fmt::Debug> std::fmt::Debug for DataParallel<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataParallel")
            .field("module", &self.module)
            .field("comm", &self.shared.comm)
            .field("buckets", &self.shared.buckets.len())
            .finish()
    }
}

fn lock(m: &Mutex<Round>) -> MutexGuard<'_, Round> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<M: Module> DataParallel<M> {
    /// Wraps `module` for training over `comm`: checks that every rank has the same parameters
    /// (names, shapes, dtypes), then gives every rank rank 0's parameters and buffers. Every
    /// rank must call it.
    pub fn new(module: M, comm: Arc<dyn Communicator>, config: DdpConfig) -> Result<Self> {
        let named = module.named_parameters();
        let buffers: Vec<Parameter> = module
            .named_state()
            .into_iter()
            .filter(|(_, _, s)| *s == Slot::Buffer)
            .map(|(_, p, _)| p)
            .collect();
        agree(comm.as_ref(), &named)?;
        let params: Vec<Parameter> = named.into_iter().map(|(_, p)| p).collect();
        let (buckets, bucket_of) = plan(&params, &config);
        let round = Round {
            ready: vec![false; params.len()],
            left: buckets.iter().map(|b| b.params.len()).collect(),
            ..Round::default()
        };
        let ddp = DataParallel {
            module,
            shared: Arc::new(Shared {
                comm,
                params,
                bucket_of,
                buckets,
                round: Mutex::new(round),
            }),
            buffers,
            config,
        };
        ddp.broadcast_state_for("DataParallel::new")?;
        Ok(ddp)
    }

    /// The wrapped module.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped module, mutably (its training mode, say).
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The wrapped module, unwrapped.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// The communicator.
    pub fn comm(&self) -> &Arc<dyn Communicator> {
        &self.shared.comm
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.shared.comm.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.shared.comm.world_size()
    }

    /// The number of gradient buckets (one all-reduce each per step).
    pub fn buckets(&self) -> usize {
        self.shared.buckets.len()
    }

    /// The forward pass of the wrapped module on this rank's share of the batch. Under grad
    /// mode it first gives the iteration's graph the hook that starts the buckets'
    /// all-reduces during backward (once per iteration), and, with
    /// [`DdpConfig::broadcast_buffers`], broadcasts rank 0's buffers.
    pub fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> arenagrad_nn::Result<Tensor<'g>> {
        if g.is_grad_enabled() {
            let id = g.iteration_id();
            let mut r = lock(&self.shared.round);
            if r.hooked != Some(id) {
                r.hooked = Some(id);
                drop(r);
                let shared = Arc::clone(&self.shared);
                g.register_param_hook(move |p| shared.on_ready(p));
            } else {
                drop(r);
            }
            if self.config.broadcast_buffers && !self.buffers.is_empty() {
                let comm = self.shared.comm.as_ref();
                let buffers = [self.buffers.as_slice()];
                if let Err(e) = broadcast_values(comm, "DataParallel::forward", &buffers) {
                    lock(&self.shared.round).error.get_or_insert(e);
                }
            }
        }
        self.module.forward(g, x)
    }

    /// Waits for every bucket's all-reduce (starting those backward did not: parameters no
    /// gradient reached count as zeros) and writes the average over the ranks into each
    /// parameter's gradient. Call it after backward, before the optimiser step (and before
    /// clipping gradients); a failure of any collective since the last call (a dead peer's
    /// timeout) comes back here. Several backward passes before it (gradient accumulation) are
    /// reduced together: the buckets the first pass started are reduced again here with the
    /// sums, as PyTorch's `no_sync` would, at the cost of a second round of communication.
    pub fn synchronize(&self) -> Result<SyncStats> {
        let t0 = Instant::now();
        let s = &*self.shared;
        let mut r = lock(&s.round);
        // Whatever happens below, the next step starts afresh.
        let started_in_backward = std::mem::take(&mut r.started_in_backward);
        let stale = std::mem::take(&mut r.stale);
        let error = r.error.take();
        // `hooked` stays: the iteration's graph keeps its hook until the reset, and a second
        // hook on it would tell every parameter twice.
        r.ready.iter_mut().for_each(|b| *b = false);
        for (left, b) in r.left.iter_mut().zip(&s.buckets) {
            *left = b.params.len();
        }
        let mut started = std::mem::take(&mut r.started);
        drop(r);
        if let Some(e) = error {
            return Err(e);
        }
        for b in started.len()..s.buckets.len() {
            started.push(s.start(b)?);
        }
        if stale {
            // Every rank started the same buckets in the same order: let them finish, then
            // reduce the accumulated gradients afresh.
            for pending in started.drain(..) {
                pending.wait()?;
            }
            for b in 0..s.buckets.len() {
                started.push(s.start(b)?);
            }
        }
        let mut bytes = 0;
        for (b, pending) in started.into_iter().enumerate() {
            let avg = pending.wait()?;
            bytes += avg.len() * avg.dtype().size();
            s.unpack(b, avg)?;
        }
        Ok(SyncStats {
            wait: t0.elapsed(),
            buckets: s.buckets.len(),
            started_in_backward,
            bytes,
            rounds: 1 + usize::from(stale),
        })
    }

    /// [`DataParallel::synchronize`], then `opt.step()`.
    pub fn step<O: Optimizer + ?Sized>(&self, opt: &mut O) -> Result<SyncStats> {
        let stats = self.synchronize()?;
        opt.step()?;
        Ok(stats)
    }

    /// Gives every rank rank 0's parameters and buffers (done by [`DataParallel::new`]; again
    /// after each rank has loaded a checkpoint, it makes sure they agree).
    /// Every answer is checked before anything is written: a communicator that answers with a
    /// buffer of another length or dtype is an error, and every parameter and buffer is left
    /// as it was.
    pub fn broadcast_state(&self) -> Result<()> {
        self.broadcast_state_for("DataParallel::broadcast_state")
    }

    /// [`DataParallel::broadcast_state`], its errors naming `op`.
    fn broadcast_state_for(&self, op: &'static str) -> Result<()> {
        let groups = [self.shared.params.as_slice(), self.buffers.as_slice()];
        broadcast_values(self.shared.comm.as_ref(), op, &groups)
    }

    /// Runs `f` on rank 0 only (saving a checkpoint, printing), then holds every rank until it
    /// is done; rank 0's failure is every rank's error. Returns `f`'s result on rank 0 and
    /// `None` elsewhere.
    pub fn on_main<R>(&self, f: impl FnOnce() -> arenagrad_nn::Result<R>) -> Result<Option<R>> {
        let comm = &self.shared.comm;
        let (out, ok) = if comm.rank() == 0 {
            match f() {
                Ok(v) => (Ok(Some(v)), 1.0),
                Err(e) => (Err(DistError::Nn(e)), 0.0),
            }
        } else {
            (Ok(None), 0.0)
        };
        let told = comm.broadcast(HostData::F64(vec![ok]), 0)?;
        if comm.rank() != 0 && told.to_f64_vec() != [1.0] {
            return Err(DistError::Backend {
                op: "on_main",
                what: "rank 0 failed".into(),
            });
        }
        out
    }
}

impl<M: Module> Module for DataParallel<M> {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> arenagrad_nn::Result<Tensor<'g>> {
        DataParallel::forward(self, g, x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        // The inner module's own names: checkpoints load on any world size.
        self.module.visit(v)
    }

    fn set_training(&mut self, training: bool) {
        self.module.set_training(training)
    }
}

impl Shared {
    /// A parameter's gradient is final: its bucket may be complete, and with it the buckets
    /// after it that were waiting for their turn.
    fn on_ready(&self, p: &Parameter) {
        let Some(k) = self.params.iter().position(|q| q.same(p)) else {
            return;
        };
        let mut r = lock(&self.round);
        if r.ready[k] {
            // A second backward before `synchronize` (gradient accumulation): the buckets
            // already started hold the first pass's gradients only. Start nothing more here;
            // `synchronize` reduces the sums.
            r.stale = true;
            return;
        }
        if r.stale {
            return;
        }
        r.ready[k] = true;
        r.left[self.bucket_of[k]] -= 1;
        while r.error.is_none()
            && r.started.len() < self.buckets.len()
            && r.left[r.started.len()] == 0
        {
            match self.start(r.started.len()) {
                Ok(pending) => {
                    r.started.push(pending);
                    r.started_in_backward += 1;
                }
                Err(e) => r.error = Some(e),
            }
        }
    }

    /// Copies bucket `b`'s gradients into one buffer and starts its all-reduce.
    fn start(&self, b: usize) -> Result<Pending> {
        let bucket = &self.buckets[b];
        let mut buf = HostData::zeros("DataParallel", bucket.dtype, bucket.len, &[bucket.len])?;
        let mut at = 0;
        for &k in &bucket.params {
            let p = &self.params[k];
            let n = p.numel();
            p.update_grad(|g| match (g, &mut buf) {
                (Some(HostDataMut::F32(g)), HostData::F32(d)) if g.len() == n => {
                    d[at..at + n].copy_from_slice(g)
                }
                (Some(HostDataMut::F64(g)), HostData::F64(d)) if g.len() == n => {
                    d[at..at + n].copy_from_slice(g)
                }
                // No gradient reached it on this rank: zeros, from here.
                _ => {}
            });
            at += n;
        }
        self.comm.all_reduce_start(buf, Reduce::Mean)
    }

    /// Writes bucket `b`'s averaged gradients into its parameters.
    fn unpack(&self, b: usize, avg: HostData) -> Result<()> {
        let bucket = &self.buckets[b];
        if avg.len() != bucket.len || avg.dtype() != bucket.dtype {
            return Err(DistError::Mismatch {
                op: "DataParallel::synchronize",
                what: format!(
                    "bucket {b} came back with {} {:?} elements, not {} {:?}",
                    avg.len(),
                    avg.dtype(),
                    bucket.len,
                    bucket.dtype
                ),
            });
        }
        let mut at = 0;
        for &k in &bucket.params {
            let p = &self.params[k];
            let n = p.numel();
            let written = p.update_grad(|g| g.is_some_and(|g| fill_from(g, &avg, at, n)));
            if !written {
                // No gradient on this rank yet (or one of another size): a new one.
                let part = slice(&avg, at, n);
                p.set_grad(Some(arenagrad_graph::HostTensor::from_data(
                    part,
                    &p.shape(),
                )?))?;
            }
            at += n;
        }
        Ok(())
    }
}

/// Copies `src[at..at + n]` into `dst` when both hold one dtype and `dst` has `n` elements;
/// false (nothing written) otherwise.
fn fill_from(dst: HostDataMut<'_>, src: &HostData, at: usize, n: usize) -> bool {
    match (dst, src) {
        (HostDataMut::F32(d), HostData::F32(s)) if d.len() == n => {
            d.copy_from_slice(&s[at..at + n]);
            true
        }
        (HostDataMut::F64(d), HostData::F64(s)) if d.len() == n => {
            d.copy_from_slice(&s[at..at + n]);
            true
        }
        _ => false,
    }
}

/// Elements `at..at + n` of `d`, as their own buffer.
fn slice(d: &HostData, at: usize, n: usize) -> HostData {
    match d {
        HostData::F32(v) => HostData::F32(v[at..at + n].to_vec()),
        HostData::F64(v) => HostData::F64(v[at..at + n].to_vec()),
        HostData::BF16(v) => HostData::BF16(v[at..at + n].to_vec()),
        HostData::F16(v) => HostData::F16(v[at..at + n].to_vec()),
        HostData::I64(v) => HostData::I64(v[at..at + n].to_vec()),
        HostData::I32(v) => HostData::I32(v[at..at + n].to_vec()),
        HostData::U8(v) => HostData::U8(v[at..at + n].to_vec()),
        HostData::Bool(v) => HostData::Bool(v[at..at + n].to_vec()),
    }
}

/// The buckets, filled in reverse order of the parameters up to the size caps, one dtype each;
/// and each parameter's bucket.
fn plan(params: &[Parameter], config: &DdpConfig) -> (Vec<Bucket>, Vec<usize>) {
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut bucket_of = vec![0; params.len()];
    for (k, p) in params.iter().enumerate().rev() {
        let (dtype, n) = (p.dtype(), p.numel());
        let cap = if buckets.len() <= 1 {
            config.first_bucket_bytes
        } else {
            config.bucket_bytes
        };
        let fits = buckets
            .last()
            .is_some_and(|b| b.dtype == dtype && b.len * dtype.size() < cap.max(1));
        if !fits {
            buckets.push(Bucket {
                params: Vec::new(),
                dtype,
                len: 0,
            });
        }
        let b = buckets.len() - 1;
        buckets[b].params.push(k);
        buckets[b].len += n;
        bucket_of[k] = b;
    }
    (buckets, bucket_of)
}

/// Checks that every rank has the same parameters: a fingerprint of the names, shapes and
/// dtypes, whose largest and smallest over the ranks must agree.
fn agree(comm: &dyn Communicator, named: &[(String, Parameter)]) -> Result<()> {
    // FNV-1a, cut to 52 bits so that an f64 holds it exactly.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    };
    let mut total = 0usize;
    for (name, p) in named {
        eat(name.as_bytes());
        for d in p.shape() {
            eat(&(d as u64).to_le_bytes());
        }
        eat(&[p.dtype().size() as u8]);
        total += p.numel();
    }
    let mine = vec![named.len() as f64, total as f64, (h >> 12) as f64];
    let hi = comm.all_reduce(HostData::F64(mine.clone()), Reduce::Max)?;
    let lo = comm.all_reduce(HostData::F64(mine.clone()), Reduce::Min)?;
    if hi.to_f64_vec() != lo.to_f64_vec() {
        return Err(DistError::Mismatch {
            op: "DataParallel::new",
            what: format!(
                "rank {} has {} parameters of {} elements, and the ranks' models differ \
                 (names, shapes or dtypes)",
                comm.rank(),
                named.len(),
                total
            ),
        });
    }
    Ok(())
}

/// Gives every rank rank 0's values of each group of `groups` (one broadcast per group and
/// dtype, in that order). Every answer is checked (its dtype and length) before any value is
/// written: a communicator that answers wrongly leaves every parameter as it was, rather than
/// some overwritten and the rest not.
fn broadcast_values(
    comm: &dyn Communicator,
    op: &'static str,
    groups: &[&[Parameter]],
) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let mut answers: Vec<(Vec<&Parameter>, HostData)> = Vec::new();
    for params in groups {
        for dtype in [DType::F32, DType::F64] {
            let mine: Vec<&Parameter> = params.iter().filter(|p| p.dtype() == dtype).collect();
            if mine.is_empty() {
                continue;
            }
            let mut all = HostData::from_f64(dtype, &[]);
            for p in &mine {
                match (&mut all, p.value().data()) {
                    (HostData::F32(a), HostData::F32(v)) => a.extend_from_slice(v),
                    (HostData::F64(a), HostData::F64(v)) => a.extend_from_slice(v),
                    _ => unreachable!("filtered by dtype"),
                }
            }
            let len = all.len();
            let got = comm.broadcast(all, 0)?;
            if got.dtype() != dtype || got.len() != len {
                return Err(DistError::Mismatch {
                    op,
                    what: format!(
                        "the broadcast of {} {dtype:?} parameters came back with {} {:?} \
                         elements, not {len} {dtype:?}; nothing was written",
                        mine.len(),
                        got.len(),
                        got.dtype()
                    ),
                });
            }
            answers.push((mine, got));
        }
    }
    for (mine, got) in answers {
        let mut at = 0;
        for p in mine {
            let n = p.numel();
            let written = p.update(|v, _| fill_from(v, &got, at, n));
            assert!(
                written,
                "invariant: filtered by dtype, the answer checked against the sum of numel"
            );
            at += n;
        }
    }
    Ok(())
}
