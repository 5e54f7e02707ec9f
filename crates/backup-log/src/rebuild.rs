//! Versions rebuilt from what is on disk: the newest complete entry of each chunk in a
//! zone's segments, complete chains only ([`ChainTracker`]), plus the removes of its
//! version log. After a crash this is the only trustworthy version state (the version
//! buffer lived in RAM).
//!
//! Callers: the engine's reopen (`engine::reopen`), urgent reorganization passes
//! (`reorg`, which cannot use the RAM versions while a write waits), and the consistency
//! check. A lower module: it uses neither the engine nor the reorganizer.

use std::collections::{HashMap, HashSet};

use crate::config::LogConfig;
use crate::error::LogResult;
use crate::header::ChainLink;
use crate::seclog::{self, SecondaryLog, SegmentInfo};
use crate::storage::AlignedBuf;
use crate::version::{merge, table_from_records, CidMap, Version, VersionRecord, VersionState};
use crate::ZoneId;

/// Tracks links of chained chunks so only complete chains count as a version.
#[derive(Debug, Default)]
pub(crate) struct ChainTracker {
    links: HashMap<(u64, Version), (u8, HashSet<u8>)>,
}

impl ChainTracker {
    /// Records one entry's version for `table` (whole chunks at once, links when their
    /// chain is complete, in [`ChainTracker::finish`]).
    pub fn observe(
        &mut self,
        table: &mut CidMap<VersionState>,
        cid: u64,
        epoch: u16,
        version: u32,
        chain: Option<ChainLink>,
        _offset: usize,
    ) {
        let v = Version { epoch, version };
        match chain {
            None => merge(
                table,
                cid,
                VersionState {
                    version: v,
                    deleted: false,
                },
            ),
            Some(link) => {
                let e = self
                    .links
                    .entry((cid, v))
                    .or_insert_with(|| (link.count, HashSet::new()));
                e.1.insert(link.index);
            }
        }
    }

    /// Adds the versions of complete chains to `table`. Returns the newest version of any
    /// link seen, complete chain or not.
    pub fn finish(self, table: &mut CidMap<VersionState>) -> Option<Version> {
        let mut newest: Option<Version> = None;
        for ((cid, version), (count, seen)) in self.links {
            if newest.is_none_or(|n| version.is_newer_than(n)) {
                newest = Some(version);
            }
            if seen.len() == usize::from(count) {
                merge(
                    table,
                    cid,
                    VersionState {
                        version,
                        deleted: false,
                    },
                );
            }
        }
        newest
    }
}

/// Rebuilds the durable version state of a log from its segments and version log: the
/// newest complete entry of each chunk, and removes newer than it.
pub(crate) fn durable_versions(
    file: &dyn crate::storage::LogFile,
    segments: &[SegmentInfo],
    config: &LogConfig,
    zone: ZoneId,
    vlog_records: &[VersionRecord],
) -> LogResult<(CidMap<VersionState>, ChainTracker)> {
    let segment_bytes = config.segment_bytes as usize;
    let payload_max = config.entry_payload_bytes_max();
    let mut table: CidMap<VersionState> = CidMap::default();
    let mut chains = ChainTracker::default();
    let mut buf = AlignedBuf::zeroed(segment_bytes);
    for (index, info) in segments.iter().enumerate() {
        if info.used == 0 {
            continue;
        }
        SecondaryLog::read_segment(file, segment_bytes, index, info.used as usize, &mut buf)?;
        seclog::scan_segment(
            &buf,
            info.used as usize,
            zone.owner,
            payload_max,
            info.generation,
            true,
            |offset, e| {
                let h = e.header;
                chains.observe(&mut table, h.cid, h.epoch, h.version, h.chain, offset);
            },
        );
    }
    merge_removes(&mut table, vlog_records);
    Ok((table, chains))
}

/// Adds the removes of the version log to a table of durable entries: only those newer
/// than a chunk's newest entry matter.
pub(crate) fn merge_removes(table: &mut CidMap<VersionState>, vlog_records: &[VersionRecord]) {
    let removes = table_from_records(vlog_records);
    for (cid, state) in removes {
        if state.deleted {
            merge(table, cid, state);
        }
    }
}
