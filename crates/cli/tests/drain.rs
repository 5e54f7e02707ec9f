//! Draining a peer under load (issue 22), with real processes on 127.0.0.1: a superpeer and
//! four peers (R = 2, fast failure detection).
//!
//! Client threads put and get a few hundred chunks of one peer (durability `replicated`)
//! while `myriad term -c "nodedrain <peer>"` moves all of them to the other peers. The
//! drained peer is then shut down (`nodeshutdown`) and one of the peers that received
//! chunks is SIGKILLed right away; the workload goes on across its recovery. The history of
//! every operation is checked for linearizability per chunk and for lost writes: no
//! acknowledged write may be lost and no read may see an older value, during the drain or
//! after the new owner's death. The recovery is followed with `recoverywait`.
//!
//! Every process (nodes and terminals) is SIGKILLed by the process harness when the test
//! ends, also when it panics.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::chunk::ChunkOptions;
use myriad_client::client::{Client, ClientConfig};
use myriad_client::ClientError;
use myriad_proto::chunk::DURABILITY_REPLICATED;
use myriad_testing::history::{self, Action, Operation, Outcome};
use myriad_testing::process::{wait_until, Cluster, Myriad};
use myriad_types::{ChunkId, NodeId};
use rand::{Rng, SeedableRng};
use serde_json::Value;

const CHUNKS: usize = 400;
const THREADS: u64 = 4;

/// Fast failure detection, small zones and logs, two backups per zone.
const CONFIG: &str = "\
[failure]
heartbeat_interval_ms = 100
failure_timeout_ms = 1000

[backup]
replication = 2
zone_mb = 1
segment_kb = 64
write_buffer_kb = 1024
primary_log_kb = 4096
";

/// Chunk payloads: the value in 8 bytes, padded to 32.
fn encode(value: u64) -> Bytes {
    let mut bytes = value.to_le_bytes().to_vec();
    bytes.resize(32, 0xab);
    Bytes::from(bytes)
}

fn decode(bytes: &[u8]) -> Option<u64> {
    bytes
        .get(..8)
        .and_then(|head| head.try_into().ok())
        .map(u64::from_le_bytes)
}

fn client(cluster: &Cluster) -> Client {
    let mut config = ClientConfig::new(cluster.superpeers());
    config.join.secret = cluster.secret().expect("the cluster's secret");
    config.chunks = ChunkOptions {
        timeout: Duration::from_secs(10),
        durability: DURABILITY_REPLICATED,
        ..ChunkOptions::default()
    };
    Client::connect_with(config).expect("client joins")
}

/// `myriad term --cluster dir --json -c script`: its one JSON value (the test fails if
/// the terminal failed).
fn term(dir: &Path, script: &str) -> Value {
    let output = Myriad::new(
        env!("CARGO_BIN_EXE_myriad"),
        ["term", "--json", "--cluster"],
    )
    .arg(dir)
    .arg("-c")
    .arg(script)
    .timeout(Duration::from_secs(40))
    .run();
    assert!(output.success(), "{script}: {output:#?}");
    serde_json::from_str(output.stdout.trim())
        .unwrap_or_else(|error| panic!("{script}: not JSON ({error}): {output:#?}"))
}

/// Runs `script` until its value satisfies `done` (the recovery table may still be empty
/// right after a kill, before the failure is detected); bounded by 20 tries.
fn poll_term(dir: &Path, script: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..20 {
        let value = term(dir, script);
        if done(&value) {
            return value;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("{script} never showed what was expected")
}

/// One workload thread: random puts (unique values) and gets until `stop`.
fn worker(
    client: Client,
    thread: u64,
    cids: Vec<ChunkId>,
    stop: Arc<AtomicBool>,
    nanos: impl Fn() -> u64,
) -> Vec<Operation> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(thread);
    let mut sequence = 0u64;
    let mut mine = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(45);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let cid = cids[rng.gen_range(0..cids.len())];
        let b = client.blocking();
        let start = nanos();
        let (action, outcome) = if rng.gen_bool(0.5) {
            sequence += 1;
            let value = ((thread + 1) << 32) | sequence;
            let outcome = match b.chunks().put(cid, encode(value)) {
                Ok(()) => Outcome::Ok,
                Err(_) => Outcome::Unknown,
            };
            (Action::Write(value), outcome)
        } else {
            match b.chunks().get(cid) {
                Ok(bytes) => (Action::Read(decode(&bytes)), Outcome::Ok),
                Err(ClientError::NotFound(_)) => (Action::Read(None), Outcome::Ok),
                Err(_) => (Action::Read(None), Outcome::Unknown),
            }
        };
        mine.push(Operation {
            key: cid.raw(),
            action,
            start,
            end: nanos(),
            outcome,
        });
    }
    client.shutdown();
    mine
}

#[test]
fn a_drained_peer_hands_over_every_chunk_under_load_and_a_new_owner_may_die() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::builder(env!("CARGO_BIN_EXE_myriad"), dir.path())
        .superpeers(1)
        .peers(4)
        .peer_memory_mb(64)
        .config(CONFIG)
        .log_lines_on_panic(&["verdict", "declared failed", "recover", "migrat", "drain"])
        .start();
    let cluster_dir = cluster.dir().to_path_buf();
    let peers: Vec<NodeId> = cluster
        .peer_entries()
        .iter()
        .map(|entry| NodeId(entry.node_id))
        .collect();
    let drained = peers[0];
    let main = client(&cluster);
    let cids = main
        .blocking()
        .chunks()
        .create_with_data(drained, (0..CHUNKS).map(|_| encode(0)).collect())
        .expect("create");

    let epoch = Instant::now();
    let nanos = move || epoch.elapsed().as_nanos() as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (client, cids, stop) = (client(&cluster), cids.clone(), Arc::clone(&stop));
            let history = Arc::clone(&history);
            std::thread::spawn(move || {
                let mine = worker(client, thread, cids, stop, nanos);
                history.lock().expect("history").extend(mine);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));

    // Small pieces: many migrations while the workload writes to the same chunks.
    let drain_start = nanos() / 1_000_000;
    let drain = term(&cluster_dir, &format!("nodedrain {drained} --piece 32"));
    let drain_end = nanos() / 1_000_000;
    println!("drain: {drain}");
    assert_eq!(drain["moved"], CHUNKS as u64, "{drain}");
    assert!(drain["migrations"].as_u64().expect("migrations") >= (CHUNKS / 32) as u64);
    let (left, _) = main
        .blocking()
        .chunks()
        .list(drained, None, 16)
        .expect("list the drained peer");
    assert!(left.is_empty(), "the drained peer still holds {left:?}");
    let mut per_target: Vec<(NodeId, u64)> = drain["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|row| {
            let nid = row["nid"].as_str().expect("nid");
            let id = u16::from_str_radix(nid.trim_start_matches("0x"), 16).expect("hex ID");
            (NodeId(id), row["moved"].as_u64().expect("moved"))
        })
        .collect();
    assert_eq!(per_target.len(), peers.len() - 1, "{drain}");
    assert!(per_target.iter().all(|(_, moved)| *moved > 0), "{drain}");

    // Decommission the drained peer, then kill a new owner at once.
    term(&cluster_dir, &format!("nodeshutdown {drained}"));
    per_target.sort_by_key(|(_, moved)| std::cmp::Reverse(*moved));
    let victim = per_target[0].0;
    let killed_at = nanos();
    cluster.kill(victim.0);
    // Followed from the terminal until the victim's zones are restored.
    let recovered = poll_term(&cluster_dir, "recoverywait --timeout 20", |value| {
        value["done"].as_u64() >= Some(1)
    });
    println!("recovery: {recovered}");
    assert_eq!(recovered["failed"], 0, "{recovered}");
    assert_eq!(recovered["lost"], 0, "{recovered}");
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("workload thread");
    }

    let mut history = std::mem::take(&mut *history.lock().expect("history"));
    for cid in &cids {
        let start = nanos();
        let value = main
            .blocking()
            .chunks()
            .get(*cid)
            .unwrap_or_else(|error| panic!("final read of {cid}: {error}"));
        history.push(Operation {
            key: cid.raw(),
            action: Action::Read(decode(&value)),
            start,
            end: nanos(),
            outcome: Outcome::Ok,
        });
    }
    let acknowledged_after_kill = history
        .iter()
        .filter(|o| {
            matches!(o.action, Action::Write(_)) && o.outcome == Outcome::Ok && o.start > killed_at
        })
        .count();
    println!(
        "{} operations, {acknowledged_after_kill} acknowledged writes after the kill",
        history.len()
    );
    assert!(acknowledged_after_kill > 0, "the workload went on");
    if let Err(error) = history::check(&history, Some(0)) {
        if let history::CheckError::NotLinearizable { key, .. } = &error {
            let mut ops: Vec<&Operation> = history.iter().filter(|o| o.key == *key).collect();
            ops.sort_by_key(|o| o.start);
            for o in ops {
                println!(
                    "{:?} {:?} {}..{} ms",
                    o.action,
                    o.outcome,
                    o.start / 1_000_000,
                    o.end / 1_000_000
                );
            }
        }
        panic!("not linearizable per chunk (drain {drain_start}..{drain_end} ms, kill {} ms): {error:?}", killed_at / 1_000_000);
    }
    let lost = history::lost_writes(&history);
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    // The drained peer is gone from the cluster for good.
    wait_until(Duration::from_secs(10), "the drained peer left", || {
        main.blocking()
            .nodes()
            .map(|nodes| {
                nodes
                    .iter()
                    .any(|n| n.id == drained && n.state != myriad_meta::NodeState::Alive)
            })
            .unwrap_or(false)
    });
    main.shutdown();
}
