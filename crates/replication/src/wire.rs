//! The replication protocol: message types 30.x and their byte encodings.
//!
//! # Messages
//! - [`REPLICATE`] (ordered 30.0), master → backup, one-way: a [`LogMessage`], a run of
//!   consecutive operations of the master's *stream* to that backup.
//! - [`ACK`] (unordered 30.1), backup → master, one-way: an [`Ack`], how far the backup has
//!   applied the stream (in its log engine's write buffer) and how far that is on disk.
//!
//! # Streams and sequence numbers
//! A master has one stream per backup, named by a stream ID (strictly increasing over the
//! master's streams, so a restarted master's new stream supersedes the old one). Every
//! operation of a stream has a sequence number, 1, 2, 3, …; a message carries the first
//! one and its operations are consecutive. The messaging layer delivers at most once, so
//! the master keeps unacknowledged messages and resends them; the backup applies an
//! operation only if its number is the one it expects next, drops lower numbers
//! (duplicates) and stops at a gap (acknowledging with [`AckStatus::Gap`] so the master
//! resends at once).
//!
//! # Byte layout (integers little-endian, `varint` = LEB128 of [`myriad_types::codec`])
//! ```text
//! LogMessage := stream u64 | first_seq varint (>= 1) | flags u8 | count varint (>= 1) | op*count
//!   flags     := bit 0: the master waits for durability of these operations (flush now)
//!                bit 1: every op ends with its zone position (`zone_seq varint`)
//!                other bits must be 0
//!   op        := tag u8 | [tags 3, 4, 6: owner u16] | zone varint (<= u32::MAX)
//!                | [tags 1-4: cid u64] | [tags 1, 3: payload varint-length bytes]
//!                | [flag bit 1: zone_seq varint]
//!   tag       := 1 put (write the chunk's whole payload) | 2 remove      (the sender's zone)
//!              | 3 put | 4 remove of log zone (owner, zone)   (a zone the sender adopted)
//!              | 5 reset of the sender's zone | 6 reset of log zone (owner, zone)
//! Ack        := stream u64 | applied_seq varint | durable_seq varint (<= applied_seq) | status
//!   status    := 0 ok | 1 gap | 2 refused, reason (varint-length UTF-8, <= REASON_BYTES_MAX)
//! ```
//! Every count and length is checked against the bytes present before anything is
//! allocated; decoding never panics ([`fuzz_decode`]). A message whose operations all have
//! zone position 0 is written without flag bit 1: byte for byte the format before zone
//! positions existed.
//!
//! # Zone positions
//! A master numbers the changes of each zone it writes, 1, 2, 3, … (continuing from the
//! restorer's position when it adopts a zone), and every backup of the zone receives them
//! in that order, so what a backup holds of a zone is the zone's history up to the last
//! position it applied. A copy's puts carry position 0 (they are no step of the history);
//! a copy starts with a [`Op::Reset`] that empties the backup's log zone and sets its
//! position to the zone's current one. A restorer compares its own position with the
//! surviving backups' ([`ZONE_POSITION`]) and keeps only those that hold the same history.
//!
//! ```text
//! ZONE_POSITION request (30.2): owner u16 | zone varint (<= u32::MAX) | writer u16
//!   reply                      : 0 (zone unknown here) | 1 position varint
//! ```

use bytes::Bytes;
use myriad_net::MessageType;
use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::NodeId;

/// Master → backup: a [`LogMessage`] (ordered, one-way).
pub const REPLICATE: MessageType = MessageType::ordered(30, 0);
/// Backup → master: an [`Ack`] (unordered, one-way).
pub const ACK: MessageType = MessageType::unordered(30, 1);
/// Restorer → surviving backup, request: a [`PositionRequest`]; the reply is a
/// [`PositionReply`] (see "Zone positions" above).
pub const ZONE_POSITION: MessageType = MessageType::unordered(30, 2);

/// Most operations in one [`LogMessage`].
pub const OPS_PER_MESSAGE_MAX: usize = 1 << 16;
/// Longest refusal reason in an [`Ack`].
pub const REASON_BYTES_MAX: usize = 1024;

/// Smallest encoded operation (tag, one-byte zone: a reset): bounds the count before
/// allocating.
const OP_BYTES_MIN: usize = 1 + 1;
const TAG_PUT: u8 = 1;
const TAG_REMOVE: u8 = 2;
const TAG_PUT_FOR: u8 = 3;
const TAG_REMOVE_FOR: u8 = 4;
const TAG_RESET: u8 = 5;
const TAG_RESET_FOR: u8 = 6;
const FLAG_DURABLE: u8 = 1;
const FLAG_ZONE_SEQS: u8 = 2;

/// One replicated change of a chunk in a backup zone. The zone is the sender's own zone
/// `zone` when `owner` is `None`, else the log zone `(owner, zone)`: a zone of (failed)
/// peer `owner` that the sender restored and adopted (issue 6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// The chunk's whole current payload.
    Put {
        /// The log owner of an adopted zone; `None` for the sender's own zone.
        owner: Option<NodeId>,
        /// The zone number (within the sender, or within `owner`).
        zone: u32,
        /// The chunk.
        cid: u64,
        /// Its payload.
        data: Bytes,
        /// Its zone position (module docs); 0 for a copy's put.
        seq: u64,
    },
    /// The chunk was removed.
    Remove {
        /// The log owner of an adopted zone; `None` for the sender's own zone.
        owner: Option<NodeId>,
        /// The zone number (within the sender, or within `owner`).
        zone: u32,
        /// The chunk.
        cid: u64,
        /// Its zone position (module docs).
        seq: u64,
    },
    /// The backup drops everything it holds of the zone and holds it from position `seq`
    /// on: the first operation of a copy of the zone to a backup added to it.
    Reset {
        /// The log owner of an adopted zone; `None` for the sender's own zone.
        owner: Option<NodeId>,
        /// The zone number (within the sender, or within `owner`).
        zone: u32,
        /// The zone's position when the copy starts.
        seq: u64,
    },
}

impl Op {
    /// The operation's zone number (within the sender, or within [`Op::owner`]).
    pub fn zone(&self) -> u32 {
        match self {
            Op::Put { zone, .. } | Op::Remove { zone, .. } | Op::Reset { zone, .. } => *zone,
        }
    }

    /// The log owner named by the operation (`None`: the sender's own zone).
    pub fn owner(&self) -> Option<NodeId> {
        match self {
            Op::Put { owner, .. } | Op::Remove { owner, .. } | Op::Reset { owner, .. } => *owner,
        }
    }

    /// The operation's zone position (module docs; 0: none).
    pub fn seq(&self) -> u64 {
        match self {
            Op::Put { seq, .. } | Op::Remove { seq, .. } | Op::Reset { seq, .. } => *seq,
        }
    }

    /// Sets the operation's zone position.
    pub fn set_seq(&mut self, position: u64) {
        match self {
            Op::Put { seq, .. } | Op::Remove { seq, .. } | Op::Reset { seq, .. } => *seq = position,
        }
    }

    /// The log zone `(owner, zone)` the operation goes to when `sender` sent it.
    pub fn log_zone(&self, sender: NodeId) -> (NodeId, u32) {
        (self.owner().unwrap_or(sender), self.zone())
    }

    /// The operation's chunk (`None` for a [`Op::Reset`]).
    pub fn cid(&self) -> Option<u64> {
        match self {
            Op::Put { cid, .. } | Op::Remove { cid, .. } => Some(*cid),
            Op::Reset { .. } => None,
        }
    }

    /// An upper bound of [`Op::encoded_bytes`] beyond the payload, for estimates made
    /// before an operation is built.
    pub const OVERHEAD_BYTES_MAX: usize = 32;

    /// Bytes this operation takes in a message (an upper bound).
    pub fn encoded_bytes(&self) -> usize {
        match self {
            Op::Put { data, .. } => 1 + 2 + 5 + 8 + 10 + data.len() + 10,
            Op::Remove { .. } => 1 + 2 + 5 + 8 + 10,
            Op::Reset { .. } => 1 + 2 + 5 + 10,
        }
    }

    fn encode(&self, encoder: &mut Encoder, with_seq: bool) {
        let (plain, adopted) = match self {
            Op::Put { .. } => (TAG_PUT, TAG_PUT_FOR),
            Op::Remove { .. } => (TAG_REMOVE, TAG_REMOVE_FOR),
            Op::Reset { .. } => (TAG_RESET, TAG_RESET_FOR),
        };
        match self.owner() {
            Some(owner) => encoder.put_u8(adopted).put_u16_le(owner.0),
            None => encoder.put_u8(plain),
        };
        encoder.put_varint(u64::from(self.zone()));
        if let Some(cid) = self.cid() {
            encoder.put_u64_le(cid);
        }
        if let Op::Put { data, .. } = self {
            encoder.put_bytes(data);
        }
        if with_seq {
            encoder.put_varint(self.seq());
        }
    }

    fn decode(decoder: &mut Decoder, with_seq: bool) -> Result<Op, WireError> {
        let tag = decoder.get_u8("op tag")?;
        let owner = match tag {
            TAG_PUT | TAG_REMOVE | TAG_RESET => None,
            TAG_PUT_FOR | TAG_REMOVE_FOR | TAG_RESET_FOR => {
                Some(NodeId(decoder.get_u16_le("owner")?))
            }
            tag => return Err(WireError::UnknownTag { what: "op", tag }),
        };
        let zone = decode_zone(decoder)?;
        let mut op = match tag {
            TAG_RESET | TAG_RESET_FOR => Op::Reset {
                owner,
                zone,
                seq: 0,
            },
            TAG_PUT | TAG_PUT_FOR => {
                let cid = decoder.get_u64_le("cid")?;
                Op::Put {
                    owner,
                    zone,
                    cid,
                    data: decoder.get_bytes("data")?,
                    seq: 0,
                }
            }
            _ => Op::Remove {
                owner,
                zone,
                cid: decoder.get_u64_le("cid")?,
                seq: 0,
            },
        };
        if with_seq {
            op.set_seq(decoder.get_varint("zone seq")?);
        }
        Ok(op)
    }
}

/// A zone number (a varint, at most `u32::MAX`).
fn decode_zone(decoder: &mut Decoder) -> Result<u32, WireError> {
    let raw = decoder.get_varint("zone")?;
    u32::try_from(raw).map_err(|_| WireError::TooLarge {
        what: "zone",
        value: raw,
        max: u64::from(u32::MAX),
    })
}

/// A run of consecutive operations of one stream ([`REPLICATE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogMessage {
    /// The stream's ID.
    pub stream: u64,
    /// Sequence number of the first operation (at least 1).
    pub first_seq: u64,
    /// The master waits for these operations to be on disk: the backup flushes now.
    pub durable_requested: bool,
    /// The operations (at least one, at most [`OPS_PER_MESSAGE_MAX`]).
    pub ops: Vec<Op>,
}

/// Encodes a [`LogMessage`] from its parts (so a sender need not build one).
pub fn encode_log_message(
    stream: u64,
    first_seq: u64,
    durable_requested: bool,
    ops: &[Op],
) -> Bytes {
    let capacity: usize = 8 + 10 + 1 + 10 + ops.iter().map(Op::encoded_bytes).sum::<usize>();
    let mut encoder = Encoder::with_capacity(capacity);
    let with_seq = ops
        .iter()
        .any(|op| op.seq() != 0 || matches!(op, Op::Reset { .. }));
    let mut flags = if durable_requested { FLAG_DURABLE } else { 0 };
    if with_seq {
        flags |= FLAG_ZONE_SEQS;
    }
    encoder
        .put_u64_le(stream)
        .put_varint(first_seq)
        .put_u8(flags)
        .put_varint(ops.len() as u64);
    for op in ops {
        op.encode(&mut encoder, with_seq);
    }
    encoder.finish()
}

impl LogMessage {
    /// The message's bytes (see the module documentation).
    pub fn encode(&self) -> Bytes {
        encode_log_message(
            self.stream,
            self.first_seq,
            self.durable_requested,
            &self.ops,
        )
    }

    /// Sequence number of the last operation.
    pub fn last_seq(&self) -> u64 {
        self.first_seq + self.ops.len() as u64 - 1
    }

    /// Decodes a message; fails on malformed, short or trailing bytes and on out-of-range
    /// fields.
    pub fn decode(payload: Bytes) -> Result<LogMessage, WireError> {
        let mut decoder = Decoder::new(payload);
        let stream = decoder.get_u64_le("stream")?;
        let first_seq = decoder.get_varint("first seq")?;
        if first_seq == 0 {
            return Err(WireError::Invalid("first sequence number 0"));
        }
        let flags = decoder.get_u8("flags")?;
        if flags & !(FLAG_DURABLE | FLAG_ZONE_SEQS) != 0 {
            return Err(WireError::Invalid("unknown flag bits"));
        }
        let with_seq = flags & FLAG_ZONE_SEQS != 0;
        let count_raw = decoder.get_varint("operation count")?;
        let count = usize::try_from(count_raw).unwrap_or(usize::MAX);
        if count == 0 {
            return Err(WireError::Invalid("empty log message"));
        }
        if count > OPS_PER_MESSAGE_MAX {
            return Err(WireError::TooLarge {
                what: "operation count",
                value: count_raw,
                max: OPS_PER_MESSAGE_MAX as u64,
            });
        }
        if count > decoder.remaining() / OP_BYTES_MIN {
            return Err(WireError::Codec(DecodeError::Truncated("operation count")));
        }
        if first_seq.checked_add(count as u64).is_none() {
            return Err(WireError::Invalid("sequence numbers overflow"));
        }
        let mut ops = Vec::with_capacity(count);
        for _ in 0..count {
            ops.push(Op::decode(&mut decoder, with_seq)?);
        }
        decoder.finish()?;
        Ok(LogMessage {
            stream,
            first_seq,
            durable_requested: flags & FLAG_DURABLE != 0,
            ops,
        })
    }
}

/// How the backup took a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckStatus {
    /// Everything up to `applied_seq` is applied.
    Ok,
    /// A message started beyond `applied_seq + 1` (earlier ones were lost): resend.
    Gap,
    /// The operation after `applied_seq` could not be applied; the backup cannot serve as
    /// this stream's backup until the reason is removed.
    Refused(String),
}

/// A backup's acknowledgement of a stream ([`ACK`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The stream's ID.
    pub stream: u64,
    /// Every operation up to this one is in the backup's log engine (write buffer).
    pub applied_seq: u64,
    /// Every operation up to this one is on the backup's disk (at most `applied_seq`).
    pub durable_seq: u64,
    /// How the last message went.
    pub status: AckStatus,
}

impl Ack {
    /// The acknowledgement's bytes.
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::with_capacity(32);
        encoder
            .put_u64_le(self.stream)
            .put_varint(self.applied_seq)
            .put_varint(self.durable_seq);
        match &self.status {
            AckStatus::Ok => {
                encoder.put_u8(0);
            }
            AckStatus::Gap => {
                encoder.put_u8(1);
            }
            AckStatus::Refused(reason) => {
                let mut end = reason.len().min(REASON_BYTES_MAX);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                encoder.put_u8(2).put_str(&reason[..end]);
            }
        }
        encoder.finish()
    }

    /// Decodes an acknowledgement.
    pub fn decode(payload: Bytes) -> Result<Ack, WireError> {
        let mut decoder = Decoder::new(payload);
        let stream = decoder.get_u64_le("stream")?;
        let applied_seq = decoder.get_varint("applied seq")?;
        let durable_seq = decoder.get_varint("durable seq")?;
        if durable_seq > applied_seq {
            return Err(WireError::Invalid("durable beyond applied"));
        }
        let status = match decoder.get_u8("ack status")? {
            0 => AckStatus::Ok,
            1 => AckStatus::Gap,
            2 => {
                let reason = decoder.get_str("refusal reason", usize::MAX)?;
                if reason.len() > REASON_BYTES_MAX {
                    return Err(WireError::TooLarge {
                        what: "refusal reason",
                        value: reason.len() as u64,
                        max: REASON_BYTES_MAX as u64,
                    });
                }
                AckStatus::Refused(reason.to_owned())
            }
            tag => {
                return Err(WireError::UnknownTag {
                    what: "ack status",
                    tag,
                })
            }
        };
        decoder.finish()?;
        Ok(Ack {
            stream,
            applied_seq,
            durable_seq,
            status,
        })
    }
}

/// A restorer's question to a surviving backup of a zone ([`ZONE_POSITION`]): the zone's
/// position there. The backup first seals the zone against `writer` (the failed peer that
/// wrote it: its owner, or the holder of an adopted zone), so the answer stays true.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositionRequest {
    /// The zone's log owner.
    pub owner: NodeId,
    /// The zone number within `owner`.
    pub zone: u32,
    /// The failed peer whose operations for the zone are refused from now on.
    pub writer: NodeId,
}

impl PositionRequest {
    /// The request's bytes.
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::with_capacity(12);
        encoder
            .put_u16_le(self.owner.0)
            .put_varint(u64::from(self.zone))
            .put_u16_le(self.writer.0);
        encoder.finish()
    }

    /// Decodes a request.
    pub fn decode(payload: Bytes) -> Result<PositionRequest, WireError> {
        let mut decoder = Decoder::new(payload);
        let owner = NodeId(decoder.get_u16_le("owner")?);
        let zone = decode_zone(&mut decoder)?;
        let writer = NodeId(decoder.get_u16_le("writer")?);
        decoder.finish()?;
        Ok(PositionRequest {
            owner,
            zone,
            writer,
        })
    }
}

/// The answer to a [`PositionRequest`]: the zone's position at the backup, `None` when
/// the backup holds no position for it (it restarted since, or never held the zone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositionReply(pub Option<u64>);

impl PositionReply {
    /// The reply's bytes.
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::with_capacity(11);
        match self.0 {
            None => encoder.put_u8(0),
            Some(position) => encoder.put_u8(1).put_varint(position),
        };
        encoder.finish()
    }

    /// Decodes a reply.
    pub fn decode(payload: Bytes) -> Result<PositionReply, WireError> {
        let mut decoder = Decoder::new(payload);
        let reply = match decoder.get_u8("position tag")? {
            0 => PositionReply(None),
            1 => PositionReply(Some(decoder.get_varint("position")?)),
            tag => {
                return Err(WireError::UnknownTag {
                    what: "position",
                    tag,
                })
            }
        };
        decoder.finish()?;
        Ok(reply)
    }
}

/// Why bytes are not a valid replication message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The byte codec refused the input (truncated, bad varint, bad UTF-8, trailing bytes).
    #[error("malformed replication message: {0}")]
    Codec(#[from] DecodeError),
    /// A tag byte names no variant.
    #[error("unknown {what} tag {tag}")]
    UnknownTag {
        /// Which enumeration.
        what: &'static str,
        /// The tag found.
        tag: u8,
    },
    /// A count or value exceeds its limit.
    #[error("{what} is {value}, more than the limit {max}")]
    TooLarge {
        /// Which field.
        what: &'static str,
        /// The value found.
        value: u64,
        /// The limit.
        max: u64,
    },
    /// A field holds a value outside its domain.
    #[error("invalid replication message: {0}")]
    Invalid(&'static str),
}

/// Decodes `bytes` as every message of this module; for fuzzing (must never panic).
pub fn fuzz_decode(bytes: &[u8]) {
    let payload = Bytes::copy_from_slice(bytes);
    if let Ok(message) = LogMessage::decode(payload.clone()) {
        let again = LogMessage::decode(message.encode());
        assert_eq!(again.as_ref(), Ok(&message));
    }
    if let Ok(ack) = Ack::decode(payload.clone()) {
        assert_eq!(Ack::decode(ack.encode()).as_ref(), Ok(&ack));
    }
    if let Ok(request) = PositionRequest::decode(payload.clone()) {
        assert_eq!(PositionRequest::decode(request.encode()), Ok(request));
    }
    if let Ok(reply) = PositionReply::decode(payload) {
        assert_eq!(PositionReply::decode(reply.encode()), Ok(reply));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Puts and removes without zone positions: the format before positions existed.
    fn unsequenced_op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                proptest::option::of(any::<u16>().prop_map(NodeId)),
                any::<u32>(),
                any::<u64>(),
                proptest::collection::vec(any::<u8>(), 0..64)
            )
                .prop_map(|(owner, zone, cid, data)| Op::Put {
                    owner,
                    zone,
                    cid,
                    data: Bytes::from(data),
                    seq: 0,
                }),
            (
                proptest::option::of(any::<u16>().prop_map(NodeId)),
                any::<u32>(),
                any::<u64>()
            )
                .prop_map(|(owner, zone, cid)| Op::Remove {
                    owner,
                    zone,
                    cid,
                    seq: 0
                }),
        ]
    }

    /// Every operation form, with zone positions (0 often: copies).
    fn op_strategy() -> impl Strategy<Value = Op> {
        let seq = prop_oneof![Just(0u64), any::<u64>(), 1u64..1000];
        prop_oneof![
            4 => (unsequenced_op_strategy(), seq.clone()).prop_map(|(mut op, seq)| {
                op.set_seq(seq);
                op
            }),
            1 => (
                proptest::option::of(any::<u16>().prop_map(NodeId)),
                any::<u32>(),
                seq
            )
                .prop_map(|(owner, zone, seq)| Op::Reset { owner, zone, seq }),
        ]
    }

    proptest! {
        #[test]
        fn log_message_round_trips(
            stream in any::<u64>(),
            first_seq in 1u64..u64::MAX / 2,
            durable_requested in any::<bool>(),
            ops in proptest::collection::vec(op_strategy(), 1..20),
        ) {
            let message = LogMessage { stream, first_seq, durable_requested, ops };
            prop_assert_eq!(LogMessage::decode(message.encode()), Ok(message));
        }

        #[test]
        fn ack_round_trips(
            stream in any::<u64>(),
            applied_seq in any::<u64>(),
            durable_back in any::<u64>(),
            status in prop_oneof![
                Just(AckStatus::Ok),
                Just(AckStatus::Gap),
                "[a-z ]{0,40}".prop_map(AckStatus::Refused),
            ],
        ) {
            let ack = Ack { stream, applied_seq, durable_seq: applied_seq.saturating_sub(durable_back), status };
            prop_assert_eq!(Ack::decode(ack.encode()), Ok(ack));
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            fuzz_decode(&bytes);
        }

        #[test]
        fn mutated_messages_never_panic(
            ops in proptest::collection::vec(op_strategy(), 1..5),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        ) {
            let mut bytes = LogMessage { stream: 3, first_seq: 9, durable_requested: true, ops }
                .encode()
                .to_vec();
            for (at, value) in flips {
                let at = at.index(bytes.len());
                bytes[at] = value;
            }
            fuzz_decode(&bytes);
        }

        #[test]
        fn truncated_messages_fail(
            ops in proptest::collection::vec(op_strategy(), 1..5),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = LogMessage { stream: 7, first_seq: 1, durable_requested: false, ops }.encode();
            let cut = cut.index(bytes.len());
            prop_assert!(LogMessage::decode(bytes.slice(..cut)).is_err());
        }
    }

    use myriad_types::digest::EncodingDigest as Digest;

    /// Byte identity of the replication wire format across codec changes (issue 16 moved
    /// the codec to `myriad_types::codec`): a seeded sample of log messages and acks folded
    /// into one digest recorded with the codec that first wrote this format.
    #[test]
    fn encodings_match_the_recorded_digest() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let mut digest = Digest::new();
        let message = (
            any::<u64>(),
            1u64..u64::MAX / 2,
            any::<bool>(),
            proptest::collection::vec(unsequenced_op_strategy(), 1..20),
        );
        let ack = (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            prop_oneof![
                Just(AckStatus::Ok),
                Just(AckStatus::Gap),
                "[a-z ]{0,40}".prop_map(AckStatus::Refused),
            ],
        );
        for _ in 0..500 {
            let (stream, first_seq, durable_requested, ops) =
                message.new_tree(&mut runner).expect("a sample").current();
            digest.add(
                &LogMessage {
                    stream,
                    first_seq,
                    durable_requested,
                    ops,
                }
                .encode(),
            );
            let (stream, applied_seq, durable_seq, status) =
                ack.new_tree(&mut runner).expect("a sample").current();
            digest.add(
                &Ack {
                    stream,
                    applied_seq,
                    durable_seq,
                    status,
                }
                .encode(),
            );
        }
        assert_eq!(
            digest,
            Digest {
                encodings: 1_000,
                bytes: 180_415,
                fnv: 0xec508938d294d672
            }
        );
    }

    #[test]
    fn zone_positions_set_flag_one_and_follow_each_op() {
        let plain = Op::Remove {
            owner: None,
            zone: 3,
            cid: 9,
            seq: 0,
        };
        let unsequenced = encode_log_message(1, 1, false, std::slice::from_ref(&plain));
        assert_eq!(unsequenced[9], 0, "no positions: flags as before");
        let mut numbered = plain.clone();
        numbered.set_seq(300);
        let sequenced = encode_log_message(1, 1, true, &[numbered.clone(), plain.clone()]);
        assert_eq!(sequenced[9], FLAG_DURABLE | FLAG_ZONE_SEQS);
        // tag, zone, cid, then the position as a varint (300 = 0xac 0x02)
        assert_eq!(
            &sequenced[11..22],
            &[TAG_REMOVE, 3, 9, 0, 0, 0, 0, 0, 0, 0, 0xac]
        );
        assert_eq!(
            LogMessage::decode(sequenced).map(|m| m.ops),
            Ok(vec![numbered, plain.clone()])
        );
        let reset = Op::Reset {
            owner: Some(NodeId(0x0102)),
            zone: 4,
            seq: 0,
        };
        let bytes = encode_log_message(2, 5, false, std::slice::from_ref(&reset));
        assert_eq!(
            bytes[9], FLAG_ZONE_SEQS,
            "a reset always carries its position"
        );
        assert_eq!(&bytes[11..16], &[TAG_RESET_FOR, 0x02, 0x01, 4, 0]);
        assert_eq!(LogMessage::decode(bytes).map(|m| m.ops), Ok(vec![reset]));
        let mut bad_flags = encode_log_message(1, 1, false, &[plain]).to_vec();
        bad_flags[9] = 4;
        assert_eq!(
            LogMessage::decode(Bytes::from(bad_flags)),
            Err(WireError::Invalid("unknown flag bits"))
        );
    }

    #[test]
    fn position_messages_round_trip_and_refuse_bad_input() {
        let request = PositionRequest {
            owner: NodeId(7),
            zone: 300,
            writer: NodeId(9),
        };
        assert_eq!(PositionRequest::decode(request.encode()), Ok(request));
        assert!(PositionRequest::decode(request.encode().slice(..3)).is_err());
        for reply in [
            PositionReply(None),
            PositionReply(Some(0)),
            PositionReply(Some(u64::MAX)),
        ] {
            assert_eq!(PositionReply::decode(reply.encode()), Ok(reply));
        }
        assert!(PositionReply::decode(Bytes::from_static(&[2])).is_err());
        assert!(PositionReply::decode(Bytes::from_static(&[0, 0])).is_err());
        assert!(PositionReply::decode(Bytes::from_static(&[1])).is_err());
    }

    #[test]
    fn rejects_zero_first_seq_empty_and_huge_counts() {
        let ok = LogMessage {
            stream: 1,
            first_seq: 1,
            durable_requested: true,
            ops: vec![Op::Remove {
                owner: None,
                zone: 3,
                cid: 9,
                seq: 0,
            }],
        };
        assert!(LogMessage::decode(ok.encode()).is_ok());
        let zero = encode_log_message(
            1,
            0,
            false,
            &[Op::Remove {
                owner: None,
                zone: 3,
                cid: 9,
                seq: 0,
            }],
        );
        assert_eq!(
            LogMessage::decode(zero),
            Err(WireError::Invalid("first sequence number 0"))
        );
        let empty = encode_log_message(1, 1, false, &[]);
        assert!(LogMessage::decode(empty).is_err());
        let mut huge = Encoder::new();
        huge.put_u64_le(1)
            .put_varint(1)
            .put_u8(0)
            .put_varint(1 << 40);
        assert!(matches!(
            LogMessage::decode(huge.finish()),
            Err(WireError::TooLarge { .. })
        ));
        let mut bad_zone = Encoder::new();
        bad_zone
            .put_u64_le(1)
            .put_varint(1)
            .put_u8(0)
            .put_varint(1)
            .put_u8(TAG_REMOVE)
            .put_varint(1 << 33)
            .put_u64_le(5);
        assert!(matches!(
            LogMessage::decode(bad_zone.finish()),
            Err(WireError::TooLarge { what: "zone", .. })
        ));
        // An op naming a log owner: the owner is two bytes after the tag; a tag beyond 4 is
        // refused, and a truncated owner is an error.
        let adopted = encode_log_message(
            1,
            1,
            false,
            &[Op::Remove {
                owner: Some(NodeId(0x0102)),
                zone: 3,
                cid: 9,
                seq: 0,
            }],
        );
        assert_eq!(&adopted[11..14], &[TAG_REMOVE_FOR, 0x02, 0x01]);
        assert_eq!(
            LogMessage::decode(adopted.clone()).map(|m| m.ops[0].log_zone(NodeId(7))),
            Ok((NodeId(0x0102), 3))
        );
        let mut bad_tag = adopted.to_vec();
        bad_tag[11] = 7;
        assert_eq!(
            LogMessage::decode(Bytes::from(bad_tag)),
            Err(WireError::UnknownTag { what: "op", tag: 7 })
        );
        assert!(LogMessage::decode(adopted.slice(..13)).is_err());
        let bad_ack = Ack {
            stream: 1,
            applied_seq: 1,
            durable_seq: 2,
            status: AckStatus::Ok,
        };
        assert!(Ack::decode(bad_ack.encode()).is_err());
    }
}
