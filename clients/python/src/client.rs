//! `myriad.Client`: a blocking connection to a cluster (each call waits with the GIL
//! released), its connection arguments, the single get/put fast path and chunk locks as
//! context managers ([`ChunkLock`]). The calls it shares with `AsyncClient` are in
//! [`crate::methods`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyAny;

use crate::aio::AsyncClient;
use crate::core::{
    open_cluster_dir, resolve_secret, resolve_tls, seconds, superpeer_list, ConnectSpec, Core,
    CALL_TIMEOUT_DEFAULT, CONNECT_TIMEOUT_DEFAULT, LANE_SPIN_MAX,
};
use crate::ops::{self, payload};
use crate::{convert, errors};

/// A connection to a Myriad cluster (blocking calls). Thread-safe: share one between
/// threads or give each thread its own (one connection per peer each).
#[pyclass(frozen, module = "myriad._myriad")]
pub struct Client {
    core: Arc<Core>,
}

impl Client {
    /// The shared state.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }
}

/// Where `connect` finds its TLS certificates: `tls_dir=` and `tls_name=`.
pub struct TlsArgs {
    /// A directory written by `myriad cert` (`ca.pem`, `NAME.pem`, `NAME.key`).
    pub dir: Option<PathBuf>,
    /// The certificate's name in it (default `client`).
    pub name: Option<String>,
}

/// The arguments of `connect`, parsed with the GIL held (the secret file and the TLS
/// certificates are read here).
#[allow(clippy::too_many_arguments)]
pub fn connect_spec(
    cluster_dir: Option<PathBuf>,
    superpeers: Option<&Bound<'_, PyAny>>,
    secret: Option<String>,
    secret_file: Option<PathBuf>,
    connect_timeout: f64,
    timeout: f64,
    durability: Option<&Bound<'_, PyAny>>,
    listen: Option<String>,
    lane_spin: Option<f64>,
    tls: TlsArgs,
) -> PyResult<ConnectSpec> {
    let (superpeers, cluster) = match (cluster_dir, superpeers) {
        (Some(dir), None) => {
            let cluster = open_cluster_dir(&dir)?;
            (cluster.superpeers(), Some(cluster))
        }
        (None, Some(list)) => (superpeer_list(list)?, None),
        _ => {
            return Err(PyValueError::new_err(
                "give exactly one of cluster_dir= and superpeers=",
            ))
        }
    };
    if superpeers.is_empty() {
        return Err(PyValueError::new_err("no superpeer to connect to"));
    }
    let listen = listen
        .map(|text| {
            text.parse()
                .map_err(|_| PyValueError::new_err(format!("listen address {text:?}")))
        })
        .transpose()?;
    Ok(ConnectSpec {
        superpeers,
        secret: resolve_secret(secret, secret_file, cluster.as_ref())?,
        connect_timeout: seconds(connect_timeout, "connect_timeout")?,
        call_timeout: seconds(timeout, "timeout")?,
        durability: durability.map_or(Ok(0), crate::core::durability)?,
        listen,
        lane_spin: lane_spin.map(spin_seconds).transpose()?,
        tls: resolve_tls(tls.dir, tls.name, cluster.as_ref())?,
    })
}

/// A `lane_spin` from Python: finite, at least 0 (never spin) and at most
/// [`LANE_SPIN_MAX`].
fn spin_seconds(value: f64) -> PyResult<Duration> {
    if !(value.is_finite() && (0.0..=LANE_SPIN_MAX.as_secs_f64()).contains(&value)) {
        return Err(PyValueError::new_err(format!(
            "lane_spin must be 0 to {} seconds, not {value}",
            LANE_SPIN_MAX.as_secs_f64()
        )));
    }
    Ok(Duration::from_secs_f64(value))
}

#[pymethods]
impl Client {
    /// Joins the cluster as a client node. Give `cluster_dir` (a directory written by
    /// `myriad cluster start` or `myriad.local_cluster`; its secret file is read) or
    /// `superpeers` (`["1@127.0.0.1:7000", ...]` or `[(1, "127.0.0.1:7000")]`). The
    /// cluster secret: `secret`, else the file `secret_file` (mode 0600), else the
    /// cluster directory's file, else the file named by `MYRIAD_SECRET_FILE`; there is no
    /// default (`ValueError` without one). `timeout` is every call's default timeout
    /// (seconds), `durability` the default of changing calls. `lane_spin` (seconds; by
    /// default the Rust client's, 50 µs; 0: never) is how long a blocking call that is
    /// the only one of the process waiting polls for its answer before its thread sleeps.
    /// TLS (`docs/security.md`): `tls_dir` (a directory of `myriad cert`: `ca.pem`,
    /// `NAME.pem`, `NAME.key`) with the certificate `tls_name` (default `client`); with a
    /// `cluster_dir` of a cluster started with `--tls` its `tls` directory is used without
    /// asking. Under TLS the HMAC handshake with the secret still runs inside it.
    #[staticmethod]
    #[pyo3(signature = (*, cluster_dir=None, superpeers=None, secret=None,
        secret_file=None, connect_timeout=CONNECT_TIMEOUT_DEFAULT,
        timeout=CALL_TIMEOUT_DEFAULT, durability=None, listen=None, lane_spin=None,
        tls_dir=None, tls_name=None))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        cluster_dir: Option<PathBuf>,
        superpeers: Option<&Bound<'_, PyAny>>,
        secret: Option<String>,
        secret_file: Option<PathBuf>,
        connect_timeout: f64,
        timeout: f64,
        durability: Option<&Bound<'_, PyAny>>,
        listen: Option<String>,
        lane_spin: Option<f64>,
        tls_dir: Option<PathBuf>,
        tls_name: Option<String>,
    ) -> PyResult<Client> {
        let spec = connect_spec(
            cluster_dir,
            superpeers,
            secret,
            secret_file,
            connect_timeout,
            timeout,
            durability,
            listen,
            lane_spin,
            TlsArgs {
                dir: tls_dir,
                name: tls_name,
            },
        )?;
        let core = py
            .detach(move || Core::connect(spec))
            .map_err(|error| errors::to_py(py, error))?;
        Ok(Client {
            core: Arc::new(core),
        })
    }

    /// This client's node ID (assigned by the superpeers).
    #[getter]
    fn node_id(&self) -> u16 {
        self.core.client().node_id().0
    }

    /// The `asyncio` view of this client: the same calls, returning awaitables.
    #[getter]
    fn aio(&self) -> AsyncClient {
        AsyncClient::new(Arc::clone(&self.core))
    }

    /// Reads one chunk's bytes.
    #[pyo3(signature = (cid, *, timeout=None))]
    fn get(&self, py: Python<'_>, cid: u64, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let (api, _) = self.core.chunks(timeout, None)?;
        let data = self
            .core
            .wait(py, move || api.blocking().get(ops::cid(cid)))?;
        convert::bytes(py, data)
    }

    /// Replaces one chunk's bytes (the data must have the chunk's size; see `resize`).
    #[pyo3(signature = (cid, data, *, timeout=None, durability=None))]
    fn put(
        &self,
        py: Python<'_>,
        cid: u64,
        data: PyBackedBytes,
        timeout: Option<f64>,
        durability: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (api, _) = self.core.chunks(timeout, durability)?;
        let data = payload(&data);
        self.core
            .wait(py, move || api.blocking().put(ops::cid(cid), data))
    }

    /// A chunk lock as a context manager (`with client.lock(cid): ...`, or `async with`
    /// on the async client): taken on entry (waiting at most `wait` seconds at the
    /// owner), released on exit.
    #[pyo3(signature = (cid, *, write=true, wait=1.0, timeout=None))]
    fn lock(&self, cid: u64, write: bool, wait: f64, timeout: Option<f64>) -> ChunkLock {
        ChunkLock::new(&self.core, cid, write, wait, timeout)
    }

    /// Leaves the cluster (bounded); later calls fail with `ShutdownError`.
    fn close(&self, py: Python<'_>) {
        self.core.close(py);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.core.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!("<myriad.Client node={}>", self.core.client().node_id().0)
    }
}

/// A chunk's lock as a context manager, for `with` and `async with`.
#[pyclass(frozen, module = "myriad._myriad")]
pub struct ChunkLock {
    core: Arc<Core>,
    cid: u64,
    write: bool,
    wait: f64,
    timeout: Option<f64>,
}

impl ChunkLock {
    /// The lock of `cid` (not taken yet).
    pub fn new(core: &Arc<Core>, cid: u64, write: bool, wait: f64, timeout: Option<f64>) -> Self {
        ChunkLock {
            core: Arc::clone(core),
            cid,
            write,
            wait,
            timeout,
        }
    }
}

#[pymethods]
impl ChunkLock {
    /// The locked chunk's CID.
    #[getter]
    fn cid(&self) -> u64 {
        self.cid
    }

    fn __enter__(&self, py: Python<'_>) -> PyResult<u64> {
        let call = self
            .core
            .op_lock(self.cid, self.write, self.wait, self.timeout)?;
        call.block(py)?;
        Ok(self.cid)
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.core
            .op_unlock(self.cid, self.write, self.timeout)?
            .block(py)?;
        Ok(false)
    }

    fn __aenter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.core
            .op_lock(self.cid, self.write, self.wait, self.timeout)?
            .spawn(py)
    }

    #[pyo3(signature = (*_args))]
    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        _args: &Bound<'_, pyo3::types::PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.core
            .op_unlock(self.cid, self.write, self.timeout)?
            .spawn(py)
    }
}
