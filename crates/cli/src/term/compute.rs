//! The terminal's compute commands (DXTerm's `compgrpls`, `compgrpstatus`, `comptask`,
//! `comptaskscript`, plus `compgrpjoin` and `compapp`), mapped to `myriad-compute`'s
//! client calls.
//!
//! # Job
//! Returns plain JSON like every backend call: groups and roles as a table, a group's
//! status as an object with its submissions, a run's outcome with every task's values by
//! slave (8-byte values shown as integers, others as hex) and timings.
//!
//! # Invariants
//! Every call is bounded: group requests by the compute client's timeouts, a submission by
//! [`SUBMIT_WAIT`].
//!
//! # Who calls it
//! [`super::backend::ClientBackend`].

use std::time::Duration;

use bytes::Bytes;
use myriad_client::client::Client;
use myriad_compute::client::{group_status, node_info, set_role, start_app, submit};
use myriad_compute::wire::{ScriptEnd, SubmitReply, SubmitRequest};
use myriad_compute::{read_int, Role, TaskScript};
use myriad_meta::{Capabilities, NodeState};
use serde_json::{json, Value};

use super::TermCommand;

/// Longest wait of `comptask` and `comptaskscript` for the outcome.
pub const SUBMIT_WAIT: Duration = Duration::from_secs(600);

/// Runs one compute command.
pub fn dispatch(client: &Client, command: &TermCommand) -> Result<Value, String> {
    let text = |error: myriad_compute::ComputeError| error.to_string();
    match command {
        TermCommand::CompGroupList => group_list(client),
        TermCommand::CompGroupStatus { group } => {
            let status = group_status(client, *group).map_err(text)?;
            Ok(json!({
                "group": status.group,
                "master": status.master.to_string(),
                "slaves": status.slaves.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "submissions": status.entries.iter().map(|entry| json!({
                    "id": entry.id,
                    "name": entry.name,
                    "state": entry.state,
                    "queued_ms": entry.queued_micros as f64 / 1000.0,
                    "run_ms": entry.run_micros as f64 / 1000.0,
                    "detail": entry.detail,
                })).collect::<Vec<_>>(),
            }))
        }
        TermCommand::CompTask {
            group,
            task,
            params,
            slaves_min,
            slaves_max,
        } => {
            let mut request =
                TaskScript::single(task, Bytes::from(params.clone()), *slaves_min, *slaves_max);
            request.group = *group;
            outcome(client, &request)
        }
        TermCommand::CompTaskScript { group, path } => {
            let script = std::fs::read_to_string(path)
                .map_err(|error| format!("reading {path}: {error}"))?;
            let script = TaskScript::parse(&script).map_err(|error| error.to_string())?;
            outcome(client, &script.to_request(*group))
        }
        TermCommand::Graph500 {
            group,
            scale,
            slaves,
            roots,
            edgefactor,
        } => graph500(client, *group, *scale, *slaves, *roots, *edgefactor),
        TermCommand::CompGroupJoin { node, group, role } => {
            let role: Role = role.parse()?;
            set_role(client, *node, *group, role).map_err(text)?;
            Ok(Value::Null)
        }
        TermCommand::CompApp { node, name } => {
            start_app(client, *node, name).map_err(text)?;
            Ok(Value::Null)
        }
        other => Err(format!("{} is not a compute command", other.name())),
    }
}

/// Every alive compute-capable peer's role and group.
fn group_list(client: &Client) -> Result<Value, String> {
    let nodes = client
        .blocking()
        .nodes()
        .map_err(|error| error.to_string())?;
    let rows = nodes
        .iter()
        .filter(|node| {
            node.role == myriad_meta::Role::Peer
                && node.state == NodeState::Alive
                && node.capabilities.contains(Capabilities::COMPUTE)
        })
        .map(|node| match node_info(client, node.id) {
            Ok((role, group)) => json!({
                "node": node.id.to_string(),
                "role": role.as_str(),
                "group": if role == Role::None { Value::Null } else { json!(group) },
            }),
            Err(error) => json!({"node": node.id.to_string(), "role": format!("? ({error})")}),
        })
        .collect();
    Ok(Value::Array(rows))
}

fn show_value(value: &Bytes) -> Value {
    match read_int(value) {
        Some(number) => json!(number),
        None => json!(value.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    }
}

/// Submits and renders the outcome; a failed script is an error with its reason (and the
/// tasks that ran), an aborted one (a condition stopped it) is not.
fn outcome(client: &Client, request: &SubmitRequest) -> Result<Value, String> {
    let reply: SubmitReply =
        submit(client, request, SUBMIT_WAIT).map_err(|error| error.to_string())?;
    let tasks: Vec<Value> = reply
        .tasks
        .iter()
        .map(|task| {
            json!({
                "task": task.task,
                "slaves": task.slaves.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "values": task.values.iter().map(show_value).collect::<Vec<_>>(),
                "ms": task.micros as f64 / 1000.0,
                "skipped": task.skipped,
            })
        })
        .collect();
    match &reply.end {
        ScriptEnd::Finished => Ok(json!({"id": reply.id, "state": "finished", "tasks": tasks})),
        // A condition stopping the script is an outcome the script asked for.
        ScriptEnd::Aborted(reason) => Ok(json!({
            "id": reply.id, "state": "aborted", "reason": reason, "tasks": tasks
        })),
        ScriptEnd::Failed(reason) => Err(format!(
            "script {} failed: {reason}; tasks run: {}",
            reply.id,
            Value::Array(tasks)
        )),
    }
}

/// `graph500`: the benchmark's load, roots, BFS and validation on a running group.
fn graph500(
    client: &Client,
    group: u16,
    scale: u32,
    slaves: u32,
    roots: u32,
    edgefactor: u32,
) -> Result<Value, String> {
    let slaves = match slaves {
        0 => group_status(client, group)
            .map_err(|error| error.to_string())?
            .slaves
            .len(),
        n => n as usize,
    };
    let args = myriad_bench::graph500::Graph500Args {
        scale,
        edgefactor,
        roots: roots as usize,
        peers: slaves,
        seed: 1,
        threads: None,
        top_down: false,
        local: false,
        peer_memory_mb: None,
        cluster: None,
        group,
        dir: None,
        json: true,
    };
    // The benchmark shows the load's progress bar and a line per batch of searches
    // (stderr, the bar on terminals only).
    let figures = myriad_bench::graph500::run_on_group(client, &args)?;
    let [hmean, min, median, max] = figures.mteps;
    Ok(json!({
        "scale": scale, "edgefactor": edgefactor, "peers": slaves, "roots": figures.roots,
        "validated": figures.validated, "mteps_hmean": hmean, "mteps_min": min,
        "mteps_median": median, "mteps_max": max, "load_secs": figures.load_secs,
        "bytes_per_edge": figures.bytes_per_edge,
    }))
}
