//! One simulated peer: the production chunk service and backup service, the master side
//! of its replication stream, and its disk.
//!
//! Job: [`SimPeer`] holds what a peer process holds. Production code: the peer's
//! [`ChunkService`] (requests, ownership view) over its [`MemoryManager`], and the
//! [`BackupService`] (applies other peers' replication messages) over a [`LogEngine`] on
//! the fault-injecting [`MemStorage`]. The master side of replication ([`Master`]) is the
//! simulator's own: it numbers the operations of the peer's stream, sends them with the
//! production wire format ([`wire::encode_log_message`]) and holds a client's reply until
//! the backups acknowledged what the durability level asks.
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
use myriad_replication::wire::{self, Op};
use myriad_replication::{BackupConfig, BackupService};
use myriad_types::NodeId;

use super::net::Time;

/// Local IDs one incarnation may hand out: incarnation `k` starts at `k << LID_SHIFT`.
pub const LID_SHIFT: u32 = 20;
/// Operations per replication message at most.
const OPS_PER_MESSAGE: usize = 16;

/// A client's reply held until the backups acknowledged `seq`.
#[derive(Debug)]
pub struct Waiter {
    /// The last stream sequence number the reply depends on.
    pub seq: u64,
    /// Whether the backups must have it on disk (`durable`) or in memory (`replicated`).
    pub durable: bool,
    /// The client.
    pub client: NodeId,
    /// The client's operation.
    pub op: u64,
    /// The encoded reply.
    pub reply: Bytes,
}

/// The master side of a peer's replication stream (simulator code, see the module doc).
#[derive(Debug)]
pub struct Master {
    /// The stream ID (higher for every incarnation).
    pub stream: u64,
    /// The zone every chunk this incarnation creates belongs to.
    pub zone: u32,
    /// The zone's backups.
    pub backups: Vec<NodeId>,
    /// Every operation of the stream; sequence number `n` is `log[n - 1]`.
    pub log: Vec<Op>,
    /// Per backup, the last sequence number it acknowledged as applied.
    pub applied: BTreeMap<NodeId, u64>,
    /// Per backup, the last sequence number it acknowledged as durable.
    pub durable: BTreeMap<NodeId, u64>,
    /// Replies waiting for acknowledgements.
    pub waiting: Vec<Waiter>,
}

impl Master {
    /// The replication messages that bring `backup` up to date (from its last
    /// acknowledgement on), at most `OPS_PER_MESSAGE` operations each.
    pub fn catch_up(&self, backup: NodeId, durable: bool) -> Vec<Bytes> {
        let from = self.applied.get(&backup).copied().unwrap_or(0) as usize;
        self.log[from.min(self.log.len())..]
            .chunks(OPS_PER_MESSAGE)
            .enumerate()
            .map(|(index, ops)| {
                let first = (from + index * OPS_PER_MESSAGE + 1) as u64;
                wire::encode_log_message(self.stream, first, durable, ops)
            })
            .collect()
    }

    /// The replies whose operations every backup acknowledged (taken out).
    pub fn released(&mut self) -> Vec<Waiter> {
        let applied = self
            .backups
            .iter()
            .map(|b| self.applied.get(b).copied().unwrap_or(0))
            .min()
            .unwrap_or(u64::MAX);
        let durable = self
            .backups
            .iter()
            .map(|b| self.durable.get(b).copied().unwrap_or(0))
            .min()
            .unwrap_or(u64::MAX);
        let (done, waiting): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.seq <= if w.durable { durable } else { applied });
        self.waiting = waiting;
        done
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
        }
    }

    /// Starts the current incarnation with zone backups `backups`; the log engine opens
    /// what the disk holds. `bug_no_freeze` sets the backup service's test-only switch.
    pub fn start(&mut self, backups: Vec<NodeId>, bug_no_freeze: bool) -> Result<(), StartError> {
        let mem = MemoryManager::new(MemoryConfig {
            node_id: self.id,
            region_bytes: 4 << 20,
            spare_local_ids_max: 0,
            lock_timeout: Duration::from_millis(100),
            shards: 1,
            huge_pages: false,
            ..MemoryConfig::default()
        })
        .map_err(|e| StartError::Memory(e.to_string()))?;
        let lid_base = u64::from(self.incarnation) << LID_SHIFT;
        mem.start_local_ids_at(lid_base.max(1));
        let service = Arc::new(ChunkService::new(Arc::new(mem), self.id));
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
        self.parts = Some(PeerParts {
            service,
            backup: Arc::new(backup),
            master: Master {
                stream: u64::from(self.incarnation) + 1,
                zone: self.incarnation,
                backups,
                log: Vec::new(),
                applied: BTreeMap::new(),
                durable: BTreeMap::new(),
                waiting: Vec::new(),
            },
            lid_base,
        });
        self.apply_order.clear();
        Ok(())
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
