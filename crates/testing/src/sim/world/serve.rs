//! The peers' side of the event loop: serving client requests with the production chunk
//! service, the master side of replication, and backups applying replication messages
//! with the production backup service.
//!
//! Invariants: a reply to a change leaves the peer only once the backups acknowledged what
//! the request's durability level asks (`async`: nothing); a backup applies one master's
//! messages in delivery order; a durable acknowledgement follows a successful flush.
//!
//! Callers: [`super::World`]'s event dispatch.

use super::*;

impl World {
    /// Serves a client request at peer `index` with [`ChunkService::execute`]; changes of
    /// this incarnation's own chunks go into its replication stream.
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
        let encoded = reply.encode();
        let Some(parts) = self.peers[index].parts.as_mut() else {
            return;
        };
        let master = &mut parts.master;
        if matches!(request, ChunkRequest::Insert { .. }) {
            // Chunks moved here join this peer's own zone (the replicator assigns them).
            for (cid, _) in &changes {
                if master.zone_of(*cid).is_none() {
                    let lid = cid.local_id();
                    master.zones[0].ranges.push((cid.creator(), lid, lid));
                }
            }
        }
        let mut needs = Vec::new();
        for (cid, data) in changes {
            // Changes of chunks in one of this master's zones go to the zone's backups.
            let Some(z) = master.zone_of(cid) else {
                continue;
            };
            let zone = &master.zones[z];
            let owner = (zone.owner != me).then_some(zone.owner);
            let op = match data {
                Some(data) => Op::Put {
                    owner,
                    zone: zone.zone,
                    cid: cid.raw(),
                    data,
                    seq: 0,
                },
                None => Op::Remove {
                    owner,
                    zone: zone.zone,
                    cid: cid.raw(),
                    seq: 0,
                },
            };
            needs.extend(master.record(z, op));
        }
        let durable = durability == DURABILITY_DURABLE;
        if needs.is_empty() || durability == DURABILITY_ASYNC {
            if !needs.is_empty() {
                self.push_stream(index, false);
            }
            self.send(me, client, Msg::Reply { op, body: encoded });
            return;
        }
        master.waiting.push(Waiter {
            needs,
            durable,
            client,
            op,
            reply: encoded,
        });
        self.push_stream(index, durable);
        self.release(index);
    }

    /// Sends every backup of peer `index` what it has not acknowledged yet.
    pub(super) fn push_stream(&mut self, index: usize, durable: bool) {
        let me = self.peers[index].id;
        let Some(parts) = self.peers[index].parts.as_ref() else {
            return;
        };
        let mut messages = Vec::new();
        let backups: Vec<NodeId> = parts
            .master
            .streams
            .keys()
            .copied()
            .filter(|&b| parts.master.backs(b))
            .collect();
        for backup in backups {
            for body in parts.master.catch_up(backup, durable) {
                messages.push((backup, body));
            }
        }
        let sent = !messages.is_empty();
        for (backup, body) in messages {
            self.send(me, backup, Msg::Replicate { body });
        }
        // What was sent is resent until acknowledged, also after the run went quiet
        // (a migration's last removal, a late copy).
        if sent {
            self.schedule_resend(index);
        }
    }

    /// Sends the replies of peer `index` whose changes are acknowledged now.
    pub(super) fn release(&mut self, index: usize) {
        let me = self.peers[index].id;
        let Some(parts) = self.peers[index].parts.as_mut() else {
            return;
        };
        let filled = parts.master.filled();
        for waiter in parts.master.released() {
            self.send(
                me,
                waiter.client,
                Msg::Reply {
                    op: waiter.op,
                    body: waiter.reply,
                },
            );
        }
        for (owner, zone, backup) in filled {
            let response = self.commit(myriad_meta::Command::ZoneFilled {
                owner,
                zone,
                backup,
            });
            self.log(format!(
                "{me}: copy of zone {owner}/{zone} to {backup} complete: {response:?}"
            ));
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

    /// A master takes an acknowledgement of `backup`.
    pub(super) fn on_ack(&mut self, index: usize, backup: NodeId, body: Bytes) {
        let Ok(ack) = Ack::decode(body) else {
            self.fail(format!("undecodable acknowledgement from {backup}"));
            return;
        };
        let me = self.peers[index].id;
        let Some(parts) = self.peers[index].parts.as_mut() else {
            return;
        };
        let master = &mut parts.master;
        let Some(stream) = master.streams.get_mut(&backup) else {
            return;
        };
        if ack.stream != stream.id {
            return;
        }
        stream.applied = stream.applied.max(ack.applied_seq);
        stream.durable = stream.durable.max(ack.durable_seq);
        let gap = ack.status == AckStatus::Gap;
        if let AckStatus::Refused(reason) = &ack.status {
            // The backup cannot serve this stream (a failed disk): the zones go on
            // without it, as a master replaces a refusing backup.
            master.drop_backup(backup);
            let text = format!("{me} drops backup {backup}: {reason}");
            self.log(text);
        }
        if gap {
            self.push_stream(index, false);
        }
        self.release(index);
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

    /// A master resends what its backups did not acknowledge (lost messages, refusals).
    pub(super) fn resend(&mut self, peer: NodeId, incarnation: u32) {
        let Some(index) = self.peer_index(peer) else {
            return;
        };
        if self.peers[index].incarnation != incarnation || !self.peers[index].up() {
            return;
        }
        if self.peers[index].paused_until > self.queue.now() {
            // Stalled: the timer fires late (still armed).
            let at = self.peers[index].paused_until;
            self.queue.at(at, Event::Resend { peer, incarnation });
            return;
        }
        let durable = self.peers[index]
            .parts
            .as_ref()
            .is_some_and(|p| p.master.waiting.iter().any(|w| w.durable));
        self.peers[index].resend_armed = false;
        self.push_stream(index, durable);
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
}

/// Applies one replication message with the production backup service and, when the
/// message asked for durability, flushes the log engine as the service's durability
/// thread would (synchronously here, so that the run stays deterministic).
pub(super) fn apply_now(service: &BackupService, master: NodeId, body: Bytes) -> Option<Ack> {
    let durable_requested = LogMessage::decode(body.clone()).is_ok_and(|m| m.durable_requested);
    let mut ack = service.apply(master, body)?;
    // The service's own durability thread runs on its own time: its marks are not used.
    ack.durable_seq = 0;
    if durable_requested && ack.status == AckStatus::Ok && service.engine().flush().is_ok() {
        ack.durable_seq = ack.applied_seq;
    }
    Some(ack)
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
