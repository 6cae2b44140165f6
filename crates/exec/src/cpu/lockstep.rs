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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::wait::Backoff;

/// How long a task waits for a slot's unit that nobody has claimed, while the slot's own task
/// has started but not yet come to that unit, before running it itself. A running task comes to
/// its next unit within a microsecond or two of the last meeting (it waits for it too, and its
/// waits spin, then yield); one that has not come after this long has lost its core (other
/// processes, the application's own threads, a quota), and the unit would otherwise wait for a
/// scheduler's slice, milliseconds. While the same task stays away, its later units are taken
/// without waiting.
const PATIENCE: Duration = Duration::from_micros(30);

/// How long a task waits, once, for a slot whose task has not started yet (a worker wakes in
/// microseconds when idle; one that is busy elsewhere may not come at all).
const FIRST_PATIENCE: Duration = Duration::from_micros(200);

/// The shared progress of one [`lockstep`] call.
struct Progress {
    /// Per slot: the next unit not yet claimed.
    claimed: Vec<AtomicUsize>,
    /// Per slot: units finished.
    done: Vec<AtomicUsize>,
    /// Per slot: one more than the unit its own task has come to (0: not started).
    arrived: Vec<AtomicUsize>,
    /// Units run by a task other than their slot's own.
    stood_in: AtomicUsize,
    /// A unit panicked: everyone stops waiting.
    failed: AtomicBool,
    /// The first panic's payload, re-raised by [`lockstep`] once every task has stopped.
    payload: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Progress {
    /// Runs unit `u` of slot `q` unless another task has claimed it; whether it ran here.
    fn try_run(&self, q: usize, u: usize, work: &(dyn Fn(usize, usize) + Sync)) -> bool {
        if self.claimed[q]
            .compare_exchange(u, u + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        match catch_unwind(AssertUnwindSafe(|| work(q, u))) {
            Ok(()) => self.done[q].store(u + 1, Ordering::Release),
            Err(p) => {
                let mut first = self.payload.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert(p);
                self.failed.store(true, Ordering::Release);
            }
        }
        true
    }

    /// Returns once slot `q` has finished unit `u` (or a unit failed), running it here if its
    /// task does not come. `away[q]` is where slot `q`'s task was (its `arrived`) when this task
    /// last ran a unit of `q` for it: while the task is still there, it is still away.
    fn wait(
        &self,
        q: usize,
        u: usize,
        away: &mut [Option<usize>],
        work: &(dyn Fn(usize, usize) + Sync),
    ) {
        let mut backoff = Backoff::new();
        while self.done[q].load(Ordering::Acquire) <= u {
            if self.failed.load(Ordering::Acquire) {
                return;
            }
            // Unclaimed, and its own task has not come to it yet.
            let at = self.arrived[q].load(Ordering::Acquire);
            if self.claimed[q].load(Ordering::Acquire) == u && at <= u {
                let patience = if away[q] == Some(at) || (at == 0 && u > 0) {
                    // Still away since this task last stood in for it, or absent since before
                    // the last unit: do not wait again.
                    Duration::ZERO
                } else if at == 0 {
                    FIRST_PATIENCE
                } else {
                    PATIENCE
                };
                if (cfg!(miri) || backoff.elapsed() >= patience) && self.try_run(q, u, work) {
                    away[q] = Some(at);
                    // A task that has not started is a worker waking up (tens of microseconds,
                    // more on a virtual machine): only one that started and fell behind counts.
                    if at > 0 {
                        self.stood_in.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
            }
            backoff.snooze();
        }
    }
}

/// Runs `work(slot, unit)` for every `slot` in `0..slots` and `unit` in `0..units`: every
/// slot's unit `u` finishes before any slot's unit `u + 1` starts, and writes made by one unit
/// are visible to every later one. Each slot's units normally run on one thread of its own (slot
/// 0 on the caller's). A panic in a unit stops the rest and is re-raised here.
///
/// When a recent call had to stand in for absent threads again and again (the process has fewer
/// cores than threads for now: other processes, its own busy threads, a quota), calls for the
/// next [`ALONE_FOR`] run every slot on the calling thread instead: the same units in the same
/// order, so the same results, without meetings that wait for a thread the scheduler is not
/// running. A call after that window tries the threads again.
pub fn lockstep(slots: usize, units: usize, work: &(dyn Fn(usize, usize) + Sync)) {
    if slots <= 1 || cores_short() {
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
        arrived: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
        stood_in: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        payload: Mutex::new(None),
    };
    // Units run under `catch_unwind` (in `try_run`), so the tasks themselves do not panic and
    // the first unit's own panic is re-raised here, not the pool's report of a failed task.
    super::thread_pool::fork(slots, &|me| {
        let mut away = vec![None; slots];
        for u in 0..units {
            if p.failed.load(Ordering::Acquire) {
                return;
            }
            p.arrived[me].store(u + 1, Ordering::Release);
            p.try_run(me, u, work);
            for q in 0..slots {
                p.wait(q, u, &mut away, work);
            }
        }
    });
    // Standing in for more than one unit in sixteen of the other slots' (two at least) means
    // their threads were missing for long stretches; twice in a row, that it was no hiccup (a
    // quiet machine's timer interrupt, a virtual machine's pause).
    let stood_in = p.stood_in.load(Ordering::Relaxed);
    if stood_in >= 2 && stood_in * 16 > units * (slots - 1) {
        if SHORT_STREAK.fetch_add(1, Ordering::Relaxed) >= 1 {
            note_cores_short();
        }
    } else {
        SHORT_STREAK.store(0, Ordering::Relaxed);
    }
    let first = p.payload.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = first {
        resume_unwind(e);
    }
}

/// How long [`lockstep`] keeps to the calling thread once its threads were found missing.
pub const ALONE_FOR: Duration = Duration::from_millis(50);

/// Nanoseconds since [`epoch`] until which [`lockstep`] runs on the calling thread alone.
static ALONE_UNTIL: AtomicU64 = AtomicU64::new(0);

/// Calls in a row that stood in for their slots' tasks often.
static SHORT_STREAK: AtomicUsize = AtomicUsize::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Whether a recent call found the process short of cores (within [`ALONE_FOR`]). Never in
/// this crate's unit tests, which run many locksteps at once on purpose and must exercise the
/// threads every time.
fn cores_short() -> bool {
    let until = ALONE_UNTIL.load(Ordering::Relaxed);
    !cfg!(test) && until != 0 && now_ns() < until
}

fn note_cores_short() {
    let until = now_ns().saturating_add(ALONE_FOR.as_nanos() as u64);
    ALONE_UNTIL.fetch_max(until, Ordering::Relaxed);
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
    fn the_window_alone_opens_and_closes() {
        let before = ALONE_UNTIL.load(Ordering::Relaxed);
        note_cores_short();
        let until = ALONE_UNTIL.load(Ordering::Relaxed);
        assert!(until >= now_ns() && until > before);
        assert!(until <= now_ns() + ALONE_FOR.as_nanos() as u64);
        // A later note never shortens the window.
        ALONE_UNTIL.fetch_max(1, Ordering::Relaxed);
        assert_eq!(ALONE_UNTIL.load(Ordering::Relaxed), until);
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
