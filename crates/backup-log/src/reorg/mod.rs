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
//!    ([`Reorganizer::refresh_chains`]), an open chain until that output is synced.
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
//! ## How it is called
//! The engine's reorganizer thread (`engine::reorganizer`) picks a log ([`periodic_pick`]
//! or a request) and runs a [`Reorganizer`] pass on it; `LogEngine::reorganize_now` asks
//! for one (tests, tools). The engine lends a pass what it needs through [`ReorgHost`]
//! (configuration, counters, RAM versions with their sequence number, durability): this
//! module works on [`Zone`]s and that trait and never uses the engine itself, so the
//! dependency is one-way (engine → reorg → zone, rebuild, version, seclog).
//!
//! ## Submodules
//! - [`pick`]: which log and which segments;
//! - [`census`]: counting segments found at reopen;
//! - [`chains`]: re-writing old chained chunks in an eon visit.
//!
//! This module: the pass itself ([`Reorganizer::reorganize`]): pick, version table,
//! copying valid entries ([`Pass`]), writing the output and freeing the sources.

mod census;
mod chains;
mod pick;

pub(crate) use pick::periodic_pick;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::LogConfig;
use crate::error::LogResult;
use crate::header::{self, EncodeArgs};
use crate::rebuild::durable_versions;
use crate::seclog::{self, SecondaryLog, SegmentInfo, SEGMENT_HEADER_BYTES};
use crate::storage::{AlignedBuf, LogFile};
use crate::version::{merge, table_from_records, CidMap, Version, VersionRecord, VersionState};
use crate::zone::{Counters, Zone};
use crate::Seq;
use chains::ChainRefresh;
use pick::{pick_segments, SegmentView};

/// Why a pass runs (see the module docs for each).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Urgent,
    Prompt,
    Periodic,
    EonVisit,
}

/// What the engine lends a reorganization pass. The engine implements it
/// (`engine::reorganizer`); this module never sees the engine itself.
pub(crate) trait ReorgHost: Sync {
    /// The engine's configuration.
    fn config(&self) -> &LogConfig;
    /// The engine's counters (passes, segments cleaned, bytes written).
    fn counters(&self) -> &Counters;
    /// The last sequence number issued, the zone's epoch and a snapshot of its RAM
    /// versions, taken atomically together.
    fn snapshot_versions(&self, zone: &Zone) -> (Seq, u16, CidMap<VersionState>);
    /// Asks for everything up to `seq` to be flushed now.
    fn request_flush(&self, seq: Seq);
    /// Everything up to this sequence number is durable.
    fn durable_seq(&self) -> Seq;
    /// A write waits for a free segment (a pass that can give way to it does).
    fn urgent_waiting(&self) -> bool;
    /// The engine is stopping.
    fn shutting_down(&self) -> bool;
}

/// Runs reorganization passes for the engine that lends it `host`.
pub(crate) struct Reorganizer<'a> {
    host: &'a dyn ReorgHost,
    config: &'a LogConfig,
    counters: &'a Counters,
}

/// The segments a pass cleans and what it took with them under the log lock.
struct Picked {
    file: Arc<dyn LogFile>,
    segments: Vec<SegmentInfo>,
    /// (index, segment, estimated live bytes), best first.
    candidates: Vec<(usize, SegmentInfo, u64)>,
    /// Age stamp of the output: as old as the youngest source.
    out_stamp: u32,
    /// (CID, version) of the links of chains not known durable: kept whatever the table
    /// says.
    keep_links: Vec<(u64, Version)>,
}

/// One pass's state while it copies the valid entries of its candidates.
struct Pass<'p> {
    r: &'p Reorganizer<'p>,
    zone: &'p Zone,
    mode: Mode,
    /// The versions the pass trusts (durable ones only); re-stamped entries updated.
    table: CidMap<VersionState>,
    /// Epoch of the RAM snapshot (`None` for urgent passes, which rebuilt the table from
    /// the disk and never re-stamp).
    snapshot_epoch: Option<u16>,
    /// The zone's epoch when the pass started (ages for re-stamping count from it).
    visit_epoch: u16,
    keep_links: Vec<(u64, Version)>,
    /// Some entry or chain that was due could not be re-stamped (the visit is retried).
    restamp_failed: bool,
    refresh: ChainRefresh,
    /// Valid entries collected for the next output segment.
    out: Vec<u8>,
    /// Sources whose valid entries are all in `out` (or written already).
    pending: Vec<usize>,
    out_stamp: u32,
    /// Bytes of entries one output segment holds.
    room: usize,
}

impl<'a> Reorganizer<'a> {
    /// A reorganizer working for `host`.
    pub(crate) fn new(host: &'a dyn ReorgHost) -> Reorganizer<'a> {
        Reorganizer {
            host,
            config: host.config(),
            counters: host.counters(),
        }
    }

    /// Versions whose entries are durable: the version log plus a snapshot of the RAM
    /// part, after waiting until the snapshot's appends are durable. `None` if an urgent
    /// request came in meanwhile (the pass gives way to it).
    pub(super) fn durable_snapshot(
        &self,
        zone: &Zone,
    ) -> LogResult<Option<(CidMap<VersionState>, u16)>> {
        let (seq, epoch, ram) = self.host.snapshot_versions(zone);
        self.host.request_flush(seq);
        let deadline = Instant::now() + self.config.wait_timeout;
        while self.host.durable_seq() < seq {
            if self.host.urgent_waiting() || Instant::now() > deadline || self.host.shutting_down()
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

    /// One pass over `zone` (see the module docs for the modes). Holds the zone's
    /// reorganization lock; returns at once if a recovery read holds it.
    pub(crate) fn reorganize(&self, zone: &Zone, mode: Mode) -> LogResult<()> {
        let Some(_pass) = zone.reorg_lock.try_lock() else {
            return Ok(()); // a recovery read holds the log
        };
        // Segments found at reopen are counted before segments are picked by their
        // figures; a pass that counted some ends there (the next one picks).
        if matches!(mode, Mode::Prompt | Mode::Periodic) && self.census(zone)? {
            return Ok(());
        }
        let picked = self.pick(zone, mode);
        // An eon visit holds the epoch (its fresh versions must be of the snapshot's
        // epoch) until it ends, on every path.
        let _hold = (mode == Mode::EonVisit).then(|| {
            zone.versions.lock().hold_epoch(true);
            EpochHold(zone)
        });
        let Some((table, snapshot_epoch)) = self.version_table(zone, mode, &picked)? else {
            return Ok(());
        };
        let segment_bytes = self.config.segment_bytes as usize;
        let mut pass = Pass {
            r: self,
            zone,
            mode,
            table,
            snapshot_epoch,
            visit_epoch: zone.versions.lock().epoch(),
            keep_links: picked.keep_links,
            restamp_failed: false,
            refresh: ChainRefresh::new(
                self.config.entry_payload_bytes_max() as usize,
                usize::try_from(self.config.chain_refresh_bytes).unwrap_or(usize::MAX),
            ),
            out: Vec::with_capacity(segment_bytes),
            pending: Vec::new(),
            out_stamp: picked.out_stamp,
            room: segment_bytes - SEGMENT_HEADER_BYTES - 1,
        };
        let urgent_target =
            (mode == Mode::Urgent).then(|| (picked.segments.len() as i64 / 8).max(2));
        if !pass.clean(picked.file.as_ref(), picked.candidates, urgent_target)? {
            return Ok(()); // no free segment: keep every source
        }
        let Some(refreshed) = pass.refresh_old_chains()? else {
            return Ok(()); // no free segment: the chains were abandoned
        };
        if !pass.write_last(&refreshed)? {
            return Ok(());
        }
        // (The table is not updated for them: what follows reads only its removes and its
        // size, and a refreshed chunk is neither a remove nor new.)
        self.counters
            .reorg_entries_restamped
            .fetch_add(refreshed.len() as u64, Ordering::Relaxed);
        if mode == Mode::EonVisit {
            pass.finish_eon_visit();
        }
        self.compact_versions(zone, pass.table.len())?;
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

    /// Picks the pass's segments under the log lock, with the links to keep.
    ///
    /// Candidates first, versions second: every entry in a candidate was appended before
    /// the versions are taken, so the table knows a version at least as new as each of
    /// them and an entry is dropped only for a newer durable one. Links of chains not
    /// known durable are kept (see `chain_links`). Taken under the log lock with the
    /// candidates, after reading `durable_seq`: every link in a candidate was pushed
    /// before, so its chain is in the list unless its last link was durable before, and
    /// then that link is in a candidate or an earlier segment too, and every reader finds
    /// the chain complete.
    fn pick(&self, zone: &Zone, mode: Mode) -> Picked {
        let config = self.config;
        let segment_bytes = config.segment_bytes as usize;
        let all = matches!(mode, Mode::Urgent | Mode::EonVisit);
        let durable = self.host.durable_seq();
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
        let candidates = picked
            .iter()
            .map(|v| (v.index, segments[v.index], v.live.unwrap_or(v.used)))
            .collect();
        Picked {
            file: log.seclog.file(),
            segments,
            candidates,
            out_stamp: now.wrapping_sub(youngest),
            keep_links,
        }
    }

    /// The versions the pass trusts, with the epoch of the RAM snapshot: rebuilt from the
    /// disk for an urgent pass (the writer waits, so nothing new becomes durable), else
    /// the version log plus a durable snapshot of the RAM. `None`: the pass gives way.
    #[allow(clippy::type_complexity)]
    fn version_table(
        &self,
        zone: &Zone,
        mode: Mode,
        picked: &Picked,
    ) -> LogResult<Option<(CidMap<VersionState>, Option<u16>)>> {
        if mode == Mode::Urgent {
            let records = zone.log.lock().vlog.load()?;
            let (mut table, chains) = durable_versions(
                picked.file.as_ref(),
                &picked.segments,
                self.config,
                zone.id,
                &records,
            )?;
            chains.finish(&mut table);
            return Ok(Some((table, None)));
        }
        Ok(self
            .durable_snapshot(zone)?
            .map(|(table, epoch)| (table, Some(epoch))))
    }

    /// Writes the collected valid entries to a fresh segment, syncs, then frees the
    /// segments whose entries are all written. False if no segment was free (nothing is
    /// freed then; the pass must stop).
    pub(super) fn write_out(
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
            zone.record_placements(&placed);
            log.seclog.sync()?;
            self.counters
                .reorg_bytes_written
                .fetch_add(out.len() as u64, Ordering::Relaxed);
        }
        for &p in pending.iter() {
            // A source is a closed segment none of this output went to: freeing the
            // active segment or the output would lose entries.
            assert!(
                log.seclog.active() != Some(p),
                "a pass frees the active segment"
            );
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

impl Pass<'_> {
    /// Copies the valid entries of every candidate into output segments, freeing each
    /// source once its entries are written. An urgent pass stops once it freed
    /// `urgent_target` segments net. False if no segment was free (the pass must stop).
    fn clean(
        &mut self,
        file: &dyn LogFile,
        candidates: Vec<(usize, SegmentInfo, u64)>,
        urgent_target: Option<i64>,
    ) -> LogResult<bool> {
        let config = self.r.config;
        let segment_bytes = config.segment_bytes as usize;
        let payload_max = config.entry_payload_bytes_max();
        let owner = self.zone.id.owner;
        let mut buf = AlignedBuf::zeroed(segment_bytes);
        let free_at_start = self.zone.log.lock().seclog.free_segments() as i64;
        // What prompt or periodic (0) and urgent (1) passes find in what they clean.
        let cleaned = match self.mode {
            Mode::Prompt | Mode::Periodic => Some(0),
            Mode::Urgent => Some(1),
            Mode::EonVisit => None,
        };
        for (index, info, estimated_live) in candidates {
            SecondaryLog::read_segment(file, segment_bytes, index, info.used as usize, &mut buf)?;
            let mut valid: Vec<u8> = Vec::new();
            seclog::scan_segment(
                &buf,
                info.used as usize,
                owner,
                payload_max,
                info.generation,
                true,
                |_, e| self.keep(&mut valid, e, info.generation),
            );
            // Fill output segments entry by entry; a source is freed once all its valid
            // entries are in written segments.
            let headers = seclog::walk_batch(&valid, owner, payload_max)
                .map_err(|e| crate::error::LogError::Failed(format!("internal: {e}")))?;
            for (offset, h) in headers {
                let bytes = h.entry_bytes();
                if self.out.len() + bytes > self.room && !self.write_out()? {
                    return Ok(false);
                }
                self.out.extend_from_slice(&valid[offset..offset + bytes]);
            }
            if let Some(i) = cleaned {
                let c = &self.r.counters.reorg_cleaned;
                c.used[i].fetch_add(u64::from(info.used), Ordering::Relaxed);
                c.estimated_live[i].fetch_add(estimated_live, Ordering::Relaxed);
                c.live[i].fetch_add(valid.len() as u64, Ordering::Relaxed);
            }
            self.pending.push(index);
            self.r
                .counters
                .reorg_segments_cleaned
                .fetch_add(1, Ordering::Relaxed);
            if let Some(target) = urgent_target {
                // Net segments this pass freed so far: sources done, less the output.
                let free_now = self.zone.log.lock().seclog.free_segments() as i64;
                let net = free_now - free_at_start + self.pending.len() as i64
                    - self.out.len().div_ceil(self.room) as i64;
                if net >= target {
                    break;
                }
            }
        }
        Ok(true)
    }

    /// Decides about one entry of a source segment of `generation`: appends it to
    /// `valid` (as it is, re-stamped, or as an entry of its own if it was a chunk of a
    /// run) if it is live or a link to keep; keeps old links aside for a refresh.
    fn keep(&mut self, valid: &mut Vec<u8>, e: &header::Entry<'_>, generation: u32) {
        let h = e.header;
        let owner = self.zone.id.owner;
        let v = Version {
            epoch: h.epoch,
            version: h.version,
        };
        let current = self
            .table
            .get(&h.cid)
            .copied()
            .filter(|c| !c.deleted && c.version == v);
        let Some(current) = current else {
            // A link of a chain in progress (or whose last link is not known durable)
            // stays, whatever the table says: its version becomes current with its last
            // link, and then every link must be there.
            if h.chain.is_some() && self.keep_links.contains(&(h.cid, v)) {
                copy_as_is(valid, e, generation);
            }
            return;
        };
        let old = self.visit_epoch.wrapping_sub(v.epoch) >= self.r.config.eon_visit_epochs;
        if self.mode == Mode::EonVisit && old && h.chain.is_none() {
            let fresh = self
                .snapshot_epoch
                .and_then(|se| self.zone.versions.lock().restamp(h.cid, current, se));
            match fresh {
                Some(nv) => {
                    encode_fresh(valid, h.cid, owner, nv, e.payload);
                    self.table.insert(
                        h.cid,
                        VersionState {
                            version: nv,
                            deleted: false,
                        },
                    );
                    self.r
                        .counters
                        .reorg_entries_restamped
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
                None => self.restamp_failed = true,
            }
        }
        // An old link of a chained chunk is copied as it is (the old chain stays
        // complete on disk until its fresh copy is durable) and kept aside: once every
        // link is seen, the chain is written again with a fresh version after the loop.
        if self.mode == Mode::EonVisit && old {
            if let Some(link) = h.chain {
                if !self.refresh.add(h.cid, current, link, e.payload) {
                    self.restamp_failed = true;
                }
            }
        }
        if e.run_index.is_some() {
            // A chunk of a run entry gets its own header again (the writer may put it
            // into a run with its neighbours once more).
            encode_fresh(valid, h.cid, owner, v, e.payload);
            return;
        }
        copy_as_is(valid, e, generation);
    }

    /// [`Reorganizer::write_out`] of this pass's output.
    pub(super) fn write_out(&mut self) -> LogResult<bool> {
        self.r
            .write_out(self.zone, &mut self.out, &mut self.pending, self.out_stamp)
    }

    /// Old chained chunks seen whole get a fresh version, their links written again with
    /// it (see [`Reorganizer::refresh_chains`]); registered as open chains until durable.
    /// `None`: no free segment (the chains were abandoned, the pass stops).
    #[allow(clippy::type_complexity)]
    fn refresh_old_chains(&mut self) -> LogResult<Option<Vec<(u64, Version)>>> {
        let Some(se) = self.snapshot_epoch.filter(|_| self.mode == Mode::EonVisit) else {
            return Ok(Some(Vec::new()));
        };
        let chains = std::mem::take(&mut self.refresh.chains);
        let (done, failed) = self.r.refresh_chains(
            self.zone,
            chains,
            se,
            &mut self.out,
            &mut self.pending,
            self.out_stamp,
        );
        self.restamp_failed |= failed;
        done
    }

    /// Writes the last output and frees the sources; then the refreshed chains count
    /// (or are abandoned if the output could not be written). False if no segment was
    /// free.
    fn write_last(&mut self, refreshed: &[(u64, Version)]) -> LogResult<bool> {
        let written = self.write_out();
        let mut vm = self.zone.versions.lock();
        for &(cid, version) in refreshed {
            if matches!(written, Ok(true)) {
                vm.finish_chain(cid, version);
            } else {
                vm.abandon_chain(cid, version);
            }
        }
        written
    }

    /// Ends an eon visit: old removes get a fresh version too (so a later write of the
    /// chunk compares newer than its remove), and the visit counts as done, or is retried
    /// after an eighth of the interval if something could not be re-stamped.
    fn finish_eon_visit(&mut self) {
        let restamp_age = self.r.config.eon_visit_epochs;
        let visit_epoch = self.visit_epoch;
        if let Some(se) = self.snapshot_epoch {
            let mut vm = self.zone.versions.lock();
            for (&cid, &state) in &self.table {
                if state.deleted
                    && visit_epoch.wrapping_sub(state.version.epoch) >= restamp_age
                    && vm.restamp(cid, state, se).is_none()
                {
                    self.restamp_failed = true;
                }
            }
        }
        let mut vm = self.zone.versions.lock();
        if self.restamp_failed {
            // Retry after an eighth of the interval, not at once: a visit is a pass over
            // the whole log.
            let backoff = (restamp_age / 8).max(1);
            vm.full_visit_started(visit_epoch.wrapping_sub(restamp_age - backoff));
        } else {
            vm.full_visit_started(visit_epoch);
        }
        vm.hold_epoch(false);
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

/// Appends a fresh entry of `cid` with version `v` and `payload` to `out` (a re-stamped
/// entry, or a chunk of a run entry on its own).
fn encode_fresh(out: &mut Vec<u8>, cid: u64, zone_owner: u16, v: Version, payload: &[u8]) {
    header::encode(
        &EncodeArgs {
            cid,
            zone_owner,
            epoch: v.epoch,
            version: v.version,
            chain: None,
        },
        payload,
        out,
    );
}
