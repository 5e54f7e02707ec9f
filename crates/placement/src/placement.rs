//! Choosing the ordered backup peers of a zone, and replacing a failed one.
//!
//! Strategies (combinable as in DXRAM): independent random choice; *disjunctive first
//! backups* (no two zones of a master share a first backup until every candidate was first
//! once, which spreads recovery over the most peers); *rack-aware* (backups on racks other
//! than the master's and each other's where the candidates allow); and *copysets* (Cidon et
//! al.): the candidates are permuted `ceil(S / (R - 1))` times and each permutation is cut
//! into groups of R; a zone's backups are the first backup plus the rest of one group that
//! contains it. Copysets are computed by every master from the same input with a fixed
//! generator (not the caller's RNG), so all masters agree without a coordinator, and a failed
//! member is replaced by a choice seeded from the group's surviving members.
//!
//! Invariants: a zone's backups are distinct, never the master, and drawn from the
//! candidates; with fewer candidates than R the zone gets all of them and is filled up later
//! ([`Placement::extend`]).

use std::collections::BTreeSet;

use myriad_types::NodeId;
use rand::Rng;

/// A peer that may hold backups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The peer.
    pub node: NodeId,
    /// Its rack.
    pub rack: u16,
    /// Its switch.
    pub switch: u16,
}

/// How backups are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Strategy {
    /// Choose from copysets of this scatter width instead of independently at random.
    pub copyset_scatter_width: Option<u32>,
    /// First backups of a master's zones are distinct until every candidate was first once.
    pub disjunctive_first: bool,
    /// Prefer backups on racks other than the master's and each other's.
    pub rack_aware: bool,
}

impl Strategy {
    /// Independent random choice.
    pub const RANDOM: Strategy = Strategy {
        copyset_scatter_width: None,
        disjunctive_first: false,
        rack_aware: false,
    };

    /// Random with disjunctive first backups (DXRAM's recovery experiments).
    pub const DISJUNCTIVE: Strategy = Strategy {
        copyset_scatter_width: None,
        disjunctive_first: true,
        rack_aware: false,
    };

    /// Random, spread over racks.
    pub const RACK_AWARE: Strategy = Strategy {
        copyset_scatter_width: None,
        disjunctive_first: false,
        rack_aware: true,
    };

    /// Copysets of scatter width `scatter_width`, with disjunctive first backups.
    pub const fn copyset(scatter_width: u32) -> Strategy {
        Strategy {
            copyset_scatter_width: Some(scatter_width),
            disjunctive_first: true,
            rack_aware: false,
        }
    }
}

/// Why no backup could be chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// No peer other than the master can hold backups.
    #[error("no backup candidates besides the master")]
    NoCandidates,
    /// The replication factor is 0.
    #[error("the replication factor must be at least 1")]
    ZeroReplication,
}

/// SplitMix64: a fixed generator for the parts every master must compute identically.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound.max(1) as u64) as usize
    }

    fn seeded(parts: impl IntoIterator<Item = u64>) -> SplitMix {
        let mut mix = SplitMix(0x6D79_7269_6164_0001);
        for part in parts {
            mix.0 ^= part;
            mix.next();
        }
        mix
    }
}

/// The copysets of `nodes` (any order; duplicates ignored) for replication `replication` and
/// scatter width `scatter_width`. Deterministic: equal inputs give equal copysets.
pub fn copysets(nodes: &[NodeId], replication: usize, scatter_width: u32) -> Vec<Vec<NodeId>> {
    let sorted: Vec<NodeId> = nodes
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if sorted.is_empty() || replication == 0 {
        return Vec::new();
    }
    if sorted.len() <= replication {
        return vec![sorted];
    }
    let permutations =
        (scatter_width.max(1) as usize).div_ceil(replication.saturating_sub(1).max(1));
    let mut sets = Vec::new();
    for permutation in 0..permutations {
        let mut rng = SplitMix::seeded(
            std::iter::once(permutation as u64).chain(sorted.iter().map(|n| u64::from(n.0))),
        );
        let mut order = sorted.clone();
        for index in (1..order.len()).rev() {
            order.swap(index, rng.below(index + 1));
        }
        for start in (0..order.len()).step_by(replication) {
            let mut group: Vec<NodeId> =
                order[start..(start + replication).min(order.len())].to_vec();
            // A short last group is filled from the start of the permutation.
            let mut fill = order.iter();
            while group.len() < replication {
                match fill.next() {
                    Some(node) if !group.contains(node) => group.push(*node),
                    Some(_) => {}
                    None => break,
                }
            }
            sets.push(group);
        }
    }
    sets
}

/// The placement state of one master.
#[derive(Debug, Clone)]
pub struct Placement {
    master: Candidate,
    replication: usize,
    strategy: Strategy,
    used_first: BTreeSet<NodeId>,
}

impl Placement {
    /// Placement for `master` with `replication` backups per zone.
    pub fn new(master: Candidate, replication: usize, strategy: Strategy) -> Placement {
        Placement {
            master,
            replication,
            strategy,
            used_first: BTreeSet::new(),
        }
    }

    /// The replication factor.
    pub fn replication(&self) -> usize {
        self.replication
    }

    fn eligible(&self, candidates: &[Candidate]) -> Vec<Candidate> {
        let mut seen = BTreeSet::new();
        let mut eligible: Vec<Candidate> = candidates
            .iter()
            .copied()
            .filter(|c| c.node != self.master.node && seen.insert(c.node))
            .collect();
        eligible.sort_by_key(|c| c.node);
        eligible
    }

    /// Picks one of `pool` at random, preferring racks not in `racks_taken` when rack-aware.
    fn pick(
        &self,
        pool: &[Candidate],
        racks_taken: &BTreeSet<u16>,
        rng: &mut impl Rng,
    ) -> Option<Candidate> {
        if pool.is_empty() {
            return None;
        }
        if self.strategy.rack_aware {
            let fresh: Vec<Candidate> = pool
                .iter()
                .copied()
                .filter(|c| !racks_taken.contains(&c.rack))
                .collect();
            if !fresh.is_empty() {
                return Some(fresh[rng.gen_range(0..fresh.len())]);
            }
        }
        Some(pool[rng.gen_range(0..pool.len())])
    }

    /// Chooses the ordered backups of a new zone.
    pub fn place(
        &mut self,
        candidates: &[Candidate],
        rng: &mut impl Rng,
    ) -> Result<Vec<NodeId>, PlacementError> {
        if self.replication == 0 {
            return Err(PlacementError::ZeroReplication);
        }
        let eligible = self.eligible(candidates);
        if eligible.is_empty() {
            return Err(PlacementError::NoCandidates);
        }
        let mut racks: BTreeSet<u16> = BTreeSet::from([self.master.rack]);
        // The first backup.
        let mut pool: Vec<Candidate> = if self.strategy.disjunctive_first {
            let unused: Vec<Candidate> = eligible
                .iter()
                .copied()
                .filter(|c| !self.used_first.contains(&c.node))
                .collect();
            if unused.is_empty() {
                self.used_first.clear();
                eligible.clone()
            } else {
                unused
            }
        } else {
            eligible.clone()
        };
        let Some(first) = self.pick(&pool, &racks, rng) else {
            return Err(PlacementError::NoCandidates);
        };
        self.used_first.insert(first.node);
        racks.insert(first.rack);
        let mut chosen = vec![first.node];
        if let Some(scatter_width) = self.strategy.copyset_scatter_width {
            let nodes: Vec<NodeId> = eligible.iter().map(|c| c.node).collect();
            let sets: Vec<Vec<NodeId>> = copysets(&nodes, self.replication, scatter_width)
                .into_iter()
                .filter(|set| set.contains(&first.node))
                .collect();
            if !sets.is_empty() {
                let set = &sets[rng.gen_range(0..sets.len())];
                chosen.extend(set.iter().copied().filter(|&n| n != first.node));
                chosen.truncate(self.replication);
                return Ok(chosen);
            }
        }
        pool = eligible;
        while chosen.len() < self.replication {
            pool.retain(|c| !chosen.contains(&c.node));
            let Some(next) = self.pick(&pool, &racks, rng) else {
                break;
            };
            racks.insert(next.rack);
            chosen.push(next.node);
        }
        Ok(chosen)
    }

    /// Fills a zone that has fewer than R backups (too few peers when it was placed, or a
    /// backup left) from `candidates`, appending at the end of the order.
    pub fn extend(
        &self,
        current: &[NodeId],
        candidates: &[Candidate],
        rng: &mut impl Rng,
    ) -> Vec<NodeId> {
        let mut chosen: Vec<NodeId> = current.to_vec();
        let eligible = self.eligible(candidates);
        let mut racks: BTreeSet<u16> = eligible
            .iter()
            .filter(|c| chosen.contains(&c.node))
            .map(|c| c.rack)
            .chain(std::iter::once(self.master.rack))
            .collect();
        while chosen.len() < self.replication {
            let pool: Vec<Candidate> = eligible
                .iter()
                .copied()
                .filter(|c| !chosen.contains(&c.node))
                .collect();
            let Some(next) = (if self.strategy.copyset_scatter_width.is_some() {
                // Every master must pick the same member for a group: seed from the group.
                let mut seeded = SplitMix::seeded(chosen.iter().map(|n| u64::from(n.0)));
                (!pool.is_empty()).then(|| pool[seeded.below(pool.len())])
            } else {
                self.pick(&pool, &racks, rng)
            }) else {
                break;
            };
            racks.insert(next.rack);
            chosen.push(next.node);
        }
        chosen
    }

    /// The backups of a zone after `failed` died: the failed peer leaves the order and a
    /// replacement is appended at the end (the zone is then re-replicated to it).
    pub fn replace(
        &self,
        current: &[NodeId],
        failed: NodeId,
        candidates: &[Candidate],
        rng: &mut impl Rng,
    ) -> Vec<NodeId> {
        let survivors: Vec<NodeId> = current.iter().copied().filter(|&n| n != failed).collect();
        let candidates: Vec<Candidate> = candidates
            .iter()
            .copied()
            .filter(|c| c.node != failed)
            .collect();
        self.extend(&survivors, &candidates, rng)
    }
}
