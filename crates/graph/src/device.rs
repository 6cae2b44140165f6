//! Where tensors live, and the device side of an iteration's memory.
//!
//! Every node records its [`Device`]. Host tensors keep their elements in the iteration's bump
//! [`arenagrad_alloc::Arena`]; CUDA tensors keep theirs in a [`arenagrad_alloc::DeviceArena`]
//! whose blocks come from the device's caching allocator and go back to it when the iteration
//! ends, so a steady loop stops calling the driver after its first iteration. Both kinds of
//! buffer are named by [`BufId`]s, so views (reshape, detach) and the freeing of backward
//! temporaries work the same way on either side.
//!
//! Ops check that their operands share a device ([`GraphError::DeviceMismatch`]); moving data is
//! explicit ([`Tensor::to_device`]), and reading values back ([`Tensor::to_vec`],
//! [`Tensor::item`]) is where the host waits for the device's queue.

use std::borrow::Cow;

use arenagrad_alloc::BufId;
use arenagrad_exec::DType;

use crate::error::{GraphError, Result};
use crate::graph::{Device, Inner, NodeId};
use crate::ops::Op;
use crate::shape::{copy_of, Shape};
use crate::{Graph, HostElem, Tensor};

#[cfg(feature = "cuda")]
pub(crate) use cuda_side::CudaSide;

/// The error for a CUDA device in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub(crate) fn no_cuda(ordinal: usize) -> GraphError {
    GraphError::NoCudaDevice {
        ordinal,
        reason: "arenagrad was built without the `cuda` feature".into(),
    }
}

/// How many CUDA devices this process can use: 0 when the build has no `cuda` feature, when the
/// driver library is missing, or when it reports no device.
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        arenagrad_exec::cuda::device_count().unwrap_or(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// `$cpu` for the host; for CUDA device `o`, `$body` with its backend bound to `$b` (a
/// `Result<_, CudaError>`), or the missing-feature error in a build without `cuda`.
macro_rules! per_device {
    ($op:expr, $dev:expr, cpu => $cpu:expr, |$b:ident| $body:expr) => {
        match $dev {
            Device::Cpu => $cpu,
            #[cfg(feature = "cuda")]
            Device::Cuda(o) => arenagrad_exec::cuda::CudaBackend::get(o)
                .and_then(|$b| $body)
                .map_err(|e| cuda_side::cuda_err($op, e)),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(o) => Err(no_cuda(o)),
        }
    };
}

/// Checks that a device can be used, creating its context, stream and kernels on first use.
/// A CUDA device without a driver or a GPU is [`GraphError::NoCudaDevice`].
pub fn check_device(dev: Device) -> Result<()> {
    if let Device::Cuda(o) = dev {
        if o >= usize::from(u16::MAX - 1) {
            return Err(GraphError::NoCudaDevice {
                ordinal: o,
                reason: "no such ordinal".into(),
            });
        }
    }
    per_device!("check_device", dev, cpu => Ok(()), |_b| Ok(()))
}

/// The caching allocator's counters for a CUDA device, under PyTorch's key names
/// (`allocated_bytes.all.current`, `reserved_bytes.all.peak`, `num_device_alloc`, ...).
pub fn memory_stats(dev: Device) -> Result<std::collections::BTreeMap<String, u64>> {
    let host = GraphError::BadArgument {
        op: "memory_stats",
        what: "memory statistics are kept for CUDA devices; see Graph::stats for the host",
    };
    per_device!("memory_stats", dev, cpu => Err(host), |b| Ok(b.memory_stats()))
}

/// Returns a CUDA device's cached, unused segments to the driver; the number of segments freed.
pub fn empty_cache(dev: Device) -> Result<usize> {
    per_device!("empty_cache", dev, cpu => Ok(0), |b| Ok(b.empty_cache()))
}

/// Restarts the peak counters of a CUDA device's caching allocator.
pub fn reset_peak_stats(dev: Device) -> Result<()> {
    per_device!("reset_peak_stats", dev, cpu => Ok(()), |b| {
        b.cache().reset_peak_stats();
        Ok(())
    })
}

/// Waits until the device has finished all queued work (a no-op on the CPU).
pub fn synchronize(dev: Device) -> Result<()> {
    per_device!("synchronize", dev, cpu => Ok(()), |b| b.synchronize())
}

/// Runs `$body` with a CUDA backend and the device addresses of `$bufs` bound to `$be` and `$p`.
/// Without the `cuda` feature no CUDA node can exist, so the arm reports the missing feature.
macro_rules! on_cuda {
    ($i:expr, $op:expr, $dev:expr, [$($buf:expr),*], |$be:ident, [$($p:ident),*]| $body:expr) => {{
        #[cfg(feature = "cuda")]
        {
            let ($be, [$($p),*]) = $i.dptrs($op, $dev, [$($buf),*])?;
            let r: std::result::Result<(), arenagrad_exec::cuda::CudaError> = $body;
            r.map_err(|e| $crate::device::cuda_err($op, e))?;
        }
        #[cfg(not(feature = "cuda"))]
        {
            $(let _ = $buf;)*
            Err::<(), _>($crate::device::no_cuda_dev($dev))?;
        }
    }};
}
pub(crate) use on_cuda;

#[cfg(feature = "cuda")]
pub(crate) use cuda_side::cuda_err;

/// The error for a device this build cannot use.
#[cfg(not(feature = "cuda"))]
pub(crate) fn no_cuda_dev(dev: Device) -> GraphError {
    match dev {
        Device::Cuda(o) => no_cuda(o),
        Device::Cpu => GraphError::BadArgument {
            op: "device",
            what: "the CPU was handled as a CUDA device",
        },
    }
}

impl Inner {
    /// The device of a node.
    #[inline]
    pub fn device_of(&self, op: &'static str, id: NodeId) -> Result<Device> {
        Ok(self.node(op, id)?.device())
    }

    /// An uninitialised buffer of `n` elements on `dev`.
    #[inline]
    pub fn alloc_on(
        &mut self,
        op: &'static str,
        dev: Device,
        dtype: DType,
        n: usize,
    ) -> Result<BufId> {
        match dev {
            Device::Cpu => self.alloc(op, dtype, n),
            Device::Cuda(_) if dtype.is_half() => Err(GraphError::UnsupportedDType { op, dtype }),
            Device::Cuda(o) => self.alloc_cuda(op, o, dtype.size(), n),
        }
    }

    /// A zeroed buffer of `n` elements on `dev`.
    pub fn alloc_zeroed_on(
        &mut self,
        op: &'static str,
        dev: Device,
        dtype: DType,
        n: usize,
    ) -> Result<BufId> {
        match dev {
            Device::Cpu => self.alloc_zeroed(op, dtype, n),
            Device::Cuda(_) => {
                let b = self.alloc_on(op, dev, dtype, n)?;
                on_cuda!(self, op, dev, [b], |be, [p]| be.fill(dtype, p, n, 0.0));
                Ok(b)
            }
        }
    }

    /// One more holder of a buffer (a view shares it).
    pub fn retain_buf(&mut self, op: &'static str, dev: Device, buf: BufId) -> Result<()> {
        match dev {
            Device::Cpu => self
                .arena
                .retain(buf)
                .map_err(|source| GraphError::Alloc { op, source }),
            #[cfg(feature = "cuda")]
            Device::Cuda(o) => self
                .cuda_side(op, o)?
                .arena
                .retain(buf)
                .map_err(|source| GraphError::Alloc { op, source }),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(o) => Err(no_cuda(o)),
        }
    }

    /// Drops one holder of a buffer; the last one returns it for reuse in this iteration.
    pub fn release_buf(&mut self, dev: Device, buf: BufId) -> Result<()> {
        let op = "release";
        match dev {
            Device::Cpu => self
                .arena
                .recycle(buf)
                .map_err(|source| GraphError::Alloc { op, source }),
            #[cfg(feature = "cuda")]
            Device::Cuda(o) => {
                let side = self.cuda_side(op, o)?;
                let mut cache = side.backend.cache();
                side.arena
                    .recycle(&mut cache, buf)
                    .map_err(|source| GraphError::Alloc { op, source })
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(o) => Err(no_cuda(o)),
        }
    }

    #[cfg(not(feature = "cuda"))]
    fn alloc_cuda(
        &mut self,
        _op: &'static str,
        o: usize,
        _elem: usize,
        _n: usize,
    ) -> Result<BufId> {
        Err(no_cuda(o))
    }

    /// Ends the iteration on every device this graph used.
    pub fn reset_devices(&mut self) {
        #[cfg(feature = "cuda")]
        for side in &mut self.cuda {
            let mut cache = side.backend.cache();
            side.arena.reset(&mut cache);
        }
    }

    /// The elements of a node as `T` (its dtype), copied from the device when it is not the host.
    pub fn read<T: HostElem>(&self, op: &'static str, id: NodeId) -> Result<Cow<'_, [T]>> {
        let n = self.node(op, id)?;
        if n.dtype != T::DTYPE {
            return Err(GraphError::WrongDType {
                op,
                stored: n.dtype,
                requested: T::DTYPE,
            });
        }
        match n.device() {
            Device::Cpu => self
                .arena
                .slice::<T>(n.buf)
                .map(Cow::Borrowed)
                .map_err(|source| GraphError::Alloc { op, source }),
            #[cfg(feature = "cuda")]
            Device::Cuda(o) => {
                let len = n.shape.iter().product();
                let mut v = crate::host::try_filled(op, len, T::default(), &n.shape)?;
                let side = self
                    .cuda
                    .iter()
                    .find(|s| s.backend.ordinal() == o)
                    .ok_or_else(|| GraphError::Device {
                        op,
                        msg: format!("no memory of cuda:{o} in this graph"),
                    })?;
                let p = side
                    .arena
                    .ptr(n.buf)
                    .map_err(|source| GraphError::Alloc { op, source })?;
                side.backend.dtoh(p, &mut v).map_err(|e| cuda_err(op, e))?;
                Ok(Cow::Owned(v))
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(o) => Err(no_cuda(o)),
        }
    }

    /// Copies host elements into a new buffer on `dev`.
    pub fn upload<T: HostElem>(
        &mut self,
        op: &'static str,
        dev: Device,
        data: &[T],
    ) -> Result<BufId> {
        match dev {
            Device::Cpu => self
                .arena
                .alloc_from_slice(data)
                .map_err(|source| GraphError::Alloc { op, source }),
            Device::Cuda(_) => {
                let b = self.alloc_on(op, dev, T::DTYPE, data.len())?;
                on_cuda!(self, op, dev, [b], |be, [p]| be.htod(data, p));
                Ok(b)
            }
        }
    }

    /// Moves a freshly made host leaf to `dev` (a no-op for the CPU).
    pub fn settle(&mut self, op: &'static str, id: NodeId, dev: Device) -> Result<()> {
        if dev == Device::Cpu {
            return Ok(());
        }
        let (dtype, hb) = {
            let n = self.node(op, id)?;
            (n.dtype, n.buf)
        };
        if dtype.is_half() {
            return Err(GraphError::UnsupportedDType { op, dtype });
        }
        let db = with_storage!(dtype, T, {
            let host: Vec<T> = self
                .arena
                .slice::<T>(hb)
                .map_err(|source| GraphError::Alloc { op, source })?
                .to_vec();
            self.upload(op, dev, &host)?
        });
        self.release_buf(Device::Cpu, hb)?;
        let n = &mut self.nodes[id];
        n.buf = db;
        n.dev = crate::graph::DevCode::of(dev);
        Ok(())
    }

    /// Index lists for a device kernel, as `u32` in a scratch buffer on `dev`.
    #[cfg(feature = "cuda")]
    pub fn upload_indices(
        &mut self,
        op: &'static str,
        dev: Device,
        idx: &[usize],
    ) -> Result<BufId> {
        let v: Vec<u32> = idx
            .iter()
            .map(|&k| u32::try_from(k))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| GraphError::BadArgument {
                op,
                what: "indices above u32::MAX are not supported on CUDA",
            })?;
        let b = self.alloc_on(op, dev, DType::F32, v.len())?;
        on_cuda!(self, op, dev, [b], |be, [p]| be.htod_u32(&v, p));
        Ok(b)
    }
}

#[cfg(feature = "cuda")]
mod cuda_side {
    use std::sync::Arc;

    use arenagrad_alloc::{BufId, DeviceArena};
    use arenagrad_exec::cuda::{CudaBackend, CudaError};

    use crate::error::{GraphError, Result};
    use crate::graph::{Device, Inner};

    /// A graph's memory on one CUDA device.
    pub(crate) struct CudaSide {
        pub backend: Arc<CudaBackend>,
        pub arena: DeviceArena,
    }

    /// Converts a backend error.
    pub(crate) fn cuda_err(op: &'static str, e: CudaError) -> GraphError {
        match e {
            CudaError::NoCudaDevice { ordinal, reason } => {
                GraphError::NoCudaDevice { ordinal, reason }
            }
            other => GraphError::Device {
                op,
                msg: other.to_string(),
            },
        }
    }

    impl Inner {
        /// This graph's memory on CUDA device `ordinal`, set up on first use.
        pub fn cuda_side(&mut self, op: &'static str, ordinal: usize) -> Result<&mut CudaSide> {
            let pos = match self
                .cuda
                .iter()
                .position(|s| s.backend.ordinal() == ordinal)
            {
                Some(p) => p,
                None => {
                    let backend = CudaBackend::get(ordinal).map_err(|e| cuda_err(op, e))?;
                    self.cuda.push(CudaSide {
                        backend,
                        arena: DeviceArena::new(),
                    });
                    self.cuda.len() - 1
                }
            };
            Ok(&mut self.cuda[pos])
        }

        pub(super) fn alloc_cuda(
            &mut self,
            op: &'static str,
            ordinal: usize,
            elem: usize,
            n: usize,
        ) -> Result<BufId> {
            let bytes = n.checked_mul(elem).ok_or(GraphError::BadArgument {
                op,
                what: "buffer size overflows",
            })?;
            let side = self.cuda_side(op, ordinal)?;
            let stream = side.backend.stream_id();
            let mut cache = side.backend.cache();
            side.arena
                .alloc(&mut cache, bytes, stream)
                .map_err(|source| GraphError::Alloc { op, source })
        }

        /// The backend of `dev` and the device addresses of `bufs`.
        pub fn dptrs<const N: usize>(
            &mut self,
            op: &'static str,
            dev: Device,
            bufs: [BufId; N],
        ) -> Result<(
            Arc<CudaBackend>,
            [arenagrad_alloc::block_cache::DevicePtr; N],
        )> {
            let Device::Cuda(o) = dev else {
                return Err(GraphError::BadArgument {
                    op,
                    what: "a host buffer was passed to a device kernel",
                });
            };
            let side = self.cuda_side(op, o)?;
            let mut out = [arenagrad_alloc::block_cache::DevicePtr(0); N];
            for (slot, b) in out.iter_mut().zip(bufs) {
                *slot = side
                    .arena
                    .ptr(b)
                    .map_err(|source| GraphError::Alloc { op, source })?;
            }
            Ok((side.backend.clone(), out))
        }
    }
}

impl Graph {
    /// A graph whose leaves (`from_slice`, `randn`, `param`, ...) are made on `dev`.
    /// A CUDA device without a driver or a GPU is [`GraphError::NoCudaDevice`].
    pub fn on(dev: Device) -> Result<Graph> {
        let g = Graph::new();
        g.set_device(dev)?;
        Ok(g)
    }

    /// Makes new leaves on `dev` from now on (tensors already made stay where they are).
    pub fn set_device(&self, dev: Device) -> Result<()> {
        check_device(dev)?;
        self.inner().device = dev;
        Ok(())
    }

    /// The device new leaves are made on.
    pub fn device(&self) -> Device {
        self.inner.borrow().device
    }
}

impl<'g> Tensor<'g> {
    /// The device this tensor lives on.
    pub fn device(&self) -> Device {
        self.with_node("device", |n| n.device())
            .expect("invariant: a live handle names a live node")
    }

    /// A copy on `dev` (this tensor itself when it is already there). Differentiable: the
    /// gradient travels back to this tensor's device.
    pub fn to_device(self, dev: Device) -> Result<Tensor<'g>> {
        let op = "to_device";
        let from = self.with_node(op, |n| n.device())?;
        if from == dev {
            return Ok(self);
        }
        check_device(dev)?;
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (shape, dtype): (Shape, DType) = {
            let n = i.node(op, self.id)?;
            (copy_of(&n.shape), n.dtype)
        };
        if dtype.is_half() {
            return Err(GraphError::UnsupportedDType { op, dtype });
        }
        let buf = with_storage!(dtype, T, {
            let host: Vec<T> = i.read::<T>(op, self.id)?.into_owned();
            i.upload(op, dev, &host)?
        });
        let id = i.push_on(dev, shape, dtype, buf, Op::ToDevice { from }, &[self.id]);
        drop(guard);
        Ok(self.g.handle(id))
    }
}
