//! The peer: a memory manager serving chunks, and the process around it.
//!
//! # Job
//! - [`service`]: [`ChunkService`], the chunk requests of [`myriad_proto::chunk`] against
//!   the peer's memory manager (ownership view, locks, lease, replication order).
//! - [`dispatch`]: [`PeerDispatch`], the one place that registers a peer's request
//!   handlers (CHUNK inline with its slow path, MIGRATE, RECOVER, NODE_SHUTDOWN, the
//!   backup service's), used by [`PeerNode::start`] and by tests alike.
//! - [`node`]: [`PeerNode`], the peer process: data directory, join, memory manager,
//!   replication, the cluster's events, shutdown.
//! - Private parts: the slow path's threads (`slow_path`), migration (`migrate`), the
//!   ownership view's upkeep (`ownership`), an incarnation's bases and local-ID
//!   reservations (`incarnation`), the self-check for a failure verdict (`self_watch`),
//!   prefaulting and replica events (`background`).
//!
//! # Invariants
//! See [`service`] (what a request may see and change) and [`node`] (restarts, fencing);
//! each file's header names what is particular to it.
//!
//! # Who calls it
//! `myriad peer` (through [`PeerNode`], also at its old path `myriad_node::peer_node`),
//! in-process applications ([`PeerNode::client`]) and tests.

mod background;
pub mod dispatch;
mod incarnation;
mod migrate;
pub mod node;
mod ownership;
mod self_watch;
pub mod service;
mod slow_path;

pub use dispatch::PeerDispatch;
pub use incarnation::{LID_RESERVE_CHECK, LID_RESERVE_STEP};
pub use migrate::{lock_and_copy, MIGRATE_CHUNKS_MAX};
pub use node::{
    ComputeSetup, PeerError, PeerNode, PeerOptions, DECLARED_FAILED_LINGER, NODE_ID_FILE,
};
pub use ownership::NOBODY;
pub use self_watch::SELF_CHECK_INTERVAL;
pub use service::{
    ChunkService, MigrationGuard, BLOCKING_REQUESTS_MAX, LOCK_TIMEOUT_MS_MAX, ORDER_STRIPES,
};
pub use slow_path::SLOW_PATH_QUEUE_MAX;
