//! Parked worker threads for the parallel kernels.
//!
//! Spawning and joining an OS thread costs tens of microseconds — a tenth of a small training
//! step when every GEMM and large elementwise map forks. [`fork`] instead hands its tasks to a
//! few workers that sleep on a condition variable between calls. The workers are started on the
//! first parallel call, only as many as the largest fork asked for (a graph with one thread never
//! starts any), and the number of threads a kernel uses is still the caller's choice. An idle
//! worker, and a fork waiting for its tasks, spin for a couple of microseconds, then yield the
//! core between checks for a millisecond, then sleep ([`super::wait`]): they never keep a core
//! from the thread they wait for, or from the application's and other processes' threads.
//!
//! A fork borrows its closure from the caller's stack. That is sound because [`fork`] returns only
//! after every task of the call has finished — it waits on a latch, also when a task or the
//! caller's own share panics — and while it waits it runs queued tasks itself, so nested or
//! concurrent forks cannot deadlock for want of a free worker.

use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use super::wait::{Backoff, Stage};

/// The work of one fork: called once with each task index.
type Work = dyn Fn(usize) + Sync;

/// Counts a fork's outstanding tasks.
struct Latch {
    /// Tasks not yet finished, and whether one panicked.
    state: Mutex<(usize, bool)>,
    done: Condvar,
    /// The count of `state`, readable without the lock (for spinning).
    left: AtomicUsize,
}

/// One call of a fork's closure.
struct Task {
    work: *const Work,
    index: usize,
    latch: Arc<Latch>,
}

// SAFETY: `work` points at a `Sync` closure that the forking call keeps alive until every task
// referring to it has run (`fork` waits on the task's latch before returning), so the pointer may
// travel to a worker and be called there.
unsafe impl Send for Task {}

/// Waits while `busy()` holds, spinning and then yielding the core (see [`super::wait`]), until
/// the wait is long enough to block on a condition variable instead.
fn wait_while(busy: impl Fn() -> bool) {
    let mut backoff = Backoff::new();
    while busy() && backoff.stage() != Stage::Sleep {}
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Tasks run under `catch_unwind` and never hold these locks, so poisoning cannot mean a
    // broken invariant.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Task {
    fn run(self) {
        // SAFETY: the closure outlives the task (see the `Send` impl).
        let work = unsafe { &*self.work };
        let ok = catch_unwind(AssertUnwindSafe(|| work(self.index))).is_ok();
        let mut st = lock(&self.latch.state);
        st.0 -= 1;
        st.1 |= !ok;
        self.latch.left.store(st.0, Ordering::Release);
        if st.0 == 0 {
            self.latch.done.notify_all();
        }
    }
}

struct Pool {
    queue: Mutex<VecDeque<Task>>,
    ready: Condvar,
    workers: Mutex<usize>,
    /// Tasks in the queue, readable without the lock (for spinning).
    queued: AtomicUsize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        queue: Mutex::new(VecDeque::new()),
        ready: Condvar::new(),
        workers: Mutex::new(0),
        queued: AtomicUsize::new(0),
    })
}

impl Pool {
    /// Starts workers until there are at least `n` (a failed spawn leaves fewer: the forking
    /// thread then runs the remaining tasks itself).
    fn ensure_workers(&'static self, n: usize) {
        let mut have = lock(&self.workers);
        while *have < n {
            let spawned = std::thread::Builder::new()
                .name(format!("arenagrad-worker-{}", *have))
                .spawn(move || self.work_forever());
            if spawned.is_err() {
                break;
            }
            *have += 1;
        }
    }

    fn pop(&self) -> Option<Task> {
        let mut q = lock(&self.queue);
        let t = q.pop_front();
        self.queued.store(q.len(), Ordering::Release);
        t
    }

    fn work_forever(&self) {
        loop {
            wait_while(|| self.queued.load(Ordering::Acquire) == 0);
            let task = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(t) = q.pop_front() {
                        self.queued.store(q.len(), Ordering::Release);
                        break t;
                    }
                    q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            task.run();
        }
    }
}

/// Runs `work(i)` for every `i` in `0..n`: index 0 on the calling thread, the others on parked
/// workers, returning when all are done. A panic in any of them is re-raised here.
pub fn fork(n: usize, work: &(dyn Fn(usize) + Sync)) {
    if n <= 1 {
        if n == 1 {
            work(0);
        }
        return;
    }
    if cfg!(miri) && std::env::var_os("ARENAGRAD_MIRI_POOL").is_none() {
        // Miri wants every thread joined before the program ends: scoped threads there, unless
        // the pool itself is under test (CI runs its tests under Miri with
        // `ARENAGRAD_MIRI_POOL=1` and `-Zmiri-ignore-leaks`, the parked workers being the leak).
        std::thread::scope(|s| {
            for i in 1..n {
                s.spawn(move || work(i));
            }
            work(0);
        });
        return;
    }
    #[cfg(feature = "rayon")]
    if use_rayon() {
        return rayon_fork(n, work);
    }
    let p = pool();
    p.ensure_workers(n - 1);
    let latch = Arc::new(Latch {
        state: Mutex::new((n - 1, false)),
        done: Condvar::new(),
        left: AtomicUsize::new(n - 1),
    });
    // SAFETY: only the lifetime bound of the trait object changes. The pointer is used by this
    // call's tasks alone, and this function does not return (normally or by unwinding) before
    // the latch says that every one of them has finished.
    let ptr: *const Work =
        unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Work>(work) };
    {
        let mut q = lock(&p.queue);
        for index in 1..n {
            q.push_back(Task {
                work: ptr,
                index,
                latch: latch.clone(),
            });
        }
        p.queued.store(q.len(), Ordering::Release);
    }
    p.ready.notify_all();
    let first = catch_unwind(AssertUnwindSafe(|| work(0)));
    // Help with queued work (ours or another fork's) until ours is done.
    loop {
        if latch.left.load(Ordering::Acquire) == 0 {
            break;
        }
        match p.pop() {
            Some(t) => t.run(),
            None => {
                wait_while(|| latch.left.load(Ordering::Acquire) > 0);
                let mut st = lock(&latch.state);
                while st.0 > 0 {
                    st = latch.done.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                break;
            }
        }
    }
    let panicked = lock(&latch.state).1;
    if let Err(e) = first {
        resume_unwind(e);
    }
    assert!(!panicked, "a parallel kernel task panicked");
}

/// Whether forks go to rayon's global pool instead (feature `rayon` and `ARENAGRAD_POOL=rayon`,
/// read once): the alternative `docs/performance.md` measures this pool against.
#[cfg(feature = "rayon")]
fn use_rayon() -> bool {
    static RAYON: OnceLock<bool> = OnceLock::new();
    *RAYON.get_or_init(|| std::env::var("ARENAGRAD_POOL").as_deref() == Ok("rayon"))
}

/// [`fork`] on rayon: tasks 1.. spawned into a scope (which, like [`fork`], returns only when
/// all have finished and re-raises a panic), task 0 on the calling thread.
#[cfg(feature = "rayon")]
fn rayon_fork(n: usize, work: &(dyn Fn(usize) + Sync)) {
    rayon::scope(|s| {
        for i in 1..n {
            s.spawn(move |_| work(i));
        }
        work(0);
    });
}

/// Runs `f(i, part)` for each of `parts` in parallel (each part on its own task).
pub fn for_each_part<T: Send>(parts: Vec<&mut [T]>, f: impl Fn(usize, &mut [T]) + Sync) {
    for_each_owned(parts, |i, part| f(i, part));
}

/// [`for_each_part`] over parts of any kind (a thread's list of slices, say): `f(i, &mut
/// parts[i])` on its own thread for each `i`.
pub fn for_each_owned<P: Send>(parts: Vec<P>, f: impl Fn(usize, &mut P) + Sync) {
    let cells: Vec<Mutex<P>> = parts.into_iter().map(Mutex::new).collect();
    fork(cells.len(), &|i| {
        let mut part = lock(&cells[i]);
        f(i, &mut part)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_index_runs_once_and_borrows_work() {
        let hits: Vec<AtomicUsize> = (0..7).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..20 {
            fork(7, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
        }
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 20));
        let mut v = vec![0u32; 10];
        let parts: Vec<&mut [u32]> = v.chunks_mut(3).collect();
        for_each_part(parts, |i, p| p.iter_mut().for_each(|x| *x = i as u32 + 1));
        assert_eq!(v, [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]);
    }

    #[test]
    fn forks_from_many_threads_and_nested_forks_finish() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10 {
                        fork(3, &|_| {
                            fork(2, &|_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 10 * 3 * 2);
    }

    #[cfg(feature = "rayon")]
    #[test]
    fn the_rayon_fork_runs_every_index_once() {
        let hits: Vec<AtomicUsize> = (0..5).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..20 {
            rayon_fork(5, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
        }
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 20));
    }

    #[test]
    fn a_panicking_task_is_reraised_after_all_finish() {
        let ran = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fork(4, &|i| {
                ran.fetch_add(1, Ordering::SeqCst);
                assert!(i != 2, "task 2 fails");
            })
        }));
        assert!(r.is_err());
        assert_eq!(ran.load(Ordering::SeqCst), 4);
        // The pool still works.
        let after = AtomicUsize::new(0);
        fork(3, &|_| {
            after.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(after.load(Ordering::SeqCst), 3);
    }
}
