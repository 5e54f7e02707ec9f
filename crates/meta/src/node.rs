//! Node records: who is in the cluster, in which role, where, and whether it is alive.

use myriad_mem::NodeId;

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
    pub(crate) fn code(self) -> u8 {
        match self {
            Role::Superpeer => 1,
            Role::Peer => 2,
            Role::Client => 3,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Role> {
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
