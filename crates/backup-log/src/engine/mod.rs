//! The log engine: zones, the write buffer, the flusher, writer and syncer threads,
//! durability, reopen.
//!
//! Job: accept appends and removes for (owner, zone) pairs, give each a version and a
//! sequence number, keep them in the bounded write buffer, and have them written to
//! secondary logs (large batches) or the primary log plus secondary-log buffers (small
//! batches); report durability by sequence number.
//!
//! Pipeline (DXRAM's BufferProcessingThread and writer thread): producers fill one half of
//! the write buffer; the **flusher** swaps in a free half, sorts the full one's records by
//! zone into one of two sets of per-zone lists (each entry's place in the half and its
//! decoded header; removes) and hands the lists *with the half* to the **writer**, which
//! copies each entry once, from the half into the page images of the secondary logs (or
//! into the primary log and the zone's secondary-log buffer), writes the version logs,
//! and gives the half back to the producers. Four halves exist: the one producers fill,
//! one being sorted, one queued, one being written; with none free, producers keep
//! filling theirs and then wait (back pressure). A flush without primary-log blocks goes to the **syncer**, which syncs
//! its files and moves `durable_seq` while the writer writes the next flush; a flush with
//! primary-log blocks waits for the syncer, syncs and moves `durable_seq` in the writer.
//! The files of one flush are synced together ([`sync_all`](sync::sync_all)). One sorted flush may wait
//! while the writer writes the other (double buffering), so sorting the next flush
//! overlaps the disk writes of the current one. Each entry the writer places is
//! reported to its zone's version manager, which keeps the per-segment live-byte
//! estimates the reorganizer picks segments by.
//!
//! Invariants:
//! - A chunk above half the write buffer goes in link by link; its version counts from its
//!   last link on (an open chain in the version manager until that link is durable), so
//!   the chunk is complete in its previous version or its new one at every moment, on
//!   disk and in every snapshot (see "Chained chunks" in docs/log-format.md). Once its
//!   first link is in, a link that cannot follow stops the engine.
//! - Sequence numbers are assigned in write-buffer order, under the same lock as versions:
//!   `durable_seq = s` means every append with a sequence number `<= s` is on disk (synced),
//!   including the version-log records of removes. The writer writes flushes in the order
//!   the flusher took them; at most one written flush waits for the syncer, and the
//!   writer waits for it before moving `durable_seq` itself, so `durable_seq` moves in
//!   that order too.
//! - The writer is the only writer of secondary logs besides the reorganizer (and a
//!   recovery read's `flush_zone`); they hold the zone's log lock while they write.
//! - Lock order: write buffer → zone versions; zone reorganization lock → zone log → zone
//!   versions; zone map → write buffer; the flusher/writer and writer/syncer handoff
//!   locks are taken alone. Nobody waits for the writer or the syncer while holding a
//!   zone log lock.
//! - Every wait of a caller is bounded by `wait_timeout` and ends early on an engine
//!   failure; the flusher waits for the writer only until its current flush is written.
//! - RAM: twice the write buffer (four halves, kept from flush to flush: no allocation and
//!   no page faults per flush), two sets of per-zone lists (each dropped when it grew
//!   beyond twice the write buffer's size), and per writing thread a list of placed
//!   entries (at most 64 Ki kept).
//!
//! ## Submodules
//! - [`append`]: the append path into the write buffer (producers);
//! - [`flush`]: the flusher thread (sorting a half by zone);
//! - [`writer`]: the writer thread (secondary logs, primary log, version logs);
//! - [`sync`]: the syncer thread and [`sync_all`](sync::sync_all);
//! - [`reopen`]: [`LogEngine::open`], rebuilding every zone from the disk;
//! - [`reorganizer`]: the reorganizer thread, driving [`crate::reorg`];
//! - [`check`]: the consistency walker ([`LogEngine::check_consistency`]);
//! - [`stats`]: the figures of [`LogEngine::stats`].
//!
//! This module holds the state the threads share ([`Inner`]: write buffer, handoffs,
//! durability) and the public API of [`LogEngine`] besides those.

mod append;
mod check;
mod flush;
mod reopen;
mod reorganizer;
mod stats;
mod sync;
mod writer;

#[cfg(test)]
mod tests;

pub use check::{ConsistencyReport, Violation};
pub use stats::{CleanedStats, EngineStats, ZoneStats};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::config::LogConfig;
use crate::error::{io_context, LogError, LogResult};
use crate::header;
use crate::primary::PrimaryLog;
use crate::seclog::{SecondaryLog, SegmentInfo};
use crate::storage::{AlignedBuf, Storage};
use crate::version::{CidMap, Version, VersionLog, VersionManager, VersionState};
use crate::zone::{sec_name, vlog_base, Counters, Zone, ZoneLog, ZoneMap};
use crate::{Seq, ZoneId};

use append::{Record, RECORD_HEADER_BYTES};
use flush::Groups;

/// Write-buffer halves in all: the one producers fill, one the flusher sorts, one queued
/// for the writer and one it writes.
const WRITE_BUFFER_HALVES: usize = 4;

/// What an append returns: where it is in the order, and the version it got.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AppendTicket {
    /// Sequence number; the append is durable once [`LogEngine::durable_seq`] reaches it.
    pub seq: Seq,
    /// The version the backup assigned.
    pub version: Version,
}

#[derive(Debug)]
struct WriteBuffer {
    active: Vec<u8>,
    /// Halves free for producers (the flusher swaps one in for `active`; the writer gives
    /// each back once its flush is written).
    spares: Vec<Vec<u8>>,
    /// The engine's zones again (the same `Arc`s as `Inner::zones`, changed together under
    /// both locks): the append path finds its zone here under the lock it takes anyway,
    /// without the map's read lock and a reference-count round trip per append.
    zones: ZoneMap,
    /// Entries appended (links of chained chunks count one each); counted under this lock
    /// (no atomic operation per append).
    appended_entries: u64,
    /// Payload bytes appended.
    appended_payload_bytes: u64,
    /// Sequence number the next record gets.
    next_seq: Seq,
    /// Flush everything up to this sequence number as soon as possible.
    flush_wanted: Seq,
    /// The last sequence number the flusher took out of the buffer (handed to the writer).
    taken_seq: Seq,
    /// Flush now even if everything is durable (a sealed epoch must reach the disk).
    wake_now: bool,
}

/// One flush sorted by the flusher, waiting for the writer.
#[derive(Debug)]
struct SortedFlush {
    groups: Groups,
    /// The write-buffer half the groups point into.
    half: Vec<u8>,
    last_seq: Seq,
}

/// Flusher → writer handoff: one sorted flush queued while the writer writes the one
/// before (double buffering), and the sets of per-zone lists not in use.
#[derive(Debug)]
struct Handoff {
    queued: Option<SortedFlush>,
    /// Sets of per-zone lists free for the flusher (two exist in all).
    free: Vec<Groups>,
    /// Set by the flusher when it stops; the writer ends once the queue is empty.
    closed: bool,
}

#[derive(Debug, Default)]
struct Durability {
    durable_seq: Seq,
    failed: Option<String>,
}

/// Reorganization requests.
#[derive(Debug, Default)]
pub(crate) struct ReorgRequests {
    pub urgent: BTreeMap<ZoneId, ()>,
    pub prompt: BTreeMap<ZoneId, ()>,
    /// Bumped after every pass (writers waiting for space watch it).
    pub passes_done: u64,
    /// Writes waiting for a free segment now.
    pub writers_waiting: usize,
    /// The pass running now (zone and why), for diagnostics.
    pub running: Option<(ZoneId, crate::reorg::Mode)>,
}

/// Shared state of the engine and its threads.
#[derive(Debug)]
pub(crate) struct Inner {
    pub config: LogConfig,
    pub storage: Arc<dyn Storage>,
    /// Looked up on every append: keyed with the cheap CID hasher, not SipHash (zone IDs
    /// come from the owners, trusted peers).
    pub zones: RwLock<ZoneMap>,
    wb: Mutex<WriteBuffer>,
    /// Producers wait here for room; the flusher waits here for work.
    wb_cv: Condvar,
    durability: Mutex<Durability>,
    durable_cv: Condvar,
    handoff: Mutex<Handoff>,
    /// The flusher waits here for a free set of per-zone lists or queue room; the writer
    /// for work.
    handoff_cv: Condvar,
    /// Writer → syncer.
    sync_q: Mutex<sync::SyncQueue>,
    sync_cv: Condvar,
    primary: Mutex<Option<PrimaryLog>>,
    pub reorg: Mutex<ReorgRequests>,
    pub reorg_cv: Condvar,
    pub shutdown: AtomicBool,
    /// Set once `durability.failed` is (read on every append without a lock).
    failed: AtomicBool,
    pub counters: Counters,
    /// The writer thread's I/O threads for secondary-log writes (`None` with
    /// `LogConfig::write_threads` 0: it writes them itself).
    pipe: Option<crate::pipe::WritePipe>,
    /// Zone reads for recovery running now (each takes fewer reader threads when others
    /// run).
    pub recoveries_running: std::sync::atomic::AtomicUsize,
    /// What the writer thread does now (one of the `WRITER_*` stages), for diagnostics.
    writer_stage: std::sync::atomic::AtomicU8,
}

/// Writer stage: waiting for a sorted flush.
const WRITER_IDLE: u8 = 0;
/// Writer stage: writing secondary logs, version logs or secondary-log buffers.
const WRITER_WRITING: u8 = 1;
/// Writer stage: waiting until the syncer has no flush in flight.
const WRITER_WAITING_FOR_SYNCER: u8 = 2;
/// Writer stage: syncing the secondary and version logs of a primary-log flush.
const WRITER_SYNCING: u8 = 3;
/// Writer stage: writing and syncing the primary log.
const WRITER_PRIMARY: u8 = 4;
/// Writer stage: writing sealed epochs to the version logs.
const WRITER_SEALED: u8 = 5;
/// Writer stage: handing the flush to the syncer (waits while one is queued there).
const WRITER_SUBMITTING: u8 = 6;
/// Writer stage: giving back burst buffers after a while without appends.
const WRITER_RELEASING: u8 = 7;

/// The name of a writer stage.
fn writer_stage_name(stage: u8) -> &'static str {
    match stage {
        WRITER_IDLE => "idle",
        WRITER_WRITING => "writing logs",
        WRITER_WAITING_FOR_SYNCER => "waiting for the syncer",
        WRITER_SYNCING => "syncing logs",
        WRITER_PRIMARY => "writing the primary log",
        WRITER_SEALED => "writing sealed epochs",
        WRITER_SUBMITTING => "handing a flush to the syncer",
        WRITER_RELEASING => "releasing idle buffers",
        _ => "unknown",
    }
}

/// The backup-side log engine. See the crate documentation.
#[derive(Debug)]
pub struct LogEngine {
    pub(crate) inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

impl LogEngine {
    /// The configuration in effect.
    pub fn config(&self) -> &LogConfig {
        &self.inner.config
    }

    /// Creates the secondary log, version log and buffers of a new zone.
    pub fn create_zone(&self, zone: ZoneId) -> LogResult<()> {
        let inner = &self.inner;
        let mut zones = inner.zones.write();
        if zones.contains_key(&zone) {
            return Err(LogError::ZoneExists(zone));
        }
        if zones.len() >= inner.config.zones_max {
            return Err(LogError::TooManyZones(inner.config.zones_max));
        }
        let config = &inner.config;
        let segments = config.segments_per_log() as usize;
        let file = inner
            .storage
            .open(&sec_name(zone), segments as u64 * config.segment_bytes)
            .map_err(io_context(format!("creating log of zone {zone}")))?;
        // A reused name may hold an old log: clear every segment header.
        let zero = AlignedBuf::zeroed(crate::storage::PAGE_BYTES);
        for s in 0..segments {
            file.write_at(&zero, s as u64 * config.segment_bytes)
                .map_err(io_context("clearing segment headers"))?;
        }
        file.sync().map_err(io_context("syncing new log"))?;
        let seclog = SecondaryLog::new(
            Arc::from(file),
            zone.owner,
            config.segment_bytes as usize,
            config.entry_payload_bytes_max(),
            vec![
                SegmentInfo {
                    used: 0,
                    generation: 0
                };
                segments
            ],
            None,
        )
        .with_runs(config.run_chunk_bytes_max);
        let (mut vlog, old) = VersionLog::open(inner.storage.clone(), &vlog_base(zone))?;
        if !old.is_empty() {
            vlog.compact(&[])?;
        }
        let z = Arc::new(Zone {
            id: zone,
            versions: Mutex::new(VersionManager::new(
                0,
                config.version_seal_entries(),
                config.version_buffer_entries_max,
            )),
            log: Mutex::new(ZoneLog {
                seclog,
                sec_buffer: Vec::new(),
                vlog,
            }),
            reorg_lock: Mutex::new(()),
            used_after_pass: AtomicU64::new(0),
        });
        // Lock order: zone map → write buffer.
        inner.wb.lock().zones.insert(zone, z.clone());
        zones.insert(zone, z);
        Ok(())
    }

    /// Deletes a zone and its files (after it was recovered elsewhere or handed over).
    /// Appends of it still in the write buffer are flushed first.
    pub fn remove_zone(&self, zone: ZoneId) -> LogResult<()> {
        self.flush()?;
        let z = {
            let mut zones = self.inner.zones.write();
            let z = zones.remove(&zone).ok_or(LogError::UnknownZone(zone))?;
            // Lock order: zone map → write buffer.
            self.inner.wb.lock().zones.remove(&zone);
            z
        };
        let _reorg = z.reorg_lock.lock();
        let storage = &self.inner.storage;
        for name in [
            sec_name(zone),
            format!("{}.0", vlog_base(zone)),
            format!("{}.1", vlog_base(zone)),
        ] {
            storage
                .remove(&name)
                .map_err(io_context(format!("removing {name}")))?;
        }
        Ok(())
    }

    /// The zones of this engine, sorted.
    pub fn zones(&self) -> Vec<ZoneId> {
        let mut z: Vec<ZoneId> = self.inner.zones.read().keys().copied().collect();
        z.sort();
        z
    }

    /// Appends a write of chunk `cid` with `payload` to `zone`'s log: assigns the next
    /// version, copies the entry into the write buffer and returns at once (the data is
    /// then held in memory: the `replicated` durability level). Chunks above half a
    /// segment are split into chained entries. Waits (bounded) while the write buffer is
    /// full.
    pub fn append(&self, zone: ZoneId, cid: u64, payload: &[u8]) -> LogResult<AppendTicket> {
        let inner = &self.inner;
        let max = inner.config.chunk_bytes_max;
        if payload.len() as u64 > max {
            return Err(LogError::ChunkTooLarge {
                bytes: payload.len() as u64,
                max,
            });
        }
        let link_bytes = inner.config.entry_payload_bytes_max() as usize;
        if payload.len() <= link_bytes {
            return inner.push_put(zone, cid, payload);
        }
        let z = inner.zone(zone)?;
        let count = payload.len().div_ceil(link_bytes);
        let chain_bytes = count * (RECORD_HEADER_BYTES + header::HEADER_BYTES_MAX) + payload.len();
        if chain_bytes <= (inner.config.write_buffer_bytes / 2) as usize {
            // The whole chain in one go: it lands in one flush, so no epoch naming its
            // version reaches the version log before every link is durable.
            return inner.push_chain(&z, cid, payload, link_bytes, chain_bytes);
        }
        // Larger than half the write buffer: link by link, an open chain until its last
        // link (see docs/log-format.md).
        inner.push_links(&z, cid, payload, link_bytes, 0..count, None)
    }

    /// Appends writes of several chunks of one zone (one log message of the owner) with
    /// one lock round trip for as many as fit in the write buffer; as [`LogEngine::append`]
    /// otherwise. Returns the sequence number of the last one (all earlier ones are
    /// durable when it is). An empty batch returns the last sequence number issued.
    pub fn append_batch(&self, zone: ZoneId, chunks: &[(u64, &[u8])]) -> LogResult<Seq> {
        let inner = &self.inner;
        let z = inner.zone(zone)?;
        let link_bytes = inner.config.entry_payload_bytes_max() as usize;
        let mut last = inner.wb.lock().next_seq - 1;
        let mut start = 0;
        while start < chunks.len() {
            // Runs of small chunks go in together; a large one goes alone (chained).
            let run = chunks[start..]
                .iter()
                .position(|(_, p)| p.len() > link_bytes)
                .unwrap_or(chunks.len() - start);
            if run > 0 {
                last = inner.push_many(&z, &chunks[start..start + run])?;
                start += run;
            } else {
                let (cid, payload) = chunks[start];
                last = self.append(zone, cid, payload)?.seq;
                start += 1;
            }
        }
        Ok(last)
    }

    /// Whether `zone` takes `chunks` appends (writes or removes) of `payload_bytes` in all
    /// right now, without waiting for the flusher: the zone exists, the engine has not
    /// failed, no payload needs a chain (each is at most `payload_max` bytes), the write
    /// buffer's active half has room for them and the zone's version buffer has room for
    /// that many new chunks. A snapshot: another appender may take the room before the
    /// caller appends, which then waits as usual. For callers that must not block (the
    /// backup service applying replication inline on an I/O thread).
    pub fn room_now(
        &self,
        zone: ZoneId,
        chunks: usize,
        payload_bytes: usize,
        payload_max: usize,
    ) -> bool {
        let inner = &self.inner;
        if inner.failed.load(Ordering::Relaxed) || inner.shutdown.load(Ordering::Relaxed) {
            return false;
        }
        if payload_max > inner.config.entry_payload_bytes_max() as usize {
            return false;
        }
        let Ok(z) = inner.zone(zone) else {
            return false;
        };
        let half = (inner.config.write_buffer_bytes / 2) as usize;
        let needed = chunks * (RECORD_HEADER_BYTES + header::HEADER_BYTES_MAX) + payload_bytes;
        if inner.wb.lock().active.len() + needed > half {
            return false;
        }
        let room = z.versions.lock().room_now(chunks);
        room
    }

    /// Removes chunk `cid` from `zone`: a new version flagged deleted, made durable in the
    /// zone's version log by the next flush (no entry in the data log).
    pub fn remove(&self, zone: ZoneId, cid: u64) -> LogResult<AppendTicket> {
        let z = self.inner.zone(zone)?;
        self.inner.counters.removes.fetch_add(1, Ordering::Relaxed);
        self.inner.push(&z, cid, Record::Remove, None)
    }

    /// Everything appended up to this sequence number is durable.
    pub fn durable_seq(&self) -> Seq {
        self.inner.durability.lock().durable_seq
    }

    /// Waits until append `seq` is durable (the `durable` level), at most `timeout`.
    /// Asks the flusher to flush now rather than at its next interval.
    pub fn wait_durable(&self, seq: Seq, timeout: Duration) -> LogResult<()> {
        self.inner.wait_durable(seq, timeout)
    }

    /// Flushes everything appended so far and waits until it is durable.
    pub fn flush(&self) -> LogResult<()> {
        let seq = self.inner.wb.lock().next_seq - 1;
        self.inner.wait_durable(seq, self.inner.config.wait_timeout)
    }

    /// Flushes, stops the threads and closes the files.
    pub fn shutdown(mut self) -> LogResult<()> {
        let result = self.flush();
        self.stop();
        result
    }

    fn stop(&mut self) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        // Notified under each condition variable's mutex: a thread that checked the flag
        // under that mutex and is about to wait cannot miss the wake-up (it would sleep a
        // whole flush or reorganization interval; found by the simulator, whose intervals
        // are an hour).
        {
            let _wb = self.inner.wb.lock();
            self.inner.wb_cv.notify_all();
        }
        {
            let _reorg = self.inner.reorg.lock();
            self.inner.reorg_cv.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Requests a reorganization pass of `zone` now (as a prompt request) and waits until
    /// the reorganizer finished a pass. For tests and tools.
    pub fn reorganize_now(&self, zone: ZoneId) -> LogResult<()> {
        self.inner.zone(zone)?;
        let mut r = self.inner.reorg.lock();
        r.prompt.insert(zone, ());
        let target = r.passes_done + 1;
        self.inner.reorg_cv.notify_all();
        let deadline = Instant::now() + self.inner.config.wait_timeout;
        while r.passes_done < target || r.prompt.contains_key(&zone) {
            if self.inner.reorg_cv.wait_until(&mut r, deadline).timed_out() {
                drop(r);
                return Err(self.inner.timeout("reorganization"));
            }
        }
        Ok(())
    }
}

impl Drop for LogEngine {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Inner {
    pub(crate) fn zone(&self, zone: ZoneId) -> LogResult<Arc<Zone>> {
        self.zones
            .read()
            .get(&zone)
            .cloned()
            .ok_or(LogError::UnknownZone(zone))
    }

    fn check_failed(&self) -> LogResult<()> {
        if self.failed.load(Ordering::Relaxed) {
            if let Some(msg) = &self.durability.lock().failed {
                return Err(LogError::Failed(msg.clone()));
            }
        }
        if self.shutdown.load(Ordering::Relaxed) {
            return Err(LogError::ShutDown);
        }
        Ok(())
    }

    pub(crate) fn wait_durable(&self, seq: Seq, timeout: Duration) -> LogResult<()> {
        let deadline = Instant::now() + timeout;
        {
            let mut wb = self.wb.lock();
            if seq >= wb.next_seq {
                return Err(LogError::Failed(format!(
                    "sequence number {seq} not issued"
                )));
            }
            if seq > self.durability.lock().durable_seq {
                wb.flush_wanted = wb.flush_wanted.max(seq);
                self.wb_cv.notify_all();
            }
        }
        let mut d = self.durability.lock();
        while d.durable_seq < seq {
            if let Some(msg) = &d.failed {
                return Err(LogError::Failed(msg.clone()));
            }
            if self.shutdown.load(Ordering::Relaxed) {
                return Err(LogError::ShutDown);
            }
            if self.durable_cv.wait_until(&mut d, deadline).timed_out() {
                drop(d);
                return Err(self.timeout("durability"));
            }
        }
        Ok(())
    }

    /// The next sequence number to be issued minus one, with a snapshot of `zone`'s
    /// version state in RAM taken atomically with it.
    pub(crate) fn snapshot_versions(&self, zone: &Zone) -> (Seq, u16, CidMap<VersionState>) {
        // Read before the locks: a chain whose last link was durable by then shows its
        // version in the snapshot whether or not it is still registered.
        let durable = self.durable_now();
        let wb = self.wb.lock();
        let mut vm = zone.versions.lock();
        vm.prune_chains(durable);
        let mut table = CidMap::with_capacity_and_hasher(vm.buffered(), Default::default());
        vm.snapshot_into(&mut table);
        (wb.next_seq - 1, vm.epoch(), table)
    }

    /// Makes every append of `zone` so far durable in its secondary log (write buffer,
    /// then secondary-log buffer) and returns the zone's RAM versions as of then.
    pub(crate) fn flush_zone(&self, zone: &Zone) -> LogResult<CidMap<VersionState>> {
        let (seq, _, ram) = self.snapshot_versions(zone);
        if seq > 0 {
            self.wait_durable(seq, self.config.wait_timeout)?;
        }
        let pending = std::mem::take(&mut zone.log.lock().sec_buffer);
        if !pending.is_empty() {
            self.write_secondary(zone, &pending)?;
        }
        zone.log.lock().seclog.sync()?;
        Ok(ram)
    }

    /// A [`LogError::Timeout`] for a wait for `what`, with where the pipeline stands
    /// (see [`Inner::pipeline_state`]). Called without any of the engine's locks held.
    pub(crate) fn timeout(&self, what: &'static str) -> LogError {
        LogError::Timeout {
            what,
            state: self.pipeline_state(),
        }
    }

    /// Where the pipeline stands, one lock at a time (never two at once, so it cannot
    /// deadlock with the threads): sequence numbers issued, taken by the flusher and
    /// durable; write-buffer halves free; the flush queued for the writer and the one
    /// with the syncer; writes waiting for a free segment and the reorganization pass
    /// running.
    pub(crate) fn pipeline_state(&self) -> String {
        let (issued, taken, wanted, spares, active) = {
            let wb = self.wb.lock();
            (
                wb.next_seq - 1,
                wb.taken_seq,
                wb.flush_wanted,
                wb.spares.len(),
                wb.active.len(),
            )
        };
        let (durable, failed) = {
            let d = self.durability.lock();
            (d.durable_seq, d.failed.clone())
        };
        let (queued, groups_free) = {
            let h = self.handoff.lock();
            (h.queued.as_ref().map(|f| f.last_seq), h.free.len())
        };
        let (sync_job, sync_busy) = {
            let q = self.sync_q.lock();
            (q.job.as_ref().map(|j| j.last_seq), q.busy)
        };
        let (waiting, running, urgent, passes) = {
            let r = self.reorg.lock();
            (r.writers_waiting, r.running, r.urgent.len(), r.passes_done)
        };
        let writer = writer_stage_name(self.writer_stage.load(Ordering::Relaxed));
        format!(
            "issued {issued}, flush wanted to {wanted}, taken {taken}, durable {durable}; \
             active half {active} B, {spares} free halves, {groups_free} free list sets; \
             writer {writer}, queued for it {queued:?}; \
             syncer queue {sync_job:?} (busy {sync_busy}); \
             writes waiting for a free segment {waiting}, urgent requests {urgent}, \
             reorganizing {running:?}, passes {passes}{}",
            failed.map(|f| format!("; failed: {f}")).unwrap_or_default()
        )
    }

    pub(crate) fn durable_now(&self) -> Seq {
        self.durability.lock().durable_seq
    }

    pub(crate) fn request_flush(&self, seq: Seq) {
        let mut wb = self.wb.lock();
        wb.flush_wanted = wb.flush_wanted.max(seq);
        self.wb_cv.notify_all();
    }

    pub(crate) fn fail(&self, msg: String) {
        let mut d = self.durability.lock();
        if d.failed.is_none() {
            d.failed = Some(msg);
        }
        self.failed.store(true, Ordering::SeqCst);
        self.durable_cv.notify_all();
        drop(d);
        self.wb_cv.notify_all();
    }
}
