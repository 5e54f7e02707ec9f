//! One simulated peer: the production chunk service, backup service and replicator, and
//! its disk.
//!
//! Job: [`SimPeer`] holds what a peer process holds, all of it production code: the
//! peer's [`ChunkService`] (requests, ownership view) over its [`MemoryManager`], the
//! [`BackupService`] (applies other peers' replication messages) over a [`LogEngine`] on
//! the fault-injecting [`MemStorage`], and the master side of replication, a driven
//! production `Replicator` ([`SimMaster`]: its zones, placement, streams, waits and
//! copies).
//!
//! Invariants:
//! - A crash drops everything but [`SimPeer::storage`] (memory lost, disk kept, torn at
//!   the crash by [`MemStorage::crash`]); a restart reopens the log engine from it.
//!
//! Callers: the event loop ([`super::world`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use myriad_backup_log::{LogConfig, LogEngine, MemStorage};
use myriad_mem::{MemoryConfig, MemoryManager};
use myriad_node::peer::ChunkService;
use myriad_node::replication::MemorySource;
use myriad_replication::{BackupConfig, BackupService};
use myriad_types::NodeId;

use super::master::{replicator_config, SimMaster};
use super::net::Time;

/// Local IDs a peer reserves (`Command::ReserveLids`) when it starts: its next
/// incarnation starts above them.
pub const LID_RESERVE: u64 = 1 << 20;

/// What a running incarnation holds in memory.
pub struct PeerParts {
    /// Production: requests and the ownership view.
    pub service: Arc<ChunkService>,
    /// Production: the backup side.
    pub backup: Arc<BackupService>,
    /// Production: the master side (a driven replicator).
    pub master: SimMaster,
    /// The first local ID of this incarnation.
    pub lid_base: u64,
}

/// Where a peer incarnation starts.
#[derive(Debug, Clone)]
pub struct Start {
    /// Its first zone's number (above its earlier incarnations' zones).
    pub zone_base: u32,
    /// Its first fresh local ID.
    pub lid_base: u64,
    /// Backups per zone.
    pub backups: usize,
    /// The seed of its placement's random choices.
    pub placement_seed: u64,
    /// Simulated time now.
    pub now: Time,
    /// The test-only switch of the replicator (`Bug::KeepDivergedSurvivors`).
    pub bug_no_copy_reset: bool,
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
    /// A copy step of the running incarnation is scheduled
    /// ([`World::schedule_copies`](super::world)).
    pub copy_armed: bool,
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
/// long intervals (and no idle release) so that it mostly runs when the simulator asks
/// (flushes, recovery).
pub fn log_config() -> LogConfig {
    LogConfig {
        flush_interval: Duration::from_secs(3600),
        reorg_interval: Duration::from_secs(3600),
        // No idle release: it runs on the wall clock, which a replay does not repeat.
        idle_release_after: Duration::ZERO,
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
    /// The replicator refused its configuration.
    #[error("replicator: {0}")]
    Replicator(String),
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
            copy_armed: false,
            opened: None,
        }
    }

    /// Starts the current incarnation: its zones numbered from `zone_base`, fresh local IDs
    /// from `lid_base` (both from the metadata's [`myriad_meta::PeerBases`]); the log
    /// engine opens what the disk holds.
    /// `bug_no_freeze` sets the backup service's test-only switch.
    pub fn start(&mut self, start: Start, bug_no_freeze: bool) -> Result<(), StartError> {
        let Start {
            zone_base,
            lid_base,
            backups,
            placement_seed,
            now,
            bug_no_copy_reset,
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
        let mem = Arc::new(mem);
        let service = Arc::new(ChunkService::new(Arc::clone(&mem), self.id));
        let backup = match self.opened.take() {
            Some(backup) => backup,
            None => self.open_backup(bug_no_freeze)?,
        };
        let config = replicator_config(
            self.id,
            backups,
            zone_base,
            placement_seed,
            bug_no_copy_reset,
        );
        let master = SimMaster::new(config, self.incarnation, MemorySource::new(mem), now)
            .map_err(|e| StartError::Replicator(e.to_string()))?;
        self.parts = Some(PeerParts {
            service,
            backup,
            master,
            lid_base,
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
