//! Replacement backups and re-replication: [`Replicator::replace_backup`] and
//! [`Replicator::fill_zones`] choose new backups for zones, register the new orders and
//! copy each zone from the master's memory ([`ChunkSource`]) to its new backups in slices;
//! [`Replicator::copy_adopted`] uses the same copy. See the [module docs](super)
//! ("Re-replication").
//!
//! Invariants: a copy never overtakes a newer change (changes made during a copy mark their
//! CIDs dirty in the zone's `Resync`, and a slice skips dirty CIDs); memory is read without
//! the state lock, a slice is queued under it; a copy is done only once the new order is
//! registered and its last operation is durable on the backup.
//!
//! [`Replicator::replace_backup`]: super::Replicator::replace_backup
//! [`Replicator::fill_zones`]: super::Replicator::fill_zones
//! [`Replicator::copy_adopted`]: super::Replicator::copy_adopted
//! [`ChunkSource`]: super::ChunkSource

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_placement::{Candidate, ZoneId};
use myriad_types::{ChunkId, NodeId};

use super::stream::Target;
use super::zones::{Registration, Resync};
use super::{Inner, ReplicaEvent, State};
use crate::wire::{self, Op};
use crate::Durability;

/// A zone's new backups after [`Replicator::replace_backup`] or [`Replicator::fill_zones`].
///
/// [`Replicator::replace_backup`]: super::Replicator::replace_backup
/// [`Replicator::fill_zones`]: super::Replicator::fill_zones
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneReplacement {
    /// The zone.
    pub zone: u32,
    /// Its backups, in order.
    pub backups: Vec<NodeId>,
    /// The backups that were added (they receive the zone by re-replication).
    pub added: Vec<NodeId>,
}

/// A copy of a zone to one backup, slice by slice ([`Inner::copy_next_slice`]).
#[derive(Debug)]
pub(super) struct Copy {
    pub(super) zone: u32,
    pub(super) backup: NodeId,
    /// The zone's CID ranges when the copy began.
    ranges: Vec<(ChunkId, ChunkId)>,
    /// The range being walked, and where the next slice starts in it.
    range: usize,
    cursor: Option<ChunkId>,
    /// Chunks locked when their slice was read (a client's chunk lock, a writer).
    pub(super) busy: Vec<ChunkId>,
    pub(super) copied: u64,
    /// The stream position of the copy's last operation so far.
    pub(super) last_target: Option<Target>,
}

/// Most attempts of one background re-replication ([`Inner::resync_retrying`]).
pub(super) const RESYNC_ATTEMPTS_MAX: u32 = 8;
/// Pause after the first failed attempt; it doubles up to [`RESYNC_RETRY_PAUSE_MAX`].
pub(super) const RESYNC_RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Longest pause between two attempts.
pub(super) const RESYNC_RETRY_PAUSE_MAX: Duration = Duration::from_secs(8);

impl Inner {
    /// Replaces `failed` (or fills zones below R when `None`) and starts re-replication.
    pub(super) fn rebackup(self: &Arc<Self>, failed: Option<NodeId>) -> Vec<ZoneReplacement> {
        let mut changes = Vec::new();
        let mut state = self.state.lock();
        if self.config.replication == 0 {
            return changes;
        }
        let mut candidates = self.candidates.candidates();
        if let Some(failed) = failed {
            candidates.retain(|c| c.node != failed);
        }
        let zones: Vec<u32> = state
            .zones
            .iter()
            .filter(|(_, z)| match failed {
                Some(f) => z.backups.contains(&f),
                None => z.backups.len() < self.config.replication,
            })
            .map(|(&zone, _)| zone)
            .collect();
        for zone in zones {
            let State {
                placement,
                rng,
                zones,
                ..
            } = &mut *state;
            let Some(z) = zones.get_mut(&zone) else {
                continue;
            };
            // An adopted zone's log owner (restarted since) never backs its own zone: its
            // log there is named by that owner, and the cluster refuses such an order.
            let log_owner = z.log.map(|(owner, _)| owner);
            let eligible: Vec<Candidate>;
            let candidates = match log_owner {
                Some(owner) if candidates.iter().any(|c| c.node == owner) => {
                    eligible = candidates
                        .iter()
                        .filter(|c| c.node != owner)
                        .cloned()
                        .collect();
                    &eligible
                }
                _ => &candidates,
            };
            let new = match failed {
                Some(f) => placement.replace(&z.backups, f, candidates, rng),
                None => placement.extend(&z.backups, candidates, rng),
            };
            let added: Vec<NodeId> = new
                .iter()
                .copied()
                .filter(|n| !z.backups.contains(n))
                .collect();
            if new == z.backups {
                continue;
            }
            z.backups = new.clone();
            z.resyncs.retain(|r| Some(r.target) != failed);
            for &target in &added {
                self.start_copy(&mut state, zone, target);
            }
            self.start_registration(&mut state, zone);
            changes.push(ZoneReplacement {
                zone,
                backups: new,
                added,
            });
        }
        if let Some(failed) = failed {
            state.streams.remove(&failed);
        }
        if failed.is_some() || !changes.is_empty() {
            // Submissions may wait for a zone's backups (or a failed stream's end).
            self.progress.notify_all();
        }
        drop(state);
        let jobs: Vec<(u32, NodeId)> = changes
            .iter()
            .flat_map(|c| c.added.iter().map(move |&b| (c.zone, b)))
            .collect();
        if !jobs.is_empty() && self.driven {
            self.queue_copies(jobs);
        } else if !jobs.is_empty() {
            let inner = self.clone();
            match std::thread::Builder::new()
                .name("replica-resync".into())
                .spawn(move || {
                    for (zone, backup) in jobs {
                        inner.resync_retrying(zone, backup);
                    }
                }) {
                Ok(handle) => {
                    let mut workers = self.workers.lock();
                    workers.retain(|w| !w.is_finished());
                    workers.push(handle);
                }
                Err(e) => tracing::error!(error = %e, "cannot spawn the re-replication thread"),
            }
        }
        changes
    }

    /// [`Inner::resync`] in the background, again after a failure (up to
    /// [`RESYNC_ATTEMPTS_MAX`] times, pauses doubling from [`RESYNC_RETRY_PAUSE`]) while
    /// `backup` is still one of the zone's backups and the replicator runs: a backup whose
    /// copy never completes would hold the zone only in part for good.
    pub(super) fn resync_retrying(self: &Arc<Self>, zone: u32, backup: NodeId) {
        let mut pause = RESYNC_RETRY_PAUSE;
        for attempt in 1..=RESYNC_ATTEMPTS_MAX {
            if self.resync(zone, backup).is_ok() || attempt == RESYNC_ATTEMPTS_MAX {
                return;
            }
            let until = self.io.now() + pause;
            while self.io.now() < until {
                if self.shutdown.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            pause = (pause * 2).min(RESYNC_RETRY_PAUSE_MAX);
            let mut state = self.state.lock();
            let Some(z) = state.zones.get_mut(&zone) else {
                return;
            };
            if !z.backups.contains(&backup) || z.resyncs.iter().any(|r| r.target == backup) {
                // Replaced meanwhile, or another copy to it runs.
                return;
            }
            // The backup holds the zone from the earlier attempt's reset on: this copy
            // completes it.
            z.resyncs.push(Resync {
                target: backup,
                dirty: HashSet::new(),
                reset: None,
            });
            tracing::info!(zone, %backup, attempt, "re-replication tried again");
        }
    }

    /// Copies `zone` to `backup` (see [`Inner::resync_inner`]), reports the outcome as an
    /// event, and once the copy is complete records the backup as filled
    /// ([`ZoneRegistry::filled`](super::ZoneRegistry::filled)).
    pub(super) fn resync(self: &Arc<Self>, zone: u32, backup: NodeId) -> Result<u64, String> {
        let result = self.resync_inner(zone, backup);
        self.resync_ended(zone, backup, &result);
        result
    }

    /// Reports the end of a copy of `zone` to `backup`: the backup recorded as filled and
    /// [`ReplicaEvent::ResyncDone`], or the copy's bookkeeping dropped and
    /// [`ReplicaEvent::ResyncFailed`].
    pub(super) fn resync_ended(&self, zone: u32, backup: NodeId, result: &Result<u64, String>) {
        match result {
            Ok(chunks) => {
                let key = self.state.lock().zones.get(&zone).map(|z| z.key(zone));
                if let Some((owner, log_zone)) = key {
                    let owner = owner.unwrap_or(self.config.node);
                    let filled = self.registry.filled(owner, log_zone, backup);
                    self.io.spawn(Box::pin(async move {
                        if let Err(error) = filled.await {
                            tracing::warn!(%owner, zone = log_zone, %backup, %error, "the completed copy was not recorded; the backup still counts as filling");
                        }
                    }));
                }
                self.emit(ReplicaEvent::ResyncDone {
                    zone,
                    backup,
                    chunks: *chunks,
                });
            }
            Err(reason) => {
                let mut state = self.state.lock();
                if let Some(z) = state.zones.get_mut(&zone) {
                    z.resyncs.retain(|r| r.target != backup);
                }
                drop(state);
                tracing::warn!(zone, %backup, %reason, "re-replication failed");
                self.emit(ReplicaEvent::ResyncFailed {
                    zone,
                    backup,
                    reason: reason.clone(),
                });
            }
        }
    }

    pub(super) fn resync_inner(self: &Arc<Self>, zone: u32, backup: NodeId) -> Result<u64, String> {
        let mut copy = self.copy_begin(zone, backup);
        while self.copy_next_slice(&mut copy, true)? {}
        let busy = std::mem::take(&mut copy.busy);
        let (count, target) = self.copy_locked(zone, backup, busy)?;
        copy.copied += count;
        copy.last_target = target.or(copy.last_target);
        self.copy_finish(&copy);
        // The new order must be registered and the copy on the backup's disk.
        let deadline = self.io.now() + self.config.wait_timeout;
        {
            let mut state = self.state.lock();
            loop {
                match state.zones.get(&zone).map(|z| &z.registration) {
                    Some(Registration::Done) | None => break,
                    Some(Registration::Failed(reason)) => {
                        return Err(format!("registration failed: {reason}"))
                    }
                    Some(Registration::Pending) => {}
                }
                if self.shutdown.load(Ordering::Acquire) {
                    return Err("shut down".into());
                }
                if self.progress.wait_until(&mut state, deadline).timed_out() {
                    return Err("registration timed out".into());
                }
            }
        }
        if let Some(target) = copy.last_target {
            self.wait_targets_until(&[target], Durability::Durable, deadline)
                .map_err(|e| e.to_string())?;
        }
        Ok(copy.copied)
    }

    /// Starts a copy of `zone` to `backup`: the zone's CID ranges now, and the position of
    /// the copy's reset (if the backup was added with one).
    pub(super) fn copy_begin(&self, zone: u32, backup: NodeId) -> Copy {
        let state = self.state.lock();
        let reset = state.zones.get(&zone).and_then(|z| {
            z.resyncs
                .iter()
                .find(|r| r.target == backup)
                .and_then(|r| r.reset)
        });
        Copy {
            zone,
            backup,
            ranges: state.tree.ranges_of(ZoneId(zone)),
            range: 0,
            cursor: None,
            busy: Vec::new(),
            copied: 0,
            last_target: reset,
        }
    }

    /// Reads the copy's next slice from memory and queues it (waiting for stream room if
    /// `wait`); chunks locked now are kept in `copy.busy`. False once every range was
    /// walked.
    pub(super) fn copy_next_slice(&self, copy: &mut Copy, wait: bool) -> Result<bool, String> {
        loop {
            let Some(&(first, last)) = copy.ranges.get(copy.range) else {
                return Ok(false);
            };
            if self.shutdown.load(Ordering::Acquire) {
                return Err("shut down".into());
            }
            let cursor = copy.cursor.unwrap_or(first);
            let mut slice: Vec<(ChunkId, Bytes)> = Vec::new();
            let mut bytes = 0usize;
            let slice_max = self.config.resync_slice_bytes;
            let mut walked_to = None;
            let locked = self
                .source
                .for_each_in_range(cursor, last, &mut |cid, data| {
                    if cid.raw() < cursor.raw() || cid.raw() > last.raw() {
                        return true;
                    }
                    walked_to = Some(cid);
                    slice.push((cid, Bytes::copy_from_slice(data)));
                    bytes += data.len() + Op::OVERHEAD_BYTES_MAX;
                    bytes < slice_max && slice.len() < wire::OPS_PER_MESSAGE_MAX
                });
            copy.busy.extend(
                locked
                    .into_iter()
                    .filter(|cid| walked_to.is_none_or(|to| cid.raw() < to.raw())),
            );
            let Some(last_cid) = walked_to else {
                copy.range += 1;
                copy.cursor = None;
                continue;
            };
            let (count, target) = self.copy_slice(copy.zone, copy.backup, slice, bytes, wait)?;
            copy.copied += count;
            copy.last_target = target.or(copy.last_target);
            if last_cid.raw() >= last.raw() {
                copy.range += 1;
                copy.cursor = None;
            } else {
                copy.cursor = Some(ChunkId::from_raw(last_cid.raw() + 1));
            }
            return Ok(true);
        }
    }

    /// Ends the copy's bookkeeping: changes of the zone no longer mark CIDs for it.
    pub(super) fn copy_finish(&self, copy: &Copy) {
        let mut state = self.state.lock();
        if let Some(z) = state.zones.get_mut(&copy.zone) {
            z.resyncs.retain(|r| r.target != copy.backup);
        }
    }

    /// Queues `slice` (read from memory) on `backup`'s stream as the zone's copy, leaving
    /// out chunks changed since the copy began (their change is on the stream already).
    /// Returns the chunks queued and the stream position of the last one.
    pub(super) fn copy_slice(
        &self,
        zone: u32,
        backup: NodeId,
        slice: Vec<(ChunkId, Bytes)>,
        bytes: usize,
        wait: bool,
    ) -> Result<(u64, Option<Target>), String> {
        let deadline = self.io.now() + self.config.wait_timeout;
        let mut state = self.state.lock();
        if wait {
            self.wait_room(&mut state, &[backup], bytes, deadline)
                .map_err(|e| e.to_string())?;
        }
        let now = self.io.now();
        let Some(z) = state.zones.get(&zone) else {
            return Err("zone vanished".into());
        };
        let Some(resync) = z.resyncs.iter().find(|r| r.target == backup) else {
            return Err("backup left the zone".into());
        };
        let (owner, log_zone) = z.key(zone);
        let keep: Vec<(ChunkId, Bytes)> = slice
            .into_iter()
            .filter(|(cid, _)| !resync.dirty.contains(&cid.raw()))
            .collect();
        let mut copied = 0;
        let mut last_target = None;
        for (cid, data) in keep {
            let op = Op::Put {
                owner,
                zone: log_zone,
                cid: cid.raw(),
                data,
                // A copy's put is no step of the zone's history.
                seq: 0,
            };
            last_target = Some(self.push_op(&mut state, backup, op, true, now));
            copied += 1;
        }
        self.wake_sender();
        Ok((copied, last_target))
    }

    /// Copies the chunks that were locked when their slice was read: each is read again
    /// (every 10 ms) until it can be, it is gone, or the wait timeout passes, which fails
    /// the copy (it is never left out silently: the new backup would miss a chunk).
    fn copy_locked(
        &self,
        zone: u32,
        backup: NodeId,
        mut busy: Vec<ChunkId>,
    ) -> Result<(u64, Option<Target>), String> {
        let deadline = self.io.now() + self.config.wait_timeout;
        let mut copied = 0;
        let mut last_target = None;
        while !busy.is_empty() {
            if self.shutdown.load(Ordering::Acquire) {
                return Err("shut down".into());
            }
            let (count, target, still) = self.copy_locked_once(zone, backup, busy, true)?;
            copied += count;
            last_target = target.or(last_target);
            if !still.is_empty() && self.io.now() >= deadline {
                return Err(locked_too_long(&still, self.config.wait_timeout));
            }
            if !still.is_empty() {
                std::thread::sleep(Duration::from_millis(10));
            }
            busy = still;
        }
        Ok((copied, last_target))
    }

    /// Reads each of `busy` again and queues those that can be read now (a chunk gone
    /// meanwhile is skipped); returns the chunks queued, the stream position of the last
    /// one, and the chunks still locked.
    pub(super) fn copy_locked_once(
        &self,
        zone: u32,
        backup: NodeId,
        busy: Vec<ChunkId>,
        wait: bool,
    ) -> Result<(u64, Option<Target>, Vec<ChunkId>), String> {
        let mut copied = 0;
        let mut last_target = None;
        let mut still = Vec::new();
        for cid in busy {
            let mut read = None;
            let locked = self.source.for_each_in_range(cid, cid, &mut |at, data| {
                if at == cid {
                    read = Some(Bytes::copy_from_slice(data));
                }
                false
            });
            if !locked.is_empty() {
                still.push(cid);
            } else if let Some(data) = read {
                let bytes = data.len() + Op::OVERHEAD_BYTES_MAX;
                let (count, target) =
                    self.copy_slice(zone, backup, vec![(cid, data)], bytes, wait)?;
                copied += count;
                last_target = target.or(last_target);
            }
        }
        Ok((copied, last_target, still))
    }
}

/// The error of a copy whose chunks `still` stayed locked for `waited`.
pub(super) fn locked_too_long(still: &[ChunkId], waited: Duration) -> String {
    format!(
        "{} chunks stayed locked for {waited:?} (first {})",
        still.len(),
        still.first().map_or_else(String::new, ToString::to_string)
    )
}
