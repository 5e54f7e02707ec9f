//! The backup-zone tree of one master: CID ranges → zone, plus each zone's payload bytes.
//!
//! The master's own chunks get sequential local IDs, so a zone of own chunks is one range
//! `[first CID, last CID]`. The zone being filled (the *open* zone) reaches to the end of the
//! master's ID space; when it is full, its end is set to the highest own CID assigned so far
//! and a new open zone starts right after. A created chunk whose CID lies in a closed zone's
//! range (a reused local ID) goes back to that zone. Chunks of other creators (migrated or
//! recovered onto this master) are registered as ranges.
//!
//! With several threads creating chunks, local IDs are handed out in small blocks per
//! thread, so a few CIDs below the closing point may be created after their zone closed;
//! they join the closed zone, which can exceed its target by at most those chunks. The zone
//! size is a target, not a hard limit.

use std::collections::BTreeMap;

use myriad_types::{ChunkId, NodeId, LOCAL_ID_MAX};

/// A zone number, unique together with its master's node ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ZoneId(pub u32);

/// One zone's bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ZoneUsage {
    /// Payload bytes of the zone's live chunks.
    pub payload_bytes: u64,
    /// Live chunks in the zone.
    pub chunks: u64,
}

/// Where a chunk went when it was assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    /// The chunk's zone.
    pub zone: ZoneId,
    /// The open zone was full and a new one was opened for this chunk; the caller places
    /// it and registers it with the superpeers before replicating to it.
    pub opened: bool,
}

/// The zone tree of one master.
#[derive(Debug, Clone)]
pub struct ZoneTree {
    master: NodeId,
    zone_bytes: u64,
    /// `first CID -> (last CID, zone)`; ranges never overlap.
    ranges: BTreeMap<u64, (u64, ZoneId)>,
    usage: BTreeMap<ZoneId, ZoneUsage>,
    /// The open zone and the first CID of its range (its range ends at the master's last CID).
    open: Option<(ZoneId, u64)>,
    /// Highest own CID assigned so far.
    highest_own: Option<u64>,
    next_zone: u32,
}

impl ZoneTree {
    /// An empty tree for `master`, with zones of `zone_bytes` payload (at least 1).
    pub fn new(master: NodeId, zone_bytes: u64) -> ZoneTree {
        ZoneTree {
            master,
            zone_bytes: zone_bytes.max(1),
            ranges: BTreeMap::new(),
            usage: BTreeMap::new(),
            open: None,
            highest_own: None,
            next_zone: 0,
        }
    }

    /// Numbers new zones from `first` on (no effect on numbers already at or above it): a
    /// restarted master starts above the zones of its earlier incarnation, which its backups
    /// still hold. Call before the first assignment.
    pub fn start_zones_at(&mut self, first: u32) {
        self.next_zone = self.next_zone.max(first);
    }

    fn own_last(&self) -> u64 {
        ChunkId::new(self.master, LOCAL_ID_MAX).map_or(u64::MAX, ChunkId::raw)
    }

    fn new_zone_id(&mut self) -> ZoneId {
        // Zone numbers are never reused within a master's life.
        let id = ZoneId(self.next_zone);
        self.next_zone = self.next_zone.wrapping_add(1);
        self.usage.insert(id, ZoneUsage::default());
        id
    }

    /// The zone of `cid`, if it was assigned one.
    pub fn zone_of(&self, cid: ChunkId) -> Option<ZoneId> {
        let raw = cid.raw();
        let (_, &(last, zone)) = self.ranges.range(..=raw).next_back()?;
        (raw <= last).then_some(zone)
    }

    /// Assigns a newly created chunk of `size` payload bytes to a zone.
    pub fn assign(&mut self, cid: ChunkId, size: u64) -> Assignment {
        let raw = cid.raw();
        let own = cid.creator() == self.master;
        // A fresh own CID lies above every own CID so far: it fills the open zone. Any other
        // CID (a reused own one, or a foreign one) keeps the zone its range names.
        let fresh_own = own && self.highest_own.is_none_or(|highest| raw > highest);
        if !fresh_own {
            if let Some(zone) = self.zone_of(cid) {
                self.add_usage(zone, size);
                return Assignment {
                    zone,
                    opened: false,
                };
            }
        }
        let full = self.open.is_some_and(|(zone, _)| {
            let usage = self.usage.get(&zone).copied().unwrap_or_default();
            fresh_own && usage.chunks > 0 && usage.payload_bytes + size > self.zone_bytes
        });
        let (opened, (zone, first)) = match self.open {
            Some(open) if !full => (false, open),
            _ => (true, self.open_zone_after()),
        };
        if !(own && raw >= first) {
            // A foreign chunk that arrives alone (whole sets come through `add_range`), or an
            // own CID below the open zone that no range covers: a one-CID range.
            self.ranges.insert(raw, (raw, zone));
        }
        if own {
            self.highest_own = Some(self.highest_own.map_or(raw, |highest| highest.max(raw)));
        }
        self.add_usage(zone, size);
        Assignment { zone, opened }
    }

    /// Closes the open zone at the highest own CID so far and opens a new one whose range
    /// starts above it (or at the master's first CID when nothing own was assigned yet).
    /// Returns the new open zone and the first CID of its range.
    fn open_zone_after(&mut self) -> (ZoneId, u64) {
        let first = match (self.open, self.highest_own) {
            (Some((zone, start)), Some(highest)) if highest >= start => {
                self.ranges.insert(start, (highest, zone));
                highest + 1
            }
            (Some((_, start)), _) => {
                // The open zone holds no own chunk (only single foreign ones, which keep
                // their own ranges): its open range moves on to the new zone.
                self.ranges.remove(&start);
                start
            }
            (None, Some(highest)) => highest + 1,
            (None, None) => ChunkId::new(self.master, 0).map_or(0, ChunkId::raw),
        };
        let zone = self.new_zone_id();
        let last = self.own_last();
        // Ranges of foreign chunks never lie inside the master's own ID space, and closed own
        // zones end below `first`, so the open range overlaps nothing.
        self.ranges.insert(first, (last, zone));
        self.open = Some((zone, first));
        (zone, first)
    }

    /// Registers foreign CIDs `first..=last` (migrated in, or recovered as a whole) as
    /// belonging to `zone` (from [`new_zone`](Self::new_zone) or an existing one). Refused
    /// when the range overlaps an assigned range.
    pub fn add_range(
        &mut self,
        first: ChunkId,
        last: ChunkId,
        zone: ZoneId,
    ) -> Result<(), ZoneError> {
        let (first, last) = (first.raw(), last.raw());
        if first > last || !self.usage.contains_key(&zone) {
            return Err(ZoneError::InvalidRange);
        }
        let overlaps = self
            .ranges
            .range(..=last)
            .next_back()
            .is_some_and(|(_, &(end, _))| end >= first);
        if overlaps {
            return Err(ZoneError::Overlap);
        }
        self.ranges.insert(first, (last, zone));
        Ok(())
    }

    /// A new, empty zone (for recovered chunks), not the open one.
    pub fn new_zone(&mut self) -> ZoneId {
        self.new_zone_id()
    }

    /// Adds payload to a zone's accounting (for chunks registered through
    /// [`add_range`](Self::add_range)).
    pub fn add_usage(&mut self, zone: ZoneId, size: u64) {
        self.add_usage_many(zone, 1, size);
    }

    /// Adds `chunks` chunks of `bytes` payload in all to a zone's accounting at once (a
    /// zone taken over whole, as a restorer adopts one).
    pub fn add_usage_many(&mut self, zone: ZoneId, chunks: u64, bytes: u64) {
        let usage = self.usage.entry(zone).or_default();
        usage.payload_bytes += bytes;
        usage.chunks += chunks;
    }

    /// Accounts for a removed chunk. Its range stays (removed CIDs are not split out), so a
    /// reused CID returns to the same zone.
    pub fn remove(&mut self, cid: ChunkId, size: u64) -> Option<ZoneId> {
        let zone = self.zone_of(cid)?;
        if let Some(usage) = self.usage.get_mut(&zone) {
            usage.payload_bytes = usage.payload_bytes.saturating_sub(size);
            usage.chunks = usage.chunks.saturating_sub(1);
        }
        Some(zone)
    }

    /// Accounts for a resized chunk.
    pub fn resize(&mut self, cid: ChunkId, old_size: u64, new_size: u64) -> Option<ZoneId> {
        let zone = self.zone_of(cid)?;
        if let Some(usage) = self.usage.get_mut(&zone) {
            usage.payload_bytes = usage.payload_bytes.saturating_sub(old_size) + new_size;
        }
        Some(zone)
    }

    /// A zone's usage.
    pub fn usage(&self, zone: ZoneId) -> Option<ZoneUsage> {
        self.usage.get(&zone).copied()
    }

    /// Every zone with its usage, by zone number.
    pub fn zones(&self) -> impl Iterator<Item = (ZoneId, ZoneUsage)> + '_ {
        self.usage.iter().map(|(&zone, &usage)| (zone, usage))
    }

    /// The zone currently being filled.
    pub fn open_zone(&self) -> Option<ZoneId> {
        self.open.map(|(zone, _)| zone)
    }

    /// Stored range entries (the tree's metadata size is a small multiple of this).
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// The ranges of one zone as `(first, last)` CIDs, in order.
    pub fn ranges_of(&self, zone: ZoneId) -> Vec<(ChunkId, ChunkId)> {
        self.ranges
            .iter()
            .filter(|(_, &(_, z))| z == zone)
            .map(|(&first, &(last, _))| (ChunkId::from_raw(first), ChunkId::from_raw(last)))
            .collect()
    }

    /// Verifies that ranges are well-formed and disjoint.
    pub fn check(&self) -> Result<(), &'static str> {
        let mut previous_last: Option<u64> = None;
        for (&first, &(last, zone)) in &self.ranges {
            if first > last {
                return Err("zone range with first > last");
            }
            if previous_last.is_some_and(|p| p >= first) {
                return Err("overlapping zone ranges");
            }
            if !self.usage.contains_key(&zone) {
                return Err("range of an unknown zone");
            }
            previous_last = Some(last);
        }
        Ok(())
    }
}

/// Why a zone-tree change was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ZoneError {
    /// `first > last`, or the zone does not exist.
    #[error("invalid range or unknown zone")]
    InvalidRange,
    /// The range overlaps CIDs that already have a zone.
    #[error("the range overlaps assigned CIDs")]
    Overlap,
}
