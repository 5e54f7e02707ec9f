//! A deterministic simulation of the cluster: one process, one seed, every interleaving
//! replayable.
//!
//! # Job
//! [`run`] simulates a small cluster — peers, the superpeers' metadata, concurrent
//! clients — from a seed: simulated time (an event queue, no wall clock), a simulated
//! network (delay, loss, duplication, reordering across connections, partitions, one-way
//! links, fencing), several crashes per run (memory lost, disk kept and torn) with
//! recovery, adoption and re-replication between them, restarts, pauses (long ones get
//! the peer suspected and declared failed while it holds its memory), failing disk syncs
//! and disk read errors during recovery. It records the clients' history and checks it per chunk with the
//! linearizability checker, plus the cluster's invariants; a failing run returns its seed
//! and a trace of every event, and running the seed again replays it exactly.
//!
//! What runs is production code wherever the cluster's logic is: each peer's
//! [`myriad_node::peer::ChunkService`] (requests, ownership view, the restarted peer's
//! take-back of its IDs) over a real [`myriad_mem::MemoryManager`], and its
//! [`myriad_replication::BackupService`] over a real [`myriad_backup_log::LogEngine`] on
//! the fault-injecting [`myriad_backup_log::MemStorage`] (applying replication messages,
//! reading zones back for recovery, reopening after a crash), and its
//! [`myriad_replication::Replicator`], driven on the simulator's thread
//! ([`myriad_replication::Replicator::driven`]: zones, placement, streams, resends,
//! waits, replacements, adoptions, copies). Messages use the production
//! wire formats. Where production code is preempted by other threads at a point that
//! matters, it marks an interleaving point ([`myriad_backup_log::interleave`]) and the
//! simulator runs, at that point, what the seed says happens meanwhile. The superpeers'
//! metadata is the production [`myriad_meta::MetaState`], fed the production commands
//! through a real openraft group of three superpeers ([`raft`]: deterministic runtime,
//! simulated RPC delays, a leader crashed or cut off and back); backups are placed by the
//! production [`myriad_placement::Placement`]; a restorer reads with the production
//! [`myriad_node::recovery::insert_recovered_where`] (only what the directory routes to
//! the zone's writer) and chooses its surviving backups with the production
//! [`myriad_node::recovery::surviving`].
//! The simulator's own code stands in for the threads and sockets (the messaging layer),
//! the superpeers' failure detection, the chunk service's glue to its replicator, and
//! the Raft log and state machine stores (in memory): see `docs/testing.md` for what is
//! and is not simulated.
//!
//! # Invariants
//! - A run depends on its seed and [`SimConfig`] only: [`rng::SimRng`] streams of the
//!   seed, ordered maps, simulated time (the superpeer group's on a paused Tokio clock,
//!   with a watch channel that wakes its waiters in order, `raft_rt`). (The log engine's own background threads are slowed down to hour
//!   intervals and their work is forced at the simulator's steps: flushes, recovery.)
//! - A run is bounded: a bounded number of client operations, bounded retries, and
//!   [`SimConfig::time_limit`] of simulated time.
//!
//! # Who calls it
//! `crates/testing/tests/sim.rs` (a few hundred seeds, the re-introduced bugs) and the
//! `myriad-simulate` binary behind `scripts/simulate`.

mod check;
mod master;
pub mod net;
mod peer;
pub mod raft;
mod raft_rt;
pub mod rng;
mod world;

use net::{NetFaults, Time};
use rng::SimRng;

pub use world::TOMBSTONE;

/// A fixed bug re-introduced behind a test-only switch, for showing that the simulator
/// finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// The backup does not freeze a zone it reads back for a recovery (commit 48cc98a):
    /// an append of the failed owner racing the read drops a chunk from the result.
    NoRecoveryFreeze,
    /// A restarted peer takes its earlier IDs back before the ranges its restorers took
    /// over (commit a43e2b1): a window of false `NotFound` answers.
    IdsBeforeRanges,
    /// A restorer keeps every surviving backup whatever history of the zone it holds (the
    /// code before zone positions): an `async` change only some backups had comes back,
    /// or one the restorer had is lost, at the zone's next recovery (seeds 5833, 5694).
    /// The simulator's call of the production decision is switched, and its master
    /// sends no reset ahead of a copy.
    KeepDivergedSurvivors,
    /// A restorer stores and takes over every chunk of the zone it reads back, also the
    /// ones the directory routes to another peer (the code before this fix): the copy a
    /// migration left at its target when the insert's answer was lost and the source kept
    /// the chunk comes back, stale, when the target's zone is recovered (seed 63). The
    /// simulator's restorer skips the production filter (`Routes::restores`).
    TakeOverOrphans,
}

/// The durability level of a run's changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimDurability {
    /// Acknowledged once in the owner's memory; an owner crash may lose recent writes.
    Async,
    /// Acknowledged once every backup applied it.
    Replicated,
    /// Acknowledged once every backup flushed it to its disk.
    Durable,
}

impl SimDurability {
    /// The wire level (`myriad_proto::chunk::DURABILITY_*`).
    pub fn level(self) -> u8 {
        match self {
            SimDurability::Async => myriad_proto::chunk::DURABILITY_ASYNC,
            SimDurability::Replicated => myriad_proto::chunk::DURABILITY_REPLICATED,
            SimDurability::Durable => myriad_proto::chunk::DURABILITY_DURABLE,
        }
    }
}

/// The shape of the simulated cluster and workload.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Peers (node IDs 1..=peers).
    pub peers: usize,
    /// Backups per zone.
    pub backups: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// Chunks each client creates first.
    pub chunks_per_client: usize,
    /// Operations per client, creates included.
    pub ops_per_client: usize,
    /// Crashes per run at most.
    pub crashes_max: usize,
    /// Faults start before this simulated time (µs).
    pub fault_horizon: Time,
    /// A run still busy at this simulated time fails (µs).
    pub time_limit: Time,
    /// The durability level, or `None` to let the seed choose.
    pub durability: Option<SimDurability>,
    /// Whether faults are drawn at all.
    pub faults: bool,
    /// Whether the workload migrates chunks between peers (on by default; off with
    /// `--no-migrations`, which replays seeds recorded before migrations were on).
    pub migrations: bool,
    /// A re-introduced bug, or `None` for today's code.
    pub bug: Option<Bug>,
    /// Whether metadata commands commit through the simulated openraft group of
    /// superpeers (on by default; off with `--no-raft`: they apply at once).
    pub raft: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            peers: 4,
            backups: 2,
            clients: 4,
            chunks_per_client: 3,
            ops_per_client: 40,
            crashes_max: 3,
            fault_horizon: 40_000,
            time_limit: 30_000_000,
            durability: None,
            faults: true,
            raft: true,
            migrations: true,
            bug: None,
        }
    }
}

/// What a seed chose for its run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The durability level of every change.
    pub durability: SimDurability,
    /// Network faults.
    pub net: NetFaults,
    /// Crashes attempted.
    pub crashes: usize,
    /// Partitions (half of them one-way).
    pub partitions: usize,
    /// Pauses of a peer.
    pub pauses: usize,
    /// Pauses long enough to get the peer suspected and declared failed, per mille.
    pub long_pause_per_mille: u32,
    /// Periods of failing syncs on a peer's disk.
    pub disk_faults: usize,
    /// Replication messages a backup is slow to apply, per mille.
    pub slow_apply_per_mille: u32,
    /// Recoveries whose first restorer's disk fails to read, per mille (only in runs
    /// without failing syncs).
    pub read_fault_per_mille: u32,
    /// Migrations of a chunk between peers while the clients run.
    pub migrations: usize,
}

impl Scenario {
    /// Draws a scenario.
    fn draw(rng: &mut SimRng, config: &SimConfig) -> Scenario {
        let durability = config.durability.unwrap_or(match rng.below(4) {
            0 => SimDurability::Async,
            1 => SimDurability::Durable,
            _ => SimDurability::Replicated,
        });
        if !config.faults {
            return Scenario {
                durability,
                net: NetFaults::default(),
                crashes: 0,
                partitions: 0,
                pauses: 0,
                long_pause_per_mille: 0,
                disk_faults: 0,
                slow_apply_per_mille: 0,
                read_fault_per_mille: 0,
                migrations: 0,
            };
        }
        let net = NetFaults {
            drop_per_mille: rng.below(30) as u32,
            duplicate_per_mille: rng.below(30) as u32,
            delay_min: rng.between(10, 100),
            delay_max: rng.between(100, 2_000),
        };
        let disk_faults = if durability == SimDurability::Durable {
            rng.below(2) as usize
        } else {
            0
        };
        Scenario {
            durability,
            net,
            crashes: if rng.chance(750) {
                1 + rng.below(config.crashes_max as u64) as usize
            } else {
                0
            },
            partitions: rng.below(3) as usize,
            pauses: rng.below(3) as usize,
            long_pause_per_mille: if rng.chance(400) { 500 } else { 0 },
            disk_faults,
            slow_apply_per_mille: rng.below(1000) as u32,
            // A read error at one backup while another one's disk fails is two disk
            // faults in one zone, more than R = 2 backups promise to survive.
            read_fault_per_mille: if disk_faults == 0 && rng.chance(300) {
                500
            } else {
                0
            },
            // Drawn in every run (so that a seed draws the same faults with and
            // without migrations), scheduled only when they are on.
            migrations: if config.migrations {
                rng.below(6) as usize
            } else {
                let _ = rng.below(6);
                0
            },
        }
    }
}

/// Counters of one run.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    /// Events handled.
    pub events: u64,
    /// Client operations finished.
    pub operations: u64,
    /// Messages lost.
    pub messages_lost: u64,
    /// Messages delivered twice.
    pub messages_duplicated: u64,
    /// Crashes.
    pub crashes: u64,
    /// Chunks read back by recoveries.
    pub chunks_recovered: u64,
    /// Superpeer faults (a superpeer crashed or cut off from the others).
    pub superpeer_faults: u64,
}

/// The result of one run.
#[derive(Debug, Clone)]
pub struct SimRun {
    /// Its seed.
    pub seed: u64,
    /// What the seed chose.
    pub scenario: Scenario,
    /// Counters.
    pub stats: RunStats,
    /// The first problem found, if any.
    pub failure: Option<String>,
    /// Every event of the run, in order.
    pub trace: Vec<String>,
    /// The recorded history (client operations and the final reads).
    pub history: Vec<crate::history::Operation>,
}

/// Runs the simulation for `seed`.
pub fn run(seed: u64, config: &SimConfig) -> SimRun {
    let mut world = world::World::new(seed, config.clone());
    world.run();
    SimRun {
        seed,
        scenario: world.scenario().clone(),
        stats: world.stats.clone(),
        failure: world.failure.take(),
        trace: std::mem::take(&mut world.trace),
        history: std::mem::take(&mut world.history),
    }
}

/// Runs `seeds` in order; the first failing run, or how many passed.
pub fn search(
    seeds: impl IntoIterator<Item = u64>,
    config: &SimConfig,
) -> Result<u64, Box<SimRun>> {
    let mut passed = 0;
    for seed in seeds {
        let run = run(seed, config);
        if run.failure.is_some() {
            return Err(Box::new(run));
        }
        passed += 1;
    }
    Ok(passed)
}
