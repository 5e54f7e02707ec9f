//! The master side: zones, placement, registration and one sequenced stream per backup.
//!
//! # How a write travels
//! `on_*` takes the state lock, finds (or opens, places and starts registering) the
//! chunk's zone, and appends the operation to the pending queue of each of the zone's
//! backups' streams, in backup order, giving it the stream's next sequence number. The
//! sender thread drains pending queues into [`LogMessage`]s of up to
//! [`ReplicatorConfig::message_bytes_target`] (so under load many small writes share a
//! message, at low load nothing waits for company), moves them into the stream's window of
//! unacknowledged messages and hands them to the stream's send task (one async task per
//! backup on the messaging runtime, so the messages of a stream leave in order and a backup
//! that is slow to connect holds up only its own stream). Acknowledgements ([`wire::ACK`]) advance each
//! stream's applied and durable marks, free the window and wake waiting writers.
//!
//! # Resending
//! A lost connection (a `ConnectionLost` event), a gap reported by the backup, or no
//! progress for [`ReplicatorConfig::ack_timeout`] (doubling per fruitless resend) makes the
//! sender resend the whole window from the first unacknowledged message, once the stream's
//! send task is idle; the backup drops what it already has. A stream
//! without progress for [`ReplicatorConfig::unreachable_timeout`] is reported once as
//! [`ReplicaEvent::BackupUnreachable`]; the node then calls [`Replicator::replace_backup`].
//!
//! # Re-replication
//! [`Replicator::replace_backup`] puts a replacement into every zone of the failed backup
//! (at the end of the backup order), registers the new order, and copies the zone from the
//! master's memory ([`ChunkSource`]) to the new backup on a background thread, in slices,
//! without holding the state lock while reading memory. Changes made meanwhile go to the
//! new backup through its stream as usual and mark their CIDs *dirty*; a slice skips dirty
//! CIDs, so a copy read before a change never lands after it.
//!
//! # Adoption (issue 6)
//! [`Replicator::adopt_zone`] takes over a failed peer's zone that this master restored:
//! the zone keeps its log identity `(owner, zone)` (the name of its log on every backup
//! and in the zone table); its backups are the surviving ones plus new ones; it is
//! registered through the same [`ZoneRegistry`] (with `owner` ≠ this master: the node
//! commits `ZoneAdopt`), and the failed peer's CID ranges join this master's zone tree
//! under a local zone number. Every operation of such a zone names the log owner on the
//! wire ([`Op::Put`]/[`Op::Remove`] with `owner`). [`Replicator::copy_adopted`] copies it
//! to the added backups with the re-replication above; from then on it is a zone like any
//! other (replacements, fills).
//!
//! # Caller contract
//! Changes of one chunk must be reported in the order they were applied to memory (e.g.
//! while holding the chunk's write lock). [`ChunkSource`] and [`BackupCandidates`] are
//! called while no lock of this module is held, except `candidates()` which is called under
//! the state lock and must not call back into the replicator.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use myriad_net::{Incoming, NetHandle};
use myriad_placement::zones::ZoneUsage;
use myriad_placement::{Candidate, Placement, PlacementError, Strategy, ZoneId, ZoneTree};
use myriad_types::{ChunkId, NodeId};
use parking_lot::{Condvar, Mutex, MutexGuard};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::wire::{self, encode_log_message, Ack, AckStatus, Op};
use crate::{Durability, ReplicaError};

/// Ranges of an adopted zone up to this many CIDs are split around CIDs that already have
/// a zone here; longer overlapping ranges stay where they are.
const ADOPT_SPLIT_SPAN_MAX: u64 = 1 << 16;

/// What a registration returns: resolves once the zone → backups entry is committed.
pub type RegisterFuture = Pin<Box<dyn Future<Output = Result<(), RegistryError>> + Send>>;

/// Why the cluster did not register a zone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RegistryError(pub String);

/// Records a zone's ordered backups with the cluster (the node commits it to the
/// superpeer group). Called for every new zone and every change of a zone's backups.
pub trait ZoneRegistry: Send + Sync + 'static {
    /// Registers `owner`'s zone `zone` with `backups` (in backup order). The future runs on
    /// the messaging layer's runtime.
    fn register(&self, owner: NodeId, zone: u32, backups: Vec<NodeId>) -> RegisterFuture;
}

/// The peers that may hold backups now: alive, with the backup capability, with rack and
/// switch. May include the master itself (it is filtered out).
pub trait BackupCandidates: Send + Sync + 'static {
    /// The current candidates.
    fn candidates(&self) -> Vec<Candidate>;
}

/// Reads the master's chunks for re-replication (the node implements it over its memory
/// manager).
pub trait ChunkSource: Send + Sync + 'static {
    /// Calls `visit` with every stored chunk whose CID lies in `first..=last`, in ascending
    /// CID order, until `visit` returns `false`.
    fn for_each_in_range(
        &self,
        first: ChunkId,
        last: ChunkId,
        visit: &mut dyn FnMut(ChunkId, &[u8]) -> bool,
    );
}

/// Settings of a [`Replicator`].
#[derive(Debug, Clone)]
pub struct ReplicatorConfig {
    /// This node (the master).
    pub node: NodeId,
    /// This node's rack and switch (for rack-aware placement).
    pub rack: u16,
    /// This node's switch.
    pub switch: u16,
    /// Backups per zone. Default 3; 0 = no backups (every call returns at once).
    pub replication: usize,
    /// Payload bytes per zone. Default 256 MiB.
    pub zone_bytes: u64,
    /// How backups are chosen. Default random with disjunctive first backups.
    pub strategy: Strategy,
    /// Durability of calls that pass `None`. Default `Async`.
    pub default_durability: Durability,
    /// Longest a call waits (for its durability, stream room or registration). Default 10 s.
    pub wait_timeout: Duration,
    /// Resend a stream's window when it made no progress for this long; each further
    /// resend without progress waits twice as long, up to 32×. Default 250 ms.
    pub ack_timeout: Duration,
    /// Report a backup as unreachable after no progress for this long. Default 5 s.
    pub unreachable_timeout: Duration,
    /// A message is closed once it holds this many bytes (a larger chunk goes alone).
    /// Default 256 KiB.
    pub message_bytes_target: usize,
    /// Unacknowledged bytes (pending plus sent) per backup stream before writers wait.
    /// Default 32 MiB.
    pub stream_bytes_max: usize,
    /// Bytes read from memory per re-replication slice. Default 1 MiB.
    pub resync_slice_bytes: usize,
    /// Events kept for [`Replicator::events`] before new ones are dropped. Default 1024.
    pub events_max: usize,
    /// Seed of the placement's random choices.
    pub placement_seed: u64,
    /// Number of this master's first zone. Default 0; a restarted master starts above its
    /// earlier incarnation's zones (the superpeers hand it the base when it joins).
    pub first_zone: u32,
}

impl ReplicatorConfig {
    /// Defaults for master `node`.
    pub fn new(node: NodeId) -> ReplicatorConfig {
        ReplicatorConfig {
            node,
            rack: 0,
            switch: 0,
            replication: 3,
            zone_bytes: 256 << 20,
            strategy: Strategy::DISJUNCTIVE,
            default_durability: Durability::Async,
            wait_timeout: Duration::from_secs(10),
            ack_timeout: Duration::from_millis(250),
            unreachable_timeout: Duration::from_secs(5),
            message_bytes_target: 256 << 10,
            stream_bytes_max: 32 << 20,
            resync_slice_bytes: 1 << 20,
            events_max: 1024,
            placement_seed: u64::from(node.0) ^ 0x5eed,
            first_zone: 0,
        }
    }

    fn validate(&self) -> Result<(), ReplicaError> {
        if self.message_bytes_target == 0 || self.message_bytes_target > 64 << 20 {
            return Err(ReplicaError::InvalidConfig(
                "message_bytes_target must be 1..=64 MiB",
            ));
        }
        if self.stream_bytes_max < self.message_bytes_target {
            return Err(ReplicaError::InvalidConfig(
                "stream_bytes_max must hold at least one message",
            ));
        }
        if self.ack_timeout.is_zero() || self.events_max == 0 || self.resync_slice_bytes == 0 {
            return Err(ReplicaError::InvalidConfig(
                "ack_timeout, events_max and resync_slice_bytes must be positive",
            ));
        }
        if self.replication > 16 {
            return Err(ReplicaError::InvalidConfig("replication must be 0..=16"));
        }
        Ok(())
    }
}

/// Something the node should know about (see [`Replicator::events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaEvent {
    /// The backup made no progress for `unreachable_timeout`: ask for a replacement.
    BackupUnreachable(NodeId),
    /// The backup refuses the stream's next operation (e.g. its log is full).
    BackupRefused {
        /// The backup.
        backup: NodeId,
        /// Its reason.
        reason: String,
    },
    /// Re-replication of a zone to a new backup finished; the backup holds the zone.
    ResyncDone {
        /// The zone.
        zone: u32,
        /// The new backup.
        backup: NodeId,
        /// Chunks copied from memory.
        chunks: u64,
    },
    /// Re-replication of a zone to a new backup did not finish.
    ResyncFailed {
        /// The zone.
        zone: u32,
        /// The new backup.
        backup: NodeId,
        /// Why.
        reason: String,
    },
}

/// A zone's new backups after [`Replicator::replace_backup`] or [`Replicator::fill_zones`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneReplacement {
    /// The zone.
    pub zone: u32,
    /// Its backups, in order.
    pub backups: Vec<NodeId>,
    /// The backups that were added (they receive the zone by re-replication).
    pub added: Vec<NodeId>,
}

/// One zone in [`ReplicatorStats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneStats {
    /// The zone.
    pub zone: u32,
    /// Payload bytes of its live chunks.
    pub payload_bytes: u64,
    /// Its live chunks.
    pub chunks: u64,
    /// Its backups, in order.
    pub backups: Vec<NodeId>,
    /// Its registration with the cluster completed.
    pub registered: bool,
    /// Re-replications to new backups in progress.
    pub resyncs: usize,
    /// Operations of the zone not yet acknowledged, summed over its streams (counted per
    /// message: a partly acknowledged message still counts whole).
    pub unacknowledged_ops: u64,
    /// For a zone adopted from a failed peer ([`Replicator::adopt_zone`]): its log identity
    /// `(owner, zone)`, the name it has in the backups' logs and the zone table.
    pub adopted_from: Option<(NodeId, u32)>,
}

/// A zone taken over by [`Replicator::adopt_zone`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    /// The zone's number in this master's zone tree (local bookkeeping only).
    pub zone: u32,
    /// The failed peer whose zone it was (its log owner).
    pub owner: NodeId,
    /// The zone's number within `owner` (its log zone on the backups).
    pub log_zone: u32,
    /// Its backups now, in order: the surviving ones first, then the added ones.
    pub backups: Vec<NodeId>,
    /// The backups that were added (they receive the zone by [`Replicator::copy_adopted`]).
    pub added: Vec<NodeId>,
}

/// One backup stream in [`ReplicatorStats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStats {
    /// The backup.
    pub backup: NodeId,
    /// Operations assigned so far (the last sequence number).
    pub assigned_seq: u64,
    /// Operations the backup applied.
    pub applied_seq: u64,
    /// Operations on the backup's disk.
    pub durable_seq: u64,
    /// Operations not yet acknowledged as applied.
    pub unacknowledged_ops: u64,
    /// Sent messages kept for resending.
    pub unacknowledged_messages: usize,
    /// Bytes pending or unacknowledged.
    pub unacknowledged_bytes: usize,
    /// Times the window was resent.
    pub resends: u64,
}

/// A snapshot of a [`Replicator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicatorStats {
    /// Every zone, by number.
    pub zones: Vec<ZoneStats>,
    /// Every backup stream, by backup.
    pub streams: Vec<StreamStats>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Registration {
    Pending,
    Done,
    Failed(String),
}

#[derive(Debug)]
struct Resync {
    target: NodeId,
    dirty: HashSet<u64>,
}

#[derive(Debug)]
struct ZoneState {
    /// `(owner, zone)` of an adopted zone: the log zone its operations name.
    log: Option<(NodeId, u32)>,
    backups: Vec<NodeId>,
    registration: Registration,
    /// Bumped on every new registration, so a late answer to an old one is ignored.
    registration_serial: u64,
    resyncs: Vec<Resync>,
}

#[derive(Debug)]
struct Sent {
    last_seq: u64,
    bytes: Bytes,
    /// Operations per zone (log owner, zone) in the message.
    zones: Vec<(ZoneKey, u64)>,
}

#[derive(Debug)]
struct Stream {
    id: u64,
    /// The next sequence number to assign.
    next_seq: u64,
    pending: VecDeque<(Op, bool)>,
    pending_bytes: usize,
    window: VecDeque<Sent>,
    window_bytes: usize,
    applied: u64,
    durable: u64,
    last_progress: Instant,
    last_resend: Instant,
    resend_requested: bool,
    unreachable_reported: bool,
    last_refusal: Option<String>,
    resends: u64,
    /// Operations per zone (log owner, zone) in pending and unacknowledged messages.
    unacknowledged_per_zone: BTreeMap<ZoneKey, u64>,
    /// Resends after a timeout since the last progress (the next one waits longer).
    backoff: u32,
    /// Hands batches of messages to the stream's send task, which sends them in order.
    courier: UnboundedSender<Vec<Bytes>>,
    /// Batches handed over and not yet sent (or given up on).
    in_flight: Arc<AtomicUsize>,
}

impl Stream {
    /// A new stream to `backup`, with its send task on the messaging runtime. The task
    /// ends when the stream is dropped.
    fn new(id: u64, now: Instant, net: &NetHandle, backup: NodeId) -> Stream {
        let (courier, mut batches) = unbounded_channel::<Vec<Bytes>>();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let task_net = net.clone();
        let task_in_flight = in_flight.clone();
        net.runtime().spawn(async move {
            while let Some(batch) = batches.recv().await {
                for message in batch {
                    if let Err(e) = task_net.send(backup, wire::REPLICATE, message).await {
                        // The window keeps the rest; a resend follows.
                        tracing::debug!(%backup, error = %e, "replication send failed");
                        break;
                    }
                }
                task_in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        });
        Stream {
            courier,
            in_flight,
            id,
            next_seq: 1,
            pending: VecDeque::new(),
            pending_bytes: 0,
            window: VecDeque::new(),
            window_bytes: 0,
            applied: 0,
            durable: 0,
            last_progress: now,
            last_resend: now,
            resend_requested: false,
            unreachable_reported: false,
            last_refusal: None,
            resends: 0,
            unacknowledged_per_zone: BTreeMap::new(),
            backoff: 0,
        }
    }

    fn unacknowledged_bytes(&self) -> usize {
        self.pending_bytes + self.window_bytes
    }
}

/// A zone as its operations name it: `(None, zone)` for an own zone, `(Some(owner), zone)`
/// for an adopted one.
type ZoneKey = (Option<NodeId>, u32);

fn op_key(op: &Op) -> ZoneKey {
    (op.owner(), op.zone())
}

impl ZoneState {
    fn key(&self, zone: u32) -> ZoneKey {
        match self.log {
            Some((owner, log_zone)) => (Some(owner), log_zone),
            None => (None, zone),
        }
    }
}

struct State {
    tree: ZoneTree,
    placement: Placement,
    rng: SmallRng,
    zones: BTreeMap<u32, ZoneState>,
    streams: HashMap<NodeId, Stream>,
    last_stream_id: u64,
}

/// A stream position a writer waits for.
#[derive(Debug, Clone, Copy)]
struct Target {
    backup: NodeId,
    stream: u64,
    seq: u64,
}

struct Inner {
    config: ReplicatorConfig,
    net: NetHandle,
    candidates: Arc<dyn BackupCandidates>,
    registry: Arc<dyn ZoneRegistry>,
    source: Arc<dyn ChunkSource>,
    state: Mutex<State>,
    /// The sender has work (pending operations, resend requests).
    work: Condvar,
    /// Acknowledgements, registrations and freed stream room.
    progress: Condvar,
    shutdown: AtomicBool,
    events: Sender<ReplicaEvent>,
    events_rx: Receiver<ReplicaEvent>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// The master side of replication. See the module documentation of the crate.
pub struct Replicator {
    inner: Arc<Inner>,
    sender: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Replicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicator")
            .field("node", &self.inner.config.node)
            .field("replication", &self.inner.config.replication)
            .finish_non_exhaustive()
    }
}

/// Whether a submission may wait (for room, registration or acknowledgements). A
/// no-wait submission carries its changes, checked before anything is reported.
#[derive(Clone, Copy)]
enum Mode<'s, 'a> {
    Wait,
    NoWait(&'s [Change<'a>]),
}

/// A change reported to [`Replicator`].
#[derive(Clone, Copy)]
enum Change<'a> {
    Create(ChunkId, &'a [u8]),
    Put(ChunkId, &'a [u8]),
    Resize(ChunkId, u64, &'a [u8]),
    Remove(ChunkId, u64),
}

/// A change reported with [`Replicator::on_changes_nowait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncChange<'a> {
    /// The chunk's whole payload is now `data`.
    Put(ChunkId, &'a [u8]),
    /// The chunk, of this many bytes, was removed.
    Remove(ChunkId, u64),
}

impl<'a> AsyncChange<'a> {
    fn change(&self) -> Change<'a> {
        match *self {
            AsyncChange::Put(cid, data) => Change::Put(cid, data),
            AsyncChange::Remove(cid, size) => Change::Remove(cid, size),
        }
    }
}

impl Replicator {
    /// Starts a replicator for `config.node` sending over `net` (whose endpoint must run
    /// on that node ID): registers the acknowledgement handler on `net` and starts the
    /// sender thread. Call it before any backup may answer (i.e. before the first write).
    pub fn new(
        config: ReplicatorConfig,
        net: NetHandle,
        candidates: Arc<dyn BackupCandidates>,
        registry: Arc<dyn ZoneRegistry>,
        source: Arc<dyn ChunkSource>,
    ) -> Result<Replicator, ReplicaError> {
        config.validate()?;
        let master = Candidate {
            node: config.node,
            rack: config.rack,
            switch: config.switch,
        };
        let (events, events_rx) = crossbeam_channel::bounded(config.events_max);
        let mut tree = ZoneTree::new(config.node, config.zone_bytes);
        tree.start_zones_at(config.first_zone);
        let state = State {
            tree,
            placement: Placement::new(master, config.replication, config.strategy),
            rng: SmallRng::seed_from_u64(config.placement_seed),
            zones: BTreeMap::new(),
            streams: HashMap::new(),
            last_stream_id: 0,
        };
        let inner = Arc::new(Inner {
            config,
            net: net.clone(),
            candidates,
            registry,
            source,
            state: Mutex::new(state),
            work: Condvar::new(),
            progress: Condvar::new(),
            shutdown: AtomicBool::new(false),
            events,
            events_rx,
            workers: Mutex::new(Vec::new()),
        });
        let weak: Weak<Inner> = Arc::downgrade(&inner);
        net.register(wire::ACK, move |incoming: Incoming| {
            if let Some(inner) = weak.upgrade() {
                inner.on_ack(incoming);
            }
        })
        .map_err(|e| ReplicaError::Net(e.to_string()))?;
        let sender_inner = inner.clone();
        let sender = std::thread::Builder::new()
            .name(format!("replica-send-{}", inner.config.node.0))
            .spawn(move || sender_inner.sender_loop())
            .map_err(|e| ReplicaError::Net(format!("spawning the sender thread: {e}")))?;
        Ok(Replicator {
            inner,
            sender: Some(sender),
        })
    }

    /// The configuration in effect.
    pub fn config(&self) -> &ReplicatorConfig {
        &self.inner.config
    }

    /// Events for the node (unreachable backups, finished re-replications). A bounded
    /// queue: when nobody reads it, new events are dropped (and logged).
    pub fn events(&self) -> Receiver<ReplicaEvent> {
        self.inner.events_rx.clone()
    }

    /// A chunk was created with `data`: assigns it a zone and replicates it.
    pub fn on_create(
        &self,
        cid: ChunkId,
        data: &[u8],
        durability: Option<Durability>,
    ) -> Result<(), ReplicaError> {
        self.inner
            .submit(std::iter::once(Change::Create(cid, data)), durability)
    }

    /// Chunks were created (one call, one wait).
    pub fn on_create_batch(
        &self,
        items: &[(ChunkId, &[u8])],
        durability: Option<Durability>,
    ) -> Result<(), ReplicaError> {
        self.inner.submit(
            items.iter().map(|&(cid, data)| Change::Create(cid, data)),
            durability,
        )
    }

    /// A chunk's payload is now `data` (its whole payload). A chunk without a zone (not
    /// created through this replicator) is assigned one.
    pub fn on_put(
        &self,
        cid: ChunkId,
        data: &[u8],
        durability: Option<Durability>,
    ) -> Result<(), ReplicaError> {
        self.inner
            .submit(std::iter::once(Change::Put(cid, data)), durability)
    }

    /// Chunks were written (one call, one wait).
    pub fn on_put_batch(
        &self,
        items: &[(ChunkId, &[u8])],
        durability: Option<Durability>,
    ) -> Result<(), ReplicaError> {
        self.inner.submit(
            items.iter().map(|&(cid, data)| Change::Put(cid, data)),
            durability,
        )
    }

    /// A chunk changed size from `old_size_bytes` to `data.len()`; `data` is its whole new
    /// payload.
    pub fn on_resize(
        &self,
        cid: ChunkId,
        old_size_bytes: u64,
        data: &[u8],
        durability: Option<Durability>,
    ) -> Result<(), ReplicaError> {
        self.inner.submit(
            std::iter::once(Change::Resize(cid, old_size_bytes, data)),
            durability,
        )
    }

    /// A chunk of `size_bytes` was removed (the size keeps the zone's accounting). A
    /// chunk without a zone has nothing to remove on backups.
    pub fn on_remove(
        &self,
        cid: ChunkId,
        size_bytes: u64,
        durability: Option<Durability>,
    ) -> Result<(), ReplicaError> {
        self.inner
            .submit(std::iter::once(Change::Remove(cid, size_bytes)), durability)
    }

    /// Chunks were removed, each with its size (one call, one wait).
    pub fn on_remove_batch(
        &self,
        items: &[(ChunkId, u64)],
        durability: Option<Durability>,
    ) -> Result<(), ReplicaError> {
        self.inner.submit(
            items.iter().map(|&(cid, size)| Change::Remove(cid, size)),
            durability,
        )
    }

    /// Whether these `async` changes could be
    /// reported right now with [`Replicator::on_changes_nowait`] without going past any
    /// stream's byte limit: each put's chunk already has a zone whose registration is
    /// committed, and every backup stream concerned has room. A snapshot: the caller
    /// checks it before applying the changes to memory, so that reporting them afterwards
    /// practically never fails.
    pub fn ready_without_waiting(&self, changes: &[AsyncChange<'_>]) -> bool {
        if self.inner.shutdown.load(Ordering::Acquire) {
            return false;
        }
        let changes: Vec<Change<'_>> = changes.iter().map(|c| c.change()).collect();
        let state = self.inner.state.lock();
        self.inner.ready_now(&state, &changes, true)
    }

    /// Reports `async` puts and removes without ever waiting: for
    /// callers that must not block, such as a peer answering on its messaging I/O thread
    /// (acknowledgements arrive on such threads). The changes are queued for the backups
    /// even when a stream is past its byte limit (by at most what raced in since
    /// [`Replicator::ready_without_waiting`]), and a pending re-registration of a zone (a
    /// replaced backup) is not waited for: the committed backup order receives the
    /// changes too. The changes are reported as `async` whatever the default (the caller
    /// decided that the request asked for `async`). Returns [`ReplicaError::WouldWait`],
    /// having reported nothing, when a put's chunk has no registered zone.
    pub fn on_changes_nowait(&self, changes: &[AsyncChange<'_>]) -> Result<(), ReplicaError> {
        let changes: Vec<Change<'_>> = changes.iter().map(|c| c.change()).collect();
        self.inner.submit_mode(
            changes.iter().copied(),
            Some(Durability::Async),
            Mode::NoWait(&changes),
        )
    }

    /// Replaces `failed` in every zone it backs: the replacement (chosen by the placement
    /// strategy among the current candidates) goes to the end of the backup order, the new
    /// order is registered, and the zone is copied to the replacement from memory in the
    /// background ([`ReplicaEvent::ResyncDone`] / [`ReplicaEvent::ResyncFailed`]). The
    /// stream to `failed` is dropped; writers still waiting for it fail with
    /// [`ReplicaError::BackupReplaced`]. Returns the changed zones.
    pub fn replace_backup(&self, failed: NodeId) -> Vec<ZoneReplacement> {
        self.inner.rebackup(Some(failed))
    }

    /// Gives zones with fewer than R backups (placed while too few peers were known)
    /// more backups from the current candidates, and re-replicates them there.
    pub fn fill_zones(&self) -> Vec<ZoneReplacement> {
        self.inner.rebackup(None)
    }

    /// Adopts `owner`'s zone `zone`, whose chunks (CIDs `ranges`, `chunks` of them with
    /// `bytes` payload) this master restored into its memory after `owner` failed (issue
    /// 6). The zone keeps its log identity `(owner, zone)`: its backups are the alive ones of
    /// `old_backups` (in order; never `owner` or this master) plus new ones from the
    /// placement up to R; the new order is registered (`registry.register(owner, zone, …)`,
    /// which the node commits as `ZoneAdopt`) and waited for (bounded by
    /// [`ReplicatorConfig::wait_timeout`]); then `ranges` join the zone tree under a new
    /// local zone, so every later change of those chunks goes to the zone's backups as an
    /// operation naming `(owner, zone)`. The added backups do not hold the zone yet:
    /// [`Replicator::copy_adopted`] copies it to them. Adopting a zone adopted before (a
    /// retried recovery) registers its backups again and returns it. Blocks: call from a
    /// thread that runs no async tasks.
    pub fn adopt_zone(
        &self,
        owner: NodeId,
        zone: u32,
        old_backups: &[NodeId],
        ranges: &[(ChunkId, ChunkId)],
        chunks: u64,
        bytes: u64,
    ) -> Result<Adoption, ReplicaError> {
        self.inner
            .adopt(owner, zone, old_backups, ranges, chunks, bytes)
    }

    /// Copies an adopted zone from memory to its added backups (the surviving ones hold its
    /// log already), one after the other, with the ordering of [`Replicator::replace_backup`]'s
    /// copy (changes made meanwhile are never overtaken by an older copy). Returns once every
    /// copy is on the added backups' disks (and the zone's registration done), with the
    /// number of chunks copied. Blocks.
    pub fn copy_adopted(&self, adoption: &Adoption) -> Result<u64, ReplicaError> {
        let mut copied = 0;
        for &backup in &adoption.added {
            copied += self
                .inner
                .resync(adoption.zone, backup)
                .map_err(ReplicaError::Resync)?;
        }
        Ok(copied)
    }

    /// Waits until every operation assigned so far is acknowledged at `durability` by
    /// every stream (e.g. before a benchmark stops, or a clean shutdown).
    pub fn wait_all(&self, durability: Durability) -> Result<(), ReplicaError> {
        let targets: Vec<Target> = {
            let state = self.inner.state.lock();
            state
                .streams
                .iter()
                .filter(|(_, s)| s.next_seq > 1)
                .map(|(&backup, s)| Target {
                    backup,
                    stream: s.id,
                    seq: s.next_seq - 1,
                })
                .collect()
        };
        self.inner.wait_targets(&targets, durability)
    }

    /// Per zone: bytes, chunks, backups; per backup stream: sequence numbers and
    /// unacknowledged counts.
    pub fn stats(&self) -> ReplicatorStats {
        let state = self.inner.state.lock();
        let zones = state
            .tree
            .zones()
            .map(|(zone, usage): (ZoneId, ZoneUsage)| {
                let z = state.zones.get(&zone.0);
                let key = z.map_or((None, zone.0), |z| z.key(zone.0));
                ZoneStats {
                    zone: zone.0,
                    payload_bytes: usage.payload_bytes,
                    chunks: usage.chunks,
                    backups: z.map(|z| z.backups.clone()).unwrap_or_default(),
                    registered: z.is_some_and(|z| z.registration == Registration::Done),
                    resyncs: z.map_or(0, |z| z.resyncs.len()),
                    unacknowledged_ops: state
                        .streams
                        .values()
                        .filter_map(|s| s.unacknowledged_per_zone.get(&key))
                        .sum(),
                    adopted_from: z.and_then(|z| z.log),
                }
            })
            .collect();
        let mut streams: Vec<StreamStats> = state
            .streams
            .iter()
            .map(|(&backup, s)| StreamStats {
                backup,
                assigned_seq: s.next_seq - 1,
                applied_seq: s.applied,
                durable_seq: s.durable,
                unacknowledged_ops: s.next_seq - 1 - s.applied,
                unacknowledged_messages: s.window.len(),
                unacknowledged_bytes: s.unacknowledged_bytes(),
                resends: s.resends,
            })
            .collect();
        streams.sort_by_key(|s| s.backup);
        ReplicatorStats { zones, streams }
    }

    /// The zone of a chunk, if it has one.
    pub fn zone_of(&self, cid: ChunkId) -> Option<u32> {
        self.inner.state.lock().tree.zone_of(cid).map(|z| z.0)
    }

    /// The backups of a zone, in order.
    pub fn backups_of(&self, zone: u32) -> Option<Vec<NodeId>> {
        self.inner
            .state
            .lock()
            .zones
            .get(&zone)
            .map(|z| z.backups.clone())
    }
}

impl Drop for Replicator {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        {
            let _state = self.inner.state.lock();
            self.inner.work.notify_all();
            self.inner.progress.notify_all();
        }
        if let Some(sender) = self.sender.take() {
            let _ = sender.join();
        }
        let workers: Vec<JoinHandle<()>> = std::mem::take(&mut *self.inner.workers.lock());
        for worker in workers {
            let _ = worker.join();
        }
        // Dropping the streams ends their send tasks.
        self.inner.state.lock().streams.clear();
    }
}

impl Inner {
    fn emit(&self, event: ReplicaEvent) {
        if self.events.try_send(event.clone()).is_err() {
            tracing::warn!(?event, "replication event queue full; event dropped");
        }
    }

    fn next_stream_id(state: &mut State) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        state.last_stream_id = now.max(state.last_stream_id + 1);
        state.last_stream_id
    }

    /// Starts (or restarts) the registration of `zone`'s current backups.
    fn start_registration(self: &Arc<Self>, state: &mut State, zone: u32) {
        let Some(z) = state.zones.get_mut(&zone) else {
            return;
        };
        z.registration = Registration::Pending;
        z.registration_serial += 1;
        let serial = z.registration_serial;
        let (owner, number) = z.log.unwrap_or((self.config.node, zone));
        let future = self.registry.register(owner, number, z.backups.clone());
        let weak = Arc::downgrade(self);
        self.net.runtime().spawn(async move {
            let result = future.await;
            if let Some(inner) = weak.upgrade() {
                let mut state = inner.state.lock();
                if let Some(z) = state.zones.get_mut(&zone) {
                    if z.registration_serial == serial {
                        z.registration = match result {
                            Ok(()) => Registration::Done,
                            Err(e) => Registration::Failed(e.0),
                        };
                    }
                }
                inner.progress.notify_all();
            }
        });
    }

    /// Opens bookkeeping for a new zone: places it and starts its registration.
    fn open_zone(self: &Arc<Self>, state: &mut State, zone: u32) {
        let backups = if self.config.replication == 0 {
            Vec::new()
        } else {
            let candidates = self.candidates.candidates();
            let State { placement, rng, .. } = state;
            match placement.place(&candidates, rng) {
                Ok(backups) => backups,
                Err(PlacementError::NoCandidates | PlacementError::ZeroReplication) => {
                    tracing::warn!(zone, "no backup candidates for a new zone");
                    Vec::new()
                }
            }
        };
        let no_backups_wanted = self.config.replication == 0;
        state.zones.insert(
            zone,
            ZoneState {
                log: None,
                backups,
                registration: if no_backups_wanted {
                    Registration::Done
                } else {
                    Registration::Pending
                },
                registration_serial: 0,
                resyncs: Vec::new(),
            },
        );
        if !no_backups_wanted {
            self.start_registration(state, zone);
        }
    }

    /// Waits (bounded) until every stream of `backups` has room for `bytes` more.
    fn wait_room(
        &self,
        state: &mut MutexGuard<'_, State>,
        backups: &[NodeId],
        bytes: usize,
        deadline: Instant,
    ) -> Result<(), ReplicaError> {
        let max = self.config.stream_bytes_max;
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return Err(ReplicaError::Shutdown);
            }
            let full: Vec<NodeId> = backups
                .iter()
                .copied()
                .filter(|b| {
                    state.streams.get(b).is_some_and(|s| {
                        s.unacknowledged_bytes() > 0 && s.unacknowledged_bytes() + bytes > max
                    })
                })
                .collect();
            if full.is_empty() {
                return Ok(());
            }
            if self.progress.wait_until(state, deadline).timed_out() {
                return Err(ReplicaError::Timeout {
                    what: "room in a backup stream",
                    waited: self.config.wait_timeout,
                    missing: full,
                });
            }
        }
    }

    /// Appends `op` to the stream of `backup`; returns its position.
    fn push_op(
        &self,
        state: &mut State,
        backup: NodeId,
        op: Op,
        durable: bool,
        now: Instant,
    ) -> Target {
        if !state.streams.contains_key(&backup) {
            let id = Self::next_stream_id(state);
            state
                .streams
                .insert(backup, Stream::new(id, now, &self.net, backup));
        }
        let Some(stream) = state.streams.get_mut(&backup) else {
            unreachable!("inserted above");
        };
        let seq = stream.next_seq;
        stream.next_seq += 1;
        stream.pending_bytes += op.encoded_bytes();
        *stream
            .unacknowledged_per_zone
            .entry(op_key(&op))
            .or_default() += 1;
        stream.pending.push_back((op, durable));
        Target {
            backup,
            stream: stream.id,
            seq,
        }
    }

    fn submit<'a>(
        self: &Arc<Self>,
        changes: impl Iterator<Item = Change<'a>>,
        durability: Option<Durability>,
    ) -> Result<(), ReplicaError> {
        self.submit_mode(changes, durability, Mode::Wait)
    }

    /// Whether every change could be reported at once: `async`, no zone to assign or
    /// register (puts of chunks with a zone whose registration is done, removes), and,
    /// when `room` is set, room for it in every stream it goes to. Called under the state
    /// lock, so the answer holds until the lock is released.
    fn ready_now(&self, state: &State, changes: &[Change<'_>], room: bool) -> bool {
        let max = self.config.stream_bytes_max;
        let mut needed: Vec<(NodeId, usize)> = Vec::new();
        for change in changes {
            let (cid, bytes) = match *change {
                Change::Create(..) | Change::Resize(..) => return false,
                Change::Put(cid, data) => (cid, data.len() + Op::OVERHEAD_BYTES_MAX),
                Change::Remove(cid, _) => (cid, Op::OVERHEAD_BYTES_MAX),
            };
            let Some(zone) = state.tree.zone_of(cid) else {
                if matches!(change, Change::Remove(..)) {
                    continue; // nothing to remove on backups
                }
                return false;
            };
            let Some(z) = state.zones.get(&zone.0) else {
                return false;
            };
            if !matches!(z.registration, Registration::Done) {
                return false;
            }
            for &backup in &z.backups {
                match needed.iter_mut().find(|(b, _)| *b == backup) {
                    Some((_, total)) => *total += bytes,
                    None => needed.push((backup, bytes)),
                }
            }
        }
        !room
            || needed.iter().all(|&(backup, bytes)| {
                state.streams.get(&backup).is_none_or(|s| {
                    s.unacknowledged_bytes() == 0 || s.unacknowledged_bytes() + bytes <= max
                })
            })
    }

    fn submit_mode<'a>(
        self: &Arc<Self>,
        changes: impl Iterator<Item = Change<'a>>,
        durability: Option<Durability>,
        mode: Mode<'_, 'a>,
    ) -> Result<(), ReplicaError> {
        if self.shutdown.load(Ordering::Acquire) {
            return Err(ReplicaError::Shutdown);
        }
        let durability = durability.unwrap_or(self.config.default_durability);
        let wants_durable = durability == Durability::Durable;
        let deadline = Instant::now() + self.config.wait_timeout;
        let mut targets: Vec<Target> = Vec::new();
        let mut touched: Vec<u32> = Vec::new();
        let mut state = self.state.lock();
        if let Mode::NoWait(all) = mode {
            if durability != Durability::Async || !self.ready_now(&state, all, false) {
                return Err(ReplicaError::WouldWait);
            }
        }
        let waits = matches!(mode, Mode::Wait);
        for change in changes {
            let (cid, op_data, zone) = match change {
                Change::Create(cid, data) => {
                    let a = state.tree.assign(cid, data.len() as u64);
                    if a.opened || !state.zones.contains_key(&a.zone.0) {
                        self.open_zone(&mut state, a.zone.0);
                    }
                    (cid, Some(data), a.zone.0)
                }
                Change::Put(cid, data) | Change::Resize(cid, _, data) => {
                    let zone = match state.tree.zone_of(cid) {
                        Some(zone) => {
                            if let Change::Resize(_, old, _) = change {
                                state.tree.resize(cid, old, data.len() as u64);
                            }
                            zone.0
                        }
                        None => {
                            let a = state.tree.assign(cid, data.len() as u64);
                            if a.opened || !state.zones.contains_key(&a.zone.0) {
                                self.open_zone(&mut state, a.zone.0);
                            }
                            a.zone.0
                        }
                    };
                    (cid, Some(data), zone)
                }
                Change::Remove(cid, size) => match state.tree.remove(cid, size) {
                    Some(zone) => (cid, None, zone.0),
                    None => continue,
                },
            };
            if !touched.contains(&zone) {
                touched.push(zone);
            }
            let Some(z) = state.zones.get_mut(&zone) else {
                continue;
            };
            if matches!(z.registration, Registration::Failed(_)) {
                self.start_registration(&mut state, zone);
            }
            let Some(z) = state.zones.get(&zone) else {
                continue;
            };
            let backups = z.backups.clone();
            if backups.is_empty() {
                if durability != Durability::Async && self.config.replication > 0 {
                    return Err(ReplicaError::NoBackups { zone });
                }
                continue;
            }
            let (owner, log_zone) = z.key(zone);
            let op = match op_data {
                Some(data) => Op::Put {
                    owner,
                    zone: log_zone,
                    cid: cid.raw(),
                    data: Bytes::copy_from_slice(data),
                },
                None => Op::Remove {
                    owner,
                    zone: log_zone,
                    cid: cid.raw(),
                },
            };
            if waits {
                self.wait_room(&mut state, &backups, op.encoded_bytes(), deadline)?;
            }
            // The lock was released while waiting: the zone's backups may have changed.
            let Some(z) = state.zones.get_mut(&zone) else {
                continue;
            };
            for resync in &mut z.resyncs {
                resync.dirty.insert(cid.raw());
            }
            let backups = z.backups.clone();
            let now = Instant::now();
            for &backup in &backups {
                let target = self.push_op(&mut state, backup, op.clone(), wants_durable, now);
                match targets.iter_mut().find(|t| t.backup == backup) {
                    Some(t) => *t = target,
                    None => targets.push(target),
                }
            }
            self.work.notify_one();
        }
        // A zone's registration precedes every acknowledgement of a write to it. (A
        // no-wait submission checked that each zone had been registered; a registration
        // pending now is a new backup order, and the old one, which also receives the
        // change, is committed.)
        if waits {
            loop {
                let mut pending = false;
                for zone in &touched {
                    match state.zones.get(zone).map(|z| &z.registration) {
                        Some(Registration::Pending) => pending = true,
                        Some(Registration::Failed(reason)) => {
                            return Err(ReplicaError::Registration {
                                zone: *zone,
                                reason: reason.clone(),
                            })
                        }
                        _ => {}
                    }
                }
                if !pending {
                    break;
                }
                if self.shutdown.load(Ordering::Acquire) {
                    return Err(ReplicaError::Shutdown);
                }
                if self.progress.wait_until(&mut state, deadline).timed_out() {
                    return Err(ReplicaError::Timeout {
                        what: "zone registration",
                        waited: self.config.wait_timeout,
                        missing: Vec::new(),
                    });
                }
            }
        }
        drop(state);
        self.wait_targets_until(&targets, durability, deadline)
    }

    fn wait_targets(&self, targets: &[Target], durability: Durability) -> Result<(), ReplicaError> {
        self.wait_targets_until(
            targets,
            durability,
            Instant::now() + self.config.wait_timeout,
        )
    }

    fn wait_targets_until(
        &self,
        targets: &[Target],
        durability: Durability,
        deadline: Instant,
    ) -> Result<(), ReplicaError> {
        if durability == Durability::Async || targets.is_empty() {
            return Ok(());
        }
        let mut state = self.state.lock();
        loop {
            let mut missing = Vec::new();
            for target in targets {
                match state.streams.get(&target.backup) {
                    Some(s) if s.id == target.stream => {
                        let reached = match durability {
                            Durability::Durable => s.durable,
                            _ => s.applied,
                        };
                        if reached < target.seq {
                            missing.push(target.backup);
                        }
                    }
                    _ => return Err(ReplicaError::BackupReplaced(target.backup)),
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            if self.shutdown.load(Ordering::Acquire) {
                return Err(ReplicaError::Shutdown);
            }
            if self.progress.wait_until(&mut state, deadline).timed_out() {
                return Err(ReplicaError::Timeout {
                    what: match durability {
                        Durability::Durable => "durable acknowledgements",
                        _ => "replicated acknowledgements",
                    },
                    waited: self.config.wait_timeout,
                    missing,
                });
            }
        }
    }

    fn on_ack(&self, incoming: Incoming) {
        let backup = incoming.from;
        let ack = match Ack::decode(incoming.payload) {
            Ok(ack) => ack,
            Err(e) => {
                tracing::warn!(%backup, error = %e, "malformed replication ack");
                return;
            }
        };
        let mut refused = None;
        {
            let mut state = self.state.lock();
            let Some(stream) = state.streams.get_mut(&backup) else {
                return;
            };
            if stream.id != ack.stream {
                return;
            }
            let assigned = stream.next_seq - 1;
            let applied = ack.applied_seq.min(assigned);
            if applied > stream.applied {
                stream.applied = applied;
                stream.backoff = 0;
                stream.last_progress = Instant::now();
                stream.unreachable_reported = false;
                while stream.window.front().is_some_and(|m| m.last_seq <= applied) {
                    if let Some(sent) = stream.window.pop_front() {
                        stream.window_bytes -= sent.bytes.len();
                        for (zone, count) in sent.zones {
                            if let Some(n) = stream.unacknowledged_per_zone.get_mut(&zone) {
                                *n = n.saturating_sub(count);
                                if *n == 0 {
                                    stream.unacknowledged_per_zone.remove(&zone);
                                }
                            }
                        }
                    }
                }
            }
            stream.durable = stream.durable.max(ack.durable_seq.min(stream.applied));
            match ack.status {
                AckStatus::Ok => stream.last_refusal = None,
                AckStatus::Gap => {
                    stream.resend_requested = true;
                    self.work.notify_one();
                }
                AckStatus::Refused(reason) => {
                    if stream.last_refusal.as_ref() != Some(&reason) {
                        stream.last_refusal = Some(reason.clone());
                        refused = Some(reason);
                    }
                }
            }
            self.progress.notify_all();
        }
        if let Some(reason) = refused {
            tracing::warn!(%backup, %reason, "backup refuses replication");
            self.emit(ReplicaEvent::BackupRefused { backup, reason });
        }
    }

    fn sender_loop(self: Arc<Self>) {
        let mut events = self.net.subscribe();
        let tick = (self.config.ack_timeout / 4).max(Duration::from_millis(5));
        loop {
            let mut unreachable = Vec::new();
            {
                let mut state = self.state.lock();
                // Resend requests wait for the next tick (at most a quarter of the ack
                // timeout); only new operations end the wait early.
                let has_work = |s: &State| s.streams.values().any(|st| !st.pending.is_empty());
                if !self.shutdown.load(Ordering::Acquire) && !has_work(&state) {
                    self.work.wait_for(&mut state, tick);
                }
                if self.shutdown.load(Ordering::Acquire) {
                    return;
                }
                while let Some(lost) = events.try_recv() {
                    if let Some(stream) = state.streams.get_mut(&lost.node) {
                        if !stream.window.is_empty() {
                            stream.resend_requested = true;
                        }
                    }
                }
                let now = Instant::now();
                for (&backup, stream) in state.streams.iter_mut() {
                    let mut messages = Vec::new();
                    let quiet = now.duration_since(stream.last_progress.max(stream.last_resend));
                    // While a batch is still on its way (e.g. waiting for a connection),
                    // a resend would only queue the window twice.
                    let idle = stream.in_flight.load(Ordering::Acquire) == 0;
                    let resend_soon = idle
                        && stream.resend_requested
                        && now.duration_since(stream.last_resend) >= tick;
                    // Without progress, resends back off: ack timeout × 1, 2, 4, … 32.
                    let quiet_max = self.config.ack_timeout * (1u32 << stream.backoff.min(5));
                    let timed_out = quiet >= quiet_max;
                    if idle && !stream.window.is_empty() && (resend_soon || timed_out) {
                        messages.extend(stream.window.iter().map(|m| m.bytes.clone()));
                        stream.last_resend = now;
                        stream.resends += 1;
                        if timed_out {
                            stream.backoff = stream.backoff.saturating_add(1);
                        }
                    }
                    if stream.window.is_empty() || resend_soon {
                        stream.resend_requested = false;
                    }
                    while !stream.pending.is_empty() {
                        let first_seq = stream.next_seq - stream.pending.len() as u64;
                        let mut ops = Vec::new();
                        let mut bytes = 0;
                        let mut durable = false;
                        while let Some((op, d)) = stream.pending.front() {
                            let size = op.encoded_bytes();
                            if !ops.is_empty()
                                && (bytes + size > self.config.message_bytes_target
                                    || ops.len() >= wire::OPS_PER_MESSAGE_MAX)
                            {
                                break;
                            }
                            durable |= *d;
                            bytes += size;
                            let Some((op, _)) = stream.pending.pop_front() else {
                                break;
                            };
                            ops.push(op);
                        }
                        stream.pending_bytes -= bytes;
                        let last_seq = first_seq + ops.len() as u64 - 1;
                        let encoded = encode_log_message(stream.id, first_seq, durable, &ops);
                        let mut zones: Vec<(ZoneKey, u64)> = Vec::new();
                        for op in &ops {
                            match zones.iter_mut().find(|(z, _)| *z == op_key(op)) {
                                Some((_, n)) => *n += 1,
                                None => zones.push((op_key(op), 1)),
                            }
                        }
                        if stream.window.is_empty() {
                            stream.last_progress = now;
                        }
                        stream.window_bytes += encoded.len();
                        stream.window.push_back(Sent {
                            last_seq,
                            bytes: encoded.clone(),
                            zones,
                        });
                        messages.push(encoded);
                    }
                    if !stream.window.is_empty()
                        && !stream.unreachable_reported
                        && now.duration_since(stream.last_progress)
                            >= self.config.unreachable_timeout
                    {
                        stream.unreachable_reported = true;
                        unreachable.push(backup);
                    }
                    if !messages.is_empty() {
                        stream.in_flight.fetch_add(1, Ordering::AcqRel);
                        if stream.courier.send(messages).is_err() {
                            stream.in_flight.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                }
            }
            for backup in unreachable {
                tracing::warn!(%backup, "backup unreachable");
                self.emit(ReplicaEvent::BackupUnreachable(backup));
            }
        }
    }

    /// Replaces `failed` (or fills zones below R when `None`) and starts re-replication.
    fn rebackup(self: &Arc<Self>, failed: Option<NodeId>) -> Vec<ZoneReplacement> {
        let mut changes = Vec::new();
        let mut state = self.state.lock();
        if self.config.replication == 0 {
            return changes;
        }
        let mut candidates = self.candidates.candidates();
        if let Some(failed) = failed {
            candidates.retain(|c| c.node != failed);
        }
        let zones: Vec<u32> = state
            .zones
            .iter()
            .filter(|(_, z)| match failed {
                Some(f) => z.backups.contains(&f),
                None => z.backups.len() < self.config.replication,
            })
            .map(|(&zone, _)| zone)
            .collect();
        for zone in zones {
            let State {
                placement,
                rng,
                zones,
                ..
            } = &mut *state;
            let Some(z) = zones.get_mut(&zone) else {
                continue;
            };
            let new = match failed {
                Some(f) => placement.replace(&z.backups, f, &candidates, rng),
                None => placement.extend(&z.backups, &candidates, rng),
            };
            let added: Vec<NodeId> = new
                .iter()
                .copied()
                .filter(|n| !z.backups.contains(n))
                .collect();
            if new == z.backups {
                continue;
            }
            z.backups = new.clone();
            z.resyncs.retain(|r| Some(r.target) != failed);
            for &target in &added {
                z.resyncs.push(Resync {
                    target,
                    dirty: HashSet::new(),
                });
            }
            self.start_registration(&mut state, zone);
            changes.push(ZoneReplacement {
                zone,
                backups: new,
                added,
            });
        }
        if let Some(failed) = failed {
            if state.streams.remove(&failed).is_some() {
                self.progress.notify_all();
            }
        }
        drop(state);
        let jobs: Vec<(u32, NodeId)> = changes
            .iter()
            .flat_map(|c| c.added.iter().map(move |&b| (c.zone, b)))
            .collect();
        if !jobs.is_empty() {
            let inner = self.clone();
            match std::thread::Builder::new()
                .name("replica-resync".into())
                .spawn(move || {
                    for (zone, backup) in jobs {
                        let _ = inner.resync(zone, backup);
                    }
                }) {
                Ok(handle) => {
                    let mut workers = self.workers.lock();
                    workers.retain(|w| !w.is_finished());
                    workers.push(handle);
                }
                Err(e) => tracing::error!(error = %e, "cannot spawn the re-replication thread"),
            }
        }
        changes
    }

    /// Copies `zone` to `backup` (see [`Inner::resync_inner`]) and reports the outcome as
    /// an event.
    fn resync(self: &Arc<Self>, zone: u32, backup: NodeId) -> Result<u64, String> {
        match self.resync_inner(zone, backup) {
            Ok(chunks) => {
                self.emit(ReplicaEvent::ResyncDone {
                    zone,
                    backup,
                    chunks,
                });
                Ok(chunks)
            }
            Err(reason) => {
                let mut state = self.state.lock();
                if let Some(z) = state.zones.get_mut(&zone) {
                    z.resyncs.retain(|r| r.target != backup);
                }
                drop(state);
                tracing::warn!(zone, %backup, %reason, "re-replication failed");
                self.emit(ReplicaEvent::ResyncFailed {
                    zone,
                    backup,
                    reason: reason.clone(),
                });
                Err(reason)
            }
        }
    }

    fn adopt(
        self: &Arc<Self>,
        owner: NodeId,
        zone: u32,
        old_backups: &[NodeId],
        ranges: &[(ChunkId, ChunkId)],
        chunks: u64,
        bytes: u64,
    ) -> Result<Adoption, ReplicaError> {
        if self.shutdown.load(Ordering::Acquire) {
            return Err(ReplicaError::Shutdown);
        }
        if self.config.replication == 0 {
            return Err(ReplicaError::InvalidConfig(
                "a master without replication adopts no zones",
            ));
        }
        let me = self.config.node;
        let deadline = Instant::now() + self.config.wait_timeout;
        let existing = {
            let state = self.state.lock();
            state
                .zones
                .iter()
                .find(|(_, z)| z.log == Some((owner, zone)))
                .map(|(&local, z)| (local, z.backups.clone()))
        };
        let (backups, added) = match &existing {
            Some((_, backups)) => (backups.clone(), Vec::new()),
            None => {
                let mut candidates = self.candidates.candidates();
                candidates.retain(|c| c.node != owner && c.node != me);
                let alive: HashSet<NodeId> = candidates.iter().map(|c| c.node).collect();
                let others = old_backups
                    .iter()
                    .copied()
                    .filter(|&b| b != owner && b != me);
                // Without a view of the live peers, keep every surviving backup rather
                // than none (a dead one is replaced later like any failed backup).
                let kept: Vec<NodeId> = if alive.is_empty() {
                    others.collect()
                } else {
                    others.filter(|b| alive.contains(b)).collect()
                };
                let mut state = self.state.lock();
                let State { placement, rng, .. } = &mut *state;
                let backups = placement.extend(&kept, &candidates, rng);
                let added: Vec<NodeId> = backups
                    .iter()
                    .copied()
                    .filter(|b| !kept.contains(b))
                    .collect();
                (backups, added)
            }
        };
        // The registration (ZoneAdopt) must commit before this master owns the chunks.
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let future = self.registry.register(owner, zone, backups.clone());
        self.net.runtime().spawn(async move {
            let _ = done_tx.send(future.await);
        });
        let wait = deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(wait) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                return Err(ReplicaError::Registration {
                    zone,
                    reason: error.0,
                })
            }
            Err(_) => {
                return Err(ReplicaError::Timeout {
                    what: "zone adoption",
                    waited: self.config.wait_timeout,
                    missing: Vec::new(),
                })
            }
        }
        let mut state = self.state.lock();
        if let Some((local, _)) = existing {
            if let Some(z) = state.zones.get_mut(&local) {
                z.registration = Registration::Done;
                z.registration_serial += 1;
                let added = z.resyncs.iter().map(|r| r.target).collect();
                return Ok(Adoption {
                    zone: local,
                    owner,
                    log_zone: zone,
                    backups: z.backups.clone(),
                    added,
                });
            }
        }
        let local = state.tree.new_zone();
        let mut overlapping = 0u64;
        for &(first, last) in ranges {
            if state.tree.add_range(first, last, local).is_ok() {
                continue;
            }
            // Some CIDs already have a zone here (e.g. own chunks that had migrated to the
            // failed peer): a short range is taken CID by CID around them.
            let span = last.raw().saturating_sub(first.raw());
            if span >= ADOPT_SPLIT_SPAN_MAX {
                overlapping += span + 1;
                continue;
            }
            for raw in first.raw()..=last.raw() {
                let cid = ChunkId::from_raw(raw);
                if state.tree.add_range(cid, cid, local).is_err() {
                    overlapping += 1;
                }
            }
        }
        if overlapping > 0 {
            tracing::warn!(%owner, zone, overlapping, "CIDs of an adopted zone already had a zone here; their changes go to that zone");
        }
        if chunks > 0 {
            state.tree.add_usage_many(local, chunks, bytes);
        }
        state.zones.insert(
            local.0,
            ZoneState {
                log: Some((owner, zone)),
                backups: backups.clone(),
                registration: Registration::Done,
                registration_serial: 0,
                resyncs: added
                    .iter()
                    .map(|&target| Resync {
                        target,
                        dirty: HashSet::new(),
                    })
                    .collect(),
            },
        );
        self.progress.notify_all();
        Ok(Adoption {
            zone: local.0,
            owner,
            log_zone: zone,
            backups,
            added,
        })
    }

    fn resync_inner(self: &Arc<Self>, zone: u32, backup: NodeId) -> Result<u64, String> {
        let ranges = self.state.lock().tree.ranges_of(ZoneId(zone));
        let mut copied = 0u64;
        let mut last_target: Option<Target> = None;
        for (first, last) in ranges {
            let mut cursor = first;
            loop {
                if self.shutdown.load(Ordering::Acquire) {
                    return Err("shut down".into());
                }
                let mut slice: Vec<(ChunkId, Bytes)> = Vec::new();
                let mut bytes = 0usize;
                let slice_max = self.config.resync_slice_bytes;
                self.source
                    .for_each_in_range(cursor, last, &mut |cid, data| {
                        if cid.raw() < cursor.raw() || cid.raw() > last.raw() {
                            return true;
                        }
                        slice.push((cid, Bytes::copy_from_slice(data)));
                        bytes += data.len() + Op::OVERHEAD_BYTES_MAX;
                        bytes < slice_max && slice.len() < wire::OPS_PER_MESSAGE_MAX
                    });
                let Some(&(last_cid, _)) = slice.last() else {
                    break;
                };
                let deadline = Instant::now() + self.config.wait_timeout;
                let mut state = self.state.lock();
                self.wait_room(&mut state, &[backup], bytes, deadline)
                    .map_err(|e| e.to_string())?;
                let now = Instant::now();
                let Some(z) = state.zones.get(&zone) else {
                    return Err("zone vanished".into());
                };
                let Some(resync) = z.resyncs.iter().find(|r| r.target == backup) else {
                    return Err("backup left the zone".into());
                };
                let (owner, log_zone) = z.key(zone);
                let keep: Vec<(ChunkId, Bytes)> = slice
                    .into_iter()
                    .filter(|(cid, _)| !resync.dirty.contains(&cid.raw()))
                    .collect();
                for (cid, data) in keep {
                    let op = Op::Put {
                        owner,
                        zone: log_zone,
                        cid: cid.raw(),
                        data,
                    };
                    last_target = Some(self.push_op(&mut state, backup, op, true, now));
                    copied += 1;
                }
                self.work.notify_one();
                drop(state);
                if last_cid.raw() >= last.raw() {
                    break;
                }
                cursor = ChunkId::from_raw(last_cid.raw() + 1);
            }
        }
        {
            let mut state = self.state.lock();
            if let Some(z) = state.zones.get_mut(&zone) {
                z.resyncs.retain(|r| r.target != backup);
            }
        }
        // The new order must be registered and the copy on the backup's disk.
        let deadline = Instant::now() + self.config.wait_timeout;
        {
            let mut state = self.state.lock();
            loop {
                match state.zones.get(&zone).map(|z| &z.registration) {
                    Some(Registration::Done) | None => break,
                    Some(Registration::Failed(reason)) => {
                        return Err(format!("registration failed: {reason}"))
                    }
                    Some(Registration::Pending) => {}
                }
                if self.shutdown.load(Ordering::Acquire) {
                    return Err("shut down".into());
                }
                if self.progress.wait_until(&mut state, deadline).timed_out() {
                    return Err("registration timed out".into());
                }
            }
        }
        if let Some(target) = last_target {
            self.wait_targets_until(&[target], Durability::Durable, deadline)
                .map_err(|e| e.to_string())?;
        }
        Ok(copied)
    }
}
