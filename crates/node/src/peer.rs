//! The peer: a memory manager serving chunks to remote clients.
//!
//! # Job
//! [`ChunkService`] executes the [`ChunkRequest`]s of [`myriad_proto::chunk`] against the
//! peer's [`MemoryManager`]: for remote nodes through the messaging layer
//! ([`ChunkService::register`]), for applications in the same process through
//! [`ChunkService::execute`] or the client's [`LocalChunks`] trait (no network hop).
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
//! - The `durability` field of changing requests is ignored for now: there are no backups
//!   yet, every change is acknowledged once it is in this peer's memory.
//!
//! # Who calls it
//! The peer process (`myriad peer`) builds one service per node, registers it before the
//! endpoint is reachable, and calls [`ChunkService::set_owner`] on the superpeers'
//! ownership events and [`ChunkService::release_locks_of`] on failure/leave events.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_client::chunk::LocalChunks;
use myriad_mem::{ChunkId, MemError, MemoryManager, NodeId, LOCAL_ID_MAX};
use myriad_meta::LookupTree;
use myriad_net::{Handlers, Incoming, NetError};
use myriad_proto::chunk::{
    ChunkReply, ChunkRequest, ChunkStats, DataReplyWriter, ItemError, LIST_RANGES_MAX,
};
use parking_lot::{Mutex, RwLock};

/// The longest a `Lock` request may wait for a chunk lock; longer timeouts are cut to it
/// (a waiting lock request occupies a handler thread).
pub const LOCK_TIMEOUT_MS_MAX: u64 = 30_000;

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
    /// Chunk locks taken through this service, with their holders.
    locks: Mutex<HashMap<ChunkId, Holders>>,
    /// `locks.len()`, readable without the mutex: data requests look at holders only when
    /// some lock is held.
    locked_chunks: AtomicUsize,
    /// Migrations running (see [`ChunkService::migration_guard`]).
    migrations: AtomicUsize,
    /// Whether writes may wait for something (see [`ChunkService::set_writes_may_wait`]).
    writes_may_wait: AtomicBool,
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
            locks: Mutex::new(HashMap::new()),
            locked_chunks: AtomicUsize::new(0),
            migrations: AtomicUsize::new(0),
            writes_may_wait: AtomicBool::new(false),
        }
    }

    /// This peer's node ID.
    pub fn node(&self) -> NodeId {
        self.me
    }

    /// The memory manager served.
    pub fn memory(&self) -> &Arc<MemoryManager> {
        &self.mem
    }

    /// Registers the [`myriad_proto::types::CHUNK`] handler. Call before other nodes may
    /// send chunk requests.
    ///
    /// The handler runs on the endpoint's handler pool, not inline on the I/O thread: a
    /// chunk request can wait for a chunk lock (a `Lock` request up to its timeout, and a
    /// get, put or remove of a chunk another node has locked up to the memory manager's
    /// lock timeout), and an inline handler that waits stalls every connection of that
    /// I/O thread. The hand-off costs one thread wake-up per request: single 64-byte gets
    /// from one client thread over loopback ran at 5,100–6,300/s on the pool against
    /// 6,400–6,900/s inline (debug build, shared 2-core machine, two runs each), a 10–25%
    /// latency cost accepted for never stalling a connection behind a lock wait.
    pub fn register(self: &Arc<Self>, handlers: &mut Handlers) -> Result<(), NetError> {
        let service = Arc::clone(self);
        handlers.register(myriad_proto::types::CHUNK, move |incoming: Incoming| {
            if !incoming.is_request() {
                return;
            }
            let from = myriad_proto::node_id(incoming.from);
            let reply = service.serve(from, incoming.payload.clone());
            // A lost connection leaves the requester to its own timeout; nothing to do.
            let _ = incoming.respond(reply);
        })?;
        Ok(())
    }

    /// Whether `payload` can be served on the messaging layer's I/O thread: it must not
    /// wait. True for read-only requests and for writes while writes never wait, and only
    /// while no chunk lock is held through this service and no migration runs (a read of
    /// a locked chunk waits for the lock). Everything else goes to a handler thread.
    pub fn can_serve_inline(&self, payload: &[u8]) -> bool {
        self.locked_chunks.load(Ordering::Acquire) == 0
            && self.migrations.load(Ordering::Acquire) == 0
            && (myriad_proto::chunk::is_read_only_request(payload)
                || !self.writes_may_wait.load(Ordering::Acquire))
    }

    /// Declares whether writes may wait (true once a replicator that can wait for backups
    /// is attached): such writes are then never served on the I/O thread.
    pub fn set_writes_may_wait(&self, may_wait: bool) {
        self.writes_may_wait.store(may_wait, Ordering::Release);
    }

    /// Marks a migration as running until the guard drops: meanwhile the migration holds
    /// chunk locks the service does not track, so nothing is served inline.
    pub fn migration_guard(&self) -> MigrationGuard<'_> {
        self.migrations.fetch_add(1, Ordering::AcqRel);
        MigrationGuard { service: self }
    }

    /// Decodes one encoded request from `from`, executes it and returns the encoded reply
    /// (gets are copied straight from memory into the reply).
    pub fn serve(&self, from: NodeId, payload: Bytes) -> Bytes {
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
        if first_lid > last_lid || last_lid > LOCAL_ID_MAX {
            tracing::warn!(%creator, first_lid, last_lid, "ignoring invalid ownership range");
            return;
        }
        let mut ownership = self.ownership.write();
        let tree = ownership.entry(creator).or_default();
        tree.set_owner(creator, first_lid, last_lid, owner);
        if tree.is_empty() {
            ownership.remove(&creator);
        }
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
        let ownership_simple = self.ownership.read().is_empty();
        let all_owned = ownership_simple && cids.iter().all(|cid| cid.creator() == self.me);
        if all_owned && self.locked_chunks.load(Ordering::Acquire) == 0 {
            self.mem.get_batch_with(cids, |index, result| {
                visit(index, result.map_err(item_error))
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
                visit(index, Ok(bytes));
            });
            if let (false, Err(error)) = (visited, result) {
                visit(index, Err(item_error(error)));
            }
        }
    }

    /// Executes one request on behalf of `from` (a remote node, or this node for local
    /// callers) and returns the reply. Never panics.
    pub fn execute(&self, from: NodeId, request: ChunkRequest) -> ChunkReply {
        match request {
            ChunkRequest::Create { sizes, .. } => self.create(&sizes),
            ChunkRequest::CreateWithData { payloads, .. } => {
                let data: Vec<&[u8]> = payloads.iter().map(|p| p.as_ref()).collect();
                match self.mem.create_batch_with_data(&data) {
                    Ok(cids) => ChunkReply::Created(cids),
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
            ChunkRequest::Put { items, .. } => ChunkReply::Statuses(self.put(from, &items)),
            ChunkRequest::Remove { cids, .. } => ChunkReply::Statuses(
                cids.iter()
                    .map(|&cid| {
                        self.check_owner(cid)?;
                        status(self.mem.remove(cid))
                    })
                    .collect(),
            ),
            ChunkRequest::Insert { items, .. } => {
                let borrowed: Vec<(ChunkId, &[u8])> = items
                    .iter()
                    .map(|(cid, data)| (*cid, data.as_ref()))
                    .collect();
                ChunkReply::Statuses(
                    self.mem
                        .create_with_ids(&borrowed)
                        .into_iter()
                        .map(status)
                        .collect(),
                )
            }
            ChunkRequest::ReadAt { cid, offset, len } => {
                ChunkReply::Data(vec![self.read_at(cid, offset, len)])
            }
            ChunkRequest::WriteAt {
                cid, offset, data, ..
            } => ChunkReply::Statuses(vec![self.write_at(from, cid, offset, &data)]),
            ChunkRequest::Resize { cid, size, .. } => {
                ChunkReply::Statuses(vec![self.resize(from, cid, size)])
            }
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
                })
            }
        }
    }

    fn create(&self, sizes: &[u64]) -> ChunkReply {
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
            Ok(cids) => ChunkReply::Created(cids),
            Err(error) => ChunkReply::Failed(item_error(error)),
        }
    }

    fn put(&self, from: NodeId, items: &[(ChunkId, Bytes)]) -> Vec<Result<(), ItemError>> {
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
    ) -> Result<(), ItemError> {
        self.check_owner(cid)?;
        self.refuse_write_locked(from, cid)?;
        let offset = to_usize(offset, "offset")?;
        status(self.mem.write_at(cid, offset, data))
    }

    fn resize(&self, from: NodeId, cid: ChunkId, size: u64) -> Result<(), ItemError> {
        self.check_owner(cid)?;
        self.refuse_write_locked(from, cid)?;
        if size > self.mem.config().chunk_bytes_max {
            return Err(ItemError::TooLarge);
        }
        let size = to_usize(size, "size")?;
        status(self.mem.resize(cid, size))
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

impl LocalChunks for ChunkService {
    fn execute(&self, request: ChunkRequest) -> ChunkReply {
        ChunkService::execute(self, self.me, request)
    }

    fn node(&self) -> NodeId {
        self.me
    }
}
