//! One member of the superpeer group.
//!
//! # Job
//! A [`Superpeer`] hosts a `myriad-raft` member over the messaging layer (Raft RPCs are
//! [`types::RAFT_RPC`] requests), and serves the metadata family of `myriad-proto`:
//! - metadata requests and joins: the leader executes them (writes through Raft, reads
//!   linearizable); followers answer `NotLeader` so that clients go to the leader;
//! - after the leader commits a join, leave, failure or ownership change it pushes the
//!   event ([`types::EVENT`], ordered) to every live node and to the other superpeers, and
//!   after a barrier round completes it tells the participants ([`types::BARRIER_RELEASED`]);
//! - failure detection ([`watch`]): each superpeer pings the peers and clients assigned to
//!   it and asks the leader to commit `Fail` for a node that stops answering;
//! - recovery ([`recovery`]): after the leader commits `Fail` for a peer it fences the
//!   node; the leader has every zone the zone table says is due (of failed peers, and of
//!   earlier incarnations of restarted peers) restored by one of the zone's backups,
//!   resuming after a leader change (status: [`types::RECOVERY_STATUS`]);
//! - a peer's new incarnation (a restart with its data directory) gets its zone-number and
//!   local-ID bases ([`MetaRequest::Bases`]); its join pushes the ownership of its fresh
//!   local IDs back to it;
//! - an operator's clean stop ([`types::NODE_SHUTDOWN`], from `myriad term`'s
//!   `nodeshutdown` once the superpeer left the Raft group) sets a flag the process polls
//!   ([`Superpeer::shutdown_requested`]).
//!
//! # Invariants
//! - The metadata changes only through Raft; a follower never applies a request itself.
//! - No handler blocks an I/O or handler thread on Raft: every request is answered from a
//!   task on the superpeer's runtime.
//! - Before the leader of a fresh group accepts any join, every configured superpeer is
//!   registered in the node table under its configured ID, so peers and clients never get
//!   a superpeer's ID.
//! - One process per data directory: the directory is locked (an exclusive lock on
//!   `LOCK`) for the superpeer's lifetime.
//!
//! # Who calls it
//! `myriad superpeer` (the CLI) and tests.

use std::fs::File;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use myriad_membership::{cert_role_of, certificate_fits};
use myriad_meta::{Command, MetaError, MetaState, NodeState, Response, Role};
use myriad_net::{CertRole, Endpoint, Handlers, Incoming, NetError, NetHandle, Responder};
use myriad_proto::meta::{
    BarrierReleased, BarrierStatus, Event, EventPush, FailureReport, Heartbeat, HeartbeatReply,
    JoinReply, JoinRequest, MetaReply, MetaRequest, StatusReply,
};
use myriad_proto::types;
use myriad_raft::{
    MetaRaft, RaftConfig, RaftReadError, RaftSummary, RaftTransport, RaftWriteError, TransportError,
};
use myriad_types::NodeId;
use tokio::sync::mpsc;

use crate::config::{ConfigError, NodeConfig, NodeError};

mod group;
mod recovery;
mod watch;

/// Events waiting to be pushed; a leader that falls further behind drops events (nodes
/// resync when a heartbeat shows them behind).
pub const EVENTS_PENDING_MAX: usize = 4096;
/// How long one event push to one node may wait for queue space or a connection.
const EVENT_SEND_TIMEOUT: Duration = Duration::from_millis(500);
/// Timeout of a request this superpeer forwards to the leader.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// How to run one superpeer.
#[derive(Debug, Clone)]
pub struct SuperpeerConfig {
    /// This superpeer's ID (one of `members`).
    pub id: NodeId,
    /// Where it listens (port 0 is allowed only when the address in `members` does not
    /// matter, e.g. a single-member test group).
    pub listen: SocketAddr,
    /// Every superpeer of the group: ID (= Raft member ID) and address.
    pub members: Vec<(NodeId, SocketAddr)>,
    /// Directory of the Raft log and snapshot (created if missing, locked while running).
    pub data_dir: PathBuf,
    /// The cluster secret of the messaging layer.
    pub secret: Vec<u8>,
    /// Raft election timeout range.
    pub election_timeout_ms: Range<u64>,
    /// Raft leader heartbeat interval.
    pub raft_heartbeat_ms: u64,
    /// Deadline of a Raft write or linearizable read.
    pub raft_request_timeout_ms: u64,
    /// Raft snapshot every this many entries (0: never).
    pub snapshot_every_entries: u64,
    /// Failure detection: ping interval.
    pub heartbeat_interval_ms: u64,
    /// Failure detection: silence before a verdict.
    pub failure_timeout_ms: u64,
    /// Recovery: how long a zone without a live backup waits for one to come back before
    /// it is declared lost.
    pub recovery_backup_wait_ms: u64,
    /// Handler threads of the endpoint.
    pub handler_threads: usize,
    /// Worker threads of the superpeer's runtime (I/O, Raft, request tasks).
    pub io_threads: usize,
    /// Join a running group (added by its leader with `AddSuperpeer`) instead of forming
    /// one from `members`; see `myriad_raft::RaftConfig::join_existing`.
    pub join_existing: bool,
    /// TLS for every connection (`None`: plain TCP); see `myriad_net::tls`.
    pub tls: Option<myriad_net::TlsConfig>,
}

impl SuperpeerConfig {
    /// A configuration with the defaults of [`NodeConfig`], hence no secret: set `secret`
    /// before starting (an empty one is refused).
    pub fn new(
        id: NodeId,
        listen: SocketAddr,
        members: Vec<(NodeId, SocketAddr)>,
        data_dir: impl Into<PathBuf>,
    ) -> SuperpeerConfig {
        let defaults = NodeConfig::default();
        SuperpeerConfig {
            id,
            listen,
            members,
            data_dir: data_dir.into(),
            secret: defaults.secret.into_bytes(),
            election_timeout_ms: defaults.superpeer.election_timeout_min_ms
                ..defaults.superpeer.election_timeout_max_ms,
            raft_heartbeat_ms: defaults.superpeer.raft_heartbeat_ms,
            raft_request_timeout_ms: defaults.superpeer.request_timeout_ms,
            snapshot_every_entries: defaults.superpeer.snapshot_every_entries,
            heartbeat_interval_ms: defaults.failure.heartbeat_interval_ms,
            failure_timeout_ms: defaults.failure.failure_timeout_ms,
            recovery_backup_wait_ms: defaults.failure.recovery_backup_wait_ms,
            handler_threads: 2,
            io_threads: 2,
            join_existing: false,
            tls: None,
        }
    }

    /// The superpeer settings of a validated [`NodeConfig`].
    pub fn from_node_config(config: &NodeConfig) -> Result<SuperpeerConfig, ConfigError> {
        config.validate_superpeer()?;
        let listen = config.superpeer_listen().ok_or_else(|| {
            ConfigError::Invalid("superpeer.id is not among the superpeers".to_owned())
        })?;
        let section = &config.superpeer;
        Ok(SuperpeerConfig {
            id: NodeId(section.id),
            listen,
            members: config.superpeer_list(),
            data_dir: config.data_dir.clone(),
            secret: config.secret.clone().into_bytes(),
            election_timeout_ms: section.election_timeout_min_ms..section.election_timeout_max_ms,
            raft_heartbeat_ms: section.raft_heartbeat_ms,
            raft_request_timeout_ms: section.request_timeout_ms,
            snapshot_every_entries: section.snapshot_every_entries,
            heartbeat_interval_ms: config.failure.heartbeat_interval_ms,
            failure_timeout_ms: config.failure.failure_timeout_ms,
            recovery_backup_wait_ms: config.failure.recovery_backup_wait_ms,
            handler_threads: 2,
            io_threads: 2,
            join_existing: false,
            tls: config.tls_config()?,
        })
    }
}

/// The exclusive lock on a data directory, released when dropped.
#[derive(Debug)]
struct DirLock {
    _file: File,
}

impl DirLock {
    fn acquire(dir: &Path) -> Result<DirLock, NodeError> {
        std::fs::create_dir_all(dir).map_err(|source| NodeError::Io {
            what: format!("create data directory {}", dir.display()),
            source,
        })?;
        let path = dir.join("LOCK");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| NodeError::Io {
                what: format!("open lock file {}", path.display()),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(NodeError::DataDirLocked(dir.to_owned())),
            Err(std::fs::TryLockError::Error(source)) => Err(NodeError::Io {
                what: format!("lock {}", path.display()),
                source,
            }),
        }
    }
}

/// Carries Raft RPCs as [`types::RAFT_RPC`] requests.
struct NetTransport {
    net: NetHandle,
}

impl RaftTransport for NetTransport {
    async fn call(
        &self,
        target: u64,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let Ok(node) = u16::try_from(target) else {
            return Err(TransportError::Unreachable {
                target,
                reason: "not a node ID".to_owned(),
            });
        };
        match self
            .net
            .request(NodeId(node), types::RAFT_RPC, Bytes::from(request), timeout)
            .await
        {
            Ok(reply) => Ok(reply.to_vec()),
            Err(NetError::Timeout(_)) => Err(TransportError::Timeout {
                target,
                timeout_ms: timeout.as_millis() as u64,
            }),
            Err(error) => Err(TransportError::Unreachable {
                target,
                reason: error.to_string(),
            }),
        }
    }
}

/// What the handlers, the event pump and the watcher share.
pub(crate) struct Core {
    id: NodeId,
    /// The group: the configured superpeers, then kept in step with the Raft membership
    /// (`group::follow_membership`), so superpeers added at runtime are members too.
    members: parking_lot::RwLock<Vec<(NodeId, SocketAddr)>>,
    net: NetHandle,
    /// Whether the endpoint runs TLS (then a join's role must match its certificate's).
    tls: bool,
    raft: OnceLock<MetaRaft>,
    /// Every configured superpeer is in the committed node table (permanent once true).
    registered: AtomicBool,
    registering: tokio::sync::Mutex<()>,
    events: mpsc::Sender<EventPush>,
    /// Log index of the blank entry that began this superpeer's current leadership
    /// (`u64::MAX` while it does not lead): only commands applied after it are its to
    /// announce.
    leading_from: AtomicU64,
    heartbeat_interval: Duration,
    failure_timeout: Duration,
    backup_wait: Duration,
    stopping: AtomicBool,
    /// The zone recoveries this superpeer coordinated as leader.
    recoveries: recovery::Recoveries,
}

/// One running superpeer. Call [`Superpeer::shutdown`] (or drop it) from a thread that
/// runs no async tasks.
pub struct Superpeer {
    core: Arc<Core>,
    shutdown_requested: Arc<AtomicBool>,
    endpoint: Option<Endpoint>,
    runtime: Option<tokio::runtime::Runtime>,
    _lock: DirLock,
}

impl std::fmt::Debug for Superpeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Superpeer")
            .field("id", &self.core.id)
            .field("address", &self.core.net.local_addr())
            .finish()
    }
}

impl Superpeer {
    /// Locks the data directory, starts the endpoint and the Raft member, and begins
    /// serving. Returns once requests are served (a leader may not be elected yet).
    pub fn start(config: SuperpeerConfig) -> Result<Superpeer, NodeError> {
        if !config.members.iter().any(|(id, _)| *id == config.id) {
            return Err(ConfigError::Invalid(format!(
                "superpeer {} is not among the members",
                config.id
            ))
            .into());
        }
        let lock = DirLock::acquire(&config.data_dir)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.io_threads.max(2))
            .thread_name(format!("myriad-superpeer-{}", config.id.0))
            .enable_all()
            .build()
            .map_err(|source| NodeError::Io {
                what: "start the runtime".to_owned(),
                source,
            })?;
        let mut net_config =
            myriad_net::Config::new(config.id, config.listen, config.secret.clone());
        net_config.handler_threads = config.handler_threads.max(1);
        net_config.tls = config.tls.clone();
        let slot: Arc<OnceLock<Arc<Core>>> = Arc::new(OnceLock::new());
        let members: Vec<NodeId> = config.members.iter().map(|(id, _)| *id).collect();
        let shutdown_requested = Arc::new(AtomicBool::new(false));
        let handlers = handlers(&slot, &members, &shutdown_requested)?;
        let endpoint = Endpoint::start_on(runtime.handle().clone(), net_config, handlers)?;
        let net = endpoint.handle();
        for (id, address) in &config.members {
            if *id != config.id {
                net.set_address(*id, *address);
            }
        }
        let (events, pending) = mpsc::channel(EVENTS_PENDING_MAX);
        let core = Arc::new(Core {
            id: config.id,
            members: parking_lot::RwLock::new(config.members.clone()),
            net: net.clone(),
            tls: config.tls.is_some(),
            raft: OnceLock::new(),
            registered: AtomicBool::new(false),
            registering: tokio::sync::Mutex::new(()),
            events,
            leading_from: AtomicU64::new(u64::MAX),
            heartbeat_interval: Duration::from_millis(config.heartbeat_interval_ms.max(1)),
            failure_timeout: Duration::from_millis(config.failure_timeout_ms.max(1)),
            backup_wait: Duration::from_millis(config.recovery_backup_wait_ms),
            stopping: AtomicBool::new(false),
            recoveries: recovery::Recoveries::default(),
        });
        let mut raft_config = RaftConfig::new(
            u64::from(config.id.0),
            config.data_dir.join("raft"),
            config
                .members
                .iter()
                .map(|(id, address)| (u64::from(id.0), address.to_string()))
                .collect(),
        );
        raft_config.election_timeout_ms = config.election_timeout_ms.clone();
        raft_config.heartbeat_ms = config.raft_heartbeat_ms;
        raft_config.request_timeout_ms = config.raft_request_timeout_ms;
        raft_config.snapshot_every_entries = config.snapshot_every_entries;
        raft_config.join_existing = config.join_existing;
        // Events are announced from the applied log, so they go out in commit order.
        let weak = Arc::downgrade(&core);
        let observer: myriad_raft::ApplyObserver = Arc::new(
            move |index, command: Option<&Command>, response: &Response, state: &MetaState| {
                if let Some(core) = weak.upgrade() {
                    core.on_applied(index, command, response, state);
                }
            },
        );
        let raft = runtime
            .block_on(MetaRaft::start_observed(
                raft_config,
                NetTransport { net: net.clone() },
                Some(observer),
            ))
            .map_err(|error| NodeError::Raft(error.to_string()))?;
        // Set once here, before any handler can see the core.
        let _ = core.raft.set(raft);
        let _ = slot.set(core.clone());
        // TLS: a node's certificate must name the role the group or the node table gives
        // it (a node not in the table yet, a joining one, may connect as anything; its
        // join is checked against its certificate, `on_join`).
        let weak = Arc::downgrade(&core);
        net.check_roles(move |node, role| {
            weak.upgrade()
                .is_none_or(|core| certificate_fits(core.recorded_role(node), role))
        });
        runtime.spawn(event_pump(core.clone(), pending));
        runtime.spawn(watch::run(core.clone()));
        runtime.spawn(registration_loop(core.clone()));
        runtime.spawn(recovery::run(core.clone()));
        runtime.spawn(group::follow_membership(core.clone()));
        tracing::info!(id = %config.id, address = %net.local_addr(), "superpeer serving");
        Ok(Superpeer {
            core,
            shutdown_requested,
            endpoint: Some(endpoint),
            runtime: Some(runtime),
            _lock: lock,
        })
    }

    /// Whether an operator asked this superpeer to stop ([`types::NODE_SHUTDOWN`], sent
    /// by `myriad term`'s `nodeshutdown` after the superpeer left the Raft group); the
    /// process polls it and then stops as on SIGTERM.
    pub fn shutdown_requested(&self) -> bool {
        self.shutdown_requested.load(Ordering::Acquire)
    }

    /// This superpeer's node ID.
    pub fn node_id(&self) -> NodeId {
        self.core.id
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.core.net.local_addr()
    }

    /// Whether it leads the group right now.
    pub fn is_leader(&self) -> bool {
        self.core.raft().is_some_and(MetaRaft::is_leader)
    }

    /// The leader as far as it knows.
    pub fn leader(&self) -> Option<NodeId> {
        self.core.leader()
    }

    /// A summary of its Raft metrics.
    pub fn raft_metrics(&self) -> Option<RaftSummary> {
        self.core.raft().map(MetaRaft::metrics)
    }

    /// The cluster epoch in its applied state.
    pub fn epoch(&self) -> u64 {
        self.core
            .raft()
            .map_or(0, |raft| raft.read_local(MetaState::epoch))
    }

    /// Its Raft member (for tests and tools).
    pub fn raft(&self) -> Option<&MetaRaft> {
        self.core.raft()
    }

    /// The zone recoveries it coordinated as leader (what `RECOVERY_STATUS` answers).
    pub fn recovery_status(&self) -> myriad_proto::recovery::RecoveryStatusReply {
        self.core.recovery_status()
    }

    /// The routes of its HTTP endpoint: `/metrics` and the status page.
    pub fn http_routes(&self) -> Arc<crate::ops::superpeer_metrics::SuperpeerRoutes> {
        Arc::new(crate::ops::superpeer_metrics::SuperpeerRoutes::new(
            Arc::clone(&self.core),
        ))
    }

    /// Its messaging handle.
    pub fn net(&self) -> &NetHandle {
        &self.core.net
    }

    /// Stops serving: Raft shuts down, the endpoint closes, the directory is unlocked.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.core.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::info!(id = %self.core.id, "superpeer shutting down");
        // Inside an async context nothing may block: Raft is then left to stop with the
        // runtime (its log is durable after every acknowledged append anyway).
        let blocking_allowed = tokio::runtime::Handle::try_current().is_err();
        if let (Some(runtime), Some(raft)) = (&self.runtime, self.core.raft()) {
            if blocking_allowed {
                runtime.block_on(raft.shutdown());
            }
        }
        self.endpoint.take();
        if let Some(runtime) = self.runtime.take() {
            if blocking_allowed {
                runtime.shutdown_timeout(Duration::from_secs(2));
            } else {
                runtime.shutdown_background();
            }
        }
    }
}

impl Drop for Superpeer {
    fn drop(&mut self) {
        self.stop();
    }
}

// ----- handlers ----------------------------------------------------------------------------

/// Registers every type a superpeer receives. Each handler hands its work to a task.
/// Raft RPCs, events and barrier releases are only accepted from the group's `members`
/// (anyone else's connection is closed: roles, see `docs/security.md`).
/// [`types::NODE_SHUTDOWN`] (an operator's clean stop) sets `shutdown_requested`; it is
/// refused from nodes known as peers or superpeers.
fn handlers(
    slot: &Arc<OnceLock<Arc<Core>>>,
    members: &[NodeId],
    shutdown_requested: &Arc<AtomicBool>,
) -> Result<Handlers, NodeError> {
    let mut handlers = Handlers::new();
    let with_core = |slot: &Arc<OnceLock<Arc<Core>>>,
                     serve: fn(Arc<Core>, Incoming)|
     -> Box<dyn Fn(Incoming) + Send + Sync> {
        let slot = slot.clone();
        Box::new(move |message: Incoming| {
            if let Some(core) = slot.get() {
                serve(core.clone(), message);
            }
        })
    };
    let rpc = with_core(slot, Core::on_raft_rpc);
    handlers.register(types::RAFT_RPC, move |message: Incoming| rpc(message))?;
    let meta = with_core(slot, Core::on_meta_request);
    handlers.register(types::META_REQUEST, move |message: Incoming| meta(message))?;
    let join = with_core(slot, Core::on_join);
    handlers.register(types::JOIN, move |message: Incoming| join(message))?;
    let report = with_core(slot, Core::on_failure_report);
    handlers.register(types::FAILURE_REPORT, move |message: Incoming| {
        report(message)
    })?;
    let heartbeat_slot = slot.clone();
    handlers.register_inline(types::HEARTBEAT, move |message: Incoming| {
        let epoch = heartbeat_slot
            .get()
            .and_then(|core| core.raft())
            .map_or(0, |raft| raft.read_local(MetaState::epoch));
        let _ = message.respond(HeartbeatReply { epoch, nonce: 0 }.encode());
    })?;
    let status_slot = slot.clone();
    handlers.register(types::RECOVERY_STATUS, move |incoming: Incoming| {
        let reply = match status_slot.get() {
            Some(core) => core
                .recoveries
                .status(core.raft().is_some_and(MetaRaft::is_leader)),
            None => myriad_proto::recovery::RecoveryStatusReply::default(),
        };
        if incoming.is_request() {
            let _ = incoming.respond(reply.encode());
        }
    })?;
    // Peers' monitoring summaries (DXMonitor), kept here for `monitoring` queries.
    Arc::new(crate::ops::monitor::MonitorStore::default()).register(&mut handlers)?;
    // Reports from any node not known as a client (a peer that joined a moment ago may
    // report before its join is applied here).
    let monitor_slot = slot.clone();
    handlers.restrict(types::MONITOR_REPORT, move |from| {
        monitor_slot
            .get()
            .and_then(|core| core.raft())
            .is_none_or(|raft| {
                raft.read_local(|state| {
                    state
                        .node(from)
                        .is_none_or(|record| record.role != Role::Client)
                })
            })
    })?;
    // An operator's clean stop (`nodeshutdown`): the terminal has the superpeer leave the
    // Raft group first; the process polls the flag and stops as on SIGTERM.
    let flag = Arc::clone(shutdown_requested);
    handlers.register(types::NODE_SHUTDOWN, move |incoming: Incoming| {
        tracing::info!(from = %incoming.from, "shutdown requested");
        flag.store(true, Ordering::Release);
        if incoming.is_request() {
            let _ = incoming.respond(Bytes::new());
        }
    })?;
    // Not from peers or superpeers (they never send it). A client unknown here is let
    // through: a superpeer that just left the group may not have applied its join.
    let shutdown_slot = slot.clone();
    handlers.restrict(types::NODE_SHUTDOWN, move |from| {
        shutdown_slot
            .get()
            .and_then(|core| core.raft())
            .is_none_or(|raft| {
                raft.read_local(|state| {
                    state
                        .node(from)
                        .is_none_or(|record| record.role == Role::Client)
                })
            })
    })?;
    // `loggerlevel` (a superpeer keeps no backups: `loginfo` says so).
    crate::ops::log_control::register(&mut handlers, None)?;
    // Other superpeers' leaders push events here too; the applied state already has them.
    handlers.register(types::EVENT, |_message: Incoming| {})?;
    handlers.register(types::BARRIER_RELEASED, |_message: Incoming| {})?;
    // The configured members, and once the core runs, those the Raft membership added.
    let members: Arc<[NodeId]> = members.into();
    for message_type in [types::RAFT_RPC, types::EVENT, types::BARRIER_RELEASED] {
        let members = Arc::clone(&members);
        let slot = slot.clone();
        handlers.restrict(message_type, move |from| {
            members.contains(&from) || slot.get().is_some_and(|core| core.is_member(from))
        })?;
    }
    Ok(handlers)
}

fn unavailable_write(error: RaftWriteError) -> MetaReply {
    match error {
        RaftWriteError::ForwardToLeader { leader } => MetaReply::NotLeader {
            leader: leader.and_then(to_node),
        },
        RaftWriteError::NoQuorum => {
            MetaReply::Unavailable("no quorum: the leader has no recent quorum".to_owned())
        }
        RaftWriteError::TooLarge { bytes } => MetaReply::Response(Response::Error(
            MetaError::InvalidArgument(format!("command of {bytes} bytes is too large")),
        )),
        RaftWriteError::OutcomeUnknown { reason, .. } => {
            MetaReply::Unavailable(format!("outcome unknown: {reason}"))
        }
        RaftWriteError::Stopped(reason) => MetaReply::Unavailable(format!("stopped: {reason}")),
    }
}

fn unavailable_read(error: RaftReadError) -> MetaReply {
    match error {
        RaftReadError::ForwardToLeader { leader } => MetaReply::NotLeader {
            leader: leader.and_then(to_node),
        },
        RaftReadError::NoQuorum(reason) => MetaReply::Unavailable(format!("no quorum: {reason}")),
        RaftReadError::Stopped(reason) => MetaReply::Unavailable(format!("stopped: {reason}")),
    }
}

fn to_node(id: u64) -> Option<NodeId> {
    u16::try_from(id).ok().map(NodeId)
}

/// Answers a read request from a state.
fn read_reply(state: &MetaState, request: &MetaRequest) -> MetaReply {
    match request {
        MetaRequest::Lookup(cid) => MetaReply::Lookup(state.lookup(*cid)),
        MetaRequest::LookupTree(creator) => MetaReply::LookupTree(
            state
                .lookup_tree(*creator)
                .map(|tree| tree.exceptions().collect())
                .unwrap_or_default(),
        ),
        MetaRequest::NameGet(name) => MetaReply::Name(state.name_get(name)),
        MetaRequest::NameList => MetaReply::Names(
            state
                .names()
                .map(|(name, cid)| (name.to_owned(), cid))
                .collect(),
        ),
        MetaRequest::TmpGet(name) => MetaReply::Tmp(state.tmp_get(name).map(<[u8]>::to_vec)),
        MetaRequest::TmpList => MetaReply::TmpList(
            state
                .tmp_list()
                .map(|(name, size)| (name.to_owned(), size as u64))
                .collect(),
        ),
        MetaRequest::BarrierStatus(id) => {
            MetaReply::Barrier(state.barrier(*id).map(|barrier| BarrierStatus {
                size: barrier.size,
                round: barrier.round,
                signed: barrier.signed.len() as u32,
                last_released: barrier.last_released.clone(),
            }))
        }
        MetaRequest::Nodes => MetaReply::Nodes(state.nodes().cloned().collect()),
        MetaRequest::Bases(node) => MetaReply::Bases(state.bases(*node)),
        MetaRequest::ZonesDue(owner) => MetaReply::Zones(
            state
                .zones_of(*owner)
                .filter(|(zone, _)| !state.zone_settled(*owner, *zone))
                .map(|(zone, backups)| (zone, backups.to_vec()))
                .collect(),
        ),
        MetaRequest::Zones(owner) => MetaReply::Zones(
            state
                .zones_of(*owner)
                .map(|(zone, backups)| (zone, backups.to_vec()))
                .collect(),
        ),
        MetaRequest::Write(_)
        | MetaRequest::Status
        | MetaRequest::AddSuperpeer { .. }
        | MetaRequest::RemoveSuperpeer(_) => {
            MetaReply::Unavailable("stopped: not a read request".to_owned())
        }
    }
}

fn respond(responder: Option<Responder>, payload: Bytes) {
    if let Some(responder) = responder {
        if let Err(error) = responder.respond(payload) {
            tracing::debug!(%error, "response not sent");
        }
    }
}

impl Core {
    pub(crate) fn raft(&self) -> Option<&MetaRaft> {
        self.raft.get()
    }

    pub(crate) fn leader(&self) -> Option<NodeId> {
        self.raft().and_then(MetaRaft::leader).and_then(to_node)
    }

    /// Its messaging handle.
    pub(crate) fn net(&self) -> &NetHandle {
        &self.net
    }

    /// Its table of zone recoveries (coordinated while it led).
    pub(crate) fn recovery_status(&self) -> myriad_proto::recovery::RecoveryStatusReply {
        self.recoveries
            .status(self.raft().is_some_and(MetaRaft::is_leader))
    }

    pub(crate) fn is_member(&self, node: NodeId) -> bool {
        self.members.read().iter().any(|(id, _)| *id == node)
    }

    /// The role the group (members are superpeers) or the node table records for `node`.
    fn recorded_role(&self, node: NodeId) -> Option<Role> {
        if self.is_member(node) {
            return Some(Role::Superpeer);
        }
        self.raft()
            .and_then(|raft| raft.read_local(|state| state.node(node).map(|record| record.role)))
    }

    fn on_raft_rpc(core: Arc<Core>, mut message: Incoming) {
        let responder = message.take_responder();
        let payload = message.payload;
        let runtime = core.net.runtime();
        runtime.spawn(async move {
            if let Some(raft) = core.raft() {
                let reply = raft.handle_rpc(&payload).await;
                respond(responder, Bytes::from(reply));
            }
        });
    }

    fn on_meta_request(core: Arc<Core>, mut message: Incoming) {
        let responder = message.take_responder();
        let request = match MetaRequest::decode(message.payload) {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(from = %message.from, %error, "bad metadata request");
                respond(
                    responder,
                    MetaReply::Response(Response::Error(MetaError::InvalidArgument(format!(
                        "undecodable request: {error}"
                    ))))
                    .encode(),
                );
                return;
            }
        };
        if let MetaRequest::Write(command) = &request {
            if !core.may_write(message.from, command) {
                tracing::warn!(from = %message.from, "a client's internal metadata command refused");
                respond(
                    responder,
                    MetaReply::Response(Response::Error(MetaError::InvalidArgument(
                        "clients may not commit this command (roles, see docs/security.md)"
                            .to_owned(),
                    )))
                    .encode(),
                );
                return;
            }
        }
        let runtime = core.net.runtime();
        runtime.spawn(async move {
            let reply = core.serve(request).await;
            respond(responder, reply.encode());
        });
    }

    /// Whether `from` may commit `command`: a node known as a client only the commands
    /// of the client API (names, barriers, temporary storage, its own leave); the
    /// cluster-internal ones (failure verdicts, ownership, zones, ID reservations) come
    /// from peers and superpeers only. A node not known (yet) is let through, as for
    /// replication (see `docs/security.md`).
    fn may_write(&self, from: NodeId, command: &Command) -> bool {
        let Some(raft) = self.raft() else {
            return true;
        };
        let is_client = raft.read_local(|state: &MetaState| {
            state
                .node(from)
                .is_some_and(|record| record.role == Role::Client)
        });
        if !is_client {
            return true;
        }
        match command {
            Command::Leave { node } => *node == from,
            Command::NameRegister { .. }
            | Command::NameRemove { .. }
            | Command::BarrierAlloc { .. }
            | Command::BarrierSignOn { .. }
            | Command::BarrierResize { .. }
            | Command::BarrierFree { .. }
            | Command::TmpPut { .. }
            | Command::TmpRemove { .. }
            // An operator's (the terminal's) release of a gone peer's ID.
            | Command::ReleaseId { .. } => true,
            _ => false,
        }
    }

    /// Serves one metadata request (the leader executes; others answer `NotLeader`).
    pub(crate) async fn serve(self: &Arc<Self>, request: MetaRequest) -> MetaReply {
        let Some(raft) = self.raft() else {
            return MetaReply::Unavailable("stopped: Raft not started".to_owned());
        };
        match request {
            MetaRequest::Status => {
                // The member list as of now, not as of the last follow tick: a command
                // that just changed the group asks right after.
                self.adopt_group(&raft.group());
                let metrics = raft.metrics();
                MetaReply::Status(StatusReply {
                    node: self.id,
                    epoch: raft.read_local(MetaState::epoch),
                    leader: metrics.leader.and_then(to_node),
                    term: metrics.term,
                    last_log_index: metrics.last_log_index,
                    last_applied_index: metrics.last_applied_index,
                    members: self
                        .members()
                        .iter()
                        .map(|(id, address)| (*id, address.to_string()))
                        .collect(),
                })
            }
            MetaRequest::AddSuperpeer { id, address } => self.add_superpeer(id, address).await,
            MetaRequest::RemoveSuperpeer(id) => self.remove_superpeer(id).await,
            MetaRequest::Write(command) => self.execute_write(command).await,
            read => match raft
                .read_linearizable(|state| read_reply(state, &read))
                .await
            {
                Ok(reply) => reply,
                Err(error) => unavailable_read(error),
            },
        }
    }

    /// Commits `command` on this superpeer (the leader), then pushes the events and
    /// barrier releases it caused.
    async fn execute_write(self: &Arc<Self>, command: Command) -> MetaReply {
        let Some(raft) = self.raft() else {
            return MetaReply::Unavailable("stopped: Raft not started".to_owned());
        };
        if !raft.is_leader() {
            return MetaReply::NotLeader {
                leader: self.leader(),
            };
        }
        if let Command::Join { role, reclaim, .. } = &command {
            if *role != Role::Superpeer || reclaim.is_none_or(|id| !self.is_member(id)) {
                if let Err(reply) = self.ensure_registered().await {
                    return reply;
                }
            }
        }
        match raft.write(command.clone()).await {
            Ok(response) => {
                self.after_commit(&command, &response).await;
                MetaReply::Response(response)
            }
            Err(error) => unavailable_write(error),
        }
    }

    /// Events and barrier releases for a committed command.
    async fn after_commit(self: &Arc<Self>, command: &Command, response: &Response) {
        match (command, response) {
            (Command::Join { .. }, Response::Joined { id, .. }) => {
                // A peer's new incarnation (it restarted with its data directory): the
                // zones of the old one are due for recovery now.
                let restarted = self.raft().is_some_and(|raft| {
                    raft.read_local(|state| {
                        state
                            .node(*id)
                            .is_some_and(|record| record.role == Role::Peer)
                            && state.bases(*id).lid_base > 0
                    })
                });
                if restarted {
                    recovery::scan(self);
                }
            }
            (Command::Fail { node, .. }, Response::Epoch(epoch)) => {
                tracing::warn!(superpeer = %self.id, %node, epoch, "failure verdict committed");
                self.recoveries.failure_committed();
                recovery::scan(self);
            }
            (
                Command::BarrierSignOn { id, .. } | Command::BarrierResize { id, .. },
                Response::Barrier(outcome),
            ) => {
                if let Some(values) = &outcome.released {
                    self.release_barrier(*id, outcome.round, values.clone());
                }
            }
            _ => {}
        }
    }

    /// Called by the state machine for every applied entry, in log order, on every
    /// superpeer: fences failed nodes (and unfences rejoined ones), and the leader queues
    /// the event of each command it applied during its leadership for the event pump. (Events of a leader that died before pushing them
    /// are not repeated; nodes catch up through their heartbeats' epochs.)
    fn on_applied(
        &self,
        index: u64,
        command: Option<&Command>,
        response: &Response,
        state: &MetaState,
    ) {
        // Every superpeer fences a node from the verdict on, so that a node that was only
        // slow or partitioned cannot change metadata through any of them; a new
        // incarnation (a join) lifts the fence.
        match (command, response) {
            (Some(Command::Fail { node, .. }), Response::Epoch(_)) => self.net.fence(*node),
            (Some(Command::Join { .. }), Response::Joined { id, .. }) => {
                self.net.unfence(*id);
            }
            _ => {}
        }
        let leading = self.raft().is_some_and(MetaRaft::is_leader);
        let Some(command) = command else {
            // A blank entry begins a leader's term.
            let from = if leading { index } else { u64::MAX };
            self.leading_from.store(from, Ordering::Release);
            return;
        };
        if !leading || index <= self.leading_from.load(Ordering::Acquire) {
            return;
        }
        for push in event_of(command, response, state) {
            if self.events.try_send(push).is_err() {
                tracing::warn!("event queue full; nodes will resync from heartbeats");
            }
        }
    }

    fn release_barrier(self: &Arc<Self>, id: u32, round: u64, values: Vec<(NodeId, u64)>) {
        let payload = BarrierReleased {
            id,
            round,
            values: values.clone(),
        }
        .encode();
        for (node, _) in values {
            let core = self.clone();
            let payload = payload.clone();
            self.net.runtime().spawn(async move {
                core.sync_address(node);
                let send = core.net.send(node, types::BARRIER_RELEASED, payload);
                if let Ok(Err(error)) = tokio::time::timeout(EVENT_SEND_TIMEOUT, send).await {
                    tracing::debug!(%node, %error, "barrier release not sent");
                }
            });
        }
    }

    /// Sets the messaging address of `node` from the applied node table.
    pub(crate) fn sync_address(&self, node: NodeId) {
        if node == self.id || self.is_member(node) {
            return;
        }
        let Some(raft) = self.raft() else {
            return;
        };
        let address =
            raft.read_local(|state| state.node(node).map(|record| record.address.clone()));
        if let Some(address) = address.and_then(|address| address.parse::<SocketAddr>().ok()) {
            if self.net.address(node) != Some(address) {
                self.net.set_address(node, address);
            }
        }
    }

    /// Registers every configured superpeer in the node table (leader only), once.
    async fn ensure_registered(&self) -> Result<(), MetaReply> {
        if self.registered.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(raft) = self.raft() else {
            return Err(MetaReply::Unavailable(
                "stopped: Raft not started".to_owned(),
            ));
        };
        let _guard = self.registering.lock().await;
        if self.registered.load(Ordering::Acquire) {
            return Ok(());
        }
        let members = self.members();
        let missing: Vec<(NodeId, SocketAddr)> = raft
            .read_linearizable(|state| {
                members
                    .iter()
                    .filter(|(id, _)| {
                        state
                            .node(*id)
                            .is_none_or(|record| record.role != Role::Superpeer)
                    })
                    .copied()
                    .collect()
            })
            .await
            .map_err(unavailable_read)?;
        for (id, address) in missing {
            let command = Command::Join {
                role: Role::Superpeer,
                address: address.to_string(),
                capabilities: myriad_meta::Capabilities::default(),
                rack: 0,
                switch: 0,
                reclaim: Some(id),
            };
            match raft.write(command).await {
                Ok(Response::Joined { .. }) => {
                    tracing::info!(superpeer = %id, "superpeer registered in the node table")
                }
                Ok(other) => {
                    tracing::error!(superpeer = %id, ?other, "superpeer registration refused");
                    return Err(MetaReply::Unavailable(format!(
                        "stopped: superpeer {id} cannot be registered: {other:?}"
                    )));
                }
                Err(error) => return Err(unavailable_write(error)),
            }
        }
        self.registered.store(true, Ordering::Release);
        Ok(())
    }

    fn on_join(core: Arc<Core>, mut message: Incoming) {
        let responder = message.take_responder();
        let from = message.from;
        let cert = message.cert_role();
        let request = match JoinRequest::decode(message.payload) {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(%from, %error, "bad join request");
                respond(
                    responder,
                    JoinReply::Refused(MetaError::InvalidArgument(format!(
                        "undecodable join: {error}"
                    )))
                    .encode(),
                );
                return;
            }
        };
        // TLS: the role a node joins as is the one its certificate names.
        if core.tls && cert != Some(cert_role_of(request.role)) {
            let presented = cert.map_or("role-less", CertRole::name);
            tracing::warn!(%from, role = ?request.role, presented, "join refused: certificate of another role");
            respond(
                responder,
                JoinReply::Refused(MetaError::InvalidArgument(format!(
                    "a {presented} certificate cannot join as a {}",
                    cert_role_of(request.role).name()
                )))
                .encode(),
            );
            return;
        }
        let runtime = core.net.runtime();
        runtime.spawn(async move {
            let reply = core.serve_join(request).await;
            respond(responder, reply.encode());
        });
    }

    async fn serve_join(self: &Arc<Self>, request: JoinRequest) -> JoinReply {
        if request.role == Role::Superpeer {
            return JoinReply::Refused(MetaError::InvalidArgument(
                "superpeers are configured, they do not join".to_owned(),
            ));
        }
        match self.execute_write(request.to_command()).await {
            MetaReply::Response(Response::Joined {
                id,
                incarnation,
                epoch,
            }) => {
                let nodes = self
                    .raft()
                    .map(|raft| raft.read_local(|state| state.nodes().cloned().collect()))
                    .unwrap_or_default();
                tracing::info!(superpeer = %self.id, node = %id, incarnation, role = ?request.role, address = %request.address, "node joined");
                JoinReply::Ok {
                    id,
                    incarnation,
                    epoch,
                    nodes,
                    lease_ms: self.lease_ms(),
                }
            }
            MetaReply::Response(Response::Error(error)) => JoinReply::Refused(error),
            MetaReply::NotLeader { leader } => JoinReply::NotLeader { leader },
            MetaReply::Unavailable(reason) => JoinReply::Unavailable(reason),
            other => JoinReply::Unavailable(format!("stopped: unexpected outcome {other:?}")),
        }
    }

    fn on_failure_report(core: Arc<Core>, message: Incoming) {
        let report = match FailureReport::decode(message.payload) {
            Ok(report) => report,
            Err(error) => {
                tracing::warn!(from = %message.from, %error, "bad failure report");
                return;
            }
        };
        tracing::info!(superpeer = %core.id, reporter = %message.from, node = %report.node, "failure report");
        let runtime = core.net.runtime();
        runtime.spawn(async move {
            core.check_node(report.node, "reported unreachable").await;
        });
    }

    /// Pings `node` at once and commits `Fail` if nothing listens at its address any more
    /// (connection refused: the process is gone). Any other failure (a timeout, a reset)
    /// is left to the watcher's silence rule: the node may be alive and hold a lease.
    pub(crate) async fn check_node(self: &Arc<Self>, node: NodeId, why: &str) {
        let Some(raft) = self.raft() else {
            return;
        };
        let incarnation = |raft: &MetaRaft| {
            raft.read_local(|state| {
                state
                    .node(node)
                    .filter(|record| {
                        record.state == NodeState::Alive && record.role != Role::Superpeer
                    })
                    .map(|record| record.incarnation)
            })
        };
        let Some(checked) = incarnation(raft) else {
            return;
        };
        // A ping racing the teardown of the lost connection can fail with that connection
        // instead of dialing anew: a few attempts, a moment apart.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.ping(node, 0).await {
                Ok(_) => return,
                // Nothing listens at its address: the process is gone.
                Err(PingFailure::Refused) => break,
                Err(PingFailure::Other(_)) if attempt < CHECK_PINGS => {
                    tokio::time::sleep(CHECK_PING_PAUSE).await;
                }
                // It may be alive behind a slow or cut link and hold a lease: only the
                // silence rule may declare it failed (after its lease has ended).
                Err(PingFailure::Other(error)) => {
                    tracing::info!(%node, why, %error, "ping failed; left to the failure timeout");
                    return;
                }
            }
        }
        if incarnation(raft) != Some(checked) {
            // It restarted meanwhile (a new incarnation joined): the report was about the
            // old one, whose zones the join already made due for recovery.
            return;
        }
        self.verdict(node, checked, why).await;
    }

    pub(crate) fn id(&self) -> NodeId {
        self.id
    }

    /// The group's members as this superpeer knows them now.
    pub(crate) fn members(&self) -> Vec<(NodeId, SocketAddr)> {
        self.members.read().clone()
    }

    pub(crate) fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
    }

    pub(crate) fn failure_timeout(&self) -> Duration {
        self.failure_timeout
    }

    /// The lease granted to nodes (see `myriad_proto::meta::Heartbeat`): three quarters of
    /// the failure timeout, so a lease ends at least a quarter of it before a verdict on
    /// silence can commit.
    pub(crate) fn lease_ms(&self) -> u32 {
        u32::try_from(self.failure_timeout.as_millis() * 3 / 4).unwrap_or(u32::MAX)
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// One heartbeat to `node`, acknowledging its reply number `acked` (0: none, which
    /// renews no lease); its reply.
    pub(crate) async fn ping(
        &self,
        node: NodeId,
        acked: u64,
    ) -> Result<HeartbeatReply, PingFailure> {
        self.sync_address(node);
        let epoch = self
            .raft()
            .map_or(0, |raft| raft.read_local(MetaState::epoch));
        let timeout = (self.heartbeat_interval * 2).min(self.failure_timeout);
        let heartbeat = Heartbeat {
            epoch,
            acked,
            lease_ms: self.lease_ms(),
        };
        let reply = self
            .net
            .request(node, types::HEARTBEAT, heartbeat.encode(), timeout)
            .await
            .map_err(|error| match error {
                NetError::ConnectRefused(_) => PingFailure::Refused,
                error => PingFailure::Other(error.to_string()),
            })?;
        HeartbeatReply::decode(reply).map_err(|error| PingFailure::Other(error.to_string()))
    }

    /// Commits the failure verdict on `node`'s `incarnation` (through the leader); whether
    /// the group settled it (committed, or refused because that incarnation is gone
    /// already: failed, left, or replaced by a restart).
    pub(crate) async fn verdict(
        self: &Arc<Self>,
        node: NodeId,
        incarnation: u32,
        why: &str,
    ) -> bool {
        tracing::warn!(superpeer = %self.id, %node, incarnation, why, "failure verdict");
        let command = Command::Fail { node, incarnation };
        for _ in 0..3 {
            let reply = match self.leader() {
                Some(leader) if leader == self.id => self.execute_write(command.clone()).await,
                Some(leader) => {
                    let request = MetaRequest::Write(command.clone()).encode();
                    match self
                        .net
                        .request(leader, types::META_REQUEST, request, FORWARD_TIMEOUT)
                        .await
                    {
                        Ok(bytes) => MetaReply::decode(bytes).unwrap_or_else(|error| {
                            MetaReply::Unavailable(format!("stopped: bad reply: {error}"))
                        }),
                        Err(error) => MetaReply::Unavailable(format!("no quorum: {error}")),
                    }
                }
                None => MetaReply::Unavailable("no quorum: no leader known".to_owned()),
            };
            match reply {
                MetaReply::Response(Response::Epoch(epoch)) => {
                    tracing::info!(%node, epoch, "failure verdict committed by the leader");
                    return true;
                }
                MetaReply::Response(other) => {
                    tracing::info!(%node, ?other, "failure verdict not needed");
                    return true;
                }
                other => {
                    tracing::warn!(%node, ?other, "failure verdict not committed; retrying");
                    tokio::time::sleep(self.heartbeat_interval).await;
                }
            }
        }
        false
    }
}

/// Pings of a node whose connection was lost, before it is left to the silence rule.
const CHECK_PINGS: u32 = 3;
/// The pause between those pings.
const CHECK_PING_PAUSE: Duration = Duration::from_millis(20);

/// Why a heartbeat got no answer.
#[derive(Debug)]
pub(crate) enum PingFailure {
    /// The node's address refused the connection: nothing listens there.
    Refused,
    /// Anything else (timeout, lost connection, bad reply).
    Other(String),
}

/// Registers the superpeers as soon as this superpeer leads a fresh group.
async fn registration_loop(core: Arc<Core>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    while !core.registered.load(Ordering::Acquire) && !core.stopping.load(Ordering::Acquire) {
        ticker.tick().await;
        if core.raft().is_some_and(MetaRaft::is_leader) {
            if let Err(reply) = core.ensure_registered().await {
                tracing::debug!(?reply, "superpeer registration postponed");
            }
        }
    }
}

/// The event a committed command announces, built from the state right after it.
fn event_of(command: &Command, response: &Response, state: &MetaState) -> Vec<EventPush> {
    let (epoch, event) = match (command, response) {
        (_, Response::Error(_)) => return Vec::new(),
        (Command::Join { .. }, Response::Joined { id, epoch, .. }) => {
            let Some(record) = state.node(*id) else {
                return Vec::new();
            };
            let joined = EventPush {
                epoch: *epoch,
                event: Event::NodeJoined(record.clone()),
            };
            let bases = state.bases(*id);
            if record.role != Role::Peer || bases.lid_base == 0 {
                return vec![joined];
            }
            // A peer's new incarnation: the join routed its fresh IDs back to it.
            let reset = EventPush {
                epoch: *epoch,
                event: Event::OwnerChanged {
                    creator: *id,
                    first: bases.lid_base.min(myriad_types::LOCAL_ID_MAX),
                    last: myriad_types::LOCAL_ID_MAX,
                    owner: *id,
                },
            };
            return vec![joined, reset];
        }
        (Command::Leave { node }, Response::Epoch(epoch)) => (*epoch, Event::NodeLeft(*node)),
        (Command::Fail { node, .. }, Response::Epoch(epoch)) => (*epoch, Event::NodeFailed(*node)),
        (
            Command::SetOwner {
                creator,
                first,
                last,
                owner,
            },
            Response::Done,
        ) => (
            state.epoch(),
            Event::OwnerChanged {
                creator: *creator,
                first: *first,
                last: *last,
                owner: *owner,
            },
        ),
        _ => return Vec::new(),
    };
    vec![EventPush { epoch, event }]
}

/// Pushes events in the order they were committed, to every live non-superpeer node and
/// every other superpeer (best effort; one event to all nodes before the next).
async fn event_pump(core: Arc<Core>, mut pending: mpsc::Receiver<EventPush>) {
    while let Some(push) = pending.recv().await {
        let Some(raft) = core.raft() else {
            continue;
        };
        let subject = match push.event {
            Event::NodeFailed(node) => Some(node),
            _ => None,
        };
        let mut targets: Vec<NodeId> = raft.read_local(|state| {
            state
                .nodes()
                .filter(|record| {
                    record.state == NodeState::Alive
                        && record.role != Role::Superpeer
                        && Some(record.id) != subject
                })
                .map(|record| record.id)
                .collect()
        });
        targets.extend(
            core.members()
                .into_iter()
                .map(|(id, _)| id)
                .filter(|id| *id != core.id),
        );
        let payload = push.encode();
        let sends = targets.into_iter().map(|node| {
            core.sync_address(node);
            let send = core.net.send(node, types::EVENT, payload.clone());
            async move {
                if let Ok(Err(error)) = tokio::time::timeout(EVENT_SEND_TIMEOUT, send).await {
                    tracing::debug!(%node, %error, "event not pushed");
                }
            }
        });
        futures_util::future::join_all(sends).await;
    }
}
