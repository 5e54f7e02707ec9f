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
//! ## Submodules
//! - [`table`]: the version table with its claim flags, and chain assembly;
//! - [`readers`]: the reader threads and the buffer pipeline;
//! - [`validate`]: the validating threads and delivery in batches.
//!
//! This module: the public types and [`LogEngine::recover_zone`], which wires them up.
//!
//! Callers: the node's recovery of a failed peer's zone and the full-restart path (after
//! `LogEngine::open`); `myriad bench log`.

mod readers;
mod table;
mod validate;

#[cfg(test)]
mod tests;

use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::engine::LogEngine;
use crate::error::{LogError, LogResult};
use crate::seclog;
use crate::storage::{round_up_to_page, AlignedBuf};
use crate::version::{BlockDecoder, CidMap, VersionRecord};
use crate::ZoneId;

use readers::*;
use table::*;
use validate::*;

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
        // The window the caller must keep appends out of (a simulator runs them here).
        crate::interleave::point("log.recover_zone.flushed");
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
