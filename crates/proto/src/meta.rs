//! Metadata requests served by the superpeer group, joining, heartbeats, failure reports
//! and pushed events: messages and their encodings.
//!
//! # Job
//! One Rust type per message of the metadata family (see [`crate::types`] for which message
//! type carries which), each with `encode() -> Bytes` and `decode(Bytes) -> Result<_,
//! ProtoError>`. Metadata commands, responses and errors travel in `myriad-meta`'s own
//! encoding, embedded as a length-prefixed byte string.
//!
//! # Format
//! Every message starts with a tag byte when it has variants. Node IDs are 2 bytes
//! little-endian, epochs, indexes, counts and lengths are LEB128 varints, CIDs and barrier
//! values 8 bytes little-endian, strings and blobs a varint length then the bytes, an
//! `Option` a 0/1 byte then the value.
//!
//! # Invariants
//! - Decoding never panics; every count is checked against its limit and against the bytes
//!   left (each element needs at least one byte) before anything is allocated.
//! - `decode(encode(m)) == m` for every message (property tests below).
//!
//! # Who calls it
//! `myriad-client`'s membership (requesting side, event and heartbeat receiver) and
//! `myriad-node`'s superpeer (serving side).

use bytes::Bytes;
use myriad_meta::{
    Capabilities, Command, LookupRange, MetaError, NodeRecord, PeerBases, RecordLayout, Response,
    Role,
};
use myriad_types::codec::{DecodeError, Decoder, Encoder};

use crate::limits::{ADDRESS_BYTES_MAX, NODES_MAX};
use crate::{get_count, ChunkId, NodeId, ProtoError};

/// Most exception ranges of one creator in a [`MetaReply::LookupTree`].
pub const LOOKUP_RANGES_MAX: usize = 1 << 20;
/// Most superpeers listed in a [`StatusReply`].
pub const SUPERPEERS_MAX: usize = 64;
/// Longest explanation in [`MetaReply::Unavailable`] and [`JoinReply::Unavailable`].
pub const REASON_BYTES_MAX: usize = 4096;
/// Longest embedded metadata command or response (a temporary blob plus its name and
/// framing fits easily).
pub const EMBEDDED_BYTES_MAX: usize = myriad_meta::limits::TMP_BLOB_BYTES_MAX + 4096;

// ----- requests and replies ----------------------------------------------------------------

/// A request to the superpeer group ([`crate::types::META_REQUEST`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaRequest {
    /// Commit a command through Raft (leader only).
    Write(Command),
    /// The lookup range holding a CID.
    Lookup(ChunkId),
    /// The exception ranges of one creator.
    LookupTree(NodeId),
    /// The CID bound to a name.
    NameGet(String),
    /// Every name binding.
    NameList,
    /// A blob of temporary storage.
    TmpGet(String),
    /// Names and sizes of every temporary blob.
    TmpList,
    /// The state of one barrier.
    BarrierStatus(u32),
    /// The whole node table.
    Nodes,
    /// The backup zones of one owner (the log owner: also those adopted by other peers).
    Zones(NodeId),
    /// The backup zones of one (log) owner that a recovery has not settled yet (answered
    /// with [`MetaReply::Zones`]): held by a failed peer or by an earlier incarnation of its
    /// holder, or adopted by a restorer that has not committed their CIDs' ownership yet
    /// (`myriad_meta::MetaState::zone_settled`). A restarted peer polls it for its earlier
    /// incarnation's zones.
    ZonesDue(NodeId),
    /// Where a peer's current incarnation starts numbering zones and local IDs (a joined
    /// peer asks for its own right after the join).
    Bases(NodeId),
    /// The answering superpeer's view of the group (answered by any superpeer, from its
    /// local state, not forwarded).
    Status,
    /// Add superpeer `id`, listening at `address`, to the Raft group (leader only; answered
    /// with the leader's [`MetaReply::Status`] once it votes). The superpeer must run
    /// already, started to join (`myriad superpeer --join`).
    AddSuperpeer {
        /// Its node ID (= Raft member ID).
        id: NodeId,
        /// Where it listens (`host:port`).
        address: String,
    },
    /// Remove superpeer `id` from the Raft group (leader only; answered with the leader's
    /// [`MetaReply::Status`]).
    RemoveSuperpeer(NodeId),
}

/// The state of a barrier as [`MetaRequest::BarrierStatus`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarrierStatus {
    /// Participants per round.
    pub size: u32,
    /// Rounds released so far.
    pub round: u64,
    /// Participants signed on to the current round.
    pub signed: u32,
    /// The values of the last released round.
    pub last_released: Vec<(NodeId, u64)>,
}

/// One superpeer's view of the group ([`MetaRequest::Status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusReply {
    /// The superpeer that answered.
    pub node: NodeId,
    /// The cluster epoch in its applied state.
    pub epoch: u64,
    /// The leader it knows of.
    pub leader: Option<NodeId>,
    /// Its current Raft term.
    pub term: u64,
    /// Index of its last log entry.
    pub last_log_index: Option<u64>,
    /// Index of the last entry applied to its state.
    pub last_applied_index: Option<u64>,
    /// The configured superpeers (ID and address).
    pub members: Vec<(NodeId, String)>,
}

/// The answer to a [`MetaRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaReply {
    /// What a [`MetaRequest::Write`] produced (a refusal is `Response::Error`).
    Response(Response),
    /// [`MetaRequest::Lookup`].
    Lookup(LookupRange),
    /// [`MetaRequest::LookupTree`]: `(first, last, owner)` exception ranges in LID order.
    LookupTree(Vec<(u64, u64, NodeId)>),
    /// [`MetaRequest::NameGet`].
    Name(Option<ChunkId>),
    /// [`MetaRequest::NameList`], by name.
    Names(Vec<(String, ChunkId)>),
    /// [`MetaRequest::TmpGet`].
    Tmp(Option<Vec<u8>>),
    /// [`MetaRequest::TmpList`]: `(name, size in bytes)`.
    TmpList(Vec<(String, u64)>),
    /// [`MetaRequest::BarrierStatus`] (`None`: no such barrier).
    Barrier(Option<BarrierStatus>),
    /// [`MetaRequest::Nodes`], by ID.
    Nodes(Vec<NodeRecord>),
    /// [`MetaRequest::Zones`] and [`MetaRequest::ZonesDue`]: `(zone, backups)`.
    Zones(Vec<(u32, Vec<NodeId>)>),
    /// [`MetaRequest::Bases`].
    Bases(PeerBases),
    /// [`MetaRequest::Status`].
    Status(StatusReply),
    /// This superpeer does not lead; ask `leader` (unknown: `None`). Nothing was applied.
    NotLeader {
        /// The leader as far as the answering superpeer knows.
        leader: Option<NodeId>,
    },
    /// The group could not answer. The text starts with which case it is: `no quorum:`
    /// (nothing applied), `timeout:` / `outcome unknown:` (a write may or may not have been
    /// applied), or `stopped:` (the superpeer is shutting down).
    Unavailable(String),
}

/// A joining node asks for an ID ([`crate::types::JOIN`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinRequest {
    /// Peer or client (superpeers register themselves).
    pub role: Role,
    /// Where the node will listen (`host:port`).
    pub address: String,
    /// What it offers.
    pub capabilities: Capabilities,
    /// Rack number.
    pub rack: u16,
    /// Switch number.
    pub switch: u16,
    /// Its previous ID, when it restarts with its data.
    pub reclaim: Option<NodeId>,
}

/// The answer to a [`JoinRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinReply {
    /// The node joined.
    Ok {
        /// Its ID.
        id: NodeId,
        /// Its incarnation under that ID.
        incarnation: u32,
        /// The cluster epoch after the join.
        epoch: u64,
        /// The full node table after the join.
        nodes: Vec<NodeRecord>,
        /// The node's first lease, counted from when it sent the join request (see
        /// [`Heartbeat::lease_ms`]).
        lease_ms: u32,
    },
    /// Ask the leader.
    NotLeader {
        /// The leader as far as the answering superpeer knows.
        leader: Option<NodeId>,
    },
    /// The group refused the join.
    Refused(MetaError),
    /// The group could not answer (same prefixes as [`MetaReply::Unavailable`]).
    Unavailable(String),
}

/// A watching superpeer's liveness probe ([`crate::types::HEARTBEAT`]); it also renews the
/// node's lease.
///
/// **Leases.** A peer serves chunks only while it holds a lease: `lease_ms` from the
/// moment it *sent* the heartbeat reply numbered `acked` (its own clock), a reply the
/// superpeer has received. The superpeer declares a node failed only after
/// `failure_timeout` of silence counted from the *arrival* of its last reply, which is
/// later than that reply's sending, and `lease_ms` is shorter than `failure_timeout`; so a
/// peer's lease has ended before a verdict on it can commit, whatever the delays (a paused
/// or partitioned peer stops serving on its own before its chunks are recovered
/// elsewhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// The superpeer's cluster epoch.
    pub epoch: u64,
    /// The number of the node's last reply this superpeer received (0: none).
    pub acked: u64,
    /// How long the lease lasts from the sending of reply `acked`.
    pub lease_ms: u32,
}

/// The answer to a [`Heartbeat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatReply {
    /// The node's cluster epoch (as far as its events took it).
    pub epoch: u64,
    /// This reply's number (from 1, increasing per node; see [`Heartbeat`]).
    pub nonce: u64,
}

/// A node lost its connection to `node` ([`crate::types::FAILURE_REPORT`], one-way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureReport {
    /// The node that could not be reached.
    pub node: NodeId,
}

/// A committed membership or ownership change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A node joined (or a new incarnation of it).
    NodeJoined(NodeRecord),
    /// A node was declared failed.
    NodeFailed(NodeId),
    /// A node left in an orderly way.
    NodeLeft(NodeId),
    /// LIDs `first..=last` of `creator` now live on `owner`.
    OwnerChanged {
        /// Whose LIDs.
        creator: NodeId,
        /// First LID.
        first: u64,
        /// Last LID (inclusive).
        last: u64,
        /// The new owner.
        owner: NodeId,
    },
}

/// An event pushed by a superpeer ([`crate::types::EVENT`], ordered, one-way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPush {
    /// The cluster epoch after the event.
    pub epoch: u64,
    /// What happened.
    pub event: Event,
}

/// A barrier round completed ([`crate::types::BARRIER_RELEASED`], one-way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarrierReleased {
    /// The barrier.
    pub id: u32,
    /// The round that completed.
    pub round: u64,
    /// Every participant's value, by node.
    pub values: Vec<(NodeId, u64)>,
}

// ----- field helpers -----------------------------------------------------------------------

fn put_node(out: &mut Encoder, node: NodeId) {
    out.put_u16_le(node.0);
}

fn get_node(input: &mut Decoder) -> Result<NodeId, ProtoError> {
    Ok(NodeId(input.get_u16_le("node")?))
}

fn put_option_node(out: &mut Encoder, node: Option<NodeId>) {
    match node {
        Some(node) => {
            out.put_u8(1);
            put_node(out, node);
        }
        None => {
            out.put_u8(0);
        }
    }
}

fn get_bool(input: &mut Decoder, what: &'static str) -> Result<bool, ProtoError> {
    match input.get_u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        tag => Err(ProtoError::UnknownTag { what, tag }),
    }
}

fn get_option_node(input: &mut Decoder) -> Result<Option<NodeId>, ProtoError> {
    Ok(if get_bool(input, "option")? {
        Some(get_node(input)?)
    } else {
        None
    })
}

fn put_option_u64(out: &mut Encoder, value: Option<u64>) {
    match value {
        Some(value) => {
            out.put_u8(1);
            out.put_varint(value);
        }
        None => {
            out.put_u8(0);
        }
    }
}

fn get_option_u64(input: &mut Decoder) -> Result<Option<u64>, ProtoError> {
    Ok(if get_bool(input, "option")? {
        Some(input.get_varint("optional value")?)
    } else {
        None
    })
}

fn get_string(input: &mut Decoder, what: &'static str, max: usize) -> Result<String, ProtoError> {
    let text = input.get_str(what, usize::MAX)?;
    if text.len() > max {
        return Err(ProtoError::TooLarge {
            what,
            value: text.len() as u64,
            max: max as u64,
        });
    }
    Ok(text.to_owned())
}

fn get_u32(input: &mut Decoder, what: &'static str) -> Result<u32, ProtoError> {
    let value = input.get_varint(what)?;
    u32::try_from(value).map_err(|_| ProtoError::TooLarge {
        what,
        value,
        max: u64::from(u32::MAX),
    })
}

fn meta_error(error: DecodeError) -> ProtoError {
    ProtoError::Meta(error)
}

fn get_embedded(input: &mut Decoder, what: &'static str) -> Result<Bytes, ProtoError> {
    let bytes = input.get_bytes(what)?;
    if bytes.len() > EMBEDDED_BYTES_MAX {
        return Err(ProtoError::TooLarge {
            what,
            value: bytes.len() as u64,
            max: EMBEDDED_BYTES_MAX as u64,
        });
    }
    Ok(bytes)
}

fn put_meta_error(out: &mut Encoder, error: &MetaError) {
    out.put_bytes(&Response::Error(error.clone()).to_bytes());
}

fn get_meta_error(input: &mut Decoder) -> Result<MetaError, ProtoError> {
    let bytes = get_embedded(input, "metadata error")?;
    match Response::from_bytes(&bytes).map_err(meta_error)? {
        Response::Error(error) => Ok(error),
        other => Err(ProtoError::Invalid {
            what: "metadata error",
            detail: format!("a response that is not an error: {other:?}"),
        }),
    }
}

fn get_role(input: &mut Decoder) -> Result<Role, ProtoError> {
    let tag = input.get_u8("role")?;
    Role::from_code(tag).ok_or(ProtoError::UnknownTag { what: "role", tag })
}

fn put_record(out: &mut Encoder, record: &NodeRecord) {
    record.encode(out, RecordLayout::Wire);
}

/// The fewest bytes one encoded node record takes.
const RECORD_BYTES_MIN: usize = 2 + 1 + 1 + 1 + 2 + 2 + 1 + 1 + 1 + 1;

fn get_record(input: &mut Decoder) -> Result<NodeRecord, ProtoError> {
    Ok(NodeRecord::decode(input, RecordLayout::Wire)?)
}

fn put_records(out: &mut Encoder, records: &[NodeRecord]) {
    out.put_varint(records.len() as u64);
    for record in records {
        put_record(out, record);
    }
}

fn get_records(input: &mut Decoder) -> Result<Vec<NodeRecord>, ProtoError> {
    let count = get_count(input, "nodes", NODES_MAX, RECORD_BYTES_MIN)?;
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        records.push(get_record(input)?);
    }
    Ok(records)
}

fn put_values(out: &mut Encoder, values: &[(NodeId, u64)]) {
    out.put_varint(values.len() as u64);
    for (node, value) in values {
        put_node(out, *node);
        out.put_u64_le(*value);
    }
}

fn get_values(input: &mut Decoder) -> Result<Vec<(NodeId, u64)>, ProtoError> {
    let max = myriad_meta::limits::BARRIER_SIZE_MAX as usize;
    let count = get_count(input, "barrier values", max, 10)?;
    let mut values = Vec::with_capacity(count);
    for _ in 0..count {
        values.push((get_node(input)?, input.get_u64_le("barrier value")?));
    }
    Ok(values)
}

fn finish<T>(input: Decoder, value: T) -> Result<T, ProtoError> {
    input.finish()?;
    Ok(value)
}

// ----- MetaRequest -------------------------------------------------------------------------

impl MetaRequest {
    /// The encoding.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        match self {
            MetaRequest::Write(command) => {
                out.put_u8(1).put_bytes(&command.to_bytes());
            }
            MetaRequest::Lookup(cid) => {
                out.put_u8(2).put_u64_le(cid.raw());
            }
            MetaRequest::LookupTree(creator) => {
                out.put_u8(3);
                put_node(&mut out, *creator);
            }
            MetaRequest::NameGet(name) => {
                out.put_u8(4).put_str(name);
            }
            MetaRequest::NameList => {
                out.put_u8(5);
            }
            MetaRequest::TmpGet(name) => {
                out.put_u8(6).put_str(name);
            }
            MetaRequest::TmpList => {
                out.put_u8(7);
            }
            MetaRequest::BarrierStatus(id) => {
                out.put_u8(8).put_varint(u64::from(*id));
            }
            MetaRequest::Nodes => {
                out.put_u8(9);
            }
            MetaRequest::Zones(owner) => {
                out.put_u8(10);
                put_node(&mut out, *owner);
            }
            MetaRequest::Status => {
                out.put_u8(11);
            }
            MetaRequest::Bases(node) => {
                out.put_u8(12);
                put_node(&mut out, *node);
            }
            MetaRequest::ZonesDue(owner) => {
                out.put_u8(13);
                put_node(&mut out, *owner);
            }
            MetaRequest::AddSuperpeer { id, address } => {
                out.put_u8(14);
                put_node(&mut out, *id);
                out.put_str(address);
            }
            MetaRequest::RemoveSuperpeer(id) => {
                out.put_u8(15);
                put_node(&mut out, *id);
            }
        }
        out.finish()
    }

    /// Decodes a whole payload.
    pub fn decode(payload: Bytes) -> Result<MetaRequest, ProtoError> {
        let name_max = myriad_meta::limits::NAME_BYTES_MAX;
        let mut input = Decoder::new(payload);
        let request = match input.get_u8("metadata request tag")? {
            1 => {
                let bytes = get_embedded(&mut input, "command")?;
                MetaRequest::Write(Command::from_bytes(&bytes).map_err(meta_error)?)
            }
            2 => MetaRequest::Lookup(ChunkId::from_raw(input.get_u64_le("CID")?)),
            3 => MetaRequest::LookupTree(get_node(&mut input)?),
            4 => MetaRequest::NameGet(get_string(&mut input, "name", name_max)?),
            5 => MetaRequest::NameList,
            6 => MetaRequest::TmpGet(get_string(&mut input, "tmp name", name_max)?),
            7 => MetaRequest::TmpList,
            8 => MetaRequest::BarrierStatus(get_u32(&mut input, "barrier")?),
            9 => MetaRequest::Nodes,
            10 => MetaRequest::Zones(get_node(&mut input)?),
            11 => MetaRequest::Status,
            12 => MetaRequest::Bases(get_node(&mut input)?),
            13 => MetaRequest::ZonesDue(get_node(&mut input)?),
            14 => MetaRequest::AddSuperpeer {
                id: get_node(&mut input)?,
                address: get_string(
                    &mut input,
                    "superpeer address",
                    myriad_types::limits::ADDRESS_BYTES_MAX,
                )?,
            },
            15 => MetaRequest::RemoveSuperpeer(get_node(&mut input)?),
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "metadata request",
                    tag,
                })
            }
        };
        finish(input, request)
    }
}

// ----- MetaReply ---------------------------------------------------------------------------

impl MetaReply {
    /// The encoding.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        match self {
            MetaReply::Response(response) => {
                out.put_u8(1).put_bytes(&response.to_bytes());
            }
            MetaReply::Lookup(range) => {
                out.put_u8(2);
                put_node(&mut out, range.creator);
                out.put_varint(range.first).put_varint(range.last);
                put_node(&mut out, range.owner);
            }
            MetaReply::LookupTree(ranges) => {
                out.put_u8(3).put_varint(ranges.len() as u64);
                for (first, last, owner) in ranges {
                    out.put_varint(*first).put_varint(*last);
                    put_node(&mut out, *owner);
                }
            }
            MetaReply::Name(cid) => {
                out.put_u8(4);
                match cid {
                    Some(cid) => out.put_u8(1).put_u64_le(cid.raw()),
                    None => out.put_u8(0),
                };
            }
            MetaReply::Names(names) => {
                out.put_u8(5).put_varint(names.len() as u64);
                for (name, cid) in names {
                    out.put_str(name).put_u64_le(cid.raw());
                }
            }
            MetaReply::Tmp(blob) => {
                out.put_u8(6);
                match blob {
                    Some(blob) => out.put_u8(1).put_bytes(blob),
                    None => out.put_u8(0),
                };
            }
            MetaReply::TmpList(blobs) => {
                out.put_u8(7).put_varint(blobs.len() as u64);
                for (name, size) in blobs {
                    out.put_str(name).put_varint(*size);
                }
            }
            MetaReply::Barrier(status) => {
                out.put_u8(8);
                match status {
                    Some(status) => {
                        out.put_u8(1)
                            .put_varint(u64::from(status.size))
                            .put_varint(status.round)
                            .put_varint(u64::from(status.signed));
                        put_values(&mut out, &status.last_released);
                    }
                    None => {
                        out.put_u8(0);
                    }
                }
            }
            MetaReply::Nodes(records) => {
                out.put_u8(9);
                put_records(&mut out, records);
            }
            MetaReply::Zones(zones) => {
                out.put_u8(10).put_varint(zones.len() as u64);
                for (zone, backups) in zones {
                    out.put_varint(u64::from(*zone))
                        .put_varint(backups.len() as u64);
                    for backup in backups {
                        put_node(&mut out, *backup);
                    }
                }
            }
            MetaReply::Bases(bases) => {
                out.put_u8(14)
                    .put_varint(u64::from(bases.zone_base))
                    .put_varint(u64::from(bases.zones_end))
                    .put_varint(bases.lid_base)
                    .put_varint(bases.lids_reserved);
            }
            MetaReply::Status(status) => {
                out.put_u8(11);
                put_node(&mut out, status.node);
                out.put_varint(status.epoch);
                put_option_node(&mut out, status.leader);
                out.put_varint(status.term);
                put_option_u64(&mut out, status.last_log_index);
                put_option_u64(&mut out, status.last_applied_index);
                out.put_varint(status.members.len() as u64);
                for (id, address) in &status.members {
                    put_node(&mut out, *id);
                    out.put_str(address);
                }
            }
            MetaReply::NotLeader { leader } => {
                out.put_u8(12);
                put_option_node(&mut out, *leader);
            }
            MetaReply::Unavailable(reason) => {
                out.put_u8(13).put_str(reason);
            }
        }
        out.finish()
    }

    /// Decodes a whole payload.
    pub fn decode(payload: Bytes) -> Result<MetaReply, ProtoError> {
        use myriad_meta::limits::{
            BACKUPS_PER_ZONE_MAX, NAMES_MAX, NAME_BYTES_MAX, TMP_BLOB_BYTES_MAX, ZONES_PER_NODE_MAX,
        };
        let mut input = Decoder::new(payload);
        let reply = match input.get_u8("metadata reply tag")? {
            1 => {
                let bytes = get_embedded(&mut input, "response")?;
                MetaReply::Response(Response::from_bytes(&bytes).map_err(meta_error)?)
            }
            2 => MetaReply::Lookup(LookupRange {
                creator: get_node(&mut input)?,
                first: input.get_varint("first")?,
                last: input.get_varint("last")?,
                owner: get_node(&mut input)?,
            }),
            3 => {
                let count = get_count(&mut input, "lookup ranges", LOOKUP_RANGES_MAX, 4)?;
                let mut ranges = Vec::with_capacity(count);
                for _ in 0..count {
                    ranges.push((
                        input.get_varint("first")?,
                        input.get_varint("last")?,
                        get_node(&mut input)?,
                    ));
                }
                MetaReply::LookupTree(ranges)
            }
            4 => MetaReply::Name(if get_bool(&mut input, "option")? {
                Some(ChunkId::from_raw(input.get_u64_le("CID")?))
            } else {
                None
            }),
            5 => {
                let count = get_count(&mut input, "names", NAMES_MAX, 9)?;
                let mut names = Vec::with_capacity(count);
                for _ in 0..count {
                    let name = get_string(&mut input, "name", NAME_BYTES_MAX)?;
                    names.push((name, ChunkId::from_raw(input.get_u64_le("CID")?)));
                }
                MetaReply::Names(names)
            }
            6 => MetaReply::Tmp(if get_bool(&mut input, "option")? {
                let blob = input.get_bytes("tmp blob")?;
                if blob.len() > TMP_BLOB_BYTES_MAX {
                    return Err(ProtoError::TooLarge {
                        what: "tmp blob",
                        value: blob.len() as u64,
                        max: TMP_BLOB_BYTES_MAX as u64,
                    });
                }
                Some(blob.to_vec())
            } else {
                None
            }),
            7 => {
                let count = get_count(&mut input, "tmp blobs", NAMES_MAX, 2)?;
                let mut blobs = Vec::with_capacity(count);
                for _ in 0..count {
                    let name = get_string(&mut input, "tmp name", NAME_BYTES_MAX)?;
                    blobs.push((name, input.get_varint("tmp blob size")?));
                }
                MetaReply::TmpList(blobs)
            }
            8 => MetaReply::Barrier(if get_bool(&mut input, "option")? {
                Some(BarrierStatus {
                    size: get_u32(&mut input, "barrier size")?,
                    round: input.get_varint("round")?,
                    signed: get_u32(&mut input, "signed")?,
                    last_released: get_values(&mut input)?,
                })
            } else {
                None
            }),
            9 => MetaReply::Nodes(get_records(&mut input)?),
            10 => {
                let count = get_count(&mut input, "zones", ZONES_PER_NODE_MAX, 2)?;
                let mut zones = Vec::with_capacity(count);
                for _ in 0..count {
                    let zone = get_u32(&mut input, "zone")?;
                    let backups = get_count(&mut input, "backups", BACKUPS_PER_ZONE_MAX, 2)?;
                    let mut list = Vec::with_capacity(backups);
                    for _ in 0..backups {
                        list.push(get_node(&mut input)?);
                    }
                    zones.push((zone, list));
                }
                MetaReply::Zones(zones)
            }
            11 => {
                let node = get_node(&mut input)?;
                let epoch = input.get_varint("epoch")?;
                let leader = get_option_node(&mut input)?;
                let term = input.get_varint("term")?;
                let last_log_index = get_option_u64(&mut input)?;
                let last_applied_index = get_option_u64(&mut input)?;
                let count = get_count(&mut input, "superpeers", SUPERPEERS_MAX, 3)?;
                let mut members = Vec::with_capacity(count);
                for _ in 0..count {
                    let id = get_node(&mut input)?;
                    members.push((id, get_string(&mut input, "address", ADDRESS_BYTES_MAX)?));
                }
                MetaReply::Status(StatusReply {
                    node,
                    epoch,
                    leader,
                    term,
                    last_log_index,
                    last_applied_index,
                    members,
                })
            }
            12 => MetaReply::NotLeader {
                leader: get_option_node(&mut input)?,
            },
            13 => MetaReply::Unavailable(get_string(&mut input, "reason", REASON_BYTES_MAX)?),
            14 => MetaReply::Bases(PeerBases {
                zone_base: get_u32(&mut input, "zone base")?,
                zones_end: get_u32(&mut input, "zones end")?,
                lid_base: input.get_varint("lid base")?,
                lids_reserved: input.get_varint("lids reserved")?,
            }),
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "metadata reply",
                    tag,
                })
            }
        };
        finish(input, reply)
    }
}

// ----- joining -----------------------------------------------------------------------------

impl JoinRequest {
    /// The encoding.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        out.put_u8(self.role.code())
            .put_str(&self.address)
            .put_u8(self.capabilities.0)
            .put_u16_le(self.rack)
            .put_u16_le(self.switch);
        put_option_node(&mut out, self.reclaim);
        out.finish()
    }

    /// Decodes a whole payload.
    pub fn decode(payload: Bytes) -> Result<JoinRequest, ProtoError> {
        let mut input = Decoder::new(payload);
        let request = JoinRequest {
            role: get_role(&mut input)?,
            address: get_string(&mut input, "address", ADDRESS_BYTES_MAX)?,
            capabilities: Capabilities(input.get_u8("capabilities")?),
            rack: input.get_u16_le("rack")?,
            switch: input.get_u16_le("switch")?,
            reclaim: get_option_node(&mut input)?,
        };
        finish(input, request)
    }

    /// The metadata command this request asks the group to commit.
    pub fn to_command(&self) -> Command {
        Command::Join {
            role: self.role,
            address: self.address.clone(),
            capabilities: self.capabilities,
            rack: self.rack,
            switch: self.switch,
            reclaim: self.reclaim,
        }
    }
}

impl JoinReply {
    /// The encoding.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        match self {
            JoinReply::Ok {
                id,
                incarnation,
                epoch,
                nodes,
                lease_ms,
            } => {
                out.put_u8(1);
                put_node(&mut out, *id);
                out.put_varint(u64::from(*incarnation)).put_varint(*epoch);
                put_records(&mut out, nodes);
                out.put_varint(u64::from(*lease_ms));
            }
            JoinReply::NotLeader { leader } => {
                out.put_u8(2);
                put_option_node(&mut out, *leader);
            }
            JoinReply::Refused(error) => {
                out.put_u8(3);
                put_meta_error(&mut out, error);
            }
            JoinReply::Unavailable(reason) => {
                out.put_u8(4).put_str(reason);
            }
        }
        out.finish()
    }

    /// Decodes a whole payload.
    pub fn decode(payload: Bytes) -> Result<JoinReply, ProtoError> {
        let mut input = Decoder::new(payload);
        let reply = match input.get_u8("join reply tag")? {
            1 => JoinReply::Ok {
                id: get_node(&mut input)?,
                incarnation: get_u32(&mut input, "incarnation")?,
                epoch: input.get_varint("epoch")?,
                nodes: get_records(&mut input)?,
                lease_ms: get_u32(&mut input, "lease")?,
            },
            2 => JoinReply::NotLeader {
                leader: get_option_node(&mut input)?,
            },
            3 => JoinReply::Refused(get_meta_error(&mut input)?),
            4 => JoinReply::Unavailable(get_string(&mut input, "reason", REASON_BYTES_MAX)?),
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "join reply",
                    tag,
                })
            }
        };
        finish(input, reply)
    }
}

// ----- heartbeats, failure reports, events, barriers ----------------------------------------

impl Heartbeat {
    /// The encoding.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        out.put_varint(self.epoch)
            .put_varint(self.acked)
            .put_varint(u64::from(self.lease_ms));
        out.finish()
    }

    /// Decodes a whole payload.
    pub fn decode(payload: Bytes) -> Result<Heartbeat, ProtoError> {
        let mut input = Decoder::new(payload);
        let epoch = input.get_varint("epoch")?;
        let acked = input.get_varint("acked")?;
        let lease_ms = get_u32(&mut input, "lease")?;
        finish(
            input,
            Heartbeat {
                epoch,
                acked,
                lease_ms,
            },
        )
    }
}

impl HeartbeatReply {
    /// The encoding.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        out.put_varint(self.epoch).put_varint(self.nonce);
        out.finish()
    }

    /// Decodes a whole payload.
    pub fn decode(payload: Bytes) -> Result<HeartbeatReply, ProtoError> {
        let mut input = Decoder::new(payload);
        let epoch = input.get_varint("epoch")?;
        let nonce = input.get_varint("nonce")?;
        finish(input, HeartbeatReply { epoch, nonce })
    }
}

impl FailureReport {
    /// The encoding.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        put_node(&mut out, self.node);
        out.finish()
    }

    /// Decodes a whole payload.
    pub fn decode(payload: Bytes) -> Result<FailureReport, ProtoError> {
        let mut input = Decoder::new(payload);
        let node = get_node(&mut input)?;
        finish(input, FailureReport { node })
    }
}

impl EventPush {
    /// The encoding.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        out.put_varint(self.epoch);
        match &self.event {
            Event::NodeJoined(record) => {
                out.put_u8(1);
                put_record(&mut out, record);
            }
            Event::NodeFailed(node) => {
                out.put_u8(2);
                put_node(&mut out, *node);
            }
            Event::NodeLeft(node) => {
                out.put_u8(3);
                put_node(&mut out, *node);
            }
            Event::OwnerChanged {
                creator,
                first,
                last,
                owner,
            } => {
                out.put_u8(4);
                put_node(&mut out, *creator);
                out.put_varint(*first).put_varint(*last);
                put_node(&mut out, *owner);
            }
        }
        out.finish()
    }

    /// Decodes a whole payload.
    pub fn decode(payload: Bytes) -> Result<EventPush, ProtoError> {
        let mut input = Decoder::new(payload);
        let epoch = input.get_varint("epoch")?;
        let event = match input.get_u8("event tag")? {
            1 => Event::NodeJoined(get_record(&mut input)?),
            2 => Event::NodeFailed(get_node(&mut input)?),
            3 => Event::NodeLeft(get_node(&mut input)?),
            4 => Event::OwnerChanged {
                creator: get_node(&mut input)?,
                first: input.get_varint("first")?,
                last: input.get_varint("last")?,
                owner: get_node(&mut input)?,
            },
            tag => return Err(ProtoError::UnknownTag { what: "event", tag }),
        };
        finish(input, EventPush { epoch, event })
    }
}

impl BarrierReleased {
    /// The encoding.
    pub fn encode(&self) -> Bytes {
        let mut out = Encoder::new();
        out.put_varint(u64::from(self.id)).put_varint(self.round);
        put_values(&mut out, &self.values);
        out.finish()
    }

    /// Decodes a whole payload.
    pub fn decode(payload: Bytes) -> Result<BarrierReleased, ProtoError> {
        let mut input = Decoder::new(payload);
        let message = BarrierReleased {
            id: get_u32(&mut input, "barrier")?,
            round: input.get_varint("round")?,
            values: get_values(&mut input)?,
        };
        finish(input, message)
    }
}

/// Runs every decoder of this family on `bytes` (for fuzzing: none may panic).
pub fn fuzz_decode(bytes: &[u8]) {
    let payload = Bytes::copy_from_slice(bytes);
    let _ = MetaRequest::decode(payload.clone());
    let _ = MetaReply::decode(payload.clone());
    let _ = JoinRequest::decode(payload.clone());
    let _ = JoinReply::decode(payload.clone());
    let _ = Heartbeat::decode(payload.clone());
    let _ = HeartbeatReply::decode(payload.clone());
    let _ = FailureReport::decode(payload.clone());
    let _ = EventPush::decode(payload.clone());
    let _ = BarrierReleased::decode(payload);
}

#[cfg(test)]
mod tests;
