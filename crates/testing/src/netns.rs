//! Network namespaces for the multi-host tests (`partition`, `multihost` in the cli tests):
//! running `ip` and deciding whether this machine can run them at all.
//!
//! **Invariants.** Nothing here creates a namespace on its own: the tests create and delete
//! theirs (on drop). [`unavailable`] names the reason a test cannot run, so the test can
//! say so instead of passing silently.
//!
//! **Callers.** The cli's namespace tests.

use std::process::Command;

/// Runs `ip` with `args`; the error output on failure.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|error| format!("running ip: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Why this machine cannot run a namespace test (not root, no `ip`), or `None` if it can.
pub fn unavailable() -> Option<String> {
    let Ok(uid) = Command::new("id").arg("-u").output() else {
        return Some("`id -u` does not run".into());
    };
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(output) if output.status.success() => None,
        _ => Some("no `ip` command".into()),
    }
}
