//! The drill: kill the leader of three superpeers 20 times in a row, restarting the
//! old leader from its directory each time. Every time a new leader must be elected within
//! a few seconds and every earlier write must be intact. Prints the election times.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Rounds of kill, elect, write, restart.
const KILLS: u64 = 20;
/// A new leader must be elected within this time after each kill.
const ELECTION_MAX: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_of_three_twenty_times_elects_a_new_leader_each_time() {
    let mut cluster = Cluster::start(3, test_config).await;
    cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    cluster.write(name_command(0)).await;
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
        // Every earlier write is intact on the new leader, and it accepts new ones.
        assert!(
            new.read_linearizable(|state| has_names(state, written))
                .await
                .unwrap(),
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
