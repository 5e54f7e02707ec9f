//! Limits that more than one layer enforces, in one place. A layer's own limits (batch
//! sizes, queue depths, per-message bounds) stay in that layer.

/// The highest node ID the superpeer group assigns. IDs above it
/// ([`PROVISIONAL_ID_MIN`]`..=0xffff`) are provisional identities that joining nodes use
/// for the join request itself, before they have an ID.
pub const NODE_ID_MAX: u16 = 0xfeff;

/// The lowest provisional node ID: a joining node names itself with an ID in
/// `PROVISIONAL_ID_MIN..=0xffff` until the superpeer group assigns it one.
pub const PROVISIONAL_ID_MIN: u16 = 0xff00;

/// Longest node address (text form, `host:port`), in metadata and on the wire.
pub const ADDRESS_BYTES_MAX: usize = 256;

const _: () = assert!(NODE_ID_MAX < PROVISIONAL_ID_MIN);
