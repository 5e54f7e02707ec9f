//! The validating side of a zone read: threads take the segments as they are read,
//! check each entry against the version table (and its checksum if asked), claim its
//! chunk and hand it to the caller's sink in batches, as slices of the read buffer;
//! links of chained chunks are assembled first ([`Validation`]). See the
//! [parent module](super).

use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use crate::header;
use crate::seclog;
use crate::version::{CidMap, Version};

use super::readers::{FailOnPanic, Pipe, ReadJob};
use super::table::{Assembly, RecoveryTable, Slot};
use super::{RecoveredChunk, RecoveryOptions};

/// An empty vector for new borrows, keeping the allocation of `batch` (emptied).
pub(super) fn recycle<'b>(mut batch: Vec<RecoveredChunk<'_>>) -> Vec<RecoveredChunk<'b>> {
    batch.clear();
    // An empty iterator collected in place: same element layout, so the allocation is
    // kept and nothing is copied.
    batch
        .into_iter()
        .map(|chunk| RecoveredChunk {
            cid: chunk.cid,
            payload: &[],
        })
        .collect()
}

/// Per-thread counters of a recovery read, added up at the end (shared counters updated
/// per entry would bounce a cache line between the threads).
#[derive(Default)]
pub(super) struct Counts {
    pub(super) chunks: u64,
    pub(super) payload_bytes: u64,
    pub(super) segments_read: u64,
    pub(super) bytes_read: u64,
    pub(super) seen: u64,
    pub(super) skipped: u64,
    pub(super) corrupt: u64,
}

impl Counts {
    pub(super) fn add(&mut self, other: &Counts) {
        self.chunks += other.chunks;
        self.payload_bytes += other.payload_bytes;
        self.segments_read += other.segments_read;
        self.bytes_read += other.bytes_read;
        self.seen += other.seen;
        self.skipped += other.skipped;
        self.corrupt += other.corrupt;
    }
}

/// What the validating threads share.
pub(super) struct Validation<'r> {
    pub(super) table: &'r RecoveryTable,
    pub(super) owner: u16,
    pub(super) payload_max: u32,
    pub(super) options: &'r RecoveryOptions,
    pub(super) sink: &'r (dyn Fn(&[RecoveredChunk<'_>]) + Sync),
    pub(super) assemblies: Mutex<CidMap<Assembly>>,
    pub(super) completed: Mutex<Vec<(u64, Vec<u8>)>>,
    pub(super) totals: Mutex<Counts>,
}

impl Validation<'_> {
    /// Validates segments from `pipe` until it is drained, handing current chunks to the
    /// sink in batches.
    pub(super) fn run(&self, pipe: &Pipe) {
        let _guard = FailOnPanic(pipe);
        let mut counts = Counts::default();
        let mut spare: Vec<RecoveredChunk<'static>> = Vec::new();
        while let Some(filled) = pipe.next_segment() {
            if let ReadJob::Segment { info, .. } = filled.job {
                counts.segments_read += 1;
                counts.bytes_read += filled.len as u64;
                let batch = recycle(std::mem::take(&mut spare));
                let batch = self.segment(&filled.buf, info, batch, &mut counts);
                spare = recycle(batch);
            }
            pipe.give_back(filled.buf, false);
        }
        self.totals.lock().add(&counts);
    }

    /// Validates one segment; returns the (delivered) batch vector for reuse.
    pub(super) fn segment<'a>(
        &self,
        segment: &'a [u8],
        info: seclog::SegmentInfo,
        mut batch: Vec<RecoveredChunk<'a>>,
        counts: &mut Counts,
    ) -> Vec<RecoveredChunk<'a>> {
        let table = self.table;
        let options = self.options;
        let end = seclog::scan_segment(
            segment,
            info.used as usize,
            self.owner,
            self.payload_max,
            info.generation,
            options.verify_crc,
            |_, e| {
                counts.seen += 1;
                let h = e.header;
                let v = Version {
                    epoch: h.epoch,
                    version: h.version,
                };
                let Some(slot) = table.live(h.cid).filter(|slot| slot.version() == v) else {
                    counts.skipped += 1;
                    return;
                };
                match h.chain {
                    None => {
                        if slot.claimed.swap(true, Ordering::Relaxed) {
                            counts.skipped += 1;
                            return;
                        }
                        batch.push(RecoveredChunk {
                            cid: h.cid,
                            payload: e.payload,
                        });
                        if batch.len() >= options.batch_chunks_max {
                            deliver(&batch, self.sink, counts);
                            batch.clear();
                        }
                    }
                    Some(link) => {
                        if !self.link(h.cid, v, link, e.payload, slot) {
                            counts.skipped += 1;
                        }
                    }
                }
            },
        );
        if end < info.used as usize {
            counts.corrupt += 1;
        }
        deliver(&batch, self.sink, counts);
        batch.clear();
        batch
    }

    /// Adds one link of a large chunk; false if it was not taken (duplicate or stale).
    pub(super) fn link(
        &self,
        cid: u64,
        v: Version,
        link: header::ChainLink,
        payload: &[u8],
        slot: &Slot,
    ) -> bool {
        let mut a = self.assemblies.lock();
        let asm = a.entry(cid).or_insert_with(|| Assembly {
            version: v,
            count: link.count,
            links: vec![None; usize::from(link.count)],
            have: 0,
        });
        let taken = match asm.links.get_mut(usize::from(link.index)) {
            Some(l @ None) if asm.count == link.count && asm.version == v => {
                *l = Some(payload.to_vec());
                asm.have += 1;
                true
            }
            _ => false,
        };
        if asm.have == usize::from(asm.count) {
            if let Some(done) = a.remove(&cid) {
                if !slot.claimed.swap(true, Ordering::Relaxed) {
                    let whole: Vec<u8> = done.links.into_iter().flatten().flatten().collect();
                    self.completed.lock().push((cid, whole));
                }
            }
        }
        taken
    }
}

pub(super) fn deliver(
    batch: &[RecoveredChunk<'_>],
    sink: &(dyn Fn(&[RecoveredChunk<'_>]) + Sync),
    counts: &mut Counts,
) {
    if batch.is_empty() {
        return;
    }
    counts.chunks += batch.len() as u64;
    counts.payload_bytes += batch.iter().map(|c| c.payload.len() as u64).sum::<u64>();
    sink(batch);
}
