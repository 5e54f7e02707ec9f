//! `--exit-with-parent PID`: a node whose parent dies exits by itself, so nodes started by
//! a test, a benchmark or the demo never outlive a killed caller. A shell starts a real
//! superpeer with `--exit-with-parent $$` and waits; once the superpeer serves (its ready
//! file), the shell is SIGKILLed and the superpeer must be gone within a few seconds.
//! Every process is killed by the guards, also when the test fails.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use myriad_testing::process::{poll_until, Process};

/// SIGKILLs the node (by pid, once known) on drop: it is the shell's child, not ours.
struct NodeGuard(Option<u32>);

impl Drop for NodeGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

fn ready_pid(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    let line: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    line["pid"].as_u64().and_then(|pid| u32::try_from(pid).ok())
}

#[test]
fn a_node_exits_when_its_parent_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let ready = dir.path().join("ready.json");
    myriad_net::secret::create_file(&dir.path().join("secret")).expect("secret file");
    let script = r#"node="$1"; port="$2"; dir="$3"
"$node" superpeer --id 1 --listen "127.0.0.1:$port" --superpeers "1=127.0.0.1:$port" \
  --data-dir "$dir/data" --secret-file "$dir/secret" --ready-file "$dir/ready.json" --exit-with-parent $$ \
  > "$dir/node.log" 2>&1 &
wait"#;
    let mut node = NodeGuard(None);
    let mut shell = Process::spawn(
        Command::new("sh")
            .args(["-c", script, "sh", env!("CARGO_BIN_EXE_myriad")])
            .arg(port.to_string())
            .arg(dir.path())
            .stdin(Stdio::null()),
        "sh",
    );
    assert!(
        poll_until(Duration::from_secs(20), || ready_pid(&ready).is_some()),
        "the superpeer did not start: {}",
        std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default()
    );
    let pid = ready_pid(&ready).expect("pid in the ready file");
    node.0 = Some(pid);
    assert!(alive(pid));
    // The node still runs a while after its parent is gone only by the check interval.
    shell.kill();
    assert!(
        poll_until(Duration::from_secs(10), || !alive(pid)),
        "the superpeer outlived its parent"
    );
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
    assert!(log.contains("is gone"), "no exit message in: {log}");
}
