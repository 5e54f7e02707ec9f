//! # myriad-replication: replication of a peer's chunks to its backups
//!
//! **Job.** Every chunk lives in RAM on its owner (the *master*) and in the logs of R
//! backup peers (Beineke §2). This crate carries the master's changes to those logs over
//! the messaging layer:
//!
//! - [`Replicator`] (master side): groups the master's chunks into backup zones
//!   ([`myriad_placement::ZoneTree`]), places every new zone on R backups
//!   ([`myriad_placement::Placement`]), registers it ([`ZoneRegistry`]) and sends every
//!   create, put, resize and remove to the zone's backups in backup order, batched into
//!   ordered messages, one sequenced stream per backup. A change returns at the requested
//!   [`Durability`]. It resends what a lost connection dropped, reports backups that stay
//!   unreachable ([`ReplicaEvent`]) and re-replicates zones to replacements
//!   ([`Replicator::replace_backup`]) from the master's memory ([`ChunkSource`]). A zone
//!   of a failed peer that this master restored is adopted under its log identity
//!   ([`Replicator::adopt_zone`], [`Replicator::copy_adopted`]).
//! - [`BackupService`] (backup side): applies the streams of all masters to a
//!   [`myriad_backup_log::LogEngine`] in stream order, drops duplicates, and acknowledges each
//!   stream twice: once applied (in the log engine's write buffer) and once on disk.
//! - [`wire`]: the two message types (30.0, 30.1) and their encodings.
//! - [`bench`](mod@bench): put throughput and latency for R = 0..=3 in every durability mode.
//!
//! **Invariants.**
//! - A zone is registered (its [`ZoneRegistry::register`] future resolved `Ok`) before any
//!   write to it returns `Ok`, whatever the durability.
//! - Every backup of a zone receives the zone's changes in the order the master made them
//!   (one stream per backup, sequence numbers, resend from the first unacknowledged
//!   operation, duplicates dropped by the backup); an operation is applied at most once
//!   per stream and never out of order.
//! - `Replicated` returns only once every backup of the zone acknowledged the change in
//!   its log engine; `Durable` only once every backup reported it on disk
//!   ([`myriad_backup_log::LogEngine::wait_durable`] / `durable_seq`). Every wait is bounded by a
//!   timeout and ends in a typed error ([`ReplicaError`]).
//! - Every queue is bounded: per backup stream, operations not yet acknowledged take at
//!   most [`ReplicatorConfig::stream_bytes_max`]; a writer waits (bounded) for room.
//! - A backup never applies a message of a fenced node (the messaging layer drops it).
//!
//! **Callers.** The peer role of the node crate builds one [`Replicator`] (calling `on_*`
//! after each change of its memory manager) and one [`BackupService`] (registered on its
//! endpoint's handlers). The cluster simulator of the testing crate builds driven ones
//! ([`Replicator::driven`] over its own [`MasterIo`]) and steps them on one thread. This crate knows nothing of the node crate, superpeers or Raft:
//! the cluster reaches it only through [`ZoneRegistry`], [`BackupCandidates`] and
//! [`ChunkSource`], implemented by the node.

pub mod backup;
pub mod bench;
mod master;
pub mod wire;

pub use backup::{BackupConfig, BackupError, BackupService};
pub use master::{
    AckCallback, Adoption, AdoptionPlan, AsyncChange, BackupCandidates, ChunkSource, CopyStep,
    IoTask, ManualIo, MasterIo, NetIo, RegisterFuture, RegistryError, ReplicaEvent, Replicator,
    ReplicatorConfig, ReplicatorStats, Restored, StreamStats, ZoneRegistry, ZoneReplacement,
    ZoneStats,
};
pub use myriad_placement::{Candidate, Strategy};
pub use myriad_types::{ChunkId, NodeId};

use std::time::Duration;

/// When a change of a chunk counts as done for its caller. "Every backup" means the
/// zone's backups at the time of the call: fewer than R while too few peers were known
/// when the zone was placed (see [`Replicator::fill_zones`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Once the change is queued for sending to the backups (DXRAM's behaviour).
    Async,
    /// Once every backup of the zone holds it in its log engine's write buffer.
    Replicated,
    /// Once every backup of the zone has it on disk.
    Durable,
}

/// Why a replication call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaError {
    /// The wait for the requested durability (or for room in a stream, or for the zone's
    /// registration) ran out. The change may still reach the backups.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: Duration,
        /// Backups that had not acknowledged (empty when not waiting for backups).
        missing: Vec<NodeId>,
    },
    /// The zone's registration with the cluster failed; the next write retries it.
    #[error("registering zone {zone} failed: {reason}")]
    Registration {
        /// The zone.
        zone: u32,
        /// The registry's reason.
        reason: String,
    },
    /// The zone has no backup (no candidates), so `Replicated`/`Durable` cannot be met.
    #[error("zone {zone} has no backups")]
    NoBackups {
        /// The zone.
        zone: u32,
    },
    /// A backup the call waited for was replaced before it acknowledged; the new backup
    /// receives the zone by re-replication.
    #[error("backup {0} was replaced while the write waited for it")]
    BackupReplaced(NodeId),
    /// Copying a zone to a new backup did not finish (see [`Replicator::copy_adopted`]).
    #[error("re-replication failed: {0}")]
    Resync(String),
    /// A no-wait report ([`Replicator::on_changes_nowait`]) would have had to wait (a
    /// chunk without a registered zone); nothing was reported.
    #[error("the change would have to wait for its zone or its backups")]
    WouldWait,
    /// The replicator is shutting down.
    #[error("the replicator is shut down")]
    Shutdown,
    /// A configuration value out of range.
    #[error("invalid replicator configuration: {0}")]
    InvalidConfig(&'static str),
    /// The messaging layer refused (e.g. registering the acknowledgement handler).
    #[error("messaging: {0}")]
    Net(String),
}
