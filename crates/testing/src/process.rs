//! Real `myriad` processes for end-to-end tests: one harness instead of a set-up per file.
//!
//! **Job.** What the process tests of the `myriad` binary share:
//! - [`Cluster`]: a local cluster of node processes started through
//!   [`myriad_launcher::LocalCluster::start_owned`] from a [`ClusterBuilder`] (node counts,
//!   peer memory, a node config file, ready timeout), with SIGKILL ([`Cluster::kill`]) and
//!   restart of single nodes; it dereferences to the [`LocalCluster`] for the read-only
//!   views (`nodes`, `superpeers`, `peer_ids`, `dir`, ...).
//! - [`Myriad`]: one `myriad` subcommand run to its end with a timeout, its output captured
//!   ([`Output`]).
//! - [`Process`]: a long-running child process of the test (a node spawned by hand).
//! - [`wait_until`]: a bounded wait for a condition, with a panic that says what was
//!   awaited.
//! - [`http_get`]: one HTTP/1.1 `GET` with a deadline (a node's metrics endpoint).
//!
//! **Invariants.** Nothing outlives the test: a [`Cluster`] SIGKILLs every node when it is
//! dropped (also when the test panics), a [`Process`] SIGKILLs its child, and a [`Myriad`]
//! run that times out is SIGKILLed (with the nodes of its own cluster, if it names one
//! through [`Myriad::cluster_dir`]) before the test panics. Every wait is bounded.
//!
//! **Callers.** The integration tests of `crates/cli`, which pass the binary they test
//! (`env!("CARGO_BIN_EXE_myriad")`).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use myriad_launcher::{LaunchSpec, LocalCluster, NodeEntry, NodeRole};

/// How often [`wait_until`] and the process waits poll.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Default timeout of a [`Myriad`] run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Polls `predicate` every [`POLL_INTERVAL`] until it holds; panics with `what` if it
/// still does not after `timeout` (it is asked one last time at the deadline).
pub fn wait_until(timeout: Duration, what: &str, predicate: impl FnMut() -> bool) {
    assert!(
        poll_until(timeout, predicate),
        "timed out after {timeout:?} waiting for {what}"
    );
}

/// Polls `predicate` every [`POLL_INTERVAL`] until it holds or `timeout` passes; whether
/// it held (for tests that word their own failure).
pub fn poll_until(timeout: Duration, mut predicate: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if predicate() {
            return true;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    predicate()
}

/// Sends signal `name` (`STOP`, `CONT`, `TERM`, `KILL`, ...) to every process of `pids`
/// with one kill(1) call (so that several processes are stopped at the same moment);
/// panics if it fails.
pub fn signal(pids: &[u32], name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .args(pids.iter().map(u32::to_string))
        .status()
        .expect("kill(1) runs");
    assert!(status.success(), "kill -{name} {pids:?} failed");
}

/// What to start: the launcher's [`LaunchSpec`] plus the test's own options. Made by
/// [`Cluster::builder`].
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    root: PathBuf,
    spec: LaunchSpec,
    config: Option<String>,
    keep_logs_on_panic: bool,
    log_words_on_panic: Vec<String>,
}

impl ClusterBuilder {
    /// Number of superpeers (1, 3 or 5; default 1).
    pub fn superpeers(mut self, count: usize) -> Self {
        self.spec.superpeers = count;
        self
    }

    /// Number of peers (default 1).
    pub fn peers(mut self, count: usize) -> Self {
        self.spec.peers = count;
        self
    }

    /// `--memory-mb` of every peer.
    pub fn peer_memory_mb(mut self, mb: u64) -> Self {
        self.spec.peer_memory_mb = Some(mb);
        self
    }

    /// Node settings: written to `ROOT/myriad.toml` and given to every node as `--config`.
    pub fn config(mut self, text: impl Into<String>) -> Self {
        self.config = Some(text.into());
        self
    }

    /// TLS for every connection (a CA and certificates in `DIR/tls`; clients use the
    /// certificate `client`): see `LaunchSpec::tls`.
    pub fn tls(mut self, on: bool) -> Self {
        self.spec.tls = on;
        self
    }

    /// Longest wait for each group of nodes to be ready (default 20 s).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.spec.ready_timeout = timeout;
        self
    }

    /// When the test panics, copy the nodes' logs to a directory under the system's
    /// temporary directory (named on stderr) once the nodes are killed.
    pub fn keep_logs_on_panic(mut self) -> Self {
        self.keep_logs_on_panic = true;
        self
    }

    /// When the test panics, print every line of the nodes' logs that holds one of `words`.
    pub fn log_lines_on_panic(mut self, words: &[&str]) -> Self {
        self.log_words_on_panic = words.iter().map(|word| (*word).to_owned()).collect();
        self
    }

    /// Starts the cluster under `ROOT/cluster` and returns once every node serves; panics
    /// (with the launcher's reason: the node and the tail of its log) if it cannot.
    pub fn start(mut self) -> Cluster {
        if let Some(config) = &self.config {
            std::fs::create_dir_all(&self.root).expect("create the test directory");
            let path = self.root.join("myriad.toml");
            std::fs::write(&path, config).expect("write the node config");
            self.spec.extra_args = vec!["--config".into(), path.display().to_string()];
        }
        let launcher = LocalCluster::start_owned(self.spec)
            .unwrap_or_else(|error| panic!("the cluster does not start: {error}"));
        Cluster {
            launcher,
            keep_logs_on_panic: self.keep_logs_on_panic,
            log_words_on_panic: self.log_words_on_panic,
        }
    }
}

/// A local cluster of node processes, every one SIGKILLed when this value drops.
#[derive(Debug)]
pub struct Cluster {
    launcher: LocalCluster,
    keep_logs_on_panic: bool,
    log_words_on_panic: Vec<String>,
}

impl Cluster {
    /// A builder for a cluster of `binary` (the `myriad` executable) whose files live
    /// under `root/cluster`: one superpeer, one peer, 20 s ready timeout.
    pub fn builder(binary: impl Into<PathBuf>, root: impl Into<PathBuf>) -> ClusterBuilder {
        let root = root.into();
        let mut spec = LaunchSpec::new(root.join("cluster"), binary);
        spec.ready_timeout = Duration::from_secs(20);
        ClusterBuilder {
            root,
            spec,
            config: None,
            keep_logs_on_panic: false,
            log_words_on_panic: Vec::new(),
        }
    }

    /// The launcher, for what this harness does not wrap.
    pub fn launcher_mut(&mut self) -> &mut LocalCluster {
        &mut self.launcher
    }

    /// The recorded peers, in start order.
    pub fn peer_entries(&self) -> Vec<NodeEntry> {
        self.launcher
            .nodes()
            .iter()
            .filter(|node| node.role == NodeRole::Peer)
            .cloned()
            .collect()
    }

    /// The node with this node ID; panics if there is none.
    pub fn node(&self, node_id: u16) -> &NodeEntry {
        self.launcher
            .nodes()
            .iter()
            .find(|node| node.node_id == node_id)
            .unwrap_or_else(|| panic!("no node {node_id:#06x} in the cluster"))
    }

    /// The process ID of the node with this node ID.
    pub fn pid(&self, node_id: u16) -> u32 {
        self.node(node_id).pid
    }

    /// SIGKILLs the node with this node ID (its whole process group) and waits until it is
    /// gone.
    pub fn kill(&mut self, node_id: u16) {
        self.launcher
            .kill(node_id)
            .unwrap_or_else(|error| panic!("SIGKILL to node {node_id:#06x}: {error}"));
    }

    /// SIGKILLs the named node (`peer-2`, `superpeer-1`).
    pub fn kill_named(&mut self, name: &str) {
        self.launcher
            .kill_named(name)
            .unwrap_or_else(|error| panic!("SIGKILL to {name}: {error}"));
    }

    /// Restarts a node (by name or node ID) with its arguments and data directory,
    /// stopping it first if it is alive; returns it once it is ready again.
    pub fn restart(&mut self, name_or_id: &str) -> NodeEntry {
        self.launcher
            .restart(name_or_id)
            .unwrap_or_else(|error| panic!("restarting {name_or_id}: {error}"))
    }

    /// Restarts every node that is down: the superpeers at once, then the peers one by
    /// one, `peer_gap` apart ([`LocalCluster::restart_all`]).
    pub fn restart_all(&mut self, peer_gap: Duration) -> Vec<NodeEntry> {
        self.launcher
            .restart_all(peer_gap)
            .unwrap_or_else(|error| panic!("restarting every node: {error}"))
    }

    /// Whether the named node's process is alive.
    pub fn is_alive(&mut self, name: &str) -> bool {
        self.launcher
            .status()
            .iter()
            .any(|status| status.node.name == name && status.alive)
    }

    /// After a panic: kills every node, then shows what the builder asked for.
    fn report_panic(&mut self) {
        let ids: Vec<u16> = self.launcher.nodes().iter().map(|n| n.node_id).collect();
        for id in ids {
            let _ = self.launcher.kill(id);
        }
        if !self.log_words_on_panic.is_empty() {
            for node in self.launcher.nodes() {
                let log = std::fs::read_to_string(&node.log).unwrap_or_default();
                for line in log.lines().filter(|line| {
                    self.log_words_on_panic
                        .iter()
                        .any(|word| line.contains(word.as_str()))
                }) {
                    eprintln!("{}: {line}", node.name);
                }
            }
        }
        if self.keep_logs_on_panic {
            keep_logs(&self.launcher.dir().join("logs"));
        }
    }
}

/// Copies the files of `from` to a fresh directory under the temporary directory.
fn keep_logs(from: &Path) {
    let to = std::env::temp_dir().join(format!(
        "myriad-test-logs-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    if std::fs::create_dir_all(&to).is_ok() {
        if let Ok(entries) = std::fs::read_dir(from) {
            for entry in entries.flatten() {
                let _ = std::fs::copy(entry.path(), to.join(entry.file_name()));
            }
        }
        eprintln!("node logs kept in {}", to.display());
    }
}

impl Deref for Cluster {
    type Target = LocalCluster;

    fn deref(&self) -> &LocalCluster {
        &self.launcher
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.report_panic();
        }
        // The owned launcher SIGKILLs and reaps every node it spawned when it drops.
    }
}

/// One HTTP/1.1 `GET http://address/path` with `Connection: close`, each socket
/// operation bounded by `timeout`: the status code and the body (a chunked body is not
/// decoded: the nodes' endpoints send their length).
pub fn http_get(address: &str, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    let socket: std::net::SocketAddr = address
        .parse()
        .map_err(|error| format!("address {address}: {error}"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&socket, timeout)
        .map_err(|error| format!("connect {address}: {error}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|error| format!("timeouts: {error}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|error| format!("send to {address}: {error}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .map_err(|error| format!("read from {address}: {error}"))?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no header end in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// A child process of the test, SIGKILLed and reaped when dropped.
#[derive(Debug)]
pub struct Process {
    child: Option<Child>,
}

impl Process {
    /// Spawns `command`; panics with `what` if it cannot.
    pub fn spawn(command: &mut Command, what: &str) -> Process {
        let child = command
            .spawn()
            .unwrap_or_else(|error| panic!("spawning {what}: {error}"));
        Process { child: Some(child) }
    }

    /// Its process ID (0 once it was killed or waited for).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The child, while it was not killed or waited for.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// Whether it has exited (reaping it if so); false once it was killed.
    pub fn has_exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(Some(_))))
    }

    /// SIGKILLs and reaps it (nothing if it is gone already).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits up to `timeout` for it to exit by itself; its exit status. Panics (and kills
    /// it) if it is still running then.
    pub fn wait_exit(&mut self, timeout: Duration, what: &str) -> ExitStatus {
        let child = self
            .child
            .as_mut()
            .unwrap_or_else(|| panic!("{what}: the process was already reaped"));
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("wait for the child") {
                self.child = None;
                return status;
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!("{what} did not exit within {timeout:?}");
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a [`Myriad`] run produced.
#[derive(Debug, Clone)]
pub struct Output {
    /// How the process ended.
    pub status: ExitStatus,
    /// Its standard output (lossy UTF-8).
    pub stdout: String,
    /// Its standard error (lossy UTF-8).
    pub stderr: String,
}

impl Output {
    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Its exit code (none if a signal ended it).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Panics, with both output streams, unless it exited with status 0.
    pub fn assert_success(&self, what: &str) -> &Output {
        assert!(
            self.success(),
            "{what} failed ({}):\n{}\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

/// One run of a `myriad` subcommand with a timeout (default [`RUN_TIMEOUT`]): stdin from
/// [`stdin`](Self::stdin) or empty, stdout and stderr captured.
#[derive(Debug)]
pub struct Myriad {
    command: Command,
    what: String,
    timeout: Duration,
    stdin: Option<Vec<u8>>,
    cluster_dir: Option<PathBuf>,
}

impl Myriad {
    /// `binary` (the `myriad` executable) with the subcommand and arguments `args`.
    pub fn new<I, S>(binary: impl AsRef<OsStr>, args: I) -> Myriad
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(binary);
        command.args(args);
        let what = format!("myriad {:?}", command.get_args().collect::<Vec<_>>());
        Myriad {
            command,
            what,
            timeout: RUN_TIMEOUT,
            stdin: None,
            cluster_dir: None,
        }
    }

    /// One more argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Myriad {
        self.command.arg(arg);
        self
    }

    /// More arguments.
    pub fn args<I, S>(mut self, args: I) -> Myriad
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command.args(args);
        self
    }

    /// Sets an environment variable of the process.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Myriad {
        self.command.env(key, value);
        self
    }

    /// Removes an environment variable from the process.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Myriad {
        self.command.env_remove(key);
        self
    }

    /// Feeds `input` to its stdin (then closes it).
    pub fn stdin(mut self, input: impl Into<Vec<u8>>) -> Myriad {
        self.stdin = Some(input.into());
        self
    }

    /// The longest it may run before it is SIGKILLed and the test panics.
    pub fn timeout(mut self, timeout: Duration) -> Myriad {
        self.timeout = timeout;
        self
    }

    /// The directory of a cluster the subcommand starts itself (`cluster.json` in it): if
    /// the run times out, its nodes are SIGKILLed too (they run in process groups of their
    /// own).
    pub fn cluster_dir(mut self, dir: impl Into<PathBuf>) -> Myriad {
        self.cluster_dir = Some(dir.into());
        self
    }

    /// Runs it to its end and returns its output; panics (with the output so far) if it
    /// does not end within the timeout.
    pub fn run(mut self) -> Output {
        self.command
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut process = Process::spawn(&mut self.command, &self.what);
        let child = process.child_mut().expect("a child just spawned");
        if let (Some(input), Some(mut pipe)) = (self.stdin.take(), child.stdin.take()) {
            // A process that exits without reading all of it closes the pipe: not an error.
            std::thread::spawn(move || {
                let _ = pipe.write_all(&input);
            });
        }
        let stdout = reader(child.stdout.take());
        let stderr = reader(child.stderr.take());
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for the child") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                break None;
            }
            std::thread::sleep(POLL_INTERVAL);
        };
        if status.is_none() {
            process.kill();
            if let Some(dir) = &self.cluster_dir {
                kill_cluster(dir);
            }
        }
        let stdout = stdout.join().unwrap_or_default();
        let stderr = stderr.join().unwrap_or_default();
        let Some(status) = status else {
            panic!(
                "{} did not end within {:?}:\n{stdout}\n{stderr}",
                self.what, self.timeout
            );
        };
        Output {
            status,
            stdout,
            stderr,
        }
    }
}

/// A thread reading `pipe` to its end (an empty text without a pipe).
fn reader(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// SIGKILLs every node recorded in `dir/cluster.json` (if there is one).
fn kill_cluster(dir: &Path) {
    if let Ok(mut cluster) = LocalCluster::open(dir) {
        let ids: Vec<u16> = cluster.nodes().iter().map(|node| node.node_id).collect();
        for id in ids {
            let _ = cluster.kill(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_until_returns_once_the_predicate_holds() {
        let mut calls = 0;
        wait_until(Duration::from_secs(5), "three calls", || {
            calls += 1;
            calls >= 3
        });
        assert_eq!(calls, 3);
    }

    #[test]
    #[should_panic(expected = "waiting for the impossible")]
    fn wait_until_panics_with_what_it_waited_for() {
        wait_until(Duration::from_millis(50), "the impossible", || false);
    }

    #[test]
    fn a_run_captures_output_and_status() {
        let output = Myriad::new("sh", ["-c", "cat; echo err >&2; exit 3"])
            .stdin("hello")
            .run();
        assert_eq!(output.code(), Some(3));
        assert_eq!(output.stdout, "hello");
        assert_eq!(output.stderr, "err\n");
    }

    #[test]
    #[should_panic(expected = "did not end within")]
    fn a_run_over_its_timeout_is_killed() {
        Myriad::new("sleep", ["30"])
            .timeout(Duration::from_millis(100))
            .run();
    }

    #[test]
    fn a_process_is_killed_on_drop() {
        let process = Process::spawn(Command::new("sleep").arg("30"), "sleep");
        let pid = process.pid();
        drop(process);
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}
