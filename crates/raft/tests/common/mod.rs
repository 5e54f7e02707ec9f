//! An in-process superpeer group: an in-memory transport between [`MetaRaft`]s with
//! switches to cut a node off (its calls and calls to it are dropped) and to kill and
//! restart nodes from their directories.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use myriad_meta::{Command, MetaState, Response};
use myriad_raft::{
    MetaRaft, RaftConfig, RaftReadError, RaftRole, RaftTransport, RaftWriteError, TransportError,
};
use myriad_types::ChunkId;

/// How long any single wait of a test may take before it fails.
pub const WAIT_MAX: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Slot {
    raft: Option<MetaRaft>,
    cut: bool,
}

/// Routes calls between the nodes of one test.
#[derive(Default)]
pub struct Hub {
    slots: Mutex<HashMap<u64, Slot>>,
}

impl Hub {
    fn connected(&self, from: u64, to: u64) -> bool {
        let slots = self.slots.lock().unwrap();
        let cut = |id: u64| slots.get(&id).is_none_or(|slot| slot.cut);
        !cut(from) && !cut(to)
    }

    /// The running, connected node that considers itself leader with the highest term.
    pub fn leader(&self) -> Option<MetaRaft> {
        let slots = self.slots.lock().unwrap();
        slots
            .values()
            .filter(|slot| !slot.cut)
            .filter_map(|slot| slot.raft.clone())
            .filter(|raft| raft.metrics().role == RaftRole::Leader)
            .max_by_key(|raft| raft.metrics().term)
    }

    fn route(&self, from: u64, to: u64) -> Option<MetaRaft> {
        if !self.connected(from, to) {
            return None;
        }
        self.slots.lock().unwrap().get(&to)?.raft.clone()
    }
}

/// One node's end of the hub.
pub struct HubTransport {
    from: u64,
    hub: Arc<Hub>,
}

impl RaftTransport for HubTransport {
    async fn call(
        &self,
        target: u64,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let unreachable = || TransportError::Unreachable {
            target,
            reason: "cut off or down".to_owned(),
        };
        let raft = self.hub.route(self.from, target).ok_or_else(unreachable)?;
        let reply = tokio::time::timeout(timeout, raft.handle_rpc(&request))
            .await
            .map_err(|_| TransportError::Timeout {
                target,
                timeout_ms: timeout.as_millis() as u64,
            })?;
        // A cut made while the call was in flight drops the reply too.
        if self.hub.connected(self.from, target) {
            Ok(reply)
        } else {
            Err(unreachable())
        }
    }
}

/// A group of superpeers in this process, each with its own temporary directory.
pub struct Cluster {
    pub hub: Arc<Hub>,
    dirs: BTreeMap<u64, tempfile::TempDir>,
    members: BTreeMap<u64, String>,
    nodes: BTreeMap<u64, MetaRaft>,
    configure: fn(&mut RaftConfig),
    /// Per node, every applied command its observer saw: (log index, command as text).
    pub observed: Observed,
}

/// Per node, the (log index, command text) pairs its apply observer saw.
pub type Observed = Arc<Mutex<BTreeMap<u64, Vec<(u64, String)>>>>;

/// Test timings: elections after 150–300 ms without a leader, heartbeats every 50 ms.
pub fn test_config(config: &mut RaftConfig) {
    config.election_timeout_ms = 150..300;
    config.heartbeat_ms = 50;
    config.request_timeout_ms = 2_000;
}

impl Cluster {
    /// Starts `count` superpeers with IDs 1..=count.
    pub async fn start(count: u64, configure: fn(&mut RaftConfig)) -> Cluster {
        let members: BTreeMap<u64, String> = (1..=count)
            .map(|id| (id, format!("127.0.0.1:{}", 22_000 + id)))
            .collect();
        let mut cluster = Cluster {
            hub: Arc::new(Hub::default()),
            dirs: members
                .keys()
                .map(|&id| (id, tempfile::tempdir().unwrap()))
                .collect(),
            members,
            nodes: BTreeMap::new(),
            configure,
            observed: Arc::default(),
        };
        let ids: Vec<u64> = cluster.members.keys().copied().collect();
        for id in ids {
            cluster.start_node(id).await;
        }
        cluster
    }

    /// Starts (or restarts) node `id` from its directory.
    pub async fn start_node(&mut self, id: u64) {
        self.start_node_joining(id, false).await;
    }

    async fn start_node_joining(&mut self, id: u64, join_existing: bool) {
        assert!(!self.nodes.contains_key(&id), "node {id} is running");
        let mut config = RaftConfig::new(id, self.dirs[&id].path(), self.members.clone());
        (self.configure)(&mut config);
        config.join_existing = join_existing;
        let transport = HubTransport {
            from: id,
            hub: self.hub.clone(),
        };
        let observed = Arc::clone(&self.observed);
        let observer: myriad_raft::ApplyObserver = Arc::new(
            move |index, command: Option<&Command>, _: &Response, _: &MetaState| {
                let text = command.map_or_else(|| "-".to_owned(), ToString::to_string);
                observed
                    .lock()
                    .unwrap()
                    .entry(id)
                    .or_default()
                    .push((index, text));
            },
        );
        let raft = MetaRaft::start_observed(config, transport, Some(observer))
            .await
            .unwrap();
        self.hub.slots.lock().unwrap().entry(id).or_default().raft = Some(raft.clone());
        self.nodes.insert(id, raft);
    }

    /// Starts node `id`, not one of the configured members, with a fresh directory and
    /// `join_existing`: it waits for the leader to add it (`MetaRaft::add_superpeer`).
    pub async fn start_joiner(&mut self, id: u64) {
        self.dirs.insert(id, tempfile::tempdir().unwrap());
        let mut with_joiner = self.members.clone();
        with_joiner.insert(id, format!("127.0.0.1:{}", 22_000 + id));
        let configured = std::mem::replace(&mut self.members, with_joiner);
        self.start_node_joining(id, true).await;
        self.members = configured;
    }

    /// Stops node `id`: it leaves the hub (calls to it fail at once) and shuts down.
    pub async fn kill(&mut self, id: u64) {
        let raft = self.nodes.remove(&id).expect("node is running");
        self.hub.slots.lock().unwrap().entry(id).or_default().raft = None;
        raft.shutdown().await;
    }

    /// Cuts node `id` off (or reconnects it): its calls and calls to it fail.
    pub fn cut(&self, id: u64, cut: bool) {
        self.hub.slots.lock().unwrap().entry(id).or_default().cut = cut;
    }

    pub fn node(&self, id: u64) -> &MetaRaft {
        &self.nodes[&id]
    }

    pub fn running(&self) -> impl Iterator<Item = &MetaRaft> {
        self.nodes.values()
    }

    /// A running node that considers itself leader with the highest term among such.
    pub fn current_leader(&self) -> Option<&MetaRaft> {
        self.nodes
            .values()
            .filter(|node| node.metrics().role == RaftRole::Leader)
            .max_by_key(|node| node.metrics().term)
    }

    /// Waits until a running node (other than `excluding`) is leader; returns its ID.
    pub async fn wait_for_leader(&self, excluding: Option<u64>, timeout: Duration) -> Option<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let leader = self
                .nodes
                .values()
                .filter(|node| Some(node.node_id()) != excluding)
                .filter(|node| node.metrics().role == RaftRole::Leader)
                .max_by_key(|node| node.metrics().term);
            if let Some(leader) = leader {
                return Some(leader.node_id());
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A linearizable read on whoever leads now. With 150–300 ms election timeouts a
    /// loaded machine can move the leadership between finding the leader and asking it;
    /// the old leader then answers `ForwardToLeader` and the read is asked again (bounded
    /// by [`WAIT_MAX`]). Any other error fails the test.
    pub async fn read_on_leader<T>(&self, read: impl Fn(&MetaState) -> T) -> T {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let leader = self.wait_for_leader(None, WAIT_MAX).await.unwrap();
            match self
                .node(leader)
                .read_linearizable(|state| read(state))
                .await
            {
                Ok(answer) => return answer,
                Err(RaftReadError::ForwardToLeader { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => panic!("linearizable read on the leader failed: {error:?}"),
            }
        }
    }

    /// Writes through the current leader, retrying across leader changes (use idempotent
    /// commands).
    pub async fn write(&self, command: Command) -> Response {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Some(leader) = self.current_leader() {
                match leader.write(command.clone()).await {
                    Ok(response) => return response,
                    Err(RaftWriteError::ForwardToLeader { .. })
                    | Err(RaftWriteError::OutcomeUnknown { .. })
                    | Err(RaftWriteError::NoQuorum)
                    | Err(RaftWriteError::Stopped(_)) => {}
                    Err(error) => panic!("write failed: {error}"),
                }
            }
            assert!(Instant::now() < deadline, "no leader accepted {command}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until every running node applied the leader's whole log. (The leader's
    /// metrics may lag its state by an instant, so its last log index is the target, not its
    /// reported applied index.)
    pub async fn wait_converged(&self) {
        let leader = self.current_leader().expect("a leader");
        let last = leader.metrics().last_log_index.expect("log entries");
        for node in self.nodes.values() {
            assert!(
                node.wait_for_applied(last, WAIT_MAX).await,
                "node {} did not apply index {last}: {:?}",
                node.node_id(),
                node.metrics()
            );
        }
    }

    /// The snapshot bytes of every running node's state.
    pub fn snapshots(&self) -> BTreeMap<u64, Vec<u8>> {
        self.nodes
            .iter()
            .map(|(&id, node)| (id, node.read_local(MetaState::snapshot)))
            .collect()
    }
}

/// The command the tests write: binds `name-{index}` to a chunk derived from `index`.
pub fn name_command(index: u64) -> Command {
    Command::NameRegister {
        name: format!("name-{index}"),
        cid: ChunkId::from_raw(0x0001_0000_0000_0000 | index),
    }
}

/// Whether `state` holds every binding written by `name_command(0..count)`.
pub fn has_names(state: &MetaState, count: u64) -> bool {
    (0..count).all(|index| {
        state.name_get(&format!("name-{index}"))
            == Some(ChunkId::from_raw(0x0001_0000_0000_0000 | index))
    })
}
