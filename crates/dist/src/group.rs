//! [`ProcessGroup`]: a communicator whose transport runs on a thread of its own.
//!
//! MPI and NCCL calls block; data-parallel training wants them to run while backward goes on.
//! So each transport lives on one communication thread (which also initialises it: MPI's
//! "funneled" mode, where one thread makes every call), taking operations from a queue in
//! the order started — the order every rank starts them in — and sending each result back. The
//! caller waits on its result with a deadline, so a dead peer is an error after the timeout
//! rather than a hang.

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arenagrad_graph::HostData;

use crate::comm::{check_root, divide, Communicator, Pending, Poison, Reduce};
use crate::error::{DistError, Result};

/// `ARENAGRAD_DIST_TIMEOUT` (seconds), else 300 s.
pub(crate) fn default_timeout() -> Duration {
    std::env::var("ARENAGRAD_DIST_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(Duration::from_secs(300), Duration::from_secs_f64)
}

/// What a transport does, on its communication thread.
pub(crate) trait Transport {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world_size(&self) -> usize;
    /// Sums (or takes the largest or smallest of) the ranks' `buf` into `buf`; `Mean` comes
    /// here as `Sum` and is divided afterwards.
    fn all_reduce(&mut self, buf: &mut HostData, op: Reduce) -> Result<(), String>;
    /// Rank `root`'s `buf` into every rank's.
    fn broadcast(&mut self, buf: &mut HostData, root: usize) -> Result<(), String>;
    /// Waits for every rank.
    fn barrier(&mut self) -> Result<(), String>;
}

enum Job {
    AllReduce(Reduce),
    Broadcast(usize),
    Barrier,
}

struct Request {
    job: Job,
    buf: HostData,
    reply: Sender<Result<HostData>>,
}

/// A communicator over MPI (`ProcessGroup::mpi`, feature `mpi`) or NCCL
/// (`ProcessGroup::nccl`, feature `nccl`), its transport on a communication thread of its own.
/// Dropping it shuts the transport down (MPI's finalize) once the queue is done.
pub struct ProcessGroup {
    backend: &'static str,
    rank: usize,
    world: usize,
    timeout: Duration,
    queue: Mutex<Option<Sender<Request>>>,
    poison: Poison,
    finished: Mutex<Option<mpsc::Receiver<()>>>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("backend", &self.backend)
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl ProcessGroup {
    /// Starts the communication thread, where `make` starts the transport; waits up to
    /// `timeout` for it to come up (every rank starts together).
    pub(crate) fn start<T, F>(backend: &'static str, timeout: Duration, make: F) -> Result<Self>
    where
        T: Transport,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let (queue, jobs) = mpsc::channel::<Request>();
        let (up_tx, up) = mpsc::channel::<Result<(usize, usize)>>();
        let (done_tx, finished) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name(format!("arenagrad-{backend}"))
            .spawn(move || {
                let mut t = match make() {
                    Ok(t) => t,
                    Err(e) => {
                        let _ = up_tx.send(Err(e));
                        return;
                    }
                };
                let world = t.world_size();
                let _ = up_tx.send(Ok((t.rank(), world)));
                for Request {
                    job,
                    mut buf,
                    reply,
                } in jobs
                {
                    let (op, r) = match job {
                        Job::AllReduce(op) => {
                            let sum = if op == Reduce::Mean { Reduce::Sum } else { op };
                            let r = t.all_reduce(&mut buf, sum);
                            if r.is_ok() && op == Reduce::Mean {
                                divide(&mut buf, world);
                            }
                            ("all_reduce", r)
                        }
                        Job::Broadcast(root) => ("broadcast", t.broadcast(&mut buf, root)),
                        Job::Barrier => ("barrier", t.barrier()),
                    };
                    let _ = reply.send(
                        r.map(|()| buf)
                            .map_err(|what| DistError::Backend { op, what }),
                    );
                }
                // The queue is closed: the transport shuts down here (MPI_Finalize).
                drop(t);
                let _ = done_tx.send(());
            })
            .map_err(|e| DistError::Backend {
                op: "ProcessGroup::start",
                what: format!("cannot start the communication thread: {e}"),
            })?;
        let (rank, world) = match up.recv_timeout(timeout) {
            Ok(r) => r?,
            Err(_) => {
                return Err(DistError::Backend {
                    op: "ProcessGroup::start",
                    what: format!(
                        "{backend} did not start within {:.1} s",
                        timeout.as_secs_f64()
                    ),
                })
            }
        };
        Ok(ProcessGroup {
            backend,
            rank,
            world,
            timeout,
            queue: Mutex::new(Some(queue)),
            poison: Arc::new(Mutex::new(None)),
            finished: Mutex::new(Some(finished)),
        })
    }

    /// How long an operation may take before it is [`DistError::Timeout`].
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn submit(&self, op: &'static str, job: Job, buf: HostData) -> Result<Pending> {
        if let Some(first) = self
            .poison
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(DistError::Poisoned { op, first });
        }
        let (reply, rx) = mpsc::channel();
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let sent = queue
            .as_ref()
            .is_some_and(|q| q.send(Request { job, buf, reply }).is_ok());
        if !sent {
            return Err(DistError::Backend {
                op,
                what: "the communication thread has ended".into(),
            });
        }
        Ok(Pending::waiting(
            rx,
            op,
            (self.rank, self.world),
            self.timeout,
            Arc::clone(&self.poison),
        ))
    }
}

impl Communicator for ProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn backend(&self) -> &'static str {
        self.backend
    }

    fn all_reduce_start(&self, buf: HostData, op: Reduce) -> Result<Pending> {
        self.submit("all_reduce", Job::AllReduce(op), buf)
    }

    fn broadcast(&self, buf: HostData, root: usize) -> Result<HostData> {
        check_root("broadcast", root, self.world)?;
        self.submit("broadcast", Job::Broadcast(root), buf)?.wait()
    }

    fn barrier(&self) -> Result<()> {
        self.submit("barrier", Job::Barrier, HostData::F32(Vec::new()))?
            .wait()
            .map(|_| ())
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // Closing the queue lets the thread finish what is queued and shut the transport
        // down. A transport stuck in a failed collective never finishes: then do not wait.
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        let poisoned = self
            .poison
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if let Some(done) = self
            .finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let wait = if poisoned {
                Duration::ZERO
            } else {
                self.timeout
            };
            let _ = done.recv_timeout(wait);
        }
    }
}
