//! Membership's typed errors: what joining and talking to the superpeer group can fail
//! with. The client turns each into the `ClientError` variant of the same name and
//! message.

use myriad_meta::MetaError;
use thiserror::Error;

/// Why a membership call failed.
#[derive(Debug, Clone, Error)]
pub enum MembershipError {
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
    /// The caller passed an invalid argument (reported before anything was sent).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A superpeer answered with something this node does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Joining the cluster failed.
    #[error("could not join the cluster: {0}")]
    Join(String),
}
