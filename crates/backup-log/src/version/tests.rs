//! Tests of the version manager, the version log and its blocks.

use super::blocks::*;
use super::manager::Slot;
use super::*;
use crate::header::VERSION_IN_EPOCH_MAX;
use crate::storage::{round_up_to_page, Storage, PAGE_BYTES};

#[test]
fn slot_packs_version_and_deleted_flag() {
    assert_eq!(std::mem::size_of::<Slot>(), 16);
    for version in [0, 1, 0x7F_FFFF, VERSION_IN_EPOCH_MAX] {
        for deleted in [false, true] {
            let slot = Slot::new(version, deleted);
            assert_eq!((slot.version(), slot.deleted()), (version, deleted));
        }
    }
}
use crate::storage::MemStorage;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// Model: unbounded epoch counter, every assignment is a (u64 epoch, version).
#[derive(Default)]
struct Model {
    epoch: u64,
    current: HashMap<u64, ((u64, u32), bool)>,
}

#[test]
fn version_manager_matches_model_across_epoch_and_eon_wrap() {
    let mut rng = SmallRng::seed_from_u64(5);
    // Start just before the eon boundary and run across two full wraps of the 16-bit
    // epoch with a tiny buffer so epochs end every few operations.
    let start_epoch: u16 = u16::MAX - 50;
    let mut vm = VersionManager::new(start_epoch, 3, 4);
    let mut model = Model {
        epoch: u64::from(start_epoch),
        ..Model::default()
    };
    let mut persisted: CidMap<VersionState> = CidMap::default();
    let mut ops = 0u64;
    while model.epoch < u64::from(start_epoch) + 2 * 65_536 + 100 {
        ops += 1;
        let cid = rng.gen_range(0..6u64);
        let remove = rng.gen_bool(0.2);
        let assigned = if remove {
            vm.assign_remove(cid, ops)
        } else {
            vm.assign_put(cid, ops)
        };
        let v = match assigned {
            Ok(v) => v,
            Err(AssignBlocked::SealPending) => {
                // The flusher persists the sealed epoch, then the append retries.
                let sealed = vm.sealed().cloned().unwrap();
                for r in sealed.records.iter() {
                    merge(&mut persisted, r.cid, r.state);
                }
                vm.sealed_written(sealed.epoch);
                if remove {
                    vm.assign_remove(cid, ops).unwrap()
                } else {
                    vm.assign_put(cid, ops).unwrap()
                }
            }
        };
        // Model: epochs advance in lock step with the manager.
        let vm_epoch_of_v = u64::from(v.epoch);
        while (model.epoch & 0xFFFF) != vm_epoch_of_v {
            model.epoch += 1;
        }
        let mv = (model.epoch, v.version);
        if let Some((old, _)) = model.current.get(&cid) {
            assert!(mv > *old, "model order");
            // The manager's serial order agrees with the model's total order.
            let old_v = Version {
                epoch: old.0 as u16,
                version: old.1,
            };
            if model.epoch - old.0 < u64::from(EON_EPOCHS) {
                assert!(v.is_newer_than(old_v), "{v:?} newer than {old_v:?}");
                assert!(!old_v.is_newer_than(v));
            }
        }
        model.current.insert(cid, (mv, remove));
        // Visiting every "log" once per eon: re-stamp chunks whose version is old.
        if ops.is_multiple_of(97) {
            let snapshot_epoch = vm.epoch();
            for (&c, &((e, ver), deleted)) in model.current.clone().iter() {
                if !deleted && model.epoch - e > 1000 {
                    let expected = Version {
                        epoch: e as u16,
                        version: ver,
                    };
                    let state = VersionState {
                        version: expected,
                        deleted: false,
                    };
                    if let Some(nv) = vm.restamp(c, state, snapshot_epoch) {
                        assert!(nv.is_newer_than(expected));
                        assert_eq!(u64::from(nv.epoch), model.epoch & 0xFFFF);
                        model.current.insert(c, ((model.epoch, nv.version), false));
                    }
                }
            }
        }
        // The persisted log plus the RAM part always name the model's current version.
        let mut table = persisted.clone();
        vm.snapshot_into(&mut table);
        for (&c, &((e, ver), deleted)) in &model.current {
            let got = table.get(&c).copied().unwrap();
            assert_eq!(got.version.epoch, e as u16, "cid {c}");
            assert_eq!(got.version.version, ver);
            assert_eq!(got.deleted, deleted);
        }
    }
    assert!(vm.epoch() > start_epoch.wrapping_add(100) || vm.epoch() < 1000);
}

fn snapshot(vm: &VersionManager) -> CidMap<VersionState> {
    let mut table = CidMap::default();
    vm.snapshot_into(&mut table);
    table
}

fn put(version: Version) -> VersionState {
    VersionState {
        version,
        deleted: false,
    }
}

/// An eon visit's fresh version of an old chained chunk counts only once finished;
/// abandoned, it never counts, is not handed out again and stays out of the version
/// log; a write of the chunk meanwhile is newer either way.
#[test]
fn a_refreshed_chain_counts_only_once_finished() {
    let old = put(Version {
        epoch: 1,
        version: 0,
    });
    for outcome in ["finish", "abandon", "abandon sealed", "write"] {
        let mut vm = VersionManager::new(9, 6, 8);
        vm.hold_epoch(true);
        let fresh = vm.restamp_chain(7, old, 9).unwrap();
        assert_eq!(fresh.epoch, 9);
        assert!(
            vm.restamp_chain(7, old, 9).is_none(),
            "{outcome}: one at a time"
        );
        assert_eq!(snapshot(&vm).get(&7), Some(&old), "{outcome}: open");
        assert_eq!(vm.chain_links(), vec![(7, fresh)]);
        match outcome {
            "finish" => {
                vm.finish_chain(7, fresh);
                assert_eq!(snapshot(&vm).get(&7), Some(&put(fresh)));
                assert!(vm.seal());
                assert!(vm.sealed_ready(0).unwrap().records[0].state == put(fresh));
            }
            "abandon" => {
                vm.abandon_chain(7, fresh);
                assert!(vm.open_chains().is_empty());
                assert_eq!(snapshot(&vm).get(&7), Some(&old), "{outcome}");
                // Not re-stamped again while hidden; a write gets a newer version.
                assert!(vm.restamp(7, old, 9).is_none());
                vm.assign_put(8, 1).unwrap();
                assert!(vm.seal());
                let sealed = vm.sealed_ready(1).unwrap();
                assert!(sealed.records.iter().all(|r| r.cid != 7), "{outcome}");
                vm.sealed_written(9);
                assert!(vm.assign_put(7, 2).unwrap().is_newer_than(fresh));
            }
            "abandon sealed" => {
                assert!(vm.seal());
                assert!(vm.sealed_ready(0).is_none(), "waits for the chain");
                vm.abandon_chain(7, fresh);
                let sealed = vm.sealed_ready(0).unwrap();
                assert!(sealed.records.iter().all(|r| r.cid != 7), "{outcome}");
                assert_eq!(snapshot(&vm).get(&7), None, "{outcome}: the log's state");
            }
            _ => {
                let newer = vm.assign_put(7, 1).unwrap();
                assert!(newer.is_newer_than(fresh));
                assert_eq!(snapshot(&vm).get(&7), Some(&put(newer)));
                vm.abandon_chain(7, fresh);
                assert_eq!(snapshot(&vm).get(&7), Some(&put(newer)), "{outcome}");
            }
        }
    }
}

/// An open chain shows the state before it (from the buffer, the sealed epoch or the
/// version log), holds its sealed epoch back, refuses re-stamping, and counts from
/// its last link on; a newer write of the chunk shows at once.
#[test]
fn an_open_chain_shows_the_state_before_it_until_its_last_link() {
    let mut vm = VersionManager::new(0, 3, 8);
    let a = vm.assign_put(1, 1).unwrap();
    // Prior from the buffer.
    let b = vm.assign_chain(1, 2).unwrap();
    assert!(b.is_newer_than(a));
    assert_eq!(snapshot(&vm).get(&1), Some(&put(a)));
    assert_eq!(vm.restamp(1, put(a), 0), None, "no re-stamping mid-chain");
    // Prior unknown to the RAM: left to the version log.
    let c = vm.assign_chain(2, 3).unwrap();
    assert_eq!(snapshot(&vm).get(&2), None);
    // The epoch ends (3 chunks); the sealed epoch waits for both chains.
    vm.assign_put(3, 4).unwrap();
    assert_eq!(vm.epoch(), 1);
    assert!(vm.sealed_ready(u64::MAX).is_none());
    assert_eq!(snapshot(&vm).get(&1), Some(&put(a)));
    // A second chain of chunk 1, started while the first is open, has the same
    // prior; its last link first.
    let d = vm.assign_chain(1, 5).unwrap();
    assert_eq!(snapshot(&vm).get(&1), Some(&put(a)));
    vm.close_chain(1, d, 6);
    assert_eq!(snapshot(&vm).get(&1), Some(&put(d)));
    vm.close_chain(1, b, 7);
    vm.note_seq(b.epoch, 7);
    assert!(
        vm.sealed_ready(u64::MAX).is_none(),
        "chunk 2's chain is open"
    );
    vm.close_chain(2, c, 8);
    vm.note_seq(c.epoch, 8);
    assert!(vm.sealed_ready(7).is_none(), "its last link is not durable");
    assert_eq!(vm.sealed_ready(8).map(|s| s.epoch), Some(0));
    assert_eq!(snapshot(&vm).get(&2), Some(&put(c)));
    assert_eq!(vm.chain_links().len(), 3);
    vm.prune_chains(7);
    assert_eq!(vm.chain_links(), vec![(2, c)]);
    vm.prune_chains(8);
    assert!(vm.open_chains().is_empty());
    // A remove during a chain shows at once.
    let e = vm.assign_chain(3, 9).unwrap();
    let r = vm.assign_remove(3, 10).unwrap();
    assert!(r.is_newer_than(e));
    assert_eq!(
        snapshot(&vm).get(&3),
        Some(&VersionState {
            version: r,
            deleted: true
        })
    );
}

#[test]
fn version_overflow_ends_the_epoch_early() {
    let mut vm = VersionManager::new(7, 1000, 1000);
    vm.buffer
        .insert(1, Slot::new(VERSION_IN_EPOCH_MAX - 1, false));
    let a = vm.assign_put(1, 1).unwrap();
    assert_eq!(a.version, VERSION_IN_EPOCH_MAX);
    let b = vm.assign_put(1, 1).unwrap();
    assert_eq!((b.epoch, b.version), (8, 0));
    assert!(b.is_newer_than(a));
    // A second overflow while the first seal is pending blocks.
    vm.buffer.insert(2, Slot::new(VERSION_IN_EPOCH_MAX, false));
    assert_eq!(vm.assign_put(2, 2), Err(AssignBlocked::SealPending));
    vm.sealed_written(7);
    assert_eq!(vm.assign_put(2, 2).unwrap().epoch, 9);
}

#[test]
fn version_log_survives_reopen_and_torn_compaction() {
    let storage = MemStorage::new();
    let s: Arc<dyn Storage> = Arc::new(storage.clone());
    let rec = |cid, epoch, version, deleted| VersionRecord {
        cid,
        state: VersionState {
            version: Version { epoch, version },
            deleted,
        },
    };
    let (mut log, loaded) = VersionLog::open(s.clone(), "v").unwrap();
    assert!(loaded.is_empty());
    log.append(&[rec(1, 0, 0, false), rec(2, 0, 3, true)])
        .unwrap();
    log.append(&[rec(1, 1, 0, false)]).unwrap();
    drop(log);
    let (mut log, loaded) = VersionLog::open(s.clone(), "v").unwrap();
    let t = table_from_records(&loaded);
    assert_eq!(
        t[&1].version,
        Version {
            epoch: 1,
            version: 0
        }
    );
    assert!(t[&2].deleted);
    // Compaction cut partway: the old file stays in charge. Record blocks (CIDs with
    // gaps: no runs), then a run block cut inside its first page.
    let many: Vec<_> = (0..1000).map(|c| rec(2 * c, 2, 0, false)).collect();
    storage.set_write_budget(Some(3000));
    assert!(log.compact(&many).is_err());
    storage.crash(1);
    let (mut log, loaded) = VersionLog::open(s.clone(), "v").unwrap();
    assert_eq!(table_from_records(&loaded), t);
    let dense: Vec<_> = (0..1000).map(|c| rec(c, 2, 0, false)).collect();
    storage.set_write_budget(Some(20));
    assert!(log.compact(&dense).is_err());
    storage.crash(2);
    let (mut log, loaded) = VersionLog::open(s.clone(), "v").unwrap();
    assert_eq!(table_from_records(&loaded), t);
    log.compact(&many).unwrap();
    log.append(&[rec(5000, 3, 1, true)]).unwrap();
    drop(log);
    let (_, loaded) = VersionLog::open(s, "v").unwrap();
    assert_eq!(loaded.len(), 1001);
}

/// Builds a version-log file: `blocks` blocks of generation `generation` (each a
/// run of records), then a block of generation `tail_generation` and zero pages.
fn log_file(
    blocks: &[Vec<(u64, u16, u32, bool)>],
    generation: u32,
    tail_generation: u32,
) -> Vec<u8> {
    let to_records = |block: &[(u64, u16, u32, bool)]| -> Vec<VersionRecord> {
        block
            .iter()
            .map(|&(cid, epoch, version, deleted)| VersionRecord {
                cid,
                state: VersionState {
                    version: Version {
                        epoch,
                        version: version & VERSION_IN_EPOCH_MAX,
                    },
                    deleted,
                },
            })
            .collect()
    };
    let mut bytes = Vec::new();
    for block in blocks {
        bytes.extend_from_slice(&encode_blocks(&to_records(block), generation));
    }
    bytes.extend_from_slice(&encode_blocks(
        &to_records(&blocks.concat()),
        tail_generation,
    ));
    bytes.extend_from_slice(&[0u8; 2 * PAGE_BYTES]);
    bytes
}

proptest::proptest! {
    /// Fed in windows of any sizes, the decoder visits the records `read_file` loads
    /// and ends where it ends, also for corrupted and truncated files.
    #[test]
    fn block_decoder_equals_read_file(
        blocks in proptest::collection::vec(
            proptest::collection::vec(
                (proptest::num::u64::ANY, proptest::num::u16::ANY, proptest::num::u32::ANY,
                 proptest::bool::ANY),
                0..700,
            ),
            0..5,
        ),
        generation in 0u32..3,
        tail_generation in 0u32..3,
        corrupt in proptest::option::of((proptest::num::usize::ANY, 1u8..=255)),
        truncate in proptest::option::of(proptest::num::usize::ANY),
        windows in proptest::collection::vec(1usize..40_000, 1..20),
    ) {
        let mut bytes = log_file(&blocks, generation, tail_generation);
        if let Some((at, flip)) = corrupt {
            let at = at % bytes.len();
            bytes[at] ^= flip;
        }
        if let Some(len) = truncate {
            bytes.truncate(round_up_to_page(len % bytes.len()).min(bytes.len()));
        }
        let storage = MemStorage::new();
        let file = storage.open("v", bytes.len() as u64).unwrap();
        file.write_at(&bytes, 0).unwrap();
        let expected = read_file(file.as_ref(), "test").unwrap();

        let mut decoder = BlockDecoder::new();
        let mut got = Vec::new();
        let mut at = 0;
        let mut w = 0;
        while at < bytes.len() {
            let len = windows[w % windows.len()].min(bytes.len() - at);
            decoder.feed(&bytes[at..at + len], &mut |r| got.push(r));
            at += len;
            w += 1;
        }
        match expected {
            Some((g, end, records)) => {
                proptest::prop_assert_eq!(decoder.finish(), Some((g, end)));
                proptest::prop_assert_eq!(got, records);
            }
            None => {
                proptest::prop_assert_eq!(decoder.finish(), None);
                proptest::prop_assert!(got.is_empty());
            }
        }
    }
}

fn sorted(mut records: Vec<VersionRecord>) -> Vec<VersionRecord> {
    records.sort_by_key(|r| {
        (
            r.cid,
            r.state.version.epoch,
            r.state.version.version,
            r.state.deleted,
        )
    });
    records
}

/// Records of runs of consecutive CIDs, each run with one state, plus scattered ones.
fn run_records(
    runs: &[(u64, u32, u16, u32, bool)],
    scattered: &[(u64, u16, u32, bool)],
) -> Vec<VersionRecord> {
    let state = |epoch: u16, version: u32, deleted: bool| VersionState {
        version: Version {
            epoch,
            version: version & VERSION_IN_EPOCH_MAX,
        },
        deleted,
    };
    let mut records: Vec<VersionRecord> = runs
        .iter()
        .flat_map(|&(first, len, epoch, version, deleted)| {
            (0..u64::from(len)).map(move |i| VersionRecord {
                cid: first + i,
                state: state(epoch, version, deleted),
            })
        })
        .collect();
    records.extend(
        scattered
            .iter()
            .map(|&(cid, epoch, version, deleted)| VersionRecord {
                cid,
                state: state(epoch, version, deleted),
            }),
    );
    records
}

proptest::proptest! {
    /// Whatever form `encode_blocks` picks (run blocks for runs of consecutive CIDs,
    /// record blocks otherwise), reading gives back the same records (as a multiset:
    /// run blocks are sorted by CID), and the decoder fed in windows agrees.
    #[test]
    fn run_and_record_blocks_give_back_every_record(
        runs in proptest::collection::vec(
            (0u64..1 << 40, 1u32..3000, proptest::num::u16::ANY, proptest::num::u32::ANY,
             proptest::bool::ANY),
            0..6,
        ),
        scattered in proptest::collection::vec(
            (proptest::num::u64::ANY, proptest::num::u16::ANY, proptest::num::u32::ANY,
             proptest::bool::ANY),
            0..200,
        ),
        window in 1usize..50_000,
    ) {
        let records = run_records(&runs, &scattered);
        let storage = MemStorage::new();
        let bytes = encode_blocks(&records, 7);
        let file = storage.open("v", bytes.len() as u64 + PAGE_BYTES as u64).unwrap();
        file.write_at(&bytes, 0).unwrap();
        let read = read_file(file.as_ref(), "test").unwrap();
        let (generation, end, got) = read.expect("a valid file");
        proptest::prop_assert_eq!(generation, 7);
        proptest::prop_assert_eq!(end, bytes.len() as u64);
        proptest::prop_assert_eq!(sorted(got.clone()), sorted(records.clone()));
        let mut decoder = BlockDecoder::new();
        let mut fed = Vec::new();
        for part in bytes.chunks(window) {
            decoder.feed(part, &mut |r| fed.push(r));
        }
        proptest::prop_assert_eq!(fed, got);
    }
}

#[test]
fn a_dense_zone_takes_a_page_not_fourteen_bytes_a_chunk() {
    // 1 M chunks of one creator written once in 5 epochs.
    let records = run_records(
        &(0..5u64)
            .map(|e| ((1 << 48) + e * 200_000, 200_000, e as u16, 0, false))
            .collect::<Vec<_>>(),
        &[],
    );
    let bytes = encode_blocks(&records, 1);
    assert_eq!(bytes.len(), PAGE_BYTES, "5 runs fit one page");
    let storage = MemStorage::new();
    let file = storage.open("v", 2 * PAGE_BYTES as u64).unwrap();
    file.write_at(&bytes, 0).unwrap();
    let (_, _, got) = read_file(file.as_ref(), "test").unwrap().unwrap();
    assert_eq!(got, records, "sorted input comes back in order");
    // Scattered CIDs stay plain records, in their order.
    let scattered = run_records(&[], &[(9, 1, 1, false), (3, 1, 2, true), (5, 0, 0, false)]);
    let bytes = encode_blocks(&scattered, 1);
    let file = storage.open("w", 2 * PAGE_BYTES as u64).unwrap();
    file.write_at(&bytes, 0).unwrap();
    assert_eq!(
        read_file(file.as_ref(), "test").unwrap().unwrap().2,
        scattered
    );
}

#[test]
fn long_runs_are_cut_so_no_block_stands_for_too_many_records() {
    let run = Run {
        first: 1 << 48,
        count: u32::MAX,
        state: VersionState {
            version: Version {
                epoch: 3,
                version: 1,
            },
            deleted: false,
        },
    };
    let blocks = run_blocks(&[run, run]);
    let mut total = 0u64;
    for block in &blocks {
        let in_block: u64 = block.iter().map(|r| u64::from(r.count)).sum();
        assert!(in_block <= RUN_BLOCK_RECORDS_MAX);
        assert!(block.len() <= BLOCK_RECORDS_MAX);
        total += in_block;
    }
    assert_eq!(total, 2 * u64::from(u32::MAX));
    // A block claiming more than that (checksum intact) ends the file, unvisited.
    let mut body = vec![0u8; BLOCK_HEADER_BYTES + 2 * RUN_BYTES];
    let big = Run {
        count: (RUN_BLOCK_RECORDS_MAX / 2 + 1) as u32,
        ..run
    };
    encode_run(&big, &mut body[16..34]);
    encode_run(&big, &mut body[34..52]);
    body[0..4].copy_from_slice(&RUN_BLOCK_MAGIC.to_le_bytes());
    body[4..8].copy_from_slice(&1u32.to_le_bytes());
    body[8..12].copy_from_slice(&2u32.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&body[..12]), &body[16..]);
    body[12..16].copy_from_slice(&crc.to_le_bytes());
    let mut page = vec![0u8; PAGE_BYTES];
    page[..body.len()].copy_from_slice(&body);
    let storage = MemStorage::new();
    let file = storage.open("v", PAGE_BYTES as u64).unwrap();
    file.write_at(&page, 0).unwrap();
    assert!(read_file(file.as_ref(), "test").unwrap().is_none());
    let mut decoder = BlockDecoder::new();
    let mut visited = 0;
    decoder.feed(&page, &mut |_| visited += 1);
    assert_eq!((visited, decoder.finish()), (0, None));
}

#[test]
fn active_extent_reads_back_what_load_returns() {
    let s: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let (mut log, _) = VersionLog::open(s, "v").unwrap();
    let records: Vec<VersionRecord> = (0..100_000u64)
        .map(|cid| VersionRecord {
            cid,
            state: VersionState {
                version: Version {
                    epoch: (cid % 7) as u16,
                    version: (cid % 1000) as u32,
                },
                deleted: cid % 11 == 0,
            },
        })
        .collect();
    log.append(&records[..70_000]).unwrap();
    log.compact(&records[..50_000]).unwrap();
    log.append(&records[50_000..]).unwrap();
    let (file, end) = log.active_extent();
    let mut buf = vec![0u8; end as usize];
    file.read_at(&mut buf, 0).unwrap();
    let mut decoder = BlockDecoder::new();
    let mut got = Vec::new();
    for window in buf.chunks(1 << 20) {
        decoder.feed(window, &mut |r| got.push(r));
    }
    assert_eq!(got, log.load().unwrap());
    assert_eq!(got, records);
    assert_eq!(decoder.finish().map(|(_, e)| e), Some(end));
}
