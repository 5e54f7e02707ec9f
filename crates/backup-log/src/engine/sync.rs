//! The syncer thread: syncs the files of a flush the writer wrote (without primary-log
//! blocks), moves `durable_seq`, then writes the sealed epochs that became writable,
//! while the writer already writes the next flush.
//!
//! Invariants: at most one flush is in flight here, so flushes become durable in the
//! order the writer wrote them and `durable_seq` only grows. [`sync_all`] syncs several
//! files at once; [`Inner::write_sealed`] (here, since the writer's primary-log path
//! calls it too) writes the sealed epochs that became writable. See the [parent module](super).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Inner, Seq};
use crate::error::{io_context, LogError, LogResult};
use crate::storage::LogFile;
use crate::zone::Zone;

/// Writer → syncer handoff: the files of one written flush to sync, then its last
/// sequence number becomes durable (at most one flush in flight, so flushes become durable
/// in order).
#[derive(Debug, Default)]
pub(super) struct SyncQueue {
    pub(super) job: Option<SyncJob>,
    /// A job was taken and is being synced.
    pub(super) busy: bool,
    /// Set by the writer when it stops; the syncer ends once idle.
    pub(super) closed: bool,
}

#[derive(Debug)]
pub(super) struct SyncJob {
    pub(super) files: Vec<Arc<dyn LogFile>>,
    pub(super) last_seq: Seq,
}

impl Inner {
    /// Everything up to `last_seq` is durable now. Flushes become durable in the order they
    /// were taken (the writer waits for the syncer before it moves `durable_seq` itself),
    /// so `durable_seq` never moves back: asserted, since a reader told "durable" too early
    /// could lose acknowledged data.
    pub(super) fn mark_durable(&self, last_seq: Seq) {
        let mut d = self.durability.lock();
        assert!(
            last_seq >= d.durable_seq,
            "durable_seq would move back from {} to {last_seq}",
            d.durable_seq
        );
        d.durable_seq = last_seq;
        self.durable_cv.notify_all();
    }

    /// Writes the sealed epochs whose appends are all durable (up to `last_seq`) to the
    /// version logs: not needed for durability (entries carry their versions), needed
    /// before the manager may seal again. Written to every zone's version log first, then
    /// synced together.
    pub(super) fn write_sealed(&self, last_seq: Seq) -> LogResult<()> {
        let zones: Vec<Arc<Zone>> = self.zones.read().values().cloned().collect();
        let mut written: Vec<(Arc<Zone>, u16)> = Vec::new();
        let mut to_sync: Vec<Arc<dyn LogFile>> = Vec::new();
        for zone in zones {
            let sealed = zone.versions.lock().sealed_ready(last_seq).cloned();
            if let Some(sealed) = sealed {
                to_sync.push(zone.log.lock().vlog.append_unsynced(&sealed.records)?);
                written.push((zone, sealed.epoch));
            }
        }
        sync_all(&to_sync)?;
        for (zone, epoch) in written {
            zone.versions.lock().sealed_written(epoch);
        }
        Ok(())
    }

    /// Waits until the syncer has no flush in flight (its flush is durable or the engine
    /// failed).
    pub(super) fn wait_sync_idle(&self) {
        let mut q = self.sync_q.lock();
        while q.job.is_some() || q.busy {
            self.sync_cv.wait(&mut q);
        }
    }

    /// Hands a written flush to the syncer: queued behind the one being synced, if any
    /// (the writer goes on with the next flush meanwhile, so the disk is never idle
    /// waiting for a sync); waits only while an earlier flush is still queued.
    pub(super) fn submit_sync(&self, job: SyncJob) {
        let mut q = self.sync_q.lock();
        while q.job.is_some() {
            self.sync_cv.wait(&mut q);
        }
        q.job = Some(job);
        self.sync_cv.notify_all();
    }

    /// The syncer thread: syncs the files of a flush the writer wrote, moves `durable_seq`,
    /// then writes the sealed epochs that became writable, while the writer already writes
    /// the next flush (its disk writes overlap this flush's `fdatasync` calls).
    pub(super) fn syncer_loop(self: Arc<Self>) {
        loop {
            let job = {
                let mut q = self.sync_q.lock();
                loop {
                    if let Some(job) = q.job.take() {
                        // At most one flush in flight here: flushes become durable in order.
                        assert!(!q.busy, "two flushes in the syncer");
                        q.busy = true;
                        break Some(job);
                    }
                    if q.closed {
                        break None;
                    }
                    self.sync_cv.wait(&mut q);
                }
            };
            let Some(SyncJob { files, last_seq }) = job else {
                return;
            };
            if !self.failed.load(Ordering::Relaxed) {
                let synced = sync_all(&files).and_then(|()| {
                    self.mark_durable(last_seq);
                    self.write_sealed(last_seq)
                });
                if let Err(e) = synced {
                    self.fail(e.to_string());
                }
            }
            {
                let mut q = self.sync_q.lock();
                q.busy = false;
                self.sync_cv.notify_all();
            }
            // Producers waiting for a sealed epoch to reach the disk retry now.
            let _wb = self.wb.lock();
            self.wb_cv.notify_all();
        }
    }
}

/// Most files [`sync_all`] syncs at once.
pub(super) const PARALLEL_SYNCS_MAX: usize = 4;

/// Makes every completed write to `files` durable: with several files, up to
/// [`PARALLEL_SYNCS_MAX`] `fdatasync` calls run at once (on threads of this call), so the
/// file system can commit them together instead of one after the other (on ext4 each
/// sync after writes into preallocated space commits the journal). Returns the first
/// error; every sync has ended when it returns.
pub(super) fn sync_all(files: &[Arc<dyn LogFile>]) -> LogResult<()> {
    let sync = |f: &Arc<dyn LogFile>| f.sync().map_err(io_context("syncing log files"));
    if files.len() <= 1 {
        return files.iter().try_for_each(sync);
    }
    let per_thread = files.len().div_ceil(PARALLEL_SYNCS_MAX);
    let mut parts = files.chunks(per_thread);
    let own = parts.next().unwrap_or(&[]);
    std::thread::scope(|scope| {
        let mut result = Ok(());
        let mut others = Vec::new();
        for part in parts {
            match std::thread::Builder::new()
                .name("log-sync".into())
                .spawn_scoped(scope, move || part.iter().try_for_each(sync))
            {
                Ok(handle) => others.push(handle),
                // No thread: sync here instead.
                Err(_) => result = result.and(part.iter().try_for_each(sync)),
            }
        }
        result = result.and(own.iter().try_for_each(sync));
        for handle in others {
            let r = handle
                .join()
                .unwrap_or_else(|_| Err(LogError::Failed("a sync thread panicked".into())));
            result = result.and(r);
        }
        result
    })
}
