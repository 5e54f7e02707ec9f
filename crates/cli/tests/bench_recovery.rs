//! `myriad bench recovery` end to end on a tiny data set: it must start its cluster, load,
//! kill the master, see every zone recovered, read every chunk back and write its series
//! (figures are not checked: this is not a timed test). The benchmark kills its own nodes;
//! the guard kills the benchmark (and with it its cluster's process group) if it hangs.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the benchmark if it is still running, then every node of its cluster (they are
/// its children, but in process groups of their own).
struct Guard(Option<Child>, std::path::PathBuf);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
            if let Ok(mut cluster) = myriad_launcher::LocalCluster::open(&self.1) {
                let ids: Vec<u16> = cluster.nodes().iter().map(|node| node.node_id).collect();
                for id in ids {
                    let _ = cluster.kill(id);
                }
            }
        }
    }
}

#[test]
fn the_recovery_benchmark_recovers_every_chunk_and_writes_its_series() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("series.csv");
    let png = dir.path().join("series.png");
    let child = Command::new(env!("CARGO_BIN_EXE_myriad"))
        .args([
            "bench",
            "recovery",
            "--json",
            "--data-mb",
            "2",
            "--zone-mb",
            "1",
        ])
        .args(["--backups", "3", "--replication", "2", "--before-ms", "500"])
        .args(["--heartbeat-ms", "100", "--failure-timeout-ms", "600"])
        // The peers make some memory resident at start (`--prefault-mb` on each peer).
        .args(["--prefault-mb", "8"])
        .arg("--dir")
        .arg(dir.path().join("cluster"))
        .arg("--csv")
        .arg(&csv)
        .arg("--png")
        .arg(&png)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the benchmark starts");
    // The benchmark keeps its cluster in `--dir`/cluster.
    let mut guard = Guard(Some(child), dir.path().join("cluster").join("cluster"));
    let deadline = Instant::now() + Duration::from_secs(50);
    while guard
        .0
        .as_mut()
        .expect("child")
        .try_wait()
        .expect("status")
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "the benchmark did not end within 50 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let child = guard.0.take().expect("child");
    let output = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the benchmark failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("every line is JSON"))
        .collect();
    let summary = lines
        .iter()
        .find(|line| line["bench"] == "recovery")
        .expect("a summary line");
    for field in [
        "detect_ms",
        "available_ms",
        "rereplicated_ms",
        "client_max_latency_ms",
    ] {
        assert!(summary[field].is_number(), "{field} missing: {summary}");
    }
    assert_eq!(summary["verify_wrong_or_missing"], 0, "{summary}");
    assert_eq!(summary["probe_wrong_values"], 0, "{summary}");
    assert!(
        summary["zones"].as_u64().is_some_and(|zones| zones >= 2),
        "{summary}"
    );
    let verify = lines
        .iter()
        .find(|line| line["phase"] == "verify")
        .expect("a verify line");
    assert_eq!(verify["ok"], summary["chunks"], "{verify}");
    let series = std::fs::read_to_string(&csv).expect("the CSV is written");
    assert!(series.starts_with("ms_since_kill,ops,ops_per_sec,errors,max_latency_ms\n"));
    assert!(series.lines().count() > 5, "{series}");
    if summary["png"].is_string() {
        let bytes = std::fs::read(&png).expect("the PNG is written");
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
    }
}

/// `myriad bench recovery-local` on a 4 MiB zone: with `--pages both` every run recovers
/// every chunk once from cold pages and once into memory made resident first, and both
/// summaries are printed (figures are not checked; the benchmark itself checks every
/// chunk's payload and fails otherwise).
#[test]
fn the_local_recovery_benchmark_runs_with_cold_and_resident_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_myriad"))
        .args(["bench", "recovery-local", "--json", "--zone-mb", "4"])
        .args(["--runs", "1", "--baseline-mb", "8", "--pages", "both"])
        .arg("--dir")
        .arg(dir.path().join("logs"))
        .output()
        .expect("the benchmark runs");
    assert!(
        output.status.success(),
        "recovery-local failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    for pages in ["cold", "resident"] {
        let run = lines
            .iter()
            .find(|l| l["bench"] == "recovery_local" && l["pages"] == pages)
            .unwrap_or_else(|| panic!("no {pages} run in {lines:?}"));
        assert_eq!(run["chunks"], (4u64 << 20) / 64);
        assert!(lines
            .iter()
            .any(|l| l["summary"] == "recovery_local" && l["pages"] == pages));
    }
}
