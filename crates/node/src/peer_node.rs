//! The peer process: joins the cluster, stores chunks in a memory manager and serves them.
//!
//! # Job
//! [`PeerNode::start`] joins through the superpeers (reclaiming the node ID kept in the data
//! directory, so a restarted peer keeps its identity), creates the memory manager under the
//! assigned ID, registers the chunk service ([`crate::peer::ChunkService`]) and the
//! migration handler, and follows the group's events: ownership changes update the
//! service's ownership view; a node that failed or left loses the chunk locks it held here.
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
use std::time::Duration;

use bytes::Bytes;
use myriad_client::directory::Directory;
use myriad_client::membership::{JoinConfig, Membership};
use myriad_client::ClientError;
use myriad_mem::{ChunkId, MemoryConfig, MemoryManager, NodeId};
use myriad_meta::{Capabilities, Command};
use myriad_net::{Endpoint, Handlers, Incoming, Responder};
use myriad_proto::chunk::{ChunkReply, ChunkRequest, ItemError};
use myriad_proto::meta::Event;
use myriad_proto::migrate::{MigrateReply, MigrateRequest};
use myriad_proto::recovery::RecoverReply;
use myriad_proto::types;
use myriad_replica::{BackupService, ReplicaEvent, Replicator, ReplicatorConfig};
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

/// Chunk requests waiting for a handler thread, at most (more are refused as "busy").
pub const SLOW_PATH_QUEUE_MAX: usize = 16_384;

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
    BackupService(#[from] myriad_replica::BackupError),
    /// The replicator could not start.
    #[error("replication: {0}")]
    Replica(#[from] myriad_replica::ReplicaError),
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
    replica_events_stop: Arc<AtomicBool>,
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
            let from = myriad_proto::node_id(incoming.from);
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
        let mem = Arc::new(MemoryManager::new(MemoryConfig {
            node_id: me,
            region_bytes: options.memory_bytes,
            ..MemoryConfig::default()
        })?);
        let mut service = ChunkService::new(Arc::clone(&mem), me);
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
        let service = Arc::new(service);
        // The cell was empty until now; a second set cannot happen.
        let _ = cell.set(Arc::clone(&service));
        let _ = migrate_cell.set(Arc::clone(&membership));

        // Ownership ranges already committed before this peer joined.
        sync_ownership(&endpoint.runtime(), &membership, &service);
        let mut receiver = membership.subscribe();
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
                        tracing::warn!(missed, "peer fell behind the cluster's events");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        });
        tracing::info!(node = %me, address = %endpoint.local_addr(), "peer serving");
        Ok(PeerNode {
            endpoint: Some(endpoint),
            membership,
            service,
            events,
            shutdown_requested,
            backup,
            replica_events,
            replica_events_stop,
        })
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
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(endpoint) = self.endpoint.take() {
            let membership = Arc::clone(&self.membership);
            let runtime = endpoint.runtime();
            if tokio::runtime::Handle::try_current().is_err() {
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
            endpoint.shutdown();
            // The log engine stops when the last handle goes (the handlers held one).
            self.backup = None;
        }
    }
}

impl Drop for PeerNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Loads the ownership ranges committed before this peer joined into its chunk service.
fn sync_ownership(
    runtime: &tokio::runtime::Handle,
    membership: &Arc<Membership>,
    service: &ChunkService,
) {
    let creators: Vec<NodeId> = membership
        .nodes()
        .into_iter()
        .filter(|record| record.role == myriad_meta::Role::Peer)
        .map(|record| record.id)
        .collect();
    for creator in creators {
        let membership = Arc::clone(membership);
        let reply = runtime.block_on(async move {
            membership
                .request(myriad_proto::meta::MetaRequest::LookupTree(creator))
                .await
        });
        match reply {
            Ok(myriad_proto::meta::MetaReply::LookupTree(ranges)) => {
                for (first, last, owner) in ranges {
                    service.set_owner(creator, first, last, owner);
                }
            }
            Ok(other) => tracing::warn!(?other, "unexpected reply to a lookup-tree request"),
            Err(error) => tracing::warn!(%error, %creator, "could not load ownership ranges"),
        }
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
        Event::NodeJoined(_) => {
            runtime.spawn_blocking(move || {
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
        myriad_proto::net_id(request.to),
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
