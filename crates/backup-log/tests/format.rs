//! On-disk format compatibility: logs written by an earlier format version (kept as small
//! fixtures in `tests/fixtures/`) open with this code and read back every chunk.
//!
//! The fixtures are the files of a `MemStorage` after a deterministic workload
//! ([`clean_workload`], [`crash_workload`]), each cut after its last page that is not all
//! zeros (the engine extends a file to its configured size when it opens it). They were
//! written by [`generate_fixtures`] with the code of their format version; the expected
//! chunks are derived from the same workload functions, so they must not change.
//!
//! To write a new set (for a new format version, into a new directory):
//! `MYRIAD_WRITE_FIXTURES=/path/to/dir cargo test -p myriad-backup-log --test format
//! generate_fixtures`.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{open, payload, read_zone};
use myriad_backup_log::{
    LogConfig, LogEngine, LogError, MemStorage, Storage, ZoneId, FORMAT_VERSION, PAGE_BYTES,
};

/// The zones of the fixtures.
const ZONES: [ZoneId; 2] = [
    ZoneId { owner: 1, zone: 0 },
    ZoneId {
        owner: 0x2a,
        zone: 3,
    },
];

/// Every zone's chunks.
type Zones = HashMap<ZoneId, HashMap<u64, Vec<u8>>>;

/// One operation: `(zone index, cid, Some(payload) | None for a remove)`.
type Op = (usize, u64, Option<Vec<u8>>);

/// The configuration the fixtures were written with (small segments; flushes only when
/// asked, so the files hold few version-log pages).
fn fixture_config() -> LogConfig {
    LogConfig {
        flush_interval: Duration::from_secs(3600),
        reorg_interval: Duration::from_secs(3600),
        ..LogConfig::small_for_tests()
    }
}

fn cid(zone: ZoneId, local: u64) -> u64 {
    (u64::from(zone.owner) << 48) | local
}

/// A deterministic pseudo-random sequence (no dependency whose output could change).
fn lcg(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move |bound| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % bound
    }
}

/// The workload of the cleanly closed fixture, in sessions (the engine is shut down and
/// reopened between them, so the version log is compacted once). Per zone: a bulk load
/// of 16 consecutive chunks of one length (run entries), then writes and removes of 30
/// chunks, one of them above an entry's limit (chained).
fn clean_workload() -> Vec<Vec<Op>> {
    let mut sessions = Vec::new();
    let mut op = 0u64;
    for session in 0..2u64 {
        let mut ops = Vec::new();
        let mut next = lcg(session + 1);
        for (zi, &z) in ZONES.iter().enumerate() {
            if session == 0 {
                for local in 100..116 {
                    let c = cid(z, local);
                    ops.push((zi, c, Some(payload(c, op, 64))));
                    op += 1;
                }
            }
            for i in 0..25u64 {
                let c = cid(
                    z,
                    if zi == 0 && session == 0 && i == 7 {
                        77
                    } else {
                        next(30)
                    },
                );
                let value = if c == cid(z, 77) {
                    Some(payload(c, op, 9_000))
                } else if next(100) < 12 {
                    None
                } else {
                    Some(payload(c, op, 24 + next(150) as usize))
                };
                ops.push((zi, c, value));
                op += 1;
            }
        }
        // A small batch last: it stays in the primary log (and the zone's secondary-log
        // buffer) at shutdown.
        for (zi, &z) in ZONES.iter().enumerate() {
            for local in 200..203 {
                let c = cid(z, local + session);
                ops.push((zi, c, Some(payload(c, op, 50))));
                op += 1;
            }
        }
        sessions.push(ops);
    }
    sessions
}

/// The workload of the crash fixture: ops acknowledged durable, then ops of other chunks
/// that may or may not have survived the crash.
fn crash_workload() -> (Vec<Op>, Vec<Op>) {
    let z = ZONES[0];
    let mut next = lcg(99);
    let mut op = 1_000_000u64;
    let mut durable = Vec::new();
    for _ in 0..40 {
        let c = cid(z, next(30));
        let value = (next(100) >= 10).then(|| payload(c, op, 24 + next(200) as usize));
        durable.push((0, c, value));
        op += 1;
    }
    let mut after = Vec::new();
    for local in 500..510 {
        let c = cid(z, local);
        after.push((0, c, Some(payload(c, op, 40 + next(60) as usize))));
        op += 1;
    }
    (durable, after)
}

fn apply(engine: &LogEngine, ops: &[Op]) {
    for (i, (zi, c, value)) in ops.iter().enumerate() {
        match value {
            Some(p) => engine.append(ZONES[*zi], *c, p).expect("append"),
            None => engine.remove(ZONES[*zi], *c).expect("remove"),
        };
        if i % 50 == 49 || i + 7 == ops.len() {
            engine.flush().expect("flush");
        }
    }
}

/// Each zone's chunks after `ops`.
fn model<'a>(ops: impl IntoIterator<Item = &'a Op>) -> Zones {
    let mut m: Zones = HashMap::new();
    for (zi, c, value) in ops {
        let zone = m.entry(ZONES[*zi]).or_default();
        match value {
            Some(p) => zone.insert(*c, p.clone()),
            None => zone.remove(c),
        };
    }
    m
}

fn fixtures_dir(set: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(set)
}

/// Writes every file of `storage` into `dir`, cut after its last page holding a non-zero
/// byte.
fn dump(storage: &MemStorage, dir: &Path) {
    std::fs::create_dir_all(dir).expect("create fixture dir");
    for name in storage.list().expect("list") {
        let file = storage.open(&name, 0).expect("open");
        let mut bytes = vec![0u8; file.len() as usize];
        file.read_at(&mut bytes, 0).expect("read");
        let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        bytes.truncate(end.div_ceil(PAGE_BYTES) * PAGE_BYTES);
        std::fs::write(dir.join(&name), &bytes).expect("write fixture");
    }
}

/// A `MemStorage` holding the files of fixture directory `dir`, as synced content.
fn load(dir: &Path) -> MemStorage {
    let storage = MemStorage::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("fixture dir {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    names.sort();
    for path in names {
        let bytes = std::fs::read(&path).expect("read fixture");
        assert_eq!(
            bytes.len() % PAGE_BYTES,
            0,
            "{} is whole pages",
            path.display()
        );
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("file name");
        let file = storage.open(name, bytes.len() as u64).expect("open");
        if !bytes.is_empty() {
            file.write_at(&bytes, 0).expect("write");
        }
        file.sync().expect("sync");
    }
    storage
}

/// Writes the fixture sets into `$MYRIAD_WRITE_FIXTURES` (nothing without it).
#[test]
fn generate_fixtures() {
    let Ok(out) = std::env::var("MYRIAD_WRITE_FIXTURES") else {
        return;
    };
    let out = PathBuf::from(out);
    let config = fixture_config();
    // Closed cleanly, after two sessions.
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    for (session, ops) in clean_workload().iter().enumerate() {
        let engine = open(&storage, &config);
        if session == 0 {
            for z in ZONES {
                engine.create_zone(z).expect("create zone");
            }
        }
        apply(&engine, ops);
        engine.shutdown().expect("shutdown");
    }
    dump(&mem, &out.join("clean"));
    // Crashed after unsynced writes.
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let engine = open(&storage, &config);
    engine.create_zone(ZONES[0]).expect("create zone");
    let (durable, after) = crash_workload();
    apply(&engine, &durable);
    engine.flush().expect("flush");
    for (zi, c, value) in &after {
        engine
            .append(ZONES[*zi], *c, value.as_deref().expect("a write"))
            .expect("append");
    }
    drop(engine);
    mem.crash(5);
    dump(&mem, &out.join("crashed"));
}

/// Opens a fixture set with this code and reads back every zone (once more after a
/// restart, which rewrites the files in this code's format).
fn read_fixture(set: &str) -> (Vec<ZoneId>, [Zones; 2]) {
    let mem = load(&fixtures_dir(set));
    let storage: Arc<dyn Storage> = Arc::new(mem);
    let config = fixture_config();
    let mut reads = [HashMap::new(), HashMap::new()];
    let mut zones = Vec::new();
    for read in &mut reads {
        let engine = open(&storage, &config);
        zones = engine.zones();
        for &z in &zones {
            read.insert(z, read_zone(&engine, z));
        }
        engine.shutdown().expect("shutdown");
    }
    (zones, reads)
}

#[test]
fn format_0_fixture_closed_cleanly_reads_back_every_chunk() {
    let (zones, reads) = read_fixture("format-0/clean");
    assert_eq!(zones, ZONES.to_vec());
    let want = model(clean_workload().iter().flatten());
    assert!(
        want[&ZONES[0]].values().any(|v| v.len() > 8192),
        "the fixture holds a chained chunk"
    );
    for read in &reads {
        for z in ZONES {
            common::assert_same(&read[&z], &want[&z], &format!("zone {z}"));
        }
    }
}

#[test]
fn format_0_fixture_after_a_crash_reads_back_every_durable_chunk() {
    let (zones, reads) = read_fixture("format-0/crashed");
    assert_eq!(zones, vec![ZONES[0]]);
    let (durable, after) = crash_workload();
    let want = &model(&durable)[&ZONES[0]];
    let maybe = &model(&after)[&ZONES[0]];
    for read in &reads {
        let got = &read[&ZONES[0]];
        for (c, value) in got {
            let ok = want.get(c) == Some(value) || maybe.get(c) == Some(value);
            assert!(ok, "chunk {c:#x}: a value that was never written");
        }
        for (c, value) in want {
            assert_eq!(got.get(c), Some(value), "durable chunk {c:#x}");
        }
    }
    // Both reads agree (the second one read the files the first reopen rewrote).
    assert_eq!(reads[0], reads[1]);
}

/// The first page of file `name` of `storage`.
fn first_page(storage: &MemStorage, name: &str) -> Vec<u8> {
    let file = storage.open(name, 0).expect("open");
    let mut page = vec![0u8; PAGE_BYTES];
    file.read_at(&mut page, 0).expect("read");
    page
}

fn word(page: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(page[at..at + 4].try_into().expect("4 bytes"))
}

#[test]
fn files_written_now_carry_the_format_version() {
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let config = fixture_config();
    let engine = open(&storage, &config);
    let z = ZONES[0];
    engine.create_zone(z).expect("create zone");
    let c = cid(z, 1);
    engine.append(z, c, &payload(c, 1, 5000)).expect("append");
    engine.remove(z, cid(z, 2)).expect("remove");
    engine.shutdown().expect("shutdown");
    // Segment header: magic, generation, format version, CRC.
    let sec = first_page(&mem, "zone-0001-0000.sec");
    assert_eq!(&sec[0..4], b"MSEG");
    assert_eq!(word(&sec, 8), FORMAT_VERSION);
    let primary = first_page(&mem, "primary.log");
    assert_eq!(&primary[0..4], b"MPRI");
    assert_eq!(word(&primary, 8), FORMAT_VERSION);
    // Version-log block: magic, generation, count (24 bits) | format version << 24.
    let ver = first_page(&mem, "zone-0001-0000.ver.0");
    assert_eq!(&ver[0..4], b"MVLB");
    assert_eq!(u32::from(ver[11]), FORMAT_VERSION);
    // And the format-0 files the fixtures hold have 0 there.
    let old = load(&fixtures_dir("format-0/clean"));
    assert_eq!(word(&first_page(&old, "zone-0001-0000.sec"), 8), 0);
    assert_eq!(word(&first_page(&old, "primary.log"), 8), 0);
    assert_eq!(first_page(&old, "zone-0001-0000.ver.0")[11], 0);
}

/// Writes `page` as the first page of file `name` of `storage`.
fn put_first_page(storage: &MemStorage, name: &str, page: &[u8]) {
    let file = storage.open(name, 0).expect("open");
    file.write_at(page, 0).expect("write");
    file.sync().expect("sync");
}

/// Rewrites a first page with another format version.
type Patch = fn(&mut [u8], u32);

#[test]
fn a_newer_format_version_is_refused_with_a_typed_error() {
    let newer = FORMAT_VERSION + 1;
    // (file, patch of its first page: a valid header or block of the newer version).
    let cases: [(&str, Patch); 3] = [
        ("zone-002a-0003.sec", |page, v| {
            page[8..12].copy_from_slice(&v.to_le_bytes());
            let crc = crc32c::crc32c(&page[0..12]);
            page[12..16].copy_from_slice(&crc.to_le_bytes());
        }),
        ("primary.log", |page, v| {
            page[8..12].copy_from_slice(&v.to_le_bytes());
            let crc = crc32c::crc32c(&page[0..12]);
            page[12..16].copy_from_slice(&crc.to_le_bytes());
        }),
        // The first block of `.ver.0` holds no records: its CRC covers bytes 0..12.
        ("zone-002a-0003.ver.0", |page, v| {
            assert_eq!(word(page, 8) & 0xFF_FFFF, 0, "an empty block");
            page[11] = v as u8;
            let crc = crc32c::crc32c(&page[0..12]);
            page[12..16].copy_from_slice(&crc.to_le_bytes());
        }),
    ];
    for (name, patch) in cases {
        let mem = load(&fixtures_dir("format-0/clean"));
        let mut page = first_page(&mem, name);
        patch(&mut page, newer);
        put_first_page(&mem, name, &page);
        let storage: Arc<dyn Storage> = Arc::new(mem);
        match LogEngine::open(fixture_config(), storage) {
            Err(LogError::UnsupportedFormat {
                file,
                version,
                supported,
            }) => {
                assert_eq!(file, name);
                assert_eq!((version, supported), (newer, FORMAT_VERSION), "{name}");
            }
            other => panic!("{name}: opened a newer format: {:?}", other.map(|_| ())),
        }
    }
}
