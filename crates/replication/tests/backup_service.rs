//! The backup side alone, driven by hand-made messages from a raw endpoint: duplicates,
//! gaps, stale and new streams, refused zones.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{unbounded, Receiver};
use myriad_backup_log::{LogConfig, LogEngine, MemStorage};
use myriad_net::{Config, Endpoint, Handlers, Incoming};
use myriad_replication::wire::{self, Ack, AckStatus, LogMessage, Op};
use myriad_replication::{BackupConfig, BackupService};
use myriad_types::NodeId;

const SECRET: &str = "replica-backup-test";
const MASTER: NodeId = NodeId(1);
const BACKUP: NodeId = NodeId(2);

struct Rig {
    service: BackupService,
    _backup: Endpoint,
    master: Endpoint,
    acks: Receiver<Ack>,
}

fn rig() -> Rig {
    rig_with(BackupConfig::default())
}

fn rig_with(config: BackupConfig) -> Rig {
    let engine = Arc::new(
        LogEngine::open(LogConfig::small_for_tests(), Arc::new(MemStorage::new())).expect("engine"),
    );
    let service = BackupService::new(engine, config).expect("service");
    let mut handlers = Handlers::new();
    service.register(&mut handlers).expect("register");
    let backup = Endpoint::start(
        Config::new(BACKUP, "127.0.0.1:0".parse().unwrap(), SECRET),
        handlers,
    )
    .expect("backup endpoint");
    service.attach(backup.handle());
    let (tx, acks) = unbounded();
    let mut master_handlers = Handlers::new();
    master_handlers
        .register(wire::ACK, move |incoming: Incoming| {
            if let Ok(ack) = Ack::decode(incoming.payload) {
                let _ = tx.send(ack);
            }
        })
        .expect("ack handler");
    let master = Endpoint::start(
        Config::new(MASTER, "127.0.0.1:0".parse().unwrap(), SECRET),
        master_handlers,
    )
    .expect("master endpoint");
    master
        .handle()
        .set_address(BACKUP, backup.handle().local_addr());
    backup
        .handle()
        .set_address(MASTER, master.handle().local_addr());
    Rig {
        service,
        _backup: backup,
        master,
        acks,
    }
}

fn put(zone: u32, cid: u64, byte: u8) -> Op {
    Op::Put {
        owner: None,
        zone,
        cid,
        data: Bytes::from(vec![byte; 12]),
        seq: 0,
    }
}

impl Rig {
    /// Asks the backup a zone's position over the network, as a restorer does.
    fn ask_position(&self, question: wire::PositionRequest) -> wire::PositionReply {
        let answer = self
            .master
            .handle()
            .request_blocking(
                BACKUP,
                wire::ZONE_POSITION,
                question.encode(),
                Duration::from_secs(5),
            )
            .expect("an answer");
        wire::PositionReply::decode(answer).expect("a position reply")
    }

    fn send(&self, stream: u64, first_seq: u64, ops: Vec<Op>) {
        let message = LogMessage {
            stream,
            first_seq,
            durable_requested: false,
            ops,
        };
        self.master
            .handle()
            .send_blocking(BACKUP, wire::REPLICATE, message.encode())
            .expect("send");
    }

    /// Waits for the ack of `stream` at `applied` with `status`. Durability acks of the
    /// watcher come in between and are skipped; no ack may go beyond `applied`, and the
    /// stale stream 4 is never answered.
    fn expect(&self, stream: u64, applied: u64, status: fn(&AckStatus) -> bool) -> Ack {
        loop {
            let ack = self
                .acks
                .recv_timeout(Duration::from_secs(5))
                .expect("an ack");
            assert_ne!(ack.stream, 4, "a stale stream was answered");
            if ack.stream != stream {
                continue;
            }
            assert!(
                ack.applied_seq <= applied,
                "applied beyond {applied}: {ack:?}"
            );
            if ack.applied_seq == applied && status(&ack.status) {
                return ack;
            }
        }
    }
}

#[test]
fn duplicates_are_dropped_gaps_stop_and_streams_restart() {
    let rig = rig();
    rig.send(5, 1, vec![put(0, 1, 1), put(0, 2, 1), put(0, 3, 1)]);
    rig.expect(5, 3, |s| *s == AckStatus::Ok);
    // 2 and 3 are duplicates; only 4 is new.
    rig.send(
        5,
        2,
        vec![
            put(0, 2, 9),
            put(0, 3, 9),
            Op::Remove {
                owner: None,
                zone: 0,
                cid: 1,
                seq: 0,
            },
        ],
    );
    rig.expect(5, 4, |s| *s == AckStatus::Ok);
    // 5 and 6 were lost: 7 is a gap and is not applied.
    rig.send(5, 7, vec![put(0, 7, 1)]);
    rig.expect(5, 4, |s| *s == AckStatus::Gap);
    // An older stream is stale: ignored without an answer.
    rig.send(4, 1, vec![put(0, 50, 1)]);
    // A newer stream (restarted master) starts over at 1.
    rig.send(6, 1, vec![put(1, 60, 1)]);
    rig.expect(6, 1, |s| *s == AckStatus::Ok);
    // A zone beyond the log engine's 16 bits is refused, and nothing after it applied.
    rig.send(6, 2, vec![put(70_000, 61, 1), put(1, 62, 1)]);
    let ack = rig.expect(6, 1, |s| matches!(s, AckStatus::Refused(_)));
    assert!(matches!(ack.status, AckStatus::Refused(ref r) if r.contains("70000")));

    let stats = rig.service.engine().stats();
    assert_eq!(stats.appended_entries, 4, "puts applied: 1, 2, 3 and 60");
    assert_eq!(stats.removes, 1);
    assert_eq!(rig.service.zone_ids(), vec![(NodeId(1), 0), (NodeId(1), 1)]);
    // Durability follows: the watcher acknowledges the stream's position on disk.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while rig.service.stream_position(NodeId(1)) != Some((1, 1)) {
        assert!(std::time::Instant::now() < deadline, "never durable");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Operations naming a log owner (a zone the master adopted after restoring it) go to the
/// log zone `(owner, zone)`, next to the master's own zone of the same number, in one stream.
#[test]
fn adopted_zone_ops_go_to_the_log_owners_zone() {
    let rig = rig();
    let failed = NodeId(9);
    let adopted = |cid: u64, byte: u8| Op::Put {
        owner: Some(failed),
        zone: 0,
        cid,
        data: Bytes::from(vec![byte; 12]),
        seq: 0,
    };
    rig.send(
        5,
        1,
        vec![
            put(0, 1, 1),
            adopted(2, 2),
            adopted(3, 3),
            Op::Remove {
                owner: Some(failed),
                zone: 0,
                cid: 2,
                seq: 0,
            },
        ],
    );
    rig.expect(5, 4, |s| *s == AckStatus::Ok);
    assert_eq!(rig.service.zone_ids(), vec![(NodeId(1), 0), (failed, 0)]);
    let mut got: Vec<(u64, Vec<u8>)> = Vec::new();
    let collected = parking_lot::Mutex::new(&mut got);
    rig.service
        .recover_zone(failed, 0, &|batch| {
            let mut guard = collected.lock();
            for chunk in batch {
                guard.push((chunk.cid, chunk.payload.to_vec()));
            }
        })
        .expect("recover the adopted zone");
    assert_eq!(got, vec![(3, vec![3; 12])]);
}

#[test]
fn messages_apply_inline_when_they_fit_and_in_order_on_the_apply_thread_otherwise() {
    let rig = rig_with(BackupConfig {
        apply_inline: true,
        ..BackupConfig::default()
    });
    // A new zone must be created (file I/O): the apply thread takes the first message.
    rig.send(1, 1, vec![put(0, 1, 1)]);
    rig.expect(1, 1, |s| *s == AckStatus::Ok);
    assert_eq!(rig.service.apply_paths(), (0, 1));
    // Small writes to an existing zone: inline, on the I/O thread.
    rig.send(1, 2, vec![put(0, 2, 1), put(0, 3, 1)]);
    rig.expect(1, 3, |s| *s == AckStatus::Ok);
    assert_eq!(rig.service.apply_paths(), (1, 1));
    // More than the write buffer's half takes at once (small_for_tests: 64 KiB buffer;
    // its 64-entry version buffers also send some of the burst there when a seal waits):
    // the apply thread waits for the flusher; the burst right behind it follows it
    // there until it has caught up, in send order (a message applied out of order would
    // stop at a gap: this test's master never resends).
    let big: Vec<Op> = (0..5u64)
        .map(|i| Op::Put {
            owner: None,
            zone: 0,
            cid: 100 + i,
            data: Bytes::from(vec![7u8; 7_000]),
            seq: 0,
        })
        .collect();
    rig.send(1, 4, big);
    let mut next = 9;
    for i in 0..200u64 {
        rig.send(1, next, vec![put(0, 1_000 + i, 2)]);
        next += 1;
    }
    rig.expect(1, next - 1, |s| *s == AckStatus::Ok);
    let (inline, deferred) = rig.service.apply_paths();
    assert!(
        deferred >= 2,
        "the large message went to the apply thread: {deferred}"
    );
    assert_eq!(inline + deferred, 2 + 1 + 200, "every message handled once");
    let stats = rig.service.engine().stats();
    assert_eq!(stats.appended_entries, 3 + 5 + 200);
}

/// A zone read back for a recovery is sealed for its log owner: a late message of the
/// failed owner (accepted before it was fenced, applied after the read) is refused, while
/// the peer that adopted the zone still writes to it. Without the seal the late change
/// landed in the zone's log and a later recovery brought it back (simulator seed 276).
#[test]
fn a_recovered_zone_refuses_its_failed_owners_late_operations() {
    let engine = Arc::new(
        LogEngine::open(LogConfig::small_for_tests(), Arc::new(MemStorage::new())).expect("engine"),
    );
    let service = BackupService::new(engine, BackupConfig::default()).expect("service");
    let message = |stream: u64, first_seq: u64, ops: Vec<Op>| {
        LogMessage {
            stream,
            first_seq,
            durable_requested: false,
            ops,
        }
        .encode()
    };
    let ack = service
        .apply(MASTER, message(1, 1, vec![put(0, 10, 1)]))
        .expect("ack");
    assert_eq!(ack.status, AckStatus::Ok);
    let read = |service: &BackupService| {
        let chunks = std::sync::Mutex::new(Vec::new());
        service
            .recover_zone_and_seal(MASTER, 0, &|batch| {
                let mut out = chunks.lock().unwrap();
                out.extend(batch.iter().map(|c| (c.cid, c.payload[0])));
            })
            .expect("recover");
        let mut chunks = chunks.into_inner().unwrap();
        chunks.sort();
        chunks
    };
    assert_eq!(read(&service), vec![(10, 1)]);
    // The failed owner's late message: refused, nothing applied.
    let late = service
        .apply(MASTER, message(1, 2, vec![put(0, 11, 2)]))
        .expect("ack");
    assert!(
        matches!(late.status, AckStatus::Refused(_)),
        "a late operation of the failed owner was applied: {late:?}"
    );
    // The adopter (another master) writes to the same log zone.
    let adopter = NodeId(3);
    let adopted = Op::Put {
        owner: Some(MASTER),
        zone: 0,
        cid: 10,
        data: Bytes::from(vec![3u8; 12]),
        seq: 0,
    };
    let ack = service
        .apply(adopter, message(7, 1, vec![adopted]))
        .expect("ack");
    assert_eq!(ack.status, AckStatus::Ok);
    assert_eq!(read(&service), vec![(10, 3)]);
}

/// A failed owner sealed on its `NodeFailed` event: its late operations for its earlier
/// zones are refused, also for a zone that never reached this backup before (its first
/// message still queued), while its restarted incarnation's new zone and an adopter's
/// writes to the old zone are applied (simulator seed 1270).
#[test]
fn a_failed_owners_zones_are_sealed_on_its_failure() {
    let engine = Arc::new(
        LogEngine::open(LogConfig::small_for_tests(), Arc::new(MemStorage::new())).expect("engine"),
    );
    let service = BackupService::new(engine, BackupConfig::default()).expect("service");
    let message = |stream: u64, ops: Vec<Op>| {
        LogMessage {
            stream,
            first_seq: 1,
            durable_requested: false,
            ops,
        }
        .encode()
    };
    service.seal_owner(MASTER, 1);
    let late = service
        .apply(MASTER, message(1, vec![put(0, 11, 2)]))
        .expect("ack");
    assert!(
        matches!(late.status, AckStatus::Refused(_)),
        "a late operation of the failed owner was applied: {late:?}"
    );
    let restarted = service
        .apply(MASTER, message(2, vec![put(1, 12, 3)]))
        .expect("ack");
    assert_eq!(restarted.status, AckStatus::Ok);
    let adopted = Op::Put {
        owner: Some(MASTER),
        zone: 0,
        cid: 10,
        data: Bytes::from(vec![4u8; 12]),
        seq: 0,
    };
    let ack = service
        .apply(NodeId(3), message(7, vec![adopted]))
        .expect("ack");
    assert_eq!(ack.status, AckStatus::Ok);
    let chunks = std::sync::Mutex::new(Vec::new());
    service
        .recover_zone(MASTER, 0, &|batch| {
            chunks
                .lock()
                .unwrap()
                .extend(batch.iter().map(|c| (c.cid, c.payload[0])));
        })
        .expect("recover");
    assert_eq!(chunks.into_inner().unwrap(), vec![(10, 4)]);
}

/// Zone positions (`wire`, "Zone positions"): a backup records the last position it
/// applied per log zone (a copy's puts carry none), a reset empties the zone and sets
/// it, and a restorer's position request, over the network, answers it and seals the
/// zone against the failed writer while a new adopter's operations still apply.
#[test]
fn zone_positions_follow_the_history_and_a_reset_empties_the_zone() {
    let rig = rig();
    let numbered = |cid: u64, byte: u8, seq: u64| {
        let mut op = put(0, cid, byte);
        op.set_seq(seq);
        op
    };
    let remove = Op::Remove {
        owner: None,
        zone: 0,
        cid: 11,
        seq: 3,
    };
    rig.send(
        1,
        1,
        vec![
            numbered(10, 1, 1),
            numbered(11, 1, 2),
            remove,
            put(1, 50, 1),
        ],
    );
    rig.expect(1, 4, |s| *s == AckStatus::Ok);
    assert_eq!(rig.service.position(MASTER, 0), Some(3));
    assert_eq!(rig.service.position(MASTER, 1), None, "no positions sent");
    // A copy's put (position 0) leaves the position alone.
    rig.send(1, 5, vec![put(0, 12, 1)]);
    rig.expect(1, 5, |s| *s == AckStatus::Ok);
    assert_eq!(rig.service.position(MASTER, 0), Some(3));
    let read = |owner: NodeId, zone: u32| {
        let chunks = std::sync::Mutex::new(Vec::new());
        rig.service
            .recover_zone(owner, zone, &|batch| {
                let mut out = chunks.lock().unwrap();
                out.extend(batch.iter().map(|c| (c.cid, c.payload[0])));
            })
            .expect("recover");
        let mut chunks = chunks.into_inner().unwrap();
        chunks.sort();
        chunks
    };
    assert_eq!(read(MASTER, 0), vec![(10, 1), (12, 1)]);
    // A reset (the start of a copy to this backup) empties the zone at position 20.
    let reset = Op::Reset {
        owner: None,
        zone: 0,
        seq: 20,
    };
    rig.send(1, 6, vec![reset, put(0, 13, 2), numbered(14, 2, 21)]);
    rig.expect(1, 8, |s| *s == AckStatus::Ok);
    assert_eq!(read(MASTER, 0), vec![(13, 2), (14, 2)]);
    assert_eq!(rig.service.position(MASTER, 0), Some(21));
    assert_eq!(read(MASTER, 1), vec![(50, 1)], "other zones untouched");
    // A restorer asks over the network; the zone is sealed against its writer.
    let question = wire::PositionRequest {
        owner: MASTER,
        zone: 0,
        writer: MASTER,
    };
    assert_eq!(rig.ask_position(question), wire::PositionReply(Some(21)));
    let unknown = wire::PositionRequest {
        owner: NodeId(9),
        zone: 4,
        writer: NodeId(9),
    };
    assert_eq!(rig.ask_position(unknown), wire::PositionReply(None));
    rig.send(1, 9, vec![numbered(15, 3, 22)]);
    rig.expect(1, 8, |s| matches!(s, AckStatus::Refused(_)));
    assert_eq!(rig.service.position(MASTER, 0), Some(21), "sealed");
    // A holder of an adopted zone sealed as its writer; the next adopter applies.
    let (holder, adopter) = (NodeId(3), NodeId(4));
    let adopted = |byte: u8, seq: u64| Op::Put {
        owner: Some(MASTER),
        zone: 0,
        cid: 16,
        data: Bytes::from(vec![byte; 12]),
        seq,
    };
    let message = |stream: u64, ops: Vec<Op>| {
        LogMessage {
            stream,
            first_seq: 1,
            durable_requested: false,
            ops,
        }
        .encode()
    };
    let ack = rig.service.apply(holder, message(30, vec![adopted(4, 22)]));
    assert_eq!(ack.map(|a| a.status), Some(AckStatus::Ok));
    assert_eq!(rig.service.seal_and_position(MASTER, 0, holder), Some(22));
    let late = rig.service.apply(holder, message(31, vec![adopted(5, 23)]));
    assert!(matches!(
        late.map(|a| a.status),
        Some(AckStatus::Refused(_))
    ));
    let ack = rig
        .service
        .apply(adopter, message(40, vec![adopted(6, 23)]));
    assert_eq!(ack.map(|a| a.status), Some(AckStatus::Ok));
    assert_eq!(rig.service.position(MASTER, 0), Some(23));
    assert_eq!(read(MASTER, 0), vec![(13, 2), (14, 2), (16, 6)]);
}
