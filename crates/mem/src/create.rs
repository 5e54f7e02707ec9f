//! Creating chunks: one at a time, in batches, under reserved CIDs, and under given CIDs
//! (recovery, migration). See the [crate docs](crate) for the design.
//!
//! Every path allocates, fills the bytes while the allocation is still private (not yet
//! in the table, so no lock is needed), and only then publishes the entry with one
//! compare-and-swap; when the publish fails the allocation is freed again, so a failed
//! create leaves neither memory nor an entry behind. `create_many` and `create_batch*`
//! are all or nothing; `create_with_ids*` report per item and give the results of one
//! `create_with_id` per item. Called by the node (requests, recovery's restorer) and
//! benchmarks.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::entry::{self, State};
use crate::{alloc, table};
use crate::{ChunkId, MemError, MemResult, MemoryManager, BATCH_COUNT_MAX};

/// Whether no value repeats in `cids`. Cheap for a few interleaved runs of consecutive
/// values (the runs' ranges are compared); a full sort only when those ranges overlap.
pub(crate) fn no_repeats(cids: impl Iterator<Item = u64> + Clone) -> bool {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for cid in cids.clone() {
        match runs.last_mut() {
            Some((_, last)) if cid == last.wrapping_add(1) => *last = cid,
            _ => runs.push((cid, cid)),
        }
    }
    runs.sort_unstable();
    if runs.windows(2).all(|pair| pair[0].1 < pair[1].0) {
        return true;
    }
    let mut all: Vec<u64> = cids.collect();
    all.sort_unstable();
    all.windows(2).all(|pair| pair[0] != pair[1])
}

impl MemoryManager {
    /// Fails with [`MemError::BatchTooLarge`] above [`BATCH_COUNT_MAX`] chunks.
    fn check_count(count: usize) -> MemResult<()> {
        if count > BATCH_COUNT_MAX {
            return Err(MemError::BatchTooLarge {
                count,
                max: BATCH_COUNT_MAX,
            });
        }
        Ok(())
    }

    /// Creates a chunk of `size` bytes, all zero, and returns its new ID.
    pub fn create(&self, size: usize) -> MemResult<ChunkId> {
        self.check_size(size)?;
        let offset = self.allocator.allocate(size)?;
        self.zero_payload(offset, size);
        self.install_or_free(offset, size)
    }

    /// Creates a chunk holding a copy of `data` and returns its new ID.
    pub fn create_with_data(&self, data: &[u8]) -> MemResult<ChunkId> {
        self.check_size(data.len())?;
        let offset = self.allocator.allocate(data.len())?;
        self.write_payload(offset, data);
        self.install_or_free(offset, data.len())
    }

    fn install_or_free(&self, offset: u64, size: usize) -> MemResult<ChunkId> {
        self.install_new(entry::live(offset, size))
            .inspect_err(|_| self.allocator.free(offset, size))
    }

    #[inline]
    pub(crate) fn payload_offset(offset: u64, size: usize) -> u64 {
        offset
            + if entry::needs_header(size) {
                alloc::HEADER_BYTES
            } else {
                0
            }
    }

    fn zero_payload(&self, offset: u64, size: usize) {
        // SAFETY: the allocation is fresh and not yet published in the table.
        unsafe {
            self.allocator
                .region()
                .zero(Self::payload_offset(offset, size), size)
        }
    }

    fn write_payload(&self, offset: u64, data: &[u8]) {
        // SAFETY: the allocation is fresh and not yet published in the table.
        unsafe {
            self.allocator
                .region()
                .write(Self::payload_offset(offset, data.len()), data)
        }
    }

    /// Creates `count` zeroed chunks of `size` bytes each in one call: one allocator lock
    /// and one ID range for all of them (the bulk-load path). All or nothing.
    pub fn create_many(&self, count: usize, size: usize) -> MemResult<Vec<ChunkId>> {
        self.check_size(size)?;
        Self::check_count(count)?;
        let mut offsets = Vec::new();
        self.allocator.allocate_many(size, count, &mut offsets)?;
        for &offset in &offsets {
            self.zero_payload(offset, size);
        }
        self.install_many(&offsets, size)
    }

    /// Creates one chunk per element of `sizes` (zeroed). All or nothing.
    pub fn create_batch(&self, sizes: &[usize]) -> MemResult<Vec<ChunkId>> {
        if let Some(&first) = sizes.first() {
            if sizes.iter().all(|&size| size == first) {
                return self.create_many(sizes.len(), first);
            }
        }
        let mut created = Vec::with_capacity(sizes.len());
        for &size in sizes {
            match self.create(size) {
                Ok(cid) => created.push(cid),
                Err(error) => {
                    for cid in created {
                        let _ = self.remove(cid);
                    }
                    return Err(error);
                }
            }
        }
        Ok(created)
    }

    /// Creates one chunk per element of `data` holding a copy of it. All or nothing.
    pub fn create_batch_with_data(&self, data: &[&[u8]]) -> MemResult<Vec<ChunkId>> {
        let mut created = Vec::with_capacity(data.len());
        for bytes in data {
            match self.create_with_data(bytes) {
                Ok(cid) => created.push(cid),
                Err(error) => {
                    for cid in created {
                        let _ = self.remove(cid);
                    }
                    return Err(error);
                }
            }
        }
        Ok(created)
    }

    fn install_many(&self, offsets: &[u64], size: usize) -> MemResult<Vec<ChunkId>> {
        let mut local_ids = Vec::new();
        if let Err(error) = self.take_local_ids(offsets.len(), &mut local_ids) {
            offsets
                .iter()
                .for_each(|&offset| self.allocator.free(offset, size));
            return Err(error);
        }
        let mut cids = Vec::with_capacity(offsets.len());
        for (index, &offset) in offsets.iter().enumerate() {
            let value = entry::live(offset, size);
            let cid = match self.claim(local_ids[index], value) {
                Some(cid) => Ok(cid),
                None => self.install_new(value),
            };
            match cid {
                Ok(cid) => cids.push(cid),
                Err(error) => {
                    offsets[index..]
                        .iter()
                        .for_each(|&offset| self.allocator.free(offset, size));
                    for cid in cids {
                        let _ = self.remove(cid);
                    }
                    return Err(error);
                }
            }
        }
        Ok(cids)
    }

    /// Reserves `count` new CIDs without allocating memory; fill them with
    /// [`create_reserved`](Self::create_reserved). Until then `get` reports them reserved.
    pub fn reserve(&self, count: usize) -> MemResult<Vec<ChunkId>> {
        Self::check_count(count)?;
        let mut local_ids = Vec::new();
        self.take_local_ids(count, &mut local_ids)?;
        let mut cids = Vec::with_capacity(count);
        for local_id in local_ids {
            match self.claim(local_id, entry::RESERVED) {
                Some(cid) => cids.push(cid),
                None => cids.push(self.install_new(entry::RESERVED)?),
            }
        }
        Ok(cids)
    }

    /// Creates the chunk of a reserved CID with `size` zeroed bytes.
    pub fn create_reserved(&self, cid: ChunkId, size: usize) -> MemResult<()> {
        self.check_size(size)?;
        if cid.creator() != self.config.node_id {
            return Err(MemError::ForeignChunk {
                cid,
                creator: cid.creator(),
                own: self.config.node_id,
            });
        }
        let entry = self.table.entry(cid).ok_or(MemError::NotReserved(cid))?;
        if entry::state(entry.load(Ordering::Relaxed)) != State::Reserved {
            return Err(MemError::NotReserved(cid));
        }
        let offset = self.allocator.allocate(size)?;
        self.zero_payload(offset, size);
        match entry.compare_exchange(
            entry::RESERVED,
            entry::live(offset, size),
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(_) => Ok(()),
            Err(_) => {
                self.allocator.free(offset, size);
                Err(MemError::NotReserved(cid))
            }
        }
    }

    /// Creates the chunks of reserved CIDs, `(cid, size)` each; one result per item.
    pub fn create_reserved_batch(&self, items: &[(ChunkId, usize)]) -> Vec<MemResult<()>> {
        items
            .iter()
            .map(|&(cid, size)| self.create_reserved(cid, size))
            .collect()
    }

    /// Stores a chunk under a given CID, typically one created elsewhere (a recovered or
    /// migrated chunk keeps its ID). The CID must not be live or reserved here. For this
    /// node's own IDs, later creates will not hand out `cid` again.
    pub fn create_with_id(&self, cid: ChunkId, data: &[u8]) -> MemResult<()> {
        self.check_size(data.len())?;
        let entry = self.table.entry_or_create(cid);
        let current = entry.load(Ordering::Relaxed);
        if !matches!(entry::state(current), State::Free | State::Removed) {
            return Err(MemError::AlreadyExists(cid));
        }
        let offset = self.allocator.allocate(data.len())?;
        self.install_with_id(entry, current, cid, data, offset)
    }

    /// Stores `data` at the fresh allocation `offset` and publishes it under `cid`, whose
    /// entry held `current` (free or removed); frees the allocation when another thread
    /// took the entry meanwhile.
    fn install_with_id(
        &self,
        entry: &AtomicU64,
        current: u64,
        cid: ChunkId,
        data: &[u8],
        offset: u64,
    ) -> MemResult<()> {
        self.write_payload(offset, data);
        let value = entry::live(offset, data.len());
        if entry
            .compare_exchange(current, value, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            self.allocator.free(offset, data.len());
            return Err(MemError::AlreadyExists(cid));
        }
        if cid.creator() == self.config.node_id {
            // Fresh IDs start above it (IDs below that were never used stay free: a gap).
            self.next_local_id
                .fetch_max(cid.local_id() + 1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// [`create_with_id`](Self::create_with_id) for many chunks; one result per item, the
    /// same results as one call per item. Runs of items of one size (a recovery's chunks
    /// usually are) take their memory in one allocator round
    /// ([`create_many`](Self::create_many)'s path) instead of one per chunk.
    pub fn create_with_ids(&self, items: &[(ChunkId, &[u8])]) -> Vec<MemResult<()>> {
        let mut results: Vec<MemResult<()>> = (0..items.len()).map(|_| Ok(())).collect();
        self.create_with_ids_by(
            items,
            |&(cid, data)| (cid, data),
            |index, error| {
                if let Some(result) = results.get_mut(index) {
                    *result = Err(error);
                }
            },
        );
        results
    }

    /// [`create_with_ids`](Self::create_with_ids) for items of any type, `item` giving each
    /// one's CID and data; reports only the failures, as `failed(index, error)` in
    /// increasing index order (every other item was stored). For a batch of a recovery:
    /// no vector of pairs to build, no result per chunk, and the table level of
    /// consecutive CIDs looked up once.
    pub fn create_with_ids_by<T>(
        &self,
        items: &[T],
        item: impl for<'x> Fn(&'x T) -> (ChunkId, &'x [u8]),
        mut failed: impl FnMut(usize, MemError),
    ) {
        let mut offsets: Vec<u64> = Vec::new();
        let mut start = 0;
        while start < items.len() {
            let size = item(&items[start]).1.len();
            let run = items[start..]
                .iter()
                .take_while(|candidate| item(candidate).1.len() == size)
                .count();
            let group = &items[start..start + run];
            let first = start;
            start += run;
            offsets.clear();
            // Items whose CID is taken (present here, or earlier in the group) fail before
            // anything is allocated for them, as one `create_with_id` each would: the group
            // then takes the one-by-one path (rare: a retried recovery). So a batch never
            // allocates for an item that fails (no slab made for nothing).
            let clean = {
                let mut leaf: Option<(u64, &table::Leaf)> = None;
                let mut previous: Option<ChunkId> = None;
                let mut ascending = true;
                let free = group.iter().all(|candidate| {
                    let cid = item(candidate).0;
                    ascending &= previous.is_none_or(|p| p.raw() < cid.raw());
                    previous = Some(cid);
                    let key = cid.raw() >> table::LEAF_BITS;
                    let current_leaf = match leaf {
                        Some((k, l)) if k == key => Some(l),
                        _ => {
                            let l = self.table.leaf(cid);
                            leaf = l.map(|l| (key, l));
                            l
                        }
                    };
                    current_leaf.is_none_or(|l| {
                        matches!(
                            entry::state(table::leaf_entry(l, cid).load(Ordering::Relaxed)),
                            State::Free | State::Removed
                        )
                    })
                });
                // Strictly ascending CIDs cannot repeat; otherwise (runs of CIDs that
                // interleave, as the creator's threads numbered them) compare the runs'
                // ranges (`no_repeats`).
                free && (ascending || no_repeats(group.iter().map(|c| item(c).0.raw())))
            };
            if group.len() < 2
                || !clean
                || self.check_size(size).is_err()
                || self
                    .allocator
                    .allocate_many(size, group.len(), &mut offsets)
                    .is_err()
            {
                // One by one: the same errors, and what fits is stored when not all does.
                for (i, candidate) in group.iter().enumerate() {
                    let (cid, data) = item(candidate);
                    if let Err(error) = self.create_with_id(cid, data) {
                        failed(first + i, error);
                    }
                }
                continue;
            }
            // The level-0 table of the previous CID: consecutive CIDs share it.
            let mut leaf: Option<(u64, &table::Leaf)> = None;
            for (i, (candidate, &offset)) in group.iter().zip(&offsets).enumerate() {
                let (cid, data) = item(candidate);
                let key = cid.raw() >> table::LEAF_BITS;
                let current_leaf = match leaf {
                    Some((k, l)) if k == key => l,
                    _ => {
                        let l = self.table.leaf_or_create(cid);
                        leaf = Some((key, l));
                        l
                    }
                };
                let entry = table::leaf_entry(current_leaf, cid);
                let current = entry.load(Ordering::Relaxed);
                if !matches!(entry::state(current), State::Free | State::Removed) {
                    self.allocator.free(offset, size);
                    failed(first + i, MemError::AlreadyExists(cid));
                    continue;
                }
                if let Err(error) = self.install_with_id(entry, current, cid, data, offset) {
                    failed(first + i, error);
                }
            }
        }
    }
}
