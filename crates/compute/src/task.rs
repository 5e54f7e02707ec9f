//! Tasks: the code a compute group's master runs on all of its slaves at once, and what a
//! task sees while it runs.
//!
//! # Job
//! - [`Task`]: a named, registered task; `run` gets a [`TaskContext`] and returns a value
//!   (bytes; [`int_value`] for the integers script conditions test).
//! - [`TaskRegistry`]: tasks by name.
//! - [`TaskContext`]: the group ID, this slave's index, every slave's node ID, the
//!   parameters, the local chunk API and the client (via [`TaskContext::env`]),
//!   messaging between the slaves ([`TaskContext::send`], [`TaskContext::recv_timeout`])
//!   and barriers that exchange a value per slave ([`TaskContext::barrier`]).
//!
//! # Invariants
//! - When [`TaskContext::barrier`] returns `Ok`, every message any slave sent before it
//!   entered that barrier is in this slave's inbox (counts are exchanged through the
//!   master and the barrier waits for the missing ones).
//! - Once the run is aborted (a slave failed, the master gave up), every barrier and
//!   receive returns [`TaskError::Aborted`] at once, so a task never hangs on a dead
//!   slave.
//!
//! # Who calls it
//! Users implement [`Task`]; the slave side ([`crate::slave`]) builds the context.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_types::NodeId;
use thiserror::Error;

use crate::env::{LocalChunkApi, PeerEnv};
use crate::slave::SlaveRun;
use crate::wire::NAME_BYTES_MAX;

/// Why a task's call into its context failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TaskError {
    /// The run was aborted (the reason: a slave failed, a timeout, ...).
    #[error("the run was aborted: {0}")]
    Aborted(String),
    /// A barrier or receive did not complete in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// A message could not be sent.
    #[error("sending to slave {index} (node {node}) failed: {reason}")]
    Send {
        /// The slave's index.
        index: usize,
        /// Its node.
        node: NodeId,
        /// What the messaging layer said.
        reason: String,
    },
    /// Anything else (bad index, no peer services).
    #[error("{0}")]
    Invalid(String),
}

/// A task: code run on every slave of a group at once.
pub trait Task: Send + Sync + 'static {
    /// The name it is registered under.
    fn name(&self) -> &str;
    /// Runs on one slave. The returned bytes go to the master (and the submitter).
    fn run(&self, ctx: &TaskContext) -> Result<Bytes, String>;
}

/// An integer task value (what script conditions test): 8 bytes, little endian.
pub fn int_value(value: i64) -> Bytes {
    Bytes::copy_from_slice(&value.to_le_bytes())
}

/// Reads a value made by [`int_value`].
pub fn read_int(value: &[u8]) -> Option<i64> {
    <[u8; 8]>::try_from(value).ok().map(i64::from_le_bytes)
}

/// The tasks a peer can run, by name.
#[derive(Clone, Default)]
pub struct TaskRegistry {
    tasks: HashMap<String, Arc<dyn Task>>,
}

impl std::fmt::Debug for TaskRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskRegistry")
            .field("tasks", &self.names())
            .finish()
    }
}

impl TaskRegistry {
    /// Registers `task` under its name (replacing one of the same name). Panics on a name
    /// longer than the wire allows: a programming error found at start-up.
    pub fn register(&mut self, task: impl Task) -> &mut Self {
        let name = task.name().to_owned();
        assert!(
            name.len() <= NAME_BYTES_MAX,
            "task name {name:?} is longer than {NAME_BYTES_MAX} bytes"
        );
        self.tasks.insert(name, Arc::new(task));
        self
    }

    /// The task of this name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Task>> {
        self.tasks.get(name).cloned()
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tasks.keys().cloned().collect();
        names.sort();
        names
    }
}

/// What a task sees on one slave. See the module documentation.
pub struct TaskContext {
    pub(crate) run: Arc<SlaveRun>,
    pub(crate) env: PeerEnv,
    pub(crate) params: Bytes,
    pub(crate) timeout: Duration,
}

impl std::fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskContext")
            .field("group", &self.run.group)
            .field("index", &self.run.index)
            .field("slaves", &self.run.slaves)
            .finish()
    }
}

impl TaskContext {
    /// The compute group.
    pub fn group(&self) -> u16 {
        self.run.group
    }

    /// This slave's index (0..slaves().len()), e.g. its partition number.
    pub fn index(&self) -> usize {
        self.run.index
    }

    /// Every slave of this run, by index.
    pub fn slaves(&self) -> &[NodeId] {
        &self.run.slaves
    }

    /// This node.
    pub fn node_id(&self) -> NodeId {
        self.run.slaves[self.run.index]
    }

    /// The task's parameters.
    pub fn params(&self) -> &Bytes {
        &self.params
    }

    /// The parameters as JSON (tasks from script files get their `params` table as JSON;
    /// empty parameters read as `null`).
    pub fn params_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        let text: &[u8] = if self.params.is_empty() {
            b"null"
        } else {
            &self.params
        };
        serde_json::from_slice(text).map_err(|error| format!("task parameters: {error}"))
    }

    /// The peer's services: client (remote chunks, nameservice), membership.
    pub fn env(&self) -> &PeerEnv {
        &self.env
    }

    /// The local chunk API (no network hop).
    pub fn local(&self) -> LocalChunkApi<'_> {
        self.env.local()
    }

    /// Whether the run was aborted (long tasks should check it now and then).
    pub fn is_aborted(&self) -> bool {
        self.run.aborted().is_some()
    }

    /// Sends `payload` to slave `to` (one-way; to itself it goes straight to the inbox).
    pub fn send(&self, to: usize, payload: Bytes) -> Result<(), TaskError> {
        self.run.send(&self.env, to, payload)
    }

    /// The next message from another slave as `(sender index, payload)`, waiting at most
    /// `timeout`; `Ok(None)` when none came.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<(usize, Bytes)>, TaskError> {
        self.run.recv_timeout(timeout)
    }

    /// A message if one is waiting.
    pub fn try_recv(&self) -> Result<Option<(usize, Bytes)>, TaskError> {
        self.run.recv_timeout(Duration::ZERO)
    }

    /// Waits until every slave reached this barrier (and every message sent before it is
    /// in the inbox); returns every slave's `value`, by index. Fails when the run is
    /// aborted or the task's timeout passes first.
    pub fn barrier(&self, value: Bytes) -> Result<Vec<Bytes>, TaskError> {
        self.run.barrier(&self.env, value, self.timeout)
    }

    /// [`TaskContext::barrier`] with an integer per slave; returns their sum.
    pub fn barrier_sum(&self, value: i64) -> Result<i64, TaskError> {
        let values = self.barrier(int_value(value))?;
        Ok(values.iter().filter_map(|value| read_int(value)).sum())
    }
}
