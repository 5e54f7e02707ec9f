//! Joining a cluster, the node table, metadata requests to the superpeer group, events.
//!
//! # Job
//! [`Membership::join`] gets a node ID from the superpeer group (asking with a provisional
//! ID in `0xff00..=0xffff`, see `myriad_types::limits`) and starts the node's
//! real messaging endpoint under that ID, with the caller's handlers plus membership's own:
//! pushed events ([`types::EVENT`]), heartbeats ([`types::HEARTBEAT`]) and barrier releases
//! ([`types::BARRIER_RELEASED`]). From then on [`Membership`] keeps the node table (and the
//! messaging layer's addresses and fences) up to date, sends metadata requests to the
//! leader ([`Membership::request`]), reports lost connections to the superpeers and offers
//! the cluster services built on requests (barriers, leave).
//!
//! # Invariants
//! - The node table only moves forward: an event or resync never lowers the known epoch.
//!   A heartbeat or event that shows a gap in epochs triggers a full resync
//!   ([`MetaRequest::Nodes`]). Subscribers hear of every change a resync brings as
//!   events (`table_changes`), as if the pushes they replace had arrived: a push is best
//!   effort, and one lost (or dropped before the node's handlers were installed) left a
//!   peer's zones without backups until the next join.
//! - Failed nodes are fenced in the messaging layer; a new incarnation of the same ID (a
//!   `NodeJoined`) lifts the fence. Superpeers are never fenced (Raft handles them).
//! - Every call ends within its timeout ([`JoinConfig::request_timeout`] for requests).
//! - Handlers never block on the network: replies that need a request (resyncs) run as
//!   tasks on the endpoint's runtime.
//!
//! # Who calls it
//! Clients (through `myriad-client`'s API), peers (`myriad-node` joins with it) and chunk
//! routing (`myriad-client`'s `Directory` trait, implemented with the node-directory
//! methods [`Membership::lookup`], [`Membership::is_alive`] and friends).

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use myriad_meta::{
    Capabilities, Command, LookupRange, MetaError, NodeRecord, NodeState, Response, Role,
};
use myriad_net::{CertRole, CloseReason, Endpoint, Handlers, Incoming, NetError, NetHandle};
use myriad_proto::meta::{
    BarrierReleased, Event, EventPush, FailureReport, Heartbeat, HeartbeatReply, JoinReply,
    JoinRequest, MetaReply, MetaRequest,
};
use myriad_proto::types;
use myriad_types::limits::PROVISIONAL_ID_MIN;
use myriad_types::{ChunkId, NodeId};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{broadcast, Notify};

use crate::lease::Lease;
use crate::MembershipError;

/// Events queued per subscriber before it misses the oldest.
pub const EVENTS_QUEUED_MAX: usize = 1024;
/// Barrier releases remembered for sign-ons still waiting (older ones are dropped).
pub const BARRIER_RELEASES_KEPT_MAX: usize = 256;
/// Pause before trying another superpeer after a failed or refused attempt.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// How often a waiting barrier sign-on polls the barrier's status as a fallback.
const BARRIER_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// How a node joins the cluster. Its `Debug` output never shows the secret.
#[derive(Clone)]
pub struct JoinConfig {
    /// The configured superpeers: ID and address.
    pub superpeers: Vec<(NodeId, SocketAddr)>,
    /// Peer or client.
    pub role: Role,
    /// Where this node listens (port 0: the OS picks one).
    pub listen: SocketAddr,
    /// What this node offers (peers).
    pub capabilities: Capabilities,
    /// Rack number.
    pub rack: u16,
    /// Switch number.
    pub switch: u16,
    /// The ID this node held before (a restart with its data).
    pub reclaim: Option<NodeId>,
    /// The cluster secret of the messaging layer.
    pub secret: Vec<u8>,
    /// Handler threads of the node's endpoint.
    pub handler_threads: usize,
    /// I/O threads of the node's endpoint (only when it owns its runtime: `join_blocking`).
    pub io_threads: usize,
    /// How long a lone blocking request of this node polls its lane before it blocks
    /// (`myriad_net::Config::lane_spin`; zero: never). Clients set it, peers do not.
    pub lane_spin: Duration,
    /// Deadline of one metadata request (including retries across superpeers) and of the
    /// join itself.
    pub request_timeout: Duration,
    /// TLS for the node's connections (`None`: plain TCP); see `myriad_net::tls`.
    pub tls: Option<myriad_net::TlsConfig>,
    /// The address other nodes reach this one at, when it differs from `listen` (a node
    /// listening on `0.0.0.0`, behind NAT, in a container). Port 0: the listener's port.
    /// `None`: the listener's address.
    pub advertise: Option<SocketAddr>,
}

impl std::fmt::Debug for JoinConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinConfig")
            .field("superpeers", &self.superpeers)
            .field("role", &self.role)
            .field("listen", &self.listen)
            .field("capabilities", &self.capabilities)
            .field("rack", &self.rack)
            .field("switch", &self.switch)
            .field("reclaim", &self.reclaim)
            .field("secret", &"<redacted>")
            .field("handler_threads", &self.handler_threads)
            .field("io_threads", &self.io_threads)
            .field("lane_spin", &self.lane_spin)
            .field("request_timeout", &self.request_timeout)
            .field("tls", &self.tls.is_some())
            .field("advertise", &self.advertise)
            .finish()
    }
}

impl JoinConfig {
    /// Defaults: listen on `127.0.0.1:0`, no secret (set `secret`: joining without one is
    /// refused; there is no default secret), all capabilities, rack and
    /// switch 0, 2 handler threads, 1 I/O thread, no lane spinning, 10 s request timeout.
    pub fn new(superpeers: Vec<(NodeId, SocketAddr)>, role: Role) -> JoinConfig {
        JoinConfig {
            superpeers,
            role,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            capabilities: Capabilities::ALL,
            rack: 0,
            switch: 0,
            reclaim: None,
            secret: Vec::new(),
            handler_threads: 2,
            io_threads: 1,
            lane_spin: Duration::ZERO,
            request_timeout: Duration::from_secs(10),
            tls: None,
            advertise: None,
        }
    }
}

/// Every participant's value of one released barrier round.
type BarrierValues = Vec<(NodeId, u64)>;

/// The node table as this node knows it.
#[derive(Debug, Default)]
struct Table {
    epoch: u64,
    nodes: BTreeMap<NodeId, NodeRecord>,
}

/// A node's membership in the cluster: its ID, the node table, requests to the superpeers.
pub struct Membership {
    node_id: NodeId,
    incarnation: u32,
    net: NetHandle,
    superpeers: Vec<(NodeId, SocketAddr)>,
    request_timeout: Duration,
    table: RwLock<Table>,
    leader_hint: Mutex<Option<NodeId>>,
    events: broadcast::Sender<Event>,
    releases: Mutex<HashMap<(u32, u64), BarrierValues>>,
    released: Notify,
    resyncing: AtomicBool,
    /// Renewed by heartbeats (see [`crate::lease`]).
    lease: Arc<Lease>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("node_id", &self.node_id)
            .field("epoch", &self.epoch())
            .finish()
    }
}

/// Where membership's handlers find the membership once the endpoint is up.
type Slot = Arc<OnceLock<Arc<Membership>>>;

fn net_failure(error: &NetError) -> String {
    error.to_string()
}

/// The certificate role of a node of `role` (`myriad cert issue --role`).
pub fn cert_role_of(role: Role) -> CertRole {
    match role {
        Role::Superpeer => CertRole::Superpeer,
        Role::Peer => CertRole::Peer,
        Role::Client => CertRole::Client,
    }
}

/// Whether a certificate naming `presented` fits a node whose recorded role is
/// `recorded` (`None`: a node not in the table, which may present any).
pub fn certificate_fits(recorded: Option<Role>, presented: Option<CertRole>) -> bool {
    recorded.is_none_or(|recorded| presented == Some(cert_role_of(recorded)))
}

/// A provisional ID at or above [`PROVISIONAL_ID_MIN`], picked at random.
fn provisional_id() -> NodeId {
    NodeId(PROVISIONAL_ID_MIN | (rand::random::<u16>() & 0x00ff))
}

/// Outcome of the join exchange.
struct Joined {
    id: NodeId,
    incarnation: u32,
    epoch: u64,
    nodes: Vec<NodeRecord>,
    /// When the answered join request was sent, and the lease it grants from then.
    sent: std::time::Instant,
    lease: Duration,
}

fn check_config(config: &JoinConfig) -> Result<(), MembershipError> {
    if config.superpeers.is_empty() {
        return Err(MembershipError::InvalidArgument(
            "no superpeer configured".to_owned(),
        ));
    }
    if config.role == Role::Superpeer {
        return Err(MembershipError::InvalidArgument(
            "superpeers do not join through Membership".to_owned(),
        ));
    }
    if config.secret.is_empty() {
        return Err(MembershipError::InvalidArgument(
            "no cluster secret configured (read it from the cluster's secret file)".to_owned(),
        ));
    }
    Ok(())
}

/// Asks the group for an ID through `net` (a provisional endpoint), following `NotLeader`.
async fn join_exchange(
    config: &JoinConfig,
    request: &JoinRequest,
    deadline: tokio::time::Instant,
) -> Result<Joined, MembershipError> {
    let payload = request.encode();
    let mut last_error = String::from("no superpeer answered");
    let mut index = 0usize;
    let mut hint: Option<NodeId> = None;
    while tokio::time::Instant::now() < deadline {
        // A fresh provisional identity per attempt: two joining nodes that drew the same
        // provisional ID must not keep colliding.
        let provisional = Endpoint::start_on(
            tokio::runtime::Handle::current(),
            {
                let mut net_config = myriad_net::Config::new(
                    provisional_id(),
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    config.secret.clone(),
                );
                net_config.handler_threads = 1;
                net_config.tls = config.tls.clone();
                net_config
            },
            Handlers::new(),
        )
        .map_err(|error| MembershipError::Join(format!("provisional endpoint: {error}")))?;
        for (id, address) in &config.superpeers {
            provisional.set_address(*id, *address);
        }
        let target = match hint.take() {
            Some(leader) if config.superpeers.iter().any(|(id, _)| *id == leader) => leader,
            _ => {
                let target = config.superpeers[index % config.superpeers.len()].0;
                index += 1;
                target
            }
        };
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let sent = std::time::Instant::now();
        let answer = provisional
            .request(target, types::JOIN, payload.clone(), remaining)
            .await;
        drop(provisional);
        match answer {
            Err(error) => last_error = format!("superpeer {target}: {}", net_failure(&error)),
            Ok(bytes) => match JoinReply::decode(bytes) {
                Err(error) => {
                    return Err(MembershipError::Protocol(format!(
                        "join reply from {target}: {error}"
                    )))
                }
                Ok(JoinReply::Ok {
                    id,
                    incarnation,
                    epoch,
                    nodes,
                    lease_ms,
                }) => {
                    return Ok(Joined {
                        id,
                        incarnation,
                        epoch,
                        nodes,
                        sent,
                        lease: Duration::from_millis(u64::from(lease_ms)),
                    })
                }
                Ok(JoinReply::Refused(error)) => return Err(MembershipError::Meta(error)),
                Ok(JoinReply::NotLeader { leader }) => {
                    last_error = format!("superpeer {target} is not the leader");
                    if leader.is_some() {
                        hint = leader;
                        continue;
                    }
                }
                Ok(JoinReply::Unavailable(reason)) => {
                    last_error = format!("superpeer {target}: {reason}")
                }
            },
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    Err(MembershipError::SuperpeersUnavailable(format!(
        "join not answered in time: {last_error}"
    )))
}

impl Membership {
    /// Joins the cluster (see the module docs) and starts the node's endpoint on the
    /// current Tokio runtime (which must have I/O and time enabled).
    pub async fn join(
        config: JoinConfig,
        handlers: Handlers,
    ) -> Result<(Endpoint, Arc<Membership>), MembershipError> {
        check_config(&config)?;
        let listener = TcpListener::bind(config.listen)
            .map_err(|error| MembershipError::Join(format!("bind {}: {error}", config.listen)))?;
        let request = join_request(&config, &listener)?;
        let lease = Arc::new(Lease::new());
        let deadline = tokio::time::Instant::now() + config.request_timeout;
        let joined = join_exchange(&config, &request, deadline).await?;
        let slot: Slot = Arc::new(OnceLock::new());
        let handlers = with_own_handlers(handlers, &slot, joined.epoch, &config.superpeers)?;
        let endpoint = Endpoint::start_on_listener(
            tokio::runtime::Handle::current(),
            endpoint_config(&config, joined.id),
            handlers,
            listener,
        )
        .map_err(|error| MembershipError::Join(format!("endpoint: {error}")))?;
        let membership = Membership::install(&config, joined, endpoint.handle(), &slot, lease);
        Ok((endpoint, membership))
    }

    /// [`Membership::join`] for a thread that runs no async tasks: the endpoint gets its
    /// own runtime (`config.io_threads` workers).
    pub fn join_blocking(
        config: JoinConfig,
        handlers: Handlers,
    ) -> Result<(Endpoint, Arc<Membership>), MembershipError> {
        check_config(&config)?;
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(MembershipError::InvalidArgument(
                "join_blocking called inside an async runtime; use join".to_owned(),
            ));
        }
        let listener = TcpListener::bind(config.listen)
            .map_err(|error| MembershipError::Join(format!("bind {}: {error}", config.listen)))?;
        let request = join_request(&config, &listener)?;
        let lease = Arc::new(Lease::new());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| MembershipError::Join(format!("runtime: {error}")))?;
        let joined = runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + config.request_timeout;
            join_exchange(&config, &request, deadline).await
        })?;
        drop(runtime);
        let slot: Slot = Arc::new(OnceLock::new());
        let handlers = with_own_handlers(handlers, &slot, joined.epoch, &config.superpeers)?;
        let endpoint =
            Endpoint::start_with_listener(endpoint_config(&config, joined.id), handlers, listener)
                .map_err(|error| MembershipError::Join(format!("endpoint: {error}")))?;
        let membership = Membership::install(&config, joined, endpoint.handle(), &slot, lease);
        Ok((endpoint, membership))
    }

    /// Builds the membership, fills the messaging layer's address table and starts the
    /// connection watcher.
    fn install(
        config: &JoinConfig,
        joined: Joined,
        net: NetHandle,
        slot: &Slot,
        lease: Arc<Lease>,
    ) -> Arc<Membership> {
        lease.grant_from(joined.sent, joined.lease);
        let (events, _) = broadcast::channel(EVENTS_QUEUED_MAX);
        let membership = Arc::new(Membership {
            node_id: joined.id,
            incarnation: joined.incarnation,
            net,
            superpeers: config.superpeers.clone(),
            request_timeout: config.request_timeout,
            table: RwLock::new(Table::default()),
            leader_hint: Mutex::new(None),
            events,
            releases: Mutex::new(HashMap::new()),
            released: Notify::new(),
            resyncing: AtomicBool::new(false),
            lease,
        });
        for (id, address) in &config.superpeers {
            membership.net.set_address(*id, *address);
        }
        // TLS: a node's certificate must name its role (configured superpeers, else the
        // node table's record; a node not in the table yet may connect as anything).
        let weak = Arc::downgrade(&membership);
        let configured: Arc<[NodeId]> = config.superpeers.iter().map(|(id, _)| *id).collect();
        membership.net.check_roles(move |node, role| {
            let recorded = if configured.contains(&node) {
                Some(Role::Superpeer)
            } else {
                weak.upgrade()
                    .and_then(|membership| membership.role_of(node))
            };
            certificate_fits(recorded, role)
        });
        // Nobody has subscribed yet: the join's table needs no events.
        let _ = membership.replace_table(joined.epoch, joined.nodes);
        // The slot is empty only here; `set` fails only if already set, which cannot be.
        let _ = slot.set(membership.clone());
        membership.spawn_connection_watcher();
        tracing::info!(node = %membership.node_id, incarnation = membership.incarnation, epoch = joined.epoch, "joined the cluster");
        membership
    }

    /// This node's ID.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// This node's incarnation under its ID.
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// This node's lease with the superpeers (a peer serves chunks only while it holds;
    /// see [`crate::lease`]).
    pub fn lease(&self) -> &Arc<Lease> {
        &self.lease
    }

    /// The cluster epoch as far as this node's table goes.
    pub fn epoch(&self) -> u64 {
        self.table.read().epoch
    }

    /// The node's messaging handle.
    pub fn net(&self) -> &NetHandle {
        &self.net
    }

    /// The configured superpeers.
    pub fn superpeers(&self) -> &[(NodeId, SocketAddr)] {
        &self.superpeers
    }

    /// Every node this node knows of, by ID.
    pub fn nodes(&self) -> Vec<NodeRecord> {
        self.table.read().nodes.values().cloned().collect()
    }

    /// One node's record.
    pub fn node(&self, id: NodeId) -> Option<NodeRecord> {
        self.table.read().nodes.get(&id).cloned()
    }

    /// The role of a node this node knows of (no copy of its record: cheap enough for a
    /// check per message, see `myriad_net::Handlers::restrict`).
    pub fn role_of(&self, id: NodeId) -> Option<Role> {
        self.table.read().nodes.get(&id).map(|record| record.role)
    }

    /// Whether `id` is a superpeer of the node table (one added to the group at runtime)
    /// whose address is known; makes sure the messaging layer has that address.
    fn reachable_superpeer(&self, id: NodeId) -> bool {
        let Some(record) = self
            .node(id)
            .filter(|record| record.role == Role::Superpeer)
        else {
            return false;
        };
        let Ok(address) = record.address.parse::<SocketAddr>() else {
            return false;
        };
        if self.net.address(id) != Some(address) {
            self.net.set_address(id, address);
        }
        true
    }

    /// Where a request goes when no leader is known, in turn: the configured superpeers,
    /// then the superpeers of the node table that are alive and not configured (added to
    /// the group at runtime), so that a node whose configured superpeers all left the group
    /// still finds it. Never empty (the configured list is not).
    fn superpeer_candidates(&self) -> Vec<NodeId> {
        let mut candidates: Vec<NodeId> = self.superpeers.iter().map(|(id, _)| *id).collect();
        let added: Vec<NodeId> = self
            .table
            .read()
            .nodes
            .values()
            .filter(|record| record.role == Role::Superpeer && record.state == NodeState::Alive)
            .map(|record| record.id)
            .filter(|id| !candidates.contains(id))
            .collect();
        for id in added {
            if self.reachable_superpeer(id) {
                candidates.push(id);
            }
        }
        candidates
    }

    /// Whether `id` may send peer-to-peer messages (replication, acknowledgements): not
    /// a node this node knows as a client. A node not known yet is let through (a peer
    /// that joined a moment ago may replicate before its join event arrived here); see
    /// `docs/security.md` for what this does and does not stop.
    pub fn is_not_client(&self, id: NodeId) -> bool {
        self.role_of(id) != Some(Role::Client)
    }

    /// Events from now on, each delivered after the node table was updated.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    // ----- requests ----------------------------------------------------------------------

    /// The superpeer leader's recovery table: every zone recovery it coordinated, with its
    /// state, restorer, chunks and milliseconds since the failure. Asks the configured
    /// superpeers in turn (each for at most `timeout`) until the leader answers (only the
    /// leader coordinates recoveries).
    pub async fn recovery_status(
        &self,
        timeout: Duration,
    ) -> Result<myriad_proto::recovery::RecoveryStatusReply, MembershipError> {
        let mut last_error = String::from("no superpeer is configured");
        for &(superpeer, _) in &self.superpeers {
            let reply = self
                .net
                .request(
                    superpeer,
                    types::RECOVERY_STATUS,
                    bytes::Bytes::new(),
                    timeout,
                )
                .await;
            match reply {
                Ok(bytes) => match myriad_proto::recovery::RecoveryStatusReply::decode(bytes) {
                    Ok(status) if status.leader => return Ok(status),
                    Ok(_) => last_error = format!("superpeer {superpeer} does not lead"),
                    Err(error) => return Err(MembershipError::Protocol(error.to_string())),
                },
                Err(error) => last_error = format!("superpeer {superpeer}: {error}"),
            }
        }
        Err(MembershipError::SuperpeersUnavailable(last_error))
    }

    /// Sends `request` to the superpeer group: to the leader as far as known, following
    /// `NotLeader` answers and trying the other superpeers (the configured ones, then the
    /// live superpeers of the node table) until
    /// [`JoinConfig::request_timeout`]. A write whose outcome is unknown is not retried
    /// (it may have been applied): it fails with [`MembershipError::Timeout`].
    pub async fn request(&self, request: MetaRequest) -> Result<MetaReply, MembershipError> {
        self.request_inner(request, false).await
    }

    /// [`Membership::request`]; with `at_most_once`, a write whose connection was lost after
    /// it was sent is not sent again either (it may have been applied; see
    /// [`Membership::write_at_most_once`]).
    async fn request_inner(
        &self,
        request: MetaRequest,
        at_most_once: bool,
    ) -> Result<MetaReply, MembershipError> {
        let is_write = matches!(request, MetaRequest::Write(_));
        let payload = request.encode();
        let started = tokio::time::Instant::now();
        let deadline = started + self.request_timeout;
        let mut index = 0usize;
        let mut last_error = String::from("no superpeer answered");
        while tokio::time::Instant::now() < deadline {
            let hint = *self.leader_hint.lock();
            let target = match hint {
                Some(leader) => leader,
                None => {
                    let candidates = self.superpeer_candidates();
                    let target = candidates[index % candidates.len()];
                    index += 1;
                    target
                }
            };
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let answer = self
                .net
                .request(target, types::META_REQUEST, payload.clone(), remaining)
                .await;
            let reply = match answer {
                Err(error) => {
                    last_error = format!("superpeer {target}: {error}");
                    self.forget_leader(target);
                    let maybe_applied = match error {
                        NetError::Timeout(_) => true,
                        NetError::ConnectionLost(_) => at_most_once,
                        _ => false,
                    };
                    if maybe_applied && is_write {
                        return Err(MembershipError::Timeout {
                            what: format!("write to superpeer {target} ({error}; outcome unknown)"),
                            timeout_ms: self.request_timeout.as_millis() as u64,
                        });
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
                Ok(bytes) => MetaReply::decode(bytes).map_err(|error| {
                    MembershipError::Protocol(format!("reply from superpeer {target}: {error}"))
                })?,
            };
            match reply {
                MetaReply::NotLeader { leader } => {
                    last_error = format!("superpeer {target} is not the leader");
                    let known = leader.filter(|leader| {
                        *leader != target
                            && (self.superpeers.iter().any(|(id, _)| id == leader)
                                || self.reachable_superpeer(*leader))
                    });
                    *self.leader_hint.lock() = known;
                    if known.is_none() {
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
                MetaReply::Unavailable(reason) => {
                    last_error = format!("superpeer {target}: {reason}");
                    if is_write && !reason.starts_with("no quorum") {
                        return Err(MembershipError::Timeout {
                            what: format!("write on superpeer {target}: {reason}"),
                            timeout_ms: self.request_timeout.as_millis() as u64,
                        });
                    }
                    self.forget_leader(target);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                reply => {
                    if !matches!(reply, MetaReply::Status(_)) {
                        *self.leader_hint.lock() = Some(target);
                    }
                    return Ok(reply);
                }
            }
        }
        Err(MembershipError::SuperpeersUnavailable(format!(
            "no answer within {} ms: {last_error}",
            self.request_timeout.as_millis()
        )))
    }

    fn forget_leader(&self, target: NodeId) {
        let mut hint = self.leader_hint.lock();
        if *hint == Some(target) {
            *hint = None;
        }
    }

    /// Commits `command` through the group. A refusal becomes [`MembershipError::Meta`].
    /// A write whose connection to the leader is lost is sent again to the next leader, so
    /// it may be applied twice: for the group's own idempotent commands (zones, owners,
    /// reservations). Writes of values others may overwrite use
    /// [`Membership::write_at_most_once`].
    pub async fn write(&self, command: Command) -> Result<Response, MembershipError> {
        self.write_inner(command, false).await
    }

    /// Like [`Membership::write`], but never sent again once it may have reached a leader:
    /// a lost connection after sending fails with [`MembershipError::Timeout`] (outcome
    /// unknown), as a timeout does. For writes of registers (names, temporary storage,
    /// barriers): a second application after another client's overwrite would bring back
    /// a replaced value (`crates/node/tests/write_retry.rs`).
    pub async fn write_at_most_once(&self, command: Command) -> Result<Response, MembershipError> {
        self.write_inner(command, true).await
    }

    async fn write_inner(
        &self,
        command: Command,
        at_most_once: bool,
    ) -> Result<Response, MembershipError> {
        match self
            .request_inner(MetaRequest::Write(command), at_most_once)
            .await?
        {
            MetaReply::Response(Response::Error(error)) => Err(MembershipError::Meta(error)),
            MetaReply::Response(response) => Ok(response),
            other => Err(unexpected(&other)),
        }
    }

    /// Signs on to barrier `id` with `value` and waits until the round completes (pushed
    /// by the superpeer, or seen by polling the barrier's status); returns every
    /// participant's value.
    pub async fn barrier_sign_on(
        &self,
        id: u32,
        value: u64,
        timeout: Duration,
    ) -> Result<Vec<(NodeId, u64)>, MembershipError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let command = Command::BarrierSignOn {
            id,
            node: self.node_id,
            value,
        };
        let round = match self.write(command).await {
            Ok(Response::Barrier(outcome)) => match outcome.released {
                Some(values) => return Ok(values),
                None => outcome.round,
            },
            Ok(other) => {
                return Err(MembershipError::Protocol(format!(
                    "barrier sign-on answered with {other:?}"
                )))
            }
            // A retried sign-on that the group had applied already: wait for the current
            // round.
            Err(MembershipError::Meta(MetaError::AlreadySignedOn(_))) => {
                match self.request(MetaRequest::BarrierStatus(id)).await? {
                    MetaReply::Barrier(Some(status)) => status.round,
                    MetaReply::Barrier(None) => {
                        return Err(MembershipError::Meta(MetaError::BarrierNotFound(id)))
                    }
                    other => return Err(unexpected(&other)),
                }
            }
            Err(error) => return Err(error),
        };
        let mut next_poll = tokio::time::Instant::now() + BARRIER_POLL_INTERVAL;
        loop {
            let notified = self.released.notified();
            if let Some(values) = self.releases.lock().remove(&(id, round)) {
                return Ok(values);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(MembershipError::Timeout {
                    what: format!("barrier {id} round {round}"),
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
            if now >= next_poll {
                next_poll = now + BARRIER_POLL_INTERVAL;
                match self.request(MetaRequest::BarrierStatus(id)).await? {
                    MetaReply::Barrier(Some(status)) if status.round == round + 1 => {
                        return Ok(status.last_released)
                    }
                    MetaReply::Barrier(Some(status)) if status.round > round + 1 => {
                        return Err(MembershipError::Meta(MetaError::InvalidArgument(format!(
                            "barrier {id} round {round} was superseded before its values were seen"
                        ))))
                    }
                    MetaReply::Barrier(Some(_)) => {}
                    MetaReply::Barrier(None) => {
                        return Err(MembershipError::Meta(MetaError::BarrierNotFound(id)))
                    }
                    other => return Err(unexpected(&other)),
                }
                continue;
            }
            let wake = next_poll.min(deadline);
            let _ = tokio::time::timeout_at(wake, notified).await;
        }
    }

    /// Leaves the cluster in an orderly way (the caller then drops the endpoint).
    pub async fn leave(&self) -> Result<(), MembershipError> {
        self.write(Command::Leave { node: self.node_id })
            .await
            .map(|_| ())
    }

    // ----- the node table ----------------------------------------------------------------

    /// Replaces the whole table (join, resync) and brings addresses and fences in line.
    /// Returns what changed as events ([`table_changes`]), for the caller to deliver: a
    /// resync learns what pushes that never arrived would have said, and subscribers
    /// (the replicator filling zones when peers join, replacing failed backups) must hear
    /// it too.
    fn replace_table(&self, epoch: u64, nodes: Vec<NodeRecord>) -> Vec<Event> {
        let mut table = self.table.write();
        if epoch < table.epoch {
            return Vec::new();
        }
        table.epoch = epoch;
        let nodes: BTreeMap<NodeId, NodeRecord> = nodes
            .into_iter()
            .map(|record| (record.id, record))
            .collect();
        let changes = table_changes(&table.nodes, &nodes, self.node_id);
        table.nodes = nodes;
        for record in table.nodes.values() {
            self.sync_net(record);
        }
        changes
    }

    /// Brings the messaging layer's address and fence for one node in line with its record.
    fn sync_net(&self, record: &NodeRecord) {
        if record.id == self.node_id {
            return;
        }
        let id = record.id;
        match record.state {
            NodeState::Alive => {
                if let Ok(address) = record.address.parse::<SocketAddr>() {
                    self.net.set_address(id, address);
                }
                if self.net.is_fenced(id) {
                    self.net.unfence(id);
                }
            }
            NodeState::Failed { .. } | NodeState::Left => {
                if record.role == Role::Superpeer {
                    return;
                }
                self.net.remove_address(id);
                if matches!(record.state, NodeState::Failed { .. }) && !self.net.is_fenced(id) {
                    self.net.fence(id);
                }
            }
        }
    }

    /// Applies one pushed event; returns whether it showed a gap (a resync is due).
    fn apply_event(&self, push: &EventPush) -> bool {
        let mut table = self.table.write();
        let membership_change = !matches!(push.event, Event::OwnerChanged { .. });
        if membership_change && push.epoch <= table.epoch {
            // Already known (the join reply or a resync covered it).
            return false;
        }
        let gap = membership_change && push.epoch > table.epoch + 1;
        match &push.event {
            Event::NodeJoined(record) => {
                table.nodes.insert(record.id, record.clone());
                self.sync_net(record);
            }
            Event::NodeFailed(id) | Event::NodeLeft(id) => {
                let state = match push.event {
                    Event::NodeFailed(_) => NodeState::Failed { epoch: push.epoch },
                    _ => NodeState::Left,
                };
                if let Some(record) = table.nodes.get_mut(id) {
                    record.state = state;
                    let record = record.clone();
                    self.sync_net(&record);
                }
            }
            Event::OwnerChanged { .. } => {}
        }
        // Only membership events advance the epoch: an ownership event committed after a
        // join may be pushed before the join's event (pushes follow the end of each
        // commit's handling, not the commit order), and must not make the join look known.
        if membership_change && push.epoch > table.epoch {
            table.epoch = push.epoch;
        }
        gap
    }

    /// Fetches the whole node table from the group (once at a time), in the background.
    fn spawn_resync(self: &Arc<Self>, seen_epoch: u64) {
        if self.resyncing.swap(true, Ordering::AcqRel) {
            return;
        }
        let membership = self.clone();
        self.net.runtime().spawn(async move {
            match membership.request(MetaRequest::Nodes).await {
                Ok(MetaReply::Nodes(nodes)) => {
                    let newest = nodes
                        .iter()
                        .map(|record| match record.state {
                            NodeState::Failed { epoch } => epoch.max(record.joined_epoch),
                            _ => record.joined_epoch,
                        })
                        .max()
                        .unwrap_or(0);
                    let epoch = seen_epoch.max(newest).max(membership.epoch());
                    let changes = membership.replace_table(epoch, nodes);
                    tracing::debug!(node = %membership.node_id, epoch, changes = changes.len(), "node table resynced");
                    // After the table update, as every event.
                    for event in changes {
                        let _ = membership.events.send(event);
                    }
                }
                Ok(other) => tracing::warn!(?other, "resync answered with another reply"),
                Err(error) => tracing::warn!(%error, "node table resync failed"),
            }
            membership.resyncing.store(false, Ordering::Release);
        });
    }

    // ----- connection loss -----------------------------------------------------------------

    /// Reports every lost connection to a live non-superpeer member to a superpeer.
    fn spawn_connection_watcher(self: &Arc<Self>) {
        let mut events = self.net.subscribe();
        let weak = Arc::downgrade(self);
        self.net.runtime().spawn(async move {
            while let Some(lost) = events.recv().await {
                if !matches!(lost.reason, CloseReason::PeerClosed | CloseReason::Io(_)) {
                    continue;
                }
                let Some(membership) = weak.upgrade() else {
                    return;
                };
                let node = lost.node;
                let watched = membership.node(node).is_some_and(|record| {
                    record.state == NodeState::Alive && record.role != Role::Superpeer
                });
                if watched {
                    tracing::info!(from = %membership.node_id, %node, reason = %lost.reason, "connection lost; reporting");
                    membership.report_failure(node).await;
                }
            }
        });
    }

    /// Sends a [`FailureReport`] on `node` to one superpeer (the leader if known).
    pub async fn report_failure(&self, node: NodeId) {
        let payload = FailureReport { node }.encode();
        let hint = *self.leader_hint.lock();
        let order = hint
            .into_iter()
            .chain(self.superpeers.iter().map(|(id, _)| *id));
        for superpeer in order {
            let send = self
                .net
                .send(superpeer, types::FAILURE_REPORT, payload.clone());
            if let Ok(Ok(())) = tokio::time::timeout(self.request_timeout, send).await {
                return;
            }
        }
        tracing::warn!(%node, "no superpeer took the failure report");
    }

    // ----- membership's own handlers -------------------------------------------------------

    fn on_event(self: &Arc<Self>, message: Incoming) {
        let push = match EventPush::decode(message.payload) {
            Ok(push) => push,
            Err(error) => {
                tracing::warn!(from = %message.from, %error, "bad event push");
                return;
            }
        };
        if self.apply_event(&push) {
            self.spawn_resync(push.epoch);
        }
        let _ = self.events.send(push.event);
    }

    fn on_heartbeat(self: &Arc<Self>, message: Incoming) {
        let heartbeat = match Heartbeat::decode(message.payload.clone()) {
            Ok(heartbeat) => heartbeat,
            Err(error) => {
                tracing::warn!(from = %message.from, %error, "bad heartbeat");
                return;
            }
        };
        // The acknowledgement first (it names an earlier reply), then this reply's number
        // and sending time.
        self.lease.acked(heartbeat.acked, heartbeat.lease_ms);
        let epoch = self.epoch();
        let nonce = self.lease.reply_sent();
        if let Err(error) = message.respond(HeartbeatReply { epoch, nonce }.encode()) {
            tracing::debug!(%error, "heartbeat reply not sent");
        }
        if heartbeat.epoch > epoch {
            self.spawn_resync(heartbeat.epoch);
        }
    }

    fn on_barrier_released(&self, message: Incoming) {
        let released = match BarrierReleased::decode(message.payload) {
            Ok(released) => released,
            Err(error) => {
                tracing::warn!(from = %message.from, %error, "bad barrier release");
                return;
            }
        };
        {
            let mut releases = self.releases.lock();
            if releases.len() >= BARRIER_RELEASES_KEPT_MAX {
                releases.clear();
            }
            releases.insert((released.id, released.round), released.values);
        }
        self.released.notify_waiters();
    }
}

fn unexpected(reply: &MetaReply) -> MembershipError {
    MembershipError::Protocol(format!("unexpected reply: {reply:?}"))
}

fn join_request(
    config: &JoinConfig,
    listener: &TcpListener,
) -> Result<JoinRequest, MembershipError> {
    let bound = listener
        .local_addr()
        .map_err(|error| MembershipError::Join(format!("listener address: {error}")))?;
    let address = match config.advertise {
        Some(advertise) if advertise.port() == 0 => SocketAddr::new(advertise.ip(), bound.port()),
        Some(advertise) => advertise,
        None => bound,
    };
    if address.ip().is_unspecified() {
        return Err(MembershipError::Join(format!(
            "listening on {bound} needs an advertised address others can reach (--advertise IP)"
        )));
    }
    Ok(JoinRequest {
        role: config.role,
        address: address.to_string(),
        capabilities: config.capabilities,
        rack: config.rack,
        switch: config.switch,
        reclaim: config.reclaim,
    })
}

fn endpoint_config(config: &JoinConfig, id: NodeId) -> myriad_net::Config {
    let mut net_config = myriad_net::Config::new(id, config.listen, config.secret.clone());
    net_config.handler_threads = config.handler_threads.max(1);
    net_config.io_threads = config.io_threads.max(1);
    net_config.tls = config.tls.clone();
    net_config.lane_spin = config.lane_spin;
    net_config
}

/// Adds membership's handlers to the caller's. Before the membership is installed (a
/// moment after the endpoint starts) heartbeats are answered with the join's epoch and
/// events are dropped (the next heartbeat shows the gap and triggers a resync).
///
/// Roles: only the configured superpeers may send these types (events, heartbeats and
/// barrier releases from a client or peer close its connection, see
/// `myriad_net::Handlers::restrict`).
fn with_own_handlers(
    mut handlers: Handlers,
    slot: &Slot,
    join_epoch: u64,
    superpeers: &[(NodeId, SocketAddr)],
) -> Result<Handlers, MembershipError> {
    let register =
        |error: NetError| MembershipError::Join(format!("handler registration: {error}"));
    let events = slot.clone();
    handlers
        .register(types::EVENT, move |message: Incoming| {
            if let Some(membership) = events.get() {
                membership.on_event(message);
            }
        })
        .map_err(register)?;
    let heartbeats = slot.clone();
    handlers
        .register_inline(
            types::HEARTBEAT,
            move |message: Incoming| match heartbeats.get() {
                Some(membership) => membership.on_heartbeat(message),
                None => {
                    // Number 0: no lease can come of this reply.
                    let reply = HeartbeatReply {
                        epoch: join_epoch,
                        nonce: 0,
                    }
                    .encode();
                    let _ = message.respond(reply);
                }
            },
        )
        .map_err(register)?;
    let barriers = slot.clone();
    handlers
        .register(types::BARRIER_RELEASED, move |message: Incoming| {
            if let Some(membership) = barriers.get() {
                membership.on_barrier_released(message);
            }
        })
        .map_err(register)?;
    // The configured superpeers, and those the node table knows as superpeers (added to
    // the group at runtime: `AddSuperpeer`).
    let superpeers: Arc<[NodeId]> = superpeers.iter().map(|(id, _)| *id).collect();
    for message_type in [types::EVENT, types::HEARTBEAT, types::BARRIER_RELEASED] {
        let superpeers = superpeers.clone();
        let table = slot.clone();
        handlers
            .restrict(message_type, move |from| {
                superpeers.contains(&from)
                    || table
                        .get()
                        .is_some_and(|membership| membership.role_of(from) == Some(Role::Superpeer))
            })
            .map_err(register)?;
    }
    Ok(handlers)
}

/// Every LID range of `creator` given the ranges that moved elsewhere (sorted by first
/// LID, not overlapping): the moved ranges plus the gaps, which the creator holds.
fn full_ranges(creator: NodeId, moved: &[(u64, u64, NodeId)]) -> Vec<LookupRange> {
    let mut ranges = Vec::with_capacity(moved.len() * 2 + 1);
    let mut next = 0u64;
    for &(first, last, owner) in moved {
        if first > last || first < next {
            continue; // malformed or overlapping: the single lookups still work
        }
        if first > next {
            ranges.push(LookupRange {
                creator,
                first: next,
                last: first - 1,
                owner: creator,
            });
        }
        ranges.push(LookupRange {
            creator,
            first,
            last,
            owner,
        });
        match last.checked_add(1) {
            Some(after) => next = after,
            None => return ranges,
        }
    }
    if next <= myriad_types::LOCAL_ID_MAX {
        ranges.push(LookupRange {
            creator,
            first: next,
            last: myriad_types::LOCAL_ID_MAX,
            owner: creator,
        });
    }
    ranges
}

/// The node directory: where chunks live and which nodes are up, as far as this node
/// knows (the client's chunk routing reaches it through its `Directory` trait).
impl Membership {
    /// Asks the superpeer group for the lookup range holding `cid` (never a cached answer).
    pub async fn lookup(&self, cid: ChunkId) -> Result<LookupRange, MembershipError> {
        match self.request(MetaRequest::Lookup(cid)).await? {
            MetaReply::Lookup(range) => Ok(range),
            other => Err(unexpected(&other)),
        }
    }

    /// Asks the superpeer group for every lookup range of `creator`, covering all of its
    /// local IDs (gaps between the moved ranges belong to the creator).
    pub async fn lookup_all(&self, creator: NodeId) -> Result<Vec<LookupRange>, MembershipError> {
        match self.request(MetaRequest::LookupTree(creator)).await? {
            MetaReply::LookupTree(mut moved) => {
                moved.sort_unstable_by_key(|&(first, _, _)| first);
                Ok(full_ranges(creator, &moved))
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Whether `node` is a member that is alive as far as this node knows (joined and not
    /// failed or gone).
    pub fn is_alive(&self, node: NodeId) -> bool {
        self.table
            .read()
            .nodes
            .get(&node)
            .is_some_and(|record| record.state == NodeState::Alive)
    }

    /// Whether chunks routed to the unreachable `node` may become available again by a
    /// recovery: a peer that failed (its zones are being recovered) or that is alive in
    /// the table but does not answer (its failure is not detected yet).
    pub fn may_recover(&self, node: NodeId) -> bool {
        self.table.read().nodes.get(&node).is_some_and(|record| {
            record.role == Role::Peer
                && matches!(record.state, NodeState::Alive | NodeState::Failed { .. })
        })
    }
}

/// The events that turn node table `old` into `new`, as this node (`me`, left out) would
/// have received them as pushes: `NodeFailed` / `NodeLeft` for a known node's incarnation
/// that is now failed or gone, then `NodeJoined` for an alive node that is new or has a
/// new incarnation (a restart). A node first seen already failed or gone makes no event.
pub(crate) fn table_changes(
    old: &BTreeMap<NodeId, NodeRecord>,
    new: &BTreeMap<NodeId, NodeRecord>,
    me: NodeId,
) -> Vec<Event> {
    let mut gone = Vec::new();
    let mut joined = Vec::new();
    for (id, record) in new {
        if *id == me {
            continue;
        }
        let before = old.get(id);
        let was_alive = before.is_some_and(|b| b.state == NodeState::Alive);
        let same_incarnation = before.is_some_and(|b| b.incarnation == record.incarnation);
        match record.state {
            NodeState::Alive => {
                // A new incarnation of a node we knew alive restarted unnoticed: the group
                // pushes only its join then (subscribers treat an incarnation above 1 as
                // a restart), and so does this.
                if !(same_incarnation && was_alive) {
                    joined.push(Event::NodeJoined(record.clone()));
                }
            }
            NodeState::Failed { .. } if was_alive => gone.push(Event::NodeFailed(*id)),
            NodeState::Left if was_alive => gone.push(Event::NodeLeft(*id)),
            NodeState::Failed { .. } | NodeState::Left => {}
        }
    }
    gone.extend(joined);
    gone
}

#[cfg(test)]
mod table_change_tests {
    use super::*;

    fn record(id: u16, incarnation: u32, state: NodeState) -> NodeRecord {
        NodeRecord {
            id: NodeId(id),
            role: Role::Peer,
            address: format!("127.0.0.1:{}", 7000 + id),
            capabilities: Capabilities::BACKUP,
            rack: 0,
            switch: 0,
            state,
            incarnation,
            joined_epoch: u64::from(incarnation),
            released: false,
        }
    }

    fn table(records: &[NodeRecord]) -> BTreeMap<NodeId, NodeRecord> {
        records.iter().map(|r| (r.id, r.clone())).collect()
    }

    #[test]
    fn a_resync_reports_joins_failures_leaves_and_restarts_it_missed() {
        let alive = NodeState::Alive;
        let failed = NodeState::Failed { epoch: 9 };
        let old = table(&[
            record(1, 1, alive),
            record(2, 1, alive),
            record(3, 1, alive),
            record(4, 1, alive),
            record(5, 1, failed),
            record(6, 1, alive),
        ]);
        let new = table(&[
            record(1, 1, alive),           // me: never reported
            record(2, 1, alive),           // unchanged
            record(3, 1, failed),          // failed
            record(4, 1, NodeState::Left), // left
            record(5, 2, alive),           // back after its failure
            record(6, 2, alive),           // restarted unnoticed
            record(7, 1, alive),           // new
            record(8, 1, failed),          // new, but already failed
        ]);
        let changes = table_changes(&old, &new, NodeId(1));
        assert_eq!(
            changes,
            vec![
                Event::NodeFailed(NodeId(3)),
                Event::NodeLeft(NodeId(4)),
                Event::NodeJoined(record(5, 2, alive)),
                Event::NodeJoined(record(6, 2, alive)),
                Event::NodeJoined(record(7, 1, alive)),
            ]
        );
        assert!(
            table_changes(&new, &new, NodeId(1)).is_empty(),
            "no change, no event"
        );
    }
}

#[cfg(test)]
mod full_range_tests {
    use super::*;

    #[test]
    fn moved_ranges_and_gaps_cover_every_local_id_once() {
        let creator = NodeId(2);
        let moved = [(0, 9, NodeId(5)), (20, 29, NodeId(6)), (30, 30, NodeId(5))];
        let ranges = full_ranges(creator, &moved);
        let spans: Vec<(u64, u64, u16)> = ranges
            .iter()
            .map(|r| (r.first, r.last, r.owner.0))
            .collect();
        assert_eq!(
            spans,
            vec![
                (0, 9, 5),
                (10, 19, 2),
                (20, 29, 6),
                (30, 30, 5),
                (31, myriad_types::LOCAL_ID_MAX, 2)
            ]
        );
        assert!(ranges.iter().all(|r| r.creator == creator));
        // Nothing moved: one range, the creator's.
        assert_eq!(full_ranges(creator, &[]).len(), 1);
        // A range reaching the last local ID leaves no trailing gap.
        let last = full_ranges(creator, &[(5, myriad_types::LOCAL_ID_MAX, NodeId(9))]);
        assert_eq!(last.len(), 2);
        // Overlapping input is skipped rather than producing overlapping ranges.
        let skipped = full_ranges(creator, &[(0, 10, NodeId(5)), (5, 8, NodeId(6))]);
        assert!(skipped.windows(2).all(|w| w[0].last < w[1].first));
    }
}
