//! Restarts with data directories (issue 6) with real processes on 127.0.0.1:
//! - a peer SIGKILLed and restarted at once with its data directory gets its old chunks
//!   back (its old zones are recovered by its backups, as for a failure) and creates new
//!   chunks above its old local IDs;
//! - a whole cluster SIGKILLed at once (a power outage) while client threads write, and
//!   restarted (node by node, peers in a shuffled order seconds apart, or with
//!   `restart_all`), brings back every chunk written before with its latest value from the
//!   backups' logs (removed chunks stay removed); of the writes running at the kill,
//!   `durable` loses no acknowledged one, `replicated` only ones acknowledged within the
//!   backups' write-buffer flush bound before the kill (measured and printed).
//!
//! Every process is SIGKILLed when the cluster harness drops, also when a test panics (the
//! nodes' logs are kept then).

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::verify;

use bytes::Bytes;
use myriad_client::chunk::BlockingChunks;
use myriad_client::chunk::ChunkOptions;
use myriad_client::client::{Client, ClientConfig};
use myriad_client::membership::Membership;
use myriad_launcher::NodeRole;
use myriad_node::config::NodeConfig;
use myriad_node::peer_node::LID_RESERVE_STEP;
use myriad_testing::history::{self, Action, Crash, Operation, Outcome};
use myriad_testing::process::{self, Cluster};
use myriad_types::{ChunkId, NodeId};
use rand::{Rng, SeedableRng};

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
    config.join.secret = cluster.secret().expect("the cluster's secret");
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

/// Registers the writers of [`full_restart`] update, spread over the peers.
const REGISTERS: usize = 64;
/// Client threads writing them.
const WRITERS: u64 = 8;
/// How long they write before the kill.
const WRITING_BEFORE_KILL: Duration = Duration::from_millis(1_500);

/// A register's payload: the value in 8 bytes, padded.
fn encode(value: u64) -> Bytes {
    let mut bytes = value.to_le_bytes().to_vec();
    bytes.resize(64, 0xab);
    Bytes::from(bytes)
}

fn decode(bytes: &[u8]) -> Option<u64> {
    bytes
        .get(..8)
        .and_then(|head| head.try_into().ok())
        .map(u64::from_le_bytes)
}

/// The longest a `replicated` write can sit acknowledged in the backups' write buffers
/// (memory) before they hand it to the OS, which keeps it through a SIGKILL: the log
/// engine's flusher takes the buffer at least every `flush_interval` (`LogConfig`, 100 ms by
/// default, not a `[backup]` setting), and the writer then writes it; one more interval
/// bounds that write. So twice the flush interval of the nodes' own configuration.
fn replicated_loss_bound() -> Duration {
    let config = NodeConfig::from_toml(&config(600)).expect("test config");
    let options = config.backup.options().expect("backup options");
    2 * options.log.flush_interval
}

/// Client threads put unique values to `registers` (acknowledged, refused or unknown,
/// each with its times on `clock`) until `stop`.
fn start_writers(
    cluster: &Cluster,
    durability: u8,
    registers: &[ChunkId],
    clock: Instant,
    stop: &Arc<AtomicBool>,
    history: &Arc<Mutex<Vec<Operation>>>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..WRITERS)
        .map(|thread| {
            let mut config = ClientConfig::new(superpeers(cluster));
            config.join.secret = cluster.secret().expect("the cluster's secret");
            config.join.secret = cluster.secret().expect("the cluster's secret");
            config.chunks = ChunkOptions {
                // Short: once the cluster is gone, a put gives up soon.
                timeout: Duration::from_secs(2),
                durability,
                ..ChunkOptions::default()
            };
            let client = Client::connect_with(config).expect("client joins");
            let registers = registers.to_vec();
            let stop = Arc::clone(stop);
            let history = Arc::clone(history);
            std::thread::spawn(move || {
                let nanos = || clock.elapsed().as_nanos() as u64;
                let mut rng = rand::rngs::SmallRng::seed_from_u64(thread);
                let mut mine = Vec::new();
                let mut sequence = 0;
                while !stop.load(Ordering::Relaxed) {
                    let cid = registers[rng.gen_range(0..registers.len())];
                    sequence += 1;
                    let value = ((thread + 1) << 32) | sequence;
                    let start = nanos();
                    let outcome = match client.blocking().chunks().put(cid, encode(value)) {
                        Ok(()) => Outcome::Ok,
                        Err(_) => Outcome::Unknown,
                    };
                    mine.push(Operation {
                        key: cid.raw(),
                        action: Action::Write(value),
                        start,
                        end: nanos(),
                        outcome,
                    });
                }
                history.lock().expect("history").extend(mine);
                client.shutdown();
            })
        })
        .collect()
}

/// Every process SIGKILLed at once while [`WRITERS`] client threads put to [`REGISTERS`]
/// chunks, then the superpeer and the peers restarted with their data directories
/// (`shuffled`: peers one by one in a shuffled order a second apart; else
/// [`myriad_launcher::LocalCluster::restart_all`], what `myriad cluster restart --dir D`
/// runs). Every chunk loaded before comes back; each register is read once: with
/// `durable` no acknowledged write is missing, with `replicated` only writes acknowledged
/// within [`replicated_loss_bound`] before the kill may be (the largest such gap is
/// printed).
fn full_restart(durability: u8, shuffled: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = start(dir.path(), 4, 600);
    let peers = peers(&cluster);
    let mut expected = BTreeMap::new();
    let mut registers = Vec::new();
    {
        let client = connect(&cluster, durability);
        let api = client.blocking();
        let chunks = api.chunks();
        for (index, (_, peer)) in peers.iter().enumerate() {
            // The registers first: a create may reuse the ID of a removed chunk.
            let payloads = (0..REGISTERS / peers.len()).map(|_| encode(0)).collect();
            registers.extend(chunks.create_with_data(*peer, payloads).expect("create"));
            load(&chunks, *peer, index * 10_000, 800, &mut expected);
        }
        client.shutdown();
    }
    let clock = Instant::now();
    let nanos = || clock.elapsed().as_nanos() as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(Vec::new()));
    let writers = start_writers(&cluster, durability, &registers, clock, &stop, &history);
    std::thread::sleep(WRITING_BEFORE_KILL);
    // A power outage: every node at once, in the middle of the writes.
    let names: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|node| node.name.clone())
        .collect();
    let pids: Vec<u32> = cluster.nodes().iter().map(|node| node.pid).collect();
    let crash_start = nanos();
    process::signal(&pids, "KILL");
    for name in &names {
        // Reaps it (waits until it is gone).
        cluster.kill_named(name);
    }
    let crash_end = nanos();
    let killed = Instant::now();
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().expect("writer thread");
    }
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
    // Each register once, after the restart.
    let mut history = std::mem::take(&mut *history.lock().expect("history"));
    for cid in &registers {
        let start = nanos();
        let data = chunks
            .get(*cid)
            .unwrap_or_else(|error| panic!("final read of register {cid}: {error}"));
        history.push(Operation {
            key: cid.raw(),
            action: Action::Read(decode(&data)),
            start,
            end: nanos(),
            outcome: Outcome::Ok,
        });
    }
    client.shutdown();
    let acknowledged =
        |o: &&Operation| matches!(o.action, Action::Write(_)) && o.outcome == Outcome::Ok;
    let total = history.iter().filter(acknowledged).count();
    let before_kill = history
        .iter()
        .filter(acknowledged)
        .filter(|o| o.end < crash_start)
        .count();
    let lost = history::lost_writes(&history);
    let ms = |nanos: u64| nanos as f64 / 1e6;
    // How long before the kill each lost write was acknowledged.
    let mut gaps: Vec<u64> = lost
        .iter()
        .map(|l| crash_start.saturating_sub(l.write.end))
        .collect();
    gaps.sort_unstable();
    let mut lost_registers: Vec<u64> = lost.iter().map(|l| l.write.key).collect();
    lost_registers.sort_unstable();
    lost_registers.dedup();
    let bound = replicated_loss_bound();
    let gap = |quantile: usize| {
        ms(gaps
            .get((gaps.len().max(1) - 1) * quantile / 100)
            .copied()
            .unwrap_or(0))
    };
    println!(
        "durability {durability}: {total} puts acknowledged ({before_kill} before the kill, kill took {:.1} ms); {} acknowledged puts lost on {} of {} registers, acknowledged {:.1} / {:.1} / {:.1} ms (min / median / largest) before the kill; bound for replicated {bound:?}",
        ms(crash_end - crash_start),
        lost.len(),
        lost_registers.len(),
        registers.len(),
        gap(0),
        gap(50),
        gap(100),
    );
    assert!(before_kill > 0, "no put was acknowledged before the kill");
    let window = if durability >= myriad_proto::chunk::DURABILITY_DURABLE {
        assert!(lost.is_empty(), "durable puts lost: {lost:?}");
        0
    } else {
        bound.as_nanos() as u64
    };
    let crash = Crash {
        start: crash_start,
        end: crash_end,
        window,
    };
    if let Err(error) = history::check(&history::relax_for_crash(&history, crash), Some(0)) {
        panic!(
            "an acknowledged put older than {:?} before the kill is missing: {error}",
            Duration::from_nanos(window)
        );
    }
}

#[test]
fn a_fully_restarted_cluster_brings_back_every_durable_chunk() {
    full_restart(3, true);
}

#[test]
fn a_fully_restarted_cluster_brings_back_every_replicated_chunk() {
    full_restart(2, false);
}
