//! Accepting: the listener loop, the acceptor's half of the handshake, and the sweeper of
//! idle lanes.
//!
//! Particular to this module: nothing is registered for an incoming socket before the
//! connector's proof has been checked; then `Shared::decide_incoming` or
//! `Shared::decide_lane` (`table.rs`) decides the verdict, and an accepted connection is in
//! the table before its verdict is written. Every handshake is bounded by
//! `Config::handshake_timeout`, and at most `Config::pending_handshakes_max` run at once:
//! a connection accepted beyond that is closed unread (counted, logged at most once per
//! [`REFUSAL_LOG_INTERVAL`]), so unauthenticated load costs bounded tasks and memory.
//! Failed handshakes are logged at `debug` only, with a `warn` summary at most once per
//! interval: a flood of garbage cannot flood the log.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::shared::{role_refusal, Shared};
use crate::config::ACCEPT_RETRY_DELAY;
use crate::conn::CloseReason;
use crate::error::HandshakeError;
use crate::stream::NetStream;
use crate::wire::{self, Greeting, GREETING_BYTES, PROOF_BYTES};
use crate::NodeId;

/// Shortest interval between two warnings about refused or failed handshakes.
pub(super) const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Counts one pending handshake while alive.
struct PendingHandshake(Arc<Shared>);

impl Drop for PendingHandshake {
    fn drop(&mut self) {
        self.0.pending_handshakes.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a rate-limited warning is due (at most one per [`REFUSAL_LOG_INTERVAL`]).
fn warning_due(last: &parking_lot::Mutex<Option<std::time::Instant>>) -> bool {
    let mut last = last.lock();
    let due = last.is_none_or(|when| when.elapsed() >= REFUSAL_LOG_INTERVAL);
    if due {
        *last = Some(std::time::Instant::now());
    }
    due
}

pub(super) async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let last_warning = Arc::new(parking_lot::Mutex::new(None));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        match accepted {
            Ok((stream, addr)) => {
                let pending = shared.pending_handshakes.fetch_add(1, Ordering::AcqRel);
                let guard = PendingHandshake(shared.clone());
                if pending >= shared.config.pending_handshakes_max {
                    drop(guard);
                    drop(stream);
                    let refused = shared.handshakes_refused.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::debug!(peer_addr = %addr, "incoming connection closed: too many pending handshakes");
                    if warning_due(&last_warning) {
                        tracing::warn!(
                            refused,
                            pending_max = shared.config.pending_handshakes_max,
                            "incoming connections closed unread: too many pending handshakes"
                        );
                    }
                    continue;
                }
                let shared = shared.clone();
                let last_warning = last_warning.clone();
                shared.runtime.clone().spawn(async move {
                    let _guard = guard;
                    let timeout = shared.config.handshake_timeout;
                    let reason = match tokio::time::timeout(timeout, accept(&shared, stream)).await {
                        Ok(Ok(())) => return,
                        Ok(Err(reason)) => reason,
                        Err(_) => "handshake timed out".to_owned(),
                    };
                    let failed = shared.handshakes_failed.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::debug!(peer_addr = %addr, %reason, "incoming connection refused");
                    if warning_due(&last_warning) {
                        tracing::warn!(peer_addr = %addr, %reason, failed, "incoming connection refused (failed handshakes so far: {failed})");
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
async fn accept(shared: &Arc<Shared>, tcp: TcpStream) -> Result<(), String> {
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let stream = match &shared.config.tls {
        None => NetStream::plain(tcp),
        Some(tls) => NetStream::tls_accept(tcp, tls)
            .await
            .map_err(|e| format!("TLS: {e}"))?,
    };
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
    if !shared.role_allowed(node, stream.peer_role()) {
        // Closed without a verdict, as after a failed proof.
        return Err(role_refusal(node, stream.peer_role()));
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
pub(super) async fn sweep_lanes(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
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
