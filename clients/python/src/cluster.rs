//! `myriad._myriad.LocalCluster`: a local cluster of `myriad` processes for notebooks and
//! tests, through `myriad-launcher` (the same launcher as `myriad cluster start`). The
//! Python function `myriad.local_cluster()` wraps it in a context manager.
//!
//! # Invariants
//! - The nodes are started with `--exit-with-parent` (they exit when this Python process
//!   dies) and owned: dropping the value SIGKILLs any node still running, so no node
//!   outlives the Python object, also when `stop` was never called.
//! - Every wait (start, stop, restart, kill) runs with the GIL released.

use std::path::PathBuf;
use std::time::Duration;

use myriad_launcher::{LaunchError, LaunchSpec, LocalCluster as Launched};
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict};

use crate::core::seconds;

/// A running local cluster (superpeers and peers as child processes).
#[pyclass(frozen, module = "myriad._myriad")]
pub struct LocalCluster {
    dir: PathBuf,
    secret: Option<String>,
    inner: Mutex<Launched>,
}

fn launch_error(error: LaunchError) -> PyErr {
    PyRuntimeError::new_err(error.to_string())
}

#[pymethods]
impl LocalCluster {
    /// Starts `superpeers` superpeers (1, 3 or 5) and `peers` peers of `binary` with
    /// their files under `dir`; returns once every node serves (or raises, with the tail
    /// of the failing node's log).
    #[staticmethod]
    #[pyo3(signature = (dir, binary, *, superpeers=1, peers=3, peer_memory_mb=None,
        secret=None, config=None, ready_timeout=60.0))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        py: Python<'_>,
        dir: PathBuf,
        binary: PathBuf,
        superpeers: usize,
        peers: usize,
        peer_memory_mb: Option<u64>,
        secret: Option<String>,
        config: Option<PathBuf>,
        ready_timeout: f64,
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
        if let Some(config) = config {
            spec.extra_args.push("--config".into());
            spec.extra_args.push(config.display().to_string());
        }
        if let Some(secret) = &secret {
            spec.extra_args.push("--secret".into());
            spec.extra_args.push(secret.clone());
        }
        let launched = py
            .detach(move || Launched::start_owned(spec))
            .map_err(launch_error)?;
        Ok(LocalCluster {
            dir,
            secret,
            inner: Mutex::new(launched),
        })
    }

    /// The cluster directory (`cluster.json`, `logs/`, `data/`).
    #[getter]
    fn dir(&self) -> PathBuf {
        self.dir.clone()
    }

    /// The cluster secret given to the nodes (`None`: their default).
    #[getter]
    fn secret(&self) -> Option<String> {
        self.secret.clone()
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
