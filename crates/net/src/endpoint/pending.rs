//! Request/response tracking on the caller's side: [`PendingResponse`], the future (or
//! blocking wait) that ends with the response, the deadline, a lost connection or
//! shutdown.
//!
//! Particular to this module: the deadline is enforced here, not by the connection; a
//! response that arrives after it, or after the `PendingResponse` was dropped, finds its
//! request forgotten (`Conn::forget_request`) and is dropped by the reader.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::ensure_blocking_allowed;
use super::shared::Shared;
use crate::conn::Conn;
use crate::error::NetError;
use crate::NodeId;

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
    pub(super) fn new(
        shared: &Arc<Shared>,
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
            runtime: shared.runtime.clone(),
            shared: shared.clone(),
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
