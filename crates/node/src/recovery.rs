//! The restorer's side of recovering a failed peer (issue 6): one backup zone into this
//! peer's memory.
//!
//! # Job
//! On a [`RecoverRequest`] from the superpeer leader ([`myriad_proto::types::RECOVER`]),
//! [`restore_zone`] reads the zone back from this peer's log engine
//! ([`BackupService::recover_zone_and_seal`]: the current version of every chunk, removed
//! chunks excluded; the failed owner's late operations for the zone are refused from then
//! on), inserts the chunks into the memory manager in the engine's large batches
//! keeping their CIDs ([`MemoryManager::create_with_ids`]), turns the recovered CIDs into
//! sorted, merged ranges per creator, asks the zone's other complete backups for their
//! zone position ([`same_history`]: a backup holding another prefix of the zone's history
//! is no surviving backup), **adopts** the zone
//! ([`myriad_replication::Replicator::adopt_zone`]: the zone keeps its log identity
//! `(owner, zone)`, its backups become the surviving ones plus new ones, committed as
//! `Command::ZoneAdopt` before anything else; an added backup is reset before its copy), takes the ranges over in this peer's
//! ownership view at once and commits `Command::SetOwner { owner: me }` for each range
//! through the superpeers, then `Command::ZoneOwned` (the zone is settled: nothing of it
//! routes to the failed owner any more). The reply carries the count and the ranges. Afterwards, in the
//! background, [`ChunkService::copy_adopted`] copies the zone to its *new* backups only (the
//! surviving ones hold its log). A peer without replication commits `Command::ZoneRemove`
//! instead of adopting (the zone table is the recovery's progress).
//!
//! # Invariants
//! - Only chunks the engine delivered are taken over: a range never covers a CID this peer
//!   did not restore, so two restorers never claim the same CID.
//! - The adoption commits before the ownership: from the moment clients reach the chunks
//!   here, every change of them goes to the zone's backups under `(owner, zone)`, and a
//!   death of this peer makes the zone due for recovery again (held by a failed peer),
//!   from a backup whose log is complete. If this peer dies before `ZoneAdopt` commits,
//!   the zone is still the failed owner's and is recovered from its next backup.
//! - A chunk already present under the same CID (a retried recovery) is replaced by the
//!   recovered version.
//! - The failed owner is fenced by every member on `NodeFailed` (the messaging layer drops
//!   its messages), and by the restorer itself before it reads the zone (the event may
//!   arrive after the request), so its zone cannot change while it is read. When the zone
//!   had been adopted and its holder failed (a chained recovery), the request names the
//!   holder ([`RecoverRequest::holder`]) and the restorer fences it too.
//!
//! - A surviving backup kept in the zone holds exactly the history the restorer read (the
//!   same zone position); the others are emptied and copied the whole zone if placement
//!   picks them again.
//!
//! # Known gaps
//! - `async` writes the failed owner acknowledged but had sent to no complete backup are
//!   lost (the `async` window). (The leader has the complete backup with the highest
//!   position restore the zone, so one that reached any of them survives.)
//! - A restorer that restarted since it received the zone knows no position: it keeps
//!   every surviving backup, as before positions existed (a full-cluster restart).
//! - When the ownership commits fail after the adoption (three rounds), the recovery is
//!   reported failed, the zone stays adopted and unsettled, and the commits are retried
//!   in the background for about 10 minutes; meanwhile the zone's CIDs may still route to
//!   the failed owner (clients wait and time out).
//!
//! # Who calls it
//! [`crate::peer::PeerNode`]'s [`myriad_proto::types::RECOVER`] handler (on a blocking thread).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use myriad_mem::{MemError, MemoryManager};
use myriad_membership::Membership;
use myriad_meta::Command;
use myriad_proto::meta::{MetaReply, MetaRequest};
use myriad_proto::recovery::{
    push_run, ranges_of_runs, CidRange, RecoverReply, RecoverRequest, RecoveryState,
};
use myriad_replication::{wire, Adoption, BackupService};
use myriad_types::{ChunkId, NodeId};
use parking_lot::Mutex;

use crate::peer::ChunkService;

/// Ownership commits in flight at once while a restorer takes its ranges over.
const OWNER_COMMITS_IN_FLIGHT: usize = 64;
/// How long a restorer waits for a surviving backup's zone position (a lookup in the
/// backup's memory): one that does not answer in time is no surviving backup (placement
/// may pick it again, and it is copied the zone), so a hung backup delays the adoption by
/// this much at most.
const POSITION_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(300);
/// Rounds of ownership commits after an adoption (the zone is held here by then).
const OWNER_COMMIT_ATTEMPTS: usize = 3;
/// Pause between two rounds.
const OWNER_COMMIT_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);
/// How long a restorer holds back copying a recovered zone to its new backups while the
/// superpeer leader still shows other zones of the same failed peer pending or running:
/// the copy competes with those recoveries for the CPUs, disks and network, and
/// availability comes first.
const REREPLICATION_HOLD_MAX: std::time::Duration = std::time::Duration::from_secs(10);
/// Pause between two looks at the leader's recovery table while holding back.
const REREPLICATION_HOLD_POLL: std::time::Duration = std::time::Duration::from_millis(50);
/// Rounds of the background retries once the first rounds failed (about 10 minutes).
const OWNER_COMMIT_RETRIES_MAX: usize = 3_000;

/// What [`insert_recovered`] did.
#[derive(Debug, Default)]
pub struct Restored {
    /// The CIDs now stored here, as inclusive runs of raw CIDs in no particular order
    /// (each batch compressed as it was stored: a zone's CIDs take a few runs, not one
    /// word each). [`Restored::ranges`] sorts and merges them.
    pub runs: Vec<(u64, u64)>,
    /// How many chunks are now stored here.
    pub chunks: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Chunks that could not be stored, with the first reason.
    pub failed: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// The zone's position here once it was read (see `myriad_replication::wire`'s "Zone
    /// positions"): what the restored chunks reflect. `None` when this backup holds no
    /// position for the zone (it restarted since it received the zone).
    pub position: Option<u64>,
    /// Chunks read back but not stored ([`insert_recovered_where`]'s `keep` refused them).
    pub skipped: u64,
    /// Their CIDs as runs, like `runs`.
    pub skipped_runs: Vec<(u64, u64)>,
}

impl Restored {
    /// The stored CIDs as sorted ranges per creator (what the restorer reports).
    pub fn ranges(&mut self) -> Vec<CidRange> {
        ranges_of_runs(&mut self.runs)
    }

    /// The CIDs read back but not stored, as sorted ranges per creator.
    pub fn skipped_ranges(&mut self) -> Vec<CidRange> {
        ranges_of_runs(&mut self.skipped_runs)
    }
}

/// Reads `owner`'s zone `zone` from `backup` into `mem` (CIDs kept, batches as the engine
/// hands them over). A chunk already stored under the same CID is replaced.
pub fn insert_recovered(
    backup: &BackupService,
    mem: &MemoryManager,
    request: &RecoverRequest,
) -> Result<Restored, String> {
    insert_recovered_where(backup, mem, request, &|_| true)
}

/// [`insert_recovered`], storing only the chunks `keep` accepts; the others are counted
/// in [`Restored::skipped`] and their CIDs kept as runs (see [`Restored::skipped_ranges`]).
pub fn insert_recovered_where(
    backup: &BackupService,
    mem: &MemoryManager,
    request: &RecoverRequest,
    keep: &(dyn Fn(ChunkId) -> bool + Sync),
) -> Result<Restored, String> {
    let restored = Mutex::new(Restored::default());
    let bytes = AtomicU64::new(0);
    let sink = |all: &[myriad_backup_log::RecoveredChunk<'_>]| {
        let mut skipped: Vec<(u64, u64)> = Vec::new();
        let kept: Vec<myriad_backup_log::RecoveredChunk<'_>>;
        let batch = if all.iter().all(|chunk| keep(ChunkId::from_raw(chunk.cid))) {
            all
        } else {
            kept = all
                .iter()
                .filter(|chunk| {
                    let stays = keep(ChunkId::from_raw(chunk.cid));
                    if !stays {
                        push_run(&mut skipped, chunk.cid);
                    }
                    stays
                })
                .copied()
                .collect();
            &kept
        };
        if !skipped.is_empty() {
            let mut guard = restored.lock();
            guard.skipped += skipped.iter().map(|(a, b)| b - a + 1).sum::<u64>();
            guard.skipped_runs.extend(skipped);
        }
        // Failures come in index order; a chunk already stored under its CID (a retried
        // recovery) is replaced.
        let mut failures: Vec<(usize, String)> = Vec::new();
        mem.create_with_ids_by(
            batch,
            |chunk| (ChunkId::from_raw(chunk.cid), chunk.payload),
            |index, error| {
                let Some(chunk) = batch.get(index) else {
                    return;
                };
                let cid = ChunkId::from_raw(chunk.cid);
                let retried = match error {
                    MemError::AlreadyExists(_) => mem
                        .remove(cid)
                        .and_then(|_| mem.create_with_id(cid, chunk.payload)),
                    other => Err(other),
                };
                if let Err(error) = retried {
                    failures.push((index, format!("{cid}: {error}")));
                }
            },
        );
        let mut stored: Vec<(u64, u64)> = Vec::new();
        let mut batch_bytes = 0u64;
        let mut next_failure = failures.iter().map(|(index, _)| *index).peekable();
        for (index, chunk) in batch.iter().enumerate() {
            if next_failure.next_if_eq(&index).is_some() {
                continue;
            }
            push_run(&mut stored, chunk.cid);
            batch_bytes += chunk.payload.len() as u64;
        }
        let count = (batch.len() - failures.len()) as u64;
        bytes.fetch_add(batch_bytes, Ordering::Relaxed);
        let mut guard = restored.lock();
        guard.runs.extend(stored);
        guard.chunks += count;
        guard.failed += failures.len() as u64;
        if guard.first_error.is_none() {
            guard.first_error = failures.into_iter().next().map(|(_, error)| error);
        }
    };
    // Sealed against the zone's writer first (its owner, or the failed holder of an
    // adopted zone): nothing of theirs lands after the read, so the position read below
    // is the one of the chunks read.
    let writer = request.holder.unwrap_or(request.owner);
    backup.seal_and_position(request.owner, request.zone, writer);
    backup
        .recover_zone_and_seal(request.owner, request.zone, &sink)
        .map_err(|error| {
            format!(
                "reading zone {} of {}: {error}",
                request.zone, request.owner
            )
        })?;
    let mut restored = restored.into_inner();
    restored.bytes = bytes.into_inner();
    restored.position = backup.position(request.owner, request.zone);
    Ok(restored)
}

/// Restores one zone and takes its CIDs over (see the module documentation). Blocks: call
/// on a thread that runs no async tasks.
pub fn restore_zone(
    backup: &BackupService,
    service: &Arc<ChunkService>,
    membership: &Arc<Membership>,
    request: RecoverRequest,
) -> RecoverReply {
    let started = Instant::now();
    let writer = request.holder.unwrap_or(request.owner);
    let routes = match Routes::read(membership) {
        Ok(routes) => routes,
        Err(reason) => return RecoverReply::Failed(reason),
    };
    let keep = |cid: ChunkId| routes.restores(cid, writer);
    let mut restored = match insert_recovered_where(backup, service.memory(), &request, &keep) {
        Ok(restored) => restored,
        // The read sealed the zone against its failed writer first: from then on nothing
        // of theirs creates the zone's log here, so a backup without one holds nothing of
        // the zone for good.
        Err(_) if !backup.holds_zone(request.owner, request.zone) => return RecoverReply::NotHeld,
        Err(reason) => return RecoverReply::Failed(reason),
    };
    if let Some(error) = &restored.first_error {
        // Taking over a zone with holes would turn its missing chunks into NotFound.
        return RecoverReply::Failed(format!(
            "{} chunks of zone {} of {} could not be stored, e.g. {error}",
            restored.failed, request.zone, request.owner
        ));
    }
    let inserted_ms = started.elapsed().as_millis() as u64;
    let ranges = restored.ranges();
    let orphans = restored.skipped_ranges();
    if !orphans.is_empty() {
        tracing::warn!(owner = %request.owner, zone = request.zone, skipped = restored.skipped, ?orphans, "restored chunks the directory routes elsewhere (a migration that never committed) were left out");
    }
    let chunks = restored.chunks;
    // Only chunks the engine delivered are taken over: the ranges cover no more CIDs than
    // were stored here (a range over a CID not restored would claim another restorer's).
    let covered: u64 = ranges
        .iter()
        .map(|range| range.last - range.first + 1)
        .sum();
    assert!(
        covered <= chunks,
        "zone {} of {}: ranges cover {covered} CIDs, {chunks} restored",
        request.zone,
        request.owner
    );
    let adoption = match adopt(service, membership, &request, &ranges, &restored) {
        Ok(adoption) => adoption,
        Err(reason) => return RecoverReply::Failed(reason),
    };
    if let Err(reason) = take_over(service, membership, &request, &ranges, adoption.is_some()) {
        return RecoverReply::Failed(reason);
    }
    let ms = started.elapsed().as_millis() as u64;
    tracing::info!(
        owner = %request.owner,
        zone = request.zone,
        chunks,
        bytes = restored.bytes,
        ranges = ranges.len(),
        inserted_ms,
        ms,
        backups = ?adoption.as_ref().map(|a| &a.backups),
        "zone restored and taken over"
    );
    if let Some(adoption) = adoption {
        if let Some(replicator) = service.replicator() {
            replicator.forget_in_adopted(&adoption, &cid_pairs(&orphans));
        }
        spawn_rereplication(service, membership, request, adoption, chunks);
    }
    RecoverReply::Recovered {
        chunks,
        bytes: restored.bytes,
        ms,
        ranges,
    }
}

/// Ranges as `(first, last)` CIDs.
pub fn cid_pairs(ranges: &[CidRange]) -> Vec<(ChunkId, ChunkId)> {
    ranges
        .iter()
        .filter_map(|r| {
            Some((
                ChunkId::new(r.creator, r.first)?,
                ChunkId::new(r.creator, r.last)?,
            ))
        })
        .collect()
}

/// Adoption: the zone stays one zone, named (owner, zone) in the backups' logs, held by
/// this peer from the moment `ZoneAdopt` commits, before the CIDs are taken over. `None`:
/// this peer does not replicate (nothing to adopt).
fn adopt(
    service: &ChunkService,
    membership: &Arc<Membership>,
    request: &RecoverRequest,
    ranges: &[CidRange],
    restored: &Restored,
) -> Result<Option<Adoption>, String> {
    let Some(replicator) = service
        .replicator()
        .filter(|replicator| replicator.config().replication > 0)
    else {
        return Ok(None);
    };
    // Backups still being filled are no surviving backups: if placement picks one again,
    // it is an added backup and gets the whole zone copied.
    let mut old_backups = zone_backups(membership, request.owner, request.zone)?;
    old_backups.retain(|backup| !request.filling.contains(backup) && *backup != service.node());
    let (old_backups, position) = same_history(membership, request, old_backups, restored.position);
    let cid_ranges = cid_pairs(ranges);
    replicator
        .adopt_zone(
            request.owner,
            request.zone,
            &old_backups,
            &cid_ranges,
            myriad_replication::Restored {
                chunks: restored.chunks,
                bytes: restored.bytes,
                position,
            },
        )
        .map(Some)
        .map_err(|error| {
            format!(
                "adopting zone {} of {}: {error}",
                request.zone, request.owner
            )
        })
}

/// The surviving backups that hold the zone's history up to this restorer's position
/// (`position`), and the position the adopter numbers on from.
///
/// In `async` mode (and for changes not yet acknowledged in the others) the backups of a
/// zone may hold different prefixes of its history when its writer fails. A backup with
/// more than this restorer read keeps changes the adopted zone lacks, and one with less
/// lacks changes it has: either would bring back, or lose, chunks at the zone's next
/// recovery (simulator seeds 5833, 5694). Each old backup is asked its position
/// ([`wire::ZONE_POSITION`], which also seals the zone there against the failed writer);
/// one that differs, does not know, or does not answer is no surviving backup: if
/// placement picks it again, it is an added backup, emptied and copied the whole zone.
/// When this restorer knows no position itself (it restarted since it received the
/// zone), nothing can be compared and every old backup is kept, as before positions
/// existed; the adopter then numbers on from the highest position reported.
fn same_history(
    membership: &Arc<Membership>,
    request: &RecoverRequest,
    old_backups: Vec<NodeId>,
    own: Option<u64>,
) -> (Vec<NodeId>, u64) {
    let question = wire::PositionRequest {
        owner: request.owner,
        zone: request.zone,
        writer: request.holder.unwrap_or(request.owner),
    }
    .encode();
    let net = membership.net();
    let pending: Vec<_> = old_backups
        .iter()
        .map(|&backup| {
            (
                backup,
                net.request_later_blocking(
                    backup,
                    wire::ZONE_POSITION,
                    question.clone(),
                    POSITION_TIMEOUT,
                ),
            )
        })
        .collect();
    let answers: Vec<(NodeId, Option<u64>)> = pending
        .into_iter()
        .map(|(backup, pending)| {
            let answer = pending
                .and_then(|pending| pending.wait_blocking())
                .ok()
                .and_then(|reply| wire::PositionReply::decode(reply).ok())
                .and_then(|reply| reply.0);
            (backup, answer)
        })
        .collect();
    let (kept, position) = surviving(own, &answers);
    if own.is_none() {
        tracing::warn!(owner = %request.owner, zone = request.zone, "this restorer knows no position of the zone; every surviving backup is kept");
    }
    for (backup, answer) in &answers {
        if !kept.contains(backup) {
            tracing::info!(owner = %request.owner, zone = request.zone, %backup, position, theirs = ?answer, "a surviving backup holds another history of the zone; it is no surviving backup");
        }
    }
    (kept, position)
}

/// The superpeers' lookup trees of every peer, read before a recovery: who owns a CID
/// now. A restorer stores (and takes over) only the chunks routed to the zone's writer;
/// the others are *orphans*: copies a migration left when its insert reached the writer
/// but the new owner was never committed (the insert's answer was lost, the source kept
/// the chunks). Taking an orphan over would bring back a stale copy in place of its
/// owner's, and storing it would replace the owner's own copy when the owner restores
/// (simulator seed 63).
#[derive(Debug, Default)]
pub struct Routes {
    /// Per creator, its ranges covering all of its local IDs.
    trees: Vec<(NodeId, Vec<myriad_meta::LookupRange>)>,
}

impl Routes {
    /// The lookup trees of every peer the membership knows (alive or not: a failed
    /// creator's IDs may still be routed elsewhere), from the superpeers, read
    /// concurrently.
    pub fn read(membership: &Arc<Membership>) -> Result<Routes, String> {
        let mut creators: Vec<NodeId> = membership
            .nodes()
            .into_iter()
            .filter(|record| record.role == myriad_meta::Role::Peer)
            .map(|record| record.id)
            .collect();
        creators.sort_unstable();
        creators.dedup();
        let reader = Arc::clone(membership);
        let trees = membership.net().runtime().block_on(async move {
            let reads = creators.into_iter().map(|creator| {
                let reader = Arc::clone(&reader);
                async move { (creator, reader.lookup_all(creator).await) }
            });
            futures_util::future::join_all(reads).await
        });
        let mut routes = Routes::default();
        for (creator, tree) in trees {
            let tree =
                tree.map_err(|error| format!("reading the lookup tree of {creator}: {error}"))?;
            routes.trees.push((creator, tree));
        }
        Ok(routes)
    }

    /// Routes from given ranges (each creator's ranges covering all of its local IDs).
    pub fn from_trees(trees: Vec<(NodeId, Vec<myriad_meta::LookupRange>)>) -> Routes {
        Routes { trees }
    }

    /// The owner of `cid`; `None` for a creator whose tree was not read (not a member
    /// any more), whose chunks a restorer keeps, as before routes were read.
    pub fn owner(&self, cid: ChunkId) -> Option<NodeId> {
        let (creator, lid) = (cid.creator(), cid.local_id());
        let (_, tree) = self.trees.iter().find(|(c, _)| *c == creator)?;
        Some(
            tree.iter()
                .find(|r| r.first <= lid && lid <= r.last)
                .map_or(creator, |range| range.owner),
        )
    }

    /// Whether a restorer of a zone written by `writer` stores and takes over `cid`.
    pub fn restores(&self, cid: ChunkId, writer: NodeId) -> bool {
        self.owner(cid).is_none_or(|owner| owner == writer)
    }
}

/// The superpeer leader's order of a zone's complete backups for its recovery, from
/// their answers to [`wire::ZONE_POSITION`] (`None`: no answer): the highest position
/// first, so the backup that received most of the failed writer's changes restores the
/// zone; equal positions keep the zone's order, and backups without an answer come last.
pub fn order_by_position(mut answers: Vec<(NodeId, Option<u64>)>) -> Vec<NodeId> {
    // Stable: equal positions keep the zone's order; `None` sorts below every position.
    answers.sort_by_key(|(_, position)| std::cmp::Reverse(*position));
    answers.into_iter().map(|(backup, _)| backup).collect()
}

/// The decision of [`same_history`] (also the simulator's): from the restorer's own
/// position and each old backup's answer (`None`: no position, or no answer), the
/// backups kept as survivors and the position the adopter numbers on from.
pub fn surviving(own: Option<u64>, answers: &[(NodeId, Option<u64>)]) -> (Vec<NodeId>, u64) {
    match own {
        Some(own) => (
            answers
                .iter()
                .filter(|(_, answer)| *answer == Some(own))
                .map(|(backup, _)| *backup)
                .collect(),
            own,
        ),
        None => (
            answers.iter().map(|(backup, _)| *backup).collect(),
            answers.iter().filter_map(|(_, p)| *p).max().unwrap_or(0),
        ),
    }
}

/// Takes the restored ranges over: at once in this peer's ownership view, then through
/// the superpeers. An adopted zone is settled (with background retries when the first
/// rounds fail); without adoption the ranges are committed and the zone is removed from
/// the zone table (the progress a new leader continues from).
fn take_over(
    service: &ChunkService,
    membership: &Arc<Membership>,
    request: &RecoverRequest,
    ranges: &[CidRange],
    adopted: bool,
) -> Result<(), String> {
    let me = service.node();
    for range in ranges {
        service.set_owner(range.creator, range.first, range.last, me);
    }
    if adopted {
        // The zone is this peer's now: its CIDs must not stay routed to the failed owner.
        // Three rounds here; if they all fail, the recovery is reported failed and the
        // rounds go on in the background (bounded) until the zone is settled.
        if let Err(reason) = settle(membership, ranges, request, OWNER_COMMIT_ATTEMPTS) {
            spawn_settle_retries(membership, ranges.to_vec(), request.clone());
            return Err(reason);
        }
        return Ok(());
    }
    commit_ranges(membership, ranges)?;
    // Without replication there is nothing to adopt: the zone is done, and its removal
    // from the zone table is the progress a new leader continues from.
    let remove = Command::ZoneRemove {
        owner: request.owner,
        zone: request.zone,
    };
    let writer = Arc::clone(membership);
    let removed = membership
        .net()
        .runtime()
        .block_on(async move { writer.write(remove).await });
    if let Err(error) = removed {
        tracing::warn!(owner = %request.owner, zone = request.zone, %error, "zone removal not committed; the leader retries it");
    }
    Ok(())
}

/// Goes on settling an adopted zone in the background (bounded) after the first rounds
/// failed.
fn spawn_settle_retries(
    membership: &Arc<Membership>,
    ranges: Vec<CidRange>,
    request: RecoverRequest,
) {
    let membership = Arc::clone(membership);
    let spawned = std::thread::Builder::new()
        .name(format!("settle-{}-{}", request.owner.0, request.zone))
        .spawn(move || {
            match settle(&membership, &ranges, &request, OWNER_COMMIT_RETRIES_MAX) {
                Ok(()) => tracing::info!(owner = %request.owner, zone = request.zone, "adopted zone settled after retries"),
                Err(reason) => tracing::error!(owner = %request.owner, zone = request.zone, %reason, "adopted zone never settled: its CIDs may still route to its failed owner"),
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "could not start the settling retries");
    }
}

/// Re-replication in the background, after availability (of every zone of the failed
/// peer, as far as the leader's table shows within a bound): only the added backups need
/// the zone; the surviving ones hold its log.
fn spawn_rereplication(
    service: &Arc<ChunkService>,
    membership: &Arc<Membership>,
    request: RecoverRequest,
    adoption: Adoption,
    chunks: u64,
) {
    service.rereplication_begins(chunks);
    let counter = Arc::clone(service);
    let service = Arc::clone(service);
    let watcher = Arc::clone(membership);
    let spawned = std::thread::Builder::new()
        .name(format!("rereplicate-{}-{}", request.owner.0, request.zone))
        .spawn(move || {
            let held = hold_while_recovering(&watcher, request.owner);
            let begun = Instant::now();
            match service.copy_adopted(&adoption, chunks) {
                Ok(copied) => tracing::info!(
                    owner = %request.owner,
                    zone = request.zone,
                    copied,
                    added = ?adoption.added,
                    held_ms = held.as_millis() as u64,
                    ms = begun.elapsed().as_millis() as u64,
                    "adopted zone copied to its new backups"
                ),
                Err(error) => tracing::warn!(
                    owner = %request.owner,
                    zone = request.zone,
                    %error,
                    "copying an adopted zone to its new backups failed"
                ),
            }
        });
    if let Err(error) = spawned {
        counter.rereplication_cancelled(chunks);
        tracing::warn!(%error, "could not start re-replication");
    }
}

/// Waits until the superpeer leader's recovery table shows no zone of `owner` pending or
/// running, at most [`REREPLICATION_HOLD_MAX`] (also when no leader answers); returns how
/// long it waited.
fn hold_while_recovering(membership: &Arc<Membership>, owner: NodeId) -> std::time::Duration {
    let started = Instant::now();
    while started.elapsed() < REREPLICATION_HOLD_MAX {
        let reader = Arc::clone(membership);
        let status = membership.net().runtime().block_on(async move {
            reader
                .recovery_status(std::time::Duration::from_millis(500))
                .await
        });
        let recovering = status.is_ok_and(|status| {
            status.zones.iter().any(|z| {
                z.owner == owner
                    && matches!(z.state, RecoveryState::Pending | RecoveryState::Running)
            })
        });
        if !recovering {
            break;
        }
        std::thread::sleep(REREPLICATION_HOLD_POLL);
    }
    started.elapsed()
}

/// Commits the ranges' ownership and then `ZoneOwned` for an adopted zone, in up to
/// `attempts` rounds [`OWNER_COMMIT_PAUSE`] apart.
fn settle(
    membership: &Arc<Membership>,
    ranges: &[CidRange],
    request: &RecoverRequest,
    attempts: usize,
) -> Result<(), String> {
    let owned = Command::ZoneOwned {
        owner: request.owner,
        zone: request.zone,
        holder: membership.node_id(),
    };
    let mut ranges_done = false;
    let mut last = String::new();
    for attempt in 0..attempts.max(1) {
        if attempt > 0 {
            std::thread::sleep(OWNER_COMMIT_PAUSE);
        }
        if !ranges_done {
            match commit_ranges(membership, ranges) {
                Ok(()) => ranges_done = true,
                Err(reason) => {
                    last = reason;
                    continue;
                }
            }
        }
        let writer = Arc::clone(membership);
        let command = owned.clone();
        match membership
            .net()
            .runtime()
            .block_on(async move { writer.write(command).await })
        {
            Ok(_) => return Ok(()),
            Err(error) => last = format!("committing {owned}: {error}"),
        }
    }
    Err(last)
}

/// The backups of `owner`'s zone `zone` in the zone table, first backup first.
fn zone_backups(
    membership: &Arc<Membership>,
    owner: NodeId,
    zone: u32,
) -> Result<Vec<NodeId>, String> {
    let reader = Arc::clone(membership);
    let reply = membership
        .net()
        .runtime()
        .block_on(async move { reader.request(MetaRequest::Zones(owner)).await });
    match reply {
        Ok(MetaReply::Zones(zones)) => zones
            .into_iter()
            .find(|(number, _)| *number == zone)
            .map(|(_, backups)| backups)
            .ok_or_else(|| format!("zone {zone} of {owner} is no longer in the zone table")),
        Ok(other) => Err(format!(
            "reading the zone table: unexpected reply {other:?}"
        )),
        Err(error) => Err(format!("reading the zone table: {error}")),
    }
}

/// Commits `SetOwner { owner: me }` for every range, several in flight at once.
fn commit_ranges(membership: &Arc<Membership>, ranges: &[CidRange]) -> Result<(), String> {
    use futures_util::stream::{self, StreamExt};
    let me = membership.node_id();
    let commands: Vec<Command> = ranges
        .iter()
        .map(|range| Command::SetOwner {
            creator: range.creator,
            first: range.first,
            last: range.last,
            owner: me,
        })
        .collect();
    let writer = Arc::clone(membership);
    let results: Vec<Result<(), String>> = membership.net().runtime().block_on(async move {
        stream::iter(commands)
            .map(|command| {
                let writer = Arc::clone(&writer);
                async move {
                    writer
                        .write(command.clone())
                        .await
                        .map(|_| ())
                        .map_err(|error| format!("committing {command:?}: {error}"))
                }
            })
            .buffer_unordered(OWNER_COMMITS_IN_FLIGHT)
            .collect()
            .await
    });
    results.into_iter().collect()
}

/// Serves one [`myriad_proto::types::RECOVER`] request on a fresh thread (recovery blocks for as long as
/// the zone takes to read).
pub fn serve_recover(
    backup: Arc<BackupService>,
    service: Arc<ChunkService>,
    membership: Arc<Membership>,
    mut incoming: myriad_net::Incoming,
) {
    let Some(responder) = incoming.take_responder() else {
        return;
    };
    let payload = incoming.payload.clone();
    let spawned = std::thread::Builder::new()
        .name("recover-zone".to_owned())
        .spawn(move || {
            let reply = match RecoverRequest::decode(payload) {
                Ok(request) => {
                    // The leader asks only after committing the owner's failure; the
                    // `NodeFailed` event may still be on its way. Fence the owner before
                    // reading its zone, so that no late replication message of it (it may be
                    // only paused or cut off) lands in the zone after it was read.
                    membership
                        .net()
                        .fence(request.owner);
                    // A chained recovery: the failed holder of the adopted zone writes to
                    // the same log (under the owner's name); fence it as well.
                    if let Some(holder) = request.holder {
                        membership.net().fence(holder);
                    }
                    tracing::info!(owner = %request.owner, zone = request.zone, holder = ?request.holder, "recovering a zone");
                    restore_zone(&backup, &service, &membership, request)
                }
                Err(error) => RecoverReply::Failed(format!("undecodable request: {error}")),
            };
            if let Err(error) = responder.respond(reply.encode()) {
                tracing::warn!(%error, "recover reply not sent");
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "could not start a recovery thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_backup_log::{LogConfig, LogEngine, MemStorage};
    use myriad_mem::MemoryConfig;
    use myriad_replication::backup::log_zone;
    use myriad_replication::BackupConfig;
    use myriad_types::NodeId;

    #[test]
    fn a_zone_comes_back_with_latest_versions_and_without_removed_chunks() {
        let engine = Arc::new(
            LogEngine::open(LogConfig::small_for_tests(), Arc::new(MemStorage::new())).unwrap(),
        );
        let owner = NodeId(3);
        let zone = log_zone(owner, 1).unwrap();
        engine.create_zone(zone).unwrap();
        let cid = |lid: u64| ChunkId::new(owner, lid).unwrap();
        for lid in 1..=500u64 {
            engine
                .append(zone, cid(lid).raw(), format!("v0-{lid}").as_bytes())
                .unwrap();
        }
        for lid in (1..=500u64).step_by(5) {
            engine
                .append(zone, cid(lid).raw(), format!("v1-{lid}").as_bytes())
                .unwrap();
        }
        for lid in (2..=500u64).step_by(7) {
            engine.remove(zone, cid(lid).raw()).unwrap();
        }
        let backup = BackupService::new(engine, BackupConfig::default()).unwrap();
        let mem = MemoryManager::new(MemoryConfig {
            node_id: NodeId(9),
            region_bytes: 1 << 20,
            ..MemoryConfig::default()
        })
        .unwrap();
        // A stale copy under a recovered CID is replaced.
        mem.create_with_id(cid(1), b"stale").unwrap();
        let request = RecoverRequest::new(owner, 1);
        let mut restored = insert_recovered(&backup, &mem, &request).unwrap();
        assert_eq!(restored.failed, 0);
        let removed = |lid: u64| lid >= 2 && (lid - 2).is_multiple_of(7);
        let live: Vec<u64> = (1..=500u64).filter(|&lid| !removed(lid)).collect();
        assert_eq!(restored.chunks, live.len() as u64);
        for lid in 1..=500u64 {
            let got = mem.read_with(cid(lid), |bytes| bytes.to_vec());
            if removed(lid) {
                assert!(got.is_err(), "removed chunk {lid} came back");
            } else {
                let version = if (lid - 1).is_multiple_of(5) { 1 } else { 0 };
                assert_eq!(got.unwrap(), format!("v{version}-{lid}").into_bytes());
            }
        }
        // The ranges cover exactly the live CIDs.
        let ranges = restored.ranges();
        let covered: u64 = ranges
            .iter()
            .map(|range| range.last - range.first + 1)
            .sum();
        assert_eq!(covered, live.len() as u64);
        assert!(ranges.iter().all(|range| range.creator == owner));
        assert!(ranges
            .iter()
            .all(|range| (range.first..=range.last).all(|lid| !removed(lid))));
    }

    /// A migration's orphan (a copy at the zone's writer whose ownership stayed at the
    /// source) is neither stored nor taken over, and never replaces the owner's own copy
    /// when the owner is the restorer (simulator seed 63).
    #[test]
    fn chunks_the_directory_routes_elsewhere_are_left_out() {
        let engine = Arc::new(
            LogEngine::open(LogConfig::small_for_tests(), Arc::new(MemStorage::new())).unwrap(),
        );
        let (writer, source) = (NodeId(4), NodeId(1));
        let zone = log_zone(writer, 0).unwrap();
        engine.create_zone(zone).unwrap();
        let own = |lid: u64| ChunkId::new(writer, lid).unwrap();
        let foreign = |lid: u64| ChunkId::new(source, lid).unwrap();
        for lid in 1..=3 {
            engine.append(zone, own(lid).raw(), b"writer's").unwrap();
        }
        // 1:3 was inserted by a migration that never committed; 1:4 by one that did.
        engine.append(zone, foreign(3).raw(), b"stale").unwrap();
        engine.append(zone, foreign(4).raw(), b"moved").unwrap();
        let backup = BackupService::new(engine, BackupConfig::default()).unwrap();
        let mem = MemoryManager::new(MemoryConfig {
            node_id: source,
            region_bytes: 1 << 20,
            ..MemoryConfig::default()
        })
        .unwrap();
        // The restorer is the source itself: its own copy of 1:3 must stay.
        mem.create_with_id(foreign(3), b"current").unwrap();
        let routes = Routes::from_trees(vec![
            (
                source,
                vec![myriad_meta::LookupRange {
                    creator: source,
                    first: 4,
                    last: 4,
                    owner: writer,
                }],
            ),
            (writer, Vec::new()),
        ]);
        assert!(routes.restores(own(2), writer));
        assert!(routes.restores(foreign(4), writer));
        assert!(!routes.restores(foreign(3), writer));
        // A creator whose tree was not read is kept, as before routes existed.
        assert!(routes.restores(ChunkId::new(NodeId(7), 1).unwrap(), writer));
        let keep = |cid: ChunkId| routes.restores(cid, writer);
        let request = RecoverRequest::new(writer, 0);
        let mut restored = insert_recovered_where(&backup, &mem, &request, &keep).unwrap();
        assert_eq!((restored.chunks, restored.skipped), (4, 1));
        assert_eq!(
            mem.read_with(foreign(3), |bytes| bytes.to_vec()).unwrap(),
            b"current".to_vec()
        );
        assert_eq!(
            mem.read_with(foreign(4), |bytes| bytes.to_vec()).unwrap(),
            b"moved".to_vec()
        );
        let skipped = restored.skipped_ranges();
        assert_eq!(
            skipped,
            vec![CidRange {
                creator: source,
                first: 3,
                last: 3
            }]
        );
        let taken: u64 = restored
            .ranges()
            .iter()
            .map(|range| range.last - range.first + 1)
            .sum();
        assert_eq!(taken, 4);
    }
}
