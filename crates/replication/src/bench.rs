//! The replication-cost benchmark: put throughput and latency for R = 0..=3 backups in
//! every durability mode, in one process over loopback.
//!
//! Each configuration starts a master endpoint and R backup endpoints on 127.0.0.1, each
//! backup with its own log engine on a temporary directory ([`DiskStorage`], so `Durable`
//! pays real syncs), and times single-threaded `on_put` calls of `payload_bytes`-byte
//! chunks (created first, untimed). Latency is per call as the caller sees it; `Async`
//! calls return once queued, so `drain_ms` says how long the backups then took to apply
//! everything. Called by `myriad bench` (wired later); prints nothing itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use myriad_backup_log::{DiskStorage, IoMode, LogConfig, LogEngine};
use myriad_net::{Config, Endpoint, Handlers};
use myriad_types::{ChunkId, NodeId};

use crate::master::{
    BackupCandidates, ChunkSource, RegisterFuture, Replicator, ReplicatorConfig, ZoneRegistry,
};
use crate::{BackupConfig, BackupService, Candidate, Durability, ReplicaError};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Timed puts per configuration in `Async` and `Replicated` mode. Default 20,000.
    pub ops: usize,
    /// Timed puts per configuration in `Durable` mode (one sync per put). Default 2,000.
    pub durable_ops: usize,
    /// Distinct chunks written round robin. Default 1,000.
    pub chunks: usize,
    /// Payload bytes per put. Default 64.
    pub payload_bytes: usize,
    /// Replication factors measured. Default 0..=3.
    pub replication: Vec<usize>,
    /// Directory for the backups' logs (a fresh temporary directory inside it per run).
    /// Default: the system's temporary directory.
    pub dir: Option<std::path::PathBuf>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            ops: 20_000,
            durable_ops: 2_000,
            chunks: 1_000,
            payload_bytes: 64,
            replication: vec![0, 1, 2, 3],
            dir: None,
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// Backups per zone.
    pub r: usize,
    /// Durability of every put.
    pub durability: Durability,
    /// Puts per second as the caller saw them.
    pub ops_per_sec: f64,
    /// Median put latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile put latency, microseconds.
    pub p99_us: f64,
    /// Time after the last put until every backup had applied everything, milliseconds.
    pub drain_ms: f64,
}

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Setting up an endpoint, a log engine or a directory failed.
    #[error("benchmark setup: {0}")]
    Setup(String),
    /// A put failed.
    #[error(transparent)]
    Replica(#[from] ReplicaError),
}

struct FixedCandidates(Vec<Candidate>);

impl BackupCandidates for FixedCandidates {
    fn candidates(&self) -> Vec<Candidate> {
        self.0.clone()
    }
}

struct InstantRegistry;

impl ZoneRegistry for InstantRegistry {
    fn register(&self, _owner: NodeId, _zone: u32, _backups: Vec<NodeId>) -> RegisterFuture {
        Box::pin(async { Ok(()) })
    }
}

struct NoChunks;

impl ChunkSource for NoChunks {
    fn for_each_in_range(
        &self,
        _first: ChunkId,
        _last: ChunkId,
        _visit: &mut dyn FnMut(ChunkId, &[u8]) -> bool,
    ) -> Vec<ChunkId> {
        Vec::new()
    }
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> BenchError + '_ {
    move |e| BenchError::Setup(format!("{what}: {e}"))
}

fn percentile(sorted: &[Duration], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

/// A master endpoint and backups in this process over loopback, each backup a
/// [`BackupService`] over its own log engine in `dir/backup-<i>`: the set-up shared by
/// this benchmark and `myriad bench log-cleaner`. Dropping it stops the master, then the
/// backups.
pub struct LocalReplicas {
    master_id: NodeId,
    master: Endpoint,
    backups: Vec<(NodeId, Endpoint, BackupService)>,
}

impl LocalReplicas {
    /// The master's node ID.
    pub const MASTER: NodeId = NodeId(1);

    /// Starts `count` backups (node IDs 10, 11, ...) with log engines configured by `log`
    /// on `dir` and the master ([`LocalReplicas::MASTER`]), and tells each side the
    /// other's address.
    pub fn start(
        dir: &std::path::Path,
        count: usize,
        log: &LogConfig,
        io_mode: IoMode,
    ) -> Result<LocalReplicas, BenchError> {
        const SECRET: &str = "replica-bench";
        let localhost = "127.0.0.1:0".parse().map_err(setup("address"))?;
        let master_id = Self::MASTER;
        let mut backups = Vec::new();
        for index in 0..count {
            let node = NodeId(10 + index as u16);
            let storage = DiskStorage::new(dir.join(format!("backup-{index}")), io_mode)
                .map_err(setup("log directory"))?;
            let engine = Arc::new(
                LogEngine::open(log.clone(), Arc::new(storage)).map_err(setup("log engine"))?,
            );
            let service = BackupService::new(engine, BackupConfig::default())
                .map_err(setup("backup service"))?;
            let mut handlers = Handlers::new();
            service.register(&mut handlers).map_err(setup("handlers"))?;
            let endpoint = Endpoint::start(Config::new(node, localhost, SECRET), handlers)
                .map_err(setup("backup endpoint"))?;
            service.attach(endpoint.handle());
            backups.push((node, endpoint, service));
        }
        let master = Endpoint::start(Config::new(master_id, localhost, SECRET), Handlers::new())
            .map_err(setup("master endpoint"))?;
        let net = master.handle();
        for (node, endpoint, _) in &backups {
            net.set_address(*node, endpoint.handle().local_addr());
            endpoint.handle().set_address(master_id, net.local_addr());
        }
        Ok(LocalReplicas {
            master_id,
            master,
            backups,
        })
    }

    /// The master's node ID.
    pub fn master_id(&self) -> NodeId {
        self.master_id
    }

    /// A replicator on the master (`config.node` is set to it) whose candidates are all
    /// the local backups, whose zones are registered at once, and which has nothing to
    /// re-replicate.
    pub fn replicator(&self, mut config: ReplicatorConfig) -> Result<Replicator, ReplicaError> {
        config.node = self.master_id;
        let candidates = self
            .backups
            .iter()
            .map(|(node, _, _)| Candidate {
                node: *node,
                rack: 0,
                switch: 0,
            })
            .collect();
        Replicator::new(
            config,
            self.master.handle(),
            Arc::new(FixedCandidates(candidates)),
            Arc::new(InstantRegistry),
            Arc::new(NoChunks),
        )
    }

    /// The backups' log engines, in backup order.
    pub fn engines(&self) -> Vec<Arc<LogEngine>> {
        self.backups
            .iter()
            .map(|(_, _, service)| service.engine().clone())
            .collect()
    }
}

/// Runs every configuration of `options` and returns one row per (R, durability).
pub fn run(options: &BenchOptions) -> Result<Vec<BenchRow>, BenchError> {
    let mut rows = Vec::new();
    for &r in &options.replication {
        for durability in [
            Durability::Async,
            Durability::Replicated,
            Durability::Durable,
        ] {
            rows.push(run_one(options, r, durability)?);
        }
    }
    Ok(rows)
}

fn run_one(
    options: &BenchOptions,
    r: usize,
    durability: Durability,
) -> Result<BenchRow, BenchError> {
    let dir = match &options.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .map_err(setup("temporary directory"))?;
    let log = LogConfig {
        secondary_log_bytes: 64 << 20,
        write_buffer_bytes: 16 << 20,
        primary_log_bytes: 64 << 20,
        ..LogConfig::default()
    };
    let local = LocalReplicas::start(dir.path(), r, &log, IoMode::Auto)?;
    let master_id = local.master_id();
    let mut config = ReplicatorConfig::new(master_id);
    config.replication = r;
    config.default_durability = durability;
    let replicator = local.replicator(config)?;
    let payload = vec![0xa5u8; options.payload_bytes];
    let chunks: Vec<ChunkId> = (0..options.chunks.max(1) as u64)
        .filter_map(|local| ChunkId::new(master_id, local))
        .collect();
    for &cid in &chunks {
        replicator.on_create(cid, &payload, Some(Durability::Replicated))?;
    }
    let ops = if durability == Durability::Durable {
        options.durable_ops
    } else {
        options.ops
    };
    let mut latencies = Vec::with_capacity(ops);
    let started = Instant::now();
    for index in 0..ops {
        let cid = chunks[index % chunks.len()];
        let put_started = Instant::now();
        replicator.on_put(cid, &payload, Some(durability))?;
        latencies.push(put_started.elapsed());
    }
    let elapsed = started.elapsed();
    let drain_started = Instant::now();
    replicator.wait_all(Durability::Replicated)?;
    let drain = drain_started.elapsed();
    latencies.sort_unstable();
    drop(replicator);
    drop(local);
    Ok(BenchRow {
        r,
        durability,
        ops_per_sec: ops as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        drain_ms: drain.as_secs_f64() * 1e3,
    })
}
