//! Changing the superpeer group at runtime: adding a superpeer (as a learner that catches
//! up, then a voter), removing one, and reading the current membership.
//!
//! Job: the three calls the superpeer role needs to grow, shrink or repair its group with
//! openraft's joint consensus (`change_membership`), each bounded by a deadline.
//!
//! Invariants: only the leader changes the group (a follower answers
//! [`GroupChangeError::ForwardToLeader`]); a new voter is always a learner first that has
//! acknowledged the log up to its addition (openraft's own blocking `add_learner` counts a
//! learner that never answered as caught up when the log is short, and promoting such a
//! learner stalls a group of one in the joint configuration), so adding it never stalls
//! commits; one change at a time (openraft refuses a change while another is in progress,
//! "already undergoing a configuration change": the caller retries); the group never
//! loses its last voter; a leader that removes itself answers even when the member left
//! takes over before it hears of the commit.
//!
//! Called by: the superpeer role (`myriad_node::superpeer`), on an `AddSuperpeer` or
//! `RemoveSuperpeer` metadata request from `myriad term` or a client.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, RaftError};
use openraft::ChangeMembers;
use thiserror::Error;

use crate::meta_raft::MetaRaft;
use crate::types::SuperpeerNode;

/// Extra time a new superpeer gets to catch up, beyond the request timeout.
const CATCH_UP_EXTRA: Duration = Duration::from_secs(30);
/// How often the leader checks whether a new learner has caught up.
const CATCH_UP_POLL: Duration = Duration::from_millis(20);
/// How often a leader that removes itself checks whether its removal is done.
const SELF_REMOVAL_POLL: Duration = Duration::from_millis(50);

/// The group as the Raft membership records it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupMembers {
    /// Voting members.
    pub voters: BTreeSet<u64>,
    /// Every member (voters and learners) and its address.
    pub nodes: BTreeMap<u64, String>,
}

/// Why a group change did not happen (or its outcome is unknown).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GroupChangeError {
    /// This superpeer does not lead; ask `leader`.
    #[error("not the leader; the leader is {leader:?}")]
    ForwardToLeader {
        /// The leader as far as this superpeer knows.
        leader: Option<u64>,
    },
    /// The change makes no sense: removing the last voter or an unknown member, adding an
    /// ID that is already a voter with another address, a bad ID.
    #[error("refused: {0}")]
    Refused(String),
    /// The change did not finish in time or failed on the way; the group may or may not
    /// have changed (read it again).
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
}

fn write_error(
    error: RaftError<crate::types::TypeConfig, ClientWriteError<crate::types::TypeConfig>>,
) -> GroupChangeError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
            GroupChangeError::ForwardToLeader {
                leader: forward.leader_id,
            }
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(error)) => {
            GroupChangeError::Refused(error.to_string())
        }
        other => GroupChangeError::OutcomeUnknown(other.to_string()),
    }
}

impl MetaRaft {
    /// The current membership (the latest, possibly not yet committed, configuration).
    pub fn group(&self) -> GroupMembers {
        let receiver = self.inner.raft.metrics();
        let metrics = receiver.borrow_watched();
        let membership = metrics.membership_config.membership();
        GroupMembers {
            voters: membership.voter_ids().collect(),
            nodes: membership
                .nodes()
                .map(|(id, node)| (*id, node.address.clone()))
                .collect(),
        }
    }

    fn ensure_leader(&self) -> Result<(), GroupChangeError> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(GroupChangeError::ForwardToLeader {
                leader: self.leader(),
            })
        }
    }

    /// Adds superpeer `id` listening at `address` as a voter: first as a learner, waiting
    /// until it has acknowledged the log up to its addition (a learner that never answers
    /// is never promoted: [`GroupChangeError::OutcomeUnknown`] after the deadline, and it
    /// stays a learner), then promoted. Adding a current voter with the
    /// same address is a no-op. Leader only.
    pub async fn add_superpeer(
        &self,
        id: u64,
        address: String,
    ) -> Result<GroupMembers, GroupChangeError> {
        self.ensure_leader()?;
        if id == 0 || id > crate::limits::NODE_ID_MAX {
            return Err(GroupChangeError::Refused(format!("bad superpeer ID {id}")));
        }
        let current = self.group();
        if let Some(known) = current.nodes.get(&id) {
            if *known != address {
                return Err(GroupChangeError::Refused(format!(
                    "superpeer {id} is a member at {known}, not {address} (remove it first)"
                )));
            }
        }
        if current.voters.len() >= crate::limits::MEMBERS_MAX && !current.voters.contains(&id) {
            return Err(GroupChangeError::Refused(format!(
                "the group has {} voters already (at most {})",
                current.voters.len(),
                crate::limits::MEMBERS_MAX
            )));
        }
        let deadline = self.inner.request_timeout + CATCH_UP_EXTRA;
        let started = tokio::time::Instant::now();
        if !current.voters.contains(&id) {
            if !current.nodes.contains_key(&id) {
                // Not blocking: openraft counts a learner within `replication_lag_threshold`
                // entries as caught up even if it never answered; `caught_up` waits for an
                // answer instead.
                let add = self
                    .inner
                    .raft
                    .add_learner(id, SuperpeerNode::new(address), false);
                tokio::time::timeout(deadline, add)
                    .await
                    .map_err(|_| {
                        GroupChangeError::OutcomeUnknown(format!(
                            "adding superpeer {id} as a learner did not commit within {deadline:?}"
                        ))
                    })?
                    .map_err(write_error)?;
            }
            self.caught_up(id, started + deadline).await?;
            let change = self
                .inner
                .raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false);
            let promoted = tokio::time::timeout(deadline, change)
                .await
                .map_err(|_| {
                    GroupChangeError::OutcomeUnknown(format!(
                        "promoting superpeer {id} did not commit within {deadline:?}"
                    ))
                })?
                .map_err(write_error);
            // A concurrent request for the same member (a retry) may have promoted it.
            if let Err(error) = promoted {
                if !self.group().voters.contains(&id) {
                    return Err(error);
                }
            }
        }
        Ok(self.group())
    }

    /// Waits until learner `id` has acknowledged the log up to this leader's latest
    /// membership entry (the one that made it a learner, or a later one), so that promoting
    /// it cannot stall commits: a voter that never answers would leave a group of one
    /// without a quorum in the joint configuration.
    async fn caught_up(
        &self,
        id: u64,
        until: tokio::time::Instant,
    ) -> Result<(), GroupChangeError> {
        let receiver = self.inner.raft.metrics();
        loop {
            let (leads, matched, target) = {
                let metrics = receiver.borrow_watched();
                let target = metrics
                    .membership_config
                    .log_id()
                    .map(|log_id| log_id.index);
                let matched = metrics
                    .replication
                    .as_ref()
                    .and_then(|replication| replication.get(&id).cloned().flatten())
                    .map(|log_id| log_id.index);
                (metrics.replication.is_some(), matched, target)
            };
            if !leads {
                return Err(GroupChangeError::ForwardToLeader {
                    leader: self.leader(),
                });
            }
            if matched.is_some() && matched >= target {
                return Ok(());
            }
            if tokio::time::Instant::now() >= until {
                return Err(GroupChangeError::OutcomeUnknown(format!(
                    "superpeer {id} did not catch up (is it running, started with --join, and \
                     reachable at its address?); it stays a learner: add it again once it runs, \
                     or remove it"
                )));
            }
            tokio::time::sleep(CATCH_UP_POLL).await;
        }
    }

    /// Removes superpeer `id` from the group (voter or learner); it no longer receives the
    /// log. Removing the leader itself is allowed: it steps down once the change commits; if
    /// the member left takes over before this leader sees the commit, the answer is
    /// [`GroupChangeError::OutcomeUnknown`] (within about an election timeout), and the
    /// remaining members hold the group without it. Leader only.
    pub async fn remove_superpeer(&self, id: u64) -> Result<GroupMembers, GroupChangeError> {
        self.ensure_leader()?;
        let current = self.group();
        if !current.nodes.contains_key(&id) {
            return Err(GroupChangeError::Refused(format!(
                "superpeer {id} is not a member"
            )));
        }
        if current.voters.len() == 1 && current.voters.contains(&id) {
            return Err(GroupChangeError::Refused(
                "the group's last voter cannot be removed".to_owned(),
            ));
        }
        let deadline = self.inner.request_timeout + CATCH_UP_EXTRA;
        let change = if current.voters.contains(&id) {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        let change = self.inner.raft.change_membership(change, false);
        if id != self.inner.node_id {
            tokio::time::timeout(deadline, change)
                .await
                .map_err(|_| {
                    GroupChangeError::OutcomeUnknown(format!(
                        "removing superpeer {id} did not commit within {deadline:?}"
                    ))
                })?
                .map_err(write_error)?;
            return Ok(self.group());
        }
        // The leader removes itself. If the one member left takes over as soon as it sees
        // the final configuration (a group of one elects itself at once), this leader never
        // hears that the change committed and openraft never answers the call: watch the
        // configuration instead of waiting for the answer alone.
        let started = tokio::time::Instant::now();
        tokio::pin!(change);
        loop {
            tokio::select! {
                result = &mut change => {
                    result.map_err(write_error)?;
                    return Ok(self.group());
                }
                () = tokio::time::sleep(SELF_REMOVAL_POLL) => {
                    if let Some(outcome) = self.self_removal_outcome() {
                        return outcome;
                    }
                    if started.elapsed() >= deadline {
                        return Err(GroupChangeError::OutcomeUnknown(format!(
                            "removing superpeer {id} did not commit within {deadline:?}"
                        )));
                    }
                }
            }
        }
    }

    /// Where this superpeer's removal of itself stands, once its latest configuration is a
    /// single one without it: done if that configuration is applied here (so committed);
    /// unknown here if this superpeer no longer leads (the remaining members finish it).
    /// `None` while neither holds.
    fn self_removal_outcome(&self) -> Option<Result<GroupMembers, GroupChangeError>> {
        let receiver = self.inner.raft.metrics();
        let (final_without_me, applied, leads) = {
            let metrics = receiver.borrow_watched();
            let stored = &metrics.membership_config;
            let final_without_me = stored.get_joint_config().len() == 1
                && !stored.voter_ids().any(|voter| voter == self.inner.node_id);
            let applied = stored.log_id().is_some() && metrics.last_applied >= *stored.log_id();
            let leads = metrics.current_leader == Some(self.inner.node_id);
            (final_without_me, applied, leads)
        };
        if !final_without_me {
            return None;
        }
        if applied {
            return Some(Ok(self.group()));
        }
        (!leads).then(|| {
            Err(GroupChangeError::OutcomeUnknown(format!(
                "superpeer {} stepped down before it saw its removal commit; the remaining \
                 members finish the change (ask one of them for the group)",
                self.inner.node_id
            )))
        })
    }
}
