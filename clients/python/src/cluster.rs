//! `myriad._myriad.LocalCluster`: a local cluster of `myriad` processes for notebooks and
//! tests, through `myriad-launcher` (the same launcher as `myriad cluster start`). The
//! Python function `myriad.local_cluster()` wraps it in a context manager.
//!
//! # The cluster secret
//! Never on a node's command line: `start(secret=S)` writes `S` to `DIR/secret` (a new
//! file of mode `0600`, renamed over any old one, so it is never readable by others) and
//! hands the launcher that file; `start(secret_file=F)` hands it `F`; with neither the
//! launcher reuses `DIR/secret` or creates one with a random secret. Every node gets
//! `--secret-file`, and `cluster.json` records the path (never the secret).
//!
//! # Invariants
//! - The nodes are started with `--exit-with-parent` (they exit when this Python process
//!   dies) and owned: dropping the value SIGKILLs any node still running, so no node
//!   outlives the Python object, also when `stop` was never called.
//! - Every wait (start, stop, restart, kill) runs with the GIL released.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use myriad_launcher::{LaunchError, LaunchSpec, LocalCluster as Launched};
use myriad_net::secret::{self, SECRET_FILE_NAME};
use myriad_net::SECRET_BYTES_MAX;
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict};

use crate::core::seconds;

/// A running local cluster (superpeers and peers as child processes).
#[pyclass(frozen, module = "myriad._myriad")]
pub struct LocalCluster {
    dir: PathBuf,
    inner: Mutex<Launched>,
}

fn launch_error(error: LaunchError) -> PyErr {
    PyRuntimeError::new_err(error.to_string())
}

/// Writes `secret` to `DIR/secret` for a cluster about to start there and returns the
/// file's path: a new file created with mode `0600` (given to `open`), then renamed over
/// any old `DIR/secret`. `ValueError` for a secret a secret file cannot hold (empty, over
/// [`SECRET_BYTES_MAX`] bytes, a line break, trailing whitespace); `RuntimeError` if a
/// cluster with live nodes runs in `dir` (its secret is left alone).
fn write_secret_file(dir: &Path, secret: &str) -> PyResult<PathBuf> {
    if secret.is_empty() || secret.len() > SECRET_BYTES_MAX {
        return Err(PyValueError::new_err(format!(
            "the secret must have 1 to {SECRET_BYTES_MAX} bytes"
        )));
    }
    if secret.contains(['\n', '\r']) || secret.ends_with(|c: char| c.is_ascii_whitespace()) {
        return Err(PyValueError::new_err(
            "the secret must be one line without trailing whitespace (a secret file's first line)",
        ));
    }
    if let Ok(mut existing) = Launched::open(dir) {
        if existing.status().iter().any(|node| node.alive) {
            return Err(launch_error(LaunchError::AlreadyRunning(dir.to_owned())));
        }
    }
    let io = |what: &str, path: &Path, error: std::io::Error| {
        PyRuntimeError::new_err(format!("{what} {}: {error}", path.display()))
    };
    fs::create_dir_all(dir).map_err(|error| io("creating", dir, error))?;
    let path = dir.join(SECRET_FILE_NAME);
    let temporary = dir.join(format!(".{SECRET_FILE_NAME}.{}", std::process::id()));
    match fs::remove_file(&temporary) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(io("removing", &temporary, error));
        }
        _ => {}
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(|error| io("creating", &temporary, error))?;
    file.write_all(format!("{secret}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|error| io("writing", &temporary, error))?;
    fs::rename(&temporary, &path).map_err(|error| io("renaming", &temporary, error))?;
    // The file must read back as the nodes will read it.
    match secret::read_file(&path) {
        Ok(read) if read == secret.as_bytes() => Ok(path),
        Ok(_) => Err(PyRuntimeError::new_err(format!(
            "{} does not read back as the secret written",
            path.display()
        ))),
        Err(error) => Err(PyRuntimeError::new_err(error.to_string())),
    }
}

#[pymethods]
impl LocalCluster {
    /// Starts `superpeers` superpeers (1, 3 or 5) and `peers` peers of `binary` with
    /// their files under `dir`; returns once every node serves (or raises, with the tail
    /// of the failing node's log). The cluster secret: `secret` (written to `DIR/secret`,
    /// mode 0600), or the file `secret_file`, or else `DIR/secret` as it is (created with a
    /// random secret if missing). `tls`: every connection over TLS, with a cluster CA and
    /// the `superpeer`, `peer` and `client` certificates in `DIR/tls` (created if missing),
    /// as `myriad cluster start --tls`.
    #[staticmethod]
    #[pyo3(signature = (dir, binary, *, superpeers=1, peers=3, peer_memory_mb=None,
        secret=None, secret_file=None, config=None, ready_timeout=60.0, tls=false))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        py: Python<'_>,
        dir: PathBuf,
        binary: PathBuf,
        superpeers: usize,
        peers: usize,
        peer_memory_mb: Option<u64>,
        secret: Option<String>,
        secret_file: Option<PathBuf>,
        config: Option<PathBuf>,
        ready_timeout: f64,
        tls: bool,
    ) -> PyResult<LocalCluster> {
        if !binary.is_file() {
            return Err(PyValueError::new_err(format!(
                "no myriad binary at {}",
                binary.display()
            )));
        }
        let mut spec = LaunchSpec::new(&dir, binary);
        spec.superpeers = superpeers;
        spec.peers = peers;
        spec.peer_memory_mb = peer_memory_mb;
        spec.ready_timeout = seconds(ready_timeout, "ready_timeout")?;
        spec.tls = tls;
        if let Some(config) = config {
            spec.extra_args.push("--config".into());
            spec.extra_args.push(config.display().to_string());
        }
        spec.secret_file = match (secret, secret_file) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(
                    "give at most one of secret= and secret_file=",
                ))
            }
            (Some(secret), None) => Some(write_secret_file(&dir, &secret)?),
            (None, file) => file,
        };
        let launched = py
            .detach(move || Launched::start_owned(spec))
            .map_err(launch_error)?;
        Ok(LocalCluster {
            dir,
            inner: Mutex::new(launched),
        })
    }

    /// The cluster directory (`cluster.json`, `logs/`, `data/`).
    #[getter]
    fn dir(&self) -> PathBuf {
        self.dir.clone()
    }

    /// The cluster secret, read from its file (`ValueError` if it is not UTF-8 text; the
    /// file is then still usable through `secret_file`).
    #[getter]
    fn secret(&self) -> PyResult<String> {
        let bytes = self.inner.lock().secret().map_err(launch_error)?;
        String::from_utf8(bytes).map_err(|_| {
            PyValueError::new_err("the cluster secret is not UTF-8 text: use secret_file")
        })
    }

    /// The cluster secret's file (mode 0600), the one every node was given.
    #[getter]
    fn secret_file(&self) -> PathBuf {
        self.inner.lock().secret_file()
    }

    /// The TLS directory of `myriad cert` the nodes use (`ca.pem`, `client.pem`,
    /// `client.key`, ...), or `None` for a cluster without TLS.
    #[getter]
    fn tls_dir(&self) -> Option<PathBuf> {
        self.inner.lock().tls_dir()
    }

    /// The superpeers as `["ID@127.0.0.1:PORT", ...]` (what `Client.connect` takes).
    #[getter]
    fn superpeers(&self) -> Vec<String> {
        self.inner
            .lock()
            .superpeer_addresses()
            .into_iter()
            .map(|(id, address)| format!("{id}@{address}"))
            .collect()
    }

    /// The peers' node IDs.
    #[getter]
    fn peer_ids(&self) -> Vec<u16> {
        self.inner
            .lock()
            .peer_ids()
            .into_iter()
            .map(|id| id.0)
            .collect()
    }

    /// Every node: dicts with `name`, `role`, `node_id`, `address`, `pid`, `alive`,
    /// `log` (path of its log file).
    fn nodes(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let status = py.detach(|| self.inner.lock().status());
        status
            .into_iter()
            .map(|node| {
                let dict = PyDict::new(py);
                dict.set_item("name", &node.node.name)?;
                dict.set_item("role", node.node.role.as_str())?;
                dict.set_item("node_id", node.node.node_id)?;
                dict.set_item("address", &node.node.address)?;
                dict.set_item("pid", node.node.pid)?;
                dict.set_item("alive", node.alive)?;
                dict.set_item("log", &node.node.log)?;
                Ok(dict.into_any().unbind())
            })
            .collect()
    }

    /// SIGKILLs one node (a failure drill): by node ID or name (`"peer-2"`).
    fn kill(&self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = node_name(node)?;
        py.detach(|| self.inner.lock().kill_named(&name))
            .map_err(launch_error)
    }

    /// Restarts one node with its arguments and data directory; waits until it serves.
    fn restart(&self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = node_name(node)?;
        py.detach(|| self.inner.lock().restart(&name).map(drop))
            .map_err(launch_error)
    }

    /// Stops every node (SIGTERM, then SIGKILL after `timeout` seconds); returns the
    /// names of the nodes that needed SIGKILL.
    #[pyo3(signature = (timeout=10.0))]
    fn stop(&self, py: Python<'_>, timeout: f64) -> PyResult<Vec<String>> {
        let timeout = seconds(timeout, "timeout")?;
        py.detach(|| {
            let mut inner = self.inner.lock();
            inner.set_stop_timeout(timeout.min(Duration::from_secs(600)));
            inner.stop()
        })
        .map_err(launch_error)
    }

    fn __repr__(&self) -> String {
        format!("<myriad.LocalCluster dir={}>", self.dir.display())
    }
}

/// A node named by ID (int) or by name/ID text.
fn node_name(node: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(id) = node.extract::<u16>() {
        return Ok(id.to_string());
    }
    node.extract::<String>()
}
