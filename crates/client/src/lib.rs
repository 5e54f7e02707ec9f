//! Myriad's client library.
//!
//! # Job
//! Join a cluster through its superpeers ([`membership`]), then use the chunk API
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
//! (`myriad-node` builds on [`membership`] to join). It depends on the protocol, messaging,
//! metadata and memory crates, never on the node crate.

pub mod chunk;
pub mod client;
pub mod directory;
pub mod error;
pub mod lease;
pub mod membership;

pub use error::ClientError;
