//! Recovery reads: hand the caller the current version of every chunk of one zone.
//!
//! Job (Beineke §3.4, for issue 6): flush the write buffer and the zone's secondary-log
//! buffer, stop cleaning the log, load the zone's versions, read its segments, validate
//! entries (checksum optional), and give the caller each chunk's current payload exactly
//! once, as slices of the segment read buffers (no copy before the caller's own). Chained
//! large chunks are reassembled into one buffer first.
//!
//! The reads are a pipeline, so that the disk stays busy from the first byte of the
//! version log to the last segment: reader threads read the version log and the segments
//! ahead into a bounded set of buffers, the calling thread decodes the version log into
//! the version table as its windows arrive (in file order), and the validating threads
//! take the segments as they are read. Counters are per thread (no shared cache line per
//! entry), and checksums go through the one-pass CRC32C of the append path.
//!
//! Invariants: a chunk is delivered only if its entry carries the current version and that
//! version is not a remove; each chunk at most once (a claim flag per version-table slot),
//! also when a crash left two copies of one entry; only whole, verified links make a large
//! chunk.
//!
//! Callers: the node's recovery of a failed peer's zone and the full-restart path (after
//! `LogEngine::open`); `myriad bench log`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::engine::LogEngine;
use crate::error::{io_context, LogError, LogResult};
use crate::header;
use crate::seclog;
use crate::storage::{round_up_to_page, AlignedBuf, LogFile};
use crate::version::{BlockDecoder, CidMap, Version, VersionRecord, VersionState};
use crate::ZoneId;

/// One recovered chunk, borrowing its payload from a read buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RecoveredChunk<'a> {
    /// The chunk's ID.
    pub cid: u64,
    /// Its current payload.
    pub payload: &'a [u8],
}

/// How to run a recovery read.
#[derive(Copy, Clone, Debug)]
pub struct RecoveryOptions {
    /// Threads reading and validating segments (1..=64).
    pub threads: usize,
    /// Verify every entry's checksum.
    pub verify_crc: bool,
    /// The most chunks handed to the callback at once (DXRAM: 100,000).
    pub batch_chunks_max: usize,
}

impl RecoveryOptions {
    /// The options a configuration asks for (`recovery_threads`, `recovery_verify_crc`).
    pub fn from_config(config: &crate::LogConfig) -> RecoveryOptions {
        RecoveryOptions {
            threads: config.recovery_threads,
            verify_crc: config.recovery_verify_crc,
            ..RecoveryOptions::default()
        }
    }
}

impl Default for RecoveryOptions {
    fn default() -> Self {
        RecoveryOptions {
            threads: 4,
            verify_crc: true,
            batch_chunks_max: 100_000,
        }
    }
}

/// What a recovery read found and how long it took.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Chunks delivered.
    pub chunks: u64,
    /// Their payload bytes.
    pub payload_bytes: u64,
    /// Of them, chunks reassembled from chained entries.
    pub large_chunks: u64,
    /// Segments read.
    pub segments_read: u64,
    /// Bytes read from the secondary log.
    pub bytes_read: u64,
    /// Entries parsed.
    pub entries_seen: u64,
    /// Entries skipped as outdated, removed or duplicate.
    pub entries_skipped: u64,
    /// Segments whose entries ended before their known fill level (a checksum or decode
    /// failure: corrupt data).
    pub corrupt_segments: u64,
    /// Time to flush and load the versions.
    pub versions_time: Duration,
    /// Total time.
    pub total_time: Duration,
}

/// One chunk's current version in a [`RecoveryTable`]; 8 bytes.
struct Slot {
    version: u32,
    epoch: u16,
    /// 0 = no version known, 1 = written, 2 = removed.
    state: u8,
    claimed: AtomicBool,
}

impl Slot {
    const EMPTY: u8 = 0;
    const LIVE: u8 = 1;
    const REMOVED: u8 = 2;

    fn empty() -> Slot {
        Slot {
            version: 0,
            epoch: 0,
            state: Slot::EMPTY,
            claimed: AtomicBool::new(false),
        }
    }

    fn version(&self) -> Version {
        Version {
            epoch: self.epoch,
            version: self.version,
        }
    }

    fn merge(&mut self, state: VersionState) {
        if self.state == Slot::EMPTY || state.version.is_newer_than(self.version()) {
            self.version = state.version.version;
            self.epoch = state.version.epoch;
            self.state = if state.deleted {
                Slot::REMOVED
            } else {
                Slot::LIVE
            };
        }
    }
}

/// Local IDs below the first own CID seen that the dense array of a [`RecoveryTable`]
/// still covers (chunks logged slightly out of order).
const DENSE_SLACK: u64 = 1 << 16;
/// Bits of the local ID in a CID.
const LID_MASK: u64 = (1 << 48) - 1;

/// The versions of a recovery read: a dense array over the zone owner's main CID range
/// plus a hash table for the rest (migrated chunks, outliers), as DXRAM does (Beineke
/// §3.4). Local IDs are handed out densely, so the array is the common case: one
/// indexed load per entry instead of a hash lookup.
///
/// Built record by record as the version log is decoded: the array starts a little below
/// the first own CID and grows upwards while the own CIDs stay dense (its span at most
/// twice their number, plus slack); a CID outside it goes to the hash table, and when the
/// array grows over CIDs the hash table holds they move into it, so a CID is always in
/// exactly one of the two.
struct RecoveryTable {
    owner: u16,
    base: u64,
    dense: Vec<Slot>,
    sparse: CidMap<Slot>,
    /// Own CIDs added so far (with repeats).
    own: u64,
    /// Slots to reserve at the first own CID.
    expected: usize,
}

impl RecoveryTable {
    /// An empty table for a zone of `owner`, expecting about `expected` records.
    fn new(owner: u16, expected: usize) -> RecoveryTable {
        RecoveryTable {
            owner,
            base: 0,
            dense: Vec::new(),
            sparse: CidMap::default(),
            own: 0,
            expected,
        }
    }

    /// Merges one version of `cid` (the newer one wins).
    #[inline]
    fn add(&mut self, cid: u64, state: VersionState) {
        if (cid >> 48) as u16 == self.owner {
            if self.own == 0 && self.dense.is_empty() {
                self.base = cid - (cid & LID_MASK).min(DENSE_SLACK);
                self.dense
                    .reserve(self.expected.min(1 << 28) + DENSE_SLACK as usize);
            }
            self.own += 1;
            if let Some(i) = cid.checked_sub(self.base) {
                let span_max = 2 * self.own + 4096 + DENSE_SLACK;
                if i >= self.dense.len() as u64 && i < span_max {
                    let wanted = (self.dense.len() as u64 * 3 / 2).clamp(i + 1, span_max);
                    self.grow(wanted as usize);
                }
            }
        }
        self.slot_mut(cid).merge(state);
    }

    /// Extends the dense array to `len` slots, moving the hash table's CIDs it now covers.
    fn grow(&mut self, len: usize) {
        let old = self.dense.len();
        self.dense.resize_with(len, Slot::empty);
        if self.sparse.is_empty() {
            return;
        }
        let (low, high) = (self.base + old as u64, self.base + len as u64);
        let moved: Vec<u64> = self
            .sparse
            .keys()
            .copied()
            .filter(|cid| (low..high).contains(cid))
            .collect();
        for cid in moved {
            if let (Some(slot), Some(dense)) = (
                self.sparse.remove(&cid),
                self.dense.get_mut((cid - self.base) as usize),
            ) {
                *dense = slot;
            }
        }
    }

    fn slot_mut(&mut self, cid: u64) -> &mut Slot {
        match cid
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < self.dense.len())
        {
            Some(i) => &mut self.dense[i],
            None => self.sparse.entry(cid).or_insert_with(Slot::empty),
        }
    }

    /// The slot of a chunk whose current version is a write.
    #[inline]
    fn live(&self, cid: u64) -> Option<&Slot> {
        let slot = match cid
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
        {
            Some(i) if i < self.dense.len() => self.dense.get(i),
            _ => self.sparse.get(&cid),
        }?;
        (slot.state == Slot::LIVE).then_some(slot)
    }
}

struct Assembly {
    version: Version,
    count: u8,
    links: Vec<Option<Vec<u8>>>,
    have: usize,
}

/// Counts a zone read as running in its engine while it lives.
struct RunningRead<'a> {
    count: &'a AtomicUsize,
}

impl<'a> RunningRead<'a> {
    fn start(count: &'a AtomicUsize) -> RunningRead<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        RunningRead { count }
    }

    /// Other zone reads running in the engine now.
    fn others(&self) -> usize {
        self.count.load(Ordering::Acquire).saturating_sub(1)
    }
}

impl Drop for RunningRead<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Bytes of one read request: a segment is read in pieces of this size (on the virtio
/// disk measured, sequential O_DIRECT reads of 2 MiB reached 1.2–2.1 GB/s where 8 MiB
/// ones stayed at 1.1 GB/s).
const READ_PIECE_BYTES: usize = 2 << 20;
/// Reader threads of a zone read running alone: one reads the version log and then
/// segments, the others segments from the start. Two sequential streams read faster than
/// one on the disk measured (fio: 1.5 vs 1.2 GB/s), and the version log no longer delays
/// the first segments.
const READERS: usize = 2;
/// Reader threads of each zone read while others run in this engine (a restorer of
/// several zones): the disk already has several streams, and more of them cost (a 2 GiB
/// recovery of 8 zones on 4 restorers, one disk: 1,983 and 2,044 ms to availability with
/// one reader per zone against 2,098–2,373 ms with two).
const READERS_SHARED: usize = 1;
/// Read buffers of the version log (the reader fills some while one is decoded).
const VERSION_BUFFERS: usize = 4;
/// Bytes of one version-log read (and of its buffers).
const VERSION_WINDOW_BYTES: usize = READ_PIECE_BYTES;
/// Read buffers beyond one per validating thread: the reader keeps reading while the
/// versions are turned into a table and while every thread validates.
const READ_AHEAD_BUFFERS: usize = 1;

/// One read of the pipeline: a window of the version log or a segment.
#[derive(Copy, Clone, Debug)]
enum ReadJob {
    /// Bytes `offset..offset + len` of the version log's active file.
    Versions { offset: u64, len: usize },
    /// Segment `index` of the secondary log, with its `used` bytes and generation.
    Segment {
        index: usize,
        info: seclog::SegmentInfo,
    },
}

/// A filled read buffer.
struct Filled {
    job: ReadJob,
    buf: AlignedBuf,
    len: usize,
}

/// The read pipeline's shared state: free buffers, filled ones in read order.
#[derive(Default)]
struct PipeState {
    /// Free buffers for segments.
    free: Vec<AlignedBuf>,
    /// Free buffers for version-log windows (kept apart, so that segment reads cannot
    /// take every buffer while the versions, needed first, wait for one).
    version_free: Vec<AlignedBuf>,
    /// Version-log windows in file order (one reader reads them all).
    versions: std::collections::VecDeque<Filled>,
    /// All version-log windows were pushed.
    versions_done: bool,
    segments: std::collections::VecDeque<Filled>,
    /// Readers still running.
    readers_left: usize,
    failed: bool,
}

/// Reader threads reading ahead into a few buffers while the others validate: the disk is
/// kept busy from the first version-log read to the last segment.
#[derive(Default)]
struct Pipe {
    state: Mutex<PipeState>,
    versions_cv: Condvar,
    segments_cv: Condvar,
    free_cv: Condvar,
}

impl Pipe {
    /// Waits for a free buffer for a version-log window (`versions`) or a segment;
    /// `None` once the pipeline failed.
    fn take_free(&self, versions: bool) -> Option<AlignedBuf> {
        let mut state = self.state.lock();
        loop {
            if state.failed {
                return None;
            }
            let free = if versions {
                &mut state.version_free
            } else {
                &mut state.free
            };
            if let Some(buf) = free.pop() {
                return Some(buf);
            }
            self.free_cv.wait(&mut state);
        }
    }

    /// Returns a buffer taken for a version-log window (`versions`) or a segment.
    fn give_back(&self, buf: AlignedBuf, versions: bool) {
        let mut state = self.state.lock();
        if versions {
            state.version_free.push(buf);
        } else {
            state.free.push(buf);
        }
        self.free_cv.notify_all();
    }

    fn push(&self, filled: Filled) {
        let mut state = self.state.lock();
        match filled.job {
            ReadJob::Versions { .. } => {
                state.versions.push_back(filled);
                self.versions_cv.notify_one();
            }
            ReadJob::Segment { .. } => {
                state.segments.push_back(filled);
                self.segments_cv.notify_one();
            }
        }
    }

    /// The next version-log window in file order; `None` after the last one or once the
    /// pipeline failed.
    fn next_versions(&self) -> Option<Filled> {
        let mut state = self.state.lock();
        loop {
            if state.failed {
                return None;
            }
            if let Some(filled) = state.versions.pop_front() {
                return Some(filled);
            }
            if state.versions_done || state.readers_left == 0 {
                return None;
            }
            self.versions_cv.wait(&mut state);
        }
    }

    fn versions_read(&self) {
        self.state.lock().versions_done = true;
        self.versions_cv.notify_all();
    }

    /// The next filled segment; `None` once every segment was read and taken or the
    /// pipeline failed.
    fn next_segment(&self) -> Option<Filled> {
        let mut state = self.state.lock();
        loop {
            if state.failed {
                return None;
            }
            if let Some(filled) = state.segments.pop_front() {
                return Some(filled);
            }
            if state.readers_left == 0 {
                return None;
            }
            self.segments_cv.wait(&mut state);
        }
    }

    fn reader_finished(&self) {
        self.state.lock().readers_left -= 1;
        self.versions_cv.notify_all();
        self.segments_cv.notify_all();
    }

    fn fail(&self) {
        self.state.lock().failed = true;
        self.versions_cv.notify_all();
        self.segments_cv.notify_all();
        self.free_cv.notify_all();
    }
}

/// Stops the pipeline if the thread holding it unwinds (a panicking sink), so the reader
/// does not wait for buffers that never come back.
struct FailOnPanic<'p>(&'p Pipe);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail();
        }
    }
}

/// Reads `[0, len)` of `file` into `buf` in pieces of [`READ_PIECE_BYTES`].
fn read_pieces(file: &dyn LogFile, buf: &mut [u8], offset: u64) -> LogResult<()> {
    let mut done = 0;
    for piece in buf.chunks_mut(READ_PIECE_BYTES) {
        file.read_at(piece, offset + done as u64)
            .map_err(io_context("reading for recovery"))?;
        done += piece.len();
    }
    Ok(())
}

/// An empty vector for new borrows, keeping the allocation of `batch` (emptied).
fn recycle<'b>(mut batch: Vec<RecoveredChunk<'_>>) -> Vec<RecoveredChunk<'b>> {
    batch.clear();
    // An empty iterator collected in place: same element layout, so the allocation is
    // kept and nothing is copied.
    batch
        .into_iter()
        .map(|chunk| RecoveredChunk {
            cid: chunk.cid,
            payload: &[],
        })
        .collect()
}

/// Per-thread counters of a recovery read, added up at the end (shared counters updated
/// per entry would bounce a cache line between the threads).
#[derive(Default)]
struct Counts {
    chunks: u64,
    payload_bytes: u64,
    segments_read: u64,
    bytes_read: u64,
    seen: u64,
    skipped: u64,
    corrupt: u64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.chunks += other.chunks;
        self.payload_bytes += other.payload_bytes;
        self.segments_read += other.segments_read;
        self.bytes_read += other.bytes_read;
        self.seen += other.seen;
        self.skipped += other.skipped;
        self.corrupt += other.corrupt;
    }
}

/// What the validating threads share.
struct Validation<'r> {
    table: &'r RecoveryTable,
    owner: u16,
    payload_max: u32,
    options: &'r RecoveryOptions,
    sink: &'r (dyn Fn(&[RecoveredChunk<'_>]) + Sync),
    assemblies: Mutex<CidMap<Assembly>>,
    completed: Mutex<Vec<(u64, Vec<u8>)>>,
    totals: Mutex<Counts>,
}

impl Validation<'_> {
    /// Validates segments from `pipe` until it is drained, handing current chunks to the
    /// sink in batches.
    fn run(&self, pipe: &Pipe) {
        let _guard = FailOnPanic(pipe);
        let mut counts = Counts::default();
        let mut spare: Vec<RecoveredChunk<'static>> = Vec::new();
        while let Some(filled) = pipe.next_segment() {
            if let ReadJob::Segment { info, .. } = filled.job {
                counts.segments_read += 1;
                counts.bytes_read += filled.len as u64;
                let batch = recycle(std::mem::take(&mut spare));
                let batch = self.segment(&filled.buf, info, batch, &mut counts);
                spare = recycle(batch);
            }
            pipe.give_back(filled.buf, false);
        }
        self.totals.lock().add(&counts);
    }

    /// Validates one segment; returns the (delivered) batch vector for reuse.
    fn segment<'a>(
        &self,
        segment: &'a [u8],
        info: seclog::SegmentInfo,
        mut batch: Vec<RecoveredChunk<'a>>,
        counts: &mut Counts,
    ) -> Vec<RecoveredChunk<'a>> {
        let table = self.table;
        let options = self.options;
        let end = seclog::scan_segment(
            segment,
            info.used as usize,
            self.owner,
            self.payload_max,
            info.generation,
            options.verify_crc,
            |_, e| {
                counts.seen += 1;
                let h = e.header;
                let v = Version {
                    epoch: h.epoch,
                    version: h.version,
                };
                let Some(slot) = table.live(h.cid).filter(|slot| slot.version() == v) else {
                    counts.skipped += 1;
                    return;
                };
                match h.chain {
                    None => {
                        if slot.claimed.swap(true, Ordering::Relaxed) {
                            counts.skipped += 1;
                            return;
                        }
                        batch.push(RecoveredChunk {
                            cid: h.cid,
                            payload: e.payload,
                        });
                        if batch.len() >= options.batch_chunks_max {
                            deliver(&batch, self.sink, counts);
                            batch.clear();
                        }
                    }
                    Some(link) => {
                        if !self.link(h.cid, v, link, e.payload, slot) {
                            counts.skipped += 1;
                        }
                    }
                }
            },
        );
        if end < info.used as usize {
            counts.corrupt += 1;
        }
        deliver(&batch, self.sink, counts);
        batch.clear();
        batch
    }

    /// Adds one link of a large chunk; false if it was not taken (duplicate or stale).
    fn link(
        &self,
        cid: u64,
        v: Version,
        link: header::ChainLink,
        payload: &[u8],
        slot: &Slot,
    ) -> bool {
        let mut a = self.assemblies.lock();
        let asm = a.entry(cid).or_insert_with(|| Assembly {
            version: v,
            count: link.count,
            links: vec![None; usize::from(link.count)],
            have: 0,
        });
        let taken = match asm.links.get_mut(usize::from(link.index)) {
            Some(l @ None) if asm.count == link.count && asm.version == v => {
                *l = Some(payload.to_vec());
                asm.have += 1;
                true
            }
            _ => false,
        };
        if asm.have == usize::from(asm.count) {
            if let Some(done) = a.remove(&cid) {
                if !slot.claimed.swap(true, Ordering::Relaxed) {
                    let whole: Vec<u8> = done.links.into_iter().flatten().flatten().collect();
                    self.completed.lock().push((cid, whole));
                }
            }
        }
        taken
    }
}

/// One reader: first every job of `versions` in order (when given), then segments of
/// `segments` taken in turn with the other readers through `next`. Errors go to `error`.
/// An extra reader (`yields` given) stops taking segments once another zone read runs in
/// the engine; the version reader always reads to the end, so every job is read.
#[allow(clippy::too_many_arguments)]
fn read_all(
    pipe: &Pipe,
    versions: Option<&[ReadJob]>,
    segments: &[ReadJob],
    next: &AtomicUsize,
    version_file: &dyn LogFile,
    segment_file: &dyn LogFile,
    segment_bytes: usize,
    error: &Mutex<Option<LogError>>,
    yields: Option<&RunningRead<'_>>,
) {
    let _done = ReaderDone(pipe);
    let read = |job: ReadJob| -> bool {
        let (file, offset, len): (&dyn LogFile, u64, usize) = match job {
            ReadJob::Versions { offset, len } => (version_file, offset, len),
            ReadJob::Segment { index, info } => (
                segment_file,
                (index * segment_bytes) as u64,
                round_up_to_page(info.used as usize).min(segment_bytes),
            ),
        };
        let Some(mut buf) = pipe.take_free(matches!(job, ReadJob::Versions { .. })) else {
            return false;
        };
        let len = len.min(buf.len());
        if let Err(e) = read_pieces(file, &mut buf[..len], offset) {
            error.lock().get_or_insert(e);
            pipe.fail();
            return false;
        }
        pipe.push(Filled { job, buf, len });
        true
    };
    if let Some(versions) = versions {
        for &job in versions {
            if !read(job) {
                return;
            }
        }
        pipe.versions_read();
    }
    loop {
        if yields.is_some_and(|running| running.others() > 0) {
            return;
        }
        let Some(&job) = segments.get(next.fetch_add(1, Ordering::Relaxed)) else {
            return;
        };
        if !read(job) {
            return;
        }
    }
}

/// Counts a reader out of the pipeline when it ends, however it ends.
struct ReaderDone<'p>(&'p Pipe);

impl Drop for ReaderDone<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail();
        }
        self.0.reader_finished();
    }
}

impl LogEngine {
    /// Reads zone `zone` back: calls `sink` (from several threads at once) with batches of
    /// the current version of every chunk, each exactly once. Flushes first, so every
    /// append made before the call is included; reorganization of the zone pauses for the
    /// duration. **The caller must keep appends to the zone out while this runs**: an
    /// append that lands between the flush and the snapshot of the versions gives its
    /// chunk a version whose entry is not yet in the log, and the chunk is then missing
    /// from the result altogether (`myriad_replication::BackupService::recover_zone` freezes
    /// the zone for that). The zone keeps its logs (see [`LogEngine::remove_zone`]).
    ///
    /// Two reader threads read ahead in large sequential reads: one the version log
    /// (into a few small buffers of its own) and then segments, the other segments from
    /// the start, into `options.threads + 3` segment buffers; one reader does it all while
    /// other zone reads run in this engine (the disk has streams enough then: the second
    /// reader also stops when another zone read starts). This thread turns the
    /// versions into a table as they arrive, then `options.threads` threads (this one
    /// included) validate the segments read meanwhile and as they keep arriving.
    pub fn recover_zone(
        &self,
        zone: ZoneId,
        options: &RecoveryOptions,
        sink: &(dyn Fn(&[RecoveredChunk<'_>]) + Sync),
    ) -> LogResult<RecoveryReport> {
        let started = Instant::now();
        let inner = &self.inner;
        if options.threads == 0 || options.threads > 64 || options.batch_chunks_max == 0 {
            return Err(LogError::InvalidConfig(
                "recovery threads must be 1..=64 and batches at least 1 chunk".into(),
            ));
        }
        let z = inner.zone(zone)?;
        let running = RunningRead::start(&inner.recoveries_running);
        // Everything appended so far goes to the secondary log while cleaning may still
        // make room for it. Then cleaning stops and the versions are taken. Appends that
        // come in meanwhile (none when the zone's owner is fenced, as in a recovery) may
        // be missing from the result: waiting for them here could wait for cleaning.
        inner.flush_zone(&z)?;
        let _no_cleaning = z.reorg_lock.lock();
        let (_, _, ram) = inner.snapshot_versions(&z);
        let (file, segments, (version_file, versions_end), version_records) = {
            let log = z.log.lock();
            (
                log.seclog.file(),
                log.seclog.segments(),
                log.vlog.active_extent(),
                log.vlog.records(),
            )
        };
        let segment_bytes = inner.config.segment_bytes as usize;
        let (version_jobs, segment_jobs) = read_jobs(versions_end, segments);
        let threads = options.threads.min(segment_jobs.len().max(1));
        // An extra reader also stops once another zone read starts (`read_all`).
        let readers = if running.others() > 0 {
            READERS_SHARED
        } else {
            READERS
        };
        let pipe = Pipe::with_buffers(
            threads + readers + READ_AHEAD_BUFFERS,
            segment_bytes,
            readers,
        );
        let next_segment = AtomicUsize::new(0);
        let error: Mutex<Option<LogError>> = Mutex::new(None);
        let table: std::sync::OnceLock<RecoveryTable> = std::sync::OnceLock::new();
        let mut versions_time = Duration::ZERO;
        let validation = |table| Validation {
            table,
            owner: zone.owner,
            payload_max: inner.config.entry_payload_bytes_max(),
            options,
            sink,
            assemblies: Mutex::new(CidMap::default()),
            completed: Mutex::new(Vec::new()),
            totals: Mutex::new(Counts::default()),
        };
        let mut results: Option<Validation<'_>> = None;
        std::thread::scope(|scope| {
            for reader in 0..readers {
                let (pipe, error, next) = (&pipe, &error, &next_segment);
                let (version_jobs, segment_jobs) = (&version_jobs, &segment_jobs);
                let (version_file, file) = (version_file.as_ref(), file.as_ref());
                let running = &running;
                scope.spawn(move || {
                    read_all(
                        pipe,
                        (reader == 0).then_some(version_jobs.as_slice()),
                        segment_jobs,
                        next,
                        version_file,
                        file,
                        segment_bytes,
                        error,
                        (reader > 0).then_some(running),
                    )
                });
            }
            let _guard = FailOnPanic(&pipe);
            // The versions, in file order, while the reader goes on with the segments.
            // Records in the version log (run blocks stand for many per few bytes); a
            // hint for the table's first reservation only (it grows as needed), capped so
            // a long uncompacted log cannot make it reserve gigabytes up front.
            let expected = usize::try_from(version_records.min(1 << 24)).unwrap_or(1 << 24);
            let mut building = RecoveryTable::new(zone.owner, expected);
            let mut decoder = BlockDecoder::new();
            while let Some(filled) = pipe.next_versions() {
                decoder.feed(&filled.buf[..filled.len], &mut |r: VersionRecord| {
                    building.add(r.cid, r.state)
                });
                pipe.give_back(filled.buf, true);
            }
            for (&cid, &state) in &ram {
                building.add(cid, state);
            }
            let table = table.get_or_init(|| building);
            versions_time = started.elapsed();
            let validation = results.insert(validation(table));
            let validation = &*validation;
            for _ in 1..threads {
                scope.spawn(|| validation.run(&pipe));
            }
            validation.run(&pipe);
        });
        if let Some(e) = error.into_inner() {
            return Err(e);
        }
        let Some(validation) = results else {
            return Err(LogError::InvalidConfig("recovery ended early".into()));
        };
        Ok(validation.finish(options, versions_time, started))
    }
}

/// The reads of a zone: the version log's active file up to `versions_end` in windows,
/// and every used segment.
fn read_jobs(
    versions_end: u64,
    segments: Vec<seclog::SegmentInfo>,
) -> (Vec<ReadJob>, Vec<ReadJob>) {
    let mut version_jobs: Vec<ReadJob> = Vec::new();
    let mut offset = 0u64;
    while offset < versions_end {
        let len =
            round_up_to_page((versions_end - offset).min(VERSION_WINDOW_BYTES as u64) as usize);
        version_jobs.push(ReadJob::Versions { offset, len });
        offset += len as u64;
    }
    let segment_jobs: Vec<ReadJob> = segments
        .into_iter()
        .enumerate()
        .filter(|(_, s)| s.used > 0)
        .map(|(index, info)| ReadJob::Segment { index, info })
        .collect();
    (version_jobs, segment_jobs)
}

impl Pipe {
    /// A pipeline with `segment_buffers` segment buffers, the version buffers, and
    /// `readers` reader threads to come.
    fn with_buffers(segment_buffers: usize, segment_bytes: usize, readers: usize) -> Pipe {
        let pipe = Pipe::default();
        {
            let mut state = pipe.state.lock();
            state.free = (0..segment_buffers)
                .map(|_| AlignedBuf::zeroed(segment_bytes))
                .collect();
            state.version_free = (0..VERSION_BUFFERS)
                .map(|_| AlignedBuf::zeroed(VERSION_WINDOW_BYTES))
                .collect();
            state.readers_left = readers;
        }
        pipe
    }
}

impl Validation<'_> {
    /// Delivers the chained chunks assembled by the validating threads and sums up.
    fn finish(
        self,
        options: &RecoveryOptions,
        versions_time: Duration,
        started: Instant,
    ) -> RecoveryReport {
        let sink = self.sink;
        let mut counts = self.totals.into_inner();
        let completed = self.completed.into_inner();
        let large = completed.len() as u64;
        for group in completed.chunks(options.batch_chunks_max) {
            let batch: Vec<RecoveredChunk<'_>> = group
                .iter()
                .map(|(cid, payload)| RecoveredChunk { cid: *cid, payload })
                .collect();
            deliver(&batch, sink, &mut counts);
        }
        RecoveryReport {
            chunks: counts.chunks,
            payload_bytes: counts.payload_bytes,
            large_chunks: large,
            segments_read: counts.segments_read,
            bytes_read: counts.bytes_read,
            entries_seen: counts.seen,
            entries_skipped: counts.skipped,
            corrupt_segments: counts.corrupt,
            versions_time,
            total_time: started.elapsed(),
        }
    }
}

fn deliver(
    batch: &[RecoveredChunk<'_>],
    sink: &(dyn Fn(&[RecoveredChunk<'_>]) + Sync),
    counts: &mut Counts,
) {
    if batch.is_empty() {
        return;
    }
    counts.chunks += batch.len() as u64;
    counts.payload_bytes += batch.iter().map(|c| c.payload.len() as u64).sum::<u64>();
    sink(batch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{encode, ChainLink, EncodeArgs};
    use proptest::prelude::*;

    /// A segment of entries for `owner` (checksums for generation 0), rebased to
    /// `generation` by XOR of each stored checksum, as the secondary log stores them.
    /// CID, epoch, version, chain position (index, count) and payload of a test entry.
    type TestEntry = (u64, u16, u32, Option<(u8, u8)>, Vec<u8>);

    fn segment(entries: &[TestEntry], generation: u32) -> Vec<u8> {
        let mut out = vec![0u8; seclog::SEGMENT_HEADER_BYTES];
        for (cid, epoch, version, chain, payload) in entries {
            let args = EncodeArgs {
                cid: *cid,
                zone_owner: 7,
                epoch: *epoch,
                version: *version & header::VERSION_IN_EPOCH_MAX,
                chain: chain.map(|(index, count)| ChainLink {
                    index: index % count.max(2),
                    count: count.max(2),
                }),
            };
            let at = out.len();
            encode(&args, payload, &mut out);
            let h = header::decode_header(&out[at..], 7, u32::MAX).unwrap();
            header::rebase_crc(&mut out[at..], &h, 0, generation);
        }
        out
    }

    fn entries() -> impl Strategy<Value = Vec<TestEntry>> {
        proptest::collection::vec(
            (
                prop_oneof![
                    (0u64..1 << 20).prop_map(|lid| (7u64 << 48) | lid),
                    any::<u64>(),
                ],
                any::<u16>(),
                any::<u32>(),
                proptest::option::of((any::<u8>(), any::<u8>())),
                proptest::collection::vec(any::<u8>(), 0..300),
            ),
            0..40,
        )
    }

    proptest! {
        /// The one-pass checksum check (`Entry::verify`, which the scans use) agrees with
        /// the `crc32c` crate's two-call checksum on every entry of intact and damaged
        /// segments, for the right and for other generations.
        #[test]
        fn one_pass_verify_equals_the_crate_checksum(
            entries in entries(),
            generation in any::<u32>(),
            scan_generation in prop_oneof![Just(None), any::<u32>().prop_map(Some)],
            damage in proptest::option::of((any::<usize>(), 1u8..=255)),
        ) {
            let mut bytes = segment(&entries, generation);
            if let Some((at, flip)) = damage {
                let at = seclog::SEGMENT_HEADER_BYTES + at % (bytes.len() - seclog::SEGMENT_HEADER_BYTES + 1);
                if let Some(b) = bytes.get_mut(at) {
                    *b ^= flip;
                }
            }
            let generation = scan_generation.unwrap_or(generation);
            let mut checked = Vec::new();
            seclog::scan_segment(&bytes, bytes.len(), 7, 4096, generation, false, |_, e| {
                let before = e.header_raw.get(..e.header.crc_offset()).unwrap_or(&[]);
                let reference = crc32c::crc32c_append(crc32c::crc32c(before), e.payload)
                    ^ generation
                    == e.header.crc;
                checked.push((e.verify(generation), reference));
            });
            for (got, want) in checked {
                prop_assert_eq!(got, want);
            }
        }

        /// The table built record by record answers as a map folded from the same
        /// records (newest version per CID, removes not live), whatever their order and
        /// mix of dense, scattered and foreign CIDs.
        #[test]
        fn recovery_table_equals_a_folded_map(
            records in proptest::collection::vec(
                (
                    prop_oneof![
                        4 => (0u64..3000).prop_map(|lid| (7u64 << 48) | ((1 << 20) + lid)),
                        1 => (0u64..1 << 30).prop_map(|lid| (7u64 << 48) | lid),
                        1 => any::<u64>(),
                    ],
                    0u16..4,
                    0u32..4,
                    any::<bool>(),
                ),
                0..3000,
            ),
            expected_records in 0usize..5000,
        ) {
            let mut table = RecoveryTable::new(7, expected_records);
            let mut reference: CidMap<VersionState> = CidMap::default();
            for &(cid, epoch, version, deleted) in &records {
                let state = VersionState {
                    version: Version { epoch, version },
                    deleted,
                };
                table.add(cid, state);
                match reference.get(&cid) {
                    Some(old) if !state.version.is_newer_than(old.version) => {}
                    _ => {
                        reference.insert(cid, state);
                    }
                }
            }
            for &(cid, ..) in &records {
                let want = reference.get(&cid).filter(|s| !s.deleted).map(|s| s.version);
                prop_assert_eq!(table.live(cid).map(Slot::version), want);
                prop_assert_eq!(table.live(cid ^ (1 << 40)).map(Slot::version),
                    reference.get(&(cid ^ (1 << 40))).filter(|s| !s.deleted).map(|s| s.version));
            }
            // A CID is in exactly one of the two parts.
            for &cid in table.sparse.keys() {
                let inside = cid.checked_sub(table.base).is_some_and(|i| i < table.dense.len() as u64);
                prop_assert!(!inside);
            }
        }
    }

    #[test]
    fn a_recycled_batch_keeps_its_allocation() {
        let payload = vec![1u8; 8];
        let mut batch: Vec<RecoveredChunk<'_>> = Vec::with_capacity(1000);
        batch.push(RecoveredChunk {
            cid: 1,
            payload: &payload,
        });
        let pointer = batch.as_ptr() as usize;
        let recycled: Vec<RecoveredChunk<'static>> = recycle(batch);
        assert!(recycled.is_empty());
        assert!(recycled.capacity() >= 1000);
        assert_eq!(recycled.as_ptr() as usize, pointer);
    }
}
