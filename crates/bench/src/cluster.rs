//! Starting the local cluster a benchmark measures: one superpeer and `peers` peers of this
//! executable, each given the same config file.
//!
//! **Invariants.** The config file is written into `dir` before any node starts; the
//! cluster lives under `dir/cluster` and stops when the returned [`LocalCluster`] drops.
//!
//! **Callers.** The benchmarks that need a cluster of their own (`balance`, `jobs`,
//! `graph500`).

use std::path::Path;
use std::time::Duration;

use myriad_launcher::{LaunchSpec, LocalCluster, NodeRole};
use myriad_types::NodeId;

/// Writes `config` to `dir/config_name`, starts 1 superpeer and `peers` peers with
/// `peer_memory_mb` each and that config, and returns the cluster with its peers' IDs in
/// ascending order.
pub fn start_local(
    dir: &Path,
    config_name: &str,
    config: &str,
    peers: usize,
    peer_memory_mb: u64,
) -> Result<(LocalCluster, Vec<NodeId>), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let config_file = dir.join(config_name);
    std::fs::write(&config_file, config).map_err(|e| e.to_string())?;
    let binary = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    let mut spec = LaunchSpec::new(dir.join("cluster"), binary);
    spec.superpeers = 1;
    spec.peers = peers;
    spec.peer_memory_mb = Some(peer_memory_mb);
    spec.ready_timeout = Duration::from_secs(30);
    spec.extra_args = vec!["--config".into(), config_file.display().to_string()];
    let cluster = LocalCluster::start_owned(spec).map_err(|e| e.to_string())?;
    let mut ids: Vec<NodeId> = cluster
        .nodes()
        .iter()
        .filter(|node| node.role == NodeRole::Peer)
        .map(|node| NodeId(node.node_id))
        .collect();
    ids.sort_unstable();
    Ok((cluster, ids))
}
