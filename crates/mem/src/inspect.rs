//! Inspection: creators and chunk ranges, walks over chunks, counters, trimming, and the
//! consistency check that ties the table to the allocator. See the [crate docs](crate).
//!
//! Walks read each chunk under its read lock (one removed meanwhile is skipped) and visit
//! only tables that exist, so they cost what is stored, not the width of the ID range.
//! `check_consistency` is for tests: expensive, and exact only while no other thread
//! creates, removes or resizes. Called by the node (migration, recovery and backups walk
//! chunk ranges; stats), tests and benchmarks.

use std::sync::atomic::Ordering;

use crate::entry::{self, State};
use crate::table::SLOTS_PER_TABLE;
use crate::{ChunkId, MemError, MemoryManager, MemoryStats, NodeId, LOCAL_ID_MAX};

impl MemoryManager {
    /// Creators of chunks stored here (this node and any whose chunks were recovered or
    /// migrated here).
    pub fn creators(&self) -> Vec<NodeId> {
        self.table.creators()
    }

    /// The live chunks of `creator` stored here as inclusive CID ranges, in order.
    pub fn chunk_ranges(&self, creator: NodeId) -> Vec<(ChunkId, ChunkId)> {
        let mut ranges: Vec<(ChunkId, ChunkId)> = Vec::new();
        self.table.for_each_leaf(creator, |first, leaf| {
            for (index, entry) in leaf.entries.iter().enumerate() {
                if entry::state(entry.load(Ordering::Acquire)) != State::Live {
                    continue;
                }
                let cid = ChunkId::from_raw(first.raw() + index as u64);
                match ranges.last_mut() {
                    Some((_, last)) if last.raw() + 1 == cid.raw() => *last = cid,
                    _ => ranges.push((cid, cid)),
                }
            }
        });
        ranges
    }

    /// Calls `visit(cid, bytes)` for every live chunk of `creator`, in CID order, each under
    /// its read lock.
    pub fn for_each_chunk(&self, creator: NodeId, mut visit: impl FnMut(ChunkId, &[u8])) {
        self.table.for_each_leaf(creator, |first, leaf| {
            for index in 0..SLOTS_PER_TABLE {
                if entry::state(leaf.entries[index].load(Ordering::Relaxed)) != State::Live {
                    continue;
                }
                let cid = ChunkId::from_raw(first.raw() + index as u64);
                let _ = self.read_with(cid, |bytes| visit(cid, bytes));
            }
        });
    }

    /// Calls `visit(cid, bytes)` for every live chunk with an ID in `first..=last` (which
    /// may span creators), in CID order, each under its read lock, until `visit` returns
    /// false. Walks only the tables that cover the range, so walking a large table slice
    /// by slice costs each slice its own size, not the table's.
    ///
    /// Returns the chunks it had to leave out because their lock could not be taken
    /// within the lock timeout (a writer or a caller's explicit lock holds it): they
    /// exist, and a caller that needs every chunk (re-replication) reads them again.
    /// Chunks removed meanwhile are skipped silently.
    pub fn for_each_chunk_in_range(
        &self,
        first: ChunkId,
        last: ChunkId,
        mut visit: impl FnMut(ChunkId, &[u8]) -> bool,
    ) -> Vec<ChunkId> {
        let mut busy = Vec::new();
        if first.raw() > last.raw() {
            return busy;
        }
        for creator in first.creator().0..=last.creator().0 {
            let low = if creator == first.creator().0 {
                first.local_id()
            } else {
                0
            };
            let high = if creator == last.creator().0 {
                last.local_id()
            } else {
                LOCAL_ID_MAX
            };
            let mut go_on = true;
            self.table
                .for_each_leaf_in(NodeId(creator), low, high, |leaf_first, leaf| {
                    let base = leaf_first.local_id();
                    let from = (low.max(base) - base) as usize;
                    let to = (high.min(base + SLOTS_PER_TABLE as u64 - 1) - base) as usize;
                    for index in from..=to {
                        if entry::state(leaf.entries[index].load(Ordering::Acquire)) != State::Live
                        {
                            continue;
                        }
                        let cid = ChunkId::from_raw(leaf_first.raw() + index as u64);
                        // A chunk removed since the entry was read is skipped; a locked
                        // one is reported.
                        match self.read_with(cid, |bytes| visit(cid, bytes)) {
                            Ok(true) => {}
                            Ok(false) => {
                                go_on = false;
                                return false;
                            }
                            Err(MemError::LockTimeout(_)) => busy.push(cid),
                            Err(_) => {}
                        }
                    }
                    true
                });
            if !go_on {
                return busy;
            }
        }
        busy
    }

    /// Returns memory held in reserve for quick reuse (one empty slab per size class and
    /// shard) to the page level, so free space coalesces fully; useful after bulk removes.
    pub fn trim(&self) {
        self.allocator.trim();
    }

    /// Current counters.
    pub fn stats(&self) -> MemoryStats {
        let allocator = self.allocator.stats();
        let table_bytes = self.table.table_bytes();
        let spare = self.spare_local_ids.lock().capacity() as u64 * 8;
        let largest_page_block = allocator.largest_free_bytes.min(allocator.free_page_bytes);
        let fragmentation = if allocator.free_page_bytes == 0 {
            0.0
        } else {
            1.0 - largest_page_block as f64 / allocator.free_page_bytes as f64
        };
        MemoryStats {
            chunks: allocator.chunks,
            payload_bytes: allocator.payload_bytes,
            allocated_bytes: allocator.allocated_bytes,
            metadata_bytes: table_bytes + allocator.metadata_bytes + spare,
            table_bytes,
            free_bytes: allocator.free_bytes,
            largest_free_bytes: allocator.largest_free_bytes,
            fragmentation,
            region_bytes: self.allocator.region().bytes(),
            spare_local_ids: self.spare_count.load(Ordering::Relaxed) as u64,
        }
    }

    /// Walks the table and the allocator and checks every invariant that ties them
    /// together: each live chunk sits in exactly one allocated slot or span of the right
    /// size, free lists and free spans are well formed, counters match, spare local IDs
    /// are unique removed IDs. Expensive; meant for tests. Call it while no other thread
    /// creates, removes or resizes chunks.
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut live = Vec::new();
        for creator in self.table.creators() {
            let mut failure = None;
            self.table.for_each_leaf(creator, |first, leaf| {
                for (index, entry) in leaf.entries.iter().enumerate() {
                    let value = entry.load(Ordering::Acquire);
                    if entry::state(value) != State::Live {
                        continue;
                    }
                    let cid = ChunkId::from_raw(first.raw() + index as u64);
                    match self.read_locked(cid) {
                        Ok((_guard, _, len)) => live.push((entry::offset(value), len)),
                        Err(error) => {
                            failure = Some(format!("live chunk {cid} unreadable: {error}"))
                        }
                    }
                }
            });
            if let Some(failure) = failure {
                return Err(failure);
            }
        }
        self.allocator.check(&live)?;
        let spare = self.spare_local_ids.lock();
        let mut seen = std::collections::HashSet::new();
        let next = self.next_local_id.load(Ordering::Relaxed);
        for &local_id in spare.iter() {
            if !seen.insert(local_id) || local_id >= next {
                return Err(format!(
                    "spare local ID {local_id} repeated or never handed out"
                ));
            }
            let state = self
                .table
                .entry(self.own(local_id))
                .map(|e| entry::state(e.load(Ordering::Relaxed)));
            if !matches!(state, Some(State::Removed | State::Live)) {
                return Err(format!("spare local ID {local_id} has state {state:?}"));
            }
        }
        Ok(())
    }
}
