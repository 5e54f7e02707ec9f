//! Per-segment live-byte estimates of one zone's secondary log ([`SegmentUsage`]) and
//! where an entry lies ([`EntryLoc`]).
//!
//! Kept by the zone's [`VersionManager`](super::VersionManager) as versions outdate
//! placed entries (see the [parent module](super)); read by the reorganizer to pick
//! segments by cost-benefit, and checked against a recount by
//! `LogEngine::check_consistency`. The figures are estimates, upper bounds of the live
//! bytes: see [`SegmentUsage`] for when they are exact.

/// Where an entry lies in its zone's secondary log: segment, the segment's generation
/// (0 = not known) and the entry's bytes (header and payload).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct EntryLoc {
    /// Segment index.
    pub segment: u32,
    /// Generation of the segment's use that holds the entry; 0 if the place is not known.
    pub generation: u32,
    /// Entry bytes.
    pub bytes: u32,
}

/// Estimated live bytes per segment of one zone's secondary log (for the reorganizer's
/// cost-benefit choice of segments).
///
/// Every entry placed adds its bytes to its segment's use (keyed by the segment's
/// generation, so a freed and reused segment starts from zero); an entry is subtracted
/// when the version manager learns that its chunk got a newer version or was removed and
/// knows where the old entry lies: that is the case while the old version is in the
/// version buffer (written in the current epoch) or in the previous epoch's buffer (kept
/// as the *carry* until the next epoch ends) and the writer recorded its place. A chunk
/// whose previous version is from an older epoch, links of chained chunks, and every
/// entry found when the log was reopened are never subtracted, so the figure is an upper
/// bound of the live bytes (exact while at most one epoch ended since the segment was
/// written); cleaning a segment makes its successor exact again. Segments found at reopen
/// start unknown; the reorganizer counts them against the durable versions (a *census*,
/// [`SegmentUsage::set_counted`]) before it picks segments of that log by these figures.
#[derive(Debug, Default, Clone)]
pub struct SegmentUsage {
    /// Per segment: (generation, live bytes); generation 0 = nothing known.
    segments: Vec<(u32, u64)>,
    /// Uses (segment, generation) whose count lacks entries found at reopen: the segment
    /// that was active then, whose new entries were counted but not its old ones.
    partial: Vec<(u32, u32)>,
}

impl SegmentUsage {
    fn slot(&mut self, segment: u32) -> &mut (u32, u64) {
        let i = segment as usize;
        if i >= self.segments.len() {
            self.segments.resize(i + 1, (0, 0));
        }
        &mut self.segments[i]
    }

    /// Counts an entry of `bytes` placed in `segment` (use `generation`).
    pub fn add(&mut self, segment: u32, generation: u32, bytes: u64) {
        let s = self.slot(segment);
        if s.0 != generation {
            *s = (generation, 0);
        }
        s.1 += bytes;
    }

    /// Takes an outdated entry off its segment's count (if the segment still holds that
    /// use).
    pub fn outdate(&mut self, loc: EntryLoc) {
        if loc.generation == 0 {
            return;
        }
        if let Some(s) = self.segments.get_mut(loc.segment as usize) {
            if s.0 == loc.generation {
                s.1 = s.1.saturating_sub(u64::from(loc.bytes));
            }
        }
    }

    /// Marks the use `generation` of `segment` as missing the entries found at reopen.
    pub fn mark_partial(&mut self, segment: u32, generation: u32) {
        if !self.partial.contains(&(segment, generation)) {
            self.partial.push((segment, generation));
        }
    }

    /// True if the figure of this use is not complete: nothing counted, or only what was
    /// written after a reopen.
    pub fn needs_census(&self, segment: u32, generation: u32) -> bool {
        self.live(segment, generation).is_none() || self.partial.contains(&(segment, generation))
    }

    /// Sets the live bytes of a use, counted from the disk against the durable versions.
    pub fn set_counted(&mut self, segment: u32, generation: u32, live: u64) {
        *self.slot(segment) = (generation, live);
        self.partial.retain(|&p| p != (segment, generation));
    }

    /// Estimated live bytes of `segment` in its use `generation`; `None` if nothing was
    /// counted for that use (a segment found at reopen: treat it as all live).
    pub fn live(&self, segment: u32, generation: u32) -> Option<u64> {
        self.segments
            .get(segment as usize)
            .filter(|s| s.0 == generation && generation != 0)
            .map(|s| s.1)
    }

    /// Bytes of RAM the counters take (approximate, by capacity).
    pub(super) fn memory_bytes(&self) -> u64 {
        self.segments.capacity() as u64 * 16
    }
}
