//! Jobs: short units of work run by a peer's worker pool, their registry, context and
//! handles.
//!
//! # Job
//! - [`Wire`]: values that encode themselves with `myriad_types::codec` (job parameters
//!   and results).
//! - [`Job`]: a job type: its registered name, its parameters (the value itself, through
//!   [`Wire`]), its output type and `run`.
//! - [`JobRegistry`]: job runners by name, so that a peer can run a job that arrives as
//!   bytes.
//! - [`JobContext`]: what a running job reaches: this node, the local chunk API without a
//!   network hop, the client (remote chunks, nameservice), messaging, and the pool for
//!   sub-jobs.
//! - [`JobHandle`]: the result of a submission: wait with a timeout, or detach (fire and
//!   forget).
//!
//! # Invariants
//! - A job that panics fails its handle with [`JobError::Panicked`]; the worker and the
//!   peer go on.
//! - A handle always ends: with the result, the job's error, or an error naming why the
//!   result cannot come (the peer died, the connection was lost, the service stopped).
//!
//! # Who calls it
//! Users implement [`Job`]; [`crate::ComputeService`] and [`crate::Jobs`] submit and run them.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::{ChunkId, NodeId};
use thiserror::Error;

use crate::env::{LocalChunkApi, PeerEnv};
use crate::pool::WorkerPool;
use crate::wire::{JobFailure, JobReply, NAME_BYTES_MAX};

/// A value with a byte encoding (job parameters and results).
pub trait Wire: Sized + Send + 'static {
    /// Appends the value to `out`.
    fn put(&self, out: &mut Encoder);
    /// Reads a value written by [`Wire::put`].
    fn get(input: &mut Decoder) -> Result<Self, DecodeError>;

    /// The value as bytes.
    fn to_bytes(&self) -> Bytes {
        let mut out = Encoder::new();
        self.put(&mut out);
        out.finish()
    }

    /// The value from bytes (all of them).
    fn from_bytes(bytes: Bytes) -> Result<Self, DecodeError> {
        let mut input = Decoder::new(bytes);
        let value = Self::get(&mut input)?;
        input.finish()?;
        Ok(value)
    }
}

impl Wire for () {
    fn put(&self, _out: &mut Encoder) {}
    fn get(_input: &mut Decoder) -> Result<(), DecodeError> {
        Ok(())
    }
}

impl Wire for u64 {
    fn put(&self, out: &mut Encoder) {
        out.put_u64_le(*self);
    }
    fn get(input: &mut Decoder) -> Result<u64, DecodeError> {
        input.get_u64_le("u64")
    }
}

impl Wire for i64 {
    fn put(&self, out: &mut Encoder) {
        out.put_i64_le(*self);
    }
    fn get(input: &mut Decoder) -> Result<i64, DecodeError> {
        input.get_i64_le("i64")
    }
}

impl Wire for bool {
    fn put(&self, out: &mut Encoder) {
        out.put_bool(*self);
    }
    fn get(input: &mut Decoder) -> Result<bool, DecodeError> {
        input.get_bool("bool")
    }
}

impl Wire for NodeId {
    fn put(&self, out: &mut Encoder) {
        out.put_u16_le(self.0);
    }
    fn get(input: &mut Decoder) -> Result<NodeId, DecodeError> {
        Ok(NodeId(input.get_u16_le("node id")?))
    }
}

impl Wire for ChunkId {
    fn put(&self, out: &mut Encoder) {
        out.put_u64_le(self.raw());
    }
    fn get(input: &mut Decoder) -> Result<ChunkId, DecodeError> {
        Ok(ChunkId::from_raw(input.get_u64_le("chunk id")?))
    }
}

impl Wire for String {
    fn put(&self, out: &mut Encoder) {
        out.put_str(self);
    }
    fn get(input: &mut Decoder) -> Result<String, DecodeError> {
        Ok(input.get_str("string", usize::MAX)?.to_owned())
    }
}

impl Wire for Bytes {
    fn put(&self, out: &mut Encoder) {
        out.put_bytes(self);
    }
    fn get(input: &mut Decoder) -> Result<Bytes, DecodeError> {
        input.get_bytes("bytes")
    }
}

impl<T: Wire> Wire for Vec<T> {
    fn put(&self, out: &mut Encoder) {
        out.put_varint(self.len() as u64);
        for item in self {
            item.put(out);
        }
    }
    fn get(input: &mut Decoder) -> Result<Vec<T>, DecodeError> {
        // Every encoded item takes at least one byte except `()`, bounded separately.
        let count = input.get_count("list", 1, 1 << 24)?;
        (0..count).map(|_| T::get(input)).collect()
    }
}

impl<A: Wire, B: Wire> Wire for (A, B) {
    fn put(&self, out: &mut Encoder) {
        self.0.put(out);
        self.1.put(out);
    }
    fn get(input: &mut Decoder) -> Result<(A, B), DecodeError> {
        Ok((A::get(input)?, B::get(input)?))
    }
}

/// A job type. The value itself holds the parameters ([`Wire`]); the registry recreates
/// it from bytes on the peer that runs it.
pub trait Job: Wire {
    /// The name it is registered under (unique per peer binary).
    const NAME: &'static str;
    /// What it returns.
    type Output: Wire;
    /// Runs the job on a worker thread of the peer it was sent to.
    fn run(self, ctx: &JobContext) -> Result<Self::Output, String>;
}

/// Why a job handle has no result.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JobError {
    /// The job returned an error.
    #[error("job failed: {0}")]
    Failed(String),
    /// The job panicked.
    #[error("job panicked: {0}")]
    Panicked(String),
    /// The peer has no job of that name.
    #[error("no job named {0:?} is registered on the peer")]
    UnknownJob(String),
    /// The parameters or the result did not decode.
    #[error("bad job encoding: {0}")]
    Encoding(String),
    /// The peer that ran (or was to run) the job died or became unreachable before it
    /// answered.
    #[error("node {node} did not answer the job: {reason}")]
    Unreachable {
        /// The peer.
        node: NodeId,
        /// What the messaging layer said.
        reason: String,
    },
    /// The chunk's owner could not be found after following the redirections.
    #[error("no owner of chunk {0} accepted the job")]
    NoOwner(ChunkId),
    /// The peer runs no job service.
    #[error("no job service: {0}")]
    NoCompute(String),
    /// [`JobHandle::wait`] gave up.
    #[error("no result within {0:?}")]
    Timeout(Duration),
    /// The local job service stopped before the job ran.
    #[error("the job service stopped before the job finished")]
    Stopped,
}

impl JobError {
    /// The error for a failure reported by the peer `node`.
    pub fn from_failure(failure: JobFailure, node: NodeId, cid: Option<ChunkId>) -> JobError {
        match failure {
            JobFailure::Failed(text) => JobError::Failed(text),
            JobFailure::Panicked(text) => JobError::Panicked(text),
            JobFailure::UnknownJob(name) => JobError::UnknownJob(name),
            JobFailure::BadParams(text) => JobError::Encoding(text),
            JobFailure::NotOwner => match cid {
                Some(cid) => JobError::NoOwner(cid),
                None => JobError::Failed(format!("node {node} answered not-owner")),
            },
            JobFailure::NoCompute(text) => JobError::NoCompute(format!("node {node}: {text}")),
        }
    }
}

/// A running job's view of its peer.
#[derive(Clone)]
pub struct JobContext {
    pub(crate) node: NodeId,
    pub(crate) env: Option<PeerEnv>,
    pub(crate) pool: Arc<WorkerPool>,
}

impl std::fmt::Debug for JobContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobContext")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl JobContext {
    /// The node running the job.
    pub fn node_id(&self) -> NodeId {
        self.node
    }

    /// The peer's services (absent in a job service not attached to a peer, e.g. a
    /// benchmark's bare pool).
    pub fn env(&self) -> Result<&PeerEnv, String> {
        self.env
            .as_ref()
            .ok_or_else(|| "this job service runs outside a peer".to_owned())
    }

    /// The local chunk API (no network hop).
    pub fn local(&self) -> Result<LocalChunkApi<'_>, String> {
        Ok(self.env()?.local())
    }

    /// Runs `job` on this peer's pool too (on this worker's own deque, where idle
    /// workers steal it).
    pub fn spawn<J: Job>(&self, job: J) -> JobHandle<J::Output> {
        let (sender, receiver) = crossbeam_channel::bounded(1);
        let ctx = self.clone();
        let node = self.node;
        self.pool.spawn(Box::new(move || {
            let reply = run_caught(|| job.run(&ctx).map(|out| out.to_bytes()));
            let _ =
                sender.send(reply.map_err(|failure| JobError::from_failure(failure, node, None)));
        }));
        JobHandle::new(receiver, self.node)
    }
}

/// Runs `body`, turning a panic into [`JobFailure::Panicked`] and an error into
/// [`JobFailure::Failed`].
pub(crate) fn run_caught(body: impl FnOnce() -> Result<Bytes, String>) -> JobReply {
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(text)) => Err(JobFailure::Failed(text)),
        Err(panic) => Err(JobFailure::Panicked(panic_text(&panic))),
    }
}

/// The message of a caught panic.
pub fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Runs a job from its bytes.
type Runner = Arc<dyn Fn(Bytes, &JobContext) -> JobReply + Send + Sync>;

/// The jobs a peer can run, by name.
#[derive(Clone, Default)]
pub struct JobRegistry {
    runners: HashMap<String, Runner>,
}

impl std::fmt::Debug for JobRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<_> = self.runners.keys().collect();
        names.sort();
        f.debug_struct("JobRegistry").field("jobs", &names).finish()
    }
}

impl JobRegistry {
    /// Registers job type `J` under [`Job::NAME`] (a later registration of the same name
    /// replaces the earlier). Panics on a name longer than the wire allows: a programming
    /// error found at start-up.
    pub fn register<J: Job>(&mut self) -> &mut Self {
        assert!(
            J::NAME.len() <= NAME_BYTES_MAX,
            "job name {:?} is longer than {NAME_BYTES_MAX} bytes",
            J::NAME
        );
        let runner: Runner = Arc::new(|params: Bytes, ctx: &JobContext| {
            let job =
                J::from_bytes(params).map_err(|error| JobFailure::BadParams(error.to_string()))?;
            run_caught(|| job.run(ctx).map(|out| out.to_bytes()))
        });
        self.runners.insert(J::NAME.to_owned(), runner);
        self
    }

    /// Whether a job of this name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.runners.contains_key(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.runners.keys().cloned().collect();
        names.sort();
        names
    }

    /// Runs the job `name` from its encoded parameters on the calling thread.
    pub fn run(&self, name: &str, params: Bytes, ctx: &JobContext) -> JobReply {
        match self.runners.get(name) {
            Some(runner) => runner(params, ctx),
            None => Err(JobFailure::UnknownJob(name.to_owned())),
        }
    }
}

/// The result of a submitted job, typed by its output. Dropping it (or
/// [`JobHandle::detach`]) is fire and forget: the job still runs.
#[derive(Debug)]
pub struct JobHandle<T> {
    receiver: crossbeam_channel::Receiver<Result<Bytes, JobError>>,
    node: NodeId,
    done: Option<Result<Bytes, JobError>>,
    _output: std::marker::PhantomData<fn() -> T>,
}

impl<T: Wire> JobHandle<T> {
    pub(crate) fn new(
        receiver: crossbeam_channel::Receiver<Result<Bytes, JobError>>,
        node: NodeId,
    ) -> Self {
        JobHandle {
            receiver,
            node,
            done: None,
            _output: std::marker::PhantomData,
        }
    }

    /// The node the job was sent to (for a delegated job: the first owner tried).
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Waits at most `timeout` for the result as bytes. After a timeout the handle can
    /// be waited on again.
    pub fn wait_bytes(&mut self, timeout: Duration) -> Result<Bytes, JobError> {
        if let Some(done) = &self.done {
            return done.clone();
        }
        let result = match self.receiver.recv_timeout(timeout) {
            Ok(reply) => reply,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                return Err(JobError::Timeout(timeout))
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(JobError::Stopped),
        };
        self.done = Some(result.clone());
        result
    }

    /// Waits at most `timeout` for the typed result.
    pub fn wait(&mut self, timeout: Duration) -> Result<T, JobError> {
        let bytes = self.wait_bytes(timeout)?;
        T::from_bytes(bytes).map_err(|error| JobError::Encoding(error.to_string()))
    }

    /// Whether the result (or failure) is in.
    pub fn is_done(&self) -> bool {
        self.done.is_some() || !self.receiver.is_empty()
    }

    /// Fire and forget: the job runs, nobody waits for it.
    pub fn detach(self) {}
}
