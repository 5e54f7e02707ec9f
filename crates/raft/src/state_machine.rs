//! The replicated state machine: a [`MetaState`] that committed entries are applied to, and
//! its snapshots on disk.
//!
//! **Job.** Implements openraft's [`RaftStateMachine`]: applies committed entries in log
//! order and answers each writer with the [`Response`]; builds, persists, installs and
//! serves snapshots; hands the node a read handle ([`MetaStateReader`]).
//!
//! **Format.** `snapshot` in the superpeer's directory: magic `MYRDRSNP`, u32 LE format
//! version ([`SNAPSHOT_FORMAT_VERSION`]; versions from [`SNAPSHOT_FORMAT_VERSION_MIN`] are
//! read, others refused with [`SnapshotOpenError::UnsupportedVersion`]), u64 LE body length, u32 LE crc32c of the body, then the body: the snapshot
//! meta ([`crate::codec::encode_snapshot_meta`]) and the length-prefixed
//! [`MetaState::snapshot`] bytes. Byte-level layout: `docs/raft-format.md`.
//!
//! **Invariants.**
//! - The state is in memory only; what survives a restart is the snapshot file plus the
//!   committed entries of the log, which openraft re-applies on start (the log store saves
//!   the committed position for that).
//! - A snapshot file is written to `snapshot.tmp`, fsynced, renamed over `snapshot`, and the
//!   directory fsynced: a crash leaves the old or the new snapshot, never a torn one.
//!   A snapshot file that fails its checks refuses the open: the log may be purged up to it.
//! - The persisted snapshot never moves backwards: a built snapshot older than the one on
//!   disk (an install overtook it) is not written (and writing one is asserted against).
//! - Entries apply in log order, each once: after the first, each entry's index is one past
//!   the last applied (asserted).
//! - Applying is deterministic ([`MetaState::apply`]), so every superpeer that applied the
//!   same entries holds byte-equal [`MetaState::snapshot`]s.
//!
//! - An [`ApplyObserver`], when set, sees every applied entry in log order, with the
//!   state right after it, on every member (leader or not), also when entries are applied
//!   again after a restart.
//!
//! **Callers.** openraft's state-machine worker; the node reads through [`MetaStateReader`]
//! and observes applied commands through an [`ApplyObserver`] (e.g. to push events in
//! commit order).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::{Stream, TryStreamExt};
use myriad_meta::{Command, MetaState, Response};
use myriad_types::codec::{DecodeError, Decoder, Encoder};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::OptionalSend;
use parking_lot::{Mutex, RwLock};
use thiserror::Error;

use crate::codec::{decode_snapshot_meta, encode_snapshot_meta};
use crate::files::{sync_dir, write_file_durably};
use crate::limits::SNAPSHOT_BYTES_MAX;
use crate::types::{
    Entry, EntryPayload, LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig,
};

/// Name of the snapshot file in the superpeer's directory.
pub const SNAPSHOT_FILE_NAME: &str = "snapshot";
const SNAPSHOT_TEMP_FILE_NAME: &str = "snapshot.tmp";
const SNAPSHOT_MAGIC: [u8; 8] = *b"MYRDRSNP";
/// Format version after the magic: what this build writes. `docs/raft-format.md`,
/// "Version history", lists every version.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;
/// Oldest format version this build still reads. A snapshot file is only ever replaced
/// whole, so one of an older version is read as it is until the next snapshot replaces it.
pub const SNAPSHOT_FORMAT_VERSION_MIN: u32 = 1;
/// Bytes before the body: magic, version, body length, CRC.
const SNAPSHOT_HEADER_BYTES: usize = 24;

/// Why the snapshot file could not be loaded.
#[derive(Debug, Error)]
pub enum SnapshotOpenError {
    /// A file operation failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The file is damaged or not a snapshot file.
    #[error("snapshot file {path} is invalid: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file is a snapshot of a format version this build does not read (written by a
    /// newer build, or damaged).
    #[error(
        "snapshot file {path} has format version {version}; this build reads versions \
         {SNAPSHOT_FORMAT_VERSION_MIN} to {SNAPSHOT_FORMAT_VERSION}"
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version in its header.
        version: u32,
    },
}

/// Why the bytes of a snapshot file do not decode.
#[derive(Debug, Error)]
pub enum SnapshotFileError {
    /// The header names a format version this build does not read.
    #[error(
        "snapshot format version {0} is not one this build reads \
         ({SNAPSHOT_FORMAT_VERSION_MIN} to {SNAPSHOT_FORMAT_VERSION})"
    )]
    UnsupportedVersion(u32),
    /// The file is damaged or not a snapshot file.
    #[error(transparent)]
    Invalid(#[from] DecodeError),
}

/// The applied state and what openraft needs to know about it: what a member's state
/// machine holds. Public for the deterministic simulator (`myriad-testing`), whose
/// in-memory state machine applies entries with [`Applied::apply_entry`] as this crate's
/// store does.
#[derive(Debug, Default)]
pub struct Applied {
    /// The metadata.
    pub state: MetaState,
    /// The last entry applied.
    pub last_applied: Option<LogId>,
    /// The membership as of the last membership entry applied.
    pub membership: StoredMembership,
}

impl Applied {
    /// Applies the next log entry: a command to the metadata, a membership to the
    /// membership. Returns the command (if it was one) and the state machine's response.
    ///
    /// # Panics
    /// When `entry` is not the entry after the last one applied: entries apply in log
    /// order, each once (a skipped or repeated entry would make this member's state differ
    /// from the others').
    pub fn apply_entry(&mut self, entry: Entry) -> (Option<Command>, Response) {
        if let Some(last) = self.last_applied {
            assert!(
                entry.log_id.index == last.index.saturating_add(1),
                "applying {} after {last}: entries must apply in log order",
                entry.log_id
            );
        }
        self.last_applied = Some(entry.log_id);
        match entry.payload {
            EntryPayload::Blank => (None, Response::Done),
            EntryPayload::Normal(command) => {
                let response = self.state.apply(&command);
                (Some(command), response)
            }
            EntryPayload::Membership(membership) => {
                self.membership = StoredMembership::new(Some(entry.log_id), membership);
                (None, Response::Done)
            }
        }
    }
}

/// Read access to the replicated [`MetaState`] (cheap to clone).
#[derive(Debug, Clone)]
pub struct MetaStateReader {
    applied: Arc<RwLock<Applied>>,
}

impl MetaStateReader {
    /// Runs `f` on the current state under a read lock (keep `f` short: it holds up
    /// applying).
    pub fn read<T>(&self, f: impl FnOnce(&MetaState) -> T) -> T {
        f(&self.applied.read().state)
    }

    /// The index of the last applied entry.
    pub fn last_applied_index(&self) -> Option<u64> {
        self.applied.read().last_applied.map(|log_id| log_id.index)
    }
}

/// The persisted snapshot and where it lives.
#[derive(Debug)]
struct SnapshotSlot {
    dir: PathBuf,
    current: Option<Snapshot>,
}

impl SnapshotSlot {
    /// Writes `snapshot` durably and makes it current.
    fn persist(&mut self, snapshot: Snapshot) -> io::Result<()> {
        // The log may already be purged up to the current snapshot: replacing it with an
        // older one would lose committed entries on the next start.
        if let Some(current) = &self.current {
            assert!(
                current.meta.last_log_id <= snapshot.meta.last_log_id,
                "snapshot at {:?} would replace the newer one at {:?}",
                snapshot.meta.last_log_id,
                current.meta.last_log_id
            );
        }
        let bytes = encode_snapshot_file(&snapshot.meta, &snapshot.snapshot)?;
        let temp_path = self.dir.join(SNAPSHOT_TEMP_FILE_NAME);
        write_file_durably(&temp_path, &bytes)?;
        fs::rename(&temp_path, self.dir.join(SNAPSHOT_FILE_NAME))?;
        sync_dir(&self.dir)?;
        self.current = Some(snapshot);
        Ok(())
    }
}

/// Encodes the snapshot file: header, then meta and data.
pub fn encode_snapshot_file(meta: &SnapshotMeta, data: &[u8]) -> io::Result<Vec<u8>> {
    if data.len() > SNAPSHOT_BYTES_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "snapshot of {} bytes exceeds {SNAPSHOT_BYTES_MAX}",
                data.len()
            ),
        ));
    }
    let mut body = Encoder::new();
    encode_snapshot_meta(&mut body, meta);
    body.put_bytes(data);
    let body = body.into_vec();
    let mut file = Vec::with_capacity(SNAPSHOT_HEADER_BYTES + body.len());
    file.extend_from_slice(&SNAPSHOT_MAGIC);
    file.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
    file.extend_from_slice(&(body.len() as u64).to_le_bytes());
    file.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    file.extend_from_slice(&body);
    Ok(file)
}

/// Decodes and checks a snapshot file: header (magic, a version this build reads), CRC,
/// meta, and that the data is a valid [`MetaState`] snapshot. Every version so far (only 1)
/// has the same layout after the version.
pub fn decode_snapshot_file(
    bytes: &[u8],
) -> Result<(SnapshotMeta, Vec<u8>, MetaState), SnapshotFileError> {
    let (header, body) = bytes
        .split_at_checked(SNAPSHOT_HEADER_BYTES)
        .ok_or(DecodeError::Truncated("snapshot header"))?;
    if header[..8] != SNAPSHOT_MAGIC {
        return Err(DecodeError::Invalid("not a snapshot file").into());
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if !(SNAPSHOT_FORMAT_VERSION_MIN..=SNAPSHOT_FORMAT_VERSION).contains(&version) {
        return Err(SnapshotFileError::UnsupportedVersion(version));
    }
    let mut length = [0u8; 8];
    length.copy_from_slice(&header[12..20]);
    let length = u64::from_le_bytes(length);
    if length != body.len() as u64 {
        return Err(DecodeError::Invalid("snapshot body length").into());
    }
    let crc = u32::from_le_bytes([header[20], header[21], header[22], header[23]]);
    if crc32c::crc32c(body) != crc {
        return Err(DecodeError::Invalid("snapshot checksum").into());
    }
    let mut reader = Decoder::from_slice(body);
    let meta = decode_snapshot_meta(&mut reader)?;
    let data = reader
        .get_slice("snapshot data", SNAPSHOT_BYTES_MAX)?
        .to_vec();
    reader.finish()?;
    let state = MetaState::from_snapshot(&data)?;
    Ok((meta, data, state))
}

/// Called for every applied entry, in log order: the entry's log index, its command (`None`
/// for the blank entry a new leader appends at the start of its term, and for membership
/// entries), the response and the state right after it. Runs on the state-machine worker
/// under the state's write lock, so it must be quick and must not block (hand work to a
/// channel).
pub type ApplyObserver = Arc<dyn Fn(u64, Option<&Command>, &Response, &MetaState) + Send + Sync>;

/// The state machine of one superpeer, owned by openraft's state-machine worker.
pub struct StateMachineStore {
    applied: Arc<RwLock<Applied>>,
    slot: Arc<Mutex<SnapshotSlot>>,
    observer: Option<ApplyObserver>,
}

impl std::fmt::Debug for StateMachineStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMachineStore")
            .field("observed", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

impl StateMachineStore {
    /// Opens the state machine of `dir`: the state of its snapshot file, or an empty state.
    pub fn open(dir: &Path) -> Result<StateMachineStore, SnapshotOpenError> {
        let io_error = |path: &Path| {
            let path = path.to_owned();
            move |source| SnapshotOpenError::Io { path, source }
        };
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let temp_path = dir.join(SNAPSHOT_TEMP_FILE_NAME);
        if temp_path.exists() {
            fs::remove_file(&temp_path).map_err(io_error(&temp_path))?;
        }
        let path = dir.join(SNAPSHOT_FILE_NAME);
        let mut applied = Applied::default();
        let mut current = None;
        if path.exists() {
            let bytes = fs::read(&path).map_err(io_error(&path))?;
            let (meta, data, state) =
                decode_snapshot_file(&bytes).map_err(|error| match error {
                    SnapshotFileError::UnsupportedVersion(version) => {
                        SnapshotOpenError::UnsupportedVersion {
                            path: path.clone(),
                            version,
                        }
                    }
                    SnapshotFileError::Invalid(error) => SnapshotOpenError::Corrupt {
                        path: path.clone(),
                        reason: error.to_string(),
                    },
                })?;
            applied = Applied {
                state,
                last_applied: meta.last_log_id,
                membership: meta.last_membership.clone(),
            };
            current = Some(Snapshot {
                meta,
                snapshot: data,
            });
        }
        Ok(StateMachineStore {
            applied: Arc::new(RwLock::new(applied)),
            slot: Arc::new(Mutex::new(SnapshotSlot {
                dir: dir.to_owned(),
                current,
            })),
            observer: None,
        })
    }

    /// Calls `observer` for every command applied from now on (see [`ApplyObserver`]).
    pub fn with_observer(mut self, observer: ApplyObserver) -> StateMachineStore {
        self.observer = Some(observer);
        self
    }

    /// A read handle on the applied state.
    pub fn reader(&self) -> MetaStateReader {
        MetaStateReader {
            applied: self.applied.clone(),
        }
    }

    fn builder(&self) -> SnapshotBuilder {
        SnapshotBuilder {
            applied: self.applied.clone(),
            slot: self.slot.clone(),
        }
    }
}

/// Builds a snapshot of the applied state and persists it.
#[derive(Debug)]
pub struct SnapshotBuilder {
    applied: Arc<RwLock<Applied>>,
    slot: Arc<Mutex<SnapshotSlot>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let snapshot = {
            let applied = self.applied.read();
            Snapshot {
                meta: SnapshotMeta {
                    last_log_id: applied.last_applied,
                    last_membership: applied.membership.clone(),
                },
                snapshot: applied.state.snapshot(),
            }
        };
        let mut slot = self.slot.lock();
        let newer_on_disk = slot
            .current
            .as_ref()
            .is_some_and(|current| current.meta.last_log_id >= snapshot.meta.last_log_id);
        if !newer_on_disk {
            slot.persist(snapshot.clone())?;
        }
        Ok(snapshot)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let applied = self.applied.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let response = {
                let mut applied = self.applied.write();
                let index = entry.log_id.index;
                let (command, response) = applied.apply_entry(entry);
                if let Some(observer) = &self.observer {
                    observer(index, command.as_ref(), &response, &applied.state);
                }
                response
            };
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        self.builder()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let state = MetaState::from_snapshot(&snapshot)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        self.slot.lock().persist(Snapshot {
            meta: meta.clone(),
            snapshot,
        })?;
        let mut applied = self.applied.write();
        *applied = Applied {
            state,
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        Ok(self.slot.lock().current.clone())
    }
}
