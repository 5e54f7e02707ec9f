//! The Redis baseline of `bench kv`: `redis-server`s started here on free 127.0.0.1
//! ports, configured for the durability of the Myriad mode they are compared with, driven
//! two ways.
//!
//! # Durability per mode ([`Mode`])
//! - `none`: one server, no persistence (`--save "" --appendonly no`).
//! - `async`: one server with AOF `everysec` (a write is on disk within about a second).
//! - `replicated`: a master without persistence and 2 replicas with AOF `everysec`; every
//!   write (or pipeline of writes) is followed by `WAIT 2`, so it is acknowledged once both
//!   replicas have it, as Myriad's `replicated` acknowledges once R = 2 backups have it.
//! - `durable`: as `replicated`, with `appendfsync always` on all three. Redis 7.0 has no
//!   `WAITAOF` (7.2+), so the replicas' fsync is not awaited: this baseline does less than
//!   Myriad's `durable` (whose backups fsync before acknowledging) and favours Redis.
//!
//! # Drivers
//! - **threads** ([`RedisServer::workers`]): this crate's closed-loop driver, one
//!   connection per client thread, each with one request (or one pipeline of `batch`
//!   requests, plus one `WAIT` in the replicated modes) outstanding: exactly the requests in
//!   flight of the Myriad threads it is compared with. Every GET must hit.
//! - **redis-benchmark** ([`RedisServer::benchmark_for`], modes `none` and `async`, which
//!   need no `WAIT`): `-c <connections>` clients on one event-loop thread, `-P` pipelining,
//!   `-d` object bytes, `-r <keys>` uniform keys; a short calibration run sets `-n` so a
//!   measurement lasts about `--duration-secs`. Its latencies are per request. It is the
//!   counterpart of Myriad's async driver (many requests in flight from one thread).
//!
//! A missing binary is a skip (`None`), never a failure of the whole bench.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::driver::WorkerFn;
use super::memcached::key_name;
use super::resp::{Reply, RespConnection};
use super::Mode;
/// One line of `redis-benchmark --csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisCsvRow {
    /// The test name (`SET`, `GET`, ...).
    pub test: String,
    /// Requests per second.
    pub rps: f64,
    /// Median request latency, ms.
    pub p50_ms: f64,
    /// 99th percentile request latency, ms.
    pub p99_ms: f64,
}

/// Parses `redis-benchmark --csv` output (the 7.x form with a header line naming the
/// columns `test`, `rps`, `p50_latency_ms`, `p99_latency_ms`; older two-column
/// `"TEST","rps"` lines are accepted with latencies of NaN).
pub fn parse_csv(text: &str) -> Result<Vec<RedisCsvRow>, String> {
    let mut columns: Option<Vec<String>> = None;
    let mut rows = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<String> = line
            .split(',')
            .map(|f| f.trim().trim_matches('"').to_string())
            .collect();
        if fields.first().is_some_and(|f| f == "test") {
            columns = Some(fields);
            continue;
        }
        let index_of = |name: &str| {
            columns
                .as_ref()
                .and_then(|c| c.iter().position(|column| column == name))
        };
        let number = |index: Option<usize>| -> Result<f64, String> {
            match index {
                Some(i) => fields
                    .get(i)
                    .ok_or_else(|| format!("short CSV line {line:?}"))?
                    .parse::<f64>()
                    .map_err(|_| format!("bad number in CSV line {line:?}")),
                None => Ok(f64::NAN),
            }
        };
        let test = fields
            .first()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| format!("CSV line without a test name: {line:?}"))?
            .clone();
        rows.push(RedisCsvRow {
            test,
            rps: number(index_of("rps").or(Some(1)))?,
            p50_ms: number(index_of("p50_latency_ms"))?,
            p99_ms: number(index_of("p99_latency_ms"))?,
        });
    }
    if rows.is_empty() {
        return Err(format!("no results in redis-benchmark output: {text:?}"));
    }
    Ok(rows)
}

/// Finds `binary` on `PATH`.
pub fn on_path(binary: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(binary).is_file()))
}

/// Kills and reaps a child on drop.
pub(crate) struct ChildGuard(pub(crate) Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free port on 127.0.0.1 (bound, read, released).
pub(crate) fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

/// Waits until something accepts connections on `port`.
pub(crate) fn wait_listening(port: u16, what: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err(format!("{what} did not start listening on port {port}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Redis replicas of the replicated modes.
const REPLICAS: usize = 2;
/// How long a `WAIT` may block before the write counts as failed, ms.
const WAIT_TIMEOUT_MS: &str = "5000";
/// Keys per pipeline while preloading.
const PRELOAD_PIPELINE: u64 = 1_000;

/// A running `redis-server` set (master plus replicas in the replicated modes), killed on
/// drop; its AOF directory is removed on drop.
pub struct RedisServer {
    port: u16,
    mode: Mode,
    pids: Vec<u32>,
    dir: PathBuf,
    _children: Vec<ChildGuard>,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // The children are killed by their guards (dropped after this body).
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn_redis(port: u16, dir: &std::path::Path, extra: &[&str]) -> Result<ChildGuard, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("redis dir {}: {e}", dir.display()))?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--daemonize", "no", "--dir"])
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting redis-server: {e}"))?;
    let guard = ChildGuard(child);
    wait_listening(port, "redis-server")?;
    Ok(guard)
}

/// The persistence arguments of a server in `mode` (`master`: the one clients write to).
fn persistence_args(mode: Mode, master: bool) -> &'static [&'static str] {
    match (mode, master) {
        (Mode::None, _) | (Mode::Replicated, true) => &["--appendonly", "no"],
        (Mode::Async, _) | (Mode::Replicated, false) => {
            &["--appendonly", "yes", "--appendfsync", "everysec"]
        }
        (Mode::Durable, _) => &["--appendonly", "yes", "--appendfsync", "always"],
    }
}

/// Waits until the master reports `count` replicas online.
fn wait_replicas_online(port: u16, count: usize) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut connection = RespConnection::connect(port)?;
    loop {
        let info = match connection.call(&[b"INFO", b"replication"])? {
            Reply::Bulk(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            other => return Err(format!("INFO replication answered {other:?}")),
        };
        let online = info
            .lines()
            .filter(|line| line.starts_with("slave") && line.contains("state=online"))
            .count();
        if online >= count {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {online} of {count} redis replicas came online"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl RedisServer {
    /// Starts the servers of `mode`; `Ok(None)` if `redis-server` or `redis-benchmark` is
    /// not installed.
    pub fn start(mode: Mode) -> Result<Option<RedisServer>, String> {
        if !on_path("redis-server") || !on_path("redis-benchmark") {
            return Ok(None);
        }
        let dir = std::env::temp_dir().join(format!(
            "myriad-bench-kv-redis-{}-{}",
            std::process::id(),
            mode.name()
        ));
        let port = free_port()?;
        let mut children = vec![spawn_redis(
            port,
            &dir.join("master"),
            persistence_args(mode, true),
        )?];
        if mode.replicated() {
            let master = port.to_string();
            for replica in 0..REPLICAS {
                let mut args = persistence_args(mode, false).to_vec();
                args.extend(["--replicaof", "127.0.0.1", &master]);
                let replica_port = free_port()?;
                children.push(spawn_redis(
                    replica_port,
                    &dir.join(format!("replica-{replica}")),
                    &args,
                )?);
            }
            wait_replicas_online(port, REPLICAS)?;
        }
        let pids = children.iter().map(|child| child.0.id()).collect();
        Ok(Some(RedisServer {
            port,
            mode,
            pids,
            dir,
            _children: children,
        }))
    }

    /// The PIDs of every server process (master first).
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// Stores every key of `0..keys` with an `object_bytes` value (pipelined, then awaited
    /// on the replicas in the replicated modes).
    pub fn preload(&self, keys: u64, object_bytes: usize) -> Result<(), String> {
        let mut connection = RespConnection::connect(self.port)?;
        let value = vec![0x5a_u8; object_bytes];
        let mut next = 0;
        while next < keys {
            let end = (next + PRELOAD_PIPELINE).min(keys);
            let names: Vec<String> = (next..end).map(key_name).collect();
            for name in &names {
                connection.queue(&[b"SET", name.as_bytes(), &value]);
            }
            connection.flush()?;
            for _ in &names {
                expect_ok(connection.read_reply()?)?;
            }
            next = end;
        }
        if self.mode.replicated() {
            expect_replicas(connection.call(&[b"WAIT", b"2", WAIT_TIMEOUT_MS.as_bytes()])?)?;
        }
        Ok(())
    }

    /// One closed-loop worker per thread, each with its own connection: a call with `B`
    /// keys sends `B` GETs or SETs in one write (plus `WAIT 2` after the SETs in the
    /// replicated modes) and reads every reply.
    pub fn workers(
        &self,
        threads: usize,
        object_bytes: usize,
        get: bool,
    ) -> Result<Vec<WorkerFn>, String> {
        let wait = self.mode.replicated() && !get;
        (0..threads)
            .map(|_| {
                let mut connection = RespConnection::connect(self.port)?;
                let value = vec![0xa5_u8; object_bytes];
                let worker: WorkerFn = Box::new(move |keys: &[u64]| {
                    for &key in keys {
                        let name = key_name(key);
                        if get {
                            connection.queue(&[b"GET", name.as_bytes()]);
                        } else {
                            connection.queue(&[b"SET", name.as_bytes(), &value]);
                        }
                    }
                    if wait {
                        connection.queue(&[b"WAIT", b"2", WAIT_TIMEOUT_MS.as_bytes()]);
                    }
                    connection.flush()?;
                    for _ in keys {
                        let reply = connection.read_reply()?;
                        if get {
                            match reply {
                                Reply::Bulk(Some(bytes)) if bytes.len() == object_bytes => {}
                                other => return Err(format!("redis GET answered {other:?}")),
                            }
                        } else {
                            expect_ok(reply)?;
                        }
                    }
                    if wait {
                        expect_replicas(connection.read_reply()?)?;
                    }
                    Ok(())
                });
                Ok(worker)
            })
            .collect()
    }

    /// Runs `redis-benchmark -t <test>` (`set` or `get`) with `clients` connections,
    /// pipeline `pipeline`, `object_bytes` values over `keys` random keys, `requests`
    /// requests.
    pub fn benchmark(
        &self,
        test: &str,
        clients: usize,
        pipeline: usize,
        (object_bytes, keys): (usize, u64),
        requests: u64,
    ) -> Result<Vec<RedisCsvRow>, String> {
        let output = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-t", test, "-d", &object_bytes.to_string()])
            .args(["-P", &pipeline.to_string(), "-c", &clients.to_string()])
            .args(["-r", &keys.to_string(), "-n", &requests.to_string()])
            .args(["--csv"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running redis-benchmark: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "redis-benchmark failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        parse_csv(&String::from_utf8_lossy(&output.stdout))
    }

    /// Like [`benchmark`](Self::benchmark), with the request count chosen by a short
    /// calibration run so that the test lasts about `duration`; also returns the CPU
    /// seconds the servers used during the measured run (not the calibration) and its
    /// request count.
    pub fn benchmark_for(
        &self,
        test: &str,
        clients: usize,
        pipeline: usize,
        (object_bytes, keys): (usize, u64),
        duration: Duration,
    ) -> Result<(RedisCsvRow, f64, u64), String> {
        let calibration_requests = (5_000 * pipeline as u64).max(10_000);
        let calibration = self.benchmark(
            test,
            clients,
            pipeline,
            (object_bytes, keys),
            calibration_requests,
        )?;
        let rate = calibration
            .first()
            .map(|row| row.rps)
            .filter(|rps| rps.is_finite() && *rps > 0.0)
            .unwrap_or(50_000.0);
        let requests = (rate * duration.as_secs_f64()).clamp(10_000.0, 100_000_000.0) as u64;
        let mark = super::cpu::CpuMark::now(&self.pids)?;
        let rows = self.benchmark(test, clients, pipeline, (object_bytes, keys), requests)?;
        let (cpu_secs, _) = mark.since()?;
        let row = rows
            .into_iter()
            .next()
            .ok_or_else(|| format!("redis-benchmark -t {test} printed no result"))?;
        Ok((row, cpu_secs, requests))
    }
}

fn expect_ok(reply: Reply) -> Result<(), String> {
    match reply {
        Reply::Simple(text) if text == "OK" => Ok(()),
        other => Err(format!("redis SET answered {other:?}")),
    }
}

fn expect_replicas(reply: Reply) -> Result<(), String> {
    match reply {
        Reply::Integer(acked) if acked >= REPLICAS as i64 => Ok(()),
        other => Err(format!(
            "redis WAIT {REPLICAS} answered {other:?} within {WAIT_TIMEOUT_MS} ms"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis_7_csv() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"SET\",\"307692.31\",\"0.095\",\"0.032\",\"0.087\",\"0.159\",\"0.231\",\"0.295\"\n\
                    \"GET\",\"476190.47\",\"0.060\",\"0.024\",\"0.063\",\"0.087\",\"0.111\",\"0.183\"\n";
        let rows = parse_csv(text).expect("parse");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].test, "SET");
        assert_eq!(rows[1].rps, 476190.47);
        assert_eq!(rows[1].p50_ms, 0.063);
        assert_eq!(rows[1].p99_ms, 0.111);
    }

    #[test]
    fn parses_old_two_column_csv() {
        let rows =
            parse_csv("\"PING_INLINE\",\"90090.09\"\n\"GET\",\"88000.00\"\n").expect("parse");
        assert_eq!(rows[1].test, "GET");
        assert_eq!(rows[1].rps, 88000.0);
        assert!(rows[1].p50_ms.is_nan());
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_csv("").is_err());
        assert!(parse_csv("\"test\",\"rps\"\n\"GET\",\"fast\"\n").is_err());
        assert!(parse_csv("\"test\",\"rps\",\"p50_latency_ms\"\n\"GET\",\"1\"\n").is_err());
    }
}
