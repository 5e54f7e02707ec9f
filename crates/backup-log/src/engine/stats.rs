//! Figures of the engine ([`LogEngine::stats`]): memory, fill levels, bytes written,
//! reorganization work. Read under the zone locks one zone at a time; for tools,
//! benchmarks and tests, not for decisions of the engine. See the [parent module](super).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{LogEngine, Seq};
use crate::seclog::SegmentInfo;
use crate::ZoneId;

impl LogEngine {
    /// Memory use and fill levels, per zone and in total.
    pub fn stats(&self) -> EngineStats {
        let inner = &self.inner;
        let mut zones: Vec<ZoneStats> = inner
            .zones
            .read()
            .values()
            .map(|z| {
                let log = z.log.lock();
                let vm = z.versions.lock();
                let segments = log.seclog.segments().len() as u64;
                ZoneStats {
                    zone: z.id,
                    used_bytes: log.seclog.used_bytes(),
                    capacity_bytes: log.seclog.capacity_bytes(),
                    free_segments: log.seclog.free_segments(),
                    secondary_buffer_bytes: log.sec_buffer.len() as u64,
                    version_buffer_entries: vm.buffered() as u64,
                    epoch: vm.epoch(),
                    version_log_records: log.vlog.records(),
                    memory_bytes: log.sec_buffer.capacity() as u64
                        + vm.memory_bytes()
                        + segments * std::mem::size_of::<SegmentInfo>() as u64
                        + crate::storage::PAGE_BYTES as u64,
                }
            })
            .collect();
        zones.sort_by_key(|z| z.zone);
        let (secondary_device_bytes_written, version_log_bytes_written) = inner
            .zones
            .read()
            .values()
            .map(|z| {
                let log = z.log.lock();
                (log.seclog.device_bytes_written(), log.vlog.bytes_written())
            })
            .fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
        let c = &inner.counters;
        let (appended_entries, appended_payload_bytes, write_buffer_bytes, busy_halves) = {
            let wb = inner.wb.lock();
            (
                wb.appended_entries,
                wb.appended_payload_bytes,
                wb.active.len() as u64,
                // Every half is the active one, a spare, or with the flusher or writer.
                (super::WRITE_BUFFER_HALVES - 1).saturating_sub(wb.spares.len()) as u64,
            )
        };
        let primary_bytes_written = inner
            .primary
            .lock()
            .as_ref()
            .map_or(0, |p| p.bytes_written());
        EngineStats {
            write_buffer_capacity_bytes: inner.config.write_buffer_bytes,
            write_buffer_bytes,
            write_buffer_busy_halves: busy_halves,
            memory_bytes: inner.config.write_buffer_bytes
                + zones.iter().map(|z| z.memory_bytes).sum::<u64>(),
            zones,
            appended_entries,
            appended_payload_bytes,
            removes: c.removes.load(Ordering::Relaxed),
            secondary_bytes_written: c.secondary_bytes_written.load(Ordering::Relaxed),
            primary_bytes_written,
            secondary_device_bytes_written,
            version_log_bytes_written,
            flushes: c.flushes.load(Ordering::Relaxed),
            reorg_passes: c.reorg_passes.load(Ordering::Relaxed),
            reorg_urgent_passes: c.reorg_urgent_passes.load(Ordering::Relaxed),
            reorg_segments_cleaned: c.reorg_segments_cleaned.load(Ordering::Relaxed),
            reorg_census_segments: c.reorg_census_segments.load(Ordering::Relaxed),
            reorg_bytes_written: c.reorg_bytes_written.load(Ordering::Relaxed),
            reorg_entries_restamped: c.reorg_entries_restamped.load(Ordering::Relaxed),
            reorg_cleaned: {
                let r = &c.reorg_cleaned;
                let get = |a: &[AtomicU64; 2], i: usize| a[i].load(Ordering::Relaxed);
                CleanedStats {
                    used_bytes: get(&r.used, 0),
                    estimated_live_bytes: get(&r.estimated_live, 0),
                    live_bytes: get(&r.live, 0),
                    urgent_used_bytes: get(&r.used, 1),
                    urgent_estimated_live_bytes: get(&r.estimated_live, 1),
                    urgent_live_bytes: get(&r.live, 1),
                }
            },
            durable_seq: self.durable_seq(),
            idle_releases: c.idle_releases.load(Ordering::Relaxed),
        }
    }
}

/// Per-zone figures of [`LogEngine::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneStats {
    /// The zone.
    pub zone: ZoneId,
    /// Bytes used in its secondary log (valid and outdated entries).
    pub used_bytes: u64,
    /// Size of its secondary log.
    pub capacity_bytes: u64,
    /// Free segments.
    pub free_segments: usize,
    /// Bytes waiting in its secondary-log buffer.
    pub secondary_buffer_bytes: u64,
    /// Chunks in its version buffer.
    pub version_buffer_entries: u64,
    /// Its current epoch.
    pub epoch: u16,
    /// Records in its version log file.
    pub version_log_records: u64,
    /// RAM this zone holds: secondary-log buffer, version buffer and sealed epoch, segment
    /// table, segment tail.
    pub memory_bytes: u64,
}

/// Segments cleaned by reorganization passes (see [`EngineStats::reorg_cleaned`]): bytes
/// used in them, the live bytes the pass's pick estimated (`SegmentUsage`, an upper
/// bound) and the valid entry bytes it found and copied. Prompt and periodic passes pick
/// by these estimates; urgent passes clean best first until enough is free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanedStats {
    /// Bytes used in the segments prompt and periodic passes cleaned.
    pub used_bytes: u64,
    /// Their estimated live bytes when picked.
    pub estimated_live_bytes: u64,
    /// The valid entry bytes found in them.
    pub live_bytes: u64,
    /// Bytes used in the segments urgent passes cleaned.
    pub urgent_used_bytes: u64,
    /// Their estimated live bytes when picked.
    pub urgent_estimated_live_bytes: u64,
    /// The valid entry bytes found in them.
    pub urgent_live_bytes: u64,
}

/// Figures of [`LogEngine::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineStats {
    /// Per zone.
    pub zones: Vec<ZoneStats>,
    /// Write buffer size.
    pub write_buffer_capacity_bytes: u64,
    /// Bytes in the write buffer's active half (records appended, not yet taken by the
    /// flusher); the half holds `write_buffer_capacity_bytes / 2` and is flushed once it
    /// is 15/16 full or the flush interval passed.
    pub write_buffer_bytes: u64,
    /// Further halves the flusher and writer hold (taken, being sorted, queued or being
    /// written): 0 when the disk keeps up, up to 3 when appends wait for it.
    pub write_buffer_busy_halves: u64,
    /// RAM of the write buffer plus every zone's `memory_bytes`.
    pub memory_bytes: u64,
    /// Entries appended (links of chained chunks count one each).
    pub appended_entries: u64,
    /// Payload bytes appended.
    pub appended_payload_bytes: u64,
    /// Removes.
    pub removes: u64,
    /// Bytes of entries the flusher placed in secondary logs (page padding and the
    /// rewritten partial page of each append not counted).
    pub secondary_bytes_written: u64,
    /// Bytes written to the primary log.
    pub primary_bytes_written: u64,
    /// Bytes handed to the storage for the secondary logs of the current zones, by the
    /// flusher and the reorganizer (whole pages, rewritten partial pages included).
    pub secondary_device_bytes_written: u64,
    /// Bytes handed to the storage for the version logs of the current zones: sealed
    /// epochs, removes and compactions (whole pages).
    pub version_log_bytes_written: u64,
    /// Flushes of the write buffer.
    pub flushes: u64,
    /// Reorganization passes.
    pub reorg_passes: u64,
    /// Of which urgent (a write waited for a free segment).
    pub reorg_urgent_passes: u64,
    /// Segments cleaned by them.
    pub reorg_segments_cleaned: u64,
    /// Segments found at reopen whose live bytes a pass counted (a census, before their
    /// log is cleaned by its figures).
    pub reorg_census_segments: u64,
    /// Bytes they wrote.
    pub reorg_bytes_written: u64,
    /// Entries moved into the current eon.
    pub reorg_entries_restamped: u64,
    /// What cleaning passes found in the segments they cleaned: how good the live-byte
    /// estimates that pick them are, and what a pass copies.
    pub reorg_cleaned: CleanedStats,
    /// Everything up to this sequence number is durable.
    pub durable_seq: Seq,
    /// Times the engine gave back its burst buffers after `LogConfig::idle_release_after`
    /// without appends.
    pub idle_releases: u64,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::config::LogConfig;
    use crate::engine::LogEngine;
    use crate::storage::{MemStorage, Storage};
    use crate::ZoneId;

    #[test]
    fn write_buffer_fill_counts_appends_until_a_flush_takes_them() {
        let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
        // A flush interval far beyond the test: only `flush` empties the buffer.
        let config = LogConfig {
            flush_interval: Duration::from_secs(600),
            ..LogConfig::small_for_tests()
        };
        let engine = LogEngine::open(config, storage).unwrap();
        let zone = ZoneId { owner: 7, zone: 0 };
        engine.create_zone(zone).unwrap();
        let empty = engine.stats();
        assert_eq!(empty.write_buffer_bytes, 0);
        assert_eq!(empty.write_buffer_busy_halves, 0);
        for i in 0..10u64 {
            engine.append(zone, (7 << 48) | i, &[1u8; 100]).unwrap();
        }
        let filled = engine.stats().write_buffer_bytes;
        // Ten records of 100 payload bytes each, with their record and entry headers.
        assert!((1_000..2_000).contains(&filled), "{filled} bytes buffered");
        assert!(filled <= empty.write_buffer_capacity_bytes / 2);
        engine.flush().unwrap();
        let flushed = engine.stats();
        assert_eq!(flushed.write_buffer_bytes, 0);
        // The writer gives the written half back just after the flush is durable (the
        // flush's waiter may run first): wait for it, bounded.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut busy = flushed.write_buffer_busy_halves;
        while busy != 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            busy = engine.stats().write_buffer_busy_halves;
        }
        assert_eq!(busy, 0, "every half is back after the flush");
    }
}
