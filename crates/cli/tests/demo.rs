//! The README's main job, `myriad demo`, run as a real process with a small load: it
//! starts its cluster, loads and checks chunks, runs the workload, SIGKILLs a peer and
//! reads every chunk of that peer back from the restorers, then stops every node.

use std::time::Duration;

use myriad_testing::process::Myriad;

/// Longest the demo may take here before the test kills it (its nodes exit with it).
const DEMO_TIMEOUT: Duration = Duration::from_secs(50);

#[test]
fn the_demo_recovers_a_killed_peer_and_checks_every_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let output = Myriad::new(
        env!("CARGO_BIN_EXE_myriad"),
        [
            "demo",
            "--chunks",
            "30000",
            "--workload-seconds",
            "1",
            "--dir",
        ],
    )
    .arg(dir.path().join("cluster"))
    .cluster_dir(dir.path().join("cluster"))
    .timeout(DEMO_TIMEOUT)
    .run();
    let (stdout, stderr) = (&output.stdout, &output.stderr);
    let status = output.status;
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
