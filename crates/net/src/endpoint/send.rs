//! Sending: one-way messages and requests through the node's connection, async and
//! blocking, with the synchronous fast path (queue the frame on this thread when the
//! connection is up and has room) and the async slow path (connect, wait for room,
//! fragment).
//!
//! Particular to this module: the hot path of every send. With no network filter set
//! anywhere, the filters cost one load of `Shared::faults_any` per send and one relaxed
//! load of the connection's filter bits per frame (`crate::fault`); the frame header is
//! built once per message (`whole_header`).

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::handle::NetHandle;
use super::pending::PendingResponse;
use super::{deadline_after, ensure_blocking_allowed, whole_header};
use crate::conn::Direct;
use crate::error::NetError;
use crate::handler::MessageType;
use crate::wire::{Kind, FRAME_PAYLOAD_BYTES_MAX};
use crate::NodeId;

/// Outcome of the synchronous send attempt.
pub(super) enum Fast {
    Done,
    Slow,
}

impl NetHandle {
    pub(super) fn check_size(&self, payload: &Bytes) -> Result<(), NetError> {
        let max_bytes = self.shared.config.message_bytes_max;
        if payload.len() > max_bytes {
            return Err(NetError::MessageTooLarge {
                size_bytes: payload.len(),
                max_bytes,
            });
        }
        Ok(())
    }

    fn send_fast(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
    ) -> Result<Fast, NetError> {
        self.check_open()?;
        self.check_size(payload)?;
        if self.drops_outgoing(to) {
            return Ok(Fast::Done);
        }
        if payload.len() > FRAME_PAYLOAD_BYTES_MAX {
            return Ok(Fast::Slow);
        }
        let Some(conn) = self.lookup(to) else {
            return Ok(Fast::Slow);
        };
        let header = whole_header(Kind::Message, message_type, 0, payload.len());
        match conn.try_enqueue(&header, payload, 1, Direct::IfIdle)? {
            true => Ok(Fast::Done),
            false => Ok(Fast::Slow),
        }
    }

    async fn send_slow(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
    ) -> Result<(), NetError> {
        let conn = self.shared.connection(to).await?;
        conn.send_message(whole_header(Kind::Message, message_type, 0, 0), payload, 1)
            .await
    }

    /// Sends a one-way message. Returns once it is queued (connecting first if needed,
    /// waiting while the queue is full); delivery is not confirmed.
    pub async fn send(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
    ) -> Result<(), NetError> {
        match self.send_fast(to, message_type, &payload)? {
            Fast::Done => Ok(()),
            Fast::Slow => self.send_slow(to, message_type, &payload).await,
        }
    }

    /// [`NetHandle::send`] for non-async threads.
    pub fn send_blocking(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
    ) -> Result<(), NetError> {
        ensure_blocking_allowed()?;
        match self.send_fast(to, message_type, &payload)? {
            Fast::Done => Ok(()),
            Fast::Slow => self.block_on(self.send_slow(to, message_type, &payload)),
        }
    }

    /// Sends a one-way message from any thread, inline handlers on an I/O thread
    /// included, without waiting: queued on this thread when the connection is up and has
    /// room (the common case), otherwise handed to a task on the messaging runtime that
    /// connects or waits for room. A message that takes that task may be overtaken by a
    /// later send: for messages whose order does not matter (cumulative acknowledgements).
    /// Errors found before the hand-off are returned; the task's are logged (debug).
    pub fn send_detached(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
    ) -> Result<(), NetError> {
        if let Fast::Done = self.send_fast(to, message_type, &payload)? {
            return Ok(());
        }
        let net = self.clone();
        self.runtime().spawn(async move {
            if let Err(error) = net.send_slow(to, message_type, &payload).await {
                tracing::debug!(%to, %error, "detached send failed");
            }
        });
        Ok(())
    }

    /// Sends one message to several nodes (the payload is shared, not copied); one result
    /// per node, in order.
    pub async fn send_many(
        &self,
        to: &[NodeId],
        message_type: MessageType,
        payload: Bytes,
    ) -> Vec<Result<(), NetError>> {
        let mut results = Vec::with_capacity(to.len());
        for node in to {
            results.push(self.send(*node, message_type, payload.clone()).await);
        }
        results
    }

    /// [`NetHandle::send_many`] for non-async threads.
    pub fn send_many_blocking(
        &self,
        to: &[NodeId],
        message_type: MessageType,
        payload: Bytes,
    ) -> Vec<Result<(), NetError>> {
        to.iter()
            .map(|node| self.send_blocking(*node, message_type, payload.clone()))
            .collect()
    }

    fn request_fast(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
        deadline: Instant,
    ) -> Result<Option<PendingResponse>, NetError> {
        self.check_open()?;
        self.check_size(payload)?;
        if self.drops_outgoing(to) {
            return Ok(Some(self.lost_request(to, deadline)));
        }
        if payload.len() > FRAME_PAYLOAD_BYTES_MAX {
            return Ok(None);
        }
        let Some(conn) = self.lookup(to) else {
            return Ok(None);
        };
        let (id, receiver, outstanding) = conn.register_request()?;
        let pending = PendingResponse::new(
            &self.shared,
            to,
            Some(conn.clone()),
            id,
            Some(receiver),
            deadline,
        );
        let header = whole_header(Kind::Request, message_type, id, payload.len());
        let direct = if outstanding == 1 {
            Direct::Yes
        } else {
            Direct::Never
        };
        match conn.try_enqueue(&header, payload, 1, direct)? {
            true => Ok(Some(pending)),
            false => Ok(None),
        }
    }

    fn lost_request(&self, to: NodeId, deadline: Instant) -> PendingResponse {
        PendingResponse::new(&self.shared, to, None, 0, None, deadline)
    }

    async fn request_slow(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
        deadline: Instant,
    ) -> Result<PendingResponse, NetError> {
        let conn = match tokio::time::timeout_at(deadline, self.shared.connection(to)).await {
            Ok(conn) => conn?,
            Err(_) => return Err(NetError::Timeout(to)),
        };
        let (id, receiver, _) = conn.register_request()?;
        let pending = PendingResponse::new(
            &self.shared,
            to,
            Some(conn.clone()),
            id,
            Some(receiver),
            deadline,
        );
        conn.send_message(whole_header(Kind::Request, message_type, id, 0), payload, 1)
            .await?;
        Ok(pending)
    }

    /// Sends a request and returns once it is queued; the response is collected later by
    /// awaiting the returned [`PendingResponse`] (or `wait_blocking`). The timeout counts
    /// from this call; a response arriving after it is dropped.
    pub async fn request_later(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<PendingResponse, NetError> {
        let deadline = deadline_after(timeout);
        if let Some(pending) = self.request_fast(to, message_type, &payload, deadline)? {
            return Ok(pending);
        }
        self.request_slow(to, message_type, &payload, deadline)
            .await
    }

    /// [`NetHandle::request_later`] for non-async threads.
    pub fn request_later_blocking(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<PendingResponse, NetError> {
        ensure_blocking_allowed()?;
        let deadline = deadline_after(timeout);
        if let Some(pending) = self.request_fast(to, message_type, &payload, deadline)? {
            return Ok(pending);
        }
        self.block_on(self.request_slow(to, message_type, &payload, deadline))
    }

    /// Sends a request and waits for its response (at most `timeout`).
    pub async fn request(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, NetError> {
        self.request_later(to, message_type, payload, timeout)
            .await?
            .await
    }

    /// [`NetHandle::request`] for non-async threads.
    ///
    /// A request of an unordered type whose payload fits one frame goes over a direct
    /// request lane when one can be had: a connection to `to` that this thread takes from
    /// a per-node pool, writes the request to and reads the response from itself (one
    /// write and usually one read system call, no hand-off to the I/O thread), then hands
    /// back. At most `Config::lanes_per_node_max` lanes per node; when all are busy, the
    /// peer refuses another, a fault switch is set for `to`, or lanes are off, the request
    /// goes through the node's connection as [`NetHandle::request`] does. Errors are the
    /// same either way (a lane failing to open gives the connection's errors: `Fenced`,
    /// `UnknownNode`, `ConnectTimeout`, `ConnectRefused`, `ConnectFailed`,
    /// `AuthenticationFailed`; a lane
    /// that breaks gives `ConnectionLost`; no response in time gives `Timeout`). With no
    /// connection to the node, it is opened first (as any request would), so connection
    /// events keep reporting the node.
    pub fn request_blocking(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, NetError> {
        ensure_blocking_allowed()?;
        if let Some(result) = self.request_on_lane(to, message_type, &payload, timeout) {
            return result;
        }
        self.request_later_blocking(to, message_type, payload, timeout)?
            .wait_blocking()
    }

    /// Several [`NetHandle::request_blocking`]s at once, for non-async threads: every
    /// request is sent before any response is awaited, so requests to different nodes are
    /// served in parallel while this thread waits once. Each request takes a direct lane
    /// of its node when it can (one write now, its response read by this thread later)
    /// and otherwise goes through the node's connection. Results come in request order,
    /// each with the errors [`NetHandle::request_blocking`] gives; all share one deadline,
    /// `timeout` from now.
    pub fn requests_blocking(
        &self,
        requests: Vec<(NodeId, MessageType, Bytes)>,
        timeout: Duration,
    ) -> Vec<Result<Bytes, NetError>> {
        if let Err(error) = ensure_blocking_allowed() {
            return requests.iter().map(|_| Err(error.clone())).collect();
        }
        let deadline = super::lanes::lane_deadline(timeout);
        let message_bytes_max = self.shared.config.message_bytes_max;
        let caller = self.shared.lanes.caller();
        let steps: Vec<Step> = requests
            .into_iter()
            .map(|(to, message_type, payload)| {
                match self.acquire_lane(to, message_type, &payload, deadline) {
                    Some(Ok(mut lane)) => {
                        let header = whole_header(Kind::Request, message_type, 0, payload.len());
                        match lane.send(header, &payload) {
                            Ok(sent) => Step::Lane(to, lane, sent),
                            Err(failure) => Step::Done(self.release_lane(to, lane, Err(failure))),
                        }
                    }
                    Some(Err(error)) => Step::Done(Err(error)),
                    None => {
                        let left = deadline.saturating_duration_since(std::time::Instant::now());
                        match self.request_later_blocking(to, message_type, payload, left) {
                            Ok(pending) => Step::Connection(pending),
                            Err(error) => Step::Done(Err(error)),
                        }
                    }
                }
            })
            .collect();
        steps
            .into_iter()
            .map(|step| match step {
                Step::Lane(to, mut lane, sent) => {
                    let spin = caller.spin(self.shared.config.lane_spin);
                    let result = lane.receive(&sent, deadline, spin, message_bytes_max);
                    caller.spun_on(&mut lane);
                    self.release_lane(to, lane, result)
                }
                Step::Connection(pending) => pending.wait_blocking(),
                Step::Done(result) => result,
            })
            .collect()
    }
}

/// One request of [`NetHandle::requests_blocking`] between its send and its response.
enum Step {
    /// Sent on a direct lane; the response is read from it.
    Lane(NodeId, crate::lane::Lane, crate::wire::FrameHeader),
    /// Sent through the node's connection.
    Connection(PendingResponse),
    /// Already ended (refused before sending, or the send failed).
    Done(Result<Bytes, NetError>),
}
