//! End-to-end replication over real loopback endpoints: one master, several backups, log
//! engines on `MemStorage`, and a model of the master's memory to compare every backup's
//! zones against.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use myriad_backup_log::{LogConfig, LogEngine, MemStorage};
use myriad_net::{Config, Endpoint, Fault, Handlers};
use myriad_replication::backup::log_zone;
use myriad_replication::{
    BackupCandidates, BackupConfig, BackupService, Candidate, ChunkId, ChunkSource, Durability,
    NodeId, RegisterFuture, RegistryError, ReplicaError, ReplicaEvent, Replicator,
    ReplicatorConfig, Restored, ZoneRegistry,
};
use parking_lot::Mutex;

const SECRET: &str = "replica-test";
const MASTER: NodeId = NodeId(1);

/// The master's memory: CID → payload. Also the re-replication source; a read can be
/// made slow (the copy is taken first, then handed out after the delay), so changes land
/// between a read and its delivery.
#[derive(Default)]
struct Memory(
    Mutex<BTreeMap<u64, Vec<u8>>>,
    AtomicU64,
    /// Chunks that read as locked: how many more reads find them busy.
    Mutex<BTreeMap<u64, u32>>,
);

impl ChunkSource for Memory {
    fn for_each_in_range(
        &self,
        first: ChunkId,
        last: ChunkId,
        visit: &mut dyn FnMut(ChunkId, &[u8]) -> bool,
    ) -> Vec<ChunkId> {
        let chunks: Vec<(u64, Vec<u8>)> = self
            .0
            .lock()
            .range(first.raw()..=last.raw())
            .map(|(&cid, data)| (cid, data.clone()))
            .collect();
        std::thread::sleep(Duration::from_millis(self.1.load(Ordering::Acquire)));
        let mut busy = Vec::new();
        for (cid, data) in chunks {
            // A "locked" chunk: reported busy until its lock count runs out.
            if self.2.lock().get_mut(&cid).is_some_and(|left| {
                *left = left.saturating_sub(1);
                *left > 0
            }) {
                busy.push(ChunkId::from_raw(cid));
                continue;
            }
            if !visit(ChunkId::from_raw(cid), &data) {
                break;
            }
        }
        busy
    }
}

#[derive(Default)]
struct Peers(Mutex<Vec<Candidate>>);

impl BackupCandidates for Peers {
    fn candidates(&self) -> Vec<Candidate> {
        self.0.lock().clone()
    }
}

/// Completes after `delay` (woken by a helper thread), so registrations take a while.
struct Delay {
    until: Instant,
    started: bool,
}

impl Future for Delay {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let now = Instant::now();
        if now >= self.until {
            return Poll::Ready(());
        }
        if !self.started {
            self.started = true;
            let waker = cx.waker().clone();
            let wait = self.until - now;
            std::thread::spawn(move || {
                std::thread::sleep(wait);
                waker.wake();
            });
        }
        Poll::Pending
    }
}

/// Records every registration; completed ones land in `done` after a delay.
#[derive(Default)]
struct Registry {
    calls: Mutex<Vec<(NodeId, u32, Vec<NodeId>)>>,
    done: Arc<Mutex<BTreeMap<u32, Vec<NodeId>>>>,
    fail: Arc<AtomicBool>,
    delay_ms: u64,
    /// `(owner, zone, backup)` of every completed copy recorded.
    filled: Arc<Mutex<Vec<(NodeId, u32, NodeId)>>>,
}

impl ZoneRegistry for Registry {
    fn register(&self, owner: NodeId, zone: u32, backups: Vec<NodeId>) -> RegisterFuture {
        self.calls.lock().push((owner, zone, backups.clone()));
        let done = self.done.clone();
        let fail = self.fail.clone();
        let delay = Delay {
            until: Instant::now() + Duration::from_millis(self.delay_ms),
            started: false,
        };
        Box::pin(async move {
            delay.await;
            if fail.load(Ordering::Acquire) {
                return Err(RegistryError("superpeers said no".into()));
            }
            done.lock().insert(zone, backups);
            Ok(())
        })
    }

    fn filled(&self, owner: NodeId, zone: u32, backup: NodeId) -> RegisterFuture {
        self.filled.lock().push((owner, zone, backup));
        Box::pin(std::future::ready(Ok(())))
    }
}

struct Backup {
    node: NodeId,
    storage: MemStorage,
    service: BackupService,
    endpoint: Endpoint,
}

struct Cluster {
    memory: Arc<Memory>,
    peers: Arc<Peers>,
    registry: Arc<Registry>,
    replicator: Replicator,
    master: Endpoint,
    backups: Vec<Backup>,
}

fn log_config() -> LogConfig {
    LogConfig {
        secondary_log_bytes: 64 * 16384,
        wait_timeout: Duration::from_secs(5),
        ..LogConfig::small_for_tests()
    }
}

fn start_backup(node: NodeId) -> Backup {
    let storage = MemStorage::new();
    let engine = Arc::new(
        LogEngine::open(log_config(), Arc::new(storage.clone())).expect("open log engine"),
    );
    let service = BackupService::new(engine, BackupConfig::default()).expect("backup service");
    let mut handlers = Handlers::new();
    service.register(&mut handlers).expect("register");
    let endpoint = Endpoint::start(
        Config::new(node, "127.0.0.1:0".parse().unwrap(), SECRET),
        handlers,
    )
    .expect("backup endpoint");
    service.attach(endpoint.handle());
    Backup {
        node,
        storage,
        service,
        endpoint,
    }
}

impl Cluster {
    /// A master and `backups` backup peers; the first `candidates` of them are candidates.
    fn start(
        backups: usize,
        candidates: usize,
        registry: Registry,
        tune: impl FnOnce(&mut ReplicatorConfig),
    ) -> Cluster {
        let backups: Vec<Backup> = (0..backups)
            .map(|i| start_backup(NodeId(10 + i as u16)))
            .collect();
        let master = Endpoint::start(
            Config::new(MASTER, "127.0.0.1:0".parse().unwrap(), SECRET),
            Handlers::new(),
        )
        .expect("master endpoint");
        for backup in &backups {
            master
                .handle()
                .set_address(backup.node, backup.endpoint.handle().local_addr());
            backup
                .endpoint
                .handle()
                .set_address(MASTER, master.handle().local_addr());
        }
        let peers = Arc::new(Peers::default());
        *peers.0.lock() = backups
            .iter()
            .take(candidates)
            .map(|b| Candidate {
                node: b.node,
                rack: 0,
                switch: 0,
            })
            .collect();
        let memory = Arc::new(Memory::default());
        let registry = Arc::new(registry);
        let mut config = ReplicatorConfig::new(MASTER);
        config.wait_timeout = Duration::from_secs(5);
        config.ack_timeout = Duration::from_millis(100);
        tune(&mut config);
        let replicator = Replicator::new(
            config,
            master.handle(),
            peers.clone(),
            registry.clone(),
            memory.clone(),
        )
        .expect("replicator");
        Cluster {
            memory,
            peers,
            registry,
            replicator,
            master,
            backups,
        }
    }

    fn backup(&self, node: NodeId) -> &Backup {
        self.backups
            .iter()
            .find(|b| b.node == node)
            .expect("known backup")
    }

    fn create(
        &self,
        local: u64,
        data: Vec<u8>,
        durability: Durability,
    ) -> Result<(), ReplicaError> {
        let cid = ChunkId::new(MASTER, local).unwrap();
        self.memory.0.lock().insert(cid.raw(), data.clone());
        self.replicator.on_create(cid, &data, Some(durability))
    }

    fn put(&self, local: u64, data: Vec<u8>, durability: Durability) -> Result<(), ReplicaError> {
        let cid = ChunkId::new(MASTER, local).unwrap();
        self.memory.0.lock().insert(cid.raw(), data.clone());
        self.replicator.on_put(cid, &data, Some(durability))
    }

    fn remove(&self, local: u64, durability: Durability) -> Result<(), ReplicaError> {
        let cid = ChunkId::new(MASTER, local).unwrap();
        let size = self
            .memory
            .0
            .lock()
            .remove(&cid.raw())
            .map_or(0, |d| d.len() as u64);
        self.replicator.on_remove(cid, size, Some(durability))
    }

    /// Makes every backup node of the cluster a placement candidate (peers that joined).
    fn offer_every_backup(&self) {
        *self.peers.0.lock() = self
            .backups
            .iter()
            .map(|b| Candidate {
                node: b.node,
                rack: 0,
                switch: 0,
            })
            .collect();
    }

    /// The model's chunks of `zone`.
    fn model_zone(&self, zone: u32) -> BTreeMap<u64, Vec<u8>> {
        self.memory
            .0
            .lock()
            .iter()
            .filter(|(&cid, _)| self.replicator.zone_of(ChunkId::from_raw(cid)) == Some(zone))
            .map(|(&cid, data)| (cid, data.clone()))
            .collect()
    }

    /// Every zone on every one of its backups equals the model.
    fn check_backups_match_memory(&self) {
        let stats = self.replicator.stats();
        assert!(!stats.zones.is_empty());
        for zone in &stats.zones {
            let expected = self.model_zone(zone.zone);
            assert!(
                !zone.backups.is_empty(),
                "zone {} has no backups",
                zone.zone
            );
            for &node in &zone.backups {
                let got = read_zone(&self.backup(node).service, zone.zone);
                assert_eq!(
                    got.keys().collect::<Vec<_>>(),
                    expected.keys().collect::<Vec<_>>(),
                    "zone {} on backup {node}: CIDs differ",
                    zone.zone
                );
                assert!(
                    got == expected,
                    "zone {} on backup {node}: bytes differ",
                    zone.zone
                );
            }
        }
    }
}

fn read_zone(service: &BackupService, zone: u32) -> BTreeMap<u64, Vec<u8>> {
    let chunks = Mutex::new(BTreeMap::new());
    service
        .recover_zone(MASTER, zone, &|batch| {
            let mut chunks = chunks.lock();
            for chunk in batch {
                assert!(
                    chunks.insert(chunk.cid, chunk.payload.to_vec()).is_none(),
                    "chunk delivered twice"
                );
            }
        })
        .expect("recover zone");
    chunks.into_inner()
}

fn payload(local: u64, round: u8, bytes: usize) -> Vec<u8> {
    (0..bytes)
        .map(|i| (local as u8).wrapping_mul(31) ^ round ^ i as u8)
        .collect()
}

#[test]
fn writes_and_removes_reach_every_backup_in_all_durability_modes() {
    let cluster = Cluster::start(3, 3, Registry::default(), |_| {});
    let mut local = 0u64;
    for (round, durability) in [
        Durability::Async,
        Durability::Replicated,
        Durability::Durable,
    ]
    .into_iter()
    .enumerate()
    {
        let first = local;
        for _ in 0..60 {
            cluster
                .create(
                    local,
                    payload(local, 0, 20 + (local % 50) as usize),
                    durability,
                )
                .unwrap();
            local += 1;
        }
        for l in (first..local).step_by(2) {
            cluster
                .put(l, payload(l, round as u8 + 1, 40), durability)
                .unwrap();
        }
        for l in (first..local).step_by(5) {
            cluster.remove(l, durability).unwrap();
        }
        let batch: Vec<(ChunkId, Vec<u8>)> = (first + 1..first + 4)
            .map(|l| (ChunkId::new(MASTER, l).unwrap(), payload(l, 9, 33)))
            .collect();
        for (cid, data) in &batch {
            cluster.memory.0.lock().insert(cid.raw(), data.clone());
        }
        let refs: Vec<(ChunkId, &[u8])> = batch.iter().map(|(c, d)| (*c, &d[..])).collect();
        cluster
            .replicator
            .on_put_batch(&refs, Some(durability))
            .unwrap();
    }
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    let stats = cluster.replicator.stats();
    assert_eq!(stats.streams.len(), 3);
    for stream in &stats.streams {
        assert_eq!(stream.applied_seq, stream.assigned_seq);
        assert_eq!(stream.durable_seq, stream.assigned_seq);
        assert_eq!(stream.unacknowledged_messages, 0);
    }
    assert!(stats.zones.iter().all(|z| z.unacknowledged_ops == 0));
    cluster.check_backups_match_memory();
}

#[test]
fn zone_rollover_registers_each_zone_before_acknowledging_writes() {
    let registry = Registry {
        delay_ms: 30,
        ..Registry::default()
    };
    let cluster = Cluster::start(3, 3, registry, |config| {
        config.zone_bytes = 1000;
    });
    for local in 0..60u64 {
        cluster
            .create(local, payload(local, 0, 100), Durability::Async)
            .unwrap();
        let zone = cluster
            .replicator
            .zone_of(ChunkId::new(MASTER, local).unwrap())
            .unwrap();
        let done = cluster.registry.done.lock();
        assert_eq!(
            done.get(&zone),
            cluster.replicator.backups_of(zone).as_ref(),
            "write to zone {zone} acknowledged before its registration completed"
        );
    }
    let calls = cluster.registry.calls.lock().clone();
    let zones: BTreeSet<u32> = calls.iter().map(|c| c.1).collect();
    assert!(zones.len() >= 5, "expected several zones, got {zones:?}");
    assert_eq!(calls.len(), zones.len(), "each zone registered once");
    for (owner, _, backups) in &calls {
        assert_eq!(*owner, MASTER);
        assert_eq!(backups.len(), 3);
    }
    cluster.replicator.wait_all(Durability::Replicated).unwrap();
    cluster.check_backups_match_memory();
}

#[test]
fn failed_registration_fails_the_write_and_is_retried() {
    let registry = Registry::default();
    registry.fail.store(true, Ordering::Release);
    let cluster = Cluster::start(2, 2, registry, |config| config.replication = 2);
    let error = cluster
        .create(0, payload(0, 0, 10), Durability::Async)
        .unwrap_err();
    assert!(
        matches!(error, ReplicaError::Registration { zone: 0, .. }),
        "{error}"
    );
    cluster.registry.fail.store(false, Ordering::Release);
    cluster
        .create(1, payload(1, 0, 10), Durability::Replicated)
        .unwrap();
    assert!(cluster.registry.done.lock().contains_key(&0));
    assert_eq!(cluster.registry.calls.lock().len(), 2);
}

#[test]
fn dropped_connection_mid_stream_loses_and_duplicates_nothing() {
    let cluster = Cluster::start(3, 3, Registry::default(), |_| {});
    let handle = cluster.master.handle();
    let (b0, b1) = (cluster.backups[0].node, cluster.backups[1].node);
    let mut puts = 0u64;
    let mut removes = 0u64;
    for local in 0..300u64 {
        if local == 100 {
            handle.set_fault(b0, Fault::DropOutgoing);
        }
        if local == 150 {
            handle.disconnect(b1);
        }
        if local == 200 {
            handle.clear_fault(b0);
        }
        cluster
            .create(local, payload(local, 0, 30), Durability::Async)
            .unwrap();
        puts += 1;
        if local % 7 == 0 {
            cluster
                .put(local, payload(local, 1, 31), Durability::Async)
                .unwrap();
            puts += 1;
        }
        if local % 11 == 0 {
            cluster.remove(local, Durability::Async).unwrap();
            removes += 1;
        }
        if local % 50 == 0 {
            // Let the stream move so messages are in flight when the faults hit.
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    cluster.replicator.wait_all(Durability::Replicated).unwrap();
    let stats = cluster.replicator.stats();
    let resent = stats
        .streams
        .iter()
        .find(|s| s.backup == b0)
        .unwrap()
        .resends;
    assert!(resent > 0, "the dropped messages were never resent");
    for backup in &cluster.backups {
        let engine = backup.service.engine().stats();
        assert_eq!(
            engine.appended_entries, puts,
            "backup {}: writes lost or applied twice",
            backup.node
        );
        assert_eq!(engine.removes, removes, "backup {}: removes", backup.node);
    }
    cluster.check_backups_match_memory();
}

#[test]
fn backup_unreachable_past_timeout_is_reported() {
    let cluster = Cluster::start(1, 1, Registry::default(), |config| {
        config.replication = 1;
        config.unreachable_timeout = Duration::from_millis(400);
    });
    cluster
        .create(0, payload(0, 0, 8), Durability::Replicated)
        .unwrap();
    let backup = cluster.backups[0].node;
    cluster
        .master
        .handle()
        .set_fault(backup, Fault::DropOutgoing);
    cluster
        .create(1, payload(1, 0, 8), Durability::Async)
        .unwrap();
    let event = cluster
        .replicator
        .events()
        .recv_timeout(Duration::from_secs(5))
        .expect("an event");
    assert_eq!(event, ReplicaEvent::BackupUnreachable(backup));
    let stats = cluster.replicator.stats();
    assert_eq!(stats.zones[0].unacknowledged_ops, 1);
    assert_eq!(stats.streams[0].unacknowledged_ops, 1);
}

#[test]
fn replaced_backup_receives_the_zone_by_re_replication() {
    let cluster = Cluster::start(4, 3, Registry::default(), |config| {
        config.zone_bytes = 2000;
        config.resync_slice_bytes = 300;
    });
    for local in 0..80u64 {
        cluster
            .create(local, payload(local, 0, 60), Durability::Replicated)
            .unwrap();
    }
    let failed = cluster.backups[1].node;
    let spare = cluster.backups[3].node;
    cluster.peers.0.lock().push(Candidate {
        node: spare,
        rack: 0,
        switch: 0,
    });
    let changes = cluster.replicator.replace_backup(failed);
    assert!(!changes.is_empty());
    for change in &changes {
        assert_eq!(change.added, vec![spare]);
        assert!(!change.backups.contains(&failed));
        assert_eq!(change.backups.last(), Some(&spare));
    }
    // Writes during re-replication go to the new backup too.
    for local in (0..80u64).step_by(3) {
        cluster
            .put(local, payload(local, 5, 61), Durability::Async)
            .unwrap();
    }
    cluster.remove(4, Durability::Async).unwrap();
    let events = cluster.replicator.events();
    let mut done = BTreeSet::new();
    while done.len() < changes.len() {
        match events
            .recv_timeout(Duration::from_secs(10))
            .expect("resync event")
        {
            ReplicaEvent::ResyncDone { zone, backup, .. } => {
                assert_eq!(backup, spare);
                done.insert(zone);
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    // Registered with the new order, and the spare recorded as filled once its copy was
    // complete (before that the cluster counts it as holding part of the zone).
    for change in &changes {
        assert_eq!(
            cluster.registry.done.lock().get(&change.zone),
            Some(&change.backups)
        );
        assert!(
            cluster
                .registry
                .filled
                .lock()
                .contains(&(MASTER, change.zone, spare)),
            "{:?}",
            cluster.registry.filled.lock()
        );
    }
    cluster.check_backups_match_memory();
    assert!(cluster
        .replicator
        .stats()
        .streams
        .iter()
        .all(|s| s.backup != failed));
}

#[test]
fn durable_mode_never_acknowledges_a_failed_sync() {
    let cluster = Cluster::start(2, 2, Registry::default(), |config| {
        config.replication = 2;
        config.wait_timeout = Duration::from_millis(1500);
    });
    cluster
        .create(0, payload(0, 0, 16), Durability::Durable)
        .unwrap();
    let sick = &cluster.backups[1];
    sick.storage.set_fail_sync(true);
    let error = cluster
        .put(0, payload(0, 1, 16), Durability::Durable)
        .unwrap_err();
    match error {
        ReplicaError::Timeout { missing, .. } => assert_eq!(missing, vec![sick.node]),
        other => panic!("expected a timeout, got {other}"),
    }
    let (applied, durable) = sick.service.stream_position(MASTER).unwrap();
    assert_eq!(applied, 2);
    assert_eq!(
        durable, 1,
        "a write whose sync failed was acknowledged durable"
    );
    let healthy = cluster.backups[0].service.stream_position(MASTER).unwrap();
    assert_eq!(healthy, (2, 2));
}

#[test]
fn messages_from_a_fenced_master_are_never_applied() {
    let cluster = Cluster::start(1, 1, Registry::default(), |config| {
        config.replication = 1;
        config.wait_timeout = Duration::from_millis(800);
    });
    let backup = &cluster.backups[0];
    backup.endpoint.handle().fence(MASTER);
    cluster
        .create(0, payload(0, 0, 16), Durability::Async)
        .unwrap();
    let error = cluster
        .create(1, payload(1, 0, 16), Durability::Replicated)
        .unwrap_err();
    assert!(matches!(error, ReplicaError::Timeout { .. }), "{error}");
    assert!(backup.service.zone_ids().is_empty());
    assert_eq!(backup.service.engine().stats().appended_entries, 0);
    // Lifting the fence lets the resends through: the writes were held back, not lost.
    backup.endpoint.handle().unfence(MASTER);
    cluster.replicator.wait_all(Durability::Replicated).unwrap();
    assert_eq!(backup.service.zone_ids(), vec![(MASTER, 0)]);
    cluster.check_backups_match_memory();
}

#[test]
fn zero_replication_returns_at_once_and_sends_nothing() {
    let cluster = Cluster::start(1, 1, Registry::default(), |config| config.replication = 0);
    cluster
        .create(0, payload(0, 0, 16), Durability::Durable)
        .unwrap();
    cluster
        .put(0, payload(0, 1, 16), Durability::Durable)
        .unwrap();
    assert!(cluster.replicator.stats().streams.is_empty());
    assert!(cluster.registry.calls.lock().is_empty());
    assert!(cluster.backups[0].service.zone_ids().is_empty());
}

#[test]
fn zone_numbers_beyond_the_log_engine_are_refused() {
    assert!(log_zone(MASTER, 65_535).is_ok());
    assert!(log_zone(MASTER, 65_536).is_err());
}

#[test]
fn changes_during_re_replication_are_not_overwritten_by_stale_copies() {
    let cluster = Cluster::start(3, 2, Registry::default(), |config| {
        config.replication = 2;
        config.resync_slice_bytes = 4096;
    });
    for local in 0..40u64 {
        cluster
            .create(local, payload(local, 0, 50), Durability::Replicated)
            .unwrap();
    }
    // Every slice read is delivered 300 ms late; meanwhile every chunk changes or goes.
    cluster.memory.1.store(300, Ordering::Release);
    let spare = cluster.backups[2].node;
    cluster.peers.0.lock().push(Candidate {
        node: spare,
        rack: 0,
        switch: 0,
    });
    let failed = cluster.backups[0].node;
    let changes = cluster.replicator.replace_backup(failed);
    assert_eq!(changes.len(), 1);
    std::thread::sleep(Duration::from_millis(50));
    for local in 0..40u64 {
        if local % 4 == 0 {
            cluster.remove(local, Durability::Async).unwrap();
        } else {
            cluster
                .put(local, payload(local, 7, 52), Durability::Async)
                .unwrap();
        }
    }
    match cluster
        .replicator
        .events()
        .recv_timeout(Duration::from_secs(10))
        .expect("resync event")
    {
        ReplicaEvent::ResyncDone { backup, chunks, .. } => {
            assert_eq!(backup, spare);
            assert_eq!(chunks, 0, "every copy read before a change must be skipped");
        }
        other => panic!("unexpected event {other:?}"),
    }
    cluster.replicator.wait_all(Durability::Replicated).unwrap();
    cluster.check_backups_match_memory();
}

#[test]
fn zones_placed_with_too_few_peers_are_filled_when_peers_join() {
    let cluster = Cluster::start(3, 1, Registry::default(), |config| config.replication = 3);
    for local in 0..30u64 {
        cluster
            .create(local, payload(local, 0, 40), Durability::Replicated)
            .unwrap();
    }
    assert_eq!(cluster.replicator.backups_of(0).unwrap().len(), 1);
    cluster.offer_every_backup();
    let changes = cluster.replicator.fill_zones();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].backups.len(), 3);
    assert_eq!(changes[0].added.len(), 2);
    let events = cluster.replicator.events();
    for _ in 0..2 {
        let event = events.recv_timeout(Duration::from_secs(10)).expect("event");
        assert!(
            matches!(event, ReplicaEvent::ResyncDone { chunks: 30, .. }),
            "{event:?}"
        );
    }
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    cluster.check_backups_match_memory();
}

/// Right after a start the master may see no other peer yet: a replicated write to a zone
/// without backups waits (up to the wait timeout) for the zone to get some when a peer
/// joins, instead of failing; with nobody joining it fails after the timeout.
#[test]
fn a_replicated_write_waits_for_backups_while_the_zone_has_none() {
    let cluster = Arc::new(Cluster::start(2, 0, Registry::default(), |config| {
        config.replication = 2;
        config.wait_timeout = Duration::from_secs(20);
    }));
    let writer = {
        let cluster = Arc::clone(&cluster);
        std::thread::spawn(move || {
            (0..10u64)
                .map(|local| cluster.create(local, payload(local, 0, 40), Durability::Replicated))
                .collect::<Result<Vec<()>, _>>()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(!writer.is_finished(), "the write should wait for backups");
    cluster.offer_every_backup();
    assert_eq!(cluster.replicator.fill_zones().len(), 1);
    writer
        .join()
        .unwrap()
        .expect("the writes complete once the zone has backups");
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    cluster.check_backups_match_memory();

    let alone = Cluster::start(1, 0, Registry::default(), |config| {
        config.replication = 1;
        config.wait_timeout = Duration::from_millis(300);
    });
    assert!(matches!(
        alone.create(1, payload(1, 0, 40), Durability::Replicated),
        Err(ReplicaError::NoBackups { zone: 0 })
    ));
}

fn read_log(service: &BackupService, owner: NodeId, zone: u32) -> BTreeMap<u64, Vec<u8>> {
    let chunks = Mutex::new(BTreeMap::new());
    service
        .recover_zone(owner, zone, &|batch| {
            let mut chunks = chunks.lock();
            for chunk in batch {
                chunks.insert(chunk.cid, chunk.payload.to_vec());
            }
        })
        .expect("recover zone");
    chunks.into_inner()
}

/// Adoption (issue 6): the master restored zone 7 of failed peer 50 and adopts it. The
/// surviving backups stay first, one new backup fills up to R; later writes and removes
/// of those chunks go to the log zone (50, 7) on every backup (never to a zone of the
/// master), and the copy to the new backup brings it the whole zone, emptied first of a
/// stale copy it held; every backup ends at the zone's position.
#[test]
fn an_adopted_zone_keeps_its_log_identity_on_its_backups() {
    let cluster = Cluster::start(4, 4, Registry::default(), |config| config.replication = 3);
    let failed = NodeId(50);
    let cid = |local: u64| ChunkId::new(failed, local).unwrap();
    let (b0, b1) = (cluster.backups[0].node, cluster.backups[1].node);
    // The failed peer's log on its surviving backups, and the chunks restored into memory.
    for node in [b0, b1] {
        let engine = cluster.backup(node).service.engine();
        let id = log_zone(failed, 7).unwrap();
        engine.create_zone(id).unwrap();
        for local in 1..=20u64 {
            engine
                .append(id, cid(local).raw(), &payload(local, 0, 30))
                .unwrap();
        }
    }
    // The other backups hold a stale copy of the zone with a chunk the zone no longer
    // has (e.g. an earlier, diverged copy): the one that is added must lose it.
    for backup in &cluster.backups[2..] {
        let engine = backup.service.engine();
        let id = log_zone(failed, 7).unwrap();
        engine.create_zone(id).unwrap();
        engine
            .append(id, cid(30).raw(), &payload(30, 0, 30))
            .unwrap();
    }
    for local in 1..=20u64 {
        cluster
            .memory
            .0
            .lock()
            .insert(cid(local).raw(), payload(local, 0, 30));
    }
    let restored = Restored {
        chunks: 20,
        bytes: 600,
        position: 5,
    };
    let adoption = cluster
        .replicator
        .adopt_zone(
            failed,
            7,
            &[b0, MASTER, failed, b1],
            &[(cid(1), cid(20))],
            restored,
        )
        .expect("adopt");
    assert_eq!(&adoption.backups[..2], &[b0, b1]);
    assert_eq!(adoption.backups.len(), 3);
    assert_eq!(adoption.added.len(), 1);
    assert_eq!(
        cluster.registry.calls.lock().last(),
        Some(&(failed, 7, adoption.backups.clone()))
    );
    assert_eq!(cluster.replicator.zone_of(cid(5)), Some(adoption.zone));
    let stats = cluster.replicator.stats();
    let zone = stats
        .zones
        .iter()
        .find(|z| z.zone == adoption.zone)
        .expect("adopted zone in the stats");
    assert_eq!(zone.adopted_from, Some((failed, 7)));
    assert_eq!(zone.chunks, 20);
    // Changes after the adoption, then the copy to the new backup.
    for local in 1..=10u64 {
        let data = payload(local, 1, 31);
        cluster
            .memory
            .0
            .lock()
            .insert(cid(local).raw(), data.clone());
        cluster
            .replicator
            .on_put(cid(local), &data, Some(Durability::Durable))
            .unwrap();
    }
    cluster.memory.0.lock().remove(&cid(20).raw());
    cluster
        .replicator
        .on_remove(cid(20), 30, Some(Durability::Durable))
        .unwrap();
    let copied = cluster.replicator.copy_adopted(&adoption).expect("copy");
    assert!(copied <= 19, "copied {copied}");
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    let expected: BTreeMap<u64, Vec<u8>> = cluster
        .memory
        .0
        .lock()
        .iter()
        .filter(|(&raw, _)| ChunkId::from_raw(raw).creator() == failed)
        .map(|(&raw, data)| (raw, data.clone()))
        .collect();
    assert_eq!(expected.len(), 19);
    for &node in &adoption.backups {
        let service = &cluster.backup(node).service;
        assert!(
            read_log(service, failed, 7) == expected,
            "log zone (50, 7) on backup {node} differs from memory"
        );
        assert!(
            !service.zone_ids().contains(&(MASTER, adoption.zone)),
            "backup {node} got a zone of the master for the adopted chunks"
        );
        // Eleven changes numbered on from the restorer's position 5; the added backup
        // was reset to 5 before them.
        assert_eq!(service.position(failed, 7), Some(16), "backup {node}");
    }
    // Adopting it again (a retried recovery) keeps the zone and its backups.
    let again = cluster
        .replicator
        .adopt_zone(failed, 7, &[b0, b1], &[(cid(1), cid(20))], restored)
        .expect("adopt again");
    assert_eq!(again.zone, adoption.zone);
    assert_eq!(again.backups, adoption.backups);
}

/// The no-wait form (a peer's I/O thread): refuses, reporting nothing, what would have to
/// wait (a chunk without a registered zone, a non-`async` default); queues everything else
/// like the waiting form, so the backups end equal to memory; and `ready_without_waiting`
/// turns false while a backup stream is past its byte limit, though a no-wait report
/// still queues (never blocks).
#[test]
fn no_wait_reports_reach_every_backup_and_never_block() {
    use myriad_replication::AsyncChange;
    let cluster = Cluster::start(3, 3, Registry::default(), |config| {
        config.message_bytes_target = 4 * 1024;
        config.stream_bytes_max = 16 * 1024;
    });
    let unplaced = ChunkId::new(MASTER, 500).unwrap();
    let data = payload(500, 0, 16);
    assert!(!cluster
        .replicator
        .ready_without_waiting(&[AsyncChange::Put(unplaced, &data)]));
    assert_eq!(
        cluster
            .replicator
            .on_changes_nowait(&[AsyncChange::Put(unplaced, &data)]),
        Err(ReplicaError::WouldWait)
    );
    assert!(
        cluster.replicator.stats().zones.is_empty(),
        "nothing reported"
    );

    for local in 0..40 {
        cluster
            .create(local, payload(local, 0, 24), Durability::Async)
            .unwrap();
    }
    for round in 1..=3u8 {
        for local in 0..40 {
            let cid = ChunkId::new(MASTER, local).unwrap();
            let data = payload(local, round, 24 + round as usize);
            let change = [AsyncChange::Put(cid, &data)];
            if cluster.replicator.ready_without_waiting(&change) {
                cluster.memory.0.lock().insert(cid.raw(), data.clone());
                cluster.replicator.on_changes_nowait(&change).unwrap();
            } else {
                cluster.put(local, data, Durability::Async).unwrap();
            }
        }
    }
    for local in (0..40).step_by(7) {
        let cid = ChunkId::new(MASTER, local).unwrap();
        let size = cluster
            .memory
            .0
            .lock()
            .remove(&cid.raw())
            .map_or(0, |d| d.len() as u64);
        cluster
            .replicator
            .on_changes_nowait(&[AsyncChange::Remove(cid, size)])
            .unwrap();
    }
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    cluster.check_backups_match_memory();

    // A backup that stops acknowledging: once its stream is past the limit the check
    // says no, and a no-wait report still returns at once (queued past the limit).
    let backup = cluster.backups[0].node;
    cluster
        .master
        .handle()
        .set_fault(backup, Fault::DropOutgoing);
    let cid = ChunkId::new(MASTER, 1).unwrap();
    let big = vec![7u8; 4096];
    let mut refused = false;
    for _ in 0..16 {
        let change = [AsyncChange::Put(cid, &big)];
        if !cluster.replicator.ready_without_waiting(&change) {
            refused = true;
        }
        // The waiting form would wait here for room until its 5 s timeout and fail.
        let started = Instant::now();
        cluster.replicator.on_changes_nowait(&change).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "a no-wait report waited"
        );
    }
    assert!(refused, "a full stream was reported ready");
    cluster.memory.0.lock().insert(cid.raw(), big.clone());
    cluster.master.handle().clear_fault(backup);
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    cluster.check_backups_match_memory();
}

/// A zone read back while its master keeps writing (as when a killed master's last
/// message is still being applied as the recovery starts) always holds every chunk: a
/// write racing the read is refused instead of giving a chunk a version whose entry the
/// read does not find (which dropped the chunk from the result).
#[test]
fn a_zone_read_during_writes_keeps_every_chunk() {
    let cluster = Cluster::start(1, 1, Registry::default(), |config| {
        config.replication = 1;
        config.wait_timeout = Duration::from_millis(300);
    });
    const CHUNKS: u64 = 300;
    for local in 0..CHUNKS {
        cluster
            .create(local, payload(local, 0, 24), Durability::Durable)
            .unwrap();
    }
    let zone = cluster
        .replicator
        .zone_of(ChunkId::new(MASTER, 0).unwrap())
        .unwrap();
    let stop = AtomicBool::new(false);
    let backup = &cluster.backups[0].service;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut round = 1u8;
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(20) {
                for local in 0..CHUNKS {
                    let cid = ChunkId::new(MASTER, local).unwrap();
                    // Refused or timed out while the zone is read: fine here.
                    let _ = cluster.replicator.on_put(
                        cid,
                        &payload(local, round, 24),
                        Some(Durability::Async),
                    );
                }
                round = round.wrapping_add(1);
            }
        });
        for attempt in 0..30 {
            let chunks = read_zone(backup, zone);
            if chunks.len() as u64 != CHUNKS {
                stop.store(true, Ordering::Relaxed);
                panic!(
                    "read {attempt}: {} of {CHUNKS} chunks in the zone",
                    chunks.len()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
    });
}

/// Records what deferred callbacks were called with.
fn callback(
    tx: &std::sync::mpsc::Sender<Result<(), ReplicaError>>,
) -> myriad_replication::AckCallback {
    let tx = tx.clone();
    Box::new(move |result| {
        let _ = tx.send(result);
    })
}

#[test]
fn deferred_reports_call_back_once_the_backups_acknowledged() {
    use myriad_replication::AsyncChange;
    use std::sync::mpsc::channel;
    let cluster = Cluster::start(2, 2, Registry::default(), |config| {
        config.wait_timeout = Duration::from_millis(1500);
    });
    let (tx, rx) = channel();
    // No registered zone yet: refused, nothing reported, the callback handed back.
    let unplaced = ChunkId::new(MASTER, 0).unwrap();
    let data = payload(0, 0, 16);
    match cluster.replicator.on_changes_deferred(
        &[AsyncChange::Put(unplaced, &data)],
        Durability::Replicated,
        callback(&tx),
    ) {
        Err((ReplicaError::WouldWait, _)) => {}
        other => panic!("expected WouldWait, got {:?}", other.map_err(|(e, _)| e)),
    }
    assert!(rx.try_recv().is_err(), "a refused report never calls back");

    for local in 0..20 {
        cluster
            .create(local, payload(local, 0, 24), Durability::Replicated)
            .unwrap();
    }
    // Replicated, then durable: each callback says Ok once every backup has the change.
    for (round, durability) in [(1u8, Durability::Replicated), (2, Durability::Durable)] {
        for local in 0..20 {
            let cid = ChunkId::new(MASTER, local).unwrap();
            let data = payload(local, round, 24);
            cluster.memory.0.lock().insert(cid.raw(), data.clone());
            let change = [AsyncChange::Put(cid, &data)];
            assert!(cluster.replicator.ready_without_waiting(&change));
            cluster
                .replicator
                .on_changes_deferred(&change, durability, callback(&tx))
                .map_err(|(e, _)| e)
                .unwrap();
        }
        for _ in 0..20 {
            let result = rx
                .recv_timeout(Duration::from_secs(5))
                .expect("called back");
            assert_eq!(result, Ok(()));
        }
        // Called back only after the backups applied it: they already match memory.
        cluster.check_backups_match_memory();
    }

    // A backup that stops acknowledging: no callback until the wait times out.
    let backup = cluster.backups[0].node;
    cluster
        .master
        .handle()
        .set_fault(backup, Fault::DropOutgoing);
    let cid = ChunkId::new(MASTER, 3).unwrap();
    let data = payload(3, 9, 24);
    cluster.memory.0.lock().insert(cid.raw(), data.clone());
    cluster
        .replicator
        .on_changes_deferred(
            &[AsyncChange::Put(cid, &data)],
            Durability::Replicated,
            callback(&tx),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "acknowledged without the silent backup"
    );
    match rx
        .recv_timeout(Duration::from_secs(5))
        .expect("timed out waiter called back")
    {
        Err(ReplicaError::Timeout { missing, .. }) => assert_eq!(missing, vec![backup]),
        other => panic!("expected a timeout, got {other:?}"),
    }

    // A waiter pending at shutdown ends with Shutdown.
    cluster
        .replicator
        .on_changes_deferred(
            &[AsyncChange::Put(cid, &data)],
            Durability::Durable,
            callback(&tx),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    drop(cluster);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5))
            .expect("called back at shutdown"),
        Err(ReplicaError::Shutdown)
    );
    assert!(rx.try_recv().is_err(), "each callback runs once");
}

/// Sparse writes leave from the writing thread (its stream's send task idle: no hand-off
/// to the sender thread) and still reach every backup; the sender thread takes over only
/// when a stream is busy.
#[test]
fn sparse_writes_are_shipped_by_the_writer_and_reach_every_backup() {
    let cluster = Cluster::start(3, 2, Registry::default(), |_| {});
    for local in 0..30 {
        cluster
            .create(local, payload(local, 0, 32), Durability::Replicated)
            .unwrap();
    }
    for local in 0..30 {
        // Replicated: each write waits for its acknowledgements, so the next one finds
        // the streams idle.
        cluster
            .put(local, payload(local, 1, 40), Durability::Replicated)
            .unwrap();
    }
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    cluster.check_backups_match_memory();
    let stats = cluster.replicator.stats();
    let by_writer: u64 = stats.streams.iter().map(|s| s.shipped_by_writer).sum();
    let by_sender: u64 = stats.streams.iter().map(|s| s.shipped_by_sender).sum();
    assert!(
        by_writer >= 2 * 30,
        "idle streams ship from the writer: {by_writer} by the writer, {by_sender} by the sender"
    );
}

/// A chunk that is locked when re-replication reads its slice (a client's chunk lock) is
/// read again until it can be, not left out: the new backup holds every chunk. A lock
/// held past the wait timeout fails the copy, saying so, instead of leaving it out.
#[test]
fn re_replication_reads_locked_chunks_again_and_never_skips_them() {
    let cluster = Cluster::start(4, 3, Registry::default(), |config| {
        config.zone_bytes = 2000;
        config.resync_slice_bytes = 300;
        config.wait_timeout = Duration::from_millis(1500);
    });
    for local in 0..40u64 {
        cluster
            .create(local, payload(local, 0, 60), Durability::Replicated)
            .unwrap();
    }
    // Three chunks read as locked for a while (3 and 20 briefly, 31 for 5 reads).
    for (local, reads) in [(3u64, 1u32), (20, 2), (31, 5)] {
        let cid = ChunkId::new(MASTER, local).unwrap();
        cluster.memory.2.lock().insert(cid.raw(), reads + 1);
    }
    let spare = cluster.backups[3].node;
    cluster.peers.0.lock().push(Candidate {
        node: spare,
        rack: 0,
        switch: 0,
    });
    let changes = cluster.replicator.replace_backup(cluster.backups[1].node);
    assert!(!changes.is_empty());
    let events = cluster.replicator.events();
    let mut done = BTreeSet::new();
    while done.len() < changes.len() {
        match events
            .recv_timeout(Duration::from_secs(10))
            .expect("resync event")
        {
            ReplicaEvent::ResyncDone { zone, .. } => {
                done.insert(zone);
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    // Without the second reads the spare would lack chunks 3, 20 and 31.
    cluster.check_backups_match_memory();

    // A lock that outlasts the wait timeout: the copy fails and names the chunk.
    let stuck = ChunkId::new(MASTER, 7).unwrap();
    cluster.memory.2.lock().insert(stuck.raw(), u32::MAX);
    cluster.peers.0.lock().push(Candidate {
        node: cluster.backups[1].node,
        rack: 0,
        switch: 0,
    });
    let changes = cluster.replicator.replace_backup(spare);
    assert!(!changes.is_empty());
    let failed = loop {
        match events
            .recv_timeout(Duration::from_secs(10))
            .expect("resync event")
        {
            ReplicaEvent::ResyncFailed { reason, .. } => break reason,
            ReplicaEvent::ResyncDone { .. } => continue,
            other => panic!("unexpected event {other:?}"),
        }
    };
    assert!(failed.contains("stayed locked"), "{failed}");
    // The copy is tried again in the background: once the lock is gone it completes, and
    // the backup is recorded as holding the whole zone.
    cluster.memory.2.lock().remove(&stuck.raw());
    let again = cluster.backups[1].node;
    loop {
        match events
            .recv_timeout(Duration::from_secs(20))
            .expect("a retried copy")
        {
            ReplicaEvent::ResyncDone { backup, .. } if backup == again => break,
            ReplicaEvent::ResyncDone { .. } | ReplicaEvent::ResyncFailed { .. } => continue,
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert!(cluster
        .registry
        .filled
        .lock()
        .iter()
        .any(|&(_, _, backup)| backup == again));
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    cluster.check_backups_match_memory();
}

/// Batches handed to each backup's send task so far (by writers and the sender thread),
/// and each stream's assigned and applied positions, by backup.
fn stream_progress(cluster: &Cluster) -> BTreeMap<NodeId, (u64, u64, u64)> {
    cluster
        .replicator
        .stats()
        .streams
        .iter()
        .map(|s| {
            (
                s.backup,
                (
                    s.shipped_by_writer + s.shipped_by_sender,
                    s.assigned_seq,
                    s.applied_seq,
                ),
            )
        })
        .collect()
}

/// Asynchronous changes linger on the master (`async_linger`) instead of leaving one by
/// one, and a change whose caller waits (replicated) takes them along at once: all of
/// them reach each backup in one batch.
#[test]
fn async_changes_linger_and_leave_with_the_next_waiting_change() {
    let cluster = Cluster::start(3, 2, Registry::default(), |config| {
        config.async_linger = Duration::from_secs(5);
    });
    cluster
        .create(0, payload(0, 0, 32), Durability::Replicated)
        .unwrap();
    let before = stream_progress(&cluster);
    assert_eq!(before.len(), 2);
    for local in 1..=20 {
        cluster
            .create(local, payload(local, 0, 32), Durability::Async)
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    for (backup, &(batches, assigned, applied)) in &stream_progress(&cluster) {
        let (batches_before, assigned_before, applied_before) = before[backup];
        assert_eq!(
            batches, batches_before,
            "nothing left for {backup} while lingering"
        );
        assert_eq!(applied, applied_before);
        assert_eq!(assigned, assigned_before + 20);
    }
    let started = Instant::now();
    cluster
        .put(21, payload(21, 1, 32), Durability::Replicated)
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "a waiting change does not linger: {:?}",
        started.elapsed()
    );
    for (backup, &(batches, assigned, applied)) in &stream_progress(&cluster) {
        let (batches_before, _, _) = before[backup];
        assert_eq!(batches, batches_before + 1, "one batch to {backup}");
        assert_eq!(applied, assigned, "{backup} has every change");
    }
    cluster.replicator.wait_all(Durability::Durable).unwrap();
    cluster.check_backups_match_memory();
}

/// Lingering asynchronous changes leave on their own once the linger is over.
#[test]
fn lingering_async_changes_leave_when_the_linger_is_over() {
    let cluster = Cluster::start(3, 2, Registry::default(), |config| {
        config.async_linger = Duration::from_millis(150);
    });
    cluster
        .create(0, payload(0, 0, 32), Durability::Replicated)
        .unwrap();
    for local in 1..=5 {
        cluster
            .create(local, payload(local, 0, 32), Durability::Async)
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let progress = stream_progress(&cluster);
        if progress
            .values()
            .all(|&(_, assigned, applied)| applied == assigned)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lingering changes never left: {progress:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.check_backups_match_memory();
}
