//! The sender thread: batches each stream's pending operations into log messages of up to
//! `message_bytes_target` bytes, moves them into the stream's window and hands them to its
//! send task; resends windows after a lost connection, a gap or a timeout (with backoff),
//! and reports backups that make no progress. See the [module docs](super) ("Resending").
//!
//! It holds the state lock while it builds messages but never waits on the network (the
//! send tasks do). Started by `Replicator::new`, stopped by its `Drop`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_types::NodeId;

use super::stream::{Sent, Stream};
use super::zones::{op_key, ZoneKey};
use super::{Inner, ReplicaEvent, State};

use crate::wire::{self, encode_log_message};

impl Inner {
    pub(super) fn sender_loop(self: Arc<Self>, mut lost: myriad_net::ConnectionEvents) {
        let tick = self.tick_interval();
        loop {
            {
                let mut state = self.state.lock();
                // Resend requests wait for the next tick (at most a quarter of the ack
                // timeout); only operations due to leave end the wait early (lingering
                // ones when their linger is over).
                if !self.shutdown.load(Ordering::Acquire) {
                    let wait = match self.next_due(&state) {
                        None => tick,
                        Some(due) => due.saturating_duration_since(self.io.now()).min(tick),
                    };
                    if !wait.is_zero() {
                        self.work.wait_for(&mut state, wait);
                    }
                }
            }
            if self.shutdown.load(Ordering::Acquire) {
                return;
            }
            let mut gone = Vec::new();
            while let Some(event) = lost.try_recv() {
                gone.push(event.node);
            }
            self.sender_round(&gone);
        }
    }

    /// The earliest time a stream's pending operations are due to leave.
    fn next_due(&self, state: &State) -> Option<Instant> {
        let linger = self.config.async_linger;
        let target = self.config.message_bytes_target;
        state
            .streams
            .values()
            .filter_map(|stream| stream.due_at(linger, target))
            .min()
    }

    /// How often the sender thread looks at the streams when nothing wakes it.
    fn tick_interval(&self) -> Duration {
        (self.config.ack_timeout / 4).max(Duration::from_millis(5))
    }

    /// One round of the sender: `lost` lists backups whose connection was lost (their
    /// windows go again). Batches pending operations, resends, ends deferred waits past
    /// their deadline and reports backups without progress.
    pub(super) fn sender_round(&self, lost: &[NodeId]) {
        let tick = self.tick_interval();
        let mut unreachable = Vec::new();
        let finished;
        {
            let mut state = self.state.lock();
            if self.shutdown.load(Ordering::Acquire) {
                return;
            }
            for node in lost {
                if let Some(stream) = state.streams.get_mut(node) {
                    if !stream.window.is_empty() {
                        stream.resend_requested = true;
                    }
                }
            }
            let now = self.io.now();
            for (&backup, stream) in state.streams.iter_mut() {
                let mut messages = Vec::new();
                let quiet = now.duration_since(stream.last_progress.max(stream.last_resend));
                // While a batch is still on its way (e.g. waiting for a connection),
                // a resend would only queue the window twice.
                let idle = stream.in_flight.load(Ordering::Acquire) == 0;
                let resend_soon = idle
                    && stream.resend_requested
                    && now.duration_since(stream.last_resend) >= tick;
                // Without progress, resends back off: ack timeout × 1, 2, 4, … 32.
                let quiet_max = self.config.ack_timeout * (1u32 << stream.backoff.min(5));
                let timed_out = quiet >= quiet_max;
                if idle && !stream.window.is_empty() && (resend_soon || timed_out) {
                    messages.extend(stream.window.iter().map(|m| m.bytes.clone()));
                    stream.last_resend = now;
                    stream.resends += 1;
                    if timed_out {
                        stream.backoff = stream.backoff.saturating_add(1);
                    }
                }
                if stream.window.is_empty() || resend_soon {
                    stream.resend_requested = false;
                }
                let resent = messages.len();
                if stream.due(
                    now,
                    self.config.async_linger,
                    self.config.message_bytes_target,
                ) {
                    self.build_messages(stream, now, &mut messages);
                }
                if messages.len() > resent {
                    stream.shipped_by_sender += 1;
                }
                if !stream.window.is_empty()
                    && !stream.unreachable_reported
                    && now.duration_since(stream.last_progress) >= self.config.unreachable_timeout
                {
                    stream.unreachable_reported = true;
                    unreachable.push(backup);
                }
                Self::hand_over(stream, messages);
            }
            // Deferred waits past their deadline, or whose stream was replaced.
            finished = self.finished_waiters(&mut state);
        }
        super::deferred::run(finished);
        for backup in unreachable {
            tracing::warn!(%backup, "backup unreachable");
            self.emit(ReplicaEvent::BackupUnreachable(backup));
        }
    }

    /// Turns `stream`'s pending operations into log messages of up to
    /// `message_bytes_target` bytes, moves them into its window and appends them to
    /// `messages` (the caller hands them to the send task). Under the state lock.
    pub(super) fn build_messages(
        &self,
        stream: &mut Stream,
        now: Instant,
        messages: &mut Vec<Bytes>,
    ) {
        while !stream.pending.is_empty() {
            let first_seq = stream.next_seq - stream.pending.len() as u64;
            let mut ops = Vec::new();
            let mut bytes = 0;
            let mut durable = false;
            while let Some((op, d)) = stream.pending.front() {
                let size = op.encoded_bytes();
                if !ops.is_empty()
                    && (bytes + size > self.config.message_bytes_target
                        || ops.len() >= wire::OPS_PER_MESSAGE_MAX)
                {
                    break;
                }
                durable |= *d;
                bytes += size;
                let Some((op, _)) = stream.pending.pop_front() else {
                    break;
                };
                ops.push(op);
            }
            stream.pending_bytes -= bytes;
            if stream.pending.is_empty() {
                stream.pending_since = None;
                stream.urgent = false;
                stream.linger_armed = false;
            }
            let last_seq = first_seq + ops.len() as u64 - 1;
            let encoded = encode_log_message(stream.id, first_seq, durable, &ops);
            let mut zones: Vec<(ZoneKey, u64)> = Vec::new();
            for op in &ops {
                match zones.iter_mut().find(|(z, _)| *z == op_key(op)) {
                    Some((_, n)) => *n += 1,
                    None => zones.push((op_key(op), 1)),
                }
            }
            if stream.window.is_empty() {
                stream.last_progress = now;
            }
            stream.window_bytes += encoded.len();
            debug_assert!(
                stream
                    .window
                    .back()
                    .is_none_or(|m| m.last_seq + 1 == first_seq),
                "a stream's messages carry consecutive sequence numbers"
            );
            stream.window.push_back(Sent {
                last_seq,
                bytes: encoded.clone(),
                zones,
            });
            messages.push(encoded);
        }
    }

    /// Hands `messages` to `stream`'s send task (nothing when empty).
    pub(super) fn hand_over(stream: &mut Stream, messages: Vec<Bytes>) {
        if messages.is_empty() {
            return;
        }
        stream.in_flight.fetch_add(1, Ordering::AcqRel);
        if stream.courier.send(messages).is_err() {
            stream.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Ships `backup`'s pending operations from the submitting thread when they are due
    /// (`urgent`: a caller waits for them; or see `ReplicatorConfig::async_linger`), its
    /// send task is idle and no resend is due, which spares the hand-off to the sender
    /// thread (a thread switch per write when writes are sparse); otherwise wakes the
    /// sender, which batches what piled up (lingering operations: once, when the first of
    /// them is queued, so it sets its timer). Under the state lock.
    pub(super) fn ship_or_wake(
        &self,
        state: &mut State,
        backup: NodeId,
        now: Instant,
        urgent: bool,
    ) {
        let Some(stream) = state.streams.get_mut(&backup) else {
            return;
        };
        if stream.pending.is_empty() {
            return;
        }
        stream.urgent |= urgent;
        if !stream.due(
            now,
            self.config.async_linger,
            self.config.message_bytes_target,
        ) {
            if !stream.linger_armed {
                stream.linger_armed = true;
                self.wake_sender();
            }
            return;
        }
        if stream.in_flight.load(Ordering::Acquire) == 0 && !stream.resend_requested {
            let mut messages = Vec::new();
            self.build_messages(stream, now, &mut messages);
            stream.shipped_by_writer += 1;
            Self::hand_over(stream, messages);
        } else {
            self.wake_sender();
        }
    }
}
