//! Restarts with data directories (issue 6) with real processes on 127.0.0.1:
//! - a peer SIGKILLed and restarted at once with its data directory gets its old chunks
//!   back (its old zones are recovered by its backups, as for a failure) and creates new
//!   chunks above its old local IDs;
//! - a whole cluster SIGKILLed (a power outage) and restarted node by node, peers in a
//!   shuffled order seconds apart, brings back every acknowledged chunk with its latest
//!   value from the backups' logs; removed chunks stay removed.
//!
//! Every process is SIGKILLed when the cluster harness drops, also when a test panics (the
//! nodes' logs are kept then).

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use support::verify;

use bytes::Bytes;
use myriad_client::chunk::BlockingChunks;
use myriad_client::chunk::ChunkOptions;
use myriad_client::client::{Client, ClientConfig};
use myriad_client::membership::Membership;
use myriad_launcher::NodeRole;
use myriad_node::peer_node::LID_RESERVE_STEP;
use myriad_testing::process::Cluster;
use myriad_types::{ChunkId, NodeId};

/// Small zones and logs, replication R = 2; failure detection per test.
fn config(failure_timeout_ms: u64) -> String {
    format!(
        "\
[failure]
heartbeat_interval_ms = 100
failure_timeout_ms = {failure_timeout_ms}
recovery_backup_wait_ms = 20000

[backup]
replication = 2
zone_mb = 1
segment_kb = 64
write_buffer_kb = 1024
primary_log_kb = 4096
"
    )
}

/// One superpeer and `peers` peers; the nodes' logs are kept if the test panics.
fn start(dir: &Path, peers: usize, failure_timeout_ms: u64) -> Cluster {
    Cluster::builder(env!("CARGO_BIN_EXE_myriad"), dir)
        .superpeers(1)
        .peers(peers)
        .peer_memory_mb(64)
        .config(config(failure_timeout_ms))
        .keep_logs_on_panic()
        .start()
}

fn superpeers(cluster: &Cluster) -> Vec<(NodeId, SocketAddr)> {
    cluster.superpeers()
}

fn peers(cluster: &Cluster) -> Vec<(String, NodeId)> {
    cluster
        .nodes()
        .iter()
        .filter(|node| node.role == NodeRole::Peer)
        .map(|node| (node.name.clone(), NodeId(node.node_id)))
        .collect()
}

fn connect(cluster: &Cluster, durability: u8) -> Client {
    let mut config = ClientConfig::new(superpeers(cluster));
    config.chunks = ChunkOptions {
        timeout: Duration::from_secs(5),
        durability,
        ..ChunkOptions::default()
    };
    Client::connect_with(config).expect("client joins")
}

fn payload(index: usize, version: u32) -> Bytes {
    Bytes::from(format!(
        "chunk-{index:06}-v{version}-{}",
        "p".repeat(30 + index % 50)
    ))
}

/// Creates `count` chunks on `peer`, overwrites every 5th, removes every 9th; the
/// expected content of each (None: removed), keyed by CID, plus creation order.
fn load(
    chunks: &BlockingChunks<'_, Membership>,
    peer: NodeId,
    offset: usize,
    count: usize,
    expected: &mut BTreeMap<ChunkId, Option<Bytes>>,
) -> Vec<ChunkId> {
    let mut cids = Vec::with_capacity(count);
    for start in (0..count).step_by(500) {
        let end = (start + 500).min(count);
        let payloads = (start..end).map(|i| payload(offset + i, 0)).collect();
        cids.extend(chunks.create_with_data(peer, payloads).expect("create"));
    }
    for (i, cid) in cids.iter().enumerate() {
        expected.insert(*cid, Some(payload(offset + i, 0)));
    }
    let puts: Vec<(ChunkId, Bytes)> = (0..count)
        .step_by(5)
        .map(|i| (cids[i], payload(offset + i, 1)))
        .collect();
    for result in chunks.put_batch(&puts) {
        result.expect("put");
    }
    for (cid, data) in puts {
        expected.insert(cid, Some(data));
    }
    let removes: Vec<ChunkId> = (2..count).step_by(9).map(|i| cids[i]).collect();
    for result in chunks.remove_batch(&removes) {
        result.expect("remove");
    }
    for cid in removes {
        expected.insert(cid, None);
    }
    cids
}

#[test]
fn a_peer_restarted_at_once_gets_its_old_chunks_back_and_creates_above_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Detection is slow on purpose: the restart comes before any heartbeat verdict.
    let mut cluster = start(dir.path(), 4, 5_000);
    let peers = peers(&cluster);
    let (victim_name, victim) = peers[0].clone();
    let client = connect(&cluster, 3);
    let api = client.blocking();
    let chunks = api.chunks();
    let mut expected = BTreeMap::new();
    let old = load(&chunks, victim, 0, 4_000, &mut expected);
    let runtime = client.membership().net().runtime();
    let old_zones = runtime.block_on(client.zones(victim)).expect("zone table");
    println!("victim {victim} zones before the restart: {old_zones:?}");
    assert!(!old_zones.is_empty());
    let old_zone_end = old_zones.iter().map(|(zone, _)| *zone).max().unwrap_or(0) + 1;

    cluster.kill(victim.0);
    let restarted = cluster.restart(&victim_name);
    let since = Instant::now();
    assert_eq!(restarted.node_id, victim.0, "the peer reclaims its node ID");

    let (took, first_wrong) = verify(&chunks, &expected, since, Duration::from_secs(25));
    println!(
        "restart to all {} old chunks right: {} ms",
        expected.len(),
        took.as_millis()
    );
    // Reads of old chunks during their recovery wait for it (bounded by the client's
    // timeout) instead of failing or answering a false "not found".
    assert_eq!(
        first_wrong, 0,
        "reads during the recovery did not wait for it"
    );

    // New chunks of the new incarnation: above every old local ID, readable, and the old
    // ones keep their values.
    let fresh: Vec<Bytes> = (0..200).map(|i| payload(100_000 + i, 0)).collect();
    let new = chunks
        .create_with_data(victim, fresh.clone())
        .expect("create on the restarted peer");
    let old_max = old.iter().map(|cid| cid.local_id()).max().unwrap_or(0);
    for cid in &new {
        assert_eq!(cid.creator(), victim);
        assert!(
            cid.local_id() >= LID_RESERVE_STEP && cid.local_id() > old_max,
            "{cid} collides with the old incarnation's IDs (old max {old_max:#x})"
        );
    }
    for (cid, data) in new.iter().zip(fresh) {
        expected.insert(*cid, Some(data));
    }
    verify(&chunks, &expected, Instant::now(), Duration::from_secs(10));
    // The old zones stay in the table, adopted by their restorers (issue 6: same
    // numbers, never backed by the victim); the new incarnation's zones are numbered above
    // them, so no number is reused.
    let zones = runtime.block_on(client.zones(victim)).expect("zone table");
    println!("victim {victim} zones after the restart: {zones:?}");
    for (zone, backups) in &zones {
        if *zone < old_zone_end {
            assert!(
                old_zones.iter().any(|(old, _)| old == zone),
                "zone number {zone} reused: {zones:?}"
            );
            assert!(!backups.contains(&victim), "{zone}: {backups:?}");
        }
    }
    assert!(
        zones.iter().any(|(zone, _)| *zone >= old_zone_end),
        "the new incarnation registered no zone above the old ones: {zones:?}"
    );
}

/// Every process SIGKILLed, then the superpeer and the peers restarted with their data
/// directories (`shuffled`: peers one by one in a shuffled order a second apart; else
/// [`myriad_launcher::LocalCluster::restart_all`], what `myriad cluster restart --dir D` runs): every
/// acknowledged chunk comes back.
fn full_restart(durability: u8, shuffled: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = start(dir.path(), 4, 600);
    let peers = peers(&cluster);
    let mut expected = BTreeMap::new();
    {
        let client = connect(&cluster, durability);
        let api = client.blocking();
        let chunks = api.chunks();
        for (index, (_, peer)) in peers.iter().enumerate() {
            load(&chunks, *peer, index * 10_000, 800, &mut expected);
        }
    }
    if durability < 3 {
        // Replicated writes are acknowledged from the backups' memory: give the log
        // engines' flushers a moment to hand them to the OS (a SIGKILL keeps what the OS
        // has; a real power outage would not).
        std::thread::sleep(Duration::from_millis(1_000));
    }
    let names: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|node| node.name.clone())
        .collect();
    for name in &names {
        cluster.kill_named(name);
    }
    let killed = Instant::now();
    if !shuffled {
        let restarted = cluster.restart_all(Duration::from_millis(500));
        assert_eq!(restarted.len(), names.len());
        assert!(cluster
            .launcher_mut()
            .status()
            .iter()
            .all(|node| node.alive));
    }
    // The superpeer first (from its Raft state), then the peers in a shuffled order.
    for name in names
        .iter()
        .filter(|name| shuffled && name.starts_with("superpeer"))
    {
        cluster.restart(name);
    }
    let mut order: Vec<String> = peers
        .iter()
        .filter(|_| shuffled)
        .map(|(name, _)| name.clone())
        .collect();
    let seed = killed.elapsed().subsec_nanos() as usize;
    let count = order.len().max(1);
    order.rotate_left(seed % count);
    if !order.is_empty() {
        order.swap(0, (seed / 7) % count);
    }
    if shuffled {
        println!("peers restart in the order {order:?}");
    }
    for (index, name) in order.iter().enumerate() {
        if index > 0 {
            std::thread::sleep(Duration::from_millis(1_000));
        }
        let entry = cluster.restart(name);
        assert!(peers.iter().any(|(_, id)| id.0 == entry.node_id));
    }
    let client = connect(&cluster, durability);
    let api = client.blocking();
    let chunks = api.chunks();
    let (took, _) = verify(&chunks, &expected, killed, Duration::from_secs(40));
    println!(
        "kill of every node to all {} chunks right: {} ms",
        expected.len(),
        took.as_millis()
    );
}

#[test]
fn a_fully_restarted_cluster_brings_back_every_durable_chunk() {
    full_restart(3, true);
}

#[test]
fn a_fully_restarted_cluster_brings_back_every_replicated_chunk() {
    full_restart(2, false);
}
