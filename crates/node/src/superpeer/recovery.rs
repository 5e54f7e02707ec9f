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
//! the zone's order is asked; so is a backup whose own failure is committed while it
//! restores the zone (every `Fail` commit wakes the zones in progress, which stop waiting
//! for a backup that is no longer alive). The restorer adopts the zone (`ZoneAdopt`: held
//! by the restorer from then on, same log identity) and then commits the ownership of the
//! CIDs it restored; a zone held by a live peer needs no recovery, so the leader is done
//! with it and a new leader continues where the old one stopped. An adopted zone whose
//! holder fails is due again and recovered the same way (the request names the log
//! owner; the backups hold the log under that name). A restorer without replication
//! removes the zone (`ZoneRemove`) instead; the leader commits that removal too.
//!
//! A zone none of whose backups is alive waits up to the configured backup wait
//! (`failure.recovery_backup_wait_ms`, 30 s by default) for one to come back: after a
//! full restart the backups rejoin one by one, and a backup whose record still says alive
//! may not be back yet. Rounds over the backups repeat every [`RETRY_PAUSE`] until one
//! restores the zone; if none did within the wait, the zone is **lost**: logged as an
//! error, shown as `Lost` in the status, and removed from the table. Its chunks are gone.
//! A round in which every backup was alive and answered [`RecoverReply::NotHeld`] (none
//! ever received a change of the zone: its owner failed before anything reached them,
//! so only `async` changes can have been lost) ends the recovery at once: the zone is
//! removed as restored empty (`Done`, 0 chunks) instead of being asked about until the
//! wait ends.
//!
//! Once no zone *held by* a failed peer is left ([`myriad_meta::MetaState::zones_held_by`]:
//! its zones adopted by others do not count), the CIDs that still route to it (its own CIDs
//! outside the recovered ranges: removed chunks, chunks of lost zones, and ranges of other
//! creators it had taken over) are given to a live peer (the owner of the neighbouring
//! range, else the lowest live peer) in one `Command::HandOver` (one Raft entry however
//! many ranges; refused if the peer came back), so that accesses to them end with
//! `NotFound` instead of waiting. Of the failed peer's own ID space only the local IDs it reserved
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
//! - A zone leaves the table only after its CIDs are owned by a restorer without
//!   replication, or as lost; an adopted zone stays, held by its restorer.
//!
//! # Known gaps
//! Two superpeers that both believe to lead for a moment may both ask a backup to restore
//! the same zone; the second restore replaces the first's chunks with the same versions.
//! A restorer that dies after it committed some of the zone's ranges leaves them routed to
//! it until the next backup commits the whole zone's ranges for itself (clients wait
//! meanwhile). `Fail` names a node, not an incarnation: a verdict on an old incarnation
//! that commits in the moment its new incarnation joins fails the new one (the watch and
//! the failure reports check the incarnation right before, which leaves milliseconds).
//! The backups delete the logs of recovered and lost zones only after a grace period
//! ([`crate::log_gc`]).
//!
//! # Who calls it
//! [`super::Core::after_commit`] (on `Fail` and joins), [`run`] (spawned at start) and
//! the superpeer's status handler.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use myriad_meta::{Command, MetaError, NodeState, Response, Role};
use myriad_proto::meta::{Event, EventPush, MetaReply};
use myriad_proto::recovery::{
    RecoverReply, RecoverRequest, RecoveryState, RecoveryStatusReply, ZoneRecovery,
};
use myriad_proto::types;
use myriad_replication::wire;
use myriad_types::NodeId;
use parking_lot::Mutex;

use super::Core;

/// How long one backup may take to restore one zone before the next backup is asked.
pub const RECOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the leader looks for zones to recover that nobody recovers.
pub const SCAN_INTERVAL: Duration = Duration::from_millis(500);
/// Pause between two rounds over a zone's backups.
pub const RETRY_PAUSE: Duration = Duration::from_millis(250);
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
#[derive(Debug)]
pub(crate) struct Recoveries {
    table: Mutex<Vec<Entry>>,
    /// Counts committed failures: zones in progress watch it for their restorer's.
    failures: tokio::sync::watch::Sender<u64>,
    /// Zones a task of this superpeer is recovering.
    active: Mutex<HashSet<(NodeId, u32)>>,
    /// Failed peers (ID, incarnation) whose leftover ranges this superpeer handed over.
    leftovers_done: Mutex<HashSet<(NodeId, u32)>>,
}

impl Default for Recoveries {
    fn default() -> Self {
        Recoveries {
            table: Mutex::new(Vec::new()),
            failures: tokio::sync::watch::Sender::new(0),
            active: Mutex::new(HashSet::new()),
            leftovers_done: Mutex::new(HashSet::new()),
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

    /// A `Fail` committed: zones whose restorer it names stop waiting for that restorer.
    pub(crate) fn failure_committed(&self) {
        self.failures
            .send_modify(|count| *count = count.wrapping_add(1));
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
        // Failed peers without zones left (the hand-over finds what still routes to them).
        let finished = state
            .nodes()
            .filter(|record| {
                record.role == Role::Peer
                    && matches!(record.state, NodeState::Failed { .. })
                    && state.zones_held_by(record.id).next().is_none()
                    && state
                        .zones_of(record.id)
                        .all(|(zone, _)| state.zone_settled(record.id, zone))
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
    let mut deadline = Instant::now() + core.backup_wait;
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
            let outcome = recover_zone(&core, owner, zone, backups.clone(), started).await;
            if outcome == Outcome::NotHeld {
                // No live backup ever received a change of the zone: nothing can restore
                // it, now or later (only `async` changes never sent can have been lost).
                tracing::warn!(%owner, zone, ?backups, "no backup holds anything of the zone; removing it");
                core.recoveries.update(owner, zone, |entry| {
                    entry.state = RecoveryState::Done;
                    entry.restorer = None;
                    entry.chunks = 0;
                    entry.finished = Some(started.elapsed());
                    entry.detail = "no backup ever received a change of the zone".to_owned();
                });
                remove_zone(&core, owner, zone).await;
                break;
            }
            if let Outcome::Restored(restorer) = outcome {
                // The restorer adopted the zone (`ZoneAdopt`, before its reply): held by a
                // live peer, it is finished. A restorer without replication removed it
                // instead, or left that to this leader. An adopted zone whose new holder
                // failed meanwhile is recovered again from its backups.
                let due = raft.read_local(|state| {
                    state
                        .zone_needs_recovery(owner, zone)
                        .then(|| state.zone_holder(owner, zone))
                        .flatten()
                });
                match due {
                    None => {
                        tracing::debug!(%owner, zone, %restorer, "zone adopted by its restorer");
                        break;
                    }
                    Some(holder) if holder == owner => {
                        remove_zone(&core, owner, zone).await;
                        tracing::debug!(%owner, zone, %restorer, "zone removed from the table");
                        break;
                    }
                    Some(holder) => {
                        tracing::warn!(%owner, zone, %holder, "the zone's new holder failed; recovering it again");
                        deadline = Instant::now() + core.backup_wait;
                        failed_rounds = 0;
                        continue;
                    }
                }
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

/// How long the leader waits for a backup's zone position (a lookup in the backup's
/// memory; the backups are asked at once): one that does not answer in time goes last,
/// so a hung backup delays the zone's recovery by this much at most.
const POSITION_TIMEOUT: Duration = Duration::from_millis(200);

/// The complete backups of a zone ordered by their zone position, highest first (ties,
/// and backups without an answer last, keep the zone's order): the one that received
/// most of the failed writer's changes restores the zone, so an `async` change that
/// reached any complete backup survives, and the others, at a lower position, are
/// refilled by the restorer (`myriad_node::recovery::same_history`). Asking seals the
/// zone at each backup against `writer` (it failed). With one backup there is nothing to
/// order.
async fn by_position(
    core: &Arc<Core>,
    owner: NodeId,
    zone: u32,
    writer: NodeId,
    backups: Vec<NodeId>,
) -> Vec<NodeId> {
    if backups.len() < 2 {
        return backups;
    }
    let question = wire::PositionRequest {
        owner,
        zone,
        writer,
    }
    .encode();
    let asks = backups.iter().map(|&backup| {
        let question = question.clone();
        async move {
            if backup == owner || !alive_peer(core, backup) {
                return (backup, None);
            }
            core.sync_address(backup);
            let answer = core
                .net
                .request(backup, wire::ZONE_POSITION, question, POSITION_TIMEOUT)
                .await
                .ok()
                .and_then(|reply| wire::PositionReply::decode(reply).ok())
                .and_then(|reply| reply.0);
            (backup, answer)
        }
    });
    let answers = futures_util::future::join_all(asks).await;
    tracing::debug!(%owner, zone, ?answers, "backups by zone position");
    crate::recovery::order_by_position(answers)
}

/// How one round over a zone's backups ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// This backup restored the zone.
    Restored(NodeId),
    /// Every backup asked (at least one, all alive ones) answered that it never received
    /// anything of the zone.
    NotHeld,
    /// None restored it.
    Failed,
}

/// Asks the zone's backups in order until one restores it.
async fn recover_zone(
    core: &Arc<Core>,
    failed: NodeId,
    zone: u32,
    backups: Vec<NodeId>,
    started: Instant,
) -> Outcome {
    // An adopted zone whose holder failed: the restorer fences the holder too.
    let holder = core
        .raft()
        .and_then(|raft| raft.read_local(|state| state.zone_holder(failed, zone)))
        .filter(|holder| *holder != failed);
    // Backups whose copy of the zone is still being filled restore it only when no complete
    // one can: they may lack chunks.
    let filling: Vec<NodeId> = core
        .raft()
        .map(|raft| raft.read_local(|state| state.zone_filling(failed, zone).to_vec()))
        .unwrap_or_default();
    let (complete, partial): (Vec<NodeId>, Vec<NodeId>) =
        backups.into_iter().partition(|b| !filling.contains(b));
    let complete = by_position(core, failed, zone, holder.unwrap_or(failed), complete).await;
    let request = RecoverRequest {
        owner: failed,
        zone,
        holder,
        filling: filling.clone(),
    }
    .encode();
    let mut reasons: Vec<String> = Vec::new();
    let (mut asked, mut not_held) = (0usize, 0usize);
    for backup in complete.into_iter().chain(partial) {
        if filling.contains(&backup) && alive_peer(core, backup) {
            tracing::warn!(%failed, zone, %backup, "no complete backup restored the zone; trying one whose copy was still being filled (chunks may be missing)");
        }
        if backup == failed || !alive_peer(core, backup) {
            reasons.push(format!("{backup}: not alive"));
            continue;
        }
        core.recoveries.update(failed, zone, |entry| {
            entry.state = RecoveryState::Running;
            entry.restorer = Some(backup);
        });
        core.sync_address(backup);
        asked += 1;
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
                backup,
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
                return Outcome::Restored(backup);
            }
            Ok(RecoverReply::NotHeld) => {
                tracing::info!(%failed, zone, %backup, "this backup never received anything of the zone");
                not_held += 1;
                reasons.push(format!("{backup}: holds nothing of the zone"));
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
    if asked > 0 && not_held == asked && reasons.len() == asked {
        return Outcome::NotHeld;
    }
    tracing::error!(%failed, zone, ?reasons, "no backup could recover the zone");
    core.recoveries.update(failed, zone, |entry| {
        entry.state = RecoveryState::Failed;
        entry.finished = Some(started.elapsed());
        entry.detail = reasons.join("; ");
    });
    Outcome::Failed
}

/// Hands every CID range still routed to `failed` (of its own IDs only those below its
/// reservation) to a neighbouring owner, else to the lowest live peer, in one
/// `Command::HandOver`, so that requests for removed or lost chunks end with `NotFound`;
/// then tells every node (ownership events). Whether it is settled (nothing to do, the
/// peer came back, or the hand-over committed).
async fn hand_over_leftovers(core: &Arc<Core>, failed: NodeId) -> bool {
    let Some(raft) = core.raft() else {
        return false;
    };
    // The fallback: the first live peer that answers a ping now (a peer that died with
    // the failed one may not be declared failed yet).
    let candidates: Vec<NodeId> = raft.read_local(|state| {
        state
            .nodes()
            .filter(|record| {
                record.role == Role::Peer && record.state == NodeState::Alive && record.id != failed
            })
            .map(|record| record.id)
            .collect()
    });
    let mut fallback = None;
    for candidate in candidates {
        if core.ping(candidate, 0).await.is_ok() {
            fallback = Some(candidate);
            break;
        }
    }
    let plan = raft.read_local(|state| {
        let record = state.node(failed)?;
        if !matches!(record.state, NodeState::Failed { .. }) {
            // It came back: its new incarnation answers for what is routed to it.
            return Some(None);
        }
        let fallback = fallback?;
        let ranges = state.leftover_ranges(failed, fallback);
        Some(Some((record.incarnation, fallback, ranges)))
    });
    let (incarnation, fallback, ranges) = match plan {
        None => {
            tracing::warn!(%failed, "no live peer to take the failed node's leftover ranges yet");
            return false;
        }
        Some(None) => return true,
        Some(Some(plan)) => plan,
    };
    if ranges.is_empty() {
        return true;
    }
    let command = Command::HandOver {
        failed,
        incarnation,
        fallback,
    };
    match core.execute_write(command).await {
        MetaReply::Response(Response::Done) => {
            let epoch = raft.read_local(myriad_meta::MetaState::epoch);
            for (creator, first, last, owner) in &ranges {
                let push = EventPush {
                    epoch,
                    event: Event::OwnerChanged {
                        creator: *creator,
                        first: *first,
                        last: *last,
                        owner: *owner,
                    },
                };
                if core.events.send(push).await.is_err() {
                    break;
                }
            }
            tracing::info!(%failed, ranges = ranges.len(), "leftover ranges of the failed node handed over; recovery complete");
            true
        }
        MetaReply::Response(Response::Error(error)) => {
            // It came back meanwhile, or the fallback left: the next scan looks again.
            tracing::info!(%failed, %error, "leftover hand-over refused");
            false
        }
        other => {
            tracing::warn!(%failed, ?other, "leftover hand-over not committed; retrying");
            false
        }
    }
}
