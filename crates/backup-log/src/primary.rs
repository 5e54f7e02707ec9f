//! The primary log: one file per engine that makes small batches durable at once.
//!
//! Job: when a zone's batch in one flush is smaller than its secondary-log buffer, the
//! batch is kept in that buffer (RAM) and written here, together with every other small
//! batch of the flush, in one sequential write. It is read only when the engine reopens
//! after a crash, to move what was still in secondary-log buffers into the secondary logs.
//!
//! Layout (byte by byte in `docs/log-format.md`): a 16-byte header (magic, generation,
//! CRC) at offset 0, then blocks `[type 0xB1, 0, owner u16, zone u16, 0 u16, bytes u32,
//! CRC u32]` each followed by `bytes` of entries, then a 0 byte. Block and entry checksums
//! are XORed with the generation, which changes every time the log starts over, so blocks
//! of an earlier round are never replayed.
//!
//! Invariants: written sequentially from the front, never reorganized; it starts over only
//! after every secondary-log buffer was written to its secondary log and synced.
//!
//! Callers: the engine's flusher (append, reset) and reopen (scan).

use crate::error::{io_context, LogResult};
use crate::format::{self, FORMAT_VERSION};
use crate::header;
use crate::seclog::walk_batch;
use crate::storage::{with_write_scratch, AlignedBuf, LogFile, PAGE_BYTES};
use crate::ZoneId;

const PRIMARY_MAGIC: u32 = 0x4952_504D; // "MPRI" little-endian
const HEADER_BYTES: usize = 16;
/// Bytes of a block header.
pub const BLOCK_HEADER_BYTES: usize = 16;
const BLOCK_TYPE: u8 = 0xB1;

/// The primary log. See the module docs.
#[derive(Debug)]
pub struct PrimaryLog {
    file: Box<dyn LogFile>,
    generation: u32,
    /// Offset of the end marker (where the next block goes).
    end: usize,
    /// Bytes from the last page boundary to `end`.
    tail: Vec<u8>,
    bytes_written: u64,
}

/// Entries of one zone to replay, re-based to generation 0 (write-buffer form).
pub type ReplayBlock = (ZoneId, Vec<u8>);

/// Block flag: the zone's secondary-log buffer was empty before this block, so the
/// blocks of the zone before it are in its secondary log already.
pub const BLOCK_FLAG_BUFFER_START: u8 = 1;

fn encode_file_header(generation: u32, out: &mut [u8]) {
    out[0..4].copy_from_slice(&PRIMARY_MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&generation.to_le_bytes());
    out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let crc = crc32c::crc32c(&out[0..12]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
}

fn word(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

/// Reads a file front to back in steps of a few MiB, keeping only a window of it.
struct Reader<'a> {
    file: &'a dyn LogFile,
    len: u64,
    /// File offset of `data[0]`.
    start: u64,
    data: Vec<u8>,
    chunk: AlignedBuf,
}

impl<'a> Reader<'a> {
    const STEP_BYTES: usize = 8 << 20;

    fn new(file: &'a dyn LogFile) -> Reader<'a> {
        let len = file.len() / PAGE_BYTES as u64 * PAGE_BYTES as u64;
        Reader {
            file,
            len,
            start: 0,
            data: Vec::new(),
            chunk: AlignedBuf::zeroed(Self::STEP_BYTES.min(len as usize)),
        }
    }

    /// Bytes `at..at + n` of the file; `None` past its end. `at` never goes backwards
    /// beyond what was asked before.
    fn get(&mut self, at: u64, n: usize) -> LogResult<Option<&[u8]>> {
        let end = at.saturating_add(n as u64);
        if end > self.len || at < self.start {
            return Ok(None);
        }
        let consumed = (at - self.start) as usize;
        if consumed >= Self::STEP_BYTES {
            self.data.drain(..consumed);
            self.start = at;
        }
        // The loaded end stays page-aligned: only whole steps are read.
        while self.start + (self.data.len() as u64) < end {
            let offset = self.start + self.data.len() as u64;
            let want = (self.len - offset).min(self.chunk.len() as u64) as usize;
            if want == 0 {
                return Ok(None);
            }
            self.file
                .read_at(&mut self.chunk[..want], offset)
                .map_err(io_context("reading primary log"))?;
            self.data.extend_from_slice(&self.chunk[..want]);
        }
        let from = (at - self.start) as usize;
        Ok(self.data.get(from..from + n))
    }
}

impl PrimaryLog {
    /// Opens the primary log over `file`, returning per zone the entries that were only
    /// in its secondary-log buffer (the blocks of the current round from the zone's last
    /// block flagged [`BLOCK_FLAG_BUFFER_START`] on), and a log that starts a new round
    /// only after [`PrimaryLog::reset`].
    pub fn open(
        file: Box<dyn LogFile>,
        payload_max: u32,
        owner_of: impl Fn(ZoneId) -> bool,
    ) -> LogResult<(PrimaryLog, Vec<ReplayBlock>)> {
        let mut blocks = Vec::new();
        let mut reader = Reader::new(file.as_ref());
        let header: Option<[u8; HEADER_BYTES]> =
            reader.get(0, HEADER_BYTES)?.and_then(|h| h.try_into().ok());
        let generation = match header {
            Some(h)
                if word(&h, 0) == Some(PRIMARY_MAGIC)
                    && word(&h, 12) == Some(crc32c::crc32c(&h[0..12])) =>
            {
                format::check(word(&h, 8).unwrap_or(0), "primary.log")?;
                word(&h, 4)
            }
            _ => None,
        };
        if let Some(generation) = generation {
            let mut at = HEADER_BYTES as u64;
            while let Some(h) = reader
                .get(at, BLOCK_HEADER_BYTES)?
                .and_then(|h| <[u8; BLOCK_HEADER_BYTES]>::try_from(h).ok())
            {
                if h[0] != BLOCK_TYPE || word(&h, 12) != Some(crc32c::crc32c(&h[..12]) ^ generation)
                {
                    break;
                }
                let zone = ZoneId {
                    owner: u16::from_le_bytes([h[2], h[3]]),
                    zone: u16::from_le_bytes([h[4], h[5]]),
                };
                let bytes = word(&h, 8).unwrap_or(0) as usize;
                let Some(body) = reader.get(at + BLOCK_HEADER_BYTES as u64, bytes)? else {
                    break;
                };
                let mut entries = Vec::with_capacity(bytes);
                let mut pos = 0;
                let mut intact = true;
                while let Some(rest) = body.get(pos..).filter(|r| !r.is_empty()) {
                    match header::decode(rest, zone.owner, payload_max) {
                        // Run entries exist only in secondary logs.
                        Ok(e) if e.header.run == 0 && e.verify(generation) => {
                            let start = entries.len();
                            entries.extend_from_slice(e.header_raw);
                            entries.extend_from_slice(e.payload);
                            header::rebase_crc(&mut entries[start..], &e.header, generation, 0);
                            pos += e.header.entry_bytes();
                        }
                        _ => {
                            intact = false;
                            break;
                        }
                    }
                }
                if owner_of(zone) {
                    if h[1] & BLOCK_FLAG_BUFFER_START != 0 {
                        blocks.retain(|(z, _)| *z != zone);
                    }
                    if !entries.is_empty() {
                        blocks.push((zone, entries));
                    }
                }
                if !intact {
                    break;
                }
                at += (BLOCK_HEADER_BYTES + bytes) as u64;
            }
        }
        let generation = generation.unwrap_or(0);
        let log = PrimaryLog {
            file,
            generation,
            end: HEADER_BYTES,
            tail: Vec::new(),
            bytes_written: 0,
        };
        Ok((log, blocks))
    }

    /// Bytes written since open.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Starts a new round: next generation, empty log, synced.
    pub fn reset(&mut self) -> LogResult<()> {
        self.generation = self.generation.wrapping_add(1);
        let mut page = AlignedBuf::zeroed(PAGE_BYTES);
        encode_file_header(self.generation, &mut page[..HEADER_BYTES]);
        self.file
            .write_at(&page, 0)
            .map_err(io_context("resetting primary log"))?;
        self.file
            .sync()
            .map_err(io_context("syncing primary log"))?;
        self.end = HEADER_BYTES;
        self.tail = page[..HEADER_BYTES].to_vec();
        self.bytes_written += PAGE_BYTES as u64;
        Ok(())
    }

    /// True if blocks of `bytes` entries in `blocks` blocks fit behind the end.
    pub fn fits(&self, blocks: usize, bytes: usize) -> bool {
        self.end + blocks * BLOCK_HEADER_BYTES + bytes < self.file.len() as usize
    }

    /// Writes the blocks (entries in write-buffer form) in one write; the caller checked
    /// [`PrimaryLog::fits`]. Not synced.
    pub fn append(&mut self, blocks: &[(ZoneId, u8, &[u8])], payload_max: u32) -> LogResult<()> {
        let bytes: usize = blocks
            .iter()
            .map(|(_, _, b)| BLOCK_HEADER_BYTES + b.len())
            .sum();
        if bytes == 0 {
            return Ok(());
        }
        let page_start = self.end / PAGE_BYTES * PAGE_BYTES;
        let end = self.end + bytes;
        let generation = self.generation;
        let tail = std::mem::take(&mut self.tail);
        let file = &self.file;
        let (written, new_tail) =
            with_write_scratch(end + 1 - page_start, |buf| -> LogResult<(u64, Vec<u8>)> {
                buf[..tail.len()].copy_from_slice(&tail);
                let mut at = self.end - page_start;
                for (zone, flags, entries) in blocks {
                    let h = &mut buf[at..at + BLOCK_HEADER_BYTES];
                    h.fill(0);
                    h[0] = BLOCK_TYPE;
                    h[1] = *flags;
                    h[2..4].copy_from_slice(&zone.owner.to_le_bytes());
                    h[4..6].copy_from_slice(&zone.zone.to_le_bytes());
                    h[8..12].copy_from_slice(&(entries.len() as u32).to_le_bytes());
                    let crc = crc32c::crc32c(&h[..12]) ^ generation;
                    h[12..16].copy_from_slice(&crc.to_le_bytes());
                    at += BLOCK_HEADER_BYTES;
                    buf[at..at + entries.len()].copy_from_slice(entries);
                    let headers = walk_batch(entries, zone.owner, payload_max)
                        .map_err(|e| crate::error::LogError::Failed(format!("internal: {e}")))?;
                    for (offset, h) in headers {
                        header::rebase_crc(&mut buf[at + offset..], &h, 0, generation);
                    }
                    at += entries.len();
                }
                buf[at..].fill(0);
                file.write_at(buf, page_start as u64)
                    .map_err(io_context("writing primary log"))?;
                let tail_from = end / PAGE_BYTES * PAGE_BYTES - page_start;
                Ok((buf.len() as u64, buf[tail_from..end - page_start].to_vec()))
            })?;
        self.bytes_written += written;
        self.end = end;
        self.tail = new_tail;
        Ok(())
    }

    /// Makes the written blocks durable.
    pub fn sync(&self) -> LogResult<()> {
        self.file.sync().map_err(io_context("syncing primary log"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{encode, EncodeArgs};
    use crate::storage::{MemStorage, Storage};

    fn entries(cid: u64, n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n as u64 {
            let args = EncodeArgs {
                cid: (1 << 48) | (cid + i),
                zone_owner: 1,
                epoch: 3,
                version: 1,
                chain: None,
            };
            encode(&args, &[7u8; 40], &mut out);
        }
        out
    }

    #[test]
    fn replay_starts_at_each_zones_last_buffer_start_and_stops_at_a_torn_block() {
        let storage = MemStorage::new();
        let z1 = ZoneId { owner: 1, zone: 1 };
        let z2 = ZoneId { owner: 1, zone: 2 };
        let open = || {
            let file = storage.open("p", 16 * PAGE_BYTES as u64).unwrap();
            PrimaryLog::open(file, 1 << 20, |_| true).unwrap()
        };
        let (mut p, replay) = open();
        assert!(replay.is_empty(), "a fresh log replays nothing");
        p.reset().unwrap();
        let (a, b, c, d) = (
            entries(0, 3),
            entries(10, 2),
            entries(20, 4),
            entries(30, 1),
        );
        p.append(
            &[
                (z1, BLOCK_FLAG_BUFFER_START, &a),
                (z2, BLOCK_FLAG_BUFFER_START, &b),
            ],
            1 << 20,
        )
        .unwrap();
        // z1's buffer was written to its secondary log: its next block starts afresh.
        p.append(&[(z1, BLOCK_FLAG_BUFFER_START, &c), (z2, 0, &d)], 1 << 20)
            .unwrap();
        p.sync().unwrap();
        let expected = [(z2, b.clone()), (z1, c.clone()), (z2, d.clone())];
        // A third append is cut partway and the machine crashes.
        let z3 = ZoneId { owner: 1, zone: 3 };
        let e = entries(40, 30);
        storage.set_write_budget(Some(700));
        assert!(p
            .append(&[(z3, BLOCK_FLAG_BUFFER_START, &e)], 1 << 20)
            .is_err());
        storage.crash(3);
        let (_, replay) = open();
        assert_eq!(&replay[..3], &expected[..], "synced blocks survive");
        match replay.get(3) {
            None => {}
            Some((zone, got)) => {
                // Entries of the torn block that verify are a prefix of what was written.
                assert_eq!(*zone, z3);
                assert!(got.len() < e.len() && e.starts_with(got));
            }
        }
        // After a reset (new generation) old blocks are never replayed.
        let (mut p, _) = open();
        p.reset().unwrap();
        let (_, replay) = open();
        assert!(replay.is_empty());
    }
}
