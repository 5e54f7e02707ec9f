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

use myriad_types::{ChunkId, NodeId};

use super::zones::{Registration, ZoneState};
use super::{Inner, State};
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
        Ok(self.adopt_registered(plan, ranges, content))
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
                let alive: HashSet<NodeId> = candidates.iter().map(|c| c.node).collect();
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
        let mut overlapping = 0u64;
        for &(first, last) in ranges {
            if state.tree.add_range(first, last, local).is_ok() {
                continue;
            }
            // Some CIDs already have a zone here (e.g. own chunks that had migrated to the
            // failed peer): a short range is taken CID by CID around them.
            let span = last.raw().saturating_sub(first.raw());
            if span >= ADOPT_SPLIT_SPAN_MAX {
                overlapping += span + 1;
                continue;
            }
            for raw in first.raw()..=last.raw() {
                let cid = ChunkId::from_raw(raw);
                if state.tree.add_range(cid, cid, local).is_err() {
                    overlapping += 1;
                }
            }
        }
        if overlapping > 0 {
            tracing::warn!(%owner, zone, overlapping, "CIDs of an adopted zone already had a zone here; their changes go to that zone");
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
        Adoption {
            zone: local.0,
            owner,
            log_zone: zone,
            backups,
            added,
        }
    }
}
