//! Recovery of a failed peer's backup zones (types 40.x, issue 6).
//!
//! # Job
//! - [`RecoverRequest`] ([`crate::types::RECOVER`]): the superpeer leader asks a backup of
//!   a failed peer's zone to restore that zone into its own memory and take over the
//!   recovered CIDs; answered with a [`RecoverReply`] (the chunk count and the CID ranges,
//!   already committed as lookup ranges pointing to the restorer).
//! - [`RecoveryStatusReply`] ([`crate::types::RECOVERY_STATUS`], empty request): the
//!   leader's table of zone recoveries (per zone: state, restorer, chunks, time).
//!
//! # Invariants
//! Decoders are bounds-checked: every count is checked against [`RANGES_MAX`] /
//! [`ZONES_MAX`] and the bytes left, ranges must be ascending (`first <= last`) with a
//! local ID of at most 48 bits; any bad input is a [`ProtoError`], never a panic.
//!
//! # Who calls it
//! `myriad-node` (the superpeer's recovery coordinator and the peer's restorer) and tools
//! that show recovery progress.

use bytes::Bytes;
use myriad_types::codec::{Decoder, Encoder};
use myriad_types::{ChunkId, NodeId, LOCAL_ID_MAX};

use crate::ProtoError;

/// Most CID ranges in one [`RecoverReply`].
pub const RANGES_MAX: usize = 1 << 20;
/// Most zones in one [`RecoveryStatusReply`].
pub const ZONES_MAX: usize = 1 << 20;

/// Most filling backups in one [`RecoverRequest`].
pub const FILLING_MAX: usize = 16;

/// Restore `owner`'s backup zone `zone` on the receiving backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoverRequest {
    /// The peer whose zone it is: the zone's log identity (the failed peer itself, or the
    /// peer that created the zone when another peer had adopted it).
    pub owner: NodeId,
    /// The zone number (as in the superpeers' zone table).
    pub zone: u32,
    /// The failed peer that held the zone when it had been adopted from `owner` (a chained
    /// recovery); `None` when `owner` held it. The restorer fences both before reading.
    pub holder: Option<NodeId>,
    /// The zone's backups whose copy of it is not complete (the zone table's filling
    /// backups, at most [`FILLING_MAX`]): the restorer keeps none of them as a surviving
    /// backup, so each is copied the whole zone again if chosen.
    pub filling: Vec<NodeId>,
}

/// A range of CIDs of one creator, `first..=last` (local IDs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CidRange {
    /// The creator of the CIDs.
    pub creator: NodeId,
    /// First local ID.
    pub first: u64,
    /// Last local ID (inclusive, `>= first`).
    pub last: u64,
}

/// The outcome of a [`RecoverRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoverReply {
    /// The zone is restored here and its CIDs point to this node.
    Recovered {
        /// Chunks restored.
        chunks: u64,
        /// Their payload bytes.
        bytes: u64,
        /// Milliseconds from the request to the committed ownership.
        ms: u64,
        /// The restored CIDs as sorted, merged ranges.
        ranges: Vec<CidRange>,
    },
    /// Nothing (or not everything) was taken over, for this reason.
    Failed(String),
    /// This backup never received anything of the zone (no log of it here): there is
    /// nothing it could restore, on this request or a later one.
    NotHeld,
}

/// Where one zone's recovery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryState {
    /// Not yet sent to a backup.
    Pending,
    /// Sent to `restorer`, no answer yet.
    Running,
    /// Restored and the ownership committed.
    Done,
    /// No backup could restore it.
    Failed,
    /// No backup of it is alive; waiting (bounded) for one to come back (a restart).
    Waiting,
    /// No backup came back in time: the zone's data is lost (removed from the zone table;
    /// its CIDs answer "not found").
    Lost,
}

/// One zone's line in the leader's recovery table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneRecovery {
    /// The failed peer.
    pub owner: NodeId,
    /// Its zone.
    pub zone: u32,
    /// Where the recovery stands.
    pub state: RecoveryState,
    /// The backup restoring (or that restored) it.
    pub restorer: Option<NodeId>,
    /// Chunks restored (when done).
    pub chunks: u64,
    /// Milliseconds since the failure was committed (until done or failed).
    pub ms: u64,
    /// The last failure reason, or empty.
    pub detail: String,
}

/// The leader's recovery table (answer to [`crate::types::RECOVERY_STATUS`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecoveryStatusReply {
    /// Whether the answering superpeer leads (only the leader coordinates recoveries).
    pub leader: bool,
    /// Every zone recovery the leader started, in start order.
    pub zones: Vec<ZoneRecovery>,
}

fn count(
    decoder: &mut Decoder,
    what: &'static str,
    max: usize,
    min_bytes: usize,
) -> Result<usize, ProtoError> {
    let value = decoder.get_varint(what)?;
    let limit = max.min(decoder.remaining() / min_bytes.max(1)) as u64;
    if value > limit {
        return Err(ProtoError::TooLarge {
            what,
            value,
            max: limit,
        });
    }
    Ok(value as usize)
}

impl RecoverRequest {
    /// A request for `owner`'s zone `zone`, held by `owner` itself.
    pub fn new(owner: NodeId, zone: u32) -> RecoverRequest {
        RecoverRequest {
            owner,
            zone,
            holder: None,
            filling: Vec::new(),
        }
    }

    /// The request's bytes: owner (u16 LE), zone (u32 LE), then
    /// - without filling backups: the holder (u16 LE) only when there is one other than
    ///   the owner;
    /// - with filling backups: the holder (u16 LE; the owner's ID for none), their count
    ///   (u8, 1..=[`FILLING_MAX`]) and each (u16 LE).
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::with_capacity(12 + 2 * self.filling.len());
        encoder.put_u16_le(self.owner.0).put_u32_le(self.zone);
        let holder = self.holder.filter(|holder| *holder != self.owner);
        let filling = &self.filling[..self.filling.len().min(FILLING_MAX)];
        if filling.is_empty() {
            if let Some(holder) = holder {
                encoder.put_u16_le(holder.0);
            }
        } else {
            encoder.put_u16_le(holder.unwrap_or(self.owner).0);
            encoder.put_u8(filling.len() as u8);
            for backup in filling {
                encoder.put_u16_le(backup.0);
            }
        }
        encoder.finish()
    }

    /// Decodes a request; fails on short or trailing bytes, and where a request would
    /// have two encodings: a holder equal to the owner in the short form, a filling count
    /// of 0.
    pub fn decode(payload: Bytes) -> Result<RecoverRequest, ProtoError> {
        let invalid = |detail: String| ProtoError::Invalid {
            what: "recover request",
            detail,
        };
        let mut decoder = Decoder::new(payload);
        let owner = NodeId(decoder.get_u16_le("owner")?);
        let zone = decoder.get_u32_le("zone")?;
        let mut holder = None;
        let mut filling = Vec::new();
        if decoder.remaining() > 0 {
            let node = NodeId(decoder.get_u16_le("holder")?);
            if decoder.remaining() == 0 {
                if node == owner {
                    return Err(invalid(format!("holder {node} is the owner")));
                }
                holder = Some(node);
            } else {
                holder = (node != owner).then_some(node);
                let count = usize::from(decoder.get_u8("filling count")?);
                if count == 0 || count > FILLING_MAX {
                    return Err(invalid(format!("{count} filling backups")));
                }
                for _ in 0..count {
                    filling.push(NodeId(decoder.get_u16_le("filling backup")?));
                }
            }
        }
        decoder.finish()?;
        Ok(RecoverRequest {
            owner,
            zone,
            holder,
            filling,
        })
    }
}

impl CidRange {
    fn encode_into(&self, encoder: &mut Encoder) {
        encoder
            .put_u16_le(self.creator.0)
            .put_varint(self.first)
            .put_varint(self.last.saturating_sub(self.first));
    }

    fn decode_from(decoder: &mut Decoder) -> Result<CidRange, ProtoError> {
        let creator = NodeId(decoder.get_u16_le("creator")?);
        let first = decoder.get_varint("first")?;
        let span = decoder.get_varint("span")?;
        let last = first.checked_add(span).filter(|last| *last <= LOCAL_ID_MAX);
        match last {
            Some(last) if first <= LOCAL_ID_MAX => Ok(CidRange {
                creator,
                first,
                last,
            }),
            _ => Err(ProtoError::Invalid {
                what: "CID range",
                detail: format!("{first} + {span} exceeds 48-bit local IDs"),
            }),
        }
    }
}

impl RecoverReply {
    /// The reply's bytes: tag 0, chunks, bytes, ms (varints), range count (varint), each
    /// range as creator (u16 LE), first (varint), last − first (varint); or tag 1 + reason;
    /// or tag 2 (not held).
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::new();
        match self {
            RecoverReply::Recovered {
                chunks,
                bytes,
                ms,
                ranges,
            } => {
                encoder
                    .put_u8(0)
                    .put_varint(*chunks)
                    .put_varint(*bytes)
                    .put_varint(*ms)
                    .put_varint(ranges.len() as u64);
                for range in ranges {
                    range.encode_into(&mut encoder);
                }
            }
            RecoverReply::Failed(reason) => {
                encoder.put_u8(1).put_str(reason);
            }
            RecoverReply::NotHeld => {
                encoder.put_u8(2);
            }
        }
        encoder.finish()
    }

    /// Decodes a reply.
    pub fn decode(payload: Bytes) -> Result<RecoverReply, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let reply = match decoder.get_u8("recover reply tag")? {
            0 => {
                let chunks = decoder.get_varint("chunks")?;
                let bytes = decoder.get_varint("bytes")?;
                let ms = decoder.get_varint("ms")?;
                let n = count(&mut decoder, "recovered ranges", RANGES_MAX, 4)?;
                let mut ranges = Vec::with_capacity(n);
                for _ in 0..n {
                    ranges.push(CidRange::decode_from(&mut decoder)?);
                }
                RecoverReply::Recovered {
                    chunks,
                    bytes,
                    ms,
                    ranges,
                }
            }
            1 => RecoverReply::Failed(decoder.get_str("failure reason", usize::MAX)?.to_owned()),
            2 => RecoverReply::NotHeld,
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "recover reply",
                    tag,
                })
            }
        };
        decoder.finish()?;
        Ok(reply)
    }
}

impl RecoveryState {
    fn tag(self) -> u8 {
        match self {
            RecoveryState::Pending => 0,
            RecoveryState::Running => 1,
            RecoveryState::Done => 2,
            RecoveryState::Failed => 3,
            RecoveryState::Waiting => 4,
            RecoveryState::Lost => 5,
        }
    }

    fn from_tag(tag: u8) -> Result<RecoveryState, ProtoError> {
        Ok(match tag {
            0 => RecoveryState::Pending,
            1 => RecoveryState::Running,
            2 => RecoveryState::Done,
            3 => RecoveryState::Failed,
            4 => RecoveryState::Waiting,
            5 => RecoveryState::Lost,
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "recovery state",
                    tag,
                })
            }
        })
    }
}

impl RecoveryStatusReply {
    /// The reply's bytes: leader (u8 0/1), zone count (varint), each zone as owner (u16
    /// LE), zone (u32 LE), state (u8), restorer (u16 LE, 0 = none), chunks, ms (varints),
    /// detail (string).
    pub fn encode(&self) -> Bytes {
        let mut encoder = Encoder::new();
        encoder
            .put_u8(u8::from(self.leader))
            .put_varint(self.zones.len() as u64);
        for zone in &self.zones {
            encoder
                .put_u16_le(zone.owner.0)
                .put_u32_le(zone.zone)
                .put_u8(zone.state.tag())
                .put_u16_le(zone.restorer.map_or(0, |node| node.0))
                .put_varint(zone.chunks)
                .put_varint(zone.ms)
                .put_str(&zone.detail);
        }
        encoder.finish()
    }

    /// Decodes a reply.
    pub fn decode(payload: Bytes) -> Result<RecoveryStatusReply, ProtoError> {
        let mut decoder = Decoder::new(payload);
        let leader = match decoder.get_u8("leader flag")? {
            0 => false,
            1 => true,
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "leader flag",
                    tag,
                })
            }
        };
        let n = count(&mut decoder, "recovery zones", ZONES_MAX, 12)?;
        let mut zones = Vec::with_capacity(n);
        for _ in 0..n {
            let owner = NodeId(decoder.get_u16_le("owner")?);
            let zone = decoder.get_u32_le("zone")?;
            let state = RecoveryState::from_tag(decoder.get_u8("recovery state")?)?;
            let restorer = match decoder.get_u16_le("restorer")? {
                0 => None,
                id => Some(NodeId(id)),
            };
            let chunks = decoder.get_varint("chunks")?;
            let ms = decoder.get_varint("ms")?;
            let detail = decoder.get_str("detail", usize::MAX)?.to_owned();
            zones.push(ZoneRecovery {
                owner,
                zone,
                state,
                restorer,
                chunks,
                ms,
                detail,
            });
        }
        decoder.finish()?;
        Ok(RecoveryStatusReply { leader, zones })
    }
}

/// Sorts `cids` (raw CIDs) and merges consecutive ones of one creator into ranges.
pub fn ranges_of(cids: &mut [u64]) -> Vec<CidRange> {
    cids.sort_unstable();
    let mut ranges: Vec<CidRange> = Vec::new();
    for &raw in cids.iter() {
        let cid = ChunkId::from_raw(raw);
        let (creator, lid) = (cid.creator(), cid.local_id());
        match ranges.last_mut() {
            Some(last) if last.creator == creator && last.last.checked_add(1) == Some(lid) => {
                last.last = lid
            }
            Some(last) if last.creator == creator && last.last == lid => {}
            _ => ranges.push(CidRange {
                creator,
                first: lid,
                last: lid,
            }),
        }
    }
    ranges
}

/// Appends `cid` (raw) to `runs`, inclusive ranges of raw CIDs: it extends the last run
/// when it follows it directly, else it starts a new one. CIDs handed over in ascending
/// order (as a restorer reads them from a log segment) cost one run per gap, so a zone's
/// millions of CIDs become a few runs without sorting them ([`ranges_of_runs`]).
pub fn push_run(runs: &mut Vec<(u64, u64)>, cid: u64) {
    match runs.last_mut() {
        Some((_, last)) if last.checked_add(1) == Some(cid) => *last = cid,
        _ => runs.push((cid, cid)),
    }
}

/// The ranges of the CIDs covered by `runs` (inclusive ranges of raw CIDs, in any order,
/// possibly overlapping): sorted, merged per creator, as [`ranges_of`] gives for the same
/// CIDs. Sorts `runs`.
pub fn ranges_of_runs(runs: &mut [(u64, u64)]) -> Vec<CidRange> {
    runs.sort_unstable();
    // First the runs merged into disjoint, non-adjacent intervals of raw CIDs (sorted),
    // then each interval cut where it crosses from one creator to the next.
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for &(first, last) in runs.iter() {
        if first > last {
            continue;
        }
        match merged.last_mut() {
            Some((_, end)) if end.checked_add(1).is_none_or(|next| next >= first) => {
                *end = (*end).max(last);
            }
            _ => merged.push((first, last)),
        }
    }
    let mut ranges: Vec<CidRange> = Vec::new();
    for (first, last) in merged {
        let mut start = first;
        loop {
            let cid = ChunkId::from_raw(start);
            let creator = cid.creator();
            let creator_end = (u64::from(creator.0) << 48) | LOCAL_ID_MAX;
            let end = last.min(creator_end);
            ranges.push(CidRange {
                creator,
                first: cid.local_id(),
                last: end & LOCAL_ID_MAX,
            });
            if end == last {
                break;
            }
            start = end + 1;
        }
    }
    ranges
}

/// Runs every decoder of this family on `bytes` (for the fuzz target).
pub fn fuzz_decode(bytes: &[u8]) {
    let payload = Bytes::copy_from_slice(bytes);
    if let Ok(request) = RecoverRequest::decode(payload.clone()) {
        assert_eq!(request.encode(), payload);
    }
    if let Ok(reply) = RecoverReply::decode(payload.clone()) {
        // Varints have one canonical form per value only when minimal; compare values.
        assert_eq!(RecoverReply::decode(reply.encode()).ok(), Some(reply));
    }
    if let Ok(reply) = RecoveryStatusReply::decode(payload) {
        assert_eq!(
            RecoveryStatusReply::decode(reply.encode()).ok(),
            Some(reply)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range() -> impl Strategy<Value = CidRange> {
        (any::<u16>(), 0..=LOCAL_ID_MAX, 0u64..1 << 20).prop_map(|(creator, first, span)| {
            let first = first.min(LOCAL_ID_MAX - span);
            CidRange {
                creator: NodeId(creator),
                first,
                last: first + span,
            }
        })
    }

    fn state() -> impl Strategy<Value = RecoveryState> {
        prop_oneof![
            Just(RecoveryState::Pending),
            Just(RecoveryState::Running),
            Just(RecoveryState::Done),
            Just(RecoveryState::Waiting),
            Just(RecoveryState::Lost),
            Just(RecoveryState::Failed),
        ]
    }

    proptest! {
        #[test]
        fn requests_round_trip(
            owner in any::<u16>(),
            zone in any::<u32>(),
            holder in proptest::option::of(any::<u16>()),
            filling in proptest::collection::vec(any::<u16>(), 0..=FILLING_MAX),
        ) {
            let request = RecoverRequest {
                owner: NodeId(owner),
                zone,
                holder: holder.map(NodeId).filter(|holder| holder.0 != owner),
                filling: filling.into_iter().map(NodeId).collect(),
            };
            prop_assert_eq!(RecoverRequest::decode(request.encode()), Ok(request));
        }

        #[test]
        fn replies_round_trip(
            chunks in any::<u64>(),
            bytes in any::<u64>(),
            ms in any::<u64>(),
            ranges in proptest::collection::vec(range(), 0..20),
            reason in ".{0,40}",
        ) {
            for reply in [
                RecoverReply::Recovered { chunks, bytes, ms, ranges: ranges.clone() },
                RecoverReply::Failed(reason.clone()),
                RecoverReply::NotHeld,
            ] {
                prop_assert_eq!(RecoverReply::decode(reply.encode()), Ok(reply));
            }
        }

        #[test]
        fn status_round_trips(
            leader in any::<bool>(),
            zones in proptest::collection::vec(
                (any::<u16>(), any::<u32>(), state(), any::<u16>(), any::<u64>(), any::<u64>(), ".{0,20}"),
                0..10,
            ),
        ) {
            let reply = RecoveryStatusReply {
                leader,
                zones: zones
                    .into_iter()
                    .map(|(owner, zone, state, restorer, chunks, ms, detail)| ZoneRecovery {
                        owner: NodeId(owner),
                        zone,
                        state,
                        restorer: (restorer != 0).then_some(NodeId(restorer)),
                        chunks,
                        ms,
                        detail,
                    })
                    .collect(),
            };
            prop_assert_eq!(RecoveryStatusReply::decode(reply.encode()), Ok(reply));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            fuzz_decode(&bytes);
        }
    }

    /// Byte identity of the recovery and migration messages across codec changes: a seeded
    /// sample folded into one digest (see `crate::digest`).
    #[test]
    fn encodings_match_the_recorded_digest() {
        use crate::digest::{sample, Digest};
        use crate::migrate::{MigrateReply, MigrateRequest};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let mut digest = Digest::new();
        let request = (
            any::<u16>(),
            any::<u32>(),
            proptest::option::of(any::<u16>()),
        );
        let reply = (
            (any::<u64>(), any::<u64>(), any::<u64>()),
            proptest::collection::vec(range(), 0..20),
            ".{0,40}",
        );
        let status = (
            any::<bool>(),
            proptest::collection::vec(
                (
                    any::<u16>(),
                    any::<u32>(),
                    state(),
                    any::<u16>(),
                    any::<u64>(),
                    any::<u64>(),
                    ".{0,20}",
                ),
                0..10,
            ),
        );
        let migrate = (
            any::<u16>(),
            0..=LOCAL_ID_MAX,
            0..=LOCAL_ID_MAX,
            any::<u16>(),
            any::<u64>(),
            ".{0,40}",
        );
        for _ in 0..300 {
            let (owner, zone, holder) = sample(&mut runner, &request);
            let holder = holder.map(NodeId).filter(|holder| holder.0 != owner);
            digest.add(
                &RecoverRequest {
                    owner: NodeId(owner),
                    zone,
                    holder,
                    filling: Vec::new(),
                }
                .encode(),
            );
            let ((chunks, bytes, ms), ranges, reason) = sample(&mut runner, &reply);
            digest.add(
                &RecoverReply::Recovered {
                    chunks,
                    bytes,
                    ms,
                    ranges,
                }
                .encode(),
            );
            digest.add(&RecoverReply::Failed(reason).encode());
            let (leader, zones) = sample(&mut runner, &status);
            let zones = zones
                .into_iter()
                .map(
                    |(owner, zone, state, restorer, chunks, ms, detail)| ZoneRecovery {
                        owner: NodeId(owner),
                        zone,
                        state,
                        restorer: (restorer != 0).then_some(NodeId(restorer)),
                        chunks,
                        ms,
                        detail,
                    },
                )
                .collect();
            digest.add(&RecoveryStatusReply { leader, zones }.encode());
            let (creator, a, b, to, moved, failed) = sample(&mut runner, &migrate);
            let cid = |local| ChunkId::new(NodeId(creator), local).expect("a 48-bit local ID");
            let request = MigrateRequest {
                first: cid(a.min(b)),
                last: cid(a.max(b)),
                to: NodeId(to),
            };
            digest.add(&request.encode());
            digest.add(&MigrateReply::Moved(moved).encode());
            digest.add(&MigrateReply::Failed(failed).encode());
        }
        assert_eq!(
            digest,
            Digest {
                encodings: 2_100,
                bytes: 147_860,
                fnv: 0x3da9b7dae96e8dfe
            }
        );
    }

    #[test]
    fn bad_input_is_refused() {
        assert!(RecoverRequest::decode(Bytes::from_static(&[1, 0, 2])).is_err());
        // A holder equal to the owner has the shorter encoding; a lone byte is short.
        assert!(RecoverRequest::decode(Bytes::from_static(&[1, 0, 2, 0, 0, 0, 1, 0])).is_err());
        assert!(RecoverRequest::decode(Bytes::from_static(&[1, 0, 2, 0, 0, 0, 1])).is_err());
        assert_eq!(
            RecoverRequest::decode(Bytes::from_static(&[1, 0, 2, 0, 0, 0, 5, 0])),
            Ok(RecoverRequest {
                owner: NodeId(1),
                zone: 2,
                holder: Some(NodeId(5)),
                filling: Vec::new(),
            })
        );
        // With filling backups: the owner's ID stands for no holder; the count is 1..=16.
        assert_eq!(
            RecoverRequest::decode(Bytes::from_static(&[1, 0, 2, 0, 0, 0, 1, 0, 1, 9, 0])),
            Ok(RecoverRequest {
                owner: NodeId(1),
                zone: 2,
                holder: None,
                filling: vec![NodeId(9)],
            })
        );
        for bad in [
            &[1, 0, 2, 0, 0, 0, 1, 0, 0][..],
            &[1, 0, 2, 0, 0, 0, 1, 0, 17],
            &[1, 0, 2, 0, 0, 0, 1, 0, 2, 9, 0],
            &[1, 0, 2, 0, 0, 0, 1, 0, 1, 9, 0, 0],
        ] {
            assert!(
                RecoverRequest::decode(Bytes::copy_from_slice(bad)).is_err(),
                "{bad:?}"
            );
        }
        assert!(RecoverReply::decode(Bytes::from_static(&[7])).is_err());
        // A huge range count with no bytes behind it.
        assert!(RecoverReply::decode(Bytes::from_static(&[0, 0, 0, 0, 0xff, 0xff, 0x03])).is_err());
        // A range past 48 bits.
        let mut encoder = Encoder::new();
        encoder
            .put_u8(0)
            .put_varint(1)
            .put_varint(1)
            .put_varint(1)
            .put_varint(1)
            .put_u16_le(3)
            .put_varint(LOCAL_ID_MAX)
            .put_varint(1);
        assert!(RecoverReply::decode(encoder.finish()).is_err());
        assert!(RecoveryStatusReply::decode(Bytes::from_static(&[2, 0])).is_err());
    }

    proptest::proptest! {
        /// Runs built with `push_run` from any CIDs, in any order and with duplicates,
        /// give exactly the ranges `ranges_of` gives for the CIDs themselves.
        #[test]
        fn runs_give_the_same_ranges_as_cids(
            cids in proptest::collection::vec(
                (0u16..3, proptest::prop_oneof![0u64..40, (LOCAL_ID_MAX - 3)..=LOCAL_ID_MAX]),
                0..200,
            ),
            batches in 1usize..6,
        ) {
            let raw: Vec<u64> = cids
                .iter()
                .map(|&(creator, lid)| (u64::from(creator) << 48) | lid)
                .collect();
            // As restorer threads do: each batch compressed on its own.
            let mut runs = Vec::new();
            for batch in raw.chunks(raw.len().div_ceil(batches).max(1)) {
                let mut local = Vec::new();
                for &cid in batch {
                    push_run(&mut local, cid);
                }
                runs.extend(local);
            }
            let mut sorted = raw.clone();
            proptest::prop_assert_eq!(ranges_of_runs(&mut runs), ranges_of(&mut sorted));
        }
    }

    #[test]
    fn ranges_merge_per_creator() {
        let cid = |creator: u16, lid: u64| (u64::from(creator) << 48) | lid;
        let mut cids = vec![
            cid(2, 5),
            cid(1, 3),
            cid(1, 1),
            cid(1, 2),
            cid(2, 6),
            cid(2, 9),
            cid(1, 2),
        ];
        assert_eq!(
            ranges_of(&mut cids),
            vec![
                CidRange {
                    creator: NodeId(1),
                    first: 1,
                    last: 3
                },
                CidRange {
                    creator: NodeId(2),
                    first: 5,
                    last: 6
                },
                CidRange {
                    creator: NodeId(2),
                    first: 9,
                    last: 9
                },
            ]
        );
    }
}
