//! `myriad superpeer` as real processes: a group of three survives twenty leader kills
//! with its metadata intact, while clients register and read names throughout (the
//! history of every name, through the kills, is linearizable: each acknowledged
//! registration is read back with its value); a peer that stops answering heartbeats is
//! declared failed and the other members hear of it; configuration errors and SIGTERM end
//! the process cleanly.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use myriad_client::membership::{JoinConfig, Membership};
use myriad_meta::Role;
use myriad_net::{Endpoint, Fault, Handlers};
use myriad_proto::meta::{Event, MetaReply, MetaRequest, StatusReply};
use myriad_proto::types;
use myriad_testing::history::{self, Action, Operation, Outcome};
use myriad_testing::process::{signal, wait_until, Myriad, Process};
use myriad_types::{ChunkId, NodeId};
use rand::{Rng, SeedableRng};

const BINARY: &str = env!("CARGO_BIN_EXE_myriad");

/// Short Raft timings and fast failure detection, so the test stays well under a minute.
const CONFIG: &str = r#"
[superpeer]
election_timeout_min_ms = 200
election_timeout_max_ms = 400
raft_heartbeat_ms = 50
request_timeout_ms = 2000

[failure]
heartbeat_interval_ms = 100
failure_timeout_ms = 600
"#;

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// A superpeer group's files and its processes (each killed when dropped, also when the
/// test panics).
struct Group {
    dir: tempfile::TempDir,
    config: PathBuf,
    /// The cluster secret's file (mode 0600) and its content.
    secret_file: PathBuf,
    secret: Vec<u8>,
    members: Vec<(NodeId, SocketAddr)>,
    processes: Vec<Process>,
}

impl Group {
    fn new(count: u16) -> Group {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("myriad.toml");
        std::fs::write(&config, CONFIG).unwrap();
        let secret_file = dir.path().join("secret");
        let secret = myriad_net::secret::create_file(&secret_file).unwrap();
        let members = (1..=count).map(|id| (NodeId(id), free_port())).collect();
        Group {
            dir,
            config,
            secret_file,
            secret,
            members,
            processes: Vec::new(),
        }
    }

    fn superpeers_flag(&self) -> String {
        self.members
            .iter()
            .map(|(id, address)| format!("{}={address}", id.0))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn ready_file(&self, id: NodeId) -> PathBuf {
        self.dir.path().join(format!("ready-{}", id.0))
    }

    fn spawn(&self, id: NodeId) -> Process {
        let ready = self.ready_file(id);
        let _ = std::fs::remove_file(&ready);
        let process = Process::spawn(
            Command::new(BINARY)
                .arg("superpeer")
                .arg("--config")
                .arg(&self.config)
                .arg("--id")
                .arg(id.0.to_string())
                .arg("--superpeers")
                .arg(self.superpeers_flag())
                .arg("--data-dir")
                .arg(self.dir.path().join(format!("sp{}", id.0)))
                .arg("--secret-file")
                .arg(&self.secret_file)
                .arg("--ready-file")
                .arg(&ready)
                .env("RUST_LOG", "warn")
                .env_remove("RUST_BACKTRACE")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            &format!("superpeer {}", id.0),
        );
        wait_ready(&ready, id);
        process
    }

    fn start_all(&mut self) {
        let ids: Vec<NodeId> = self.members.iter().map(|(id, _)| *id).collect();
        for id in ids {
            let process = self.spawn(id);
            self.processes.push(process);
        }
    }

    fn index(&self, id: NodeId) -> usize {
        self.members
            .iter()
            .position(|(member, _)| *member == id)
            .unwrap()
    }
}

fn wait_ready(path: &Path, id: NodeId) {
    wait_until(
        Duration::from_secs(10),
        &format!("superpeer {} to be ready", id.0),
        || std::fs::read_to_string(path).is_ok(),
    );
    let text = std::fs::read_to_string(path).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(line["role"], "superpeer");
    assert_eq!(line["node_id"], u64::from(id.0));
    assert!(line["pid"].as_u64().is_some());
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn join(group: &Group, role: Role) -> (Endpoint, Arc<Membership>) {
    let mut config = JoinConfig::new(group.members.clone(), role);
    config.secret = group.secret.clone();
    config.request_timeout = Duration::from_secs(10);
    Membership::join(config, Handlers::new()).await.unwrap()
}

/// One superpeer's own view (asked directly, not through the leader).
async fn status_of(membership: &Membership, id: NodeId) -> Option<StatusReply> {
    let reply = membership
        .net()
        .request(
            id,
            types::META_REQUEST,
            MetaRequest::Status.encode(),
            Duration::from_millis(500),
        )
        .await
        .ok()?;
    match MetaReply::decode(reply).ok()? {
        MetaReply::Status(status) => Some(status),
        _ => None,
    }
}

/// The leader that a live superpeer other than `excluded` reports, within `timeout`.
async fn wait_leader(
    group: &Group,
    membership: &Membership,
    excluded: Option<NodeId>,
    timeout: Duration,
) -> Option<NodeId> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        for (id, _) in &group.members {
            if Some(*id) == excluded {
                continue;
            }
            if let Some(status) = status_of(membership, *id).await {
                if let Some(leader) = status.leader.filter(|leader| Some(*leader) != excluded) {
                    // Confirm with the leader itself.
                    if status_of(membership, leader)
                        .await
                        .is_some_and(|own| own.leader == Some(leader))
                    {
                        return Some(leader);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Metadata writers during the leader kills: each task registers its own names (one
/// writer per name, so a write the client retried after a lost answer cannot interleave
/// with another's) and reads everyone's.
const NAME_WRITERS: u64 = 3;
/// Names per writer.
const NAMES_PER_WRITER: u64 = 4;

/// The name of register `key` (writer `key / NAMES_PER_WRITER`).
fn register_name(key: u64) -> String {
    format!("register-{key}")
}

/// Registrations and reads of the writers' names until `stop`, each recorded with its
/// times on `clock` and its outcome: a registration's value is its (unique) CID, a failed
/// or unanswered call is unknown.
async fn name_workload(
    client: Arc<Membership>,
    writer: u64,
    clock: Instant,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<Vec<Operation>>>,
) {
    let nanos = || clock.elapsed().as_nanos() as u64;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(writer);
    let keys = NAME_WRITERS * NAMES_PER_WRITER;
    let mut sequence = 0u64;
    let mut mine = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let start = nanos();
        let operation = if rng.gen_bool(0.5) {
            let key = writer * NAMES_PER_WRITER + rng.gen_range(0..NAMES_PER_WRITER);
            sequence += 1;
            let cid = ChunkId::new(NodeId(200 + writer as u16), sequence).unwrap();
            let result = client
                .write(myriad_meta::Command::NameRegister {
                    name: register_name(key),
                    cid,
                })
                .await;
            Operation {
                key,
                action: Action::Write(cid.raw()),
                start,
                end: nanos(),
                outcome: if result.is_ok() {
                    Outcome::Ok
                } else {
                    Outcome::Unknown
                },
            }
        } else {
            let key = rng.gen_range(0..keys);
            let reply = client
                .request(MetaRequest::NameGet(register_name(key)))
                .await;
            let (action, outcome) = match reply {
                Ok(MetaReply::Name(cid)) => (Action::Read(cid.map(ChunkId::raw)), Outcome::Ok),
                _ => (Action::Read(None), Outcome::Unknown),
            };
            Operation {
                key,
                action,
                start,
                end: nanos(),
                outcome,
            }
        };
        mine.push(operation);
    }
    history.lock().unwrap().extend(mine);
}

#[test]
fn group_survives_twenty_leader_kills_with_names_intact() {
    let started = Instant::now();
    let mut group = Group::new(3);
    group.start_all();
    let runtime = runtime();
    let (_endpoint, client) = runtime.block_on(join(&group, Role::Client));
    let names: Vec<(String, ChunkId)> = (0..10)
        .map(|index| {
            (
                format!("name-{index}"),
                ChunkId::new(NodeId(100 + index), u64::from(index)).unwrap(),
            )
        })
        .collect();
    runtime.block_on(async {
        for (name, cid) in &names {
            client
                .write(myriad_meta::Command::NameRegister {
                    name: name.clone(),
                    cid: *cid,
                })
                .await
                .unwrap();
        }
    });
    // Registrations and reads run through every kill below.
    let clock = Instant::now();
    let nanos = || clock.elapsed().as_nanos() as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..NAME_WRITERS)
        .map(|writer| {
            runtime.spawn(name_workload(
                Arc::clone(&client),
                writer,
                clock,
                Arc::clone(&stop),
                Arc::clone(&history),
            ))
        })
        .collect();
    // From each kill to the new leader's election.
    let mut leaderless = Vec::new();
    for round in 0..20 {
        let leader = runtime
            .block_on(wait_leader(&group, &client, None, Duration::from_secs(5)))
            .unwrap_or_else(|| panic!("round {round}: no leader"));
        let index = group.index(leader);
        group.processes[index].kill();
        let killed_at = Instant::now();
        let killed_nanos = nanos();
        let new_leader = runtime
            .block_on(wait_leader(
                &group,
                &client,
                Some(leader),
                Duration::from_secs(5),
            ))
            .unwrap_or_else(|| {
                panic!("round {round}: no new leader within 5 s after killing {leader:?}")
            });
        assert_ne!(new_leader, leader);
        let elected_after = killed_at.elapsed();
        leaderless.push((killed_nanos, nanos()));
        runtime.block_on(async {
            for (name, cid) in &names {
                let reply = client.request(MetaRequest::NameGet(name.clone())).await;
                assert_eq!(
                    reply.unwrap(),
                    MetaReply::Name(Some(*cid)),
                    "round {round}: {name} lost"
                );
            }
        });
        // Restart the killed superpeer on its data directory.
        group.processes[index] = group.spawn(leader);
        // It serves again and knows the leader before the next round.
        let rejoined = runtime.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if status_of(&client, leader)
                    .await
                    .is_some_and(|status| status.leader.is_some())
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        });
        assert!(
            rejoined,
            "round {round}: restarted superpeer {leader:?} found no leader"
        );
        eprintln!(
            "round {round}: killed {leader:?}, new leader {new_leader:?} after {elected_after:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        runtime.block_on(writer).expect("name workload task");
    }
    // Every register once more, after the kills (through the leader, linearizable).
    let mut history = std::mem::take(&mut *history.lock().unwrap());
    runtime.block_on(async {
        for key in 0..NAME_WRITERS * NAMES_PER_WRITER {
            let start = nanos();
            let reply = client
                .request(MetaRequest::NameGet(register_name(key)))
                .await;
            let cid = match reply {
                Ok(MetaReply::Name(cid)) => cid,
                other => panic!("final read of {}: {other:?}", register_name(key)),
            };
            history.push(Operation {
                key,
                action: Action::Read(cid.map(ChunkId::raw)),
                start,
                end: nanos(),
                outcome: Outcome::Ok,
            });
        }
    });
    let count = |write: bool, outcome: Outcome| {
        history
            .iter()
            .filter(|o| matches!(o.action, Action::Write(_)) == write && o.outcome == outcome)
            .count()
    };
    // Acknowledged registrations that were waiting while the group had no leader.
    let across_kills = history
        .iter()
        .filter(|o| {
            matches!(o.action, Action::Write(_))
                && o.outcome == Outcome::Ok
                && leaderless
                    .iter()
                    .any(|&(killed, elected)| o.start < elected && o.end > killed)
        })
        .count();
    println!(
        "names: {} registrations acknowledged ({across_kills} of them across a kill), {} unknown; {} reads acknowledged, {} unknown",
        count(true, Outcome::Ok),
        count(true, Outcome::Unknown),
        count(false, Outcome::Ok),
        count(false, Outcome::Unknown),
    );
    assert!(
        across_kills > 0,
        "no registration ran across a leader kill: the workload did not test the kills"
    );
    history::check(&history, None).expect("the names' history is linearizable per name");
    let lost = history::lost_writes(&history);
    assert!(lost.is_empty(), "acknowledged registrations lost: {lost:?}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn silent_peer_is_declared_failed_and_another_member_hears_it() {
    let mut group = Group::new(3);
    group.start_all();
    let runtime = runtime();
    let (_client_endpoint, client) = runtime.block_on(join(&group, Role::Client));
    let mut events = client.subscribe();
    let (_peer_endpoint, peer) = runtime.block_on(join(&group, Role::Peer));
    let id = peer.node_id();
    // The peer stops answering: everything from the superpeers is discarded from now on.
    let silenced = Instant::now();
    for (superpeer, _) in &group.members {
        peer.net().set_fault(*superpeer, Fault::Partition);
    }
    let heard = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match events.recv().await {
                    Ok(Event::NodeFailed(node)) if node == id => return,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(error) => panic!("event stream ended: {error}"),
                }
            }
        })
        .await
    });
    let elapsed = silenced.elapsed();
    assert!(heard.is_ok(), "no NodeFailed event within 5 s");
    assert!(
        elapsed < Duration::from_millis(2500),
        "verdict took {elapsed:?}"
    );
    assert!(!myriad_client::directory::Directory::is_alive(&*client, id));
}

#[test]
fn bad_configuration_exits_nonzero_with_a_reason() {
    let secret_dir = tempfile::tempdir().unwrap();
    let group_secret = secret_dir.path().join("secret");
    myriad_net::secret::create_file(&group_secret).unwrap();
    let output = Myriad::new(
        BINARY,
        ["superpeer", "--id", "4", "--superpeers", "1=127.0.0.1:1"],
    )
    .env("MYRIAD_SECRET_FILE", &group_secret)
    .env_remove("RUST_BACKTRACE")
    .run();
    assert!(!output.success());
    let stderr = &output.stderr;
    assert!(
        stderr.contains("not among the configured superpeers"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[failure]\nheartbeat = 1\n").unwrap();
    let output = Myriad::new(BINARY, ["superpeer", "--config"])
        .arg(&config)
        .env_remove("RUST_BACKTRACE")
        .run();
    assert!(!output.success());
    let stderr = &output.stderr;
    assert!(stderr.contains("heartbeat"), "{stderr}");
}

#[test]
fn sigterm_stops_cleanly_and_a_second_process_on_the_directory_is_refused() {
    let group = Group::new(1);
    let mut process = group.spawn(NodeId(1));
    // A second superpeer on the same data directory fails with a clear error.
    let output = Myriad::new(BINARY, ["superpeer", "--id", "1", "--superpeers"])
        .arg(format!("1=127.0.0.1:{}", free_port().port()))
        .arg("--data-dir")
        .arg(group.dir.path().join("sp1"))
        .arg("--secret-file")
        .arg(&group.secret_file)
        .env_remove("RUST_BACKTRACE")
        .run();
    assert!(!output.success());
    let stderr = &output.stderr;
    assert!(stderr.contains("in use by another process"), "{stderr}");

    signal(&[process.pid()], "TERM");
    let exit = process.wait_exit(Duration::from_secs(10), "the superpeer after SIGTERM");
    assert!(exit.success(), "exit status {exit:?}");
}
