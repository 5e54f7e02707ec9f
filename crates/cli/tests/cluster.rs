//! End-to-end tests of a cluster of real node processes on 127.0.0.1: superpeers and peers
//! started by the launcher (`myriad superpeer`, `myriad peer`), clients in this process.
//! Every process is SIGKILLed when its cluster harness drops, also when a test panics.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::client::Client;
use myriad_client::ClientError;
use myriad_meta::{Command, NodeState, Role};
use myriad_testing::process::{poll_until, Cluster};
use myriad_types::{ChunkId, NodeId};

fn start(dir: &Path, superpeers: usize, peers: usize) -> Cluster {
    Cluster::builder(env!("CARGO_BIN_EXE_myriad"), dir)
        .superpeers(superpeers)
        .peers(peers)
        .peer_memory_mb(256)
        .start()
}

fn superpeers(cluster: &Cluster) -> Vec<(NodeId, SocketAddr)> {
    cluster.superpeers()
}

fn secret(cluster: &Cluster) -> Vec<u8> {
    cluster.secret().expect("the cluster's secret file")
}

fn peers(cluster: &Cluster) -> Vec<NodeId> {
    cluster.peer_ids()
}

fn files_named(dir: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.file_name().is_some_and(|file| file == name) {
                found.push(path);
            }
        }
    }
    found
}

fn payload(index: usize) -> Bytes {
    Bytes::from(format!("value-{index:08}-{}", "x".repeat(index % 40)))
}

#[test]
fn remote_and_batch_chunk_operations_across_three_peers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = start(dir.path(), 1, 3);
    let client = Client::connect(superpeers(&cluster), secret(&cluster)).expect("client joins");
    let api = client.blocking();
    let chunks = api.chunks();
    let peers = peers(&cluster);
    assert_eq!(peers.len(), 3);
    // Peers of 256 MiB got backup logs scaled to their memory: a 64 MiB primary log each
    // (the default of 256 MiB is for peers of 1 GiB and more).
    let primary_logs = files_named(dir.path(), "primary.log");
    assert_eq!(primary_logs.len(), 3, "{primary_logs:?}");
    for path in &primary_logs {
        let len = std::fs::metadata(path).expect("primary log").len();
        assert_eq!(len, 64 << 20, "{}", path.display());
    }

    // Single creates on each peer carry the peer's creator ID.
    let mut all = Vec::new();
    for (round, &peer) in peers.iter().enumerate() {
        let cid = chunks.create(peer, 16).expect("create");
        assert_eq!(cid.creator(), peer);
        // A put replaces the whole chunk and must match its size (resize changes it).
        let value = Bytes::from(format!("sixteen bytes {round:02}"));
        assert!(matches!(
            chunks.put(cid, Bytes::from_static(b"short")),
            Err(ClientError::InvalidArgument(_))
        ));
        chunks.put(cid, value.clone()).expect("put");
        all.push((cid, value));
    }
    // Batch creates with data on every peer, then one batch get spanning all peers.
    for &peer in &peers {
        let values: Vec<Bytes> = (0..200).map(|i| payload(all.len() + i)).collect();
        let cids = chunks
            .create_with_data(peer, values.clone())
            .expect("create batch");
        assert_eq!(cids.len(), 200);
        all.extend(cids.into_iter().zip(values));
    }
    let wanted: Vec<ChunkId> = all.iter().map(|(cid, _)| *cid).collect();
    let got = chunks.get_batch(&wanted);
    for ((cid, expected), result) in all.iter().zip(got) {
        assert_eq!(&result.unwrap_or_else(|e| panic!("{cid}: {e}")), expected);
    }
    // Batch put and remove, in caller order across owners.
    let updates: Vec<(ChunkId, Bytes)> = all
        .iter()
        .step_by(7)
        .map(|(cid, value)| (*cid, Bytes::from(value.to_ascii_uppercase())))
        .collect();
    for result in chunks.put_batch(&updates) {
        result.expect("batch put");
    }
    for (cid, value) in &updates {
        assert_eq!(&chunks.get(*cid).expect("get"), value);
    }
    let gone: Vec<ChunkId> = updates.iter().take(10).map(|(cid, _)| *cid).collect();
    for result in chunks.remove_batch(&gone) {
        result.expect("batch remove");
    }
    for cid in &gone {
        assert!(matches!(chunks.get(*cid), Err(ClientError::NotFound(c)) if c == *cid));
    }
    // Offset access, resize, status, locks, listing and statistics.
    let (cid, _) = all[100];
    chunks.resize(cid, 32).expect("resize");
    assert_eq!(chunks.status(cid).expect("status"), 32);
    chunks
        .write_at(cid, 4, Bytes::from_static(b"abcd"))
        .expect("write at");
    assert_eq!(&chunks.read_at(cid, 4, 4).expect("read at")[..], b"abcd");
    chunks
        .lock(cid, true, Duration::from_secs(1))
        .expect("lock");
    chunks.unlock(cid, true).expect("unlock");
    let (ranges, _truncated) = chunks.list(peers[0], None, 1000).expect("list");
    assert!(!ranges.is_empty());
    let stats = chunks.stats(peers[0]).expect("stats");
    let created_there = all.iter().filter(|(c, _)| c.creator() == peers[0]).count();
    let removed_there = gone.iter().filter(|c| c.creator() == peers[0]).count();
    assert_eq!(
        stats.chunks as usize,
        created_there - removed_there,
        "{stats:?}"
    );
    // A CID nobody created.
    let ghost = ChunkId::new(peers[1], 999_999).expect("cid");
    assert!(matches!(chunks.get(ghost), Err(ClientError::NotFound(_))));
    client.shutdown();
}

#[test]
fn clients_follow_a_migrated_range_to_its_new_owner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = start(dir.path(), 1, 2);
    let peers = peers(&cluster);
    let reader = Client::connect(superpeers(&cluster), secret(&cluster)).expect("reader joins");
    let mover = Client::connect(superpeers(&cluster), secret(&cluster)).expect("mover joins");
    let values: Vec<Bytes> = (0..300).map(payload).collect();
    let cids = reader
        .blocking()
        .chunks()
        .create_with_data(peers[0], values.clone())
        .expect("create");
    // The reader routes to the creator and caches that.
    assert_eq!(
        reader.blocking().chunks().get(cids[5]).expect("get"),
        values[5]
    );

    let (first, last) = (cids[0], cids[299]);
    let moved = mover
        .blocking()
        .migrate(first, last, peers[1])
        .expect("migrate");
    assert_eq!(moved, 300);
    let tree = mover.blocking().lookup_tree(peers[0]).expect("lookup tree");
    assert!(
        tree.iter().any(|&(a, b, owner)| a <= first.local_id()
            && b >= last.local_id()
            && owner == peers[1]),
        "{tree:?}"
    );
    // The reader's cached route is stale: it gets "not owner", refreshes, and finds them.
    for (cid, value) in cids.iter().zip(&values) {
        assert_eq!(
            &reader.blocking().chunks().get(*cid).expect("get moved"),
            value
        );
    }
    assert_eq!(reader.chunks().owner_of(cids[0]), peers[1]);
    // Writes land on the new owner and are visible to the other client.
    reader
        .blocking()
        .chunks()
        .put(cids[7], Bytes::from(values[7].to_ascii_uppercase()))
        .expect("put");
    assert_eq!(
        mover.blocking().chunks().get(cids[7]).expect("get"),
        Bytes::from(values[7].to_ascii_uppercase())
    );
    let stats = reader.blocking().chunks().stats(peers[0]).expect("stats");
    assert_eq!(stats.chunks, 0, "the old owner dropped its copies");
    reader.shutdown();
    mover.shutdown();
}

#[test]
fn nameservice_barriers_and_temporary_storage_across_nodes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = start(dir.path(), 1, 1);
    let peer = peers(&cluster)[0];
    let clients: Vec<Client> = (0..3)
        .map(|_| Client::connect(superpeers(&cluster), secret(&cluster)).expect("joins"))
        .collect();
    let ids: Vec<NodeId> = clients.iter().map(Client::node_id).collect();
    assert_eq!(
        ids.iter().collect::<std::collections::BTreeSet<_>>().len(),
        3,
        "distinct IDs {ids:?}"
    );

    // Nameservice: long names, registered on one node, seen on another.
    let cid = clients[0]
        .blocking()
        .chunks()
        .create(peer, 8)
        .expect("create");
    let name = format!("graph/vertices/{}", "v".repeat(60));
    clients[0]
        .blocking()
        .name_register(&name, cid)
        .expect("register");
    assert_eq!(
        clients[1].blocking().name_get(&name).expect("get"),
        Some(cid)
    );
    assert!(clients[2]
        .blocking()
        .name_list()
        .expect("list")
        .contains(&(name.clone(), cid)));
    clients[1].blocking().name_remove(&name).expect("remove");
    assert_eq!(clients[0].blocking().name_get(&name).expect("get"), None);

    // Temporary storage.
    clients[0]
        .blocking()
        .tmp_create("job.config", Bytes::from_static(b"v1"))
        .expect("tmp create");
    assert!(clients[1]
        .blocking()
        .tmp_create("job.config", Bytes::from_static(b"v2"))
        .is_err());
    clients[1]
        .blocking()
        .tmp_put("job.config", Bytes::from_static(b"v2"))
        .expect("tmp put");
    assert_eq!(
        clients[2]
            .blocking()
            .tmp_get("job.config")
            .expect("tmp get"),
        Some(Bytes::from_static(b"v2"))
    );
    assert_eq!(
        clients[0].blocking().tmp_list().expect("tmp list"),
        vec![("job.config".to_owned(), 2)]
    );
    clients[2]
        .blocking()
        .tmp_remove("job.config")
        .expect("tmp remove");
    assert_eq!(
        clients[0]
            .blocking()
            .tmp_get("job.config")
            .expect("tmp get"),
        None
    );

    // A barrier of three: each client signs on from its own thread with its own value;
    // everyone gets everyone's value.
    let barrier = clients[0].blocking().barrier_alloc(3).expect("alloc");
    let handles: Vec<_> = clients
        .iter()
        .cloned()
        .enumerate()
        .map(|(index, client)| {
            thread::spawn(move || {
                client.blocking().barrier_sign_on(
                    barrier,
                    100 + index as u64,
                    Duration::from_secs(10),
                )
            })
        })
        .collect();
    for handle in handles {
        let mut values = handle.join().expect("thread").expect("sign on");
        values.sort();
        let mut expected: Vec<(NodeId, u64)> = ids
            .iter()
            .enumerate()
            .map(|(index, &id)| (id, 100 + index as u64))
            .collect();
        expected.sort();
        assert_eq!(values, expected);
    }
    let status = clients[1]
        .blocking()
        .barrier_status(barrier)
        .expect("status")
        .expect("exists");
    assert_eq!(status.round, 1);
    clients[2].blocking().barrier_free(barrier).expect("free");
    assert_eq!(
        clients[0]
            .blocking()
            .barrier_status(barrier)
            .expect("status"),
        None
    );
    for client in clients {
        client.shutdown();
    }
}

#[test]
fn a_peer_id_is_reused_only_after_its_node_is_gone_and_released() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = start(dir.path(), 1, 2);
    let client = Client::connect(superpeers(&cluster), secret(&cluster)).expect("joins");
    let victim = peers(&cluster)[0];

    // A client's ID comes back to the next client once it left.
    let first = Client::connect(superpeers(&cluster), secret(&cluster)).expect("joins");
    let first_id = first.node_id();
    first.shutdown();
    assert!(poll_until(Duration::from_secs(5), || {
        client
            .blocking()
            .nodes()
            .map(|nodes| {
                nodes
                    .iter()
                    .any(|n| n.id == first_id && n.state != NodeState::Alive)
            })
            .unwrap_or(false)
    }));
    let second = Client::connect(superpeers(&cluster), secret(&cluster)).expect("joins");
    assert_eq!(second.node_id(), first_id, "a gone client's ID is reused");
    second.shutdown();

    // A peer killed with SIGKILL is declared failed; its ID stays reserved.
    cluster.kill(victim.0);
    assert!(
        poll_until(Duration::from_secs(10), || {
            client
                .blocking()
                .nodes()
                .map(|nodes| {
                    nodes
                        .iter()
                        .any(|n| n.id == victim && matches!(n.state, NodeState::Failed { .. }))
                })
                .unwrap_or(false)
        }),
        "the killed peer is declared failed"
    );
    let fresh =
        myriad_node::peer_node::PeerNode::start(peer_options(&cluster, dir.path(), "fresh-1"))
            .expect("a new peer joins");
    assert_ne!(
        fresh.node_id(),
        victim,
        "a failed peer's ID is not handed out"
    );
    fresh.shutdown();

    // Once an operator releases it, the ID is handed out again.
    client
        .membership()
        .net()
        .runtime()
        .block_on({
            let membership = Arc::clone(client.membership());
            async move { membership.write(Command::ReleaseId { node: victim }).await }
        })
        .expect("release");
    let reused =
        myriad_node::peer_node::PeerNode::start(peer_options(&cluster, dir.path(), "fresh-2"))
            .expect("another peer joins");
    assert_eq!(
        reused.node_id(),
        victim,
        "the released ID is the lowest free one"
    );
    reused.shutdown();
    client.shutdown();
}

fn peer_options(cluster: &Cluster, dir: &Path, name: &str) -> myriad_node::peer_node::PeerOptions {
    let mut join = myriad_client::membership::JoinConfig::new(superpeers(cluster), Role::Peer);
    join.secret = secret(cluster);
    join.listen = "127.0.0.1:0".parse().expect("address");
    myriad_node::peer_node::PeerOptions {
        join,
        memory_bytes: 64 << 20,
        data_dir: dir.join(name),
        handler_threads: 2,
        prefault_bytes: 0,
        backup: myriad_node::replication::BackupOptions::disabled(),
        compute: Default::default(),
    }
}

#[test]
fn killing_the_raft_leader_keeps_metadata_and_chunks_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = start(dir.path(), 3, 2);
    let client = Client::connect(superpeers(&cluster), secret(&cluster)).expect("joins");
    let peers = peers(&cluster);
    let values: Vec<Bytes> = (0..50).map(payload).collect();
    let cids = client
        .blocking()
        .chunks()
        .create_with_data(peers[1], values.clone())
        .expect("create");
    client
        .blocking()
        .name_register("anchor", cids[0])
        .expect("register");

    for round in 0..3 {
        let leader = client
            .blocking()
            .status()
            .expect("status")
            .leader
            .expect("a leader");
        cluster.kill(leader.0);
        let started = Instant::now();
        assert!(
            poll_until(Duration::from_secs(10), || client
                .blocking()
                .status()
                .map(|status| status.leader.is_some_and(|l| l != leader))
                .unwrap_or(false)),
            "round {round}: no new leader"
        );
        eprintln!("round {round}: new leader after {:?}", started.elapsed());
        assert_eq!(
            client.blocking().name_get("anchor").expect("name"),
            Some(cids[0])
        );
        for (cid, value) in cids.iter().zip(&values) {
            assert_eq!(&client.blocking().chunks().get(*cid).expect("get"), value);
        }
        client
            .blocking()
            .tmp_put(&format!("round-{round}"), Bytes::from_static(b"ok"))
            .expect("metadata writes go on");
        cluster.restart(&leader.0.to_string());
    }
    client.shutdown();
}

#[test]
fn a_locked_chunk_delays_only_its_own_readers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = start(dir.path(), 1, 1);
    let peer = peers(&cluster)[0];
    let holder = Client::connect(superpeers(&cluster), secret(&cluster)).expect("joins");
    let reader = Client::connect(superpeers(&cluster), secret(&cluster)).expect("joins");
    let values: Vec<Bytes> = (0..2).map(payload).collect();
    let cids = holder
        .blocking()
        .chunks()
        .create_with_data(peer, values.clone())
        .expect("create");
    holder
        .blocking()
        .chunks()
        .lock(cids[0], true, Duration::from_secs(1))
        .expect("lock");
    let waiting = {
        let reader = reader.clone();
        let cid = cids[0];
        thread::spawn(move || {
            let started = Instant::now();
            let result = reader.blocking().chunks().get(cid);
            (result, started.elapsed())
        })
    };
    thread::sleep(Duration::from_millis(300));
    // The peer still serves other chunks while one reader waits for the lock.
    let started = Instant::now();
    assert_eq!(
        reader.blocking().chunks().get(cids[1]).expect("get"),
        values[1]
    );
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    holder
        .blocking()
        .chunks()
        .unlock(cids[0], true)
        .expect("unlock");
    let (result, waited) = waiting.join().expect("thread");
    assert_eq!(result.expect("get after unlock"), values[0]);
    assert!(
        waited >= Duration::from_millis(250),
        "the read waited for the lock: {waited:?}"
    );
    holder.shutdown();
    reader.shutdown();
}
