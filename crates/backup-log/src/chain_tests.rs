//! Chained chunks appended link by link (above half the write buffer): a reorganization
//! pass, an epoch ending or a crash while such a chain is in progress must leave the
//! chunk's previous version complete (or the new one, once its last link is durable),
//! never neither. See "Chained chunks" in docs/log-format.md.
//!
//! The chain is put into the write buffer by the engine's own link-by-link path
//! ([`Inner::push_links`]), stopped before its last link, so a pass runs exactly in the
//! window.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{AppendTicket, LogEngine};
use crate::reorg::Mode;
use crate::storage::{MemStorage, Storage};
use crate::version::Version;
use crate::{LogConfig, RecoveryOptions, ZoneId};

const ZONE: ZoneId = ZoneId { owner: 3, zone: 1 };
const CID: u64 = (3 << 48) | 42;
/// 5 links of at most 8,128 bytes (16 KiB segments): above half the 64 KiB write buffer,
/// so appended link by link.
const CHUNK_BYTES: usize = 40_000;
const LINKS: usize = 5;

/// Small logs (32 segments of 16 KiB), and no pass but those a test runs.
fn config() -> LogConfig {
    LogConfig {
        secondary_log_bytes: 32 * 16384,
        reorg_activation_percent: 100,
        reorg_prompt_percent: 100,
        ..LogConfig::small_for_tests()
    }
}

fn open(storage: &MemStorage, config: &LogConfig) -> LogEngine {
    let storage: Arc<dyn Storage> = Arc::new(storage.clone());
    LogEngine::open(config.clone(), storage).expect("open engine")
}

fn big(tag: u8) -> Vec<u8> {
    (0..CHUNK_BYTES as u32)
        .map(|i| (i.wrapping_mul(31) >> 3) as u8 ^ tag)
        .collect()
}

fn link_bytes(engine: &LogEngine) -> usize {
    engine.config().entry_payload_bytes_max() as usize
}

/// Puts links `0..links` of `payload` as chunk `CID` into the write buffer and waits until
/// they are durable.
fn start_chain(engine: &LogEngine, payload: &[u8], links: usize) -> AppendTicket {
    assert!(payload.len().div_ceil(link_bytes(engine)) == LINKS);
    let z = engine.inner.zone(ZONE).unwrap();
    let t = engine
        .inner
        .push_links(&z, CID, payload, link_bytes(engine), 0..links, None)
        .unwrap();
    engine.wait_durable(t.seq, Duration::from_secs(10)).unwrap();
    t
}

/// Puts the remaining links of the chain `started` and waits until they are durable.
fn finish_chain(engine: &LogEngine, payload: &[u8], from: usize, started: Version) {
    let z = engine.inner.zone(ZONE).unwrap();
    let t = engine
        .inner
        .push_links(
            &z,
            CID,
            payload,
            link_bytes(engine),
            from..LINKS,
            Some(started),
        )
        .unwrap();
    assert_eq!(t.version, started);
    engine.wait_durable(t.seq, Duration::from_secs(10)).unwrap();
}

/// One reorganization pass of `mode` over the zone (every closed segment for
/// `EonVisit` and `Urgent`).
fn pass(engine: &LogEngine, mode: Mode) {
    let before = engine.stats().reorg_passes;
    let z = engine.inner.zone(ZONE).unwrap();
    engine.inner.reorganize(&z, mode).unwrap();
    assert_eq!(engine.stats().reorg_passes, before + 1, "the pass ran");
    // The walker flushes; every link pushed so far is durable already.
    let report = engine.check_consistency().unwrap();
    assert!(report.is_consistent(), "after a {mode:?} pass: {report}");
}

fn read(engine: &LogEngine) -> HashMap<u64, Vec<u8>> {
    let out = parking_lot::Mutex::new(HashMap::new());
    engine
        .recover_zone(ZONE, &RecoveryOptions::from_config(engine.config()), &|b| {
            let mut m = out.lock();
            for c in b {
                assert!(m.insert(c.cid, c.payload.to_vec()).is_none());
            }
        })
        .unwrap();
    out.into_inner()
}

fn assert_chunk(got: &HashMap<u64, Vec<u8>>, want: Option<&[u8]>, context: &str) {
    let got = got.get(&CID).map(Vec::as_slice);
    match (got, want) {
        (None, Some(_)) => panic!("{context}: chunk lost (no complete version)"),
        (Some(g), Some(w)) if g == w => {}
        (Some(g), Some(w)) => panic!(
            "{context}: wrong version ({} bytes, first {:?}; want first {:?})",
            g.len(),
            g.first(),
            w.first()
        ),
        (Some(_), None) => panic!("{context}: removed chunk read back"),
        (None, None) => {}
    }
}

/// Version A durable, then links 0..4 of B durable, then a pass over every segment, then
/// a crash: A must be read back, live and after the reopen.
#[test]
fn a_pass_during_a_chain_keeps_the_previous_version_through_a_crash() {
    for (seed, mode) in [(1, Mode::EonVisit), (2, Mode::Urgent), (3, Mode::EonVisit)] {
        let mem = MemStorage::new();
        let config = config();
        let engine = open(&mem, &config);
        engine.create_zone(ZONE).unwrap();
        let a = big(0xA0);
        let b = big(0xB0);
        engine.append(ZONE, CID, &a).unwrap();
        engine.flush().unwrap();
        let links = if seed == 3 { 1 } else { LINKS - 1 };
        start_chain(&engine, &b, links);
        pass(&engine, mode);
        assert_chunk(
            &read(&engine),
            Some(&a),
            &format!("{mode:?}: live, mid-chain"),
        );
        drop(engine);
        mem.crash(seed);
        let engine = open(&mem, &config);
        assert_chunk(
            &read(&engine),
            Some(&a),
            &format!("{mode:?}: after the crash"),
        );
        // The chunk can be written again, and a pass keeps the new version.
        engine.append(ZONE, CID, &b).unwrap();
        engine.flush().unwrap();
        pass(&engine, Mode::EonVisit);
        assert_chunk(
            &read(&engine),
            Some(&b),
            &format!("{mode:?}: written again"),
        );
    }
}

/// A pass in the window, then the last link: B is read back, live and after a crash; a
/// second pass then drops A (the log holds about one chunk).
#[test]
fn a_chain_finished_after_a_pass_is_read_back_and_replaces_the_old_version() {
    for (seed, mode) in [(4, Mode::Urgent), (5, Mode::EonVisit)] {
        let mem = MemStorage::new();
        let config = config();
        let engine = open(&mem, &config);
        engine.create_zone(ZONE).unwrap();
        let a = big(0xA1);
        let b = big(0xB1);
        engine.append(ZONE, CID, &a).unwrap();
        engine.flush().unwrap();
        let t = start_chain(&engine, &b, LINKS - 1);
        pass(&engine, mode);
        finish_chain(&engine, &b, LINKS - 1, t.version);
        assert_chunk(&read(&engine), Some(&b), &format!("{mode:?}: live"));
        pass(&engine, Mode::EonVisit);
        assert_chunk(
            &read(&engine),
            Some(&b),
            &format!("{mode:?}: after cleaning"),
        );
        let used = engine.stats().zones[0].used_bytes;
        assert!(
            used < (CHUNK_BYTES + CHUNK_BYTES / 2) as u64,
            "{mode:?}: the old version is cleaned away ({used} bytes used)"
        );
        drop(engine);
        mem.crash(seed);
        let engine = open(&mem, &config);
        assert_chunk(
            &read(&engine),
            Some(&b),
            &format!("{mode:?}: after the crash"),
        );
    }
}

/// The normal path: a whole link-by-link append replaces A; a pass drops A.
#[test]
fn a_whole_chain_append_replaces_the_old_version() {
    let mem = MemStorage::new();
    let config = config();
    let engine = open(&mem, &config);
    engine.create_zone(ZONE).unwrap();
    let a = big(0xA2);
    let b = big(0xB2);
    engine.append(ZONE, CID, &a).unwrap();
    let t = engine.append(ZONE, CID, &b).unwrap();
    engine.wait_durable(t.seq, Duration::from_secs(10)).unwrap();
    pass(&engine, Mode::EonVisit);
    assert_chunk(&read(&engine), Some(&b), "live");
    assert!(engine.stats().zones[0].used_bytes < (CHUNK_BYTES + CHUNK_BYTES / 2) as u64);
    drop(engine);
    mem.crash(6);
    let engine = open(&mem, &config);
    assert_chunk(&read(&engine), Some(&b), "after the crash");
}

/// A newer write or a remove of the chunk while its chain is in progress wins over the
/// chain, before and after the chain's last link, live and after a crash.
#[test]
fn a_write_or_remove_during_a_chain_wins_over_it() {
    for remove in [false, true] {
        let mem = MemStorage::new();
        let config = config();
        let engine = open(&mem, &config);
        engine.create_zone(ZONE).unwrap();
        let a = big(0xA3);
        let b = big(0xB3);
        let c = vec![0xC3; 300];
        engine.append(ZONE, CID, &a).unwrap();
        engine.flush().unwrap();
        let t = start_chain(&engine, &b, 2);
        if remove {
            engine.remove(ZONE, CID).unwrap();
        } else {
            engine.append(ZONE, CID, &c).unwrap();
        }
        engine.flush().unwrap();
        let want = (!remove).then_some(c.as_slice());
        pass(&engine, Mode::EonVisit);
        assert_chunk(&read(&engine), want, "live, mid-chain");
        finish_chain(&engine, &b, 2, t.version);
        pass(&engine, Mode::EonVisit);
        assert_chunk(&read(&engine), want, "live, chain done");
        drop(engine);
        mem.crash(7);
        let engine = open(&mem, &config);
        assert_chunk(&read(&engine), want, "after the crash");
    }
}

/// An epoch that ends while a chain of it is in progress reaches the version log only
/// after the chain's last link: before, a compaction could drop an older remove for it,
/// and a pass after a reopen would take the version log's word for a chain that is not
/// there.
#[test]
fn the_version_log_names_a_chain_only_after_its_last_link() {
    let mem = MemStorage::new();
    let config = LogConfig {
        version_buffer_entries_max: 8, // an epoch ends at 5 chunks
        ..config()
    };
    let engine = open(&mem, &config);
    engine.create_zone(ZONE).unwrap();
    engine.append(ZONE, CID, &big(0xA4)).unwrap();
    engine.flush().unwrap();
    let b = big(0xB4);
    let t = start_chain(&engine, &b, 2);
    // Four more chunks end the chain's epoch; two more go into the next one.
    for i in 0..6u64 {
        engine
            .append(ZONE, (3 << 48) | (100 + i), &[i as u8; 64])
            .unwrap();
    }
    engine.flush().unwrap();
    assert_ne!(
        engine.stats().zones[0].epoch,
        t.version.epoch,
        "the epoch ended"
    );
    let names_b = |engine: &LogEngine| {
        let z = engine.inner.zone(ZONE).unwrap();
        let records = z.log.lock().vlog.load().unwrap();
        records
            .iter()
            .any(|r| r.cid == CID && r.state.version == t.version)
    };
    assert!(
        !names_b(&engine),
        "the version log names a chain whose last link is not in"
    );
    finish_chain(&engine, &b, 2, t.version);
    // The next flush writes the epoch.
    engine.append(ZONE, (3 << 48) | 200, &[1; 64]).unwrap();
    engine.flush().unwrap();
    assert!(
        names_b(&engine),
        "the epoch is written once the chain is done"
    );
    assert_chunk(&read(&engine), Some(&b), "live");
}

/// A crash leaves links of an unfinished chain in an epoch no complete entry is from: the
/// reopened zone's epoch must start past it, or a later chain of the chunk could get the
/// same version and be assembled from links of both.
#[test]
fn reopen_starts_past_the_epoch_of_an_unfinished_chain() {
    let mem = MemStorage::new();
    let config = LogConfig {
        version_buffer_entries_max: 8,
        ..config()
    };
    let engine = open(&mem, &config);
    engine.create_zone(ZONE).unwrap();
    engine.append(ZONE, CID, &big(0xA5)).unwrap();
    for i in 0..4u64 {
        engine
            .append(ZONE, (3 << 48) | (100 + i), &[i as u8; 64])
            .unwrap();
    }
    let epoch = engine.stats().zones[0].epoch;
    assert_eq!(epoch, 1, "the first epoch ended");
    engine.flush().unwrap();
    let t = start_chain(&engine, &big(0xB5), 2);
    assert_eq!(t.version.epoch, 1);
    drop(engine);
    mem.crash(8);
    let engine = open(&mem, &config);
    assert_chunk(&read(&engine), Some(&big(0xA5)), "after the crash");
    let epoch = engine.stats().zones[0].epoch;
    assert!(
        Version { epoch, version: 0 }.is_newer_than(t.version),
        "reopened in epoch {epoch}, an unfinished chain has version {:?}",
        t.version
    );
}

/// Eon visits every 4 epochs; an epoch ends at 10 chunks (a visit that re-stamps 12
/// fills the held buffer to 16 at most, so the epoch stays); no pass of the reorganizer
/// thread (it would visit on its own), only those a test runs.
fn eon_config() -> LogConfig {
    LogConfig {
        version_buffer_entries_max: 16,
        eon_visit_epochs: 4,
        reorg_interval: Duration::from_secs(3600),
        ..config()
    }
}

/// Writes small chunks (not `CID`) until the zone's epoch advanced `epochs`: rounds of 11
/// chunks (above the 10 that end an epoch), each round flushed, so the epoch ends once per
/// round (a seal waits for the previous epoch's record to be written, which the flush
/// does) and the log takes the same few bytes each time, whatever the timing.
fn advance_epochs(engine: &LogEngine, epochs: u16) {
    let start = engine.stats().zones[0].epoch;
    let mut rounds = 0u64;
    while engine.stats().zones[0].epoch.wrapping_sub(start) < epochs {
        assert!(rounds < 1000, "the epoch does not advance");
        for i in 0..11u64 {
            engine
                .append(ZONE, (3 << 48) | (1000 + i), &[rounds as u8; 64])
                .unwrap();
        }
        engine.flush().unwrap();
        rounds += 1;
    }
}

/// Links of `CID` in the zone's used segments, counted by version.
fn links_on_disk(engine: &LogEngine) -> HashMap<Version, usize> {
    links_of(engine, CID)
}

/// Links of `cid` in the zone's used segments, counted by version.
fn links_of(engine: &LogEngine, cid: u64) -> HashMap<Version, usize> {
    let z = engine.inner.zone(ZONE).unwrap();
    let (file, segments) = {
        let log = z.log.lock();
        (log.seclog.file(), log.seclog.segments())
    };
    let config = engine.config();
    let segment_bytes = config.segment_bytes as usize;
    let mut buf = crate::storage::AlignedBuf::zeroed(segment_bytes);
    let mut found = HashMap::new();
    for (index, info) in segments.iter().enumerate() {
        if info.used == 0 {
            continue;
        }
        crate::seclog::SecondaryLog::read_segment(
            file.as_ref(),
            segment_bytes,
            index,
            info.used as usize,
            &mut buf,
        )
        .unwrap();
        crate::seclog::scan_segment(
            &buf,
            info.used as usize,
            ZONE.owner,
            config.entry_payload_bytes_max(),
            info.generation,
            true,
            |_, e| {
                if e.header.cid == cid && e.header.chain.is_some() {
                    let v = Version {
                        epoch: e.header.epoch,
                        version: e.header.version,
                    };
                    *found.entry(v).or_insert(0) += 1;
                }
            },
        );
    }
    found
}

/// The only version of `CID` whose links are all on disk.
fn only_version(engine: &LogEngine, context: &str) -> Version {
    let links = links_on_disk(engine);
    assert_eq!(
        links.len(),
        1,
        "{context}: one version of the chain ({links:?})"
    );
    let (&v, &n) = links.iter().next().unwrap();
    assert_eq!(n, LINKS, "{context}: every link once");
    v
}

/// A chained chunk left untouched while the zone's epoch moves on past `eon_visit_epochs`
/// gets a fresh version from an eon visit (its links are written again with it), and the
/// next pass drops the old links; with a crash and reopen between the two passes (both
/// chains complete on disk) the fresh one wins. Then a write of the chunk wins over the
/// refreshed chain, live and after a crash.
#[test]
fn an_eon_visit_refreshes_an_old_chain() {
    for crash_between in [false, true] {
        let mem = MemStorage::new();
        let config = eon_config();
        let mut engine = open(&mem, &config);
        engine.create_zone(ZONE).unwrap();
        let a = big(0xA6);
        engine.append(ZONE, CID, &a).unwrap();
        engine.flush().unwrap();
        let old = only_version(&engine, "written");
        advance_epochs(&engine, 6);
        let visit_epoch = engine.stats().zones[0].epoch;
        pass(&engine, Mode::EonVisit);
        assert_chunk(&read(&engine), Some(&a), "after the visit");
        let links = links_on_disk(&engine);
        let fresh = *links
            .keys()
            .find(|&&v| v != old)
            .unwrap_or_else(|| panic!("the chain was not written again: {links:?}"));
        assert_eq!(
            links[&old], LINKS,
            "the old chain stays until the next pass"
        );
        assert_eq!(links[&fresh], LINKS, "every link with the fresh version");
        assert_eq!(fresh.epoch, visit_epoch, "a fresh epoch");
        assert!(fresh.is_newer_than(old));
        let z = engine.inner.zone(ZONE).unwrap();
        assert!(z.versions.lock().open_chains().is_empty());
        assert_eq!(
            engine
                .inner
                .snapshot_versions(&z)
                .2
                .get(&CID)
                .map(|s| s.version),
            Some(fresh),
            "the fresh version is current"
        );
        drop(z);
        if crash_between {
            drop(engine);
            mem.crash(9);
            engine = open(&mem, &config);
            assert_chunk(&read(&engine), Some(&a), "reopened with both chains");
        }
        pass(&engine, Mode::EonVisit);
        assert_eq!(
            only_version(&engine, "next pass"),
            fresh,
            "the old links are gone"
        );
        assert_chunk(&read(&engine), Some(&a), "after the next pass");
        // A write of the chunk is newer than the refreshed chain.
        let c = vec![0xC6; 300];
        engine.append(ZONE, CID, &c).unwrap();
        engine.flush().unwrap();
        assert_chunk(&read(&engine), Some(&c), "written after the refresh");
        drop(engine);
        mem.crash(10);
        let engine = open(&mem, &config);
        assert_chunk(
            &read(&engine),
            Some(&c),
            "written after the refresh, reopened",
        );
        pass(&engine, Mode::EonVisit);
        assert_chunk(
            &read(&engine),
            Some(&c),
            "written after the refresh, cleaned",
        );
        assert!(
            links_on_disk(&engine).is_empty(),
            "the chain is cleaned away"
        );
    }
}

/// A crash at any point of a visit that refreshes an old chain (the storage stops taking
/// writes after a budget, then loses what was not synced): the reopened zone reads the
/// chunk back whole, and a later visit refreshes it. Some of the cuts must fall between
/// the fresh links.
#[test]
fn a_crash_while_an_old_chain_is_refreshed_keeps_it_whole() {
    let mut partial = 0;
    let mut complete = 0;
    for step in 0..48u64 {
        let mem = MemStorage::new();
        let config = eon_config();
        let engine = open(&mem, &config);
        engine.create_zone(ZONE).unwrap();
        let a = big(0xA7);
        engine.append(ZONE, CID, &a).unwrap();
        engine.flush().unwrap();
        let old = only_version(&engine, "written");
        advance_epochs(&engine, 6);
        mem.set_write_budget(Some(step * 5120));
        let z = engine.inner.zone(ZONE).unwrap();
        let _ = engine.inner.reorganize(&z, Mode::EonVisit);
        drop(z);
        drop(engine);
        mem.crash(100 + step);
        let engine = open(&mem, &config);
        assert_chunk(&read(&engine), Some(&a), &format!("cut at step {step}"));
        let links = links_on_disk(&engine);
        match links.iter().find(|(&v, _)| v != old) {
            Some((_, &n)) if n < LINKS => partial += 1,
            Some(_) => complete += 1,
            None => {}
        }
        advance_epochs(&engine, 6);
        pass(&engine, Mode::EonVisit);
        pass(&engine, Mode::EonVisit);
        assert_chunk(&read(&engine), Some(&a), &format!("step {step}, visited"));
        let v = only_version(&engine, &format!("step {step}, visited"));
        assert!(v.is_newer_than(old), "step {step}: refreshed");
    }
    assert!(partial > 0, "no cut fell between the fresh links");
    assert!(complete > 0, "no cut came after the fresh links");
}

/// An eon visit of a log nearly full of outdated small chunks still refreshes an old chain:
/// the segments it cleaned are freed only once its output is written, so it writes that
/// output first to make room for the fresh links.
#[test]
fn a_visit_of_a_log_full_of_outdated_chunks_refreshes_an_old_chain() {
    let mem = MemStorage::new();
    let config = eon_config();
    let engine = open(&mem, &config);
    engine.create_zone(ZONE).unwrap();
    let a = big(0xA8);
    engine.append(ZONE, CID, &a).unwrap();
    engine.flush().unwrap();
    let old = only_version(&engine, "written");
    advance_epochs(&engine, 6);
    let z = engine.inner.zone(ZONE).unwrap();
    let free = || z.log.lock().seclog.free_segments();
    let mut rounds = 0;
    while free() > 3 {
        assert!(rounds < 10_000, "the log does not fill");
        advance_epochs(&engine, 1);
        rounds += 1;
    }
    pass(&engine, Mode::EonVisit);
    assert_chunk(&read(&engine), Some(&a), "after the visit");
    let links = links_on_disk(&engine);
    let fresh = links.keys().find(|&&v| v != old);
    assert!(
        fresh.is_some_and(|v| v.is_newer_than(old) && links[v] == LINKS),
        "the chain was not written again with {} free segments: {links:?}",
        free()
    );
}

/// Chains that do not fit the refresh budget wait for a later visit; the first chain of a
/// visit is always taken, even above the budget.
#[test]
fn chains_over_the_refresh_budget_wait_for_a_later_visit() {
    const CID2: u64 = (3 << 48) | 43;
    let mem = MemStorage::new();
    let config = LogConfig {
        chain_refresh_bytes: 1,
        ..eon_config()
    };
    let engine = open(&mem, &config);
    engine.create_zone(ZONE).unwrap();
    let (a, b) = (big(0xA9), big(0xB9));
    engine.append(ZONE, CID, &a).unwrap();
    engine.append(ZONE, CID2, &b).unwrap();
    engine.flush().unwrap();
    let old = |cid| *links_of(&engine, cid).keys().next().unwrap();
    let (old_a, old_b) = (old(CID), old(CID2));
    advance_epochs(&engine, 6);
    let refreshed = |engine: &LogEngine| {
        [(CID, old_a), (CID2, old_b)]
            .iter()
            .filter(|&&(cid, old)| {
                links_of(engine, cid)
                    .iter()
                    .any(|(v, &n)| v.is_newer_than(old) && n == LINKS)
            })
            .count()
    };
    pass(&engine, Mode::EonVisit);
    assert_eq!(refreshed(&engine), 1, "one chain per visit");
    pass(&engine, Mode::EonVisit);
    assert_eq!(refreshed(&engine), 2, "the other one in the next visit");
    let got = read(&engine);
    assert_eq!(got.get(&CID), Some(&a));
    assert_eq!(got.get(&CID2), Some(&b));
}

/// A visit that fails while it refreshes a chain (every sync fails) releases the epoch it
/// held and abandons the chain: the zone's epochs go on, and the chunk keeps its old
/// version.
#[test]
fn a_failed_visit_releases_the_epoch_and_abandons_the_chain() {
    let mem = MemStorage::new();
    let config = eon_config();
    let engine = open(&mem, &config);
    engine.create_zone(ZONE).unwrap();
    let a = big(0xAA);
    engine.append(ZONE, CID, &a).unwrap();
    engine.flush().unwrap();
    let old = only_version(&engine, "written");
    advance_epochs(&engine, 6);
    mem.set_fail_sync(true);
    let z = engine.inner.zone(ZONE).unwrap();
    assert!(engine.inner.reorganize(&z, Mode::EonVisit).is_err());
    let vm = z.versions.lock();
    assert!(!vm.epoch_held(), "the epoch is released");
    assert!(vm.open_chains().is_empty(), "the chain is abandoned");
    drop(vm);
    // The RAM part of the versions names no other version of the chunk (its old one is
    // in the version log), and the old chain is whole on disk.
    let ram = engine.inner.snapshot_versions(&z).2;
    assert!(
        ram.get(&CID).is_none_or(|s| s.version == old),
        "the old version stays current: {:?}",
        ram.get(&CID)
    );
    // (Copies the visit wrote before its sync failed may be there twice.)
    mem.set_fail_sync(false);
    let links = links_on_disk(&engine);
    assert!(
        links.get(&old).is_some_and(|&n| n >= LINKS),
        "the old chain is whole: {links:?}"
    );
    assert_chunk(&read(&engine), Some(&a), "after the failed visit");
}
