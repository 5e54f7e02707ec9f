//! The version buffer's table: CID → [`Slot`], compact for the dense CID ranges zones
//! hold.
//!
//! Job: hold one zone's versions of the current epoch (and, as the *carry*, of the
//! previous one) in about 16 bytes per chunk. A zone's chunks are mostly a dense range of
//! its owner's local IDs (handed out in ascending order, written together), so the table
//! keeps them in *pages* of [`PAGE_SLOTS`] consecutive CIDs: a presence bitmap and the
//! slots, found by one lookup of the page in a small hash map. A CID whose page does
//! not exist yet goes to a plain hash map (*sparse*: migrated chunks, stragglers); once
//! [`DENSE_AFTER`] sparse CIDs share a page, they move into a new page. A hash map of
//! `(u64, Slot)` costs 25 bytes per bucket and, with its power-of-two growth and 7/8 load
//! limit, up to about 57 bytes per entry; a full page costs 16.1 bytes per entry (the
//! version buffer of DXRAM's Table II, about 3 MiB for 196,608 entries, is this size;
//! the default buffer is 16,384 entries, about 0.26 MiB).
//!
//! Invariants: a CID is in at most one of the pages and the sparse map; `len` counts
//! both; a page with no slot present is dropped; `sparse_counts` holds, for every page
//! key with sparse CIDs and no page, how many (below [`DENSE_AFTER`]).
//!
//! Caller: the [`VersionManager`](super::VersionManager) (its buffer and carry) only.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::manager::Slot;
use super::{CidHasher, CidMap};

/// CIDs per page (one presence word).
pub(super) const PAGE_SLOTS: u64 = 64;
/// Sparse CIDs of one page key at which they move into a page (a page is then at least a
/// quarter full: at most about 65 bytes per entry while it fills, 16 once full).
pub(super) const DENSE_AFTER: u8 = 16;

/// [`PAGE_SLOTS`] consecutive CIDs.
#[derive(Debug, Clone)]
struct Page {
    /// Bit `i`: slot `i` holds a version.
    present: u64,
    slots: [Slot; PAGE_SLOTS as usize],
}

impl Page {
    fn empty() -> Box<Page> {
        Box::new(Page {
            present: 0,
            slots: [Slot::new(0, false); PAGE_SLOTS as usize],
        })
    }
}

fn split(cid: u64) -> (u64, usize) {
    (cid / PAGE_SLOTS, (cid % PAGE_SLOTS) as usize)
}

/// CID → [`Slot`] in pages of dense CIDs plus a hash map for the rest. See the module
/// docs.
#[derive(Debug, Default, Clone)]
pub(super) struct SlotTable {
    pages: HashMap<u64, Box<Page>, BuildHasherDefault<CidHasher>>,
    sparse: CidMap<Slot>,
    sparse_counts: CidMap<u8>,
    len: usize,
}

impl SlotTable {
    /// Chunks in the table.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// True if the table holds no chunk.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Empties the table, releasing its pages (the sparse maps keep their capacity).
    pub(super) fn clear(&mut self) {
        self.pages = HashMap::default();
        self.sparse.clear();
        self.sparse_counts.clear();
        self.len = 0;
    }

    /// The slot of `cid`.
    #[inline]
    pub(super) fn get(&self, cid: u64) -> Option<&Slot> {
        let (key, i) = split(cid);
        match self.pages.get(&key) {
            Some(page) => (page.present & (1 << i) != 0).then(|| &page.slots[i]),
            None => self.sparse.get(&cid),
        }
    }

    /// The slot of `cid`, to change.
    #[inline]
    pub(super) fn get_mut(&mut self, cid: u64) -> Option<&mut Slot> {
        let (key, i) = split(cid);
        match self.pages.get_mut(&key) {
            Some(page) => (page.present & (1 << i) != 0).then(|| &mut page.slots[i]),
            None => self.sparse.get_mut(&cid),
        }
    }

    /// True if the table holds `cid`.
    pub(super) fn contains(&self, cid: u64) -> bool {
        self.get(cid).is_some()
    }

    /// Sets the slot of `cid`; returns the one it replaced.
    #[inline]
    pub(super) fn insert(&mut self, cid: u64, slot: Slot) -> Option<Slot> {
        let (key, i) = split(cid);
        if let Some(page) = self.pages.get_mut(&key) {
            let old = (page.present & (1 << i) != 0).then_some(page.slots[i]);
            page.present |= 1 << i;
            page.slots[i] = slot;
            if old.is_none() {
                self.len += 1;
            }
            return old;
        }
        if let Some(old) = self.sparse.insert(cid, slot) {
            return Some(old);
        }
        self.len += 1;
        let count = self.sparse_counts.entry(key).or_insert(0);
        *count += 1;
        if *count >= DENSE_AFTER {
            self.sparse_counts.remove(&key);
            self.make_page(key);
        }
        None
    }

    /// Moves the sparse CIDs of page `key` into a new page.
    fn make_page(&mut self, key: u64) {
        let mut page = Page::empty();
        for i in 0..PAGE_SLOTS {
            if let Some(slot) = self.sparse.remove(&(key * PAGE_SLOTS + i)) {
                page.present |= 1 << i;
                page.slots[i as usize] = slot;
            }
        }
        self.pages.insert(key, page);
    }

    /// Takes `cid` out of the table.
    pub(super) fn remove(&mut self, cid: u64) -> Option<Slot> {
        let (key, i) = split(cid);
        if let Some(page) = self.pages.get_mut(&key) {
            if page.present & (1 << i) == 0 {
                return None;
            }
            page.present &= !(1 << i);
            let slot = page.slots[i];
            if page.present == 0 {
                self.pages.remove(&key);
            }
            self.len -= 1;
            return Some(slot);
        }
        let slot = self.sparse.remove(&cid)?;
        self.len -= 1;
        if let Some(count) = self.sparse_counts.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                self.sparse_counts.remove(&key);
            }
        }
        Some(slot)
    }

    /// Every chunk and its slot, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, Slot)> + '_ {
        let dense = self.pages.iter().flat_map(|(&key, page)| {
            (0..PAGE_SLOTS)
                .filter(|&i| page.present & (1 << i) != 0)
                .map(move |i| (key * PAGE_SLOTS + i, page.slots[i as usize]))
        });
        dense.chain(self.sparse.iter().map(|(&cid, &slot)| (cid, slot)))
    }

    /// Bytes of RAM the table holds (its maps' buckets and its pages; allocator overhead
    /// not counted).
    pub(super) fn memory_bytes(&self) -> u64 {
        let page_map = map_bytes(
            self.pages.capacity(),
            std::mem::size_of::<(u64, Box<Page>)>(),
        ) + self.pages.len() * std::mem::size_of::<Page>();
        let sparse = map_bytes(self.sparse.capacity(), std::mem::size_of::<(u64, Slot)>())
            + map_bytes(
                self.sparse_counts.capacity(),
                std::mem::size_of::<(u64, u8)>(),
            );
        (page_map + sparse) as u64
    }
}

/// Bytes of a hash map of `capacity` entries of `entry` bytes: its buckets (the standard
/// table keeps them at most 7/8 full) and one control byte each.
pub(super) fn map_bytes(capacity: usize, entry: usize) -> usize {
    capacity.div_ceil(7) * 8 * (entry + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn slot(v: u32) -> Slot {
        Slot::new(v, v.is_multiple_of(7))
    }

    /// The table against a plain hash map, for inserts, removes and lookups of mixed
    /// dense and sparse CIDs.
    #[test]
    fn agrees_with_a_hash_map() {
        let mut table = SlotTable::default();
        let mut model: HashMap<u64, Slot> = HashMap::new();
        let mut x: u64 = 0x9E37_79B9;
        for step in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly a dense range, some far-apart CIDs, a few page boundaries.
            let cid = match x % 10 {
                0..=6 => (1 << 48) + (x >> 8) % 5_000,
                7 | 8 => (x >> 4) % (1 << 50),
                _ => (2 << 48) + (x >> 8) % 300,
            };
            if x.is_multiple_of(5) {
                assert_eq!(
                    table.remove(cid),
                    model.remove(&cid),
                    "remove {cid} at {step}"
                );
            } else {
                assert_eq!(
                    table.insert(cid, slot(step)),
                    model.insert(cid, slot(step)),
                    "insert {cid} at {step}"
                );
            }
            assert_eq!(table.len(), model.len());
            if step % 1000 == 0 {
                for (cid, s) in &model {
                    assert_eq!(table.get(*cid), Some(s));
                }
            }
        }
        let mut all: Vec<(u64, Slot)> = table.iter().collect();
        all.sort_by_key(|e| e.0);
        let mut expected: Vec<(u64, Slot)> = model.into_iter().collect();
        expected.sort_by_key(|e| e.0);
        assert_eq!(all, expected);
        table.clear();
        assert!(table.is_empty());
        assert_eq!(table.iter().count(), 0);
    }

    /// A dense range costs about 16 bytes per chunk, far below a hash map's (at a size
    /// like the default seal threshold, 127,795).
    #[test]
    fn a_dense_range_is_compact() {
        let mut table = SlotTable::default();
        let n = 127_795u64;
        for i in 0..n {
            table.insert((1 << 48) + 12_345 + i, slot(1));
        }
        assert_eq!(table.len(), n as usize);
        let per = table.memory_bytes() as f64 / n as f64;
        assert!(per < 18.0, "{per} bytes per chunk");
        let mut map: CidMap<Slot> = CidMap::default();
        for i in 0..n {
            map.insert((1 << 48) + 12_345 + i, slot(1));
        }
        let map_per =
            map_bytes(map.capacity(), std::mem::size_of::<(u64, Slot)>()) as f64 / n as f64;
        assert!(map_per > 2.5 * per, "map {map_per}, table {per}");
    }

    /// Scattered CIDs stay in the hash map: no page per chunk.
    #[test]
    fn scattered_cids_take_no_pages() {
        let mut table = SlotTable::default();
        for i in 0..10_000u64 {
            table.insert(i * 1_000, slot(1));
        }
        assert!(table.pages.is_empty());
        assert_eq!(table.len(), 10_000);
        for i in 0..10_000u64 {
            assert!(table.contains(i * 1_000));
            assert!(!table.contains(i * 1_000 + 1));
        }
    }
}
