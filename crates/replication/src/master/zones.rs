//! Zone bookkeeping: each zone's backups, log identity and registration state, and the
//! registration of a zone's backup order with the cluster
//! ([`ZoneRegistry`](super::ZoneRegistry)). See the [module docs](super) for how writes
//! use zones.
//!
//! Invariants: a zone's `registration_serial` grows with every registration started, and
//! only the answer to the latest one sets its `registration` (a late answer for an older
//! order is ignored); a zone is placed and its registration started in the same hold of
//! the state lock that opens it. Called under the state lock by `submit`, `rebackup` and
//! `adopt`.

use std::collections::HashSet;
use std::sync::Arc;

use myriad_placement::PlacementError;
use myriad_types::NodeId;

use super::stream::Target;
use super::{Inner, State};
use crate::wire::Op;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Registration {
    Pending,
    Done,
    Failed(String),
}

#[derive(Debug)]
pub(super) struct Resync {
    pub(super) target: NodeId,
    pub(super) dirty: HashSet<u64>,
    /// The stream position of the copy's reset ([`Op::Reset`]), for a copy to a backup
    /// added to the zone (a retried copy has none).
    pub(super) reset: Option<Target>,
}

#[derive(Debug)]
pub(super) struct ZoneState {
    /// `(owner, zone)` of an adopted zone: the log zone its operations name.
    pub(super) log: Option<(NodeId, u32)>,
    pub(super) backups: Vec<NodeId>,
    pub(super) registration: Registration,
    /// Bumped on every new registration, so a late answer to an old one is ignored.
    pub(super) registration_serial: u64,
    pub(super) resyncs: Vec<Resync>,
    /// The position of the zone's last change (see [`crate::wire`]'s "Zone positions").
    pub(super) position: u64,
}

/// A zone as its operations name it: `(None, zone)` for an own zone, `(Some(owner), zone)`
/// for an adopted one.
pub(super) type ZoneKey = (Option<NodeId>, u32);

#[inline]
pub(super) fn op_key(op: &Op) -> ZoneKey {
    (op.owner(), op.zone())
}

impl ZoneState {
    #[inline]
    pub(super) fn key(&self, zone: u32) -> ZoneKey {
        match self.log {
            Some((owner, log_zone)) => (Some(owner), log_zone),
            None => (None, zone),
        }
    }
}

impl Inner {
    /// Starts a copy of `zone` to `target`, a backup just added to it: queues the reset
    /// that empties the zone there at its current position (ahead of every later change
    /// of the zone on that stream) and records the running copy. Under the state lock, in
    /// the same hold that added `target` to the zone's backups.
    pub(super) fn start_copy(&self, state: &mut State, zone: u32, target: NodeId) {
        let Some(z) = state.zones.get(&zone) else {
            return;
        };
        let (owner, log_zone) = z.key(zone);
        let reset = Op::Reset {
            owner,
            zone: log_zone,
            seq: z.position,
        };
        let at = (!self.config.bug_no_copy_reset)
            .then(|| self.push_op(state, target, reset, true, self.io.now()));
        if let Some(z) = state.zones.get_mut(&zone) {
            z.resyncs.retain(|r| r.target != target);
            z.resyncs.push(Resync {
                target,
                dirty: HashSet::new(),
                reset: at,
            });
        }
    }

    /// Starts (or restarts) the registration of `zone`'s current backups.
    pub(super) fn start_registration(self: &Arc<Self>, state: &mut State, zone: u32) {
        let Some(z) = state.zones.get_mut(&zone) else {
            return;
        };
        z.registration = Registration::Pending;
        z.registration_serial += 1;
        let serial = z.registration_serial;
        let (owner, number) = z.log.unwrap_or((self.config.node, zone));
        let future = self.registry.register(owner, number, z.backups.clone());
        let weak = Arc::downgrade(self);
        self.io.spawn(Box::pin(async move {
            let result = future.await;
            if let Some(inner) = weak.upgrade() {
                let mut state = inner.state.lock();
                if let Some(z) = state.zones.get_mut(&zone) {
                    if z.registration_serial == serial {
                        z.registration = match result {
                            Ok(()) => Registration::Done,
                            Err(e) => Registration::Failed(e.0),
                        };
                    }
                }
                inner.progress.notify_all();
                // Deferred waits may have waited for this registration.
                let finished = inner.finished_waiters(&mut state);
                drop(state);
                super::deferred::run(finished);
            }
        }));
    }

    /// Opens bookkeeping for a new zone: places it and starts its registration.
    pub(super) fn open_zone(self: &Arc<Self>, state: &mut State, zone: u32) {
        let backups = if self.config.replication == 0 {
            Vec::new()
        } else {
            let candidates = self.candidates.candidates();
            let State { placement, rng, .. } = state;
            match placement.place(&candidates, rng) {
                Ok(backups) => backups,
                Err(PlacementError::NoCandidates | PlacementError::ZeroReplication) => {
                    tracing::warn!(zone, "no backup candidates for a new zone");
                    Vec::new()
                }
            }
        };
        let no_backups_wanted = self.config.replication == 0;
        state.zones.insert(
            zone,
            ZoneState {
                log: None,
                backups,
                registration: if no_backups_wanted {
                    Registration::Done
                } else {
                    Registration::Pending
                },
                registration_serial: 0,
                resyncs: Vec::new(),
                position: 0,
            },
        );
        if !no_backups_wanted {
            self.start_registration(state, zone);
        }
    }
}
