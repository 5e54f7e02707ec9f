//! Snapshots of the replicator for the node's monitoring and for tests: per zone its usage,
//! backups, registration and unacknowledged operations; per backup stream its sequence
//! numbers and window. Taken under one hold of the state lock. See the
//! [module docs](super).

use myriad_placement::zones::ZoneUsage;
use myriad_placement::ZoneId;
use myriad_types::NodeId;

use super::zones::Registration;
use super::Replicator;

/// One zone in [`ReplicatorStats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneStats {
    /// The zone.
    pub zone: u32,
    /// Payload bytes of its live chunks.
    pub payload_bytes: u64,
    /// Its live chunks.
    pub chunks: u64,
    /// Its backups, in order.
    pub backups: Vec<NodeId>,
    /// Its registration with the cluster completed.
    pub registered: bool,
    /// Re-replications to new backups in progress.
    pub resyncs: usize,
    /// Operations of the zone not yet acknowledged, summed over its streams (counted per
    /// message: a partly acknowledged message still counts whole).
    pub unacknowledged_ops: u64,
    /// For a zone adopted from a failed peer ([`Replicator::adopt_zone`]): its log identity
    /// `(owner, zone)`, the name it has in the backups' logs and the zone table.
    pub adopted_from: Option<(NodeId, u32)>,
}

/// One backup stream in [`ReplicatorStats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStats {
    /// The backup.
    pub backup: NodeId,
    /// Operations assigned so far (the last sequence number).
    pub assigned_seq: u64,
    /// Operations the backup applied.
    pub applied_seq: u64,
    /// Operations on the backup's disk.
    pub durable_seq: u64,
    /// Operations not yet acknowledged as applied.
    pub unacknowledged_ops: u64,
    /// Sent messages kept for resending.
    pub unacknowledged_messages: usize,
    /// Bytes pending or unacknowledged.
    pub unacknowledged_bytes: usize,
    /// Times the window was resent.
    pub resends: u64,
    /// Batches of new messages handed to the send task by the writing thread itself
    /// (its stream was idle) and by the sender thread.
    pub shipped_by_writer: u64,
    /// See `shipped_by_writer`.
    pub shipped_by_sender: u64,
}

/// A snapshot of a [`Replicator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicatorStats {
    /// Every zone, by number.
    pub zones: Vec<ZoneStats>,
    /// Every backup stream, by backup.
    pub streams: Vec<StreamStats>,
}

impl Replicator {
    /// Per zone: bytes, chunks, backups; per backup stream: sequence numbers and
    /// unacknowledged counts.
    pub fn stats(&self) -> ReplicatorStats {
        let state = self.inner.state.lock();
        let zones = state
            .tree
            .zones()
            .map(|(zone, usage): (ZoneId, ZoneUsage)| {
                let z = state.zones.get(&zone.0);
                let key = z.map_or((None, zone.0), |z| z.key(zone.0));
                ZoneStats {
                    zone: zone.0,
                    payload_bytes: usage.payload_bytes,
                    chunks: usage.chunks,
                    backups: z.map(|z| z.backups.clone()).unwrap_or_default(),
                    registered: z.is_some_and(|z| z.registration == Registration::Done),
                    resyncs: z.map_or(0, |z| z.resyncs.len()),
                    unacknowledged_ops: state
                        .streams
                        .values()
                        .filter_map(|s| s.unacknowledged_per_zone.get(&key))
                        .sum(),
                    adopted_from: z.and_then(|z| z.log),
                }
            })
            .collect();
        let mut streams: Vec<StreamStats> = state
            .streams
            .iter()
            .map(|(&backup, s)| StreamStats {
                backup,
                assigned_seq: s.next_seq - 1,
                applied_seq: s.applied,
                durable_seq: s.durable,
                unacknowledged_ops: s.next_seq - 1 - s.applied,
                unacknowledged_messages: s.window.len(),
                unacknowledged_bytes: s.unacknowledged_bytes(),
                resends: s.resends,
                shipped_by_writer: s.shipped_by_writer,
                shipped_by_sender: s.shipped_by_sender,
            })
            .collect();
        streams.sort_by_key(|s| s.backup);
        ReplicatorStats { zones, streams }
    }
}
