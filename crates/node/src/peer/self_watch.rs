//! The peer's check whether the superpeers declared it failed (fencing of a paused or
//! partitioned peer; see [`super::node`]'s module documentation).
//!
//! # Job
//! [`watch_self`] looks every [`SELF_CHECK_INTERVAL`], and at once after a lost
//! connection, at this node's own record in the node table and probes a superpeer (all of
//! them after a lost connection) with a heartbeat that acknowledges nothing; a superpeer
//! that refuses the connection has fenced this node.
//!
//! # Invariants
//! - Once a verdict is seen the chunk service is switched to refusing everything
//!   ([`ChunkService::declare_failed`]) before the verdict is published; there is no way
//!   back.
//! - The probes renew no lease (`acked: 0`).
//!
//! # Who calls it
//! [`super::node::PeerNode::start`] spawns [`watch_self`] on the endpoint's runtime.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use myriad_membership::Membership;
use myriad_meta::NodeState;
use myriad_net::NetError;
use myriad_proto::meta::{Heartbeat, HeartbeatReply};
use myriad_proto::types;
use myriad_types::NodeId;

use super::service::ChunkService;

/// How often a peer checks whether the superpeers declared it failed (it also checks at
/// once whenever a connection is lost).
pub const SELF_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Deadline of one probe of a superpeer during that check.
const SELF_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Checks until this node learns that it was declared failed (see the module
/// documentation), then stops its chunk service and records the log line in `verdict`.
pub(crate) async fn watch_self(
    membership: Arc<Membership>,
    service: Arc<ChunkService>,
    verdict: Arc<OnceLock<String>>,
) {
    let net = membership.net().clone();
    let mut lost = net.subscribe();
    let mut ticker = tokio::time::interval(SELF_CHECK_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut turn = 0usize;
    loop {
        let all = tokio::select! {
            _ = ticker.tick() => false,
            event = lost.recv() => match event {
                Some(_) => true,
                None => return,
            },
        };
        if let Some(line) = self_verdict(&membership, all, &mut turn).await {
            service.declare_failed();
            tracing::error!(node = %membership.node_id(), "{line}");
            let _ = verdict.set(line);
            return;
        }
    }
}

/// One check: `Some(log line)` if this node was declared failed. Probes every superpeer
/// when `all`, else the next one in turn.
async fn self_verdict(membership: &Membership, all: bool, turn: &mut usize) -> Option<String> {
    let me = membership.node_id();
    if let Some(record) = membership.node(me) {
        if let NodeState::Failed { epoch } = record.state {
            return Some(format!(
                "this node was declared failed at epoch {epoch}; shutting down"
            ));
        }
    }
    let superpeers = membership.superpeers();
    if superpeers.is_empty() {
        return None;
    }
    let chosen: Vec<NodeId> = if all {
        superpeers.iter().map(|(id, _)| *id).collect()
    } else {
        *turn = turn.wrapping_add(1);
        vec![superpeers[*turn % superpeers.len()].0]
    };
    let epoch = membership.epoch();
    let probes = chosen.into_iter().map(|superpeer| {
        let net = membership.net().clone();
        async move {
            let target = superpeer;
            let reply = net
                .request(
                    target,
                    types::HEARTBEAT,
                    // Acknowledges nothing: a superpeer's answer renews no lease of ours.
                    Heartbeat {
                        epoch,
                        acked: 0,
                        lease_ms: 0,
                    }
                    .encode(),
                    SELF_PROBE_TIMEOUT,
                )
                .await;
            match reply {
                // Superpeers are never fenced on this side: the superpeer refused us.
                Err(NetError::Fenced(node)) if node == target => Some(format!(
                    "this node was declared failed at an epoch after {epoch} (superpeer \
                     {superpeer} refuses it); shutting down"
                )),
                Ok(bytes) => {
                    if let Ok(reply) = HeartbeatReply::decode(bytes) {
                        tracing::trace!(%superpeer, epoch = reply.epoch, "superpeer answers");
                    }
                    None
                }
                Err(_) => None,
            }
        }
    });
    futures_util::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .next()
}
