//! `myriad bench log-cleaner`: RAMCloud's log-cleaner benchmark as DXRAM ran it.
//!
//! **Job.** Measure how the backups' logs hold up under a worst-case write load: one
//! master, three backups (R = 3), small objects loaded until the live data fills the
//! backups' secondary logs to a target utilization (default 80 %), then updates with a
//! zipfian distribution and nothing else, so the reorganizer (the log cleaner) must free
//! as much space per second as the updates outdate. DXRAM (Beineke, ICPADS'16 §VI-A) used
//! ~52 M objects of 100 bytes in 512-object messages on Gigabit Ethernet and SATA SSDs; its
//! logs converged to ~90 % fill at ~70 MB/s net SSD writes (see the seed notes §5.4).
//!
//! **Setup, all in this process.** A [`myriad_replication::Replicator`] (the master) and three
//! [`myriad_replication::BackupService`]s, each over its own [`myriad_backup_log::LogEngine`] with
//! [`myriad_backup_log::DiskStorage`] in a fresh directory under `--dir` (removed at the end),
//! every endpoint on 127.0.0.1 with an OS-chosen port. The master's zone size is chosen
//! so that a full zone's entries (payload plus entry header) take `utilization` of one
//! secondary log; `zones` zones are loaded, so every backup holds `zones` logs, each at the
//! target utilization.
//!
//! **Phases.**
//! 1. *Load*: `objects_per_zone × zones` creates of `object_bytes`-byte objects in batches
//!    of `batch` (`Async`, as DXRAM), timed until every backup has them on disk. Reports
//!    objects/s and payload MB/s.
//! 2. *Update*: `batch`-sized batches of puts to objects drawn from a zipfian distribution
//!    (`rand_distr::Zipf`, exponent `zipf_exponent`, default 0.99 as YCSB) over the object
//!    indexes, scrambled by a fixed random permutation so the hot objects spread over all
//!    zones (YCSB's "scrambled zipfian"). A pool of draws is made before timing and cycled.
//!    Runs for `duration`; a [`Sample`] every second or, when a call blocked longer, at
//!    its end (every interval lasts at least a second). The master keeps at most `outstanding`
//!    messages per backup unacknowledged, so it submits at the rate the backups sustain.
//!    The phase ends when every backup has applied everything and flushed it to disk; the
//!    sustained update rate divides by that whole time.
//!
//! The log engine keeps its default reorganization thresholds (activation 60 %, prompt
//! 75 %), so at 80 % live data every log is above the prompt threshold for the whole phase
//! and the reorganizer runs continuously, as in DXRAM's run.
//!
//! **Figures.**
//! - *Log utilization* of one secondary log = its used bytes (valid and outdated entries)
//!   / its capacity ([`myriad_backup_log::ZoneStats`]), the fill level DXRAM reports ("~90 %").
//!   Per backup the max and mean over its logs; `utilization` is the mean over every log of
//!   every backup. The *live* utilization (valid entries only) is fixed by the load:
//!   objects × entry bytes / capacity, reported with the load.
//! - *Write amplification* = bytes the backups handed to their disks during the update
//!   phase (primary log, secondary logs with the flusher's and the reorganizer's writes,
//!   and version logs; whole pages: `primary_bytes_written +
//!   secondary_device_bytes_written + version_log_bytes_written` of
//!   [`myriad_backup_log::EngineStats`], summed over backups) / (payload bytes updated × R). It is
//!   1.0 if every updated byte reached each backup's disk exactly once with no header, no
//!   padding and no cleaning; entry headers, page padding, two-level logging (primary log
//!   then secondary log), version records and the reorganizer's copies of valid entries
//!   all add to it. `process_write_bytes` (from `/proc/self/io`, Linux) counts everything
//!   this process sent to the block layer during the phase, as a cross-check.
//! - *Steady write amplification*: the same ratio over the second half of the phase only
//!   (from the first sample at or after half the duration to the end, drain included;
//!   updates counted as submitted, so the few still in flight at that sample count for
//!   the first half and the ratio errs high). The whole-phase figure flatters: the load
//!   leaves every log with about a fifth of it free, and the first seconds of updates
//!   fill that space before the reorganizer has to copy anything, so a short run, or a
//!   policy that cleans later, looks better than what the logs sustain.
//!
//! Prints a table (or JSON lines with `--json`: one `load`, one `sample` per second, one
//! `summary`); `--csv FILE` writes the samples. Asserts nothing; called by `myriad bench`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use myriad_backup_log::header::{encoded_header_bytes, EncodeArgs};
use myriad_backup_log::{EngineStats, IoMode, LogConfig, LogEngine};
use myriad_replication::bench::LocalReplicas;
use myriad_replication::{Durability, ReplicaError, Replicator, ReplicatorConfig};
use myriad_types::{ChunkId, NodeId};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// Backups per zone, as in RAMCloud's and DXRAM's runs.
pub const REPLICATION: usize = 3;

/// Draws in the zipfian pool at most (the pool is cycled).
pub const ZIPF_POOL_MAX: usize = 1 << 26;

/// What to run. Sizes are in bytes; see [`LogCleanerArgs`] for the defaults.
#[derive(Debug, Clone)]
pub struct LogCleanerOptions {
    /// Payload bytes per object.
    pub object_bytes: usize,
    /// Zones loaded (secondary logs per backup).
    pub zones: usize,
    /// Size of one secondary log.
    pub secondary_log_bytes: u64,
    /// Segment size of the secondary logs.
    pub segment_bytes: u64,
    /// Target live utilization of every secondary log after the load (0 < u < 1).
    pub utilization: f64,
    /// Each backup's write buffer.
    pub write_buffer_bytes: u64,
    /// Each backup's primary log.
    pub primary_log_bytes: u64,
    /// Objects per replication call and per message (DXRAM: 512).
    pub batch: usize,
    /// Messages per backup stream sent and not yet acknowledged before the master waits
    /// (RAMCloud's client: 10 outstanding RPCs). Bounds the backlog, so the rate the
    /// master submits at is the rate the backups sustain.
    pub outstanding: usize,
    /// Length of the update phase.
    pub duration: Duration,
    /// Zipf exponent of the updates.
    pub zipf_exponent: f64,
    /// Zipfian draws made before timing and cycled (at most [`ZIPF_POOL_MAX`]).
    pub zipf_pool: usize,
    /// Seed of the draws and the scrambling permutation.
    pub seed: u64,
    /// Directory for the backups' logs (a fresh directory inside it per run). Default:
    /// the system's temporary directory.
    pub dir: Option<PathBuf>,
    /// Use buffered I/O instead of O_DIRECT.
    pub buffered: bool,
    /// Log fill (percent) above which periodic passes clean a log
    /// (`LogConfig::reorg_activation_percent`; default the engine's, 60).
    pub activation_percent: u32,
    /// Log fill (percent) at which a write asks for a prompt pass
    /// (`LogConfig::reorg_prompt_percent`; default the engine's, 75).
    pub prompt_percent: u32,
    /// Versions one zone's version buffer holds
    /// (`LogConfig::version_buffer_entries_max`; default the engine's).
    pub version_entries: usize,
}

impl Default for LogCleanerOptions {
    fn default() -> Self {
        LogCleanerOptions {
            object_bytes: 100,
            zones: 2,
            secondary_log_bytes: 64 << 20,
            segment_bytes: 1 << 20,
            utilization: 0.8,
            write_buffer_bytes: 16 << 20,
            primary_log_bytes: 64 << 20,
            batch: 512,
            outstanding: 10,
            duration: Duration::from_secs(30),
            zipf_exponent: 0.99,
            zipf_pool: 1 << 22,
            seed: 0x6c6f_6763_6c65_616e,
            dir: None,
            buffered: false,
            activation_percent: LogConfig::default().reorg_activation_percent,
            prompt_percent: LogConfig::default().reorg_prompt_percent,
            version_entries: LogConfig::default().version_buffer_entries_max,
        }
    }
}

/// Figures of the load phase.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadFigures {
    /// Objects loaded.
    pub objects: u64,
    /// Objects per zone.
    pub objects_per_zone: u64,
    /// Payload bytes per zone (the master's zone size).
    pub zone_bytes: u64,
    /// Bytes of one log entry of an object (header + payload, at its first version).
    pub entry_bytes: u64,
    /// Capacity of one secondary log as the engine reports it.
    pub log_capacity_bytes: u64,
    /// Live entry bytes / capacity of one log after the load (what the sizing aimed at).
    pub live_utilization: f64,
    /// Seconds from the first create until every backup had everything on disk.
    pub seconds: f64,
    /// Objects per second over that time.
    pub objects_per_sec: f64,
    /// Payload MB (10^6 bytes) per second over that time.
    pub mb_per_sec: f64,
    /// Mean log utilization (used / capacity) over every log of every backup after the load.
    pub utilization: f64,
}

/// Log utilization (used / capacity) of one backup's logs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackupUtilization {
    /// The fullest log.
    pub max: f64,
    /// Mean over its logs.
    pub mean: f64,
}

/// One interval (a second, or longer when a call blocked) of the update phase.
/// Rates are over the interval; byte and pass counts are since the phase started.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Seconds since the update phase started.
    pub t_sec: f64,
    /// Updates applied by every backup per second in this interval (the slowest backup's
    /// stream counts).
    pub update_ops_per_sec: f64,
    /// Updates the master submitted (queued to the backups' streams) per second in this
    /// interval; ahead of the applied rate by at most the streams' window.
    pub submitted_ops_per_sec: f64,
    /// Updates submitted so far.
    pub updates: u64,
    /// Mean log utilization over every log of every backup.
    pub utilization: f64,
    /// The fullest log of any backup.
    pub utilization_max: f64,
    /// Per backup.
    pub per_backup: Vec<BackupUtilization>,
    /// Bytes written to disk by all backups since the update phase started (primary,
    /// secondary and version logs).
    pub disk_bytes_written: u64,
    /// Of which by the reorganizer (entry bytes it copied).
    pub reorg_bytes_written: u64,
    /// Disk MB (10^6 bytes) per second written by all backups in this interval.
    pub disk_mb_per_sec: f64,
    /// Reorganization passes of all backups since the update phase started.
    pub reorg_passes: u64,
}

/// Figures of the whole update phase.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The load phase's objects per second.
    pub load_objects_per_sec: f64,
    /// Updates done.
    pub updates: u64,
    /// Seconds of the update phase including the drain (everything applied and on disk).
    pub seconds: f64,
    /// Of which draining after the last update was submitted.
    pub drain_seconds: f64,
    /// Updates per second over the whole phase (drain included).
    pub update_ops_per_sec: f64,
    /// Payload MB (10^6 bytes) updated per second.
    pub update_mb_per_sec: f64,
    /// Disk bytes written / (payload bytes updated × R); see the module documentation.
    pub write_amplification: f64,
    /// The same over the second half of the phase (see the module documentation), with
    /// the second at which that half starts; `None` without a sample in it.
    pub steady_write_amplification: Option<(f64, f64)>,
    /// Bytes all backups wrote to their primary logs during the phase.
    pub primary_bytes_written: u64,
    /// Bytes all backups wrote to their secondary logs during the phase (flusher and
    /// reorganizer, whole pages).
    pub secondary_device_bytes_written: u64,
    /// Bytes all backups wrote to their version logs during the phase (sealed epochs,
    /// compactions).
    pub version_log_bytes_written: u64,
    /// Entry bytes the reorganizers copied during the phase.
    pub reorg_bytes_written: u64,
    /// Reorganization passes during the phase, all backups.
    pub reorg_passes: u64,
    /// Of which urgent (a write waited for a free segment), all backups.
    pub reorg_urgent_passes: u64,
    /// Segments cleaned during the phase, all backups.
    pub reorg_segments_cleaned: u64,
    /// What the passes found in the segments they cleaned during the phase, all backups
    /// (bytes used, estimated live when picked, valid bytes found; prompt and periodic
    /// passes, then urgent ones).
    pub reorg_cleaned: myriad_backup_log::CleanedStats,
    /// Bytes this process sent to the block layer during the phase (`/proc/self/io`
    /// `write_bytes`; includes version logs), if the platform reports it.
    pub process_write_bytes: Option<u64>,
    /// Mean log utilization at the end.
    pub utilization: f64,
    /// The fullest log at the end.
    pub utilization_max: f64,
    /// The highest utilization of any log in any sample.
    pub utilization_peak: f64,
}

impl Summary {
    /// `process_write_bytes / (payload bytes updated × R)`, if known.
    pub fn process_write_amplification(&self, object_bytes: usize) -> Option<f64> {
        let payload = self.updates as f64 * object_bytes as f64 * REPLICATION as f64;
        self.process_write_bytes
            .map(|bytes| bytes as f64 / payload.max(1.0))
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The load phase.
    pub load: LoadFigures,
    /// One per second of the update phase.
    pub samples: Vec<Sample>,
    /// The update phase as a whole.
    pub summary: Summary,
}

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum LogCleanerError {
    /// An option out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// Setting up an endpoint, a log engine or a directory failed.
    #[error("benchmark setup: {0}")]
    Setup(String),
    /// A replication call failed (e.g. a backup's log was full).
    #[error(transparent)]
    Replica(#[from] ReplicaError),
    /// A log engine failed.
    #[error(transparent)]
    Log(#[from] myriad_backup_log::LogError),
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> LogCleanerError + '_ {
    move |e| LogCleanerError::Setup(format!("{what}: {e}"))
}

/// A directory removed (with its contents) when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(base: Option<&Path>) -> Result<ScratchDir, LogCleanerError> {
        let base = base.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = base.join(format!(
            "myriad-backup-log-cleaner-{}-{nanos:09}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).map_err(setup("log directory"))?;
        Ok(ScratchDir(path))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Bytes this process sent to the block layer so far (`/proc/self/io`), if known.
fn process_write_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("write_bytes:"))
        .and_then(|value| value.trim().parse().ok())
}

/// Sizing derived from the options.
struct Sizing {
    log_config: LogConfig,
    objects_per_zone: u64,
    entry_bytes: u64,
    zone_bytes: u64,
}

fn sizing(options: &LogCleanerOptions, master: NodeId) -> Result<Sizing, LogCleanerError> {
    let invalid = |what: &str| Err(LogCleanerError::InvalidOption(what.to_string()));
    if !(options.utilization > 0.0 && options.utilization < 1.0) {
        return invalid("utilization must lie strictly between 0 and 1");
    }
    if options.object_bytes == 0
        || options.zones == 0
        || options.batch == 0
        || options.outstanding == 0
    {
        return invalid("object bytes, zones, batch and outstanding must be at least 1");
    }
    if options.zones > usize::from(u16::MAX) {
        return invalid("at most 65535 zones");
    }
    if !(options.zipf_exponent.is_finite() && options.zipf_exponent > 0.0) {
        return invalid("the zipf exponent must be positive");
    }
    if options.zipf_pool == 0 || options.zipf_pool > ZIPF_POOL_MAX {
        return invalid("the zipf pool must hold 1..=2^26 draws");
    }
    if !options.segment_bytes.is_power_of_two()
        || !(myriad_backup_log::SEGMENT_BYTES_MIN..=myriad_backup_log::SEGMENT_BYTES_MAX)
            .contains(&options.segment_bytes)
    {
        return invalid("the segment size must be a power of two in 16 KiB..=32 MiB");
    }
    let mut log_config = LogConfig {
        secondary_log_bytes: options.secondary_log_bytes,
        segment_bytes: options.segment_bytes,
        write_buffer_bytes: options.write_buffer_bytes,
        primary_log_bytes: options.primary_log_bytes,
        secondary_buffer_bytes: (128 << 10).min(options.segment_bytes / 2),
        zones_max: options.zones + 1,
        // Every object with its own header, as in RAMCloud and DXRAM: the load's 80% is
        // computed from object plus header bytes, and the in-order load would otherwise
        // be stored as run entries (denser than that), while the zipfian updates that are
        // measured are single objects anyway.
        run_chunk_bytes_max: 0,
        reorg_activation_percent: options.activation_percent,
        reorg_prompt_percent: options.prompt_percent,
        version_buffer_entries_max: options.version_entries,
        ..LogConfig::default()
    };
    // Small segments allow only small chunks (255 links of half a segment); objects here
    // are small anyway.
    log_config.chunk_bytes_max = log_config
        .chunk_bytes_max
        .min(255 * u64::from(log_config.entry_payload_bytes_max()));
    log_config
        .validate()
        .map_err(|e| LogCleanerError::InvalidOption(e.to_string()))?;
    if options.object_bytes > log_config.entry_payload_bytes_max() as usize {
        return invalid("objects must fit one log entry (half a segment)");
    }
    let capacity = log_config.segments_per_log() * log_config.segment_bytes;
    // The widest header any object gets at its first version: the largest local ID.
    let estimate_objects = capacity / options.object_bytes as u64 * options.zones as u64;
    let header = encoded_header_bytes(
        &EncodeArgs {
            cid: (u64::from(master.0) << 48) | estimate_objects.max(1),
            zone_owner: master.0,
            epoch: 0,
            version: 1,
            chain: None,
        },
        options.object_bytes,
    );
    let entry_bytes = (header + options.object_bytes) as u64;
    let objects_per_zone = (capacity as f64 * options.utilization / entry_bytes as f64) as u64;
    if objects_per_zone == 0 {
        return invalid("the secondary log is too small for one object at this utilization");
    }
    Ok(Sizing {
        log_config,
        objects_per_zone,
        entry_bytes,
        zone_bytes: objects_per_zone * options.object_bytes as u64,
    })
}

/// Per backup: (max, mean) of used / capacity over its logs; overall mean and max.
fn utilization(stats: &[EngineStats]) -> (Vec<BackupUtilization>, f64, f64) {
    let mut per_backup = Vec::with_capacity(stats.len());
    let (mut sum, mut count, mut max) = (0.0, 0usize, 0.0f64);
    for engine in stats {
        let fills: Vec<f64> = engine
            .zones
            .iter()
            .map(|z| z.used_bytes as f64 / z.capacity_bytes.max(1) as f64)
            .collect();
        let backup_max = fills.iter().copied().fold(0.0, f64::max);
        let backup_sum: f64 = fills.iter().sum();
        per_backup.push(BackupUtilization {
            max: backup_max,
            mean: backup_sum / fills.len().max(1) as f64,
        });
        sum += backup_sum;
        count += fills.len();
        max = max.max(backup_max);
    }
    (per_backup, sum / count.max(1) as f64, max)
}

/// Totals over backups since `base`.
#[derive(Debug, Default, Clone, Copy)]
struct Written {
    primary: u64,
    secondary: u64,
    version_log: u64,
    reorg_bytes: u64,
    passes: u64,
    urgent_passes: u64,
    segments: u64,
    cleaned: myriad_backup_log::CleanedStats,
}

impl Written {
    /// Everything the backups handed to their disks: primary, secondary and version logs.
    fn disk(&self) -> u64 {
        self.primary + self.secondary + self.version_log
    }
}

fn written_since(now: &[EngineStats], base: &[EngineStats]) -> Written {
    let mut totals = (0, 0, 0, 0, 0);
    let mut version_log = 0;
    let mut urgent_passes = 0;
    let mut cleaned = myriad_backup_log::CleanedStats::default();
    for (n, b) in now.iter().zip(base) {
        let (nc, bc) = (&n.reorg_cleaned, &b.reorg_cleaned);
        cleaned.used_bytes += nc.used_bytes.saturating_sub(bc.used_bytes);
        cleaned.estimated_live_bytes += nc
            .estimated_live_bytes
            .saturating_sub(bc.estimated_live_bytes);
        cleaned.live_bytes += nc.live_bytes.saturating_sub(bc.live_bytes);
        cleaned.urgent_used_bytes += nc.urgent_used_bytes.saturating_sub(bc.urgent_used_bytes);
        cleaned.urgent_estimated_live_bytes += nc
            .urgent_estimated_live_bytes
            .saturating_sub(bc.urgent_estimated_live_bytes);
        cleaned.urgent_live_bytes += nc.urgent_live_bytes.saturating_sub(bc.urgent_live_bytes);
        urgent_passes += n.reorg_urgent_passes.saturating_sub(b.reorg_urgent_passes);
        version_log += n
            .version_log_bytes_written
            .saturating_sub(b.version_log_bytes_written);
        totals.0 += n
            .primary_bytes_written
            .saturating_sub(b.primary_bytes_written);
        totals.1 += n
            .secondary_device_bytes_written
            .saturating_sub(b.secondary_device_bytes_written);
        totals.2 += n.reorg_bytes_written.saturating_sub(b.reorg_bytes_written);
        totals.3 += n.reorg_passes.saturating_sub(b.reorg_passes);
        totals.4 += n
            .reorg_segments_cleaned
            .saturating_sub(b.reorg_segments_cleaned);
    }
    Written {
        primary: totals.0,
        secondary: totals.1,
        version_log,
        reorg_bytes: totals.2,
        passes: totals.3,
        urgent_passes,
        segments: totals.4,
        cleaned,
    }
}

/// Object indexes drawn from a zipfian distribution over `objects` ranks, each rank mapped
/// to an object by a fixed random permutation (YCSB's scrambled zipfian).
fn zipf_pool(objects: usize, exponent: f64, draws: usize, seed: u64) -> Result<Vec<u32>, String> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut permutation: Vec<u32> = (0..objects as u32).collect();
    permutation.shuffle(&mut rng);
    let zipf = rand_distr::Zipf::<f64>::new(objects as u64, exponent).map_err(|e| e.to_string())?;
    Ok((0..draws)
        .map(|_| {
            let rank = (rng.sample(zipf) as usize).clamp(1, objects) - 1;
            permutation[rank]
        })
        .collect())
}

/// What [`run`] reports while it runs (for live output).
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// The load phase finished.
    Load(&'a LoadFigures),
    /// A sample of the update phase was taken.
    Sample(&'a Sample),
}

/// Runs the benchmark; `on_progress` sees the load figures and every sample as they are
/// taken.
pub fn run(
    options: &LogCleanerOptions,
    on_progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Report, LogCleanerError> {
    let master_id = LocalReplicas::MASTER;
    let sizing = sizing(options, master_id)?;
    let objects = sizing.objects_per_zone * options.zones as u64;
    if objects > u64::from(u32::MAX) {
        return Err(LogCleanerError::InvalidOption(
            "more than 2^32 objects".to_string(),
        ));
    }
    let scratch = ScratchDir::new(options.dir.as_deref())?;
    let io_mode = if options.buffered {
        IoMode::Buffered
    } else {
        IoMode::Auto
    };
    let local = LocalReplicas::start(&scratch.0, REPLICATION, &sizing.log_config, io_mode)
        .map_err(|e| LogCleanerError::Setup(e.to_string()))?;
    let replicator = local.replicator(replicator_config(options, &sizing, master_id))?;
    let engines = local.engines();
    let cids = object_ids(master_id, objects)?;
    let mut payload = vec![0u8; options.object_bytes];
    for (index, byte) in payload.iter_mut().enumerate() {
        *byte = index as u8;
    }
    let bench = Bench {
        options,
        replicator: &replicator,
        engines: &engines,
        cids: &cids,
        payload: &payload,
    };
    let (load, base) = bench.load_phase(&sizing)?;
    on_progress(Progress::Load(&load));
    let (samples, summary) = bench.update_phase(&load, &base, on_progress)?;
    drop(replicator);
    drop(engines);
    drop(local);
    drop(scratch);
    Ok(Report {
        load,
        samples,
        summary,
    })
}

/// The master's configuration: one batch per message, `outstanding` messages in flight
/// per backup.
fn replicator_config(
    options: &LogCleanerOptions,
    sizing: &Sizing,
    master_id: NodeId,
) -> ReplicatorConfig {
    let mut config = ReplicatorConfig::new(master_id);
    config.replication = REPLICATION;
    config.zone_bytes = sizing.zone_bytes;
    config.default_durability = Durability::Async;
    config.wait_timeout = Duration::from_secs(30);
    // One batch per message, `outstanding` messages in flight per backup (the operation
    // header within a message is taken as at most 32 bytes).
    config.message_bytes_target = (options.batch * (options.object_bytes + 32)).min(64 << 20);
    config.stream_bytes_max = config
        .message_bytes_target
        .saturating_mul(options.outstanding);
    config
}

/// The IDs of the `objects` objects, all of the master.
fn object_ids(master_id: NodeId, objects: u64) -> Result<Vec<ChunkId>, LogCleanerError> {
    let cids: Vec<ChunkId> = (1..=objects)
        .filter_map(|local| ChunkId::new(master_id, local))
        .collect();
    if cids.len() as u64 != objects {
        return Err(LogCleanerError::InvalidOption(
            "too many objects for one node's IDs".to_string(),
        ));
    }
    Ok(cids)
}

/// The running setup that both phases drive.
struct Bench<'a> {
    options: &'a LogCleanerOptions,
    replicator: &'a Replicator,
    engines: &'a [Arc<LogEngine>],
    cids: &'a [ChunkId],
    payload: &'a [u8],
}

/// What the update phase did, for its summary.
struct UpdateRun {
    updates: u64,
    started: Instant,
    submitted: Instant,
    finished: Instant,
    process_bytes: Option<u64>,
    utilization_peak: f64,
}

/// Where the update phase's last sample left off.
struct SampleState {
    started: Instant,
    last_t: f64,
    last_updates: u64,
    last_disk: u64,
    last_applied: u64,
    utilization_peak: f64,
}

impl Bench<'_> {
    fn all_stats(&self) -> Vec<EngineStats> {
        self.engines.iter().map(|e| e.stats()).collect()
    }

    fn flush_all(&self) -> Result<(), LogCleanerError> {
        for engine in self.engines {
            engine.flush()?;
        }
        Ok(())
    }

    /// Operations every backup has applied (the slowest stream), from the master's view.
    fn applied(&self) -> u64 {
        self.replicator
            .stats()
            .streams
            .iter()
            .map(|s| s.applied_seq)
            .min()
            .unwrap_or(0)
    }

    /// Phase 1: creates every object, waits until they are durable and flushed; returns
    /// the load figures and the backups' stats after it (the update phase's base).
    fn load_phase(
        &self,
        sizing: &Sizing,
    ) -> Result<(LoadFigures, Vec<EngineStats>), LogCleanerError> {
        let options = self.options;
        let objects = self.cids.len() as u64;
        let load_started = Instant::now();
        let mut batch: Vec<(ChunkId, &[u8])> = Vec::with_capacity(options.batch);
        for chunk in self.cids.chunks(options.batch) {
            batch.clear();
            batch.extend(chunk.iter().map(|&cid| (cid, self.payload)));
            self.replicator
                .on_create_batch(&batch, Some(Durability::Async))?;
        }
        self.replicator.wait_all(Durability::Durable)?;
        let load_seconds = load_started.elapsed().as_secs_f64().max(1e-9);
        self.flush_all()?;
        let base = self.all_stats();
        let (_, load_utilization, _) = utilization(&base);
        let log_capacity_bytes = base
            .first()
            .and_then(|s| s.zones.first())
            .map_or(0, |z| z.capacity_bytes);
        let load = LoadFigures {
            objects,
            objects_per_zone: sizing.objects_per_zone,
            zone_bytes: sizing.zone_bytes,
            entry_bytes: sizing.entry_bytes,
            log_capacity_bytes,
            live_utilization: (sizing.objects_per_zone * sizing.entry_bytes) as f64
                / log_capacity_bytes.max(1) as f64,
            seconds: load_seconds,
            objects_per_sec: objects as f64 / load_seconds,
            mb_per_sec: (objects * options.object_bytes as u64) as f64 / 1e6 / load_seconds,
            utilization: load_utilization,
        };
        Ok((load, base))
    }

    /// Phase 2: zipfian updates for `duration` (the draws are made before timing), a
    /// sample every second, then the drain; returns the samples and the summary.
    fn update_phase(
        &self,
        load: &LoadFigures,
        base: &[EngineStats],
        on_progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<(Vec<Sample>, Summary), LogCleanerError> {
        let options = self.options;
        let pool = zipf_pool(
            self.cids.len(),
            options.zipf_exponent,
            options.zipf_pool,
            options.seed,
        )
        .map_err(LogCleanerError::InvalidOption)?;
        let mut batch: Vec<(ChunkId, &[u8])> = Vec::with_capacity(options.batch);
        let applied_base = self.applied();
        let process_base = process_write_bytes();
        let mut samples = Vec::new();
        let mut updates = 0u64;
        let mut position = 0usize;
        let started = Instant::now();
        let end = started + options.duration;
        let mut next_sample = started + Duration::from_secs(1);
        let mut state = SampleState {
            started,
            last_t: 0.0,
            last_updates: 0,
            last_disk: 0,
            last_applied: applied_base,
            utilization_peak: load.utilization,
        };
        let mut now = Instant::now();
        while now < end {
            batch.clear();
            for _ in 0..options.batch {
                let index = pool[position] as usize;
                position = (position + 1) % pool.len();
                batch.push((self.cids[index], self.payload));
            }
            self.replicator
                .on_put_batch(&batch, Some(Durability::Async))?;
            updates += batch.len() as u64;
            now = Instant::now();
            if now >= next_sample {
                let sample = self.sample(&mut state, now, updates, base);
                on_progress(Progress::Sample(&sample));
                samples.push(sample);
                // Every interval lasts at least a second; a call that blocked for seconds
                // yields one longer interval, not one sample per missed second.
                next_sample = now + Duration::from_secs(1);
            }
        }
        let submitted = Instant::now();
        self.replicator.wait_all(Durability::Replicated)?;
        self.flush_all()?;
        let finished = Instant::now();
        let process_bytes = match (process_base, process_write_bytes()) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before)),
            _ => None,
        };
        let run = UpdateRun {
            updates,
            started,
            submitted,
            finished,
            process_bytes,
            utilization_peak: state.utilization_peak,
        };
        let summary = self.summarize(load, base, &samples, &run);
        Ok((samples, summary))
    }

    /// One sample of the update phase at `now`, after `updates` updates.
    fn sample(
        &self,
        state: &mut SampleState,
        now: Instant,
        updates: u64,
        base: &[EngineStats],
    ) -> Sample {
        let stats = self.all_stats();
        let (per_backup, mean, max) = utilization(&stats);
        let w = written_since(&stats, base);
        let (reorg_bytes, passes) = (w.reorg_bytes, w.passes);
        let t_sec = now.duration_since(state.started).as_secs_f64();
        let interval = (t_sec - state.last_t).max(1e-9);
        let disk = w.disk();
        let applied_now = self.applied();
        let sample = Sample {
            t_sec,
            update_ops_per_sec: applied_now.saturating_sub(state.last_applied) as f64 / interval,
            submitted_ops_per_sec: (updates - state.last_updates) as f64 / interval,
            updates,
            utilization: mean,
            utilization_max: max,
            per_backup,
            disk_bytes_written: disk,
            reorg_bytes_written: reorg_bytes,
            disk_mb_per_sec: (disk - state.last_disk.min(disk)) as f64 / 1e6 / interval,
            reorg_passes: passes,
        };
        state.utilization_peak = state.utilization_peak.max(max);
        (state.last_t, state.last_updates, state.last_disk) = (t_sec, updates, disk);
        state.last_applied = applied_now;
        sample
    }

    /// The update phase's summary, once everything is replicated and flushed.
    fn summarize(
        &self,
        load: &LoadFigures,
        base: &[EngineStats],
        samples: &[Sample],
        run: &UpdateRun,
    ) -> Summary {
        let UpdateRun {
            updates,
            started,
            submitted,
            finished,
            process_bytes,
            utilization_peak,
        } = *run;
        let seconds = finished.duration_since(started).as_secs_f64().max(1e-9);
        let stats = self.all_stats();
        let (_, mean, max) = utilization(&stats);
        let w = written_since(&stats, base);
        let payload_updated = updates as f64 * self.options.object_bytes as f64;
        let half = self.options.duration.as_secs_f64() / 2.0;
        let steady_write_amplification = samples
            .iter()
            .find(|s| s.t_sec >= half)
            .filter(|s| updates > s.updates)
            .map(|s| {
                let bytes = w.disk().saturating_sub(s.disk_bytes_written) as f64;
                let payload = (updates - s.updates) as f64
                    * self.options.object_bytes as f64
                    * REPLICATION as f64;
                (bytes / payload, s.t_sec)
            });
        Summary {
            load_objects_per_sec: load.objects_per_sec,
            updates,
            seconds,
            drain_seconds: finished.duration_since(submitted).as_secs_f64(),
            update_ops_per_sec: updates as f64 / seconds,
            update_mb_per_sec: payload_updated / 1e6 / seconds,
            write_amplification: w.disk() as f64 / (payload_updated * REPLICATION as f64).max(1.0),
            steady_write_amplification,
            primary_bytes_written: w.primary,
            secondary_device_bytes_written: w.secondary,
            version_log_bytes_written: w.version_log,
            reorg_bytes_written: w.reorg_bytes,
            reorg_passes: w.passes,
            reorg_urgent_passes: w.urgent_passes,
            reorg_segments_cleaned: w.segments,
            reorg_cleaned: w.cleaned,
            process_write_bytes: process_bytes,
            utilization: mean,
            utilization_max: max,
            utilization_peak: utilization_peak.max(max),
        }
    }
}

/// Command-line arguments of `myriad bench log-cleaner`.
#[derive(clap::Args, Debug, Clone)]
pub struct LogCleanerArgs {
    /// Payload bytes per object.
    #[arg(long, default_value_t = 100)]
    pub object_bytes: usize,
    /// Zones loaded (secondary logs per backup).
    #[arg(long, default_value_t = 2)]
    pub zones: usize,
    /// Size of one secondary log, in MiB.
    #[arg(long, default_value_t = 64)]
    pub log_mb: u64,
    /// Segment size of the secondary logs, in KiB (a power of two, 16..=32768).
    #[arg(long, default_value_t = 1024)]
    pub segment_kb: u64,
    /// Live utilization of every log after the load, in percent.
    #[arg(long, default_value_t = 80.0)]
    pub utilization_percent: f64,
    /// Each backup's write buffer, in MiB.
    #[arg(long, default_value_t = 16)]
    pub write_buffer_mb: u64,
    /// Each backup's primary log, in MiB.
    #[arg(long, default_value_t = 64)]
    pub primary_log_mb: u64,
    /// Objects per replication call (DXRAM: 512 per message).
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// Messages in flight per backup stream before the master waits (RAMCloud: 10).
    #[arg(long, default_value_t = 10)]
    pub outstanding: usize,
    /// Length of the update phase, in seconds.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Zipf exponent of the updates (YCSB: 0.99).
    #[arg(long, default_value_t = 0.99)]
    pub zipf_exponent: f64,
    /// Zipfian draws made before timing and cycled.
    #[arg(long, default_value_t = 1 << 22)]
    pub zipf_pool: usize,
    /// Seed of the draws.
    #[arg(long, default_value_t = 0x6c6f_6763_6c65_616e)]
    pub seed: u64,
    /// Directory for the backups' logs (default: the system's temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Use buffered I/O instead of O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
    /// Log fill (percent) above which periodic passes clean a log.
    #[arg(long, default_value_t = 60)]
    pub activation_percent: u32,
    /// Log fill (percent) at which a write asks for a prompt pass.
    #[arg(long, default_value_t = 75)]
    pub prompt_percent: u32,
    /// Versions one zone's version buffer holds (default: the log engine's).
    #[arg(long)]
    pub version_entries: Option<usize>,
    /// Print one JSON object per line (`kind` = load | sample | summary).
    #[arg(long)]
    pub json: bool,
    /// Write the samples (one per second) to this CSV file.
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

impl LogCleanerArgs {
    /// The options these arguments select.
    pub fn options(&self) -> LogCleanerOptions {
        LogCleanerOptions {
            object_bytes: self.object_bytes,
            zones: self.zones,
            secondary_log_bytes: self.log_mb << 20,
            segment_bytes: self.segment_kb << 10,
            utilization: self.utilization_percent / 100.0,
            write_buffer_bytes: self.write_buffer_mb << 20,
            primary_log_bytes: self.primary_log_mb << 20,
            batch: self.batch,
            outstanding: self.outstanding,
            duration: Duration::from_secs(self.seconds),
            zipf_exponent: self.zipf_exponent,
            zipf_pool: self.zipf_pool,
            seed: self.seed,
            dir: self.dir.clone(),
            buffered: self.buffered,
            activation_percent: self.activation_percent,
            prompt_percent: self.prompt_percent,
            version_entries: self
                .version_entries
                .unwrap_or(LogConfig::default().version_buffer_entries_max),
        }
    }
}

/// The load figures as JSON (`kind` = "load").
pub fn load_json(load: &LoadFigures, options: &LogCleanerOptions) -> serde_json::Value {
    json!({
        "kind": "load",
        "backups": REPLICATION,
        "object_bytes": options.object_bytes,
        "zones": options.zones,
        "objects": load.objects,
        "objects_per_zone": load.objects_per_zone,
        "entry_bytes": load.entry_bytes,
        "log_capacity_bytes": load.log_capacity_bytes,
        "live_utilization": load.live_utilization,
        "utilization": load.utilization,
        "load_seconds": load.seconds,
        "load_objects_per_sec": load.objects_per_sec,
        "load_mb_per_sec": load.mb_per_sec,
    })
}

/// One sample as JSON (`kind` = "sample").
pub fn sample_json(sample: &Sample) -> serde_json::Value {
    let per_backup: Vec<serde_json::Value> = sample
        .per_backup
        .iter()
        .map(|b| json!({"max": b.max, "mean": b.mean}))
        .collect();
    json!({
        "kind": "sample",
        "t_sec": sample.t_sec,
        "update_ops_per_sec": sample.update_ops_per_sec,
        "submitted_ops_per_sec": sample.submitted_ops_per_sec,
        "updates": sample.updates,
        "utilization": sample.utilization,
        "utilization_max": sample.utilization_max,
        "utilization_per_backup": per_backup,
        "disk_bytes_written": sample.disk_bytes_written,
        "reorg_bytes_written": sample.reorg_bytes_written,
        "disk_mb_per_sec": sample.disk_mb_per_sec,
        "reorg_passes": sample.reorg_passes,
    })
}

/// The summary as JSON (`kind` = "summary").
pub fn summary_json(summary: &Summary, options: &LogCleanerOptions) -> serde_json::Value {
    json!({
        "kind": "summary",
        "load_objects_per_sec": summary.load_objects_per_sec,
        "updates": summary.updates,
        "update_seconds": summary.seconds,
        "drain_seconds": summary.drain_seconds,
        "update_ops_per_sec": summary.update_ops_per_sec,
        "update_mb_per_sec": summary.update_mb_per_sec,
        "write_amplification": summary.write_amplification,
        "steady_write_amplification": summary.steady_write_amplification.map(|s| s.0),
        "steady_from_sec": summary.steady_write_amplification.map(|s| s.1),
        "write_amplification_formula":
            "(primary + secondary + version log bytes written by all backups during updates) / (payload bytes updated * R)",
        "primary_bytes_written": summary.primary_bytes_written,
        "secondary_device_bytes_written": summary.secondary_device_bytes_written,
        "version_log_bytes_written": summary.version_log_bytes_written,
        "reorg_bytes_written": summary.reorg_bytes_written,
        "reorg_passes": summary.reorg_passes,
        "reorg_segments_cleaned": summary.reorg_segments_cleaned,
        "reorg_urgent_passes": summary.reorg_urgent_passes,
        "reorg_cleaned_used_bytes": summary.reorg_cleaned.used_bytes,
        "reorg_cleaned_estimated_live_bytes": summary.reorg_cleaned.estimated_live_bytes,
        "reorg_cleaned_live_bytes": summary.reorg_cleaned.live_bytes,
        "reorg_urgent_cleaned_used_bytes": summary.reorg_cleaned.urgent_used_bytes,
        "reorg_urgent_cleaned_estimated_live_bytes": summary.reorg_cleaned.urgent_estimated_live_bytes,
        "reorg_urgent_cleaned_live_bytes": summary.reorg_cleaned.urgent_live_bytes,
        "process_write_bytes": summary.process_write_bytes,
        "process_write_amplification": summary.process_write_amplification(options.object_bytes),
        "utilization": summary.utilization,
        "utilization_max": summary.utilization_max,
        "utilization_peak": summary.utilization_peak,
    })
}

/// The CSV header of [`write_csv`].
pub const CSV_HEADER: &str = "t_sec,update_ops_per_sec,submitted_ops_per_sec,updates,utilization_mean,utilization_max,disk_bytes_written,reorg_bytes_written,disk_mb_per_sec,reorg_passes";

/// Writes the samples as CSV (one line per second, [`CSV_HEADER`] first).
pub fn write_csv(path: &Path, samples: &[Sample]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "{CSV_HEADER}")?;
    for s in samples {
        writeln!(
            out,
            "{:.3},{:.0},{:.0},{},{:.4},{:.4},{},{},{:.1},{}",
            s.t_sec,
            s.update_ops_per_sec,
            s.submitted_ops_per_sec,
            s.updates,
            s.utilization,
            s.utilization_max,
            s.disk_bytes_written,
            s.reorg_bytes_written,
            s.disk_mb_per_sec,
            s.reorg_passes
        )?;
    }
    out.flush()
}

/// Runs the benchmark and prints its figures.
pub fn run_cli(args: &LogCleanerArgs) -> Result<(), String> {
    let options = args.options();
    let json = args.json;
    if !json {
        println!(
            "log-cleaner: 1 master, {REPLICATION} backups, {} × {} MiB logs per backup, \
             {}-byte objects to {:.0} % live, zipf {} updates for {} s",
            options.zones,
            options.secondary_log_bytes >> 20,
            options.object_bytes,
            options.utilization * 100.0,
            options.zipf_exponent,
            options.duration.as_secs()
        );
    }
    let mut print = |progress: Progress<'_>| match progress {
        Progress::Load(load) if json => println!("{}", load_json(load, &options)),
        Progress::Load(load) => {
            println!(
                "load:    {} objects in {:.2} s = {:.0} objects/s, {:.1} MB/s payload; \
                 live utilization {:.1} % ({} B entries, {} MiB logs), log fill {:.1} %",
                load.objects,
                load.seconds,
                load.objects_per_sec,
                load.mb_per_sec,
                load.live_utilization * 100.0,
                load.entry_bytes,
                load.log_capacity_bytes >> 20,
                load.utilization * 100.0
            );
            println!(
                "{:>6} {:>12} {:>9} {:>9} {:>11} {:>9} {:>7}",
                "t s", "updates/s", "util avg", "util max", "disk MB", "disk MB/s", "passes"
            );
        }
        Progress::Sample(s) if json => println!("{}", sample_json(s)),
        Progress::Sample(s) => println!(
            "{:>6.1} {:>12.0} {:>8.1}% {:>8.1}% {:>11.1} {:>9.1} {:>7}",
            s.t_sec,
            s.update_ops_per_sec,
            s.utilization * 100.0,
            s.utilization_max * 100.0,
            s.disk_bytes_written as f64 / 1e6,
            s.disk_mb_per_sec,
            s.reorg_passes
        ),
    };
    let report = run(&options, &mut print).map_err(|e| e.to_string())?;
    if let Some(path) = &args.csv {
        write_csv(path, &report.samples).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let summary = &report.summary;
    if json {
        println!("{}", summary_json(summary, &options));
        return Ok(());
    }
    println!(
        "updates: {} in {:.2} s (drain {:.2} s) = {:.0} updates/s, {:.1} MB/s payload",
        summary.updates,
        summary.seconds,
        summary.drain_seconds,
        summary.update_ops_per_sec,
        summary.update_mb_per_sec
    );
    println!(
        "disk:    primary {:.1} MB + secondary {:.1} MB (reorganizer {:.1} MB, {} passes of \
         which {} urgent, {} segments) + version logs {:.1} MB over {} backups",
        summary.primary_bytes_written as f64 / 1e6,
        summary.secondary_device_bytes_written as f64 / 1e6,
        summary.reorg_bytes_written as f64 / 1e6,
        summary.reorg_passes,
        summary.reorg_urgent_passes,
        summary.reorg_segments_cleaned,
        summary.version_log_bytes_written as f64 / 1e6,
        REPLICATION
    );
    let c = &summary.reorg_cleaned;
    let percent = |part: u64, of: u64| part as f64 * 100.0 / of.max(1) as f64;
    println!(
        "cleaned: prompt/periodic {:.1} MB, estimated {:.1} % live, found {:.1} %; urgent \
         {:.1} MB, estimated {:.1} % live, found {:.1} %",
        c.used_bytes as f64 / 1e6,
        percent(c.estimated_live_bytes, c.used_bytes),
        percent(c.live_bytes, c.used_bytes),
        c.urgent_used_bytes as f64 / 1e6,
        percent(c.urgent_estimated_live_bytes, c.urgent_used_bytes),
        percent(c.urgent_live_bytes, c.urgent_used_bytes),
    );
    println!(
        "write amplification {:.2} = (primary + secondary + version log bytes written by all \
         backups during updates) / (payload bytes updated × R={REPLICATION})",
        summary.write_amplification
    );
    if let Some((steady, from)) = summary.steady_write_amplification {
        println!(
            "  steady (second half, from {from:.1} s to the end): {steady:.2}; the whole \
             phase's figure is lower while the updates fill the space the load left free"
        );
    }
    if let Some(amplification) = summary.process_write_amplification(options.object_bytes) {
        println!(
            "  process block-layer writes {:.1} MB (version logs included once written back) = {:.2} × payload × R",
            summary.process_write_bytes.unwrap_or(0) as f64 / 1e6,
            amplification
        );
    }
    println!(
        "utilization at end: mean {:.1} %, max {:.1} %, peak {:.1} %",
        summary.utilization * 100.0,
        summary.utilization_max * 100.0,
        summary.utilization_peak * 100.0
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> LogCleanerOptions {
        LogCleanerOptions {
            object_bytes: 100,
            zones: 2,
            secondary_log_bytes: 1 << 20,
            segment_bytes: 64 << 10,
            utilization: 0.8,
            write_buffer_bytes: 256 << 10,
            primary_log_bytes: 1 << 20,
            batch: 128,
            outstanding: 4,
            duration: Duration::from_millis(1500),
            zipf_pool: 1 << 14,
            ..LogCleanerOptions::default()
        }
    }

    #[test]
    fn tiny_run_reports_sane_figures() {
        let options = tiny();
        let (mut loads, mut samples) = (0, 0);
        let report = run(&options, &mut |progress| match progress {
            Progress::Load(_) => {
                assert_eq!(samples, 0, "the load is reported before any sample");
                loads += 1;
            }
            Progress::Sample(_) => samples += 1,
        })
        .unwrap();
        let (load, summary) = (&report.load, &report.summary);
        assert_eq!(load.objects, 2 * load.objects_per_zone);
        assert!(load.objects_per_sec > 0.0);
        assert!(
            (load.live_utilization - 0.8).abs() < 0.01,
            "{}",
            load.live_utilization
        );
        // The log holds at least the live entries after the load.
        assert!(load.utilization >= load.live_utilization * 0.95, "{load:?}");
        assert!(load.utilization <= 1.0);
        assert_eq!(loads, 1);
        assert_eq!(samples, report.samples.len());
        assert!(!report.samples.is_empty());
        for s in &report.samples {
            assert!(s.utilization > 0.0 && s.utilization <= 1.0, "{s:?}");
            assert!(s.utilization_max >= s.utilization && s.utilization_max <= 1.0);
            assert_eq!(s.per_backup.len(), REPLICATION);
        }
        assert!(summary.updates > 0);
        assert!(summary.update_ops_per_sec > 0.0);
        assert!(summary.utilization > 0.0 && summary.utilization <= 1.0);
        assert!(summary.utilization_max <= 1.0);
        // Every update reaches every backup's disk at least once, with a header.
        assert!(
            summary.write_amplification >= 1.0,
            "write amplification {}",
            summary.write_amplification
        );
        assert!(summary.write_amplification < 100.0);
        // Every update of the second half reaches every backup's disk after that half
        // began, with a header.
        let (steady, from) = summary
            .steady_write_amplification
            .expect("a sample in the second half");
        assert!((1.0..100.0).contains(&steady), "steady {steady}");
        assert!(from >= options.duration.as_secs_f64() / 2.0);
        let value = summary_json(summary, &options);
        assert_eq!(value["kind"], "summary");
        for field in [
            "load_objects_per_sec",
            "update_ops_per_sec",
            "write_amplification",
            "utilization",
        ] {
            assert!(value[field].as_f64().is_some(), "{field}");
        }
        assert_eq!(load_json(load, &options)["kind"], "load");
        assert_eq!(sample_json(&report.samples[0])["kind"], "sample");
    }

    #[test]
    fn csv_has_a_header_and_one_line_per_sample() {
        let dir = ScratchDir::new(None).unwrap();
        let path = dir.0.join("samples.csv");
        let sample = Sample {
            t_sec: 1.0,
            update_ops_per_sec: 10.0,
            submitted_ops_per_sec: 12.0,
            updates: 10,
            utilization: 0.8,
            utilization_max: 0.9,
            per_backup: vec![],
            disk_bytes_written: 1000,
            reorg_bytes_written: 0,
            disk_mb_per_sec: 0.001,
            reorg_passes: 0,
        };
        write_csv(&path, &[sample.clone(), sample]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines[1].split(',').count(), CSV_HEADER.split(',').count());
    }

    #[test]
    fn options_out_of_range_are_rejected() {
        let mut options = tiny();
        options.utilization = 1.0;
        assert!(matches!(
            run(&options, &mut |_| {}),
            Err(LogCleanerError::InvalidOption(_))
        ));
        let mut options = tiny();
        options.segment_bytes = 3000;
        assert!(matches!(
            run(&options, &mut |_| {}),
            Err(LogCleanerError::InvalidOption(_))
        ));
        let mut options = tiny();
        options.prompt_percent = 150;
        assert!(matches!(
            run(&options, &mut |_| {}),
            Err(LogCleanerError::InvalidOption(_))
        ));
    }
}
