//! The `myriad` command line as a library: one binary with a subcommand per role, tool
//! and benchmark.
//!
//! # Job
//! [`main_with`] parses the command line and runs the subcommand. The `myriad` binary
//! calls it with the built-in jobs and tasks; a user's own peer binary (an application
//! that runs inside the peers, see `examples/chunk-scan` and docs/compute.md) calls it with
//! its own [`myriad_compute::Registry`]: it then is a complete `myriad` (superpeer, peer,
//! term, cluster, bench) whose peers run the user's jobs, tasks and applications. Every
//! peer also gets the graph tasks (`graph.load`, `graph.bfs`, ..., `myriad_graph`), so
//! `myriad bench graph500` works with any such binary.
//!
//! # Who calls it
//! `src/main.rs` and user binaries.

use clap::{Parser, Subcommand};

mod cluster;
mod cluster_group;
mod demo;
mod peer_cmd;
mod superpeer_cmd;
mod term;

/// Myriad: a distributed in-memory key-value store for billions of small objects.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the demo: a local cluster loaded and exercised through the client.
    Demo(demo::DemoArgs),
    /// Run one member of the superpeer group (metadata, membership, failure detection).
    Superpeer(superpeer_cmd::SuperpeerArgs),
    /// Run a peer: store chunks and serve them (joins through the superpeers).
    Peer(peer_cmd::PeerArgs),
    /// Start, inspect, stop and drill a local cluster; change its superpeer group.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// The terminal: DXTerm's commands, interactive or one-shot (-c).
    Term(term::TermArgs),
    /// Benchmarks that print their figures.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// TLS certificates: a cluster CA and the node and client certificates it signs.
    #[command(subcommand)]
    Cert(CertCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// The memory manager under the DXMem workloads.
    Mem(myriad_bench::mem::MemArgs),
    /// The messaging layer between two processes on 127.0.0.1.
    Net(myriad_bench::net::NetArgs),
    /// The server half of `bench net` (started by it).
    #[command(hide = true)]
    NetServer(myriad_bench::net::NetServerArgs),
    /// The compute platform: local/remote/delegated empty-job throughput (Rayon as the local
    /// bound), steals, superstep latency of a compute group.
    Jobs(myriad_bench::jobs::JobsArgs),
    /// A skewed read load on one peer, before and after the load balancer's rounds.
    Balance(myriad_bench::balance::BalanceArgs),
    /// Graph500: a Kronecker graph loaded as vertex chunks into a compute group and a
    /// validated, direction-optimizing BFS from random roots (MTEPS).
    Graph500(myriad_bench::graph500::Graph500Args),
    /// Small-object get/put of a local cluster, with Redis and memcached baselines.
    Kv(myriad_bench::kv::KvArgs),
    /// The backup-side log engine: append rate, recovery read, disk baseline.
    Log(myriad_bench::log::LogArgs),
    /// RAM a backup spends per chunk it keeps on disk (log engine with a peer's defaults).
    BackupMem(myriad_bench::backup_mem::BackupMemArgs),
    /// RAMCloud's log-cleaner benchmark: load to 80 % log utilization, zipfian updates.
    LogCleaner(myriad_bench::log_cleaner::LogCleanerArgs),
    /// Put throughput and latency for R = 0..=3 backups in each durability mode.
    Replication(myriad_bench::replication::ReplicationArgs),
    /// One backup zone recovered from its logs into memory (cold cache), with the disk's
    /// read bandwidth as baseline.
    RecoveryLocal(myriad_bench::recovery_local::RecoveryLocalArgs),
    /// A local cluster's master killed: detection, availability, re-replication and a
    /// client's throughput and latency over the whole run (CSV and PNG).
    Recovery(myriad_bench::recovery::RecoveryArgs),
}

/// Runs the command line of this process with `registry` as the peers' jobs, tasks and
/// applications.
pub fn main_with(registry: myriad_compute::Registry) -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Superpeer(args) => superpeer_cmd::run(&args),
        Command::Peer(args) => peer_cmd::run(&args, myriad_graph::register(registry)),
        Command::Cluster(command) => cluster::run(command),
        Command::Term(args) => term::main(args),
        Command::Cert(command) => cert(command),
        Command::Bench(BenchCommand::Mem(args)) => {
            myriad_bench::mem::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Net(args)) => {
            myriad_bench::net::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::NetServer(args)) => {
            myriad_bench::net::serve(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Balance(args)) => {
            myriad_bench::balance::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Jobs(args)) => {
            myriad_bench::jobs::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Graph500(args)) => {
            myriad_bench::graph500::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Kv(args)) => {
            myriad_bench::kv::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Log(args)) => {
            myriad_bench::log::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::BackupMem(args)) => {
            myriad_bench::backup_mem::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::LogCleaner(args)) => {
            myriad_bench::log_cleaner::run_cli(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Replication(args)) => {
            myriad_bench::replication::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Recovery(args)) => {
            let binary = std::env::current_exe()?;
            myriad_bench::recovery::run(&args, &binary).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::RecoveryLocal(args)) => {
            myriad_bench::recovery_local::run(&args).map_err(anyhow::Error::msg)
        }
    }
}

/// How a node writes its log lines (`--log-format`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// One line of text per event; colours only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`, spans), for
    /// log shippers.
    Json,
}

/// Logs to stderr at `info` (or as `RUST_LOG` says), once per process: text, with ANSI
/// colours only when stderr is a terminal (a log file gets none), or JSON lines. The
/// filter can be replaced at run time (`loggerlevel`): the reload handle is installed as
/// the node's filter hook (`myriad_node::ops::log_control`).
pub(crate) fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    let initial = std::env::var("RUST_LOG")
        .ok()
        .filter(|text| !text.is_empty() && tracing_subscriber::EnvFilter::try_new(text).is_ok())
        .unwrap_or_else(|| "info,openraft=warn".to_owned());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&initial))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let builder = builder
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter_reloading();
            install_filter_hook(builder.reload_handle(), initial);
            let _ = builder.try_init();
        }
        LogFormat::Json => {
            let builder = builder.json().with_ansi(false).with_filter_reloading();
            install_filter_hook(builder.reload_handle(), initial);
            let _ = builder.try_init();
        }
    }
}

/// Makes `handle` the node's log filter hook: a new filter replaces the old one if it
/// parses; the text of the filter in force is kept for reads.
fn install_filter_hook<S: 'static>(
    handle: tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, S>,
    initial: String,
) {
    let current = std::sync::Mutex::new(initial);
    myriad_node::ops::log_control::install_filter_hook(Box::new(move |filter| {
        let mut current = current
            .lock()
            .map_err(|_| "the log filter's lock is poisoned".to_owned())?;
        if let Some(text) = filter {
            let parsed = tracing_subscriber::EnvFilter::try_new(text)
                .map_err(|error| format!("invalid log filter {text:?}: {error}"))?;
            handle
                .reload(parsed)
                .map_err(|error| format!("the log filter was not replaced: {error}"))?;
            *current = text.to_owned();
        }
        Ok(current.clone())
    }));
}

/// Starts the node's HTTP endpoint (metrics, status page) at `listen`, if given.
pub(crate) fn start_http(
    listen: Option<std::net::SocketAddr>,
    routes: impl FnOnce() -> std::sync::Arc<dyn myriad_node::ops::Routes>,
) -> anyhow::Result<Option<myriad_node::ops::HttpServer>> {
    let Some(listen) = listen else {
        return Ok(None);
    };
    let server = myriad_node::ops::HttpServer::start(listen, routes())
        .map_err(|error| anyhow::anyhow!("metrics endpoint on {listen}: {error}"))?;
    tracing::info!(address = %server.local_addr(), "metrics endpoint listening");
    Ok(Some(server))
}

/// TLS flags of nodes and the terminal: `--tls-dir DIR --tls-name NAME` select
/// `DIR/ca.pem`, `DIR/NAME.pem`, `DIR/NAME.key` (written by `myriad cert`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Directory of the cluster CA and certificates (turns TLS on).
    #[arg(long)]
    pub tls_dir: Option<std::path::PathBuf>,
    /// Name of this process's certificate in --tls-dir (NAME.pem, NAME.key).
    #[arg(long, requires = "tls_dir")]
    pub tls_name: Option<String>,
}

impl TlsArgs {
    /// The TLS configuration the flags select (`None` without `--tls-dir`).
    pub fn load(&self) -> anyhow::Result<Option<myriad_net::TlsConfig>> {
        let Some(dir) = &self.tls_dir else {
            return Ok(None);
        };
        let Some(name) = &self.tls_name else {
            anyhow::bail!("--tls-dir needs --tls-name NAME (the certificate to use)");
        };
        Ok(Some(myriad_net::TlsConfig::from_dir(dir, name)?))
    }
}

/// Flags of `myriad cert`.
#[derive(clap::Subcommand, Debug)]
pub enum CertCommand {
    /// Create a cluster CA in DIR: ca.pem (trusted by every node and client) and ca.key
    /// (mode 0600; keep it off the nodes).
    Ca {
        /// The directory (created if missing).
        dir: std::path::PathBuf,
    },
    /// Issue a certificate signed by DIR's CA: DIR/NAME.pem and DIR/NAME.key (0600).
    Issue {
        /// The directory holding the CA.
        dir: std::path::PathBuf,
        /// The certificate's name (file names and common name).
        name: String,
        /// peer, superpeer or client (named in the certificate).
        #[arg(long)]
        role: String,
        /// Extra DNS names or IP addresses for the certificate (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
}

fn cert(command: CertCommand) -> anyhow::Result<()> {
    match command {
        CertCommand::Ca { dir } => {
            myriad_net::tls::create_ca(&dir)?;
            println!(
                "CA written: {}",
                dir.join(myriad_net::tls::CA_CERT_FILE).display()
            );
        }
        CertCommand::Issue {
            dir,
            name,
            role,
            hosts,
        } => {
            let role = myriad_net::CertRole::parse(&role).ok_or_else(|| {
                anyhow::anyhow!("unknown role {role:?} (peer, superpeer or client)")
            })?;
            myriad_net::tls::issue(&dir, &name, role, &hosts)?;
            println!(
                "certificate written: {}",
                dir.join(format!("{name}.pem")).display()
            );
        }
    }
    Ok(())
}

/// The cluster secret's file: `flag` (`--secret-file`), else the one named by
/// `MYRIAD_SECRET_FILE`. The secret itself is never taken from the command line, where
/// every user of the machine could read it in a `ps` listing.
pub(crate) fn secret_file_arg(flag: Option<&std::path::Path>) -> Option<std::path::PathBuf> {
    flag.map(std::path::Path::to_path_buf).or_else(|| {
        std::env::var_os(myriad_net::secret::SECRET_FILE_ENV)
            .filter(|value| !value.is_empty())
            .map(std::path::PathBuf::from)
    })
}

/// How often a node started with `--exit-with-parent` checks its parent.
const PARENT_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// With `Some(pid)`: exits this process (status 3, like a crash: no clean shutdown) as
/// soon as its parent is no longer `pid` (the parent died and the process was handed to
/// another), checked every 200 ms on a thread of its own. Nodes that a test, a benchmark
/// or the demo starts get this, so that they do not outlive a killed caller.
pub(crate) fn exit_with_parent(pid: Option<u32>) {
    let Some(pid) = pid else {
        return;
    };
    let check = move || {
        let parent = std::os::unix::process::parent_id();
        if parent != pid {
            eprintln!("parent process {pid} is gone (parent now {parent}); exiting");
            std::process::exit(3);
        }
    };
    check();
    let spawned = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || loop {
            std::thread::sleep(PARENT_CHECK_INTERVAL);
            check();
        });
    if let Err(error) = spawned {
        eprintln!("could not watch the parent process: {error}; exiting");
        std::process::exit(3);
    }
}

/// Writes `text` to `path` through a temporary file and a rename, so readers never see a
/// partial file.
pub(crate) fn write_atomically(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, path)?;
    Ok(())
}
