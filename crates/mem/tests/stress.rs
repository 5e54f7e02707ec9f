//! Multi-threaded stress: readers never see a torn value, locked read-modify-write loses no
//! update, and concurrent create/remove/resize churn leaves a consistent allocator. Bounded
//! by operation counts, not time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use myriad_mem::{ChunkId, MemError, MemoryConfig, MemoryManager, NodeId};
use rand::{rngs::SmallRng, Rng, SeedableRng};

fn manager() -> Arc<MemoryManager> {
    Arc::new(
        MemoryManager::new(MemoryConfig {
            node_id: NodeId(1),
            region_bytes: 256 << 20,
            lock_timeout: Duration::from_secs(30),
            ..MemoryConfig::default()
        })
        .unwrap(),
    )
}

/// Every value written is one byte repeated; a reader seeing two different bytes in one
/// chunk saw a torn write.
#[test]
fn concurrent_puts_and_gets_never_tear() {
    let memory = manager();
    let sizes = [16usize, 64, 1000, 5000];
    let cids: Vec<ChunkId> = (0..64)
        .map(|i| memory.create(sizes[i % sizes.len()]).unwrap())
        .collect();
    let cids = Arc::new(cids);
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|seed| {
            let (memory, cids, stop) = (memory.clone(), cids.clone(), stop.clone());
            thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed);
                let mut checked = 0u64;
                let mut buffer = vec![0u8; 5000];
                while !stop.load(Ordering::Relaxed) || checked < 1000 {
                    let cid = cids[rng.gen_range(0..cids.len())];
                    if rng.gen_bool(0.5) {
                        let len = memory.get(cid, &mut buffer).unwrap();
                        let first = buffer[0];
                        assert!(
                            buffer[..len].iter().all(|&b| b == first),
                            "torn read of {cid}"
                        );
                    } else {
                        let mut batch = [cid, cids[rng.gen_range(0..cids.len())]];
                        batch.sort();
                        memory.get_batch_with(&batch, |_, result| {
                            let bytes = result.unwrap();
                            assert!(bytes.iter().all(|&b| b == bytes[0]), "torn batch read");
                        });
                    }
                    checked += 1;
                }
                checked
            })
        })
        .collect();
    let writers: Vec<_> = (0..2)
        .map(|seed| {
            let (memory, cids) = (memory.clone(), cids.clone());
            thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(100 + seed);
                for round in 0..20_000u32 {
                    let cid = cids[rng.gen_range(0..cids.len())];
                    let size = memory.size(cid).unwrap();
                    let value = vec![(round % 251) as u8; size];
                    if round % 2 == 0 {
                        memory.put(cid, &value).unwrap();
                    } else {
                        assert!(memory.put_batch(&[(cid, &value)])[0].is_ok());
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.join().unwrap() >= 1000);
    }
    memory.check_consistency().unwrap();
}

/// Read-modify-write under the chunk's write lock, from several threads: the final counter
/// equals the number of increments.
#[test]
fn locked_increments_lose_no_update() {
    let memory = manager();
    let cids: Vec<ChunkId> = (0..8)
        .map(|_| memory.create_typed(&0u64).unwrap())
        .collect();
    let threads = 4;
    let rounds = 5_000;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (memory, cids) = (memory.clone(), cids.clone());
            thread::spawn(move || {
                for round in 0..rounds {
                    let cid = cids[(round + t) % cids.len()];
                    if round % 2 == 0 {
                        memory.lock_write(cid, Duration::from_secs(30)).unwrap();
                        let mut bytes = [0u8; 8];
                        memory.get_locked(cid, &mut bytes).unwrap();
                        let next = u64::from_le_bytes(bytes) + 1;
                        memory.put_locked(cid, &next.to_le_bytes()).unwrap();
                        memory.unlock_write(cid).unwrap();
                    } else {
                        memory
                            .write_with(cid, |bytes| {
                                let next = u64::from_le_bytes(bytes.try_into().unwrap()) + 1;
                                bytes.copy_from_slice(&next.to_le_bytes());
                            })
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let total: u64 = cids
        .iter()
        .map(|&cid| memory.get_typed::<u64>(cid).unwrap())
        .sum();
    assert_eq!(total, (threads * rounds) as u64);
}

/// Threads create, resize and remove their own chunks while others read a shared set; no
/// CID is handed out twice, every chunk keeps its contents, and the walker passes.
#[test]
fn create_remove_resize_churn_stays_consistent() {
    let memory = manager();
    let shared: Arc<Vec<ChunkId>> = Arc::new(
        (0..32u8)
            .map(|i| memory.create_with_data(&[i; 40]).unwrap())
            .collect(),
    );
    let handles: Vec<_> = (0..3u64)
        .map(|seed| {
            let (memory, shared) = (memory.clone(), shared.clone());
            thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed);
                let mut mine: Vec<(ChunkId, u8, usize)> = Vec::new();
                for step in 0..20_000u32 {
                    match rng.gen_range(0..10) {
                        0..=3 => {
                            let size = [8, 33, 200, 2100, 9000, 70_000][rng.gen_range(0..6)];
                            let tag = (step % 250) as u8 + 1;
                            let cid = if rng.gen_bool(0.5) {
                                memory.create_with_data(&vec![tag; size]).unwrap()
                            } else {
                                let cids = memory.create_many(3, size).unwrap();
                                for &cid in &cids[1..] {
                                    memory.remove(cid).unwrap();
                                }
                                memory.put(cids[0], &vec![tag; size]).unwrap();
                                cids[0]
                            };
                            mine.push((cid, tag, size));
                        }
                        4..=5 if !mine.is_empty() => {
                            let (cid, tag, size) = mine.swap_remove(rng.gen_range(0..mine.len()));
                            assert_eq!(memory.get_vec(cid).unwrap(), vec![tag; size]);
                            memory.remove(cid).unwrap();
                        }
                        6 if !mine.is_empty() => {
                            let index = rng.gen_range(0..mine.len());
                            let (cid, tag, size) = mine[index];
                            let new_size = [1, 40, 2048, 2049, 30_000][rng.gen_range(0..5)];
                            memory.resize(cid, new_size).unwrap();
                            memory.write_with(cid, |bytes| bytes.fill(tag)).unwrap();
                            mine[index].2 = new_size;
                            let _ = size;
                        }
                        _ => {
                            let index = rng.gen_range(0..shared.len());
                            assert_eq!(
                                memory.get_vec(shared[index]).unwrap(),
                                vec![index as u8; 40]
                            );
                        }
                    }
                }
                mine
            })
        })
        .collect();
    let mut all = std::collections::HashSet::new();
    for handle in handles {
        for (cid, tag, size) in handle.join().unwrap() {
            assert!(all.insert(cid), "CID {cid} handed out twice");
            assert_eq!(memory.get_vec(cid).unwrap(), vec![tag; size]);
        }
    }
    memory.check_consistency().unwrap();
    assert_eq!(memory.stats().chunks, (all.len() + shared.len()) as u64);
    // After removing everything and trimming, free pages coalesce into one block.
    for cid in all.into_iter().chain(shared.iter().copied()) {
        memory.remove(cid).unwrap();
    }
    memory.trim();
    memory.check_consistency().unwrap();
    let stats = memory.stats();
    assert_eq!(stats.chunks, 0);
    assert_eq!(stats.fragmentation, 0.0);
    assert_eq!(stats.largest_free_bytes, stats.region_bytes);
    assert!(matches!(
        memory.get_vec(ChunkId::new(NodeId(1), 0).unwrap()),
        Err(MemError::Removed(_))
    ));
}

/// Batched gets and puts from several threads over a few hot chunks, with CIDs repeated
/// inside one batch: a batch that waited for a lock while holding others would deadlock
/// until the (short) lock timeout and report `LockTimeout`. Every batch must succeed, and
/// a CID put twice in one batch must end with the later value.
#[test]
fn overlapping_batches_with_repeated_cids_never_deadlock() {
    let memory = Arc::new(
        MemoryManager::new(MemoryConfig {
            node_id: NodeId(1),
            region_bytes: 64 << 20,
            lock_timeout: Duration::from_millis(500),
            ..MemoryConfig::default()
        })
        .unwrap(),
    );
    let cids: Arc<Vec<ChunkId>> = Arc::new((0..8).map(|_| memory.create(32).unwrap()).collect());
    let workers: Vec<_> = (0..3u64)
        .map(|seed| {
            let (memory, cids) = (memory.clone(), cids.clone());
            thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed);
                for round in 0..3_000u32 {
                    let batch: Vec<ChunkId> = (0..48)
                        .map(|_| cids[rng.gen_range(0..cids.len())])
                        .collect();
                    if round % 2 == 0 {
                        let mut out = Vec::new();
                        for result in memory.get_batch(&batch, &mut out) {
                            assert_eq!(result, Ok(32), "batched get failed");
                        }
                    } else {
                        let values: Vec<[u8; 32]> =
                            (0..batch.len()).map(|i| [i as u8; 32]).collect();
                        let items: Vec<(ChunkId, &[u8])> = batch
                            .iter()
                            .zip(&values)
                            .map(|(&cid, value)| (cid, &value[..]))
                            .collect();
                        for result in memory.put_batch(&items) {
                            assert_eq!(result, Ok(()), "batched put failed");
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker panicked");
    }
    // Single-threaded: the last occurrence of a CID in a batch wins.
    let batch = [cids[0], cids[1], cids[0]];
    let values = [[1u8; 32], [2u8; 32], [3u8; 32]];
    let items: Vec<(ChunkId, &[u8])> = batch
        .iter()
        .zip(&values)
        .map(|(&cid, value)| (cid, &value[..]))
        .collect();
    assert!(memory.put_batch(&items).iter().all(Result::is_ok));
    assert_eq!(memory.get_vec(cids[0]).unwrap(), vec![3u8; 32]);
}

/// Making the region resident while other threads create, write and remove chunks in it
/// changes no byte: every chunk reads back as written, before and after, and the
/// allocator stays consistent. Reports how much was made resident (0 only where the
/// kernel lacks `MADV_POPULATE_WRITE`).
#[test]
fn prefault_while_in_use_changes_nothing() {
    let memory = manager();
    let early: Vec<(ChunkId, Vec<u8>)> = (0..2_000u32)
        .map(|i| {
            let data: Vec<u8> = (0..(16 + i % 200)).map(|b| (b as u8) ^ (i as u8)).collect();
            (memory.create_with_data(&data).unwrap(), data)
        })
        .collect();
    let writer = {
        let memory = memory.clone();
        thread::spawn(move || {
            let mut mine = Vec::new();
            for i in 0..20_000u32 {
                let data = vec![(i % 251) as u8; 16 + (i % 300) as usize];
                let cid = memory.create_with_data(&data).unwrap();
                if i % 3 == 0 {
                    memory.remove(cid).unwrap();
                } else {
                    mine.push((cid, data));
                }
            }
            mine
        })
    };
    let region = memory.stats().region_bytes;
    let populated = memory.prefault(region, Duration::from_micros(50)).unwrap();
    assert!(
        populated == 0 || populated == region,
        "populated {populated} of {region}"
    );
    let later = writer.join().unwrap();
    for (cid, data) in early.iter().chain(&later) {
        let got = memory.read_with(*cid, <[u8]>::to_vec).unwrap();
        assert_eq!(&got, data, "{cid}");
    }
    memory.check_consistency().unwrap();
    // Beyond the region: clamped, not an error.
    assert!(memory.prefault(u64::MAX, Duration::ZERO).unwrap() <= region);
}

/// A reserve kept resident above the allocator's top: a call makes only what earlier
/// calls did not, follows the top up as chunks are created and comes back down with it
/// when they are removed; calls while other threads create change no byte.
#[test]
fn a_reserve_is_kept_resident_above_the_top() {
    let memory = manager();
    let reserve = 4u64 << 20;
    let first = memory
        .keep_resident_ahead(reserve, u64::MAX, Duration::ZERO)
        .unwrap();
    if first == 0 {
        return; // the kernel cannot populate without writing (before Linux 5.14)
    }
    assert_eq!(first, reserve);
    assert_eq!(
        memory
            .keep_resident_ahead(reserve, u64::MAX, Duration::ZERO)
            .unwrap(),
        0
    );
    // A budget stops a call early; the next ones go on from there until it is full.
    let half = 2u64 << 20;
    let budgeted = manager();
    assert_eq!(
        budgeted
            .keep_resident_ahead(reserve, half, Duration::ZERO)
            .unwrap(),
        half
    );
    assert_eq!(
        budgeted
            .keep_resident_ahead(reserve, half, Duration::ZERO)
            .unwrap(),
        half
    );
    assert_eq!(
        budgeted
            .keep_resident_ahead(reserve, half, Duration::ZERO)
            .unwrap(),
        0
    );
    // 256 chunks of 1 KiB use a sixteenth of the reserve: more than half is left, so
    // nothing is added yet.
    let before = memory.top_bytes();
    let mut cids: Vec<ChunkId> = (0..256)
        .map(|i| memory.create_with_data(&[i as u8; 1024]).unwrap())
        .collect();
    assert!(memory.top_bytes() > before);
    assert_eq!(
        memory
            .keep_resident_ahead(reserve, u64::MAX, Duration::ZERO)
            .unwrap(),
        0
    );
    // 2,816 more move the top up by 3 MiB in all: less than half is left, and the
    // reserve is made full again (as much as the top moved).
    cids.extend((0..2_816).map(|i| memory.create_with_data(&[i as u8; 1024]).unwrap()));
    let moved = memory.top_bytes() - before;
    assert!(moved >= 3 << 20, "{moved}");
    assert_eq!(
        memory
            .keep_resident_ahead(reserve, u64::MAX, Duration::ZERO)
            .unwrap(),
        moved
    );
    // Removing them all brings the top down; the reserve is made again from there.
    for cid in &cids {
        memory.remove(*cid).unwrap();
    }
    memory.trim();
    let top = memory.top_bytes();
    assert!(top < before + moved, "the top stayed at {top}");
    assert_eq!(
        memory
            .keep_resident_ahead(reserve, u64::MAX, Duration::ZERO)
            .unwrap(),
        reserve
    );
    // Kept up while another thread creates: every chunk reads back as written.
    let written = thread::scope(|scope| {
        let filler = scope.spawn(|| {
            (0..20_000u32)
                .map(|i| {
                    let data = vec![(i % 251) as u8; 64 + (i % 64) as usize];
                    (memory.create_with_data(&data).unwrap(), data)
                })
                .collect::<Vec<_>>()
        });
        for _ in 0..20 {
            memory
                .keep_resident_ahead(reserve, u64::MAX, Duration::ZERO)
                .unwrap();
        }
        filler.join().unwrap()
    });
    for (cid, data) in &written {
        assert_eq!(&memory.get_vec(*cid).unwrap(), data, "{cid}");
    }
    memory.check_consistency().unwrap();
}

/// A range walk reports the chunks it could not lock in time instead of leaving them out
/// silently (re-replication reads them again); removed chunks are skipped.
#[test]
fn range_walks_report_locked_chunks() {
    let memory = MemoryManager::new(MemoryConfig {
        node_id: NodeId(1),
        region_bytes: 64 << 20,
        lock_timeout: Duration::from_millis(20),
        ..MemoryConfig::default()
    })
    .unwrap();
    let cids: Vec<ChunkId> = (0..10).map(|_| memory.create(8).unwrap()).collect();
    memory.lock_write(cids[4], Duration::from_secs(1)).unwrap();
    memory.remove(cids[6]).unwrap();
    let mut seen = Vec::new();
    let busy = memory.for_each_chunk_in_range(cids[0], cids[9], |cid, _| {
        seen.push(cid);
        true
    });
    assert_eq!(busy, vec![cids[4]]);
    let expected: Vec<ChunkId> = cids
        .iter()
        .copied()
        .filter(|&cid| cid != cids[4] && cid != cids[6])
        .collect();
    assert_eq!(seen, expected);
    memory.unlock_write(cids[4]).unwrap();
    let busy = memory.for_each_chunk_in_range(cids[4], cids[4], |cid, _| {
        assert_eq!(cid, cids[4]);
        true
    });
    assert!(busy.is_empty());
}
