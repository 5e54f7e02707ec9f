//! `myriad cluster superpeer add|remove` on a local cluster of real processes: the group
//! grows from one superpeer to three (new processes recorded in `cluster.json`), refuses
//! what cannot work (a peer, an unknown node, a taken ID, a removal that would leave the
//! group without a quorum, the last member) without stopping anything, replaces a killed
//! member, shrinks to one, and keeps its metadata all along; `cluster status` and
//! `cluster stop` know the added superpeers. A second test starts an add while a removal
//! is stuck (a member it needs is held with SIGSTOP): the add waits and goes through once
//! the member runs again and the removal commits.
//!
//! Every node is SIGKILLed when the test ends (the harness's own, and those the subcommand
//! started, found in `cluster.json`), also on a panic.

use std::path::{Path, PathBuf};
use std::time::Duration;

use myriad_client::client::Client;
use myriad_launcher::{LocalCluster, NodeRole};
use myriad_testing::process::{Cluster, Myriad};
use myriad_types::{ChunkId, NodeId};

fn cid(peer: NodeId, lid: u64) -> ChunkId {
    ChunkId::new(peer, lid).expect("a CID")
}

#[path = "support/cluster_dir.rs"]
mod cluster_dir;
use cluster_dir::{client, cluster_cmd, ok, BINARY};

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

/// SIGKILLs every node `cluster.json` records when dropped (the nodes the subcommand
/// started are not the harness's children).
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

fn refused(dir: &Path, args: &[&str], words: &str) -> String {
    let output = cluster_cmd(dir, args, Duration::from_secs(50));
    assert_eq!(output.code(), Some(1), "{args:?}: {}", output.stdout);
    assert!(
        output.stderr.contains(words),
        "{args:?}: expected {words:?} in {}",
        output.stderr
    );
    output.stderr
}

/// The recorded superpeers' names, in order.
fn superpeers(dir: &Path) -> Vec<String> {
    let cluster = LocalCluster::open(dir).expect("cluster.json");
    cluster
        .nodes()
        .iter()
        .filter(|node| node.role == NodeRole::Superpeer)
        .map(|node| node.name.clone())
        .collect()
}

/// The member IDs on the `members:` line of a subcommand's output.
fn members(stdout: &str) -> Vec<String> {
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix("members: "))
        .unwrap_or_else(|| panic!("no members line in {stdout}"));
    let mut ids: Vec<String> = line
        .split(", ")
        .map(|member| member.split('=').next().unwrap_or_default().to_owned())
        .collect();
    ids.sort();
    ids
}

fn alive(dir: &Path, name: &str) -> bool {
    let mut cluster = LocalCluster::open(dir).expect("cluster.json");
    cluster
        .status()
        .iter()
        .any(|status| status.node.name == name && status.alive)
}

#[test]
fn cluster_superpeer_add_and_remove_grow_repair_and_shrink_the_group() {
    let root = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::builder(BINARY, root.path())
        .superpeers(1)
        .peers(1)
        .peer_memory_mb(64)
        .config(CONFIG)
        .keep_logs_on_panic()
        .start();
    let dir = cluster.dir().to_path_buf();
    let _guard = KillRecorded(dir.clone());
    let peer = cluster.peer_ids()[0];

    let first = client(&dir);
    first
        .blocking()
        .name_register("before", cid(peer, 1))
        .expect("register");

    // 1 -> 3: two new processes join and are added.
    let out = ok(&dir, &["superpeer", "add"]);
    assert_eq!(members(&out), ["0x0001", "0x0064"], "{out}");
    let out = ok(&dir, &["superpeer", "add"]);
    assert_eq!(members(&out), ["0x0001", "0x0064", "0x0065"], "{out}");
    assert_eq!(
        superpeers(&dir),
        ["superpeer-1", "superpeer-100", "superpeer-101"]
    );
    let status = ok(&dir, &["status"]);
    assert!(status.contains("superpeer-101"), "{status}");
    // Every node's recorded arguments name the three (used when it is restarted).
    let recorded = LocalCluster::open(&dir).expect("cluster.json");
    for node in recorded.nodes() {
        let at = node
            .args
            .iter()
            .position(|a| a == "--superpeers")
            .expect("list");
        assert_eq!(
            node.args[at + 1],
            recorded.superpeer_list(),
            "{}",
            node.name
        );
        assert_eq!(node.args[at + 1].split(',').count(), 3, "{}", node.name);
    }

    // What cannot work is refused, and nothing is stopped.
    refused(
        &dir,
        &["superpeer", "remove", "--node", "peer-1"],
        "not a superpeer",
    );
    refused(
        &dir,
        &["superpeer", "remove", "--node", "superpeer-9"],
        "no superpeer",
    );
    let peer_id = peer.0.to_string();
    refused(&dir, &["superpeer", "add", "--id", &peer_id], "is taken");
    // A member dies: removing another live one would leave {dead, live}: no quorum.
    ok(&dir, &["kill", "--node", "superpeer-101"]);
    let error = refused(
        &dir,
        &["superpeer", "remove", "--node", "superpeer-1"],
        "without a quorum",
    );
    assert!(error.contains("0x0065"), "names the silent member: {error}");
    assert!(alive(&dir, "superpeer-1"));

    // Repair: the dead member goes, a fresh one comes.
    let out = ok(&dir, &["superpeer", "remove", "--node", "superpeer-101"]);
    assert_eq!(members(&out), ["0x0001", "0x0064"], "{out}");
    // IDs are not reused: 101 stays in the node table as a superpeer that left.
    let out = ok(&dir, &["superpeer", "add"]);
    assert_eq!(members(&out), ["0x0001", "0x0064", "0x0066"], "{out}");
    assert!(alive(&dir, "superpeer-102"));
    client(&dir)
        .blocking()
        .name_register("repaired", cid(peer, 2))
        .expect("register");

    // 3 -> 1: the original superpeer (the leader so far) leaves, then another.
    let out = ok(&dir, &["superpeer", "remove", "--node", "superpeer-1"]);
    assert_eq!(members(&out), ["0x0064", "0x0066"], "{out}");
    assert!(!alive(&dir, "superpeer-1"));
    let out = ok(&dir, &["superpeer", "remove", "--node", "100"]);
    assert_eq!(members(&out), ["0x0066"], "{out}");
    assert_eq!(superpeers(&dir), ["superpeer-102"]);
    refused(
        &dir,
        &["superpeer", "remove", "--node", "superpeer-102"],
        "last superpeer",
    );
    assert!(alive(&dir, "superpeer-102"));

    // The one left holds everything; the first client followed the group to it.
    let last = client(&dir);
    for (name, lid) in [("before", 1), ("repaired", 2)] {
        let got = last.blocking().name_get(name).expect("name_get");
        assert_eq!(got, Some(cid(peer, lid)), "{name}");
    }
    first
        .blocking()
        .name_register("after", cid(peer, 3))
        .expect("the first client follows the group");
    drop((first, last));

    // `cluster stop` stops the added superpeer with the rest.
    let out = ok(&dir, &["stop", "--timeout-secs", "10"]);
    assert!(out.contains("stopped 2 nodes"), "{out}");
    assert!(!alive(&dir, "superpeer-102"));
}

/// The leader's name as the group reports it.
fn leader_name(client: &Client) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(status) = client.blocking().status() {
            if let Some(leader) = status.leader {
                return format!("superpeer-{}", leader.0);
            }
        }
        assert!(std::time::Instant::now() < deadline, "no leader");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_command_during_a_stuck_change_waits_for_it_and_goes_through() {
    let root = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::builder(BINARY, root.path())
        .superpeers(3)
        .peers(0)
        .config(CONFIG)
        .keep_logs_on_panic()
        .start();
    let dir = cluster.dir().to_path_buf();
    let _guard = KillRecorded(dir.clone());
    let client = client(&dir);
    let leader = leader_name(&client);
    let followers: Vec<_> = cluster
        .nodes()
        .iter()
        .filter(|node| node.role == NodeRole::Superpeer && node.name != leader)
        .cloned()
        .collect();
    let (held, removed) = (&followers[0], &followers[1]);

    // A removal the quorum check of `cluster superpeer remove` would refuse, asked for
    // through the terminal: with `held` stopped, the new voter set {leader, held} has no
    // quorum, so the change stays in progress.
    myriad_testing::process::signal(&[held.pid], "STOP");
    let term = {
        let dir = dir.clone();
        let node = removed.node_id;
        std::thread::spawn(move || {
            Myriad::new(BINARY, ["term", "--json", "--cluster"])
                .arg(&dir)
                .arg("-c")
                .arg(format!("superpeerremove {node}"))
                .timeout(Duration::from_secs(30))
                .run()
        })
    };
    let log = dir.join("logs").join(format!("{leader}.log"));
    myriad_testing::process::wait_until(Duration::from_secs(10), "the removal started", || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("removing a superpeer"))
    });
    // The held member runs again a little later: the removal commits, and then the add
    // (until then nothing commits, not even the command's client joining: the joint
    // configuration needs a quorum of {leader, held} as well).
    let resume = {
        let pid = held.pid;
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            myriad_testing::process::signal(&[pid], "CONT");
        })
    };
    let output = cluster_cmd(
        &dir,
        &["superpeer", "add", "--timeout-secs", "20"],
        Duration::from_secs(50),
    );
    resume.join().expect("resume");
    let term = term.join().expect("term");
    assert!(
        output.success(),
        "{}\n{}\nterm: {}{}",
        output.stdout,
        output.stderr,
        term.stdout,
        term.stderr
    );
    assert_eq!(term.code(), Some(0), "{}{}", term.stdout, term.stderr);
    let mut ids = members(&output.stdout);
    ids.retain(|id| *id != format!("0x{:04x}", removed.node_id));
    assert_eq!(ids.len(), 3, "{}", output.stdout);
    assert!(!members(&output.stdout).contains(&format!("0x{:04x}", removed.node_id)));
}
