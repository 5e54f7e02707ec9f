//! Superpeer group changes with real processes on 127.0.0.1 (`myriad superpeer`,
//! `myriad peer`, `myriad term`): a group of one grows to three (`superpeeradd` of two
//! superpeers started with `--join`); the original leader is killed and the two others
//! elect a leader and keep the metadata (names, chunk lookups); the lost member is
//! removed (`superpeerremove`) and a fresh one added in its place; then another original
//! member is killed and the group (now with the replacement in its quorum) still serves
//! every name registered along the way, and the chunk written at the start.
//! A second test shuts superpeers down cleanly from the terminal (`nodeshutdown` of a
//! superpeer: it leaves the Raft group, then its process exits 0), the leader first, and
//! the rest of the group keeps serving.
//!
//! Every process is SIGKILLed when the test ends (also on a panic); node logs go to files
//! in the test directory (kept and named on a panic).

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use myriad_testing::process::{wait_until, Myriad, Process};

const BINARY: &str = env!("CARGO_BIN_EXE_myriad");
const RUN_TIMEOUT: Duration = Duration::from_secs(40);

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

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address")
}

struct Nodes {
    dir: PathBuf,
    config: PathBuf,
    secret_file: PathBuf,
    processes: Vec<(String, Process)>,
    keep: Option<tempfile::TempDir>,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for (_, process) in &mut self.processes {
            process.kill();
        }
        if std::thread::panicking() {
            if let Some(dir) = self.keep.take() {
                eprintln!("node logs kept in {}", dir.keep().display());
            }
        }
    }
}

impl Nodes {
    fn new() -> Nodes {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().to_path_buf();
        let config = dir.join("myriad.toml");
        std::fs::write(&config, CONFIG).expect("config");
        let secret_file = dir.join("secret");
        myriad_net::secret::create_file(&secret_file).expect("secret");
        Nodes {
            dir,
            config,
            secret_file,
            processes: Vec::new(),
            keep: Some(temp),
        }
    }

    /// Starts `myriad <args>` named `name`, waits for its ready file.
    fn start(&mut self, name: &str, args: &[String]) {
        let ready = self.dir.join(format!("{name}.ready"));
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).expect("log");
        let process = Process::spawn(
            Command::new(BINARY)
                .args(args)
                .arg("--config")
                .arg(&self.config)
                .arg("--data-dir")
                .arg(self.dir.join(name))
                .arg("--secret-file")
                .arg(&self.secret_file)
                .arg("--ready-file")
                .arg(&ready)
                .arg("--exit-with-parent")
                .arg(std::process::id().to_string())
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log),
            name,
        );
        self.processes.push((name.to_owned(), process));
        wait_until(Duration::from_secs(20), &format!("{name} ready"), || {
            std::fs::read_to_string(&ready).is_ok_and(|text| text.ends_with('\n'))
        });
    }

    fn superpeer(&mut self, id: u16, listen: SocketAddr, superpeers: &str, join: bool) {
        let mut args = vec![
            "superpeer".to_owned(),
            "--id".into(),
            id.to_string(),
            "--listen".into(),
            listen.to_string(),
            "--superpeers".into(),
            superpeers.into(),
        ];
        if join {
            args.push("--join".into());
        }
        self.start(&format!("superpeer-{id}"), &args);
    }

    fn process(&mut self, name: &str) -> &mut Process {
        let (_, process) = self
            .processes
            .iter_mut()
            .find(|(n, _)| n == name)
            .expect("a started node");
        process
    }

    fn kill(&mut self, name: &str) {
        self.process(name).kill();
    }

    fn peer_id(&self) -> u16 {
        let text = std::fs::read_to_string(self.dir.join("peer.ready")).expect("peer ready");
        let line: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
        line["node_id"].as_u64().expect("node_id") as u16
    }

    /// `myriad term --json --superpeers LIST -c script`: exit code and JSON lines.
    fn term(&self, superpeers: &str, script: &str) -> (Option<i32>, Vec<serde_json::Value>) {
        let output = Myriad::new(BINARY, ["term", "--json", "--superpeers", superpeers])
            .arg("--secret-file")
            .arg(&self.secret_file)
            .arg("-c")
            .arg(script)
            .env_remove("MYRIAD_SECRET_FILE")
            .timeout(RUN_TIMEOUT)
            .run();
        let values = output
            .stdout
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
            .collect();
        (output.code(), values)
    }

    fn term_ok(&self, superpeers: &str, script: &str) -> Vec<serde_json::Value> {
        let (code, values) = self.term(superpeers, script);
        assert_eq!(code, Some(0), "{script}: {values:?}");
        values
    }
}

/// The member IDs of a `superpeeradd`/`superpeerremove` answer.
fn member_ids(value: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = value["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members in {value}"))
        .iter()
        .map(|member| member["nid"].as_str().expect("nid").to_owned())
        .collect();
    ids.sort();
    ids
}

fn list(members: &[(u16, SocketAddr)]) -> String {
    members
        .iter()
        .map(|(id, address)| format!("{id}={address}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Registers `name` → `cid` (retrying while a new leader settles), then returns.
fn register(nodes: &Nodes, superpeers: &str, name: &str, cid: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, values) = nodes.term(superpeers, &format!("namereg {cid} {name}"));
        if code == Some(0) {
            return;
        }
        assert!(Instant::now() < deadline, "namereg {name}: {values:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_group_grows_loses_its_leader_is_repaired_and_keeps_its_metadata() {
    let mut nodes = Nodes::new();
    // Superpeers added later take IDs no peer has (peers take the lowest free IDs).
    let addresses: Vec<(u16, SocketAddr)> = [1, 101, 102, 103].map(|id| (id, free_port())).into();
    let (one, two, three, four) = (addresses[0], addresses[1], addresses[2], addresses[3]);
    let all = list(&addresses[..3]);

    // A group of one, a peer that knows the three future members.
    nodes.superpeer(1, one.1, &list(&[one]), false);
    nodes.start(
        "peer",
        &[
            "peer".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--superpeers".into(),
            all.clone(),
            "--memory-mb".into(),
            "64".into(),
        ],
    );
    let peer = format!("0x{:04x}", nodes.peer_id());
    let only_one = list(&[one]);
    let values = nodes.term_ok(&only_one, &format!("chunkcreate 8 {peer} 1"));
    let cid = values[0][0]["cid"].as_str().expect("a CID").to_owned();
    nodes.term_ok(&only_one, &format!("chunkput {cid} abcdefgh"));
    register(&nodes, &only_one, "before", &cid);

    // 1 → 3: two superpeers start to join, the leader adds them.
    nodes.superpeer(101, two.1, &all, true);
    nodes.superpeer(102, three.1, &all, true);
    let added = nodes.term_ok(&only_one, &format!("superpeeradd 101 {}", two.1));
    assert_eq!(member_ids(&added[0]), ["0x0001", "0x0065"], "{added:?}");
    let added = nodes.term_ok(&all, &format!("superpeeradd 102 {}", three.1));
    assert_eq!(
        member_ids(&added[0]),
        ["0x0001", "0x0065", "0x0066"],
        "{added:?}"
    );
    register(&nodes, &all, "grown", &cid);
    // Adding a member again changes nothing; a bad address is refused by the parser.
    let again = nodes.term_ok(&all, &format!("superpeeradd 102 {}", three.1));
    assert_eq!(member_ids(&again[0]).len(), 3);
    let (code, _) = nodes.term(&all, "superpeeradd 103 nowhere");
    assert_eq!(code, Some(1));
    // The peer's ID cannot become a superpeer's.
    let (code, values) = nodes.term(&all, &format!("superpeeradd {peer} {}", four.1));
    assert_eq!(code, Some(1), "{values:?}");

    // The original leader dies: 2 and 3 elect a leader and keep everything.
    nodes.kill("superpeer-1");
    let two_three = list(&[two, three]);
    register(&nodes, &two_three, "after_kill", &cid);
    let got = nodes.term_ok(&two_three, &format!("chunkget {cid}"));
    assert_eq!(got[0]["data"], "abcdefgh", "{got:?}");

    // Repair: remove the lost member, add a fresh one.
    let removed = nodes.term_ok(&two_three, "superpeerremove 1");
    assert_eq!(member_ids(&removed[0]), ["0x0065", "0x0066"], "{removed:?}");
    let with_four = list(&[two, three, four]);
    nodes.superpeer(103, four.1, &with_four, true);
    let added = nodes.term_ok(&two_three, &format!("superpeeradd 103 {}", four.1));
    assert_eq!(
        member_ids(&added[0]),
        ["0x0065", "0x0066", "0x0067"],
        "{added:?}"
    );
    register(&nodes, &with_four, "repaired", &cid);

    // Another original member dies: the quorum now needs the replacement, and has it.
    let metadata = nodes.term_ok(&with_four, "metadata");
    let leader = metadata[0]["leader"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // The leader if it is one of the two, else 101.
    let victim = if leader == "0x0066" {
        "superpeer-102"
    } else {
        "superpeer-101"
    };
    nodes.kill(victim);
    let survivors: Vec<(u16, SocketAddr)> = [two, three, four]
        .into_iter()
        .filter(|(id, _)| format!("superpeer-{id}") != victim)
        .collect();
    let survivors = list(&survivors);
    register(&nodes, &survivors, "last", &cid);
    for name in ["before", "grown", "after_kill", "repaired", "last"] {
        let values = nodes.term_ok(&survivors, &format!("nameget {name}"));
        assert_eq!(values[0]["cid"], cid.as_str(), "{name}: {values:?}");
    }
    let got = nodes.term_ok(&survivors, &format!("chunkget {cid}"));
    assert_eq!(got[0]["data"], "abcdefgh", "{got:?}");
}

#[test]
fn nodeshutdown_of_a_superpeer_leaves_the_group_then_stops_it_and_the_rest_serves() {
    let mut nodes = Nodes::new();
    let addresses: Vec<(u16, SocketAddr)> = [1, 2, 3].map(|id| (id, free_port())).into();
    let all = list(&addresses);
    for (id, address) in &addresses {
        nodes.superpeer(*id, *address, &all, false);
    }
    nodes.start(
        "peer",
        &[
            "peer".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--superpeers".into(),
            all.clone(),
            "--memory-mb".into(),
            "64".into(),
        ],
    );
    let peer = format!("0x{:04x}", nodes.peer_id());
    let values = nodes.term_ok(&all, &format!("chunkcreate 8 {peer} 1"));
    let cid = values[0][0]["cid"].as_str().expect("a CID").to_owned();
    nodes.term_ok(&all, &format!("chunkput {cid} abcdefgh"));
    register(&nodes, &all, "before", &cid);

    // The leader leaves the group and stops; the two others elect a leader.
    let metadata = nodes.term_ok(&all, "metadata");
    let leader = metadata[0]["leader"].as_str().expect("a leader").to_owned();
    let leader_id = u16::from_str_radix(leader.trim_start_matches("0x"), 16).expect("hex");
    let values = nodes.term_ok(&all, &format!("nodeshutdown {leader}"));
    assert_eq!(values[0]["left_group"], true, "{values:?}");
    assert_eq!(values[0]["stopped"], true, "{values:?}");
    let members = member_ids(&values[0]);
    assert_eq!(members.len(), 2, "{values:?}");
    assert!(!members.contains(&leader), "{values:?}");
    let status = nodes
        .process(&format!("superpeer-{leader_id}"))
        .wait_exit(Duration::from_secs(10), "the shut down superpeer");
    assert!(status.success(), "a clean exit: {status:?}");

    let rest: Vec<(u16, SocketAddr)> = addresses
        .iter()
        .copied()
        .filter(|(id, _)| *id != leader_id)
        .collect();
    let rest_list = list(&rest);
    register(&nodes, &rest_list, "after", &cid);
    let got = nodes.term_ok(&rest_list, &format!("chunkget {cid}"));
    assert_eq!(got[0]["data"], "abcdefgh", "{got:?}");
    let metadata = nodes.term_ok(&rest_list, "metadata");
    assert_ne!(metadata[0]["leader"], leader.as_str(), "{metadata:?}");

    // One more: the last one left is a group of one and still serves (its quorum is
    // itself, so it did not depend on the stopped members).
    let (second, _) = rest[0];
    let values = nodes.term_ok(&rest_list, &format!("nodeshutdown {second}"));
    assert_eq!(values[0]["stopped"], true, "{values:?}");
    assert_eq!(member_ids(&values[0]).len(), 1, "{values:?}");
    let status = nodes
        .process(&format!("superpeer-{second}"))
        .wait_exit(Duration::from_secs(10), "the second superpeer");
    assert!(status.success(), "{status:?}");
    let last = list(&rest[1..]);
    register(&nodes, &last, "alone", &cid);
    for name in ["before", "after", "alone"] {
        let values = nodes.term_ok(&last, &format!("nameget {name}"));
        assert_eq!(values[0]["cid"], cid.as_str(), "{name}: {values:?}");
    }
    // The last member cannot leave: refused, and its process keeps running.
    let (code, values) = nodes.term(&last, &format!("nodeshutdown {}", rest[1].0));
    assert_eq!(code, Some(1), "{values:?}");
    assert!(!nodes
        .process(&format!("superpeer-{}", rest[1].0))
        .has_exited());
}
