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
//! The [`MemoryManager`] API is spread over modules by concern: `create` (creates, in
//! batches and under given IDs), `access` (get, put, remove, resize and their batches),
//! `explicit` (locks held across calls, pinning), `ids` (local IDs), `resident` (resident
//! memory ahead of use), `inspect` (walks, counters, the consistency check) and `typed`.
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
//!
//! [`heap`] stands apart from the memory manager: the policy of the process heap (the C
//! allocator) for node processes, which the `myriad` command sets before a node starts.

mod access;
mod alloc;
mod create;
mod entry;
mod error;
mod explicit;
pub mod heap;
mod ids;
mod inspect;
mod lock;
mod region;
mod resident;
mod table;
mod typed;

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::Duration;

use parking_lot::Mutex;

pub use error::{MemError, MemResult};
pub use myriad_types::{ChunkId, NodeId, ParseChunkIdError, LOCAL_ID_BITS, LOCAL_ID_MAX};
pub use typed::ChunkCodec;

use resident::ResidentAhead;
use table::Table;

/// The most chunks one `create_many`/`reserve`/batch call may handle (bounds the memory a
/// single call allocates for its results).
pub const BATCH_COUNT_MAX: usize = 1 << 24;

/// The unused part `(next, end)` of a block of local IDs a shard took from the counter.
type LocalIdBlock = (u64, u64);

/// Settings of a memory manager. Every field has a default (see [`Default`]).
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// This node's ID: the creator part of the CIDs it hands out.
    pub node_id: NodeId,
    /// Size of the data region reserved up front. Costs address space only; RAM is used as
    /// chunks fill it. Default 4 GiB; at most 4 TiB.
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

    /// The configuration in effect (with defaults resolved).
    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// This node's ID.
    pub fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    /// Fails with [`MemError::InvalidSize`] unless a chunk may have `size` bytes (used by
    /// the create paths and `resize`).
    #[inline]
    fn check_size(&self, size: usize) -> MemResult<()> {
        if size == 0 || size as u64 > self.config.chunk_bytes_max {
            return Err(MemError::InvalidSize {
                size: size as u64,
                max: self.config.chunk_bytes_max,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
