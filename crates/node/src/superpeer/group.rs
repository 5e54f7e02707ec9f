//! The superpeer group as it changes at runtime: serving `AddSuperpeer` and
//! `RemoveSuperpeer` (through `myriad_raft::MetaRaft::add_superpeer` and
//! `remove_superpeer`, openraft's joint consensus), and keeping this superpeer's view of
//! the group (its member list, the addresses its messaging layer dials, who may send it
//! Raft messages) in step with the Raft membership.
//!
//! Invariants: the Raft membership is the truth; the member list follows it within
//! [`FOLLOW_INTERVAL`] (at once on the leader after a change it made, and on any superpeer
//! that answers a status request, whose member list is the Raft membership of that
//! moment); a superpeer added is registered in the node table (role superpeer) by the
//! leader right after the change, as the configured ones are at the group's start.
//! Configured members stay
//! allowed to send Raft messages after a removal (the membership, not the sender check,
//! keeps a removed member out of the quorum).
//!
//! Called by: `Core::serve` (the requests) and the superpeer's start (the follower task).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use myriad_proto::meta::{MetaReply, StatusReply};
use myriad_raft::{GroupChangeError, GroupMembers, MetaRaft};
use myriad_types::NodeId;

use super::Core;

/// How often a superpeer compares its member list with the Raft membership.
pub(crate) const FOLLOW_INTERVAL: Duration = Duration::from_millis(200);

fn change_error(error: GroupChangeError) -> MetaReply {
    match error {
        GroupChangeError::ForwardToLeader { leader } => MetaReply::NotLeader {
            leader: leader.and_then(|id| u16::try_from(id).ok()).map(NodeId),
        },
        GroupChangeError::Refused(reason) => MetaReply::Response(myriad_meta::Response::Error(
            myriad_meta::MetaError::InvalidArgument(reason),
        )),
        GroupChangeError::OutcomeUnknown(reason) => MetaReply::Unavailable(reason),
    }
}

impl Core {
    /// Adopts `group` as the member list: every member with a parseable address, and the
    /// messaging layer's address for each other member.
    pub(crate) fn adopt_group(&self, group: &GroupMembers) {
        if group.nodes.is_empty() {
            return;
        }
        let members: Vec<(NodeId, SocketAddr)> = group
            .nodes
            .iter()
            .filter_map(|(id, address)| {
                let id = NodeId(u16::try_from(*id).ok()?);
                Some((id, address.parse::<SocketAddr>().ok()?))
            })
            .collect();
        for (id, address) in &members {
            if *id != self.id && self.net.address(*id) != Some(*address) {
                self.net.set_address(*id, *address);
            }
        }
        let mut current = self.members.write();
        if *current != members {
            tracing::info!(
                superpeer = %self.id,
                members = ?members.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
                "superpeer group changed"
            );
            *current = members;
        }
    }

    /// The leader's status reply after a change.
    fn group_status(&self, raft: &MetaRaft) -> MetaReply {
        let metrics = raft.metrics();
        MetaReply::Status(StatusReply {
            node: self.id,
            epoch: raft.read_local(myriad_meta::MetaState::epoch),
            leader: metrics
                .leader
                .and_then(|id| u16::try_from(id).ok())
                .map(NodeId),
            term: metrics.term,
            last_log_index: metrics.last_log_index,
            last_applied_index: metrics.last_applied_index,
            members: self
                .members()
                .iter()
                .map(|(id, address)| (*id, address.to_string()))
                .collect(),
        })
    }

    /// Serves `AddSuperpeer`: the new member catches up as a learner, then votes, and is
    /// registered in the node table.
    pub(crate) async fn add_superpeer(self: &Arc<Self>, id: NodeId, address: String) -> MetaReply {
        let Some(raft) = self.raft() else {
            return MetaReply::Unavailable("stopped: Raft not started".to_owned());
        };
        let Ok(parsed) = address.parse::<SocketAddr>() else {
            return change_error(GroupChangeError::Refused(format!(
                "bad superpeer address {address:?} (HOST:PORT with an IP address)"
            )));
        };
        if !raft.is_leader() {
            return change_error(GroupChangeError::ForwardToLeader {
                leader: raft.leader(),
            });
        }
        // A node ID is one node's: a peer's or client's ID cannot become a superpeer's.
        let taken = raft.read_local(|state| {
            state
                .node(id)
                .filter(|record| record.role != myriad_meta::Role::Superpeer)
                .map(|record| format!("{:?}", record.role))
        });
        if let Some(role) = taken {
            return change_error(GroupChangeError::Refused(format!(
                "node ID {id} belongs to a {role} (pick an unused ID)"
            )));
        }
        if id != self.id {
            self.net.set_address(id, parsed);
        }
        tracing::info!(superpeer = %id, %address, "adding a superpeer to the group");
        match raft.add_superpeer(u64::from(id.0), address).await {
            Ok(group) => {
                self.adopt_group(&group);
                // Register the new member in the node table, as the configured ones are.
                self.registered.store(false, Ordering::Release);
                if let Err(reply) = self.ensure_registered().await {
                    tracing::warn!(?reply, superpeer = %id, "new superpeer not registered yet");
                }
                self.group_status(raft)
            }
            Err(error) => {
                tracing::warn!(superpeer = %id, %error, "adding a superpeer failed");
                change_error(error)
            }
        }
    }

    /// Serves `RemoveSuperpeer`.
    pub(crate) async fn remove_superpeer(self: &Arc<Self>, id: NodeId) -> MetaReply {
        let Some(raft) = self.raft() else {
            return MetaReply::Unavailable("stopped: Raft not started".to_owned());
        };
        tracing::info!(superpeer = %id, "removing a superpeer from the group");
        match raft.remove_superpeer(u64::from(id.0)).await {
            Ok(group) => {
                self.adopt_group(&group);
                self.group_status(raft)
            }
            Err(error) => {
                tracing::warn!(superpeer = %id, %error, "removing a superpeer failed");
                change_error(error)
            }
        }
    }
}

/// Keeps the member list in step with the Raft membership until the superpeer stops.
pub(crate) async fn follow_membership(core: Arc<Core>) {
    let mut ticker = tokio::time::interval(FOLLOW_INTERVAL);
    while !core.stopping.load(Ordering::Acquire) {
        ticker.tick().await;
        if let Some(raft) = core.raft() {
            core.adopt_group(&raft.group());
        }
    }
}
