//! Per-chunk read/write locks on the level-0 entry, and the bounded wait they use.
//!
//! Readers add themselves to the entry's 7-bit reader count with compare-and-swap while the
//! write bit is clear; a writer sets the write bit (which stops new readers) and then waits
//! for the count to drain, so writers are preferred. Every wait is bounded by a timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::entry::{self, State, READERS_MAX, READER_ONE, WRITE_BIT};

/// Spins before the first `yield`: a short critical section (a copy of a small chunk)
/// usually ends within these.
const SPINS_BEFORE_YIELD: u32 = 64;

/// A bounded wait: spin a little, then yield, until the deadline.
pub(crate) struct Wait {
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    spins: u32,
}

impl Wait {
    /// A wait of at most `timeout` (`None`: try once, never wait).
    pub(crate) fn new(timeout: Option<Duration>) -> Wait {
        Wait {
            timeout,
            deadline: None,
            spins: 0,
        }
    }

    /// Waits a moment; `false` once the time is up.
    pub(crate) fn pause(&mut self) -> bool {
        let Some(timeout) = self.timeout else {
            return false;
        };
        self.spins += 1;
        if self.spins < SPINS_BEFORE_YIELD {
            std::hint::spin_loop();
            return true;
        }
        let now = Instant::now();
        let deadline = *self.deadline.get_or_insert(now + timeout);
        if now >= deadline {
            return false;
        }
        std::thread::yield_now();
        true
    }
}

/// Why a lock could not be taken.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum LockFailure {
    /// The entry is not live; carries the state.
    NotLive(State),
    /// The wait ran out.
    TimedOut,
}

/// Takes a read lock; returns the entry value seen (without our own reader).
#[inline]
pub(crate) fn read_lock(entry: &AtomicU64, wait: &mut Wait) -> Result<u64, LockFailure> {
    loop {
        let value = entry.load(Ordering::Relaxed);
        let state = entry::state(value);
        if state != State::Live {
            return Err(LockFailure::NotLive(state));
        }
        if entry::write_locked(value) || entry::readers(value) == READERS_MAX {
            if !wait.pause() {
                return Err(LockFailure::TimedOut);
            }
            continue;
        }
        if entry
            .compare_exchange_weak(
                value,
                value + READER_ONE,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            return Ok(value);
        }
    }
}

/// One attempt at a read lock without waiting (used by the batch path).
#[inline]
pub(crate) fn try_read_lock_once(entry: &AtomicU64) -> Option<u64> {
    let value = entry.load(Ordering::Relaxed);
    if entry::state(value) != State::Live
        || entry::write_locked(value)
        || entry::readers(value) == READERS_MAX
    {
        return None;
    }
    entry
        .compare_exchange(
            value,
            value + READER_ONE,
            Ordering::Acquire,
            Ordering::Relaxed,
        )
        .ok()
}

/// Releases a read lock.
#[inline]
pub(crate) fn read_unlock(entry: &AtomicU64) {
    let previous = entry.fetch_sub(READER_ONE, Ordering::Release);
    debug_assert!(entry::readers(previous) > 0);
}

/// Takes the write lock and waits for readers to leave; returns the entry value without the
/// write bit. Afterwards the caller owns the entry exclusively until it stores a new value.
pub(crate) fn write_lock(entry: &AtomicU64, wait: &mut Wait) -> Result<u64, LockFailure> {
    loop {
        let value = entry.load(Ordering::Relaxed);
        let state = entry::state(value);
        if state != State::Live {
            return Err(LockFailure::NotLive(state));
        }
        if entry::write_locked(value) {
            if !wait.pause() {
                return Err(LockFailure::TimedOut);
            }
            continue;
        }
        if entry
            .compare_exchange_weak(
                value,
                value | WRITE_BIT,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            break;
        }
    }
    loop {
        let value = entry.load(Ordering::Acquire);
        if entry::readers(value) == 0 {
            return Ok(value & !WRITE_BIT);
        }
        if !wait.pause() {
            entry.fetch_and(!WRITE_BIT, Ordering::Release);
            return Err(LockFailure::TimedOut);
        }
    }
}

/// One attempt at a write lock on an unlocked entry without readers (batch path).
#[inline]
pub(crate) fn try_write_lock_once(entry: &AtomicU64) -> Option<u64> {
    let value = entry.load(Ordering::Relaxed);
    if entry::state(value) != State::Live
        || entry::write_locked(value)
        || entry::readers(value) != 0
    {
        return None;
    }
    entry
        .compare_exchange(
            value,
            value | WRITE_BIT,
            Ordering::Acquire,
            Ordering::Relaxed,
        )
        .ok()
}

/// Releases the write lock, publishing `value` (which must not have the write bit).
#[inline]
pub(crate) fn write_unlock(entry: &AtomicU64, value: u64) {
    debug_assert!(!entry::write_locked(value));
    entry.store(value, Ordering::Release);
}

/// Holds a read lock and releases it when dropped (also on unwinding).
pub(crate) struct ReadGuard<'a>(pub(crate) &'a AtomicU64);

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        read_unlock(self.0);
    }
}

/// Holds the write lock; dropping it restores the value it was taken with.
pub(crate) struct WriteGuard<'a> {
    pub(crate) entry: &'a AtomicU64,
    pub(crate) value: u64,
}

impl WriteGuard<'_> {
    /// Releases the lock, publishing `value` instead of the old one.
    pub(crate) fn release_with(self, value: u64) {
        let entry = self.entry;
        std::mem::forget(self);
        write_unlock(entry, value);
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        write_unlock(self.entry, self.value);
    }
}
