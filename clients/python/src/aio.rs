//! `myriad.AsyncClient`: the `asyncio` face of a client. Every call returns an awaitable
//! (an `asyncio` future of the running loop) resolved by a task on the client's runtime;
//! no thread waits and the GIL is free meanwhile. Get one with `Client.aio` or
//! `await myriad.connect_async(...)`. The calls it shares with `Client` are in
//! [`crate::methods`].
//!
//! # Invariants
//! - A cancelled awaitable does not cancel the request: it runs to its result or its
//!   timeout on the runtime and the result is dropped.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyAny;

use crate::client::ChunkLock;
use crate::core::Core;

/// The async view of a client: the same calls as `Client`, each returning an awaitable.
#[pyclass(frozen, module = "myriad._myriad")]
pub struct AsyncClient {
    core: Arc<Core>,
}

impl AsyncClient {
    /// The async view of a connected client.
    pub fn new(core: Arc<Core>) -> AsyncClient {
        AsyncClient { core }
    }

    /// The shared state.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }
}

#[pymethods]
impl AsyncClient {
    /// This client's node ID.
    #[getter]
    fn node_id(&self) -> u16 {
        self.core.client().node_id().0
    }

    /// Reads one chunk's bytes.
    #[pyo3(signature = (cid, *, timeout=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        cid: u64,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.core.op_get(cid, timeout)?.spawn(py)
    }

    /// Replaces one chunk's bytes.
    #[pyo3(signature = (cid, data, *, timeout=None, durability=None))]
    fn put<'py>(
        &self,
        py: Python<'py>,
        cid: u64,
        data: PyBackedBytes,
        timeout: Option<f64>,
        durability: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.core.op_put(cid, data, timeout, durability)?.spawn(py)
    }

    /// A chunk lock for `async with client.lock(cid): ...`.
    #[pyo3(signature = (cid, *, write=true, wait=1.0, timeout=None))]
    fn lock(&self, cid: u64, write: bool, wait: f64, timeout: Option<f64>) -> ChunkLock {
        ChunkLock::new(&self.core, cid, write, wait, timeout)
    }

    /// Leaves the cluster (bounded, blocking briefly with the GIL released).
    fn close(&self, py: Python<'_>) {
        self.core.close(py);
    }

    fn __repr__(&self) -> String {
        format!(
            "<myriad.AsyncClient node={}>",
            self.core.client().node_id().0
        )
    }
}
