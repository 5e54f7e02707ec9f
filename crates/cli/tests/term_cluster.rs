//! `myriad term --cluster DIR` against a real local cluster (1 superpeer, 2 peers): every
//! command family run as a child process, outputs checked (text and `--json`).
//!
//! One cluster serves the whole file (one test, steps in order; `nodeshutdown` last since
//! it takes a peer away). The cluster and every terminal process are SIGKILLed by the
//! process harness, also when an assertion fails.

use std::path::Path;
use std::time::Duration;

use myriad_launcher::NodeRole;
use myriad_testing::process::{poll_until, Cluster, Myriad};
use serde_json::Value;

/// Longest run of one terminal process.
const TERM_TIMEOUT: Duration = Duration::from_secs(20);

/// What one terminal run produced.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The `--json` output: one value per line.
    fn values(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\n{self:?}"))
            })
            .collect()
    }

    fn ok(self) -> Run {
        assert_eq!(self.code, Some(0), "terminal failed: {self:#?}");
        self
    }
}

/// Runs `myriad term --cluster dir [--json] -c script` with a deadline.
fn term(dir: &Path, json: bool, script: &str) -> Run {
    let mut command = Myriad::new(env!("CARGO_BIN_EXE_myriad"), ["term", "--cluster"]).arg(dir);
    if json {
        command = command.arg("--json");
    }
    let output = command.arg("-c").arg(script).timeout(TERM_TIMEOUT).run();
    Run {
        code: output.code(),
        stdout: output.stdout,
        stderr: output.stderr,
    }
}

fn cids(value: &Value) -> Vec<String> {
    value
        .as_array()
        .expect("array of created CIDs")
        .iter()
        .map(|row| row["cid"].as_str().expect("cid").to_string())
        .collect()
}

fn node_rows(dir: &Path) -> Vec<Value> {
    let values = term(dir, true, "nodelist").ok().values();
    values[0].as_array().expect("node rows").clone()
}

fn alive(rows: &[Value], role: &str) -> Vec<Value> {
    rows.iter()
        .filter(|row| row["role"] == role && row["state"] == "alive")
        .cloned()
        .collect()
}

#[test]
fn terminal_commands_against_a_local_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::builder(env!("CARGO_BIN_EXE_myriad"), dir.path())
        .superpeers(1)
        .peers(2)
        .peer_memory_mb(128)
        .ready_timeout(Duration::from_secs(30))
        .start();
    let dir = cluster.dir().to_path_buf();
    let mut peer_ids: Vec<u16> = cluster
        .nodes()
        .iter()
        .filter(|node| node.role == NodeRole::Peer)
        .map(|node| node.node_id)
        .collect();
    // Peers get their IDs in the order they joined, not the order they were spawned.
    peer_ids.sort_unstable();
    let peers: Vec<String> = peer_ids.iter().map(|id| format!("0x{id:04x}")).collect();
    assert_eq!(peers.len(), 2);
    let (a, b) = (&peers[0], &peers[1]);

    // Nodes: 1 superpeer, 2 peers and the terminal's own client (no capabilities).
    let rows = node_rows(&dir);
    assert_eq!(alive(&rows, "superpeer").len(), 1, "{rows:#?}");
    let alive_peers: Vec<String> = alive(&rows, "peer")
        .iter()
        .map(|row| row["nid"].as_str().expect("nid").to_string())
        .collect();
    assert_eq!(alive_peers, peers, "{rows:#?}");
    let clients = alive(&rows, "client");
    assert_eq!(clients.len(), 1, "only this terminal: {rows:#?}");
    assert_eq!(clients[0]["capabilities"], "-");
    let text = term(&dir, false, "nodelist peer").ok().stdout;
    assert!(text.starts_with("NID "), "{text}");
    assert_eq!(text.lines().count(), 3, "header + 2 peers: {text}");

    // Chunks: create → put → get round trip, with CIDs parsed from JSON.
    let created = term(&dir, true, &format!("chunkcreate 8 {a} 3"))
        .ok()
        .values();
    let cids = cids(&created[0]);
    assert_eq!(cids.len(), 3);
    assert!(cids.iter().all(|cid| cid.starts_with(a.as_str())));
    let values = term(
        &dir,
        true,
        &format!(
            "chunkput {0} abcdefgh; chunkget {0}; chunkput {1} 0102 hex --offset 6; \
             chunkget {1} hex; chunkget {0} --offset 2 --length 3; chunkput {2} 4294967295 u32; \
             chunkget {2} u32",
            cids[0], cids[1], cids[2]
        ),
    )
    .ok()
    .values();
    assert_eq!(values[0], Value::Null);
    assert_eq!(values[1]["cid"], cids[0].as_str());
    assert_eq!(values[1]["data"], "abcdefgh");
    assert_eq!(values[3]["data"], "0000000000000102");
    assert_eq!(values[4]["data"], "cde");
    assert_eq!(values[6]["data"], serde_json::json!([4294967295u64, 0]));
    let text = term(&dir, false, &format!("chunkget {}", cids[0]))
        .ok()
        .stdout;
    assert!(text.contains("data    abcdefgh"), "{text}");
    let values = term(
        &dir,
        true,
        &format!("chunklist {a}; chunkstatus {a}; stats"),
    )
    .ok()
    .values();
    assert_eq!(values[0]["ranges"][0]["first"], cids[0].as_str());
    assert_eq!(values[0]["ranges"][0]["chunks"], 3);
    assert_eq!(values[1]["chunks"], 3);
    let stats = values[2].as_array().expect("stats rows");
    assert_eq!(stats.len(), 2);
    assert_eq!(stats[0]["node"], a.as_str());

    // Names.
    let values = term(
        &dir,
        true,
        &format!("namereg {} first; nameget first; namelist", cids[0]),
    )
    .ok()
    .values();
    assert_eq!(values[1]["cid"], cids[0].as_str());
    assert_eq!(
        values[2],
        serde_json::json!([{"name": "first", "cid": cids[0]}])
    );

    // Temporary storage.
    let values = term(
        &dir,
        true,
        "tmpcreate 7 4; tmpput 7 hi; tmpget 7; tmpget 7 hex; tmplist; tmpremove 7; tmplist",
    )
    .ok()
    .values();
    assert_eq!(values[2]["data"], "hi\u{0}\u{0}");
    assert_eq!(values[3]["data"], "68690000");
    assert_eq!(values[4], serde_json::json!([{"id": 7, "size": 4}]));
    assert_eq!(values[6], serde_json::json!([]));

    // Barriers: a barrier of one is released by this terminal's own sign-on.
    let values = term(&dir, true, "barrieralloc 1").ok().values();
    let barrier = values[0]["barrier"].as_u64().expect("barrier ID");
    let values = term(
        &dir,
        true,
        &format!("barriersignon {barrier} 42; barrierstatus {barrier}; barrierfree {barrier}"),
    )
    .ok()
    .values();
    assert_eq!(values[0][0]["data"], 42);
    assert_eq!(values[1]["round"], 1);
    assert_eq!(values[1]["last_released"][0]["data"], 42);
    let run = term(&dir, false, &format!("barrierstatus {barrier}"));
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("no barrier"), "{run:?}");

    // Locks: unlock matches the lock taken; a lock ends with the terminal that took it.
    term(
        &dir,
        false,
        &format!("chunklock {0} read; chunkunlock {0}", cids[0]),
    )
    .ok();
    term(&dir, false, &format!("chunklock {}", cids[1])).ok();
    let run = term(&dir, false, &format!("chunkunlock {}", cids[1]));
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("holds no lock"), "{run:?}");
    term(
        &dir,
        false,
        &format!("chunklock {0} write; chunkunlock {0}", cids[1]),
    )
    .ok();

    // Migration: the lookup tree names the new owner, the data moved along.
    let values = term(
        &dir,
        true,
        &format!(
            "chunkmigrate {} {} {b}; lookuptree {a}; chunkget {}; chunklist {b}",
            cids[1], cids[2], cids[1]
        ),
    )
    .ok()
    .values();
    assert_eq!(values[0]["moved"], 2);
    assert_eq!(
        values[1],
        serde_json::json!([{"first": cids[1], "last": cids[2], "owner": b}])
    );
    assert_eq!(
        values[2]["data"],
        "\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{1}\u{2}"
    );
    assert_eq!(values[3]["ranges"][0]["first"], cids[1].as_str());

    // Errors: nonzero exit and a message, in text and JSON.
    let missing = format!("{a}:0xfffff");
    let run = term(&dir, false, &format!("chunkget {missing}"));
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("error: chunkget: chunk") && run.stderr.contains("not found"),
        "{run:?}"
    );
    let run = term(&dir, true, "nodeshutdown 1; nameget nobody");
    assert_eq!(run.code, Some(1), "{run:?}");
    let values = run.values();
    assert!(values[0]["error"]
        .as_str()
        .is_some_and(|e| e.contains("last voter") && e.contains("not stopped")));
    assert_eq!(values[1]["command"], "nameget");

    // Every terminal so far left the cluster before the next one joined (also the ones
    // that failed a command and exited nonzero), so they all had the same client ID, now
    // in a later incarnation.
    let rows = node_rows(&dir);
    let clients: Vec<&Value> = rows.iter().filter(|row| row["role"] == "client").collect();
    assert_eq!(clients.len(), 1, "{rows:#?}");
    assert_eq!(clients[0]["state"], "alive");
    assert!(clients[0]["incarnation"].as_u64() > Some(10), "{rows:#?}");

    // nodewait: answered at once when enough nodes are alive, an error after its
    // timeout when not.
    let values = term(&dir, true, "nodewait --peers 2").ok().values();
    assert_eq!(values[0]["peers"], 2, "{values:?}");
    let run = term(&dir, false, "nodewait --peers 3 --timeout 1");
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("2 of 3 peers"), "{run:?}");

    // chunkremoverange: five chunks created, a range over them and one CID beyond.
    let created = term(&dir, true, &format!("chunkcreate 8 {a} 5"))
        .ok()
        .values();
    let range = created[0]
        .as_array()
        .expect("created CIDs")
        .iter()
        .map(|row| row["cid"].as_str().expect("cid").to_string())
        .collect::<Vec<_>>();
    let parsed: Vec<myriad_types::ChunkId> =
        range.iter().map(|cid| cid.parse().expect("cid")).collect();
    let (first, last) = (
        *parsed.iter().min().expect("min"),
        *parsed.iter().max().expect("max"),
    );
    // One CID past the last: never created, so counted as absent.
    let beyond = myriad_types::ChunkId::new(last.creator(), last.local_id() + 1).expect("cid");
    let values = term(&dir, true, &format!("chunkremoverange {first} {beyond}"))
        .ok()
        .values();
    let (removed, absent) = (
        values[0]["removed"].as_u64().expect("removed"),
        values[0]["absent"].as_u64().expect("absent"),
    );
    assert!(removed >= 5 && absent >= 1, "{values:?}");
    assert_eq!(
        removed + absent,
        beyond.local_id() - first.local_id() + 1,
        "{values:?}"
    );
    for cid in &range {
        let run = term(&dir, false, &format!("chunkget {cid}"));
        assert_eq!(run.code, Some(1), "{cid} still there: {run:?}");
    }

    // monitoring: both peers push summaries to the superpeer every 2 s; the table lists
    // them with their hottest CID ranges, and a peer's history has one row per interval.
    let mut table = Vec::new();
    let listed = poll_until(Duration::from_secs(10), || {
        let run = term(&dir, true, "monitoring");
        table = run.values()[0].as_array().cloned().unwrap_or_default();
        run.code == Some(0) && table.len() == 2
    });
    assert!(listed, "{table:#?}");
    let listed: Vec<&str> = table.iter().filter_map(|row| row["nid"].as_str()).collect();
    assert_eq!(listed, [a.as_str(), b.as_str()], "{table:#?}");
    assert!(
        table.iter().all(|row| row["rss_mib"].as_f64() > Some(1.0)),
        "{table:#?}"
    );
    // Hottest CID ranges: a burst of reads of one chunk of a puts its block of 256 local
    // IDs at the top of a's hot ranges in the next report.
    let hot: myriad_types::ChunkId = cids[0].parse().expect("cid");
    let block = format!(
        "{}..{}:",
        myriad_types::ChunkId::from_raw(hot.raw() & !0xff),
        myriad_types::ChunkId::from_raw(hot.raw() | 0xff)
    );
    let burst = vec![format!("chunkget {hot}"); 300].join("; ");
    let mut row = Value::Null;
    let seen = poll_until(Duration::from_secs(15), || {
        let run = term(&dir, true, &format!("{burst}; monitoring"));
        let values = run.values();
        row = values
            .last()
            .and_then(|table| table.as_array())
            .and_then(|rows| rows.iter().find(|row| row["nid"] == a.as_str()))
            .cloned()
            .unwrap_or_default();
        row["hot_ranges"]
            .as_str()
            .is_some_and(|text| text.starts_with(&block))
    });
    assert!(seen, "{block} not the hottest of {a}: {row:#?}");
    let mut history = Vec::new();
    let grown = poll_until(Duration::from_secs(10), || {
        let values = term(&dir, true, &format!("monitoring {a} --history 5"))
            .ok()
            .values();
        history = values[0].as_array().cloned().unwrap_or_default();
        history.len() >= 2
    });
    assert!(grown, "{history:#?}");
    assert!(
        history.iter().all(|row| row["chunks"].as_u64() >= Some(1)),
        "{history:#?}"
    );

    // loggerlevel: peer a's filter is read, then changed at run time to debug for the
    // messaging layer; the next terminal's connection to it ends with a DEBUG line in its
    // log. A filter that does not parse is refused.
    let values = term(&dir, true, &format!("loggerlevel {a}")).ok().values();
    assert_eq!(values[0]["filter"], "info,openraft=warn", "{values:?}");
    let log = cluster
        .nodes()
        .iter()
        .find(|node| node.node_id == peer_ids[0])
        .expect("peer a")
        .log
        .clone();
    let debug_lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains("DEBUG") && line.contains("myriad_net"))
            .count()
    };
    assert_eq!(debug_lines(), 0, "no debug lines at the start");
    let values = term(
        &dir,
        true,
        &format!("loggerlevel {a} info,myriad_net=debug"),
    )
    .ok()
    .values();
    assert_eq!(values[0]["filter"], "info,myriad_net=debug", "{values:?}");
    term(&dir, true, &format!("chunkstatus {a}")).ok();
    assert!(
        poll_until(Duration::from_secs(10), || debug_lines() > 0),
        "no DEBUG line of myriad_net in {}",
        log.display()
    );
    let run = term(&dir, false, &format!("loggerlevel {a} 'x=[['"));
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("invalid log filter"), "{run:?}");
    let values = term(&dir, true, &format!("loggerlevel {a} info"))
        .ok()
        .values();
    assert_eq!(values[0]["filter"], "info");
    // loginfo: a peer's log engine (it keeps the other peer's backups); a superpeer has
    // none.
    let values = term(&dir, true, &format!("loginfo {b}")).ok().values();
    assert!(
        values[0]["write_buffer_capacity_bytes"].as_u64() > Some(0),
        "{values:?}"
    );
    assert!(
        values[0]["appended_entries"].as_u64().is_some(),
        "{values:?}"
    );
    let run = term(&dir, false, "loginfo 1");
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("keeps no backups"), "{run:?}");

    // balance: no load, so one round that moves nothing and says why (the moving
    // rounds are exercised by `bench_balance.rs`).
    let values = term(&dir, true, "balance --rounds 3 --window-ms 100")
        .ok()
        .values();
    let rounds = values[0].as_array().expect("rounds");
    assert_eq!(rounds.len(), 1, "{values:?}");
    assert_eq!(rounds[0]["moved"], 0, "{values:?}");
    assert!(
        rounds[0]["decision"]
            .as_str()
            .is_some_and(|d| d.contains("below")),
        "{values:?}"
    );

    // chunklocklist, chunkdump, memdump.
    let created = term(&dir, true, &format!("chunkcreate 8 {a} 2"))
        .ok()
        .values();
    let pair: Vec<String> = created[0]
        .as_array()
        .expect("created CIDs")
        .iter()
        .map(|row| row["cid"].as_str().expect("cid").to_string())
        .collect();
    let values = term(
        &dir,
        true,
        &format!("chunklock {}; chunklocklist {a}", pair[0]),
    )
    .ok()
    .values();
    let locks = values[1].as_array().expect("lock rows");
    assert_eq!(locks.len(), 1, "{values:?}");
    assert_eq!(locks[0]["cid"], pair[0].as_str());
    assert!(locks[0]["writer"].as_str().is_some(), "{values:?}");
    // That terminal left: its lock is gone.
    let values = term(&dir, true, &format!("chunklocklist {a}"))
        .ok()
        .values();
    assert_eq!(values[0], serde_json::json!([]), "{values:?}");
    let file = dir.join("chunk.bin");
    term(
        &dir,
        true,
        &format!(
            "chunkput {} dumpme; chunkdump {} {}",
            pair[1],
            pair[1],
            file.display()
        ),
    )
    .ok();
    let dumped = std::fs::read(&file).expect("chunkdump's file");
    assert_eq!(&dumped[..6], b"dumpme", "{dumped:?}");
    assert_eq!(dumped.len(), 8);
    let file = dir.join("mem.dump");
    let values = term(
        &dir,
        true,
        &format!("chunkstatus {a}; memdump {a} {}", file.display()),
    )
    .ok()
    .values();
    let dump = std::fs::read(&file).expect("memdump's file");
    let mut records = Vec::new();
    let mut at = 0;
    while at < dump.len() {
        let cid = u64::from_le_bytes(dump[at..at + 8].try_into().expect("cid"));
        let length = u32::from_le_bytes(dump[at + 8..at + 12].try_into().expect("length")) as usize;
        records.push((
            format!("0x{cid:016x}"),
            dump[at + 12..at + 12 + length].to_vec(),
        ));
        at += 12 + length;
    }
    assert_eq!(at, dump.len(), "whole records");
    assert_eq!(
        records.len() as u64,
        values[0]["chunks"].as_u64().expect("chunks")
    );
    assert_eq!(values[1]["chunks"], records.len());
    let record = records
        .iter()
        .find(|(cid, _)| *cid == pair[1])
        .unwrap_or_else(|| panic!("{} not in the dump: {records:?}", pair[1]));
    assert_eq!(&record.1[..6], b"dumpme");

    // Metadata.
    let values = term(&dir, true, "metadata").ok().values();
    assert_eq!(values[0]["leader"], "0x0001");
    assert_eq!(values[0]["alive_peers"], 2);

    // Shutdown: the peer leaves (node table) and its process exits.
    let values = term(&dir, true, &format!("nodeshutdown {b}")).ok().values();
    assert_eq!(values[0]["state"], "left", "{values:?}");
    let rows = node_rows(&dir);
    let row = rows
        .iter()
        .find(|row| row["nid"] == b.as_str())
        .expect("the peer's row");
    assert_eq!(row["state"], "left", "{rows:#?}");
    let is_b = |s: &myriad_launcher::NodeStatus| format!("0x{:04x}", s.node.node_id) == *b;
    let exited = poll_until(Duration::from_secs(10), || {
        cluster
            .launcher_mut()
            .status()
            .iter()
            .find(|s| is_b(s))
            .is_some_and(|s| !s.alive)
    });
    assert!(
        exited,
        "peer {b} still runs: {:?}",
        cluster.launcher_mut().status()
    );
    assert!(cluster
        .launcher_mut()
        .status()
        .iter()
        .filter(|s| !is_b(s))
        .all(|s| s.alive));
}
