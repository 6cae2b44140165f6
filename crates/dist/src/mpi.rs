//! The MPI transport (feature `mpi`): the `mpi` crate over the system's MPI library.

use std::time::Duration;

use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::Threading;

use arenagrad_graph::HostData;

use crate::comm::{reduce_in_rank_order, through_f32, Reduce};
use crate::error::{DistError, Result};
use crate::group::{default_timeout, ProcessGroup, Transport};

/// Options of [`ProcessGroup::mpi`].
#[derive(Debug, Clone, Copy)]
pub struct MpiConfig {
    /// How long a collective may wait for the other ranks before it is
    /// [`DistError::Timeout`] (default 300 s, or `ARENAGRAD_DIST_TIMEOUT` seconds).
    pub timeout: Duration,
    /// Reduce in rank order, whatever MPI's algorithm: every element is
    /// `((r0 + r1) + r2) + …` on every rank and every run, at the cost of gathering every rank's
    /// buffer (world × the bytes). Off: MPI's own all-reduce, whose summation order its
    /// algorithm picks.
    pub deterministic: bool,
}

impl Default for MpiConfig {
    fn default() -> Self {
        MpiConfig {
            timeout: default_timeout(),
            deterministic: false,
        }
    }
}

impl ProcessGroup {
    /// Joins the MPI world (`MPI_COMM_WORLD`). MPI is initialised on the group's communication
    /// thread, which makes every MPI call ("funneled" threading), and finalised when the group
    /// is dropped; a process can initialise MPI once. Outside a launcher this is a world of one.
    pub fn mpi(config: MpiConfig) -> Result<ProcessGroup> {
        let deterministic = config.deterministic;
        ProcessGroup::start("mpi", config.timeout, move || {
            let (universe, _) =
                mpi::initialize_with_threading(Threading::Funneled).ok_or(DistError::Backend {
                    op: "ProcessGroup::mpi",
                    what: "MPI is already initialised in this process (once per process)".into(),
                })?;
            let world = universe.world();
            Ok(MpiTransport {
                world,
                _universe: universe,
                deterministic,
            })
        })
    }
}

struct MpiTransport {
    // Dropped before the universe, whose drop finalises MPI.
    world: SimpleCommunicator,
    _universe: Universe,
    deterministic: bool,
}

impl MpiTransport {
    fn reduce<T>(&self, buf: &mut [T], op: Reduce)
    where
        T: Equivalence + Copy + Default + PartialOrd + std::ops::Add<Output = T>,
    {
        let send = buf.to_vec();
        if self.deterministic {
            let mut all = vec![T::default(); send.len() * self.world_size()];
            self.world.all_gather_into(&send[..], &mut all[..]);
            reduce_in_rank_order(&all, buf, op);
            return;
        }
        let how = match op {
            Reduce::Sum | Reduce::Mean => SystemOperation::sum(),
            Reduce::Max => SystemOperation::max(),
            Reduce::Min => SystemOperation::min(),
        };
        self.world.all_reduce_into(&send[..], buf, how);
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn world_size(&self) -> usize {
        self.world.size() as usize
    }

    fn all_reduce(&mut self, buf: &mut HostData, op: Reduce) -> Result<(), String> {
        match buf {
            HostData::F32(v) => self.reduce(v, op),
            HostData::F64(v) => self.reduce(v, op),
            // MPI has no 16-bit float type: reduced in f32, rounded once.
            HostData::BF16(v) => through_f32(v, |w| {
                self.reduce(w, op);
                Ok(())
            })?,
            HostData::F16(v) => through_f32(v, |w| {
                self.reduce(w, op);
                Ok(())
            })?,
            HostData::I64(v) => self.reduce(v, op),
            HostData::I32(v) => self.reduce(v, op),
            other => {
                return Err(format!(
                    "all_reduce: {} buffers are not reduced",
                    other.dtype()
                ))
            }
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut HostData, root: usize) -> Result<(), String> {
        let root = self.world.process_at_rank(root as i32);
        match buf {
            HostData::F32(v) => root.broadcast_into(&mut v[..]),
            HostData::F64(v) => root.broadcast_into(&mut v[..]),
            // Exact: a 16-bit value survives the round trip through f32.
            HostData::BF16(v) => through_f32(v, |w| {
                root.broadcast_into(&mut w[..]);
                Ok(())
            })?,
            HostData::F16(v) => through_f32(v, |w| {
                root.broadcast_into(&mut w[..]);
                Ok(())
            })?,
            HostData::I64(v) => root.broadcast_into(&mut v[..]),
            HostData::I32(v) => root.broadcast_into(&mut v[..]),
            HostData::U8(v) => root.broadcast_into(&mut v[..]),
            other => return Err(format!("broadcast: {} buffers are not sent", other.dtype())),
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), String> {
        self.world.barrier();
        Ok(())
    }
}
