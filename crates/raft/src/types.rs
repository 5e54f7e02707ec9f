//! The openraft type configuration of the superpeer group and short names for the openraft
//! types this crate encodes.
//!
//! Log payloads are [`Command`]s, state-machine answers are [`Response`]s, node IDs are
//! `u64` holding Myriad's 16-bit node ID, and each member carries its address.

use std::fmt;

use myriad_meta::{Command, Response};

openraft::declare_raft_types!(
    /// The openraft type configuration of Myriad's superpeer group.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = SuperpeerNode,
        Term = u64,
        LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, u64>,
        Vote = openraft::impls::Vote<LeaderId>,
        AsyncRuntime = openraft_rt_tokio::TokioRuntime,
);

/// A member of the superpeer group as the Raft membership records it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SuperpeerNode {
    /// Where the superpeer's messaging layer listens (`host:port`).
    pub address: String,
}

impl SuperpeerNode {
    /// A member listening at `address`.
    pub fn new(address: impl Into<String>) -> SuperpeerNode {
        SuperpeerNode {
            address: address.into(),
        }
    }
}

impl fmt::Display for SuperpeerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.address)
    }
}

/// The leader of a term: `(term, node ID)`; also the "committed leader ID" of log IDs.
pub type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, u64>;
/// A vote: a leader ID and whether a quorum granted it.
pub type Vote = openraft::impls::Vote<LeaderId>;
/// The ID of a log entry: the leader that proposed it and its index.
pub type LogId = openraft::LogId<LeaderId>;
/// The payload of a log entry: blank, a command, or a membership.
pub type EntryPayload = openraft::EntryPayload<Command, u64, SuperpeerNode>;
/// One log entry.
pub type Entry = openraft::Entry<LeaderId, EntryPayload>;
/// A group membership: voter sets (two during a joint change) and every node's address.
pub type Membership = openraft::Membership<u64, SuperpeerNode>;
/// A membership with the ID of the log entry that introduced it.
pub type StoredMembership = openraft::StoredMembership<LeaderId, u64, SuperpeerNode>;
/// What a snapshot covers: the last log entry applied and the membership then.
pub type SnapshotMeta = openraft::SnapshotMeta<LeaderId, u64, SuperpeerNode>;
/// A snapshot: its meta and the [`myriad_meta::MetaState::snapshot`] bytes.
pub type Snapshot = openraft::storage::Snapshot<LeaderId, u64, SuperpeerNode, Vec<u8>>;
