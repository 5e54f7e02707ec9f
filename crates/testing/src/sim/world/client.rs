//! The clients of the event loop: the workload and the recorded history.
//!
//! Job: each client runs a bounded number of operations one at a time: creates first,
//! then puts, gets, removes on the chunks every client created. Values are unique per run
//! (a counter), a remove (at most one per chunk) writes [`TOMBSTONE`] and a get that finds nothing reads it. A
//! client sends to the peer it last found the chunk at (its creator at first), follows
//! `NotOwner` by asking the directory (bounded attempts), and gives up after
//! [`OP_TIMEOUT`] (outcome unknown, cache entry forgotten).
//!
//! Invariants: every operation is recorded once, with the simulated times of its start
//! and end and what the client learned; late replies of an operation given up are ignored.
//!
//! Callers: [`super::World`]'s event dispatch.

use super::*;

impl World {
    /// Starts the next operation of `client`, or ends it.
    pub(super) fn client_next(&mut self, client: usize) {
        if self.clients[client].remaining == 0 {
            return;
        }
        self.clients[client].remaining -= 1;
        let creating = self.known.len() < self.config.clients * self.config.chunks_per_client
            && self.config.ops_per_client - self.clients[client].remaining
                <= self.config.chunks_per_client;
        let kind = if creating || self.known.is_empty() || self.rng.chance(40) {
            self.next_value += 1;
            Kind::Create {
                value: self.next_value,
            }
        } else {
            let cid = self.known[self.rng.index(self.known.len())];
            match self.rng.below(100) {
                0..=44 => Kind::Get { cid },
                45..=94 => {
                    self.next_value += 1;
                    Kind::Put {
                        cid,
                        value: self.next_value,
                    }
                }
                // One remove per chunk: the checker needs each value written once.
                _ if self.removes.insert(cid) => Kind::Remove { cid },
                _ => Kind::Get { cid },
            }
        };
        self.next_op += 1;
        let op = self.next_op;
        let start = self.queue.now();
        self.clients[client].pending = Some(Pending {
            op,
            kind,
            start,
            attempt: 0,
        });
        self.client_send(client);
    }

    /// Sends the pending operation of `client` (again, after a redirect).
    fn client_send(&mut self, client: usize) {
        let Some(pending) = self.clients[client].pending.as_ref() else {
            return;
        };
        let (op, kind, attempt) = (pending.op, pending.kind, pending.attempt);
        let durability = self.scenario.durability.level();
        let (target, request) = match kind {
            Kind::Create { value } => {
                let peer = self.peers[self.rng.index(self.peers.len())].id;
                let payloads = vec![payload(value)];
                (
                    peer,
                    ChunkRequest::CreateWithData {
                        payloads,
                        durability,
                    },
                )
            }
            Kind::Put { cid, value } => {
                let items = vec![(cid, payload(value))];
                (
                    self.route(client, cid),
                    ChunkRequest::Put { items, durability },
                )
            }
            Kind::Get { cid } => (
                self.route(client, cid),
                ChunkRequest::Get { cids: vec![cid] },
            ),
            Kind::Remove { cid } => (
                self.route(client, cid),
                ChunkRequest::Remove {
                    cids: vec![cid],
                    durability,
                },
            ),
        };
        let from = self.clients[client].id;
        self.send(
            from,
            target,
            Msg::Request {
                op,
                body: request.encode(),
            },
        );
        self.queue.after(
            OP_TIMEOUT,
            Event::ClientTimeout {
                client,
                op,
                attempt,
            },
        );
    }

    /// Where `client` sends a request for `cid`.
    fn route(&self, client: usize, cid: ChunkId) -> NodeId {
        self.clients[client]
            .cache
            .get(&cid)
            .copied()
            .unwrap_or(cid.creator())
    }

    /// A reply for `client` from `peer`.
    pub(super) fn client_reply(&mut self, client: usize, peer: NodeId, op: u64, body: Bytes) {
        let Some(pending) = self.clients[client].pending.as_ref() else {
            return;
        };
        if pending.op != op {
            return;
        }
        let kind = pending.kind;
        let Ok(reply) = ChunkReply::decode(body) else {
            self.fail(format!("op{op}: undecodable reply from {peer}"));
            return;
        };
        let (action, outcome, key) = match (kind, &reply) {
            (Kind::Create { value }, ChunkReply::Created(cids)) => match cids.first() {
                Some(&cid) => {
                    self.known.push(cid);
                    self.clients[client].cache.insert(cid, peer);
                    (Action::Write(value), Outcome::Ok, cid)
                }
                None => return self.finish(client, None),
            },
            (Kind::Create { .. }, _) => return self.finish(client, None),
            (_, ChunkReply::Statuses(_) | ChunkReply::Data(_)) if not_owner(&reply) => {
                return self.redirect(client, peer);
            }
            (Kind::Put { cid, value }, ChunkReply::Statuses(items)) => {
                (Action::Write(value), status_outcome(items), cid)
            }
            (Kind::Remove { cid }, ChunkReply::Statuses(items)) => {
                (Action::Write(TOMBSTONE), status_outcome(items), cid)
            }
            (Kind::Get { cid }, ChunkReply::Data(items)) => match items.first() {
                Some(Ok(bytes)) => (Action::Read(Some(value_of(bytes))), Outcome::Ok, cid),
                Some(Err(ItemError::NotFound)) => (Action::Read(Some(TOMBSTONE)), Outcome::Ok, cid),
                _ => (Action::Read(None), Outcome::Unknown, cid),
            },
            (_, other) => {
                let text = reply_text(other);
                self.log(format!("op{op}: unexpected reply {text}"));
                return self.finish(client, None);
            }
        };
        if outcome == Outcome::Ok {
            self.clients[client].cache.insert(key, peer);
        }
        self.finish(client, Some((key, action, outcome)));
    }

    /// Follows a `NotOwner` answer: asks the directory and sends again (bounded).
    fn redirect(&mut self, client: usize, peer: NodeId) {
        let Some(pending) = self.clients[client].pending.as_mut() else {
            return;
        };
        pending.attempt += 1;
        let attempt = pending.attempt;
        let cid = match pending.kind {
            Kind::Put { cid, .. } | Kind::Get { cid } | Kind::Remove { cid } => cid,
            Kind::Create { .. } => return,
        };
        if attempt >= ATTEMPTS_MAX {
            return self.give_up(client);
        }
        let owner = self.owner_in_directory(cid);
        self.log(format!(
            "client {} redirected by {peer}: {cid} is at {owner}",
            self.clients[client].id
        ));
        if owner == NOBODY || owner == peer {
            self.clients[client].cache.remove(&cid);
        } else {
            self.clients[client].cache.insert(cid, owner);
        }
        self.client_send(client);
    }

    /// The pending operation of `client` timed out (if it is still attempt `attempt`).
    pub(super) fn client_timeout(&mut self, client: usize, op: u64, attempt: u32) {
        let current = self.clients[client]
            .pending
            .as_ref()
            .map(|p| (p.op, p.attempt));
        if current == Some((op, attempt)) {
            self.give_up(client);
        }
    }

    /// Ends the pending operation with an unknown outcome.
    fn give_up(&mut self, client: usize) {
        let Some(pending) = self.clients[client].pending.as_ref() else {
            return;
        };
        let record = match pending.kind {
            Kind::Create { .. } => None,
            Kind::Put { cid, value } => Some((cid, Action::Write(value), Outcome::Unknown)),
            Kind::Remove { cid } => Some((cid, Action::Write(TOMBSTONE), Outcome::Unknown)),
            Kind::Get { cid } => Some((cid, Action::Read(None), Outcome::Unknown)),
        };
        if let Some((cid, _, _)) = record {
            self.clients[client].cache.remove(&cid);
        }
        self.finish(client, record);
    }

    /// Records the pending operation of `client` and schedules its next one.
    fn finish(&mut self, client: usize, record: Option<(ChunkId, Action, Outcome)>) {
        let Some(pending) = self.clients[client].pending.take() else {
            return;
        };
        let end = self.queue.now();
        if let Some((cid, action, outcome)) = record {
            self.log(format!(
                "client {} op{} on {cid}: {action:?} {outcome:?}",
                self.clients[client].id, pending.op
            ));
            self.history.push(Operation {
                key: cid.raw(),
                action,
                start: pending.start,
                end,
                outcome,
            });
        }
        self.stats.operations += 1;
        let think = self.rng.below(300);
        self.queue.after(think, Event::ClientNext { client });
    }
}

/// A chunk's payload holding `value` (8 bytes, little-endian).
fn payload(value: u64) -> Bytes {
    Bytes::copy_from_slice(&value.to_le_bytes())
}

/// Whether a one-item reply says `NotOwner`.
fn not_owner(reply: &ChunkReply) -> bool {
    match reply {
        ChunkReply::Statuses(items) => matches!(items.first(), Some(Err(ItemError::NotOwner))),
        ChunkReply::Data(items) => matches!(items.first(), Some(Err(ItemError::NotOwner))),
        _ => false,
    }
}

/// What a change's one-item status tells the client.
fn status_outcome(items: &[Result<(), ItemError>]) -> Outcome {
    match items.first() {
        Some(Ok(())) => Outcome::Ok,
        // Nothing to change: certainly not applied.
        Some(Err(ItemError::NotFound)) => Outcome::Failed,
        _ => Outcome::Unknown,
    }
}
