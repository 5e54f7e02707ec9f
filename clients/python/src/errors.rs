//! `ClientError` → Python exception: one class of `myriad.errors` per error kind, with
//! the error's fields as attributes (`kind`, `cid`, `node`, `timeout_ms`, and `index` for
//! the failing item of a batch).
//!
//! The classes are defined in Python (`python/myriad/errors.py`) so that they can also
//! derive from the built-in exception a Python programmer expects (`TimeoutError`,
//! `ConnectionError`, `KeyError`, `ValueError`).
//!
//! # Invariants
//! - Every `ClientError` maps to exactly one class ([`class_name`]); a failure to build
//!   the exception (module missing) becomes a `RuntimeError` carrying the same message.

use myriad_client::ClientError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The `myriad.errors` class of an error kind, and the kind's name.
pub fn class_name(error: &ClientError) -> (&'static str, &'static str) {
    match error {
        ClientError::NotFound(_) => ("NotFoundError", "not_found"),
        ClientError::NodeUnavailable(_) => ("NodeUnavailableError", "node_unavailable"),
        ClientError::Timeout { .. } => ("TimeoutError", "timeout"),
        ClientError::SuperpeersUnavailable(_) => {
            ("SuperpeersUnavailableError", "superpeers_unavailable")
        }
        ClientError::Meta(_) => ("MetaError", "meta"),
        ClientError::OutOfSpace { .. } => ("OutOfSpaceError", "out_of_space"),
        ClientError::LockTimeout(_) => ("LockTimeoutError", "lock_timeout"),
        ClientError::InvalidArgument(_) => ("InvalidArgumentError", "invalid_argument"),
        ClientError::Protocol(_) => ("ProtocolError", "protocol"),
        ClientError::Server { .. } => ("ServerError", "server"),
        ClientError::Join(_) => ("JoinError", "join"),
        ClientError::Shutdown => ("ShutdownError", "shutdown"),
    }
}

/// The Python exception for `error`.
pub fn to_py(py: Python<'_>, error: ClientError) -> PyErr {
    build(py, &error, None)
        .unwrap_or_else(|failure| PyRuntimeError::new_err(format!("{error} ({failure})")))
}

/// The Python exception for `error` of the batch item at `index`.
pub fn item_to_py(py: Python<'_>, error: ClientError, index: usize) -> PyErr {
    build(py, &error, Some(index)).unwrap_or_else(|failure| {
        PyRuntimeError::new_err(format!("item {index}: {error} ({failure})"))
    })
}

fn build(py: Python<'_>, error: &ClientError, index: Option<usize>) -> PyResult<PyErr> {
    let (class, kind) = class_name(error);
    let class = py.import("myriad.errors")?.getattr(class)?;
    let message = match index {
        Some(index) => format!("item {index}: {error}"),
        None => error.to_string(),
    };
    let value = class.call1((message,))?;
    value.setattr("kind", kind)?;
    value.setattr("index", index)?;
    let (cid, node, timeout_ms) = match error {
        ClientError::NotFound(cid) | ClientError::LockTimeout(cid) => (Some(cid.raw()), None, None),
        ClientError::NodeUnavailable(node)
        | ClientError::OutOfSpace { node, .. }
        | ClientError::Server { node, .. } => (None, Some(node.0), None),
        ClientError::Timeout { timeout_ms, .. } => (None, None, Some(*timeout_ms)),
        _ => (None, None, None),
    };
    value.setattr("cid", cid)?;
    value.setattr("node", node)?;
    value.setattr("timeout_ms", timeout_ms)?;
    Ok(PyErr::from_value(value))
}

/// The first failed item of a batch as a Python exception (with its index), or the values.
pub fn all_ok<T>(py: Python<'_>, results: Vec<Result<T, ClientError>>) -> PyResult<Vec<T>> {
    let mut values = Vec::with_capacity(results.len());
    for (index, result) in results.into_iter().enumerate() {
        match result {
            Ok(value) => values.push(value),
            Err(error) => return Err(item_to_py(py, error, index)),
        }
    }
    Ok(values)
}
