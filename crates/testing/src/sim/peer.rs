//! One simulated peer: the production chunk service and backup service, the master side
//! of its replication stream, and its disk.
//!
//! Job: [`SimPeer`] holds what a peer process holds. Production code: the peer's
//! [`ChunkService`] (requests, ownership view) over its [`MemoryManager`], and the
//! [`BackupService`] (applies other peers' replication messages) over a [`LogEngine`] on
//! the fault-injecting [`MemStorage`]; the production [`Placement`] of its zones' backups.
//! The master side of replication ([`Master`]) is the simulator's own: one sequenced
//! stream per backup carrying the operations of every zone that backup serves (the own
//! zone and adopted ones, [`SimZone`]), sent in the production wire format
//! ([`wire::encode_log_message`]); it holds a client's reply until the backups
//! acknowledged what the durability level asks.
//!
//! Invariants:
//! - A crash drops everything but [`SimPeer::storage`] (memory lost, disk kept, torn at
//!   the crash by [`MemStorage::crash`]); a restart reopens the log engine from it.
//! - A zone's backups are distinct and never the zone's owner.
//!
//! Callers: the event loop ([`super::world`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_backup_log::{LogConfig, LogEngine, MemStorage};
use myriad_mem::{MemoryConfig, MemoryManager};
use myriad_node::peer::ChunkService;
use myriad_placement::{Candidate, Placement, Strategy};
use myriad_replication::wire::{self, Op};
use myriad_replication::{BackupConfig, BackupService};
use myriad_types::{ChunkId, NodeId};
use rand::rngs::SmallRng;

use super::net::Time;

/// Local IDs a peer reserves (`Command::ReserveLids`) when it starts: its next
/// incarnation starts above them.
pub const LID_RESERVE: u64 = 1 << 20;
/// Operations per replication message at most.
const OPS_PER_MESSAGE: usize = 16;

/// A client's reply held until the backups acknowledged what it depends on.
#[derive(Debug)]
pub struct Waiter {
    /// Per backup, the stream and its last sequence number the reply depends on.
    pub needs: Vec<Need>,
    /// Whether the backups must have it on disk (`durable`) or in memory (`replicated`).
    pub durable: bool,
    /// The client.
    pub client: NodeId,
    /// The client's operation.
    pub op: u64,
    /// The encoded reply.
    pub reply: Bytes,
}

/// What a reply or a copy waits for: `(backup, stream ID, sequence number)`.
pub type Need = (NodeId, u64, u64);

/// One backup zone a master replicates: its own zone, or a zone it adopted after
/// restoring it (same log identity as at its failed owner).
#[derive(Debug, Clone)]
pub struct SimZone {
    /// The log owner (this peer for its own zone).
    pub owner: NodeId,
    /// The zone number within the log owner.
    pub zone: u32,
    /// Its backups, first backup first.
    pub backups: Vec<NodeId>,
    /// The CIDs it covers, as `(creator, first, last)` local ID ranges.
    pub ranges: Vec<(NodeId, u64, u64)>,
    /// The position of its last change (production `ZoneState::position`).
    pub position: u64,
}

impl SimZone {
    /// Whether the zone covers `cid`.
    pub fn covers(&self, cid: ChunkId) -> bool {
        let lid = cid.local_id();
        self.ranges.iter().any(|&(creator, first, last)| {
            creator == cid.creator() && (first..=last).contains(&lid)
        })
    }
}

/// The operations a master sent one backup, and what it acknowledged.
#[derive(Debug)]
pub struct Stream {
    /// The stream's ID (a new stream to a backup gets a higher one).
    pub id: u64,
    /// Every operation of the stream; sequence number `n` is `log[n - 1]`.
    pub log: Vec<Op>,
    /// The last sequence number the backup acknowledged as applied.
    pub applied: u64,
    /// The last sequence number the backup acknowledged as durable.
    pub durable: u64,
}

/// The master side of a peer's replication (simulator code, see the module doc): one
/// sequenced stream per backup carrying the operations of every zone the backup serves.
#[derive(Debug)]
pub struct Master {
    /// The ID of the next stream opened (higher for every incarnation and stream).
    pub next_stream: u64,
    /// Its zones: the own zone first, then adopted ones.
    pub zones: Vec<SimZone>,
    /// Per backup, its stream.
    pub streams: BTreeMap<NodeId, Stream>,
    /// Replies waiting for acknowledgements.
    pub waiting: Vec<Waiter>,
    /// Copies of a zone to an added backup not acknowledged yet.
    pub copies: Vec<Need>,
    /// Complete copies (no chunk left to read again) whose last operation is not durable
    /// yet: `(log owner, zone, last operation)`; then the backup holds the whole zone
    /// (`ZoneFilled`, production `Replicator`'s `resync`).
    pub fills: Vec<(NodeId, u32, Need)>,
}

impl Master {
    /// Whether `backup` still backs any zone of this master.
    pub fn backs(&self, backup: NodeId) -> bool {
        self.zones.iter().any(|z| z.backups.contains(&backup))
    }

    /// The zone covering `cid`, if any.
    pub fn zone_of(&self, cid: ChunkId) -> Option<usize> {
        self.zones.iter().position(|z| z.covers(cid))
    }

    /// Appends `op` to the streams of `zone`'s backups; what a reply depending on it
    /// waits for: `(backup, seq)` pairs.
    pub fn record(&mut self, zone: usize, mut op: Op) -> Vec<Need> {
        let Some(z) = self.zones.get_mut(zone) else {
            return Vec::new();
        };
        // The zone's next position (production `submit`).
        z.position += 1;
        op.set_seq(z.position);
        let backups = z.backups.clone();
        backups
            .into_iter()
            .map(|backup| {
                let stream = self.open_stream(backup);
                stream.log.push(op.clone());
                (backup, stream.id, stream.log.len() as u64)
            })
            .collect()
    }

    /// The stream to `backup`, opened (with a new ID) if there is none.
    pub fn open_stream(&mut self, backup: NodeId) -> &mut Stream {
        let next = &mut self.next_stream;
        self.streams.entry(backup).or_insert_with(|| {
            *next += 1;
            Stream {
                id: *next,
                log: Vec::new(),
                applied: 0,
                durable: 0,
            }
        })
    }

    /// The replication messages that bring `backup` up to date (from its last
    /// acknowledgement on, its last durable one if `durable`), at most `OPS_PER_MESSAGE`
    /// operations each.
    pub fn catch_up(&self, backup: NodeId, durable: bool) -> Vec<Bytes> {
        let Some(stream) = self.streams.get(&backup) else {
            return Vec::new();
        };
        // A backup whose flush failed applied more than it made durable: what it has
        // not made durable goes again (it takes them as duplicates and flushes).
        let from = if durable {
            stream.durable.min(stream.applied)
        } else {
            stream.applied
        } as usize;
        stream.log[from.min(stream.log.len())..]
            .chunks(OPS_PER_MESSAGE)
            .enumerate()
            .map(|(index, ops)| {
                let first = (from + index * OPS_PER_MESSAGE + 1) as u64;
                wire::encode_log_message(stream.id, first, durable, ops)
            })
            .collect()
    }

    /// Whether a need is acknowledged (applied, or durable if `durable`), or no longer
    /// needed (its stream ended: the backup failed, restarted or refused).
    fn acknowledged(&self, (backup, stream, seq): Need, durable: bool) -> bool {
        match self.streams.get(&backup) {
            Some(s) if s.id == stream && self.backs(backup) => {
                (if durable { s.durable } else { s.applied }) >= seq
            }
            _ => true,
        }
    }

    /// The replies whose operations every backup acknowledged (taken out); drops the
    /// copies acknowledged.
    pub fn released(&mut self) -> Vec<Waiter> {
        let waiting = std::mem::take(&mut self.waiting);
        let (done, waiting): (Vec<Waiter>, Vec<Waiter>) = waiting.into_iter().partition(|w| {
            w.needs
                .iter()
                .all(|&need| self.acknowledged(need, w.durable))
        });
        self.waiting = waiting;
        let copies = std::mem::take(&mut self.copies);
        self.copies = copies
            .into_iter()
            .filter(|&copy| !self.acknowledged(copy, false))
            .collect();
        done
    }

    /// The complete copies now durable on their backup (taken out), as `(log owner, zone,
    /// backup)`; those whose backup left the zone or whose stream ended are dropped.
    pub fn filled(&mut self) -> Vec<(NodeId, u32, NodeId)> {
        let fills = std::mem::take(&mut self.fills);
        let mut done = Vec::new();
        for (owner, zone, need) in fills {
            let (backup, stream, seq) = need;
            let listed = self
                .zones
                .iter()
                .any(|z| z.owner == owner && z.zone == zone && z.backups.contains(&backup));
            match self.streams.get(&backup) {
                Some(s) if listed && s.id == stream => {
                    if s.durable >= seq {
                        done.push((owner, zone, backup));
                    } else {
                        self.fills.push((owner, zone, need));
                    }
                }
                _ => {}
            }
        }
        done
    }

    /// Whether every stream is acknowledged to its end and no copy is pending.
    pub fn settled(&self) -> bool {
        self.waiting.is_empty()
            && self.copies.is_empty()
            && self
                .streams
                .iter()
                .all(|(b, s)| !self.backs(*b) || s.applied >= s.log.len() as u64)
    }

    /// A short description for a failure: zones, streams, waiting replies, copies.
    pub fn describe(&self) -> String {
        let zones: Vec<String> = self
            .zones
            .iter()
            .map(|z| format!("{}/{} -> {:?}", z.owner, z.zone, z.backups))
            .collect();
        let streams: Vec<String> = self
            .streams
            .iter()
            .map(|(b, s)| {
                format!(
                    "{b}: stream {} sent {} applied {} durable {}",
                    s.id,
                    s.log.len(),
                    s.applied,
                    s.durable
                )
            })
            .collect();
        format!(
            "zones {zones:?} streams {streams:?} waiting {:?} copies {:?}",
            self.waiting
                .iter()
                .map(|w| (w.op, &w.needs, w.durable))
                .collect::<Vec<_>>(),
            self.copies
        )
    }

    /// Takes `backup` out of every zone (it failed, restarted or refused) and ends its
    /// stream (a later one to it starts afresh); whether it backed a zone.
    pub fn drop_backup(&mut self, backup: NodeId) -> bool {
        let backed = self.backs(backup);
        for zone in &mut self.zones {
            zone.backups.retain(|&b| b != backup);
        }
        self.streams.remove(&backup);
        self.copies.retain(|&(b, _, _)| b != backup);
        backed
    }
}

/// What a running incarnation holds in memory.
pub struct PeerParts {
    /// Production: requests and the ownership view.
    pub service: Arc<ChunkService>,
    /// Production: the backup side.
    pub backup: Arc<BackupService>,
    /// Simulator: the master side.
    pub master: Master,
    /// The first local ID of this incarnation.
    pub lid_base: u64,
    /// Production: the choice of backups (new zones, replacements, adoptions).
    pub placement: Placement,
    /// The placement's random choices.
    pub placement_rng: SmallRng,
}

/// Where a peer incarnation starts.
#[derive(Debug, Clone)]
pub struct Start {
    /// Its own zone's number.
    pub zone: u32,
    /// Its first fresh local ID.
    pub lid_base: u64,
    /// Its own zone's backups.
    pub backups: Vec<NodeId>,
    /// The placement that chose them (kept for later choices).
    pub placement: Placement,
    /// The placement's random choices.
    pub placement_rng: SmallRng,
}

/// The production placement of a peer's zones: disjunctive first backups, as a
/// replicator's default.
pub fn placement(node: NodeId, replication: usize) -> Placement {
    Placement::new(
        Candidate {
            node,
            rack: 0,
            switch: 0,
        },
        replication,
        Strategy::DISJUNCTIVE,
    )
}

/// One peer of the simulated cluster.
pub struct SimPeer {
    /// Its node ID.
    pub id: NodeId,
    /// Incremented at every crash: messages to an earlier incarnation are lost.
    pub incarnation: u32,
    /// The running incarnation (`None` while crashed).
    pub parts: Option<PeerParts>,
    /// Its disk (kept across crashes).
    pub storage: MemStorage,
    /// Paused (as by SIGSTOP) until then: it applies and serves nothing before.
    pub paused_until: Time,
    /// Per master, the delivery time of the last replication message it accepted (they
    /// are applied one at a time in order).
    pub apply_order: BTreeMap<NodeId, Time>,
    /// A resend round of the running incarnation is scheduled
    /// ([`World::schedule_resend`](super::world)).
    pub resend_armed: bool,
    /// The backup service opened by [`SimPeer::open`] for the next start.
    opened: Option<Arc<BackupService>>,
}

impl std::fmt::Debug for SimPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimPeer")
            .field("id", &self.id)
            .field("incarnation", &self.incarnation)
            .field("up", &self.parts.is_some())
            .finish_non_exhaustive()
    }
}

/// The log engine's configuration in the simulator: small, and with background work at
/// long intervals so that it mostly runs when the simulator asks (flushes, recovery).
pub fn log_config() -> LogConfig {
    LogConfig {
        flush_interval: Duration::from_secs(3600),
        reorg_interval: Duration::from_secs(3600),
        wait_timeout: Duration::from_secs(10),
        recovery_threads: 1,
        write_threads: 1,
        ..LogConfig::small_for_tests()
    }
}

/// Why a peer incarnation could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The memory manager.
    #[error("memory manager: {0}")]
    Memory(String),
    /// The log engine did not open (after a crash: the disk did not reopen).
    #[error("log engine: {0}")]
    Log(String),
    /// The backup service.
    #[error("backup service: {0}")]
    Backup(String),
}

impl SimPeer {
    /// A peer that has not started yet.
    pub fn new(id: NodeId) -> SimPeer {
        SimPeer {
            id,
            incarnation: 0,
            parts: None,
            storage: MemStorage::new(),
            paused_until: 0,
            apply_order: BTreeMap::new(),
            resend_armed: false,
            opened: None,
        }
    }

    /// Starts the current incarnation: its own zone `zone` (backups `backups`, chosen
    /// with `placement`), fresh local IDs from `lid_base` (both from the metadata's
    /// [`myriad_meta::PeerBases`]); the log engine opens what the disk holds.
    /// `bug_no_freeze` sets the backup service's test-only switch.
    pub fn start(&mut self, start: Start, bug_no_freeze: bool) -> Result<(), StartError> {
        let Start {
            zone,
            lid_base,
            backups,
            placement,
            placement_rng,
        } = start;
        let mem = MemoryManager::new(MemoryConfig {
            node_id: self.id,
            region_bytes: 4 << 20,
            spare_local_ids_max: 0,
            lock_timeout: Duration::from_millis(1),
            shards: 1,
            huge_pages: false,
            ..MemoryConfig::default()
        })
        .map_err(|e| StartError::Memory(e.to_string()))?;
        mem.start_local_ids_at(lid_base.max(1));
        let service = Arc::new(ChunkService::new(Arc::new(mem), self.id));
        let backup = match self.opened.take() {
            Some(backup) => backup,
            None => self.open_backup(bug_no_freeze)?,
        };
        self.parts = Some(PeerParts {
            service,
            backup,
            master: Master {
                next_stream: (u64::from(self.incarnation) + 1) << 32,
                zones: vec![SimZone {
                    owner: self.id,
                    zone,
                    backups,
                    ranges: vec![(self.id, lid_base, myriad_types::LOCAL_ID_MAX)],
                    position: 0,
                }],
                streams: BTreeMap::new(),
                waiting: Vec::new(),
                copies: Vec::new(),
                fills: Vec::new(),
            },
            lid_base,
            placement,
            placement_rng,
        });
        self.apply_order.clear();
        Ok(())
    }

    /// Opens the log engine on the disk and the backup service over it: the first step
    /// of a start (a production peer opens them before it joins). Kept for [`Self::start`].
    pub fn open(&mut self, bug_no_freeze: bool) -> Result<(), StartError> {
        let backup = self.open_backup(bug_no_freeze)?;
        self.opened = Some(backup);
        Ok(())
    }

    fn open_backup(&self, bug_no_freeze: bool) -> Result<Arc<BackupService>, StartError> {
        let engine = LogEngine::open(log_config(), Arc::new(self.storage.clone()))
            .map_err(|e| StartError::Log(e.to_string()))?;
        let backup = BackupService::new(
            Arc::new(engine),
            BackupConfig {
                bug_no_recovery_freeze: bug_no_freeze,
                ..BackupConfig::default()
            },
        )
        .map_err(|e| StartError::Backup(e.to_string()))?;
        Ok(Arc::new(backup))
    }

    /// Crashes the running incarnation: memory lost, the disk keeps what was synced plus a
    /// torn prefix of the rest (chosen by `tear_seed`).
    pub fn crash(&mut self, tear_seed: u64) {
        // Dropping the parts stops the backup service's and the engine's threads.
        self.parts = None;
        self.storage.crash(tear_seed);
        self.incarnation += 1;
        self.paused_until = 0;
    }

    /// Whether an incarnation runs.
    pub fn up(&self) -> bool {
        self.parts.is_some()
    }
}
