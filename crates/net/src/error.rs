//! Errors of the messaging layer.
//!
//! [`NetError`] is what the sending API returns; it is `Clone` so that one failed
//! connection attempt can be reported to every caller waiting on it. [`FrameError`] and
//! [`HandshakeError`] describe bad input from a peer: the connection that produced them is
//! closed and the reason logged, they never reach a sender. Payload decoding errors are
//! `myriad_types::DecodeError`.

use std::sync::Arc;

use crate::NodeId;

/// Why a send, request or connection attempt failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NetError {
    /// No address is known for the node.
    #[error("no address known for node {0}")]
    UnknownNode(NodeId),
    /// The node is fenced: nothing is sent to it or accepted from it.
    #[error("node {0} is fenced")]
    Fenced(NodeId),
    /// Connecting (TCP connect plus handshake) did not finish in time.
    #[error("connecting to node {0} timed out")]
    ConnectTimeout(NodeId),
    /// The node's address refused the TCP connection: nothing listens there (its process
    /// is gone or has not started).
    #[error("node {0} refused the connection")]
    ConnectRefused(NodeId),
    /// Connecting failed.
    #[error("connecting to node {node} failed: {reason}")]
    ConnectFailed {
        /// The node we tried to reach.
        node: NodeId,
        /// What went wrong.
        reason: String,
    },
    /// The peer could not prove it knows the cluster secret, or refused our proof.
    #[error("authentication with node {0} failed")]
    AuthenticationFailed(NodeId),
    /// The connection closed before the operation completed.
    #[error("connection to node {0} was lost")]
    ConnectionLost(NodeId),
    /// No response arrived within the request's timeout.
    #[error("request to node {0} timed out")]
    Timeout(NodeId),
    /// The send queue stayed full for longer than the send timeout (the receiver does not
    /// keep up).
    #[error("send to node {0} timed out waiting for queue space")]
    SendTimeout(NodeId),
    /// The payload exceeds the configured maximum message size.
    #[error("message of {size_bytes} bytes exceeds the maximum of {max_bytes}")]
    MessageTooLarge {
        /// Size of the rejected payload.
        size_bytes: usize,
        /// The configured maximum (`Config::message_bytes_max`).
        max_bytes: usize,
    },
    /// Too many requests to this node are waiting for responses.
    #[error("too many outstanding requests to node {0}")]
    TooManyPendingRequests(NodeId),
    /// The endpoint was shut down.
    #[error("the endpoint is shut down")]
    Shutdown,
    /// A blocking call was made on a thread that runs async tasks (it would stall the
    /// runtime); use the async API there.
    #[error("blocking call made from inside an async runtime; use the async API")]
    BlockingInAsyncContext,
    /// Setting up the endpoint failed (binding the listener, starting threads).
    #[error("endpoint start-up failed: {0}")]
    Startup(Arc<std::io::Error>),
    /// Ordered types cannot have inline handlers.
    #[error("message type {type_id}/{subtype} is ordered and cannot be handled inline")]
    OrderedInline {
        /// Type byte.
        type_id: u8,
        /// Subtype byte.
        subtype: u8,
    },
    /// A message type has no handler (to restrict).
    #[error("message type {type_id}/{subtype} has no handler")]
    NoHandler {
        /// Type byte.
        type_id: u8,
        /// Subtype byte.
        subtype: u8,
    },
    /// A message type is already registered.
    #[error("message type {type_id}/{subtype} is already registered")]
    DuplicateHandler {
        /// Type byte.
        type_id: u8,
        /// Subtype byte.
        subtype: u8,
    },
}

/// Bad bytes on a connection after the handshake. The connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Byte 3 of the header is not the frame marker (the stream is out of step or garbage).
    #[error("bad frame marker {0:#04x}")]
    BadMarker(u8),
    /// The flags byte holds reserved bits or an impossible combination.
    #[error("bad flags byte {0:#04x}")]
    BadFlags(u8),
    /// The payload length exceeds the frame payload maximum.
    #[error("frame payload length {length_bytes} exceeds the maximum {max_bytes}")]
    LengthTooLarge {
        /// Declared length.
        length_bytes: u64,
        /// Maximum allowed.
        max_bytes: usize,
    },
    /// A fragment does not continue the message being reassembled.
    #[error("fragment does not match the message being reassembled")]
    FragmentMismatch,
    /// A continuation or last fragment arrived with no message being reassembled.
    #[error("fragment continues no message")]
    OrphanFragment,
    /// A new fragmented message started before the previous one finished.
    #[error("fragmented messages interleaved")]
    InterleavedFragments,
    /// A reassembled message grew beyond the maximum message size.
    #[error("reassembled message exceeds {max_bytes} bytes")]
    MessageTooLarge {
        /// Maximum allowed.
        max_bytes: usize,
    },
    /// No handler is registered for the message type.
    #[error("unknown message type {type_id}/{subtype}")]
    UnknownType {
        /// Type byte.
        type_id: u8,
        /// Subtype byte.
        subtype: u8,
    },
    /// The sender may not send this type ([`crate::Handlers::restrict`]): e.g. a client
    /// sending a message only peers or superpeers exchange.
    #[error("node {from} may not send message type {type_id}/{subtype}")]
    SenderRefused {
        /// The sender.
        from: NodeId,
        /// Type byte.
        type_id: u8,
        /// Subtype byte.
        subtype: u8,
    },
    /// The ordered flag contradicts the registered type.
    #[error("ordered flag of type {type_id}/{subtype} contradicts its registration")]
    OrderingMismatch {
        /// Type byte.
        type_id: u8,
        /// Subtype byte.
        subtype: u8,
    },
    /// A direct request lane carried something other than a request of an unordered type.
    #[error("type {type_id}/{subtype} sent on a lane is not an unordered request")]
    NotALaneRequest {
        /// Type byte.
        type_id: u8,
        /// Subtype byte.
        subtype: u8,
    },
    /// The stream ended inside a frame.
    #[error("connection ended inside a frame ({buffered_bytes} bytes buffered)")]
    Truncated {
        /// Bytes of the incomplete frame that had arrived.
        buffered_bytes: usize,
    },
}

/// Bad bytes during the handshake, or a failed proof.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The magic bytes are wrong (not a Myriad node).
    #[error("bad handshake magic")]
    BadMagic,
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    /// A reserved byte is not zero.
    #[error("reserved handshake byte is not zero")]
    BadReserved,
    /// The HMAC does not match: the peer does not know the cluster secret.
    #[error("HMAC proof does not match")]
    BadProof,
    /// The peer claims a node ID it must not have (ours, or not the one we dialed).
    #[error("unexpected node ID {0}")]
    UnexpectedNode(u16),
    /// The verdict byte is not one of the defined values.
    #[error("bad verdict byte {0}")]
    BadVerdict(u8),
}
