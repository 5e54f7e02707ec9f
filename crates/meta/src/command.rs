//! The commands that change the metadata (the Raft log's payload), their responses and
//! errors, each with an explicit binary encoding (with [`myriad_types::codec`]).

use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::{ChunkId, NodeId};
use thiserror::Error;

use crate::limits::*;
use crate::node::{Capabilities, Role};

/// A change to the cluster metadata. Applied in log order by every superpeer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// A node joins; the group assigns its ID (or gives back `reclaim`, its previous one).
    Join {
        /// Superpeer, peer or client.
        role: Role,
        /// Where it listens.
        address: String,
        /// What it offers.
        capabilities: Capabilities,
        /// Rack number.
        rack: u16,
        /// Switch number.
        switch: u16,
        /// The ID this node held before (restart with its data, or a configured superpeer ID).
        reclaim: Option<NodeId>,
    },
    /// A node leaves in an orderly way.
    Leave {
        /// Who leaves.
        node: NodeId,
    },
    /// The failure verdict on a node; opens a new cluster epoch.
    Fail {
        /// Who failed.
        node: NodeId,
        /// The incarnation the verdict is about: if another incarnation of the node has
        /// joined since (a restart), the verdict is refused with `NodeNotAlive`, so it can
        /// never hit the new one. 0 means whichever incarnation is alive (verdicts logged
        /// before the field existed).
        incarnation: u32,
    },
    /// An operator lets a gone peer's ID go to new nodes.
    ReleaseId {
        /// The gone peer.
        node: NodeId,
    },
    /// LIDs `first..=last` of `creator` now live on `owner` (migration, recovery).
    SetOwner {
        /// Whose LIDs.
        creator: NodeId,
        /// First LID.
        first: u64,
        /// Last LID (inclusive).
        last: u64,
        /// The new owner.
        owner: NodeId,
    },
    /// Binds `name` to `cid`, replacing an earlier binding of the same name.
    NameRegister {
        /// The name (1 to [`NAME_BYTES_MAX`] bytes of UTF-8).
        name: String,
        /// The chunk.
        cid: ChunkId,
    },
    /// Removes a name.
    NameRemove {
        /// The name.
        name: String,
    },
    /// Allocates a barrier for `size` participants.
    BarrierAlloc {
        /// Participants per round.
        size: u32,
    },
    /// `node` signs on to barrier `id` with `value`; the round releases when all are in.
    BarrierSignOn {
        /// The barrier.
        id: u32,
        /// Who signs on.
        node: NodeId,
        /// A value every participant receives on release.
        value: u64,
    },
    /// Changes a barrier's participant count (releases the round if enough are in).
    BarrierResize {
        /// The barrier.
        id: u32,
        /// New participants per round.
        size: u32,
    },
    /// Frees a barrier.
    BarrierFree {
        /// The barrier.
        id: u32,
    },
    /// Stores a small named blob in temporary storage.
    TmpPut {
        /// The blob's name.
        name: String,
        /// Its content (at most [`TMP_BLOB_BYTES_MAX`] bytes).
        data: Vec<u8>,
        /// Fail with [`MetaError::TmpExists`] instead of replacing.
        create_only: bool,
    },
    /// Removes a blob from temporary storage.
    TmpRemove {
        /// The blob's name.
        name: String,
    },
    /// Records the ordered backup peers of one backup zone of `owner`.
    ZoneSet {
        /// The peer whose zone it is.
        owner: NodeId,
        /// The zone number within the owner.
        zone: u32,
        /// Backup peers, first backup first.
        backups: Vec<NodeId>,
    },
    /// A restorer takes over a backup zone it restored (issue 6, adoption): the zone keeps
    /// its log identity `(owner, zone)` (the log zone name on every backup) and is from now
    /// on *held* by `holder`, with `backups` as its new backup order (the zone's surviving
    /// backups first, then new ones). Refused unless the zone exists, `holder` is an alive
    /// peer other than `owner`, the backups are distinct known nodes other than `owner` and
    /// `holder`, and the zone either needs recovery
    /// ([`crate::MetaState::zone_needs_recovery`]) or is already held by `holder`'s current
    /// incarnation (a change of its backups).
    ZoneAdopt {
        /// The peer whose zone it was (the log owner).
        owner: NodeId,
        /// The zone number within the log owner.
        zone: u32,
        /// The restorer that holds the zone from now on.
        holder: NodeId,
        /// Backup peers, first backup first.
        backups: Vec<NodeId>,
    },
    /// The holder of an adopted zone committed the ownership of the zone's CIDs: the zone
    /// is settled ([`crate::MetaState::zone_settled`]). Refused unless `holder`'s current
    /// incarnation holds the zone.
    ZoneOwned {
        /// The log owner.
        owner: NodeId,
        /// The zone number within the log owner.
        zone: u32,
        /// The zone's holder.
        holder: NodeId,
    },
    /// `backup` now holds the whole zone: its copy (re-replication from the holder's
    /// memory) is complete. A backup is *filling* from the `ZoneSet` or `ZoneAdopt` that
    /// adds it to the zone's list until this command
    /// ([`crate::MetaState::zone_filling`]); recovery prefers backups that are not, and a
    /// restorer keeps only those as surviving backups. Refused unless `backup` is one of
    /// the zone's backups (already complete is fine).
    ZoneFilled {
        /// The log owner.
        owner: NodeId,
        /// The zone number within the log owner.
        zone: u32,
        /// The backup whose copy completed.
        backup: NodeId,
    },
    /// Forgets a backup zone (its owner left it behind, or recovery restored or lost it).
    ZoneRemove {
        /// The peer whose zone it is.
        owner: NodeId,
        /// The zone number.
        zone: u32,
    },
    /// Recovery's last step for a failed peer without zones left: every LID range still
    /// routed to `failed` (of its own IDs only those below its reserved local IDs) goes
    /// to the owner of a neighbouring range, else to `fallback`, in one step
    /// ([`crate::MetaState::leftover_ranges`]). Refused unless `failed` is still failed in
    /// `incarnation` and `fallback` is a known node.
    HandOver {
        /// The failed peer.
        failed: NodeId,
        /// Its incarnation that failed (a rejoined peer keeps what routes to it).
        incarnation: u32,
        /// Who takes ranges without a neighbouring owner.
        fallback: NodeId,
    },
    /// Peer `node` may hand out fresh local IDs below `up_to` (at most `LOCAL_ID_MAX + 1`).
    /// Committed before the IDs are handed out, so a later incarnation of the peer starts
    /// above every ID an earlier one used ([`crate::PeerBases::lids_reserved`]; never lowered).
    ReserveLids {
        /// The peer.
        node: NodeId,
        /// One past the highest local ID it may hand out.
        up_to: u64,
    },
}

/// What applying a [`Command`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The command took effect and has nothing to report.
    Done,
    /// A node joined.
    Joined {
        /// Its ID.
        id: NodeId,
        /// Its incarnation under that ID (1 for the first).
        incarnation: u32,
        /// The cluster epoch after the join.
        epoch: u64,
    },
    /// The cluster epoch after a membership change.
    Epoch(u64),
    /// A barrier was allocated.
    BarrierAllocated(u32),
    /// A sign-on or resize was recorded.
    Barrier(BarrierOutcome),
    /// The command was refused.
    Error(MetaError),
}

/// The state of a barrier round after a sign-on or resize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarrierOutcome {
    /// The round the sign-on counted for.
    pub round: u64,
    /// Participants signed on to that round so far.
    pub signed: u32,
    /// Participants the round needs.
    pub size: u32,
    /// When this call completed the round: every participant's value, by node.
    pub released: Option<Vec<(NodeId, u64)>>,
}

/// Why a command was refused. Deterministic: every superpeer refuses the same way.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MetaError {
    /// Every assignable node ID (1 to [`NODE_ID_MAX`]) is taken.
    #[error("no node ID is free")]
    NodeIdsExhausted,
    /// No node has this ID.
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    /// The node is not alive (failed or left).
    #[error("node {0} is not alive")]
    NodeNotAlive(NodeId),
    /// The node is alive (it must be gone first).
    #[error("node {0} is still alive")]
    NodeAlive(NodeId),
    /// A reclaimed ID belongs to a node of another role, or to another live node.
    #[error("node ID {0} cannot be reclaimed by this node")]
    ReclaimRefused(NodeId),
    /// An argument is outside its allowed range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The name has no binding.
    #[error("name not found: {0}")]
    NameNotFound(String),
    /// The nameservice is full.
    #[error("the nameservice holds the maximum of {NAMES_MAX} names")]
    NamesFull,
    /// No barrier has this ID.
    #[error("barrier {0} not found")]
    BarrierNotFound(u32),
    /// Too many barriers are allocated.
    #[error("the maximum of {BARRIERS_MAX} barriers is allocated")]
    BarriersFull,
    /// The node already signed on to the current round.
    #[error("node {0} already signed on to this round")]
    AlreadySignedOn(NodeId),
    /// No blob has this name.
    #[error("temporary blob not found: {0}")]
    TmpNotFound(String),
    /// A blob with this name exists (create-only put).
    #[error("temporary blob exists: {0}")]
    TmpExists(String),
    /// Temporary storage is full.
    #[error("temporary storage is full ({TMP_TOTAL_BYTES_MAX} bytes)")]
    TmpFull,
    /// No such backup zone.
    #[error("zone {zone} of {owner} not found")]
    ZoneNotFound {
        /// The zone's owner.
        owner: NodeId,
        /// The zone number.
        zone: u32,
    },
}

/// A short one-line description for logs (names and addresses in full, blob contents by size).
impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Join {
                role,
                address,
                reclaim,
                ..
            } => match reclaim {
                Some(id) => write!(f, "join {role:?} {address} reclaiming {id}"),
                None => write!(f, "join {role:?} {address}"),
            },
            Command::Leave { node } => write!(f, "leave {node}"),
            Command::Fail {
                node,
                incarnation: 0,
            } => write!(f, "fail {node}"),
            Command::Fail { node, incarnation } => {
                write!(f, "fail {node} incarnation {incarnation}")
            }
            Command::ReleaseId { node } => write!(f, "release-id {node}"),
            Command::SetOwner {
                creator,
                first,
                last,
                owner,
            } => write!(f, "set-owner {creator} {first:#x}..={last:#x} -> {owner}"),
            Command::NameRegister { name, cid } => write!(f, "name-register {name:?} {cid}"),
            Command::NameRemove { name } => write!(f, "name-remove {name:?}"),
            Command::BarrierAlloc { size } => write!(f, "barrier-alloc {size}"),
            Command::BarrierSignOn { id, node, value } => {
                write!(f, "barrier-sign-on {id} {node} {value:#x}")
            }
            Command::BarrierResize { id, size } => write!(f, "barrier-resize {id} {size}"),
            Command::BarrierFree { id } => write!(f, "barrier-free {id}"),
            Command::TmpPut {
                name,
                data,
                create_only,
            } => write!(
                f,
                "tmp-put {name:?} {} bytes{}",
                data.len(),
                if *create_only { " create-only" } else { "" }
            ),
            Command::TmpRemove { name } => write!(f, "tmp-remove {name:?}"),
            Command::ZoneSet {
                owner,
                zone,
                backups,
            } => {
                write!(f, "zone-set {owner}/{zone} backups")?;
                for backup in backups {
                    write!(f, " {backup}")?;
                }
                Ok(())
            }
            Command::ZoneAdopt {
                owner,
                zone,
                holder,
                backups,
            } => {
                write!(f, "zone-adopt {owner}/{zone} by {holder} backups")?;
                for backup in backups {
                    write!(f, " {backup}")?;
                }
                Ok(())
            }
            Command::ZoneOwned {
                owner,
                zone,
                holder,
            } => write!(f, "zone-owned {owner}/{zone} by {holder}"),
            Command::ZoneFilled {
                owner,
                zone,
                backup,
            } => write!(f, "zone-filled {owner}/{zone} on {backup}"),
            Command::ZoneRemove { owner, zone } => write!(f, "zone-remove {owner}/{zone}"),
            Command::ReserveLids { node, up_to } => {
                write!(f, "reserve-lids {node} below {up_to:#x}")
            }
            Command::HandOver {
                failed,
                incarnation,
                fallback,
            } => write!(f, "hand-over {failed}#{incarnation} fallback {fallback}"),
        }
    }
}

fn node(reader: &mut Decoder<'_>, what: &'static str) -> Result<NodeId, DecodeError> {
    Ok(NodeId(reader.get_varint_u16(what)?))
}

fn string(reader: &mut Decoder<'_>, what: &'static str, max: usize) -> Result<String, DecodeError> {
    Ok(reader.get_str(what, max)?.to_owned())
}

impl Command {
    /// Appends the encoding of this command: its tag, then its fields. One step per
    /// group of commands; every variant has one arm in exactly one of them.
    pub fn encode(&self, out: &mut Encoder) {
        match self {
            Command::Join { .. }
            | Command::Leave { .. }
            | Command::Fail { .. }
            | Command::ReleaseId { .. }
            | Command::ReserveLids { .. }
            | Command::HandOver { .. } => self.encode_membership(out),
            Command::SetOwner { .. }
            | Command::NameRegister { .. }
            | Command::NameRemove { .. }
            | Command::TmpPut { .. }
            | Command::TmpRemove { .. } => self.encode_directory(out),
            Command::BarrierAlloc { .. }
            | Command::BarrierSignOn { .. }
            | Command::BarrierResize { .. }
            | Command::BarrierFree { .. } => self.encode_barrier(out),
            Command::ZoneSet { .. }
            | Command::ZoneRemove { .. }
            | Command::ZoneAdopt { .. }
            | Command::ZoneOwned { .. }
            | Command::ZoneFilled { .. } => self.encode_zone(out),
        }
    }

    /// [`Command::encode`] for a membership command (joins, leaves, failures, hand-overs,
    /// reserved local IDs).
    fn encode_membership(&self, out: &mut Encoder) {
        match self {
            Command::Join {
                role,
                address,
                capabilities,
                rack,
                switch,
                reclaim,
            } => {
                out.put_u8(1);
                out.put_u8(role.code());
                out.put_str(address);
                out.put_u8(capabilities.0);
                out.put_varint(u64::from(*rack));
                out.put_varint(u64::from(*switch));
                match reclaim {
                    Some(id) => {
                        out.put_u8(1);
                        out.put_varint(u64::from(id.0));
                    }
                    None => {
                        out.put_u8(0);
                    }
                }
            }
            Command::Leave { node } => {
                out.put_u8(2);
                out.put_varint(u64::from(node.0));
            }
            // Tag 3 is the verdict on any incarnation (the older form), 24 names one.
            Command::Fail {
                node,
                incarnation: 0,
            } => {
                out.put_u8(3);
                out.put_varint(u64::from(node.0));
            }
            Command::Fail { node, incarnation } => {
                out.put_u8(24);
                out.put_varint(u64::from(node.0));
                out.put_varint(u64::from(*incarnation));
            }
            Command::ReleaseId { node } => {
                out.put_u8(4);
                out.put_varint(u64::from(node.0));
            }
            Command::ReserveLids { node, up_to } => {
                out.put_u8(16);
                out.put_varint(u64::from(node.0));
                out.put_varint(*up_to);
            }
            Command::HandOver {
                failed,
                incarnation,
                fallback,
            } => {
                out.put_u8(17);
                out.put_varint(u64::from(failed.0));
                out.put_varint(u64::from(*incarnation));
                out.put_varint(u64::from(fallback.0));
            }
            other => unreachable!("`Command::encode` routes {other:?} elsewhere"),
        }
    }

    /// [`Command::encode`] for a directory command (CID owners, the name service, the
    /// temporary store).
    fn encode_directory(&self, out: &mut Encoder) {
        match self {
            Command::SetOwner {
                creator,
                first,
                last,
                owner,
            } => {
                out.put_u8(5);
                out.put_varint(u64::from(creator.0));
                out.put_varint(*first);
                out.put_varint(*last);
                out.put_varint(u64::from(owner.0));
            }
            Command::NameRegister { name, cid } => {
                out.put_u8(6);
                out.put_str(name);
                out.put_u64_le(cid.raw());
            }
            Command::NameRemove { name } => {
                out.put_u8(7);
                out.put_str(name);
            }
            Command::TmpPut {
                name,
                data,
                create_only,
            } => {
                out.put_u8(12);
                out.put_str(name);
                out.put_bytes(data);
                out.put_bool(*create_only);
            }
            Command::TmpRemove { name } => {
                out.put_u8(13);
                out.put_str(name);
            }
            other => unreachable!("`Command::encode` routes {other:?} elsewhere"),
        }
    }

    /// [`Command::encode`] for a barrier command.
    fn encode_barrier(&self, out: &mut Encoder) {
        match self {
            Command::BarrierAlloc { size } => {
                out.put_u8(8);
                out.put_varint(u64::from(*size));
            }
            Command::BarrierSignOn { id, node, value } => {
                out.put_u8(9);
                out.put_varint(u64::from(*id));
                out.put_varint(u64::from(node.0));
                out.put_u64_le(*value);
            }
            Command::BarrierResize { id, size } => {
                out.put_u8(10);
                out.put_varint(u64::from(*id));
                out.put_varint(u64::from(*size));
            }
            Command::BarrierFree { id } => {
                out.put_u8(11);
                out.put_varint(u64::from(*id));
            }
            other => unreachable!("`Command::encode` routes {other:?} elsewhere"),
        }
    }

    /// [`Command::encode`] for a backup-zone command (backups, adoptions, holders).
    fn encode_zone(&self, out: &mut Encoder) {
        match self {
            Command::ZoneSet {
                owner,
                zone,
                backups,
            } => {
                out.put_u8(14);
                out.put_varint(u64::from(owner.0));
                out.put_varint(u64::from(*zone));
                out.put_varint(backups.len() as u64);
                for backup in backups {
                    out.put_varint(u64::from(backup.0));
                }
            }
            Command::ZoneRemove { owner, zone } => {
                out.put_u8(15);
                out.put_varint(u64::from(owner.0));
                out.put_varint(u64::from(*zone));
            }
            Command::ZoneAdopt {
                owner,
                zone,
                holder,
                backups,
            } => {
                out.put_u8(18);
                out.put_varint(u64::from(owner.0));
                out.put_varint(u64::from(*zone));
                out.put_varint(u64::from(holder.0));
                out.put_varint(backups.len() as u64);
                for backup in backups {
                    out.put_varint(u64::from(backup.0));
                }
            }
            Command::ZoneOwned {
                owner,
                zone,
                holder,
            } => {
                out.put_u8(19);
                out.put_varint(u64::from(owner.0));
                out.put_varint(u64::from(*zone));
                out.put_varint(u64::from(holder.0));
            }
            Command::ZoneFilled {
                owner,
                zone,
                backup,
            } => {
                out.put_u8(20);
                out.put_varint(u64::from(owner.0));
                out.put_varint(u64::from(*zone));
                out.put_varint(u64::from(backup.0));
            }
            other => unreachable!("`Command::encode` routes {other:?} elsewhere"),
        }
    }

    /// The encoding as a new byte vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut writer = Encoder::new();
        self.encode(&mut writer);
        writer.into_vec()
    }

    /// Decodes a command that fills all of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Command, DecodeError> {
        let mut reader = Decoder::from_slice(bytes);
        let command = Command::decode(&mut reader)?;
        reader.finish()?;
        Ok(command)
    }

    /// Decodes one command.
    pub fn decode(reader: &mut Decoder<'_>) -> Result<Command, DecodeError> {
        let tag = reader.get_u8("command tag")?;
        Ok(match tag {
            1 => {
                let code = reader.get_u8("role")?;
                let role = Role::from_code(code).ok_or(DecodeError::UnknownTag {
                    what: "role",
                    tag: u64::from(code),
                })?;
                let address = string(reader, "address", ADDRESS_BYTES_MAX)?;
                let capabilities = Capabilities(reader.get_u8("capabilities")?);
                let rack = reader.get_varint_u16("rack")?;
                let switch = reader.get_varint_u16("switch")?;
                let reclaim = if reader.get_bool("reclaim flag")? {
                    Some(node(reader, "reclaim")?)
                } else {
                    None
                };
                Command::Join {
                    role,
                    address,
                    capabilities,
                    rack,
                    switch,
                    reclaim,
                }
            }
            2 => Command::Leave {
                node: node(reader, "node")?,
            },
            3 => Command::Fail {
                node: node(reader, "node")?,
                incarnation: 0,
            },
            24 => {
                let node = node(reader, "node")?;
                // Incarnation 0 is written with tag 3; accepting it here would give one
                // command two encodings.
                let incarnation = reader.get_varint_u32("incarnation")?;
                if incarnation == 0 {
                    return Err(DecodeError::Invalid("fail verdict naming incarnation 0"));
                }
                Command::Fail { node, incarnation }
            }
            4 => Command::ReleaseId {
                node: node(reader, "node")?,
            },
            5 => Command::SetOwner {
                creator: node(reader, "creator")?,
                first: reader.get_varint("first")?,
                last: reader.get_varint("last")?,
                owner: node(reader, "owner")?,
            },
            6 => Command::NameRegister {
                name: string(reader, "name", NAME_BYTES_MAX)?,
                cid: ChunkId::from_raw(reader.get_u64_le("cid")?),
            },
            7 => Command::NameRemove {
                name: string(reader, "name", NAME_BYTES_MAX)?,
            },
            8 => Command::BarrierAlloc {
                size: reader.get_varint_u32("size")?,
            },
            9 => Command::BarrierSignOn {
                id: reader.get_varint_u32("barrier")?,
                node: node(reader, "node")?,
                value: reader.get_u64_le("value")?,
            },
            10 => Command::BarrierResize {
                id: reader.get_varint_u32("barrier")?,
                size: reader.get_varint_u32("size")?,
            },
            11 => Command::BarrierFree {
                id: reader.get_varint_u32("barrier")?,
            },
            12 => Command::TmpPut {
                name: string(reader, "tmp name", NAME_BYTES_MAX)?,
                data: reader.get_slice("tmp data", TMP_BLOB_BYTES_MAX)?.to_vec(),
                create_only: reader.get_bool("create only")?,
            },
            13 => Command::TmpRemove {
                name: string(reader, "tmp name", NAME_BYTES_MAX)?,
            },
            14 => {
                let owner = node(reader, "owner")?;
                let zone = reader.get_varint_u32("zone")?;
                let count = reader.get_count("backups", 1, BACKUPS_PER_ZONE_MAX)?;
                let mut backups = Vec::with_capacity(count);
                for _ in 0..count {
                    backups.push(node(reader, "backup")?);
                }
                Command::ZoneSet {
                    owner,
                    zone,
                    backups,
                }
            }
            15 => Command::ZoneRemove {
                owner: node(reader, "owner")?,
                zone: reader.get_varint_u32("zone")?,
            },
            16 => Command::ReserveLids {
                node: node(reader, "node")?,
                up_to: reader.get_varint("up to")?,
            },
            17 => Command::HandOver {
                failed: node(reader, "failed")?,
                incarnation: reader.get_varint_u32("incarnation")?,
                fallback: node(reader, "fallback")?,
            },
            19 => Command::ZoneOwned {
                owner: node(reader, "owner")?,
                zone: reader.get_varint_u32("zone")?,
                holder: node(reader, "holder")?,
            },
            20 => Command::ZoneFilled {
                owner: node(reader, "owner")?,
                zone: reader.get_varint_u32("zone")?,
                backup: node(reader, "backup")?,
            },
            18 => {
                let owner = node(reader, "owner")?;
                let zone = reader.get_varint_u32("zone")?;
                let holder = node(reader, "holder")?;
                let count = reader.get_count("backups", 1, BACKUPS_PER_ZONE_MAX)?;
                let mut backups = Vec::with_capacity(count);
                for _ in 0..count {
                    backups.push(node(reader, "backup")?);
                }
                Command::ZoneAdopt {
                    owner,
                    zone,
                    holder,
                    backups,
                }
            }
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "command",
                    tag: u64::from(tag),
                })
            }
        })
    }
}

impl MetaError {
    fn encode(&self, out: &mut Encoder) {
        match self {
            MetaError::NodeIdsExhausted => {
                out.put_u8(1);
            }
            MetaError::UnknownNode(id) => {
                out.put_u8(2);
                out.put_varint(u64::from(id.0));
            }
            MetaError::NodeNotAlive(id) => {
                out.put_u8(3);
                out.put_varint(u64::from(id.0));
            }
            MetaError::NodeAlive(id) => {
                out.put_u8(4);
                out.put_varint(u64::from(id.0));
            }
            MetaError::ReclaimRefused(id) => {
                out.put_u8(5);
                out.put_varint(u64::from(id.0));
            }
            MetaError::InvalidArgument(text) => {
                out.put_u8(6);
                out.put_str(text);
            }
            MetaError::NameNotFound(name) => {
                out.put_u8(7);
                out.put_str(name);
            }
            MetaError::NamesFull => {
                out.put_u8(8);
            }
            MetaError::BarrierNotFound(id) => {
                out.put_u8(9);
                out.put_varint(u64::from(*id));
            }
            MetaError::BarriersFull => {
                out.put_u8(10);
            }
            MetaError::AlreadySignedOn(id) => {
                out.put_u8(11);
                out.put_varint(u64::from(id.0));
            }
            MetaError::TmpNotFound(name) => {
                out.put_u8(12);
                out.put_str(name);
            }
            MetaError::TmpExists(name) => {
                out.put_u8(13);
                out.put_str(name);
            }
            MetaError::TmpFull => {
                out.put_u8(14);
            }
            MetaError::ZoneNotFound { owner, zone } => {
                out.put_u8(15);
                out.put_varint(u64::from(owner.0));
                out.put_varint(u64::from(*zone));
            }
        }
    }

    fn decode(reader: &mut Decoder<'_>) -> Result<MetaError, DecodeError> {
        const TEXT_MAX: usize = 4096;
        Ok(match reader.get_u8("error tag")? {
            1 => MetaError::NodeIdsExhausted,
            2 => MetaError::UnknownNode(node(reader, "node")?),
            3 => MetaError::NodeNotAlive(node(reader, "node")?),
            4 => MetaError::NodeAlive(node(reader, "node")?),
            5 => MetaError::ReclaimRefused(node(reader, "node")?),
            6 => MetaError::InvalidArgument(string(reader, "text", TEXT_MAX)?),
            7 => MetaError::NameNotFound(string(reader, "name", TEXT_MAX)?),
            8 => MetaError::NamesFull,
            9 => MetaError::BarrierNotFound(reader.get_varint_u32("barrier")?),
            10 => MetaError::BarriersFull,
            11 => MetaError::AlreadySignedOn(node(reader, "node")?),
            12 => MetaError::TmpNotFound(string(reader, "name", TEXT_MAX)?),
            13 => MetaError::TmpExists(string(reader, "name", TEXT_MAX)?),
            14 => MetaError::TmpFull,
            15 => MetaError::ZoneNotFound {
                owner: node(reader, "owner")?,
                zone: reader.get_varint_u32("zone")?,
            },
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "error",
                    tag: u64::from(tag),
                })
            }
        })
    }
}

impl Response {
    /// Appends the encoding of this response.
    pub fn encode(&self, out: &mut Encoder) {
        match self {
            Response::Done => {
                out.put_u8(1);
            }
            Response::Joined {
                id,
                incarnation,
                epoch,
            } => {
                out.put_u8(2);
                out.put_varint(u64::from(id.0));
                out.put_varint(u64::from(*incarnation));
                out.put_varint(*epoch);
            }
            Response::Epoch(epoch) => {
                out.put_u8(3);
                out.put_varint(*epoch);
            }
            Response::BarrierAllocated(id) => {
                out.put_u8(4);
                out.put_varint(u64::from(*id));
            }
            Response::Barrier(outcome) => {
                out.put_u8(5);
                out.put_varint(outcome.round);
                out.put_varint(u64::from(outcome.signed));
                out.put_varint(u64::from(outcome.size));
                match &outcome.released {
                    Some(values) => {
                        out.put_u8(1);
                        out.put_varint(values.len() as u64);
                        for (node, value) in values {
                            out.put_varint(u64::from(node.0));
                            out.put_u64_le(*value);
                        }
                    }
                    None => {
                        out.put_u8(0);
                    }
                }
            }
            Response::Error(error) => {
                out.put_u8(6);
                error.encode(out);
            }
        }
    }

    /// The encoding as a new byte vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut writer = Encoder::new();
        self.encode(&mut writer);
        writer.into_vec()
    }

    /// Decodes a response that fills all of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Response, DecodeError> {
        let mut reader = Decoder::from_slice(bytes);
        let response = Response::decode(&mut reader)?;
        reader.finish()?;
        Ok(response)
    }

    /// Decodes one response.
    pub fn decode(reader: &mut Decoder<'_>) -> Result<Response, DecodeError> {
        Ok(match reader.get_u8("response tag")? {
            1 => Response::Done,
            2 => Response::Joined {
                id: node(reader, "node")?,
                incarnation: reader.get_varint_u32("incarnation")?,
                epoch: reader.get_varint("epoch")?,
            },
            3 => Response::Epoch(reader.get_varint("epoch")?),
            4 => Response::BarrierAllocated(reader.get_varint_u32("barrier")?),
            5 => {
                let round = reader.get_varint("round")?;
                let signed = reader.get_varint_u32("signed")?;
                let size = reader.get_varint_u32("size")?;
                let released = if reader.get_bool("released flag")? {
                    let count = reader.get_count("values", 9, BARRIER_SIZE_MAX as usize)?;
                    let mut values = Vec::with_capacity(count);
                    for _ in 0..count {
                        values.push((node(reader, "node")?, reader.get_u64_le("value")?));
                    }
                    Some(values)
                } else {
                    None
                };
                Response::Barrier(BarrierOutcome {
                    round,
                    signed,
                    size,
                    released,
                })
            }
            6 => Response::Error(MetaError::decode(reader)?),
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "response",
                    tag: u64::from(tag),
                })
            }
        })
    }
}
