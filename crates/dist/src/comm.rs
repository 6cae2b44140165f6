//! What data-parallel training asks of a transport: the [`Communicator`] trait, its pending
//! operations, and [`Local`], the world of one process. Buffers are [`HostData`], owned: a
//! nonblocking operation holds its elements until it completes, then hands them back.

use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arenagrad_graph::{HostData, Storage};

use crate::error::{DistError, Result};

/// How an all-reduce combines the ranks' elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    /// The sum.
    Sum,
    /// The sum divided by the number of ranks (gradient averaging).
    Mean,
    /// The largest.
    Max,
    /// The smallest.
    Min,
}

/// The collectives data-parallel training needs, over some transport. Every rank must call the
/// same collectives in the same order with buffers of the same length and dtype (as with MPI
/// and NCCL themselves). Failures are typed errors: a peer that stops answering is
/// [`DistError::Timeout`] after the communicator's timeout, not a hang.
///
/// Implementations: [`Local`] (one process), [`ProcessGroup`](crate::ProcessGroup) over MPI
/// (feature `mpi`) or NCCL (feature `nccl`).
pub trait Communicator: Send + Sync {
    /// This process's rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world_size(&self) -> usize;

    /// The transport's name (`"local"`, `"mpi"`, `"nccl"`).
    fn backend(&self) -> &'static str;

    /// Starts an all-reduce of `buf` and returns at once; [`Pending::wait`] gives the reduced
    /// elements back. Operations complete in the order started.
    fn all_reduce_start(&self, buf: HostData, op: Reduce) -> Result<Pending>;

    /// An all-reduce, waited for.
    fn all_reduce(&self, buf: HostData, op: Reduce) -> Result<HostData> {
        self.all_reduce_start(buf, op)?.wait()
    }

    /// Every rank's `buf` becomes rank `root`'s.
    fn broadcast(&self, buf: HostData, root: usize) -> Result<HostData>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;
}

/// The first failure of a communicator, which refuses every operation after it.
pub(crate) type Poison = Arc<Mutex<Option<String>>>;

/// An operation started by [`Communicator::all_reduce_start`].
#[derive(Debug)]
#[must_use = "an all-reduce's result comes back through `wait`"]
pub struct Pending {
    state: State,
}

#[derive(Debug)]
enum State {
    Done(Option<Result<HostData>>),
    Waiting {
        rx: Receiver<Result<HostData>>,
        op: &'static str,
        rank: usize,
        world: usize,
        started: Instant,
        timeout: Duration,
        poison: Poison,
    },
}

impl Pending {
    /// An operation already complete (the world of one process).
    pub fn ready(result: Result<HostData>) -> Pending {
        Pending {
            state: State::Done(Some(result)),
        }
    }

    /// An operation a transport's worker completes by sending its result through `rx`.
    pub(crate) fn waiting(
        rx: Receiver<Result<HostData>>,
        op: &'static str,
        (rank, world): (usize, usize),
        timeout: Duration,
        poison: Poison,
    ) -> Pending {
        Pending {
            state: State::Waiting {
                rx,
                op,
                rank,
                world,
                started: Instant::now(),
                timeout,
                poison,
            },
        }
    }

    /// Whether it has completed (waiting would not block).
    pub fn is_done(&mut self) -> bool {
        if let State::Waiting { rx, .. } = &self.state {
            match rx.try_recv() {
                Ok(r) => self.state = State::Done(Some(r)),
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => return true,
            }
        }
        true
    }

    /// The result: the reduced elements, or the failure — [`DistError::Timeout`] once the
    /// communicator's timeout has passed since the operation started.
    pub fn wait(self) -> Result<HostData> {
        match self.state {
            State::Done(r) => r.unwrap_or_else(|| {
                Err(DistError::Backend {
                    op: "wait",
                    what: "the result was already taken".into(),
                })
            }),
            State::Waiting {
                rx,
                op,
                rank,
                world,
                started,
                timeout,
                poison,
            } => {
                let left = timeout.saturating_sub(started.elapsed());
                match rx.recv_timeout(left) {
                    Ok(r) => r,
                    Err(RecvTimeoutError::Timeout) => {
                        let e = DistError::Timeout {
                            op,
                            rank,
                            world,
                            secs: timeout.as_secs_f64(),
                        };
                        let mut first = poison.lock().unwrap_or_else(|e| e.into_inner());
                        first.get_or_insert_with(|| e.to_string());
                        Err(e)
                    }
                    Err(RecvTimeoutError::Disconnected) => Err(DistError::Backend {
                        op,
                        what: "the communication thread ended without an answer".into(),
                    }),
                }
            }
        }
    }
}

/// The world of one process: rank 0 of 1. Reductions give the elements back as they are
/// (the mean of one is itself, exactly); nothing waits. What a data-parallel program runs on
/// when it is not launched by `mpirun`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Local;

impl Communicator for Local {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn backend(&self) -> &'static str {
        "local"
    }

    fn all_reduce_start(&self, buf: HostData, _op: Reduce) -> Result<Pending> {
        Ok(Pending::ready(Ok(buf)))
    }

    fn broadcast(&self, buf: HostData, root: usize) -> Result<HostData> {
        check_root("broadcast", root, 1)?;
        Ok(buf)
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

/// Refuses a root outside the world.
pub(crate) fn check_root(op: &'static str, root: usize, world: usize) -> Result<()> {
    if root >= world {
        return Err(DistError::BadArgument {
            op,
            what: format!("root rank {root} is outside a world of {world}"),
        });
    }
    Ok(())
}

#[cfg(feature = "mpi")]
/// Combines the ranks' elements laid end to end in `gathered` (rank 0's first) into `out`, in
/// rank order whatever the transport's algorithm: the same bits on every rank, every run.
pub(crate) fn reduce_in_rank_order<T>(gathered: &[T], out: &mut [T], op: Reduce)
where
    T: Copy + PartialOrd + std::ops::Add<Output = T>,
{
    let n = out.len();
    out.copy_from_slice(&gathered[..n]);
    for part in gathered.chunks_exact(n.max(1)).skip(1) {
        for (o, &v) in out.iter_mut().zip(part) {
            *o = match op {
                Reduce::Sum | Reduce::Mean => *o + v,
                // NaN wins, as in a reduction that propagates it.
                Reduce::Max => {
                    if v > *o || v.partial_cmp(&v).is_none() {
                        v
                    } else {
                        *o
                    }
                }
                Reduce::Min => {
                    if v < *o || v.partial_cmp(&v).is_none() {
                        v
                    } else {
                        *o
                    }
                }
            };
        }
    }
}

/// Divides a sum by the number of ranks, for [`Reduce::Mean`].
pub(crate) fn divide(buf: &mut HostData, world: usize) {
    match buf {
        HostData::F32(v) => {
            let w = world as f32;
            v.iter_mut().for_each(|x| *x /= w);
        }
        HostData::F64(v) => {
            let w = world as f64;
            v.iter_mut().for_each(|x| *x /= w);
        }
        HostData::BF16(v) => divide_half(v, world),
        HostData::F16(v) => divide_half(v, world),
        // Integer sums divide as PyTorch's integer division does, toward zero.
        HostData::I64(v) => v.iter_mut().for_each(|x| *x /= world as i64),
        HostData::I32(v) => v.iter_mut().for_each(|x| *x /= world as i32),
        HostData::U8(v) => v
            .iter_mut()
            .for_each(|x| *x = (u64::from(*x) / world as u64) as u8),
        HostData::Bool(_) => {}
    }
}

/// [`divide`] for a 16-bit buffer: in f32, rounded once.
fn divide_half<T: Storage>(v: &mut [T], world: usize) {
    let w = world as f32;
    v.iter_mut()
        .for_each(|x| *x = T::narrow(f64::from(x.widen() as f32 / w)));
}

/// Runs `f` on a 16-bit buffer's values widened to f32 (exactly) and rounds its result back
/// into the buffer (once per element): how transports without 16-bit reductions reduce one.
pub(crate) fn through_f32<T: Storage>(
    v: &mut [T],
    f: impl FnOnce(&mut [f32]) -> std::result::Result<(), String>,
) -> std::result::Result<(), String> {
    let mut wide = arenagrad_graph::widened(v);
    f(&mut wide)?;
    arenagrad_graph::convert(&wide, v, 1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_integer_mean_divides_toward_zero_by_the_world() {
        let mut v = HostData::U8(vec![255, 7, 0]);
        divide(&mut v, 300);
        assert_eq!(v, HostData::U8(vec![0, 0, 0]));
        let mut v = HostData::U8(vec![255, 7]);
        divide(&mut v, 2);
        assert_eq!(v, HostData::U8(vec![127, 3]));
        let mut v = HostData::I64(vec![-7, 9]);
        divide(&mut v, 2);
        assert_eq!(v, HostData::I64(vec![-3, 4]));
    }
}
