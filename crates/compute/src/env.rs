//! What jobs, tasks and applications reach inside a peer: the local chunk API (no network
//! hop), the client API for everything else, the membership.
//!
//! # Job
//! [`PeerEnv`] is handed to the compute service once the peer has joined
//! ([`crate::ComputeService::attach`]). [`LocalChunkApi`] wraps the peer's own chunk
//! service ([`LocalChunks`]) with typed calls: get, put, create, list and stats, executed
//! in this process on the caller's thread.
//!
//! # Invariants
//! The local API never goes over the network: a chunk this peer does not own fails with
//! [`LocalError::NotOwner`] (use the client for those).
//!
//! # Who calls it
//! Jobs ([`crate::JobContext`]), tasks ([`crate::TaskContext`]), applications, built-ins.

use std::sync::Arc;

use bytes::Bytes;
use myriad_client::chunk::LocalChunks;
use myriad_client::client::Client;
use myriad_membership::Membership;
use myriad_proto::chunk::{ChunkReply, ChunkRequest, ChunkStats, ItemError, DURABILITY_DEFAULT};
use myriad_types::{ChunkId, NodeId};
use thiserror::Error;

/// A peer's services as compute code sees them.
#[derive(Clone)]
pub struct PeerEnv {
    /// The client API (remote chunks, nameservice, barriers), routing this peer's own
    /// chunks in-process.
    pub client: Client,
    /// This peer's own chunk service.
    pub local: Arc<dyn LocalChunks>,
    /// The peer's view of the cluster.
    pub membership: Arc<Membership>,
}

impl std::fmt::Debug for PeerEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerEnv")
            .field("node", &self.local.node())
            .finish_non_exhaustive()
    }
}

impl PeerEnv {
    /// The local chunk API.
    pub fn local(&self) -> LocalChunkApi<'_> {
        LocalChunkApi {
            chunks: self.local.as_ref(),
        }
    }
}

/// Why a local chunk call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LocalError {
    /// This peer does not own the chunk (it lives elsewhere: use the client).
    #[error("chunk {0} is not owned by this peer")]
    NotOwner(ChunkId),
    /// The chunk does not exist.
    #[error("chunk {0} not found")]
    NotFound(ChunkId),
    /// The chunk service refused the call.
    #[error("local chunk call failed: {0}")]
    Failed(String),
}

fn item(cid: ChunkId, error: ItemError) -> LocalError {
    match error {
        ItemError::NotOwner => LocalError::NotOwner(cid),
        ItemError::NotFound => LocalError::NotFound(cid),
        other => LocalError::Failed(other.to_string()),
    }
}

fn unexpected(reply: ChunkReply) -> LocalError {
    match reply {
        ChunkReply::Failed(error) => LocalError::Failed(error.to_string()),
        ChunkReply::Malformed(text) => LocalError::Failed(text),
        other => LocalError::Failed(format!("unexpected reply {other:?}")),
    }
}

/// Typed calls on the peer's own chunk service (see the module documentation).
#[derive(Clone, Copy)]
pub struct LocalChunkApi<'a> {
    chunks: &'a dyn LocalChunks,
}

impl<'a> LocalChunkApi<'a> {
    /// Wraps a chunk service.
    pub fn new(chunks: &'a dyn LocalChunks) -> LocalChunkApi<'a> {
        LocalChunkApi { chunks }
    }

    /// This peer's node ID.
    pub fn node(&self) -> NodeId {
        self.chunks.node()
    }

    /// Reads one chunk.
    pub fn get(&self, cid: ChunkId) -> Result<Bytes, LocalError> {
        match self.get_batch(&[cid]).pop() {
            Some(result) => result,
            None => Err(LocalError::Failed("no result for the item".into())),
        }
    }

    /// Reads chunks; one result per CID, in order.
    pub fn get_batch(&self, cids: &[ChunkId]) -> Vec<Result<Bytes, LocalError>> {
        match self.chunks.execute(ChunkRequest::Get {
            cids: cids.to_vec(),
        }) {
            ChunkReply::Data(items) => items
                .into_iter()
                .zip(cids)
                .map(|(result, cid)| result.map_err(|error| item(*cid, error)))
                .collect(),
            other => {
                let error = unexpected(other);
                cids.iter().map(|_| Err(error.clone())).collect()
            }
        }
    }

    /// Replaces chunks (each payload must have the chunk's size).
    pub fn put_batch(&self, items: &[(ChunkId, Bytes)]) -> Vec<Result<(), LocalError>> {
        match self.chunks.execute(ChunkRequest::Put {
            durability: DURABILITY_DEFAULT,
            items: items.to_vec(),
        }) {
            ChunkReply::Statuses(statuses) => statuses
                .into_iter()
                .zip(items)
                .map(|(status, (cid, _))| status.map_err(|error| item(*cid, error)))
                .collect(),
            other => {
                let error = unexpected(other);
                items.iter().map(|_| Err(error.clone())).collect()
            }
        }
    }

    /// Creates chunks holding `payloads` on this peer (all or nothing).
    pub fn create_with_data(&self, payloads: Vec<Bytes>) -> Result<Vec<ChunkId>, LocalError> {
        match self.chunks.execute(ChunkRequest::CreateWithData {
            durability: DURABILITY_DEFAULT,
            payloads,
        }) {
            ChunkReply::Created(cids) => Ok(cids),
            other => Err(unexpected(other)),
        }
    }

    /// Inclusive CID ranges of the live chunks this peer holds (of every creator), at
    /// most `max` ranges, and whether more were left out.
    pub fn ranges(&self, max: u64) -> Result<(Vec<(ChunkId, ChunkId)>, bool), LocalError> {
        match self
            .chunks
            .execute(ChunkRequest::List { creator: None, max })
        {
            ChunkReply::Ranges { ranges, truncated } => Ok((ranges, truncated)),
            other => Err(unexpected(other)),
        }
    }

    /// The memory summary.
    pub fn stats(&self) -> Result<ChunkStats, LocalError> {
        match self.chunks.execute(ChunkRequest::Stats) {
            ChunkReply::Stats(stats) => Ok(stats),
            other => Err(unexpected(other)),
        }
    }

    /// Whether this peer owns `cid` (holds it or would create it there): asks the chunk
    /// service for its size.
    pub fn owns(&self, cid: ChunkId) -> bool {
        match self
            .chunks
            .execute(ChunkRequest::Status { cids: vec![cid] })
        {
            ChunkReply::Sizes(mut sizes) => !matches!(sizes.pop(), Some(Err(ItemError::NotOwner))),
            _ => false,
        }
    }
}
