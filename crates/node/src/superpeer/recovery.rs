//! Recovery coordination on the superpeer leader (issue 6).
//!
//! # Job
//! The zone table in the replicated state says what is left to recover: every zone whose
//! owner failed, or that belongs to an earlier incarnation of its owner (a peer that
//! restarted with its data directory: [`myriad_meta::MetaState::zones_to_recover`]). The
//! leader ([`scan`], right after a `Fail` or a peer's join commits, and every
//! [`SCAN_INTERVAL`] from [`run`]) starts a recovery for each such zone it is not already
//! recovering, all zones at once. A zone's recovery ([`drive_zone`]) sends one
//! [`RecoverRequest`] to the zone's first backup; a backup that is not alive, does not
//! answer within [`RECOVER_TIMEOUT`] or answers `Failed` is skipped and the next backup in
//! the zone's order is asked. The restorer commits the ownership of the CIDs it restored
//! and then the zone's removal (`ZoneRemove`); the leader commits the removal too, so the
//! table shrinks as zones are done and a new leader continues where the old one stopped.
//!
//! A zone none of whose backups is alive waits up to the configured backup wait
//! (`failure.recovery_backup_wait_ms`, 30 s by default) for one to come back: after a
//! full restart the backups rejoin one by one, and a backup whose record still says alive
//! may not be back yet. Rounds over the backups repeat every [`RETRY_PAUSE`] until one
//! restores the zone; if none did within the wait, the zone is **lost**: logged as an
//! error, shown as `Lost` in the status, and removed from the table. Its chunks are gone.
//!
//! Once no zone of a failed peer is left, the CIDs that still route to it (its own CIDs
//! outside the recovered ranges: removed chunks, chunks of lost zones, and ranges of other
//! creators it had taken over) are given to a live peer (the owner of the neighbouring
//! range, else the lowest live peer), so that accesses to them end with `NotFound` instead
//! of waiting. Of the failed peer's own ID space only the local IDs it reserved
//! ([`myriad_meta::PeerBases::lids_reserved`]) are handed over: IDs above were never used,
//! and a new incarnation of the peer starts there.
//!
//! Every zone's progress (state, restorer, chunks, milliseconds since the recovery began)
//! is kept in the leader's memory ([`Recoveries`]), logged, and served to
//! [`myriad_proto::types::RECOVERY_STATUS`] requests; a new leader starts a fresh table.
//!
//! # Invariants
//! - Only the leader starts recoveries; a zone is recovered by at most one task of a
//!   superpeer at a time, and a task stops when its superpeer stops leading.
//! - The restorers commit the ownership of the CIDs they restored themselves; the leftover
//!   step only touches ranges that still point to the failed node after every zone of it
//!   is gone from the table, so it never takes a restored CID away from its restorer.
//! - A zone leaves the table only after its CIDs are owned by a restorer, or as lost.
//!
//! # Known gaps
//! A backup that dies during its zone's recovery is detected only through the request's
//! timeout. Two superpeers that both believe to lead for a moment may both ask a backup to
//! restore the same zone; the second restore replaces the first's chunks with the same
//! versions.
//!
//! # Who calls it
//! [`super::Core::after_commit`] (on `Fail` and joins), [`run`] (spawned at start) and
//! the superpeer's status handler.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use myriad_mem::NodeId;
use myriad_mem::LOCAL_ID_MAX;
use myriad_meta::{Command, MetaError, NodeState, Response, Role};
use myriad_proto::meta::MetaReply;
use myriad_proto::recovery::{
    RecoverReply, RecoverRequest, RecoveryState, RecoveryStatusReply, ZoneRecovery,
};
use myriad_proto::{net_id, types};
use parking_lot::Mutex;

use super::Core;

/// How long one backup may take to restore one zone before the next backup is asked.
pub const RECOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the leader looks for zones to recover that nobody recovers.
pub const SCAN_INTERVAL: Duration = Duration::from_millis(500);
/// Pause between two rounds over a zone's backups.
pub const RETRY_PAUSE: Duration = Duration::from_millis(250);
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

/// The leader's table of zone recoveries (in memory; lost with the leader) and the work
/// in progress.
#[derive(Debug, Default)]
pub(crate) struct Recoveries {
    table: Mutex<Vec<Entry>>,
    /// Zones a task of this superpeer is recovering.
    active: Mutex<HashSet<(NodeId, u32)>>,
    /// Failed peers (ID, incarnation) whose leftover ranges this superpeer handed over.
    leftovers_done: Mutex<HashSet<(NodeId, u32)>>,
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

/// Scans the state every [`SCAN_INTERVAL`] while the superpeer runs (see [`scan`]).
pub(crate) async fn run(core: Arc<Core>) {
    let mut ticker = tokio::time::interval(SCAN_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !core.stopping() {
        ticker.tick().await;
        scan(&core);
    }
}

/// On the leader: starts the recovery of every zone that needs one and is not being
/// recovered here, and the leftover step of every failed peer without zones left. Cheap
/// (one pass over the zone and node tables); returns at once.
pub(crate) fn scan(core: &Arc<Core>) {
    let Some(raft) = core.raft() else {
        return;
    };
    if !raft.is_leader() || core.stopping() {
        return;
    }
    // (owner, zone) due for recovery; (failed peer, incarnation) without zones left.
    type Keys = Vec<(NodeId, u32)>;
    let (due, finished): (Keys, Keys) = raft.read_local(|state| {
        let due = state
            .zones_to_recover()
            .map(|(owner, zone, _)| (owner, zone))
            .collect();
        // Failed peers that had zones (so recovery applies to them) and have none left.
        let finished = state
            .nodes()
            .filter(|record| {
                record.role == Role::Peer
                    && matches!(record.state, NodeState::Failed { .. })
                    && state.bases(record.id).zones_end > 0
                    && state.zones_of(record.id).next().is_none()
            })
            .map(|record| (record.id, record.incarnation))
            .collect();
        (due, finished)
    });
    let started = Instant::now();
    let fresh: Vec<(NodeId, u32)> = {
        let mut active = core.recoveries.active.lock();
        due.into_iter().filter(|key| active.insert(*key)).collect()
    };
    let mut owners: Vec<NodeId> = fresh.iter().map(|(owner, _)| *owner).collect();
    owners.dedup();
    for owner in owners {
        let zones: Vec<u32> = fresh
            .iter()
            .filter(|(o, _)| *o == owner)
            .map(|(_, zone)| *zone)
            .collect();
        tracing::warn!(%owner, zones = zones.len(), "recovery of zones started");
        core.recoveries.begin(owner, &zones, started);
    }
    let runtime = core.net.runtime();
    for (owner, zone) in fresh {
        let core = Arc::clone(core);
        runtime.spawn(async move { drive_zone(core, owner, zone, started).await });
    }
    for (failed, incarnation) in finished {
        let busy = core
            .recoveries
            .active
            .lock()
            .iter()
            .any(|(owner, _)| *owner == failed);
        if busy
            || !core
                .recoveries
                .leftovers_done
                .lock()
                .insert((failed, incarnation))
        {
            continue;
        }
        let core = Arc::clone(core);
        runtime.spawn(async move {
            if !hand_over_leftovers(&core, failed).await {
                core.recoveries
                    .leftovers_done
                    .lock()
                    .remove(&(failed, incarnation));
            }
        });
    }
}

/// Recovers one zone until it is restored, lost, no longer due, or this superpeer stops
/// leading.
async fn drive_zone(core: Arc<Core>, owner: NodeId, zone: u32, started: Instant) {
    let deadline = Instant::now() + core.backup_wait;
    let mut failed_rounds = 0u32;
    while let Some(raft) = core.raft() {
        if core.stopping() || !raft.is_leader() {
            tracing::info!(%owner, zone, "no longer leading; the next leader continues the zone's recovery");
            break;
        }
        let backups: Option<Vec<NodeId>> = raft.read_local(|state| {
            state
                .zone_needs_recovery(owner, zone)
                .then(|| state.zone(owner, zone).map(<[NodeId]>::to_vec))
                .flatten()
        });
        let Some(backups) = backups else {
            // Done by someone else (a restorer's removal, an earlier leader).
            core.recoveries.update(owner, zone, |entry| {
                if entry.finished.is_none() {
                    entry.state = RecoveryState::Done;
                    entry.finished = Some(started.elapsed());
                }
            });
            break;
        };
        let alive = backups
            .iter()
            .any(|backup| *backup != owner && alive_peer(&core, *backup));
        if alive {
            if let Some(restorer) = recover_zone(&core, owner, zone, backups.clone(), started).await
            {
                remove_zone(&core, owner, zone).await;
                tracing::debug!(%owner, zone, %restorer, "zone removed from the table");
                break;
            }
            failed_rounds += 1;
        } else {
            core.recoveries.update(owner, zone, |entry| {
                entry.state = RecoveryState::Waiting;
                entry.detail = format!("no backup alive of {backups:?}; waiting for one");
            });
        }
        if Instant::now() >= deadline {
            let why = if alive {
                format!("every backup of {backups:?} failed {failed_rounds} times")
            } else {
                format!(
                    "no backup of {backups:?} came back within {} ms",
                    core.backup_wait.as_millis()
                )
            };
            tracing::error!(%owner, zone, %why, "zone LOST: its chunks are gone");
            core.recoveries.update(owner, zone, |entry| {
                entry.state = RecoveryState::Lost;
                entry.restorer = None;
                entry.finished = Some(started.elapsed());
                entry.detail = why;
            });
            remove_zone(&core, owner, zone).await;
            break;
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    core.recoveries.active.lock().remove(&(owner, zone));
    scan(&core);
}

/// Commits the zone's removal from the table (already removed counts as done).
async fn remove_zone(core: &Arc<Core>, owner: NodeId, zone: u32) {
    match core
        .execute_write(Command::ZoneRemove { owner, zone })
        .await
    {
        MetaReply::Response(Response::Done)
        | MetaReply::Response(Response::Error(MetaError::ZoneNotFound { .. })) => {}
        other => {
            tracing::warn!(%owner, zone, ?other, "zone removal not committed; the next scan retries")
        }
    }
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
        let reply = core
            .net
            .request(
                net_id(backup),
                types::RECOVER,
                request.clone(),
                RECOVER_TIMEOUT,
            )
            .await
            .map_err(|error| error.to_string())
            .and_then(|bytes| RecoverReply::decode(bytes).map_err(|error| error.to_string()));
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

/// Gives every CID range still routed to `failed` (of its own IDs only those below its
/// reservation) to a neighbouring owner, else to the lowest live peer, so that requests for
/// removed or lost chunks end with `NotFound`. Whether it is settled (nothing to do, or
/// every commit went through).
async fn hand_over_leftovers(core: &Arc<Core>, failed: NodeId) -> bool {
    let Some(raft) = core.raft() else {
        return false;
    };
    let commands: Option<Vec<Command>> = raft.read_local(|state| {
        let record = state.node(failed)?;
        if !matches!(record.state, NodeState::Failed { .. }) {
            // It came back: its new incarnation answers for what is routed to it.
            return Some(Vec::new());
        }
        let fallback = state
            .nodes()
            .find(|record| {
                record.role == Role::Peer && record.state == NodeState::Alive && record.id != failed
            })
            .map(|record| record.id)?;
        let own_end = state.bases(failed).lids_reserved;
        let creators: Vec<NodeId> = state.nodes().map(|record| record.id).collect();
        Some(
            creators
                .into_iter()
                .flat_map(|creator| {
                    leftovers(state, creator, failed).into_iter().filter_map(
                        move |(first, last, owner)| {
                            let last = if creator == failed {
                                // IDs at or above the reservation were never handed out.
                                if first >= own_end {
                                    return None;
                                }
                                last.min(own_end - 1)
                            } else {
                                last
                            };
                            Some(Command::SetOwner {
                                creator,
                                first,
                                last,
                                owner: owner.unwrap_or(fallback),
                            })
                        },
                    )
                })
                .collect(),
        )
    });
    let Some(commands) = commands else {
        tracing::warn!(%failed, "no live peer to take the failed node's leftover ranges yet");
        return false;
    };
    let count = commands.len();
    let failures: Vec<String> = stream::iter(commands)
        .map(|command| {
            let core = Arc::clone(core);
            async move {
                match core.execute_write(command.clone()).await {
                    MetaReply::Response(Response::Done) => None,
                    other => Some(format!("{command:?}: {other:?}")),
                }
            }
        })
        .buffer_unordered(LEFTOVER_COMMITS_IN_FLIGHT)
        .filter_map(|failure| async move { failure })
        .collect()
        .await;
    if failures.is_empty() {
        tracing::info!(%failed, ranges = count, "leftover ranges of the failed node handed over; recovery complete");
        true
    } else {
        tracing::warn!(%failed, ranges = count, failed_commits = failures.len(), first = ?failures.first(), "some leftover ranges not handed over");
        false
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
