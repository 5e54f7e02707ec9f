//! The append path: producers put records into the active half of the write buffer, a
//! version and a sequence number assigned under the buffer lock (see the
//! [parent module](super) for the pipeline and its invariants).
//!
//! Job: one lock pass per append (or per batch of a zone), the record built with its
//! checksum on the stack and copied in once; chains either whole (at most half the
//! buffer) or link by link as an open chain. Waits (bounded by `wait_timeout`) while the
//! buffer or the version buffer is full. This is the hot path: no allocation, no extra
//! lock and no copy per entry beyond the one into the buffer; checks are `debug_assert!`.
//!
//! Callers: [`LogEngine::append`](super::LogEngine::append) and its siblings, and
//! the reorganizer's chain refresh (`push_links`).

use std::time::Instant;

use super::{AppendTicket, Inner, Seq};
use crate::error::{LogError, LogResult};
use crate::header::{self, ChainLink, EncodeArgs};
use crate::version::{AssignBlocked, Version};
use crate::zone::Zone;
use crate::ZoneId;

pub(super) const RECORD_ENTRY: u8 = 1;
pub(super) const RECORD_REMOVE: u8 = 2;
pub(super) const RECORD_HEADER_BYTES: usize = 9;
pub(super) const REMOVE_RECORD_BYTES: usize = 1 + 4 + 8 + 2 + 4;

pub(super) enum Record<'a> {
    Put {
        payload: &'a [u8],
        chain: Option<ChainLink>,
    },
    Remove,
}

impl Inner {
    /// Puts one record into the write buffer. `version` is given for the links after the
    /// first of a chain (they share the first link's version).
    pub(super) fn push(
        &self,
        zone: &Zone,
        cid: u64,
        record: Record<'_>,
        version: Option<Version>,
    ) -> LogResult<AppendTicket> {
        let half = (self.config.write_buffer_bytes / 2) as usize;
        let bytes = match &record {
            Record::Put { payload, .. } => {
                RECORD_HEADER_BYTES + header::HEADER_BYTES_MAX + payload.len()
            }
            Record::Remove => REMOVE_RECORD_BYTES,
        };
        let mut deadline = None;
        let mut wb = self.wb.lock();
        loop {
            self.check_failed()?;
            if wb.active.len() + bytes <= half {
                let assigned = match version {
                    Some(v) => {
                        let mut vm = zone.versions.lock();
                        vm.note_seq(v.epoch, wb.next_seq);
                        if let Record::Put {
                            chain: Some(link), ..
                        } = record
                        {
                            if usize::from(link.index) + 1 == usize::from(link.count) {
                                // The chain's version counts from its last link on.
                                vm.close_chain(cid, v, wb.next_seq);
                            }
                        }
                        Ok(v)
                    }
                    None => {
                        let mut vm = zone.versions.lock();
                        match record {
                            // The first link of a chain pushed link by link: its version
                            // does not count before its last link (an open chain).
                            Record::Put { chain: Some(_), .. } => vm.assign_chain(cid, wb.next_seq),
                            Record::Put { .. } => vm.assign_put(cid, wb.next_seq),
                            Record::Remove => vm.assign_remove(cid, wb.next_seq),
                        }
                    }
                };
                match assigned {
                    Ok(v) => {
                        let seq = wb.next_seq;
                        wb.next_seq += 1;
                        encode_record(&mut wb.active, zone.id, cid, v, &record);
                        if let Record::Put { payload, .. } = record {
                            wb.appended_entries += 1;
                            wb.appended_payload_bytes += payload.len() as u64;
                        }
                        if wb.active.len() >= flush_threshold(half) {
                            self.wb_cv.notify_all();
                        }
                        return Ok(AppendTicket { seq, version: v });
                    }
                    Err(AssignBlocked::SealPending) => {
                        // The flusher writes the sealed epoch at its next flush.
                        wb.wake_now = true;
                    }
                }
            } else {
                wb.wake_now = true;
            }
            self.wb_cv.notify_all();
            let until = *deadline.get_or_insert_with(|| Instant::now() + self.config.wait_timeout);
            if self.wb_cv.wait_until(&mut wb, until).timed_out() {
                drop(wb);
                return Err(self.timeout("room in the write or version buffer"));
            }
        }
    }

    /// Puts a write of a whole (unchained) chunk into the write buffer: the append path of
    /// [`LogEngine::append`](super::LogEngine::append). One pass under the buffer lock: the zone is found in the
    /// buffer's own map, the version manager's lock is held only for the assignment, and
    /// the record is built with its checksum on the stack and copied in once.
    pub(super) fn push_put(
        &self,
        zone: ZoneId,
        cid: u64,
        payload: &[u8],
    ) -> LogResult<AppendTicket> {
        let half = (self.config.write_buffer_bytes / 2) as usize;
        let bytes = RECORD_HEADER_BYTES + header::HEADER_BYTES_MAX + payload.len();
        let mut deadline = None;
        let mut guard = self.wb.lock();
        loop {
            self.check_failed()?;
            let wb = &mut *guard;
            let z = wb.zones.get(&zone).ok_or(LogError::UnknownZone(zone))?;
            if wb.active.len() + bytes <= half {
                let seq = wb.next_seq;
                let assigned = z.versions.lock().assign_put(cid, seq);
                match assigned {
                    Ok(v) => {
                        wb.next_seq += 1;
                        encode_put(&mut wb.active, zone, cid, v, None, payload);
                        // Hot path: checked in debug builds only.
                        debug_assert!(wb.active.len() <= half, "write-buffer half overfull");
                        wb.appended_entries += 1;
                        wb.appended_payload_bytes += payload.len() as u64;
                        if wb.active.len() >= flush_threshold(half) {
                            self.wb_cv.notify_all();
                        }
                        return Ok(AppendTicket { seq, version: v });
                    }
                    // The flusher writes the sealed epoch at its next flush.
                    Err(AssignBlocked::SealPending) => wb.wake_now = true,
                }
            } else {
                wb.wake_now = true;
            }
            self.wb_cv.notify_all();
            let until = *deadline.get_or_insert_with(|| Instant::now() + self.config.wait_timeout);
            if self.wb_cv.wait_until(&mut guard, until).timed_out() {
                drop(guard);
                return Err(self.timeout("room in the write or version buffer"));
            }
        }
    }

    /// Puts all links of a chained chunk into the write buffer under one lock hold, once
    /// `chain_bytes` fit.
    pub(super) fn push_chain(
        &self,
        zone: &Zone,
        cid: u64,
        payload: &[u8],
        link_bytes: usize,
        chain_bytes: usize,
    ) -> LogResult<AppendTicket> {
        let half = (self.config.write_buffer_bytes / 2) as usize;
        let count = payload.len().div_ceil(link_bytes);
        let mut deadline = None;
        let mut wb = self.wb.lock();
        loop {
            self.check_failed()?;
            if wb.active.len() + chain_bytes <= half {
                let mut vm = zone.versions.lock();
                if let Ok(v) = vm.assign_put(cid, wb.next_seq) {
                    let mut last = 0;
                    for (index, part) in payload.chunks(link_bytes).enumerate() {
                        let record = Record::Put {
                            payload: part,
                            chain: Some(ChainLink {
                                index: index as u8,
                                count: count as u8,
                            }),
                        };
                        last = wb.next_seq;
                        wb.next_seq += 1;
                        encode_record(&mut wb.active, zone.id, cid, v, &record);
                    }
                    vm.note_seq(v.epoch, last);
                    drop(vm);
                    wb.appended_entries += count as u64;
                    wb.appended_payload_bytes += payload.len() as u64;
                    self.wb_cv.notify_all();
                    return Ok(AppendTicket {
                        seq: last,
                        version: v,
                    });
                }
            }
            wb.wake_now = true;
            self.wb_cv.notify_all();
            let until = *deadline.get_or_insert_with(|| Instant::now() + self.config.wait_timeout);
            if self.wb_cv.wait_until(&mut wb, until).timed_out() {
                drop(wb);
                return Err(self.timeout("room in the write or version buffer"));
            }
        }
    }

    /// Puts links `links` of the chained chunk `payload` (split into links of `link_bytes`)
    /// into the write buffer one by one, each under its own lock hold: the path of chains
    /// above half the write buffer. `version` is the chain's version when the first link
    /// is not among them (it was pushed before). Returns the last link's sequence number
    /// and the chain's version.
    pub(crate) fn push_links(
        &self,
        zone: &Zone,
        cid: u64,
        payload: &[u8],
        link_bytes: usize,
        links: std::ops::Range<usize>,
        version: Option<Version>,
    ) -> LogResult<AppendTicket> {
        let count = payload.len().div_ceil(link_bytes);
        let mut first: Option<AppendTicket> =
            version.map(|version| AppendTicket { seq: 0, version });
        for (index, part) in payload.chunks(link_bytes).enumerate() {
            if !links.contains(&index) {
                continue;
            }
            let chain = Some(ChainLink {
                index: index as u8,
                count: count as u8,
            });
            let pushed = self.push(
                zone,
                cid,
                Record::Put {
                    payload: part,
                    chain,
                },
                first.map(|t| t.version),
            );
            let t = match pushed {
                Ok(t) => t,
                Err(e) => {
                    if first.is_some() {
                        // Links are in but the last one cannot follow: the chain would
                        // stay open for good, holding its epoch back from the version log
                        // (and the zone's epochs with it). Only a timeout gets here with
                        // the engine still running (a stalled flusher or disk): stop it,
                        // as for a failed write; a reopen rebuilds the chunk's state from
                        // the disk, where the chain is incomplete and the previous
                        // version is kept (see docs/log-format.md).
                        self.fail(format!(
                            "a chained append of chunk {cid:#x} in zone {} stopped at link \
                             {index} of {count}: {e}",
                            zone.id
                        ));
                    }
                    return Err(e);
                }
            };
            first = Some(first.map_or(t, |f| AppendTicket {
                seq: t.seq,
                version: f.version,
            }));
        }
        first.ok_or_else(|| LogError::Failed("internal: empty chain".into()))
    }

    /// Puts writes of whole (unchained) chunks of one zone into the write buffer, taking
    /// the buffer and version locks once for as many as fit. Returns the last sequence
    /// number.
    pub(super) fn push_many(&self, zone: &Zone, items: &[(u64, &[u8])]) -> LogResult<Seq> {
        let half = (self.config.write_buffer_bytes / 2) as usize;
        let mut deadline = None;
        let mut done = 0;
        let mut last = 0;
        let mut payload_bytes = 0u64;
        let mut wb = self.wb.lock();
        while done < items.len() {
            self.check_failed()?;
            {
                let mut vm = zone.versions.lock();
                for &(cid, payload) in &items[done..] {
                    let bytes = RECORD_HEADER_BYTES + header::HEADER_BYTES_MAX + payload.len();
                    if wb.active.len() + bytes > half {
                        wb.wake_now = true;
                        break;
                    }
                    let Ok(v) = vm.assign_put(cid, wb.next_seq) else {
                        wb.wake_now = true;
                        break;
                    };
                    last = wb.next_seq;
                    wb.next_seq += 1;
                    let record = Record::Put {
                        payload,
                        chain: None,
                    };
                    encode_record(&mut wb.active, zone.id, cid, v, &record);
                    payload_bytes += payload.len() as u64;
                    done += 1;
                }
            }
            if done < items.len() {
                self.wb_cv.notify_all();
                let until =
                    *deadline.get_or_insert_with(|| Instant::now() + self.config.wait_timeout);
                if self.wb_cv.wait_until(&mut wb, until).timed_out() {
                    drop(wb);
                    return Err(self.timeout("room in the write or version buffer"));
                }
            }
        }
        wb.appended_entries += items.len() as u64;
        wb.appended_payload_bytes += payload_bytes;
        if wb.active.len() >= flush_threshold(half) {
            self.wb_cv.notify_all();
        }
        drop(wb);
        Ok(last)
    }
}

/// Fill level of the active half at which the flusher takes it: the write buffer is then
/// about half full (DXRAM's threshold), and the other half takes appends meanwhile.
pub(super) fn flush_threshold(half: usize) -> usize {
    half - half / 16
}

/// Appends a write record (`[1][owner][zone][entry bytes u32]`, then the entry) to `out`:
/// record header and entry header are built on the stack, the checksum computed in the
/// same pass, and the whole copied with two copies (header, payload).
#[inline]
pub(super) fn encode_put(
    out: &mut Vec<u8>,
    zone: ZoneId,
    cid: u64,
    v: Version,
    chain: Option<ChainLink>,
    payload: &[u8],
) {
    let h = header::build_header(
        &EncodeArgs {
            cid,
            zone_owner: zone.owner,
            epoch: v.epoch,
            version: v.version,
            chain,
        },
        payload,
    );
    // The record as three little-endian words: the 9-byte record header, then the entry
    // header (at most 24 bytes) shifted in after it. Stored whole (fixed-size copies, no
    // call), then the bytes past the header cut off again.
    let (lo, hi) = h.words();
    // Entry lengths fit in u32: the header asserts the payload does with room to spare.
    let len = (h.len() + payload.len()) as u32;
    let record_header = u128::from(RECORD_ENTRY)
        | u128::from(zone.owner) << 8
        | u128::from(zone.zone) << 24
        | u128::from(len) << 40;
    const SHIFT: u32 = 8 * RECORD_HEADER_BYTES as u32;
    let w0 = record_header | lo << SHIFT;
    let w1 = lo >> (128 - SHIFT) | u128::from(hi) << SHIFT;
    let w2 = hi >> (128 - SHIFT);
    out.reserve(40 + payload.len());
    let start = out.len();
    out.extend_from_slice(&w0.to_le_bytes());
    out.extend_from_slice(&w1.to_le_bytes());
    out.extend_from_slice(&w2.to_le_bytes());
    out.truncate(start + RECORD_HEADER_BYTES + h.len());
    out.extend_from_slice(payload);
}

pub(super) fn encode_record(
    out: &mut Vec<u8>,
    zone: ZoneId,
    cid: u64,
    v: Version,
    record: &Record<'_>,
) {
    match record {
        Record::Put { payload, chain } => encode_put(out, zone, cid, v, *chain, payload),
        Record::Remove => {
            out.push(RECORD_REMOVE);
            out.extend_from_slice(&zone.owner.to_le_bytes());
            out.extend_from_slice(&zone.zone.to_le_bytes());
            out.extend_from_slice(&cid.to_le_bytes());
            out.extend_from_slice(&v.epoch.to_le_bytes());
            out.extend_from_slice(&v.version.to_le_bytes());
        }
    }
}
