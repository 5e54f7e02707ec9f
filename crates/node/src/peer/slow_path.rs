//! The peer's slow path: handler threads for chunk requests that may wait.
//!
//! # Job
//! The CHUNK handler ([`super::dispatch`]) runs inline on the messaging layer's I/O
//! thread and serves there only what cannot wait; requests that may wait (chunk locks,
//! large inserts, writes that wait for backups without a replicator's blocking threads)
//! are queued here and served by a fixed pool of threads.
//!
//! # Invariants
//! - The queue is bounded ([`SLOW_PATH_QUEUE_MAX`]): a full queue answers at once
//!   "peer busy", never blocks the I/O thread.
//! - Every request taken from the queue is answered.
//!
//! # Who calls it
//! [`super::dispatch::PeerDispatch::register`] starts one per endpoint; the threads end
//! when the CHUNK handler (the only sender) is dropped with the endpoint.

use std::sync::Arc;

use bytes::Bytes;
use myriad_net::Responder;
use myriad_proto::chunk::{ChunkReply, ItemError};
use myriad_types::NodeId;

use super::service::ChunkService;
use crate::ops::chunk_ops::Timer;

/// Chunk requests waiting for a handler thread, at most (more are refused as "busy").
pub const SLOW_PATH_QUEUE_MAX: usize = 16_384;

/// A queued request: the service, the requester, the request, where to reply, and when
/// the request reached the dispatch (for its latency).
type Job = (Arc<ChunkService>, NodeId, Bytes, Responder, Timer);

/// Handler threads for chunk requests that may wait (locks, large inserts, writes that
/// wait for backups), fed by the inline handler.
pub(crate) struct SlowPath {
    sender: crossbeam_channel::Sender<Job>,
}

impl SlowPath {
    pub(crate) fn start(threads: usize) -> SlowPath {
        let (sender, receiver) = crossbeam_channel::bounded::<Job>(SLOW_PATH_QUEUE_MAX);
        for index in 0..threads {
            let receiver = receiver.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("chunk-slow-{index}"))
                .spawn(move || {
                    // Ends when the handler (the only sender) is dropped with the endpoint.
                    for (service, from, payload, responder, start) in receiver {
                        let reply = service.serve(from, payload.clone());
                        service.ops().record(&payload, &reply, start);
                        let _ = responder.respond(reply);
                    }
                });
            if let Err(error) = spawned {
                tracing::error!(%error, "could not start a chunk handler thread");
            }
        }
        SlowPath { sender }
    }

    pub(crate) fn submit(
        &self,
        service: Arc<ChunkService>,
        from: NodeId,
        payload: Bytes,
        responder: Responder,
        start: Timer,
    ) {
        if let Err(error) = self
            .sender
            .try_send((service, from, payload, responder, start))
        {
            let (service, _, payload, responder, start) = error.into_inner();
            let busy = ChunkReply::Failed(ItemError::Internal(
                "peer busy: too many chunk requests waiting".to_owned(),
            ))
            .encode();
            service.ops().record(&payload, &busy, start);
            let _ = responder.respond(busy);
        }
    }
}
