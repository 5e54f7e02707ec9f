//! The client's chunk API against real peers: a test cluster (a superpeer and peers
//! started as in production, on 127.0.0.1) and a client routing with a test directory
//! (a fixed ownership table, dead nodes, a lookup counter) over a joined client's endpoint.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::chunk::{ChunkOptions, Chunks};
use myriad_client::directory::Directory;
use myriad_client::ClientError;
use myriad_meta::{LookupRange, LookupTree};
use myriad_net::NetHandle;
use myriad_testing::cluster::TestCluster;
use myriad_types::{ChunkId, NodeId};
use parking_lot::Mutex;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};

/// A fixed table: ownership exceptions per creator, dead nodes, a lookup counter.
#[derive(Default)]
struct TestDirectory {
    me: NodeId,
    trees: Mutex<HashMap<NodeId, LookupTree>>,
    dead: Mutex<HashSet<NodeId>>,
    lookups: AtomicUsize,
}

impl TestDirectory {
    fn new(me: NodeId) -> Arc<TestDirectory> {
        Arc::new(TestDirectory {
            me,
            ..TestDirectory::default()
        })
    }

    fn set_owner(&self, creator: NodeId, first: u64, last: u64, owner: NodeId) {
        self.trees
            .lock()
            .entry(creator)
            .or_default()
            .set_owner(creator, first, last, owner);
    }
}

impl Directory for TestDirectory {
    fn local_node(&self) -> NodeId {
        self.me
    }

    async fn lookup(&self, cid: ChunkId) -> Result<LookupRange, ClientError> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let creator = cid.creator();
        Ok(self
            .trees
            .lock()
            .get(&creator)
            .cloned()
            .unwrap_or_default()
            .lookup(creator, cid.local_id()))
    }

    fn is_alive(&self, node: NodeId) -> bool {
        !self.dead.lock().contains(&node)
    }
}

struct Cluster {
    client: Chunks<TestDirectory>,
    directory: Arc<TestDirectory>,
    /// The client's node ID and messaging handle.
    client_id: NodeId,
    net: NetHandle,
    /// The peers' node IDs, in start order.
    ids: Vec<NodeId>,
    // Dropped last: the client's handle needs its endpoint.
    inner: TestCluster,
}

/// A superpeer, `peer_count` peers (32 MiB each) and a client endpoint joined through the
/// superpeer, routing with a [`TestDirectory`] of its own.
fn cluster(peer_count: usize, options: ChunkOptions) -> Cluster {
    let inner = TestCluster::builder()
        .peers(peer_count)
        .memory_bytes(32 << 20)
        .start();
    let joined = inner.client();
    let net = joined.membership().net().clone();
    let client_id = joined.node_id();
    let directory = TestDirectory::new(client_id);
    let client = Chunks::new(net.clone(), directory.clone(), options);
    Cluster {
        client,
        directory,
        client_id,
        net,
        ids: inner.peer_ids(),
        inner,
    }
}

fn bytes(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

#[test]
fn batches_across_three_peers_come_back_in_caller_order() {
    let cluster = cluster(3, ChunkOptions::default());
    let api = cluster.client.blocking();
    let mut cids = Vec::new();
    for &peer in &cluster.ids {
        let payloads = (0..4).map(|i| bytes(&format!("p{}-{i}", peer.0))).collect();
        let created = api.create_with_data(peer, payloads).unwrap();
        assert!(created.iter().all(|cid| cid.creator() == peer));
        cids.extend(created);
    }
    // Interleave owners: 1, 2, 3, 1, 2, 3, ...
    let order: Vec<ChunkId> = (0..4)
        .flat_map(|i| (0..3).map(move |peer| peer * 4 + i))
        .map(|index| cids[index])
        .collect();
    let lanes_before: Vec<u64> = cluster
        .ids
        .iter()
        .map(|&peer| cluster.net.lane_stats(peer).outgoing_opened_total)
        .collect();
    let got = api.get_batch(&order);
    for (cid, result) in order.iter().zip(&got) {
        let expected = format!("p{}-{}", cid.creator().0, cid.local_id());
        assert_eq!(result.as_ref().unwrap(), &bytes(&expected), "{cid}");
    }
    // The blocking batch went out on this thread over direct lanes, one per owner (a lane
    // opened to every peer, or one already open reused: none is left in use).
    for (&peer, before) in cluster.ids.iter().zip(lanes_before) {
        let lanes = cluster.net.lane_stats(peer);
        assert!(
            lanes.outgoing_opened_total > before || lanes.outgoing_open > 0,
            "no lane to {peer}: {lanes:?}"
        );
        assert_eq!(
            lanes.outgoing_idle, lanes.outgoing_open,
            "{peer}: {lanes:?}"
        );
    }
    let puts: Vec<(ChunkId, Bytes)> = order
        .iter()
        .map(|&cid| {
            (
                cid,
                bytes(&format!("P{}-{}", cid.creator().0, cid.local_id())),
            )
        })
        .collect();
    assert!(api.put_batch(&puts).iter().all(Result::is_ok));
    assert_eq!(api.get(order[4]).unwrap(), puts[4].1);
    // Single ops, offsets, sizes, listing and stats through the client.
    let cid = order[0];
    api.write_at(cid, 1, bytes("X")).unwrap();
    assert_eq!(api.read_at(cid, 0, 2).unwrap(), bytes("PX"));
    api.resize(cid, 10).unwrap();
    assert_eq!(api.status(cid).unwrap(), 10);
    assert!(matches!(
        api.read_at(cid, 9, 5),
        Err(ClientError::InvalidArgument(_))
    ));
    let two = cluster.ids[1];
    let zeroed = api.create_batch(two, &[5, 6]).unwrap();
    assert_eq!(api.get(zeroed[1]).unwrap(), Bytes::from_static(&[0; 6]));
    let (ranges, truncated) = api.list(two, Some(two), 100).unwrap();
    assert!(!truncated);
    let listed: u64 = ranges.iter().map(|(a, b)| b.raw() - a.raw() + 1).sum();
    assert_eq!(listed, 6);
    assert_eq!(api.stats(two).unwrap().chunks, 6);
    // Remove a batch across owners; a second remove and gets say NotFound, in order.
    let removed = api.remove_batch(&order[..6]);
    assert!(removed.iter().all(Result::is_ok), "{removed:?}");
    let again = api.get_batch(&order[..7]);
    for (index, result) in again.iter().enumerate() {
        match index {
            6 => assert!(result.is_ok()),
            _ => assert!(matches!(result, Err(ClientError::NotFound(cid)) if *cid == order[index])),
        }
    }
    // Bad puts are typed per item.
    let bad = api.put_batch(&[
        (order[7], bytes("wrong size!")),
        (order[8], puts[8].1.clone()),
    ]);
    assert!(matches!(bad[0], Err(ClientError::InvalidArgument(_))));
    assert!(bad[1].is_ok());
    assert_eq!(cluster.directory.lookups.load(Ordering::Relaxed), 0);
}

#[test]
fn moved_chunks_are_found_after_not_owner_and_one_lookup() {
    let cluster = cluster(2, ChunkOptions::default());
    let api = cluster.client.blocking();
    let payloads: Vec<Bytes> = (0..8).map(|i| bytes(&format!("chunk {i}"))).collect();
    let (one, two) = (cluster.ids[0], cluster.ids[1]);
    let cids = api.create_with_data(one, payloads.clone()).unwrap();
    assert_eq!(api.get_batch(&cids).len(), 8);
    // Migrate the first five to peer 2: copy with Insert, then switch ownership everywhere.
    let moved: Vec<(ChunkId, Bytes)> = cids[..5]
        .iter()
        .copied()
        .zip(payloads.iter().cloned())
        .collect();
    assert!(api.insert(two, moved).iter().all(Result::is_ok));
    let (first, last) = (cids[0].local_id(), cids[4].local_id());
    assert_eq!(last - first, 4, "created IDs are dense");
    for peer in cluster.inner.live_peers() {
        peer.service().set_owner(one, first, last, two);
    }
    cluster.directory.set_owner(one, first, last, two);
    // Peer 1 still has the bytes but must refuse them; peer 2 serves them.
    cluster
        .inner
        .peer(0)
        .service()
        .memory()
        .remove_range(cids[0], cids[4])
        .unwrap();
    let got = api.get_batch(&cids);
    for (index, result) in got.iter().enumerate() {
        assert_eq!(result.as_ref().unwrap(), &payloads[index], "item {index}");
    }
    assert_eq!(
        cluster.directory.lookups.load(Ordering::Relaxed),
        1,
        "one lookup answers the whole moved range"
    );
    assert_eq!(cluster.client.owner_of(cids[2]), two);
    // The cache routes later calls straight to the new owner.
    api.put(cids[2], bytes("CHUNK 2")).unwrap();
    assert_eq!(api.get(cids[2]).unwrap(), bytes("CHUNK 2"));
    assert_eq!(cluster.directory.lookups.load(Ordering::Relaxed), 1);
}

#[test]
fn dead_owner_fails_with_node_unavailable_within_the_timeout() {
    let options = ChunkOptions {
        timeout: Duration::from_millis(1500),
        ..ChunkOptions::default()
    };
    let mut cluster = cluster(2, options);
    let api = cluster.client.blocking();
    let (one, two) = (cluster.ids[0], cluster.ids[1]);
    let on_two = api.create_with_data(two, vec![bytes("gone soon")]).unwrap()[0];
    let on_one = api.create_with_data(one, vec![bytes("stays")]).unwrap()[0];
    // Peer two crashes: its endpoint closes and answers nothing more.
    cluster.inner.kill_peer(1);
    let started = Instant::now();
    let results = api.get_batch(&[on_one, on_two]);
    let elapsed = started.elapsed();
    assert_eq!(results[0].as_ref().unwrap(), &bytes("stays"));
    assert!(
        matches!(
            results[1],
            Err(ClientError::NodeUnavailable(node)) if node == two
        ) || matches!(results[1], Err(ClientError::Timeout { .. })),
        "{:?}",
        results[1]
    );
    assert!(elapsed < Duration::from_millis(1500 + 500), "{elapsed:?}");
    // A node the directory knows dead fails fast, without waiting for a connection.
    cluster.directory.dead.lock().insert(two);
    let started = Instant::now();
    assert!(matches!(
        api.get(on_two),
        Err(ClientError::NodeUnavailable(node)) if node == two
    ));
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[test]
fn local_owner_is_served_in_process_without_network() {
    // The application runs inside peer one: its endpoint is the peer's own.
    let cluster = cluster(2, ChunkOptions::default());
    let peer = cluster.inner.peer(0);
    let (one, two) = (cluster.ids[0], cluster.ids[1]);
    let net = peer.membership().net();
    let directory = TestDirectory::new(one);
    let chunks = Chunks::new(net.clone(), directory, ChunkOptions::default())
        .with_local(peer.service().clone());
    let api = chunks.blocking();
    // A real peer is connected to its superpeer (heartbeats); local chunks add nothing.
    let connected_before: HashSet<NodeId> = net.connected_nodes().into_iter().collect();
    assert!(!connected_before.contains(&two));
    let local = api.create_with_data(one, vec![bytes("here")]).unwrap()[0];
    api.put(local, bytes("HERE")).unwrap();
    assert_eq!(api.get(local).unwrap(), bytes("HERE"));
    api.lock(local, true, Duration::ZERO).unwrap();
    assert_eq!(
        api.get(local).unwrap(),
        bytes("HERE"),
        "the holder reads under its lock"
    );
    api.unlock(local, true).unwrap();
    let connected: HashSet<NodeId> = net.connected_nodes().into_iter().collect();
    assert!(
        connected.is_subset(&connected_before),
        "no connection was opened for local chunks: {connected:?}"
    );
    let remote = api.create_with_data(two, vec![bytes("there")]).unwrap()[0];
    assert_eq!(api.get(remote).unwrap(), bytes("there"));
    let connected: HashSet<NodeId> = net.connected_nodes().into_iter().collect();
    assert!(connected.contains(&two), "{connected:?}");
    let frames = net.connection_stats(two).unwrap().frames_sent;
    assert_eq!(api.get(local).unwrap(), bytes("HERE"));
    let after = net.connection_stats(two).unwrap().frames_sent;
    assert_eq!(frames, after, "a local get sends nothing");
}

#[test]
fn remote_lock_blocks_other_nodes_until_unlocked() {
    let cluster = cluster(1, ChunkOptions::default());
    let api = cluster.client.blocking();
    let cid = api
        .create_with_data(cluster.ids[0], vec![bytes("guarded")])
        .unwrap()[0];
    api.lock(cid, true, Duration::from_millis(100)).unwrap();
    api.put(cid, bytes("GUARDED")).unwrap();
    // Another node (the peer itself, in process) cannot read while it is locked.
    let peer = cluster.inner.peer(0).service();
    let blocked = peer.execute(
        cluster.ids[0],
        myriad_proto::chunk::ChunkRequest::get_one(cid),
    );
    assert!(matches!(
        blocked,
        myriad_proto::chunk::ChunkReply::Data(ref items)
            if items[0] == Err(myriad_proto::chunk::ItemError::LockTimeout)
    ));
    api.unlock(cid, true).unwrap();
    assert!(matches!(
        api.unlock(cid, true),
        Err(ClientError::InvalidArgument(_))
    ));
    assert_eq!(api.get(cid).unwrap(), bytes("GUARDED"));
    // A lock not granted in time is a typed error.
    api.lock(cid, true, Duration::ZERO).unwrap();
    peer.release_locks_of(cluster.client_id);
    assert_eq!(api.get(cid).unwrap(), bytes("GUARDED"));
}

#[derive(Debug, Clone)]
enum Op {
    /// `peer` counts from 1, in start order.
    Create {
        peer: usize,
        len: usize,
    },
    Put {
        index: usize,
        len: usize,
        fill: u8,
    },
    Get {
        index: usize,
    },
    Remove {
        index: usize,
    },
    GetBatch {
        indices: Vec<usize>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..=2, 1usize..40).prop_map(|(peer, len)| Op::Create { peer, len }),
        (any::<usize>(), 1usize..40, any::<u8>()).prop_map(|(index, len, fill)| Op::Put {
            index,
            len,
            fill
        }),
        any::<usize>().prop_map(|index| Op::Get { index }),
        any::<usize>().prop_map(|index| Op::Remove { index }),
        proptest::collection::vec(any::<usize>(), 1..6)
            .prop_map(|indices| Op::GetBatch { indices }),
    ]
}

#[test]
fn random_operations_match_a_hash_map_model() {
    let cluster = cluster(2, ChunkOptions::default());
    let api = cluster.client.blocking();
    let ids = cluster.ids.clone();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(&proptest::collection::vec(op(), 1..30), |ops| {
            // Each case starts from what previous cases left: the model is per case, so
            // it only tracks chunks created in this case.
            let mut model: HashMap<ChunkId, Option<Bytes>> = HashMap::new();
            let mut known: Vec<ChunkId> = Vec::new();
            let pick =
                |known: &Vec<ChunkId>, index: usize| known.get(index % known.len().max(1)).copied();
            for op in ops {
                match op {
                    Op::Create { peer, len } => {
                        let data = Bytes::from(vec![len as u8; len]);
                        let cid = api
                            .create_with_data(ids[peer - 1], vec![data.clone()])
                            .map_err(|e| TestCaseError::fail(e.to_string()))?[0];
                        prop_assert_eq!(cid.creator(), ids[peer - 1]);
                        let previous = model.insert(cid, Some(data));
                        // A removed ID may be reused; a live one never.
                        prop_assert!(
                            matches!(previous, None | Some(None)),
                            "live CID {} handed out again",
                            cid
                        );
                        if !known.contains(&cid) {
                            known.push(cid);
                        }
                    }
                    Op::Put { index, len, fill } => {
                        let Some(cid) = pick(&known, index) else {
                            continue;
                        };
                        let data = Bytes::from(vec![fill; len]);
                        let result = api.put(cid, data.clone());
                        match model.get(&cid).cloned().flatten() {
                            Some(old) if old.len() == len => {
                                prop_assert!(result.is_ok(), "{:?}", result);
                                model.insert(cid, Some(data));
                            }
                            Some(_) => prop_assert!(
                                matches!(result, Err(ClientError::InvalidArgument(_))),
                                "{:?}",
                                result
                            ),
                            None => prop_assert!(
                                matches!(result, Err(ClientError::NotFound(_))),
                                "{:?}",
                                result
                            ),
                        }
                    }
                    Op::Get { index } => {
                        let Some(cid) = pick(&known, index) else {
                            continue;
                        };
                        let result = api.get(cid);
                        match model.get(&cid).cloned().flatten() {
                            Some(data) => prop_assert_eq!(result.ok(), Some(data)),
                            None => prop_assert!(
                                matches!(result, Err(ClientError::NotFound(_))),
                                "{:?}",
                                result
                            ),
                        }
                    }
                    Op::Remove { index } => {
                        let Some(cid) = pick(&known, index) else {
                            continue;
                        };
                        let result = api.remove(cid);
                        match model.get(&cid).cloned().flatten() {
                            Some(_) => {
                                prop_assert!(result.is_ok(), "{:?}", result);
                                model.insert(cid, None);
                            }
                            None => prop_assert!(
                                matches!(result, Err(ClientError::NotFound(_))),
                                "{:?}",
                                result
                            ),
                        }
                    }
                    Op::GetBatch { indices } => {
                        let cids: Vec<ChunkId> =
                            indices.iter().filter_map(|&i| pick(&known, i)).collect();
                        let results = api.get_batch(&cids);
                        prop_assert_eq!(results.len(), cids.len());
                        for (cid, result) in cids.iter().zip(results) {
                            match model.get(cid).cloned().flatten() {
                                Some(data) => prop_assert_eq!(result.ok(), Some(data)),
                                None => {
                                    prop_assert!(matches!(result, Err(ClientError::NotFound(_))))
                                }
                            }
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

/// Single 64-byte gets from one thread over loopback: the blocking chunk API against a
/// raw `request_blocking` of the same encoded request (the floor the API adds to).
#[test]
fn single_get_round_trips_per_second() {
    let cluster = cluster(1, ChunkOptions::default());
    let api = cluster.client.blocking();
    let cid = api
        .create_with_data(cluster.ids[0], vec![Bytes::from(vec![7u8; 64])])
        .unwrap()[0];
    let window = Duration::from_millis(700);
    let measure = |get: &dyn Fn()| {
        for _ in 0..200 {
            get();
        }
        let started = Instant::now();
        let mut count = 0u64;
        while started.elapsed() < window {
            for _ in 0..100 {
                get();
            }
            count += 100;
        }
        count as f64 / started.elapsed().as_secs_f64()
    };
    let via_api = measure(&|| {
        assert_eq!(api.get(cid).unwrap().len(), 64);
    });
    let handle = cluster.net.clone();
    let request = myriad_proto::chunk::ChunkRequest::get_one(cid).encode();
    let raw = measure(&|| {
        let reply = handle
            .request_blocking(
                cluster.ids[0],
                myriad_proto::types::CHUNK,
                request.clone(),
                Duration::from_secs(2),
            )
            .unwrap();
        assert!(reply.len() > 64);
    });
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    eprintln!(
        "single 64-byte get, one thread, loopback ({build}): chunk API {via_api:.0}/s, raw request_blocking {raw:.0}/s"
    );
    assert!(via_api > 100.0 && raw > 100.0);
}

/// A create after a migration never hands out a migrated chunk's ID again (two chunks
/// would share one CID, the lookup sending one of them to the other's owner).
#[test]
fn creates_after_a_migration_never_reuse_a_migrated_id() {
    let inner = TestCluster::builder()
        .peers(2)
        .memory_bytes(32 << 20)
        .start();
    let client = inner.client();
    let api = client.blocking();
    let ids = inner.peer_ids();
    let (one, two) = (ids[0], ids[1]);
    let payloads: Vec<Bytes> = (0..4).map(|i| bytes(&format!("first {i}"))).collect();
    let cids = api
        .chunks()
        .create_with_data(one, payloads.clone())
        .unwrap();
    assert_eq!(api.migrate(cids[0], cids[2], two).unwrap(), 3);
    let fresh: Vec<Bytes> = (0..4).map(|i| bytes(&format!("fresh {i}"))).collect();
    let created = api.chunks().create_with_data(one, fresh.clone()).unwrap();
    for cid in &created {
        assert!(
            !cids.contains(cid),
            "{cid} handed out again after its migration"
        );
    }
    for (cid, payload) in cids.iter().zip(&payloads).chain(created.iter().zip(&fresh)) {
        assert_eq!(&api.chunks().get(*cid).unwrap(), payload, "{cid}");
    }
}
