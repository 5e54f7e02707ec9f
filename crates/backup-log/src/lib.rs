//! # myriad-backup-log: the backup-side log engine
//!
//! Every chunk lives in RAM on its owner and, as a replica, in logs on the disks of R
//! backup peers. This crate is the backup's half: it takes the stream of writes and
//! removes for the owner's *backup zones*, makes them durable on disk with few, large,
//! sequential writes, keeps the logs clean, and reads a zone back for recovery (the
//! two-level logging of the DXRAM system, Beineke ch. 4–6).
//!
//! ## Parts
//! - **Storage boundary** (`storage`): [`Storage`] and [`LogFile`]; [`DiskStorage`] with
//!   O_DIRECT (detected per file, buffered fallback; [`DiskStorage::drop_page_cache`]
//!   empties the page cache of its files for cold-read benchmarks) and [`MemStorage`], an
//!   in-memory backend that injects torn writes, failing syncs and crashes for tests.
//! - **Entry header** (`header`): self-describing, variable-width, CRC32C-checked.
//! - **Write buffer, flusher, writer and syncer** (`engine`): appends go into a bounded
//!   buffer (`engine::append`); a flusher thread sorts them by zone (`engine::flush`) and
//!   a writer thread writes each zone's batch straight to its secondary log (large
//!   batches) or to the primary log plus the zone's secondary-log buffer (small ones)
//!   (`engine::writer`), the sorting of the next flush overlapping the writes of the
//!   current one; a syncer thread syncs a written flush while the writer writes the next
//!   (`engine::sync`). Opening and reopening after a crash: `engine::reopen`; the
//!   reorganizer thread: `engine::reorganizer`; figures: `engine::stats`.
//! - **Zones** (`zone`): one zone's state shared by the engine's threads and the
//!   reorganizer (its logs under one lock, its version manager under another), file names,
//!   counters. **Versions rebuilt from disk** (`rebuild`): the newest complete entry of
//!   each chunk, for reopen and urgent passes.
//! - **I/O threads** (`pipe`): the writer hands each secondary-log page image to them, so
//!   building the next image overlaps the disk write of the last, and writes to several
//!   logs are in flight at once.
//! - **Secondary logs** (`seclog`): one preallocated file per zone in fixed segments.
//! - **Primary log** (`primary`): the durable home of small batches until their zone's
//!   buffer is written; read only when reopening after a crash.
//! - **Versions** (`version`): per zone a version buffer (current epoch) and a version log;
//!   epochs and eons; a remove is a version, not a log entry. The version manager also
//!   estimates each segment's live bytes (`SegmentUsage`) as new versions outdate placed
//!   entries. Submodules: the manager, open chains, eon visits, segment usage, the
//!   version log files and their blocks.
//! - **Reorganization** (`reorg`): passes that clean the fullest logs, picking their
//!   segments by cost-benefit ((1 − u) × √age / (1 + u), after LFS and RAMCloud); run by
//!   the engine's reorganizer thread through the narrow `ReorgHost` trait.
//! - **Format version** (`format`): [`FORMAT_VERSION`] in every file header and
//!   version-log block; older files open, newer ones are refused.
//! - **Recovery reads** (`recovery`): a zone's current chunks, validated by several
//!   threads, handed out as slices of the read buffers.
//! - **Consistency walker** (`engine::check`): [`LogEngine::check_consistency`] reads
//!   every log back and checks it against the RAM state, reporting [`Violation`]s (tests).
//!
//! ## Module dependency order
//! Each module uses only modules listed before it (no cycles; the crate root's
//! [`ZoneId`] and [`Seq`] are used everywhere):
//!
//! 1. `error`, `crc`, `storage`, `format`, `config`, `header`, `interleave` (the
//!    simulator's interleaving points);
//! 2. `pipe` (storage), `version` (header, storage, format);
//! 3. `seclog` (pipe, version's `EntryLoc`), then `primary` (seclog's batch walk);
//! 4. `zone` (seclog, version) and `rebuild` (seclog, version, config);
//! 5. `reorg` (zone, rebuild, seclog, version): it never uses the engine; the engine lends
//!    a pass what it needs through `reorg::ReorgHost`;
//! 6. `engine` (all of the above; its submodules use their parent `engine`, and `flush`,
//!    `writer`, `sync`, `append` each other's items only downwards: append → flush →
//!    sync → writer);
//! 7. `recovery` (engine: it is a method of [`LogEngine`]).
//!
//! ## Durability levels
//! [`LogEngine::append`] returns an [`AppendTicket`] as soon as the write is in the write
//! buffer: the data is then held in this backup's memory (the issue's `replicated` level).
//! [`LogEngine::wait_durable`] with the ticket's sequence number returns once it is on disk
//! (`durable`); [`LogEngine::durable_seq`] can be polled instead. Sequence numbers are one
//! order over all zones, so "everything up to n" is one number.
//!
//! ## Invariants
//! - Never touches the network, and no other Myriad crate: plain integers at the API
//!   (CIDs as `u64`, zones as [`ZoneId`]).
//! - Every buffer, pool and wait is bounded by a [`LogConfig`] field.
//! - No disk content makes it panic: everything read is bounds-checked and checksummed;
//!   what does not verify ends the data of its segment. A header that verifies but is of
//!   a newer format version makes opening fail ([`LogError::UnsupportedFormat`]).
//! - Invariants whose violation would corrupt data are asserted in release builds too;
//!   the append path checks only with `debug_assert!`.
//! - After a crash, reopening yields for every chunk its newest entry that was durable, or
//!   nothing if its newest durable change was a remove (see `docs/log-format.md`).
//!
//! ## Who calls it
//! The node (its ordered backup-message handler appends; recovery reads zones), and
//! `myriad bench log`.

mod config;
mod crc;
mod engine;
mod error;
mod format;
pub mod header;
pub mod interleave;
mod pipe;
mod primary;
mod rebuild;
mod recovery;
mod reorg;
mod seclog;
mod storage;
mod version;
mod zone;

#[cfg(test)]
mod chain_tests;

pub use config::{
    LogConfig, SEGMENTS_PER_LOG_MAX, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN, ZONES_MAX,
};
pub use engine::{
    AppendTicket, CleanedStats, ConsistencyReport, EngineStats, LogEngine, Violation, ZoneStats,
};
pub use error::{DecodeError, LogError, LogResult};
pub use format::FORMAT_VERSION;
pub use recovery::{RecoveredChunk, RecoveryOptions, RecoveryReport};
pub use storage::{
    round_up_to_page, AlignedBuf, DiskStorage, IoMode, LogFile, MemStorage, PageCacheDrop, Storage,
    PAGE_BYTES,
};
pub use version::{
    BlockDecoder, EntryLoc, OpenChain, SegmentUsage, Version, VersionLog, VersionManager,
    VersionRecord, VersionState, EON_EPOCHS,
};

use std::fmt;

/// Position of an append in the engine's single order of appends (starts at 1).
pub type Seq = u64;

/// A backup zone: the owner's node ID and the zone's number among the owner's zones.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ZoneId {
    /// The node that owns the zone's chunks (normally their creator).
    pub owner: u16,
    /// The zone's number at its owner.
    pub zone: u16,
}

impl fmt::Display for ZoneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04x}/{}", self.owner, self.zone)
    }
}
