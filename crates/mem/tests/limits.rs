//! Limits and hostile arguments: the largest chunks, exhausted memory, huge counts and
//! ranges. Each must work or fail with a typed error, quickly and without a panic.

use std::time::Instant;

use myriad_mem::{
    ChunkId, MemError, MemoryConfig, MemoryManager, NodeId, BATCH_COUNT_MAX, LOCAL_ID_MAX,
};

fn manager(region_bytes: u64) -> MemoryManager {
    MemoryManager::new(MemoryConfig {
        node_id: NodeId(2),
        region_bytes,
        ..MemoryConfig::default()
    })
    .unwrap()
}

#[test]
fn chunk_of_64_mib_round_trips_and_resizes() {
    let memory = manager(512 << 20);
    let size = 64 << 20;
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let cid = memory.create_with_data(&data).unwrap();
    assert_eq!(memory.size(cid), Ok(size));
    assert!(memory.get_vec(cid).unwrap() == data);
    memory.resize(cid, 80 << 20).unwrap();
    let grown = memory.get_vec(cid).unwrap();
    assert!(grown[..size] == data[..] && grown[size..].iter().all(|&b| b == 0));
    memory.resize(cid, 3).unwrap();
    assert_eq!(memory.get_vec(cid).unwrap(), data[..3]);
    memory.check_consistency().unwrap();
}

#[test]
fn exhausted_region_fails_typed_and_recovers_after_remove() {
    let memory = manager(8 << 20);
    let mut cids = Vec::new();
    let error = loop {
        match memory.create(1000) {
            Ok(cid) => cids.push(cid),
            Err(error) => break error,
        }
    };
    assert!(matches!(error, MemError::OutOfMemory { .. }), "{error}");
    assert!(
        cids.len() > 7000,
        "only {} chunks of 1000 bytes fit in 8 MiB",
        cids.len()
    );
    assert!(matches!(
        memory.create_many(10, 1000),
        Err(MemError::OutOfMemory { .. })
    ));
    memory.check_consistency().unwrap();
    for cid in cids.drain(..100) {
        memory.remove(cid).unwrap();
    }
    memory.create_many(10, 1000).unwrap();
    memory.check_consistency().unwrap();
}

#[test]
fn huge_counts_and_ranges_are_rejected_or_cheap() {
    let memory = manager(64 << 20);
    assert!(matches!(
        memory.reserve(usize::MAX),
        Err(MemError::BatchTooLarge { .. })
    ));
    assert!(matches!(
        memory.create_many(BATCH_COUNT_MAX + 1, 8),
        Err(MemError::BatchTooLarge { .. })
    ));
    let cids = memory.create_many(5000, 16).unwrap();
    let started = Instant::now();
    let whole = (
        ChunkId::new(NodeId(2), 0).unwrap(),
        ChunkId::new(NodeId(2), LOCAL_ID_MAX).unwrap(),
    );
    assert_eq!(memory.remove_range(whole.0, whole.1), Ok(5000));
    assert!(
        started.elapsed().as_secs() < 10,
        "range removal must walk tables, not IDs"
    );
    assert!(!memory.exists(cids[0]));
    assert!(matches!(
        memory.remove_range(whole.1, whole.0),
        Err(MemError::InvalidRange { .. })
    ));
    let other = ChunkId::new(NodeId(3), 0).unwrap();
    assert!(matches!(
        memory.remove_range(whole.0, other),
        Err(MemError::InvalidRange { .. })
    ));
    assert!(matches!(
        MemoryManager::new(MemoryConfig {
            region_bytes: 0,
            ..MemoryConfig::default()
        }),
        Err(MemError::InvalidConfig(_))
    ));
    assert!(matches!(
        MemoryManager::new(MemoryConfig {
            region_bytes: u64::MAX,
            ..MemoryConfig::default()
        }),
        Err(MemError::InvalidConfig(_))
    ));
}
