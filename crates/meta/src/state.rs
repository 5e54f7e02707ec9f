//! The replicated state machine: every superpeer applies the same [`Command`]s in the same
//! order to a [`MetaState`] and so holds the same metadata.
//!
//! Invariants: applying is deterministic (no clock, no randomness, ordered maps only); a
//! refused command changes nothing; every collection is bounded by [`crate::limits`].

use std::collections::{BTreeMap, BTreeSet};

use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::{ChunkId, NodeId, LOCAL_ID_MAX};

use crate::command::{BarrierOutcome, Command, MetaError, Response};
use crate::limits::*;
use crate::lookup::{LookupRange, LookupTree};
use crate::node::{Capabilities, NodeRecord, NodeState, PeerBases, RecordLayout, Role};

/// Version byte at the start of a snapshot (version 1, without peer bases, version 2,
/// without zone holders, and version 3, without filling backups, still decode).
const SNAPSHOT_VERSION: u8 = 4;

/// One entry of the zone table: a backup zone named by its log identity `(owner, zone)`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ZoneEntry {
    /// Backup peers, first backup first.
    backups: Vec<NodeId>,
    /// The peer holding the zone's chunks, with its incarnation, when it is not the log
    /// owner (the zone was adopted by its restorer, `Command::ZoneAdopt`).
    holder: Option<(NodeId, u32)>,
    /// The holder committed the ownership of the zone's CIDs (`Command::ZoneOwned`); until
    /// then the zone is [unsettled](MetaState::zone_settled).
    owned: bool,
    /// Backups of `backups` whose copy of the zone is not complete yet (added to the list
    /// and not yet `Command::ZoneFilled`), in list order.
    filling: Vec<NodeId>,
}

impl ZoneEntry {
    /// The filling backups after the list changes from `self.backups` to `backups`: those
    /// still filling, and every backup new to the list.
    fn filling_after(&self, backups: &[NodeId]) -> Vec<NodeId> {
        backups
            .iter()
            .copied()
            .filter(|b| !self.backups.contains(b) || self.filling.contains(b))
            .collect()
    }
}

/// One barrier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Barrier {
    /// Participants per round.
    pub size: u32,
    /// Rounds released so far.
    pub round: u64,
    /// Sign-ons of the current round.
    pub signed: BTreeMap<NodeId, u64>,
    /// The values of the last released round.
    pub last_released: Vec<(NodeId, u64)>,
}

/// The whole cluster metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaState {
    epoch: u64,
    nodes: BTreeMap<NodeId, NodeRecord>,
    lookup: BTreeMap<NodeId, LookupTree>,
    names: BTreeMap<String, ChunkId>,
    barriers: BTreeMap<u32, Barrier>,
    next_barrier: u32,
    tmp: BTreeMap<String, Vec<u8>>,
    tmp_bytes: usize,
    zones: BTreeMap<(NodeId, u32), ZoneEntry>,
    bases: BTreeMap<NodeId, PeerBases>,
}

fn check_name(name: &str) -> Result<(), MetaError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(MetaError::InvalidArgument(format!(
            "names have 1 to {NAME_BYTES_MAX} bytes, got {}",
            name.len()
        )));
    }
    Ok(())
}

impl MetaState {
    /// An empty cluster in epoch 0.
    pub fn new() -> MetaState {
        MetaState::default()
    }

    /// Applies one command; a refused command leaves the state unchanged.
    pub fn apply(&mut self, command: &Command) -> Response {
        let result = match command {
            Command::Join {
                role,
                address,
                capabilities,
                rack,
                switch,
                reclaim,
            } => self.join(*role, address, *capabilities, *rack, *switch, *reclaim),
            Command::Leave { node } => self.set_gone(*node, NodeState::Left),
            Command::Fail { node, incarnation } => {
                let stale = *incarnation != 0
                    && self
                        .nodes
                        .get(node)
                        .is_some_and(|record| record.incarnation != *incarnation);
                if stale {
                    // The verdict was about an incarnation that is gone already.
                    Err(MetaError::NodeNotAlive(*node))
                } else {
                    self.set_gone(
                        *node,
                        NodeState::Failed {
                            epoch: self.epoch + 1,
                        },
                    )
                }
            }
            Command::ReleaseId { node } => self.release_id(*node),
            Command::SetOwner {
                creator,
                first,
                last,
                owner,
            } => self.set_owner(*creator, *first, *last, *owner),
            Command::NameRegister { name, cid } => self.name_register(name, *cid),
            Command::NameRemove { name } => match self.names.remove(name) {
                Some(_) => Ok(Response::Done),
                None => Err(MetaError::NameNotFound(name.clone())),
            },
            Command::BarrierAlloc { size } => self.barrier_alloc(*size),
            Command::BarrierSignOn { id, node, value } => self.barrier_sign_on(*id, *node, *value),
            Command::BarrierResize { id, size } => self.barrier_resize(*id, *size),
            Command::BarrierFree { id } => match self.barriers.remove(id) {
                Some(_) => Ok(Response::Done),
                None => Err(MetaError::BarrierNotFound(*id)),
            },
            Command::TmpPut {
                name,
                data,
                create_only,
            } => self.tmp_put(name, data, *create_only),
            Command::TmpRemove { name } => match self.tmp.remove(name) {
                Some(data) => {
                    self.tmp_bytes -= data.len();
                    Ok(Response::Done)
                }
                None => Err(MetaError::TmpNotFound(name.clone())),
            },
            Command::ZoneSet {
                owner,
                zone,
                backups,
            } => self.zone_set(*owner, *zone, backups),
            Command::ZoneAdopt {
                owner,
                zone,
                holder,
                backups,
            } => self.zone_adopt(*owner, *zone, *holder, backups),
            Command::ZoneOwned {
                owner,
                zone,
                holder,
            } => self.zone_owned(*owner, *zone, *holder),
            Command::ZoneFilled {
                owner,
                zone,
                backup,
            } => self.zone_filled(*owner, *zone, *backup),
            Command::ZoneRemove { owner, zone } => match self.zones.remove(&(*owner, *zone)) {
                Some(_) => Ok(Response::Done),
                None => Err(MetaError::ZoneNotFound {
                    owner: *owner,
                    zone: *zone,
                }),
            },
            Command::ReserveLids { node, up_to } => self.reserve_lids(*node, *up_to),
            Command::HandOver {
                failed,
                incarnation,
                fallback,
            } => self.hand_over(*failed, *incarnation, *fallback),
        };
        result.unwrap_or_else(Response::Error)
    }

    // ----- nodes ---------------------------------------------------------------------------

    fn join(
        &mut self,
        role: Role,
        address: &str,
        capabilities: Capabilities,
        rack: u16,
        switch: u16,
        reclaim: Option<NodeId>,
    ) -> Result<Response, MetaError> {
        if address.is_empty() || address.len() > ADDRESS_BYTES_MAX {
            return Err(MetaError::InvalidArgument(format!(
                "addresses have 1 to {ADDRESS_BYTES_MAX} bytes"
            )));
        }
        let (id, incarnation) = match reclaim {
            Some(id) => match self.nodes.get(&id) {
                // The same node coming back (restart with its data directory, or a
                // superpeer with a configured ID). A still-alive record means its previous
                // incarnation died unnoticed; the new epoch fences that incarnation.
                Some(record) if record.role == role => (id, record.incarnation.saturating_add(1)),
                Some(record) if record.reusable() => (id, record.incarnation.saturating_add(1)),
                Some(_) => return Err(MetaError::ReclaimRefused(id)),
                None if id.0 != 0 && id.0 <= NODE_ID_MAX => (id, 1),
                None => return Err(MetaError::ReclaimRefused(id)),
            },
            None => {
                let free = (1..=u16::MAX)
                    .map(NodeId)
                    .find(|id| self.nodes.get(id).is_none_or(|record| record.reusable()));
                let id = free.ok_or(MetaError::NodeIdsExhausted)?;
                let incarnation = self
                    .nodes
                    .get(&id)
                    .map_or(1, |record| record.incarnation.saturating_add(1));
                (id, incarnation)
            }
        };
        self.epoch += 1;
        if role == Role::Peer {
            self.start_incarnation(id);
        }
        self.nodes.insert(
            id,
            NodeRecord {
                id,
                role,
                address: address.to_owned(),
                capabilities,
                rack,
                switch,
                state: NodeState::Alive,
                incarnation,
                joined_epoch: self.epoch,
                released: false,
            },
        );
        Ok(Response::Joined {
            id,
            incarnation,
            epoch: self.epoch,
        })
    }

    /// A peer's new incarnation starts above everything earlier ones numbered: zones from
    /// `zones_end`, fresh local IDs from `lids_reserved`, and those fresh IDs route to it
    /// again (a recovery may have handed them to a restorer while it was gone).
    fn start_incarnation(&mut self, id: NodeId) {
        let bases = self.bases.entry(id).or_default();
        bases.zone_base = bases.zones_end;
        bases.lid_base = bases.lid_base.max(bases.lids_reserved);
        bases.lids_reserved = bases.lid_base;
        let lid_base = bases.lid_base;
        if lid_base <= LOCAL_ID_MAX {
            if let Some(tree) = self.lookup.get_mut(&id) {
                tree.set_owner(id, lid_base, LOCAL_ID_MAX, id);
                if tree.is_empty() {
                    self.lookup.remove(&id);
                }
            }
        }
    }

    fn reserve_lids(&mut self, node: NodeId, up_to: u64) -> Result<Response, MetaError> {
        let record = self.nodes.get(&node).ok_or(MetaError::UnknownNode(node))?;
        if record.role != Role::Peer || up_to > LOCAL_ID_MAX + 1 {
            return Err(MetaError::InvalidArgument(format!(
                "local IDs are reserved by peers, up to {:#x}",
                LOCAL_ID_MAX + 1
            )));
        }
        let bases = self.bases.entry(node).or_default();
        bases.lids_reserved = bases.lids_reserved.max(up_to);
        Ok(Response::Done)
    }

    fn hand_over(
        &mut self,
        failed: NodeId,
        incarnation: u32,
        fallback: NodeId,
    ) -> Result<Response, MetaError> {
        let record = self
            .nodes
            .get(&failed)
            .ok_or(MetaError::UnknownNode(failed))?;
        if !matches!(record.state, NodeState::Failed { .. }) || record.incarnation != incarnation {
            return Err(MetaError::InvalidArgument(format!(
                "{failed} is not failed in incarnation {incarnation}"
            )));
        }
        if !self.nodes.contains_key(&fallback) || fallback == failed {
            return Err(MetaError::UnknownNode(fallback));
        }
        for (creator, first, last, owner) in self.leftover_ranges(failed, fallback) {
            let tree = self.lookup.entry(creator).or_default();
            tree.set_owner(creator, first, last, owner);
            if tree.is_empty() {
                self.lookup.remove(&creator);
            }
        }
        Ok(Response::Done)
    }

    /// The LID ranges still routed to `failed`, as `(creator, first, last, new owner)`:
    /// the owner of the left (else right) neighbouring range when that is not `failed`,
    /// else `fallback`. Of `failed`'s own IDs only those below its
    /// [`PeerBases::lids_reserved`] count (higher ones were never handed out), and none if
    /// it never registered a backup zone.
    pub fn leftover_ranges(
        &self,
        failed: NodeId,
        fallback: NodeId,
    ) -> Vec<(NodeId, u64, u64, NodeId)> {
        // A peer that never registered a zone had no backups: nothing of it was recovered,
        // and its own IDs stay routed to it (unavailable rather than "not found").
        let bases = self.bases(failed);
        let own_end = if bases.zones_end > 0 {
            bases.lids_reserved
        } else {
            0
        };
        let mut out = Vec::new();
        for creator in self.nodes.keys().copied() {
            // The creator's whole LID space as (first, last, owner) pieces, in order.
            let mut pieces: Vec<(u64, u64, NodeId)> = Vec::new();
            let mut next = 0u64;
            if let Some(tree) = self.lookup.get(&creator) {
                for (first, last, owner) in tree.exceptions() {
                    if first > next {
                        pieces.push((next, first - 1, creator));
                    }
                    pieces.push((first, last, owner));
                    next = last.saturating_add(1);
                }
            }
            if next <= LOCAL_ID_MAX {
                pieces.push((next, LOCAL_ID_MAX, creator));
            }
            for (index, &(first, last, owner)) in pieces.iter().enumerate() {
                if owner != failed {
                    continue;
                }
                let last = if creator == failed {
                    if first >= own_end {
                        continue;
                    }
                    last.min(own_end - 1)
                } else {
                    last
                };
                let left = index
                    .checked_sub(1)
                    .and_then(|i| pieces.get(i))
                    .map(|piece| piece.2)
                    .filter(|owner| *owner != failed);
                let right = pieces
                    .get(index + 1)
                    .map(|piece| piece.2)
                    .filter(|owner| *owner != failed);
                out.push((creator, first, last, left.or(right).unwrap_or(fallback)));
            }
        }
        out
    }

    /// Where `node`'s current incarnation starts (all zero for a node that never joined as
    /// a peer).
    pub fn bases(&self, node: NodeId) -> PeerBases {
        self.bases.get(&node).copied().unwrap_or_default()
    }

    fn set_gone(&mut self, node: NodeId, state: NodeState) -> Result<Response, MetaError> {
        let record = self
            .nodes
            .get_mut(&node)
            .ok_or(MetaError::UnknownNode(node))?;
        if record.state != NodeState::Alive {
            return Err(MetaError::NodeNotAlive(node));
        }
        self.epoch += 1;
        record.state = state;
        Ok(Response::Epoch(self.epoch))
    }

    fn release_id(&mut self, node: NodeId) -> Result<Response, MetaError> {
        let record = self
            .nodes
            .get_mut(&node)
            .ok_or(MetaError::UnknownNode(node))?;
        if record.state == NodeState::Alive {
            return Err(MetaError::NodeAlive(node));
        }
        record.released = true;
        Ok(Response::Done)
    }

    /// The current cluster epoch (raised by every join, leave and failure).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// One node's record.
    pub fn node(&self, id: NodeId) -> Option<&NodeRecord> {
        self.nodes.get(&id)
    }

    /// Every node the cluster has known, by ID.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeRecord> {
        self.nodes.values()
    }

    // ----- lookup --------------------------------------------------------------------------

    fn set_owner(
        &mut self,
        creator: NodeId,
        first: u64,
        last: u64,
        owner: NodeId,
    ) -> Result<Response, MetaError> {
        if first > last || last > LOCAL_ID_MAX {
            return Err(MetaError::InvalidArgument(format!(
                "LID range {first}..={last} is empty or beyond {LOCAL_ID_MAX}"
            )));
        }
        if !self.nodes.contains_key(&owner) {
            return Err(MetaError::UnknownNode(owner));
        }
        let tree = self.lookup.entry(creator).or_default();
        tree.set_owner(creator, first, last, owner);
        if tree.is_empty() {
            self.lookup.remove(&creator);
        }
        Ok(Response::Done)
    }

    /// Where `cid` lives, as the maximal range of its creator's LIDs with the same owner.
    pub fn lookup(&self, cid: ChunkId) -> LookupRange {
        let creator = cid.creator();
        match self.lookup.get(&creator) {
            Some(tree) => tree.lookup(creator, cid.local_id()),
            None => LookupRange {
                creator,
                first: 0,
                last: LOCAL_ID_MAX,
                owner: creator,
            },
        }
    }

    /// The exception ranges of one creator (chunks that live elsewhere).
    pub fn lookup_tree(&self, creator: NodeId) -> Option<&LookupTree> {
        self.lookup.get(&creator)
    }

    // ----- nameservice ---------------------------------------------------------------------

    fn name_register(&mut self, name: &str, cid: ChunkId) -> Result<Response, MetaError> {
        check_name(name)?;
        if !self.names.contains_key(name) && self.names.len() >= NAMES_MAX {
            return Err(MetaError::NamesFull);
        }
        self.names.insert(name.to_owned(), cid);
        Ok(Response::Done)
    }

    /// The chunk bound to `name`.
    pub fn name_get(&self, name: &str) -> Option<ChunkId> {
        self.names.get(name).copied()
    }

    /// Every binding, by name.
    pub fn names(&self) -> impl Iterator<Item = (&str, ChunkId)> {
        self.names.iter().map(|(name, &cid)| (name.as_str(), cid))
    }

    // ----- barriers ------------------------------------------------------------------------

    fn check_barrier_size(size: u32) -> Result<(), MetaError> {
        if size == 0 || size > BARRIER_SIZE_MAX {
            return Err(MetaError::InvalidArgument(format!(
                "barriers have 1 to {BARRIER_SIZE_MAX} participants, got {size}"
            )));
        }
        Ok(())
    }

    fn barrier_alloc(&mut self, size: u32) -> Result<Response, MetaError> {
        Self::check_barrier_size(size)?;
        if self.barriers.len() >= BARRIERS_MAX {
            return Err(MetaError::BarriersFull);
        }
        // IDs count up and wrap, skipping IDs in use; with at most BARRIERS_MAX in use a
        // free one is found within BARRIERS_MAX + 1 steps.
        let mut id = self.next_barrier;
        while self.barriers.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next_barrier = id.wrapping_add(1);
        self.barriers.insert(
            id,
            Barrier {
                size,
                round: 0,
                signed: BTreeMap::new(),
                last_released: Vec::new(),
            },
        );
        Ok(Response::BarrierAllocated(id))
    }

    fn barrier_sign_on(
        &mut self,
        id: u32,
        node: NodeId,
        value: u64,
    ) -> Result<Response, MetaError> {
        let barrier = self
            .barriers
            .get_mut(&id)
            .ok_or(MetaError::BarrierNotFound(id))?;
        if barrier.signed.contains_key(&node) {
            return Err(MetaError::AlreadySignedOn(node));
        }
        barrier.signed.insert(node, value);
        Ok(Response::Barrier(Self::maybe_release(barrier)))
    }

    fn barrier_resize(&mut self, id: u32, size: u32) -> Result<Response, MetaError> {
        Self::check_barrier_size(size)?;
        let barrier = self
            .barriers
            .get_mut(&id)
            .ok_or(MetaError::BarrierNotFound(id))?;
        barrier.size = size;
        Ok(Response::Barrier(Self::maybe_release(barrier)))
    }

    fn maybe_release(barrier: &mut Barrier) -> BarrierOutcome {
        let round = barrier.round;
        let signed = barrier.signed.len() as u32;
        let size = barrier.size;
        let released = if signed >= size {
            let values: Vec<(NodeId, u64)> =
                std::mem::take(&mut barrier.signed).into_iter().collect();
            barrier.round += 1;
            barrier.last_released = values.clone();
            Some(values)
        } else {
            None
        };
        BarrierOutcome {
            round,
            signed,
            size,
            released,
        }
    }

    /// One barrier's state.
    pub fn barrier(&self, id: u32) -> Option<&Barrier> {
        self.barriers.get(&id)
    }

    /// Every allocated barrier, by ID.
    pub fn barriers(&self) -> impl Iterator<Item = (u32, &Barrier)> {
        self.barriers.iter().map(|(&id, barrier)| (id, barrier))
    }

    // ----- temporary storage ---------------------------------------------------------------

    fn tmp_put(
        &mut self,
        name: &str,
        data: &[u8],
        create_only: bool,
    ) -> Result<Response, MetaError> {
        check_name(name)?;
        if data.len() > TMP_BLOB_BYTES_MAX {
            return Err(MetaError::InvalidArgument(format!(
                "temporary blobs hold at most {TMP_BLOB_BYTES_MAX} bytes, got {}",
                data.len()
            )));
        }
        let previous = self.tmp.get(name).map(Vec::len);
        if previous.is_some() && create_only {
            return Err(MetaError::TmpExists(name.to_owned()));
        }
        let total = self.tmp_bytes - previous.unwrap_or(0) + data.len();
        if total > TMP_TOTAL_BYTES_MAX {
            return Err(MetaError::TmpFull);
        }
        self.tmp_bytes = total;
        self.tmp.insert(name.to_owned(), data.to_vec());
        Ok(Response::Done)
    }

    /// A blob from temporary storage.
    pub fn tmp_get(&self, name: &str) -> Option<&[u8]> {
        self.tmp.get(name).map(Vec::as_slice)
    }

    /// Every blob's name and size, by name.
    pub fn tmp_list(&self) -> impl Iterator<Item = (&str, usize)> {
        self.tmp
            .iter()
            .map(|(name, data)| (name.as_str(), data.len()))
    }

    // ----- backup zones --------------------------------------------------------------------

    fn check_backups(owner: NodeId, backups: &[NodeId]) -> Result<(), MetaError> {
        if backups.len() > BACKUPS_PER_ZONE_MAX {
            return Err(MetaError::InvalidArgument(format!(
                "a zone has at most {BACKUPS_PER_ZONE_MAX} backups"
            )));
        }
        let distinct: BTreeSet<NodeId> = backups.iter().copied().collect();
        if distinct.len() != backups.len() || distinct.contains(&owner) {
            return Err(MetaError::InvalidArgument(
                "a zone's backups are distinct and never its owner".to_owned(),
            ));
        }
        Ok(())
    }

    fn zone_set(
        &mut self,
        owner: NodeId,
        zone: u32,
        backups: &[NodeId],
    ) -> Result<Response, MetaError> {
        Self::check_backups(owner, backups)?;
        for node in backups.iter().chain(std::iter::once(&owner)) {
            if !self.nodes.contains_key(node) {
                return Err(MetaError::UnknownNode(*node));
            }
        }
        let zone_base = self.bases.get(&owner).map_or(0, |bases| bases.zone_base);
        if zone < zone_base {
            return Err(MetaError::InvalidArgument(format!(
                "zone {zone} of {owner} belongs to an earlier incarnation (this one starts at {zone_base})"
            )));
        }
        if let Some(ZoneEntry {
            holder: Some((holder, _)),
            ..
        }) = self.zones.get(&(owner, zone))
        {
            return Err(MetaError::InvalidArgument(format!(
                "zone {zone} of {owner} is held by {holder} (adopted)"
            )));
        }
        let is_new = !self.zones.contains_key(&(owner, zone));
        if is_new && self.zones.range((owner, 0)..=(owner, u32::MAX)).count() >= ZONES_PER_NODE_MAX
        {
            return Err(MetaError::InvalidArgument(format!(
                "a peer has at most {ZONES_PER_NODE_MAX} zones"
            )));
        }
        // A new zone is registered before its first chunk is sent: its backups get every
        // chunk from the stream and are complete from the start.
        let filling = self
            .zones
            .get(&(owner, zone))
            .map_or_else(Vec::new, |entry| entry.filling_after(backups));
        self.zones.insert(
            (owner, zone),
            ZoneEntry {
                backups: backups.to_vec(),
                holder: None,
                owned: false,
                filling,
            },
        );
        let bases = self.bases.entry(owner).or_default();
        bases.zones_end = bases.zones_end.max(zone.saturating_add(1));
        Ok(Response::Done)
    }

    fn zone_adopt(
        &mut self,
        owner: NodeId,
        zone: u32,
        holder: NodeId,
        backups: &[NodeId],
    ) -> Result<Response, MetaError> {
        let Some(entry) = self.zones.get(&(owner, zone)) else {
            return Err(MetaError::ZoneNotFound { owner, zone });
        };
        let record = self
            .nodes
            .get(&holder)
            .ok_or(MetaError::UnknownNode(holder))?;
        if record.state != NodeState::Alive {
            return Err(MetaError::NodeNotAlive(holder));
        }
        if record.role != Role::Peer || holder == owner {
            return Err(MetaError::InvalidArgument(format!(
                "zone {zone} of {owner} can only be adopted by another peer"
            )));
        }
        let incarnation = record.incarnation;
        Self::check_backups(owner, backups)?;
        if backups.contains(&holder) {
            return Err(MetaError::InvalidArgument(
                "a zone's backups never include its holder".to_owned(),
            ));
        }
        if let Some(unknown) = backups.iter().find(|node| !self.nodes.contains_key(node)) {
            return Err(MetaError::UnknownNode(*unknown));
        }
        let already_held = entry.holder == Some((holder, incarnation));
        let owned = already_held && entry.owned;
        if !already_held && !self.zone_needs_recovery(owner, zone) {
            return Err(MetaError::InvalidArgument(format!(
                "zone {zone} of {owner} does not need recovery and is not held by {holder}"
            )));
        }
        let filling = entry.filling_after(backups);
        self.zones.insert(
            (owner, zone),
            ZoneEntry {
                backups: backups.to_vec(),
                holder: Some((holder, incarnation)),
                owned,
                filling,
            },
        );
        Ok(Response::Done)
    }

    fn zone_owned(
        &mut self,
        owner: NodeId,
        zone: u32,
        holder: NodeId,
    ) -> Result<Response, MetaError> {
        let incarnation = self.nodes.get(&holder).map(|record| record.incarnation);
        let Some(entry) = self.zones.get_mut(&(owner, zone)) else {
            return Err(MetaError::ZoneNotFound { owner, zone });
        };
        match (entry.holder, incarnation) {
            (Some(held), Some(incarnation)) if held == (holder, incarnation) => {
                entry.owned = true;
                Ok(Response::Done)
            }
            _ => Err(MetaError::InvalidArgument(format!(
                "zone {zone} of {owner} is not held by {holder}"
            ))),
        }
    }

    fn zone_filled(
        &mut self,
        owner: NodeId,
        zone: u32,
        backup: NodeId,
    ) -> Result<Response, MetaError> {
        let Some(entry) = self.zones.get_mut(&(owner, zone)) else {
            return Err(MetaError::ZoneNotFound { owner, zone });
        };
        if !entry.backups.contains(&backup) {
            return Err(MetaError::InvalidArgument(format!(
                "{backup} is not a backup of zone {zone} of {owner}"
            )));
        }
        entry.filling.retain(|&b| b != backup);
        Ok(Response::Done)
    }

    /// The backups of one zone whose copy is not complete yet (see
    /// `Command::ZoneFilled`), in list order; empty for an unknown zone.
    pub fn zone_filling(&self, owner: NodeId, zone: u32) -> &[NodeId] {
        self.zones
            .get(&(owner, zone))
            .map_or(&[], |entry| entry.filling.as_slice())
    }

    /// Whether the zone needs nothing more from a recovery: it does not
    /// [need recovery](Self::zone_needs_recovery), and when adopted, its holder committed
    /// the ownership of its CIDs (`Command::ZoneOwned`). Between `ZoneAdopt` and that
    /// commit the CIDs may still route to the log owner. A zone not in the table counts as
    /// settled.
    pub fn zone_settled(&self, owner: NodeId, zone: u32) -> bool {
        match self.zones.get(&(owner, zone)) {
            None => true,
            Some(entry) => {
                !self.zone_needs_recovery(owner, zone) && (entry.holder.is_none() || entry.owned)
            }
        }
    }

    /// The backups of one zone, first backup first.
    pub fn zone(&self, owner: NodeId, zone: u32) -> Option<&[NodeId]> {
        self.zones
            .get(&(owner, zone))
            .map(|entry| entry.backups.as_slice())
    }

    /// The peer holding one zone's chunks: its log owner, or the restorer that adopted it.
    pub fn zone_holder(&self, owner: NodeId, zone: u32) -> Option<NodeId> {
        self.zones
            .get(&(owner, zone))
            .map(|entry| entry.holder.map_or(owner, |(holder, _)| holder))
    }

    /// Every zone whose log owner is `owner` (held by it or adopted by another peer), with
    /// its backups, by zone number.
    pub fn zones_of(&self, owner: NodeId) -> impl Iterator<Item = (u32, &[NodeId])> {
        self.zones
            .range((owner, 0)..=(owner, u32::MAX))
            .map(|(&(_, zone), entry)| (zone, entry.backups.as_slice()))
    }

    /// Every zone in the table as `(owner, zone, backups)`, by owner and zone (the owner is
    /// the log owner; see [`zone_holder`](Self::zone_holder)).
    pub fn zones(&self) -> impl Iterator<Item = (NodeId, u32, &[NodeId])> {
        self.zones
            .iter()
            .map(|(&(owner, zone), entry)| (owner, zone, entry.backups.as_slice()))
    }

    /// Every zone whose chunks `holder` holds (its own zones not adopted by another peer,
    /// and the zones it adopted) as `(log owner, zone, backups)`.
    pub fn zones_held_by(&self, holder: NodeId) -> impl Iterator<Item = (NodeId, u32, &[NodeId])> {
        self.zones
            .iter()
            .filter(move |(&(owner, _), entry)| {
                entry.holder.map_or(owner, |(node, _)| node) == holder
            })
            .map(|(&(owner, zone), entry)| (owner, zone, entry.backups.as_slice()))
    }

    /// Whether the zone's data must be recovered from its backups. For a zone held by its
    /// log owner: the owner failed, or the zone belongs to an earlier incarnation of it
    /// (below its [`PeerBases::zone_base`]; the peer restarted and lost its memory). For an
    /// adopted zone: its holder failed, or is no longer the incarnation that adopted it.
    pub fn zone_needs_recovery(&self, owner: NodeId, zone: u32) -> bool {
        let failed = |node: NodeId| {
            self.nodes
                .get(&node)
                .is_some_and(|record| matches!(record.state, NodeState::Failed { .. }))
        };
        match self
            .zones
            .get(&(owner, zone))
            .and_then(|entry| entry.holder)
        {
            Some((holder, incarnation)) => {
                failed(holder)
                    || self
                        .nodes
                        .get(&holder)
                        .is_none_or(|record| record.incarnation != incarnation)
            }
            None => failed(owner) || zone < self.bases(owner).zone_base,
        }
    }

    /// Every zone that [needs recovery](Self::zone_needs_recovery), with its backups.
    pub fn zones_to_recover(&self) -> impl Iterator<Item = (NodeId, u32, &[NodeId])> {
        self.zones()
            .filter(|(owner, zone, _)| self.zone_needs_recovery(*owner, *zone))
    }

    // ----- snapshots -----------------------------------------------------------------------

    /// The whole state as bytes (deterministic: equal states encode equally).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = Encoder::new();
        out.put_u8(SNAPSHOT_VERSION);
        out.put_varint(self.epoch);
        out.put_varint(self.nodes.len() as u64);
        for record in self.nodes.values() {
            record.encode(&mut out, RecordLayout::Snapshot);
        }
        out.put_varint(self.lookup.len() as u64);
        for (creator, tree) in &self.lookup {
            out.put_varint(u64::from(creator.0));
            out.put_varint(tree.len() as u64);
            for (first, last, owner) in tree.exceptions() {
                out.put_varint(first);
                out.put_varint(last);
                out.put_varint(u64::from(owner.0));
            }
        }
        out.put_varint(self.names.len() as u64);
        for (name, cid) in &self.names {
            out.put_str(name);
            out.put_u64_le(cid.raw());
        }
        out.put_varint(u64::from(self.next_barrier));
        out.put_varint(self.barriers.len() as u64);
        for (id, barrier) in &self.barriers {
            out.put_varint(u64::from(*id));
            out.put_varint(u64::from(barrier.size));
            out.put_varint(barrier.round);
            for list in [
                &barrier
                    .signed
                    .iter()
                    .map(|(&n, &v)| (n, v))
                    .collect::<Vec<_>>(),
                &barrier.last_released,
            ] {
                out.put_varint(list.len() as u64);
                for (node, value) in list {
                    out.put_varint(u64::from(node.0));
                    out.put_u64_le(*value);
                }
            }
        }
        out.put_varint(self.tmp.len() as u64);
        for (name, data) in &self.tmp {
            out.put_str(name);
            out.put_bytes(data);
        }
        out.put_varint(self.zones.len() as u64);
        for ((owner, zone), entry) in &self.zones {
            out.put_varint(u64::from(owner.0));
            out.put_varint(u64::from(*zone));
            out.put_varint(entry.backups.len() as u64);
            for backup in &entry.backups {
                out.put_varint(u64::from(backup.0));
            }
            match entry.holder {
                Some((holder, incarnation)) => {
                    out.put_u8(if entry.owned { 2 } else { 1 });
                    out.put_varint(u64::from(holder.0));
                    out.put_varint(u64::from(incarnation));
                }
                None => {
                    out.put_u8(0);
                }
            }
            out.put_varint(entry.filling.len() as u64);
            for backup in &entry.filling {
                out.put_varint(u64::from(backup.0));
            }
        }
        out.put_varint(self.bases.len() as u64);
        for (node, bases) in &self.bases {
            out.put_varint(u64::from(node.0));
            out.put_varint(u64::from(bases.zone_base));
            out.put_varint(u64::from(bases.zones_end));
            out.put_varint(bases.lid_base);
            out.put_varint(bases.lids_reserved);
        }
        out.into_vec()
    }

    /// Rebuilds a state from [`snapshot`](Self::snapshot) bytes, checking every invariant.
    pub fn from_snapshot(bytes: &[u8]) -> Result<MetaState, DecodeError> {
        let mut input = Decoder::from_slice(bytes);
        let version = input.get_u8("snapshot version")?;
        if !(1..=SNAPSHOT_VERSION).contains(&version) {
            return Err(DecodeError::UnknownTag {
                what: "snapshot version",
                tag: u64::from(version),
            });
        }
        let mut state = MetaState {
            epoch: input.get_varint("epoch")?,
            ..MetaState::default()
        };
        state.read_snapshot_nodes(&mut input)?;
        state.read_snapshot_lookup(&mut input)?;
        state.read_snapshot_names(&mut input)?;
        state.read_snapshot_barriers(&mut input)?;
        state.read_snapshot_tmp(&mut input)?;
        state.read_snapshot_zones(&mut input, version)?;
        if version >= 2 {
            state.read_snapshot_bases(&mut input)?;
        }
        input.finish()?;
        Ok(state)
    }

    /// [`from_snapshot`](Self::from_snapshot): the node records.
    fn read_snapshot_nodes(&mut self, input: &mut Decoder<'_>) -> Result<(), DecodeError> {
        let count = input.get_count("nodes", 8, usize::from(u16::MAX))?;
        for _ in 0..count {
            let record = NodeRecord::decode(input, RecordLayout::Snapshot)?;
            let id = record.id;
            if self.nodes.insert(id, record).is_some() {
                return Err(DecodeError::Invalid("duplicate node"));
            }
        }
        Ok(())
    }

    /// [`from_snapshot`](Self::from_snapshot): the lookup trees, one per creator, each
    /// checked.
    fn read_snapshot_lookup(&mut self, input: &mut Decoder<'_>) -> Result<(), DecodeError> {
        let count = input.get_count("lookup trees", 2, usize::from(u16::MAX) + 1)?;
        for _ in 0..count {
            let creator = NodeId(input.get_varint_u16("creator")?);
            let ranges = input.get_count("lookup ranges", 3, usize::MAX)?;
            let mut tree = LookupTree::default();
            for _ in 0..ranges {
                let first = input.get_varint("first")?;
                let last = input.get_varint("last")?;
                let owner = NodeId(input.get_varint_u16("owner")?);
                tree.insert_raw(first, last, owner);
            }
            if tree.len() != ranges || tree.is_empty() {
                return Err(DecodeError::Invalid("duplicate or empty lookup ranges"));
            }
            tree.check(creator).map_err(DecodeError::Invalid)?;
            if self.lookup.insert(creator, tree).is_some() {
                return Err(DecodeError::Invalid("duplicate lookup tree"));
            }
        }
        Ok(())
    }

    /// [`from_snapshot`](Self::from_snapshot): the name service.
    fn read_snapshot_names(&mut self, input: &mut Decoder<'_>) -> Result<(), DecodeError> {
        let count = input.get_count("names", 9, NAMES_MAX)?;
        for _ in 0..count {
            let name = input.get_str("name", NAME_BYTES_MAX)?.to_owned();
            let cid = ChunkId::from_raw(input.get_u64_le("cid")?);
            if name.is_empty() || self.names.insert(name, cid).is_some() {
                return Err(DecodeError::Invalid("empty or duplicate name"));
            }
        }
        Ok(())
    }

    /// [`from_snapshot`](Self::from_snapshot): the next barrier ID and the barriers.
    fn read_snapshot_barriers(&mut self, input: &mut Decoder<'_>) -> Result<(), DecodeError> {
        self.next_barrier = input.get_varint_u32("next barrier")?;
        let count = input.get_count("barriers", 5, BARRIERS_MAX)?;
        for _ in 0..count {
            let id = input.get_varint_u32("barrier")?;
            let size = input.get_varint_u32("barrier size")?;
            if size == 0 || size > BARRIER_SIZE_MAX {
                return Err(DecodeError::Invalid("barrier size"));
            }
            let round = input.get_varint("round")?;
            let mut lists: [Vec<(NodeId, u64)>; 2] = [Vec::new(), Vec::new()];
            for list in &mut lists {
                let entries = input.get_count("barrier values", 9, BARRIER_SIZE_MAX as usize)?;
                for _ in 0..entries {
                    list.push((
                        NodeId(input.get_varint_u16("node")?),
                        input.get_u64_le("value")?,
                    ));
                }
            }
            let [signed_list, last_released] = lists;
            let signed: BTreeMap<NodeId, u64> = signed_list.iter().copied().collect();
            if signed.len() != signed_list.len() || signed.len() >= size as usize {
                return Err(DecodeError::Invalid("barrier sign-ons"));
            }
            let barrier = Barrier {
                size,
                round,
                signed,
                last_released,
            };
            if self.barriers.insert(id, barrier).is_some() {
                return Err(DecodeError::Invalid("duplicate barrier"));
            }
        }
        Ok(())
    }

    /// [`from_snapshot`](Self::from_snapshot): the temporary store, within its limits.
    fn read_snapshot_tmp(&mut self, input: &mut Decoder<'_>) -> Result<(), DecodeError> {
        let count = input.get_count("tmp blobs", 2, TMP_TOTAL_BYTES_MAX)?;
        for _ in 0..count {
            let name = input.get_str("tmp name", NAME_BYTES_MAX)?.to_owned();
            let data = input.get_slice("tmp data", TMP_BLOB_BYTES_MAX)?.to_vec();
            self.tmp_bytes += data.len();
            if name.is_empty()
                || self.tmp_bytes > TMP_TOTAL_BYTES_MAX
                || self.tmp.insert(name, data).is_some()
            {
                return Err(DecodeError::Invalid("tmp storage"));
            }
        }
        Ok(())
    }

    /// [`from_snapshot`](Self::from_snapshot): the backup zones (holders from version 3 on).
    fn read_snapshot_zones(
        &mut self,
        input: &mut Decoder<'_>,
        version: u8,
    ) -> Result<(), DecodeError> {
        let count = input.get_count("zones", 3, usize::MAX)?;
        for _ in 0..count {
            let owner = NodeId(input.get_varint_u16("owner")?);
            let zone = input.get_varint_u32("zone")?;
            let backups_count = input.get_count("backups", 1, BACKUPS_PER_ZONE_MAX)?;
            let mut backups = Vec::with_capacity(backups_count);
            for _ in 0..backups_count {
                backups.push(NodeId(input.get_varint_u16("backup")?));
            }
            let flag = if version >= 3 {
                input.get_u8("zone holder flag")?
            } else {
                0
            };
            let holder = match flag {
                0 => None,
                1 | 2 => Some((
                    NodeId(input.get_varint_u16("holder")?),
                    input.get_varint_u32("holder incarnation")?,
                )),
                tag => {
                    return Err(DecodeError::UnknownTag {
                        what: "zone holder flag",
                        tag: u64::from(tag),
                    })
                }
            };
            let mut filling = Vec::new();
            if version >= 4 {
                let count = input.get_count("filling backups", 1, backups.len())?;
                for _ in 0..count {
                    let backup = NodeId(input.get_varint_u16("filling backup")?);
                    if !backups.contains(&backup) || filling.contains(&backup) {
                        return Err(DecodeError::Invalid("filling backup not in the zone"));
                    }
                    filling.push(backup);
                }
            }
            let entry = ZoneEntry {
                backups,
                holder,
                owned: flag == 2,
                filling,
            };
            if self.zones.insert((owner, zone), entry).is_some() {
                return Err(DecodeError::Invalid("duplicate zone"));
            }
        }
        Ok(())
    }

    /// [`from_snapshot`](Self::from_snapshot): the bases of every peer (version 2 on).
    fn read_snapshot_bases(&mut self, input: &mut Decoder<'_>) -> Result<(), DecodeError> {
        let count = input.get_count("peer bases", 5, usize::from(u16::MAX) + 1)?;
        for _ in 0..count {
            let node = NodeId(input.get_varint_u16("node")?);
            let bases = PeerBases {
                zone_base: input.get_varint_u32("zone base")?,
                zones_end: input.get_varint_u32("zones end")?,
                lid_base: input.get_varint("lid base")?,
                lids_reserved: input.get_varint("lids reserved")?,
            };
            if bases.zone_base > bases.zones_end
                || bases.lid_base > bases.lids_reserved
                || self.bases.insert(node, bases).is_some()
            {
                return Err(DecodeError::Invalid("peer bases"));
            }
        }
        Ok(())
    }
}
