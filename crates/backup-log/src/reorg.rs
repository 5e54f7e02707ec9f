//! Reorganization (log cleaning) on the backup, without any network traffic.
//!
//! Job: keep every secondary log from filling up with outdated entries. One thread picks a
//! log and cleans some of its segments per pass by copying the valid entries (the current
//! version of a chunk that is not removed) into fresh segments and freeing the old ones;
//! then it compacts the zone's version log.
//!
//! Picking a log, in this order:
//! 1. **urgent**: a write found no free segment and waits; segments are cleaned best
//!    benefit/cost first (the active one included) until an eighth of the log (at least
//!    2 segments) is free net, or all are done, so the pass frees space even where the
//!    live-byte estimates are stale; versions are rebuilt from what is durable on disk
//!    (the writer cannot make anything durable while it waits, so the RAM versions
//!    cannot be used safely);
//! 2. **prompt**: a write took the log over `reorg_prompt_percent`;
//! 3. **periodic**: the fullest log above `reorg_activation_percent` that was written to
//!    since its last pass;
//! 4. **eon visit**: a log whose epoch advanced `eon_visit_epochs` since its last full
//!    visit: all segments, re-stamping entries and removes older than that with a fresh
//!    version, so no current version gets half an epoch space old. An old chained chunk
//!    is copied as it is and written again with a fresh version after the loop
//!    ([`Inner::refresh_chains`]), an open chain until that output is synced.
//!
//! Picking segments (prompt and periodic passes): **cost-benefit**, after LFS and
//! RAMCloud: at most `reorg_segments_per_pass` of the closed segments (twice that when at
//! most a sixteenth of the log, or 2 segments, is free) by benefit/cost = (1 − u) × √age /
//! (1 + u), best first, leaving out those estimated all live unless older than two
//! turnovers of the log ([`pick_segments`]). `u` is the segment's estimated live bytes
//! over its size, from the counters the version manager keeps as writes outdate placed
//! entries (`SegmentUsage`: an upper bound, exact while at most one epoch ended since the
//! segment was written); `age` counts the segments written since its data was (the
//! reorganizer's output keeps its sources' age, so cold data stays old and is not
//! cleaned again soon). The square root of the age is ours: with LFS's plain age, the
//! RAMCloud/DXRAM log-cleaner benchmark (zipfian updates at 80% live data) wrote about
//! 16% more (write amplification 6.01 against 5.16, medians of 10 and 9 runs;
//! `docs/benchmarks.md`). The root keeps the preference for old segments but lets the
//! space a segment frees weigh more.
//!
//! Invariants:
//! - An entry is dropped only if the version table says another version is current, and
//!   the table names only versions whose entries are durable: the snapshot of the RAM
//!   versions is taken with a sequence number and the pass waits until that is durable.
//!   A chain appended link by link counts only from its last link on: until then the
//!   snapshot names the chunk's previous version, and the links of every chain not
//!   known durable are kept whatever the table says (`VersionManager::chain_links`,
//!   taken with the candidates), so the chunk is always complete in one version.
//! - A freed segment's entries are durable elsewhere first (output written and synced).
//! - A pass holds the zone's reorganization lock: recovery of the zone waits for it and
//!   then keeps cleaning away; writes to the zone go on (to the active segment, which a
//!   periodic pass never touches).
//!
//! Callers: the engine's reorganizer thread; `LogEngine::reorganize_now` for tests.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Inner;
use crate::error::LogResult;
use crate::header::{self, ChainLink, EncodeArgs};
use crate::rebuild::durable_versions;
use crate::seclog::{self, SecondaryLog, SEGMENT_HEADER_BYTES};
use crate::storage::AlignedBuf;
use crate::version::{
    is_current, merge, table_from_records, CidMap, Version, VersionRecord, VersionState,
};
use crate::zone::Zone;
use crate::ZoneId;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
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
        // Sized for both parts at once: growing a table of this size is a fifth of the
        // pass.
        let mut table: CidMap<VersionState> =
            CidMap::with_capacity_and_hasher(records.len() + ram.len(), Default::default());
        for r in &records {
            merge(&mut table, r.cid, r.state);
        }
        drop(records);
        for (cid, state) in ram {
            merge(&mut table, cid, state);
        }
        Ok(Some((table, epoch)))
    }

    pub(crate) fn reorganize(&self, zone: &Zone, mode: Mode) -> LogResult<()> {
        let Some(_pass) = zone.reorg_lock.try_lock() else {
            return Ok(()); // a recovery read holds the log
        };
        // Segments found at reopen are counted before segments are picked by their
        // figures; a pass that counted some ends there (the next one picks).
        if matches!(mode, Mode::Prompt | Mode::Periodic) && self.census(zone)? {
            return Ok(());
        }
        let config = &self.config;
        let segment_bytes = config.segment_bytes as usize;
        let payload_max = config.entry_payload_bytes_max();
        let all = matches!(mode, Mode::Urgent | Mode::EonVisit);
        // Candidates first, versions second: every entry in a candidate was appended
        // before the versions are taken, so the table knows a version at least as new as
        // each of them and an entry is dropped only for a newer durable one.
        // Links of chains not known durable are kept (see `chain_links`). Taken under the
        // log lock with the candidates, after reading `durable_seq`: every link in a
        // candidate was pushed before, so its chain is in the list unless its last link
        // was durable before, and then that link is in a candidate or an earlier segment
        // too, and every reader finds the chain complete.
        let durable = self.durable_now();
        let (file, segments, candidates, out_stamp, keep_links) = {
            let mut log = zone.log.lock();
            if all {
                log.seclog.close_active();
            }
            let active = log.seclog.active();
            let segments = log.seclog.segments();
            let now = log.seclog.next_generation();
            let (usage, keep_links) = {
                let mut vm = zone.versions.lock();
                vm.prune_chains(durable);
                (vm.usage().clone(), vm.chain_links())
            };
            let closed: Vec<SegmentView> = segments
                .iter()
                .enumerate()
                .filter(|(i, s)| s.used > 0 && Some(*i) != active)
                .map(|(i, s)| SegmentView {
                    index: i,
                    used: u64::from(s.used),
                    live: usage.live(i as u32, s.generation),
                    age: now.wrapping_sub(log.seclog.stamp(i)),
                })
                .collect();
            let picked = if mode == Mode::EonVisit {
                closed.clone()
            } else if mode == Mode::Urgent {
                // Every segment, best first; the pass stops once it freed enough.
                pick_segments(&closed, segment_bytes, 0, segments.len())
            } else {
                // Nearly out of free segments: twice as many per pass, so the version
                // table built for the pass frees more before a write has to wait.
                let low = log.seclog.free_segments() <= (segments.len() / 16).max(2);
                let max = config.reorg_segments_per_pass * if low { 2 } else { 1 };
                pick_segments(&closed, segment_bytes, max, segments.len())
            };
            // The output holds the picked segments' data: it is as old as the youngest.
            let youngest = picked.iter().map(|v| v.age).min().unwrap_or(0);
            let c: Vec<(usize, seclog::SegmentInfo, u64)> = picked
                .iter()
                .map(|v| (v.index, segments[v.index], v.live.unwrap_or(v.used)))
                .collect();
            (
                log.seclog.file(),
                segments,
                c,
                now.wrapping_sub(youngest),
                keep_links,
            )
        };
        // An eon visit holds the epoch (its fresh versions must be of the snapshot's
        // epoch) until it ends, on every path.
        let _hold = (mode == Mode::EonVisit).then(|| {
            zone.versions.lock().hold_epoch(true);
            EpochHold(zone)
        });
        let (mut table, snapshot_epoch) = if mode == Mode::Urgent {
            let records = zone.log.lock().vlog.load()?;
            let (mut table, chains) =
                durable_versions(file.as_ref(), &segments, config, zone.id, &records)?;
            chains.finish(&mut table);
            (table, None)
        } else {
            match self.durable_snapshot(zone)? {
                Some((t, e)) => (t, Some(e)),
                None => return Ok(()),
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
        // An urgent pass cleans until it freed an eighth of the log (at least 2 segments)
        // net, or everything.
        let urgent_target = (mode == Mode::Urgent).then(|| (segments.len() as i64 / 8).max(2));
        let free_at_start = zone.log.lock().seclog.free_segments() as i64;
        let mut refresh = ChainRefresh::new(
            payload_max as usize,
            usize::try_from(config.chain_refresh_bytes).unwrap_or(usize::MAX),
        );
        // What prompt or periodic (0) and urgent (1) passes find in what they clean.
        let cleaned = match mode {
            Mode::Prompt | Mode::Periodic => Some(0),
            Mode::Urgent => Some(1),
            Mode::EonVisit => None,
        };
        for (index, info, estimated_live) in candidates {
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
                    let v = Version {
                        epoch: h.epoch,
                        version: h.version,
                    };
                    let current = table
                        .get(&h.cid)
                        .copied()
                        .filter(|c| !c.deleted && c.version == v);
                    let Some(current) = current else {
                        // A link of a chain in progress (or whose last link is not known
                        // durable) stays, whatever the table says: its version becomes
                        // current with its last link, and then every link must be there.
                        if h.chain.is_some() && keep_links.contains(&(h.cid, v)) {
                            copy_as_is(&mut valid, e, info.generation);
                        }
                        return;
                    };
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
                    // An old link of a chained chunk is copied as it is (the old chain
                    // stays complete on disk until its fresh copy is durable) and kept
                    // aside: once every link is seen, the chain is written again with a
                    // fresh version after the loop.
                    if mode == Mode::EonVisit && old {
                        if let Some(link) = h.chain {
                            if !refresh.add(h.cid, current, link, e.payload) {
                                restamp_failed = true;
                            }
                        }
                    }
                    if e.run_index.is_some() {
                        // A chunk of a run entry gets its own header again (the writer
                        // may put it into a run with its neighbours once more).
                        header::encode(
                            &EncodeArgs {
                                cid: h.cid,
                                zone_owner: zone.id.owner,
                                epoch: h.epoch,
                                version: h.version,
                                chain: None,
                            },
                            e.payload,
                            &mut valid,
                        );
                        return;
                    }
                    copy_as_is(&mut valid, e, info.generation);
                },
            );
            // Fill output segments entry by entry; a source is freed once all its valid
            // entries are in written segments.
            let headers = seclog::walk_batch(&valid, zone.id.owner, payload_max)
                .map_err(|e| crate::error::LogError::Failed(format!("internal: {e}")))?;
            for (offset, h) in headers {
                let bytes = h.entry_bytes();
                if out.len() + bytes > room
                    && !self.write_out(zone, &mut out, &mut pending, out_stamp)?
                {
                    return Ok(()); // no free segment: keep every source
                }
                out.extend_from_slice(&valid[offset..offset + bytes]);
            }
            if let Some(i) = cleaned {
                let c = &self.counters.reorg_cleaned;
                c.used[i].fetch_add(u64::from(info.used), Ordering::Relaxed);
                c.estimated_live[i].fetch_add(estimated_live, Ordering::Relaxed);
                c.live[i].fetch_add(valid.len() as u64, Ordering::Relaxed);
            }
            pending.push(index);
            self.counters
                .reorg_segments_cleaned
                .fetch_add(1, Ordering::Relaxed);
            if let Some(target) = urgent_target {
                // Net segments this pass freed so far: sources done, less the output.
                let free_now = zone.log.lock().seclog.free_segments() as i64;
                let net = free_now - free_at_start + pending.len() as i64
                    - out.len().div_ceil(room) as i64;
                if net >= target {
                    break;
                }
            }
        }
        // Old chained chunks seen whole get a fresh version, their links written again
        // with it (see `refresh_chains`); registered as open chains until durable.
        let refreshed = match snapshot_epoch {
            Some(se) if mode == Mode::EonVisit => {
                let chains = std::mem::take(&mut refresh.chains);
                let (done, failed) =
                    self.refresh_chains(zone, chains, se, &mut out, &mut pending, out_stamp);
                restamp_failed |= failed;
                let Some(refreshed) = done? else {
                    return Ok(()); // no free segment: the chains were abandoned
                };
                refreshed
            }
            _ => Vec::new(),
        };
        let written = self.write_out(zone, &mut out, &mut pending, out_stamp);
        {
            let mut vm = zone.versions.lock();
            for &(cid, version) in &refreshed {
                if matches!(written, Ok(true)) {
                    vm.finish_chain(cid, version);
                } else {
                    vm.abandon_chain(cid, version);
                }
            }
        }
        if !written? {
            return Ok(());
        }
        // (The table is not updated for them: what follows reads only its removes and its
        // size, and a refreshed chunk is neither a remove nor new.)
        self.counters
            .reorg_entries_restamped
            .fetch_add(refreshed.len() as u64, Ordering::Relaxed);
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
        if mode == Mode::Urgent {
            self.counters
                .reorg_urgent_passes
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Gives every complete chain of `chains` (old chained chunks an eon visit saw whole)
    /// a fresh version registered as an open chain ([`VersionManager::restamp_chain`]) and
    /// appends its links with that version to the pass's output, writing out full
    /// segments as the loop over the candidates does. Returns the refreshed chains, or
    /// `None` if a segment could not be written for lack of a free one (the pass stops;
    /// the chains are abandoned), and whether some chain had to be left for a later visit.
    /// The caller finishes the chains once the last output is written and synced, or
    /// abandons them. The old links were copied as they are, so the chunk stays complete
    /// in its old version whatever happens before then.
    #[allow(clippy::type_complexity)]
    fn refresh_chains(
        &self,
        zone: &Zone,
        chains: CidMap<StashedChain>,
        snapshot_epoch: u16,
        out: &mut Vec<u8>,
        pending: &mut Vec<usize>,
        stamp: u32,
    ) -> (LogResult<Option<Vec<(u64, Version)>>>, bool) {
        let segment_bytes = self.config.segment_bytes as usize;
        let room = segment_bytes - SEGMENT_HEADER_BYTES - 1;
        let mut refreshed: Vec<(u64, Version)> = Vec::new();
        let mut failed = false;
        let abandon = |refreshed: &[(u64, Version)]| {
            let mut vm = zone.versions.lock();
            for &(cid, version) in refreshed {
                vm.abandon_chain(cid, version);
            }
        };
        let mut chains: Vec<(u64, StashedChain)> = chains.into_iter().collect();
        chains.sort_unstable_by_key(|(cid, _)| *cid);
        for (cid, chain) in chains {
            if chain.links.iter().any(Option::is_none) {
                failed = true; // not seen whole (cannot happen in a visit of every segment)
                continue;
            }
            // Room for the output so far and this chain's links, with a segment to spare;
            // else the next visit tries again. The sources done so far are freed only once
            // the output holding their valid entries is written: write it first if that
            // may give the room (the old links it holds are then durable where they are).
            let need = (out.len() + chain.bytes + 64 * chain.links.len()).div_ceil(room) + 1;
            if zone.log.lock().seclog.free_segments() < need && !pending.is_empty() {
                match self.write_out(zone, out, pending, stamp) {
                    Ok(true) => {}
                    other => {
                        // No free segment (the pass stops), or an error.
                        abandon(&refreshed);
                        return (other.map(|_| None), failed);
                    }
                }
            }
            let need = (out.len() + chain.bytes + 64 * chain.links.len()).div_ceil(room) + 1;
            if zone.log.lock().seclog.free_segments() < need {
                failed = true;
                continue;
            }
            let Some(fresh) = zone
                .versions
                .lock()
                .restamp_chain(cid, chain.state, snapshot_epoch)
            else {
                failed = true;
                continue;
            };
            refreshed.push((cid, fresh));
            let count = chain.links.len() as u8;
            let mut entry = Vec::new();
            for (index, payload) in chain.links.iter().enumerate() {
                let payload = payload.as_deref().unwrap_or_default();
                entry.clear();
                header::encode(
                    &EncodeArgs {
                        cid,
                        zone_owner: zone.id.owner,
                        epoch: fresh.epoch,
                        version: fresh.version,
                        chain: Some(ChainLink {
                            index: index as u8,
                            count,
                        }),
                    },
                    payload,
                    &mut entry,
                );
                if out.len() + entry.len() > room {
                    match self.write_out(zone, out, pending, stamp) {
                        Ok(true) => {}
                        other => {
                            // No free segment (the pass stops), or an error.
                            abandon(&refreshed);
                            return (other.map(|_| None), failed);
                        }
                    }
                }
                out.extend_from_slice(&entry);
            }
        }
        (Ok(Some(refreshed)), failed)
    }

    /// Writes the collected valid entries to a fresh segment, syncs, then frees the
    /// segments whose entries are all written. False if no segment was free (nothing is
    /// freed then; the pass must stop).
    fn write_out(
        &self,
        zone: &Zone,
        out: &mut Vec<u8>,
        pending: &mut Vec<usize>,
        stamp: u32,
    ) -> LogResult<bool> {
        let mut log = zone.log.lock();
        if !out.is_empty() {
            let mut placed = Vec::new();
            let Some(written) = log.seclog.write_closed(out, &mut placed)? else {
                return Ok(false);
            };
            for index in written {
                log.seclog.set_stamp(index, stamp);
            }
            // Count the copies (and remember where the current ones went) before the
            // sources are freed; a chunk written meanwhile outdates its copy at once.
            for part in placed.chunks(PLACED_PER_LOCK) {
                let mut vm = zone.versions.lock();
                for (h, loc) in part {
                    let version = Version {
                        epoch: h.epoch,
                        version: h.version,
                    };
                    vm.placed(h.cid, version, h.chain.is_some(), *loc);
                }
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

/// An old chained chunk seen by an eon visit: its current state and its links' payloads
/// by index.
pub(crate) struct StashedChain {
    state: VersionState,
    links: Vec<Option<Vec<u8>>>,
    bytes: usize,
}

/// The old chained chunks an eon visit writes again (see [`Inner::refresh_chains`]).
struct ChainRefresh {
    chains: CidMap<StashedChain>,
    /// Chains seen but not taken (over the budget): their later links are skipped.
    skipped: CidMap<()>,
    /// Bytes reserved by the chains taken.
    reserved: usize,
    /// The largest payload of one link.
    link_max: usize,
    /// `LogConfig::chain_refresh_bytes`: each chain reserves its whole size (links × the
    /// largest link) at its first link; a chain that would go over is left for a later
    /// visit, except the first of a visit, which is always taken (so a chain up to
    /// `chunk_bytes_max` is refreshed too, and every visit makes progress).
    budget: usize,
}

impl ChainRefresh {
    fn new(link_max: usize, budget: usize) -> ChainRefresh {
        ChainRefresh {
            budget,
            chains: CidMap::default(),
            skipped: CidMap::default(),
            reserved: 0,
            link_max,
        }
    }

    /// Keeps link `link` of `cid` (current state `state`). False if the chain is left for
    /// a later visit (over the budget).
    fn add(&mut self, cid: u64, state: VersionState, link: ChainLink, payload: &[u8]) -> bool {
        if self.skipped.contains_key(&cid) {
            return false;
        }
        if !self.chains.contains_key(&cid) {
            let reserve = usize::from(link.count) * self.link_max;
            if self.reserved > 0 && self.reserved + reserve > self.budget {
                self.skipped.insert(cid, ());
                return false;
            }
            self.reserved += reserve;
            self.chains.insert(
                cid,
                StashedChain {
                    state,
                    links: vec![None; usize::from(link.count)],
                    bytes: 0,
                },
            );
        }
        let Some(chain) = self.chains.get_mut(&cid) else {
            return true;
        };
        if chain.state != state || chain.links.len() != usize::from(link.count) {
            return true; // not the current chain (the table names one version only)
        }
        let Some(slot) = chain.links.get_mut(usize::from(link.index)) else {
            return true;
        };
        if slot.is_some() {
            return true; // a duplicate copy (left by a crash after a pass's output)
        }
        chain.bytes += payload.len();
        *slot = Some(payload.to_vec());
        true
    }
}

/// Releases an eon visit's hold on its zone's epoch however the pass ends.
struct EpochHold<'a>(&'a Zone);

impl Drop for EpochHold<'_> {
    fn drop(&mut self) {
        self.0.versions.lock().hold_epoch(false);
    }
}

/// Appends entry `e` of a segment of `generation` to `out` as it is (checksum rebased to
/// generation 0, as in the write buffer).
fn copy_as_is(out: &mut Vec<u8>, e: &header::Entry<'_>, generation: u32) {
    let start = out.len();
    out.extend_from_slice(e.header_raw);
    out.extend_from_slice(e.payload);
    header::rebase_crc(&mut out[start..], &e.header, generation, 0);
}

/// Segments a census pass reads at most: bounds how long it holds the zone's
/// reorganization lock (a recovery read of the zone waits for that).
const CENSUS_SEGMENTS_PER_PASS: usize = 8;

impl Inner {
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

/// Placements applied per hold of a zone's version lock (producers wait for it).
pub(crate) const PLACED_PER_LOCK: usize = 1024;

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
