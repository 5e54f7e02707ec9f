//! Myriad's node processes.
//!
//! # Job
//! - [`superpeer`]: one member of the superpeer group: hosts a `myriad-raft` member over the
//!   messaging layer, serves metadata requests and joins, watches peers with heartbeats,
//!   commits failure verdicts and pushes events to every node.
//! - [`peer`]: stores chunks in a `myriad-mem` memory manager and serves them to remote
//!   clients (the chunk service of [`myriad_proto::chunk`]); the peer process
//!   ([`peer::PeerNode`], also reachable as `peer_node`) and its one request dispatch.
//! - [`replication`]: the peer's side of replication (`myriad-replication` wired to the
//!   cluster: zone registry, backup candidates, chunk source, the backup log engine).
//! - [`recovery`]: the restorer's side of recovering a failed peer (a backup zone into
//!   this peer's memory, the CIDs taken over).
//! - [`config`]: the settings of both, from TOML with command-line overrides.
//!
//! # Invariants
//! - A node never trusts a message: every payload is decoded by `myriad-proto` and a bad
//!   one is answered with an error or dropped, never a panic.
//! - A superpeer changes cluster metadata only through Raft.
//!
//! # Who calls it
//! The `myriad` binary (`myriad superpeer`, `myriad peer`, `myriad cluster`) and tests.

pub mod config;
pub mod log_gc;
pub mod ops;
pub mod peer;
/// The peer process's items at their old path (the same as [`peer`]'s).
pub use peer as peer_node;
pub mod recovery;
pub mod replication;
pub mod superpeer;
