//! The version table of a zone read: each chunk's current state, dense by local ID for
//! the zone owner's chunks (sparse for the rest), with a claim flag per slot so every
//! chunk is delivered at most once, also when a crash left two copies of an entry; and
//! the assembly of chained chunks. Built by the calling thread from the version log and
//! the RAM versions, then shared read-only (claims atomic) by the validating threads.
//! See the [parent module](super).

use std::sync::atomic::AtomicBool;

use crate::version::{CidMap, Version, VersionState};

/// One chunk's current version in a [`RecoveryTable`]; 8 bytes.
pub(super) struct Slot {
    pub(super) version: u32,
    pub(super) epoch: u16,
    /// 0 = no version known, 1 = written, 2 = removed.
    pub(super) state: u8,
    pub(super) claimed: AtomicBool,
}

impl Slot {
    const EMPTY: u8 = 0;
    const LIVE: u8 = 1;
    const REMOVED: u8 = 2;

    pub(super) fn empty() -> Slot {
        Slot {
            version: 0,
            epoch: 0,
            state: Slot::EMPTY,
            claimed: AtomicBool::new(false),
        }
    }

    pub(super) fn version(&self) -> Version {
        Version {
            epoch: self.epoch,
            version: self.version,
        }
    }

    pub(super) fn merge(&mut self, state: VersionState) {
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
pub(super) const DENSE_SLACK: u64 = 1 << 16;
/// Bits of the local ID in a CID.
pub(super) const LID_MASK: u64 = (1 << 48) - 1;

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
pub(super) struct RecoveryTable {
    pub(super) owner: u16,
    pub(super) base: u64,
    pub(super) dense: Vec<Slot>,
    pub(super) sparse: CidMap<Slot>,
    /// Own CIDs added so far (with repeats).
    pub(super) own: u64,
    /// Slots to reserve at the first own CID.
    pub(super) expected: usize,
}

impl RecoveryTable {
    /// An empty table for a zone of `owner`, expecting about `expected` records.
    pub(super) fn new(owner: u16, expected: usize) -> RecoveryTable {
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
    pub(super) fn add(&mut self, cid: u64, state: VersionState) {
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
    pub(super) fn grow(&mut self, len: usize) {
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

    pub(super) fn slot_mut(&mut self, cid: u64) -> &mut Slot {
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
    pub(super) fn live(&self, cid: u64) -> Option<&Slot> {
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

pub(super) struct Assembly {
    pub(super) version: Version,
    pub(super) count: u8,
    pub(super) links: Vec<Option<Vec<u8>>>,
    pub(super) have: usize,
}
