//! [`MetaRaft`]: one superpeer's member of the Raft group, the only handle the node crate
//! needs.
//!
//! **Job.** Opens the superpeer's directory (log and snapshot), starts openraft, forms the
//! group on the first start of a fresh cluster, and offers writes, linearizable and local
//! reads, leader and metrics queries, the server side of the RPCs, and shutdown.
//!
//! **Invariants.** Every wait is bounded ([`RaftConfig::request_timeout_ms`] for writes and
//! linearizable reads, an explicit timeout for the `wait_*` helpers); no input from a peer
//! or a caller can make it panic; the handle is cheap to clone and usable from any task.
//!
//! **Callers.** The superpeer role of the node crate (and this crate's tests).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use myriad_meta::{Command, MetaState, Response};
use myriad_types::limits::ADDRESS_BYTES_MAX;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{
    ClientWriteError, ForwardReason, InitializeError, LinearizableReadError, RaftError,
};
use openraft::raft::AppendEntriesRequest;
use openraft::{ReadPolicy, ServerState, SnapshotPolicy};
use thiserror::Error;

use crate::codec::{RpcReply, RpcRequest, SnapshotRequest};
use crate::limits::*;
use crate::log_store::{LogOpenError, LogStore, LOG_COMPACT_BYTES_DEFAULT};
use crate::network::{NetworkFactory, RaftTransport};
use crate::state_machine::{ApplyObserver, MetaStateReader, SnapshotOpenError, StateMachineStore};
use crate::types::{Snapshot, SuperpeerNode, TypeConfig};

/// The openraft handle of one superpeer.
pub type Raft = openraft::Raft<TypeConfig, StateMachineStore>;

/// Name of the Raft cluster in openraft's logs.
const CLUSTER_NAME: &str = "myriad-superpeers";
/// Deadline for sending and installing one snapshot.
pub const SNAPSHOT_SEND_TIMEOUT_MS: u64 = 30_000;

/// How one superpeer runs its member of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftConfig {
    /// This superpeer's node ID (1 to [`NODE_ID_MAX`]); must be one of `members`.
    pub node_id: u64,
    /// Directory of this superpeer's log and snapshot (created if missing).
    pub dir: PathBuf,
    /// The initial voters and their addresses (1, 3 or 5 for a useful group). Used only on
    /// the first start of a fresh directory; a restart keeps the membership in its log.
    /// Must be identical on every member (different sets could elect two leaders).
    pub members: BTreeMap<u64, String>,
    /// A follower that hears no leader for a time drawn from this range (anew for every
    /// campaign) starts an election.
    pub election_timeout_ms: Range<u64>,
    /// How often the leader sends heartbeats; below the election timeout's start.
    pub heartbeat_ms: u64,
    /// Build a snapshot after this many applied entries since the last (0: never).
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot, so slightly lagging followers catch up
    /// from the log rather than with the whole snapshot.
    pub entries_kept_after_snapshot: u64,
    /// Rewrite the log file when it is larger than this after purges.
    pub log_compact_bytes: u64,
    /// Deadline of a write or a linearizable read.
    pub request_timeout_ms: u64,
    /// Join a running group instead of forming one: a fresh directory then waits, as a
    /// non-voter, for the leader to add it (`MetaRaft::add_superpeer`); `members` is not
    /// proposed. Ignored on a restart (the log holds the membership).
    pub join_existing: bool,
}

impl RaftConfig {
    /// A configuration with defaults for a LAN: elections after 300–600 ms of silence,
    /// heartbeats every 100 ms, a snapshot every 10,000 entries keeping 1,000 behind it.
    pub fn new(
        node_id: u64,
        dir: impl Into<PathBuf>,
        members: BTreeMap<u64, String>,
    ) -> RaftConfig {
        RaftConfig {
            node_id,
            dir: dir.into(),
            members,
            election_timeout_ms: 300..600,
            heartbeat_ms: 100,
            snapshot_every_entries: 10_000,
            entries_kept_after_snapshot: 1_000,
            log_compact_bytes: LOG_COMPACT_BYTES_DEFAULT,
            request_timeout_ms: 5_000,
            join_existing: false,
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.node_id == 0 || self.node_id > NODE_ID_MAX {
            return Err(format!(
                "node ID {} is not in 1..={NODE_ID_MAX}",
                self.node_id
            ));
        }
        if !self.members.contains_key(&self.node_id) {
            return Err(format!("node {} is not among the members", self.node_id));
        }
        if self.members.len() > MEMBERS_MAX {
            return Err(format!("at most {MEMBERS_MAX} members"));
        }
        for (&id, address) in &self.members {
            if id == 0 || id > NODE_ID_MAX {
                return Err(format!("member ID {id} is not in 1..={NODE_ID_MAX}"));
            }
            if address.is_empty() || address.len() > ADDRESS_BYTES_MAX {
                return Err(format!(
                    "member {id}'s address has 1 to {ADDRESS_BYTES_MAX} bytes"
                ));
            }
        }
        if self.heartbeat_ms == 0 || self.request_timeout_ms == 0 {
            return Err("heartbeat and request timeout must be positive".to_owned());
        }
        Ok(())
    }

    fn openraft_config(&self) -> Result<openraft::Config, String> {
        let snapshot_policy = match self.snapshot_every_entries {
            0 => SnapshotPolicy::Never,
            entries => SnapshotPolicy::LogsSinceLast(entries),
        };
        openraft::Config {
            cluster_name: CLUSTER_NAME.to_owned(),
            election_timeout_min: self.election_timeout_ms.start,
            election_timeout_max: self.election_timeout_ms.end,
            heartbeat_interval: self.heartbeat_ms,
            install_snapshot_timeout: SNAPSHOT_SEND_TIMEOUT_MS,
            max_payload_entries: APPEND_ENTRIES_MAX as u64,
            snapshot_policy,
            max_in_snapshot_log_to_keep: self.entries_kept_after_snapshot,
            api_channel_size: Some(API_QUEUE_MAX),
            notification_channel_size: Some(NOTIFICATION_QUEUE_MAX),
            state_machine_channel_size: Some(STATE_MACHINE_QUEUE_MAX),
            // A node that was cut off asks before it campaigns, so its return does not
            // depose a healthy leader.
            enable_pre_vote: Some(true),
            ..openraft::Config::default()
        }
        .validate()
        .map_err(|error| error.to_string())
    }
}

/// Why [`MetaRaft::start`] failed.
#[derive(Debug, Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error("invalid Raft configuration: {0}")]
    Config(String),
    /// The log could not be opened.
    #[error(transparent)]
    Log(#[from] LogOpenError),
    /// The snapshot could not be loaded.
    #[error(transparent)]
    Snapshot(#[from] SnapshotOpenError),
    /// openraft refused to start or to form the group.
    #[error("Raft failed to start: {0}")]
    Raft(String),
}

/// Why a [`MetaRaft::write`] has no response.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RaftWriteError {
    /// This superpeer is not the leader; send the command to `leader` (unknown: `None`).
    /// The command was not applied.
    #[error("not the leader; the leader is {leader:?}")]
    ForwardToLeader {
        /// The leader as far as this superpeer knows.
        leader: Option<u64>,
    },
    /// This superpeer leads but no quorum acknowledged it recently (it may be cut off), up
    /// to the deadline; the command was not applied.
    #[error("the leader has no recent quorum acknowledgement")]
    NoQuorum,
    /// The encoded command exceeds [`COMMAND_BYTES_MAX`]; it was not applied.
    #[error("command of {bytes} bytes exceeds the limit of {COMMAND_BYTES_MAX}")]
    TooLarge {
        /// Its encoded size.
        bytes: usize,
    },
    /// Leadership changed or the deadline passed before the outcome was known: the command
    /// may or may not be applied. Retries must be idempotent or deduplicated.
    #[error("outcome unknown ({reason}); the command may or may not have been applied")]
    OutcomeUnknown {
        /// What happened.
        reason: String,
        /// The leader as far as this superpeer knows.
        leader: Option<u64>,
    },
    /// This superpeer's Raft has stopped (shut down or failed).
    #[error("the Raft node has stopped: {0}")]
    Stopped(String),
}

/// Why a [`MetaRaft::read_linearizable`] has no answer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RaftReadError {
    /// This superpeer is not the leader; ask `leader` (unknown: `None`).
    #[error("not the leader; the leader is {leader:?}")]
    ForwardToLeader {
        /// The leader as far as this superpeer knows.
        leader: Option<u64>,
    },
    /// Leadership could not be confirmed by a quorum in time.
    #[error("leadership not confirmed: {0}")]
    NoQuorum(String),
    /// This superpeer's Raft has stopped.
    #[error("the Raft node has stopped: {0}")]
    Stopped(String),
}

/// What a superpeer is in the group right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaftRole {
    /// It leads: writes and linearizable reads go here.
    Leader,
    /// It follows a leader (or waits for one).
    Follower,
    /// It campaigns for leadership.
    Candidate,
    /// It replicates but does not vote (also before the group is formed).
    Learner,
    /// It has stopped.
    Shutdown,
}

/// A summary of one superpeer's Raft metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftSummary {
    /// This superpeer.
    pub node_id: u64,
    /// Its role.
    pub role: RaftRole,
    /// Its current term.
    pub term: u64,
    /// The leader it knows of.
    pub leader: Option<u64>,
    /// Index of its last log entry.
    pub last_log_index: Option<u64>,
    /// Index of the last entry it knows committed.
    pub committed_index: Option<u64>,
    /// Index of the last entry applied to its state.
    pub last_applied_index: Option<u64>,
    /// Index of the last entry in its snapshot.
    pub snapshot_index: Option<u64>,
    /// Index of the last entry purged from its log.
    pub purged_index: Option<u64>,
}

pub(crate) struct Inner {
    pub(crate) node_id: u64,
    pub(crate) raft: Raft,
    reader: MetaStateReader,
    pub(crate) request_timeout: Duration,
    heartbeat: Duration,
}

/// One superpeer's member of the Raft group. Cheap to clone.
#[derive(Clone)]
pub struct MetaRaft {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for MetaRaft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaRaft")
            .field("node_id", &self.inner.node_id)
            .finish()
    }
}

impl MetaRaft {
    /// Opens `config.dir`, starts the Raft member and, on the first start of a fresh
    /// directory, proposes `config.members` as the group (every member may do so; the
    /// group forms once, later proposals are refused and ignored). A restart reopens the
    /// log and snapshot and rejoins the group. Must run inside a Tokio runtime.
    pub async fn start<T: RaftTransport>(
        config: RaftConfig,
        transport: T,
    ) -> Result<MetaRaft, StartError> {
        MetaRaft::start_observed(config, transport, None).await
    }

    /// [`MetaRaft::start`] with an [`ApplyObserver`] that sees every applied command in log
    /// order (including those re-applied from the log after a restart).
    pub async fn start_observed<T: RaftTransport>(
        config: RaftConfig,
        transport: T,
        observer: Option<ApplyObserver>,
    ) -> Result<MetaRaft, StartError> {
        config.check().map_err(StartError::Config)?;
        let raft_config = Arc::new(config.openraft_config().map_err(StartError::Config)?);
        let log_store = LogStore::open(&config.dir, config.log_compact_bytes)?;
        let mut state_machine = StateMachineStore::open(&config.dir)?;
        if let Some(observer) = observer {
            state_machine = state_machine.with_observer(observer);
        }
        let reader = state_machine.reader();
        let network = NetworkFactory {
            transport: Arc::new(transport),
        };
        let raft = Raft::new(
            config.node_id,
            raft_config,
            network,
            log_store,
            state_machine,
        )
        .await
        .map_err(|error| StartError::Raft(error.to_string()))?;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|error| StartError::Raft(error.to_string()))?;
        if !initialized && !config.join_existing {
            let members: BTreeMap<u64, SuperpeerNode> = config
                .members
                .iter()
                .map(|(&id, address)| (id, SuperpeerNode::new(address.clone())))
                .collect();
            match raft.initialize(members).await {
                Ok(()) => {}
                // Another member's proposal reached us first.
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(error) => {
                    if let Err(shutdown) = raft.shutdown().await {
                        tracing::warn!(%shutdown, "Raft shutdown after a failed start");
                    }
                    return Err(StartError::Raft(error.to_string()));
                }
            }
        }
        Ok(MetaRaft {
            inner: Arc::new(Inner {
                node_id: config.node_id,
                raft,
                reader,
                request_timeout: Duration::from_millis(config.request_timeout_ms),
                heartbeat: Duration::from_millis(config.heartbeat_ms),
            }),
        })
    }

    /// This superpeer's node ID.
    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    /// Replicates `command` and returns what applying it produced. Only the leader
    /// accepts writes; a follower answers [`RaftWriteError::ForwardToLeader`].
    pub async fn write(&self, command: Command) -> Result<Response, RaftWriteError> {
        let bytes = command.to_bytes().len();
        if bytes > COMMAND_BYTES_MAX {
            return Err(RaftWriteError::TooLarge { bytes });
        }
        let deadline = tokio::time::Instant::now() + self.inner.request_timeout;
        loop {
            let write = self.inner.raft.client_write(command.clone());
            let error = match tokio::time::timeout_at(deadline, write).await {
                Err(_) => {
                    return Err(RaftWriteError::OutcomeUnknown {
                        reason: format!("no outcome within {:?}", self.inner.request_timeout),
                        leader: self.leader(),
                    })
                }
                Ok(Ok(response)) => return Ok(response.data),
                Ok(Err(RaftError::Fatal(fatal))) => {
                    return Err(RaftWriteError::Stopped(fatal.to_string()))
                }
                Ok(Err(RaftError::APIError(error))) => error,
            };
            return Err(match error {
                // A leader refuses writes until a quorum has acknowledged it recently: just
                // after its election, or while it is cut off. The command was not appended.
                ClientWriteError::ForwardToLeader(forward)
                    if forward.reason == ForwardReason::LeaseExpired =>
                {
                    let retry_at = tokio::time::Instant::now() + self.inner.heartbeat;
                    if retry_at < deadline {
                        tokio::time::sleep_until(retry_at).await;
                        continue;
                    }
                    RaftWriteError::NoQuorum
                }
                ClientWriteError::ForwardToLeader(forward) => RaftWriteError::ForwardToLeader {
                    leader: forward.leader_id,
                },
                ClientWriteError::LogEntryDiscarded(forward) => RaftWriteError::OutcomeUnknown {
                    reason: "the entry was discarded by a leader change".to_owned(),
                    leader: forward.leader_id,
                },
                other => RaftWriteError::OutcomeUnknown {
                    reason: other.to_string(),
                    leader: self.leader(),
                },
            });
        }
    }

    /// Runs `f` on a state that reflects every write completed before this call (ReadIndex:
    /// the leader confirms its leadership with a quorum, then waits until it applied up to
    /// its commit point). Only the leader answers.
    pub async fn read_linearizable<T>(
        &self,
        f: impl FnOnce(&MetaState) -> T,
    ) -> Result<T, RaftReadError> {
        let ensure = self.inner.raft.ensure_linearizable(ReadPolicy::ReadIndex);
        match tokio::time::timeout(self.inner.request_timeout, ensure).await {
            Err(_) => Err(RaftReadError::NoQuorum(format!(
                "no confirmation within {:?}",
                self.inner.request_timeout
            ))),
            Ok(Ok(_)) => Ok(self.inner.reader.read(f)),
            Ok(Err(RaftError::APIError(error))) => Err(match error {
                LinearizableReadError::ForwardToLeader(forward) => RaftReadError::ForwardToLeader {
                    leader: forward.leader_id,
                },
                LinearizableReadError::QuorumNotEnough(error) => {
                    RaftReadError::NoQuorum(error.to_string())
                }
            }),
            Ok(Err(RaftError::Fatal(fatal))) => Err(RaftReadError::Stopped(fatal.to_string())),
        }
    }

    /// Runs `f` on this superpeer's applied state, which may lag the leader's.
    pub fn read_local<T>(&self, f: impl FnOnce(&MetaState) -> T) -> T {
        self.inner.reader.read(f)
    }

    /// A read handle on this superpeer's applied state, for callers that keep one.
    pub fn state_reader(&self) -> MetaStateReader {
        self.inner.reader.clone()
    }

    /// The leader as far as this superpeer knows.
    pub fn leader(&self) -> Option<u64> {
        self.inner.raft.metrics().borrow_watched().current_leader
    }

    /// Whether this superpeer is the leader right now.
    pub fn is_leader(&self) -> bool {
        self.metrics().role == RaftRole::Leader
    }

    /// A summary of this superpeer's Raft metrics.
    pub fn metrics(&self) -> RaftSummary {
        let receiver = self.inner.raft.metrics();
        let metrics = receiver.borrow_watched();
        RaftSummary {
            node_id: self.inner.node_id,
            role: match metrics.state {
                ServerState::Leader => RaftRole::Leader,
                ServerState::Follower => RaftRole::Follower,
                ServerState::Candidate => RaftRole::Candidate,
                ServerState::Learner => RaftRole::Learner,
                ServerState::Shutdown => RaftRole::Shutdown,
            },
            term: metrics.current_term,
            leader: metrics.current_leader,
            last_log_index: metrics.last_log_index,
            committed_index: metrics.local_committed.map(|log_id| log_id.index),
            last_applied_index: metrics.last_applied.map(|log_id| log_id.index),
            snapshot_index: metrics.snapshot.map(|log_id| log_id.index),
            purged_index: metrics.purged.map(|log_id| log_id.index),
        }
    }

    /// Waits up to `timeout` until this superpeer knows a leader; returns it.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Option<u64> {
        self.inner
            .raft
            .wait(Some(timeout))
            .metrics(|metrics| metrics.current_leader.is_some(), "a known leader")
            .await
            .ok()
            .and_then(|metrics| metrics.current_leader)
    }

    /// Waits up to `timeout` until this superpeer applied the entry at `index`.
    pub async fn wait_for_applied(&self, index: u64, timeout: Duration) -> bool {
        self.inner
            .raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "applied")
            .await
            .is_ok()
    }

    /// Builds a snapshot now (and lets the log be purged behind it).
    pub async fn trigger_snapshot(&self) -> Result<(), RaftWriteError> {
        self.inner
            .raft
            .trigger()
            .snapshot()
            .await
            .map_err(|fatal| RaftWriteError::Stopped(fatal.to_string()))
    }

    /// Handles one Raft RPC from another superpeer: decodes `request`, hands it to the
    /// local Raft member and returns the encoded reply (a refusal for undecodable or
    /// implausible requests). The messaging layer sends the reply back unchanged.
    pub async fn handle_rpc(&self, request: &[u8]) -> Vec<u8> {
        let raft = &self.inner.raft;
        let reply = match RpcRequest::from_bytes(request) {
            Err(error) => RpcReply::Refused(format!("undecodable request: {error}")),
            Ok(RpcRequest::AppendEntries(request)) => match check_append(&request) {
                Err(reason) => RpcReply::Refused(format!("implausible AppendEntries: {reason}")),
                Ok(()) => match raft.append_entries(request).await {
                    Ok(response) => RpcReply::AppendEntries(response),
                    Err(error) => RpcReply::Refused(error.to_string()),
                },
            },
            Ok(RpcRequest::Vote(request)) => match raft.vote(request).await {
                Ok(response) => RpcReply::Vote(response),
                Err(error) => RpcReply::Refused(error.to_string()),
            },
            Ok(RpcRequest::PreVote(request)) => match raft.pre_vote(request).await {
                Ok(response) => RpcReply::Vote(response),
                Err(error) => RpcReply::Refused(error.to_string()),
            },
            Ok(RpcRequest::InstallSnapshot(request)) => self.install_snapshot(request).await,
        };
        reply.to_bytes()
    }

    /// Installs a snapshot from the leader after the checks openraft leaves to the caller
    /// (it panics on snapshots a correct leader cannot send, and a state it cannot decode
    /// would stop this node).
    async fn install_snapshot(&self, request: SnapshotRequest) -> RpcReply {
        if let Err(error) = MetaState::from_snapshot(&request.data) {
            return RpcReply::Refused(format!("invalid snapshot state: {error}"));
        }
        if let Some(last) = request.meta.last_log_id {
            if last.leader_id > request.vote.leader_id {
                return RpcReply::Refused("snapshot beyond the sender's leadership".to_owned());
            }
            let committed = self.inner.raft.metrics().borrow_watched().local_committed;
            if let Some(committed) = committed {
                if last > committed && last.index <= committed.index {
                    return RpcReply::Refused(
                        "snapshot conflicts with the locally committed log".to_owned(),
                    );
                }
            }
        }
        let snapshot = Snapshot {
            meta: request.meta,
            snapshot: request.data,
        };
        match self
            .inner
            .raft
            .install_full_snapshot(request.vote, snapshot)
            .await
        {
            Ok(response) => RpcReply::Snapshot(response),
            Err(fatal) => RpcReply::Refused(fatal.to_string()),
        }
    }

    /// Stops this Raft member and waits for its tasks to end. The directory can then be
    /// reopened with [`MetaRaft::start`]. Later calls on any clone fail with `Stopped`.
    pub async fn shutdown(&self) {
        if let Err(error) = self.inner.raft.shutdown().await {
            tracing::warn!(%error, "Raft shutdown reported an error");
        }
    }
}

/// Checks what openraft assumes of an AppendEntries from a correct leader (it only
/// debug-asserts these): the entries continue `prev_log_id` with consecutive indexes, their
/// leader IDs never decrease, and none is beyond the sender's leadership.
fn check_append(request: &AppendEntriesRequest<TypeConfig>) -> Result<(), &'static str> {
    let leadership = request.vote.leader_id;
    let mut previous = request.prev_log_id;
    if previous.is_some_and(|log_id| log_id.leader_id > leadership) {
        return Err("previous entry beyond the sender's leadership");
    }
    for entry in &request.entries {
        let expected_index = previous.map_or(Some(0), |log_id| log_id.index.checked_add(1));
        if Some(entry.log_id.index) != expected_index {
            return Err("entry indexes are not consecutive");
        }
        if previous.is_some_and(|log_id| log_id.leader_id > entry.log_id.leader_id) {
            return Err("entry leader IDs decrease");
        }
        if entry.log_id.leader_id > leadership {
            return Err("entry beyond the sender's leadership");
        }
        previous = Some(entry.log_id);
    }
    Ok(())
}
