//! Endpoint configuration and the limits that bound every queue and buffer.
//!
//! Invariant: every per-connection memory use follows from these numbers (see
//! `docs/wire-format.md`, "Limits"): the send queue holds at most `send_queue_bytes_max`
//! plus one frame (responses may fill it to twice that); unprocessed received bytes stay
//! within `receive_unprocessed_bytes_max` plus [`READ_BUFFER_BYTES`] plus one frame; a
//! reassembly holds at most `message_bytes_max`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::tls::TlsConfig;
use crate::NodeId;

/// The most bytes read from a socket per read call, and the largest step a receive
/// buffer grows by.
pub const READ_BUFFER_BYTES: usize = 256 * 1024;

/// The receive buffer a connection starts with, and its first growth step. Each read that
/// fills all the space it was given doubles the step (up to [`READ_BUFFER_BYTES`]), so a
/// connection carrying a bulk stream soon reads 256 KiB at a time, while one carrying
/// single requests keeps reusing its first 16 KiB: a buffer is walked through before its
/// start is reused, so every byte of its capacity becomes resident memory (with 256 KiB
/// from the start that was about 1–2 MiB per peer of a loaded cluster). A connection whose
/// burst is over goes back to a fresh buffer of this size after a quiet second with
/// nothing buffered (the reader's `RECEIVE_BUFFER_IDLE`).
pub const READ_BUFFER_BYTES_MIN: usize = 16 * 1024;

/// Free space below which the receive buffer is grown (or reclaimed) before a read.
pub const READ_SPACE_BYTES_MIN: usize = 4096;

/// Initial size of a connection's aggregation buffer (grows as needed, bounded by the
/// send queue limit).
pub const AGGREGATION_BUFFER_BYTES: usize = 64 * 1024;

/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
pub const ACCEPT_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(10);

/// Stand-in for "no deadline" when a timeout overflows the clock (about a century).
pub const DEADLINE_FAR: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);

/// Payloads up to this size are copied into the aggregation buffer; larger ones are queued
/// by reference (no copy) and written with vectored I/O.
pub const COPY_PAYLOAD_BYTES_MAX: usize = 16 * 1024;

/// Outstanding requests per connection; more fail with `TooManyPendingRequests`.
pub const PENDING_REQUESTS_MAX: usize = 1 << 16;

/// Buffers handed to one vectored write call.
pub const IO_SLICES_MAX: usize = 64;

/// Capacity of the connection event channel; a subscriber that falls further behind
/// misses the oldest events (and is told how many).
pub const EVENTS_QUEUED_MAX: usize = 1024;

/// A direct request lane idle for longer than this is checked for a close by the peer
/// (one non-blocking peek) before it carries a request; busier lanes skip the check.
pub const LANE_CHECK_IDLE: Duration = Duration::from_millis(1);

/// Default of [`Config::pending_handshakes_max`].
pub const PENDING_HANDSHAKES_MAX: usize = 256;

/// Longest cluster secret accepted (bytes).
pub const SECRET_BYTES_MAX: usize = 1024;

/// Settings of one endpoint. `Config::new` gives defaults for everything but the node ID,
/// listen address and secret.
#[derive(Clone)]
pub struct Config {
    /// This node's ID.
    pub node_id: NodeId,
    /// Address to listen on (port 0 picks a free port; see `Endpoint::local_addr`).
    pub listen_addr: SocketAddr,
    /// Shared cluster secret for the HMAC handshake (at most [`SECRET_BYTES_MAX`] bytes).
    pub secret: Vec<u8>,
    /// Open connections kept at most; opening one more closes the least recently used.
    pub connections_max: usize,
    /// Time allowed for TCP connect plus handshake.
    pub connect_timeout: Duration,
    /// Time an incoming connection has to finish its handshake.
    pub handshake_timeout: Duration,
    /// Incoming connections still in their handshake (not authenticated yet) at most: a
    /// connection accepted beyond this is closed at once, so a flood of half-open or
    /// garbage connections costs bounded memory and tasks (at most this many, each for at
    /// most `handshake_timeout`). Established connections are not affected.
    pub pending_handshakes_max: usize,
    /// Longest a sender waits for space in a full send queue before `SendTimeout`.
    pub send_timeout: Duration,
    /// Bytes queued for sending per connection before senders wait (back-pressure).
    pub send_queue_bytes_max: usize,
    /// Received bytes per connection handed to handlers and not yet processed; above this
    /// the connection stops reading, and TCP back-pressures the sender.
    pub receive_unprocessed_bytes_max: usize,
    /// Largest message (after reassembly) sent or accepted.
    pub message_bytes_max: usize,
    /// Threads running message handlers.
    pub handler_threads: usize,
    /// Worker threads of the endpoint's own tokio runtime (`Endpoint::start`). One thread
    /// drives all sockets (as DXNet's selector thread does); on 2 cores a second one costs
    /// more in contention than it gains (see `docs/benchmarks.md`). Raise it for many busy
    /// connections on many cores.
    pub io_threads: usize,
    /// Direct request lanes kept at most per remote node, in each direction (see
    /// `NetHandle::request_blocking`): the calling side opens at most this many, the
    /// accepting side refuses more (the caller then uses the node's connection). 0 turns
    /// lanes off: blocking requests then go through the connection and the I/O thread.
    pub lanes_per_node_max: usize,
    /// An idle lane is closed after this long unused.
    pub lane_idle_timeout: Duration,
    /// TLS for every connection (`None`: plain TCP after the HMAC handshake). With TLS,
    /// connections are mutually authenticated by the cluster CA and encrypted; the HMAC
    /// handshake still runs inside them, and direct request lanes are off (blocking
    /// requests go through the connection).
    pub tls: Option<TlsConfig>,
    /// How long a blocking request on a lane polls for its response before the thread
    /// blocks, when it is the only thread of the process waiting on a lane (see
    /// `crate::lane`, "Spinning"). Zero (the default) never spins; clients that wait for
    /// one response at a time set it (`myriad-membership`'s `JoinConfig::lane_spin`).
    pub lane_spin: Duration,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("node_id", &self.node_id)
            .field("listen_addr", &self.listen_addr)
            .field("secret", &"<redacted>")
            .field("connections_max", &self.connections_max)
            .field("connect_timeout", &self.connect_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("pending_handshakes_max", &self.pending_handshakes_max)
            .field("send_timeout", &self.send_timeout)
            .field("send_queue_bytes_max", &self.send_queue_bytes_max)
            .field(
                "receive_unprocessed_bytes_max",
                &self.receive_unprocessed_bytes_max,
            )
            .field("message_bytes_max", &self.message_bytes_max)
            .field("handler_threads", &self.handler_threads)
            .field("io_threads", &self.io_threads)
            .field("lanes_per_node_max", &self.lanes_per_node_max)
            .field("lane_idle_timeout", &self.lane_idle_timeout)
            .field("tls", &self.tls.is_some())
            .field("lane_spin", &self.lane_spin)
            .finish()
    }
}

impl Config {
    /// Defaults: 100 connections, 2 s connect and handshake timeouts, at most
    /// [`PENDING_HANDSHAKES_MAX`] handshakes in progress, 10 s send timeout,
    /// 4 MiB send queue, 4 MiB unprocessed receive bytes, 256 MiB messages, 2 handler
    /// threads, 1 I/O thread, 64 lanes per node closed after 30 s idle, no spinning.
    pub fn new(node_id: NodeId, listen_addr: SocketAddr, secret: impl Into<Vec<u8>>) -> Self {
        Self {
            node_id,
            listen_addr,
            secret: secret.into(),
            connections_max: 100,
            connect_timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(2),
            pending_handshakes_max: PENDING_HANDSHAKES_MAX,
            send_timeout: Duration::from_secs(10),
            send_queue_bytes_max: 4 << 20,
            receive_unprocessed_bytes_max: 4 << 20,
            message_bytes_max: 256 << 20,
            handler_threads: 2,
            io_threads: 1,
            lanes_per_node_max: 64,
            lane_idle_timeout: Duration::from_secs(30),
            tls: None,
            lane_spin: Duration::ZERO,
        }
    }
}
