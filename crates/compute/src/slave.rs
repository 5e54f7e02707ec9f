//! The slave side of a compute group's runs: running a task, its inbox, its barriers.
//!
//! # Job
//! A master sends [`TaskRun`] to each slave of a run; [`SlaveRuns::start`] runs the task
//! on a thread of its own: first the superstep's opening barrier (round 0, so no slave
//! starts before every slave has the task), then the task, then the answer
//! ([`TaskDone`]) to the master, whose collection of all answers is the closing barrier.
//! [`RunChannel`] is a run's inbox and barrier state, created by whichever comes first: the
//! task or another slave's message.
//!
//! # Invariants
//! - A barrier returns only when the master released its round and this slave received
//!   every message the others counted as sent to it before arriving there.
//! - An aborted run ([`Sync::Abort`], the master's failure) wakes every waiter at once.
//! - Messages for a run that finished here are dropped (a bounded list of finished runs).
//!
//! # Who calls it
//! [`crate::service::ComputeService`]'s handlers ([`crate::wire::TASK_RUN`],
//! [`crate::wire::SYNC`], [`crate::wire::DATA`]) and [`crate::TaskContext`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_net::Responder;
use myriad_types::NodeId;
use parking_lot::{Condvar, Mutex};

use crate::env::PeerEnv;
use crate::job::panic_text;
use crate::task::{TaskContext, TaskError, TaskRegistry};
use crate::wire::{encode_task_done, DataMessage, Sync, TaskDone, TaskRun, DATA, SYNC};

/// Finished runs remembered so that their late messages are dropped.
const FINISHED_REMEMBERED: usize = 1024;

/// A run's key on a slave: its master and the master's run number.
type RunKey = (NodeId, u64);

#[derive(Default)]
struct ChannelState {
    inbox: VecDeque<(usize, Bytes)>,
    received: u64,
    releases: HashMap<u32, (u64, Vec<Bytes>)>,
    aborted: Option<String>,
}

/// A run's inbox and barrier releases (see the module documentation).
#[derive(Default)]
pub(crate) struct RunChannel {
    state: Mutex<ChannelState>,
    changed: Condvar,
}

impl RunChannel {
    fn push(&self, from: usize, payload: Bytes) {
        let mut state = self.state.lock();
        state.inbox.push_back((from, payload));
        state.received += 1;
        self.changed.notify_all();
    }

    fn release(&self, round: u32, expected: u64, values: Vec<Bytes>) {
        self.state.lock().releases.insert(round, (expected, values));
        self.changed.notify_all();
    }

    fn abort(&self, reason: String) {
        let mut state = self.state.lock();
        if state.aborted.is_none() {
            state.aborted = Some(reason);
        }
        self.changed.notify_all();
    }
}

/// One task run on this slave.
pub(crate) struct SlaveRun {
    pub(crate) group: u16,
    pub(crate) index: usize,
    pub(crate) slaves: Vec<NodeId>,
    master: NodeId,
    run: u64,
    channel: Arc<RunChannel>,
    sent: Mutex<Vec<u64>>,
    round: Mutex<u32>,
}

impl SlaveRun {
    /// The abort reason, once aborted.
    pub(crate) fn aborted(&self) -> Option<String> {
        self.channel.state.lock().aborted.clone()
    }

    pub(crate) fn send(&self, env: &PeerEnv, to: usize, payload: Bytes) -> Result<(), TaskError> {
        let Some(&node) = self.slaves.get(to) else {
            return Err(TaskError::Invalid(format!(
                "no slave {to} in a run of {}",
                self.slaves.len()
            )));
        };
        if let Some(reason) = self.aborted() {
            return Err(TaskError::Aborted(reason));
        }
        self.sent.lock()[to] += 1;
        if to == self.index {
            self.channel.push(to, payload);
            return Ok(());
        }
        let message = DataMessage {
            master: self.master,
            run: self.run,
            from: self.index as u32,
            payload,
        };
        env.membership
            .net()
            .send_blocking(node, DATA, message.encode())
            .map_err(|error| TaskError::Send {
                index: to,
                node,
                reason: error.to_string(),
            })
    }

    pub(crate) fn recv_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<(usize, Bytes)>, TaskError> {
        let deadline = Instant::now() + timeout;
        let mut state = self.channel.state.lock();
        loop {
            if let Some(message) = state.inbox.pop_front() {
                return Ok(Some(message));
            }
            if let Some(reason) = &state.aborted {
                return Err(TaskError::Aborted(reason.clone()));
            }
            if self
                .channel
                .changed
                .wait_until(&mut state, deadline)
                .timed_out()
            {
                return Ok(state.inbox.pop_front());
            }
        }
    }

    pub(crate) fn barrier(
        &self,
        env: &PeerEnv,
        value: Bytes,
        timeout: Duration,
    ) -> Result<Vec<Bytes>, TaskError> {
        let round = {
            let mut round = self.round.lock();
            let this = *round;
            *round += 1;
            this
        };
        let arrive = Sync::Arrive {
            run: self.run,
            round,
            index: self.index as u32,
            sent: self.sent.lock().clone(),
            value,
        };
        env.membership
            .net()
            .send_blocking(self.master, SYNC, arrive.encode())
            .map_err(|error| {
                TaskError::Aborted(format!("master {} unreachable: {error}", self.master))
            })?;
        let deadline = Instant::now() + timeout;
        let mut state = self.channel.state.lock();
        loop {
            if let Some(reason) = &state.aborted {
                return Err(TaskError::Aborted(reason.clone()));
            }
            if let Some((expected, _)) = state.releases.get(&round) {
                if state.received >= *expected {
                    let (_, values) = state.releases.remove(&round).unwrap_or_default();
                    return Ok(values);
                }
            }
            if self
                .channel
                .changed
                .wait_until(&mut state, deadline)
                .timed_out()
            {
                return Err(TaskError::Timeout(timeout));
            }
        }
    }
}

/// Every run on this slave (see the module documentation).
#[derive(Default)]
pub(crate) struct SlaveRuns {
    channels: Mutex<HashMap<RunKey, Arc<RunChannel>>>,
    /// Finished runs: a set to look up, the order to forget them in.
    finished: Mutex<(HashSet<RunKey>, VecDeque<RunKey>)>,
}

impl SlaveRuns {
    /// The channel of a run, created on first use; `None` once the run finished here.
    fn channel(&self, key: RunKey) -> Option<Arc<RunChannel>> {
        if self.finished.lock().0.contains(&key) {
            return None;
        }
        Some(Arc::clone(self.channels.lock().entry(key).or_default()))
    }

    fn finish(&self, key: RunKey) {
        self.channels.lock().remove(&key);
        let (set, order) = &mut *self.finished.lock();
        if set.insert(key) {
            order.push_back(key);
        }
        if order.len() > FINISHED_REMEMBERED {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
    }

    /// A message from another slave ([`DATA`]).
    pub(crate) fn on_data(&self, message: DataMessage) {
        if let Some(channel) = self.channel((message.master, message.run)) {
            channel.push(message.from as usize, message.payload);
        }
    }

    /// A release or abort from a master ([`SYNC`]).
    pub(crate) fn on_sync(&self, master: NodeId, sync: Sync) {
        match sync {
            Sync::Release {
                run,
                round,
                expected,
                values,
            } => {
                if let Some(channel) = self.channel((master, run)) {
                    channel.release(round, expected, values);
                }
            }
            Sync::Abort { run, reason } => {
                if let Some(channel) = self.channel((master, run)) {
                    channel.abort(reason);
                }
            }
            Sync::Arrive { .. } => {}
        }
    }

    /// Aborts every run of `master` (it failed or its connection was lost).
    pub(crate) fn abort_master(&self, master: NodeId, reason: &str) {
        for (key, channel) in self.channels.lock().iter() {
            if key.0 == master {
                channel.abort(format!("master {master} is gone: {reason}"));
            }
        }
    }

    /// Starts `run` (from `master`) on a thread of its own; the answer goes to
    /// `responder`.
    pub(crate) fn start(
        self: &Arc<Self>,
        master: NodeId,
        run: TaskRun,
        tasks: &TaskRegistry,
        env: PeerEnv,
        responder: Responder,
    ) {
        let Some(task) = tasks.get(&run.task) else {
            let me = env.membership.node_id();
            let done: TaskDone = Err(format!("no task named {:?} on node {me}", run.task));
            let _ = responder.respond(encode_task_done(&done));
            return;
        };
        let key = (master, run.run);
        let Some(channel) = self.channel(key) else {
            return;
        };
        let slave_run = Arc::new(SlaveRun {
            group: run.group,
            index: run.index as usize,
            sent: Mutex::new(vec![0; run.slaves.len()]),
            slaves: run.slaves,
            master,
            run: run.run,
            channel,
            round: Mutex::new(0),
        });
        let ctx = TaskContext {
            run: slave_run,
            env,
            params: run.params,
            timeout: Duration::from_millis(run.timeout_ms.max(1)),
        };
        let runs = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("task-{}", run.task))
            .spawn(move || {
                let done = run_one(task.as_ref(), &ctx);
                runs.finish(key);
                let _ = responder.respond(encode_task_done(&done));
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start a task thread");
        }
    }
}

/// The opening barrier, then the task with its panic caught.
fn run_one(task: &dyn crate::task::Task, ctx: &TaskContext) -> TaskDone {
    ctx.barrier(Bytes::new())
        .map_err(|error| format!("superstep start: {error}"))?;
    match std::panic::catch_unwind(AssertUnwindSafe(|| task.run(ctx))) {
        Ok(done) => done,
        Err(panic) => Err(format!("task panicked: {}", panic_text(&panic))),
    }
}
