//! `myriad bench kv`: small-object get and put throughput, latency and CPU cost of a
//! Myriad cluster on this machine, against Redis (and memcached) in the same run with the
//! same durability and the same requests in flight.
//!
//! # Modes ([`Mode`], `--modes`)
//! Each mode pairs a Myriad setting with the Redis setup that does equal work:
//! `none` (R = 0 / no persistence; memcached too), `async` (R = 2 async / AOF everysec),
//! `replicated` (R = 2 replicated / 2 replicas + `WAIT 2`), `durable` (R = 2 durable /
//! 2 replicas + `WAIT 2` + `appendfsync always`; see [`redis`] for what Redis 7.0 cannot
//! wait for). R = 2 needs 3 peers: those modes skip smaller clusters with a note.
//!
//! # Drivers
//! - **threads** (`--threads`): N blocking client threads, each with its own client (one
//!   connection per peer) and one call outstanding: a single op or a batch of `--batch`
//!   ops. Redis gets N connections driven by the same closed-loop code, unpipelined or
//!   pipelined at the same depth (plus `WAIT` in the replicated modes). This is what a
//!   thread-per-request application does, and the targets apply here.
//! - **async** (`--inflight`, modes `none` and `async`): one Myriad client with its one I/O
//!   thread and N tasks in flight, against `redis-benchmark -c N` (N connections on one
//!   event-loop thread), at depth 1 and `--batch`. This is what an event-driven
//!   application does.
//!
//! # CPU
//! Each row has the CPU seconds per million operations of the server processes (every
//! Myriad node, or every redis-server) and of the client (this process; not measured for
//! `redis-benchmark`), from `/proc` (see [`cpu`]). After each preload the bench waits until
//! the servers are quiet (peers prefault part of their memory in the background at start,
//! a core each for seconds; backups write the preload to their logs), prints how long that
//! took (`settled`), then an `idle_cpu` line: the servers' CPU use over `--idle-secs` with
//! no load. Nothing is measured before the servers settle.
//!
//! # TLS (`--tls`)
//! The Myriad side runs twice per mode and peer count: plain, then on a cluster with TLS
//! on every connection (a CA of its own, made by the launcher in the cluster directory;
//! the nodes' certificates and a client certificate for the bench's clients), rows of
//! system `myriad-tls`. Each TLS row is followed at the end by a `tls_ratio` line: its
//! throughput and latencies divided by the plain row of equal mode, driver, op, clients
//! and depth ([`report::tls_ratios`]). Only plain rows are paired with Redis.
//!
//! # Failures
//! A missing baseline binary gives a `skipped` line. Any other failure, Myriad's or a
//! baseline's, prints a `failed` line naming what failed; the other parts still run, and
//! then the bench exits with an error listing every failure. See [`report`] for rows and
//! ratios.

pub mod cpu;
pub mod driver;
pub mod memcached;
pub mod myriad;
pub mod redis;
pub mod report;
pub mod resp;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use self::cpu::{secs_per_million, CpuMark};
use self::driver::{run_closed_loop, DriverConfig, DriverResult, WorkerFn};
use self::myriad::{MyriadTarget, Op};
use self::report::{outcome, ratios, tls_ratios, DriverKind, KvRow, Printer, RedisState};

/// A durability setting and its Redis counterpart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Mode {
    /// Myriad R = 0; Redis without persistence; memcached.
    None,
    /// Myriad R = 2, async; Redis AOF everysec.
    Async,
    /// Myriad R = 2, replicated; Redis + 2 replicas, `WAIT 2` after writes.
    Replicated,
    /// Myriad R = 2, durable; Redis + 2 replicas, `appendfsync always`, `WAIT 2`.
    Durable,
}

impl Mode {
    /// Its name in the output.
    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Async => "async",
            Mode::Replicated => "replicated",
            Mode::Durable => "durable",
        }
    }

    /// Whether Redis runs with replicas and `WAIT` (and Myriad waits for backups).
    pub fn replicated(self) -> bool {
        matches!(self, Mode::Replicated | Mode::Durable)
    }

    /// Myriad's backups per zone in this mode.
    pub fn replication(self) -> usize {
        match self {
            Mode::None => 0,
            _ => 2,
        }
    }

    /// The node config of this mode (`[backup]` replication and default durability).
    pub fn node_config(self) -> String {
        let durability = match self {
            Mode::None | Mode::Async => "async",
            Mode::Replicated => "replicated",
            Mode::Durable => "durable",
        };
        format!(
            "[backup]\nreplication = {}\ndurability = \"{durability}\"\n",
            self.replication()
        )
    }

    /// The Redis setup of this mode, in words.
    pub fn redis_setup(self) -> &'static str {
        match self {
            Mode::None => "(no persistence)",
            Mode::Async => "(AOF everysec)",
            Mode::Replicated => "(2 replicas, WAIT 2)",
            Mode::Durable => "(2 replicas, WAIT 2, appendfsync always)",
        }
    }
}

/// Options of `myriad bench kv`.
#[derive(clap::Args, Debug, Clone)]
pub struct KvArgs {
    /// Durability modes to measure (comma-separated: none, async, replicated, durable).
    #[arg(long, value_delimiter = ',', default_values = ["none", "async"])]
    pub modes: Vec<Mode>,
    /// Operations to measure (comma-separated: get, put).
    #[arg(long, value_delimiter = ',', default_values = ["get", "put"])]
    pub ops: Vec<String>,
    /// Drivers to run (comma-separated: threads, async).
    #[arg(long, value_delimiter = ',', default_values = ["threads", "async"])]
    pub drivers: Vec<String>,
    /// Client thread counts of the threads driver (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 8, 16])]
    pub threads: Vec<usize>,
    /// Requests in flight of the async driver and redis-benchmark connections
    /// (comma-separated; empty or 0 skips the async driver).
    #[arg(long, value_delimiter = ',', default_values_t = vec![16usize])]
    pub inflight: Vec<usize>,
    /// Peer counts of the Myriad clusters (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 3])]
    pub peers: Vec<usize>,
    /// Operations per batch / Redis pipeline depth of the batched runs (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![16usize])]
    pub batch: Vec<usize>,
    /// Bytes per object.
    #[arg(long, default_value_t = 64)]
    pub object_bytes: usize,
    /// Objects preloaded; keys are uniform over them.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Seconds measured per configuration.
    #[arg(long, default_value_t = 3.0)]
    pub duration_secs: f64,
    /// Seconds of warm-up before each measurement.
    #[arg(long, default_value_t = 0.5)]
    pub warmup_secs: f64,
    /// Seconds over which the idle CPU of the servers is measured after each preload.
    #[arg(long, default_value_t = 2.0)]
    pub idle_secs: f64,
    /// Memory of each Myriad peer in MiB.
    #[arg(long, default_value_t = 1024)]
    pub peer_memory_mb: u64,
    /// Directory for the Myriad clusters (default: a fresh one under the temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Skip Myriad (baselines only).
    #[arg(long)]
    pub no_myriad: bool,
    /// Skip the Redis baseline.
    #[arg(long)]
    pub no_redis: bool,
    /// Skip the memcached baseline.
    #[arg(long)]
    pub no_memcached: bool,
    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// Run the Myriad side again on a cluster with TLS (a temporary CA, client
    /// certificates) and print TLS / plain ratios of every Myriad row.
    #[arg(long)]
    pub tls: bool,
}

impl KvArgs {
    fn depths(&self) -> Vec<usize> {
        let mut depths = vec![1];
        depths.extend(self.batch.iter().copied().filter(|&b| b > 1));
        depths.dedup();
        depths
    }

    fn inflights(&self) -> Vec<usize> {
        if !self.runs_driver("async") {
            return Vec::new();
        }
        self.inflight.iter().copied().filter(|&n| n > 0).collect()
    }

    fn thread_counts(&self) -> Vec<usize> {
        if self.runs_driver("threads") {
            self.threads.clone()
        } else {
            Vec::new()
        }
    }

    fn config(&self, batch: usize, seed: u64) -> DriverConfig {
        DriverConfig {
            key_count: self.keys,
            batch,
            warmup: Duration::from_secs_f64(self.warmup_secs.max(0.0)),
            duration: Duration::from_secs_f64(self.duration_secs.max(0.01)),
            seed,
        }
    }

    fn ops(&self) -> Vec<Op> {
        [Op::Get, Op::Put]
            .into_iter()
            .filter(|op| self.ops.iter().any(|name| name == op.name()))
            .collect()
    }

    fn runs_driver(&self, name: &str) -> bool {
        self.drivers.iter().any(|driver| driver == name)
    }

    fn check(&self) -> Result<(), String> {
        if let Some(bad) = self
            .ops
            .iter()
            .find(|op| !["get", "put"].contains(&op.as_str()))
        {
            return Err(format!("--ops: {bad:?} is not get or put"));
        }
        if let Some(bad) = self
            .drivers
            .iter()
            .find(|d| !["threads", "async"].contains(&d.as_str()))
        {
            return Err(format!("--drivers: {bad:?} is not threads or async"));
        }
        if self.batch.iter().any(|&b| b == 0 || b > driver::BATCH_MAX) {
            return Err(format!("every --batch must be 1..={}", driver::BATCH_MAX));
        }
        if self.keys == 0 || self.threads.is_empty() || self.threads.contains(&0) {
            return Err("--keys and every --threads value must be positive".into());
        }
        if self.modes.is_empty() {
            return Err("--modes is empty".into());
        }
        Ok(())
    }
}

/// What a measurement needs besides the load: which processes serve, for the CPU figures.
struct Measured {
    result: DriverResult,
    server_cpu_s: f64,
    client_cpu_s: Option<f64>,
}

/// Runs `load` while reading the CPU time of `server_pids` (and of this process, the
/// client, unless `client` is false); the CPU of warm-up and measurement are both counted,
/// so per-op figures scale by the measured window's share.
fn measure(
    server_pids: &[u32],
    client: bool,
    load: impl FnOnce() -> Result<DriverResult, String>,
    window_share: f64,
) -> Result<Measured, String> {
    let server = CpuMark::now(server_pids)?;
    let me = CpuMark::now(&[std::process::id()])?;
    let result = load()?;
    let (server_cpu, _) = server.since()?;
    let (client_cpu, _) = me.since()?;
    Ok(Measured {
        result,
        server_cpu_s: server_cpu * window_share,
        client_cpu_s: client.then_some(client_cpu * window_share),
    })
}

/// Runs the benchmark and prints its figures.
pub fn run(args: &KvArgs) -> Result<(), String> {
    args.check()?;
    let mut printer = Printer::new(args.json);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    printer.note(
        json!({"kind": "machine", "cores": cores, "load_1min": load, "build": build,
               "keys": args.keys, "duration_secs": args.duration_secs}),
        format!(
            "bench kv: {cores} cores, load {load} (1 min), {build} build, {} keys of {} B, {} s per run",
            args.keys, args.object_bytes, args.duration_secs
        ),
    );
    let mut rows: Vec<KvRow> = Vec::new();
    let mut redis_states = Vec::new();
    for &mode in &args.modes {
        if !args.no_myriad {
            rows.extend(run_myriad(args, mode, &mut printer));
        }
        if !args.no_redis {
            let (redis_rows, state) = run_redis(args, mode, &mut printer);
            rows.extend(redis_rows);
            redis_states.push((mode, state));
        }
        if mode == Mode::None && !args.no_memcached {
            rows.extend(run_memcached(args, &mut printer));
        }
    }
    let state_of = |mode: Mode| {
        redis_states
            .iter()
            .find(|(m, _)| *m == mode)
            .map_or(RedisState::Skipped, |(_, state)| *state)
    };
    for ratio in ratios(&rows, state_of) {
        let figure = match ratio["ratio"].as_f64() {
            Some(value) => format!("{value:.2}x"),
            None => format!("n/a ({})", ratio["missing"].as_str().unwrap_or("no figure")),
        };
        let target = match ratio["target"].as_f64() {
            Some(target) => format!(" (target >= {target}x)"),
            None => String::new(),
        };
        let text = format!(
            "ratio myriad/redis, {} peers: {}: {figure}{target}",
            ratio["peers"],
            ratio["what"].as_str().unwrap_or(""),
        );
        printer.note(ratio, text);
    }
    for ratio in tls_ratios(&rows) {
        let text = format!(
            "TLS / plain, {} peers: {}: throughput {:.3}x, p50 {:.3}x, p99 {:.3}x",
            ratio["peers"],
            ratio["what"].as_str().unwrap_or(""),
            ratio["throughput_ratio"].as_f64().unwrap_or(f64::NAN),
            ratio["p50_ratio"].as_f64().unwrap_or(f64::NAN),
            ratio["p99_ratio"].as_f64().unwrap_or(f64::NAN),
        );
        printer.note(ratio, text);
    }
    outcome(&printer.failures)
}

/// The share of a run's CPU time that belongs to the measured window.
fn window_share(args: &KvArgs) -> f64 {
    let measured = args.duration_secs.max(0.01);
    measured / (measured + args.warmup_secs.max(0.0))
}

/// Below this share of one core (percent) a cluster counts as quiet.
const QUIET_PERCENT: f64 = 5.0;
/// The longest wait for a cluster to become quiet before measuring.
const QUIET_MAX: Duration = Duration::from_secs(90);

/// Waits until the servers are quiet (see [`cpu::wait_quiet`]), says how long that took,
/// then prints their idle CPU over `--idle-secs`.
fn settle_and_idle(
    printer: &mut Printer,
    args: &KvArgs,
    system: &str,
    label: String,
    pids: &[u32],
) -> Result<(), String> {
    let settled = cpu::wait_quiet(pids, QUIET_PERCENT, Duration::from_millis(500), QUIET_MAX)?;
    printer.note(
        json!({"kind": "settled", "system": system, "what": label,
               "secs": (settled.as_secs_f64() * 10.0).round() / 10.0}),
        format!(
            "{label}: quiet (< {QUIET_PERCENT}% of a core) after {:.1} s of waiting",
            settled.as_secs_f64()
        ),
    );
    if args.idle_secs <= 0.0 {
        return Ok(());
    }
    let percent = cpu::idle_percent(pids, Duration::from_secs_f64(args.idle_secs))?;
    printer.note(
        json!({"kind": "idle_cpu", "system": system, "what": label,
               "processes": pids.len(), "percent_of_one_core": (percent * 100.0).round() / 100.0}),
        format!(
            "idle CPU of {label} ({} processes): {percent:.2}% of one core",
            pids.len()
        ),
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn row_of(
    system: &'static str,
    mode: Mode,
    driver: DriverKind,
    peers: Option<usize>,
    op: Op,
    args: &KvArgs,
    (clients, depth): (usize, usize),
    measured: &Measured,
) -> KvRow {
    let ops = measured.result.ops;
    KvRow {
        system,
        mode,
        driver,
        peers,
        op: op.name(),
        object_bytes: args.object_bytes,
        clients,
        depth,
        ops_per_sec: measured.result.ops_per_sec(),
        p50_us: measured.result.p50_us,
        p99_us: measured.result.p99_us,
        latency: "per_call",
        server_cpu_s_per_mop: secs_per_million(measured.server_cpu_s, ops),
        client_cpu_s_per_mop: measured
            .client_cpu_s
            .and_then(|cpu| secs_per_million(cpu, ops)),
    }
}

fn run_myriad(args: &KvArgs, mode: Mode, printer: &mut Printer) -> Vec<KvRow> {
    let mut rows = Vec::new();
    let base = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("myriad-bench-kv-{}", std::process::id()))
    });
    for &peers in &args.peers {
        if peers <= mode.replication() {
            printer.note(
                json!({"kind": "not_run", "system": "myriad", "mode": mode.name(), "peers": peers,
                       "reason": format!("R = {} needs {} peers", mode.replication(), mode.replication() + 1)}),
                format!(
                    "myriad ({peers} peers) {}: not run: R = {} needs {} peers",
                    mode.name(),
                    mode.replication(),
                    mode.replication() + 1
                ),
            );
            continue;
        }
        for tls in [false, true] {
            if tls && !args.tls {
                continue;
            }
            let suffix = if tls { "-tls" } else { "" };
            let dir = base.join(format!("{}-peers-{peers}{suffix}", mode.name()));
            let result = myriad_cluster_rows(args, mode, (peers, tls), &dir, printer);
            match result {
                Ok(measured) => rows.extend(measured),
                Err(reason) => printer.failed(
                    myriad_system(tls),
                    Some(peers),
                    &format!("{}: {reason}", mode.name()),
                ),
            }
        }
    }
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    rows
}

/// The system name of Myriad rows, plain or with TLS.
fn myriad_system(tls: bool) -> &'static str {
    if tls {
        "myriad-tls"
    } else {
        "myriad"
    }
}

fn myriad_cluster_rows(
    args: &KvArgs,
    mode: Mode,
    (peers, tls): (usize, bool),
    dir: &std::path::Path,
    printer: &mut Printer,
) -> Result<Vec<KvRow>, String> {
    let system = myriad_system(tls);
    let mut target = MyriadTarget::start(dir, peers, args.peer_memory_mb, mode, tls)?;
    target.preload(args.keys, args.object_bytes)?;
    let pids = target.pids();
    settle_and_idle(
        printer,
        args,
        system,
        format!("{system} {} ({peers} peers + 1 superpeer)", mode.name()),
        &pids,
    )?;
    let share = window_share(args);
    let mut rows = Vec::new();
    let mut push = |row: KvRow, printer: &mut Printer| {
        printer.row(&row);
        rows.push(row);
    };
    for op in args.ops() {
        for threads in args.thread_counts() {
            for depth in args.depths() {
                let workers = target.workers(op, threads)?;
                let config = args.config(depth, threads as u64);
                let measured = measure(&pids, true, || run_closed_loop(&config, workers), share)?;
                let row = row_of(
                    system,
                    mode,
                    DriverKind::Threads,
                    Some(peers),
                    op,
                    args,
                    (threads, depth),
                    &measured,
                );
                push(row, printer);
            }
        }
        if matches!(mode, Mode::None | Mode::Async) {
            for inflight in args.inflights() {
                for depth in args.depths() {
                    let config = args.config(depth, 1000 + inflight as u64);
                    let measured = measure(
                        &pids,
                        true,
                        || target.run_async(op, inflight, &config),
                        share,
                    )?;
                    let row = row_of(
                        system,
                        mode,
                        DriverKind::Async,
                        Some(peers),
                        op,
                        args,
                        (inflight, depth),
                        &measured,
                    );
                    push(row, printer);
                }
            }
        }
    }
    Ok(rows)
}

fn run_redis(args: &KvArgs, mode: Mode, printer: &mut Printer) -> (Vec<KvRow>, RedisState) {
    let server = match redis::RedisServer::start(mode) {
        Ok(Some(server)) => server,
        Ok(None) => {
            printer.skipped("redis", None, "redis-server or redis-benchmark not found");
            return (Vec::new(), RedisState::NotInstalled);
        }
        Err(error) => {
            printer.failed("redis", None, &format!("{}: {error}", mode.name()));
            return (Vec::new(), RedisState::Ran);
        }
    };
    if let Err(error) = server.preload(args.keys, args.object_bytes) {
        printer.failed("redis", None, &format!("{}: preload: {error}", mode.name()));
        return (Vec::new(), RedisState::Ran);
    }
    let pids = server.pids().to_vec();
    if let Err(error) = settle_and_idle(
        printer,
        args,
        "redis",
        format!("redis {} {}", mode.name(), mode.redis_setup()),
        &pids,
    ) {
        printer.failed("redis", None, &format!("{}: {error}", mode.name()));
        return (Vec::new(), RedisState::Ran);
    }
    let share = window_share(args);
    let mut rows = Vec::new();
    for op in args.ops() {
        for threads in args.thread_counts() {
            for depth in args.depths() {
                let measured = server
                    .workers(threads, args.object_bytes, op == Op::Get)
                    .and_then(|workers| {
                        let config = args.config(depth, threads as u64);
                        measure(&pids, true, || run_closed_loop(&config, workers), share)
                    });
                match measured {
                    Ok(measured) => {
                        let row = row_of(
                            "redis",
                            mode,
                            DriverKind::Threads,
                            None,
                            op,
                            args,
                            (threads, depth),
                            &measured,
                        );
                        printer.row(&row);
                        rows.push(row);
                    }
                    Err(error) => printer.failed(
                        "redis",
                        None,
                        &format!(
                            "{} {} {threads} threads depth {depth}: {error}",
                            mode.name(),
                            op.name()
                        ),
                    ),
                }
            }
        }
    }
    if matches!(mode, Mode::None | Mode::Async) {
        rows.extend(run_redis_benchmark(args, mode, &server, printer));
    }
    (rows, RedisState::Ran)
}

/// The `redis-benchmark` rows (the async driver's counterpart): one run per test, depth
/// and connection count; the servers' CPU is read over the measured run only.
fn run_redis_benchmark(
    args: &KvArgs,
    mode: Mode,
    server: &redis::RedisServer,
    printer: &mut Printer,
) -> Vec<KvRow> {
    let duration = Duration::from_secs_f64(args.duration_secs.max(0.01));
    let mut rows = Vec::new();
    for (test, op) in [("get", Op::Get), ("set", Op::Put)] {
        if !args.ops().contains(&op) {
            continue;
        }
        let op = op.name();
        for clients in args.inflights() {
            for depth in args.depths() {
                let measured = server.benchmark_for(
                    test,
                    clients,
                    depth,
                    (args.object_bytes, args.keys),
                    duration,
                );
                let (result, cpu_secs, requests) = match measured {
                    Ok(measured) => measured,
                    Err(error) => {
                        printer.failed(
                            "redis",
                            None,
                            &format!(
                                "{} redis-benchmark -t {test} -c {clients} -P {depth}: {error}",
                                mode.name()
                            ),
                        );
                        continue;
                    }
                };
                let row = KvRow {
                    system: "redis",
                    mode,
                    driver: DriverKind::RedisBenchmark,
                    peers: None,
                    op,
                    object_bytes: args.object_bytes,
                    clients,
                    depth,
                    ops_per_sec: result.rps,
                    p50_us: result.p50_ms * 1000.0,
                    p99_us: result.p99_ms * 1000.0,
                    latency: "per_request",
                    server_cpu_s_per_mop: secs_per_million(cpu_secs, requests),
                    client_cpu_s_per_mop: None,
                };
                printer.row(&row);
                rows.push(row);
            }
        }
    }
    rows
}

fn run_memcached(args: &KvArgs, printer: &mut Printer) -> Vec<KvRow> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Room for every object with its ~60-byte item header and key, four times over.
    let memory_mb = (args.keys * (args.object_bytes as u64 + 80) * 4 / (1 << 20)).max(64);
    let server = match memcached::MemcachedServer::start(memory_mb, cores) {
        Ok(Some(server)) => server,
        Ok(None) => {
            printer.skipped("memcached", None, "memcached not found");
            return Vec::new();
        }
        Err(error) => {
            printer.failed("memcached", None, &error);
            return Vec::new();
        }
    };
    if let Err(error) = server.preload(args.keys, args.object_bytes) {
        printer.failed("memcached", None, &format!("preload: {error}"));
        return Vec::new();
    }
    let pids = vec![server.pid()];
    let share = window_share(args);
    let mut rows = Vec::new();
    for op in args.ops() {
        for threads in args.thread_counts() {
            for depth in args.depths() {
                let measured = server
                    .workers(threads, args.object_bytes, op == Op::Get)
                    .and_then(|workers: Vec<WorkerFn>| {
                        let config = args.config(depth, threads as u64);
                        measure(&pids, true, || run_closed_loop(&config, workers), share)
                    });
                match measured {
                    Ok(measured) => {
                        let row = row_of(
                            "memcached",
                            Mode::None,
                            DriverKind::Threads,
                            None,
                            op,
                            args,
                            (threads, depth),
                            &measured,
                        );
                        printer.row(&row);
                        rows.push(row);
                    }
                    Err(error) => printer.failed(
                        "memcached",
                        None,
                        &format!("{} {threads} threads depth {depth}: {error}", op.name()),
                    ),
                }
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_map_to_replication_and_durability() {
        assert_eq!(Mode::None.replication(), 0);
        assert!(Mode::None.node_config().contains("replication = 0"));
        assert!(Mode::Async.node_config().contains("durability = \"async\""));
        assert!(Mode::Durable.node_config().contains("replication = 2"));
        assert!(Mode::Durable
            .node_config()
            .contains("durability = \"durable\""));
        assert!(Mode::Replicated.replicated() && !Mode::Async.replicated());
    }
}
