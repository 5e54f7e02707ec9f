//! The memory manager's typed errors.

use myriad_types::{ChunkId, NodeId};

/// Everything that can go wrong in a memory-manager call. No input makes the memory manager
/// panic; bad input ends up here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// No chunk with this CID is stored here (never created, or created on another node and
    /// never migrated or recovered here).
    #[error("chunk {0} not found")]
    NotFound(ChunkId),
    /// The chunk was stored here and has been removed.
    #[error("chunk {0} was removed")]
    Removed(ChunkId),
    /// The CID was reserved with `reserve` but not yet created with `create_reserved`.
    #[error("chunk {0} is reserved but not created yet")]
    Reserved(ChunkId),
    /// `create_reserved` on a CID that is not in the reserved state.
    #[error("chunk {0} is not reserved")]
    NotReserved(ChunkId),
    /// `create_with_id` on a CID that is already live or reserved here.
    #[error("chunk {0} already exists")]
    AlreadyExists(ChunkId),
    /// An operation that only applies to this node's own CIDs got another creator's CID.
    #[error("chunk {cid} was created by node {creator}, not by this node ({own})")]
    ForeignChunk {
        /// The offending CID.
        cid: ChunkId,
        /// Its creator.
        creator: NodeId,
        /// This node.
        own: NodeId,
    },
    /// A chunk size of 0 or above the configured maximum.
    #[error("invalid chunk size {size} (must be 1..={max})")]
    InvalidSize {
        /// The requested size in bytes.
        size: u64,
        /// The configured maximum chunk size in bytes.
        max: u64,
    },
    /// `put` with data whose length differs from the chunk's size (use `resize` first).
    #[error("chunk {cid} holds {size} bytes, the data has {len}")]
    SizeMismatch {
        /// The chunk.
        cid: ChunkId,
        /// The chunk's size in bytes.
        size: usize,
        /// The length of the data given.
        len: usize,
    },
    /// An offset access reaching past the end of the chunk.
    #[error("access to bytes {offset}..{offset}+{len} of chunk {cid} which holds {size} bytes")]
    OutOfBounds {
        /// The chunk.
        cid: ChunkId,
        /// Start of the access.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// The chunk's size.
        size: usize,
    },
    /// The caller's buffer cannot hold the chunk.
    #[error("buffer of {available} bytes is too small for {needed} bytes")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// The data region has no free block large enough.
    #[error("out of memory: no free block for {requested} bytes")]
    OutOfMemory {
        /// Bytes requested (including any length header).
        requested: u64,
    },
    /// A batch call with more items than one call may carry.
    #[error("batch of {count} items exceeds the limit of {max} per call")]
    BatchTooLarge {
        /// Items requested.
        count: usize,
        /// The limit ([`crate::BATCH_COUNT_MAX`]).
        max: usize,
    },
    /// An inclusive CID range whose ends have different creators or are reversed.
    #[error("invalid CID range {first}..={last}")]
    InvalidRange {
        /// First CID.
        first: ChunkId,
        /// Last CID.
        last: ChunkId,
    },
    /// All 2^48 local IDs of this node are in use.
    #[error("local ID space of this node is exhausted")]
    LocalIdsExhausted,
    /// A lock could not be taken before the timeout.
    #[error("timed out waiting for the lock of chunk {0}")]
    LockTimeout(ChunkId),
    /// A `try_lock_*` found the chunk locked.
    #[error("chunk {0} is locked")]
    WouldBlock(ChunkId),
    /// An unlock or a locked access without the corresponding lock held.
    #[error("chunk {0} is not locked in the required mode")]
    NotLocked(ChunkId),
    /// The chunk is pinned; it cannot be moved, resized or removed until unpinned.
    #[error("chunk {0} is pinned")]
    Pinned(ChunkId),
    /// `unpin` on a chunk that is not pinned.
    #[error("chunk {0} is not pinned")]
    NotPinned(ChunkId),
    /// A configuration value out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The operating system refused to reserve the data region.
    #[error("cannot reserve the data region of {bytes} bytes: {reason}")]
    RegionUnavailable {
        /// The requested region size.
        bytes: u64,
        /// The operating system's error.
        reason: String,
    },
    /// A typed chunk could not be decoded from its bytes.
    #[error("chunk {cid} cannot be decoded: {reason}")]
    Decode {
        /// The chunk.
        cid: ChunkId,
        /// What the decoder said.
        reason: String,
    },
}

/// Result alias of the memory manager.
pub type MemResult<T> = Result<T, MemError>;
