//! Myriad's messaging layer: node-addressed one-way messages and request/response over
//! TCP, with aggregation, per-connection ordering, flow control, large-message streaming
//! and HMAC authentication. The role of DXNet in DXRAM; it knows nothing of chunks or logs.
//!
//! # Using it
//! ```no_run
//! use bytes::Bytes;
//! use myriad_net::{Config, Endpoint, Handlers, Incoming, MessageType, NodeId};
//! use std::time::Duration;
//!
//! const ECHO: MessageType = MessageType::unordered(1, 0);
//! let mut handlers = Handlers::new();
//! handlers.register(ECHO, |request: Incoming| {
//!     let payload = request.payload.clone();
//!     let _ = request.respond(payload);
//! })?;
//! let server = Endpoint::start(
//!     Config::new(NodeId(1), "127.0.0.1:0".parse().unwrap(), "secret"),
//!     handlers,
//! )?;
//! let client = Endpoint::start(
//!     Config::new(NodeId(2), "127.0.0.1:0".parse().unwrap(), "secret"),
//!     Handlers::new(),
//! )?;
//! client.set_address(NodeId(1), server.local_addr());
//! let answer = client.request_blocking(NodeId(1), ECHO, Bytes::from_static(b"hi"), Duration::from_secs(1))?;
//! assert_eq!(&answer[..], b"hi");
//! # Ok::<(), myriad_net::NetError>(())
//! ```
//!
//! # Structure
//! - [`wire`]: frame header, frame decoder, reassembly, handshake (the byte format,
//!   documented in `docs/wire-format.md`).
//! - [`tls`]: TLS for connections ([`Config::tls`]): [`TlsConfig`] from a CA directory,
//!   the CA and certificates of `myriad cert`. `stream`: the socket a connection's reader
//!   and writer use, plain or carrying a rustls session (lanes stay plain: they are off
//!   under TLS).
//! - [`secret`]: the cluster secret's file (generated, written `0600`, read back; the
//!   `MYRIAD_SECRET_FILE` variable). An endpoint refuses to start with an empty secret.
//! - Payloads are encoded field by field with `myriad_types::codec` (varints,
//!   little-endian integers, length-prefixed slices shared with the received buffer).
//! - `fault`: the per-link network filters for tests ([`Fault`]: drop, partition, delay,
//!   one direction or both) and the delay lines that keep a delayed stream in order.
//! - `conn`: one connection's send queue, writer task, outstanding requests and
//!   receive-side counters; `reader`: its reader task (frames to responses, inline
//!   handlers and pool batches; flow control).
//! - `handler`: message types, what handlers receive, and running one; `pool`: handler
//!   threads.
//! - `lane`: direct request lanes, the fast path of `NetHandle::request_blocking` (the
//!   calling thread writes the request and reads the response on a pooled connection of
//!   its own, no I/O-thread hand-off; see `docs/wire-format.md`, "Lanes").
//! - `endpoint`: listener and handshake, connection table, the public [`NetHandle`]
//!   and [`Endpoint`], request tracking and events (its submodules and their order are
//!   listed in its module docs).
//!
//! ## Module dependency order
//! Each module uses only modules listed before it (no cycles; the crate root's re-exports,
//! such as [`NodeId`], are used everywhere; checked on the sources by
//! `tests/module_order.rs`, which also checks the endpoint submodules' order):
//!
//! 0. `tls` (no other module: TLS configuration and `myriad cert`'s files);
//! 1. `error`, `config` (tls), `fault`;
//! 2. `wire` (error), `secret`, `stream` (tls: a socket, plain or TLS);
//! 3. `conn` (config, error, fault, wire) and `lane` (error, wire): neither names a
//!    handler;
//! 4. `handler` (conn: a [`Responder`] answers through its connection);
//! 5. `pool` (conn, handler: it runs deliveries);
//! 6. `reader` (conn, handler, pool, fault): it reaches its endpoint only through the
//!    narrow `reader::ReaderContext` trait;
//! 7. `endpoint` (all of the above).
//!
//! ## Where the crate reaches the world
//! For a simulator that would one day substitute them (nothing is abstracted yet):
//! - **Clock.** Deadlines and timeouts that decide protocol behaviour read tokio's clock
//!   (`tokio::time::Instant`, `sleep`, `timeout`): the request deadline
//!   (`endpoint::pending`, `endpoint::deadline_after`), the connect and handshake
//!   timeouts (`endpoint::table`, `endpoint::accept`), the send timeout
//!   (`Conn::enqueue_wait`), the lane sweeper, and the delay lines (`conn::write_delayed`,
//!   `reader`). `std::time::Instant` is read where no runtime is involved: the lanes' blocking deadlines and idle checks (`lane`,
//!   `endpoint::lanes`, `endpoint::dial::dial_lane`), the direct-write idle check
//!   (`conn::direct_write`), and the millisecond clock of least-recently-used eviction
//!   (`Shared::now_ms`).
//! - **Sockets.** tokio `TcpListener`/`TcpStream` for connections (`endpoint::setup`,
//!   `endpoint::accept`, `endpoint::dial`; `conn` and `reader` through `stream::NetStream`); blocking
//!   `std::net::TcpStream` for lanes (`lane`, `endpoint::dial::dial_lane`). The network
//!   filters (`fault`) sit right above the sockets, on the byte streams.
//! - **Threads and tasks.** The tokio runtime (owned or passed in, `endpoint::setup`) runs
//!   the accept loop, handshakes, reader and writer tasks and the lane sweeper; the
//!   handler pool is plain `std::thread`s (`pool`); blocking calls use
//!   `Handle::block_on`.
//! - **Randomness.** `rand::rngs::OsRng` for the instance ID and handshake nonces
//!   (`endpoint::setup`, `endpoint::shared`).
//!
//! # Threads
//! An endpoint runs its I/O on a tokio multi-thread runtime (its own, or one passed in)
//! and its handlers on `Config::handler_threads` plain threads, which may block. Handlers
//! registered with `Handlers::register_inline` run on the I/O thread instead: the lowest
//! latency, for short handlers that never block. Nothing polls: an idle endpoint sleeps in
//! epoll and on its handler queues.
//!
//! # Guarantees
//! Delivery is at most once (frames queued on a connection that closes are lost; its
//! outstanding requests fail with `ConnectionLost` at once). Messages of an ordered type
//! reach their handler one at a time in send order per connection. Memory per connection
//! is bounded by the limits in [`Config`] (see `docs/wire-format.md`, "Limits").
//!
//! Architecture invariant: this crate depends on no other Myriad crate but the ground
//! floor, `myriad-types` (node IDs); it never panics or allocates on the say-so of a peer's
//! bytes (every length is checked first); bad input closes only the connection that sent it.
//! Invariants whose violation would put a stream out of step (a frame's length field and
//! its payload, the fragments of a message, the bytes a queue or delay line holds) are
//! asserted: with `assert!` off the per-frame path, with `debug_assert!` on it.

#![forbid(unsafe_code)]

mod config;
mod conn;
mod endpoint;
mod error;
mod fault;
mod handler;
mod lane;
mod pool;
mod reader;
pub mod secret;
mod stream;
pub mod tls;
pub mod wire;

pub use bytes::Bytes;
pub use config::{
    Config, ACCEPT_RETRY_DELAY, AGGREGATION_BUFFER_BYTES, COPY_PAYLOAD_BYTES_MAX, DEADLINE_FAR,
    EVENTS_QUEUED_MAX, IO_SLICES_MAX, LANE_CHECK_IDLE, PENDING_HANDSHAKES_MAX,
    PENDING_REQUESTS_MAX, READ_BUFFER_BYTES, READ_BUFFER_BYTES_MIN, READ_SPACE_BYTES_MIN,
    SECRET_BYTES_MAX,
};
pub use conn::{CloseReason, ConnectionStats};
pub use endpoint::{ConnectionEvents, ConnectionLost, Endpoint, NetHandle, PendingResponse};
pub use error::{FrameError, HandshakeError, NetError};
pub use fault::Fault;
pub use handler::{Handler, Handlers, Incoming, MessageType, Responder, SenderCheck};
pub use lane::LaneStats;
pub use tls::{CertRole, TlsConfig, TlsError};

/// A node's 16-bit ID: the one [`myriad_types::NodeId`] of every layer, re-exported for
/// users of this crate's API.
pub use myriad_types::NodeId;
