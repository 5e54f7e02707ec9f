//! Migrations in the workload: a peer moves one chunk it owns to another peer while the
//! clients run.
//!
//! Job: [`World::migrate`] runs the production migration's steps over the simulated
//! network: the production [`lock_and_copy`] write-locks the chunk and reads it at the
//! source; the copy goes to the target as a production `Insert` with durability
//! `replicated` (the target stores it with its chunk service, adds it to its own zone,
//! and answers once its backups applied it); on the answer the source commits `SetOwner`
//! to the target, records the new owner, unlocks, drops its copy
//! ([`myriad_mem::MemoryManager::remove_moved`]) and replicates the removal to its
//! zone's backups. A source that fails or times out meanwhile unlocks and keeps the
//! chunk.
//!
//! Invariants: one migration at a time; only a chunk the metadata and the source's view
//! route to the source, to an alive peer that is up; the lock is held from the copy to
//! the new owner's commit, so no change lands on the old copy after it was copied.
//!
//! Callers: [`super::World`]'s event dispatch (migration events, the source's reply).

use myriad_meta::{Command, Response};
use myriad_node::peer::lock_and_copy;

use super::*;

/// A migration in flight.
#[derive(Debug)]
pub(super) struct Migration {
    source: NodeId,
    incarnation: u32,
    target: NodeId,
    cid: ChunkId,
    size: usize,
    op: u64,
}

impl World {
    /// Starts a migration at `source` (if it can): lock and copy, send the insert.
    pub(super) fn migrate(&mut self, source: NodeId) {
        let Some(index) = self.peer_index(source) else {
            return;
        };
        let now = self.queue.now();
        let stalled = self.peers[index].paused_until > now;
        let Some(parts) = self.peers[index].parts.as_ref() else {
            return;
        };
        if self.migration.is_some() || stalled || !self.alive_in_meta(source) {
            return;
        }
        let service = Arc::clone(&parts.service);
        let mut cids: Vec<ChunkId> = self
            .known
            .iter()
            .copied()
            .filter(|&cid| {
                self.meta.lookup(cid).owner == source
                    && service.owner_of(cid) == source
                    && service.memory().exists(cid)
            })
            .collect();
        cids.sort();
        cids.dedup();
        let targets: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|p| p.id != source && p.up() && p.paused_until <= now)
            .map(|p| p.id)
            .filter(|&id| self.alive_in_meta(id))
            .collect();
        if cids.is_empty() || targets.is_empty() {
            return;
        }
        let cid = cids[self.rng.index(cids.len())];
        let target = targets[self.rng.index(targets.len())];
        let mut locked = Vec::new();
        let lid = cid.local_id();
        let items = match lock_and_copy(service.memory(), cid.creator(), lid, lid, &mut locked) {
            Ok(items) if items.len() == 1 => items,
            other => {
                for &c in &locked {
                    let _ = service.memory().unlock_write(c);
                }
                self.log(format!(
                    "migration of {cid} at {source} not started: {other:?}"
                ));
                return;
            }
        };
        let size = items[0].1.len();
        let op = self.next_op;
        self.next_op += 1;
        let insert = ChunkRequest::Insert {
            durability: myriad_proto::chunk::DURABILITY_REPLICATED,
            items,
        };
        self.log(format!(
            "MIGRATE {cid} from {source} to {target}: locked and copied"
        ));
        self.migration = Some(Migration {
            source,
            incarnation: self.peers[index].incarnation,
            target,
            cid,
            size,
            op,
        });
        self.send(
            source,
            target,
            Msg::Request {
                op,
                body: insert.encode(),
            },
        );
        self.queue.after(OP_TIMEOUT, Event::MigrationTimeout { op });
    }

    /// The target's answer to the migration's insert reached the source.
    pub(super) fn migration_reply(&mut self, op: u64, body: Bytes) {
        let Some(migration) = self.take_migration(op) else {
            return;
        };
        let stored = matches!(
            ChunkReply::decode(body),
            Ok(ChunkReply::Statuses(items)) if items.iter().all(Result::is_ok)
        );
        let Some(service) = self.service_of(migration.source) else {
            return;
        };
        let mem = Arc::clone(service.memory());
        let cid = migration.cid;
        if !stored {
            let _ = mem.unlock_write(cid);
            self.log(format!("migration of {cid}: the target refused the copy"));
            return;
        }
        let lid = cid.local_id();
        let committed = self.commit(Command::SetOwner {
            creator: cid.creator(),
            first: lid,
            last: lid,
            owner: migration.target,
        });
        if committed != Response::Done {
            let _ = mem.unlock_write(cid);
            return;
        }
        service.set_owner(cid.creator(), lid, lid, migration.target);
        let _ = mem.unlock_write(cid);
        // The old copy goes, and so does its backups' (the production drop_old_copies).
        let Some(index) = self.peer_index(migration.source) else {
            return;
        };
        if let Err(e) = mem.remove_moved(cid) {
            self.fail(format!("migration of {cid}: old copy not dropped: {e}"));
            return;
        }
        // The removal goes to the zone's backups (production: `async`, nobody waits).
        if let Some(master) = self.master_at(index) {
            master.report_quietly(&[(cid, None)]);
        }
        self.pump(index);
        self.log(format!(
            "MIGRATED {cid} ({} bytes) to {}: old copy dropped",
            migration.size, migration.target
        ));
    }

    /// The migration's insert got no answer in time: the source unlocks and keeps it.
    pub(super) fn migration_timeout(&mut self, op: u64) {
        let Some(migration) = self.take_migration(op) else {
            return;
        };
        if let Some(service) = self.service_of(migration.source) {
            let _ = service.memory().unlock_write(migration.cid);
        }
        self.log(format!("migration of {} timed out", migration.cid));
    }

    /// The migration `op` if it is in flight and its source still runs the incarnation
    /// that started it (a crashed source lost it).
    fn take_migration(&mut self, op: u64) -> Option<Migration> {
        if self.migration.as_ref().is_none_or(|m| m.op != op) {
            return None;
        }
        let migration = self.migration.take()?;
        let index = self.peer_index(migration.source)?;
        (self.peers[index].incarnation == migration.incarnation).then_some(migration)
    }
}
