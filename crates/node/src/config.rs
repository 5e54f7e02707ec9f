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
//! secret = "change me"
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
//!
//! [peer]
//! memory_mb = 1024
//! ```
//!
//! # Who calls it
//! The `myriad` binary (`superpeer`, `peer` subcommands) and tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use myriad_mem::NodeId;
use myriad_meta::Capabilities;
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
}

impl Default for FailureSection {
    fn default() -> Self {
        FailureSection {
            heartbeat_interval_ms: 250,
            failure_timeout_ms: 1_000,
        }
    }
}

/// Settings of the peer role.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeerSection {
    /// Memory for chunks, in MiB.
    pub memory_mb: u64,
    /// Threads running message handlers.
    pub handler_threads: usize,
}

impl Default for PeerSection {
    fn default() -> Self {
        PeerSection {
            memory_mb: 1024,
            handler_threads: 2,
        }
    }
}

/// Everything a superpeer or peer process needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Where the node listens (port 0: the OS picks one; superpeers need a fixed port that
    /// matches their `superpeers` entry).
    pub listen: SocketAddr,
    /// Directory of persistent state (the superpeer's Raft log and snapshot).
    pub data_dir: PathBuf,
    /// The cluster secret of the messaging layer's handshake.
    pub secret: String,
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
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: PathBuf::from("myriad-data"),
            secret: "myriad".to_owned(),
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
    /// `--secret`.
    pub secret: Option<String>,
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
        if let Some(secret) = &overrides.secret {
            self.secret = secret.clone();
        }
        Ok(())
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
        if self.superpeers.is_empty() {
            return invalid(
                "no superpeers configured (superpeers = [\"1=HOST:PORT\", ...])".into(),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for superpeer in &self.superpeers {
            if superpeer.id.0 == 0 || superpeer.id.0 > myriad_meta::limits::NODE_ID_MAX {
                return invalid(format!(
                    "superpeer ID {} is not in 1..={}",
                    superpeer.id.0,
                    myriad_meta::limits::NODE_ID_MAX
                ));
            }
            if !seen.insert(superpeer.id) {
                return invalid(format!("superpeer ID {} is listed twice", superpeer.id.0));
            }
        }
        if self.secret.is_empty() || self.secret.len() > myriad_net::SECRET_BYTES_MAX {
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
"#;

    #[test]
    fn full_file_parses_and_validates() {
        let config = NodeConfig::from_toml(FULL).unwrap();
        assert_eq!(config.superpeer.id, 1);
        assert_eq!(config.superpeers.len(), 3);
        assert_eq!(config.superpeers[1].id, NodeId(2));
        assert_eq!(config.failure.failure_timeout_ms, 500);
        assert_eq!(config.peer.memory_mb, 64);
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
                secret: Some("other".to_owned()),
            })
            .unwrap();
        assert_eq!(config.superpeer.id, 2);
        assert_eq!(
            config.superpeer_list(),
            vec![(NodeId(2), "127.0.0.1:7002".parse().unwrap())]
        );
        assert_eq!(config.data_dir, PathBuf::from("/tmp/sp2"));
        assert_eq!(config.secret, "other");
        config.validate_superpeer().unwrap();
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
    fn wrong_types_are_rejected() {
        assert!(NodeConfig::from_toml("rack = \"one\"").is_err());
        assert!(NodeConfig::from_toml("listen = \"nowhere\"").is_err());
        assert!(NodeConfig::from_toml("[peer]\nmemory_mb = -1").is_err());
    }
}
