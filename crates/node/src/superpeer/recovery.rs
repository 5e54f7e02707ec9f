//! Recovery coordination on the superpeer leader (issue 6).
//!
//! # Job
//! After the leader commits `Fail { node }` for a peer, [`start`] sends one
//! [`RecoverRequest`] per zone of that peer in the zone table to the zone's first backup,
//! all zones at once. A backup that is not alive, does not answer within
//! [`RECOVER_TIMEOUT`] or answers `Failed` is skipped and the next backup in the zone's
//! order is asked; so is a backup whose own failure is committed while it restores the
//! zone (every `Fail` commit wakes the zones in progress, which stop waiting for a backup
//! that is no longer alive). Every zone's progress (state, restorer, chunks, milliseconds since the
//! failure) is kept in memory ([`Recoveries`]), logged, and served to
//! [`myriad_proto::types::RECOVERY_STATUS`] requests.
//!
//! Once every zone of the failed peer is restored, the CIDs that still route to it (its
//! own CIDs outside the recovered ranges: removed chunks and IDs never handed out, and
//! ranges of other creators it had taken over) are given to a restorer (the owner of the
//! neighbouring range), so that accesses to them end with `NotFound` instead of waiting.
//!
//! # Invariants
//! - Only the leader coordinates; a zone is sent to one backup at a time.
//! - The restorers commit the ownership of the CIDs they restored themselves; the leftover
//!   step only touches ranges that still point to the failed node after all restorers
//!   committed, so it never takes a restored CID away from its restorer.
//!
//! # Known gaps
//! A leader change during a recovery does not resume it. A restorer that dies after it
//! committed some of the zone's ranges leaves them routed to it until the next backup
//! commits the whole zone's ranges for itself (clients wait meanwhile).
//!
//! # Who calls it
//! [`super::Core::after_commit`] (on `Fail`) and the superpeer's handlers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use myriad_mem::NodeId;
use myriad_mem::LOCAL_ID_MAX;
use myriad_meta::{Command, NodeState, Role};
use myriad_proto::meta::MetaReply;
use myriad_proto::recovery::{
    RecoverReply, RecoverRequest, RecoveryState, RecoveryStatusReply, ZoneRecovery,
};
use myriad_proto::{net_id, types};
use parking_lot::Mutex;

use super::Core;

/// How long one backup may take to restore one zone before the next backup is asked.
pub const RECOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Leftover ownership commits in flight at once.
const LEFTOVER_COMMITS_IN_FLIGHT: usize = 64;
/// Most zone lines kept in the table (oldest dropped first).
const TABLE_MAX: usize = 65_536;

/// One zone's recovery as the leader tracks it.
#[derive(Debug, Clone)]
struct Entry {
    owner: NodeId,
    zone: u32,
    state: RecoveryState,
    restorer: Option<NodeId>,
    chunks: u64,
    started: Instant,
    finished: Option<Duration>,
    detail: String,
}

/// The leader's table of zone recoveries (in memory; lost with the leader).
#[derive(Debug)]
pub(crate) struct Recoveries {
    table: Mutex<Vec<Entry>>,
    /// Counts committed failures: zones in progress watch it for their restorer's.
    failures: tokio::sync::watch::Sender<u64>,
}

impl Default for Recoveries {
    fn default() -> Self {
        Recoveries {
            table: Mutex::new(Vec::new()),
            failures: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Recoveries {
    /// The table as a status reply.
    pub(crate) fn status(&self, leader: bool) -> RecoveryStatusReply {
        let table = self.table.lock();
        RecoveryStatusReply {
            leader,
            zones: table
                .iter()
                .map(|entry| ZoneRecovery {
                    owner: entry.owner,
                    zone: entry.zone,
                    state: entry.state,
                    restorer: entry.restorer,
                    chunks: entry.chunks,
                    ms: entry
                        .finished
                        .unwrap_or_else(|| entry.started.elapsed())
                        .as_millis() as u64,
                    detail: entry.detail.clone(),
                })
                .collect(),
        }
    }

    fn begin(&self, owner: NodeId, zones: &[u32], started: Instant) {
        let mut table = self.table.lock();
        table.retain(|entry| entry.owner != owner || !zones.contains(&entry.zone));
        for &zone in zones {
            table.push(Entry {
                owner,
                zone,
                state: RecoveryState::Pending,
                restorer: None,
                chunks: 0,
                started,
                finished: None,
                detail: String::new(),
            });
        }
        let excess = table.len().saturating_sub(TABLE_MAX);
        table.drain(..excess);
    }

    fn update(&self, owner: NodeId, zone: u32, change: impl FnOnce(&mut Entry)) {
        let mut table = self.table.lock();
        if let Some(entry) = table
            .iter_mut()
            .rev()
            .find(|entry| entry.owner == owner && entry.zone == zone)
        {
            change(entry);
        }
    }
}

/// Starts recovering every zone of `failed` (called on the leader right after its `Fail`
/// committed). Returns at once; the work runs on the superpeer's runtime.
pub(crate) fn start(core: Arc<Core>, failed: NodeId) {
    core.recoveries
        .failures
        .send_modify(|count| *count = count.wrapping_add(1));
    let Some(raft) = core.raft() else {
        return;
    };
    let zones: Vec<(u32, Vec<NodeId>)> = raft.read_local(|state| {
        state
            .zones_of(failed)
            .map(|(zone, backups)| (zone, backups.to_vec()))
            .collect()
    });
    if zones.is_empty() {
        tracing::info!(%failed, "failed node has no backup zones; nothing to recover");
        return;
    }
    let started = Instant::now();
    let numbers: Vec<u32> = zones.iter().map(|(zone, _)| *zone).collect();
    core.recoveries.begin(failed, &numbers, started);
    tracing::warn!(%failed, zones = zones.len(), "recovery started");
    let runtime = core.net.runtime();
    runtime.spawn(async move {
        let tasks = zones.into_iter().map(|(zone, backups)| {
            let core = Arc::clone(&core);
            tokio::spawn(async move { recover_zone(&core, failed, zone, backups, started).await })
        });
        let outcomes = futures_util::future::join_all(tasks).await;
        let restorers: Vec<NodeId> = outcomes
            .iter()
            .filter_map(|outcome| outcome.as_ref().ok().copied().flatten())
            .collect();
        let all_done = restorers.len() == outcomes.len();
        tracing::warn!(
            %failed,
            zones = outcomes.len(),
            restored = restorers.len(),
            ms = started.elapsed().as_millis() as u64,
            "recovery of the zones finished"
        );
        if all_done {
            if let Some(&fallback) = restorers.first() {
                hand_over_leftovers(&core, failed, fallback).await;
            }
            tracing::info!(%failed, ms = started.elapsed().as_millis() as u64, "recovery complete");
        }
    });
}

/// Whether `node` is an alive peer in the applied node table.
fn alive_peer(core: &Core, node: NodeId) -> bool {
    core.raft().is_some_and(|raft| {
        raft.read_local(|state| {
            state
                .node(node)
                .is_some_and(|record| record.state == NodeState::Alive && record.role == Role::Peer)
        })
    })
}

/// Asks the zone's backups in order until one restores it; the restorer, if any.
async fn recover_zone(
    core: &Arc<Core>,
    failed: NodeId,
    zone: u32,
    backups: Vec<NodeId>,
    started: Instant,
) -> Option<NodeId> {
    let request = RecoverRequest {
        owner: failed,
        zone,
    }
    .encode();
    let mut reasons: Vec<String> = Vec::new();
    for backup in backups {
        if backup == failed || !alive_peer(core, backup) {
            reasons.push(format!("{backup}: not alive"));
            continue;
        }
        core.recoveries.update(failed, zone, |entry| {
            entry.state = RecoveryState::Running;
            entry.restorer = Some(backup);
        });
        core.sync_address(backup);
        let mut failures = core.recoveries.failures.subscribe();
        let backup_failed = async {
            while alive_peer(core, backup) {
                if failures.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        let reply = tokio::select! {
            reply = core.net.request(
                net_id(backup),
                types::RECOVER,
                request.clone(),
                RECOVER_TIMEOUT,
            ) => reply
                .map_err(|error| error.to_string())
                .and_then(|bytes| RecoverReply::decode(bytes).map_err(|error| error.to_string())),
            () = backup_failed => Err("declared failed while restoring the zone".to_owned()),
        };
        match reply {
            Ok(RecoverReply::Recovered {
                chunks,
                bytes,
                ms,
                ranges,
            }) => {
                let total = started.elapsed();
                tracing::info!(
                    %failed,
                    zone,
                    restorer = %backup,
                    chunks,
                    bytes,
                    ranges = ranges.len(),
                    restorer_ms = ms,
                    since_failure_ms = total.as_millis() as u64,
                    "zone recovered"
                );
                core.recoveries.update(failed, zone, |entry| {
                    entry.state = RecoveryState::Done;
                    entry.chunks = chunks;
                    entry.finished = Some(total);
                });
                return Some(backup);
            }
            Ok(RecoverReply::Failed(reason)) | Err(reason) => {
                tracing::warn!(%failed, zone, %backup, %reason, "zone recovery failed on this backup");
                core.recoveries.update(failed, zone, |entry| {
                    entry.detail = format!("{backup}: {reason}")
                });
                reasons.push(format!("{backup}: {reason}"));
            }
        }
    }
    tracing::error!(%failed, zone, ?reasons, "no backup could recover the zone");
    core.recoveries.update(failed, zone, |entry| {
        entry.state = RecoveryState::Failed;
        entry.finished = Some(started.elapsed());
        entry.detail = reasons.join("; ");
    });
    None
}

/// The LID ranges of `creator` that still route to `failed`, each with the owner of its
/// left (else right) neighbour range when that is not `failed`.
fn leftovers(
    state: &myriad_meta::MetaState,
    creator: NodeId,
    failed: NodeId,
) -> Vec<(u64, u64, Option<NodeId>)> {
    // The creator's whole LID space as (first, last, owner) pieces, in order.
    let mut pieces: Vec<(u64, u64, NodeId)> = Vec::new();
    let mut next = 0u64;
    let exceptions: Vec<(u64, u64, NodeId)> = state
        .lookup_tree(creator)
        .map(|tree| tree.exceptions().collect())
        .unwrap_or_default();
    for (first, last, owner) in exceptions {
        if first > next {
            pieces.push((next, first - 1, creator));
        }
        pieces.push((first, last, owner));
        next = last.saturating_add(1);
    }
    if next <= LOCAL_ID_MAX {
        pieces.push((next, LOCAL_ID_MAX, creator));
    }
    let mut out = Vec::new();
    for (index, &(first, last, owner)) in pieces.iter().enumerate() {
        if owner != failed {
            continue;
        }
        let left = index
            .checked_sub(1)
            .and_then(|i| pieces.get(i))
            .map(|piece| piece.2)
            .filter(|owner| *owner != failed);
        let right = pieces
            .get(index + 1)
            .map(|piece| piece.2)
            .filter(|owner| *owner != failed);
        out.push((first, last, left.or(right)));
    }
    out
}

/// Gives every CID range still routed to `failed` to a neighbouring restorer (else
/// `fallback`), so that requests for removed chunks end with `NotFound`.
async fn hand_over_leftovers(core: &Arc<Core>, failed: NodeId, fallback: NodeId) {
    let Some(raft) = core.raft() else {
        return;
    };
    let commands: Vec<Command> = raft.read_local(|state| {
        let creators: Vec<NodeId> = state.nodes().map(|record| record.id).collect();
        creators
            .into_iter()
            .flat_map(|creator| {
                leftovers(state, creator, failed)
                    .into_iter()
                    .map(move |(first, last, owner)| Command::SetOwner {
                        creator,
                        first,
                        last,
                        owner: owner.unwrap_or(fallback),
                    })
            })
            .collect()
    });
    let count = commands.len();
    let failures: Vec<String> = stream::iter(commands)
        .map(|command| {
            let core = Arc::clone(core);
            async move {
                match core.execute_write(command.clone()).await {
                    MetaReply::Response(myriad_meta::Response::Done) => None,
                    other => Some(format!("{command:?}: {other:?}")),
                }
            }
        })
        .buffer_unordered(LEFTOVER_COMMITS_IN_FLIGHT)
        .filter_map(|failure| async move { failure })
        .collect()
        .await;
    if failures.is_empty() {
        tracing::info!(%failed, ranges = count, "leftover ranges of the failed node handed over");
    } else {
        tracing::warn!(%failed, ranges = count, failed_commits = failures.len(), first = ?failures.first(), "some leftover ranges not handed over");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_meta::{Capabilities, MetaState};

    #[test]
    fn leftovers_are_the_failed_nodes_ranges_with_neighbours() {
        let mut state = MetaState::new();
        for _ in 0..3 {
            state.apply(&Command::Join {
                role: Role::Peer,
                address: "127.0.0.1:1".into(),
                capabilities: Capabilities::default(),
                rack: 0,
                switch: 0,
                reclaim: None,
            });
        }
        let ids: Vec<NodeId> = state.nodes().map(|record| record.id).collect();
        let (failed, a, b) = (ids[0], ids[1], ids[2]);
        for (first, last, owner) in [(1, 10, a), (12, 20, b)] {
            state.apply(&Command::SetOwner {
                creator: failed,
                first,
                last,
                owner,
            });
        }
        state.apply(&Command::SetOwner {
            creator: a,
            first: 5,
            last: 6,
            owner: failed,
        });
        assert_eq!(
            leftovers(&state, failed, failed),
            vec![
                (0, 0, Some(a)),
                (11, 11, Some(a)),
                (21, LOCAL_ID_MAX, Some(b)),
            ]
        );
        assert_eq!(leftovers(&state, a, failed), vec![(5, 6, Some(a))]);
        assert_eq!(leftovers(&state, b, failed), vec![]);
    }
}
