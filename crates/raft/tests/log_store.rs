//! The on-disk Raft log: reopening, torn and corrupt tails, votes, compaction, refusals.

use std::fs;
use std::io::Write;
use std::path::Path;

use myriad_meta::Command;
use myriad_raft::log_store::{LogRecord, LOG_FILE_NAME};
use myriad_raft::types::*;
use myriad_raft::{LogOpenError, LogStore};
use myriad_types::ChunkId;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::type_config::TypeConfigExt;

const NO_COMPACTION_BYTES: u64 = u64::MAX;

fn log_id(term: u64, index: u64) -> LogId {
    LogId {
        leader_id: LeaderId { term, node_id: 1 },
        index,
    }
}

fn entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Command::NameRegister {
            name: format!("name-{term}-{index}"),
            cid: ChunkId::from_raw(index),
        }),
    }
}

/// Appends and waits until the store reports the entries flushed.
async fn append(store: &mut LogStore, entries: Vec<Entry>) {
    let (tx, rx) = TypeConfig::oneshot();
    store.append(entries, IOFlushed::signal(tx)).await.unwrap();
    rx.await.unwrap().unwrap();
}

/// Everything a reopened store reports.
#[derive(Debug, PartialEq)]
struct Dump {
    state: LogState<TypeConfig>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    entries: Vec<Entry>,
}

async fn dump(store: &mut LogStore) -> Dump {
    Dump {
        state: store.get_log_state().await.unwrap(),
        vote: store.read_vote().await.unwrap(),
        committed: store.read_committed().await.unwrap(),
        entries: store.try_get_log_entries(..).await.unwrap(),
    }
}

async fn reopen_dump(dir: &Path) -> Dump {
    let mut store = LogStore::open(dir, NO_COMPACTION_BYTES).unwrap();
    dump(&mut store).await
}

/// Copies the log of `from` into a fresh directory, cut to `length` bytes.
fn copy_cut(from: &Path, length: usize, mutate: impl FnOnce(&mut Vec<u8>)) -> tempfile::TempDir {
    let mut bytes = fs::read(from.join(LOG_FILE_NAME)).unwrap();
    bytes.truncate(length);
    mutate(&mut bytes);
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(LOG_FILE_NAME), &bytes).unwrap();
    dir
}

#[tokio::test]
async fn log_reopens_with_entries_vote_committed_truncation_and_purge() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path(), NO_COMPACTION_BYTES).unwrap();
        store.save_vote(&Vote::new(1, 1)).await.unwrap();
        append(&mut store, (0..10).map(|index| entry(1, index)).collect()).await;
        store.truncate_after(Some(log_id(1, 7))).await.unwrap();
        append(&mut store, vec![entry(2, 8), entry(2, 9)]).await;
        // An append at an earlier index replaces the tail from there on.
        append(&mut store, vec![entry(3, 9)]).await;
        store.save_committed(Some(log_id(2, 8))).await.unwrap();
        store.purge(log_id(1, 2)).await.unwrap();
        store.save_vote(&Vote::new_committed(3, 1)).await.unwrap();
    }
    let dump = reopen_dump(dir.path()).await;
    assert_eq!(dump.vote, Some(Vote::new_committed(3, 1)));
    assert_eq!(dump.committed, Some(log_id(2, 8)));
    assert_eq!(
        dump.state,
        LogState {
            last_purged_log_id: Some(log_id(1, 2)),
            last_log_id: Some(log_id(3, 9)),
        }
    );
    let mut expected: Vec<Entry> = (3..=7).map(|index| entry(1, index)).collect();
    expected.push(entry(2, 8));
    expected.push(entry(3, 9));
    assert_eq!(dump.entries, expected);
}

#[tokio::test]
async fn vote_is_persisted_by_save_vote_alone() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path(), NO_COMPACTION_BYTES).unwrap();
        store.save_vote(&Vote::new(5, 3)).await.unwrap();
    }
    let dump = reopen_dump(dir.path()).await;
    assert_eq!(dump.vote, Some(Vote::new(5, 3)));
    assert_eq!(dump.state, LogState::default());
    assert!(dump.entries.is_empty());
}

/// Writes a log whose last operation is `last`, returns the file length before it.
async fn log_with_last_record(dir: &Path, last: LogRecord) -> usize {
    let mut store = LogStore::open(dir, NO_COMPACTION_BYTES).unwrap();
    store.save_vote(&Vote::new(1, 1)).await.unwrap();
    append(&mut store, (0..5).map(|index| entry(1, index)).collect()).await;
    store.save_committed(Some(log_id(1, 3))).await.unwrap();
    let before = store.file_bytes() as usize;
    match last {
        LogRecord::Append(entry) => append(&mut store, vec![entry]).await,
        LogRecord::Vote(vote) => store.save_vote(&vote).await.unwrap(),
        LogRecord::Committed(committed) => store.save_committed(committed).await.unwrap(),
        LogRecord::TruncateAfter(log_id) => store.truncate_after(log_id).await.unwrap(),
        LogRecord::Purge(log_id) => store.purge(log_id).await.unwrap(),
    }
    assert!(store.file_bytes() as usize > before);
    before
}

#[tokio::test]
async fn torn_tail_at_every_byte_of_the_last_record_yields_exactly_the_previous_records() {
    let lasts = [
        LogRecord::Append(entry(1, 5)),
        LogRecord::Vote(Vote::new_committed(2, 2)),
        LogRecord::Committed(Some(log_id(1, 4))),
        LogRecord::TruncateAfter(Some(log_id(1, 1))),
        LogRecord::Purge(log_id(1, 2)),
    ];
    for last in lasts {
        let dir = tempfile::tempdir().unwrap();
        let before = log_with_last_record(dir.path(), last.clone()).await;
        let full_length = fs::metadata(dir.path().join(LOG_FILE_NAME)).unwrap().len() as usize;
        let full = reopen_dump(dir.path()).await;
        let previous_dir = copy_cut(dir.path(), before, |_| {});
        let previous = reopen_dump(previous_dir.path()).await;
        assert_ne!(
            previous, full,
            "the last record {last:?} must change the log"
        );
        for cut in before..full_length {
            let cut_dir = copy_cut(dir.path(), cut, |_| {});
            let dump = reopen_dump(cut_dir.path()).await;
            assert_eq!(
                dump, previous,
                "cut at byte {cut} of a log ending in {last:?}"
            );
            // The torn bytes are gone from the file, so new records follow valid ones.
            let length = fs::metadata(cut_dir.path().join(LOG_FILE_NAME))
                .unwrap()
                .len();
            assert_eq!(length as usize, before);
        }
    }
}

#[tokio::test]
async fn a_flipped_byte_in_the_last_record_cuts_it() {
    let dir = tempfile::tempdir().unwrap();
    let before = log_with_last_record(dir.path(), LogRecord::Append(entry(1, 5))).await;
    let full_length = fs::metadata(dir.path().join(LOG_FILE_NAME)).unwrap().len() as usize;
    let previous = reopen_dump(copy_cut(dir.path(), before, |_| {}).path()).await;
    for position in before..full_length {
        for flip in [0x01u8, 0x80] {
            let damaged = copy_cut(dir.path(), full_length, |bytes| bytes[position] ^= flip);
            assert_eq!(
                reopen_dump(damaged.path()).await,
                previous,
                "byte {position} flipped by {flip:#x}"
            );
        }
    }
}

#[tokio::test]
async fn appending_after_a_cut_tail_survives_the_next_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let before = log_with_last_record(dir.path(), LogRecord::Append(entry(1, 5))).await;
    let cut_dir = copy_cut(dir.path(), before + 3, |_| {});
    {
        let mut store = LogStore::open(cut_dir.path(), NO_COMPACTION_BYTES).unwrap();
        append(&mut store, vec![entry(2, 5), entry(2, 6)]).await;
    }
    let dump = reopen_dump(cut_dir.path()).await;
    assert_eq!(dump.state.last_log_id, Some(log_id(2, 6)));
    assert_eq!(dump.entries.len(), 7);
    assert_eq!(dump.entries[5], entry(2, 5));
}

#[tokio::test]
async fn a_record_with_a_valid_crc_that_does_not_decode_refuses_the_open() {
    let dir = tempfile::tempdir().unwrap();
    log_with_last_record(dir.path(), LogRecord::Append(entry(1, 5))).await;
    let mut file = fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join(LOG_FILE_NAME))
        .unwrap();
    let record = [0xeeu8, 1, 2, 3];
    file.write_all(&(record.len() as u32).to_le_bytes())
        .unwrap();
    file.write_all(&crc32c::crc32c(&record).to_le_bytes())
        .unwrap();
    file.write_all(&record).unwrap();
    drop(file);
    assert!(matches!(
        LogStore::open(dir.path(), NO_COMPACTION_BYTES),
        Err(LogOpenError::Corrupt { .. })
    ));
}

#[tokio::test]
async fn a_file_without_the_header_refuses_the_open() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(LOG_FILE_NAME), b"not a log at all").unwrap();
    assert!(matches!(
        LogStore::open(dir.path(), NO_COMPACTION_BYTES),
        Err(LogOpenError::BadHeader(_))
    ));
}

#[tokio::test]
async fn an_append_that_leaves_a_hole_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path(), NO_COMPACTION_BYTES).unwrap();
    append(&mut store, (0..3).map(|index| entry(1, index)).collect()).await;
    let before = dump(&mut store).await;
    let bytes = store.file_bytes();
    let (tx, _rx) = TypeConfig::oneshot();
    let result = store
        .append(vec![entry(1, 3), entry(1, 5)], IOFlushed::signal(tx))
        .await;
    assert!(result.is_err());
    assert_eq!(store.file_bytes(), bytes);
    assert_eq!(dump(&mut store).await, before);
    store.purge(log_id(1, 1)).await.unwrap();
    let (tx, _rx) = TypeConfig::oneshot();
    assert!(store
        .append(vec![entry(1, 1)], IOFlushed::signal(tx))
        .await
        .is_err());
    drop(store);
    assert_eq!(reopen_dump(dir.path()).await.entries, vec![entry(1, 2)]);
}

#[tokio::test]
async fn purges_compact_a_grown_file_and_keep_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let compact_bytes = 8 << 10;
    let mut store = LogStore::open(dir.path(), compact_bytes).unwrap();
    store.save_vote(&Vote::new_committed(4, 2)).await.unwrap();
    for batch in 0..40 {
        append(
            &mut store,
            (batch * 10..batch * 10 + 10)
                .map(|index| entry(4, index))
                .collect(),
        )
        .await;
        store
            .save_committed(Some(log_id(4, batch * 10 + 9)))
            .await
            .unwrap();
    }
    let grown = store.file_bytes();
    assert!(grown > compact_bytes);
    store.purge(log_id(4, 389)).await.unwrap();
    let compacted = store.file_bytes();
    assert!(
        compacted < compact_bytes,
        "{compacted} bytes after purge, {grown} before"
    );
    assert_eq!(
        fs::metadata(dir.path().join(LOG_FILE_NAME)).unwrap().len(),
        compacted
    );
    let live = dump(&mut store).await;
    // Appends after the compaction land in the new file.
    append(&mut store, vec![entry(5, 400)]).await;
    drop(store);
    let reopened = reopen_dump(dir.path()).await;
    assert_eq!(reopened.vote, live.vote);
    assert_eq!(reopened.committed, Some(log_id(4, 399)));
    assert_eq!(reopened.state.last_purged_log_id, Some(log_id(4, 389)));
    assert_eq!(reopened.entries[..10], live.entries[..]);
    assert_eq!(reopened.entries[10], entry(5, 400));
    assert!(!dir.path().join("raft-log.tmp").exists());
}

#[tokio::test]
async fn a_leftover_compaction_temp_file_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    log_with_last_record(dir.path(), LogRecord::Append(entry(1, 5))).await;
    let expected = reopen_dump(dir.path()).await;
    fs::write(dir.path().join("raft-log.tmp"), b"MYRDRLOG half written").unwrap();
    assert_eq!(reopen_dump(dir.path()).await, expected);
    assert!(!dir.path().join("raft-log.tmp").exists());
}

#[tokio::test]
async fn range_reads_clip_and_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path(), NO_COMPACTION_BYTES).unwrap();
    append(&mut store, (0..5).map(|index| entry(1, index)).collect()).await;
    assert_eq!(store.try_get_log_entries(2..4).await.unwrap().len(), 2);
    assert_eq!(store.try_get_log_entries(3..=100).await.unwrap().len(), 2);
    #[allow(clippy::reversed_empty_ranges)]
    let empty = store.try_get_log_entries(4..2).await.unwrap();
    assert!(empty.is_empty());
    assert!(store.try_get_log_entries(3..3).await.unwrap().is_empty());
    assert_eq!(store.try_get_log_entries(..).await.unwrap().len(), 5);
}

#[tokio::test]
#[should_panic(expected = "log IDs must grow along the log")]
async fn an_append_behind_a_later_leader_is_a_bug_and_stops_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path(), NO_COMPACTION_BYTES).unwrap();
    append(&mut store, vec![entry(2, 0)]).await;
    append(&mut store, vec![entry(1, 1)]).await;
}
