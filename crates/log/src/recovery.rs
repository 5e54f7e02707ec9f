//! Recovery reads: hand the caller the current version of every chunk of one zone.
//!
//! Job (Beineke §3.4, for issue 6): flush the write buffer and the zone's secondary-log
//! buffer, stop cleaning the log, load the zone's versions, read its segments with several
//! threads, validate entries (checksum optional), and give the caller each chunk's current
//! payload exactly once, as slices of the segment read buffers (no copy before the caller's
//! own). Chained large chunks are reassembled into one buffer first.
//!
//! Invariants: a chunk is delivered only if its entry carries the current version and that
//! version is not a remove; each chunk at most once (a claim flag per version-table slot),
//! also when a crash left two copies of one entry; only whole, verified links make a large
//! chunk.
//!
//! Callers: the node's recovery of a failed peer's zone and the full-restart path (after
//! `LogEngine::open`); `myriad bench log`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::engine::LogEngine;
use crate::error::{LogError, LogResult};
use crate::seclog::{self, SecondaryLog};
use crate::storage::AlignedBuf;
use crate::version::{CidMap, Version, VersionRecord, VersionState};
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

/// The versions of a recovery read: a dense array over the zone owner's main CID range
/// plus a hash table for the rest (migrated chunks, outliers), as DXRAM does (Beineke
/// §3.4). Local IDs are handed out densely, so the array is the common case: one
/// indexed load per entry instead of a hash lookup.
struct RecoveryTable {
    base: u64,
    dense: Vec<Slot>,
    sparse: CidMap<Slot>,
}

impl RecoveryTable {
    fn build(owner: u16, records: &[VersionRecord], ram: &CidMap<VersionState>) -> RecoveryTable {
        let own = |cid: u64| (cid >> 48) as u16 == owner;
        let cids = records.iter().map(|r| r.cid).chain(ram.keys().copied());
        let (mut min, mut max, mut count) = (u64::MAX, 0u64, 0u64);
        for cid in cids.filter(|&c| own(c)) {
            min = min.min(cid);
            max = max.max(cid);
            count += 1;
        }
        let span = max.saturating_sub(min).saturating_add(1);
        let (base, len) = if count > 0 && span <= 2 * count + 4096 {
            (min, span as usize)
        } else {
            (0, 0)
        };
        let mut table = RecoveryTable {
            base,
            dense: (0..len).map(|_| Slot::empty()).collect(),
            sparse: CidMap::default(),
        };
        for r in records {
            table.slot_mut(r.cid).merge(r.state);
        }
        for (&cid, &state) in ram {
            table.slot_mut(cid).merge(state);
        }
        table
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

impl LogEngine {
    /// Reads zone `zone` back: calls `sink` (from several threads at once) with batches of
    /// the current version of every chunk, each exactly once. Flushes first, so every
    /// append made before the call is included; reorganization of the zone pauses for the
    /// duration. **The caller must keep appends to the zone out while this runs**: an
    /// append that lands between the flush and the snapshot of the versions gives its
    /// chunk a version whose entry is not yet in the log, and the chunk is then missing
    /// from the result altogether (`myriad_replica::BackupService::recover_zone` freezes
    /// the zone for that). The zone keeps its logs (see [`LogEngine::remove_zone`]).
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
        // Everything appended so far goes to the secondary log while cleaning may still
        // make room for it. Then cleaning stops and the versions are taken. Appends that
        // come in meanwhile (none when the zone's owner is fenced, as in a recovery) may
        // be missing from the result: waiting for them here could wait for cleaning.
        inner.flush_zone(&z)?;
        let _no_cleaning = z.reorg_lock.lock();
        let (_, _, ram) = inner.snapshot_versions(&z);
        let (file, segments, records) = {
            let log = z.log.lock();
            (log.seclog.file(), log.seclog.segments(), log.vlog.load()?)
        };
        let table = RecoveryTable::build(zone.owner, &records, &ram);
        drop(records);
        let versions_time = started.elapsed();

        let used: Vec<(usize, seclog::SegmentInfo)> = segments
            .into_iter()
            .enumerate()
            .filter(|(_, s)| s.used > 0)
            .collect();
        let segment_bytes = inner.config.segment_bytes as usize;
        let payload_max = inner.config.entry_payload_bytes_max();
        let next = AtomicUsize::new(0);
        let error: Mutex<Option<LogError>> = Mutex::new(None);
        let assemblies: Mutex<CidMap<Assembly>> = Mutex::new(CidMap::default());
        let completed: Mutex<Vec<(u64, Vec<u8>)>> = Mutex::new(Vec::new());
        let counters = [(); 7].map(|_| AtomicU64::new(0));
        let [chunks, payload_bytes, segments_read, bytes_read, seen, skipped, corrupt] = &counters;
        let threads = options.threads.min(used.len().max(1));
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    let mut buf = AlignedBuf::zeroed(segment_bytes);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(index, info)) = used.get(i) else {
                            break;
                        };
                        if error.lock().is_some() {
                            break;
                        }
                        let read = match SecondaryLog::read_segment(
                            file.as_ref(),
                            segment_bytes,
                            index,
                            info.used as usize,
                            &mut buf,
                        ) {
                            Ok(n) => n,
                            Err(e) => {
                                error.lock().get_or_insert(e);
                                break;
                            }
                        };
                        segments_read.fetch_add(1, Ordering::Relaxed);
                        bytes_read.fetch_add(read as u64, Ordering::Relaxed);
                        let segment: &[u8] = &buf;
                        let mut batch: Vec<RecoveredChunk<'_>> = Vec::new();
                        let end = seclog::scan_segment(
                            segment,
                            info.used as usize,
                            zone.owner,
                            payload_max,
                            info.generation,
                            options.verify_crc,
                            |_, e| {
                                seen.fetch_add(1, Ordering::Relaxed);
                                let h = e.header;
                                let v = Version {
                                    epoch: h.epoch,
                                    version: h.version,
                                };
                                let Some(slot) = table.live(h.cid) else {
                                    skipped.fetch_add(1, Ordering::Relaxed);
                                    return;
                                };
                                if slot.version() != v {
                                    skipped.fetch_add(1, Ordering::Relaxed);
                                    return;
                                }
                                match h.chain {
                                    None => {
                                        if slot.claimed.swap(true, Ordering::Relaxed) {
                                            skipped.fetch_add(1, Ordering::Relaxed);
                                            return;
                                        }
                                        batch.push(RecoveredChunk {
                                            cid: h.cid,
                                            payload: e.payload,
                                        });
                                    }
                                    Some(link) => {
                                        let mut a = assemblies.lock();
                                        let asm = a.entry(h.cid).or_insert_with(|| Assembly {
                                            version: v,
                                            count: link.count,
                                            links: vec![None; usize::from(link.count)],
                                            have: 0,
                                        });
                                        let slot_link = asm.links.get_mut(usize::from(link.index));
                                        match slot_link {
                                            Some(l @ None)
                                                if asm.count == link.count && asm.version == v =>
                                            {
                                                *l = Some(e.payload.to_vec());
                                                asm.have += 1;
                                            }
                                            _ => {
                                                skipped.fetch_add(1, Ordering::Relaxed);
                                            }
                                        }
                                        if asm.have == usize::from(asm.count) {
                                            if let Some(done) = a.remove(&h.cid) {
                                                if !slot.claimed.swap(true, Ordering::Relaxed) {
                                                    let whole: Vec<u8> = done
                                                        .links
                                                        .into_iter()
                                                        .flatten()
                                                        .flatten()
                                                        .collect();
                                                    completed.lock().push((h.cid, whole));
                                                }
                                            }
                                        }
                                    }
                                }
                                if batch.len() >= options.batch_chunks_max {
                                    deliver(&batch, sink, chunks, payload_bytes);
                                    batch.clear();
                                }
                            },
                        );
                        if end < info.used as usize {
                            corrupt.fetch_add(1, Ordering::Relaxed);
                        }
                        deliver(&batch, sink, chunks, payload_bytes);
                    }
                });
            }
        });
        if let Some(e) = error.into_inner() {
            return Err(e);
        }
        let completed = completed.into_inner();
        let large = completed.len() as u64;
        for group in completed.chunks(options.batch_chunks_max) {
            let batch: Vec<RecoveredChunk<'_>> = group
                .iter()
                .map(|(cid, payload)| RecoveredChunk { cid: *cid, payload })
                .collect();
            deliver(&batch, sink, chunks, payload_bytes);
        }
        Ok(RecoveryReport {
            chunks: chunks.load(Ordering::Relaxed),
            payload_bytes: payload_bytes.load(Ordering::Relaxed),
            large_chunks: large,
            segments_read: segments_read.load(Ordering::Relaxed),
            bytes_read: bytes_read.load(Ordering::Relaxed),
            entries_seen: seen.load(Ordering::Relaxed),
            entries_skipped: skipped.load(Ordering::Relaxed),
            corrupt_segments: corrupt.load(Ordering::Relaxed),
            versions_time,
            total_time: started.elapsed(),
        })
    }
}

fn deliver(
    batch: &[RecoveredChunk<'_>],
    sink: &(dyn Fn(&[RecoveredChunk<'_>]) + Sync),
    chunks: &AtomicU64,
    payload_bytes: &AtomicU64,
) {
    if batch.is_empty() {
        return;
    }
    chunks.fetch_add(batch.len() as u64, Ordering::Relaxed);
    payload_bytes.fetch_add(
        batch.iter().map(|c| c.payload.len() as u64).sum(),
        Ordering::Relaxed,
    );
    sink(batch);
}
