//! The flusher thread: takes a full half of the write buffer (swapping in a free one),
//! sorts its records by zone into a set of per-zone lists ([`Group`]s, each entry's
//! place and decoded header) and queues them with the half for the writer.
//!
//! Invariants: flushes are taken in sequence order and handed to the writer in that
//! order (one queued at most); the lists are kept from flush to flush while they stay
//! below twice the write buffer (no allocation per flush). See the
//! [parent module](super) for the pipeline.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::append::{
    flush_threshold, RECORD_ENTRY, RECORD_HEADER_BYTES, RECORD_REMOVE, REMOVE_RECORD_BYTES,
};
use super::{Inner, SortedFlush, WRITE_BUFFER_HALVES};
use crate::error::{LogError, LogResult};
use crate::header::{self, EntryHeader};
use crate::version::{Version, VersionRecord, VersionState};
use crate::ZoneId;

/// What one flush holds for one zone, as the flusher sorted it: where its entries are in
/// the write-buffer half (which travels with the flush to the writer, so entries are
/// copied once, into the page images), and its removes.
#[derive(Debug, Default)]
pub(super) struct Group {
    /// Each entry's offset in the half (past its record header) and its header, decoded
    /// by the flusher, so the writer places the entries without walking them again.
    pub(super) headers: Vec<(usize, EntryHeader)>,
    /// Bytes of the entries (headers and payloads).
    pub(super) entry_bytes: usize,
    /// Removes.
    pub(super) removes: Vec<VersionRecord>,
}

impl Group {
    pub(super) fn capacity_bytes(&self) -> usize {
        self.headers.capacity() * std::mem::size_of::<(usize, EntryHeader)>()
            + self.removes.capacity() * std::mem::size_of::<VersionRecord>()
    }

    /// The entries back to back (for the primary log and the secondary-log buffer).
    pub(super) fn gather(&self, half: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entry_bytes);
        for (offset, h) in &self.headers {
            if let Some(entry) = half.get(*offset..offset + h.entry_bytes()) {
                out.extend_from_slice(entry);
            }
        }
        out
    }
}

/// The flusher's per-zone lists of one flush.
pub(super) type Groups = BTreeMap<ZoneId, Group>;

/// How far ahead of its walk the flusher reads a write-buffer half (see `sort_batch`).
pub(super) const TOUCH_AHEAD_BYTES: usize = 8 << 10;
/// Cache line size assumed by that read-ahead.
pub(super) const CACHE_LINE_BYTES: usize = 64;

impl Inner {
    pub(super) fn flusher_loop(self: Arc<Self>) {
        let interval = self.config.flush_interval;
        let half = (self.config.write_buffer_bytes / 2) as usize;
        let mut last = Instant::now();
        let mut last_busy = Instant::now();
        let idle_after = self.config.idle_release_after;
        loop {
            // A free set of per-zone lists first: while the writer holds both, the filled
            // half stays with the producers (back pressure).
            let Some(mut groups) = self.take_free_groups() else {
                return;
            };
            let (batch, last_seq) = {
                let mut wb = self.wb.lock();
                let spare = loop {
                    let due = self.shutdown.load(Ordering::Relaxed)
                        || wb.wake_now
                        || wb.flush_wanted > wb.taken_seq
                        || wb.active.len() >= flush_threshold(half)
                        || last.elapsed() >= interval;
                    // A free half to swap in: while every other half is in the flusher's
                    // and writer's hands, producers keep filling this one (back pressure).
                    if due {
                        if let Some(spare) = wb.spares.pop() {
                            break spare;
                        }
                        self.wb_cv.wait(&mut wb);
                        continue;
                    }
                    let wake = last + interval;
                    self.wb_cv.wait_until(&mut wb, wake);
                };
                wb.wake_now = false;
                let batch = std::mem::replace(&mut wb.active, spare);
                let last_seq = wb.next_seq - 1;
                // Flushes are taken in sequence order (the writer writes them so).
                assert!(last_seq >= wb.taken_seq, "flushes taken out of order");
                wb.taken_seq = last_seq;
                self.wb_cv.notify_all();
                (batch, last_seq)
            };
            last = Instant::now();
            if !batch.is_empty() {
                last_busy = last;
            } else if !idle_after.is_zero() && last_busy.elapsed() >= idle_after {
                // Idle: the lists' buffers go (both sets pass through here in turn).
                groups.clear();
            }
            let sorted = if self.failed.load(Ordering::Relaxed) {
                false
            } else {
                match self.sort_batch(&batch, &mut groups) {
                    Ok(()) => true,
                    Err(e) => {
                        self.fail(e.to_string());
                        false
                    }
                }
            };
            // The half goes to the writer with the flush (its entries are copied only into
            // the page images); one that was not sorted goes back at once.
            if sorted {
                let mut h = self.handoff.lock();
                while h.queued.is_some() {
                    self.handoff_cv.wait(&mut h);
                }
                h.queued = Some(SortedFlush {
                    groups,
                    half: batch,
                    last_seq,
                });
                self.handoff_cv.notify_all();
            } else {
                self.give_back_half(batch);
                let mut h = self.handoff.lock();
                assert!(h.free.len() < 2, "two sets of per-zone lists in all");
                h.free.push(groups);
                self.handoff_cv.notify_all();
            }
            if self.shutdown.load(Ordering::Relaxed) && self.wb.lock().active.is_empty() {
                let mut h = self.handoff.lock();
                h.closed = true;
                self.handoff_cv.notify_all();
                return;
            }
        }
    }

    /// Returns a write-buffer half to the producers' pool (emptied, capacity kept).
    pub(super) fn give_back_half(&self, mut half: Vec<u8>) {
        half.clear();
        let mut wb = self.wb.lock();
        assert!(
            wb.spares.len() + 1 < WRITE_BUFFER_HALVES,
            "a write-buffer half given back twice"
        );
        wb.spares.push(half);
        self.wb_cv.notify_all();
    }

    /// A set of per-zone lists not in use by the writer; `None` once the handoff is
    /// closed.
    pub(super) fn take_free_groups(&self) -> Option<Groups> {
        let mut h = self.handoff.lock();
        loop {
            if h.closed {
                return None;
            }
            if let Some(g) = h.free.pop() {
                return Some(g);
            }
            self.handoff_cv.wait(&mut h);
        }
    }

    /// Sorts one half of the write buffer by zone into `groups` (the flusher's part).
    pub(super) fn sort_batch(&self, batch: &[u8], groups: &mut Groups) -> LogResult<()> {
        // Sort by zone, keeping each zone's order, and decode each entry's header while
        // its bytes are at hand (the writer places the batch by them). The group buffers
        // are kept from flush to flush (no allocation and page faults per flush) while
        // their capacity is at most twice the write buffer's size together (a half's data
        // and headers, with the slack of growth by doubling).
        let retained: usize = groups.values().map(Group::capacity_bytes).sum();
        if retained > 2 * self.config.write_buffer_bytes as usize {
            groups.clear();
        }
        for group in groups.values_mut() {
            group.headers.clear();
            group.entry_bytes = 0;
            group.removes.clear();
        }
        let payload_max = self.config.entry_payload_bytes_max();
        let mut at = 0;
        // Lines of the half read ahead of the walk, one load per cache line. The records
        // form a chain of dependent loads (each length gives the next offset), so without
        // them every record header is a cache miss that waits for the one before (a
        // profile at 512-byte entries put 77% of this thread's time on one header load);
        // loads of the lines ahead do not depend on each other and are fetched together.
        let mut touched = 0usize;
        while at < batch.len() {
            let ahead = (at + TOUCH_AHEAD_BYTES).min(batch.len());
            while touched < ahead {
                std::hint::black_box(batch[touched]);
                touched += CACHE_LINE_BYTES;
            }
            let bad = || LogError::Failed("internal: write buffer record does not parse".into());
            let h = batch.get(at..at + RECORD_HEADER_BYTES).ok_or_else(bad)?;
            let zone = ZoneId {
                owner: u16::from_le_bytes([h[1], h[2]]),
                zone: u16::from_le_bytes([h[3], h[4]]),
            };
            let group = groups.entry(zone).or_default();
            match h[0] {
                RECORD_ENTRY => {
                    let len = u32::from_le_bytes([h[5], h[6], h[7], h[8]]) as usize;
                    let entry = batch
                        .get(at + RECORD_HEADER_BYTES..at + RECORD_HEADER_BYTES + len)
                        .ok_or_else(bad)?;
                    let h =
                        header::decode_header(entry, zone.owner, payload_max).map_err(|_| bad())?;
                    if h.entry_bytes() != len {
                        return Err(bad());
                    }
                    group.headers.push((at + RECORD_HEADER_BYTES, h));
                    group.entry_bytes += len;
                    at += RECORD_HEADER_BYTES + len;
                }
                RECORD_REMOVE => {
                    let r = batch.get(at..at + REMOVE_RECORD_BYTES).ok_or_else(bad)?;
                    let cid = u64::from_le_bytes(r[5..13].try_into().map_err(|_| bad())?);
                    let epoch = u16::from_le_bytes([r[13], r[14]]);
                    let version = u32::from_le_bytes([r[15], r[16], r[17], r[18]]);
                    group.removes.push(VersionRecord {
                        cid,
                        state: VersionState {
                            version: Version { epoch, version },
                            deleted: true,
                        },
                    });
                    at += REMOVE_RECORD_BYTES;
                }
                _ => return Err(bad()),
            }
        }
        Ok(())
    }
}
