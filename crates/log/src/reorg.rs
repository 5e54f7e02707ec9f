//! Reorganization (log cleaning) on the backup, without any network traffic.
//!
//! Job: keep every secondary log from filling up with outdated entries. One thread picks a
//! log and cleans some of its segments per pass by copying the valid entries (the current
//! version of a chunk that is not removed) into fresh segments and freeing the old ones;
//! then it compacts the zone's version log.
//!
//! Picking a log, in this order:
//! 1. **urgent**: a write found no free segment and waits; all segments are cleaned, with
//!    versions rebuilt from what is durable on disk (the flusher cannot make anything
//!    durable while it waits, so the RAM versions cannot be used safely);
//! 2. **prompt**: a write took the log over `reorg_prompt_percent`;
//! 3. **periodic**: the fullest log above `reorg_activation_percent` that was written to
//!    since its last pass;
//! 4. **eon visit**: a log whose epoch advanced `eon_visit_epochs` since its last full
//!    visit: all segments, re-stamping entries and removes older than that with a fresh
//!    version, so no current version gets half an epoch space old.
//!
//! Invariants:
//! - An entry is dropped only if the version table says another version is current, and
//!   the table names only versions whose entries are durable: the snapshot of the RAM
//!   versions is taken with a sequence number and the pass waits until that is durable.
//! - A freed segment's entries are durable elsewhere first (output written and synced).
//! - A pass holds the zone's reorganization lock: recovery of the zone waits for it and
//!   then keeps cleaning away; writes to the zone go on (to the active segment, which a
//!   periodic pass never touches).
//!
//! Callers: the engine's reorganizer thread; `LogEngine::reorganize_now` for tests.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::{durable_versions, Inner, Zone};
use crate::error::LogResult;
use crate::header::{self, EncodeArgs};
use crate::seclog::{self, SecondaryLog, SEGMENT_HEADER_BYTES};
use crate::storage::AlignedBuf;
use crate::version::{merge, table_from_records, CidMap, Version, VersionRecord, VersionState};
use crate::ZoneId;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Mode {
    Urgent,
    Prompt,
    Periodic,
    EonVisit,
}

impl Inner {
    pub(crate) fn reorganizer_loop(self: Arc<Self>) {
        loop {
            let pick = {
                let mut r = self.reorg.lock();
                if r.urgent.is_empty() && r.prompt.is_empty() {
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
            let pick = pick.or_else(|| self.periodic_pick());
            let Some((zone_id, mode)) = pick else {
                continue;
            };
            if let Ok(zone) = self.zone(zone_id) {
                if let Err(e) = self.reorganize(&zone, mode) {
                    self.fail(format!("reorganization of zone {zone_id}: {e}"));
                }
            }
            let mut r = self.reorg.lock();
            r.passes_done += 1;
            self.reorg_cv.notify_all();
        }
    }

    fn periodic_pick(&self) -> Option<(ZoneId, Mode)> {
        let zones: Vec<Arc<Zone>> = self.zones.read().values().cloned().collect();
        let mut best: Option<(u64, ZoneId)> = None;
        for z in &zones {
            let (used, utilization) = {
                let log = z.log.lock();
                (log.seclog.used_bytes(), log.seclog.utilization_percent())
            };
            let grown =
                used > z.used_after_pass.load(Ordering::Relaxed) + self.config.segment_bytes / 2;
            if utilization >= self.config.reorg_activation_percent
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
            .find(|z| z.versions.lock().epochs_since_full_visit() >= self.config.eon_visit_epochs)
            .map(|z| (z.id, Mode::EonVisit))
    }

    /// Versions whose entries are durable: the version log plus a snapshot of the RAM
    /// part, after waiting until the snapshot's appends are durable. `None` if an urgent
    /// request came in meanwhile (the pass gives way to it).
    fn durable_snapshot(&self, zone: &Zone) -> LogResult<Option<(CidMap<VersionState>, u16)>> {
        let (seq, epoch, ram) = self.snapshot_versions(zone);
        self.request_flush(seq);
        let deadline = Instant::now() + self.config.wait_timeout;
        while self.durable_now() < seq {
            if !self.reorg.lock().urgent.is_empty()
                || Instant::now() > deadline
                || self.shutdown.load(Ordering::Relaxed)
            {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let records = zone.log.lock().vlog.load()?;
        let mut table = table_from_records(&records);
        for (cid, state) in ram {
            merge(&mut table, cid, state);
        }
        Ok(Some((table, epoch)))
    }

    fn reorganize(&self, zone: &Zone, mode: Mode) -> LogResult<()> {
        let Some(_pass) = zone.reorg_lock.try_lock() else {
            return Ok(()); // a recovery read holds the log
        };
        let config = &self.config;
        let segment_bytes = config.segment_bytes as usize;
        let payload_max = config.entry_payload_bytes_max();
        let all = matches!(mode, Mode::Urgent | Mode::EonVisit);
        // Candidates first, versions second: every entry in a candidate was appended
        // before the versions are taken, so the table knows a version at least as new as
        // each of them and an entry is dropped only for a newer durable one.
        let (file, segments, candidates) = {
            let mut log = zone.log.lock();
            if all {
                log.seclog.close_active();
            }
            let active = log.seclog.active();
            let segments = log.seclog.segments();
            let mut c: Vec<(usize, seclog::SegmentInfo)> = segments
                .iter()
                .copied()
                .enumerate()
                .filter(|(i, s)| s.used > 0 && Some(*i) != active)
                .collect();
            c.sort_by_key(|(_, s)| s.generation);
            if !all {
                c.truncate(config.reorg_segments_per_pass);
            }
            (log.seclog.file(), segments, c)
        };
        let (mut table, snapshot_epoch) = if mode == Mode::Urgent {
            let records = zone.log.lock().vlog.load()?;
            let (mut table, chains) =
                durable_versions(file.as_ref(), &segments, config, zone.id, &records)?;
            chains.finish(&mut table);
            (table, None)
        } else {
            if mode == Mode::EonVisit {
                zone.versions.lock().hold_epoch(true);
            }
            match self.durable_snapshot(zone)? {
                Some((t, e)) => (t, Some(e)),
                None => {
                    zone.versions.lock().hold_epoch(false);
                    return Ok(());
                }
            }
        };
        let visit_epoch = zone.versions.lock().epoch();
        let restamp_age = config.eon_visit_epochs;
        let mut restamp_failed = false;
        let room = segment_bytes - SEGMENT_HEADER_BYTES - 1;
        let mut out: Vec<u8> = Vec::with_capacity(segment_bytes);
        // Sources whose valid entries are all in `out` (or written already).
        let mut pending: Vec<usize> = Vec::new();
        let mut buf = AlignedBuf::zeroed(segment_bytes);
        for (index, info) in candidates {
            SecondaryLog::read_segment(
                file.as_ref(),
                segment_bytes,
                index,
                info.used as usize,
                &mut buf,
            )?;
            let mut valid: Vec<u8> = Vec::new();
            seclog::scan_segment(
                &buf,
                info.used as usize,
                zone.id.owner,
                payload_max,
                info.generation,
                true,
                |_, e| {
                    let h = e.header;
                    let Some(current) = table.get(&h.cid).copied() else {
                        return;
                    };
                    let v = Version {
                        epoch: h.epoch,
                        version: h.version,
                    };
                    if current.deleted || current.version != v {
                        return;
                    }
                    let old = visit_epoch.wrapping_sub(v.epoch) >= restamp_age;
                    if mode == Mode::EonVisit && old && h.chain.is_none() {
                        let fresh = snapshot_epoch
                            .and_then(|se| zone.versions.lock().restamp(h.cid, current, se));
                        match fresh {
                            Some(nv) => {
                                header::encode(
                                    &EncodeArgs {
                                        cid: h.cid,
                                        zone_owner: zone.id.owner,
                                        epoch: nv.epoch,
                                        version: nv.version,
                                        chain: None,
                                    },
                                    e.payload,
                                    &mut valid,
                                );
                                table.insert(
                                    h.cid,
                                    VersionState {
                                        version: nv,
                                        deleted: false,
                                    },
                                );
                                self.counters
                                    .reorg_entries_restamped
                                    .fetch_add(1, Ordering::Relaxed);
                                return;
                            }
                            None => restamp_failed = true,
                        }
                    }
                    // Old links of chained chunks are copied as they are: re-stamping
                    // needs every link of the chunk in one pass (known gap, see
                    // docs/log-format.md). Failing the visit for them would repeat it
                    // forever.
                    let start = valid.len();
                    valid.extend_from_slice(e.header_raw);
                    valid.extend_from_slice(e.payload);
                    header::rebase_crc(&mut valid[start..], &h, info.generation, 0);
                },
            );
            // Fill output segments entry by entry; a source is freed once all its valid
            // entries are in written segments.
            let headers = seclog::walk_batch(&valid, zone.id.owner, payload_max)
                .map_err(|e| crate::error::LogError::Failed(format!("internal: {e}")))?;
            for (offset, h) in headers {
                let bytes = h.entry_bytes();
                if out.len() + bytes > room && !self.write_out(zone, &mut out, &mut pending)? {
                    return Ok(()); // no free segment: keep every source
                }
                out.extend_from_slice(&valid[offset..offset + bytes]);
            }
            pending.push(index);
            self.counters
                .reorg_segments_cleaned
                .fetch_add(1, Ordering::Relaxed);
        }
        if !self.write_out(zone, &mut out, &mut pending)? {
            return Ok(());
        }
        if mode == Mode::EonVisit {
            // Old removes get a fresh version too, so a later write of the chunk compares
            // newer than its remove.
            if let Some(se) = snapshot_epoch {
                let mut vm = zone.versions.lock();
                for (&cid, &state) in &table {
                    if state.deleted
                        && visit_epoch.wrapping_sub(state.version.epoch) >= restamp_age
                        && vm.restamp(cid, state, se).is_none()
                    {
                        restamp_failed = true;
                    }
                }
            }
            let mut vm = zone.versions.lock();
            if restamp_failed {
                // Retry after an eighth of the interval, not at once: a visit is a pass
                // over the whole log.
                let backoff = (restamp_age / 8).max(1);
                vm.full_visit_started(visit_epoch.wrapping_sub(restamp_age - backoff));
            } else {
                vm.full_visit_started(visit_epoch);
            }
            vm.hold_epoch(false);
        }
        self.compact_versions(zone, table.len())?;
        let used = zone.log.lock().seclog.used_bytes();
        zone.used_after_pass.store(used, Ordering::Relaxed);
        self.counters.reorg_passes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the collected valid entries to a fresh segment, syncs, then frees the
    /// segments whose entries are all written. False if no segment was free (nothing is
    /// freed then; the pass must stop).
    fn write_out(
        &self,
        zone: &Zone,
        out: &mut Vec<u8>,
        pending: &mut Vec<usize>,
    ) -> LogResult<bool> {
        let mut log = zone.log.lock();
        if !out.is_empty() {
            if log.seclog.write_closed(out)?.is_none() {
                return Ok(false);
            }
            log.seclog.sync()?;
            self.counters
                .reorg_bytes_written
                .fetch_add(out.len() as u64, Ordering::Relaxed);
        }
        for &p in pending.iter() {
            log.seclog.free(p)?;
        }
        if !pending.is_empty() {
            // Freed segments must stay free after a crash, or a log without free
            // segments could not be cleaned at reopen.
            log.seclog.sync()?;
        }
        out.clear();
        pending.clear();
        Ok(true)
    }

    /// Rewrites the version log with one record per chunk when it holds many more.
    fn compact_versions(&self, zone: &Zone, live: usize) -> LogResult<()> {
        let mut log = zone.log.lock();
        if log.vlog.records() <= 2 * live as u64 + 4096 {
            return Ok(());
        }
        let records = log.vlog.load()?;
        let table = table_from_records(&records);
        let compacted: Vec<VersionRecord> = table
            .into_iter()
            .map(|(cid, state)| VersionRecord { cid, state })
            .collect();
        log.vlog.compact(&compacted)
    }
}
