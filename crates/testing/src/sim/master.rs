//! The master side of a simulated peer's replication: the production [`Replicator`],
//! driven from the event loop's thread ([`Replicator::driven`]).
//!
//! Job: [`SimMaster`] gives a driven replicator its environment and hands what it does
//! back to the event loop: the production [`ManualIo`] set to simulated time (the
//! replicator's timers, deadlines and resends run on it), whose send paths' messages go
//! onto the simulated network and whose background tasks are polled here; the zone
//! registrations it asks for ([`SimRegistry`]: the event loop commits them to the
//! superpeers and answers); the alive peers as backup candidates; and the answers of
//! writes whose acknowledgements it waited for ([`Finished`]). The master's logic itself (zones, placement, positions, streams,
//! batching, acknowledgements, resends, waits, replacements, copies, adoptions) is all
//! production code.
//!
//! Invariants: nothing here blocks or runs a thread; every collection is drained in a
//! fixed order (streams in the order they were opened, registrations and answers in the
//! order they were made), so a run replays from its seed.
//!
//! Callers: the event loop ([`super::world`]) through [`super::peer::SimPeer`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use myriad_node::replication::MemorySource;
use myriad_placement::Candidate;
use myriad_proto::chunk::ChunkReply;
use myriad_replication::{
    AckCallback, AsyncChange, BackupCandidates, Durability, ManualIo, MasterIo, RegisterFuture,
    RegistryError, ReplicaError, ReplicaEvent, Replicator, ReplicatorConfig, ZoneRegistry,
};
use myriad_types::{ChunkId, NodeId};

use super::net::Time;

/// Locks a mutex of the simulator (a panic elsewhere leaves usable data).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A registration the replicator asked for, answered by the event loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// `owner`'s zone `zone` has these backups (`ZoneSet`, or `ZoneAdopt` for a zone
    /// of another owner).
    Register {
        /// The zone's log owner.
        owner: NodeId,
        /// Its number within the owner.
        zone: u32,
        /// Its backups, in order.
        backups: Vec<NodeId>,
    },
    /// `backup` holds the whole zone now (`ZoneFilled`).
    Filled {
        /// The zone's log owner.
        owner: NodeId,
        /// Its number.
        zone: u32,
        /// The backup.
        backup: NodeId,
    },
}

/// Where the answer to a registration goes.
type Slot = Arc<Mutex<Option<Result<(), RegistryError>>>>;

/// A registration waiting for its answer ([`SimMaster::take_asked`]).
pub struct Pending(Slot);

impl Pending {
    /// Answers the registration (its future resolves at the next [`SimMaster::run_tasks`]).
    pub fn answer(self, result: Result<(), RegistryError>) {
        *lock(&self.0) = Some(result);
    }
}

/// A future that resolves once its slot is filled.
struct Answer(Slot);

impl Future for Answer {
    type Output = Result<(), RegistryError>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        match lock(&self.0).take() {
            Some(result) => Poll::Ready(result),
            None => Poll::Pending,
        }
    }
}

/// The replicator's zone registry in the simulation: it records what is asked; the
/// event loop commits it and answers ([`SimMaster::take_asked`]).
#[derive(Default)]
pub struct SimRegistry {
    asked: Mutex<Vec<(Asked, Slot)>>,
}

impl SimRegistry {
    fn ask(&self, asked: Asked) -> RegisterFuture {
        let slot: Slot = Arc::new(Mutex::new(None));
        lock(&self.asked).push((asked, Arc::clone(&slot)));
        Box::pin(Answer(slot))
    }
}

impl ZoneRegistry for SimRegistry {
    fn register(&self, owner: NodeId, zone: u32, backups: Vec<NodeId>) -> RegisterFuture {
        self.ask(Asked::Register {
            owner,
            zone,
            backups,
        })
    }

    fn filled(&self, owner: NodeId, zone: u32, backup: NodeId) -> RegisterFuture {
        self.ask(Asked::Filled {
            owner,
            zone,
            backup,
        })
    }
}

/// The alive peers as the event loop last saw them.
#[derive(Default)]
pub struct SimCandidates(Mutex<Vec<Candidate>>);

impl BackupCandidates for SimCandidates {
    fn candidates(&self) -> Vec<Candidate> {
        lock(&self.0).clone()
    }
}

/// A write whose wait for its zone's registration and its backups' acknowledgements
/// ended (production: the reply goes out from the replicator's callback).
#[derive(Debug)]
pub struct Finished {
    /// The client.
    pub client: NodeId,
    /// The client's operation.
    pub op: u64,
    /// The reply to send once the wait ended well.
    pub reply: ChunkReply,
    /// How the wait ended.
    pub result: Result<(), ReplicaError>,
}

/// A peer incarnation's master side (see the module doc).
pub struct SimMaster {
    replicator: Replicator,
    io: Arc<ManualIo>,
    registry: Arc<SimRegistry>,
    candidates: Arc<SimCandidates>,
    finished: Arc<Mutex<Vec<Finished>>>,
    /// Writes waiting for their callback.
    waiting: Arc<AtomicUsize>,
    events: Vec<ReplicaEvent>,
}

/// The replicator's settings in the simulation: R backups, timers on the simulation's
/// scale (µs to a few ms), small messages (more of them, more interleavings), no
/// unreachable reports (the simulated failure detector decides failures).
pub fn replicator_config(
    node: NodeId,
    backups: usize,
    first_zone: u32,
    seed: u64,
    bug_no_copy_reset: bool,
) -> ReplicatorConfig {
    ReplicatorConfig {
        replication: backups,
        zone_bytes: 64 << 10,
        ack_timeout: Duration::from_millis(1),
        wait_timeout: Duration::from_millis(60),
        unreachable_timeout: Duration::from_secs(3600),
        message_bytes_target: 256,
        stream_bytes_max: 1 << 20,
        resync_slice_bytes: 512,
        placement_seed: seed,
        first_zone,
        bug_no_copy_reset,
        ..ReplicatorConfig::new(node)
    }
}

impl SimMaster {
    /// A master for `config.node` (incarnation `incarnation`) reading its chunks from
    /// `source`, at simulated time `now`.
    pub fn new(
        config: ReplicatorConfig,
        incarnation: u32,
        source: MemorySource,
        now: Time,
    ) -> Result<SimMaster, ReplicaError> {
        let io = Arc::new(ManualIo::new((u64::from(incarnation) + 1) << 32));
        io.set_now(Duration::from_micros(now));
        let registry = Arc::new(SimRegistry::default());
        let candidates = Arc::new(SimCandidates::default());
        let replicator = Replicator::driven(
            config,
            Arc::clone(&io) as Arc<dyn MasterIo>,
            Arc::clone(&candidates) as Arc<dyn BackupCandidates>,
            Arc::clone(&registry) as Arc<dyn ZoneRegistry>,
            Arc::new(source),
        )?;
        Ok(SimMaster {
            replicator,
            io,
            registry,
            candidates,
            finished: Arc::new(Mutex::new(Vec::new())),
            waiting: Arc::new(AtomicUsize::new(0)),
            events: Vec::new(),
        })
    }

    /// The replicator, its clock set to `now` and its candidates to `candidates`.
    pub fn at(&self, now: Time, candidates: Vec<Candidate>) -> &Replicator {
        self.io.set_now(Duration::from_micros(now));
        *lock(&self.candidates.0) = candidates;
        &self.replicator
    }

    /// The replicator as it stands (for reading its state).
    pub fn replicator(&self) -> &Replicator {
        &self.replicator
    }

    /// Reports `changes` of a client's request `op` with `durability`
    /// ([`Replicator::on_changes_queued`]); the answer comes as a [`Finished`]. An
    /// error before anything was queued is returned.
    pub fn report(
        &self,
        changes: &[(ChunkId, Option<Bytes>)],
        create: bool,
        durability: Durability,
        (client, op, reply): (NodeId, u64, ChunkReply),
    ) -> Result<(), ReplicaError> {
        let list: Vec<AsyncChange<'_>> = changes
            .iter()
            .map(|(cid, data)| match data {
                Some(data) if create => AsyncChange::Create(*cid, data),
                Some(data) => AsyncChange::Put(*cid, data),
                None => AsyncChange::Remove(*cid, 8),
            })
            .collect();
        let finished = Arc::clone(&self.finished);
        let waiting = Arc::clone(&self.waiting);
        waiting.fetch_add(1, Ordering::AcqRel);
        let done: AckCallback = Box::new(move |result| {
            waiting.fetch_sub(1, Ordering::AcqRel);
            lock(&finished).push(Finished {
                client,
                op,
                reply,
                result,
            });
        });
        self.replicator
            .on_changes_queued(&list, durability, done)
            .map_err(|(error, _)| {
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                error
            })
    }

    /// Reports changes nobody waits for (a migration's removal of the old copy).
    pub fn report_quietly(&self, changes: &[(ChunkId, Option<Bytes>)]) {
        let list: Vec<AsyncChange<'_>> = changes
            .iter()
            .map(|(cid, data)| match data {
                Some(data) => AsyncChange::Put(*cid, data),
                None => AsyncChange::Remove(*cid, 8),
            })
            .collect();
        let _ = self
            .replicator
            .on_changes_queued(&list, Durability::Async, Box::new(|_| {}));
    }

    /// The registrations asked for since the last call, each with where its answer goes.
    pub fn take_asked(&self) -> Vec<(Asked, Pending)> {
        std::mem::take(&mut *lock(&self.registry.asked))
            .into_iter()
            .map(|(asked, slot)| (asked, Pending(slot)))
            .collect()
    }

    /// Runs the background tasks as far as they go; whether one finished.
    pub fn run_tasks(&self) -> bool {
        self.io.run_tasks()
    }

    /// The replication messages to send now, per backup in order.
    pub fn sent(&self) -> Vec<(NodeId, Bytes)> {
        self.io.sent()
    }

    /// The writes whose wait ended since the last call.
    pub fn take_finished(&self) -> Vec<Finished> {
        std::mem::take(&mut *lock(&self.finished))
    }

    /// The replicator's events since the last call.
    pub fn take_events(&mut self) -> Vec<ReplicaEvent> {
        let receiver = self.replicator.events();
        while let Ok(event) = receiver.try_recv() {
            self.events.push(event);
        }
        std::mem::take(&mut self.events)
    }

    /// Whether nothing is left to do: every stream to a backup of a zone acknowledged
    /// to its end, no write waiting, no copy running or waiting.
    pub fn settled(&self) -> bool {
        let stats = self.replicator.stats();
        let backing: Vec<NodeId> = stats
            .zones
            .iter()
            .flat_map(|z| z.backups.iter().copied())
            .collect();
        self.waiting.load(Ordering::Acquire) == 0
            && !self.replicator.copies_waiting()
            && stats.zones.iter().all(|z| z.resyncs == 0)
            && stats
                .streams
                .iter()
                .all(|s| !backing.contains(&s.backup) || s.unacknowledged_ops == 0)
    }

    /// A short description for a failure: zones and streams.
    pub fn describe(&self) -> String {
        let stats = self.replicator.stats();
        let zones: Vec<String> = stats
            .zones
            .iter()
            .map(|z| {
                format!(
                    "{}{:?} -> {:?} (copies {}, registered {})",
                    z.zone, z.adopted_from, z.backups, z.resyncs, z.registered
                )
            })
            .collect();
        let streams: Vec<String> = stats
            .streams
            .iter()
            .map(|s| {
                format!(
                    "{}: assigned {} applied {} durable {}",
                    s.backup, s.assigned_seq, s.applied_seq, s.durable_seq
                )
            })
            .collect();
        format!(
            "zones {zones:?} streams {streams:?} waiting {} copies waiting {}",
            self.waiting.load(Ordering::Acquire),
            self.replicator.copies_waiting()
        )
    }
}
