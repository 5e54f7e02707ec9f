//! The compute platform from Python (blocking calls of `myriad.Client`): run a registered
//! job by name on a peer, run a task script on a compute group, give a peer a role in a
//! group, read a group's master and slaves.
//! Each call waits with the GIL released and maps the platform's errors onto the client's
//! exception classes (`myriad.errors`): an unreachable node → `NodeUnavailableError`, a
//! job's or master's refusal or failure → `ServerError`, no result in time →
//! `TimeoutError`, bad input (an unparsable script, a group without master) →
//! `InvalidArgumentError`, undecodable answers → `ProtocolError`.

use std::time::Duration;

use bytes::Bytes;
use myriad_client::ClientError;
use myriad_compute::client::{self as compute, ComputeError};
use myriad_compute::job::JobError;
use myriad_compute::script::TaskScript;
use myriad_compute::wire::{Role, ScriptEnd};
use myriad_types::NodeId;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::client::Client;
use crate::ops::payload;

/// A job error as the client error Python raises.
fn job_error(error: JobError, node: NodeId, timeout: Duration) -> ClientError {
    match error {
        JobError::Unreachable { node, .. } => ClientError::NodeUnavailable(node),
        JobError::Timeout(_) => ClientError::Timeout {
            what: format!("job on node {node}"),
            timeout_ms: timeout.as_millis() as u64,
        },
        JobError::Encoding(reason) => ClientError::Protocol(reason),
        JobError::UnknownJob(_) => ClientError::InvalidArgument(error.to_string()),
        other => ClientError::Server {
            node,
            reason: other.to_string(),
        },
    }
}

/// A compute error as the client error Python raises.
fn compute_error(error: ComputeError) -> ClientError {
    match error {
        ComputeError::NoMaster(_) => ClientError::InvalidArgument(error.to_string()),
        ComputeError::Unreachable { node, .. } => ClientError::NodeUnavailable(node),
        ComputeError::Refused { node, reason } => ClientError::Server { node, reason },
        ComputeError::Protocol { node, reason } => {
            ClientError::Protocol(format!("node {node}: {reason}"))
        }
        ComputeError::Names(reason) => ClientError::Server {
            node: NodeId(0),
            reason: format!("nameservice: {reason}"),
        },
    }
}

#[pymethods]
impl Client {
    /// Runs the job registered as `name` on peer `node` with the raw parameter bytes
    /// `params` (the job's own encoding; empty for none) and returns its raw result bytes.
    /// The peer must run the compute service (capability `compute`).
    #[pyo3(signature = (node, name, params=None, *, timeout=None))]
    fn run_job(
        &self,
        py: Python<'_>,
        node: u16,
        name: String,
        params: Option<PyBackedBytes>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let core = self.core();
        let timeout = core.timeout(timeout)?;
        let client = core.client().clone();
        let params = params.as_ref().map(payload).unwrap_or_default();
        let node = NodeId(node);
        let result: Bytes = core.wait(py, move || {
            compute::run_job_raw(&client, node, &name, params, timeout)
                .map_err(|error| job_error(error, node, timeout))
        })?;
        Ok(PyBytes::new(py, &result).into_any().unbind())
    }

    /// Runs a task script (TOML or JSON text, as `comptaskscript` takes) on compute group
    /// `group` through its master and waits for the end. Returns a dict: `id`, `end`
    /// (`"finished"`, `"aborted"` or `"failed"`), `reason` (for the last two, else
    /// `None`) and `tasks`: per task `task`, `slaves` (node IDs by slave index), `values`
    /// (each slave's returned bytes), `micros` and `skipped`.
    #[pyo3(signature = (group, script, *, timeout=None))]
    fn run_task_script(
        &self,
        py: Python<'_>,
        group: u16,
        script: String,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let core = self.core();
        let timeout = core.timeout(timeout)?;
        let parsed = TaskScript::parse(&script).map_err(|error| {
            crate::errors::to_py(
                py,
                ClientError::InvalidArgument(format!("task script: {error}")),
            )
        })?;
        let request = parsed.to_request(group);
        let client = core.client().clone();
        let reply = core.wait(py, move || {
            compute::submit(&client, &request, timeout).map_err(compute_error)
        })?;
        let dict = PyDict::new(py);
        dict.set_item("id", reply.id)?;
        let (end, reason) = match reply.end {
            ScriptEnd::Finished => ("finished", None),
            ScriptEnd::Aborted(reason) => ("aborted", Some(reason)),
            ScriptEnd::Failed(reason) => ("failed", Some(reason)),
        };
        dict.set_item("end", end)?;
        dict.set_item("reason", reason)?;
        let tasks = PyList::empty(py);
        for outcome in reply.tasks {
            let task = PyDict::new(py);
            task.set_item("task", outcome.task)?;
            let slaves: Vec<u16> = outcome.slaves.iter().map(|node| node.0).collect();
            task.set_item("slaves", slaves)?;
            let values = PyList::empty(py);
            for value in &outcome.values {
                values.append(PyBytes::new(py, value))?;
            }
            task.set_item("values", values)?;
            task.set_item("micros", outcome.micros)?;
            task.set_item("skipped", outcome.skipped)?;
            tasks.append(task)?;
        }
        dict.set_item("tasks", tasks)?;
        Ok(dict.into_any().unbind())
    }

    /// Gives peer `node` the role `role` (`"master"`, `"slave"` or `"none"`) in compute
    /// group `group` (the terminal's `compgrpjoin`).
    #[pyo3(signature = (node, group, role))]
    fn compute_set_role(&self, py: Python<'_>, node: u16, group: u16, role: &str) -> PyResult<()> {
        let role = match role {
            "master" => Role::Master,
            "slave" => Role::Slave,
            "none" => Role::None,
            other => {
                return Err(crate::errors::to_py(
                    py,
                    ClientError::InvalidArgument(format!(
                        "role {other:?} is not master, slave or none"
                    )),
                ))
            }
        };
        let client = self.core().client().clone();
        self.core().wait(py, move || {
            compute::set_role(&client, NodeId(node), group, role).map_err(compute_error)
        })
    }

    /// The master and the slaves (node IDs, by slave index) of compute group `group`.
    #[pyo3(signature = (group))]
    fn compute_group(&self, py: Python<'_>, group: u16) -> PyResult<(u16, Vec<u16>)> {
        let client = self.core().client().clone();
        let status = self.core().wait(py, move || {
            compute::group_status(&client, group).map_err(compute_error)
        })?;
        Ok((
            status.master.0,
            status.slaves.iter().map(|node| node.0).collect(),
        ))
    }
}
