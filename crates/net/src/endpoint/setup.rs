//! Endpoint setup and teardown: binding, the runtime, the handler pool, the [`Endpoint`]
//! value and its `Drop` (shutdown).
//!
//! Particular to this module: the only place that spawns the endpoint's long-lived tasks
//! (accept loop, lane sweeper) and threads (handler pool, an owned runtime), and the only
//! place that stops them. Shutdown closes every connection and lane, wakes waiters, and
//! drops the pool's senders so handler threads exit after their current batch.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use rand::RngCore;
use tokio::net::TcpListener;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{broadcast, watch, Notify};

use super::accept::{accept_loop, sweep_lanes};
use super::ensure_blocking_allowed;
use super::handle::NetHandle;
use super::shared::{Shared, Slot};
use crate::config::{Config, EVENTS_QUEUED_MAX, SECRET_BYTES_MAX};
use crate::conn::Conn;
use crate::error::NetError;
use crate::handler::Handlers;
use crate::lane::OutgoingLanes;

/// A running endpoint. Dropping it shuts it down: connections close, handler threads
/// finish their current batch and exit, and an owned runtime stops. [`NetHandle`]s
/// cloned from it then fail with [`NetError::Shutdown`].
pub struct Endpoint {
    handle: NetHandle,
    runtime: Option<Runtime>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("node_id", &self.handle.node_id())
            .field("local_addr", &self.handle.local_addr())
            .finish()
    }
}

impl std::ops::Deref for Endpoint {
    type Target = NetHandle;

    fn deref(&self) -> &NetHandle {
        &self.handle
    }
}

/// Binds `config.listen_addr`, refusing an empty or over-long secret first (before any
/// port is taken).
fn bind(config: &Config) -> Result<std::net::TcpListener, NetError> {
    check_secret(config)?;
    std::net::TcpListener::bind(config.listen_addr)
        .map_err(|error| NetError::Startup(Arc::new(error)))
}

fn check_secret(config: &Config) -> Result<(), NetError> {
    if config.secret.is_empty() {
        // No default secret: an empty one would let anyone who knows that in.
        return Err(NetError::Startup(Arc::new(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "no cluster secret configured (an empty secret is refused)",
        ))));
    }
    if config.secret.len() > SECRET_BYTES_MAX {
        return Err(NetError::Startup(Arc::new(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "cluster secret longer than SECRET_BYTES_MAX",
        ))));
    }
    Ok(())
}

impl Endpoint {
    /// Starts an endpoint with its own multi-thread tokio runtime (`config.io_threads`
    /// workers). Call it outside any async runtime.
    pub fn start(config: Config, handlers: Handlers) -> Result<Self, NetError> {
        let listener = bind(&config)?;
        Self::start_with_listener(config, handlers, listener)
    }

    /// [`Endpoint::start`] with a listener the caller bound already (see
    /// [`Endpoint::start_on_listener`]).
    pub fn start_with_listener(
        config: Config,
        handlers: Handlers,
        listener: std::net::TcpListener,
    ) -> Result<Self, NetError> {
        ensure_blocking_allowed()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.io_threads.max(1))
            .thread_name(format!("myriad-net-io-{}", config.node_id))
            .enable_all()
            .build()
            .map_err(|error| NetError::Startup(Arc::new(error)))?;
        let mut endpoint =
            Self::start_on_listener(runtime.handle().clone(), config, handlers, listener)?;
        endpoint.runtime = Some(runtime);
        Ok(endpoint)
    }

    /// Starts an endpoint whose tasks run on an existing tokio runtime (which must have
    /// I/O and time enabled). Callable from anywhere, also from inside that runtime.
    pub fn start_on(runtime: Handle, config: Config, handlers: Handlers) -> Result<Self, NetError> {
        let listener = bind(&config)?;
        Self::start_on_listener(runtime, config, handlers, listener)
    }

    /// [`Endpoint::start_on`] with a listener the caller bound already (so that it knows
    /// the OS-chosen port before it knows its node ID); `config.listen_addr` is ignored.
    pub fn start_on_listener(
        runtime: Handle,
        config: Config,
        handlers: Handlers,
        listener: std::net::TcpListener,
    ) -> Result<Self, NetError> {
        check_secret(&config)?;
        let startup = |error: std::io::Error| NetError::Startup(Arc::new(error));
        listener.set_nonblocking(true).map_err(startup)?;
        let local_addr = listener.local_addr().map_err(startup)?;
        let listener = {
            let _guard = runtime.enter();
            TcpListener::from_std(listener).map_err(startup)?
        };
        let (pool, _threads) = crate::pool::start(
            config.handler_threads,
            &format!("myriad-net-handler-{}", config.node_id),
        )
        .map_err(startup)?;
        let (events, _) = broadcast::channel(EVENTS_QUEUED_MAX);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            instance: rand::rngs::OsRng.next_u64(),
            runtime: runtime.clone(),
            local_addr,
            started: std::time::Instant::now(),
            addresses: RwLock::new(HashMap::new()),
            table: RwLock::new(HashMap::new()),
            table_changed: Notify::new(),
            handlers: RwLock::new(Arc::new(handlers.map)),
            pool: RwLock::new(Some(pool)),
            events,
            fenced: RwLock::new(HashSet::new()),
            faults: RwLock::new(HashMap::new()),
            faults_any: AtomicBool::new(false),
            fault_changes: parking_lot::Mutex::new(()),
            shut_down: AtomicBool::new(false),
            shutdown_tx,
            serial: AtomicU64::new(0),
            lanes: OutgoingLanes::default(),
            incoming_lanes: parking_lot::Mutex::new(HashMap::new()),
            pending_handshakes: std::sync::atomic::AtomicUsize::new(0),
            handshakes_refused: AtomicU64::new(0),
            handshakes_failed: AtomicU64::new(0),
            role_check: RwLock::new(None),
            config,
        });
        runtime.spawn(accept_loop(shared.clone(), listener, shutdown_rx.clone()));
        runtime.spawn(sweep_lanes(shared.clone(), shutdown_rx));
        tracing::debug!(node = %shared.config.node_id, %local_addr, "endpoint started");
        Ok(Self {
            handle: NetHandle { shared },
            runtime: None,
        })
    }

    /// A cloneable handle for sending from other threads and tasks.
    pub fn handle(&self) -> NetHandle {
        self.handle.clone()
    }

    /// Shuts the endpoint down (the same as dropping it).
    pub fn shutdown(self) {}
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let shared = &self.handle.shared;
        if shared.shut_down.swap(true, Ordering::AcqRel) {
            return;
        }
        shared.shutdown_tx.send_replace(true);
        let conns: Vec<Arc<Conn>> = shared
            .table
            .write()
            .drain()
            .filter_map(|(_, slot)| match slot {
                Slot::Up(conn) => Some(conn),
                Slot::Connecting(_) => None,
            })
            .collect();
        for conn in conns {
            conn.close();
        }
        shared.lanes.close_all();
        let lanes: Vec<Arc<Conn>> = shared
            .incoming_lanes
            .lock()
            .drain()
            .flat_map(|(_, lanes)| lanes)
            .collect();
        for lane in lanes {
            lane.close();
        }
        shared.table_changed.notify_waiters();
        // Handler threads exit once every pool sender is gone.
        shared.pool.write().take();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
