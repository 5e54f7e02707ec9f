//! Re-replication under a driver ([`Replicator::driven`](super::Replicator::driven)): the
//! copies that a node's replicator runs on background threads (`rebackup`), taken one
//! slice per [`Replicator::copy_step`](super::Replicator::copy_step) call, so that the
//! driver decides what happens between two slices.
//!
//! Invariants: the same copy as a node's (`copy_begin`, `copy_next_slice`,
//! `copy_locked_once`, `copy_finish`, `resync_ended`: a slice never overtakes a newer
//! change, a copy is done once the zone's order is registered and its last operation is
//! durable on the backup, a failed copy is tried again up to
//! [`RESYNC_ATTEMPTS_MAX`] times while the backup still backs the zone); only the waits
//! differ: nothing blocks, the copy's end is a deferred wait (`defer`). Called by the
//! driver's thread only.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use myriad_types::NodeId;

use super::deferred::{self, AckCallback};
use super::rebackup::{locked_too_long, Copy, RESYNC_ATTEMPTS_MAX};
use super::zones::Resync;
use super::Inner;
use crate::Durability;

/// One copy of a zone to a backup waiting for its next step.
#[derive(Debug)]
pub(super) struct DrivenCopy {
    zone: u32,
    backup: NodeId,
    /// 1 for the first try.
    attempt: u32,
    /// The copy once begun, and when.
    copy: Option<(Copy, Instant)>,
}

/// What one [`Replicator::copy_step`](super::Replicator::copy_step) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyStep {
    /// No copy waits.
    Idle,
    /// A slice of `zone`'s copy to `backup` (`chunks` chunks) was queued; more follow.
    Slice {
        /// The zone (this master's number for it).
        zone: u32,
        /// The backup it is copied to.
        backup: NodeId,
        /// Chunks in the slice.
        chunks: u64,
    },
    /// Every range of the copy was read, but `chunks` chunks were locked; they are read
    /// again at the next step.
    Locked {
        /// The zone.
        zone: u32,
        /// The backup.
        backup: NodeId,
        /// Chunks still locked.
        chunks: usize,
    },
    /// The whole copy (`chunks` chunks) is queued; [`ReplicaEvent::ResyncDone`] or
    /// [`ReplicaEvent::ResyncFailed`] follows once the backup has it on disk.
    ///
    /// [`ReplicaEvent::ResyncDone`]: super::ReplicaEvent::ResyncDone
    /// [`ReplicaEvent::ResyncFailed`]: super::ReplicaEvent::ResyncFailed
    Queued {
        /// The zone.
        zone: u32,
        /// The backup.
        backup: NodeId,
        /// Chunks copied in all.
        chunks: u64,
    },
    /// The copy was dropped: the backup no longer backs the zone, or another copy to it
    /// runs.
    Dropped {
        /// The zone.
        zone: u32,
        /// The backup.
        backup: NodeId,
    },
    /// The copy failed ([`ReplicaEvent::ResyncFailed`](super::ReplicaEvent::ResyncFailed)
    /// was sent); it is tried again later while attempts remain.
    Failed {
        /// The zone.
        zone: u32,
        /// The backup.
        backup: NodeId,
        /// Why.
        reason: String,
    },
}

impl Inner {
    /// Queues first attempts of copies of `(zone, backup)` for the driver.
    pub(super) fn queue_copies(&self, jobs: impl IntoIterator<Item = (u32, NodeId)>) {
        let mut queue = self.driven_copies.lock();
        for (zone, backup) in jobs {
            queue.push_back(DrivenCopy {
                zone,
                backup,
                attempt: 1,
                copy: None,
            });
        }
    }

    /// Whether a copy waits for [`Inner::copy_step`].
    pub(super) fn copies_waiting(&self) -> bool {
        !self.driven_copies.lock().is_empty()
    }

    /// One step of the first waiting copy (see [`CopyStep`]).
    pub(super) fn copy_step(self: &Arc<Self>) -> CopyStep {
        let Some(mut job) = self.driven_copies.lock().pop_front() else {
            return CopyStep::Idle;
        };
        let (zone, backup) = (job.zone, job.backup);
        if self.shutdown.load(Ordering::Acquire) {
            return CopyStep::Dropped { zone, backup };
        }
        let (copy, started) = match job.copy.as_mut() {
            Some((copy, started)) => (copy, *started),
            None => {
                if job.attempt > 1 && !self.retry_copy(zone, backup) {
                    return CopyStep::Dropped { zone, backup };
                }
                let now = self.io.now();
                let (copy, _) = job.copy.insert((self.copy_begin(zone, backup), now));
                (copy, now)
            }
        };
        let before = copy.copied;
        match self.copy_next_slice(copy, false) {
            Err(reason) => return self.copy_failed(job, reason),
            Ok(true) => {
                let chunks = copy.copied - before;
                self.driven_copies.lock().push_front(job);
                return CopyStep::Slice {
                    zone,
                    backup,
                    chunks,
                };
            }
            Ok(false) => {}
        }
        if !copy.busy.is_empty() {
            let busy = std::mem::take(&mut copy.busy);
            let (count, target, still) = match self.copy_locked_once(zone, backup, busy, false) {
                Ok(read) => read,
                Err(reason) => return self.copy_failed(job, reason),
            };
            copy.copied += count;
            copy.last_target = target.or(copy.last_target);
            if !still.is_empty() {
                if self.io.now() >= started + self.config.wait_timeout {
                    let reason = locked_too_long(&still, self.config.wait_timeout);
                    return self.copy_failed(job, reason);
                }
                let chunks = still.len();
                copy.busy = still;
                self.driven_copies.lock().push_front(job);
                return CopyStep::Locked {
                    zone,
                    backup,
                    chunks,
                };
            }
        }
        self.copy_finish(copy);
        let copied = copy.copied;
        let targets: Vec<_> = copy.last_target.into_iter().collect();
        let attempt = job.attempt;
        let weak = Arc::downgrade(self);
        // The copy's end: the zone's order registered and the copy on the backup's disk.
        let done: AckCallback = Box::new(move |result| {
            let Some(inner) = weak.upgrade() else {
                return;
            };
            let result = result.map(|()| copied).map_err(|e| e.to_string());
            inner.resync_ended(zone, backup, &result);
            if result.is_err() {
                inner.requeue_copy(zone, backup, attempt);
            }
        });
        let finished = {
            let mut state = self.state.lock();
            self.defer(&mut state, targets, vec![zone], Durability::Durable, done)
        };
        deferred::run(finished);
        CopyStep::Queued {
            zone,
            backup,
            chunks: copied,
        }
    }

    fn copy_failed(&self, job: DrivenCopy, reason: String) -> CopyStep {
        let (zone, backup) = (job.zone, job.backup);
        if let Some((copy, _)) = &job.copy {
            self.copy_finish(copy);
        }
        self.resync_ended(zone, backup, &Err(reason.clone()));
        self.requeue_copy(zone, backup, job.attempt);
        CopyStep::Failed {
            zone,
            backup,
            reason,
        }
    }

    /// Queues the next attempt of a failed copy, while attempts remain.
    fn requeue_copy(&self, zone: u32, backup: NodeId, attempt: u32) {
        if attempt >= RESYNC_ATTEMPTS_MAX || self.shutdown.load(Ordering::Acquire) {
            return;
        }
        self.driven_copies.lock().push_back(DrivenCopy {
            zone,
            backup,
            attempt: attempt + 1,
            copy: None,
        });
    }

    /// Readies another attempt of a copy of `zone` to `backup` (as `resync_retrying`
    /// does): false when the backup left the zone or another copy to it runs.
    fn retry_copy(&self, zone: u32, backup: NodeId) -> bool {
        let mut state = self.state.lock();
        let Some(z) = state.zones.get_mut(&zone) else {
            return false;
        };
        if !z.backups.contains(&backup) || z.resyncs.iter().any(|r| r.target == backup) {
            return false;
        }
        // The backup holds the zone from the earlier attempt's reset on: this copy
        // completes it.
        z.resyncs.push(Resync {
            target: backup,
            dirty: HashSet::new(),
            reset: None,
        });
        true
    }
}
