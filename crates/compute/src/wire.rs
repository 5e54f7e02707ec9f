//! The compute platform's messages: their type numbers on the messaging layer and their
//! bounds-checked encodings.
//!
//! # Job
//! Names the six message types (type byte [`COMPUTE_TYPE`] = 50; `myriad-proto` keeps 10–40,
//! replication 30, benchmarks 200 and above) and turns each message into bytes and back with
//! `myriad_types::codec`:
//! - [`JOB`] (request): [`JobRequest`] → [`JobReply`], a job for a peer's worker pool.
//! - [`SUBMIT`] (request): [`SubmitRequest`] → [`SubmitReply`], a task script for a
//!   group's master.
//! - [`TASK_RUN`] (request): [`TaskRun`] → [`TaskDone`], master to each slave.
//! - [`GROUP`] (request): [`GroupRequest`] → [`GroupReply`], joins, status, roles.
//! - [`SYNC`] (one-way): [`Sync`], barrier arrivals, releases and aborts of a run.
//! - [`DATA`] (one-way): [`DataMessage`], messages between the slaves of a run.
//!
//! # Invariants
//! Decoding never panics and never allocates more than the input justifies: counts are
//! checked against the bytes left and the limits below, and trailing bytes are refused.
//!
//! # Who calls it
//! The job service, the group roles and the client-side calls of this crate; the fuzz
//! target `compute_decode` feeds [`fuzz_decode`] arbitrary bytes.

use bytes::Bytes;
use myriad_net::MessageType;
use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::{ChunkId, NodeId};

/// The type byte of every compute message.
pub const COMPUTE_TYPE: u8 = 50;
/// A job for a peer's worker pool.
pub const JOB: MessageType = MessageType::unordered(COMPUTE_TYPE, 0);
/// A task script for a group's master.
pub const SUBMIT: MessageType = MessageType::unordered(COMPUTE_TYPE, 1);
/// One task of a run, master to slave.
pub const TASK_RUN: MessageType = MessageType::unordered(COMPUTE_TYPE, 2);
/// Group membership, status and roles.
pub const GROUP: MessageType = MessageType::unordered(COMPUTE_TYPE, 3);
/// Barriers and aborts of a run.
pub const SYNC: MessageType = MessageType::unordered(COMPUTE_TYPE, 4);
/// Messages between the slaves of a run.
pub const DATA: MessageType = MessageType::unordered(COMPUTE_TYPE, 5);

/// Longest job, task or application name, in bytes.
pub const NAME_BYTES_MAX: usize = 128;
/// Most slaves a group's run takes.
pub const SLAVES_MAX: usize = 4096;
/// Most tasks in one script.
pub const SCRIPT_STEPS_MAX: usize = 1024;
/// Most entries in a status reply.
pub const STATUS_ENTRIES_MAX: usize = 4096;
/// Longest error text carried in a reply.
pub const TEXT_BYTES_MAX: usize = 64 * 1024;

/// A job to run on the receiving peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRequest {
    /// The registered job name.
    pub name: String,
    /// The job's encoded parameters.
    pub params: Bytes,
    /// Delegated to the owner of this chunk: refused with [`JobFailure::NotOwner`] if the
    /// receiving peer does not own it.
    pub owner_of: Option<ChunkId>,
}

/// Why a job did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobFailure {
    /// The job returned an error.
    Failed(String),
    /// The job panicked (the message).
    Panicked(String),
    /// No job of this name is registered there.
    UnknownJob(String),
    /// The parameters did not decode.
    BadParams(String),
    /// The peer does not own the chunk the job was delegated for.
    NotOwner,
    /// The peer runs no job service (no compute capability, or not started yet).
    NoCompute(String),
}

/// The answer to a [`JobRequest`].
pub type JobReply = Result<Bytes, JobFailure>;

/// A role of a peer in a compute group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// In no group.
    None,
    /// Coordinates a group: takes submissions and runs them on the slaves.
    Master,
    /// Runs the tasks of a group.
    Slave,
}

impl Role {
    /// `none`, `master` or `slave`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::None => "none",
            Role::Master => "master",
            Role::Slave => "slave",
        }
    }

    fn tag(self) -> u8 {
        match self {
            Role::None => 0,
            Role::Master => 1,
            Role::Slave => 2,
        }
    }

    fn from_tag(tag: u8) -> Result<Role, DecodeError> {
        Ok(match tag {
            0 => Role::None,
            1 => Role::Master,
            2 => Role::Slave,
            other => {
                return Err(DecodeError::UnknownTag {
                    what: "role",
                    tag: u64::from(other),
                })
            }
        })
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(text: &str) -> Result<Role, String> {
        match text {
            "none" => Ok(Role::None),
            "master" => Ok(Role::Master),
            "slave" => Ok(Role::Slave),
            other => Err(format!(
                "unknown compute role {other:?} (master, slave, none)"
            )),
        }
    }
}

/// One task of a script as it travels: name, parameters, slave bounds, condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepWire {
    /// The registered task name.
    pub task: String,
    /// The task's parameters (JSON text for tasks from script files).
    pub params: Bytes,
    /// Fewest slaves to run on.
    pub slaves_min: u32,
    /// Most slaves to run on (0: all).
    pub slaves_max: u32,
    /// Run only if the previous task's value passes: `(aggregate, op, than, skip)`,
    /// each as its wire tag (see [`crate::script::Condition`]).
    pub condition: Option<(u8, u8, i64, bool)>,
}

/// A script submitted to a group's master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitRequest {
    /// The group.
    pub group: u16,
    /// The script's name (for status).
    pub name: String,
    /// Longest a task may run, in milliseconds.
    pub task_timeout_ms: u64,
    /// How long to wait for enough slaves, in milliseconds.
    pub slaves_wait_ms: u64,
    /// The tasks in order.
    pub steps: Vec<StepWire>,
}

/// The outcome of one task of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOutcome {
    /// The task name.
    pub task: String,
    /// The slaves it ran on, by slave index.
    pub slaves: Vec<NodeId>,
    /// The value each slave returned, by slave index (empty when skipped).
    pub values: Vec<Bytes>,
    /// Microseconds from sending the task to the last slave's answer.
    pub micros: u64,
    /// Skipped by its condition.
    pub skipped: bool,
}

/// How a script ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptEnd {
    /// Every task ran.
    Finished,
    /// A condition stopped it (the message says which).
    Aborted(String),
    /// A task failed (a slave's error, a dead slave, too few slaves, a timeout).
    Failed(String),
}

/// The master's answer to a [`SubmitRequest`]: the script's ID, how it ended, and every
/// task that ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitReply {
    /// The master's number for this submission.
    pub id: u64,
    /// How it ended.
    pub end: ScriptEnd,
    /// The tasks that ran (or were skipped), in order.
    pub tasks: Vec<TaskOutcome>,
}

/// Master to slave: run this task as slave `index` of `slaves`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRun {
    /// The group.
    pub group: u16,
    /// The master's number of this run (unique per master process).
    pub run: u64,
    /// The receiving slave's index.
    pub index: u32,
    /// Every slave of the run, by index.
    pub slaves: Vec<NodeId>,
    /// The task name.
    pub task: String,
    /// Its parameters.
    pub params: Bytes,
    /// Longest the task may run (its barriers give up after it), in milliseconds.
    pub timeout_ms: u64,
}

/// A slave's answer to a [`TaskRun`]: the task's value or its error.
pub type TaskDone = Result<Bytes, String>;

/// A group request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRequest {
    /// Slave to master: add me to group (idempotent; slaves repeat it as a heartbeat).
    Join(u16),
    /// Slave to master: remove me from the group.
    Leave(u16),
    /// To a master: the group's status.
    Status(u16),
    /// To any peer: its role and group.
    Info,
    /// To any peer: take this role in this group from now on.
    SetRole(u16, Role),
    /// To any peer: start the registered application of this name.
    StartApp(String),
}

/// One submission in a master's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusEntry {
    /// The submission's ID.
    pub id: u64,
    /// The script's name.
    pub name: String,
    /// `queued`, `running`, `finished`, `aborted` or `failed`.
    pub state: String,
    /// Microseconds waiting in the queue.
    pub queued_micros: u64,
    /// Microseconds running (so far, when running).
    pub run_micros: u64,
    /// The error or abort message, if any.
    pub detail: String,
}

/// A master's status of its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    /// The group.
    pub group: u16,
    /// The master.
    pub master: NodeId,
    /// The slaves, by node ID.
    pub slaves: Vec<NodeId>,
    /// Submissions: queued, running, then the latest finished ones.
    pub entries: Vec<StatusEntry>,
}

/// The answer to a [`GroupRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupReply {
    /// Done.
    Ok,
    /// `Info`: role and group.
    Info(Role, u16),
    /// `Status`.
    Status(GroupStatus),
    /// Refused, with the reason.
    Refused(String),
}

/// Barrier traffic of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sync {
    /// Slave to master: slave `index` reached barrier `round`, having sent `sent[j]`
    /// messages to slave `j` since the start of the run; `value` is its contribution.
    Arrive {
        /// The run.
        run: u64,
        /// The barrier round (0 is the superstep's start).
        round: u32,
        /// The arriving slave.
        index: u32,
        /// Messages sent to each slave so far.
        sent: Vec<u64>,
        /// The slave's contribution, handed to every slave.
        value: Bytes,
    },
    /// Master to slave: barrier `round` is complete; wait for `expected` messages in all
    /// (since the start), then go on with every slave's value.
    Release {
        /// The run.
        run: u64,
        /// The round.
        round: u32,
        /// Messages sent to the receiver by all slaves before the barrier, in all.
        expected: u64,
        /// Each slave's contribution, by index.
        values: Vec<Bytes>,
    },
    /// Master to slave: the run failed; stop.
    Abort {
        /// The run.
        run: u64,
        /// Why.
        reason: String,
    },
}

/// A message between two slaves of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataMessage {
    /// The run's master.
    pub master: NodeId,
    /// The run.
    pub run: u64,
    /// The sender's slave index.
    pub from: u32,
    /// The payload.
    pub payload: Bytes,
}

// ----- encodings ----------------------------------------------------------------------------

fn get_name(input: &mut Decoder, what: &'static str) -> Result<String, DecodeError> {
    Ok(input.get_str(what, NAME_BYTES_MAX)?.to_owned())
}

fn get_text(input: &mut Decoder, what: &'static str) -> Result<String, DecodeError> {
    Ok(input.get_str(what, TEXT_BYTES_MAX)?.to_owned())
}

fn put_nodes(out: &mut Encoder, nodes: &[NodeId]) {
    out.put_varint(nodes.len() as u64);
    for node in nodes {
        out.put_u16_le(node.0);
    }
}

fn get_nodes(input: &mut Decoder) -> Result<Vec<NodeId>, DecodeError> {
    let count = input.get_count("slaves", 2, SLAVES_MAX)?;
    (0..count)
        .map(|_| Ok(NodeId(input.get_u16_le("slave")?)))
        .collect()
}

fn put_values(out: &mut Encoder, values: &[Bytes]) {
    out.put_varint(values.len() as u64);
    for value in values {
        out.put_bytes(value);
    }
}

fn get_values(input: &mut Decoder) -> Result<Vec<Bytes>, DecodeError> {
    let count = input.get_count("values", 1, SLAVES_MAX)?;
    (0..count).map(|_| input.get_bytes("value")).collect()
}

fn finish<T>(input: Decoder, value: T) -> Result<T, DecodeError> {
    input.finish()?;
    Ok(value)
}

impl JobRequest {
    /// The bytes on the wire.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::with_capacity(16 + self.name.len() + self.params.len());
        out.put_str(&self.name);
        out.put_bytes(&self.params);
        match self.owner_of {
            Some(cid) => out.put_u8(1).put_u64_le(cid.raw()),
            None => out.put_u8(0),
        };
        out.finish()
    }

    /// Decodes [`JobRequest::encode`]'s bytes.
    pub fn decode(payload: Bytes) -> Result<JobRequest, DecodeError> {
        let mut input = Decoder::new(payload);
        let name = get_name(&mut input, "job name")?;
        let params = input.get_bytes("job params")?;
        let owner_of = match input.get_u8("delegation")? {
            0 => None,
            1 => Some(ChunkId::from_raw(input.get_u64_le("delegation cid")?)),
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "delegation",
                    tag: u64::from(tag),
                })
            }
        };
        finish(
            input,
            JobRequest {
                name,
                params,
                owner_of,
            },
        )
    }
}

/// Encodes a [`JobReply`].
pub fn encode_job_reply(reply: &JobReply) -> Bytes {
    let mut out = Encoder::new();
    match reply {
        Ok(value) => {
            out.put_u8(0).put_bytes(value);
        }
        Err(failure) => {
            let (tag, text) = match failure {
                JobFailure::Failed(text) => (1, text.as_str()),
                JobFailure::Panicked(text) => (2, text.as_str()),
                JobFailure::UnknownJob(text) => (3, text.as_str()),
                JobFailure::BadParams(text) => (4, text.as_str()),
                JobFailure::NotOwner => (5, ""),
                JobFailure::NoCompute(text) => (6, text.as_str()),
            };
            out.put_u8(tag).put_str(truncate(text));
        }
    }
    out.finish()
}

/// Decodes [`encode_job_reply`]'s bytes.
pub fn decode_job_reply(payload: Bytes) -> Result<JobReply, DecodeError> {
    let mut input = Decoder::new(payload);
    let tag = input.get_u8("job reply")?;
    if tag == 0 {
        let value = input.get_bytes("job value")?;
        return finish(input, Ok(value));
    }
    let text = get_text(&mut input, "job failure")?;
    let failure = match tag {
        1 => JobFailure::Failed(text),
        2 => JobFailure::Panicked(text),
        3 => JobFailure::UnknownJob(text),
        4 => JobFailure::BadParams(text),
        5 => JobFailure::NotOwner,
        6 => JobFailure::NoCompute(text),
        other => {
            return Err(DecodeError::UnknownTag {
                what: "job reply",
                tag: u64::from(other),
            })
        }
    };
    finish(input, Err(failure))
}

/// Cuts an error text to what a reply carries (at a character boundary).
pub fn truncate(text: &str) -> &str {
    if text.len() <= TEXT_BYTES_MAX {
        return text;
    }
    let mut end = TEXT_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl SubmitRequest {
    /// The bytes on the wire.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        out.put_u16_le(self.group)
            .put_str(&self.name)
            .put_varint(self.task_timeout_ms)
            .put_varint(self.slaves_wait_ms)
            .put_varint(self.steps.len() as u64);
        for step in &self.steps {
            out.put_str(&step.task)
                .put_bytes(&step.params)
                .put_varint(u64::from(step.slaves_min))
                .put_varint(u64::from(step.slaves_max));
            match step.condition {
                None => out.put_u8(0),
                Some((aggregate, op, than, skip)) => out
                    .put_u8(1)
                    .put_u8(aggregate)
                    .put_u8(op)
                    .put_i64_le(than)
                    .put_bool(skip),
            };
        }
        out.finish()
    }

    /// Decodes [`SubmitRequest::encode`]'s bytes.
    pub fn decode(payload: Bytes) -> Result<SubmitRequest, DecodeError> {
        let mut input = Decoder::new(payload);
        let group = input.get_u16_le("group")?;
        let name = get_name(&mut input, "script name")?;
        let task_timeout_ms = input.get_varint("task timeout")?;
        let slaves_wait_ms = input.get_varint("slaves wait")?;
        let count = input.get_count("steps", 4, SCRIPT_STEPS_MAX)?;
        let mut steps = Vec::with_capacity(count);
        for _ in 0..count {
            let task = get_name(&mut input, "task name")?;
            let params = input.get_bytes("task params")?;
            let slaves_min = input.get_varint_u32("slaves min")?;
            let slaves_max = input.get_varint_u32("slaves max")?;
            let condition = match input.get_u8("condition")? {
                0 => None,
                1 => Some((
                    input.get_u8("condition value")?,
                    input.get_u8("condition op")?,
                    input.get_i64_le("condition operand")?,
                    input.get_bool("condition skip")?,
                )),
                tag => {
                    return Err(DecodeError::UnknownTag {
                        what: "condition",
                        tag: u64::from(tag),
                    })
                }
            };
            steps.push(StepWire {
                task,
                params,
                slaves_min,
                slaves_max,
                condition,
            });
        }
        finish(
            input,
            SubmitRequest {
                group,
                name,
                task_timeout_ms,
                slaves_wait_ms,
                steps,
            },
        )
    }
}

/// Encodes the master's answer to a submission (`Err` when it refused it outright).
pub fn encode_submit_reply(reply: &Result<SubmitReply, String>) -> Bytes {
    let mut out = Encoder::new();
    let reply = match reply {
        Ok(reply) => reply,
        Err(text) => {
            out.put_u8(0).put_str(truncate(text));
            return out.finish();
        }
    };
    out.put_u8(1).put_varint(reply.id);
    match &reply.end {
        ScriptEnd::Finished => out.put_u8(0),
        ScriptEnd::Aborted(text) => out.put_u8(1).put_str(truncate(text)),
        ScriptEnd::Failed(text) => out.put_u8(2).put_str(truncate(text)),
    };
    out.put_varint(reply.tasks.len() as u64);
    for task in &reply.tasks {
        out.put_str(&task.task);
        put_nodes(&mut out, &task.slaves);
        put_values(&mut out, &task.values);
        out.put_varint(task.micros).put_bool(task.skipped);
    }
    out.finish()
}

/// Decodes [`encode_submit_reply`]'s bytes.
pub fn decode_submit_reply(payload: Bytes) -> Result<Result<SubmitReply, String>, DecodeError> {
    let mut input = Decoder::new(payload);
    if input.get_u8("submit reply")? == 0 {
        let text = get_text(&mut input, "refusal")?;
        return finish(input, Err(text));
    }
    let id = input.get_varint("submission id")?;
    let end = match input.get_u8("script end")? {
        0 => ScriptEnd::Finished,
        1 => ScriptEnd::Aborted(get_text(&mut input, "abort")?),
        2 => ScriptEnd::Failed(get_text(&mut input, "failure")?),
        tag => {
            return Err(DecodeError::UnknownTag {
                what: "script end",
                tag: u64::from(tag),
            })
        }
    };
    let count = input.get_count("task outcomes", 4, SCRIPT_STEPS_MAX)?;
    let mut tasks = Vec::with_capacity(count);
    for _ in 0..count {
        tasks.push(TaskOutcome {
            task: get_name(&mut input, "task name")?,
            slaves: get_nodes(&mut input)?,
            values: get_values(&mut input)?,
            micros: input.get_varint("task micros")?,
            skipped: input.get_bool("skipped")?,
        });
    }
    finish(input, Ok(SubmitReply { id, end, tasks }))
}

impl TaskRun {
    /// The bytes on the wire.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        out.put_u16_le(self.group)
            .put_varint(self.run)
            .put_varint(u64::from(self.index));
        put_nodes(&mut out, &self.slaves);
        out.put_str(&self.task)
            .put_bytes(&self.params)
            .put_varint(self.timeout_ms);
        out.finish()
    }

    /// Decodes [`TaskRun::encode`]'s bytes; the index must name one of the slaves.
    pub fn decode(payload: Bytes) -> Result<TaskRun, DecodeError> {
        let mut input = Decoder::new(payload);
        let group = input.get_u16_le("group")?;
        let run = input.get_varint("run")?;
        let index = input.get_varint_u32("slave index")?;
        let slaves = get_nodes(&mut input)?;
        if index as usize >= slaves.len() {
            return Err(DecodeError::Invalid("slave index outside the slaves"));
        }
        let task = get_name(&mut input, "task name")?;
        let params = input.get_bytes("task params")?;
        let timeout_ms = input.get_varint("task timeout")?;
        finish(
            input,
            TaskRun {
                group,
                run,
                index,
                slaves,
                task,
                params,
                timeout_ms,
            },
        )
    }
}

/// Encodes a [`TaskDone`].
pub fn encode_task_done(done: &TaskDone) -> Bytes {
    let mut out = Encoder::new();
    match done {
        Ok(value) => out.put_u8(0).put_bytes(value),
        Err(text) => out.put_u8(1).put_str(truncate(text)),
    };
    out.finish()
}

/// Decodes [`encode_task_done`]'s bytes.
pub fn decode_task_done(payload: Bytes) -> Result<TaskDone, DecodeError> {
    let mut input = Decoder::new(payload);
    let done = match input.get_u8("task done")? {
        0 => Ok(input.get_bytes("task value")?),
        1 => Err(get_text(&mut input, "task error")?),
        tag => {
            return Err(DecodeError::UnknownTag {
                what: "task done",
                tag: u64::from(tag),
            })
        }
    };
    finish(input, done)
}

impl GroupRequest {
    /// The bytes on the wire.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        match self {
            GroupRequest::Join(group) => out.put_u8(0).put_u16_le(*group),
            GroupRequest::Leave(group) => out.put_u8(1).put_u16_le(*group),
            GroupRequest::Status(group) => out.put_u8(2).put_u16_le(*group),
            GroupRequest::Info => out.put_u8(3),
            GroupRequest::SetRole(group, role) => {
                out.put_u8(4).put_u16_le(*group).put_u8(role.tag())
            }
            GroupRequest::StartApp(name) => out.put_u8(5).put_str(name),
        };
        out.finish()
    }

    /// Decodes [`GroupRequest::encode`]'s bytes.
    pub fn decode(payload: Bytes) -> Result<GroupRequest, DecodeError> {
        let mut input = Decoder::new(payload);
        let request = match input.get_u8("group request")? {
            0 => GroupRequest::Join(input.get_u16_le("group")?),
            1 => GroupRequest::Leave(input.get_u16_le("group")?),
            2 => GroupRequest::Status(input.get_u16_le("group")?),
            3 => GroupRequest::Info,
            4 => GroupRequest::SetRole(
                input.get_u16_le("group")?,
                Role::from_tag(input.get_u8("role")?)?,
            ),
            5 => GroupRequest::StartApp(get_name(&mut input, "application")?),
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "group request",
                    tag: u64::from(tag),
                })
            }
        };
        finish(input, request)
    }
}

impl GroupReply {
    /// The bytes on the wire.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        match self {
            GroupReply::Ok => {
                out.put_u8(0);
            }
            GroupReply::Info(role, group) => {
                out.put_u8(1).put_u8(role.tag()).put_u16_le(*group);
            }
            GroupReply::Status(status) => {
                out.put_u8(2)
                    .put_u16_le(status.group)
                    .put_u16_le(status.master.0);
                put_nodes(&mut out, &status.slaves);
                out.put_varint(status.entries.len() as u64);
                for entry in &status.entries {
                    out.put_varint(entry.id)
                        .put_str(&entry.name)
                        .put_str(&entry.state)
                        .put_varint(entry.queued_micros)
                        .put_varint(entry.run_micros)
                        .put_str(truncate(&entry.detail));
                }
            }
            GroupReply::Refused(text) => {
                out.put_u8(3).put_str(truncate(text));
            }
        }
        out.finish()
    }

    /// Decodes [`GroupReply::encode`]'s bytes.
    pub fn decode(payload: Bytes) -> Result<GroupReply, DecodeError> {
        let mut input = Decoder::new(payload);
        let reply = match input.get_u8("group reply")? {
            0 => GroupReply::Ok,
            1 => GroupReply::Info(
                Role::from_tag(input.get_u8("role")?)?,
                input.get_u16_le("group")?,
            ),
            2 => {
                let group = input.get_u16_le("group")?;
                let master = NodeId(input.get_u16_le("master")?);
                let slaves = get_nodes(&mut input)?;
                let count = input.get_count("status entries", 6, STATUS_ENTRIES_MAX)?;
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    entries.push(StatusEntry {
                        id: input.get_varint("entry id")?,
                        name: get_name(&mut input, "entry name")?,
                        state: get_name(&mut input, "entry state")?,
                        queued_micros: input.get_varint("queued micros")?,
                        run_micros: input.get_varint("run micros")?,
                        detail: get_text(&mut input, "entry detail")?,
                    });
                }
                GroupReply::Status(GroupStatus {
                    group,
                    master,
                    slaves,
                    entries,
                })
            }
            3 => GroupReply::Refused(get_text(&mut input, "refusal")?),
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "group reply",
                    tag: u64::from(tag),
                })
            }
        };
        finish(input, reply)
    }
}

impl Sync {
    /// The bytes on the wire.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        match self {
            Sync::Arrive {
                run,
                round,
                index,
                sent,
                value,
            } => {
                out.put_u8(0)
                    .put_varint(*run)
                    .put_varint(u64::from(*round))
                    .put_varint(u64::from(*index))
                    .put_varint(sent.len() as u64);
                for count in sent {
                    out.put_varint(*count);
                }
                out.put_bytes(value);
            }
            Sync::Release {
                run,
                round,
                expected,
                values,
            } => {
                out.put_u8(1)
                    .put_varint(*run)
                    .put_varint(u64::from(*round))
                    .put_varint(*expected);
                put_values(&mut out, values);
            }
            Sync::Abort { run, reason } => {
                out.put_u8(2).put_varint(*run).put_str(truncate(reason));
            }
        }
        out.finish()
    }

    /// Decodes [`Sync::encode`]'s bytes.
    pub fn decode(payload: Bytes) -> Result<Sync, DecodeError> {
        let mut input = Decoder::new(payload);
        let sync = match input.get_u8("sync")? {
            0 => {
                let run = input.get_varint("run")?;
                let round = input.get_varint_u32("round")?;
                let index = input.get_varint_u32("slave index")?;
                let count = input.get_count("sent counts", 1, SLAVES_MAX)?;
                let sent = (0..count)
                    .map(|_| input.get_varint("sent count"))
                    .collect::<Result<Vec<_>, _>>()?;
                let value = input.get_bytes("barrier value")?;
                Sync::Arrive {
                    run,
                    round,
                    index,
                    sent,
                    value,
                }
            }
            1 => Sync::Release {
                run: input.get_varint("run")?,
                round: input.get_varint_u32("round")?,
                expected: input.get_varint("expected")?,
                values: get_values(&mut input)?,
            },
            2 => Sync::Abort {
                run: input.get_varint("run")?,
                reason: get_text(&mut input, "abort reason")?,
            },
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "sync",
                    tag: u64::from(tag),
                })
            }
        };
        finish(input, sync)
    }
}

impl DataMessage {
    /// The bytes on the wire.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::with_capacity(16 + self.payload.len());
        out.put_u16_le(self.master.0)
            .put_varint(self.run)
            .put_varint(u64::from(self.from))
            .put_bytes(&self.payload);
        out.finish()
    }

    /// Decodes [`DataMessage::encode`]'s bytes (the payload shares the input's buffer).
    pub fn decode(payload: Bytes) -> Result<DataMessage, DecodeError> {
        let mut input = Decoder::new(payload);
        let message = DataMessage {
            master: NodeId(input.get_u16_le("master")?),
            run: input.get_varint("run")?,
            from: input.get_varint_u32("sender index")?,
            payload: input.get_bytes("data")?,
        };
        finish(input, message)
    }
}

/// Feeds `bytes` to every decoder of this module (the fuzz target's body): none may panic.
pub fn fuzz_decode(bytes: &[u8]) {
    let payload = Bytes::copy_from_slice(bytes);
    let _ = JobRequest::decode(payload.clone());
    let _ = decode_job_reply(payload.clone());
    let _ = SubmitRequest::decode(payload.clone());
    let _ = decode_submit_reply(payload.clone());
    let _ = TaskRun::decode(payload.clone());
    let _ = decode_task_done(payload.clone());
    let _ = GroupRequest::decode(payload.clone());
    let _ = GroupReply::decode(payload.clone());
    let _ = Sync::decode(payload.clone());
    let _ = DataMessage::decode(payload);
}

#[cfg(test)]
mod tests;
