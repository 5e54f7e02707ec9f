//! Simulated time and network: the event queue and the links between simulated nodes.
//!
//! Job: [`Queue`] orders the simulation's events by simulated time (microseconds) and,
//! for equal times, by insertion, so that one seed gives one order. [`SimNet`] decides
//! the fate of every message: lost (a drop fault, a partition, a one-way link, a fenced
//! sender), delivered after a seeded delay, or delivered twice.
//!
//! Invariants:
//! - Within one directed connection `from → to` messages are delivered in send order
//!   (as the messaging layer guarantees over its one TCP connection per node pair); a
//!   duplicate follows its original directly. Messages of different connections are
//!   reordered freely by their delays.
//! - A link blocked when a message is sent or when it would be delivered loses it; a
//!   fenced node's messages are lost from the fence on (the messaging layer drops them).
//!
//! Callers: the event loop (`sim::world`).

use std::collections::{BTreeMap, BTreeSet};

use myriad_types::NodeId;

use super::rng::SimRng;

/// Simulated time in microseconds since the start of a run.
pub type Time = u64;

/// Events ordered by simulated time, then by insertion.
#[derive(Debug)]
pub struct Queue<E> {
    events: BTreeMap<(Time, u64), E>,
    inserted: u64,
    now: Time,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Queue {
            events: BTreeMap::new(),
            inserted: 0,
            now: 0,
        }
    }
}

impl<E> Queue<E> {
    /// The current simulated time (the time of the event taken last).
    pub fn now(&self) -> Time {
        self.now
    }

    /// Schedules `event` at `at` (not before now).
    pub fn at(&mut self, at: Time, event: E) {
        self.inserted += 1;
        self.events.insert((at.max(self.now), self.inserted), event);
    }

    /// Schedules `event` `after` microseconds from now.
    pub fn after(&mut self, after: Time, event: E) {
        self.at(self.now + after, event);
    }

    /// Takes the next event and advances the time to it.
    pub fn pop(&mut self) -> Option<(Time, E)> {
        let ((at, _), event) = self.events.pop_first()?;
        self.now = at;
        Some((at, event))
    }

    /// Takes out every event for which `pick` holds, in queue order (they happen "now":
    /// used at interleaving points).
    pub fn take_where(&mut self, mut pick: impl FnMut(&E) -> bool) -> Vec<E> {
        let keys: Vec<(Time, u64)> = self
            .events
            .iter()
            .filter(|(_, event)| pick(event))
            .map(|(key, _)| *key)
            .collect();
        keys.into_iter()
            .filter_map(|key| self.events.remove(&key))
            .collect()
    }

    /// Events still queued.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event is queued.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// The network's faults while they are switched on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetFaults {
    /// Messages lost, per mille.
    pub drop_per_mille: u32,
    /// Messages delivered twice, per mille.
    pub duplicate_per_mille: u32,
    /// Smallest one-way delay (µs).
    pub delay_min: Time,
    /// Largest one-way delay (µs).
    pub delay_max: Time,
}

impl Default for NetFaults {
    fn default() -> Self {
        NetFaults {
            drop_per_mille: 0,
            duplicate_per_mille: 0,
            delay_min: 20,
            delay_max: 200,
        }
    }
}

/// The simulated links between nodes.
#[derive(Debug, Default)]
pub struct SimNet {
    /// Faults applied to every message.
    pub faults: NetFaults,
    /// Blocked directions `from → to` (a partition blocks both, a one-way link one).
    blocked: BTreeSet<(NodeId, NodeId)>,
    /// Nodes whose messages are dropped (fenced by the superpeers).
    fenced: BTreeSet<NodeId>,
    /// Per connection, the delivery time of its last message (order within a connection).
    last: BTreeMap<(NodeId, NodeId), Time>,
}

/// What happens to one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Lost, with the reason for the trace.
    Lost(&'static str),
    /// Delivered at these times (two for a duplicate).
    Delivered(Vec<Time>),
}

impl SimNet {
    /// Whether messages `from → to` are lost now.
    pub fn blocked(&self, from: NodeId, to: NodeId) -> Option<&'static str> {
        if self.fenced.contains(&from) {
            Some("sender fenced")
        } else if self.blocked.contains(&(from, to)) {
            Some("link down")
        } else {
            None
        }
    }

    /// Decides the fate of a message sent `from → to` at `now` (delivered twice only if
    /// `may_duplicate`).
    pub fn send(
        &mut self,
        rng: &mut SimRng,
        now: Time,
        from: NodeId,
        to: NodeId,
        may_duplicate: bool,
    ) -> Fate {
        if let Some(reason) = self.blocked(from, to) {
            return Fate::Lost(reason);
        }
        if rng.chance(self.faults.drop_per_mille) {
            return Fate::Lost("dropped");
        }
        let delay = rng.between(self.faults.delay_min, self.faults.delay_max);
        let last = self.last.entry((from, to)).or_insert(0);
        let at = (now + delay).max(*last + 1);
        *last = at;
        let mut times = vec![at];
        if may_duplicate && rng.chance(self.faults.duplicate_per_mille) {
            *last = at + 1;
            times.push(at + 1);
        }
        Fate::Delivered(times)
    }

    /// Blocks (or unblocks) the direction `from → to`.
    pub fn set_blocked(&mut self, from: NodeId, to: NodeId, blocked: bool) {
        if blocked {
            self.blocked.insert((from, to));
        } else {
            self.blocked.remove(&(from, to));
        }
    }

    /// Fences `node` (its messages are dropped until [`SimNet::unfence`]).
    pub fn fence(&mut self, node: NodeId) {
        self.fenced.insert(node);
    }

    /// Lifts the fence of `node` (a restarted incarnation joins again).
    pub fn unfence(&mut self, node: NodeId) {
        self.fenced.remove(&node);
    }

    /// Heals every partition and one-way link.
    pub fn heal_all(&mut self) {
        self.blocked.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_keeps_its_order_and_a_block_loses_messages() {
        let mut net = SimNet {
            faults: NetFaults {
                delay_min: 1,
                delay_max: 500,
                duplicate_per_mille: 300,
                ..NetFaults::default()
            },
            ..SimNet::default()
        };
        let mut rng = SimRng::new(7);
        let (a, b) = (NodeId(1), NodeId(2));
        let mut last = 0;
        for now in 0..200 {
            let Fate::Delivered(times) = net.send(&mut rng, now, a, b, true) else {
                panic!("nothing is dropped");
            };
            for at in times {
                assert!(at > last, "out of order within a connection");
                last = at;
            }
        }
        net.set_blocked(a, b, true);
        assert_eq!(net.send(&mut rng, 300, a, b, true), Fate::Lost("link down"));
        assert!(matches!(
            net.send(&mut rng, 300, b, a, true),
            Fate::Delivered(_)
        ));
        net.fence(b);
        assert_eq!(
            net.send(&mut rng, 300, b, a, true),
            Fate::Lost("sender fenced")
        );
    }

    #[test]
    fn the_queue_orders_by_time_then_insertion() {
        let mut queue = Queue::default();
        queue.at(5, "c");
        queue.at(1, "a");
        queue.at(5, "d");
        queue.at(1, "b");
        let order: Vec<&str> = std::iter::from_fn(|| queue.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, ["a", "b", "c", "d"]);
    }
}
