//! Node logs: a local cluster's log files carry no terminal colour codes (the nodes write
//! to a file, not a terminal), and `--log-format json` makes a node write one JSON object
//! per line, for log shippers.
//!
//! Every process is SIGKILLed by the harness when the test ends (also on a panic).

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use myriad_testing::process::{wait_until, Cluster, Process};

const BINARY: &str = env!("CARGO_BIN_EXE_myriad");

#[test]
fn log_files_have_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::builder(BINARY, dir.path())
        .superpeers(1)
        .peers(1)
        .peer_memory_mb(64)
        .start();
    for node in cluster.nodes() {
        let log = node.log.clone();
        let name = node.name.clone();
        // The metrics endpoint's line is logged at start through tracing.
        wait_until(Duration::from_secs(10), "a tracing line in the log", || {
            std::fs::read_to_string(&log).is_ok_and(|text| text.contains("metrics endpoint"))
        });
        let text = std::fs::read_to_string(&log).expect("log");
        assert!(text.contains(" INFO "), "{name}: no INFO line in {text}");
        assert!(
            !text.contains('\u{1b}'),
            "{name}: escape codes in {}:\n{text}",
            log.display()
        );
    }
}

#[test]
fn json_log_format_writes_one_object_per_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port");
    let ready = dir.path().join("ready");
    let log = dir.path().join("superpeer.log");
    // Nodes need a cluster secret, from a file only its owner can read.
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "json log test secret\n").expect("secret file");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod 600");
    let mut process = Process::spawn(
        Command::new(BINARY)
            .args(["superpeer", "--id", "1", "--log-format", "json"])
            .arg("--secret-file")
            .arg(&secret)
            .arg("--superpeers")
            .arg(format!("1={port}"))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--ready-file")
            .arg(&ready)
            .args(["--metrics-listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file")),
        "superpeer with JSON logs",
    );
    wait_until(Duration::from_secs(20), "the ready file", || ready.exists());
    wait_until(Duration::from_secs(10), "the metrics line", || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("metrics endpoint"))
    });
    process.kill();
    let text = std::fs::read_to_string(&log).expect("log");
    let mut lines = 0;
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {line:?}\nlog:\n{text}"));
        assert!(value["timestamp"].is_string(), "{line}");
        assert!(value["level"].is_string(), "{line}");
        assert!(value["fields"].is_object(), "{line}");
        lines += 1;
    }
    assert!(lines >= 1, "no log lines:\n{text}");
    let metrics = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|value| value["fields"]["message"] == "metrics endpoint listening")
        .unwrap_or_else(|| panic!("no metrics line in\n{text}"));
    assert!(
        metrics["fields"]["address"]
            .as_str()
            .is_some_and(|address| address.starts_with("127.0.0.1:")),
        "{metrics}"
    );
}
