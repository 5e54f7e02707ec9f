//! Helpers of the process tests that drive a local cluster directory through `myriad
//! cluster ...` (each such test file includes this module with `#[path]`): run a
//! subcommand, require its success, and connect a client as `cluster.json` describes the
//! cluster now.

use std::path::Path;
use std::time::Duration;

use myriad_client::client::Client;
use myriad_launcher::LocalCluster;
use myriad_testing::process::{Myriad, Output};

/// The `myriad` binary under test.
pub const BINARY: &str = env!("CARGO_BIN_EXE_myriad");

/// Runs `myriad cluster ARGS --dir DIR`, killed after `timeout`.
pub fn cluster_cmd(dir: &Path, args: &[&str], timeout: Duration) -> Output {
    Myriad::new(BINARY, ["cluster"])
        .args(args)
        .arg("--dir")
        .arg(dir)
        .timeout(timeout)
        .run()
}

/// [`cluster_cmd`] with a 50 s bound that must succeed; its standard output.
pub fn ok(dir: &Path, args: &[&str]) -> String {
    let output = cluster_cmd(dir, args, Duration::from_secs(50));
    assert!(
        output.success(),
        "{args:?}: {}\n{}",
        output.stdout,
        output.stderr
    );
    output.stdout
}

/// A client of the cluster as `cluster.json` describes it now.
pub fn client(dir: &Path) -> Client {
    let cluster = LocalCluster::open(dir).expect("cluster.json");
    Client::connect(cluster.superpeers(), cluster.secret().expect("secret")).expect("joins")
}
