//! # myriad-raft: Raft replication of the superpeer group's metadata
//!
//! **Job.** Replicates [`myriad_meta::MetaState`] over the 1, 3 or 5 superpeers with Raft:
//! every committed [`myriad_meta::Command`] is applied in the same order on every member.
//! This crate owns the Raft log and snapshots on disk (one directory per superpeer), the
//! explicit binary encoding of every Raft message and record, and the boundary to the
//! messaging layer ([`RaftTransport`] out, [`MetaRaft::handle_rpc`] in). [`MetaRaft`] is the
//! handle the node crate uses: start, write, read (linearizable or local), leader, metrics,
//! shutdown.
//!
//! **Invariants.**
//! - No sockets and no knowledge of the messaging layer: peers are reached only through
//!   [`RaftTransport`], so tests run whole groups in one process and the node crate maps
//!   calls onto its connections.
//! - The state machine is deterministic ([`myriad_meta::MetaState::apply`]): members that
//!   applied the same log hold byte-equal snapshots.
//! - Nothing is acknowledged before it is durable: an appended entry is reported flushed
//!   only after an fsync covering it, a vote is fsynced before it is used, snapshots are
//!   written to a temporary file, fsynced and renamed. Torn log tails are cut on open, and a
//!   record with a bad CRC is never accepted (`docs/raft-format.md`).
//! - Every encoding is explicit (no serde): decoders are bounded by [`limits`] and never
//!   panic on hostile bytes (property tests and the `fuzz/` targets check this).
//! - Every queue is bounded ([`limits`]); every wait in [`MetaRaft`] has a deadline.
//!
//! **Callers.** The superpeer role of the node crate; its transport implementation calls
//! [`MetaRaft::handle_rpc`] for Raft requests arriving from other superpeers.
//!
//! ## Why openraft `=0.10.0-alpha.37`
//!
//! openraft 0.9.x draws its election timeout once per process, so after a leader dies two
//! surviving voters with close timeouts can split their votes again and again; 0.10 draws a
//! new timeout for every campaign (openraft PR #1838, `EngineConfig::resample_election_timeout`),
//! which the repeated leader-kill test relies on. The alternative, raft-rs 0.7, depends on
//! protobuf 2.x, which carries a security advisory. The version is pinned exactly because
//! alpha releases change APIs; it is used without its `serde` feature since every type is
//! encoded here ([`codec`]).
//!
//! ## Module order
//!
//! The modules form layers; each uses only modules of lower layers (no cycles), which the
//! test `tests/module_order.rs` checks over every `crate::` path in `src/`:
//!
//! 1. [`limits`], [`types`] and `files` (durable file writes): nothing of this crate;
//! 2. [`codec`]: limits, types;
//! 3. [`log_store`], [`state_machine`], [`network`]: codec and the first layer;
//! 4. [`meta_raft`]: everything below;
//! 5. [`group`]: runtime membership changes, on top of `meta_raft`.

pub mod codec;
mod files;
pub mod group;
pub mod limits;
pub mod log_store;
pub mod meta_raft;
pub mod network;
pub mod state_machine;
pub mod types;

pub use codec::{RpcReply, RpcRequest, SnapshotRequest};
pub use group::{GroupChangeError, GroupMembers};
pub use log_store::{LogOpenError, LogStore};
pub use meta_raft::{
    MetaRaft, RaftConfig, RaftReadError, RaftRole, RaftSummary, RaftWriteError, StartError,
};
pub use network::{RaftTransport, TransportError};
pub use state_machine::{
    ApplyObserver, MetaStateReader, SnapshotFileError, SnapshotOpenError, StateMachineStore,
};
pub use types::{SuperpeerNode, TypeConfig};
