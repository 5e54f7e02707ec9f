//! The endpoint: a node's listener, its connection table, the handshake, and the public
//! sending API ([`NetHandle`]), async and blocking.
//!
//! Connections open on first use in either direction. When two nodes dial each other at
//! the same time, the acceptor decides during the handshake, before any frame flows:
//! - it already has a live connection to the same peer instance → `Duplicate` (the dialer
//!   uses the existing one);
//! - it is dialing the peer itself → the dial of the lower node ID wins: the acceptor with
//!   the lower ID answers `Duplicate`, the one with the higher ID accepts and drops its own
//!   dial (which the other side will refuse);
//! - it has a connection to an older instance of the peer (the peer restarted) → the new
//!   connection replaces the old one.
//!
//! So both sides always end with the same single TCP connection, and no frame is ever sent
//! on a connection that loses.
//!
//! Direct request lanes (`lane.rs`) are extra connections outside the table: dialed with
//! blocking calls by a thread in `request_blocking`, accepted here with the lane flag
//! (at most `lanes_per_node_max` per node, refused when fenced), kept in
//! `Shared::incoming_lanes`, closed on fence and shutdown, and never reported as lost.
//!
//! Invariants: the table lock is never held across an await, and locks are taken in the
//! order table → fenced/faults/addresses (never the reverse); every connection in the
//! table with state `Up` has running reader and writer tasks or is about to get them (the
//! acceptor inserts before it writes the verdict); a closed connection is removed from the
//! table by whoever closed it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::RwLock;
use rand::RngCore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{broadcast, oneshot, watch, Notify};
use tokio::time::Instant;

use crate::config::{
    Config, ACCEPT_RETRY_DELAY, DEADLINE_FAR, EVENTS_QUEUED_MAX, LANE_CHECK_IDLE, SECRET_BYTES_MAX,
};
use crate::conn::{
    reader_loop, writer_loop, Batch, CloseReason, Conn, ConnLimits, ConnectionStats, Direct,
    ReaderContext,
};
use crate::error::{HandshakeError, NetError};
use crate::handler::{HandlerMap, Handlers, MessageType};
use crate::lane::{Lane, LaneFailure, LaneStats, OutgoingLanes, Take};
use crate::pool::PoolSenders;
use crate::wire::{
    self, Fragment, FrameHeader, Greeting, Kind, Verdict, FRAME_PAYLOAD_BYTES_MAX, GREETING_BYTES,
    NONCE_BYTES, PROOF_BYTES,
};
use crate::NodeId;

/// A simulated network fault towards one node (for tests of partitions and failures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Everything sent to the node is silently lost (requests time out).
    DropOutgoing,
    /// Everything received from the node is silently discarded.
    DropIncoming,
    /// Both: the node is cut off as by a network partition.
    Partition,
}

impl Fault {
    fn drops_outgoing(self) -> bool {
        matches!(self, Fault::DropOutgoing | Fault::Partition)
    }

    fn drops_incoming(self) -> bool {
        matches!(self, Fault::DropIncoming | Fault::Partition)
    }
}

/// A connection to `node` closed. Failure detection subscribes to these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLost {
    /// The peer.
    pub node: NodeId,
    /// Why.
    pub reason: CloseReason,
}

/// A subscription to [`ConnectionLost`] events.
#[derive(Debug)]
pub struct ConnectionEvents {
    receiver: broadcast::Receiver<ConnectionLost>,
    runtime: Handle,
}

impl ConnectionEvents {
    /// The next event; `None` once the endpoint is gone. Events missed by a subscriber
    /// that fell more than the channel capacity behind are skipped (and logged).
    pub async fn recv(&mut self) -> Option<ConnectionLost> {
        loop {
            match self.receiver.recv().await {
                Ok(event) => return Some(event),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "connection event subscriber lagged");
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// The next event if one is queued.
    pub fn try_recv(&mut self) -> Option<ConnectionLost> {
        loop {
            match self.receiver.try_recv() {
                Ok(event) => return Some(event),
                Err(broadcast::error::TryRecvError::Lagged(_)) => continue,
                Err(_) => return None,
            }
        }
    }

    /// Waits up to `timeout` for the next event, blocking this (non-async) thread.
    pub fn recv_blocking(&mut self, timeout: Duration) -> Result<Option<ConnectionLost>, NetError> {
        ensure_blocking_allowed()?;
        let runtime = self.runtime.clone();
        Ok(runtime
            .block_on(async { tokio::time::timeout(timeout, self.recv()).await })
            .ok()
            .flatten())
    }
}

/// `timeout` from now, saturating (a huge timeout means "about forever", not a panic).
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + DEADLINE_FAR)
}

fn ensure_blocking_allowed() -> Result<(), NetError> {
    if Handle::try_current().is_ok() {
        return Err(NetError::BlockingInAsyncContext);
    }
    Ok(())
}

/// A connection attempt in progress; callers wanting the node wait on the table.
struct Attempt {
    failed: OnceLock<NetError>,
}

enum Slot {
    Connecting(Arc<Attempt>),
    Up(Arc<Conn>),
}

/// Everything an endpoint's tasks and handles share.
pub(crate) struct Shared {
    config: Config,
    instance: u64,
    runtime: Handle,
    local_addr: SocketAddr,
    started: std::time::Instant,
    addresses: RwLock<HashMap<NodeId, SocketAddr>>,
    table: RwLock<HashMap<NodeId, Slot>>,
    table_changed: Notify,
    handlers: RwLock<Arc<HandlerMap>>,
    pool: RwLock<Option<PoolSenders>>,
    events: broadcast::Sender<ConnectionLost>,
    fenced: RwLock<HashSet<NodeId>>,
    faults: RwLock<HashMap<NodeId, Fault>>,
    faults_any: AtomicBool,
    shut_down: AtomicBool,
    shutdown_tx: watch::Sender<bool>,
    serial: AtomicU64,
    /// Direct request lanes this endpoint opened (calling side).
    lanes: OutgoingLanes,
    /// Direct request lanes other nodes opened to this endpoint, by node.
    incoming_lanes: parking_lot::Mutex<HashMap<NodeId, Vec<Arc<Conn>>>>,
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
        self.started.elapsed().as_millis() as u64
    }
}

/// A running endpoint. Dropping it shuts it down: connections close, handler threads
/// finish their current batch and exit, and an owned runtime stops. [`NetHandle`]s
/// cloned from it then fail with [`NetError::Shutdown`].
pub struct Endpoint {
    handle: NetHandle,
    runtime: Option<Runtime>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("node_id", &self.handle.node_id())
            .field("local_addr", &self.handle.local_addr())
            .finish()
    }
}

impl std::ops::Deref for Endpoint {
    type Target = NetHandle;

    fn deref(&self) -> &NetHandle {
        &self.handle
    }
}

/// Binds `config.listen_addr`, refusing an over-long secret first (before any port is
/// taken).
fn bind(config: &Config) -> Result<std::net::TcpListener, NetError> {
    check_secret(config)?;
    std::net::TcpListener::bind(config.listen_addr)
        .map_err(|error| NetError::Startup(Arc::new(error)))
}

fn check_secret(config: &Config) -> Result<(), NetError> {
    if config.secret.len() > SECRET_BYTES_MAX {
        return Err(NetError::Startup(Arc::new(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "cluster secret longer than SECRET_BYTES_MAX",
        ))));
    }
    Ok(())
}

impl Endpoint {
    /// Starts an endpoint with its own multi-thread tokio runtime (`config.io_threads`
    /// workers). Call it outside any async runtime.
    pub fn start(config: Config, handlers: Handlers) -> Result<Self, NetError> {
        let listener = bind(&config)?;
        Self::start_with_listener(config, handlers, listener)
    }

    /// [`Endpoint::start`] with a listener the caller bound already (see
    /// [`Endpoint::start_on_listener`]).
    pub fn start_with_listener(
        config: Config,
        handlers: Handlers,
        listener: std::net::TcpListener,
    ) -> Result<Self, NetError> {
        ensure_blocking_allowed()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.io_threads.max(1))
            .thread_name(format!("myriad-net-io-{}", config.node_id))
            .enable_all()
            .build()
            .map_err(|error| NetError::Startup(Arc::new(error)))?;
        let mut endpoint =
            Self::start_on_listener(runtime.handle().clone(), config, handlers, listener)?;
        endpoint.runtime = Some(runtime);
        Ok(endpoint)
    }

    /// Starts an endpoint whose tasks run on an existing tokio runtime (which must have
    /// I/O and time enabled). Callable from anywhere, also from inside that runtime.
    pub fn start_on(runtime: Handle, config: Config, handlers: Handlers) -> Result<Self, NetError> {
        let listener = bind(&config)?;
        Self::start_on_listener(runtime, config, handlers, listener)
    }

    /// [`Endpoint::start_on`] with a listener the caller bound already (so that it knows
    /// the OS-chosen port before it knows its node ID); `config.listen_addr` is ignored.
    pub fn start_on_listener(
        runtime: Handle,
        config: Config,
        handlers: Handlers,
        listener: std::net::TcpListener,
    ) -> Result<Self, NetError> {
        check_secret(&config)?;
        let startup = |error: std::io::Error| NetError::Startup(Arc::new(error));
        listener.set_nonblocking(true).map_err(startup)?;
        let local_addr = listener.local_addr().map_err(startup)?;
        let listener = {
            let _guard = runtime.enter();
            TcpListener::from_std(listener).map_err(startup)?
        };
        let (pool, _threads) = crate::pool::start(
            config.handler_threads,
            &format!("myriad-net-handler-{}", config.node_id),
        )
        .map_err(startup)?;
        let (events, _) = broadcast::channel(EVENTS_QUEUED_MAX);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            instance: rand::rngs::OsRng.next_u64(),
            runtime: runtime.clone(),
            local_addr,
            started: std::time::Instant::now(),
            addresses: RwLock::new(HashMap::new()),
            table: RwLock::new(HashMap::new()),
            table_changed: Notify::new(),
            handlers: RwLock::new(Arc::new(handlers.map)),
            pool: RwLock::new(Some(pool)),
            events,
            fenced: RwLock::new(HashSet::new()),
            faults: RwLock::new(HashMap::new()),
            faults_any: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            shutdown_tx,
            serial: AtomicU64::new(0),
            lanes: OutgoingLanes::default(),
            incoming_lanes: parking_lot::Mutex::new(HashMap::new()),
            config,
        });
        runtime.spawn(accept_loop(shared.clone(), listener, shutdown_rx.clone()));
        runtime.spawn(sweep_lanes(shared.clone(), shutdown_rx));
        tracing::debug!(node = %shared.config.node_id, %local_addr, "endpoint started");
        Ok(Self {
            handle: NetHandle { shared },
            runtime: None,
        })
    }

    /// A cloneable handle for sending from other threads and tasks.
    pub fn handle(&self) -> NetHandle {
        self.handle.clone()
    }

    /// Shuts the endpoint down (the same as dropping it).
    pub fn shutdown(self) {}
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let shared = &self.handle.shared;
        if shared.shut_down.swap(true, Ordering::AcqRel) {
            return;
        }
        shared.shutdown_tx.send_replace(true);
        let conns: Vec<Arc<Conn>> = shared
            .table
            .write()
            .drain()
            .filter_map(|(_, slot)| match slot {
                Slot::Up(conn) => Some(conn),
                Slot::Connecting(_) => None,
            })
            .collect();
        for conn in conns {
            conn.close();
        }
        shared.lanes.close_all();
        let lanes: Vec<Arc<Conn>> = shared
            .incoming_lanes
            .lock()
            .drain()
            .flat_map(|(_, lanes)| lanes)
            .collect();
        for lane in lanes {
            lane.close();
        }
        shared.table_changed.notify_waiters();
        // Handler threads exit once every pool sender is gone.
        shared.pool.write().take();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Sends messages and requests; cheap to clone, usable from any thread. Methods without
/// `_blocking` are async; the `_blocking` ones may be called from any thread that is not
/// running async tasks (they return `BlockingInAsyncContext` there) and take a fast path
/// with no runtime involvement when the connection is up and its queue has room;
/// [`NetHandle::request_blocking`] goes further and uses a direct request lane (the
/// calling thread writes and reads the socket itself).
#[derive(Clone)]
pub struct NetHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for NetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetHandle")
            .field("node_id", &self.shared.config.node_id)
            .finish()
    }
}

/// Outcome of the synchronous send attempt.
enum Fast {
    Done,
    Slow,
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
        let mut current = self.shared.handlers.write();
        let mut map = HandlerMap::clone(&current);
        crate::handler::insert(&mut map, message_type, Arc::new(handler), false)?;
        *current = Arc::new(map);
        Ok(())
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

    /// Turns on a simulated fault towards `node` (test fault switch).
    pub fn set_fault(&self, node: NodeId, fault: Fault) {
        // Lock order: never hold `faults` while taking `table` (accepting does table → faults).
        self.shared.faults.write().insert(node, fault);
        self.shared.faults_any.store(true, Ordering::Release);
        for conn in self
            .lookup(node)
            .into_iter()
            .chain(self.incoming_lanes(node))
        {
            conn.drop_outgoing
                .store(fault.drops_outgoing(), Ordering::Release);
            conn.drop_incoming
                .store(fault.drops_incoming(), Ordering::Release);
        }
    }

    /// Turns off the simulated fault towards `node`.
    pub fn clear_fault(&self, node: NodeId) {
        {
            let mut faults = self.shared.faults.write();
            faults.remove(&node);
            self.shared
                .faults_any
                .store(!faults.is_empty(), Ordering::Release);
        }
        for conn in self
            .lookup(node)
            .into_iter()
            .chain(self.incoming_lanes(node))
        {
            conn.drop_outgoing.store(false, Ordering::Release);
            conn.drop_incoming.store(false, Ordering::Release);
        }
    }

    /// The lanes `node` opened to this endpoint that are still open.
    fn incoming_lanes(&self, node: NodeId) -> Vec<Arc<Conn>> {
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

    fn lookup(&self, node: NodeId) -> Option<Arc<Conn>> {
        match self.shared.table.read().get(&node) {
            Some(Slot::Up(conn)) if !conn.is_closed() => Some(conn.clone()),
            _ => None,
        }
    }

    fn check_open(&self) -> Result<(), NetError> {
        if self.shared.shut_down.load(Ordering::Acquire) {
            return Err(NetError::Shutdown);
        }
        Ok(())
    }

    /// Whether the fault switch drops everything sent to `node`.
    fn drops_outgoing(&self, node: NodeId) -> bool {
        self.shared.faults_any.load(Ordering::Acquire)
            && self
                .shared
                .faults
                .read()
                .get(&node)
                .is_some_and(|fault| fault.drops_outgoing())
    }

    fn check_size(&self, payload: &Bytes) -> Result<(), NetError> {
        let max_bytes = self.shared.config.message_bytes_max;
        if payload.len() > max_bytes {
            return Err(NetError::MessageTooLarge {
                size_bytes: payload.len(),
                max_bytes,
            });
        }
        Ok(())
    }

    fn send_fast(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
    ) -> Result<Fast, NetError> {
        self.check_open()?;
        self.check_size(payload)?;
        if self.drops_outgoing(to) {
            return Ok(Fast::Done);
        }
        if payload.len() > FRAME_PAYLOAD_BYTES_MAX {
            return Ok(Fast::Slow);
        }
        let Some(conn) = self.lookup(to) else {
            return Ok(Fast::Slow);
        };
        let header = whole_header(Kind::Message, message_type, 0, payload.len());
        match conn.try_enqueue(&header, payload, 1, Direct::IfIdle)? {
            true => Ok(Fast::Done),
            false => Ok(Fast::Slow),
        }
    }

    async fn send_slow(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
    ) -> Result<(), NetError> {
        let conn = self.shared.connection(to).await?;
        conn.send_message(whole_header(Kind::Message, message_type, 0, 0), payload, 1)
            .await
    }

    /// Sends a one-way message. Returns once it is queued (connecting first if needed,
    /// waiting while the queue is full); delivery is not confirmed.
    pub async fn send(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
    ) -> Result<(), NetError> {
        match self.send_fast(to, message_type, &payload)? {
            Fast::Done => Ok(()),
            Fast::Slow => self.send_slow(to, message_type, &payload).await,
        }
    }

    /// [`NetHandle::send`] for non-async threads.
    pub fn send_blocking(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
    ) -> Result<(), NetError> {
        ensure_blocking_allowed()?;
        match self.send_fast(to, message_type, &payload)? {
            Fast::Done => Ok(()),
            Fast::Slow => self.block_on(self.send_slow(to, message_type, &payload)),
        }
    }

    /// Sends one message to several nodes (the payload is shared, not copied); one result
    /// per node, in order.
    pub async fn send_many(
        &self,
        to: &[NodeId],
        message_type: MessageType,
        payload: Bytes,
    ) -> Vec<Result<(), NetError>> {
        let mut results = Vec::with_capacity(to.len());
        for node in to {
            results.push(self.send(*node, message_type, payload.clone()).await);
        }
        results
    }

    /// [`NetHandle::send_many`] for non-async threads.
    pub fn send_many_blocking(
        &self,
        to: &[NodeId],
        message_type: MessageType,
        payload: Bytes,
    ) -> Vec<Result<(), NetError>> {
        to.iter()
            .map(|node| self.send_blocking(*node, message_type, payload.clone()))
            .collect()
    }

    fn request_fast(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
        deadline: Instant,
    ) -> Result<Option<PendingResponse>, NetError> {
        self.check_open()?;
        self.check_size(payload)?;
        if self.drops_outgoing(to) {
            return Ok(Some(self.lost_request(to, deadline)));
        }
        if payload.len() > FRAME_PAYLOAD_BYTES_MAX {
            return Ok(None);
        }
        let Some(conn) = self.lookup(to) else {
            return Ok(None);
        };
        let (id, receiver, outstanding) = conn.register_request()?;
        let pending =
            PendingResponse::new(self, to, Some(conn.clone()), id, Some(receiver), deadline);
        let header = whole_header(Kind::Request, message_type, id, payload.len());
        let direct = if outstanding == 1 {
            Direct::Yes
        } else {
            Direct::Never
        };
        match conn.try_enqueue(&header, payload, 1, direct)? {
            true => Ok(Some(pending)),
            false => Ok(None),
        }
    }

    fn lost_request(&self, to: NodeId, deadline: Instant) -> PendingResponse {
        PendingResponse::new(self, to, None, 0, None, deadline)
    }

    async fn request_slow(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
        deadline: Instant,
    ) -> Result<PendingResponse, NetError> {
        let conn = match tokio::time::timeout_at(deadline, self.shared.connection(to)).await {
            Ok(conn) => conn?,
            Err(_) => return Err(NetError::Timeout(to)),
        };
        let (id, receiver, _) = conn.register_request()?;
        let pending =
            PendingResponse::new(self, to, Some(conn.clone()), id, Some(receiver), deadline);
        conn.send_message(whole_header(Kind::Request, message_type, id, 0), payload, 1)
            .await?;
        Ok(pending)
    }

    /// Sends a request and returns once it is queued; the response is collected later by
    /// awaiting the returned [`PendingResponse`] (or `wait_blocking`). The timeout counts
    /// from this call; a response arriving after it is dropped.
    pub async fn request_later(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<PendingResponse, NetError> {
        let deadline = deadline_after(timeout);
        if let Some(pending) = self.request_fast(to, message_type, &payload, deadline)? {
            return Ok(pending);
        }
        self.request_slow(to, message_type, &payload, deadline)
            .await
    }

    /// [`NetHandle::request_later`] for non-async threads.
    pub fn request_later_blocking(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<PendingResponse, NetError> {
        ensure_blocking_allowed()?;
        let deadline = deadline_after(timeout);
        if let Some(pending) = self.request_fast(to, message_type, &payload, deadline)? {
            return Ok(pending);
        }
        self.block_on(self.request_slow(to, message_type, &payload, deadline))
    }

    /// Sends a request and waits for its response (at most `timeout`).
    pub async fn request(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, NetError> {
        self.request_later(to, message_type, payload, timeout)
            .await?
            .await
    }

    /// [`NetHandle::request`] for non-async threads.
    ///
    /// A request of an unordered type whose payload fits one frame goes over a direct
    /// request lane when one can be had: a connection to `to` that this thread takes from
    /// a per-node pool, writes the request to and reads the response from itself (one
    /// write and usually one read system call, no hand-off to the I/O thread), then hands
    /// back. At most `Config::lanes_per_node_max` lanes per node; when all are busy, the
    /// peer refuses another, a fault switch is set for `to`, or lanes are off, the request
    /// goes through the node's connection as [`NetHandle::request`] does. Errors are the
    /// same either way (a lane failing to open gives the connection's errors: `Fenced`,
    /// `UnknownNode`, `ConnectTimeout`, `ConnectRefused`, `ConnectFailed`,
    /// `AuthenticationFailed`; a lane
    /// that breaks gives `ConnectionLost`; no response in time gives `Timeout`). With no
    /// connection to the node, it is opened first (as any request would), so connection
    /// events keep reporting the node.
    pub fn request_blocking(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, NetError> {
        ensure_blocking_allowed()?;
        if let Some(result) = self.request_on_lane(to, message_type, &payload, timeout) {
            return result;
        }
        self.request_later_blocking(to, message_type, payload, timeout)?
            .wait_blocking()
    }

    /// The lane path of [`NetHandle::request_blocking`]; `None` to use the connection.
    fn request_on_lane(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
        timeout: Duration,
    ) -> Option<Result<Bytes, NetError>> {
        let max = self.shared.config.lanes_per_node_max;
        if max == 0 || message_type.ordered || payload.len() > FRAME_PAYLOAD_BYTES_MAX {
            return None;
        }
        if let Err(error) = self.check_open().and_then(|()| self.check_size(payload)) {
            return Some(Err(error));
        }
        if self.shared.faults_any.load(Ordering::Acquire)
            && self.shared.faults.read().contains_key(&to)
        {
            return None;
        }
        if self.is_fenced(to) {
            return Some(Err(NetError::Fenced(to)));
        }
        let now = std::time::Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + DEADLINE_FAR);
        // The peer's instance as its connection knows it: an idle lane of another one
        // (the peer restarted) is never reused, even if its socket looks open.
        let instance = if let Some(conn) = self.lookup(to) {
            // Lane traffic counts as use of the node's connection (least recently used
            // eviction must not pick a connection whose lanes are busy).
            conn.touch(self.shared.now_ms());
            conn.peer_instance
        } else {
            // The node's connection comes first, as on the connection path: its events
            // report the node, and its errors are the ones a failed request gives.
            let until = Instant::from_std(deadline);
            let connected = self.block_on(async {
                match tokio::time::timeout_at(until, self.shared.connection(to)).await {
                    Ok(conn) => conn.map(|conn| conn.peer_instance),
                    Err(_) => Err(NetError::Timeout(to)),
                }
            });
            match connected {
                Ok(instance) => instance,
                Err(error) => return Some(Err(error)),
            }
        };
        let lanes = &self.shared.lanes;
        // Bounded: each pass takes an idle lane out of the pool for good or ends.
        let mut lane = loop {
            match lanes.take(to, max) {
                Take::Idle(mut lane) => {
                    if lane.peer_instance != instance || lane.is_stale(LANE_CHECK_IDLE) {
                        lanes.discard(to, lane);
                        continue;
                    }
                    break lane;
                }
                Take::Open => match self.open_lane(to, deadline) {
                    Ok(Some(lane)) => break lane,
                    Ok(None) => return None,
                    Err(error) => return Some(Err(error)),
                },
                Take::Full => return None,
            }
        };
        let header = whole_header(Kind::Request, message_type, 0, payload.len());
        let message_bytes_max = self.shared.config.message_bytes_max;
        match lane.call(header, payload, deadline, message_bytes_max) {
            Ok(response) => {
                lanes.give_back(to, lane);
                Some(Ok(response))
            }
            Err(failure) => {
                lanes.discard(to, lane);
                if self.shared.shut_down.load(Ordering::Acquire) {
                    return Some(Err(NetError::Shutdown));
                }
                if self.is_fenced(to) {
                    return Some(Err(NetError::Fenced(to)));
                }
                Some(Err(match failure {
                    LaneFailure::Timeout => NetError::Timeout(to),
                    LaneFailure::Io(_) => NetError::ConnectionLost(to),
                    LaneFailure::Protocol(_) | LaneFailure::Unexpected => {
                        tracing::warn!(peer = %to, %failure, "lane closed");
                        NetError::ConnectionLost(to)
                    }
                }))
            }
        }
    }

    /// Opens a lane to `to` on this thread (a slot is reserved by the caller). `Ok(None)`:
    /// the peer holds its maximum of lanes from us; use the connection.
    fn open_lane(
        &self,
        to: NodeId,
        deadline: std::time::Instant,
    ) -> Result<Option<Lane>, NetError> {
        let lanes = &self.shared.lanes;
        let opened = self
            .address(to)
            .ok_or(NetError::UnknownNode(to))
            .and_then(|addr| {
                let connect_timeout = self.shared.config.connect_timeout;
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                // As on the connection path: the request's own deadline, if shorter, makes a
                // slow connect a request timeout.
                let (limit, timed_out) = if left < connect_timeout {
                    (left, NetError::Timeout(to))
                } else {
                    (connect_timeout, NetError::ConnectTimeout(to))
                };
                dial_lane(&self.shared, to, addr, limit).map_err(|failure| match failure {
                    DialFailure::TimedOut => timed_out,
                    DialFailure::Error(error) => error,
                })
            });
        let (stream, peer_instance, verdict) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                lanes.open_failed(to);
                return Err(error);
            }
        };
        match verdict {
            Verdict::Accepted => {}
            Verdict::Duplicate => {
                lanes.open_failed(to);
                return Ok(None);
            }
            Verdict::Refused => {
                lanes.open_failed(to);
                return Err(NetError::Fenced(to));
            }
        }
        let Some(lane) = lanes.opened(to, stream, peer_instance) else {
            return Ok(None);
        };
        if self.is_fenced(to) {
            lanes.discard(to, lane);
            return Err(NetError::Fenced(to));
        }
        Ok(Some(lane))
    }

    fn block_on<T>(
        &self,
        future: impl Future<Output = Result<T, NetError>>,
    ) -> Result<T, NetError> {
        ensure_blocking_allowed()?;
        self.check_open()?;
        self.shared.runtime.block_on(future)
    }
}

fn whole_header(
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

/// A response to collect later: await it, or call [`PendingResponse::wait_blocking`].
/// Dropping it abandons the request (a late response is dropped).
pub struct PendingResponse {
    node: NodeId,
    conn: Option<Arc<Conn>>,
    request_id: u32,
    receiver: Option<oneshot::Receiver<Result<Bytes, NetError>>>,
    deadline: Instant,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    runtime: Handle,
    shared: Arc<Shared>,
    finished: bool,
}

impl std::fmt::Debug for PendingResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingResponse")
            .field("node", &self.node)
            .field("request_id", &self.request_id)
            .finish()
    }
}

impl PendingResponse {
    fn new(
        handle: &NetHandle,
        node: NodeId,
        conn: Option<Arc<Conn>>,
        request_id: u32,
        receiver: Option<oneshot::Receiver<Result<Bytes, NetError>>>,
        deadline: Instant,
    ) -> Self {
        Self {
            node,
            conn,
            request_id,
            receiver,
            deadline,
            sleep: None,
            runtime: handle.shared.runtime.clone(),
            shared: handle.shared.clone(),
            finished: false,
        }
    }

    /// The node the request went to.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Blocks this (non-async) thread until the response arrives or the timeout passes.
    pub fn wait_blocking(self) -> Result<Bytes, NetError> {
        ensure_blocking_allowed()?;
        if self.shared.shut_down.load(Ordering::Acquire) {
            return Err(NetError::Shutdown);
        }
        let runtime = self.runtime.clone();
        runtime.block_on(self)
    }
}

impl Future for PendingResponse {
    type Output = Result<Bytes, NetError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.finished {
            return Poll::Ready(Err(NetError::Timeout(this.node)));
        }
        if this.shared.shut_down.load(Ordering::Acquire) {
            this.finished = true;
            return Poll::Ready(Err(NetError::Shutdown));
        }
        if let Some(receiver) = this.receiver.as_mut() {
            if let Poll::Ready(result) = Pin::new(receiver).poll(cx) {
                this.finished = true;
                return Poll::Ready(match result {
                    Ok(response) => response,
                    Err(_) => Err(NetError::ConnectionLost(this.node)),
                });
            }
        }
        let sleep = this.sleep.get_or_insert_with(|| {
            let _guard = this.runtime.enter();
            Box::pin(tokio::time::sleep_until(this.deadline))
        });
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.finished = true;
                if let Some(conn) = &this.conn {
                    conn.forget_request(this.request_id);
                }
                Poll::Ready(Err(NetError::Timeout(this.node)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for PendingResponse {
    fn drop(&mut self) {
        if !self.finished {
            if let Some(conn) = &self.conn {
                conn.forget_request(self.request_id);
            }
        }
    }
}

impl Shared {
    fn limits(&self) -> ConnLimits {
        ConnLimits {
            send_queue_bytes_max: self.config.send_queue_bytes_max,
            receive_unprocessed_bytes_max: self.config.receive_unprocessed_bytes_max,
            message_bytes_max: self.config.message_bytes_max,
            send_timeout: self.config.send_timeout,
        }
    }

    /// The open connection to `node`, connecting if needed (bounded by the connect timeout).
    async fn connection(self: &Arc<Self>, node: NodeId) -> Result<Arc<Conn>, NetError> {
        let deadline = deadline_after(self.config.connect_timeout);
        let mut waiting_on: Option<Arc<Attempt>> = None;
        loop {
            if self.shut_down.load(Ordering::Acquire) {
                return Err(NetError::Shutdown);
            }
            let notified = self.table_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The attempt we waited on failed: report it rather than dial again.
            if let Some(error) = waiting_on.as_ref().and_then(|attempt| attempt.failed.get()) {
                return Err(error.clone());
            }
            let attempt = {
                let mut table = self.table.write();
                match table.get(&node) {
                    Some(Slot::Up(conn)) if !conn.is_closed() => return Ok(conn.clone()),
                    Some(Slot::Connecting(attempt)) => attempt.clone(),
                    _ => {
                        if self.fenced.read().contains(&node) {
                            return Err(NetError::Fenced(node));
                        }
                        let addr = self
                            .addresses
                            .read()
                            .get(&node)
                            .copied()
                            .ok_or(NetError::UnknownNode(node))?;
                        let attempt = Arc::new(Attempt {
                            failed: OnceLock::new(),
                        });
                        table.insert(node, Slot::Connecting(attempt.clone()));
                        self.runtime
                            .spawn(connect(self.clone(), node, addr, attempt.clone()));
                        attempt
                    }
                }
            };
            if let Some(error) = attempt.failed.get() {
                return Err(error.clone());
            }
            waiting_on = Some(attempt);
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(NetError::ConnectTimeout(node));
            }
        }
    }

    /// Ends a connection attempt: marks it failed and removes it from the table.
    fn fail_attempt(&self, node: NodeId, attempt: &Arc<Attempt>, error: NetError) {
        let _ = attempt.failed.set(error);
        let mut table = self.table.write();
        if let Some(Slot::Connecting(current)) = table.get(&node) {
            if Arc::ptr_eq(current, attempt) {
                table.remove(&node);
            }
        }
        drop(table);
        self.table_changed.notify_waiters();
    }

    /// Closes `conn` and, if this call closed it, removes it from the table and tells
    /// subscribers.
    fn retire(&self, conn: &Arc<Conn>, reason: CloseReason) {
        if !conn.close() {
            return;
        }
        if conn.lane {
            // A lane is not the node's connection: it leaves only the lane list.
            let mut lanes = self.incoming_lanes.lock();
            if let Some(list) = lanes.get_mut(&conn.peer) {
                list.retain(|lane| !Arc::ptr_eq(lane, conn));
                if list.is_empty() {
                    lanes.remove(&conn.peer);
                }
            }
            drop(lanes);
            match &reason {
                CloseReason::Protocol(_) => {
                    tracing::warn!(peer = %conn.peer, %reason, "lane closed")
                }
                _ => tracing::trace!(peer = %conn.peer, %reason, "lane closed"),
            }
            return;
        }
        {
            let mut table = self.table.write();
            if let Some(Slot::Up(current)) = table.get(&conn.peer) {
                if Arc::ptr_eq(current, conn) {
                    table.remove(&conn.peer);
                }
            }
        }
        self.table_changed.notify_waiters();
        if self.shut_down.load(Ordering::Acquire) {
            return;
        }
        match &reason {
            CloseReason::Protocol(_) | CloseReason::Io(_) => {
                tracing::warn!(peer = %conn.peer, %reason, "connection closed")
            }
            _ => tracing::debug!(peer = %conn.peer, %reason, "connection closed"),
        }
        let _ = self.events.send(ConnectionLost {
            node: conn.peer,
            reason,
        });
    }

    fn new_conn(
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
            if let Some(fault) = self.faults.read().get(&peer) {
                conn.drop_outgoing
                    .store(fault.drops_outgoing(), Ordering::Release);
                conn.drop_incoming
                    .store(fault.drops_incoming(), Ordering::Release);
            }
        }
        conn
    }

    /// Starts the reader and writer tasks of a connection now in the table.
    fn run(self: &Arc<Self>, conn: Arc<Conn>, stream: TcpStream) {
        let stream = Arc::new(stream);
        conn.attach(stream.clone());
        let (reader, writer) = (stream.clone(), stream);
        let shared = self.clone();
        let writer_conn = conn.clone();
        self.runtime.spawn(async move {
            let clock_shared = shared.clone();
            let clock = move || clock_shared.now_ms();
            if let Some(reason) = writer_loop(writer_conn.clone(), writer, clock).await {
                shared.retire(&writer_conn, reason);
            }
        });
        let shared = self.clone();
        self.runtime.spawn(async move {
            let reason = reader_loop(conn.clone(), reader, &*shared).await;
            shared.retire(&conn, reason);
        });
    }

    /// Closes least recently used connections beyond `connections_max`, sparing `keep`.
    fn enforce_connection_limit(&self, keep: &Arc<Conn>) {
        loop {
            let victim = {
                let table = self.table.read();
                let up: Vec<&Arc<Conn>> = table
                    .values()
                    .filter_map(|slot| match slot {
                        Slot::Up(conn) if !conn.is_closed() => Some(conn),
                        _ => None,
                    })
                    .collect();
                if up.len() <= self.config.connections_max.max(1) {
                    return;
                }
                up.into_iter()
                    .filter(|conn| !Arc::ptr_eq(conn, keep))
                    .min_by_key(|conn| conn.last_used_ms())
                    .cloned()
            };
            match victim {
                Some(conn) => self.retire(&conn, CloseReason::Evicted),
                None => return,
            }
        }
    }

    /// Puts a connection this node dialed into the table (see the module docs for the
    /// tie-break). Returns false if an existing connection to the same instance wins.
    fn install_outgoing(&self, node: NodeId, conn: &Arc<Conn>) -> bool {
        let replaced = {
            let mut table = self.table.write();
            let replaced = match table.get(&node) {
                Some(Slot::Up(old)) if !old.is_closed() => {
                    if old.peer_instance == conn.peer_instance {
                        return false;
                    }
                    Some(old.clone())
                }
                _ => None,
            };
            table.insert(node, Slot::Up(conn.clone()));
            replaced
        };
        if let Some(old) = replaced {
            self.retire(&old, CloseReason::Replaced);
        }
        self.table_changed.notify_waiters();
        true
    }

    /// Decides an authenticated incoming connection and, if accepted, puts it in the table.
    fn decide_incoming(&self, node: NodeId, peer_instance: u64) -> (Verdict, Option<Arc<Conn>>) {
        if self.fenced.read().contains(&node) {
            return (Verdict::Refused, None);
        }
        let (conn, replaced) = {
            let mut table = self.table.write();
            let replaced = match table.get(&node) {
                Some(Slot::Up(old)) if !old.is_closed() => {
                    if old.peer_instance == peer_instance {
                        return (Verdict::Duplicate, None);
                    }
                    Some(old.clone())
                }
                Some(Slot::Connecting(_)) if self.config.node_id < node => {
                    return (Verdict::Duplicate, None);
                }
                _ => None,
            };
            let conn = self.new_conn(node, peer_instance, false, false);
            table.insert(node, Slot::Up(conn.clone()));
            (conn, replaced)
        };
        if let Some(old) = replaced {
            self.retire(&old, CloseReason::Replaced);
        }
        self.table_changed.notify_waiters();
        (Verdict::Accepted, Some(conn))
    }

    /// Decides an authenticated incoming lane: refused if the node is fenced,
    /// `Duplicate` (use the connection) at the lane limit.
    fn decide_lane(&self, node: NodeId, peer_instance: u64) -> (Verdict, Option<Arc<Conn>>) {
        if self.fenced.read().contains(&node) {
            return (Verdict::Refused, None);
        }
        let mut lanes = self.incoming_lanes.lock();
        let list = lanes.entry(node).or_default();
        list.retain(|lane| !lane.is_closed());
        if list.len() >= self.config.lanes_per_node_max {
            return (Verdict::Duplicate, None);
        }
        let conn = self.new_conn(node, peer_instance, false, true);
        list.push(conn.clone());
        (Verdict::Accepted, Some(conn))
    }

    fn greeting(&self, lane: bool) -> Greeting {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        Greeting {
            node: self.config.node_id.0,
            instance: self.instance,
            nonce,
            lane,
        }
    }
}

/// Why a lane could not be dialed.
enum DialFailure {
    /// The time limit passed.
    TimedOut,
    /// Anything else, as the connection path reports it.
    Error(NetError),
}

/// TCP connect and the connector's half of the handshake for a lane, with blocking calls
/// on this thread, all within `limit`. The socket is left blocking with no receive
/// timeout and the send timeout as its write timeout.
fn dial_lane(
    shared: &Shared,
    node: NodeId,
    addr: SocketAddr,
    limit: Duration,
) -> Result<(std::net::TcpStream, u64, Verdict), DialFailure> {
    use std::io::{Read, Write};
    let start = std::time::Instant::now();
    let io = |error: std::io::Error| match error.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => DialFailure::TimedOut,
        std::io::ErrorKind::ConnectionRefused => DialFailure::Error(NetError::ConnectRefused(node)),
        _ => DialFailure::Error(connect_failed(node, error)),
    };
    // Each step waits at most what is left of the limit (a zero timeout means "none" to
    // the socket calls, so an exhausted limit is a timeout here).
    let left = || {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            Err(DialFailure::TimedOut)
        } else {
            Ok(left)
        }
    };
    let mut stream = std::net::TcpStream::connect_timeout(&addr, left()?).map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    stream.set_write_timeout(Some(left()?)).map_err(io)?;
    stream.set_read_timeout(Some(left()?)).map_err(io)?;
    let ours = shared.greeting(true).encode();
    stream.write_all(&ours).map_err(io)?;
    let mut reply = [0u8; GREETING_BYTES + PROOF_BYTES];
    stream.read_exact(&mut reply).map_err(io)?;
    let (theirs, proof) = reply.split_at(GREETING_BYTES);
    let mut theirs_array = [0u8; GREETING_BYTES];
    theirs_array.copy_from_slice(theirs);
    let mut proof_array = [0u8; PROOF_BYTES];
    proof_array.copy_from_slice(proof);
    let greeting =
        Greeting::decode(&theirs_array).map_err(|e| DialFailure::Error(connect_failed(node, e)))?;
    if greeting.node != node.0 {
        return Err(DialFailure::Error(connect_failed(
            node,
            HandshakeError::UnexpectedNode(greeting.node),
        )));
    }
    let secret = &shared.config.secret;
    if wire::verify_acceptor_proof(secret, &ours, &theirs_array, &proof_array).is_err() {
        tracing::warn!(%node, %addr, "peer failed to prove the cluster secret (lane)");
        return Err(DialFailure::Error(NetError::AuthenticationFailed(node)));
    }
    stream
        .write_all(&wire::connector_proof(secret, &ours, &theirs_array))
        .map_err(io)?;
    stream.set_read_timeout(Some(left()?)).map_err(io)?;
    let mut verdict = [0u8; 1];
    if let Err(error) = stream.read_exact(&mut verdict) {
        // The acceptor closes without a verdict when our proof fails.
        return Err(match io(error) {
            DialFailure::TimedOut => DialFailure::TimedOut,
            DialFailure::Error(_) => DialFailure::Error(NetError::AuthenticationFailed(node)),
        });
    }
    let [verdict] = verdict;
    let verdict =
        Verdict::decode(verdict).map_err(|e| DialFailure::Error(connect_failed(node, e)))?;
    stream.set_read_timeout(None).map_err(io)?;
    stream
        .set_write_timeout(Some(shared.config.send_timeout))
        .map_err(io)?;
    Ok((stream, greeting.instance, verdict))
}

/// Dials `node` at `addr`, authenticates, and installs the connection.
async fn connect(shared: Arc<Shared>, node: NodeId, addr: SocketAddr, attempt: Arc<Attempt>) {
    let timeout = shared.config.connect_timeout;
    let outcome = tokio::time::timeout(timeout, dial(&shared, node, addr)).await;
    let (stream, peer_instance, verdict) = match outcome {
        Err(_) => return shared.fail_attempt(node, &attempt, NetError::ConnectTimeout(node)),
        Ok(Err(error)) => {
            tracing::debug!(%node, %addr, %error, "connect failed");
            return shared.fail_attempt(node, &attempt, error);
        }
        Ok(Ok(done)) => done,
    };
    match verdict {
        Verdict::Accepted => {
            let conn = shared.new_conn(node, peer_instance, true, false);
            if shared.install_outgoing(node, &conn) {
                shared.run(conn.clone(), stream);
                shared.enforce_connection_limit(&conn);
            } else {
                tracing::warn!(%node, "accepted dial lost to an existing connection");
            }
        }
        Verdict::Duplicate => {
            // The peer's own dial wins; it will show up as an incoming connection. Give
            // up on this attempt if it has not within the connect timeout.
            tokio::time::sleep(timeout).await;
            shared.fail_attempt(node, &attempt, NetError::ConnectTimeout(node));
        }
        Verdict::Refused => shared.fail_attempt(node, &attempt, NetError::Fenced(node)),
    }
}

fn connect_failed(node: NodeId, error: impl std::fmt::Display) -> NetError {
    NetError::ConnectFailed {
        node,
        reason: error.to_string(),
    }
}

/// TCP connect and the dialer's half of the handshake.
async fn dial(
    shared: &Shared,
    node: NodeId,
    addr: SocketAddr,
) -> Result<(TcpStream, u64, Verdict), NetError> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::ConnectionRefused {
            NetError::ConnectRefused(node)
        } else {
            connect_failed(node, e)
        }
    })?;
    stream
        .set_nodelay(true)
        .map_err(|e| connect_failed(node, e))?;
    let ours = shared.greeting(false).encode();
    stream
        .write_all(&ours)
        .await
        .map_err(|e| connect_failed(node, e))?;
    let mut theirs = [0u8; GREETING_BYTES];
    stream
        .read_exact(&mut theirs)
        .await
        .map_err(|e| connect_failed(node, e))?;
    let mut proof = [0u8; PROOF_BYTES];
    stream
        .read_exact(&mut proof)
        .await
        .map_err(|e| connect_failed(node, e))?;
    let greeting = Greeting::decode(&theirs).map_err(|e| connect_failed(node, e))?;
    if greeting.node != node.0 {
        return Err(connect_failed(
            node,
            HandshakeError::UnexpectedNode(greeting.node),
        ));
    }
    let secret = &shared.config.secret;
    if wire::verify_acceptor_proof(secret, &ours, &theirs, &proof).is_err() {
        tracing::warn!(%node, %addr, "peer failed to prove the cluster secret");
        return Err(NetError::AuthenticationFailed(node));
    }
    let our_proof = wire::connector_proof(secret, &ours, &theirs);
    stream
        .write_all(&our_proof)
        .await
        .map_err(|e| connect_failed(node, e))?;
    let mut verdict = [0u8; 1];
    if stream.read_exact(&mut verdict).await.is_err() {
        // The acceptor closes without a verdict when our proof fails.
        return Err(NetError::AuthenticationFailed(node));
    }
    let [verdict] = verdict;
    let verdict = Verdict::decode(verdict).map_err(|e| connect_failed(node, e))?;
    Ok((stream, greeting.instance, verdict))
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        match accepted {
            Ok((stream, addr)) => {
                let shared = shared.clone();
                shared.runtime.clone().spawn(async move {
                    let timeout = shared.config.handshake_timeout;
                    match tokio::time::timeout(timeout, accept(&shared, stream)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(reason)) => {
                            tracing::warn!(peer_addr = %addr, %reason, "incoming connection refused")
                        }
                        Err(_) => tracing::warn!(peer_addr = %addr, "incoming handshake timed out"),
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
            }
        }
    }
}

/// The acceptor's half of the handshake; on success the connection runs.
async fn accept(shared: &Arc<Shared>, mut stream: TcpStream) -> Result<(), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut theirs = [0u8; GREETING_BYTES];
    stream
        .read_exact(&mut theirs)
        .await
        .map_err(|e| format!("reading greeting: {e}"))?;
    let greeting = Greeting::decode(&theirs).map_err(|e| e.to_string())?;
    let node = NodeId(greeting.node);
    if node == shared.config.node_id {
        return Err(HandshakeError::UnexpectedNode(greeting.node).to_string());
    }
    let ours = shared.greeting(false).encode();
    let proof = wire::acceptor_proof(&shared.config.secret, &theirs, &ours);
    let mut reply = [0u8; GREETING_BYTES + PROOF_BYTES];
    let (greeting_part, proof_part) = reply.split_at_mut(GREETING_BYTES);
    greeting_part.copy_from_slice(&ours);
    proof_part.copy_from_slice(&proof);
    stream
        .write_all(&reply)
        .await
        .map_err(|e| format!("writing challenge: {e}"))?;
    let mut their_proof = [0u8; PROOF_BYTES];
    stream
        .read_exact(&mut their_proof)
        .await
        .map_err(|e| format!("reading proof: {e}"))?;
    if wire::verify_connector_proof(&shared.config.secret, &theirs, &ours, &their_proof).is_err() {
        return Err(format!("node {node} failed authentication"));
    }
    if shared.shut_down.load(Ordering::Acquire) {
        return Err("endpoint shutting down".into());
    }
    let (verdict, conn) = if greeting.lane {
        shared.decide_lane(node, greeting.instance)
    } else {
        shared.decide_incoming(node, greeting.instance)
    };
    let written = stream.write_all(&[verdict.encode()]).await;
    let Some(conn) = conn else {
        tracing::debug!(%node, ?verdict, "incoming connection not used");
        return Ok(());
    };
    if let Err(error) = written {
        shared.retire(&conn, CloseReason::Io(error.to_string()));
        return Err(format!("writing verdict: {error}"));
    }
    shared.run(conn.clone(), stream);
    if !conn.lane {
        shared.enforce_connection_limit(&conn);
    }
    Ok(())
}

/// Closes lanes idle for longer than `Config::lane_idle_timeout`, until shutdown.
async fn sweep_lanes(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let idle_max = shared.config.lane_idle_timeout;
    let period = (idle_max / 2).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        shared.lanes.sweep(idle_max);
    }
}
