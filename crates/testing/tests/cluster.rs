//! The cluster harness itself: link filters (both ways, one way, heal, delays),
//! a crashed peer restarted with its data directory, a stopped leader replaced and
//! restarted from its Raft directory, bounded waits that name what they waited for.

use std::time::Duration;

use bytes::Bytes;
use myriad_client::client::Client;
use myriad_meta::NodeState;
use myriad_testing::cluster::TestCluster;
use myriad_testing::env::Env;
use myriad_types::ChunkId;

/// The last log index superpeer `index` applied.
fn applied(cluster: &TestCluster, index: usize) -> Option<u64> {
    cluster
        .superpeer(index)
        .raft_metrics()
        .and_then(|metrics| metrics.last_applied_index)
}

fn reads(client: &Client, cid: ChunkId) -> bool {
    client.blocking().chunks().get(cid).is_ok()
}

#[test]
fn link_filters_cut_each_direction_and_heal() {
    let cluster = TestCluster::builder().peers(2).start();
    let client = cluster.new_client(|config| {
        config.chunks.timeout = Duration::from_millis(700);
    });
    let peer = cluster.peer(0).node_id();
    let cid = client
        .blocking()
        .chunks()
        .create_with_data(peer, vec![Bytes::from_static(b"linked")])
        .unwrap()[0];
    assert!(reads(&client, cid));
    let link = cluster.link(client.node_id(), peer);
    // Requests lost.
    link.one_way().drop();
    assert!(
        !reads(&client, cid),
        "a request crossed a dropped direction"
    );
    link.one_way().heal();
    assert!(reads(&client, cid));
    // Replies lost.
    cluster.link(peer, client.node_id()).one_way().drop();
    assert!(!reads(&client, cid), "a reply crossed a dropped direction");
    link.heal();
    assert!(reads(&client, cid));
    // Both ways.
    link.partition();
    assert!(!reads(&client, cid), "a partitioned link carried a request");
    link.heal();
    assert!(reads(&client, cid));
    // Delays: a request across a delayed direction takes at least the delay, and still
    // succeeds; healing removes it.
    let timed_read = || {
        let started = std::time::Instant::now();
        assert!(reads(&client, cid), "a delayed link lost a request");
        started.elapsed()
    };
    link.one_way().delay(200).expect("one-way delay");
    assert!(
        timed_read() >= Duration::from_millis(200),
        "the request was not delayed"
    );
    link.heal();
    cluster
        .link(peer, client.node_id())
        .one_way()
        .delay(200)
        .expect("reply delay");
    assert!(
        timed_read() >= Duration::from_millis(200),
        "the reply was not delayed"
    );
    link.heal();
    link.delay(150).expect("two-way delay");
    assert!(
        timed_read() >= Duration::from_millis(300),
        "both ways add up"
    );
    link.heal();
    assert!(
        timed_read() < Duration::from_millis(150),
        "heal kept a delay"
    );
    // The other peer was never cut off.
    let other = cluster.peer(1).node_id();
    let elsewhere = client
        .blocking()
        .chunks()
        .create_with_data(other, vec![Bytes::from_static(b"free")])
        .unwrap()[0];
    assert!(reads(&client, elsewhere));
}

#[test]
fn a_killed_peer_is_recovered_and_restarts_under_its_node_id() {
    let mut cluster = TestCluster::builder()
        .peers(2)
        .replication(1)
        .failure_detection(Duration::from_millis(100), Duration::from_millis(600))
        .start();
    let client = cluster.new_client(|config| {
        config.chunks.timeout = Duration::from_secs(10);
    });
    let victim = cluster.peer(0).node_id();
    let payloads: Vec<Bytes> = (0..50).map(|i| Bytes::from(format!("chunk {i}"))).collect();
    let cids = client
        .blocking()
        .chunks()
        .create_with_data(victim, payloads.clone())
        .unwrap();
    cluster
        .peer(0)
        .replicator()
        .unwrap()
        .wait_all(myriad_replication::Durability::Replicated)
        .unwrap();
    assert_eq!(cluster.kill_peer(0), victim);
    assert!(cluster.try_peer(0).is_none());
    cluster.wait_until(
        Duration::from_secs(10),
        "the killed peer is declared failed",
        || {
            client
                .membership()
                .node(victim)
                .is_some_and(|record| matches!(record.state, NodeState::Failed { .. }))
        },
    );
    // Its chunks come back from its backup.
    let got = client.blocking().chunks().get_batch(&cids);
    for (result, want) in got.into_iter().zip(&payloads) {
        assert_eq!(&result.expect("recovered chunk"), want);
    }
    let restarted = cluster.restart_peer(0).node_id();
    assert_eq!(restarted, victim, "the data directory keeps the node ID");
    cluster.wait_for_peers();
    cluster.wait_until(Duration::from_secs(10), "the client sees it alive", || {
        client
            .membership()
            .node(victim)
            .is_some_and(|record| record.state == NodeState::Alive && record.incarnation > 1)
    });
    let got = client.blocking().chunks().get_batch(&cids);
    for (result, want) in got.into_iter().zip(&payloads) {
        assert_eq!(&result.expect("chunk after the restart"), want);
    }
}

#[test]
#[should_panic(expected = "waiting until pigs fly")]
fn a_wait_that_runs_out_names_what_it_waited_for() {
    Env::real().wait_until(Duration::from_millis(60), "pigs fly", || false);
}

#[test]
fn a_stopped_leader_is_replaced_and_rejoins_after_a_restart() {
    let mut cluster = TestCluster::builder().superpeers(3).start();
    let client = cluster.client();
    let old = cluster.leader().node_id();
    let index = usize::from(old.0) - 1;
    assert_eq!(cluster.stop_superpeer(index), old);
    let new = cluster.leader().node_id();
    assert_ne!(new, old);
    // The group still commits: a name registered through the new leader.
    let cid = ChunkId::new(client.node_id(), 1).unwrap();
    client.blocking().name_register("after", cid).unwrap();
    let committed = applied(&cluster, usize::from(new.0) - 1);
    cluster.restart_superpeer(index);
    cluster.wait_until(
        Duration::from_secs(10),
        "the restarted superpeer knows a leader and applied the name",
        || cluster.superpeer(index).leader().is_some() && applied(&cluster, index) >= committed,
    );
    assert_eq!(client.blocking().name_get("after").unwrap(), Some(cid));
}
