//! Adopting a failed peer's zone (issue 6): its backups become the surviving ones plus new
//! ones, the order is registered under the zone's log identity `(owner, zone)`, and its CID
//! ranges join this master's zone tree under a local zone number. See the
//! [module docs](super) ("Adoption").
//!
//! Invariants: the registration commits before the ranges enter the zone tree, so no change
//! of an adopted chunk goes out before the cluster knows the zone's backups; adopting the
//! same `(owner, zone)` again (a retried recovery) registers again and returns the zone
//! adopted before. Called by the node's recovery, from a thread that runs no async tasks.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use myriad_placement::Candidate;
use myriad_types::{ChunkId, NodeId};

use super::zones::{Registration, ZoneState};
use super::{Inner, State};
use crate::wire::Op;
use crate::ReplicaError;

/// Ranges of an adopted zone up to this many CIDs are split around CIDs that already have
/// a zone here; longer overlapping ranges stay where they are.
pub(super) const ADOPT_SPLIT_SPAN_MAX: u64 = 1 << 16;

/// A zone taken over by [`Replicator::adopt_zone`](super::Replicator::adopt_zone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    /// The zone's number in this master's zone tree (local bookkeeping only).
    pub zone: u32,
    /// The failed peer whose zone it was (its log owner).
    pub owner: NodeId,
    /// The zone's number within `owner` (its log zone on the backups).
    pub log_zone: u32,
    /// Its backups now, in order: the surviving ones first, then the added ones.
    pub backups: Vec<NodeId>,
    /// The backups that were added (they receive the zone by [`Replicator::copy_adopted`]).
    ///
    /// [`Replicator::copy_adopted`]: super::Replicator::copy_adopted
    pub added: Vec<NodeId>,
}

/// What a restorer holds of a zone it adopts ([`Replicator::adopt_zone`](super::Replicator::adopt_zone)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Restored {
    /// Chunks restored.
    pub chunks: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// The zone's position (see [`crate::wire`]'s "Zone positions") that the restored
    /// chunks reflect: the adopter numbers the zone's changes on from it.
    pub position: u64,
}

/// The backups an adoption gives a zone, chosen before its registration
/// ([`Replicator::plan_adoption`](super::Replicator::plan_adoption)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptionPlan {
    /// The failed peer whose zone it is (its log owner).
    pub owner: NodeId,
    /// The zone's number within `owner`.
    pub log_zone: u32,
    /// The backups to register, in order: the surviving ones first, then the added ones.
    pub backups: Vec<NodeId>,
    /// The backups that were added.
    pub added: Vec<NodeId>,
    /// The local zone, when this master adopted the zone before (a retried recovery).
    existing: Option<u32>,
}

impl Inner {
    pub(super) fn adopt(
        self: &Arc<Self>,
        owner: NodeId,
        zone: u32,
        old_backups: &[NodeId],
        ranges: &[(ChunkId, ChunkId)],
        content: Restored,
    ) -> Result<Adoption, ReplicaError> {
        let deadline = self.io.now() + self.config.wait_timeout;
        let plan = self.plan_adoption(owner, zone, old_backups)?;
        // The registration (ZoneAdopt) must commit before this master owns the chunks.
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let future = self.registry.register(owner, zone, plan.backups.clone());
        self.io.spawn(Box::pin(async move {
            let _ = done_tx.send(future.await);
        }));
        let wait = deadline.saturating_duration_since(self.io.now());
        match done_rx.recv_timeout(wait) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                return Err(ReplicaError::Registration {
                    zone,
                    reason: error.0,
                })
            }
            Err(_) => {
                return Err(ReplicaError::Timeout {
                    what: "zone adoption",
                    waited: self.config.wait_timeout,
                    missing: Vec::new(),
                })
            }
        }
        let mut adoption = self.adopt_registered(plan, ranges, content);
        self.replace_gone_backups(&mut adoption);
        Ok(adoption)
    }

    /// Replaces the backups of a just adopted zone that are no longer alive in this
    /// node's view. The plan chose them from the view before the registration; a backup
    /// declared failed in between was replaced in every zone this master had then, not in
    /// this one, which was not in the table yet. Its stream would never acknowledge, and
    /// the zone would wait for the unreachable timeout. (A failure declared after the
    /// zone's insertion reaches it through the event, as for any zone.) `adoption` then
    /// shows the zone's backups as they are now, and `added` only those still in it (a
    /// replacement's copy is started by the replacement).
    fn replace_gone_backups(self: &Arc<Self>, adoption: &mut Adoption) {
        let alive = nodes_of(&self.candidates.candidates());
        // Without a view of the live peers, keep them (as `plan_adoption` does).
        if alive.is_empty() {
            return;
        }
        let gone: Vec<NodeId> = adoption
            .backups
            .iter()
            .copied()
            .filter(|b| !alive.contains(b))
            .collect();
        if gone.is_empty() {
            return;
        }
        for &node in &gone {
            tracing::info!(zone = adoption.zone, %node, "an adopted zone's backup failed before the adoption; replacing it");
            self.rebackup(Some(node));
        }
        adoption.added.retain(|b| !gone.contains(b));
        if let Some(z) = self.state.lock().zones.get(&adoption.zone) {
            adoption.backups = z.backups.clone();
        }
    }

    /// Chooses the backups of `owner`'s zone `zone` for its adoption: the alive ones of
    /// `old_backups` plus new ones from the placement (or the ones of an earlier adoption
    /// of the zone). Changes nothing.
    pub(super) fn plan_adoption(
        &self,
        owner: NodeId,
        zone: u32,
        old_backups: &[NodeId],
    ) -> Result<AdoptionPlan, ReplicaError> {
        if self.shutdown.load(Ordering::Acquire) {
            return Err(ReplicaError::Shutdown);
        }
        if self.config.replication == 0 {
            return Err(ReplicaError::InvalidConfig(
                "a master without replication adopts no zones",
            ));
        }
        let me = self.config.node;
        let existing = {
            let state = self.state.lock();
            state
                .zones
                .iter()
                .find(|(_, z)| z.log == Some((owner, zone)))
                .map(|(&local, z)| (local, z.backups.clone()))
        };
        let (backups, added) = match &existing {
            Some((_, backups)) => (backups.clone(), Vec::new()),
            None => {
                let mut candidates = self.candidates.candidates();
                candidates.retain(|c| c.node != owner && c.node != me);
                let alive = nodes_of(&candidates);
                let others = old_backups
                    .iter()
                    .copied()
                    .filter(|&b| b != owner && b != me);
                // Without a view of the live peers, keep every surviving backup rather
                // than none (a dead one is replaced later like any failed backup).
                let kept: Vec<NodeId> = if alive.is_empty() {
                    others.collect()
                } else {
                    others.filter(|b| alive.contains(b)).collect()
                };
                let mut state = self.state.lock();
                let State { placement, rng, .. } = &mut *state;
                let backups = placement.extend(&kept, &candidates, rng);
                let added: Vec<NodeId> = backups
                    .iter()
                    .copied()
                    .filter(|b| !kept.contains(b))
                    .collect();
                (backups, added)
            }
        };
        Ok(AdoptionPlan {
            owner,
            log_zone: zone,
            backups,
            added,
            existing: existing.map(|(local, _)| local),
        })
    }

    /// Completes an adoption whose backups (`plan.backups`) the cluster registered: the
    /// zone's `ranges` join the zone tree, its changes number on from
    /// `content.position`, and each added backup gets the zone's reset.
    pub(super) fn adopt_registered(
        &self,
        plan: AdoptionPlan,
        ranges: &[(ChunkId, ChunkId)],
        content: Restored,
    ) -> Adoption {
        let Restored {
            chunks,
            bytes,
            position,
        } = content;
        let AdoptionPlan {
            owner,
            log_zone: zone,
            backups,
            added,
            existing,
        } = plan;
        let mut state = self.state.lock();
        if let Some(local) = existing {
            if let Some(z) = state.zones.get_mut(&local) {
                z.registration = Registration::Done;
                z.registration_serial += 1;
                let added = z.resyncs.iter().map(|r| r.target).collect();
                return Adoption {
                    zone: local,
                    owner,
                    log_zone: zone,
                    backups: z.backups.clone(),
                    added,
                };
            }
        }
        let local = state.tree.new_zone();
        // CID ranges that already had a zone here and stay in it.
        let mut elsewhere: Vec<(ChunkId, ChunkId)> = Vec::new();
        for &(first, last) in ranges {
            if state.tree.add_range(first, last, local).is_ok() {
                continue;
            }
            // Some CIDs already have a zone here (e.g. own chunks that had migrated to the
            // failed peer): a short range is taken CID by CID around them.
            let span = last.raw().saturating_sub(first.raw());
            if span >= ADOPT_SPLIT_SPAN_MAX {
                elsewhere.push((first, last));
                continue;
            }
            for raw in first.raw()..=last.raw() {
                let cid = ChunkId::from_raw(raw);
                if state.tree.add_range(cid, cid, local).is_err() {
                    elsewhere.push((cid, cid));
                }
            }
        }
        if chunks > 0 {
            state.tree.add_usage_many(local, chunks, bytes);
        }
        state.zones.insert(
            local.0,
            ZoneState {
                log: Some((owner, zone)),
                backups: backups.clone(),
                registration: Registration::Done,
                registration_serial: 0,
                resyncs: Vec::new(),
                position,
            },
        );
        // Each added backup starts the zone empty, at its current position, before any
        // change of it reaches that backup.
        for &target in &added {
            self.start_copy(&mut state, local.0, target);
        }
        self.progress.notify_all();
        drop(state);
        if !elsewhere.is_empty() {
            self.move_restored_elsewhere(local.0, &elsewhere, (owner, zone));
        }
        Adoption {
            zone: local.0,
            owner,
            log_zone: zone,
            backups,
            added,
        }
    }

    /// The restored chunks of `ranges` that stay in another zone of this master (their
    /// CIDs had a zone here already): their changes go to that zone from now on, so that
    /// zone's backups get each one's restored value (they may hold its removal, e.g. of
    /// an own chunk that had migrated to the failed peer), and the adopted zone `local`
    /// (log `(owner, zone)`) drops it. Otherwise the adopted zone's logs would keep a copy
    /// that its copies to added backups leave out (so its backups would differ at one
    /// position) and that a later recovery of the zone would bring back.
    fn move_restored_elsewhere(
        &self,
        local: u32,
        ranges: &[(ChunkId, ChunkId)],
        (owner, zone): (NodeId, u32),
    ) {
        // Read without the state lock (the `ChunkSource` contract). Nothing changes these
        // chunks meanwhile: the restorer owns them only after the adoption.
        let mut restored: Vec<(ChunkId, Bytes)> = Vec::new();
        let mut locked = Vec::new();
        for &(first, last) in ranges {
            locked.extend(
                self.source
                    .for_each_in_range(first, last, &mut |cid, data| {
                        restored.push((cid, Bytes::copy_from_slice(data)));
                        true
                    }),
            );
        }
        if !locked.is_empty() {
            tracing::warn!(%owner, zone, locked = locked.len(), "restored chunks that stay in another zone were locked; the adopted zone keeps their copies");
        }
        let mut state = self.state.lock();
        let mut shipping: Vec<NodeId> = Vec::new();
        let (adopted_owner, adopted_zone) = match state.zones.get(&local) {
            Some(z) => z.key(local),
            None => return,
        };
        let moved = restored.len();
        for (cid, data) in restored {
            let Some(stays) = state.tree.zone_of(cid).filter(|z| z.0 != local) else {
                continue;
            };
            let Some(z) = state.zones.get(&stays.0) else {
                continue;
            };
            let (stay_owner, stay_zone) = z.key(stays.0);
            state.tree.add_usage(stays, data.len() as u64);
            let put = Op::Put {
                owner: stay_owner,
                zone: stay_zone,
                cid: cid.raw(),
                data,
                seq: 0,
            };
            let remove = Op::Remove {
                owner: adopted_owner,
                zone: adopted_zone,
                cid: cid.raw(),
                seq: 0,
            };
            let targets = self.queue_on_zone(&mut state, stays.0, cid, put, false);
            let more = self.queue_on_zone(&mut state, local, cid, remove, false);
            for target in targets.into_iter().chain(more) {
                if !shipping.contains(&target.backup) {
                    shipping.push(target.backup);
                }
            }
        }
        let now = self.io.now();
        for backup in shipping {
            self.ship_or_wake(&mut state, backup, now, true);
        }
        tracing::warn!(%owner, zone, moved, "CIDs of an adopted zone already had a zone here; their changes go to that zone");
    }

    /// See [`Replicator::forget_in_adopted`](super::Replicator::forget_in_adopted).
    pub(super) fn forget_in_zone(&self, local: u32, ranges: &[(ChunkId, ChunkId)]) {
        let mut state = self.state.lock();
        let Some((owner, zone)) = state.zones.get(&local).map(|z| z.key(local)) else {
            return;
        };
        let mut shipping: Vec<NodeId> = Vec::new();
        for &(first, last) in ranges {
            for raw in first.raw()..=last.raw() {
                let cid = ChunkId::from_raw(raw);
                if state.tree.zone_of(cid).is_some_and(|z| z.0 != local) {
                    continue;
                }
                let remove = Op::Remove {
                    owner,
                    zone,
                    cid: raw,
                    seq: 0,
                };
                for target in self.queue_on_zone(&mut state, local, cid, remove, false) {
                    if !shipping.contains(&target.backup) {
                        shipping.push(target.backup);
                    }
                }
            }
        }
        let now = self.io.now();
        for backup in shipping {
            self.ship_or_wake(&mut state, backup, now, true);
        }
    }
}

/// The nodes of `candidates`.
fn nodes_of(candidates: &[Candidate]) -> HashSet<NodeId> {
    candidates.iter().map(|c| c.node).collect()
}
