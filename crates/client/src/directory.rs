//! What chunk routing needs to know of the cluster, as a trait so that routing can be
//! tested without superpeers.

use std::future::Future;

use myriad_meta::LookupRange;
use myriad_types::{ChunkId, NodeId};

use myriad_membership::Membership;

use crate::ClientError;

/// Where chunks live and which nodes are up, as far as this node knows.
///
/// [`Membership`] implements it with the superpeer group's metadata (its node-directory
/// methods, below); tests implement it with a fixed table.
pub trait Directory: Send + Sync + 'static {
    /// This node's ID.
    fn local_node(&self) -> NodeId;

    /// Asks the superpeer group for the lookup range holding `cid` (never a cached answer:
    /// callers cache ranges themselves and call this on a miss or a "not owner" reply).
    fn lookup(&self, cid: ChunkId)
        -> impl Future<Output = Result<LookupRange, ClientError>> + Send;

    /// Asks the superpeer group for every lookup range of `creator`, covering all of its
    /// local IDs (gaps between the moved ranges belong to the creator). Routing uses it
    /// instead of many single lookups when many CIDs of one creator need a refresh (after
    /// a recovery, a creator's IDs can be split into thousands of ranges). `None`: not
    /// supported by this directory; callers fall back to [`Directory::lookup`].
    fn lookup_all(
        &self,
        creator: NodeId,
    ) -> impl Future<Output = Option<Result<Vec<LookupRange>, ClientError>>> + Send {
        let _ = creator;
        async { None }
    }

    /// Whether `node` is a member that is alive as far as this node knows (joined and not
    /// failed or gone). Routing fails fast with [`ClientError::NodeUnavailable`] otherwise.
    fn is_alive(&self, node: NodeId) -> bool;

    /// Whether chunks routed to the unreachable `node` may become available again by a
    /// recovery (the node failed, or is alive but not answering, i.e. its failure is not
    /// yet detected). Routing then waits for the lookup to move, bounded by the call's
    /// timeout, instead of failing at once. Default: `false` (fail fast).
    fn may_recover(&self, node: NodeId) -> bool {
        let _ = node;
        false
    }
}

impl Directory for Membership {
    fn local_node(&self) -> NodeId {
        self.node_id()
    }

    async fn lookup(&self, cid: ChunkId) -> Result<LookupRange, ClientError> {
        Ok(Membership::lookup(self, cid).await?)
    }

    async fn lookup_all(&self, creator: NodeId) -> Option<Result<Vec<LookupRange>, ClientError>> {
        Some(
            Membership::lookup_all(self, creator)
                .await
                .map_err(ClientError::from),
        )
    }

    fn is_alive(&self, node: NodeId) -> bool {
        Membership::is_alive(self, node)
    }

    fn may_recover(&self, node: NodeId) -> bool {
        Membership::may_recover(self, node)
    }
}
