//! Node records: who is in the cluster, in which role, where, and whether it is alive, and
//! the one encoding of a record ([`NodeRecord::encode`], in the two frozen layouts of
//! [`RecordLayout`]).

use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::limits::ADDRESS_BYTES_MAX;
use myriad_types::NodeId;

/// What a node does in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// A member of the superpeer (Raft) group.
    Superpeer,
    /// A peer: stores chunks, serves remote access, backs up others, computes.
    Peer,
    /// A client: uses the store, holds no data.
    Client,
}

impl Role {
    /// The role's byte in every encoding (1 superpeer, 2 peer, 3 client).
    pub fn code(self) -> u8 {
        match self {
            Role::Superpeer => 1,
            Role::Peer => 2,
            Role::Client => 3,
        }
    }

    /// The role a [`Role::code`] byte names, if any.
    pub fn from_code(code: u8) -> Option<Role> {
        match code {
            1 => Some(Role::Superpeer),
            2 => Some(Role::Peer),
            3 => Some(Role::Client),
            _ => None,
        }
    }
}

/// What a peer offers, as bit flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities(pub u8);

impl Capabilities {
    /// Stores chunks in memory.
    pub const STORAGE: Capabilities = Capabilities(1);
    /// Keeps backup logs for other peers.
    pub const BACKUP: Capabilities = Capabilities(2);
    /// Runs compute jobs.
    pub const COMPUTE: Capabilities = Capabilities(4);
    /// Every capability a peer can have.
    pub const ALL: Capabilities = Capabilities(7);

    /// Whether every flag of `other` is set here.
    pub fn contains(self, other: Capabilities) -> bool {
        self.0 & other.0 == other.0
    }
}

/// Whether a node takes part in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Joined and not known to have failed.
    Alive,
    /// Declared failed in the given cluster epoch.
    Failed {
        /// The epoch that the failure verdict opened.
        epoch: u64,
    },
    /// Left the cluster in an orderly way.
    Left,
}

/// Everything the cluster knows about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// The node's ID.
    pub id: NodeId,
    /// Its role.
    pub role: Role,
    /// Where it listens (`host:port`).
    pub address: String,
    /// What it offers (peers).
    pub capabilities: Capabilities,
    /// Rack number, for rack-aware backup placement.
    pub rack: u16,
    /// Switch number, for placement.
    pub switch: u16,
    /// Alive, failed or left.
    pub state: NodeState,
    /// Counts the process incarnations that held this ID (1 for the first).
    pub incarnation: u32,
    /// The cluster epoch when the current incarnation joined.
    pub joined_epoch: u64,
    /// For peers: an operator released the ID, so it may go to a new node even though
    /// chunks created under it may still exist elsewhere.
    pub released: bool,
}

impl NodeRecord {
    /// Whether a new, unrelated node may take this ID. Peers' IDs name the creator of their
    /// chunks, which outlive the peer (recovered or migrated chunks keep their CIDs), so a
    /// peer's ID goes to a stranger only after an operator released it; clients' and
    /// superpeers' IDs are free once the node is gone.
    pub fn reusable(&self) -> bool {
        self.state != NodeState::Alive && (self.role != Role::Peer || self.released)
    }
}

/// The byte layout of a [`NodeRecord`]. Both layouts are frozen formats: the snapshot
/// layout is on disk (Raft snapshots of the metadata), the wire layout is in the cluster
/// protocol (node lists, join replies, join events). Fields come in the same order in both:
///
/// | field | [`Snapshot`](RecordLayout::Snapshot) | [`Wire`](RecordLayout::Wire) |
/// |---|---|---|
/// | id | varint | u16 little-endian |
/// | role | byte ([`Role::code`]) | same |
/// | address | length-prefixed UTF-8, at most [`ADDRESS_BYTES_MAX`] | same |
/// | capabilities | byte | same |
/// | rack, switch | varint each | u16 little-endian each |
/// | state | byte 0 alive, 1 failed + varint epoch, 2 left | 1 alive, 2 failed + varint epoch, 3 left |
/// | incarnation | varint (32 bits) | same |
/// | joined epoch | varint | same |
/// | released | byte 0 or 1 | same |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordLayout {
    /// Inside a metadata snapshot ([`crate::MetaState::snapshot`]).
    Snapshot,
    /// Inside a cluster-protocol message (`myriad-proto`).
    Wire,
}

impl RecordLayout {
    fn put_u16(self, out: &mut Encoder, value: u16) {
        match self {
            RecordLayout::Snapshot => out.put_varint(u64::from(value)),
            RecordLayout::Wire => out.put_u16_le(value),
        };
    }

    fn get_u16(self, input: &mut Decoder<'_>, what: &'static str) -> Result<u16, DecodeError> {
        match self {
            RecordLayout::Snapshot => input.get_varint_u16(what),
            RecordLayout::Wire => input.get_u16_le(what),
        }
    }

    /// The byte of a node state: the wire layout counts from 1.
    fn state_base(self) -> u8 {
        match self {
            RecordLayout::Snapshot => 0,
            RecordLayout::Wire => 1,
        }
    }
}

impl NodeRecord {
    /// Appends the record in `layout`.
    pub fn encode(&self, out: &mut Encoder, layout: RecordLayout) {
        layout.put_u16(out, self.id.0);
        out.put_u8(self.role.code());
        out.put_str(&self.address);
        out.put_u8(self.capabilities.0);
        layout.put_u16(out, self.rack);
        layout.put_u16(out, self.switch);
        let base = layout.state_base();
        match self.state {
            NodeState::Alive => {
                out.put_u8(base);
            }
            NodeState::Failed { epoch } => {
                out.put_u8(base + 1).put_varint(epoch);
            }
            NodeState::Left => {
                out.put_u8(base + 2);
            }
        }
        out.put_varint(u64::from(self.incarnation));
        out.put_varint(self.joined_epoch);
        out.put_bool(self.released);
    }

    /// Reads a record written by [`NodeRecord::encode`] in the same `layout`.
    pub fn decode(
        input: &mut Decoder<'_>,
        layout: RecordLayout,
    ) -> Result<NodeRecord, DecodeError> {
        let id = NodeId(layout.get_u16(input, "node")?);
        let code = input.get_u8("role")?;
        let role = Role::from_code(code).ok_or(DecodeError::UnknownTag {
            what: "role",
            tag: u64::from(code),
        })?;
        let address = input.get_str("address", ADDRESS_BYTES_MAX)?.to_owned();
        let capabilities = Capabilities(input.get_u8("capabilities")?);
        let rack = layout.get_u16(input, "rack")?;
        let switch = layout.get_u16(input, "switch")?;
        let tag = input.get_u8("node state")?;
        let state = match tag.checked_sub(layout.state_base()) {
            Some(0) => NodeState::Alive,
            Some(1) => NodeState::Failed {
                epoch: input.get_varint("failed epoch")?,
            },
            Some(2) => NodeState::Left,
            _ => {
                return Err(DecodeError::UnknownTag {
                    what: "node state",
                    tag: u64::from(tag),
                })
            }
        };
        Ok(NodeRecord {
            id,
            role,
            address,
            capabilities,
            rack,
            switch,
            state,
            incarnation: input.get_varint_u32("incarnation")?,
            joined_epoch: input.get_varint("joined epoch")?,
            released: input.get_bool("released")?,
        })
    }
}

/// Where a peer's current incarnation starts in its own number spaces, and how far all
/// its incarnations reached. A restarted peer (same ID, new incarnation) numbers its zones
/// from `zone_base` and hands out fresh local IDs from `lid_base`, so nothing it creates
/// collides with what its earlier incarnations left in the backups' logs; the zones below
/// `zone_base` still in the zone table are recovered like a failed peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerBases {
    /// First zone number of the current incarnation.
    pub zone_base: u32,
    /// One past the highest zone number any incarnation registered (`ZoneSet`).
    pub zones_end: u32,
    /// First fresh local ID of the current incarnation.
    pub lid_base: u64,
    /// Local IDs below this may have been handed out by some incarnation (raised by
    /// `ReserveLids` before the peer hands them out).
    pub lids_reserved: u64,
}
