//! The endpoint: a node's listener, its connection table, the handshake, and the public
//! sending API ([`NetHandle`]), async and blocking.
//!
//! Connections open on first use in either direction. When two nodes dial each other at
//! the same time, the acceptor decides during the handshake, before any frame flows:
//! - it already has a live connection to the same peer instance → `Duplicate` (the dialer
//!   uses the existing one; if the dialer holds none, the acceptor has not yet read the
//!   close of one the dialer closed, so the dialer dials again after a short pause until
//!   its connect timeout);
//! - it is dialing the peer itself → the dial of the lower node ID wins: the acceptor with
//!   the lower ID answers `Duplicate`, the one with the higher ID accepts and drops its own
//!   dial (which the other side will refuse);
//! - it has a connection to an older instance of the peer (the peer restarted) → the new
//!   connection replaces the old one.
//!
//! So both sides always end with the same single TCP connection, and no frame is ever sent
//! on a connection that loses.
//!
//! Direct request lanes (`crate::lane`) are extra connections outside the table: dialed
//! with blocking calls by a thread in `request_blocking`, accepted here with the lane flag
//! (at most `lanes_per_node_max` per node, refused when fenced), kept in
//! `Shared::incoming_lanes`, closed on fence and shutdown, and never reported as lost.
//!
//! Invariants: the table lock is never held across an await, and locks are taken in the
//! order table → fenced/faults/addresses (never the reverse); every connection in the
//! table with state `Up` has running reader and writer tasks or is about to get them (the
//! acceptor inserts before it writes the verdict); a closed connection is removed from the
//! table by whoever closed it.
//!
//! # Submodules, in dependency order
//! Each uses only this module's helpers and the submodules listed before it:
//! 1. `events`: [`ConnectionLost`] and the [`ConnectionEvents`] subscription;
//! 2. `shared`: the state every task and handle shares, the table's slots, new
//!    connections and greetings;
//! 3. `dial`: the connector's half of the handshake (async, and blocking for lanes);
//! 4. `table`: the connection table (connect on first use, install, tie-break, evict,
//!    retire);
//! 5. `accept`: the listener and the acceptor's half of the handshake;
//! 6. `pending`: request/response tracking on the caller's side ([`PendingResponse`]);
//! 7. `handle`: [`NetHandle`] and its administrative methods (addresses, handlers, events,
//!    fencing, network filters, figures);
//! 8. `lanes`: the lane path of [`NetHandle::request_blocking`];
//! 9. `send`: sending messages and requests (fast and slow paths);
//! 10. `setup`: [`Endpoint`]: start, and shutdown on drop.

mod accept;
mod dial;
mod events;
mod handle;
mod lanes;
mod pending;
mod send;
mod setup;
mod shared;
mod table;

use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::config::DEADLINE_FAR;
use crate::error::NetError;
use crate::handler::MessageType;
use crate::wire::{Fragment, FrameHeader, Kind};

pub use events::{ConnectionEvents, ConnectionLost};
pub use handle::NetHandle;
pub use pending::PendingResponse;
pub use setup::Endpoint;

/// `timeout` from now, saturating (a huge timeout means "about forever", not a panic).
pub(super) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + DEADLINE_FAR)
}

pub(super) fn ensure_blocking_allowed() -> Result<(), NetError> {
    if Handle::try_current().is_ok() {
        return Err(NetError::BlockingInAsyncContext);
    }
    Ok(())
}

/// The header of a whole (unfragmented) message.
pub(super) fn whole_header(
    kind: Kind,
    message_type: MessageType,
    message_id: u32,
    length: usize,
) -> FrameHeader {
    FrameHeader {
        kind,
        ordered: message_type.ordered,
        fragment: Fragment::Whole,
        type_id: message_type.type_id,
        subtype: message_type.subtype,
        message_id,
        payload_bytes: length as u32,
    }
}
