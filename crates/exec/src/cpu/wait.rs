//! How the engine's threads wait for each other: a short spin, then yielding the core, then
//! sleeping.
//!
//! A thread that waits for another (a fork for its tasks, an idle worker for the next fork, a
//! recurrence's thread for its partner's half of a step) must notice the event within a
//! microsecond or two on a quiet machine, and must not take the core from the thread it waits for
//! when the cores are shared: with other processes, with the application's own threads, or with a
//! quota smaller than the thread count. A pure spin gets the first right and the second badly
//! wrong: on two cores shared with a second busy process, a waiter spinning for a thread that the
//! scheduler put on the waiter's own core (Linux places a woken thread beside its waker when the
//! other cores are busy) burns the whole slice that thread needed, and a recurrence of 128
//! meetings slowed down 45×.
//!
//! [`Backoff`] is OpenMP's answer (`KMP_BLOCKTIME`: spin, then sleep) with a yielding stage in
//! between, as crossbeam's `Backoff` has: it spins a few hundred nanoseconds (the other thread is
//! usually running and almost done), then calls `sched_yield` between checks — on a quiet core
//! that returns at once, so the waiter still notices within a couple of microseconds, and on a
//! shared core it hands the core to whoever else is ready, often the very thread waited for —
//! and after [`BLOCK_TIME`] it tells the caller to sleep (a condition variable, or a short timed
//! park where nothing signals). No wait in the engine spins without bound.

use std::time::{Duration, Instant};

/// How long a waiter spins before it starts yielding: long enough to catch a partner that is
/// running and about to finish (a step of a recurrence hands over every few microseconds), short
/// against a scheduler's slice.
pub const SPIN_TIME: Duration = Duration::from_micros(2);

/// How long a waiter keeps checking (spinning, then yielding) before it sleeps: kernels of one
/// training step come microseconds to a millisecond apart, and waking a sleeping thread costs
/// tens of microseconds, more on a shared virtual machine.
pub const BLOCK_TIME: Duration = Duration::from_millis(1);

/// The longest a timed sleep of [`Backoff::snooze`] lasts (its sleeps double from 20 µs up to
/// this): the wake-up latency of a waiter with no one to signal it, once it has waited long.
const MAX_NAP: Duration = Duration::from_micros(500);

/// What [`Backoff::snooze`] did, or what the caller should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Spinning: the event is expected within a microsecond or two.
    Spin,
    /// Yielding the core between checks.
    Yield,
    /// Past [`BLOCK_TIME`]: block on a condition variable, or nap (a timed sleep).
    Sleep,
}

/// The state of one wait: call [`Backoff::snooze`] (or [`Backoff::stage`]) between checks of
/// the condition waited for.
#[derive(Debug)]
pub struct Backoff {
    start: Instant,
    turns: u32,
    nap: Duration,
    stage: Stage,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// A wait that starts now.
    pub fn new() -> Self {
        Backoff {
            start: Instant::now(),
            turns: 0,
            nap: Duration::from_micros(20),
            // Miri: no spinning or yielding (it would only slow the interpreter down).
            stage: if cfg!(miri) {
                Stage::Sleep
            } else {
                Stage::Spin
            },
        }
    }

    /// How long this wait has lasted.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Advances the wait by one turn without sleeping: spins or yields as its stage says, and
    /// returns the stage it is in. A caller with a condition variable blocks on it once this
    /// returns [`Stage::Sleep`].
    pub fn stage(&mut self) -> Stage {
        self.turns = self.turns.wrapping_add(1);
        match self.stage {
            Stage::Spin => {
                std::hint::spin_loop();
                // The clock is read every 16 turns (a turn is tens of nanoseconds).
                if self.turns.is_multiple_of(16) && self.start.elapsed() >= SPIN_TIME {
                    self.stage = Stage::Yield;
                }
            }
            Stage::Yield => {
                std::thread::yield_now();
                if self.start.elapsed() >= BLOCK_TIME {
                    self.stage = Stage::Sleep;
                }
            }
            Stage::Sleep => {}
        }
        self.stage
    }

    /// One turn of a wait that nothing will signal: spins or yields as [`Backoff::stage`], and
    /// past [`BLOCK_TIME`] sleeps, for 20 µs at first and twice as long each time up to 0.5 ms.
    pub fn snooze(&mut self) -> Stage {
        let stage = self.stage();
        if stage == Stage::Sleep {
            std::thread::sleep(self.nap);
            self.nap = (self.nap * 2).min(MAX_NAP);
        }
        stage
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn stages_follow_each_other_in_time() {
        let mut b = Backoff::new();
        let mut seen = vec![b.stage()];
        while *seen.last().unwrap() != Stage::Sleep {
            let s = b.stage();
            if s != *seen.last().unwrap() {
                seen.push(s);
            }
        }
        if cfg!(miri) {
            assert_eq!(seen, [Stage::Sleep]);
        } else {
            assert_eq!(seen, [Stage::Spin, Stage::Yield, Stage::Sleep]);
            assert!(b.elapsed() >= BLOCK_TIME);
        }
    }

    #[test]
    fn snoozing_sees_another_threads_flag() {
        let flag = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(5));
                flag.store(true, Ordering::Release);
            });
            let mut b = Backoff::new();
            while !flag.load(Ordering::Acquire) {
                b.snooze();
            }
        });
        assert!(flag.load(Ordering::Acquire));
    }
}
