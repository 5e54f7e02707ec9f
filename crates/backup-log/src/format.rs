//! The version of the on-disk formats (see "Version history" in `docs/log-format.md`).
//!
//! Every file header and version-log block carries it: segment headers and the primary
//! log's header in their former reserved word (bytes 8..12), version-log blocks in the
//! top byte of their count word (byte 11). Format 0 is what was written before the field
//! existed (those bytes were always zero); it differs from format 1 in nothing else, so
//! one reader reads both. A header or block whose checksum verifies but whose version is
//! newer than [`FORMAT_VERSION`] was written by newer code: the engine refuses to open it
//! ([`LogError::UnsupportedFormat`]) instead of taking it for garbage and overwriting it.
//!
//! A lower module: used by `seclog`, `primary` and `version` alike.

use crate::error::{LogError, LogResult};

/// The format version this code writes. It reads every version up to this one.
pub const FORMAT_VERSION: u32 = 1;

/// Checks the format version found in a verified header or block of `file`.
pub(crate) fn check(version: u32, file: &str) -> LogResult<()> {
    if version <= FORMAT_VERSION {
        Ok(())
    } else {
        Err(LogError::UnsupportedFormat {
            file: file.to_string(),
            version,
            supported: FORMAT_VERSION,
        })
    }
}
