//! The backup side: applies masters' replication streams to the log engine.
//!
//! # Job
//! [`BackupService`] handles [`wire::REPLICATE`] messages (an ordered type, so in send
//! order: on a handler-pool lane, or inline on the I/O thread that reads the master's
//! connection with [`BackupConfig::apply_inline`]): it creates the log zone
//! on first use (the master's zone `(master, zone)`, or for an operation naming a log
//! owner, the adopted zone `(owner, zone)` the master restored from a failed peer), appends writes and removes in stream order, drops operations it already
//! applied, stops at a gap, and acknowledges ([`wire::ACK`]) right after appending
//! (`Replicated`). A durability thread acknowledges again once the appends are on disk
//! (`Durable`): it calls [`LogEngine::wait_durable`] when a message asked for durability
//! (the flusher then flushes at once) and otherwise follows [`LogEngine::durable_seq`].
//! Nothing waits for the disk on a messaging thread. With `apply_inline`, a message is
//! applied inline only when
//! its zones exist and the engine has room for it now ([`LogEngine::room_now`]), and its
//! acknowledgement is queued without waiting ([`NetHandle::send_detached`]). Any other
//! message (a zone to create, a full write buffer, a recovery running here) goes to the
//! service's apply thread, and so do all messages after it until that thread has caught
//! up, which keeps the send order. (Inline application spares a thread switch per
//! message: with the pool hand-off, each replicated write cost one on every backup.)
//!
//! # Invariants
//! - An operation is applied only if its sequence number is the stream's next one: never
//!   twice, never out of order. A stream ID lower than the current one is stale and ignored;
//!   a higher one (a restarted master) starts over at 1.
//! - A `Durable` acknowledgement covers only appends whose log sequence number the engine
//!   reported durable; a failing disk never produces one.
//! - Zone numbers must fit the log engine's 16-bit zone field; a larger one is refused
//!   (and acknowledged as refused, so the master learns why).
//! - Messages of a fenced node never reach the handler (the messaging layer drops them).
//! - Per master, pending durability marks are bounded ([`BackupConfig::marks_max`]):
//!   older marks are merged, which only delays acknowledgements.
//!
//! # Who calls it
//! The peer role of the node crate: builds it over its log engine, registers it on its
//! endpoint's handlers before start, and attaches the endpoint's handle after start.
//! Recovery (issue 6) reads zones through [`BackupService::recover_zone`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use myriad_backup_log::{
    LogEngine, LogError, RecoveredChunk, RecoveryOptions, RecoveryReport, ZoneId,
};
use myriad_net::{Handlers, Incoming, NetError, NetHandle};
use myriad_types::NodeId;
use parking_lot::{Condvar, Mutex};

use crate::wire::{self, Ack, AckStatus, LogMessage, Op};

/// Settings of a [`BackupService`].
#[derive(Debug, Clone)]
pub struct BackupConfig {
    /// How long the durability thread waits for one flush. Default 2 s.
    pub durable_wait: Duration,
    /// How often the durability thread looks at the engine's durable mark when nobody asked
    /// for durability. Default 20 ms.
    pub poll_interval: Duration,
    /// Durability marks kept per master before they are merged. Default 4096.
    pub marks_max: usize,
    /// **Test-only switch, never set in production.** Re-introduces a fixed bug for the
    /// simulator to find (`myriad_testing::sim`): [`BackupService::recover_zone`] does not
    /// freeze the zone (nor does [`BackupService::recover_zone_and_seal`] freeze or seal
    /// it, nor [`BackupService::seal_owner`] seal anything), so an append racing the read
    /// can drop a chunk from the result (the bug of commit 48cc98a). Default false.
    pub bug_no_recovery_freeze: bool,
    /// Apply replication messages inline on the I/O thread that read them when the log
    /// engine has room now (see the module docs); otherwise every message goes through
    /// the handler pool. Default true: inline application measured 19–24 % more YCSB G
    /// throughput (docs/benchmarks.md). (It was off for a while after two CI failures;
    /// their cause was a duplicated join, fixed in the connection table.)
    pub apply_inline: bool,
}

impl Default for BackupConfig {
    fn default() -> Self {
        BackupConfig {
            durable_wait: Duration::from_secs(2),
            poll_interval: Duration::from_millis(20),
            marks_max: 4096,
            bug_no_recovery_freeze: false,
            apply_inline: true,
        }
    }
}

/// Why a backup-side call failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The zone number does not fit the log engine's 16-bit zone field.
    #[error("zone {0} exceeds the log engine's zone numbers (at most 65535)")]
    ZoneOutOfRange(u32),
    /// The log engine failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// Registering a handler failed.
    #[error(transparent)]
    Net(#[from] NetError),
}

/// The log engine's zone for `owner`'s zone `zone`.
pub fn log_zone(owner: NodeId, zone: u32) -> Result<ZoneId, BackupError> {
    let zone = u16::try_from(zone).map_err(|_| BackupError::ZoneOutOfRange(zone))?;
    Ok(ZoneId {
        owner: owner.0,
        zone,
    })
}

#[derive(Debug, Default)]
struct StreamState {
    id: u64,
    applied: u64,
}

/// Durability bookkeeping of one master's stream.
#[derive(Debug, Default)]
struct Marks {
    stream: u64,
    /// `(stream seq, log seq, durability requested)`, ascending.
    marks: VecDeque<(u64, u64, bool)>,
    applied: u64,
    durable: u64,
}

/// Unfreezes a zone frozen by [`Inner::freeze`] when dropped.
struct Frozen<'a> {
    inner: &'a Inner,
    zone: ZoneId,
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if self.inner.recovering.lock().remove(&self.zone) {
            self.inner.recovering_count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

struct Inner {
    engine: Arc<LogEngine>,
    config: BackupConfig,
    net: OnceLock<NetHandle>,
    streams: Mutex<HashMap<NodeId, Arc<Mutex<StreamState>>>>,
    zones: Mutex<HashSet<ZoneId>>,
    /// Zones being read by [`BackupService::recover_zone`]: operations for them are
    /// refused meanwhile (see there).
    recovering: Mutex<HashSet<ZoneId>>,
    /// `recovering.len()`, readable without the mutex on every message.
    recovering_count: AtomicUsize,
    /// Zones read back for a recovery here: their log owner's own operations for them
    /// are refused from then on (see [`BackupService::recover_zone`]).
    sealed: Mutex<HashSet<ZoneId>>,
    /// `sealed.len() + sealed_owners.len()`, readable without the mutexes on every
    /// message.
    sealed_count: AtomicUsize,
    /// Each zone's position: the last zone position applied, or set by a reset (see
    /// [`wire`]'s "Zone positions"). In memory only: a restarted backup knows none.
    positions: Mutex<HashMap<ZoneId, u64>>,
    /// Writers (failed holders of adopted zones) whose operations for a zone are refused
    /// ([`BackupService::seal_and_position`]).
    sealed_writers: Mutex<HashSet<(ZoneId, NodeId)>>,
    /// Resets applied: copies of a zone to this backup started ([`BackupService::resets`]).
    resets: AtomicU64,
    /// Failed peers whose own operations for their zones below the number given are
    /// refused ([`BackupService::seal_owner`]).
    sealed_owners: Mutex<HashMap<NodeId, u32>>,
    marks: Mutex<HashMap<NodeId, Marks>>,
    marks_cv: Condvar,
    shutdown: AtomicBool,
    /// Messages handed to the apply thread and not applied yet: while there are any, new
    /// messages follow them there (send order).
    deferred: AtomicUsize,
    /// To the apply thread (`None`: stop).
    defer_tx: crossbeam_channel::Sender<Option<(NodeId, LogMessage)>>,
    /// Messages applied inline and on the apply thread ([`BackupService::apply_paths`]).
    applied_inline: AtomicU64,
    applied_deferred: AtomicU64,
}

/// The backup side of replication. See the module documentation.
pub struct BackupService {
    inner: Arc<Inner>,
    watcher: Option<JoinHandle<()>>,
    applier: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for BackupService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupService").finish_non_exhaustive()
    }
}

impl BackupService {
    /// A service over `engine`; starts its durability thread.
    pub fn new(engine: Arc<LogEngine>, config: BackupConfig) -> std::io::Result<BackupService> {
        let (defer_tx, defer_rx) = crossbeam_channel::unbounded();
        let inner = Arc::new(Inner {
            engine,
            config,
            net: OnceLock::new(),
            streams: Mutex::new(HashMap::new()),
            zones: Mutex::new(HashSet::new()),
            recovering: Mutex::new(HashSet::new()),
            recovering_count: AtomicUsize::new(0),
            sealed: Mutex::new(HashSet::new()),
            sealed_count: AtomicUsize::new(0),
            positions: Mutex::new(HashMap::new()),
            sealed_writers: Mutex::new(HashSet::new()),
            resets: AtomicU64::new(0),
            sealed_owners: Mutex::new(HashMap::new()),
            marks: Mutex::new(HashMap::new()),
            marks_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            deferred: AtomicUsize::new(0),
            defer_tx,
            applied_inline: AtomicU64::new(0),
            applied_deferred: AtomicU64::new(0),
        });
        let watcher_inner = inner.clone();
        let watcher = std::thread::Builder::new()
            .name("replica-durable".into())
            .spawn(move || watcher_inner.durability_loop())?;
        let apply_inner = inner.clone();
        let applier = std::thread::Builder::new()
            .name("replica-apply".into())
            .spawn(move || apply_inner.apply_loop(defer_rx));
        let applier = match applier {
            Ok(applier) => applier,
            Err(error) => {
                inner.shutdown.store(true, Ordering::Release);
                inner.marks_cv.notify_all();
                let _ = watcher.join();
                return Err(error);
            }
        };
        Ok(BackupService {
            inner,
            watcher: Some(watcher),
            applier: Some(applier),
        })
    }

    /// Replication messages handled so far: `(inline on an I/O thread, on another thread:
    /// the apply thread, or the handler pool when [`BackupConfig::apply_inline`] is off)`;
    /// see the module docs.
    pub fn apply_paths(&self) -> (u64, u64) {
        (
            self.inner.applied_inline.load(Ordering::Relaxed),
            self.inner.applied_deferred.load(Ordering::Relaxed),
        )
    }

    /// The log engine.
    pub fn engine(&self) -> &Arc<LogEngine> {
        &self.inner.engine
    }

    /// Registers the replication handler on `handlers` (before the endpoint starts). Until
    /// [`BackupService::attach`] gives it a handle to answer with, messages are dropped
    /// unapplied (masters resend them).
    pub fn register(&self, handlers: &mut Handlers) -> Result<(), BackupError> {
        let inner = self.inner.clone();
        let handler = move |incoming: Incoming| inner.on_message(incoming);
        if self.inner.config.apply_inline {
            handlers.register_inline_ordered(wire::REPLICATE, handler)?;
        } else {
            handlers.register(wire::REPLICATE, handler)?;
        }
        let inner = self.inner.clone();
        handlers.register(wire::ZONE_POSITION, move |incoming| {
            inner.on_position_request(incoming)
        })?;
        Ok(())
    }

    /// Registers the handler on a running endpoint and attaches it.
    pub fn register_on(&self, net: &NetHandle) -> Result<(), BackupError> {
        self.attach(net.clone());
        let inner = self.inner.clone();
        let handler = move |incoming: Incoming| inner.on_message(incoming);
        if self.inner.config.apply_inline {
            net.register_inline_ordered(wire::REPLICATE, handler)?;
        } else {
            net.register(wire::REPLICATE, handler)?;
        }
        let inner = self.inner.clone();
        net.register(wire::ZONE_POSITION, move |incoming| {
            inner.on_position_request(incoming)
        })?;
        Ok(())
    }

    /// Gives the service the endpoint handle it acknowledges through (once; later calls
    /// are ignored).
    pub fn attach(&self, net: NetHandle) {
        let _ = self.inner.net.set(net);
    }

    /// Every zone held here as `(owner, zone)`, sorted.
    pub fn zone_ids(&self) -> Vec<(NodeId, u32)> {
        self.inner
            .engine
            .zones()
            .into_iter()
            .map(|z| (NodeId(z.owner), u32::from(z.zone)))
            .collect()
    }

    /// Reads `owner`'s zone `zone` back (the current version of every chunk; see
    /// [`LogEngine::recover_zone`]).
    ///
    /// The zone is frozen while it is read: replication operations for it are refused
    /// (acknowledged as refused), and a message being applied when the call starts is
    /// waited for. Otherwise an append racing the read (a message of the failed owner
    /// that was already being applied when the owner was fenced) could give a chunk a
    /// version newer than the entries the read finds, and the chunk would be missing
    /// from the result altogether instead of having its previous value.
    pub fn recover_zone(
        &self,
        owner: NodeId,
        zone: u32,
        sink: &(dyn Fn(&[RecoveredChunk<'_>]) + Sync),
    ) -> Result<RecoveryReport, BackupError> {
        self.read_zone(owner, zone, false, sink)
    }

    /// The read of [`recover_zone`](Self::recover_zone), frozen; with `seal`, the zone is
    /// sealed for its owner before the read, whatever its outcome (also when nothing of
    /// the zone reached this backup yet). The re-introduced bug of commit 48cc98a reads
    /// with neither protection.
    fn read_zone(
        &self,
        owner: NodeId,
        zone: u32,
        seal: bool,
        sink: &(dyn Fn(&[RecoveredChunk<'_>]) + Sync),
    ) -> Result<RecoveryReport, BackupError> {
        let id = log_zone(owner, zone)?;
        let protect = !self.inner.config.bug_no_recovery_freeze;
        let _frozen = protect.then(|| self.inner.freeze(id));
        if seal && protect {
            self.inner.seal(id);
        }
        let options = RecoveryOptions::from_config(self.inner.engine.config());
        Ok(self.inner.engine.recover_zone(id, &options, sink)?)
    }

    /// `owner` was declared failed: its own operations for its zones below `zones_end`
    /// (every zone its incarnations registered, `myriad_meta::PeerBases::zones_end`) are
    /// refused from now on, like those of a zone read back here
    /// ([`BackupService::recover_zone_and_seal`]): a message it sent before it failed
    /// and that this backup accepted but had not applied yet never lands in a zone that
    /// a restorer adopts meanwhile, also at a backup the restorer keeps without having
    /// asked it to read the zone (simulator seed 1270). A restarted owner registers zones
    /// from `zones_end` on. The node calls it on the `NodeFailed` event.
    pub fn seal_owner(&self, owner: NodeId, zones_end: u32) {
        if self.inner.config.bug_no_recovery_freeze {
            return;
        }
        let mut owners = self.inner.sealed_owners.lock();
        let end = owners.entry(owner).or_insert_with(|| {
            self.inner.sealed_count.fetch_add(1, Ordering::AcqRel);
            0
        });
        *end = (*end).max(zones_end);
    }

    /// [`BackupService::recover_zone`] for the recovery of a failed peer's zone (the
    /// restorer's read, `myriad_node::recovery`).
    ///
    /// The zone is also **sealed** for its log owner: its own operations for the zone
    /// (messages it sent before it failed that this backup had accepted but not applied)
    /// are refused from the read on, while those of a peer that adopted the zone are
    /// applied. Otherwise such a message applied after the read (at this backup, or at a
    /// backup whose read failed and that stays in the zone's order) would put into the
    /// zone's log a change its holder never had, which a later recovery of the zone brings
    /// back (found by the simulator, seed 276: a chunk lost with its owner came back after
    /// the second recovery of the zone). A restarted owner registers new zone numbers, so
    /// a sealed zone never receives its own operations again. A backup that is not asked
    /// to read the zone is sealed by [`BackupService::seal_owner`] when the owner's
    /// failure reaches it (a message applied before that event arrives is a gap).
    pub fn recover_zone_and_seal(
        &self,
        owner: NodeId,
        zone: u32,
        sink: &(dyn Fn(&[RecoveredChunk<'_>]) + Sync),
    ) -> Result<RecoveryReport, BackupError> {
        self.read_zone(owner, zone, true, sink)
    }

    /// Whether this backup holds a log of `owner`'s zone `zone` (it received something of
    /// it, and it was not removed since).
    pub fn holds_zone(&self, owner: NodeId, zone: u32) -> bool {
        log_zone(owner, zone).is_ok_and(|id| self.inner.engine.zones().contains(&id))
    }

    /// How many copies of a zone to this backup started here so far (resets applied:
    /// the backup was added to a zone, by a replacement or an adoption).
    pub fn resets(&self) -> u64 {
        self.inner.resets.load(Ordering::Relaxed)
    }

    /// `owner`'s zone `zone`'s position here (see [`wire`]'s "Zone positions"): `None`
    /// when this backup holds none for it (it restarted since, or never held the zone).
    pub fn position(&self, owner: NodeId, zone: u32) -> Option<u64> {
        let id = log_zone(owner, zone).ok()?;
        self.inner.positions.lock().get(&id).copied()
    }

    /// The answer to a restorer's [`wire::PositionRequest`]: seals `owner`'s zone `zone`
    /// against `writer` (the failed peer that wrote it: its owner, or the holder that had
    /// adopted it) and against its owner, waits for a message of theirs being applied
    /// (the zone is frozen for a moment), then returns its [`position`](Self::position).
    /// From then on the position changes only by a new writer's operations.
    pub fn seal_and_position(&self, owner: NodeId, zone: u32, writer: NodeId) -> Option<u64> {
        self.inner.seal_and_position(owner, zone, writer)
    }

    /// Applies one replication message (the payload of a [`wire::REPLICATE`] message) of
    /// `master` exactly as the message handler does, and returns the acknowledgement the
    /// handler would send (`None` for a malformed or stale message) instead of sending it.
    /// For callers that deliver messages themselves: the deterministic simulator of
    /// `myriad-testing`.
    pub fn apply(&self, master: NodeId, payload: Bytes) -> Option<Ack> {
        self.inner.apply_message(master, payload)
    }

    /// Deletes `owner`'s zone `zone` and its files (it is no longer backed up here; see
    /// [`LogEngine::remove_zone`]).
    pub fn remove_zone(&self, owner: NodeId, zone: u32) -> Result<(), BackupError> {
        let id = log_zone(owner, zone)?;
        if self.inner.sealed.lock().remove(&id) {
            self.inner.sealed_count.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(self.inner.engine.remove_zone(id)?)
    }

    /// The last applied and durable sequence numbers of `master`'s current stream.
    pub fn stream_position(&self, master: NodeId) -> Option<(u64, u64)> {
        self.inner
            .marks
            .lock()
            .get(&master)
            .map(|m| (m.applied, m.durable))
    }
}

impl Drop for BackupService {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        {
            let _marks = self.inner.marks.lock();
            self.inner.marks_cv.notify_all();
        }
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
        if let Some(applier) = self.applier.take() {
            // Wakes the apply thread at once (dropping a service must not wait).
            let _ = self.inner.defer_tx.send(None);
            let _ = applier.join();
        }
    }
}

/// Decodes a replication message; a malformed one is logged and dropped (`None`).
fn decode_message(master: NodeId, payload: Bytes) -> Option<LogMessage> {
    match LogMessage::decode(payload) {
        Ok(message) => Some(message),
        Err(e) => {
            tracing::warn!(%master, error = %e, "malformed replication message");
            None
        }
    }
}

impl Inner {
    /// Answers a [`wire::PositionRequest`] (malformed ones are dropped: the restorer
    /// times out and keeps no survivor it could not ask).
    fn on_position_request(self: &Arc<Self>, incoming: Incoming) {
        let request = match wire::PositionRequest::decode(incoming.payload.clone()) {
            Ok(request) => request,
            Err(e) => {
                tracing::warn!(from = %incoming.from, error = %e, "malformed zone position request");
                return;
            }
        };
        let position = self.seal_and_position(request.owner, request.zone, request.writer);
        if let Err(e) = incoming.respond(wire::PositionReply(position).encode()) {
            tracing::debug!(error = %e, "zone position not sent");
        }
    }

    fn ensure_zone(&self, zone: ZoneId) -> Result<(), LogError> {
        let mut zones = self.zones.lock();
        if zones.contains(&zone) {
            return Ok(());
        }
        match self.engine.create_zone(zone) {
            Ok(()) | Err(LogError::ZoneExists(_)) => {
                zones.insert(zone);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Queues an acknowledgement without waiting (from an I/O thread or the apply thread).
    fn send_ack(&self, to: NodeId, ack: &Ack) {
        let Some(net) = self.net.get() else {
            return;
        };
        if let Err(e) = net.send_detached(to, wire::ACK, ack.encode()) {
            tracing::debug!(master = %to, error = %e, "replication ack not sent");
        }
    }

    /// The apply thread: applies the messages the inline handler could not, in order.
    fn apply_loop(&self, messages: crossbeam_channel::Receiver<Option<(NodeId, LogMessage)>>) {
        while let Ok(Some((master, message))) = messages.recv() {
            if self.shutdown.load(Ordering::Acquire) {
                return;
            }
            let ack = self.apply_decoded(master, message);
            self.applied_deferred.fetch_add(1, Ordering::Relaxed);
            self.deferred.fetch_sub(1, Ordering::AcqRel);
            if let Some(ack) = ack {
                self.send_ack(master, &ack);
            }
        }
    }

    /// Whether `message` of `master` can be applied now without waiting: no recovery
    /// read is running here, every zone it writes exists, and the engine has room for
    /// each zone's share ([`LogEngine::room_now`]).
    fn fits_now(&self, master: NodeId, message: &LogMessage) -> bool {
        if self.recovering_count.load(Ordering::Acquire) > 0 {
            return false;
        }
        // (zone, operations, payload bytes, largest payload)
        let mut shares: Vec<(ZoneId, usize, usize, usize)> = Vec::new();
        for op in &message.ops {
            let (owner, zone_number) = op.log_zone(master);
            let Ok(zone) = log_zone(owner, zone_number) else {
                return false;
            };
            let bytes = match op {
                Op::Put { data, .. } => data.len(),
                Op::Remove { .. } => 0,
                // Deleting and creating a zone's files waits for the disk.
                Op::Reset { .. } => return false,
            };
            match shares.iter_mut().find(|share| share.0 == zone) {
                Some(share) => {
                    share.1 += 1;
                    share.2 += bytes;
                    share.3 = share.3.max(bytes);
                }
                None => shares.push((zone, 1, bytes, bytes)),
            }
        }
        {
            let zones = self.zones.lock();
            if shares.iter().any(|share| !zones.contains(&share.0)) {
                return false;
            }
        }
        shares
            .iter()
            .all(|&(zone, ops, bytes, largest)| self.engine.room_now(zone, ops, bytes, largest))
    }

    /// Freezes `zone` until the guard drops: from now on every message applies nothing to
    /// it (checked under the master's stream lock), and every message that was being
    /// applied before has finished when this returns (each stream lock taken once).
    fn freeze(&self, zone: ZoneId) -> Frozen<'_> {
        if self.recovering.lock().insert(zone) {
            self.recovering_count.fetch_add(1, Ordering::AcqRel);
        }
        let streams: Vec<Arc<Mutex<StreamState>>> = self.streams.lock().values().cloned().collect();
        for stream in streams {
            drop(stream.lock());
        }
        Frozen { inner: self, zone }
    }

    /// Whether `zone` was read back for a recovery here (its owner's operations refused).
    fn is_sealed(&self, zone: ZoneId) -> bool {
        self.sealed_count.load(Ordering::Acquire) > 0
            && (self.sealed.lock().contains(&zone)
                || self
                    .sealed_owners
                    .lock()
                    .get(&NodeId(zone.owner))
                    .is_some_and(|&end| u32::from(zone.zone) < end))
    }

    /// Whether an operation of `master` for `zone` is refused: the zone is sealed for
    /// its owner (`own`: `master` is the owner) or for `master` as its writer.
    fn is_sealed_for(&self, zone: ZoneId, own: bool, master: NodeId) -> bool {
        if self.sealed_count.load(Ordering::Acquire) == 0 {
            return false;
        }
        if own {
            self.is_sealed(zone)
        } else {
            self.sealed_writers.lock().contains(&(zone, master))
        }
    }

    /// See [`BackupService::seal_and_position`].
    fn seal_and_position(&self, owner: NodeId, zone: u32, writer: NodeId) -> Option<u64> {
        let id = log_zone(owner, zone).ok()?;
        if !self.config.bug_no_recovery_freeze {
            self.seal(id);
            if writer != owner && self.sealed_writers.lock().insert((id, writer)) {
                self.sealed_count.fetch_add(1, Ordering::AcqRel);
            }
            drop(self.freeze(id));
        }
        self.positions.lock().get(&id).copied()
    }

    /// Records that `zone` reached `position` (0: an operation without one).
    fn advance(&self, zone: ZoneId, position: u64) {
        if position > 0 {
            let mut positions = self.positions.lock();
            let entry = positions.entry(zone).or_insert(0);
            *entry = (*entry).max(position);
        }
    }

    /// Empties `zone` (its files deleted and created anew) and sets its position: the
    /// start of a copy of the zone to this backup. Returns a log sequence number that is
    /// durable already (the deletion flushed everything before it).
    fn reset_zone(&self, zone: ZoneId, position: u64) -> Result<u64, LogError> {
        self.zones.lock().remove(&zone);
        match self.engine.remove_zone(zone) {
            Ok(()) | Err(LogError::UnknownZone(_)) => {}
            Err(e) => return Err(e),
        }
        self.ensure_zone(zone)?;
        self.positions.lock().insert(zone, position);
        self.resets.fetch_add(1, Ordering::Relaxed);
        Ok(self.engine.durable_seq())
    }

    /// Seals `zone` (see [`BackupService::recover_zone`]).
    fn seal(&self, zone: ZoneId) {
        if self.sealed.lock().insert(zone) {
            self.sealed_count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether `zone` is frozen for a recovery read.
    fn is_frozen(&self, zone: ZoneId) -> bool {
        self.recovering_count.load(Ordering::Acquire) > 0 && self.recovering.lock().contains(&zone)
    }

    /// Applies a run of puts of one zone; returns the last log sequence number.
    fn apply_puts(&self, zone: ZoneId, run: &[(u64, &[u8])]) -> Result<u64, LogError> {
        self.ensure_zone(zone)?;
        self.engine.append_batch(zone, run)
    }

    /// The inline handler (on the I/O thread that read the message): applies the message
    /// here when that cannot wait, else hands it to the apply thread.
    fn on_message(&self, incoming: Incoming) {
        if self.net.get().is_none() {
            return;
        }
        let master = incoming.from;
        let Some(message) = decode_message(master, incoming.payload) else {
            return;
        };
        if !self.config.apply_inline {
            // On a handler-pool thread (registered there, in send order).
            let ack = self.apply_decoded(master, message);
            self.applied_deferred.fetch_add(1, Ordering::Relaxed);
            if let Some(ack) = ack {
                self.send_ack(master, &ack);
            }
            return;
        }
        if self.deferred.load(Ordering::Acquire) == 0 && self.fits_now(master, &message) {
            let ack = self.apply_decoded(master, message);
            self.applied_inline.fetch_add(1, Ordering::Relaxed);
            if let Some(ack) = ack {
                self.send_ack(master, &ack);
            }
            return;
        }
        self.deferred.fetch_add(1, Ordering::AcqRel);
        if self.defer_tx.send(Some((master, message))).is_err() {
            self.deferred.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Applies one replication message of `master` and returns the acknowledgement to send
    /// (`None` for a malformed or stale message, which is not acknowledged).
    fn apply_message(&self, master: NodeId, payload: Bytes) -> Option<Ack> {
        let message = decode_message(master, payload)?;
        self.apply_decoded(master, message)
    }

    /// [`Inner::apply_message`] for a decoded message.
    fn apply_decoded(&self, master: NodeId, message: LogMessage) -> Option<Ack> {
        let stream = self.streams.lock().entry(master).or_default().clone();
        let mut stream = stream.lock();
        if message.stream < stream.id {
            return None;
        }
        if message.stream > stream.id {
            *stream = StreamState {
                id: message.stream,
                applied: 0,
            };
            let mut marks = self.marks.lock();
            marks.insert(
                master,
                Marks {
                    stream: message.stream,
                    ..Marks::default()
                },
            );
        }
        let mut status = AckStatus::Ok;
        let mut last_log: Option<u64> = None;
        let skip = stream.applied.saturating_sub(message.first_seq - 1);
        if message.first_seq > stream.applied + 1 {
            status = AckStatus::Gap;
        } else {
            let ops = message.ops.get(skip as usize..).unwrap_or(&[]);
            let mut seq = message.first_seq + skip;
            let mut index = 0;
            while index < ops.len() {
                let op = &ops[index];
                let (owner, zone_number) = op.log_zone(master);
                let frozen = log_zone(owner, zone_number).is_ok_and(|id| self.is_frozen(id));
                let sealed = log_zone(owner, zone_number)
                    .is_ok_and(|id| self.is_sealed_for(id, owner == master, master));
                let result: Result<(usize, u64), String> = match op {
                    _ if frozen => Err(format!(
                        "zone {zone_number} of {owner} is being recovered here"
                    )),
                    _ if sealed => Err(format!(
                        "zone {zone_number} of {owner} was recovered from here: its owner's operations are refused"
                    )),
                    Op::Put { .. } => {
                        let mut position = 0;
                        let run: Vec<(u64, &[u8])> = ops[index..]
                            .iter()
                            .map_while(|op| match op {
                                Op::Put { cid, data, seq, .. }
                                    if op.log_zone(master) == (owner, zone_number) =>
                                {
                                    position = position.max(*seq);
                                    Some((*cid, &data[..]))
                                }
                                _ => None,
                            })
                            .collect();
                        log_zone(owner, zone_number)
                            .map_err(|e| e.to_string())
                            .and_then(|id| {
                                let log_seq = self.apply_puts(id, &run).map_err(|e| e.to_string())?;
                                self.advance(id, position);
                                Ok(log_seq)
                            })
                            .map(|log_seq| (run.len(), log_seq))
                    }
                    Op::Remove { cid, seq, .. } => log_zone(owner, zone_number)
                        .map_err(|e| e.to_string())
                        .and_then(|id| {
                            let ticket = self
                                .ensure_zone(id)
                                .and_then(|()| self.engine.remove(id, *cid))
                                .map_err(|e| e.to_string())?;
                            self.advance(id, *seq);
                            Ok(ticket)
                        })
                        .map(|ticket| (1, ticket.seq)),
                    Op::Reset { seq, .. } => log_zone(owner, zone_number)
                        .map_err(|e| e.to_string())
                        .and_then(|id| self.reset_zone(id, *seq).map_err(|e| e.to_string()))
                        .map(|log_seq| (1, log_seq)),
                };
                match result {
                    Ok((count, log_seq)) => {
                        index += count;
                        seq += count as u64;
                        stream.applied = seq - 1;
                        last_log = Some(log_seq);
                    }
                    Err(reason) => {
                        tracing::warn!(%master, %reason, "replicated operation refused");
                        status = AckStatus::Refused(reason);
                        break;
                    }
                }
            }
        }
        let applied = stream.applied;
        let durable = {
            let mut marks = self.marks.lock();
            let entry = marks.entry(master).or_insert_with(|| Marks {
                stream: message.stream,
                ..Marks::default()
            });
            entry.applied = applied;
            if let Some(log_seq) = last_log {
                if entry.marks.len() >= self.config.marks_max {
                    // Merge into the newest mark: acknowledging later is always safe.
                    if let Some(newest) = entry.marks.back_mut() {
                        *newest = (applied, log_seq, newest.2 || message.durable_requested);
                    }
                } else {
                    entry
                        .marks
                        .push_back((applied, log_seq, message.durable_requested));
                }
                // Only a mark someone waits for (durability requested) needs the
                // durability thread now; the others it takes on its next poll. (Waking
                // it for every message cost a thread switch per replicated write.)
                if message.durable_requested {
                    self.marks_cv.notify_all();
                }
            }
            entry.durable
        };
        drop(stream);
        Some(Ack {
            stream: message.stream,
            applied_seq: applied,
            durable_seq: durable.min(applied),
            status,
        })
    }

    fn durability_loop(&self) {
        loop {
            let urgent = {
                let mut marks = self.marks.lock();
                if self.shutdown.load(Ordering::Acquire) {
                    return;
                }
                let has_urgent = |m: &HashMap<NodeId, Marks>| {
                    m.values().any(|q| q.marks.iter().any(|&(_, _, u)| u))
                };
                if !has_urgent(&marks) {
                    self.marks_cv
                        .wait_for(&mut marks, self.config.poll_interval);
                }
                if self.shutdown.load(Ordering::Acquire) {
                    return;
                }
                marks
                    .values()
                    .flat_map(|q| q.marks.iter().filter(|m| m.2).map(|m| m.1))
                    .max()
            };
            if let Some(log_seq) = urgent {
                if let Err(e) = self.engine.wait_durable(log_seq, self.config.durable_wait) {
                    tracing::warn!(error = %e, "log engine did not make replicated writes durable");
                    // Do not spin on a failed engine.
                    std::thread::sleep(self.config.poll_interval);
                }
            }
            let durable_log = self.engine.durable_seq();
            let mut acks = Vec::new();
            {
                let mut marks = self.marks.lock();
                for (&master, q) in marks.iter_mut() {
                    let mut advanced = false;
                    while let Some(&(stream_seq, log_seq, _)) = q.marks.front() {
                        if log_seq > durable_log {
                            break;
                        }
                        q.marks.pop_front();
                        if stream_seq > q.durable {
                            q.durable = stream_seq;
                            advanced = true;
                        }
                    }
                    if advanced {
                        acks.push((
                            master,
                            Ack {
                                stream: q.stream,
                                applied_seq: q.applied.max(q.durable),
                                durable_seq: q.durable,
                                status: AckStatus::Ok,
                            },
                        ));
                    }
                }
            }
            for (master, ack) in acks {
                self.send_ack(master, &ack);
            }
        }
    }
}
