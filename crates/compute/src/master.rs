//! The master of a compute group: slaves joining and leaving, the queue of submitted
//! scripts, running each task on all slaves at once, barriers, status.
//!
//! # Job
//! [`Master`] keeps the group's slaves (joined by [`crate::wire::GroupRequest::Join`],
//! which slaves repeat as a heartbeat), queues submissions and runs them one at a time on
//! its own thread. A task runs as a superstep: [`TaskRun`] to every chosen slave, their
//! barrier arrivals collected and released here ([`Master::on_arrive`]), their answers
//! collected (the closing barrier). Conditions between tasks are checked here.
//!
//! # Invariants
//! - A slave that dies or whose connection is lost during a run fails that run at once
//!   with an error naming the slave and the task (the surviving slaves are told to abort);
//!   the slave leaves the group (it joins again if it is alive), and the queue goes on
//!   with the next submission. Nothing waits on a dead slave.
//! - Every submission is answered: with its outcome, or why it failed.
//! - Status keeps the queued, the running and the latest [`FINISHED_KEPT`] finished
//!   submissions, with their timings.
//!
//! # Who calls it
//! [`crate::service::ComputeService`] creates it for the master role and routes the
//! group's messages and the cluster's failure events to it.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_net::Responder;
use myriad_types::NodeId;
use parking_lot::{Condvar, Mutex};

use crate::env::PeerEnv;
use crate::script::{Condition, Otherwise};
use crate::wire::{
    decode_task_done, encode_submit_reply, GroupStatus, ScriptEnd, StatusEntry, StepWire,
    SubmitReply, SubmitRequest, Sync, TaskOutcome, TaskRun, SYNC, TASK_RUN,
};

/// Finished submissions kept for status.
pub const FINISHED_KEPT: usize = 64;

/// What happened to a run while the master waits for it.
enum RunEvent {
    /// Slave `index` answered (its value or error), or the request failed.
    Done(usize, Result<Result<Bytes, String>, String>),
    /// A slave of the run is gone.
    SlaveDown(NodeId, String),
}

/// A slave's barrier arrival: messages it sent to each slave, its value.
type Arrival = (Vec<u64>, Bytes);

struct MasterRun {
    slaves: Vec<NodeId>,
    /// Per round: each slave's arrival, once it arrived.
    rounds: Mutex<HashMap<u32, Vec<Option<Arrival>>>>,
    events: crossbeam_channel::Sender<RunEvent>,
}

struct Queued {
    id: u64,
    request: SubmitRequest,
    responder: Option<Responder>,
    queued_at: Instant,
}

#[derive(Default)]
struct MasterState {
    slaves: BTreeSet<NodeId>,
    queue: VecDeque<Queued>,
    running: Option<(u64, String, Instant, Duration)>,
    finished: VecDeque<StatusEntry>,
    next_id: u64,
}

/// A group's master (see the module documentation).
pub(crate) struct Master {
    group: u16,
    env: PeerEnv,
    state: Mutex<MasterState>,
    wake: Condvar,
    runs: Mutex<HashMap<u64, Arc<MasterRun>>>,
    next_run: AtomicU64,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Master {
    /// Starts the master of `group` with its queue thread.
    pub(crate) fn start(group: u16, env: PeerEnv) -> std::io::Result<Arc<Master>> {
        let master = Arc::new(Master {
            group,
            env,
            state: Mutex::new(MasterState::default()),
            wake: Condvar::new(),
            runs: Mutex::new(HashMap::new()),
            next_run: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let worker = Arc::clone(&master);
        let thread = std::thread::Builder::new()
            .name(format!("compute-master-{group}"))
            .spawn(move || worker.serve_queue())?;
        *master.thread.lock() = Some(thread);
        Ok(master)
    }

    pub(crate) fn group(&self) -> u16 {
        self.group
    }

    /// Stops taking submissions: queued ones are answered with an error; a running one
    /// finishes. Does not wait.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let queued: Vec<Queued> = self.state.lock().queue.drain(..).collect();
        for queued in queued {
            answer(queued.responder, &Err("the master stopped".to_owned()));
        }
        self.wake.notify_all();
    }

    /// A slave joins (or repeats its heartbeat).
    pub(crate) fn join(&self, slave: NodeId) {
        if self.state.lock().slaves.insert(slave) {
            tracing::info!(group = self.group, %slave, "slave joined the compute group");
        }
    }

    /// A slave leaves, or is gone (`reason`): removed from the group, and its runs fail.
    pub(crate) fn slave_down(&self, slave: NodeId, reason: &str) {
        if self.state.lock().slaves.remove(&slave) {
            tracing::warn!(group = self.group, %slave, reason, "slave left the compute group");
        }
        for run in self.runs.lock().values() {
            if run.slaves.contains(&slave) {
                let _ = run
                    .events
                    .send(RunEvent::SlaveDown(slave, reason.to_owned()));
            }
        }
    }

    /// Queues a submission; the answer goes to `responder`.
    pub(crate) fn submit(&self, request: SubmitRequest, responder: Option<Responder>) {
        if self.stop.load(Ordering::Acquire) {
            answer(responder, &Err("the master stopped".to_owned()));
            return;
        }
        let mut state = self.state.lock();
        state.next_id += 1;
        let id = state.next_id;
        state.queue.push_back(Queued {
            id,
            request,
            responder,
            queued_at: Instant::now(),
        });
        drop(state);
        self.wake.notify_all();
    }

    /// The group's status.
    pub(crate) fn status(&self) -> GroupStatus {
        let state = self.state.lock();
        let now = Instant::now();
        let mut entries: Vec<StatusEntry> = state
            .queue
            .iter()
            .map(|queued| StatusEntry {
                id: queued.id,
                name: queued.request.name.clone(),
                state: "queued".into(),
                queued_micros: micros(now - queued.queued_at),
                run_micros: 0,
                detail: String::new(),
            })
            .collect();
        if let Some((id, name, started, waited)) = &state.running {
            entries.push(StatusEntry {
                id: *id,
                name: name.clone(),
                state: "running".into(),
                queued_micros: micros(*waited),
                run_micros: micros(now - *started),
                detail: String::new(),
            });
        }
        entries.extend(state.finished.iter().rev().cloned());
        GroupStatus {
            group: self.group,
            master: self.env.membership.node_id(),
            slaves: state.slaves.iter().copied().collect(),
            entries,
        }
    }

    /// A barrier arrival of a slave.
    pub(crate) fn on_arrive(&self, from: NodeId, sync: Sync) {
        let Sync::Arrive {
            run,
            round,
            index,
            sent,
            value,
        } = sync
        else {
            return;
        };
        let Some(master_run) = self.runs.lock().get(&run).cloned() else {
            return;
        };
        let index = index as usize;
        if master_run.slaves.get(index) != Some(&from) || sent.len() != master_run.slaves.len() {
            return;
        }
        let complete = {
            let mut rounds = master_run.rounds.lock();
            let arrivals = rounds
                .entry(round)
                .or_insert_with(|| vec![None; master_run.slaves.len()]);
            arrivals[index] = Some((sent, value));
            if arrivals.iter().all(Option::is_some) {
                rounds.remove(&round)
            } else {
                None
            }
        };
        if let Some(arrivals) = complete {
            self.release(run, round, &master_run.slaves, arrivals);
        }
    }

    fn release(&self, run: u64, round: u32, slaves: &[NodeId], arrivals: Vec<Option<Arrival>>) {
        let arrivals: Vec<Arrival> = arrivals.into_iter().flatten().collect();
        let values: Vec<Bytes> = arrivals.iter().map(|(_, value)| value.clone()).collect();
        let net = self.env.membership.net().clone();
        for (index, slave) in slaves.iter().enumerate() {
            let expected = arrivals.iter().map(|(sent, _)| sent[index]).sum();
            let release = Sync::Release {
                run,
                round,
                expected,
                values: values.clone(),
            };
            let (net, slave, payload) = (net.clone(), *slave, release.encode());
            net.runtime().spawn(async move {
                let _ = net.send(slave, SYNC, payload).await;
            });
        }
    }

    fn serve_queue(self: Arc<Self>) {
        while !self.stop.load(Ordering::Acquire) {
            let next = {
                let mut state = self.state.lock();
                match state.queue.pop_front() {
                    Some(queued) => {
                        state.running = Some((
                            queued.id,
                            queued.request.name.clone(),
                            Instant::now(),
                            queued.queued_at.elapsed(),
                        ));
                        Some(queued)
                    }
                    None => {
                        self.wake.wait_for(&mut state, Duration::from_millis(200));
                        None
                    }
                }
            };
            let Some(queued) = next else { continue };
            let started = Instant::now();
            let reply = self.run_script(queued.id, &queued.request);
            let (state_name, detail) = match &reply.end {
                ScriptEnd::Finished => ("finished", String::new()),
                ScriptEnd::Aborted(text) => ("aborted", text.clone()),
                ScriptEnd::Failed(text) => ("failed", text.clone()),
            };
            {
                let mut state = self.state.lock();
                state.running = None;
                state.finished.push_back(StatusEntry {
                    id: queued.id,
                    name: queued.request.name.clone(),
                    state: state_name.into(),
                    queued_micros: micros(started - queued.queued_at),
                    run_micros: micros(started.elapsed()),
                    detail,
                });
                if state.finished.len() > FINISHED_KEPT {
                    state.finished.pop_front();
                }
            }
            answer(queued.responder, &Ok(reply));
        }
    }

    fn run_script(&self, id: u64, request: &SubmitRequest) -> SubmitReply {
        let mut tasks: Vec<TaskOutcome> = Vec::new();
        let mut previous: Option<Vec<Bytes>> = None;
        for (number, step) in request.steps.iter().enumerate() {
            if let Some(wire) = step.condition {
                let Some(condition) = Condition::from_wire(wire) else {
                    let end = ScriptEnd::Failed(format!("task {number}: unknown condition"));
                    return SubmitReply { id, end, tasks };
                };
                let values = previous.clone().unwrap_or_default();
                match condition.holds(&values) {
                    Ok(true) => {}
                    Ok(false) if condition.otherwise == Otherwise::Skip => {
                        tasks.push(TaskOutcome {
                            task: step.task.clone(),
                            slaves: Vec::new(),
                            values: Vec::new(),
                            micros: 0,
                            skipped: true,
                        });
                        continue;
                    }
                    Ok(false) => {
                        let end = ScriptEnd::Aborted(format!(
                            "condition {} before task {number} ({}) failed",
                            condition.describe(),
                            step.task
                        ));
                        return SubmitReply { id, end, tasks };
                    }
                    Err(text) => {
                        let end = ScriptEnd::Failed(format!(
                            "condition before task {number} ({}): {text}",
                            step.task
                        ));
                        return SubmitReply { id, end, tasks };
                    }
                }
            }
            match self.run_task(request, step) {
                Ok(outcome) => {
                    previous = Some(outcome.values.clone());
                    tasks.push(outcome);
                }
                Err(text) => {
                    let end = ScriptEnd::Failed(format!("task {number} ({}): {text}", step.task));
                    return SubmitReply { id, end, tasks };
                }
            }
        }
        SubmitReply {
            id,
            end: ScriptEnd::Finished,
            tasks,
        }
    }

    /// The slaves for a task: waits up to the script's slave wait for `slaves_min`, then
    /// takes at most `slaves_max` (0: all), by node ID.
    fn choose_slaves(
        &self,
        request: &SubmitRequest,
        step: &StepWire,
    ) -> Result<Vec<NodeId>, String> {
        let deadline = Instant::now() + Duration::from_millis(request.slaves_wait_ms);
        let min = step.slaves_min.max(1) as usize;
        loop {
            let slaves: Vec<NodeId> = self.state.lock().slaves.iter().copied().collect();
            if slaves.len() >= min {
                let max = if step.slaves_max == 0 {
                    slaves.len()
                } else {
                    step.slaves_max as usize
                };
                return Ok(slaves.into_iter().take(max).collect());
            }
            if Instant::now() >= deadline || self.stop.load(Ordering::Acquire) {
                return Err(format!(
                    "group {} has {} slaves, the task needs at least {min} (waited {} ms)",
                    self.group,
                    slaves.len(),
                    request.slaves_wait_ms
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn run_task(&self, request: &SubmitRequest, step: &StepWire) -> Result<TaskOutcome, String> {
        let slaves = self.choose_slaves(request, step)?;
        let run = self.next_run.fetch_add(1, Ordering::Relaxed);
        let (events, receiver) = crossbeam_channel::unbounded();
        let master_run = Arc::new(MasterRun {
            slaves: slaves.clone(),
            rounds: Mutex::new(HashMap::new()),
            events: events.clone(),
        });
        self.runs.lock().insert(run, Arc::clone(&master_run));
        let timeout = Duration::from_millis(request.task_timeout_ms.max(1));
        let started = Instant::now();
        let net = self.env.membership.net().clone();
        for (index, slave) in slaves.iter().enumerate() {
            let payload = TaskRun {
                group: self.group,
                run,
                index: index as u32,
                slaves: slaves.clone(),
                task: step.task.clone(),
                params: step.params.clone(),
                timeout_ms: request.task_timeout_ms,
            }
            .encode();
            let (net, slave, events) = (net.clone(), *slave, events.clone());
            net.clone().runtime().spawn(async move {
                let answer = match net.request(slave, TASK_RUN, payload, timeout).await {
                    Ok(bytes) => {
                        decode_task_done(bytes).map_err(|error| format!("bad answer: {error}"))
                    }
                    Err(error) => Err(error.to_string()),
                };
                let _ = events.send(RunEvent::Done(index, answer));
            });
        }
        // A slave that died before the run was registered is caught here.
        for slave in &slaves {
            if !self.env.membership.is_alive(*slave) {
                let _ = events.send(RunEvent::SlaveDown(*slave, "not alive".into()));
            }
        }
        let result = self.collect(&slaves, &receiver, started + timeout, timeout);
        self.runs.lock().remove(&run);
        match result {
            Ok(values) => Ok(TaskOutcome {
                task: step.task.clone(),
                slaves,
                values,
                micros: micros(started.elapsed()),
                skipped: false,
            }),
            Err((text, gone)) => {
                self.abort_run(run, &slaves, &text);
                if let Some(gone) = gone {
                    self.state.lock().slaves.remove(&gone);
                }
                Err(text)
            }
        }
    }

    /// Waits for every slave's answer; on a failure returns its text and the slave to
    /// drop from the group (when it is gone).
    fn collect(
        &self,
        slaves: &[NodeId],
        receiver: &crossbeam_channel::Receiver<RunEvent>,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Vec<Bytes>, (String, Option<NodeId>)> {
        let mut values: Vec<Option<Bytes>> = vec![None; slaves.len()];
        while values.iter().any(Option::is_none) {
            let event = match receiver.recv_deadline(deadline) {
                Ok(event) => event,
                Err(_) => {
                    let missing: Vec<String> = values
                        .iter()
                        .enumerate()
                        .filter(|(_, value)| value.is_none())
                        .map(|(index, _)| format!("{index} (node {})", slaves[index]))
                        .collect();
                    return Err((
                        format!(
                            "not finished within {timeout:?}: slaves {}",
                            missing.join(", ")
                        ),
                        None,
                    ));
                }
            };
            match event {
                RunEvent::Done(index, Ok(Ok(value))) => values[index] = Some(value),
                RunEvent::Done(index, Ok(Err(text))) => {
                    return Err((
                        format!("slave {index} (node {}) failed: {text}", slaves[index]),
                        None,
                    ))
                }
                RunEvent::Done(index, Err(text)) => {
                    return Err((
                        format!(
                            "slave {index} (node {}) is unreachable: {text}",
                            slaves[index]
                        ),
                        Some(slaves[index]),
                    ))
                }
                RunEvent::SlaveDown(node, reason) => {
                    let index = slaves.iter().position(|slave| *slave == node).unwrap_or(0);
                    return Err((
                        format!("slave {index} (node {node}) failed during the task: {reason}"),
                        Some(node),
                    ));
                }
            }
        }
        Ok(values.into_iter().flatten().collect())
    }

    fn abort_run(&self, run: u64, slaves: &[NodeId], reason: &str) {
        let payload = Sync::Abort {
            run,
            reason: reason.to_owned(),
        }
        .encode();
        let net = self.env.membership.net().clone();
        for slave in slaves {
            let (net, slave, payload) = (net.clone(), *slave, payload.clone());
            net.clone().runtime().spawn(async move {
                let _ = net.send(slave, SYNC, payload).await;
            });
        }
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn answer(responder: Option<Responder>, reply: &Result<SubmitReply, String>) {
    if let Some(responder) = responder {
        let _ = responder.respond(encode_submit_reply(reply));
    }
}
