//! The peer's chunk service: a memory manager serving chunks to remote clients.
//!
//! # Job
//! [`ChunkService`] executes the [`ChunkRequest`]s of [`myriad_proto::chunk`] against the
//! peer's [`MemoryManager`]: for remote nodes through the messaging layer (the CHUNK
//! handler of [`super::dispatch`], which picks the thread: [`ChunkService::serve`] inline,
//! [`ChunkService::serve_incoming`] or the slow path), for applications in the same
//! process through [`ChunkService::execute`] or the client's [`LocalChunks`] trait (no
//! network hop).
//!
//! # Invariants
//! - Nothing a request holds makes it panic: bad payloads are answered with
//!   [`ChunkReply::Malformed`], bad items (offsets, sizes, IDs) with an [`ItemError`].
//! - A request for a CID this peer does not own (its ownership view says another node
//!   holds it) is answered [`ItemError::NotOwner`], never with stale bytes; an owned but
//!   absent CID is [`ItemError::NotFound`]. `Insert` is the exception: it stores chunks
//!   this peer is about to own (migration, recovery) and checks no ownership.
//! - Every chunk lock taken for a node is recorded with that node; only that node can
//!   release it, and [`ChunkService::release_locks_of`] releases all of a failed node's.
//! - Without a replicator ([`ChunkService::new`]) the `durability` field of changing
//!   requests is ignored: every change is acknowledged once it is in this peer's memory.
//! - With a replicator ([`ChunkService::with_replication`]) every successful change
//!   (create, create with data, put, remove, write-at, resize, insert) is reported to it
//!   with the request's durability (0: the replicator's default; 1/2/3: async, replicated,
//!   durable). A change the replicator reports an error for is answered
//!   [`ItemError::Internal`] with the reason, whatever the level: **the change is in this
//!   peer's memory (and readable) but not as durable as asked** (a replicated or durable
//!   wait ran out, a zone could not be registered, the stream to a backup stayed full);
//!   the caller may retry. Readers may see a change before it reached its durability.
//! - Changes of one chunk reach the replicator in the order they were applied to memory:
//!   each change holds the chunk's *stripe* (one of [`ORDER_STRIPES`] mutexes, chosen by
//!   CID) from the memory change until the replicator call returns, so two changes of one
//!   chunk through this service never interleave. A batch takes its stripes in ascending
//!   order (no deadlock). Creates take the stripes of the new CIDs right after the memory
//!   manager handed them out: the IDs are unknown to everyone else until the reply, except
//!   to a caller still holding the ID of a removed chunk whose local ID was reused (that
//!   caller's put would be rejected by the backups' order only in such a race; documented
//!   gap). The stripe is held across the replicator's wait for durability, so a slow
//!   backup delays further changes of the same chunk (and of chunks sharing its stripe),
//!   never reads.
//! - With a replicator, changing requests from the network run on blocking threads of the
//!   messaging runtime ([`ChunkService::serve_incoming`]), not on the handler pool: a
//!   replicated or durable change waits for acknowledgements that arrive on that same pool,
//!   and a pool full of waiting writers would starve them. At most
//!   [`BLOCKING_REQUESTS_MAX`] run at once; further ones are answered
//!   [`ItemError::Internal`] ("overloaded"). The exception: an `async` put or remove that
//!   nothing can make wait is served on the I/O thread
//!   ([`ChunkService::serve_change_inline`]): its stripes are taken with `try_lock`
//!   (never waiting for a change that waits for its backups) and the replicator queues it
//!   with `on_changes_nowait`, which never blocks.
//! - Once [`ChunkService::declare_failed`] was called (the superpeers declared this node
//!   failed: it was paused or partitioned and its zones are being or were recovered
//!   elsewhere), every request, local or remote, is answered [`ItemError::NotOwner`] for
//!   every item (whole-request errors for creates, lists and stats): nothing is read from
//!   or written to this node's memory any more, and clients that still route to it look
//!   the chunks up again and find the restorers. There is no way back: the node must exit
//!   (or rejoin as a new, empty incarnation).
//! - The same answers come while this node's lease with the superpeers has lapsed
//!   ([`ChunkService::with_lease`], `myriad_membership::lease`): a node that was paused or cut
//!   off stops serving on its own clock before a verdict on it can commit, so it never
//!   serves a read of a chunk already recovered and changed elsewhere, nor takes an
//!   `async` write nobody keeps (assuming a request is not itself stalled for a quarter of
//!   the failure timeout between the check and its memory access). Unlike the verdict,
//!   this ends when a heartbeat renews the lease.
//!
//! # Who calls it
//! The peer process (`myriad peer`, [`super::PeerNode`]) builds one service per node (with
//! its replicator when replication is on), hands it to its dispatch
//! ([`super::PeerDispatch::serve`]) once the node has joined, and calls
//! [`ChunkService::set_owner`] on the superpeers' ownership events and
//! [`ChunkService::release_locks_of`] on failure/leave events.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_client::chunk::LocalChunks;
use myriad_mem::{MemError, MemoryManager};
use myriad_membership::Lease;
use myriad_meta::LookupTree;
use myriad_net::Incoming;
use myriad_proto::chunk::{
    ChunkReply, ChunkRequest, ChunkStats, DataReplyWriter, ItemError, LIST_RANGES_MAX,
};
use myriad_replication::{AckCallback, AsyncChange, Replicator};
use myriad_types::{ChunkId, NodeId, LOCAL_ID_MAX};
use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::ops::chunk_ops::{ChunkOps, Timer};
use crate::replication::durability_of;

/// The longest a `Lock` request may wait for a chunk lock; longer timeouts are cut to it
/// (a waiting lock request occupies a handler thread).
pub const LOCK_TIMEOUT_MS_MAX: u64 = 30_000;

/// Mutexes that order the changes of one chunk towards the replicator (see the module
/// documentation).
pub const ORDER_STRIPES: usize = 1024;

/// Changing requests running at once on blocking threads when a replicator is present.
pub const BLOCKING_REQUESTS_MAX: usize = 256;

/// The replication side of a service.
struct Replication {
    replicator: Arc<Replicator>,
    runtime: tokio::runtime::Handle,
    stripes: Box<[Mutex<()>]>,
    /// Changing requests handed to blocking threads and not finished.
    blocking: AtomicUsize,
}

impl Replication {
    /// The stripes of `cids`, ascending, each once (the lock order).
    fn stripe_indexes(&self, cids: impl IntoIterator<Item = ChunkId>) -> Vec<usize> {
        let mut indexes: Vec<usize> = cids
            .into_iter()
            .map(|cid| stripe_of(cid, self.stripes.len()))
            .collect();
        indexes.sort_unstable();
        indexes.dedup();
        indexes
    }

    /// Locks the stripes of `cids` in ascending order.
    fn lock(&self, cids: impl IntoIterator<Item = ChunkId>) -> Vec<MutexGuard<'_, ()>> {
        self.stripe_indexes(cids)
            .into_iter()
            .map(|i| self.stripes[i].lock())
            .collect()
    }
}

impl Replication {
    /// Locks the stripes of `cids` if none is held now (never waits: for the I/O thread).
    fn try_lock(&self, cids: impl IntoIterator<Item = ChunkId>) -> Option<Vec<MutexGuard<'_, ()>>> {
        self.stripe_indexes(cids)
            .into_iter()
            .map(|i| self.stripes[i].try_lock())
            .collect()
    }
}

fn stripe_of(cid: ChunkId, stripes: usize) -> usize {
    // Fibonacci hashing spreads consecutive IDs over the stripes.
    (cid.raw().wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % stripes
}

/// The error a caller sees when the replicator failed for a change.
fn replica_error(error: myriad_replication::ReplicaError) -> ItemError {
    ItemError::Internal(format!(
        "stored in memory but not replicated as requested: {error}"
    ))
}

/// Who holds which locks of one chunk (taken through this service).
#[derive(Debug, Default)]
struct Holders {
    /// The holder of the write lock.
    writer: Option<NodeId>,
    /// Read locks per holder (a node may take several).
    readers: Vec<(NodeId, u32)>,
}

impl Holders {
    fn is_empty(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty()
    }
}

/// Serves chunk requests from one peer's memory manager. See the module documentation.
pub struct ChunkService {
    mem: Arc<MemoryManager>,
    me: NodeId,
    /// Per creator, the LID ranges that live on a node other than their creator (the
    /// default owner). Changed by [`ChunkService::set_owner`].
    ownership: RwLock<HashMap<NodeId, LookupTree>>,
    /// Counts changes of `ownership` (bumped with its write lock held): a put that saw it
    /// change while it ran checks its chunks' owners again.
    ownership_changes: AtomicU64,
    /// Chunk locks taken through this service, with their holders.
    locks: Mutex<HashMap<ChunkId, Holders>>,
    /// `locks.len()`, readable without the mutex: data requests look at holders only when
    /// some lock is held.
    locked_chunks: AtomicUsize,
    /// Migrations running (see [`ChunkService::migration_guard`]).
    migrations: AtomicUsize,
    /// Present when this peer replicates its chunks.
    replication: Option<Replication>,
    /// Restored chunks announced by [`ChunkService::rereplication_begins`] whose adopted
    /// zone is not yet on all its new backups ([`ChunkService::copy_adopted`]).
    rereplication_pending: AtomicU64,
    /// Set once the superpeers declared this node failed ([`ChunkService::declare_failed`]).
    declared_failed: AtomicBool,
    /// Replicated changes served on the I/O thread ([`ChunkService::serve_change_inline`]).
    changes_inline: AtomicU64,
    /// The node's lease with the superpeers; nothing is served while it has lapsed
    /// (`None`: no lease is checked, for a service outside a cluster).
    lease: Option<Arc<Lease>>,
    /// Requests served by type and result, with latencies (for the metrics endpoint).
    ops: ChunkOps,
    /// Test-only switch ([`ChunkService::reintroduce_ids_before_ranges_bug`]).
    bug_ids_before_ranges: AtomicBool,
}

/// Keeps inline serving off while a migration runs ([`ChunkService::migration_guard`]).
#[derive(Debug)]
pub struct MigrationGuard<'a> {
    service: &'a ChunkService,
}

impl Drop for MigrationGuard<'_> {
    fn drop(&mut self) {
        self.service.migrations.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for ChunkService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkService")
            .field("node", &self.me)
            .field("locked_chunks", &self.locked_chunks.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The item error of a memory-manager error.
fn item_error(error: MemError) -> ItemError {
    match error {
        MemError::NotFound(_) | MemError::Removed(_) | MemError::Reserved(_) => ItemError::NotFound,
        MemError::InvalidSize { size, max } if size > max => ItemError::TooLarge,
        MemError::BatchTooLarge { .. } => ItemError::TooLarge,
        MemError::OutOfMemory { .. } | MemError::LocalIdsExhausted => ItemError::OutOfMemory,
        MemError::LockTimeout(_) | MemError::WouldBlock(_) => ItemError::LockTimeout,
        error @ (MemError::InvalidSize { .. }
        | MemError::SizeMismatch { .. }
        | MemError::OutOfBounds { .. }
        | MemError::BufferTooSmall { .. }
        | MemError::AlreadyExists(_)
        | MemError::NotReserved(_)
        | MemError::ForeignChunk { .. }
        | MemError::InvalidRange { .. }
        | MemError::NotLocked(_)
        | MemError::Pinned(_)
        | MemError::NotPinned(_)) => ItemError::Invalid(error.to_string()),
        error => ItemError::Internal(error.to_string()),
    }
}

fn to_usize(value: u64, what: &str) -> Result<usize, ItemError> {
    usize::try_from(value).map_err(|_| ItemError::Invalid(format!("{what} {value} too large")))
}

/// One held chunk lock ([`ChunkService::lock_list`]): the chunk, its write-lock holder,
/// and each read-lock holder with its count.
pub type LockRow = (ChunkId, Option<NodeId>, Vec<(NodeId, u32)>);

/// The reply of a node that was declared failed: [`ItemError::NotOwner`] for every item,
/// so that clients look the chunks up again (see [`ChunkService::declare_failed`]).
fn refused(request: &ChunkRequest) -> ChunkReply {
    let statuses = |count: usize| ChunkReply::Statuses(vec![Err(ItemError::NotOwner); count]);
    match request {
        ChunkRequest::Get { cids } => ChunkReply::Data(vec![Err(ItemError::NotOwner); cids.len()]),
        ChunkRequest::ReadAt { .. } => ChunkReply::Data(vec![Err(ItemError::NotOwner)]),
        ChunkRequest::Status { cids } => {
            ChunkReply::Sizes(vec![Err(ItemError::NotOwner); cids.len()])
        }
        ChunkRequest::Put { items, .. } => statuses(items.len()),
        ChunkRequest::Insert { items, .. } => statuses(items.len()),
        ChunkRequest::Remove { cids, .. } => statuses(cids.len()),
        ChunkRequest::WriteAt { .. }
        | ChunkRequest::Resize { .. }
        | ChunkRequest::Lock { .. }
        | ChunkRequest::Unlock { .. } => statuses(1),
        ChunkRequest::Create { .. }
        | ChunkRequest::CreateWithData { .. }
        | ChunkRequest::List { .. }
        | ChunkRequest::Stats => ChunkReply::Failed(ItemError::NotOwner),
    }
}

fn status<T>(result: Result<T, MemError>) -> Result<(), ItemError> {
    result.map(|_| ()).map_err(item_error)
}

impl ChunkService {
    /// A service over `mem` for node `me` (which must be `mem`'s node ID for creates to
    /// hand out this node's IDs). Initially every creator owns its own chunks.
    pub fn new(mem: Arc<MemoryManager>, me: NodeId) -> ChunkService {
        ChunkService {
            mem,
            me,
            ownership: RwLock::new(HashMap::new()),
            ownership_changes: AtomicU64::new(0),
            locks: Mutex::new(HashMap::new()),
            locked_chunks: AtomicUsize::new(0),
            migrations: AtomicUsize::new(0),
            replication: None,
            rereplication_pending: AtomicU64::new(0),
            declared_failed: AtomicBool::new(false),
            changes_inline: AtomicU64::new(0),
            lease: None,
            ops: ChunkOps::default(),
            bug_ids_before_ranges: AtomicBool::new(false),
        }
    }

    /// **Test-only switch, never called in production.** Re-introduces a fixed bug for the
    /// simulator to find (`myriad_testing::sim`): [`ChunkService::take_back_earlier_ids`]
    /// sets the earlier IDs first and the restorers' ranges after, leaving a window in
    /// which this peer answers a false `NotFound` for chunks living at a restorer (the bug
    /// of commit a43e2b1).
    pub fn reintroduce_ids_before_ranges_bug(&self) {
        self.bug_ids_before_ranges.store(true, Ordering::Release);
    }

    /// A restarted peer takes its earlier incarnation's local IDs (`0..lid_base`) back,
    /// except `restored`, the ranges of its own IDs that restorers took over (committed
    /// when its old zones settled): both in one step ([`ChunkService::set_owners`]), so no
    /// request sees the IDs back without the restorers' ranges.
    pub fn take_back_earlier_ids(&self, lid_base: u64, restored: &[(u64, u64, NodeId)]) {
        if lid_base == 0 {
            return;
        }
        if self.bug_ids_before_ranges.load(Ordering::Acquire) {
            self.set_owner(self.me, 0, lid_base - 1, self.me);
            myriad_backup_log::interleave::point("peer.earlier_ids.taken");
            self.set_owners(self.me, restored);
            return;
        }
        let mut view = vec![(0, lid_base - 1, self.me)];
        view.extend_from_slice(restored);
        self.set_owners(self.me, &view);
    }

    /// Serves only while `lease` holds (see the module documentation).
    pub fn with_lease(mut self, lease: Arc<Lease>) -> ChunkService {
        self.lease = Some(lease);
        self
    }

    /// Whether requests are refused now: declared failed, or the lease has lapsed.
    pub fn refusing(&self) -> bool {
        self.is_declared_failed() || self.lease.as_ref().is_some_and(|lease| !lease.holds())
    }

    /// Reports every change to `replicator` (see the module documentation); changing
    /// requests from the network then run on blocking threads of `runtime`.
    pub fn with_replication(
        mut self,
        replicator: Arc<Replicator>,
        runtime: tokio::runtime::Handle,
    ) -> ChunkService {
        self.replication = Some(Replication {
            replicator,
            runtime,
            stripes: (0..ORDER_STRIPES).map(|_| Mutex::new(())).collect(),
            blocking: AtomicUsize::new(0),
        });
        self
    }

    /// The replicator, when this peer replicates its chunks.
    pub fn replicator(&self) -> Option<&Arc<Replicator>> {
        self.replication.as_ref().map(|r| &r.replicator)
    }

    /// This peer's node ID.
    pub fn node(&self) -> NodeId {
        self.me
    }

    /// The memory manager served.
    pub fn memory(&self) -> &Arc<MemoryManager> {
        &self.mem
    }

    /// Whether `payload` can be served on the messaging layer's I/O thread: it must not
    /// wait. True for read-only requests, and for writes while this peer does not
    /// replicate (a replicated write may wait for its backups); and only while no chunk
    /// lock is held through this service and no migration runs (a read of a locked chunk
    /// waits for the lock). Everything else goes to a handler thread.
    pub fn can_serve_inline(&self, payload: &[u8]) -> bool {
        self.locked_chunks.load(Ordering::Acquire) == 0
            && self.migrations.load(Ordering::Acquire) == 0
            && (myriad_proto::chunk::is_read_only_request(payload) || self.replication.is_none())
    }

    /// Serves an `async` put or remove on the calling thread, the messaging layer's I/O
    /// thread, when this peer replicates and nothing can make the change wait: no chunk
    /// lock held through this service, no migration, the chunks' order stripes free, and
    /// the replicator ready to queue the change at once
    /// ([`myriad_replication::Replicator::ready_without_waiting`]): each put's chunk already
    /// in a registered zone, room in every backup stream concerned. Returns the encoded
    /// reply, or `None` (nothing done) when the request must take the blocking path
    /// ([`ChunkService::serve_incoming`]). The replication is the same either way: the
    /// change is queued for the zone's backups in the order it was applied to memory.
    pub fn serve_change_inline(&self, from: NodeId, payload: &Bytes) -> Option<Bytes> {
        let replication = self.replication.as_ref()?;
        if !self.change_may_go_inline(payload) {
            return None;
        }
        let replicator = &replication.replicator;
        let is_async = |durability: u8| {
            durability_of(durability).unwrap_or(replicator.config().default_durability)
                == myriad_replication::Durability::Async
        };
        match ChunkRequest::decode(payload.clone()).ok()? {
            ChunkRequest::Put { items, durability } if is_async(durability) => {
                self.put_inline(from, &items, |stored, mut statuses| {
                    if let Err(error) = replicator.on_changes_nowait(&stored) {
                        fail_succeeded(&mut statuses, &replica_error(error));
                    }
                    ChunkReply::Statuses(statuses).encode()
                })
            }
            ChunkRequest::Remove { cids, durability } if is_async(durability) => {
                let _order = replication.try_lock(cids.iter().copied())?;
                let mut sized: Vec<AsyncChange<'_>> = Vec::with_capacity(cids.len());
                for &cid in &cids {
                    // The size cannot change meanwhile: every resize takes the stripe.
                    let size = self.mem.size(cid).unwrap_or(0) as u64;
                    sized.push(AsyncChange::Remove(cid, size));
                }
                if !replicator.ready_without_waiting(&sized) {
                    return None;
                }
                let mut removed: Vec<AsyncChange<'_>> = Vec::with_capacity(cids.len());
                let mut statuses: Vec<Result<(), ItemError>> = cids
                    .iter()
                    .zip(&sized)
                    .map(|(&cid, change)| {
                        self.remove_checked(cid)?;
                        removed.push(*change);
                        Ok(())
                    })
                    .collect();
                if let Err(error) = replicator.on_changes_nowait(&removed) {
                    fail_succeeded(&mut statuses, &replica_error(error));
                }
                self.changes_inline.fetch_add(1, Ordering::Relaxed);
                Some(ChunkReply::Statuses(statuses).encode())
            }
            _ => None,
        }
    }

    /// Serves a `replicated` or `durable` put on the calling thread, the messaging
    /// layer's I/O thread, without blocking any thread on the backups: under the same
    /// conditions as [`ChunkService::serve_change_inline`], memory is written and the
    /// change queued for the zone's backups, and the reply goes out from the replicator's
    /// callback once the backups acknowledged as the durability asks
    /// ([`Replicator::on_changes_deferred`]; on an error, the stored items fail as on the
    /// blocking path). Returns `false` (nothing done, the request untouched) when the
    /// request must take the blocking path ([`ChunkService::serve_incoming`]).
    pub fn serve_change_deferred(&self, from: NodeId, incoming: &mut Incoming) -> bool {
        let Some(replication) = self.replication.as_ref() else {
            return false;
        };
        if !self.change_may_go_inline(&incoming.payload) {
            return false;
        }
        let replicator = &replication.replicator;
        let Ok(ChunkRequest::Put { items, durability }) =
            ChunkRequest::decode(incoming.payload.clone())
        else {
            return false;
        };
        let durability =
            durability_of(durability).unwrap_or(replicator.config().default_durability);
        if durability == myriad_replication::Durability::Async {
            return false;
        }
        if !incoming.is_request() {
            return false;
        }
        self.put_inline(from, &items, |stored, statuses| {
            let reply = incoming.take_responder();
            let done: AckCallback = Box::new(move |result| {
                let mut statuses = statuses;
                if let Err(error) = result {
                    fail_succeeded(&mut statuses, &replica_error(error));
                }
                // A lost connection leaves the requester to its own timeout.
                if let Some(reply) = reply {
                    let _ = reply.respond(ChunkReply::Statuses(statuses).encode());
                }
            });
            if stored.is_empty() {
                done(Ok(()));
            } else if let Err((error, done)) =
                replicator.on_changes_deferred(&stored, durability, done)
            {
                done(Err(error));
            }
        })
        .is_some()
    }

    /// Whether a change request may be served on the I/O thread at all: no chunk lock held
    /// through this service, no migration, not refusing, and a change request.
    fn change_may_go_inline(&self, payload: &[u8]) -> bool {
        self.locked_chunks.load(Ordering::Acquire) == 0
            && self.migrations.load(Ordering::Acquire) == 0
            && !self.refusing()
            && myriad_proto::chunk::is_change_request(payload)
    }

    /// The inline put of [`ChunkService::serve_change_inline`] and
    /// [`ChunkService::serve_change_deferred`]: under the chunks' order stripes, when the
    /// replicator can take the changes at once, writes memory and hands the stored items'
    /// changes and every item's status to `report` (still under the stripes, so backups
    /// see a chunk's changes in memory order). `None`, nothing done, otherwise.
    fn put_inline<R>(
        &self,
        from: NodeId,
        items: &[(ChunkId, Bytes)],
        report: impl FnOnce(Vec<AsyncChange<'_>>, Vec<Result<(), ItemError>>) -> R,
    ) -> Option<R> {
        let replication = self.replication.as_ref()?;
        let changes: Vec<AsyncChange<'_>> = items
            .iter()
            .map(|(cid, data)| AsyncChange::Put(*cid, data))
            .collect();
        let _order = replication.try_lock(items.iter().map(|(cid, _)| *cid))?;
        if !replication.replicator.ready_without_waiting(&changes) {
            return None;
        }
        let statuses = self.put_memory(from, items);
        let stored: Vec<AsyncChange<'_>> = changes
            .into_iter()
            .zip(&statuses)
            .filter(|(_, status)| status.is_ok())
            .map(|(change, _)| change)
            .collect();
        self.changes_inline.fetch_add(1, Ordering::Relaxed);
        Some(report(stored, statuses))
    }

    /// How many replicated change requests were served on the I/O thread
    /// ([`ChunkService::serve_change_inline`]) since the start.
    pub fn changes_served_inline(&self) -> u64 {
        self.changes_inline.load(Ordering::Relaxed)
    }

    /// The counts and latencies of the remote chunk requests served (recorded by the
    /// peer's dispatch, [`ChunkService::serve_incoming`] and the slow path).
    pub fn ops(&self) -> &ChunkOps {
        &self.ops
    }

    /// Restored chunks announced by [`ChunkService::rereplication_begins`] not yet copied
    /// to their new backups.
    pub fn rereplication_pending(&self) -> u64 {
        self.rereplication_pending.load(Ordering::Relaxed)
    }

    /// Marks a migration as running until the guard drops: meanwhile the migration holds
    /// chunk locks the service does not track, so nothing is served inline.
    pub fn migration_guard(&self) -> MigrationGuard<'_> {
        self.migrations.fetch_add(1, Ordering::AcqRel);
        MigrationGuard { service: self }
    }

    /// Serves one incoming chunk request and responds to it: on the calling thread, or,
    /// for a changing request while a replicator is present, on a blocking thread of the
    /// replication runtime (see the module documentation). Non-requests are ignored.
    pub fn serve_incoming(self: &Arc<Self>, incoming: Incoming) {
        if !incoming.is_request() {
            return;
        }
        let timer = Timer::start();
        let from = incoming.from;
        let respond = |incoming: Incoming, reply: Bytes| {
            self.ops.record(&incoming.payload, &reply, timer);
            // A lost connection leaves the requester to its own timeout; nothing to do.
            let _ = incoming.respond(reply);
        };
        let Some(replication) = &self.replication else {
            let reply = self.serve(from, incoming.payload.clone());
            respond(incoming, reply);
            return;
        };
        let request = match ChunkRequest::decode(incoming.payload.clone()) {
            Ok(request) if is_change(&request) => request,
            _ => {
                let reply = self.serve(from, incoming.payload.clone());
                respond(incoming, reply);
                return;
            }
        };
        if replication.blocking.fetch_add(1, Ordering::AcqRel) >= BLOCKING_REQUESTS_MAX {
            replication.blocking.fetch_sub(1, Ordering::AcqRel);
            let reply = ChunkReply::Failed(ItemError::Internal(
                "overloaded: too many changes waiting for their backups".to_owned(),
            ));
            respond(incoming, reply.encode());
            return;
        }
        let service = Arc::clone(self);
        replication.runtime.spawn_blocking(move || {
            let reply = service.execute(from, request).encode();
            service.ops.record(&incoming.payload, &reply, timer);
            let _ = incoming.respond(reply);
            if let Some(replication) = &service.replication {
                replication.blocking.fetch_sub(1, Ordering::AcqRel);
            }
        });
    }

    /// Stops serving for good: the superpeers declared this node failed (see the module
    /// documentation). Every later request is answered [`ItemError::NotOwner`].
    pub fn declare_failed(&self) {
        self.declared_failed.store(true, Ordering::Release);
    }

    /// Whether [`ChunkService::declare_failed`] was called.
    pub fn is_declared_failed(&self) -> bool {
        self.declared_failed.load(Ordering::Acquire)
    }

    /// Decodes one encoded request from `from`, executes it and returns the encoded reply
    /// (gets are copied straight from memory into the reply).
    pub fn serve(&self, from: NodeId, payload: Bytes) -> Bytes {
        if self.refusing() {
            return match ChunkRequest::decode(payload) {
                Ok(request) => refused(&request).encode(),
                Err(error) => ChunkReply::Malformed(error.to_string()).encode(),
            };
        }
        match ChunkRequest::decode(payload) {
            Ok(ChunkRequest::Get { cids }) => {
                let mut writer = DataReplyWriter::new(cids.len(), cids.len() * 64);
                self.get_into(from, &cids, |_, item| match item {
                    Ok(bytes) => writer.push_data(bytes),
                    Err(error) => writer.push_error(&error),
                });
                writer.finish()
            }
            Ok(request) => self.execute(from, request).encode(),
            Err(error) => ChunkReply::Malformed(error.to_string()).encode(),
        }
    }

    /// Records that LIDs `first_lid..=last_lid` of `creator` are now owned by `owner`
    /// (called on the superpeers' ownership events). An invalid range is ignored.
    pub fn set_owner(&self, creator: NodeId, first_lid: u64, last_lid: u64, owner: NodeId) {
        self.set_owners(creator, &[(first_lid, last_lid, owner)]);
    }

    /// Sets the owners of several ranges of `creator`'s local IDs, in order (a later range
    /// wins where they overlap), under one hold of the ownership lock: no request sees the
    /// view between two of them. Invalid ranges are ignored.
    pub fn set_owners(&self, creator: NodeId, ranges: &[(u64, u64, NodeId)]) {
        let valid = |&&(first_lid, last_lid, _): &&(u64, u64, NodeId)| {
            let ok = first_lid <= last_lid && last_lid <= LOCAL_ID_MAX;
            if !ok {
                tracing::warn!(%creator, first_lid, last_lid, "ignoring invalid ownership range");
            }
            ok
        };
        let ranges: Vec<&(u64, u64, NodeId)> = ranges.iter().filter(valid).collect();
        if ranges.is_empty() {
            return;
        }
        let mut ownership = self.ownership.write();
        let tree = ownership.entry(creator).or_default();
        for &&(first_lid, last_lid, owner) in &ranges {
            tree.set_owner(creator, first_lid, last_lid, owner);
        }
        if tree.is_empty() {
            ownership.remove(&creator);
        }
        self.ownership_changes.fetch_add(1, Ordering::AcqRel);
    }

    /// The node that owns `cid` in this peer's view.
    pub fn owner_of(&self, cid: ChunkId) -> NodeId {
        let creator = cid.creator();
        match self.ownership.read().get(&creator) {
            Some(tree) => tree.lookup(creator, cid.local_id()).owner,
            None => creator,
        }
    }

    fn check_owner(&self, cid: ChunkId) -> Result<(), ItemError> {
        if self.owner_of(cid) == self.me {
            Ok(())
        } else {
            Err(ItemError::NotOwner)
        }
    }

    /// Releases every chunk lock `node` holds here (it failed or left). Returns how many
    /// locks were released.
    pub fn release_locks_of(&self, node: NodeId) -> usize {
        let mut released = 0;
        let mut locks = self.locks.lock();
        locks.retain(|&cid, holders| {
            if holders.writer == Some(node) {
                holders.writer = None;
                if self.mem.unlock_write(cid).is_ok() {
                    released += 1;
                }
            }
            holders.readers.retain(|&(reader, count)| {
                if reader != node {
                    return true;
                }
                for _ in 0..count {
                    if self.mem.unlock_read(cid).is_ok() {
                        released += 1;
                    }
                }
                false
            });
            !holders.is_empty()
        });
        self.locked_chunks.store(locks.len(), Ordering::Release);
        if released > 0 {
            tracing::info!(%node, released, "released the chunk locks of a departed node");
        }
        released
    }

    /// Every chunk lock held through this service: the chunk, its write-lock holder and
    /// its read-lock holders with their counts, in CID order (`chunklocklist`).
    pub fn lock_list(&self) -> Vec<LockRow> {
        let mut list: Vec<_> = self
            .locks
            .lock()
            .iter()
            .map(|(cid, holders)| (*cid, holders.writer, holders.readers.clone()))
            .collect();
        list.sort_by_key(|(cid, _, _)| *cid);
        list
    }

    /// Whether `node` holds the write lock of `cid` through this service.
    fn holds_write(&self, node: NodeId, cid: ChunkId) -> bool {
        self.locked_chunks.load(Ordering::Acquire) > 0
            && self
                .locks
                .lock()
                .get(&cid)
                .is_some_and(|holders| holders.writer == Some(node))
    }

    /// Reads `cids` for `from`, calling `visit(index, bytes or error)` once per CID in
    /// index order. A chunk whose write lock `from` holds is read under that lock.
    fn get_into(
        &self,
        from: NodeId,
        cids: &[ChunkId],
        mut visit: impl FnMut(usize, Result<&[u8], ItemError>),
    ) {
        // A read that waited for a migration's write lock gets the lock only after the
        // migration committed the new owner (`set_owner` bumps `ownership_changes`, then
        // the unlock releases): it must not return the old copy (a write at the new owner
        // may have come first) nor "not found" for the copy just dropped. Read under the
        // chunk's read lock, the counter shows it; such a read is answered `NotOwner`
        // and the client reads at the new owner.
        let changes = self.ownership_changes.load(Ordering::Acquire);
        let moved = |cid: ChunkId| {
            self.ownership_changes.load(Ordering::Acquire) != changes
                && self.check_owner(cid).is_err()
        };
        let ownership_simple = self.ownership.read().is_empty();
        let all_owned = ownership_simple && cids.iter().all(|cid| cid.creator() == self.me);
        if all_owned && self.locked_chunks.load(Ordering::Acquire) == 0 {
            self.mem.get_batch_with(cids, |index, result| {
                if moved(cids[index]) {
                    visit(index, Err(ItemError::NotOwner));
                } else {
                    visit(index, result.map_err(item_error));
                }
            });
            return;
        }
        let mut buffer = Vec::new();
        for (index, &cid) in cids.iter().enumerate() {
            if let Err(error) = self.check_owner(cid) {
                visit(index, Err(error));
                continue;
            }
            if self.holds_write(from, cid) {
                let result = self.mem.size(cid).and_then(|size| {
                    buffer.resize(size, 0);
                    self.mem.get_locked(cid, &mut buffer)
                });
                match result {
                    Ok(len) => visit(index, Ok(&buffer[..len])),
                    Err(error) => visit(index, Err(item_error(error))),
                }
                continue;
            }
            let mut visited = false;
            let result = self.mem.read_with(cid, |bytes| {
                visited = true;
                if moved(cid) {
                    visit(index, Err(ItemError::NotOwner));
                } else {
                    visit(index, Ok(bytes));
                }
            });
            if let (false, Err(error)) = (visited, result) {
                if moved(cid) {
                    visit(index, Err(ItemError::NotOwner));
                } else {
                    visit(index, Err(item_error(error)));
                }
            }
        }
    }

    /// Executes one request on behalf of `from` (a remote node, or this node for local
    /// callers) and returns the reply. Never panics.
    pub fn execute(&self, from: NodeId, request: ChunkRequest) -> ChunkReply {
        if self.refusing() {
            return refused(&request);
        }
        match request {
            ChunkRequest::Create { sizes, durability } => self.create(&sizes, durability),
            ChunkRequest::CreateWithData {
                payloads,
                durability,
            } => {
                let data: Vec<&[u8]> = payloads.iter().map(|p| p.as_ref()).collect();
                match self.mem.create_batch_with_data(&data) {
                    Ok(cids) => match self.replicate_creates(&cids, &data, durability) {
                        Ok(()) => ChunkReply::Created(cids),
                        Err(error) => ChunkReply::Failed(error),
                    },
                    Err(error) => ChunkReply::Failed(item_error(error)),
                }
            }
            ChunkRequest::Get { cids } => {
                let bytes_hint = cids.len() * 64;
                let mut arena = bytes::BytesMut::with_capacity(bytes_hint);
                let mut spans: Vec<Result<(usize, usize), ItemError>> =
                    Vec::with_capacity(cids.len());
                self.get_into(from, &cids, |_, item| match item {
                    Ok(bytes) => {
                        let start = arena.len();
                        arena.extend_from_slice(bytes);
                        spans.push(Ok((start, arena.len())));
                    }
                    Err(error) => spans.push(Err(error)),
                });
                let arena = arena.freeze();
                ChunkReply::Data(
                    spans
                        .into_iter()
                        .map(|span| span.map(|(start, end)| arena.slice(start..end)))
                        .collect(),
                )
            }
            ChunkRequest::Put { items, durability } => {
                ChunkReply::Statuses(self.put(from, &items, durability))
            }
            ChunkRequest::Remove { cids, durability } => {
                ChunkReply::Statuses(self.remove(&cids, durability))
            }
            ChunkRequest::Insert { items, durability } => {
                let borrowed: Vec<(ChunkId, &[u8])> = items
                    .iter()
                    .map(|(cid, data)| (*cid, data.as_ref()))
                    .collect();
                let Some(replication) = &self.replication else {
                    return ChunkReply::Statuses(
                        self.mem
                            .create_with_ids(&borrowed)
                            .into_iter()
                            .map(status)
                            .collect(),
                    );
                };
                let _order = replication.lock(borrowed.iter().map(|(cid, _)| *cid));
                let mut statuses: Vec<Result<(), ItemError>> = self
                    .mem
                    .create_with_ids(&borrowed)
                    .into_iter()
                    .map(status)
                    .collect();
                let stored: Vec<(ChunkId, &[u8])> = borrowed
                    .iter()
                    .zip(&statuses)
                    .filter(|(_, status)| status.is_ok())
                    .map(|(item, _)| *item)
                    .collect();
                if let Err(error) = replication
                    .replicator
                    .on_create_batch(&stored, durability_of(durability))
                {
                    fail_succeeded(&mut statuses, &replica_error(error));
                }
                ChunkReply::Statuses(statuses)
            }
            ChunkRequest::ReadAt { cid, offset, len } => {
                ChunkReply::Data(vec![self.read_at(cid, offset, len)])
            }
            ChunkRequest::WriteAt {
                cid,
                offset,
                data,
                durability,
            } => ChunkReply::Statuses(vec![self.write_at(from, cid, offset, &data, durability)]),
            ChunkRequest::Resize {
                cid,
                size,
                durability,
            } => ChunkReply::Statuses(vec![self.resize(from, cid, size, durability)]),
            ChunkRequest::Lock {
                cid,
                write,
                timeout_ms,
            } => ChunkReply::Statuses(vec![self.lock(from, cid, write, timeout_ms)]),
            ChunkRequest::Unlock { cid, write } => {
                ChunkReply::Statuses(vec![self.unlock(from, cid, write)])
            }
            ChunkRequest::Status { cids } => ChunkReply::Sizes(
                cids.iter()
                    .map(|&cid| {
                        self.check_owner(cid)?;
                        self.mem
                            .size(cid)
                            .map(|size| size as u64)
                            .map_err(item_error)
                    })
                    .collect(),
            ),
            ChunkRequest::List { creator, max } => self.list(creator, max),
            ChunkRequest::Stats => {
                let stats = self.mem.stats();
                ChunkReply::Stats(ChunkStats {
                    chunks: stats.chunks,
                    payload_bytes: stats.payload_bytes,
                    used_bytes: stats.allocated_bytes,
                    free_bytes: stats.free_bytes,
                    region_bytes: stats.region_bytes,
                    rereplication_pending: self.rereplication_pending.load(Ordering::Relaxed),
                    requests_served: self.ops.total(),
                })
            }
        }
    }

    /// Reports freshly created chunks (`cids[i]` holds `data[i]`) to the replicator.
    fn replicate_creates(
        &self,
        cids: &[ChunkId],
        data: &[&[u8]],
        durability: u8,
    ) -> Result<(), ItemError> {
        let Some(replication) = &self.replication else {
            return Ok(());
        };
        let _order = replication.lock(cids.iter().copied());
        let items: Vec<(ChunkId, &[u8])> = cids.iter().copied().zip(data.iter().copied()).collect();
        replication
            .replicator
            .on_create_batch(&items, durability_of(durability))
            .map_err(replica_error)
    }

    /// Announces `chunks` restored chunks whose adopted zone [`ChunkService::copy_adopted`]
    /// will copy to its new backups (they count in the stats' `rereplication_pending` until
    /// then).
    pub fn rereplication_begins(&self, chunks: u64) {
        self.rereplication_pending
            .fetch_add(chunks, Ordering::Relaxed);
    }

    /// Takes back `chunks` announced by [`ChunkService::rereplication_begins`] (their copy
    /// finished, failed or could not start).
    pub fn rereplication_cancelled(&self, chunks: u64) {
        let _ = self.rereplication_pending.fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |value| Some(value.saturating_sub(chunks)),
        );
    }

    /// Copies a zone this peer adopted after restoring it ([`Replicator::adopt_zone`]) to
    /// the zone's added backups ([`Replicator::copy_adopted`]: changes made meanwhile are
    /// never overtaken by an older copy), and returns the chunks copied once the copies are
    /// on the new backups' disks. The `chunks` announced for it by
    /// [`ChunkService::rereplication_begins`] leave the pending count when this returns,
    /// also when it fails.
    pub fn copy_adopted(
        &self,
        adoption: &myriad_replication::Adoption,
        chunks: u64,
    ) -> Result<u64, ItemError> {
        let result = match &self.replication {
            Some(replication) => replication
                .replicator
                .copy_adopted(adoption)
                .map_err(replica_error),
            None => Ok(0),
        };
        self.rereplication_cancelled(chunks);
        result
    }

    /// Reports that `cid` (of `size` bytes) was removed from memory by someone other than
    /// a remove request (migration). Takes the chunk's stripe.
    pub fn replicate_removed(&self, cid: ChunkId, size: usize) -> Result<(), ItemError> {
        let Some(replication) = &self.replication else {
            return Ok(());
        };
        let _order = replication.lock([cid]);
        replication
            .replicator
            .on_remove(cid, size as u64, None)
            .map_err(replica_error)
    }

    /// Removes `cid` from memory if this peer owns it. A remove that waited for a
    /// migration's lock hit the copy being dropped (or found it dropped): `NotOwner`, so
    /// that the client removes the chunk at its new owner.
    fn remove_checked(&self, cid: ChunkId) -> Result<(), ItemError> {
        self.check_owner(cid)?;
        let changes = self.ownership_changes.load(Ordering::Acquire);
        let result = status(self.mem.remove(cid));
        self.check_not_moved(cid, changes)?;
        result
    }

    fn remove(&self, cids: &[ChunkId], durability: u8) -> Vec<Result<(), ItemError>> {
        let Some(replication) = &self.replication else {
            return cids.iter().map(|&cid| self.remove_checked(cid)).collect();
        };
        let _order = replication.lock(cids.iter().copied());
        let mut removed: Vec<(ChunkId, u64)> = Vec::new();
        let mut statuses: Vec<Result<(), ItemError>> = cids
            .iter()
            .map(|&cid| {
                // The size cannot change meanwhile: every resize takes the stripe.
                let size = self.mem.size(cid).unwrap_or(0) as u64;
                self.remove_checked(cid)?;
                removed.push((cid, size));
                Ok(())
            })
            .collect();
        if let Err(error) = replication
            .replicator
            .on_remove_batch(&removed, durability_of(durability))
        {
            fail_succeeded(&mut statuses, &replica_error(error));
        }
        statuses
    }

    fn create(&self, sizes: &[u64], durability: u8) -> ChunkReply {
        let max = self.mem.config().chunk_bytes_max;
        let mut converted = Vec::with_capacity(sizes.len());
        for &size in sizes {
            if size > max {
                return ChunkReply::Failed(ItemError::TooLarge);
            }
            match to_usize(size, "size") {
                Ok(size) => converted.push(size),
                Err(error) => return ChunkReply::Failed(error),
            }
        }
        match self.mem.create_batch(&converted) {
            Ok(cids) => {
                if self.replication.is_some() {
                    let zeros = vec![0u8; converted.iter().copied().max().unwrap_or(0)];
                    let data: Vec<&[u8]> = converted.iter().map(|&size| &zeros[..size]).collect();
                    if let Err(error) = self.replicate_creates(&cids, &data, durability) {
                        return ChunkReply::Failed(error);
                    }
                }
                ChunkReply::Created(cids)
            }
            Err(error) => ChunkReply::Failed(item_error(error)),
        }
    }

    fn put(
        &self,
        from: NodeId,
        items: &[(ChunkId, Bytes)],
        durability: u8,
    ) -> Vec<Result<(), ItemError>> {
        let Some(replication) = &self.replication else {
            return self.put_memory(from, items);
        };
        let _order = replication.lock(items.iter().map(|(cid, _)| *cid));
        let mut statuses = self.put_memory(from, items);
        let stored: Vec<(ChunkId, &[u8])> = items
            .iter()
            .zip(&statuses)
            .filter(|(_, status)| status.is_ok())
            .map(|((cid, data), _)| (*cid, data.as_ref()))
            .collect();
        if let Err(error) = replication
            .replicator
            .on_put_batch(&stored, durability_of(durability))
        {
            fail_succeeded(&mut statuses, &replica_error(error));
        }
        statuses
    }

    /// Writes the items to memory. A put (or write-at) that had to wait for a chunk's write lock may
    /// find that a migration held it and moved the chunk meanwhile (the migration commits
    /// the new owner before it unlocks, then drops the old copy): such a write went to the
    /// copy being dropped, so the put is answered [`ItemError::NotOwner`] and the client
    /// retries at the new owner. Writes that landed before the migration copied the chunk
    /// are answered the same when the move committed before the put returned; the retry
    /// writes the same bytes again, which is a valid order for a put still in progress.
    fn put_memory(&self, from: NodeId, items: &[(ChunkId, Bytes)]) -> Vec<Result<(), ItemError>> {
        let changes = self.ownership_changes.load(Ordering::Acquire);
        let mut statuses = self.put_memory_unchecked(from, items);
        // Acquire pairs with the migration's unlock (release) after its `set_owner`: a
        // write that waited for that unlock sees the change here.
        if self.ownership_changes.load(Ordering::Acquire) != changes {
            for (status, (cid, _)) in statuses.iter_mut().zip(items) {
                if status.is_ok() {
                    *status = self.check_not_moved(*cid, changes);
                }
            }
        }
        statuses
    }

    /// After a write that may have waited on `cid`'s lock: `NotOwner` if the ownership
    /// view changed since `changes` was read and `cid` is no longer this peer's (see
    /// [`ChunkService::put_memory`]).
    fn check_not_moved(&self, cid: ChunkId, changes: u64) -> Result<(), ItemError> {
        if self.ownership_changes.load(Ordering::Acquire) == changes {
            return Ok(());
        }
        self.check_owner(cid)
    }

    fn put_memory_unchecked(
        &self,
        from: NodeId,
        items: &[(ChunkId, Bytes)],
    ) -> Vec<Result<(), ItemError>> {
        let simple = self.ownership.read().is_empty()
            && self.locked_chunks.load(Ordering::Acquire) == 0
            && items.iter().all(|(cid, _)| cid.creator() == self.me);
        if simple {
            let borrowed: Vec<(ChunkId, &[u8])> = items
                .iter()
                .map(|(cid, data)| (*cid, data.as_ref()))
                .collect();
            return self
                .mem
                .put_batch(&borrowed)
                .into_iter()
                .map(status)
                .collect();
        }
        items
            .iter()
            .map(|(cid, data)| {
                self.check_owner(*cid)?;
                if self.holds_write(from, *cid) {
                    status(self.mem.put_locked(*cid, data))
                } else {
                    status(self.mem.put(*cid, data))
                }
            })
            .collect()
    }

    fn read_at(&self, cid: ChunkId, offset: u64, len: u64) -> Result<Bytes, ItemError> {
        self.check_owner(cid)?;
        let changes = self.ownership_changes.load(Ordering::Acquire);
        let result = self.read_at_unchecked(cid, offset, len);
        // As for a get: a read that waited for a migration's lock is answered `NotOwner`.
        self.check_not_moved(cid, changes)?;
        result
    }

    fn read_at_unchecked(&self, cid: ChunkId, offset: u64, len: u64) -> Result<Bytes, ItemError> {
        let offset = to_usize(offset, "offset")?;
        let len = to_usize(len, "length")?;
        // Check the range against the chunk before allocating the buffer.
        let size = self.mem.size(cid).map_err(item_error)?;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(ItemError::Invalid(format!(
                "bytes {offset}..{offset}+{len} are outside chunk {cid} of {size} bytes"
            )));
        }
        let mut buffer = vec![0u8; len];
        self.mem
            .read_at(cid, offset, &mut buffer)
            .map_err(item_error)?;
        Ok(Bytes::from(buffer))
    }

    fn refuse_write_locked(&self, from: NodeId, cid: ChunkId) -> Result<(), ItemError> {
        if self.holds_write(from, cid) {
            return Err(ItemError::Invalid(format!(
                "chunk {cid} is write-locked by the caller; only get and put work under the lock"
            )));
        }
        Ok(())
    }

    fn write_at(
        &self,
        from: NodeId,
        cid: ChunkId,
        offset: u64,
        data: &[u8],
        durability: u8,
    ) -> Result<(), ItemError> {
        self.check_owner(cid)?;
        self.refuse_write_locked(from, cid)?;
        let offset = to_usize(offset, "offset")?;
        let changes = self.ownership_changes.load(Ordering::Acquire);
        let Some(replication) = &self.replication else {
            status(self.mem.write_at(cid, offset, data))?;
            return self.check_not_moved(cid, changes);
        };
        let _order = replication.lock([cid]);
        status(self.mem.write_at(cid, offset, data))?;
        self.check_not_moved(cid, changes)?;
        // Backups hold whole chunks: send the chunk as it is now.
        let whole = self.whole(cid)?;
        replication
            .replicator
            .on_put(cid, &whole, durability_of(durability))
            .map_err(replica_error)
    }

    /// A copy of the chunk's whole payload (for the replicator, under the chunk's stripe).
    fn whole(&self, cid: ChunkId) -> Result<Vec<u8>, ItemError> {
        self.mem.read_with(cid, <[u8]>::to_vec).map_err(|error| {
            ItemError::Internal(format!(
                "changed in memory, but reading it back for the backups failed: {error}"
            ))
        })
    }

    fn resize(
        &self,
        from: NodeId,
        cid: ChunkId,
        size: u64,
        durability: u8,
    ) -> Result<(), ItemError> {
        self.check_owner(cid)?;
        self.refuse_write_locked(from, cid)?;
        if size > self.mem.config().chunk_bytes_max {
            return Err(ItemError::TooLarge);
        }
        let size = to_usize(size, "size")?;
        // As for a put: a resize that waited for a migration's lock went to the copy being
        // dropped, so it is answered `NotOwner` and retried at the new owner.
        let changes = self.ownership_changes.load(Ordering::Acquire);
        let Some(replication) = &self.replication else {
            let result = status(self.mem.resize(cid, size));
            self.check_not_moved(cid, changes)?;
            return result;
        };
        let _order = replication.lock([cid]);
        let old = self.mem.size(cid).map_err(item_error)?;
        let result = status(self.mem.resize(cid, size));
        self.check_not_moved(cid, changes)?;
        result?;
        let whole = self.whole(cid)?;
        replication
            .replicator
            .on_resize(cid, old as u64, &whole, durability_of(durability))
            .map_err(replica_error)
    }

    fn lock(
        &self,
        from: NodeId,
        cid: ChunkId,
        write: bool,
        timeout_ms: u64,
    ) -> Result<(), ItemError> {
        self.check_owner(cid)?;
        let timeout = Duration::from_millis(timeout_ms.min(LOCK_TIMEOUT_MS_MAX));
        let result = match (write, timeout.is_zero()) {
            (true, true) => self.mem.try_lock_write(cid),
            (true, false) => self.mem.lock_write(cid, timeout),
            (false, true) => self.mem.try_lock_read(cid),
            (false, false) => self.mem.lock_read(cid, timeout),
        };
        result.map_err(item_error)?;
        let mut locks = self.locks.lock();
        let holders = locks.entry(cid).or_default();
        if write {
            holders.writer = Some(from);
        } else {
            match holders.readers.iter_mut().find(|(node, _)| *node == from) {
                Some((_, count)) => *count += 1,
                None => holders.readers.push((from, 1)),
            }
        }
        self.locked_chunks.store(locks.len(), Ordering::Release);
        Ok(())
    }

    fn unlock(&self, from: NodeId, cid: ChunkId, write: bool) -> Result<(), ItemError> {
        let mut locks = self.locks.lock();
        let not_held = || {
            ItemError::Invalid(format!(
                "node {from} holds no {} lock on chunk {cid}",
                if write { "write" } else { "read" }
            ))
        };
        let holders = locks.get_mut(&cid).ok_or_else(not_held)?;
        if write {
            if holders.writer != Some(from) {
                return Err(not_held());
            }
            holders.writer = None;
            status(self.mem.unlock_write(cid))?;
        } else {
            let position = holders
                .readers
                .iter()
                .position(|(node, _)| *node == from)
                .ok_or_else(not_held)?;
            holders.readers[position].1 -= 1;
            if holders.readers[position].1 == 0 {
                holders.readers.swap_remove(position);
            }
            status(self.mem.unlock_read(cid))?;
        }
        if holders.is_empty() {
            locks.remove(&cid);
        }
        self.locked_chunks.store(locks.len(), Ordering::Release);
        Ok(())
    }

    fn list(&self, creator: Option<NodeId>, max: u64) -> ChunkReply {
        let max = usize::try_from(max)
            .unwrap_or(usize::MAX)
            .min(LIST_RANGES_MAX);
        let creators = match creator {
            Some(creator) => vec![creator],
            None => self.mem.creators(),
        };
        let mut ranges = Vec::new();
        let mut truncated = false;
        for creator in creators {
            for range in self.mem.chunk_ranges(creator) {
                if ranges.len() == max {
                    truncated = true;
                    break;
                }
                ranges.push(range);
            }
        }
        ChunkReply::Ranges { ranges, truncated }
    }
}

/// Whether `request` changes chunks (and so is reported to a replicator).
fn is_change(request: &ChunkRequest) -> bool {
    matches!(
        request,
        ChunkRequest::Create { .. }
            | ChunkRequest::CreateWithData { .. }
            | ChunkRequest::Put { .. }
            | ChunkRequest::Remove { .. }
            | ChunkRequest::Insert { .. }
            | ChunkRequest::WriteAt { .. }
            | ChunkRequest::Resize { .. }
    )
}

/// Turns every `Ok` of `statuses` into `error` (the replicator failed for the batch).
fn fail_succeeded(statuses: &mut [Result<(), ItemError>], error: &ItemError) {
    for status in statuses.iter_mut().filter(|status| status.is_ok()) {
        *status = Err(error.clone());
    }
}

impl LocalChunks for ChunkService {
    fn execute(&self, request: ChunkRequest) -> ChunkReply {
        ChunkService::execute(self, self.me, request)
    }

    fn node(&self) -> NodeId {
        self.me
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_mem::MemoryConfig;

    fn pending(service: &ChunkService) -> u64 {
        let reply = service.serve(NodeId(9), ChunkRequest::Stats.encode());
        match ChunkReply::decode(reply) {
            Ok(ChunkReply::Stats(stats)) => stats.rereplication_pending,
            other => panic!("unexpected stats reply {other:?}"),
        }
    }

    #[test]
    fn rereplication_pending_counts_announced_chunks_until_copied() {
        let mem = MemoryManager::new(MemoryConfig {
            node_id: NodeId(1),
            region_bytes: 16 << 20,
            ..MemoryConfig::default()
        })
        .expect("memory manager");
        let service = ChunkService::new(Arc::new(mem), NodeId(1));
        assert_eq!(pending(&service), 0);
        let cids: Vec<ChunkId> = (1..=5)
            .filter_map(|lid| ChunkId::new(NodeId(2), lid))
            .collect();
        service.rereplication_begins(cids.len() as u64);
        service.rereplication_begins(3);
        assert_eq!(pending(&service), 8);
        service.rereplication_cancelled(3);
        assert_eq!(pending(&service), 5);
        // Without a replicator nothing is copied, but the chunks leave the count.
        let adoption = myriad_replication::Adoption {
            zone: 0,
            owner: NodeId(2),
            log_zone: 0,
            backups: Vec::new(),
            added: Vec::new(),
        };
        assert_eq!(service.copy_adopted(&adoption, 2), Ok(0));
        assert_eq!(pending(&service), 3);
        assert_eq!(service.copy_adopted(&adoption, 3), Ok(0));
        assert_eq!(pending(&service), 0);
        // The count never wraps below zero.
        service.rereplication_cancelled(10);
        assert_eq!(pending(&service), 0);
    }
}
