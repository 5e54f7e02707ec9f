//! A superpeer's HTTP routes: `GET /metrics` (Raft, the cluster as its applied metadata
//! shows it, the recoveries it coordinated, messaging, the process), read at scrape time;
//! `GET /` the status page and `GET /api/status` its JSON ([`super::status`]).
//!
//! # Families (all prefixed `myriad_`)
//! `raft_term`, `raft_is_leader`, `raft_leader`, `raft_last_log_index`,
//! `raft_committed_index`, `raft_applied_index`, `meta_epoch`, `cluster_nodes{role,state}`,
//! `cluster_zones`, `cluster_zones_to_recover`, `recovery_zones{state}`,
//! `recovery_chunks_restored`, the messaging families of every node and `process_*`;
//! `docs/operations.md` lists them with their meaning.
//!
//! # Who calls it
//! `myriad superpeer` serves it through [`super::HttpServer`]
//! ([`crate::superpeer::Superpeer::http_routes`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use myriad_meta::{MetaState, NodeState, Role};
use myriad_proto::recovery::RecoveryState;

use super::peer_metrics::net_families;
use super::prom::{render, Labels, Out, CONTENT_TYPE};
use super::status::{page, status_json, History, Sampler};
use super::{Page, Routes};
use crate::superpeer::Core;

/// The routes of a superpeer's HTTP endpoint; they run the status page's sampler while
/// they live.
pub struct SuperpeerRoutes {
    core: Arc<Core>,
    history: Arc<History>,
    _sampler: Option<Sampler>,
}

impl fmt::Debug for SuperpeerRoutes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SuperpeerRoutes")
            .field("node", &self.core.id())
            .finish_non_exhaustive()
    }
}

/// The name of a role as the metrics and the status page show it.
pub(crate) fn role_name(role: Role) -> &'static str {
    match role {
        Role::Superpeer => "superpeer",
        Role::Peer => "peer",
        Role::Client => "client",
    }
}

/// The name of a node state as the metrics and the status page show it.
pub(crate) fn state_name(state: NodeState) -> &'static str {
    match state {
        NodeState::Alive => "alive",
        NodeState::Failed { .. } => "failed",
        NodeState::Left => "left",
    }
}

/// The name of a recovery state as the metrics and the status page show it.
pub(crate) fn recovery_state_name(state: RecoveryState) -> &'static str {
    match state {
        RecoveryState::Pending => "pending",
        RecoveryState::Running => "running",
        RecoveryState::Done => "done",
        RecoveryState::Failed => "failed",
        RecoveryState::Waiting => "waiting",
        RecoveryState::Lost => "lost",
    }
}

impl SuperpeerRoutes {
    pub(crate) fn new(core: Arc<Core>) -> SuperpeerRoutes {
        let history = Arc::new(History::default());
        let sampler = match Sampler::start(Arc::clone(&core), Arc::clone(&history)) {
            Ok(sampler) => Some(sampler),
            Err(error) => {
                tracing::warn!(%error, "status page: no sampler thread; no history");
                None
            }
        };
        SuperpeerRoutes {
            core,
            history,
            _sampler: sampler,
        }
    }

    /// What `GET /api/status` answers.
    pub fn status(&self) -> serde_json::Value {
        status_json(&self.core, &self.history)
    }

    /// The metrics text now.
    pub fn metrics(&self) -> String {
        let core = Arc::clone(&self.core);
        render(move |out| write(out, &core))
    }
}

fn write(out: &mut Out<'_>, core: &Core) -> fmt::Result {
    out.gauge("myriad_node_id", "This node's ID.", f64::from(core.id().0))?;
    if let Some(raft) = core.raft() {
        let summary = raft.metrics();
        let index = |value: Option<u64>| value.map_or(0.0, |v| v as f64);
        let rows: [(&str, &str, f64); 6] = [
            (
                "myriad_raft_term",
                "Current Raft term.",
                summary.term as f64,
            ),
            (
                "myriad_raft_is_leader",
                "1 while this superpeer leads the group.",
                f64::from(u8::from(raft.is_leader())),
            ),
            (
                "myriad_raft_leader",
                "The leader this superpeer knows of (0: none).",
                index(summary.leader),
            ),
            (
                "myriad_raft_last_log_index",
                "Index of its last Raft log entry.",
                index(summary.last_log_index),
            ),
            (
                "myriad_raft_committed_index",
                "Index of the last entry it knows committed.",
                index(summary.committed_index),
            ),
            (
                "myriad_raft_applied_index",
                "Index of the last entry applied to its metadata.",
                index(summary.last_applied_index),
            ),
        ];
        for (name, help, value) in rows {
            out.gauge(name, help, value)?;
        }
        cluster_families(out, raft)?;
    }
    recovery_families(out, core)?;
    net_families(out, core.net())?;
    out.process(&super::process::process_stats())
}

fn cluster_families(out: &mut Out<'_>, raft: &myriad_raft::MetaRaft) -> fmt::Result {
    let (epoch, nodes, zones, to_recover) = raft.read_local(|state: &MetaState| {
        let mut nodes: BTreeMap<(&'static str, &'static str), u64> = BTreeMap::new();
        for role in [Role::Superpeer, Role::Peer, Role::Client] {
            for node_state in [
                NodeState::Alive,
                NodeState::Failed { epoch: 0 },
                NodeState::Left,
            ] {
                nodes.insert((role_name(role), state_name(node_state)), 0);
            }
        }
        for node in state.nodes() {
            *nodes
                .entry((role_name(node.role), state_name(node.state)))
                .or_default() += 1;
        }
        (
            state.epoch(),
            nodes,
            state.zones().count(),
            state.zones_to_recover().count(),
        )
    });
    out.gauge(
        "myriad_meta_epoch",
        "Cluster epoch in the applied metadata.",
        epoch as f64,
    )?;
    let rows: Vec<(Labels, f64)> = nodes
        .into_iter()
        .map(|((role, state), count)| {
            (
                vec![("role", role.to_owned()), ("state", state.to_owned())],
                count as f64,
            )
        })
        .collect();
    out.gauges(
        "myriad_cluster_nodes",
        "Nodes in the metadata, by role and state.",
        &rows,
    )?;
    out.gauge(
        "myriad_cluster_zones",
        "Backup zones in the zone table.",
        zones as f64,
    )?;
    out.gauge(
        "myriad_cluster_zones_to_recover",
        "Zones of failed peers not yet recovered.",
        to_recover as f64,
    )
}

fn recovery_families(out: &mut Out<'_>, core: &Core) -> fmt::Result {
    let status = core.recovery_status();
    let mut states: BTreeMap<&'static str, u64> = [
        RecoveryState::Pending,
        RecoveryState::Running,
        RecoveryState::Done,
        RecoveryState::Failed,
        RecoveryState::Waiting,
        RecoveryState::Lost,
    ]
    .into_iter()
    .map(|state| (recovery_state_name(state), 0))
    .collect();
    for zone in &status.zones {
        *states.entry(recovery_state_name(zone.state)).or_default() += 1;
    }
    let rows: Vec<(Labels, f64)> = states
        .into_iter()
        .map(|(state, count)| (vec![("state", state.to_owned())], count as f64))
        .collect();
    out.gauges(
        "myriad_recovery_zones",
        "Zone recoveries this superpeer coordinated as leader, by state.",
        &rows,
    )?;
    out.counter(
        "myriad_recovery_chunks_restored",
        "Chunks restored by the zone recoveries this superpeer coordinated.",
        status.zones.iter().map(|zone| zone.chunks).sum(),
    )
}

impl Routes for SuperpeerRoutes {
    fn get(&self, path: &str, _query: &str) -> Option<Page> {
        match path {
            "/metrics" => Some(Page {
                content_type: CONTENT_TYPE,
                body: Bytes::from(self.metrics()),
            }),
            "/" | "/index.html" => Some(Page {
                content_type: "text/html; charset=utf-8",
                body: Bytes::from(page(&self.status())),
            }),
            "/api/status" => Some(Page {
                content_type: "application/json",
                body: Bytes::from(self.status().to_string()),
            }),
            _ => None,
        }
    }
}
