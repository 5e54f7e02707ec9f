//! Locks a caller takes and releases itself (`lock_read`, `lock_write` and the `*_locked`
//! accesses under a write lock) and pinning. See the [crate docs](crate).
//!
//! Unlike the guards of the access paths, these locks outlive the call, so every release
//! checks the entry's lock bits first and fails with `NotLocked`/`NotPinned` instead of
//! corrupting the reader count or the write bit. A pin takes a read lock and the pinned
//! bit in one compare-and-swap; the read lock goes at the end of the call, the bit keeps
//! remove and resize away until `unpin`. Called by the node for multi-step work on a chunk.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::entry::{self, State};
use crate::lock::{self, LockFailure, ReadGuard, Wait};
use crate::{ChunkId, MemError, MemResult, MemoryManager, PinnedChunk};

impl MemoryManager {
    /// Takes the chunk's read lock, waiting up to `timeout`.
    pub fn lock_read(&self, cid: ChunkId, timeout: Duration) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        lock::read_lock(entry, &mut Wait::new(Some(timeout)))
            .map(|_| ())
            .map_err(|f| self.lock_error(cid, f))
    }

    /// Takes the chunk's read lock if it is free now.
    pub fn try_lock_read(&self, cid: ChunkId) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        lock::read_lock(entry, &mut Wait::new(None))
            .map(|_| ())
            .map_err(|failure| match failure {
                LockFailure::TimedOut => MemError::WouldBlock(cid),
                other => self.lock_error(cid, other),
            })
    }

    /// Releases a read lock taken with `lock_read`/`try_lock_read`.
    pub fn unlock_read(&self, cid: ChunkId) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        let mut value = entry.load(Ordering::Relaxed);
        loop {
            if entry::state(value) != State::Live || entry::readers(value) == 0 {
                return Err(MemError::NotLocked(cid));
            }
            match entry.compare_exchange_weak(
                value,
                value - entry::READER_ONE,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(current) => value = current,
            }
        }
    }

    /// Takes the chunk's write lock, waiting up to `timeout` (for the lock and for readers
    /// to leave). While held, only `*_locked` calls access the chunk without waiting.
    pub fn lock_write(&self, cid: ChunkId, timeout: Duration) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        lock::write_lock(entry, &mut Wait::new(Some(timeout)))
            .map(|_| ())
            .map_err(|f| self.lock_error(cid, f))
    }

    /// Takes the chunk's write lock if it is free and has no readers now.
    pub fn try_lock_write(&self, cid: ChunkId) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        lock::try_write_lock_once(entry).map(|_| ()).ok_or_else(|| {
            match entry::state(entry.load(Ordering::Relaxed)) {
                State::Live => MemError::WouldBlock(cid),
                state => self.lock_error(cid, LockFailure::NotLive(state)),
            }
        })
    }

    /// Releases the write lock taken with `lock_write`/`try_lock_write`.
    pub fn unlock_write(&self, cid: ChunkId) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        let value = entry.load(Ordering::Acquire);
        if entry::state(value) != State::Live || !entry::write_locked(value) {
            return Err(MemError::NotLocked(cid));
        }
        lock::write_unlock(entry, value & !entry::WRITE_BIT);
        Ok(())
    }

    /// The entry value of a chunk whose write lock the caller holds.
    fn held_write(&self, cid: ChunkId) -> MemResult<(u64, usize)> {
        let entry = self.entry_of(cid)?;
        let value = entry.load(Ordering::Acquire);
        if entry::state(value) != State::Live || !entry::write_locked(value) {
            return Err(MemError::NotLocked(cid));
        }
        // SAFETY: the caller holds the write lock (checked that someone does; the contract
        // of the `*_locked` calls is that it is the caller).
        Ok(unsafe {
            self.allocator.payload(
                entry::offset(value),
                entry::is_large(value),
                entry::embedded_length(value),
            )
        })
    }

    /// `get` for a chunk whose write lock the caller holds (from `lock_write`).
    pub fn get_locked(&self, cid: ChunkId, buffer: &mut [u8]) -> MemResult<usize> {
        let (offset, len) = self.held_write(cid)?;
        let available = buffer.len();
        let destination = buffer.get_mut(..len).ok_or(MemError::BufferTooSmall {
            needed: len,
            available,
        })?;
        // SAFETY: the caller holds the write lock.
        unsafe { self.allocator.region().read(offset, destination) };
        Ok(len)
    }

    /// `put` for a chunk whose write lock the caller holds (from `lock_write`).
    pub fn put_locked(&self, cid: ChunkId, data: &[u8]) -> MemResult<()> {
        let (offset, len) = self.held_write(cid)?;
        if data.len() != len {
            return Err(MemError::SizeMismatch {
                cid,
                size: len,
                len: data.len(),
            });
        }
        // SAFETY: the caller holds the write lock.
        unsafe { self.allocator.region().write(offset, data) };
        Ok(())
    }

    /// Pins the chunk: its bytes stay at the returned address, and remove/resize fail with
    /// [`MemError::Pinned`], until [`unpin`](Self::unpin). Reading or writing through the
    /// address is the caller's own (unsafe) business; the chunk locks still apply.
    pub fn pin(&self, cid: ChunkId) -> MemResult<PinnedChunk> {
        let entry = self.entry_of(cid)?;
        let mut wait = Wait::new(Some(self.config.lock_timeout));
        loop {
            let value = entry.load(Ordering::Relaxed);
            let state = entry::state(value);
            if state != State::Live {
                return Err(self.lock_error(cid, LockFailure::NotLive(state)));
            }
            if entry::write_locked(value) {
                if !wait.pause() {
                    return Err(MemError::LockTimeout(cid));
                }
                continue;
            }
            if entry
                .compare_exchange_weak(
                    value,
                    value | entry::PINNED_BIT | entry::READER_ONE,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                let _guard = ReadGuard(entry);
                // SAFETY: we hold a read lock while reading the header.
                let (offset, len) = unsafe {
                    self.allocator.payload(
                        entry::offset(value),
                        entry::is_large(value),
                        entry::embedded_length(value),
                    )
                };
                let address = self.allocator.region().pointer(offset);
                return Ok(PinnedChunk { cid, address, len });
            }
        }
    }

    /// Unpins a chunk pinned with [`pin`](Self::pin).
    pub fn unpin(&self, cid: ChunkId) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        let mut value = entry.load(Ordering::Relaxed);
        loop {
            if entry::state(value) != State::Live || !entry::pinned(value) {
                return Err(MemError::NotPinned(cid));
            }
            match entry.compare_exchange_weak(
                value,
                value & !entry::PINNED_BIT,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(current) => value = current,
            }
        }
    }
}
