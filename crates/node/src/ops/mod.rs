//! Operating a node: the HTTP endpoint of a node's Prometheus metrics (and, on
//! superpeers, the web status page), the collectors that read every layer's figures at
//! scrape time, and the per-request counters of the chunk service.
//!
//! # Job
//! - [`HttpServer`]: a small HTTP/1.1 server (hyper) on its own thread and runtime, off
//!   the node's messaging port; it answers `GET` by asking a [`Routes`] for the path.
//! - [`peer_metrics`], [`superpeer_metrics`]: the [`Routes`] of a peer and of a superpeer:
//!   `/metrics` in the Prometheus text format (0.0.4), collected when scraped from the
//!   stats the lower layers expose (memory manager, connections, replicator, log engine,
//!   Raft, metadata) plus [`process`] figures from `/proc`.
//! - [`chunk_ops`]: request counts by type and result and latency histograms, the only
//!   figures recorded on the request path.
//! - [`status`]: the superpeers' status page (`/`, `/api/status`), with a sampler that
//!   keeps the last minutes of request rates, node changes and recoveries.
//! - [`log_control`]: the log filter changed at run time and a backup peer's log engine
//!   state (`loggerlevel`, `loginfo`).
//! - [`monitor`]: DXMonitor-style summaries every peer pushes to the superpeers, which
//!   keep a few minutes of them for `myriad term`'s `monitoring` (over messaging, not
//!   HTTP: it works without a metrics address).
//!
//! # Invariants
//! - The lower layers know nothing of HTTP or Prometheus: everything is read through
//!   their stats calls when a scrape arrives.
//! - The server listens only where it is told (`[metrics] listen`); a scrape never blocks
//!   the node's request paths beyond the short locks the stats calls take.
//!
//! # Who calls it
//! `myriad peer` and `myriad superpeer` start an [`HttpServer`] when a metrics address
//! is configured; tests scrape it.

pub mod chunk_ops;
pub mod log_control;
pub mod monitor;
pub mod peer_metrics;
pub mod process;
mod prom;
pub mod range_heat;
pub mod status;
pub mod superpeer_metrics;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// The answer to one `GET`.
#[derive(Debug, Clone)]
pub struct Page {
    /// The `Content-Type` header.
    pub content_type: &'static str,
    /// The body.
    pub body: Bytes,
}

/// What an [`HttpServer`] serves: a page per path.
pub trait Routes: Send + Sync + 'static {
    /// The page at `path` (without the query), or `None` for 404. Called on a blocking
    /// thread: it may take locks and read files.
    fn get(&self, path: &str, query: &str) -> Option<Page>;
}

/// A running HTTP server; stops when dropped.
#[derive(Debug)]
pub struct HttpServer {
    address: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `listen` (port 0: any free port) and serves `routes` on a thread of its own.
    pub fn start(listen: SocketAddr, routes: Arc<dyn Routes>) -> std::io::Result<HttpServer> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(2)
            .build()?;
        let listener = {
            let _context = runtime.enter();
            let std_listener = std::net::TcpListener::bind(listen)?;
            std_listener.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(std_listener)?
        };
        let address = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || runtime.block_on(serve(listener, routes, stopped)))?;
        Ok(HttpServer {
            address,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    routes: Arc<dyn Routes>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "metrics endpoint: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let routes = Arc::clone(&routes);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<_>| {
                let routes = Arc::clone(&routes);
                async move { Ok::<_, Infallible>(answer(routes, request).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            // A client that goes away mid-request is no error of the node.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), connection).await;
        });
    }
}

async fn answer<B>(routes: Arc<dyn Routes>, request: Request<B>) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, text: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *response.status_mut() = status;
        response
    };
    if request.method() != Method::GET {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let page = tokio::task::spawn_blocking(move || routes.get(&path, &query)).await;
    match page {
        Ok(Some(page)) => {
            let mut response = Response::new(Full::new(page.body));
            if let Ok(value) = hyper::header::HeaderValue::from_str(page.content_type) {
                response
                    .headers_mut()
                    .insert(hyper::header::CONTENT_TYPE, value);
            }
            response
        }
        Ok(None) => plain(StatusCode::NOT_FOUND, "not found\n"),
        Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "the page panicked\n"),
    }
}
