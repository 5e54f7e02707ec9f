//! Faults of the event loop: crashes, partitions, pauses, failing disks; the masters'
//! invariants checked after every event.
//!
//! Job: [`World::schedule_faults`] draws the run's faults from the seed. A crash loses a
//! peer's memory and tears its disk (detection, recovery and restart are the superpeers'
//! part, `meta.rs`). A crash is drawn only when the cluster is back at full strength from
//! the previous one (every peer up, every zone recovered and settled, every zone at R
//! backups with their copies acknowledged): then a second crash cannot lose an
//! acknowledged write, and one that finds the cluster weaker waits (bounded tries).
//!
//! Invariants: at most [`super::super::SimConfig::crashes_max`] crashes per run; every
//! zone's backups at its master are distinct and never its owner nor the master
//! (checked after every event).
//!
//! Callers: [`super::World`]'s event dispatch and [`super::World::run`].

use super::*;

/// A stall longer than this gets a peer declared failed (the failure detector's timeout).
pub(super) const SUSPECT_AFTER: Time = 3_000;
/// How often a crash that would find the cluster not at full strength is tried again.
const CRASH_TRIES: u32 = 20;
/// The pause between two tries.
const CRASH_RETRY: Time = 2_000;

impl World {
    /// Draws the run's faults from the seed and schedules them.
    pub(super) fn schedule_faults(&mut self) {
        let horizon = self.config.fault_horizon;
        let peers: Vec<NodeId> = self.peers.iter().map(|p| p.id).collect();
        for _ in 0..self.scenario.crashes {
            let peer = peers[self.rng.index(peers.len())];
            let at = self.rng.between(2_000, horizon);
            self.queue.at(
                at,
                Event::Crash {
                    peer,
                    tries: CRASH_TRIES,
                },
            );
        }
        for _ in 0..self.scenario.partitions {
            let a = peers[self.rng.index(peers.len())];
            let b = peers[self.rng.index(peers.len())];
            if a == b {
                continue;
            }
            let at = self.rng.below(horizon);
            let one_way = self.rng.chance(500);
            self.queue.at(at, Event::Partition { a, b, one_way });
            let heal = at + self.rng.between(1_000, 15_000);
            self.queue.at(heal, Event::Heal { a, b });
        }
        for _ in 0..self.scenario.pauses {
            let peer = peers[self.rng.index(peers.len())];
            let at = self.rng.below(horizon);
            // A long stall (a GC pause, a VM freeze) outlasts the failure detector.
            let long = self.rng.chance(self.scenario.long_pause_per_mille);
            let until = at
                + if long {
                    self.rng
                        .between(SUSPECT_AFTER + 1_000, SUSPECT_AFTER + 8_000)
                } else {
                    self.rng.between(500, 8_000)
                };
            self.queue.at(at, Event::Pause { peer, until });
        }
        for _ in 0..self.scenario.migrations {
            let peer = peers[self.rng.index(peers.len())];
            let at = self.rng.between(1_000, 3 * horizon);
            self.queue.at(at, Event::Migrate { peer });
        }
        for _ in 0..self.scenario.disk_faults {
            let peer = peers[self.rng.index(peers.len())];
            let at = self.rng.below(horizon);
            self.queue.at(at, Event::FailSync { peer, fail: true });
            let end = at + self.rng.between(1_000, 10_000);
            self.queue.at(end, Event::FailSync { peer, fail: false });
        }
    }

    /// Crashes `peer` unless the cluster is not back to full strength from the last
    /// crash yet (a peer down, a zone not recovered or settled, a copy to an added
    /// backup not acknowledged): then the crash is tried again later (bounded).
    pub(super) fn crash(&mut self, peer: NodeId, tries: u32) {
        let Some(index) = self.peer_index(peer) else {
            return;
        };
        if self.crashes.len() >= self.config.crashes_max {
            self.log(format!("crash of {peer} skipped (the budget is spent)"));
            return;
        }
        if let Some(why) = self.not_at_full_strength() {
            if tries > 0 {
                self.queue.after(
                    CRASH_RETRY,
                    Event::Crash {
                        peer,
                        tries: tries - 1,
                    },
                );
            } else {
                self.log(format!("crash of {peer} skipped ({why})"));
            }
            return;
        }
        let zones = self.peers[index]
            .parts
            .as_ref()
            .map(|p| p.master.describe());
        self.log(format!("CRASH {peer} ({zones:?})"));
        let tear = self.rng.next_u64();
        self.peers[index].crash(tear);
        self.crashes.push(self.queue.now());
        self.stats.crashes += 1;
        let incarnation = self.peers[index].incarnation;
        let detect = self.rng.between(200, 3_000);
        self.queue
            .after(detect, Event::Detect { peer, incarnation });
    }

    /// `peer` stalls until `until`: it applies and serves nothing meanwhile, its timers
    /// fire late. A stall longer than [`SUSPECT_AFTER`] gets it suspected: the failure
    /// detector's verdict comes while it still holds its memory (drawn like a crash: only
    /// at full strength, within the crash budget).
    pub(super) fn pause(&mut self, peer: NodeId, until: Time) {
        let Some(index) = self.peer_index(peer) else {
            return;
        };
        if !self.peers[index].up() {
            return;
        }
        let now = self.queue.now();
        let suspected = until > now + SUSPECT_AFTER
            && self.crashes.len() < self.config.crashes_max
            && self.not_at_full_strength().is_none();
        self.log(format!(
            "pause {peer} until {until}us{}",
            if suspected {
                " (long: it will be suspected)"
            } else {
                ""
            }
        ));
        self.peers[index].paused_until = until;
        if suspected {
            // Counted like a crash: the cluster recovers its zones.
            self.suspects.insert(peer);
            self.crashes.push(now);
            self.stats.crashes += 1;
            let incarnation = self.peers[index].incarnation;
            self.queue
                .after(SUSPECT_AFTER, Event::Suspect { peer, incarnation });
            self.queue.at(until, Event::Resume { peer, incarnation });
        }
    }

    /// A suspected peer's stall ended: its self-watch finds the verdict and switches its
    /// chunk service to refusing everything (the production
    /// [`ChunkService::declare_failed`]); the process then exits and is started again
    /// (memory lost, disk kept).
    pub(super) fn resume(&mut self, peer: NodeId, incarnation: u32) {
        let Some(index) = self.peer_index(peer) else {
            return;
        };
        self.suspects.remove(&peer);
        if self.peers[index].incarnation != incarnation {
            return;
        }
        let Some(parts) = self.peers[index].parts.as_ref() else {
            return;
        };
        parts.service.declare_failed();
        self.log(format!(
            "RESUME {peer}: it finds itself declared failed, refuses everything and exits"
        ));
        let tear = self.rng.next_u64();
        self.peers[index].crash(tear);
        let restart = self.rng.between(500, 4_000);
        self.queue.after(restart, Event::Restart { peer });
    }

    /// Why another crash could lose acknowledged data now, if it could.
    fn not_at_full_strength(&self) -> Option<String> {
        if let Some(down) = self.peers.iter().find(|p| !p.up()) {
            return Some(format!("{} is down", down.id));
        }
        if let Some(stalled) = self.suspects.iter().next() {
            return Some(format!("{stalled} stalls long enough to be suspected"));
        }
        if let Some(gone) = self
            .meta
            .nodes()
            .find(|r| r.state != myriad_meta::NodeState::Alive)
        {
            return Some(format!("{} is declared failed", gone.id));
        }
        if let Some((owner, zone, _)) = self.meta.zones_to_recover().next() {
            return Some(format!("zone {owner}/{zone} is not recovered"));
        }
        if let Some((owner, zone, _)) = self
            .meta
            .zones()
            .find(|(owner, zone, _)| !self.meta.zone_settled(*owner, *zone))
        {
            return Some(format!("zone {owner}/{zone} is not settled"));
        }
        if let Some((owner, zone, _)) = self
            .meta
            .zones()
            .find(|(owner, zone, _)| !self.meta.zone_filling(*owner, *zone).is_empty())
        {
            return Some(format!(
                "zone {owner}/{zone} has a backup still being filled"
            ));
        }
        for peer in &self.peers {
            let Some(parts) = peer.parts.as_ref() else {
                continue;
            };
            // A copy to an added backup still running (the backup is *filling* until
            // its copy is on its disk and `ZoneFilled` committed).
            if parts.master.replicator().copies_waiting() {
                return Some(format!(
                    "{} copies a zone to an added backup: {}",
                    peer.id,
                    parts.master.describe()
                ));
            }
            let stats = parts.master.replicator().stats();
            if let Some(zone) = stats
                .zones
                .iter()
                .find(|z| z.backups.len() < self.config.backups)
            {
                return Some(format!(
                    "zone {} ({:?}) at {} has backups {:?} only",
                    zone.zone, zone.adopted_from, peer.id, zone.backups
                ));
            }
        }
        None
    }

    /// The invariants cheap enough to check after every event.
    pub(super) fn check_step_invariants(&mut self) {
        let mut problems = Vec::new();
        for peer in &self.peers {
            let Some(parts) = peer.parts.as_ref() else {
                continue;
            };
            for zone in parts.master.replicator().stats().zones {
                let owner = zone.adopted_from.map_or(peer.id, |(owner, _)| owner);
                let backups = &zone.backups;
                let distinct: BTreeSet<NodeId> = backups.iter().copied().collect();
                if distinct.len() != backups.len()
                    || distinct.contains(&peer.id)
                    || distinct.contains(&owner)
                {
                    problems.push(format!(
                        "zone {} ({:?}) at {}: backups {backups:?} not distinct or include the owner",
                        zone.zone, zone.adopted_from, peer.id
                    ));
                }
            }
        }
        for problem in problems {
            self.fail(problem);
        }
    }
}

/// Whether an encoded request is a read.
pub(super) fn is_get(body: &Bytes) -> bool {
    matches!(
        ChunkRequest::decode(body.clone()),
        Ok(ChunkRequest::Get { .. })
    )
}

/// Locks a mutex of the simulator (a panic in a hook leaves usable data).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
