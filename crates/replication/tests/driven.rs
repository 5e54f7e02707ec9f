//! A replicator driven from the test's thread ([`Replicator::driven`]), as the cluster
//! simulator drives it: real backup services on in-memory log engines, messages and
//! acknowledgements carried by the test, registrations answered by the test, time moved
//! by the test. Covers the driven entry points (queued changes with their registration
//! and acknowledgement waits, ticks and resends, copies step by step) and two fixes the
//! simulator found (an adopted zone's restarted owner chosen as its backup; adopted CIDs
//! that stay in another zone here).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use myriad_backup_log::{LogConfig, LogEngine, MemStorage};
use myriad_replication::wire::{LogMessage, Op};
use myriad_replication::{
    AckCallback, AsyncChange, BackupCandidates, BackupConfig, BackupService, Candidate,
    ChunkSource, CopyStep, Durability, ManualIo, MasterIo, RegisterFuture, RegistryError,
    ReplicaError, ReplicaEvent, Replicator, ReplicatorConfig, Restored, ZoneRegistry,
};
use myriad_types::{ChunkId, NodeId};

const MASTER: NodeId = NodeId(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

type Slot = Arc<Mutex<Option<Result<(), RegistryError>>>>;

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

/// A registration asked for: `(owner, zone, backups)` (`None` backups: a `filled`).
type Asked = (NodeId, u32, Option<Vec<NodeId>>);

#[derive(Default)]
struct TestRegistry {
    asked: Mutex<Vec<(Asked, Slot)>>,
}

impl ZoneRegistry for TestRegistry {
    fn register(&self, owner: NodeId, zone: u32, backups: Vec<NodeId>) -> RegisterFuture {
        let slot: Slot = Arc::new(Mutex::new(None));
        lock(&self.asked).push(((owner, zone, Some(backups)), Arc::clone(&slot)));
        Box::pin(Answer(slot))
    }
    fn filled(&self, owner: NodeId, zone: u32, _backup: NodeId) -> RegisterFuture {
        let slot: Slot = Arc::new(Mutex::new(None));
        lock(&self.asked).push(((owner, zone, None), Arc::clone(&slot)));
        Box::pin(Answer(slot))
    }
}

struct TestCandidates(Mutex<Vec<NodeId>>);

impl BackupCandidates for TestCandidates {
    fn candidates(&self) -> Vec<Candidate> {
        lock(&self.0)
            .iter()
            .map(|&node| Candidate {
                node,
                rack: 0,
                switch: 0,
            })
            .collect()
    }
}

/// The master's memory.
#[derive(Default)]
struct Memory(Mutex<BTreeMap<u64, Vec<u8>>>);

impl ChunkSource for Memory {
    fn for_each_in_range(
        &self,
        first: ChunkId,
        last: ChunkId,
        visit: &mut dyn FnMut(ChunkId, &[u8]) -> bool,
    ) -> Vec<ChunkId> {
        let chunks: Vec<(u64, Vec<u8>)> = lock(&self.0)
            .range(first.raw()..=last.raw())
            .map(|(&cid, data)| (cid, data.clone()))
            .collect();
        for (cid, data) in chunks {
            if !visit(ChunkId::from_raw(cid), &data) {
                break;
            }
        }
        Vec::new()
    }
}

struct Rig {
    replicator: Replicator,
    io: Arc<ManualIo>,
    registry: Arc<TestRegistry>,
    candidates: Arc<TestCandidates>,
    memory: Arc<Memory>,
    backups: BTreeMap<NodeId, BackupService>,
}

fn rig(replication: usize, peers: &[u16]) -> Rig {
    let io = Arc::new(ManualIo::new(1 << 32));
    let registry = Arc::new(TestRegistry::default());
    let candidates = Arc::new(TestCandidates(Mutex::new(
        peers.iter().map(|&p| NodeId(p)).collect(),
    )));
    let memory = Arc::new(Memory::default());
    let config = ReplicatorConfig {
        replication,
        ack_timeout: Duration::from_millis(20),
        wait_timeout: Duration::from_secs(5),
        message_bytes_target: 200,
        resync_slice_bytes: 300,
        ..ReplicatorConfig::new(MASTER)
    };
    let replicator = Replicator::driven(
        config,
        Arc::clone(&io) as Arc<dyn MasterIo>,
        Arc::clone(&candidates) as Arc<dyn BackupCandidates>,
        Arc::clone(&registry) as Arc<dyn ZoneRegistry>,
        Arc::clone(&memory) as Arc<dyn ChunkSource>,
    )
    .expect("driven replicator");
    let backups = peers
        .iter()
        .map(|&p| {
            let engine = LogEngine::open(LogConfig::small_for_tests(), Arc::new(MemStorage::new()))
                .expect("engine");
            let service =
                BackupService::new(Arc::new(engine), BackupConfig::default()).expect("service");
            (NodeId(p), service)
        })
        .collect();
    Rig {
        replicator,
        io,
        registry,
        candidates,
        memory,
        backups,
    }
}

impl Rig {
    /// Answers every registration asked for so far with `Ok` and runs the tasks.
    fn answer_registrations(&self) -> Vec<Asked> {
        let asked = std::mem::take(&mut *lock(&self.registry.asked));
        let mut seen = Vec::new();
        for (what, slot) in asked {
            *lock(&slot) = Some(Ok(()));
            seen.push(what);
        }
        self.run_tasks();
        seen
    }

    fn run_tasks(&self) {
        self.io.run_tasks();
    }

    /// The messages handed to the streams since the last call.
    fn sent(&self) -> Vec<(NodeId, Bytes)> {
        self.io.sent()
    }

    /// Delivers `messages` to their backups and their acknowledgements back (a message
    /// that asks for durability is flushed first, as the backup's durability thread would).
    fn deliver(&self, messages: Vec<(NodeId, Bytes)>) {
        for (backup, body) in messages {
            let service = &self.backups[&backup];
            let durable = LogMessage::decode(body.clone())
                .expect("message")
                .durable_requested;
            let Some(mut ack) = service.apply(MASTER, body) else {
                continue;
            };
            if durable {
                service.engine().flush().expect("flush");
                ack.durable_seq = ack.applied_seq;
            }
            self.replicator.on_ack_message(backup, ack.encode());
        }
    }

    /// Delivers everything until nothing is sent any more.
    fn settle(&self) {
        for _ in 0..100 {
            self.run_tasks();
            if self.replicator.take_sender_wakeup() {
                self.replicator.tick(&[]);
            }
            let messages = self.sent();
            if messages.is_empty() {
                return;
            }
            self.deliver(messages);
        }
        panic!("messages kept coming");
    }

    fn advance(&self, ms: u64) {
        self.io.advance(Duration::from_millis(ms));
    }

    fn read(&self, backup: u16, owner: NodeId, zone: u32) -> BTreeMap<u64, Vec<u8>> {
        let chunks = Mutex::new(BTreeMap::new());
        self.backups[&NodeId(backup)]
            .recover_zone(owner, zone, &|batch| {
                let mut chunks = lock(&chunks);
                for chunk in batch {
                    chunks.insert(chunk.cid, chunk.payload.to_vec());
                }
            })
            .expect("recover zone");
        chunks
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The callback of a queued change, recording its outcome.
type Outcome = Arc<Mutex<Option<Result<(), ReplicaError>>>>;

fn recorder() -> (AckCallback, Outcome) {
    let outcome = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&outcome);
    (Box::new(move |result| *lock(&slot) = Some(result)), outcome)
}

fn cid(creator: u16, local: u64) -> ChunkId {
    ChunkId::new(NodeId(creator), local).expect("cid")
}

#[test]
fn queued_changes_wait_for_their_registration_and_acknowledgements() {
    let rig = rig(2, &[2, 3]);
    let mut data = Vec::new();
    for local in 1..=12u64 {
        let payload = vec![local as u8; 24];
        lock(&rig.memory.0).insert(cid(1, local).raw(), payload.clone());
        data.push((cid(1, local), payload));
    }
    let changes: Vec<AsyncChange<'_>> = data
        .iter()
        .map(|(cid, payload)| AsyncChange::Create(*cid, payload))
        .collect();
    let (done, outcome) = recorder();
    assert!(rig
        .replicator
        .on_changes_queued(&changes, Durability::Replicated, done)
        .is_ok());
    // The new zone's registration and the backups' acknowledgements are both missing.
    rig.deliver(rig.sent());
    assert!(lock(&outcome).is_none(), "answered before the registration");
    let asked = rig.answer_registrations();
    assert_eq!(asked.len(), 1);
    let (owner, zone, backups) = &asked[0];
    assert_eq!((*owner, *zone), (MASTER, 0));
    let mut backups = backups.clone().expect("a registration");
    backups.sort();
    assert_eq!(backups, vec![NodeId(2), NodeId(3)]);
    rig.settle();
    assert_eq!(*lock(&outcome), Some(Ok(())));
    for backup in [2, 3] {
        let held = rig.read(backup, MASTER, 0);
        assert_eq!(held.len(), 12, "backup {backup}");
        for (cid, payload) in &data {
            assert_eq!(held.get(&cid.raw()), Some(payload));
        }
    }
    // Blocking calls refuse on a driven replicator (nothing would end their wait).
    assert_eq!(
        rig.replicator
            .on_put(cid(1, 1), b"x", Some(Durability::Replicated)),
        Err(ReplicaError::WouldWait)
    );
}

#[test]
fn a_lost_message_is_resent_after_the_ack_timeout_by_a_tick() {
    let rig = rig(1, &[2]);
    lock(&rig.memory.0).insert(cid(1, 1).raw(), vec![1; 8]);
    let (done, outcome) = recorder();
    rig.replicator
        .on_changes_queued(
            &[AsyncChange::Create(cid(1, 1), &[1; 8])],
            Durability::Durable,
            done,
        )
        .map_err(|(e, _)| e)
        .expect("queued");
    rig.answer_registrations();
    let lost = rig.sent();
    assert!(!lost.is_empty());
    // Dropped. A tick before the timeout resends nothing; one after it does.
    rig.advance(5);
    rig.replicator.tick(&[]);
    assert!(rig.sent().is_empty(), "resent before the ack timeout");
    rig.advance(30);
    rig.replicator.tick(&[]);
    let resent = rig.sent();
    assert_eq!(resent.len(), lost.len());
    rig.deliver(resent);
    assert_eq!(*lock(&outcome), Some(Ok(())));
    // A deferred wait past its deadline ends with a timeout at the next tick.
    let (done, outcome) = recorder();
    rig.replicator
        .on_changes_queued(
            &[AsyncChange::Put(cid(1, 1), &[2; 8])],
            Durability::Replicated,
            done,
        )
        .map_err(|(e, _)| e)
        .expect("queued");
    let _ = rig.sent();
    rig.advance(6_000);
    rig.replicator.tick(&[]);
    assert!(matches!(
        *lock(&outcome),
        Some(Err(ReplicaError::Timeout { .. }))
    ));
}

#[test]
fn a_replacement_backup_is_copied_step_by_step_and_recorded_filled() {
    let rig = rig(2, &[2, 3, 4]);
    let mut changes = Vec::new();
    for local in 1..=20u64 {
        lock(&rig.memory.0).insert(cid(1, local).raw(), vec![local as u8; 40]);
        changes.push(cid(1, local));
    }
    let memory = lock(&rig.memory.0).clone();
    let list: Vec<AsyncChange<'_>> = changes
        .iter()
        .map(|c| AsyncChange::Create(*c, &memory[&c.raw()]))
        .collect();
    let (done, outcome) = recorder();
    rig.replicator
        .on_changes_queued(&list, Durability::Replicated, done)
        .map_err(|(e, _)| e)
        .expect("queued");
    rig.answer_registrations();
    rig.settle();
    assert_eq!(*lock(&outcome), Some(Ok(())));
    let before = rig.replicator.backups_of(0).expect("zone 0");
    let gone = before[0];
    *lock(&rig.candidates.0) = vec![NodeId(2), NodeId(3), NodeId(4)]
        .into_iter()
        .filter(|&n| n != gone)
        .collect();
    let changed = rig.replicator.replace_backup(gone);
    assert_eq!(changed.len(), 1);
    let added = changed[0].added[0];
    assert!(!before.contains(&added));
    rig.answer_registrations();
    // A change made during the copy is not overtaken by the copy's older read.
    lock(&rig.memory.0).insert(cid(1, 5).raw(), vec![99; 40]);
    let mut slices = 0;
    loop {
        match rig.replicator.copy_step() {
            CopyStep::Slice { .. } => {
                slices += 1;
                if slices == 1 {
                    let (done, _) = recorder();
                    rig.replicator
                        .on_changes_queued(
                            &[AsyncChange::Put(cid(1, 5), &[99; 40])],
                            Durability::Async,
                            done,
                        )
                        .map_err(|(e, _)| e)
                        .expect("queued");
                }
                rig.settle();
            }
            CopyStep::Queued { chunks, .. } => {
                assert!(chunks > 0);
                break;
            }
            other => panic!("unexpected step {other:?}"),
        }
    }
    assert!(slices > 1, "the copy went in one slice");
    rig.settle();
    let events: Vec<ReplicaEvent> = rig.replicator.events().try_iter().collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ReplicaEvent::ResyncDone { backup, .. } if *backup == added)),
        "{events:?}"
    );
    let filled = rig.answer_registrations();
    assert_eq!(filled, vec![(MASTER, 0, None)]);
    let held = rig.read(added.0, MASTER, 0);
    assert_eq!(held, lock(&rig.memory.0).clone());
    assert!(!rig.replicator.copies_waiting());
}

#[test]
fn an_adopted_zones_restarted_owner_never_becomes_its_backup() {
    // Peer 2 failed; this master (1) restored and adopted 2's zone 0 with 3 and 4; 2 came
    // back. When 4 fails, 2 is the only other candidate: it must not back its own zone.
    let rig = rig(2, &[3, 4]);
    let plan = rig
        .replicator
        .plan_adoption(NodeId(2), 0, &[NodeId(3), NodeId(4)])
        .expect("plan");
    assert_eq!(plan.backups, vec![NodeId(3), NodeId(4)]);
    lock(&rig.memory.0).insert(cid(2, 1).raw(), vec![7; 8]);
    let adoption = rig.replicator.adopt_registered(
        plan,
        &[(cid(2, 1), cid(2, 1))],
        Restored {
            chunks: 1,
            bytes: 8,
            position: 0,
        },
    );
    *lock(&rig.candidates.0) = vec![NodeId(2), NodeId(3)];
    let changed = rig.replicator.replace_backup(NodeId(4));
    assert_eq!(
        rig.replicator.backups_of(adoption.zone),
        Some(vec![NodeId(3)])
    );
    assert!(changed.iter().all(|c| !c.backups.contains(&NodeId(2))));
}

#[test]
fn adopted_chunks_that_stay_in_another_zone_move_there_on_the_backups() {
    // This master's own zone 0 holds 1:1 until it migrated away (removed here); the
    // failed peer 2's zone, adopted now, brings it back. 1:1 stays in zone 0 (its range
    // is there): zone 0's backups get it again, the adopted zone's drop it.
    let rig = rig(1, &[3]);
    lock(&rig.memory.0).insert(cid(1, 1).raw(), vec![1; 8]);
    let (done, _) = recorder();
    rig.replicator
        .on_changes_queued(
            &[AsyncChange::Create(cid(1, 1), &[1; 8])],
            Durability::Async,
            done,
        )
        .map_err(|(e, _)| e)
        .expect("queued");
    rig.answer_registrations();
    let (done, _) = recorder();
    rig.replicator
        .on_changes_queued(
            &[AsyncChange::Remove(cid(1, 1), 8)],
            Durability::Async,
            done,
        )
        .map_err(|(e, _)| e)
        .expect("queued");
    rig.settle();
    let held = rig.read(3, MASTER, 0);
    assert!(held.is_empty(), "{held:?}");
    // Restored: 1:1 (value 5) and 2:1.
    lock(&rig.memory.0).insert(cid(1, 1).raw(), vec![5; 8]);
    lock(&rig.memory.0).insert(cid(2, 1).raw(), vec![6; 8]);
    let plan = rig
        .replicator
        .plan_adoption(NodeId(2), 0, &[NodeId(3)])
        .expect("plan");
    let sent_before = rig.sent();
    assert!(sent_before.is_empty());
    let adoption = rig.replicator.adopt_registered(
        plan,
        &[(cid(1, 1), cid(1, 1)), (cid(2, 1), cid(2, 1))],
        Restored {
            chunks: 2,
            bytes: 16,
            position: 0,
        },
    );
    let ops: Vec<Op> = rig
        .sent()
        .into_iter()
        .flat_map(|(_, body)| LogMessage::decode(body).expect("message").ops)
        .collect();
    assert!(
        ops.iter().any(
            |op| matches!(op, Op::Put { owner: None, zone: 0, cid, .. } if *cid == cid_raw(1, 1))
        ),
        "{ops:?}"
    );
    assert!(ops.iter().any(|op| matches!(op, Op::Remove { owner: Some(NodeId(2)), zone: 0, cid, .. } if *cid == cid_raw(1, 1))), "{ops:?}");
    assert_eq!(rig.replicator.zone_of(cid(1, 1)), Some(0));
    assert_eq!(rig.replicator.zone_of(cid(2, 1)), Some(adoption.zone));
}

fn cid_raw(creator: u16, local: u64) -> u64 {
    cid(creator, local).raw()
}
