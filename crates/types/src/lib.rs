//! # myriad-types: IDs, the byte codec and shared limits
//!
//! **Job.** The few definitions every layer of Myriad shares, so that each exists once:
//! - [`ids`]: [`NodeId`] (a node's 16-bit ID) and [`ChunkId`] (a chunk's 64-bit ID: the
//!   creator's node ID above a 48-bit local ID), with their text forms.
//! - [`codec`]: the one byte codec of every wire and disk format: [`Encoder`], [`Decoder`]
//!   and [`DecodeError`] (LEB128 varints, fixed-width little-endian integers,
//!   length-prefixed byte strings; documented in `docs/wire-format.md`, "Payload encoders").
//! - [`digest`]: [`digest::EncodingDigest`], the fingerprint of many encodings that the
//!   format-identity tests compare with a recorded one.
//! - [`limits`]: the bounds more than one layer enforces (node ID ranges, address length).
//!   Limits that belong to one layer stay in that layer.
//!
//! **Invariants.**
//! - Every value has exactly one encoding: varints are minimal, so re-encoding a decoded
//!   value gives back the same bytes, and the bytes stay what the earlier per-layer codecs
//!   wrote (golden tests pin them).
//! - Decoding never panics and never allocates more than the input's length justifies:
//!   every length and count is checked against its limit and the bytes left first.
//! - Slices of a payload held in [`bytes::Bytes`] are shared, not copied
//!   ([`Decoder::get_bytes`]).
//!
//! **Who calls it.** Everyone: the memory manager, the messaging layer, metadata, Raft,
//! protocol, replication, placement, client, node, benchmarks and the command line. It
//! depends on nothing in the workspace (only `bytes` and `thiserror`), so it can sit
//! beneath every other crate.

#![forbid(unsafe_code)]

pub mod codec;
pub mod digest;
pub mod ids;
pub mod limits;

pub use codec::{DecodeError, Decoder, Encoder};
pub use ids::{ChunkId, NodeId, ParseChunkIdError, LOCAL_ID_BITS, LOCAL_ID_MAX};
