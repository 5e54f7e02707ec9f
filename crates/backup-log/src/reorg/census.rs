//! The census: counting the live bytes of segments whose figures are unknown or partial
//! (found at reopen) against the durable versions, before a prompt or periodic pass picks
//! segments of that log by those figures.
//!
//! Bounded per pass ([`CENSUS_SEGMENTS_PER_PASS`]) since it holds the zone's
//! reorganization lock, which a recovery read of the zone waits for. Caller:
//! [`Reorganizer::reorganize`].

use std::sync::atomic::Ordering;

use super::Reorganizer;
use crate::error::LogResult;
use crate::seclog::{self, SecondaryLog};
use crate::storage::AlignedBuf;
use crate::version::is_current;
use crate::zone::Zone;

/// Segments a census pass reads at most: bounds how long it holds the zone's
/// reorganization lock (a recovery read of the zone waits for that).
const CENSUS_SEGMENTS_PER_PASS: usize = 8;

impl Reorganizer<'_> {
    /// Counts the live bytes of up to [`CENSUS_SEGMENTS_PER_PASS`] closed segments of
    /// `zone` whose figures are unknown or partial (found at reopen) against the durable
    /// versions, so the cost-benefit choice sees them as they are instead of as full.
    /// Returns whether there was anything to count.
    pub(crate) fn census(&self, zone: &Zone) -> LogResult<bool> {
        let (file, unknown) = {
            let log = zone.log.lock();
            let active = log.seclog.active();
            let versions = zone.versions.lock();
            let usage = versions.usage();
            let unknown: Vec<(usize, seclog::SegmentInfo)> = log
                .seclog
                .segments()
                .iter()
                .enumerate()
                .filter(|(i, s)| {
                    s.used > 0 && Some(*i) != active && usage.needs_census(*i as u32, s.generation)
                })
                .take(CENSUS_SEGMENTS_PER_PASS)
                .map(|(i, s)| (i, *s))
                .collect();
            (log.seclog.file(), unknown)
        };
        if unknown.is_empty() {
            return Ok(false);
        }
        let Some((table, _)) = self.durable_snapshot(zone)? else {
            return Ok(true); // an urgent request came in: it goes first
        };
        let segment_bytes = self.config.segment_bytes as usize;
        let payload_max = self.config.entry_payload_bytes_max();
        let mut buf = AlignedBuf::zeroed(segment_bytes);
        let mut counted = Vec::with_capacity(unknown.len());
        for (index, info) in unknown {
            SecondaryLog::read_segment(
                file.as_ref(),
                segment_bytes,
                index,
                info.used as usize,
                &mut buf,
            )?;
            let mut live = 0u64;
            seclog::scan_segment(
                &buf,
                info.used as usize,
                zone.id.owner,
                payload_max,
                info.generation,
                true,
                |_, e| {
                    if is_current(&table, &e.header) {
                        live += e.stored_bytes() as u64;
                    }
                },
            );
            counted.push((index, info.generation, live));
        }
        self.counters
            .reorg_census_segments
            .fetch_add(counted.len() as u64, Ordering::Relaxed);
        let mut versions = zone.versions.lock();
        for (index, generation, live) in counted {
            versions
                .usage_mut()
                .set_counted(index as u32, generation, live);
        }
        Ok(true)
    }
}
