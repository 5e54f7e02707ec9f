//! The settings of superpeers and peers: TOML file, defaults, command-line overrides.
//!
//! # Job
//! [`NodeConfig`] holds everything either role needs. It is read from TOML
//! ([`NodeConfig::from_toml`], [`NodeConfig::load`]; unknown keys are errors), missing
//! settings take the defaults of [`NodeConfig::default`], and [`Overrides`] from the
//! command line replace single settings. [`NodeConfig::validate`] checks the result and
//! explains the first problem it finds. [`NodeError`] is the error of starting and running
//! a node process.
//!
//! # Example
//! ```toml
//! listen = "127.0.0.1:22221"
//! data_dir = "/var/lib/myriad/sp1"
//! secret_file = "/var/lib/myriad/secret"   # mode 0600; or `secret = "..."` inline
//! superpeers = ["1=127.0.0.1:22221", "2=127.0.0.1:22222", "3=127.0.0.1:22223"]
//! capabilities = ["storage", "backup"]
//!
//! [superpeer]
//! id = 1
//! election_timeout_min_ms = 300
//! election_timeout_max_ms = 600
//!
//! [failure]
//! heartbeat_interval_ms = 250
//! failure_timeout_ms = 1000
//! recovery_backup_wait_ms = 30000   # a zone without live backups waits this long for one
//!
//! [peer]
//! memory_mb = 1024
//! prefault_mb = 512        # kept resident ahead of use, for fast recoveries (0: none;
//!                          # default: 2 zones, at most memory_mb / 4, on backup peers)
//!
//! [backup]
//! replication = 3          # R: backups per zone (0: no replication)
//! zone_mb = 256            # payload per backup zone
//! durability = "async"     # default of requests: async | replicated | durable
//! strategy = "disjunctive" # random | disjunctive | copyset | rack-aware
//! scatter_width = 4        # copyset only
//! log_dir = "/var/lib/myriad/p1/log"   # default: data_dir/log
//! write_buffer_kb = 32768  # log engine write buffer
//! segment_kb = 8192        # secondary-log segment (power of two, 16 KiB..=32 MiB)
//! secondary_log_kb = 0     # one zone's secondary log; 0: 2 × zone_mb
//! primary_log_kb = 262144  # at least 2 write buffers
//! version_buffer_entries = 16384  # versions per zone's version buffer (RAM: ~16 B each)
//! apply_inline = true       # apply replication messages on the I/O thread when they fit
//! async_linger_us = 20000  # async changes wait up to this for more to share a message
//! idle_release_ms = 1000   # idle this long: log buffers written out, burst buffers freed
//! wait_timeout_ms = 10000  # longest a replicated/durable change waits
//!
//! [metrics]
//! listen = "127.0.0.1:9100"  # HTTP: /metrics (and the status page on superpeers); unset: off
//! [compute]
//! workers = 4              # job pool threads (0: one per CPU)
//! group = 1                # compute group
//! role = "slave"           # master | slave | none
//! apps = ["wordcount"]     # applications started once the peer has joined
//! ```
//!
//! # The cluster secret
//! There is no default secret: a node refuses to start without one, on a loopback address
//! as well as on any other (another user of the same machine could otherwise join; and
//! `myriad cluster start` writes one to `DIR/secret` anyway). It comes, first match wins,
//! from `--secret-file FILE`, the file named by `MYRIAD_SECRET_FILE`, `secret_file` in the
//! configuration, or `secret` in the configuration (a file of mode `0600` too, then).
//! [`NodeConfig::read_secret_file`] reads the file; it never reaches a command line or a
//! log. Files are read by `myriad_net::secret::read_file` (owner-only files only).
//!
//! # Who calls it
//! The `myriad` binary (`superpeer`, `peer` subcommands) and tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use myriad_meta::Capabilities;
use myriad_types::NodeId;
use serde::Deserialize;
use thiserror::Error;

/// Why a configuration could not be loaded or is invalid.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The TOML is malformed, has an unknown key or a value of the wrong type.
    #[error("invalid configuration: {0}")]
    Parse(String),
    /// A setting is outside its domain.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Why a node could not start or stopped.
#[derive(Debug, Error)]
pub enum NodeError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Another process uses the data directory.
    #[error("data directory {0} is in use by another process (lock file held)")]
    DataDirLocked(PathBuf),
    /// A file system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was attempted.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The messaging layer failed to start.
    #[error("messaging: {0}")]
    Net(#[from] myriad_net::NetError),
    /// Raft failed to start.
    #[error("raft: {0}")]
    Raft(String),
    /// Joining or talking to the cluster failed.
    #[error(transparent)]
    Client(#[from] myriad_client::ClientError),
}

/// One configured superpeer: `ID=HOST:PORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct SuperpeerAddress {
    /// Its node ID (also its Raft member ID).
    pub id: NodeId,
    /// Where it listens.
    pub address: SocketAddr,
}

impl TryFrom<String> for SuperpeerAddress {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl std::str::FromStr for SuperpeerAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (id, address) = text
            .trim()
            .split_once('=')
            .ok_or_else(|| format!("superpeer {text:?} is not ID=HOST:PORT"))?;
        let id: u16 = id
            .trim()
            .parse()
            .map_err(|_| format!("superpeer ID {id:?} is not a number in 1..=65279"))?;
        let address: SocketAddr = address
            .trim()
            .parse()
            .map_err(|_| format!("superpeer address {address:?} is not HOST:PORT (IP address)"))?;
        Ok(SuperpeerAddress {
            id: NodeId(id),
            address,
        })
    }
}

/// Parses a comma-separated list `1=127.0.0.1:P1,2=127.0.0.1:P2`.
pub fn parse_superpeers(text: &str) -> Result<Vec<SuperpeerAddress>, ConfigError> {
    text.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| item.parse().map_err(ConfigError::Invalid))
        .collect()
}

/// Settings of the superpeer role.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SuperpeerSection {
    /// This superpeer's ID (must be one of `superpeers`); 0: not set.
    pub id: u16,
    /// Shortest election timeout.
    pub election_timeout_min_ms: u64,
    /// Longest election timeout (exclusive).
    pub election_timeout_max_ms: u64,
    /// Raft leader heartbeat interval.
    pub raft_heartbeat_ms: u64,
    /// Deadline of one Raft write or linearizable read.
    pub request_timeout_ms: u64,
    /// Build a Raft snapshot after this many entries (0: never).
    pub snapshot_every_entries: u64,
}

impl Default for SuperpeerSection {
    fn default() -> Self {
        SuperpeerSection {
            id: 0,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 600,
            raft_heartbeat_ms: 100,
            request_timeout_ms: 5_000,
            snapshot_every_entries: 10_000,
        }
    }
}

/// Settings of failure detection.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailureSection {
    /// How often a superpeer pings each node it watches.
    pub heartbeat_interval_ms: u64,
    /// A node that answers no ping for this long is declared failed.
    pub failure_timeout_ms: u64,
    /// How long the recovery of a zone whose backups are all down waits for one of them to
    /// come back (a cluster restarting) before it declares the zone lost.
    pub recovery_backup_wait_ms: u64,
}

impl Default for FailureSection {
    fn default() -> Self {
        FailureSection {
            heartbeat_interval_ms: 250,
            failure_timeout_ms: 1_000,
            recovery_backup_wait_ms: 30_000,
        }
    }
}

/// Settings of the node's HTTP endpoint (`[metrics]`): Prometheus metrics at
/// `/metrics`, and on superpeers the status page at `/` (see `myriad_node::ops`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Where the endpoint listens (port 0: the OS picks one); unset: no endpoint.
    pub listen: Option<SocketAddr>,
}

/// TLS settings (`[tls]`): a directory written by `myriad cert` and this node's
/// certificate name in it. With `dir` set, every connection is TLS with mutual
/// authentication by the cluster CA (see `myriad_net::tls`); unset, plain TCP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSection {
    /// Directory holding `ca.pem`, `NAME.pem` and `NAME.key` (empty: TLS off).
    pub dir: PathBuf,
    /// The certificate's name in `dir` (`NAME.pem`, `NAME.key`).
    pub name: String,
}

/// Settings of the peer role.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeerSection {
    /// Memory for chunks, in MiB.
    pub memory_mb: u64,
    /// Threads running message handlers.
    pub handler_threads: usize,
    /// MiB of chunk memory kept resident in RAM ahead of use (at most `memory_mb`): a
    /// background thread makes that much above the allocator's top resident after start
    /// and tops it up (paced, once a burst of creates is over) whenever the peer's own
    /// chunks, or a recovery, have used more than half of it. Chunks restored in a
    /// recovery then land in pages the OS has already zeroed instead of taking a page
    /// fault per page: on the 2-core test VM that was 40% of a zone's recovery, and
    /// 0.5–1 s of a 2 GiB cluster recovery (2.2–2.8 s against 1.7–1.9 s). The price is
    /// that much RAM used before it holds chunks. Unset (the default): two zones
    /// (`backup.zone_mb` × 2), at most a quarter of `memory_mb`, for a peer that backs
    /// others up (it may have to restore zones), none otherwise; 0 keeps nothing
    /// resident ahead. See [`NodeConfig::prefault_bytes`].
    pub prefault_mb: Option<u64>,
}

impl Default for PeerSection {
    fn default() -> Self {
        PeerSection {
            memory_mb: 1024,
            handler_threads: 2,
            prefault_mb: None,
        }
    }
}

/// Settings of the compute service (`[compute]`): job pool, compute group role,
/// applications. See [`ComputeSection::config`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ComputeSection {
    /// Worker threads of the job pool (0: one per CPU).
    pub workers: usize,
    /// The compute group the peer takes its role in.
    pub group: u16,
    /// `master`, `slave` or `none` (the default).
    pub role: Option<String>,
    /// Applications started once the peer has joined.
    pub apps: Vec<String>,
}

impl ComputeSection {
    /// The compute service's settings (`enabled` follows the compute capability later).
    pub fn config(&self) -> Result<myriad_compute::ComputeConfig, ConfigError> {
        let role = match &self.role {
            Some(text) => text.parse().map_err(ConfigError::Invalid)?,
            None => myriad_compute::Role::None,
        };
        Ok(myriad_compute::ComputeConfig {
            enabled: true,
            workers: self.workers,
            group: self.group,
            role,
            apps: self.apps.clone(),
        })
    }
}

/// Settings of replication (`[backup]`): how a peer's chunks are replicated and how it
/// keeps other peers' backups. See [`BackupSection::options`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackupSection {
    /// Backups per zone (R). 0 disables replication of this peer's chunks. An upper bound:
    /// a zone gets at most as many backups as other alive, backup-capable peers exist when
    /// it is placed (the replicator clamps, and fills the zone up when peers join).
    pub replication: usize,
    /// Payload MiB per backup zone.
    pub zone_mb: u64,
    /// Durability of changes that ask for the cluster default: `async`, `replicated` or
    /// `durable`.
    pub durability: String,
    /// Placement strategy: `random`, `disjunctive` (random with disjunctive first
    /// backups), `copyset` (with `scatter_width`) or `rack-aware`.
    pub strategy: String,
    /// Scatter width of the `copyset` strategy.
    pub scatter_width: u32,
    /// Directory of the log engine; empty: `data_dir/log`.
    pub log_dir: PathBuf,
    /// Log engine write buffer, KiB (at least 2 segments).
    pub write_buffer_kb: u64,
    /// Secondary-log segment size, KiB (a power of two, 16..=32768). Small segments also
    /// shrink the secondary-log buffer (at most half a segment) and the largest chunk a
    /// backup accepts (255 links of half a segment).
    pub segment_kb: u64,
    /// Size of one zone's secondary log, KiB; 0: twice the zone size.
    pub secondary_log_kb: u64,
    /// Size of the primary log, KiB (at least two write buffers).
    pub primary_log_kb: u64,
    /// Versions one backed-up zone's version buffer holds (2..=2^26); about 16 bytes of
    /// RAM each, for the buffer and again for the previous epoch's carry. Smaller: less
    /// RAM per zone, more epochs (and version-log records for chunks updated again).
    pub version_buffer_entries: usize,
    /// Longest a replicated or durable change waits for its backups, milliseconds.
    pub wait_timeout_ms: u64,
    /// Apply other peers' replication messages on the I/O thread that read them when the
    /// log engine has room now (fewer thread hand-offs); false: always on the handler
    /// pool.
    pub apply_inline: bool,
    /// How long asynchronous changes may wait on their owner for more changes to share
    /// their message to a backup, microseconds (0..=1,000,000; 0: each leaves at once).
    pub async_linger_us: u64,
    /// After this long without appends the log engine writes its secondary-log buffers
    /// out and frees its burst buffers, milliseconds (0..=3,600,000; 0: never).
    pub idle_release_ms: u64,
}

impl Default for BackupSection {
    fn default() -> Self {
        BackupSection {
            replication: 3,
            zone_mb: 256,
            durability: "async".to_owned(),
            strategy: "disjunctive".to_owned(),
            scatter_width: 4,
            log_dir: PathBuf::new(),
            write_buffer_kb: 32 << 10,
            segment_kb: 8 << 10,
            secondary_log_kb: 0,
            primary_log_kb: 256 << 10,
            version_buffer_entries: myriad_backup_log::LogConfig::default()
                .version_buffer_entries_max,
            wait_timeout_ms: 10_000,
            apply_inline: true,
            async_linger_us: crate::replication::DEFAULT_ASYNC_LINGER.as_micros() as u64,
            idle_release_ms: myriad_backup_log::LogConfig::default()
                .idle_release_after
                .as_millis() as u64,
        }
    }
}

impl BackupSection {
    /// The peer's replication settings (log directory still unresolved when `log_dir` is
    /// empty: [`crate::replication::BackupOptions::log_dir_in`] puts it in the data
    /// directory). Checks every value, including the log engine's configuration.
    pub fn options(&self) -> Result<crate::replication::BackupOptions, ConfigError> {
        use myriad_replication::Strategy;
        let invalid = |text: String| Err(ConfigError::Invalid(text));
        if self.replication > 16 {
            return invalid(format!(
                "backup.replication {} is above 16",
                self.replication
            ));
        }
        if self.zone_mb == 0 || self.zone_mb > 1 << 20 {
            return invalid(format!(
                "backup.zone_mb {} is not in 1..=1048576",
                self.zone_mb
            ));
        }
        let durability = crate::replication::parse_durability(&self.durability)
            .map_err(|e| ConfigError::Invalid(format!("backup.durability: {e}")))?;
        let strategy = match self.strategy.trim().to_ascii_lowercase().as_str() {
            "random" => Strategy::RANDOM,
            "disjunctive" => Strategy::DISJUNCTIVE,
            "rack-aware" | "rack_aware" | "rackaware" => Strategy::RACK_AWARE,
            "copyset" | "copysets" => {
                if self.scatter_width == 0 {
                    return invalid("backup.scatter_width must be positive for copysets".into());
                }
                Strategy::copyset(self.scatter_width)
            }
            other => {
                return invalid(format!(
                    "backup.strategy {other:?} is not random, disjunctive, copyset or rack-aware"
                ))
            }
        };
        let zone_bytes = self.zone_mb << 20;
        let kb = |value: u64| value.saturating_mul(1024);
        let mut log = myriad_backup_log::LogConfig {
            write_buffer_bytes: kb(self.write_buffer_kb),
            segment_bytes: kb(self.segment_kb),
            secondary_log_bytes: if self.secondary_log_kb == 0 {
                2 * zone_bytes
            } else {
                kb(self.secondary_log_kb)
            },
            primary_log_bytes: kb(self.primary_log_kb),
            version_buffer_entries_max: self.version_buffer_entries,
            idle_release_after: std::time::Duration::from_millis(self.idle_release_ms),
            ..myriad_backup_log::LogConfig::default()
        };
        // Settings derived from the segment size: the secondary-log buffer fits half a
        // segment, the largest chunk at most 255 links of half a segment.
        log.secondary_buffer_bytes = log.secondary_buffer_bytes.min(log.segment_bytes / 2);
        if log.segment_bytes >= 128 {
            log.chunk_bytes_max = log
                .chunk_bytes_max
                .min(255 * u64::from(log.entry_payload_bytes_max()));
        }
        if let Err(error) = log.validate() {
            return invalid(format!("backup log settings: {error}"));
        }
        if self.wait_timeout_ms == 0 {
            return invalid("backup.wait_timeout_ms must be positive".into());
        }
        if self.async_linger_us > 1_000_000 {
            return invalid("backup.async_linger_us must be at most 1000000 (1 s)".into());
        }
        Ok(crate::replication::BackupOptions {
            replication: self.replication,
            zone_bytes,
            durability,
            strategy,
            log_dir: (!self.log_dir.as_os_str().is_empty()).then(|| self.log_dir.clone()),
            log,
            wait_timeout: std::time::Duration::from_millis(self.wait_timeout_ms),
            apply_inline: self.apply_inline,
            async_linger: std::time::Duration::from_micros(self.async_linger_us),
            ..crate::replication::BackupOptions::default()
        })
    }
}

/// Everything a superpeer or peer process needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Where the node listens (port 0: the OS picks one; superpeers need a fixed port that
    /// matches their `superpeers` entry).
    pub listen: SocketAddr,
    /// The address other nodes reach a peer at, when it differs from `listen` (e.g.
    /// `listen = "0.0.0.0:22300"`, `advertise = "10.0.0.5:0"`; port 0: the listener's
    /// port). Superpeers are reached at their `superpeers` entry instead.
    pub advertise: Option<SocketAddr>,
    /// Directory of persistent state (the superpeer's Raft log and snapshot).
    pub data_dir: PathBuf,
    /// The cluster secret of the messaging layer's handshake (no default: empty means
    /// none configured, which [`NodeConfig::validate`] refuses).
    pub secret: String,
    /// A file holding the cluster secret (empty: none); read into `secret` by
    /// [`NodeConfig::read_secret_file`].
    pub secret_file: PathBuf,
    /// Rack number.
    pub rack: u16,
    /// Switch number.
    pub switch: u16,
    /// What a peer offers: any of `storage`, `backup`, `compute`.
    pub capabilities: Vec<String>,
    /// Every superpeer of the cluster, `ID=HOST:PORT`.
    pub superpeers: Vec<SuperpeerAddress>,
    /// Superpeer settings.
    pub superpeer: SuperpeerSection,
    /// Failure-detection settings.
    pub failure: FailureSection,
    /// Peer settings.
    pub peer: PeerSection,
    /// Replication and backup settings (peers).
    pub backup: BackupSection,
    /// The HTTP endpoint of metrics and the status page.
    pub metrics: MetricsSection,
    /// TLS for node and client connections (`[tls]`; off unless `dir` is set).
    pub tls: TlsSection,
    /// Compute settings (peers).
    pub compute: ComputeSection,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise: None,
            data_dir: PathBuf::from("myriad-data"),
            secret: String::new(),
            secret_file: PathBuf::new(),
            rack: 0,
            switch: 0,
            capabilities: vec![
                "storage".to_owned(),
                "backup".to_owned(),
                "compute".to_owned(),
            ],
            superpeers: Vec::new(),
            superpeer: SuperpeerSection::default(),
            failure: FailureSection::default(),
            peer: PeerSection::default(),
            backup: BackupSection::default(),
            metrics: MetricsSection::default(),
            tls: TlsSection::default(),
            compute: ComputeSection::default(),
        }
    }
}

/// Settings given on the command line; each replaces the file's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--id`.
    pub id: Option<u16>,
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--superpeers "1=HOST:PORT,2=..."`.
    pub superpeers: Option<String>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--secret-file` (or `MYRIAD_SECRET_FILE`).
    pub secret_file: Option<PathBuf>,
    /// `--tls-dir`.
    pub tls_dir: Option<PathBuf>,
    /// `--tls-name`.
    pub tls_name: Option<String>,
}

impl NodeConfig {
    /// Parses TOML text (missing settings keep their defaults; unknown keys are errors).
    pub fn from_toml(text: &str) -> Result<NodeConfig, ConfigError> {
        toml::from_str(text).map_err(|error| ConfigError::Parse(error.to_string()))
    }

    /// Reads and parses a TOML file.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Applies command-line overrides.
    pub fn apply(&mut self, overrides: &Overrides) -> Result<(), ConfigError> {
        if let Some(id) = overrides.id {
            self.superpeer.id = id;
        }
        if let Some(listen) = overrides.listen {
            self.listen = listen;
        }
        if let Some(list) = &overrides.superpeers {
            self.superpeers = parse_superpeers(list)?;
        }
        if let Some(dir) = &overrides.data_dir {
            self.data_dir = dir.clone();
        }
        if let Some(file) = &overrides.secret_file {
            self.secret_file = file.clone();
        }
        if let Some(dir) = &overrides.tls_dir {
            self.tls.dir = dir.clone();
        }
        if let Some(name) = &overrides.tls_name {
            self.tls.name = name.clone();
        }
        Ok(())
    }

    /// Loads the TLS configuration of `[tls]`: `None` when `tls.dir` is unset; an error
    /// when the name is missing or the files do not load.
    pub fn tls_config(&self) -> Result<Option<myriad_net::TlsConfig>, ConfigError> {
        if self.tls.dir.as_os_str().is_empty() {
            return Ok(None);
        }
        if self.tls.name.is_empty() {
            return Err(ConfigError::Invalid(
                "tls.dir is set but tls.name is not (give --tls-name NAME)".to_owned(),
            ));
        }
        myriad_net::TlsConfig::from_dir(&self.tls.dir, &self.tls.name)
            .map(Some)
            .map_err(|error| ConfigError::Invalid(format!("TLS: {error}")))
    }

    /// Reads `secret_file`, if one is set, into `secret` (the file wins over an inline
    /// `secret`). Refuses a file that others may read, an empty or over-long secret and
    /// one that is not UTF-8 text.
    pub fn read_secret_file(&mut self) -> Result<(), ConfigError> {
        if self.secret_file.as_os_str().is_empty() {
            return Ok(());
        }
        let bytes = myriad_net::secret::read_file(&self.secret_file)
            .map_err(|error| ConfigError::Invalid(error.to_string()))?;
        self.secret = String::from_utf8(bytes).map_err(|_| {
            ConfigError::Invalid(format!(
                "cluster secret file {} is not UTF-8 text",
                self.secret_file.display()
            ))
        })?;
        Ok(())
    }

    /// Bytes of chunk memory this peer keeps resident ahead of use: `peer.prefault_mb`
    /// if set (at most `memory_mb`), else two zones but at most a quarter of `memory_mb`
    /// when it backs others up, else none.
    pub fn prefault_bytes(&self) -> u64 {
        let mb = match self.peer.prefault_mb {
            Some(mb) => mb.min(self.peer.memory_mb),
            None => {
                let backs_up = self
                    .capability_flags()
                    .is_ok_and(|flags| flags.contains(Capabilities::BACKUP));
                if backs_up {
                    self.backup
                        .zone_mb
                        .saturating_mul(2)
                        .min(self.peer.memory_mb / 4)
                } else {
                    0
                }
            }
        };
        mb.saturating_mul(1 << 20)
    }

    /// The capabilities as flags.
    pub fn capability_flags(&self) -> Result<Capabilities, ConfigError> {
        let mut flags = 0u8;
        for name in &self.capabilities {
            flags |= match name.as_str() {
                "storage" => Capabilities::STORAGE.0,
                "backup" => Capabilities::BACKUP.0,
                "compute" => Capabilities::COMPUTE.0,
                other => {
                    return Err(ConfigError::Invalid(format!(
                        "unknown capability {other:?} (storage, backup, compute)"
                    )))
                }
            };
        }
        Ok(Capabilities(flags))
    }

    /// The superpeers as `(ID, address)` pairs.
    pub fn superpeer_list(&self) -> Vec<(NodeId, SocketAddr)> {
        self.superpeers
            .iter()
            .map(|superpeer| (superpeer.id, superpeer.address))
            .collect()
    }

    /// Checks what both roles need.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |text: String| Err(ConfigError::Invalid(text));
        self.compute.config()?;
        if self.superpeers.is_empty() {
            return invalid(
                "no superpeers configured (superpeers = [\"1=HOST:PORT\", ...])".into(),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for superpeer in &self.superpeers {
            if superpeer.id.0 == 0 || superpeer.id.0 > myriad_types::limits::NODE_ID_MAX {
                return invalid(format!(
                    "superpeer ID {} is not in 1..={}",
                    superpeer.id.0,
                    myriad_types::limits::NODE_ID_MAX
                ));
            }
            if !seen.insert(superpeer.id) {
                return invalid(format!("superpeer ID {} is listed twice", superpeer.id.0));
            }
        }
        if self.secret.is_empty() {
            let hint = "give --secret-file FILE (a file of mode 0600), set MYRIAD_SECRET_FILE, \
                        or set secret_file in the configuration; `myriad cluster start` \
                        writes one to DIR/secret";
            return invalid(if self.listen.ip().is_loopback() {
                format!("no cluster secret configured: {hint}")
            } else {
                format!(
                    "refusing to listen on the non-loopback address {} without a cluster \
                     secret: {hint}",
                    self.listen
                )
            });
        }
        if self.secret.len() > myriad_net::SECRET_BYTES_MAX {
            return invalid(format!(
                "the secret must have 1 to {} bytes",
                myriad_net::SECRET_BYTES_MAX
            ));
        }
        self.capability_flags()?;
        let failure = &self.failure;
        if failure.heartbeat_interval_ms == 0
            || failure.failure_timeout_ms < 2 * failure.heartbeat_interval_ms
        {
            return invalid(format!(
                "failure.heartbeat_interval_ms must be positive and failure_timeout_ms at least \
                 twice it (got {} and {})",
                failure.heartbeat_interval_ms, failure.failure_timeout_ms
            ));
        }
        if self.peer.memory_mb == 0 || self.peer.handler_threads == 0 {
            return invalid("peer.memory_mb and peer.handler_threads must be positive".into());
        }
        self.backup.options()?;
        Ok(())
    }

    /// Checks what a superpeer needs on top of [`NodeConfig::validate`]: its ID is listed,
    /// its listen port matches its entry, the Raft timings are consistent.
    pub fn validate_superpeer(&self) -> Result<(), ConfigError> {
        self.validate()?;
        let invalid = |text: String| Err(ConfigError::Invalid(text));
        let section = &self.superpeer;
        let Some(own) = self
            .superpeers
            .iter()
            .find(|superpeer| superpeer.id.0 == section.id)
        else {
            return invalid(format!(
                "superpeer.id {} is not among the configured superpeers{}",
                section.id,
                if section.id == 0 { " (set --id)" } else { "" }
            ));
        };
        if self.listen.port() != 0 && self.listen.port() != own.address.port() {
            return invalid(format!(
                "listen port {} differs from this superpeer's entry {}",
                self.listen.port(),
                own.address
            ));
        }
        if section.raft_heartbeat_ms == 0
            || section.election_timeout_min_ms <= section.raft_heartbeat_ms
            || section.election_timeout_max_ms <= section.election_timeout_min_ms
        {
            return invalid(format!(
                "Raft timings need 0 < raft_heartbeat_ms ({}) < election_timeout_min_ms ({}) < \
                 election_timeout_max_ms ({})",
                section.raft_heartbeat_ms,
                section.election_timeout_min_ms,
                section.election_timeout_max_ms
            ));
        }
        if section.request_timeout_ms == 0 {
            return invalid("superpeer.request_timeout_ms must be positive".into());
        }
        Ok(())
    }

    /// The address a superpeer listens on: `listen`, or its own entry's address when
    /// `listen` has port 0.
    pub fn superpeer_listen(&self) -> Option<SocketAddr> {
        let own = self
            .superpeers
            .iter()
            .find(|superpeer| superpeer.id.0 == self.superpeer.id)?;
        Some(if self.listen.port() == 0 {
            own.address
        } else {
            self.listen
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
listen = "127.0.0.1:7001"
data_dir = "/tmp/sp1"
secret = "s3cret"
rack = 2
switch = 3
capabilities = ["storage"]
superpeers = ["1=127.0.0.1:7001", "2=127.0.0.1:7002", "3=127.0.0.1:7003"]

[superpeer]
id = 1
election_timeout_min_ms = 150
election_timeout_max_ms = 300
raft_heartbeat_ms = 50

[failure]
heartbeat_interval_ms = 100
failure_timeout_ms = 500

[peer]
memory_mb = 64
prefault_mb = 16

[metrics]
listen = "127.0.0.1:0"
"#;

    #[test]
    fn full_file_parses_and_validates() {
        let config = NodeConfig::from_toml(FULL).unwrap();
        assert_eq!(config.superpeer.id, 1);
        assert_eq!(config.superpeers.len(), 3);
        assert_eq!(config.superpeers[1].id, NodeId(2));
        assert_eq!(config.failure.failure_timeout_ms, 500);
        assert_eq!(config.peer.memory_mb, 64);
        assert_eq!(config.peer.prefault_mb, Some(16));
        assert_eq!(config.prefault_bytes(), 16 << 20);
        assert_eq!(config.metrics.listen, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(config.peer.handler_threads, 2);
        assert_eq!(config.superpeer.request_timeout_ms, 5_000);
        assert_eq!(config.capability_flags().unwrap(), Capabilities::STORAGE);
        config.validate_superpeer().unwrap();
    }

    #[test]
    fn empty_file_gives_defaults() {
        let config = NodeConfig::from_toml("").unwrap();
        assert_eq!(config, NodeConfig::default());
        assert_eq!(config.failure.heartbeat_interval_ms, 250);
        assert_eq!(config.peer.memory_mb, 1024);
        assert_eq!(config.peer.prefault_mb, None);
        assert_eq!(
            config.metrics.listen, None,
            "no metrics endpoint unless asked"
        );
        // A backup peer keeps two zones resident ahead, at most a quarter of its memory.
        assert_eq!(config.prefault_bytes(), 256 << 20);
        let mut small = config.clone();
        small.peer.memory_mb = 4096;
        assert_eq!(small.prefault_bytes(), 512 << 20);
        small.capabilities = vec!["storage".into()];
        assert_eq!(small.prefault_bytes(), 0);
        small.peer.prefault_mb = Some(0);
        small.capabilities = vec!["storage".into(), "backup".into()];
        assert_eq!(small.prefault_bytes(), 0);
        // No superpeers: invalid for both roles.
        assert!(matches!(config.validate(), Err(ConfigError::Invalid(_))));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let error = NodeConfig::from_toml("lisen = \"127.0.0.1:1\"").unwrap_err();
        assert!(error.to_string().contains("lisen"), "{error}");
        let error = NodeConfig::from_toml("[failure]\ntimeout = 3").unwrap_err();
        assert!(error.to_string().contains("timeout"), "{error}");
    }

    #[test]
    fn bad_superpeer_entries_are_explained() {
        let error = NodeConfig::from_toml("superpeers = [\"1:127.0.0.1:7\"]").unwrap_err();
        assert!(error.to_string().contains("ID=HOST:PORT"), "{error}");
        let error = parse_superpeers("1=localhost").unwrap_err();
        assert!(error.to_string().contains("HOST:PORT"), "{error}");
        let mut config = NodeConfig::from_toml(FULL).unwrap();
        config.superpeers = parse_superpeers("1=127.0.0.1:7001,1=127.0.0.1:7002").unwrap();
        assert!(config.validate().unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn overrides_replace_file_settings() {
        let mut config = NodeConfig::from_toml(FULL).unwrap();
        config
            .apply(&Overrides {
                id: Some(2),
                listen: Some("127.0.0.1:7002".parse().unwrap()),
                superpeers: Some("2=127.0.0.1:7002".to_owned()),
                data_dir: Some(PathBuf::from("/tmp/sp2")),
                secret_file: Some(PathBuf::from("/tmp/secret")),
                ..Overrides::default()
            })
            .unwrap();
        assert_eq!(config.superpeer.id, 2);
        assert_eq!(
            config.superpeer_list(),
            vec![(NodeId(2), "127.0.0.1:7002".parse().unwrap())]
        );
        assert_eq!(config.data_dir, PathBuf::from("/tmp/sp2"));
        assert_eq!(config.secret_file, PathBuf::from("/tmp/secret"));
        config.validate_superpeer().unwrap();
    }

    #[test]
    fn a_node_without_a_secret_is_refused_and_a_secret_file_is_read() {
        let mut config = NodeConfig::from_toml(FULL).unwrap();
        config.secret.clear();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("no cluster secret"), "{error}");
        assert!(error.contains("--secret-file"), "{error}");
        config.listen = "0.0.0.0:7001".parse().unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(
            error.contains("non-loopback address 0.0.0.0:7001"),
            "{error}"
        );

        // The file wins over an inline secret; a file others may read is refused.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let secret = myriad_net::secret::create_file(&path).unwrap();
        config.secret = "inline".into();
        config
            .apply(&Overrides {
                secret_file: Some(path.clone()),
                ..Overrides::default()
            })
            .unwrap();
        config.read_secret_file().unwrap();
        assert_eq!(config.secret.as_bytes(), &secret[..]);
        config.validate().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let error = config.read_secret_file().unwrap_err().to_string();
        assert!(error.contains("chmod 600"), "{error}");
    }

    #[test]
    fn superpeer_checks_catch_mistakes() {
        let mut config = NodeConfig::from_toml(FULL).unwrap();
        config.superpeer.id = 9;
        assert!(config
            .validate_superpeer()
            .unwrap_err()
            .to_string()
            .contains("not among"));
        config.superpeer.id = 1;
        config.listen = "127.0.0.1:9999".parse().unwrap();
        assert!(config
            .validate_superpeer()
            .unwrap_err()
            .to_string()
            .contains("differs"));
        config.listen = "127.0.0.1:0".parse().unwrap();
        assert_eq!(
            config.superpeer_listen(),
            Some("127.0.0.1:7001".parse().unwrap())
        );
        config.superpeer.election_timeout_min_ms = 10;
        assert!(config
            .validate_superpeer()
            .unwrap_err()
            .to_string()
            .contains("Raft timings"));
        config.superpeer.election_timeout_min_ms = 150;
        config.failure.failure_timeout_ms = 150;
        assert!(config
            .validate_superpeer()
            .unwrap_err()
            .to_string()
            .contains("twice"));
        config.failure.failure_timeout_ms = 500;
        config.capabilities = vec!["flying".to_owned()];
        assert!(config
            .validate_superpeer()
            .unwrap_err()
            .to_string()
            .contains("flying"));
    }

    #[test]
    fn backup_section_parses_and_checks() {
        let config = NodeConfig::from_toml(FULL).unwrap();
        let options = config.backup.options().unwrap();
        assert_eq!(options.replication, 3);
        assert_eq!(options.zone_bytes, 256 << 20);
        assert_eq!(options.durability, myriad_replication::Durability::Async);
        assert_eq!(options.log.secondary_log_bytes, 512 << 20);
        assert_eq!(options.log_dir_in(Path::new("/d")), PathBuf::from("/d/log"));
        assert!(options.apply_inline, "inline application is the default");
        assert_eq!(options.async_linger, std::time::Duration::from_millis(20));
        assert_eq!(
            options.log.idle_release_after,
            std::time::Duration::from_secs(1)
        );
        let text = format!(
            "{FULL}\n[backup]\nreplication = 2\nzone_mb = 4\ndurability = \"durable\"\n\
             strategy = \"copyset\"\nscatter_width = 3\nlog_dir = \"/l\"\n\
             write_buffer_kb = 128\nsegment_kb = 16\nprimary_log_kb = 1024\n\
             version_buffer_entries = 4096\napply_inline = false\nasync_linger_us = 0\n\
             idle_release_ms = 0\n"
        );
        let config = NodeConfig::from_toml(&text).unwrap();
        config.validate().unwrap();
        let options = config.backup.options().unwrap();
        assert_eq!(options.replication, 2);
        assert_eq!(options.durability, myriad_replication::Durability::Durable);
        assert_eq!(options.strategy, myriad_replication::Strategy::copyset(3));
        assert_eq!(options.log.secondary_log_bytes, 8 << 20);
        assert_eq!(options.log_dir_in(Path::new("/d")), PathBuf::from("/l"));
        assert!(!options.apply_inline);
        assert_eq!(options.log.version_buffer_entries_max, 4096);
        assert!(options.async_linger.is_zero());
        assert!(options.log.idle_release_after.is_zero());
        for bad in [
            "idle_release_ms = 3600001",
            "async_linger_us = 1000001",
            "durability = \"eventually\"",
            "strategy = \"nearest\"",
            "segment_kb = 15",
            "zone_mb = 0",
            "replication = 99",
            "version_buffer_entries = 1",
        ] {
            let config = NodeConfig::from_toml(&format!("{FULL}\n[backup]\n{bad}\n")).unwrap();
            assert!(config.validate().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn compute_section_parses_and_checks() {
        let config = NodeConfig::from_toml(
            "[compute]\nworkers = 3\ngroup = 2\nrole = \"slave\"\napps = [\"a\"]",
        )
        .unwrap();
        let compute = config.compute.config().unwrap();
        assert_eq!((compute.workers, compute.group), (3, 2));
        assert_eq!(compute.role, myriad_compute::Role::Slave);
        assert_eq!(compute.apps, vec!["a".to_owned()]);
        let bad = NodeConfig::from_toml("[compute]\nrole = \"boss\"").unwrap();
        assert!(bad
            .compute
            .config()
            .unwrap_err()
            .to_string()
            .contains("master, slave, none"));
        assert_eq!(
            NodeConfig::default().compute.config().unwrap().role,
            myriad_compute::Role::None
        );
    }

    #[test]
    fn wrong_types_are_rejected() {
        assert!(NodeConfig::from_toml("rack = \"one\"").is_err());
        assert!(NodeConfig::from_toml("listen = \"nowhere\"").is_err());
        assert!(NodeConfig::from_toml("[peer]\nmemory_mb = -1").is_err());
    }
}
