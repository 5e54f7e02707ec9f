//! `myriad bench recovery`: a failed peer's data back in a local cluster (issue 6).
//!
//! The run, all on this machine with real node processes on 127.0.0.1:
//! 1. A local cluster ([`LocalCluster`]): one superpeer, one master peer and `--backups`
//!    backup peers, `--replication` backups per zone, zones of `--zone-mb`, the cluster's
//!    default failure detection unless `--heartbeat-ms`/`--failure-timeout-ms` say otherwise.
//! 2. **Load**: `--data-mb` of `--chunk-bytes` chunks created on the master through the
//!    client (`async` replication, `--load-threads` clients), each payload carrying its
//!    index; then one `replicated` put per 64 Ki chunks, so that every zone's backups hold
//!    every earlier change (the streams to a backup are ordered) before the kill.
//! 3. **Probe**: `--probe-threads` client threads get random chunks one at a time for the
//!    whole run (operation timeout 60 s, so an access to a chunk being recovered waits);
//!    every operation is put in the 100 ms bucket in which it ended (count, errors,
//!    maximum latency).
//! 4. **Kill**: after `--before-ms` of probing, the master is SIGKILLed (`--failure kill`: its
//!    sockets close, so the others notice at once) or SIGSTOPped (`--failure stop`: a dead
//!    or cut-off machine, noticed only by missing heartbeats). Measured from the
//!    kill: *detect* (the probe client receives the `NodeFailed` event), *available* (the
//!    superpeer leader's recovery table shows every zone of the master restored, ownership
//!    committed), *readable* (every chunk of the master read by a client once since the
//!    kill: `--sweep-threads` client threads, connected before the kill, read all of the
//!    master's CIDs in batched gets from the moment of the kill, a get waiting up to 60 s
//!    for its chunk, and read again whatever failed until every chunk was read with its
//!    own payload; a sweep of all chunks takes time even when nothing waits, so the
//!    verify time below is printed next to it), *re-replicated* (every restorer's
//!    `rereplication_pending` is 0: each recovered chunk handed to the restorer's own
//!    replication).
//! 5. **Verify**: every chunk read back (batched) and compared; a missing or wrong chunk is
//!    an error of the run, reported, never hidden in a figure.
//! 6. The per-100 ms series is written as CSV (`--csv`) and drawn as a PNG (`--png`).
//!
//! Issue 6's target: kill to available ≤ 2 s with detection included (DXRAM: 1–2 s for a
//! peer's data with many more machines). The table's *available* is a flag in the
//! leader's state; *readable* is what a client sees (issue 17): both are printed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::chunk::ChunkOptions;
use myriad_client::client::{Client, ClientConfig};
use myriad_client::ClientError;
use myriad_launcher::{LaunchSpec, LocalCluster};
use myriad_proto::meta::Event;
use myriad_proto::recovery::RecoveryState;
use myriad_types::{ChunkId, NodeId};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::report::emit;

/// Command-line arguments of `myriad bench recovery`.
#[derive(clap::Args, Debug, Clone)]
pub struct RecoveryArgs {
    /// Directory of the cluster (data, logs); deleted at the end unless `--keep`.
    #[arg(long, default_value = "run/bench-recovery")]
    pub dir: PathBuf,
    /// Payload loaded on the master, in MiB.
    #[arg(long, default_value_t = 2048)]
    pub data_mb: u64,
    /// Size of every chunk, in bytes (16..=1024).
    #[arg(long, default_value_t = 64)]
    pub chunk_bytes: usize,
    /// Backup peers besides the master.
    #[arg(long, default_value_t = 4)]
    pub backups: usize,
    /// Backups per zone (R).
    #[arg(long, default_value_t = 3)]
    pub replication: usize,
    /// Payload per backup zone, in MiB.
    #[arg(long, default_value_t = 256)]
    pub zone_mb: u64,
    /// Heartbeat interval of the failure detector (0: the cluster default).
    #[arg(long, default_value_t = 0)]
    pub heartbeat_ms: u64,
    /// Silence after which a node is declared failed (0: the cluster default).
    #[arg(long, default_value_t = 0)]
    pub failure_timeout_ms: u64,
    /// Client threads loading the chunks.
    #[arg(long, default_value_t = 2)]
    pub load_threads: usize,
    /// Client threads getting random chunks during the whole run.
    #[arg(long, default_value_t = 1)]
    pub probe_threads: usize,
    /// Client threads reading every chunk of the master from the kill on, until each was
    /// read once (the *readable* moment).
    #[arg(long, default_value_t = 1)]
    pub sweep_threads: usize,
    /// Probing before the kill, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub before_ms: u64,
    /// Most seconds to wait for availability and for re-replication, each.
    #[arg(long, default_value_t = 120)]
    pub wait_s: u64,
    /// The per-100 ms series as CSV.
    #[arg(long, default_value = "run/bench-recovery.csv")]
    pub csv: PathBuf,
    /// The per-100 ms series drawn as a PNG.
    #[arg(long, default_value = "run/bench-recovery.png")]
    pub png: PathBuf,
    /// How the master fails: `kill` (SIGKILL: its sockets are closed by the kernel, so the
    /// other nodes notice at once, as when a process dies) or `stop` (SIGSTOP: its sockets
    /// stay open and only the missing heartbeats reveal it, as when a machine dies or is cut
    /// off; SIGKILLed once declared failed).
    #[arg(long, default_value = "kill", value_parser = ["kill", "stop"])]
    pub failure: String,
    /// Keep the cluster directory (logs of every node) afterwards.
    #[arg(long)]
    pub keep: bool,
    /// MiB of chunk memory every peer keeps resident ahead of use (`peer.prefault_mb`),
    /// so that restored chunks land in pages the OS zeroed before the kill; 0: none;
    /// unset: the peers' default (two zones, at most a quarter of their memory).
    #[arg(long)]
    pub prefault_mb: Option<u64>,
    /// Print JSON lines instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Width of one bucket of the probe series.
const BUCKET: Duration = Duration::from_millis(100);
/// Chunks per create request while loading.
const LOAD_BATCH: usize = 2_000;
/// Chunks per get request while verifying.
const VERIFY_BATCH: usize = 2_000;
/// Attempts of the `replicated` puts before the kill.
const SYNC_ATTEMPTS: u32 = 5;
/// Every this many chunks one `replicated` put before the kill.
const SYNC_STRIDE: usize = 65_536;

/// Chunk `index`'s payload: the index, then a filler derived from it.
fn payload(index: u64, bytes: usize) -> Bytes {
    let mut data = vec![(index % 251) as u8; bytes];
    data[..8].copy_from_slice(&index.to_le_bytes());
    Bytes::from(data)
}

/// One 100 ms bucket of the probe series.
#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    ops: u64,
    errors: u64,
    max_latency_us: u64,
}

/// What the probe threads recorded, by bucket since the probe started.
#[derive(Debug, Default)]
struct Series {
    buckets: Vec<Bucket>,
    /// Reads that returned a payload other than the chunk's own.
    wrong: u64,
    first_error: Option<String>,
}

impl Series {
    fn record(&mut self, at: Duration, latency: Duration, ok: bool) {
        let index = (at.as_millis() / BUCKET.as_millis()) as usize;
        if self.buckets.len() <= index {
            self.buckets.resize(index + 1, Bucket::default());
        }
        let bucket = &mut self.buckets[index];
        bucket.ops += 1;
        if !ok {
            bucket.errors += 1;
        }
        bucket.max_latency_us = bucket.max_latency_us.max(latency.as_micros() as u64);
    }
}

fn config_text(args: &RecoveryArgs) -> String {
    let mut text = String::new();
    if args.heartbeat_ms > 0 || args.failure_timeout_ms > 0 {
        text.push_str("[failure]\n");
        if args.heartbeat_ms > 0 {
            text.push_str(&format!("heartbeat_interval_ms = {}\n", args.heartbeat_ms));
        }
        if args.failure_timeout_ms > 0 {
            text.push_str(&format!(
                "failure_timeout_ms = {}\n",
                args.failure_timeout_ms
            ));
        }
        text.push('\n');
    }
    text.push_str(&format!(
        "[backup]\nreplication = {}\nzone_mb = {}\ndurability = \"async\"\n",
        args.replication, args.zone_mb
    ));
    if args.zone_mb < 64 {
        // Small zones (quick runs) need segments small enough for a log of 2 × zone_mb.
        text.push_str(&format!(
            "segment_kb = {}\n",
            (args.zone_mb * 1024 / 8).max(64)
        ));
    }
    text
}

fn check(args: &RecoveryArgs) -> Result<(), String> {
    if !(16..=1024).contains(&args.chunk_bytes) {
        return Err("--chunk-bytes must be between 16 and 1024".into());
    }
    if args.replication == 0 || args.replication > args.backups {
        return Err(format!(
            "--replication must be between 1 and --backups ({})",
            args.backups
        ));
    }
    if args.data_mb == 0 || args.zone_mb == 0 || args.load_threads == 0 || args.sweep_threads == 0 {
        return Err(
            "--data-mb, --zone-mb, --load-threads and --sweep-threads must be positive".into(),
        );
    }
    Ok(())
}

/// Runs the benchmark; `binary` is the `myriad` executable that runs the nodes.
pub fn run(args: &RecoveryArgs, binary: &Path) -> Result<(), String> {
    check(args)?;
    let _ = std::fs::remove_dir_all(&args.dir);
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let result = run_in(args, binary);
    if !args.keep {
        let _ = std::fs::remove_dir_all(&args.dir);
    }
    result
}

/// The zones of the master: zone number and its backups (the first is the restorer).
type ZoneTable = Vec<(u32, Vec<NodeId>)>;

/// The cluster's superpeers and their addresses.
type Superpeers = Vec<(NodeId, std::net::SocketAddr)>;

/// A client to the cluster's superpeers with an operation timeout and a durability.
type Connect = dyn Fn(Duration, u8) -> Result<Client, String> + Sync;

fn run_in(args: &RecoveryArgs, binary: &Path) -> Result<(), String> {
    let (mut cluster, superpeers, master) = start_cluster(args, binary)?;
    let secret = cluster
        .secret()
        .map_err(|e| format!("cluster secret: {e}"))?;
    let connect = move |timeout: Duration, durability: u8| {
        let mut config = ClientConfig::new(superpeers.clone());
        config.join.secret = secret.clone();
        config.chunks = ChunkOptions {
            timeout,
            durability,
            ..ChunkOptions::default()
        };
        Client::connect_with(config).map_err(|e| format!("client: {e}"))
    };
    let (cids, zones) = load_phase(args, &connect, master)?;

    // ----- probe, kill, wait ---------------------------------------------------------------
    let cids = Arc::new(cids);
    let probing = Probing::start(args, &connect, master, &cids)?;
    let sweepers = (0..args.sweep_threads)
        .map(|_| connect(Duration::from_secs(60), 0))
        .collect::<Result<Vec<Client>, String>>()?;
    std::thread::sleep(Duration::from_millis(args.before_ms));
    let killed = kill_master(args, &mut cluster, master)?;
    let sweep = Sweep::start(args, sweepers, &cids, killed);
    let recovered = wait_recovered(args, &probing.client, master, zones.len(), killed);
    if args.failure == "stop" {
        // Declared failed (or given up on): now it may die for real.
        cluster
            .kill(master.0)
            .map_err(|e| format!("killing the stopped master: {e}"))?;
    }
    let available = recovered.available.ok_or_else(|| {
        format!(
            "the master's zones were not all recovered within {} s",
            args.wait_s
        )
    })?;
    let rereplicated = wait_rereplicated(args, &probing.client, &recovered.restorers, killed);
    let swept = sweep.finish();

    // ----- verify --------------------------------------------------------------------------
    let verify_started = Instant::now();
    let (ok, wrong, first_wrong) = verify(args, &connect, &cids)?;
    let verify_time = verify_started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let (series, detected, probe_start) = probing.finish();
    drop(cluster);

    // ----- report --------------------------------------------------------------------------
    let times = Times {
        probe_start,
        killed,
        detected,
        available,
        readable: swept.readable,
        rereplicated,
    };
    let verified = Verified {
        ok,
        wrong,
        first_wrong,
        time: verify_time,
    };
    let lost = recovered.lost;
    report_sweep(args, &swept, killed);
    report(
        args,
        &series,
        &times,
        &recovered,
        zones.len(),
        cids.len(),
        &verified,
    )?;
    if wrong > 0 || series.wrong > 0 || lost > 0 || swept.wrong > 0 {
        return Err(format!(
            "data lost or wrong: {wrong} chunks at verification, {} probe reads, {} sweep \
             reads, {lost} zones lost",
            series.wrong, swept.wrong
        ));
    }
    Ok(())
}

/// Writes the node config and starts the cluster; returns it, its superpeers and the
/// master (the first peer).
fn start_cluster(
    args: &RecoveryArgs,
    binary: &Path,
) -> Result<(LocalCluster, Superpeers, NodeId), String> {
    let config = args.dir.join("bench-recovery.toml");
    std::fs::write(&config, config_text(args)).map_err(|e| format!("config: {e}"))?;
    // Memory regions are reserved, not committed: size every peer for the whole data set
    // (a restorer may receive several zones).
    let memory_mb = args.data_mb * 2 + 512;
    let mut spec = LaunchSpec::new(args.dir.join("cluster"), binary);
    spec.superpeers = 1;
    spec.peers = 1 + args.backups;
    spec.peer_memory_mb = Some(memory_mb);
    spec.peer_prefault_mb = args.prefault_mb;
    spec.extra_args = vec!["--config".into(), config.display().to_string()];
    spec.ready_timeout = Duration::from_secs(60);
    let cluster = LocalCluster::start_owned(spec).map_err(|e| format!("cluster: {e}"))?;
    let superpeers: Superpeers = cluster.superpeers();
    let peers: Vec<NodeId> = cluster.peer_ids();
    let master = *peers.first().ok_or("the cluster has no peer")?;
    emit(
        args.json,
        json!({"phase": "cluster", "superpeers": superpeers.len(), "peers": peers.len(),
               "master": master.to_string(), "replication": args.replication,
               "zone_mb": args.zone_mb, "prefault_mb": args.prefault_mb}),
        format!(
            "cluster: 1 superpeer, master {master}, {} backups, R = {}, zones of {} MiB, \
             memory kept resident ahead per peer (MiB): {}",
            args.backups,
            args.replication,
            args.zone_mb,
            args.prefault_mb
                .map_or_else(|| "the default".to_owned(), |mb| mb.to_string())
        ),
    );
    Ok((cluster, superpeers, master))
}

/// Loads the chunks, makes them replicated and reads the master's zone table; prints
/// the load line.
fn load_phase(
    args: &RecoveryArgs,
    connect: &Connect,
    master: NodeId,
) -> Result<(Vec<ChunkId>, ZoneTable), String> {
    let chunks = ((args.data_mb << 20) / args.chunk_bytes as u64) as usize;
    let started = Instant::now();
    let cids = load(args, connect, master, chunks)?;
    let load_time = started.elapsed();
    sync_before_kill(args, connect, &cids, chunks)?;
    let zones = {
        let client = connect(Duration::from_secs(10), 0)?;
        let zones = client.blocking().zones(master);
        client.shutdown();
        zones.map_err(|e| format!("zone table: {e}"))?
    };
    emit(
        args.json,
        json!({"phase": "load", "chunks": chunks, "chunk_bytes": args.chunk_bytes,
               "payload_bytes": chunks as u64 * args.chunk_bytes as u64,
               "seconds": load_time.as_secs_f64(),
               "chunks_per_sec": chunks as f64 / load_time.as_secs_f64().max(1e-9),
               "zones": zones.len(),
               "zone_backups": zones.iter().map(|(zone, backups)| json!({"zone": zone,
                   "backups": backups.iter().map(ToString::to_string).collect::<Vec<_>>()}))
                   .collect::<Vec<_>>()}),
        format!(
            "loaded {chunks} chunks ({} MiB) in {:.1} s ({:.0} k chunks/s); the master has {} \
             zones, backups (first = restorer): {}",
            args.data_mb,
            load_time.as_secs_f64(),
            chunks as f64 / load_time.as_secs_f64().max(1e-9) / 1e3,
            zones.len(),
            zones
                .iter()
                .map(|(zone, backups)| format!(
                    "{zone}: [{}]",
                    backups
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(" ")
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    Ok((cids, zones))
}

/// One `replicated` put per [`SYNC_STRIDE`] chunks, so that every zone's backups hold
/// every earlier change before the kill.
fn sync_before_kill(
    args: &RecoveryArgs,
    connect: &Connect,
    cids: &[ChunkId],
    chunks: usize,
) -> Result<(), String> {
    let sync_client = connect(Duration::from_secs(30), 2)?;
    let syncs: Vec<(ChunkId, Bytes)> = (0..chunks)
        .step_by(SYNC_STRIDE)
        .map(|i| (cids[i], payload(i as u64, args.chunk_bytes)))
        .collect();
    // A `replicated` put fails when one of its zone's backups is replaced while it waits
    // (the replacement then receives the zone anew): try again a few times.
    let mut attempt = 1;
    loop {
        let failed: Vec<String> = sync_client
            .blocking()
            .chunks()
            .put_batch(&syncs)
            .into_iter()
            .filter_map(|result| result.err().map(|e| e.to_string()))
            .collect();
        match failed.first() {
            None => break,
            Some(error) if attempt >= SYNC_ATTEMPTS => {
                return Err(format!(
                    "replicated put before the kill ({} failed in attempt {attempt}): {error}",
                    failed.len()
                ));
            }
            Some(error) => {
                eprintln!("replicated put before the kill failed, trying again: {error}");
                attempt += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    sync_client.shutdown();
    Ok(())
}

/// The probe threads and the watcher of the master's `NodeFailed` event.
struct Probing {
    client: Client,
    detected: Arc<Mutex<Option<Instant>>>,
    series: Arc<Mutex<Series>>,
    stop: Arc<AtomicBool>,
    start: Instant,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Probing {
    /// Starts watching for the master's failure and `--probe-threads` probe threads.
    fn start(
        args: &RecoveryArgs,
        connect: &Connect,
        master: NodeId,
        cids: &Arc<Vec<ChunkId>>,
    ) -> Result<Probing, String> {
        let probe_client = connect(Duration::from_secs(60), 0)?;
        let detected: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
        {
            let mut events = probe_client.membership().subscribe();
            let detected = Arc::clone(&detected);
            probe_client.membership().net().runtime().spawn(async move {
                while let Ok(event) = events.recv().await {
                    if matches!(event, Event::NodeFailed(node) if node == master) {
                        *detected.lock() = Some(Instant::now());
                        break;
                    }
                }
            });
        }
        let series = Arc::new(Mutex::new(Series::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let probe_start = Instant::now();
        let threads: Vec<_> = (0..args.probe_threads)
            .map(|thread| {
                let client = probe_client.clone();
                let cids = Arc::clone(cids);
                let series = Arc::clone(&series);
                let stop = Arc::clone(&stop);
                let bytes = args.chunk_bytes;
                std::thread::spawn(move || {
                    probe(thread, &client, &cids, bytes, &series, &stop, probe_start)
                })
            })
            .collect();
        Ok(Probing {
            client: probe_client,
            detected,
            series,
            stop,
            start: probe_start,
            threads,
        })
    }

    /// Stops the probes; returns their series, when the failure was detected and when
    /// probing started.
    fn finish(self) -> (Series, Option<Instant>, Instant) {
        self.stop.store(true, Ordering::Relaxed);
        for probe in self.threads {
            let _ = probe.join();
        }
        self.client.shutdown();
        let series = std::mem::take(&mut *self.series.lock());
        let detected = *self.detected.lock();
        (series, detected, self.start)
    }
}

/// Kills (or stops, with `--failure stop`) the master; returns when.
fn kill_master(
    args: &RecoveryArgs,
    cluster: &mut LocalCluster,
    master: NodeId,
) -> Result<Instant, String> {
    let master_pid = cluster
        .nodes()
        .iter()
        .find(|node| node.node_id == master.0)
        .map(|node| node.pid)
        .ok_or("the master is not in the cluster file")?;
    let killed = Instant::now();
    if args.failure == "stop" {
        signal(master_pid, "STOP")?;
    } else {
        cluster
            .kill(master.0)
            .map_err(|e| format!("killing the master: {e}"))?;
    }
    Ok(killed)
}

/// What the recovery table showed once every zone of the master had settled.
#[derive(Default)]
struct Recovered {
    /// When every zone had settled (none if not within `--wait-s`).
    available: Option<Instant>,
    restorers: Vec<NodeId>,
    zone_lines: Vec<serde_json::Value>,
    /// Zones whose recovery failed.
    lost: usize,
}

/// Polls the recovery table until every one of the master's `zones` zones is done or
/// failed, for at most `--wait-s` after the kill.
fn wait_recovered(
    args: &RecoveryArgs,
    client: &Client,
    master: NodeId,
    zones: usize,
    killed: Instant,
) -> Recovered {
    let wait = Duration::from_secs(args.wait_s);
    let status = client.blocking();
    while killed.elapsed() < wait {
        if let Ok(table) = status.recovery_status() {
            let mine: Vec<_> = table.zones.iter().filter(|z| z.owner == master).collect();
            let settled = mine.len() >= zones
                && mine
                    .iter()
                    .all(|z| matches!(z.state, RecoveryState::Done | RecoveryState::Failed));
            if settled {
                let available = Some(Instant::now());
                let lost = mine
                    .iter()
                    .filter(|z| z.state == RecoveryState::Failed)
                    .count();
                let mut restorers: Vec<NodeId> = mine.iter().filter_map(|z| z.restorer).collect();
                restorers.sort_unstable();
                restorers.dedup();
                let zone_lines = mine
                    .iter()
                    .map(|z| {
                        json!({"zone": z.zone, "state": format!("{:?}", z.state).to_lowercase(),
                               "restorer": z.restorer.map(|r| r.to_string()),
                               "chunks": z.chunks, "ms_since_verdict": z.ms})
                    })
                    .collect();
                return Recovered {
                    available,
                    restorers,
                    zone_lines,
                    lost,
                };
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Recovered::default()
}

/// Polls the restorers until none has re-replication pending, for at most twice
/// `--wait-s` after the kill; returns when.
fn wait_rereplicated(
    args: &RecoveryArgs,
    client: &Client,
    restorers: &[NodeId],
    killed: Instant,
) -> Option<Instant> {
    let wait = Duration::from_secs(args.wait_s);
    let status = client.blocking();
    'wait: while killed.elapsed() < wait * 2 {
        let mut pending = 0u64;
        for &restorer in restorers {
            match status.chunks().stats(restorer) {
                Ok(stats) => pending += stats.rereplication_pending,
                Err(_) => continue 'wait,
            }
        }
        if pending == 0 {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The moments of the run, for the summary.
struct Times {
    probe_start: Instant,
    killed: Instant,
    detected: Option<Instant>,
    available: Instant,
    /// When every chunk had been read once since the kill.
    readable: Option<Instant>,
    rereplicated: Option<Instant>,
}

/// What the verification read back.
struct Verified {
    ok: u64,
    wrong: u64,
    first_wrong: Option<String>,
    time: Duration,
}

/// Writes the series (CSV, PNG) and prints the zones, verify and summary lines.
fn report(
    args: &RecoveryArgs,
    series: &Series,
    times: &Times,
    recovered: &Recovered,
    zones: usize,
    chunks: usize,
    verified: &Verified,
) -> Result<(), String> {
    let lost = recovered.lost;
    let (ok, wrong, first_wrong, verify_time) = (
        verified.ok,
        verified.wrong,
        &verified.first_wrong,
        verified.time,
    );
    let killed = times.killed;
    let since_kill = |at: Instant| at.saturating_duration_since(killed).as_secs_f64() * 1e3;
    let (detected, available, rereplicated) = (times.detected, times.available, times.rereplicated);
    let readable = times.readable;
    let kill_offset = killed.saturating_duration_since(times.probe_start);
    write_csv(&args.csv, series, kill_offset)?;
    let marks = Marks {
        available_ms: since_kill(available),
        readable_ms: readable.map(since_kill),
    };
    let plotted = draw_png(&args.png, series, kill_offset, &marks);
    let after_kill: Vec<&Bucket> = series
        .buckets
        .iter()
        .skip((kill_offset.as_millis() / BUCKET.as_millis()) as usize)
        .collect();
    let client_max_latency_ms = after_kill
        .iter()
        .map(|bucket| bucket.max_latency_us)
        .max()
        .unwrap_or(0) as f64
        / 1e3;
    let before: Vec<&Bucket> = series
        .buckets
        .iter()
        .take((kill_offset.as_millis() / BUCKET.as_millis()) as usize)
        .skip(2)
        .collect();
    let ops_before = before.iter().map(|b| b.ops).sum::<u64>() as f64
        / (before.len().max(1) as f64 * BUCKET.as_secs_f64());
    let probe_errors: u64 = series.buckets.iter().map(|b| b.errors).sum();
    emit(
        args.json,
        json!({"phase": "zones", "zones": recovered.zone_lines}),
        format!(
            "zones: {}",
            serde_json::Value::Array(recovered.zone_lines.clone())
        ),
    );
    emit(
        args.json,
        json!({"phase": "verify", "chunks": chunks, "ok": ok, "wrong_or_missing": wrong,
               "first_wrong": first_wrong, "seconds": verify_time.as_secs_f64()}),
        format!(
            "verify: {ok} of {} chunks read back with their values, {wrong} wrong or missing{} ({:.1} s)",
            chunks,
            first_wrong
                .as_deref()
                .map(|w| format!(", e.g. {w}"))
                .unwrap_or_default(),
            verify_time.as_secs_f64()
        ),
    );
    let summary = json!({
        "bench": "recovery", "data_bytes": args.data_mb << 20, "chunk_bytes": args.chunk_bytes,
        "chunks": chunks, "zones": zones, "zones_lost": lost,
        "backups": args.backups, "replication": args.replication, "failure": args.failure,
        "prefault_mb": args.prefault_mb,
        "detect_ms": detected.map(since_kill),
        "available_ms": since_kill(available),
        "readable_ms": readable.map(since_kill),
        "sweep_threads": args.sweep_threads,
        "verify_sweep_ms": verify_time.as_secs_f64() * 1e3,
        "rereplicated_ms": rereplicated.map(since_kill),
        "client_max_latency_ms": client_max_latency_ms,
        "probe_ops_per_sec_before": ops_before,
        "probe_errors": probe_errors, "probe_wrong_values": series.wrong,
        "probe_first_error": series.first_error,
        "verify_wrong_or_missing": wrong,
        "target_available_ms": 2000,
        "ratio_to_target": since_kill(available) / 2000.0,
        "csv": args.csv.display().to_string(),
        "png": plotted.as_ref().ok().map(|()| args.png.display().to_string()),
    });
    let text = format!(
        "kill -> detected {} ms, -> available (leader's table) {:.0} ms (target 2000 ms: \
         {:.2}x), -> readable (every chunk read by a client) {} ms (sweep threads: {}; a \
         full sweep after recovery took {:.0} ms), -> re-replicated {} ms; probe: {:.0} gets/s \
         before the kill, max latency after it {client_max_latency_ms:.0} ms, {probe_errors} \
         errors, {} wrong values; series in {} and {}",
        detected.map_or("?".into(), |d| format!("{:.0}", since_kill(d))),
        since_kill(available),
        since_kill(available) / 2000.0,
        readable.map_or(format!("? (not within {} s)", args.wait_s), |r| format!(
            "{:.0}",
            since_kill(r)
        )),
        args.sweep_threads,
        verify_time.as_secs_f64() * 1e3,
        rereplicated.map_or("?".into(), |r| format!("{:.0}", since_kill(r))),
        ops_before,
        series.wrong,
        args.csv.display(),
        match &plotted {
            Ok(()) => args.png.display().to_string(),
            Err(error) => format!("no PNG ({error})"),
        }
    );
    emit(args.json, summary, text);
    Ok(())
}

/// Sends `kill -<name>` to process `pid`.
fn signal(pid: u32, name: &str) -> Result<(), String> {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("kill -{name} {pid}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{name} {pid} failed: {status}"))
    }
}

/// Creates the chunks on `master` from `args.load_threads` clients; the CID of chunk `i`
/// is at index `i`.
fn load(
    args: &RecoveryArgs,
    connect: &(dyn Fn(Duration, u8) -> Result<Client, String> + Sync),
    master: NodeId,
    chunks: usize,
) -> Result<Vec<ChunkId>, String> {
    let per_thread = chunks.div_ceil(args.load_threads);
    let progress = std::sync::atomic::AtomicUsize::new(0);
    let parts: Vec<Result<Vec<ChunkId>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..args.load_threads)
            .map(|thread| {
                let progress = &progress;
                scope.spawn(move || {
                    let client = connect(Duration::from_secs(30), 0)?;
                    let api = client.blocking();
                    let first = thread * per_thread;
                    let end = (first + per_thread).min(chunks);
                    let mut cids = Vec::with_capacity(end.saturating_sub(first));
                    let mut index = first;
                    while index < end {
                        let last = (index + LOAD_BATCH).min(end);
                        let data: Vec<Bytes> = (index..last)
                            .map(|i| payload(i as u64, args.chunk_bytes))
                            .collect();
                        let created = api
                            .chunks()
                            .create_with_data(master, data)
                            .map_err(|e| format!("create: {e}"))?;
                        cids.extend(created);
                        let done =
                            progress.fetch_add(last - index, Ordering::Relaxed) + (last - index);
                        if !args.json && done % (LOAD_BATCH * 500) < last - index {
                            eprintln!("  loaded {done} of {chunks}");
                        }
                        index = last;
                    }
                    client.shutdown();
                    Ok(cids)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err("a load thread panicked".into()))
            })
            .collect()
    });
    let mut cids = Vec::with_capacity(chunks);
    for part in parts {
        cids.extend(part?);
    }
    if cids.len() != chunks {
        return Err(format!("created {} chunks, wanted {chunks}", cids.len()));
    }
    Ok(cids)
}

/// One probe operation: when it ended (since the probe started), its latency, whether it
/// returned the chunk's own payload, whether it returned another payload, its error.
struct Sample {
    at: Duration,
    latency: Duration,
    ok: bool,
    wrong: bool,
    error: Option<String>,
}

/// One probe thread: random single gets until `stop`.
fn probe(
    thread: usize,
    client: &Client,
    cids: &[ChunkId],
    bytes: usize,
    series: &Mutex<Series>,
    stop: &AtomicBool,
    start: Instant,
) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed + thread as u64);
    let api = client.blocking();
    let mut local: Vec<Sample> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let index = rng.gen_range(0..cids.len());
        let began = Instant::now();
        let result = api.chunks().get(cids[index]);
        let ended = Instant::now();
        let (ok, wrong, error) = match result {
            Ok(data) => {
                let right = data == payload(index as u64, bytes);
                (right, !right, None)
            }
            Err(error @ ClientError::Shutdown) => {
                local.push(Sample {
                    at: ended - start,
                    latency: ended - began,
                    ok: false,
                    wrong: false,
                    error: Some(error.to_string()),
                });
                break;
            }
            Err(error) => (false, false, Some(error.to_string())),
        };
        local.push(Sample {
            at: ended - start,
            latency: ended - began,
            ok,
            wrong,
            error,
        });
        if local.len() >= 1024 {
            flush(series, &mut local);
        }
    }
    flush(series, &mut local);
}

fn flush(series: &Mutex<Series>, local: &mut Vec<Sample>) {
    let mut series = series.lock();
    for sample in local.drain(..) {
        series.record(sample.at, sample.latency, sample.ok);
        if sample.wrong {
            series.wrong += 1;
        }
        if series.first_error.is_none() {
            series.first_error = sample.error;
        }
    }
}

/// The sweep threads reading every chunk of the master from the kill on.
struct Sweep {
    threads: Vec<std::thread::JoinHandle<SweepPart>>,
}

/// What one sweep thread (or, summed, all of them) saw.
#[derive(Debug, Default)]
struct SweepPart {
    /// When its last chunk was read (all of them: the latest); none if some chunk was
    /// not read within `--wait-s` of the kill.
    readable: Option<Instant>,
    /// Gets that failed and were tried again.
    retried: u64,
    /// Chunks read with a payload other than their own (not tried again).
    wrong: u64,
    /// Passes over the chunks not read yet (the most of any thread).
    passes: u32,
    first_error: Option<String>,
}

impl Sweep {
    /// Starts one thread per client in `clients` (connected before the kill), each
    /// reading its share of `cids` until every chunk of it was read once.
    fn start(
        args: &RecoveryArgs,
        clients: Vec<Client>,
        cids: &Arc<Vec<ChunkId>>,
        killed: Instant,
    ) -> Sweep {
        let per_thread = cids.len().div_ceil(clients.len().max(1)).max(1);
        let deadline = killed + Duration::from_secs(args.wait_s);
        let threads = clients
            .into_iter()
            .enumerate()
            .map(|(part, client)| {
                let cids = Arc::clone(cids);
                let bytes = args.chunk_bytes;
                std::thread::spawn(move || {
                    let first = (part * per_thread).min(cids.len());
                    let end = (first + per_thread).min(cids.len());
                    let swept = sweep_part(&client, &cids, first..end, bytes, deadline);
                    client.shutdown();
                    swept
                })
            })
            .collect();
        Sweep { threads }
    }

    /// Waits for the threads; their figures summed.
    fn finish(self) -> SweepPart {
        let mut total = SweepPart::default();
        let mut all_read = true;
        for thread in self.threads {
            let part = thread.join().unwrap_or_else(|_| SweepPart {
                first_error: Some("a sweep thread panicked".into()),
                ..SweepPart::default()
            });
            all_read &= part.readable.is_some();
            total.readable = total.readable.max(part.readable);
            total.retried += part.retried;
            total.wrong += part.wrong;
            total.passes = total.passes.max(part.passes);
            if total.first_error.is_none() {
                total.first_error = part.first_error;
            }
        }
        if !all_read {
            total.readable = None;
        }
        total
    }
}

/// Reads chunks `range` in batches until each was read once or `deadline` passed.
fn sweep_part(
    client: &Client,
    cids: &[ChunkId],
    range: std::ops::Range<usize>,
    bytes: usize,
    deadline: Instant,
) -> SweepPart {
    let api = client.blocking();
    let mut part = SweepPart::default();
    let mut pending: Vec<usize> = range.collect();
    let mut last_read = Instant::now();
    while !pending.is_empty() {
        if part.passes > 0 {
            if Instant::now() >= deadline {
                return part;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        part.passes += 1;
        let mut failed = Vec::new();
        for batch in pending.chunks(VERIFY_BATCH) {
            let ids: Vec<ChunkId> = batch.iter().map(|&i| cids[i]).collect();
            let results = api.chunks().get_batch(&ids);
            let ended = Instant::now();
            for (&index, result) in batch.iter().zip(results) {
                match result {
                    Ok(data) => {
                        last_read = ended;
                        if data != payload(index as u64, bytes) {
                            part.wrong += 1;
                        }
                    }
                    Err(error) => {
                        part.retried += 1;
                        failed.push(index);
                        if part.first_error.is_none() {
                            part.first_error = Some(format!("{}: {error}", cids[index]));
                        }
                    }
                }
            }
        }
        pending = failed;
    }
    part.readable = Some(last_read);
    part
}

/// Prints the sweep's line: when every chunk had been read, and what it tried again.
fn report_sweep(args: &RecoveryArgs, swept: &SweepPart, killed: Instant) {
    let readable_ms = swept
        .readable
        .map(|at| at.saturating_duration_since(killed).as_secs_f64() * 1e3);
    emit(
        args.json,
        json!({"phase": "readable", "sweep_threads": args.sweep_threads,
               "readable_ms": readable_ms, "passes": swept.passes,
               "gets_retried": swept.retried, "wrong_values": swept.wrong,
               "first_error": swept.first_error}),
        format!(
            "readable: every chunk of the master read by a client {} after the kill (sweep \
             threads reading from the kill on: {}; batches of {VERIFY_BATCH}, {} passes, {} \
             gets failed and were tried again{}, {} wrong values)",
            readable_ms.map_or(format!("not within {} s", args.wait_s), |ms| format!(
                "{ms:.0} ms"
            )),
            args.sweep_threads,
            swept.passes,
            swept.retried,
            swept
                .first_error
                .as_deref()
                .map(|e| format!(", the first: {e}"))
                .unwrap_or_default(),
            swept.wrong,
        ),
    );
}

/// What a verification found: chunks right, chunks wrong or missing, the first wrong one.
type Checked = (u64, u64, Option<String>);

/// Reads every chunk back.
fn verify(
    args: &RecoveryArgs,
    connect: &(dyn Fn(Duration, u8) -> Result<Client, String> + Sync),
    cids: &[ChunkId],
) -> Result<Checked, String> {
    let per_thread = cids.len().div_ceil(args.load_threads).max(1);
    let parts: Vec<Result<Checked, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = cids
            .chunks(per_thread)
            .enumerate()
            .map(|(part, slice)| {
                scope.spawn(move || {
                    let client = connect(Duration::from_secs(30), 0)?;
                    let api = client.blocking();
                    let (mut ok, mut wrong, mut first) = (0u64, 0u64, None);
                    for (batch_index, batch) in slice.chunks(VERIFY_BATCH).enumerate() {
                        let base = part * per_thread + batch_index * VERIFY_BATCH;
                        for (offset, result) in
                            api.chunks().get_batch(batch).into_iter().enumerate()
                        {
                            let index = (base + offset) as u64;
                            match result {
                                Ok(data) if data == payload(index, args.chunk_bytes) => ok += 1,
                                other => {
                                    wrong += 1;
                                    if first.is_none() {
                                        first = Some(format!(
                                            "{}: {}",
                                            batch[offset],
                                            match other {
                                                Ok(_) => "wrong payload".to_owned(),
                                                Err(error) => error.to_string(),
                                            }
                                        ));
                                    }
                                }
                            }
                        }
                    }
                    client.shutdown();
                    Ok((ok, wrong, first))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err("a verify thread panicked".into()))
            })
            .collect()
    });
    let mut total = (0u64, 0u64, None);
    for part in parts {
        let (ok, wrong, first) = part?;
        total.0 += ok;
        total.1 += wrong;
        if total.2.is_none() {
            total.2 = first;
        }
    }
    Ok(total)
}

fn write_csv(path: &Path, series: &Series, kill_offset: Duration) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let mut text = String::from("ms_since_kill,ops,ops_per_sec,errors,max_latency_ms\n");
    for (index, bucket) in series.buckets.iter().enumerate() {
        let at = (index as f64 * BUCKET.as_secs_f64() - kill_offset.as_secs_f64()) * 1e3;
        text.push_str(&format!(
            "{at:.0},{},{:.0},{},{:.3}\n",
            bucket.ops,
            bucket.ops as f64 / BUCKET.as_secs_f64(),
            bucket.errors,
            bucket.max_latency_us as f64 / 1e3
        ));
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Fonts tried for the plot's labels, in order.
const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers the first font found as "sans-serif"; false when none is installed.
fn register_font() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| {
        for path in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(
                    "sans-serif",
                    plotters::style::FontStyle::Normal,
                    bytes,
                )
                .is_ok()
                {
                    return true;
                }
            }
        }
        false
    })
}

/// The moments marked on the plot, in milliseconds since the kill.
struct Marks {
    available_ms: f64,
    readable_ms: Option<f64>,
}

/// Draws throughput (left axis) and maximum latency (right axis) per 100 ms against the
/// time since the kill, with the kill (black), the availability in the leader's table
/// (green) and the moment every chunk had been read (magenta) marked.
fn draw_png(
    path: &Path,
    series: &Series,
    kill_offset: Duration,
    marks: &Marks,
) -> Result<(), String> {
    use plotters::prelude::*;
    if !register_font() {
        return Err(format!(
            "no font found for the labels (tried {})",
            FONT_PATHS.join(", ")
        ));
    }
    let points: Vec<(f64, f64, f64)> = series
        .buckets
        .iter()
        .enumerate()
        .map(|(index, bucket)| {
            (
                index as f64 * BUCKET.as_secs_f64() - kill_offset.as_secs_f64(),
                bucket.ops as f64 / BUCKET.as_secs_f64() / 1e3,
                bucket.max_latency_us as f64 / 1e3,
            )
        })
        .collect();
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return Err("no probe operations to draw".into());
    };
    let x_range = first.0..last.0.max(first.0 + 0.1);
    let ops_max = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.1;
    let latency_max = points.iter().map(|p| p.2).fold(0.0, f64::max).max(1.0) * 1.1;
    let error = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());

    let root = BitMapBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Client gets during the recovery of a killed peer",
            ("sans-serif", 24),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .right_y_label_area_size(60)
        .build_cartesian_2d(x_range.clone(), 0.0..ops_max)
        .map_err(|e| error(&e))?
        .set_secondary_coord(x_range, 0.0..latency_max);
    chart
        .configure_mesh()
        .x_desc("seconds since the kill")
        .y_desc("k gets/s (per 100 ms)")
        .draw()
        .map_err(|e| error(&e))?;
    chart
        .configure_secondary_axes()
        .y_desc("max latency (ms)")
        .draw()
        .map_err(|e| error(&e))?;
    chart
        .draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.1)), &BLUE))
        .map_err(|e| error(&e))?
        .label("gets/s")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_secondary_series(LineSeries::new(points.iter().map(|p| (p.0, p.2)), &RED))
        .map_err(|e| error(&e))?
        .label("max latency")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    let mut lines = vec![(0.0, BLACK), (marks.available_ms / 1e3, GREEN)];
    if let Some(readable_ms) = marks.readable_ms {
        lines.push((readable_ms / 1e3, MAGENTA));
    }
    for (at, color) in lines {
        chart
            .draw_series(LineSeries::new(vec![(at, 0.0), (at, ops_max)], color))
            .map_err(|e| error(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| error(&e))?;
    root.present().map_err(|e| error(&e))?;
    Ok(())
}
