//! The client's typed errors.

use myriad_membership::MembershipError;
use myriad_meta::MetaError;
use myriad_types::{ChunkId, NodeId};
use thiserror::Error;

/// Why a client call failed.
#[derive(Debug, Clone, Error)]
pub enum ClientError {
    /// The chunk does not exist (never created, or removed).
    #[error("chunk {0} not found")]
    NotFound(ChunkId),
    /// The node that owns the chunk (or the node addressed) is not reachable or has failed.
    #[error("node {0} is unavailable")]
    NodeUnavailable(NodeId),
    /// No answer within the call's timeout.
    #[error("timed out after {timeout_ms} ms: {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The timeout that passed.
        timeout_ms: u64,
    },
    /// No superpeer answered, or the group has no leader (no quorum).
    #[error("the superpeer group is unavailable: {0}")]
    SuperpeersUnavailable(String),
    /// The superpeer group refused the request.
    #[error("the superpeer group refused: {0}")]
    Meta(MetaError),
    /// The owner could not store the chunk: no memory left, or larger than allowed.
    #[error("node {node} cannot store it: {reason}")]
    OutOfSpace {
        /// The node.
        node: NodeId,
        /// Its explanation.
        reason: String,
    },
    /// A chunk lock was not granted within its timeout.
    #[error("lock on chunk {0} not granted in time")]
    LockTimeout(ChunkId),
    /// The caller passed an invalid argument (reported before anything was sent).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A server answered with something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server failed the request for a reason of its own.
    #[error("node {node} failed the request: {reason}")]
    Server {
        /// The node.
        node: NodeId,
        /// Its explanation.
        reason: String,
    },
    /// Joining the cluster failed.
    #[error("could not join the cluster: {0}")]
    Join(String),
    /// The client was shut down.
    #[error("the client is shut down")]
    Shutdown,
}

/// Membership's errors become the client error of the same name, with the same message.
impl From<MembershipError> for ClientError {
    fn from(error: MembershipError) -> ClientError {
        match error {
            MembershipError::Timeout { what, timeout_ms } => {
                ClientError::Timeout { what, timeout_ms }
            }
            MembershipError::SuperpeersUnavailable(reason) => {
                ClientError::SuperpeersUnavailable(reason)
            }
            MembershipError::Meta(error) => ClientError::Meta(error),
            MembershipError::InvalidArgument(reason) => ClientError::InvalidArgument(reason),
            MembershipError::Protocol(reason) => ClientError::Protocol(reason),
            MembershipError::Join(reason) => ClientError::Join(reason),
        }
    }
}
