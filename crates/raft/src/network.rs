//! The boundary to the messaging layer: superpeers exchange Raft RPCs as opaque byte
//! strings through a [`RaftTransport`] that the node crate implements.
//!
//! **Job.** Implements openraft's [`RaftNetworkFactory`] and [`RaftNetworkV2`] by encoding
//! each RPC ([`crate::codec::RpcRequest`]), handing it to the transport with the RPC's
//! deadline, and decoding the reply. The receiving side is [`crate::MetaRaft::handle_rpc`].
//!
//! **Invariants.** This crate opens no socket: every byte to another superpeer passes
//! through [`RaftTransport::call`]. A call that fails, times out or brings back an
//! undecodable or refused reply is reported to openraft as an unreachable peer (openraft
//! backs off and retries); nothing here panics on a peer's bytes.
//!
//! **Callers.** openraft's replication, heartbeat and election tasks.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{OptionalSend, RaftNetworkV2};
use thiserror::Error;

use crate::codec::{RpcReply, RpcRequest, SnapshotRequest};
use crate::types::{Snapshot, SuperpeerNode, TypeConfig, Vote};

/// Why a [`RaftTransport::call`] brought back no reply.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TransportError {
    /// The target could not be reached (no connection, connection lost, node unknown).
    #[error("superpeer {target} is unreachable: {reason}")]
    Unreachable {
        /// The superpeer called.
        target: u64,
        /// What the messaging layer reported.
        reason: String,
    },
    /// No reply came within the call's timeout.
    #[error("superpeer {target} did not answer within {timeout_ms} ms")]
    Timeout {
        /// The superpeer called.
        target: u64,
        /// The timeout that passed.
        timeout_ms: u64,
    },
}

/// Carries one Raft RPC to another superpeer and brings back its reply.
///
/// The node crate implements it over the messaging layer; the other side hands the request
/// bytes to [`crate::MetaRaft::handle_rpc`] and sends back what that returns. An
/// implementation must give up after `timeout` and must not retry on its own (openraft
/// retries with backoff). Requests can be large: a snapshot travels as one request of up to
/// [`crate::limits::SNAPSHOT_BYTES_MAX`] bytes.
pub trait RaftTransport: Send + Sync + 'static {
    /// Sends `request` to superpeer `target` and returns its reply.
    fn call(
        &self,
        target: u64,
        request: Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send;
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`RaftTransport`] with a boxed future, so that it can live behind `dyn`.
pub(crate) trait DynTransport: Send + Sync + 'static {
    fn call_boxed(
        &self,
        target: u64,
        request: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<u8>, TransportError>>;
}

impl<T: RaftTransport> DynTransport for T {
    fn call_boxed(
        &self,
        target: u64,
        request: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<u8>, TransportError>> {
        Box::pin(self.call(target, request, timeout))
    }
}

/// Makes one [`PeerClient`] per peer for openraft.
#[derive(Clone)]
pub(crate) struct NetworkFactory {
    pub(crate) transport: Arc<dyn DynTransport>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, _node: &SuperpeerNode) -> PeerClient {
        PeerClient {
            target,
            transport: self.transport.clone(),
        }
    }
}

/// openraft's view of one peer: encodes each RPC and calls the transport.
pub(crate) struct PeerClient {
    target: u64,
    transport: Arc<dyn DynTransport>,
}

/// Why a call brought back no usable reply.
#[derive(Debug, Error)]
enum CallError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("undecodable reply from superpeer {target}: {reason}")]
    BadReply { target: u64, reason: String },
    #[error("superpeer {target} refused the request: {reason}")]
    Refused { target: u64, reason: String },
}

impl PeerClient {
    async fn call(&self, request: &RpcRequest, timeout: Duration) -> Result<RpcReply, CallError> {
        let reply = self
            .transport
            .call_boxed(self.target, request.to_bytes(), timeout)
            .await?;
        match RpcReply::from_bytes(&reply) {
            Ok(RpcReply::Refused(reason)) => Err(CallError::Refused {
                target: self.target,
                reason,
            }),
            Ok(reply) => Ok(reply),
            Err(error) => Err(CallError::BadReply {
                target: self.target,
                reason: error.to_string(),
            }),
        }
    }

    fn unexpected(&self, reply: &RpcReply) -> CallError {
        CallError::BadReply {
            target: self.target,
            reason: format!("reply of the wrong kind: {reply:?}"),
        }
    }
}

fn rpc_error(error: CallError) -> RPCError<TypeConfig> {
    match error {
        // A timeout is worth an immediate retry; everything else backs off.
        CallError::Transport(TransportError::Timeout { .. }) => {
            RPCError::Network(NetworkError::new(&error))
        }
        _ => RPCError::Unreachable(Unreachable::new(&error)),
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let request = RpcRequest::AppendEntries(rpc);
        match self
            .call(&request, option.hard_ttl())
            .await
            .map_err(rpc_error)?
        {
            RpcReply::AppendEntries(response) => Ok(response),
            other => Err(rpc_error(self.unexpected(&other))),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self
            .call(&RpcRequest::Vote(rpc), option.hard_ttl())
            .await
            .map_err(rpc_error)?
        {
            RpcReply::Vote(response) => Ok(response),
            other => Err(rpc_error(self.unexpected(&other))),
        }
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self
            .call(&RpcRequest::PreVote(rpc), option.hard_ttl())
            .await
            .map_err(rpc_error)?
        {
            RpcReply::Vote(response) => Ok(response),
            other => Err(rpc_error(self.unexpected(&other))),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let request = RpcRequest::InstallSnapshot(SnapshotRequest {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot,
        });
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            reply = self.call(&request, option.hard_ttl()) => reply,
        };
        match reply {
            Ok(RpcReply::Snapshot(response)) => Ok(response),
            Ok(other) => Err(StreamingError::Unreachable(Unreachable::new(
                &self.unexpected(&other),
            ))),
            Err(error) => Err(StreamingError::Unreachable(Unreachable::new(&error))),
        }
    }
}
