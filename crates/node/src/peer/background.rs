//! A peer's background work besides requests: keeping chunk memory resident ahead of
//! use, and following the replicator (its events, and its part of cluster events).
//!
//! # Job
//! [`keep_memory_resident`] prefaults chunk memory above the allocator's top;
//! [`replicate_event`] replaces gone backups and fills under-replicated zones on cluster
//! events; [`follow_replica_events`] logs the replicator's events and reports unreachable
//! backups to the superpeers.
//!
//! # Invariants
//! - The replicator's calls run on blocking threads, never on the event task (they take
//!   its state lock and may wait for registrations).
//! - Each thread ends on its own: with the memory manager, or once its stop flag is set.
//!
//! # Who calls it
//! [`super::node::PeerNode::start`] and its event follower.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use myriad_mem::MemoryManager;
use myriad_membership::Membership;
use myriad_proto::meta::Event;
use myriad_replication::{ReplicaEvent, Replicator};

use super::node::PeerError;
use super::service::ChunkService;

/// Slept after every 2 MiB made resident ahead (see [`MemoryManager::prefault`]): at
/// most about 1 GiB/s, and the CPU shared with heartbeats and requests.
const PREFAULT_PAUSE: Duration = Duration::from_millis(2);
/// Most bytes made resident per look at the reserve (at most 320 MB/s with the pauses).
const RESERVE_STEP_BYTES: u64 = 32 << 20;
/// How often the reserve of resident memory is looked at.
const RESERVE_POLL: Duration = Duration::from_millis(100);
/// A top that moved more than this since the last look is a burst of creates (a
/// recovery, a bulk load) under way: the reserve is topped up after it, not during it,
/// so that the burst has the CPU.
const RESERVE_BURST_BYTES: u64 = 16 << 20;

/// Starts the thread that keeps `reserve` bytes of chunk memory above the allocator's
/// top resident (`peer.prefault_mb`, [`MemoryManager::keep_resident_ahead`]): chunks a
/// recovery restores here then land in pages zeroed beforehand. It ends with the memory
/// manager (it holds it only while topping up).
pub(crate) fn keep_memory_resident(mem: std::sync::Weak<MemoryManager>, reserve: u64) {
    let spawned = std::thread::Builder::new()
        .name("prefault".into())
        .spawn(move || {
            let mut last_top = None;
            let mut reported = false;
            loop {
                let Some(mem) = mem.upgrade() else {
                    return;
                };
                let top = mem.top_bytes();
                let burst = last_top.is_some_and(|last| top > last + RESERVE_BURST_BYTES);
                last_top = Some(top);
                if !burst {
                    let started = Instant::now();
                    // Paced: a peer that prefaults must still answer its heartbeats.
                    match mem.keep_resident_ahead(reserve, RESERVE_STEP_BYTES, PREFAULT_PAUSE) {
                        Ok(done) if done > 0 && !reported => {
                            reported = true;
                            tracing::info!(
                                reserve,
                                resident = done,
                                ms = started.elapsed().as_millis() as u64,
                                "chunk memory made resident ahead of use"
                            );
                        }
                        Ok(_) => {}
                        Err(error) => {
                            tracing::warn!(%error, "could not make chunk memory resident");
                            return;
                        }
                    }
                }
                drop(mem);
                std::thread::sleep(RESERVE_POLL);
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "could not start the prefault thread");
    }
}

/// Replication's part of a cluster event: a failed or departed node is replaced in every
/// zone it backs, a joined peer fills under-replicated zones. Runs the replicator's calls
/// on a blocking thread (they take its state lock and may wait for registrations).
pub(crate) fn replicate_event(
    service: &Arc<ChunkService>,
    runtime: &tokio::runtime::Handle,
    event: &Event,
) {
    let Some(replicator) = service.replicator() else {
        return;
    };
    let replicator = Arc::clone(replicator);
    match event {
        Event::NodeFailed(node) | Event::NodeLeft(node) => {
            let node = *node;
            runtime.spawn_blocking(move || {
                let changed = replicator.replace_backup(node);
                if !changed.is_empty() {
                    tracing::info!(%node, zones = changed.len(), ?changed, "replaced a gone backup");
                }
            });
        }
        Event::NodeJoined(record) => {
            // A new incarnation of a backup lost its streams' state (a restart): streams
            // to it cannot go on, so it is replaced like a failed backup first, and may be
            // chosen again with a fresh stream.
            let restarted = (record.incarnation > 1 && record.role == myriad_meta::Role::Peer)
                .then_some(record.id);
            runtime.spawn_blocking(move || {
                if let Some(node) = restarted {
                    let changed = replicator.replace_backup(node);
                    if !changed.is_empty() {
                        tracing::info!(%node, zones = changed.len(), "replaced a restarted backup");
                    }
                }
                let changed = replicator.fill_zones();
                if !changed.is_empty() {
                    tracing::info!(zones = changed.len(), ?changed, "gave zones more backups");
                }
            });
        }
        Event::OwnerChanged { .. } => {}
    }
}

/// Starts the thread that logs the replicator's events, reports unreachable backups
/// to the superpeers and replaces backups that refuse the stream. It ends once `stop` is
/// set.
pub(crate) fn follow_replica_events(
    replicator: &Arc<Replicator>,
    membership: &Arc<Membership>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, PeerError> {
    let receiver = replicator.events();
    // Weak: this thread must not keep the replicator (and its threads) alive.
    let weak = Arc::downgrade(replicator);
    let membership = Arc::clone(membership);
    let runtime = membership.net().runtime();
    std::thread::Builder::new()
        .name(format!("replica-events-{}", membership.node_id().0))
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(event) = receiver.recv_timeout(Duration::from_millis(100)) else {
                    continue;
                };
                match &event {
                    ReplicaEvent::BackupUnreachable(node) => {
                        tracing::warn!(%node, "backup unreachable; reporting it");
                        let membership = Arc::clone(&membership);
                        let node = *node;
                        runtime.block_on(async move { membership.report_failure(node).await });
                    }
                    ReplicaEvent::BackupRefused { backup, reason } => {
                        // A backup that refuses the stream (its log engine failed, its disk
                        // is full) holds none of the zone's later changes: it is replaced
                        // in every zone it backs, as a failed one is.
                        tracing::warn!(%backup, %reason, "backup refuses replication; replacing it");
                        if let Some(replicator) = weak.upgrade() {
                            let changed = replicator.replace_backup(*backup);
                            if !changed.is_empty() {
                                tracing::info!(%backup, zones = changed.len(), "replaced a refusing backup");
                            }
                        }
                    }
                    ReplicaEvent::ResyncDone {
                        zone,
                        backup,
                        chunks,
                    } => tracing::info!(zone, %backup, chunks, "zone re-replicated"),
                    ReplicaEvent::ResyncFailed {
                        zone,
                        backup,
                        reason,
                    } => tracing::warn!(zone, %backup, %reason, "re-replication failed"),
                }
            }
        })
        .map_err(PeerError::Thread)
}
