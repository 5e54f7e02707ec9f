//! Load balancing by migration: moving chunks from the busiest peer to the idlest one.
//!
//! # Job
//! [`Client::peer_loads`] reads every alive storage peer's request counter twice, a window
//! apart (`ChunkRequest::Stats`, `requests_served`), and gives each peer's request rate
//! and chunk count. [`Client::balance_round`] takes one such sample and, when the busiest
//! peer serves at least [`BalanceOptions::imbalance`] times the mean rate (and at least
//! [`BalanceOptions::min_rate`]), migrates a share of its chunks to the idlest peer: the
//! share that would bring both towards the mean if requests are spread evenly over the
//! busy peer's chunks, at most [`BalanceOptions::chunks_per_round_max`] (the rate limit).
//! The chunks taken are the busy peer's first CID ranges in its listing, cut into
//! migrations of [`BalanceOptions::piece_chunks`] CIDs.
//!
//! # Invariants
//! - Nothing moves unless the sample shows an imbalance above both thresholds; one round
//!   moves from one peer to one other peer, at most `chunks_per_round_max` chunks.
//! - Every move is a migration (`MIGRATE`) with its guarantees: no acknowledged write is
//!   lost, no read sees an older value, clients follow the chunks.
//! - The balancer is off unless someone runs it: the terminal's `balance` command or a
//!   tool calling [`Client::balance_round`] in a loop with its own pause between rounds.
//!
//! # Limits
//! The peers count requests per peer, not per CID range, so the balancer cannot pick the
//! hottest ranges of a peer: it assumes the requests a peer serves are spread evenly
//! over its chunks (a skew between peers is what it corrects, not one within a peer).
//!
//! # Who calls it
//! `myriad term` (`balance`), `myriad bench balance`, tools through [`Client`].

use std::time::{Duration, Instant};

use myriad_meta::{Capabilities, NodeState, Role};
use myriad_types::NodeId;

use super::drain::pieces;
use super::{BlockingClient, Client};
use crate::ClientError;

/// Most CID ranges one round reads from the busy peer's listing.
const BALANCE_LIST_RANGES: u64 = 100_000;

/// When and how much a balancing round moves.
#[derive(Debug, Clone, PartialEq)]
pub struct BalanceOptions {
    /// How long the request counters are watched per round.
    pub window: Duration,
    /// The busiest peer's rate must be at least this multiple of the mean.
    pub imbalance: f64,
    /// …and at least this many requests per second.
    pub min_rate: f64,
    /// Most chunks one round moves (the rate limit).
    pub chunks_per_round_max: u64,
    /// Most CIDs per migration request.
    pub piece_chunks: u64,
}

impl Default for BalanceOptions {
    fn default() -> Self {
        BalanceOptions {
            window: Duration::from_secs(1),
            imbalance: 1.5,
            min_rate: 1_000.0,
            chunks_per_round_max: 100_000,
            piece_chunks: super::drain::DRAIN_PIECE_CHUNKS,
        }
    }
}

/// One peer's load in a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerLoad {
    /// The peer.
    pub node: NodeId,
    /// Remote chunk requests it served per second during the window.
    pub requests_per_sec: f64,
    /// Chunks it held at the end of the window.
    pub chunks: u64,
}

/// What one balancing round saw and did.
#[derive(Debug, Clone, PartialEq)]
pub struct BalanceRound {
    /// Every alive storage peer's load.
    pub loads: Vec<PeerLoad>,
    /// The peer chunks moved from and the one they moved to, if any moved.
    pub moved_between: Option<(NodeId, NodeId)>,
    /// Chunks moved.
    pub moved: u64,
    /// Why nothing moved, or what moved, in words.
    pub decision: String,
}

impl Client {
    /// Every alive storage peer's request rate over `window` and its chunk count.
    pub async fn peer_loads(&self, window: Duration) -> Result<Vec<PeerLoad>, ClientError> {
        let peers: Vec<NodeId> = self
            .nodes()
            .await?
            .iter()
            .filter(|node| {
                node.role == Role::Peer
                    && node.state == NodeState::Alive
                    && node.capabilities.contains(Capabilities::STORAGE)
            })
            .map(|node| node.id)
            .collect();
        let mut before = Vec::with_capacity(peers.len());
        for &peer in &peers {
            before.push(self.chunks().stats(peer).await?.requests_served);
        }
        let started = Instant::now();
        tokio::time::sleep(window).await;
        let mut loads = Vec::with_capacity(peers.len());
        let seconds = started.elapsed().as_secs_f64().max(1e-3);
        for (&peer, was) in peers.iter().zip(before) {
            let stats = self.chunks().stats(peer).await?;
            loads.push(PeerLoad {
                node: peer,
                requests_per_sec: stats.requests_served.saturating_sub(was) as f64 / seconds,
                chunks: stats.chunks,
            });
        }
        Ok(loads)
    }

    /// One balancing round (see the [module docs](self)).
    pub async fn balance_round(
        &self,
        options: &BalanceOptions,
    ) -> Result<BalanceRound, ClientError> {
        let loads = self.peer_loads(options.window).await?;
        let (moves, decision) = plan(&loads, options);
        let mut round = BalanceRound {
            loads,
            moved_between: None,
            moved: 0,
            decision,
        };
        let Some((from, to, chunks)) = moves else {
            return Ok(round);
        };
        let (ranges, _) = self.chunks().list(from, None, BALANCE_LIST_RANGES).await?;
        let mut left = chunks;
        for (first, last) in ranges {
            if left == 0 {
                break;
            }
            let take = (last.local_id() - first.local_id() + 1).min(left);
            let Some(end) =
                myriad_types::ChunkId::new(first.creator(), first.local_id() + take - 1)
            else {
                continue;
            };
            for (a, b) in pieces(first, end, options.piece_chunks) {
                round.moved += self.migrate_from(from, a, b, to).await?;
            }
            left -= take;
        }
        round.moved_between = Some((from, to));
        Ok(round)
    }
}

impl BlockingClient<'_> {
    /// See [`Client::peer_loads`].
    pub fn peer_loads(&self, window: Duration) -> Result<Vec<PeerLoad>, ClientError> {
        self.block_on(self.client.peer_loads(window))
    }

    /// See [`Client::balance_round`].
    pub fn balance_round(&self, options: &BalanceOptions) -> Result<BalanceRound, ClientError> {
        self.block_on(self.client.balance_round(options))
    }
}

/// What a round should move given `loads`: (from, to, chunks) or nothing, and why.
pub fn plan(
    loads: &[PeerLoad],
    options: &BalanceOptions,
) -> (Option<(NodeId, NodeId, u64)>, String) {
    if loads.len() < 2 {
        return (None, "fewer than two peers".to_owned());
    }
    let by_rate = |a: &&PeerLoad, b: &&PeerLoad| a.requests_per_sec.total_cmp(&b.requests_per_sec);
    let (Some(hot), Some(cold)) = (loads.iter().max_by(by_rate), loads.iter().min_by(by_rate))
    else {
        return (None, "no loads".to_owned());
    };
    let mean = loads.iter().map(|l| l.requests_per_sec).sum::<f64>() / loads.len() as f64;
    if hot.requests_per_sec < options.min_rate {
        return (
            None,
            format!(
                "busiest peer {} serves {:.0} req/s, below {:.0}",
                hot.node, hot.requests_per_sec, options.min_rate
            ),
        );
    }
    if hot.requests_per_sec < options.imbalance * mean {
        return (
            None,
            format!(
                "balanced: busiest peer {} at {:.2}× the mean of {:.0} req/s (threshold {:.2}×)",
                hot.node,
                hot.requests_per_sec / mean.max(1e-9),
                mean,
                options.imbalance
            ),
        );
    }
    // Move the load both peers are away from the mean, whichever is less.
    let rate = (hot.requests_per_sec - mean).min(mean - cold.requests_per_sec);
    let share = (rate / hot.requests_per_sec).clamp(0.0, 1.0);
    let chunks = ((hot.chunks as f64 * share).round() as u64).min(options.chunks_per_round_max);
    if chunks == 0 {
        return (
            None,
            format!("busiest peer {} holds no chunks to move", hot.node),
        );
    }
    (
        Some((hot.node, cold.node, chunks)),
        format!(
            "{} at {:.0} req/s, {} at {:.0} req/s (mean {:.0}): {chunks} of {} chunks move",
            hot.node, hot.requests_per_sec, cold.node, cold.requests_per_sec, mean, hot.chunks
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(node: u16, rate: f64, chunks: u64) -> PeerLoad {
        PeerLoad {
            node: NodeId(node),
            requests_per_sec: rate,
            chunks,
        }
    }

    #[test]
    fn a_hot_peer_gives_the_share_that_levels_it_with_the_idlest() {
        let options = BalanceOptions::default();
        // One peer serves everything: a third of its chunks go to an idle one.
        let loads = [load(2, 30_000.0, 900), load(3, 0.0, 0), load(4, 0.0, 0)];
        let (moves, why) = plan(&loads, &options);
        assert_eq!(moves, Some((NodeId(2), NodeId(3), 300)), "{why}");
        // Rate limit.
        let limited = BalanceOptions {
            chunks_per_round_max: 50,
            ..options.clone()
        };
        assert_eq!(plan(&loads, &limited).0, Some((NodeId(2), NodeId(3), 50)));
        // Balanced enough, or too little load: nothing moves.
        let even = [
            load(2, 11_000.0, 9),
            load(3, 10_000.0, 9),
            load(4, 9_000.0, 9),
        ];
        assert_eq!(plan(&even, &options).0, None);
        let idle = [load(2, 500.0, 9), load(3, 0.0, 9)];
        assert_eq!(plan(&idle, &options).0, None);
        assert_eq!(plan(&[load(2, 1e6, 9)], &options).0, None);
    }
}
