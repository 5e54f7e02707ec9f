//! The reorganizer thread: takes the urgent and prompt requests the writer registers (or
//! picks a log itself, [`periodic_pick`]) and runs a pass of [`crate::reorg`] on it, lending
//! the pass what it needs of the engine through [`ReorgHost`].
//!
//! Invariants: one pass at a time; `passes_done` grows after every pass, pass or not, so
//! writers waiting for a free segment (and `reorganize_now`) wake up; a failed pass stops
//! the engine. See the [parent module](super).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Inner;
use crate::config::LogConfig;
use crate::error::LogResult;
use crate::reorg::{periodic_pick, Mode, ReorgHost, Reorganizer};
use crate::version::{CidMap, VersionState};
use crate::zone::{Counters, Zone};
use crate::Seq;

impl ReorgHost for Inner {
    fn config(&self) -> &LogConfig {
        &self.config
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn snapshot_versions(&self, zone: &Zone) -> (Seq, u16, CidMap<VersionState>) {
        Inner::snapshot_versions(self, zone)
    }

    fn request_flush(&self, seq: Seq) {
        Inner::request_flush(self, seq);
    }

    fn durable_seq(&self) -> Seq {
        self.durable_now()
    }

    fn urgent_waiting(&self) -> bool {
        !self.reorg.lock().urgent.is_empty()
    }

    fn shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }
}

impl Inner {
    /// The reorganizer thread's loop.
    pub(super) fn reorganizer_loop(self: Arc<Self>) {
        loop {
            let pick = {
                let mut r = self.reorg.lock();
                // The flag is checked under the lock `stop` notifies under: no lost wake-up.
                if r.urgent.is_empty()
                    && r.prompt.is_empty()
                    && !self.shutdown.load(Ordering::Relaxed)
                {
                    self.reorg_cv.wait_for(&mut r, self.config.reorg_interval);
                }
                if self.shutdown.load(Ordering::Relaxed) {
                    return;
                }
                if let Some((&z, _)) = r.urgent.iter().next() {
                    r.urgent.remove(&z);
                    Some((z, Mode::Urgent))
                } else if let Some((&z, _)) = r.prompt.iter().next() {
                    r.prompt.remove(&z);
                    Some((z, Mode::Prompt))
                } else {
                    None
                }
            };
            let pick = pick.or_else(|| {
                let zones: Vec<Arc<Zone>> = self.zones.read().values().cloned().collect();
                periodic_pick(&zones, &self.config)
            });
            let Some((zone_id, mode)) = pick else {
                continue;
            };
            self.reorg.lock().running = Some((zone_id, mode));
            if let Ok(zone) = self.zone(zone_id) {
                if let Err(e) = self.reorganize(&zone, mode) {
                    self.fail(format!("reorganization of zone {zone_id}: {e}"));
                }
            }
            let mut r = self.reorg.lock();
            r.running = None;
            r.passes_done += 1;
            self.reorg_cv.notify_all();
        }
    }

    /// One reorganization pass of `zone` in this thread (the reorganizer's, or a test's).
    pub(crate) fn reorganize(&self, zone: &Zone, mode: Mode) -> LogResult<()> {
        Reorganizer::new(self).reorganize(zone, mode)
    }
}
