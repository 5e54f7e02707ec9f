//! The drill: kill the leader of three superpeers 20 times in a row, restarting the
//! old leader from its directory each time, while writers keep writing. Every time a new
//! leader must be elected within a few seconds, and the metadata history must hold:
//! every acknowledged write survives every kill (on every node), a write refused as "not
//! applied" never appears, nothing appears that nobody wrote, and a linearizable read right
//! after an acknowledged write sees it. Prints the election times and the write outcomes.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use myriad_meta::Command;
use myriad_raft::RaftWriteError;
use myriad_types::ChunkId;

/// Rounds of kill, elect, write, restart.
const KILLS: u64 = 20;
/// A new leader must be elected within this time after each kill.
const ELECTION_MAX: Duration = Duration::from_secs(3);
/// Writer tasks running through all the kills.
const WRITERS: u64 = 3;
/// How long one write may take before the writer counts it as unknown.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a writer learned of one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Acknowledged: it must survive.
    Acked,
    /// Refused with an error that says it was not applied: it must never appear.
    NotApplied,
    /// Timed out, leadership changed, node stopped: either is allowed.
    Unknown,
}

/// The name and chunk ID of writer `writer`'s write number `seq`.
fn write_of(writer: u64, seq: u64) -> (String, ChunkId) {
    (
        format!("w{writer}-{seq}"),
        ChunkId::from_raw(0x0002_0000_0000_0000 | (writer << 32) | seq),
    )
}

/// Writes unique names through whichever node leads, until `stop`; returns each write's
/// outcome by name.
async fn writer(
    hub: Arc<Hub>,
    id: u64,
    stop: Arc<AtomicBool>,
) -> BTreeMap<String, (ChunkId, Outcome)> {
    let mut history = BTreeMap::new();
    let mut seq = 0;
    while !stop.load(Ordering::Relaxed) {
        let Some(leader) = hub.leader() else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let (name, cid) = write_of(id, seq);
        seq += 1;
        let command = Command::NameRegister {
            name: name.clone(),
            cid,
        };
        let outcome = match tokio::time::timeout(WRITE_TIMEOUT, leader.write(command)).await {
            Ok(Ok(_)) => Outcome::Acked,
            Ok(Err(RaftWriteError::ForwardToLeader { .. }))
            | Ok(Err(RaftWriteError::NoQuorum))
            | Ok(Err(RaftWriteError::TooLarge { .. })) => Outcome::NotApplied,
            Ok(Err(RaftWriteError::OutcomeUnknown { .. }))
            | Ok(Err(RaftWriteError::Stopped(_)))
            | Err(_) => Outcome::Unknown,
        };
        if outcome == Outcome::Acked {
            // Read-your-writes through a linearizable read (skipped if the read itself
            // fails because leadership moved: that says nothing).
            if let Ok(seen) = leader
                .read_linearizable(|state| state.name_get(&name) == Some(cid))
                .await
            {
                assert!(
                    seen,
                    "{name} was acknowledged but a linearizable read missed it"
                );
            }
        }
        history.insert(name, (cid, outcome));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_of_three_twenty_times_elects_a_new_leader_each_time() {
    let mut cluster = Cluster::start(3, test_config).await;
    cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    cluster.write(name_command(0)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|id| tokio::spawn(writer(Arc::clone(&cluster.hub), id, Arc::clone(&stop))))
        .collect();
    let mut written = 1;
    let mut elections = Vec::new();
    for round in 0..KILLS {
        let old = cluster.current_leader().unwrap();
        let old_id = old.node_id();
        let old_term = old.metrics().term;
        cluster.kill(old_id).await;
        let killed_at = Instant::now();
        let new_id = cluster
            .wait_for_leader(None, ELECTION_MAX)
            .await
            .unwrap_or_else(|| {
                panic!("round {round}: no leader within {ELECTION_MAX:?} after killing {old_id}")
            });
        let elected_after = killed_at.elapsed();
        elections.push(elected_after);
        let new = cluster.node(new_id);
        assert_ne!(new_id, old_id);
        assert!(new.metrics().term > old_term);
        // Every earlier write is intact on the new leader (or on whoever leads by the time
        // it is asked, on a loaded machine), and it accepts new ones.
        assert!(
            cluster
                .read_on_leader(|state| has_names(state, written))
                .await,
            "round {round}: leader {new_id} lost writes"
        );
        cluster.write(name_command(written)).await;
        written += 1;
        // The old leader comes back from its directory and catches up.
        cluster.start_node(old_id).await;
        assert!(
            cluster
                .node(old_id)
                .read_local(|state| state.names().count()) as u64
                >= written - 1,
            "round {round}: node {old_id} restarted without its committed state"
        );
        cluster.wait_converged().await;
        assert!(cluster
            .node(old_id)
            .read_local(|state| has_names(state, written)));
    }
    stop.store(true, Ordering::Relaxed);
    let mut history = BTreeMap::new();
    for task in writers {
        history.extend(task.await.expect("writer task"));
    }
    cluster.wait_converged().await;
    check_history(&cluster, &history);

    let snapshots = cluster.snapshots();
    assert!(snapshots.values().all(|bytes| *bytes == snapshots[&1]));
    elections.sort();
    let millis = |duration: Duration| duration.as_secs_f64() * 1e3;
    println!(
        "elections after leader kill ({KILLS}): min {:.0} ms, median {:.0} ms, max {:.0} ms",
        millis(elections[0]),
        millis(elections[elections.len() / 2]),
        millis(elections[elections.len() - 1]),
    );
    assert!(elections.iter().all(|&elapsed| elapsed < ELECTION_MAX));
}

/// Checks the writers' history against every node's final state.
fn check_history(cluster: &Cluster, history: &BTreeMap<String, (ChunkId, Outcome)>) {
    let count = |outcome: Outcome| history.values().filter(|(_, o)| *o == outcome).count();
    println!(
        "writes during the kills: {} acknowledged, {} refused (not applied), {} unknown",
        count(Outcome::Acked),
        count(Outcome::NotApplied),
        count(Outcome::Unknown)
    );
    assert!(
        count(Outcome::Acked) >= KILLS as usize,
        "the writers got too few writes through to test anything"
    );
    for node in cluster.running() {
        let id = node.node_id();
        node.read_local(|state| {
            for (name, (cid, outcome)) in history {
                let found = state.name_get(name);
                match outcome {
                    Outcome::Acked => assert_eq!(
                        found,
                        Some(*cid),
                        "node {id}: acknowledged write {name} lost"
                    ),
                    Outcome::NotApplied => assert_eq!(
                        found, None,
                        "node {id}: {name} was refused as not applied but is there"
                    ),
                    Outcome::Unknown => {
                        assert!(found.is_none() || found == Some(*cid), "node {id}: {name}")
                    }
                }
            }
            for (name, _) in state.names() {
                assert!(
                    !name.starts_with('w') || history.contains_key(name),
                    "node {id}: {name} appeared but nobody wrote it"
                );
            }
        });
    }
}
