//! The Raft log of one superpeer on disk: an append-only record file plus an in-memory
//! index of the live entries.
//!
//! **Job.** Implements openraft's [`RaftLogStorage`] and [`RaftLogReader`]: appends
//! entries, truncates a conflicting tail, purges entries covered by a snapshot, and keeps
//! the vote and the committed position.
//!
//! **Format.** `raft-log` in the superpeer's directory holds a 12-byte header (magic
//! `MYRDRLOG`, u32 LE format version [`LOG_FORMAT_VERSION`]; versions from
//! [`LOG_FORMAT_VERSION_MIN`] are read, others refused with
//! [`LogOpenError::UnsupportedVersion`]) and then frames `[u32 LE length][u32 LE
//! crc32c(record)][record]`. A record is one tag byte and a body encoded by
//! [`crate::codec`]: `Append(entry)`, `TruncateAfter(option log id)`, `Purge(log id)`,
//! `Committed(option log id)`, `Vote(vote)`. Byte-level layout: `docs/raft-format.md`.
//!
//! **Invariants.**
//! - Records are written in the order openraft issued the operations, by one writer, so the
//!   file is always a prefix of the operation history; replaying it rebuilds the index.
//! - An append's callback ([`IOFlushed::io_completed`]) runs only after an `fdatasync`
//!   that covers it (a background thread batches the fsyncs of concurrent appends);
//!   [`RaftLogStorage::save_vote`] returns only after its own fsync.
//! - On open, replay stops at the first frame that is short, has length 0 or above
//!   [`RECORD_BYTES_MAX`], or fails its CRC: that is a torn tail; the file is cut there.
//!   A frame with a valid CRC that does not decode, or that would leave a hole in the log,
//!   is corruption and refuses the open ([`LogOpenError::Corrupt`]).
//! - The index never holds a hole: entries are consecutive from the purge point, and log
//!   IDs grow along the log (both asserted once per write and after replay: a violation is
//!   a bug, and stopping beats writing a corrupt log).
//! - After any write or fsync error the store refuses every later write (openraft then
//!   stops the node): an fsync error leaves the page cache in an unknown state.
//! - When the file outgrows its compaction threshold after purges it is rewritten from the
//!   index to `raft-log.tmp`, fsynced and renamed over `raft-log` (then the directory is
//!   fsynced), so a crash leaves either the old or the new file, both complete.
//!
//! **Threads.** Writes are synchronous `write` calls on the caller's Tokio worker; append
//! fsyncs run on the store's own thread, but `save_vote` and a compaction fsync on the
//! caller's worker (votes are rare; compactions rarer).
//!
//! **Callers.** openraft's core (through [`crate::MetaRaft`]) and the replication tasks
//! (through [`LogReader`]).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;

use myriad_types::codec::{DecodeError, Decoder, Encoder};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;
use parking_lot::Mutex;
use thiserror::Error;

use crate::codec::{
    decode_entry, decode_log_id, decode_option_log_id, decode_vote, encode_entry, encode_log_id,
    encode_option_log_id, encode_vote,
};
use crate::files::{sync_dir, write_file_durably};
use crate::limits::{FLUSH_QUEUE_MAX, RECORD_BYTES_MAX};
use crate::types::{Entry, LogId, TypeConfig, Vote};

/// Name of the record file in the superpeer's directory.
pub const LOG_FILE_NAME: &str = "raft-log";
/// Name of the file a compaction writes before renaming it over [`LOG_FILE_NAME`].
const LOG_TEMP_FILE_NAME: &str = "raft-log.tmp";
/// First bytes of the record file.
const LOG_MAGIC: [u8; 8] = *b"MYRDRLOG";
/// Format version after the magic: what this build writes. `docs/raft-format.md`,
/// "Version history", lists every version.
pub const LOG_FORMAT_VERSION: u32 = 1;
/// Oldest format version this build still reads. A build that raises
/// [`LOG_FORMAT_VERSION`] keeps reading the versions from here on and rewrites an older
/// file in the new version (as a compaction does) before it appends to it.
pub const LOG_FORMAT_VERSION_MIN: u32 = 1;
/// Bytes of the file header: magic and version.
const LOG_HEADER_BYTES: usize = 12;
/// Bytes of a frame header: length and CRC.
const FRAME_HEADER_BYTES: usize = 8;
/// The default size past which a purge rewrites the file.
pub const LOG_COMPACT_BYTES_DEFAULT: u64 = 64 << 20;

const RECORD_APPEND: u8 = 1;
const RECORD_TRUNCATE_AFTER: u8 = 2;
const RECORD_PURGE: u8 = 3;
const RECORD_COMMITTED: u8 = 4;
const RECORD_VOTE: u8 = 5;

/// One record of the log file.
#[derive(Debug, Clone, PartialEq)]
pub enum LogRecord {
    /// An entry appended at its index (an index at or below the last one first drops the
    /// entries from that index on).
    Append(Entry),
    /// Entries after this log ID (all entries for `None`) are gone.
    TruncateAfter(Option<LogId>),
    /// Entries up to and including this log ID are gone; it becomes the purge point.
    Purge(LogId),
    /// The last committed log ID known to this node.
    Committed(Option<LogId>),
    /// The vote of this node.
    Vote(Vote),
}

impl LogRecord {
    /// The record's encoding: a tag byte and its body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Encoder::new();
        match self {
            LogRecord::Append(entry) => {
                out.put_u8(RECORD_APPEND);
                encode_entry(&mut out, entry);
            }
            LogRecord::TruncateAfter(log_id) => {
                out.put_u8(RECORD_TRUNCATE_AFTER);
                encode_option_log_id(&mut out, log_id.as_ref());
            }
            LogRecord::Purge(log_id) => {
                out.put_u8(RECORD_PURGE);
                encode_log_id(&mut out, log_id);
            }
            LogRecord::Committed(log_id) => {
                out.put_u8(RECORD_COMMITTED);
                encode_option_log_id(&mut out, log_id.as_ref());
            }
            LogRecord::Vote(vote) => {
                out.put_u8(RECORD_VOTE);
                encode_vote(&mut out, vote);
            }
        }
        out.into_vec()
    }

    /// Decodes a record that fills all of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<LogRecord, DecodeError> {
        let mut reader = Decoder::from_slice(bytes);
        let record = match reader.get_u8("record tag")? {
            RECORD_APPEND => LogRecord::Append(decode_entry(&mut reader)?),
            RECORD_TRUNCATE_AFTER => LogRecord::TruncateAfter(decode_option_log_id(&mut reader)?),
            RECORD_PURGE => LogRecord::Purge(decode_log_id(&mut reader)?),
            RECORD_COMMITTED => LogRecord::Committed(decode_option_log_id(&mut reader)?),
            RECORD_VOTE => LogRecord::Vote(decode_vote(&mut reader)?),
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "log record",
                    tag: u64::from(tag),
                })
            }
        };
        reader.finish()?;
        Ok(record)
    }

    /// The framed record: `[u32 LE length][u32 LE crc32c][record]`. Fails for a record
    /// longer than [`RECORD_BYTES_MAX`].
    pub fn to_frame(&self) -> io::Result<Vec<u8>> {
        let record = self.to_bytes();
        if record.len() > RECORD_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "log record of {} bytes exceeds {RECORD_BYTES_MAX}",
                    record.len()
                ),
            ));
        }
        let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + record.len());
        frame.extend_from_slice(&(record.len() as u32).to_le_bytes());
        frame.extend_from_slice(&crc32c::crc32c(&record).to_le_bytes());
        frame.extend_from_slice(&record);
        Ok(frame)
    }
}

/// The outcome of reading one frame from a byte slice.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A whole frame with a valid CRC: its record bytes and the frame's total length.
    Record(&'a [u8], usize),
    /// The bytes end inside a frame, or the frame's length or CRC is wrong: a torn tail.
    Torn,
    /// No bytes left.
    End,
}

/// Reads the frame at the start of `bytes` (never panics, never trusts the length).
pub fn read_frame(bytes: &[u8]) -> Frame<'_> {
    if bytes.is_empty() {
        return Frame::End;
    }
    let Some((header, rest)) = bytes.split_at_checked(FRAME_HEADER_BYTES) else {
        return Frame::Torn;
    };
    let length = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    // Length 0 is never written (every record has a tag byte); zeroed space left by a
    // crash would otherwise pass, since the CRC of nothing is 0.
    if length == 0 || length > RECORD_BYTES_MAX || length > rest.len() {
        return Frame::Torn;
    }
    let record = &rest[..length];
    if crc32c::crc32c(record) != crc {
        return Frame::Torn;
    }
    Frame::Record(record, FRAME_HEADER_BYTES + length)
}

/// Why a log directory could not be opened.
#[derive(Debug, Error)]
pub enum LogOpenError {
    /// A file operation failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The file is shorter than its header or does not start with the log's magic.
    #[error("{0} is not a Myriad Raft log")]
    BadHeader(PathBuf),
    /// The file is a Raft log of a format version this build does not read (written by a
    /// newer build, or damaged): refused, never cut or rewritten.
    #[error(
        "{path} is a Raft log of format version {version}; this build reads versions \
         {LOG_FORMAT_VERSION_MIN} to {LOG_FORMAT_VERSION}"
    )]
    UnsupportedVersion {
        /// The log file.
        path: PathBuf,
        /// The version in its header.
        version: u32,
    },
    /// A record passed its CRC but is invalid: not a torn write, so nothing is cut.
    #[error("record at byte {offset} of {path} is corrupt: {reason}")]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// Where the frame starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> LogOpenError + '_ {
    move |source| LogOpenError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The live log: what replaying the records produces.
#[derive(Debug, Default, Clone, PartialEq)]
struct LogIndex {
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
    /// Entries by index, with the bytes of the frame that holds each.
    entries: BTreeMap<u64, (Entry, u64)>,
    /// Sum of the frame bytes of `entries`.
    entry_bytes: u64,
}

impl LogIndex {
    fn last_log_id(&self) -> Option<LogId> {
        match self.entries.last_key_value() {
            Some((_, (entry, _))) => Some(entry.log_id),
            None => self.last_purged,
        }
    }

    fn next_index(&self) -> u64 {
        self.last_log_id()
            .map_or(0, |log_id| log_id.index.saturating_add(1))
    }

    fn drop_from(&mut self, first: u64) {
        let removed = self.entries.split_off(&first);
        self.entry_bytes -= removed.values().map(|(_, bytes)| bytes).sum::<u64>();
    }

    /// Panics unless the entries run without a hole from just after the purge point (from 0
    /// without one): the check of the "no hole" invariant that [`LogIndex::apply`] keeps.
    /// Two map lookups; run once per write or replay, not per entry.
    fn assert_contiguous(&self) {
        let (Some((&first, _)), Some((&last, _))) = (
            self.entries.first_key_value(),
            self.entries.last_key_value(),
        ) else {
            return;
        };
        let start = self
            .last_purged
            .map_or(0, |log_id| log_id.index.saturating_add(1));
        assert!(
            first == start && last - first + 1 == self.entries.len() as u64,
            "Raft log index has a hole: entries {first}..={last} ({} of them), purged up to {:?}",
            self.entries.len(),
            self.last_purged,
        );
    }

    /// Applies one record; the same rules hold at run time and on replay.
    fn apply(&mut self, record: LogRecord, frame_bytes: u64) -> Result<(), String> {
        match record {
            LogRecord::Append(entry) => {
                let index = entry.log_id.index;
                if let Some(purged) = self.last_purged {
                    if index <= purged.index {
                        return Err(format!(
                            "append at index {index}, at or below the purge point {}",
                            purged.index
                        ));
                    }
                }
                let next = self.next_index();
                if index > next {
                    return Err(format!(
                        "append at index {index} leaves a hole before it (next is {next})"
                    ));
                }
                if index < next {
                    self.drop_from(index);
                }
                self.entries.insert(index, (entry, frame_bytes));
                self.entry_bytes += frame_bytes;
            }
            LogRecord::TruncateAfter(log_id) => {
                self.drop_from(log_id.map_or(0, |log_id| log_id.index.saturating_add(1)));
            }
            LogRecord::Purge(log_id) => {
                let keep = self.entries.split_off(&log_id.index.saturating_add(1));
                let removed = std::mem::replace(&mut self.entries, keep);
                self.entry_bytes -= removed.values().map(|(_, bytes)| bytes).sum::<u64>();
                if self.last_purged < Some(log_id) {
                    self.last_purged = Some(log_id);
                }
            }
            LogRecord::Committed(log_id) => self.committed = log_id,
            LogRecord::Vote(vote) => self.vote = Some(vote),
        }
        Ok(())
    }

    /// The records that rebuild this index (what a compaction writes).
    fn records(&self) -> Vec<LogRecord> {
        let mut records = Vec::with_capacity(self.entries.len() + 3);
        if let Some(vote) = self.vote {
            records.push(LogRecord::Vote(vote));
        }
        if let Some(purged) = self.last_purged {
            records.push(LogRecord::Purge(purged));
        }
        records.extend(
            self.entries
                .values()
                .map(|(entry, _)| LogRecord::Append(entry.clone())),
        );
        if self.committed.is_some() {
            records.push(LogRecord::Committed(self.committed));
        }
        records
    }
}

struct Inner {
    index: LogIndex,
    file: Arc<File>,
    file_bytes: u64,
    dir: PathBuf,
    compact_bytes: u64,
    /// Set by the first failed write or fsync; every later write fails with it.
    failed: Option<String>,
}

impl Inner {
    fn check_failed(&self) -> io::Result<()> {
        match &self.failed {
            Some(reason) => Err(io::Error::other(format!(
                "the Raft log failed earlier and refuses writes: {reason}"
            ))),
            None => Ok(()),
        }
    }

    /// Appends `bytes` to the file; a failed write fails the store.
    fn write_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.check_failed()?;
        if let Err(error) = (&*self.file).write_all(bytes) {
            self.failed = Some(error.to_string());
            return Err(error);
        }
        self.file_bytes += bytes.len() as u64;
        Ok(())
    }

    /// Writes and applies one record that is not an append (such records always apply).
    fn write_one(&mut self, record: LogRecord) -> io::Result<()> {
        debug_assert!(!matches!(record, LogRecord::Append(_)));
        let frame = record.to_frame()?;
        self.write_bytes(&frame)?;
        self.apply_written(record, frame.len() as u64)?;
        self.index.assert_contiguous();
        Ok(())
    }

    /// Checks that `entries` continue the log without a hole, then writes and applies them;
    /// a refused batch leaves the file and the index unchanged.
    fn write_appends(&mut self, entries: Vec<Entry>) -> io::Result<()> {
        let mut next = self.index.next_index();
        let purged = self.index.last_purged.map(|log_id| log_id.index);
        for entry in &entries {
            let index = entry.log_id.index;
            if purged.is_some_and(|purged| index <= purged) || index > next {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("append at index {index} does not continue the log (next {next}, purged {purged:?})"),
                ));
            }
            next = index.saturating_add(1);
        }
        // Log IDs grow along the log (Raft's log matching): an entry never follows one of a
        // later leader, in the batch or at the entry it is appended behind.
        if let Some(first) = entries.first() {
            let previous = self
                .index
                .entries
                .range(..first.log_id.index)
                .next_back()
                .map(|(_, (entry, _))| entry.log_id);
            let mut previous = previous.or(self.index.last_purged);
            for entry in &entries {
                assert!(
                    previous < Some(entry.log_id),
                    "append of {} behind {previous:?}: log IDs must grow along the log",
                    entry.log_id
                );
                previous = Some(entry.log_id);
            }
        }
        let mut buffer = Vec::new();
        let mut records = Vec::with_capacity(entries.len());
        for entry in entries {
            let record = LogRecord::Append(entry);
            let frame = record.to_frame()?;
            buffer.extend_from_slice(&frame);
            records.push((record, frame.len() as u64));
        }
        self.write_bytes(&buffer)?;
        for (record, frame_bytes) in records {
            self.apply_written(record, frame_bytes)?;
        }
        self.index.assert_contiguous();
        Ok(())
    }

    /// Applies a record already in the file; failing here means file and index disagree.
    fn apply_written(&mut self, record: LogRecord, frame_bytes: u64) -> io::Result<()> {
        self.index.apply(record, frame_bytes).map_err(|reason| {
            self.failed = Some(reason.clone());
            io::Error::other(reason)
        })
    }

    fn should_compact(&self) -> bool {
        self.file_bytes > self.compact_bytes
            && self.file_bytes > 2 * (self.index.entry_bytes + 4096)
    }

    /// Rewrites the file from the index: temp file, fsync, rename, directory fsync.
    fn compact(&mut self) -> io::Result<()> {
        self.check_failed()?;
        let temp_path = self.dir.join(LOG_TEMP_FILE_NAME);
        let log_path = self.dir.join(LOG_FILE_NAME);
        let mut buffer = log_header();
        for record in self.index.records() {
            buffer.extend_from_slice(&record.to_frame()?);
        }
        write_file_durably(&temp_path, &buffer)?;
        fs::rename(&temp_path, &log_path)?;
        sync_dir(&self.dir)?;
        let file = OpenOptions::new().append(true).open(&log_path)?;
        self.file = Arc::new(file);
        self.file_bytes = buffer.len() as u64;
        tracing::debug!(bytes = self.file_bytes, "compacted the Raft log");
        Ok(())
    }
}

fn log_header() -> Vec<u8> {
    let mut header = Vec::with_capacity(LOG_HEADER_BYTES);
    header.extend_from_slice(&LOG_MAGIC);
    header.extend_from_slice(&LOG_FORMAT_VERSION.to_le_bytes());
    header
}

/// Checks the file header: the magic, and a format version this build reads. Every version
/// so far (only 1) has the same frames and records, so replay does not depend on it.
fn check_log_header(path: &Path, bytes: &[u8]) -> Result<(), LogOpenError> {
    let Some(header) = bytes.get(..LOG_HEADER_BYTES) else {
        return Err(LogOpenError::BadHeader(path.to_owned()));
    };
    if header[..LOG_MAGIC.len()] != LOG_MAGIC {
        return Err(LogOpenError::BadHeader(path.to_owned()));
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if !(LOG_FORMAT_VERSION_MIN..=LOG_FORMAT_VERSION).contains(&version) {
        return Err(LogOpenError::UnsupportedVersion {
            path: path.to_owned(),
            version,
        });
    }
    Ok(())
}

/// Clips a range of log indexes to `[start, end)`; `None` when it is empty.
fn index_range(range: &impl RangeBounds<u64>) -> Option<(u64, u64)> {
    let start = match range.start_bound() {
        Bound::Included(&start) => start,
        Bound::Excluded(&start) => start.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&end) => end.saturating_add(1),
        Bound::Excluded(&end) => end,
        Bound::Unbounded => u64::MAX,
    };
    (start < end).then_some((start, end))
}

type Shared = Arc<Mutex<Inner>>;

/// The on-disk Raft log of one superpeer. Owned by the openraft core.
pub struct LogStore {
    shared: Shared,
    flush_queue: SyncSender<IOFlushed<TypeConfig>>,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.shared.lock();
        f.debug_struct("LogStore")
            .field("dir", &inner.dir)
            .field("file_bytes", &inner.file_bytes)
            .finish()
    }
}

/// A reader of the log for openraft's replication tasks; shares the store's index.
#[derive(Clone)]
pub struct LogReader {
    shared: Shared,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, replays it and cuts a torn tail. A purge that
    /// leaves the file above `compact_bytes` (and at over twice its live size) rewrites it.
    pub fn open(dir: &Path, compact_bytes: u64) -> Result<LogStore, LogOpenError> {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let log_path = dir.join(LOG_FILE_NAME);
        let temp_path = dir.join(LOG_TEMP_FILE_NAME);
        if temp_path.exists() {
            // A compaction that did not reach its rename: the old file is complete.
            fs::remove_file(&temp_path).map_err(io_error(&temp_path))?;
        }
        if !log_path.exists() {
            write_file_durably(&temp_path, &log_header()).map_err(io_error(&temp_path))?;
            fs::rename(&temp_path, &log_path).map_err(io_error(&log_path))?;
            sync_dir(dir).map_err(io_error(dir))?;
        }
        let bytes = fs::read(&log_path).map_err(io_error(&log_path))?;
        check_log_header(&log_path, &bytes)?;
        let mut index = LogIndex::default();
        let mut offset = LOG_HEADER_BYTES;
        loop {
            match read_frame(&bytes[offset..]) {
                Frame::End => break,
                Frame::Torn => {
                    tracing::warn!(
                        path = %log_path.display(),
                        offset,
                        dropped_bytes = bytes.len() - offset,
                        "cutting a torn or corrupt tail off the Raft log"
                    );
                    break;
                }
                Frame::Record(record, frame_bytes) => {
                    let corrupt = |reason: String| LogOpenError::Corrupt {
                        path: log_path.clone(),
                        offset: offset as u64,
                        reason,
                    };
                    let record = LogRecord::from_bytes(record)
                        .map_err(|error| corrupt(error.to_string()))?;
                    index.apply(record, frame_bytes as u64).map_err(corrupt)?;
                    offset += frame_bytes;
                }
            }
        }
        index.assert_contiguous();
        let file = OpenOptions::new()
            .append(true)
            .open(&log_path)
            .map_err(io_error(&log_path))?;
        if offset < bytes.len() {
            file.set_len(offset as u64).map_err(io_error(&log_path))?;
            file.sync_all().map_err(io_error(&log_path))?;
        }
        let shared = Arc::new(Mutex::new(Inner {
            index,
            file: Arc::new(file),
            file_bytes: offset as u64,
            dir: dir.to_owned(),
            compact_bytes,
            failed: None,
        }));
        let (flush_queue, requests) = mpsc::sync_channel(FLUSH_QUEUE_MAX);
        let flusher_shared = shared.clone();
        std::thread::Builder::new()
            .name("raft-log-fsync".to_owned())
            .spawn(move || flusher(flusher_shared, requests))
            .map_err(io_error(dir))?;
        Ok(LogStore {
            shared,
            flush_queue,
        })
    }

    /// Bytes of the record file now.
    pub fn file_bytes(&self) -> u64 {
        self.shared.lock().file_bytes
    }

    fn reader(&self) -> LogReader {
        LogReader {
            shared: self.shared.clone(),
        }
    }

    /// Fsyncs the current file outside the lock; marks the store failed on error.
    fn sync(&self) -> io::Result<()> {
        let file = {
            let inner = self.shared.lock();
            inner.check_failed()?;
            inner.file.clone()
        };
        file.sync_data().inspect_err(|error| {
            self.shared.lock().failed = Some(error.to_string());
        })
    }

    fn write_and_maybe_compact(&mut self, record: LogRecord) -> io::Result<()> {
        let mut inner = self.shared.lock();
        inner.write_one(record)?;
        if inner.should_compact() {
            if let Err(error) = inner.compact() {
                inner.failed = Some(error.to_string());
                return Err(error);
            }
        }
        Ok(())
    }
}

/// The fsync thread: waits for appends, fsyncs once for all that queued up meanwhile, then
/// completes their callbacks in order. Ends when the store is dropped.
fn flusher(shared: Shared, requests: Receiver<IOFlushed<TypeConfig>>) {
    while let Ok(first) = requests.recv() {
        let mut batch = vec![first];
        while let Ok(more) = requests.try_recv() {
            batch.push(more);
        }
        let file = {
            let inner = shared.lock();
            inner.check_failed().map(|()| inner.file.clone())
        };
        let result = file.and_then(|file| file.sync_data());
        if let Err(error) = &result {
            shared
                .lock()
                .failed
                .get_or_insert_with(|| error.to_string());
        }
        for callback in batch {
            match &result {
                Ok(()) => callback.io_completed(Ok(())),
                Err(error) => callback.io_completed(Err(io::Error::new(
                    error.kind(),
                    format!("fsync of the Raft log failed: {error}"),
                ))),
            }
        }
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let Some((start, end)) = index_range(&range) else {
            return Ok(Vec::new());
        };
        let inner = self.shared.lock();
        Ok(inner
            .index
            .entries
            .range(start..end)
            .map(|(_, (entry, _))| entry.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.shared.lock().index.vote)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        self.reader().try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.shared.lock().index.vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let inner = self.shared.lock();
        Ok(LogState {
            last_purged_log_id: inner.index.last_purged,
            last_log_id: inner.index.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        self.reader()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.shared.lock().write_one(LogRecord::Vote(*vote))?;
        self.sync()
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Durable with the next fsync; a committed position lost in a crash only means
        // fewer entries are re-applied before the node hears from the leader again.
        self.write_and_maybe_compact(LogRecord::Committed(committed))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.shared.lock().index.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.shared
            .lock()
            .write_appends(entries.into_iter().collect())?;
        self.flush_queue
            .send(callback)
            .map_err(|_| io::Error::other("the Raft log's fsync thread is gone"))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        // Durable with the next fsync, which precedes the acknowledgement of any entry
        // appended after it.
        self.shared
            .lock()
            .write_one(LogRecord::TruncateAfter(last_log_id))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.write_and_maybe_compact(LogRecord::Purge(log_id))
    }
}
