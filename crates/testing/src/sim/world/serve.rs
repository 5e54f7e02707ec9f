//! The peers' side of the event loop: serving client requests with the production chunk
//! service, driving each peer's production replicator (its changes, registrations,
//! messages, rounds and copy steps), and backups applying replication messages with the
//! production backup service.
//!
//! Invariants: a reply to a change leaves the peer only once the backups acknowledged what
//! the request's durability level asks (`async`: nothing); a backup applies one master's
//! messages in delivery order; a durable acknowledgement follows a successful flush.
//!
//! Callers: [`super::World`]'s event dispatch.

use super::*;

impl World {
    /// Serves a client request at peer `index` with [`ChunkService::execute`]; the
    /// changes it made are reported to the peer's production replicator, and the reply
    /// leaves once the replicator's wait for them ended (at once for `async`, once the
    /// zones' registrations committed).
    pub(super) fn serve(&mut self, index: usize, client: NodeId, op: u64, body: Bytes) {
        let Ok(request) = ChunkRequest::decode(body) else {
            self.fail(format!("op{op}: the simulator sent an undecodable request"));
            return;
        };
        let me = self.peers[index].id;
        let Some(parts) = self.peers[index].parts.as_ref() else {
            return;
        };
        let reply = parts.service.execute(client, request.clone());
        self.log(format!(
            "{me} serves op{op} {} -> {}",
            request_text(&request),
            reply_text(&reply)
        ));
        let (changes, durability) = changes_of(&request, &reply);
        if changes.is_empty() {
            self.send(
                me,
                client,
                Msg::Reply {
                    op,
                    body: reply.encode(),
                },
            );
            return;
        }
        let create = matches!(request, ChunkRequest::CreateWithData { .. });
        let durability = match durability {
            DURABILITY_DURABLE => Durability::Durable,
            DURABILITY_ASYNC => Durability::Async,
            _ => Durability::Replicated,
        };
        let Some(master) = self.master_at(index) else {
            return;
        };
        if let Err(error) = master.report(&changes, create, durability, (client, op, reply.clone()))
        {
            let failed = failed_reply(reply, &error);
            self.log(format!("{me}: op{op} not replicated: {error}"));
            self.send(
                me,
                client,
                Msg::Reply {
                    op,
                    body: failed.encode(),
                },
            );
        }
        self.pump(index);
    }

    /// The master side of peer `index` with its clock at now and its candidates the
    /// peers alive in the metadata.
    pub(super) fn master_at(&self, index: usize) -> Option<&SimMaster> {
        let me = self.peers[index].id;
        let parts = self.peers[index].parts.as_ref()?;
        parts.master.at(self.queue.now(), self.candidates(&[me]));
        Some(&parts.master)
    }

    /// Carries out what the replicator of peer `index` asked for: its registrations
    /// committed (the production `ZoneSet`/`ZoneAdopt`/`ZoneFilled`) and answered, its
    /// background tasks run, its messages sent, the replies whose wait ended sent, its
    /// events logged; until nothing is left.
    pub(super) fn pump(&mut self, index: usize) {
        let me = self.peers[index].id;
        let mut sent_any = false;
        loop {
            let Some(master) = self.master_at(index) else {
                return;
            };
            let asked = master.take_asked();
            let mut progress = !asked.is_empty();
            for (asked, pending) in asked {
                let command = match asked {
                    Asked::Register {
                        owner,
                        zone,
                        backups,
                    } => registration_command(me, owner, zone, backups),
                    Asked::Filled {
                        owner,
                        zone,
                        backup,
                    } => myriad_meta::Command::ZoneFilled {
                        owner,
                        zone,
                        backup,
                    },
                };
                let response = self.commit(command);
                pending.answer(match response {
                    myriad_meta::Response::Error(e) => Err(RegistryError(e.to_string())),
                    _ => Ok(()),
                });
            }
            let Some(parts) = self.peers[index].parts.as_mut() else {
                return;
            };
            let master = &mut parts.master;
            progress |= master.run_tasks();
            // Woken for pending operations: the production sender thread runs a round.
            if master.replicator().take_sender_wakeup() {
                master.replicator().tick(&[]);
                progress = true;
            }
            let messages = master.sent();
            let finished = master.take_finished();
            let events = master.take_events();
            progress |= !messages.is_empty() || !finished.is_empty() || !events.is_empty();
            sent_any |= !messages.is_empty();
            for (backup, body) in messages {
                self.send(me, backup, Msg::Replicate { body });
            }
            for done in finished {
                let reply = match &done.result {
                    Ok(()) => done.reply,
                    Err(error) => {
                        self.log(format!("{me}: op{} not replicated: {error}", done.op));
                        failed_reply(done.reply, error)
                    }
                };
                let body = reply.encode();
                self.send(me, done.client, Msg::Reply { op: done.op, body });
            }
            for event in events {
                self.log(format!("{me}: replicator: {event:?}"));
                // The node's reaction (`follow_replica_events`): a refusing backup is
                // replaced in every zone it backs.
                if let ReplicaEvent::BackupRefused { backup, .. } = event {
                    if let Some(master) = self.master_at(index) {
                        let changed = master.replicator().replace_backup(backup);
                        self.log(format!(
                            "{me} replaces refusing backup {backup}: {changed:?}"
                        ));
                    }
                    self.schedule_copies(index);
                }
            }
            if !progress {
                break;
            }
        }
        // A copy requeued after a failure (reported by a callback) needs its steps.
        self.schedule_copies(index);
        // The sender's rounds go on while anything is unsettled (production: the sender
        // thread always runs): what was sent is resent until acknowledged, what a copy
        // queued is batched and sent, also after the run went quiet.
        let unsettled = self.peers[index]
            .parts
            .as_ref()
            .is_some_and(|p| !p.master.settled());
        if sent_any || unsettled {
            self.schedule_resend(index);
        }
    }

    /// The backup's pool thread applies an accepted replication message of `master`.
    pub(super) fn apply(&mut self, backup: NodeId, incarnation: u32, master: NodeId, body: Bytes) {
        let Some(index) = self.peer_index(backup) else {
            return;
        };
        let peer = &self.peers[index];
        if peer.incarnation != incarnation {
            return;
        }
        if peer.paused_until > self.queue.now() {
            // Stalled: its pool thread applies the message once the stall ends.
            let at = peer.paused_until;
            let event = Event::Apply {
                backup,
                incarnation,
                master,
                body,
            };
            self.queue.at(at, event);
            return;
        }
        let Some(parts) = peer.parts.as_ref() else {
            return;
        };
        let service = Arc::clone(&parts.backup);
        let Some(ack) = apply_now(&service, master, body) else {
            self.log(format!(
                "{backup} applies a message of {master}: stale, not acknowledged"
            ));
            return;
        };
        self.log(format!(
            "{backup} applies a message of {master}: applied {} durable {} {:?}",
            ack.applied_seq, ack.durable_seq, ack.status
        ));
        self.send(backup, master, Msg::Ack { body: ack.encode() });
    }

    /// A master takes an acknowledgement of `backup` (the production handler).
    pub(super) fn on_ack(&mut self, index: usize, backup: NodeId, body: Bytes) {
        let Some(master) = self.master_at(index) else {
            return;
        };
        master.replicator().on_ack_message(backup, body);
        self.pump(index);
    }

    /// Schedules the next resend round of peer `index`.
    pub(super) fn schedule_resend(&mut self, index: usize) {
        if self.peers[index].resend_armed {
            return;
        }
        self.peers[index].resend_armed = true;
        let peer = self.peers[index].id;
        let incarnation = self.peers[index].incarnation;
        self.queue
            .after(RESEND_INTERVAL, Event::Resend { peer, incarnation });
    }

    /// The index of `peer` if its incarnation `incarnation` runs now. A stalled one runs
    /// nothing: `event` comes back when the stall ends (a timer that fires late stays
    /// armed); an ended incarnation's `event` is dropped.
    fn running_now(&mut self, peer: NodeId, incarnation: u32, event: Event) -> Option<usize> {
        let index = self.peer_index(peer)?;
        if self.peers[index].incarnation != incarnation || !self.peers[index].up() {
            return None;
        }
        let paused_until = self.peers[index].paused_until;
        if paused_until > self.queue.now() {
            self.queue.at(paused_until, event);
            return None;
        }
        Some(index)
    }

    /// A round of the replicator's sender (production: its sender thread's tick):
    /// resends what its backups did not acknowledge in time or asked for again, ends
    /// waits past their deadline.
    pub(super) fn resend(&mut self, peer: NodeId, incarnation: u32) {
        let Some(index) = self.running_now(peer, incarnation, Event::Resend { peer, incarnation })
        else {
            return;
        };
        self.peers[index].resend_armed = false;
        if let Some(master) = self.master_at(index) {
            master.replicator().tick(&[]);
        }
        self.pump(index);
        if !self.quiet() {
            self.schedule_resend(index);
        }
    }

    /// Whether the run is winding down: clients done and no reply waiting.
    pub(super) fn quiet(&self) -> bool {
        self.clients
            .iter()
            .all(|c| c.remaining == 0 && c.pending.is_none())
            && self
                .peers
                .iter()
                .all(|p| p.parts.as_ref().is_none_or(|parts| parts.master.settled()))
    }

    /// Takes a step of a copy to an added backup at peer `index`, if one waits, and
    /// schedules the next one.
    pub(super) fn copy_step(&mut self, peer: NodeId, incarnation: u32) {
        let event = Event::CopyStep { peer, incarnation };
        let Some(index) = self.running_now(peer, incarnation, event) else {
            return;
        };
        self.peers[index].copy_armed = false;
        let Some(master) = self.master_at(index) else {
            return;
        };
        let step = master.replicator().copy_step();
        let more = master.replicator().copies_waiting();
        if step != CopyStep::Idle {
            self.log(format!("{peer}: copy {step:?}"));
        }
        if more {
            let pause = if matches!(step, CopyStep::Slice { .. }) {
                self.rng.between(10, 500)
            } else {
                COPY_RETRY_US
            };
            self.peers[index].copy_armed = true;
            self.queue
                .after(pause, Event::CopyStep { peer, incarnation });
        }
        self.pump(index);
    }

    /// Schedules copy steps at peer `index` when copies wait (after a replacement, a
    /// fill or an adoption).
    pub(super) fn schedule_copies(&mut self, index: usize) {
        let waiting = self.peers[index]
            .parts
            .as_ref()
            .is_some_and(|p| p.master.replicator().copies_waiting());
        if waiting && !self.peers[index].copy_armed {
            self.peers[index].copy_armed = true;
            let peer = self.peers[index].id;
            let incarnation = self.peers[index].incarnation;
            let at = self.rng.between(0, 300);
            self.queue.after(at, Event::CopyStep { peer, incarnation });
        }
    }
}

/// Applies one replication message with the production backup service and, when the
/// message asked for durability, flushes the log engine as the service's durability
/// thread would (synchronously here, so that the run stays deterministic).
pub(super) fn apply_now(service: &BackupService, master: NodeId, body: Bytes) -> Option<Ack> {
    let durable_requested = LogMessage::decode(body.clone()).is_ok_and(|m| m.durable_requested);
    let mut ack = service.apply(master, body)?;
    // The service's own durability thread runs on its own time: its marks are not used.
    ack.durable_seq = 0;
    if durable_requested
        && ack.status == myriad_replication::wire::AckStatus::Ok
        && service.engine().flush().is_ok()
    {
        ack.durable_seq = ack.applied_seq;
    }
    Some(ack)
}

/// What a client gets when the changes of its request were not replicated as asked
/// (production `fail_succeeded` / a create's failure): the items that succeeded in memory
/// fail with an internal error, a create fails.
fn failed_reply(reply: ChunkReply, error: &ReplicaError) -> ChunkReply {
    let error = ItemError::Internal(format!(
        "stored in memory but not replicated as requested: {error}"
    ));
    match reply {
        ChunkReply::Statuses(statuses) => ChunkReply::Statuses(
            statuses
                .into_iter()
                .map(|status| status.and(Err(error.clone())))
                .collect(),
        ),
        ChunkReply::Created(_) => ChunkReply::Failed(error),
        other => other,
    }
}

/// The changes a served request made (chunks put with their data, or removed) and its
/// durability level.
fn changes_of(request: &ChunkRequest, reply: &ChunkReply) -> (Vec<(ChunkId, Option<Bytes>)>, u8) {
    match (request, reply) {
        (
            ChunkRequest::CreateWithData {
                payloads,
                durability,
            },
            ChunkReply::Created(cids),
        ) => (
            cids.iter()
                .zip(payloads)
                .map(|(c, d)| (*c, Some(d.clone())))
                .collect(),
            *durability,
        ),
        (ChunkRequest::Put { items, durability }, ChunkReply::Statuses(statuses)) => (
            items
                .iter()
                .zip(statuses)
                .filter(|(_, status)| status.is_ok())
                .map(|((cid, data), _)| (*cid, Some(data.clone())))
                .collect(),
            *durability,
        ),
        (ChunkRequest::Insert { items, durability }, ChunkReply::Statuses(statuses)) => (
            items
                .iter()
                .zip(statuses)
                .filter(|(_, status)| status.is_ok())
                .map(|((cid, data), _)| (*cid, Some(data.clone())))
                .collect(),
            *durability,
        ),
        (ChunkRequest::Remove { cids, durability }, ChunkReply::Statuses(statuses)) => (
            cids.iter()
                .zip(statuses)
                .filter(|(_, status)| status.is_ok())
                .map(|(cid, _)| (*cid, None))
                .collect(),
            *durability,
        ),
        _ => (Vec::new(), DURABILITY_ASYNC),
    }
}

/// A short description of a reply for the trace.
pub(super) fn reply_text(reply: &ChunkReply) -> String {
    match reply {
        ChunkReply::Created(cids) => format!("created {cids:?}"),
        ChunkReply::Data(items) => format!(
            "{:?}",
            items
                .iter()
                .map(|item| item.as_ref().map(|bytes| value_of(bytes)))
                .collect::<Vec<_>>()
        ),
        ChunkReply::Statuses(items) => format!("{items:?}"),
        other => format!("{other:?}"),
    }
}
