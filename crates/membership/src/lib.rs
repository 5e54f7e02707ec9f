//! Myriad's cluster membership: how a node (peer or client) becomes and stays a member.
//!
//! # Job
//! - [`membership`]: join through the superpeers ([`Membership::join`]: a provisional ID,
//!   then the node's real endpoint under the assigned one), keep the node table (events,
//!   resyncs, fences in the messaging layer), answer heartbeats, send metadata requests to
//!   the group's leader, report lost connections, barriers and leave; and the node
//!   directory the chunk routing asks ([`Membership::lookup`], [`Membership::lookup_all`],
//!   [`Membership::is_alive`], [`Membership::may_recover`]).
//! - [`lease`]: how long a node may still act as the owner of its chunks without hearing
//!   from the superpeers, renewed by heartbeat acknowledgements.
//! - [`error`]: [`MembershipError`], what these calls fail with.
//! - Under TLS, the node's endpoint admits a node only with a certificate of the role the
//!   configured superpeers or the node table record for its ID ([`certificate_fits`],
//!   installed with `myriad_net::NetHandle::check_roles` when the membership starts).
//!
//! # Invariants
//! - The node table only moves forward (never a lower epoch); a gap triggers a resync.
//! - Failed nodes are fenced in the messaging layer; superpeers never are.
//! - Every call ends within its timeout; handlers never block on the network.
//! - The lease only moves forward, and only from a reply the superpeers have seen, so it
//!   ends on the node's own clock before the superpeers may declare it failed.
//!
//! # Who calls it
//! `myriad-client` (its `Client` is built on a [`Membership`]; its chunk routing's
//! `Directory` trait is implemented with the node-directory methods; `ClientError` has a
//! `From<MembershipError>`) and `myriad-node` (a peer joins with it, renews its lease and
//! follows the cluster's events). It depends on the protocol, messaging and metadata
//! crates only, never on the client or node crates.

pub mod error;
pub mod lease;
pub mod membership;

pub use error::MembershipError;
pub use lease::Lease;
pub use membership::{cert_role_of, certificate_fits, JoinConfig, Membership};
