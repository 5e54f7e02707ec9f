//! One zone's state as the engine's threads and the reorganizer share it ([`Zone`]: its
//! secondary log, secondary-log buffer and version log under one lock, its version
//! manager under another), the names of the files on disk, the engine's counters, and
//! the step that reports placed entries to a zone's version manager.
//!
//! A lower module: [`crate::engine`] and [`crate::reorg`] both use it; it uses neither.
//! Lock order (see [`crate::engine`]): zone reorganization lock → zone log → zone
//! versions.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::seclog::{Placement, SecondaryLog};
use crate::version::{CidHasher, Version, VersionLog, VersionManager};
use crate::ZoneId;

/// The engine's zones.
pub(crate) type ZoneMap = HashMap<ZoneId, Arc<Zone>, std::hash::BuildHasherDefault<CidHasher>>;

/// Counters of the whole engine.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub removes: AtomicU64,
    pub secondary_bytes_written: AtomicU64,
    pub flushes: AtomicU64,
    pub reorg_passes: AtomicU64,
    pub reorg_urgent_passes: AtomicU64,
    pub reorg_segments_cleaned: AtomicU64,
    pub reorg_census_segments: AtomicU64,
    pub reorg_bytes_written: AtomicU64,
    pub reorg_entries_restamped: AtomicU64,
    pub reorg_cleaned: CleanedCounters,
    pub idle_releases: AtomicU64,
}

/// What prompt or periodic passes (index 0) and urgent passes (index 1) found in the
/// segments they cleaned.
#[derive(Debug, Default)]
pub(crate) struct CleanedCounters {
    pub used: [AtomicU64; 2],
    pub estimated_live: [AtomicU64; 2],
    pub live: [AtomicU64; 2],
}

/// The log-side state of one zone.
#[derive(Debug)]
pub(crate) struct ZoneLog {
    pub seclog: SecondaryLog,
    /// Small batches waiting for the secondary log (also in the primary log).
    pub sec_buffer: Vec<u8>,
    pub vlog: VersionLog,
}

/// One zone.
#[derive(Debug)]
pub(crate) struct Zone {
    pub id: ZoneId,
    pub versions: Mutex<VersionManager>,
    pub log: Mutex<ZoneLog>,
    /// Held by a reorganization pass and by a recovery read of this zone.
    pub reorg_lock: Mutex<()>,
    /// Used bytes of the log after its last reorganization pass (a periodic pass is
    /// worth it only after new writes).
    pub used_after_pass: AtomicU64,
}

/// The secondary log file of `zone`.
pub(crate) fn sec_name(zone: ZoneId) -> String {
    format!("zone-{:04x}-{:04x}.sec", zone.owner, zone.zone)
}

/// The base name of the version log files of `zone` (`.0`, `.1` appended).
pub(crate) fn vlog_base(zone: ZoneId) -> String {
    format!("zone-{:04x}-{:04x}.ver", zone.owner, zone.zone)
}

/// The zone whose secondary log file is `name`, if it is one.
pub(crate) fn parse_sec_name(name: &str) -> Option<ZoneId> {
    let rest = name.strip_prefix("zone-")?.strip_suffix(".sec")?;
    let (owner, zone) = rest.split_once('-')?;
    Some(ZoneId {
        owner: u16::from_str_radix(owner, 16).ok()?,
        zone: u16::from_str_radix(zone, 16).ok()?,
    })
}

/// The primary log file.
pub(crate) const PRIMARY_NAME: &str = "primary.log";

/// Placements applied per hold of a zone's version lock (producers wait for it).
pub(crate) const PLACED_PER_LOCK: usize = 1024;

impl Zone {
    /// Reports entries the caller placed in this zone's secondary log to its version
    /// manager (counted in their segments, outdated at once where the chunk is newer).
    /// Called under the zone's log lock, so the reorganizer sees each entry counted
    /// before it can clean the segment; the version lock is taken in parts of
    /// [`PLACED_PER_LOCK`] (producers wait for it).
    pub(crate) fn record_placements(&self, placed: &[Placement]) {
        for part in placed.chunks(PLACED_PER_LOCK) {
            let mut vm = self.versions.lock();
            for (h, loc) in part {
                let version = Version {
                    epoch: h.epoch,
                    version: h.version,
                };
                vm.placed(h.cid, version, h.chain.is_some(), *loc);
            }
        }
    }
}
