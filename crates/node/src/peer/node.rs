//! The peer process: joins the cluster, stores chunks in a memory manager and serves them.
//!
//! # Job
//! [`PeerNode::start`] joins through the superpeers (reclaiming the node ID kept in the data
//! directory, so a restarted peer keeps its identity), registers every request handler
//! through the one dispatch ([`super::PeerDispatch`]: chunk service, migration, recovery,
//! shutdown), creates the memory manager and the chunk service ([`super::ChunkService`])
//! under the assigned ID, and follows the group's events: ownership changes update the
//! service's ownership view (reloaded from the superpeers when the peer misses events, e.g.
//! in a recovery's burst of them); a node that failed or left loses the chunk locks it held
//! here.
//!
//! # Restarts
//! A peer restarted with its data directory is a new incarnation of its node ID: it asks
//! the superpeers for its bases ([`myriad_proto::meta::MetaRequest::Bases`]) and numbers
//! its zones and fresh local IDs above everything the earlier incarnation registered or
//! reserved; its earlier zones are recovered by their backups meanwhile, and until none is
//! left it records the CIDs routed to it as owned by [`super::NOBODY`] (answering `NotOwner`). A
//! background thread keeps a local-ID reservation ([`super::LID_RESERVE_STEP`]) ahead of the
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
//! [`myriad_replication::ReplicaEvent`] is logged.
//!
//! # Declared failed (fencing of a paused or partitioned peer)
//! A peer that was paused (SIGSTOP, a stalled VM) or cut off long enough is declared failed
//! by the superpeers; its zones are recovered by its backups, and the superpeer leader, the
//! peers and the clients fence it in the messaging layer: its replication and ownership
//! messages are dropped, its connections refused. When it runs again it must learn this
//! and stop serving, since its memory is stale. A task (`watch_self`) checks every
//! [`super::SELF_CHECK_INTERVAL`], and at once whenever a connection is lost: its own record in
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
use std::time::Duration;

use myriad_compute::{ComputeConfig, ComputeService, PeerEnv, Registry};
use myriad_mem::{MemoryConfig, MemoryManager};
use myriad_membership::{JoinConfig, Membership, MembershipError};
use myriad_meta::Capabilities;
use myriad_net::{Endpoint, Handlers};
use myriad_replication::{BackupService, Replicator, ReplicatorConfig};
use myriad_types::NodeId;
use thiserror::Error;

use super::background::{follow_replica_events, keep_memory_resident, replicate_event};
use super::dispatch::PeerDispatch;
use super::incarnation::{fetch_bases, reserve_lids, spawn_lid_reserver};
use super::ownership::{apply_event, sync_ownership, watch_old_zones, NOBODY};
use super::self_watch::watch_self;
use super::service::ChunkService;
use crate::replication::{
    open_backup_service, BackupOptions, BackupStartError, MembershipCandidates, MembershipRegistry,
    MemorySource,
};

/// Name of the file in the data directory that keeps the peer's node ID across restarts.
pub const NODE_ID_FILE: &str = "node-id";

/// How long `myriad peer` keeps answering `NotOwner` after it learned that it was declared
/// failed, before it exits (clients still routing to it are redirected meanwhile).
pub const DECLARED_FAILED_LINGER: Duration = Duration::from_secs(1);

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
    /// The compute service: its settings and what it can run (jobs, tasks, applications).
    /// It runs jobs and tasks only with [`Capabilities::COMPUTE`] in `join.capabilities`.
    pub compute: ComputeSetup,
}

/// The compute service of a peer: settings and registry ([`myriad_compute`]).
#[derive(Debug, Clone)]
pub struct ComputeSetup {
    /// Workers, group and role, applications to start.
    pub config: ComputeConfig,
    /// The jobs, tasks and applications this peer binary provides.
    pub registry: Registry,
}

impl Default for ComputeSetup {
    /// Default settings (no group role, one worker per CPU) and the built-ins.
    fn default() -> Self {
        ComputeSetup {
            config: ComputeConfig::default(),
            registry: Registry::with_builtins(),
        }
    }
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
    Join(#[from] MembershipError),
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
    /// Pushes monitoring summaries to the superpeers (`ops::monitor`).
    monitor: tokio::task::JoinHandle<()>,
    /// The log line, once this node learned it was declared failed.
    declared_failed: Arc<OnceLock<String>>,
    /// Jobs, compute groups and applications.
    compute: Arc<ComputeService>,
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

/// What [`PeerNode::start`] has running once the peer has joined and serves chunks.
struct Started {
    endpoint: Endpoint,
    membership: Arc<Membership>,
    service: Arc<ChunkService>,
    bases: myriad_meta::PeerBases,
    replica_events: Option<JoinHandle<()>>,
    lid_reserver: JoinHandle<()>,
}

impl PeerNode {
    /// Joins the cluster and starts serving. Call from a thread outside any tokio runtime.
    ///
    /// The steps, in order: open the data directory (reclaiming the node ID kept there),
    /// open the backup side and register every handler ([`PeerDispatch`]), join, create
    /// the memory manager and the chunk service (with its replicator), load the ownership
    /// view and follow the cluster's events, then start the self-check and the log
    /// collector.
    pub fn start(options: PeerOptions) -> Result<PeerNode, PeerError> {
        let join = open_data_dir(&options)?;
        let mut handlers = Handlers::new();
        // The backup side must be live before any master may send to this peer, i.e.
        // before the join makes it a candidate.
        let backup = open_backup(&options, &join)?;
        let dispatch =
            PeerDispatch::register(&mut handlers, backup.as_ref(), options.handler_threads)?;
        let superpeers: Vec<_> = join.superpeers.iter().map(|(id, _)| *id).collect();
        dispatch.restrict_roles(&mut handlers, &superpeers, backup.is_some())?;
        let compute = start_compute(&options, &join, &mut handlers)?;
        let stop = Arc::new(AtomicBool::new(false));
        let started = join_and_serve(&options, join, handlers, &backup, &stop)?;
        let Started {
            endpoint,
            membership,
            service,
            bases,
            replica_events,
            lid_reserver,
        } = started;
        dispatch.serve(Arc::clone(&service));
        dispatch.attach_membership(Arc::clone(&membership));
        let runtime = endpoint.runtime();
        let (old_zones_pending, old_zones_watch) =
            load_ownership(&runtime, &membership, &service, bases, &stop)?;
        let events = follow_cluster_events(
            &runtime,
            &membership,
            &service,
            backup.clone(),
            old_zones_pending,
        );
        let declared_failed = Arc::new(OnceLock::new());
        let self_watch = runtime.spawn(watch_self(
            Arc::clone(&membership),
            Arc::clone(&service),
            Arc::clone(&declared_failed),
        ));
        // Logs of zones no longer backed up here are deleted after a grace period.
        let log_gc = backup.as_ref().map(|backup| {
            runtime.spawn(crate::log_gc::run(
                Arc::clone(backup),
                Arc::clone(&membership),
                options.backup.log_gc,
            ))
        });
        // Summaries for the superpeers' monitoring (DXMonitor), every few seconds.
        let monitor = runtime.spawn(crate::ops::monitor::push_reports(
            Arc::clone(&service),
            Arc::clone(&membership),
            backup.clone(),
        ));
        compute.attach(PeerEnv {
            client: local_client(&membership, &service),
            local: Arc::clone(&service) as Arc<dyn myriad_client::chunk::LocalChunks>,
            membership: Arc::clone(&membership),
        });
        tracing::info!(node = %membership.node_id(), address = %endpoint.local_addr(), "peer serving");
        Ok(PeerNode {
            compute,
            log_gc,
            monitor,
            endpoint: Some(endpoint),
            membership,
            service,
            events,
            shutdown_requested: Arc::clone(dispatch.shutdown_requested()),
            backup,
            replica_events,
            lid_reserver: Some(lid_reserver),
            old_zones_watch,
            replica_events_stop: stop,
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

    /// Whether an operator asked this peer to shut down ([`myriad_proto::types::NODE_SHUTDOWN`]); the
    /// process that runs the peer polls it and then calls [`PeerNode::shutdown`].
    pub fn shutdown_requested(&self) -> bool {
        self.shutdown_requested.load(Ordering::Relaxed)
    }

    /// A client handle for an application running inside this peer: the same API as a
    /// remote client, with this peer's own chunks served in-process (no network hop).
    pub fn client(&self) -> myriad_client::client::Client {
        local_client(&self.membership, &self.service)
    }

    /// The compute service: local jobs, the peer's group role, its applications.
    pub fn compute(&self) -> &Arc<ComputeService> {
        &self.compute
    }

    /// Jobs on any peer through this peer (its own on its pool, no network hop).
    pub fn jobs(&self) -> myriad_compute::Jobs {
        myriad_compute::Jobs::new(self.client()).with_local(Arc::clone(&self.compute))
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
            self.monitor.abort();
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
            self.compute.shutdown();
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

/// A client whose chunk calls for this peer's own chunks run in-process.
fn local_client(
    membership: &Arc<Membership>,
    service: &Arc<ChunkService>,
) -> myriad_client::client::Client {
    let chunks = myriad_client::chunk::Chunks::new(
        membership.net().clone(),
        Arc::clone(membership),
        myriad_client::chunk::ChunkOptions::default(),
    )
    .with_local(Arc::clone(service) as Arc<dyn myriad_client::chunk::LocalChunks>);
    myriad_client::client::Client::from_parts(Arc::clone(membership), chunks)
}

/// Starts the compute service's worker pool and registers its handlers (before the
/// endpoint starts); jobs and tasks run only with the compute capability.
fn start_compute(
    options: &PeerOptions,
    join: &JoinConfig,
    handlers: &mut Handlers,
) -> Result<Arc<ComputeService>, PeerError> {
    let mut config = options.compute.config.clone();
    config.enabled = join.capabilities.contains(Capabilities::COMPUTE);
    let compute =
        ComputeService::new(config, options.compute.registry.clone()).map_err(PeerError::Thread)?;
    compute.register(handlers)?;
    Ok(compute)
}

/// Creates the data directory and returns the join configuration, reclaiming the node ID
/// an earlier incarnation kept there (unless the options name one).
fn open_data_dir(options: &PeerOptions) -> Result<JoinConfig, PeerError> {
    std::fs::create_dir_all(&options.data_dir).map_err(|error| PeerError::DataDir {
        path: options.data_dir.clone(),
        error,
    })?;
    let mut join = options.join.clone();
    if join.reclaim.is_none() {
        join.reclaim = read_node_id(&options.data_dir)?;
    }
    Ok(join)
}

/// Opens the backup side (log engine and backup service) of a peer with the backup
/// capability.
fn open_backup(
    options: &PeerOptions,
    join: &JoinConfig,
) -> Result<Option<Arc<BackupService>>, PeerError> {
    if !join.capabilities.contains(Capabilities::BACKUP) {
        return Ok(None);
    }
    let dir = options.backup.log_dir_in(&options.data_dir);
    Ok(Some(Arc::new(open_backup_service(
        &dir,
        options.backup.log.clone(),
        options.backup.apply_inline,
    )?)))
}

/// Joins with `handlers`, keeps the assigned node ID, and builds what serves chunks: the
/// memory manager above this incarnation's bases, the local-ID reservations, the chunk
/// service with the node's lease and (with `backup.replication > 0`) its replicator.
fn join_and_serve(
    options: &PeerOptions,
    join: JoinConfig,
    handlers: Handlers,
    backup: &Option<Arc<BackupService>>,
    stop: &Arc<AtomicBool>,
) -> Result<Started, PeerError> {
    let (rack, switch) = (join.rack, join.switch);
    let (endpoint, membership) = Membership::join_blocking(join, handlers)?;
    if let Some(backup) = backup {
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
    let mem = start_memory(options, me, bases.lid_base)?;
    let reserved = reserve_lids(&membership, bases.lid_base)?;
    let mut service =
        ChunkService::new(Arc::clone(&mem), me).with_lease(Arc::clone(membership.lease()));
    let mut replica_events = None;
    if options.backup.replication > 0 {
        let mut config = replicator_config(&options.backup, me, bases.zone_base);
        (config.rack, config.switch) = (rack, switch);
        let replicator = Arc::new(Replicator::new(
            config,
            membership.net().clone(),
            Arc::new(MembershipCandidates::new(Arc::clone(&membership), me)),
            Arc::new(MembershipRegistry::new(Arc::clone(&membership))),
            Arc::new(MemorySource::new(Arc::clone(&mem))),
        )?);
        // Acknowledgements come from backups, never from a client.
        let roles = Arc::clone(&membership);
        membership
            .net()
            .restrict(myriad_replication::wire::ACK, move |from| {
                roles.is_not_client(from)
            })?;
        replica_events = Some(follow_replica_events(
            &replicator,
            &membership,
            Arc::clone(stop),
        )?);
        service = service.with_replication(replicator, endpoint.runtime());
    }
    let lid_reserver =
        spawn_lid_reserver(mem, Arc::clone(&membership), reserved, Arc::clone(stop))?;
    Ok(Started {
        endpoint,
        membership,
        service: Arc::new(service),
        bases,
        replica_events,
        lid_reserver,
    })
}

/// The memory manager of node `me`, handing out fresh local IDs from `lid_base`, with
/// memory kept resident ahead when configured.
fn start_memory(
    options: &PeerOptions,
    me: NodeId,
    lid_base: u64,
) -> Result<Arc<MemoryManager>, PeerError> {
    let mem = Arc::new(MemoryManager::new(MemoryConfig {
        node_id: me,
        region_bytes: options.memory_bytes,
        ..MemoryConfig::default()
    })?);
    mem.start_local_ids_at(lid_base);
    if options.prefault_bytes > 0 {
        keep_memory_resident(Arc::downgrade(&mem), options.prefault_bytes);
    }
    Ok(mem)
}

/// The replicator's configuration from the peer's backup options (rack and switch are
/// the join's); its zones are numbered from `first_zone`.
fn replicator_config(backup: &BackupOptions, me: NodeId, first_zone: u32) -> ReplicatorConfig {
    let mut config = ReplicatorConfig::new(me);
    config.replication = backup.replication;
    config.zone_bytes = backup.zone_bytes;
    config.strategy = backup.strategy;
    config.default_durability = backup.durability;
    config.wait_timeout = backup.wait_timeout;
    config.unreachable_timeout = backup.unreachable_timeout;
    config.async_linger = backup.async_linger;
    config.first_zone = first_zone;
    config
}

/// Loads the ownership ranges committed before this peer joined. A restarted peer does
/// not hold what its earlier incarnation held: until the old zones are recovered it
/// answers `NotOwner` for those CIDs (never a false `NotFound`), and a watch thread gives
/// them back afterwards. Returns the "old zones pending" flag and that thread.
fn load_ownership(
    runtime: &tokio::runtime::Handle,
    membership: &Arc<Membership>,
    service: &Arc<ChunkService>,
    bases: myriad_meta::PeerBases,
    stop: &Arc<AtomicBool>,
) -> Result<(Arc<AtomicBool>, Option<JoinHandle<()>>), PeerError> {
    let me = membership.node_id();
    let restarted = bases.lid_base > 0;
    let pending = Arc::new(AtomicBool::new(restarted));
    if !restarted {
        sync_ownership(runtime, membership, service, me, None);
        return Ok((pending, None));
    }
    service.set_owner(me, 0, bases.lid_base - 1, NOBODY);
    sync_ownership(runtime, membership, service, NOBODY, None);
    let watch = watch_old_zones(
        Arc::clone(service),
        Arc::clone(membership),
        bases,
        Arc::clone(&pending),
        Arc::clone(stop),
    )?;
    Ok((pending, Some(watch)))
}

/// A peer was declared failed: this backup refuses its late operations for every zone
/// its incarnations registered ([`BackupService::seal_owner`]; the zones' end asked from
/// the superpeers, in the background).
fn seal_failed_owner(membership: &Arc<Membership>, backup: &Arc<BackupService>, node: NodeId) {
    let membership = Arc::clone(membership);
    let backup = Arc::clone(backup);
    membership.net().runtime().spawn(async move {
        match membership
            .request(myriad_proto::meta::MetaRequest::Bases(node))
            .await
        {
            Ok(myriad_proto::meta::MetaReply::Bases(bases)) => {
                backup.seal_owner(node, bases.zones_end);
            }
            other => tracing::warn!(%node, ?other, "zones of a failed peer not sealed"),
        }
    });
}

/// Follows the cluster's events on `runtime`: ownership changes and gone nodes reach the
/// chunk service and the replicator; missed events (e.g. a recovery's burst) reload the
/// ownership ranges from the superpeers.
fn follow_cluster_events(
    runtime: &tokio::runtime::Handle,
    membership: &Arc<Membership>,
    service: &Arc<ChunkService>,
    backup: Option<Arc<BackupService>>,
    old_zones_pending: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let mut receiver = membership.subscribe();
    let membership = Arc::clone(membership);
    let service = Arc::clone(service);
    let events_runtime = runtime.clone();
    runtime.spawn(async move {
        loop {
            match receiver.recv().await {
                Ok(event) => {
                    apply_event(&service, &event);
                    replicate_event(&service, &events_runtime, &event);
                    if let (myriad_proto::meta::Event::NodeFailed(node), Some(backup)) =
                        (&event, &backup)
                    {
                        seal_failed_owner(&membership, backup, *node);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        "peer fell behind the cluster's events; reloading ownership"
                    );
                    let service = Arc::clone(&service);
                    let membership = Arc::clone(&membership);
                    let pending = Arc::clone(&old_zones_pending);
                    let runtime = events_runtime.clone();
                    events_runtime.spawn_blocking(move || {
                        let mine_as = if pending.load(Ordering::Acquire) {
                            NOBODY
                        } else {
                            service.node()
                        };
                        sync_ownership(&runtime, &membership, &service, mine_as, None);
                        // Missed joins and failures: what their events would have done to
                        // the zones' backups (both calls are no-ops when nothing changed).
                        if let Some(replicator) = service.replicator() {
                            for record in membership.nodes() {
                                if record.state != myriad_meta::NodeState::Alive {
                                    replicator.replace_backup(record.id);
                                }
                            }
                            replicator.fill_zones();
                        }
                    });
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    })
}
