//! The wire format: the 12-byte frame header, the frame decoder, fragment reassembly and
//! the authentication handshake. Byte diagrams and the reasoning are in
//! `docs/wire-format.md`; this module is the one place that reads or writes them.
//!
//! Invariants:
//! - [`FrameDecoder::decode`] never allocates from a declared length that it has not
//!   checked against [`FRAME_PAYLOAD_BYTES_MAX`]; a header it rejects closes the connection.
//! - [`Reassembler`] holds at most one message being reassembled per connection (senders
//!   stream one fragmented message at a time per connection) and never more than its
//!   `message_bytes_max`; it grows its buffer only by fragments that actually arrived.
//! - Nothing here panics on any input (fuzzed by `crates/net/fuzz`).
//!
//! Callers: the connection reader (`reader.rs`) and writer (`conn.rs`), the handshake
//! (`endpoint/dial.rs`, `endpoint/accept.rs`), the lanes (`lane.rs`), the fuzz targets and
//! tests.

use bytes::{Buf, Bytes, BytesMut};
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{FrameError, HandshakeError};

/// Bytes in every frame header.
pub const HEADER_BYTES: usize = 12;

/// Value of header byte 3; anything else means the stream is garbage or out of step.
pub const FRAME_MARKER: u8 = 0x4d;

/// Largest payload of one frame (1 MiB). Larger messages are sent as fragments of this
/// size, so a small message never waits behind more than one fragment per sender.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 1 << 20;

/// Flags byte: mask of the 2-bit kind.
const FLAG_KIND_MASK: u8 = 0b0000_0011;
/// Flags byte: the message is of an ordered type.
const FLAG_ORDERED: u8 = 0b0000_0100;
/// Flags byte: the frame is one piece of a fragmented message.
const FLAG_FRAGMENT: u8 = 0b0000_1000;
/// Flags byte: the frame is the last piece (only together with [`FLAG_FRAGMENT`]).
const FLAG_LAST: u8 = 0b0001_0000;
/// Flags byte: bits that must be zero.
const FLAG_RESERVED: u8 = 0b1110_0000;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A one-way message.
    Message,
    /// A request; the receiver answers with a response carrying the same message ID.
    Request,
    /// The response to a request.
    Response,
}

impl Kind {
    fn bits(self) -> u8 {
        match self {
            Kind::Message => 0,
            Kind::Request => 1,
            Kind::Response => 2,
        }
    }

    fn from_bits(bits: u8) -> Option<Self> {
        match bits {
            0 => Some(Kind::Message),
            1 => Some(Kind::Request),
            2 => Some(Kind::Response),
            _ => None,
        }
    }
}

/// Where a frame sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment {
    /// The frame is the whole message.
    Whole,
    /// A piece of a fragmented message with more to come.
    More,
    /// The last piece of a fragmented message.
    Last,
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Message, request or response.
    pub kind: Kind,
    /// Whether the message's type is ordered.
    pub ordered: bool,
    /// Position in a fragmented message.
    pub fragment: Fragment,
    /// Type byte.
    pub type_id: u8,
    /// Subtype byte.
    pub subtype: u8,
    /// Request ID for requests and responses; for fragmented messages the ID shared by all
    /// fragments; 0 for whole one-way messages.
    pub message_id: u32,
    /// Payload bytes following the header.
    pub payload_bytes: u32,
}

impl FrameHeader {
    /// The 12 header bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut flags = self.kind.bits();
        if self.ordered {
            flags |= FLAG_ORDERED;
        }
        match self.fragment {
            Fragment::Whole => {}
            Fragment::More => flags |= FLAG_FRAGMENT,
            Fragment::Last => flags |= FLAG_FRAGMENT | FLAG_LAST,
        }
        let id = self.message_id.to_le_bytes();
        let length = self.payload_bytes.to_le_bytes();
        [
            flags,
            self.type_id,
            self.subtype,
            FRAME_MARKER,
            id[0],
            id[1],
            id[2],
            id[3],
            length[0],
            length[1],
            length[2],
            length[3],
        ]
    }

    /// Parses and validates 12 header bytes; `payload_bytes_max` bounds the length.
    pub fn decode(
        bytes: &[u8; HEADER_BYTES],
        payload_bytes_max: usize,
    ) -> Result<Self, FrameError> {
        let [flags, type_id, subtype, marker, i0, i1, i2, i3, l0, l1, l2, l3] = *bytes;
        if marker != FRAME_MARKER {
            return Err(FrameError::BadMarker(marker));
        }
        if flags & FLAG_RESERVED != 0 {
            return Err(FrameError::BadFlags(flags));
        }
        let kind = Kind::from_bits(flags & FLAG_KIND_MASK).ok_or(FrameError::BadFlags(flags))?;
        let fragment = match (flags & FLAG_FRAGMENT != 0, flags & FLAG_LAST != 0) {
            (false, false) => Fragment::Whole,
            (true, false) => Fragment::More,
            (true, true) => Fragment::Last,
            (false, true) => return Err(FrameError::BadFlags(flags)),
        };
        let payload_bytes = u32::from_le_bytes([l0, l1, l2, l3]);
        if payload_bytes as usize > payload_bytes_max {
            return Err(FrameError::LengthTooLarge {
                length_bytes: u64::from(payload_bytes),
                max_bytes: payload_bytes_max,
            });
        }
        Ok(Self {
            kind,
            ordered: flags & FLAG_ORDERED != 0,
            fragment,
            type_id,
            subtype,
            message_id: u32::from_le_bytes([i0, i1, i2, i3]),
            payload_bytes,
        })
    }
}

/// A frame cut from the stream; `payload` shares the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The validated header.
    pub header: FrameHeader,
    /// Exactly `header.payload_bytes` bytes.
    pub payload: Bytes,
}

/// Cuts frames from a receive buffer.
#[derive(Debug, Clone, Copy)]
pub struct FrameDecoder {
    payload_bytes_max: usize,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(FRAME_PAYLOAD_BYTES_MAX)
    }
}

impl FrameDecoder {
    /// A decoder that rejects frames with payloads above `payload_bytes_max` (at most
    /// [`FRAME_PAYLOAD_BYTES_MAX`]).
    pub fn new(payload_bytes_max: usize) -> Self {
        Self {
            payload_bytes_max: payload_bytes_max.min(FRAME_PAYLOAD_BYTES_MAX),
        }
    }

    /// Removes and returns the next complete frame from `buf`, `Ok(None)` if more bytes
    /// are needed, or the reason the stream is bad.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(header_bytes) = buf.get(..HEADER_BYTES) else {
            return Ok(None);
        };
        let mut array = [0u8; HEADER_BYTES];
        array.copy_from_slice(header_bytes);
        let header = FrameHeader::decode(&array, self.payload_bytes_max)?;
        let total = HEADER_BYTES + header.payload_bytes as usize;
        if buf.len() < total {
            return Ok(None);
        }
        buf.advance(HEADER_BYTES);
        let payload = buf.split_to(header.payload_bytes as usize).freeze();
        Ok(Some(Frame { header, payload }))
    }

    /// Total bytes `buf` must hold before the next frame is complete (a header's worth if
    /// even the header is incomplete); 0 if the header is invalid (decode reports why).
    pub fn bytes_needed(&self, buf: &[u8]) -> usize {
        let Some(header_bytes) = buf.get(..HEADER_BYTES) else {
            return HEADER_BYTES;
        };
        let mut array = [0u8; HEADER_BYTES];
        array.copy_from_slice(header_bytes);
        match FrameHeader::decode(&array, self.payload_bytes_max) {
            Ok(header) => HEADER_BYTES + header.payload_bytes as usize,
            Err(_) => 0,
        }
    }
}

/// A whole message: a whole frame, or the fragments of one put back together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireMessage {
    /// Message, request or response.
    pub kind: Kind,
    /// Ordered type.
    pub ordered: bool,
    /// Type byte.
    pub type_id: u8,
    /// Subtype byte.
    pub subtype: u8,
    /// Message ID (request ID for requests and responses).
    pub message_id: u32,
    /// The payload.
    pub payload: Bytes,
}

/// Puts fragmented messages back together, one at a time per connection.
#[derive(Debug)]
pub struct Reassembler {
    message_bytes_max: usize,
    in_progress: Option<(FrameHeader, BytesMut)>,
}

impl Reassembler {
    /// A reassembler refusing messages above `message_bytes_max`.
    pub fn new(message_bytes_max: usize) -> Self {
        Self {
            message_bytes_max,
            in_progress: None,
        }
    }

    /// Bytes held for the message being reassembled.
    pub fn buffered_bytes(&self) -> usize {
        self.in_progress.as_ref().map_or(0, |(_, buf)| buf.len())
    }

    /// Feeds one frame; returns the message it completes, if any.
    pub fn push(&mut self, frame: Frame) -> Result<Option<WireMessage>, FrameError> {
        let header = frame.header;
        match header.fragment {
            Fragment::Whole => Ok(Some(WireMessage {
                kind: header.kind,
                ordered: header.ordered,
                type_id: header.type_id,
                subtype: header.subtype,
                message_id: header.message_id,
                payload: frame.payload,
            })),
            Fragment::More | Fragment::Last => {
                let first = match self.in_progress.take() {
                    None => {
                        if header.fragment == Fragment::Last {
                            return Err(FrameError::OrphanFragment);
                        }
                        if frame.payload.len() > self.message_bytes_max {
                            return Err(FrameError::MessageTooLarge {
                                max_bytes: self.message_bytes_max,
                            });
                        }
                        let mut buf = BytesMut::with_capacity(frame.payload.len() * 2);
                        buf.extend_from_slice(&frame.payload);
                        self.in_progress = Some((header, buf));
                        return Ok(None);
                    }
                    Some(in_progress) => in_progress,
                };
                let (first_header, mut buf) = first;
                if first_header.message_id != header.message_id {
                    return Err(FrameError::InterleavedFragments);
                }
                if first_header.kind != header.kind
                    || first_header.ordered != header.ordered
                    || first_header.type_id != header.type_id
                    || first_header.subtype != header.subtype
                    || first_header.message_id != header.message_id
                {
                    return Err(FrameError::FragmentMismatch);
                }
                if buf.len().saturating_add(frame.payload.len()) > self.message_bytes_max {
                    return Err(FrameError::MessageTooLarge {
                        max_bytes: self.message_bytes_max,
                    });
                }
                buf.extend_from_slice(&frame.payload);
                if header.fragment == Fragment::More {
                    self.in_progress = Some((first_header, buf));
                    return Ok(None);
                }
                Ok(Some(WireMessage {
                    kind: header.kind,
                    ordered: header.ordered,
                    type_id: header.type_id,
                    subtype: header.subtype,
                    message_id: header.message_id,
                    payload: buf.freeze(),
                }))
            }
        }
    }
}

/// The four magic bytes opening both handshake greetings.
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"MYRN";
/// Protocol version spoken by this build.
pub const PROTOCOL_VERSION: u8 = 1;
/// Bytes of a [`Greeting`].
pub const GREETING_BYTES: usize = 32;
/// Bytes of an HMAC-SHA256 proof.
pub const PROOF_BYTES: usize = 32;
/// Bytes of a handshake nonce.
pub const NONCE_BYTES: usize = 16;
/// Greeting flags byte: the connector opens a direct request lane, not the node's
/// connection (see `docs/wire-format.md`, "Lanes"). Only a connector may set it.
pub const GREETING_FLAG_LANE: u8 = 0b0000_0001;
/// Greeting flags byte: bits that must be zero.
const GREETING_FLAGS_RESERVED: u8 = !GREETING_FLAG_LANE;

/// What each side says first: who it is and a fresh nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    /// The sender's node ID.
    pub node: u16,
    /// Random ID of the sender's endpoint instance (changes on every restart).
    pub instance: u64,
    /// Fresh random bytes.
    pub nonce: [u8; NONCE_BYTES],
    /// The connector opens a direct request lane ([`GREETING_FLAG_LANE`]); always false in
    /// an acceptor's greeting.
    pub lane: bool,
}

impl Greeting {
    /// The 32 greeting bytes.
    pub fn encode(&self) -> [u8; GREETING_BYTES] {
        let mut out = [0u8; GREETING_BYTES];
        let (magic, rest) = out.split_at_mut(4);
        magic.copy_from_slice(&HANDSHAKE_MAGIC);
        let (version, rest) = rest.split_at_mut(1);
        version.copy_from_slice(&[PROTOCOL_VERSION]);
        let (flags, rest) = rest.split_at_mut(1);
        flags.copy_from_slice(&[if self.lane { GREETING_FLAG_LANE } else { 0 }]);
        let (node, rest) = rest.split_at_mut(2);
        node.copy_from_slice(&self.node.to_le_bytes());
        let (instance, nonce) = rest.split_at_mut(8);
        instance.copy_from_slice(&self.instance.to_le_bytes());
        nonce.copy_from_slice(&self.nonce);
        out
    }

    /// Parses 32 greeting bytes.
    pub fn decode(bytes: &[u8; GREETING_BYTES]) -> Result<Self, HandshakeError> {
        let [m0, m1, m2, m3, version, flags, n0, n1, i0, i1, i2, i3, i4, i5, i6, i7, nonce @ ..] =
            *bytes;
        if [m0, m1, m2, m3] != HANDSHAKE_MAGIC {
            return Err(HandshakeError::BadMagic);
        }
        if version != PROTOCOL_VERSION {
            return Err(HandshakeError::BadVersion(version));
        }
        if flags & GREETING_FLAGS_RESERVED != 0 {
            return Err(HandshakeError::BadReserved);
        }
        Ok(Self {
            node: u16::from_le_bytes([n0, n1]),
            instance: u64::from_le_bytes([i0, i1, i2, i3, i4, i5, i6, i7]),
            nonce,
            lane: flags & GREETING_FLAG_LANE != 0,
        })
    }
}

/// Domain-separation label of the acceptor's proof.
const ACCEPTOR_LABEL: &[u8] = b"myriad-net/1 acceptor";
/// Domain-separation label of the connector's proof.
const CONNECTOR_LABEL: &[u8] = b"myriad-net/1 connector";

fn proof(
    secret: &[u8],
    label: &[u8],
    connector: &[u8; GREETING_BYTES],
    acceptor: &[u8; GREETING_BYTES],
) -> Hmac<Sha256> {
    // HMAC takes keys of any length, so `new_from_slice` cannot fail; the fallback (an
    // all-zero key, whose proofs never match a real secret's) avoids a panic path.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| <Hmac<Sha256> as KeyInit>::new(&Default::default()));
    mac.update(label);
    mac.update(connector);
    mac.update(acceptor);
    mac
}

/// The acceptor's proof over both greetings.
pub fn acceptor_proof(
    secret: &[u8],
    connector: &[u8; GREETING_BYTES],
    acceptor: &[u8; GREETING_BYTES],
) -> [u8; PROOF_BYTES] {
    proof(secret, ACCEPTOR_LABEL, connector, acceptor)
        .finalize()
        .into_bytes()
        .into()
}

/// The connector's proof over both greetings.
pub fn connector_proof(
    secret: &[u8],
    connector: &[u8; GREETING_BYTES],
    acceptor: &[u8; GREETING_BYTES],
) -> [u8; PROOF_BYTES] {
    proof(secret, CONNECTOR_LABEL, connector, acceptor)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks the acceptor's proof in constant time.
pub fn verify_acceptor_proof(
    secret: &[u8],
    connector: &[u8; GREETING_BYTES],
    acceptor: &[u8; GREETING_BYTES],
    received: &[u8; PROOF_BYTES],
) -> Result<(), HandshakeError> {
    proof(secret, ACCEPTOR_LABEL, connector, acceptor)
        .verify_slice(received)
        .map_err(|_| HandshakeError::BadProof)
}

/// Checks the connector's proof in constant time.
pub fn verify_connector_proof(
    secret: &[u8],
    connector: &[u8; GREETING_BYTES],
    acceptor: &[u8; GREETING_BYTES],
    received: &[u8; PROOF_BYTES],
) -> Result<(), HandshakeError> {
    proof(secret, CONNECTOR_LABEL, connector, acceptor)
        .verify_slice(received)
        .map_err(|_| HandshakeError::BadProof)
}

/// The acceptor's last handshake byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The connection is in use from now on; frames may follow.
    Accepted,
    /// A connection between the two nodes already exists or wins the tie-break; the
    /// connector uses that one and closes this. To a lane: the acceptor holds its maximum
    /// of lanes from the connector, which sends over the node's connection instead.
    Duplicate,
    /// The acceptor refuses the connector (fenced, or its own node ID).
    Refused,
}

impl Verdict {
    /// The verdict byte.
    pub fn encode(self) -> u8 {
        match self {
            Verdict::Accepted => 1,
            Verdict::Duplicate => 2,
            Verdict::Refused => 3,
        }
    }

    /// Parses the verdict byte.
    pub fn decode(byte: u8) -> Result<Self, HandshakeError> {
        match byte {
            1 => Ok(Verdict::Accepted),
            2 => Ok(Verdict::Duplicate),
            3 => Ok(Verdict::Refused),
            other => Err(HandshakeError::BadVerdict(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(kind: Kind, fragment: Fragment, id: u32, length: u32) -> FrameHeader {
        FrameHeader {
            kind,
            ordered: false,
            fragment,
            type_id: 7,
            subtype: 9,
            message_id: id,
            payload_bytes: length,
        }
    }

    #[test]
    fn header_layout_matches_the_documented_bytes() {
        let h = FrameHeader {
            kind: Kind::Request,
            ordered: true,
            fragment: Fragment::Last,
            type_id: 0x11,
            subtype: 0x22,
            message_id: 0x0403_0201,
            payload_bytes: 0x0000_0100,
        };
        assert_eq!(
            h.encode(),
            [0x1d, 0x11, 0x22, 0x4d, 1, 2, 3, 4, 0x00, 0x01, 0, 0]
        );
    }

    #[test]
    fn bad_headers_are_rejected_with_their_reason() {
        let good = header(Kind::Message, Fragment::Whole, 0, 4).encode();
        let mut marker = good;
        marker[3] = 0;
        assert_eq!(
            FrameHeader::decode(&marker, 64),
            Err(FrameError::BadMarker(0))
        );
        let mut kind = good;
        kind[0] = 3;
        assert_eq!(FrameHeader::decode(&kind, 64), Err(FrameError::BadFlags(3)));
        let mut reserved = good;
        reserved[0] = 0x20;
        assert_eq!(
            FrameHeader::decode(&reserved, 64),
            Err(FrameError::BadFlags(0x20))
        );
        let mut last_alone = good;
        last_alone[0] = FLAG_LAST;
        assert!(FrameHeader::decode(&last_alone, 64).is_err());
        let long = header(Kind::Message, Fragment::Whole, 0, u32::MAX).encode();
        assert!(matches!(
            FrameHeader::decode(&long, FRAME_PAYLOAD_BYTES_MAX),
            Err(FrameError::LengthTooLarge { .. })
        ));
    }

    #[test]
    fn reassembly_rejects_orphans_interleaving_and_oversize() {
        let frame = |fragment, id, len: usize| Frame {
            header: header(Kind::Message, fragment, id, len as u32),
            payload: Bytes::from(vec![1u8; len]),
        };
        let mut r = Reassembler::new(100);
        assert_eq!(
            r.push(frame(Fragment::Last, 1, 3)),
            Err(FrameError::OrphanFragment)
        );
        let mut r = Reassembler::new(100);
        assert_eq!(r.push(frame(Fragment::More, 1, 3)), Ok(None));
        assert_eq!(
            r.push(frame(Fragment::More, 2, 3)),
            Err(FrameError::InterleavedFragments)
        );
        let mut r = Reassembler::new(100);
        assert_eq!(r.push(frame(Fragment::More, 1, 3)), Ok(None));
        let mut other_type = frame(Fragment::Last, 1, 3);
        other_type.header.subtype = 1;
        assert_eq!(r.push(other_type), Err(FrameError::FragmentMismatch));
        let mut r = Reassembler::new(100);
        assert_eq!(r.push(frame(Fragment::More, 1, 60)), Ok(None));
        assert_eq!(
            r.push(frame(Fragment::Last, 1, 60)),
            Err(FrameError::MessageTooLarge { max_bytes: 100 })
        );
        let mut r = Reassembler::new(100);
        assert_eq!(r.push(frame(Fragment::More, 1, 60)), Ok(None));
        let whole = r.push(frame(Fragment::Last, 1, 40)).unwrap_or(None);
        assert_eq!(whole.map(|m| m.payload.len()), Some(100));
        assert_eq!(r.buffered_bytes(), 0);
    }

    #[test]
    fn handshake_greeting_round_trips_and_proofs_bind_both_sides() {
        let a = Greeting {
            node: 3,
            instance: 99,
            nonce: [5; NONCE_BYTES],
            lane: false,
        };
        let b = Greeting {
            node: 4,
            instance: 7,
            nonce: [6; NONCE_BYTES],
            lane: true,
        };
        assert_eq!(Greeting::decode(&a.encode()), Ok(a));
        assert_eq!(Greeting::decode(&b.encode()), Ok(b));
        assert_eq!(b.encode()[5], GREETING_FLAG_LANE);
        let mut unknown_flag = b.encode();
        unknown_flag[5] = 0b10;
        assert_eq!(
            Greeting::decode(&unknown_flag),
            Err(HandshakeError::BadReserved)
        );
        let (ae, be) = (a.encode(), b.encode());
        let p = acceptor_proof(b"secret", &ae, &be);
        assert!(verify_acceptor_proof(b"secret", &ae, &be, &p).is_ok());
        assert!(verify_acceptor_proof(b"other", &ae, &be, &p).is_err());
        assert!(verify_connector_proof(b"secret", &ae, &be, &p).is_err());
        let mut bad = ae;
        bad[0] = b'X';
        assert_eq!(Greeting::decode(&bad), Err(HandshakeError::BadMagic));
    }

    fn arb_header() -> impl Strategy<Value = FrameHeader> {
        (
            prop_oneof![
                Just(Kind::Message),
                Just(Kind::Request),
                Just(Kind::Response)
            ],
            any::<bool>(),
            prop_oneof![
                Just(Fragment::Whole),
                Just(Fragment::More),
                Just(Fragment::Last)
            ],
            any::<u8>(),
            any::<u8>(),
            any::<u32>(),
            0u32..2000,
        )
            .prop_map(
                |(kind, ordered, fragment, type_id, subtype, message_id, payload_bytes)| {
                    FrameHeader {
                        kind,
                        ordered,
                        fragment,
                        type_id,
                        subtype,
                        message_id,
                        payload_bytes,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn header_round_trips(h in arb_header()) {
            prop_assert_eq!(FrameHeader::decode(&h.encode(), FRAME_PAYLOAD_BYTES_MAX), Ok(h));
        }

        /// Frames written back to back and cut into arbitrary read-sized pieces come out of
        /// the decoder whole, in order, with their payloads.
        #[test]
        fn decoder_reassembles_frames_across_arbitrary_read_boundaries(
            headers in proptest::collection::vec(arb_header(), 1..20),
            cuts in proptest::collection::vec(1usize..500, 1..50),
        ) {
            let mut stream = Vec::new();
            let mut expected = Vec::new();
            for (index, h) in headers.iter().enumerate() {
                let payload: Vec<u8> = (0..h.payload_bytes).map(|i| (i as usize + index) as u8).collect();
                stream.extend_from_slice(&h.encode());
                stream.extend_from_slice(&payload);
                expected.push(Frame { header: *h, payload: Bytes::from(payload) });
            }
            let decoder = FrameDecoder::default();
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            let mut rest = &stream[..];
            let mut cut = cuts.iter().cycle();
            while !rest.is_empty() {
                let n = (*cut.next().unwrap_or(&1)).min(rest.len());
                let (piece, tail) = rest.split_at(n);
                buf.extend_from_slice(piece);
                rest = tail;
                while let Some(frame) = decoder.decode(&mut buf)? {
                    got.push(frame);
                }
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(got, expected);
        }

        /// A payload cut into fragments the way a sender does (any fragment size) comes out
        /// of the reassembler whole, after exactly the last fragment.
        #[test]
        fn fragments_reassemble_to_the_original_payload(
            payload in proptest::collection::vec(any::<u8>(), 1..5000),
            fragment_bytes in 1usize..700,
            id in any::<u32>(),
        ) {
            let mut reassembler = Reassembler::new(5000);
            let pieces: Vec<&[u8]> = payload.chunks(fragment_bytes).collect();
            let mut completed = None;
            for (index, piece) in pieces.iter().enumerate() {
                // A sender sends a payload that fits one frame whole, never as one fragment.
                let fragment = match (pieces.len(), index + 1 == pieces.len()) {
                    (1, _) => Fragment::Whole,
                    (_, true) => Fragment::Last,
                    (_, false) => Fragment::More,
                };
                let frame = Frame {
                    header: FrameHeader { fragment, ..header(Kind::Response, fragment, id, piece.len() as u32) },
                    payload: Bytes::copy_from_slice(piece),
                };
                prop_assert!(completed.is_none(), "completed before the last fragment");
                completed = reassembler.push(frame)?;
            }
            let message = completed.ok_or_else(|| TestCaseError::fail("not completed"))?;
            prop_assert_eq!(&message.payload[..], &payload[..]);
            prop_assert_eq!(message.message_id, id);
            prop_assert_eq!(reassembler.buffered_bytes(), 0);
        }

        #[test]
        fn decoder_never_panics_on_garbage(input in proptest::collection::vec(any::<u8>(), 0..400)) {
            let decoder = FrameDecoder::new(256);
            let mut reassembler = Reassembler::new(1000);
            let mut buf = BytesMut::from(&input[..]);
            while let Ok(Some(frame)) = decoder.decode(&mut buf) {
                if reassembler.push(frame).is_err() {
                    break;
                }
            }
        }
    }
}
