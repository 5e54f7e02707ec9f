//! Requests per CID range: which blocks of chunks a peer's clients ask for most (the
//! "hottest CID ranges" of the monitoring summary, and what the balancer moves).
//!
//! # Job
//! [`RangeHeat::record`] counts one request for the block of [`HEAT_BLOCK_LIDS`] local IDs
//! (of any creator) its CID falls in; [`RangeHeat::roll`] (once per monitoring interval)
//! reads and resets every block's count and returns the hottest blocks as
//! [`HotRange`]s with their rates, adjacent blocks merged.
//!
//! # Invariants
//! - Bounded memory, no lock, no allocation on the request path: a fixed open-addressing
//!   table of [`HEAT_SLOTS`] (key, count) pairs of atomics, probed at most [`PROBES`]
//!   slots; a request whose block finds no slot is counted as untracked only.
//! - Approximate by design: a block idle for a whole interval gives its slot back at the
//!   roll, so a block may briefly hold two slots (the roll adds them up) and a request
//!   racing with the release of its slot may be lost. Rates are for ranking, not billing.
//! - One roller: the counts are reset by [`RangeHeat::roll`], so only the peer's
//!   monitoring task calls it (two rollers would each see part of the requests).
//!
//! # Who calls it
//! [`super::chunk_ops::ChunkOps::record`] counts every remote chunk request by its first
//! CID; [`super::monitor::push_reports`] rolls once per report.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use myriad_proto::monitor::HotRange;
use myriad_types::ChunkId;

/// Local IDs per counted block, as a power of two.
pub const HEAT_BLOCK_SHIFT: u32 = 8;
/// Local IDs per counted block.
pub const HEAT_BLOCK_LIDS: u64 = 1 << HEAT_BLOCK_SHIFT;
/// Slots of the table (a power of two): blocks counted at once.
pub const HEAT_SLOTS: usize = 4_096;
/// Slots a request tries before it counts as untracked.
pub const PROBES: usize = 8;
/// Neighbouring blocks merge into one range if the busier has at most this many times
/// the requests of the other.
pub const MERGE_RATIO: f64 = 1.5;

/// Per-block request counters of one peer. See the module documentation.
#[derive(Debug)]
pub struct RangeHeat {
    /// Block key + 1 (`cid.raw() >> HEAT_BLOCK_SHIFT`, plus one), 0 for a free slot.
    keys: Box<[AtomicU64]>,
    /// Requests since the last roll, per slot.
    counts: Box<[AtomicU64]>,
    /// Requests that found no slot, since the start.
    untracked: AtomicU64,
}

impl Default for RangeHeat {
    fn default() -> Self {
        RangeHeat {
            keys: (0..HEAT_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            counts: (0..HEAT_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            untracked: AtomicU64::new(0),
        }
    }
}

fn block_key(cid: ChunkId) -> u64 {
    // A CID is creator (16 bits) and local ID (48 bits): shifting the whole keeps the
    // creator, and the key + 1 never overflows.
    (cid.raw() >> HEAT_BLOCK_SHIFT) + 1
}

fn home_slot(key: u64) -> usize {
    // Fibonacci hashing spreads consecutive blocks over the table.
    let bits = HEAT_SLOTS.trailing_zeros();
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
}

impl RangeHeat {
    /// Counts one request naming `cid`.
    pub fn record(&self, cid: ChunkId) {
        let key = block_key(cid);
        let home = home_slot(key);
        for probe in 0..PROBES {
            let slot = (home + probe) & (HEAT_SLOTS - 1);
            let mut held = self.keys[slot].load(Ordering::Relaxed);
            if held == 0 {
                held = match self.keys[slot].compare_exchange(
                    0,
                    key,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => key,
                    Err(other) => other,
                };
            }
            if held == key {
                self.counts[slot].fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.untracked.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests that found no slot since the start (the table was crowded).
    pub fn untracked(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }

    /// Reads and resets every count; the `max` hottest blocks of the interval of
    /// `seconds` that just ended, adjacent ones merged, hottest first. Frees the slots of
    /// blocks without a request.
    pub fn roll(&self, max: usize, seconds: f64) -> Vec<HotRange> {
        let mut blocks: HashMap<u64, u64> = HashMap::new();
        for (key, count) in self.keys.iter().zip(self.counts.iter()) {
            let requests = count.swap(0, Ordering::Relaxed);
            let held = key.load(Ordering::Relaxed);
            if held == 0 {
                continue;
            }
            if requests == 0 {
                key.store(0, Ordering::Relaxed);
                continue;
            }
            *blocks.entry(held).or_default() += requests;
        }
        let mut hottest: Vec<(u64, u64)> = blocks.into_iter().collect();
        hottest.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        hottest.truncate(max);
        // Merge neighbours of the same creator (the key's top bits are the creator's) and
        // a similar rate (within MERGE_RATIO of the previous block), so that a range's
        // requests are spread about evenly over its blocks.
        hottest.sort_unstable_by_key(|&(key, _)| key);
        let mut merged: Vec<(u64, u64, u64)> = Vec::with_capacity(hottest.len());
        let mut previous = 0u64;
        for (key, requests) in hottest {
            let similar =
                requests.min(previous) as f64 >= requests.max(previous) as f64 / MERGE_RATIO;
            match merged.last_mut() {
                Some((_, last, sum))
                    if *last + 1 == key
                        && similar
                        && (*last - 1) >> (48 - HEAT_BLOCK_SHIFT)
                            == (key - 1) >> (48 - HEAT_BLOCK_SHIFT) =>
                {
                    *last = key;
                    *sum += requests;
                }
                _ => merged.push((key, key, requests)),
            }
            previous = requests;
        }
        let seconds = seconds.max(1e-3);
        let mut ranges: Vec<HotRange> = merged
            .into_iter()
            .map(|(first, last, requests)| HotRange {
                first: ChunkId::from_raw((first - 1) << HEAT_BLOCK_SHIFT),
                last: ChunkId::from_raw(((last - 1) << HEAT_BLOCK_SHIFT) | (HEAT_BLOCK_LIDS - 1)),
                requests_per_sec: (requests as f64 / seconds).round() as u64,
            })
            .collect();
        ranges.sort_by_key(|range| std::cmp::Reverse(range.requests_per_sec));
        ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_types::NodeId;

    fn cid(creator: u16, lid: u64) -> ChunkId {
        ChunkId::new(NodeId(creator), lid).expect("a valid CID")
    }

    #[test]
    fn the_hottest_blocks_come_first_with_their_rates_and_neighbours_merge() {
        let heat = RangeHeat::default();
        // Blocks 2 and 3 of creator 2 (LIDs 512..1023): 600 requests; block 10: 50; one
        // request each on 20 cold blocks of creator 3.
        for i in 0..600 {
            heat.record(cid(2, 512 + i % 512));
        }
        for _ in 0..50 {
            heat.record(cid(2, 10 * HEAT_BLOCK_LIDS + 7));
        }
        // Its neighbour, far colder, stays a range of its own.
        for _ in 0..4 {
            heat.record(cid(2, 11 * HEAT_BLOCK_LIDS));
        }
        for block in 0..20 {
            heat.record(cid(3, block * HEAT_BLOCK_LIDS));
        }
        let ranges = heat.roll(5, 2.0);
        assert_eq!(ranges.len(), 4, "{ranges:?}");
        assert_eq!(ranges[0].first, cid(2, 512));
        assert_eq!(ranges[0].last, cid(2, 1023));
        assert_eq!(ranges[0].requests_per_sec, 300, "600 requests over 2 s");
        assert_eq!(ranges[1].first, cid(2, 10 * HEAT_BLOCK_LIDS));
        assert_eq!(ranges[1].last, cid(2, 11 * HEAT_BLOCK_LIDS - 1));
        assert_eq!(ranges[1].requests_per_sec, 25);
        assert_eq!(ranges[2].first, cid(2, 11 * HEAT_BLOCK_LIDS));
        assert_eq!(ranges[2].requests_per_sec, 2);
        assert_eq!(ranges[3].requests_per_sec, 1, "one of the cold blocks");
        assert_eq!(heat.untracked(), 0);
        // The counts were reset: an idle interval reports nothing, and frees the slots.
        assert!(heat.roll(4, 2.0).is_empty());
        assert!(heat.keys.iter().all(|key| key.load(Ordering::Relaxed) == 0));
    }

    #[test]
    fn blocks_of_two_creators_never_merge_and_a_crowded_table_counts_untracked() {
        let heat = RangeHeat::default();
        let top_of_two = ChunkId::from_raw((2u64 << 48) | ((1u64 << 48) - 1));
        heat.record(top_of_two);
        heat.record(cid(3, 0));
        let ranges = heat.roll(4, 1.0);
        assert_eq!(ranges.len(), 2, "{ranges:?}");
        for range in &ranges {
            assert_eq!(range.first.creator(), range.last.creator());
        }
        // Far more blocks than slots: every request is counted somewhere, tracked or not.
        let blocks = (HEAT_SLOTS * 2) as u64;
        for block in 0..blocks {
            heat.record(cid(4, block * HEAT_BLOCK_LIDS));
        }
        let tracked: u64 = heat.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        assert_eq!(tracked + heat.untracked(), blocks);
        assert!(heat.untracked() >= blocks - HEAT_SLOTS as u64);
    }
}
