//! The connection table: one slot per node (a connection attempt or an open connection),
//! dialing on first use, installing dialed and accepted connections, the duplicate
//! tie-break, least-recently-used eviction, and retiring closed connections.
//!
//! Particular to this module: every change of the table happens here, and every close of
//! a node's connection goes through `Shared::retire`, which removes it from the table (or
//! a lane from the lane list) and raises the one `ConnectionLost` event.
//!
//! Invariants: the table lock is never held across an await; a slot `Up` holds a
//! connection whose reader and writer run or are about to (the acceptor inserts before it
//! writes the verdict); a closed connection is removed by whoever closed it; two nodes
//! dialing each other end with one shared connection (lower node ID's dial wins).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use super::deadline_after;

/// The first pause before a dial answered `Duplicate` is repeated.
const DUPLICATE_PAUSE_FIRST: std::time::Duration = std::time::Duration::from_millis(5);
/// The longest pause between dials answered `Duplicate`.
const DUPLICATE_PAUSE_MAX: std::time::Duration = std::time::Duration::from_millis(200);
use super::dial::dial;
use super::events::ConnectionLost;
use super::shared::{Attempt, Shared, Slot};
use crate::conn::{writer_loop, CloseReason, Conn};
use crate::error::NetError;
use crate::reader::reader_loop;
use crate::stream::NetStream;
use crate::wire::Verdict;
use crate::NodeId;
use myriad_types::limits::PROVISIONAL_ID_MIN;

impl Shared {
    /// The open connection to `node`, connecting if needed (bounded by the connect timeout).
    pub(super) async fn connection(self: &Arc<Self>, node: NodeId) -> Result<Arc<Conn>, NetError> {
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

    /// Whether `attempt` is still the table's slot for `node`.
    fn still_connecting(&self, node: NodeId, attempt: &Arc<Attempt>) -> bool {
        matches!(
            self.table.read().get(&node),
            Some(Slot::Connecting(current)) if Arc::ptr_eq(current, attempt)
        )
    }

    /// Ends a connection attempt: marks it failed and removes it from the table.
    pub(super) fn fail_attempt(&self, node: NodeId, attempt: &Arc<Attempt>, error: NetError) {
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
    pub(super) fn retire(&self, conn: &Arc<Conn>, reason: CloseReason) {
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

    /// Starts the reader and writer tasks of a connection now in the table.
    pub(super) fn run(self: &Arc<Self>, conn: Arc<Conn>, stream: NetStream) {
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
    pub(super) fn enforce_connection_limit(&self, keep: &Arc<Conn>) {
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
    pub(super) fn install_outgoing(&self, node: NodeId, conn: &Arc<Conn>) -> bool {
        // A lane in the table would carry one-way messages, which close a lane.
        assert!(
            conn.initiated_locally && !conn.lane && conn.peer == node,
            "only this node's own dial to `node` goes into the table as its connection"
        );
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
    pub(super) fn decide_incoming(
        &self,
        node: NodeId,
        peer_instance: u64,
    ) -> (Verdict, Option<Arc<Conn>>) {
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
                    // Two joining nodes that drew the same provisional ID: the later one
                    // is refused (it retries under another ID), so the first keeps the
                    // connection its join answer comes back on. Replacing it lost that
                    // answer, and the first node's retry joined a second time: a ghost
                    // node, declared failed for its silence, that failed writes waiting
                    // for it as a backup.
                    if node.0 >= PROVISIONAL_ID_MIN {
                        return (Verdict::Refused, None);
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
    pub(super) fn decide_lane(
        &self,
        node: NodeId,
        peer_instance: u64,
    ) -> (Verdict, Option<Arc<Conn>>) {
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
}

/// Dials `node` at `addr`, authenticates, and installs the connection.
///
/// A `Duplicate` answer means the peer holds a live connection from this node's instance
/// or dials this node itself. Either the peer's own connection shows up here soon, or the
/// peer's connection is one this node has just closed and the peer has not yet read the
/// close: so the dial is repeated, after a pause that doubles from 5 ms up to 200 ms, until
/// a connection is in the table or the connect timeout has passed.
async fn connect(shared: Arc<Shared>, node: NodeId, addr: SocketAddr, attempt: Arc<Attempt>) {
    let timeout = shared.config.connect_timeout;
    let deadline = deadline_after(timeout);
    let mut pause = DUPLICATE_PAUSE_FIRST;
    loop {
        let outcome = tokio::time::timeout_at(deadline, dial(&shared, node, addr)).await;
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
                return;
            }
            Verdict::Duplicate => {
                drop(stream);
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                tokio::time::sleep(pause.min(left)).await;
                pause = (pause * 2).min(DUPLICATE_PAUSE_MAX);
                if !shared.still_connecting(node, &attempt) {
                    // The peer's connection arrived (or the attempt was given up).
                    return;
                }
                if tokio::time::Instant::now() >= deadline {
                    return shared.fail_attempt(node, &attempt, NetError::ConnectTimeout(node));
                }
            }
            Verdict::Refused => return shared.fail_attempt(node, &attempt, NetError::Fenced(node)),
        }
    }
}
