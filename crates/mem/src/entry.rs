//! The 64-bit level-0 entry of the CID table: where a chunk lives, how long it is, and its
//! lock, all in one word that is changed only by compare-and-swap.
//!
//! ```text
//!  63   61 60      54  53   52   51  50        40 39                              0
//! +-------+----------+----+----+----+------------+---------------------------------+
//! | state | readers  | W  | P  | L  | length - 1 | address / 4                     |
//! | 3 bit | 7 bit    |    |    |    | 11 bit     | 40 bit                          |
//! +-------+----------+----+----+----+------------+---------------------------------+
//! ```
//!
//! - `state`: 0 free (the whole entry is 0: the LID was never used), 1 live, 2 reserved
//!   (handed out by `reserve`, no memory yet), 3 removed (the LID was used and its chunk
//!   removed). Only live entries use the other fields.
//! - `readers`: number of read-lock holders (at most 127); `W`: write lock; `P`: pinned.
//! - `L`: large chunk. Then the exact length is an 8-byte little-endian header in front of the
//!   payload and the length field is 0. Otherwise the field holds `length - 1`, so chunks of
//!   1..=2048 bytes keep their length in the entry and cost nothing in the data region.
//! - `address`: offset of the allocation in the data region in 4-byte units (every
//!   allocation is 4-byte aligned: the allocator's classes up to 128 bytes are 4 bytes
//!   apart), so 40 bits span 4 TiB.
//!
//! Invariants: a writer owns the entry exclusively while `W` is set and the reader count is
//! 0 (readers and pinners only add themselves with `W` clear); only the write-lock holder
//! changes `address`, `L`, the length or the state of a live entry.

/// Bits of the address field.
pub(crate) const ADDRESS_BITS: u32 = 40;
const ADDRESS_MASK: u64 = (1 << ADDRESS_BITS) - 1;
/// Bytes per unit of the address field.
const ADDRESS_UNIT_SHIFT: u32 = 2;
/// The largest data region the entry can address: 2^40 units of 4 bytes.
pub(crate) const REGION_BYTES_MAX: u64 = (1 << ADDRESS_BITS) << ADDRESS_UNIT_SHIFT;
const LENGTH_SHIFT: u32 = 40;
const LENGTH_MASK: u64 = 0x7FF << LENGTH_SHIFT;
/// The largest length held in the entry itself.
pub(crate) const EMBEDDED_LENGTH_MAX: usize = 2048;
const LARGE_BIT: u64 = 1 << 51;
pub(crate) const PINNED_BIT: u64 = 1 << 52;
pub(crate) const WRITE_BIT: u64 = 1 << 53;
const READER_SHIFT: u32 = 54;
pub(crate) const READER_ONE: u64 = 1 << READER_SHIFT;
const READER_MASK: u64 = 0x7F << READER_SHIFT;
/// The most concurrent read-lock holders of one chunk.
pub(crate) const READERS_MAX: u64 = 0x7F;
const STATE_SHIFT: u32 = 61;

/// The lifecycle state of a CID as seen by its table entry.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Never used (entry is 0).
    Free,
    /// Holds a chunk.
    Live,
    /// Reserved, no memory yet.
    Reserved,
    /// Its chunk was removed.
    Removed,
}

/// Entry value of a reserved CID.
pub(crate) const RESERVED: u64 = 2 << STATE_SHIFT;
/// Entry value of a removed CID.
pub(crate) const REMOVED: u64 = 3 << STATE_SHIFT;
const LIVE: u64 = 1 << STATE_SHIFT;

/// Decodes the state of an entry value.
#[inline]
pub(crate) fn state(value: u64) -> State {
    match value >> STATE_SHIFT {
        0 => State::Free,
        1 => State::Live,
        2 => State::Reserved,
        _ => State::Removed,
    }
}

/// A live, unlocked, unpinned entry for an allocation at byte `offset` holding `length`
/// bytes. `offset` must be 4-byte aligned and below [`REGION_BYTES_MAX`].
#[inline]
pub(crate) fn live(offset: u64, length: usize) -> u64 {
    debug_assert!(offset.is_multiple_of(1 << ADDRESS_UNIT_SHIFT) && offset < REGION_BYTES_MAX);
    debug_assert!(length > 0);
    let address = offset >> ADDRESS_UNIT_SHIFT;
    if length <= EMBEDDED_LENGTH_MAX {
        LIVE | (((length as u64) - 1) << LENGTH_SHIFT) | address
    } else {
        LIVE | LARGE_BIT | address
    }
}

/// Byte offset of the allocation of a live entry.
#[inline]
pub(crate) fn offset(value: u64) -> u64 {
    (value & ADDRESS_MASK) << ADDRESS_UNIT_SHIFT
}

/// Whether a live entry's length lives in a header in the data region.
#[inline]
pub(crate) fn is_large(value: u64) -> bool {
    value & LARGE_BIT != 0
}

/// The embedded length of a live, non-large entry.
#[inline]
pub(crate) fn embedded_length(value: u64) -> usize {
    (((value & LENGTH_MASK) >> LENGTH_SHIFT) + 1) as usize
}

/// Number of read-lock holders.
#[inline]
pub(crate) fn readers(value: u64) -> u64 {
    (value & READER_MASK) >> READER_SHIFT
}

/// Whether the write lock is held.
#[inline]
pub(crate) fn write_locked(value: u64) -> bool {
    value & WRITE_BIT != 0
}

/// Whether the chunk is pinned.
#[inline]
pub(crate) fn pinned(value: u64) -> bool {
    value & PINNED_BIT != 0
}

/// Whether a chunk of `length` bytes carries a length header in the data region.
#[inline]
pub(crate) fn needs_header(length: usize) -> bool {
    length > EMBEDDED_LENGTH_MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_entries_round_trip_offsets_and_lengths() {
        for &(offset, length) in &[
            (0u64, 1usize),
            (8, 2048),
            (68, 67),
            (REGION_BYTES_MAX - 8, 2049),
            (REGION_BYTES_MAX - 4, 3),
            (1 << 33, 64 << 20),
        ] {
            let value = live(offset, length);
            assert_eq!(state(value), State::Live);
            assert_eq!(self::offset(value), offset);
            assert_eq!(is_large(value), length > EMBEDDED_LENGTH_MAX);
            if !is_large(value) {
                assert_eq!(embedded_length(value), length);
            }
            assert_eq!(readers(value), 0);
            assert!(!write_locked(value) && !pinned(value));
            let locked = value + READER_ONE * READERS_MAX;
            assert_eq!(readers(locked), READERS_MAX);
            assert_eq!(self::offset(locked), offset);
            assert_eq!(state(locked | WRITE_BIT | PINNED_BIT), State::Live);
        }
    }

    #[test]
    fn states_are_distinct() {
        assert_eq!(state(0), State::Free);
        assert_eq!(state(RESERVED), State::Reserved);
        assert_eq!(state(REMOVED), State::Removed);
        assert_ne!(RESERVED, REMOVED);
    }
}
