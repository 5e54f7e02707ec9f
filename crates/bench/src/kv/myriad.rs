//! The Myriad side of `bench kv`: a local cluster started through the launcher and the
//! per-thread workers that drive it.
//!
//! # Hook
//! Everything here is real except the client calls: [`client_session`] is the one
//! function to fill in with `myriad-client` (join through the superpeers, preload the
//! keys, hand out per-thread workers). Until then it returns an "unimplemented: needs
//! myriad-client" error and `bench kv` reports Myriad as skipped, still running the
//! baselines.
//!
//! # Invariants
//! - The cluster is started owned: it is SIGKILLed when the [`MyriadTarget`] is dropped,
//!   also when the bench fails half way.
//! - The nodes run this very binary (`std::env::current_exe()`), so `myriad bench kv`
//!   measures the build it is part of.

use std::path::{Path, PathBuf};
use std::time::Duration;

use myriad_node::launch::{LaunchSpec, LocalCluster};

use super::driver::WorkerFn;

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
}

/// THE HOOK: connects a client session to the cluster whose superpeers are `superpeers`
/// (node ID, `127.0.0.1:P`).
///
/// UNIMPLEMENTED: needs myriad-client. Replace the body with a `MyriadClientSession` over
/// the client library; nothing else in `bench kv` has to change.
pub fn client_session(
    superpeers: &[(u16, String)],
) -> Result<Box<dyn MyriadClientSession>, String> {
    let _ = superpeers;
    Err("unimplemented: needs myriad-client".into())
}

/// A local cluster of `peers` peers plus a client session on it.
pub struct MyriadTarget {
    // Field order matters: the session is dropped (disconnects) before the cluster dies.
    session: Box<dyn MyriadClientSession>,
    cluster: LocalCluster,
}

impl MyriadTarget {
    /// Starts a cluster (one superpeer, `peers` peers of `peer_memory_mb` MiB each) in
    /// `dir` with this binary and connects a client session to it.
    pub fn start(dir: &Path, peers: usize, peer_memory_mb: u64) -> Result<Self, String> {
        let binary =
            std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
        Self::start_with(dir, binary, peers, peer_memory_mb)
    }

    /// Like [`start`](Self::start) with an explicit node binary.
    pub fn start_with(
        dir: &Path,
        binary: PathBuf,
        peers: usize,
        peer_memory_mb: u64,
    ) -> Result<Self, String> {
        let mut spec = LaunchSpec::new(dir, binary);
        spec.superpeers = 1;
        spec.peers = peers;
        spec.peer_memory_mb = Some(peer_memory_mb);
        spec.ready_timeout = Duration::from_secs(30);
        let cluster = LocalCluster::start_owned(spec).map_err(|e| e.to_string())?;
        let session = client_session(&cluster.superpeer_addresses())?;
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
}
