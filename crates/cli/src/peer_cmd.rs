//! `myriad peer`: runs one peer until SIGTERM/SIGINT (or a remote shutdown request), or
//! until it learns that the superpeers declared it failed (then it exits with an error).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use myriad_client::membership::JoinConfig;
use myriad_meta::Role;
use myriad_node::config::{NodeConfig, Overrides};
use myriad_node::peer_node::{ComputeSetup, PeerNode, PeerOptions};

/// Options of `myriad peer` (each overrides the config file's setting).
#[derive(clap::Args, Debug, Clone)]
pub struct PeerArgs {
    /// TOML configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Listen address (port 0: the OS picks one).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// The IP address other nodes reach this peer at (with the listener's port), when it
    /// listens on 0.0.0.0 or behind NAT (`advertise` in the configuration).
    #[arg(long)]
    pub advertise: Option<std::net::IpAddr>,
    /// The superpeers, "ID=HOST:PORT,ID=HOST:PORT".
    #[arg(long)]
    pub superpeers: Option<String>,
    /// Directory of the peer's persistent state (its node ID).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// File holding the cluster secret (mode 0600; default: $MYRIAD_SECRET_FILE, else
    /// the configuration's `secret_file` or `secret`).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// TLS: the certificate directory and name (see `myriad cert`).
    #[command(flatten)]
    pub tls: crate::TlsArgs,
    /// Memory for chunks, in MiB.
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// MiB of chunk memory kept resident ahead of use (`peer.prefault_mb`; 0: none).
    #[arg(long)]
    pub prefault_mb: Option<u64>,
    /// Rack number (for rack-aware backup placement).
    #[arg(long)]
    pub rack: Option<u16>,
    /// Switch number.
    #[arg(long)]
    pub switch: Option<u16>,
    /// Backups per zone (R; 0: no replication of this peer's chunks). At most as many
    /// backups as other alive backup-capable peers exist when a zone is placed.
    #[arg(long)]
    pub replication: Option<usize>,
    /// Default durability of changes: async, replicated or durable.
    #[arg(long)]
    pub durability: Option<String>,
    /// Payload MiB per backup zone.
    #[arg(long)]
    pub zone_mb: Option<u64>,
    /// Write `{"role","node_id","address","pid"}` here (atomically) once serving.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Exit (status 3) once the parent process is no longer this PID (it died).
    #[arg(long)]
    pub exit_with_parent: Option<u32>,
    /// HTTP address of the metrics endpoint, `/metrics` (`[metrics] listen`; port 0: any).
    #[arg(long)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t)]
    pub log_format: crate::LogFormat,
}

/// Runs the peer until it is told to stop, with the jobs, tasks and applications of
/// `registry` (a user's own peer binary passes its own, see `myriad::main_with`).
pub fn run(args: &PeerArgs, registry: myriad_compute::Registry) -> anyhow::Result<()> {
    crate::init_tracing(args.log_format);
    let heap = myriad_mem::heap::keep_heap_lean();
    let trimmer = myriad_mem::heap::start_heap_trimmer(myriad_mem::heap::TRIM_INTERVAL);
    tracing::debug!(?heap, trimming = trimmer.is_some(), "process heap policy");
    let mut config = match &args.config {
        Some(path) => NodeConfig::load(path)?,
        None => NodeConfig::default(),
    };
    config.apply(&Overrides {
        id: None,
        listen: args.listen,
        superpeers: args.superpeers.clone(),
        data_dir: args.data_dir.clone(),
        secret_file: crate::secret_file_arg(args.secret_file.as_deref()),
        tls_dir: args.tls.tls_dir.clone(),
        tls_name: args.tls.tls_name.clone(),
    })?;
    config.read_secret_file()?;
    if let Some(memory_mb) = args.memory_mb {
        config.peer.memory_mb = memory_mb;
    }
    if let Some(prefault_mb) = args.prefault_mb {
        config.peer.prefault_mb = Some(prefault_mb);
    }
    if let Some(rack) = args.rack {
        config.rack = rack;
    }
    if let Some(switch) = args.switch {
        config.switch = switch;
    }
    if let Some(replication) = args.replication {
        config.backup.replication = replication;
    }
    if let Some(durability) = &args.durability {
        config.backup.durability = durability.clone();
    }
    if let Some(zone_mb) = args.zone_mb {
        config.backup.zone_mb = zone_mb;
    }
    if let Some(listen) = args.metrics_listen {
        config.metrics.listen = Some(listen);
    }
    config.validate()?;
    let backup = config.backup.options()?;
    if config.superpeers.is_empty() {
        anyhow::bail!("no superpeers configured: pass --superpeers \"1=HOST:PORT,...\"");
    }
    if config.peer.memory_mb == 0 {
        anyhow::bail!("--memory-mb must be positive");
    }
    let mut join = JoinConfig::new(config.superpeer_list(), Role::Peer);
    join.listen = config.listen;
    join.capabilities = config.capability_flags()?;
    join.rack = config.rack;
    join.switch = config.switch;
    join.secret = config.secret.clone().into_bytes();
    join.handler_threads = config.peer.handler_threads.max(1);
    join.tls = config.tls_config()?;
    join.advertise = args
        .advertise
        .map(|ip| std::net::SocketAddr::new(ip, 0))
        .or(config.advertise);
    let node = PeerNode::start(PeerOptions {
        join,
        memory_bytes: config.peer.memory_mb << 20,
        data_dir: config.data_dir.clone(),
        handler_threads: config.peer.handler_threads,
        prefault_bytes: config.prefault_bytes(),
        backup,
        compute: ComputeSetup {
            config: config.compute.config()?,
            registry,
        },
    })
    .context("starting the peer")?;
    let http = crate::start_http(config.metrics.listen, || {
        Arc::new(myriad_node::ops::peer_metrics::PeerRoutes::new(&node))
    })?;
    if let Some(path) = &args.ready_file {
        let mut ready = serde_json::json!({
            "role": "peer",
            "node_id": node.node_id().0,
            "address": node.address().to_string(),
            "pid": std::process::id(),
        });
        if let Some(http) = &http {
            ready["metrics"] = http.local_addr().to_string().into();
        }
        crate::write_atomically(path, &format!("{ready}\n"))?;
    }
    tracing::info!(
        node = %node.node_id(),
        address = %node.address(),
        memory_mb = config.peer.memory_mb,
        "peer serving"
    );
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    while !stop.load(Ordering::Relaxed) && !node.shutdown_requested() {
        if let Some(line) = node.declared_failed() {
            // Its memory is stale: answer NotOwner a moment longer (clients still routing
            // here are redirected), then exit with an error.
            let line = line.to_owned();
            tracing::error!(node = %node.node_id(), "{line}");
            std::thread::sleep(myriad_node::peer_node::DECLARED_FAILED_LINGER);
            drop(http);
            node.shutdown();
            anyhow::bail!("peer declared failed: {line}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    tracing::info!(node = %node.node_id(), "peer leaving");
    drop(http);
    node.shutdown();
    Ok(())
}
