//! Rows, notes and ratios of `bench kv`: what one measured configuration printed, the
//! pairing of each Myriad row with the Redis row of equal durability and equal requests in
//! flight, and the final verdict (any failure fails the run).
//!
//! # Pairing
//! A Myriad row is compared with the Redis row of the same mode, op, client count and depth
//! (batch = pipeline), driven the same way: Myriad's blocking threads against this crate's
//! Redis threads (one connection each), Myriad's async driver against `redis-benchmark`
//! (one event-loop thread). Targets (issue 17) apply to the threads driver, which is what a
//! thread-per-request application does: single get and put with R = 0 ≥ 1.5×, batched get
//! and put (mode `none`) ≥ 3×, `async` puts ≥ 1×, `replicated` puts ≥ 1×. Other pairs print
//! their ratio with `target: null`.

use serde_json::{json, Value};

use super::Mode;

/// How a row's load was generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    /// Blocking client threads, one call outstanding each (this crate's driver).
    Threads,
    /// Myriad's async driver: tasks on one client's single I/O thread.
    Async,
    /// `redis-benchmark`: connections on one event-loop thread.
    RedisBenchmark,
}

impl DriverKind {
    /// Its name in the output.
    pub fn name(self) -> &'static str {
        match self {
            DriverKind::Threads => "threads",
            DriverKind::Async => "async",
            DriverKind::RedisBenchmark => "redis-benchmark",
        }
    }

    /// The kind a Myriad row of this kind is compared with.
    fn redis_counterpart(self) -> DriverKind {
        match self {
            DriverKind::Async | DriverKind::RedisBenchmark => DriverKind::RedisBenchmark,
            DriverKind::Threads => DriverKind::Threads,
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct KvRow {
    /// `myriad`, `redis` or `memcached`.
    pub system: &'static str,
    /// Durability mode the system ran in.
    pub mode: Mode,
    /// How the load was generated.
    pub driver: DriverKind,
    /// Peers of the Myriad cluster.
    pub peers: Option<usize>,
    /// `get` or `put`.
    pub op: &'static str,
    /// Bytes per object.
    pub object_bytes: usize,
    /// Clients: threads, async tasks or redis-benchmark connections.
    pub clients: usize,
    /// Operations per call (batch) or requests per pipeline.
    pub depth: usize,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// `per_call` or `per_request`.
    pub latency: &'static str,
    /// CPU seconds of the server processes per million operations.
    pub server_cpu_s_per_mop: Option<f64>,
    /// CPU seconds of the client (this process) per million operations.
    pub client_cpu_s_per_mop: Option<f64>,
}

impl KvRow {
    /// Requests in flight: clients × depth.
    pub fn inflight(&self) -> usize {
        self.clients * self.depth
    }

    /// The row as one JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "kind": "result",
            "system": self.system,
            "mode": self.mode.name(),
            "driver": self.driver.name(),
            "peers": self.peers,
            "op": self.op,
            "object_bytes": self.object_bytes,
            "clients": self.clients,
            "threads": self.clients,
            "depth": self.depth,
            "inflight": self.inflight(),
            "ops_per_sec": self.ops_per_sec.round(),
            "p50_us": finite(self.p50_us),
            "p99_us": finite(self.p99_us),
            "latency": self.latency,
            "server_cpu_s_per_mop": self.server_cpu_s_per_mop.map(round2),
            "client_cpu_s_per_mop": self.client_cpu_s_per_mop.map(round2),
        })
    }
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

fn finite(value: f64) -> Value {
    if value.is_finite() {
        json!(value)
    } else {
        Value::Null
    }
}

fn cpu_text(value: Option<f64>) -> String {
    value.map_or("-".to_string(), |v| format!("{v:.2}"))
}

/// Prints rows and notes as a table or as JSON lines, and collects the failures.
pub struct Printer {
    /// JSON lines instead of a table.
    pub json: bool,
    header_printed: bool,
    /// One entry per failed part ("myriad (3 peers): ..."), for the final error.
    pub failures: Vec<String>,
}

impl Printer {
    /// A printer with no output yet.
    pub fn new(json: bool) -> Printer {
        Printer {
            json,
            header_printed: false,
            failures: Vec::new(),
        }
    }

    /// Prints one result row.
    pub fn row(&mut self, row: &KvRow) {
        if self.json {
            println!("{}", row.to_json());
            return;
        }
        if !self.header_printed {
            println!(
                "{:<10} {:<10} {:<15} {:>5} {:<4} {:>7} {:>5} {:>12} {:>8} {:>9} {:>7} {:>7}",
                "SYSTEM",
                "MODE",
                "DRIVER",
                "PEERS",
                "OP",
                "CLIENTS",
                "DEPTH",
                "OPS/S",
                "P50_US",
                "P99_US",
                "SRV_CPU",
                "CLI_CPU",
            );
            println!("{:>104}", "(CPU: seconds per million ops)");
            self.header_printed = true;
        }
        println!(
            "{:<10} {:<10} {:<15} {:>5} {:<4} {:>7} {:>5} {:>12.0} {:>8.1} {:>9.1} {:>7} {:>7}",
            row.system,
            row.mode.name(),
            row.driver.name(),
            row.peers.map_or("-".to_string(), |p| p.to_string()),
            row.op,
            row.clients,
            row.depth,
            row.ops_per_sec,
            row.p50_us,
            row.p99_us,
            cpu_text(row.server_cpu_s_per_mop),
            cpu_text(row.client_cpu_s_per_mop),
        );
    }

    /// Prints a note: `value` as JSON, `text` in the table.
    pub fn note(&mut self, value: Value, text: String) {
        if self.json {
            println!("{value}");
        } else {
            println!("{text}");
        }
    }

    /// Prints a `skipped` line (a baseline that is not installed; not a failure).
    pub fn skipped(&mut self, system: &str, peers: Option<usize>, reason: &str) {
        let label = label(system, peers);
        self.note(
            json!({"kind": "skipped", "system": system, "peers": peers, "reason": reason}),
            format!("{label}: skipped: {reason}"),
        );
    }

    /// Prints a `failed` line and remembers the failure: the run will exit with an error.
    pub fn failed(&mut self, system: &str, peers: Option<usize>, error: &str) {
        let label = label(system, peers);
        self.note(
            json!({"kind": "failed", "system": system, "peers": peers, "error": error}),
            format!("{label}: FAILED: {error}"),
        );
        self.failures.push(format!("{label}: {error}"));
    }
}

fn label(system: &str, peers: Option<usize>) -> String {
    match peers {
        Some(peers) => format!("{system} ({peers} peers)"),
        None => system.to_string(),
    }
}

/// What became of the Redis baseline of one mode, which says why a ratio has no figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisState {
    /// Not run (`--no-redis`): ratio lines are left out.
    Skipped,
    /// `redis-server` or `redis-benchmark` is not installed.
    NotInstalled,
    /// It ran; a missing figure means that configuration failed or has no counterpart.
    Ran,
}

impl RedisState {
    /// Why a ratio has no Redis figure (`None`: leave the ratio out).
    fn missing(self) -> Option<&'static str> {
        match self {
            RedisState::Skipped => None,
            RedisState::NotInstalled => Some("redis not installed"),
            RedisState::Ran => Some("no redis figure for this configuration (see failed lines)"),
        }
    }
}

/// `Ok` if nothing failed, else an error naming every failure.
pub fn outcome(failures: &[String]) -> Result<(), String> {
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

/// The target for a Myriad row, if it has one.
fn target(row: &KvRow) -> Option<f64> {
    if row.driver != DriverKind::Threads {
        return None;
    }
    match (row.mode, row.op, row.depth) {
        (Mode::None, _, 1) => Some(1.5),
        (Mode::None, _, _) => Some(3.0),
        (Mode::Async | Mode::Replicated, "put", 1) => Some(1.0),
        _ => None,
    }
}

/// Myriad / Redis ratios at equal durability mode, client count and depth, same driver
/// shape. A Myriad row whose Redis counterpart is missing gets a line with `ratio: null`
/// and the reason in `missing` (none when Redis was skipped on purpose).
pub fn ratios(rows: &[KvRow], redis_state: impl Fn(Mode) -> RedisState) -> Vec<Value> {
    let mut out = Vec::new();
    for myriad in rows.iter().filter(|r| r.system == "myriad") {
        let redis = rows.iter().find(|r| {
            r.system == "redis"
                && r.mode == myriad.mode
                && r.driver == myriad.driver.redis_counterpart()
                && r.op == myriad.op
                && r.clients == myriad.clients
                && r.depth == myriad.depth
        });
        let what = format!(
            "{} {} x{} ({} clients, {} driver) vs redis {} {}",
            myriad.mode.name(),
            myriad.op,
            myriad.depth,
            myriad.clients,
            myriad.driver.name(),
            myriad.driver.redis_counterpart().name(),
            myriad.mode.redis_setup(),
        );
        let target = target(myriad);
        let mut line = json!({
            "kind": "ratio",
            "what": what,
            "mode": myriad.mode.name(),
            "driver": myriad.driver.name(),
            "peers": myriad.peers,
            "clients": myriad.clients,
            "threads": myriad.clients,
            "op": myriad.op,
            "depth": myriad.depth,
            "inflight": myriad.inflight(),
            "myriad_ops_per_sec": myriad.ops_per_sec.round(),
            "target": target,
        });
        match redis {
            Some(redis) => {
                let ratio = myriad.ops_per_sec / redis.ops_per_sec.max(1e-9);
                line["redis_ops_per_sec"] = json!(redis.ops_per_sec.round());
                // Four decimals: a tiny ratio must not print as 0.
                line["ratio"] = json!((ratio * 1e4).round() / 1e4);
                line["met"] = json!(target.map(|t| ratio >= t));
                if let (Some(m), Some(r)) =
                    (myriad.server_cpu_s_per_mop, redis.server_cpu_s_per_mop)
                {
                    line["server_cpu_ratio"] = json!(round2(m / r.max(1e-9)));
                }
            }
            None => {
                let Some(missing) = redis_state(myriad.mode).missing() else {
                    continue;
                };
                line["redis_ops_per_sec"] = Value::Null;
                line["ratio"] = Value::Null;
                line["met"] = Value::Null;
                line["missing"] = json!(missing);
            }
        }
        out.push(line);
    }
    out
}

/// TLS / plain ratios (`bench kv --tls`): each `myriad-tls` row against the plain
/// `myriad` row of equal mode, driver, peers, op, clients and depth: throughput, p50 and
/// p99 latency and server CPU per operation, TLS divided by plain (a throughput below 1
/// and latencies above 1 are TLS's cost). A TLS row without its plain row gets no line.
pub fn tls_ratios(rows: &[KvRow]) -> Vec<Value> {
    let ratio = |tls: f64, plain: f64| {
        let value = tls / plain.max(1e-9);
        if value.is_finite() {
            json!((value * 1e4).round() / 1e4)
        } else {
            Value::Null
        }
    };
    let mut out = Vec::new();
    for tls in rows.iter().filter(|r| r.system == "myriad-tls") {
        let Some(plain) = rows.iter().find(|r| {
            r.system == "myriad"
                && r.mode == tls.mode
                && r.driver == tls.driver
                && r.peers == tls.peers
                && r.op == tls.op
                && r.clients == tls.clients
                && r.depth == tls.depth
        }) else {
            continue;
        };
        let what = format!(
            "{} {} x{} ({} clients, {} driver, {} B)",
            tls.mode.name(),
            tls.op,
            tls.depth,
            tls.clients,
            tls.driver.name(),
            tls.object_bytes,
        );
        let mut line = json!({
            "kind": "tls_ratio",
            "what": what,
            "mode": tls.mode.name(),
            "driver": tls.driver.name(),
            "peers": tls.peers,
            "op": tls.op,
            "object_bytes": tls.object_bytes,
            "clients": tls.clients,
            "depth": tls.depth,
            "plain_ops_per_sec": plain.ops_per_sec.round(),
            "tls_ops_per_sec": tls.ops_per_sec.round(),
            "throughput_ratio": ratio(tls.ops_per_sec, plain.ops_per_sec),
            "p50_ratio": ratio(tls.p50_us, plain.p50_us),
            "p99_ratio": ratio(tls.p99_us, plain.p99_us),
        });
        if let (Some(t), Some(p)) = (tls.server_cpu_s_per_mop, plain.server_cpu_s_per_mop) {
            line["server_cpu_ratio"] = ratio(t, p);
        }
        out.push(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &'static str, mode: Mode, driver: DriverKind, op: &'static str) -> KvRow {
        KvRow {
            system,
            mode,
            driver,
            peers: (system == "myriad").then_some(1),
            op,
            object_bytes: 64,
            clients: 8,
            depth: 1,
            ops_per_sec: 100.0,
            p50_us: 10.0,
            p99_us: 20.0,
            latency: "per_call",
            server_cpu_s_per_mop: Some(2.0),
            client_cpu_s_per_mop: None,
        }
    }

    #[test]
    fn ratios_pair_equal_mode_driver_clients_and_depth() {
        let mut fast = row("myriad", Mode::None, DriverKind::Threads, "get");
        fast.ops_per_sec = 300.0;
        let mut batched = row("myriad", Mode::None, DriverKind::Threads, "put");
        batched.depth = 16;
        batched.ops_per_sec = 1000.0;
        let mut redis_batched = row("redis", Mode::None, DriverKind::Threads, "put");
        redis_batched.depth = 16;
        redis_batched.ops_per_sec = 500.0;
        let mut async_put = row("myriad", Mode::Async, DriverKind::Async, "put");
        async_put.ops_per_sec = 50.0;
        let rows = vec![
            fast,
            batched,
            async_put,
            row("redis", Mode::None, DriverKind::Threads, "get"),
            // Same op and depth in another mode or driver must not be paired.
            row("redis", Mode::Async, DriverKind::Threads, "put"),
            row("redis", Mode::Async, DriverKind::RedisBenchmark, "put"),
            redis_batched,
        ];
        let lines = ratios(&rows, |_| RedisState::Ran);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["ratio"], 3.0);
        assert_eq!(lines[0]["target"], 1.5);
        assert_eq!(lines[0]["met"], true);
        assert_eq!(lines[1]["ratio"], 2.0);
        assert_eq!(lines[1]["target"], 3.0);
        assert_eq!(lines[1]["met"], false);
        assert_eq!(lines[2]["ratio"], 0.5);
        assert!(
            lines[2]["target"].is_null(),
            "async driver rows have no target"
        );
        assert_eq!(lines[2]["server_cpu_ratio"], 1.0);
    }

    #[test]
    fn ratio_lines_do_not_vanish_when_a_redis_figure_is_missing() {
        let rows = vec![row("myriad", Mode::Replicated, DriverKind::Threads, "put")];
        let lines = ratios(&rows, |_| RedisState::Ran);
        assert_eq!(lines.len(), 1);
        assert!(lines[0]["ratio"].is_null());
        assert_eq!(lines[0]["target"], 1.0);
        assert!(lines[0]["missing"].is_string());
        let lines = ratios(&rows, |_| RedisState::NotInstalled);
        assert_eq!(lines[0]["missing"], "redis not installed");
        assert!(ratios(&rows, |_| RedisState::Skipped).is_empty());
    }

    #[test]
    fn tls_ratios_pair_each_tls_row_with_its_plain_row() {
        let plain_get = row("myriad", Mode::None, DriverKind::Threads, "get");
        let mut tls_get = row("myriad-tls", Mode::None, DriverKind::Threads, "get");
        tls_get.peers = plain_get.peers;
        tls_get.ops_per_sec = 80.0;
        tls_get.p50_us = 12.0;
        let mut tls_put = tls_get.clone();
        tls_put.op = "put";
        let rows = vec![
            plain_get,
            row("redis", Mode::None, DriverKind::Threads, "get"),
            tls_get,
            // No plain put row: no line.
            tls_put,
        ];
        let lines = tls_ratios(&rows);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["kind"], "tls_ratio");
        assert_eq!(lines[0]["op"], "get");
        assert_eq!(lines[0]["throughput_ratio"], 0.8);
        assert_eq!(lines[0]["p50_ratio"], 1.2);
        assert_eq!(lines[0]["p99_ratio"], 1.0);
        // TLS rows are not paired with Redis.
        assert_eq!(ratios(&rows, |_| RedisState::Ran).len(), 1);
    }

    #[test]
    fn any_failure_fails_the_run_and_names_it() {
        assert_eq!(outcome(&[]), Ok(()));
        let mut printer = Printer::new(true);
        printer.skipped("memcached", None, "memcached not found");
        assert!(printer.failures.is_empty());
        printer.failed("myriad", Some(3), "preload: timed out");
        printer.failed("redis", None, "-c 8 -P 16: exit status: 1");
        let error = outcome(&printer.failures).expect_err("fails");
        assert!(error.contains("2 part(s) failed"), "{error}");
        assert!(
            error.contains("myriad (3 peers): preload: timed out"),
            "{error}"
        );
        assert!(error.contains("redis: -c 8 -P 16"), "{error}");
    }

    #[test]
    fn json_rows_carry_the_required_fields() {
        let value = row("redis", Mode::Durable, DriverKind::Threads, "get").to_json();
        for field in [
            "op",
            "mode",
            "driver",
            "object_bytes",
            "clients",
            "depth",
            "inflight",
            "ops_per_sec",
            "p50_us",
            "p99_us",
            "system",
            "server_cpu_s_per_mop",
            "client_cpu_s_per_mop",
        ] {
            assert!(value.get(field).is_some(), "{field}");
        }
        assert_eq!(value["mode"], "durable");
        assert_eq!(value["inflight"], 8);
    }
}
