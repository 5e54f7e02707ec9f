//! The README's main job, `myriad demo`, run as a real process with a small load: it
//! starts its cluster, loads and checks chunks, runs the workload, SIGKILLs a peer and
//! reads every chunk of that peer back from the restorers, then stops every node.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest the demo may take here before the test kills it (its nodes exit with it).
const DEMO_TIMEOUT: Duration = Duration::from_secs(50);

#[test]
fn the_demo_recovers_a_killed_peer_and_checks_every_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_myriad"))
        .args([
            "demo",
            "--chunks",
            "30000",
            "--workload-seconds",
            "1",
            "--dir",
        ])
        .arg(dir.path().join("cluster"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the demo starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > DEMO_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status =
        status.unwrap_or_else(|| panic!("the demo ran over {DEMO_TIMEOUT:?}:\n{stdout}\n{stderr}"));
    assert!(
        status.success(),
        "demo failed ({status}):\n{stdout}\n{stderr}"
    );
    for expected in [
        "loaded 30000 chunks",
        "checked 1,000 random chunks: every byte as written",
        "failure drill: SIGKILL to peer",
        "read back and checked after",
        "Done by",
        "done in",
    ] {
        assert!(
            stdout.contains(expected),
            "no {expected:?} in:\n{stdout}\n{stderr}"
        );
    }
    // The killed peer holds a third of the chunks (three peers, batches in turn), and
    // the summary lists only the two survivors, which now hold all of them.
    let summary: Vec<&str> = stdout
        .lines()
        .skip_while(|line| !line.starts_with("peer "))
        .skip(1)
        .take_while(|line| !line.is_empty())
        .collect();
    assert_eq!(summary.len(), 2, "{stdout}");
    let held: u64 = summary
        .iter()
        .map(|line| {
            line.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(held, 30_000, "{stdout}");
}
