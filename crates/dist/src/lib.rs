//! Data-parallel training for arenagrad: the same model on several processes, each on its own
//! share of every batch, gradients averaged between them — over MPI on CPU clusters (feature
//! `mpi`) and NCCL between GPUs (feature `nccl`), the libraries those machines already run. The
//! default build pulls in neither.
//!
//! * [`Communicator`] — rank, world size, all-reduce (blocking, or started and waited for
//!   later: [`Pending`]), broadcast, barrier; every failure a typed [`DistError`], a peer that
//!   stops answering a [`DistError::Timeout`] rather than a hang.
//! * [`Local`] — the world of one process; [`ProcessGroup`] — MPI (`ProcessGroup::mpi`) or
//!   NCCL (`ProcessGroup::nccl`) on a communication thread of its own.
//! * [`DataParallel`] — wraps a module: rank 0's weights to every rank at the start, gradient
//!   buckets all-reduced while backward runs, the average in every parameter's gradient before
//!   the optimiser step.
//! * [`DistributedSampler`] — disjoint shares of a dataset, the same epoch order on every rank.
//!
//! A step on every rank (launched as `mpirun -np 2 my-program`):
//!
//! ```no_run
//! # #[cfg(feature = "mpi")] {
//! use std::sync::Arc;
//! use arenagrad_dist::{DataParallel, DdpConfig, DistributedSampler, MpiConfig, ProcessGroup};
//! use arenagrad_nn::optim::{Optimizer, Sgd, SgdConfig};
//! use arenagrad_nn::{loss, DType, Graph, Linear, Module, Rng};
//!
//! let comm = Arc::new(ProcessGroup::mpi(MpiConfig::default())?);
//! let mut rng = Rng::seed(0);
//! let model = DataParallel::new(Linear::new(784, 10, &mut rng)?, comm.clone(), DdpConfig::default())?;
//! let mut opt = Sgd::new(model.parameters(), SgdConfig::new(0.1))?;
//! let sampler = DistributedSampler::new(60_000, comm.as_ref(), 42);
//! let mut g = Graph::new();
//! for batch in sampler.indices(0)?.chunks(32) {
//!     let x = g.randn(&[batch.len(), 784], DType::F32)?; // this rank's examples
//!     opt.zero_grad();
//!     let l = loss::cross_entropy(model.forward(&g, x)?, &vec![0; batch.len()])?;
//!     l.backward()?; // buckets start all-reducing here
//!     g.reset();
//!     model.step(&mut opt)?; // waits for them, then steps
//! }
//! # }
//! # Ok::<(), arenagrad_dist::DistError>(())
//! ```
#![forbid(unsafe_code)]
// Without a transport feature the process-group machinery has nothing to carry.
#![cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]

mod comm;
mod ddp;
mod error;
mod group;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
mod sampler;

pub use comm::{Communicator, Local, Pending, Reduce};
pub use ddp::{DataParallel, DdpConfig, SyncStats};
pub use error::{DistError, Result};
pub use group::ProcessGroup;
#[cfg(feature = "mpi")]
pub use mpi::MpiConfig;
#[cfg(feature = "nccl")]
pub use nccl::{NcclConfig, NcclId};
pub use sampler::DistributedSampler;

/// Whether this process was started by an MPI launcher (`mpirun`, `srun`): a data-parallel
/// program then joins the world with `ProcessGroup::mpi`, and otherwise can run alone on
/// [`Local`].
pub fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}
