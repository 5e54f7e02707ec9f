//! Explicit binary encoding of every openraft type that crosses the wire or hits disk, and
//! of the RPC envelope exchanged through [`crate::RaftTransport`].
//!
//! Built on [`myriad_types::codec`]: unsigned integers are LEB128 varints, strings and byte
//! strings are a varint length and the bytes, booleans one byte 0 or 1, optional values a
//! presence byte (0 or 1) and the value. `docs/raft-format.md` shows every layout byte by
//! byte. Encodings are canonical: sets and maps are written in ascending order, so equal
//! values encode to equal bytes.
//!
//! Decoders never panic and never allocate beyond what the input holds: every count is
//! checked against [`crate::limits`] and against the remaining bytes first. A decoded
//! membership is checked by openraft's own validation (every voter has an address).

use std::collections::{BTreeMap, BTreeSet};

use myriad_meta::Command;
use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::limits::ADDRESS_BYTES_MAX;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};

use crate::limits::*;
use crate::types::{
    Entry, EntryPayload, LeaderId, LogId, Membership, SnapshotMeta, StoredMembership,
    SuperpeerNode, TypeConfig, Vote,
};

/// Version byte that starts every RPC request and reply.
pub const RPC_VERSION: u8 = 1;

// ----- scalar building blocks ---------------------------------------------------------------

/// Reads a node ID (a varint of at most [`NODE_ID_MAX`]).
fn node_id(reader: &mut Decoder<'_>, what: &'static str) -> Result<u64, DecodeError> {
    reader.get_varint_max(what, NODE_ID_MAX)
}

/// Appends a leader ID: term, node ID.
pub fn encode_leader_id(out: &mut Encoder, leader_id: &LeaderId) {
    out.put_varint(leader_id.term);
    out.put_varint(leader_id.node_id);
}

/// Reads a leader ID.
pub fn decode_leader_id(reader: &mut Decoder<'_>) -> Result<LeaderId, DecodeError> {
    let term = reader.get_varint_max("term", TERM_MAX)?;
    let node_id = node_id(reader, "leader node")?;
    Ok(LeaderId { term, node_id })
}

/// Appends a vote: leader ID, committed flag.
pub fn encode_vote(out: &mut Encoder, vote: &Vote) {
    encode_leader_id(out, &vote.leader_id);
    out.put_bool(vote.committed);
}

/// Reads a vote.
pub fn decode_vote(reader: &mut Decoder<'_>) -> Result<Vote, DecodeError> {
    let leader_id = decode_leader_id(reader)?;
    let committed = reader.get_bool("vote committed")?;
    Ok(Vote {
        leader_id,
        committed,
    })
}

/// Appends a log ID: leader ID, index.
pub fn encode_log_id(out: &mut Encoder, log_id: &LogId) {
    encode_leader_id(out, &log_id.leader_id);
    out.put_varint(log_id.index);
}

/// Reads a log ID.
pub fn decode_log_id(reader: &mut Decoder<'_>) -> Result<LogId, DecodeError> {
    let leader_id = decode_leader_id(reader)?;
    let index = reader.get_varint_max("log index", LOG_INDEX_MAX)?;
    Ok(LogId { leader_id, index })
}

/// Appends an optional log ID: presence byte, then the log ID.
pub fn encode_option_log_id(out: &mut Encoder, log_id: Option<&LogId>) {
    match log_id {
        Some(log_id) => {
            out.put_u8(1);
            encode_log_id(out, log_id);
        }
        None => {
            out.put_u8(0);
        }
    }
}

/// Reads an optional log ID.
pub fn decode_option_log_id(reader: &mut Decoder<'_>) -> Result<Option<LogId>, DecodeError> {
    if reader.get_bool("log id present")? {
        Ok(Some(decode_log_id(reader)?))
    } else {
        Ok(None)
    }
}

// ----- membership ---------------------------------------------------------------------------

/// Appends a membership: the voter sets (each a count and ascending IDs), then every node
/// (a count, then ID and address in ascending ID order).
pub fn encode_membership(out: &mut Encoder, membership: &Membership) {
    let configs = membership.get_joint_config();
    out.put_varint(configs.len() as u64);
    for voters in configs {
        out.put_varint(voters.len() as u64);
        for id in voters {
            out.put_varint(*id);
        }
    }
    let nodes: Vec<(&u64, &SuperpeerNode)> = membership.nodes().collect();
    out.put_varint(nodes.len() as u64);
    for (id, node) in nodes {
        out.put_varint(*id);
        out.put_str(&node.address);
    }
}

/// Reads a membership and checks it with openraft's validation.
pub fn decode_membership(reader: &mut Decoder<'_>) -> Result<Membership, DecodeError> {
    let config_count = reader.get_count("voter sets", 1, MEMBERSHIP_CONFIGS_MAX)?;
    let mut configs = Vec::with_capacity(config_count);
    for _ in 0..config_count {
        let voter_count = reader.get_count("voters", 1, MEMBERS_MAX)?;
        let mut voters = BTreeSet::new();
        for _ in 0..voter_count {
            if !voters.insert(node_id(reader, "voter")?) {
                return Err(DecodeError::Invalid("duplicate voter"));
            }
        }
        configs.push(voters);
    }
    let node_count = reader.get_count("members", 2, MEMBERS_MAX)?;
    let mut nodes = BTreeMap::new();
    for _ in 0..node_count {
        let id = node_id(reader, "member")?;
        let address = reader
            .get_str("member address", ADDRESS_BYTES_MAX)?
            .to_owned();
        if nodes.insert(id, SuperpeerNode { address }).is_some() {
            return Err(DecodeError::Invalid("duplicate member"));
        }
    }
    Membership::new(configs, nodes).map_err(|_| DecodeError::Invalid("voter without an address"))
}

/// Appends a stored membership: the optional log ID that introduced it, the membership.
pub fn encode_stored_membership(out: &mut Encoder, stored: &StoredMembership) {
    encode_option_log_id(out, stored.log_id().as_ref());
    encode_membership(out, stored.membership());
}

/// Reads a stored membership.
pub fn decode_stored_membership(reader: &mut Decoder<'_>) -> Result<StoredMembership, DecodeError> {
    let log_id = decode_option_log_id(reader)?;
    let membership = decode_membership(reader)?;
    Ok(StoredMembership::new(log_id, membership))
}

// ----- log entries and snapshot meta --------------------------------------------------------

const PAYLOAD_BLANK: u8 = 0;
const PAYLOAD_NORMAL: u8 = 1;
const PAYLOAD_MEMBERSHIP: u8 = 2;

/// Appends a log entry: log ID, payload tag (0 blank, 1 command, 2 membership), payload.
pub fn encode_entry(out: &mut Encoder, entry: &Entry) {
    encode_log_id(out, &entry.log_id);
    match &entry.payload {
        EntryPayload::Blank => {
            out.put_u8(PAYLOAD_BLANK);
        }
        EntryPayload::Normal(command) => {
            out.put_u8(PAYLOAD_NORMAL);
            command.encode(out);
        }
        EntryPayload::Membership(membership) => {
            out.put_u8(PAYLOAD_MEMBERSHIP);
            encode_membership(out, membership);
        }
    }
}

/// Reads a log entry.
pub fn decode_entry(reader: &mut Decoder<'_>) -> Result<Entry, DecodeError> {
    let log_id = decode_log_id(reader)?;
    let payload = match reader.get_u8("payload tag")? {
        PAYLOAD_BLANK => EntryPayload::Blank,
        PAYLOAD_NORMAL => EntryPayload::Normal(Command::decode(reader)?),
        PAYLOAD_MEMBERSHIP => EntryPayload::Membership(decode_membership(reader)?),
        tag => {
            return Err(DecodeError::UnknownTag {
                what: "payload",
                tag: u64::from(tag),
            })
        }
    };
    Ok(Entry { log_id, payload })
}

/// Appends snapshot meta: the optional last included log ID, the stored membership.
pub fn encode_snapshot_meta(out: &mut Encoder, meta: &SnapshotMeta) {
    encode_option_log_id(out, meta.last_log_id.as_ref());
    encode_stored_membership(out, &meta.last_membership);
}

/// Reads snapshot meta.
pub fn decode_snapshot_meta(reader: &mut Decoder<'_>) -> Result<SnapshotMeta, DecodeError> {
    let last_log_id = decode_option_log_id(reader)?;
    let last_membership = decode_stored_membership(reader)?;
    Ok(SnapshotMeta {
        last_log_id,
        last_membership,
    })
}

// ----- RPC envelope ---------------------------------------------------------------------------

const REQUEST_APPEND_ENTRIES: u8 = 1;
const REQUEST_VOTE: u8 = 2;
const REQUEST_PRE_VOTE: u8 = 3;
const REQUEST_INSTALL_SNAPSHOT: u8 = 4;

const REPLY_APPEND_ENTRIES: u8 = 1;
const REPLY_VOTE: u8 = 2;
const REPLY_SNAPSHOT: u8 = 3;
const REPLY_REFUSED: u8 = 4;

const APPEND_SUCCESS: u8 = 0;
const APPEND_PARTIAL_SUCCESS: u8 = 1;
const APPEND_CONFLICT: u8 = 2;
const APPEND_HIGHER_VOTE: u8 = 3;

/// A whole snapshot sent to a follower that lags behind the leader's purged log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRequest {
    /// The sending leader's vote.
    pub vote: Vote,
    /// What the snapshot covers.
    pub meta: SnapshotMeta,
    /// The [`myriad_meta::MetaState::snapshot`] bytes.
    pub data: Vec<u8>,
}

/// A Raft RPC from one superpeer to another.
#[derive(Debug, Clone)]
pub enum RpcRequest {
    /// Replicate log entries (or a heartbeat without entries).
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// Ask for a vote.
    Vote(VoteRequest<TypeConfig>),
    /// Ask whether a vote would be granted, without changing the receiver's term.
    PreVote(VoteRequest<TypeConfig>),
    /// Replace the receiver's state with a snapshot.
    InstallSnapshot(SnapshotRequest),
}

/// The answer to an [`RpcRequest`].
#[derive(Debug, Clone, PartialEq)]
pub enum RpcReply {
    /// Answer to [`RpcRequest::AppendEntries`].
    AppendEntries(AppendEntriesResponse<TypeConfig>),
    /// Answer to [`RpcRequest::Vote`] and [`RpcRequest::PreVote`].
    Vote(VoteResponse<TypeConfig>),
    /// Answer to [`RpcRequest::InstallSnapshot`].
    Snapshot(SnapshotResponse<TypeConfig>),
    /// The receiver could not handle the request (undecodable, shutting down, refused).
    Refused(String),
}

fn encode_append_request(out: &mut Encoder, request: &AppendEntriesRequest<TypeConfig>) {
    encode_vote(out, &request.vote);
    encode_option_log_id(out, request.prev_log_id.as_ref());
    encode_option_log_id(out, request.leader_commit.as_ref());
    out.put_varint(request.entries.len() as u64);
    for entry in &request.entries {
        encode_entry(out, entry);
    }
}

fn decode_append_request(
    reader: &mut Decoder<'_>,
) -> Result<AppendEntriesRequest<TypeConfig>, DecodeError> {
    let vote = decode_vote(reader)?;
    let prev_log_id = decode_option_log_id(reader)?;
    let leader_commit = decode_option_log_id(reader)?;
    // An entry takes at least 4 bytes: term, node, index, payload tag.
    let count = reader.get_count("entries", 4, APPEND_ENTRIES_MAX)?;
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        entries.push(decode_entry(reader)?);
    }
    Ok(AppendEntriesRequest {
        vote,
        prev_log_id,
        entries,
        leader_commit,
    })
}

fn encode_vote_request(out: &mut Encoder, request: &VoteRequest<TypeConfig>) {
    encode_vote(out, &request.vote);
    encode_option_log_id(out, request.last_log_id.as_ref());
    out.put_bool(request.leadership_transfer);
}

fn decode_vote_request(reader: &mut Decoder<'_>) -> Result<VoteRequest<TypeConfig>, DecodeError> {
    let vote = decode_vote(reader)?;
    let last_log_id = decode_option_log_id(reader)?;
    let leadership_transfer = reader.get_bool("leadership transfer")?;
    let mut request = VoteRequest::new(vote, last_log_id);
    request.leadership_transfer = leadership_transfer;
    Ok(request)
}

impl RpcRequest {
    /// The encoding: version, kind, body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Encoder::new();
        out.put_u8(RPC_VERSION);
        match self {
            RpcRequest::AppendEntries(request) => {
                out.put_u8(REQUEST_APPEND_ENTRIES);
                encode_append_request(&mut out, request);
            }
            RpcRequest::Vote(request) => {
                out.put_u8(REQUEST_VOTE);
                encode_vote_request(&mut out, request);
            }
            RpcRequest::PreVote(request) => {
                out.put_u8(REQUEST_PRE_VOTE);
                encode_vote_request(&mut out, request);
            }
            RpcRequest::InstallSnapshot(request) => {
                out.put_u8(REQUEST_INSTALL_SNAPSHOT);
                encode_vote(&mut out, &request.vote);
                encode_snapshot_meta(&mut out, &request.meta);
                out.put_bytes(&request.data);
            }
        }
        out.into_vec()
    }

    /// Decodes a request that fills all of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<RpcRequest, DecodeError> {
        let mut reader = Decoder::from_slice(bytes);
        check_version(&mut reader)?;
        let request = match reader.get_u8("request kind")? {
            REQUEST_APPEND_ENTRIES => {
                RpcRequest::AppendEntries(decode_append_request(&mut reader)?)
            }
            REQUEST_VOTE => RpcRequest::Vote(decode_vote_request(&mut reader)?),
            REQUEST_PRE_VOTE => RpcRequest::PreVote(decode_vote_request(&mut reader)?),
            REQUEST_INSTALL_SNAPSHOT => {
                let vote = decode_vote(&mut reader)?;
                let meta = decode_snapshot_meta(&mut reader)?;
                let data = reader.get_slice("snapshot", SNAPSHOT_BYTES_MAX)?.to_vec();
                RpcRequest::InstallSnapshot(SnapshotRequest { vote, meta, data })
            }
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "request kind",
                    tag: u64::from(tag),
                })
            }
        };
        reader.finish()?;
        Ok(request)
    }
}

impl RpcReply {
    /// The encoding: version, kind, body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Encoder::new();
        out.put_u8(RPC_VERSION);
        match self {
            RpcReply::AppendEntries(response) => {
                out.put_u8(REPLY_APPEND_ENTRIES);
                match response {
                    AppendEntriesResponse::Success => {
                        out.put_u8(APPEND_SUCCESS);
                    }
                    AppendEntriesResponse::PartialSuccess(log_id) => {
                        out.put_u8(APPEND_PARTIAL_SUCCESS);
                        encode_option_log_id(&mut out, log_id.as_ref());
                    }
                    AppendEntriesResponse::Conflict => {
                        out.put_u8(APPEND_CONFLICT);
                    }
                    AppendEntriesResponse::HigherVote(vote) => {
                        out.put_u8(APPEND_HIGHER_VOTE);
                        encode_vote(&mut out, vote);
                    }
                }
            }
            RpcReply::Vote(response) => {
                out.put_u8(REPLY_VOTE);
                encode_vote(&mut out, &response.vote);
                out.put_bool(response.vote_granted);
                encode_option_log_id(&mut out, response.last_log_id.as_ref());
            }
            RpcReply::Snapshot(response) => {
                out.put_u8(REPLY_SNAPSHOT);
                encode_vote(&mut out, &response.vote);
            }
            RpcReply::Refused(reason) => {
                out.put_u8(REPLY_REFUSED);
                out.put_str(truncate_text(reason, REFUSAL_TEXT_BYTES_MAX));
            }
        }
        out.into_vec()
    }

    /// Decodes a reply that fills all of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<RpcReply, DecodeError> {
        let mut reader = Decoder::from_slice(bytes);
        check_version(&mut reader)?;
        let reply = match reader.get_u8("reply kind")? {
            REPLY_APPEND_ENTRIES => {
                let response = match reader.get_u8("append outcome")? {
                    APPEND_SUCCESS => AppendEntriesResponse::Success,
                    APPEND_PARTIAL_SUCCESS => {
                        AppendEntriesResponse::PartialSuccess(decode_option_log_id(&mut reader)?)
                    }
                    APPEND_CONFLICT => AppendEntriesResponse::Conflict,
                    APPEND_HIGHER_VOTE => {
                        AppendEntriesResponse::HigherVote(decode_vote(&mut reader)?)
                    }
                    tag => {
                        return Err(DecodeError::UnknownTag {
                            what: "append outcome",
                            tag: u64::from(tag),
                        })
                    }
                };
                RpcReply::AppendEntries(response)
            }
            REPLY_VOTE => {
                let vote = decode_vote(&mut reader)?;
                let granted = reader.get_bool("vote granted")?;
                let last_log_id = decode_option_log_id(&mut reader)?;
                RpcReply::Vote(VoteResponse::new(vote, last_log_id, granted))
            }
            REPLY_SNAPSHOT => RpcReply::Snapshot(SnapshotResponse::new(decode_vote(&mut reader)?)),
            REPLY_REFUSED => RpcReply::Refused(
                reader
                    .get_str("refusal", REFUSAL_TEXT_BYTES_MAX)?
                    .to_owned(),
            ),
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "reply kind",
                    tag: u64::from(tag),
                })
            }
        };
        reader.finish()?;
        Ok(reply)
    }
}

fn check_version(reader: &mut Decoder<'_>) -> Result<(), DecodeError> {
    let version = reader.get_u8("rpc version")?;
    if version != RPC_VERSION {
        return Err(DecodeError::UnknownTag {
            what: "rpc version",
            tag: u64::from(version),
        });
    }
    Ok(())
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub(crate) fn truncate_text(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
