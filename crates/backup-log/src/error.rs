//! The log engine's typed errors.

use std::io;

/// Why bytes could not be decoded as a log entry (or a block or record around entries).
/// Disk content that is torn, stale or corrupt ends up here, never in a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A 0 type byte: the end-of-data marker.
    #[error("end of data")]
    EndOfData,
    /// The slice ends before the field or payload that starts in it.
    #[error("truncated: {needed} bytes needed")]
    Truncated {
        /// Bytes the entry needs from its start.
        needed: usize,
    },
    /// A chain position outside its chain.
    #[error("bad chain link {index} of {count}")]
    BadChain {
        /// The stored link index.
        index: u8,
        /// The stored link count.
        count: u8,
    },
    /// A run entry of fewer than 2 chunks, or whose CIDs leave the creator's local IDs.
    #[error("bad run of {count} chunks")]
    BadRun {
        /// The stored chunk count.
        count: u16,
    },
    /// A payload length above the limit of the log it was found in.
    #[error("payload of {payload_bytes} bytes exceeds {max}")]
    TooLong {
        /// The stored length.
        payload_bytes: u64,
        /// The limit.
        max: u32,
    },
    /// A checksum mismatch.
    #[error("checksum mismatch")]
    Checksum,
}

/// Everything a log engine call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// An I/O error of the storage backend, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What the engine was doing.
        context: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A configuration value out of its documented range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The zone is not known to this engine.
    #[error("unknown zone {0}")]
    UnknownZone(crate::ZoneId),
    /// `create_zone` on a zone that exists.
    #[error("zone {0} exists")]
    ZoneExists(crate::ZoneId),
    /// More zones than `zones_max`.
    #[error("too many zones (limit {0})")]
    TooManyZones(usize),
    /// A chunk larger than `chunk_bytes_max`.
    #[error("chunk of {bytes} bytes exceeds the limit of {max}")]
    ChunkTooLarge {
        /// Its size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// A bounded wait ran out (write buffer full, version buffer full, durability).
    #[error("timed out waiting for {what} ({state})")]
    Timeout {
        /// What the caller waited for.
        what: &'static str,
        /// Where the engine's pipeline stood when the wait ran out (sequence numbers,
        /// buffers, the writer and the reorganizer), for the operator.
        state: String,
    },
    /// The secondary log has no room even after reorganization.
    #[error("secondary log of zone {0} is full")]
    LogFull(crate::ZoneId),
    /// The engine stopped after an I/O error of its flusher; appends fail from then on.
    #[error("log engine failed: {0}")]
    Failed(String),
    /// The engine was shut down.
    #[error("log engine is shut down")]
    ShutDown,
    /// A file holds a header or block of a format version newer than this code reads
    /// (see `FORMAT_VERSION`): the engine does not open it, so nothing in it is taken for
    /// garbage and overwritten.
    #[error(
        "{file}: format version {version} is not supported (this code reads up to {supported})"
    )]
    UnsupportedFormat {
        /// The file.
        file: String,
        /// The version found.
        version: u32,
        /// The newest version this code reads.
        supported: u32,
    },
}

/// Result of the log engine's calls.
pub type LogResult<T> = Result<T, LogError>;

pub(crate) fn io_context(context: impl Into<String>) -> impl FnOnce(io::Error) -> LogError {
    let context = context.into();
    move |source| LogError::Io { context, source }
}
