//! Failure detection: which nodes this superpeer watches, the heartbeats, the verdicts.
//!
//! Every alive superpeer watches the peers and clients whose ID maps to it: the alive
//! superpeers sorted by ID, index `id % count`, recomputed every tick from the applied node
//! table and from which superpeers answered their own heartbeats recently. A watched node
//! is pinged every `heartbeat_interval`; one that answered nothing for `failure_timeout`,
//! or whose connection was lost and whose address then refuses connections, gets a
//! verdict (`Command::Fail` through the leader). Every heartbeat acknowledges the node's
//! last reply received, which renews the node's lease (`myriad_membership::lease`): a node
//! stops serving chunks before silence can make it failed. Views of superpeer liveness may differ
//! for a moment: a node is then watched twice or briefly not at all, never wrongly failed
//! for that reason alone.
//!
//! A watch belongs to one incarnation of a node: when a node restarts (a new incarnation
//! joins under its ID) its silence so far is forgotten, and a verdict whose node rejoined
//! meanwhile is dropped.
//!
//! Only silence the watcher saw while it was running counts: when a tick comes late (this
//! superpeer was stalled: CPU starvation, a blocked write to its log file, a paused VM),
//! the stall is added to every watch's last answer, so that a node is never declared
//! failed because its watcher could not listen.

use std::collections::HashMap;
use std::sync::Arc;

use myriad_meta::{NodeState, Role};
use myriad_net::CloseReason;
use myriad_types::NodeId;
use parking_lot::Mutex;
use tokio::time::{Instant, MissedTickBehavior};

use super::Core;

/// What the watcher knows of one node.
#[derive(Debug, Clone, Copy)]
struct Watched {
    last_ok: Instant,
    /// The number of the last reply received (acknowledged by the next heartbeat).
    acked: u64,
    in_flight: bool,
    verdict: bool,
    /// The incarnation watched (a restarted node's new incarnation starts a new watch).
    incarnation: u32,
}

#[derive(Default)]
struct WatchState {
    nodes: HashMap<NodeId, Watched>,
    superpeers: HashMap<NodeId, Watched>,
    /// When the last tick ran.
    last_tick: Option<Instant>,
}

impl WatchState {
    /// Forgives silence that fell into a stall of this watcher: a tick more than two
    /// intervals after the previous one moves every last answer forward by the time
    /// beyond one interval.
    fn forgive_stall(&mut self, now: Instant, interval: std::time::Duration) {
        let Some(last) = self.last_tick.replace(now) else {
            return;
        };
        let gap = now.saturating_duration_since(last);
        if gap <= interval * 2 {
            return;
        }
        let stall = gap - interval;
        for watched in self.nodes.values_mut().chain(self.superpeers.values_mut()) {
            watched.last_ok = (watched.last_ok + stall).min(now);
        }
    }
}

/// The sorted alive superpeers and which of them watches `node`.
pub(crate) fn watcher_of(alive_superpeers: &[NodeId], node: NodeId) -> Option<NodeId> {
    if alive_superpeers.is_empty() {
        return None;
    }
    let index = usize::from(node.0) % alive_superpeers.len();
    alive_superpeers.get(index).copied()
}

/// Runs until the superpeer stops.
pub(crate) async fn run(core: Arc<Core>) {
    let state = Arc::new(Mutex::new(WatchState::default()));
    {
        let now = Instant::now();
        let mut state = state.lock();
        for (id, _) in core.members() {
            if id != core.id() {
                state.superpeers.insert(
                    id,
                    Watched {
                        last_ok: now,
                        acked: 0,
                        in_flight: false,
                        verdict: false,
                        incarnation: 0,
                    },
                );
            }
        }
    }
    let mut ticker = tokio::time::interval(core.heartbeat_interval());
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut lost = core.net.subscribe();
    loop {
        if core.stopping() {
            return;
        }
        tokio::select! {
            _ = ticker.tick() => tick(&core, &state),
            event = lost.recv() => {
                let Some(event) = event else { return };
                if !matches!(event.reason, CloseReason::PeerClosed | CloseReason::Io(_)) {
                    continue;
                }
                let node = event.node;
                if state.lock().nodes.contains_key(&node) {
                    let core = core.clone();
                    tokio::spawn(async move {
                        core.check_node(node, "connection lost and ping failed").await;
                    });
                }
            }
        }
    }
}

fn tick(core: &Arc<Core>, state: &Arc<Mutex<WatchState>>) {
    let Some(raft) = core.raft() else {
        return;
    };
    let now = Instant::now();
    let timeout = core.failure_timeout();
    let nodes: Vec<(NodeId, u32)> = raft.read_local(|meta| {
        meta.nodes()
            .filter(|record| record.state == NodeState::Alive && record.role != Role::Superpeer)
            .map(|record| (record.id, record.incarnation))
            .collect()
    });
    let mut guard = state.lock();
    guard.forgive_stall(now, core.heartbeat_interval());
    // Superpeers: ping the others, count those that answered recently.
    let mut alive = vec![core.id()];
    let superpeer_ids: Vec<NodeId> = guard.superpeers.keys().copied().collect();
    for id in superpeer_ids {
        let Some(entry) = guard.superpeers.get_mut(&id) else {
            continue;
        };
        if now.duration_since(entry.last_ok) <= timeout {
            alive.push(id);
        }
        if !entry.in_flight {
            entry.in_flight = true;
            spawn_ping(core, state, id, true, entry.acked);
        }
    }
    alive.sort();
    // Nodes this superpeer watches.
    let mine: Vec<(NodeId, u32)> = nodes
        .into_iter()
        .filter(|(node, _)| watcher_of(&alive, *node) == Some(core.id()))
        .collect();
    guard
        .nodes
        .retain(|node, watched| mine.contains(&(*node, watched.incarnation)));
    for (node, incarnation) in mine {
        let entry = guard.nodes.entry(node).or_insert(Watched {
            last_ok: now,
            acked: 0,
            in_flight: false,
            verdict: false,
            incarnation,
        });
        if entry.verdict {
            continue;
        }
        if now.duration_since(entry.last_ok) > timeout {
            entry.verdict = true;
            let core = core.clone();
            let state = state.clone();
            let silent_ms = now.duration_since(entry.last_ok).as_millis() as u64;
            tokio::spawn(async move {
                let why = format!("no heartbeat reply for {silent_ms} ms");
                let same = core.raft().is_some_and(|raft| {
                    raft.read_local(|meta| {
                        meta.node(node).is_some_and(|record| {
                            record.incarnation == incarnation && record.state == NodeState::Alive
                        })
                    })
                });
                // A new incarnation joined since the silence began: it gets its own watch.
                let settled = !same || core.verdict(node, incarnation, &why).await;
                if !settled {
                    if let Some(entry) = state.lock().nodes.get_mut(&node) {
                        entry.verdict = false;
                    }
                }
            });
            continue;
        }
        if !entry.in_flight {
            entry.in_flight = true;
            spawn_ping(core, state, node, false, entry.acked);
        }
    }
}

fn spawn_ping(
    core: &Arc<Core>,
    state: &Arc<Mutex<WatchState>>,
    node: NodeId,
    superpeer: bool,
    acked: u64,
) {
    let core = core.clone();
    let state = state.clone();
    tokio::spawn(async move {
        let answered = core.ping(node, acked).await;
        let mut guard = state.lock();
        let map = if superpeer {
            &mut guard.superpeers
        } else {
            &mut guard.nodes
        };
        if let Some(entry) = map.get_mut(&node) {
            entry.in_flight = false;
            if let Ok(reply) = answered {
                // Arrival time: later than the reply's sending, from which the node counts
                // the lease this number renews.
                entry.last_ok = Instant::now();
                entry.acked = entry.acked.max(reply.nonce);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(last_ok: Instant) -> Watched {
        Watched {
            last_ok,
            acked: 0,
            in_flight: false,
            verdict: false,
            incarnation: 1,
        }
    }

    /// Silence during a stall of the watcher itself is forgiven; silence while it ticked
    /// on time is not.
    #[test]
    fn a_stalled_watcher_does_not_count_its_stall_as_silence() {
        let interval = std::time::Duration::from_millis(100);
        let start = Instant::now();
        let mut state = WatchState::default();
        state.nodes.insert(NodeId(5), watched(start));
        state.superpeers.insert(NodeId(2), watched(start));
        state.forgive_stall(start, interval);
        // On time: nothing changes.
        state.forgive_stall(start + interval, interval);
        assert_eq!(state.nodes[&NodeId(5)].last_ok, start);
        // A 1.1 s stall: the last answer moves forward by 1 s (the gap beyond one tick).
        let late = start + interval + std::time::Duration::from_millis(1100);
        state.forgive_stall(late, interval);
        let moved = start + std::time::Duration::from_millis(1000);
        assert_eq!(state.nodes[&NodeId(5)].last_ok, moved);
        assert_eq!(state.superpeers[&NodeId(2)].last_ok, moved);
        // Never beyond now.
        let mut fresh = WatchState::default();
        fresh.nodes.insert(NodeId(7), watched(late));
        fresh.last_tick = Some(start);
        fresh.forgive_stall(late, interval);
        assert_eq!(fresh.nodes[&NodeId(7)].last_ok, late);
    }

    #[test]
    fn watchers_spread_nodes_over_alive_superpeers() {
        let alive = [NodeId(1), NodeId(2), NodeId(3)];
        assert_eq!(watcher_of(&alive, NodeId(4)), Some(NodeId(2)));
        assert_eq!(watcher_of(&alive, NodeId(6)), Some(NodeId(1)));
        assert_eq!(watcher_of(&alive[..2], NodeId(5)), Some(NodeId(2)));
        assert_eq!(watcher_of(&[], NodeId(5)), None);
    }
}
