//! A peer's compute service: the job service (worker pool), the peer's role in a compute
//! group, the handlers of every compute message, applications.
//!
//! # Job
//! [`ComputeService::new`] starts the worker pool; [`ComputeService::register`] adds the
//! handlers before the peer's endpoint starts; [`ComputeService::attach`] hands over the
//! peer's services once it has joined, takes the configured role and starts the
//! configured applications. From then on:
//! - [`crate::wire::JOB`]: runs the named job on the pool (refused with `NotOwner` when it
//!   was delegated for a chunk this peer does not own), answering from the worker;
//! - a **master** ([`crate::master`]) registers itself in the nameservice under
//!   [`master_name`], takes joins, submissions and barrier arrivals;
//! - a **slave** looks its master up there and joins (repeated every
//!   [`SLAVE_HEARTBEAT`] as a heartbeat, so a restarted master gets its slaves back), and
//!   runs the tasks it is sent ([`crate::slave`]);
//! - failures: a node the cluster declares failed or that left, or whose connection is
//!   lost, fails the runs it took part in (as slave or as master).
//!
//! # Invariants
//! - Requests before `attach` are answered "still starting", never dropped.
//! - A peer without the compute capability answers every job and task with
//!   [`crate::wire::JobFailure::NoCompute`] or a refusal.
//! - A role change stops the previous role first (a master's queued submissions are
//!   answered with an error).
//!
//! # Who calls it
//! `myriad-node`'s `PeerNode::start` (production and the in-process test cluster).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use myriad_net::{Handlers, Incoming, NetError};
use myriad_proto::meta::Event;
use myriad_types::{ChunkId, NodeId};
use parking_lot::Mutex;

use crate::app::{AppContext, Application};
use crate::env::PeerEnv;
use crate::job::{Job, JobContext, JobHandle, JobRegistry};
use crate::master::Master;
use crate::pool::{PoolStats, WorkerPool};
use crate::slave::SlaveRuns;
use crate::task::TaskRegistry;
use crate::wire::{
    self, encode_job_reply, encode_submit_reply, encode_task_done, DataMessage, GroupReply,
    GroupRequest, JobFailure, JobRequest, Role, SubmitRequest, Sync, TaskRun,
};

/// How often a slave repeats its join to its master.
pub const SLAVE_HEARTBEAT: Duration = Duration::from_millis(500);

/// The nameservice entry of group `group`'s master (its CID names the master's node).
pub fn master_name(group: u16) -> String {
    format!("compute.master.{group}")
}

/// Everything a peer can run: jobs, tasks, applications. Built with one chain of calls,
/// e.g. `Registry::with_builtins().job::<MyJob>().task(MyTask).app(MyApp)`.
#[derive(Clone, Default)]
pub struct Registry {
    /// Jobs by name.
    pub jobs: JobRegistry,
    /// Tasks by name.
    pub tasks: TaskRegistry,
    /// Applications by name.
    pub apps: HashMap<String, Arc<dyn Application>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut apps: Vec<_> = self.apps.keys().collect();
        apps.sort();
        f.debug_struct("Registry")
            .field("jobs", &self.jobs)
            .field("tasks", &self.tasks)
            .field("apps", &apps)
            .finish()
    }
}

impl Registry {
    /// The built-in jobs and tasks ([`crate::builtin`]).
    pub fn with_builtins() -> Registry {
        let mut registry = Registry::default();
        crate::builtin::register(&mut registry);
        registry
    }

    /// Adds job type `J`.
    pub fn job<J: Job>(mut self) -> Registry {
        self.jobs.register::<J>();
        self
    }

    /// Adds a task.
    pub fn task(mut self, task: impl crate::task::Task) -> Registry {
        self.tasks.register(task);
        self
    }

    /// Adds an application.
    pub fn app(mut self, app: impl Application) -> Registry {
        self.apps.insert(app.name().to_owned(), Arc::new(app));
        self
    }
}

/// Settings of a peer's compute service (`[compute]` in the node configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeConfig {
    /// Whether the peer runs jobs and tasks (its `compute` capability).
    pub enabled: bool,
    /// Worker threads of the job pool (0: one per CPU).
    pub workers: usize,
    /// The group the peer takes its role in.
    pub group: u16,
    /// Its role at start.
    pub role: Role,
    /// Applications started once the peer has joined.
    pub apps: Vec<String>,
}

impl Default for ComputeConfig {
    fn default() -> Self {
        ComputeConfig {
            enabled: true,
            workers: 0,
            group: 0,
            role: Role::None,
            apps: Vec::new(),
        }
    }
}

struct RoleState {
    role: Role,
    group: u16,
    master: Option<Arc<Master>>,
}

/// A peer's compute service (see the module documentation).
pub struct ComputeService {
    config: ComputeConfig,
    registry: Arc<Registry>,
    jobs: Arc<JobRegistry>,
    pool: Arc<WorkerPool>,
    env: OnceLock<PeerEnv>,
    role: Mutex<RoleState>,
    /// Changes with every role change; a slave's join loop ends when it does.
    generation: Arc<AtomicU64>,
    runs: Arc<SlaveRuns>,
    stopped: Arc<AtomicBool>,
}

impl std::fmt::Debug for ComputeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputeService")
            .field("config", &self.config)
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

fn not_ready() -> String {
    "the peer is still starting".to_owned()
}

impl ComputeService {
    /// Starts the worker pool.
    pub fn new(config: ComputeConfig, registry: Registry) -> std::io::Result<Arc<ComputeService>> {
        let workers = match config.workers {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let pool = Arc::new(WorkerPool::new("compute", workers)?);
        Ok(Arc::new(ComputeService {
            jobs: Arc::new(registry.jobs.clone()),
            registry: Arc::new(registry),
            pool,
            env: OnceLock::new(),
            role: Mutex::new(RoleState {
                role: Role::None,
                group: config.group,
                master: None,
            }),
            config,
            generation: Arc::new(AtomicU64::new(0)),
            runs: Arc::new(SlaveRuns::default()),
            stopped: Arc::new(AtomicBool::new(false)),
        }))
    }

    /// The settings.
    pub fn config(&self) -> &ComputeConfig {
        &self.config
    }

    /// What this peer can run.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The pool's counters (steals, executed, queued).
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// The peer's services, once attached.
    pub fn env(&self) -> Option<&PeerEnv> {
        self.env.get()
    }

    /// This peer's role and group.
    pub fn role(&self) -> (Role, u16) {
        let role = self.role.lock();
        (role.role, role.group)
    }

    fn context(&self) -> JobContext {
        let env = self.env.get().cloned();
        JobContext {
            node: env
                .as_ref()
                .map_or(NodeId(0), |env| env.membership.node_id()),
            env,
            pool: Arc::clone(&self.pool),
        }
    }

    /// Runs `job` on this peer's pool.
    pub fn submit<J: Job>(&self, job: J) -> JobHandle<J::Output> {
        self.context().spawn(job)
    }

    /// Runs a job given by name and encoded parameters on this peer's pool; the reply
    /// goes to `reply`. Refuses with `NotOwner` when `owner_of` names a chunk this peer
    /// does not own.
    pub fn run_request(
        &self,
        request: JobRequest,
        reply: impl FnOnce(wire::JobReply) + Send + 'static,
    ) {
        if !self.config.enabled {
            reply(Err(JobFailure::NoCompute(
                "the peer has no compute capability".into(),
            )));
            return;
        }
        let ctx = self.context();
        if let Some(cid) = request.owner_of {
            match ctx.local() {
                Ok(local) if local.owns(cid) => {}
                Ok(_) => return reply(Err(JobFailure::NotOwner)),
                Err(_) => return reply(Err(JobFailure::NoCompute(not_ready()))),
            }
        }
        let registry = Arc::clone(&self.jobs);
        self.pool.spawn(Box::new(move || {
            reply(registry.run(&request.name, request.params, &ctx));
        }));
    }

    /// Registers the handlers of every compute message (before the endpoint starts).
    pub fn register(self: &Arc<Self>, handlers: &mut Handlers) -> Result<(), NetError> {
        let service = Arc::clone(self);
        handlers.register_inline(wire::JOB, move |mut incoming: Incoming| {
            let Some(responder) = incoming.take_responder() else {
                return;
            };
            match JobRequest::decode(incoming.payload.clone()) {
                Ok(request) => service.run_request(request, move |reply| {
                    let _ = responder.respond(encode_job_reply(&reply));
                }),
                Err(error) => {
                    let reply = Err(JobFailure::BadParams(error.to_string()));
                    let _ = responder.respond(encode_job_reply(&reply));
                }
            }
        })?;
        let service = Arc::clone(self);
        handlers.register(wire::SUBMIT, move |mut incoming: Incoming| {
            let responder = incoming.take_responder();
            match SubmitRequest::decode(incoming.payload.clone()) {
                Ok(request) => service.on_submit(request, responder),
                Err(error) => reply_submit(responder, Err(format!("bad submission: {error}"))),
            }
        })?;
        let service = Arc::clone(self);
        handlers.register(wire::TASK_RUN, move |mut incoming: Incoming| {
            let Some(responder) = incoming.take_responder() else {
                return;
            };
            match (TaskRun::decode(incoming.payload.clone()), service.env.get()) {
                (Ok(_), _) if !service.config.enabled => {
                    let done = Err("the peer has no compute capability".to_owned());
                    let _ = responder.respond(encode_task_done(&done));
                }
                (Ok(run), Some(env)) => service.runs.start(
                    incoming.from,
                    run,
                    &service.registry.tasks,
                    env.clone(),
                    responder,
                ),
                (Ok(_), None) => {
                    let _ = responder.respond(encode_task_done(&Err(not_ready())));
                }
                (Err(error), _) => {
                    let done = Err(format!("bad task run: {error}"));
                    let _ = responder.respond(encode_task_done(&done));
                }
            }
        })?;
        let service = Arc::clone(self);
        handlers.register(wire::GROUP, move |mut incoming: Incoming| {
            let responder = incoming.take_responder();
            let reply = match GroupRequest::decode(incoming.payload.clone()) {
                Ok(request) => service.on_group(incoming.from, request),
                Err(error) => GroupReply::Refused(format!("bad group request: {error}")),
            };
            if let Some(responder) = responder {
                let _ = responder.respond(reply.encode());
            }
        })?;
        let service = Arc::clone(self);
        handlers.register_inline(wire::SYNC, move |incoming: Incoming| {
            let Ok(sync) = Sync::decode(incoming.payload.clone()) else {
                return;
            };
            if let Sync::Arrive { .. } = sync {
                let master = service.role.lock().master.clone();
                if let Some(master) = master {
                    master.on_arrive(incoming.from, sync);
                }
            } else {
                service.runs.on_sync(incoming.from, sync);
            }
        })?;
        let runs = Arc::clone(&self.runs);
        handlers.register_inline(wire::DATA, move |incoming: Incoming| {
            if let Ok(message) = DataMessage::decode(incoming.payload.clone()) {
                runs.on_data(message);
            }
        })?;
        Ok(())
    }

    fn on_submit(&self, request: SubmitRequest, responder: Option<myriad_net::Responder>) {
        let master = {
            let role = self.role.lock();
            role.master
                .as_ref()
                .filter(|master| master.group() == request.group)
                .cloned()
        };
        match master {
            Some(master) => master.submit(request, responder),
            None => {
                let me = self
                    .env
                    .get()
                    .map_or(NodeId(0), |env| env.membership.node_id());
                reply_submit(
                    responder,
                    Err(format!(
                        "node {me} is not the master of group {}",
                        request.group
                    )),
                );
            }
        }
    }

    fn on_group(self: &Arc<Self>, from: NodeId, request: GroupRequest) -> GroupReply {
        let master = self.role.lock().master.clone();
        match request {
            GroupRequest::Join(group)
            | GroupRequest::Leave(group)
            | GroupRequest::Status(group)
                if master.as_ref().map(|m| m.group()) != Some(group) =>
            {
                GroupReply::Refused(format!("not the master of group {group}"))
            }
            GroupRequest::Join(_) => {
                if let Some(master) = master {
                    master.join(from);
                }
                GroupReply::Ok
            }
            GroupRequest::Leave(_) => {
                if let Some(master) = master {
                    master.slave_down(from, "it left the group");
                }
                GroupReply::Ok
            }
            GroupRequest::Status(_) => match master {
                Some(master) => GroupReply::Status(master.status()),
                None => GroupReply::Refused("no master".into()),
            },
            GroupRequest::Info => {
                let (role, group) = self.role();
                GroupReply::Info(role, group)
            }
            GroupRequest::SetRole(group, role) => match self.set_role(group, role) {
                Ok(()) => GroupReply::Ok,
                Err(text) => GroupReply::Refused(text),
            },
            GroupRequest::StartApp(name) => match self.start_app(&name) {
                Ok(()) => GroupReply::Ok,
                Err(text) => GroupReply::Refused(text),
            },
        }
    }

    /// Hands over the peer's services once it has joined; takes the configured role,
    /// starts the configured applications and follows the cluster's failures.
    pub fn attach(self: &Arc<Self>, env: PeerEnv) {
        if self.env.set(env.clone()).is_err() {
            return;
        }
        self.follow_failures(&env);
        if !self.config.enabled {
            return;
        }
        if self.config.role != Role::None {
            if let Err(error) = self.set_role(self.config.group, self.config.role) {
                tracing::warn!(%error, "could not take the configured compute role");
            }
        }
        for app in &self.config.apps {
            if let Err(error) = self.start_app(app) {
                tracing::warn!(%error, app, "could not start the application");
            }
        }
    }

    /// Takes `role` in `group` (stopping the previous role first).
    pub fn set_role(self: &Arc<Self>, group: u16, role: Role) -> Result<(), String> {
        if !self.config.enabled && role != Role::None {
            return Err("the peer has no compute capability".into());
        }
        let env = self.env.get().cloned().ok_or_else(not_ready)?;
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let mut state = self.role.lock();
        if let Some(master) = state.master.take() {
            master.stop();
        }
        state.role = role;
        state.group = group;
        match role {
            Role::None => {}
            Role::Master => {
                let master = Master::start(group, env.clone())
                    .map_err(|error| format!("starting the master: {error}"))?;
                state.master = Some(master);
                drop(state);
                let me = env.membership.node_id();
                let cid = ChunkId::new(me, 0).ok_or("node ID out of range")?;
                let client = env.client.clone();
                // Slaves find the master by this name; registered from the runtime.
                let name = master_name(group);
                env.membership.net().runtime().spawn(async move {
                    if let Err(error) = client.name_register(&name, cid).await {
                        tracing::warn!(%error, name, "could not register the compute master");
                    }
                });
                tracing::info!(group, node = %me, "compute master");
            }
            Role::Slave => {
                drop(state);
                self.spawn_slave_joiner(group, generation, env)?;
            }
        }
        Ok(())
    }

    /// A slave's loop: finds the master by name and joins, every heartbeat, until the role
    /// changes or the service stops.
    fn spawn_slave_joiner(&self, group: u16, generation: u64, env: PeerEnv) -> Result<(), String> {
        let current = Arc::clone(&self.generation);
        let stopped = Arc::clone(&self.stopped);
        std::thread::Builder::new()
            .name(format!("compute-slave-{group}"))
            .spawn(move || {
                let mut joined: Option<NodeId> = None;
                while current.load(Ordering::Acquire) == generation
                    && !stopped.load(Ordering::Acquire)
                {
                    let master = env
                        .client
                        .blocking()
                        .name_get(&master_name(group))
                        .ok()
                        .flatten()
                        .map(|cid| cid.creator());
                    if let Some(master) = master.filter(|m| *m != env.membership.node_id()) {
                        let reply = env.membership.net().request_blocking(
                            master,
                            wire::GROUP,
                            GroupRequest::Join(group).encode(),
                            Duration::from_secs(2),
                        );
                        let ok = matches!(reply.map(GroupReply::decode), Ok(Ok(GroupReply::Ok)));
                        if ok && joined != Some(master) {
                            tracing::info!(group, %master, "joined the compute group as slave");
                            joined = Some(master);
                        } else if !ok {
                            joined = None;
                        }
                    }
                    std::thread::sleep(SLAVE_HEARTBEAT);
                }
            })
            .map(drop)
            .map_err(|error| format!("starting the slave: {error}"))
    }

    /// Starts the registered application `name` on a thread of its own.
    pub fn start_app(self: &Arc<Self>, name: &str) -> Result<(), String> {
        let app = self
            .registry
            .apps
            .get(name)
            .cloned()
            .ok_or_else(|| format!("no application named {name:?}"))?;
        let env = self.env.get().cloned().ok_or_else(not_ready)?;
        let ctx = AppContext {
            env,
            service: Arc::clone(self),
            stop: Arc::clone(&self.stopped),
        };
        std::thread::Builder::new()
            .name(format!("app-{name}"))
            .spawn(move || {
                let name = app.name().to_owned();
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| app.run(&ctx))) {
                    Ok(Ok(())) => tracing::info!(app = name, "application finished"),
                    Ok(Err(error)) => tracing::warn!(app = name, %error, "application failed"),
                    Err(panic) => tracing::warn!(
                        app = name,
                        panic = crate::job::panic_text(&panic),
                        "application panicked"
                    ),
                }
            })
            .map(drop)
            .map_err(|error| format!("starting the application: {error}"))
    }

    /// Follows failure events and lost connections: runs with a gone node fail.
    fn follow_failures(self: &Arc<Self>, env: &PeerEnv) {
        let mut events = env.membership.subscribe();
        let mut lost = env.membership.net().subscribe();
        let service = Arc::downgrade(self);
        env.membership.net().runtime().spawn(async move {
            loop {
                let (node, reason) = tokio::select! {
                    event = events.recv() => match event {
                        Ok(Event::NodeFailed(node)) => (node, "declared failed".to_owned()),
                        Ok(Event::NodeLeft(node)) => (node, "left the cluster".to_owned()),
                        Ok(_) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                    },
                    connection = lost.recv() => match connection {
                        Some(lost) => (lost.node, format!("connection lost ({:?})", lost.reason)),
                        None => break,
                    },
                };
                let Some(service) = service.upgrade() else {
                    break;
                };
                service.node_gone(node, &reason);
            }
        });
    }

    fn node_gone(&self, node: NodeId, reason: &str) {
        let master = self.role.lock().master.clone();
        if let Some(master) = master {
            master.slave_down(node, reason);
        }
        self.runs.abort_master(node, reason);
    }

    /// Stops the roles, the applications' stop flag and the pool.
    pub fn shutdown(&self) {
        self.stopped.store(true, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(master) = self.role.lock().master.take() {
            master.stop();
        }
        self.pool.shutdown();
    }
}

fn reply_submit(
    responder: Option<myriad_net::Responder>,
    reply: Result<wire::SubmitReply, String>,
) {
    if let Some(responder) = responder {
        let _ = responder.respond(encode_submit_reply(&reply));
    }
}
