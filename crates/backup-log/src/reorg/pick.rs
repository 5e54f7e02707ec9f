//! Picking what to clean: the log (periodic passes and eon visits, [`periodic_pick`]) and
//! its segments by cost-benefit ([`pick_segments`], see the [parent module](super) for
//! the formula and why the square root of the age).
//!
//! Pure functions of the figures handed in, except [`periodic_pick`], which reads each
//! zone's fill level and epoch under its locks. Caller: the engine's reorganizer thread
//! and [`super::Reorganizer::reorganize`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Mode;
use crate::config::LogConfig;
use crate::zone::Zone;
use crate::ZoneId;

/// The log a periodic pass cleans: the fullest above `reorg_activation_percent` that grew
/// by half a segment since its last pass; else one due for an eon visit.
pub(crate) fn periodic_pick(zones: &[Arc<Zone>], config: &LogConfig) -> Option<(ZoneId, Mode)> {
    let mut best: Option<(u64, ZoneId)> = None;
    for z in zones {
        let (used, utilization) = {
            let log = z.log.lock();
            (log.seclog.used_bytes(), log.seclog.utilization_percent())
        };
        let grown = used > z.used_after_pass.load(Ordering::Relaxed) + config.segment_bytes / 2;
        if utilization >= config.reorg_activation_percent
            && grown
            && best.is_none_or(|(u, _)| used > u)
        {
            best = Some((used, z.id));
        }
    }
    if let Some((_, z)) = best {
        return Some((z, Mode::Periodic));
    }
    zones
        .iter()
        .find(|z| z.versions.lock().epochs_since_full_visit() >= config.eon_visit_epochs)
        .map(|z| (z.id, Mode::EonVisit))
}

/// What the segment choice knows of one closed segment.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) struct SegmentView {
    /// Segment index.
    pub index: usize,
    /// Bytes used (header, valid and outdated entries).
    pub used: u64,
    /// Estimated live bytes (see `SegmentUsage`); `None` = not known, taken as `used`.
    pub live: Option<u64>,
    /// Age of its data in segments written since (the log's generation clock).
    pub age: u32,
}

impl SegmentView {
    /// Estimated utilization: live bytes over the segment size, at most 0.99 (an
    /// estimate of "all live" may be stale, so old segments still get picked).
    pub fn utilization(&self, segment_bytes: usize) -> f64 {
        let live = self.live.unwrap_or(self.used).min(self.used);
        (live as f64 / segment_bytes.max(1) as f64).min(0.99)
    }

    /// The benefit/cost ratio: (1 − u) × √age / (1 + u) (LFS's, with the square root of
    /// the age; see the module doc).
    pub fn benefit_per_cost(&self, segment_bytes: usize) -> f64 {
        let u = self.utilization(segment_bytes);
        (1.0 - u) * f64::from(self.age.max(1)).sqrt() / (1.0 + u)
    }
}

/// Estimated utilization taken as "all live": such a segment frees nothing (unless its
/// estimate is stale).
const FULL: f64 = 0.99;

/// The reorganizer's segment choice (LFS's): at most `max` segments by benefit/cost, best
/// first, leaving out those estimated all live unless older than two turnovers of the
/// log's `segments` (their estimate may be stale). Picks the single best one if none
/// qualifies, so a pass always makes progress when there are candidates. `max` = 0:
/// every segment, best first.
pub(crate) fn pick_segments(
    closed: &[SegmentView],
    segment_bytes: usize,
    max: usize,
    segments: usize,
) -> Vec<SegmentView> {
    if closed.is_empty() {
        return Vec::new();
    }
    if max == 0 {
        let mut all: Vec<(f64, SegmentView)> = closed
            .iter()
            .map(|v| (v.benefit_per_cost(segment_bytes), *v))
            .collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.index.cmp(&b.1.index)));
        return all.into_iter().map(|(_, v)| v).collect();
    }
    let old = 2 * segments as u64;
    let mut ranked: Vec<(f64, SegmentView)> = closed
        .iter()
        .map(|v| (v.benefit_per_cost(segment_bytes), *v))
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.index.cmp(&b.1.index)));
    let best = ranked[0].1;
    let picked: Vec<SegmentView> = ranked
        .into_iter()
        .map(|(_, v)| v)
        .filter(|v| v.utilization(segment_bytes) < FULL || u64::from(v.age) > old)
        .take(max)
        .collect();
    if picked.is_empty() {
        vec![best]
    } else {
        picked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(index: usize, used: u64, live: Option<u64>, age: u32) -> SegmentView {
        SegmentView {
            index,
            used,
            live,
            age,
        }
    }

    #[test]
    fn cost_benefit_picks_empty_and_old_segments_not_the_oldest_full_one() {
        // Segments of 1000 bytes; 10 in the log (so "old" is an age above 20).
        let closed = [
            view(0, 1000, Some(900), 100), // oldest, 90 % live: (0.1 × √100) / 1.9 = 0.53
            view(1, 1000, Some(300), 10),  // young, 30 % live: 1.70
            view(2, 1000, Some(500), 40),  // 2.11
            view(3, 1000, None, 5),        // unknown: taken as full, young: 0.01
            view(4, 400, Some(400), 50),   // closed early, all live: 40 % of a segment: 3.03
        ];
        let picked: Vec<usize> = pick_segments(&closed, 1000, 2, 10)
            .iter()
            .map(|v| v.index)
            .collect();
        assert_eq!(picked, vec![4, 2]);
        // Without a limit: the young one estimated all live is left out; an old one
        // estimated all live is not (its estimate may be stale).
        let picked: Vec<usize> = pick_segments(&closed, 1000, 20, 10)
            .iter()
            .map(|v| v.index)
            .collect();
        assert_eq!(picked, vec![4, 2, 1, 0]);
        let mut aged = closed;
        aged[3].age = 21;
        let picked: Vec<usize> = pick_segments(&aged, 1000, 20, 10)
            .iter()
            .map(|v| v.index)
            .collect();
        assert_eq!(picked, vec![4, 2, 1, 0, 3]);
        // Every segment, best first (urgent passes).
        let all: Vec<usize> = pick_segments(&closed, 1000, 0, 10)
            .iter()
            .map(|v| v.index)
            .collect();
        assert_eq!(all, vec![4, 2, 1, 0, 3]);
    }

    #[test]
    fn a_pass_always_has_a_segment_when_any_is_closed() {
        // All estimated all live and young: none qualifies; the best (oldest) is taken.
        let closed = [view(5, 1000, None, 3), view(6, 1000, Some(1000), 4)];
        let picked = pick_segments(&closed, 1000, 20, 64);
        assert_eq!(picked.len(), 1);
        assert_eq!(picked[0].index, 6);
        assert!(pick_segments(&[], 1000, 20, 64).is_empty());
        // Utilization is capped below 1, so an all-live estimate still ages into a pick.
        assert!(view(0, 1000, None, 1000).benefit_per_cost(1000) > 0.0);
    }
}
