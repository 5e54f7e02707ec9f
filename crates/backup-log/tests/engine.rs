//! Scenario and model tests of the log engine through its public API.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{
    assert_consistent, assert_same, decode_payload, open, payload, read_zone, read_zone_with,
    temp_dir,
};
use myriad_backup_log::{
    DiskStorage, IoMode, LogConfig, LogEngine, LogError, MemStorage, RecoveryOptions, Storage,
    Violation, ZoneId,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn zone(owner: u16, zone: u16) -> ZoneId {
    ZoneId { owner, zone }
}

fn cid(owner: u16, local: u64) -> u64 {
    (u64::from(owner) << 48) | local
}

/// Random puts and removes over several zones against a HashMap per zone, each zone read
/// back through the recovery API, then again after a clean restart.
#[test]
fn model_random_puts_and_removes_match_recovery_before_and_after_restart() {
    for seed in 0..3u64 {
        let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
        let config = LogConfig::small_for_tests();
        let engine = open(&storage, &config);
        let zones = [zone(1, 0), zone(1, 1), zone(2, 0)];
        for z in zones {
            engine.create_zone(z).unwrap();
        }
        let mut model: HashMap<ZoneId, HashMap<u64, Vec<u8>>> = HashMap::new();
        let mut rng = SmallRng::seed_from_u64(seed);
        for op in 0..4000u64 {
            let z = zones[rng.gen_range(0..zones.len())];
            // Some CIDs of another creator (migrated chunks) use the full-CID form.
            let owner = if rng.gen_bool(0.1) { 9 } else { z.owner };
            let c = cid(
                owner,
                rng.gen_range(0..150u64) * if rng.gen_bool(0.05) { 1 << 33 } else { 1 },
            );
            let m = model.entry(z).or_default();
            if rng.gen_bool(0.15) {
                engine.remove(z, c).unwrap();
                m.remove(&c);
            } else {
                let p = payload(c, op, rng.gen_range(24..400));
                engine.append(z, c, &p).unwrap();
                m.insert(c, p);
            }
            if op % 1000 == 999 {
                assert_consistent(&engine, &format!("seed {seed} op {op}"));
                for z in zones {
                    assert_same(
                        &read_zone(&engine, z),
                        &model[&z],
                        &format!("seed {seed} op {op} zone {z}"),
                    );
                }
            }
        }
        engine.shutdown().unwrap();
        let engine = open(&storage, &config);
        assert_eq!(engine.zones(), zones.to_vec());
        for z in zones {
            assert_same(
                &read_zone(&engine, z),
                &model[&z],
                &format!("after restart, seed {seed}"),
            );
        }
        // And it keeps working after the restart.
        let c = cid(1, 7);
        engine.append(zones[0], c, b"after restart").unwrap();
        assert_eq!(read_zone(&engine, zones[0])[&c], b"after restart");
    }
}

#[test]
fn large_chunks_are_chained_and_reassembled() {
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let config = LogConfig::small_for_tests();
    let engine = open(&storage, &config);
    let z = zone(3, 1);
    engine.create_zone(z).unwrap();
    let link = config.entry_payload_bytes_max() as usize;
    let big = payload(cid(3, 1), 1, 3 * link + 17);
    let exact = payload(cid(3, 2), 2, link);
    engine.append(z, cid(3, 1), &big).unwrap();
    engine.append(z, cid(3, 2), &exact).unwrap();
    engine
        .append(z, cid(3, 3), b"small chunk next to big ones")
        .unwrap();
    let newer = payload(cid(3, 1), 4, 2 * link + 1);
    engine.append(z, cid(3, 1), &newer).unwrap();
    for threads in [1, 3] {
        let got = read_zone_with(
            &engine,
            z,
            &RecoveryOptions {
                threads,
                verify_crc: threads == 1,
                batch_chunks_max: 1,
            },
        );
        assert_eq!(got.len(), 3);
        assert_eq!(got[&cid(3, 1)], newer);
        assert_eq!(got[&cid(3, 2)], exact);
    }
    assert!(matches!(
        engine.append(z, 5, &vec![0; config.chunk_bytes_max as usize + 1]),
        Err(LogError::ChunkTooLarge { .. })
    ));
    engine.shutdown().unwrap();
    let engine = open(&storage, &config);
    assert_eq!(read_zone(&engine, z)[&cid(3, 1)], newer);
    assert_consistent(&engine, "chained, reopened");
}

/// Many overwrites of few chunks write several times the log's size: only reorganization
/// keeps the log from filling up, and it must keep every latest version, while a writer
/// keeps writing and recovery reads check the state. Every pass orders segments by
/// cost-benefit from the live-byte estimates (prompt ones take the best few, urgent ones
/// go best first until enough is free).
#[test]
fn reorganization_under_concurrent_writes_keeps_every_latest_version() {
    // 8 segments: mostly urgent passes. 16: room for prompt passes to run ahead of the
    // writers most of the time (urgent ones, which give way to nothing, can otherwise
    // take every turn).
    for segments in [8, 16] {
        let config = LogConfig {
            secondary_log_bytes: segments * 16384,
            ..LogConfig::small_for_tests()
        };
        concurrent_writes_and_reorganization(&config, segments == 16);
    }
}

fn concurrent_writes_and_reorganization(config: &LogConfig, expect_prompt_passes: bool) {
    let config = config.clone();
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let engine = Arc::new(open(&storage, &config));
    let zones = [zone(4, 0), zone(4, 1)];
    for z in zones {
        engine.create_zone(z).unwrap();
    }
    let capacity = config.secondary_log_bytes as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = zones
        .iter()
        .enumerate()
        .map(|(i, &z)| {
            let engine = engine.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(i as u64);
                let mut model = HashMap::new();
                let mut written = 0usize;
                let mut op = 0u64;
                while written < 4 * capacity && !stop.load(Ordering::Relaxed) {
                    op += 1;
                    if rng.gen_bool(0.03) {
                        // A bulk write of 16 consecutive chunks of one length (stored as
                        // run entries, which later writes partly outdate and the
                        // reorganizer takes apart).
                        let base = 1000 + rng.gen_range(0..16u64) * 16;
                        let len = rng.gen_range(24..120);
                        let items: Vec<(u64, Vec<u8>)> = (0..16)
                            .map(|k| {
                                let c = cid(4, base + k);
                                (c, payload(c, op, len))
                            })
                            .collect();
                        let refs: Vec<(u64, &[u8])> =
                            items.iter().map(|(c, p)| (*c, p.as_slice())).collect();
                        engine.append_batch(z, &refs).unwrap();
                        for (c, p) in items {
                            written += p.len();
                            model.insert(c, p);
                        }
                        continue;
                    }
                    let c = cid(4, rng.gen_range(0..200));
                    if rng.gen_bool(0.05) {
                        engine.remove(z, c).unwrap();
                        model.remove(&c);
                        continue;
                    }
                    let p = payload(c, op, rng.gen_range(24..200));
                    written += p.len();
                    engine.append(z, c, &p).unwrap();
                    model.insert(c, p);
                    if op.is_multiple_of(500) {
                        engine.flush().unwrap();
                    }
                }
                model
            })
        })
        .collect();
    // Recovery reads of a zone while its writer runs: every delivered value is one that
    // was written for that chunk.
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(20));
        for z in zones {
            for (c, v) in read_zone(&engine, z) {
                assert!(decode_payload(c, &v).is_some());
            }
        }
    }
    let models: Vec<HashMap<u64, Vec<u8>>> =
        writers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let stats = engine.stats();
    assert!(
        stats.reorg_passes > 0 && stats.reorg_segments_cleaned > 0,
        "{stats:?}"
    );
    // Prompt and periodic passes (at most `reorg_segments_per_pass` segments chosen by
    // cost-benefit) ran, not only urgent ones (best first until enough is free).
    if expect_prompt_passes {
        assert!(stats.reorg_passes > stats.reorg_urgent_passes, "{stats:?}");
        // What they cleaned is reported: bytes used, an estimate within them, and the
        // valid bytes found (some segments held valid entries: the writers kept going).
        let c = stats.reorg_cleaned;
        assert!(
            c.used_bytes > 0 && c.estimated_live_bytes <= c.used_bytes && c.live_bytes > 0,
            "{c:?}"
        );
    }
    for (z, model) in zones.iter().zip(&models) {
        assert_same(&read_zone(&engine, *z), model, &format!("zone {z}"));
    }
    assert_consistent(&engine, "after cleaning under writes");
    for z in &stats.zones {
        assert!(z.memory_bytes > 0 && z.used_bytes <= z.capacity_bytes);
    }
    drop(engine);
    let engine = open(&storage, &config);
    for (z, model) in zones.iter().zip(&models) {
        assert_same(
            &read_zone(&engine, *z),
            model,
            &format!("after restart, zone {z}"),
        );
    }
    assert_consistent(&engine, "after cleaning under writes, reopened");
}

/// Cold chunks written once stay recoverable while hot ones advance the epoch past the
/// eon-visit interval many times: eon visits re-stamp them.
#[test]
fn eon_visits_restamp_cold_chunks_and_keep_them() {
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let config = LogConfig {
        eon_visit_epochs: 4,
        version_buffer_entries_max: 16,
        ..LogConfig::small_for_tests()
    };
    let engine = open(&storage, &config);
    let z = zone(5, 0);
    engine.create_zone(z).unwrap();
    let mut model = HashMap::new();
    for c in 0..20u64 {
        let p = payload(cid(5, c), c, 40);
        engine.append(z, cid(5, c), &p).unwrap();
        model.insert(cid(5, c), p);
    }
    engine.remove(z, cid(5, 19)).unwrap();
    model.remove(&cid(5, 19));
    let mut op = 100;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while engine.stats().reorg_entries_restamped == 0 || engine.stats().zones[0].epoch < 200 {
        assert!(std::time::Instant::now() < deadline, "{:?}", engine.stats());
        for c in 1000..1012u64 {
            op += 1;
            let p = payload(cid(5, c), op, 30);
            engine.append(z, cid(5, c), &p).unwrap();
            model.insert(cid(5, c), p);
        }
        engine.flush().unwrap();
    }
    assert_same(&read_zone(&engine, z), &model, "eon");
    assert_consistent(&engine, "after eon visits");
    drop(engine);
    let engine = open(&storage, &config);
    assert_same(&read_zone(&engine, z), &model, "eon");
    assert_consistent(&engine, "after eon visits, reopened");
}

#[test]
fn durability_levels_and_errors() {
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let config = LogConfig {
        flush_interval: Duration::from_secs(3600),
        ..LogConfig::small_for_tests()
    };
    let engine = open(&storage, &config);
    let z = zone(6, 0);
    engine.create_zone(z).unwrap();
    assert!(matches!(
        engine.create_zone(z),
        Err(LogError::ZoneExists(_))
    ));
    assert!(matches!(
        engine.append(zone(6, 9), 1, b"x"),
        Err(LogError::UnknownZone(_))
    ));
    let t1 = engine.append(z, cid(6, 1), b"one").unwrap();
    let t2 = engine.append(z, cid(6, 1), b"two").unwrap();
    assert!(t2.seq > t1.seq && t2.version.is_newer_than(t1.version));
    // With an hour-long interval nothing is durable until someone waits for it.
    assert!(engine.durable_seq() < t1.seq);
    engine
        .wait_durable(t2.seq, Duration::from_secs(10))
        .unwrap();
    assert!(engine.durable_seq() >= t2.seq);
    assert!(engine
        .wait_durable(t2.seq + 100, Duration::from_millis(10))
        .is_err());
    engine.remove_zone(z).unwrap();
    assert!(matches!(
        engine.append(z, 1, b"x"),
        Err(LogError::UnknownZone(_))
    ));
    assert!(storage
        .list()
        .unwrap()
        .iter()
        .all(|n| !n.starts_with("zone-0006-0000")));
    let bad = LogConfig {
        segment_bytes: 3000,
        ..LogConfig::small_for_tests()
    };
    assert!(matches!(
        LogEngine::open(bad, storage.clone()),
        Err(LogError::InvalidConfig(_))
    ));
}

/// The same workload on a real file system, with O_DIRECT where supported and buffered.
#[test]
fn disk_storage_in_both_io_modes_round_trips_through_restart() {
    for mode in [IoMode::Auto, IoMode::Buffered] {
        let dir = temp_dir(&format!("disk-{mode:?}"));
        let storage: Arc<dyn Storage> = Arc::new(DiskStorage::new(&dir, mode).unwrap());
        let config = LogConfig::small_for_tests();
        let engine = open(&storage, &config);
        let z = zone(7, 2);
        engine.create_zone(z).unwrap();
        let mut model = HashMap::new();
        for op in 0..3000u64 {
            let c = cid(7, op % 200);
            let p = payload(c, op, 24 + (op as usize % 500));
            engine.append(z, c, &p).unwrap();
            model.insert(c, p);
        }
        assert_same(&read_zone(&engine, z), &model, &format!("{mode:?}"));
        engine.shutdown().unwrap();
        let engine = open(&storage, &config);
        assert_same(
            &read_zone(&engine, z),
            &model,
            &format!("{mode:?} after restart"),
        );
        drop(engine);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Runs `f` on a thread and fails the test if it takes longer than `limit` (a hang in the
/// flusher/writer handoff would otherwise hang the test run).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .expect("finished within the limit (no hang between flusher and writer)")
}

/// The writer thread: with a small write buffer the flusher keeps a sorted flush queued
/// while the writer writes the one before. Shutting down with work in flight writes all
/// of it; dropping without shutdown ends both threads; a failing disk stops the engine
/// with an error (not a hang), even with a flush queued behind the failing one.
#[test]
fn writer_thread_shutdown_and_failure_with_flushes_in_flight() {
    let config = LogConfig {
        write_buffer_bytes: 2 * 16384,
        flush_interval: Duration::from_millis(1),
        ..LogConfig::small_for_tests()
    };
    let z = zone(9, 0);
    // Shutdown with appends still in the write buffer and the writer's queue.
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let model: HashMap<u64, Vec<u8>> = {
        let storage = storage.clone();
        let config = config.clone();
        within(Duration::from_secs(20), move || {
            let engine = open(&storage, &config);
            engine.create_zone(z).unwrap();
            let mut model = HashMap::new();
            for op in 0..3000u64 {
                let c = cid(9, op % 150);
                let p = payload(c, op, 40 + (op % 100) as usize);
                engine.append(z, c, &p).unwrap();
                model.insert(c, p);
            }
            assert!(engine.stats().flushes > 1, "flushes were pipelined");
            engine.shutdown().unwrap();
            model
        })
    };
    let engine = open(&storage, &config);
    assert_same(&read_zone(&engine, z), &model, "after shutdown");
    // Dropped without shutdown while appending: both threads end.
    within(Duration::from_secs(20), move || {
        for op in 0..500u64 {
            let c = cid(9, op % 150);
            engine.append(z, c, &payload(c, op, 60)).unwrap();
        }
        drop(engine);
    });
    // The disk fails partway: waits end with an error, appends stop, the engine drops.
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    within(Duration::from_secs(20), move || {
        let engine = open(&storage, &config);
        engine.create_zone(z).unwrap();
        mem.set_write_budget(Some(20_000));
        let mut failed = false;
        for op in 0..20_000u64 {
            let c = cid(9, op % 150);
            match engine.append(z, c, &payload(c, op, 100)) {
                Ok(t) if op % 50 == 49 => {
                    if engine.wait_durable(t.seq, Duration::from_secs(10)).is_err() {
                        failed = true;
                        break;
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(failed, "the disk failure reached the caller");
        let last = engine.append(z, cid(9, 1), b"after the failure");
        assert!(last.is_err(), "no append accepted after the failure");
        drop(engine);
    });
}

/// Several zones read back at once from one engine (a restorer of several zones: the
/// extra reader of each read stops when another starts) each give every chunk exactly
/// once with its latest value.
#[test]
fn zones_read_back_at_once_each_give_every_chunk() {
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let engine = Arc::new(open(&storage, &LogConfig::small_for_tests()));
    let zones: Vec<ZoneId> = (0..4).map(|z| zone(3, z)).collect();
    let mut expected: Vec<HashMap<u64, Vec<u8>>> = vec![HashMap::new(); zones.len()];
    for (i, &z) in zones.iter().enumerate() {
        engine.create_zone(z).unwrap();
        for local in 0..600u64 {
            let c = cid(3, i as u64 * 10_000 + local);
            let data = payload(c, local % 3, 40 + (local % 40) as usize);
            engine.append(z, c, &data).unwrap();
            expected[i].insert(c, data);
        }
        // Some chunks written again: only the latest counts.
        for local in (0..600u64).step_by(7) {
            let c = cid(3, i as u64 * 10_000 + local);
            let data = payload(c, 9, 64);
            engine.append(z, c, &data).unwrap();
            expected[i].insert(c, data);
        }
    }
    engine.flush().unwrap();
    for _round in 0..3 {
        let reads: Vec<_> = zones
            .iter()
            .map(|&z| {
                let engine = engine.clone();
                std::thread::spawn(move || read_zone(&engine, z))
            })
            .collect();
        for (i, read) in reads.into_iter().enumerate() {
            let got = read.join().expect("a zone read panicked");
            assert_same(
                &got,
                &expected[i],
                &format!("zone {i} read with the others"),
            );
        }
    }
}

/// A cold chained chunk (written once, then left alone while hot chunks move the zone's
/// epoch on past half the epoch space, where serial-number order would turn) stays
/// recoverable, and a later write of it wins, live and after a restart: eon visits write
/// its links again with a fresh version, as they re-stamp small chunks. (Without that the
/// old chain compares as newer than the write, and a read returns the old bytes.)
#[test]
fn a_cold_chained_chunk_outlives_half_the_epoch_space_and_loses_to_a_later_write() {
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let config = LogConfig {
        eon_visit_epochs: 1 << 10,
        version_buffer_entries_max: 8,
        ..LogConfig::small_for_tests()
    };
    let engine = open(&storage, &config);
    let z = zone(6, 0);
    engine.create_zone(z).unwrap();
    let mut model = HashMap::new();
    let big = cid(6, 1);
    let p = payload(big, 1, 40_000);
    engine.append(z, big, &p).unwrap();
    model.insert(big, p);
    let small = cid(6, 2);
    let p = payload(small, 2, 50);
    engine.append(z, small, &p).unwrap();
    model.insert(small, p);
    engine.flush().unwrap();
    let start = std::time::Instant::now();
    let target = (1u32 << 15) + 256;
    let mut op = 100;
    let mut epochs = 0u32;
    let mut last = engine.stats().zones[0].epoch;
    while epochs < target {
        assert!(start.elapsed() < Duration::from_secs(50), "{epochs} epochs");
        for c in 1000..1006u64 {
            op += 1;
            let p = payload(cid(6, c), op, 20);
            engine.append(z, cid(6, c), &p).unwrap();
            model.insert(cid(6, c), p);
        }
        engine.flush().unwrap();
        let now = engine.stats().zones[0].epoch;
        epochs += u32::from(now.wrapping_sub(last));
        last = now;
    }
    assert_same(&read_zone(&engine, z), &model, "after half the epoch space");
    let p = payload(big, op + 1, 30_000);
    engine.append(z, big, &p).unwrap();
    model.insert(big, p);
    let p = payload(small, op + 2, 60);
    engine.append(z, small, &p).unwrap();
    model.insert(small, p);
    engine.flush().unwrap();
    assert_same(&read_zone(&engine, z), &model, "written again");
    assert_consistent(&engine, "cold chain written again");
    drop(engine);
    let engine = open(&storage, &config);
    assert_same(&read_zone(&engine, z), &model, "written again, reopened");
    assert_consistent(&engine, "cold chain written again, reopened");
}

/// The consistency walker finds what it checks: a flipped byte in an entry on disk ends
/// the segment's verified entries early and loses the chunk's current version.
#[test]
fn the_consistency_walker_reports_a_corrupted_entry() {
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let config = LogConfig {
        secondary_buffer_bytes: 0, // straight to the secondary log
        ..LogConfig::small_for_tests()
    };
    let engine = open(&storage, &config);
    let z = zone(7, 0);
    engine.create_zone(z).unwrap();
    for c in 0..4u64 {
        engine
            .append(z, cid(7, c), &payload(cid(7, c), c, 100))
            .unwrap();
    }
    let report = engine.check_consistency().unwrap();
    assert!(report.is_consistent(), "{report}");
    assert_eq!(
        (report.zones, report.segments, report.chunks),
        (1, 1, 4),
        "{report}"
    );
    // Flip a payload byte of the first entry (the segment header is 16 bytes).
    let file = mem.open("zone-0007-0000.sec", 0).unwrap();
    let mut page = vec![0u8; myriad_backup_log::PAGE_BYTES];
    file.read_at(&mut page, 0).unwrap();
    page[16 + 30] ^= 0x40;
    file.write_at(&page, 0).unwrap();
    let report = engine.check_consistency().unwrap();
    assert!(!report.is_consistent());
    assert!(
        report.violations.iter().any(|v| matches!(
            v,
            Violation::SegmentEntries {
                segment: 0,
                verified: 16,
                ..
            }
        )),
        "{report}"
    );
    assert!(
        report
            .violations
            .iter()
            .any(|v| matches!(v, Violation::ChunkVersion { on_disk: None, .. })),
        "{report}"
    );
}

/// Storage whose syncs wait while a gate is closed: a disk that stops answering.
#[derive(Clone, Debug)]
struct GatedStorage {
    inner: MemStorage,
    closed: Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>,
}

#[derive(Debug)]
struct GatedFile {
    inner: Box<dyn myriad_backup_log::LogFile>,
    closed: Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>,
}

impl GatedStorage {
    fn set_closed(&self, closed: bool) {
        *self.closed.0.lock() = closed;
        self.closed.1.notify_all();
    }
}

impl Storage for GatedStorage {
    fn open(&self, name: &str, len: u64) -> std::io::Result<Box<dyn myriad_backup_log::LogFile>> {
        Ok(Box::new(GatedFile {
            inner: self.inner.open(name, len)?,
            closed: self.closed.clone(),
        }))
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        self.inner.list()
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.inner.remove(name)
    }
}

impl myriad_backup_log::LogFile for GatedFile {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        let mut closed = self.closed.0.lock();
        while *closed {
            self.closed.1.wait(&mut closed);
        }
        drop(closed);
        self.inner.sync()
    }
    fn direct(&self) -> bool {
        false
    }
}

/// A flush that runs out of time while the disk does not answer says where the
/// pipeline stands (what is issued and durable, and that a flush is with the writer or
/// the syncer), and the engine goes on once the disk answers again: the flush after
/// that succeeds and every write reads back.
#[test]
fn a_flush_timing_out_on_a_stalled_disk_reports_the_pipeline_and_recovers() {
    let gated = GatedStorage {
        inner: MemStorage::new(),
        closed: Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new())),
    };
    let storage: Arc<dyn Storage> = Arc::new(gated.clone());
    let config = LogConfig {
        wait_timeout: Duration::from_millis(300),
        ..LogConfig::small_for_tests()
    };
    let engine = open(&storage, &config);
    let z = zone(8, 0);
    engine.create_zone(z).unwrap();
    let mut model = HashMap::new();
    for c in 0..3u64 {
        let p = payload(cid(8, c), c, 100);
        engine.append(z, cid(8, c), &p).unwrap();
        model.insert(cid(8, c), p);
    }
    engine.flush().unwrap();
    gated.set_closed(true);
    for c in 3..6u64 {
        let p = payload(cid(8, c), c, 100);
        engine.append(z, cid(8, c), &p).unwrap();
        model.insert(cid(8, c), p);
    }
    let err = engine
        .flush()
        .expect_err("a flush returned while the disk was stalled");
    let LogError::Timeout { what, state } = &err else {
        panic!("not a timeout: {err}");
    };
    assert_eq!(*what, "durability");
    assert!(state.contains("issued 6,"), "{state}");
    assert!(state.contains("durable 3;"), "{state}");
    // The stalled flush is with the writer (syncing the primary log) or the syncer.
    assert!(state.contains("taken 6,"), "{state}");
    assert!(
        state.contains("writer writing the primary log")
            || state.contains("writer syncing logs")
            || state.contains("busy true"),
        "{state}"
    );
    assert!(
        err.to_string().contains("timed out waiting for durability"),
        "{err}"
    );
    gated.set_closed(false);
    engine.flush().unwrap();
    assert_same(
        &read_zone(&engine, z),
        &model,
        "after the disk answered again",
    );
}

/// After `idle_release_after` without appends the engine writes every zone's
/// secondary-log buffer to its secondary log and frees its burst buffers: the buffers
/// read empty, RAM use drops, every chunk reads back, appends go on, and a crash right
/// after loses nothing that was durable (the buffered entries are in the secondary logs
/// now, synced).
#[test]
fn an_idle_engine_writes_out_its_secondary_buffers_and_frees_its_burst_buffers() {
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let config = LogConfig {
        idle_release_after: Duration::from_millis(200),
        ..LogConfig::small_for_tests()
    };
    let engine = open(&storage, &config);
    let zones = [zone(9, 0), zone(9, 1)];
    let mut model: Vec<HashMap<u64, Vec<u8>>> = vec![HashMap::new(); 2];
    for (i, &z) in zones.iter().enumerate() {
        engine.create_zone(z).unwrap();
        // Small batches: they go to the primary log and the zone's buffer.
        for c in 0..10u64 {
            let c = cid(9, i as u64 * 1000 + c);
            let p = payload(c, 1, 60);
            engine.append(z, c, &p).unwrap();
            model[i].insert(c, p);
        }
    }
    engine.flush().unwrap();
    let before = engine.stats();
    assert!(
        before.zones.iter().all(|z| z.secondary_buffer_bytes > 0),
        "the test needs buffered entries: {:?}",
        before.zones
    );
    let start = std::time::Instant::now();
    while engine.stats().idle_releases == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no idle release after 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = engine.stats();
    assert!(
        after.zones.iter().all(|z| z.secondary_buffer_bytes == 0),
        "{:?}",
        after.zones
    );
    assert!(after.memory_bytes < before.memory_bytes);
    assert!(after.secondary_bytes_written > before.secondary_bytes_written);
    for (i, &z) in zones.iter().enumerate() {
        assert_same(&read_zone(&engine, z), &model[i], "after the idle release");
    }
    // Appends go on after the release (its buffers come back).
    for c in 10..20u64 {
        let c = cid(9, c);
        let p = payload(c, 2, 60);
        engine.append(zones[0], c, &p).unwrap();
        model[0].insert(c, p);
    }
    engine.flush().unwrap();
    assert_consistent(&engine, "after the idle release and more appends");
    // A power failure now: what was durable is still there after reopening.
    drop(engine);
    mem.crash(7);
    let engine = open(&storage, &config);
    for (i, &z) in zones.iter().enumerate() {
        assert_same(
            &read_zone(&engine, z),
            &model[i],
            "after a crash and reopen",
        );
    }
}
