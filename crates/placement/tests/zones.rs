//! The zone tree against a model: random creates (with local-ID reuse and out-of-order
//! blocks, as several threads produce them), removes, resizes and foreign chunks.

use std::collections::HashMap;

use myriad_placement::{ZoneId, ZoneTree};
use myriad_types::{ChunkId, NodeId};
use proptest::prelude::*;

const MASTER: NodeId = NodeId(7);
const ZONE_BYTES: u64 = 1_000;

#[derive(Debug, Clone)]
enum Op {
    /// Create an own chunk of this size from "thread" 0 or 1.
    Create { thread: usize, size: u64 },
    /// Remove the n-th live chunk (modulo the live count).
    Remove(usize),
    /// Resize the n-th live chunk.
    Resize(usize, u64),
    /// A chunk of another creator arrives alone.
    Foreign { lid: u64, size: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..2, 1u64..300).prop_map(|(thread, size)| Op::Create { thread, size }),
        2 => any::<usize>().prop_map(Op::Remove),
        1 => (any::<usize>(), 1u64..300).prop_map(|(n, size)| Op::Resize(n, size)),
        1 => (0u64..50, 1u64..300).prop_map(|(lid, size)| Op::Foreign { lid, size }),
    ]
}

/// Hands out local IDs like the memory manager: blocks of 4 per thread, removed IDs reused.
struct LocalIds {
    next_block: u64,
    blocks: [(u64, u64); 2],
    spare: Vec<u64>,
}

impl LocalIds {
    fn take(&mut self, thread: usize) -> u64 {
        if let Some(lid) = self.spare.pop() {
            return lid;
        }
        let block = &mut self.blocks[thread];
        if block.0 == block.1 {
            *block = (self.next_block, self.next_block + 4);
            self.next_block += 4;
        }
        block.0 += 1;
        block.0 - 1
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn zones_are_stable_accounted_and_compact(ops in prop::collection::vec(op(), 1..200)) {
        let mut tree = ZoneTree::new(MASTER, ZONE_BYTES);
        let mut ids = LocalIds { next_block: 0, blocks: [(0, 0); 2], spare: Vec::new() };
        let mut live: Vec<(ChunkId, u64, ZoneId)> = Vec::new();
        let mut ever: HashMap<ChunkId, ZoneId> = HashMap::new();
        for op in ops {
            match op {
                Op::Create { thread, size } => {
                    let cid = ChunkId::new(MASTER, ids.take(thread)).unwrap();
                    let assignment = tree.assign(cid, size);
                    if let Some(&before) = ever.get(&cid) {
                        prop_assert_eq!(assignment.zone, before, "a reused CID returns to its zone");
                    }
                    ever.insert(cid, assignment.zone);
                    live.push((cid, size, assignment.zone));
                }
                Op::Remove(n) if !live.is_empty() => {
                    let (cid, size, zone) = live.swap_remove(n % live.len());
                    prop_assert_eq!(tree.remove(cid, size), Some(zone));
                    ids.spare.push(cid.local_id());
                }
                Op::Resize(n, new_size) if !live.is_empty() => {
                    let index = n % live.len();
                    let (cid, size, zone) = live[index];
                    prop_assert_eq!(tree.resize(cid, size, new_size), Some(zone));
                    live[index].1 = new_size;
                }
                Op::Foreign { lid, size } => {
                    let cid = ChunkId::new(NodeId(99), lid).unwrap();
                    if live.iter().all(|&(c, _, _)| c != cid) {
                        let zone = tree.assign(cid, size).zone;
                        if let Some(&before) = ever.get(&cid) {
                            prop_assert_eq!(zone, before);
                        }
                        ever.insert(cid, zone);
                        live.push((cid, size, zone));
                    }
                }
                _ => {}
            }
            prop_assert_eq!(tree.check(), Ok(()));
            // Every live chunk still maps to the zone it was given.
            for &(cid, _, zone) in &live {
                prop_assert_eq!(tree.zone_of(cid), Some(zone));
            }
            // Usage equals the model's sums.
            let mut expected: HashMap<ZoneId, (u64, u64)> = HashMap::new();
            for &(_, size, zone) in &live {
                let entry = expected.entry(zone).or_default();
                entry.0 += size;
                entry.1 += 1;
            }
            for (zone, usage) in tree.zones() {
                let (bytes, chunks) = expected.get(&zone).copied().unwrap_or_default();
                prop_assert_eq!((usage.payload_bytes, usage.chunks), (bytes, chunks));
            }
        }
        // Own chunks need no per-chunk metadata: a few ranges per zone, plus single foreign
        // CIDs.
        let zones = tree.zones().count();
        let foreign = ever.keys().filter(|cid| cid.creator() != MASTER).count();
        prop_assert!(tree.range_count() <= 2 * zones + foreign + 1,
            "{} ranges for {} zones", tree.range_count(), zones);
    }
}

#[test]
fn sequential_creates_fill_zones_up_to_the_target() {
    let mut tree = ZoneTree::new(MASTER, ZONE_BYTES);
    let mut opened = 0;
    for lid in 0..1_000u64 {
        let assignment = tree.assign(ChunkId::new(MASTER, lid).unwrap(), 64);
        opened += usize::from(assignment.opened);
    }
    // 64 000 bytes in zones of at most 1 000 bytes (15 chunks of 64 bytes each).
    assert_eq!(opened, 1_000usize.div_ceil(15));
    for (_, usage) in tree.zones() {
        assert!(usage.payload_bytes <= ZONE_BYTES);
    }
    assert_eq!(tree.range_count(), opened, "one range per zone");
}

#[test]
fn recovered_chunks_form_one_zone() {
    let mut tree = ZoneTree::new(MASTER, ZONE_BYTES);
    tree.assign(ChunkId::new(MASTER, 0).unwrap(), 10);
    let zone = tree.new_zone();
    let dead = NodeId(3);
    tree.add_range(
        ChunkId::new(dead, 0).unwrap(),
        ChunkId::new(dead, 9_999).unwrap(),
        zone,
    )
    .unwrap();
    assert_eq!(tree.zone_of(ChunkId::new(dead, 5_000).unwrap()), Some(zone));
    assert_eq!(tree.zone_of(ChunkId::new(dead, 10_000).unwrap()), None);
    assert!(tree
        .add_range(
            ChunkId::new(dead, 9_999).unwrap(),
            ChunkId::new(dead, 20_000).unwrap(),
            zone
        )
        .is_err());
    assert_eq!(tree.ranges_of(zone).len(), 1);
}

#[test]
fn a_restarted_master_numbers_its_zones_from_the_given_base() {
    let mut tree = ZoneTree::new(MASTER, ZONE_BYTES);
    tree.start_zones_at(40);
    let first = tree.assign(ChunkId::new(MASTER, 1 << 32).unwrap(), 600);
    assert_eq!(first.zone, ZoneId(40));
    assert!(first.opened);
    let second = tree.assign(ChunkId::new(MASTER, (1 << 32) + 1).unwrap(), 600);
    assert_eq!(second.zone, ZoneId(41));
    assert_eq!(tree.new_zone(), ZoneId(42));
}

/// A zone taken over whole is accounted as one `add_usage` per chunk would.
#[test]
fn bulk_usage_equals_one_add_per_chunk() {
    let mut one_by_one = ZoneTree::new(MASTER, ZONE_BYTES);
    let mut bulk = ZoneTree::new(MASTER, ZONE_BYTES);
    let (a, b) = (one_by_one.new_zone(), bulk.new_zone());
    one_by_one.add_usage(a, 700);
    for _ in 1..5 {
        one_by_one.add_usage(a, 0);
    }
    bulk.add_usage_many(b, 5, 700);
    assert_eq!(one_by_one.usage(a), bulk.usage(b));
    assert_eq!(
        bulk.usage(b).map(|u| (u.chunks, u.payload_bytes)),
        Some((5, 700))
    );
}
