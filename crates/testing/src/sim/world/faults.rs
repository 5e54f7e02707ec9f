//! Faults and the superpeer's part of the event loop: crashes, failure detection and
//! recovery, restarts, partitions, pauses, failing disks; the invariants checked after
//! every event.
//!
//! Job: [`World::schedule_faults`] draws the run's faults from the seed. A crash loses a
//! peer's memory and tears its disk; the superpeer (simulator code) detects it after a
//! delay, fences it, has each of its zones read back by the first live backup with the
//! production [`BackupService::recover_zone`] — at the read's interleaving point the
//! messages of the failed peer that backup had already accepted are applied, as a pool
//! thread still busy with them would — puts the chunks into the restorer's memory and
//! moves the ranges. A restarted peer reopens its log engine from its disk, records its
//! earlier IDs as owned by [`NOBODY`], and later takes them back with the production
//! [`ChunkService::take_back_earlier_ids`], with the client requests already on their
//! way to it served at its interleaving point.
//!
//! Invariants: at most [`super::super::SimConfig::crashes_max`] crashes per run, never of
//! a peer whose zones' data would otherwise be lost (the last live backup of a zone);
//! every zone's backups are distinct and never its owner (checked after every event).
//!
//! Callers: [`super::World`]'s event dispatch and [`super::World::run`].

use myriad_backup_log::LogError;
use myriad_replication::BackupError;

use super::*;

impl World {
    /// Draws the run's faults from the seed and schedules them.
    pub(super) fn schedule_faults(&mut self) {
        let horizon = self.config.fault_horizon;
        let peers: Vec<NodeId> = self.peers.iter().map(|p| p.id).collect();
        for _ in 0..self.scenario.crashes {
            let peer = peers[self.rng.index(peers.len())];
            let at = self.rng.between(2_000, horizon);
            self.queue.at(at, Event::Crash { peer });
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
            let until = at + self.rng.between(500, 8_000);
            self.queue.at(at, Event::Pause { peer, until });
        }
        for _ in 0..self.scenario.disk_faults {
            let peer = peers[self.rng.index(peers.len())];
            let at = self.rng.below(horizon);
            self.queue.at(at, Event::FailSync { peer, fail: true });
            let end = at + self.rng.between(1_000, 10_000);
            self.queue.at(end, Event::FailSync { peer, fail: false });
        }
    }

    /// Crashes `peer` unless that would lose data the simulated cluster promises to keep.
    pub(super) fn crash(&mut self, peer: NodeId) {
        let Some(index) = self.peer_index(peer) else {
            return;
        };
        let down = self.peers.iter().filter(|p| !p.up()).count();
        if !self.peers[index].up() || down > 0 || self.crashes.len() >= self.config.crashes_max {
            self.log(format!(
                "crash of {peer} skipped (a peer is down or the budget is spent)"
            ));
            return;
        }
        let zone_backups = self.peers[index]
            .parts
            .as_ref()
            .map(|p| (p.master.zone, p.master.backups.clone()));
        self.log(format!("CRASH {peer} (zone and backups {zone_backups:?})"));
        let tear = self.rng.next_u64();
        self.peers[index].crash(tear);
        self.crashes.push(self.queue.now());
        self.stats.crashes += 1;
        let incarnation = self.peers[index].incarnation;
        let detect = self.rng.between(200, 3_000);
        self.queue
            .after(detect, Event::Detect { peer, incarnation });
        if let Some(zone) = zone_backups {
            self.lost_zones.push((peer, zone.0, zone.1));
        }
    }

    /// The superpeer detected the failure of `peer`: fence it, recover its zones.
    pub(super) fn recover(&mut self, peer: NodeId, incarnation: u32) {
        let Some(index) = self.peer_index(peer) else {
            return;
        };
        if self.peers[index].incarnation != incarnation {
            return;
        }
        self.log(format!(
            "DETECT failure of {peer}: fenced, recovering its zones"
        ));
        self.net.fence(peer);
        // No zone of the other masters keeps the failed peer as a backup.
        for other in &mut self.peers {
            if let Some(parts) = other.parts.as_mut() {
                parts.master.backups.retain(|&b| b != peer);
            }
        }
        for other in 0..self.peers.len() {
            self.release(other);
        }
        let zones: Vec<(NodeId, u32, Vec<NodeId>)> = std::mem::take(&mut self.lost_zones);
        for (owner, zone, backups) in zones {
            self.recover_zone(owner, zone, &backups, incarnation);
        }
        let restart = self.rng.between(500, 6_000);
        self.queue.after(restart, Event::Restart { peer });
    }

    /// Reads `owner`'s zone back at its first live backup that can (the next one if a
    /// read fails) and makes that backup the owner of the zone's IDs.
    fn recover_zone(&mut self, owner: NodeId, zone: u32, backups: &[NodeId], incarnation: u32) {
        let live: Vec<NodeId> = backups
            .iter()
            .copied()
            .filter(|&b| self.peer_index(b).is_some_and(|i| self.peers[i].up()))
            .collect();
        for restorer in live {
            let Some(restored) = self.read_at(owner, zone, restorer) else {
                continue;
            };
            let Some(service) = self.service_of(restorer) else {
                continue;
            };
            let items: Vec<(ChunkId, &[u8])> = restored
                .iter()
                .map(|(cid, data)| (ChunkId::from_raw(*cid), &data[..]))
                .collect();
            for (item, result) in items.iter().zip(service.memory().create_with_ids(&items)) {
                if let Err(e) = result {
                    self.fail(format!("restoring {} at {restorer}: {e}", item.0));
                }
            }
            let last = (u64::from(incarnation) << LID_SHIFT) - 1;
            let values: Vec<(ChunkId, u64)> =
                items.iter().map(|(c, d)| (*c, value_of(d))).collect();
            self.log(format!(
                "RECOVERED zone {zone} of {owner} at {restorer}: {values:?}; lids 0..={last} now at {restorer}"
            ));
            self.stats.chunks_recovered += items.len() as u64;
            self.move_range(owner, 0, last, restorer);
            self.restored.insert(owner, vec![(0, last, restorer)]);
            return;
        }
        self.fail(format!(
            "no live backup could restore zone {zone} of {owner}"
        ));
    }

    /// One attempt to read `owner`'s zone back at `restorer`: the chunks, sorted, or
    /// `None` if the read failed (logged).
    fn read_at(
        &mut self,
        owner: NodeId,
        zone: u32,
        restorer: NodeId,
    ) -> Option<Vec<(u64, Vec<u8>)>> {
        let index = self.peer_index(restorer)?;
        let backup = Arc::clone(&self.peers[index].parts.as_ref()?.backup);
        // The failed owner's messages this backup accepted but has not applied yet: a
        // busy pool thread applies them while the recovery runs.
        let accepted: Vec<Bytes> = self
            .queue
            .take_where(|event| matches!(event, Event::Apply { backup: b, master, .. } if *b == restorer && *master == owner))
            .into_iter()
            .filter_map(|event| match event {
                Event::Apply { body, .. } => Some(body),
                _ => None,
            })
            .collect();
        let during_read = self.rng.chance(700);
        // The engine's flusher thread (slowed to hour intervals here) may run meanwhile.
        let flusher_runs = self.rng.chance(500);
        let pending = if during_read {
            accepted.clone()
        } else {
            Vec::new()
        };
        let (result, lines, mut restored) =
            read_zone(&backup, (owner, zone, restorer), pending, flusher_runs);
        for line in lines {
            self.log(line);
        }
        if !during_read {
            for body in accepted {
                let ack = apply_now(&backup, owner, body);
                self.log(format!(
                    "  after the read: {restorer} applies a message of {owner}: {ack:?}"
                ));
            }
        }
        match result {
            Ok(_) => {}
            // Nothing of the zone ever reached this backup: nothing to restore.
            Err(BackupError::Log(LogError::UnknownZone(_))) => restored.clear(),
            Err(e) => {
                self.log(format!(
                    "recovery of zone {zone} of {owner} at {restorer} failed: {e}"
                ));
                return None;
            }
        }
        restored.sort();
        Some(restored)
    }

    /// The superpeer moves `creator`'s IDs `first..=last` to `owner` and tells every live
    /// peer (ownership events).
    fn move_range(&mut self, creator: NodeId, first: u64, last: u64, owner: NodeId) {
        self.directory
            .ranges
            .entry(creator)
            .or_default()
            .push((first, last, owner));
        for peer in &self.peers {
            if let Some(parts) = peer.parts.as_ref() {
                if peer.id != creator {
                    parts.service.set_owner(creator, first, last, owner);
                }
            }
        }
    }

    /// Restarts `peer` (a new incarnation over its old disk).
    pub(super) fn restart(&mut self, peer: NodeId) {
        let Some(index) = self.peer_index(peer) else {
            return;
        };
        let backups = self.choose_backups(peer);
        let bug = self.config.bug == Some(Bug::NoRecoveryFreeze);
        if let Err(e) = self.peers[index].start(backups.clone(), bug) {
            self.fail(format!("restart of {peer}: {e}"));
            return;
        }
        let Some(parts) = self.peers[index].parts.as_ref() else {
            return;
        };
        if self.config.bug == Some(Bug::IdsBeforeRanges) {
            parts.service.reintroduce_ids_before_ranges_bug();
        }
        // Its earlier IDs answer NotOwner until the old zones settled; the other creators'
        // ranges come from the directory (the peer's ownership sync at start).
        let lid_base = parts.lid_base;
        parts.service.set_owner(peer, 0, lid_base - 1, NOBODY);
        for (creator, ranges) in &self.directory.ranges {
            if *creator != peer {
                parts.service.set_owners(*creator, ranges);
            }
        }
        self.net.unfence(peer);
        let incarnation = self.peers[index].incarnation;
        self.log(format!(
            "RESTART {peer} incarnation {incarnation} lid base {lid_base} backups {backups:?}"
        ));
        self.schedule_resend(index);
        let settle = self.rng.between(100, 4_000);
        self.queue
            .after(settle, Event::TakeBack { peer, incarnation });
    }

    /// The restarted `peer`'s old zones settled: it takes its earlier IDs back. Client
    /// reads already on their way to it are served at the call's interleaving point.
    pub(super) fn take_back(&mut self, peer: NodeId, incarnation: u32) {
        let Some(index) = self.peer_index(peer) else {
            return;
        };
        if self.peers[index].incarnation != incarnation {
            return;
        }
        let Some(parts) = self.peers[index].parts.as_ref() else {
            return;
        };
        let service = Arc::clone(&parts.service);
        let lid_base = parts.lid_base;
        let restored = self.restored.get(&peer).cloned().unwrap_or_default();
        let arriving: Vec<(NodeId, u64, Bytes)> = self
            .queue
            .take_where(|event| match event {
                Event::Deliver {
                    to,
                    incarnation: i,
                    msg: Msg::Request { body, .. },
                    ..
                } => *to == peer && *i == incarnation && is_get(body),
                _ => false,
            })
            .into_iter()
            .filter_map(|event| match event {
                Event::Deliver {
                    from,
                    msg: Msg::Request { op, body },
                    ..
                } => Some((from, op, body)),
                _ => None,
            })
            .collect();
        let served = Arc::new(Mutex::new(Vec::new()));
        {
            let (served, hook_service) = (Arc::clone(&served), Arc::clone(&service));
            let arriving = Mutex::new(arriving);
            interleave::with_hook(
                move |point| {
                    for (client, op, body) in std::mem::take(&mut *lock(&arriving)) {
                        let reply = hook_service.serve(client, body);
                        lock(&served).push((point, client, op, reply));
                    }
                },
                || service.take_back_earlier_ids(lid_base, &restored),
            );
        }
        self.log(format!(
            "TAKE BACK {peer}: earlier ids 0..{lid_base} except {restored:?}"
        ));
        for (point, client, op, reply) in std::mem::take(&mut *lock(&served)) {
            let text = ChunkReply::decode(reply.clone())
                .map(|r| reply_text(&r))
                .unwrap_or_default();
            self.log(format!("  at {point}: {peer} serves op{op} -> {text}"));
            self.send(peer, client, Msg::Reply { op, body: reply });
        }
        // Requests the hook did not take (no interleaving point reached) arrive as usual.
    }

    /// The invariants cheap enough to check after every event.
    pub(super) fn check_step_invariants(&mut self) {
        let mut problems = Vec::new();
        for peer in &self.peers {
            let Some(parts) = peer.parts.as_ref() else {
                continue;
            };
            let backups = &parts.master.backups;
            let distinct: BTreeSet<NodeId> = backups.iter().copied().collect();
            if distinct.len() != backups.len() || distinct.contains(&peer.id) {
                problems.push(format!(
                    "zone {} of {}: backups {backups:?} not distinct or include the owner",
                    parts.master.zone, peer.id
                ));
            }
        }
        for (creator, ranges) in &self.directory.ranges {
            if ranges.iter().any(|r| r.2 == *creator || r.2 == NOBODY) {
                problems.push(format!(
                    "the directory gives a range of {creator} to {ranges:?}"
                ));
            }
        }
        for problem in problems {
            self.fail(problem);
        }
    }
}

/// What [`read_zone`] returns: the recovery's result, trace lines, the chunks read.
type ZoneRead = (
    Result<myriad_backup_log::RecoveryReport, BackupError>,
    Vec<String>,
    Vec<(u64, Vec<u8>)>,
);

/// Reads `owner`'s zone back at `restorer` with the production [`BackupService`]; at the
/// read's interleaving point the `accepted` messages of `owner` are applied (a pool thread
/// still busy with them) and, if `flusher_runs`, the log engine flushes (its flusher).
fn read_zone(
    backup: &Arc<BackupService>,
    (owner, zone, restorer): (NodeId, u32, NodeId),
    accepted: Vec<Bytes>,
    flusher_runs: bool,
) -> ZoneRead {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let chunks = Arc::new(Mutex::new(Vec::new()));
    let (hook_lines, hook_backup) = (Arc::clone(&lines), Arc::clone(backup));
    let pending = Mutex::new(accepted);
    let result = interleave::with_hook(
        move |point| {
            let bodies: Vec<Bytes> = std::mem::take(&mut *lock(&pending));
            let applied = !bodies.is_empty();
            for body in bodies {
                let ack = apply_now(&hook_backup, owner, body);
                lock(&hook_lines).push(format!(
                    "  at {point}: {restorer} applies a message of {owner}: {ack:?}"
                ));
            }
            if applied && flusher_runs {
                let flushed = hook_backup.engine().flush();
                lock(&hook_lines).push(format!(
                    "  at {point}: the flusher of {restorer} runs: {flushed:?}"
                ));
            }
        },
        || {
            backup.recover_zone(owner, zone, &|batch| {
                let mut out = lock(&chunks);
                out.extend(batch.iter().map(|c| (c.cid, c.payload.to_vec())));
            })
        },
    );
    let lines = std::mem::take(&mut *lock(&lines));
    let chunks = std::mem::take(&mut *lock(&chunks));
    (result, lines, chunks)
}

/// Whether an encoded request is a read.
fn is_get(body: &Bytes) -> bool {
    matches!(
        ChunkRequest::decode(body.clone()),
        Ok(ChunkRequest::Get { .. })
    )
}

/// Locks a mutex of the simulator (a panic in a hook leaves usable data).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
