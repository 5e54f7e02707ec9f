//! `myriad bench jobs` end to end with small counts: it must start its cluster, form a
//! compute group and print its summary line with every figure (the figures are not
//! checked against targets: this is not a timed test).

use std::time::Duration;

use myriad_testing::process::Myriad;
use serde_json::Value;

#[test]
fn the_jobs_benchmark_prints_every_summary_figure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Myriad::new(env!("CARGO_BIN_EXE_myriad"), ["bench", "jobs", "--json"])
        .args(["--peers", "3", "--jobs", "5000", "--remote-jobs", "500"])
        .args(["--rounds", "20", "--tasks", "3", "--chunks", "10"])
        .arg("--dir")
        .arg(dir.path().join("bench"))
        // The benchmark keeps its cluster in `--dir`/cluster.
        .cluster_dir(dir.path().join("bench").join("cluster"))
        .timeout(Duration::from_secs(50))
        .run();
    assert!(output.success(), "bench jobs failed: {output:#?}");
    let summary: Value = output
        .stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|value| value["case"] == "summary")
        .unwrap_or_else(|| panic!("no summary line: {output:#?}"));
    for key in [
        "local_jobs_per_sec",
        "rayon_jobs_per_sec",
        "remote_jobs_per_sec",
        "delegated_jobs_per_sec",
        "superstep_p50_us",
    ] {
        let value = summary[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing: {summary}"));
        assert!(value > 0.0, "{key} = {value}: {summary}");
    }
    assert_eq!(summary["peers"], 3);
}
