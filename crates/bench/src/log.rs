//! `myriad bench log`: the backup-side log engine on this machine's disk.
//!
//! Three parts, each against a baseline measured in the same run:
//! 1. **Disk baseline**: sequential O_DIRECT writes (8 MiB per write, one `fdatasync` at
//!    the end) and reads of a 1 GiB file through the engine's own storage boundary, the
//!    access pattern of fio's `rw=write/read, direct=1, bs=8m`; plus fio itself, with one
//!    job (`fio_mb_per_sec`, like the disk baseline) and with as many jobs as the engine
//!    has writes in flight (`fio_parallel_mb_per_sec`: one per I/O thread of its writer,
//!    `--write-threads`). fio runs again, with the engine's parallelism, right before
//!    every append run, and each run's ratios are to that neighbouring fio figure: a
//!    shared VM's disk drifts by a third over minutes, so one fio run at the start would
//!    make the ratios of later runs a comparison with another disk. A fio that is not
//!    installed gives null figures and `fio_status: "not installed"`; one that ran and
//!    failed gives `"failed"` and `fio_error` with its exit status and stderr tail.
//! 2. **Append rate** per entry size: one thread appends `--append-mb` of payload
//!    round-robin over 4 zones as fast as it can. "Into the write buffer" is the rate of
//!    the append calls; "to disk" includes the final flush until everything is durable.
//!    Bytes written per payload byte is what the storage layer was handed: entry
//!    headers, primary-log copies of small batches, block headers, page padding, the
//!    partial last page every append rewrites, and the version logs (sealed epochs).
//!    Payload bytes/s (`mb_per_sec`) and total bytes/s (`disk_mb_per_sec`) are each
//!    compared with fio (`payload_fio_ratio`, `disk_fio_ratio`).
//!    Also the CPU time all of the process's threads used from the first append until
//!    everything was durable, per million entries (`/proc/self/stat`, 10 ms ticks): on a
//!    shared machine it moves less than the rates do.
//! 3. **Recovery read** of one zone of `--zone-mb` of 64-byte chunks (default 256 MiB,
//!    about 4.2 M chunks), with O_DIRECT reads (cold: no page cache), `--threads` threads
//!    validating checksums; the callback only sums the bytes (inserting into the memory
//!    manager is the recovery issue's part). Also the time to reopen the engine, which
//!    is what a full restart costs before recovery reads start.
//!
//! Prints figures (JSON lines with `--json`); asserts nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use myriad_backup_log::{
    AlignedBuf, DiskStorage, IoMode, LogConfig, LogEngine, RecoveryOptions, Storage, ZoneId,
};
use serde_json::json;

use crate::tool::{self, ToolError};

/// Command-line arguments of `myriad bench log`.
#[derive(clap::Args, Debug, Clone)]
pub struct LogArgs {
    /// Directory for the log files (created; its contents are deleted at the end).
    #[arg(long, default_value = "run/bench-log")]
    pub dir: PathBuf,
    /// Entry (payload) sizes in bytes for the append rate.
    #[arg(long, value_delimiter = ',', default_value = "32,64,512,4096,16384")]
    pub entry_bytes: Vec<usize>,
    /// Payload appended per entry size and batch size, in MiB.
    #[arg(long, default_value_t = 512)]
    pub append_mb: u64,
    /// Chunks per append call: 1 = `append`, more = `append_batch` (one log message of the
    /// owner carries many chunks of a zone).
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub batch: Vec<usize>,
    /// Payload of the zone read back by the recovery part, in MiB (0 skips it).
    #[arg(long, default_value_t = 256)]
    pub zone_mb: u64,
    /// Threads of the recovery read.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Size of the disk baseline file, in MiB (also what fio writes; 0 skips fio).
    #[arg(long, default_value_t = 1024)]
    pub baseline_mb: u64,
    /// Use buffered I/O instead of O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
    /// I/O threads of the engine's writer (`LogConfig::write_threads`; 0: the writer
    /// thread writes itself).
    #[arg(long, default_value_t = LogConfig::default().write_threads)]
    pub write_threads: usize,
    /// Chunks up to this size appended together with consecutive IDs share one entry
    /// header in the secondary log (`LogConfig::run_chunk_bytes_max`; 0: one header per
    /// chunk).
    #[arg(long, default_value_t = LogConfig::default().run_chunk_bytes_max)]
    pub run_chunk_bytes: u32,
    /// Runs per entry size and batch size, each right after its own fio run; with more
    /// than one, a summary line gives the median ratio to fio (the disk of a shared VM
    /// drifts by a third from minute to minute, so one pair is a coin toss).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Print one JSON object per result line.
    #[arg(long)]
    pub json: bool,
}

fn mb_per_sec(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64().max(1e-9)
}

fn emit(json: bool, value: serde_json::Value, text: String) {
    if json {
        println!("{value}");
    } else {
        println!("{text}");
    }
}

/// Sequential O_DIRECT write then read of `mb` MiB: (write MB/s, read MB/s, write MB/s
/// with an fdatasync after every 2 MiB, direct?).
fn disk_baseline(storage: &dyn Storage, mb: u64) -> Result<(f64, f64, f64, bool), String> {
    let block = 8usize << 20;
    let blocks = (mb << 20).div_ceil(block as u64).max(1);
    let file = storage
        .open("baseline.dat", blocks * block as u64)
        .map_err(|e| format!("baseline file: {e}"))?;
    let mut buf = AlignedBuf::zeroed(block);
    buf.iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i * 7) as u8);
    let started = Instant::now();
    for i in 0..blocks {
        file.write_at(&buf, i * block as u64)
            .map_err(|e| format!("baseline write: {e}"))?;
    }
    file.sync().map_err(|e| format!("baseline sync: {e}"))?;
    let write = mb_per_sec(blocks * block as u64, started.elapsed());
    let started = Instant::now();
    for i in 0..blocks {
        file.read_at(&mut buf, i * block as u64)
            .map_err(|e| format!("baseline read: {e}"))?;
    }
    let read = mb_per_sec(blocks * block as u64, started.elapsed());
    // The same with 2 MiB writes each followed by fdatasync: what a flusher that makes
    // every batch durable can reach at most.
    let small = 2usize << 20;
    let started = Instant::now();
    for i in 0..(blocks * block as u64 / small as u64) {
        file.write_at(&buf[..small], i * small as u64)
            .map_err(|e| format!("baseline write: {e}"))?;
        file.sync().map_err(|e| format!("baseline sync: {e}"))?;
    }
    let synced = mb_per_sec(blocks * block as u64, started.elapsed());
    let direct = file.direct();
    drop(file);
    storage
        .remove("baseline.dat")
        .map_err(|e| format!("baseline remove: {e}"))?;
    Ok((write, read, synced, direct))
}

/// Concurrent writes the engine has in flight: one per I/O thread of its writer
/// (`LogConfig::write_threads`), or the writer thread alone when that is 0. fio runs with
/// as many jobs, so "% of fio" compares like with like.
pub fn engine_write_parallelism(write_threads: usize) -> usize {
    write_threads.max(1)
}

/// The fio command line of [`fio_write_mb_per_sec`]: `jobs` jobs (`--numjobs`, one file
/// each in `dir`, `psync`, 8 MiB per write, an fsync at the end), `mb` MiB in all.
fn fio_args(dir: &Path, mb: u64, jobs: usize) -> Vec<String> {
    let jobs = jobs.max(1);
    let per_job_mb = (mb / jobs as u64).max(8);
    vec![
        "--name=fio-seq".into(),
        format!("--directory={}", dir.display()),
        "--rw=write".into(),
        "--bs=8m".into(),
        format!("--size={per_job_mb}m"),
        format!("--numjobs={jobs}"),
        "--group_reporting".into(),
        "--direct=1".into(),
        "--ioengine=psync".into(),
        "--end_fsync=1".into(),
        "--output-format=json".into(),
    ]
}

/// The aggregate write bandwidth in MiB/s of fio's `--output-format=json --group_reporting`.
fn parse_fio_write_bw(stdout: &[u8]) -> Result<f64, ToolError> {
    let value: serde_json::Value = serde_json::from_slice(stdout).map_err(|e| {
        let text = String::from_utf8_lossy(stdout);
        ToolError::failed(
            "fio",
            format!("unreadable output ({e}): {:.200}", text.trim()),
        )
    })?;
    let kib_per_sec = value["jobs"][0]["write"]["bw"]
        .as_f64()
        .ok_or_else(|| ToolError::failed("fio", "no jobs[0].write.bw in its JSON output"))?;
    Ok(kib_per_sec / 1024.0)
}

/// fio's sequential O_DIRECT write bandwidth in MiB/s on `dir` with `jobs` writers at once
/// (see [`fio_args`]); [`ToolError::NotInstalled`] without fio, [`ToolError::Failed`] with
/// its exit status and stderr tail when it ran and failed.
fn fio_write_mb_per_sec(dir: &Path, mb: u64, jobs: usize) -> Result<f64, ToolError> {
    if mb == 0 {
        return Err(ToolError::Skipped {
            tool: "fio".into(),
            reason: "--baseline-mb 0".into(),
        });
    }
    let result = tool::run(
        "fio",
        std::process::Command::new("fio").args(fio_args(dir, mb, jobs)),
    );
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("fio-seq.") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    parse_fio_write_bw(&result?.stdout)
}

/// "N MB/s", or why fio gave no figure.
fn fio_text(fio: &Result<f64, ToolError>) -> String {
    match fio {
        Ok(mb) => format!("{mb:.0} MB/s"),
        Err(error) => error.to_string(),
    }
}

fn config_for(zone_mb: u64, write_threads: usize, run_chunk_bytes: u32) -> LogConfig {
    LogConfig {
        secondary_log_bytes: (2 * zone_mb.max(64)) << 20,
        recovery_threads: 4,
        write_threads,
        run_chunk_bytes_max: run_chunk_bytes,
        ..LogConfig::default()
    }
}

fn clear_dir(dir: &PathBuf) {
    let _ = std::fs::remove_dir_all(dir);
}

/// The disk baseline of part 1, which the later parts compare with.
struct Baseline {
    disk_write: f64,
    disk_read: f64,
    /// fio with the engine's write parallelism (the fallback of the append runs' fio).
    fio_parallel: Result<f64, ToolError>,
}

/// The storage mode `--buffered` asks for.
fn io_mode(args: &LogArgs) -> IoMode {
    if args.buffered {
        IoMode::Buffered
    } else {
        IoMode::Auto
    }
}

/// Clears `args.dir` and opens fresh storage on it.
fn fresh_storage(args: &LogArgs) -> Result<Arc<dyn Storage>, String> {
    clear_dir(&args.dir);
    Ok(Arc::new(
        DiskStorage::new(&args.dir, io_mode(args)).map_err(|e| format!("{e}"))?,
    ))
}

/// Runs the benchmark.
pub fn run(args: &LogArgs) -> Result<(), String> {
    let baseline = run_baseline(args)?;
    for &entry_bytes in &args.entry_bytes {
        for &batch in &args.batch {
            run_append_series(args, &baseline, entry_bytes, batch.max(1))?;
        }
    }
    if args.zone_mb > 0 {
        run_recovery_read(args, &baseline)?;
    }
    clear_dir(&args.dir);
    Ok(())
}

/// Part 1: the disk baseline and fio, with one job (like the disk baseline) and with the
/// engine's write parallelism (what the append runs are compared with).
fn run_baseline(args: &LogArgs) -> Result<Baseline, String> {
    let storage = fresh_storage(args)?;
    let (disk_write, disk_read, disk_synced, direct) =
        disk_baseline(storage.as_ref(), args.baseline_mb)?;
    let fio = fio_write_mb_per_sec(&args.dir, args.baseline_mb, 1);
    let jobs = engine_write_parallelism(args.write_threads);
    let fio_parallel = fio_write_mb_per_sec(&args.dir, args.baseline_mb, jobs);
    emit(
        args.json,
        json!({"baseline": "sequential_8mib", "direct": direct,
               "disk_write_mb_per_sec": disk_write, "disk_read_mb_per_sec": disk_read,
               "disk_synced_write_mb_per_sec": disk_synced,
               "fio_mb_per_sec": fio.as_ref().ok(),
               "fio_status": fio.as_ref().map_or_else(ToolError::status, |_| "ok"),
               "fio_error": fio.as_ref().err().map(ToString::to_string),
               "fio_jobs": jobs,
               "fio_parallel_mb_per_sec": fio_parallel.as_ref().ok(),
               "fio_parallel_error": fio_parallel.as_ref().err().map(ToString::to_string)}),
        format!(
            "disk baseline (sequential 8 MiB {}): write {disk_write:.0} MB/s, read {disk_read:.0} MB/s, \
             2 MiB writes each synced {disk_synced:.0} MB/s; fio write, 1 job: {}; \
             {jobs} jobs (the engine's write parallelism): {}",
            if direct { "O_DIRECT" } else { "buffered" },
            fio_text(&fio),
            fio_text(&fio_parallel),
        ),
    );
    Ok(Baseline {
        disk_write,
        disk_read,
        fio_parallel,
    })
}

/// What one append run measured, for the summary of `--repeat` runs.
struct AppendRun {
    /// Payload bytes/s over the neighbouring fio's bytes/s (at the engine's parallelism).
    payload_fio_ratio: Option<f64>,
    /// All bytes written (payload and overhead) per second over the neighbouring fio's.
    disk_fio_ratio: Option<f64>,
    /// Payload MiB/s until durable.
    payload_mb: f64,
}

/// Part 2 for one entry size and batch size: `--repeat` runs, then a summary line if
/// there was more than one.
fn run_append_series(
    args: &LogArgs,
    baseline: &Baseline,
    entry_bytes: usize,
    batch: usize,
) -> Result<(), String> {
    let mut runs: Vec<AppendRun> = Vec::new();
    for _ in 0..args.repeat.max(1) {
        runs.push(run_append(args, baseline, entry_bytes, batch)?);
    }
    if runs.len() > 1 {
        emit_append_summary(args, entry_bytes, batch, &runs);
    }
    Ok(())
}

/// Appends `entries` entries of `payload` round-robin over `zones`, `batch` per call.
fn append_entries(
    engine: &LogEngine,
    zones: &[ZoneId],
    entries: u64,
    payload: &[u8],
    batch: usize,
) -> Result<(), String> {
    if batch == 1 {
        for i in 0..entries {
            let z = zones[(i % zones.len() as u64) as usize];
            let cid = (1u64 << 48) | (i / zones.len() as u64);
            engine
                .append(z, cid, payload)
                .map_err(|e| format!("append: {e}"))?;
        }
        return Ok(());
    }
    let mut items: Vec<(u64, &[u8])> = Vec::with_capacity(batch);
    let mut i = 0;
    let mut call = 0u64;
    // Each zone's chunks get consecutive IDs of their own (a zone is a range
    // of its owner's IDs), as in the one-by-one case.
    let mut next_in_zone = vec![0u64; zones.len()];
    while i < entries {
        let zi = (call % zones.len() as u64) as usize;
        let z = zones[zi];
        items.clear();
        for _ in 0..batch.min((entries - i) as usize) {
            items.push(((1u64 << 48) | (zi as u64) << 32 | next_in_zone[zi], payload));
            next_in_zone[zi] += 1;
            i += 1;
        }
        engine
            .append_batch(z, &items)
            .map_err(|e| format!("append: {e}"))?;
        call += 1;
    }
    Ok(())
}

/// One append run (part 2) right after its own fio run (at the engine's write
/// parallelism; the baseline's fio figure if this one fails); prints its line.
fn run_append(
    args: &LogArgs,
    baseline: &Baseline,
    entry_bytes: usize,
    batch: usize,
) -> Result<AppendRun, String> {
    let disk_write = baseline.disk_write;
    let storage = fresh_storage(args)?;
    // The neighbouring baseline (see the module docs).
    let jobs = engine_write_parallelism(args.write_threads);
    let fio = fio_write_mb_per_sec(&args.dir, args.baseline_mb, jobs)
        .or_else(|error| baseline.fio_parallel.clone().map_err(|_| error));
    let zones: Vec<ZoneId> = (0..4).map(|z| ZoneId { owner: 1, zone: z }).collect();
    let per_zone_mb = args.append_mb / zones.len() as u64 + 1;
    let engine = LogEngine::open(
        config_for(per_zone_mb, args.write_threads, args.run_chunk_bytes),
        storage.clone(),
    )
    .map_err(|e| e.to_string())?;
    for &z in &zones {
        engine.create_zone(z).map_err(|e| e.to_string())?;
    }
    let entries = ((args.append_mb << 20) / entry_bytes.max(1) as u64).max(1);
    let payload = vec![0x5Au8; entry_bytes];
    let cpu_before = crate::process::cpu_seconds();
    let started = Instant::now();
    append_entries(&engine, &zones, entries, &payload, batch)?;
    let buffered = started.elapsed();
    engine.flush().map_err(|e| format!("flush: {e}"))?;
    let durable = started.elapsed();
    let cpu_s_per_m_entries = (crate::process::cpu_seconds() - cpu_before) / (entries as f64 / 1e6);
    let stats = engine.stats();
    let payload_bytes = entries * entry_bytes as u64;
    let written = stats.secondary_device_bytes_written
        + stats.primary_bytes_written
        + stats.version_log_bytes_written;
    let written_per_payload = written as f64 / payload_bytes as f64;
    let rate = |t: Duration| entries as f64 / t.as_secs_f64().max(1e-9);
    let mb = mb_per_sec(payload_bytes, durable);
    let disk_mb = mb_per_sec(written, durable);
    let run = AppendRun {
        payload_fio_ratio: fio.as_ref().ok().map(|f| mb / f),
        disk_fio_ratio: fio.as_ref().ok().map(|f| disk_mb / f),
        payload_mb: mb,
    };
    let pct = |ratio: Option<f64>| ratio.map_or("?".to_string(), |r| format!("{:.0}%", 100.0 * r));
    emit(
        args.json,
        json!({"bench": "append", "entry_bytes": entry_bytes, "batch": batch, "entries": entries,
               "buffer_entries_per_sec": rate(buffered),
               "buffer_mb_per_sec": mb_per_sec(payload_bytes, buffered),
               "entries_per_sec": rate(durable), "mb_per_sec": mb,
               "disk_mb_per_sec": disk_mb,
               "disk_write_mb_per_sec": disk_write, "fio_mb_per_sec": fio.as_ref().ok(),
               "fio_jobs": jobs,
               "fio_status": fio.as_ref().map_or_else(ToolError::status, |_| "ok"),
               "fio_error": fio.as_ref().err().map(ToString::to_string),
               "payload_fio_ratio": run.payload_fio_ratio,
               "disk_fio_ratio": run.disk_fio_ratio,
               "baseline_ratio": disk_mb / disk_write,
               "version_log_bytes_written": stats.version_log_bytes_written,
               "cpu_s_per_m_entries": cpu_s_per_m_entries,
               "bytes_written_per_payload_byte": written_per_payload}),
        format!(
            "append {entry_bytes:>5} B x {entries} (batch {batch:>2}): into buffer {:.2} M entries/s ({:.0} MB/s); \
             durable {:.2} M entries/s: payload {mb:.0} MB/s = {} of fio x{jobs}; \
             total to disk {disk_mb:.0} MB/s = {:.0}% of baseline, {} of fio x{jobs}{}; \
             {written_per_payload:.2} bytes written per payload byte; \
             {cpu_s_per_m_entries:.3} CPU s per M entries",
            rate(buffered) / 1e6,
            mb_per_sec(payload_bytes, buffered),
            rate(durable) / 1e6,
            pct(run.payload_fio_ratio),
            100.0 * disk_mb / disk_write,
            pct(run.disk_fio_ratio),
            fio.as_ref().err().map_or(String::new(), |e| format!(" ({e})")),
        ),
    );
    drop(engine);
    Ok(run)
}

/// Median, min and max of `values` (None if empty).
fn median_min_max(mut values: Vec<f64>) -> Option<(f64, f64, f64)> {
    values.sort_by(f64::total_cmp);
    Some((
        *values.get(values.len() / 2)?,
        *values.first()?,
        *values.last()?,
    ))
}

/// The summary line of several append runs: median (min..max) of the rate and of the fio
/// ratios (total bytes and payload bytes apart).
fn emit_append_summary(args: &LogArgs, entry_bytes: usize, batch: usize, runs: &[AppendRun]) {
    let ratios = median_min_max(runs.iter().filter_map(|r| r.disk_fio_ratio).collect());
    let payload_ratios = median_min_max(runs.iter().filter_map(|r| r.payload_fio_ratio).collect());
    let rates = median_min_max(runs.iter().map(|r| r.payload_mb).collect());
    let pct = |x: f64| format!("{:.0}%", 100.0 * x);
    let range = |r: Option<(f64, f64, f64)>| {
        r.map_or("? (no fio figure)".into(), |r| {
            format!("{} median ({}..{})", pct(r.0), pct(r.1), pct(r.2))
        })
    };
    emit(
        args.json,
        json!({"bench": "append_summary", "entry_bytes": entry_bytes, "batch": batch,
               "runs": runs.len(),
               "median_fio_ratio": ratios.map(|r| r.0),
               "min_fio_ratio": ratios.map(|r| r.1),
               "max_fio_ratio": ratios.map(|r| r.2),
               "median_payload_fio_ratio": payload_ratios.map(|r| r.0),
               "min_payload_fio_ratio": payload_ratios.map(|r| r.1),
               "max_payload_fio_ratio": payload_ratios.map(|r| r.2),
               "median_mb_per_sec": rates.map(|r| r.0)}),
        format!(
            "summary {entry_bytes:>5} B (batch {batch:>2}), {} runs: payload {} MB/s median; \
             payload / neighbouring fio {}; total to disk / neighbouring fio {}",
            runs.len(),
            rates.map_or("?".into(), |r| format!(
                "{:.0} ({:.0}..{:.0})",
                r.0, r.1, r.2
            )),
            range(payload_ratios),
            range(ratios),
        ),
    );
}

/// Part 3: loads one zone of `--zone-mb` of 64-byte chunks, reopens the engine and reads
/// the zone back.
fn run_recovery_read(args: &LogArgs, baseline: &Baseline) -> Result<(), String> {
    let disk_read = baseline.disk_read;
    let storage = fresh_storage(args)?;
    let config = config_for(args.zone_mb, args.write_threads, args.run_chunk_bytes);
    let zone = ZoneId { owner: 1, zone: 0 };
    let chunks = (args.zone_mb << 20) / 64;
    {
        let engine = LogEngine::open(config.clone(), storage.clone()).map_err(|e| e.to_string())?;
        engine.create_zone(zone).map_err(|e| e.to_string())?;
        let mut payload = [0u8; 64];
        for i in 0..chunks {
            payload[..8].copy_from_slice(&i.to_le_bytes());
            engine
                .append(zone, (1u64 << 48) | i, &payload)
                .map_err(|e| format!("load: {e}"))?;
        }
        engine.shutdown().map_err(|e| e.to_string())?;
    }
    let started = Instant::now();
    let engine = LogEngine::open(config, storage.clone()).map_err(|e| e.to_string())?;
    let reopen = started.elapsed();
    let sum = AtomicU64::new(0);
    let report = engine
        .recover_zone(
            zone,
            &RecoveryOptions {
                threads: args.threads,
                ..RecoveryOptions::default()
            },
            &|batch| {
                let s: u64 = batch.iter().map(|c| u64::from(c.payload[0])).sum();
                sum.fetch_add(s, Ordering::Relaxed);
            },
        )
        .map_err(|e| e.to_string())?;
    let ms = report.total_time.as_secs_f64() * 1e3;
    emit(
        args.json,
        json!({"bench": "recovery_read", "zone_bytes": args.zone_mb << 20, "chunks": report.chunks,
               "expected_chunks": chunks, "threads": args.threads,
               "recovery_ms": ms, "versions_ms": report.versions_time.as_secs_f64() * 1e3,
               "bytes_read": report.bytes_read,
               "read_mb_per_sec": mb_per_sec(report.bytes_read, report.total_time),
               "chunks_per_sec": report.chunks as f64 / report.total_time.as_secs_f64().max(1e-9),
               "reopen_ms": reopen.as_secs_f64() * 1e3,
               "disk_read_mb_per_sec": disk_read}),
        format!(
            "recovery read of a {} MiB zone ({} of {chunks} chunks, {} threads): {ms:.0} ms \
             (versions {:.0} ms), {:.0} MB/s of log read = {:.0}% of baseline read, \
             {:.2} M chunks/s; reopen after restart {:.0} ms",
            args.zone_mb,
            report.chunks,
            args.threads,
            report.versions_time.as_secs_f64() * 1e3,
            mb_per_sec(report.bytes_read, report.total_time),
            100.0 * mb_per_sec(report.bytes_read, report.total_time) / disk_read,
            report.chunks as f64 / report.total_time.as_secs_f64().max(1e-9) / 1e6,
            reopen.as_secs_f64() * 1e3,
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_runs_with_the_engines_write_parallelism() {
        let jobs = engine_write_parallelism(LogConfig::default().write_threads);
        assert_eq!(jobs, LogConfig::default().write_threads.max(1));
        let args = fio_args(Path::new("/tmp/x"), 1024, jobs);
        assert!(args.contains(&format!("--numjobs={jobs}")), "{args:?}");
        assert!(args.contains(&"--group_reporting".to_string()));
        // The same bytes in all as the one-job run.
        assert!(
            args.contains(&format!("--size={}m", 1024 / jobs)),
            "{args:?}"
        );
        assert_eq!(engine_write_parallelism(0), 1);
        assert!(fio_args(Path::new("/tmp/x"), 1024, 1).contains(&"--numjobs=1".to_string()));
    }

    #[test]
    fn fio_json_is_read_and_bad_output_is_a_failure_not_an_absence() {
        let text =
            br#"{"fio version":"fio-3.36","jobs":[{"jobname":"fio-seq","write":{"bw":409600}}]}"#;
        assert_eq!(parse_fio_write_bw(text).expect("parses"), 400.0);
        for bad in [&b"fio: unrecognized option"[..], &br#"{"jobs":[]}"#[..]] {
            let error = parse_fio_write_bw(bad).expect_err("no figure");
            assert_eq!(error.status(), "failed", "{error}");
        }
    }
}
