//! The writer thread: writes the flushes the flusher sorted, in order. Each zone's batch
//! goes straight to its secondary log (large batches, or all with one-level logging) or
//! to the primary log plus the zone's secondary-log buffer (small ones); removes and
//! sealed epochs go to the version logs. A flush without primary-log blocks is handed
//! to the syncer ([`super::sync`]); one with blocks is synced here, in order.
//!
//! Invariants: the writer is the only writer of secondary logs besides the reorganizer
//! and a recovery read's `flush_zone`, all under the zone's log lock; a buffer taken out
//! of a zone is durable in its secondary log before a primary block flagged as a buffer
//! start can reach the disk; every placed entry is reported to the zone's version
//! manager under the log lock. See the [parent module](super).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::flush::Groups;
use super::sync::{sync_all, SyncJob};
use super::{
    Inner, Seq, SortedFlush, WRITER_IDLE, WRITER_PRIMARY, WRITER_RELEASING, WRITER_SEALED,
    WRITER_SUBMITTING, WRITER_SYNCING, WRITER_WAITING_FOR_SYNCER, WRITER_WRITING,
};
use crate::error::{LogError, LogResult};
use crate::header::EntryHeader;
use crate::seclog::{self, PlaceError};
use crate::storage::LogFile;
use crate::zone::Zone;
use crate::ZoneId;

thread_local! {
    /// Where the entries of a secondary-log write went, reused from call to call (no
    /// allocation and page faults per batch).
    static PLACED: std::cell::RefCell<Vec<seclog::Placement>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// When the writer last saw appends, and whether it released its burst buffers since
/// (see [`LogConfig::idle_release_after`](crate::LogConfig::idle_release_after)).
pub(super) struct IdleClock {
    after: Duration,
    last_busy: Instant,
    released: bool,
}

impl IdleClock {
    pub(super) fn new(after: Duration) -> IdleClock {
        IdleClock {
            after,
            last_busy: Instant::now(),
            released: false,
        }
    }

    /// Called once per flush, `busy` if it held appends: true once per idle stretch,
    /// when it has lasted `after` (never with `after` zero).
    pub(super) fn release_due(&mut self, busy: bool) -> bool {
        if busy {
            self.last_busy = Instant::now();
            self.released = false;
            return false;
        }
        if self.released || self.after.is_zero() || self.last_busy.elapsed() < self.after {
            return false;
        }
        self.released = true;
        true
    }
}

impl Inner {
    /// The writer's idle release (see
    /// [`LogConfig::idle_release_after`](crate::LogConfig::idle_release_after)), in the
    /// writer thread between flushes: every zone's secondary-log buffer goes to its
    /// secondary log and is synced there (as a full buffer would; the next primary-log
    /// block of the zone then starts a buffer again), then the page images, this
    /// thread's scratch and placement buffers, and the write buffer's free halves (and
    /// the active one if empty) are freed, fresh halves reserving address space only.
    pub(super) fn release_idle(&self) -> LogResult<()> {
        self.write_out_secondary_buffers()?;
        if let Some(pipe) = &self.pipe {
            pipe.release_free();
        }
        PLACED.with(|cell| {
            if let Ok(mut placed) = cell.try_borrow_mut() {
                *placed = Vec::new();
            }
        });
        crate::storage::release_write_scratch();
        let half = (self.config.write_buffer_bytes / 2) as usize;
        let fresh = || Vec::with_capacity(half);
        {
            let mut wb = self.wb.lock();
            for spare in wb.spares.iter_mut() {
                *spare = fresh();
            }
            if wb.active.is_empty() {
                wb.active = fresh();
            }
        }
        self.counters.idle_releases.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The writer thread: writes the flushes the flusher sorted, one after the other, and
    /// moves `durable_seq` after each.
    pub(super) fn writer_loop(self: Arc<Self>) {
        // The last sequence number of the flush written before (flushes come in order).
        let mut written_seq = 0;
        let mut idle = IdleClock::new(self.config.idle_release_after);
        loop {
            let job = {
                let mut h = self.handoff.lock();
                loop {
                    if let Some(job) = h.queued.take() {
                        self.handoff_cv.notify_all();
                        break Some(job);
                    }
                    if h.closed {
                        break None;
                    }
                    self.handoff_cv.wait(&mut h);
                }
            };
            let Some(SortedFlush {
                groups,
                half,
                last_seq,
            }) = job
            else {
                // Whatever is in flight becomes durable (or fails) before the syncer ends.
                let mut q = self.sync_q.lock();
                q.closed = true;
                self.sync_cv.notify_all();
                return;
            };
            assert!(last_seq >= written_seq, "flushes written out of order");
            let busy = last_seq != written_seq;
            written_seq = last_seq;
            if !self.failed.load(Ordering::Relaxed) {
                self.set_writer_stage(WRITER_WRITING);
                match self.write_sorted(&groups, &half, last_seq) {
                    Ok(None) => self.mark_durable(last_seq),
                    // Synced by the syncer while this thread writes the next flush.
                    Ok(Some(files)) => {
                        self.set_writer_stage(WRITER_SUBMITTING);
                        self.submit_sync(SyncJob { files, last_seq });
                    }
                    Err(e) => self.fail(e.to_string()),
                }
                if idle.release_due(busy) {
                    self.set_writer_stage(WRITER_RELEASING);
                    if let Err(e) = self.release_idle() {
                        self.fail(e.to_string());
                    }
                }
                self.set_writer_stage(WRITER_IDLE);
            }
            {
                let mut h = self.handoff.lock();
                assert!(h.free.len() < 2, "two sets of per-zone lists in all");
                h.free.push(groups);
                self.handoff_cv.notify_all();
            }
            // The half goes back to the producers; those waiting for a sealed epoch to
            // reach the disk retry now too (notified under the buffer lock, so the wake-up
            // is not lost between their check and their wait).
            self.give_back_half(half);
        }
    }

    /// Writes every zone's secondary-log buffer to its secondary log and syncs it there
    /// (the writer thread's, between or within flushes: when the primary log starts over,
    /// and at the idle release).
    fn write_out_secondary_buffers(&self) -> LogResult<()> {
        let zones: Vec<Arc<Zone>> = self.zones.read().values().cloned().collect();
        for zone in zones {
            let pending = std::mem::take(&mut zone.log.lock().sec_buffer);
            if !pending.is_empty() {
                self.write_secondary(&zone, &pending)?;
                zone.log.lock().seclog.sync()?;
            }
        }
        Ok(())
    }

    /// Records what the writer thread does now (for [`Inner::pipeline_state`]).
    fn set_writer_stage(&self, stage: u8) {
        self.writer_stage.store(stage, Ordering::Relaxed);
    }

    /// Writes one sorted flush (the writer's part): each zone's batch to its secondary
    /// log, or to the primary log and its secondary-log buffer; removes and sealed epochs
    /// to the version logs. Returns `None` when everything up to `last_seq` is durable, or
    /// the files still to sync when the flush wrote no primary-log block: it is durable
    /// once they are synced (the syncer's part, [`Inner::syncer_loop`], which also writes
    /// the sealed epochs then).
    pub(super) fn write_sorted(
        &self,
        groups: &Groups,
        half: &[u8],
        last_seq: Seq,
    ) -> LogResult<Option<Vec<Arc<dyn LogFile>>>> {
        let payload_max = self.config.entry_payload_bytes_max();
        let two_level = self.config.secondary_buffer_bytes > 0;
        let mut primary_blocks: Vec<(ZoneId, u8, Vec<u8>)> = Vec::new();
        let mut touched: HashSet<ZoneId> = HashSet::new();
        // Version logs holding removes of this flush, synced with the secondary logs.
        let mut to_sync: Vec<Arc<dyn LogFile>> = Vec::new();
        for (zone_id, group) in groups.iter() {
            let removes = &group.removes;
            let Ok(zone) = self.zone(*zone_id) else {
                // Removed while its appends were buffered: nothing to keep.
                continue;
            };
            if group.headers.is_empty() && removes.is_empty() {
                continue;
            }
            if !two_level || group.entry_bytes as u64 >= self.config.secondary_buffer_bytes {
                let pending = {
                    let mut log = zone.log.lock();
                    std::mem::take(&mut log.sec_buffer)
                };
                if !pending.is_empty() {
                    self.write_secondary(&zone, &pending)?;
                }
                self.write_secondary_walked(&zone, half, &group.headers)?;
                touched.insert(*zone_id);
            } else if !group.headers.is_empty() {
                let entries = group.gather(half);
                let full = {
                    let mut log = zone.log.lock();
                    if log.sec_buffer.len() + entries.len()
                        > self.config.secondary_buffer_bytes as usize
                    {
                        Some(std::mem::take(&mut log.sec_buffer))
                    } else {
                        None
                    }
                };
                if let Some(full) = full {
                    self.write_secondary(&zone, &full)?;
                    touched.insert(*zone_id);
                }
                let flags = {
                    let mut log = zone.log.lock();
                    let empty = log.sec_buffer.is_empty();
                    log.sec_buffer.extend_from_slice(&entries);
                    if empty {
                        crate::primary::BLOCK_FLAG_BUFFER_START
                    } else {
                        0
                    }
                };
                primary_blocks.push((*zone_id, flags, entries));
            }
            if !removes.is_empty() {
                to_sync.push(zone.log.lock().vlog.append_unsynced(removes)?);
            }
        }
        // Secondary logs first: a primary block flagged as a buffer start makes reopen
        // skip the zone's earlier blocks, so what was taken out of the zone's buffer must
        // be durable in its secondary log before that block can reach the disk (even
        // torn: its header alone carries the flag).
        to_sync.extend(
            touched
                .iter()
                .filter_map(|zone_id| self.zone(*zone_id).ok())
                .map(|zone| zone.log.lock().seclog.file()),
        );
        if primary_blocks.is_empty() {
            self.counters.flushes.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(to_sync));
        }
        // The primary-log path stays in this thread, in order: the flush before is durable
        // first (durable_seq moves in order), then this one's secondary logs, then its
        // primary-log blocks.
        self.set_writer_stage(WRITER_WAITING_FOR_SYNCER);
        self.wait_sync_idle();
        if self.failed.load(Ordering::Relaxed) {
            return Err(LogError::Failed("an earlier flush failed".into()));
        }
        self.set_writer_stage(WRITER_SYNCING);
        sync_all(&to_sync)?;
        self.set_writer_stage(WRITER_PRIMARY);
        {
            let bytes: usize = primary_blocks.iter().map(|b| b.2.len()).sum();
            let mut primary = self.primary.lock();
            let p = primary
                .as_mut()
                .ok_or_else(|| LogError::Failed("primary log closed".into()))?;
            if !p.fits(primary_blocks.len(), bytes) {
                // Start over: everything the old round protects goes to the secondary logs
                // (batches of this flush are already in the buffers, so they need no
                // primary block).
                self.write_out_secondary_buffers()?;
                p.reset()?;
                primary_blocks.clear();
            }
            let refs: Vec<(ZoneId, u8, &[u8])> = primary_blocks
                .iter()
                .map(|(z, f, b)| (*z, *f, b.as_slice()))
                .collect();
            p.append(&refs, payload_max)?;
            p.sync()?;
        }
        self.set_writer_stage(WRITER_SEALED);
        self.write_sealed(last_seq)?;
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(None)
    }

    /// Writes a batch to the zone's secondary log, waiting for urgent reorganization when
    /// the log has no free segment left. Registers a prompt request above the threshold.
    pub(crate) fn write_secondary(&self, zone: &Zone, batch: &[u8]) -> LogResult<()> {
        let headers =
            seclog::walk_batch(batch, zone.id.owner, self.config.entry_payload_bytes_max())
                .map_err(|e| LogError::Failed(format!("internal: batch does not decode: {e}")))?;
        self.write_secondary_walked(zone, batch, &headers)
    }

    /// [`Inner::write_secondary`] for a batch whose entries' offsets and headers are known
    /// (`headers`, every entry of `batch` in order).
    pub(super) fn write_secondary_walked(
        &self,
        zone: &Zone,
        batch: &[u8],
        headers: &[(usize, EntryHeader)],
    ) -> LogResult<()> {
        PLACED.with(|cell| match cell.try_borrow_mut() {
            Ok(mut placed) => {
                let result = self.write_secondary_into(zone, batch, headers, &mut placed);
                // Keep at most what a flush of one zone typically needs (64 Ki entries).
                placed.clear();
                placed.shrink_to(1 << 16);
                result
            }
            // Not expected (no nested writes); stay correct anyway.
            Err(_) => self.write_secondary_into(zone, batch, headers, &mut Vec::new()),
        })
    }

    pub(super) fn write_secondary_into(
        &self,
        zone: &Zone,
        batch: &[u8],
        headers: &[(usize, EntryHeader)],
        placed: &mut Vec<seclog::Placement>,
    ) -> LogResult<()> {
        let deadline = Instant::now() + self.config.wait_timeout;
        let mut rest = headers;
        loop {
            let (result, utilization, written) = {
                let mut log = zone.log.lock();
                let before = log.seclog.used_bytes();
                placed.clear();
                let r = log
                    .seclog
                    .append_walked(batch, rest, false, placed, self.pipe.as_ref());
                let after = log.seclog.used_bytes();
                // Under the log lock, so the reorganizer sees each entry counted before it
                // can clean the segment.
                zone.record_placements(placed);
                (
                    r,
                    log.seclog.utilization_percent(),
                    after.saturating_sub(before),
                )
            };
            self.counters
                .secondary_bytes_written
                .fetch_add(written, Ordering::Relaxed);
            if utilization >= self.config.reorg_prompt_percent {
                self.reorg.lock().prompt.insert(zone.id, ());
                self.reorg_cv.notify_all();
            }
            match result {
                Ok(()) => return Ok(()),
                Err(PlaceError::Io(e)) => return Err(e),
                Err(PlaceError::NoSpace { placed }) => {
                    let done = rest.partition_point(|(offset, _)| *offset < placed);
                    rest = rest.get(done..).unwrap_or(&[]);
                    let mut r = self.reorg.lock();
                    r.urgent.insert(zone.id, ());
                    let seen = r.passes_done;
                    r.writers_waiting += 1;
                    self.reorg_cv.notify_all();
                    while r.passes_done == seen {
                        if self.shutdown.load(Ordering::Relaxed)
                            || self.reorg_cv.wait_until(&mut r, deadline).timed_out()
                        {
                            r.writers_waiting -= 1;
                            return Err(LogError::LogFull(zone.id));
                        }
                    }
                    r.writers_waiting -= 1;
                }
            }
        }
    }
}
