//! Chunk access served by peers: requests, replies and their encodings.
//!
//! # Job
//! One message type ([`crate::types::CHUNK`]) carries every chunk operation: a
//! [`ChunkRequest`] starts with an op tag byte, the peer answers with a [`ChunkReply`]. Every
//! data operation is a batch (a single get is a batch of one: tag, a one-byte count and
//! the 8-byte CID, 10 bytes in all); per-item outcomes are [`ItemStatus`] values so one bad
//! CID does not fail its neighbours.
//!
//! # Format
//! All integers are the codec's: CIDs and node IDs fixed-width little-endian (`u64`,
//! `u16`), counts, sizes, offsets and lengths LEB128 varints, payloads length-prefixed
//! byte slices. Request layouts after the tag byte (`d` = durability byte):
//!
//! | tag | op             | fields                                          |
//! |-----|----------------|-------------------------------------------------|
//! | 1   | Create         | d, count, size × count                          |
//! | 2   | CreateWithData | d, count, bytes × count                         |
//! | 3   | Get            | count, cid × count                              |
//! | 4   | Put            | d, count, (cid, bytes) × count                  |
//! | 5   | Remove         | d, count, cid × count                           |
//! | 6   | Insert         | d, count, (cid, bytes) × count                  |
//! | 7   | ReadAt         | cid, offset, len                                |
//! | 8   | WriteAt        | d, cid, offset, bytes                           |
//! | 9   | Resize         | d, cid, size                                    |
//! | 10  | Lock           | cid, write (0/1), timeout_ms                    |
//! | 11  | Unlock         | cid, write (0/1)                                |
//! | 12  | Status         | count, cid × count                              |
//! | 13  | List           | has_creator (0/1), [creator u16], max           |
//! | 14  | Stats          | (nothing)                                       |
//!
//! Replies start with their own tag (see [`ChunkReply`]); an item status is a tag byte
//! (0 = ok) followed, for `Invalid`/`Internal`, by a UTF-8 text of at most
//! [`STATUS_TEXT_BYTES_MAX`] bytes. A data item is status tag 0 plus the bytes, or an
//! error status.
//!
//! # Invariants
//! - Decoding never panics; counts are checked against [`crate::limits`] and against the
//!   bytes left (every item takes at least one byte) before anything is allocated.
//! - Payloads decoded from a message share its buffer ([`Bytes`] slices, no copy).
//! - Encoding then decoding gives back an equal value (proptest in this module).
//!
//! # Who calls it
//! `myriad-client::chunk` encodes requests and decodes replies; `myriad-node::peer`
//! decodes requests and encodes replies (for gets straight from the memory manager with
//! [`DataReplyWriter`]).

use bytes::Bytes;
use myriad_types::codec::{Decoder, Encoder};

use crate::limits::{BATCH_ITEMS_MAX, CHUNK_BYTES_MAX};
use crate::{get_count, ChunkId, NodeId, ProtoError};

/// Longest text an `Invalid`/`Internal` status carries (longer text is cut on encoding).
pub const STATUS_TEXT_BYTES_MAX: usize = 4096;
/// Most CID ranges one `List` reply carries.
pub const LIST_RANGES_MAX: usize = BATCH_ITEMS_MAX;
/// The largest durability level ([`DURABILITY_DURABLE`]).
pub const DURABILITY_MAX: u8 = 3;
/// Durability: the cluster's default.
pub const DURABILITY_DEFAULT: u8 = 0;
/// Durability: acknowledged once stored in the owner's memory; backups follow.
pub const DURABILITY_ASYNC: u8 = 1;
/// Durability: acknowledged once the backups hold it in memory.
pub const DURABILITY_REPLICATED: u8 = 2;
/// Durability: acknowledged once the backups wrote it to disk.
pub const DURABILITY_DURABLE: u8 = 3;

/// A request to a peer. Every variant that changes chunks carries a `durability` level
/// (0 = cluster default, 1 async, 2 replicated, 3 durable, see the `DURABILITY_*`
/// constants) for the backup layer; peers without backups ignore it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkRequest {
    /// Create zeroed chunks of these sizes on the receiving peer (IDs of its own creator
    /// space). All or nothing.
    Create {
        /// Durability level.
        durability: u8,
        /// Size of each new chunk in bytes.
        sizes: Vec<u64>,
    },
    /// Create chunks holding these payloads on the receiving peer. All or nothing.
    CreateWithData {
        /// Durability level.
        durability: u8,
        /// One payload per new chunk.
        payloads: Vec<Bytes>,
    },
    /// Read whole chunks.
    Get {
        /// The chunks.
        cids: Vec<ChunkId>,
    },
    /// Replace whole chunks (each payload must have the chunk's size).
    Put {
        /// Durability level.
        durability: u8,
        /// `(cid, new bytes)` per chunk.
        items: Vec<(ChunkId, Bytes)>,
    },
    /// Remove chunks.
    Remove {
        /// Durability level.
        durability: u8,
        /// The chunks.
        cids: Vec<ChunkId>,
    },
    /// Store chunks under given IDs, typically another creator's (migration, recovery).
    Insert {
        /// Durability level.
        durability: u8,
        /// `(cid, bytes)` per chunk.
        items: Vec<(ChunkId, Bytes)>,
    },
    /// Read `len` bytes at `offset` of one chunk.
    ReadAt {
        /// The chunk.
        cid: ChunkId,
        /// First byte.
        offset: u64,
        /// Bytes to read (at most [`CHUNK_BYTES_MAX`]).
        len: u64,
    },
    /// Overwrite bytes at `offset` of one chunk.
    WriteAt {
        /// Durability level.
        durability: u8,
        /// The chunk.
        cid: ChunkId,
        /// First byte.
        offset: u64,
        /// The new bytes.
        data: Bytes,
    },
    /// Change a chunk's size (keeping the common prefix, zero-filling growth).
    Resize {
        /// Durability level.
        durability: u8,
        /// The chunk.
        cid: ChunkId,
        /// New size in bytes.
        size: u64,
    },
    /// Take a chunk's read or write lock for the sender, waiting at most `timeout_ms`.
    Lock {
        /// The chunk.
        cid: ChunkId,
        /// Write (exclusive) lock, else read (shared).
        write: bool,
        /// Longest wait in milliseconds (0: try once).
        timeout_ms: u64,
    },
    /// Release a lock the sender holds.
    Unlock {
        /// The chunk.
        cid: ChunkId,
        /// The write lock, else a read lock.
        write: bool,
    },
    /// Sizes of chunks.
    Status {
        /// The chunks.
        cids: Vec<ChunkId>,
    },
    /// The CID ranges of live chunks the peer holds (for chunk lists).
    List {
        /// Only chunks of this creator; all creators if `None`.
        creator: Option<NodeId>,
        /// Most ranges to answer with (the reply says if there were more).
        max: u64,
    },
    /// A summary of the peer's memory.
    Stats,
}

/// Why one item of a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemError {
    /// The peer owns the chunk's ID but holds no such chunk (never created or removed).
    NotFound,
    /// The peer does not own this CID (migrated or recovered elsewhere): refresh the
    /// lookup and ask the owner.
    NotOwner,
    /// Larger than the peer allows for one chunk.
    TooLarge,
    /// The peer has no memory left for it.
    OutOfMemory,
    /// The chunk's lock was not granted in time.
    LockTimeout,
    /// The request item is invalid (bad offset, size mismatch, unlock of a lock not held…).
    Invalid(String),
    /// The peer failed for a reason of its own.
    Internal(String),
}

impl std::fmt::Display for ItemError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ItemError::NotFound => write!(f, "not found"),
            ItemError::NotOwner => write!(f, "not the owner"),
            ItemError::TooLarge => write!(f, "too large"),
            ItemError::OutOfMemory => write!(f, "out of memory"),
            ItemError::LockTimeout => write!(f, "lock timeout"),
            ItemError::Invalid(text) => write!(f, "invalid: {text}"),
            ItemError::Internal(text) => write!(f, "internal error: {text}"),
        }
    }
}

/// The outcome of one item: `Ok(())` or why it failed.
pub type ItemStatus = Result<(), ItemError>;

/// The memory summary of a peer ([`ChunkRequest::Stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkStats {
    /// Live chunks.
    pub chunks: u64,
    /// Their payload bytes.
    pub payload_bytes: u64,
    /// Bytes of the data region in use (payload, slack and allocator metadata).
    pub used_bytes: u64,
    /// Free bytes of the data region.
    pub free_bytes: u64,
    /// Size of the data region.
    pub region_bytes: u64,
    /// Chunks restored here by a recovery that are not yet handed to this peer's own
    /// replication (re-replication still running when nonzero).
    pub rereplication_pending: u64,
    /// Remote chunk requests the peer served since it started (every type and result):
    /// two readings apart give its request rate (the superpeers' status page plots it).
    pub requests_served: u64,
}

/// A peer's answer to a [`ChunkRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkReply {
    /// `Create`/`CreateWithData`: the new CIDs, in request order (tag 1).
    Created(Vec<ChunkId>),
    /// `Get`/`ReadAt`: per item the bytes or why not (tag 2).
    Data(Vec<Result<Bytes, ItemError>>),
    /// `Put`/`Remove`/`Insert`/`WriteAt`/`Resize`/`Lock`/`Unlock`: per item status (tag 3).
    Statuses(Vec<ItemStatus>),
    /// `Status`: per item the size in bytes or why not (tag 4).
    Sizes(Vec<Result<u64, ItemError>>),
    /// `List`: inclusive CID ranges in CID order, and whether more were left out (tag 5).
    Ranges {
        /// The ranges.
        ranges: Vec<(ChunkId, ChunkId)>,
        /// More ranges exist than `max` allowed.
        truncated: bool,
    },
    /// `Stats` (tag 6).
    Stats(ChunkStats),
    /// The whole operation failed (e.g. a create batch did not fit: all or nothing) (tag 7).
    Failed(ItemError),
    /// The request could not be decoded; nothing was done (tag 8).
    Malformed(String),
}

mod tag {
    pub const CREATE: u8 = 1;
    pub const CREATE_WITH_DATA: u8 = 2;
    pub const GET: u8 = 3;
    pub const PUT: u8 = 4;
    pub const REMOVE: u8 = 5;
    pub const INSERT: u8 = 6;
    pub const READ_AT: u8 = 7;
    pub const WRITE_AT: u8 = 8;
    pub const RESIZE: u8 = 9;
    pub const LOCK: u8 = 10;
    pub const UNLOCK: u8 = 11;
    pub const STATUS: u8 = 12;
    pub const LIST: u8 = 13;
    pub const STATS: u8 = 14;

    pub const REPLY_CREATED: u8 = 1;
    pub const REPLY_DATA: u8 = 2;
    pub const REPLY_STATUSES: u8 = 3;
    pub const REPLY_SIZES: u8 = 4;
    pub const REPLY_RANGES: u8 = 5;
    pub const REPLY_STATS: u8 = 6;
    pub const REPLY_FAILED: u8 = 7;
    pub const REPLY_MALFORMED: u8 = 8;

    pub const OK: u8 = 0;
    pub const NOT_FOUND: u8 = 1;
    pub const NOT_OWNER: u8 = 2;
    pub const TOO_LARGE: u8 = 3;
    pub const OUT_OF_MEMORY: u8 = 4;
    pub const LOCK_TIMEOUT: u8 = 5;
    pub const INVALID: u8 = 6;
    pub const INTERNAL: u8 = 7;
}

// ----- encoding helpers ------------------------------------------------------------------

fn put_count(encoder: &mut Encoder, count: usize) {
    encoder.put_varint(count as u64);
}

fn put_text(encoder: &mut Encoder, text: &str) {
    let mut end = text.len().min(STATUS_TEXT_BYTES_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    encoder.put_str(&text[..end]);
}

fn put_error(encoder: &mut Encoder, error: &ItemError) {
    match error {
        ItemError::NotFound => {
            encoder.put_u8(tag::NOT_FOUND);
        }
        ItemError::NotOwner => {
            encoder.put_u8(tag::NOT_OWNER);
        }
        ItemError::TooLarge => {
            encoder.put_u8(tag::TOO_LARGE);
        }
        ItemError::OutOfMemory => {
            encoder.put_u8(tag::OUT_OF_MEMORY);
        }
        ItemError::LockTimeout => {
            encoder.put_u8(tag::LOCK_TIMEOUT);
        }
        ItemError::Invalid(text) => {
            encoder.put_u8(tag::INVALID);
            put_text(encoder, text);
        }
        ItemError::Internal(text) => {
            encoder.put_u8(tag::INTERNAL);
            put_text(encoder, text);
        }
    }
}

fn put_status(encoder: &mut Encoder, status: &ItemStatus) {
    match status {
        Ok(()) => {
            encoder.put_u8(tag::OK);
        }
        Err(error) => put_error(encoder, error),
    }
}

fn put_items(encoder: &mut Encoder, items: &[(ChunkId, Bytes)]) {
    put_count(encoder, items.len());
    for (cid, data) in items {
        encoder.put_u64_le(cid.raw()).put_bytes(data);
    }
}

fn put_cids(encoder: &mut Encoder, cids: &[ChunkId]) {
    put_count(encoder, cids.len());
    for cid in cids {
        encoder.put_u64_le(cid.raw());
    }
}

// ----- decoding helpers ------------------------------------------------------------------

fn get_cid(decoder: &mut Decoder) -> Result<ChunkId, ProtoError> {
    Ok(ChunkId::from_raw(decoder.get_u64_le("CID")?))
}

fn get_bool(decoder: &mut Decoder, what: &'static str) -> Result<bool, ProtoError> {
    match decoder.get_u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(ProtoError::Invalid {
            what,
            detail: format!("{other} is not 0 or 1"),
        }),
    }
}

fn get_durability(decoder: &mut Decoder) -> Result<u8, ProtoError> {
    let durability = decoder.get_u8("durability")?;
    if durability > DURABILITY_MAX {
        return Err(ProtoError::Invalid {
            what: "durability",
            detail: format!("{durability} is above {DURABILITY_MAX}"),
        });
    }
    Ok(durability)
}

fn get_payload(decoder: &mut Decoder) -> Result<Bytes, ProtoError> {
    let data = decoder.get_bytes("chunk payload")?;
    if data.len() > CHUNK_BYTES_MAX {
        return Err(ProtoError::TooLarge {
            what: "chunk payload",
            value: data.len() as u64,
            max: CHUNK_BYTES_MAX as u64,
        });
    }
    Ok(data)
}

fn get_text(decoder: &mut Decoder) -> Result<String, ProtoError> {
    let text = decoder.get_str("status text", usize::MAX)?;
    if text.len() > STATUS_TEXT_BYTES_MAX {
        return Err(ProtoError::TooLarge {
            what: "status text",
            value: text.len() as u64,
            max: STATUS_TEXT_BYTES_MAX as u64,
        });
    }
    Ok(text.to_owned())
}

fn get_cids(decoder: &mut Decoder) -> Result<Vec<ChunkId>, ProtoError> {
    let count = get_count(decoder, "CID count", BATCH_ITEMS_MAX, 8)?;
    let mut cids = Vec::with_capacity(count);
    for _ in 0..count {
        cids.push(get_cid(decoder)?);
    }
    Ok(cids)
}

fn get_items(decoder: &mut Decoder) -> Result<Vec<(ChunkId, Bytes)>, ProtoError> {
    let count = get_count(decoder, "item count", BATCH_ITEMS_MAX, 9)?;
    let mut items = Vec::with_capacity(count);
    for _ in 0..count {
        let cid = get_cid(decoder)?;
        items.push((cid, get_payload(decoder)?));
    }
    Ok(items)
}

/// The error of a status whose tag byte was already read (tag ≠ 0).
fn get_error_after_tag(decoder: &mut Decoder, status_tag: u8) -> Result<ItemError, ProtoError> {
    Ok(match status_tag {
        tag::NOT_FOUND => ItemError::NotFound,
        tag::NOT_OWNER => ItemError::NotOwner,
        tag::TOO_LARGE => ItemError::TooLarge,
        tag::OUT_OF_MEMORY => ItemError::OutOfMemory,
        tag::LOCK_TIMEOUT => ItemError::LockTimeout,
        tag::INVALID => ItemError::Invalid(get_text(decoder)?),
        tag::INTERNAL => ItemError::Internal(get_text(decoder)?),
        other => {
            return Err(ProtoError::UnknownTag {
                what: "item status",
                tag: other,
            })
        }
    })
}

fn get_status(decoder: &mut Decoder) -> Result<ItemStatus, ProtoError> {
    match decoder.get_u8("item status")? {
        tag::OK => Ok(Ok(())),
        other => Ok(Err(get_error_after_tag(decoder, other)?)),
    }
}

fn get_error(decoder: &mut Decoder) -> Result<ItemError, ProtoError> {
    match get_status(decoder)? {
        Ok(()) => Err(ProtoError::Invalid {
            what: "failure reply",
            detail: "status is ok".into(),
        }),
        Err(error) => Ok(error),
    }
}

fn to_usize_bounded(value: u64, what: &'static str, max: usize) -> Result<u64, ProtoError> {
    if value > max as u64 {
        return Err(ProtoError::TooLarge {
            what,
            value,
            max: max as u64,
        });
    }
    Ok(value)
}

// ----- requests ----------------------------------------------------------------------------

impl ChunkRequest {
    /// A get of one chunk.
    pub fn get_one(cid: ChunkId) -> ChunkRequest {
        ChunkRequest::Get { cids: vec![cid] }
    }

    /// A short name of the operation (for logs and errors).
    pub fn op_name(&self) -> &'static str {
        match self {
            ChunkRequest::Create { .. } => "create",
            ChunkRequest::CreateWithData { .. } => "create with data",
            ChunkRequest::Get { .. } => "get",
            ChunkRequest::Put { .. } => "put",
            ChunkRequest::Remove { .. } => "remove",
            ChunkRequest::Insert { .. } => "insert",
            ChunkRequest::ReadAt { .. } => "read at",
            ChunkRequest::WriteAt { .. } => "write at",
            ChunkRequest::Resize { .. } => "resize",
            ChunkRequest::Lock { .. } => "lock",
            ChunkRequest::Unlock { .. } => "unlock",
            ChunkRequest::Status { .. } => "status",
            ChunkRequest::List { .. } => "list",
            ChunkRequest::Stats => "stats",
        }
    }

    /// The encoding (see the module documentation).
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::with_capacity(self.encoded_len_hint());
        match self {
            ChunkRequest::Create { durability, sizes } => {
                encoder.put_u8(tag::CREATE).put_u8(*durability);
                put_count(&mut encoder, sizes.len());
                for &size in sizes {
                    encoder.put_varint(size);
                }
            }
            ChunkRequest::CreateWithData {
                durability,
                payloads,
            } => {
                encoder.put_u8(tag::CREATE_WITH_DATA).put_u8(*durability);
                put_count(&mut encoder, payloads.len());
                for payload in payloads {
                    encoder.put_bytes(payload);
                }
            }
            ChunkRequest::Get { cids } => {
                encoder.put_u8(tag::GET);
                put_cids(&mut encoder, cids);
            }
            ChunkRequest::Put { durability, items } => {
                encoder.put_u8(tag::PUT).put_u8(*durability);
                put_items(&mut encoder, items);
            }
            ChunkRequest::Remove { durability, cids } => {
                encoder.put_u8(tag::REMOVE).put_u8(*durability);
                put_cids(&mut encoder, cids);
            }
            ChunkRequest::Insert { durability, items } => {
                encoder.put_u8(tag::INSERT).put_u8(*durability);
                put_items(&mut encoder, items);
            }
            ChunkRequest::ReadAt { cid, offset, len } => {
                encoder
                    .put_u8(tag::READ_AT)
                    .put_u64_le(cid.raw())
                    .put_varint(*offset)
                    .put_varint(*len);
            }
            ChunkRequest::WriteAt {
                durability,
                cid,
                offset,
                data,
            } => {
                encoder
                    .put_u8(tag::WRITE_AT)
                    .put_u8(*durability)
                    .put_u64_le(cid.raw())
                    .put_varint(*offset)
                    .put_bytes(data);
            }
            ChunkRequest::Resize {
                durability,
                cid,
                size,
            } => {
                encoder
                    .put_u8(tag::RESIZE)
                    .put_u8(*durability)
                    .put_u64_le(cid.raw())
                    .put_varint(*size);
            }
            ChunkRequest::Lock {
                cid,
                write,
                timeout_ms,
            } => {
                encoder
                    .put_u8(tag::LOCK)
                    .put_u64_le(cid.raw())
                    .put_u8(u8::from(*write))
                    .put_varint(*timeout_ms);
            }
            ChunkRequest::Unlock { cid, write } => {
                encoder
                    .put_u8(tag::UNLOCK)
                    .put_u64_le(cid.raw())
                    .put_u8(u8::from(*write));
            }
            ChunkRequest::Status { cids } => {
                encoder.put_u8(tag::STATUS);
                put_cids(&mut encoder, cids);
            }
            ChunkRequest::List { creator, max } => {
                encoder.put_u8(tag::LIST);
                match creator {
                    Some(node) => encoder.put_u8(1).put_u16_le(node.0),
                    None => encoder.put_u8(0),
                };
                encoder.put_varint(*max);
            }
            ChunkRequest::Stats => {
                encoder.put_u8(tag::STATS);
            }
        }
        encoder.finish()
    }

    fn encoded_len_hint(&self) -> usize {
        let items = |items: &[(ChunkId, Bytes)]| {
            items
                .iter()
                .map(|(_, data)| 8 + 5 + data.len())
                .sum::<usize>()
        };
        16 + match self {
            ChunkRequest::Create { sizes, .. } => sizes.len() * 5,
            ChunkRequest::CreateWithData { payloads, .. } => {
                payloads.iter().map(|p| 5 + p.len()).sum()
            }
            ChunkRequest::Get { cids }
            | ChunkRequest::Remove { cids, .. }
            | ChunkRequest::Status { cids } => cids.len() * 8,
            ChunkRequest::Put { items: list, .. } | ChunkRequest::Insert { items: list, .. } => {
                items(list)
            }
            ChunkRequest::WriteAt { data, .. } => 16 + data.len(),
            _ => 24,
        }
    }

    /// Decodes a request; the payloads it holds share `payload`'s buffer.
    pub fn decode(payload: Bytes) -> Result<ChunkRequest, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let request = match decoder.get_u8("chunk request tag")? {
            tag::CREATE => {
                let durability = get_durability(&mut decoder)?;
                let count = get_count(&mut decoder, "size count", BATCH_ITEMS_MAX, 1)?;
                let mut sizes = Vec::with_capacity(count);
                for _ in 0..count {
                    sizes.push(decoder.get_varint("size")?);
                }
                ChunkRequest::Create { durability, sizes }
            }
            tag::CREATE_WITH_DATA => {
                let durability = get_durability(&mut decoder)?;
                let count = get_count(&mut decoder, "payload count", BATCH_ITEMS_MAX, 1)?;
                let mut payloads = Vec::with_capacity(count);
                for _ in 0..count {
                    payloads.push(get_payload(&mut decoder)?);
                }
                ChunkRequest::CreateWithData {
                    durability,
                    payloads,
                }
            }
            tag::GET => ChunkRequest::Get {
                cids: get_cids(&mut decoder)?,
            },
            tag::PUT => {
                let durability = get_durability(&mut decoder)?;
                ChunkRequest::Put {
                    durability,
                    items: get_items(&mut decoder)?,
                }
            }
            tag::REMOVE => {
                let durability = get_durability(&mut decoder)?;
                ChunkRequest::Remove {
                    durability,
                    cids: get_cids(&mut decoder)?,
                }
            }
            tag::INSERT => {
                let durability = get_durability(&mut decoder)?;
                ChunkRequest::Insert {
                    durability,
                    items: get_items(&mut decoder)?,
                }
            }
            tag::READ_AT => {
                let cid = get_cid(&mut decoder)?;
                let offset = decoder.get_varint("offset")?;
                let len = to_usize_bounded(
                    decoder.get_varint("read length")?,
                    "read length",
                    CHUNK_BYTES_MAX,
                )?;
                ChunkRequest::ReadAt { cid, offset, len }
            }
            tag::WRITE_AT => {
                let durability = get_durability(&mut decoder)?;
                let cid = get_cid(&mut decoder)?;
                let offset = decoder.get_varint("offset")?;
                ChunkRequest::WriteAt {
                    durability,
                    cid,
                    offset,
                    data: get_payload(&mut decoder)?,
                }
            }
            tag::RESIZE => {
                let durability = get_durability(&mut decoder)?;
                let cid = get_cid(&mut decoder)?;
                ChunkRequest::Resize {
                    durability,
                    cid,
                    size: decoder.get_varint("size")?,
                }
            }
            tag::LOCK => {
                let cid = get_cid(&mut decoder)?;
                let write = get_bool(&mut decoder, "lock mode")?;
                ChunkRequest::Lock {
                    cid,
                    write,
                    timeout_ms: decoder.get_varint("lock timeout")?,
                }
            }
            tag::UNLOCK => {
                let cid = get_cid(&mut decoder)?;
                ChunkRequest::Unlock {
                    cid,
                    write: get_bool(&mut decoder, "lock mode")?,
                }
            }
            tag::STATUS => ChunkRequest::Status {
                cids: get_cids(&mut decoder)?,
            },
            tag::LIST => {
                let creator = match get_bool(&mut decoder, "creator flag")? {
                    true => Some(NodeId(decoder.get_u16_le("creator")?)),
                    false => None,
                };
                ChunkRequest::List {
                    creator,
                    max: decoder.get_varint("list max")?,
                }
            }
            tag::STATS => ChunkRequest::Stats,
            other => {
                return Err(ProtoError::UnknownTag {
                    what: "chunk request",
                    tag: other,
                })
            }
        };
        decoder.finish()?;
        Ok(request)
    }
}

// ----- replies -----------------------------------------------------------------------------

/// Encodes a [`ChunkReply::Data`] item by item, so a peer can copy chunk bytes straight
/// from its memory into the reply (one copy, no intermediate buffers).
#[derive(Debug)]
pub struct DataReplyWriter {
    encoder: Encoder,
}

impl DataReplyWriter {
    /// A writer for `count` items with room for about `bytes_hint` payload bytes. The
    /// caller must push exactly `count` items.
    pub fn new(count: usize, bytes_hint: usize) -> DataReplyWriter {
        let mut encoder = Encoder::with_capacity(8 + count * 3 + bytes_hint);
        encoder.put_u8(tag::REPLY_DATA);
        put_count(&mut encoder, count);
        DataReplyWriter { encoder }
    }

    /// Appends an item holding `data`.
    pub fn push_data(&mut self, data: &[u8]) {
        self.encoder.put_u8(tag::OK).put_bytes(data);
    }

    /// Appends a failed item.
    pub fn push_error(&mut self, error: &ItemError) {
        put_error(&mut self.encoder, error);
    }

    /// The encoded reply.
    pub fn finish(self) -> Bytes {
        self.encoder.finish()
    }
}

impl ChunkReply {
    /// The encoding (see the module documentation).
    pub fn encode(&self) -> Bytes {
        match self {
            ChunkReply::Data(items) => {
                let bytes = items
                    .iter()
                    .map(|item| item.as_ref().map_or(0, |data| data.len()))
                    .sum();
                let mut writer = DataReplyWriter::new(items.len(), bytes);
                for item in items {
                    match item {
                        Ok(data) => writer.push_data(data),
                        Err(error) => writer.push_error(error),
                    }
                }
                writer.finish()
            }
            ChunkReply::Created(cids) => {
                let mut encoder = Encoder::with_capacity(8 + cids.len() * 8);
                encoder.put_u8(tag::REPLY_CREATED);
                put_cids(&mut encoder, cids);
                encoder.finish()
            }
            ChunkReply::Statuses(statuses) => {
                let mut encoder = Encoder::with_capacity(8 + statuses.len());
                encoder.put_u8(tag::REPLY_STATUSES);
                put_count(&mut encoder, statuses.len());
                for status in statuses {
                    put_status(&mut encoder, status);
                }
                encoder.finish()
            }
            ChunkReply::Sizes(sizes) => {
                let mut encoder = Encoder::with_capacity(8 + sizes.len() * 4);
                encoder.put_u8(tag::REPLY_SIZES);
                put_count(&mut encoder, sizes.len());
                for size in sizes {
                    match size {
                        Ok(size) => {
                            encoder.put_u8(tag::OK).put_varint(*size);
                        }
                        Err(error) => put_error(&mut encoder, error),
                    }
                }
                encoder.finish()
            }
            ChunkReply::Ranges { ranges, truncated } => {
                let mut encoder = Encoder::with_capacity(8 + ranges.len() * 16);
                encoder
                    .put_u8(tag::REPLY_RANGES)
                    .put_u8(u8::from(*truncated));
                put_count(&mut encoder, ranges.len());
                for (first, last) in ranges {
                    encoder.put_u64_le(first.raw()).put_u64_le(last.raw());
                }
                encoder.finish()
            }
            ChunkReply::Stats(stats) => {
                let mut encoder = Encoder::with_capacity(48);
                encoder
                    .put_u8(tag::REPLY_STATS)
                    .put_varint(stats.chunks)
                    .put_varint(stats.payload_bytes)
                    .put_varint(stats.used_bytes)
                    .put_varint(stats.free_bytes)
                    .put_varint(stats.region_bytes)
                    .put_varint(stats.rereplication_pending)
                    .put_varint(stats.requests_served);
                encoder.finish()
            }
            ChunkReply::Failed(error) => {
                let mut encoder = Encoder::with_capacity(16);
                encoder.put_u8(tag::REPLY_FAILED);
                put_error(&mut encoder, error);
                encoder.finish()
            }
            ChunkReply::Malformed(text) => {
                let mut encoder = Encoder::with_capacity(16 + text.len());
                encoder.put_u8(tag::REPLY_MALFORMED);
                put_text(&mut encoder, text);
                encoder.finish()
            }
        }
    }

    /// Decodes a reply; data items share `payload`'s buffer.
    pub fn decode(payload: Bytes) -> Result<ChunkReply, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let reply = match decoder.get_u8("chunk reply tag")? {
            tag::REPLY_CREATED => ChunkReply::Created(get_cids(&mut decoder)?),
            tag::REPLY_DATA => {
                let count = get_count(&mut decoder, "item count", BATCH_ITEMS_MAX, 1)?;
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    match decoder.get_u8("item status")? {
                        tag::OK => items.push(Ok(get_payload(&mut decoder)?)),
                        other => items.push(Err(get_error_after_tag(&mut decoder, other)?)),
                    }
                }
                ChunkReply::Data(items)
            }
            tag::REPLY_STATUSES => {
                let count = get_count(&mut decoder, "status count", BATCH_ITEMS_MAX, 1)?;
                let mut statuses = Vec::with_capacity(count);
                for _ in 0..count {
                    statuses.push(get_status(&mut decoder)?);
                }
                ChunkReply::Statuses(statuses)
            }
            tag::REPLY_SIZES => {
                let count = get_count(&mut decoder, "size count", BATCH_ITEMS_MAX, 1)?;
                let mut sizes = Vec::with_capacity(count);
                for _ in 0..count {
                    match decoder.get_u8("item status")? {
                        tag::OK => sizes.push(Ok(decoder.get_varint("size")?)),
                        other => sizes.push(Err(get_error_after_tag(&mut decoder, other)?)),
                    }
                }
                ChunkReply::Sizes(sizes)
            }
            tag::REPLY_RANGES => {
                let truncated = get_bool(&mut decoder, "truncated flag")?;
                let count = get_count(&mut decoder, "range count", LIST_RANGES_MAX, 16)?;
                let mut ranges = Vec::with_capacity(count);
                for _ in 0..count {
                    let first = get_cid(&mut decoder)?;
                    ranges.push((first, get_cid(&mut decoder)?));
                }
                ChunkReply::Ranges { ranges, truncated }
            }
            tag::REPLY_STATS => ChunkReply::Stats(ChunkStats {
                chunks: decoder.get_varint("chunks")?,
                payload_bytes: decoder.get_varint("payload bytes")?,
                used_bytes: decoder.get_varint("used bytes")?,
                free_bytes: decoder.get_varint("free bytes")?,
                region_bytes: decoder.get_varint("region bytes")?,
                rereplication_pending: decoder.get_varint("rereplication pending")?,
                requests_served: decoder.get_varint("requests served")?,
            }),
            tag::REPLY_FAILED => ChunkReply::Failed(get_error(&mut decoder)?),
            tag::REPLY_MALFORMED => ChunkReply::Malformed(get_text(&mut decoder)?),
            other => {
                return Err(ProtoError::UnknownTag {
                    what: "chunk reply",
                    tag: other,
                })
            }
        };
        decoder.finish()?;
        Ok(reply)
    }
}

/// Whether an encoded request changes chunks (create, create with data, put, remove,
/// insert, offset write, resize), judged by its tag byte alone.
pub fn is_change_request(payload: &[u8]) -> bool {
    matches!(
        payload.first(),
        Some(
            &(tag::CREATE
                | tag::CREATE_WITH_DATA
                | tag::PUT
                | tag::REMOVE
                | tag::INSERT
                | tag::WRITE_AT
                | tag::RESIZE)
        )
    )
}

/// Whether an encoded request only reads (get, offset read, status, list, stats), judged
/// by its tag byte alone, without decoding it. Peers use it to serve reads on the I/O
/// thread; anything else (or an empty payload) answers `false`.
pub fn is_read_only_request(payload: &[u8]) -> bool {
    matches!(
        payload.first(),
        Some(&(tag::GET | tag::READ_AT | tag::STATUS | tag::LIST | tag::STATS))
    )
}

/// The first CID an encoded [`ChunkRequest`] names, read without decoding the rest
/// (no allocation: the peer's per-range request counters call it for every request).
/// `None` for requests that name no CID (create, list, stats), an empty batch, or bytes
/// too short to hold one; bounds-checked like the decoder.
pub fn request_first_cid(payload: &[u8]) -> Option<ChunkId> {
    let (&request_tag, rest) = payload.split_first()?;
    let at = match request_tag {
        tag::READ_AT | tag::LOCK | tag::UNLOCK => 0,
        tag::WRITE_AT | tag::RESIZE => 1,
        tag::GET | tag::STATUS | tag::PUT | tag::REMOVE | tag::INSERT => {
            let skip = usize::from(matches!(request_tag, tag::PUT | tag::REMOVE | tag::INSERT));
            let counted = rest.get(skip..)?;
            // The count: a varint of at most ten bytes; zero names no CID.
            let length = counted.iter().take(10).position(|byte| byte & 0x80 == 0)? + 1;
            if counted[..length].iter().all(|&byte| byte & 0x7f == 0) {
                return None;
            }
            skip + length
        }
        _ => return None,
    };
    let raw: [u8; 8] = rest.get(at..at + 8)?.try_into().ok()?;
    Some(ChunkId::from_raw(u64::from_le_bytes(raw)))
}

/// The first CID a decoded request names (what [`request_first_cid`] peeks).
fn first_cid_of(request: &ChunkRequest) -> Option<ChunkId> {
    match request {
        ChunkRequest::Get { cids }
        | ChunkRequest::Status { cids }
        | ChunkRequest::Remove { cids, .. } => cids.first().copied(),
        ChunkRequest::Put { items, .. } | ChunkRequest::Insert { items, .. } => {
            items.first().map(|(cid, _)| *cid)
        }
        ChunkRequest::ReadAt { cid, .. }
        | ChunkRequest::WriteAt { cid, .. }
        | ChunkRequest::Resize { cid, .. }
        | ChunkRequest::Lock { cid, .. }
        | ChunkRequest::Unlock { cid, .. } => Some(*cid),
        ChunkRequest::Create { .. }
        | ChunkRequest::CreateWithData { .. }
        | ChunkRequest::List { .. }
        | ChunkRequest::Stats => None,
    }
}

/// Runs every decoder of this family on `bytes` (the fuzz target's entry point); never
/// panics, whatever the input.
pub fn fuzz_decode(bytes: &[u8]) {
    let payload = Bytes::copy_from_slice(bytes);
    let first = request_first_cid(bytes);
    if let Ok(request) = ChunkRequest::decode(payload.clone()) {
        // A decoded message encodes to bytes that decode to the same message.
        let again = ChunkRequest::decode(request.encode());
        assert_eq!(again.as_ref(), Ok(&request), "request re-encoding differs");
        // The peek agrees with the decoder.
        assert_eq!(first, first_cid_of(&request), "first CID peek differs");
    }
    if let Ok(reply) = ChunkReply::decode(payload) {
        let again = ChunkReply::decode(reply.encode());
        assert_eq!(again.as_ref(), Ok(&reply), "reply re-encoding differs");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cid() -> impl Strategy<Value = ChunkId> + Clone {
        any::<u64>().prop_map(ChunkId::from_raw)
    }

    fn payload() -> impl Strategy<Value = Bytes> + Clone {
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from)
    }

    fn durability() -> impl Strategy<Value = u8> {
        0..=DURABILITY_MAX
    }

    fn text() -> impl Strategy<Value = String> {
        ".{0,20}"
    }

    fn item_error() -> impl Strategy<Value = ItemError> {
        prop_oneof![
            Just(ItemError::NotFound),
            Just(ItemError::NotOwner),
            Just(ItemError::TooLarge),
            Just(ItemError::OutOfMemory),
            Just(ItemError::LockTimeout),
            text().prop_map(ItemError::Invalid),
            text().prop_map(ItemError::Internal),
        ]
    }

    fn request() -> impl Strategy<Value = ChunkRequest> {
        let cids = proptest::collection::vec(cid(), 0..6);
        let items = proptest::collection::vec((cid(), payload()), 0..6);
        prop_oneof![
            (durability(), proptest::collection::vec(any::<u64>(), 0..6))
                .prop_map(|(durability, sizes)| ChunkRequest::Create { durability, sizes }),
            (durability(), proptest::collection::vec(payload(), 0..6)).prop_map(
                |(durability, payloads)| ChunkRequest::CreateWithData {
                    durability,
                    payloads
                }
            ),
            cids.clone().prop_map(|cids| ChunkRequest::Get { cids }),
            (durability(), items.clone())
                .prop_map(|(durability, items)| ChunkRequest::Put { durability, items }),
            (durability(), cids.clone())
                .prop_map(|(durability, cids)| ChunkRequest::Remove { durability, cids }),
            (durability(), items)
                .prop_map(|(durability, items)| ChunkRequest::Insert { durability, items }),
            (cid(), any::<u64>(), 0..=CHUNK_BYTES_MAX as u64)
                .prop_map(|(cid, offset, len)| ChunkRequest::ReadAt { cid, offset, len }),
            (durability(), cid(), any::<u64>(), payload()).prop_map(
                |(durability, cid, offset, data)| ChunkRequest::WriteAt {
                    durability,
                    cid,
                    offset,
                    data
                }
            ),
            (durability(), cid(), any::<u64>()).prop_map(|(durability, cid, size)| {
                ChunkRequest::Resize {
                    durability,
                    cid,
                    size,
                }
            }),
            (cid(), any::<bool>(), any::<u64>()).prop_map(|(cid, write, timeout_ms)| {
                ChunkRequest::Lock {
                    cid,
                    write,
                    timeout_ms,
                }
            }),
            (cid(), any::<bool>()).prop_map(|(cid, write)| ChunkRequest::Unlock { cid, write }),
            cids.prop_map(|cids| ChunkRequest::Status { cids }),
            (proptest::option::of(any::<u16>()), any::<u64>()).prop_map(|(creator, max)| {
                ChunkRequest::List {
                    creator: creator.map(NodeId),
                    max,
                }
            }),
            Just(ChunkRequest::Stats),
        ]
    }

    fn reply() -> impl Strategy<Value = ChunkReply> {
        prop_oneof![
            proptest::collection::vec(cid(), 0..6).prop_map(ChunkReply::Created),
            proptest::collection::vec(
                prop_oneof![payload().prop_map(Ok), item_error().prop_map(Err)],
                0..6
            )
            .prop_map(ChunkReply::Data),
            proptest::collection::vec(prop_oneof![Just(Ok(())), item_error().prop_map(Err)], 0..6)
                .prop_map(ChunkReply::Statuses),
            proptest::collection::vec(
                prop_oneof![any::<u64>().prop_map(Ok), item_error().prop_map(Err)],
                0..6
            )
            .prop_map(ChunkReply::Sizes),
            (
                proptest::collection::vec((cid(), cid()), 0..6),
                any::<bool>()
            )
                .prop_map(|(ranges, truncated)| ChunkReply::Ranges { ranges, truncated }),
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>()
            )
                .prop_map(
                    |(
                        chunks,
                        payload_bytes,
                        used_bytes,
                        free_bytes,
                        region_bytes,
                        pending,
                        served,
                    )| {
                        ChunkReply::Stats(ChunkStats {
                            chunks,
                            payload_bytes,
                            used_bytes,
                            free_bytes,
                            region_bytes,
                            rereplication_pending: pending,
                            requests_served: served,
                        })
                    }
                ),
            item_error().prop_map(ChunkReply::Failed),
            text().prop_map(ChunkReply::Malformed),
        ]
    }

    proptest! {
        #[test]
        fn requests_round_trip(request in request()) {
            let bytes = request.encode();
            prop_assert_eq!(request_first_cid(&bytes), first_cid_of(&request));
            prop_assert_eq!(ChunkRequest::decode(bytes.clone()), Ok(request));
            // Every strict prefix is refused, never misread.
            for cut in 0..bytes.len() {
                prop_assert!(ChunkRequest::decode(bytes.slice(..cut)).is_err());
            }
        }

        #[test]
        fn replies_round_trip(reply in reply()) {
            let bytes = reply.encode();
            prop_assert_eq!(ChunkReply::decode(bytes.clone()), Ok(reply));
            for cut in 0..bytes.len() {
                prop_assert!(ChunkReply::decode(bytes.slice(..cut)).is_err());
            }
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            fuzz_decode(&bytes);
        }

        #[test]
        fn random_bytes_after_each_tag_never_panic(
            first in 0u8..16,
            rest in proptest::collection::vec(any::<u8>(), 0..48),
        ) {
            let mut bytes = vec![first];
            bytes.extend(rest);
            fuzz_decode(&bytes);
        }
    }

    /// Byte identity of every chunk-family message across codec changes: a seeded sample
    /// folded into one digest (see `crate::digest`).
    #[test]
    fn encodings_match_the_recorded_digest() {
        use crate::digest::{sample, Digest};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let mut digest = Digest::new();
        for _ in 0..1000 {
            digest.add(&sample(&mut runner, &request()).encode());
            digest.add(&sample(&mut runner, &reply()).encode());
        }
        assert_eq!(
            digest,
            Digest {
                encodings: 2_000,
                bytes: 59_269,
                fnv: 0x6e9d09135dd706c3
            }
        );
    }

    #[test]
    fn single_get_is_ten_bytes() {
        let cid = ChunkId::from_raw(0x0001_0000_0000_0005);
        assert_eq!(ChunkRequest::get_one(cid).encode().len(), 10);
    }

    #[test]
    fn decoded_payloads_share_the_message_buffer() {
        let request = ChunkRequest::Put {
            durability: DURABILITY_DEFAULT,
            items: vec![(ChunkId::from_raw(7), Bytes::from_static(b"hello"))],
        };
        let bytes = request.encode();
        let ChunkRequest::Put { items, .. } = ChunkRequest::decode(bytes.clone()).unwrap() else {
            panic!("not a put");
        };
        let range = bytes.as_ptr_range();
        assert!(range.contains(&items[0].1.as_ptr()));
    }

    #[test]
    fn hostile_counts_are_refused_before_allocating() {
        let mut encoder = Encoder::new();
        encoder.put_u8(tag::GET).put_varint(BATCH_ITEMS_MAX as u64);
        assert!(matches!(
            ChunkRequest::decode(encoder.finish()),
            Err(ProtoError::Codec(myriad_types::DecodeError::Truncated(
                "CID count"
            )))
        ));
        let mut encoder = Encoder::new();
        encoder.put_u8(tag::GET).put_varint(u64::MAX);
        assert!(matches!(
            ChunkRequest::decode(encoder.finish()),
            Err(ProtoError::TooLarge { .. })
        ));
        let mut encoder = Encoder::new();
        encoder.put_u8(tag::PUT).put_u8(9);
        assert!(matches!(
            ChunkRequest::decode(encoder.finish()),
            Err(ProtoError::Invalid { .. })
        ));
    }

    #[test]
    fn long_status_text_is_cut_on_a_char_boundary() {
        let text = "é".repeat(STATUS_TEXT_BYTES_MAX);
        let reply = ChunkReply::Failed(ItemError::Internal(text));
        let ChunkReply::Failed(ItemError::Internal(decoded)) =
            ChunkReply::decode(reply.encode()).unwrap()
        else {
            panic!("wrong reply");
        };
        assert!(decoded.len() <= STATUS_TEXT_BYTES_MAX);
        assert!(decoded.chars().all(|c| c == 'é'));
    }
}
