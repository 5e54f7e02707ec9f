//! The superpeers' web status page in a real browser: a local cluster (3 superpeers, 3
//! peers replicating with R = 2) under a small read load; headless Chromium (Debian's
//! `chromium`) loads the leader's page and the test checks the rendered DOM (every node,
//! its state, the zones, the Raft line, the throughput legend); then a peer is SIGKILLed
//! and a follower's page shows it failed, the failure and the recovered zones on the
//! timeline, and the zone recoveries done (the follower asks the leader for its recovery
//! table). A screenshot is taken (and copied to the path in
//! `MYRIAD_STATUS_SCREENSHOT`, if set: `docs/status-page.png` was made so).
//!
//! Chromium is required: without it (`chromium` on the PATH, or `MYRIAD_CHROMIUM`) the
//! test fails and says so; `.ci/run` installs it in CI. Every node and browser process is
//! killed by the harness when the test ends (also on a panic).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::client::{Client, ClientConfig};
use myriad_launcher::NodeRole;
use myriad_testing::process::{http_get, poll_until, Cluster, Process};
use serde_json::Value;

/// Fast failure detection, small zones and logs, two backups per zone.
const CONFIG: &str = "\
[failure]
heartbeat_interval_ms = 100
failure_timeout_ms = 600

[backup]
replication = 2
zone_mb = 1
segment_kb = 64
write_buffer_kb = 1024
primary_log_kb = 4096
";

/// Longest run of one browser.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(60);

/// The browser: `MYRIAD_CHROMIUM` or `chromium` on the PATH; panics with what to install.
fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("MYRIAD_CHROMIUM") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("chromium"))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "this test needs a headless browser: install Debian's chromium \
             (apt-get install chromium; .ci/run does in CI) or set MYRIAD_CHROMIUM"
        )
    })
}

/// Runs headless Chromium on `url` with `mode` (`--dump-dom` or `--screenshot=FILE`);
/// returns its stdout. The page's script gets 3 s of virtual time to run first.
fn browse(work: &Path, url: &str, mode: &str) -> String {
    let out = work.join("browser.out");
    let mut process = Process::spawn(
        Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--window-size=1280,1500",
                "--virtual-time-budget=3000",
            ])
            .arg(format!(
                "--user-data-dir={}",
                work.join("profile").display()
            ))
            .arg(mode)
            .arg(url)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("browser output file"))
            .stderr(Stdio::null()),
        "chromium",
    );
    let status = process.wait_exit(BROWSER_TIMEOUT, "chromium");
    assert!(status.success(), "chromium failed: {status}");
    std::fs::read_to_string(&out).expect("browser output")
}

fn status(address: &str) -> Value {
    let (code, body) = http_get(address, "/api/status", Duration::from_secs(10))
        .unwrap_or_else(|error| panic!("GET /api/status: {error}"));
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|error| panic!("not JSON ({error}): {body}"))
}

fn hex(id: u16) -> String {
    format!("0x{id:04x}")
}

#[test]
fn status_page_shows_the_cluster_and_a_recovery_in_chromium() {
    let dir = tempfile::tempdir().expect("tempdir");
    let browser_dir = dir.path().join("browser");
    std::fs::create_dir_all(&browser_dir).expect("browser dir");
    let mut cluster = Cluster::builder(env!("CARGO_BIN_EXE_myriad"), dir.path())
        .superpeers(3)
        .peers(3)
        .peer_memory_mb(64)
        .config(CONFIG)
        .keep_logs_on_panic()
        .start();
    let superpeers: Vec<String> = cluster
        .nodes()
        .iter()
        .filter(|node| node.role == NodeRole::Superpeer)
        .map(|node| node.metrics.clone().expect("a superpeer's HTTP address"))
        .collect();
    assert_eq!(superpeers.len(), 3);
    let mut leader = None;
    assert!(
        poll_until(Duration::from_secs(15), || {
            leader = superpeers
                .iter()
                .find(|address| status(address)["is_leader"] == true)
                .cloned();
            leader.is_some()
        }),
        "no superpeer leads"
    );
    let superpeer = leader.expect("the leader's HTTP address");
    let leader_id = status(&superpeer)["node"].as_u64().expect("node");
    let follower = superpeers
        .iter()
        .find(|address| **address != superpeer)
        .cloned()
        .expect("a follower");
    let url = format!("http://{superpeer}/");
    let peers: Vec<u16> = cluster.peer_ids().iter().map(|id| id.0).collect();
    assert_eq!(peers.len(), 3);
    let (victim, survivor) = (peers[0], peers[1]);

    // Chunks on two peers, and a reader that keeps the survivor busy.
    let client = Client::connect_with(
        ClientConfig::new(cluster.superpeers())
            .with_secret_file(&cluster.secret_file())
            .expect("the cluster's secret file"),
    )
    .expect("client");
    let mut readable = Vec::new();
    for (peer, count) in [(victim, 600), (survivor, 300)] {
        let payloads: Vec<Bytes> = (0..count)
            .map(|i| Bytes::from(format!("{:<64}", format!("chunk {i} of {peer}"))))
            .collect();
        let created = client
            .blocking()
            .chunks()
            .create_with_data(myriad_types::NodeId(peer), payloads)
            .expect("create");
        if peer == survivor {
            readable = created;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = Arc::clone(&stop);
        let superpeers = cluster.superpeers();
        let secret_file = cluster.secret_file();
        std::thread::spawn(move || {
            let config = ClientConfig::new(superpeers)
                .with_secret_file(&secret_file)
                .expect("the cluster's secret file");
            let client = Client::connect_with(config).expect("client");
            let api = client.blocking();
            let chunks = api.chunks();
            let deadline = Instant::now() + Duration::from_secs(50);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                for cid in readable.iter().take(50) {
                    let _ = chunks.get(*cid);
                }
            }
        })
    };
    // A few samples with the load running.
    assert!(
        poll_until(Duration::from_secs(15), || {
            status(&superpeer)["history"]["samples"]
                .as_array()
                .and_then(|samples| samples.last())
                .and_then(|sample| sample["peers"][survivor.to_string()].as_f64())
                .is_some_and(|rate| rate > 10.0)
        }),
        "the sampler never saw the survivor's load"
    );

    let dom = browse(&browser_dir, &url, "--dump-dom");
    assert!(dom.contains("Myriad cluster"), "{dom}");
    let served_by = format!("Served by superpeer {} (leader)", hex(leader_id as u16));
    assert!(dom.contains(&served_by), "{served_by} in {dom}");
    for &peer in &peers {
        let row = format!("<tr data-node=\"{}\" data-state=\"alive\">", hex(peer));
        assert!(dom.contains(&row), "{row} in {dom}");
    }
    assert!(dom.contains("zones"), "{dom}");
    assert!(
        dom.contains(&format!("■ {}: ", hex(survivor))),
        "a throughput legend entry for the survivor: {dom}"
    );
    assert!(!dom.contains("data-state=\"failed\""), "{dom}");

    // A peer fails; its zones are recovered by their backups.
    cluster.kill(victim);
    let recovered = poll_until(Duration::from_secs(30), || {
        let status = status(&superpeer);
        let failed = status["nodes"].as_array().is_some_and(|nodes| {
            nodes
                .iter()
                .any(|n| n["id"] == victim && n["state"] == "failed")
        });
        let zones: Vec<&Value> = status["recoveries"]
            .as_array()
            .map(|zones| zones.iter().filter(|z| z["owner"] == victim).collect())
            .unwrap_or_default();
        let events = status["events"].as_array().cloned().unwrap_or_default();
        failed
            && !zones.is_empty()
            && zones.iter().all(|z| z["state"] == "done")
            && events.iter().any(|e| e["kind"] == "recovered")
    });
    assert!(recovered, "no recovery seen: {:#}", status(&superpeer));

    // A follower's page shows the same: the metadata it applied, the leader's table, and
    // its own sampler's view of the load.
    let url = format!("http://{follower}/");
    let follower_ready = poll_until(Duration::from_secs(10), || {
        let status = status(&follower);
        let survivor_rate = status["history"]["samples"]
            .as_array()
            .and_then(|samples| samples.last())
            .and_then(|sample| sample["peers"][survivor.to_string()].as_f64());
        status["is_leader"] == false
            && survivor_rate.is_some_and(|rate| rate > 10.0)
            && status["recoveries"].as_array().is_some_and(|zones| {
                zones
                    .iter()
                    .any(|z| z["owner"] == victim && z["state"] == "done")
            })
    });
    assert!(follower_ready, "follower's status: {:#}", status(&follower));
    let follower_id = status(&follower)["node"].as_u64().expect("node");
    let dom = browse(&browser_dir, &url, "--dump-dom");
    let served_by = format!(
        "Served by superpeer {} · leader {}",
        hex(follower_id as u16),
        hex(leader_id as u16)
    );
    assert!(dom.contains(&served_by), "{served_by} in {dom}");
    let failed_row = format!("<tr data-node=\"{}\" data-state=\"failed\">", hex(victim));
    assert!(dom.contains(&failed_row), "{failed_row} in {dom}");
    assert!(
        dom.contains("<tr data-kind=\"failed\">"),
        "failure on the timeline: {dom}"
    );
    assert!(
        dom.contains("<tr data-kind=\"recovered\">"),
        "recovery on the timeline: {dom}"
    );
    assert!(
        dom.contains("<tr data-state=\"done\">"),
        "a zone recovery done: {dom}"
    );
    assert!(
        peers[1..]
            .iter()
            .any(|&peer| dom.contains(&format!("recovered by {}", hex(peer)))),
        "a surviving peer named as the restorer: {dom}"
    );

    // A screenshot with the failure and the recovery on the plot.
    std::thread::sleep(Duration::from_secs(3));
    let png = browser_dir.join("status-page.png");
    browse(
        &browser_dir,
        &url,
        &format!("--screenshot={}", png.display()),
    );
    let image = std::fs::read(&png).expect("screenshot written");
    assert!(image.starts_with(b"\x89PNG"), "not a PNG");
    assert!(
        image.len() > 10_000,
        "a blank screenshot? {} bytes",
        image.len()
    );
    if let Some(keep) = std::env::var_os("MYRIAD_STATUS_SCREENSHOT") {
        std::fs::copy(&png, &keep).expect("copy the screenshot");
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader thread");
}
