//! `myriad bench balance` end to end with small counts: it must start its cluster, load
//! one peer, run balancing rounds that move chunks to the idle peers, and print the summary
//! with every figure. The throughput figures are not checked (this is not a timed test);
//! what is checked is the balancer's effect on where the requests go: every request on
//! one peer before, well under half of them on the busiest peer after; and, with half of
//! the reads on a sub-range of 512 of the busy peer's 3,000 chunks, that the first round
//! moves exactly that sub-range (found from the peer's per-range request counters in its
//! monitoring reports).

use std::time::Duration;

use myriad_testing::process::Myriad;
use serde_json::Value;

#[test]
fn the_balancer_spreads_a_skewed_load_and_the_benchmark_prints_its_figures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Myriad::new(env!("CARGO_BIN_EXE_myriad"), ["bench", "balance", "--json"])
        .args(["--peers", "3", "--chunks", "3000", "--threads", "4"])
        .args(["--seconds", "2", "--window-ms", "700", "--min-rate", "50"])
        .args(["--hot-chunks", "512", "--hot-share", "0.5"])
        .arg("--dir")
        .arg(dir.path().join("bench"))
        .cluster_dir(dir.path().join("bench").join("cluster"))
        .timeout(Duration::from_secs(55))
        .run();
    assert!(output.success(), "bench balance failed: {output:#?}");
    let lines: Vec<Value> = output
        .stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .collect();
    let summary = lines
        .iter()
        .find(|value| value["case"] == "summary")
        .unwrap_or_else(|| panic!("no summary line: {output:#?}"));
    for key in ["before_reads_per_sec", "after_reads_per_sec", "speedup"] {
        let value = summary[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing: {summary}"));
        assert!(value > 0.0, "{key} = {value}: {summary}");
    }
    assert_eq!(summary["read_errors"], 0, "{summary}");
    let moved = summary["moved_chunks"].as_u64().expect("moved_chunks");
    assert!((512..=3_000).contains(&moved), "{summary}");
    // The first round that moved took exactly the hot sub-range, picked by its rate.
    let hot = [
        summary["hot_first"].as_str().expect("hot_first"),
        summary["hot_last"].as_str().expect("hot_last"),
    ];
    let first = lines
        .iter()
        .find(|value| value["case"] == "round" && value["moved"].as_u64() > Some(0))
        .unwrap_or_else(|| panic!("no round moved anything: {output:#?}"));
    assert_eq!(first["by_hot_ranges"], true, "{first}");
    assert_eq!(first["moved"], 512, "{first}");
    assert_eq!(first["moved_ranges"], serde_json::json!([hot]), "{first}");
    let before = summary["before_max_share"].as_f64().expect("before share");
    let after = summary["after_max_share"].as_f64().expect("after share");
    assert!(before > 0.95, "all load on one peer first: {summary}");
    assert!(
        after < 0.5,
        "the busiest peer still serves {after}: {summary}"
    );
    assert!(
        lines
            .iter()
            .filter(|value| value["case"] == "round")
            .count()
            >= 2,
        "{output:#?}"
    );
}
