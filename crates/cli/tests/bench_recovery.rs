//! `myriad bench recovery` end to end on a tiny data set: it must start its cluster, load,
//! kill the master, see every zone recovered, read every chunk back and write its series
//! (figures are not checked: this is not a timed test). The benchmark kills its own nodes;
//! the harness kills the benchmark (and the nodes of its cluster) if it hangs.

use std::time::Duration;

use myriad_testing::process::Myriad;

#[test]
fn the_recovery_benchmark_recovers_every_chunk_and_writes_its_series() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("series.csv");
    let png = dir.path().join("series.png");
    let output = Myriad::new(
        env!("CARGO_BIN_EXE_myriad"),
        [
            "bench",
            "recovery",
            "--json",
            "--data-mb",
            "2",
            "--zone-mb",
            "1",
        ],
    )
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
    // The benchmark keeps its cluster in `--dir`/cluster.
    .cluster_dir(dir.path().join("cluster").join("cluster"))
    .timeout(Duration::from_secs(50))
    .run();
    let stdout = &output.stdout;
    assert!(
        output.success(),
        "the benchmark failed: {stdout}\n{}",
        output.stderr
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
    let output = Myriad::new(
        env!("CARGO_BIN_EXE_myriad"),
        ["bench", "recovery-local", "--json", "--zone-mb", "4"],
    )
    .args(["--runs", "1", "--baseline-mb", "8", "--pages", "both"])
    .arg("--dir")
    .arg(dir.path().join("logs"))
    .timeout(Duration::from_secs(300))
    .run();
    assert!(
        output.status.success(),
        "recovery-local failed: {}",
        output.stderr
    );
    let lines: Vec<serde_json::Value> = output
        .stdout
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
