//! # myriad-mem: the peer-local memory manager
//!
//! Stores billions of small chunks (16–128 bytes typical, 1 byte to 1 GiB possible) in one
//! large memory region with about 8 bytes of metadata each, and finds any chunk by its
//! 64-bit [`ChunkId`] in a handful of loads (the DXMem design of the DXRAM system).
//!
//! ## Parts
//! - **CID table** (`table`): paging-like translation, a root per creator node and four
//!   levels of 4,096 slots over the 48-bit local ID, to one 64-bit entry per chunk.
//! - **Entry** (`entry`): address, embedded length, read/write lock, pinned flag and state of
//!   a chunk in one word, changed with compare-and-swap.
//! - **Allocator** (`alloc`): 64 KiB pages on one `mmap`ed region; size-class slabs sharded
//!   per thread for chunks up to 256 KiB, whole coalescing page spans above.
//! - **Local IDs**: sequential per node, handed to threads in blocks, and reused from a
//!   bounded store of spare IDs after removes, so IDs stay dense.
//! - **Resident memory ahead of use**: [`MemoryManager::prefault`] (the region's start) and
//!   [`MemoryManager::keep_resident_ahead`] (a reserve above the allocator's top, which a
//!   peer keeps so that a recovery's burst of creates takes no page faults).
//!
//! ## Invariants
//! - No global lock on `get`/`put`: they touch only the chunk's entry (one CAS to lock, one
//!   atomic to unlock) and its bytes.
//! - A reader never sees a torn value: every read of chunk bytes happens under the chunk's
//!   read lock, every write under its write lock, including remove, resize and create.
//! - Memory of a chunk is freed only by the holder of its write lock, after which the entry
//!   no longer points at it; tables are never freed while the manager lives.
//! - No input makes it panic or touch memory outside a chunk: every error is a [`MemError`].
//!
//! ## Who calls it
//! The node (serving local and remote chunk access, recovery inserting chunks with their
//! original IDs), and benchmarks. It knows nothing of the network, disks or other nodes.
//! It is `Sync`: share one manager between threads with an `Arc`.

mod alloc;
mod entry;
mod error;
mod lock;
mod region;
mod table;
mod typed;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

pub use error::{MemError, MemResult};
pub use myriad_types::{ChunkId, NodeId, ParseChunkIdError, LOCAL_ID_BITS, LOCAL_ID_MAX};
pub use typed::ChunkCodec;

use entry::State;
use lock::{LockFailure, ReadGuard, Wait, WriteGuard};
use table::{Table, SLOTS_PER_TABLE};

/// Local IDs a thread takes from the node's counter at a time, so that two threads creating
/// chunks write to different cache lines of the table.
const LOCAL_ID_BLOCK: u64 = 64;
/// The most chunks one `create_many`/`reserve`/batch call may handle (bounds the memory a
/// single call allocates for its results).
pub const BATCH_COUNT_MAX: usize = 1 << 24;
/// Chunks whose table entries and data a batch call fetches ahead at once.
const BATCH_WINDOW: usize = 32;

/// The unused part `(next, end)` of a block of local IDs a shard took from the counter.
type LocalIdBlock = (u64, u64);

/// Settings of a memory manager. Every field has a default (see [`Default`]).
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// This node's ID: the creator part of the CIDs it hands out.
    pub node_id: NodeId,
    /// Size of the data region reserved up front. Costs address space only; RAM is used as
    /// chunks fill it. Default 4 GiB; at most 8 TiB.
    pub region_bytes: u64,
    /// The largest chunk. Default 1 GiB (capped to the region).
    pub chunk_bytes_max: u64,
    /// Capacity of the store of removed local IDs waiting for reuse. Removes beyond it
    /// leave their ID unused. Default 2^20 (8 MiB).
    pub spare_local_ids_max: usize,
    /// How long `get`, `put` and the other calls that lock a chunk wait for it before
    /// failing with [`MemError::LockTimeout`]. Default 10 s.
    pub lock_timeout: Duration,
    /// Allocator shards per size class (threads map to shards). 0 picks twice the CPU
    /// count, at most 16.
    pub shards: usize,
    /// Ask the OS for transparent huge pages for the data region (fewer TLB misses on
    /// random access). Default true; a hint that is ignored where unsupported.
    pub huge_pages: bool,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            node_id: NodeId(0),
            region_bytes: 4 << 30,
            chunk_bytes_max: 1 << 30,
            spare_local_ids_max: 1 << 20,
            lock_timeout: Duration::from_secs(10),
            shards: 0,
            huge_pages: true,
        }
    }
}

/// A snapshot of the memory manager's counters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryStats {
    /// Live chunks.
    pub chunks: u64,
    /// Their payload bytes.
    pub payload_bytes: u64,
    /// Bytes of the region in slabs and spans (payload plus slack plus free slots).
    pub allocated_bytes: u64,
    /// Bytes of metadata: CID tables, allocator descriptors and the spare-ID store.
    pub metadata_bytes: u64,
    /// The CID tables' share of `metadata_bytes`.
    pub table_bytes: u64,
    /// Free bytes in the region (free slots plus free pages).
    pub free_bytes: u64,
    /// The largest chunk allocation that would succeed now, in bytes.
    pub largest_free_bytes: u64,
    /// `1 - largest free page block / free page bytes`: 0 when free pages form one block.
    pub fragmentation: f64,
    /// Size of the region.
    pub region_bytes: u64,
    /// Local IDs waiting in the spare store.
    pub spare_local_ids: u64,
}

/// A chunk pinned in place by [`MemoryManager::pin`]: its address stays valid and the chunk
/// can be neither removed nor resized until [`MemoryManager::unpin`].
#[derive(Debug, Clone, Copy)]
pub struct PinnedChunk {
    /// The chunk.
    pub cid: ChunkId,
    /// Address of its first payload byte.
    pub address: *mut u8,
    /// Its size in bytes.
    pub len: usize,
}

/// The memory manager of one node. See the crate documentation.
pub struct MemoryManager {
    config: MemoryConfig,
    allocator: alloc::Allocator,
    table: Table,
    next_local_id: AtomicU64,
    local_id_blocks: Box<[alloc::Padded<Mutex<LocalIdBlock>>]>,
    spare_local_ids: Mutex<Vec<u64>>,
    spare_count: AtomicUsize,
    /// State of [`MemoryManager::keep_resident_ahead`].
    resident_ahead: Mutex<ResidentAhead>,
}

/// Whether no value repeats in `cids`. Cheap for a few interleaved runs of consecutive
/// values (the runs' ranges are compared); a full sort only when those ranges overlap.
fn no_repeats(cids: impl Iterator<Item = u64> + Clone) -> bool {
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

/// Where [`MemoryManager::keep_resident_ahead`] stands.
#[derive(Debug, Default)]
struct ResidentAhead {
    /// The allocator's top at the last call.
    top: u64,
    /// End of what was made resident above that top.
    end: u64,
    /// A top-up is under way (budgeted calls go on until the reserve is full).
    filling: bool,
}

impl std::fmt::Debug for MemoryManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryManager")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl MemoryManager {
    /// Creates a memory manager, reserving its data region.
    pub fn new(mut config: MemoryConfig) -> MemResult<MemoryManager> {
        if config.shards == 0 {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            config.shards = (cpus * 2).min(16);
        }
        config.chunk_bytes_max = config.chunk_bytes_max.min(config.region_bytes);
        if config.chunk_bytes_max == 0 {
            return Err(MemError::InvalidConfig(
                "chunk_bytes_max must be at least 1".into(),
            ));
        }
        let allocator =
            alloc::Allocator::new(config.region_bytes, config.shards, config.huge_pages)?;
        let local_id_blocks = (0..config.shards)
            .map(|_| alloc::Padded(Mutex::new((0, 0))))
            .collect();
        Ok(MemoryManager {
            allocator,
            table: Table::new(),
            next_local_id: AtomicU64::new(0),
            local_id_blocks,
            spare_local_ids: Mutex::new(Vec::new()),
            spare_count: AtomicUsize::new(0),
            resident_ahead: Mutex::new(ResidentAhead::default()),
            config,
        })
    }

    /// Makes the first `bytes` of the data region (rounded up to whole 64 KiB pages, at
    /// most the region) resident in RAM now, without changing any content, so that a later
    /// burst of creates there (a recovery of a failed peer's zone, a bulk load) takes no
    /// page faults: the allocator fills the region from its start. The pages then count
    /// as used RAM of this process even while they hold no chunk. Safe to call while the
    /// manager is in use, from any thread. It works in 2 MiB steps (a huge page) and may
    /// take a while (the OS zeroes every page, and compacts memory for huge pages), so
    /// callers run it in the background; a non-zero `pause` is slept after every step, so
    /// that the rest of the process (heartbeats, requests) and other processes keep their
    /// share of the CPU: several peers of one machine that prefault at once without a
    /// pause starved their heartbeat replies past a 1 s failure timeout on 2 cores.
    /// Returns the bytes made resident: 0 where the OS cannot do it without writing
    /// (Linux before 5.14).
    pub fn prefault(&self, bytes: u64, pause: Duration) -> MemResult<u64> {
        const STEP: u64 = 2 << 20;
        let region = self.allocator.region();
        let end = bytes
            .div_ceil(alloc::PAGE_BYTES)
            .saturating_mul(alloc::PAGE_BYTES)
            .min(region.bytes());
        let mut done = 0;
        while done < end {
            let len = STEP.min(end - done);
            match region.populate(done, len) {
                Ok(true) => {
                    done += len;
                    if !pause.is_zero() && done < end {
                        std::thread::sleep(pause);
                    }
                }
                Ok(false) => return Ok(0),
                Err(error) => {
                    return Err(MemError::RegionUnavailable {
                        bytes: end,
                        reason: format!("making pages resident: {error}"),
                    })
                }
            }
        }
        Ok(done)
    }

    /// Makes the `reserve` bytes above the allocator's never-used top resident (rounded up
    /// to whole 64 KiB pages, at most to the end of the region), as far as an earlier call
    /// has not already: one top-up of a reserve that a keeper thread calls again from time
    /// to time. A top-up starts only once less than half the reserve is left above the
    /// top (so a burst of creates into the reserve is not joined by more zeroing) and
    /// then goes on, call by call, until the reserve is full. Chunks created in a burst
    /// later (a restorer inserting a recovered zone) then land in pages the OS zeroed
    /// beforehand instead of taking a page fault each,
    /// wherever in the region the peer's own chunks have brought the top by then. When the
    /// top came down since the last call (freed pages at the top go back to the OS), the
    /// reserve is made resident again from the new top. Works in 2 MiB steps with `pause`
    /// slept after each (see [`MemoryManager::prefault`]), and stops after `budget` bytes
    /// (the next call goes on), so that a keeper looks at the top again often; contents
    /// never change, so it is safe while the manager is in use. Returns the bytes made
    /// resident by this call: 0 where the OS cannot do it without writing (Linux before
    /// 5.14, Miri). Calls are serialized.
    pub fn keep_resident_ahead(
        &self,
        reserve: u64,
        budget: u64,
        pause: Duration,
    ) -> MemResult<u64> {
        const STEP: u64 = 2 << 20;
        let region = self.allocator.region();
        let mut state = self.resident_ahead.lock();
        let top = self.allocator.top_bytes();
        if top < state.top {
            state.end = top;
        }
        state.top = top;
        let end = top
            .saturating_add(reserve)
            .div_ceil(alloc::PAGE_BYTES)
            .saturating_mul(alloc::PAGE_BYTES)
            .min(region.bytes());
        let mut cursor = state.end.max(top);
        if !state.filling && (cursor - top) >= reserve.div_ceil(2) {
            return Ok(0);
        }
        state.filling = true;
        let mut done = 0;
        while cursor < end && done < budget {
            // Whole aligned huge pages where possible.
            let step_end = ((cursor / STEP + 1) * STEP).min(end);
            match region.populate(cursor, step_end - cursor) {
                Ok(true) => {
                    done += step_end - cursor;
                    cursor = step_end;
                    state.end = cursor;
                    if !pause.is_zero() && cursor < end {
                        std::thread::sleep(pause);
                    }
                }
                Ok(false) => {
                    state.filling = false;
                    return Ok(0);
                }
                Err(error) => {
                    state.filling = false;
                    return Err(MemError::RegionUnavailable {
                        bytes: end - cursor,
                        reason: format!("making pages resident: {error}"),
                    });
                }
            }
        }
        if cursor >= end {
            state.filling = false;
        }
        Ok(done)
    }

    /// Byte offset of the allocator's never-used top of the region: the chunks created
    /// so far lie below it (with the free spans between them).
    pub fn top_bytes(&self) -> u64 {
        self.allocator.top_bytes()
    }

    /// The configuration in effect (with defaults resolved).
    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// This node's ID.
    pub fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    // ----- local IDs -------------------------------------------------------------------

    /// Fresh local IDs are handed out from `first` on (no effect if they already are). A
    /// restarted node calls it before its first create, so that it never hands out an ID
    /// an earlier incarnation may have used. IDs below `first` stay free (a gap).
    pub fn start_local_ids_at(&self, first: u64) {
        self.next_local_id
            .fetch_max(first.min(LOCAL_ID_MAX + 1), Ordering::Relaxed);
    }

    /// One past the highest local ID handed out (or reserved for a thread's block) so far:
    /// no fresh ID at or above it was given to anyone yet.
    pub fn local_id_mark(&self) -> u64 {
        self.next_local_id.load(Ordering::Relaxed)
    }

    fn check_size(&self, size: usize) -> MemResult<()> {
        if size == 0 || size as u64 > self.config.chunk_bytes_max {
            return Err(MemError::InvalidSize {
                size: size as u64,
                max: self.config.chunk_bytes_max,
            });
        }
        Ok(())
    }

    fn check_count(count: usize) -> MemResult<()> {
        if count > BATCH_COUNT_MAX {
            return Err(MemError::BatchTooLarge {
                count,
                max: BATCH_COUNT_MAX,
            });
        }
        Ok(())
    }

    fn own(&self, local_id: u64) -> ChunkId {
        ChunkId::from_raw((u64::from(self.config.node_id.0) << LOCAL_ID_BITS) | local_id)
    }

    /// A local ID for a new chunk: a spare one if any, else the next of this thread's block.
    fn take_local_id(&self) -> MemResult<u64> {
        if self.spare_count.load(Ordering::Relaxed) > 0 {
            let mut spare = self.spare_local_ids.lock();
            if let Some(local_id) = spare.pop() {
                self.spare_count.store(spare.len(), Ordering::Relaxed);
                return Ok(local_id);
            }
        }
        let mut block = self.local_id_blocks[self.allocator.thread_shard()].0.lock();
        if block.0 == block.1 {
            let start = self
                .next_local_id
                .fetch_add(LOCAL_ID_BLOCK, Ordering::Relaxed);
            if start > LOCAL_ID_MAX {
                self.next_local_id
                    .fetch_sub(LOCAL_ID_BLOCK, Ordering::Relaxed);
                return Err(MemError::LocalIdsExhausted);
            }
            *block = (start, (start + LOCAL_ID_BLOCK).min(LOCAL_ID_MAX + 1));
        }
        let local_id = block.0;
        block.0 += 1;
        Ok(local_id)
    }

    /// `count` local IDs: spare ones first, then a contiguous fresh range.
    fn take_local_ids(&self, count: usize, out: &mut Vec<u64>) -> MemResult<()> {
        out.reserve(count);
        if self.spare_count.load(Ordering::Relaxed) > 0 {
            let mut spare = self.spare_local_ids.lock();
            let take = count.min(spare.len());
            let from = spare.len() - take;
            out.extend(spare.drain(from..).rev());
            self.spare_count.store(spare.len(), Ordering::Relaxed);
        }
        let fresh = (count - out.len()) as u64;
        if fresh > 0 {
            let start = self.next_local_id.fetch_add(fresh, Ordering::Relaxed);
            if start
                .checked_add(fresh)
                .is_none_or(|end| end > LOCAL_ID_MAX + 1)
            {
                self.next_local_id.fetch_sub(fresh, Ordering::Relaxed);
                self.give_back_local_ids(out);
                return Err(MemError::LocalIdsExhausted);
            }
            out.extend(start..start + fresh);
        }
        Ok(())
    }

    fn give_back_local_ids(&self, local_ids: &mut Vec<u64>) {
        let mut spare = self.spare_local_ids.lock();
        let room = self.config.spare_local_ids_max.saturating_sub(spare.len());
        spare.extend(local_ids.drain(..).take(room));
        self.spare_count.store(spare.len(), Ordering::Relaxed);
    }

    /// Claims the entry of a fresh local ID for a new value (`Free`/`Removed` → `value`).
    fn claim(&self, local_id: u64, value: u64) -> Option<ChunkId> {
        let cid = self.own(local_id);
        let entry = self.table.entry_or_create(cid);
        let current = entry.load(Ordering::Relaxed);
        if matches!(entry::state(current), State::Free | State::Removed)
            && entry
                .compare_exchange(current, value, Ordering::Release, Ordering::Relaxed)
                .is_ok()
        {
            return Some(cid);
        }
        None
    }

    /// Installs `value` under a new own CID, taking further IDs if one turns out taken
    /// (by `create_with_id` of an own ID, which is allowed).
    fn install_new(&self, value: u64) -> MemResult<ChunkId> {
        loop {
            let local_id = self.take_local_id()?;
            if let Some(cid) = self.claim(local_id, value) {
                return Ok(cid);
            }
        }
    }

    // ----- create ----------------------------------------------------------------------

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

    fn payload_offset(offset: u64, size: usize) -> u64 {
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

    // ----- access ----------------------------------------------------------------------

    fn entry_of(&self, cid: ChunkId) -> MemResult<&AtomicU64> {
        self.table.entry(cid).ok_or(MemError::NotFound(cid))
    }

    fn lock_error(&self, cid: ChunkId, failure: LockFailure) -> MemError {
        match failure {
            LockFailure::TimedOut => MemError::LockTimeout(cid),
            LockFailure::NotLive(State::Reserved) => MemError::Reserved(cid),
            LockFailure::NotLive(State::Removed) => MemError::Removed(cid),
            LockFailure::NotLive(_) => MemError::NotFound(cid),
        }
    }

    fn read_locked(&self, cid: ChunkId) -> MemResult<(ReadGuard<'_>, u64, usize)> {
        let entry = self.entry_of(cid)?;
        let value = lock::read_lock(entry, &mut Wait::new(Some(self.config.lock_timeout)))
            .map_err(|failure| self.lock_error(cid, failure))?;
        let guard = ReadGuard(entry);
        // SAFETY: we hold the read lock.
        let (offset, len) = unsafe {
            self.allocator.payload(
                entry::offset(value),
                entry::is_large(value),
                entry::embedded_length(value),
            )
        };
        Ok((guard, offset, len))
    }

    fn write_locked(&self, cid: ChunkId) -> MemResult<(WriteGuard<'_>, u64, usize)> {
        let entry = self.entry_of(cid)?;
        let value = lock::write_lock(entry, &mut Wait::new(Some(self.config.lock_timeout)))
            .map_err(|failure| self.lock_error(cid, failure))?;
        let guard = WriteGuard { entry, value };
        // SAFETY: we hold the write lock.
        let (offset, len) = unsafe {
            self.allocator.payload(
                entry::offset(value),
                entry::is_large(value),
                entry::embedded_length(value),
            )
        };
        Ok((guard, offset, len))
    }

    /// Copies the chunk into `buffer` and returns its size.
    pub fn get(&self, cid: ChunkId, buffer: &mut [u8]) -> MemResult<usize> {
        let (_guard, offset, len) = self.read_locked(cid)?;
        let available = buffer.len();
        let destination = buffer.get_mut(..len).ok_or(MemError::BufferTooSmall {
            needed: len,
            available,
        })?;
        // SAFETY: we hold the read lock; the payload lies within the chunk's allocation.
        unsafe { self.allocator.region().read(offset, destination) };
        Ok(len)
    }

    /// The chunk's bytes as a new vector.
    pub fn get_vec(&self, cid: ChunkId) -> MemResult<Vec<u8>> {
        self.read_with(cid, <[u8]>::to_vec)
    }

    /// Runs `visit` on the chunk's bytes in place (no copy), under its read lock. Keep
    /// `visit` short: writers of this chunk wait for it.
    pub fn read_with<R>(&self, cid: ChunkId, visit: impl FnOnce(&[u8]) -> R) -> MemResult<R> {
        let (_guard, offset, len) = self.read_locked(cid)?;
        // SAFETY: we hold the read lock for the slice's whole life (it ends with `visit`).
        let bytes = unsafe { self.allocator.region().slice(offset, len) };
        Ok(visit(bytes))
    }

    /// Runs `update` on the chunk's bytes in place, under its write lock.
    pub fn write_with<R>(&self, cid: ChunkId, update: impl FnOnce(&mut [u8]) -> R) -> MemResult<R> {
        let (_guard, offset, len) = self.write_locked(cid)?;
        // SAFETY: we hold the write lock for the slice's whole life.
        let bytes = unsafe { self.allocator.region().slice_mut(offset, len) };
        Ok(update(bytes))
    }

    /// Replaces the chunk's bytes; `data` must be exactly the chunk's size
    /// ([`resize`](Self::resize) first to change it).
    pub fn put(&self, cid: ChunkId, data: &[u8]) -> MemResult<()> {
        let (_guard, offset, len) = self.write_locked(cid)?;
        if data.len() != len {
            return Err(MemError::SizeMismatch {
                cid,
                size: len,
                len: data.len(),
            });
        }
        // SAFETY: we hold the write lock.
        unsafe { self.allocator.region().write(offset, data) };
        Ok(())
    }

    /// Copies `buffer.len()` bytes starting at `offset` of the chunk into `buffer`.
    pub fn read_at(&self, cid: ChunkId, offset: usize, buffer: &mut [u8]) -> MemResult<()> {
        let (_guard, start, len) = self.read_locked(cid)?;
        Self::check_range(cid, offset, buffer.len(), len)?;
        // SAFETY: read lock held; the range is inside the payload (checked).
        unsafe { self.allocator.region().read(start + offset as u64, buffer) };
        Ok(())
    }

    /// Overwrites the chunk's bytes at `offset` with `data`.
    pub fn write_at(&self, cid: ChunkId, offset: usize, data: &[u8]) -> MemResult<()> {
        let (_guard, start, len) = self.write_locked(cid)?;
        Self::check_range(cid, offset, data.len(), len)?;
        // SAFETY: write lock held; the range is inside the payload (checked).
        unsafe { self.allocator.region().write(start + offset as u64, data) };
        Ok(())
    }

    fn check_range(cid: ChunkId, offset: usize, len: usize, size: usize) -> MemResult<()> {
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(MemError::OutOfBounds {
                cid,
                offset,
                len,
                size,
            });
        }
        Ok(())
    }

    /// Whether a chunk with this CID is stored here.
    pub fn exists(&self, cid: ChunkId) -> bool {
        self.table
            .entry(cid)
            .is_some_and(|entry| entry::state(entry.load(Ordering::Acquire)) == State::Live)
    }

    /// The chunk's size in bytes.
    pub fn size(&self, cid: ChunkId) -> MemResult<usize> {
        let entry = self.entry_of(cid)?;
        let value = entry.load(Ordering::Acquire);
        if entry::state(value) == State::Live && !entry::is_large(value) {
            return Ok(entry::embedded_length(value));
        }
        self.read_locked(cid).map(|(_, _, len)| len)
    }

    // ----- batches -----------------------------------------------------------------------

    /// Reads many chunks in one call, calling `visit(index, result)` once per element of
    /// `cids` with the chunk's bytes (in place, under its read lock) or the error, in index
    /// order. Table entries and chunk data are fetched ahead for a
    /// window of chunks at a time, so the memory latency of many chunks overlaps. A batch
    /// never waits for a lock while it holds others, so concurrent batches (or one that
    /// names a CID twice) cannot deadlock.
    pub fn get_batch_with(&self, cids: &[ChunkId], mut visit: impl FnMut(usize, MemResult<&[u8]>)) {
        let region = self.allocator.region();
        let mut base = 0;
        while base < cids.len() {
            let window = &cids[base..cids.len().min(base + BATCH_WINDOW)];
            let mut entries: [Option<&AtomicU64>; BATCH_WINDOW] = [None; BATCH_WINDOW];
            for (slot, &cid) in entries.iter_mut().zip(window) {
                *slot = self.table.entry(cid);
                if let Some(entry) = slot {
                    region::prefetch_pointer(*entry as *const AtomicU64);
                }
            }
            // Lock a prefix of the window, stopping at the first chunk that is missing or
            // cannot be locked at once: this thread never waits while it holds locks, so
            // two batches (or a batch naming one CID twice) cannot deadlock.
            let mut values = [0u64; BATCH_WINDOW];
            let mut locked = 0;
            while let Some(Some(entry)) = entries.get(locked).filter(|_| locked < window.len()) {
                match lock::try_read_lock_once(entry) {
                    Some(value) => {
                        values[locked] = value;
                        region.prefetch(entry::offset(value));
                        locked += 1;
                    }
                    None => break,
                }
            }
            // Hold locks in guards from here on so a panicking `visit` releases them all.
            let guards: [Option<ReadGuard<'_>>; BATCH_WINDOW] = std::array::from_fn(|i| {
                if i < locked {
                    entries[i].map(ReadGuard)
                } else {
                    None
                }
            });
            for (index, guard) in guards.into_iter().enumerate().take(locked) {
                let Some(guard) = guard else { continue };
                let value = values[index];
                // SAFETY: read lock held by `guard` until it is dropped below.
                let bytes = unsafe {
                    let (offset, len) = self.allocator.payload(
                        entry::offset(value),
                        entry::is_large(value),
                        entry::embedded_length(value),
                    );
                    region.slice(offset, len)
                };
                visit(base + index, Ok(bytes));
                drop(guard);
            }
            if locked < window.len() {
                // No lock is held here: the ordinary path may wait, or reports the error.
                let index = base + locked;
                let mut visited = false;
                let result = self.read_with(cids[index], |bytes| {
                    visited = true;
                    visit(index, Ok(bytes))
                });
                if let (false, Err(error)) = (visited, result) {
                    visit(index, Err(error));
                }
                base = index + 1;
            } else {
                base += window.len();
            }
        }
    }

    /// Copies many chunks into `out` (appended back to back) and returns each one's
    /// result: its length, or the error.
    pub fn get_batch(&self, cids: &[ChunkId], out: &mut Vec<u8>) -> Vec<MemResult<usize>> {
        let mut results: Vec<MemResult<usize>> = vec![Ok(0); cids.len()];
        // `get_batch_with` visits in index order, so the bytes land in index order.
        self.get_batch_with(cids, |index, result| match result {
            Ok(bytes) => {
                out.extend_from_slice(bytes);
                results[index] = Ok(bytes.len());
            }
            Err(error) => results[index] = Err(error),
        });
        results
    }

    /// Replaces many chunks' bytes in one call (`(cid, data)` each; sizes must match),
    /// fetching entries and data ahead like [`get_batch_with`](Self::get_batch_with).
    pub fn put_batch(&self, items: &[(ChunkId, &[u8])]) -> Vec<MemResult<()>> {
        let region = self.allocator.region();
        let mut results = Vec::with_capacity(items.len());
        let mut base = 0;
        while base < items.len() {
            let window = &items[base..items.len().min(base + BATCH_WINDOW)];
            let mut entries: [Option<&AtomicU64>; BATCH_WINDOW] = [None; BATCH_WINDOW];
            for (slot, &(cid, _)) in entries.iter_mut().zip(window) {
                *slot = self.table.entry(cid);
                if let Some(entry) = slot {
                    region::prefetch_pointer(*entry as *const AtomicU64);
                }
            }
            // As in `get_batch_with`: lock a prefix, never wait while holding locks. This
            // also keeps puts in order when one CID appears twice.
            let mut guards: [Option<WriteGuard<'_>>; BATCH_WINDOW] = std::array::from_fn(|_| None);
            let mut locked = 0;
            while let Some(Some(entry)) = entries.get(locked).filter(|_| locked < window.len()) {
                match lock::try_write_lock_once(entry) {
                    Some(value) => {
                        region.prefetch(entry::offset(value));
                        guards[locked] = Some(WriteGuard { entry, value });
                        locked += 1;
                    }
                    None => break,
                }
            }
            for (index, guard) in guards.into_iter().enumerate().take(locked) {
                let Some(guard) = guard else { continue };
                let (cid, data) = window[index];
                let value = guard.value;
                // SAFETY: write lock held by `guard`.
                let (offset, len) = unsafe {
                    self.allocator.payload(
                        entry::offset(value),
                        entry::is_large(value),
                        entry::embedded_length(value),
                    )
                };
                let result = if len == data.len() {
                    // SAFETY: write lock held; sizes match.
                    unsafe { region.write(offset, data) };
                    Ok(())
                } else {
                    Err(MemError::SizeMismatch {
                        cid,
                        size: len,
                        len: data.len(),
                    })
                };
                drop(guard);
                results.push(result);
            }
            if locked < window.len() {
                // No lock is held here: the ordinary path may wait, or reports the error.
                let (cid, data) = window[locked];
                results.push(self.put(cid, data));
                base += locked + 1;
            } else {
                base += window.len();
            }
        }
        results
    }

    // ----- remove and resize -------------------------------------------------------------

    /// Removes the chunk and frees its memory. Its local ID is reused by later creates if
    /// this node created it.
    pub fn remove(&self, cid: ChunkId) -> MemResult<()> {
        let (guard, _, len) = self.write_locked(cid)?;
        if entry::pinned(guard.value) {
            return Err(MemError::Pinned(cid));
        }
        self.allocator.free(entry::offset(guard.value), len);
        guard.release_with(entry::REMOVED);
        if cid.creator() == self.config.node_id {
            let mut spare = self.spare_local_ids.lock();
            if spare.len() < self.config.spare_local_ids_max {
                spare.push(cid.local_id());
                self.spare_count.store(spare.len(), Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Removes many chunks; one result per CID.
    pub fn remove_batch(&self, cids: &[ChunkId]) -> Vec<MemResult<()>> {
        cids.iter().map(|&cid| self.remove(cid)).collect()
    }

    /// Removes every live chunk with a CID in `first..=last` (same creator) and returns how
    /// many were removed. CIDs without a chunk are skipped; the walk visits only tables that
    /// exist, so even the whole 48-bit range costs no more than the chunks stored.
    pub fn remove_range(&self, first: ChunkId, last: ChunkId) -> MemResult<u64> {
        if first.creator() != last.creator() || first > last {
            return Err(MemError::InvalidRange { first, last });
        }
        let mut removed = 0;
        for (start, end) in self.chunk_ranges(first.creator()) {
            let (from, to) = (start.max(first), end.min(last));
            if from > to {
                continue;
            }
            for raw in from.raw()..=to.raw() {
                match self.remove(ChunkId::from_raw(raw)) {
                    Ok(()) => removed += 1,
                    Err(MemError::NotFound(_) | MemError::Removed(_) | MemError::Reserved(_)) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(removed)
    }

    /// Changes the chunk's size to `size` bytes, keeping the common prefix of its bytes and
    /// zeroing any new ones. Moves the chunk if its slot does not fit.
    pub fn resize(&self, cid: ChunkId, size: usize) -> MemResult<()> {
        self.check_size(size)?;
        let (guard, old_payload, old_len) = self.write_locked(cid)?;
        if entry::pinned(guard.value) {
            return Err(MemError::Pinned(cid));
        }
        let region = self.allocator.region();
        let old_offset = entry::offset(guard.value);
        if alloc::fits_in_place(old_len, size) {
            if size > old_len {
                // SAFETY: write lock held; the slot holds at least `size` payload bytes.
                unsafe { region.zero(old_payload + old_len as u64, size - old_len) };
            }
            self.allocator.resized_in_place(old_offset, old_len, size);
            guard.release_with(entry::live(old_offset, size));
            return Ok(());
        }
        let new_offset = self.allocator.allocate(size)?;
        let new_payload = Self::payload_offset(new_offset, size);
        let keep = old_len.min(size);
        // SAFETY: write lock held on the old chunk; the new allocation is still private.
        unsafe {
            let bytes = region.slice(old_payload, keep).to_vec();
            region.write(new_payload, &bytes);
            if size > keep {
                region.zero(new_payload + keep as u64, size - keep);
            }
        }
        self.allocator.free(old_offset, old_len);
        guard.release_with(entry::live(new_offset, size));
        Ok(())
    }

    // ----- explicit locks and pinning ----------------------------------------------------

    /// Takes the chunk's read lock, waiting up to `timeout`.
    pub fn lock_read(&self, cid: ChunkId, timeout: Duration) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        lock::read_lock(entry, &mut Wait::new(Some(timeout)))
            .map(|_| ())
            .map_err(|f| self.lock_error(cid, f))
    }

    /// Takes the chunk's read lock if it is free now.
    pub fn try_lock_read(&self, cid: ChunkId) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        lock::read_lock(entry, &mut Wait::new(None))
            .map(|_| ())
            .map_err(|failure| match failure {
                LockFailure::TimedOut => MemError::WouldBlock(cid),
                other => self.lock_error(cid, other),
            })
    }

    /// Releases a read lock taken with `lock_read`/`try_lock_read`.
    pub fn unlock_read(&self, cid: ChunkId) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        let mut value = entry.load(Ordering::Relaxed);
        loop {
            if entry::state(value) != State::Live || entry::readers(value) == 0 {
                return Err(MemError::NotLocked(cid));
            }
            match entry.compare_exchange_weak(
                value,
                value - entry::READER_ONE,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(current) => value = current,
            }
        }
    }

    /// Takes the chunk's write lock, waiting up to `timeout` (for the lock and for readers
    /// to leave). While held, only `*_locked` calls access the chunk without waiting.
    pub fn lock_write(&self, cid: ChunkId, timeout: Duration) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        lock::write_lock(entry, &mut Wait::new(Some(timeout)))
            .map(|_| ())
            .map_err(|f| self.lock_error(cid, f))
    }

    /// Takes the chunk's write lock if it is free and has no readers now.
    pub fn try_lock_write(&self, cid: ChunkId) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        lock::try_write_lock_once(entry).map(|_| ()).ok_or_else(|| {
            match entry::state(entry.load(Ordering::Relaxed)) {
                State::Live => MemError::WouldBlock(cid),
                state => self.lock_error(cid, LockFailure::NotLive(state)),
            }
        })
    }

    /// Releases the write lock taken with `lock_write`/`try_lock_write`.
    pub fn unlock_write(&self, cid: ChunkId) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        let value = entry.load(Ordering::Acquire);
        if entry::state(value) != State::Live || !entry::write_locked(value) {
            return Err(MemError::NotLocked(cid));
        }
        lock::write_unlock(entry, value & !entry::WRITE_BIT);
        Ok(())
    }

    /// The entry value of a chunk whose write lock the caller holds.
    fn held_write(&self, cid: ChunkId) -> MemResult<(u64, usize)> {
        let entry = self.entry_of(cid)?;
        let value = entry.load(Ordering::Acquire);
        if entry::state(value) != State::Live || !entry::write_locked(value) {
            return Err(MemError::NotLocked(cid));
        }
        // SAFETY: the caller holds the write lock (checked that someone does; the contract
        // of the `*_locked` calls is that it is the caller).
        Ok(unsafe {
            self.allocator.payload(
                entry::offset(value),
                entry::is_large(value),
                entry::embedded_length(value),
            )
        })
    }

    /// `get` for a chunk whose write lock the caller holds (from `lock_write`).
    pub fn get_locked(&self, cid: ChunkId, buffer: &mut [u8]) -> MemResult<usize> {
        let (offset, len) = self.held_write(cid)?;
        let available = buffer.len();
        let destination = buffer.get_mut(..len).ok_or(MemError::BufferTooSmall {
            needed: len,
            available,
        })?;
        // SAFETY: the caller holds the write lock.
        unsafe { self.allocator.region().read(offset, destination) };
        Ok(len)
    }

    /// `put` for a chunk whose write lock the caller holds (from `lock_write`).
    pub fn put_locked(&self, cid: ChunkId, data: &[u8]) -> MemResult<()> {
        let (offset, len) = self.held_write(cid)?;
        if data.len() != len {
            return Err(MemError::SizeMismatch {
                cid,
                size: len,
                len: data.len(),
            });
        }
        // SAFETY: the caller holds the write lock.
        unsafe { self.allocator.region().write(offset, data) };
        Ok(())
    }

    /// Pins the chunk: its bytes stay at the returned address, and remove/resize fail with
    /// [`MemError::Pinned`], until [`unpin`](Self::unpin). Reading or writing through the
    /// address is the caller's own (unsafe) business; the chunk locks still apply.
    pub fn pin(&self, cid: ChunkId) -> MemResult<PinnedChunk> {
        let entry = self.entry_of(cid)?;
        let mut wait = Wait::new(Some(self.config.lock_timeout));
        loop {
            let value = entry.load(Ordering::Relaxed);
            let state = entry::state(value);
            if state != State::Live {
                return Err(self.lock_error(cid, LockFailure::NotLive(state)));
            }
            if entry::write_locked(value) {
                if !wait.pause() {
                    return Err(MemError::LockTimeout(cid));
                }
                continue;
            }
            if entry
                .compare_exchange_weak(
                    value,
                    value | entry::PINNED_BIT | entry::READER_ONE,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                let _guard = ReadGuard(entry);
                // SAFETY: we hold a read lock while reading the header.
                let (offset, len) = unsafe {
                    self.allocator.payload(
                        entry::offset(value),
                        entry::is_large(value),
                        entry::embedded_length(value),
                    )
                };
                let address = self.allocator.region().pointer(offset);
                return Ok(PinnedChunk { cid, address, len });
            }
        }
    }

    /// Unpins a chunk pinned with [`pin`](Self::pin).
    pub fn unpin(&self, cid: ChunkId) -> MemResult<()> {
        let entry = self.entry_of(cid)?;
        let mut value = entry.load(Ordering::Relaxed);
        loop {
            if entry::state(value) != State::Live || !entry::pinned(value) {
                return Err(MemError::NotPinned(cid));
            }
            match entry.compare_exchange_weak(
                value,
                value & !entry::PINNED_BIT,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(current) => value = current,
            }
        }
    }

    // ----- typed chunks ------------------------------------------------------------------

    /// Creates a chunk holding `value` encoded.
    pub fn create_typed<T: ChunkCodec>(&self, value: &T) -> MemResult<ChunkId> {
        let cid = self.create(value.encoded_len())?;
        if let Err(error) = self.write_with(cid, |bytes| value.encode(bytes)) {
            let _ = self.remove(cid);
            return Err(error);
        }
        Ok(cid)
    }

    /// Decodes the chunk as a `T`.
    pub fn get_typed<T: ChunkCodec>(&self, cid: ChunkId) -> MemResult<T> {
        self.read_with(cid, T::decode)?
            .map_err(|reason| MemError::Decode { cid, reason })
    }

    /// Stores `value` in the chunk, resizing it if the encoding's size differs.
    pub fn put_typed<T: ChunkCodec>(&self, cid: ChunkId, value: &T) -> MemResult<()> {
        let len = value.encoded_len();
        if self.size(cid)? != len {
            self.resize(cid, len)?;
        }
        self.write_with(cid, |bytes| {
            if bytes.len() == len {
                value.encode(bytes);
                Ok(())
            } else {
                Err(MemError::SizeMismatch {
                    cid,
                    size: bytes.len(),
                    len,
                })
            }
        })?
    }

    // ----- listing, statistics, checks ---------------------------------------------------

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
    pub fn for_each_chunk_in_range(
        &self,
        first: ChunkId,
        last: ChunkId,
        mut visit: impl FnMut(ChunkId, &[u8]) -> bool,
    ) {
        if first.raw() > last.raw() {
            return;
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
                        // A chunk removed since the entry was read is skipped.
                        if !self
                            .read_with(cid, |bytes| visit(cid, bytes))
                            .unwrap_or(true)
                        {
                            go_on = false;
                            return false;
                        }
                    }
                    true
                });
            if !go_on {
                return;
            }
        }
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

#[cfg(test)]
mod tests {
    //! Unit tests small enough for Miri (`miri_` prefix: scripts/test-nightly runs them).
    use super::*;

    fn small() -> MemoryManager {
        MemoryManager::new(MemoryConfig {
            node_id: NodeId(3),
            region_bytes: 64 * alloc::PAGE_BYTES,
            shards: 2,
            lock_timeout: Duration::from_millis(200),
            ..MemoryConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn local_ids_start_at_the_given_first_one() {
        let memory = MemoryManager::new(MemoryConfig {
            node_id: NodeId(4),
            region_bytes: 1 << 20,
            ..MemoryConfig::default()
        })
        .unwrap();
        memory.start_local_ids_at(1000);
        memory.start_local_ids_at(10);
        let cid = memory.create(8).unwrap();
        assert_eq!(cid.local_id(), 1000);
        assert!(memory.local_id_mark() > 1000);
        let many = memory.create_batch(&[8, 8]).unwrap();
        assert!(many.iter().all(|cid| cid.local_id() > 1000));
    }

    #[test]
    fn miri_create_with_ids_in_runs() {
        let memory = small();
        let cid = |lid: u64| ChunkId::new(NodeId(8), lid).unwrap();
        let taken = memory.create_with_ids(&[(cid(2), b"xy")]);
        assert_eq!(taken, vec![Ok(())]);
        let results = memory.create_with_ids(&[
            (cid(1), b"ab"),
            (cid(2), b"zz"),
            (cid(3), b"cd"),
            (cid(4), b"long one"),
        ]);
        assert_eq!(
            results,
            vec![Ok(()), Err(MemError::AlreadyExists(cid(2))), Ok(()), Ok(())]
        );
        assert_eq!(memory.get_vec(cid(1)).unwrap(), b"ab");
        assert_eq!(memory.get_vec(cid(2)).unwrap(), b"xy");
        assert_eq!(memory.get_vec(cid(3)).unwrap(), b"cd");
        assert_eq!(memory.get_vec(cid(4)).unwrap(), b"long one");
        memory.check_consistency().unwrap();
    }

    proptest::proptest! {
        /// Batches of any sizes, CIDs (repeats, neighbours across table levels, chunks
        /// stored before) and lengths (runs of one size, large chunks, invalid sizes)
        /// give the results and contents of one `create_with_id` per item; slabs partly
        /// freed before serve free-listed and bump slots alike.
        #[test]
        fn create_with_ids_equals_one_create_per_item(
            before in proptest::collection::vec((0u64..9000, 1usize..200), 0..60),
            remove_every in 1usize..5,
            batch in proptest::collection::vec(
                (0u64..9000, proptest::prop_oneof![
                    6 => proptest::strategy::Just(24usize), 2 => 1usize..200, 1 => proptest::strategy::Just(0usize),
                    1 => 2040usize..2100, 1 => proptest::strategy::Just(70_000usize),
                ], proptest::num::u8::ANY),
                0..400,
            ),
        ) {
            let cid = |lid: u64| ChunkId::new(NodeId(8), lid * 7 + 1).unwrap();
            let data = |lid: u64, len: usize, fill: u8| -> Vec<u8> {
                (0..len).map(|i| (i as u8) ^ fill ^ (lid as u8)).collect()
            };
            let roomy = || {
                MemoryManager::new(MemoryConfig {
                    node_id: NodeId(3),
                    region_bytes: 1024 * alloc::PAGE_BYTES,
                    shards: 2,
                    ..MemoryConfig::default()
                })
                .unwrap()
            };
            let batched = roomy();
            let reference = roomy();
            for (n, &(lid, len)) in before.iter().enumerate() {
                for memory in [&batched, &reference] {
                    let _ = memory.create_with_id(cid(lid), &data(lid, len, 0));
                    if n % remove_every == 0 {
                        let _ = memory.remove(cid(lid));
                    }
                }
            }
            let payloads: Vec<(ChunkId, Vec<u8>)> = batch
                .iter()
                .map(|&(lid, len, fill)| (cid(lid), data(lid, len, fill)))
                .collect();
            let items: Vec<(ChunkId, &[u8])> =
                payloads.iter().map(|(c, d)| (*c, d.as_slice())).collect();
            let got = batched.create_with_ids(&items);
            let expected: Vec<MemResult<()>> = items
                .iter()
                .map(|&(c, d)| reference.create_with_id(c, d))
                .collect();
            proptest::prop_assert_eq!(&got, &expected);
            let mut failures = Vec::new();
            batched.create_with_ids_by(&items, |&(c, d)| (c, d), |i, e| failures.push((i, e)));
            let again: Vec<(usize, MemError)> = items
                .iter()
                .enumerate()
                .filter_map(|(i, &(c, d))| reference.create_with_id(c, d).err().map(|e| (i, e)))
                .collect();
            proptest::prop_assert_eq!(failures, again);
            for lid in 0..9000u64 {
                proptest::prop_assert_eq!(
                    batched.get_vec(cid(lid)).ok(),
                    reference.get_vec(cid(lid)).ok()
                );
            }
            batched.check_consistency().map_err(proptest::test_runner::TestCaseError::fail)?;
            proptest::prop_assert_eq!(batched.stats().chunks, reference.stats().chunks);
        }
    }

    #[test]
    fn repeats_are_found_across_interleaved_runs() {
        let check = |cids: &[u64]| super::no_repeats(cids.iter().copied());
        assert!(check(&[]));
        assert!(check(&[5, 6, 7, 1, 2, 3, 10, 11]));
        assert!(check(&[1, 2, 3, 50, 51, 4, 5, 52]), "runs that interleave");
        assert!(check(&[1, 3, 5, 2, 4, 6]), "overlapping runs, no repeat");
        assert!(!check(&[1, 3, 5, 2, 3]), "overlapping runs with a repeat");
        assert!(!check(&[5, 6, 5]));
        assert!(!check(&[7, 7]));
    }

    #[test]
    fn miri_prefault_keeps_contents() {
        let memory = small();
        let a = memory.create_with_data(b"before").unwrap();
        let region = memory.stats().region_bytes;
        let populated = memory.prefault(region, Duration::ZERO).unwrap();
        // Under Miri (no mmap) nothing is populated; elsewhere the whole region is.
        assert!(populated == 0 || populated == region);
        assert_eq!(memory.get_vec(a).unwrap(), b"before");
        let b = memory.create(100).unwrap();
        assert_eq!(memory.get_vec(b).unwrap(), vec![0; 100]);
        memory.check_consistency().unwrap();
    }

    #[test]
    fn miri_create_get_put_remove_reuse() {
        let memory = small();
        let a = memory.create_with_data(b"hello").unwrap();
        let b = memory.create(3000).unwrap();
        assert_eq!(a.creator(), NodeId(3));
        assert_eq!(memory.get_vec(a).unwrap(), b"hello");
        assert_eq!(memory.get_vec(b).unwrap(), vec![0; 3000]);
        memory.put(a, b"HELLO").unwrap();
        assert_eq!(memory.get_vec(a).unwrap(), b"HELLO");
        assert_eq!(
            memory.put(a, b"toolong"),
            Err(MemError::SizeMismatch {
                cid: a,
                size: 5,
                len: 7
            })
        );
        memory.write_at(b, 2998, b"xy").unwrap();
        let mut tail = [0u8; 2];
        memory.read_at(b, 2998, &mut tail).unwrap();
        assert_eq!(&tail, b"xy");
        assert!(matches!(
            memory.read_at(b, 2999, &mut tail),
            Err(MemError::OutOfBounds { .. })
        ));
        memory.remove(a).unwrap();
        assert_eq!(memory.get_vec(a), Err(MemError::Removed(a)));
        assert_eq!(memory.remove(a), Err(MemError::Removed(a)));
        let reused = memory.create(8).unwrap();
        assert_eq!(reused, a, "the removed local ID is reused");
        memory.check_consistency().unwrap();
    }

    #[test]
    fn miri_resize_moves_and_keeps_prefix() {
        let memory = small();
        let cid = memory.create_with_data(&[7u8; 100]).unwrap();
        // Miri interprets every byte check; keep its sizes small.
        let sizes: &[usize] = if cfg!(miri) {
            &[101, 2048, 2049, 4000, 10, 2049, 1]
        } else {
            &[101, 2048, 2049, 70_000, 10, 2049, 1]
        };
        for &size in sizes {
            let before = memory.get_vec(cid).unwrap();
            memory.resize(cid, size).unwrap();
            let after = memory.get_vec(cid).unwrap();
            assert_eq!(after.len(), size);
            let keep = before.len().min(size);
            assert_eq!(after[..keep], before[..keep]);
            assert!(after[keep..].iter().all(|&byte| byte == 0));
            memory.check_consistency().unwrap();
        }
    }

    #[test]
    fn miri_locks_pins_and_reservations() {
        let memory = small();
        let cid = memory.create(16).unwrap();
        memory.lock_write(cid, Duration::from_millis(10)).unwrap();
        assert_eq!(memory.try_lock_read(cid), Err(MemError::WouldBlock(cid)));
        assert_eq!(memory.get_vec(cid), Err(MemError::LockTimeout(cid)));
        memory.put_locked(cid, &[1; 16]).unwrap();
        memory.unlock_write(cid).unwrap();
        assert_eq!(memory.unlock_write(cid), Err(MemError::NotLocked(cid)));
        memory.lock_read(cid, Duration::from_millis(10)).unwrap();
        memory.try_lock_read(cid).unwrap();
        assert_eq!(memory.try_lock_write(cid), Err(MemError::WouldBlock(cid)));
        memory.unlock_read(cid).unwrap();
        memory.unlock_read(cid).unwrap();
        assert_eq!(memory.unlock_read(cid), Err(MemError::NotLocked(cid)));
        let pinned = memory.pin(cid).unwrap();
        assert_eq!(pinned.len, 16);
        assert_eq!(memory.remove(cid), Err(MemError::Pinned(cid)));
        assert_eq!(memory.resize(cid, 17), Err(MemError::Pinned(cid)));
        memory.unpin(cid).unwrap();
        assert_eq!(memory.unpin(cid), Err(MemError::NotPinned(cid)));
        let reserved = memory.reserve(3).unwrap();
        assert_eq!(
            memory.get_vec(reserved[0]),
            Err(MemError::Reserved(reserved[0]))
        );
        memory.create_reserved(reserved[1], 4).unwrap();
        assert_eq!(
            memory.create_reserved(reserved[1], 4),
            Err(MemError::NotReserved(reserved[1]))
        );
        assert_eq!(memory.size(reserved[1]), Ok(4));
        memory.check_consistency().unwrap();
    }

    #[test]
    fn miri_bad_input_is_a_typed_error() {
        let memory = small();
        let foreign = ChunkId::new(NodeId(9), 1).unwrap();
        assert_eq!(memory.get_vec(foreign), Err(MemError::NotFound(foreign)));
        assert!(matches!(
            memory.create(0),
            Err(MemError::InvalidSize { .. })
        ));
        assert!(matches!(
            memory.create(usize::MAX),
            Err(MemError::InvalidSize { .. })
        ));
        assert!(memory.create(60 * alloc::PAGE_BYTES as usize).is_ok());
        assert!(matches!(
            memory.create(8 * alloc::PAGE_BYTES as usize),
            Err(MemError::OutOfMemory { .. })
        ));
        memory.create_with_id(foreign, b"moved here").unwrap();
        assert_eq!(
            memory.create_with_id(foreign, b"x"),
            Err(MemError::AlreadyExists(foreign))
        );
        assert_eq!(memory.get_vec(foreign).unwrap(), b"moved here");
        assert!(matches!(
            memory.create_reserved(foreign, 1),
            Err(MemError::ForeignChunk { .. })
        ));
        let mut small_buffer = [0u8; 2];
        assert!(matches!(
            memory.get(foreign, &mut small_buffer),
            Err(MemError::BufferTooSmall { .. })
        ));
        memory.check_consistency().unwrap();
    }

    /// The range walk reads the tables it passes through the same loads as every lookup:
    /// chunks in two leaves of one creator and one of another, a range across all three.
    #[test]
    fn miri_chunks_in_a_range_across_leaves_and_creators() {
        let memory = small();
        let cids = [
            ChunkId::new(NodeId(3), 5).unwrap(),
            ChunkId::new(NodeId(3), 4095).unwrap(),
            ChunkId::new(NodeId(3), 4096).unwrap(),
            ChunkId::new(NodeId(4), 1).unwrap(),
        ];
        for cid in cids {
            memory
                .create_with_id(cid, &[cid.local_id() as u8; 8])
                .unwrap();
        }
        let mut seen = Vec::new();
        memory.for_each_chunk_in_range(cids[1], cids[3], |cid, bytes| {
            assert_eq!(bytes, [cid.local_id() as u8; 8]);
            seen.push(cid);
            true
        });
        assert_eq!(seen, cids[1..].to_vec());
    }

    #[test]
    fn miri_batches() {
        let memory = small();
        let cids = memory.create_many(40, 24).unwrap();
        let items: Vec<(ChunkId, Vec<u8>)> = cids
            .iter()
            .map(|&cid| (cid, vec![cid.local_id() as u8; 24]))
            .collect();
        let borrowed: Vec<(ChunkId, &[u8])> = items
            .iter()
            .map(|(cid, data)| (*cid, data.as_slice()))
            .collect();
        assert!(memory.put_batch(&borrowed).iter().all(Result::is_ok));
        let mut query = cids.clone();
        query.push(ChunkId::new(NodeId(3), 999).unwrap());
        let mut out = Vec::new();
        let results = memory.get_batch(&query, &mut out);
        assert_eq!(results.len(), 41);
        assert!(results[40].is_err());
        for (index, cid) in cids.iter().enumerate() {
            assert_eq!(
                out[index * 24..index * 24 + 24],
                vec![cid.local_id() as u8; 24][..]
            );
        }
        assert_eq!(memory.chunk_ranges(NodeId(3)), vec![(cids[0], cids[39])]);
        assert_eq!(memory.remove_range(cids[10], cids[19]).unwrap(), 10);
        assert_eq!(memory.chunk_ranges(NodeId(3)).len(), 2);
        memory.check_consistency().unwrap();
    }

    #[test]
    fn miri_typed_chunks() {
        let memory = small();
        let cid = memory.create_typed(&42u64).unwrap();
        assert_eq!(memory.get_typed::<u64>(cid), Ok(42));
        memory
            .put_typed(cid, &"now a longer string".to_string())
            .unwrap();
        assert_eq!(
            memory.get_typed::<String>(cid).unwrap(),
            "now a longer string"
        );
        assert!(matches!(
            memory.get_typed::<u64>(cid),
            Err(MemError::Decode { .. })
        ));
    }
}
