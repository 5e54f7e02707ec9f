//! Access to live chunks: get, put, in-place reads and writes, remove, resize, and their
//! batch forms. See the [crate docs](crate) for the lock protocol.
//!
//! The hot path: a table lookup, one compare-and-swap to lock the entry, a copy, one
//! atomic to unlock; no global lock. Every byte access happens under the chunk's lock,
//! held by a guard (so a panic releases it); only the write-lock holder frees a chunk's
//! memory, and it unlinks the entry in the same release. A batch locks a prefix of a window
//! without waiting while it holds locks, so batches cannot deadlock. Called by the node's
//! request handlers, replication and recovery, and by the other modules here
//! (`entry_of`, `lock_error`, `read_locked`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::entry::{self, State};
use crate::lock::{self, LockFailure, ReadGuard, Wait, WriteGuard};
use crate::{alloc, region};
use crate::{ChunkId, MemError, MemResult, MemoryManager};

/// Chunks whose table entries and data a batch call fetches ahead at once.
const BATCH_WINDOW: usize = 32;

impl MemoryManager {
    /// The level-0 entry of `cid`, or [`MemError::NotFound`] when its table is missing.
    #[inline]
    pub(crate) fn entry_of(&self, cid: ChunkId) -> MemResult<&AtomicU64> {
        self.table.entry(cid).ok_or(MemError::NotFound(cid))
    }

    /// The error for a lock on `cid` that could not be taken.
    #[inline]
    pub(crate) fn lock_error(&self, cid: ChunkId, failure: LockFailure) -> MemError {
        match failure {
            LockFailure::TimedOut => MemError::LockTimeout(cid),
            LockFailure::NotLive(State::Reserved) => MemError::Reserved(cid),
            LockFailure::NotLive(State::Removed) => MemError::Removed(cid),
            LockFailure::NotLive(_) => MemError::NotFound(cid),
        }
    }

    /// Read-locks `cid` (waiting up to the lock timeout); the guard, payload offset and
    /// length.
    #[inline]
    pub(crate) fn read_locked(&self, cid: ChunkId) -> MemResult<(ReadGuard<'_>, u64, usize)> {
        let entry = self.entry_of(cid)?;
        let value = lock::read_lock(entry, &mut Wait::new(Some(self.config.lock_timeout)))
            .map_err(|failure| self.lock_error(cid, failure))?;
        let guard = ReadGuard(entry);
        // SAFETY: we hold the read lock.
        let (offset, len) = unsafe {
            self.allocator.payload(
                entry::offset(value),
                entry::is_large(value),
                entry::embedded_length(value),
            )
        };
        Ok((guard, offset, len))
    }

    /// Write-locks `cid` (waiting up to the lock timeout); the guard, payload offset and
    /// length.
    fn write_locked(&self, cid: ChunkId) -> MemResult<(WriteGuard<'_>, u64, usize)> {
        let entry = self.entry_of(cid)?;
        let value = lock::write_lock(entry, &mut Wait::new(Some(self.config.lock_timeout)))
            .map_err(|failure| self.lock_error(cid, failure))?;
        let guard = WriteGuard { entry, value };
        // SAFETY: we hold the write lock.
        let (offset, len) = unsafe {
            self.allocator.payload(
                entry::offset(value),
                entry::is_large(value),
                entry::embedded_length(value),
            )
        };
        Ok((guard, offset, len))
    }

    /// Copies the chunk into `buffer` and returns its size.
    pub fn get(&self, cid: ChunkId, buffer: &mut [u8]) -> MemResult<usize> {
        let (_guard, offset, len) = self.read_locked(cid)?;
        let available = buffer.len();
        let destination = buffer.get_mut(..len).ok_or(MemError::BufferTooSmall {
            needed: len,
            available,
        })?;
        // SAFETY: we hold the read lock; the payload lies within the chunk's allocation.
        unsafe { self.allocator.region().read(offset, destination) };
        Ok(len)
    }

    /// The chunk's bytes as a new vector.
    pub fn get_vec(&self, cid: ChunkId) -> MemResult<Vec<u8>> {
        self.read_with(cid, <[u8]>::to_vec)
    }

    /// Runs `visit` on the chunk's bytes in place (no copy), under its read lock. Keep
    /// `visit` short: writers of this chunk wait for it.
    pub fn read_with<R>(&self, cid: ChunkId, visit: impl FnOnce(&[u8]) -> R) -> MemResult<R> {
        let (_guard, offset, len) = self.read_locked(cid)?;
        // SAFETY: we hold the read lock for the slice's whole life (it ends with `visit`).
        let bytes = unsafe { self.allocator.region().slice(offset, len) };
        Ok(visit(bytes))
    }

    /// Runs `update` on the chunk's bytes in place, under its write lock.
    pub fn write_with<R>(&self, cid: ChunkId, update: impl FnOnce(&mut [u8]) -> R) -> MemResult<R> {
        let (_guard, offset, len) = self.write_locked(cid)?;
        // SAFETY: we hold the write lock for the slice's whole life.
        let bytes = unsafe { self.allocator.region().slice_mut(offset, len) };
        Ok(update(bytes))
    }

    /// Replaces the chunk's bytes; `data` must be exactly the chunk's size
    /// ([`resize`](Self::resize) first to change it).
    pub fn put(&self, cid: ChunkId, data: &[u8]) -> MemResult<()> {
        let (_guard, offset, len) = self.write_locked(cid)?;
        if data.len() != len {
            return Err(MemError::SizeMismatch {
                cid,
                size: len,
                len: data.len(),
            });
        }
        // SAFETY: we hold the write lock.
        unsafe { self.allocator.region().write(offset, data) };
        Ok(())
    }

    /// Copies `buffer.len()` bytes starting at `offset` of the chunk into `buffer`.
    pub fn read_at(&self, cid: ChunkId, offset: usize, buffer: &mut [u8]) -> MemResult<()> {
        let (_guard, start, len) = self.read_locked(cid)?;
        Self::check_range(cid, offset, buffer.len(), len)?;
        // SAFETY: read lock held; the range is inside the payload (checked).
        unsafe { self.allocator.region().read(start + offset as u64, buffer) };
        Ok(())
    }

    /// Overwrites the chunk's bytes at `offset` with `data`.
    pub fn write_at(&self, cid: ChunkId, offset: usize, data: &[u8]) -> MemResult<()> {
        let (_guard, start, len) = self.write_locked(cid)?;
        Self::check_range(cid, offset, data.len(), len)?;
        // SAFETY: write lock held; the range is inside the payload (checked).
        unsafe { self.allocator.region().write(start + offset as u64, data) };
        Ok(())
    }

    fn check_range(cid: ChunkId, offset: usize, len: usize, size: usize) -> MemResult<()> {
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(MemError::OutOfBounds {
                cid,
                offset,
                len,
                size,
            });
        }
        Ok(())
    }

    /// Whether a chunk with this CID is stored here.
    pub fn exists(&self, cid: ChunkId) -> bool {
        self.table
            .entry(cid)
            .is_some_and(|entry| entry::state(entry.load(Ordering::Acquire)) == State::Live)
    }

    /// The chunk's size in bytes.
    pub fn size(&self, cid: ChunkId) -> MemResult<usize> {
        let entry = self.entry_of(cid)?;
        let value = entry.load(Ordering::Acquire);
        if entry::state(value) == State::Live && !entry::is_large(value) {
            return Ok(entry::embedded_length(value));
        }
        self.read_locked(cid).map(|(_, _, len)| len)
    }

    /// Reads many chunks in one call, calling `visit(index, result)` once per element of
    /// `cids` with the chunk's bytes (in place, under its read lock) or the error, in index
    /// order. Table entries and chunk data are fetched ahead for a
    /// window of chunks at a time, so the memory latency of many chunks overlaps. A batch
    /// never waits for a lock while it holds others, so concurrent batches (or one that
    /// names a CID twice) cannot deadlock.
    pub fn get_batch_with(&self, cids: &[ChunkId], mut visit: impl FnMut(usize, MemResult<&[u8]>)) {
        let region = self.allocator.region();
        let mut base = 0;
        while base < cids.len() {
            let window = &cids[base..cids.len().min(base + BATCH_WINDOW)];
            let mut entries: [Option<&AtomicU64>; BATCH_WINDOW] = [None; BATCH_WINDOW];
            for (slot, &cid) in entries.iter_mut().zip(window) {
                *slot = self.table.entry(cid);
                if let Some(entry) = slot {
                    region::prefetch_pointer(*entry as *const AtomicU64);
                }
            }
            // Lock a prefix of the window, stopping at the first chunk that is missing or
            // cannot be locked at once: this thread never waits while it holds locks, so
            // two batches (or a batch naming one CID twice) cannot deadlock.
            let mut values = [0u64; BATCH_WINDOW];
            let mut locked = 0;
            while let Some(Some(entry)) = entries.get(locked).filter(|_| locked < window.len()) {
                match lock::try_read_lock_once(entry) {
                    Some(value) => {
                        values[locked] = value;
                        region.prefetch(entry::offset(value));
                        locked += 1;
                    }
                    None => break,
                }
            }
            // Hold locks in guards from here on so a panicking `visit` releases them all.
            let guards: [Option<ReadGuard<'_>>; BATCH_WINDOW] = std::array::from_fn(|i| {
                if i < locked {
                    entries[i].map(ReadGuard)
                } else {
                    None
                }
            });
            for (index, guard) in guards.into_iter().enumerate().take(locked) {
                let Some(guard) = guard else { continue };
                let value = values[index];
                // SAFETY: read lock held by `guard` until it is dropped below.
                let bytes = unsafe {
                    let (offset, len) = self.allocator.payload(
                        entry::offset(value),
                        entry::is_large(value),
                        entry::embedded_length(value),
                    );
                    region.slice(offset, len)
                };
                visit(base + index, Ok(bytes));
                drop(guard);
            }
            if locked < window.len() {
                // No lock is held here: the ordinary path may wait, or reports the error.
                let index = base + locked;
                let mut visited = false;
                let result = self.read_with(cids[index], |bytes| {
                    visited = true;
                    visit(index, Ok(bytes))
                });
                if let (false, Err(error)) = (visited, result) {
                    visit(index, Err(error));
                }
                base = index + 1;
            } else {
                base += window.len();
            }
        }
    }

    /// Copies many chunks into `out` (appended back to back) and returns each one's
    /// result: its length, or the error.
    pub fn get_batch(&self, cids: &[ChunkId], out: &mut Vec<u8>) -> Vec<MemResult<usize>> {
        let mut results: Vec<MemResult<usize>> = vec![Ok(0); cids.len()];
        // `get_batch_with` visits in index order, so the bytes land in index order.
        self.get_batch_with(cids, |index, result| match result {
            Ok(bytes) => {
                out.extend_from_slice(bytes);
                results[index] = Ok(bytes.len());
            }
            Err(error) => results[index] = Err(error),
        });
        results
    }

    /// Replaces many chunks' bytes in one call (`(cid, data)` each; sizes must match),
    /// fetching entries and data ahead like [`get_batch_with`](Self::get_batch_with).
    pub fn put_batch(&self, items: &[(ChunkId, &[u8])]) -> Vec<MemResult<()>> {
        let region = self.allocator.region();
        let mut results = Vec::with_capacity(items.len());
        let mut base = 0;
        while base < items.len() {
            let window = &items[base..items.len().min(base + BATCH_WINDOW)];
            let mut entries: [Option<&AtomicU64>; BATCH_WINDOW] = [None; BATCH_WINDOW];
            for (slot, &(cid, _)) in entries.iter_mut().zip(window) {
                *slot = self.table.entry(cid);
                if let Some(entry) = slot {
                    region::prefetch_pointer(*entry as *const AtomicU64);
                }
            }
            // As in `get_batch_with`: lock a prefix, never wait while holding locks. This
            // also keeps puts in order when one CID appears twice.
            let mut guards: [Option<WriteGuard<'_>>; BATCH_WINDOW] = std::array::from_fn(|_| None);
            let mut locked = 0;
            while let Some(Some(entry)) = entries.get(locked).filter(|_| locked < window.len()) {
                match lock::try_write_lock_once(entry) {
                    Some(value) => {
                        region.prefetch(entry::offset(value));
                        guards[locked] = Some(WriteGuard { entry, value });
                        locked += 1;
                    }
                    None => break,
                }
            }
            for (index, guard) in guards.into_iter().enumerate().take(locked) {
                let Some(guard) = guard else { continue };
                let (cid, data) = window[index];
                let value = guard.value;
                // SAFETY: write lock held by `guard`.
                let (offset, len) = unsafe {
                    self.allocator.payload(
                        entry::offset(value),
                        entry::is_large(value),
                        entry::embedded_length(value),
                    )
                };
                let result = if len == data.len() {
                    // SAFETY: write lock held; sizes match.
                    unsafe { region.write(offset, data) };
                    Ok(())
                } else {
                    Err(MemError::SizeMismatch {
                        cid,
                        size: len,
                        len: data.len(),
                    })
                };
                drop(guard);
                results.push(result);
            }
            if locked < window.len() {
                // No lock is held here: the ordinary path may wait, or reports the error.
                let (cid, data) = window[locked];
                results.push(self.put(cid, data));
                base += locked + 1;
            } else {
                base += window.len();
            }
        }
        results
    }

    /// Removes the chunk and frees its memory. Its local ID is reused by later creates if
    /// this node created it.
    pub fn remove(&self, cid: ChunkId) -> MemResult<()> {
        self.remove_inner(cid, true)
    }

    /// Removes the chunk and frees its memory, but never reuses its local ID: for a chunk
    /// that lives on elsewhere under the same CID (migrated to another peer), whose ID a
    /// later create here must not hand out again.
    pub fn remove_moved(&self, cid: ChunkId) -> MemResult<()> {
        self.remove_inner(cid, false)
    }

    fn remove_inner(&self, cid: ChunkId, reuse_id: bool) -> MemResult<()> {
        let (guard, _, len) = self.write_locked(cid)?;
        if entry::pinned(guard.value) {
            return Err(MemError::Pinned(cid));
        }
        self.allocator.free(entry::offset(guard.value), len);
        guard.release_with(entry::REMOVED);
        if reuse_id && cid.creator() == self.config.node_id {
            let mut spare = self.spare_local_ids.lock();
            if spare.len() < self.config.spare_local_ids_max {
                spare.push(cid.local_id());
                self.spare_count.store(spare.len(), Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Removes many chunks; one result per CID.
    pub fn remove_batch(&self, cids: &[ChunkId]) -> Vec<MemResult<()>> {
        cids.iter().map(|&cid| self.remove(cid)).collect()
    }

    /// Removes every live chunk with a CID in `first..=last` (same creator) and returns how
    /// many were removed. CIDs without a chunk are skipped; the walk visits only tables that
    /// exist, so even the whole 48-bit range costs no more than the chunks stored.
    pub fn remove_range(&self, first: ChunkId, last: ChunkId) -> MemResult<u64> {
        if first.creator() != last.creator() || first > last {
            return Err(MemError::InvalidRange { first, last });
        }
        let mut removed = 0;
        for (start, end) in self.chunk_ranges(first.creator()) {
            let (from, to) = (start.max(first), end.min(last));
            if from > to {
                continue;
            }
            for raw in from.raw()..=to.raw() {
                match self.remove(ChunkId::from_raw(raw)) {
                    Ok(()) => removed += 1,
                    Err(MemError::NotFound(_) | MemError::Removed(_) | MemError::Reserved(_)) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(removed)
    }

    /// Changes the chunk's size to `size` bytes, keeping the common prefix of its bytes and
    /// zeroing any new ones. Moves the chunk if its slot does not fit.
    pub fn resize(&self, cid: ChunkId, size: usize) -> MemResult<()> {
        self.check_size(size)?;
        let (guard, old_payload, old_len) = self.write_locked(cid)?;
        if entry::pinned(guard.value) {
            return Err(MemError::Pinned(cid));
        }
        let region = self.allocator.region();
        let old_offset = entry::offset(guard.value);
        if alloc::fits_in_place(old_len, size) {
            if size > old_len {
                // SAFETY: write lock held; the slot holds at least `size` payload bytes.
                unsafe { region.zero(old_payload + old_len as u64, size - old_len) };
            }
            self.allocator.resized_in_place(old_offset, old_len, size);
            guard.release_with(entry::live(old_offset, size));
            return Ok(());
        }
        let new_offset = self.allocator.allocate(size)?;
        let new_payload = Self::payload_offset(new_offset, size);
        let keep = old_len.min(size);
        // SAFETY: write lock held on the old chunk; the new allocation is still private.
        unsafe {
            let bytes = region.slice(old_payload, keep).to_vec();
            region.write(new_payload, &bytes);
            if size > keep {
                region.zero(new_payload + keep as u64, size - keep);
            }
        }
        self.allocator.free(old_offset, old_len);
        guard.release_with(entry::live(new_offset, size));
        Ok(())
    }
}
