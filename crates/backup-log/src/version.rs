//! Backup-side versions: the version manager of one zone and its version log on disk.
//!
//! Job: give every write of a chunk a unique, ordered version without keeping one version
//! per chunk in RAM, and tell reorganization and recovery which log entry of a chunk is the
//! current one and which chunks were removed.
//!
//! - A version is `(epoch, version in epoch)`. Each zone counts its own 16-bit epochs; the
//!   top epoch bit is the *eon*. The first write of a chunk in an epoch gets version 0, the
//!   next 1, and so on (24 bits).
//! - The **version buffer** (a hash table, current epoch only) holds the chunks written in
//!   this epoch. When it is `seal_entries` full the epoch ends: the buffer is *sealed*
//!   (kept in RAM until the flusher appends it to the version log) and a new epoch starts
//!   with an empty buffer. A chunk written 2^24 − 1 times in one epoch ends it early.
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

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::{io_context, LogResult};
use crate::header::VERSION_IN_EPOCH_MAX;
use crate::storage::{round_up_to_page, AlignedBuf, LogFile, Storage, PAGE_BYTES};

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

/// An ended epoch waiting to be appended to the version log.
#[derive(Debug, Clone)]
pub struct SealedEpoch {
    /// The epoch that ended.
    pub epoch: u16,
    /// Its records.
    pub records: Vec<VersionRecord>,
    /// The highest engine sequence number of an append that got a version in it: the
    /// epoch may be written to the version log only once that append is durable, so the
    /// version log never names a version whose entry could still be lost.
    pub last_seq: u64,
}

/// Why a version could not be assigned now.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AssignBlocked {
    /// The buffer is full and the previous sealed epoch is not on disk yet: wait for the
    /// flusher, then retry.
    SealPending,
}

/// Where an entry lies in its zone's secondary log: segment, the segment's generation
/// (0 = not known) and the entry's bytes (header and payload).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct EntryLoc {
    /// Segment index.
    pub segment: u32,
    /// Generation of the segment's use that holds the entry; 0 if the place is not known.
    pub generation: u32,
    /// Entry bytes.
    pub bytes: u32,
}

/// One chunk in the version buffer: its version in the current epoch, whether that is a
/// remove, and where that version's entry was placed (once the writer placed it).
/// 16 bytes (24 with its key in the table, down from 32 with a separate flag): the
/// version buffer is touched on every append and every placement.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Slot {
    /// The version (24 bits) with the deleted flag in bit 31.
    word: u32,
    loc: EntryLoc,
}

const SLOT_DELETED: u32 = 1 << 31;

impl Slot {
    fn new(version: u32, deleted: bool) -> Slot {
        Slot {
            word: version | if deleted { SLOT_DELETED } else { 0 },
            loc: EntryLoc::default(),
        }
    }

    fn version(&self) -> u32 {
        self.word & !SLOT_DELETED
    }

    fn deleted(&self) -> bool {
        self.word & SLOT_DELETED != 0
    }
}

/// Estimated live bytes per segment of one zone's secondary log (for the reorganizer's
/// cost-benefit choice of segments).
///
/// Every entry placed adds its bytes to its segment's use (keyed by the segment's
/// generation, so a freed and reused segment starts from zero); an entry is subtracted
/// when the version manager learns that its chunk got a newer version or was removed and
/// knows where the old entry lies: that is the case while the old version is in the
/// version buffer (written in the current epoch) or in the previous epoch's buffer (kept
/// as the *carry* until the next epoch ends) and the writer recorded its place. A chunk
/// whose previous version is from an older epoch, links of chained chunks, and every
/// entry found when the log was reopened are never subtracted, so the figure is an upper
/// bound of the live bytes (exact while at most one epoch ended since the segment was
/// written); cleaning a segment makes its successor exact again. Segments found at reopen
/// start unknown; the reorganizer counts them against the durable versions (a *census*,
/// [`SegmentUsage::set_counted`]) before it picks segments of that log by these figures.
#[derive(Debug, Default, Clone)]
pub struct SegmentUsage {
    /// Per segment: (generation, live bytes); generation 0 = nothing known.
    segments: Vec<(u32, u64)>,
    /// Uses (segment, generation) whose count lacks entries found at reopen: the segment
    /// that was active then, whose new entries were counted but not its old ones.
    partial: Vec<(u32, u32)>,
}

impl SegmentUsage {
    fn slot(&mut self, segment: u32) -> &mut (u32, u64) {
        let i = segment as usize;
        if i >= self.segments.len() {
            self.segments.resize(i + 1, (0, 0));
        }
        &mut self.segments[i]
    }

    /// Counts an entry of `bytes` placed in `segment` (use `generation`).
    pub fn add(&mut self, segment: u32, generation: u32, bytes: u64) {
        let s = self.slot(segment);
        if s.0 != generation {
            *s = (generation, 0);
        }
        s.1 += bytes;
    }

    /// Takes an outdated entry off its segment's count (if the segment still holds that
    /// use).
    pub fn outdate(&mut self, loc: EntryLoc) {
        if loc.generation == 0 {
            return;
        }
        if let Some(s) = self.segments.get_mut(loc.segment as usize) {
            if s.0 == loc.generation {
                s.1 = s.1.saturating_sub(u64::from(loc.bytes));
            }
        }
    }

    /// Marks the use `generation` of `segment` as missing the entries found at reopen.
    pub fn mark_partial(&mut self, segment: u32, generation: u32) {
        if !self.partial.contains(&(segment, generation)) {
            self.partial.push((segment, generation));
        }
    }

    /// True if the figure of this use is not complete: nothing counted, or only what was
    /// written after a reopen.
    pub fn needs_census(&self, segment: u32, generation: u32) -> bool {
        self.live(segment, generation).is_none() || self.partial.contains(&(segment, generation))
    }

    /// Sets the live bytes of a use, counted from the disk against the durable versions.
    pub fn set_counted(&mut self, segment: u32, generation: u32, live: u64) {
        *self.slot(segment) = (generation, live);
        self.partial.retain(|&p| p != (segment, generation));
    }

    /// Estimated live bytes of `segment` in its use `generation`; `None` if nothing was
    /// counted for that use (a segment found at reopen: treat it as all live).
    pub fn live(&self, segment: u32, generation: u32) -> Option<u64> {
        self.segments
            .get(segment as usize)
            .filter(|s| s.0 == generation && generation != 0)
            .map(|s| s.1)
    }
}

/// A chained chunk appended link by link: registered with its first link, its last link
/// pushed or not yet (see the module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct OpenChain {
    /// The chunk.
    pub cid: u64,
    /// The version all its links carry.
    pub version: Version,
    /// The chunk's state as snapshots showed it just before the first link: its complete
    /// version then. `None`: the RAM did not know the chunk, the version log's state
    /// counts (it cannot name this chain, see [`VersionManager::sealed_ready`]).
    pub prior: Option<VersionState>,
    /// `None` while links are still to come; the last link's sequence number once it was
    /// pushed (the chain is then dropped once that is durable).
    pub last_seq: Option<u64>,
}

/// Version buffer and epoch counter of one zone (no I/O). See the module docs.
#[derive(Debug)]
pub struct VersionManager {
    epoch: u16,
    buffer: CidMap<Slot>,
    /// The previous epoch's buffer (kept after it was sealed): where the entries of its
    /// chunks lie, so the first write of a chunk in this epoch still outdates its old
    /// entry. Emptied by the next seal.
    carry: CidMap<Slot>,
    /// The smallest and largest CID in `carry` when it was made (an empty range while it
    /// is empty): a chunk outside it is not in the carry, so the first write of a new
    /// chunk (IDs are handed out in ascending order) skips the carry lookup.
    carry_range: (u64, u64),
    /// Live bytes per segment, kept up to date as versions supersede placed entries.
    usage: SegmentUsage,
    sealed: Option<SealedEpoch>,
    /// Highest sequence number assigned in the current epoch.
    epoch_last_seq: u64,
    seal_entries: usize,
    entries_max: usize,
    /// Epoch at which the last full visit of the log started.
    last_full_visit_epoch: u16,
    /// While set (during an eon visit of the log), the epoch ends only when the buffer is
    /// completely full, not at the seal threshold, so re-stamping stays possible.
    hold: bool,
    /// Chains appended link by link whose last link is not durable yet (a few at most:
    /// one per producer appending a chunk above half the write buffer).
    chains: Vec<OpenChain>,
    /// Chains an eon visit registered for a fresh copy of an old chained chunk and then
    /// gave up ([`VersionManager::abandon_chain`]): their version stays in the buffer (so
    /// it is never handed out again) but never counts: snapshots show `prior`, and the
    /// seal leaves its record out of the version log. Emptied by the next seal.
    abandoned: Vec<OpenChain>,
}

impl VersionManager {
    /// A manager starting in `epoch` with an empty buffer.
    pub fn new(epoch: u16, seal_entries: usize, entries_max: usize) -> VersionManager {
        VersionManager {
            epoch,
            buffer: CidMap::default(),
            carry: CidMap::default(),
            carry_range: (u64::MAX, 0),
            usage: SegmentUsage::default(),
            sealed: None,
            epoch_last_seq: 0,
            seal_entries: seal_entries.clamp(1, entries_max.max(1)),
            entries_max: entries_max.max(1),
            last_full_visit_epoch: epoch,
            hold: false,
            chains: Vec::new(),
            abandoned: Vec::new(),
        }
    }

    /// Holds the epoch (see the field) or releases it, ending it now if it is due.
    pub fn hold_epoch(&mut self, hold: bool) {
        self.hold = hold;
        if !hold && self.buffer.len() >= self.seal_entries {
            self.seal();
        }
    }

    /// Whether the epoch is held ([`VersionManager::hold_epoch`]).
    pub fn epoch_held(&self) -> bool {
        self.hold
    }

    /// The current epoch.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    /// Chunks in the buffer.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Bytes of RAM the buffer, the previous epoch's carry, the segment counters and the
    /// sealed epoch use (approximate, by capacity).
    pub fn memory_bytes(&self) -> u64 {
        let per = (std::mem::size_of::<(u64, Slot)>() + 1) as u64;
        (self.buffer.capacity() + self.carry.capacity()) as u64 * per
            + self.usage.segments.capacity() as u64 * 16
            + self.sealed.as_ref().map_or(0, |s| {
                s.records.capacity() as u64 * std::mem::size_of::<VersionRecord>() as u64
            })
    }

    /// Epochs since the last full visit started.
    pub fn epochs_since_full_visit(&self) -> u16 {
        self.epoch.wrapping_sub(self.last_full_visit_epoch)
    }

    /// Records that a full visit of the log started at epoch `epoch`.
    pub fn full_visit_started(&mut self, epoch: u16) {
        self.last_full_visit_epoch = epoch;
    }

    /// Ends the current epoch now if the buffer is not empty and no sealed epoch waits.
    /// Returns false if a sealed epoch is still waiting.
    pub fn seal(&mut self) -> bool {
        if self.sealed.is_some() {
            return false;
        }
        if self.buffer.is_empty() {
            return true;
        }
        // The buffer becomes the carry (the ended epoch's places, for the next epoch's
        // first writes), the old carry's table the new, empty buffer.
        std::mem::swap(&mut self.buffer, &mut self.carry);
        self.buffer.clear();
        let mut range = (u64::MAX, 0);
        let abandoned = std::mem::take(&mut self.abandoned);
        let epoch = self.epoch;
        let records = self
            .carry
            .iter()
            // The version of an abandoned refresh never reaches the version log: its
            // links may be incomplete.
            .filter(|(&cid, slot)| {
                !abandoned.iter().any(|a| {
                    a.cid == cid
                        && a.version
                            == Version {
                                epoch,
                                version: slot.version(),
                            }
                        && !slot.deleted()
                })
            })
            .map(|(&cid, &slot)| {
                range = (range.0.min(cid), range.1.max(cid));
                VersionRecord {
                    cid,
                    state: VersionState {
                        version: Version {
                            epoch: self.epoch,
                            version: slot.version(),
                        },
                        deleted: slot.deleted(),
                    },
                }
            })
            .collect();
        self.carry_range = range;
        self.sealed = Some(SealedEpoch {
            epoch: self.epoch,
            records,
            last_seq: self.epoch_last_seq,
        });
        self.epoch_last_seq = 0;
        self.epoch = self.epoch.wrapping_add(1);
        true
    }

    /// The sealed epoch waiting for the disk, if any.
    pub fn sealed(&self) -> Option<&SealedEpoch> {
        self.sealed.as_ref()
    }

    /// The sealed epoch if it may be written to the version log now that every append
    /// up to `durable_seq` is durable: all appends with a version in it are, and no chain
    /// with a version in it still waits for its last link (whose sequence number then
    /// joins the epoch's through [`VersionManager::note_seq`]). The version log thus
    /// never names a chain before all its links are durable: a compaction keeps only a
    /// chunk's newest record, and after a crash only removes are read from it, so a
    /// named but incomplete chain could hide an older remove.
    pub fn sealed_ready(&self, durable_seq: u64) -> Option<&SealedEpoch> {
        self.sealed.as_ref().filter(|s| {
            s.last_seq <= durable_seq
                && !self
                    .chains
                    .iter()
                    .any(|c| c.last_seq.is_none() && c.version.epoch == s.epoch)
        })
    }

    /// Called once the sealed epoch of `epoch` is durable in the version log.
    pub fn sealed_written(&mut self, epoch: u16) {
        if self.sealed.as_ref().is_some_and(|s| s.epoch == epoch) {
            self.sealed = None;
        }
    }

    fn assign(&mut self, cid: u64, deleted: bool, seq: u64) -> Result<Version, AssignBlocked> {
        let full = self.buffer.len() >= self.entries_max;
        // One hash lookup in the common case (room left, no overflow).
        let version = match self.buffer.entry(cid) {
            std::collections::hash_map::Entry::Occupied(mut e)
                if e.get().version() < VERSION_IN_EPOCH_MAX =>
            {
                let slot = e.get_mut();
                let v = slot.version() + 1;
                let outdated = slot.loc;
                *slot = Slot::new(v, deleted);
                self.usage.outdate(outdated);
                Some(v)
            }
            std::collections::hash_map::Entry::Vacant(e) if !full => {
                e.insert(Slot::new(0, deleted));
                self.take_from_carry(cid);
                Some(0)
            }
            _ => None,
        };
        let version = match version {
            Some(v) => v,
            None => {
                // Version overflow, or a new chunk with the buffer full: end the epoch.
                if !self.seal() {
                    return Err(AssignBlocked::SealPending);
                }
                self.hold = false;
                self.buffer.insert(cid, Slot::new(0, deleted));
                self.take_from_carry(cid);
                0
            }
        };
        self.epoch_last_seq = self.epoch_last_seq.max(seq);
        let assigned = Version {
            epoch: self.epoch,
            version,
        };
        if self.buffer.len() >= self.seal_entries && !self.hold {
            // Best effort: if the previous seal is still pending the buffer keeps filling
            // up to `entries_max`.
            self.seal();
        }
        Ok(assigned)
    }

    /// The first write of `cid` in this epoch: its entry of the previous epoch (if the
    /// carry has it) is outdated.
    #[inline]
    fn take_from_carry(&mut self, cid: u64) {
        if cid < self.carry_range.0 || cid > self.carry_range.1 {
            return;
        }
        if let Some(old) = self.carry.remove(&cid) {
            self.usage.outdate(old.loc);
        }
    }

    /// Records that the append with sequence number `seq` carries a version assigned
    /// earlier in `epoch` (the later links of a chained chunk), so that epoch is not
    /// written to the version log before that append is durable.
    pub fn note_seq(&mut self, epoch: u16, seq: u64) {
        if epoch == self.epoch {
            self.epoch_last_seq = self.epoch_last_seq.max(seq);
        } else if let Some(sealed) = self.sealed.as_mut().filter(|s| s.epoch == epoch) {
            sealed.last_seq = sealed.last_seq.max(seq);
        }
    }

    /// A new version for the first link of a chain of `cid` appended link by link, the
    /// append with sequence number `seq`; registers the chain as open (see the module
    /// docs). Its state before, as snapshots show it, is kept as the chain's `prior`.
    pub fn assign_chain(&mut self, cid: u64, seq: u64) -> Result<Version, AssignBlocked> {
        let prior = self.visible(cid);
        let version = self.assign(cid, false, seq)?;
        self.chains.push(OpenChain {
            cid,
            version,
            prior,
            last_seq: None,
        });
        Ok(version)
    }

    /// Records that the last link of the open chain of `cid` with `version` was pushed as
    /// the append `seq`: from now on snapshots show its version (they are waited for
    /// until durable) and its epoch may be written once `seq` is durable.
    pub fn close_chain(&mut self, cid: u64, version: Version, seq: u64) {
        if let Some(c) = self
            .chains
            .iter_mut()
            .find(|c| c.cid == cid && c.version == version && c.last_seq.is_none())
        {
            c.last_seq = Some(seq);
        }
    }

    /// Forgets the chains whose last link is durable (every append up to `durable_seq`
    /// is): their links are then all on disk, found by every reader.
    pub fn prune_chains(&mut self, durable_seq: u64) {
        self.chains
            .retain(|c| c.last_seq.is_none_or(|last| last > durable_seq));
    }

    /// The chains not known durable: (CID, version) of links a reorganization pass must
    /// keep although its table names another version as current (the chain's version
    /// becomes current with its last link; until then the previous one is).
    pub fn chain_links(&self) -> Vec<(u64, Version)> {
        self.chains.iter().map(|c| (c.cid, c.version)).collect()
    }

    /// The chains registered now (tests).
    pub fn open_chains(&self) -> &[OpenChain] {
        &self.chains
    }

    /// The state of `cid` as snapshots show it: [`VersionManager::lookup`], with an open
    /// chain's version replaced by the state before it.
    fn visible(&self, cid: u64) -> Option<VersionState> {
        let state = self.lookup(cid)?;
        match self
            .open_chain(cid, state)
            .or_else(|| self.abandoned_chain(cid, state))
        {
            Some(c) => c.prior,
            None => Some(state),
        }
    }

    /// The abandoned refresh whose version `state` is, if any.
    fn abandoned_chain(&self, cid: u64, state: VersionState) -> Option<&OpenChain> {
        if state.deleted {
            return None;
        }
        self.abandoned
            .iter()
            .find(|c| c.cid == cid && c.version == state.version)
    }

    /// The open chain (last link still to come) whose version `state` is, if any.
    fn open_chain(&self, cid: u64, state: VersionState) -> Option<&OpenChain> {
        if state.deleted {
            return None;
        }
        self.chains
            .iter()
            .find(|c| c.cid == cid && c.version == state.version && c.last_seq.is_none())
    }

    /// A new version for a write of `cid`, the append with sequence number `seq`.
    pub fn assign_put(&mut self, cid: u64, seq: u64) -> Result<Version, AssignBlocked> {
        self.assign(cid, false, seq)
    }

    /// A new version that removes `cid`, the append with sequence number `seq`.
    pub fn assign_remove(&mut self, cid: u64, seq: u64) -> Result<Version, AssignBlocked> {
        self.assign(cid, true, seq)
    }

    /// The version state in RAM (buffer, then sealed epoch), `None` if the chunk was not
    /// written since the last sealed epoch reached the disk.
    pub fn lookup(&self, cid: u64) -> Option<VersionState> {
        if let Some(slot) = self.buffer.get(&cid) {
            return Some(VersionState {
                version: Version {
                    epoch: self.epoch,
                    version: slot.version(),
                },
                deleted: slot.deleted(),
            });
        }
        let sealed = self.sealed.as_ref()?;
        // Sealed epochs are small enough to search linearly only during reorganization's
        // snapshot, which copies them into a table instead; see `snapshot_into`.
        sealed
            .records
            .iter()
            .find(|r| r.cid == cid)
            .map(|r| r.state)
    }

    /// Adds the RAM part (sealed epoch, then buffer) to `table`, newest wins; a chunk
    /// whose newest state is an open chain (its last link still to come) shows the state
    /// before the chain instead, or is left out when that came from the version log (see
    /// [`OpenChain::prior`]). `table` must hold no other part (the caller merges the
    /// version log's records after or before: that log never names an open chain).
    pub fn snapshot_into(&self, table: &mut CidMap<VersionState>) {
        if let Some(sealed) = &self.sealed {
            for r in &sealed.records {
                merge(table, r.cid, r.state);
            }
        }
        for (&cid, slot) in &self.buffer {
            merge(
                table,
                cid,
                VersionState {
                    version: Version {
                        epoch: self.epoch,
                        version: slot.version(),
                    },
                    deleted: slot.deleted(),
                },
            );
        }
        for c in self.chains.iter().chain(&self.abandoned) {
            let Some(&state) = table.get(&c.cid) else {
                continue;
            };
            let hidden = self.open_chain(c.cid, state).is_some_and(|o| o == c)
                || self.abandoned_chain(c.cid, state).is_some_and(|o| o == c);
            if hidden {
                match c.prior {
                    Some(prior) => table.insert(c.cid, prior),
                    None => table.remove(&c.cid),
                };
            }
        }
    }

    /// Records that the entry of `cid` with version `version` (`chain`: a link of a chained
    /// chunk) was placed at `loc`: counts it in its segment, remembers the place while that
    /// version is current in the buffer, or takes it off again at once if the chunk got a
    /// newer version meanwhile.
    pub fn placed(&mut self, cid: u64, version: Version, chained: bool, loc: EntryLoc) {
        self.usage
            .add(loc.segment, loc.generation, u64::from(loc.bytes));
        let slot = if version.epoch == self.epoch {
            self.buffer.get_mut(&cid)
        } else if self.buffer.contains_key(&cid) {
            // Written again in this epoch: any entry of an earlier one is outdated.
            self.usage.outdate(loc);
            return;
        } else if version.epoch == self.epoch.wrapping_sub(1) {
            self.carry.get_mut(&cid)
        } else {
            None // older: whether it is current is not known here (counted live)
        };
        if let Some(slot) = slot {
            if slot.version() != version.version || slot.deleted() {
                self.usage.outdate(loc);
            } else if !chained {
                slot.loc = loc;
            }
        }
    }

    /// The estimated live bytes per segment.
    pub fn usage(&self) -> &SegmentUsage {
        &self.usage
    }

    /// The estimates, to record a census or mark a reopened segment.
    pub fn usage_mut(&mut self) -> &mut SegmentUsage {
        &mut self.usage
    }

    /// Gives `cid`, whose current state the caller saw as `expected` in a snapshot taken
    /// in epoch `snapshot_epoch`, a fresh version in the current epoch with the same
    /// deleted flag (moving an old entry or remove into the current eon). `None` if the
    /// chunk changed since, or the epoch ended since the snapshot (then the caller cannot
    /// tell; it retries on a later pass).
    pub fn restamp(
        &mut self,
        cid: u64,
        expected: VersionState,
        snapshot_epoch: u16,
    ) -> Option<Version> {
        // A chunk with a chain in progress keeps its versions: a fresh one would hide the
        // chain once its last link is in.
        if self.epoch != snapshot_epoch
            || self
                .chains
                .iter()
                .chain(&self.abandoned)
                .any(|c| c.cid == cid)
        {
            return None;
        }
        match self.buffer.get(&cid) {
            Some(slot)
                if VersionState {
                    version: Version {
                        epoch: self.epoch,
                        version: slot.version(),
                    },
                    deleted: slot.deleted(),
                } == expected => {}
            Some(_) => return None,
            None => {}
        }
        self.assign(cid, expected.deleted, 0).ok()
    }

    /// [`VersionManager::restamp`] for a chained chunk (not removed) whose links an eon
    /// visit is about to write again with the fresh version: the version is registered as
    /// an open chain with `expected` as its prior state, so snapshots keep showing
    /// `expected` and the version log does not name the fresh version (`sealed_ready`)
    /// until the caller either finishes the chain ([`VersionManager::finish_chain`], once
    /// every fresh link is durable) or abandons it ([`VersionManager::abandon_chain`]).
    pub fn restamp_chain(
        &mut self,
        cid: u64,
        expected: VersionState,
        snapshot_epoch: u16,
    ) -> Option<Version> {
        if expected.deleted {
            return None;
        }
        let version = self.restamp(cid, expected, snapshot_epoch)?;
        self.chains.push(OpenChain {
            cid,
            version,
            prior: Some(expected),
            last_seq: None,
        });
        Some(version)
    }

    /// Every link of the refreshed chain of `cid` with `version` is durable: the version
    /// counts from now on (unless the chunk was written since, which is newer anyway).
    pub fn finish_chain(&mut self, cid: u64, version: Version) {
        self.chains
            .retain(|c| !(c.cid == cid && c.version == version && c.last_seq.is_none()));
    }

    /// The refreshed chain of `cid` with `version` will not be completed (the pass could
    /// not write every fresh link): the chunk keeps its prior state for good. Its version
    /// stays taken in the buffer (a later write of the chunk in this epoch gets a newer
    /// one, never the same, so links of the two are never mixed) but is hidden from
    /// snapshots and left out of the version log; if the epoch was sealed meanwhile its
    /// record is dropped from the sealed epoch. A newer write or remove of the chunk since
    /// needs nothing.
    pub fn abandon_chain(&mut self, cid: u64, version: Version) {
        let Some(i) = self
            .chains
            .iter()
            .position(|c| c.cid == cid && c.version == version && c.last_seq.is_none())
        else {
            return;
        };
        let chain = self.chains.remove(i);
        let state = VersionState {
            version,
            deleted: false,
        };
        if version.epoch == self.epoch {
            if self
                .buffer
                .get(&cid)
                .is_some_and(|s| s.version() == version.version && !s.deleted())
            {
                self.abandoned.push(chain);
            }
        } else if let Some(sealed) = self.sealed.as_mut().filter(|s| s.epoch == version.epoch) {
            sealed
                .records
                .retain(|r| !(r.cid == cid && r.state == state));
        }
    }
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

// ----- the version log on disk ----------------------------------------------------------

const BLOCK_MAGIC: u32 = 0x424C_564D; // "MVLB" little-endian
/// A block of runs: consecutive CIDs sharing one version state.
const RUN_BLOCK_MAGIC: u32 = 0x524C_564D; // "MVLR" little-endian
const BLOCK_HEADER_BYTES: usize = 16;
/// Bytes of one version-log record: CID (8), epoch (2), version | deleted << 31 (4).
pub const RECORD_BYTES: usize = 14;
/// Bytes of one run: first CID (8), CIDs in the run (4), epoch (2), version | deleted <<
/// 31 (4).
const RUN_BYTES: usize = 18;
/// Records (or runs) per block, so a block stays below 1.2 MiB.
const BLOCK_RECORDS_MAX: usize = 65_536;
/// Records one run block may stand for (bounds what a block expands to when read).
const RUN_BLOCK_RECORDS_MAX: u64 = 1 << 22;

/// The kinds of version-log blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockKind {
    /// One record per entry.
    Records,
    /// Runs of consecutive CIDs with one state.
    Runs,
}

impl BlockKind {
    fn of_magic(magic: u32) -> Option<BlockKind> {
        match magic {
            BLOCK_MAGIC => Some(BlockKind::Records),
            RUN_BLOCK_MAGIC => Some(BlockKind::Runs),
            _ => None,
        }
    }

    fn item_bytes(self) -> usize {
        match self {
            BlockKind::Records => RECORD_BYTES,
            BlockKind::Runs => RUN_BYTES,
        }
    }
}

/// One run: `count` CIDs from `first` on, all with `state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    first: u64,
    count: u32,
    state: VersionState,
}

fn encode_state(state: VersionState, out: &mut [u8]) {
    out[..2].copy_from_slice(&state.version.epoch.to_le_bytes());
    let v = state.version.version | (u32::from(state.deleted) << 31);
    out[2..6].copy_from_slice(&v.to_le_bytes());
}

fn decode_state(raw: &[u8]) -> Option<VersionState> {
    let epoch = u16::from_le_bytes(raw.get(..2)?.try_into().ok()?);
    let v = u32::from_le_bytes(raw.get(2..6)?.try_into().ok()?);
    Some(VersionState {
        version: Version {
            epoch,
            version: v & VERSION_IN_EPOCH_MAX,
        },
        deleted: v >> 31 == 1,
    })
}

fn encode_run(run: &Run, out: &mut [u8]) {
    out[..8].copy_from_slice(&run.first.to_le_bytes());
    out[8..12].copy_from_slice(&run.count.to_le_bytes());
    encode_state(run.state, &mut out[12..18]);
}

/// A run as stored, if it is well-formed: at least one CID, none past `u64::MAX`.
fn decode_run(raw: &[u8]) -> Option<Run> {
    let first = u64::from_le_bytes(raw.get(..8)?.try_into().ok()?);
    let count = u32::from_le_bytes(raw.get(8..12)?.try_into().ok()?);
    let state = decode_state(raw.get(12..18)?)?;
    (count >= 1 && first.checked_add(u64::from(count) - 1).is_some()).then_some(Run {
        first,
        count,
        state,
    })
}

/// `records` sorted by CID (stable) as runs of consecutive CIDs with equal states, when
/// that takes at most half the bytes of plain records; `None` otherwise (or if empty).
fn runs_of(records: &[VersionRecord]) -> Option<Vec<Run>> {
    if records.is_empty() {
        return None;
    }
    let mut sorted: Vec<&VersionRecord> = records.iter().collect();
    sorted.sort_by_key(|r| r.cid);
    let limit = records.len() * RECORD_BYTES / 2 / RUN_BYTES;
    let mut runs: Vec<Run> = Vec::new();
    for r in sorted {
        if let Some(last) = runs.last_mut() {
            let next = last.first.checked_add(u64::from(last.count));
            if next == Some(r.cid) && last.state == r.state && last.count < u32::MAX {
                last.count += 1;
                continue;
            }
        }
        if runs.len() >= limit {
            return None;
        }
        runs.push(Run {
            first: r.cid,
            count: 1,
            state: r.state,
        });
    }
    Some(runs)
}

/// Splits `runs` into blocks of at most [`BLOCK_RECORDS_MAX`] runs standing for at most
/// [`RUN_BLOCK_RECORDS_MAX`] records (a longer run is cut in pieces).
fn run_blocks(runs: &[Run]) -> Vec<Vec<Run>> {
    let mut blocks: Vec<Vec<Run>> = vec![Vec::new()];
    let mut in_block = 0u64;
    for run in runs {
        let mut run = *run;
        loop {
            let room = RUN_BLOCK_RECORDS_MAX - in_block;
            let full = blocks.last().is_some_and(|b| b.len() >= BLOCK_RECORDS_MAX);
            if room == 0 || full {
                blocks.push(Vec::new());
                in_block = 0;
                continue;
            }
            let take = u64::from(run.count).min(room);
            if let Some(block) = blocks.last_mut() {
                // `take` is at most `run.count`, a u32.
                block.push(Run {
                    count: take as u32,
                    ..run
                });
            }
            in_block += take;
            if take == u64::from(run.count) {
                break;
            }
            run.first += take;
            run.count -= take as u32;
        }
    }
    blocks
}

/// Visits the records of a block body of `kind` holding `count` items, after checking
/// every item (a run block whose runs are malformed or stand for too many records is
/// invalid, and nothing of it is visited). Returns whether the body is valid.
fn visit_body(kind: BlockKind, body: &[u8], visit: &mut impl FnMut(VersionRecord)) -> bool {
    match kind {
        BlockKind::Records => {
            body.chunks_exact(RECORD_BYTES)
                .filter_map(decode_record)
                .for_each(&mut *visit);
            true
        }
        BlockKind::Runs => {
            let mut total = 0u64;
            for raw in body.chunks_exact(RUN_BYTES) {
                match decode_run(raw) {
                    Some(run) => total += u64::from(run.count),
                    None => return false,
                }
            }
            if total > RUN_BLOCK_RECORDS_MAX {
                return false;
            }
            for run in body.chunks_exact(RUN_BYTES).filter_map(decode_run) {
                for i in 0..u64::from(run.count) {
                    visit(VersionRecord {
                        cid: run.first + i,
                        state: run.state,
                    });
                }
            }
            true
        }
    }
}

fn encode_record(r: &VersionRecord, out: &mut [u8]) {
    out[..8].copy_from_slice(&r.cid.to_le_bytes());
    encode_state(r.state, &mut out[8..14]);
}

fn decode_record(raw: &[u8]) -> Option<VersionRecord> {
    let cid = u64::from_le_bytes(raw.get(..8)?.try_into().ok()?);
    let state = decode_state(raw.get(8..14)?)?;
    Some(VersionRecord { cid, state })
}

/// Encodes `records` as page-padded blocks of generation `generation`: as run blocks
/// (sorted by CID) when runs of consecutive CIDs with one state take at most half the
/// bytes, else as record blocks in the given order. Readers merge records by version, so
/// their order within an append does not matter.
fn encode_blocks(records: &[VersionRecord], generation: u32) -> AlignedBuf {
    if let Some(runs) = runs_of(records) {
        return encode_run_blocks(&runs, generation);
    }
    encode_record_blocks(records, generation)
}

fn encode_run_blocks(runs: &[Run], generation: u32) -> AlignedBuf {
    let blocks = run_blocks(runs);
    let parts: Vec<&[Run]> = blocks.iter().map(Vec::as_slice).collect();
    encode_parts(&parts, RUN_BLOCK_MAGIC, RUN_BYTES, generation, encode_run)
}

fn encode_record_blocks(records: &[VersionRecord], generation: u32) -> AlignedBuf {
    let parts: Vec<&[VersionRecord]> = if records.is_empty() {
        vec![&[][..]]
    } else {
        records.chunks(BLOCK_RECORDS_MAX).collect()
    };
    encode_parts(&parts, BLOCK_MAGIC, RECORD_BYTES, generation, encode_record)
}

/// One page-padded block per part: header (`magic`, `generation`, item count, CRC32C)
/// and the items, `item_bytes` each, written by `encode`.
fn encode_parts<T>(
    parts: &[&[T]],
    magic: u32,
    item_bytes: usize,
    generation: u32,
    encode: impl Fn(&T, &mut [u8]),
) -> AlignedBuf {
    let total: usize = parts
        .iter()
        .map(|p| round_up_to_page(BLOCK_HEADER_BYTES + p.len() * item_bytes))
        .sum();
    let mut buf = AlignedBuf::zeroed(total);
    let mut at = 0;
    for part in parts {
        let body = BLOCK_HEADER_BYTES + part.len() * item_bytes;
        let block = &mut buf[at..at + body];
        block[0..4].copy_from_slice(&magic.to_le_bytes());
        block[4..8].copy_from_slice(&generation.to_le_bytes());
        block[8..12].copy_from_slice(&(part.len() as u32).to_le_bytes());
        for (i, item) in part.iter().enumerate() {
            let o = BLOCK_HEADER_BYTES + i * item_bytes;
            encode(item, &mut block[o..o + item_bytes]);
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&block[..12]), &block[16..]);
        block[12..16].copy_from_slice(&crc.to_le_bytes());
        at += round_up_to_page(body);
    }
    buf
}

/// Reads the valid blocks of one version-log file: `(generation, end offset, records)`, or
/// `None` if its first block is not valid.
fn read_file(file: &dyn LogFile) -> LogResult<Option<(u32, u64, Vec<VersionRecord>)>> {
    let len = file.len();
    let mut records = Vec::new();
    let mut at = 0u64;
    let mut generation = None;
    let mut page = AlignedBuf::zeroed(PAGE_BYTES);
    while at + PAGE_BYTES as u64 <= len {
        file.read_at(&mut page, at)
            .map_err(io_context("reading version log"))?;
        let word = |i: usize| u32::from_le_bytes([page[i], page[i + 1], page[i + 2], page[i + 3]]);
        let count = word(8) as usize;
        let Some(kind) = BlockKind::of_magic(word(0)) else {
            break;
        };
        if generation.is_some_and(|g| g != word(4)) || count > BLOCK_RECORDS_MAX {
            break;
        }
        let body = BLOCK_HEADER_BYTES + count * kind.item_bytes();
        let padded = round_up_to_page(body) as u64;
        if at + padded > len {
            break;
        }
        let mut block = AlignedBuf::zeroed(padded as usize);
        file.read_at(&mut block, at)
            .map_err(io_context("reading version log"))?;
        let crc = crc32c::crc32c_append(crc32c::crc32c(&block[..12]), &block[16..body]);
        if crc != word(12) {
            break;
        }
        let before = records.len();
        if !visit_body(kind, &block[BLOCK_HEADER_BYTES..body], &mut |r| {
            records.push(r)
        }) {
            records.truncate(before);
            break;
        }
        generation = Some(word(4));
        at += padded;
    }
    Ok(generation.map(|g| (g, at, records)))
}

/// What [`parse_block`] found at the start of its input.
enum BlockParse {
    /// A valid block of this many bytes (page-padded); its records were visited.
    Done(usize),
    /// Not decidable before this many bytes are there.
    Need(usize),
    /// Not a valid block: the file's blocks end here.
    Invalid,
}

/// Parses the block at the start of `bytes` as [`read_file`] does (magic, generation
/// `expected` if known, record count, checksum), visiting its records if it is valid.
fn parse_block(
    bytes: &[u8],
    expected: Option<u32>,
    visit: &mut impl FnMut(VersionRecord),
) -> (BlockParse, Option<u32>) {
    let Some(head) = bytes.first_chunk::<BLOCK_HEADER_BYTES>() else {
        return (BlockParse::Need(BLOCK_HEADER_BYTES), expected);
    };
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let count = word(8) as usize;
    let Some(kind) = BlockKind::of_magic(word(0)) else {
        return (BlockParse::Invalid, expected);
    };
    if expected.is_some_and(|g| g != word(4)) || count > BLOCK_RECORDS_MAX {
        return (BlockParse::Invalid, expected);
    }
    let body = BLOCK_HEADER_BYTES + count * kind.item_bytes();
    let padded = round_up_to_page(body);
    let (Some(first), Some(records)) = (bytes.get(..12), bytes.get(BLOCK_HEADER_BYTES..body))
    else {
        return (BlockParse::Need(padded), expected);
    };
    if bytes.len() < padded {
        return (BlockParse::Need(padded), expected);
    }
    if crc32c::crc32c_append(crc32c::crc32c(first), records) != word(12) {
        return (BlockParse::Invalid, expected);
    }
    if !visit_body(kind, records, visit) {
        return (BlockParse::Invalid, expected);
    }
    (BlockParse::Done(padded), Some(word(4)))
}

/// Decodes a version-log file handed over in consecutive windows from its start (any
/// sizes): the same records, in the same order, as [`VersionLog::load`] (blocks are
/// checked the same way and the first invalid one ends the file). A block split between
/// two windows is completed in a small carry buffer; everything else is decoded in place.
#[derive(Debug, Default)]
pub struct BlockDecoder {
    generation: Option<u32>,
    /// The bytes of a block begun in an earlier window (never more than one block).
    carry: Vec<u8>,
    /// Bytes of valid blocks so far.
    end: u64,
    stopped: bool,
}

impl BlockDecoder {
    /// A decoder at the start of a file.
    pub fn new() -> BlockDecoder {
        BlockDecoder::default()
    }

    /// Decodes the next `window` of the file, calling `visit` for every record of every
    /// block completed by it.
    pub fn feed(&mut self, mut window: &[u8], visit: &mut impl FnMut(VersionRecord)) {
        while !self.stopped && !self.carry.is_empty() {
            let (parse, generation) = parse_block(&self.carry, self.generation, visit);
            self.generation = generation;
            match parse {
                BlockParse::Done(bytes) => {
                    self.end += bytes as u64;
                    self.carry.clear();
                }
                BlockParse::Invalid => self.stopped = true,
                BlockParse::Need(needed) => {
                    let take = needed.saturating_sub(self.carry.len()).min(window.len());
                    if take == 0 {
                        return;
                    }
                    self.carry.extend_from_slice(&window[..take]);
                    window = &window[take..];
                }
            }
        }
        let mut at = 0;
        while !self.stopped && at < window.len() {
            let (parse, generation) = parse_block(&window[at..], self.generation, visit);
            self.generation = generation;
            match parse {
                BlockParse::Done(bytes) => {
                    at += bytes;
                    self.end += bytes as u64;
                }
                BlockParse::Invalid => self.stopped = true,
                BlockParse::Need(_) => {
                    self.carry.extend_from_slice(&window[at..]);
                    return;
                }
            }
        }
    }

    /// The generation and end offset of the valid blocks fed so far, or `None` if the
    /// first block was not valid (what `VersionLog::load` finds; records were visited only
    /// for valid blocks).
    pub fn finish(&self) -> Option<(u32, u64)> {
        self.generation.map(|g| (g, self.end))
    }
}

/// The version log of one zone: two files used in turn. Appends go to the active one;
/// compaction writes the whole table to the other one with the next generation, and
/// reopening picks the valid file of the newer generation, so a torn compaction leaves the
/// old file in charge.
#[derive(Debug)]
pub struct VersionLog {
    storage: std::sync::Arc<dyn Storage>,
    names: [String; 2],
    files: [std::sync::Arc<dyn LogFile>; 2],
    active: usize,
    generation: u32,
    end: u64,
    /// Records in the active file (compaction is due when it is much larger than needed).
    records: u64,
    /// Bytes handed to the storage since open (appends and compactions, whole pages).
    bytes_written: u64,
}

impl VersionLog {
    /// Opens (or creates) the version log `base`.0/1 and loads every record in it.
    pub fn open(
        storage: std::sync::Arc<dyn Storage>,
        base: &str,
    ) -> LogResult<(VersionLog, Vec<VersionRecord>)> {
        let names = [format!("{base}.0"), format!("{base}.1")];
        let open = |name: &str| {
            storage
                .open(name, PAGE_BYTES as u64)
                .map_err(io_context(format!("opening {name}")))
        };
        let files: [std::sync::Arc<dyn LogFile>; 2] = [
            std::sync::Arc::from(open(&names[0])?),
            std::sync::Arc::from(open(&names[1])?),
        ];
        let a = read_file(files[0].as_ref())?;
        let b = read_file(files[1].as_ref())?;
        let (active, generation, end, records) = match (a, b) {
            (Some(a), Some(b)) => {
                if b.0.wrapping_sub(a.0) as i32 > 0 {
                    (1, b.0, b.1, b.2)
                } else {
                    (0, a.0, a.1, a.2)
                }
            }
            (Some(a), None) => (0, a.0, a.1, a.2),
            (None, Some(b)) => (1, b.0, b.1, b.2),
            (None, None) => (0, 0, 0, Vec::new()),
        };
        let mut log = VersionLog {
            storage,
            names,
            files,
            active,
            generation,
            end,
            records: records.len() as u64,
            bytes_written: 0,
        };
        if end == 0 {
            // A fresh log: write an empty first block so the file has a generation.
            log.append(&[])?;
        }
        Ok((log, records))
    }

    /// Records in the active file.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Bytes handed to the storage since open: appended blocks and compactions (whole
    /// pages, zero pages included).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    fn ensure_len(&mut self, index: usize, needed: u64) -> LogResult<()> {
        let len = self.files[index].len();
        if needed > len {
            let name = &self.names[index];
            let grown = needed.max(len.saturating_mul(2));
            self.files[index] = std::sync::Arc::from(
                self.storage
                    .open(name, grown)
                    .map_err(io_context(format!("growing {name}")))?,
            );
        }
        Ok(())
    }

    /// Appends `records` as one block and syncs.
    pub fn append(&mut self, records: &[VersionRecord]) -> LogResult<()> {
        self.append_unsynced(records)?
            .sync()
            .map_err(io_context("syncing version log"))
    }

    /// Appends `records` as one block without syncing: the records count only once the
    /// caller synced the returned file (with other files' syncs at the same time); if that
    /// sync fails the engine must stop (the log's end already counts the block).
    pub fn append_unsynced(
        &mut self,
        records: &[VersionRecord],
    ) -> LogResult<std::sync::Arc<dyn LogFile>> {
        let buf = encode_blocks(records, self.generation);
        let index = self.active;
        self.ensure_len(index, self.end + buf.len() as u64)?;
        self.files[index]
            .write_at(&buf, self.end)
            .map_err(io_context("appending to version log"))?;
        self.end += buf.len() as u64;
        self.records += records.len() as u64;
        self.bytes_written += buf.len() as u64;
        Ok(self.files[index].clone())
    }

    /// Loads every record of the active file.
    pub fn load(&self) -> LogResult<Vec<VersionRecord>> {
        Ok(read_file(self.files[self.active].as_ref())?.map_or_else(Vec::new, |r| r.2))
    }

    /// The active file and the end of its blocks, for reading its records outside the
    /// log's lock with a [`BlockDecoder`] (the records [`VersionLog::load`] returns, read
    /// in large windows instead of two reads per block). Appends after the call go past
    /// the end taken here, and compaction writes the other file.
    pub fn active_extent(&self) -> (std::sync::Arc<dyn LogFile>, u64) {
        (self.files[self.active].clone(), self.end)
    }

    /// Replaces the log by `records` (one per chunk): writes them to the other file with
    /// the next generation, syncs, and switches to it.
    pub fn compact(&mut self, records: &[VersionRecord]) -> LogResult<()> {
        let other = 1 - self.active;
        let generation = self.generation.wrapping_add(1);
        let buf = encode_blocks(records, generation);
        self.ensure_len(other, buf.len() as u64 + PAGE_BYTES as u64)?;
        // Zero the page after the new content first so stale blocks of generation + 1
        // cannot follow it (generations are 32-bit; this is belt and braces).
        self.files[other]
            .write_at(&buf, 0)
            .map_err(io_context("compacting version log"))?;
        self.bytes_written += buf.len() as u64;
        if self.files[other].len() >= buf.len() as u64 + PAGE_BYTES as u64 {
            let zero = AlignedBuf::zeroed(PAGE_BYTES);
            self.files[other]
                .write_at(&zero, buf.len() as u64)
                .map_err(io_context("compacting version log"))?;
            self.bytes_written += PAGE_BYTES as u64;
        }
        self.files[other]
            .sync()
            .map_err(io_context("syncing compacted version log"))?;
        self.active = other;
        self.generation = generation;
        self.end = buf.len() as u64;
        self.records = records.len() as u64;
        Ok(())
    }
}

/// Folds records into a table, newest version per chunk.
pub fn table_from_records(records: &[VersionRecord]) -> CidMap<VersionState> {
    let mut table = CidMap::with_capacity_and_hasher(records.len(), Default::default());
    for r in records {
        merge(&mut table, r.cid, r.state);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_packs_version_and_deleted_flag() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
        for version in [0, 1, 0x7F_FFFF, VERSION_IN_EPOCH_MAX] {
            for deleted in [false, true] {
                let slot = Slot::new(version, deleted);
                assert_eq!((slot.version(), slot.deleted()), (version, deleted));
            }
        }
    }
    use crate::storage::MemStorage;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    /// Model: unbounded epoch counter, every assignment is a (u64 epoch, version).
    #[derive(Default)]
    struct Model {
        epoch: u64,
        current: HashMap<u64, ((u64, u32), bool)>,
    }

    #[test]
    fn version_manager_matches_model_across_epoch_and_eon_wrap() {
        let mut rng = SmallRng::seed_from_u64(5);
        // Start just before the eon boundary and run across two full wraps of the 16-bit
        // epoch with a tiny buffer so epochs end every few operations.
        let start_epoch: u16 = u16::MAX - 50;
        let mut vm = VersionManager::new(start_epoch, 3, 4);
        let mut model = Model {
            epoch: u64::from(start_epoch),
            ..Model::default()
        };
        let mut persisted: CidMap<VersionState> = CidMap::default();
        let mut ops = 0u64;
        while model.epoch < u64::from(start_epoch) + 2 * 65_536 + 100 {
            ops += 1;
            let cid = rng.gen_range(0..6u64);
            let remove = rng.gen_bool(0.2);
            let assigned = if remove {
                vm.assign_remove(cid, ops)
            } else {
                vm.assign_put(cid, ops)
            };
            let v = match assigned {
                Ok(v) => v,
                Err(AssignBlocked::SealPending) => {
                    // The flusher persists the sealed epoch, then the append retries.
                    let sealed = vm.sealed().cloned().unwrap();
                    for r in &sealed.records {
                        merge(&mut persisted, r.cid, r.state);
                    }
                    vm.sealed_written(sealed.epoch);
                    if remove {
                        vm.assign_remove(cid, ops).unwrap()
                    } else {
                        vm.assign_put(cid, ops).unwrap()
                    }
                }
            };
            // Model: epochs advance in lock step with the manager.
            let vm_epoch_of_v = u64::from(v.epoch);
            while (model.epoch & 0xFFFF) != vm_epoch_of_v {
                model.epoch += 1;
            }
            let mv = (model.epoch, v.version);
            if let Some((old, _)) = model.current.get(&cid) {
                assert!(mv > *old, "model order");
                // The manager's serial order agrees with the model's total order.
                let old_v = Version {
                    epoch: old.0 as u16,
                    version: old.1,
                };
                if model.epoch - old.0 < u64::from(EON_EPOCHS) {
                    assert!(v.is_newer_than(old_v), "{v:?} newer than {old_v:?}");
                    assert!(!old_v.is_newer_than(v));
                }
            }
            model.current.insert(cid, (mv, remove));
            // Visiting every "log" once per eon: re-stamp chunks whose version is old.
            if ops.is_multiple_of(97) {
                let snapshot_epoch = vm.epoch();
                for (&c, &((e, ver), deleted)) in model.current.clone().iter() {
                    if !deleted && model.epoch - e > 1000 {
                        let expected = Version {
                            epoch: e as u16,
                            version: ver,
                        };
                        let state = VersionState {
                            version: expected,
                            deleted: false,
                        };
                        if let Some(nv) = vm.restamp(c, state, snapshot_epoch) {
                            assert!(nv.is_newer_than(expected));
                            assert_eq!(u64::from(nv.epoch), model.epoch & 0xFFFF);
                            model.current.insert(c, ((model.epoch, nv.version), false));
                        }
                    }
                }
            }
            // The persisted log plus the RAM part always name the model's current version.
            let mut table = persisted.clone();
            vm.snapshot_into(&mut table);
            for (&c, &((e, ver), deleted)) in &model.current {
                let got = table.get(&c).copied().unwrap();
                assert_eq!(got.version.epoch, e as u16, "cid {c}");
                assert_eq!(got.version.version, ver);
                assert_eq!(got.deleted, deleted);
            }
        }
        assert!(vm.epoch() > start_epoch.wrapping_add(100) || vm.epoch() < 1000);
    }

    fn snapshot(vm: &VersionManager) -> CidMap<VersionState> {
        let mut table = CidMap::default();
        vm.snapshot_into(&mut table);
        table
    }

    fn put(version: Version) -> VersionState {
        VersionState {
            version,
            deleted: false,
        }
    }

    /// An eon visit's fresh version of an old chained chunk counts only once finished;
    /// abandoned, it never counts, is not handed out again and stays out of the version
    /// log; a write of the chunk meanwhile is newer either way.
    #[test]
    fn a_refreshed_chain_counts_only_once_finished() {
        let old = put(Version {
            epoch: 1,
            version: 0,
        });
        for outcome in ["finish", "abandon", "abandon sealed", "write"] {
            let mut vm = VersionManager::new(9, 6, 8);
            vm.hold_epoch(true);
            let fresh = vm.restamp_chain(7, old, 9).unwrap();
            assert_eq!(fresh.epoch, 9);
            assert!(
                vm.restamp_chain(7, old, 9).is_none(),
                "{outcome}: one at a time"
            );
            assert_eq!(snapshot(&vm).get(&7), Some(&old), "{outcome}: open");
            assert_eq!(vm.chain_links(), vec![(7, fresh)]);
            match outcome {
                "finish" => {
                    vm.finish_chain(7, fresh);
                    assert_eq!(snapshot(&vm).get(&7), Some(&put(fresh)));
                    assert!(vm.seal());
                    assert!(vm.sealed_ready(0).unwrap().records[0].state == put(fresh));
                }
                "abandon" => {
                    vm.abandon_chain(7, fresh);
                    assert!(vm.open_chains().is_empty());
                    assert_eq!(snapshot(&vm).get(&7), Some(&old), "{outcome}");
                    // Not re-stamped again while hidden; a write gets a newer version.
                    assert!(vm.restamp(7, old, 9).is_none());
                    vm.assign_put(8, 1).unwrap();
                    assert!(vm.seal());
                    let sealed = vm.sealed_ready(1).unwrap();
                    assert!(sealed.records.iter().all(|r| r.cid != 7), "{outcome}");
                    vm.sealed_written(9);
                    assert!(vm.assign_put(7, 2).unwrap().is_newer_than(fresh));
                }
                "abandon sealed" => {
                    assert!(vm.seal());
                    assert!(vm.sealed_ready(0).is_none(), "waits for the chain");
                    vm.abandon_chain(7, fresh);
                    let sealed = vm.sealed_ready(0).unwrap();
                    assert!(sealed.records.iter().all(|r| r.cid != 7), "{outcome}");
                    assert_eq!(snapshot(&vm).get(&7), None, "{outcome}: the log's state");
                }
                _ => {
                    let newer = vm.assign_put(7, 1).unwrap();
                    assert!(newer.is_newer_than(fresh));
                    assert_eq!(snapshot(&vm).get(&7), Some(&put(newer)));
                    vm.abandon_chain(7, fresh);
                    assert_eq!(snapshot(&vm).get(&7), Some(&put(newer)), "{outcome}");
                }
            }
        }
    }

    /// An open chain shows the state before it (from the buffer, the sealed epoch or the
    /// version log), holds its sealed epoch back, refuses re-stamping, and counts from
    /// its last link on; a newer write of the chunk shows at once.
    #[test]
    fn an_open_chain_shows_the_state_before_it_until_its_last_link() {
        let mut vm = VersionManager::new(0, 3, 8);
        let a = vm.assign_put(1, 1).unwrap();
        // Prior from the buffer.
        let b = vm.assign_chain(1, 2).unwrap();
        assert!(b.is_newer_than(a));
        assert_eq!(snapshot(&vm).get(&1), Some(&put(a)));
        assert_eq!(vm.restamp(1, put(a), 0), None, "no re-stamping mid-chain");
        // Prior unknown to the RAM: left to the version log.
        let c = vm.assign_chain(2, 3).unwrap();
        assert_eq!(snapshot(&vm).get(&2), None);
        // The epoch ends (3 chunks); the sealed epoch waits for both chains.
        vm.assign_put(3, 4).unwrap();
        assert_eq!(vm.epoch(), 1);
        assert!(vm.sealed_ready(u64::MAX).is_none());
        assert_eq!(snapshot(&vm).get(&1), Some(&put(a)));
        // A second chain of chunk 1, started while the first is open, has the same
        // prior; its last link first.
        let d = vm.assign_chain(1, 5).unwrap();
        assert_eq!(snapshot(&vm).get(&1), Some(&put(a)));
        vm.close_chain(1, d, 6);
        assert_eq!(snapshot(&vm).get(&1), Some(&put(d)));
        vm.close_chain(1, b, 7);
        vm.note_seq(b.epoch, 7);
        assert!(
            vm.sealed_ready(u64::MAX).is_none(),
            "chunk 2's chain is open"
        );
        vm.close_chain(2, c, 8);
        vm.note_seq(c.epoch, 8);
        assert!(vm.sealed_ready(7).is_none(), "its last link is not durable");
        assert_eq!(vm.sealed_ready(8).map(|s| s.epoch), Some(0));
        assert_eq!(snapshot(&vm).get(&2), Some(&put(c)));
        assert_eq!(vm.chain_links().len(), 3);
        vm.prune_chains(7);
        assert_eq!(vm.chain_links(), vec![(2, c)]);
        vm.prune_chains(8);
        assert!(vm.open_chains().is_empty());
        // A remove during a chain shows at once.
        let e = vm.assign_chain(3, 9).unwrap();
        let r = vm.assign_remove(3, 10).unwrap();
        assert!(r.is_newer_than(e));
        assert_eq!(
            snapshot(&vm).get(&3),
            Some(&VersionState {
                version: r,
                deleted: true
            })
        );
    }

    #[test]
    fn version_overflow_ends_the_epoch_early() {
        let mut vm = VersionManager::new(7, 1000, 1000);
        vm.buffer
            .insert(1, Slot::new(VERSION_IN_EPOCH_MAX - 1, false));
        let a = vm.assign_put(1, 1).unwrap();
        assert_eq!(a.version, VERSION_IN_EPOCH_MAX);
        let b = vm.assign_put(1, 1).unwrap();
        assert_eq!((b.epoch, b.version), (8, 0));
        assert!(b.is_newer_than(a));
        // A second overflow while the first seal is pending blocks.
        vm.buffer.insert(2, Slot::new(VERSION_IN_EPOCH_MAX, false));
        assert_eq!(vm.assign_put(2, 2), Err(AssignBlocked::SealPending));
        vm.sealed_written(7);
        assert_eq!(vm.assign_put(2, 2).unwrap().epoch, 9);
    }

    #[test]
    fn version_log_survives_reopen_and_torn_compaction() {
        let storage = MemStorage::new();
        let s: Arc<dyn Storage> = Arc::new(storage.clone());
        let rec = |cid, epoch, version, deleted| VersionRecord {
            cid,
            state: VersionState {
                version: Version { epoch, version },
                deleted,
            },
        };
        let (mut log, loaded) = VersionLog::open(s.clone(), "v").unwrap();
        assert!(loaded.is_empty());
        log.append(&[rec(1, 0, 0, false), rec(2, 0, 3, true)])
            .unwrap();
        log.append(&[rec(1, 1, 0, false)]).unwrap();
        drop(log);
        let (mut log, loaded) = VersionLog::open(s.clone(), "v").unwrap();
        let t = table_from_records(&loaded);
        assert_eq!(
            t[&1].version,
            Version {
                epoch: 1,
                version: 0
            }
        );
        assert!(t[&2].deleted);
        // Compaction cut partway: the old file stays in charge. Record blocks (CIDs with
        // gaps: no runs), then a run block cut inside its first page.
        let many: Vec<_> = (0..1000).map(|c| rec(2 * c, 2, 0, false)).collect();
        storage.set_write_budget(Some(3000));
        assert!(log.compact(&many).is_err());
        storage.crash(1);
        let (mut log, loaded) = VersionLog::open(s.clone(), "v").unwrap();
        assert_eq!(table_from_records(&loaded), t);
        let dense: Vec<_> = (0..1000).map(|c| rec(c, 2, 0, false)).collect();
        storage.set_write_budget(Some(20));
        assert!(log.compact(&dense).is_err());
        storage.crash(2);
        let (mut log, loaded) = VersionLog::open(s.clone(), "v").unwrap();
        assert_eq!(table_from_records(&loaded), t);
        log.compact(&many).unwrap();
        log.append(&[rec(5000, 3, 1, true)]).unwrap();
        drop(log);
        let (_, loaded) = VersionLog::open(s, "v").unwrap();
        assert_eq!(loaded.len(), 1001);
    }

    /// Builds a version-log file: `blocks` blocks of generation `generation` (each a
    /// run of records), then a block of generation `tail_generation` and zero pages.
    fn log_file(
        blocks: &[Vec<(u64, u16, u32, bool)>],
        generation: u32,
        tail_generation: u32,
    ) -> Vec<u8> {
        let to_records = |block: &[(u64, u16, u32, bool)]| -> Vec<VersionRecord> {
            block
                .iter()
                .map(|&(cid, epoch, version, deleted)| VersionRecord {
                    cid,
                    state: VersionState {
                        version: Version {
                            epoch,
                            version: version & VERSION_IN_EPOCH_MAX,
                        },
                        deleted,
                    },
                })
                .collect()
        };
        let mut bytes = Vec::new();
        for block in blocks {
            bytes.extend_from_slice(&encode_blocks(&to_records(block), generation));
        }
        bytes.extend_from_slice(&encode_blocks(
            &to_records(&blocks.concat()),
            tail_generation,
        ));
        bytes.extend_from_slice(&[0u8; 2 * PAGE_BYTES]);
        bytes
    }

    proptest::proptest! {
        /// Fed in windows of any sizes, the decoder visits the records `read_file` loads
        /// and ends where it ends, also for corrupted and truncated files.
        #[test]
        fn block_decoder_equals_read_file(
            blocks in proptest::collection::vec(
                proptest::collection::vec(
                    (proptest::num::u64::ANY, proptest::num::u16::ANY, proptest::num::u32::ANY,
                     proptest::bool::ANY),
                    0..700,
                ),
                0..5,
            ),
            generation in 0u32..3,
            tail_generation in 0u32..3,
            corrupt in proptest::option::of((proptest::num::usize::ANY, 1u8..=255)),
            truncate in proptest::option::of(proptest::num::usize::ANY),
            windows in proptest::collection::vec(1usize..40_000, 1..20),
        ) {
            let mut bytes = log_file(&blocks, generation, tail_generation);
            if let Some((at, flip)) = corrupt {
                let at = at % bytes.len();
                bytes[at] ^= flip;
            }
            if let Some(len) = truncate {
                bytes.truncate(round_up_to_page(len % bytes.len()).min(bytes.len()));
            }
            let storage = MemStorage::new();
            let file = storage.open("v", bytes.len() as u64).unwrap();
            file.write_at(&bytes, 0).unwrap();
            let expected = read_file(file.as_ref()).unwrap();

            let mut decoder = BlockDecoder::new();
            let mut got = Vec::new();
            let mut at = 0;
            let mut w = 0;
            while at < bytes.len() {
                let len = windows[w % windows.len()].min(bytes.len() - at);
                decoder.feed(&bytes[at..at + len], &mut |r| got.push(r));
                at += len;
                w += 1;
            }
            match expected {
                Some((g, end, records)) => {
                    proptest::prop_assert_eq!(decoder.finish(), Some((g, end)));
                    proptest::prop_assert_eq!(got, records);
                }
                None => {
                    proptest::prop_assert_eq!(decoder.finish(), None);
                    proptest::prop_assert!(got.is_empty());
                }
            }
        }
    }

    fn sorted(mut records: Vec<VersionRecord>) -> Vec<VersionRecord> {
        records.sort_by_key(|r| {
            (
                r.cid,
                r.state.version.epoch,
                r.state.version.version,
                r.state.deleted,
            )
        });
        records
    }

    /// Records of runs of consecutive CIDs, each run with one state, plus scattered ones.
    fn run_records(
        runs: &[(u64, u32, u16, u32, bool)],
        scattered: &[(u64, u16, u32, bool)],
    ) -> Vec<VersionRecord> {
        let state = |epoch: u16, version: u32, deleted: bool| VersionState {
            version: Version {
                epoch,
                version: version & VERSION_IN_EPOCH_MAX,
            },
            deleted,
        };
        let mut records: Vec<VersionRecord> = runs
            .iter()
            .flat_map(|&(first, len, epoch, version, deleted)| {
                (0..u64::from(len)).map(move |i| VersionRecord {
                    cid: first + i,
                    state: state(epoch, version, deleted),
                })
            })
            .collect();
        records.extend(
            scattered
                .iter()
                .map(|&(cid, epoch, version, deleted)| VersionRecord {
                    cid,
                    state: state(epoch, version, deleted),
                }),
        );
        records
    }

    proptest::proptest! {
        /// Whatever form `encode_blocks` picks (run blocks for runs of consecutive CIDs,
        /// record blocks otherwise), reading gives back the same records (as a multiset:
        /// run blocks are sorted by CID), and the decoder fed in windows agrees.
        #[test]
        fn run_and_record_blocks_give_back_every_record(
            runs in proptest::collection::vec(
                (0u64..1 << 40, 1u32..3000, proptest::num::u16::ANY, proptest::num::u32::ANY,
                 proptest::bool::ANY),
                0..6,
            ),
            scattered in proptest::collection::vec(
                (proptest::num::u64::ANY, proptest::num::u16::ANY, proptest::num::u32::ANY,
                 proptest::bool::ANY),
                0..200,
            ),
            window in 1usize..50_000,
        ) {
            let records = run_records(&runs, &scattered);
            let storage = MemStorage::new();
            let bytes = encode_blocks(&records, 7);
            let file = storage.open("v", bytes.len() as u64 + PAGE_BYTES as u64).unwrap();
            file.write_at(&bytes, 0).unwrap();
            let read = read_file(file.as_ref()).unwrap();
            let (generation, end, got) = read.expect("a valid file");
            proptest::prop_assert_eq!(generation, 7);
            proptest::prop_assert_eq!(end, bytes.len() as u64);
            proptest::prop_assert_eq!(sorted(got.clone()), sorted(records.clone()));
            let mut decoder = BlockDecoder::new();
            let mut fed = Vec::new();
            for part in bytes.chunks(window) {
                decoder.feed(part, &mut |r| fed.push(r));
            }
            proptest::prop_assert_eq!(fed, got);
        }
    }

    #[test]
    fn a_dense_zone_takes_a_page_not_fourteen_bytes_a_chunk() {
        // 1 M chunks of one creator written once in 5 epochs.
        let records = run_records(
            &(0..5u64)
                .map(|e| ((1 << 48) + e * 200_000, 200_000, e as u16, 0, false))
                .collect::<Vec<_>>(),
            &[],
        );
        let bytes = encode_blocks(&records, 1);
        assert_eq!(bytes.len(), PAGE_BYTES, "5 runs fit one page");
        let storage = MemStorage::new();
        let file = storage.open("v", 2 * PAGE_BYTES as u64).unwrap();
        file.write_at(&bytes, 0).unwrap();
        let (_, _, got) = read_file(file.as_ref()).unwrap().unwrap();
        assert_eq!(got, records, "sorted input comes back in order");
        // Scattered CIDs stay plain records, in their order.
        let scattered = run_records(&[], &[(9, 1, 1, false), (3, 1, 2, true), (5, 0, 0, false)]);
        let bytes = encode_blocks(&scattered, 1);
        let file = storage.open("w", 2 * PAGE_BYTES as u64).unwrap();
        file.write_at(&bytes, 0).unwrap();
        assert_eq!(read_file(file.as_ref()).unwrap().unwrap().2, scattered);
    }

    #[test]
    fn long_runs_are_cut_so_no_block_stands_for_too_many_records() {
        let run = Run {
            first: 1 << 48,
            count: u32::MAX,
            state: VersionState {
                version: Version {
                    epoch: 3,
                    version: 1,
                },
                deleted: false,
            },
        };
        let blocks = run_blocks(&[run, run]);
        let mut total = 0u64;
        for block in &blocks {
            let in_block: u64 = block.iter().map(|r| u64::from(r.count)).sum();
            assert!(in_block <= RUN_BLOCK_RECORDS_MAX);
            assert!(block.len() <= BLOCK_RECORDS_MAX);
            total += in_block;
        }
        assert_eq!(total, 2 * u64::from(u32::MAX));
        // A block claiming more than that (checksum intact) ends the file, unvisited.
        let mut body = vec![0u8; BLOCK_HEADER_BYTES + 2 * RUN_BYTES];
        let big = Run {
            count: (RUN_BLOCK_RECORDS_MAX / 2 + 1) as u32,
            ..run
        };
        encode_run(&big, &mut body[16..34]);
        encode_run(&big, &mut body[34..52]);
        body[0..4].copy_from_slice(&RUN_BLOCK_MAGIC.to_le_bytes());
        body[4..8].copy_from_slice(&1u32.to_le_bytes());
        body[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&body[..12]), &body[16..]);
        body[12..16].copy_from_slice(&crc.to_le_bytes());
        let mut page = vec![0u8; PAGE_BYTES];
        page[..body.len()].copy_from_slice(&body);
        let storage = MemStorage::new();
        let file = storage.open("v", PAGE_BYTES as u64).unwrap();
        file.write_at(&page, 0).unwrap();
        assert!(read_file(file.as_ref()).unwrap().is_none());
        let mut decoder = BlockDecoder::new();
        let mut visited = 0;
        decoder.feed(&page, &mut |_| visited += 1);
        assert_eq!((visited, decoder.finish()), (0, None));
    }

    #[test]
    fn active_extent_reads_back_what_load_returns() {
        let s: Arc<dyn Storage> = Arc::new(MemStorage::new());
        let (mut log, _) = VersionLog::open(s, "v").unwrap();
        let records: Vec<VersionRecord> = (0..100_000u64)
            .map(|cid| VersionRecord {
                cid,
                state: VersionState {
                    version: Version {
                        epoch: (cid % 7) as u16,
                        version: (cid % 1000) as u32,
                    },
                    deleted: cid % 11 == 0,
                },
            })
            .collect();
        log.append(&records[..70_000]).unwrap();
        log.compact(&records[..50_000]).unwrap();
        log.append(&records[50_000..]).unwrap();
        let (file, end) = log.active_extent();
        let mut buf = vec![0u8; end as usize];
        file.read_at(&mut buf, 0).unwrap();
        let mut decoder = BlockDecoder::new();
        let mut got = Vec::new();
        for window in buf.chunks(1 << 20) {
            decoder.feed(window, &mut |r| got.push(r));
        }
        assert_eq!(got, log.load().unwrap());
        assert_eq!(got, records);
        assert_eq!(decoder.finish().map(|(_, e)| e), Some(end));
    }
}
