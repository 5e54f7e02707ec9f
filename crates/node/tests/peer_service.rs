//! The peer's chunk service, in process: every op, the ownership view, lock holders, and
//! bad input answered with errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_mem::{MemoryConfig, MemoryManager};
use myriad_node::peer::ChunkService;
use myriad_proto::chunk::{ChunkReply, ChunkRequest, ItemError};
use myriad_types::{ChunkId, NodeId};

const ME: NodeId = NodeId(1);
const OTHER: NodeId = NodeId(2);
const CLIENT_A: NodeId = NodeId(7);
const CLIENT_B: NodeId = NodeId(8);

fn service() -> ChunkService {
    let mem = MemoryManager::new(MemoryConfig {
        node_id: ME,
        region_bytes: 64 << 20,
        chunk_bytes_max: 1 << 20,
        lock_timeout: Duration::from_millis(100),
        shards: 2,
        huge_pages: false,
        ..MemoryConfig::default()
    })
    .expect("memory manager");
    ChunkService::new(Arc::new(mem), ME)
}

fn create(service: &ChunkService, payloads: &[&'static [u8]]) -> Vec<ChunkId> {
    let reply = service.execute(
        CLIENT_A,
        ChunkRequest::CreateWithData {
            durability: 0,
            payloads: payloads.iter().map(|p| Bytes::from_static(p)).collect(),
        },
    );
    match reply {
        ChunkReply::Created(cids) => cids,
        other => panic!("create failed: {other:?}"),
    }
}

fn statuses(reply: ChunkReply) -> Vec<Result<(), ItemError>> {
    match reply {
        ChunkReply::Statuses(statuses) => statuses,
        other => panic!("expected statuses, got {other:?}"),
    }
}

fn data(reply: ChunkReply) -> Vec<Result<Bytes, ItemError>> {
    match reply {
        ChunkReply::Data(items) => items,
        other => panic!("expected data, got {other:?}"),
    }
}

fn get(service: &ChunkService, from: NodeId, cids: &[ChunkId]) -> Vec<Result<Bytes, ItemError>> {
    data(service.execute(
        from,
        ChunkRequest::Get {
            cids: cids.to_vec(),
        },
    ))
}

#[test]
fn every_op_works_on_owned_chunks() {
    let service = service();
    let cids = create(&service, &[b"alpha", b"beta"]);
    assert!(cids.iter().all(|cid| cid.creator() == ME));
    let zeroed = match service.execute(
        CLIENT_A,
        ChunkRequest::Create {
            durability: 0,
            sizes: vec![3, 4],
        },
    ) {
        ChunkReply::Created(cids) => cids,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        get(&service, CLIENT_A, &zeroed)[1],
        Ok(Bytes::from_static(&[0; 4]))
    );
    assert_eq!(
        get(&service, CLIENT_A, &cids),
        vec![
            Ok(Bytes::from_static(b"alpha")),
            Ok(Bytes::from_static(b"beta"))
        ]
    );
    let put = service.execute(
        CLIENT_A,
        ChunkRequest::Put {
            durability: 0,
            items: vec![
                (cids[0], Bytes::from_static(b"ALPHA")),
                (cids[1], Bytes::from_static(b"too long")),
            ],
        },
    );
    let put = statuses(put);
    assert_eq!(put[0], Ok(()));
    assert!(matches!(put[1], Err(ItemError::Invalid(_))), "{put:?}");
    let read = data(service.execute(
        CLIENT_A,
        ChunkRequest::ReadAt {
            cid: cids[0],
            offset: 1,
            len: 3,
        },
    ));
    assert_eq!(read, vec![Ok(Bytes::from_static(b"LPH"))]);
    let write = service.execute(
        CLIENT_A,
        ChunkRequest::WriteAt {
            durability: 0,
            cid: cids[0],
            offset: 4,
            data: Bytes::from_static(b"!"),
        },
    );
    assert_eq!(statuses(write), vec![Ok(())]);
    let resize = service.execute(
        CLIENT_A,
        ChunkRequest::Resize {
            durability: 0,
            cid: cids[0],
            size: 7,
        },
    );
    assert_eq!(statuses(resize), vec![Ok(())]);
    assert_eq!(
        get(&service, CLIENT_A, &cids[..1]),
        vec![Ok(Bytes::from_static(b"ALPH!\0\0"))]
    );
    match service.execute(CLIENT_A, ChunkRequest::Status { cids: cids.clone() }) {
        ChunkReply::Sizes(sizes) => assert_eq!(sizes, vec![Ok(7), Ok(4)]),
        other => panic!("{other:?}"),
    }
    match service.execute(
        CLIENT_A,
        ChunkRequest::List {
            creator: Some(ME),
            max: 10,
        },
    ) {
        ChunkReply::Ranges { ranges, truncated } => {
            assert!(!truncated);
            let listed: u64 = ranges.iter().map(|(a, b)| b.raw() - a.raw() + 1).sum();
            assert_eq!(listed, 4);
        }
        other => panic!("{other:?}"),
    }
    match service.execute(CLIENT_A, ChunkRequest::Stats) {
        ChunkReply::Stats(stats) => {
            assert_eq!(stats.chunks, 4);
            assert!(stats.free_bytes > 0 && stats.region_bytes == 64 << 20);
        }
        other => panic!("{other:?}"),
    }
    let removed = service.execute(
        CLIENT_A,
        ChunkRequest::Remove {
            durability: 0,
            cids: cids.clone(),
        },
    );
    assert_eq!(statuses(removed), vec![Ok(()), Ok(())]);
    assert_eq!(
        get(&service, CLIENT_A, &cids),
        vec![Err(ItemError::NotFound), Err(ItemError::NotFound)]
    );
}

#[test]
fn ownership_view_gives_not_owner_and_not_found() {
    let service = service();
    let cids = create(&service, &[b"one", b"two", b"three"]);
    let foreign = ChunkId::new(OTHER, 5).unwrap();
    let never_created = ChunkId::new(ME, 999_999).unwrap();
    assert_eq!(
        get(&service, CLIENT_A, &[foreign, never_created]),
        vec![Err(ItemError::NotOwner), Err(ItemError::NotFound)]
    );
    // The middle chunk migrates to OTHER.
    service.set_owner(ME, cids[1].local_id(), cids[1].local_id(), OTHER);
    assert_eq!(
        get(&service, CLIENT_A, &cids),
        vec![
            Ok(Bytes::from_static(b"one")),
            Err(ItemError::NotOwner),
            Ok(Bytes::from_static(b"three"))
        ]
    );
    // Insert stores a foreign chunk (no ownership check); it is served once owned.
    let insert = service.execute(
        CLIENT_A,
        ChunkRequest::Insert {
            durability: 0,
            items: vec![(foreign, Bytes::from_static(b"moved"))],
        },
    );
    assert_eq!(statuses(insert), vec![Ok(())]);
    assert_eq!(
        get(&service, CLIENT_A, &[foreign]),
        vec![Err(ItemError::NotOwner)]
    );
    service.set_owner(OTHER, 0, 10, ME);
    assert_eq!(
        get(&service, CLIENT_A, &[foreign]),
        vec![Ok(Bytes::from_static(b"moved"))]
    );
    // The wire path answers the same.
    let reply = ChunkReply::decode(
        service.serve(
            CLIENT_A,
            ChunkRequest::Get {
                cids: vec![cids[1], foreign],
            }
            .encode(),
        ),
    )
    .unwrap();
    assert_eq!(
        data(reply),
        vec![Err(ItemError::NotOwner), Ok(Bytes::from_static(b"moved"))]
    );
}

#[test]
fn locks_are_held_per_node_and_released_when_it_departs() {
    let service = service();
    let cid = create(&service, &[b"locked"])[0];
    let lock = |from, write, timeout_ms| {
        statuses(service.execute(
            from,
            ChunkRequest::Lock {
                cid,
                write,
                timeout_ms,
            },
        ))
        .remove(0)
    };
    assert_eq!(lock(CLIENT_A, true, 0), Ok(()));
    // The holder reads and writes under its lock; others wait and time out.
    assert_eq!(
        get(&service, CLIENT_A, &[cid]),
        vec![Ok(Bytes::from_static(b"locked"))]
    );
    let put = statuses(service.execute(
        CLIENT_A,
        ChunkRequest::Put {
            durability: 0,
            items: vec![(cid, Bytes::from_static(b"LOCKED"))],
        },
    ));
    assert_eq!(put, vec![Ok(())]);
    let started = Instant::now();
    assert_eq!(lock(CLIENT_B, false, 50), Err(ItemError::LockTimeout));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        get(&service, CLIENT_B, &[cid]),
        vec![Err(ItemError::LockTimeout)]
    );
    // B cannot release A's lock.
    let unlock_b = statuses(service.execute(CLIENT_B, ChunkRequest::Unlock { cid, write: true }));
    assert!(
        matches!(unlock_b[0], Err(ItemError::Invalid(_))),
        "{unlock_b:?}"
    );
    // A departs: its lock goes.
    assert_eq!(service.release_locks_of(CLIENT_A), 1);
    assert_eq!(
        get(&service, CLIENT_B, &[cid]),
        vec![Ok(Bytes::from_static(b"LOCKED"))]
    );
    // Read locks are shared and counted per node.
    assert_eq!(lock(CLIENT_A, false, 0), Ok(()));
    assert_eq!(lock(CLIENT_A, false, 0), Ok(()));
    assert_eq!(lock(CLIENT_B, false, 0), Ok(()));
    assert_eq!(lock(CLIENT_B, true, 0), Err(ItemError::LockTimeout));
    let unlock = statuses(service.execute(CLIENT_B, ChunkRequest::Unlock { cid, write: false }));
    assert_eq!(unlock, vec![Ok(())]);
    assert_eq!(service.release_locks_of(CLIENT_A), 2);
    assert_eq!(lock(CLIENT_B, true, 0), Ok(()));
    let unlock = statuses(service.execute(CLIENT_B, ChunkRequest::Unlock { cid, write: true }));
    assert_eq!(unlock, vec![Ok(())]);
    let again = statuses(service.execute(CLIENT_B, ChunkRequest::Unlock { cid, write: true }));
    assert!(matches!(again[0], Err(ItemError::Invalid(_))));
}

#[test]
fn bad_offsets_sizes_and_bytes_are_errors_not_panics() {
    let service = service();
    let cid = create(&service, &[b"0123456789"])[0];
    for (offset, len) in [(8, 3), (u64::MAX, 1), (10, 1), (0, 64 << 20)] {
        let read = data(service.execute(CLIENT_A, ChunkRequest::ReadAt { cid, offset, len }));
        assert!(
            matches!(read[0], Err(ItemError::Invalid(_))),
            "{offset} {len}: {read:?}"
        );
    }
    let write = statuses(service.execute(
        CLIENT_A,
        ChunkRequest::WriteAt {
            durability: 0,
            cid,
            offset: u64::MAX - 1,
            data: Bytes::from_static(b"xyz"),
        },
    ));
    assert!(matches!(write[0], Err(ItemError::Invalid(_))));
    let huge = statuses(service.execute(
        CLIENT_A,
        ChunkRequest::Resize {
            durability: 0,
            cid,
            size: u64::MAX,
        },
    ));
    assert_eq!(huge, vec![Err(ItemError::TooLarge)]);
    let zero = statuses(service.execute(
        CLIENT_A,
        ChunkRequest::Resize {
            durability: 0,
            cid,
            size: 0,
        },
    ));
    assert!(matches!(zero[0], Err(ItemError::Invalid(_))));
    for sizes in [vec![0], vec![u64::MAX], vec![1, 2 << 20]] {
        let reply = service.execute(
            CLIENT_A,
            ChunkRequest::Create {
                durability: 0,
                sizes,
            },
        );
        assert!(matches!(reply, ChunkReply::Failed(_)), "{reply:?}");
    }
    // Undecodable requests are answered Malformed.
    for bytes in [&[][..], &[0], &[3, 5, 1], &[99, 1, 2], &[4, 9, 0]] {
        let reply = ChunkReply::decode(service.serve(CLIENT_A, Bytes::copy_from_slice(bytes)));
        assert!(
            matches!(reply, Ok(ChunkReply::Malformed(_))),
            "{bytes:?}: {reply:?}"
        );
    }
    service.memory().check_consistency().unwrap();
}

/// A service whose node was declared failed answers NotOwner to everything, through
/// `execute` and through `serve` (the encoded path), and changes nothing.
#[test]
fn a_service_declared_failed_refuses_every_request() {
    let service = service();
    let cids = create(&service, &[b"one", b"two"]);
    service.declare_failed();
    assert!(service.is_declared_failed());
    assert_eq!(
        get(&service, CLIENT_A, &cids),
        vec![Err(ItemError::NotOwner), Err(ItemError::NotOwner)]
    );
    let put = ChunkRequest::Put {
        durability: 0,
        items: vec![(cids[0], Bytes::from_static(b"new"))],
    };
    assert_eq!(
        statuses(service.execute(CLIENT_A, put.clone())),
        vec![Err(ItemError::NotOwner)]
    );
    let encoded = ChunkReply::decode(service.serve(CLIENT_B, put.encode())).expect("decodes");
    assert_eq!(statuses(encoded), vec![Err(ItemError::NotOwner)]);
    let remove = ChunkRequest::Remove {
        durability: 0,
        cids: cids.clone(),
    };
    assert_eq!(
        statuses(service.execute(CLIENT_A, remove)),
        vec![Err(ItemError::NotOwner), Err(ItemError::NotOwner)]
    );
    let create = ChunkRequest::Create {
        sizes: vec![8],
        durability: 0,
    };
    assert!(matches!(
        service.execute(CLIENT_A, create),
        ChunkReply::Failed(ItemError::NotOwner)
    ));
    assert!(matches!(
        service.execute(CLIENT_A, ChunkRequest::Stats),
        ChunkReply::Failed(ItemError::NotOwner)
    ));
    // The memory is untouched: the old values are still there, unreachable.
    assert_eq!(
        service
            .memory()
            .read_with(cids[0], |bytes| bytes.to_vec())
            .expect("still in memory"),
        b"one".to_vec()
    );
}

/// A service whose lock waits last long enough for a test to move a chunk meanwhile.
fn migration_test_service() -> Arc<ChunkService> {
    let mem = MemoryManager::new(MemoryConfig {
        node_id: ME,
        region_bytes: 64 << 20,
        chunk_bytes_max: 1 << 20,
        lock_timeout: Duration::from_secs(10),
        shards: 2,
        huge_pages: false,
        ..MemoryConfig::default()
    })
    .expect("memory manager");
    Arc::new(ChunkService::new(Arc::new(mem), ME))
}

/// A put (or write-at) that waits on a chunk's write lock while a migration holds it (the migration
/// locks, copies, commits the new owner, unlocks, then drops its copy) must not be
/// acknowledged and then lost with the old copy: it either lands before the copy is taken
/// or is answered `NotOwner`, so that the client retries at the new owner.
#[test]
fn a_put_waiting_on_a_migrating_chunk_is_refused_not_lost() {
    let service = migration_test_service();
    let cids = create(&service, &[b"old", b"any", b"abc"]);
    for (index, guarded) in [(0, false), (1, true), (2, false)] {
        let cid = cids[index];
        let mem = Arc::clone(service.memory());
        // The migration takes the chunk's write lock first (with or without switching
        // inline serving off, as `migrate` does).
        let guard = guarded.then(|| service.migration_guard());
        mem.lock_write(cid, Duration::from_secs(1)).expect("locked");
        let putter = {
            let service = Arc::clone(&service);
            std::thread::spawn(move || {
                // The third chunk is changed with a write-at instead of a put.
                let request = if index == 2 {
                    ChunkRequest::WriteAt {
                        cid,
                        offset: 1,
                        data: Bytes::from_static(b"x"),
                        durability: 0,
                    }
                } else {
                    ChunkRequest::Put {
                        durability: 0,
                        items: vec![(cid, Bytes::from_static(b"new"))],
                    }
                };
                statuses(service.execute(CLIENT_A, request))
            })
        };
        // Let the put reach the lock and wait there.
        std::thread::sleep(Duration::from_millis(200));
        service.set_owner(ME, cid.local_id(), cid.local_id(), OTHER);
        mem.unlock_write(cid).expect("unlocked");
        drop(guard);
        let outcome = putter.join().expect("put thread");
        mem.remove(cid).expect("old copy dropped");
        assert_eq!(
            outcome,
            vec![Err(ItemError::NotOwner)],
            "a write acknowledged after the copy was taken is lost (chunk {index})"
        );
    }
}

/// Like the put above for a remove and a resize: waiting on the lock of a chunk that a
/// migration moves away, they are answered `NotOwner` (the client then removes or resizes
/// the chunk at its new owner) instead of "done" on the copy being dropped, or "not found"
/// when the drop came first.
#[test]
fn a_remove_or_resize_waiting_on_a_migrating_chunk_is_refused_not_lost() {
    let service = migration_test_service();
    let cids = create(&service, &[b"one", b"two", b"three", b"four"]);
    // (chunk, remove instead of resize, the migration drops its copy before unlocking)
    for (index, remove, drop_first) in [
        (0, true, false),
        (1, true, true),
        (2, false, false),
        (3, false, true),
    ] {
        let cid = cids[index];
        let mem = Arc::clone(service.memory());
        let guard = service.migration_guard();
        mem.lock_write(cid, Duration::from_secs(1)).expect("locked");
        let changer = {
            let service = Arc::clone(&service);
            std::thread::spawn(move || {
                let request = if remove {
                    ChunkRequest::Remove {
                        cids: vec![cid],
                        durability: 0,
                    }
                } else {
                    ChunkRequest::Resize {
                        cid,
                        size: 100,
                        durability: 0,
                    }
                };
                statuses(service.execute(CLIENT_A, request))
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        service.set_owner(ME, cid.local_id(), cid.local_id(), OTHER);
        if drop_first {
            // The copy is dropped right after the unlock, racing the waiting change.
            mem.unlock_write(cid).expect("unlocked");
            let _ = mem.remove(cid);
        } else {
            mem.unlock_write(cid).expect("unlocked");
        }
        drop(guard);
        let outcome = changer.join().expect("changer thread");
        let _ = mem.remove(cid);
        assert_eq!(
            outcome,
            vec![Err(ItemError::NotOwner)],
            "chunk {index}: remove {remove}, dropped first {drop_first}"
        );
    }
}

/// A restarted peer takes its earlier IDs back together with the ranges restorers took
/// over (`set_owners`: one step, later ranges win): its own chunks are served, the
/// restorers' ones answer `NotOwner` (never a false `NotFound`), and IDs nobody took are
/// its own again.
#[test]
fn several_ranges_are_set_in_order_in_one_step() {
    let service = service();
    let cids = create(&service, &[b"one", b"two", b"three"]);
    // Recovering: nobody owns the earlier IDs here.
    service.set_owner(ME, 0, 1_000, NodeId(0));
    assert_eq!(
        get(&service, CLIENT_A, &cids[..1]),
        vec![Err(ItemError::NotOwner)]
    );
    // Recovered: everything back to this peer, except the middle chunk, now at OTHER.
    let middle = cids[1].local_id();
    service.set_owners(ME, &[(0, 1_000, ME), (middle, middle, OTHER)]);
    assert_eq!(
        get(&service, CLIENT_A, &cids),
        vec![
            Ok(Bytes::from_static(b"one")),
            Err(ItemError::NotOwner),
            Ok(Bytes::from_static(b"three"))
        ]
    );
    let never_created = ChunkId::new(ME, 999).unwrap();
    assert_eq!(
        get(&service, CLIENT_A, &[never_created]),
        vec![Err(ItemError::NotFound)]
    );
    // An invalid range is skipped, the others still apply.
    service.set_owners(ME, &[(5, 1, OTHER), (middle, middle, ME)]);
    assert_eq!(
        get(&service, CLIENT_A, &cids[1..2]),
        vec![Ok(Bytes::from_static(b"two"))]
    );
}

/// `take_back_earlier_ids` gives a restarted peer its earlier IDs and the restorers' ranges
/// in one step: no request at any point sees the IDs back without the ranges (with the
/// test-only switch of the fixed bug, a request at the interleaving point in between
/// gets a false `NotFound`; the simulator's tests find that on their own).
#[test]
fn earlier_ids_come_back_with_the_restorers_ranges_in_one_step() {
    use myriad_backup_log::interleave;
    use std::sync::{Arc, Mutex};
    for buggy in [false, true] {
        let service = Arc::new(service());
        let cids = create(&service, &[b"one"]);
        let lid = cids[0].local_id();
        // A chunk of the earlier incarnation that a restorer (OTHER) took over.
        let elsewhere = ChunkId::new(ME, lid + 1).unwrap();
        service.set_owner(ME, 0, 1_000, NodeId(0));
        if buggy {
            service.reintroduce_ids_before_ranges_bug();
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (hook_service, hook_seen) = (Arc::clone(&service), Arc::clone(&seen));
        interleave::with_hook(
            move |_| {
                let reply = get(&hook_service, CLIENT_A, &[elsewhere]);
                hook_seen.lock().unwrap().push(reply);
            },
            || service.take_back_earlier_ids(1_001, &[(lid + 1, lid + 1, OTHER)]),
        );
        let seen = seen.lock().unwrap().clone();
        if buggy {
            assert_eq!(
                seen,
                vec![vec![Err(ItemError::NotFound)]],
                "the bug's window"
            );
        } else {
            assert!(seen.is_empty(), "no interleaving point inside the one step");
        }
        assert_eq!(
            get(&service, CLIENT_A, &[elsewhere]),
            vec![Err(ItemError::NotOwner)]
        );
        assert_eq!(
            get(&service, CLIENT_A, &cids),
            vec![Ok(Bytes::from_static(b"one"))]
        );
    }
}
