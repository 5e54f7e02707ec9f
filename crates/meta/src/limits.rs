//! Every limit of the metadata, in one place. Commands beyond a limit are refused with a
//! typed error; decoders refuse encodings beyond them before allocating.

// Limits shared with other layers, defined once in `myriad_types::limits`.
pub use myriad_types::limits::{ADDRESS_BYTES_MAX, NODE_ID_MAX};

/// Longest name in the nameservice or temporary storage, in bytes of UTF-8.
pub const NAME_BYTES_MAX: usize = 256;
/// Most names the nameservice holds.
pub const NAMES_MAX: usize = 1 << 20;
/// Most barriers allocated at once.
pub const BARRIERS_MAX: usize = 4096;
/// Most participants of one barrier.
pub const BARRIER_SIZE_MAX: u32 = 65_535;
/// Largest blob in temporary storage.
pub const TMP_BLOB_BYTES_MAX: usize = 1 << 20;
/// Total bytes of temporary storage.
pub const TMP_TOTAL_BYTES_MAX: usize = 64 << 20;
/// Most backup peers of one zone.
pub const BACKUPS_PER_ZONE_MAX: usize = 16;
/// Most zones one peer may register.
pub const ZONES_PER_NODE_MAX: usize = 1 << 20;
