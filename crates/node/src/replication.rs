//! The peer's side of replication: the cluster behind `myriad-replication`'s traits, the
//! settings of a peer's backups, and the glue that starts both halves.
//!
//! # Job
//! - [`BackupOptions`]: what a peer needs to replicate its chunks and to keep other
//!   peers' backups (resolved from the `[backup]` section of the configuration,
//!   [`crate::config::BackupSection`]).
//! - [`MembershipRegistry`] ([`ZoneRegistry`]): commits a zone's ordered backups to the
//!   superpeer group (`Command::ZoneSet`).
//! - [`MembershipCandidates`] ([`BackupCandidates`]): the alive peers with the backup
//!   capability, with rack and switch, from the peer's membership view.
//! - [`MemorySource`] ([`ChunkSource`]): reads the master's chunks from its memory manager
//!   for re-replication.
//! - [`open_backup_service`]: the log engine (on disk, in the log directory) and the
//!   [`BackupService`] in front of it.
//!
//! # Invariants
//! - The replication factor is an upper bound: the [`Replicator`](myriad_replication::Replicator)
//!   places a zone on at most R of the candidates available when the zone opens (fewer
//!   when fewer backup-capable peers are alive) and fills it up later
//!   ([`myriad_replication::Replicator::fill_zones`], called when a peer joins).
//! - Nothing here calls back into the replicator: `candidates()` runs under the
//!   replicator's state lock and only reads the membership table.
//!
//! # Who calls it
//! [`crate::peer::PeerNode::start`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use myriad_backup_log::{DiskStorage, IoMode, LogConfig, LogEngine};
use myriad_mem::MemoryManager;
use myriad_membership::Membership;
use myriad_meta::{Capabilities, Command, NodeState, Role};
use myriad_replication::{
    BackupCandidates, BackupConfig, BackupService, Candidate, ChunkSource, Durability,
    RegisterFuture, RegistryError, Strategy, ZoneRegistry,
};
use myriad_types::{ChunkId, NodeId};

/// How a peer replicates its chunks and keeps other peers' backups.
#[derive(Debug, Clone)]
pub struct BackupOptions {
    /// Backups per zone (R). 0: this peer's chunks are not replicated (and no replicator
    /// runs). An upper bound: zones get at most as many backups as there are other alive,
    /// backup-capable peers when they are placed, and are filled up when peers join.
    pub replication: usize,
    /// Payload bytes per backup zone.
    pub zone_bytes: u64,
    /// Durability of changes whose request asks for the cluster default (level 0).
    pub durability: Durability,
    /// How backups are chosen.
    pub strategy: Strategy,
    /// Where this peer's log engine keeps other peers' backups. `None`: `data_dir/log`.
    pub log_dir: Option<PathBuf>,
    /// The log engine's settings.
    pub log: LogConfig,
    /// Longest a change waits for its durability (or for stream room or the zone's
    /// registration) before it fails.
    pub wait_timeout: Duration,
    /// A backup without progress for this long is reported to the superpeers as failed.
    pub unreachable_timeout: Duration,
    /// When the logs of zones no longer backed up here are deleted.
    pub log_gc: crate::log_gc::LogGcOptions,
    /// Backup side: apply replication messages on the I/O thread when the log engine has
    /// room now ([`BackupConfig::apply_inline`]).
    pub apply_inline: bool,
    /// Master side: how long asynchronous changes may wait for more to share their
    /// message to a backup (`ReplicatorConfig::async_linger`). Default 20 ms.
    pub async_linger: Duration,
}

impl Default for BackupOptions {
    /// The defaults: R = 3, 256 MiB zones, `async`, random placement with
    /// disjunctive first backups, the log engine's defaults (32 MiB write buffer, 8 MiB
    /// segments, secondary logs of 2 × the zone size).
    fn default() -> Self {
        let zone_bytes = 256 << 20;
        BackupOptions {
            replication: 3,
            zone_bytes,
            durability: Durability::Async,
            strategy: Strategy::DISJUNCTIVE,
            log_dir: None,
            log: LogConfig {
                secondary_log_bytes: 2 * zone_bytes,
                ..LogConfig::default()
            },
            wait_timeout: Duration::from_secs(10),
            unreachable_timeout: Duration::from_secs(5),
            log_gc: crate::log_gc::LogGcOptions::default(),
            apply_inline: true,
            async_linger: DEFAULT_ASYNC_LINGER,
        }
    }
}

/// How long a peer's asynchronous changes may wait for more to share their message to a
/// backup, by default. At YCSB workload G's rate (about 1,200 updates a second per
/// owner), each update sent alone to three backups cost the servers about 100 µs of CPU
/// (a send, a receive and an acknowledgement per backup); see docs/benchmarks.md,
/// "Trimmed heaps, smaller epochs, 4-byte size classes, lingering async changes". 2 ms
/// still made every owner send about 1,500 messages a second to its backups, each a
/// wake-up of a sleeping thread on both sides; 20 ms cut that tenfold and raised the
/// workload's throughput by about a sixth ("Longer linger, blocking reads").
/// An acknowledged `async` change is then on no backup for at most 20 ms longer: 50
/// times less than the second Redis's `appendfsync everysec` may lose.
pub const DEFAULT_ASYNC_LINGER: Duration = Duration::from_millis(20);

impl BackupOptions {
    /// For tests: no replication of this peer's chunks; with the backup capability it
    /// still keeps other peers' backups, in the small test log of
    /// [`BackupOptions::small_for_tests`] (chunks up to 100,000 bytes, 64 zones).
    pub fn disabled() -> BackupOptions {
        BackupOptions {
            replication: 0,
            ..BackupOptions::small_for_tests(64 << 10)
        }
    }

    /// Small settings for tests: zones of `zone_bytes`, the log engine's small test
    /// configuration (16 KiB segments, 64 KiB write buffer) with secondary logs of
    /// 2 × the zone (at least 8 segments), R = 3, `async`.
    pub fn small_for_tests(zone_bytes: u64) -> BackupOptions {
        let small = LogConfig::small_for_tests();
        let segment = small.segment_bytes;
        BackupOptions {
            replication: 3,
            zone_bytes,
            durability: Durability::Async,
            strategy: Strategy::DISJUNCTIVE,
            log_dir: None,
            log: LogConfig {
                secondary_log_bytes: (2 * zone_bytes).div_ceil(segment).max(8) * segment,
                ..small
            },
            wait_timeout: Duration::from_secs(10),
            unreachable_timeout: Duration::from_secs(3),
            log_gc: crate::log_gc::LogGcOptions {
                interval: Duration::from_millis(200),
                grace: Duration::from_secs(1),
            },
            apply_inline: true,
            async_linger: DEFAULT_ASYNC_LINGER,
        }
    }

    /// The log directory for a peer whose data directory is `data_dir`.
    pub fn log_dir_in(&self, data_dir: &Path) -> PathBuf {
        self.log_dir.clone().unwrap_or_else(|| data_dir.join("log"))
    }
}

/// The durability a request's level asks for: 0 → `None` (the cluster default), 1 async,
/// 2 replicated, 3 durable (see `myriad_proto::chunk::DURABILITY_*`). Higher levels
/// (refused by the decoder) count as durable.
pub fn durability_of(level: u8) -> Option<Durability> {
    match level {
        0 => None,
        1 => Some(Durability::Async),
        2 => Some(Durability::Replicated),
        _ => Some(Durability::Durable),
    }
}

/// Parses `async`, `replicated` or `durable`.
pub fn parse_durability(text: &str) -> Result<Durability, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "async" => Ok(Durability::Async),
        "replicated" => Ok(Durability::Replicated),
        "durable" => Ok(Durability::Durable),
        other => Err(format!(
            "unknown durability {other:?} (async, replicated, durable)"
        )),
    }
}

/// The command that registers `owner`'s zone `zone` with `backups` for master `me`:
/// `ZoneSet` for a zone of its own, `ZoneAdopt` (`me` its holder) for a zone of another
/// (failed) peer that it adopted.
pub fn registration_command(me: NodeId, owner: NodeId, zone: u32, backups: Vec<NodeId>) -> Command {
    if owner == me {
        Command::ZoneSet {
            owner,
            zone,
            backups,
        }
    } else {
        Command::ZoneAdopt {
            owner,
            zone,
            holder: me,
            backups,
        }
    }
}

/// Commits zone → backups entries through the peer's membership (the superpeer group).
#[derive(Debug)]
pub struct MembershipRegistry {
    membership: Arc<Membership>,
}

impl MembershipRegistry {
    /// A registry writing through `membership`.
    pub fn new(membership: Arc<Membership>) -> MembershipRegistry {
        MembershipRegistry { membership }
    }
}

/// A zone of this peer is registered with `ZoneSet`; a zone of another (failed) peer that
/// this peer adopted after restoring it ([`myriad_replication::Replicator::adopt_zone`]) with
/// `ZoneAdopt`, this peer as its holder.
impl ZoneRegistry for MembershipRegistry {
    fn register(&self, owner: NodeId, zone: u32, backups: Vec<NodeId>) -> RegisterFuture {
        let membership = Arc::clone(&self.membership);
        let command = registration_command(membership.node_id(), owner, zone, backups);
        Box::pin(async move {
            membership
                .write(command)
                .await
                .map(|_| ())
                .map_err(|error| RegistryError(error.to_string()))
        })
    }

    /// `ZoneFilled`: the backup's copy of the zone is complete.
    fn filled(&self, owner: NodeId, zone: u32, backup: NodeId) -> RegisterFuture {
        let membership = Arc::clone(&self.membership);
        Box::pin(async move {
            membership
                .write(Command::ZoneFilled {
                    owner,
                    zone,
                    backup,
                })
                .await
                .map(|_| ())
                .map_err(|error| RegistryError(error.to_string()))
        })
    }
}

/// The alive, backup-capable peers of the membership view (the master is filtered out by
/// the replicator; it is excluded here too).
#[derive(Debug)]
pub struct MembershipCandidates {
    membership: Arc<Membership>,
    me: NodeId,
}

impl MembershipCandidates {
    /// Candidates from `membership`, excluding `me`.
    pub fn new(membership: Arc<Membership>, me: NodeId) -> MembershipCandidates {
        MembershipCandidates { membership, me }
    }
}

impl BackupCandidates for MembershipCandidates {
    fn candidates(&self) -> Vec<Candidate> {
        self.membership
            .nodes()
            .into_iter()
            .filter(|record| {
                record.role == Role::Peer
                    && record.state == NodeState::Alive
                    && record.capabilities.contains(Capabilities::BACKUP)
                    && record.id != self.me
            })
            .map(|record| Candidate {
                node: record.id,
                rack: record.rack,
                switch: record.switch,
            })
            .collect()
    }
}

/// Reads chunks from the master's memory manager for re-replication.
#[derive(Debug)]
pub struct MemorySource {
    mem: Arc<MemoryManager>,
}

impl MemorySource {
    /// A source over `mem`.
    pub fn new(mem: Arc<MemoryManager>) -> MemorySource {
        MemorySource { mem }
    }
}

impl ChunkSource for MemorySource {
    fn for_each_in_range(
        &self,
        first: ChunkId,
        last: ChunkId,
        visit: &mut dyn FnMut(ChunkId, &[u8]) -> bool,
    ) -> Vec<ChunkId> {
        // Only the tables covering the range are walked: a zone copied slice by slice
        // costs each slice its own size (walking all of a creator's chunks per slice made
        // re-replication quadratic in the zone's size).
        self.mem
            .for_each_chunk_in_range(first, last, |cid, bytes| visit(cid, bytes))
    }
}

/// Why the backup side could not start.
#[derive(Debug, thiserror::Error)]
pub enum BackupStartError {
    /// The log directory could not be created or opened.
    #[error("log directory {path}: {error}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// The log engine refused its configuration or failed to open.
    #[error("log engine: {0}")]
    Log(#[from] myriad_backup_log::LogError),
    /// The backup service's thread could not start.
    #[error("backup service: {0}")]
    Service(std::io::Error),
}

/// Opens a log engine on disk in `dir` (created if missing) with `config` and starts a
/// [`BackupService`] over it. The caller registers the service's handler before its
/// endpoint starts and attaches the endpoint afterwards.
pub fn open_backup_service(
    dir: &Path,
    config: LogConfig,
    apply_inline: bool,
) -> Result<BackupService, BackupStartError> {
    std::fs::create_dir_all(dir).map_err(|error| BackupStartError::Dir {
        path: dir.to_owned(),
        error,
    })?;
    let storage = DiskStorage::new(dir, IoMode::Auto).map_err(|error| BackupStartError::Dir {
        path: dir.to_owned(),
        error,
    })?;
    let engine = Arc::new(LogEngine::open(config, Arc::new(storage))?);
    let service_config = BackupConfig {
        apply_inline,
        ..BackupConfig::default()
    };
    BackupService::new(engine, service_config).map_err(BackupStartError::Service)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_levels_map_to_modes() {
        assert_eq!(durability_of(0), None);
        assert_eq!(durability_of(1), Some(Durability::Async));
        assert_eq!(durability_of(2), Some(Durability::Replicated));
        assert_eq!(durability_of(3), Some(Durability::Durable));
        assert_eq!(parse_durability("Durable"), Ok(Durability::Durable));
        assert!(parse_durability("eventually").is_err());
    }

    #[test]
    fn small_options_are_valid_log_configs() {
        for zone in [4 << 10, 64 << 10, 1 << 20] {
            BackupOptions::small_for_tests(zone).log.validate().unwrap();
        }
        BackupOptions::default().log.validate().unwrap();
    }

    #[test]
    fn memory_source_visits_live_chunks_in_order() {
        let mem = Arc::new(
            MemoryManager::new(myriad_mem::MemoryConfig {
                node_id: NodeId(7),
                region_bytes: 1 << 20,
                ..myriad_mem::MemoryConfig::default()
            })
            .unwrap(),
        );
        let cids: Vec<ChunkId> = (0..10u8)
            .map(|i| mem.create_with_data(&[i]).unwrap())
            .collect();
        mem.remove(cids[3]).unwrap();
        let source = MemorySource::new(Arc::clone(&mem));
        for (first, last) in [
            (cids[0], cids[9]),
            (
                ChunkId::new(NodeId(7), 0).unwrap(),
                ChunkId::new(NodeId(7), 1 << 40).unwrap(),
            ),
        ] {
            let mut seen = Vec::new();
            source.for_each_in_range(first, last, &mut |cid, data| {
                seen.push((cid, data.to_vec()));
                true
            });
            let expected: Vec<(ChunkId, Vec<u8>)> = cids
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != 3)
                .map(|(i, &cid)| (cid, vec![i as u8]))
                .collect();
            assert_eq!(seen, expected);
        }
        let mut count = 0;
        source.for_each_in_range(cids[0], cids[9], &mut |_, _| {
            count += 1;
            count < 2
        });
        assert_eq!(count, 2);
    }
}
