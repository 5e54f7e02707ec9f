//! Durable file writes shared by the log store and the state machine.
//!
//! **Job.** Writes a whole file and fsyncs it; fsyncs a directory so that a rename or a
//! creation in it survives a crash. Together they make the "write a temp file, fsync,
//! rename, fsync the directory" sequence that replaces `raft-log` (compaction) and
//! `snapshot` atomically (`docs/raft-format.md`).
//!
//! **Invariants.** A function returns `Ok` only after the fsync it promises succeeded; any
//! error is returned unchanged (the callers decide whether it fails their store).
//!
//! **Callers.** [`crate::log_store`] and [`crate::state_machine`]; depends on no other module
//! of this crate.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Creates (or replaces) `path` with `bytes` and fsyncs it.
pub(crate) fn write_file_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Fsyncs a directory so that a rename or file creation in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
