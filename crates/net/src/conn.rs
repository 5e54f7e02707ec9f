//! One authenticated connection to a peer: its send queue (aggregation), its writer and
//! reader tasks, its outstanding requests and its receive-side flow control.
//!
//! Send path: any thread encodes a frame header and appends header + payload to the
//! connection's [`OutQueue`] under a short lock (payloads up to
//! [`COPY_PAYLOAD_BYTES_MAX`] are copied into one contiguous buffer, larger ones are queued
//! by reference). The writer task takes everything queued in one go and writes it with
//! vectored I/O, so many small messages from many threads become one syscall. The writer is
//! woken only when the queue goes from empty to non-empty.
//!
//! Receive side: the counters and the flow-control state the reader task (`reader.rs`)
//! works on, and the outstanding requests it completes. This module names no handler
//! type: the handlers sit above it (`handler.rs` answers requests through a [`Conn`]).
//!
//! Network filters (`crate::fault`): `try_enqueue` drops frames under `DropOutgoing`, and
//! while an outgoing delay is set the writer holds what it takes in a delay line
//! (`write_delayed`) and writes it when due, in order; with no filter set, both cost one
//! relaxed load.
//!
//! Invariants:
//! - Queued send bytes stay ≤ `send_queue_bytes_max` (+ one frame); responses may use up to
//!   twice that so a handler answering never waits on its own peer's requests.
//! - Unprocessed received bytes stay ≤ `receive_unprocessed_bytes_max` + one read: above the
//!   limit the reader stops reading until handlers catch up, and TCP back-pressures the
//!   sender's writer, whose queue then fills and makes senders wait (bounded by
//!   `send_timeout`), so memory is bounded on both sides.
//! - Frames of one connection are written in the order they were queued; one fragmented
//!   message at a time per connection (the `large_lane` lock).
//! - Once `close` has run, nothing new is queued, every outstanding request fails with
//!   `ConnectionLost`, and both tasks stop.

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Instant;

use crate::config::{
    AGGREGATION_BUFFER_BYTES, COPY_PAYLOAD_BYTES_MAX, DEADLINE_FAR, IO_SLICES_MAX,
    PENDING_REQUESTS_MAX,
};
use crate::error::{FrameError, NetError};
use crate::fault::{DelayLine, LinkFilter, DELAY_OUTGOING, DROP_OUTGOING};
use crate::stream::NetStream;
use crate::tls::CertRole;
use crate::wire::{Fragment, FrameHeader, Kind, FRAME_PAYLOAD_BYTES_MAX, HEADER_BYTES};
use crate::NodeId;

/// Why a connection closed, as reported to event subscribers and in logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The peer closed the connection cleanly (between frames).
    PeerClosed,
    /// A socket error.
    Io(String),
    /// The peer sent bytes that break the protocol.
    Protocol(FrameError),
    /// Closed to stay within `connections_max` (least recently used).
    Evicted,
    /// A newer connection from a restarted instance of the peer replaced this one.
    Replaced,
    /// The peer was fenced.
    Fenced,
    /// Closed on request (`NetHandle::disconnect`).
    Closed,
    /// The endpoint shut down.
    Shutdown,
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::PeerClosed => write!(f, "peer closed the connection"),
            CloseReason::Io(error) => write!(f, "socket error: {error}"),
            CloseReason::Protocol(error) => write!(f, "protocol violation: {error}"),
            CloseReason::Evicted => write!(f, "evicted (connection limit)"),
            CloseReason::Replaced => write!(f, "replaced by a restarted peer's connection"),
            CloseReason::Fenced => write!(f, "peer fenced"),
            CloseReason::Closed => write!(f, "closed locally"),
            CloseReason::Shutdown => write!(f, "endpoint shut down"),
        }
    }
}

/// Per-connection limits, copied from the endpoint's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    pub send_queue_bytes_max: usize,
    pub receive_unprocessed_bytes_max: usize,
    pub message_bytes_max: usize,
    pub send_timeout: Duration,
}

/// Frames waiting for the writer.
#[derive(Debug)]
struct OutQueue {
    /// Complete, ordered pieces ready to write.
    segments: VecDeque<Bytes>,
    /// Small frames being aggregated after the last segment.
    tail: BytesMut,
    /// Bytes queued or being written (released after the write).
    queued_bytes: usize,
    /// The writer is parked waiting for work (wake it on the next push).
    writer_parked: bool,
    /// A sender found the queue full and waits for space.
    senders_waiting: bool,
    /// The socket, for direct writes by an idle sender (removed on close).
    direct: Option<Arc<NetStream>>,
    /// A direct write left ciphertext in the TLS session (the socket was full): the
    /// writer flushes it when it next runs (it was woken).
    flush_pending: bool,
    /// When a sender last found the queue empty and the writer parked.
    last_idle_send: Option<std::time::Instant>,
    /// Frames sent or queued so far.
    frames_sent: u64,
    /// Their bytes, headers included.
    bytes_sent: u64,
    /// Write system calls so far (writer task and direct writes).
    write_calls: u64,
}

/// A one-way message whose sender finds the queue empty, the writer parked, and no other
/// such send within this interval is written to the socket by the sender itself (see
/// [`Direct`]). Under load such sends are closer together, so frames go through the queue
/// and are aggregated.
const DIRECT_WRITE_IDLE_MIN: Duration = Duration::from_micros(20);

/// Whether a sender may write its frame to the socket itself (non-blocking, only when the
/// queue is empty and the writer parked), saving the wake-up of the writer task: this
/// takes two thread hand-offs out of a request/response round trip. Aggregation wins when
/// more frames are about to follow, so the caller says what it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direct {
    /// Always queue (more frames follow soon: pipelined requests, busy handlers).
    Never,
    /// Write directly if the connection was idle for [`DIRECT_WRITE_IDLE_MIN`].
    IfIdle,
    /// Write directly (a lone request, or a response with no more work queued).
    Yes,
}

/// A live connection to one peer.
pub(crate) struct Conn {
    pub peer: NodeId,
    pub peer_instance: u64,
    pub initiated_locally: bool,
    /// A direct request lane the peer opened (not the node's connection): it may carry
    /// only requests of unordered types, and its close raises no event.
    pub lane: bool,
    /// Sequence number of this connection in its endpoint (chooses the ordered lane).
    pub serial: u64,
    pub limits: ConnLimits,
    pub runtime: Handle,
    /// The role the peer's TLS certificate names (set when the tasks start; unset
    /// without TLS).
    pub cert_role: std::sync::OnceLock<CertRole>,
    out: Mutex<OutQueue>,
    writer_wake: Notify,
    space: Notify,
    closed: AtomicBool,
    close_tx: watch::Sender<bool>,
    pending: Mutex<HashMap<u32, oneshot::Sender<Result<Bytes, NetError>>>>,
    next_request_id: AtomicU32,
    next_fragmented_id: AtomicU32,
    unprocessed_bytes: AtomicUsize,
    unprocessed_bytes_peak: AtomicUsize,
    resume_reader: Notify,
    /// Held while a fragmented message is being queued.
    pub large_lane: tokio::sync::Mutex<()>,
    pub fenced: AtomicBool,
    /// The network filters (test faults) of the link to the peer.
    pub filter: LinkFilter,
    last_used_ms: AtomicU64,
    frames_received: AtomicU64,
    read_calls: AtomicU64,
    bytes_received: AtomicU64,
    receive_buffer_bytes: AtomicUsize,
}

/// Figures about one connection (for tests, monitoring and benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionStats {
    /// The peer.
    pub node: NodeId,
    /// Whether this side opened the connection.
    pub initiated_locally: bool,
    /// Bytes queued for sending (including bytes being written).
    pub queued_bytes: usize,
    /// Received bytes handed to handlers and not yet processed.
    pub unprocessed_bytes: usize,
    /// Highest `unprocessed_bytes` seen on this connection.
    pub unprocessed_bytes_peak: usize,
    /// Requests waiting for a response.
    pub pending_requests: usize,
    /// Frames sent (queued or written) on this connection.
    pub frames_sent: u64,
    /// Bytes of those frames, headers included.
    pub bytes_sent: u64,
    /// Write system calls made for them: `frames_sent / write_calls` is the aggregation.
    pub write_calls: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Read system calls that returned data.
    pub read_calls: u64,
    /// Bytes those reads returned.
    pub bytes_received: u64,
    /// How much the receive buffer reads at most at once now: 16 KiB, doubled by every
    /// read that filled its space up to 256 KiB, and back to 16 KiB after a second of
    /// quiet with nothing buffered (`RECEIVE_BUFFER_IDLE` of the reader).
    pub receive_buffer_bytes: usize,
}

impl Conn {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        peer: NodeId,
        peer_instance: u64,
        initiated_locally: bool,
        lane: bool,
        serial: u64,
        limits: ConnLimits,
        runtime: Handle,
        now_ms: u64,
    ) -> Self {
        let (close_tx, _) = watch::channel(false);
        Self {
            peer,
            peer_instance,
            initiated_locally,
            lane,
            serial,
            limits,
            runtime,
            out: Mutex::new(OutQueue {
                segments: VecDeque::new(),
                tail: BytesMut::with_capacity(AGGREGATION_BUFFER_BYTES),
                queued_bytes: 0,
                writer_parked: false,
                senders_waiting: false,
                direct: None,
                flush_pending: false,
                last_idle_send: None,
                frames_sent: 0,
                bytes_sent: 0,
                write_calls: 0,
            }),
            cert_role: std::sync::OnceLock::new(),
            writer_wake: Notify::new(),
            space: Notify::new(),
            closed: AtomicBool::new(false),
            close_tx,
            pending: Mutex::new(HashMap::new()),
            next_request_id: AtomicU32::new(1),
            next_fragmented_id: AtomicU32::new(1),
            unprocessed_bytes: AtomicUsize::new(0),
            unprocessed_bytes_peak: AtomicUsize::new(0),
            resume_reader: Notify::new(),
            large_lane: tokio::sync::Mutex::new(()),
            fenced: AtomicBool::new(false),
            filter: LinkFilter::default(),
            last_used_ms: AtomicU64::new(now_ms),
            frames_received: AtomicU64::new(0),
            read_calls: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            receive_buffer_bytes: AtomicUsize::new(crate::config::READ_BUFFER_BYTES_MIN),
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub fn last_used_ms(&self) -> u64 {
        self.last_used_ms.load(Ordering::Relaxed)
    }

    pub fn touch(&self, now_ms: u64) {
        self.last_used_ms.store(now_ms, Ordering::Relaxed);
    }

    pub fn stats(&self) -> ConnectionStats {
        let (queued_bytes, frames_sent, bytes_sent, write_calls) = {
            let queue = self.out.lock();
            (
                queue.queued_bytes,
                queue.frames_sent,
                queue.bytes_sent,
                queue.write_calls,
            )
        };
        ConnectionStats {
            node: self.peer,
            initiated_locally: self.initiated_locally,
            queued_bytes,
            unprocessed_bytes: self.unprocessed_bytes.load(Ordering::Relaxed),
            unprocessed_bytes_peak: self.unprocessed_bytes_peak.load(Ordering::Relaxed),
            pending_requests: self.pending.lock().len(),
            frames_sent,
            bytes_sent,
            write_calls,
            frames_received: self.frames_received.load(Ordering::Relaxed),
            read_calls: self.read_calls.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            receive_buffer_bytes: self.receive_buffer_bytes.load(Ordering::Relaxed),
        }
    }

    /// Records how much the receive buffer reads at once now (see
    /// [`ConnectionStats::receive_buffer_bytes`]).
    pub fn set_receive_buffer_bytes(&self, bytes: usize) {
        self.receive_buffer_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Marks the connection closed, stops its tasks and fails its outstanding requests.
    /// Returns whether this call closed it (false if it was closed already).
    pub fn close(&self) -> bool {
        if self.closed.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.close_tx.send_replace(true);
        self.out.lock().direct = None;
        let pending: Vec<_> = self.pending.lock().drain().collect();
        for (_, waiter) in pending {
            let _ = waiter.send(Err(NetError::ConnectionLost(self.peer)));
        }
        self.space.notify_waiters();
        self.resume_reader.notify_one();
        true
    }

    /// Queues one frame if there is room. `Ok(false)`: the queue is full, wait for
    /// [`Conn::enqueue_wait`]. `allowance` multiplies the queue limit (responses use 2).
    pub fn try_enqueue(
        &self,
        header: &FrameHeader,
        payload: &Bytes,
        allowance: usize,
        direct: Direct,
    ) -> Result<bool, NetError> {
        // The only fault check of this path: one relaxed load (see `crate::fault`).
        let filter = self.filter.bits();
        if filter & DROP_OUTGOING != 0 {
            // The frame is lost as on a broken network.
            return Ok(true);
        }
        // A length field that differs from the bytes queued puts the stream out of step.
        debug_assert_eq!(
            header.payload_bytes as usize,
            payload.len(),
            "frame length field and payload differ"
        );
        debug_assert!(
            payload.len() <= FRAME_PAYLOAD_BYTES_MAX,
            "a frame longer than the receiver accepts"
        );
        let frame_bytes = HEADER_BYTES + payload.len();
        let mut queue = self.out.lock();
        if self.is_closed() {
            return Err(NetError::ConnectionLost(self.peer));
        }
        let limit = self.limits.send_queue_bytes_max.saturating_mul(allowance);
        if queue.queued_bytes > 0 && queue.queued_bytes + frame_bytes > limit {
            queue.senders_waiting = true;
            return Ok(false);
        }
        queue.frames_sent += 1;
        queue.bytes_sent += frame_bytes as u64;
        let head = header.encode();
        let mut skip = 0;
        // A delayed link writes everything through the writer's delay line.
        if queue.queued_bytes == 0
            && queue.writer_parked
            && direct != Direct::Never
            && filter & DELAY_OUTGOING == 0
        {
            skip = direct_write(&mut queue, &head, payload, direct);
            debug_assert!(skip <= frame_bytes, "a direct write wrote past its frame");
            if skip == frame_bytes && !queue.flush_pending {
                return Ok(true);
            }
            // Else the rest is queued (nothing if only ciphertext stayed behind in the
            // TLS session) and the writer woken, which flushes the session.
        }
        // Queue the frame (or what the direct write left of it).
        let payload = if skip < HEADER_BYTES {
            queue
                .tail
                .extend_from_slice(head.get(skip..).unwrap_or_default());
            payload.clone()
        } else {
            payload.slice((skip - HEADER_BYTES).min(payload.len())..)
        };
        if payload.len() <= COPY_PAYLOAD_BYTES_MAX {
            queue.tail.extend_from_slice(&payload);
        } else {
            if !queue.tail.is_empty() {
                let head = queue.tail.split().freeze();
                queue.segments.push_back(head);
            }
            queue.segments.push_back(payload);
        }
        queue.queued_bytes += frame_bytes - skip;
        let wake = std::mem::replace(&mut queue.writer_parked, false);
        drop(queue);
        if wake {
            self.writer_wake.notify_one();
        }
        Ok(true)
    }

    /// Queues one frame, waiting (at most the send timeout) while the queue is full.
    pub async fn enqueue_wait(
        &self,
        header: &FrameHeader,
        payload: &Bytes,
        allowance: usize,
    ) -> Result<(), NetError> {
        let deadline = Instant::now()
            .checked_add(self.limits.send_timeout)
            .unwrap_or_else(|| Instant::now() + DEADLINE_FAR);
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.try_enqueue(header, payload, allowance, Direct::Never)? {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(NetError::SendTimeout(self.peer));
            }
        }
    }

    /// Queues a whole message of any size up to `message_bytes_max`: one frame, or
    /// fragments of [`FRAME_PAYLOAD_BYTES_MAX`] queued one by one (other senders' frames
    /// interleave between them).
    /// `template` gives kind, ordering, type and message ID; its fragment and length
    /// fields are set here.
    pub async fn send_message(
        &self,
        template: FrameHeader,
        payload: &Bytes,
        allowance: usize,
    ) -> Result<(), NetError> {
        if payload.len() > self.limits.message_bytes_max {
            return Err(NetError::MessageTooLarge {
                size_bytes: payload.len(),
                max_bytes: self.limits.message_bytes_max,
            });
        }
        let mut header = FrameHeader {
            fragment: Fragment::Whole,
            payload_bytes: 0,
            ..template
        };
        if payload.len() <= FRAME_PAYLOAD_BYTES_MAX {
            header.payload_bytes = payload.len() as u32;
            return self.enqueue_wait(&header, payload, allowance).await;
        }
        let _lane = self.large_lane.lock().await;
        if header.kind == Kind::Message {
            header.message_id = self.next_fragmented_id.fetch_add(1, Ordering::Relaxed);
        }
        let mut offset = 0;
        let mut last_queued = false;
        while offset < payload.len() {
            // The fragments of one message follow each other under `large_lane`: More...,
            // then exactly one Last, covering the payload once (docs/wire-format.md, 3).
            assert!(!last_queued, "a fragment queued after the last one");
            let end = (offset + FRAME_PAYLOAD_BYTES_MAX).min(payload.len());
            header.fragment = if end == payload.len() {
                Fragment::Last
            } else {
                Fragment::More
            };
            header.payload_bytes = (end - offset) as u32;
            self.enqueue_wait(&header, &payload.slice(offset..end), allowance)
                .await?;
            last_queued = header.fragment == Fragment::Last;
            offset = end;
        }
        assert!(
            last_queued && offset == payload.len(),
            "a fragmented message must end with its last fragment"
        );
        Ok(())
    }

    /// Registers an outstanding request; returns its ID and the response receiver.
    /// Also returns how many requests are outstanding now, this one included.
    #[allow(clippy::type_complexity)]
    pub fn register_request(
        &self,
    ) -> Result<(u32, oneshot::Receiver<Result<Bytes, NetError>>, usize), NetError> {
        let (tx, rx) = oneshot::channel();
        let mut pending = self.pending.lock();
        if self.is_closed() {
            return Err(NetError::ConnectionLost(self.peer));
        }
        if pending.len() >= PENDING_REQUESTS_MAX {
            return Err(NetError::TooManyPendingRequests(self.peer));
        }
        loop {
            let id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
            if let std::collections::hash_map::Entry::Vacant(slot) = pending.entry(id) {
                slot.insert(tx);
                return Ok((id, rx, pending.len()));
            }
        }
    }

    /// Forgets an outstanding request (timed out or abandoned): a late response is dropped.
    pub fn forget_request(&self, id: u32) {
        self.pending.lock().remove(&id);
    }

    /// Hands a response to the request waiting for it (dropped if none does).
    pub fn complete_request(&self, id: u32, payload: Bytes) {
        let waiter = self.pending.lock().remove(&id);
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(Ok(payload));
            }
            None => tracing::debug!(peer = %self.peer, id, "dropped late or unknown response"),
        }
    }

    /// The reader handed `bytes` worth of this connection's messages to handlers.
    pub fn add_unprocessed(&self, bytes: usize) {
        let now = self.unprocessed_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.unprocessed_bytes_peak
            .fetch_max(now, Ordering::Relaxed);
    }

    /// Handlers finished `bytes` worth of this connection's messages.
    pub fn release_unprocessed(&self, bytes: usize) {
        let before = self.unprocessed_bytes.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "released more bytes than were unprocessed");
        let limit = self.limits.receive_unprocessed_bytes_max;
        if before > limit && before - bytes <= limit {
            self.resume_reader.notify_one();
        }
    }

    /// Resolves when handlers brought unprocessed bytes back under the limit (or on close).
    pub async fn reader_resumed(&self) {
        self.resume_reader.notified().await
    }

    /// Counts a read call that returned `bytes` bytes.
    pub fn count_read(&self, bytes: usize) {
        self.read_calls.fetch_add(1, Ordering::Relaxed);
        self.bytes_received
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a received frame.
    pub fn count_frame(&self) {
        self.frames_received.fetch_add(1, Ordering::Relaxed);
    }

    pub fn unprocessed(&self) -> usize {
        self.unprocessed_bytes.load(Ordering::Acquire)
    }

    /// A receiver whose `changed()` completes once the connection is closed, including
    /// when it closed before this call: a task started after an early close (a connection
    /// closed between install and `Shared::run`) must still see it, or its reader would
    /// hold the socket open and the peer would keep a connection nobody uses.
    pub fn close_watch(&self) -> watch::Receiver<bool> {
        let mut receiver = self.close_tx.subscribe();
        if *receiver.borrow() {
            receiver.mark_changed();
        }
        receiver
    }

    /// Gives senders the socket for direct writes (before the tasks start).
    pub fn attach(&self, stream: Arc<NetStream>) {
        if let Some(role) = stream.peer_role() {
            let _ = self.cert_role.set(role);
        }
        if !self.is_closed() {
            self.out.lock().direct = Some(stream);
        }
    }
}

/// Writes a frame straight to the socket if the connection has been idle (see
/// [`DIRECT_WRITE_IDLE_MIN`]); returns how many of its bytes went out (0 if none).
/// Called with the queue locked, empty, and the writer parked, so no other write runs.
fn direct_write(
    queue: &mut OutQueue,
    head: &[u8; HEADER_BYTES],
    payload: &Bytes,
    direct: Direct,
) -> usize {
    debug_assert!(queue.queued_bytes == 0 && queue.writer_parked);
    let idle = direct == Direct::Yes || {
        let now = std::time::Instant::now();
        let idle = queue
            .last_idle_send
            .is_none_or(|last| now.duration_since(last) >= DIRECT_WRITE_IDLE_MIN);
        queue.last_idle_send = Some(now);
        idle
    };
    let Some(stream) = queue.direct.as_ref().filter(|_| idle) else {
        return 0;
    };
    queue.write_calls += 1;
    // Errors other than "would block" are left for the writer task to meet and report.
    let written = stream
        .try_write_vectored(&[IoSlice::new(head), IoSlice::new(payload)])
        .unwrap_or(0);
    // TLS: the session took the bytes, but the socket may not have taken all of their
    // ciphertext; the writer (woken by the caller) sends the rest.
    if written > 0 && stream.is_tls() && stream.wants_flush() {
        queue.flush_pending = true;
    }
    written
}

/// Takes everything queued (or parks the writer if there is nothing).
fn take_queued(conn: &Conn) -> Option<(VecDeque<Bytes>, usize)> {
    let mut queue = conn.out.lock();
    // A flush left by a direct write runs as a take of nothing (`write_segments` flushes).
    let flush = std::mem::take(&mut queue.flush_pending);
    if queue.queued_bytes == 0 && !flush {
        queue.writer_parked = true;
        return None;
    }
    let mut segments = std::mem::take(&mut queue.segments);
    if !queue.tail.is_empty() {
        segments.push_back(queue.tail.split().freeze());
    }
    Some((segments, queue.queued_bytes))
}

/// Writes every segment; returns the number of write calls made.
async fn write_segments(
    stream: &NetStream,
    segments: &mut VecDeque<Bytes>,
) -> std::io::Result<u64> {
    let mut calls = 0;
    while !segments.is_empty() {
        stream.writable().await?;
        let result = {
            let slices: Vec<IoSlice<'_>> = segments
                .iter()
                .take(IO_SLICES_MAX)
                .map(|segment| IoSlice::new(segment))
                .collect();
            stream.try_write_vectored(&slices)
        };
        calls += 1;
        let written = match result {
            Ok(written) => written,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        };
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let mut left = written;
        while left > 0 {
            let Some(front) = segments.front_mut() else {
                break;
            };
            if left >= front.len() {
                left -= front.len();
                segments.pop_front();
            } else {
                front.advance(left);
                left = 0;
            }
        }
    }
    // TLS: what the session holds as ciphertext goes out before the writer parks.
    stream.flush().await?;
    Ok(calls)
}

/// The writer task: drains the send queue into the socket until the connection closes.
/// Returns the reason if the socket failed.
pub(crate) async fn writer_loop(
    conn: Arc<Conn>,
    stream: Arc<NetStream>,
    clock: impl Fn() -> u64,
) -> Option<CloseReason> {
    let mut closed = conn.close_watch();
    loop {
        if conn.is_closed() {
            return None;
        }
        if conn.filter.bits() & DELAY_OUTGOING != 0 {
            // Cold: an outgoing delay is set (test filter); back here once it drained.
            if let Err(reason) = write_delayed(&conn, &stream, &clock, &mut closed).await {
                return reason;
            }
            continue;
        }
        let Some((mut segments, bytes)) = take_queued(&conn) else {
            tokio::select! {
                _ = conn.writer_wake.notified() => continue,
                _ = closed.changed() => return None,
            }
        };
        conn.touch(clock());
        let result = tokio::select! {
            result = write_segments(&stream, &mut segments) => result,
            _ = closed.changed() => return None,
        };
        let calls = match result {
            Ok(calls) => calls,
            Err(error) => return Some(CloseReason::Io(error.to_string())),
        };
        let wake_senders = {
            let mut queue = conn.out.lock();
            debug_assert!(queue.queued_bytes >= bytes, "wrote more than was queued");
            queue.queued_bytes -= bytes;
            queue.write_calls += calls;
            std::mem::replace(&mut queue.senders_waiting, false)
        };
        if wake_senders {
            conn.space.notify_waiters();
        }
    }
}

/// Takes what was queued since the last take without counting its bytes as written (they
/// stay queued while a delay line holds them), or parks the writer if nothing was.
fn take_queued_delayed(conn: &Conn) -> Option<VecDeque<Bytes>> {
    let mut queue = conn.out.lock();
    if queue.segments.is_empty() && queue.tail.is_empty() {
        queue.writer_parked = true;
        return None;
    }
    let mut segments = std::mem::take(&mut queue.segments);
    if !queue.tail.is_empty() {
        segments.push_back(queue.tail.split().freeze());
    }
    Some(segments)
}

/// The writer while an outgoing delay is set or its line still holds bytes: what is
/// queued is taken at once into a [`DelayLine`] (due the delay from now) and written when
/// due, in order. Returns `Ok` once the delay is off and the line is empty (the plain
/// writer takes over), `Err` with the writer's result when the connection ends.
async fn write_delayed(
    conn: &Conn,
    stream: &NetStream,
    clock: &impl Fn() -> u64,
    closed: &mut watch::Receiver<bool>,
) -> Result<(), Option<CloseReason>> {
    let mut line = DelayLine::default();
    // Ciphertext a direct write left before the delay was set goes out first.
    if std::mem::take(&mut conn.out.lock().flush_pending) {
        stream
            .flush()
            .await
            .map_err(|error| Some(CloseReason::Io(error.to_string())))?;
    }
    loop {
        if conn.is_closed() {
            return Err(None);
        }
        let delay = conn.filter.delay_outgoing();
        let now = Instant::now();
        if let Some(segments) = take_queued_delayed(conn) {
            for segment in segments {
                line.push(now + delay, segment);
            }
            continue;
        }
        let mut due = VecDeque::new();
        let mut bytes = 0;
        while let Some(piece) = line.pop_due(now) {
            bytes += piece.len();
            due.push_back(piece);
        }
        if bytes > 0 {
            conn.touch(clock());
            let result = tokio::select! {
                result = write_segments(stream, &mut due) => result,
                _ = closed.changed() => return Err(None),
            };
            let calls = result.map_err(|error| Some(CloseReason::Io(error.to_string())))?;
            let wake_senders = {
                let mut queue = conn.out.lock();
                assert!(
                    queue.queued_bytes >= bytes,
                    "a delay line held more bytes than were queued"
                );
                queue.queued_bytes -= bytes;
                queue.write_calls += calls;
                std::mem::replace(&mut queue.senders_waiting, false)
            };
            if wake_senders {
                conn.space.notify_waiters();
            }
            continue;
        }
        let Some(next_due) = line.next_due() else {
            if delay.is_zero() {
                return Ok(());
            }
            // Parked by `take_queued_delayed`: the next frame queued wakes us.
            tokio::select! {
                _ = conn.writer_wake.notified() => continue,
                _ = closed.changed() => return Err(None),
            }
        };
        tokio::select! {
            _ = conn.writer_wake.notified() => {}
            _ = tokio::time::sleep_until(next_due) => {}
            _ = closed.changed() => return Err(None),
        }
    }
}
