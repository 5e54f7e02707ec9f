//! The log entry header: encoder and bounds-checked decoder.
//!
//! Job: turn one chunk write (CID, epoch, version, optional chain position, payload) into
//! the self-describing bytes stored in the write buffer, the primary log and the secondary
//! logs, and parse them back without trusting a single byte. The byte layout is specified
//! in `docs/log-format.md` (section "Log entry").
//!
//! Invariants:
//! - The type byte is never 0, so a 0 byte where a header would start is the end of data.
//! - The decoder never reads outside the slice it is given and never panics; anything it
//!   cannot accept is a [`DecodeError`].
//! - The stored checksum is CRC32C over the header bytes before it and the payload, XORed
//!   with the generation of the segment (or primary log) holding the entry. Moving an entry
//!   to a place of another generation is a 4-byte XOR ([`rebase_crc`]), and an entry left
//!   over from an older generation of a reused segment never verifies.
//!
//! Callers: the write buffer (encode), the secondary and primary logs (walk and rebase),
//! recovery, reorganization and reopen (decode and verify), the fuzz target.

use crate::error::DecodeError;

/// Largest header: type, chain or run count (2), CID (8), length (4), epoch (2), version
/// (3), CRC (4).
pub const HEADER_BYTES_MAX: usize = 1 + 2 + 8 + 4 + 2 + 3 + 4;
/// Smallest header: type, LID (1), length (1), epoch (2), no version, CRC (4).
pub const HEADER_BYTES_MIN: usize = 1 + 1 + 1 + 2 + 4;
/// The largest version number within an epoch (24 bits).
pub const VERSION_IN_EPOCH_MAX: u32 = (1 << 24) - 1;
/// The most links a chained chunk may have (the link count is one byte).
pub const CHAIN_LINKS_MAX: usize = 255;
/// The most chunks one run entry may hold (the count is two bytes).
pub const RUN_CHUNKS_MAX: usize = u16::MAX as usize;

const KIND_WHOLE: u8 = 1;
const KIND_LINK: u8 = 2;
const KIND_RUN: u8 = 3;
const LID_MASK: u64 = (1 << 48) - 1;

/// Position of one link of a chunk too large for one entry.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChainLink {
    /// 0-based index of this link.
    pub index: u8,
    /// Number of links of the chunk (2..=255).
    pub count: u8,
}

/// The decoded fields of one log entry header.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    /// The chunk's full 64-bit ID.
    pub cid: u64,
    /// Payload length in bytes.
    pub payload_bytes: u32,
    /// Epoch in which the version was assigned.
    pub epoch: u16,
    /// Version within the epoch (24 bits).
    pub version: u32,
    /// Chain position for a link of a large chunk, `None` for a whole chunk.
    pub chain: Option<ChainLink>,
    /// For a *run entry* (only in secondary logs): the number of chunks it holds
    /// (2..=[`RUN_CHUNKS_MAX`]), of consecutive CIDs from `cid` on, each of
    /// `payload_bytes / run` bytes, all with this epoch and version; their payloads follow
    /// the header back to back. 0 for an entry of one chunk or link.
    pub run: u16,
    /// The stored checksum (see the module docs).
    pub crc: u32,
    /// Bytes of the header; the payload starts here.
    pub header_bytes: usize,
}

impl EntryHeader {
    /// Header plus payload bytes.
    pub fn entry_bytes(&self) -> usize {
        self.header_bytes + self.payload_bytes as usize
    }

    /// Offset of the 4-byte checksum within the entry.
    pub fn crc_offset(&self) -> usize {
        self.header_bytes.saturating_sub(4)
    }

    /// Payload bytes of each chunk of a run entry (of the one chunk otherwise).
    pub fn chunk_payload_bytes(&self) -> u32 {
        if self.run >= 2 {
            self.payload_bytes / u32::from(self.run)
        } else {
            self.payload_bytes
        }
    }
}

/// One decoded entry borrowing its payload from the buffer it was decoded from.
#[derive(Copy, Clone, Debug)]
pub struct Entry<'a> {
    /// The header fields.
    pub header: EntryHeader,
    /// The header bytes as stored (needed to recompute the checksum).
    pub header_raw: &'a [u8],
    /// The payload.
    pub payload: &'a [u8],
    /// `Some(i)` for chunk `i` of a run entry, as [`Entry::run_members`] hands them out:
    /// then `header` describes that chunk alone (its CID, payload length, epoch and
    /// version; `run` 0) except `header_bytes` and `crc`, which are the run's, as is
    /// `header_raw`. Such a chunk cannot be verified on its own ([`Entry::verify`] is
    /// false): check the run entry before taking it apart.
    pub run_index: Option<u16>,
}

impl<'a> Entry<'a> {
    /// True if the stored checksum matches the header and payload for `generation`.
    /// One pass, as the append path computes it: the header bytes before the checksum
    /// as two words, then the payload through the CRC32C instruction.
    #[inline]
    pub fn verify(&self, generation: u32) -> bool {
        if self.run_index.is_some() {
            return false;
        }
        let n = self.header.crc_offset();
        let Some(before_crc) = self.header_raw.get(..n) else {
            return false;
        };
        let mut raw = [0u8; 24];
        let Some(head) = raw.get_mut(..n) else {
            return false;
        };
        head.copy_from_slice(before_crc);
        let (lo, hi) = raw.split_at(16);
        let lo = lo.try_into().map_or(0, u128::from_le_bytes);
        let hi = hi.try_into().map_or(0, u64::from_le_bytes);
        crate::crc::crc32c_words(lo, hi, n, self.payload) ^ generation == self.header.crc
    }

    /// The chunks of a run entry, each as its own entry (see [`Entry::run_index`]); an
    /// entry that is not a run yields nothing.
    pub fn run_members(&self) -> impl Iterator<Item = Entry<'a>> + 'a {
        let h = self.header;
        let (header_raw, payload) = (self.header_raw, self.payload);
        let per = h.chunk_payload_bytes() as usize;
        let count = if h.run >= 2 { usize::from(h.run) } else { 0 };
        (0..count).map(move |i| Entry {
            header: EntryHeader {
                cid: h.cid + i as u64,
                payload_bytes: per as u32,
                run: 0,
                ..h
            },
            header_raw,
            payload: payload.get(i * per..(i + 1) * per).unwrap_or(&[]),
            run_index: Some(i as u16),
        })
    }

    /// Bytes this entry takes in its log: header and payload; for chunk `i` of a run its
    /// payload, plus the run's header for chunk 0 (so a run's chunks add up to the run).
    pub fn stored_bytes(&self) -> usize {
        match self.run_index {
            None => self.header.entry_bytes(),
            Some(0) => self.header.entry_bytes(),
            Some(_) => self.header.payload_bytes as usize,
        }
    }
}

const CID_WIDTHS: [usize; 4] = [1, 2, 4, 8];
const LENGTH_WIDTHS: [usize; 4] = [1, 2, 3, 4];
const VERSION_WIDTHS: [usize; 4] = [0, 1, 2, 3];

/// What to encode.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EncodeArgs {
    /// The chunk's full ID.
    pub cid: u64,
    /// The owner of the zone the entry belongs to: a CID created by it is stored by its
    /// local ID only (1, 2 or 4 bytes when it fits), any other CID in full (8 bytes).
    pub zone_owner: u16,
    /// Epoch of the version.
    pub epoch: u16,
    /// Version within the epoch, at most [`VERSION_IN_EPOCH_MAX`].
    pub version: u32,
    /// Chain position, for links of large chunks.
    pub chain: Option<ChainLink>,
}

/// Header bytes [`encode`] will produce for `args` and a payload of `payload_bytes`.
pub fn encoded_header_bytes(args: &EncodeArgs, payload_bytes: usize) -> usize {
    let (_, cid_w) = cid_width(args);
    let (_, len_w) = length_width(payload_bytes as u64);
    let (_, ver_w) = version_width(args.version);
    1 + if args.chain.is_some() { 2 } else { 0 } + cid_w + len_w + 2 + ver_w + 4
}

/// Code and width of the CID field: the local ID in 1, 2 or 4 bytes when the zone's owner
/// created the chunk and it fits, else the full CID (8 bytes).
fn cid_width(args: &EncodeArgs) -> (u8, usize) {
    if (args.cid >> 48) as u16 == args.zone_owner {
        let lid = args.cid & ((1 << 48) - 1);
        if lid < 1 << 8 {
            return (0, 1);
        }
        if lid < 1 << 16 {
            return (1, 2);
        }
        if lid < 1 << 32 {
            return (2, 4);
        }
    }
    (3, 8)
}

/// Code and width of the length field (1 to 4 bytes; callers keep lengths below 2^32).
fn length_width(len: u64) -> (u8, usize) {
    if len < 1 << 8 {
        (0, 1)
    } else if len < 1 << 16 {
        (1, 2)
    } else if len < 1 << 24 {
        (2, 3)
    } else {
        (3, 4)
    }
}

/// Code and width of the version field (0 to 3 bytes; version 0 takes none).
fn version_width(version: u32) -> (u8, usize) {
    if version == 0 {
        (0, 0)
    } else if version < 1 << 8 {
        (1, 1)
    } else if version < 1 << 16 {
        (2, 2)
    } else {
        (3, 3)
    }
}

/// An entry header built in one pass, checksum included, held as little-endian words
/// (bytes 0..16 in `lo`, 16..24 in `hi`; zeros past `len`): built in registers and
/// stored once where it goes, not assembled byte by byte in memory and copied.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BuiltHeader {
    lo: u128,
    hi: u64,
    len: usize,
}

impl BuiltHeader {
    /// Header bytes (type byte first, checksum last).
    #[allow(clippy::len_without_is_empty)] // never empty
    pub fn len(&self) -> usize {
        self.len
    }

    /// The header as words: bytes 0..16 and 16..24, little-endian, zero past `len()`.
    pub fn words(&self) -> (u128, u64) {
        (self.lo, self.hi)
    }

    /// The header bytes in an array; the first `len()` are the header.
    pub fn to_array(&self) -> [u8; HEADER_BYTES_MAX] {
        let mut out = [0u8; HEADER_BYTES_MAX];
        out[..16].copy_from_slice(&self.lo.to_le_bytes());
        out[16..].copy_from_slice(&self.hi.to_le_bytes());
        out
    }
}

/// ORs `value` (its bytes beyond the field's width are zero) into the header words at
/// byte offset `at` (at most 20: a field never ends past byte 24).
#[inline(always)]
fn put(lo: &mut u128, hi: &mut u64, at: usize, value: u64) {
    if at < 16 {
        *lo |= u128::from(value) << (8 * at);
        if at > 8 {
            *hi |= value >> (8 * (16 - at));
        }
    } else {
        *hi |= value << (8 * (at - 16));
    }
}

/// Builds the header of the entry for `args` and `payload`, checksummed for generation 0
/// (the header [`encode`] writes in front of the payload).
///
/// Panics only on caller bugs that no disk content can cause: a version above
/// [`VERSION_IN_EPOCH_MAX`] or a payload of 2^32 bytes or more.
#[inline]
pub fn build_header(args: &EncodeArgs, payload: &[u8]) -> BuiltHeader {
    assert!(u32::try_from(payload.len()).is_ok(), "payload too large");
    let (lo, hi, at) = header_words(args, 0, payload.len() as u64);
    let crc = crate::crc::crc32c_words(lo, hi, at, payload);
    let (mut lo, mut hi) = (lo, hi);
    put(&mut lo, &mut hi, at, u64::from(crc));
    BuiltHeader {
        lo,
        hi,
        len: at + 4,
    }
}

/// The header fields before the checksum as words, and their length: of a link when
/// `args.chain` is set, of a run of `run` chunks when `run` ≥ 2, else of one chunk;
/// `length` is the (per-chunk) payload length.
#[inline(always)]
fn header_words(args: &EncodeArgs, run: u16, length: u64) -> (u128, u64, usize) {
    assert!(args.version <= VERSION_IN_EPOCH_MAX, "version out of range");
    let (cid_code, cid_w) = cid_width(args);
    let (len_code, len_w) = length_width(length);
    let (ver_code, ver_w) = version_width(args.version);
    let kind = if run >= 2 {
        KIND_RUN
    } else if args.chain.is_some() {
        KIND_LINK
    } else {
        KIND_WHOLE
    };
    // Each field's value has zeros above its width (the widths were chosen to hold it), so
    // ORing whole words at the field offsets builds the header.
    let mut lo = u128::from(kind | (cid_code << 2) | (len_code << 4) | (ver_code << 6));
    let mut hi = 0u64;
    let mut at = 1;
    if run >= 2 {
        lo |= u128::from(run) << 8;
        at = 3;
    } else if let Some(link) = args.chain {
        lo |= u128::from(link.index) << 8 | u128::from(link.count) << 16;
        at = 3;
    }
    let cid_field = if cid_w == 8 {
        args.cid
    } else {
        args.cid & LID_MASK
    };
    put(&mut lo, &mut hi, at, cid_field);
    at += cid_w;
    put(&mut lo, &mut hi, at, length);
    at += len_w;
    put(&mut lo, &mut hi, at, u64::from(args.epoch));
    at += 2;
    put(&mut lo, &mut hi, at, u64::from(args.version));
    at += ver_w;
    (lo, hi, at)
}

/// Bytes of a run entry of `count` (2..=[`RUN_CHUNKS_MAX`]) chunks of `chunk_bytes` each,
/// the first described by `args` (no chain): header plus payloads.
pub fn run_entry_bytes(args: &EncodeArgs, count: usize, chunk_bytes: usize) -> usize {
    encoded_header_bytes(args, chunk_bytes) + 2 + count * chunk_bytes
}

/// Writes a run entry into `out`, which must be exactly [`run_entry_bytes`] long: the
/// header for `count` chunks of `chunk_bytes` from `args.cid` on (same epoch and version,
/// no chain), then calls `payloads` with the payload area (`count × chunk_bytes` bytes) to
/// fill, then stores the checksum (header and payloads) for `generation`.
///
/// Panics only on caller bugs: a count outside 2..=[`RUN_CHUNKS_MAX`], a chained `args`,
/// a wrong `out` length, CIDs leaving the creator's local IDs, a version above
/// [`VERSION_IN_EPOCH_MAX`].
pub fn write_run(
    out: &mut [u8],
    args: &EncodeArgs,
    count: usize,
    chunk_bytes: usize,
    generation: u32,
    payloads: impl FnOnce(&mut [u8]),
) {
    assert!(
        (2..=RUN_CHUNKS_MAX).contains(&count),
        "run count out of range"
    );
    assert!(args.chain.is_none(), "a run holds whole chunks");
    assert!(
        (args.cid & LID_MASK) + count as u64 - 1 <= LID_MASK,
        "run leaves the creator's local IDs"
    );
    let (lo, hi, at) = header_words(args, count as u16, chunk_bytes as u64);
    assert_eq!(out.len(), at + 4 + count * chunk_bytes, "run entry size");
    let (lo_bytes, hi_bytes) = (lo.to_le_bytes(), hi.to_le_bytes());
    let mut head = [0u8; 24];
    head[..16].copy_from_slice(&lo_bytes);
    head[16..].copy_from_slice(&hi_bytes);
    out[..at].copy_from_slice(&head[..at]);
    let (header, payload) = out.split_at_mut(at + 4);
    payloads(payload);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head[..at]), payload) ^ generation;
    header[at..].copy_from_slice(&crc.to_le_bytes());
}

/// Appends the entry (header and payload) to `out`, checksummed for generation 0.
///
/// Panics only on caller bugs that no disk content can cause: a version above
/// [`VERSION_IN_EPOCH_MAX`] or a payload of 2^32 bytes or more.
pub fn encode(args: &EncodeArgs, payload: &[u8], out: &mut Vec<u8>) {
    let h = build_header(args, payload);
    out.reserve(h.len + payload.len());
    out.extend_from_slice(&h.to_array()[..h.len]);
    out.extend_from_slice(payload);
}

fn read_le(bytes: &[u8], at: usize, width: usize) -> Result<u64, DecodeError> {
    let field = bytes
        .get(at..at + width)
        .ok_or(DecodeError::Truncated { needed: at + width })?;
    let mut raw = [0u8; 8];
    raw[..width].copy_from_slice(field);
    Ok(u64::from_le_bytes(raw))
}

/// Decodes the header at the start of `bytes` only (the payload may be cut off).
///
/// `zone_owner` completes short CIDs; `payload_bytes_max` bounds the length field.
#[inline]
pub fn decode_header(
    bytes: &[u8],
    zone_owner: u16,
    payload_bytes_max: u32,
) -> Result<EntryHeader, DecodeError> {
    match bytes.first_chunk::<HEADER_BYTES_MAX>() {
        Some(raw) => decode_header_whole(raw, zone_owner, payload_bytes_max),
        None => decode_header_checked(bytes, zone_owner, payload_bytes_max),
    }
}

/// The type byte's parts: kind (whole or link) and the widths of the CID, length and
/// version fields. 0 is the end of the data; other kinds are refused.
#[inline]
fn parse_type(type_byte: u8) -> Result<(u8, usize, usize, usize), DecodeError> {
    if type_byte == 0 {
        return Err(DecodeError::EndOfData);
    }
    // Every kind but 0 is valid: 1 whole chunk, 2 link of a chained chunk, 3 run.
    let kind = type_byte & 0b11;
    Ok((
        kind,
        CID_WIDTHS[usize::from((type_byte >> 2) & 0b11)],
        LENGTH_WIDTHS[usize::from((type_byte >> 4) & 0b11)],
        VERSION_WIDTHS[usize::from(type_byte >> 6)],
    ))
}

/// [`decode_header`] where the largest header fits in what is there (every entry but
/// the last few bytes of a buffer): the fields are read as whole words from a copy with
/// slack and masked to their widths, with no length check per field. Same results as
/// [`decode_header_checked`] (tested on arbitrary bytes).
#[inline]
fn decode_header_whole(
    raw: &[u8; HEADER_BYTES_MAX],
    zone_owner: u16,
    payload_bytes_max: u32,
) -> Result<EntryHeader, DecodeError> {
    // The largest header plus 8 bytes of slack: a word read at any field offset of a
    // valid header stays inside.
    let mut h = [0u8; HEADER_BYTES_MAX + 8];
    h[..HEADER_BYTES_MAX].copy_from_slice(raw);
    decode_fields(raw[0], zone_owner, payload_bytes_max, |at, width| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&h[at..at + 8]);
        let value = u64::from_le_bytes(w);
        Ok(if width >= 8 {
            value
        } else {
            value & ((1u64 << (8 * width)) - 1)
        })
    })
}

/// [`decode_header`] for any length: every field's bytes are checked to be there.
fn decode_header_checked(
    bytes: &[u8],
    zone_owner: u16,
    payload_bytes_max: u32,
) -> Result<EntryHeader, DecodeError> {
    let type_byte = *bytes.first().ok_or(DecodeError::Truncated { needed: 1 })?;
    decode_fields(type_byte, zone_owner, payload_bytes_max, |at, width| {
        read_le(bytes, at, width)
    })
}

/// The header's fields after its type byte, in order, each read by `read(offset, width)`
/// (both decoders share this walk and differ only in how they read).
#[inline(always)]
fn decode_fields(
    type_byte: u8,
    zone_owner: u16,
    payload_bytes_max: u32,
    mut read: impl FnMut(usize, usize) -> Result<u64, DecodeError>,
) -> Result<EntryHeader, DecodeError> {
    let (kind, cid_w, len_w, ver_w) = parse_type(type_byte)?;
    let mut at = 1;
    let chain = if kind == KIND_LINK {
        let index = read(at, 1)? as u8;
        let count = read(at + 1, 1)? as u8;
        at += 2;
        if count < 2 || index >= count {
            return Err(DecodeError::BadChain { index, count });
        }
        Some(ChainLink { index, count })
    } else {
        None
    };
    let run = if kind == KIND_RUN {
        let count = read(at, 2)? as u16;
        at += 2;
        count
    } else {
        0
    };
    let cid_field = read(at, cid_w)?;
    at += cid_w;
    let cid = if cid_w == 8 {
        cid_field
    } else {
        (u64::from(zone_owner) << 48) | cid_field
    };
    let chunk_bytes = read(at, len_w)?;
    at += len_w;
    // A run holds `run` chunks of this length: the total is bounded like one entry's
    // payload, and its CIDs stay within the creator's local IDs.
    let payload_bytes = chunk_bytes.saturating_mul(u64::from(run.max(1)));
    if kind == KIND_RUN && (run < 2 || (cid & LID_MASK) + u64::from(run) - 1 > LID_MASK) {
        return Err(DecodeError::BadRun { count: run });
    }
    if payload_bytes > u64::from(payload_bytes_max) {
        return Err(DecodeError::TooLong {
            payload_bytes,
            max: payload_bytes_max,
        });
    }
    let epoch = read(at, 2)? as u16;
    at += 2;
    let version = read(at, ver_w)? as u32;
    at += ver_w;
    let crc = read(at, 4)? as u32;
    at += 4;
    Ok(EntryHeader {
        cid,
        payload_bytes: payload_bytes as u32,
        epoch,
        version,
        chain,
        run,
        crc,
        header_bytes: at,
    })
}

/// Decodes the whole entry at the start of `bytes` (header and payload must be there).
pub fn decode(
    bytes: &[u8],
    zone_owner: u16,
    payload_bytes_max: u32,
) -> Result<Entry<'_>, DecodeError> {
    let header = decode_header(bytes, zone_owner, payload_bytes_max)?;
    let end = header.entry_bytes();
    let payload = bytes
        .get(header.header_bytes..end)
        .ok_or(DecodeError::Truncated { needed: end })?;
    let header_raw = bytes
        .get(..header.header_bytes)
        .ok_or(DecodeError::Truncated { needed: end })?;
    Ok(Entry {
        header,
        header_raw,
        payload,
        run_index: None,
    })
}

/// Re-targets the checksum of the entry at the start of `entry` from generation `from` to
/// generation `to` (XOR of the stored CRC field).
pub fn rebase_crc(entry: &mut [u8], header: &EntryHeader, from: u32, to: u32) {
    let at = header.crc_offset();
    if let Some(field) = entry.get_mut(at..at + 4) {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(field);
        let crc = u32::from_le_bytes(raw) ^ from ^ to;
        field.copy_from_slice(&crc.to_le_bytes());
    }
}

#[cfg(test)]
#[path = "header_tests.rs"]
mod tests;
