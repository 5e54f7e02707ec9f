//! Backup streams: one sequenced stream per backup, its send task on the messaging
//! runtime, the acknowledgements that advance it, and the waits on it. See the
//! [module docs](super) ("How a write travels", "Resending").
//!
//! Invariants: sequence numbers are assigned consecutively from 1 in the order operations
//! are queued (`push_op`); `pending` holds the newest ones and `window` the sent messages
//! in sequence order, so the window's last message ends right before the first pending
//! operation; `applied` and `durable` only grow, with `durable <= applied < next_seq`. A
//! new stream to a backup gets a larger ID than the one before, so writers waiting on a
//! dropped stream fail with `BackupReplaced` rather than wait for numbers the new one
//! reuses. Called by `submit`, the sender thread, re-replication and the acknowledgement
//! handler registered on the net.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_types::NodeId;
use parking_lot::MutexGuard;
use tokio::sync::mpsc::UnboundedSender;

use super::io::MasterIo;
use super::zones::{op_key, ZoneKey};
use super::{Inner, ReplicaEvent, State};
use crate::wire::{Ack, AckStatus, Op};
use crate::{Durability, ReplicaError};

/// A sent message, kept in its stream's window until the backup applied it.
#[derive(Debug)]
pub(super) struct Sent {
    pub(super) last_seq: u64,
    pub(super) bytes: Bytes,
    /// Operations per zone (log owner, zone) in the message.
    pub(super) zones: Vec<(ZoneKey, u64)>,
}

/// The sequenced stream of operations to one backup.
#[derive(Debug)]
pub(super) struct Stream {
    pub(super) id: u64,
    /// The next sequence number to assign.
    pub(super) next_seq: u64,
    pub(super) pending: VecDeque<(Op, bool)>,
    pub(super) pending_bytes: usize,
    /// When the oldest pending operation was queued (`None` while nothing is pending).
    pub(super) pending_since: Option<Instant>,
    /// Set when a pending operation must leave without lingering (its caller waits, or a
    /// writer waits for room); cleared when pending is drained into messages.
    pub(super) urgent: bool,
    /// Set once the sender thread was told about lingering pending operations (so it
    /// sleeps only until they are due); cleared when pending is drained.
    pub(super) linger_armed: bool,
    pub(super) window: VecDeque<Sent>,
    pub(super) window_bytes: usize,
    pub(super) applied: u64,
    pub(super) durable: u64,
    pub(super) last_progress: Instant,
    pub(super) last_resend: Instant,
    pub(super) resend_requested: bool,
    pub(super) unreachable_reported: bool,
    pub(super) last_refusal: Option<String>,
    pub(super) resends: u64,
    /// Operations per zone (log owner, zone) in pending and unacknowledged messages.
    pub(super) unacknowledged_per_zone: BTreeMap<ZoneKey, u64>,
    /// Resends after a timeout since the last progress (the next one waits longer).
    pub(super) backoff: u32,
    /// Hands batches of messages to the stream's send task, which sends them in order.
    pub(super) courier: UnboundedSender<Vec<Bytes>>,
    /// Batches handed over and not yet sent (or given up on).
    pub(super) in_flight: Arc<AtomicUsize>,
    /// Batches of new messages shipped by writing threads and by the sender thread
    /// ([`StreamStats`](super::StreamStats)).
    pub(super) shipped_by_writer: u64,
    pub(super) shipped_by_sender: u64,
}

impl Stream {
    /// A new stream to `backup`, with its send path from `io`. The path closes when the
    /// stream is dropped.
    pub(super) fn new(id: u64, now: Instant, io: &dyn MasterIo, backup: NodeId) -> Stream {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let courier = io.open_stream(backup, in_flight.clone());
        Stream {
            courier,
            in_flight,
            id,
            next_seq: 1,
            pending: VecDeque::new(),
            pending_bytes: 0,
            pending_since: None,
            urgent: false,
            linger_armed: false,
            window: VecDeque::new(),
            window_bytes: 0,
            applied: 0,
            durable: 0,
            last_progress: now,
            last_resend: now,
            resend_requested: false,
            unreachable_reported: false,
            last_refusal: None,
            resends: 0,
            unacknowledged_per_zone: BTreeMap::new(),
            backoff: 0,
            shipped_by_writer: 0,
            shipped_by_sender: 0,
        }
    }

    #[inline]
    pub(super) fn unacknowledged_bytes(&self) -> usize {
        self.pending_bytes + self.window_bytes
    }

    /// When the pending operations are due to leave (`ReplicatorConfig::async_linger`):
    /// `None` when nothing is pending, `now` or earlier when they may leave now.
    pub(super) fn due_at(&self, linger: Duration, message_bytes: usize) -> Option<Instant> {
        let since = self.pending_since?;
        if self.urgent || linger.is_zero() || self.pending_bytes >= message_bytes {
            return Some(since);
        }
        Some(since + linger)
    }

    /// Whether the pending operations may leave at `now`.
    pub(super) fn due(&self, now: Instant, linger: Duration, message_bytes: usize) -> bool {
        self.due_at(linger, message_bytes)
            .is_some_and(|due| due <= now)
    }
}

/// A stream position a writer waits for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Target {
    pub(super) backup: NodeId,
    pub(super) stream: u64,
    pub(super) seq: u64,
}

/// The backups of `targets` whose acknowledgements (the applied mark, or for `durable` the
/// durable mark) have not reached their target yet; `BackupReplaced` when a target's
/// stream is gone or was replaced.
pub(super) fn missing_targets(
    state: &State,
    targets: &[Target],
    durability: Durability,
) -> Result<Vec<NodeId>, ReplicaError> {
    let mut missing = Vec::new();
    for target in targets {
        match state.streams.get(&target.backup) {
            Some(s) if s.id == target.stream => {
                let reached = match durability {
                    Durability::Durable => s.durable,
                    _ => s.applied,
                };
                if reached < target.seq {
                    missing.push(target.backup);
                }
            }
            _ => return Err(ReplicaError::BackupReplaced(target.backup)),
        }
    }
    Ok(missing)
}

/// The error of a wait for `durability` acknowledgements that lasted `waited`.
pub(super) fn acks_timed_out(
    durability: Durability,
    waited: Duration,
    missing: Vec<NodeId>,
) -> ReplicaError {
    ReplicaError::Timeout {
        what: match durability {
            Durability::Durable => "durable acknowledgements",
            _ => "replicated acknowledgements",
        },
        waited,
        missing,
    }
}

impl Inner {
    pub(super) fn next_stream_id(&self, state: &mut State) -> u64 {
        let floor = self.io.stream_id_floor();
        state.last_stream_id = floor.max(state.last_stream_id + 1);
        state.last_stream_id
    }

    /// Appends `op` to the stream of `backup`; returns its position.
    #[inline]
    pub(super) fn push_op(
        &self,
        state: &mut State,
        backup: NodeId,
        op: Op,
        durable: bool,
        now: Instant,
    ) -> Target {
        if !state.streams.contains_key(&backup) {
            let id = self.next_stream_id(state);
            state
                .streams
                .insert(backup, Stream::new(id, now, &*self.io, backup));
        }
        let Some(stream) = state.streams.get_mut(&backup) else {
            unreachable!("inserted above");
        };
        let seq = stream.next_seq;
        stream.next_seq += 1;
        if stream.pending.is_empty() {
            stream.pending_since = Some(now);
        }
        stream.pending_bytes += op.encoded_bytes();
        *stream
            .unacknowledged_per_zone
            .entry(op_key(&op))
            .or_default() += 1;
        stream.pending.push_back((op, durable));
        Target {
            backup,
            stream: stream.id,
            seq,
        }
    }

    /// Waits (bounded) until every stream of `backups` has room for `bytes` more.
    pub(super) fn wait_room(
        &self,
        state: &mut MutexGuard<'_, State>,
        backups: &[NodeId],
        bytes: usize,
        deadline: Instant,
    ) -> Result<(), ReplicaError> {
        let max = self.config.stream_bytes_max;
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return Err(ReplicaError::Shutdown);
            }
            let full: Vec<NodeId> = backups
                .iter()
                .copied()
                .filter(|b| {
                    state.streams.get(b).is_some_and(|s| {
                        s.unacknowledged_bytes() > 0 && s.unacknowledged_bytes() + bytes > max
                    })
                })
                .collect();
            if full.is_empty() {
                return Ok(());
            }
            // Room comes from acknowledgements of shipped operations: make sure the
            // sender ships what the submission queued so far (without lingering).
            for backup in &full {
                if let Some(stream) = state.streams.get_mut(backup) {
                    stream.urgent |= !stream.pending.is_empty();
                }
            }
            self.wake_sender();
            if self.progress.wait_until(state, deadline).timed_out() {
                return Err(ReplicaError::Timeout {
                    what: "room in a backup stream",
                    waited: self.config.wait_timeout,
                    missing: full,
                });
            }
        }
    }

    pub(super) fn wait_targets(
        &self,
        targets: &[Target],
        durability: Durability,
    ) -> Result<(), ReplicaError> {
        self.wait_targets_until(
            targets,
            durability,
            self.io.now() + self.config.wait_timeout,
        )
    }

    pub(super) fn wait_targets_until(
        &self,
        targets: &[Target],
        durability: Durability,
        deadline: Instant,
    ) -> Result<(), ReplicaError> {
        if durability == Durability::Async || targets.is_empty() {
            return Ok(());
        }
        let mut state = self.state.lock();
        loop {
            let missing = missing_targets(&state, targets, durability)?;
            if missing.is_empty() {
                return Ok(());
            }
            if self.shutdown.load(Ordering::Acquire) {
                return Err(ReplicaError::Shutdown);
            }
            if self.progress.wait_until(&mut state, deadline).timed_out() {
                return Err(acks_timed_out(
                    durability,
                    self.config.wait_timeout,
                    missing,
                ));
            }
        }
    }

    /// Takes an acknowledgement ([`wire::ACK`](crate::wire::ACK)) of `backup`.
    pub(super) fn on_ack(&self, backup: NodeId, payload: Bytes) {
        let ack = match Ack::decode(payload) {
            Ok(ack) => ack,
            Err(e) => {
                tracing::warn!(%backup, error = %e, "malformed replication ack");
                return;
            }
        };
        let mut refused = None;
        let finished;
        {
            let mut state = self.state.lock();
            let Some(stream) = state.streams.get_mut(&backup) else {
                return;
            };
            if stream.id != ack.stream {
                return;
            }
            let assigned = stream.next_seq - 1;
            let applied = ack.applied_seq.min(assigned);
            if applied > stream.applied {
                stream.applied = applied;
                stream.backoff = 0;
                stream.last_progress = self.io.now();
                stream.unreachable_reported = false;
                while stream.window.front().is_some_and(|m| m.last_seq <= applied) {
                    if let Some(sent) = stream.window.pop_front() {
                        stream.window_bytes -= sent.bytes.len();
                        for (zone, count) in sent.zones {
                            if let Some(n) = stream.unacknowledged_per_zone.get_mut(&zone) {
                                *n = n.saturating_sub(count);
                                if *n == 0 {
                                    stream.unacknowledged_per_zone.remove(&zone);
                                }
                            }
                        }
                    }
                }
            }
            stream.durable = stream.durable.max(ack.durable_seq.min(stream.applied));
            debug_assert!(stream.durable <= stream.applied && stream.applied < stream.next_seq);
            match ack.status {
                AckStatus::Ok => stream.last_refusal = None,
                AckStatus::Gap => {
                    stream.resend_requested = true;
                    self.wake_sender();
                }
                AckStatus::Refused(reason) => {
                    if stream.last_refusal.as_ref() != Some(&reason) {
                        stream.last_refusal = Some(reason.clone());
                        refused = Some(reason);
                    }
                }
            }
            self.progress.notify_all();
            finished = self.finished_waiters(&mut state);
        }
        super::deferred::run(finished);
        if let Some(reason) = refused {
            tracing::warn!(%backup, %reason, "backup refuses replication");
            self.emit(ReplicaEvent::BackupRefused { backup, reason });
        }
    }
}
