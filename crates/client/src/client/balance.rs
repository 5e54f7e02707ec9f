//! Load balancing by migration: moving the hottest CID ranges from the busiest peer to the
//! idlest one.
//!
//! # Job
//! [`Client::peer_loads`] reads every alive storage peer's request counter twice, a window
//! apart (`ChunkRequest::Stats`, `requests_served`), and gives each peer's request rate
//! and chunk count. [`Client::balance_round`] takes one such sample and, when the busiest
//! peer serves at least [`BalanceOptions::imbalance`] times the mean rate (and at least
//! [`BalanceOptions::min_rate`]), migrates chunks from it to the idlest peer, aiming to
//! move the request rate that brings both towards the mean ([`plan`]).
//!
//! Which chunks: the busy peer's hottest CID ranges, from its newest monitoring report
//! (peers count requests per block of local IDs and push the hottest blocks with their
//! rates to the superpeers, see `myriad_proto::monitor::HotRange`). [`pick_ranges`] takes
//! the hot ranges hottest first, each whole while that comes closer to the rate to move
//! than leaving it; a range hotter than that is split (the share that brings the rates
//! level, assuming its requests spread evenly over its chunks); if the hot ranges do not add up to the rate
//! to move, the rest comes from the peer's other chunks, at the rate per chunk left over
//! by the hot ones. Without a recent report (monitoring off, a peer that just started)
//! the round falls back to the share of the peer's chunks [`plan`] computes, taken from
//! its first CID ranges. Either way at most [`BalanceOptions::chunks_per_round_max`]
//! chunks move (the rate limit), in migrations of [`BalanceOptions::piece_chunks`] CIDs.
//!
//! # Invariants
//! - Nothing moves unless the sample shows an imbalance above both thresholds; one round
//!   moves from one peer to one other peer, at most `chunks_per_round_max` chunks, and
//!   only chunks the busy peer's listing shows it holds.
//! - Every move is a migration (`MIGRATE`) with its guarantees: no acknowledged write is
//!   lost, no read sees an older value, clients follow the chunks.
//! - The balancer is off unless someone runs it: the terminal's `balance` command or a
//!   tool calling [`Client::balance_round`] in a loop with its own pause between rounds.
//!
//! # Limits
//! Hot ranges are blocks of 256 local IDs counted by each request's first CID, over the
//! peer's last monitoring interval (2 s): a batch spanning blocks counts for its first
//! only, and a round right after a change of the workload still sees the previous one's
//! shares (scaled to the rate the round measured).
//!
//! # Who calls it
//! `myriad term` (`balance`), `myriad bench balance`, tools through [`Client`].

use std::time::{Duration, Instant};

use myriad_meta::{Capabilities, NodeState, Role};
use myriad_proto::monitor::{HotRange, MonitorQuery};
use myriad_types::{ChunkId, NodeId};

use super::drain::pieces;
use super::{BlockingClient, Client};
use crate::ClientError;

/// Most CID ranges one round reads from the busy peer's listing.
const BALANCE_LIST_RANGES: u64 = 100_000;
/// A monitoring report older than this is not used to pick hot ranges.
pub const HOT_REPORT_MAX_AGE: Duration = Duration::from_secs(10);

/// How long a balancing round waits for a peer to learn that it owns a range it holds
/// (see `migrate_when_owned`).
pub const OWNERSHIP_WAIT: Duration = Duration::from_secs(2);

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
    /// The CID ranges moved, in the order moved (pieces of one range merged).
    pub moved_ranges: Vec<(ChunkId, ChunkId)>,
    /// Whether the ranges were picked by their request rates (the busy peer's hot
    /// ranges), rather than as the first ranges of its listing.
    pub by_hot_ranges: bool,
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
            moved_ranges: Vec::new(),
            by_hot_ranges: false,
            decision,
        };
        let Some((from, to, chunks)) = moves else {
            return Ok(round);
        };
        let (owned, _) = self.chunks().list(from, None, BALANCE_LIST_RANGES).await?;
        let rate_of = |node: NodeId| {
            round
                .loads
                .iter()
                .find(|load| load.node == node)
                .map_or(0.0, |load| load.requests_per_sec)
        };
        let mean = round.loads.iter().map(|l| l.requests_per_sec).sum::<f64>()
            / round.loads.len().max(1) as f64;
        let rates = Rates {
            busy: rate_of(from),
            idle: rate_of(to),
            mean,
        };
        let hot = self.hot_ranges(from, rates.busy).await;
        let picked = if hot.is_empty() {
            Vec::new()
        } else {
            pick_ranges(&hot, &owned, rates, options.chunks_per_round_max)
        };
        let ranges = if picked.is_empty() {
            first_ranges(&owned, chunks)
        } else {
            round.by_hot_ranges = true;
            picked
        };
        for (first, last) in ranges {
            let mut moved = 0;
            for (a, b) in pieces(first, last, options.piece_chunks) {
                moved += self.migrate_when_owned(from, a, b, to).await?;
            }
            round.moved += moved;
            if moved > 0 {
                round.moved_ranges.push((first, last));
            }
        }
        if round.by_hot_ranges {
            round.decision.push_str(" (hot ranges first)");
        }
        round.moved_between = Some((from, to));
        Ok(round)
    }

    /// [`Client::migrate_from`], asked again (every 50 ms, up to [`OWNERSHIP_WAIT`]) while
    /// `from` answers that it does not own the range: the range was listed in its memory
    /// (it arrived with an earlier round's migration), and the ownership event that makes
    /// it the owner reaches it a little after the superpeers committed it.
    async fn migrate_when_owned(
        &self,
        from: NodeId,
        first: ChunkId,
        last: ChunkId,
        to: NodeId,
    ) -> Result<u64, ClientError> {
        let deadline = tokio::time::Instant::now() + OWNERSHIP_WAIT;
        loop {
            match self.migrate_from(from, first, last, to).await {
                Err(ClientError::Server { reason, .. })
                    if reason.ends_with("is not owned by this peer")
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    /// `peer`'s hottest CID ranges from its newest monitoring report, if that is recent
    /// ([`HOT_REPORT_MAX_AGE`]); empty without one (or if no superpeer answers). The
    /// rates are scaled by `busy_rate` over the peer's total rate in the report's
    /// interval (from the two newest reports), so a report whose interval saw only part
    /// of the load (a migration in its middle) still gives each range its share.
    async fn hot_ranges(&self, peer: NodeId, busy_rate: f64) -> Vec<HotRange> {
        let query = MonitorQuery {
            node: Some(peer),
            history: 2,
        };
        let Ok(reply) = self.monitoring(query).await else {
            return Vec::new();
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_millis() as u64);
        let Some((_, reports)) = reply.nodes.into_iter().find(|(node, _)| *node == peer) else {
            return Vec::new();
        };
        let Some(newest) = reports.last() else {
            return Vec::new();
        };
        if now_ms.saturating_sub(newest.unix_ms) > HOT_REPORT_MAX_AGE.as_millis() as u64 {
            return Vec::new();
        }
        let total_rate = match reports.as_slice() {
            [older, newer] if newer.unix_ms > older.unix_ms => {
                newer.requests_served.saturating_sub(older.requests_served) as f64 * 1_000.0
                    / (newer.unix_ms - older.unix_ms) as f64
            }
            _ => 0.0,
        };
        let scale = if total_rate > 0.0 && busy_rate > 0.0 {
            busy_rate / total_rate
        } else {
            1.0
        };
        newest
            .hot_ranges
            .iter()
            .map(|range| HotRange {
                requests_per_sec: (range.requests_per_sec as f64 * scale).round() as u64,
                ..*range
            })
            .collect()
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

/// The request rates [`pick_ranges`] balances: the busy peer's, the idle peer's, the mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Requests per second of the peer chunks move from.
    pub busy: f64,
    /// Requests per second of the peer chunks move to.
    pub idle: f64,
    /// Mean requests per second over all peers.
    pub mean: f64,
}

/// Chunks in the inclusive ranges `ranges` (raw CIDs).
fn count(ranges: &[(u64, u64)]) -> u64 {
    ranges.iter().map(|(a, b)| b - a + 1).sum()
}

/// The parts of `owned` inside `first..=last` (raw CIDs).
fn intersect(owned: &[(u64, u64)], first: u64, last: u64) -> Vec<(u64, u64)> {
    owned
        .iter()
        .filter_map(|&(a, b)| {
            let (a, b) = (a.max(first), b.min(last));
            (a <= b).then_some((a, b))
        })
        .collect()
}

/// The first `chunks` CIDs of `ranges`, in order.
fn take_first(ranges: &[(u64, u64)], chunks: u64) -> Vec<(u64, u64)> {
    let mut left = chunks;
    let mut out = Vec::new();
    for &(a, b) in ranges {
        if left == 0 {
            break;
        }
        let take = (b - a + 1).min(left);
        out.push((a, a + take - 1));
        left -= take;
    }
    out
}

/// `owned` without the parts in any of `taken` (raw CIDs, inclusive).
fn subtract(owned: &[(u64, u64)], taken: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut rest: Vec<(u64, u64)> = owned.to_vec();
    for &(x, y) in taken {
        rest = rest
            .into_iter()
            .flat_map(|(a, b)| {
                if b < x || a > y {
                    return vec![(a, b)];
                }
                let mut parts = Vec::with_capacity(2);
                if a < x {
                    parts.push((a, x - 1));
                }
                if b > y {
                    parts.push((y + 1, b));
                }
                parts
            })
            .collect();
    }
    rest
}

fn to_cids(ranges: Vec<(u64, u64)>) -> Vec<(ChunkId, ChunkId)> {
    ranges
        .into_iter()
        .map(|(a, b)| (ChunkId::from_raw(a), ChunkId::from_raw(b)))
        .collect()
}

/// Which of the busy peer's chunks a round moves, given its hot ranges (hottest first),
/// the ranges it holds (`owned`, from its listing) and the rates: see the
/// [module docs](self). At most `max_chunks` CIDs; empty if nothing is worth moving.
pub fn pick_ranges(
    hot: &[HotRange],
    owned: &[(ChunkId, ChunkId)],
    rates: Rates,
    max_chunks: u64,
) -> Vec<(ChunkId, ChunkId)> {
    let owned: Vec<(u64, u64)> = owned
        .iter()
        .filter(|(a, b)| a.raw() <= b.raw() && a.creator() == b.creator())
        .map(|(a, b)| (a.raw(), b.raw()))
        .collect();
    // The rate to move (at most half the gap between the two peers, so no move makes
    // the idle peer busier than the busy one was).
    let target = (rates.busy - rates.mean).min(rates.mean - rates.idle);
    let (mut moved_rate, mut taken) = (0.0f64, Vec::<(u64, u64)>::new());
    let (mut hot_parts, mut hot_rate) = (Vec::<(u64, u64)>::new(), 0.0f64);
    for range in hot {
        let parts = intersect(&owned, range.first.raw(), range.last.raw());
        hot_parts.extend(&parts);
        let chunks = count(&parts);
        // A report may predate a migration: only the held part of a range counts.
        let span = (range.last.raw() - range.first.raw() + 1) as f64;
        let rate = range.requests_per_sec as f64 * (chunks as f64 / span).min(1.0);
        hot_rate += rate;
        if moved_rate >= target || chunks == 0 || rate <= 0.0 {
            continue;
        }
        if rate < 2.0 * (target - moved_rate) {
            // Moving it whole comes closer to the target than leaving it.
            taken.extend(parts);
            moved_rate += rate;
        } else {
            // Too hot to move whole: the share that levels the two peers.
            let share = ((target - moved_rate) / rate).clamp(0.0, 1.0);
            let take = ((chunks as f64 * share).ceil() as u64).min(chunks);
            taken.extend(take_first(&parts, take));
            moved_rate = target;
        }
    }
    if moved_rate < target {
        // Top up from the other chunks, at the rate per chunk the hot ranges leave.
        let rest = subtract(&owned, &hot_parts);
        let (rest_rate, rest_chunks) = (rates.busy - hot_rate, count(&rest));
        if rest_rate > 0.0 && rest_chunks > 0 {
            let per_chunk = rest_rate / rest_chunks as f64;
            let take = ((target - moved_rate) / per_chunk).ceil() as u64;
            taken.extend(take_first(&rest, take.min(rest_chunks)));
        }
    }
    to_cids(take_first(&taken, max_chunks))
}

/// The first `chunks` CIDs of the listing `owned`, for a round without hot ranges.
fn first_ranges(owned: &[(ChunkId, ChunkId)], chunks: u64) -> Vec<(ChunkId, ChunkId)> {
    let owned: Vec<(u64, u64)> = owned
        .iter()
        .filter(|(a, b)| a.raw() <= b.raw() && a.creator() == b.creator())
        .map(|(a, b)| (a.raw(), b.raw()))
        .collect();
    to_cids(take_first(&owned, chunks))
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

    fn cid(lid: u64) -> ChunkId {
        ChunkId::new(NodeId(2), lid).expect("a valid CID")
    }

    fn hot(first: u64, last: u64, rate: u64) -> HotRange {
        HotRange {
            first: cid(first),
            last: cid(last),
            requests_per_sec: rate,
        }
    }

    #[test]
    fn the_hot_sub_range_moves_exactly_and_a_too_hot_one_is_split() {
        // The peer holds LIDs 1..=3000; LIDs 1024..=1535 take 5,800 of its 10,000 req/s,
        // two idle peers: 3,333 req/s to move; the hot range whole comes closer to that
        // than nothing.
        let owned = [(cid(1), cid(3000))];
        let ranges = [
            hot(1024, 1535, 5_800),
            hot(0, 255, 300),
            hot(2048, 2303, 290),
        ];
        let rates = Rates {
            busy: 10_000.0,
            idle: 0.0,
            mean: 10_000.0 / 3.0,
        };
        let picked = pick_ranges(&ranges, &owned, rates, 100_000);
        assert_eq!(picked, vec![(cid(1024), cid(1535))]);
        // The rate limit cuts it.
        let limited = pick_ranges(&ranges, &owned, rates, 100);
        assert_eq!(limited, vec![(cid(1024), cid(1123))]);
        // Two peers at 6,700 and 3,300: the hot range alone would make the other peer
        // the busier, so a share of it moves: (6,700 - 5,000) / 6,700 of 512 chunks.
        let owned_now = [(cid(1024), cid(1535))];
        let rates = Rates {
            busy: 6_700.0,
            idle: 3_300.0,
            mean: 5_000.0,
        };
        let picked = pick_ranges(&[hot(1024, 1535, 6_700)], &owned_now, rates, 100_000);
        assert_eq!(picked, vec![(cid(1024), cid(1024 + 130 - 1))]);
        // Hot ranges the peer no longer holds are skipped; the rest of the rate comes
        // from its other chunks at their rate per chunk (1,000 req/s over 1,000 chunks).
        let owned = [(cid(1), cid(1000)), (cid(5000), cid(5099))];
        let rates = Rates {
            busy: 1_300.0,
            idle: 0.0,
            mean: 650.0,
        };
        let ranges = [hot(3000, 3999, 900), hot(5000, 5099, 300)];
        let picked = pick_ranges(&ranges, &owned, rates, 100_000);
        assert_eq!(picked, vec![(cid(5000), cid(5099)), (cid(1), cid(350))]);
        // Nothing hot, nothing held: nothing picked.
        assert!(pick_ranges(&[], &[], rates, 10).is_empty());
        assert_eq!(
            subtract(&[(1, 10), (20, 30)], &[(5, 6), (25, 40)]),
            vec![(1, 4), (7, 10), (20, 24)]
        );
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
