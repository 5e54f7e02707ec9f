//! Message types, handlers and what a handler receives.
//!
//! A [`MessageType`] is a (type, subtype) byte pair plus whether it is ordered. Each type
//! that a node may receive has one [`Handler`], registered in [`Handlers`] before the
//! endpoint starts (or later with `NetHandle::register`; a frame of a type with no handler
//! closes its connection, so register before peers may send it).
//!
//! Handlers run on the endpoint's handler threads (plain threads, not async tasks), so a
//! handler may block, call the blocking send API, or keep the [`Responder`] and answer
//! later from any thread. Messages of ordered types reach their handler one at a time in
//! send order per connection; others run concurrently on all handler threads.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::conn::{Conn, Direct};
use crate::error::NetError;
use crate::tls::CertRole;
use crate::wire::Kind;
use crate::NodeId;

/// A message type: type and subtype bytes, and whether its messages are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageType {
    /// Type byte (by convention one per layer or service).
    pub type_id: u8,
    /// Subtype byte (the operation within the service).
    pub subtype: u8,
    /// Messages of this type are handled strictly in send order per connection.
    pub ordered: bool,
}

impl MessageType {
    /// A type whose messages are handled concurrently.
    pub const fn unordered(type_id: u8, subtype: u8) -> Self {
        Self {
            type_id,
            subtype,
            ordered: false,
        }
    }

    /// A type whose messages are handled one at a time in send order per connection.
    pub const fn ordered(type_id: u8, subtype: u8) -> Self {
        Self {
            type_id,
            subtype,
            ordered: true,
        }
    }
}

pub(crate) fn type_key(type_id: u8, subtype: u8) -> u16 {
    u16::from_le_bytes([subtype, type_id])
}

/// Receives the messages of one type. Implemented for every `Fn(Incoming)`.
pub trait Handler: Send + Sync + 'static {
    /// Handles one message or request. A panic is caught and logged; the message counts
    /// as processed.
    fn handle(&self, message: Incoming);
}

impl<F> Handler for F
where
    F: Fn(Incoming) + Send + Sync + 'static,
{
    fn handle(&self, message: Incoming) {
        self(message)
    }
}

#[derive(Clone)]
pub(crate) struct Registered {
    pub ordered: bool,
    /// Runs on the connection's reader task instead of the handler pool.
    pub inline: bool,
    pub handler: Arc<dyn Handler>,
    /// Who may send this type (`None`: any authenticated node); see [`Handlers::restrict`].
    pub senders: Option<SenderCheck>,
}

/// Whether a node may send a message type: asked on the reader task for every message
/// of a restricted type, so it must be quick and never block.
pub type SenderCheck = Arc<dyn Fn(NodeId) -> bool + Send + Sync>;

pub(crate) type HandlerMap = HashMap<u16, Registered>;

/// The handlers an endpoint starts with.
#[derive(Default, Clone)]
pub struct Handlers {
    pub(crate) map: HandlerMap,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handlers")
            .field("types", &self.map.len())
            .finish()
    }
}

impl Handlers {
    /// No handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for `message_type`; fails if the type has one already.
    pub fn register(
        &mut self,
        message_type: MessageType,
        handler: impl Handler,
    ) -> Result<&mut Self, NetError> {
        insert(&mut self.map, message_type, Arc::new(handler), false)?;
        Ok(self)
    }

    /// Registers a handler that runs inline on the I/O thread that read the message, with
    /// no hand-off to the handler pool: the lowest latency, for short handlers that never
    /// block (no locks held long, no blocking sends, no I/O), e.g. a memory-manager get.
    /// A blocking inline handler stalls every connection served by that I/O thread.
    /// Ordered types cannot be inline here (their order is kept by the pool's lanes);
    /// see [`Handlers::register_inline_ordered`].
    pub fn register_inline(
        &mut self,
        message_type: MessageType,
        handler: impl Handler,
    ) -> Result<&mut Self, NetError> {
        insert(&mut self.map, message_type, Arc::new(handler), true)?;
        Ok(self)
    }

    /// Registers an inline handler (see [`Handlers::register_inline`]) for an *ordered*
    /// type. The reader task handles one connection's frames in stream order, so the
    /// handler sees the messages of a connection in send order; it keeps that order
    /// itself if it hands some of them to other threads. For a hot ordered type whose
    /// handler is short in the common case (a backup appending a replication message to
    /// its write buffer), which a hand-off to the pool would cost a thread switch.
    pub fn register_inline_ordered(
        &mut self,
        message_type: MessageType,
        handler: impl Handler,
    ) -> Result<&mut Self, NetError> {
        insert_checked(&mut self.map, message_type, Arc::new(handler), true, true)?;
        Ok(self)
    }

    /// Lets only senders for which `allowed` holds send `message_type` (registered
    /// before): a frame of that type from any other node closes its connection
    /// ([`FrameError::SenderRefused`](crate::FrameError::SenderRefused), logged) before
    /// the handler sees anything. Enforces roles: e.g. only superpeers push membership
    /// events, clients never replicate. `allowed` runs on the reader task for every such
    /// frame: keep it a quick lookup. A second call replaces the first check.
    pub fn restrict(
        &mut self,
        message_type: MessageType,
        allowed: impl Fn(NodeId) -> bool + Send + Sync + 'static,
    ) -> Result<&mut Self, NetError> {
        restrict_in(&mut self.map, message_type, Arc::new(allowed))?;
        Ok(self)
    }

    /// Whether `message_type` is restricted to some senders ([`Handlers::restrict`]).
    pub fn is_restricted(&self, message_type: MessageType) -> bool {
        self.map
            .get(&type_key(message_type.type_id, message_type.subtype))
            .is_some_and(|entry| entry.senders.is_some())
    }
}

/// Sets the sender check of `message_type`'s registered handler.
pub(crate) fn restrict_in(
    map: &mut HandlerMap,
    message_type: MessageType,
    allowed: SenderCheck,
) -> Result<(), NetError> {
    let key = type_key(message_type.type_id, message_type.subtype);
    let entry = map.get_mut(&key).ok_or(NetError::NoHandler {
        type_id: message_type.type_id,
        subtype: message_type.subtype,
    })?;
    entry.senders = Some(allowed);
    Ok(())
}

pub(crate) fn insert(
    map: &mut HandlerMap,
    message_type: MessageType,
    handler: Arc<dyn Handler>,
    inline: bool,
) -> Result<(), NetError> {
    insert_checked(map, message_type, handler, inline, false)
}

/// [`insert`], with `ordered_inline` allowing an ordered type inline.
pub(crate) fn insert_checked(
    map: &mut HandlerMap,
    message_type: MessageType,
    handler: Arc<dyn Handler>,
    inline: bool,
    ordered_inline: bool,
) -> Result<(), NetError> {
    let key = type_key(message_type.type_id, message_type.subtype);
    if inline && message_type.ordered && !ordered_inline {
        return Err(NetError::OrderedInline {
            type_id: message_type.type_id,
            subtype: message_type.subtype,
        });
    }
    if map.contains_key(&key) {
        return Err(NetError::DuplicateHandler {
            type_id: message_type.type_id,
            subtype: message_type.subtype,
        });
    }
    map.insert(
        key,
        Registered {
            ordered: message_type.ordered,
            inline,
            handler,
            senders: None,
        },
    );
    Ok(())
}

/// A message or request as a handler receives it.
pub struct Incoming {
    /// The sender.
    pub from: NodeId,
    /// The message's type.
    pub message_type: MessageType,
    /// The payload (shares the receive buffer; no copy was made).
    pub payload: Bytes,
    responder: Option<Responder>,
    cert_role: Option<CertRole>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("from", &self.from)
            .field("message_type", &self.message_type)
            .field("payload_bytes", &self.payload.len())
            .field("is_request", &self.responder.is_some())
            .finish()
    }
}

impl Incoming {
    pub(crate) fn new(
        from: NodeId,
        message_type: MessageType,
        payload: Bytes,
        responder: Option<Responder>,
        cert_role: Option<CertRole>,
    ) -> Self {
        Self {
            from,
            message_type,
            cert_role,
            payload,
            responder,
        }
    }

    /// Whether the sender waits for a response.
    pub fn is_request(&self) -> bool {
        self.responder.is_some()
    }

    /// The role named by the TLS certificate the sender presented on the connection this
    /// message came on (`None` without TLS, or for a certificate naming no single role).
    pub fn cert_role(&self) -> Option<CertRole> {
        self.cert_role
    }

    /// Takes the responder to answer later, possibly from another thread. `None` for a
    /// one-way message (or if taken already).
    pub fn take_responder(&mut self) -> Option<Responder> {
        self.responder.take()
    }

    /// Answers the request now. Fails with `ConnectionLost` if the message was not a
    /// request or the connection is gone.
    pub fn respond(mut self, payload: Bytes) -> Result<(), NetError> {
        match self.responder.take() {
            Some(responder) => responder.respond(payload),
            None => Err(NetError::ConnectionLost(self.from)),
        }
    }
}

/// Answers one request, from any thread, once. Dropping it without answering leaves the
/// requester to time out.
pub struct Responder {
    conn: Arc<Conn>,
    request_id: u32,
    type_id: u8,
    subtype: u8,
    direct: Direct,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("to", &self.conn.peer)
            .field("request_id", &self.request_id)
            .finish()
    }
}

/// Responses may fill the send queue to this multiple of its limit before they wait, so
/// that a handler answering a request is not stuck behind the node's own messages.
const RESPONSE_QUEUE_ALLOWANCE: usize = 2;

impl Responder {
    pub(crate) fn new(
        conn: Arc<Conn>,
        request_id: u32,
        type_id: u8,
        subtype: u8,
        direct: Direct,
    ) -> Self {
        Self {
            conn,
            request_id,
            type_id,
            subtype,
            direct,
        }
    }

    /// The node waiting for this response.
    pub fn to(&self) -> NodeId {
        self.conn.peer
    }

    /// Sends the response. Small responses are queued at once; a full queue or a large
    /// response waits (bounded by the send timeout) on this thread, or in a spawned task
    /// when called from inside an async runtime (then errors are only logged).
    pub fn respond(self, payload: Bytes) -> Result<(), NetError> {
        let header = crate::wire::FrameHeader {
            kind: Kind::Response,
            ordered: false,
            fragment: crate::wire::Fragment::Whole,
            type_id: self.type_id,
            subtype: self.subtype,
            message_id: self.request_id,
            payload_bytes: payload.len() as u32,
        };
        if payload.len() <= crate::wire::FRAME_PAYLOAD_BYTES_MAX
            && self
                .conn
                .try_enqueue(&header, &payload, RESPONSE_QUEUE_ALLOWANCE, self.direct)?
        {
            return Ok(());
        }
        let conn = self.conn.clone();
        let send = async move {
            conn.send_message(header, &payload, RESPONSE_QUEUE_ALLOWANCE)
                .await
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            let peer = self.conn.peer;
            self.conn.runtime.spawn(async move {
                if let Err(error) = send.await {
                    tracing::warn!(%peer, %error, "response not sent");
                }
            });
            Ok(())
        } else {
            self.conn.runtime.block_on(send)
        }
    }
}

/// A message ready for a handler.
pub(crate) struct Delivery {
    pub kind: Kind,
    pub type_id: u8,
    pub subtype: u8,
    pub ordered: bool,
    pub message_id: u32,
    pub payload: Bytes,
    pub handler: Arc<dyn Handler>,
}

/// Runs one delivery's handler (catching panics) and builds its `Incoming`. `direct`:
/// whether a response may skip the writer task (no more work of this connection queued).
pub(crate) fn run(conn: &Arc<Conn>, delivery: Delivery, direct: Direct) {
    let responder = (delivery.kind == Kind::Request).then(|| {
        Responder::new(
            conn.clone(),
            delivery.message_id,
            delivery.type_id,
            delivery.subtype,
            direct,
        )
    });
    let message_type = MessageType {
        type_id: delivery.type_id,
        subtype: delivery.subtype,
        ordered: delivery.ordered,
    };
    let incoming = Incoming::new(
        conn.peer,
        message_type,
        delivery.payload,
        responder,
        conn.cert_role.get().copied(),
    );
    let handler = delivery.handler;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        handler.handle(incoming);
    }));
    if outcome.is_err() {
        tracing::error!(
            peer = %conn.peer,
            type_id = delivery.type_id,
            subtype = delivery.subtype,
            "message handler panicked"
        );
    }
}
