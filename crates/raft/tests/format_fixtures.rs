//! Files written by earlier versions of the on-disk format still open, with the same
//! contents (`docs/raft-format.md`, "Version history").
//!
//! `tests/fixtures/format-N/` holds a `raft-log` and a `snapshot` written by the code of
//! format version N (the log holds every record kind: votes, appends with commands, blanks
//! and membership changes, a truncation, a purge, a committed position). They are generated
//! once, at the commit that introduced version N, by the ignored test
//! `generate_format_fixtures` (`RAFT_FIXTURE_OUT=tests/fixtures/format-N cargo test -p
//! myriad-raft --test format_fixtures -- --ignored`), and never regenerated: the checks below
//! spell out the expected contents by value, not by re-running the writer.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use myriad_meta::{Command, MetaState};
use myriad_raft::log_store::{LOG_FILE_NAME, LOG_FORMAT_VERSION};
use myriad_raft::state_machine::{
    decode_snapshot_file, SNAPSHOT_FILE_NAME, SNAPSHOT_FORMAT_VERSION,
};
use myriad_raft::types::*;
use myriad_raft::{
    LogOpenError, LogStore, SnapshotFileError, SnapshotOpenError, StateMachineStore,
};
use myriad_types::ChunkId;
use openraft::storage::{
    IOFlushed, LogState, RaftLogReader, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine,
};
use openraft::type_config::TypeConfigExt;

const NO_COMPACTION_BYTES: u64 = u64::MAX;

fn fixture_dir(version: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/format-{version}"))
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId {
        leader_id: LeaderId { term, node_id: 1 },
        index,
    }
}

fn name(index: u64) -> Command {
    Command::NameRegister {
        name: format!("fixture-{index}"),
        cid: ChunkId::from_raw(0x1000 + index),
    }
}

fn node(id: u64) -> SuperpeerNode {
    SuperpeerNode::new(format!("10.0.0.{id}:7400"))
}

fn membership(configs: &[&[u64]]) -> Membership {
    let configs = configs
        .iter()
        .map(|voters| voters.iter().copied().collect())
        .collect();
    Membership::new(configs, BTreeMap::from([(1, node(1)), (2, node(2))])).unwrap()
}

fn entry(term: u64, index: u64, payload: EntryPayload) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload,
    }
}

/// The entries the fixture log holds at the end, after its truncation and purge.
fn expected_live_entries() -> Vec<Entry> {
    vec![
        entry(1, 2, EntryPayload::Normal(name(2))),
        entry(2, 3, EntryPayload::Blank),
        entry(2, 4, EntryPayload::Membership(membership(&[&[1], &[1, 2]]))),
        entry(2, 5, EntryPayload::Membership(membership(&[&[1, 2]]))),
        entry(2, 6, EntryPayload::Normal(name(6))),
    ]
}

/// The entries the fixture snapshot covers (everything up to index 5 of the final log).
fn snapshot_entries() -> Vec<Entry> {
    let mut entries = vec![
        entry(1, 0, EntryPayload::Membership(membership(&[&[1]]))),
        entry(1, 1, EntryPayload::Blank),
    ];
    entries.extend(expected_live_entries().into_iter().take(4));
    entries
}

async fn append(store: &mut LogStore, entries: Vec<Entry>) {
    let (tx, rx) = TypeConfig::oneshot();
    store.append(entries, IOFlushed::signal(tx)).await.unwrap();
    rx.await.unwrap().unwrap();
}

/// Copies one fixture directory into a fresh temporary one (opening may write: a store cuts
/// torn tails and deletes temp files, and the fixtures must stay as committed).
fn copy_fixture(version: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in [LOG_FILE_NAME, SNAPSHOT_FILE_NAME] {
        fs::copy(fixture_dir(version).join(name), dir.path().join(name)).unwrap();
    }
    dir
}

#[tokio::test]
#[ignore = "writes fixture files; run once per format version (see the module doc)"]
async fn generate_format_fixtures() {
    let out = PathBuf::from(std::env::var("RAFT_FIXTURE_OUT").expect("set RAFT_FIXTURE_OUT"));
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join(out);
    assert!(
        !out.join(LOG_FILE_NAME).exists(),
        "fixtures are never regenerated"
    );
    let work = tempfile::tempdir().unwrap();
    {
        let mut log = LogStore::open(work.path(), NO_COMPACTION_BYTES).unwrap();
        log.save_vote(&Vote::new(1, 1)).await.unwrap();
        append(
            &mut log,
            vec![
                entry(1, 0, EntryPayload::Membership(membership(&[&[1]]))),
                entry(1, 1, EntryPayload::Blank),
                entry(1, 2, EntryPayload::Normal(name(2))),
                entry(1, 3, EntryPayload::Normal(name(3))),
            ],
        )
        .await;
        log.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
        log.truncate_after(Some(log_id(1, 2))).await.unwrap();
        append(&mut log, expected_live_entries()[1..].to_vec()).await;
        log.save_committed(Some(log_id(2, 5))).await.unwrap();
        log.purge(log_id(1, 1)).await.unwrap();
        // One more append so that the file is fsynced after the last records.
        append(&mut log, Vec::new()).await;
    }
    {
        let mut machine = StateMachineStore::open(work.path()).unwrap();
        let stream = futures_util::stream::iter(
            snapshot_entries()
                .into_iter()
                .map(|entry| Ok((entry, None))),
        );
        machine.apply(stream).await.unwrap();
        machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    }
    fs::create_dir_all(&out).unwrap();
    for name in [LOG_FILE_NAME, SNAPSHOT_FILE_NAME] {
        fs::copy(work.path().join(name), out.join(name)).unwrap();
    }
}

/// Opens the fixtures of `version` with today's code and checks every value in them.
async fn check_fixtures_open_with_their_contents(version: u32) {
    let dir = copy_fixture(version);

    let mut log = LogStore::open(dir.path(), NO_COMPACTION_BYTES).unwrap();
    assert_eq!(
        log.get_log_state().await.unwrap(),
        LogState {
            last_purged_log_id: Some(log_id(1, 1)),
            last_log_id: Some(log_id(2, 6)),
        }
    );
    assert_eq!(
        log.read_vote().await.unwrap(),
        Some(Vote::new_committed(2, 1))
    );
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(2, 5)));
    assert_eq!(
        log.try_get_log_entries(..).await.unwrap(),
        expected_live_entries()
    );

    let mut machine = StateMachineStore::open(dir.path()).unwrap();
    let (applied, stored) = machine.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(2, 5)));
    assert_eq!(
        stored,
        StoredMembership::new(Some(log_id(2, 5)), membership(&[&[1, 2]]))
    );
    let mut expected_state = MetaState::default();
    expected_state.apply(&name(2));
    let snapshot = machine.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(2, 5)));
    // The fixture's metadata snapshot is of its time (version 3 for format 1); it decodes
    // to the same state as today's.
    assert_eq!(
        MetaState::from_snapshot(&snapshot.snapshot).expect("an older snapshot decodes"),
        expected_state
    );
    let names: Vec<(String, ChunkId)> = machine.reader().read(|state| {
        state
            .names()
            .map(|(name, cid)| (name.to_owned(), cid))
            .collect()
    });
    assert_eq!(
        names,
        vec![("fixture-2".to_owned(), ChunkId::from_raw(0x1002))]
    );

    // The old files keep working: appending to the old log and reopening keeps everything.
    append(&mut log, vec![entry(2, 7, EntryPayload::Normal(name(7)))]).await;
    drop(log);
    let mut log = LogStore::open(dir.path(), NO_COMPACTION_BYTES).unwrap();
    let mut expected = expected_live_entries();
    expected.push(entry(2, 7, EntryPayload::Normal(name(7))));
    assert_eq!(log.try_get_log_entries(..).await.unwrap(), expected);
}

#[tokio::test]
async fn format_1_fixtures_open_with_their_contents() {
    check_fixtures_open_with_their_contents(1).await;
}

#[test]
fn the_format_1_fixtures_carry_version_1_and_this_build_writes_the_current_version() {
    let dir = fixture_dir(1);
    let log = fs::read(dir.join(LOG_FILE_NAME)).unwrap();
    assert_eq!(&log[..12], b"MYRDRLOG\x01\0\0\0");
    let snapshot = fs::read(dir.join(SNAPSHOT_FILE_NAME)).unwrap();
    assert_eq!(&snapshot[..12], b"MYRDRSNP\x01\0\0\0");
    // Format 1 is also the current version: when it changes, add format-N fixtures and a
    // `format_N_fixtures_open_with_their_contents` test, and keep this one.
    assert_eq!((LOG_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSION), (1, 1));
}

/// Overwrites the u32 LE version after the 8-byte magic of `file`.
fn set_version(file: &Path, version: u32) {
    let mut bytes = fs::read(file).unwrap();
    bytes[8..12].copy_from_slice(&version.to_le_bytes());
    fs::write(file, &bytes).unwrap();
}

#[tokio::test]
async fn files_of_an_unknown_format_version_are_refused_with_a_typed_error_and_left_alone() {
    for version in [0, LOG_FORMAT_VERSION + 1, u32::MAX] {
        let dir = copy_fixture(1);
        let path = dir.path().join(LOG_FILE_NAME);
        set_version(&path, version);
        let before = fs::read(&path).unwrap();
        match LogStore::open(dir.path(), NO_COMPACTION_BYTES) {
            Err(LogOpenError::UnsupportedVersion {
                path: refused,
                version: found,
            }) => assert_eq!((refused, found), (path.clone(), version)),
            other => panic!("log of version {version} opened as {other:?}"),
        }
        assert_eq!(fs::read(&path).unwrap(), before, "a refused log is not cut");
    }
    for version in [0, SNAPSHOT_FORMAT_VERSION + 1, u32::MAX] {
        let dir = copy_fixture(1);
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        set_version(&path, version);
        assert!(matches!(
            decode_snapshot_file(&fs::read(&path).unwrap()),
            Err(SnapshotFileError::UnsupportedVersion(found)) if found == version
        ));
        match StateMachineStore::open(dir.path()) {
            Err(SnapshotOpenError::UnsupportedVersion {
                path: refused,
                version: found,
            }) => assert_eq!((refused, found), (path.clone(), version)),
            other => panic!("snapshot of version {version} opened as {other:?}"),
        }
    }
}
