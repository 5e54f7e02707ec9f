//! Connection events: [`ConnectionLost`] and the [`ConnectionEvents`] subscription that
//! failure detection reads.
//!
//! Particular to this module: the only one-to-many channel of the endpoint. Events go
//! through a bounded broadcast channel (`EVENTS_QUEUED_MAX`); a subscriber that falls
//! behind skips the oldest events (logged), so a slow subscriber never holds up the
//! connection that closed. Lanes raise no events (`table.rs`, `Shared::retire`).

use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::broadcast;

use super::ensure_blocking_allowed;
use crate::conn::CloseReason;
use crate::error::NetError;
use crate::NodeId;

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
    pub(super) receiver: broadcast::Receiver<ConnectionLost>,
    pub(super) runtime: Handle,
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
