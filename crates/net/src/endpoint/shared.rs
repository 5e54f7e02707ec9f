//! What an endpoint's tasks and handles share: the [`Shared`] state with its connection
//! table slots, and what the reader task gets from it (`ReaderContext`).
//!
//! Particular to this module: the one place that lists every lock of the endpoint and
//! builds new connections (`Shared::new_conn`, which copies the node's network filter
//! onto the connection) and handshake greetings. The table's logic is in `table.rs`.
//!
//! Lock order: `table` → `fenced`/`faults`/`addresses` (never the reverse);
//! `fault_changes` first, held while `faults`, then `table`, then `incoming_lanes` are
//! taken one at a time;
//! `incoming_lanes` is taken alone.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use rand::RngCore;
use tokio::runtime::Handle;
use tokio::sync::{broadcast, watch, Notify};

use super::events::ConnectionLost;
use crate::config::Config;
use crate::conn::{Conn, ConnLimits};
use crate::error::NetError;
use crate::fault::LinkFaults;
use crate::handler::HandlerMap;
use crate::lane::OutgoingLanes;
use crate::pool::{Batch, PoolSenders};
use crate::reader::ReaderContext;
use crate::tls::CertRole;
use crate::wire::{Greeting, NONCE_BYTES};
use crate::NodeId;

/// A connection attempt in progress; callers wanting the node wait on the table.
pub(super) struct Attempt {
    pub(super) failed: OnceLock<NetError>,
}

pub(super) enum Slot {
    Connecting(Arc<Attempt>),
    Up(Arc<Conn>),
}

/// Everything an endpoint's tasks and handles share.
pub(crate) struct Shared {
    pub(super) config: Config,
    pub(super) instance: u64,
    pub(super) runtime: Handle,
    pub(super) local_addr: SocketAddr,
    pub(super) started: std::time::Instant,
    pub(super) addresses: RwLock<HashMap<NodeId, SocketAddr>>,
    pub(super) table: RwLock<HashMap<NodeId, Slot>>,
    pub(super) table_changed: Notify,
    pub(super) handlers: RwLock<Arc<HandlerMap>>,
    pub(super) pool: RwLock<Option<PoolSenders>>,
    pub(super) events: broadcast::Sender<ConnectionLost>,
    pub(super) fenced: RwLock<HashSet<NodeId>>,
    pub(super) faults: RwLock<HashMap<NodeId, LinkFaults>>,
    pub(super) faults_any: AtomicBool,
    /// Held by `NetHandle::change_faults` from reading `faults` to updating the
    /// connections (taken before `faults`, never while `table` is held).
    pub(super) fault_changes: parking_lot::Mutex<()>,
    pub(super) shut_down: AtomicBool,
    pub(super) shutdown_tx: watch::Sender<bool>,
    pub(super) serial: AtomicU64,
    /// Direct request lanes this endpoint opened (calling side).
    pub(super) lanes: OutgoingLanes,
    /// Direct request lanes other nodes opened to this endpoint, by node.
    pub(super) incoming_lanes: parking_lot::Mutex<HashMap<NodeId, Vec<Arc<Conn>>>>,
    /// Incoming connections in their handshake now (at most
    /// `Config::pending_handshakes_max`).
    pub(super) pending_handshakes: std::sync::atomic::AtomicUsize,
    /// Incoming connections closed unread because that many handshakes were pending.
    pub(super) handshakes_refused: AtomicU64,
    /// Incoming handshakes that failed or timed out (bad bytes, wrong secret, silence).
    pub(super) handshakes_failed: AtomicU64,
    /// Which certificate roles a node may present (TLS only; `NetHandle::check_roles`).
    pub(super) role_check: RwLock<Option<RoleCheck>>,
}

/// Whether `node` may connect with a certificate naming `role` (see
/// `NetHandle::check_roles`).
pub(super) type RoleCheck = Arc<dyn Fn(NodeId, Option<CertRole>) -> bool + Send + Sync>;

impl Shared {
    /// Whether the role named by `node`'s certificate passes the role check (always
    /// without TLS or without a check).
    pub(super) fn role_allowed(&self, node: NodeId, role: Option<CertRole>) -> bool {
        if self.config.tls.is_none() {
            return true;
        }
        let check = self.role_check.read().clone();
        check.is_none_or(|check| check(node, role))
    }
}

/// Why a role check refused `node`, for errors and logs.
pub(super) fn role_refusal(node: NodeId, role: Option<CertRole>) -> String {
    format!(
        "node {node} presented a {} certificate, which its role in the node table does not allow",
        role.map_or("role-less", CertRole::name)
    )
}

impl ReaderContext for Shared {
    fn handlers(&self) -> Arc<HandlerMap> {
        self.handlers.read().clone()
    }

    fn dispatch(&self, batch: Batch, ordered: bool) {
        match &*self.pool.read() {
            Some(pool) => pool.dispatch(batch, ordered),
            None => batch.conn.release_unprocessed(batch.bytes),
        }
    }

    fn now_ms(&self) -> u64 {
        Shared::now_ms(self)
    }
}

impl Shared {
    pub(super) fn limits(&self) -> ConnLimits {
        ConnLimits {
            send_queue_bytes_max: self.config.send_queue_bytes_max,
            receive_unprocessed_bytes_max: self.config.receive_unprocessed_bytes_max,
            message_bytes_max: self.config.message_bytes_max,
            send_timeout: self.config.send_timeout,
        }
    }

    pub(super) fn new_conn(
        &self,
        peer: NodeId,
        peer_instance: u64,
        initiated_locally: bool,
        lane: bool,
    ) -> Arc<Conn> {
        let conn = Arc::new(Conn::new(
            peer,
            peer_instance,
            initiated_locally,
            lane,
            self.serial.fetch_add(1, Ordering::Relaxed),
            self.limits(),
            self.runtime.clone(),
            self.now_ms(),
        ));
        if self.faults_any.load(Ordering::Acquire) {
            if let Some(faults) = self.faults.read().get(&peer) {
                conn.filter.set(faults);
            }
        }
        conn
    }

    pub(super) fn greeting(&self, lane: bool) -> Greeting {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        Greeting {
            node: self.config.node_id.0,
            instance: self.instance,
            nonce,
            lane,
        }
    }

    /// Milliseconds since the endpoint started (the clock of least-recently-used
    /// eviction).
    pub(super) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}
