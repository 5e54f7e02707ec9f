//! The Myriad side of `bench kv`: a local cluster started through the launcher and the
//! per-thread workers that drive it.
//!
//! [`client_session`] joins the cluster with a `myriad-client` [`Client`] (one more per
//! extra worker thread), preloads the keys spread over the peers in create batches, and hands
//! out one blocking worker per thread ([`MyriadClientSession::workers`]), or runs the async
//! driver ([`MyriadClientSession::run_async`]): one client, its single I/O thread, and
//! `inflight` tasks each with one call outstanding, the shape of `redis-benchmark`'s one
//! event-loop thread with many connections.
//!
//! The cluster's nodes get a config with the mode's replication (R = 0 for `none`, R = 2
//! otherwise) and default durability (`async`, `replicated` or `durable`). With TLS
//! (`bench kv --tls`) the launcher gives the cluster a CA of its own in `DIR/cluster/tls`
//! and every node its certificate; the session's clients (the preload's and every
//! worker's) use its `client` certificate.
//!
//! # Invariants
//! - The cluster is started owned: it is SIGKILLed when the [`MyriadTarget`] is dropped,
//!   also when the bench fails half way.
//! - The nodes run this very binary (`std::env::current_exe()`), so `myriad bench kv`
//!   measures the build it is part of.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::client::{Client, ClientConfig};
use myriad_meta::{NodeState, Role};
use myriad_types::{ChunkId, NodeId};

use myriad_launcher::{LaunchSpec, LocalCluster};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::driver::{latency_histogram, record_latency, DriverConfig, DriverResult, WorkerFn};
use super::Mode;

/// The operation a worker performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read `object_bytes` of a preloaded object.
    Get,
    /// Overwrite a preloaded object with `object_bytes`.
    Put,
}

impl Op {
    /// `get` or `put`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Put => "put",
        }
    }
}

/// A client connected to a cluster, holding the preloaded key space.
pub trait MyriadClientSession {
    /// Creates `keys` objects of `object_bytes` bytes; key index `i` maps to the `i`-th
    /// object (the session keeps the index → chunk ID map).
    fn preload(&mut self, keys: u64, object_bytes: usize) -> Result<(), String>;

    /// `threads` workers, each with its own connection or handle: a worker given `B` key
    /// indexes performs one `op` (`B` = 1) or one batch of `B` `op`s.
    fn workers(&mut self, op: Op, threads: usize) -> Result<Vec<WorkerFn>, String>;

    /// The async driver: `inflight` tasks on one client's runtime, each calling `op` (one
    /// operation or a batch of `config.batch`) back to back over uniform keys for
    /// `config.warmup` and then `config.duration`.
    fn run_async(
        &mut self,
        op: Op,
        inflight: usize,
        config: &DriverConfig,
    ) -> Result<DriverResult, String>;
}

/// Connects a client session to the cluster whose superpeers are `superpeers` (node ID,
/// `127.0.0.1:P`) and secret is `secret`, with TLS if `tls` names a directory of
/// `myriad cert` and a certificate in it (`(DIR, NAME)`). Each worker thread gets its own
/// client (its own node ID and connection per peer), matching the baselines' one
/// connection per client thread.
pub fn client_session(
    superpeers: &[(u16, String)],
    secret: Vec<u8>,
    tls: Option<(&Path, &str)>,
) -> Result<Box<dyn MyriadClientSession>, String> {
    let superpeers = superpeers
        .iter()
        .map(|(id, address)| {
            address
                .parse()
                .map(|address| (NodeId(*id), address))
                .map_err(|e| format!("superpeer address {address}: {e}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut config = ClientConfig::new(superpeers);
    config.join.secret = secret;
    if let Some((dir, name)) = tls {
        config = config
            .with_tls_dir(dir, name)
            .map_err(|e| format!("client TLS: {e}"))?;
    }
    let client = Client::connect_with(config.clone()).map_err(|e| e.to_string())?;
    Ok(Box::new(ClientSession {
        client,
        config,
        extra: Vec::new(),
        cids: Arc::new(Vec::new()),
        object_bytes: 0,
    }))
}

/// Chunks per create request during the preload.
const PRELOAD_BATCH: usize = 1_000;

struct ClientSession {
    client: Client,
    /// How the workers' clients connect (secret, TLS).
    config: ClientConfig,
    /// The clients of worker threads 1.. (thread 0 uses `client`).
    extra: Vec<Client>,
    /// Key index → chunk ID.
    cids: Arc<Vec<ChunkId>>,
    object_bytes: usize,
}

impl Drop for ClientSession {
    fn drop(&mut self) {
        for client in &self.extra {
            client.shutdown();
        }
        self.client.shutdown();
    }
}

impl MyriadClientSession for ClientSession {
    fn preload(&mut self, keys: u64, object_bytes: usize) -> Result<(), String> {
        let api = self.client.blocking();
        let peers: Vec<NodeId> = api
            .nodes()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|node| node.role == Role::Peer && node.state == NodeState::Alive)
            .map(|node| node.id)
            .collect();
        if peers.is_empty() {
            return Err("the cluster has no alive peer".into());
        }
        let keys = usize::try_from(keys).map_err(|_| "too many keys".to_owned())?;
        let mut cids = Vec::with_capacity(keys);
        let value = Bytes::from(vec![0x5a; object_bytes]);
        while cids.len() < keys {
            let count = PRELOAD_BATCH.min(keys - cids.len());
            let peer = peers[(cids.len() / PRELOAD_BATCH) % peers.len()];
            let created = api
                .chunks()
                .create_with_data(peer, vec![value.clone(); count])
                .map_err(|e| format!("preload: {e}"))?;
            cids.extend(created);
        }
        self.cids = Arc::new(cids);
        self.object_bytes = object_bytes;
        Ok(())
    }

    fn workers(&mut self, op: Op, threads: usize) -> Result<Vec<WorkerFn>, String> {
        if self.cids.is_empty() {
            return Err("preload first".into());
        }
        let value = Bytes::from(vec![0xa5; self.object_bytes]);
        // One client (one connection per peer) per thread, as redis-benchmark and the
        // memcached driver use one connection per client: thread 0 reuses the session's.
        while self.extra.len() + 1 < threads {
            let mut config = self.config.clone();
            config.join.superpeers = self.client.membership().superpeers().to_vec();
            let client = Client::connect_with(config)
                .map_err(|e| format!("connecting a worker's client: {e}"))?;
            self.extra.push(client);
        }
        let clients: Vec<Client> = std::iter::once(self.client.clone())
            .chain(self.extra.iter().cloned())
            .collect();
        let workers = (0..threads)
            .map(|index| {
                let client = clients[index].clone();
                let cids = Arc::clone(&self.cids);
                let value = value.clone();
                let worker: WorkerFn = Box::new(move |keys: &[u64]| {
                    let api = client.blocking();
                    let chunks = api.chunks();
                    let cid = |key: u64| {
                        usize::try_from(key)
                            .ok()
                            .and_then(|index| cids.get(index).copied())
                            .ok_or_else(|| format!("key {key} was not preloaded"))
                    };
                    match (op, keys) {
                        (Op::Get, [key]) => {
                            chunks.get(cid(*key)?).map(drop).map_err(|e| e.to_string())
                        }
                        (Op::Put, [key]) => chunks
                            .put(cid(*key)?, value.clone())
                            .map_err(|e| e.to_string()),
                        (Op::Get, keys) => {
                            let wanted = keys
                                .iter()
                                .map(|&key| cid(key))
                                .collect::<Result<Vec<_>, _>>()?;
                            chunks
                                .get_batch(&wanted)
                                .into_iter()
                                .try_for_each(|result| result.map(drop).map_err(|e| e.to_string()))
                        }
                        (Op::Put, keys) => {
                            let items = keys
                                .iter()
                                .map(|&key| Ok((cid(key)?, value.clone())))
                                .collect::<Result<Vec<_>, String>>()?;
                            chunks
                                .put_batch(&items)
                                .into_iter()
                                .try_for_each(|result| result.map_err(|e| e.to_string()))
                        }
                    }
                });
                worker
            })
            .collect();
        Ok(workers)
    }

    fn run_async(
        &mut self,
        op: Op,
        inflight: usize,
        config: &DriverConfig,
    ) -> Result<DriverResult, String> {
        if self.cids.is_empty() {
            return Err("preload first".into());
        }
        if inflight == 0 {
            return Err("the async driver needs at least one call in flight".into());
        }
        let runtime = self.client.membership().net().runtime();
        let value = Bytes::from(vec![0xa5; self.object_bytes]);
        let stop = Arc::new(AtomicBool::new(false));
        let measure_from = Instant::now() + config.warmup;
        let window = (measure_from, measure_from + config.duration);
        let load = AsyncLoad {
            client: self.client.clone(),
            cids: Arc::clone(&self.cids),
            value,
            op,
            batch: config.batch,
            window,
            stop,
        };
        let tasks: Vec<_> = (0..inflight)
            .map(|index| {
                runtime.spawn(async_task(
                    load.clone(),
                    config.seed.wrapping_add(index as u64),
                ))
            })
            .collect();
        let mut merged = latency_histogram()?;
        let mut calls = 0u64;
        let mut first_error = None;
        for task in tasks {
            match runtime.block_on(task) {
                Ok(Ok((histogram, task_calls))) => {
                    merged.add(&histogram).map_err(|e| e.to_string())?;
                    calls += task_calls;
                }
                Ok(Err(error)) => {
                    first_error.get_or_insert(error);
                }
                Err(error) => {
                    first_error.get_or_insert(format!("an async driver task failed: {error}"));
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(DriverResult::from_histogram(&merged, calls, config)),
        }
    }
}

/// What every async task of one run shares.
#[derive(Clone)]
struct AsyncLoad {
    client: Client,
    cids: Arc<Vec<ChunkId>>,
    value: Bytes,
    op: Op,
    batch: usize,
    /// Measure from, stop at.
    window: (Instant, Instant),
    stop: Arc<AtomicBool>,
}

/// One async task's closed loop; returns its histogram and measured calls.
async fn async_task(
    load: AsyncLoad,
    seed: u64,
) -> Result<(hdrhistogram::Histogram<u64>, u64), String> {
    let AsyncLoad {
        client,
        cids,
        value,
        op,
        batch,
        window: (measure_from, end),
        stop,
    } = load;
    let mut histogram = latency_histogram()?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut calls = 0u64;
    let chunks = client.chunks();
    let pick = |rng: &mut SmallRng| cids[rng.gen_range(0..cids.len())];
    while !stop.load(Ordering::Relaxed) {
        let called = Instant::now();
        if called >= end {
            break;
        }
        let result = match (op, batch) {
            (Op::Get, 1) => chunks.get(pick(&mut rng)).await.map(drop),
            (Op::Put, 1) => chunks.put(pick(&mut rng), value.clone()).await,
            (Op::Get, _) => {
                let wanted: Vec<ChunkId> = (0..batch).map(|_| pick(&mut rng)).collect();
                chunks
                    .get_batch(&wanted)
                    .await
                    .into_iter()
                    .try_for_each(|result| result.map(drop))
            }
            (Op::Put, _) => {
                let items: Vec<(ChunkId, Bytes)> = (0..batch)
                    .map(|_| (pick(&mut rng), value.clone()))
                    .collect();
                chunks.put_batch(&items).await.into_iter().collect()
            }
        };
        if let Err(error) = result {
            stop.store(true, Ordering::Relaxed);
            return Err(error.to_string());
        }
        if called >= measure_from {
            record_latency(&mut histogram, called.elapsed());
            calls += 1;
        }
    }
    Ok((histogram, calls))
}

/// A local cluster of `peers` peers plus a client session on it.
pub struct MyriadTarget {
    // Field order matters: the session is dropped (disconnects) before the cluster dies.
    session: Box<dyn MyriadClientSession>,
    cluster: LocalCluster,
}

impl MyriadTarget {
    /// Starts a cluster (one superpeer, `peers` peers of `peer_memory_mb` MiB each, with
    /// the replication and durability of `mode`, TLS on every connection if `tls`) in
    /// `dir` with this binary and connects a client session to it.
    pub fn start(
        dir: &Path,
        peers: usize,
        peer_memory_mb: u64,
        mode: Mode,
        tls: bool,
    ) -> Result<Self, String> {
        let binary =
            std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
        Self::start_with(dir, binary, peers, peer_memory_mb, mode, tls)
    }

    /// Like [`start`](Self::start) with an explicit node binary.
    pub fn start_with(
        dir: &Path,
        binary: PathBuf,
        peers: usize,
        peer_memory_mb: u64,
        mode: Mode,
        tls: bool,
    ) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let config = dir.join("bench-kv.toml");
        std::fs::write(&config, mode.node_config())
            .map_err(|e| format!("writing {}: {e}", config.display()))?;
        let mut spec = LaunchSpec::new(dir.join("cluster"), binary);
        spec.superpeers = 1;
        spec.peers = peers;
        spec.peer_memory_mb = Some(peer_memory_mb);
        spec.extra_args = vec!["--config".into(), config.display().to_string()];
        spec.ready_timeout = Duration::from_secs(30);
        spec.tls = tls;
        let cluster = LocalCluster::start_owned(spec).map_err(|e| e.to_string())?;
        let secret = cluster.secret().map_err(|e| e.to_string())?;
        let tls_dir = cluster.tls_dir();
        if tls && tls_dir.is_none() {
            return Err("the launcher started the cluster without TLS".into());
        }
        let client_tls = tls_dir.as_deref().map(|dir| (dir, "client"));
        let session = client_session(&cluster.superpeer_addresses(), secret, client_tls)?;
        Ok(MyriadTarget { session, cluster })
    }

    /// The running cluster.
    pub fn cluster(&self) -> &LocalCluster {
        &self.cluster
    }

    /// See [`MyriadClientSession::preload`].
    pub fn preload(&mut self, keys: u64, object_bytes: usize) -> Result<(), String> {
        self.session.preload(keys, object_bytes)
    }

    /// See [`MyriadClientSession::workers`].
    pub fn workers(&mut self, op: Op, threads: usize) -> Result<Vec<WorkerFn>, String> {
        self.session.workers(op, threads)
    }

    /// See [`MyriadClientSession::run_async`].
    pub fn run_async(
        &mut self,
        op: Op,
        inflight: usize,
        config: &DriverConfig,
    ) -> Result<DriverResult, String> {
        self.session.run_async(op, inflight, config)
    }

    /// The PIDs of every node process of the cluster (superpeer and peers).
    pub fn pids(&self) -> Vec<u32> {
        self.cluster.nodes().iter().map(|node| node.pid).collect()
    }
}
