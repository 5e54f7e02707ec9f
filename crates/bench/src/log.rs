//! `myriad bench log`: the backup-side log engine on this machine's disk.
//!
//! Three parts, each against a baseline measured in the same run:
//! 1. **Disk baseline**: sequential O_DIRECT writes (8 MiB per write, one `fdatasync` at
//!    the end) and reads of a 1 GiB file through the engine's own storage boundary, the
//!    access pattern of fio's `rw=write/read, direct=1, bs=8m`; plus fio itself
//!    (`fio_mb_per_sec`, null when fio is not installed). fio runs again right before
//!    every append run, and each run's ratio is to that neighbouring fio figure: a shared
//!    VM's disk drifts by a third over minutes, so one fio run at the start would make
//!    the ratios of later runs a comparison with another disk.
//! 2. **Append rate** per entry size: one thread appends `--append-mb` of payload
//!    round-robin over 4 zones as fast as it can. "Into the write buffer" is the rate of
//!    the append calls; "to disk" includes the final flush until everything is durable.
//!    Bytes written per payload byte is what the storage layer was handed: entry
//!    headers, primary-log copies of small batches, block headers, page padding, the
//!    partial last page every append rewrites, and the version logs (sealed epochs).
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

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use myriad_backup_log::{
    AlignedBuf, DiskStorage, IoMode, LogConfig, LogEngine, RecoveryOptions, Storage, ZoneId,
};
use serde_json::json;

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
    /// Size of the disk baseline file, in MiB.
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

/// fio's sequential O_DIRECT write bandwidth in MB/s on `dir`, if `fio` is installed.
fn fio_write_mb_per_sec(dir: &std::path::Path, mb: u64) -> Option<f64> {
    let file = dir.join("fio.dat");
    let output = std::process::Command::new("fio")
        .args([
            "--name=seq",
            &format!("--filename={}", file.display()),
            "--rw=write",
            "--bs=8m",
            &format!("--size={mb}m"),
            "--direct=1",
            "--ioengine=psync",
            "--end_fsync=1",
            "--output-format=json",
        ])
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&file);
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
    let kib_per_sec = value["jobs"][0]["write"]["bw"].as_f64()?;
    Some(kib_per_sec / 1024.0)
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
    fio: Option<f64>,
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

/// Part 1: the disk baseline and fio.
fn run_baseline(args: &LogArgs) -> Result<Baseline, String> {
    let storage = fresh_storage(args)?;
    let (disk_write, disk_read, disk_synced, direct) =
        disk_baseline(storage.as_ref(), args.baseline_mb)?;
    let fio = fio_write_mb_per_sec(&args.dir, args.baseline_mb);
    emit(
        args.json,
        json!({"baseline": "sequential_8mib", "direct": direct,
               "disk_write_mb_per_sec": disk_write, "disk_read_mb_per_sec": disk_read,
               "disk_synced_write_mb_per_sec": disk_synced, "fio_mb_per_sec": fio}),
        format!(
            "disk baseline (sequential 8 MiB {}): write {disk_write:.0} MB/s, read {disk_read:.0} MB/s, \
             2 MiB writes each synced {disk_synced:.0} MB/s; fio write {}",
            if direct { "O_DIRECT" } else { "buffered" },
            fio.map_or("not installed".to_string(), |f| format!("{f:.0} MB/s"))
        ),
    );
    Ok(Baseline {
        disk_write,
        disk_read,
        fio,
    })
}

/// Part 2 for one entry size and batch size: `--repeat` runs, then a summary line if
/// there was more than one.
fn run_append_series(
    args: &LogArgs,
    baseline: &Baseline,
    entry_bytes: usize,
    batch: usize,
) -> Result<(), String> {
    // Per run: (ratio of the disk bytes' rate to the neighbouring fio, payload MB/s).
    let mut runs: Vec<(Option<f64>, f64)> = Vec::new();
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

/// One append run (part 2) right after its own fio run; prints its line and returns (ratio
/// of the disk bytes' rate to the neighbouring fio, payload MB/s).
fn run_append(
    args: &LogArgs,
    baseline: &Baseline,
    entry_bytes: usize,
    batch: usize,
) -> Result<(Option<f64>, f64), String> {
    let disk_write = baseline.disk_write;
    let storage = fresh_storage(args)?;
    // The neighbouring baseline (see the module docs).
    let fio = fio_write_mb_per_sec(&args.dir, args.baseline_mb).or(baseline.fio);
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
    emit(
        args.json,
        json!({"bench": "append", "entry_bytes": entry_bytes, "batch": batch, "entries": entries,
               "buffer_entries_per_sec": rate(buffered),
               "buffer_mb_per_sec": mb_per_sec(payload_bytes, buffered),
               "entries_per_sec": rate(durable), "mb_per_sec": mb,
               "disk_mb_per_sec": mb_per_sec(written, durable),
               "disk_write_mb_per_sec": disk_write, "fio_mb_per_sec": fio,
               "baseline_ratio": mb_per_sec(written, durable) / disk_write,
               "version_log_bytes_written": stats.version_log_bytes_written,
               "cpu_s_per_m_entries": cpu_s_per_m_entries,
               "bytes_written_per_payload_byte": written_per_payload}),
        format!(
            "append {entry_bytes:>5} B x {entries} (batch {batch:>2}): into buffer {:.2} M entries/s ({:.0} MB/s); \
             durable {:.2} M entries/s ({mb:.0} MB/s payload, {:.0} MB/s to disk = {:.0}% of baseline{}); \
             {written_per_payload:.2} bytes written per payload byte; \
             {cpu_s_per_m_entries:.3} CPU s per M entries",
            rate(buffered) / 1e6,
            mb_per_sec(payload_bytes, buffered),
            rate(durable) / 1e6,
            mb_per_sec(written, durable),
            100.0 * mb_per_sec(written, durable) / disk_write,
            fio.map_or(String::new(), |f| format!(", {:.0}% of fio", 100.0 * mb_per_sec(written, durable) / f)),
        ),
    );
    let run = (fio.map(|f| mb_per_sec(written, durable) / f), mb);
    drop(engine);
    Ok(run)
}

/// The summary line of several append runs: median (min..max) of the rate and fio ratio.
fn emit_append_summary(
    args: &LogArgs,
    entry_bytes: usize,
    batch: usize,
    runs: &[(Option<f64>, f64)],
) {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        Some((*v.get(v.len() / 2)?, *v.first()?, *v.last()?))
    };
    let ratios = median(runs.iter().filter_map(|r| r.0).collect());
    let rates = median(runs.iter().map(|r| r.1).collect());
    let pct = |x: f64| format!("{:.0}%", 100.0 * x);
    emit(
        args.json,
        json!({"bench": "append_summary", "entry_bytes": entry_bytes, "batch": batch,
               "runs": runs.len(),
               "median_fio_ratio": ratios.map(|r| r.0),
               "min_fio_ratio": ratios.map(|r| r.1),
               "max_fio_ratio": ratios.map(|r| r.2),
               "median_mb_per_sec": rates.map(|r| r.0)}),
        format!(
            "summary {entry_bytes:>5} B (batch {batch:>2}), {} runs: payload {} MB/s median; \
             to disk / neighbouring fio {}",
            runs.len(),
            rates.map_or("?".into(), |r| format!(
                "{:.0} ({:.0}..{:.0})",
                r.0, r.1, r.2
            )),
            ratios.map_or("? (fio not installed)".into(), |r| format!(
                "{} median ({}..{})",
                pct(r.0),
                pct(r.1),
                pct(r.2)
            )),
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
