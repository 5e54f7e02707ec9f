//! `myriad peer`'s backup flags are checked before the peer tries to join.

use std::time::Duration;

use myriad_testing::process::Myriad;

fn peer_with(args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("secret");
    myriad_net::secret::create_file(&secret).expect("secret file");
    // Killed on timeout (the flags must be refused before any network wait).
    let output = Myriad::new(env!("CARGO_BIN_EXE_myriad"), ["peer"])
        .args(["--superpeers", "1=127.0.0.1:1", "--data-dir"])
        .arg(dir.path())
        .args(args)
        .env("MYRIAD_SECRET_FILE", &secret)
        .timeout(Duration::from_secs(20))
        .run();
    (output.success(), output.stderr)
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
