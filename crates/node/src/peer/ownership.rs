//! The peer's ownership view kept in line with the superpeers: the ranges committed
//! before the join, ownership events, the reload after missed events, and a restarted
//! peer's wait for its earlier incarnation's zones.
//!
//! # Job
//! [`sync_ownership`] loads every peer creator's committed ranges into the chunk service;
//! [`apply_event`] applies one cluster event (ownership change; a gone node's locks are
//! released); [`watch_old_zones`] waits until a restarted peer's earlier zones are
//! recovered, then gives the earlier local IDs back to this peer in one step.
//!
//! # Invariants
//! - Ranges routed to this peer are recorded as owned by this peer only when its memory
//!   holds them: while a restarted peer's earlier zones are being recovered they are
//!   recorded as owned by [`NOBODY`] (answering `NotOwner`, never a false `NotFound`).
//!
//! # Who calls it
//! [`super::node::PeerNode::start`] and its event follower.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use myriad_membership::Membership;
use myriad_proto::meta::Event;
use myriad_types::NodeId;

use super::node::PeerError;
use super::service::ChunkService;

/// The owner a restarted peer records for CIDs its earlier incarnation held until they are
/// recovered (node ID 0 is never assigned), so that it answers `NotOwner` for them.
pub const NOBODY: NodeId = NodeId(0);
/// How often a restarted peer asks whether its earlier incarnation's zones are recovered.
const OLD_ZONES_POLL: Duration = Duration::from_millis(250);

/// Starts the thread that waits until no zone of the earlier incarnations is due for
/// recovery any more (all adopted by their restorers, or lost), then routes the CIDs still routed to this peer to
/// itself again: they answer `NotFound` from then on (removed, or lost).
pub(crate) fn watch_old_zones(
    service: Arc<ChunkService>,
    membership: Arc<Membership>,
    bases: myriad_meta::PeerBases,
    pending: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, PeerError> {
    let me = membership.node_id();
    // Only a restarted peer has earlier local IDs (below its base) to take back.
    assert!(bases.lid_base > 0, "no earlier incarnation to wait for");
    std::thread::Builder::new()
        .name(format!("old-zones-{}", me.0))
        .spawn(move || {
            let runtime = membership.net().runtime();
            while !stop.load(Ordering::Relaxed) {
                let asking = Arc::clone(&membership);
                let reply = runtime.block_on(async move {
                    asking
                        .request(myriad_proto::meta::MetaRequest::ZonesDue(me))
                        .await
                });
                if let Ok(myriad_proto::meta::MetaReply::Zones(zones)) = reply {
                    if zones.iter().all(|(zone, _)| *zone >= bases.zone_base) {
                        // The earlier IDs come back to this peer, except the ranges the
                        // restorers took over: both in one step, from the ranges committed
                        // by now (every restorer's commits came before its zone settled).
                        // Setting the IDs first and loading the ranges after left a window
                        // in which this peer answered a false `NotFound` for chunks that
                        // live at a restorer.
                        let Ok(ranges) = lookup_tree(&runtime, &membership, me) else {
                            std::thread::sleep(OLD_ZONES_POLL);
                            continue;
                        };
                        service.take_back_earlier_ids(bases.lid_base, &ranges);
                        pending.store(false, Ordering::Release);
                        // The other creators' ranges (this peer's own are set just now).
                        sync_ownership(&runtime, &membership, &service, me, Some(me));
                        tracing::info!(node = %me, "the earlier incarnation's zones are recovered");
                        return;
                    }
                }
                std::thread::sleep(OLD_ZONES_POLL);
            }
        })
        .map_err(PeerError::Thread)
}

/// Loads the ownership ranges committed before this peer joined into its chunk service.
///
/// Ranges routed to this peer are recorded with owner `mine_as`: this peer's ID, or
/// [`NOBODY`] while a restarted peer's earlier incarnation is being recovered (the chunks
/// routed to it are then in its backups' logs, not in its memory).
pub(crate) fn sync_ownership(
    runtime: &tokio::runtime::Handle,
    membership: &Arc<Membership>,
    service: &ChunkService,
    mine_as: NodeId,
    skip: Option<NodeId>,
) {
    let me = membership.node_id();
    let creators: Vec<NodeId> = membership
        .nodes()
        .into_iter()
        .filter(|record| record.role == myriad_meta::Role::Peer && Some(record.id) != skip)
        .map(|record| record.id)
        .collect();
    for creator in creators {
        match lookup_tree(runtime, membership, creator) {
            Ok(ranges) => {
                for (first, last, owner) in ranges {
                    let owner = if owner == me { mine_as } else { owner };
                    service.set_owner(creator, first, last, owner);
                }
            }
            Err(error) => tracing::warn!(%error, %creator, "could not load ownership ranges"),
        }
    }
}

/// The ownership ranges of `creator`'s local IDs the superpeers hold: (first, last, owner).
pub(crate) fn lookup_tree(
    runtime: &tokio::runtime::Handle,
    membership: &Arc<Membership>,
    creator: NodeId,
) -> Result<Vec<(u64, u64, NodeId)>, String> {
    let asking = Arc::clone(membership);
    let reply = runtime.block_on(async move {
        asking
            .request(myriad_proto::meta::MetaRequest::LookupTree(creator))
            .await
    });
    match reply {
        Ok(myriad_proto::meta::MetaReply::LookupTree(ranges)) => Ok(ranges),
        Ok(other) => Err(format!(
            "unexpected reply to a lookup-tree request: {other:?}"
        )),
        Err(error) => Err(error.to_string()),
    }
}

/// Applies one cluster event to the chunk service: an ownership change moves a range; a
/// node that failed or left loses the chunk locks it held here.
pub(crate) fn apply_event(service: &ChunkService, event: &Event) {
    match event {
        Event::OwnerChanged {
            creator,
            first,
            last,
            owner,
        } => service.set_owner(*creator, *first, *last, *owner),
        Event::NodeFailed(node) | Event::NodeLeft(node) => {
            let released = service.release_locks_of(*node);
            if released > 0 {
                tracing::info!(%node, released, "released the chunk locks of a gone node");
            }
        }
        Event::NodeJoined(_) => {}
    }
}
