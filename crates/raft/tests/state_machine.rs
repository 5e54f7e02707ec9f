//! The state machine alone: applying entries, building and reloading snapshots, refusing
//! damaged snapshot files and invalid installs.

use std::collections::BTreeMap;
use std::fs;

use myriad_meta::{Command, MetaState};
use myriad_raft::state_machine::SNAPSHOT_FILE_NAME;
use myriad_raft::types::*;
use myriad_raft::{SnapshotOpenError, StateMachineStore};
use myriad_types::ChunkId;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};

fn log_id(index: u64) -> LogId {
    LogId {
        leader_id: LeaderId {
            term: 2,
            node_id: 1,
        },
        index,
    }
}

fn name(index: u64) -> Command {
    Command::NameRegister {
        name: format!("n{index}"),
        cid: ChunkId::from_raw(index),
    }
}

fn membership() -> Membership {
    Membership::new(
        vec![[1].into()],
        BTreeMap::from([(1, SuperpeerNode::new("127.0.0.1:1"))]),
    )
    .unwrap()
}

async fn apply(store: &mut StateMachineStore, entries: Vec<Entry>) {
    let stream = futures_util::stream::iter(entries.into_iter().map(|entry| Ok((entry, None))));
    store.apply(stream).await.unwrap();
}

#[tokio::test]
async fn applied_state_snapshots_and_reloads_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = StateMachineStore::open(dir.path()).unwrap();
    let mut entries = vec![Entry {
        log_id: log_id(0),
        payload: EntryPayload::Membership(membership()),
    }];
    entries.extend((1..=10).map(|index| Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(name(index)),
    }));
    entries.push(Entry {
        log_id: log_id(11),
        payload: EntryPayload::Blank,
    });
    apply(&mut store, entries).await;
    let (applied, stored) = store.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(11)));
    assert_eq!(stored, StoredMembership::new(Some(log_id(0)), membership()));
    let reader = store.reader();
    assert_eq!(reader.read(|state| state.names().count()), 10);
    assert_eq!(reader.last_applied_index(), Some(11));

    let snapshot = store
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(11)));
    assert_eq!(snapshot.snapshot, reader.read(MetaState::snapshot));
    // Later entries are not in the snapshot and not on disk.
    apply(
        &mut store,
        vec![Entry {
            log_id: log_id(12),
            payload: EntryPayload::Normal(name(12)),
        }],
    )
    .await;
    drop(store);

    let mut reopened = StateMachineStore::open(dir.path()).unwrap();
    let (applied, stored) = reopened.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(11)));
    assert_eq!(stored.membership(), &membership());
    assert_eq!(
        reopened.reader().read(MetaState::snapshot),
        snapshot.snapshot
    );
    let current = reopened.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, snapshot.meta);
}

#[tokio::test]
async fn a_damaged_snapshot_file_refuses_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = StateMachineStore::open(dir.path()).unwrap();
    apply(
        &mut store,
        vec![Entry {
            log_id: log_id(1),
            payload: EntryPayload::Normal(name(1)),
        }],
    )
    .await;
    store
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    drop(store);
    let path = dir.path().join(SNAPSHOT_FILE_NAME);
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        StateMachineStore::open(dir.path()),
        Err(SnapshotOpenError::Corrupt { .. })
    ));
    // A leftover temp file alone is ignored and removed.
    fs::remove_file(&path).unwrap();
    fs::write(dir.path().join("snapshot.tmp"), b"MYRDRSNP torn").unwrap();
    let mut store = StateMachineStore::open(dir.path()).unwrap();
    assert_eq!(store.applied_state().await.unwrap().0, None);
    assert!(!dir.path().join("snapshot.tmp").exists());
}

#[tokio::test]
async fn install_replaces_the_state_and_refuses_invalid_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = StateMachineStore::open(dir.path()).unwrap();
    let mut leader_state = MetaState::new();
    for index in 0..5 {
        leader_state.apply(&name(index));
    }
    let meta = SnapshotMeta {
        last_log_id: Some(log_id(40)),
        last_membership: StoredMembership::new(Some(log_id(0)), membership()),
    };
    assert!(store
        .install_snapshot(&meta, b"not a state".to_vec())
        .await
        .is_err());
    assert_eq!(store.applied_state().await.unwrap().0, None);
    assert!(!dir.path().join(SNAPSHOT_FILE_NAME).exists());

    store
        .install_snapshot(&meta, leader_state.snapshot())
        .await
        .unwrap();
    assert_eq!(store.applied_state().await.unwrap().0, Some(log_id(40)));
    assert_eq!(store.reader().read(|state| state.clone()), leader_state);
    drop(store);
    let reopened = StateMachineStore::open(dir.path()).unwrap();
    assert_eq!(reopened.reader().read(|state| state.clone()), leader_state);
}
