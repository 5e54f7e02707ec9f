//! The peer's one request dispatch: every handler a peer registers on its endpoint.
//!
//! # Job
//! [`PeerDispatch::register`] registers, before the endpoint starts:
//! - [`types::CHUNK`], inline on the I/O thread: requests that cannot wait (reads, and
//!   writes while nothing can make them wait; `async` changes the replicator queues
//!   without waiting; `replicated`/`durable` puts whose reply the replicator sends once the
//!   backups acknowledged, [`ChunkService::serve_change_deferred`]) are served right
//!   there, the lowest latency; other replicated changes go to the messaging runtime's
//!   blocking threads ([`ChunkService::serve_incoming`]); the
//!   rest (locks, waits) to the slow path's handler threads (`slow_path`).
//! - [`types::MIGRATE`]: `migrate`, on a thread of its own (it blocks, and waits for
//!   replication acknowledgements that this peer's handler threads may have to give).
//! - [`types::RECOVER`]: the superpeer leader's recovery requests, served by the backup
//!   service when the peer keeps backups ([`crate::recovery::serve_recover`]).
//! - the backup service's own handlers (with the backup capability), and
//! - [`types::NODE_SHUTDOWN`]: an operator's request to stop ([`PeerDispatch::shutdown_requested`]);
//! - [`types::LOG_LEVEL`], [`types::LOG_INFO`]: log filter and log engine state
//!   ([`crate::ops::log_control`]); [`types::LOCK_LIST`]: the chunk locks held here.
//!
//! Roles ([`PeerDispatch::restrict_roles`]): [`types::RECOVER`] only from the configured
//! superpeers; replication ([`myriad_replication::wire::REPLICATE`]) never from a node
//! known as a client. A refused sender's connection is closed before any handler runs.
//!
//! Handlers must exist before the endpoint starts, but the chunk service needs the node
//! ID, known only after the join: the dispatch holds cells that the peer fills once it
//! has joined ([`PeerDispatch::serve`], [`PeerDispatch::attach_membership`]).
//!
//! # Invariants
//! - Requests that arrive before the cells are filled are answered "peer is still
//!   starting", never dropped and never a panic.
//! - A node declared failed refuses recoveries (and, through its chunk service, chunk and
//!   migration requests).
//! - The I/O thread never waits: the slow path's queue is bounded and answers "busy" when
//!   full.
//!
//! # Who calls it
//! [`super::node::PeerNode::start`] in production; tests that serve chunks from an
//! endpoint without superpeers fill only the service cell.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use myriad_membership::Membership;
use myriad_net::{Handlers, Incoming};
use myriad_proto::chunk::{ChunkReply, ItemError};
use myriad_proto::logctl::TextReply;
use myriad_proto::migrate::{MigrateReply, MigrateRequest};
use myriad_proto::recovery::RecoverReply;
use myriad_proto::types;
use myriad_replication::BackupService;

use super::migrate::migrate;
use super::node::PeerError;
use super::service::ChunkService;
use super::slow_path::SlowPath;
use crate::ops::chunk_ops::Timer;

/// Most migrations a peer runs at once (each on a thread of its own).
pub const MIGRATIONS_MAX: usize = 4;

/// Where a peer's handlers find the chunk service, filled once it exists.
type ServiceCell = Arc<OnceLock<Arc<ChunkService>>>;
/// Where a peer's handlers find the membership, filled once the peer has joined.
type MembershipCell = Arc<OnceLock<Arc<Membership>>>;

/// The handlers of one peer and what they reach. See the module documentation.
#[derive(Debug, Default)]
pub struct PeerDispatch {
    service: ServiceCell,
    membership: MembershipCell,
    shutdown_requested: Arc<AtomicBool>,
}

impl PeerDispatch {
    /// Restricts who may send the peer-internal types registered by
    /// [`PeerDispatch::register`]: recoveries only the `superpeers`, replication no node
    /// this peer knows as a client (nodes not known yet pass: see
    /// `Membership::is_not_client`).
    pub fn restrict_roles(
        &self,
        handlers: &mut Handlers,
        superpeers: &[myriad_types::NodeId],
        backup: bool,
    ) -> Result<(), PeerError> {
        let superpeers: Arc<[myriad_types::NodeId]> = superpeers.into();
        let table = Arc::clone(&self.membership);
        handlers.restrict(types::RECOVER, move |from| {
            superpeers.contains(&from)
                || table
                    .get()
                    .is_some_and(|m| m.role_of(from) == Some(myriad_meta::Role::Superpeer))
        })?;
        if backup {
            let membership = Arc::clone(&self.membership);
            handlers.restrict(myriad_replication::wire::REPLICATE, move |from| {
                membership.get().is_none_or(|m| m.is_not_client(from))
            })?;
            let membership = Arc::clone(&self.membership);
            handlers.restrict(myriad_replication::wire::ZONE_POSITION, move |from| {
                membership.get().is_none_or(|m| m.is_not_client(from))
            })?;
        }
        Ok(())
    }

    /// Registers every handler of a peer in `handlers` (see the module documentation):
    /// the slow path gets `handler_threads` threads (at least one); `backup` is the backup
    /// service of a peer with the backup capability (its handlers are registered too).
    pub fn register(
        handlers: &mut Handlers,
        backup: Option<&Arc<BackupService>>,
        handler_threads: usize,
    ) -> Result<PeerDispatch, PeerError> {
        let dispatch = PeerDispatch::default();
        dispatch.register_chunk(handlers, handler_threads)?;
        if let Some(backup) = backup {
            backup.register(handlers)?;
        }
        dispatch.register_migrate(handlers)?;
        dispatch.register_recover(handlers, backup.cloned())?;
        dispatch.register_shutdown(handlers)?;
        crate::ops::log_control::register(handlers, backup.cloned())?;
        dispatch.register_lock_list(handlers)?;
        Ok(dispatch)
    }

    /// Starts serving chunk requests with `service` (once: the service of a peer never
    /// changes).
    pub fn serve(&self, service: Arc<ChunkService>) {
        let first = self.service.set(service).is_ok();
        assert!(first, "a peer's chunk service is set once");
    }

    /// Starts serving migration and recovery requests with `membership` (once, after the
    /// join).
    pub fn attach_membership(&self, membership: Arc<Membership>) {
        let first = self.membership.set(membership).is_ok();
        assert!(first, "a peer's membership is set once");
    }

    /// The flag an operator's [`types::NODE_SHUTDOWN`] request sets.
    pub fn shutdown_requested(&self) -> &Arc<AtomicBool> {
        &self.shutdown_requested
    }

    /// CHUNK: inline on the I/O thread, with the slow path for what may wait.
    fn register_chunk(
        &self,
        handlers: &mut Handlers,
        handler_threads: usize,
    ) -> Result<(), PeerError> {
        let slow = SlowPath::start(handler_threads.max(1));
        let cell = Arc::clone(&self.service);
        handlers.register_inline(types::CHUNK, move |incoming: Incoming| {
            if !incoming.is_request() {
                return;
            }
            let Some(service) = cell.get() else {
                let reply =
                    ChunkReply::Failed(ItemError::Internal("peer is still starting".to_owned()));
                let _ = incoming.respond(reply.encode());
                return;
            };
            dispatch_chunk(service, &slow, incoming);
        })?;
        Ok(())
    }

    /// MIGRATE: moves a range this peer owns to another peer, on a thread of its own (at
    /// most [`MIGRATIONS_MAX`] at once): a migration waits for the target, whose backups
    /// may include this peer, so it must not hold one of the handler threads that serve
    /// this peer's own replication messages (a migration that held one waited for
    /// acknowledgements that thread was to give).
    fn register_migrate(&self, handlers: &mut Handlers) -> Result<(), PeerError> {
        let cell = Arc::clone(&self.service);
        let membership = Arc::clone(&self.membership);
        let running = Arc::new(AtomicUsize::new(0));
        handlers.register(types::MIGRATE, move |mut incoming: Incoming| {
            let Some(responder) = incoming.take_responder() else {
                return;
            };
            let (Some(service), Some(membership)) = (cell.get(), membership.get()) else {
                let reply = MigrateReply::Failed("peer is still starting".to_owned());
                let _ = responder.respond(reply.encode());
                return;
            };
            let request = match MigrateRequest::decode(incoming.payload.clone()) {
                Ok(request) => request,
                Err(error) => {
                    let _ = responder.respond(MigrateReply::Failed(error.to_string()).encode());
                    return;
                }
            };
            if running.fetch_add(1, Ordering::AcqRel) >= MIGRATIONS_MAX {
                running.fetch_sub(1, Ordering::AcqRel);
                let reply = MigrateReply::Failed(format!(
                    "{MIGRATIONS_MAX} migrations are running here already; try again later"
                ));
                let _ = responder.respond(reply.encode());
                return;
            }
            let (service, membership) = (Arc::clone(service), Arc::clone(membership));
            let running_here = Arc::clone(&running);
            let spawned = std::thread::Builder::new()
                .name("myriad-migrate".to_owned())
                .spawn(move || {
                    let reply = migrate(&service, &membership, &request);
                    running_here.fetch_sub(1, Ordering::AcqRel);
                    let _ = responder.respond(reply.encode());
                });
            if let Err(error) = spawned {
                running.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!(%error, "could not start a migration thread");
            }
        })?;
        Ok(())
    }

    /// LOCK_LIST: the chunk locks held here, as JSON (`chunklocklist`).
    fn register_lock_list(&self, handlers: &mut Handlers) -> Result<(), PeerError> {
        let cell = Arc::clone(&self.service);
        handlers.register(types::LOCK_LIST, move |incoming: Incoming| {
            if !incoming.is_request() {
                return;
            }
            let reply = match cell.get() {
                Some(service) => {
                    let rows: Vec<serde_json::Value> = service
                        .lock_list()
                        .into_iter()
                        .map(|(cid, writer, readers)| {
                            serde_json::json!({
                                "cid": cid.to_string(),
                                "writer": writer.map(|node| node.to_string()),
                                "readers": readers
                                    .iter()
                                    .map(|(node, count)| format!("{node}:{count}"))
                                    .collect::<Vec<_>>()
                                    .join(","),
                            })
                        })
                        .collect();
                    TextReply::Ok(serde_json::Value::Array(rows).to_string())
                }
                None => TextReply::Failed("peer is still starting".to_owned()),
            };
            let _ = incoming.respond(reply.encode());
        })?;
        Ok(())
    }

    /// RECOVER: recovery of a failed peer's zones held here (issue 6), the superpeer
    /// leader's requests; a peer without backups answers that it has none.
    fn register_recover(
        &self,
        handlers: &mut Handlers,
        backup: Option<Arc<BackupService>>,
    ) -> Result<(), PeerError> {
        let cell = Arc::clone(&self.service);
        let membership = Arc::clone(&self.membership);
        handlers.register(types::RECOVER, move |incoming: Incoming| {
            if !incoming.is_request() {
                return;
            }
            let refusal = match (&backup, cell.get(), membership.get()) {
                (_, Some(service), _) if service.is_declared_failed() => {
                    "this node was declared failed"
                }
                (Some(backup), Some(service), Some(membership)) => {
                    crate::recovery::serve_recover(
                        Arc::clone(backup),
                        Arc::clone(service),
                        Arc::clone(membership),
                        incoming,
                    );
                    return;
                }
                (None, _, _) => "this peer keeps no backups",
                _ => "peer is still starting",
            };
            let _ = incoming.respond(RecoverReply::Failed(refusal.to_owned()).encode());
        })?;
        Ok(())
    }

    /// NODE_SHUTDOWN: an operator asks this peer to stop; the process polls the flag.
    fn register_shutdown(&self, handlers: &mut Handlers) -> Result<(), PeerError> {
        let flag = Arc::clone(&self.shutdown_requested);
        handlers.register(types::NODE_SHUTDOWN, move |incoming: Incoming| {
            tracing::info!(from = ?incoming.from, "shutdown requested");
            flag.store(true, Ordering::Relaxed);
            if incoming.is_request() {
                let _ = incoming.respond(Bytes::new());
            }
        })?;
        Ok(())
    }
}

/// Serves one chunk request on the I/O thread if it cannot wait, else hands it on: to
/// the blocking threads (replicated changes, which may wait for backups, many at once)
/// or to the slow path.
fn dispatch_chunk(service: &Arc<ChunkService>, slow: &SlowPath, mut incoming: Incoming) {
    let from = incoming.from;
    let timer = Timer::start();
    if service.can_serve_inline(&incoming.payload) {
        let reply = service.serve(from, incoming.payload.clone());
        service.ops().record(&incoming.payload, &reply, timer);
        let _ = incoming.respond(reply);
        return;
    }
    if let Some(reply) = service.serve_change_inline(from, &incoming.payload) {
        service.ops().record(&incoming.payload, &reply, timer);
        let _ = incoming.respond(reply);
        return;
    }
    if service.serve_change_deferred(from, &mut incoming) {
        return;
    }
    if service.replicator().is_some() && myriad_proto::chunk::is_change_request(&incoming.payload) {
        service.serve_incoming(incoming);
        return;
    }
    if let Some(responder) = incoming.take_responder() {
        slow.submit(
            Arc::clone(service),
            from,
            incoming.payload.clone(),
            responder,
            timer,
        );
    }
}
