//! Monitoring like DXMonitor: peers push a summary of themselves to every superpeer every
//! [`MONITOR_INTERVAL`]; superpeers keep the last [`MONITOR_HISTORY`] reports per peer
//! and answer queries for them (`myriad term`'s `monitoring`).
//!
//! # Job
//! - [`push_reports`]: a peer's task: every interval, reads its process figures
//!   (`/proc`), its connections' byte counters, its memory manager, its chunk request
//!   counter, its log engine's bytes written and its hottest CID ranges of the interval
//!   (rolled from [`crate::ops::range_heat::RangeHeat`]), and sends one
//!   [`MonitorReport`] to each configured superpeer ([`types::MONITOR_REPORT`], one-way).
//! - [`MonitorStore`]: a superpeer's reports, per peer, oldest first; registered as the
//!   handlers of [`types::MONITOR_REPORT`] and [`types::MONITOR_QUERY`] by
//!   [`MonitorStore::register`].
//!
//! # Invariants
//! - Bounded: at most [`MONITOR_HISTORY`] reports per node; a node silent for
//!   [`MONITOR_FORGET_AFTER`] is forgotten (a node that left or failed drops out).
//! - Pushing never blocks a request path: it is one task on the peer's runtime, and a
//!   superpeer that is down only loses its reports (each superpeer keeps its own copy,
//!   so any one answers).
//! - Every report is a full summary of running totals and levels: rates come from two
//!   consecutive reports, and a lost report costs resolution only.
//!
//! # Who calls it
//! [`crate::peer::PeerNode::start`] spawns [`push_reports`]; the superpeer's handler
//! set registers a [`MonitorStore`].

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use myriad_membership::Membership;
use myriad_net::{Handlers, Incoming, NetError};
use myriad_proto::monitor::{
    HotRange, MonitorQuery, MonitorReply, MonitorReport, HOT_RANGES_MAX, MONITOR_REPORTS_MAX,
};
use myriad_proto::types;
use myriad_replication::BackupService;
use myriad_types::NodeId;
use parking_lot::Mutex;

use crate::peer::ChunkService;

/// How often a peer pushes its summary.
pub const MONITOR_INTERVAL: Duration = Duration::from_secs(2);
/// Reports a superpeer keeps per node: five minutes at [`MONITOR_INTERVAL`].
pub const MONITOR_HISTORY: usize = 150;
/// A node whose last report is this old is forgotten.
pub const MONITOR_FORGET_AFTER: Duration = Duration::from_secs(300);

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// A peer's summary now, naming `hot_ranges` (the interval's, from the range counters).
pub fn report(
    service: &ChunkService,
    membership: &Membership,
    backup: Option<&BackupService>,
    hot_ranges: Vec<HotRange>,
) -> MonitorReport {
    let process = super::process::process_stats();
    let net = membership.net();
    let (mut sent, mut received) = (0u64, 0u64);
    for node in net.connected_nodes() {
        if let Some(stats) = net.connection_stats(node) {
            sent += stats.bytes_sent;
            received += stats.bytes_received;
        }
    }
    let memory = service.memory().stats();
    let disk_written_bytes = backup.map_or(0, |backup| {
        let stats = backup.engine().stats();
        stats.secondary_device_bytes_written
            + stats.version_log_bytes_written
            + stats.primary_bytes_written
            + stats.reorg_bytes_written
    });
    MonitorReport {
        unix_ms: unix_ms(),
        cpu_ms: process
            .cpu_seconds
            .map_or(0, |seconds| (seconds * 1_000.0) as u64),
        rss_bytes: process.resident_bytes.unwrap_or(0),
        net_sent_bytes: sent,
        net_received_bytes: received,
        disk_written_bytes,
        chunks: memory.chunks,
        payload_bytes: memory.payload_bytes,
        free_bytes: memory.free_bytes,
        requests_served: service.ops().total(),
        hot_ranges,
    }
}

/// A peer's monitoring task: pushes [`report`] to every superpeer each
/// [`MONITOR_INTERVAL`] until aborted.
pub async fn push_reports(
    service: Arc<ChunkService>,
    membership: Arc<Membership>,
    backup: Option<Arc<BackupService>>,
) {
    let mut tick = tokio::time::interval(MONITOR_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rolled = std::time::Instant::now();
    loop {
        tick.tick().await;
        let seconds = rolled.elapsed().as_secs_f64();
        rolled = std::time::Instant::now();
        let hot = service.ops().heat().roll(HOT_RANGES_MAX, seconds);
        let summary = report(&service, &membership, backup.as_deref(), hot).encode();
        for (superpeer, _) in membership.superpeers() {
            let sent: Result<(), NetError> = membership
                .net()
                .send(*superpeer, types::MONITOR_REPORT, summary.clone())
                .await;
            if let Err(error) = sent {
                tracing::debug!(%superpeer, %error, "monitoring report not sent");
            }
        }
    }
}

/// A superpeer's kept reports (see the module documentation).
#[derive(Debug, Default)]
pub struct MonitorStore {
    nodes: Mutex<HashMap<NodeId, VecDeque<MonitorReport>>>,
}

impl MonitorStore {
    /// Keeps `report` from `node`, dropping its oldest beyond [`MONITOR_HISTORY`] and
    /// every node silent for [`MONITOR_FORGET_AFTER`].
    pub fn record(&self, node: NodeId, report: MonitorReport) {
        let forget_before = unix_ms().saturating_sub(MONITOR_FORGET_AFTER.as_millis() as u64);
        let mut nodes = self.nodes.lock();
        nodes.retain(|_, reports| reports.back().is_some_and(|r| r.unix_ms >= forget_before));
        let reports = nodes.entry(node).or_default();
        if reports.len() >= MONITOR_HISTORY {
            reports.pop_front();
        }
        reports.push_back(report);
    }

    /// The reports `query` asks for: the newest `history.max(1)` per node, oldest first,
    /// nodes in ID order.
    pub fn query(&self, query: &MonitorQuery) -> MonitorReply {
        let keep = (query.history.max(1) as usize).min(MONITOR_REPORTS_MAX);
        let nodes = self.nodes.lock();
        let mut rows: Vec<(NodeId, Vec<MonitorReport>)> = nodes
            .iter()
            .filter(|(node, _)| query.node.is_none_or(|wanted| wanted == **node))
            .map(|(node, reports)| {
                let skip = reports.len().saturating_sub(keep);
                (*node, reports.iter().skip(skip).cloned().collect())
            })
            .collect();
        rows.sort_by_key(|(node, _)| *node);
        MonitorReply { nodes: rows }
    }

    /// Registers the handlers of [`types::MONITOR_REPORT`] (kept) and
    /// [`types::MONITOR_QUERY`] (answered) over this store.
    pub fn register(self: &Arc<Self>, handlers: &mut Handlers) -> Result<(), NetError> {
        let store = Arc::clone(self);
        handlers.register(types::MONITOR_REPORT, move |incoming: Incoming| {
            match MonitorReport::decode(incoming.payload.clone()) {
                Ok(report) => store.record(incoming.from, report),
                Err(error) => {
                    tracing::debug!(from = %incoming.from, %error, "malformed monitoring report")
                }
            }
        })?;
        let store = Arc::clone(self);
        handlers.register(types::MONITOR_QUERY, move |incoming: Incoming| {
            if !incoming.is_request() {
                return;
            }
            let reply = match MonitorQuery::decode(incoming.payload.clone()) {
                Ok(query) => store.query(&query),
                Err(_) => MonitorReply::default(),
            };
            let _ = incoming.respond(reply.encode());
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_the_newest_reports_per_node_and_answers_by_node() {
        let store = MonitorStore::default();
        let now = unix_ms();
        for i in 0..(MONITOR_HISTORY as u64 + 5) {
            store.record(
                NodeId(2),
                MonitorReport {
                    unix_ms: now + i,
                    chunks: i,
                    ..MonitorReport::default()
                },
            );
        }
        store.record(
            NodeId(3),
            MonitorReport {
                unix_ms: now,
                ..MonitorReport::default()
            },
        );
        let all = store.query(&MonitorQuery {
            node: None,
            history: 0,
        });
        assert_eq!(all.nodes.len(), 2);
        assert_eq!(all.nodes[0].0, NodeId(2));
        assert_eq!(all.nodes[0].1.len(), 1, "history 0: the newest only");
        assert_eq!(all.nodes[0].1[0].chunks, MONITOR_HISTORY as u64 + 4);
        let one = store.query(&MonitorQuery {
            node: Some(NodeId(2)),
            history: 10_000,
        });
        assert_eq!(one.nodes.len(), 1);
        let reports = &one.nodes[0].1;
        assert_eq!(reports.len(), MONITOR_HISTORY, "bounded history");
        assert_eq!(reports[0].chunks, 5, "the oldest dropped first");
        // A node silent for too long is forgotten when the next report arrives.
        store.record(
            NodeId(4),
            MonitorReport {
                unix_ms: 0,
                ..MonitorReport::default()
            },
        );
        store.record(
            NodeId(5),
            MonitorReport {
                unix_ms: now,
                ..MonitorReport::default()
            },
        );
        let all = store.query(&MonitorQuery {
            node: None,
            history: 1,
        });
        assert!(all.nodes.iter().all(|(node, _)| *node != NodeId(4)));
    }
}
