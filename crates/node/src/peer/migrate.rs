//! Migration of a range of chunks from this peer to another ([`myriad_proto::migrate`]).
//!
//! # Job
//! [`migrate`] write-locks the chunks of the range, copies them to the target with an
//! insert, commits the new owner through the superpeers, then drops the local copies.
//!
//! # Invariants
//! - Only a range this peer owns (checked at both ends) moves, to an alive member other
//!   than this peer, at most [`MIGRATE_CHUNKS_MAX`] CIDs at once.
//! - The write locks are held until the new owner is committed and recorded, so no put
//!   lands on the old copy after it was copied (it is answered `NotOwner`).
//! - A failure at any step before the commit leaves this peer the owner with its copies.
//! - The target acknowledges the copies only once its backups hold them (durability
//!   `replicated`), so a new owner killed right after the migration loses nothing.
//!
//! # Who calls it
//! The MIGRATE handler of [`super::dispatch`], on a migration thread of its own (it blocks);
//! the simulator (`myriad_testing::sim`) calls [`lock_and_copy`] and drives the other
//! steps over its simulated network.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_mem::MemoryManager;
use myriad_membership::Membership;
use myriad_meta::Command;
use myriad_proto::chunk::{ChunkReply, ChunkRequest};
use myriad_proto::migrate::{MigrateReply, MigrateRequest};
use myriad_proto::types;
use myriad_types::{ChunkId, NodeId};

use super::service::ChunkService;

/// Most chunks one migration request may move.
pub const MIGRATE_CHUNKS_MAX: u64 = 1 << 20;

/// How long migration waits for each chunk's write lock.
const MIGRATE_LOCK_WAIT: Duration = Duration::from_secs(2);
/// How long the target may take to store the copies.
const MIGRATE_INSERT_TIMEOUT: Duration = Duration::from_secs(30);

/// Moves `request.first..=request.last` (CIDs of one creator that this peer owns) to
/// `request.to`: write-lock the chunks, copy them to the target with an insert, commit the
/// new owner, then drop the local copies. Runs on a migration thread (it blocks).
///
/// A put that passed the ownership check before the locks were taken and waits on a lock
/// writes the old copy after the unlock; since the new owner is committed to the service
/// (`set_owner`) before the unlock, that put sees the ownership change and is answered
/// `NotOwner` (the client retries at the new owner) instead of being acknowledged and
/// lost with the old copy (`ChunkService` put path; test
/// `a_put_waiting_on_a_migrating_chunk_is_refused_not_lost`; a write-at likewise). A
/// remove or resize waiting on a lock is not covered yet.
pub(crate) fn migrate(
    service: &ChunkService,
    membership: &Arc<Membership>,
    request: &MigrateRequest,
) -> MigrateReply {
    if let Err(reason) = check_request(service, membership, request) {
        return MigrateReply::Failed(reason);
    }
    let (first, last) = (request.first.local_id(), request.last.local_id());
    let creator = request.first.creator();
    let mem = service.memory();
    // Chunk reads are served inline only while no lock is held; this migration's locks
    // are not tracked by the service, so it switches inline serving off meanwhile.
    let _inline_off = service.migration_guard();
    let mut locked = Vec::new();
    let unlock_all = |locked: &[ChunkId]| {
        for &cid in locked {
            let _ = mem.unlock_write(cid);
        }
    };
    let items = match lock_and_copy(mem, creator, first, last, &mut locked) {
        Ok(items) => items,
        Err(reason) => {
            unlock_all(&locked);
            return MigrateReply::Failed(reason);
        }
    };
    let moved = items.len() as u64;
    let sizes: Vec<usize> = items.iter().map(|(_, data)| data.len()).collect();
    if let Err(reason) = store_at_target(membership, request, items) {
        unlock_all(&locked);
        return MigrateReply::Failed(reason);
    }
    let command = Command::SetOwner {
        creator,
        first,
        last,
        owner: request.to,
    };
    let writer = Arc::clone(membership);
    let committed = membership
        .net()
        .runtime()
        .block_on(async move { writer.write(command).await });
    if let Err(error) = committed {
        unlock_all(&locked);
        // The target holds copies nobody routes to; they are harmless and overwritten by a
        // later migration of the same range.
        return MigrateReply::Failed(format!("committing the new owner: {error}"));
    }
    // The old copies are dropped below: the new owner must be another node (checked on
    // entry), or the range would stay routed here with its chunks gone.
    assert_ne!(
        request.to,
        service.node(),
        "a migration's target is another peer"
    );
    service.set_owner(creator, first, last, request.to);
    unlock_all(&locked);
    drop_old_copies(service, locked, sizes);
    MigrateReply::Moved(moved)
}

/// Refuses what may not migrate: a node declared failed, a target that is this peer or
/// no alive member, too many CIDs, a range this peer does not own (at either end).
fn check_request(
    service: &ChunkService,
    membership: &Membership,
    request: &MigrateRequest,
) -> Result<(), String> {
    let me = service.node();
    if service.is_declared_failed() {
        return Err("this node was declared failed".to_owned());
    }
    if request.to == me {
        return Err("the target is this peer".to_owned());
    }
    if !membership.is_alive(request.to) {
        return Err(format!("target {} is not an alive member", request.to));
    }
    let (first, last) = (request.first.local_id(), request.last.local_id());
    let creator = request.first.creator();
    if last - first >= MIGRATE_CHUNKS_MAX {
        return Err(format!("at most {MIGRATE_CHUNKS_MAX} CIDs per migration"));
    }
    for lid in [first, last] {
        if let Some(cid) = ChunkId::new(creator, lid) {
            if service.owner_of(cid) != me {
                return Err(format!("{cid} is not owned by this peer"));
            }
        }
    }
    Ok(())
}

/// Write-locks every existing chunk of `creator`'s `first..=last` (recorded in `locked`,
/// which the caller unlocks on failure) and reads its bytes: a migration's first step,
/// public for the deterministic simulator, which drives the steps itself.
pub fn lock_and_copy(
    mem: &MemoryManager,
    creator: NodeId,
    first: u64,
    last: u64,
    locked: &mut Vec<ChunkId>,
) -> Result<Vec<(ChunkId, Bytes)>, String> {
    let mut items = Vec::new();
    for lid in first..=last {
        let Some(cid) = ChunkId::new(creator, lid) else {
            continue;
        };
        if !mem.exists(cid) {
            continue;
        }
        mem.lock_write(cid, MIGRATE_LOCK_WAIT)
            .map_err(|error| format!("locking {cid}: {error}"))?;
        locked.push(cid);
        let size = mem.size(cid).unwrap_or(0);
        let mut data = vec![0u8; size];
        let length = mem
            .get_locked(cid, &mut data)
            .map_err(|error| format!("reading {cid}: {error}"))?;
        data.truncate(length);
        items.push((cid, Bytes::from(data)));
    }
    Ok(items)
}

/// Stores the copies at the target with one insert, acknowledged once the target's
/// backups hold them; every item must be stored.
fn store_at_target(
    membership: &Membership,
    request: &MigrateRequest,
    items: Vec<(ChunkId, Bytes)>,
) -> Result<(), String> {
    // Replicated: the copies are in the target's backups before the old owner's backups
    // drop theirs, so the new owner may fail right after the migration without a loss.
    let insert = ChunkRequest::Insert {
        durability: myriad_proto::chunk::DURABILITY_REPLICATED,
        items,
    };
    let reply = membership.net().request_blocking(
        request.to,
        types::CHUNK,
        insert.encode(),
        MIGRATE_INSERT_TIMEOUT,
    );
    match reply.map(ChunkReply::decode) {
        Ok(Ok(ChunkReply::Statuses(statuses))) => statuses
            .iter()
            .find_map(|status| status.as_ref().err().cloned())
            .map_or(Ok(()), |error| {
                Err(format!("the target refused a chunk: {error}"))
            }),
        Ok(Ok(other)) => Err(format!("unexpected reply from the target: {other:?}")),
        Ok(Err(error)) => Err(format!("malformed reply from the target: {error}")),
        Err(error) => Err(format!("the target did not answer: {error}")),
    }
}

/// Drops the migrated chunks' old copies (unlocked, owned by the target by now); the
/// new owner replicates its copy, this peer's backups drop theirs.
fn drop_old_copies(service: &ChunkService, locked: Vec<ChunkId>, sizes: Vec<usize>) {
    let mem = service.memory();
    for (cid, size) in locked.into_iter().zip(sizes) {
        // The CID lives on at the target: its local ID must never be handed out again here.
        if let Err(error) = mem.remove_moved(cid) {
            tracing::warn!(%cid, %error, "could not drop a migrated chunk's old copy");
            continue;
        }
        if let Err(error) = service.replicate_removed(cid, size) {
            tracing::warn!(%cid, %error, "backups of a migrated chunk's old copy not removed");
        }
    }
}
