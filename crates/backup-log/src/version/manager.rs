//! The version manager of one zone: the version buffer of the current epoch, the sealed
//! epoch waiting for the version log, the previous epoch's *carry*, and the segment
//! usage they keep up to date (see the [parent module](super) for versions, epochs and
//! their invariants).
//!
//! Job: assign versions (the engine's append path, under the write-buffer lock: the
//! assignment is on the hot path and does one table lookup in the common case), end
//! epochs ([`VersionManager::seal`]), show the RAM versions to readers
//! ([`VersionManager::snapshot_into`]) and count placed entries
//! ([`VersionManager::placed`]). Open chains are in [`super::chains`], eon visits in
//! [`super::eon`].
//!
//! Invariants upheld here: versions of one chunk increase strictly within an epoch; at
//! most one sealed epoch waits; the buffer never holds more than `entries_max` chunks.

use super::slots::SlotTable;
use super::usage::{EntryLoc, SegmentUsage};
use super::{merge, CidMap, OpenChain, Version, VersionRecord, VersionState};
use crate::header::VERSION_IN_EPOCH_MAX;

/// An ended epoch waiting to be appended to the version log.
#[derive(Debug, Clone)]
pub struct SealedEpoch {
    /// The epoch that ended.
    pub epoch: u16,
    /// Its records (shared: the syncer writes them without copying them out from under
    /// the manager's lock; at the default seal threshold, 21,299 records, about 0.5 MiB).
    pub records: std::sync::Arc<Vec<VersionRecord>>,
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

/// One chunk in the version buffer: its version in the current epoch, whether that is a
/// remove, and where that version's entry was placed (once the writer placed it).
/// 16 bytes (24 with its key in the table, down from 32 with a separate flag): the
/// version buffer is touched on every append and every placement.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct Slot {
    /// The version (24 bits) with the deleted flag in bit 31.
    word: u32,
    loc: EntryLoc,
}

const SLOT_DELETED: u32 = 1 << 31;

impl Slot {
    pub(super) fn new(version: u32, deleted: bool) -> Slot {
        Slot {
            word: version | if deleted { SLOT_DELETED } else { 0 },
            loc: EntryLoc::default(),
        }
    }

    pub(super) fn version(&self) -> u32 {
        self.word & !SLOT_DELETED
    }

    pub(super) fn deleted(&self) -> bool {
        self.word & SLOT_DELETED != 0
    }
}

/// Version buffer and epoch counter of one zone (no I/O). See the module docs.
#[derive(Debug)]
pub struct VersionManager {
    pub(super) epoch: u16,
    /// The current epoch's versions (compact for dense CIDs: see [`super::slots`]).
    pub(super) buffer: SlotTable,
    /// The previous epoch's buffer (kept after it was sealed): where the entries of its
    /// chunks lie, so the first write of a chunk in this epoch still outdates its old
    /// entry. Emptied by the next seal.
    pub(super) carry: SlotTable,
    /// The smallest and largest CID in `carry` when it was made (an empty range while it
    /// is empty): a chunk outside it is not in the carry, so the first write of a new
    /// chunk (IDs are handed out in ascending order) skips the carry lookup.
    pub(super) carry_range: (u64, u64),
    /// Live bytes per segment, kept up to date as versions supersede placed entries.
    pub(super) usage: SegmentUsage,
    pub(super) sealed: Option<SealedEpoch>,
    /// Highest sequence number assigned in the current epoch.
    pub(super) epoch_last_seq: u64,
    pub(super) seal_entries: usize,
    pub(super) entries_max: usize,
    /// Epoch at which the last full visit of the log started.
    pub(super) last_full_visit_epoch: u16,
    /// While set (during an eon visit of the log), the epoch ends only when the buffer is
    /// completely full, not at the seal threshold, so re-stamping stays possible.
    pub(super) hold: bool,
    /// Chains appended link by link whose last link is not durable yet (a few at most:
    /// one per producer appending a chunk above half the write buffer).
    pub(super) chains: Vec<OpenChain>,
    /// Chains an eon visit registered for a fresh copy of an old chained chunk and then
    /// gave up ([`VersionManager::abandon_chain`]): their version stays in the buffer (so
    /// it is never handed out again) but never counts: snapshots show `prior`, and the
    /// seal leaves its record out of the version log. Emptied by the next seal.
    pub(super) abandoned: Vec<OpenChain>,
}

impl VersionManager {
    /// A manager starting in `epoch` with an empty buffer.
    pub fn new(epoch: u16, seal_entries: usize, entries_max: usize) -> VersionManager {
        VersionManager {
            epoch,
            buffer: SlotTable::default(),
            carry: SlotTable::default(),
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
        self.buffer.memory_bytes()
            + self.carry.memory_bytes()
            + self.usage.memory_bytes()
            + self.sealed.as_ref().map_or(0, |s| {
                s.records.capacity() as u64 * std::mem::size_of::<VersionRecord>() as u64
            })
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
        let mut records = Vec::with_capacity(self.carry.len());
        let epoch_records = self
            .carry
            .iter()
            // The version of an abandoned refresh never reaches the version log: its
            // links may be incomplete.
            .filter(|(cid, slot)| {
                !abandoned.iter().any(|a| {
                    a.cid == *cid
                        && a.version
                            == Version {
                                epoch,
                                version: slot.version(),
                            }
                        && !slot.deleted()
                })
            })
            .map(|(cid, slot)| {
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
            });
        records.extend(epoch_records);
        self.carry_range = range;
        self.sealed = Some(SealedEpoch {
            epoch: self.epoch,
            records: std::sync::Arc::new(records),
            last_seq: self.epoch_last_seq,
        });
        self.epoch_last_seq = 0;
        self.epoch = self.epoch.wrapping_add(1);
        true
    }

    /// Checks the manager's own invariants (cheap; for the consistency check): the buffer
    /// holds at most `entries_max` chunks, and a sealed epoch waiting is the one before the
    /// current one.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        if self.buffer.len() > self.entries_max {
            return Err("version buffer above its maximum");
        }
        if self
            .sealed
            .as_ref()
            .is_some_and(|s| s.epoch.wrapping_add(1) != self.epoch)
        {
            return Err("the sealed epoch is not the one before the current epoch");
        }
        Ok(())
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

    pub(super) fn assign(
        &mut self,
        cid: u64,
        deleted: bool,
        seq: u64,
    ) -> Result<Version, AssignBlocked> {
        let full = self.buffer.len() >= self.entries_max;
        // One table lookup in the common case (room left, no overflow).
        let version = match self.buffer.get_mut(cid) {
            Some(slot) if slot.version() < VERSION_IN_EPOCH_MAX => {
                let v = slot.version() + 1;
                let outdated = slot.loc;
                *slot = Slot::new(v, deleted);
                self.usage.outdate(outdated);
                Some(v)
            }
            Some(_) => None,
            None if !full => {
                self.buffer.insert(cid, Slot::new(0, deleted));
                self.take_from_carry(cid);
                Some(0)
            }
            None => None,
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
        debug_assert!(
            self.buffer.len() <= self.entries_max,
            "version buffer overfull"
        );
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
        if let Some(old) = self.carry.remove(cid) {
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

    /// Whether `chunks` assignments cannot block now: the buffer has room for that many
    /// new chunks, or no sealed epoch waits for the disk (so a seal can start a new one).
    /// (A version overflow of one chunk, 2^24 writes in one epoch, is not foreseen: that
    /// assignment may still wait.)
    pub fn room_now(&self, chunks: usize) -> bool {
        self.buffer.len() + chunks <= self.entries_max
            || (self.sealed.is_none() && chunks <= self.entries_max)
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
        if let Some(slot) = self.buffer.get(cid) {
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
            for r in sealed.records.iter() {
                merge(table, r.cid, r.state);
            }
        }
        for (cid, slot) in self.buffer.iter() {
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
            self.buffer.get_mut(cid)
        } else if self.buffer.contains(cid) {
            // Written again in this epoch: any entry of an earlier one is outdated.
            self.usage.outdate(loc);
            return;
        } else if version.epoch == self.epoch.wrapping_sub(1) {
            self.carry.get_mut(cid)
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
}
