//! The superpeers' status page: a sampler that keeps a short history of the cluster (the
//! request rate of every peer, node state changes, zone recoveries), and the JSON that
//! the page (`status.html`, served at `/`) and `GET /api/status` show.
//!
//! # Job
//! - [`Sampler`]: a thread of the superpeer's HTTP endpoint; every [`SAMPLE_INTERVAL`] it
//!   reads the applied metadata (nodes, zones), the leader's recovery table (its own when
//!   it leads, else asked from the leader with `RECOVERY_STATUS`), and each alive peer's
//!   request counter (`ChunkRequest::Stats`, `requests_served`), and records rates and
//!   events in a [`History`] of the last [`HISTORY_SAMPLES`] samples.
//! - [`status_json`]: everything the page shows, as one JSON value.
//! - [`page`]: the HTML with the current status embedded, so the first paint needs no
//!   request; its inline script then polls `/api/status` every second. No build step,
//!   no external resource.
//!
//! # Invariants
//! - Every superpeer samples on its own (the metadata is the Raft state every member
//!   applies; only the recovery table lives at the leader, and is fetched from it), so the
//!   page works on any of them and follows leader changes.
//! - Bounded: the history keeps at most [`HISTORY_SAMPLES`] samples and [`EVENTS_MAX`]
//!   events; every request to another node has a timeout; a peer that does not answer is
//!   left out of that sample.
//!
//! # Who calls it
//! [`super::superpeer_metrics::SuperpeerRoutes`], which starts the sampler with the routes
//! and stops it when they drop.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use myriad_meta::{NodeState, Role};
use myriad_proto::chunk::{ChunkReply, ChunkRequest};
use myriad_proto::recovery::RecoveryStatusReply;
use myriad_proto::types;
use myriad_raft::MetaRaft;
use myriad_types::NodeId;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::superpeer_metrics::{recovery_state_name, role_name, state_name};
use crate::superpeer::Core;

/// How often the sampler reads the cluster.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept: five minutes at [`SAMPLE_INTERVAL`].
pub const HISTORY_SAMPLES: usize = 300;
/// Timeline events kept (oldest dropped first).
pub const EVENTS_MAX: usize = 200;
/// Zone rows the page lists at most (the count is always given).
pub const ZONES_SHOWN_MAX: usize = 500;
/// Longest wait for one peer's or the leader's answer.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(700);

/// One sample of the cluster's request rates.
#[derive(Debug, Clone)]
struct Sample {
    unix_ms: u64,
    /// Requests per second of each peer that answered (none in a peer's first sample).
    rates: Vec<(u16, f64)>,
    /// Chunks stored on the peers that answered.
    chunks: u64,
}

/// Something that happened to a node or a zone.
#[derive(Debug, Clone)]
struct TimelineEvent {
    unix_ms: u64,
    /// `joined`, `failed`, `left`, `rejoined`, `restarted`, `recovered`, `lost`.
    kind: &'static str,
    node: u16,
    text: String,
}

/// The sampler's records. See the module documentation.
#[derive(Debug, Default)]
pub struct History {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    samples: VecDeque<Sample>,
    events: VecDeque<TimelineEvent>,
    /// Each node's state and incarnation at the last sample (`None` before the first).
    nodes: Option<HashMap<u16, (&'static str, u32)>>,
    /// Each peer's last `requests_served` reading.
    served: HashMap<u16, (Instant, u64)>,
    /// Zone recoveries already put on the timeline: (owner, zone, restorer).
    recoveries_seen: HashSet<(u16, u32, u16)>,
    /// The leader's recovery table at the last sample.
    recovery: RecoveryStatusReply,
}

impl Inner {
    fn event(&mut self, kind: &'static str, node: u16, text: String) {
        if self.events.len() == EVENTS_MAX {
            self.events.pop_front();
        }
        self.events.push_back(TimelineEvent {
            unix_ms: unix_ms(),
            kind,
            node,
            text,
        });
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

/// One node of the metadata, as the sampler and the page see it.
struct NodeView {
    id: u16,
    role: Role,
    state: NodeState,
    incarnation: u32,
    rack: u16,
    switch: u16,
    address: String,
}

fn nodes(raft: &MetaRaft) -> Vec<NodeView> {
    raft.read_local(|state| {
        state
            .nodes()
            .map(|node| NodeView {
                id: node.id.0,
                role: node.role,
                state: node.state,
                incarnation: node.incarnation,
                rack: node.rack,
                switch: node.switch,
                address: node.address.clone(),
            })
            .collect()
    })
}

/// The sampler thread; stops (and is joined) when dropped.
#[derive(Debug)]
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling `core` into `history` every [`SAMPLE_INTERVAL`].
    pub(crate) fn start(core: Arc<Core>, history: Arc<History>) -> std::io::Result<Sampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("status-sampler".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    sample(&core, &history);
                    while started.elapsed() < SAMPLE_INTERVAL && !flag.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            })?;
        Ok(Sampler {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The leader's recovery table: this superpeer's own when it leads, else the leader's.
fn recovery_status(core: &Core) -> Option<RecoveryStatusReply> {
    let raft = core.raft()?;
    if raft.is_leader() {
        return Some(core.recovery_status());
    }
    let leader = core.leader()?;
    let reply = core
        .net()
        .request_blocking(
            leader,
            types::RECOVERY_STATUS,
            Bytes::new(),
            REQUEST_TIMEOUT,
        )
        .ok()?;
    RecoveryStatusReply::decode(reply).ok()
}

/// A peer's `requests_served` counter, if it answers in time.
fn requests_served(core: &Core, peer: NodeId) -> Option<(u64, u64)> {
    // A follower learns a peer's address only when it has reason to talk to it.
    core.sync_address(peer);
    let reply = core
        .net()
        .request_blocking(
            peer,
            types::CHUNK,
            ChunkRequest::Stats.encode(),
            REQUEST_TIMEOUT,
        )
        .ok()?;
    match ChunkReply::decode(reply).ok()? {
        ChunkReply::Stats(stats) => Some((stats.requests_served, stats.chunks)),
        _ => None,
    }
}

/// One round of the sampler.
fn sample(core: &Core, history: &History) {
    let Some(raft) = core.raft() else {
        return;
    };
    let nodes = nodes(raft);
    let recovery = recovery_status(core);
    let readings: Vec<(u16, Option<(u64, u64)>)> = nodes
        .iter()
        .filter(|node| node.role == Role::Peer && node.state == NodeState::Alive)
        .map(|node| (node.id, requests_served(core, NodeId(node.id))))
        .collect();
    let now = Instant::now();
    let mut inner = history.inner.lock();
    record_node_changes(&mut inner, &nodes);
    if let Some(recovery) = recovery {
        record_recoveries(&mut inner, &recovery);
        inner.recovery = recovery;
    }
    let mut rates = Vec::new();
    let mut chunks = 0;
    for (peer, reading) in readings {
        let Some((served, peer_chunks)) = reading else {
            continue;
        };
        chunks += peer_chunks;
        if let Some((at, before)) = inner.served.get(&peer) {
            let seconds = now.duration_since(*at).as_secs_f64();
            if served >= *before && seconds > 0.0 {
                rates.push((peer, (served - before) as f64 / seconds));
            }
        }
        inner.served.insert(peer, (now, served));
    }
    if inner.samples.len() == HISTORY_SAMPLES {
        inner.samples.pop_front();
    }
    inner.samples.push_back(Sample {
        unix_ms: unix_ms(),
        rates,
        chunks,
    });
}

fn record_node_changes(inner: &mut Inner, nodes: &[NodeView]) {
    let current: HashMap<u16, (&'static str, u32)> = nodes
        .iter()
        .map(|node| (node.id, (state_name(node.state), node.incarnation)))
        .collect();
    if let Some(previous) = inner.nodes.take() {
        for node in nodes {
            let label = format!("{} 0x{:04x}", role_name(node.role), node.id);
            let (state, incarnation) = current[&node.id];
            match previous.get(&node.id) {
                None => inner.event("joined", node.id, format!("{label} joined")),
                Some((before, _)) if *before != state => {
                    let kind = match state {
                        "failed" => "failed",
                        "left" => "left",
                        _ => "rejoined",
                    };
                    inner.event(kind, node.id, format!("{label}: {before} → {state}"));
                }
                Some((_, before)) if *before != incarnation => inner.event(
                    "restarted",
                    node.id,
                    format!("{label} restarted (incarnation {incarnation})"),
                ),
                Some(_) => {}
            }
        }
    }
    inner.nodes = Some(current);
}

fn record_recoveries(inner: &mut Inner, recovery: &RecoveryStatusReply) {
    for zone in &recovery.zones {
        let kind = match recovery_state_name(zone.state) {
            "done" => "recovered",
            "lost" => "lost",
            _ => continue,
        };
        let restorer = zone.restorer.map_or(0, |node| node.0);
        if !inner
            .recoveries_seen
            .insert((zone.owner.0, zone.zone, restorer))
        {
            continue;
        }
        let text = if kind == "recovered" {
            format!(
                "zone {} of 0x{:04x} recovered by 0x{restorer:04x}: {} chunks, {} ms after the failure",
                zone.zone, zone.owner.0, zone.chunks, zone.ms
            )
        } else {
            format!(
                "zone {} of 0x{:04x} lost: {}",
                zone.zone, zone.owner.0, zone.detail
            )
        };
        inner.event(kind, zone.owner.0, text);
    }
}

/// Everything the status page shows, as JSON (the answer of `GET /api/status`).
pub(crate) fn status_json(core: &Core, history: &History) -> Value {
    let raft = core.raft();
    let summary = raft.map(MetaRaft::metrics);
    let node_rows: Vec<Value> = raft
        .map(nodes)
        .unwrap_or_default()
        .iter()
        .map(|node| {
            json!({
                "id": node.id,
                "role": role_name(node.role),
                "state": state_name(node.state),
                "incarnation": node.incarnation,
                "rack": node.rack,
                "switch": node.switch,
                "address": node.address,
            })
        })
        .collect();
    let (epoch, zones_total, zones) = raft.map_or((0, 0, Vec::new()), |raft| {
        raft.read_local(|state| {
            let zones: Vec<Value> = state
                .zones()
                .take(ZONES_SHOWN_MAX)
                .map(|(owner, zone, backups)| {
                    json!({
                        "owner": owner.0,
                        "zone": zone,
                        "backups": backups.iter().map(|b| b.0).collect::<Vec<_>>(),
                        "needs_recovery": state.zone_needs_recovery(owner, zone),
                    })
                })
                .collect();
            (state.epoch(), state.zones().count(), zones)
        })
    });
    let inner = history.inner.lock();
    let recoveries: Vec<Value> = inner
        .recovery
        .zones
        .iter()
        .map(|zone| {
            json!({
                "owner": zone.owner.0,
                "zone": zone.zone,
                "state": recovery_state_name(zone.state),
                "restorer": zone.restorer.map(|node| node.0),
                "chunks": zone.chunks,
                "ms": zone.ms,
                "detail": zone.detail,
            })
        })
        .collect();
    let events: Vec<Value> = inner
        .events
        .iter()
        .map(|event| {
            json!({"t": event.unix_ms, "kind": event.kind, "node": event.node, "text": event.text})
        })
        .collect();
    let samples: Vec<Value> = inner
        .samples
        .iter()
        .map(|sample| {
            let peers: serde_json::Map<String, Value> = sample
                .rates
                .iter()
                .map(|(peer, rate)| (peer.to_string(), json!(rate)))
                .collect();
            json!({
                "t": sample.unix_ms,
                "total": sample.rates.iter().fold(0.0, |sum, (_, rate)| sum + rate),
                "peers": peers,
                "chunks": sample.chunks,
            })
        })
        .collect();
    json!({
        "now": unix_ms(),
        "node": core.id().0,
        "leader": core.leader().map(|node| node.0),
        "is_leader": raft.is_some_and(MetaRaft::is_leader),
        "raft": summary.map(|s| json!({
            "term": s.term,
            "committed": s.committed_index,
            "applied": s.last_applied_index,
            "last_log": s.last_log_index,
        })),
        "epoch": epoch,
        "nodes": node_rows,
        "zones_total": zones_total,
        "zones": zones,
        "recoveries": recoveries,
        "events": events,
        "history": {
            "interval_ms": SAMPLE_INTERVAL.as_millis() as u64,
            "samples": samples,
        },
    })
}

/// The status page with `status` embedded for the first paint.
pub(crate) fn page(status: &Value) -> String {
    // `</` inside the embedded JSON must not end the script element.
    let embedded = status.to_string().replace("</", "<\\/");
    include_str!("status.html").replace("/*STATUS_JSON*/null", &embedded)
}
