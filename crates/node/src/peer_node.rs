//! The peer process: joins the cluster, stores chunks in a memory manager and serves them.
//!
//! # Job
//! [`PeerNode::start`] joins through the superpeers (reclaiming the node ID kept in the data
//! directory, so a restarted peer keeps its identity), creates the memory manager under the
//! assigned ID, registers the chunk service ([`crate::peer::ChunkService`]) and the
//! migration handler, and follows the group's events: ownership changes update the
//! service's ownership view (reloaded from the superpeers when the peer misses events, e.g.
//! in a recovery's burst of them); a node that failed or left loses the chunk locks it held
//! here.
//!
//! # Restarts
//! A peer restarted with its data directory is a new incarnation of its node ID: it asks
//! the superpeers for its bases ([`myriad_proto::meta::MetaRequest::Bases`]) and numbers
//! its zones and fresh local IDs above everything the earlier incarnation registered or
//! reserved; its earlier zones are recovered by their backups meanwhile, and until none is
//! left it records the CIDs routed to it as owned by [`NOBODY`] (answering `NotOwner`). A
//! background thread keeps a local-ID reservation ([`LID_RESERVE_STEP`]) ahead of the
//! memory manager's fresh IDs (`Command::ReserveLids`). On a joined peer's new incarnation,
//! the replicator replaces it in the zones it backs (its stream state is gone).
//!
//! # Replication
//! With the backup capability the peer keeps other peers' backups: a log engine in the
//! log directory and a [`BackupService`] whose handler is registered *before* the join (so
//! it is live when masters send) and attached to the endpoint right after. With
//! `backup.replication > 0` it also replicates its own chunks: a [`Replicator`] started
//! after the join (it needs the node ID) over the cluster
//! ([`crate::replication::MembershipRegistry`], [`crate::replication::MembershipCandidates`],
//! [`crate::replication::MemorySource`]), handed to the chunk service. Events: a node that
//! failed or left is replaced in every zone it backs ([`Replicator::replace_backup`], on a
//! blocking thread); a joined peer fills zones placed with fewer than R backups
//! ([`Replicator::fill_zones`]); a backup the replicator reports unreachable is reported
//! to the superpeers as failed (whose verdict then triggers the replacement). Every
//! [`ReplicaEvent`] is logged.
//!
//! # Declared failed (fencing of a paused or partitioned peer)
//! A peer that was paused (SIGSTOP, a stalled VM) or cut off long enough is declared failed
//! by the superpeers; its zones are recovered by its backups, and the superpeer leader, the
//! peers and the clients fence it in the messaging layer: its replication and ownership
//! messages are dropped, its connections refused. When it runs again it must learn this
//! and stop serving, since its memory is stale. A task (`watch_self`) checks every
//! [`SELF_CHECK_INTERVAL`], and at once whenever a connection is lost: its own record in
//! the node table (a `NodeFailed` about itself or a resync shows it `Failed`), and a
//! heartbeat request to a superpeer (round robin; all of them after a lost connection): a
//! superpeer that refuses the connection (`NetError::Fenced` for the superpeer, which no
//! node fences on its own side) has fenced this node. Then the chunk service is switched to
//! answering `NotOwner` to everything ([`ChunkService::declare_failed`]: clients look the
//! chunks up again and go to the restorers; migration and recovery requests are refused
//! too), the line "this node was declared failed at epoch E; shutting down" is logged,
//! [`PeerNode::declared_failed`] returns it, and the process (`myriad peer`) exits with an
//! error after [`DECLARED_FAILED_LINGER`]. The node never rejoins under the old
//! incarnation: a restart joins again (reclaiming its ID, with empty memory).
//!
//! Known window: between waking up and the first check (milliseconds after a pause: the
//! lost connections trigger it) the peer still serves requests that reach it. Members that
//! applied the failure event no longer send to it, and its writes cannot reach its
//! backups, so a write accepted there is never acknowledged as `replicated`/`durable`; only
//! an `async` write from a client that has not applied the failure event yet can be
//! acknowledged and then lost.
//!
//! # Invariants
//! - Chunk requests that arrive before the memory manager exists are answered with a
//!   "not ready" error, never a panic (a window of microseconds after the join commits).
//! - Migration holds the write locks of the chunks it moves until the new owner is
//!   committed, so no put lands on the old copy after it was copied.
//!
//! # Who calls it
//! `myriad peer` (the binary) and tests; applications that run inside a peer process use
//! [`PeerNode::client`] for the local, network-free path.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::directory::Directory;
use myriad_client::membership::{JoinConfig, Membership};
use myriad_client::ClientError;
use myriad_mem::{MemoryConfig, MemoryManager};
use myriad_meta::{Capabilities, Command, NodeState};
use myriad_net::{Endpoint, Handlers, Incoming, NetError, Responder};
use myriad_proto::chunk::{ChunkReply, ChunkRequest, ItemError};
use myriad_proto::meta::{Event, Heartbeat, HeartbeatReply};
use myriad_proto::migrate::{MigrateReply, MigrateRequest};
use myriad_proto::recovery::RecoverReply;
use myriad_proto::types;
use myriad_replication::{BackupService, ReplicaEvent, Replicator, ReplicatorConfig};
use myriad_types::{ChunkId, NodeId};
use thiserror::Error;

use crate::peer::ChunkService;
use crate::replication::{
    open_backup_service, BackupOptions, BackupStartError, MembershipCandidates, MembershipRegistry,
    MemorySource,
};

/// Name of the file in the data directory that keeps the peer's node ID across restarts.
pub const NODE_ID_FILE: &str = "node-id";
/// Most chunks one migration request may move.
pub const MIGRATE_CHUNKS_MAX: u64 = 1 << 20;

/// Local IDs a peer reserves (`Command::ReserveLids`) ahead of the ones it handed out. A
/// new reservation is committed when fewer than half of them are left, checked every
/// [`LID_RESERVE_CHECK`]: safe as long as a peer hands out fewer than 2^31 fresh IDs in
/// one check interval (plus a commit), far beyond what a memory manager can create.
pub const LID_RESERVE_STEP: u64 = 1 << 32;
/// How often a peer compares its fresh local IDs with its reservation.
pub const LID_RESERVE_CHECK: Duration = Duration::from_millis(100);

/// Chunk requests waiting for a handler thread, at most (more are refused as "busy").
pub const SLOW_PATH_QUEUE_MAX: usize = 16_384;

/// How often a peer checks whether the superpeers declared it failed (it also checks at
/// once whenever a connection is lost).
pub const SELF_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Deadline of one probe of a superpeer during that check.
const SELF_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `myriad peer` keeps answering `NotOwner` after it learned that it was declared
/// failed, before it exits (clients still routing to it are redirected meanwhile).
pub const DECLARED_FAILED_LINGER: Duration = Duration::from_secs(1);

/// Handler threads for chunk requests that may wait (locks, large inserts, writes that
/// wait for backups), fed by the inline handler.
struct SlowPath {
    sender: crossbeam_channel::Sender<(Arc<ChunkService>, NodeId, Bytes, Responder)>,
}

impl SlowPath {
    fn start(threads: usize) -> SlowPath {
        let (sender, receiver) =
            crossbeam_channel::bounded::<(Arc<ChunkService>, NodeId, Bytes, Responder)>(
                SLOW_PATH_QUEUE_MAX,
            );
        for index in 0..threads {
            let receiver = receiver.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("chunk-slow-{index}"))
                .spawn(move || {
                    // Ends when the handler (the only sender) is dropped with the endpoint.
                    for (service, from, payload, responder) in receiver {
                        let _ = responder.respond(service.serve(from, payload));
                    }
                });
            if let Err(error) = spawned {
                tracing::error!(%error, "could not start a chunk handler thread");
            }
        }
        SlowPath { sender }
    }

    fn submit(
        &self,
        service: Arc<ChunkService>,
        from: NodeId,
        payload: Bytes,
        responder: Responder,
    ) {
        if let Err(error) = self.sender.try_send((service, from, payload, responder)) {
            let (_, _, _, responder) = error.into_inner();
            let busy = ChunkReply::Failed(ItemError::Internal(
                "peer busy: too many chunk requests waiting".to_owned(),
            ));
            let _ = responder.respond(busy.encode());
        }
    }
}

/// What a peer needs to start.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// How to reach the superpeers and what to announce (role must be `Peer`).
    pub join: JoinConfig,
    /// Size of the memory manager's data region.
    pub memory_bytes: u64,
    /// Where the peer keeps its node ID (and, with backups, its logs).
    pub data_dir: PathBuf,
    /// Threads serving chunk requests that may wait (the rest run on the I/O thread).
    pub handler_threads: usize,
    /// Bytes of chunk memory kept resident above the allocator's top by a background
    /// thread ([`MemoryManager::keep_resident_ahead`]); 0 for none.
    pub prefault_bytes: u64,
    /// Replication of this peer's chunks and the backups it keeps for others (the latter
    /// only with [`Capabilities::BACKUP`] in `join.capabilities`).
    pub backup: BackupOptions,
}

/// Why a peer could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum PeerError {
    /// The data directory could not be read or written.
    #[error("data directory {path}: {error}")]
    DataDir {
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The node-ID file holds something else than a node ID.
    #[error("{path} does not hold a node ID: {content:?}")]
    BadNodeIdFile {
        /// The file.
        path: PathBuf,
        /// What it holds.
        content: String,
    },
    /// Joining the cluster failed.
    #[error(transparent)]
    Join(#[from] ClientError),
    /// The memory manager could not be created.
    #[error("memory manager: {0}")]
    Memory(#[from] myriad_mem::MemError),
    /// A handler could not be registered.
    #[error("messaging: {0}")]
    Net(#[from] myriad_net::NetError),
    /// The backup side (log engine, backup service) could not start.
    #[error("backups: {0}")]
    Backup(#[from] BackupStartError),
    /// The backup service's handler could not be registered.
    #[error("backups: {0}")]
    BackupService(#[from] myriad_replication::BackupError),
    /// The replicator could not start.
    #[error("replication: {0}")]
    Replica(#[from] myriad_replication::ReplicaError),
    /// The superpeers did not say where this incarnation's zone numbers and local IDs
    /// start, or refused their reservation.
    #[error("incarnation bases: {0}")]
    Bases(String),
    /// A thread could not be started.
    #[error("starting a thread: {0}")]
    Thread(std::io::Error),
}

/// A running peer.
pub struct PeerNode {
    endpoint: Option<Endpoint>,
    membership: Arc<Membership>,
    service: Arc<ChunkService>,
    events: tokio::task::JoinHandle<()>,
    shutdown_requested: Arc<AtomicBool>,
    backup: Option<Arc<BackupService>>,
    /// Logs the replicator's events until `replica_events_stop`.
    replica_events: Option<JoinHandle<()>>,
    /// Keeps the local-ID reservation ahead until `replica_events_stop`.
    lid_reserver: Option<JoinHandle<()>>,
    /// A restarted peer's watch for the end of its earlier incarnation's recovery.
    old_zones_watch: Option<JoinHandle<()>>,
    replica_events_stop: Arc<AtomicBool>,
    /// Checks whether this node was declared failed (`watch_self`).
    self_watch: tokio::task::JoinHandle<()>,
    /// The collector of logs no longer backed up here (with the backup capability).
    log_gc: Option<tokio::task::JoinHandle<()>>,
    /// The log line, once this node learned it was declared failed.
    declared_failed: Arc<OnceLock<String>>,
}

impl std::fmt::Debug for PeerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerNode")
            .field("node", &self.service.node())
            .finish_non_exhaustive()
    }
}

fn read_node_id(dir: &Path) -> Result<Option<NodeId>, PeerError> {
    let path = dir.join(NODE_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(content) => match content.trim().parse::<u16>() {
            Ok(id) => Ok(Some(NodeId(id))),
            Err(_) => Err(PeerError::BadNodeIdFile { path, content }),
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(PeerError::DataDir { path, error }),
    }
}

fn write_node_id(dir: &Path, id: NodeId) -> Result<(), PeerError> {
    let path = dir.join(NODE_ID_FILE);
    let temporary = dir.join(format!("{NODE_ID_FILE}.tmp"));
    let result = std::fs::write(&temporary, format!("{}\n", id.0))
        .and_then(|()| std::fs::rename(&temporary, &path));
    result.map_err(|error| PeerError::DataDir { path, error })
}

impl PeerNode {
    /// Joins the cluster and starts serving. Call from a thread outside any tokio runtime.
    pub fn start(options: PeerOptions) -> Result<PeerNode, PeerError> {
        std::fs::create_dir_all(&options.data_dir).map_err(|error| PeerError::DataDir {
            path: options.data_dir.clone(),
            error,
        })?;
        let mut join = options.join.clone();
        if join.reclaim.is_none() {
            join.reclaim = read_node_id(&options.data_dir)?;
        }

        // Handlers must exist before the endpoint starts; the service needs the node ID,
        // known only after the join. The cell bridges the two.
        let cell: Arc<OnceLock<Arc<ChunkService>>> = Arc::new(OnceLock::new());
        let mut handlers = Handlers::new();
        // Chunk requests arrive on the I/O thread. Those that cannot wait (reads, and
        // writes while nothing can make them wait) are served right there, the lowest
        // latency; the rest go to the peer's handler threads.
        let slow = SlowPath::start(options.handler_threads.max(1));
        let chunk_cell = Arc::clone(&cell);
        handlers.register_inline(types::CHUNK, move |mut incoming: Incoming| {
            if !incoming.is_request() {
                return;
            }
            let from = incoming.from;
            let Some(service) = chunk_cell.get() else {
                let reply =
                    ChunkReply::Failed(ItemError::Internal("peer is still starting".to_owned()));
                let _ = incoming.respond(reply.encode());
                return;
            };
            if service.can_serve_inline(&incoming.payload) {
                let reply = service.serve(from, incoming.payload.clone());
                let _ = incoming.respond(reply);
                return;
            }
            if let Some(reply) = service.serve_change_inline(from, &incoming.payload) {
                let _ = incoming.respond(reply);
                return;
            }
            if service.replicator().is_some()
                && myriad_proto::chunk::is_change_request(&incoming.payload)
            {
                // Replicated changes may wait for backups: blocking threads, many at once.
                service.serve_incoming(incoming);
                return;
            }
            if let Some(responder) = incoming.take_responder() {
                slow.submit(
                    Arc::clone(service),
                    from,
                    incoming.payload.clone(),
                    responder,
                );
            }
        })?;
        // The backup side must be live before any master may send to this peer, i.e.
        // before the join makes it a candidate.
        let backup = if join.capabilities.contains(Capabilities::BACKUP) {
            let dir = options.backup.log_dir_in(&options.data_dir);
            let service = Arc::new(open_backup_service(&dir, options.backup.log.clone())?);
            service.register(&mut handlers)?;
            Some(service)
        } else {
            None
        };
        let migrate_cell: Arc<OnceLock<Arc<Membership>>> = Arc::new(OnceLock::new());
        {
            let cell = Arc::clone(&cell);
            let membership = Arc::clone(&migrate_cell);
            handlers.register(types::MIGRATE, move |incoming: Incoming| {
                if !incoming.is_request() {
                    return;
                }
                let reply = match (cell.get(), membership.get()) {
                    (Some(service), Some(membership)) => {
                        match MigrateRequest::decode(incoming.payload.clone()) {
                            Ok(request) => migrate(service, membership, &request),
                            Err(error) => MigrateReply::Failed(error.to_string()),
                        }
                    }
                    _ => MigrateReply::Failed("peer is still starting".to_owned()),
                };
                let _ = incoming.respond(reply.encode());
            })?;
        }

        // Recovery of a failed peer's zones held here (issue 6): the superpeer leader's
        // requests; a peer without backups answers that it has none.
        {
            let cell = Arc::clone(&cell);
            let membership = Arc::clone(&migrate_cell);
            let backup = backup.clone();
            handlers.register(types::RECOVER, move |incoming: Incoming| {
                if !incoming.is_request() {
                    return;
                }
                match (&backup, cell.get(), membership.get()) {
                    (_, Some(service), _) if service.is_declared_failed() => {
                        let reply =
                            RecoverReply::Failed("this node was declared failed".to_owned());
                        let _ = incoming.respond(reply.encode());
                    }
                    (Some(backup), Some(service), Some(membership)) => {
                        crate::recovery::serve_recover(
                            Arc::clone(backup),
                            Arc::clone(service),
                            Arc::clone(membership),
                            incoming,
                        );
                    }
                    (None, _, _) => {
                        let reply = RecoverReply::Failed("this peer keeps no backups".to_owned());
                        let _ = incoming.respond(reply.encode());
                    }
                    _ => {
                        let reply = RecoverReply::Failed("peer is still starting".to_owned());
                        let _ = incoming.respond(reply.encode());
                    }
                }
            })?;
        }

        let shutdown_requested = Arc::new(AtomicBool::new(false));
        {
            let flag = Arc::clone(&shutdown_requested);
            handlers.register(types::NODE_SHUTDOWN, move |incoming: Incoming| {
                tracing::info!(from = ?incoming.from, "shutdown requested");
                flag.store(true, Ordering::Relaxed);
                if incoming.is_request() {
                    let _ = incoming.respond(Bytes::new());
                }
            })?;
        }
        let (rack, switch) = (join.rack, join.switch);
        let (endpoint, membership) = Membership::join_blocking(join, handlers)?;
        if let Some(backup) = &backup {
            backup.attach(membership.net().clone());
        }
        let me = membership.node_id();
        write_node_id(&options.data_dir, me)?;
        // A restarted peer starts above everything its earlier incarnation numbered: its
        // old zones are recovered by their backups meanwhile, under the old numbers.
        let bases = fetch_bases(&membership)?;
        if bases.lid_base > 0 || bases.zone_base > 0 {
            tracing::info!(node = %me, zone_base = bases.zone_base, lid_base = bases.lid_base, "new incarnation starts above the earlier one's zones and local IDs");
        }
        let mem = Arc::new(MemoryManager::new(MemoryConfig {
            node_id: me,
            region_bytes: options.memory_bytes,
            ..MemoryConfig::default()
        })?);
        mem.start_local_ids_at(bases.lid_base);
        if options.prefault_bytes > 0 {
            keep_memory_resident(Arc::downgrade(&mem), options.prefault_bytes);
        }
        let mut reserved = reserve_lids(&membership, bases.lid_base)?;
        let mut service =
            ChunkService::new(Arc::clone(&mem), me).with_lease(Arc::clone(membership.lease()));
        let replica_events_stop = Arc::new(AtomicBool::new(false));
        let mut replica_events = None;
        if options.backup.replication > 0 {
            let backup_options = &options.backup;
            let mut config = ReplicatorConfig::new(me);
            config.rack = rack;
            config.switch = switch;
            config.replication = backup_options.replication;
            config.zone_bytes = backup_options.zone_bytes;
            config.strategy = backup_options.strategy;
            config.default_durability = backup_options.durability;
            config.wait_timeout = backup_options.wait_timeout;
            config.unreachable_timeout = backup_options.unreachable_timeout;
            config.first_zone = bases.zone_base;
            let replicator = Arc::new(Replicator::new(
                config,
                membership.net().clone(),
                Arc::new(MembershipCandidates::new(Arc::clone(&membership), me)),
                Arc::new(MembershipRegistry::new(Arc::clone(&membership))),
                Arc::new(MemorySource::new(mem)),
            )?);
            replica_events = Some(follow_replica_events(
                &replicator,
                &membership,
                Arc::clone(&replica_events_stop),
            )?);
            service = service.with_replication(replicator, endpoint.runtime());
        }
        let lid_reserver = {
            let mem = Arc::clone(service.memory());
            let membership = Arc::clone(&membership);
            let stop = Arc::clone(&replica_events_stop);
            std::thread::Builder::new()
                .name(format!("lid-reserve-{}", me.0))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(LID_RESERVE_CHECK);
                        if mem.local_id_mark().saturating_add(LID_RESERVE_STEP / 2) < reserved {
                            continue;
                        }
                        match reserve_lids(&membership, mem.local_id_mark()) {
                            Ok(up_to) => reserved = up_to,
                            Err(error) => tracing::warn!(%error, "local-ID reservation not committed; retrying"),
                        }
                    }
                })
                .map_err(PeerError::Thread)?
        };
        let service = Arc::new(service);
        // The cell was empty until now; a second set cannot happen.
        let _ = cell.set(Arc::clone(&service));
        let _ = migrate_cell.set(Arc::clone(&membership));

        // Ownership ranges already committed before this peer joined.
        // A restarted peer does not hold what its earlier incarnation held: until the old
        // zones are recovered, it answers `NotOwner` for those CIDs (never a false
        // `NotFound`); the restorers' ownership events move them on.
        let restarted = bases.lid_base > 0;
        let old_zones_pending = Arc::new(AtomicBool::new(restarted));
        if restarted {
            service.set_owner(me, 0, bases.lid_base - 1, NOBODY);
        }
        let mine_as = if restarted { NOBODY } else { me };
        sync_ownership(&endpoint.runtime(), &membership, &service, mine_as, None);
        let old_zones_watch = if restarted {
            Some(watch_old_zones(
                Arc::clone(&service),
                Arc::clone(&membership),
                bases,
                Arc::clone(&old_zones_pending),
                Arc::clone(&replica_events_stop),
            )?)
        } else {
            None
        };
        let mut receiver = membership.subscribe();
        let resync_membership = Arc::clone(&membership);
        let pending_flag = Arc::clone(&old_zones_pending);
        let follower = Arc::clone(&service);
        let events_runtime = endpoint.runtime();
        let events = endpoint.runtime().spawn(async move {
            loop {
                match receiver.recv().await {
                    Ok(event) => {
                        apply_event(&follower, &event);
                        replicate_event(&follower, &events_runtime, &event);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        // Missed ownership events (e.g. a recovery's burst): reload the
                        // ownership ranges from the superpeers.
                        tracing::warn!(
                            missed,
                            "peer fell behind the cluster's events; reloading ownership"
                        );
                        let service = Arc::clone(&follower);
                        let membership = Arc::clone(&resync_membership);
                        let pending = Arc::clone(&pending_flag);
                        let runtime = events_runtime.clone();
                        let me = service.node();
                        events_runtime.spawn_blocking(move || {
                            let mine_as = if pending.load(Ordering::Acquire) {
                                NOBODY
                            } else {
                                me
                            };
                            sync_ownership(&runtime, &membership, &service, mine_as, None);
                        });
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        });
        let declared_failed = Arc::new(OnceLock::new());
        let self_watch = endpoint.runtime().spawn(watch_self(
            Arc::clone(&membership),
            Arc::clone(&service),
            Arc::clone(&declared_failed),
        ));
        // Logs of zones no longer backed up here are deleted after a grace period.
        let log_gc = backup.as_ref().map(|backup| {
            endpoint.runtime().spawn(crate::log_gc::run(
                Arc::clone(backup),
                Arc::clone(&membership),
                options.backup.log_gc,
            ))
        });
        tracing::info!(node = %me, address = %endpoint.local_addr(), "peer serving");
        Ok(PeerNode {
            log_gc,
            endpoint: Some(endpoint),
            membership,
            service,
            events,
            shutdown_requested,
            backup,
            replica_events,
            lid_reserver: Some(lid_reserver),
            old_zones_watch,
            replica_events_stop,
            self_watch,
            declared_failed,
        })
    }

    /// Whether the superpeers declared this node failed (it was paused or cut off while
    /// its zones were recovered elsewhere): the log line saying so, once this node learned
    /// it. The chunk service then answers `NotOwner` to everything; the process should
    /// exit (see the module documentation).
    pub fn declared_failed(&self) -> Option<&str> {
        self.declared_failed.get().map(String::as_str)
    }

    /// This peer's node ID.
    pub fn node_id(&self) -> NodeId {
        self.service.node()
    }

    /// The address the peer listens on.
    pub fn address(&self) -> std::net::SocketAddr {
        match &self.endpoint {
            Some(endpoint) => endpoint.local_addr(),
            None => std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
        }
    }

    /// The chunk service (for in-process applications and tests).
    pub fn service(&self) -> &Arc<ChunkService> {
        &self.service
    }

    /// The peer's view of the cluster.
    pub fn membership(&self) -> &Arc<Membership> {
        &self.membership
    }

    /// The backup service holding other peers' zones (present with the backup
    /// capability), e.g. to read a zone back.
    pub fn backup_service(&self) -> Option<&Arc<BackupService>> {
        self.backup.as_ref()
    }

    /// The replicator of this peer's chunks (present when `backup.replication > 0`).
    pub fn replicator(&self) -> Option<&Arc<Replicator>> {
        self.service.replicator()
    }

    /// Whether an operator asked this peer to shut down ([`types::NODE_SHUTDOWN`]); the
    /// process that runs the peer polls it and then calls [`PeerNode::shutdown`].
    pub fn shutdown_requested(&self) -> bool {
        self.shutdown_requested.load(Ordering::Relaxed)
    }

    /// A client handle for an application running inside this peer: the same API as a
    /// remote client, with this peer's own chunks served in-process (no network hop).
    pub fn client(&self) -> myriad_client::client::Client {
        let chunks = myriad_client::chunk::Chunks::new(
            self.membership.net().clone(),
            Arc::clone(&self.membership),
            myriad_client::chunk::ChunkOptions::default(),
        )
        .with_local(Arc::clone(&self.service) as Arc<dyn myriad_client::chunk::LocalChunks>);
        myriad_client::client::Client::from_parts(Arc::clone(&self.membership), chunks)
    }

    /// Leaves the cluster in an orderly way and stops serving.
    pub fn shutdown(mut self) {
        self.stop(true);
    }

    /// Stops at once without leaving, as a crash would: connections drop, nothing is
    /// announced, so the superpeers declare this node failed (its zones are recovered, the
    /// zones it backed up get replacements). For failure tests in one process.
    pub fn crash(mut self) {
        self.stop(false);
    }

    fn stop(&mut self, leave: bool) {
        if let Some(endpoint) = self.endpoint.take() {
            let membership = Arc::clone(&self.membership);
            let runtime = endpoint.runtime();
            self.self_watch.abort();
            if let Some(log_gc) = &self.log_gc {
                log_gc.abort();
            }
            // A node declared failed is no member any more: nothing to leave.
            if leave
                && tokio::runtime::Handle::try_current().is_err()
                && self.declared_failed.get().is_none()
            {
                if let Err(error) = runtime.block_on(async move {
                    tokio::time::timeout(Duration::from_secs(2), membership.leave()).await
                }) {
                    tracing::warn!(%error, "leave did not complete");
                }
            }
            self.events.abort();
            self.replica_events_stop.store(true, Ordering::Relaxed);
            if let Some(thread) = self.replica_events.take() {
                let _ = thread.join();
            }
            if let Some(thread) = self.lid_reserver.take() {
                let _ = thread.join();
            }
            if let Some(thread) = self.old_zones_watch.take() {
                let _ = thread.join();
            }
            endpoint.shutdown();
            // The log engine stops when the last handle goes (the handlers held one).
            self.backup = None;
        }
    }
}

impl Drop for PeerNode {
    fn drop(&mut self) {
        self.stop(true);
    }
}

/// Slept after every 2 MiB made resident ahead (see [`MemoryManager::prefault`]): at
/// most about 1 GiB/s, and the CPU shared with heartbeats and requests.
const PREFAULT_PAUSE: Duration = Duration::from_millis(2);
/// Most bytes made resident per look at the reserve (at most 320 MB/s with the pauses).
const RESERVE_STEP_BYTES: u64 = 32 << 20;
/// How often the reserve of resident memory is looked at.
const RESERVE_POLL: Duration = Duration::from_millis(100);
/// A top that moved more than this since the last look is a burst of creates (a
/// recovery, a bulk load) under way: the reserve is topped up after it, not during it,
/// so that the burst has the CPU.
const RESERVE_BURST_BYTES: u64 = 16 << 20;

/// Starts the thread that keeps `reserve` bytes of chunk memory above the allocator's
/// top resident (`peer.prefault_mb`, [`MemoryManager::keep_resident_ahead`]): chunks a
/// recovery restores here then land in pages zeroed beforehand. It ends with the memory
/// manager (it holds it only while topping up).
fn keep_memory_resident(mem: std::sync::Weak<MemoryManager>, reserve: u64) {
    let spawned = std::thread::Builder::new()
        .name("prefault".into())
        .spawn(move || {
            let mut last_top = None;
            let mut reported = false;
            loop {
                let Some(mem) = mem.upgrade() else {
                    return;
                };
                let top = mem.top_bytes();
                let burst = last_top.is_some_and(|last| top > last + RESERVE_BURST_BYTES);
                last_top = Some(top);
                if !burst {
                    let started = Instant::now();
                    // Paced: a peer that prefaults must still answer its heartbeats.
                    match mem.keep_resident_ahead(reserve, RESERVE_STEP_BYTES, PREFAULT_PAUSE) {
                        Ok(done) if done > 0 && !reported => {
                            reported = true;
                            tracing::info!(
                                reserve,
                                resident = done,
                                ms = started.elapsed().as_millis() as u64,
                                "chunk memory made resident ahead of use"
                            );
                        }
                        Ok(_) => {}
                        Err(error) => {
                            tracing::warn!(%error, "could not make chunk memory resident");
                            return;
                        }
                    }
                }
                drop(mem);
                std::thread::sleep(RESERVE_POLL);
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "could not start the prefault thread");
    }
}

/// The owner a restarted peer records for CIDs its earlier incarnation held until they are
/// recovered (node ID 0 is never assigned), so that it answers `NotOwner` for them.
pub const NOBODY: NodeId = NodeId(0);
/// How often a restarted peer asks whether its earlier incarnation's zones are recovered.
const OLD_ZONES_POLL: Duration = Duration::from_millis(250);

/// Starts the thread that waits until no zone of the earlier incarnations is due for
/// recovery any more (all adopted by their restorers, or lost), then routes the CIDs still routed to this peer to
/// itself again: they answer `NotFound` from then on (removed, or lost).
fn watch_old_zones(
    service: Arc<ChunkService>,
    membership: Arc<Membership>,
    bases: myriad_meta::PeerBases,
    pending: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, PeerError> {
    let me = membership.node_id();
    std::thread::Builder::new()
        .name(format!("old-zones-{}", me.0))
        .spawn(move || {
            let runtime = membership.net().runtime();
            while !stop.load(Ordering::Relaxed) {
                let asking = Arc::clone(&membership);
                let reply = runtime.block_on(async move {
                    asking
                        .request(myriad_proto::meta::MetaRequest::ZonesDue(me))
                        .await
                });
                if let Ok(myriad_proto::meta::MetaReply::Zones(zones)) = reply {
                    if zones.iter().all(|(zone, _)| *zone >= bases.zone_base) {
                        // The earlier IDs come back to this peer, except the ranges the
                        // restorers took over: both in one step, from the ranges committed
                        // by now (every restorer's commits came before its zone settled).
                        // Setting the IDs first and loading the ranges after left a window
                        // in which this peer answered a false `NotFound` for chunks that
                        // live at a restorer.
                        let Ok(ranges) = lookup_tree(&runtime, &membership, me) else {
                            std::thread::sleep(OLD_ZONES_POLL);
                            continue;
                        };
                        let mut view = vec![(0, bases.lid_base - 1, me)];
                        view.extend(ranges);
                        service.set_owners(me, &view);
                        pending.store(false, Ordering::Release);
                        // The other creators' ranges (this peer's own are set just now).
                        sync_ownership(&runtime, &membership, &service, me, Some(me));
                        tracing::info!(node = %me, "the earlier incarnation's zones are recovered");
                        return;
                    }
                }
                std::thread::sleep(OLD_ZONES_POLL);
            }
        })
        .map_err(PeerError::Thread)
}

/// Where this incarnation's zone numbers and fresh local IDs start (asked right after the
/// join; the join itself set them).
fn fetch_bases(membership: &Arc<Membership>) -> Result<myriad_meta::PeerBases, PeerError> {
    let me = membership.node_id();
    let asking = Arc::clone(membership);
    let reply = membership.net().runtime().block_on(async move {
        asking
            .request(myriad_proto::meta::MetaRequest::Bases(me))
            .await
    });
    match reply {
        Ok(myriad_proto::meta::MetaReply::Bases(bases)) => Ok(bases),
        Ok(other) => Err(PeerError::Bases(format!("unexpected reply {other:?}"))),
        Err(error) => Err(PeerError::Bases(error.to_string())),
    }
}

/// Commits a reservation of [`LID_RESERVE_STEP`] local IDs above `from`; the new bound.
fn reserve_lids(membership: &Arc<Membership>, from: u64) -> Result<u64, PeerError> {
    let up_to = from
        .saturating_add(LID_RESERVE_STEP)
        .min(myriad_types::LOCAL_ID_MAX + 1);
    let command = Command::ReserveLids {
        node: membership.node_id(),
        up_to,
    };
    let writer = Arc::clone(membership);
    membership
        .net()
        .runtime()
        .block_on(async move { writer.write(command).await })
        .map_err(|error| PeerError::Bases(format!("reserving local IDs: {error}")))?;
    Ok(up_to)
}

/// Loads the ownership ranges committed before this peer joined into its chunk service.
///
/// Ranges routed to this peer are recorded with owner `mine_as`: this peer's ID, or
/// [`NOBODY`] while a restarted peer's earlier incarnation is being recovered (the chunks
/// routed to it are then in its backups' logs, not in its memory).
fn sync_ownership(
    runtime: &tokio::runtime::Handle,
    membership: &Arc<Membership>,
    service: &ChunkService,
    mine_as: NodeId,
    skip: Option<NodeId>,
) {
    let me = membership.node_id();
    let creators: Vec<NodeId> = membership
        .nodes()
        .into_iter()
        .filter(|record| record.role == myriad_meta::Role::Peer && Some(record.id) != skip)
        .map(|record| record.id)
        .collect();
    for creator in creators {
        match lookup_tree(runtime, membership, creator) {
            Ok(ranges) => {
                for (first, last, owner) in ranges {
                    let owner = if owner == me { mine_as } else { owner };
                    service.set_owner(creator, first, last, owner);
                }
            }
            Err(error) => tracing::warn!(%error, %creator, "could not load ownership ranges"),
        }
    }
}

/// The ownership ranges of `creator`'s local IDs the superpeers hold: (first, last, owner).
fn lookup_tree(
    runtime: &tokio::runtime::Handle,
    membership: &Arc<Membership>,
    creator: NodeId,
) -> Result<Vec<(u64, u64, NodeId)>, String> {
    let asking = Arc::clone(membership);
    let reply = runtime.block_on(async move {
        asking
            .request(myriad_proto::meta::MetaRequest::LookupTree(creator))
            .await
    });
    match reply {
        Ok(myriad_proto::meta::MetaReply::LookupTree(ranges)) => Ok(ranges),
        Ok(other) => Err(format!(
            "unexpected reply to a lookup-tree request: {other:?}"
        )),
        Err(error) => Err(error.to_string()),
    }
}

fn apply_event(service: &ChunkService, event: &Event) {
    match event {
        Event::OwnerChanged {
            creator,
            first,
            last,
            owner,
        } => service.set_owner(*creator, *first, *last, *owner),
        Event::NodeFailed(node) | Event::NodeLeft(node) => {
            let released = service.release_locks_of(*node);
            if released > 0 {
                tracing::info!(%node, released, "released the chunk locks of a gone node");
            }
        }
        Event::NodeJoined(_) => {}
    }
}

/// Checks until this node learns that it was declared failed (see the module
/// documentation), then stops its chunk service and records the log line in `verdict`.
async fn watch_self(
    membership: Arc<Membership>,
    service: Arc<ChunkService>,
    verdict: Arc<OnceLock<String>>,
) {
    let net = membership.net().clone();
    let mut lost = net.subscribe();
    let mut ticker = tokio::time::interval(SELF_CHECK_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut turn = 0usize;
    loop {
        let all = tokio::select! {
            _ = ticker.tick() => false,
            event = lost.recv() => match event {
                Some(_) => true,
                None => return,
            },
        };
        if let Some(line) = self_verdict(&membership, all, &mut turn).await {
            service.declare_failed();
            tracing::error!(node = %membership.node_id(), "{line}");
            let _ = verdict.set(line);
            return;
        }
    }
}

/// One check: `Some(log line)` if this node was declared failed. Probes every superpeer
/// when `all`, else the next one in turn.
async fn self_verdict(membership: &Membership, all: bool, turn: &mut usize) -> Option<String> {
    let me = membership.node_id();
    if let Some(record) = membership.node(me) {
        if let NodeState::Failed { epoch } = record.state {
            return Some(format!(
                "this node was declared failed at epoch {epoch}; shutting down"
            ));
        }
    }
    let superpeers = membership.superpeers();
    if superpeers.is_empty() {
        return None;
    }
    let chosen: Vec<NodeId> = if all {
        superpeers.iter().map(|(id, _)| *id).collect()
    } else {
        *turn = turn.wrapping_add(1);
        vec![superpeers[*turn % superpeers.len()].0]
    };
    let epoch = membership.epoch();
    let probes = chosen.into_iter().map(|superpeer| {
        let net = membership.net().clone();
        async move {
            let target = superpeer;
            let reply = net
                .request(
                    target,
                    types::HEARTBEAT,
                    // Acknowledges nothing: a superpeer's answer renews no lease of ours.
                    Heartbeat {
                        epoch,
                        acked: 0,
                        lease_ms: 0,
                    }
                    .encode(),
                    SELF_PROBE_TIMEOUT,
                )
                .await;
            match reply {
                // Superpeers are never fenced on this side: the superpeer refused us.
                Err(NetError::Fenced(node)) if node == target => Some(format!(
                    "this node was declared failed at an epoch after {epoch} (superpeer \
                     {superpeer} refuses it); shutting down"
                )),
                Ok(bytes) => {
                    if let Ok(reply) = HeartbeatReply::decode(bytes) {
                        tracing::trace!(%superpeer, epoch = reply.epoch, "superpeer answers");
                    }
                    None
                }
                Err(_) => None,
            }
        }
    });
    futures_util::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .next()
}

/// Replication's part of a cluster event: a failed or departed node is replaced in every
/// zone it backs, a joined peer fills under-replicated zones. Runs the replicator's calls
/// on a blocking thread (they take its state lock and may wait for registrations).
fn replicate_event(service: &Arc<ChunkService>, runtime: &tokio::runtime::Handle, event: &Event) {
    let Some(replicator) = service.replicator() else {
        return;
    };
    let replicator = Arc::clone(replicator);
    match event {
        Event::NodeFailed(node) | Event::NodeLeft(node) => {
            let node = *node;
            runtime.spawn_blocking(move || {
                let changed = replicator.replace_backup(node);
                if !changed.is_empty() {
                    tracing::info!(%node, zones = changed.len(), ?changed, "replaced a gone backup");
                }
            });
        }
        Event::NodeJoined(record) => {
            // A new incarnation of a backup lost its streams' state (a restart): streams
            // to it cannot go on, so it is replaced like a failed backup first, and may be
            // chosen again with a fresh stream.
            let restarted = (record.incarnation > 1 && record.role == myriad_meta::Role::Peer)
                .then_some(record.id);
            runtime.spawn_blocking(move || {
                if let Some(node) = restarted {
                    let changed = replicator.replace_backup(node);
                    if !changed.is_empty() {
                        tracing::info!(%node, zones = changed.len(), "replaced a restarted backup");
                    }
                }
                let changed = replicator.fill_zones();
                if !changed.is_empty() {
                    tracing::info!(zones = changed.len(), ?changed, "gave zones more backups");
                }
            });
        }
        Event::OwnerChanged { .. } => {}
    }
}

/// Starts the thread that logs the replicator's events and reports unreachable backups
/// to the superpeers. It ends once `stop` is set.
fn follow_replica_events(
    replicator: &Replicator,
    membership: &Arc<Membership>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, PeerError> {
    let receiver = replicator.events();
    let membership = Arc::clone(membership);
    let runtime = membership.net().runtime();
    std::thread::Builder::new()
        .name(format!("replica-events-{}", membership.node_id().0))
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(event) = receiver.recv_timeout(Duration::from_millis(100)) else {
                    continue;
                };
                match &event {
                    ReplicaEvent::BackupUnreachable(node) => {
                        tracing::warn!(%node, "backup unreachable; reporting it");
                        let membership = Arc::clone(&membership);
                        let node = *node;
                        runtime.block_on(async move { membership.report_failure(node).await });
                    }
                    ReplicaEvent::BackupRefused { backup, reason } => {
                        tracing::warn!(%backup, %reason, "backup refuses replication");
                    }
                    ReplicaEvent::ResyncDone {
                        zone,
                        backup,
                        chunks,
                    } => tracing::info!(zone, %backup, chunks, "zone re-replicated"),
                    ReplicaEvent::ResyncFailed {
                        zone,
                        backup,
                        reason,
                    } => tracing::warn!(zone, %backup, %reason, "re-replication failed"),
                }
            }
        })
        .map_err(PeerError::Thread)
}

/// How long migration waits for each chunk's write lock.
const MIGRATE_LOCK_WAIT: Duration = Duration::from_secs(2);
/// How long the target may take to store the copies.
const MIGRATE_INSERT_TIMEOUT: Duration = Duration::from_secs(30);

/// Moves `request.first..=request.last` (CIDs of one creator that this peer owns) to
/// `request.to`: write-lock the chunks, copy them to the target with an insert, commit the
/// new owner, then drop the local copies. Runs on a handler thread (it blocks).
///
/// A put that passed the ownership check before the locks were taken and waits on a lock
/// writes the old copy after the unlock; since the new owner is committed to the service
/// (`set_owner`) before the unlock, that put sees the ownership change and is answered
/// `NotOwner` (the client retries at the new owner) instead of being acknowledged and
/// lost with the old copy (`ChunkService` put path; test
/// `a_put_waiting_on_a_migrating_chunk_is_refused_not_lost`; a write-at likewise). A
/// remove or resize waiting on a lock is not covered yet.
fn migrate(
    service: &ChunkService,
    membership: &Arc<Membership>,
    request: &MigrateRequest,
) -> MigrateReply {
    let me = service.node();
    if service.is_declared_failed() {
        return MigrateReply::Failed("this node was declared failed".to_owned());
    }
    if request.to == me {
        return MigrateReply::Failed("the target is this peer".to_owned());
    }
    if !membership.is_alive(request.to) {
        return MigrateReply::Failed(format!("target {} is not an alive member", request.to));
    }
    let (first, last) = (request.first.local_id(), request.last.local_id());
    let creator = request.first.creator();
    if last - first >= MIGRATE_CHUNKS_MAX {
        return MigrateReply::Failed(format!("at most {MIGRATE_CHUNKS_MAX} CIDs per migration"));
    }
    for lid in [first, last] {
        if let Some(cid) = ChunkId::new(creator, lid) {
            if service.owner_of(cid) != me {
                return MigrateReply::Failed(format!("{cid} is not owned by this peer"));
            }
        }
    }
    let mem = service.memory();
    // Chunk reads are served inline only while no lock is held; this migration's locks
    // are not tracked by the service, so it switches inline serving off meanwhile.
    let _inline_off = service.migration_guard();
    let mut locked = Vec::new();
    let unlock_all = |locked: &[ChunkId]| {
        for &cid in locked {
            let _ = mem.unlock_write(cid);
        }
    };
    let mut items = Vec::new();
    for lid in first..=last {
        let Some(cid) = ChunkId::new(creator, lid) else {
            continue;
        };
        if !mem.exists(cid) {
            continue;
        }
        if let Err(error) = mem.lock_write(cid, MIGRATE_LOCK_WAIT) {
            unlock_all(&locked);
            return MigrateReply::Failed(format!("locking {cid}: {error}"));
        }
        locked.push(cid);
        let size = mem.size(cid).unwrap_or(0);
        let mut data = vec![0u8; size];
        match mem.get_locked(cid, &mut data) {
            Ok(length) => {
                data.truncate(length);
                items.push((cid, Bytes::from(data)));
            }
            Err(error) => {
                unlock_all(&locked);
                return MigrateReply::Failed(format!("reading {cid}: {error}"));
            }
        }
    }
    let moved = items.len() as u64;
    let sizes: Vec<usize> = items.iter().map(|(_, data)| data.len()).collect();
    let insert = ChunkRequest::Insert {
        durability: 0,
        items,
    };
    let reply = membership.net().request_blocking(
        request.to,
        types::CHUNK,
        insert.encode(),
        MIGRATE_INSERT_TIMEOUT,
    );
    let stored = match reply.map(ChunkReply::decode) {
        Ok(Ok(ChunkReply::Statuses(statuses))) => statuses
            .iter()
            .find_map(|status| status.as_ref().err().cloned())
            .map_or(Ok(()), |error| {
                Err(format!("the target refused a chunk: {error}"))
            }),
        Ok(Ok(other)) => Err(format!("unexpected reply from the target: {other:?}")),
        Ok(Err(error)) => Err(format!("malformed reply from the target: {error}")),
        Err(error) => Err(format!("the target did not answer: {error}")),
    };
    if let Err(reason) = stored {
        unlock_all(&locked);
        return MigrateReply::Failed(reason);
    }
    let command = Command::SetOwner {
        creator,
        first,
        last,
        owner: request.to,
    };
    let writer = Arc::clone(membership);
    let committed = membership
        .net()
        .runtime()
        .block_on(async move { writer.write(command).await });
    if let Err(error) = committed {
        unlock_all(&locked);
        // The target holds copies nobody routes to; they are harmless and overwritten by a
        // later migration of the same range.
        return MigrateReply::Failed(format!("committing the new owner: {error}"));
    }
    service.set_owner(creator, first, last, request.to);
    unlock_all(&locked);
    for (cid, size) in locked.into_iter().zip(sizes) {
        if let Err(error) = mem.remove(cid) {
            tracing::warn!(%cid, %error, "could not drop a migrated chunk's old copy");
            continue;
        }
        // The new owner replicates its copy; this peer's backups drop theirs.
        if let Err(error) = service.replicate_removed(cid, size) {
            tracing::warn!(%cid, %error, "backups of a migrated chunk's old copy not removed");
        }
    }
    MigrateReply::Moved(moved)
}
