//! The Redis baseline of `bench kv`: `redis-benchmark` against a `redis-server` started
//! here on a free 127.0.0.1 port without persistence.
//!
//! # Mapping to the Myriad runs
//! - `-c <threads>`: redis-benchmark opens that many connections (its clients), each
//!   with one request (or one pipeline of `-P` requests) outstanding: the same client
//!   concurrency as `threads` closed-loop threads with one call outstanding each. Its
//!   clients share one event-loop thread (`--threads` is left at 1).
//! - `-P 1` is the single-operation baseline, `-P 16` the batched one; `-d 64` the object
//!   size; `-r <keys>` spreads keys uniformly over the same key-space size. SET runs first
//!   (`-t set,get`) so GETs find values.
//! - redis-benchmark runs a request count, not a duration: a short calibration run sets
//!   `-n` so each measurement lasts about `--duration-secs`.
//! - Its latencies are per request (in a pipeline: from the pipeline's send to that
//!   request's reply), reported from the CSV's `p50_latency_ms` and `p99_latency_ms`.
//!
//! A missing binary is a skip (`None`), never a failure of the whole bench.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// A running `redis-server` (killed on drop).
pub struct RedisServer {
    port: u16,
    _child: ChildGuard,
}

impl RedisServer {
    /// Starts `redis-server` on a free port, no persistence; `Ok(None)` if `redis-server` or
    /// `redis-benchmark` is not installed.
    pub fn start() -> Result<Option<RedisServer>, String> {
        if !on_path("redis-server") || !on_path("redis-benchmark") {
            return Ok(None);
        }
        let port = free_port()?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting redis-server: {e}"))?;
        let guard = ChildGuard(child);
        wait_listening(port, "redis-server")?;
        Ok(Some(RedisServer {
            port,
            _child: guard,
        }))
    }

    /// Runs `redis-benchmark -t set,get` with `clients` connections, pipeline `pipeline`,
    /// `object_bytes` values over `keys` random keys, `requests` requests per test.
    pub fn benchmark(
        &self,
        clients: usize,
        pipeline: usize,
        object_bytes: usize,
        keys: u64,
        requests: u64,
    ) -> Result<Vec<RedisCsvRow>, String> {
        let output = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-t", "set,get", "-d", &object_bytes.to_string()])
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
    /// calibration run so that each test lasts about `duration`.
    pub fn benchmark_for(
        &self,
        clients: usize,
        pipeline: usize,
        object_bytes: usize,
        keys: u64,
        duration: Duration,
    ) -> Result<Vec<RedisCsvRow>, String> {
        let calibration_requests = (5_000 * pipeline as u64).max(10_000);
        let calibration =
            self.benchmark(clients, pipeline, object_bytes, keys, calibration_requests)?;
        let slowest = calibration
            .iter()
            .map(|row| row.rps)
            .filter(|rps| rps.is_finite() && *rps > 0.0)
            .fold(f64::INFINITY, f64::min);
        let rate = if slowest.is_finite() {
            slowest
        } else {
            50_000.0
        };
        let requests = (rate * duration.as_secs_f64()).clamp(10_000.0, 100_000_000.0) as u64;
        self.benchmark(clients, pipeline, object_bytes, keys, requests)
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
