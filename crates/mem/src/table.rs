//! The CID table: paging-like translation of a CID to its 64-bit level-0 entry.
//!
//! A root of 65,536 slots indexed by the creator's node ID, then four levels of 4,096 slots
//! indexed by 12-bit fragments of the local ID (bits 47..36, 35..24, 23..12, 11..0). Tables
//! are created on demand, published with compare-and-swap, and never freed before the
//! table itself is dropped, so a reference to an entry stays valid for the table's life.
//! Translation is five dependent loads and no hashing; dense LIDs keep the upper levels in
//! cache.

use std::mem::size_of;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use myriad_types::{ChunkId, NodeId};

/// Slots per table level.
pub(crate) const SLOTS_PER_TABLE: usize = 4096;
const SLOT_BITS: u32 = 12;
/// Low bits of a CID that index within its level-0 table: CIDs equal above them share
/// one [`Leaf`].
pub(crate) const LEAF_BITS: u32 = SLOT_BITS;
const ROOT_SLOTS: usize = 1 << 16;

/// A level-0 table: the entries of 4,096 consecutive LIDs.
#[repr(C, align(64))]
pub(crate) struct Leaf {
    pub(crate) entries: [AtomicU64; SLOTS_PER_TABLE],
}

/// An inner table pointing at 4,096 tables of the next level.
#[repr(C, align(64))]
struct Directory<T> {
    slots: [AtomicPtr<T>; SLOTS_PER_TABLE],
}

type Level1 = Directory<Leaf>;
type Level2 = Directory<Level1>;
type Level3 = Directory<Level2>;

/// The entry of `cid` in `leaf`, the level-0 table holding it
/// ([`Table::leaf_or_create`] of `cid` or of a CID equal to it above [`LEAF_BITS`]).
#[inline]
pub(crate) fn leaf_entry(leaf: &Leaf, cid: ChunkId) -> &AtomicU64 {
    &leaf.entries[index(cid.local_id(), 0)]
}

/// Types whose all-zero bit pattern is a valid, empty value.
///
/// # Safety
/// Implementors must be valid when every byte is zero.
unsafe trait Zeroable: Sized {}
// SAFETY: `AtomicU64` is valid as zero.
unsafe impl Zeroable for Leaf {}
// SAFETY: `AtomicPtr` is valid as zero (null).
unsafe impl<T> Zeroable for Directory<T> {}

fn new_zeroed<T: Zeroable>() -> Box<T> {
    // SAFETY: `T: Zeroable` guarantees all-zero bytes are a valid `T`.
    unsafe { Box::<T>::new_zeroed().assume_init() }
}

/// The table of one node: every CID this node stores, whoever created it.
pub(crate) struct Table {
    root: Box<[AtomicPtr<Level3>]>,
    table_bytes: AtomicU64,
}

impl Table {
    pub(crate) fn new() -> Table {
        let root: Box<[AtomicPtr<Level3>]> = (0..ROOT_SLOTS)
            .map(|_| AtomicPtr::new(ptr::null_mut()))
            .collect();
        Table {
            root,
            table_bytes: AtomicU64::new((ROOT_SLOTS * size_of::<AtomicPtr<Level3>>()) as u64),
        }
    }

    /// Bytes held by all tables, including the root.
    pub(crate) fn table_bytes(&self) -> u64 {
        self.table_bytes.load(Ordering::Relaxed)
    }

    /// The entry of `cid`, or `None` if no table on its path exists yet (then the CID was
    /// never used here and its state is free).
    #[inline]
    pub(crate) fn entry(&self, cid: ChunkId) -> Option<&AtomicU64> {
        let leaf = self.leaf(cid)?;
        Some(&leaf.entries[index(cid.local_id(), 0)])
    }

    /// The level-0 table holding `cid`, or `None` if no table on its path exists yet.
    #[inline]
    pub(crate) fn leaf(&self, cid: ChunkId) -> Option<&Leaf> {
        let lid = cid.local_id();
        let level3 = load(&self.root[cid.creator().0 as usize])?;
        let level2 = load(&level3.slots[index(lid, 3)])?;
        let level1 = load(&level2.slots[index(lid, 2)])?;
        load(&level1.slots[index(lid, 1)])
    }

    /// The entry of `cid`, creating the tables on its path.
    #[inline]
    pub(crate) fn entry_or_create(&self, cid: ChunkId) -> &AtomicU64 {
        let leaf = self.leaf_or_create(cid);
        &leaf.entries[index(cid.local_id(), 0)]
    }

    /// The level-0 table holding `cid`, created if needed.
    #[inline]
    pub(crate) fn leaf_or_create(&self, cid: ChunkId) -> &Leaf {
        let lid = cid.local_id();
        let level3 = self.load_or_create(&self.root[cid.creator().0 as usize]);
        let level2 = self.load_or_create(&level3.slots[index(lid, 3)]);
        let level1 = self.load_or_create(&level2.slots[index(lid, 2)]);
        self.load_or_create(&level1.slots[index(lid, 1)])
    }

    fn load_or_create<'a, T: Zeroable>(&'a self, slot: &'a AtomicPtr<T>) -> &'a T {
        if let Some(existing) = load(slot) {
            return existing;
        }
        let fresh = Box::into_raw(new_zeroed::<T>());
        match slot.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                self.table_bytes
                    .fetch_add(size_of::<T>() as u64, Ordering::Relaxed);
                // SAFETY: `fresh` came from `Box::into_raw` and is now owned by the table,
                // which frees it only in `drop` (after every borrow of `self` ended).
                unsafe { &*fresh }
            }
            Err(existing) => {
                // SAFETY: `fresh` was never published; we still own it.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: a non-null slot points at a table owned by `self` (see above).
                unsafe { &*existing }
            }
        }
    }

    /// Calls `visit(first_cid, leaf)` for every level-0 table of `creator`, in CID order.
    pub(crate) fn for_each_leaf(&self, creator: NodeId, mut visit: impl FnMut(ChunkId, &Leaf)) {
        let Some(level3) = load(&self.root[creator.0 as usize]) else {
            return;
        };
        for (i3, slot3) in level3.slots.iter().enumerate() {
            let Some(level2) = load(slot3) else { continue };
            for (i2, slot2) in level2.slots.iter().enumerate() {
                let Some(level1) = load(slot2) else { continue };
                for (i1, slot1) in level1.slots.iter().enumerate() {
                    let Some(leaf) = load(slot1) else { continue };
                    let lid = ((i3 as u64) << 36) | ((i2 as u64) << 24) | ((i1 as u64) << 12);
                    if let Some(first) = ChunkId::new(creator, lid) {
                        visit(first, leaf);
                    }
                }
            }
        }
    }

    /// Calls `visit(first_cid, leaf)` for every level-0 table of `creator` that holds an
    /// entry of a local ID in `low..=high`, in CID order, walking only the tables on the
    /// way to the range; stops when `visit` returns false.
    pub(crate) fn for_each_leaf_in(
        &self,
        creator: NodeId,
        low: u64,
        high: u64,
        mut visit: impl FnMut(ChunkId, &Leaf) -> bool,
    ) {
        if low > high {
            return;
        }
        let Some(level3) = load(&self.root[creator.0 as usize]) else {
            return;
        };
        // The slot range of `level` under a parent that starts at `base` (its first
        // local ID): the whole table, clipped at the ends of `low..=high`.
        let span = |level: u32, base: u64| {
            let first = if low > base { index(low, level) } else { 0 };
            let width = 1u64 << (SLOT_BITS * (level + 1));
            let last = if high < base.saturating_add(width - 1) {
                index(high, level)
            } else {
                SLOTS_PER_TABLE - 1
            };
            first..=last
        };
        for i3 in span(3, 0) {
            let Some(level2) = load(&level3.slots[i3]) else {
                continue;
            };
            let base3 = (i3 as u64) << 36;
            for i2 in span(2, base3) {
                let Some(level1) = load(&level2.slots[i2]) else {
                    continue;
                };
                let base2 = base3 | ((i2 as u64) << 24);
                for i1 in span(1, base2) {
                    let Some(leaf) = load(&level1.slots[i1]) else {
                        continue;
                    };
                    let lid = base2 | ((i1 as u64) << 12);
                    if let Some(first) = ChunkId::new(creator, lid) {
                        if !visit(first, leaf) {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Creators that have at least one table here.
    pub(crate) fn creators(&self) -> Vec<NodeId> {
        (0..ROOT_SLOTS)
            .filter(|&i| load(&self.root[i]).is_some())
            .map(|i| NodeId(i as u16))
            .collect()
    }
}

#[inline]
fn index(lid: u64, level: u32) -> usize {
    ((lid >> (SLOT_BITS * level)) as usize) & (SLOTS_PER_TABLE - 1)
}

#[inline]
fn load<T>(slot: &AtomicPtr<T>) -> Option<&T> {
    let pointer = slot.load(Ordering::Acquire);
    // SAFETY: non-null slots point at tables published by `load_or_create` with release
    // ordering (paired with this acquire) and freed only when the table is dropped.
    unsafe { pointer.as_ref() }
}

fn free_owned<T>(slot: &mut AtomicPtr<T>) -> Option<Box<T>> {
    let pointer = *slot.get_mut();
    if pointer.is_null() {
        None
    } else {
        // SAFETY: every non-null slot holds a pointer from `Box::into_raw` that only this
        // table owns; `&mut` proves no borrow of it is alive.
        Some(unsafe { Box::from_raw(pointer) })
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        for slot3 in self.root.iter_mut() {
            let Some(mut level3) = free_owned(slot3) else {
                continue;
            };
            for slot2 in level3.slots.iter_mut() {
                let Some(mut level2) = free_owned(slot2) else {
                    continue;
                };
                for slot1 in level2.slots.iter_mut() {
                    let Some(mut level1) = free_owned(slot1) else {
                        continue;
                    };
                    for leaf in level1.slots.iter_mut() {
                        drop(free_owned(leaf));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn miri_entries_are_created_on_demand_and_stable() {
        let table = Table::new();
        let a = ChunkId::new(NodeId(7), 5).unwrap();
        let b = ChunkId::new(NodeId(7), (3 << 36) | (2 << 24) | (1 << 12) | 9).unwrap();
        assert!(table.entry(a).is_none());
        table.entry_or_create(a).store(11, Ordering::Relaxed);
        table.entry_or_create(b).store(22, Ordering::Relaxed);
        assert_eq!(table.entry(a).unwrap().load(Ordering::Relaxed), 11);
        assert_eq!(table.entry(b).unwrap().load(Ordering::Relaxed), 22);
        assert!(table.entry(ChunkId::new(NodeId(8), 5).unwrap()).is_none());
        let mut leaves = Vec::new();
        table.for_each_leaf(NodeId(7), |first, _| leaves.push(first.local_id()));
        assert_eq!(leaves, vec![0, (3 << 36) | (2 << 24) | (1 << 12)]);
        assert_eq!(table.creators(), vec![NodeId(7)]);
    }
}
