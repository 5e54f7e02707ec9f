//! The public handle: [`NetHandle`], and its administrative side: addresses, handler
//! registration, event subscription, fencing, the network-filter switch, figures, and
//! explicit connect and disconnect.
//!
//! Particular to this module: the methods that change what the endpoint will do rather
//! than send something. Sending is in `send.rs`, the lane path in `lanes.rs`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::runtime::Handle;

use super::ensure_blocking_allowed;
use super::events::ConnectionEvents;
use super::shared::{Shared, Slot};
use crate::conn::{CloseReason, Conn, ConnectionStats};
use crate::error::NetError;
use crate::fault::{Fault, LinkFaults};
use crate::handler::{HandlerMap, MessageType};
use crate::lane::LaneStats;
use crate::NodeId;

/// Sends messages and requests; cheap to clone, usable from any thread. Methods without
/// `_blocking` are async; the `_blocking` ones may be called from any thread that is not
/// running async tasks (they return `BlockingInAsyncContext` there) and take a fast path
/// with no runtime involvement when the connection is up and its queue has room;
/// [`NetHandle::request_blocking`] goes further and uses a direct request lane (the
/// calling thread writes and reads the socket itself).
#[derive(Clone)]
pub struct NetHandle {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for NetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetHandle")
            .field("node_id", &self.shared.config.node_id)
            .finish()
    }
}

impl NetHandle {
    /// This node's ID.
    pub fn node_id(&self) -> NodeId {
        self.shared.config.node_id
    }

    /// The tokio runtime the endpoint's I/O runs on (to spawn tasks that use the async API
    /// next to it).
    pub fn runtime(&self) -> Handle {
        self.shared.runtime.clone()
    }

    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Sets (or changes) the address of `node`; used for connections opened from now on.
    pub fn set_address(&self, node: NodeId, addr: SocketAddr) {
        self.shared.addresses.write().insert(node, addr);
    }

    /// Forgets the address of `node` (an open connection stays until it closes).
    pub fn remove_address(&self, node: NodeId) {
        self.shared.addresses.write().remove(&node);
    }

    /// The address known for `node`.
    pub fn address(&self, node: NodeId) -> Option<SocketAddr> {
        self.shared.addresses.read().get(&node).copied()
    }

    /// Registers a handler after start. Peers must not send the type before this returns
    /// (a frame of an unknown type closes its connection).
    pub fn register(
        &self,
        message_type: MessageType,
        handler: impl crate::Handler,
    ) -> Result<(), NetError> {
        self.update_handlers(|map| {
            crate::handler::insert(map, message_type, Arc::new(handler), false)
        })
    }

    /// Registers a handler after start that runs on the I/O thread that read the message
    /// (like `Handlers::register_inline`): it must be quick and must never wait. Peers must
    /// not send the type before this returns.
    pub fn register_inline(
        &self,
        message_type: MessageType,
        handler: impl crate::Handler,
    ) -> Result<(), NetError> {
        self.update_handlers(|map| {
            crate::handler::insert(map, message_type, Arc::new(handler), true)
        })
    }

    /// Registers an inline handler for an ordered type on a running endpoint (see
    /// [`crate::Handlers::register_inline_ordered`]).
    pub fn register_inline_ordered(
        &self,
        message_type: MessageType,
        handler: impl crate::Handler,
    ) -> Result<(), NetError> {
        self.update_handlers(|map| {
            crate::handler::insert_checked(map, message_type, Arc::new(handler), true, true)
        })
    }

    /// Lets only senders for which `allowed` holds send `message_type` from now on (a
    /// registered type; see [`crate::Handlers::restrict`], the same for a running
    /// endpoint). Connections already reading pick it up with their next handler lookup.
    pub fn restrict(
        &self,
        message_type: MessageType,
        allowed: impl Fn(crate::NodeId) -> bool + Send + Sync + 'static,
    ) -> Result<(), NetError> {
        self.update_handlers(|map| {
            crate::handler::restrict_in(map, message_type, Arc::new(allowed))
        })
    }

    /// Under TLS, lets a node connect (either direction, lanes too) only if `allowed`
    /// holds for its node ID and the role its certificate names (`None`: a certificate
    /// naming no single role). Checked in every handshake from now on, after the secret's
    /// proof and before the connection carries a message; connections up already are
    /// kept. Without TLS it does nothing. The caller knows the roles (the node table).
    pub fn check_roles(
        &self,
        allowed: impl Fn(crate::NodeId, Option<crate::CertRole>) -> bool + Send + Sync + 'static,
    ) {
        *self.shared.role_check.write() = Some(Arc::new(allowed));
    }

    /// Replaces the handler map with a copy that `change` edited (readers keep the map
    /// they hold; a failed change leaves the map as it was).
    fn update_handlers(
        &self,
        change: impl FnOnce(&mut HandlerMap) -> Result<(), NetError>,
    ) -> Result<(), NetError> {
        let mut current = self.shared.handlers.write();
        let mut map = HandlerMap::clone(&current);
        change(&mut map)?;
        *current = Arc::new(map);
        Ok(())
    }

    /// Incoming handshakes: `(pending now, closed unread because too many were pending,
    /// failed or timed out)` since the endpoint started (see
    /// [`Config::pending_handshakes_max`](crate::Config::pending_handshakes_max)).
    pub fn handshake_counts(&self) -> (usize, u64, u64) {
        use std::sync::atomic::Ordering;
        (
            self.shared.pending_handshakes.load(Ordering::Acquire),
            self.shared.handshakes_refused.load(Ordering::Relaxed),
            self.shared.handshakes_failed.load(Ordering::Relaxed),
        )
    }

    /// Subscribes to connection-lost events from now on.
    pub fn subscribe(&self) -> ConnectionEvents {
        ConnectionEvents {
            receiver: self.shared.events.subscribe(),
            runtime: self.shared.runtime.clone(),
        }
    }

    /// Fences `node`: from now on no message from it reaches a handler (also messages
    /// already received but not yet handled), its connection is closed, new connections
    /// from it are refused, and sends to it fail with `Fenced`.
    pub fn fence(&self, node: NodeId) {
        self.shared.fenced.write().insert(node);
        let conn = self.lookup(node);
        if let Some(conn) = conn {
            conn.fenced.store(true, Ordering::Release);
            self.shared.retire(&conn, CloseReason::Fenced);
        }
        // Its lanes too, both ways (new ones are refused from now on).
        self.shared.lanes.close_node(node);
        let lanes = self.shared.incoming_lanes.lock().remove(&node);
        for lane in lanes.unwrap_or_default() {
            lane.fenced.store(true, Ordering::Release);
            lane.close();
        }
        tracing::info!(%node, "node fenced");
    }

    /// Lifts a fence (e.g. the node ID was reassigned to a new node).
    pub fn unfence(&self, node: NodeId) {
        self.shared.fenced.write().remove(&node);
    }

    /// Whether `node` is fenced.
    pub fn is_fenced(&self, node: NodeId) -> bool {
        self.shared.fenced.read().contains(&node)
    }

    /// Sets the network filter towards `node` to `fault` alone, replacing what was set
    /// (test fault switch; see `crate::fault` for what each filter does). Applies to the
    /// node's open connection and lanes at once and to those opened later.
    pub fn set_fault(&self, node: NodeId, fault: Fault) {
        self.change_faults(node, |faults| *faults = LinkFaults::of(fault));
    }

    /// Adds `fault` to the filters set towards `node` (e.g. a delay one way and a drop the
    /// other; a new delay in one direction replaces the old one).
    pub fn add_fault(&self, node: NodeId, fault: Fault) {
        self.change_faults(node, |faults| faults.add(fault));
    }

    /// Turns off every filter towards `node` (heals the link). Bytes a delay holds are
    /// still delivered, in order, when due.
    pub fn clear_fault(&self, node: NodeId) {
        self.change_faults(node, |faults| *faults = LinkFaults::default());
    }

    /// The filters set towards `node` (empty when none): drops first (`Partition` for
    /// both), then delays.
    pub fn faults(&self, node: NodeId) -> Vec<Fault> {
        self.shared
            .faults
            .read()
            .get(&node)
            .map(LinkFaults::list)
            .unwrap_or_default()
    }

    /// Changes the filters towards `node` and copies them onto its connection and lanes.
    fn change_faults(&self, node: NodeId, change: impl FnOnce(&mut LinkFaults)) {
        // One change at a time, so that connections end with the filters of the last.
        let _serial = self.shared.fault_changes.lock();
        let faults = {
            let mut table = self.shared.faults.write();
            let mut faults = table.get(&node).copied().unwrap_or_default();
            change(&mut faults);
            if faults.is_none() {
                table.remove(&node);
            } else {
                table.insert(node, faults);
            }
            self.shared
                .faults_any
                .store(!table.is_empty(), Ordering::Release);
            faults
        };
        // Lock order: never hold `faults` while taking `table` (accepting does table → faults).
        for conn in self
            .lookup(node)
            .into_iter()
            .chain(self.incoming_lanes(node))
        {
            conn.filter.set(&faults);
        }
    }

    /// The lanes `node` opened to this endpoint that are still open.
    pub(super) fn incoming_lanes(&self, node: NodeId) -> Vec<Arc<Conn>> {
        self.shared
            .incoming_lanes
            .lock()
            .get(&node)
            .cloned()
            .unwrap_or_default()
    }

    /// Figures about the direct request lanes to and from `node` (see
    /// [`NetHandle::request_blocking`]).
    pub fn lane_stats(&self, node: NodeId) -> LaneStats {
        LaneStats {
            incoming: self.incoming_lanes(node).len(),
            ..self.shared.lanes.stats(node)
        }
    }

    /// Opens the connection to `node` now (sends open it on first use anyway); returns
    /// once it is authenticated and usable.
    pub async fn connect(&self, node: NodeId) -> Result<(), NetError> {
        self.check_open()?;
        self.shared.connection(node).await.map(|_| ())
    }

    /// [`NetHandle::connect`] for non-async threads.
    pub fn connect_blocking(&self, node: NodeId) -> Result<(), NetError> {
        self.block_on(self.connect(node))
    }

    /// Closes the connection to `node`, if any (it reopens on the next send).
    pub fn disconnect(&self, node: NodeId) {
        if let Some(conn) = self.lookup(node) {
            self.shared.retire(&conn, CloseReason::Closed);
        }
    }

    /// Nodes with an open connection.
    pub fn connected_nodes(&self) -> Vec<NodeId> {
        let mut nodes: Vec<NodeId> = self
            .shared
            .table
            .read()
            .iter()
            .filter_map(|(node, slot)| match slot {
                Slot::Up(conn) if !conn.is_closed() => Some(*node),
                _ => None,
            })
            .collect();
        nodes.sort();
        nodes
    }

    /// Figures about the connection to `node`, if open.
    pub fn connection_stats(&self, node: NodeId) -> Option<ConnectionStats> {
        self.lookup(node).map(|conn| conn.stats())
    }

    pub(super) fn lookup(&self, node: NodeId) -> Option<Arc<Conn>> {
        match self.shared.table.read().get(&node) {
            Some(Slot::Up(conn)) if !conn.is_closed() => Some(conn.clone()),
            _ => None,
        }
    }

    pub(super) fn check_open(&self) -> Result<(), NetError> {
        if self.shared.shut_down.load(Ordering::Acquire) {
            return Err(NetError::Shutdown);
        }
        Ok(())
    }

    /// Whether the fault switch drops everything sent to `node`.
    pub(super) fn drops_outgoing(&self, node: NodeId) -> bool {
        self.shared.faults_any.load(Ordering::Acquire)
            && self
                .shared
                .faults
                .read()
                .get(&node)
                .is_some_and(|faults| faults.drop_outgoing)
    }

    pub(super) fn block_on<T>(
        &self,
        future: impl Future<Output = Result<T, NetError>>,
    ) -> Result<T, NetError> {
        ensure_blocking_allowed()?;
        self.check_open()?;
        self.shared.runtime.block_on(future)
    }
}
