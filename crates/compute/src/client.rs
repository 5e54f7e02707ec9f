//! The calling side of the compute platform, for clients and peers alike: submitting jobs
//! to a named peer or to a chunk's owner, task scripts to a group's master, group status
//! and roles.
//!
//! # Job
//! - [`Jobs`]: submits jobs; [`Jobs::submit_to_owner`] delegates to the data: it sends
//!   the job to the presumed owner of the CID (the client's cached lookup ranges, else the
//!   creator) and, when that peer answers `NotOwner`, looks the CID up at the superpeers,
//!   caches the range and tries the new owner (at most [`DELEGATION_ATTEMPTS`] times),
//!   like chunk requests do.
//! - [`find_master`], [`submit`], [`group_status`], [`node_info`], [`set_role`],
//!   [`start_app`]: blocking calls (not from inside a tokio runtime).
//!
//! # Invariants
//! Every handle ends: a peer that dies with the job queued or running fails the handle
//! with [`JobError::Unreachable`] (its connection is lost, failing the request).
//!
//! # Who calls it
//! `myriad term`, `myriad bench jobs`, applications and tests.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_client::client::Client;
use myriad_types::{ChunkId, NodeId};
use thiserror::Error;

use crate::job::{Job, JobError, JobHandle};
use crate::service::{master_name, ComputeService};
use crate::wire::{
    self, decode_job_reply, decode_submit_reply, GroupReply, GroupRequest, GroupStatus, JobReply,
    JobRequest, Role, SubmitReply, SubmitRequest,
};

/// How many owners a delegated job tries before giving up.
pub const DELEGATION_ATTEMPTS: usize = 4;

/// Default longest wait of a remote job's request.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a group call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ComputeError {
    /// No master is registered for the group.
    #[error("group {0} has no master")]
    NoMaster(u16),
    /// The node could not be reached or did not answer in time.
    #[error("node {node}: {reason}")]
    Unreachable {
        /// The node.
        node: NodeId,
        /// What the messaging layer said.
        reason: String,
    },
    /// The node refused.
    #[error("node {node} refused: {reason}")]
    Refused {
        /// The node.
        node: NodeId,
        /// Its reason.
        reason: String,
    },
    /// The answer did not decode.
    #[error("bad answer from node {node}: {reason}")]
    Protocol {
        /// The node.
        node: NodeId,
        /// The decoder's error.
        reason: String,
    },
    /// The nameservice could not be asked.
    #[error("nameservice: {0}")]
    Names(String),
}

/// Submits jobs (see the module documentation).
#[derive(Clone)]
pub struct Jobs {
    client: Client,
    local: Option<Arc<ComputeService>>,
    timeout: Duration,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs")
            .field("node", &self.client.node_id())
            .finish_non_exhaustive()
    }
}

impl Jobs {
    /// Jobs submitted through `client`.
    pub fn new(client: Client) -> Jobs {
        Jobs {
            client,
            local: None,
            timeout: JOB_TIMEOUT,
        }
    }

    /// Runs jobs addressed to this node on `service` directly (inside a peer).
    pub fn with_local(mut self, service: Arc<ComputeService>) -> Jobs {
        self.local = Some(service);
        self
    }

    /// Sets the longest wait of each remote job request.
    pub fn with_timeout(mut self, timeout: Duration) -> Jobs {
        self.timeout = timeout;
        self
    }

    /// Runs `job` on peer `node`.
    pub fn submit_to<J: Job>(&self, node: NodeId, job: J) -> JobHandle<J::Output> {
        let (sender, receiver) = crossbeam_channel::bounded(1);
        let request = JobRequest {
            name: J::NAME.to_owned(),
            params: job.to_bytes(),
            owner_of: None,
        };
        self.send(node, request, move |reply| {
            let _ = sender.send(reply);
        });
        JobHandle::new(receiver, node)
    }

    /// Runs `job` on the peer that owns `cid`, following redirections.
    pub fn submit_to_owner<J: Job>(&self, cid: ChunkId, job: J) -> JobHandle<J::Output> {
        let (sender, receiver) = crossbeam_channel::bounded(1);
        let owner = self.client.chunks().owner_of(cid);
        let request = JobRequest {
            name: J::NAME.to_owned(),
            params: job.to_bytes(),
            owner_of: Some(cid),
        };
        self.delegate(owner, request, DELEGATION_ATTEMPTS, sender);
        JobHandle::new(receiver, owner)
    }

    fn delegate(
        &self,
        owner: NodeId,
        request: JobRequest,
        attempts: usize,
        sender: crossbeam_channel::Sender<Result<Bytes, JobError>>,
    ) {
        let jobs = self.clone();
        let retry = request.clone();
        self.send(owner, request, move |reply| {
            let Err(JobError::NoOwner(cid)) = reply else {
                let _ = sender.send(reply);
                return;
            };
            if attempts <= 1 {
                let _ = sender.send(Err(JobError::NoOwner(cid)));
                return;
            }
            // Look the range up again (like a chunk request's NotOwner), then retry.
            let membership = Arc::clone(jobs.client.membership());
            let runtime = membership.net().runtime();
            runtime.spawn(async move {
                match membership.lookup(cid).await {
                    Ok(range) => {
                        jobs.client.chunks().remember(range);
                        let next = jobs.client.chunks().owner_of(cid);
                        jobs.delegate(next, retry, attempts - 1, sender);
                    }
                    Err(error) => {
                        let _ = sender.send(Err(JobError::Failed(format!(
                            "looking up the owner of {cid}: {error}"
                        ))));
                    }
                }
            });
        });
    }

    /// Sends `request` to `node` (or runs it here) and calls `reply` with the answer.
    fn send(
        &self,
        node: NodeId,
        request: JobRequest,
        reply: impl FnOnce(Result<Bytes, JobError>) + Send + 'static,
    ) {
        let cid = request.owner_of;
        if let Some(local) = &self.local {
            if local.env().map(|env| env.membership.node_id()) == Some(node) {
                local.run_request(request, move |answer: JobReply| {
                    reply(answer.map_err(|failure| JobError::from_failure(failure, node, cid)))
                });
                return;
            }
        }
        let net = self.client.membership().net().clone();
        let timeout = self.timeout;
        net.clone().runtime().spawn(async move {
            let answer = match net
                .request(node, wire::JOB, request.encode(), timeout)
                .await
            {
                Ok(bytes) => match decode_job_reply(bytes) {
                    Ok(answer) => {
                        answer.map_err(|failure| JobError::from_failure(failure, node, cid))
                    }
                    Err(error) => Err(JobError::Encoding(format!("bad job reply: {error}"))),
                },
                // The peer died (its connection was lost) or did not answer in time.
                Err(error) => Err(JobError::Unreachable {
                    node,
                    reason: error.to_string(),
                }),
            };
            reply(answer);
        });
    }
}

fn group_request(
    client: &Client,
    node: NodeId,
    request: GroupRequest,
) -> Result<GroupReply, ComputeError> {
    let bytes = client
        .membership()
        .net()
        .request_blocking(node, wire::GROUP, request.encode(), Duration::from_secs(5))
        .map_err(|error| ComputeError::Unreachable {
            node,
            reason: error.to_string(),
        })?;
    GroupReply::decode(bytes).map_err(|error| ComputeError::Protocol {
        node,
        reason: error.to_string(),
    })
}

/// The master of `group`, from the nameservice.
pub fn find_master(client: &Client, group: u16) -> Result<NodeId, ComputeError> {
    match client.blocking().name_get(&master_name(group)) {
        Ok(Some(cid)) => Ok(cid.creator()),
        Ok(None) => Err(ComputeError::NoMaster(group)),
        Err(error) => Err(ComputeError::Names(error.to_string())),
    }
}

/// Submits `request` to its group's master and waits (at most `timeout`) for the outcome.
pub fn submit(
    client: &Client,
    request: &SubmitRequest,
    timeout: Duration,
) -> Result<SubmitReply, ComputeError> {
    let master = find_master(client, request.group)?;
    let bytes = client
        .membership()
        .net()
        .request_blocking(master, wire::SUBMIT, request.encode(), timeout)
        .map_err(|error| ComputeError::Unreachable {
            node: master,
            reason: error.to_string(),
        })?;
    match decode_submit_reply(bytes) {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(reason)) => Err(ComputeError::Refused {
            node: master,
            reason,
        }),
        Err(error) => Err(ComputeError::Protocol {
            node: master,
            reason: error.to_string(),
        }),
    }
}

/// The status of `group` from its master.
pub fn group_status(client: &Client, group: u16) -> Result<GroupStatus, ComputeError> {
    let master = find_master(client, group)?;
    match group_request(client, master, GroupRequest::Status(group))? {
        GroupReply::Status(status) => Ok(status),
        GroupReply::Refused(reason) => Err(ComputeError::Refused {
            node: master,
            reason,
        }),
        other => Err(ComputeError::Protocol {
            node: master,
            reason: format!("unexpected {other:?}"),
        }),
    }
}

fn expect_ok(node: NodeId, reply: GroupReply) -> Result<(), ComputeError> {
    match reply {
        GroupReply::Ok => Ok(()),
        GroupReply::Refused(reason) => Err(ComputeError::Refused { node, reason }),
        other => Err(ComputeError::Protocol {
            node,
            reason: format!("unexpected {other:?}"),
        }),
    }
}

/// A peer's role and group.
pub fn node_info(client: &Client, node: NodeId) -> Result<(Role, u16), ComputeError> {
    match group_request(client, node, GroupRequest::Info)? {
        GroupReply::Info(role, group) => Ok((role, group)),
        GroupReply::Refused(reason) => Err(ComputeError::Refused { node, reason }),
        other => Err(ComputeError::Protocol {
            node,
            reason: format!("unexpected {other:?}"),
        }),
    }
}

/// Makes peer `node` take `role` in `group`.
pub fn set_role(client: &Client, node: NodeId, group: u16, role: Role) -> Result<(), ComputeError> {
    expect_ok(
        node,
        group_request(client, node, GroupRequest::SetRole(group, role))?,
    )
}

/// Starts application `name` on peer `node`.
pub fn start_app(client: &Client, node: NodeId, name: &str) -> Result<(), ComputeError> {
    expect_ok(
        node,
        group_request(client, node, GroupRequest::StartApp(name.to_owned()))?,
    )
}

/// Runs a job by name with raw parameters on `node` and waits for its raw result (the
/// terminal's `compjob`).
pub fn run_job_raw(
    client: &Client,
    node: NodeId,
    name: &str,
    params: Bytes,
    timeout: Duration,
) -> Result<Bytes, JobError> {
    let request = JobRequest {
        name: name.to_owned(),
        params,
        owner_of: None,
    };
    let bytes = client
        .membership()
        .net()
        .request_blocking(node, wire::JOB, request.encode(), timeout)
        .map_err(|error| JobError::Unreachable {
            node,
            reason: error.to_string(),
        })?;
    decode_job_reply(bytes)
        .map_err(|error| JobError::Encoding(error.to_string()))?
        .map_err(|failure| JobError::from_failure(failure, node, None))
}
