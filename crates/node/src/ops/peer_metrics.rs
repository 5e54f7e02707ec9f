//! A peer's metrics: what `GET /metrics` of a peer answers, read from each layer at
//! scrape time.
//!
//! # Families (all prefixed `myriad_`)
//! - chunk service: `chunk_requests_total{op,result}`,
//!   `chunk_request_duration_seconds{op}` (histogram), `chunk_locked`... see
//!   `docs/operations.md` for the full list;
//! - messaging ([`net_families`]): frames and bytes sent and received per peer node;
//! - memory manager: chunks, payload, allocated, free, metadata bytes, fragmentation;
//! - replication: per backup stream the operations not yet applied or durable (the lag),
//!   per zone the unacknowledged operations, resends, chunks waiting for re-replication;
//! - log engine (peers that keep backups): zones, segments, bytes appended and written
//!   per log, flushes, cleaning passes and the write amplification;
//! - the process (`process_*`).
//!
//! # Who calls it
//! `myriad peer` serves it through [`super::HttpServer`]; tests build it over a
//! [`PeerNode`].

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use myriad_net::NetHandle;
use myriad_replication::{BackupService, Replicator};

use super::prom::{render, Labels, Out, CONTENT_TYPE};
use super::{Page, Routes};
use crate::peer::{ChunkService, PeerNode};

/// The routes of a peer's HTTP endpoint: `/metrics`.
#[derive(Clone)]
pub struct PeerRoutes {
    service: Arc<ChunkService>,
    net: NetHandle,
    replicator: Option<Arc<Replicator>>,
    backup: Option<Arc<BackupService>>,
}

impl fmt::Debug for PeerRoutes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerRoutes")
            .field("node", &self.service.node())
            .finish_non_exhaustive()
    }
}

impl PeerRoutes {
    /// The routes of `node`.
    pub fn new(node: &PeerNode) -> PeerRoutes {
        PeerRoutes {
            service: Arc::clone(node.service()),
            net: node.membership().net().clone(),
            replicator: node.replicator().cloned(),
            backup: node.backup_service().cloned(),
        }
    }

    /// The metrics text now.
    pub fn metrics(&self) -> String {
        let routes = self.clone();
        render(move |out| routes.write(out))
    }

    fn write(&self, out: &mut Out<'_>) -> fmt::Result {
        out.gauge(
            "myriad_node_id",
            "This node's ID.",
            f64::from(self.service.node().0),
        )?;
        self.chunk_families(out)?;
        net_families(out, &self.net)?;
        self.memory_families(out)?;
        if let Some(replicator) = &self.replicator {
            replication_families(out, replicator, &self.service)?;
        }
        if let Some(backup) = &self.backup {
            log_families(out, backup)?;
        }
        out.process(&super::process::process_stats())
    }

    fn chunk_families(&self, out: &mut Out<'_>) -> fmt::Result {
        let snapshot = self.service.ops().snapshot();
        let mut counts = Vec::new();
        let mut histograms = Vec::new();
        for op in &snapshot {
            for (result, &count) in super::chunk_ops::RESULT_NAMES.iter().zip(&op.results) {
                counts.push((
                    vec![("op", op.op.to_owned()), ("result", (*result).to_owned())],
                    count,
                ));
            }
            histograms.push((
                vec![("op", op.op.to_owned())],
                op.sum_seconds,
                op.timed(),
                op.buckets.clone(),
            ));
        }
        out.counters(
            "myriad_chunk_requests",
            "Chunk requests served, by operation and result (failed: the whole request).",
            &counts,
        )?;
        out.histograms(
            "myriad_chunk_request_duration_seconds",
            "Time from a chunk request reaching the peer's handler to its reply.",
            &histograms,
        )?;
        out.counter(
            "myriad_chunk_changes_inline",
            "Replicated changes served on the I/O thread.",
            self.service.changes_served_inline(),
        )
    }

    fn memory_families(&self, out: &mut Out<'_>) -> fmt::Result {
        let stats = self.service.memory().stats();
        let rows: [(&str, &str, f64); 8] = [
            (
                "myriad_mem_chunks",
                "Live chunks in memory.",
                stats.chunks as f64,
            ),
            (
                "myriad_mem_payload_bytes",
                "Payload bytes of the live chunks.",
                stats.payload_bytes as f64,
            ),
            (
                "myriad_mem_allocated_bytes",
                "Bytes of the region in slabs and spans.",
                stats.allocated_bytes as f64,
            ),
            (
                "myriad_mem_metadata_bytes",
                "Bytes of CID tables, allocator descriptors and spare IDs.",
                stats.metadata_bytes as f64,
            ),
            (
                "myriad_mem_free_bytes",
                "Free bytes in the region.",
                stats.free_bytes as f64,
            ),
            (
                "myriad_mem_region_bytes",
                "Size of the memory region.",
                stats.region_bytes as f64,
            ),
            (
                "myriad_mem_fragmentation_ratio",
                "1 - largest free page block / free page bytes.",
                stats.fragmentation,
            ),
            (
                "myriad_mem_spare_local_ids",
                "Local IDs waiting for reuse.",
                stats.spare_local_ids as f64,
            ),
        ];
        for (name, help, value) in rows {
            out.gauge(name, help, value)?;
        }
        Ok(())
    }
}

impl Routes for PeerRoutes {
    fn get(&self, path: &str, _query: &str) -> Option<Page> {
        (path == "/metrics").then(|| Page {
            content_type: CONTENT_TYPE,
            body: Bytes::from(self.metrics()),
        })
    }
}

/// Reads a counter of one connection.
type ConnCounter = fn(&myriad_net::ConnectionStats) -> u64;
/// Reads a gauge of one connection.
type ConnGauge = fn(&myriad_net::ConnectionStats) -> f64;

/// The messaging layer's figures, per connected node (every node exports them).
pub(crate) fn net_families(out: &mut Out<'_>, net: &NetHandle) -> fmt::Result {
    let stats: Vec<_> = net
        .connected_nodes()
        .into_iter()
        .filter_map(|node| net.connection_stats(node))
        .collect();
    let label = |node: myriad_types::NodeId| -> Labels { vec![("peer", node.0.to_string())] };
    out.gauge(
        "myriad_net_connections",
        "Open connections to other nodes.",
        stats.len() as f64,
    )?;
    let counters: [(&str, &str, ConnCounter); 4] = [
        (
            "myriad_net_messages_sent",
            "Frames sent to the node.",
            |s| s.frames_sent,
        ),
        (
            "myriad_net_messages_received",
            "Frames received from the node.",
            |s| s.frames_received,
        ),
        (
            "myriad_net_bytes_sent",
            "Bytes sent to the node, frame headers included.",
            |s| s.bytes_sent,
        ),
        (
            "myriad_net_bytes_received",
            "Bytes received from the node.",
            |s| s.bytes_received,
        ),
    ];
    for (name, help, value) in counters {
        let rows: Vec<(Labels, u64)> = stats.iter().map(|s| (label(s.node), value(s))).collect();
        out.counters(name, help, &rows)?;
    }
    let gauges: [(&str, &str, ConnGauge); 3] = [
        (
            "myriad_net_queued_bytes",
            "Bytes queued for sending to the node.",
            |s| s.queued_bytes as f64,
        ),
        (
            "myriad_net_unprocessed_bytes",
            "Bytes received from the node not yet handled.",
            |s| s.unprocessed_bytes as f64,
        ),
        (
            "myriad_net_pending_requests",
            "Requests to the node waiting for a response.",
            |s| s.pending_requests as f64,
        ),
    ];
    for (name, help, value) in gauges {
        let rows: Vec<(Labels, f64)> = stats.iter().map(|s| (label(s.node), value(s))).collect();
        out.gauges(name, help, &rows)?;
    }
    Ok(())
}

/// The replicator's figures: zones, per backup stream the lag, per zone the
/// unacknowledged operations.
fn replication_families(
    out: &mut Out<'_>,
    replicator: &Replicator,
    service: &ChunkService,
) -> fmt::Result {
    let stats = replicator.stats();
    out.gauge(
        "myriad_replication_zones",
        "Backup zones of this peer's chunks.",
        stats.zones.len() as f64,
    )?;
    let backup = |node: myriad_types::NodeId| -> Labels { vec![("backup", node.0.to_string())] };
    let applied: Vec<(Labels, f64)> = stats
        .streams
        .iter()
        .map(|s| (backup(s.backup), s.unacknowledged_ops as f64))
        .collect();
    out.gauges(
        "myriad_replication_lag_ops",
        "Operations sent to the backup and not yet applied by it.",
        &applied,
    )?;
    let durable: Vec<(Labels, f64)> = stats
        .streams
        .iter()
        .map(|s| {
            let lag = s.assigned_seq.saturating_sub(s.durable_seq);
            (backup(s.backup), lag as f64)
        })
        .collect();
    out.gauges(
        "myriad_replication_durable_lag_ops",
        "Operations sent to the backup and not yet on its disk.",
        &durable,
    )?;
    let unacked_bytes: Vec<(Labels, f64)> = stats
        .streams
        .iter()
        .map(|s| (backup(s.backup), s.unacknowledged_bytes as f64))
        .collect();
    out.gauges(
        "myriad_replication_unacknowledged_bytes",
        "Bytes pending or unacknowledged in the stream to the backup.",
        &unacked_bytes,
    )?;
    let resends: Vec<(Labels, u64)> = stats
        .streams
        .iter()
        .map(|s| (backup(s.backup), s.resends))
        .collect();
    out.counters(
        "myriad_replication_resends",
        "Times the stream's window was resent to the backup.",
        &resends,
    )?;
    let zones: Vec<(Labels, f64)> = stats
        .zones
        .iter()
        .map(|z| {
            (
                vec![("zone", z.zone.to_string())],
                z.unacknowledged_ops as f64,
            )
        })
        .collect();
    out.gauges(
        "myriad_replication_zone_lag_ops",
        "Operations of the zone not yet acknowledged by all its backups.",
        &zones,
    )?;
    out.gauge(
        "myriad_rereplication_pending_chunks",
        "Restored chunks not yet copied to their new backups.",
        service.rereplication_pending() as f64,
    )
}

/// The log engine's figures (a peer that keeps backups).
fn log_families(out: &mut Out<'_>, backup: &BackupService) -> fmt::Result {
    let stats = backup.engine().stats();
    let sum = |f: fn(&myriad_backup_log::ZoneStats) -> u64| -> f64 {
        stats.zones.iter().map(f).sum::<u64>() as f64
    };
    let gauges: [(&str, &str, f64); 10] = [
        (
            "myriad_log_zones",
            "Backup zones in this peer's log engine.",
            stats.zones.len() as f64,
        ),
        (
            "myriad_log_used_bytes",
            "Bytes used in the secondary logs (valid and outdated entries).",
            sum(|z| z.used_bytes),
        ),
        (
            "myriad_log_capacity_bytes",
            "Size of the secondary logs.",
            sum(|z| z.capacity_bytes),
        ),
        (
            "myriad_log_free_segments",
            "Free segments of the secondary logs.",
            sum(|z| z.free_segments as u64),
        ),
        (
            "myriad_log_secondary_buffer_bytes",
            "Bytes waiting in the zones' secondary-log buffers.",
            sum(|z| z.secondary_buffer_bytes),
        ),
        (
            "myriad_log_memory_bytes",
            "RAM of the log engine: write buffer and zones.",
            stats.memory_bytes as f64,
        ),
        (
            "myriad_log_write_buffer_capacity_bytes",
            "Size of the write buffer.",
            stats.write_buffer_capacity_bytes as f64,
        ),
        (
            "myriad_log_write_buffer_bytes",
            "Bytes in the write buffer's active half, not yet taken by the flusher.",
            stats.write_buffer_bytes as f64,
        ),
        (
            "myriad_log_write_buffer_fill_ratio",
            "Fill of the write buffer's active half (0..1; flushed at 15/16).",
            if stats.write_buffer_capacity_bytes == 0 {
                0.0
            } else {
                stats.write_buffer_bytes as f64 / (stats.write_buffer_capacity_bytes / 2) as f64
            },
        ),
        (
            "myriad_log_write_buffer_busy_halves",
            "Write-buffer halves the flusher and writer hold (0..3; 3: appends wait).",
            stats.write_buffer_busy_halves as f64,
        ),
    ];
    for (name, help, value) in gauges {
        out.gauge(name, help, value)?;
    }
    let counters: [(&str, &str, u64); 8] = [
        (
            "myriad_log_appended_entries",
            "Entries appended to the log engine.",
            stats.appended_entries,
        ),
        (
            "myriad_log_appended_payload_bytes",
            "Payload bytes appended to the log engine.",
            stats.appended_payload_bytes,
        ),
        ("myriad_log_removes", "Removes logged.", stats.removes),
        (
            "myriad_log_flushes",
            "Flushes of the write buffer.",
            stats.flushes,
        ),
        (
            "myriad_log_cleaning_passes",
            "Reorganization (cleaning) passes.",
            stats.reorg_passes,
        ),
        (
            "myriad_log_cleaning_urgent_passes",
            "Cleaning passes a write waited for.",
            stats.reorg_urgent_passes,
        ),
        (
            "myriad_log_cleaned_segments",
            "Segments cleaned.",
            stats.reorg_segments_cleaned,
        ),
        (
            "myriad_log_cleaning_bytes_written",
            "Bytes the cleaner wrote.",
            stats.reorg_bytes_written,
        ),
    ];
    for (name, help, value) in counters {
        out.counter(name, help, value)?;
    }
    let written = vec![
        (
            vec![("log", "secondary".to_owned())],
            stats.secondary_device_bytes_written,
        ),
        (
            vec![("log", "primary".to_owned())],
            stats.primary_bytes_written,
        ),
        (
            vec![("log", "version".to_owned())],
            stats.version_log_bytes_written,
        ),
    ];
    out.counters(
        "myriad_log_bytes_written",
        "Bytes handed to the storage, per log kind (cleaning included).",
        &written,
    )?;
    let device = stats.secondary_device_bytes_written
        + stats.primary_bytes_written
        + stats.version_log_bytes_written;
    let amplification = if stats.appended_payload_bytes == 0 {
        0.0
    } else {
        device as f64 / stats.appended_payload_bytes as f64
    };
    out.gauge(
        "myriad_log_write_amplification",
        "Bytes written to the storage per payload byte appended (0 before any append).",
        amplification,
    )?;
    out.gauge(
        "myriad_log_durable_seq",
        "Everything appended up to this sequence number is durable.",
        stats.durable_seq as f64,
    )
}
