//! The master side: zones, placement, registration and one sequenced stream per backup.
//!
//! # How a write travels
//! `on_*` takes the state lock, finds (or opens, places and starts registering) the
//! chunk's zone, and appends the operation to the pending queue of each of the zone's
//! backups' streams, in backup order, giving it the stream's next sequence number. Pending
//! queues are drained into [`LogMessage`]s of up to
//! [`ReplicatorConfig::message_bytes_target`]: by the writing thread itself, before it
//! releases the lock, when the stream's send task is idle and no resend is due (at low
//! load a write leaves at once, with no hand-off to another thread), otherwise by the
//! sender thread, woken for it (under load many small writes then share a message).
//! Asynchronous writes may first *linger* ([`ReplicatorConfig::async_linger`]): a stream's
//! queue waits until its oldest write waited that long (the sender thread sleeps until
//! then), unless it fills a message, a write whose caller waits joins it, or a writer
//! waits for room, so that sparse writes share messages too. The
//! messages move into the stream's window of
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
//! CIDs, so a copy read before a change never lands after it. A copy to a backup added to
//! a zone starts with an [`Op::Reset`], queued in the same hold of the state lock that
//! adds the backup (so ahead of every later change of the zone on its stream): the backup
//! drops whatever it held of the zone (a diverged or stale copy) and takes the zone's
//! current position.
//!
//! # Zone positions
//! Every change of a zone gets the zone's next position (`ZoneState::position`, assigned
//! in the hold of the state lock that queues it on all of the zone's backups), sent with
//! the operation; see [`wire`]'s "Zone positions". An adopted zone numbers on from the
//! restorer's position ([`Restored::position`]).
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
//!
//! # Modules
//! `zones` (zone bookkeeping, registration), `stream` (backup streams, their send tasks,
//! acknowledgements and waits), `submit` (reporting changes), `sender` (batching pending
//! operations into messages, resending), `rebackup` (replacement backups, the copy from
//! memory), `adopt` (adopted zones) and `stats`.

mod adopt;
mod deferred;
mod driven;
mod io;
mod rebackup;
mod sender;
mod stats;
mod stream;
mod submit;
mod zones;

pub use adopt::{Adoption, AdoptionPlan, Restored};
pub use deferred::AckCallback;
pub use driven::CopyStep;
pub use io::{IoTask, ManualIo, MasterIo, NetIo};
pub use rebackup::ZoneReplacement;
pub use stats::{ReplicatorStats, StreamStats, ZoneStats};
pub use submit::AsyncChange;

use stream::{Stream, Target};
use submit::{Change, Mode};
use zones::ZoneState;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use myriad_net::{Incoming, NetHandle};
use myriad_placement::{Candidate, Placement, Strategy, ZoneTree};
use myriad_types::{ChunkId, NodeId};
use parking_lot::{Condvar, Mutex};
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::wire::{self};
use crate::{Durability, ReplicaError};

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

    /// Records that `backup`, one of the registered backups of `owner`'s zone `zone`, now
    /// holds the whole zone: its copy (re-replication) completed after the registration
    /// that added it. Until then the cluster counts it as *filling* and recovers the zone
    /// from it only when no complete backup can. The default records nothing (the backup
    /// stays filling: safe, only less redundant).
    fn filled(&self, owner: NodeId, zone: u32, backup: NodeId) -> RegisterFuture {
        let _ = (owner, zone, backup);
        Box::pin(std::future::ready(Ok(())))
    }
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
    /// CID order, until `visit` returns `false`. Returns the chunks it could not read now
    /// (they exist but are locked, e.g. by a client's chunk lock): the copy reads them
    /// again later instead of leaving them out.
    fn for_each_in_range(
        &self,
        first: ChunkId,
        last: ChunkId,
        visit: &mut dyn FnMut(ChunkId, &[u8]) -> bool,
    ) -> Vec<ChunkId>;
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
    /// How long asynchronous changes may wait on the master for more changes to share
    /// their message to a backup. A stream's queue leaves once its oldest change waited
    /// this long, or at once when it holds `message_bytes_target` bytes, when a change
    /// whose caller waits (replicated or durable) joins it, or when a writer waits for
    /// room. The caller of an asynchronous change never waits for it (it is acknowledged
    /// when memory holds it), so this costs no latency; it widens the window in which an
    /// acknowledged asynchronous change is on no backup by at most this much. At low
    /// rates every change is its own message to every backup (a send, a receive and an
    /// acknowledgement each); lingering lets them share one. Default 0 (each change
    /// leaves at once when its stream is idle); `myriad peer` sets 2 ms
    /// (`backup.async_linger_us`, at most 1 s there). At most 60 s.
    pub async_linger: Duration,
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
    /// Test-only switch (off in production): a backup added to a zone gets no
    /// [`wire::Op::Reset`] before its copy, as before zone positions, so a stale or
    /// diverged copy of the zone it held stays under the copy. The cluster simulator
    /// re-introduces the bug that fixed with it.
    pub bug_no_copy_reset: bool,
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
            async_linger: Duration::ZERO,
            stream_bytes_max: 32 << 20,
            resync_slice_bytes: 1 << 20,
            events_max: 1024,
            placement_seed: u64::from(node.0) ^ 0x5eed,
            first_zone: 0,
            bug_no_copy_reset: false,
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
        if self.async_linger > Duration::from_secs(60) {
            return Err(ReplicaError::InvalidConfig(
                "async_linger must be at most 60 s",
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

/// Everything the replicator changes, under [`Inner::state`]: the zone tree and placement,
/// the bookkeeping of every zone, and every backup stream.
struct State {
    tree: ZoneTree,
    placement: Placement,
    rng: SmallRng,
    zones: BTreeMap<u32, ZoneState>,
    /// Ordered by backup, so that a round over the streams is the same every run.
    streams: BTreeMap<NodeId, Stream>,
    last_stream_id: u64,
    /// Deferred waits for acknowledgements (`on_changes_deferred`).
    waiters: Vec<deferred::Waiter>,
}

/// The replicator's shared part: the sender thread, the send tasks, the acknowledgement
/// handler and re-replication threads hold it.
struct Inner {
    config: ReplicatorConfig,
    io: Arc<dyn MasterIo>,
    /// Run by a driver on its own thread ([`Replicator::driven`]): no sender or copy
    /// threads, no blocking calls; copies wait in `driven_copies`.
    driven: bool,
    driven_copies: Mutex<std::collections::VecDeque<driven::DrivenCopy>>,
    /// The sender was woken since a driver last looked ([`Replicator::take_sender_wakeup`]).
    sender_woken: AtomicBool,
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
        let io: Arc<dyn MasterIo> = Arc::new(NetIo::new(net.clone()));
        let inner = Inner::build(config, io, candidates, registry, source, false)?;
        let weak: Weak<Inner> = Arc::downgrade(&inner);
        // Inline on the I/O thread: an acknowledgement only moves marks under the state
        // lock (never held across a wait) and runs deferred callbacks, which answer
        // requests without waiting; a hand-off to a handler thread cost a thread switch
        // per acknowledgement.
        net.register_inline(wire::ACK, move |incoming: Incoming| {
            if let Some(inner) = weak.upgrade() {
                inner.on_ack(incoming.from, incoming.payload);
            }
        })
        .map_err(|e| ReplicaError::Net(e.to_string()))?;
        let sender_inner = inner.clone();
        let lost = net.subscribe();
        let sender = std::thread::Builder::new()
            .name(format!("replica-send-{}", inner.config.node.0))
            .spawn(move || sender_inner.sender_loop(lost))
            .map_err(|e| ReplicaError::Net(format!("spawning the sender thread: {e}")))?;
        Ok(Replicator {
            inner,
            sender: Some(sender),
        })
    }

    /// A replicator run by a driver on the driver's own thread, as the cluster simulator
    /// of the testing crate runs it: the same logic as [`Replicator::new`]'s, over `io`,
    /// without threads of its own. The driver delivers acknowledgements
    /// ([`Replicator::on_ack_message`]), calls [`Replicator::tick`] for what the sender
    /// thread does (resends, batching, timeouts, unreachable backups) and
    /// [`Replicator::copy_step`] for re-replication, and reports changes only with calls
    /// that never block ([`Replicator::on_changes_queued`], [`Replicator::on_changes_deferred`],
    /// [`Replicator::on_changes_nowait`]); the blocking calls answer
    /// [`ReplicaError::WouldWait`] at once.
    pub fn driven(
        config: ReplicatorConfig,
        io: Arc<dyn MasterIo>,
        candidates: Arc<dyn BackupCandidates>,
        registry: Arc<dyn ZoneRegistry>,
        source: Arc<dyn ChunkSource>,
    ) -> Result<Replicator, ReplicaError> {
        let inner = Inner::build(config, io, candidates, registry, source, true)?;
        Ok(Replicator {
            inner,
            sender: None,
        })
    }

    /// Takes an acknowledgement message ([`wire::ACK`]) of `backup`: what the handler that
    /// [`Replicator::new`] registers on the messaging layer does; a driven replicator's
    /// driver calls it. A malformed payload is logged and ignored.
    pub fn on_ack_message(&self, backup: NodeId, payload: bytes::Bytes) {
        self.inner.on_ack(backup, payload);
    }

    /// Whether the sender thread was woken since the last call (and resets it): a driven
    /// replicator's driver then runs [`Replicator::tick`] soon, as the woken thread would.
    pub fn take_sender_wakeup(&self) -> bool {
        self.inner.sender_woken.swap(false, Ordering::AcqRel)
    }

    /// One round of the sender thread, for a driven replicator (see
    /// [`Replicator::driven`]): batches pending operations into messages, resends windows
    /// that timed out or were asked for again (`lost`: backups whose connection was lost),
    /// ends deferred waits past their deadline, and reports backups without progress.
    pub fn tick(&self, lost: &[NodeId]) {
        self.inner.sender_round(lost);
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

    /// Reports puts and removes without ever waiting, like
    /// [`Replicator::on_changes_nowait`], but with any durability: instead of blocking
    /// until the backups acknowledge, `done` is called once they have (`replicated`: every
    /// backup of the zone applied the changes; `durable`: every backup has them on disk),
    /// or with the error that ends the wait (the same ones a blocking call gives, after at
    /// most `wait_timeout`). `done` runs on the thread that handles the acknowledgement
    /// (a messaging I/O thread), on the sender thread (timeouts), or here (already
    /// acknowledged, or `async`); never under a lock of the replicator. When the changes
    /// cannot be reported without waiting (a put's chunk has no registered zone, a zone's
    /// backup order is being registered, or the replicator is shut down), nothing is
    /// reported and the error comes back with `done`, not called.
    pub fn on_changes_deferred(
        &self,
        changes: &[AsyncChange<'_>],
        durability: Durability,
        done: AckCallback,
    ) -> Result<(), (ReplicaError, AckCallback)> {
        let list: Vec<Change<'_>> = changes.iter().map(|c| c.change()).collect();
        let deadline = self.inner.io.now() + self.inner.config.wait_timeout;
        let targets = match self.inner.submit_targets(
            list.iter().copied(),
            durability,
            Mode::NoWait(&list),
            deadline,
        ) {
            Ok((targets, _)) => targets,
            Err(error) => return Err((error, done)),
        };
        let finished = {
            let mut state = self.inner.state.lock();
            self.inner
                .defer(&mut state, targets, Vec::new(), durability, done)
        };
        deferred::run(finished);
        Ok(())
    }

    /// Reports changes, creates included, without ever waiting and without checking
    /// first: where a blocking call would wait, the changes are queued anyway (past a
    /// stream's byte limit, before a zone's registration committed, into a zone just
    /// opened and placed). `done` is called once the registration of every zone the
    /// changes went to is committed and the backups acknowledged as `durability` asks
    /// (for `async`, once the registrations are committed), or with the error that ends
    /// the wait, after at most `wait_timeout`. `done` runs where
    /// [`Replicator::on_changes_deferred`]'s does, or on the task that answers a
    /// registration. For a driver that runs the replicator on its own thread
    /// ([`Replicator::driven`]), which has nobody to wait for it: a node's writers use the
    /// blocking calls, whose waits also bound the streams' memory. An error before
    /// anything was queued (no backups for a `replicated` change, shut down) comes back
    /// with `done`, not called.
    pub fn on_changes_queued(
        &self,
        changes: &[AsyncChange<'_>],
        durability: Durability,
        done: AckCallback,
    ) -> Result<(), (ReplicaError, AckCallback)> {
        let deadline = self.inner.io.now() + self.inner.config.wait_timeout;
        let (targets, zones) = match self.inner.submit_targets(
            changes.iter().map(|c| c.change()),
            durability,
            Mode::Queue,
            deadline,
        ) {
            Ok(queued) => queued,
            Err(error) => return Err((error, done)),
        };
        let finished = {
            let mut state = self.inner.state.lock();
            self.inner
                .defer(&mut state, targets, zones, durability, done)
        };
        deferred::run(finished);
        Ok(())
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
    /// `bytes` payload in `content`) this master restored into its memory after `owner`
    /// failed (issue 6); the zone's changes are numbered on from `content.position`. The zone keeps its log identity `(owner, zone)`: its backups are the alive ones of
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
        content: Restored,
    ) -> Result<Adoption, ReplicaError> {
        if self.inner.driven {
            return Err(ReplicaError::WouldWait);
        }
        self.inner.adopt(owner, zone, old_backups, ranges, content)
    }

    /// The first half of [`Replicator::adopt_zone`], for a driver that registers the
    /// zone's new backup order itself: chooses the backups of `owner`'s zone `zone` (the
    /// alive ones of `old_backups`, then new ones from the placement; the ones of an
    /// earlier adoption of the zone). Changes nothing. The caller registers
    /// `plan.backups` and, once that committed, calls [`Replicator::adopt_registered`].
    pub fn plan_adoption(
        &self,
        owner: NodeId,
        zone: u32,
        old_backups: &[NodeId],
    ) -> Result<AdoptionPlan, ReplicaError> {
        self.inner.plan_adoption(owner, zone, old_backups)
    }

    /// The second half of [`Replicator::adopt_zone`]: takes over the zone of `plan`,
    /// whose backup order the cluster committed, with `ranges` and `content` as
    /// [`Replicator::adopt_zone`] takes them. A driven replicator copies it to the added
    /// backups after [`Replicator::queue_adopted_copies`].
    pub fn adopt_registered(
        &self,
        plan: AdoptionPlan,
        ranges: &[(ChunkId, ChunkId)],
        content: Restored,
    ) -> Adoption {
        self.inner.adopt_registered(plan, ranges, content)
    }

    /// Removes the CIDs of `ranges` from an adopted zone's logs (each one's removal goes
    /// to the zone's backups like a change): chunks the restorer read back but does not
    /// take over (a migration's orphans, see the node's recovery), so that no later
    /// recovery of the zone brings them back. CIDs this master's zone tree gives another
    /// zone are skipped.
    pub fn forget_in_adopted(&self, adoption: &Adoption, ranges: &[(ChunkId, ChunkId)]) {
        self.inner.forget_in_zone(adoption.zone, ranges);
    }

    /// Queues the copies of an adopted zone to its added backups for
    /// [`Replicator::copy_step`] (a driven replicator's [`Replicator::copy_adopted`]).
    pub fn queue_adopted_copies(&self, adoption: &Adoption) {
        self.inner
            .queue_copies(adoption.added.iter().map(|&b| (adoption.zone, b)));
    }

    /// One step of a driven replicator's re-replication: a slice of the first waiting
    /// copy (of a replacement or added backup, [`Replicator::replace_backup`],
    /// [`Replicator::fill_zones`], [`Replicator::queue_adopted_copies`]) read from memory
    /// and queued. See [`CopyStep`].
    pub fn copy_step(&self) -> CopyStep {
        self.inner.copy_step()
    }

    /// Whether a copy waits for [`Replicator::copy_step`].
    pub fn copies_waiting(&self) -> bool {
        self.inner.copies_waiting()
    }

    /// Copies an adopted zone from memory to its added backups (the surviving ones hold its
    /// log already), one after the other, with the ordering of [`Replicator::replace_backup`]'s
    /// copy (changes made meanwhile are never overtaken by an older copy). Returns once every
    /// copy is on the added backups' disks (and the zone's registration done), with the
    /// number of chunks copied. Blocks.
    pub fn copy_adopted(&self, adoption: &Adoption) -> Result<u64, ReplicaError> {
        if self.inner.driven {
            return Err(ReplicaError::WouldWait);
        }
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
        if self.inner.driven {
            return Err(ReplicaError::WouldWait);
        }
        let targets: Vec<Target> = {
            let mut state = self.inner.state.lock();
            // Lingering changes leave now: someone waits for them.
            for stream in state.streams.values_mut() {
                stream.urgent |= !stream.pending.is_empty();
            }
            self.inner.wake_sender();
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
        // Dropping the streams ends their send tasks; deferred waits end with Shutdown.
        let finished = {
            let mut state = self.inner.state.lock();
            state.streams.clear();
            Inner::fail_waiters(&mut state, &ReplicaError::Shutdown)
        };
        deferred::run(finished);
    }
}

impl Inner {
    fn build(
        config: ReplicatorConfig,
        io: Arc<dyn MasterIo>,
        candidates: Arc<dyn BackupCandidates>,
        registry: Arc<dyn ZoneRegistry>,
        source: Arc<dyn ChunkSource>,
        driven: bool,
    ) -> Result<Arc<Inner>, ReplicaError> {
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
            streams: BTreeMap::new(),
            last_stream_id: 0,
            waiters: Vec::new(),
        };
        Ok(Arc::new(Inner {
            config,
            io,
            driven,
            driven_copies: Mutex::new(std::collections::VecDeque::new()),
            sender_woken: AtomicBool::new(false),
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
        }))
    }

    /// Wakes the sender thread (it has pending operations or a resend request); a driven
    /// replicator's driver sees it with [`Replicator::take_sender_wakeup`].
    fn wake_sender(&self) {
        self.sender_woken.store(true, Ordering::Release);
        self.work.notify_one();
    }

    fn emit(&self, event: ReplicaEvent) {
        if self.events.try_send(event.clone()).is_err() {
            tracing::warn!(?event, "replication event queue full; event dropped");
        }
    }
}
