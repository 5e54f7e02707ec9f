//! An in-process Myriad cluster for integration tests.
//!
//! **Job.** [`TestCluster::builder`] starts real [`Superpeer`]s and [`PeerNode`]s through
//! their production start paths ([`Superpeer::start`], [`PeerNode::start`]: join, memory
//! manager, chunk service, replication, backups) on 127.0.0.1, each in a temporary data
//! directory, and connects clients through the client library ([`Client::connect_with`]).
//! Tests then crash ([`TestCluster::kill_peer`]), stop and restart peers (with their data
//! directories), cut links ([`TestCluster::link`]) and wait for conditions
//! ([`TestCluster::wait_until`]).
//!
//! **Invariants.**
//! - Everything the cluster started is stopped when it is dropped, also when a test
//!   panics: clients leave, peers shut down, then superpeers; the data directories go last.
//! - Every wait is bounded and panics with a message naming what it waited for.
//! - Time and link filters go through the cluster's [`Env`] (see [`crate::env`]); nothing
//!   here reads the clock or sets a network fault on its own.
//! - Superpeers are nodes 1..=n and listen on addresses fixed before they start (peers and
//!   the node table use the member addresses); a port taken meanwhile by another test is
//!   retried with fresh ports and directories, a few times.
//!
//! **Callers.** Integration tests of `myriad-node`, `myriad-replication` and the crates
//! above; call it from plain test threads (never inside a tokio runtime).

use std::net::{SocketAddr, TcpListener};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use myriad_client::client::{Client, ClientConfig};
use myriad_client::membership::JoinConfig;
use myriad_meta::{NodeState, Role};
use myriad_node::peer_node::{PeerNode, PeerOptions};
use myriad_node::replication::BackupOptions;
use myriad_node::superpeer::{Superpeer, SuperpeerConfig};
use myriad_replication::Durability;
use myriad_types::NodeId;

use crate::env::{Env, LinkError, LinkFilter};

/// Longest wait of the harness itself (start, leader, peers seeing each other).
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at starting the superpeers on fresh ports.
const START_ATTEMPTS: usize = 5;

type SuperpeerTweak = Box<dyn Fn(usize, &mut SuperpeerConfig)>;
type PeerTweak = Box<dyn Fn(usize, &mut PeerOptions)>;

/// Builds a [`TestCluster`]: 1 superpeer, no peers, no replication by default.
pub struct TestClusterBuilder {
    superpeers: usize,
    peers: usize,
    memory_bytes: u64,
    backup: BackupOptions,
    failure_detection: Option<(Duration, Duration)>,
    superpeer_tweak: Option<SuperpeerTweak>,
    peer_tweak: Option<PeerTweak>,
    env: Env,
}

impl std::fmt::Debug for TestClusterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestClusterBuilder")
            .field("superpeers", &self.superpeers)
            .field("peers", &self.peers)
            .field("replication", &self.backup.replication)
            .finish_non_exhaustive()
    }
}

impl TestClusterBuilder {
    /// Superpeers in the Raft group (1, 3 or 5), nodes 1..=n.
    pub fn superpeers(mut self, count: usize) -> Self {
        self.superpeers = count;
        self
    }

    /// Peers started (and joined) by [`TestClusterBuilder::start`].
    pub fn peers(mut self, count: usize) -> Self {
        self.peers = count;
        self
    }

    /// Backups per zone (R) of every peer; 0 (the default): no replication.
    pub fn replication(mut self, r: usize) -> Self {
        self.backup.replication = r;
        self
    }

    /// The peers' default durability (for requests that ask for the cluster default).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.backup.durability = durability;
        self
    }

    /// Payload bytes per backup zone (default 64 KiB).
    pub fn zone_bytes(mut self, bytes: u64) -> Self {
        let replication = self.backup.replication;
        let durability = self.backup.durability;
        self.backup = BackupOptions::small_for_tests(bytes);
        self.backup.replication = replication;
        self.backup.durability = durability;
        self
    }

    /// Every backup setting at once (replaces what `replication`, `durability` and
    /// `zone_bytes` set before). Default: [`BackupOptions::small_for_tests`] of 64 KiB
    /// zones with R = 0.
    pub fn backup(mut self, backup: BackupOptions) -> Self {
        self.backup = backup;
        self
    }

    /// Size of each peer's memory region (default 16 MiB).
    pub fn memory_bytes(mut self, bytes: u64) -> Self {
        self.memory_bytes = bytes;
        self
    }

    /// The superpeers' failure detection: heartbeat interval and the silence before a
    /// verdict (default: the node defaults, 250 ms and 1 s).
    pub fn failure_detection(mut self, heartbeat: Duration, timeout: Duration) -> Self {
        self.failure_detection = Some((heartbeat, timeout));
        self
    }

    /// Changes superpeer `index`'s configuration after the harness set it up (last word).
    pub fn configure_superpeers(
        mut self,
        tweak: impl Fn(usize, &mut SuperpeerConfig) + 'static,
    ) -> Self {
        self.superpeer_tweak = Some(Box::new(tweak));
        self
    }

    /// Changes peer `index`'s options after the harness set them up (last word; kept for
    /// its restarts).
    pub fn configure_peers(mut self, tweak: impl Fn(usize, &mut PeerOptions) + 'static) -> Self {
        self.peer_tweak = Some(Box::new(tweak));
        self
    }

    /// The environment (clock, transport); default [`Env::real`].
    pub fn env(mut self, env: Env) -> Self {
        self.env = env;
        self
    }

    /// Starts the superpeers, waits for a leader, starts the peers and waits until every
    /// peer sees every other one alive. Panics (after stopping what started) on failure.
    pub fn start(self) -> TestCluster {
        let dir = tempfile::tempdir().expect("a temporary directory for the test cluster");
        let (superpeers, configs) = start_superpeers(&self, &dir);
        let seeds: Vec<(NodeId, SocketAddr)> = configs[0].members.clone();
        let secret = configs[0].secret.clone();
        let mut cluster = TestCluster {
            superpeers: superpeers.into_iter().map(Some).collect(),
            superpeer_configs: configs,
            peers: Vec::new(),
            peer_options: Vec::new(),
            clients: Mutex::new(Vec::new()),
            seeds,
            secret,
            env: self.env.clone(),
            dir,
        };
        for superpeer in cluster.superpeers.iter().flatten() {
            cluster
                .env
                .transport
                .attach(superpeer.node_id(), superpeer.net());
        }
        cluster.leader();
        for index in 0..self.peers {
            let mut options = cluster.peer_defaults(index, &self);
            if let Some(tweak) = &self.peer_tweak {
                tweak(index, &mut options);
            }
            cluster.peer_options.push(options);
            cluster.peers.push(None);
            cluster.restart_peer(index);
        }
        cluster.wait_for_peers();
        cluster
    }
}

/// Picks a free port on 127.0.0.1 (another socket may take it before it is bound).
fn free_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a port on 127.0.0.1");
    listener
        .local_addr()
        .expect("a bound listener has an address")
}

/// Starts the group on fresh ports, retrying when a port was taken meanwhile.
fn start_superpeers(
    builder: &TestClusterBuilder,
    dir: &tempfile::TempDir,
) -> (Vec<Superpeer>, Vec<SuperpeerConfig>) {
    assert!(builder.superpeers >= 1, "a cluster needs a superpeer");
    for attempt in 1..=START_ATTEMPTS {
        let members: Vec<(NodeId, SocketAddr)> = (1..=builder.superpeers)
            .map(|id| (NodeId(id as u16), free_address()))
            .collect();
        // A fresh random secret per cluster (there is no default one).
        let secret = myriad_net::secret::generate().into_bytes();
        let configs: Vec<SuperpeerConfig> = members
            .iter()
            .enumerate()
            .map(|(index, (id, address))| {
                let path = dir.path().join(format!("superpeer-{index}-try{attempt}"));
                let mut config = SuperpeerConfig::new(*id, *address, members.clone(), path);
                config.secret = secret.clone();
                config.election_timeout_ms = 150..300;
                config.raft_heartbeat_ms = 50;
                if let Some((heartbeat, timeout)) = builder.failure_detection {
                    config.heartbeat_interval_ms = heartbeat.as_millis() as u64;
                    config.failure_timeout_ms = timeout.as_millis() as u64;
                }
                if let Some(tweak) = &builder.superpeer_tweak {
                    tweak(index, &mut config);
                }
                config
            })
            .collect();
        let started: Result<Vec<Superpeer>, _> =
            configs.iter().cloned().map(Superpeer::start).collect();
        match started {
            Ok(superpeers) => return (superpeers, configs),
            Err(error) if attempt < START_ATTEMPTS => {
                eprintln!("test cluster: superpeers did not start ({error}); new ports");
            }
            Err(error) => panic!("test cluster: the superpeers did not start: {error}"),
        }
    }
    unreachable!("the last attempt returns or panics")
}

/// A running in-process cluster; see the module documentation.
pub struct TestCluster {
    superpeers: Vec<Option<Superpeer>>,
    superpeer_configs: Vec<SuperpeerConfig>,
    peers: Vec<Option<PeerNode>>,
    peer_options: Vec<PeerOptions>,
    clients: Mutex<Vec<Client>>,
    seeds: Vec<(NodeId, SocketAddr)>,
    secret: Vec<u8>,
    env: Env,
    // Declared last: removed after every node stopped (see `Drop`).
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("superpeers", &self.seeds)
            .field("peers", &self.peers)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// A builder with the defaults: 1 superpeer, 0 peers, R = 0.
    pub fn builder() -> TestClusterBuilder {
        let mut backup = BackupOptions::small_for_tests(64 << 10);
        backup.replication = 0;
        TestClusterBuilder {
            superpeers: 1,
            peers: 0,
            memory_bytes: 16 << 20,
            backup,
            failure_detection: None,
            superpeer_tweak: None,
            peer_tweak: None,
            env: Env::real(),
        }
    }

    fn peer_defaults(&self, index: usize, builder: &TestClusterBuilder) -> PeerOptions {
        let mut join = self.join_config(Role::Peer);
        join.handler_threads = 2;
        PeerOptions {
            join,
            memory_bytes: builder.memory_bytes,
            data_dir: self.dir.path().join(format!("peer-{index}")),
            handler_threads: 2,
            prefault_bytes: 0,
            backup: builder.backup.clone(),
            compute: Default::default(),
        }
    }

    /// The superpeers (ID and address) to give a joining node.
    pub fn seeds(&self) -> Vec<(NodeId, SocketAddr)> {
        self.seeds.clone()
    }

    /// A join configuration for this cluster (its superpeers and secret), e.g. for a
    /// test that joins a raw [`myriad_client::membership::Membership`].
    pub fn join_config(&self, role: Role) -> JoinConfig {
        let mut join = JoinConfig::new(self.seeds(), role);
        join.secret = self.secret.clone();
        join
    }

    /// The environment (clock, transport) of this cluster.
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// The directory holding every node's data directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    // ----- clients ----------------------------------------------------------------------

    /// The cluster's default client (connected on first use, default settings).
    pub fn client(&self) -> Client {
        if let Some(client) = self.lock_clients().first() {
            return client.clone();
        }
        self.new_client(|_| {})
    }

    /// A new client, its configuration changed by `configure` (timeouts, durability);
    /// left and closed when the cluster is dropped. The first one made becomes the
    /// default of [`TestCluster::client`].
    pub fn new_client(&self, configure: impl FnOnce(&mut ClientConfig)) -> Client {
        let mut config = ClientConfig::new(self.seeds());
        config.join.secret = self.secret.clone();
        configure(&mut config);
        let client = Client::connect_with(config)
            .unwrap_or_else(|error| panic!("test cluster: a client could not join: {error}"));
        self.env
            .transport
            .attach(client.node_id(), client.membership().net());
        self.lock_clients().push(client.clone());
        client
    }

    fn lock_clients(&self) -> MutexGuard<'_, Vec<Client>> {
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    // ----- superpeers -------------------------------------------------------------------

    /// Superpeer `index` (node `index + 1`). Panics if it was stopped.
    pub fn superpeer(&self, index: usize) -> &Superpeer {
        self.superpeers
            .get(index)
            .and_then(Option::as_ref)
            .unwrap_or_else(|| panic!("test cluster: superpeer {index} is not running"))
    }

    /// The running superpeers.
    pub fn superpeers(&self) -> impl Iterator<Item = &Superpeer> {
        self.superpeers.iter().flatten()
    }

    /// The configuration superpeer `index` was started with (e.g. to start a second one
    /// on its directory).
    pub fn superpeer_config(&self, index: usize) -> SuperpeerConfig {
        self.superpeer_configs[index].clone()
    }

    /// The superpeer that leads the group, waiting (bounded) until one does.
    pub fn leader(&self) -> &Superpeer {
        let mut leader = None;
        self.wait_until(START_TIMEOUT, "a superpeer leads the group", || {
            // Indexes into all superpeers, stopped ones included (`superpeers()` skips
            // them, so a position there is not an index).
            leader = self
                .superpeers
                .iter()
                .position(|superpeer| superpeer.as_ref().is_some_and(Superpeer::is_leader));
            leader.is_some()
        });
        let index = leader.expect("the wait returned once a leader was found");
        self.superpeer(index)
    }

    /// Shuts superpeer `index` down (Raft stops, its directory is unlocked). The superpeer
    /// has no separate crash path: Raft acknowledges only what it synced, so this is what
    /// a crash leaves behind.
    pub fn stop_superpeer(&mut self, index: usize) -> NodeId {
        let superpeer = self.superpeers[index]
            .take()
            .unwrap_or_else(|| panic!("test cluster: superpeer {index} is not running"));
        let id = superpeer.node_id();
        self.env.transport.detach(id);
        superpeer.shutdown();
        id
    }

    /// Starts superpeer `index` again on its address and directory (its Raft log and
    /// snapshot). Panics if it runs or does not start.
    pub fn restart_superpeer(&mut self, index: usize) -> &Superpeer {
        assert!(
            self.superpeers[index].is_none(),
            "test cluster: superpeer {index} is running"
        );
        let superpeer =
            Superpeer::start(self.superpeer_configs[index].clone()).unwrap_or_else(|error| {
                panic!("test cluster: superpeer {index} did not restart: {error}")
            });
        self.env
            .transport
            .attach(superpeer.node_id(), superpeer.net());
        self.superpeers[index].insert(superpeer)
    }

    // ----- peers ------------------------------------------------------------------------

    /// Peer `index` (in start order). Panics if it is down (killed or stopped).
    pub fn peer(&self, index: usize) -> &PeerNode {
        self.try_peer(index)
            .unwrap_or_else(|| panic!("test cluster: peer {index} is down"))
    }

    /// Peer `index`, if it runs.
    pub fn try_peer(&self, index: usize) -> Option<&PeerNode> {
        self.peers.get(index).and_then(Option::as_ref)
    }

    /// The running peer with node ID `id`.
    pub fn peer_by_id(&self, id: NodeId) -> Option<&PeerNode> {
        self.live_peers().find(|peer| peer.node_id() == id)
    }

    /// The running peers, in start order.
    pub fn live_peers(&self) -> impl Iterator<Item = &PeerNode> {
        self.peers.iter().flatten()
    }

    /// The node IDs of the running peers, in start order.
    pub fn peer_ids(&self) -> Vec<NodeId> {
        self.live_peers().map(PeerNode::node_id).collect()
    }

    /// Crashes peer `index`: it stops at once without leaving ([`PeerNode::crash`]), so
    /// the superpeers declare it failed and recover its zones. Returns its node ID.
    pub fn kill_peer(&mut self, index: usize) -> NodeId {
        let peer = self.take_peer(index);
        let id = peer.node_id();
        peer.crash();
        id
    }

    /// Stops peer `index` in an orderly way: it leaves the cluster
    /// ([`PeerNode::shutdown`]). Returns its node ID.
    pub fn stop_peer(&mut self, index: usize) -> NodeId {
        let peer = self.take_peer(index);
        let id = peer.node_id();
        peer.shutdown();
        id
    }

    fn take_peer(&mut self, index: usize) -> PeerNode {
        let peer = self.peers[index]
            .take()
            .unwrap_or_else(|| panic!("test cluster: peer {index} is already down"));
        self.env.transport.detach(peer.node_id());
        peer
    }

    /// Starts peer `index` again with its options and data directory (it reclaims its
    /// node ID as a new incarnation). Panics if it runs or does not start.
    pub fn restart_peer(&mut self, index: usize) -> &PeerNode {
        assert!(
            self.peers[index].is_none(),
            "test cluster: peer {index} is running"
        );
        let peer = PeerNode::start(self.peer_options[index].clone())
            .unwrap_or_else(|error| panic!("test cluster: peer {index} did not start: {error}"));
        self.env
            .transport
            .attach(peer.node_id(), peer.membership().net());
        self.peers[index].insert(peer)
    }

    /// The options peer `index` starts (and restarts) with.
    pub fn peer_options(&self, index: usize) -> &PeerOptions {
        &self.peer_options[index]
    }

    /// Waits (bounded) until every running peer sees every running peer alive.
    pub fn wait_for_peers(&self) {
        let ids = self.peer_ids();
        self.wait_until(START_TIMEOUT, "the peers see each other alive", || {
            self.live_peers().all(|peer| {
                ids.iter().all(|id| {
                    peer.membership()
                        .node(*id)
                        .is_some_and(|record| record.state == NodeState::Alive)
                })
            })
        });
    }

    // ----- links and waits --------------------------------------------------------------

    /// The link between nodes `a` and `b` (superpeers, peers or clients), to filter.
    pub fn link(&self, a: NodeId, b: NodeId) -> Link<'_> {
        Link {
            env: &self.env,
            a,
            b,
        }
    }

    /// Polls `done` until it holds; panics naming `what` after `limit` (see
    /// [`Env::wait_until`]).
    pub fn wait_until(&self, limit: Duration, what: &str, done: impl FnMut() -> bool) {
        self.env.wait_until(limit, what, done);
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for client in self.lock_clients().drain(..) {
            client.shutdown();
        }
        for peer in self.peers.iter_mut() {
            if let Some(peer) = peer.take() {
                peer.shutdown();
            }
        }
        for superpeer in self.superpeers.iter_mut() {
            if let Some(superpeer) = superpeer.take() {
                superpeer.shutdown();
            }
        }
    }
}

/// Both directions of the link between two nodes ([`TestCluster::link`]).
#[derive(Debug, Clone, Copy)]
pub struct Link<'a> {
    env: &'a Env,
    a: NodeId,
    b: NodeId,
}

impl<'a> Link<'a> {
    fn both(&self, filter: LinkFilter) -> Result<(), LinkError> {
        self.env.transport.set_filter(self.a, self.b, filter)?;
        self.env.transport.set_filter(self.b, self.a, filter)
    }

    /// Cuts the link: every message either way is dropped (a network partition).
    pub fn partition(&self) {
        self.both(LinkFilter::Drop)
            .unwrap_or_else(|error| panic!("test cluster: partition: {error}"));
    }

    /// Delays every message either way by `ms` milliseconds (in order: later messages
    /// wait behind a delayed one); an error if the transport cannot delay.
    pub fn delay(&self, ms: u64) -> Result<(), LinkError> {
        self.both(LinkFilter::Delay(Duration::from_millis(ms)))
    }

    /// Lifts every filter of the link, both ways.
    pub fn heal(&self) {
        self.both(LinkFilter::Pass)
            .unwrap_or_else(|error| panic!("test cluster: heal: {error}"));
    }

    /// Only the direction `a → b` (the order given to [`TestCluster::link`]).
    pub fn one_way(&self) -> OneWay<'a> {
        OneWay {
            env: self.env,
            from: self.a,
            to: self.b,
        }
    }
}

/// One direction of a link ([`Link::one_way`]).
#[derive(Debug, Clone, Copy)]
pub struct OneWay<'a> {
    env: &'a Env,
    from: NodeId,
    to: NodeId,
}

impl OneWay<'_> {
    /// Drops every message from `from` to `to` (the other direction is unchanged).
    pub fn drop(&self) {
        self.env
            .transport
            .set_filter(self.from, self.to, LinkFilter::Drop)
            .unwrap_or_else(|error| panic!("test cluster: one-way drop: {error}"));
    }

    /// Delays the messages from `from` to `to` by `ms` milliseconds (the other direction
    /// is unchanged; see [`Link::delay`]).
    pub fn delay(&self, ms: u64) -> Result<(), LinkError> {
        let filter = LinkFilter::Delay(Duration::from_millis(ms));
        self.env.transport.set_filter(self.from, self.to, filter)
    }

    /// Lifts the filter of this direction.
    pub fn heal(&self) {
        self.env
            .transport
            .set_filter(self.from, self.to, LinkFilter::Pass)
            .unwrap_or_else(|error| panic!("test cluster: one-way heal: {error}"));
    }
}
