//! The version log of one zone on disk: two files used in turn (appends to the active
//! one; a compaction writes the other one with the next generation and switches). Block
//! format in [`super::blocks`]; see "Version log" in `docs/log-format.md`.
//!
//! Callers: the engine's writer and syncer (removes and sealed epochs), the reorganizer
//! (load, compact), reopen (open, compact), recovery reads (`active_extent`).

use super::blocks::{encode_blocks, read_file};
use super::VersionRecord;
use crate::error::{io_context, LogResult};
use crate::storage::{AlignedBuf, LogFile, Storage, PAGE_BYTES};

/// The version log of one zone: two files used in turn. Appends go to the active one;
/// compaction writes the whole table to the other one with the next generation, and
/// reopening picks the valid file of the newer generation, so a torn compaction leaves the
/// old file in charge.
#[derive(Debug)]
pub struct VersionLog {
    storage: std::sync::Arc<dyn Storage>,
    names: [String; 2],
    files: [std::sync::Arc<dyn LogFile>; 2],
    active: usize,
    generation: u32,
    end: u64,
    /// Records in the active file (compaction is due when it is much larger than needed).
    records: u64,
    /// Bytes handed to the storage since open (appends and compactions, whole pages).
    bytes_written: u64,
}

impl VersionLog {
    /// Opens (or creates) the version log `base`.0/1 and loads every record in it.
    pub fn open(
        storage: std::sync::Arc<dyn Storage>,
        base: &str,
    ) -> LogResult<(VersionLog, Vec<VersionRecord>)> {
        let names = [format!("{base}.0"), format!("{base}.1")];
        let open = |name: &str| {
            storage
                .open(name, PAGE_BYTES as u64)
                .map_err(io_context(format!("opening {name}")))
        };
        let files: [std::sync::Arc<dyn LogFile>; 2] = [
            std::sync::Arc::from(open(&names[0])?),
            std::sync::Arc::from(open(&names[1])?),
        ];
        let a = read_file(files[0].as_ref(), &names[0])?;
        let b = read_file(files[1].as_ref(), &names[1])?;
        let (active, generation, end, records) = match (a, b) {
            (Some(a), Some(b)) => {
                if b.0.wrapping_sub(a.0) as i32 > 0 {
                    (1, b.0, b.1, b.2)
                } else {
                    (0, a.0, a.1, a.2)
                }
            }
            (Some(a), None) => (0, a.0, a.1, a.2),
            (None, Some(b)) => (1, b.0, b.1, b.2),
            (None, None) => (0, 0, 0, Vec::new()),
        };
        let mut log = VersionLog {
            storage,
            names,
            files,
            active,
            generation,
            end,
            records: records.len() as u64,
            bytes_written: 0,
        };
        if end == 0 {
            // A fresh log: write an empty first block so the file has a generation.
            log.append(&[])?;
        }
        Ok((log, records))
    }

    /// Records in the active file.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Bytes handed to the storage since open: appended blocks and compactions (whole
    /// pages, zero pages included).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    fn ensure_len(&mut self, index: usize, needed: u64) -> LogResult<()> {
        let len = self.files[index].len();
        if needed > len {
            let name = &self.names[index];
            let grown = needed.max(len.saturating_mul(2));
            self.files[index] = std::sync::Arc::from(
                self.storage
                    .open(name, grown)
                    .map_err(io_context(format!("growing {name}")))?,
            );
        }
        Ok(())
    }

    /// Appends `records` as one block and syncs.
    pub fn append(&mut self, records: &[VersionRecord]) -> LogResult<()> {
        self.append_unsynced(records)?
            .sync()
            .map_err(io_context("syncing version log"))
    }

    /// Appends `records` as one block without syncing: the records count only once the
    /// caller synced the returned file (with other files' syncs at the same time); if that
    /// sync fails the engine must stop (the log's end already counts the block).
    pub fn append_unsynced(
        &mut self,
        records: &[VersionRecord],
    ) -> LogResult<std::sync::Arc<dyn LogFile>> {
        let buf = encode_blocks(records, self.generation);
        let index = self.active;
        self.ensure_len(index, self.end + buf.len() as u64)?;
        self.files[index]
            .write_at(&buf, self.end)
            .map_err(io_context("appending to version log"))?;
        self.end += buf.len() as u64;
        self.records += records.len() as u64;
        self.bytes_written += buf.len() as u64;
        Ok(self.files[index].clone())
    }

    /// Loads every record of the active file.
    pub fn load(&self) -> LogResult<Vec<VersionRecord>> {
        Ok(
            read_file(self.files[self.active].as_ref(), &self.names[self.active])?
                .map_or_else(Vec::new, |r| r.2),
        )
    }

    /// The active file and the end of its blocks, for reading its records outside the
    /// log's lock with a [`BlockDecoder`](super::BlockDecoder) (the records [`VersionLog::load`] returns, read
    /// in large windows instead of two reads per block). Appends after the call go past
    /// the end taken here, and compaction writes the other file.
    pub fn active_extent(&self) -> (std::sync::Arc<dyn LogFile>, u64) {
        (self.files[self.active].clone(), self.end)
    }

    /// Replaces the log by `records` (one per chunk): writes them to the other file with
    /// the next generation, syncs, and switches to it.
    pub fn compact(&mut self, records: &[VersionRecord]) -> LogResult<()> {
        let other = 1 - self.active;
        let generation = self.generation.wrapping_add(1);
        let buf = encode_blocks(records, generation);
        self.ensure_len(other, buf.len() as u64 + PAGE_BYTES as u64)?;
        // Zero the page after the new content first so stale blocks of generation + 1
        // cannot follow it (generations are 32-bit; this is belt and braces).
        self.files[other]
            .write_at(&buf, 0)
            .map_err(io_context("compacting version log"))?;
        self.bytes_written += buf.len() as u64;
        if self.files[other].len() >= buf.len() as u64 + PAGE_BYTES as u64 {
            let zero = AlignedBuf::zeroed(PAGE_BYTES);
            self.files[other]
                .write_at(&zero, buf.len() as u64)
                .map_err(io_context("compacting version log"))?;
            self.bytes_written += PAGE_BYTES as u64;
        }
        self.files[other]
            .sync()
            .map_err(io_context("syncing compacted version log"))?;
        self.active = other;
        self.generation = generation;
        self.end = buf.len() as u64;
        self.records = records.len() as u64;
        Ok(())
    }
}
