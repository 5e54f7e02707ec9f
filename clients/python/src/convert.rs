//! Rust results → Python objects: node records, cluster and recovery status and barrier
//! status as dicts (plain data, stable keys documented in `myriad/__init__.pyi`), byte
//! payloads as `bytes`.

use bytes::Bytes;
use myriad_meta::{NodeRecord, NodeState, Role};
use myriad_proto::meta::{BarrierStatus, StatusReply};
use myriad_proto::recovery::{RecoveryState, RecoveryStatusReply};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use pyo3::IntoPyObjectExt;

/// `superpeer`, `peer` or `client`.
pub fn role_name(role: Role) -> &'static str {
    match role {
        Role::Superpeer => "superpeer",
        Role::Peer => "peer",
        Role::Client => "client",
    }
}

/// A node record as a dict: `id`, `role`, `address`, `state` (`alive`, `failed`,
/// `left`), `failed_epoch`, `rack`, `switch`, `capabilities`, `incarnation`,
/// `joined_epoch`, `released`.
pub fn node(py: Python<'_>, record: &NodeRecord) -> PyResult<Py<PyAny>> {
    let dict = PyDict::new(py);
    dict.set_item("id", record.id.0)?;
    dict.set_item("role", role_name(record.role))?;
    dict.set_item("address", &record.address)?;
    let (state, failed_epoch) = match record.state {
        NodeState::Alive => ("alive", None),
        NodeState::Failed { epoch } => ("failed", Some(epoch)),
        NodeState::Left => ("left", None),
    };
    dict.set_item("state", state)?;
    dict.set_item("failed_epoch", failed_epoch)?;
    dict.set_item("rack", record.rack)?;
    dict.set_item("switch", record.switch)?;
    dict.set_item("capabilities", record.capabilities.0)?;
    dict.set_item("incarnation", record.incarnation)?;
    dict.set_item("joined_epoch", record.joined_epoch)?;
    dict.set_item("released", record.released)?;
    Ok(dict.into_any().unbind())
}

/// A list of node records as a list of dicts.
pub fn nodes(py: Python<'_>, records: Vec<NodeRecord>) -> PyResult<Py<PyAny>> {
    let list = records
        .iter()
        .map(|record| node(py, record))
        .collect::<PyResult<Vec<_>>>()?;
    list.into_py_any(py)
}

/// The superpeer group's status as a dict: `node`, `epoch`, `leader`, `term`,
/// `last_log_index`, `last_applied_index`, `members` (list of `(id, address)`).
pub fn status(py: Python<'_>, status: StatusReply) -> PyResult<Py<PyAny>> {
    let dict = PyDict::new(py);
    dict.set_item("node", status.node.0)?;
    dict.set_item("epoch", status.epoch)?;
    dict.set_item("leader", status.leader.map(|node| node.0))?;
    dict.set_item("term", status.term)?;
    dict.set_item("last_log_index", status.last_log_index)?;
    dict.set_item("last_applied_index", status.last_applied_index)?;
    let members: Vec<(u16, String)> = status
        .members
        .into_iter()
        .map(|(node, address)| (node.0, address))
        .collect();
    dict.set_item("members", members)?;
    Ok(dict.into_any().unbind())
}

fn recovery_state(state: RecoveryState) -> &'static str {
    match state {
        RecoveryState::Pending => "pending",
        RecoveryState::Running => "running",
        RecoveryState::Done => "done",
        RecoveryState::Failed => "failed",
        RecoveryState::Waiting => "waiting",
        RecoveryState::Lost => "lost",
    }
}

/// The leader's recovery table as a dict: `leader` (bool) and `zones`, a list of dicts
/// with `owner`, `zone`, `state`, `restorer`, `chunks`, `ms`, `detail`.
pub fn recovery(py: Python<'_>, reply: RecoveryStatusReply) -> PyResult<Py<PyAny>> {
    let dict = PyDict::new(py);
    dict.set_item("leader", reply.leader)?;
    let mut zones = Vec::with_capacity(reply.zones.len());
    for zone in reply.zones {
        let entry = PyDict::new(py);
        entry.set_item("owner", zone.owner.0)?;
        entry.set_item("zone", zone.zone)?;
        entry.set_item("state", recovery_state(zone.state))?;
        entry.set_item("restorer", zone.restorer.map(|node| node.0))?;
        entry.set_item("chunks", zone.chunks)?;
        entry.set_item("ms", zone.ms)?;
        entry.set_item("detail", zone.detail)?;
        zones.push(entry);
    }
    dict.set_item("zones", zones)?;
    Ok(dict.into_any().unbind())
}

/// A barrier's status as a dict (`size`, `round`, `signed`, `last_released` as a list of
/// `(node, value)`), or `None`.
pub fn barrier(py: Python<'_>, status: Option<BarrierStatus>) -> PyResult<Py<PyAny>> {
    let Some(status) = status else {
        return Ok(py.None());
    };
    let dict = PyDict::new(py);
    dict.set_item("size", status.size)?;
    dict.set_item("round", status.round)?;
    dict.set_item("signed", status.signed)?;
    let released: Vec<(u16, u64)> = status
        .last_released
        .into_iter()
        .map(|(node, value)| (node.0, value))
        .collect();
    dict.set_item("last_released", released)?;
    Ok(dict.into_any().unbind())
}

/// A payload as `bytes` (one copy).
pub fn bytes(py: Python<'_>, data: Bytes) -> PyResult<Py<PyAny>> {
    Ok(PyBytes::new(py, &data).into_any().unbind())
}

/// Any value with a Python conversion, as an object.
pub fn object<'py, T: IntoPyObject<'py>>(py: Python<'py>, value: T) -> PyResult<Py<PyAny>> {
    value.into_py_any(py)
}
