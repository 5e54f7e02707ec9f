//! Unit tests small enough for Miri (`miri_` prefix: scripts/test-nightly runs them).
use super::*;

fn small() -> MemoryManager {
    MemoryManager::new(MemoryConfig {
        node_id: NodeId(3),
        region_bytes: 64 * alloc::PAGE_BYTES,
        shards: 2,
        lock_timeout: Duration::from_millis(200),
        ..MemoryConfig::default()
    })
    .unwrap()
}

#[test]
fn local_ids_start_at_the_given_first_one() {
    let memory = MemoryManager::new(MemoryConfig {
        node_id: NodeId(4),
        region_bytes: 1 << 20,
        ..MemoryConfig::default()
    })
    .unwrap();
    memory.start_local_ids_at(1000);
    memory.start_local_ids_at(10);
    let cid = memory.create(8).unwrap();
    assert_eq!(cid.local_id(), 1000);
    assert!(memory.local_id_mark() > 1000);
    let many = memory.create_batch(&[8, 8]).unwrap();
    assert!(many.iter().all(|cid| cid.local_id() > 1000));
}

#[test]
fn miri_create_with_ids_in_runs() {
    let memory = small();
    let cid = |lid: u64| ChunkId::new(NodeId(8), lid).unwrap();
    let taken = memory.create_with_ids(&[(cid(2), b"xy")]);
    assert_eq!(taken, vec![Ok(())]);
    let results = memory.create_with_ids(&[
        (cid(1), b"ab"),
        (cid(2), b"zz"),
        (cid(3), b"cd"),
        (cid(4), b"long one"),
    ]);
    assert_eq!(
        results,
        vec![Ok(()), Err(MemError::AlreadyExists(cid(2))), Ok(()), Ok(())]
    );
    assert_eq!(memory.get_vec(cid(1)).unwrap(), b"ab");
    assert_eq!(memory.get_vec(cid(2)).unwrap(), b"xy");
    assert_eq!(memory.get_vec(cid(3)).unwrap(), b"cd");
    assert_eq!(memory.get_vec(cid(4)).unwrap(), b"long one");
    memory.check_consistency().unwrap();
}

proptest::proptest! {
    /// Batches of any sizes, CIDs (repeats, neighbours across table levels, chunks
    /// stored before) and lengths (runs of one size, large chunks, invalid sizes)
    /// give the results and contents of one `create_with_id` per item; slabs partly
    /// freed before serve free-listed and bump slots alike.
    #[test]
    fn create_with_ids_equals_one_create_per_item(
        before in proptest::collection::vec((0u64..9000, 1usize..200), 0..60),
        remove_every in 1usize..5,
        batch in proptest::collection::vec(
            (0u64..9000, proptest::prop_oneof![
                6 => proptest::strategy::Just(24usize), 2 => 1usize..200, 1 => proptest::strategy::Just(0usize),
                1 => 2040usize..2100, 1 => proptest::strategy::Just(70_000usize),
            ], proptest::num::u8::ANY),
            0..400,
        ),
    ) {
        let cid = |lid: u64| ChunkId::new(NodeId(8), lid * 7 + 1).unwrap();
        let data = |lid: u64, len: usize, fill: u8| -> Vec<u8> {
            (0..len).map(|i| (i as u8) ^ fill ^ (lid as u8)).collect()
        };
        let roomy = || {
            MemoryManager::new(MemoryConfig {
                node_id: NodeId(3),
                region_bytes: 1024 * alloc::PAGE_BYTES,
                shards: 2,
                ..MemoryConfig::default()
            })
            .unwrap()
        };
        let batched = roomy();
        let reference = roomy();
        for (n, &(lid, len)) in before.iter().enumerate() {
            for memory in [&batched, &reference] {
                let _ = memory.create_with_id(cid(lid), &data(lid, len, 0));
                if n % remove_every == 0 {
                    let _ = memory.remove(cid(lid));
                }
            }
        }
        let payloads: Vec<(ChunkId, Vec<u8>)> = batch
            .iter()
            .map(|&(lid, len, fill)| (cid(lid), data(lid, len, fill)))
            .collect();
        let items: Vec<(ChunkId, &[u8])> =
            payloads.iter().map(|(c, d)| (*c, d.as_slice())).collect();
        let got = batched.create_with_ids(&items);
        let expected: Vec<MemResult<()>> = items
            .iter()
            .map(|&(c, d)| reference.create_with_id(c, d))
            .collect();
        proptest::prop_assert_eq!(&got, &expected);
        let mut failures = Vec::new();
        batched.create_with_ids_by(&items, |&(c, d)| (c, d), |i, e| failures.push((i, e)));
        let again: Vec<(usize, MemError)> = items
            .iter()
            .enumerate()
            .filter_map(|(i, &(c, d))| reference.create_with_id(c, d).err().map(|e| (i, e)))
            .collect();
        proptest::prop_assert_eq!(failures, again);
        for lid in 0..9000u64 {
            proptest::prop_assert_eq!(
                batched.get_vec(cid(lid)).ok(),
                reference.get_vec(cid(lid)).ok()
            );
        }
        batched.check_consistency().map_err(proptest::test_runner::TestCaseError::fail)?;
        proptest::prop_assert_eq!(batched.stats().chunks, reference.stats().chunks);
    }
}

#[test]
fn repeats_are_found_across_interleaved_runs() {
    let check = |cids: &[u64]| crate::create::no_repeats(cids.iter().copied());
    assert!(check(&[]));
    assert!(check(&[5, 6, 7, 1, 2, 3, 10, 11]));
    assert!(check(&[1, 2, 3, 50, 51, 4, 5, 52]), "runs that interleave");
    assert!(check(&[1, 3, 5, 2, 4, 6]), "overlapping runs, no repeat");
    assert!(!check(&[1, 3, 5, 2, 3]), "overlapping runs with a repeat");
    assert!(!check(&[5, 6, 5]));
    assert!(!check(&[7, 7]));
}

#[test]
fn miri_prefault_keeps_contents() {
    let memory = small();
    let a = memory.create_with_data(b"before").unwrap();
    let region = memory.stats().region_bytes;
    let populated = memory.prefault(region, Duration::ZERO).unwrap();
    // Under Miri (no mmap) nothing is populated; elsewhere the whole region is.
    assert!(populated == 0 || populated == region);
    assert_eq!(memory.get_vec(a).unwrap(), b"before");
    let b = memory.create(100).unwrap();
    assert_eq!(memory.get_vec(b).unwrap(), vec![0; 100]);
    memory.check_consistency().unwrap();
}

#[test]
fn miri_create_get_put_remove_reuse() {
    let memory = small();
    let a = memory.create_with_data(b"hello").unwrap();
    let b = memory.create(3000).unwrap();
    assert_eq!(a.creator(), NodeId(3));
    assert_eq!(memory.get_vec(a).unwrap(), b"hello");
    assert_eq!(memory.get_vec(b).unwrap(), vec![0; 3000]);
    memory.put(a, b"HELLO").unwrap();
    assert_eq!(memory.get_vec(a).unwrap(), b"HELLO");
    assert_eq!(
        memory.put(a, b"toolong"),
        Err(MemError::SizeMismatch {
            cid: a,
            size: 5,
            len: 7
        })
    );
    memory.write_at(b, 2998, b"xy").unwrap();
    let mut tail = [0u8; 2];
    memory.read_at(b, 2998, &mut tail).unwrap();
    assert_eq!(&tail, b"xy");
    assert!(matches!(
        memory.read_at(b, 2999, &mut tail),
        Err(MemError::OutOfBounds { .. })
    ));
    memory.remove(a).unwrap();
    assert_eq!(memory.get_vec(a), Err(MemError::Removed(a)));
    assert_eq!(memory.remove(a), Err(MemError::Removed(a)));
    let reused = memory.create(8).unwrap();
    assert_eq!(reused, a, "the removed local ID is reused");
    memory.check_consistency().unwrap();
}

#[test]
fn miri_resize_moves_and_keeps_prefix() {
    let memory = small();
    let cid = memory.create_with_data(&[7u8; 100]).unwrap();
    // Miri interprets every byte check; keep its sizes small.
    let sizes: &[usize] = if cfg!(miri) {
        &[101, 2048, 2049, 4000, 10, 2049, 1]
    } else {
        &[101, 2048, 2049, 70_000, 10, 2049, 1]
    };
    for &size in sizes {
        let before = memory.get_vec(cid).unwrap();
        memory.resize(cid, size).unwrap();
        let after = memory.get_vec(cid).unwrap();
        assert_eq!(after.len(), size);
        let keep = before.len().min(size);
        assert_eq!(after[..keep], before[..keep]);
        assert!(after[keep..].iter().all(|&byte| byte == 0));
        memory.check_consistency().unwrap();
    }
}

#[test]
fn miri_locks_pins_and_reservations() {
    let memory = small();
    let cid = memory.create(16).unwrap();
    memory.lock_write(cid, Duration::from_millis(10)).unwrap();
    assert_eq!(memory.try_lock_read(cid), Err(MemError::WouldBlock(cid)));
    assert_eq!(memory.get_vec(cid), Err(MemError::LockTimeout(cid)));
    memory.put_locked(cid, &[1; 16]).unwrap();
    memory.unlock_write(cid).unwrap();
    assert_eq!(memory.unlock_write(cid), Err(MemError::NotLocked(cid)));
    memory.lock_read(cid, Duration::from_millis(10)).unwrap();
    memory.try_lock_read(cid).unwrap();
    assert_eq!(memory.try_lock_write(cid), Err(MemError::WouldBlock(cid)));
    memory.unlock_read(cid).unwrap();
    memory.unlock_read(cid).unwrap();
    assert_eq!(memory.unlock_read(cid), Err(MemError::NotLocked(cid)));
    let pinned = memory.pin(cid).unwrap();
    assert_eq!(pinned.len, 16);
    assert_eq!(memory.remove(cid), Err(MemError::Pinned(cid)));
    assert_eq!(memory.resize(cid, 17), Err(MemError::Pinned(cid)));
    memory.unpin(cid).unwrap();
    assert_eq!(memory.unpin(cid), Err(MemError::NotPinned(cid)));
    let reserved = memory.reserve(3).unwrap();
    assert_eq!(
        memory.get_vec(reserved[0]),
        Err(MemError::Reserved(reserved[0]))
    );
    memory.create_reserved(reserved[1], 4).unwrap();
    assert_eq!(
        memory.create_reserved(reserved[1], 4),
        Err(MemError::NotReserved(reserved[1]))
    );
    assert_eq!(memory.size(reserved[1]), Ok(4));
    memory.check_consistency().unwrap();
}

#[test]
fn miri_bad_input_is_a_typed_error() {
    let memory = small();
    let foreign = ChunkId::new(NodeId(9), 1).unwrap();
    assert_eq!(memory.get_vec(foreign), Err(MemError::NotFound(foreign)));
    assert!(matches!(
        memory.create(0),
        Err(MemError::InvalidSize { .. })
    ));
    assert!(matches!(
        memory.create(usize::MAX),
        Err(MemError::InvalidSize { .. })
    ));
    assert!(memory.create(60 * alloc::PAGE_BYTES as usize).is_ok());
    assert!(matches!(
        memory.create(8 * alloc::PAGE_BYTES as usize),
        Err(MemError::OutOfMemory { .. })
    ));
    memory.create_with_id(foreign, b"moved here").unwrap();
    assert_eq!(
        memory.create_with_id(foreign, b"x"),
        Err(MemError::AlreadyExists(foreign))
    );
    assert_eq!(memory.get_vec(foreign).unwrap(), b"moved here");
    assert!(matches!(
        memory.create_reserved(foreign, 1),
        Err(MemError::ForeignChunk { .. })
    ));
    let mut small_buffer = [0u8; 2];
    assert!(matches!(
        memory.get(foreign, &mut small_buffer),
        Err(MemError::BufferTooSmall { .. })
    ));
    memory.check_consistency().unwrap();
}

/// The range walk reads the tables it passes through the same loads as every lookup:
/// chunks in two leaves of one creator and one of another, a range across all three.
#[test]
fn miri_chunks_in_a_range_across_leaves_and_creators() {
    let memory = small();
    let cids = [
        ChunkId::new(NodeId(3), 5).unwrap(),
        ChunkId::new(NodeId(3), 4095).unwrap(),
        ChunkId::new(NodeId(3), 4096).unwrap(),
        ChunkId::new(NodeId(4), 1).unwrap(),
    ];
    for cid in cids {
        memory
            .create_with_id(cid, &[cid.local_id() as u8; 8])
            .unwrap();
    }
    let mut seen = Vec::new();
    memory.for_each_chunk_in_range(cids[1], cids[3], |cid, bytes| {
        assert_eq!(bytes, [cid.local_id() as u8; 8]);
        seen.push(cid);
        true
    });
    assert_eq!(seen, cids[1..].to_vec());
}

#[test]
fn miri_batches() {
    let memory = small();
    let cids = memory.create_many(40, 24).unwrap();
    let items: Vec<(ChunkId, Vec<u8>)> = cids
        .iter()
        .map(|&cid| (cid, vec![cid.local_id() as u8; 24]))
        .collect();
    let borrowed: Vec<(ChunkId, &[u8])> = items
        .iter()
        .map(|(cid, data)| (*cid, data.as_slice()))
        .collect();
    assert!(memory.put_batch(&borrowed).iter().all(Result::is_ok));
    let mut query = cids.clone();
    query.push(ChunkId::new(NodeId(3), 999).unwrap());
    let mut out = Vec::new();
    let results = memory.get_batch(&query, &mut out);
    assert_eq!(results.len(), 41);
    assert!(results[40].is_err());
    for (index, cid) in cids.iter().enumerate() {
        assert_eq!(
            out[index * 24..index * 24 + 24],
            vec![cid.local_id() as u8; 24][..]
        );
    }
    assert_eq!(memory.chunk_ranges(NodeId(3)), vec![(cids[0], cids[39])]);
    assert_eq!(memory.remove_range(cids[10], cids[19]).unwrap(), 10);
    assert_eq!(memory.chunk_ranges(NodeId(3)).len(), 2);
    memory.check_consistency().unwrap();
}

#[test]
fn miri_typed_chunks() {
    let memory = small();
    let cid = memory.create_typed(&42u64).unwrap();
    assert_eq!(memory.get_typed::<u64>(cid), Ok(42));
    memory
        .put_typed(cid, &"now a longer string".to_string())
        .unwrap();
    assert_eq!(
        memory.get_typed::<String>(cid).unwrap(),
        "now a longer string"
    );
    assert!(matches!(
        memory.get_typed::<u64>(cid),
        Err(MemError::Decode { .. })
    ));
}

#[test]
fn a_moved_chunks_local_id_is_never_reused() {
    let memory = small();
    let moved = memory.create_with_data(b"moved away").unwrap();
    let kept = memory.create_with_data(b"kept").unwrap();
    memory.remove_moved(moved).unwrap();
    assert_eq!(memory.get_vec(moved), Err(MemError::Removed(moved)));
    let next = memory.create(4).unwrap();
    assert_ne!(next, moved, "a migrated chunk's ID was handed out again");
    assert_ne!(next, kept);
    // An ordinary remove still recycles its ID.
    memory.remove(kept).unwrap();
    assert_eq!(memory.create(4).unwrap(), kept);
    memory.check_consistency().unwrap();
}

/// Huge pages behind the top: a range gets huge pages once the allocator's top has
/// passed its end (not while chunks are still reaching into it), or when it is made
/// resident ahead of use (rounded up to whole huge pages); with huge pages off, never.
#[test]
fn huge_pages_follow_the_top_and_prefaulting() {
    const HUGE: u64 = region::HUGE_PAGE_BYTES;
    let memory = MemoryManager::new(MemoryConfig {
        node_id: NodeId(5),
        region_bytes: 64 << 20,
        shards: 1,
        ..MemoryConfig::default()
    })
    .unwrap();
    let region = memory.allocator.region();
    assert_eq!(region.huge_until(), 0);
    // On a huge-page boundary: its 2 MiB ranges are whole huge pages.
    assert_eq!(region.pointer(0) as usize % HUGE as usize, 0);
    // Chunks of 68 bytes until the top passes 4 MiB: the ranges below the top's range are
    // advised, and the one it is in only if the top got there fast (see the next test).
    let mut created = 0u64;
    while memory.allocator.top_bytes() <= 2 * HUGE {
        memory.create_batch(&[68; 1024]).unwrap();
        created += 1024;
        assert!(created < 1 << 20, "the top did not move");
        let top = memory.allocator.top_bytes();
        let below = top / HUGE * HUGE;
        let until = region.huge_until();
        assert!(
            until == below || until == below + HUGE,
            "top {top}, until {until}"
        );
    }
    assert!(region.huge_until() >= 2 * HUGE);
    // Prefaulting 9 MiB from the start advises up to 10 MiB.
    let made = memory.prefault(9 << 20, Duration::ZERO).unwrap();
    if made > 0 {
        assert_eq!(region.huge_until(), 5 * HUGE);
    }
    // Off: nothing is advised.
    let plain = MemoryManager::new(MemoryConfig {
        node_id: NodeId(6),
        region_bytes: 16 << 20,
        shards: 1,
        huge_pages: false,
        ..MemoryConfig::default()
    })
    .unwrap();
    plain.create_batch(&[1 << 20; 6]).unwrap();
    assert!(plain.allocator.top_bytes() > 2 * HUGE);
    assert_eq!(plain.allocator.region().huge_until(), 0);
}

/// The range the top is in gets huge pages only when the top reached it fast (within
/// `FAST_TOP_CROSSING` of reaching the range before); ranges it passed always do.
#[test]
fn the_tops_range_gets_huge_pages_only_when_growth_is_fast() {
    const HUGE: u64 = region::HUGE_PAGE_BYTES;
    let region = region::Region::new(64 << 20, true).unwrap();
    let t0 = std::time::Instant::now();
    let fast = region::FAST_TOP_CROSSING / 10;
    let slow = region::FAST_TOP_CROSSING * 2;
    region.top_rose_at(HUGE / 2, t0);
    assert_eq!(region.huge_until(), 0, "nothing passed yet");
    region.top_rose_at(HUGE + 1, t0);
    assert_eq!(region.huge_until(), HUGE, "the first range passed");
    region.top_rose_at(2 * HUGE + 1, t0 + fast);
    assert_eq!(region.huge_until(), 3 * HUGE, "fast: the top's range too");
    region.top_rose_at(2 * HUGE + HUGE / 2, t0 + slow);
    assert_eq!(region.huge_until(), 3 * HUGE, "same range: nothing new");
    region.top_rose_at(3 * HUGE + 1, t0 + 2 * slow);
    assert_eq!(
        region.huge_until(),
        3 * HUGE,
        "slow: only what the top passed"
    );
    region.top_rose_at(4 * HUGE + 1, t0 + 3 * slow);
    assert_eq!(region.huge_until(), 4 * HUGE);
    let plain = region::Region::new(64 << 20, false).unwrap();
    plain.top_rose_at(HUGE + 1, t0);
    plain.top_rose_at(2 * HUGE + 1, t0 + fast);
    assert_eq!(plain.huge_until(), 0, "huge pages off");
}
