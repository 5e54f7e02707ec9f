//! Helpers shared by the log engine's integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use myriad_backup_log::{LogConfig, LogEngine, RecoveryOptions, Storage, ZoneId};
use parking_lot::Mutex;

/// Opens an engine over `storage`.
pub fn open(storage: &Arc<dyn Storage>, config: &LogConfig) -> LogEngine {
    LogEngine::open(config.clone(), storage.clone()).expect("open engine")
}

/// Reads a zone back through the recovery API; panics if a chunk is delivered twice.
pub fn read_zone(engine: &LogEngine, zone: ZoneId) -> HashMap<u64, Vec<u8>> {
    read_zone_with(engine, zone, &RecoveryOptions::from_config(engine.config()))
}

/// As [`read_zone`] with options.
pub fn read_zone_with(
    engine: &LogEngine,
    zone: ZoneId,
    options: &RecoveryOptions,
) -> HashMap<u64, Vec<u8>> {
    let out = Mutex::new(HashMap::new());
    let report = engine
        .recover_zone(zone, options, &|batch| {
            let mut m = out.lock();
            for c in batch {
                assert!(
                    m.insert(c.cid, c.payload.to_vec()).is_none(),
                    "chunk {:#x} delivered twice",
                    c.cid
                );
            }
        })
        .expect("recover zone");
    assert_eq!(report.corrupt_segments, 0, "{report:?}");
    let m = out.into_inner();
    assert_eq!(report.chunks as usize, m.len());
    m
}

/// A fresh directory for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("myriad-backup-log-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// A payload that names its chunk and the operation that wrote it.
pub fn payload(cid: u64, op: u64, len: usize) -> Vec<u8> {
    let mut p = format!("{cid}:{op}:").into_bytes();
    let mut x = cid.wrapping_mul(31).wrapping_add(op);
    while p.len() < len {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        p.push((x >> 56) as u8);
    }
    p.truncate(len.max(1));
    p
}

/// The operation number encoded by [`payload`], if the bytes are one of its payloads for
/// `cid` (re-generated and compared in full).
pub fn decode_payload(cid: u64, bytes: &[u8]) -> Option<u64> {
    let text = bytes.split(|&b| b == b':').take(2).collect::<Vec<_>>();
    let c: u64 = std::str::from_utf8(text.first()?).ok()?.parse().ok()?;
    let op: u64 = std::str::from_utf8(text.get(1)?).ok()?.parse().ok()?;
    (c == cid && payload(cid, op, bytes.len()) == bytes).then_some(op)
}

/// Compares a recovered zone with the model, describing the first differences briefly.
pub fn assert_same(got: &HashMap<u64, Vec<u8>>, want: &HashMap<u64, Vec<u8>>, context: &str) {
    if got == want {
        return;
    }
    let mut lines = Vec::new();
    for (cid, v) in want {
        match got.get(cid) {
            None => lines.push(format!(
                "missing {cid:#x} (want op {:?})",
                decode_payload(*cid, v)
            )),
            Some(g) if g != v => lines.push(format!(
                "{cid:#x}: got op {:?}, want op {:?}",
                decode_payload(*cid, g),
                decode_payload(*cid, v)
            )),
            _ => {}
        }
    }
    for (cid, g) in got {
        if !want.contains_key(cid) {
            lines.push(format!("extra {cid:#x} (op {:?})", decode_payload(*cid, g)));
        }
    }
    lines.sort();
    lines.truncate(12);
    panic!(
        "{context}: got {} chunks, want {}; {}",
        got.len(),
        want.len(),
        lines.join("; ")
    );
}

/// Runs the engine's consistency walker (flushes first; no appends may run) and panics
/// with its report if an invariant is broken.
pub fn assert_consistent(engine: &LogEngine, context: &str) {
    let report = engine.check_consistency().expect("consistency check");
    assert!(report.is_consistent(), "{context}: {report}");
    assert!(
        report.zones > 0 || engine.zones().is_empty(),
        "{context}: walked nothing"
    );
}
