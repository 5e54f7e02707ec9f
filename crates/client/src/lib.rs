//! Myriad's client library.
//!
//! # Job
//! Join a cluster through its superpeers ([`membership`], re-exported from
//! `myriad-membership`), then use the chunk API
//! ([`chunk`]: create, get, put, remove, batches, offset access, resize, locks) and the
//! metadata services (nameservice, barriers, temporary storage) with blocking or async
//! calls. Chunk requests go straight to the chunk's owner: the creator first, then the
//! cached lookup range, refreshed when a peer answers "not owner".
//!
//! # Invariants
//! - Every call ends: with its result or a typed [`ClientError`] after at most its timeout.
//! - Nothing a server sends can panic the client; malformed replies become
//!   [`ClientError::Protocol`].
//!
//! # Who calls it
//! Applications, the `myriad` tools (terminal, demo, benchmarks) and peers themselves
//! (`myriad-node` serves [`chunk::LocalChunks`] and hands out [`client::Client`]s). It
//! depends on the membership, protocol, messaging, metadata and memory crates, never on
//! the node crate. Membership's errors become [`ClientError`]s (`From`).

pub mod chunk;
pub mod client;
pub mod directory;
pub mod error;

/// The node's lease with the superpeers (`myriad_membership::lease`, re-exported).
pub use myriad_membership::lease;
/// Joining and the node table (`myriad_membership::membership`, re-exported).
pub use myriad_membership::membership;

pub use error::ClientError;
