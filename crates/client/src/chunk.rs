//! The chunk API: routing each CID to its owner and the requests of [`myriad_proto::chunk`].

use myriad_mem::NodeId;
use myriad_proto::chunk::{ChunkReply, ChunkRequest};

/// A chunk service in this process (a peer's own), called directly when the owner of a
/// chunk is the local node: no network hop. `myriad-node` implements it for its
/// `ChunkService`.
pub trait LocalChunks: Send + Sync + 'static {
    /// Executes `request` as if it came from this node.
    fn execute(&self, request: ChunkRequest) -> ChunkReply;
    /// The node whose chunks this service holds.
    fn node(&self) -> NodeId;
}
