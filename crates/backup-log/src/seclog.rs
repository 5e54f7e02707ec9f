//! The secondary log of one zone: a preallocated file of fixed-size segments.
//!
//! Job: place batches of entries into segments (an entry never spans segments), keep each
//! segment's fill level and generation in RAM, free and reuse segments for the
//! reorganizer, and scan segments back (recovery, reorganization, reopen).
//!
//! Layout (byte by byte in `docs/log-format.md`): every used segment starts with a 16-byte
//! header (magic, generation, CRC); entries follow back to back; after the last entry comes
//! a 0 byte (end of data). Each entry's checksum is XORed with its segment's generation, so
//! entries of an older use of the segment never verify.
//!
//! Invariants:
//! - Writes are whole pages at page offsets: appending to a segment rewrites its partial
//!   last page from the copy kept in RAM (`tail`), so O_DIRECT works without a read.
//! - Only the *active* segment is appended to; closed segments are immutable until the
//!   reorganizer frees them, which it does only after their valid entries are durable
//!   elsewhere. A freed segment gets a zero header page before it is reused.
//! - One segment stays free for the reorganizer: ordinary writes fail with
//!   [`PlaceError::NoSpace`] instead of taking it.
//!
//! Callers: the engine's flusher (append), the reorganizer (write cleaned segments, free
//! old ones), recovery and reopen (scan).

use crate::error::{io_context, DecodeError, LogResult};
use crate::format::FORMAT_VERSION;
use crate::header::{self, EntryHeader};
use crate::pipe::{TrackedFile, WritePipe};
use crate::storage::{round_up_to_page, with_write_scratch, AlignedBuf, LogFile, PAGE_BYTES};
use crate::version::EntryLoc;

/// An entry written to a segment: its header and where it went.
pub type Placement = (EntryHeader, EntryLoc);

/// Bytes of the segment header.
pub const SEGMENT_HEADER_BYTES: usize = 16;
const SEGMENT_MAGIC: u32 = 0x4745_534D; // "MSEG" little-endian

/// Fill state of one segment.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Bytes used including the segment header; 0 for a free segment.
    pub used: u32,
    /// Generation of the current use (entry checksums are XORed with it).
    pub generation: u32,
}

/// Why a batch could not be placed completely.
#[derive(Debug)]
pub enum PlaceError {
    /// No free segment is left for ordinary writes; `placed` bytes of the batch were
    /// written (whole entries).
    NoSpace {
        /// Bytes of the batch placed before running out.
        placed: usize,
    },
    /// A disk error.
    Io(crate::error::LogError),
}

/// A segment header that verified.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The generation of the segment's use.
    pub generation: u32,
    /// The format version it was written in (see [`crate::format`]); 0 for segments
    /// written before the field existed.
    pub format: u32,
}

/// Encodes a segment header (of this code's format version).
pub fn encode_segment_header(generation: u32, out: &mut [u8]) {
    out[0..4].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&generation.to_le_bytes());
    out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let crc = crc32c::crc32c(&out[0..12]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a segment header, `None` for a free or torn one. The caller checks the format
/// version ([`crate::format`]).
pub fn decode_segment_header(bytes: &[u8]) -> Option<SegmentHeader> {
    let h = bytes.get(..SEGMENT_HEADER_BYTES)?;
    let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    if word(0) != SEGMENT_MAGIC || crc32c::crc32c(&h[0..12]) != word(12) {
        return None;
    }
    Some(SegmentHeader {
        generation: word(4),
        format: word(8),
    })
}

/// Walks the entries of `segment` (the segment's bytes from its start) up to `limit`
/// bytes, calling `f(offset, entry)` for each chunk or link. Stops at the end-of-data
/// marker, at the first entry that does not decode, or — when `verify` — at the first
/// entry whose checksum does not match `generation`. Returns the end offset of the last
/// good entry.
///
/// A run entry is checked as a whole and then handed out chunk by chunk (see
/// [`header::Entry::run_index`]), all at the run's offset.
pub fn scan_segment<'a>(
    segment: &'a [u8],
    limit: usize,
    zone_owner: u16,
    payload_max: u32,
    generation: u32,
    verify: bool,
    mut f: impl FnMut(usize, &header::Entry<'a>),
) -> usize {
    let data = segment.get(..limit.min(segment.len())).unwrap_or(&[]);
    let mut at = SEGMENT_HEADER_BYTES;
    while at < data.len() {
        let Some(rest) = data.get(at..) else { break };
        let entry = match header::decode(rest, zone_owner, payload_max) {
            Ok(e) => e,
            Err(_) => break,
        };
        if verify && !entry.verify(generation) {
            break;
        }
        if entry.header.run >= 2 {
            for member in entry.run_members() {
                f(at, &member);
            }
        } else {
            f(at, &entry);
        }
        at += entry.header.entry_bytes();
    }
    at
}

/// Walks a batch of entries in write-buffer form (generation 0), returning each entry's
/// header and its offset. A batch the engine built itself always decodes and holds no run
/// entries (those exist only in secondary logs); anything else is a bug, reported as such.
pub fn walk_batch(
    batch: &[u8],
    zone_owner: u16,
    payload_max: u32,
) -> Result<Vec<(usize, EntryHeader)>, DecodeError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < batch.len() {
        let rest = batch.get(at..).unwrap_or(&[]);
        let h = header::decode_header(rest, zone_owner, payload_max)?;
        if h.run != 0 {
            return Err(DecodeError::BadRun { count: h.run });
        }
        out.push((at, h));
        at += h.entry_bytes();
    }
    Ok(out)
}

/// One zone's secondary log. See the module docs.
#[derive(Debug)]
pub struct SecondaryLog {
    /// Writes of the writer thread may be in flight on its [`WritePipe`]; reads and syncs
    /// through this wrapper wait for them.
    file: std::sync::Arc<TrackedFile>,
    zone_owner: u16,
    segment_bytes: usize,
    payload_max: u32,
    segments: Vec<SegmentInfo>,
    active: Option<usize>,
    /// The active segment's bytes from the start of its last partial page to `used`.
    tail: Vec<u8>,
    next_generation: u32,
    /// Per segment, the logical time its data was written: the generation counter when a
    /// flush filled it, the youngest source's stamp for the reorganizer's output (RAM
    /// only; a reopened log starts from the generations).
    stamps: Vec<u32>,
    /// Bytes handed to the storage (whole pages, rewritten partial pages included).
    device_bytes_written: u64,
    /// Chunks of at most this many payload bytes, written together with consecutive CIDs
    /// and one version, are stored as one run entry (0: never).
    run_chunk_bytes_max: u32,
}

/// Payload bytes of one run entry at most: large enough that its 15-odd header bytes
/// vanish, small enough that a run cut at a segment's end wastes little.
const RUN_PAYLOAD_BYTES_MAX: usize = 64 << 10;

/// A part of a batch as it is written: entry `first` alone (`count` 1, copied as it is),
/// or entries `first..first + count` as one run entry of `bytes`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Piece {
    first: usize,
    count: usize,
    bytes: usize,
}

impl Piece {
    fn is_run(&self) -> bool {
        self.count >= 2
    }
}

impl SecondaryLog {
    /// A log over `file` whose segments are described by `segments` (all free for a new
    /// log; from a scan for a reopened one).
    pub fn new(
        file: std::sync::Arc<dyn LogFile>,
        zone_owner: u16,
        segment_bytes: usize,
        payload_max: u32,
        segments: Vec<SegmentInfo>,
        active: Option<(usize, Vec<u8>)>,
    ) -> SecondaryLog {
        let next_generation = segments
            .iter()
            .filter(|s| s.used > 0)
            .map(|s| s.generation)
            .max()
            .map_or(1, |g| g.wrapping_add(1));
        let stamps = segments.iter().map(|s| s.generation).collect();
        SecondaryLog {
            file: std::sync::Arc::new(TrackedFile::new(file)),
            zone_owner,
            segment_bytes,
            payload_max,
            stamps,
            segments,
            active: active.as_ref().map(|a| a.0),
            tail: active.map(|a| a.1).unwrap_or_default(),
            next_generation,
            device_bytes_written: 0,
            run_chunk_bytes_max: 0,
        }
    }

    /// Stores chunks of at most `chunk_bytes_max` payload bytes that are written together
    /// with consecutive CIDs and one version as run entries (0: never; the default).
    pub fn with_runs(mut self, chunk_bytes_max: u32) -> SecondaryLog {
        self.run_chunk_bytes_max = chunk_bytes_max;
        self
    }

    /// The file (for reads by recovery and reorganization; they wait for writes in flight
    /// that overlap them).
    pub fn file(&self) -> std::sync::Arc<dyn LogFile> {
        self.file.clone()
    }

    /// A copy of the segment table.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.segments.clone()
    }

    /// The active segment, if any.
    pub fn active(&self) -> Option<usize> {
        self.active
    }

    /// The generation the next segment taken will get (the log's logical clock).
    pub fn next_generation(&self) -> u32 {
        self.next_generation
    }

    /// The logical time segment `index`'s data was written (see the field).
    pub fn stamp(&self, index: usize) -> u32 {
        self.stamps.get(index).copied().unwrap_or(0)
    }

    /// Sets the logical time of segment `index`'s data (the reorganizer's output carries
    /// its sources' age).
    pub fn set_stamp(&mut self, index: usize, stamp: u32) {
        if let Some(s) = self.stamps.get_mut(index) {
            *s = stamp;
        }
    }

    /// Bytes used in all segments (valid and outdated entries alike).
    pub fn used_bytes(&self) -> u64 {
        self.segments.iter().map(|s| u64::from(s.used)).sum()
    }

    /// Total bytes of the log.
    pub fn capacity_bytes(&self) -> u64 {
        (self.segments.len() * self.segment_bytes) as u64
    }

    /// Bytes handed to the storage since open (whole pages, including the partial page
    /// each append rewrites, the reorganizer's output and the zero page over the header
    /// of each freed segment).
    pub fn device_bytes_written(&self) -> u64 {
        self.device_bytes_written
    }

    /// Used bytes in percent of the capacity.
    pub fn utilization_percent(&self) -> u32 {
        (self.used_bytes() * 100 / self.capacity_bytes().max(1)) as u32
    }

    /// Free segments.
    pub fn free_segments(&self) -> usize {
        self.segments.iter().filter(|s| s.used == 0).count()
    }

    fn take_free(&mut self, for_reorg: bool) -> Option<(usize, Vec<u8>)> {
        let reserve = if for_reorg { 0 } else { 1 };
        if self.free_segments() <= reserve {
            return None;
        }
        let index = self.segments.iter().position(|s| s.used == 0)?;
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        self.segments[index] = SegmentInfo {
            used: SEGMENT_HEADER_BYTES as u32,
            generation,
        };
        if let Some(s) = self.stamps.get_mut(index) {
            *s = generation;
        }
        let mut tail = vec![0u8; SEGMENT_HEADER_BYTES];
        encode_segment_header(generation, &mut tail);
        Some((index, tail))
    }

    /// Cuts `headers` (entries of a batch in write-buffer form, in order) into pieces:
    /// runs of at least two chunks that may share a run entry, and single entries.
    fn plan(&self, headers: &[(usize, EntryHeader)]) -> Vec<Piece> {
        let mut pieces = Vec::with_capacity(if self.run_chunk_bytes_max == 0 {
            headers.len()
        } else {
            16
        });
        let runnable = |h: &EntryHeader| {
            h.chain.is_none() && h.run == 0 && h.payload_bytes <= self.run_chunk_bytes_max
        };
        let mut i = 0;
        while i < headers.len() {
            let h = headers[i].1;
            let mut j = i + 1;
            if runnable(&h) {
                let per = (h.payload_bytes as usize).max(1);
                let most = RUN_PAYLOAD_BYTES_MAX
                    .min(self.payload_max as usize)
                    .checked_div(per)
                    .unwrap_or(0)
                    .min(header::RUN_CHUNKS_MAX);
                while j < headers.len() && j - i < most {
                    let (prev, next) = (headers[j - 1].1, headers[j].1);
                    if !runnable(&next)
                        || next.payload_bytes != h.payload_bytes
                        || next.epoch != h.epoch
                        || next.version != h.version
                        || prev.cid.checked_add(1) != Some(next.cid)
                        || next.cid & ((1 << 48) - 1) == 0
                    {
                        break;
                    }
                    j += 1;
                }
            }
            let count = j - i;
            let bytes = if count >= 2 {
                header::run_entry_bytes(&self.run_args(&h), count, h.payload_bytes as usize)
            } else {
                h.entry_bytes()
            };
            pieces.push(Piece {
                first: i,
                count,
                bytes,
            });
            i = j;
        }
        pieces
    }

    fn run_args(&self, first: &EntryHeader) -> header::EncodeArgs {
        header::EncodeArgs {
            cid: first.cid,
            zone_owner: self.zone_owner,
            epoch: first.epoch,
            version: first.version,
            chain: None,
        }
    }

    /// The pieces from `pieces[p]` on that fit in `room` bytes, as their end index; a run
    /// that does not fit whole is cut in `pieces` so that its first part fits (when at
    /// least one chunk does).
    fn fitting(
        &self,
        headers: &[(usize, EntryHeader)],
        pieces: &mut Vec<Piece>,
        p: usize,
        room: usize,
    ) -> usize {
        let mut used = 0;
        let mut q = p;
        while q < pieces.len() {
            let piece = pieces[q];
            if used + piece.bytes <= room {
                used += piece.bytes;
                q += 1;
                continue;
            }
            if piece.is_run() {
                let h = headers[piece.first].1;
                let per = h.payload_bytes as usize;
                let left = room - used;
                let head = piece.bytes - piece.count * per;
                let fit = if left >= head && per > 0 {
                    ((left - head) / per).min(piece.count - 1)
                } else {
                    0
                };
                let first = Piece {
                    first: piece.first,
                    count: fit,
                    bytes: head + fit * per,
                };
                let single = h.entry_bytes();
                let (cut, bytes) = if fit >= 2 {
                    (fit, first.bytes)
                } else if single <= left {
                    (1, single)
                } else {
                    break;
                };
                let rest_h = headers[piece.first + cut].1;
                let rest_count = piece.count - cut;
                let rest = Piece {
                    first: piece.first + cut,
                    count: rest_count,
                    bytes: if rest_count >= 2 {
                        header::run_entry_bytes(&self.run_args(&rest_h), rest_count, per)
                    } else {
                        rest_h.entry_bytes()
                    },
                };
                pieces[q] = Piece {
                    first: piece.first,
                    count: cut,
                    bytes,
                };
                pieces.insert(q + 1, rest);
                q += 1;
            }
            break;
        }
        q
    }

    /// Writes the pieces `pieces` of `batch` (whole entries in write-buffer form, at
    /// `headers`) at the end of segment `index`, followed by the end marker. `tail` holds
    /// the segment's bytes from its last page boundary to its end and is updated.
    #[allow(clippy::too_many_arguments)]
    fn write_into(
        &mut self,
        index: usize,
        tail: &mut Vec<u8>,
        batch: &[u8],
        headers: &[(usize, EntryHeader)],
        pieces: &[Piece],
        placed: &mut Vec<Placement>,
        pipe: Option<&WritePipe>,
    ) -> LogResult<()> {
        let info = self.segments[index];
        let start = info.used as usize;
        let page_start = start / PAGE_BYTES * PAGE_BYTES;
        if tail.len() != start - page_start {
            return Err(crate::error::LogError::Failed(
                "internal: segment tail out of step".into(),
            ));
        }
        let bytes: usize = pieces.iter().map(|p| p.bytes).sum();
        let end = start + bytes;
        // Whole pages from the page holding `start` to the one holding the end marker.
        let len = round_up_to_page(end + 1 - page_start).min(self.segment_bytes - page_start);
        let offset = (index * self.segment_bytes + page_start) as u64;
        let zone_owner = self.zone_owner;
        // The page image: the tail of the last write, the entries with their checksums
        // rebased on the segment's generation (runs built and checksummed here), then
        // zeros (the end marker and padding). The tail for the next write is taken from it
        // before it is handed to the disk.
        let mut fill = |buf: &mut [u8]| {
            buf[..tail.len()].copy_from_slice(tail);
            let mut at = start - page_start;
            let mut p = 0;
            while p < pieces.len() {
                if pieces[p].is_run() {
                    let piece = pieces[p];
                    let first = headers[piece.first].1;
                    let per = first.payload_bytes as usize;
                    let members = &headers[piece.first..piece.first + piece.count];
                    let args = header::EncodeArgs {
                        cid: first.cid,
                        zone_owner,
                        epoch: first.epoch,
                        version: first.version,
                        chain: None,
                    };
                    header::write_run(
                        &mut buf[at..at + piece.bytes],
                        &args,
                        piece.count,
                        per,
                        info.generation,
                        |area| {
                            for ((offset, h), to) in
                                members.iter().zip(area.chunks_exact_mut(per.max(1)))
                            {
                                let from = offset + h.header_bytes;
                                to.copy_from_slice(&batch[from..from + per]);
                            }
                        },
                    );
                    at += piece.bytes;
                    p += 1;
                    continue;
                }
                // Single entries next to each other in the batch: one copy.
                let mut q = p + 1;
                while q < pieces.len() && !pieces[q].is_run() {
                    let (prev_at, prev) = headers[pieces[q - 1].first];
                    if headers[pieces[q].first].0 != prev_at + prev.entry_bytes() {
                        break;
                    }
                    q += 1;
                }
                let from = headers[pieces[p].first].0;
                let last = headers[pieces[q - 1].first];
                let to = last.0 + last.1.entry_bytes();
                buf[at..at + (to - from)].copy_from_slice(&batch[from..to]);
                for piece in &pieces[p..q] {
                    let (offset, h) = &headers[piece.first];
                    header::rebase_crc(&mut buf[at + offset - from..], h, 0, info.generation);
                }
                at += to - from;
                p = q;
            }
            buf[at..len].fill(0);
            let tail_from = end / PAGE_BYTES * PAGE_BYTES - page_start;
            tail.clear();
            tail.extend_from_slice(&buf[tail_from..end - page_start]);
        };
        match pipe {
            Some(pipe) => pipe
                .write_with(&self.file, len, offset, fill)
                .map_err(io_context("writing secondary log"))?,
            None => {
                let file = &self.file;
                with_write_scratch(len, |buf| {
                    fill(&mut buf[..len]);
                    file.write_at(&buf[..len], offset)
                        .map_err(io_context("writing secondary log"))
                })?
            }
        }
        self.segments[index].used = end as u32;
        self.device_bytes_written += len as u64;
        // A run's chunks each count their payload; the first also the run's header.
        for piece in pieces {
            let members = &headers[piece.first..piece.first + piece.count];
            let head = if piece.is_run() {
                piece.bytes
                    - members
                        .iter()
                        .map(|(_, h)| h.payload_bytes as usize)
                        .sum::<usize>()
            } else {
                0
            };
            placed.extend(members.iter().enumerate().map(|(k, &(_, h))| {
                let bytes = if piece.is_run() {
                    h.payload_bytes as usize + if k == 0 { head } else { 0 }
                } else {
                    h.entry_bytes()
                };
                (
                    h,
                    EntryLoc {
                        segment: index as u32,
                        generation: info.generation,
                        bytes: bytes as u32,
                    },
                )
            }));
        }
        Ok(())
    }

    /// Appends a batch of whole entries (write-buffer form). Entries go to the active
    /// segment while they fit; a batch of at least 3/4 of a segment starts a new one. On
    /// [`PlaceError::NoSpace`] the caller asks for reorganization and retries with the
    /// rest of the batch. Every entry written is added to `placed`.
    #[cfg(test)]
    pub fn append(
        &mut self,
        batch: &[u8],
        use_reserve: bool,
        placed: &mut Vec<Placement>,
    ) -> Result<(), PlaceError> {
        let headers = walk_batch(batch, self.zone_owner, self.payload_max).map_err(|e| {
            PlaceError::Io(crate::error::LogError::Failed(format!(
                "internal: batch does not decode: {e}"
            )))
        })?;
        self.append_walked(batch, &headers, use_reserve, placed, None)
    }

    /// `SecondaryLog::append` (tests) of the entries `headers` of `batch` (offsets into `batch`,
    /// in order; back to back as [`walk_batch`] gives them, or apart, as the entries of
    /// one zone lie in a write-buffer half; a suffix of them continues a batch after
    /// [`PlaceError::NoSpace`], whose `placed` is then an offset into `batch` too). With a
    /// `pipe`, the writes are handed to its I/O threads and may still be in flight when
    /// this returns (the log's file waits for them before a read or sync).
    pub fn append_walked(
        &mut self,
        batch: &[u8],
        headers: &[(usize, EntryHeader)],
        use_reserve: bool,
        placed: &mut Vec<Placement>,
        pipe: Option<&WritePipe>,
    ) -> Result<(), PlaceError> {
        // Entries in order, apart or next to each other, none outside the batch (the
        // copies below index by these offsets).
        let mut bytes = 0usize;
        let mut next_free = 0usize;
        for (offset, h) in headers {
            let end = offset + h.entry_bytes();
            if *offset < next_free || end > batch.len() {
                return Err(PlaceError::Io(crate::error::LogError::Failed(
                    "internal: entry offsets outside their batch or out of order".into(),
                )));
            }
            next_free = end;
            bytes += h.entry_bytes();
        }
        if headers.is_empty() {
            return Ok(());
        }
        if bytes >= self.segment_bytes * 3 / 4 {
            self.active = None;
        }
        let mut pieces = self.plan(headers);
        let mut p = 0;
        while p < pieces.len() {
            let index = match self.active {
                Some(a) => a,
                None => match self.take_free(use_reserve) {
                    Some((a, tail)) => {
                        self.active = Some(a);
                        self.tail = tail;
                        a
                    }
                    None => {
                        return Err(PlaceError::NoSpace {
                            placed: headers[pieces[p].first].0,
                        })
                    }
                },
            };
            // Keep one byte of room for the end marker.
            let room = self.segment_bytes - self.segments[index].used as usize - 1;
            let q = self.fitting(headers, &mut pieces, p, room);
            if q == p {
                if self.segments[index].used as usize == SEGMENT_HEADER_BYTES {
                    return Err(PlaceError::Io(crate::error::LogError::Failed(
                        "internal: entry larger than a segment".into(),
                    )));
                }
                self.active = None;
                continue;
            }
            let mut tail = std::mem::take(&mut self.tail);
            let result = self.write_into(
                index,
                &mut tail,
                batch,
                headers,
                &pieces[p..q],
                placed,
                pipe,
            );
            self.tail = tail;
            result.map_err(PlaceError::Io)?;
            p = q;
        }
        Ok(())
    }

    /// Writes a batch of whole entries into fresh segments, closed afterwards (the
    /// reorganizer's output; may use the reserved segment). Returns the segments written,
    /// or `None` if no free segment was left (those written so far stay used; the caller
    /// frees its sources only for what was written). Every entry written is added to
    /// `placed`.
    pub fn write_closed(
        &mut self,
        batch: &[u8],
        placed: &mut Vec<Placement>,
    ) -> LogResult<Option<Vec<usize>>> {
        let headers = walk_batch(batch, self.zone_owner, self.payload_max)
            .map_err(|e| crate::error::LogError::Failed(format!("internal: {e}")))?;
        let mut written = Vec::new();
        let mut pieces = self.plan(&headers);
        let mut p = 0;
        while p < pieces.len() {
            let Some((index, mut tail)) = self.take_free(true) else {
                return Ok(None);
            };
            let room = self.segment_bytes - SEGMENT_HEADER_BYTES - 1;
            let q = self.fitting(&headers, &mut pieces, p, room);
            if q == p {
                return Err(crate::error::LogError::Failed(
                    "internal: entry larger than a segment".into(),
                ));
            }
            self.write_into(
                index,
                &mut tail,
                batch,
                &headers,
                &pieces[p..q],
                placed,
                None,
            )?;
            written.push(index);
            p = q;
        }
        Ok(Some(written))
    }

    /// Frees segment `index` (its valid entries must be durable elsewhere): writes a zero
    /// page over its header and marks it free.
    pub fn free(&mut self, index: usize) -> LogResult<()> {
        assert!(self.segments[index].used > 0, "freeing a free segment");
        let zero = AlignedBuf::zeroed(PAGE_BYTES);
        self.file
            .write_at(&zero, (index * self.segment_bytes) as u64)
            .map_err(io_context("freeing segment"))?;
        // A write like any other: it counts (benchmarks divide this by the payload).
        self.device_bytes_written += PAGE_BYTES as u64;
        if self.active == Some(index) {
            self.active = None;
        }
        self.segments[index] = SegmentInfo {
            used: 0,
            generation: 0,
        };
        Ok(())
    }

    /// Closes the active segment: later writes start a new one.
    pub fn close_active(&mut self) {
        self.active = None;
    }

    /// Makes everything written durable.
    pub fn sync(&self) -> LogResult<()> {
        self.file
            .sync()
            .map_err(io_context("syncing secondary log"))
    }

    /// Reads segment `index` up to `used` bytes (rounded up to pages) into `buf`.
    pub fn read_segment(
        file: &dyn LogFile,
        segment_bytes: usize,
        index: usize,
        used: usize,
        buf: &mut AlignedBuf,
    ) -> LogResult<usize> {
        let len = round_up_to_page(used).min(segment_bytes).min(buf.len());
        file.read_at(&mut buf[..len], (index * segment_bytes) as u64)
            .map_err(io_context("reading segment"))?;
        Ok(len)
    }
}

#[cfg(test)]
#[path = "seclog_tests.rs"]
mod tests;
