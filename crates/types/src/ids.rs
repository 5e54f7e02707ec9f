//! Node and chunk identifiers: a 64-bit CID is the creator's 16-bit node ID above a 48-bit
//! local ID. One definition for every layer (the memory manager, the messaging layer and
//! everything above name nodes and chunks with these types; no conversions between layers).

use std::fmt;
use std::str::FromStr;

/// A node's 16-bit identifier, assigned by the superpeer group when the node joins (the
/// same numbering as the creator field of a [`ChunkId`]; see [`crate::limits`] for the
/// assigned and provisional ranges). Displays as `0x` and four hex digits, e.g. `0x0001`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodeId(pub u16);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04x}", self.0)
    }
}

/// Number of bits of a CID that hold the local ID.
pub const LOCAL_ID_BITS: u32 = 48;
/// The largest local ID a node can hand out (2^48 - 1).
pub const LOCAL_ID_MAX: u64 = (1 << LOCAL_ID_BITS) - 1;

/// A chunk's 64-bit ID: `creator node ID (16 bits) | local ID (48 bits)`.
///
/// A chunk keeps its ID for its whole life, also after it was migrated or recovered onto a
/// node other than its creator. Local IDs are handed out sequentially and reused after a
/// remove, so the IDs of one creator form dense ranges.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(u64);

impl ChunkId {
    /// Builds a CID from its creator and local ID; `None` if `local_id` exceeds 48 bits.
    pub const fn new(creator: NodeId, local_id: u64) -> Option<ChunkId> {
        if local_id > LOCAL_ID_MAX {
            return None;
        }
        Some(ChunkId(((creator.0 as u64) << LOCAL_ID_BITS) | local_id))
    }

    /// Reinterprets a raw 64-bit value (every value is a syntactically valid CID).
    pub const fn from_raw(raw: u64) -> ChunkId {
        ChunkId(raw)
    }

    /// The raw 64-bit value.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The node that created the chunk.
    pub const fn creator(self) -> NodeId {
        NodeId((self.0 >> LOCAL_ID_BITS) as u16)
    }

    /// The local ID within the creator's ID space.
    pub const fn local_id(self) -> u64 {
        self.0 & LOCAL_ID_MAX
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ChunkId {
    /// Formats as `0x` and 16 hex digits, e.g. `0x0001000000000005`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:016x}", self.0)
    }
}

/// Error of parsing a [`ChunkId`] from text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid chunk ID {0:?}: expected 0x<hex>, <decimal> or <node>:<local id>")]
pub struct ParseChunkIdError(String);

impl FromStr for ChunkId {
    type Err = ParseChunkIdError;

    /// Accepts `0x<hex>`, a decimal number, or `<node>:<local id>` (each part decimal or
    /// `0x` hex).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || ParseChunkIdError(text.to_string());
        let number = |part: &str| -> Option<u64> {
            let part = part.trim();
            match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16).ok(),
                None => part.replace('_', "").parse().ok(),
            }
        };
        match text.split_once(':') {
            Some((node, local)) => {
                let node = u16::try_from(number(node).ok_or_else(bad)?).map_err(|_| bad())?;
                ChunkId::new(NodeId(node), number(local).ok_or_else(bad)?).ok_or_else(bad)
            }
            None => number(text).map(ChunkId).ok_or_else(bad),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip() {
        let cid = ChunkId::new(NodeId(0xBEEF), 0x1234_5678_9ABC).unwrap();
        assert_eq!(cid.creator(), NodeId(0xBEEF));
        assert_eq!(cid.local_id(), 0x1234_5678_9ABC);
        assert_eq!(cid.raw(), 0xBEEF_1234_5678_9ABC);
        assert_eq!(ChunkId::new(NodeId(1), LOCAL_ID_MAX + 1), None);
    }

    /// One text form for every node ID: the memory manager wrote `0x{:04x}`, the messaging
    /// layer `{:#06x}`; both give the same text for every `u16`, and so does the one type.
    #[test]
    fn node_ids_display_as_both_former_types_did() {
        for raw in 0..=u16::MAX {
            let text = NodeId(raw).to_string();
            assert_eq!(text, format!("0x{raw:04x}"));
            assert_eq!(text, format!("{raw:#06x}"));
        }
        assert_eq!(format!("{:?}", NodeId(7)), "NodeId(7)");
        assert_eq!(NodeId::default(), NodeId(0));
    }

    #[test]
    fn parses_every_documented_form() {
        let cid = ChunkId::new(NodeId(1), 5).unwrap();
        assert_eq!(cid.to_string(), "0x0001000000000005");
        for text in ["0x0001000000000005", "281474976710661", "1:5", "0x1:0x5"] {
            assert_eq!(text.parse::<ChunkId>(), Ok(cid), "{text}");
        }
        for text in ["", "x", "1:", "70000:1", "1:0x1000000000000", "0xzz"] {
            assert!(text.parse::<ChunkId>().is_err(), "{text}");
        }
    }
}
