//! `myriad bench backup-mem`: the RAM a backup spends per chunk it keeps on disk.
//!
//! What it does: opens a log engine with a backup peer's default settings (those of the
//! node's `BackupOptions`: 256 MiB zones, secondary logs of twice that, 32 MiB write
//! buffer) on this machine's disk, creates `--zones` zones and appends `--chunks` chunks
//! of `--chunk-bytes` bytes round-robin over them, each zone's chunks with consecutive
//! IDs (as an owner's zone holds them), one append call per chunk (one replication
//! message per write, as a backup gets them from clients writing one record at a time),
//! paced at `--rate` chunks per second (a cluster's backups get their writes spread over
//! the load, so the flusher takes the write buffer every `flush_interval` with little in
//! it; appending as fast as one thread can fills the buffer's halves, which a paced load
//! never touches).
//! After everything is durable it reports the growth of this process's RSS over the
//! appends and the engine's own RAM figures (`LogEngine::stats`: the version buffers,
//! carries and segment counters per zone, and the write buffer), per chunk.
//!
//! The default shape is one backup of `scripts/ycsb`'s 1 M-record run (4 peers, R = 3: each
//! peer backs up the zones of the other three, 250,000 records of 67 bytes each). The
//! figure that matters there is the RSS growth per chunk, which that script sums over
//! every node; Redis's whole cost per record in the same run was about 189 bytes.
//!
//! Prints figures (one JSON line with `--json`); asserts nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use myriad_backup_log::{DiskStorage, IoMode, LogConfig, LogEngine, Storage, ZoneId};
use serde_json::json;

use crate::process;

/// Command-line arguments of `myriad bench backup-mem`.
#[derive(clap::Args, Debug, Clone)]
pub struct BackupMemArgs {
    /// Directory for the log files (created; deleted at the end).
    #[arg(long, default_value = "run/bench-backup-mem")]
    pub dir: PathBuf,
    /// Chunks appended in all.
    #[arg(long, default_value_t = 750_000)]
    pub chunks: u64,
    /// Zones they are spread over (one per owner the backup serves).
    #[arg(long, default_value_t = 3)]
    pub zones: u16,
    /// Bytes per chunk (a YCSB workload G record is 67).
    #[arg(long, default_value_t = 67)]
    pub chunk_bytes: usize,
    /// Chunks appended per second (0: as fast as possible). The default is about what
    /// one backup of `scripts/ycsb`'s load gets on a quiet machine, a little faster.
    #[arg(long, default_value_t = 50_000)]
    pub rate: u64,
    /// Versions one zone's version buffer holds (the node's
    /// `backup.version_buffer_entries`; default: the log engine's default).
    #[arg(long)]
    pub version_entries: Option<usize>,
    /// Use buffered I/O instead of O_DIRECT (where the file system allows it).
    #[arg(long)]
    pub buffered: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The log settings of a backup peer with the node's default backup options (256 MiB
/// zones, secondary logs of twice the zone).
fn backup_config(args: &BackupMemArgs) -> LogConfig {
    let defaults = LogConfig::default();
    LogConfig {
        secondary_log_bytes: 2 * (256 << 20),
        version_buffer_entries_max: args
            .version_entries
            .unwrap_or(defaults.version_buffer_entries_max),
        ..defaults
    }
}

/// Runs the benchmark.
pub fn run(args: &BackupMemArgs) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(&args.dir);
    let mode = if args.buffered {
        IoMode::Buffered
    } else {
        IoMode::Auto
    };
    let storage: Arc<dyn Storage> =
        Arc::new(DiskStorage::new(&args.dir, mode).map_err(|e| e.to_string())?);
    let result = measure(args, storage);
    let _ = std::fs::remove_dir_all(&args.dir);
    result
}

fn measure(args: &BackupMemArgs, storage: Arc<dyn Storage>) -> Result<(), String> {
    // The heap policy of a `myriad peer` process (its trimmer runs every second; here one
    // trim after the load, timed).
    myriad_mem::heap::keep_heap_lean();
    let config = backup_config(args);
    let version_entries = config.version_buffer_entries_max;
    let write_buffer = config.write_buffer_bytes;
    let engine = LogEngine::open(config, storage).map_err(|e| e.to_string())?;
    let zones: Vec<ZoneId> = (0..args.zones.max(1))
        .map(|z| ZoneId {
            owner: 2 + z,
            zone: 0,
        })
        .collect();
    let payload = vec![0x5Au8; args.chunk_bytes];
    let rss_before = process::rss_bytes();
    let started = Instant::now();
    for i in 0..args.chunks {
        let zone = zones[(i % zones.len() as u64) as usize];
        // The zone owner's chunks, consecutive local IDs (as YCSB's key scheme makes them).
        let cid = (u64::from(zone.owner) << 48) | (1 << 40) | (i / zones.len() as u64);
        if i < zones.len() as u64 {
            engine.create_zone(zone).map_err(|e| e.to_string())?;
        }
        engine
            .append(zone, cid, &payload)
            .map_err(|e| format!("append: {e}"))?;
        if args.rate > 0 && i % 1000 == 999 {
            let due = std::time::Duration::from_secs_f64((i + 1) as f64 / args.rate as f64);
            if let Some(ahead) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
    }
    engine.flush().map_err(|e| format!("flush: {e}"))?;
    let elapsed = started.elapsed();
    // The flusher hands back its lists and the syncer its pages right after the flush.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let rss_after = process::rss_bytes();
    let stats = engine.stats();
    let zones_bytes: u64 = stats.zones.iter().map(|z| z.memory_bytes).sum();
    let buffered_versions: u64 = stats.zones.iter().map(|z| z.version_buffer_entries).sum();
    let chunks = args.chunks.max(1) as f64;
    let growth = rss_after.saturating_sub(rss_before);
    let trim_started = Instant::now();
    myriad_mem::heap::trim_now();
    let trim_secs = trim_started.elapsed().as_secs_f64();
    let trimmed_growth = process::rss_bytes().saturating_sub(rss_before);
    let trimmed_per_chunk = trimmed_growth as f64 / chunks;
    let per_chunk = growth as f64 / chunks;
    let zones_per_chunk = zones_bytes as f64 / chunks;
    engine.shutdown().map_err(|e| e.to_string())?;
    if args.json {
        println!(
            "{}",
            json!({"bench": "backup_mem", "chunks": args.chunks, "zones": zones.len(), "rate": args.rate,
                   "chunk_bytes": args.chunk_bytes, "secs": elapsed.as_secs_f64(),
                   "rss_growth_bytes": growth, "rss_growth_per_chunk": per_chunk,
                   "trim_secs": trim_secs, "trimmed_rss_growth_bytes": trimmed_growth,
                   "trimmed_rss_growth_per_chunk": trimmed_per_chunk,
                   "zones_memory_bytes": zones_bytes, "zones_memory_per_chunk": zones_per_chunk,
                   "version_buffer_entries": buffered_versions,
                   "write_buffer_bytes": write_buffer, "version_buffer_entries_max": version_entries})
        );
    } else {
        println!(
            "backup memory: {} chunks of {} B over {} zones in {:.1} s: RSS growth {:.1} MiB = \
             {per_chunk:.1} B per chunk; zones' version buffers, carries and counters \
             {:.1} MiB = {zones_per_chunk:.1} B per chunk ({buffered_versions} versions \
             buffered, at most {version_entries} per zone); write buffer {} MiB (RSS only as \
             far as it was used); after a heap trim ({:.2} ms): RSS growth {:.1} MiB = \
             {trimmed_per_chunk:.1} B per chunk",
            args.chunks,
            args.chunk_bytes,
            zones.len(),
            elapsed.as_secs_f64(),
            growth as f64 / (1 << 20) as f64,
            zones_bytes as f64 / (1 << 20) as f64,
            write_buffer >> 20,
            trim_secs * 1e3,
            trimmed_growth as f64 / (1 << 20) as f64,
        );
    }
    Ok(())
}
