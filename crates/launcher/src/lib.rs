//! # myriad-launcher: a local cluster as processes of the `myriad` binary
//!
//! Starts, watches and stops a whole Myriad cluster on this machine.
//!
//! # Job
//! [`LocalCluster::start`] picks free 127.0.0.1 ports for the superpeers, spawns every node
//! as a child of the `myriad` binary (`myriad superpeer ...` / `myriad peer ...`, the node
//! command-line contract), each detached from the caller's terminal (its own process group,
//! stdin from `/dev/null`, stdout and stderr appended to `DIR/logs/<name>.log`), waits for
//! every node's ready file and writes `DIR/cluster.json`. A later process reopens the
//! cluster with [`LocalCluster::open`] to ask its [`status`](LocalCluster::status),
//! [`stop`](LocalCluster::stop) it, [`kill`](LocalCluster::kill) a node (failure drills),
//! [`restart`](LocalCluster::restart) one with its arguments and data directory, or
//! [`restart_all`](LocalCluster::restart_all) every node that is down (a whole cluster
//! after a power outage: superpeers from their Raft state, peers reclaiming their IDs).
//! The superpeer group can change under a running cluster:
//! [`spawn_superpeer`](LocalCluster::spawn_superpeer) starts a new superpeer that joins it
//! (the caller has the leader add it), [`remove_node`](LocalCluster::remove_node) stops a
//! node and forgets it, and both keep the recorded superpeer list (and the `--superpeers`
//! argument every node is restarted with) equal to the recorded superpeers;
//! [`reload`](LocalCluster::reload) picks up such changes made by another process.
//!
//! Directory layout under `DIR`: `cluster.json`, `secret` (the cluster secret, mode
//! `0600`), `logs/<name>.log`, `data/<name>/` (the node's `--data-dir`) and
//! `run/<name>.ready` (the node's `--ready-file`). Node names are
//! `superpeer-<id>` (ids 1..=n) and `peer-<k>` (k from 1); a peer's node ID is the one its
//! ready file reports, since superpeers assign peer IDs. Every node is started with
//! `--metrics-listen 127.0.0.1:0`; the HTTP address its ready file reports is recorded in
//! `cluster.json` under `metrics` (Prometheus `/metrics`; the status page on superpeers).
//!
//! # The cluster secret
//! Unless the spec names a secret file of its own ([`LaunchSpec::secret_file`]), `start`
//! uses `DIR/secret`: the one already there (a cluster directory started before), else a
//! new random one written with mode `0600` (`myriad_net::secret`). Every node gets
//! `--secret-file PATH`: the path is on the command line and in `cluster.json`
//! ([`ClusterFile::secret_file`]), the secret never is. Clients read it with
//! [`LocalCluster::secret`].
//!
//! # Invariants
//! - A node counts as serving only once its ready file holds a valid JSON line with the
//!   expected role; a stale ready file is removed before the node is spawned.
//! - `start` either returns with every node serving or kills every node it started and
//!   returns an error naming the node and the tail of its log.
//! - A pid in `cluster.json` counts as alive only if the process exists, is not a zombie
//!   and (where `/proc` can tell) still has this node's ready-file path on its command
//!   line, so a reused pid is never signalled.
//! - A cluster from [`LocalCluster::start_owned`] SIGKILLs and reaps all of its nodes when
//!   dropped (tests).
//!
//! # Who calls it
//! `myriad cluster ...` (crates/cli), `myriad bench kv`, and tests that need real nodes.

pub mod sizing;

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// File name of the cluster description inside the cluster directory.
pub const CLUSTER_FILE: &str = "cluster.json";
/// Version of the `cluster.json` layout written by this module.
pub const CLUSTER_FILE_VERSION: u32 = 1;
/// Largest number of superpeers `start` accepts (Raft groups of 1, 3 or 5).
pub const SUPERPEERS_MAX: usize = 5;
/// Largest number of peers `start` accepts.
pub const PEERS_MAX: usize = 256;
/// Bytes read from the end of a node's log for error messages.
const LOG_TAIL_BYTES: u64 = 4096;
/// Lines of a node's log shown in error messages.
const LOG_TAIL_LINES: usize = 20;
/// Interval between polls of ready files and liveness.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Default wait after SIGTERM before `stop` sends SIGKILL.
pub const STOP_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Errors of the launcher.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The launch spec is not usable.
    #[error("invalid launch spec: {0}")]
    InvalidSpec(String),
    /// A node exited before it wrote its ready file.
    #[error("node {name} exited before it was ready ({status}); log {log}:\n{log_tail}")]
    NodeExited {
        /// The node's name.
        name: String,
        /// Its exit status, as text.
        status: String,
        /// Path of its log.
        log: PathBuf,
        /// The last lines of its log.
        log_tail: String,
    },
    /// A node did not write its ready file in time.
    #[error("node {name} not ready after {timeout:?}{detail}; log {log}:\n{log_tail}")]
    ReadyTimeout {
        /// The node's name.
        name: String,
        /// The wait that ran out.
        timeout: Duration,
        /// Why the last ready-file read failed, if it did (starts with "; ").
        detail: String,
        /// Path of its log.
        log: PathBuf,
        /// The last lines of its log.
        log_tail: String,
    },
    /// `cluster.json` is missing or malformed.
    #[error("cluster file {path}: {reason}")]
    ClusterFile {
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The directory already holds a cluster with live nodes.
    #[error("a cluster with live nodes already runs in {0} (stop it first)")]
    AlreadyRunning(PathBuf),
    /// No node of that name or node ID.
    #[error("no node {0} in this cluster")]
    UnknownNode(String),
    /// The cluster secret's file could not be created or read.
    #[error(transparent)]
    Secret(#[from] myriad_net::secret::SecretError),
    /// The TLS directory could not be created.
    #[error("TLS certificates: {0}")]
    Tls(#[from] myriad_net::TlsError),
    /// Sending a signal failed.
    #[error("signal {signal} to pid {pid}: {source}")]
    Signal {
        /// The signal's name.
        signal: String,
        /// The target pid.
        pid: u32,
        /// The error.
        source: nix::Error,
    },
}

fn io_error(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let context = context.into();
    move |source| LaunchError::Io { context, source }
}

/// The role of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeRole {
    /// A member of the superpeer (metadata) group.
    Superpeer,
    /// A storage peer.
    Peer,
}

impl NodeRole {
    /// The subcommand and ready-file spelling: `superpeer` or `peer`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeRole::Superpeer => "superpeer",
            NodeRole::Peer => "peer",
        }
    }
}

impl std::fmt::Display for NodeRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a node writes to its ready file once it serves (one JSON line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyInfo {
    /// `superpeer` or `peer`.
    pub role: NodeRole,
    /// The node's ID.
    pub node_id: u16,
    /// The address it listens on, `127.0.0.1:P`.
    pub address: String,
    /// Its process ID.
    pub pid: u32,
    /// Where its HTTP endpoint (`/metrics`) listens, `127.0.0.1:P`, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The cluster directory (created if missing).
    pub dir: PathBuf,
    /// The `myriad` binary to run the nodes with.
    pub binary: PathBuf,
    /// Number of superpeers: 1, 3 or 5.
    pub superpeers: usize,
    /// Number of peers (0..=[`PEERS_MAX`]).
    pub peers: usize,
    /// `--memory-mb` of each peer, if set. Without a `--config` in
    /// [`extra_args`](Self::extra_args), the peers' backup logs are then scaled to this
    /// memory ([`sizing`]).
    pub peer_memory_mb: Option<u64>,
    /// `--prefault-mb` of each peer, if set.
    pub peer_prefault_mb: Option<u64>,
    /// Start every node with `--exit-with-parent <this process>`: the nodes exit when the
    /// process that started them dies (a killed test, benchmark or demo leaves no node
    /// behind). Default true; `myriad cluster start` turns it off, since its nodes must
    /// outlive the command. Nodes restarted through [`LocalCluster::open`] do not get it.
    pub exit_with_parent: bool,
    /// Extra arguments given to every node (e.g. `--config FILE`).
    pub extra_args: Vec<String>,
    /// The cluster secret's file (mode `0600`); `None`: `DIR/secret`, created with a
    /// random secret if missing.
    pub secret_file: Option<PathBuf>,
    /// TLS for every connection: `start` creates a cluster CA in `DIR/tls` (if missing)
    /// with the certificates `superpeer`, `peer` and `client`, and starts every node with
    /// `--tls-dir DIR/tls --tls-name superpeer|peer` (see `myriad cert`).
    pub tls: bool,
    /// Longest wait for each group of nodes (superpeers, then peers) to be ready.
    pub ready_timeout: Duration,
}

impl LaunchSpec {
    /// A spec with no peer memory setting, no extra arguments and a 30 s ready timeout.
    pub fn new(dir: impl Into<PathBuf>, binary: impl Into<PathBuf>) -> Self {
        LaunchSpec {
            dir: dir.into(),
            binary: binary.into(),
            superpeers: 1,
            peers: 1,
            peer_memory_mb: None,
            peer_prefault_mb: None,
            exit_with_parent: true,
            extra_args: Vec::new(),
            secret_file: None,
            tls: false,
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// Peers of a given memory size and no configuration of the caller's get backup logs
/// scaled to that memory (see [`sizing`]): the `--config` arguments of the file written
/// for them, or none.
fn sized_peer_config(dir: &Path, spec: &LaunchSpec) -> Result<Vec<String>, LaunchError> {
    let Some(mb) = spec.peer_memory_mb else {
        return Ok(Vec::new());
    };
    if spec.extra_args.iter().any(|arg| arg == "--config") {
        return Ok(Vec::new());
    }
    let path = dir.join(sizing::PEER_BACKUP_CONFIG);
    sizing::BackupSizes::for_memory(mb)
        .write(&path)
        .map_err(io_error(format!("writing {}", path.display())))?;
    Ok(vec!["--config".to_string(), path.display().to_string()])
}

/// One node as recorded in `cluster.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// `superpeer-<id>` or `peer-<k>`.
    pub name: String,
    /// Its role.
    pub role: NodeRole,
    /// Its node ID (from its ready file).
    pub node_id: u16,
    /// Its address (from its ready file).
    pub address: String,
    /// Its metrics endpoint (from its ready file): `/metrics` over HTTP at this address,
    /// and on superpeers the status page at `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// The pid of the process the launcher spawned.
    pub pid: u32,
    /// Its `--data-dir`.
    pub data_dir: PathBuf,
    /// Its `--ready-file`.
    pub ready_file: PathBuf,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
    /// The arguments it was started with (after the binary), reused by `restart`.
    pub args: Vec<String>,
}

/// The content of `cluster.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Layout version ([`CLUSTER_FILE_VERSION`]).
    pub version: u32,
    /// The binary the nodes run.
    pub binary: PathBuf,
    /// The `--superpeers` list given to every node.
    pub superpeers: String,
    /// The cluster secret's file, given to every node as `--secret-file` (its path only;
    /// empty in files written before secrets had files).
    #[serde(default)]
    pub secret_file: PathBuf,
    /// The TLS directory of `myriad cert` the nodes use (empty: no TLS); clients use its
    /// certificate `client`.
    #[serde(default, skip_serializing_if = "is_empty_path")]
    pub tls_dir: PathBuf,
    /// Every node, superpeers first.
    pub nodes: Vec<NodeEntry>,
}

fn is_empty_path(path: &Path) -> bool {
    path.as_os_str().is_empty()
}

/// Creates `dir`'s CA and the `superpeer`, `peer` and `client` certificates of a local
/// cluster, each only if missing.
fn ensure_tls_dir(dir: &Path) -> Result<(), LaunchError> {
    use myriad_net::tls::{create_ca, issue, CA_CERT_FILE};
    use myriad_net::CertRole;
    if !dir.join(CA_CERT_FILE).exists() {
        create_ca(dir)?;
    }
    let hosts = ["127.0.0.1".to_owned(), "localhost".to_owned()];
    for (name, role) in [
        ("superpeer", CertRole::Superpeer),
        ("peer", CertRole::Peer),
        ("client", CertRole::Client),
    ] {
        if !dir.join(format!("{name}.pem")).exists() {
            issue(dir, name, role, &hosts)?;
        }
    }
    Ok(())
}

/// A node and whether its process is alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeStatus {
    /// The recorded node.
    #[serde(flatten)]
    pub node: NodeEntry,
    /// Whether its process is alive.
    pub alive: bool,
}

/// A cluster of local node processes, described by `DIR/cluster.json`.
#[derive(Debug)]
pub struct LocalCluster {
    dir: PathBuf,
    file: ClusterFile,
    /// Processes spawned by this value, by node name (reaped here, never left as zombies).
    children: HashMap<String, Child>,
    /// Kill every node on drop.
    owned: bool,
    /// Wait after SIGTERM before SIGKILL.
    stop_timeout: Duration,
    /// Wait for a restarted node's ready file.
    ready_timeout: Duration,
    /// Nodes spawned by this value get `--exit-with-parent` ([`LaunchSpec::exit_with_parent`]).
    exit_with_parent: bool,
}

impl LocalCluster {
    /// Starts the cluster of `spec` and returns once every node serves. The nodes outlive
    /// this value (use [`stop`](Self::stop)).
    pub fn start(spec: LaunchSpec) -> Result<Self, LaunchError> {
        Self::start_inner(spec, false)
    }

    /// Like [`start`](Self::start), but every node is SIGKILLed when the value is dropped
    /// (for tests: no process outlives a panicking test).
    pub fn start_owned(spec: LaunchSpec) -> Result<Self, LaunchError> {
        Self::start_inner(spec, true)
    }

    fn start_inner(spec: LaunchSpec, owned: bool) -> Result<Self, LaunchError> {
        if ![1, 3, 5].contains(&spec.superpeers) {
            return Err(LaunchError::InvalidSpec(format!(
                "superpeers must be 1, 3 or {SUPERPEERS_MAX}, not {}",
                spec.superpeers
            )));
        }
        if spec.peers > PEERS_MAX {
            return Err(LaunchError::InvalidSpec(format!(
                "at most {PEERS_MAX} peers, not {}",
                spec.peers
            )));
        }
        if spec.ready_timeout.is_zero() {
            return Err(LaunchError::InvalidSpec("ready timeout is zero".into()));
        }
        if let Ok(mut existing) = Self::open(&spec.dir) {
            if existing.status().iter().any(|node| node.alive) {
                return Err(LaunchError::AlreadyRunning(spec.dir.clone()));
            }
        }
        for sub in ["logs", "data", "run"] {
            fs::create_dir_all(spec.dir.join(sub)).map_err(io_error(format!(
                "creating {}",
                spec.dir.join(sub).display()
            )))?;
        }
        let dir = fs::canonicalize(&spec.dir)
            .map_err(io_error(format!("resolving {}", spec.dir.display())))?;
        let secret_file = match &spec.secret_file {
            Some(path) => {
                let path = fs::canonicalize(path)
                    .map_err(io_error(format!("resolving {}", path.display())))?;
                myriad_net::secret::read_file(&path)?;
                path
            }
            None => {
                let path = dir.join(myriad_net::secret::SECRET_FILE_NAME);
                myriad_net::secret::read_or_create(&path)?;
                path
            }
        };

        let tls_dir = if spec.tls {
            let tls_dir = dir.join("tls");
            ensure_tls_dir(&tls_dir)?;
            tls_dir
        } else {
            PathBuf::new()
        };
        let tls_args = |name: &str| -> Vec<String> {
            if tls_dir.as_os_str().is_empty() {
                return Vec::new();
            }
            vec![
                "--tls-dir".into(),
                tls_dir.display().to_string(),
                "--tls-name".into(),
                name.into(),
            ]
        };
        let ports = free_ports(spec.superpeers)?;
        let superpeers = ports
            .iter()
            .enumerate()
            .map(|(index, port)| format!("{}=127.0.0.1:{port}", index + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = LocalCluster {
            dir: dir.clone(),
            file: ClusterFile {
                version: CLUSTER_FILE_VERSION,
                binary: spec.binary.clone(),
                superpeers: superpeers.clone(),
                secret_file: secret_file.clone(),
                tls_dir: tls_dir.clone(),
                nodes: Vec::new(),
            },
            children: HashMap::new(),
            // Until start succeeds, a failure kills what was started (see below).
            owned: true,
            stop_timeout: STOP_TIMEOUT_DEFAULT,
            ready_timeout: spec.ready_timeout,
            exit_with_parent: spec.exit_with_parent,
        };

        let mut superpeer_entries = Vec::new();
        for (index, port) in ports.iter().enumerate() {
            let id = index + 1;
            let name = format!("superpeer-{id}");
            let paths = NodePaths::new(&dir, &name);
            let mut args = vec![
                "superpeer".to_string(),
                "--id".into(),
                id.to_string(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
            ];
            args.extend(paths.common_args(&superpeers, &secret_file));
            args.extend(tls_args("superpeer"));
            args.extend(spec.extra_args.iter().cloned());
            superpeer_entries.push(paths.entry(name, NodeRole::Superpeer, args));
        }
        let peer_config = sized_peer_config(&dir, &spec)?;
        let mut peer_entries = Vec::new();
        for k in 1..=spec.peers {
            let name = format!("peer-{k}");
            let paths = NodePaths::new(&dir, &name);
            let mut args = vec!["peer".to_string(), "--listen".into(), "127.0.0.1:0".into()];
            args.extend(paths.common_args(&superpeers, &secret_file));
            args.extend(tls_args("peer"));
            if let Some(mb) = spec.peer_memory_mb {
                args.push("--memory-mb".into());
                args.push(mb.to_string());
            }
            if let Some(mb) = spec.peer_prefault_mb {
                args.push("--prefault-mb".into());
                args.push(mb.to_string());
            }
            args.extend(peer_config.iter().cloned());
            args.extend(spec.extra_args.iter().cloned());
            peer_entries.push(paths.entry(name, NodeRole::Peer, args));
        }

        // Superpeers all at once (they need each other for a quorum), then the peers.
        for group in [superpeer_entries, peer_entries] {
            let mut pending = Vec::new();
            for entry in group {
                cluster.spawn(&entry)?;
                pending.push(entry);
            }
            let deadline = Instant::now() + spec.ready_timeout;
            for mut entry in pending {
                let child = cluster.children.get_mut(&entry.name);
                let ready = wait_ready(&entry, child, deadline, spec.ready_timeout)?;
                entry.node_id = ready.node_id;
                entry.address = ready.address;
                entry.metrics = ready.metrics;
                if let Some(child) = cluster.children.get(&entry.name) {
                    entry.pid = child.id();
                }
                cluster.file.nodes.push(entry);
            }
        }
        cluster.save()?;
        cluster.owned = owned;
        Ok(cluster)
    }

    /// Opens the cluster described by `dir/cluster.json` (its nodes may be alive or not).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, LaunchError> {
        let dir = dir.as_ref().to_path_buf();
        let path = dir.join(CLUSTER_FILE);
        let text = fs::read_to_string(&path).map_err(|error| LaunchError::ClusterFile {
            path: path.clone(),
            reason: error.to_string(),
        })?;
        let file: ClusterFile =
            serde_json::from_str(&text).map_err(|error| LaunchError::ClusterFile {
                path: path.clone(),
                reason: error.to_string(),
            })?;
        if file.version != CLUSTER_FILE_VERSION {
            return Err(LaunchError::ClusterFile {
                path,
                reason: format!("version {} (expected {CLUSTER_FILE_VERSION})", file.version),
            });
        }
        Ok(LocalCluster {
            dir,
            file,
            children: HashMap::new(),
            owned: false,
            stop_timeout: STOP_TIMEOUT_DEFAULT,
            ready_timeout: Duration::from_secs(30),
            exit_with_parent: false,
        })
    }

    /// The cluster secret's file (for `myriad term`, clients, `MYRIAD_SECRET_FILE`).
    pub fn secret_file(&self) -> PathBuf {
        if self.file.secret_file.as_os_str().is_empty() {
            self.dir.join(myriad_net::secret::SECRET_FILE_NAME)
        } else {
            self.file.secret_file.clone()
        }
    }

    /// The TLS directory the nodes use, if the cluster was started with TLS (clients use
    /// its certificate `client`).
    pub fn tls_dir(&self) -> Option<PathBuf> {
        (!self.file.tls_dir.as_os_str().is_empty()).then(|| self.file.tls_dir.clone())
    }

    /// The cluster secret, read from [`secret_file`](Self::secret_file).
    pub fn secret(&self) -> Result<Vec<u8>, LaunchError> {
        Ok(myriad_net::secret::read_file(&self.secret_file())?)
    }

    /// Sets the wait after SIGTERM before [`stop`](Self::stop) sends SIGKILL.
    pub fn set_stop_timeout(&mut self, timeout: Duration) {
        self.stop_timeout = timeout;
    }

    /// Sets the wait for a restarted node's ready file.
    pub fn set_ready_timeout(&mut self, timeout: Duration) {
        self.ready_timeout = timeout;
    }

    /// The cluster directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The recorded nodes, superpeers first.
    pub fn nodes(&self) -> &[NodeEntry] {
        &self.file.nodes
    }

    /// The `--superpeers` list (`1=127.0.0.1:P1,2=...`).
    pub fn superpeer_list(&self) -> &str {
        &self.file.superpeers
    }

    /// The superpeers' node IDs and addresses.
    pub fn superpeer_addresses(&self) -> Vec<(u16, String)> {
        self.file
            .nodes
            .iter()
            .filter(|node| node.role == NodeRole::Superpeer)
            .map(|node| (node.node_id, node.address.clone()))
            .collect()
    }

    /// The superpeers as a client's configuration names them: node ID and socket address
    /// (an entry whose address does not parse is left out; the launcher records only the
    /// addresses its nodes reported).
    pub fn superpeers(&self) -> Vec<(myriad_types::NodeId, std::net::SocketAddr)> {
        self.superpeer_addresses()
            .into_iter()
            .filter_map(|(id, address)| Some((myriad_types::NodeId(id), address.parse().ok()?)))
            .collect()
    }

    /// The peers' node IDs, in start order.
    pub fn peer_ids(&self) -> Vec<myriad_types::NodeId> {
        self.file
            .nodes
            .iter()
            .filter(|node| node.role == NodeRole::Peer)
            .map(|node| myriad_types::NodeId(node.node_id))
            .collect()
    }

    /// Every node with whether its process is alive.
    pub fn status(&mut self) -> Vec<NodeStatus> {
        let nodes = self.file.nodes.clone();
        nodes
            .into_iter()
            .map(|node| {
                let alive = self.is_alive(&node);
                NodeStatus { node, alive }
            })
            .collect()
    }

    /// Finds a node by name (`peer-2`) or node ID (decimal or `0x` hex).
    pub fn find(&self, name_or_id: &str) -> Result<&NodeEntry, LaunchError> {
        let id = parse_node_id(name_or_id);
        self.file
            .nodes
            .iter()
            .find(|node| node.name == name_or_id)
            .or_else(|| id.and_then(|id| self.file.nodes.iter().find(|node| node.node_id == id)))
            .ok_or_else(|| LaunchError::UnknownNode(name_or_id.to_string()))
    }

    /// SIGKILLs the node with this node ID (its whole process group): a failure drill.
    pub fn kill(&mut self, node_id: u16) -> Result<(), LaunchError> {
        let node = self
            .file
            .nodes
            .iter()
            .find(|node| node.node_id == node_id)
            .cloned()
            .ok_or_else(|| LaunchError::UnknownNode(node_id.to_string()))?;
        self.kill_node(&node)
    }

    /// SIGKILLs the named node (its whole process group).
    pub fn kill_named(&mut self, name: &str) -> Result<(), LaunchError> {
        let node = self.find(name)?.clone();
        self.kill_node(&node)
    }

    fn kill_node(&mut self, node: &NodeEntry) -> Result<(), LaunchError> {
        if self.is_alive(node) {
            send_group(node.pid, Signal::SIGKILL)?;
        }
        self.wait_dead(node, Duration::from_secs(5));
        Ok(())
    }

    /// Stops every node: SIGTERM, a bounded wait ([`set_stop_timeout`](Self::set_stop_timeout)),
    /// then SIGKILL for those still alive. Returns the names of nodes that needed SIGKILL.
    pub fn stop(&mut self) -> Result<Vec<String>, LaunchError> {
        let nodes = self.file.nodes.clone();
        // Peers first, so superpeers see them leave rather than fail.
        let order: Vec<&NodeEntry> = nodes
            .iter()
            .filter(|n| n.role == NodeRole::Peer)
            .chain(nodes.iter().filter(|n| n.role == NodeRole::Superpeer))
            .collect();
        for node in &order {
            if self.is_alive(node) {
                // A node that exits between the check and the signal is fine.
                let _ = send_group(node.pid, Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + self.stop_timeout;
        let mut killed = Vec::new();
        for node in &order {
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.wait_dead(node, left) {
                let _ = send_group(node.pid, Signal::SIGKILL);
                self.wait_dead(node, Duration::from_secs(5));
                killed.push(node.name.clone());
            }
        }
        Ok(killed)
    }

    /// Re-reads `cluster.json`: nodes another process added or removed since this value
    /// read it (`myriad cluster superpeer add|remove`). Processes this value spawned stay
    /// its children.
    pub fn reload(&mut self) -> Result<(), LaunchError> {
        let fresh = Self::open(&self.dir)?;
        self.file = fresh.file.clone();
        Ok(())
    }

    /// Starts a new superpeer `superpeer-<id>` that joins the running group
    /// (`myriad superpeer --join`): its arguments are an existing superpeer's (the same
    /// secret, TLS, configuration and extra arguments) with its own ID, a free port, its own
    /// data directory and ready file, and a `--superpeers` list that names it too. Returns
    /// once it serves, recorded in `cluster.json`, where the superpeer list (and the
    /// `--superpeers` argument every node is restarted with) now includes it. It is not a
    /// member yet: the group's leader still has to add it (`AddSuperpeer`).
    pub fn spawn_superpeer(&mut self, id: u16) -> Result<NodeEntry, LaunchError> {
        let name = format!("superpeer-{id}");
        if id == 0 || id > myriad_types::limits::NODE_ID_MAX {
            return Err(LaunchError::InvalidSpec(format!("bad node ID {id}")));
        }
        if let Some(taken) = self
            .file
            .nodes
            .iter()
            .find(|node| node.name == name || node.node_id == id)
        {
            return Err(LaunchError::InvalidSpec(format!(
                "node ID {id} is taken by {} in this cluster",
                taken.name
            )));
        }
        let template = self
            .file
            .nodes
            .iter()
            .find(|node| node.role == NodeRole::Superpeer)
            .ok_or_else(|| {
                LaunchError::InvalidSpec("no superpeer recorded to copy the arguments of".into())
            })?;
        let port = free_ports(1)?[0];
        let listen = format!("127.0.0.1:{port}");
        let paths = NodePaths::new(&self.dir, &name);
        let mut args = template.args.clone();
        args.retain(|arg| arg != "--join");
        set_flag(&mut args, "--id", id.to_string());
        set_flag(&mut args, "--listen", listen.clone());
        set_flag(
            &mut args,
            "--data-dir",
            paths.data_dir.display().to_string(),
        );
        set_flag(
            &mut args,
            "--ready-file",
            paths.ready_file.display().to_string(),
        );
        let mut list = self.file.superpeers.clone();
        if !list.is_empty() {
            list.push(',');
        }
        list.push_str(&format!("{id}={listen}"));
        set_flag(&mut args, "--superpeers", list);
        args.push("--join".into());
        let mut entry = paths.entry(name.clone(), NodeRole::Superpeer, args);
        entry.node_id = id;
        entry.address = listen;
        self.spawn(&entry)?;
        let deadline = Instant::now() + self.ready_timeout;
        let ready = match wait_ready(
            &entry,
            self.children.get_mut(&name),
            deadline,
            self.ready_timeout,
        ) {
            Ok(ready) => ready,
            Err(error) => {
                if let Some(mut child) = self.children.remove(&name) {
                    let _ = send_group(child.id(), Signal::SIGKILL);
                    let _ = child.wait();
                }
                return Err(error);
            }
        };
        entry.address = ready.address;
        entry.metrics = ready.metrics;
        entry.pid = self.children.get(&name).map_or(ready.pid, Child::id);
        let superpeers = self
            .file
            .nodes
            .iter()
            .filter(|node| node.role == NodeRole::Superpeer)
            .count();
        self.file.nodes.insert(superpeers, entry.clone());
        self.update_superpeer_list();
        self.save()?;
        Ok(entry)
    }

    /// Stops the named node if it is alive (SIGTERM, then SIGKILL after the stop timeout)
    /// and removes it from `cluster.json` (its data directory and log stay); a superpeer
    /// also leaves the superpeer list. Returns the removed entry.
    pub fn remove_node(&mut self, name_or_id: &str) -> Result<NodeEntry, LaunchError> {
        let node = self.find(name_or_id)?.clone();
        if self.is_alive(&node) {
            let _ = send_group(node.pid, Signal::SIGTERM);
            if !self.wait_dead(&node, self.stop_timeout) {
                let _ = send_group(node.pid, Signal::SIGKILL);
                self.wait_dead(&node, Duration::from_secs(5));
            }
        }
        self.children.remove(&node.name);
        self.file.nodes.retain(|entry| entry.name != node.name);
        if node.role == NodeRole::Superpeer {
            self.update_superpeer_list();
        }
        self.save()?;
        Ok(node)
    }

    /// Recomputes the superpeer list from the recorded superpeers and puts it into every
    /// node's `--superpeers` argument (used when a node is restarted).
    fn update_superpeer_list(&mut self) {
        let list = self
            .file
            .nodes
            .iter()
            .filter(|node| node.role == NodeRole::Superpeer)
            .map(|node| format!("{}={}", node.node_id, node.address))
            .collect::<Vec<_>>()
            .join(",");
        for node in &mut self.file.nodes {
            set_flag(&mut node.args, "--superpeers", list.clone());
        }
        self.file.superpeers = list;
    }

    /// Restarts the named node (name or node ID) with its arguments and data directory,
    /// stopping it first if it is alive; returns once it is ready again and `cluster.json`
    /// is updated.
    pub fn restart(&mut self, name_or_id: &str) -> Result<NodeEntry, LaunchError> {
        let node = self.find(name_or_id)?.clone();
        if self.is_alive(&node) {
            let _ = send_group(node.pid, Signal::SIGTERM);
            if !self.wait_dead(&node, self.stop_timeout) {
                let _ = send_group(node.pid, Signal::SIGKILL);
                self.wait_dead(&node, Duration::from_secs(5));
            }
        }
        self.spawn(&node)?;
        let deadline = Instant::now() + self.ready_timeout;
        self.await_restarted(&node, deadline)
    }

    /// Restarts every node whose process is not alive, with its arguments and data
    /// directory: the superpeers all at once (they need each other for a quorum), then the
    /// peers one at a time in `cluster.json` order, `peer_gap` apart, each waited for until
    /// ready. Returns the restarted nodes. Live nodes are left alone.
    pub fn restart_all(&mut self, peer_gap: Duration) -> Result<Vec<NodeEntry>, LaunchError> {
        let down: Vec<NodeEntry> = self
            .file
            .nodes
            .clone()
            .into_iter()
            .filter(|node| !self.is_alive(node))
            .collect();
        let (superpeers, peers): (Vec<NodeEntry>, Vec<NodeEntry>) = down
            .into_iter()
            .partition(|node| node.role == NodeRole::Superpeer);
        let mut restarted = Vec::new();
        for node in &superpeers {
            self.children.remove(&node.name);
            self.spawn(node)?;
        }
        let deadline = Instant::now() + self.ready_timeout;
        for node in superpeers {
            restarted.push(self.await_restarted(&node, deadline)?);
        }
        for (index, node) in peers.into_iter().enumerate() {
            if index > 0 {
                std::thread::sleep(peer_gap);
            }
            self.children.remove(&node.name);
            self.spawn(&node)?;
            let deadline = Instant::now() + self.ready_timeout;
            restarted.push(self.await_restarted(&node, deadline)?);
        }
        Ok(restarted)
    }

    /// Waits for a node spawned again to be ready and records its new pid and address.
    fn await_restarted(
        &mut self,
        node: &NodeEntry,
        deadline: Instant,
    ) -> Result<NodeEntry, LaunchError> {
        let result = wait_ready(
            node,
            self.children.get_mut(&node.name),
            deadline,
            self.ready_timeout,
        );
        let ready = match result {
            Ok(ready) => ready,
            Err(error) => {
                if let Some(mut child) = self.children.remove(&node.name) {
                    let _ = send_group(child.id(), Signal::SIGKILL);
                    let _ = child.wait();
                }
                return Err(error);
            }
        };
        let pid = self
            .children
            .get(&node.name)
            .map_or(ready.pid, |child| child.id());
        let mut updated = node.clone();
        updated.node_id = ready.node_id;
        updated.address = ready.address;
        updated.metrics = ready.metrics;
        updated.pid = pid;
        if let Some(slot) = self.file.nodes.iter_mut().find(|n| n.name == node.name) {
            *slot = updated.clone();
        }
        self.save()?;
        Ok(updated)
    }

    /// Spawns `entry`'s process, detached from the caller's terminal.
    fn spawn(&mut self, entry: &NodeEntry) -> Result<(), LaunchError> {
        use std::os::unix::process::CommandExt;
        match fs::remove_file(&entry.ready_file) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(LaunchError::Io {
                    context: format!("removing stale {}", entry.ready_file.display()),
                    source: error,
                })
            }
        }
        fs::create_dir_all(&entry.data_dir)
            .map_err(io_error(format!("creating {}", entry.data_dir.display())))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&entry.log)
            .map_err(io_error(format!("opening {}", entry.log.display())))?;
        let log_err = log
            .try_clone()
            .map_err(io_error(format!("opening {}", entry.log.display())))?;
        let mut command = Command::new(&self.file.binary);
        command.args(&entry.args);
        if self.exit_with_parent {
            // Not part of the saved arguments: a restart by another process must not tie
            // the node to that process.
            command
                .arg("--exit-with-parent")
                .arg(std::process::id().to_string());
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .process_group(0)
            .spawn()
            .map_err(io_error(format!(
                "spawning {} ({})",
                entry.name,
                self.file.binary.display()
            )))?;
        self.children.insert(entry.name.clone(), child);
        Ok(())
    }

    fn save(&self) -> Result<(), LaunchError> {
        let path = self.dir.join(CLUSTER_FILE);
        let text =
            serde_json::to_string_pretty(&self.file).map_err(|error| LaunchError::ClusterFile {
                path: path.clone(),
                reason: error.to_string(),
            })?;
        let temporary = self.dir.join(format!("{CLUSTER_FILE}.tmp"));
        fs::write(&temporary, text + "\n")
            .map_err(io_error(format!("writing {}", temporary.display())))?;
        fs::rename(&temporary, &path).map_err(io_error(format!("renaming to {}", path.display())))
    }

    /// Whether `node`'s process is alive (reaps it first if this value spawned it).
    fn is_alive(&mut self, node: &NodeEntry) -> bool {
        if let Some(child) = self.children.get_mut(&node.name) {
            if child.id() == node.pid || node.pid == 0 {
                return matches!(child.try_wait(), Ok(None));
            }
        }
        pid_is_node(node.pid, &node.ready_file)
    }

    /// Waits up to `timeout` for `node` to die; true if it did.
    fn wait_dead(&mut self, node: &NodeEntry, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.is_alive(node) {
                self.children.remove(&node.name);
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        for (_, mut child) in self.children.drain() {
            let _ = send_group(child.id(), Signal::SIGKILL);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The paths of one node.
struct NodePaths {
    data_dir: PathBuf,
    ready_file: PathBuf,
    log: PathBuf,
}

impl NodePaths {
    fn new(dir: &Path, name: &str) -> Self {
        NodePaths {
            data_dir: dir.join("data").join(name),
            ready_file: dir.join("run").join(format!("{name}.ready")),
            log: dir.join("logs").join(format!("{name}.log")),
        }
    }

    fn common_args(&self, superpeers: &str, secret_file: &Path) -> Vec<String> {
        vec![
            "--secret-file".into(),
            secret_file.display().to_string(),
            "--superpeers".into(),
            superpeers.into(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--ready-file".into(),
            self.ready_file.display().to_string(),
            // Every local node serves its metrics on a port of its own choice, recorded
            // from its ready file in `cluster.json` (key `metrics`).
            "--metrics-listen".into(),
            "127.0.0.1:0".into(),
        ]
    }

    fn entry(self, name: String, role: NodeRole, args: Vec<String>) -> NodeEntry {
        NodeEntry {
            name,
            role,
            node_id: 0,
            address: String::new(),
            metrics: None,
            pid: 0,
            data_dir: self.data_dir,
            ready_file: self.ready_file,
            log: self.log,
            args,
        }
    }
}

/// Sets the value after `flag` in `args` (appends both if the flag is missing).
fn set_flag(args: &mut Vec<String>, flag: &str, value: String) {
    match args.iter().position(|arg| arg == flag) {
        Some(index) if index + 1 < args.len() => args[index + 1] = value,
        Some(_) => args.push(value),
        None => {
            args.push(flag.to_owned());
            args.push(value);
        }
    }
}

/// Parses a node ID given as decimal or `0x` hex.
pub fn parse_node_id(text: &str) -> Option<u16> {
    let text = text.trim();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u16::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// `count` distinct free ports on 127.0.0.1 (bound together, then released).
fn free_ports(count: usize) -> Result<Vec<u16>, LaunchError> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").map_err(io_error("binding 127.0.0.1:0")))
        .collect::<Result<Vec<_>, _>>()?;
    listeners
        .iter()
        .map(|listener| {
            listener
                .local_addr()
                .map(|address| address.port())
                .map_err(io_error("reading a bound port"))
        })
        .collect()
}

/// Waits until `entry`'s ready file holds a valid line, its process exits, or `deadline`.
fn wait_ready(
    entry: &NodeEntry,
    mut child: Option<&mut Child>,
    deadline: Instant,
    timeout: Duration,
) -> Result<ReadyInfo, LaunchError> {
    let mut last_problem = String::new();
    loop {
        match read_ready(&entry.ready_file) {
            Ok(Some(ready)) if ready.role == entry.role => return Ok(ready),
            Ok(Some(ready)) => {
                last_problem = format!("; ready file says role {}", ready.role);
            }
            Ok(None) => {}
            Err(problem) => last_problem = format!("; {problem}"),
        }
        if let Some(child) = child.as_deref_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(LaunchError::NodeExited {
                    name: entry.name.clone(),
                    status: status.to_string(),
                    log: entry.log.clone(),
                    log_tail: log_tail(&entry.log),
                });
            }
        }
        if Instant::now() >= deadline {
            return Err(LaunchError::ReadyTimeout {
                name: entry.name.clone(),
                timeout,
                detail: last_problem,
                log: entry.log.clone(),
                log_tail: log_tail(&entry.log),
            });
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Reads a ready file: `Ok(None)` if it does not exist yet, `Err` if it is malformed.
pub fn read_ready(path: &Path) -> Result<Option<ReadyInfo>, String> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("reading {}: {error}", path.display())),
    };
    let line = text.lines().next().unwrap_or("");
    serde_json::from_str(line)
        .map(Some)
        .map_err(|error| format!("malformed ready file {}: {error}", path.display()))
}

/// The last lines of a log file (empty if unreadable).
pub fn log_tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let length = file.metadata().map_or(0, |m| m.len());
    let start = length.saturating_sub(LOG_TAIL_BYTES);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let first = lines.len().saturating_sub(LOG_TAIL_LINES);
    lines[first..].join("\n")
}

fn to_pid(pid: u32) -> Option<Pid> {
    i32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .map(Pid::from_raw)
}

/// Sends `signal` to the process group led by `pid` (each node leads its own), falling
/// back to the process alone.
fn send_group(pid: u32, signal: Signal) -> Result<(), LaunchError> {
    let Some(target) = to_pid(pid) else {
        return Err(LaunchError::Signal {
            signal: signal.to_string(),
            pid,
            source: nix::Error::EINVAL,
        });
    };
    signal::killpg(target, signal)
        .or_else(|_| signal::kill(target, signal))
        .map_err(|source| LaunchError::Signal {
            signal: signal.to_string(),
            pid,
            source,
        })
}

/// Whether `pid` is a live (non-zombie) process that still carries `ready_file` on its
/// command line (guards against pid reuse where `/proc` is readable).
fn pid_is_node(pid: u32, ready_file: &Path) -> bool {
    let Some(target) = to_pid(pid) else {
        return false;
    };
    if signal::kill(target, None).is_err() {
        return false;
    }
    if let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) {
        let state = stat
            .rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().next());
        if matches!(state, Some("Z") | Some("X")) {
            return false;
        }
    }
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => {
            let needle = ready_file.display().to_string();
            cmdline
                .split(|&byte| byte == 0)
                .any(|arg| arg == needle.as_bytes())
        }
        // No /proc: trust the signal check.
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_parse_decimal_and_hex() {
        assert_eq!(parse_node_id("12"), Some(12));
        assert_eq!(parse_node_id("0x1f"), Some(31));
        assert_eq!(parse_node_id("0x"), None);
        assert_eq!(parse_node_id("peer-1"), None);
        assert_eq!(parse_node_id("70000"), None);
    }

    #[test]
    fn ready_file_parses_and_rejects_garbage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        assert_eq!(read_ready(&path), Ok(None));
        fs::write(
            &path,
            "{\"role\":\"peer\",\"node_id\":7,\"address\":\"127.0.0.1:5\",\"pid\":9}\n",
        )
        .expect("write");
        let ready = read_ready(&path).expect("valid").expect("present");
        assert_eq!(ready.role, NodeRole::Peer);
        assert_eq!(ready.node_id, 7);
        fs::write(&path, "{\"role\":\"pe").expect("write");
        assert!(read_ready(&path).is_err());
    }

    #[test]
    fn set_flag_replaces_a_value_or_appends_the_flag() {
        let mut args: Vec<String> = ["superpeer", "--id", "1", "--join"]
            .map(String::from)
            .into();
        set_flag(&mut args, "--id", "7".into());
        set_flag(&mut args, "--listen", "127.0.0.1:5".into());
        assert_eq!(
            args,
            [
                "superpeer",
                "--id",
                "7",
                "--join",
                "--listen",
                "127.0.0.1:5"
            ]
        );
        // A flag at the very end without a value gets one.
        let mut args: Vec<String> = vec!["--superpeers".into()];
        set_flag(&mut args, "--superpeers", "1=127.0.0.1:5".into());
        assert_eq!(args, ["--superpeers", "1=127.0.0.1:5"]);
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(5).expect("ports");
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 5);
    }
}
