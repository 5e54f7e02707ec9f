//! `myriad bench net`: the messaging layer between two processes on 127.0.0.1.
//!
//! The parent process (node 1) spawns itself as a hidden `bench net-server` child (node
//! 2), which prints its listen address and serves until its stdin closes; the parent kills
//! it at the end, also on error (a guard's `Drop`). Measured, in this order:
//! one-way 64-byte message rate with 1 and 2 sending threads (with CPU seconds of both
//! processes per million messages); 64-byte request/response round trip with one
//! outstanding request (p50/p99/p99.9); request throughput with many outstanding requests
//! (pipelined, 1 and 2 threads); 1 KB and 1 MB one-way throughput; the child's CPU use
//! while idle. Baselines in the same run: a raw TCP blast between two plain sockets, and
//! `redis-benchmark` against a local `redis-server` (PING and 64-byte GET, pipelined 16)
//! when both binaries are installed (otherwise `null`, with `status` "not installed", or
//! "failed" and the `error` that says what failed). Reference figures: the issue's targets
//! and Java DXNet's numbers for this machine kind, from an earlier run and labelled so
//! (`dxnet_source`) wherever a ratio divides by them.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use myriad_net::{Bytes, Config, Endpoint, Handlers, Incoming, MessageType, NetHandle, TlsConfig};
use myriad_types::NodeId;
use serde_json::{json, Value};

use crate::process;
use crate::tool::{self, ToolError};

/// Sink: counts messages and bytes.
const SINK: MessageType = MessageType::unordered(1, 1);
/// Echo: answers with the request's payload.
const ECHO: MessageType = MessageType::unordered(1, 2);
/// Answers with the sink's message and byte counts (two little-endian u64).
const COUNTS: MessageType = MessageType::unordered(1, 3);
/// Echo with an inline handler (runs on the server's I/O thread).
const ECHO_INLINE: MessageType = MessageType::unordered(1, 4);

const CLIENT: NodeId = NodeId(1);
const SERVER: NodeId = NodeId(2);
const SECRET: &str = "myriad bench net";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the server to report all messages received.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Targets from the issue.
const TARGET_MSG64_PER_SEC: f64 = 2.0e6;
const TARGET_RTT_P50_US: f64 = 30.0;
const TARGET_MB1_SHARE_OF_RAW: f64 = 0.7;
/// Java DXNet on this machine kind (from the issue): one-way 64-byte messages per second
/// with 1 and 2 sending threads, and the mean and p99 request round trip. Measured in an
/// earlier run, not this one: every line that divides by them says so (`dxnet_source`).
const DXNET_MSG64_PER_SEC_1T: f64 = 0.66e6;
const DXNET_MSG64_PER_SEC_2T: f64 = 0.95e6;
const DXNET_RTT_MEAN_US: (f64, f64) = (4_600.0, 6_900.0);
const DXNET_RTT_P99_US: f64 = 28_000.0;
/// Where the DXNet figures come from, printed beside every ratio to them.
pub const DXNET_SOURCE: &str =
    "DXNet figure from an earlier run on this machine kind (the issue), not measured in this run";

/// Options of `myriad bench net`.
#[derive(clap::Args, Debug, Clone)]
pub struct NetArgs {
    /// One-way 64-byte messages per rate measurement.
    #[arg(long, default_value_t = 4_000_000)]
    pub messages: u64,
    /// Round trips timed for the latency percentiles.
    #[arg(long, default_value_t = 50_000)]
    pub round_trips: u64,
    /// Requests per pipelined throughput measurement.
    #[arg(long, default_value_t = 1_000_000)]
    pub requests: u64,
    /// Outstanding requests per thread in the pipelined measurement.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// Bytes per throughput measurement (1 KB and 1 MB messages, raw TCP blast).
    #[arg(long, default_value_t = 2 << 30)]
    pub throughput_bytes: u64,
    /// I/O threads of each endpoint (client and server).
    #[arg(long, default_value_t = 1)]
    pub io_threads: usize,
    /// Skip the redis baseline.
    #[arg(long)]
    pub no_redis: bool,
    /// Print one JSON object per line (the last one holds every headline figure).
    #[arg(long)]
    pub json: bool,
    /// Measure again with TLS on both endpoints (a fresh CA in a temporary directory) in
    /// the same run, and print every headline figure plain and with TLS, with the ratio.
    #[arg(long)]
    pub tls: bool,
}

/// Options of the hidden server half (`myriad bench net-server`).
#[derive(clap::Args, Debug, Clone)]
pub struct NetServerArgs {
    /// Handler threads of the server endpoint.
    #[arg(long, default_value_t = 2)]
    pub handler_threads: usize,
    /// I/O threads of the server endpoint.
    #[arg(long, default_value_t = 1)]
    pub io_threads: usize,
    /// TLS directory (`myriad cert`) and certificate name of the server endpoint.
    #[arg(long)]
    pub tls_dir: Option<std::path::PathBuf>,
}

/// Runs the server half: prints `LISTEN <addr>` and serves until stdin closes.
pub fn serve(args: &NetServerArgs) -> Result<(), String> {
    let messages = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let mut handlers = Handlers::new();
    {
        let (messages, bytes) = (messages.clone(), bytes.clone());
        handlers
            .register(SINK, move |message: Incoming| {
                bytes.fetch_add(message.payload.len() as u64, Ordering::Relaxed);
                messages.fetch_add(1, Ordering::Release);
            })
            .map_err(|e| e.to_string())?;
    }
    handlers
        .register(ECHO, |request: Incoming| {
            let payload = request.payload.clone();
            let _ = request.respond(payload);
        })
        .map_err(|e| e.to_string())?;
    handlers
        .register_inline(ECHO_INLINE, |request: Incoming| {
            let payload = request.payload.clone();
            let _ = request.respond(payload);
        })
        .map_err(|e| e.to_string())?;
    handlers
        .register(COUNTS, move |request: Incoming| {
            let mut answer = Vec::with_capacity(16);
            answer.extend_from_slice(&messages.load(Ordering::Acquire).to_le_bytes());
            answer.extend_from_slice(&bytes.load(Ordering::Relaxed).to_le_bytes());
            let _ = request.respond(Bytes::from(answer));
        })
        .map_err(|e| e.to_string())?;
    let mut config = Config::new(SERVER, SocketAddr::from(([127, 0, 0, 1], 0)), SECRET);
    config.handler_threads = args.handler_threads;
    config.io_threads = args.io_threads;
    if let Some(dir) = &args.tls_dir {
        config.tls = Some(TlsConfig::from_dir(dir, "server").map_err(|e| e.to_string())?);
    }
    let endpoint = Endpoint::start(config, handlers).map_err(|e| e.to_string())?;
    println!("LISTEN {}", endpoint.local_addr());
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    // Serve until the parent closes our stdin (or dies).
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    Ok(())
}

/// A child process killed and reaped when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_server(
    io_threads: usize,
    tls_dir: Option<&std::path::Path>,
) -> Result<(ChildGuard, SocketAddr), String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mut command = Command::new(exe);
    command.args([
        "bench",
        "net-server",
        "--io-threads",
        &io_threads.to_string(),
    ]);
    if let Some(dir) = tls_dir {
        command.arg("--tls-dir").arg(dir);
    }
    let child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawning the server process: {e}"))?;
    let mut guard = ChildGuard(child);
    let stdout = guard.0.stdout.take().ok_or("server stdout missing")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| format!("reading the server address: {e}"))?;
    let addr = line
        .trim()
        .strip_prefix("LISTEN ")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("server said {line:?}, expected LISTEN <addr>"))?;
    Ok((guard, addr))
}

struct Report {
    json: bool,
    summary: serde_json::Map<String, Value>,
}

impl Report {
    fn line(&mut self, measure: &str, fields: Value, text: String) {
        if self.json {
            let mut object = json!({ "bench": "net", "measure": measure });
            if let (Some(object), Value::Object(fields)) = (object.as_object_mut(), fields) {
                object.extend(fields);
            }
            println!("{object}");
        } else {
            println!("{text}");
        }
    }

    fn headline(&mut self, key: &str, value: Option<f64>) {
        self.summary.insert(key.to_string(), json!(value));
    }
}

fn counts(net: &NetHandle) -> Result<(u64, u64), String> {
    let answer = net
        .request_blocking(SERVER, COUNTS, Bytes::new(), REQUEST_TIMEOUT)
        .map_err(|e| format!("counts request: {e}"))?;
    let field = |range: std::ops::Range<usize>| {
        answer
            .get(range)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
            .ok_or("short counts answer")
    };
    Ok((field(0..8)?, field(8..16)?))
}

/// What one one-way run measured.
struct OneWay {
    seconds: f64,
    cpu_seconds: f64,
    frames_per_write: f64,
}

/// Sends `total` messages of `payload` from `threads` threads; measures the seconds until
/// the server has handled them all, the CPU seconds both processes used meanwhile, and the
/// client's frames per write call.
fn one_way(
    net: &NetHandle,
    server_pid: &str,
    payload: &Bytes,
    total: u64,
    threads: u64,
) -> Result<OneWay, String> {
    let (start_count, _) = counts(net)?;
    let stats_before = net.connection_stats(SERVER);
    let cpu_before = process::cpu_seconds() + process::cpu_seconds_of(server_pid);
    let started = Instant::now();
    let per_thread = total / threads;
    let sent: Result<(), String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(move || -> Result<(), String> {
                    for _ in 0..per_thread {
                        net.send_blocking(SERVER, SINK, payload.clone())
                            .map_err(|e| format!("send: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|worker| worker.join().map_err(|_| "sender panicked".to_string())?)
    });
    sent?;
    let expected = start_count + per_thread * threads;
    loop {
        let (count, _) = counts(net)?;
        if count >= expected {
            break;
        }
        if started.elapsed() > DRAIN_TIMEOUT {
            return Err(format!("server saw {count} of {expected} messages"));
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = process::cpu_seconds() + process::cpu_seconds_of(server_pid) - cpu_before;
    let frames_per_write = match (stats_before, net.connection_stats(SERVER)) {
        (Some(before), Some(after)) => ratio(
            (after.frames_sent - before.frames_sent) as f64,
            (after.write_calls - before.write_calls) as f64,
        ),
        _ => f64::NAN,
    };
    Ok(OneWay {
        seconds,
        cpu_seconds,
        frames_per_write,
    })
}

fn new_histogram() -> Result<Histogram<u64>, String> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())
}

/// Round trips from a plain thread with the blocking API to a pool handler.
fn round_trips(net: &NetHandle, count: u64) -> Result<Histogram<u64>, String> {
    let payload = Bytes::from(vec![0x5a; 64]);
    let mut histogram = new_histogram()?;
    for _ in 0..count / 10 {
        net.request_blocking(SERVER, ECHO, payload.clone(), REQUEST_TIMEOUT)
            .map_err(|e| format!("warm-up echo: {e}"))?;
    }
    for _ in 0..count {
        let started = Instant::now();
        net.request_blocking(SERVER, ECHO, payload.clone(), REQUEST_TIMEOUT)
            .map_err(|e| format!("echo: {e}"))?;
        histogram.saturating_record(started.elapsed().as_nanos() as u64);
    }
    Ok(histogram)
}

/// Round trips from a task on the endpoint's runtime with the async API to an inline
/// handler: the low-latency path (one thread wake-up per direction).
fn round_trips_async_inline(net: &NetHandle, count: u64) -> Result<Histogram<u64>, String> {
    let task_net = net.clone();
    let task = net.runtime().spawn(async move {
        let payload = Bytes::from(vec![0x5a; 64]);
        let mut histogram = new_histogram()?;
        for round in 0..count + count / 10 {
            let started = Instant::now();
            task_net
                .request(SERVER, ECHO_INLINE, payload.clone(), REQUEST_TIMEOUT)
                .await
                .map_err(|e| format!("async echo: {e}"))?;
            if round >= count / 10 {
                histogram.saturating_record(started.elapsed().as_nanos() as u64);
            }
        }
        Ok::<_, String>(histogram)
    });
    let (tx, rx) = std::sync::mpsc::channel();
    net.runtime().spawn(async move {
        let _ = tx.send(task.await);
    });
    rx.recv()
        .map_err(|_| "async round-trip task vanished".to_string())?
        .map_err(|e| format!("async round-trip task: {e}"))?
}

/// Raw TCP ping-pong of 64 bytes between two threads with blocking sockets (the floor for
/// any round trip on this machine).
fn raw_tcp_round_trips(count: u64) -> Result<Histogram<u64>, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        loop {
            if stream.read_exact(&mut buf).is_err() {
                return Ok(());
            }
            stream.write_all(&buf)?;
        }
    });
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut histogram = new_histogram()?;
    let mut buf = [0x5au8; 64];
    for round in 0..count + count / 10 {
        let started = Instant::now();
        stream.write_all(&buf).map_err(|e| e.to_string())?;
        stream.read_exact(&mut buf).map_err(|e| e.to_string())?;
        if round >= count / 10 {
            histogram.saturating_record(started.elapsed().as_nanos() as u64);
        }
    }
    drop(stream);
    let _ = echo.join();
    Ok(histogram)
}

fn pipelined(net: &NetHandle, total: u64, threads: u64, window: usize) -> Result<f64, String> {
    let payload = Bytes::from(vec![0x5a; 64]);
    let started = Instant::now();
    let per_thread = total / threads;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let payload = payload.clone();
                scope.spawn(move || -> Result<(), String> {
                    let mut outstanding = VecDeque::with_capacity(window);
                    for _ in 0..per_thread {
                        if outstanding.len() >= window.max(1) {
                            if let Some(pending) = outstanding.pop_front() {
                                myriad_net::PendingResponse::wait_blocking(pending)
                                    .map_err(|e| format!("pipelined echo: {e}"))?;
                            }
                        }
                        outstanding.push_back(
                            net.request_later_blocking(
                                SERVER,
                                ECHO,
                                payload.clone(),
                                REQUEST_TIMEOUT,
                            )
                            .map_err(|e| format!("pipelined request: {e}"))?,
                        );
                    }
                    for pending in outstanding {
                        pending
                            .wait_blocking()
                            .map_err(|e| format!("pipelined echo: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|worker| {
            worker
                .join()
                .map_err(|_| "requester panicked".to_string())?
        })
    })?;
    Ok((per_thread * threads) as f64 / started.elapsed().as_secs_f64())
}

/// Bytes per write and per read of the raw TCP blast.
const RAW_BLOCK_BYTES: usize = 256 << 10;

/// Raw TCP between two plain sockets on 127.0.0.1 (blocking, `RAW_BLOCK_BYTES` per call).
fn raw_tcp_blast(total_bytes: u64) -> Result<f64, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut stream, _) = listener.accept()?;
        let mut buf = vec![0u8; RAW_BLOCK_BYTES];
        let mut received = 0u64;
        loop {
            match stream.read(&mut buf)? {
                0 => return Ok(received),
                n => received += n as u64,
            }
        }
    });
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let block = vec![0x42u8; RAW_BLOCK_BYTES];
    let started = Instant::now();
    let mut sent = 0u64;
    while sent < total_bytes {
        stream.write_all(&block).map_err(|e| e.to_string())?;
        sent += block.len() as u64;
    }
    stream
        .shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    let received = reader
        .join()
        .map_err(|_| "raw reader panicked".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(received as f64 / started.elapsed().as_secs_f64() / 1e9)
}

/// `redis-benchmark` PING and 64-byte GET (after SET), 50 clients, pipelined 16, against a
/// `redis-server` started here: (PING/s, GET/s). [`ToolError::NotInstalled`] if either
/// binary is missing, [`ToolError::Failed`] (with what failed) otherwise.
fn redis_baseline(requests: u64) -> Result<(f64, f64), ToolError> {
    for binary in ["redis-server", "redis-benchmark"] {
        if !tool::on_path(binary) {
            return Err(ToolError::NotInstalled {
                tool: binary.to_string(),
            });
        }
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| ToolError::failed("redis-server", format!("no free port: {e}")))?
        .port();
    let server = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--daemonize", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ToolError::failed("redis-server", format!("could not start: {e}")))?;
    let mut server = ChildGuard(server);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = server.0.try_wait() {
            let mut stderr = Vec::new();
            if let Some(mut pipe) = server.0.stderr.take() {
                let _ = pipe.read_to_end(&mut stderr);
            }
            return Err(ToolError::failed(
                "redis-server",
                format!(
                    "exited before listening ({status}); stderr: {}",
                    tool::stderr_tail(&stderr)
                ),
            ));
        }
        if Instant::now() > deadline {
            return Err(ToolError::failed(
                "redis-server",
                format!("not listening on port {port} after 10 s"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = tool::run(
        "redis-benchmark",
        Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-t", "ping,set,get", "-d", "64", "-P", "16", "-c", "50"])
            .args(["-n", &requests.to_string(), "-q", "--csv"]),
    )?;
    let text = String::from_utf8_lossy(&output.stdout);
    let rate = |test: &str| {
        text.lines().find_map(|line| {
            let mut fields = line.split(',').map(|f| f.trim_matches('"'));
            (fields.next() == Some(test))
                .then(|| fields.next().and_then(|r| r.parse::<f64>().ok()))
                .flatten()
        })
    };
    match (
        rate("PING_MBULK").or_else(|| rate("PING_INLINE")),
        rate("GET"),
    ) {
        (Some(ping), Some(get)) => Ok((ping, get)),
        _ => Err(ToolError::failed(
            "redis-benchmark",
            format!("could not parse its output: {text}"),
        )),
    }
}

/// Runs of the 1 MB and raw TCP throughput measurements (medians reported).
const THROUGHPUT_REPEATS: usize = 3;

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn ratio(value: f64, reference: f64) -> f64 {
    if reference > 0.0 {
        value / reference
    } else {
        f64::NAN
    }
}

/// Runs `myriad bench net` (twice with `--tls`: plain, then TLS, then the comparison).
pub fn run(args: &NetArgs) -> Result<(), String> {
    if !args.tls {
        return run_once(args, None).map(|_| ());
    }
    let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    myriad_net::tls::create_ca(dir.path()).map_err(|e| e.to_string())?;
    for name in ["server", "client"] {
        myriad_net::tls::issue(dir.path(), name, myriad_net::CertRole::Peer, &[])
            .map_err(|e| e.to_string())?;
    }
    let plain = run_once(args, None)?;
    if !args.json {
        println!("\n--- the same with TLS (rustls, ring; mutual authentication) ---");
    }
    let tls = run_once(args, Some(dir.path()))?;
    print_tls_comparison(args.json, &plain, &tls);
    Ok(())
}

/// Every numeric headline of both runs side by side, with TLS / plain.
fn print_tls_comparison(
    json_lines: bool,
    plain: &serde_json::Map<String, Value>,
    tls: &serde_json::Map<String, Value>,
) {
    let mut rows = serde_json::Map::new();
    if !json_lines {
        println!("\nTLS cost (same run): figure, plain, TLS, TLS/plain");
    }
    for (key, value) in plain {
        let (Some(a), Some(b)) = (value.as_f64(), tls.get(key).and_then(Value::as_f64)) else {
            continue;
        };
        let ratio = if a == 0.0 { f64::NAN } else { b / a };
        if json_lines {
            rows.insert(key.clone(), json!({ "plain": a, "tls": b, "ratio": ratio }));
        } else {
            println!("  {key:<32} {a:>14.1} {b:>14.1} {ratio:>8.3}");
        }
    }
    if json_lines {
        println!(
            "{}",
            json!({ "bench": "net", "measure": "tls_comparison", "figures": rows })
        );
    }
}

/// One run against a fresh server process; TLS with `tls_dir`'s CA (certificates
/// `server` and `client`). Returns the headline figures.
fn run_once(
    args: &NetArgs,
    tls_dir: Option<&std::path::Path>,
) -> Result<serde_json::Map<String, Value>, String> {
    let (server, server_addr) = spawn_server(args.io_threads, tls_dir)?;
    let server_pid = server.0.id().to_string();
    let mut config = Config::new(CLIENT, SocketAddr::from(([127, 0, 0, 1], 0)), SECRET);
    config.handler_threads = 1;
    config.io_threads = args.io_threads;
    if let Some(dir) = tls_dir {
        config.tls = Some(TlsConfig::from_dir(dir, "client").map_err(|e| e.to_string())?);
    }
    let endpoint = Endpoint::start(config, Handlers::new()).map_err(|e| e.to_string())?;
    endpoint.set_address(SERVER, server_addr);
    let net = endpoint.handle();
    net.request_blocking(SERVER, ECHO, Bytes::new(), REQUEST_TIMEOUT)
        .map_err(|e| format!("first request: {e}"))?;
    let mut report = Report {
        json: args.json,
        summary: serde_json::Map::new(),
    };
    if !args.json {
        println!(
            "myriad bench net: two processes on 127.0.0.1 ({} cores)",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }

    bench_msg64(&net, &server_pid, args, &mut report)?;
    bench_round_trips(&net, args, &mut report)?;
    let best_pipelined = bench_pipelined(&net, args, &mut report)?;
    bench_throughput(&net, &server_pid, args, &mut report)?;
    if tls_dir.is_none() {
        bench_idle(&server_pid, &mut report);
    }
    drop(endpoint);
    drop(server);
    if tls_dir.is_none() {
        bench_redis(args, best_pipelined, &mut report);
    }
    if args.json {
        let mut summary = json!({ "bench": "net", "measure": "summary", "tls": tls_dir.is_some() });
        if let Some(object) = summary.as_object_mut() {
            object.extend(report.summary.clone());
        }
        println!("{summary}");
    }
    Ok(report.summary)
}

/// One-way 64-byte messages from one and two threads.
fn bench_msg64(
    net: &NetHandle,
    server_pid: &str,
    args: &NetArgs,
    report: &mut Report,
) -> Result<(), String> {
    let payload64 = Bytes::from(vec![0xa5u8; 64]);
    let mut msg64 = [0.0f64; 2];
    let mut cpu_per_million = 0.0;
    for (index, threads) in [1u64, 2].into_iter().enumerate() {
        let run = one_way(net, server_pid, &payload64, args.messages, threads)?;
        let (seconds, cpu) = (run.seconds, run.cpu_seconds);
        let rate = args.messages as f64 / seconds;
        if let Some(slot) = msg64.get_mut(index) {
            *slot = rate;
        }
        let dxnet = if threads == 1 {
            DXNET_MSG64_PER_SEC_1T
        } else {
            DXNET_MSG64_PER_SEC_2T
        };
        let cpu_per_m = cpu / (args.messages as f64 / 1e6);
        if threads == 1 {
            cpu_per_million = cpu_per_m;
        }
        report.line(
            &format!("msg64_{threads}t"),
            json!({ "threads": threads, "messages": args.messages, "msgs_per_sec": rate,
                    "cpu_s_per_million_msgs": cpu_per_m, "frames_per_write": run.frames_per_write,
                    "target_ratio": ratio(rate, TARGET_MSG64_PER_SEC), "dxnet_ratio": ratio(rate, dxnet),
                    "dxnet_msgs_per_sec": dxnet, "dxnet_source": DXNET_SOURCE }),
            format!(
                "one-way 64 B, {threads} thread(s): {:.2} M msgs/s ({:.2}x target 2 M/s, {:.1}x DXNet {:.2} M/s from an earlier run on this machine kind); {:.2} CPU s per million (both processes); {:.0} messages per write call",
                rate / 1e6, ratio(rate, TARGET_MSG64_PER_SEC), ratio(rate, dxnet), dxnet / 1e6, cpu_per_m, run.frames_per_write
            ),
        );
    }
    report.headline("msg64_per_sec_1t", Some(msg64[0]));
    report.headline("msg64_per_sec_2t", Some(msg64[1]));
    report.headline("cpu_s_per_million_msgs", Some(cpu_per_million));

    Ok(())
}

/// Round trips, one outstanding: the low-latency path (async API, inline handler) and
/// the plain one (blocking API from a thread, handler on the pool).
fn bench_round_trips(net: &NetHandle, args: &NetArgs, report: &mut Report) -> Result<(), String> {
    let floor = raw_tcp_round_trips(args.round_trips)?;
    let floor_p50 = floor.value_at_quantile(0.5) as f64 / 1e3;
    let mut headline_p = (0.0, 0.0, 0.0);
    for (measure, histogram) in [
        ("rtt64", round_trips_async_inline(net, args.round_trips)?),
        ("rtt64_blocking", round_trips(net, args.round_trips)?),
    ] {
        let us = |q: f64| histogram.value_at_quantile(q) as f64 / 1e3;
        let (p50, p99, p999, mean) = (us(0.5), us(0.99), us(0.999), histogram.mean() / 1e3);
        if measure == "rtt64" {
            headline_p = (p50, p99, p999);
        }
        let path = if measure == "rtt64" {
            "async API + inline handler"
        } else {
            "blocking API + pool handler"
        };
        report.line(
            measure,
            json!({ "path": path, "round_trips": args.round_trips, "p50_us": p50, "p99_us": p99,
                    "p999_us": p999, "mean_us": mean, "raw_tcp_p50_us": floor_p50,
                    "target_ratio": ratio(TARGET_RTT_P50_US, p50),
                    "dxnet_mean_ratio": ratio(DXNET_RTT_MEAN_US.0, mean),
                    "dxnet_mean_us": DXNET_RTT_MEAN_US.0, "dxnet_source": DXNET_SOURCE }),
            format!(
                "64 B request/response, 1 outstanding, {path}: p50 {p50:.1} µs, p99 {p99:.1} µs, p99.9 {p999:.1} µs, mean {mean:.1} µs (target p50 ≤ 30 µs: {}; raw TCP ping-pong p50 {floor_p50:.1} µs; DXNet mean {:.1}–{:.1} ms, p99 ≈ {:.0} ms, from an earlier run on this machine kind: {:.0}x lower mean)",
                if p50 <= TARGET_RTT_P50_US { "met" } else { "missed" },
                DXNET_RTT_MEAN_US.0 / 1e3, DXNET_RTT_MEAN_US.1 / 1e3, DXNET_RTT_P99_US / 1e3,
                ratio(DXNET_RTT_MEAN_US.0, mean)
            ),
        );
        if measure == "rtt64_blocking" {
            report.headline("rtt64_blocking_p50_us", Some(p50));
            report.headline("rtt64_blocking_p99_us", Some(p99));
        }
    }
    report.headline("rtt64_p50_us", Some(headline_p.0));
    report.headline("rtt64_p99_us", Some(headline_p.1));
    report.headline("rtt64_p999_us", Some(headline_p.2));
    report.headline("raw_tcp_rtt64_p50_us", Some(floor_p50));

    Ok(())
}

/// Pipelined requests from one and two threads; returns the best rate.
fn bench_pipelined(net: &NetHandle, args: &NetArgs, report: &mut Report) -> Result<f64, String> {
    let mut best_pipelined = 0.0f64;
    for threads in [1u64, 2] {
        let rate = pipelined(net, args.requests, threads, args.window)?;
        best_pipelined = best_pipelined.max(rate);
        report.line(
            &format!("req64_pipelined_{threads}t"),
            json!({ "threads": threads, "window": args.window, "requests": args.requests, "requests_per_sec": rate }),
            format!(
                "64 B requests, {threads} thread(s) × {} outstanding: {:.2} M requests/s",
                args.window,
                rate / 1e6
            ),
        );
    }
    report.headline("req64_per_sec_pipelined", Some(best_pipelined));

    Ok(best_pipelined)
}

/// Throughput of 1 KB and 1 MB messages. The 1 MB runs alternate with the raw TCP blast
/// (three of each, medians reported) so that both see the same machine load.
fn bench_throughput(
    net: &NetHandle,
    server_pid: &str,
    args: &NetArgs,
    report: &mut Report,
) -> Result<(), String> {
    let mut kb1 = 0.0;
    let mut mb1_runs = Vec::new();
    let mut raw_runs = Vec::new();
    for (name, size, repeats) in [("kb1", 1024usize, 1), ("mb1", 1 << 20, THROUGHPUT_REPEATS)] {
        let payload = Bytes::from(vec![0x3cu8; size]);
        let count = (args.throughput_bytes / size as u64).max(1);
        for _ in 0..repeats {
            let seconds = one_way(net, server_pid, &payload, count, 1)?.seconds;
            let gb_per_sec = (count * size as u64) as f64 / seconds / 1e9;
            if name == "mb1" {
                mb1_runs.push(gb_per_sec);
                raw_runs.push(raw_tcp_blast(args.throughput_bytes)?);
            } else {
                kb1 = gb_per_sec;
            }
            report.line(
                name,
                json!({ "message_bytes": size, "messages": count, "gb_per_sec": gb_per_sec,
                        "msgs_per_sec": count as f64 / seconds }),
                format!(
                    "one-way {} messages: {:.2} GB/s ({:.0} msgs/s)",
                    if size == 1024 { "1 KB" } else { "1 MB" },
                    gb_per_sec,
                    count as f64 / seconds
                ),
            );
        }
    }
    let mb1 = median(&mut mb1_runs);
    let raw = median(&mut raw_runs);
    report.headline("kb1_gb_per_sec", Some(kb1));
    report.headline("mb1_gb_per_sec", Some(mb1));
    report.line(
        "raw_tcp",
        json!({ "gb_per_sec": raw, "runs_gb_per_sec": raw_runs, "mb1_median_gb_per_sec": mb1,
                "mb1_share": ratio(mb1, raw) }),
        format!(
            "raw TCP blast (256 KiB blocking writes and reads, plain sockets), median of {THROUGHPUT_REPEATS}: {raw:.2} GB/s (runs {}); myriad 1 MB messages, median {mb1:.2} GB/s = {:.0}% of it (target ≥ {:.0}%)",
            raw_runs.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", "),
            ratio(mb1, raw) * 100.0,
            TARGET_MB1_SHARE_OF_RAW * 100.0
        ),
    );
    report.headline("raw_tcp_gb_per_sec", Some(raw));

    Ok(())
}

/// Idle CPU of the server process.
fn bench_idle(server_pid: &str, report: &mut Report) {
    let idle_before = process::cpu_seconds_of(server_pid);
    std::thread::sleep(Duration::from_secs(2));
    let idle_percent = (process::cpu_seconds_of(server_pid) - idle_before) / 2.0 * 100.0;
    report.line(
        "idle",
        json!({ "server_idle_cpu_percent": idle_percent }),
        format!("server process idle for 2 s with an open connection: {idle_percent:.1}% CPU"),
    );
    report.headline("idle_cpu_percent", Some(idle_percent));
}

/// Baseline: redis. Not installed, failed (with what failed) and skipped are told apart;
/// none of them fails the benchmark.
fn bench_redis(args: &NetArgs, best_pipelined: f64, report: &mut Report) {
    let redis = if args.no_redis {
        None
    } else {
        Some(redis_baseline(args.requests.max(100_000)))
    };
    match &redis {
        Some(Ok((ping, get))) => report.line(
            "redis",
            json!({ "ping_per_sec": ping, "get_per_sec": get, "pipeline": 16, "clients": 50,
                    "myriad_pipelined_ratio": ratio(best_pipelined, *get), "status": "ok" }),
            format!(
                "redis-benchmark -P 16 -c 50: PING {:.2} M/s, GET 64 B {:.2} M/s; myriad pipelined requests: {:.2}x redis GET (target ≥ 1)",
                ping / 1e6,
                get / 1e6,
                ratio(best_pipelined, *get)
            ),
        ),
        Some(Err(error)) => report.line(
            "redis",
            json!({ "ping_per_sec": null, "get_per_sec": null, "status": error.status(),
                    "error": error.to_string() }),
            match error {
                ToolError::NotInstalled { .. } => format!(
                    "redis baseline: {error} (apt-get install redis-server redis-tools)"
                ),
                ToolError::Failed { .. } | ToolError::Skipped { .. } => {
                    format!("redis baseline: {error}")
                }
            },
        ),
        None => report.line(
            "redis",
            json!({ "ping_per_sec": null, "get_per_sec": null, "status": "skipped" }),
            "redis baseline: skipped (--no-redis)".into(),
        ),
    }
    let figures = redis.and_then(Result::ok);
    report.headline("redis_ping_per_sec", figures.map(|r| r.0));
    report.headline("redis_get_per_sec", figures.map(|r| r.1));
}
