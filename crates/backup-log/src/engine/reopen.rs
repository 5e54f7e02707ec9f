//! Opening the engine: every zone found in the storage is scanned (its segments'
//! ends, the newest complete entry of each chunk, with `recovery_threads` threads), the
//! primary log is replayed into the secondary logs, each zone's versions are rebuilt
//! from what is durable and its new epoch starts past every version on disk; then the
//! threads start.
//!
//! Invariants: after a crash, every chunk reads back as its newest durable entry, or
//! absent after a durable remove (see `docs/log-format.md`); a log left without two free
//! segments (a crash between a reorganization pass's output and its freeing) gets its
//! redundant segments freed first. Caller: [`LogEngine::open`]. See the
//! [parent module](super).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use super::flush::Groups;
use super::sync::SyncQueue;
use super::{
    Durability, Handoff, Inner, LogEngine, ReorgRequests, WriteBuffer, WRITE_BUFFER_HALVES,
};
use crate::config::LogConfig;
use crate::error::{io_context, LogError, LogResult};
use crate::format;
use crate::primary::{PrimaryLog, ReplayBlock};
use crate::rebuild::{merge_removes, ChainTracker};
use crate::seclog::{self, SecondaryLog, SegmentInfo};
use crate::storage::{round_up_to_page, AlignedBuf, LogFile, Storage, PAGE_BYTES};
use crate::version::{CidMap, VersionLog, VersionManager, VersionRecord, VersionState};
use crate::zone::{
    parse_sec_name, sec_name, vlog_base, Counters, Zone, ZoneLog, ZoneMap, PRIMARY_NAME,
};
use crate::ZoneId;

impl LogEngine {
    /// Opens the engine over `storage`: reopens every zone found there (after a crash or a
    /// clean stop alike), replays the primary log into the secondary logs, rebuilds each
    /// zone's versions from what is durable, and starts the flusher and reorganizer.
    pub fn open(config: LogConfig, storage: Arc<dyn Storage>) -> LogResult<LogEngine> {
        config.validate()?;
        let mut rebuilt = scan_zones(&config, &storage)?;
        let (primary, replay) = open_primary(&config, &storage, &mut rebuilt)?;
        let mut zones = ZoneMap::default();
        for (zone, rebuilt) in rebuilt {
            zones.insert(zone, Arc::new(finish_zone(&config, zone, rebuilt)?));
        }
        let inner = Arc::new(Inner::new(config, storage, zones, primary)?);
        let spawn = |name: &str, run: fn(Arc<Inner>)| {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name(format!("log-{name}"))
                .spawn(move || run(inner))
                .map_err(io_context(format!("spawning the {name}")))
        };
        let threads = vec![
            spawn("flusher", Inner::flusher_loop)?,
            spawn("writer", Inner::writer_loop)?,
            spawn("syncer", Inner::syncer_loop)?,
            spawn("reorganizer", Inner::reorganizer_loop)?,
        ];
        let engine = LogEngine { inner, threads };
        // Replay, then start the primary log over.
        for (zone, entries) in &replay {
            let z = engine.inner.zone(*zone)?;
            engine.inner.write_secondary(&z, entries)?;
        }
        for z in engine.inner.zones.read().values() {
            z.log.lock().seclog.sync()?;
        }
        if let Some(p) = engine.inner.primary.lock().as_mut() {
            p.reset()?;
        }
        Ok(engine)
    }
}

/// One zone as its files were found: its log, the newest durable version of each chunk
/// (complete entries and removes) and the links of chained chunks seen.
type Rebuilt = (ZoneLog, CidMap<VersionState>, ChainTracker);

/// Scans every zone found in `storage` ([`reopen_zone`]), with `recovery_threads` threads
/// (zones are independent).
fn scan_zones(
    config: &LogConfig,
    storage: &Arc<dyn Storage>,
) -> LogResult<HashMap<ZoneId, Rebuilt>> {
    let names = storage
        .list()
        .map_err(io_context("listing the log directory"))?;
    let found: Vec<ZoneId> = names.iter().filter_map(|n| parse_sec_name(n)).collect();
    if found.len() > config.zones_max {
        return Err(LogError::TooManyZones(config.zones_max));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(found.len()));
    std::thread::scope(|scope| {
        for _ in 0..config.recovery_threads.min(found.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&zone) = found.get(i) else { break };
                let result = reopen_zone(config, storage, zone);
                results.lock().push((zone, result));
            });
        }
    });
    let mut rebuilt = HashMap::new();
    for (zone, result) in results.into_inner() {
        rebuilt.insert(zone, result?);
    }
    Ok(rebuilt)
}

/// Opens the primary log and reads what was only in secondary-log buffers: those
/// entries' versions count now (added to `rebuilt`); the entries go to the secondary logs
/// once the threads run (a full log may need cleaning first), and the primary log keeps
/// them until then.
fn open_primary(
    config: &LogConfig,
    storage: &Arc<dyn Storage>,
    rebuilt: &mut HashMap<ZoneId, Rebuilt>,
) -> LogResult<(PrimaryLog, Vec<ReplayBlock>)> {
    let primary_file = storage
        .open(
            PRIMARY_NAME,
            round_up_to_page(config.primary_log_bytes as usize) as u64,
        )
        .map_err(io_context("opening primary log"))?;
    let payload_max = config.entry_payload_bytes_max();
    let (primary, replay) =
        PrimaryLog::open(primary_file, payload_max, |z| rebuilt.contains_key(&z))?;
    for (zone, entries) in &replay {
        let Some((_, table, chains)) = rebuilt.get_mut(zone) else {
            continue;
        };
        for (offset, h) in seclog::walk_batch(entries, zone.owner, payload_max)
            .map_err(|e| LogError::Failed(format!("internal: {e}")))?
        {
            chains.observe(table, h.cid, h.epoch, h.version, h.chain, offset);
        }
    }
    Ok((primary, replay))
}

/// Makes a [`Zone`] of what was found of it: frees redundant segments if the log is short
/// of free ones, compacts its version log to the durable versions, and starts its new
/// epoch past every version on disk.
fn finish_zone(config: &LogConfig, zone: ZoneId, rebuilt: Rebuilt) -> LogResult<Zone> {
    let (mut log, mut table, chains) = rebuilt;
    let newest_link = chains.finish(&mut table);
    if log.seclog.free_segments() < 2 {
        free_redundant_segments(config, zone, &mut log.seclog, &table)?;
    }
    let records: Vec<VersionRecord> = table
        .iter()
        .map(|(&cid, &state)| VersionRecord { cid, state })
        .collect();
    // The new epoch starts past every version on disk, links of unfinished chains
    // included: a later chain of the chunk with their version could otherwise be
    // assembled from links of both.
    let newest = records
        .iter()
        .map(|r| r.state.version)
        .chain(newest_link)
        .reduce(|a, b| if b.is_newer_than(a) { b } else { a });
    log.vlog.compact(&records)?;
    let epoch = newest.map_or(0, |v| v.epoch.wrapping_add(1));
    let mut versions = VersionManager::new(
        epoch,
        config.version_seal_entries(),
        config.version_buffer_entries_max,
    );
    // The segment appends continue in holds entries no placement will count.
    if let Some(active) = log.seclog.active() {
        let generation = log.seclog.segments()[active].generation;
        versions.usage_mut().mark_partial(active as u32, generation);
    }
    Ok(Zone {
        id: zone,
        versions: Mutex::new(versions),
        log: Mutex::new(log),
        reorg_lock: Mutex::new(()),
        used_after_pass: AtomicU64::new(0),
    })
}

impl Inner {
    /// The engine's shared state over `zones`, before its threads start.
    fn new(
        config: LogConfig,
        storage: Arc<dyn Storage>,
        zones: ZoneMap,
        primary: PrimaryLog,
    ) -> LogResult<Inner> {
        let half = (config.write_buffer_bytes / 2) as usize;
        let pipe = match config.write_threads {
            0 => None,
            n => Some(
                crate::pipe::WritePipe::new(n).map_err(io_context("starting log I/O threads"))?,
            ),
        };
        Ok(Inner {
            storage,
            wb: Mutex::new(WriteBuffer {
                active: Vec::with_capacity(half),
                spares: (1..WRITE_BUFFER_HALVES)
                    .map(|_| Vec::with_capacity(half))
                    .collect(),
                zones: zones.clone(),
                appended_entries: 0,
                appended_payload_bytes: 0,
                next_seq: 1,
                flush_wanted: 0,
                taken_seq: 0,
                wake_now: false,
            }),
            zones: RwLock::new(zones),
            wb_cv: Condvar::new(),
            durability: Mutex::new(Durability::default()),
            durable_cv: Condvar::new(),
            handoff: Mutex::new(Handoff {
                queued: None,
                free: vec![Groups::new(), Groups::new()],
                closed: false,
            }),
            handoff_cv: Condvar::new(),
            sync_q: Mutex::new(SyncQueue::default()),
            sync_cv: Condvar::new(),
            primary: Mutex::new(Some(primary)),
            reorg: Mutex::new(ReorgRequests::default()),
            reorg_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            counters: Counters::default(),
            pipe,
            recoveries_running: std::sync::atomic::AtomicUsize::new(0),
            writer_stage: std::sync::atomic::AtomicU8::new(0),
            config,
        })
    }
}

/// Reopens one zone's files: scans every segment (verifying checksums) to find each one's
/// end of data and the newest entry of every chunk.
fn reopen_zone(
    config: &LogConfig,
    storage: &Arc<dyn Storage>,
    zone: ZoneId,
) -> LogResult<(ZoneLog, CidMap<VersionState>, ChainTracker)> {
    let segment_bytes = config.segment_bytes as usize;
    let payload_max = config.entry_payload_bytes_max();
    let count = config.segments_per_log() as usize;
    let file = storage
        .open(&sec_name(zone), (count * segment_bytes) as u64)
        .map_err(io_context(format!("opening log of zone {zone}")))?;
    let file: Arc<dyn LogFile> = Arc::from(file);
    let mut segments = Vec::with_capacity(count);
    let mut buf = AlignedBuf::zeroed(segment_bytes);
    // The youngest segment with room becomes the active one again, with its last page.
    let mut active: Option<(u32, usize, Vec<u8>)> = None;
    // One pass finds each segment's end and each chunk's newest durable entry.
    let mut table: CidMap<VersionState> = CidMap::default();
    let mut chains = ChainTracker::default();
    for index in 0..count {
        // The header page first: free segments need no more.
        let page = PAGE_BYTES;
        SecondaryLog::read_segment(file.as_ref(), segment_bytes, index, page, &mut buf)?;
        let header = seclog::decode_segment_header(&buf);
        if header.is_some() {
            SecondaryLog::read_segment(
                file.as_ref(),
                segment_bytes,
                index,
                segment_bytes,
                &mut buf,
            )?;
        }
        let info = match header {
            Some(header) => {
                format::check(header.format, &sec_name(zone))?;
                let generation = header.generation;
                let end = seclog::scan_segment(
                    &buf,
                    segment_bytes,
                    zone.owner,
                    payload_max,
                    generation,
                    true,
                    |offset, e| {
                        let h = e.header;
                        chains.observe(&mut table, h.cid, h.epoch, h.version, h.chain, offset);
                    },
                );
                if end + 1 < segment_bytes && active.as_ref().is_none_or(|a| generation > a.0) {
                    let from = end / PAGE_BYTES * PAGE_BYTES;
                    active = Some((generation, index, buf[from..end].to_vec()));
                }
                SegmentInfo {
                    used: end as u32,
                    generation,
                }
            }
            None => SegmentInfo {
                used: 0,
                generation: 0,
            },
        };
        segments.push(info);
    }
    let (vlog, records) = VersionLog::open(storage.clone(), &vlog_base(zone))?;
    merge_removes(&mut table, &records);
    let active = active.map(|(_, index, tail)| (index, tail));
    let seclog = SecondaryLog::new(
        file,
        zone.owner,
        segment_bytes,
        payload_max,
        segments,
        active,
    )
    .with_runs(config.run_chunk_bytes_max);
    Ok((
        ZoneLog {
            seclog,
            sec_buffer: Vec::new(),
            vlog,
        },
        table,
        chains,
    ))
}

/// Frees the segments that hold no entry anyone needs: after a crash between a
/// reorganization pass's output and the freeing of its sources, both are on disk and the
/// log may have no free segment left for cleaning. Visits segments newest first; an
/// entry is needed if it is the current version of its chunk and no newer segment holds
/// it already (for links of chained chunks: the same link of the current version).
fn free_redundant_segments(
    config: &LogConfig,
    zone: ZoneId,
    seclog: &mut SecondaryLog,
    table: &CidMap<VersionState>,
) -> LogResult<()> {
    let segment_bytes = config.segment_bytes as usize;
    let payload_max = config.entry_payload_bytes_max();
    let file = seclog.file();
    let mut order: Vec<(usize, SegmentInfo)> = seclog
        .segments()
        .into_iter()
        .enumerate()
        .filter(|(_, s)| s.used > 0)
        .collect();
    order.sort_by_key(|(_, s)| std::cmp::Reverse(s.generation));
    let mut claimed: CidMap<()> = CidMap::default();
    let mut claimed_links: HashSet<(u64, u8)> = HashSet::new();
    let mut buf = AlignedBuf::zeroed(segment_bytes);
    for (index, info) in order {
        SecondaryLog::read_segment(
            file.as_ref(),
            segment_bytes,
            index,
            info.used as usize,
            &mut buf,
        )?;
        let mut needed = false;
        seclog::scan_segment(
            &buf,
            info.used as usize,
            zone.owner,
            payload_max,
            info.generation,
            true,
            |_, e| {
                let h = e.header;
                if !crate::version::is_current(table, &h) {
                    return;
                }
                let first_copy = match h.chain {
                    None => claimed.insert(h.cid, ()).is_none(),
                    Some(link) => claimed_links.insert((h.cid, link.index)),
                };
                if first_copy {
                    needed = true;
                }
            },
        );
        if !needed {
            seclog.free(index)?;
        }
    }
    seclog.sync()
}
