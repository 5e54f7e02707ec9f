//! The master side's environment ([`MasterIo`]): its clock, the send path of each backup
//! stream, and where the background tasks (a registration's answer) run.
//!
//! Job: keep the replicator's logic (zones, streams, acknowledgements, resends, copies)
//! free of the messaging layer and the wall clock, so that the same code runs in a node
//! ([`NetIo`]: the messaging layer's runtime and the monotonic clock) and on one thread
//! under a driver that owns time and the network ([`ManualIo`]: the cluster simulator of
//! the testing crate and tests, through [`Replicator::driven`](super::Replicator::driven)).
//!
//! Invariants an implementation keeps: `now` never goes back; the batches handed to one
//! stream's sender leave in the order they were handed over, and `in_flight` is decreased
//! once per batch after it was sent or given up on; a spawned task is run to its end
//! unless the implementation shuts down.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use myriad_net::NetHandle;
use myriad_types::NodeId;
use parking_lot::Mutex;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

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

/// One stream's send path under a driver: its batches and its in-flight count.
type ManualPath = (NodeId, UnboundedReceiver<Vec<Bytes>>, Arc<AtomicUsize>);

/// An environment a driver moves by hand, for a [`Replicator::driven`](super::Replicator::driven)
/// (the cluster simulator, tests): time stands still until the driver sets it, the
/// messages handed to the streams wait in [`ManualIo::sent`], and background tasks run
/// when the driver calls [`ManualIo::run_tasks`]. Nothing here blocks or spawns a thread.
pub struct ManualIo {
    /// The instant time 0 stands for.
    base: Instant,
    /// Time now since `base`, in µs.
    now_us: AtomicU64,
    stream_floor: u64,
    /// The open send paths, in the order they were opened.
    paths: Mutex<Vec<ManualPath>>,
    /// Background tasks not finished yet, oldest first.
    tasks: Mutex<Vec<IoTask>>,
}

impl std::fmt::Debug for ManualIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualIo")
            .field("now_us", &self.now_us.load(Ordering::Acquire))
            .field("paths", &self.paths.lock().len())
            .field("tasks", &self.tasks.lock().len())
            .finish()
    }
}

impl ManualIo {
    /// An environment at time 0 whose streams get IDs from `stream_id_floor` on (a
    /// restarted master's must be higher than its earlier incarnation's).
    pub fn new(stream_id_floor: u64) -> ManualIo {
        ManualIo {
            base: Instant::now(),
            now_us: AtomicU64::new(0),
            stream_floor: stream_id_floor,
            paths: Mutex::new(Vec::new()),
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// Sets the time to `since_start` after time 0 (never back: an earlier time is
    /// ignored).
    pub fn set_now(&self, since_start: Duration) {
        let us = u64::try_from(since_start.as_micros()).unwrap_or(u64::MAX);
        self.now_us.fetch_max(us, Ordering::AcqRel);
    }

    /// Moves the time on by `by`.
    pub fn advance(&self, by: Duration) {
        let us = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.now_us.fetch_add(us, Ordering::AcqRel);
    }

    /// The messages handed to every stream since the last call, per backup in the order
    /// they must leave; each batch counts as sent. Paths of dropped streams are closed.
    pub fn sent(&self) -> Vec<(NodeId, Bytes)> {
        let mut out = Vec::new();
        self.paths
            .lock()
            .retain_mut(|(backup, receiver, in_flight)| loop {
                match receiver.try_recv() {
                    Ok(batch) => {
                        out.extend(batch.into_iter().map(|message| (*backup, message)));
                        in_flight.fetch_sub(1, Ordering::AcqRel);
                    }
                    Err(TryRecvError::Empty) => break true,
                    Err(TryRecvError::Disconnected) => break false,
                }
            });
        out
    }

    /// Polls every background task once (tasks spawned meanwhile wait for the next
    /// call); whether one finished.
    pub fn run_tasks(&self) -> bool {
        let mut tasks = std::mem::take(&mut *self.tasks.lock());
        let before = tasks.len();
        let mut context = Context::from_waker(Waker::noop());
        tasks.retain_mut(|task| task.as_mut().poll(&mut context).is_pending());
        let finished = tasks.len() < before;
        let mut all = self.tasks.lock();
        let newer = std::mem::take(&mut *all);
        *all = tasks;
        all.extend(newer);
        finished
    }
}

impl MasterIo for ManualIo {
    fn now(&self) -> Instant {
        self.base + Duration::from_micros(self.now_us.load(Ordering::Acquire))
    }

    fn stream_id_floor(&self) -> u64 {
        self.stream_floor
    }

    fn open_stream(
        &self,
        backup: NodeId,
        in_flight: Arc<AtomicUsize>,
    ) -> UnboundedSender<Vec<Bytes>> {
        let (sender, receiver) = unbounded_channel();
        self.paths.lock().push((backup, receiver, in_flight));
        sender
    }

    fn spawn(&self, task: IoTask) {
        self.tasks.lock().push(task);
    }
}
