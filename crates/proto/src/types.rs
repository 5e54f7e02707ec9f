//! The message types of the cluster protocol (type and subtype bytes of the messaging
//! layer's header). Types below 8 are reserved for the messaging layer's own tests and
//! benchmarks; `myriad-bench` uses 200 and above.
//!
//! Every handler must be registered before other nodes can send that type: a node that
//! receives a type it has no handler for closes the connection.

use myriad_net::MessageType;

/// Superpeer to superpeer: one Raft RPC (request; the payload is `myriad-raft`'s RPC
/// encoding, answered with its reply encoding).
pub const RAFT_RPC: MessageType = MessageType::unordered(10, 0);

/// Any node to any superpeer: a [`crate::meta::MetaRequest`], answered with a
/// [`crate::meta::MetaReply`].
pub const META_REQUEST: MessageType = MessageType::unordered(11, 0);
/// A joining node to any superpeer: [`crate::meta::JoinRequest`] → [`crate::meta::JoinReply`].
pub const JOIN: MessageType = MessageType::unordered(11, 1);
/// Superpeer to a node it watches: [`crate::meta::Heartbeat`] → [`crate::meta::HeartbeatReply`].
pub const HEARTBEAT: MessageType = MessageType::unordered(11, 2);
/// A node to a superpeer: it lost its connection to another node
/// ([`crate::meta::FailureReport`], one-way).
pub const FAILURE_REPORT: MessageType = MessageType::unordered(11, 3);
/// Superpeer to every node: committed membership and ownership changes, in order
/// ([`crate::meta::EventPush`], one-way).
pub const EVENT: MessageType = MessageType::ordered(11, 4);
/// Superpeer to a barrier's participants: the round they waited for is complete
/// ([`crate::meta::BarrierReleased`], one-way).
pub const BARRIER_RELEASED: MessageType = MessageType::unordered(11, 5);

/// Client to peer: [`crate::chunk::ChunkRequest`] → [`crate::chunk::ChunkReply`].
pub const CHUNK: MessageType = MessageType::unordered(20, 0);

/// Client to the peer that owns a CID range: move the range to another peer
/// ([`crate::migrate::MigrateRequest`] → [`crate::migrate::MigrateReply`]).
pub const MIGRATE: MessageType = MessageType::unordered(20, 1);

/// Operator to a peer: leave the cluster and exit (`nodeshutdown` in `myriad term`;
/// request, answered with an empty payload before the node shuts down).
pub const NODE_SHUTDOWN: MessageType = MessageType::unordered(12, 0);
/// Operator to a peer or superpeer: set or read its log filter
/// ([`crate::logctl::LogLevelRequest`] → [`crate::logctl::TextReply`]; `loggerlevel`).
pub const LOG_LEVEL: MessageType = MessageType::unordered(12, 1);
/// Operator to a peer: its log engine's state as JSON (empty request →
/// [`crate::logctl::TextReply`]; `loginfo`).
pub const LOG_INFO: MessageType = MessageType::unordered(12, 2);
/// Operator to a peer: the chunk locks held there, as JSON (empty request →
/// [`crate::logctl::TextReply`]; `chunklocklist`).
pub const LOCK_LIST: MessageType = MessageType::unordered(12, 3);

/// Superpeer leader to a backup of a failed peer's zone: restore the zone here and take its
/// CIDs over ([`crate::recovery::RecoverRequest`] → [`crate::recovery::RecoverReply`]).
pub const RECOVER: MessageType = MessageType::unordered(40, 0);
/// Any node to a superpeer: the leader's recovery table (empty request →
/// [`crate::recovery::RecoveryStatusReply`]).
pub const RECOVERY_STATUS: MessageType = MessageType::unordered(40, 1);

/// Peer to every superpeer, every few seconds: its summary
/// ([`crate::monitor::MonitorReport`], one-way).
pub const MONITOR_REPORT: MessageType = MessageType::unordered(13, 0);
/// Any node to a superpeer: the reports it kept ([`crate::monitor::MonitorQuery`] →
/// [`crate::monitor::MonitorReply`]).
pub const MONITOR_QUERY: MessageType = MessageType::unordered(13, 1);
