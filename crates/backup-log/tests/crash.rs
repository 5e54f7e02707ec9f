//! Crash consistency: writes cut at random points (fault-injecting storage) and a real
//! child process killed with SIGKILL mid-write. After reopening, every chunk must hold the
//! value of its last append acknowledged durable, or of a later append (or be absent after
//! a later remove) — never an older or corrupt value, and never a value not written.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_consistent, decode_payload, open, payload, read_zone, temp_dir};
use myriad_backup_log::{DiskStorage, IoMode, LogConfig, MemStorage, Storage, ZoneId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// One operation of a deterministic workload: `(zone index, cid, Some(payload) | None)`.
///
/// Every third block of 16 ops is a bulk write: 16 consecutive CIDs of one length in one
/// zone (from a range only such blocks use, so their versions move together), which the
/// secondary logs store as run entries.
fn workload_op(op: u64, zones: usize) -> (usize, u64, Option<Vec<u8>>) {
    let block = op / 16;
    if block.is_multiple_of(3) {
        let mut rng = SmallRng::seed_from_u64(block ^ 0xB01C);
        let z = rng.gen_range(0..zones);
        let base = 1000 + rng.gen_range(0..8u64) * 16;
        let len = rng.gen_range(24..200);
        let cid = (1u64 << 48) | (z as u64) << 20 | (base + op % 16);
        return (z, cid, Some(payload(cid, op, len)));
    }
    let mut rng = SmallRng::seed_from_u64(op);
    let z = rng.gen_range(0..zones);
    let cid = (1u64 << 48) | (z as u64) << 20 | rng.gen_range(0..120u64);
    if rng.gen_bool(0.1) {
        (z, cid, None)
    } else {
        let len = if rng.gen_bool(0.02) {
            9000
        } else {
            rng.gen_range(24..300)
        };
        (z, cid, Some(payload(cid, op, len)))
    }
}

/// Checks a recovered state against the workload: ops `0..acked` were acknowledged durable,
/// ops `acked..issued` may or may not have reached the disk.
fn check_prefix(
    recovered: &HashMap<ZoneId, HashMap<u64, Vec<u8>>>,
    zones: &[ZoneId],
    acked: u64,
    issued: u64,
) {
    // Per chunk: the last acknowledged op and every later op.
    let mut last_acked: HashMap<u64, (usize, Option<u64>)> = HashMap::new();
    let mut later: HashMap<u64, Vec<Option<u64>>> = HashMap::new();
    for op in 0..issued {
        let (z, cid, p) = workload_op(op, zones.len());
        let value = p.map(|_| op);
        if op < acked {
            last_acked.insert(cid, (z, value));
        } else {
            later.entry(cid).or_default().push(value);
        }
    }
    for (&cid, &(z, value)) in &last_acked {
        let got = recovered[&zones[z]].get(&cid).map(|v| {
            decode_payload(cid, v).unwrap_or_else(|| panic!("chunk {cid:#x}: corrupt value"))
        });
        let allowed = got == value || later.get(&cid).is_some_and(|l| l.contains(&got));
        assert!(
            allowed,
            "chunk {cid:#x}: got op {got:?}, last acked {value:?}, later {:?}",
            later.get(&cid)
        );
    }
    for (zi, z) in zones.iter().enumerate() {
        for (&cid, v) in &recovered[z] {
            let op = decode_payload(cid, v).expect("a value that was written");
            let (wz, wcid, p) = workload_op(op, zones.len());
            assert!(wz == zi && wcid == cid && p.is_some(), "foreign value");
        }
    }
}

#[test]
fn writes_cut_at_random_points_reopen_to_an_acknowledged_prefix() {
    let zones = [ZoneId { owner: 1, zone: 0 }, ZoneId { owner: 1, zone: 1 }];
    for seed in 0..16u64 {
        let mem = MemStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(mem.clone());
        let mut config = LogConfig::small_for_tests();
        if seed.is_multiple_of(3) {
            config.secondary_buffer_bytes = 0; // one-level logging
        }
        // Secondary-log writes by the writer thread itself, or in flight on 1 or 2 I/O
        // threads (a write that fails there is seen by the next sync).
        config.write_threads = (seed % 4).min(2) as usize;
        let engine = open(&storage, &config);
        for z in zones {
            engine.create_zone(z).unwrap();
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        let cut_after_op = rng.gen_range(200..2500u64);
        let mut acked = 0;
        let mut issued = 0;
        for op in 0..3000u64 {
            if op == cut_after_op {
                // From now on the disk takes a few more bytes and then fails.
                mem.set_write_budget(Some(rng.gen_range(0..40_000)));
            }
            let (z, cid, p) = workload_op(op, zones.len());
            let ticket = match &p {
                Some(p) => engine.append(zones[z], cid, p),
                None => engine.remove(zones[z], cid),
            };
            let Ok(ticket) = ticket else { break };
            issued = op + 1;
            if op.is_multiple_of(37) || op + 1 == cut_after_op {
                match engine.wait_durable(ticket.seq, Duration::from_secs(10)) {
                    Ok(()) => acked = op + 1,
                    Err(_) => break,
                }
            }
        }
        drop(engine);
        mem.crash(seed);
        let engine = open(&storage, &config);
        let recovered: HashMap<ZoneId, HashMap<u64, Vec<u8>>> =
            zones.iter().map(|&z| (z, read_zone(&engine, z))).collect();
        eprintln!("seed {seed}: cut after op {cut_after_op}, acked {acked}, issued {issued}");
        check_prefix(&recovered, &zones, acked, issued);
        assert!(acked > 0, "seed {seed}: something was acknowledged");
        assert_consistent(&engine, &format!("seed {seed}, reopened after the cut"));
    }
}

const CHILD_ENV: &str = "MYRIAD_LOG_CRASH_CHILD_DIR";

/// In the child process: run the workload on disk, printing each acknowledged op count.
/// In the parent (a normal test run): nothing.
#[test]
fn crash_child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let zones = [ZoneId { owner: 1, zone: 0 }, ZoneId { owner: 1, zone: 1 }];
    let storage: Arc<dyn Storage> = Arc::new(DiskStorage::new(&dir, IoMode::Auto).unwrap());
    let config = LogConfig {
        secondary_log_bytes: 64 * 65536,
        segment_bytes: 65536,
        write_buffer_bytes: 1 << 20,
        primary_log_bytes: 4 << 20,
        secondary_buffer_bytes: 8192,
        flush_interval: Duration::from_millis(2),
        ..LogConfig::small_for_tests()
    };
    let engine = open(&storage, &config);
    for z in zones {
        engine.create_zone(z).unwrap();
    }
    println!("READY");
    for op in 0.. {
        let (z, cid, p) = workload_op(op, zones.len());
        let ticket = match &p {
            Some(p) => engine.append(zones[z], cid, p).unwrap(),
            None => engine.remove(zones[z], cid).unwrap(),
        };
        println!("ISSUED {}", op + 1);
        if op.is_multiple_of(50) {
            engine
                .wait_durable(ticket.seq, Duration::from_secs(10))
                .unwrap();
            println!("ACKED {}", op + 1);
        }
    }
}

#[test]
fn process_killed_with_sigkill_mid_write_reopens_to_an_acknowledged_prefix() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let zones = [ZoneId { owner: 1, zone: 0 }, ZoneId { owner: 1, zone: 1 }];
    for round in 0..2u64 {
        let dir = temp_dir(&format!("sigkill-{round}"));
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_child_writer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut acked = 0u64;
        let mut issued = 0u64;
        let kill_at = Instant::now() + Duration::from_millis(400 + 300 * round);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < kill_at || acked < 200 {
            assert!(Instant::now() < deadline, "child made no progress");
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(10)) {
                if let Some(n) = line.strip_prefix("ACKED ") {
                    acked = n.parse().unwrap();
                } else if let Some(n) = line.strip_prefix("ISSUED ") {
                    issued = n.parse().unwrap();
                }
            }
        }
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        for line in rx.iter() {
            if let Some(n) = line.strip_prefix("ACKED ") {
                acked = n.parse().unwrap();
            } else if let Some(n) = line.strip_prefix("ISSUED ") {
                issued = n.parse().unwrap();
            }
        }
        reader.join().unwrap();
        // The child may have issued one more op than it printed.
        issued += 1;
        let storage: Arc<dyn Storage> = Arc::new(DiskStorage::new(&dir, IoMode::Auto).unwrap());
        let config = LogConfig {
            secondary_log_bytes: 64 * 65536,
            segment_bytes: 65536,
            write_buffer_bytes: 1 << 20,
            primary_log_bytes: 4 << 20,
            secondary_buffer_bytes: 8192,
            ..LogConfig::small_for_tests()
        };
        let engine = open(&storage, &config);
        let recovered: HashMap<ZoneId, HashMap<u64, Vec<u8>>> =
            zones.iter().map(|&z| (z, read_zone(&engine, z))).collect();
        check_prefix(&recovered, &zones, acked, issued);
        assert_consistent(&engine, &format!("round {round}, reopened after SIGKILL"));
        drop(engine);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn failed_sync_is_never_acknowledged_and_stops_the_engine() {
    // Two-level logging (small batches: primary log, synced by the writer) and one-level
    // logging (every batch to its secondary log, synced by the syncer thread).
    for one_level in [false, true] {
        failed_sync_case(one_level);
    }
}

fn failed_sync_case(one_level: bool) {
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let mut config = LogConfig::small_for_tests();
    if one_level {
        config.secondary_buffer_bytes = 0;
    }
    let engine = open(&storage, &config);
    let z = ZoneId { owner: 2, zone: 0 };
    engine.create_zone(z).unwrap();
    let before = engine
        .append(z, (2u64 << 48) | 1, b"durable before the fault")
        .unwrap();
    engine
        .wait_durable(before.seq, Duration::from_secs(10))
        .unwrap();
    mem.set_fail_sync(true);
    let after = engine
        .append(z, (2u64 << 48) | 2, b"never durable")
        .unwrap();
    assert!(engine
        .wait_durable(after.seq, Duration::from_secs(10))
        .is_err());
    assert!(engine.durable_seq() < after.seq);
    assert!(
        engine.append(z, (2u64 << 48) | 3, b"refused").is_err(),
        "a failed engine refuses appends"
    );
    drop(engine);
    mem.crash(7);
    let engine = open(&storage, &config);
    let got = read_zone(&engine, z);
    assert_eq!(
        got.get(&((2u64 << 48) | 1)).map(Vec::as_slice),
        Some(&b"durable before the fault"[..])
    );
    assert!(!got.contains_key(&((2u64 << 48) | 3)));
    assert_consistent(&engine, "reopened after a failed sync");
}
