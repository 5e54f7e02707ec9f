//! Backup-side versions: the version manager of one zone and its version log on disk.
//!
//! Job: give every write of a chunk a unique, ordered version without keeping one version
//! per chunk in RAM, and tell reorganization and recovery which log entry of a chunk is the
//! current one and which chunks were removed.
//!
//! - A version is `(epoch, version in epoch)`. Each zone counts its own 16-bit epochs; the
//!   top epoch bit is the *eon*. The first write of a chunk in an epoch gets version 0, the
//!   next 1, and so on (24 bits).
//! - The **version buffer** (current epoch only; pages of dense CIDs plus a hash table for
//!   the rest, about 16 bytes per chunk: [`slots`]) holds the chunks written in this
//!   epoch. When it is `seal_entries` full the epoch ends: the buffer is *sealed* (kept in
//!   RAM until the flusher appends it to the version log) and a new epoch starts with an
//!   empty buffer. A chunk written 2^24 − 1 times in one epoch ends it early.
//! - A **remove** is a new version flagged deleted, not an entry in the data log.
//! - Newer-than compares epochs as serial numbers (RFC 1982): epoch `a` is after `b` when
//!   `a − b mod 2^16` is in `1..2^15`. That is exact as long as no current version is more
//!   than half the epoch space old, which reorganization guarantees by visiting every log
//!   at least once per `eon_visit_epochs` and re-stamping old valid entries with a fresh
//!   version ([`VersionManager::restamp`]; a chained chunk's links are written again
//!   with it, [`VersionManager::restamp_chain`]).
//!
//! - **Segment usage**: each buffered version also remembers where the writer placed its
//!   entry; a newer version or a remove of the chunk then takes the old entry's bytes off
//!   its segment's live count ([`SegmentUsage`], an upper bound; see there). The previous
//!   epoch's buffer is kept as a *carry* until the next seal for the same purpose.
//!
//! - **Open chains**: a chained chunk appended link by link (above half the write buffer)
//!   gets its version with its first link, but that version must not count before its
//!   last link is in: until then the chunk's previous version is the only complete one.
//!   The manager keeps such chains ([`OpenChain`]) from the first link until the last one
//!   is durable, and while the last link is still to come: the snapshot shows the chunk's
//!   state from before the chain (`snapshot_into`), the sealed epoch holding the chain's
//!   version is not ready for the version log ([`VersionManager::sealed_ready`]), and the
//!   chunk is not re-stamped. The reorganizer keeps the chains' links
//!   ([`VersionManager::chain_links`]). See "Chained chunks" in docs/log-format.md.
//!
//! Invariants: at most one sealed epoch waits for the disk (a producer that would need a
//! second waits for the flusher); the buffer never exceeds its maximum; the manager does
//! no I/O (the engine persists sealed epochs with [`VersionLog`]); the version log never
//! names the version of a chain before all its links are durable.
//!
//! Callers: the engine's append path (assign), its writer (persist, placed),
//! reorganization (snapshot, restamp, placed, usage) and recovery (snapshot), reopen
//! (rebuild).
//!
//! ## Submodules
//! - [`manager`]: the version manager (assignment, seals, snapshots, placements);
//! - [`chains`]: open chains (chained chunks whose version does not count yet);
//! - [`eon`]: eon visits (epoch hold, re-stamping);
//! - [`slots`]: the version buffer's compact CID table;
//! - [`usage`]: per-segment live-byte estimates;
//! - [`vlog`]: the version log files, [`blocks`]: their block format.
//!
//! This module holds the types every part uses: [`Version`] and its order, the CID map.

mod blocks;
mod chains;
mod eon;
mod manager;
mod slots;
mod usage;
mod vlog;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

pub use blocks::BlockDecoder;
pub use chains::OpenChain;
pub use manager::{AssignBlocked, VersionManager};
pub use usage::{EntryLoc, SegmentUsage};
pub use vlog::VersionLog;

/// A hasher for CIDs. Local IDs are handed out densely, and chunks written together have
/// neighbouring IDs, so the low bits keep the ID's order (folded with its higher bits so
/// that strided IDs still spread over the table): neighbours land in neighbouring
/// buckets, and a burst of writes touches a few cache lines instead of one per chunk.
/// The top 7 bits, which the table uses as a tag within a bucket group, are mixed. CIDs
/// come from the zone's owner, a trusted peer, so no DoS-resistant hash is needed
/// (SipHash cost a third of the append path).
#[derive(Default, Clone, Copy, Debug)]
pub struct CidHasher(u64);

impl Hasher for CidHasher {
    fn finish(&self) -> u64 {
        let x = self.0;
        let low = x ^ (x >> 19) ^ (x >> 37) ^ (x >> 53);
        let mixed = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (low & ((1 << 57) - 1)) | (mixed & !((1 << 57) - 1))
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
    // Zone IDs (two u16) are hashed on every append: shifted in, no multiply per byte.
    fn write_u16(&mut self, n: u16) {
        self.0 = (self.0 << 16) | u64::from(n);
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 << 32) | u64::from(n);
    }
}

/// A hash map keyed by CID.
pub type CidMap<V> = HashMap<u64, V, BuildHasherDefault<CidHasher>>;

/// A chunk's unique version.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Version {
    /// Epoch of the zone in which it was assigned.
    pub epoch: u16,
    /// Number within the epoch (24 bits).
    pub version: u32,
}

/// Half the epoch space: the eon length.
pub const EON_EPOCHS: u16 = 1 << 15;

impl Version {
    /// True if `self` was assigned after `other` (serial-number order on epochs).
    pub fn is_newer_than(self, other: Version) -> bool {
        let ahead = self.epoch.wrapping_sub(other.epoch);
        if ahead == 0 {
            self.version > other.version
        } else {
            ahead < EON_EPOCHS
        }
    }

    /// The eon (top epoch bit) of this version.
    pub fn eon(self) -> u16 {
        self.epoch >> 15
    }
}

/// The current version of one chunk and whether that version is a remove.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct VersionState {
    /// The version.
    pub version: Version,
    /// True if the chunk was removed with this version.
    pub deleted: bool,
}

/// A record of the version log: one chunk's version.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct VersionRecord {
    /// The chunk.
    pub cid: u64,
    /// Its version state.
    pub state: VersionState,
}

/// True if `table` names the entry with `header`'s CID, epoch and version as its chunk's
/// current, not removed, version (the entry is live).
pub(crate) fn is_current(
    table: &CidMap<VersionState>,
    header: &crate::header::EntryHeader,
) -> bool {
    let v = Version {
        epoch: header.epoch,
        version: header.version,
    };
    table
        .get(&header.cid)
        .is_some_and(|s| !s.deleted && s.version == v)
}

/// Inserts `state` for `cid` unless the table has a newer one.
pub fn merge(table: &mut CidMap<VersionState>, cid: u64, state: VersionState) {
    table
        .entry(cid)
        .and_modify(|old| {
            if state.version.is_newer_than(old.version) {
                *old = state;
            }
        })
        .or_insert(state);
}

/// Folds records into a table, newest version per chunk.
pub fn table_from_records(records: &[VersionRecord]) -> CidMap<VersionState> {
    let mut table = CidMap::with_capacity_and_hasher(records.len(), Default::default());
    for r in records {
        merge(&mut table, r.cid, r.state);
    }
    table
}
