//! `myriad cluster ...`: start, inspect, stop and drill a local cluster, and change its
//! superpeer group (`myriad cluster superpeer add|remove`, in [`crate::cluster_group`]).
//!
//! A thin command-line face of [`myriad_launcher`]: `start` spawns the nodes with this
//! very binary (`std::env::current_exe()`) and returns once all serve; the other commands
//! reopen `DIR/cluster.json`. Node arguments are the node command-line contract's
//! (`myriad superpeer ...`, `myriad peer ...`). `start`, `stop` and `restart` show a
//! spinner on stderr while they wait, when stderr is a terminal.

use std::path::PathBuf;
use std::time::Duration;

use myriad_launcher::{LaunchSpec, LocalCluster, NodeStatus};

/// `myriad cluster` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum ClusterCommand {
    /// Start superpeers and peers on 127.0.0.1; returns when every node serves.
    Start(StartArgs),
    /// Show each node and whether its process is alive.
    Status {
        /// The cluster directory.
        #[arg(long)]
        dir: PathBuf,
        /// Print JSON (one array of nodes).
        #[arg(long)]
        json: bool,
    },
    /// Stop every node (SIGTERM, then SIGKILL after a bounded wait).
    Stop {
        /// The cluster directory.
        #[arg(long)]
        dir: PathBuf,
        /// Seconds to wait after SIGTERM before SIGKILL.
        #[arg(long, default_value_t = 10)]
        timeout_secs: u64,
    },
    /// SIGKILL one node (a failure drill).
    Kill {
        /// The cluster directory.
        #[arg(long)]
        dir: PathBuf,
        /// Node ID (decimal or 0x hex) or name (`peer-2`).
        #[arg(long)]
        node: String,
    },
    /// Restart one node with its arguments and data directory; without `--node`, every
    /// node that is down (a whole killed cluster: superpeers first, then the peers).
    Restart {
        /// The cluster directory.
        #[arg(long)]
        dir: PathBuf,
        /// Node ID (decimal or 0x hex) or name (`peer-2`); all nodes that are down if absent.
        #[arg(long)]
        node: Option<String>,
        /// Pause between two peers when restarting every node, in milliseconds.
        #[arg(long, default_value_t = 0)]
        peer_gap_ms: u64,
    },
    /// Grow, shrink or repair the superpeer group (Raft membership changes).
    #[command(subcommand)]
    Superpeer(crate::cluster_group::SuperpeerCommand),
}

/// Options of `myriad cluster start`.
#[derive(clap::Args, Debug)]
pub struct StartArgs {
    /// The cluster directory (logs, data, ready files, cluster.json).
    #[arg(long)]
    dir: PathBuf,
    /// Number of superpeers: 1, 3 or 5.
    #[arg(long, default_value_t = 1)]
    superpeers: usize,
    /// Number of peers.
    #[arg(long, default_value_t = 1)]
    peers: usize,
    /// Memory of each peer in MiB. Without `--config`, the peers' backup logs are scaled
    /// to it (`DIR/peer-backup.toml`; the node defaults from 1024 MiB on).
    #[arg(long)]
    peer_memory_mb: Option<u64>,
    /// Configuration file given to every node.
    #[arg(long)]
    config: Option<PathBuf>,
    /// File holding the cluster secret (mode 0600), given to every node as
    /// `--secret-file`; default: DIR/secret, created with a random secret if missing.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// TLS for every connection: a cluster CA and certificates in DIR/tls (created if
    /// missing; clients use DIR/tls/client.pem).
    #[arg(long)]
    tls: bool,
    /// Seconds to wait for each group of nodes to be ready.
    #[arg(long, default_value_t = 30)]
    ready_timeout_secs: u64,
    /// Run the nodes with this binary instead of this `myriad` (development and tests).
    #[arg(long, hide = true)]
    binary: Option<PathBuf>,
}

/// Runs a `myriad cluster` subcommand.
pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Start(args) => {
            let binary = match args.binary {
                Some(binary) => binary,
                None => std::env::current_exe()?,
            };
            let mut spec = LaunchSpec::new(&args.dir, binary);
            // The nodes run on in the background after this command returns.
            spec.exit_with_parent = false;
            spec.superpeers = args.superpeers;
            spec.peers = args.peers;
            spec.peer_memory_mb = args.peer_memory_mb;
            spec.ready_timeout = Duration::from_secs(args.ready_timeout_secs);
            if let Some(config) = &args.config {
                spec.extra_args.push("--config".into());
                spec.extra_args.push(config.display().to_string());
            }
            spec.secret_file = args.secret_file.clone();
            spec.tls = args.tls;
            let spinner = spinner(format!(
                "starting {} superpeers and {} peers",
                spec.superpeers, spec.peers
            ));
            let started = LocalCluster::start(spec);
            spinner.finish_and_clear();
            let mut cluster = started?;
            println!("cluster started in {}", cluster.dir().display());
            print!("{}", render_status(&cluster.status()));
            println!("superpeers: {}", cluster.superpeer_list());
            println!("secret file: {}", cluster.secret_file().display());
            if let Some(tls) = cluster.tls_dir() {
                println!(
                    "TLS directory: {} (clients: --tls-name client)",
                    tls.display()
                );
            }
            Ok(())
        }
        ClusterCommand::Status { dir, json } => {
            let mut cluster = LocalCluster::open(&dir)?;
            let status = cluster.status();
            if json {
                println!("{}", serde_json::to_string(&status)?);
            } else {
                print!("{}", render_status(&status));
            }
            Ok(())
        }
        ClusterCommand::Stop { dir, timeout_secs } => {
            let mut cluster = LocalCluster::open(&dir)?;
            cluster.set_stop_timeout(Duration::from_secs(timeout_secs));
            let spinner = spinner(format!("stopping {} nodes", cluster.nodes().len()));
            let stopped = cluster.stop();
            spinner.finish_and_clear();
            let killed = stopped?;
            if killed.is_empty() {
                println!("stopped {} nodes", cluster.nodes().len());
            } else {
                println!(
                    "stopped {} nodes; SIGKILL needed for: {}",
                    cluster.nodes().len(),
                    killed.join(", ")
                );
            }
            Ok(())
        }
        ClusterCommand::Kill { dir, node } => {
            let mut cluster = LocalCluster::open(&dir)?;
            let entry = cluster.find(&node)?.clone();
            cluster.kill_named(&entry.name)?;
            println!(
                "killed {} (node 0x{:04x}, pid {})",
                entry.name, entry.node_id, entry.pid
            );
            Ok(())
        }
        ClusterCommand::Restart {
            dir,
            node,
            peer_gap_ms,
        } => {
            let mut cluster = LocalCluster::open(&dir)?;
            let spinner = spinner("restarting".to_owned());
            let restarted = match node {
                Some(node) => cluster.restart(&node).map(|entry| vec![entry]),
                None => cluster.restart_all(std::time::Duration::from_millis(peer_gap_ms)),
            };
            spinner.finish_and_clear();
            let entries = restarted?;
            if entries.is_empty() {
                println!("every node is alive; nothing restarted");
            }
            for entry in entries {
                println!(
                    "restarted {} (node 0x{:04x}, {}, pid {})",
                    entry.name, entry.node_id, entry.address, entry.pid
                );
            }
            Ok(())
        }
        ClusterCommand::Superpeer(command) => crate::cluster_group::run(command),
    }
}

/// A spinner with `message` and the time elapsed on stderr, ticking on its own thread;
/// hidden when stderr is no terminal (scripts and logs never see it).
fn spinner(message: String) -> indicatif::ProgressBar {
    let spinner = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        spinner.set_style(style);
    }
    spinner.set_message(message);
    spinner.enable_steady_tick(Duration::from_millis(100));
    spinner
}

/// The node table: name, role, node ID, address, metrics address, pid, alive, log.
fn render_status(nodes: &[NodeStatus]) -> String {
    let header = [
        "NAME", "ROLE", "NODE", "ADDRESS", "METRICS", "PID", "STATE", "LOG",
    ]
    .map(String::from);
    let mut rows = vec![header.to_vec()];
    for status in nodes {
        let node = &status.node;
        rows.push(vec![
            node.name.clone(),
            node.role.to_string(),
            format!("0x{:04x}", node.node_id),
            node.address.clone(),
            node.metrics.clone().unwrap_or_else(|| "-".to_owned()),
            node.pid.to_string(),
            if status.alive { "alive" } else { "dead" }.to_string(),
            node.log.display().to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|column| rows.iter().map(|row| row[column].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
