//! `myriad superpeer` as real processes: a group of three survives twenty leader kills
//! with its metadata intact; a peer that stops answering heartbeats is declared failed and
//! the other members hear of it; configuration errors and SIGTERM end the process cleanly.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use myriad_client::membership::{JoinConfig, Membership};
use myriad_meta::Role;
use myriad_net::{Endpoint, Fault, Handlers};
use myriad_proto::meta::{Event, MetaReply, MetaRequest, StatusReply};
use myriad_proto::types;
use myriad_testing::process::{signal, wait_until, Myriad, Process};
use myriad_types::{ChunkId, NodeId};

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
    members: Vec<(NodeId, SocketAddr)>,
    processes: Vec<Process>,
}

impl Group {
    fn new(count: u16) -> Group {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("myriad.toml");
        std::fs::write(&config, CONFIG).unwrap();
        let members = (1..=count).map(|id| (NodeId(id), free_port())).collect();
        Group {
            dir,
            config,
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
                .arg("--secret")
                .arg("myriad")
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
    for round in 0..20 {
        let leader = runtime
            .block_on(wait_leader(&group, &client, None, Duration::from_secs(5)))
            .unwrap_or_else(|| panic!("round {round}: no leader"));
        let index = group.index(leader);
        group.processes[index].kill();
        let killed_at = Instant::now();
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
    assert!(
        started.elapsed() < Duration::from_secs(90),
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
    let output = Myriad::new(
        BINARY,
        ["superpeer", "--id", "4", "--superpeers", "1=127.0.0.1:1"],
    )
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
        .env_remove("RUST_BACKTRACE")
        .run();
    assert!(!output.success());
    let stderr = &output.stderr;
    assert!(stderr.contains("in use by another process"), "{stderr}");

    signal(&[process.pid()], "TERM");
    let exit = process.wait_exit(Duration::from_secs(10), "the superpeer after SIGTERM");
    assert!(exit.success(), "exit status {exit:?}");
}
