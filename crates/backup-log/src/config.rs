//! Settings of a log engine and the limits every buffer and pool is bounded by.
//!
//! Job: one place for every size, count and threshold of the engine, with DXRAM's defaults
//! (Beineke ch. 4–6) and the range each may take. [`LogConfig::validate`] rejects anything
//! outside the ranges, so the rest of the engine may rely on them.

use std::time::Duration;

use crate::error::{LogError, LogResult};
use crate::storage::{round_up_to_page, PAGE_BYTES};

/// The largest segment: entry lengths have at most 3 bytes in practice and half a segment
/// must fit them (16 MiB − 1).
pub const SEGMENT_BYTES_MAX: u64 = 32 << 20;
/// The smallest segment (tests use small ones).
pub const SEGMENT_BYTES_MIN: u64 = 4 * PAGE_BYTES as u64;
/// The most segments one secondary log may have.
pub const SEGMENTS_PER_LOG_MAX: u64 = 1 << 16;
/// The most zones one engine holds.
pub const ZONES_MAX: usize = 1 << 16;

/// Settings of a [`crate::LogEngine`]. Every field has a default (see [`Default`]).
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Size of one secondary log. Default 512 MiB (2 × the 256 MiB zone); rounded up to
    /// whole segments; at most [`SEGMENTS_PER_LOG_MAX`] segments.
    pub secondary_log_bytes: u64,
    /// Segment size. Default 8 MiB; a power of two in
    /// [`SEGMENT_BYTES_MIN`]..=[`SEGMENT_BYTES_MAX`]. An entry never spans segments; chunks
    /// above half a segment are chained.
    pub segment_bytes: u64,
    /// Write buffer size, in two halves: appends fill one half while the flusher drains the
    /// other; the flusher takes a half once the buffer is about half full (the half
    /// 15/16 full), or after `flush_interval`, or when someone waits for durability. The
    /// flusher sorts a taken half by zone and hands it to the writer thread, which copies
    /// its entries to the disk and gives it back; two more halves are kept so producers
    /// need not wait for the writer (so the engine holds twice this size). Default 32 MiB;
    /// at least 2 segments (a half must hold the largest entry), at most 16 GiB.
    pub write_buffer_bytes: u64,
    /// Flush the write buffer at least this often. Default 100 ms.
    pub flush_interval: Duration,
    /// After this long without appends the engine gives back what it holds for bursts:
    /// each zone's secondary-log buffer is written to its secondary log (and synced),
    /// and the writer's page images and scratch buffers, the flusher's per-zone lists
    /// and the write buffer's touched pages are freed. They come back with the next
    /// burst (a few allocations and page faults). Default 1 s; zero never releases. At
    /// most 1 hour.
    pub idle_release_after: Duration,
    /// A zone whose batch in one flush reaches this size goes straight to its secondary log;
    /// smaller batches go to the primary log plus the zone's secondary-log buffer of this
    /// size. Default 128 KiB; 0 disables two-level logging (every batch goes straight to the
    /// secondary log; for NVRAM or battery-backed disks).
    pub secondary_buffer_bytes: u64,
    /// Size of the primary log. Default 256 MiB. When it is full, every secondary-log
    /// buffer is flushed and it starts over.
    pub primary_log_bytes: u64,
    /// Versions one zone's version buffer holds (current epoch). An epoch ends when it is
    /// `version_buffer_seal_percent` full. Default 16,384: 10,649 versions per epoch, at
    /// most about 170 KiB of slots for the buffer and as much for the previous epoch's
    /// carry. DXRAM used 1 MiB (Ch. 4) or 3 MiB (Table II) per zone; this is smaller
    /// because a backup holds the buffers of every zone it backs up, and at 196,608 they
    /// were 17 B of RAM per backed-up chunk in `myriad bench backup-mem` (2.8 B at
    /// 32,768, 1.5 B at 16,384), at a small cost in `myriad bench log-cleaner`: write
    /// amplification 5.72–5.79 at 196,608, 4.76–5.06 at 32,768, 5.18–5.24 at 16,384
    /// (docs/benchmarks.md, "Smaller version buffers" and "Trimmed heaps"). Smaller
    /// epochs come more often, so eon visits do too (one full pass per log every 2^13
    /// epochs: at 100,000 updates per second to one zone, every 15 minutes).
    pub version_buffer_entries_max: usize,
    /// Fill level (percent) at which the version buffer's epoch ends. Default 65.
    pub version_buffer_seal_percent: u32,
    /// Log utilization (percent) above which the periodic reorganizer may pick a log.
    /// Default 60.
    pub reorg_activation_percent: u32,
    /// Log utilization (percent) at which a write registers a prompt reorganization
    /// request. Default 75.
    pub reorg_prompt_percent: u32,
    /// Segments cleaned per prompt or periodic reorganization pass (twice as many when the
    /// log is nearly out of free segments). Default 20.
    pub reorg_segments_per_pass: usize,
    /// How often the reorganizer looks for work. Default 100 ms.
    pub reorg_interval: Duration,
    /// Every log is fully reorganized (all its segments, moving old valid entries into
    /// the current eon) at least once per this many of its epochs. Default 2^13, a quarter
    /// of an eon (2^15 epochs), which leaves a wide margin before epochs wrap.
    pub eon_visit_epochs: u16,
    /// Bytes of old chained chunks an eon visit keeps in RAM to write them again with a
    /// fresh version (their links are copied as they are, and written once more after the
    /// visit's loop). A chain reserves its whole size at its first link; chains that do
    /// not fit wait for a later visit, except the first of a visit, which is always taken
    /// (so RAM use is at most this or one `chunk_bytes_max` chain). Default 64 MiB.
    pub chain_refresh_bytes: u64,
    /// The largest chunk. Default 256 MiB; at most 255 links of half a segment each.
    pub chunk_bytes_max: u64,
    /// The most zones. Default 4,096; at most [`ZONES_MAX`].
    pub zones_max: usize,
    /// How long an append waits for room in the write buffer or version buffer, and a
    /// write for room in a secondary log, before failing. Default 10 s.
    pub wait_timeout: Duration,
    /// Threads reading segments during a recovery read (see
    /// `RecoveryOptions::from_config`) and zones scanned at once when reopening. Default
    /// 4 (DXRAM's best).
    pub recovery_threads: usize,
    /// Verify checksums during a recovery read. Default true. Reopen after a crash always
    /// verifies.
    pub recovery_verify_crc: bool,
    /// I/O threads the writer thread hands its secondary-log writes to, so it fills the
    /// next page image while the disk takes the last one, and writes to different logs
    /// are in flight together. Default 2; 0 makes the writer thread write them itself.
    /// At most 16. The writer's page-image buffers are `write_threads + 1` (each up to a
    /// segment) instead of one.
    pub write_threads: usize,
    /// Chunks of at most this many payload bytes that reach a secondary log together,
    /// with consecutive CIDs and one version (a bulk load, a recovery's copy), are stored
    /// as one *run entry*: one header for up to 64 KiB of payloads. For 64-byte chunks
    /// that is 17% fewer bytes to write and to read back in a recovery. Default 256; 0
    /// stores every chunk with its own header.
    pub run_chunk_bytes_max: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            secondary_log_bytes: 512 << 20,
            segment_bytes: 8 << 20,
            write_buffer_bytes: 32 << 20,
            flush_interval: Duration::from_millis(100),
            idle_release_after: Duration::from_secs(1),
            secondary_buffer_bytes: 128 << 10,
            primary_log_bytes: 256 << 20,
            version_buffer_entries_max: 16_384,
            version_buffer_seal_percent: 65,
            reorg_activation_percent: 60,
            reorg_prompt_percent: 75,
            reorg_segments_per_pass: 20,
            reorg_interval: Duration::from_millis(100),
            eon_visit_epochs: 1 << 13,
            chain_refresh_bytes: 64 << 20,
            chunk_bytes_max: 256 << 20,
            zones_max: 4096,
            wait_timeout: Duration::from_secs(10),
            recovery_threads: 4,
            recovery_verify_crc: true,
            write_threads: 2,
            run_chunk_bytes_max: 256,
        }
    }
}

impl LogConfig {
    /// The largest payload of one entry: half a segment minus room for the segment header
    /// and the largest entry header.
    pub fn entry_payload_bytes_max(&self) -> u32 {
        (self.segment_bytes / 2) as u32 - 64
    }

    /// Segments of one secondary log.
    pub fn segments_per_log(&self) -> u64 {
        self.secondary_log_bytes.div_ceil(self.segment_bytes)
    }

    /// Version-buffer entries at which the epoch ends.
    pub fn version_seal_entries(&self) -> usize {
        (self.version_buffer_entries_max as u64 * u64::from(self.version_buffer_seal_percent) / 100)
            .max(1) as usize
    }

    /// Checks every field against its documented range.
    pub fn validate(&self) -> LogResult<()> {
        let bad = |what: &str| Err(LogError::InvalidConfig(what.to_string()));
        if !self.segment_bytes.is_power_of_two()
            || !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.segment_bytes)
        {
            return bad("segment_bytes must be a power of two in 16 KiB..=32 MiB");
        }
        let segments = self.segments_per_log();
        if !(3..=SEGMENTS_PER_LOG_MAX).contains(&segments) {
            return bad("secondary_log_bytes must hold 3..=65536 segments");
        }
        if self.write_buffer_bytes < 2 * self.segment_bytes || self.write_buffer_bytes > 1 << 34 {
            return bad("write_buffer_bytes must be 2 segments..=16 GiB");
        }
        if self.secondary_buffer_bytes > self.segment_bytes / 2 {
            return bad("secondary_buffer_bytes must be at most half a segment");
        }
        if self.secondary_buffer_bytes > 0
            && (self.primary_log_bytes
                < 4 * round_up_to_page(self.write_buffer_bytes as usize / 2) as u64
                || self.primary_log_bytes > 1 << 40)
        {
            return bad("primary_log_bytes must be at least 2 write buffers");
        }
        if self.version_buffer_entries_max < 2 || self.version_buffer_entries_max > 1 << 26 {
            return bad("version_buffer_entries_max must be 2..=2^26");
        }
        if !(1..=100).contains(&self.version_buffer_seal_percent) {
            return bad("version_buffer_seal_percent must be 1..=100");
        }
        if self.reorg_activation_percent > 100
            || self.reorg_prompt_percent > 100
            || self.reorg_segments_per_pass == 0
        {
            return bad("reorganization thresholds must be percentages, segments per pass ≥ 1");
        }
        if self.eon_visit_epochs == 0 || self.eon_visit_epochs > 1 << 14 {
            return bad("eon_visit_epochs must be 1..=2^14");
        }
        let chain_max = 255 * u64::from(self.entry_payload_bytes_max());
        if self.chunk_bytes_max == 0 || self.chunk_bytes_max > chain_max {
            return bad("chunk_bytes_max must be 1..=255 links of half a segment");
        }
        if self.zones_max == 0 || self.zones_max > ZONES_MAX {
            return bad("zones_max must be 1..=65536");
        }
        if self.recovery_threads == 0 || self.recovery_threads > 64 {
            return bad("recovery_threads must be 1..=64");
        }
        if self.write_threads > 16 {
            return bad("write_threads must be 0..=16");
        }
        if self.idle_release_after > Duration::from_secs(3600) {
            return bad("idle_release_after must be at most 1 hour");
        }
        Ok(())
    }

    /// A small configuration for tests: 16 KiB segments, 8 segments per log, 64 KiB write
    /// buffer, 2 KiB secondary-log buffers, short intervals.
    pub fn small_for_tests() -> LogConfig {
        LogConfig {
            secondary_log_bytes: 8 * 16384,
            segment_bytes: 16384,
            write_buffer_bytes: 65536,
            flush_interval: Duration::from_millis(5),
            idle_release_after: Duration::from_secs(1),
            secondary_buffer_bytes: 2048,
            primary_log_bytes: 4 * 65536,
            version_buffer_entries_max: 64,
            version_buffer_seal_percent: 65,
            reorg_activation_percent: 60,
            reorg_prompt_percent: 75,
            reorg_segments_per_pass: 4,
            reorg_interval: Duration::from_millis(5),
            eon_visit_epochs: 1 << 13,
            chain_refresh_bytes: 64 << 20,
            chunk_bytes_max: 100_000,
            zones_max: 64,
            wait_timeout: Duration::from_secs(10),
            recovery_threads: 2,
            recovery_verify_crc: true,
            write_threads: 2,
            run_chunk_bytes_max: 256,
        }
    }
}
