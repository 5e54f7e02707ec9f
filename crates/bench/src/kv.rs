//! `myriad bench kv`: small-object get and put throughput and latency of a Myriad cluster
//! on this machine, with Redis and memcached measured in the same run as baselines.
//!
//! # What runs
//! - **myriad** (per `--peers` value, 1 and 3 by default): a local cluster (one superpeer,
//!   N peers) started with the launcher, keys preloaded, then for each op (get, put), each
//!   `--threads` value and batch 1 and `--batch`: the closed-loop [`driver`] for
//!   `--duration-secs` after `--warmup-secs`. The client calls are behind the
//!   [`myriad::client_session`] hook.
//! - **redis**: `redis-server` + `redis-benchmark` (GET and SET, `-d` object bytes,
//!   `-P 1` and `-P 16`, `-c` = threads); see [`redis`] for the mapping.
//! - **memcached**: `memcached` driven by the same driver over the text protocol (single
//!   get/set, multi-key get and pipelined sets of `--batch`); see [`memcached`].
//!
//! A missing baseline binary gives a `skipped` line. Any other failure, Myriad's or a
//! baseline's, prints a `failed` line naming what failed; the other parts still run, and
//! then the bench exits with an error listing every failure (never "skipped" and exit 0).
//!
//! # Output
//! A table by default; `--json` prints one object per line. Result lines have `system`,
//! `peers` (Myriad only), `op`, `object_bytes`, `threads`, `batch`, `pipeline`,
//! `ops_per_sec` (operations, not calls), `p50_us`, `p99_us` and `latency`, which says
//! what one latency sample is: `per_call` (one operation or one whole batch; this crate's
//! driver) or `per_request` (redis-benchmark's per-request figure). Then `ratio` lines
//! (Myriad / Redis at equal client concurrency) with the targets: single ops ≥ 1×
//! Redis unpipelined, batched get ≥ 3× Redis pipelined GET. A ratio whose Redis figure is
//! missing does not vanish: its line has `ratio: null` and `missing` says why (Redis not
//! installed, or its run failed); only `--no-redis` leaves the ratio lines out.

pub mod driver;
pub mod memcached;
pub mod myriad;
pub mod redis;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use self::driver::{run_closed_loop, DriverConfig, DriverResult};
use self::myriad::{MyriadTarget, Op};

/// Target of single-op throughput relative to Redis unpipelined, at equal concurrency.
const TARGET_SINGLE_VS_REDIS: f64 = 1.0;
/// Target of batched get relative to Redis GET pipelined 16.
const TARGET_BATCHED_GET_VS_REDIS_PIPELINED: f64 = 3.0;
/// Redis pipeline depth of the batched baseline.
const REDIS_PIPELINE: usize = 16;

/// Options of `myriad bench kv`.
#[derive(clap::Args, Debug, Clone)]
pub struct KvArgs {
    /// Client thread counts (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 2, 4])]
    pub threads: Vec<usize>,
    /// Peer counts of the Myriad clusters (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 3])]
    pub peers: Vec<usize>,
    /// Operations per batch in the batched runs (also memcached's multi-get width).
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
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
}

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct KvRow {
    /// `myriad`, `redis` or `memcached`.
    pub system: &'static str,
    /// Peers of the Myriad cluster.
    pub peers: Option<usize>,
    /// `get` or `put`.
    pub op: &'static str,
    /// Bytes per object.
    pub object_bytes: usize,
    /// Client threads (redis: connections).
    pub threads: usize,
    /// Operations per call.
    pub batch: usize,
    /// Requests in flight per connection.
    pub pipeline: usize,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// `per_call` or `per_request`.
    pub latency: &'static str,
}

impl KvRow {
    fn to_json(&self) -> Value {
        json!({
            "kind": "result",
            "system": self.system,
            "peers": self.peers,
            "op": self.op,
            "object_bytes": self.object_bytes,
            "threads": self.threads,
            "batch": self.batch,
            "pipeline": self.pipeline,
            "ops_per_sec": self.ops_per_sec.round(),
            "p50_us": finite(self.p50_us),
            "p99_us": finite(self.p99_us),
            "latency": self.latency,
        })
    }
}

fn finite(value: f64) -> Value {
    if value.is_finite() {
        json!(value)
    } else {
        Value::Null
    }
}

/// Prints rows and notes as a table or as JSON lines, and collects the failures.
struct Printer {
    json: bool,
    header_printed: bool,
    /// One entry per failed part ("myriad (3 peers): ..."), for the final error.
    failures: Vec<String>,
}

impl Printer {
    fn row(&mut self, row: &KvRow) {
        if self.json {
            println!("{}", row.to_json());
            return;
        }
        if !self.header_printed {
            println!(
                "{:<10} {:>5} {:<4} {:>6} {:>7} {:>5} {:>8} {:>13} {:>9} {:>9}  LATENCY",
                "SYSTEM",
                "PEERS",
                "OP",
                "BYTES",
                "THREADS",
                "BATCH",
                "PIPELINE",
                "OPS/S",
                "P50_US",
                "P99_US",
            );
            self.header_printed = true;
        }
        println!(
            "{:<10} {:>5} {:<4} {:>6} {:>7} {:>5} {:>8} {:>13.0} {:>9.1} {:>9.1}  {}",
            row.system,
            row.peers.map_or("-".to_string(), |p| p.to_string()),
            row.op,
            row.object_bytes,
            row.threads,
            row.batch,
            row.pipeline,
            row.ops_per_sec,
            row.p50_us,
            row.p99_us,
            row.latency
        );
    }

    fn note(&mut self, value: Value, text: String) {
        if self.json {
            println!("{value}");
        } else {
            println!("{text}");
        }
    }

    fn skipped(&mut self, system: &str, peers: Option<usize>, reason: &str) {
        let label = match peers {
            Some(peers) => format!("{system} ({peers} peers)"),
            None => system.to_string(),
        };
        self.note(
            json!({"kind": "skipped", "system": system, "peers": peers, "reason": reason}),
            format!("{label}: skipped: {reason}"),
        );
    }

    /// Prints a `failed` line and remembers the failure: the run will exit with an error.
    fn failed(&mut self, system: &str, peers: Option<usize>, error: &str) {
        let label = match peers {
            Some(peers) => format!("{system} ({peers} peers)"),
            None => system.to_string(),
        };
        self.note(
            json!({"kind": "failed", "system": system, "peers": peers, "error": error}),
            format!("{label}: FAILED: {error}"),
        );
        self.failures.push(format!("{label}: {error}"));
    }
}

/// What became of the Redis baseline, which says why a ratio has no Redis figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RedisState {
    /// Not run (`--no-redis`): ratio lines are left out.
    Skipped,
    /// `redis-server` or `redis-benchmark` is not installed.
    NotInstalled,
    /// It ran; a missing figure means that configuration failed.
    Ran,
}

impl RedisState {
    /// Why a ratio has no Redis figure (`None`: leave the ratio out).
    fn missing(self) -> Option<&'static str> {
        match self {
            RedisState::Skipped => None,
            RedisState::NotInstalled => Some("redis not installed"),
            RedisState::Ran => Some("the redis run failed (see its failed line)"),
        }
    }
}

/// `Ok` if nothing failed, else an error naming every failure.
fn outcome(failures: &[String]) -> Result<(), String> {
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "bench kv: {} part(s) failed: {}",
            failures.len(),
            failures.join("; ")
        ))
    }
}

fn row_from(
    system: &'static str,
    peers: Option<usize>,
    op: Op,
    args: &KvArgs,
    (threads, batch, pipeline): (usize, usize, usize),
    result: &DriverResult,
) -> KvRow {
    KvRow {
        system,
        peers,
        op: op.name(),
        object_bytes: args.object_bytes,
        threads,
        batch,
        pipeline,
        ops_per_sec: result.ops_per_sec(),
        p50_us: result.p50_us,
        p99_us: result.p99_us,
        latency: "per_call",
    }
}

fn driver_config(args: &KvArgs, batch: usize, seed: u64) -> DriverConfig {
    DriverConfig {
        key_count: args.keys,
        batch,
        warmup: Duration::from_secs_f64(args.warmup_secs.max(0.0)),
        duration: Duration::from_secs_f64(args.duration_secs.max(0.01)),
        seed,
    }
}

/// Runs the benchmark and prints its figures.
pub fn run(args: &KvArgs) -> Result<(), String> {
    if args.batch == 0 || args.batch > driver::BATCH_MAX {
        return Err(format!("--batch must be 1..={}", driver::BATCH_MAX));
    }
    if args.keys == 0 || args.threads.is_empty() || args.threads.contains(&0) {
        return Err("--keys and every --threads value must be positive".into());
    }
    let mut printer = Printer {
        json: args.json,
        header_printed: false,
        failures: Vec::new(),
    };
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
    let batches: Vec<usize> = if args.batch > 1 {
        vec![1, args.batch]
    } else {
        vec![1]
    };
    let mut rows: Vec<KvRow> = Vec::new();

    if !args.no_myriad {
        rows.extend(run_myriad(args, &batches, &mut printer));
    }
    let mut redis_state = RedisState::Skipped;
    if !args.no_redis {
        let (redis_rows, state) = run_redis(args, &mut printer);
        rows.extend(redis_rows);
        redis_state = state;
    }
    if !args.no_memcached {
        rows.extend(run_memcached(args, &batches, &mut printer));
    }
    for ratio in ratios(&rows, args.batch, redis_state) {
        let figure = match ratio["ratio"].as_f64() {
            Some(value) => format!("{value:.2}x"),
            None => format!("n/a ({})", ratio["missing"].as_str().unwrap_or("no figure")),
        };
        let text = format!(
            "ratio myriad/redis ({} peers, {} threads) {}: {figure} (target >= {}x)",
            ratio["peers"],
            ratio["threads"],
            ratio["what"].as_str().unwrap_or(""),
            ratio["target"]
        );
        printer.note(ratio, text);
    }
    outcome(&printer.failures)
}

fn run_myriad(args: &KvArgs, batches: &[usize], printer: &mut Printer) -> Vec<KvRow> {
    let mut rows = Vec::new();
    let base = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("myriad-bench-kv-{}", std::process::id()))
    });
    for &peers in &args.peers {
        let dir = base.join(format!("peers-{peers}"));
        let result = (|| -> Result<Vec<KvRow>, String> {
            let mut target = MyriadTarget::start(&dir, peers, args.peer_memory_mb)?;
            target.preload(args.keys, args.object_bytes)?;
            let mut rows = Vec::new();
            for op in [Op::Get, Op::Put] {
                for &threads in &args.threads {
                    for &batch in batches {
                        let workers = target.workers(op, threads)?;
                        let result =
                            run_closed_loop(&driver_config(args, batch, threads as u64), workers)?;
                        let row = row_from(
                            "myriad",
                            Some(peers),
                            op,
                            args,
                            (threads, batch, 1),
                            &result,
                        );
                        printer.row(&row);
                        rows.push(row);
                    }
                }
            }
            Ok(rows)
        })();
        match result {
            Ok(measured) => rows.extend(measured),
            Err(reason) => printer.failed("myriad", Some(peers), &reason),
        }
    }
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    rows
}

fn run_redis(args: &KvArgs, printer: &mut Printer) -> (Vec<KvRow>, RedisState) {
    let server = match redis::RedisServer::start() {
        Ok(Some(server)) => server,
        Ok(None) => {
            printer.skipped("redis", None, "redis-server or redis-benchmark not found");
            return (Vec::new(), RedisState::NotInstalled);
        }
        Err(error) => {
            printer.failed("redis", None, &error);
            return (Vec::new(), RedisState::Ran);
        }
    };
    let duration = Duration::from_secs_f64(args.duration_secs.max(0.01));
    let mut rows = Vec::new();
    for &threads in &args.threads {
        for pipeline in [1, REDIS_PIPELINE] {
            match server.benchmark_for(threads, pipeline, args.object_bytes, args.keys, duration) {
                Ok(results) => {
                    for result in results {
                        let op = match result.test.as_str() {
                            "SET" => "put",
                            "GET" => "get",
                            _ => continue,
                        };
                        let row = KvRow {
                            system: "redis",
                            peers: None,
                            op,
                            object_bytes: args.object_bytes,
                            threads,
                            batch: 1,
                            pipeline,
                            ops_per_sec: result.rps,
                            p50_us: result.p50_ms * 1000.0,
                            p99_us: result.p99_ms * 1000.0,
                            latency: "per_request",
                        };
                        printer.row(&row);
                        rows.push(row);
                    }
                }
                Err(error) => printer.failed(
                    "redis",
                    None,
                    &format!("-c {threads} -P {pipeline}: {error}"),
                ),
            }
        }
    }
    (rows, RedisState::Ran)
}

fn run_memcached(args: &KvArgs, batches: &[usize], printer: &mut Printer) -> Vec<KvRow> {
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
    let mut rows = Vec::new();
    for op in [Op::Get, Op::Put] {
        for &threads in &args.threads {
            for &batch in batches {
                let measured = server
                    .workers(threads, args.object_bytes, op == Op::Get)
                    .and_then(|workers| {
                        run_closed_loop(&driver_config(args, batch, threads as u64), workers)
                    });
                match measured {
                    Ok(result) => {
                        // Batched gets are one multi-key get; batched sets are pipelined.
                        let (row_batch, pipeline) = match op {
                            Op::Get => (batch, 1),
                            Op::Put => (1, batch),
                        };
                        let row = row_from(
                            "memcached",
                            None,
                            op,
                            args,
                            (threads, row_batch, pipeline),
                            &result,
                        );
                        printer.row(&row);
                        rows.push(row);
                    }
                    Err(error) => printer.failed(
                        "memcached",
                        None,
                        &format!("{} {threads} threads batch {batch}: {error}", op.name()),
                    ),
                }
            }
        }
    }
    rows
}

/// Myriad / Redis ratios at equal thread counts, with targets. A Myriad row whose Redis
/// counterpart is missing gets a line with `ratio: null` and the reason in `missing`
/// (none when Redis was skipped on purpose).
fn ratios(rows: &[KvRow], batch: usize, redis_state: RedisState) -> Vec<Value> {
    let find = |system: &str, op: &str, threads: usize, batch: usize, pipeline: usize| {
        rows.iter().find(|r| {
            r.system == system
                && r.op == op
                && r.threads == threads
                && r.batch == batch
                && r.pipeline == pipeline
        })
    };
    let mut out = Vec::new();
    for myriad in rows.iter().filter(|r| r.system == "myriad") {
        let (what, redis, target) = if myriad.batch == 1 {
            (
                format!("single {} vs redis -P 1", myriad.op),
                find("redis", myriad.op, myriad.threads, 1, 1),
                TARGET_SINGLE_VS_REDIS,
            )
        } else if myriad.op == "get" && myriad.batch == batch {
            (
                format!("batched get ({batch}) vs redis GET -P {REDIS_PIPELINE}"),
                find("redis", "get", myriad.threads, 1, REDIS_PIPELINE),
                TARGET_BATCHED_GET_VS_REDIS_PIPELINED,
            )
        } else {
            continue;
        };
        let Some(redis) = redis else {
            if let Some(missing) = redis_state.missing() {
                out.push(json!({
                    "kind": "ratio",
                    "what": what,
                    "peers": myriad.peers,
                    "threads": myriad.threads,
                    "op": myriad.op,
                    "batch": myriad.batch,
                    "myriad_ops_per_sec": myriad.ops_per_sec.round(),
                    "redis_ops_per_sec": null,
                    "ratio": null,
                    "target": target,
                    "met": null,
                    "missing": missing,
                }));
            }
            continue;
        };
        let ratio = myriad.ops_per_sec / redis.ops_per_sec.max(1e-9);
        out.push(json!({
            "kind": "ratio",
            "what": what,
            "peers": myriad.peers,
            "threads": myriad.threads,
            "op": myriad.op,
            "batch": myriad.batch,
            "myriad_ops_per_sec": myriad.ops_per_sec.round(),
            "redis_ops_per_sec": redis.ops_per_sec.round(),
            "ratio": (ratio * 100.0).round() / 100.0,
            "target": target,
            "met": ratio >= target,
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        system: &'static str,
        op: &'static str,
        batch: usize,
        pipeline: usize,
        rate: f64,
    ) -> KvRow {
        KvRow {
            system,
            peers: (system == "myriad").then_some(1),
            op,
            object_bytes: 64,
            threads: 2,
            batch,
            pipeline,
            ops_per_sec: rate,
            p50_us: 10.0,
            p99_us: 20.0,
            latency: "per_call",
        }
    }

    #[test]
    fn ratios_pair_myriad_with_redis_at_equal_concurrency() {
        let rows = vec![
            row("myriad", "get", 1, 1, 200.0),
            row("myriad", "get", 16, 1, 3000.0),
            row("myriad", "put", 16, 1, 3000.0),
            row("redis", "get", 1, 1, 100.0),
            row("redis", "get", 1, 16, 1000.0),
            row("memcached", "get", 1, 1, 1.0),
        ];
        let ratios = ratios(&rows, 16, RedisState::Ran);
        assert_eq!(ratios.len(), 2);
        assert_eq!(ratios[0]["ratio"], 2.0);
        assert_eq!(ratios[0]["met"], true);
        assert_eq!(ratios[1]["ratio"], 3.0);
        assert_eq!(ratios[1]["target"], 3.0);
    }

    #[test]
    fn ratio_lines_do_not_vanish_when_a_redis_figure_is_missing() {
        // The pipelined redis run failed: only the unpipelined figure exists.
        let rows = vec![
            row("myriad", "get", 1, 1, 200.0),
            row("myriad", "get", 16, 1, 3000.0),
            row("redis", "get", 1, 1, 100.0),
        ];
        let lines = ratios(&rows, 16, RedisState::Ran);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["ratio"], 2.0);
        assert!(lines[1]["ratio"].is_null());
        assert!(lines[1]["met"].is_null());
        assert!(lines[1]["missing"]
            .as_str()
            .is_some_and(|m| m.contains("failed")));
        let not_installed = ratios(&rows[..2], 16, RedisState::NotInstalled);
        assert_eq!(not_installed.len(), 2);
        assert_eq!(not_installed[0]["missing"], "redis not installed");
        // --no-redis: left out on purpose.
        assert!(ratios(&rows[..2], 16, RedisState::Skipped).is_empty());
    }

    #[test]
    fn any_failure_fails_the_run_and_names_it() {
        assert_eq!(outcome(&[]), Ok(()));
        let error = outcome(&[
            "myriad (3 peers): client connect: refused".to_string(),
            "redis: -c 8 -P 16: exit status: 1".to_string(),
        ])
        .expect_err("fails");
        assert!(error.contains("2 part(s) failed"), "{error}");
        assert!(
            error.contains("myriad (3 peers): client connect: refused"),
            "{error}"
        );
        assert!(error.contains("redis: -c 8 -P 16"), "{error}");
    }

    #[test]
    fn a_failed_part_is_recorded_not_skipped() {
        let mut printer = Printer {
            json: true,
            header_printed: false,
            failures: Vec::new(),
        };
        printer.skipped("memcached", None, "memcached not found");
        assert!(printer.failures.is_empty());
        printer.failed("myriad", Some(3), "preload: timed out");
        assert_eq!(
            printer.failures,
            vec!["myriad (3 peers): preload: timed out"]
        );
        assert!(outcome(&printer.failures).is_err());
    }

    #[test]
    fn json_rows_carry_the_required_fields() {
        let value = row("redis", "get", 1, 16, 5.0).to_json();
        for field in [
            "op",
            "object_bytes",
            "threads",
            "batch",
            "ops_per_sec",
            "p50_us",
            "p99_us",
            "system",
            "pipeline",
        ] {
            assert!(value.get(field).is_some(), "{field}");
        }
    }
}
