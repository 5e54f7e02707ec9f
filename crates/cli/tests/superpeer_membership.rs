//! The superpeer group goes 1 -> 3 -> 5 -> 3 under load, with real processes
//! (`myriad cluster superpeer add|remove`), while client threads in this process register
//! and read names (each name is a register; every write binds a unique value). Superpeers
//! are SIGKILLed *during* membership changes:
//!
//! - 3 -> 4: the joining superpeer is held (SIGSTOP) so that the leader's change waits for
//!   it to catch up, and the leader is SIGKILLed then; the add is retried (by the client on
//!   the new leader, and once more by the test) and must end with the new member voting; the
//!   old leader is restarted from its data and rejoins.
//! - 4 -> 5: the joining superpeer is held, then SIGKILLed while the leader waits for it;
//!   the command must fail saying how to retry, and its retry (which restarts the joiner)
//!   must add it.
//! - 5 -> 3: with two members held, removing a third is refused (the remaining voters would
//!   lack a quorum) and nothing stops; once they run again the retry succeeds; then the
//!   leader itself is removed.
//!
//! After every step the clients are paused, each name is read once more, and the whole
//! history so far must be linearizable (`myriad_testing::history`) with no acknowledged
//! write lost; the group must answer. Every process is SIGKILLed when the test ends (the
//! harness's nodes and those the subcommand started, found in `cluster.json`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use myriad_client::client::Client;
use myriad_client::ClientError;
use myriad_launcher::{LocalCluster, NodeRole};
use myriad_testing::history::{self, Action, Operation, Outcome};
use myriad_testing::process::{signal, wait_until, Cluster, Output};
use myriad_types::ChunkId;

#[path = "support/cluster_dir.rs"]
mod cluster_dir;
use cluster_dir::{client, cluster_cmd, ok, BINARY};
/// Names the clients write and read (one register each).
const KEYS: u64 = 3;
/// Client threads.
const CLIENTS: usize = 3;

/// Short Raft timings and fast failure detection, so the test stays well under a minute.
const CONFIG: &str = r#"
[superpeer]
election_timeout_min_ms = 200
election_timeout_max_ms = 400
raft_heartbeat_ms = 50
request_timeout_ms = 2000

[failure]
heartbeat_interval_ms = 100
failure_timeout_ms = 800
"#;

/// SIGKILLs every node `cluster.json` records when dropped.
struct KillRecorded(PathBuf);

impl Drop for KillRecorded {
    fn drop(&mut self) {
        if let Ok(mut cluster) = LocalCluster::open(&self.0) {
            let names: Vec<String> = cluster.nodes().iter().map(|n| n.name.clone()).collect();
            for name in names {
                let _ = cluster.kill_named(&name);
            }
        }
    }
}

/// The clients' shared record: the history, a gate that pauses them, a clock.
struct Load {
    history: Mutex<Vec<Operation>>,
    /// Each operation holds it for reading; a step check takes it for writing.
    gate: RwLock<()>,
    stop: AtomicBool,
    next_value: AtomicU64,
    epoch: Instant,
    acknowledged_writes: AtomicU64,
}

impl Load {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn name(key: u64) -> String {
        format!("register-{key}")
    }

    /// One write or read of `key` through `client`, recorded.
    fn operate(&self, client: &Client, key: u64, write: bool) {
        let b = client.blocking();
        let start = self.now();
        let (action, outcome) = if write {
            let value = self.next_value.fetch_add(1, Ordering::Relaxed);
            let outcome = match b.name_register(&Self::name(key), ChunkId::from_raw(value)) {
                Ok(()) => {
                    self.acknowledged_writes.fetch_add(1, Ordering::Relaxed);
                    Outcome::Ok
                }
                Err(ClientError::Meta(_) | ClientError::InvalidArgument(_)) => Outcome::Failed,
                // Timeouts, lost connections, no leader: it may have been applied.
                Err(_) => Outcome::Unknown,
            };
            (Action::Write(value), outcome)
        } else {
            match b.name_get(&Self::name(key)) {
                Ok(found) => (Action::Read(found.map(ChunkId::raw)), Outcome::Ok),
                Err(_) => (Action::Read(None), Outcome::Unknown),
            }
        };
        let end = self.now();
        self.history.lock().expect("history").push(Operation {
            key,
            action,
            start,
            end,
            outcome,
        });
    }
}

fn run_clients(load: &Arc<Load>, dir: &Path) -> Vec<thread::JoinHandle<()>> {
    (0..CLIENTS)
        .map(|index| {
            let load = Arc::clone(load);
            let client = client(dir);
            thread::spawn(move || {
                let mut step = index as u64;
                while !load.stop.load(Ordering::Relaxed) {
                    step += 1;
                    let _open = load.gate.read().expect("gate");
                    load.operate(&client, step % KEYS, !step.is_multiple_of(3));
                }
                client.shutdown();
            })
        })
        .collect()
}

/// Pauses the clients, reads every name once more, and checks the history so far: it is
/// linearizable and no acknowledged write is lost. Also that the group answers, with
/// `members` members.
fn check_step(load: &Load, checker: &Client, members: usize, step: &str) {
    let _paused = load.gate.write().expect("gate");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match checker.blocking().status() {
            Ok(status) if status.leader.is_some() && status.members.len() == members => break,
            other => assert!(
                Instant::now() < deadline,
                "{step}: the group does not answer with {members} members and a leader: {other:?}"
            ),
        }
        thread::sleep(Duration::from_millis(100));
    }
    for key in 0..KEYS {
        // The final read must be acknowledged: retry until the group answers.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let before = load.history.lock().expect("history").len();
            load.operate(checker, key, false);
            let history = load.history.lock().expect("history");
            if history[before..].iter().any(|op| op.outcome == Outcome::Ok) {
                break;
            }
            assert!(Instant::now() < deadline, "{step}: no read of key {key}");
        }
    }
    let history = load.history.lock().expect("history").clone();
    if let Err(error) = history::check(&history, None) {
        panic!("{step}: {error}");
    }
    let lost = history::lost_writes(&history);
    assert!(
        lost.is_empty(),
        "{step}: acknowledged writes lost: {lost:?}"
    );
    eprintln!(
        "{step}: {} operations linearizable, {} acknowledged writes, at {:?}",
        history.len(),
        load.acknowledged_writes.load(Ordering::Relaxed),
        load.epoch.elapsed()
    );
}

/// The leader's name, as the group reports it.
fn leader(checker: &Client) -> String {
    let mut name = String::new();
    wait_until(Duration::from_secs(10), "a leader", || {
        match checker.blocking().status() {
            Ok(status) => match status.leader {
                Some(leader) => {
                    name = format!("superpeer-{}", leader.0);
                    true
                }
                None => false,
            },
            Err(_) => false,
        }
    });
    name
}

/// Whether the group's member list (voters and learners) names `id` (`0x006e`).
fn is_listed(checker: &Client, id: &str) -> bool {
    checker.blocking().status().is_ok_and(|status| {
        status
            .members
            .iter()
            .any(|(member, _)| member.to_string() == id)
    })
}

/// Whether `name`'s log has a line with every one of `words`.
fn log_has(dir: &Path, name: &str, words: &[&str]) -> bool {
    let log =
        std::fs::read_to_string(dir.join("logs").join(format!("{name}.log"))).unwrap_or_default();
    log.lines()
        .any(|line| words.iter().all(|word| line.contains(word)))
}

/// Starts a joining superpeer through the harness's launcher (a child of this test), holds
/// it with SIGSTOP, and returns its name, node ID text and pid.
fn held_joiner(cluster: &mut Cluster, id: u16) -> (String, String, u32) {
    let launcher = cluster.launcher_mut();
    launcher.reload().expect("reload cluster.json");
    let entry = launcher.spawn_superpeer(id).expect("a joining superpeer");
    signal(&[entry.pid], "STOP");
    (entry.name, format!("0x{id:04x}"), entry.pid)
}

/// Runs `myriad cluster superpeer add --node NAME` on a thread of its own.
fn add_in_background(dir: &Path, name: &str, timeout_secs: u64) -> thread::JoinHandle<Output> {
    let dir = dir.to_path_buf();
    let name = name.to_owned();
    thread::spawn(move || {
        let timeout = timeout_secs.to_string();
        cluster_cmd(
            &dir,
            &[
                "superpeer",
                "add",
                "--node",
                &name,
                "--timeout-secs",
                &timeout,
            ],
            Duration::from_secs(timeout_secs + 20),
        )
    })
}

fn superpeer_names(dir: &Path) -> Vec<String> {
    LocalCluster::open(dir)
        .expect("cluster.json")
        .nodes()
        .iter()
        .filter(|node| node.role == NodeRole::Superpeer)
        .map(|node| node.name.clone())
        .collect()
}

#[test]
fn one_three_five_three_with_kills_during_changes_stays_linearizable() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::builder(BINARY, root.path())
        .superpeers(1)
        .peers(1)
        .peer_memory_mb(64)
        .config(CONFIG)
        .keep_logs_on_panic()
        .start();
    let dir = cluster.dir().to_path_buf();
    let _guard = KillRecorded(dir.clone());
    let load = Arc::new(Load {
        history: Mutex::new(Vec::new()),
        gate: RwLock::new(()),
        stop: AtomicBool::new(false),
        next_value: AtomicU64::new(1),
        epoch: Instant::now(),
        acknowledged_writes: AtomicU64::new(0),
    });
    let clients = run_clients(&load, &dir);
    let checker = client(&dir);
    thread::sleep(Duration::from_millis(300));
    check_step(&load, &checker, 1, "one superpeer");

    // 1 -> 3.
    ok(&dir, &["superpeer", "add"]);
    ok(&dir, &["superpeer", "add"]);
    check_step(&load, &checker, 3, "1 -> 3");

    // 3 -> 4, the leader SIGKILLed while it waits for the (held) joiner to catch up.
    let old_leader = leader(&checker);
    let (joiner, joiner_id, joiner_pid) = held_joiner(&mut cluster, 110);
    let adding = add_in_background(&dir, &joiner, 15);
    wait_until(
        Duration::from_secs(10),
        "the joiner added as a learner",
        || {
            log_has(&dir, &old_leader, &["adding a superpeer", &joiner_id])
                && is_listed(&checker, &joiner_id)
        },
    );
    // The leader now waits for the held learner to catch up before it promotes it.
    assert_eq!(
        leader(&checker),
        old_leader,
        "the leader changed on its own"
    );
    cluster.kill_named(&old_leader);
    signal(&[joiner_pid], "CONT");
    let first = adding.join().expect("the add command");
    eprintln!(
        "add during the leader's death: exit {:?}\n{}{}",
        first.code(),
        first.stdout,
        first.stderr
    );
    if !first.success() {
        assert!(
            first.stderr.contains("retry") || first.stderr.contains("refused"),
            "a failed add says what to do: {}",
            first.stderr
        );
    }
    // Retried (again, if it worked already: adding is idempotent).
    let out = ok(&dir, &["superpeer", "add", "--node", &joiner]);
    assert!(out.contains(&joiner_id), "{out}");
    // The old leader comes back from its Raft state and rejoins as a follower.
    ok(&dir, &["restart", "--node", &old_leader]);
    check_step(
        &load,
        &checker,
        4,
        "3 -> 4, leader killed during the change",
    );

    // 4 -> 5, the joiner SIGKILLed while the leader waits for it.
    let current = leader(&checker);
    let (joiner, joiner_id, _) = held_joiner(&mut cluster, 111);
    let adding = add_in_background(&dir, &joiner, 5);
    wait_until(
        Duration::from_secs(10),
        "the joiner added as a learner",
        || {
            log_has(&dir, &current, &["adding a superpeer", &joiner_id])
                && is_listed(&checker, &joiner_id)
        },
    );
    cluster.kill_named(&joiner);
    let failed = adding.join().expect("the add command");
    assert_eq!(failed.code(), Some(1), "{}{}", failed.stdout, failed.stderr);
    assert!(
        failed.stderr.contains("--node") && failed.stderr.contains(&joiner),
        "the failure says how to retry: {}",
        failed.stderr
    );
    // The retry restarts the joiner from its directory and adds it.
    let out = ok(&dir, &["superpeer", "add", "--node", &joiner]);
    assert!(out.contains(&joiner_id), "{out}");
    check_step(
        &load,
        &checker,
        5,
        "4 -> 5, joiner killed during the change",
    );

    // 5 -> 3: with two followers held, removing a third would leave no quorum.
    cluster.launcher_mut().reload().expect("reload");
    let current = leader(&checker);
    let followers: Vec<String> = superpeer_names(&dir)
        .into_iter()
        .filter(|name| *name != current)
        .collect();
    let held: Vec<u32> = followers[..2]
        .iter()
        .map(|name| cluster.find(name).expect("recorded").pid)
        .collect();
    signal(&held, "STOP");
    let refused = cluster_cmd(
        &dir,
        &["superpeer", "remove", "--node", &followers[2]],
        Duration::from_secs(40),
    );
    signal(&held, "CONT");
    assert_eq!(refused.code(), Some(1), "{}", refused.stdout);
    assert!(
        refused.stderr.contains("without a quorum"),
        "{}",
        refused.stderr
    );
    assert!(superpeer_names(&dir).contains(&followers[2]));
    ok(&dir, &["superpeer", "remove", "--node", &followers[2]]);
    check_step(&load, &checker, 4, "5 -> 4, after a refused removal");
    // The leader removes itself.
    let current = leader(&checker);
    let out = ok(&dir, &["superpeer", "remove", "--node", &current]);
    assert!(out.contains("removed"), "{out}");
    assert_eq!(superpeer_names(&dir).len(), 3);
    check_step(&load, &checker, 3, "4 -> 3, the leader removed");

    load.stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("a client thread");
    }
    checker.shutdown();
    let acknowledged = load.acknowledged_writes.load(Ordering::Relaxed);
    assert!(
        acknowledged > 50,
        "only {acknowledged} writes were acknowledged"
    );
}
