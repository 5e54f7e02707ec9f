//! Draining a peer: moving every chunk it holds to other peers before it is taken out of
//! service (DXTerm's `nodedrain`, then `nodeshutdown`).
//!
//! # Job
//! [`Client::drain`] lists the CID ranges the peer holds, cuts them into pieces of at most
//! [`DrainOptions::piece_chunks`] CIDs and migrates each piece (`MIGRATE`, see
//! `myriad_proto::migrate`) to a target peer, round robin over the targets; it lists again
//! and repeats until the peer holds nothing, so chunks created while it ran are moved too.
//!
//! # Invariants
//! - Each piece moves with the migration's guarantees: the chunks are write-locked at the
//!   drained peer from the copy until the new owner is committed, so no acknowledged write
//!   is lost and no read sees an older value; clients find the chunks at their new owner.
//! - Small pieces keep the time a chunk is locked short (writes to it wait meanwhile).
//! - A drain ends: after at most [`DrainOptions::passes_max`] listings, with an error if
//!   the peer still holds chunks then (a workload creating chunks on it faster than they
//!   move), and every request is bounded by the migration's own timeout.
//! - A piece that fails is tried again with the next target, [`DrainOptions::attempts`]
//!   times in all; then the drain stops with an error naming what moved so far (what
//!   moved stays moved: the drain can simply be run again).
//!
//! # Who calls it
//! `myriad term` (`nodedrain`), tests and tools through [`Client`] / [`BlockingClient`];
//! [`super::balance`] cuts its moves with [`pieces`].

use std::time::Duration;

use myriad_meta::{Capabilities, NodeState, Role};
use myriad_types::{ChunkId, NodeId};

use super::{BlockingClient, Client};
use crate::ClientError;

/// CIDs per migration request of a drain by default.
pub const DRAIN_PIECE_CHUNKS: u64 = 2_048;
/// Most CID ranges one listing of a drain asks for.
const DRAIN_LIST_RANGES: u64 = 100_000;
/// Pause before a failed piece is tried again.
const DRAIN_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// How a peer is drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainOptions {
    /// Peers that receive the chunks, in turn; empty: every other alive peer that stores
    /// chunks.
    pub targets: Vec<NodeId>,
    /// Most CIDs one migration request moves (1..=2^20).
    pub piece_chunks: u64,
    /// Most listings of the drained peer's chunks.
    pub passes_max: u32,
    /// Attempts per piece (each with the next target).
    pub attempts: u32,
}

impl Default for DrainOptions {
    fn default() -> Self {
        DrainOptions {
            targets: Vec::new(),
            piece_chunks: DRAIN_PIECE_CHUNKS,
            passes_max: 10,
            attempts: 3,
        }
    }
}

/// Where a running drain stands (passed to the progress callback after every piece).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainProgress {
    /// The current listing (1-based).
    pub pass: u32,
    /// Live chunks the current listing found on the peer.
    pub pass_chunks: u64,
    /// Of those, chunks moved so far in this pass.
    pub pass_moved: u64,
    /// Chunks moved by the whole drain so far.
    pub moved: u64,
}

/// What a finished drain did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainReport {
    /// The drained peer.
    pub peer: NodeId,
    /// Chunks moved.
    pub moved: u64,
    /// Migration requests that succeeded.
    pub pieces: u64,
    /// Listings made (the last one found the peer empty).
    pub passes: u32,
    /// Chunks moved to each target.
    pub per_target: Vec<(NodeId, u64)>,
}

impl Client {
    /// Moves every chunk `peer` holds to other peers (see the [module docs](self)); calls
    /// `progress` after every piece. Returns once a listing finds `peer` empty.
    pub async fn drain(
        &self,
        peer: NodeId,
        options: &DrainOptions,
        progress: &mut dyn FnMut(&DrainProgress),
    ) -> Result<DrainReport, ClientError> {
        if options.piece_chunks == 0 || options.piece_chunks > 1 << 20 {
            return Err(ClientError::InvalidArgument(format!(
                "piece size {} is not 1..=2^20 CIDs",
                options.piece_chunks
            )));
        }
        let targets = self.drain_targets(peer, &options.targets).await?;
        let mut report = DrainReport {
            peer,
            moved: 0,
            pieces: 0,
            passes: 0,
            per_target: targets.iter().map(|target| (*target, 0)).collect(),
        };
        let mut turn = 0usize;
        for pass in 1..=options.passes_max.max(1) {
            report.passes = pass;
            let (ranges, _truncated) = self.chunks().list(peer, None, DRAIN_LIST_RANGES).await?;
            if ranges.is_empty() {
                return Ok(report);
            }
            let mut state = DrainProgress {
                pass,
                pass_chunks: ranges
                    .iter()
                    .map(|(first, last)| last.local_id() - first.local_id() + 1)
                    .sum(),
                pass_moved: 0,
                moved: report.moved,
            };
            progress(&state);
            for (first, last) in ranges {
                for (from, to) in pieces(first, last, options.piece_chunks) {
                    let (target, moved) = self
                        .move_piece(peer, from, to, &targets, &mut turn, options.attempts)
                        .await
                        .map_err(|error| partial(error, &report))?;
                    report.moved += moved;
                    report.pieces += 1;
                    if let Some(entry) = report.per_target.iter_mut().find(|(t, _)| *t == target) {
                        entry.1 += moved;
                    }
                    state.pass_moved += to.local_id() - from.local_id() + 1;
                    state.moved = report.moved;
                    progress(&state);
                }
            }
        }
        let (left, _) = self.chunks().list(peer, None, 1).await?;
        if left.is_empty() {
            return Ok(report);
        }
        Err(ClientError::Server {
            node: peer,
            reason: format!(
                "still holds chunks after {} passes ({} chunks moved): is a workload \
                 creating chunks on it?",
                report.passes, report.moved
            ),
        })
    }

    /// The targets of a drain of `peer`: the given ones (checked), or every other alive
    /// peer that stores chunks.
    async fn drain_targets(
        &self,
        peer: NodeId,
        given: &[NodeId],
    ) -> Result<Vec<NodeId>, ClientError> {
        let nodes = self.nodes().await?;
        let usable = |id: NodeId| {
            nodes.iter().any(|node| {
                node.id == id
                    && node.role == Role::Peer
                    && node.state == NodeState::Alive
                    && node.capabilities.contains(Capabilities::STORAGE)
            })
        };
        if !usable(peer) {
            return Err(ClientError::InvalidArgument(format!(
                "{peer} is not an alive peer"
            )));
        }
        let targets: Vec<NodeId> = if given.is_empty() {
            nodes
                .iter()
                .map(|node| node.id)
                .filter(|id| *id != peer && usable(*id))
                .collect()
        } else {
            if let Some(bad) = given.iter().find(|id| **id == peer || !usable(**id)) {
                return Err(ClientError::InvalidArgument(format!(
                    "target {bad} is not another alive peer that stores chunks"
                )));
            }
            given.to_vec()
        };
        if targets.is_empty() {
            return Err(ClientError::InvalidArgument(format!(
                "no other alive peer to take {peer}'s chunks"
            )));
        }
        Ok(targets)
    }

    /// Migrates `first..=last` from `peer`, trying the targets in turn; the target that
    /// took it and how many chunks moved.
    async fn move_piece(
        &self,
        peer: NodeId,
        first: ChunkId,
        last: ChunkId,
        targets: &[NodeId],
        turn: &mut usize,
        attempts: u32,
    ) -> Result<(NodeId, u64), ClientError> {
        let mut last_error = None;
        for attempt in 0..attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(DRAIN_RETRY_PAUSE).await;
            }
            let target = targets[*turn % targets.len()];
            *turn += 1;
            match self.migrate_from(peer, first, last, target).await {
                Ok(moved) => return Ok((target, moved)),
                Err(error) => {
                    tracing::warn!(%peer, %first, %last, %target, %error, "drain: piece not moved");
                    last_error = Some(error);
                }
            }
        }
        Err(last_error.unwrap_or(ClientError::InvalidArgument(
            "no attempt was made".to_owned(),
        )))
    }
}

impl BlockingClient<'_> {
    /// See [`Client::drain`].
    pub fn drain(
        &self,
        peer: NodeId,
        options: &DrainOptions,
        progress: &mut dyn FnMut(&DrainProgress),
    ) -> Result<DrainReport, ClientError> {
        self.block_on(self.client.drain(peer, options, progress))
    }
}

/// `first..=last` cut into consecutive pieces of at most `size` CIDs.
pub(super) fn pieces(first: ChunkId, last: ChunkId, size: u64) -> Vec<(ChunkId, ChunkId)> {
    let creator = first.creator();
    let mut out = Vec::new();
    let mut lid = first.local_id();
    while lid <= last.local_id() {
        let end = lid.saturating_add(size - 1).min(last.local_id());
        if let (Some(a), Some(b)) = (ChunkId::new(creator, lid), ChunkId::new(creator, end)) {
            out.push((a, b));
        }
        match end.checked_add(1) {
            Some(next) => lid = next,
            None => break,
        }
    }
    out
}

/// A piece's error with what the drain had moved before it.
fn partial(error: ClientError, report: &DrainReport) -> ClientError {
    if report.moved == 0 {
        return error;
    }
    ClientError::Server {
        node: report.peer,
        reason: format!(
            "drain stopped after moving {} chunks in {} pieces: {error}",
            report.moved, report.pieces
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_range_in_order_without_overlap() {
        let cid = |lid| ChunkId::new(NodeId(2), lid).expect("valid CID");
        let cut = pieces(cid(5), cid(14), 4);
        assert_eq!(
            cut,
            vec![(cid(5), cid(8)), (cid(9), cid(12)), (cid(13), cid(14))]
        );
        assert_eq!(pieces(cid(7), cid(7), 4), vec![(cid(7), cid(7))]);
        assert_eq!(pieces(cid(1), cid(8), 8), vec![(cid(1), cid(8))]);
    }
}
