//! The superpeers' part of the event loop, on the production metadata state machine, and
//! the restorer's side of a recovery.
//!
//! Job: every metadata change is a production [`Command`] applied with
//! [`MetaState::apply`] (what the Raft state machine of every superpeer calls), committed
//! through the simulated superpeer group. The commands are the ones the production code
//! issues, at the same steps: a peer's `Join` (with its ID reclaimed) and `ReserveLids`;
//! its replicator's registrations (`ZoneSet`, `ZoneAdopt`, `ZoneFilled`, committed where
//! the replicator asks, `serve.rs`); the failure verdict `Fail` with the watched
//! incarnation; the leader's recovery of every zone [`MetaState::zones_to_recover`]
//! names, from its backups by position and in the zone's order; the restorer's
//! production [`myriad_node::recovery::insert_recovered_where`] (the zone read back into
//! its memory, only what the directory routes to the zone's writer, the CIDs as merged
//! ranges), its replicator's adoption (`plan_adoption`, `ZoneAdopt`, `adopt_registered`),
//! its `SetOwner`s and `ZoneOwned`; the replicators' replacement of a failed or
//! restarted backup (`replace_backup`, `fill_zones`); the leader's `HandOver` of what
//! still routes to a failed peer ([`MetaState::leftover_ranges`]); a zone no backup can
//! restore is lost (`ZoneRemove`). Ownership changes reach every live peer's chunk
//! service after their own delays.
//!
//! Invariants (checked after every command, [`World::check_meta_invariants`]): every
//! creator's lookup tree is well formed (one owner per CID range) and never routes to an
//! unknown node; every zone's backups are distinct, never its log owner nor its holder;
//! the epoch never goes down.
//!
//! Callers: [`super::World`]'s start, event dispatch and fault handlers.

use myriad_meta::{Capabilities, Command, MetaState, NodeState, Response, Role};
use myriad_node::recovery::{cid_pairs, insert_recovered_where, Routes};
use myriad_placement::Candidate;
use myriad_proto::recovery::RecoverRequest;

/// Pause between two rounds over a zone's backups when each failed (production
/// `RETRY_PAUSE`, on the simulator's compressed time scale).
const RECOVERY_RETRY_US: Time = 1_000;
/// How long the leader goes on asking a zone's backups before the zone counts as lost
/// (production: the superpeer's backup wait).
pub(super) const RECOVERY_RETRY_US_MAX: Time = 30_000;

use super::faults::{is_get, lock};
use super::*;
use crate::sim::peer::{Start, LID_RESERVE};

/// How long a peer whose disk did not open waits before the next start.
const RESTART_RETRY: Time = 3_000;

impl World {
    /// Commits `command`: applies it to the metadata, logs it, sends the ownership events
    /// of an ownership change, and checks the metadata's invariants.
    pub(super) fn commit(&mut self, command: Command) -> Response {
        let response = match self.raft.as_mut() {
            None => self.meta.apply(&command),
            Some(group) => match group.commit(self.queue.now(), command.clone()) {
                Ok((response, state)) => {
                    self.meta = state;
                    let elections = group.elections;
                    let leader = group.current_leader();
                    if elections != self.raft_elections_logged {
                        self.raft_elections_logged = elections;
                        self.log(format!("superpeer leader now {leader:?}"));
                    }
                    response
                }
                Err(e) => {
                    self.fail(format!("superpeer group: {e}"));
                    Response::Error(myriad_meta::MetaError::InvalidArgument(e))
                }
            },
        };
        self.log(format!("META {command} -> {response:?}"));
        if let (
            Command::SetOwner {
                creator,
                first,
                last,
                owner,
            },
            Response::Done,
        ) = (&command, &response)
        {
            self.owner_changed(*creator, *first, *last, *owner);
        }
        self.check_meta_invariants();
        response
    }

    /// Draws the superpeer group's faults from the event stream: in about two runs of
    /// three the leader either crashes or is cut off from the other superpeers once
    /// before the fault horizon, and 2-10 ms later it starts again over its log or is
    /// reconnected (a quorum stays up: at most one of three is out).
    pub(super) fn schedule_superpeer_faults(&mut self) {
        if !self.config.faults || !self.event_rng.chance(667) {
            return;
        }
        let at = self.event_rng.below(self.config.fault_horizon.max(1));
        let back = at + self.event_rng.between(2_000, 10_000);
        let crash = self.event_rng.chance(500);
        self.queue.at(at, Event::SuperpeerFault { crash });
        self.queue.at(back, Event::SuperpeerRestart);
    }

    /// The superpeer that leads now crashes (`crash`: its log kept) or is cut off from
    /// the others.
    pub(super) fn superpeer_fault(&mut self, crash: bool) {
        let now = self.queue.now();
        let Some(group) = self.raft.as_mut() else {
            return;
        };
        group.catch_up(now);
        let Some(leader) = group.current_leader() else {
            return;
        };
        let done = if crash {
            group.crash(leader)
        } else {
            group.isolate(leader)
        };
        if done {
            self.stats.superpeer_faults += 1;
            self.log(if crash {
                format!("CRASH superpeer {leader}")
            } else {
                format!("superpeer {leader} cut off from the others")
            });
        }
    }

    /// Starts the crashed superpeers again over their logs.
    pub(super) fn superpeer_restart(&mut self) {
        let now = self.queue.now();
        let Some(group) = self.raft.as_mut() else {
            return;
        };
        group.catch_up(now);
        group.heal();
        for member in 1..=super::super::raft::MEMBERS {
            if let Err(e) = group.restart(member) {
                self.fail(format!("superpeer {member} did not restart: {e}"));
                return;
            }
        }
        self.log("superpeers restarted and reconnected".to_owned());
    }

    /// The superpeer group's members applied one log into one metadata, the world's.
    pub(in crate::sim) fn superpeer_problems(&mut self) -> Vec<String> {
        let Some(group) = self.raft.as_mut() else {
            return Vec::new();
        };
        let mut problems = Vec::new();
        if let Err(e) = group.restart_all_and_agree() {
            problems.push(e);
        } else if group.leader_state().as_ref() != Some(&self.meta) {
            problems
                .push("the superpeers' metadata differs from what the peers were told".to_owned());
        }
        problems
    }

    /// The ownership event of `creator`'s IDs `first..=last` now at `owner`, applied by
    /// every live peer.
    fn owner_changed(&mut self, creator: NodeId, first: u64, last: u64, owner: NodeId) {
        for index in 0..self.peers.len() {
            let peer = &self.peers[index];
            if peer.parts.is_none() {
                continue;
            }
            let event = Event::OwnerChangedArrives {
                peer: peer.id,
                incarnation: peer.incarnation,
                creator,
                first,
                last,
                owner,
            };
            self.send_event(event);
        }
    }

    /// Delivers an event of the superpeers to `peer`: after a delay drawn from the event
    /// stream (at once for about a third), never before an earlier event to the same peer.
    fn send_event(&mut self, event: Event) {
        let peer = match &event {
            Event::OwnerChangedArrives { peer, .. } | Event::NodeFailedArrives { peer, .. } => {
                *peer
            }
            _ => return,
        };
        let now = self.now();
        let delay = if self.event_rng.chance(333) {
            0
        } else {
            self.event_rng.between(100, 4_000)
        };
        let due = (now + delay).max(self.events_due.get(&peer).copied().unwrap_or(0));
        if due <= now {
            self.handle(event);
        } else {
            self.events_due.insert(peer, due);
            self.queue.at(due, event);
        }
    }

    /// Whether `node` is stalled (paused) now.
    fn stalled(&self, node: NodeId) -> bool {
        let now = self.queue.now();
        self.peer_index(node)
            .is_some_and(|i| self.peers[i].paused_until > now)
    }

    /// Whether `node` is an alive peer in the metadata.
    pub(super) fn alive_in_meta(&self, node: NodeId) -> bool {
        self.meta
            .node(node)
            .is_some_and(|r| r.role == Role::Peer && r.state == NodeState::Alive)
    }

    /// The backup candidates as the production membership view gives them: alive peers.
    pub(super) fn candidates(&self, excluding: &[NodeId]) -> Vec<Candidate> {
        self.meta
            .nodes()
            .filter(|r| r.role == Role::Peer && r.state == NodeState::Alive)
            .filter(|r| !excluding.contains(&r.id))
            .map(|r| Candidate {
                node: r.id,
                rack: r.rack,
                switch: r.switch,
            })
            .collect()
    }

    /// A peer joins (its ID reclaimed, a new incarnation in the metadata).
    pub(super) fn join(&mut self, peer: NodeId) -> bool {
        let command = Command::Join {
            role: Role::Peer,
            address: format!("127.0.0.1:{}", 7000 + u32::from(peer.0)),
            capabilities: Capabilities::ALL,
            rack: 0,
            switch: 0,
            reclaim: Some(peer),
        };
        match self.commit(command) {
            Response::Joined { id, .. } if id == peer => true,
            other => {
                self.fail(format!("join of {peer}: {other:?}"));
                false
            }
        }
    }

    /// Starts the incarnation of the peer at `index` (joined already): its bases from the
    /// metadata (its zones, placed and registered by its replicator when its first chunk
    /// is created, are numbered from the zone base), its local IDs reserved.
    pub(super) fn start_peer(&mut self, index: usize) -> bool {
        let id = self.peers[index].id;
        let bases = self.meta.bases(id);
        let start = Start {
            zone_base: bases.zone_base,
            lid_base: bases.lid_base,
            backups: self.config.backups,
            placement_seed: self.rng.next_u64(),
            now: self.queue.now(),
            bug_no_copy_reset: self.config.bug == Some(Bug::KeepDivergedSurvivors),
        };
        let bug = self.config.bug == Some(Bug::NoRecoveryFreeze);
        if let Err(e) = self.peers[index].start(start, bug) {
            self.fail(format!("peer {id} did not start: {e}"));
            return false;
        }
        self.commit(Command::ReserveLids {
            node: id,
            up_to: bases.lid_base.max(1) + LID_RESERVE,
        });
        self.log(format!(
            "start {id} zones from {} lid base {}",
            bases.zone_base, bases.lid_base
        ));
        // A new incarnation: its first resend round (an earlier one's ends by itself).
        self.peers[index].resend_armed = false;
        self.peers[index].copy_armed = false;
        self.schedule_resend(index);
        true
    }

    /// The failure detector's verdict on `peer` (the incarnation that crashed): `Fail`
    /// committed, the peer fenced, its backups replaced, the zones recovered; its
    /// restart follows.
    pub(super) fn detect(&mut self, peer: NodeId, incarnation: u32) {
        if self.verdict(peer, incarnation) {
            let restart = self.rng.between(500, 6_000);
            self.queue.after(restart, Event::Restart { peer });
        }
    }

    /// The failure detector's verdict on a stalled `peer` that still holds its memory:
    /// as for a crash, but the peer comes back by itself (see [`World::resume`]).
    pub(super) fn suspect(&mut self, peer: NodeId, incarnation: u32) {
        self.verdict(peer, incarnation);
    }

    /// `Fail` committed for `peer`'s `incarnation`, the peer fenced, its backups
    /// replaced, its zones recovered; whether the verdict committed.
    fn verdict(&mut self, peer: NodeId, incarnation: u32) -> bool {
        let Some(index) = self.peer_index(peer) else {
            return false;
        };
        if self.peers[index].incarnation != incarnation {
            return false;
        }
        let Some(watched) = self.meta.node(peer).map(|r| r.incarnation) else {
            return false;
        };
        self.log(format!("DETECT failure of {peer}"));
        let verdict = self.commit(Command::Fail {
            node: peer,
            incarnation: watched,
        });
        if !matches!(verdict, Response::Epoch(_)) {
            return false;
        }
        self.net.fence(peer);
        // The `NodeFailed` event reaches every live peer, each after its own delay (at
        // once for about a third): its backup side seals the failed peer's zones
        // (`BackupService::seal_owner`); meanwhile a message of the failed peer it had
        // accepted may still be applied there. (Its masters replace the failed peer at
        // once here.)
        let zones_end = self.meta.bases(peer).zones_end;
        for index in 0..self.peers.len() {
            let other = &self.peers[index];
            if other.id == peer || other.parts.is_none() {
                continue;
            }
            let arrives = Event::NodeFailedArrives {
                peer: other.id,
                incarnation: other.incarnation,
                failed: peer,
                zones_end,
            };
            self.send_event(arrives);
        }
        self.backups_gone(peer);
        self.recovery_scan();
        true
    }

    /// Every live master replaces `gone` in the zones it backed (a failure, or a restart
    /// that lost the stream state): production `Replicator::replace_backup`, as a node
    /// does on `NodeFailed` and on a restarted peer's `NodeJoined`.
    fn backups_gone(&mut self, gone: NodeId) {
        for index in 0..self.peers.len() {
            if self.peers[index].id == gone {
                continue;
            }
            let Some(master) = self.master_at(index) else {
                continue;
            };
            let changed = master.replicator().replace_backup(gone);
            if !changed.is_empty() {
                let me = self.peers[index].id;
                self.log(format!("{me} replaces backup {gone}: {changed:?}"));
            }
            self.pump(index);
            self.schedule_copies(index);
        }
    }

    /// The master at `index` gives its zones with fewer than R backups more and copies
    /// them there (production `Replicator::fill_zones`, on a peer's `NodeJoined`).
    pub(super) fn fill_zones(&mut self, index: usize) {
        let Some(master) = self.master_at(index) else {
            return;
        };
        let changed = master.replicator().fill_zones();
        if !changed.is_empty() {
            let me = self.peers[index].id;
            self.log(format!("{me} fills zones: {changed:?}"));
        }
        self.pump(index);
        self.schedule_copies(index);
    }

    /// The leader recovers every zone the metadata says needs it, then hands over what
    /// still routes to failed peers without zones left.
    pub(super) fn recovery_scan(&mut self) {
        let due: Vec<(NodeId, u32, Vec<NodeId>)> = self
            .meta
            .zones_to_recover()
            .map(|(owner, zone, backups)| (owner, zone, backups.to_vec()))
            .collect();
        for (owner, zone, backups) in due {
            self.recover_zone(owner, zone, &backups);
        }
        self.hand_over_leftovers();
    }

    /// Asks the zone's backups in order (alive in the metadata) to restore it; a zone
    /// none of them restores is lost.
    fn recover_zone(&mut self, owner: NodeId, zone: u32, backups: &[NodeId]) {
        let holder = self
            .meta
            .zone_holder(owner, zone)
            .filter(|holder| *holder != owner);
        // As the production leader: backups still being filled come last.
        let filling = self.meta.zone_filling(owner, zone).to_vec();
        let (complete, partial): (Vec<NodeId>, Vec<NodeId>) =
            backups.iter().partition(|b| !filling.contains(b));
        let complete = self.by_position(owner, zone, holder.unwrap_or(owner), complete);
        let mut reasons = Vec::new();
        let mut stalled = false;
        for backup in complete.into_iter().chain(partial) {
            if backup == owner || !self.alive_in_meta(backup) {
                reasons.push(format!("{backup}: not alive"));
                continue;
            }
            if self.service_of(backup).is_none() {
                // Crashed, not declared failed yet: the request times out.
                reasons.push(format!("{backup}: no answer"));
                continue;
            }
            if self.stalled(backup) {
                // It answers once its stall ends: the leader waits (the production
                // leader waits up to its backup wait for a backup to come back).
                reasons.push(format!("{backup}: stalled"));
                stalled = true;
                continue;
            }
            // A disk read error at the first backup asked (drawn per zone): the restorer
            // must report it and the next backup restore the zone.
            let read_fails =
                reasons.is_empty() && self.rng.chance(self.scenario.read_fault_per_mille);
            if filling.contains(&backup) {
                self.log(format!(
                    "zone {owner}/{zone}: no complete backup restored it; trying {backup}, whose copy was still being filled"
                ));
            }
            let request = RecoverRequest {
                owner,
                zone,
                holder,
                filling: filling.clone(),
            };
            match self.restore_at(backup, request, read_fails) {
                Ok(()) => {
                    self.recovery_failing.remove(&(owner, zone));
                    return;
                }
                Err(reason) => {
                    self.log(format!(
                        "recovery of zone {owner}/{zone} at {backup} failed: {reason}"
                    ));
                    reasons.push(format!("{backup}: {reason}"));
                }
            }
        }
        if stalled {
            self.log(format!(
                "zone {owner}/{zone} waits for a stalled backup ({reasons:?})"
            ));
            self.queue.after(1_000, Event::Scan);
            return;
        }
        let now = self.now();
        let since = *self.recovery_failing.entry((owner, zone)).or_insert(now);
        // A backup that never heard of the zone (nothing was ever written to it) will not
        // know it on the next round either: such a zone is removed at once (production:
        // every backup answers `RecoverReply::NotHeld` and the leader removes the zone as
        // restored empty).
        let transient = reasons
            .iter()
            .any(|reason| !reason.contains("unknown zone"));
        if transient && now - since < RECOVERY_RETRY_US_MAX {
            // The production leader asks the backups again after a pause, until its
            // backup wait ends: a failed read or a lock held meanwhile may be gone.
            self.log(format!(
                "zone {owner}/{zone}: every backup failed ({reasons:?}); asking again"
            ));
            self.queue.after(RECOVERY_RETRY_US, Event::Scan);
            return;
        }
        self.recovery_failing.remove(&(owner, zone));
        self.log(format!(
            "zone {owner}/{zone} LOST (no backup restored it: {reasons:?})"
        ));
        self.commit(Command::ZoneRemove { owner, zone });
    }

    /// The production [`insert_recovered`] at the peer at `index`: at the read's
    /// interleaving point the messages of the zone's writer this backup accepted are
    /// applied, as a pool thread still busy with them would, and its flusher may run;
    /// with `read_fails` its disk fails every read meanwhile.
    fn read_zone(
        &mut self,
        index: usize,
        request: RecoverRequest,
        read_fails: bool,
    ) -> Result<myriad_node::recovery::Restored, String> {
        let restorer = self.peers[index].id;
        let parts = self.peers[index].parts.as_ref().ok_or("down")?;
        let (backup, service) = (Arc::clone(&parts.backup), Arc::clone(&parts.service));
        let writer = request.holder.unwrap_or(request.owner);
        // The writer's messages this backup accepted but has not applied yet.
        let accepted: Vec<Bytes> = self
            .queue
            .take_where(|event| matches!(event, Event::Apply { backup: b, master, .. } if *b == restorer && *master == writer))
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
        if read_fails {
            self.log(format!(
                "disk of {restorer}: reads fail during the recovery read"
            ));
            self.peers[index].storage.set_fail_read(true);
        }
        // Only chunks the directory routes to the zone's writer are stored (production
        // `restore_zone`: a migration's orphans stay out).
        let routes = self.routes();
        let orphans_too = self.config.bug == Some(Bug::TakeOverOrphans);
        let keep = move |cid: ChunkId| orphans_too || routes.restores(cid, writer);
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (hook_lines, hook_backup) = (Arc::clone(&lines), Arc::clone(&backup));
        let pending = Mutex::new(pending);
        let result = interleave::with_hook(
            move |point| {
                let bodies: Vec<Bytes> = std::mem::take(&mut *lock(&pending));
                let applied = !bodies.is_empty();
                for body in bodies {
                    let ack = apply_now(&hook_backup, writer, body);
                    lock(&hook_lines).push(format!(
                        "  at {point}: {restorer} applies a message of {writer}: {ack:?}"
                    ));
                }
                if applied && flusher_runs {
                    let flushed = hook_backup.engine().flush();
                    lock(&hook_lines).push(format!(
                        "  at {point}: the flusher of {restorer} runs: {flushed:?}"
                    ));
                }
            },
            || insert_recovered_where(&backup, service.memory(), &request, &keep),
        );
        if read_fails {
            self.peers[index].storage.set_fail_read(false);
        }
        for line in std::mem::take(&mut *lock(&lines)) {
            self.log(line);
        }
        if !during_read {
            for body in accepted {
                let ack = apply_now(&backup, writer, body);
                self.log(format!(
                    "  after the read: {restorer} applies a message of {writer}: {ack:?}"
                ));
            }
        }
        result
    }

    /// The superpeers' lookup trees, as a restorer reads them before its recovery read.
    fn routes(&self) -> Routes {
        let trees = self
            .meta
            .nodes()
            .filter(|r| r.role == Role::Peer)
            .map(|r| {
                let ranges = self
                    .meta
                    .lookup_tree(r.id)
                    .map(|tree| {
                        tree.exceptions()
                            .map(|(first, last, owner)| myriad_meta::LookupRange {
                                creator: r.id,
                                first,
                                last,
                                owner,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                (r.id, ranges)
            })
            .collect();
        Routes::from_trees(trees)
    }

    /// The restorer's side: the zone read back into `restorer`'s memory
    /// ([`World::read_zone`]), adopted (its surviving backups filled up by the
    /// production placement, `ZoneAdopt`), its CIDs taken over (`SetOwner`, `ZoneOwned`)
    /// and copied to its added backups.
    fn restore_at(
        &mut self,
        restorer: NodeId,
        request: RecoverRequest,
        read_fails: bool,
    ) -> Result<(), String> {
        let index = self.peer_index(restorer).ok_or("unknown restorer")?;
        let service = Arc::clone(&self.peers[index].parts.as_ref().ok_or("down")?.service);
        let (owner, zone) = (request.owner, request.zone);
        let filling = request.filling.clone();
        let request_key = (owner, zone, request.holder.unwrap_or(owner));
        let mut restored = self.read_zone(index, request, read_fails)?;
        if let Some(error) = &restored.first_error {
            return Err(format!(
                "{} chunks not stored, e.g. {error}",
                restored.failed
            ));
        }
        let ranges = restored.ranges();
        let orphans = restored.skipped_ranges();
        if !orphans.is_empty() {
            self.log(format!(
                "zone {owner}/{zone} at {restorer}: left out chunks routed elsewhere {orphans:?}"
            ));
        }
        let chunks = restored.chunks;
        self.stats.chunks_recovered += chunks;
        // Adoption (`Replicator::adopt_zone`): the surviving backups, filled up.
        let old = self
            .meta
            .zone(owner, zone)
            .map(<[NodeId]>::to_vec)
            .unwrap_or_default();
        let survivors: Vec<NodeId> = old
            .into_iter()
            .filter(|&b| {
                b != owner && b != restorer && !filling.contains(&b) && self.alive_in_meta(b)
            })
            .collect();
        // Only backups holding the zone's history up to the restorer's position survive
        // (production `same_history`: each is asked, and seals the zone against its writer).
        let (kept, position) = self.same_history(&request_key, survivors, restored.position);
        // Adoption (production `Replicator::plan_adoption`, the registration
        // `ZoneAdopt`, `Replicator::adopt_registered`: what `adopt_zone` does).
        let plan = self
            .master_at(index)
            .ok_or("down")?
            .replicator()
            .plan_adoption(owner, zone, &kept)
            .map_err(|e| format!("adopting: {e}"))?;
        let backups = plan.backups.clone();
        if let Response::Error(e) =
            self.commit(registration_command(restorer, owner, zone, backups.clone()))
        {
            return Err(format!("adopting: {e}"));
        }
        let values: Vec<String> = ranges
            .iter()
            .map(|r| format!("{}:{}..={}", r.creator, r.first, r.last))
            .collect();
        self.log(format!(
            "RECOVERED zone {owner}/{zone} at {restorer}: {chunks} chunks, ranges {values:?}, backups {backups:?}"
        ));
        let cid_ranges = cid_pairs(&ranges);
        let content = myriad_replication::Restored {
            chunks,
            bytes: restored.bytes,
            position,
        };
        let adoption = self
            .master_at(index)
            .ok_or("down")?
            .replicator()
            .adopt_registered(plan, &cid_ranges, content);
        // Take-over: at once in the restorer's view, then committed, then settled.
        for range in &ranges {
            service.set_owner(range.creator, range.first, range.last, restorer);
        }
        for range in &ranges {
            self.commit(Command::SetOwner {
                creator: range.creator,
                first: range.first,
                last: range.last,
                owner: restorer,
            });
        }
        self.commit(Command::ZoneOwned {
            owner,
            zone,
            holder: restorer,
        });
        // The orphans leave the zone's logs; the copy to the added backups (production
        // `copy_adopted`, in the background).
        if let Some(master) = self.master_at(index) {
            master
                .replicator()
                .forget_in_adopted(&adoption, &cid_pairs(&orphans));
            master.replicator().queue_adopted_copies(&adoption);
        }
        self.pump(index);
        self.schedule_copies(index);
        Ok(())
    }

    /// The production leader's `by_position`: the complete backups ordered by their zone
    /// position, highest first (ties and those without an answer keep the zone's order),
    /// each asked through the production `BackupService::seal_and_position`; a peer down or
    /// stalled gives no answer. (Not with the re-introduced bug: the order before.)
    fn by_position(
        &mut self,
        owner: NodeId,
        zone: u32,
        writer: NodeId,
        backups: Vec<NodeId>,
    ) -> Vec<NodeId> {
        if backups.len() < 2 || self.config.bug == Some(Bug::KeepDivergedSurvivors) {
            return backups;
        }
        let answers: Vec<(NodeId, Option<u64>)> = backups
            .iter()
            .map(|&b| {
                let answer = match self.peer_index(b) {
                    Some(i) if b != owner && !self.stalled(b) && self.alive_in_meta(b) => self
                        .peers[i]
                        .parts
                        .as_ref()
                        .and_then(|p| p.backup.seal_and_position(owner, zone, writer)),
                    _ => None,
                };
                (b, answer)
            })
            .collect();
        if answers.windows(2).any(|w| w[0].1 != w[1].1) {
            self.log(format!(
                "zone {owner}/{zone}: backups by position {answers:?}"
            ));
        }
        myriad_node::recovery::order_by_position(answers)
    }

    /// The surviving backups whose position of zone `(owner, zone)` (written by `writer`)
    /// equals the restorer's `own`, and the position the adopter numbers on from
    /// (production `myriad_node::recovery::same_history`): each is asked through the
    /// production [`myriad_replication::BackupService::seal_and_position`]; a peer that is
    /// down or stalled gives no answer and is no survivor.
    fn same_history(
        &mut self,
        &(owner, zone, writer): &(NodeId, u32, NodeId),
        survivors: Vec<NodeId>,
        own: Option<u64>,
    ) -> (Vec<NodeId>, u64) {
        let answers: Vec<(NodeId, Option<u64>)> = survivors
            .iter()
            .map(|&b| {
                let answer = match self.peer_index(b) {
                    Some(i) if !self.stalled(b) => self.peers[i]
                        .parts
                        .as_ref()
                        .and_then(|p| p.backup.seal_and_position(owner, zone, writer)),
                    _ => None,
                };
                (b, answer)
            })
            .collect();
        if self.config.bug == Some(Bug::KeepDivergedSurvivors) {
            let kept: Vec<NodeId> = answers.iter().map(|(b, _)| *b).collect();
            return (kept, own.unwrap_or(0));
        }
        let (kept, position) = myriad_node::recovery::surviving(own, &answers);
        if own.is_none() {
            self.log(format!(
                "zone {owner}/{zone}: the restorer knows no position; every survivor kept"
            ));
        }
        for (b, answer) in answers {
            if !kept.contains(&b) {
                self.log(format!(
                    "zone {owner}/{zone}: backup {b} is at position {answer:?}, the restorer at {position}: no survivor"
                ));
            }
        }
        (kept, position)
    }

    /// The leader's last step for failed peers without zones left: what still routes to
    /// them goes to a neighbouring owner or the lowest live peer (`HandOver`).
    fn hand_over_leftovers(&mut self) {
        let finished: Vec<(NodeId, u32)> = self
            .meta
            .nodes()
            .filter(|record| {
                record.role == Role::Peer
                    && matches!(record.state, NodeState::Failed { .. })
                    && self.meta.zones_held_by(record.id).next().is_none()
                    && self
                        .meta
                        .zones_of(record.id)
                        .all(|(zone, _)| self.meta.zone_settled(record.id, zone))
            })
            .map(|record| (record.id, record.incarnation))
            .collect();
        for (failed, incarnation) in finished {
            if !self.handed_over.insert((failed, incarnation)) {
                continue;
            }
            // The fallback: the first live peer that answers.
            let Some(fallback) = self
                .candidates(&[failed])
                .into_iter()
                .map(|c| c.node)
                .find(|&node| self.service_of(node).is_some() && !self.stalled(node))
            else {
                self.handed_over.remove(&(failed, incarnation));
                continue;
            };
            let ranges = self.meta.leftover_ranges(failed, fallback);
            if ranges.is_empty() {
                continue;
            }
            let response = self.commit(Command::HandOver {
                failed,
                incarnation,
                fallback,
            });
            if response == Response::Done {
                for (creator, first, last, owner) in ranges {
                    self.owner_changed(creator, first, last, owner);
                }
            }
        }
    }

    /// Restarts `peer` (a new incarnation over its old disk): it joins again, starts
    /// from its new bases, records the IDs routed to it as [`NOBODY`]'s until its
    /// earlier zones are recovered, and masters replace it in the zones it backed.
    pub(super) fn restart(&mut self, peer: NodeId) {
        let Some(index) = self.peer_index(peer) else {
            return;
        };
        // The disk opens before the join; a peer whose disk does not open exits, and is
        // started again later.
        let bug = self.config.bug == Some(Bug::NoRecoveryFreeze);
        if let Err(e) = self.peers[index].open(bug) {
            self.log(format!(
                "restart of {peer} failed ({e}); trying again later"
            ));
            self.queue.after(RESTART_RETRY, Event::Restart { peer });
            return;
        }
        if !self.join(peer) {
            return;
        }
        // A new incarnation of a backup lost its streams: masters replace it first.
        self.backups_gone(peer);
        if !self.start_peer(index) {
            return;
        }
        let Some(parts) = self.peers[index].parts.as_ref() else {
            return;
        };
        if self.config.bug == Some(Bug::IdsBeforeRanges) {
            parts.service.reintroduce_ids_before_ranges_bug();
        }
        // The production start of a restarted peer: its earlier IDs, and every range
        // routed to it, are NOBODY's until its earlier zones settled.
        let service = Arc::clone(&parts.service);
        let lid_base = parts.lid_base;
        if lid_base > 0 {
            service.set_owner(peer, 0, lid_base - 1, NOBODY);
        }
        let creators: Vec<NodeId> = self
            .meta
            .nodes()
            .filter(|r| r.role == Role::Peer)
            .map(|r| r.id)
            .collect();
        for creator in creators {
            if let Some(tree) = self.meta.lookup_tree(creator) {
                for (first, last, owner) in tree.exceptions() {
                    let owner = if owner == peer { NOBODY } else { owner };
                    service.set_owner(creator, first, last, owner);
                }
            }
        }
        self.net.unfence(peer);
        let incarnation = self.peers[index].incarnation;
        self.log(format!("RESTART {peer} incarnation {incarnation}"));
        // Other masters may choose it again for their zones.
        for other in 0..self.peers.len() {
            if other != index {
                self.fill_zones(other);
            }
        }
        // Zones of its earlier incarnation not recovered yet are due now.
        self.recovery_scan();
        let settle = self.rng.between(100, 4_000);
        self.queue
            .after(settle, Event::TakeBack { peer, incarnation });
    }

    /// The restarted `peer` looks whether its earlier zones settled (the production
    /// watch asks `ZonesDue`); if so it takes its earlier IDs back, except the ranges the
    /// metadata routes elsewhere, in one step. Client reads already on their way to it
    /// are served at the call's interleaving point.
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
        let zone_base = self.meta.bases(peer).zone_base;
        let due = self
            .meta
            .zones_to_recover()
            .any(|(owner, zone, _)| owner == peer && zone < zone_base);
        if due {
            self.queue.after(250, Event::TakeBack { peer, incarnation });
            return;
        }
        let ranges: Vec<(u64, u64, NodeId)> = self
            .meta
            .lookup_tree(peer)
            .map(|tree| tree.exceptions().collect())
            .unwrap_or_default();
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
                || service.take_back_earlier_ids(lid_base, &ranges),
            );
        }
        // Then the other creators' ranges routed to it are its own again (the production
        // watch's second ownership sync).
        let creators: Vec<NodeId> = self
            .meta
            .nodes()
            .filter(|r| r.role == Role::Peer && r.id != peer)
            .map(|r| r.id)
            .collect();
        for creator in creators {
            if let Some(tree) = self.meta.lookup_tree(creator) {
                for (first, last, owner) in tree.exceptions() {
                    service.set_owner(creator, first, last, owner);
                }
            }
        }
        self.log(format!(
            "TAKE BACK {peer}: earlier ids 0..{lid_base} except {ranges:?}"
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

    /// The metadata's invariants (see the module doc), checked after every command.
    pub(super) fn check_meta_invariants(&mut self) {
        let mut problems = Vec::new();
        let epoch = self.meta.epoch();
        if epoch < self.last_epoch {
            problems.push(format!(
                "the epoch went down from {} to {epoch}",
                self.last_epoch
            ));
        }
        self.last_epoch = epoch;
        problems.extend(meta_problems(&self.meta));
        for problem in problems {
            self.fail(problem);
        }
    }
}

/// What is wrong with `meta`: malformed lookup trees, routes to unknown nodes, zones
/// whose backups are not distinct or include their owner or holder.
fn meta_problems(meta: &MetaState) -> Vec<String> {
    let mut problems = Vec::new();
    for creator in meta.nodes().map(|r| r.id) {
        let Some(tree) = meta.lookup_tree(creator) else {
            continue;
        };
        if let Err(e) = tree.check(creator) {
            problems.push(format!("lookup tree of {creator}: {e}"));
        }
        for (first, last, owner) in tree.exceptions() {
            if meta.node(owner).is_none() || owner == NOBODY {
                problems.push(format!(
                    "{creator}'s IDs {first}..={last} routed to unknown {owner}"
                ));
            }
        }
    }
    for (owner, zone, backups) in meta.zones() {
        let holder = meta.zone_holder(owner, zone).unwrap_or(owner);
        let distinct: BTreeSet<NodeId> = backups.iter().copied().collect();
        if distinct.len() != backups.len()
            || distinct.contains(&owner)
            || distinct.contains(&holder)
        {
            problems.push(format!(
                "zone {owner}/{zone} held by {holder}: backups {backups:?} not distinct or include its owner or holder"
            ));
        }
    }
    problems
}
