//! The handler pool: plain threads that run message handlers.
//!
//! Each thread has a private lane and shares one common queue with the others. Readers
//! send a connection's ordered batches always to the same lane (chosen by the connection's
//! serial number), so they are handled one at a time in arrival order; unordered batches
//! go to the common queue, which every thread takes from.
//!
//! Invariants: the queues are unbounded channels, but what they hold is bounded by flow
//! control (each connection's unprocessed bytes, released here after each batch). A
//! thread exits when the pool's senders are all dropped (endpoint shutdown).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{select, Receiver, Sender};

use crate::conn::{Conn, Direct};
use crate::fault::DROP_INCOMING;
use crate::handler::Delivery;

/// Messages of one connection from one read, for one handler thread.
pub(crate) struct Batch {
    pub conn: Arc<Conn>,
    pub deliveries: Vec<Delivery>,
    pub bytes: usize,
}

/// The senders readers use to hand batches to the pool.
#[derive(Clone)]
pub(crate) struct PoolSenders {
    shared: Sender<Batch>,
    lanes: Vec<Sender<Batch>>,
}

impl PoolSenders {
    /// Hands a batch to a handler thread. A send fails only after shutdown; the batch is
    /// then dropped with its bytes released.
    pub fn dispatch(&self, batch: Batch, ordered: bool) {
        let result = if ordered {
            let lane_count = self.lanes.len().max(1) as u64;
            let index = (batch.conn.serial % lane_count) as usize;
            match self.lanes.get(index) {
                Some(lane) => lane.send(batch),
                None => self.shared.send(batch),
            }
        } else {
            self.shared.send(batch)
        };
        if let Err(crossbeam_channel::SendError(batch)) = result {
            batch.conn.release_unprocessed(batch.bytes);
        }
    }
}

/// Starts `thread_count` handler threads (at least one).
pub(crate) fn start(
    thread_count: usize,
    name_prefix: &str,
) -> std::io::Result<(PoolSenders, Vec<JoinHandle<()>>)> {
    let (shared_tx, shared_rx) = crossbeam_channel::unbounded();
    let mut lanes = Vec::new();
    let mut threads = Vec::new();
    for index in 0..thread_count.max(1) {
        let (lane_tx, lane_rx) = crossbeam_channel::unbounded();
        lanes.push(lane_tx);
        let shared_rx = shared_rx.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{name_prefix}-{index}"))
            .spawn(move || handler_thread(lane_rx, shared_rx))?;
        threads.push(thread);
    }
    Ok((
        PoolSenders {
            shared: shared_tx,
            lanes,
        },
        threads,
    ))
}

fn handler_thread(lane: Receiver<Batch>, shared: Receiver<Batch>) {
    loop {
        let batch = select! {
            recv(lane) -> batch => batch,
            recv(shared) -> batch => batch,
        };
        let Ok(batch) = batch else {
            return;
        };
        let Batch {
            conn,
            deliveries,
            bytes,
        } = batch;
        let count = deliveries.len();
        for (index, delivery) in deliveries.into_iter().enumerate() {
            // Fencing and the incoming fault switch also stop messages already queued.
            if conn.fenced.load(Ordering::Relaxed) || conn.filter.bits() & DROP_INCOMING != 0 {
                continue;
            }
            // A response may go straight to the socket when nothing else of this
            // connection waits to be handled (its bytes are this batch's only).
            let direct = if index + 1 == count && conn.unprocessed() <= bytes {
                Direct::Yes
            } else {
                Direct::Never
            };
            crate::handler::run(&conn, delivery, direct);
        }
        conn.release_unprocessed(bytes);
    }
}
