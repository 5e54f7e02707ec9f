//! The blocks of a version-log file: their byte format (see "Version log" in
//! `docs/log-format.md`), encoding, reading a whole file ([`read_file`]) and decoding one
//! handed over in windows ([`BlockDecoder`], used by recovery reads; fuzzed by
//! `fuzz/fuzz_targets/version_blocks.rs`).
//!
//! Invariants: the decoders never panic, check every count and checksum before they
//! visit a record, and give the same records for the same bytes whatever the windows.
//! The files themselves are managed by [`super::vlog`].

use super::{Version, VersionRecord, VersionState};
use crate::error::{io_context, LogResult};
use crate::format::{self, FORMAT_VERSION};
use crate::header::VERSION_IN_EPOCH_MAX;
use crate::storage::{round_up_to_page, AlignedBuf, LogFile, PAGE_BYTES};

pub(super) const BLOCK_MAGIC: u32 = 0x424C_564D; // "MVLB" little-endian
/// A block of runs: consecutive CIDs sharing one version state.
pub(super) const RUN_BLOCK_MAGIC: u32 = 0x524C_564D; // "MVLR" little-endian
pub(super) const BLOCK_HEADER_BYTES: usize = 16;
/// The item count in a block header's count word (its low 24 bits; the top byte is the
/// format version, see [`crate::format`]).
pub(super) const COUNT_MASK: u32 = (1 << 24) - 1;
/// Bytes of one version-log record: CID (8), epoch (2), version | deleted << 31 (4).
pub const RECORD_BYTES: usize = 14;
/// Bytes of one run: first CID (8), CIDs in the run (4), epoch (2), version | deleted <<
/// 31 (4).
pub(super) const RUN_BYTES: usize = 18;
/// Records (or runs) per block, so a block stays below 1.2 MiB.
pub(super) const BLOCK_RECORDS_MAX: usize = 65_536;
/// Records one run block may stand for (bounds what a block expands to when read).
pub(super) const RUN_BLOCK_RECORDS_MAX: u64 = 1 << 22;

/// The kinds of version-log blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BlockKind {
    /// One record per entry.
    Records,
    /// Runs of consecutive CIDs with one state.
    Runs,
}

impl BlockKind {
    fn of_magic(magic: u32) -> Option<BlockKind> {
        match magic {
            BLOCK_MAGIC => Some(BlockKind::Records),
            RUN_BLOCK_MAGIC => Some(BlockKind::Runs),
            _ => None,
        }
    }

    fn item_bytes(self) -> usize {
        match self {
            BlockKind::Records => RECORD_BYTES,
            BlockKind::Runs => RUN_BYTES,
        }
    }
}

/// One run: `count` CIDs from `first` on, all with `state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run {
    pub(super) first: u64,
    pub(super) count: u32,
    pub(super) state: VersionState,
}

pub(super) fn encode_state(state: VersionState, out: &mut [u8]) {
    out[..2].copy_from_slice(&state.version.epoch.to_le_bytes());
    let v = state.version.version | (u32::from(state.deleted) << 31);
    out[2..6].copy_from_slice(&v.to_le_bytes());
}

pub(super) fn decode_state(raw: &[u8]) -> Option<VersionState> {
    let epoch = u16::from_le_bytes(raw.get(..2)?.try_into().ok()?);
    let v = u32::from_le_bytes(raw.get(2..6)?.try_into().ok()?);
    Some(VersionState {
        version: Version {
            epoch,
            version: v & VERSION_IN_EPOCH_MAX,
        },
        deleted: v >> 31 == 1,
    })
}

pub(super) fn encode_run(run: &Run, out: &mut [u8]) {
    out[..8].copy_from_slice(&run.first.to_le_bytes());
    out[8..12].copy_from_slice(&run.count.to_le_bytes());
    encode_state(run.state, &mut out[12..18]);
}

/// A run as stored, if it is well-formed: at least one CID, none past `u64::MAX`.
pub(super) fn decode_run(raw: &[u8]) -> Option<Run> {
    let first = u64::from_le_bytes(raw.get(..8)?.try_into().ok()?);
    let count = u32::from_le_bytes(raw.get(8..12)?.try_into().ok()?);
    let state = decode_state(raw.get(12..18)?)?;
    (count >= 1 && first.checked_add(u64::from(count) - 1).is_some()).then_some(Run {
        first,
        count,
        state,
    })
}

/// `records` sorted by CID (stable) as runs of consecutive CIDs with equal states, when
/// that takes at most half the bytes of plain records; `None` otherwise (or if empty).
pub(super) fn runs_of(records: &[VersionRecord]) -> Option<Vec<Run>> {
    if records.is_empty() {
        return None;
    }
    let mut sorted: Vec<&VersionRecord> = records.iter().collect();
    sorted.sort_by_key(|r| r.cid);
    let limit = records.len() * RECORD_BYTES / 2 / RUN_BYTES;
    let mut runs: Vec<Run> = Vec::new();
    for r in sorted {
        if let Some(last) = runs.last_mut() {
            let next = last.first.checked_add(u64::from(last.count));
            if next == Some(r.cid) && last.state == r.state && last.count < u32::MAX {
                last.count += 1;
                continue;
            }
        }
        if runs.len() >= limit {
            return None;
        }
        runs.push(Run {
            first: r.cid,
            count: 1,
            state: r.state,
        });
    }
    Some(runs)
}

/// Splits `runs` into blocks of at most [`BLOCK_RECORDS_MAX`] runs standing for at most
/// [`RUN_BLOCK_RECORDS_MAX`] records (a longer run is cut in pieces).
pub(super) fn run_blocks(runs: &[Run]) -> Vec<Vec<Run>> {
    let mut blocks: Vec<Vec<Run>> = vec![Vec::new()];
    let mut in_block = 0u64;
    for run in runs {
        let mut run = *run;
        loop {
            let room = RUN_BLOCK_RECORDS_MAX - in_block;
            let full = blocks.last().is_some_and(|b| b.len() >= BLOCK_RECORDS_MAX);
            if room == 0 || full {
                blocks.push(Vec::new());
                in_block = 0;
                continue;
            }
            let take = u64::from(run.count).min(room);
            if let Some(block) = blocks.last_mut() {
                // `take` is at most `run.count`, a u32.
                block.push(Run {
                    count: take as u32,
                    ..run
                });
            }
            in_block += take;
            if take == u64::from(run.count) {
                break;
            }
            run.first += take;
            run.count -= take as u32;
        }
    }
    blocks
}

/// Visits the records of a block body of `kind` holding `count` items, after checking
/// every item (a run block whose runs are malformed or stand for too many records is
/// invalid, and nothing of it is visited). Returns whether the body is valid.
pub(super) fn visit_body(
    kind: BlockKind,
    body: &[u8],
    visit: &mut impl FnMut(VersionRecord),
) -> bool {
    match kind {
        BlockKind::Records => {
            body.chunks_exact(RECORD_BYTES)
                .filter_map(decode_record)
                .for_each(&mut *visit);
            true
        }
        BlockKind::Runs => {
            let mut total = 0u64;
            for raw in body.chunks_exact(RUN_BYTES) {
                match decode_run(raw) {
                    Some(run) => total += u64::from(run.count),
                    None => return false,
                }
            }
            if total > RUN_BLOCK_RECORDS_MAX {
                return false;
            }
            for run in body.chunks_exact(RUN_BYTES).filter_map(decode_run) {
                for i in 0..u64::from(run.count) {
                    visit(VersionRecord {
                        cid: run.first + i,
                        state: run.state,
                    });
                }
            }
            true
        }
    }
}

pub(super) fn encode_record(r: &VersionRecord, out: &mut [u8]) {
    out[..8].copy_from_slice(&r.cid.to_le_bytes());
    encode_state(r.state, &mut out[8..14]);
}

pub(super) fn decode_record(raw: &[u8]) -> Option<VersionRecord> {
    let cid = u64::from_le_bytes(raw.get(..8)?.try_into().ok()?);
    let state = decode_state(raw.get(8..14)?)?;
    Some(VersionRecord { cid, state })
}

/// Encodes `records` as page-padded blocks of generation `generation`: as run blocks
/// (sorted by CID) when runs of consecutive CIDs with one state take at most half the
/// bytes, else as record blocks in the given order. Readers merge records by version, so
/// their order within an append does not matter.
pub(super) fn encode_blocks(records: &[VersionRecord], generation: u32) -> AlignedBuf {
    if let Some(runs) = runs_of(records) {
        return encode_run_blocks(&runs, generation);
    }
    encode_record_blocks(records, generation)
}

pub(super) fn encode_run_blocks(runs: &[Run], generation: u32) -> AlignedBuf {
    let blocks = run_blocks(runs);
    let parts: Vec<&[Run]> = blocks.iter().map(Vec::as_slice).collect();
    encode_parts(&parts, RUN_BLOCK_MAGIC, RUN_BYTES, generation, encode_run)
}

pub(super) fn encode_record_blocks(records: &[VersionRecord], generation: u32) -> AlignedBuf {
    let parts: Vec<&[VersionRecord]> = if records.is_empty() {
        vec![&[][..]]
    } else {
        records.chunks(BLOCK_RECORDS_MAX).collect()
    };
    encode_parts(&parts, BLOCK_MAGIC, RECORD_BYTES, generation, encode_record)
}

/// One page-padded block per part: header (`magic`, `generation`, item count, CRC32C)
/// and the items, `item_bytes` each, written by `encode`.
pub(super) fn encode_parts<T>(
    parts: &[&[T]],
    magic: u32,
    item_bytes: usize,
    generation: u32,
    encode: impl Fn(&T, &mut [u8]),
) -> AlignedBuf {
    let total: usize = parts
        .iter()
        .map(|p| round_up_to_page(BLOCK_HEADER_BYTES + p.len() * item_bytes))
        .sum();
    let mut buf = AlignedBuf::zeroed(total);
    let mut at = 0;
    for part in parts {
        let body = BLOCK_HEADER_BYTES + part.len() * item_bytes;
        let block = &mut buf[at..at + body];
        block[0..4].copy_from_slice(&magic.to_le_bytes());
        block[4..8].copy_from_slice(&generation.to_le_bytes());
        let count_word = part.len() as u32 | FORMAT_VERSION << 24;
        block[8..12].copy_from_slice(&count_word.to_le_bytes());
        for (i, item) in part.iter().enumerate() {
            let o = BLOCK_HEADER_BYTES + i * item_bytes;
            encode(item, &mut block[o..o + item_bytes]);
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&block[..12]), &block[16..]);
        block[12..16].copy_from_slice(&crc.to_le_bytes());
        at += round_up_to_page(body);
    }
    buf
}

/// Reads the valid blocks of one version-log file `name`: `(generation, end offset,
/// records)`, or `None` if its first block is not valid. A valid block of a newer format
/// version than this code's is an error.
#[allow(clippy::type_complexity)]
pub(super) fn read_file(
    file: &dyn LogFile,
    name: &str,
) -> LogResult<Option<(u32, u64, Vec<VersionRecord>)>> {
    let len = file.len();
    let mut records = Vec::new();
    let mut at = 0u64;
    let mut generation = None;
    let mut page = AlignedBuf::zeroed(PAGE_BYTES);
    while at + PAGE_BYTES as u64 <= len {
        file.read_at(&mut page, at)
            .map_err(io_context("reading version log"))?;
        let word = |i: usize| u32::from_le_bytes([page[i], page[i + 1], page[i + 2], page[i + 3]]);
        let count = (word(8) & COUNT_MASK) as usize;
        let Some(kind) = BlockKind::of_magic(word(0)) else {
            break;
        };
        if generation.is_some_and(|g| g != word(4)) || count > BLOCK_RECORDS_MAX {
            break;
        }
        let body = BLOCK_HEADER_BYTES + count * kind.item_bytes();
        let padded = round_up_to_page(body) as u64;
        if at + padded > len {
            break;
        }
        let mut block = AlignedBuf::zeroed(padded as usize);
        file.read_at(&mut block, at)
            .map_err(io_context("reading version log"))?;
        let crc = crc32c::crc32c_append(crc32c::crc32c(&block[..12]), &block[16..body]);
        if crc != word(12) {
            break;
        }
        format::check(word(8) >> 24, name)?;
        let before = records.len();
        if !visit_body(kind, &block[BLOCK_HEADER_BYTES..body], &mut |r| {
            records.push(r)
        }) {
            records.truncate(before);
            break;
        }
        generation = Some(word(4));
        at += padded;
    }
    Ok(generation.map(|g| (g, at, records)))
}

/// What [`parse_block`] found at the start of its input.
pub(super) enum BlockParse {
    /// A valid block of this many bytes (page-padded); its records were visited.
    Done(usize),
    /// Not decidable before this many bytes are there.
    Need(usize),
    /// Not a valid block: the file's blocks end here.
    Invalid,
}

/// Parses the block at the start of `bytes` as [`read_file`] does (magic, generation
/// `expected` if known, record count, checksum), visiting its records if it is valid.
pub(super) fn parse_block(
    bytes: &[u8],
    expected: Option<u32>,
    visit: &mut impl FnMut(VersionRecord),
) -> (BlockParse, Option<u32>) {
    let Some(head) = bytes.first_chunk::<BLOCK_HEADER_BYTES>() else {
        return (BlockParse::Need(BLOCK_HEADER_BYTES), expected);
    };
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let count = (word(8) & COUNT_MASK) as usize;
    let Some(kind) = BlockKind::of_magic(word(0)) else {
        return (BlockParse::Invalid, expected);
    };
    if expected.is_some_and(|g| g != word(4)) || count > BLOCK_RECORDS_MAX {
        return (BlockParse::Invalid, expected);
    }
    let body = BLOCK_HEADER_BYTES + count * kind.item_bytes();
    let padded = round_up_to_page(body);
    let (Some(first), Some(records)) = (bytes.get(..12), bytes.get(BLOCK_HEADER_BYTES..body))
    else {
        return (BlockParse::Need(padded), expected);
    };
    if bytes.len() < padded {
        return (BlockParse::Need(padded), expected);
    }
    // A block of a newer format ends the file here as a bad one does (the engine refused
    // to open such a file; see `read_file`).
    if crc32c::crc32c_append(crc32c::crc32c(first), records) != word(12)
        || word(8) >> 24 > FORMAT_VERSION
    {
        return (BlockParse::Invalid, expected);
    }
    if !visit_body(kind, records, visit) {
        return (BlockParse::Invalid, expected);
    }
    (BlockParse::Done(padded), Some(word(4)))
}

/// Decodes a version-log file handed over in consecutive windows from its start (any
/// sizes): the same records, in the same order, as [`VersionLog::load`](super::VersionLog::load) (blocks are
/// checked the same way and the first invalid one ends the file). A block split between
/// two windows is completed in a small carry buffer; everything else is decoded in place.
#[derive(Debug, Default)]
pub struct BlockDecoder {
    generation: Option<u32>,
    /// The bytes of a block begun in an earlier window (never more than one block).
    carry: Vec<u8>,
    /// Bytes of valid blocks so far.
    end: u64,
    stopped: bool,
}

impl BlockDecoder {
    /// A decoder at the start of a file.
    pub fn new() -> BlockDecoder {
        BlockDecoder::default()
    }

    /// Decodes the next `window` of the file, calling `visit` for every record of every
    /// block completed by it.
    pub fn feed(&mut self, mut window: &[u8], visit: &mut impl FnMut(VersionRecord)) {
        while !self.stopped && !self.carry.is_empty() {
            let (parse, generation) = parse_block(&self.carry, self.generation, visit);
            self.generation = generation;
            match parse {
                BlockParse::Done(bytes) => {
                    self.end += bytes as u64;
                    self.carry.clear();
                }
                BlockParse::Invalid => self.stopped = true,
                BlockParse::Need(needed) => {
                    let take = needed.saturating_sub(self.carry.len()).min(window.len());
                    if take == 0 {
                        return;
                    }
                    self.carry.extend_from_slice(&window[..take]);
                    window = &window[take..];
                }
            }
        }
        let mut at = 0;
        while !self.stopped && at < window.len() {
            let (parse, generation) = parse_block(&window[at..], self.generation, visit);
            self.generation = generation;
            match parse {
                BlockParse::Done(bytes) => {
                    at += bytes;
                    self.end += bytes as u64;
                }
                BlockParse::Invalid => self.stopped = true,
                BlockParse::Need(_) => {
                    self.carry.extend_from_slice(&window[at..]);
                    return;
                }
            }
        }
    }

    /// The generation and end offset of the valid blocks fed so far, or `None` if the
    /// first block was not valid (what `VersionLog::load` finds; records were visited only
    /// for valid blocks).
    pub fn finish(&self) -> Option<(u32, u64)> {
        self.generation.map(|g| (g, self.end))
    }
}
