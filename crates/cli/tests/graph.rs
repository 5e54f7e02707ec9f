//! Graph500 on real processes: `myriad bench graph500` end to end on a small graph (its
//! cluster, the load into vertex chunks, BFS from random roots, the validation, the
//! summary line); the graph tasks through the terminal's `comptask` and its `graph500`
//! command on a running cluster (with the vertex chunks read back and compared); and a
//! BFS whose slave is SIGKILLed failing with a clear error instead of hanging.

use std::time::Duration;

use myriad_bench::graph500::run_task;
use myriad_client::client::Client;
use myriad_compute::client::group_status;
use myriad_testing::process::{wait_until, Cluster, Myriad};
use myriad_types::NodeId;
use serde_json::{json, Value};

const BINARY: &str = env!("CARGO_BIN_EXE_myriad");
const WAIT: Duration = Duration::from_secs(15);

#[test]
fn the_graph500_benchmark_loads_runs_and_validates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Myriad::new(BINARY, ["bench", "graph500", "--json"])
        .args(["--scale", "11", "--roots", "6", "--peers", "2"])
        .arg("--dir")
        .arg(dir.path().join("bench"))
        .cluster_dir(dir.path().join("bench").join("cluster"))
        .timeout(Duration::from_secs(55))
        .run();
    assert!(output.success(), "bench graph500 failed: {output:#?}");
    let summary: Value = output
        .stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|value| value["case"] == "summary")
        .unwrap_or_else(|| panic!("no summary line: {output:#?}"));
    assert_eq!(summary["validated"], true, "{summary}");
    assert_eq!(summary["scale"], 11);
    assert_eq!(summary["edgefactor"], 16);
    assert_eq!(summary["peers"], 2);
    assert_eq!(summary["roots"], 6);
    for key in ["mteps_hmean", "load_secs", "bytes_per_edge"] {
        let value = summary[key].as_f64().unwrap_or(0.0);
        assert!(value > 0.0, "{key} = {value}: {summary}");
    }
    // Chunks hold 4 bytes per directed adjacency entry (two per input edge, minus loops
    // and duplicates): at least that much store memory per edge (small graphs also pay
    // the allocator's fixed costs).
    let bytes = summary["bytes_per_edge"].as_f64().unwrap_or(0.0);
    assert!(bytes > 4.0, "{summary}");
    let rows = summary["csr_bytes_per_edge"].as_f64().unwrap_or(0.0);
    assert!(rows > 4.0 && rows < 16.0, "{summary}");
}

/// A cluster of 3 peers (group 1: the first is made master, 2 slaves) and a client.
fn group_cluster(dir: &std::path::Path) -> (Cluster, Client, Vec<NodeId>) {
    let cluster = Cluster::builder(BINARY, dir)
        .superpeers(1)
        .peers(3)
        .peer_memory_mb(64)
        .config("[backup]\nreplication = 0\n[compute]\ngroup = 1\nrole = \"slave\"\n")
        .keep_logs_on_panic()
        .start();
    let mut peers: Vec<NodeId> = cluster
        .peer_entries()
        .iter()
        .map(|node| NodeId(node.node_id))
        .collect();
    peers.sort_unstable();
    let secret = cluster.secret().expect("secret");
    let client = Client::connect(cluster.superpeers(), secret).expect("client joins");
    let term = Myriad::new(BINARY, ["term", "--cluster"])
        .arg(cluster.dir())
        .args(["-c", &format!("compgrpjoin {} 1 master", peers[0])])
        .timeout(Duration::from_secs(30))
        .run();
    assert!(term.success(), "{term:#?}");
    wait_until(WAIT, "two slaves", || {
        group_status(&client, 1).is_ok_and(|s| s.slaves.len() == 2)
    });
    (cluster, client, peers)
}

fn comptask(cluster: &Cluster, line: &str) -> Value {
    let output = Myriad::new(BINARY, ["term", "--cluster"])
        .arg(cluster.dir())
        .args(["--json", "-c", line])
        .timeout(Duration::from_secs(40))
        .run();
    assert!(output.success(), "term {line:?}: {output:#?}");
    serde_json::from_str(output.stdout.lines().next().unwrap_or("null")).expect("JSON")
}

#[test]
fn graph_tasks_run_from_the_terminal_and_a_killed_slave_fails_the_bfs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut cluster, client, peers) = group_cluster(dir.path());

    // Load through the terminal, reading every vertex chunk back.
    let load = comptask(
        &cluster,
        "comptask 1 graph.load '{\"name\":\"g\",\"scale\":12,\"verify\":true}' --slaves-min 2",
    );
    assert_eq!(load["state"], "finished", "{load:#}");
    let roots = comptask(
        &cluster,
        "comptask 1 graph.roots '{\"name\":\"g\",\"count\":2}' --slaves-min 2",
    );
    assert_eq!(roots["state"], "finished", "{roots:#}");
    let bfs = comptask(
        &cluster,
        "comptask 1 graph.bfs '{\"name\":\"g\",\"roots\":[1,2,3]}' --slaves-min 2",
    );
    assert_eq!(bfs["state"], "finished", "{bfs:#}");

    // The whole benchmark as one terminal command on the running group.
    let figures = comptask(&cluster, "graph500 1 10 --roots 3 --slaves 2");
    assert_eq!(figures["validated"], true, "{figures:#}");
    assert_eq!(figures["roots"], 3, "{figures:#}");
    assert!(
        figures["mteps_hmean"].as_f64().unwrap_or(0.0) > 0.0,
        "{figures:#}"
    );

    // An edge-list file (a ring of 200 vertices with chords, and an isolated pair), read
    // share by share by the slaves; the BFS from 0 reaches the ring and passes validation.
    let file = dir.path().join("ring.txt");
    let mut text = String::from("# ring\n");
    for v in 0..200u32 {
        text.push_str(&format!("{v} {}\n", (v + 1) % 200));
        if v % 17 == 0 {
            text.push_str(&format!("{v} {}\n", (v * 7 + 3) % 200));
        }
    }
    text.push_str("300 301\n");
    std::fs::write(&file, text).expect("edge file");
    let long = Duration::from_secs(30);
    let params = json!({"name": "ring", "file": file.display().to_string(), "verify": true});
    run_task(&client, 1, 2, "graph.load", params, long).expect("load from the file");
    let values = run_task(
        &client,
        1,
        2,
        "graph.bfs",
        json!({"name": "ring", "roots": [0]}),
        long,
    )
    .expect("BFS on the file's graph");
    for value in &values {
        let reports: Value = serde_json::from_slice(value).expect("JSON");
        assert_eq!(reports[0]["valid"], true, "{reports}");
        assert_eq!(reports[0]["reached"], 200, "{reports}");
    }
    run_task(&client, 1, 2, "graph.drop", json!({"name": "ring"}), long).expect("drop");

    // Many BFS runs without validation; a slave SIGKILLed meanwhile.
    let slaves = group_status(&client, 1).expect("status").slaves;
    assert!(slaves.iter().all(|s| peers[1..].contains(s)), "{slaves:?}");
    let root = 1u32;
    let runner = {
        let client = client.clone();
        std::thread::spawn(move || {
            let params = json!({"name": "g", "roots": vec![root; 100_000], "validate": false});
            run_task(&client, 1, 2, "graph.bfs", params, Duration::from_secs(30))
        })
    };
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        !runner.is_finished(),
        "100,000 BFS runs should take longer than 0.8 s"
    );
    cluster.kill(slaves[1].0);
    let outcome = runner.join().expect("the runner thread");
    let error = outcome.expect_err("the BFS must fail with a slave killed");
    assert!(
        error.contains("graph.bfs failed") && error.contains(&slaves[1].to_string()),
        "not a clear task failure naming node {}: {error}",
        slaves[1]
    );
    eprintln!("the BFS failed as expected: {error}");
    client.shutdown();
}
