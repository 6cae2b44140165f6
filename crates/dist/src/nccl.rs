//! The NCCL transport (feature `nccl`): NVIDIA's collectives through cudarc, one process per
//! GPU. The library is loaded at run time, so the feature builds without CUDA.
//!
//! Parameters and their gradients live on the host in arenagrad (a device iteration uploads
//! them), so each operation stages its buffer: copied to the device, reduced by NCCL on the
//! group's stream, copied back.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
use cudarc::nccl::{Comm, Id, NcclType, ReduceOp};

use arenagrad_graph::HostData;

use crate::comm::{through_f32, Reduce};
use crate::error::{DistError, Result};
use crate::group::{default_timeout, ProcessGroup, Transport};

/// Options of [`ProcessGroup::nccl`].
#[derive(Debug, Clone, Copy)]
pub struct NcclConfig {
    /// The CUDA device (ordinal) this rank uses.
    pub device: usize,
    /// How long a collective may wait for the other ranks before it is
    /// [`DistError::Timeout`] (default 300 s, or `ARENAGRAD_DIST_TIMEOUT` seconds).
    pub timeout: Duration,
}

impl Default for NcclConfig {
    fn default() -> Self {
        NcclConfig {
            device: 0,
            timeout: default_timeout(),
        }
    }
}

/// The identifier every rank of one NCCL world shares: rank 0 makes it ([`NcclId::new`]) and
/// hands its bytes to the others (over MPI: [`ProcessGroup::nccl_over_mpi`]; or a file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclId(pub [u8; 128]);

fn missing(op: &'static str) -> Option<DistError> {
    if !arenagrad_exec::cuda::driver_present() {
        return Some(DistError::Backend {
            op,
            what: "the CUDA driver (libcuda) could not be loaded".into(),
        });
    }
    if !arenagrad_exec::cuda::nccl_present() {
        return Some(DistError::Backend {
            op,
            what: "NCCL could not be loaded as libnccl.so: put its folder on LD_LIBRARY_PATH \
                   (pip's nvidia-nccl ships only libnccl.so.2: link libnccl.so to it there)"
                .into(),
        });
    }
    None
}

fn nccl_error(op: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> DistError {
    move |e| DistError::Backend {
        op,
        what: format!("NCCL: {e:?}"),
    }
}

impl NcclId {
    /// A fresh identifier (on rank 0).
    pub fn new() -> Result<NcclId> {
        let op = "NcclId::new";
        if let Some(e) = missing(op) {
            return Err(e);
        }
        let id = Id::new().map_err(nccl_error(op))?;
        Ok(NcclId(id.internal().map(|c| c as u8)))
    }
}

impl ProcessGroup {
    /// Joins an NCCL world of `world` ranks as `rank`, on `config.device`; every rank passes
    /// the same `id`. NCCL's ring and tree reductions are deterministic for a fixed world and
    /// topology.
    pub fn nccl(rank: usize, world: usize, id: NcclId, config: NcclConfig) -> Result<ProcessGroup> {
        let op = "ProcessGroup::nccl";
        if rank >= world {
            return Err(DistError::BadArgument {
                op,
                what: format!("rank {rank} is outside a world of {world}"),
            });
        }
        if let Some(e) = missing(op) {
            return Err(e);
        }
        let device = config.device;
        ProcessGroup::start("nccl", config.timeout, move || {
            let ctx = CudaContext::new(device).map_err(|e| DistError::Backend {
                op,
                what: format!("CUDA device {device}: {e:?}"),
            })?;
            let stream = ctx.default_stream();
            let id = Id::uninit(id.0.map(|b| b as std::ffi::c_char));
            let comm =
                Comm::from_rank(Arc::clone(&stream), rank, world, id).map_err(nccl_error(op))?;
            Ok(NcclTransport { comm, stream })
        })
    }

    /// An NCCL world of one (this process, `config.device`): the code path of a multi-GPU run,
    /// on one GPU.
    pub fn nccl_single(config: NcclConfig) -> Result<ProcessGroup> {
        ProcessGroup::nccl(0, 1, NcclId::new()?, config)
    }

    /// Joins an NCCL world with the ranks of an MPI one (`mpirun`, one process per GPU): rank
    /// 0's identifier goes to the others over `mpi`.
    #[cfg(feature = "mpi")]
    pub fn nccl_over_mpi(mpi: &ProcessGroup, config: NcclConfig) -> Result<ProcessGroup> {
        use crate::comm::Communicator;
        let id = if mpi.rank() == 0 {
            NcclId::new()?.0
        } else {
            [0u8; 128]
        };
        let sent = mpi.broadcast(HostData::F64(id.iter().map(|&b| f64::from(b)).collect()), 0)?;
        let HostData::F64(bytes) = sent else {
            unreachable!("a broadcast keeps its buffer's dtype")
        };
        let mut id = [0u8; 128];
        for (d, s) in id.iter_mut().zip(bytes) {
            *d = s as u8;
        }
        ProcessGroup::nccl(mpi.rank(), mpi.world_size(), NcclId(id), config)
    }
}

struct NcclTransport {
    comm: Comm,
    stream: Arc<CudaStream>,
}

impl NcclTransport {
    fn staged<T: NcclType + DeviceRepr + Copy>(
        &self,
        host: &mut [T],
        f: impl FnOnce(&Comm, &mut CudaSlice<T>) -> Result<(), String>,
    ) -> Result<(), String> {
        if host.is_empty() {
            return Ok(());
        }
        let e = |e: cudarc::driver::DriverError| format!("CUDA: {e:?}");
        let mut dev = self.stream.clone_htod(host).map_err(e)?;
        f(&self.comm, &mut dev)?;
        self.stream.memcpy_dtoh(&dev, host).map_err(e)?;
        self.stream.synchronize().map_err(e)
    }
}

fn how(op: Reduce) -> ReduceOp {
    match op {
        Reduce::Sum | Reduce::Mean => ReduceOp::Sum,
        Reduce::Max => ReduceOp::Max,
        Reduce::Min => ReduceOp::Min,
    }
}

fn said(e: cudarc::nccl::result::NcclError) -> String {
    format!("NCCL: {e:?}")
}

fn reduce_on<T: NcclType>(c: &Comm, d: &mut CudaSlice<T>, op: Reduce) -> Result<(), String> {
    c.all_reduce_in_place(d, &how(op)).map(|_| ()).map_err(said)
}

fn broadcast_on<T: NcclType>(c: &Comm, d: &mut CudaSlice<T>, root: usize) -> Result<(), String> {
    c.broadcast_in_place(d, root as i32)
        .map(|_| ())
        .map_err(said)
}

impl Transport for NcclTransport {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    fn all_reduce(&mut self, buf: &mut HostData, op: Reduce) -> Result<(), String> {
        match buf {
            HostData::F32(v) => self.staged(v, |c, d| reduce_on(c, d, op)),
            HostData::F64(v) => self.staged(v, |c, d| reduce_on(c, d, op)),
            HostData::BF16(v) => through_f32(v, |w| self.staged(w, |c, d| reduce_on(c, d, op))),
            HostData::F16(v) => through_f32(v, |w| self.staged(w, |c, d| reduce_on(c, d, op))),
            other => Err(format!(
                "all_reduce: {} buffers are not reduced",
                other.dtype()
            )),
        }
    }

    fn broadcast(&mut self, buf: &mut HostData, root: usize) -> Result<(), String> {
        match buf {
            HostData::F32(v) => self.staged(v, |c, d| broadcast_on(c, d, root)),
            HostData::F64(v) => self.staged(v, |c, d| broadcast_on(c, d, root)),
            HostData::BF16(v) => {
                through_f32(v, |w| self.staged(w, |c, d| broadcast_on(c, d, root)))
            }
            HostData::F16(v) => through_f32(v, |w| self.staged(w, |c, d| broadcast_on(c, d, root))),
            other => Err(format!("broadcast: {} buffers are not sent", other.dtype())),
        }
    }

    fn barrier(&mut self) -> Result<(), String> {
        self.staged(&mut [0f32], |c, d| reduce_on(c, d, Reduce::Sum))
    }
}
