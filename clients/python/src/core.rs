//! The state shared by the blocking and the async Python client, and the two ways a call
//! runs: [`Core::block`] (the calling thread waits with the GIL released) and
//! [`Core::spawn`] (a task on the client's runtime resolves an `asyncio` future).
//!
//! # Invariants
//! - A call's future is bounded by its timeout plus [`TIMEOUT_GRACE`]: the chunk API ends
//!   by itself within the timeout (its own typed error wins); metadata calls, which have
//!   no per-call timeout in the Rust client, end with [`ClientError::Timeout`] here.
//! - The GIL is never held while a call waits: `block` waits inside `Python::detach`;
//!   `spawn` takes the GIL only to build the result, on a blocking-pool thread, so the
//!   runtime's I/O workers never wait for the GIL.
//! - After `close`, no call starts (each raises `ShutdownError`); `close` shuts the
//!   runtime down only after the calls in flight ended (an async call once its future is
//!   resolved), so no call runs on a runtime that is gone.
//! - At most [`CHUNK_APIS_MAX`] chunk APIs (one per timeout and durability pair) are
//!   kept; beyond that the map is emptied (they only hold a routing cache).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use myriad_client::chunk::{ChunkOptions, Chunks};
use myriad_client::client::{Client, ClientConfig};
use myriad_client::membership::Membership;
use myriad_client::ClientError;
use myriad_launcher::LocalCluster as Launched;
use myriad_net::secret::{self, SecretError};
use myriad_net::{TlsConfig, SECRET_BYTES_MAX};
use myriad_types::NodeId;
use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyAny;
use tokio::runtime::Handle;

use crate::errors;

/// Extra time the outer bound of a call allows past its timeout, so that the chunk API's
/// own (more precise) timeout error is the one reported.
pub const TIMEOUT_GRACE: Duration = Duration::from_millis(500);
/// Most chunk APIs (timeout and durability pairs) cached per client.
pub const CHUNK_APIS_MAX: usize = 32;
/// Default timeout of each call, seconds.
pub const CALL_TIMEOUT_DEFAULT: f64 = 2.0;
/// Default longest wait to join the cluster, seconds.
pub const CONNECT_TIMEOUT_DEFAULT: f64 = 10.0;
/// Longest `lane_spin` accepted by `connect`.
pub const LANE_SPIN_MAX: Duration = Duration::from_millis(10);
/// Longest wait of `close` for the calls in flight to end.
pub const CLOSE_WAIT_MAX: Duration = Duration::from_secs(60);
/// Durability names by level (`myriad_proto::chunk::DURABILITY_*`).
pub const DURABILITY_NAMES: [&str; 4] = ["default", "async", "replicated", "durable"];

/// The chunk API of a cluster client.
pub type ChunkApi = Chunks<Membership>;
/// Superpeers as the client configuration names them.
pub type Superpeers = Vec<(NodeId, SocketAddr)>;

/// What a Python client holds: the Rust client, its runtime and the call defaults.
pub struct Core {
    client: Client,
    handle: Handle,
    timeout: Duration,
    durability: u8,
    /// Chunk APIs by (durability, timeout): `ChunkOptions` are per API in the Rust client.
    apis: Mutex<HashMap<(u8, Duration), Arc<ChunkApi>>>,
    /// Set by `close`: new calls fail with `ShutdownError`.
    closed: AtomicBool,
    /// Calls started and not finished (an async one until its future is resolved).
    in_flight: AtomicUsize,
}

impl Drop for Core {
    fn drop(&mut self) {
        // Leaves the cluster (bounded, 2 s) unless `close` did already. The last
        // reference may go on a runtime thread (an async call's), where the runtime
        // cannot be shut down: a plain thread does it then.
        if Handle::try_current().is_ok() {
            let client = self.client.clone();
            std::thread::spawn(move || client.shutdown());
        } else {
            self.client.shutdown();
        }
    }
}

/// A seconds value from Python as a duration (positive and finite).
pub fn seconds(value: f64, what: &str) -> PyResult<Duration> {
    if !(value.is_finite() && value > 0.0) {
        return Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds, not {value}"
        )));
    }
    Duration::try_from_secs_f64(value)
        .map_err(|error| PyValueError::new_err(format!("{what}: {error}")))
}

/// A durability level from Python: a name of [`DURABILITY_NAMES`] or its number.
pub fn durability(value: &Bound<'_, PyAny>) -> PyResult<u8> {
    if let Ok(name) = value.extract::<String>() {
        return DURABILITY_NAMES
            .iter()
            .position(|known| *known == name)
            .map(|level| level as u8)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "unknown durability {name:?}; one of {DURABILITY_NAMES:?}"
                ))
            });
    }
    match value.extract::<u8>() {
        Ok(level) if usize::from(level) < DURABILITY_NAMES.len() => Ok(level),
        _ => Err(PyTypeError::new_err(
            "durability is one of 'default', 'async', 'replicated', 'durable' (or 0..=3)",
        )),
    }
}

/// Parses `ID@HOST:PORT` or `ID=HOST:PORT` (the launcher's list uses `=`).
fn superpeer_entry(text: &str) -> PyResult<(NodeId, SocketAddr)> {
    let bad = || {
        PyValueError::new_err(format!(
            "superpeer {text:?}: expected 'ID@HOST:PORT' (e.g. '1@127.0.0.1:7000')"
        ))
    };
    let (id, address) = text
        .split_once('@')
        .or_else(|| text.split_once('='))
        .ok_or_else(bad)?;
    let id = myriad_launcher::parse_node_id(id.trim()).ok_or_else(bad)?;
    let address = address.trim().parse().map_err(|_| bad())?;
    Ok((NodeId(id), address))
}

/// The superpeers named in Python: strings `ID@HOST:PORT` or `(id, "HOST:PORT")` pairs.
pub fn superpeer_list(items: &Bound<'_, PyAny>) -> PyResult<Vec<(NodeId, SocketAddr)>> {
    if let Ok(text) = items.extract::<String>() {
        return text.split(',').map(superpeer_entry).collect();
    }
    let mut list = Vec::new();
    for item in items.try_iter()? {
        let item = item?;
        if let Ok(text) = item.extract::<String>() {
            list.push(superpeer_entry(&text)?);
        } else {
            let (id, address): (u16, String) = item.extract()?;
            let address = address
                .parse()
                .map_err(|_| PyValueError::new_err(format!("superpeer address {address:?}")))?;
            list.push((NodeId(id), address));
        }
    }
    Ok(list)
}

/// The cluster described by `DIR/cluster.json` (its superpeers, its secret's file).
pub fn open_cluster_dir(dir: &Path) -> PyResult<Launched> {
    Launched::open(dir).map_err(|error| {
        PyValueError::new_err(format!("cluster directory {}: {error}", dir.display()))
    })
}

/// The cluster secret `Client.connect` uses: `secret`, else the file `secret_file`, else
/// the cluster directory's file (`cluster.json`'s `secret_file`, else `DIR/secret`), else
/// the file named by `MYRIAD_SECRET_FILE`. `ValueError` if both `secret` and `secret_file`
/// are given, if a file is unusable (missing, readable by others, empty) or if there is
/// no secret at all: there is no default secret.
pub fn resolve_secret(
    secret: Option<String>,
    secret_file: Option<PathBuf>,
    cluster: Option<&Launched>,
) -> PyResult<Vec<u8>> {
    let unusable = |error: SecretError| PyValueError::new_err(error.to_string());
    match (secret, secret_file) {
        (Some(_), Some(_)) => Err(PyValueError::new_err(
            "give at most one of secret= and secret_file=",
        )),
        (Some(secret), None) => {
            if secret.is_empty() || secret.len() > SECRET_BYTES_MAX {
                return Err(PyValueError::new_err(format!(
                    "the secret must have 1 to {SECRET_BYTES_MAX} bytes"
                )));
            }
            Ok(secret.into_bytes())
        }
        (None, Some(file)) => secret::read_file(&file).map_err(unusable),
        (None, None) => {
            if let Some(cluster) = cluster {
                return secret::read_file(&cluster.secret_file()).map_err(unusable);
            }
            secret::from_env().map_err(unusable)?.ok_or_else(|| {
                PyValueError::new_err(format!(
                    "no cluster secret: give secret=, secret_file= or cluster_dir=, or set {}",
                    secret::SECRET_FILE_ENV
                ))
            })
        }
    }
}

/// The certificate name a client uses when `tls_name` is not given: the one
/// `myriad cluster start --tls` issues for clients (`DIR/tls/client.pem`).
pub const TLS_NAME_DEFAULT: &str = "client";

/// The TLS configuration `Client.connect` uses: `DIR/ca.pem`, `DIR/NAME.pem` and
/// `DIR/NAME.key` of `tls_dir` (a directory written by `myriad cert`), `NAME` being
/// `tls_name` or [`TLS_NAME_DEFAULT`]; without `tls_dir`, the cluster directory's TLS
/// directory (`cluster.json`'s `tls_dir`, a cluster started with `--tls`) with the
/// certificate `tls_name` or `client`, as `myriad term --cluster` does; else none (plain
/// TCP). `ValueError` for `tls_name` without any TLS directory, and for files that do not
/// load (missing, not PEM, a key that does not match its certificate).
pub fn resolve_tls(
    tls_dir: Option<PathBuf>,
    tls_name: Option<String>,
    cluster: Option<&Launched>,
) -> PyResult<Option<TlsConfig>> {
    let dir = match tls_dir.or_else(|| cluster.and_then(Launched::tls_dir)) {
        Some(dir) => dir,
        None if tls_name.is_some() => {
            return Err(PyValueError::new_err(
                "tls_name= needs tls_dir= (or a cluster_dir= of a cluster started with TLS)",
            ))
        }
        None => return Ok(None),
    };
    let name = tls_name.unwrap_or_else(|| TLS_NAME_DEFAULT.to_owned());
    TlsConfig::from_dir(&dir, &name)
        .map(Some)
        .map_err(|error| PyValueError::new_err(format!("TLS: {error}")))
}

/// How to connect (the arguments of `Client.connect`, parsed).
pub struct ConnectSpec {
    /// The superpeers to join through.
    pub superpeers: Vec<(NodeId, SocketAddr)>,
    /// The cluster secret (never empty: there is no default).
    pub secret: Vec<u8>,
    /// Longest wait to join.
    pub connect_timeout: Duration,
    /// Default timeout of each call.
    pub call_timeout: Duration,
    /// Default durability of changing calls.
    pub durability: u8,
    /// Address this client listens on (`None`: 127.0.0.1, any port).
    pub listen: Option<SocketAddr>,
    /// How long a lone blocking call polls its lane (`None`: the Rust client's default,
    /// `myriad_client::client::LANE_SPIN_DEFAULT`).
    pub lane_spin: Option<Duration>,
    /// TLS for every connection (`None`: plain TCP after the HMAC handshake).
    pub tls: Option<TlsConfig>,
}

impl Core {
    /// Joins the cluster (blocking; the caller releases the GIL).
    pub fn connect(spec: ConnectSpec) -> Result<Core, ClientError> {
        let mut config = ClientConfig::new(spec.superpeers);
        config.join.request_timeout = spec.connect_timeout;
        config.join.secret = spec.secret;
        if let Some(listen) = spec.listen {
            config.join.listen = listen;
        }
        config.chunks.timeout = spec.call_timeout;
        config.chunks.durability = spec.durability;
        if let Some(spin) = spec.lane_spin {
            config.join.lane_spin = spin;
        }
        config.join.tls = spec.tls;
        let client = Client::connect_with(config)?;
        let handle = client.membership().net().runtime();
        Ok(Core {
            client,
            handle,
            timeout: spec.call_timeout,
            durability: spec.durability,
            apis: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        })
    }

    /// The Rust client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The call timeout: the given one or the client's default.
    pub fn timeout(&self, timeout: Option<f64>) -> PyResult<Duration> {
        timeout.map_or(Ok(self.timeout), |value| seconds(value, "timeout"))
    }

    /// The chunk API for a call with these (optional) settings.
    pub fn chunks(
        &self,
        timeout: Option<f64>,
        durability: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Arc<Chunks<Membership>>, Duration)> {
        let timeout = self.timeout(timeout)?;
        let level = durability.map_or(Ok(self.durability), self::durability)?;
        let mut apis = self.apis.lock();
        if apis.len() >= CHUNK_APIS_MAX && !apis.contains_key(&(level, timeout)) {
            apis.clear();
        }
        let api = apis.entry((level, timeout)).or_insert_with(|| {
            let membership = Arc::clone(self.client.membership());
            let options = ChunkOptions {
                timeout,
                durability: level,
                ..ChunkOptions::default()
            };
            Arc::new(Chunks::new(membership.net().clone(), membership, options))
        });
        Ok((Arc::clone(api), timeout))
    }

    /// Counts a call in flight, or refuses it once the client is closed.
    fn enter(self: &Arc<Self>) -> Result<InFlight, ClientError> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight {
            core: Arc::clone(self),
        };
        if self.closed.load(Ordering::SeqCst) {
            return Err(ClientError::Shutdown);
        }
        Ok(guard)
    }

    /// Runs `future` on the client's runtime and waits for it with the GIL released.
    pub fn block<T, F>(
        self: &Arc<Self>,
        py: Python<'_>,
        timeout: Duration,
        future: F,
    ) -> PyResult<T>
    where
        T: Send,
        F: Future<Output = Result<T, ClientError>> + Send,
    {
        let _guard = self.enter().map_err(|error| errors::to_py(py, error))?;
        let handle = self.handle.clone();
        let result = py.detach(move || handle.block_on(bounded(timeout, future)));
        result.map_err(|error| errors::to_py(py, error))
    }

    /// Runs a blocking closure (which waits on the network) with the GIL released.
    pub fn wait<T, F>(self: &Arc<Self>, py: Python<'_>, call: F) -> PyResult<T>
    where
        T: Send,
        F: FnOnce() -> Result<T, ClientError> + Send,
    {
        let _guard = self.enter().map_err(|error| errors::to_py(py, error))?;
        py.detach(call).map_err(|error| errors::to_py(py, error))
    }

    /// Starts `future` on the client's runtime and returns an `asyncio` future (of the
    /// running loop) that `convert` resolves with the result.
    pub fn spawn<'py, T, F, C>(
        self: &Arc<Self>,
        py: Python<'py>,
        timeout: Duration,
        future: F,
        convert: C,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, ClientError>> + Send + 'static,
        C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
    {
        let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
        let awaitable = event_loop.call_method0("create_future")?;
        let resolve = py.import("myriad._aio")?.getattr("_resolve")?.unbind();
        let guard = self.enter().map_err(|error| errors::to_py(py, error))?;
        let event_loop = event_loop.unbind();
        let target = awaitable.clone().unbind();
        let handle = self.handle.clone();
        self.handle.spawn(async move {
            let result = bounded(timeout, future).await;
            // Building Python objects needs the GIL: wait for it off the I/O workers.
            // The guard lives until the future is resolved: `close` waits for it.
            // The join handle is not awaited: the closure resolves the future itself.
            drop(handle.spawn_blocking(move || {
                Python::attach(|py| {
                    let (ok, value) = match result.map_err(|e| errors::to_py(py, e)) {
                        Ok(value) => match convert(py, value) {
                            Ok(object) => (true, object),
                            Err(error) => (false, error.into_value(py).into_any()),
                        },
                        Err(error) => (false, error.into_value(py).into_any()),
                    };
                    // A closed loop has nobody left to tell.
                    let _ = event_loop.call_method1(
                        py,
                        "call_soon_threadsafe",
                        (resolve, target, ok, value),
                    );
                    drop(guard);
                })
            }));
        });
        Ok(awaitable)
    }

    /// Refuses new calls, waits (at most [`CLOSE_WAIT_MAX`]) for the calls in flight,
    /// then leaves the cluster (bounded) -- all with the GIL released. Later calls fail
    /// with `ShutdownError`.
    pub fn close(&self, py: Python<'_>) {
        self.closed.store(true, Ordering::SeqCst);
        py.detach(|| {
            let deadline = std::time::Instant::now() + CLOSE_WAIT_MAX;
            while self.in_flight.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            self.client.shutdown();
        });
    }
}

/// One call in flight (see [`Core::enter`]); uncounted when dropped.
struct InFlight {
    core: Arc<Core>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.core.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Turns a call's result into its Python value (with the GIL held).
pub type Convert<T> = Box<dyn for<'py> FnOnce(Python<'py>, T) -> PyResult<Py<PyAny>> + Send>;

/// The future of a boxed call.
pub type CallFuture<T> = Pin<Box<dyn Future<Output = Result<T, ClientError>> + Send>>;

/// One prepared call: its future, its timeout and how to present its result. The blocking
/// client runs it with [`Call::block`], the async one with [`Call::spawn`].
pub struct Call<T> {
    core: Arc<Core>,
    timeout: Duration,
    future: CallFuture<T>,
    convert: Convert<T>,
    /// What the blocking client runs instead of the future, when the Rust client has a
    /// faster blocking path (direct request lanes, no runtime hand-off).
    blocking: Option<Blocking<T>>,
}

/// A blocking alternative of a call's future.
pub type Blocking<T> = Box<dyn FnOnce() -> Result<T, ClientError> + Send>;

impl<T: Send + 'static> Call<T> {
    /// A call of `core` bounded by `timeout`.
    pub fn new(
        core: &Arc<Core>,
        timeout: Duration,
        future: impl Future<Output = Result<T, ClientError>> + Send + 'static,
        convert: impl for<'py> FnOnce(Python<'py>, T) -> PyResult<Py<PyAny>> + Send + 'static,
    ) -> Call<T> {
        Call {
            core: Arc::clone(core),
            timeout,
            future: Box::pin(future),
            convert: Box::new(convert),
            blocking: None,
        }
    }

    /// Gives the blocking client `call` to run instead of the future (it must do the same
    /// and honour the call's timeout itself, as the blocking chunk API does).
    pub fn with_blocking(
        mut self,
        call: impl FnOnce() -> Result<T, ClientError> + Send + 'static,
    ) -> Call<T> {
        self.blocking = Some(Box::new(call));
        self
    }

    /// Runs the call, waiting with the GIL released.
    pub fn block(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let value = match self.blocking {
            Some(call) => self.core.wait(py, call)?,
            None => self.core.block(py, self.timeout, self.future)?,
        };
        (self.convert)(py, value)
    }

    /// Starts the call; returns the `asyncio` future of its result.
    pub fn spawn(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        self.core.spawn(py, self.timeout, self.future, self.convert)
    }
}

/// `future` bounded by `timeout` plus [`TIMEOUT_GRACE`].
async fn bounded<T>(
    timeout: Duration,
    future: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    let limit = timeout + TIMEOUT_GRACE;
    match tokio::time::timeout(limit, future).await {
        Ok(result) => result,
        Err(_) => Err(ClientError::Timeout {
            what: "the call".into(),
            timeout_ms: timeout.as_millis().min(u128::from(u64::MAX)) as u64,
        }),
    }
}
