//! Threads that advance through a sequence of units together, for recurrences whose every step
//! needs all of the step before.
//!
//! A recurrent layer's step `s` reads the whole hidden state of step `s − 1`; split by hidden
//! units over two threads, each thread computes its own units' part of every step, and the two
//! meet once a step. Keeping the split fixed for the whole sequence keeps each thread's share of
//! the recurrent weight in its own core's cache, where a fork per step (tasks taken by whichever
//! worker is free) would not, and costs a few hundred nanoseconds a step rather than a fork's
//! microseconds.
//!
//! [`lockstep`] runs `work(slot, unit)` for every slot and every unit, unit `u` of every slot
//! finished before unit `u + 1` of any slot starts. Slot `q`'s units normally run on task `q`
//! of one [`fork`](super::thread_pool::fork). Nothing depends on those tasks running at the same
//! time, though: a task waiting for a slot whose task has not started, or has stopped answering
//! for a while (a busy pool, a descheduled thread), claims that slot's unit and runs it itself.
//! Each (slot, unit) is claimed once, so the work is the same whichever thread does it; results
//! never depend on the schedule, only where the cache lines end up does.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a task waits for a slot whose own task is running before taking the slot's unit
/// over: far above a step's length, so that it happens only when that task has been stopped.
const PATIENCE: Duration = Duration::from_millis(2);

/// How long a task waits, once, for a slot whose task has not started yet (a worker wakes in
/// microseconds when idle; one that is busy elsewhere may not come at all).
const FIRST_PATIENCE: Duration = Duration::from_micros(200);

/// The shared progress of one [`lockstep`] call.
struct Progress {
    /// Per slot: the next unit not yet claimed.
    claimed: Vec<AtomicUsize>,
    /// Per slot: units finished.
    done: Vec<AtomicUsize>,
    /// Per slot: whether its own task has started.
    started: Vec<AtomicBool>,
    /// A unit panicked: everyone stops waiting.
    failed: AtomicBool,
    /// The first panic's payload, re-raised by [`lockstep`] once every task has stopped.
    payload: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Progress {
    /// Runs unit `u` of slot `q` unless another task has claimed it.
    fn try_run(&self, q: usize, u: usize, work: &(dyn Fn(usize, usize) + Sync)) {
        if self.claimed[q]
            .compare_exchange(u, u + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            match catch_unwind(AssertUnwindSafe(|| work(q, u))) {
                Ok(()) => self.done[q].store(u + 1, Ordering::Release),
                Err(p) => {
                    let mut first = self.payload.lock().unwrap_or_else(|e| e.into_inner());
                    first.get_or_insert(p);
                    self.failed.store(true, Ordering::Release);
                }
            }
        }
    }

    /// Returns once slot `q` has finished unit `u` (or a unit failed), running it here if its
    /// task does not come.
    fn wait(&self, q: usize, u: usize, work: &(dyn Fn(usize, usize) + Sync)) {
        let mut since: Option<Instant> = None;
        let mut turns = 0u32;
        while self.done[q].load(Ordering::Acquire) <= u {
            if self.failed.load(Ordering::Acquire) {
                return;
            }
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(64) {
                let now = Instant::now();
                let t0 = *since.get_or_insert(now);
                let patience = if self.started[q].load(Ordering::Acquire) {
                    PATIENCE
                } else if u > 0 {
                    // Absent since before the last unit: do not wait again.
                    Duration::ZERO
                } else {
                    FIRST_PATIENCE
                };
                if cfg!(miri) || now - t0 >= patience {
                    self.try_run(q, u, work);
                }
            }
            std::hint::spin_loop();
        }
    }
}

/// Runs `work(slot, unit)` for every `slot` in `0..slots` and `unit` in `0..units`: every
/// slot's unit `u` finishes before any slot's unit `u + 1` starts, and writes made by one unit
/// are visible to every later one. Each slot's units normally run on one thread of its own (slot
/// 0 on the caller's). A panic in a unit stops the rest and is re-raised here.
pub fn lockstep(slots: usize, units: usize, work: &(dyn Fn(usize, usize) + Sync)) {
    if slots <= 1 {
        for u in 0..units {
            for q in 0..slots {
                work(q, u);
            }
        }
        return;
    }
    let p = Progress {
        claimed: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
        done: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
        started: (0..slots).map(|_| AtomicBool::new(false)).collect(),
        failed: AtomicBool::new(false),
        payload: Mutex::new(None),
    };
    // Units run under `catch_unwind` (in `try_run`), so the tasks themselves do not panic and
    // the first unit's own panic is re-raised here, not the pool's report of a failed task.
    super::thread_pool::fork(slots, &|me| {
        p.started[me].store(true, Ordering::Release);
        for u in 0..units {
            if p.failed.load(Ordering::Acquire) {
                return;
            }
            p.try_run(me, u, work);
            for q in 0..slots {
                p.wait(q, u, work);
            }
        }
    });
    let first = p.payload.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = first {
        resume_unwind(e);
    }
}

/// A slice that the slots of a [`lockstep`] call write in disjoint parts and read after the
/// unit that wrote them: the buffers a recurrence shares between its threads.
pub(crate) struct Shared<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: `Shared` hands out access only through its `unsafe` methods, whose callers promise
// that no two threads touch the same element at once except to read it, with the ordering
// `lockstep` provides between units; `T: Send + Sync` values may be shared across threads so.
unsafe impl<T: Send + Sync> Sync for Shared<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Send for Shared<'_, T> {}

impl<'a, T> Shared<'a, T> {
    pub(crate) fn new(s: &'a mut [T]) -> Self {
        Shared {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Elements `at..at + n` to write.
    ///
    /// # Safety
    /// While the returned slice lives, no other thread may read or write these elements, and
    /// no other slice over them may be live on this thread.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part_mut(&self, at: usize, n: usize) -> &mut [T] {
        assert!(
            at <= self.len && n <= self.len - at,
            "invariant: shared part out of bounds"
        );
        // SAFETY: in bounds (checked), and exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), n) }
    }

    /// Elements `at..at + n` to read.
    ///
    /// # Safety
    /// While the returned slice lives, no thread may write these elements.
    pub(crate) unsafe fn part(&self, at: usize, n: usize) -> &[T] {
        assert!(
            at <= self.len && n <= self.len - at,
            "invariant: shared part out of bounds"
        );
        // SAFETY: in bounds (checked), and not written meanwhile by the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr.add(at), n) }
    }
}

/// A zeroed buffer whose first element starts a cache line: threads writing neighbouring parts
/// of it share no line but at the parts' own edges (a line written from two cores bounces
/// between them at every write).
pub(crate) struct LineAligned<T> {
    v: Vec<T>,
    at: usize,
    len: usize,
}

impl<T: crate::Float> LineAligned<T> {
    pub(crate) fn zeros(len: usize) -> Self {
        let spare = 64 / std::mem::size_of::<T>();
        let v = vec![T::ZERO; len + spare];
        let at = v.as_ptr().align_offset(64).min(spare);
        LineAligned { v, at, len }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.v[self.at..self.at + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (slot, unit) runs once, and no unit starts before every slot finished the one
    /// before: each unit checks that the others have all written the previous one.
    #[test]
    fn units_run_once_and_in_lockstep() {
        for slots in [1, 2, 3] {
            let units = if cfg!(miri) { 4 } else { 200 };
            let log: Vec<AtomicUsize> = (0..slots).map(|_| AtomicUsize::new(0)).collect();
            let runs = AtomicUsize::new(0);
            lockstep(slots, units, &|q, u| {
                for (o, l) in log.iter().enumerate() {
                    let seen = l.load(Ordering::Acquire);
                    assert!(
                        seen == u || (o != q && seen == u + 1),
                        "slot {q} unit {u} saw slot {o} at {seen}"
                    );
                }
                log[q].store(u + 1, Ordering::Release);
                runs.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(runs.load(Ordering::Relaxed), slots * units);
            assert!(log.iter().all(|l| l.load(Ordering::Relaxed) == units));
        }
    }

    /// A slot whose own task cannot start (the pool's workers are all held by the caller's
    /// other forks) is run by the others: no deadlock, every unit once.
    #[test]
    fn finishes_when_a_slot_task_never_starts() {
        // Occupy the pool: a fork whose tasks each run a lockstep of their own, so the tasks
        // of the inner locksteps queue behind busy workers.
        let total = AtomicUsize::new(0);
        let units = if cfg!(miri) { 3 } else { 50 };
        super::super::thread_pool::fork(3, &|_| {
            lockstep(2, units, &|_, _| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 2 * units);
    }

    #[test]
    fn a_panicking_unit_is_reraised_without_hanging() {
        let ran = Mutex::new(Vec::new());
        let r = catch_unwind(AssertUnwindSafe(|| {
            lockstep(2, 10, &|q, u| {
                ran.lock().unwrap().push((q, u));
                assert!(!(q == 1 && u == 3), "unit 3 of slot 1 fails");
            })
        }));
        // The unit's own panic, not the pool's report of a failed task.
        let payload = r.unwrap_err();
        let msg = payload
            .downcast_ref::<&str>()
            .copied()
            .or(payload.downcast_ref::<String>().map(String::as_str));
        assert_eq!(msg, Some("unit 3 of slot 1 fails"));
        let ran = ran.into_inner().unwrap();
        assert!(ran.iter().all(|&(_, u)| u <= 4), "{ran:?}");
    }
}
