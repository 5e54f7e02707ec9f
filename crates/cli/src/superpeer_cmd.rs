//! `myriad superpeer`: runs one member of the superpeer group until SIGTERM, SIGINT or an
//! operator's shutdown request (`myriad term`'s `nodeshutdown`, sent after the superpeer
//! left the Raft group).
//!
//! Settings come from `--config FILE` (TOML, see `myriad_node::config`) with the flags
//! overriding single settings. Once the endpoint is up and Raft has started, the command
//! writes the ready file (if asked): one JSON line
//! `{"role":"superpeer","node_id":1,"address":"127.0.0.1:P","pid":1234}`, written to a
//! temporary file and renamed, so a reader never sees a partial line. On SIGTERM, SIGINT or
//! a shutdown request it shuts down cleanly and exits 0; a bad configuration exits nonzero with the reason.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use myriad_node::config::{NodeConfig, Overrides};
use myriad_node::superpeer::{Superpeer, SuperpeerConfig};

/// How often the process checks whether an operator asked it to stop.
const SHUTDOWN_POLL: Duration = Duration::from_millis(100);

/// Flags of `myriad superpeer`.
#[derive(clap::Args, Debug)]
pub struct SuperpeerArgs {
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// This superpeer's ID (one of --superpeers).
    #[arg(long)]
    id: Option<u16>,
    /// Address to listen on (defaults to this superpeer's entry in --superpeers).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Every superpeer: "1=127.0.0.1:P1,2=127.0.0.1:P2,3=127.0.0.1:P3".
    #[arg(long)]
    superpeers: Option<String>,
    /// Directory of the Raft log and snapshot.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// File holding the cluster secret (mode 0600; default: $MYRIAD_SECRET_FILE, else
    /// the configuration's `secret_file` or `secret`).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Join a running group instead of forming one: a fresh data directory waits until
    /// the leader adds this superpeer (`myriad term -c "superpeeradd ID IP:PORT"`).
    #[arg(long)]
    join: bool,
    /// Write a JSON line here once serving.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// TLS: the certificate directory and name (see `myriad cert`).
    #[command(flatten)]
    tls: crate::TlsArgs,
    /// Exit (status 3) once the parent process is no longer this PID (it died).
    #[arg(long)]
    exit_with_parent: Option<u32>,
    /// HTTP address of the metrics endpoint and status page (`[metrics] listen`; port 0:
    /// any): `/metrics`, `/` (the status page), `/api/status`.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t)]
    log_format: crate::LogFormat,
}

fn write_ready_file(
    path: &Path,
    superpeer: &Superpeer,
    metrics: Option<SocketAddr>,
) -> anyhow::Result<()> {
    let mut ready = serde_json::json!({
        "role": "superpeer",
        "node_id": superpeer.node_id().0,
        "address": superpeer.local_addr().to_string(),
        "pid": std::process::id(),
    });
    if let Some(metrics) = metrics {
        ready["metrics"] = metrics.to_string().into();
    }
    let line = ready.to_string();
    crate::write_atomically(path, &format!("{line}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Loads the configuration, runs the superpeer until a termination signal, shuts down.
pub fn run(args: &SuperpeerArgs) -> anyhow::Result<()> {
    crate::init_tracing(args.log_format);
    let heap = myriad_mem::heap::keep_heap_lean();
    let trimmer = myriad_mem::heap::start_heap_trimmer(myriad_mem::heap::TRIM_INTERVAL);
    tracing::debug!(?heap, trimming = trimmer.is_some(), "process heap policy");
    crate::exit_with_parent(args.exit_with_parent);
    let mut config = match &args.config {
        Some(path) => NodeConfig::load(path)?,
        None => NodeConfig::default(),
    };
    config.apply(&Overrides {
        id: args.id,
        listen: args.listen,
        superpeers: args.superpeers.clone(),
        data_dir: args.data_dir.clone(),
        secret_file: crate::secret_file_arg(args.secret_file.as_deref()),
        tls_dir: args.tls.tls_dir.clone(),
        tls_name: args.tls.tls_name.clone(),
    })?;
    config.read_secret_file()?;
    if let Some(listen) = args.metrics_listen {
        config.metrics.listen = Some(listen);
    }
    let mut superpeer_config = SuperpeerConfig::from_node_config(&config)?;
    superpeer_config.join_existing = args.join;
    // Signal handlers first, so that a SIGTERM right after the ready file is seen is
    // handled as a clean stop.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal runtime")?;
    let (mut terminate, mut interrupt) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _context = runtime.enter();
        (
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        )
    };
    let superpeer = Superpeer::start(superpeer_config)?;
    let http = crate::start_http(config.metrics.listen, || superpeer.http_routes())?;
    if let Some(path) = &args.ready_file {
        write_ready_file(path, &superpeer, http.as_ref().map(|h| h.local_addr()))?;
    }
    // A signal, or an operator's `nodeshutdown` (polled: the flag is set by a handler).
    let signal = runtime.block_on(async {
        let mut poll = tokio::time::interval(SHUTDOWN_POLL);
        loop {
            tokio::select! {
                _ = terminate.recv() => break "SIGTERM",
                _ = interrupt.recv() => break "SIGINT",
                _ = poll.tick() => {
                    if superpeer.shutdown_requested() {
                        break "shutdown request";
                    }
                }
            }
        }
    });
    tracing::info!(signal, "stopping");
    drop(runtime);
    drop(http);
    superpeer.shutdown();
    Ok(())
}
