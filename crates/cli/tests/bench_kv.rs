//! `myriad bench kv` end to end on a tiny key space: each mode's cluster starts with its
//! replication, every row carries throughput and CPU figures, and every Myriad row is
//! paired with the Redis row of equal mode, clients and depth (or says why it has none).
//! With `--tls` the Myriad side runs plain and with TLS and prints TLS / plain ratios.
//! Figures are not checked: this is not a timed test. The benchmark kills its own nodes
//! and Redis servers; the harness kills the benchmark and the cluster's nodes if it hangs.

use std::time::Duration;

use myriad_testing::process::Myriad;
use serde_json::Value;

fn redis_installed() -> bool {
    ["redis-server", "redis-benchmark"].iter().all(|binary| {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| dir.join(binary).is_file())
        })
    })
}

/// Runs the bench with `args` for one mode on `peers` peers; returns its JSON lines.
fn bench(mode: &str, peers: &str, extra: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Myriad::new(env!("CARGO_BIN_EXE_myriad"), ["bench", "kv", "--json"])
        .args(["--modes", mode, "--peers", peers, "--threads", "2"])
        .args(["--batch", "4", "--keys", "500", "--no-memcached"])
        .args([
            "--duration-secs",
            "0.3",
            "--warmup-secs",
            "0.1",
            "--idle-secs",
            "0.3",
        ])
        .args(extra)
        .arg("--dir")
        .arg(dir.path())
        .cluster_dir(
            dir.path()
                .join(format!("{mode}-peers-{peers}"))
                .join("cluster"),
        )
        .timeout(Duration::from_secs(50))
        .run();
    assert!(
        output.success(),
        "the benchmark failed: {}\n{}",
        output.stdout,
        output.stderr
    );
    output
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("every line is JSON"))
        .collect()
}

fn results<'a>(lines: &'a [Value], system: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|line| line["kind"] == "result" && line["system"] == system)
        .collect()
}

fn check_ratios(lines: &[Value], myriad_rows: usize) {
    let ratios: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "ratio").collect();
    assert_eq!(ratios.len(), myriad_rows, "one ratio line per Myriad row");
    for ratio in ratios {
        if redis_installed() {
            // Both figures are positive (checked per row): the ratio must be printed.
            assert!(ratio["ratio"].as_f64().is_some(), "{ratio}");
        } else {
            assert_eq!(ratio["missing"], "redis not installed", "{ratio}");
        }
    }
}

#[test]
fn replicated_mode_runs_r2_against_redis_with_replicas_and_wait() {
    let lines = bench("replicated", "3", &["--inflight", "0"]);
    let myriad = results(&lines, "myriad");
    // get and put, depth 1 and 4, threads driver only (no async driver in this mode).
    assert_eq!(myriad.len(), 4, "{lines:?}");
    for row in &myriad {
        assert_eq!(row["mode"], "replicated");
        assert_eq!(row["driver"], "threads");
        assert!(
            row["ops_per_sec"].as_f64().is_some_and(|r| r > 0.0),
            "{row}"
        );
        assert!(
            row["server_cpu_s_per_mop"]
                .as_f64()
                .is_some_and(|c| c > 0.0),
            "{row}"
        );
    }
    let idle = lines
        .iter()
        .find(|l| l["kind"] == "idle_cpu" && l["system"] == "myriad")
        .expect("an idle CPU line");
    assert_eq!(idle["processes"], 4, "3 peers and a superpeer: {idle}");
    if redis_installed() {
        let redis = results(&lines, "redis");
        assert_eq!(redis.len(), 4, "{lines:?}");
        let idle = lines
            .iter()
            .find(|l| l["kind"] == "idle_cpu" && l["system"] == "redis")
            .expect("a redis idle CPU line");
        assert_eq!(idle["processes"], 3, "a master and 2 replicas: {idle}");
    }
    check_ratios(&lines, myriad.len());
}

#[test]
fn mode_none_runs_both_drivers_and_skips_r2_modes_on_one_peer() {
    let lines = bench("none", "1", &["--inflight", "3"]);
    let myriad = results(&lines, "myriad");
    // (threads + async) x (get, put) x (depth 1, 4).
    assert_eq!(myriad.len(), 8, "{lines:?}");
    assert!(myriad
        .iter()
        .any(|r| r["driver"] == "async" && r["clients"] == 3));
    if redis_installed() {
        assert!(results(&lines, "redis")
            .iter()
            .any(|r| r["driver"] == "redis-benchmark" && r["clients"] == 3));
    }
    check_ratios(&lines, myriad.len());

    let skipped = bench("async", "1", &["--no-redis"]);
    assert!(results(&skipped, "myriad").is_empty());
    assert!(
        skipped
            .iter()
            .any(|l| l["kind"] == "not_run" && l["mode"] == "async"),
        "{skipped:?}"
    );
}

#[test]
fn tls_runs_the_myriad_side_plain_and_with_tls_and_prints_their_ratios() {
    let lines = bench("none", "1", &["--tls", "--no-redis", "--inflight", "0"]);
    let plain = results(&lines, "myriad");
    let tls = results(&lines, "myriad-tls");
    // get and put, depth 1 and 4, threads driver, each plain and with TLS.
    assert_eq!(plain.len(), 4, "{lines:?}");
    assert_eq!(tls.len(), 4, "{lines:?}");
    for row in &tls {
        assert_eq!(row["object_bytes"], 64, "{row}");
        assert!(
            row["ops_per_sec"].as_f64().is_some_and(|r| r > 0.0),
            "{row}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l["kind"] == "idle_cpu" && l["system"] == "myriad-tls"),
        "the TLS cluster settled and idled: {lines:?}"
    );
    let ratios: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "tls_ratio").collect();
    assert_eq!(
        ratios.len(),
        4,
        "one TLS / plain line per TLS row: {lines:?}"
    );
    for op in ["get", "put"] {
        assert!(ratios.iter().any(|r| r["op"] == op), "{op}: {ratios:?}");
    }
    for ratio in &ratios {
        for figure in ["throughput_ratio", "p50_ratio", "p99_ratio"] {
            assert!(
                ratio[figure].as_f64().is_some_and(|r| r > 0.0),
                "{figure}: {ratio}"
            );
        }
    }
    // TLS rows are compared with plain Myriad only, never with a baseline.
    assert!(!lines.iter().any(|l| l["kind"] == "ratio"), "{lines:?}");
}
