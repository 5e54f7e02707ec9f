//! The cluster protocol: every message superpeers, peers and clients exchange, with an
//! explicit, bounds-checked binary encoding per message.
//!
//! # Job
//! This crate names the message types on the wire ([`types`]) and turns the messages of each
//! family into bytes and back:
//! - [`chunk`]: chunk access served by peers (create, get, put, remove, their batch forms,
//!   offset reads and writes, resize, locks, status and listing, migration).
//! - [`meta`]: metadata requests served by the superpeer group (Raft writes, lookups,
//!   nameservice, barriers, temporary storage, node lists), joining, heartbeats, failure
//!   reports and the events the group pushes to every node.
//! - [`recovery`]: recovery of a failed peer's backup zones (recover requests to backups,
//!   the leader's recovery table).
//! - [`monitor`]: the summaries peers push to the superpeers (DXMonitor), and queries
//!   for them.
//! - [`logctl`]: changing a node's log filter at run time, a backup peer's log engine
//!   state.
//!
//! # Invariants
//! - Decoding never panics and never allocates more than the input's length justifies: every
//!   count and length is checked against the bytes left and against the limits in
//!   [`limits`]; a bad message yields [`ProtoError`].
//! - Every message starts with no version byte: the messaging layer's handshake already
//!   fixes the protocol version of a connection.
//!
//! # Who calls it
//! `myriad-client` (the requesting side) and `myriad-node` (superpeers and peers, the
//! serving side). It takes node and chunk IDs and its byte codec from `myriad-types`, the
//! message types from the messaging layer, and depends on nothing above it.

pub mod chunk;
#[cfg(test)]
mod digest;
pub mod limits;
pub mod logctl;
pub mod meta;
pub mod migrate;
pub mod monitor;
pub mod recovery;
pub mod types;

use thiserror::Error;

use myriad_types::codec::{DecodeError, Decoder};

pub use myriad_types::{ChunkId, NodeId};

/// Why bytes could not be decoded into a message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtoError {
    /// The byte codec refused the input (truncated, bad varint, bad UTF-8, trailing bytes).
    #[error("malformed message: {0}")]
    Codec(#[from] DecodeError),
    /// A metadata command or response embedded in the message did not decode.
    #[error("malformed metadata payload: {0}")]
    Meta(DecodeError),
    /// A tag byte names no variant.
    #[error("unknown {what} tag {tag}")]
    UnknownTag {
        /// Which enumeration.
        what: &'static str,
        /// The tag found.
        tag: u8,
    },
    /// A count or length exceeds its limit.
    #[error("{what} is {value}, more than the limit {max}")]
    TooLarge {
        /// Which field.
        what: &'static str,
        /// The value found.
        value: u64,
        /// The limit.
        max: u64,
    },
    /// A field holds a value outside its domain.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// Which field.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
}

/// Reads a count (varint) and checks it against `max` and against the bytes left, given
/// that each element takes at least `element_bytes_min` bytes, so the caller may allocate
/// `count` slots without trusting the sender ([`Decoder::get_count`], with a count above
/// `max` reported as [`ProtoError::TooLarge`]).
pub(crate) fn get_count(
    input: &mut Decoder,
    what: &'static str,
    max: usize,
    element_bytes_min: usize,
) -> Result<usize, ProtoError> {
    input
        .get_count(what, element_bytes_min, max)
        .map_err(|error| match error {
            DecodeError::TooLarge { what, value, max } => ProtoError::TooLarge { what, value, max },
            other => ProtoError::Codec(other),
        })
}
