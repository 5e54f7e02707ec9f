//! The event loop of one simulation run: peers, clients, the superpeers' part, faults.
//!
//! Job: [`World::run`] drives one seeded run. Events come from one [`Queue`] in simulated
//! time: message deliveries (client requests and replies, replication messages and
//! acknowledgements), the application of an accepted replication message (the backup's
//! pool thread), client steps and timeouts, and faults (crash, failure detection and
//! recovery, restart, the restarted peer taking its earlier IDs back, partitions, pauses,
//! failing syncs). Production code serves the requests ([`ChunkService::execute`]),
//! applies replication ([`BackupService::apply`]), reads zones back
//! ([`BackupService::recover_zone`]) and takes a restarted peer's IDs back
//! ([`ChunkService::take_back_earlier_ids`]); at their interleaving points
//! ([`myriad_backup_log::interleave`]) the loop runs what the seed says happens meanwhile.
//! The superpeers' part runs on the production metadata state machine
//! ([`MetaState::apply`], `meta.rs`): joins, zone registrations, failure verdicts, the
//! recovery of every zone the metadata says is due, adoptions, ownership commits and
//! hand-overs are production [`myriad_meta::Command`]s, and the backups are chosen by the
//! production placement. Failure detection (when a verdict comes) and Raft are not run.
//!
//! Invariants: all choices come from the run's [`SimRng`]; every map is ordered; the run
//! ends by itself (clients have a bounded number of operations, retries are bounded, and
//! the loop stops at [`super::SimConfig::time_limit`]).
//!
//! Callers: [`super::run`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use myriad_backup_log::interleave;
use myriad_meta::MetaState;
use myriad_node::peer::{ChunkService, NOBODY};
use myriad_node::replication::registration_command;
use myriad_proto::chunk::{
    ChunkReply, ChunkRequest, ItemError, DURABILITY_ASYNC, DURABILITY_DURABLE,
};
use myriad_replication::wire::{Ack, LogMessage};
use myriad_replication::{
    BackupService, CopyStep, Durability, RegistryError, ReplicaError, ReplicaEvent,
};
use myriad_types::{ChunkId, NodeId};

use super::master::{Asked, SimMaster};
use super::net::{Fate, Queue, SimNet, Time};
use super::peer::SimPeer;
use super::rng::SimRng;
use super::{Bug, Scenario, SimConfig};
use crate::history::{Action, Operation, Outcome};

/// The value a remove writes (a get that finds nothing reads it).
pub const TOMBSTONE: u64 = u64::MAX;
/// How long a client waits for a reply.
const OP_TIMEOUT: Time = 20_000;
/// Attempts of one client operation (redirects after `NotOwner`).
const ATTEMPTS_MAX: u32 = 4;
/// How often a master's replicator runs its sender's round (resends, timeouts).
const RESEND_INTERVAL: Time = 2_000;
/// How long a copy waits before it reads locked chunks again (simulated µs).
const COPY_RETRY_US: Time = 1_000;

mod client;
mod faults;
mod meta;
mod migrate;
mod serve;

use serve::{apply_now, reply_text};

/// A message on the simulated network.
#[derive(Debug, Clone)]
enum Msg {
    Request { op: u64, body: Bytes },
    Reply { op: u64, body: Bytes },
    Replicate { body: Bytes },
    Ack { body: Bytes },
}

/// Something that happens at one simulated instant.
#[derive(Debug)]
enum Event {
    Deliver {
        from: NodeId,
        to: NodeId,
        incarnation: u32,
        msg: Msg,
    },
    Apply {
        backup: NodeId,
        incarnation: u32,
        master: NodeId,
        body: Bytes,
    },
    ClientNext {
        client: usize,
    },
    ClientTimeout {
        client: usize,
        op: u64,
        attempt: u32,
    },
    Resend {
        peer: NodeId,
        incarnation: u32,
    },
    Crash {
        peer: NodeId,
        tries: u32,
    },
    Detect {
        peer: NodeId,
        incarnation: u32,
    },
    Restart {
        peer: NodeId,
    },
    TakeBack {
        peer: NodeId,
        incarnation: u32,
    },
    Partition {
        a: NodeId,
        b: NodeId,
        one_way: bool,
    },
    Heal {
        a: NodeId,
        b: NodeId,
    },
    Pause {
        peer: NodeId,
        until: Time,
    },
    Suspect {
        peer: NodeId,
        incarnation: u32,
    },
    Resume {
        peer: NodeId,
        incarnation: u32,
    },
    Scan,
    Migrate {
        peer: NodeId,
    },
    MigrationTimeout {
        op: u64,
    },
    FailSync {
        peer: NodeId,
        fail: bool,
    },
    /// The superpeer that leads then crashes (`crash`: its log kept) or is cut off from the
    /// other superpeers.
    SuperpeerFault {
        crash: bool,
    },
    /// Crashed superpeers start again over their logs; cut-off ones are reconnected.
    SuperpeerRestart,
    /// The `OwnerChanged` event of `creator`'s IDs `first..=last` (now at `owner`)
    /// reaches `peer` (its incarnation `incarnation`).
    OwnerChangedArrives {
        peer: NodeId,
        incarnation: u32,
        creator: NodeId,
        first: u64,
        last: u64,
        owner: NodeId,
    },
    /// The `NodeFailed` event of `failed` reaches `peer` (its incarnation `incarnation`):
    /// its backup side seals the failed peer's zones.
    NodeFailedArrives {
        peer: NodeId,
        incarnation: u32,
        failed: NodeId,
        zones_end: u32,
    },
    /// Re-replication reads again the chunks of zone `zone` (an index into the master's
    /// zones) that were locked when it was copied, as the production copy does.
    /// A step of the first copy to an added backup waiting at `peer`'s replicator.
    CopyStep {
        peer: NodeId,
        incarnation: u32,
    },
}

/// What a client operation does.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Create { value: u64 },
    Put { cid: ChunkId, value: u64 },
    Get { cid: ChunkId },
    Remove { cid: ChunkId },
}

/// A client's operation in progress.
#[derive(Debug)]
struct Pending {
    op: u64,
    kind: Kind,
    start: Time,
    attempt: u32,
}

/// A simulated client: one operation at a time, a bounded number of them.
#[derive(Debug)]
struct Client {
    id: NodeId,
    remaining: usize,
    pending: Option<Pending>,
    /// Where it last found each chunk (the client library's lookup cache).
    cache: BTreeMap<ChunkId, NodeId>,
}

/// One simulation run.
pub struct World {
    seed: u64,
    config: SimConfig,
    scenario: Scenario,
    rng: SimRng,
    /// Draws for the delivery of events to peers: a stream of its own, so that adding
    /// these draws left every other draw of a seed (and the kept seeds' runs) as it was.
    event_rng: SimRng,
    /// Per peer, when its last event is due: a peer's events arrive in the order they
    /// were sent (the superpeer's event stream to it is ordered).
    events_due: BTreeMap<NodeId, Time>,
    /// The superpeer group (openraft) every metadata command commits through; `None`
    /// with [`SimConfig::raft`] off (commands then apply at once).
    raft: Option<super::raft::SimRaft>,
    /// Leader changes of the group already logged.
    raft_elections_logged: u64,
    queue: Queue<Event>,
    net: SimNet,
    peers: Vec<SimPeer>,
    clients: Vec<Client>,
    /// The metadata (production state machine), as every superpeer holds it.
    meta: MetaState,
    /// The highest epoch seen (epochs never go down).
    last_epoch: u64,
    /// Failed peers (and incarnations) whose leftover ranges were handed over.
    handed_over: BTreeSet<(NodeId, u32)>,
    /// Peers stalled long enough to be suspected, until their stall ends.
    suspects: BTreeSet<NodeId>,
    /// The migration in flight, if any.
    migration: Option<migrate::Migration>,
    /// Zones whose recovery failed at every live backup, since when: the leader asks
    /// again until [`meta::RECOVERY_RETRY_US_MAX`] has passed (production: rounds until
    /// its backup wait ends), then the zone is lost.
    recovery_failing: BTreeMap<(NodeId, u32), Time>,
    /// Chunks whose create was acknowledged, in creation order.
    known: Vec<ChunkId>,
    /// Chunks a remove was sent for.
    removes: BTreeSet<ChunkId>,
    next_op: u64,
    next_value: u64,
    /// The recorded client history.
    pub history: Vec<Operation>,
    /// Every event, for the replay.
    pub trace: Vec<String>,
    /// When a peer crashed (for the relaxed check of `async` runs).
    pub crashes: Vec<Time>,
    /// A failure found while running (checked invariants, a component that failed).
    pub failure: Option<String>,
    /// Statistics for the report.
    pub stats: super::RunStats,
}

impl World {
    /// A world for `seed` and `config`, with the scenario the seed draws.
    pub fn new(seed: u64, config: SimConfig) -> World {
        let mut rng = SimRng::new(seed);
        let scenario = Scenario::draw(&mut rng, &config);
        let peers = (1..=config.peers as u16)
            .map(|id| SimPeer::new(NodeId(id)))
            .collect();
        let clients = (0..config.clients)
            .map(|index| Client {
                id: NodeId(1000 + index as u16),
                remaining: config.ops_per_client,
                pending: None,
                cache: BTreeMap::new(),
            })
            .collect();
        let mut net = SimNet::default();
        net.faults = scenario.net;
        World {
            seed,
            config,
            scenario,
            rng,
            event_rng: SimRng::new(seed ^ 0x6576_656e_7473_2121),
            events_due: BTreeMap::new(),
            raft: None,
            raft_elections_logged: 0,
            queue: Queue::default(),
            net,
            peers,
            clients,
            meta: MetaState::new(),
            last_epoch: 0,
            handed_over: BTreeSet::new(),
            suspects: BTreeSet::new(),
            migration: None,
            recovery_failing: BTreeMap::new(),
            known: Vec::new(),
            removes: BTreeSet::new(),
            next_op: 0,
            next_value: 0,
            history: Vec::new(),
            trace: Vec::new(),
            crashes: Vec::new(),
            failure: None,
            stats: super::RunStats::default(),
        }
    }

    /// The scenario this run's seed drew.
    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    fn log(&mut self, line: String) {
        let now = self.queue.now();
        self.trace.push(format!("{now:>8}us {line}"));
    }

    fn fail(&mut self, what: String) {
        self.log(format!("FAILURE {what}"));
        if self.failure.is_none() {
            self.failure = Some(what);
        }
    }

    fn peer_index(&self, id: NodeId) -> Option<usize> {
        self.peers.iter().position(|p| p.id == id)
    }

    /// The running parts of peer `id` if its incarnation is still `incarnation` (an event
    /// sent to an earlier incarnation reaches nobody).
    fn parts_of(&self, id: NodeId, incarnation: u32) -> Option<&crate::sim::peer::PeerParts> {
        let peer = &self.peers[self.peer_index(id)?];
        (peer.incarnation == incarnation)
            .then_some(peer.parts.as_ref())
            .flatten()
    }

    /// Runs the whole simulation: start, workload and faults, quiescence, final checks.
    pub fn run(&mut self) {
        if self.config.raft {
            match super::raft::SimRaft::new(self.seed) {
                Ok(group) => self.raft = Some(group),
                Err(e) => {
                    self.fail(format!("the superpeer group did not form: {e}"));
                    return;
                }
            }
            self.schedule_superpeer_faults();
        }
        let ids: Vec<NodeId> = self.peers.iter().map(|p| p.id).collect();
        for id in ids {
            if !self.join(id) {
                return;
            }
        }
        for index in 0..self.peers.len() {
            if !self.start_peer(index) {
                return;
            }
        }
        for client in 0..self.clients.len() {
            let at = self.rng.below(500);
            self.queue.at(at, Event::ClientNext { client });
        }
        self.schedule_faults();
        while let Some((at, event)) = self.queue.pop() {
            if at > self.config.time_limit {
                let masters: Vec<String> = self
                    .peers
                    .iter()
                    .filter_map(|p| p.parts.as_ref().map(|parts| (p.id, parts)))
                    .filter(|(_, parts)| !parts.master.settled())
                    .map(|(id, parts)| format!("{id}: {}", parts.master.describe()))
                    .collect();
                self.fail(format!(
                    "still running at the time limit ({} events queued; masters not settled: {masters:?})",
                    self.queue.len()
                ));
                break;
            }
            self.stats.events += 1;
            self.handle(event);
            self.check_step_invariants();
            if self.failure.is_some() {
                break;
            }
        }
        if self.failure.is_none() {
            super::check::final_checks(self);
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver {
                from,
                to,
                incarnation,
                msg,
            } => self.deliver(from, to, incarnation, msg),
            Event::Apply {
                backup,
                incarnation,
                master,
                body,
            } => self.apply(backup, incarnation, master, body),
            Event::ClientNext { client } => self.client_next(client),
            Event::ClientTimeout {
                client,
                op,
                attempt,
            } => self.client_timeout(client, op, attempt),
            Event::Resend { peer, incarnation } => self.resend(peer, incarnation),
            Event::Crash { peer, tries } => self.crash(peer, tries),
            Event::Detect { peer, incarnation } => self.detect(peer, incarnation),
            Event::Restart { peer } => self.restart(peer),
            Event::TakeBack { peer, incarnation } => self.take_back(peer, incarnation),
            Event::Partition { a, b, one_way } => {
                self.log(format!(
                    "partition {a} -> {b}{}",
                    if one_way { " (one way)" } else { "" }
                ));
                self.net.set_blocked(a, b, true);
                if !one_way {
                    self.net.set_blocked(b, a, true);
                }
            }
            Event::Heal { a, b } => {
                self.log(format!("heal {a} <-> {b}"));
                self.net.set_blocked(a, b, false);
                self.net.set_blocked(b, a, false);
            }
            Event::Pause { peer, until } => self.pause(peer, until),
            Event::Suspect { peer, incarnation } => self.suspect(peer, incarnation),
            Event::Resume { peer, incarnation } => self.resume(peer, incarnation),
            Event::Scan => self.recovery_scan(),
            Event::Migrate { peer } => self.migrate(peer),
            Event::MigrationTimeout { op } => self.migration_timeout(op),
            Event::CopyStep { peer, incarnation } => self.copy_step(peer, incarnation),
            Event::SuperpeerFault { crash } => self.superpeer_fault(crash),
            Event::SuperpeerRestart => self.superpeer_restart(),
            Event::OwnerChangedArrives {
                peer,
                incarnation,
                creator,
                first,
                last,
                owner,
            } => {
                if let Some(parts) = self.parts_of(peer, incarnation) {
                    parts.service.set_owner(creator, first, last, owner);
                    self.log(format!(
                        "OwnerChanged {creator}:{first}..={last} -> {owner} reaches {peer}"
                    ));
                }
            }
            Event::NodeFailedArrives {
                peer,
                incarnation,
                failed,
                zones_end,
            } => {
                if let Some(parts) = self.parts_of(peer, incarnation) {
                    parts.backup.seal_owner(failed, zones_end);
                    self.log(format!("NodeFailed of {failed} reaches {peer}"));
                }
            }
            Event::FailSync { peer, fail } => {
                self.log(format!(
                    "disk of {peer}: syncs {}",
                    if fail { "fail" } else { "work again" }
                ));
                if let Some(index) = self.peer_index(peer) {
                    self.peers[index].storage.set_fail_sync(fail);
                }
            }
        }
    }

    /// Sends `msg` over the simulated network.
    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg) {
        let now = self.queue.now();
        let incarnation = self
            .peer_index(to)
            .map_or(0, |index| self.peers[index].incarnation);
        // The messaging layer never delivers a request twice; duplicates stand for the
        // replication layer's resends, which it must take.
        let may_duplicate = matches!(msg, Msg::Replicate { .. } | Msg::Ack { .. });
        match self.net.send(&mut self.rng, now, from, to, may_duplicate) {
            Fate::Lost(reason) => {
                self.stats.messages_lost += 1;
                self.log(format!("lost {from} -> {to} {} ({reason})", describe(&msg)));
            }
            Fate::Delivered(times) => {
                if times.len() > 1 {
                    self.stats.messages_duplicated += 1;
                }
                for at in times {
                    let msg = msg.clone();
                    self.queue.at(
                        at,
                        Event::Deliver {
                            from,
                            to,
                            incarnation,
                            msg,
                        },
                    );
                }
            }
        }
    }

    fn deliver(&mut self, from: NodeId, to: NodeId, incarnation: u32, msg: Msg) {
        if let Some(reason) = self.net.blocked(from, to) {
            self.log(format!("lost {from} -> {to} {} ({reason})", describe(&msg)));
            return;
        }
        if let Some(client) = self.clients.iter().position(|c| c.id == to) {
            if let Msg::Reply { op, body } = msg {
                self.client_reply(client, from, op, body);
            }
            return;
        }
        let Some(index) = self.peer_index(to) else {
            return;
        };
        let peer = &self.peers[index];
        if peer.incarnation != incarnation || !peer.up() {
            self.log(format!(
                "lost {from} -> {to} {} (receiver down)",
                describe(&msg)
            ));
            return;
        }
        let now = self.queue.now();
        if peer.paused_until > now {
            let at = peer.paused_until;
            self.queue.at(
                at,
                Event::Deliver {
                    from,
                    to,
                    incarnation,
                    msg,
                },
            );
            return;
        }
        match msg {
            Msg::Request { op, body } => self.serve(index, from, op, body),
            Msg::Replicate { body } => {
                // Accepted: the backup's pool thread applies it, one message of a master
                // at a time, after a delay (a slow or busy thread now and then).
                let slow = self.rng.chance(self.scenario.slow_apply_per_mille);
                let delay = if slow {
                    self.rng.between(500, 4_000)
                } else {
                    self.rng.below(60)
                };
                let last = self.peers[index]
                    .apply_order
                    .get(&from)
                    .copied()
                    .unwrap_or(0);
                let at = (now + delay).max(last + 1);
                self.peers[index].apply_order.insert(from, at);
                self.queue.at(
                    at,
                    Event::Apply {
                        backup: to,
                        incarnation,
                        master: from,
                        body,
                    },
                );
            }
            Msg::Ack { body } => self.on_ack(index, from, body),
            // A peer's own request: a migration's insert at its target.
            Msg::Reply { op, body } => self.migration_reply(op, body),
        }
    }
}

/// A short description of a message for the trace.
fn describe(msg: &Msg) -> String {
    match msg {
        Msg::Request { op, body } => match ChunkRequest::decode(body.clone()) {
            Ok(request) => format!("request op{op} {}", request_text(&request)),
            Err(_) => format!("request op{op} (undecodable)"),
        },
        Msg::Reply { op, .. } => format!("reply op{op}"),
        Msg::Replicate { body } => match LogMessage::decode(body.clone()) {
            Ok(m) => format!(
                "replicate stream {} seq {}..{}",
                m.stream,
                m.first_seq,
                m.first_seq + m.ops.len() as u64 - 1
            ),
            Err(_) => "replicate (undecodable)".into(),
        },
        Msg::Ack { body } => match Ack::decode(body.clone()) {
            Ok(a) => format!(
                "ack stream {} applied {} durable {} {:?}",
                a.stream, a.applied_seq, a.durable_seq, a.status
            ),
            Err(_) => "ack (undecodable)".into(),
        },
    }
}

fn request_text(request: &ChunkRequest) -> String {
    match request {
        ChunkRequest::CreateWithData { payloads, .. } => {
            format!(
                "create {:?}",
                payloads.iter().map(|p| value_of(p)).collect::<Vec<_>>()
            )
        }
        ChunkRequest::Get { cids } => format!("get {cids:?}"),
        ChunkRequest::Put { items, .. } => format!(
            "put {:?}",
            items
                .iter()
                .map(|(c, p)| (*c, value_of(p)))
                .collect::<Vec<_>>()
        ),
        ChunkRequest::Remove { cids, .. } => format!("remove {cids:?}"),
        other => format!("{other:?}"),
    }
}

/// The value a payload holds (the first 8 bytes, little-endian).
pub fn value_of(payload: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = payload.len().min(8);
    bytes[..n].copy_from_slice(&payload[..n]);
    u64::from_le_bytes(bytes)
}

impl World {
    /// The current simulated time.
    pub(super) fn now(&self) -> Time {
        self.queue.now()
    }

    /// Every chunk whose create was acknowledged.
    pub(super) fn known_chunks(&self) -> Vec<ChunkId> {
        self.known.clone()
    }

    /// The owner of `cid` in the directory.
    pub(super) fn owner_in_directory(&self, cid: ChunkId) -> NodeId {
        self.meta.lookup(cid).owner
    }

    /// Every live peer's view of the owner of `cid`.
    pub(super) fn ownership_views(&self, cid: ChunkId) -> Vec<(NodeId, NodeId)> {
        self.peers
            .iter()
            .filter_map(|p| {
                p.parts
                    .as_ref()
                    .map(|parts| (p.id, parts.service.owner_of(cid)))
            })
            .collect()
    }

    /// The chunk service of `peer` if it runs.
    pub(super) fn service_of(&self, peer: NodeId) -> Option<Arc<ChunkService>> {
        let index = self.peer_index(peer)?;
        self.peers[index]
            .parts
            .as_ref()
            .map(|p| Arc::clone(&p.service))
    }

    /// What the consistency walkers of the live peers' memory and logs report.
    pub(super) fn consistency_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for peer in &self.peers {
            let Some(parts) = peer.parts.as_ref() else {
                continue;
            };
            if let Err(e) = parts.service.memory().check_consistency() {
                problems.push(format!("memory of {}: {e}", peer.id));
            }
            match parts.backup.engine().check_consistency() {
                Ok(report) if report.violations.is_empty() => {}
                Ok(report) => problems.push(format!("log of {}: {:?}", peer.id, report.violations)),
                // A disk whose syncs failed may leave the engine failed: not a violation.
                Err(_) if self.scenario.disk_faults > 0 => {}
                Err(e) => problems.push(format!("log of {} cannot be walked: {e}", peer.id)),
            }
        }
        problems
    }

    /// Records `what` as the run's failure.
    pub(super) fn record_failure(&mut self, what: String) {
        self.fail(what);
    }
}
