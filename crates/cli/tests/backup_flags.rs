//! `myriad peer`'s backup flags are checked before the peer tries to join.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn peer_with(args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_myriad"))
        .arg("peer")
        .args(["--superpeers", "1=127.0.0.1:1", "--data-dir"])
        .arg(dir.path())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Killed on timeout (the flags must be refused before any network wait).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            return (status.success(), stderr);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("myriad peer {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_backup_flags_are_refused_with_a_reason() {
    let (ok, stderr) = peer_with(&["--durability", "eventually"]);
    assert!(!ok);
    assert!(stderr.contains("durability"), "{stderr}");
    let (ok, stderr) = peer_with(&["--replication", "99"]);
    assert!(!ok);
    assert!(stderr.contains("replication"), "{stderr}");
    let (ok, stderr) = peer_with(&["--zone-mb", "0"]);
    assert!(!ok);
    assert!(stderr.contains("zone_mb"), "{stderr}");
}
