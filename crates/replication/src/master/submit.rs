//! Reporting changes: the `on_*` calls of [`Replicator`](super::Replicator) end here. A
//! change finds (or opens) its chunk's zone, becomes one operation queued on the stream of
//! each of the zone's backups and marks its CID dirty in the zone's running copies; the
//! call then waits for the zone's registration and the acknowledgements its durability
//! asks for. See the [module docs](super) ("How a write travels", "Caller contract").
//!
//! Invariants: an operation is queued on all of its zone's backups, in backup order, in one
//! hold of the state lock (a wait for stream room comes before, and the backups are read
//! again after it), so every backup sees the changes of a chunk in one order; a no-wait
//! submission (`Mode::NoWait`) checks everything first and reports nothing when it would
//! have to wait.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use myriad_types::{ChunkId, NodeId};

use super::stream::Target;
use super::zones::Registration;
use super::{Inner, State};
use crate::wire::Op;
use crate::{Durability, ReplicaError};

/// Whether a submission may wait (for room, registration or acknowledgements). A
/// no-wait submission carries its changes, checked before anything is reported.
#[derive(Clone, Copy)]
pub(super) enum Mode<'s, 'a> {
    Wait,
    NoWait(&'s [Change<'a>]),
    /// Never waits and checks nothing first: what a blocking call would wait for (stream
    /// room, a zone's registration, a new zone's placement) the caller's deferred wait
    /// covers (`Replicator::on_changes_queued`).
    Queue,
}

/// A change reported to [`Replicator`](super::Replicator).
#[derive(Clone, Copy)]
pub(super) enum Change<'a> {
    Create(ChunkId, &'a [u8]),
    Put(ChunkId, &'a [u8]),
    Resize(ChunkId, u64, &'a [u8]),
    Remove(ChunkId, u64),
}

/// A change reported with [`Replicator::on_changes_nowait`](super::Replicator::on_changes_nowait),
/// [`Replicator::on_changes_deferred`](super::Replicator::on_changes_deferred) or
/// [`Replicator::on_changes_queued`](super::Replicator::on_changes_queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncChange<'a> {
    /// The chunk was created with `data`. Only
    /// [`Replicator::on_changes_queued`](super::Replicator::on_changes_queued) takes it
    /// at once (it may open a zone); the no-wait calls answer
    /// [`ReplicaError::WouldWait`](crate::ReplicaError::WouldWait).
    Create(ChunkId, &'a [u8]),
    /// The chunk's whole payload is now `data`.
    Put(ChunkId, &'a [u8]),
    /// The chunk, of this many bytes, was removed.
    Remove(ChunkId, u64),
}

impl<'a> AsyncChange<'a> {
    pub(super) fn change(&self) -> Change<'a> {
        match *self {
            AsyncChange::Create(cid, data) => Change::Create(cid, data),
            AsyncChange::Put(cid, data) => Change::Put(cid, data),
            AsyncChange::Remove(cid, size) => Change::Remove(cid, size),
        }
    }
}

impl Inner {
    pub(super) fn submit<'a>(
        self: &Arc<Self>,
        changes: impl Iterator<Item = Change<'a>>,
        durability: Option<Durability>,
    ) -> Result<(), ReplicaError> {
        self.submit_mode(changes, durability, Mode::Wait)
    }

    /// Whether every change could be reported at once: `async`, no zone to assign or
    /// register (puts of chunks with a zone whose registration is done, removes), and,
    /// when `room` is set, room for it in every stream it goes to. Called under the state
    /// lock, so the answer holds until the lock is released.
    pub(super) fn ready_now(&self, state: &State, changes: &[Change<'_>], room: bool) -> bool {
        let max = self.config.stream_bytes_max;
        let mut needed: Vec<(NodeId, usize)> = Vec::new();
        for change in changes {
            let (cid, bytes) = match *change {
                Change::Create(..) | Change::Resize(..) => return false,
                Change::Put(cid, data) => (cid, data.len() + Op::OVERHEAD_BYTES_MAX),
                Change::Remove(cid, _) => (cid, Op::OVERHEAD_BYTES_MAX),
            };
            let Some(zone) = state.tree.zone_of(cid) else {
                if matches!(change, Change::Remove(..)) {
                    continue; // nothing to remove on backups
                }
                return false;
            };
            let Some(z) = state.zones.get(&zone.0) else {
                return false;
            };
            if !matches!(z.registration, Registration::Done)
                || (z.backups.is_empty() && self.config.replication > 0)
            {
                return false;
            }
            for &backup in &z.backups {
                match needed.iter_mut().find(|(b, _)| *b == backup) {
                    Some((_, total)) => *total += bytes,
                    None => needed.push((backup, bytes)),
                }
            }
        }
        !room
            || needed.iter().all(|&(backup, bytes)| {
                state.streams.get(&backup).is_none_or(|s| {
                    s.unacknowledged_bytes() == 0 || s.unacknowledged_bytes() + bytes <= max
                })
            })
    }

    /// Waits (the state lock released meanwhile) until `zone` has backups; false when it
    /// has none by `deadline`, or the replicator shuts down.
    fn wait_for_backups(
        &self,
        state: &mut parking_lot::MutexGuard<'_, State>,
        zone: u32,
        deadline: Instant,
    ) -> bool {
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return false;
            }
            match state.zones.get(&zone) {
                Some(z) if !z.backups.is_empty() => return true,
                Some(_) => {}
                None => return false,
            }
            if self.progress.wait_until(state, deadline).timed_out() {
                return state
                    .zones
                    .get(&zone)
                    .is_some_and(|z| !z.backups.is_empty());
            }
        }
    }

    pub(super) fn submit_mode<'a>(
        self: &Arc<Self>,
        changes: impl Iterator<Item = Change<'a>>,
        durability: Option<Durability>,
        mode: Mode<'_, 'a>,
    ) -> Result<(), ReplicaError> {
        let durability = durability.unwrap_or(self.config.default_durability);
        let deadline = self.io.now() + self.config.wait_timeout;
        if self.driven && matches!(mode, Mode::Wait) {
            // Nothing else runs on a driver's thread to end the wait.
            return Err(ReplicaError::WouldWait);
        }
        let (targets, _) = self.submit_targets(changes, durability, mode, deadline)?;
        self.wait_targets_until(&targets, durability, deadline)
    }

    /// Queues the changes on their backups' streams (see [`submit_mode`](Self::submit_mode))
    /// and returns the stream positions their acknowledgements must reach, without waiting
    /// for them, and the zones the changes went to. A no-wait submission accepts any
    /// durability here: the caller waits (or defers) the acknowledgements itself.
    pub(super) fn submit_targets<'a>(
        self: &Arc<Self>,
        changes: impl Iterator<Item = Change<'a>>,
        durability: Durability,
        mode: Mode<'_, 'a>,
        deadline: Instant,
    ) -> Result<(Vec<Target>, Vec<u32>), ReplicaError> {
        if self.shutdown.load(Ordering::Acquire) {
            return Err(ReplicaError::Shutdown);
        }
        let wants_durable = durability == Durability::Durable;
        let mut targets: Vec<Target> = Vec::new();
        let mut touched: Vec<u32> = Vec::new();
        let mut shipping: Vec<NodeId> = Vec::new();
        let mut state = self.state.lock();
        if let Mode::NoWait(all) = mode {
            if !self.ready_now(&state, all, false) {
                return Err(ReplicaError::WouldWait);
            }
        }
        let waits = matches!(mode, Mode::Wait);
        for change in changes {
            let (cid, op_data, zone) = match change {
                Change::Create(cid, data) => {
                    let a = state.tree.assign(cid, data.len() as u64);
                    if a.opened || !state.zones.contains_key(&a.zone.0) {
                        self.open_zone(&mut state, a.zone.0);
                    }
                    (cid, Some(data), a.zone.0)
                }
                Change::Put(cid, data) | Change::Resize(cid, _, data) => {
                    let zone = match state.tree.zone_of(cid) {
                        Some(zone) => {
                            if let Change::Resize(_, old, _) = change {
                                state.tree.resize(cid, old, data.len() as u64);
                            }
                            zone.0
                        }
                        None => {
                            let a = state.tree.assign(cid, data.len() as u64);
                            if a.opened || !state.zones.contains_key(&a.zone.0) {
                                self.open_zone(&mut state, a.zone.0);
                            }
                            a.zone.0
                        }
                    };
                    (cid, Some(data), zone)
                }
                Change::Remove(cid, size) => match state.tree.remove(cid, size) {
                    Some(zone) => (cid, None, zone.0),
                    None => continue,
                },
            };
            if !touched.contains(&zone) {
                touched.push(zone);
            }
            let Some(z) = state.zones.get_mut(&zone) else {
                continue;
            };
            if matches!(z.registration, Registration::Failed(_)) {
                self.start_registration(&mut state, zone);
            }
            let Some(z) = state.zones.get(&zone) else {
                continue;
            };
            if z.backups.is_empty() {
                if durability == Durability::Async || self.config.replication == 0 {
                    continue;
                }
                // Right after a start this peer may not see the other peers yet: the zone
                // gets backups once one joins (`fill_zones`). Wait for that, up to the
                // deadline, rather than fail the change.
                if !waits || !self.wait_for_backups(&mut state, zone, deadline) {
                    return Err(ReplicaError::NoBackups { zone });
                }
            }
            let Some(z) = state.zones.get(&zone) else {
                continue;
            };
            let backups = z.backups.clone();
            let (owner, log_zone) = z.key(zone);
            let op = match op_data {
                Some(data) => Op::Put {
                    owner,
                    zone: log_zone,
                    cid: cid.raw(),
                    data: Bytes::copy_from_slice(data),
                    seq: 0,
                },
                None => Op::Remove {
                    owner,
                    zone: log_zone,
                    cid: cid.raw(),
                    seq: 0,
                },
            };
            if waits {
                self.wait_room(&mut state, &backups, op.encoded_bytes(), deadline)?;
            }
            // The lock was released while waiting: the zone's backups may have changed.
            for target in self.queue_on_zone(&mut state, zone, cid, op, wants_durable) {
                match targets.iter_mut().find(|t| t.backup == target.backup) {
                    Some(t) => *t = target,
                    None => targets.push(target),
                }
                if !shipping.contains(&target.backup) {
                    shipping.push(target.backup);
                }
            }
        }
        // The new operations leave now (or the sender thread takes them): before the
        // registration wait below and before the caller waits for acknowledgements.
        let now = self.io.now();
        let urgent = durability != Durability::Async;
        for &backup in &shipping {
            self.ship_or_wake(&mut state, backup, now, urgent);
        }
        // A zone's registration precedes every acknowledgement of a write to it. (A
        // no-wait submission checked that each zone had been registered; a registration
        // pending now is a new backup order, and the old one, which also receives the
        // change, is committed.)
        if waits {
            self.wait_registrations(&mut state, &touched, deadline)?;
        }
        drop(state);
        Ok((targets, touched))
    }

    /// Queues `op`, a change of `cid`, on every backup of `zone` with the zone's next
    /// position (in this one hold of the state lock, so each backup sees the positions in
    /// order) and marks `cid` dirty for the zone's running copies. Returns the stream
    /// positions; nothing when the zone is gone.
    pub(super) fn queue_on_zone(
        &self,
        state: &mut State,
        zone: u32,
        cid: ChunkId,
        mut op: Op,
        wants_durable: bool,
    ) -> Vec<Target> {
        let Some(z) = state.zones.get_mut(&zone) else {
            return Vec::new();
        };
        for resync in &mut z.resyncs {
            resync.dirty.insert(cid.raw());
        }
        z.position += 1;
        op.set_seq(z.position);
        let backups = z.backups.clone();
        let now = self.io.now();
        backups
            .into_iter()
            .map(|backup| self.push_op(state, backup, op.clone(), wants_durable, now))
            .collect()
    }

    /// Waits until none of the `touched` zones' registrations is pending (a failed one is
    /// the error), at most until `deadline`.
    fn wait_registrations(
        &self,
        state: &mut parking_lot::MutexGuard<'_, State>,
        touched: &[u32],
        deadline: Instant,
    ) -> Result<(), ReplicaError> {
        loop {
            let mut pending = false;
            for zone in touched {
                match state.zones.get(zone).map(|z| &z.registration) {
                    Some(Registration::Pending) => pending = true,
                    Some(Registration::Failed(reason)) => {
                        return Err(ReplicaError::Registration {
                            zone: *zone,
                            reason: reason.clone(),
                        })
                    }
                    _ => {}
                }
            }
            if !pending {
                break;
            }
            if self.shutdown.load(Ordering::Acquire) {
                return Err(ReplicaError::Shutdown);
            }
            if self.progress.wait_until(state, deadline).timed_out() {
                return Err(ReplicaError::Timeout {
                    what: "zone registration",
                    waited: self.config.wait_timeout,
                    missing: Vec::new(),
                });
            }
        }
        Ok(())
    }
}
