//! The master side's environment ([`MasterIo`]): its clock, the send path of each backup
//! stream, and where the background tasks (a registration's answer) run.
//!
//! Job: keep the replicator's logic (zones, streams, acknowledgements, resends, copies)
//! free of the messaging layer and the wall clock, so that the same code runs in a node
//! ([`NetIo`]: the messaging layer's runtime and the monotonic clock) and on one thread
//! under a driver that owns time and the network (the cluster simulator of the testing
//! crate, through [`Replicator::driven`](super::Replicator::driven)).
//!
//! Invariants an implementation keeps: `now` never goes back; the batches handed to one
//! stream's sender leave in the order they were handed over, and `in_flight` is decreased
//! once per batch after it was sent or given up on; a spawned task is run to its end
//! unless the implementation shuts down.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use myriad_net::NetHandle;
use myriad_types::NodeId;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::wire;

/// A background task of the replicator.
pub type IoTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the master side of replication needs from its environment. See the module docs.
pub trait MasterIo: Send + Sync + 'static {
    /// The current time: deadlines, progress and resend timers.
    fn now(&self) -> Instant;

    /// A lower bound for the ID of a new stream: larger than any stream ID an earlier
    /// incarnation of this master used, so that a backup takes a restarted master's stream
    /// as the newer one. (A node uses the wall clock in microseconds.)
    fn stream_id_floor(&self) -> u64;

    /// Opens the send path of a new stream to `backup`: the batches of encoded replication
    /// messages given to the returned sender go to `backup` in order, and `in_flight` is
    /// decreased by one after each batch is sent or given up on. The path closes when
    /// the sender is dropped.
    fn open_stream(
        &self,
        backup: NodeId,
        in_flight: Arc<AtomicUsize>,
    ) -> UnboundedSender<Vec<Bytes>>;

    /// Runs `task` in the background.
    fn spawn(&self, task: IoTask);
}

/// A node's environment: the messaging layer (one send task per stream on its runtime) and
/// the monotonic clock.
#[derive(Debug, Clone)]
pub struct NetIo {
    net: NetHandle,
}

impl NetIo {
    /// The environment over `net`.
    pub fn new(net: NetHandle) -> NetIo {
        NetIo { net }
    }
}

impl MasterIo for NetIo {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn stream_id_floor(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    }

    fn open_stream(
        &self,
        backup: NodeId,
        in_flight: Arc<AtomicUsize>,
    ) -> UnboundedSender<Vec<Bytes>> {
        let (courier, mut batches) = unbounded_channel::<Vec<Bytes>>();
        let net = self.net.clone();
        self.net.runtime().spawn(async move {
            while let Some(batch) = batches.recv().await {
                for message in batch {
                    if let Err(e) = net.send(backup, wire::REPLICATE, message).await {
                        // The window keeps the rest; a resend follows.
                        tracing::debug!(%backup, error = %e, "replication send failed");
                        break;
                    }
                }
                in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        });
        courier
    }

    fn spawn(&self, task: IoTask) {
        self.net.runtime().spawn(task);
    }
}
