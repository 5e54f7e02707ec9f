//! A peer incarnation's numbering: where its zone numbers and fresh local IDs start, and
//! the local-ID reservations kept ahead of the memory manager.
//!
//! # Job
//! [`fetch_bases`] asks the superpeers for this incarnation's bases right after the join;
//! [`reserve_lids`] commits a reservation of [`LID_RESERVE_STEP`] local IDs;
//! [`spawn_lid_reserver`] keeps a reservation ahead of the fresh IDs.
//!
//! # Invariants
//! - A restarted peer numbers its zones and local IDs above everything its earlier
//!   incarnations registered or reserved (their zones are recovered under the old numbers).
//!
//! # Who calls it
//! [`super::node::PeerNode::start`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use myriad_mem::MemoryManager;
use myriad_membership::Membership;
use myriad_meta::Command;

use super::node::PeerError;

/// Local IDs a peer reserves (`Command::ReserveLids`) ahead of the ones it handed out. A
/// new reservation is committed when fewer than half of them are left, checked every
/// [`LID_RESERVE_CHECK`]: safe as long as a peer hands out fewer than 2^31 fresh IDs in
/// one check interval (plus a commit), far beyond what a memory manager can create.
pub const LID_RESERVE_STEP: u64 = 1 << 32;
/// How often a peer compares its fresh local IDs with its reservation.
pub const LID_RESERVE_CHECK: Duration = Duration::from_millis(100);

/// Where this incarnation's zone numbers and fresh local IDs start (asked right after the
/// join; the join itself set them).
pub(crate) fn fetch_bases(
    membership: &Arc<Membership>,
) -> Result<myriad_meta::PeerBases, PeerError> {
    let me = membership.node_id();
    let asking = Arc::clone(membership);
    let reply = membership.net().runtime().block_on(async move {
        asking
            .request(myriad_proto::meta::MetaRequest::Bases(me))
            .await
    });
    match reply {
        Ok(myriad_proto::meta::MetaReply::Bases(bases)) => Ok(bases),
        Ok(other) => Err(PeerError::Bases(format!("unexpected reply {other:?}"))),
        Err(error) => Err(PeerError::Bases(error.to_string())),
    }
}

/// Commits a reservation of [`LID_RESERVE_STEP`] local IDs above `from`; the new bound.
pub(crate) fn reserve_lids(membership: &Arc<Membership>, from: u64) -> Result<u64, PeerError> {
    let up_to = from
        .saturating_add(LID_RESERVE_STEP)
        .min(myriad_types::LOCAL_ID_MAX + 1);
    let command = Command::ReserveLids {
        node: membership.node_id(),
        up_to,
    };
    let writer = Arc::clone(membership);
    membership
        .net()
        .runtime()
        .block_on(async move { writer.write(command).await })
        .map_err(|error| PeerError::Bases(format!("reserving local IDs: {error}")))?;
    Ok(up_to)
}

/// Starts the thread that keeps the local-ID reservation (committed up to `reserved`)
/// at least half a [`LID_RESERVE_STEP`] ahead of `mem`'s fresh local IDs, looking every
/// [`LID_RESERVE_CHECK`]. It ends once `stop` is set.
pub(crate) fn spawn_lid_reserver(
    mem: Arc<MemoryManager>,
    membership: Arc<Membership>,
    mut reserved: u64,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, PeerError> {
    std::thread::Builder::new()
        .name(format!("lid-reserve-{}", membership.node_id().0))
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(LID_RESERVE_CHECK);
                if mem.local_id_mark().saturating_add(LID_RESERVE_STEP / 2) < reserved {
                    continue;
                }
                match reserve_lids(&membership, mem.local_id_mark()) {
                    Ok(up_to) => reserved = up_to,
                    Err(error) => {
                        tracing::warn!(%error, "local-ID reservation not committed; retrying")
                    }
                }
            }
        })
        .map_err(PeerError::Thread)
}
