//! Model-based property test: random operation sequences run against the memory manager and
//! against a `HashMap` reference; every result and, at the end, every chunk must agree, and
//! the consistency walker must accept the allocator and table after every step.

use std::collections::{HashMap, HashSet};

use myriad_mem::{ChunkId, MemError, MemoryConfig, MemoryManager, NodeId};
use proptest::prelude::*;

const OWN: NodeId = NodeId(5);
const SPARE_MAX: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    CreateWithData(usize, u8),
    CreateMany(usize, usize),
    Get(usize),
    Put(usize, u8),
    WriteAt(usize, usize, u8),
    Resize(usize, usize),
    Remove(usize),
    Reserve(usize),
    CreateReserved(usize, usize),
    CreateWithId(u64, usize, u8),
    GetBatch(Vec<usize>),
    PutBatch(Vec<usize>, u8),
    RemoveRange(usize, usize),
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        8 => 1usize..200,
        2 => 2040usize..2060,
        1 => 2060usize..20_000,
        1 => 60_000usize..300_000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => size().prop_map(Op::Create),
        3 => (size(), any::<u8>()).prop_map(|(s, b)| Op::CreateWithData(s, b)),
        1 => (1usize..50, 1usize..100).prop_map(|(n, s)| Op::CreateMany(n, s)),
        5 => any::<usize>().prop_map(Op::Get),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Op::Put(i, b)),
        2 => (any::<usize>(), 0usize..3000, any::<u8>()).prop_map(|(i, o, b)| Op::WriteAt(i, o, b)),
        2 => (any::<usize>(), size()).prop_map(|(i, s)| Op::Resize(i, s)),
        4 => any::<usize>().prop_map(Op::Remove),
        1 => (1usize..5).prop_map(Op::Reserve),
        1 => (any::<usize>(), size()).prop_map(|(i, s)| Op::CreateReserved(i, s)),
        1 => (0u64..64, size(), any::<u8>()).prop_map(|(l, s, b)| Op::CreateWithId(l, s, b)),
        2 => prop::collection::vec(any::<usize>(), 1..80).prop_map(Op::GetBatch),
        1 => (prop::collection::vec(any::<usize>(), 1..40), any::<u8>()).prop_map(|(v, b)| Op::PutBatch(v, b)),
        1 => (any::<usize>(), 0usize..10).prop_map(|(i, n)| Op::RemoveRange(i, n)),
    ]
}

/// The reference: live chunks, reserved CIDs, removed CIDs, and the spare-ID stack.
#[derive(Default)]
struct Model {
    live: HashMap<ChunkId, Vec<u8>>,
    reserved: HashSet<ChunkId>,
    removed: HashSet<ChunkId>,
    spare: Vec<u64>,
    known: Vec<ChunkId>,
}

impl Model {
    fn pick(&self, index: usize) -> ChunkId {
        if self.known.is_empty() {
            ChunkId::new(OWN, 1 << 40).unwrap()
        } else {
            self.known[index % self.known.len()]
        }
    }

    fn expect_error(&self, cid: ChunkId) -> MemError {
        if self.reserved.contains(&cid) {
            MemError::Reserved(cid)
        } else if self.removed.contains(&cid) {
            MemError::Removed(cid)
        } else {
            MemError::NotFound(cid)
        }
    }

    /// Records a CID handed out for a new chunk or reservation; checks it is the reused
    /// spare ID when one is waiting, else a never-used own ID.
    fn take_new(&mut self, cid: ChunkId) -> Result<(), TestCaseError> {
        prop_assert_eq!(cid.creator(), OWN);
        match self.spare.pop() {
            Some(expected) => {
                prop_assert_eq!(cid.local_id(), expected, "spare local ID reused first")
            }
            None => prop_assert!(
                !self.known.contains(&cid),
                "fresh CID {} was used before",
                cid
            ),
        }
        self.removed.remove(&cid);
        if !self.known.contains(&cid) {
            self.known.push(cid);
        }
        Ok(())
    }

    fn on_remove(&mut self, cid: ChunkId) {
        self.live.remove(&cid);
        self.removed.insert(cid);
        if cid.creator() == OWN && self.spare.len() < SPARE_MAX {
            self.spare.push(cid.local_id());
        }
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let memory = MemoryManager::new(MemoryConfig {
        node_id: OWN,
        region_bytes: 96 * 64 * 1024,
        spare_local_ids_max: SPARE_MAX,
        shards: 1,
        ..MemoryConfig::default()
    })
    .unwrap();
    let mut model = Model::default();
    for op in ops {
        match op {
            Op::Create(size) => match memory.create(size) {
                Ok(cid) => {
                    model.take_new(cid)?;
                    model.live.insert(cid, vec![0; size]);
                }
                Err(error) => {
                    prop_assert!(matches!(error, MemError::OutOfMemory { .. }), "{error}")
                }
            },
            Op::CreateWithData(size, byte) => match memory.create_with_data(&vec![byte; size]) {
                Ok(cid) => {
                    model.take_new(cid)?;
                    model.live.insert(cid, vec![byte; size]);
                }
                Err(error) => {
                    prop_assert!(matches!(error, MemError::OutOfMemory { .. }), "{error}")
                }
            },
            Op::CreateMany(count, size) => match memory.create_many(count, size) {
                Ok(cids) => {
                    prop_assert_eq!(cids.len(), count);
                    for cid in cids {
                        model.take_new(cid)?;
                        model.live.insert(cid, vec![0; size]);
                    }
                }
                Err(error) => {
                    prop_assert!(matches!(error, MemError::OutOfMemory { .. }), "{error}")
                }
            },
            Op::Get(index) => {
                let cid = model.pick(index);
                match model.live.get(&cid) {
                    Some(data) => prop_assert_eq!(&memory.get_vec(cid).unwrap(), data),
                    None => prop_assert_eq!(memory.get_vec(cid), Err(model.expect_error(cid))),
                }
            }
            Op::Put(index, byte) => {
                let cid = model.pick(index);
                match model.live.get_mut(&cid) {
                    Some(data) => {
                        data.fill(byte);
                        memory.put(cid, data).unwrap();
                    }
                    None => prop_assert_eq!(memory.put(cid, &[byte]), Err(model.expect_error(cid))),
                }
            }
            Op::WriteAt(index, offset, byte) => {
                let cid = model.pick(index);
                let result = memory.write_at(cid, offset, &[byte; 3]);
                match model.live.get_mut(&cid) {
                    Some(data) if offset + 3 <= data.len() => {
                        prop_assert!(result.is_ok());
                        data[offset..offset + 3].fill(byte);
                    }
                    Some(_) => prop_assert!(
                        matches!(result, Err(MemError::OutOfBounds { .. })),
                        "{:?}",
                        result
                    ),
                    None => prop_assert_eq!(result, Err(model.expect_error(cid))),
                }
            }
            Op::Resize(index, size) => {
                let cid = model.pick(index);
                let result = memory.resize(cid, size);
                match model.live.get_mut(&cid) {
                    Some(data) => match result {
                        Ok(()) => data.resize(size, 0),
                        Err(error) => {
                            prop_assert!(matches!(error, MemError::OutOfMemory { .. }), "{error}")
                        }
                    },
                    None => prop_assert_eq!(result, Err(model.expect_error(cid))),
                }
            }
            Op::Remove(index) => {
                let cid = model.pick(index);
                let result = memory.remove(cid);
                if model.live.contains_key(&cid) {
                    prop_assert_eq!(result, Ok(()));
                    model.on_remove(cid);
                } else if model.reserved.contains(&cid) {
                    prop_assert_eq!(result, Err(MemError::Reserved(cid)));
                } else {
                    prop_assert_eq!(result, Err(model.expect_error(cid)));
                }
            }
            Op::Reserve(count) => {
                for cid in memory.reserve(count).unwrap() {
                    model.take_new(cid)?;
                    model.reserved.insert(cid);
                }
            }
            Op::CreateReserved(index, size) => {
                let cid = model.pick(index);
                let result = memory.create_reserved(cid, size);
                if cid.creator() != OWN {
                    prop_assert!(
                        matches!(result, Err(MemError::ForeignChunk { .. })),
                        "{:?}",
                        result
                    );
                } else if model.reserved.contains(&cid) {
                    match result {
                        Ok(()) => {
                            model.reserved.remove(&cid);
                            model.live.insert(cid, vec![0; size]);
                        }
                        Err(error) => {
                            prop_assert!(matches!(error, MemError::OutOfMemory { .. }), "{error}")
                        }
                    }
                } else {
                    prop_assert_eq!(result, Err(MemError::NotReserved(cid)));
                }
            }
            Op::CreateWithId(local_id, size, byte) => {
                let cid = ChunkId::new(NodeId(9), local_id).unwrap();
                let result = memory.create_with_id(cid, &vec![byte; size]);
                if model.live.contains_key(&cid) {
                    prop_assert_eq!(result, Err(MemError::AlreadyExists(cid)));
                } else {
                    match result {
                        Ok(()) => {
                            model.removed.remove(&cid);
                            model.live.insert(cid, vec![byte; size]);
                            if !model.known.contains(&cid) {
                                model.known.push(cid);
                            }
                        }
                        Err(error) => {
                            prop_assert!(matches!(error, MemError::OutOfMemory { .. }), "{error}")
                        }
                    }
                }
            }
            Op::GetBatch(indices) => {
                let cids: Vec<ChunkId> = indices.iter().map(|&i| model.pick(i)).collect();
                let mut seen = vec![false; cids.len()];
                memory.get_batch_with(&cids, |index, result| {
                    seen[index] = true;
                    let cid = cids[index];
                    match (model.live.get(&cid), result) {
                        (Some(data), Ok(bytes)) => assert_eq!(bytes, &data[..]),
                        (None, Err(error)) => assert_eq!(error, model.expect_error(cid)),
                        (expected, got) => {
                            panic!("batch get of {cid}: expected {expected:?}, got {got:?}")
                        }
                    }
                });
                prop_assert!(seen.iter().all(|&s| s));
            }
            Op::PutBatch(indices, byte) => {
                let mut cids: Vec<ChunkId> = indices.iter().map(|&i| model.pick(i)).collect();
                cids.sort();
                cids.dedup();
                let data: Vec<Vec<u8>> = cids
                    .iter()
                    .map(|cid| vec![byte; model.live.get(cid).map_or(1, Vec::len)])
                    .collect();
                let items: Vec<(ChunkId, &[u8])> = cids
                    .iter()
                    .copied()
                    .zip(data.iter().map(Vec::as_slice))
                    .collect();
                let results = memory.put_batch(&items);
                for (cid, result) in cids.iter().zip(results) {
                    match model.live.get_mut(cid) {
                        Some(stored) => {
                            prop_assert_eq!(result, Ok(()));
                            stored.fill(byte);
                        }
                        None => prop_assert_eq!(result, Err(model.expect_error(*cid))),
                    }
                }
            }
            Op::RemoveRange(index, count) => {
                let first = model.pick(index);
                let Some(last) = ChunkId::new(first.creator(), first.local_id() + count as u64)
                else {
                    continue;
                };
                let expected: Vec<ChunkId> = (first.raw()..=last.raw())
                    .map(ChunkId::from_raw)
                    .filter(|cid| model.live.contains_key(cid))
                    .collect();
                prop_assert_eq!(memory.remove_range(first, last), Ok(expected.len() as u64));
                for cid in expected {
                    model.on_remove(cid);
                }
            }
        }
        if let Err(message) = memory.check_consistency() {
            return Err(TestCaseError::fail(message));
        }
    }
    for (cid, data) in &model.live {
        prop_assert_eq!(&memory.get_vec(*cid).unwrap(), data);
    }
    let stats = memory.stats();
    prop_assert_eq!(stats.chunks, model.live.len() as u64);
    prop_assert_eq!(
        stats.payload_bytes,
        model.live.values().map(|d| d.len() as u64).sum::<u64>()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_match_a_hashmap_model(ops in prop::collection::vec(op(), 1..150)) {
        run(ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// `create_with_ids` (runs of one size allocated together) gives exactly the results,
    /// contents and free space of one `create_with_id` per item: duplicates within the
    /// batch, CIDs already present, removed ones, sizes 0 and too large, runs of small and
    /// large chunks.
    #[test]
    fn batched_creates_with_ids_equal_single_ones(
        present in prop::collection::vec(0u64..24, 0..8),
        removed in prop::collection::vec(0u64..24, 0..4),
        items in prop::collection::vec(
            (0u64..24, prop_oneof![4 => Just(64usize), 2 => 1usize..300, 1 => Just(0usize),
                                   1 => 70_000usize..80_000, 1 => Just(3 << 20)]),
            0..40,
        ),
    ) {
        let make = || {
            let memory = MemoryManager::new(MemoryConfig {
                node_id: OWN,
                region_bytes: 8 << 20,
                chunk_bytes_max: 2 << 20,
                ..MemoryConfig::default()
            })
            .unwrap();
            let cid = |lid: u64| ChunkId::new(NodeId(7), lid + 1).unwrap();
            for &lid in &present {
                let _ = memory.create_with_id(cid(lid), b"old");
            }
            for &lid in &removed {
                let _ = memory.create_with_id(cid(lid), b"gone");
                let _ = memory.remove(cid(lid));
            }
            memory
        };
        let cid = |lid: u64| ChunkId::new(NodeId(7), lid + 1).unwrap();
        let data: Vec<(ChunkId, Vec<u8>)> = items
            .iter()
            .enumerate()
            .map(|(i, &(lid, size))| (cid(lid), vec![i as u8; size]))
            .collect();
        let borrowed: Vec<(ChunkId, &[u8])> =
            data.iter().map(|(c, d)| (*c, d.as_slice())).collect();
        let batched = make();
        let single = make();
        let got = batched.create_with_ids(&borrowed);
        let want: Vec<Result<(), MemError>> = borrowed
            .iter()
            .map(|&(c, d)| single.create_with_id(c, d))
            .collect();
        prop_assert_eq!(got, want);
        for lid in 0..24 {
            prop_assert_eq!(
                batched.read_with(cid(lid), <[u8]>::to_vec),
                single.read_with(cid(lid), <[u8]>::to_vec)
            );
        }
        let (a, b) = (batched.stats(), single.stats());
        prop_assert_eq!(a.chunks, b.chunks);
        prop_assert_eq!(a.payload_bytes, b.payload_bytes);
        prop_assert_eq!(a.free_bytes, b.free_bytes);
        batched.check_consistency().unwrap();
    }
}

/// A local ID drawn near the interesting edges: leaf (4,096), level-1 (2^24) and level-2
/// (2^36) table boundaries, the last local ID, or anywhere.
fn edge_lid() -> impl Strategy<Value = u64> {
    let max = myriad_mem::LOCAL_ID_MAX;
    prop_oneof![
        4 => 0u64..10_000,
        1 => (1u64 << 24) - 50..(1u64 << 24) + 50,
        1 => (1u64 << 36) - 50..(1u64 << 36) + 50,
        1 => max - 50..=max,
        1 => 0u64..=max,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// `for_each_chunk_in_range` visits exactly the live chunks whose IDs lie in the range,
    /// in CID order, across creators, sparse tables and table boundaries, with removed
    /// chunks left out, and stops as soon as the visitor asks.
    #[test]
    fn chunks_in_a_range_are_exactly_the_live_ones_in_order(
        chunks in prop::collection::vec((1u16..4, edge_lid()), 0..60),
        removed in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
        bounds in ((0u16..5, edge_lid()), (0u16..5, edge_lid())),
        stop_after in prop_oneof![Just(usize::MAX), 0usize..10],
    ) {
        let memory = MemoryManager::new(MemoryConfig {
            node_id: OWN,
            region_bytes: 8 << 20,
            ..MemoryConfig::default()
        })
        .unwrap();
        let mut live = std::collections::BTreeSet::new();
        for &(creator, lid) in &chunks {
            let cid = ChunkId::new(NodeId(creator), lid).unwrap();
            if memory.create_with_id(cid, &cid.raw().to_le_bytes()).is_ok() {
                live.insert(cid.raw());
            }
        }
        let present: Vec<u64> = live.iter().copied().collect();
        for index in &removed {
            if present.is_empty() {
                break;
            }
            let raw = present[index.index(present.len())];
            if live.remove(&raw) {
                memory.remove(ChunkId::from_raw(raw)).unwrap();
            }
        }
        let ((c1, l1), (c2, l2)) = bounds;
        let first = ChunkId::new(NodeId(c1), l1).unwrap();
        let last = ChunkId::new(NodeId(c2), l2).unwrap();
        let want: Vec<u64> = live
            .iter()
            .copied()
            .filter(|&raw| first.raw() <= raw && raw <= last.raw())
            .take(stop_after.saturating_add(1))
            .collect();
        let mut got = Vec::new();
        memory.for_each_chunk_in_range(first, last, |cid, bytes| {
            assert_eq!(bytes, cid.raw().to_le_bytes());
            got.push(cid.raw());
            got.len() <= stop_after
        });
        prop_assert_eq!(got, want);
    }
}
