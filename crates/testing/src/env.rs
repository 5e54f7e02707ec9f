//! The environment seam of the cluster harness: where it gets time and how it filters links.
//!
//! **Job.** [`crate::cluster::TestCluster`] never reads the clock or touches a node's
//! network on its own: it asks its [`Env`], which holds one [`Clock`] (every bounded wait
//! of the harness polls it) and one [`Transport`] (every link filter goes through it). The
//! real implementations, [`SystemClock`] and [`NetFaults`] (the messaging layer's per-node
//! fault switches, [`myriad_net::Fault`]), run tests on real threads and sockets. (The
//! deterministic simulation, [`crate::sim`], does not plug in here: real threads and
//! sockets keep their own timing, so it drives the production components through their
//! sans-IO entry points instead; see `docs/testing.md`.)
//!
//! **Invariants.**
//! - A link filter is directional: `from → to`. [`NetFaults`] applies it at both ends (the
//!   sender's endpoint drops outgoing, the receiver's drops incoming), so it holds whichever
//!   side opened the connection, and re-applies every filter touching a node when the node
//!   is attached again (a restart gets a new endpoint).
//! - A delay is applied once, at the sender's endpoint ([`Fault::DelayOutgoing`]), so it
//!   is not counted twice; the messaging layer keeps the order within a connection.
//! - A filter a transport cannot apply is an error ([`LinkError::Unsupported`]), never a
//!   silent no-op.
//!
//! **Callers.** The cluster harness; tests only through [`crate::cluster::Link`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use myriad_net::{Fault, NetHandle};
use myriad_types::NodeId;
use thiserror::Error;

/// Where the harness gets time: every bounded wait polls [`Clock::now`] and sleeps with
/// [`Clock::sleep`] between polls.
pub trait Clock: Send + Sync {
    /// The current instant.
    fn now(&self) -> Instant;
    /// Lets `duration` pass (a simulator advances its virtual time instead).
    fn sleep(&self, duration: Duration);
}

/// The system clock: [`Instant::now`] and [`std::thread::sleep`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }
}

/// What happens to the messages of one direction of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkFilter {
    /// Delivered as the network delivers them (no filter).
    Pass,
    /// Silently lost (requests across the link time out).
    Drop,
    /// Delivered after the given extra delay (in order: later messages wait behind it).
    Delay(Duration),
}

/// Why a link filter could not be applied.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LinkError {
    /// The transport cannot apply this kind of filter (yet).
    #[error("link filter {0} is not supported by this transport yet")]
    Unsupported(&'static str),
    /// Neither end of the link was ever attached to the transport.
    #[error("no node of the link {from} → {to} is known to the transport")]
    UnknownLink {
        /// The sending end.
        from: NodeId,
        /// The receiving end.
        to: NodeId,
    },
}

/// How the harness filters the messages between two nodes.
pub trait Transport: Send + Sync {
    /// A node's messaging handle, handed over when the node starts (again after a
    /// restart): filters already set for its links apply to it from now on.
    fn attach(&self, node: NodeId, net: &NetHandle);
    /// The node stopped (its handle is forgotten; its links' filters are kept).
    fn detach(&self, node: NodeId);
    /// Sets the filter of the direction `from → to` (replacing the previous one).
    fn set_filter(&self, from: NodeId, to: NodeId, filter: LinkFilter) -> Result<(), LinkError>;
}

/// The real transport: the messaging layer's per-node fault switches
/// ([`NetHandle::set_fault`], [`NetHandle::clear_fault`]).
#[derive(Default)]
pub struct NetFaults {
    state: Mutex<FaultState>,
}

#[derive(Default)]
struct FaultState {
    handles: HashMap<NodeId, NetHandle>,
    /// The filter of each direction `(from, to)` that is not [`LinkFilter::Pass`].
    filters: HashMap<(NodeId, NodeId), LinkFilter>,
    /// Every node ever attached (a link to a stopped node can still be healed).
    known: std::collections::HashSet<NodeId>,
}

impl FaultState {
    /// Sets on `node`'s endpoint the fault towards `other` that the two directions ask for.
    fn refresh(&self, node: NodeId, other: NodeId) {
        let Some(net) = self.handles.get(&node) else {
            return;
        };
        net.clear_fault(other);
        match self.filters.get(&(node, other)) {
            Some(LinkFilter::Drop) => net.add_fault(other, Fault::DropOutgoing),
            Some(LinkFilter::Delay(delay)) => {
                let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                net.add_fault(other, Fault::DelayOutgoing { ms });
            }
            Some(LinkFilter::Pass) | None => {}
        }
        // Drops are applied at the receiver too (whichever side opened the connection);
        // a delay only at the sender, where it is counted once.
        if let Some(LinkFilter::Drop) = self.filters.get(&(other, node)) {
            net.add_fault(other, Fault::DropIncoming);
        }
    }
}

impl std::fmt::Debug for NetFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("NetFaults")
            .field("attached", &state.handles.keys().collect::<Vec<_>>())
            .field("filters", &state.filters)
            .finish()
    }
}

impl NetFaults {
    fn lock(&self) -> MutexGuard<'_, FaultState> {
        // A panic while holding the lock leaves a consistent map: keep using it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Transport for NetFaults {
    fn attach(&self, node: NodeId, net: &NetHandle) {
        let mut state = self.lock();
        state.handles.insert(node, net.clone());
        state.known.insert(node);
        let others: Vec<NodeId> = state
            .filters
            .keys()
            .filter_map(|&(from, to)| match (from == node, to == node) {
                (true, _) => Some(to),
                (_, true) => Some(from),
                _ => None,
            })
            .collect();
        for other in others {
            state.refresh(node, other);
        }
    }

    fn detach(&self, node: NodeId) {
        self.lock().handles.remove(&node);
    }

    fn set_filter(&self, from: NodeId, to: NodeId, filter: LinkFilter) -> Result<(), LinkError> {
        let mut state = self.lock();
        if !state.known.contains(&from) && !state.known.contains(&to) {
            return Err(LinkError::UnknownLink { from, to });
        }
        match filter {
            LinkFilter::Pass => {
                state.filters.remove(&(from, to));
            }
            LinkFilter::Drop | LinkFilter::Delay(_) => {
                state.filters.insert((from, to), filter);
            }
        }
        state.refresh(from, to);
        state.refresh(to, from);
        Ok(())
    }
}

/// The environment of a test cluster: its clock and its transport.
#[derive(Clone)]
pub struct Env {
    /// Time for every wait of the harness.
    pub clock: Arc<dyn Clock>,
    /// Link filters.
    pub transport: Arc<dyn Transport>,
}

impl Env {
    /// The real environment: [`SystemClock`] and [`NetFaults`].
    pub fn real() -> Env {
        Env {
            clock: Arc::new(SystemClock),
            transport: Arc::new(NetFaults::default()),
        }
    }

    /// Polls `done` every 20 ms until it holds; panics naming `what` once `limit` passed
    /// without it (the last poll is after the deadline, so a condition that became true
    /// meanwhile is still seen).
    pub fn wait_until(&self, limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = self.clock.now() + limit;
        loop {
            if done() {
                return;
            }
            if self.clock.now() >= deadline {
                panic!("timed out after {limit:?} waiting until {what}");
            }
            self.clock.sleep(POLL_INTERVAL);
        }
    }
}

impl Default for Env {
    fn default() -> Env {
        Env::real()
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env").finish_non_exhaustive()
    }
}

/// How often [`Env::wait_until`] polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);
