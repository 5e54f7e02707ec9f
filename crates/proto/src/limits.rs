//! Bounds every decoder enforces (a message that exceeds one is refused, not truncated).

// Limits shared with other layers, defined once in `myriad_types::limits`.
pub use myriad_types::limits::ADDRESS_BYTES_MAX;

/// Most items in one batch request (CIDs, sizes, payloads).
pub const BATCH_ITEMS_MAX: usize = 1 << 20;
/// Largest chunk payload a message may carry (the memory manager's own limit is lower or
/// equal; it answers larger ones with an error).
pub const CHUNK_BYTES_MAX: usize = 64 << 20;
/// Most nodes listed in one message.
pub const NODES_MAX: usize = 65_536;
