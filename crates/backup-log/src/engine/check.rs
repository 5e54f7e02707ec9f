//! The consistency walker ([`LogEngine::check_consistency`]): reads every zone's
//! secondary log, secondary-log buffer and version log back and checks them against the
//! engine's RAM state (segment tables, version managers, sequence numbers). Like the
//! memory manager's `check_consistency`, it is expensive (it reads every used segment)
//! and meant for tests, after crash runs and reorganization runs, while the engine is
//! quiescent. It changes nothing but a flush.
//!
//! Each check, and why it holds (see the [parent module](super) and the module docs it
//! names):
//! - **Segment table** (`seclog`): a free segment has generation 0; a used one holds at
//!   least its header and at most a segment; no two used segments share a generation and
//!   every generation is before the log's next one; the active segment is used and has
//!   room.
//! - **Segment headers and entries** (`seclog`, `header`): every used segment has a valid
//!   header of its generation and a format this code reads, and its entries decode and
//!   verify (checksum with the generation) exactly up to its recorded end. A segment the
//!   table lists as free has no valid header on disk (freeing writes a zero page), so no
//!   segment is both free and used.
//! - **Live-byte estimates** (`version::usage`): the figures are *estimates*, upper bounds
//!   of the live bytes (exact only while at most one epoch ended since the segment was
//!   written): each complete figure must be at least the live bytes counted against the
//!   current versions. Figures still awaiting a census (found at reopen) are skipped, and
//!   so are the entries of chunks with an open chain: while a chain is open the version
//!   buffer names its version, so a copy of the previous version's links (still current)
//!   is taken off the estimate at once when a pass places it; the estimate is then an
//!   upper bound of the other entries only. (Harmless: the estimate only steers which
//!   segments are cleaned; such links are kept whatever it says.)
//! - **Current versions** (`version`, `rebuild`): for every chunk, the version the engine
//!   knows as current (version log plus the version manager's snapshot) and the newest
//!   complete entry on disk (segments and the secondary-log buffer, which is durable in
//!   the primary log; complete chains only; removes of the version log) agree: a chunk
//!   current as a write has exactly that entry as its newest, and the newest entry on
//!   disk is the current version unless the chunk is removed (a removed chunk's versions
//!   may differ: an eon visit's fresh remove lives in RAM until its epoch is sealed).
//!   Chunks with an open or abandoned chain are left out (their snapshot state is by
//!   design the one before the chain).
//! - **Version log** (`version::vlog`): the active file reads back (blocks decode, CRCs
//!   verify) every record written to it since it was opened or compacted.
//! - **Version manager**: its own invariants ([`VersionManager::check_invariants`]).
//! - **Sequence numbers**: `durable_seq` never passes the last sequence number issued,
//!   and after the walker's flush it has reached the last one issued before it.
//!
//! [`VersionManager::check_invariants`]: crate::version::VersionManager::check_invariants

use std::collections::HashSet;
use std::fmt;

use super::LogEngine;
use crate::error::LogResult;
use crate::format::FORMAT_VERSION;
use crate::header;
use crate::rebuild::{merge_removes, ChainTracker};
use crate::seclog::{self, SecondaryLog, SegmentInfo, SEGMENT_HEADER_BYTES};
use crate::storage::{AlignedBuf, LogFile};
use crate::version::{is_current, merge, table_from_records, CidMap, SegmentUsage, VersionState};
use crate::zone::Zone;
use crate::{Seq, ZoneId};

/// One broken invariant found by [`LogEngine::check_consistency`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// The segment table is malformed; `what` says how.
    SegmentTable {
        /// The zone.
        zone: ZoneId,
        /// The segment.
        segment: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// A segment listed as used has no valid header of its generation on disk (`found`:
    /// the generation of the header there, if it verifies), or one of an unknown format.
    SegmentHeader {
        /// The zone.
        zone: ZoneId,
        /// The segment.
        segment: usize,
        /// Its generation in the table.
        generation: u32,
        /// The generation of the header on disk, if it verifies.
        found: Option<u32>,
    },
    /// A used segment's entries do not all decode and verify up to its recorded end.
    SegmentEntries {
        /// The zone.
        zone: ZoneId,
        /// The segment.
        segment: usize,
        /// Its end in the table.
        used: u32,
        /// Where the entries that verify end.
        verified: usize,
    },
    /// A segment listed as free holds a valid header on disk (a reopen would take it as
    /// used).
    FreeSegmentInUse {
        /// The zone.
        zone: ZoneId,
        /// The segment.
        segment: usize,
        /// The generation of the header on disk.
        generation: u32,
    },
    /// A segment's live-byte estimate is below the live bytes counted: the estimate must
    /// be an upper bound.
    LiveEstimate {
        /// The zone.
        zone: ZoneId,
        /// The segment.
        segment: usize,
        /// The version manager's estimate.
        estimated: u64,
        /// The live bytes counted on disk.
        counted: u64,
    },
    /// The entries of the secondary-log buffer do not decode and verify.
    SecondaryBuffer {
        /// The zone.
        zone: ZoneId,
        /// Where the entries that verify end.
        verified: usize,
        /// Bytes in the buffer.
        bytes: usize,
    },
    /// The chunk's current version and its newest complete entry on disk disagree.
    ChunkVersion {
        /// The zone.
        zone: ZoneId,
        /// The chunk.
        cid: u64,
        /// Its current state as the engine knows it (version log and RAM).
        current: Option<VersionState>,
        /// Its newest complete entry on disk, or a newer remove of the version log.
        on_disk: Option<VersionState>,
    },
    /// The version log's active file reads back fewer or more records than were written.
    VersionLog {
        /// The zone.
        zone: ZoneId,
        /// Records written since open or the last compaction.
        written: u64,
        /// Records read back.
        read: u64,
    },
    /// The version manager breaks one of its invariants.
    VersionManager {
        /// The zone.
        zone: ZoneId,
        /// Which.
        what: &'static str,
    },
    /// Sequence numbers out of order.
    Sequence {
        /// What is wrong.
        what: &'static str,
        /// `durable_seq`.
        durable: Seq,
        /// The last sequence number issued.
        issued: Seq,
    },
}

/// What [`LogEngine::check_consistency`] walked, and every violation it found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsistencyReport {
    /// Zones walked.
    pub zones: u64,
    /// Used segments read.
    pub segments: u64,
    /// Entries verified (each chunk of a run entry counts once).
    pub entries: u64,
    /// Chunks whose versions were compared.
    pub chunks: u64,
    /// The broken invariants; empty if the engine is consistent.
    pub violations: Vec<Violation>,
}

impl ConsistencyReport {
    /// True if no invariant is broken.
    pub fn is_consistent(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for ConsistencyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} zones, {} segments, {} entries, {} chunks: {} violations",
            self.zones,
            self.segments,
            self.entries,
            self.chunks,
            self.violations.len()
        )?;
        for v in self.violations.iter().take(20) {
            write!(f, "\n  {v:?}")?;
        }
        Ok(())
    }
}

impl LogEngine {
    /// Walks every zone's secondary log, secondary-log buffer and version log and checks
    /// them against the engine's RAM state (see the checks in `engine/check.rs`): headers
    /// and checksums, the segment table, live-byte estimates (upper bounds), each chunk's
    /// current version against its newest entry on disk, the version log, sequence
    /// numbers. Flushes first. Expensive: reads every used segment. For tests: call it
    /// while no appends or removes run (reorganization passes of a zone wait for it). An
    /// error is an I/O error or a failed engine (nothing checked); violations are in the
    /// report.
    pub fn check_consistency(&self) -> LogResult<ConsistencyReport> {
        let issued_before = self.inner.wb.lock().next_seq - 1;
        self.flush()?;
        let mut report = ConsistencyReport::default();
        let durable = self.durable_seq();
        let issued = self.inner.wb.lock().next_seq - 1;
        if durable > issued {
            report.violations.push(Violation::Sequence {
                what: "durable_seq beyond the last sequence number issued",
                durable,
                issued,
            });
        }
        if durable < issued_before {
            report.violations.push(Violation::Sequence {
                what: "durable_seq short of what a flush made durable",
                durable,
                issued: issued_before,
            });
        }
        let mut zones: Vec<_> = self.inner.zones.read().values().cloned().collect();
        zones.sort_by_key(|z| z.id);
        for zone in zones {
            self.check_zone(&zone, &mut report)?;
        }
        Ok(report)
    }

    fn check_zone(&self, zone: &Zone, report: &mut ConsistencyReport) -> LogResult<()> {
        let inner = &self.inner;
        let id = zone.id;
        report.zones += 1;
        // Reorganization of the zone waits; snapshot before the log lock (lock order).
        let _no_reorg = zone.reorg_lock.lock();
        let (_, _, ram) = inner.snapshot_versions(zone);
        let log = zone.log.lock();
        let (usage, skip, manager) = {
            let vm = zone.versions.lock();
            (
                vm.usage().clone(),
                vm.chunks_with_chains()
                    .into_iter()
                    .collect::<HashSet<u64>>(),
                vm.check_invariants(),
            )
        };
        if let Err(what) = manager {
            report
                .violations
                .push(Violation::VersionManager { zone: id, what });
        }
        let segments = log.seclog.segments();
        check_table(
            id,
            &segments,
            log.seclog.active(),
            log.seclog.next_generation(),
            inner.config.segment_bytes,
            &mut report.violations,
        );
        let records = log.vlog.load()?;
        if records.len() as u64 != log.vlog.records() {
            report.violations.push(Violation::VersionLog {
                zone: id,
                written: log.vlog.records(),
                read: records.len() as u64,
            });
        }
        // The current versions: the version log, then the RAM's.
        let mut current = table_from_records(&records);
        for (cid, state) in ram {
            merge(&mut current, cid, state);
        }
        let walk = SegmentWalk {
            zone: id,
            skip: &skip,
            file: log.seclog.file(),
            segment_bytes: inner.config.segment_bytes as usize,
            payload_max: inner.config.entry_payload_bytes_max(),
        };
        let mut disk = CidMap::default();
        let mut chains = ChainTracker::default();
        for (index, info) in segments.iter().enumerate() {
            walk.segment(
                index,
                *info,
                &current,
                &usage,
                &mut chains,
                &mut disk,
                report,
            )?;
        }
        walk.secondary_buffer(&log.sec_buffer, &mut chains, &mut disk, report);
        chains.finish(&mut disk);
        merge_removes(&mut disk, &records);
        compare_versions(id, &current, &disk, &skip, report);
        Ok(())
    }
}

/// Checks the segment table alone (see the module docs).
fn check_table(
    zone: ZoneId,
    segments: &[SegmentInfo],
    active: Option<usize>,
    next_generation: u32,
    segment_bytes: u64,
    out: &mut Vec<Violation>,
) {
    let mut bad = |segment: usize, what: &'static str| {
        out.push(Violation::SegmentTable {
            zone,
            segment,
            what,
        })
    };
    let mut generations: CidMap<usize> = CidMap::default();
    for (index, s) in segments.iter().enumerate() {
        if s.used == 0 {
            if s.generation != 0 {
                bad(index, "a free segment with a generation");
            }
            continue;
        }
        if (s.used as usize) < SEGMENT_HEADER_BYTES || u64::from(s.used) > segment_bytes {
            bad(index, "used bytes outside header..=segment");
        }
        if s.generation == 0 {
            bad(index, "a used segment of generation 0");
        }
        let ahead = next_generation.wrapping_sub(s.generation);
        if ahead == 0 || ahead > u32::MAX / 2 {
            bad(index, "a generation not before the log's next one");
        }
        if generations.insert(u64::from(s.generation), index).is_some() {
            bad(index, "two used segments of one generation");
        }
    }
    if let Some(a) = active {
        match segments.get(a) {
            Some(s) if s.used > 0 && u64::from(s.used) < segment_bytes => {}
            _ => bad(a, "the active segment is free, full or missing"),
        }
    }
}

/// Reads and checks the segments of one zone.
struct SegmentWalk<'a> {
    zone: ZoneId,
    /// Chunks with an open or abandoned chain (left out of the live count).
    skip: &'a HashSet<u64>,
    file: std::sync::Arc<dyn LogFile>,
    segment_bytes: usize,
    payload_max: u32,
}

impl SegmentWalk<'_> {
    /// Checks segment `index` against the table entry `info` and its live-byte estimate;
    /// adds its entries to `chains`/`disk` (newest complete entry per chunk).
    #[allow(clippy::too_many_arguments)]
    fn segment(
        &self,
        index: usize,
        info: SegmentInfo,
        current: &CidMap<VersionState>,
        usage: &SegmentUsage,
        chains: &mut ChainTracker,
        disk: &mut CidMap<VersionState>,
        report: &mut ConsistencyReport,
    ) -> LogResult<()> {
        let zone = self.zone;
        let mut buf = AlignedBuf::zeroed(self.segment_bytes);
        let file = self.file.as_ref();
        let header_len = if info.used == 0 {
            crate::storage::PAGE_BYTES
        } else {
            info.used as usize
        };
        SecondaryLog::read_segment(file, self.segment_bytes, index, header_len, &mut buf)?;
        let header = seclog::decode_segment_header(&buf);
        if info.used == 0 {
            if let Some(h) = header {
                report.violations.push(Violation::FreeSegmentInUse {
                    zone,
                    segment: index,
                    generation: h.generation,
                });
            }
            return Ok(());
        }
        report.segments += 1;
        if header.is_none_or(|h| h.generation != info.generation || h.format > FORMAT_VERSION) {
            report.violations.push(Violation::SegmentHeader {
                zone,
                segment: index,
                generation: info.generation,
                found: header.map(|h| h.generation),
            });
            return Ok(());
        }
        let mut live = 0u64;
        let mut entries = 0u64;
        let end = seclog::scan_segment(
            &buf,
            info.used as usize,
            zone.owner,
            self.payload_max,
            info.generation,
            true,
            |offset, e| {
                entries += 1;
                let h = e.header;
                chains.observe(disk, h.cid, h.epoch, h.version, h.chain, offset);
                if is_current(current, &h) && !self.skip.contains(&h.cid) {
                    live += e.stored_bytes() as u64;
                }
            },
        );
        report.entries += entries;
        if end != info.used as usize {
            report.violations.push(Violation::SegmentEntries {
                zone,
                segment: index,
                used: info.used,
                verified: end,
            });
        }
        let estimated = usage.live(index as u32, info.generation);
        if let Some(estimated) = estimated {
            if !usage.needs_census(index as u32, info.generation) && estimated < live {
                report.violations.push(Violation::LiveEstimate {
                    zone,
                    segment: index,
                    estimated,
                    counted: live,
                });
            }
        }
        Ok(())
    }

    /// Checks the entries of the secondary-log buffer (write-buffer form, generation 0;
    /// durable in the primary log) and adds them to `chains`/`disk`.
    fn secondary_buffer(
        &self,
        buffer: &[u8],
        chains: &mut ChainTracker,
        disk: &mut CidMap<VersionState>,
        report: &mut ConsistencyReport,
    ) {
        let mut at = 0;
        while let Some(rest) = buffer.get(at..).filter(|r| !r.is_empty()) {
            match header::decode(rest, self.zone.owner, self.payload_max) {
                Ok(e) if e.header.run == 0 && e.verify(0) => {
                    let h = e.header;
                    chains.observe(disk, h.cid, h.epoch, h.version, h.chain, at);
                    report.entries += 1;
                    at += h.entry_bytes();
                }
                _ => {
                    report.violations.push(Violation::SecondaryBuffer {
                        zone: self.zone,
                        verified: at,
                        bytes: buffer.len(),
                    });
                    return;
                }
            }
        }
    }
}

/// Compares the current versions with the newest on disk (see the module docs).
fn compare_versions(
    zone: ZoneId,
    current: &CidMap<VersionState>,
    disk: &CidMap<VersionState>,
    skip: &HashSet<u64>,
    report: &mut ConsistencyReport,
) {
    let live = |s: Option<&VersionState>| s.filter(|s| !s.deleted).copied();
    let cids: HashSet<u64> = current.keys().chain(disk.keys()).copied().collect();
    let mut cids: Vec<u64> = cids.into_iter().filter(|c| !skip.contains(c)).collect();
    cids.sort_unstable();
    for cid in cids {
        report.chunks += 1;
        let (now, found) = (current.get(&cid), disk.get(&cid));
        if live(now) != live(found) {
            report.violations.push(Violation::ChunkVersion {
                zone,
                cid,
                current: now.copied(),
                on_disk: found.copied(),
            });
        }
    }
}
