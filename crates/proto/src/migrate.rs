//! Moving a range of chunks from one peer to another ([`crate::types::MIGRATE`]).
//!
//! The request goes to the peer that owns the range; it copies the chunks to the target
//! with an insert, commits the new owner through the superpeer group and drops its copies.

use bytes::Bytes;
use myriad_types::codec::{Decoder, Encoder};
use myriad_types::{ChunkId, NodeId};

use crate::ProtoError;

/// Move the chunks `first..=last` (one creator's CIDs) to peer `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateRequest {
    /// First CID of the range.
    pub first: ChunkId,
    /// Last CID of the range (inclusive, same creator as `first`).
    pub last: ChunkId,
    /// The new owner.
    pub to: NodeId,
}

/// The outcome of a [`MigrateRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrateReply {
    /// The range now belongs to the target; this many chunks were moved.
    Moved(u64),
    /// Nothing changed hands, for this reason.
    Failed(String),
}

impl MigrateRequest {
    /// The request's bytes: first CID, last CID (both u64 LE), target node (u16 LE).
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::with_capacity(18);
        encoder
            .put_u64_le(self.first.raw())
            .put_u64_le(self.last.raw())
            .put_u16_le(self.to.0);
        encoder.finish()
    }

    /// Decodes a request; fails on short or trailing bytes and on an invalid range.
    pub fn decode(payload: Bytes) -> Result<MigrateRequest, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let first = ChunkId::from_raw(decoder.get_u64_le("first CID")?);
        let last = ChunkId::from_raw(decoder.get_u64_le("last CID")?);
        let to = NodeId(decoder.get_u16_le("new owner")?);
        decoder.finish()?;
        if first.creator() != last.creator() || first > last {
            return Err(ProtoError::Invalid {
                what: "migration range",
                detail: format!("{first}..={last} is not an ascending range of one creator"),
            });
        }
        Ok(MigrateRequest { first, last, to })
    }
}

impl MigrateReply {
    /// The reply's bytes: tag 0 + count (varint), or tag 1 + reason (string).
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::new();
        match self {
            MigrateReply::Moved(count) => encoder.put_u8(0).put_varint(*count),
            MigrateReply::Failed(reason) => encoder.put_u8(1).put_str(reason),
        };
        encoder.finish()
    }

    /// Decodes a reply.
    pub fn decode(payload: Bytes) -> Result<MigrateReply, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let reply = match decoder.get_u8("migrate reply tag")? {
            0 => MigrateReply::Moved(decoder.get_varint("moved chunks")?),
            1 => MigrateReply::Failed(decoder.get_str("failure reason", usize::MAX)?.to_owned()),
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "migrate reply",
                    tag,
                })
            }
        };
        decoder.finish()?;
        Ok(reply)
    }
}

/// Runs every decoder of this family on `bytes` (for the fuzz target).
pub fn fuzz_decode(bytes: &[u8]) {
    let payload = Bytes::copy_from_slice(bytes);
    if let Ok(request) = MigrateRequest::decode(payload.clone()) {
        assert_eq!(request.encode(), payload);
    }
    if let Ok(reply) = MigrateReply::decode(payload.clone()) {
        assert_eq!(reply.encode(), payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_bad_ranges() {
        let request = MigrateRequest {
            first: ChunkId::from_raw(0x0002_0000_0000_0001),
            last: ChunkId::from_raw(0x0002_0000_0000_00ff),
            to: NodeId(7),
        };
        assert_eq!(
            MigrateRequest::decode(request.encode()),
            Ok(request.clone())
        );
        let crossing = MigrateRequest {
            last: ChunkId::from_raw(0x0003_0000_0000_0001),
            ..request.clone()
        };
        assert!(MigrateRequest::decode(crossing.encode()).is_err());
        let mut long = request.encode().to_vec();
        long.push(0);
        assert!(MigrateRequest::decode(Bytes::from(long)).is_err());
        for reply in [
            MigrateReply::Moved(12_345),
            MigrateReply::Failed("no".into()),
        ] {
            assert_eq!(MigrateReply::decode(reply.encode()), Ok(reply.clone()));
        }
        assert!(MigrateReply::decode(Bytes::from_static(&[9])).is_err());
    }
}
