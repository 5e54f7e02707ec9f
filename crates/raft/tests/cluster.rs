//! Whole superpeer groups in one process over the in-memory transport: replication,
//! restarts from disk, snapshots for lagging followers, cut-off nodes, 1, 3 and 5 members.

mod common;

use std::time::{Duration, Instant};

use common::*;
use myriad_meta::{MetaState, Response};
use myriad_raft::types::{Entry, EntryPayload, LeaderId, LogId, Vote};
use myriad_raft::{RaftConfig, RaftReadError, RaftRole, RaftWriteError, RpcReply, RpcRequest};
use openraft::raft::AppendEntriesRequest;

fn snapshot_often(config: &mut RaftConfig) {
    test_config(config);
    config.snapshot_every_entries = 10;
    config.entries_kept_after_snapshot = 0;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_superpeer_commits_and_survives_restart() {
    let mut cluster = Cluster::start(1, test_config).await;
    assert_eq!(cluster.wait_for_leader(None, WAIT_MAX).await, Some(1));
    for index in 0..20 {
        assert_eq!(cluster.write(name_command(index)).await, Response::Done);
    }
    cluster.kill(1).await;
    cluster.start_node(1).await;
    assert_eq!(cluster.wait_for_leader(None, WAIT_MAX).await, Some(1));
    let node = cluster.node(1);
    assert!(node
        .read_linearizable(|state| has_names(state, 20))
        .await
        .unwrap());
    // The restarted group keeps accepting writes after the old ones.
    for index in 20..25 {
        cluster.write(name_command(index)).await;
    }
    assert!(cluster.node(1).read_local(|state| has_names(state, 25)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_superpeers_replicate_and_end_byte_equal() {
    let cluster = Cluster::start(3, test_config).await;
    cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    for index in 0..50 {
        cluster.write(name_command(index)).await;
    }
    assert!(cluster.read_on_leader(|state| has_names(state, 50)).await);
    cluster.wait_converged().await;
    let snapshots = cluster.snapshots();
    assert_eq!(snapshots.len(), 3);
    let first = &snapshots[&1];
    assert!(first.len() > 50 * 8);
    assert!(snapshots.values().all(|bytes| bytes == first));
    // Followers refuse writes and linearizable reads, naming the leader. Checked while one
    // leader holds one term throughout; a check that an election overtook (the leader's
    // term moved, or a follower was in another term) is made again.
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let leader = cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
        let term = cluster.node(leader).metrics().term;
        let mut answers = Vec::new();
        for follower in cluster.running().filter(|node| node.node_id() != leader) {
            let write = follower.write(name_command(99)).await;
            let read = follower.read_linearizable(|_| ()).await;
            answers.push((follower.leader(), write, read, follower.metrics()));
        }
        let after = cluster.node(leader).metrics();
        let held = after.term == term
            && after.role == RaftRole::Leader
            && answers
                .iter()
                .all(|(_, _, _, metrics)| metrics.term == term);
        if !held {
            assert!(
                Instant::now() < deadline,
                "no term held still long enough to check the followers"
            );
            continue;
        }
        for (known, write, read, metrics) in answers {
            assert_eq!(known, Some(leader));
            assert_eq!(
                write,
                Err(RaftWriteError::ForwardToLeader {
                    leader: Some(leader)
                })
            );
            assert!(matches!(
                read,
                Err(RaftReadError::ForwardToLeader { leader: Some(id) }) if id == leader
            ));
            assert_eq!(metrics.role, RaftRole::Follower);
        }
        break;
    }
    // A refused command is still replicated and answered with its error.
    let refused = cluster
        .write(myriad_meta::Command::NameRemove {
            name: "never-registered".to_owned(),
        })
        .await;
    assert!(matches!(refused, Response::Error(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_follower_catches_up_through_a_snapshot() {
    let mut cluster = Cluster::start(3, snapshot_often).await;
    let leader = cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    for index in 0..5 {
        cluster.write(name_command(index)).await;
    }
    cluster.wait_converged().await;
    let lagging = (1..=3).find(|&id| id != leader).unwrap();
    cluster.cut(lagging, true);
    let lagging_last = cluster.node(lagging).metrics().last_log_index.unwrap();
    for index in 5..60 {
        cluster.write(name_command(index)).await;
    }
    // The leader's log no longer reaches back to what the cut-off follower has.
    let deadline = Instant::now() + WAIT_MAX;
    while cluster
        .node(leader)
        .metrics()
        .purged_index
        .is_none_or(|purged| purged <= lagging_last)
    {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            cluster.node(leader).metrics()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!cluster
        .node(lagging)
        .read_local(|state| has_names(state, 60)));
    cluster.cut(lagging, false);
    cluster.wait_converged().await;
    let metrics = cluster.node(lagging).metrics();
    assert!(
        metrics
            .snapshot_index
            .is_some_and(|index| index > lagging_last),
        "the follower must have installed a snapshot: {metrics:?}"
    );
    assert!(cluster
        .node(lagging)
        .read_local(|state| has_names(state, 60)));
    let snapshots = cluster.snapshots();
    assert!(snapshots.values().all(|bytes| *bytes == snapshots[&leader]));
    // The installed snapshot was persisted: the follower restarts with the state.
    cluster.kill(lagging).await;
    cluster.start_node(lagging).await;
    assert!(cluster
        .node(lagging)
        .read_local(|state| has_names(state, 60)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_restart_of_three_keeps_every_committed_command() {
    let mut cluster = Cluster::start(3, snapshot_often).await;
    cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    for index in 0..45 {
        cluster.write(name_command(index)).await;
    }
    let before = cluster.read_on_leader(MetaState::snapshot).await;
    // Every member knows the commit point (it saves it), so each re-applies everything.
    cluster.wait_converged().await;
    for id in 1..=3 {
        cluster.kill(id).await;
    }
    for id in 1..=3 {
        cluster.start_node(id).await;
    }
    // Every member has its committed state back from disk before any election.
    for node in cluster.running() {
        assert!(
            node.read_local(|state| has_names(state, 45)),
            "node {} lost committed commands on restart",
            node.node_id()
        );
    }
    let after = cluster.read_on_leader(MetaState::snapshot).await;
    assert_eq!(after, before);
    cluster.write(name_command(45)).await;
    cluster.wait_converged().await;
    let snapshots = cluster.snapshots();
    let leader = cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    assert!(snapshots.values().all(|bytes| *bytes == snapshots[&leader]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_leader_is_replaced_and_rejoins_as_follower() {
    let cluster = Cluster::start(3, test_config).await;
    let old = cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    cluster.write(name_command(0)).await;
    cluster.cut(old, true);
    let new = cluster
        .wait_for_leader(Some(old), Duration::from_secs(5))
        .await
        .expect("a new leader among the connected nodes");
    assert_ne!(new, old);
    let written = cluster.node(new).write(name_command(1)).await;
    assert!(
        written.is_ok(),
        "{written:?} {:?}",
        cluster
            .running()
            .map(|node| node.metrics())
            .collect::<Vec<_>>()
    );
    // The cut-off node cannot commit: its write has no outcome (or it already stepped down).
    assert!(cluster.node(old).write(name_command(2)).await.is_err());
    cluster.cut(old, false);
    let deadline = Instant::now() + WAIT_MAX;
    while cluster.node(old).metrics().role == RaftRole::Leader
        || cluster.node(old).leader() != cluster.current_leader().map(|node| node.node_id())
    {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            cluster.node(old).metrics()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cluster.write(name_command(3)).await;
    cluster.wait_converged().await;
    assert!(cluster.node(old).read_local(|state| has_names(state, 2)));
    let snapshots = cluster.snapshots();
    assert!(snapshots.values().all(|bytes| *bytes == snapshots[&1]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_superpeers_survive_the_loss_of_two() {
    let mut cluster = Cluster::start(5, test_config).await;
    let leader = cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    for index in 0..10 {
        cluster.write(name_command(index)).await;
    }
    let other = (1..=5).find(|&id| id != leader).unwrap();
    cluster.kill(leader).await;
    cluster.kill(other).await;
    cluster
        .wait_for_leader(None, Duration::from_secs(5))
        .await
        .expect("three of five elect a leader");
    for index in 10..20 {
        cluster.write(name_command(index)).await;
    }
    cluster.wait_converged().await;
    for node in cluster.running() {
        assert!(node.read_local(|state| has_names(state, 20)));
    }
    cluster.start_node(leader).await;
    cluster.start_node(other).await;
    cluster.write(name_command(20)).await;
    cluster.wait_converged().await;
    let snapshots = cluster.snapshots();
    assert_eq!(snapshots.len(), 5);
    assert!(snapshots.values().all(|bytes| *bytes == snapshots[&leader]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_rpcs_are_refused_without_harm() {
    let cluster = Cluster::start(1, test_config).await;
    cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    let node = cluster.node(1);
    for garbage in [
        &[][..],
        &[1][..],
        &[1, 1, 0xff, 0xff][..],
        &[9, 9, 9][..],
        &[1, 4, 1, 1, 1, 0, 0, 0, 0, 5, 1, 2, 3, 4, 5][..],
    ] {
        let reply = RpcReply::from_bytes(&node.handle_rpc(garbage).await).unwrap();
        assert!(matches!(reply, RpcReply::Refused(_)), "{reply:?}");
    }
    // Decodable but implausible AppendEntries: openraft only debug-asserts these.
    let entry = |term: u64, index: u64| Entry {
        log_id: LogId {
            leader_id: LeaderId { term, node_id: 2 },
            index,
        },
        payload: EntryPayload::Blank,
    };
    let implausible = [
        (None, vec![entry(1, 5)]),
        (None, vec![entry(1, 0), entry(1, 2)]),
        (None, vec![entry(2, 0), entry(1, 1)]),
        (None, vec![entry(100, 0)]),
    ];
    for (prev_log_id, entries) in implausible {
        let request = RpcRequest::AppendEntries(AppendEntriesRequest {
            vote: Vote::new_committed(50, 2),
            prev_log_id,
            entries,
            leader_commit: None,
        });
        let reply = RpcReply::from_bytes(&node.handle_rpc(&request.to_bytes()).await).unwrap();
        assert!(matches!(reply, RpcReply::Refused(_)), "{reply:?}");
    }
    assert_eq!(cluster.write(name_command(0)).await, Response::Done);
    assert_eq!(node.metrics().role, RaftRole::Leader);
    assert_eq!(node.metrics().term, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configurations_and_oversized_commands_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let members: std::collections::BTreeMap<u64, String> =
        [(1, "127.0.0.1:1".to_owned()), (2, "127.0.0.1:2".to_owned())].into();
    #[allow(clippy::reversed_empty_ranges)]
    let refused = [
        RaftConfig::new(3, dir.path(), members.clone()),
        RaftConfig::new(0, dir.path(), [(0, "a:1".to_owned())].into()),
        RaftConfig::new(70_000, dir.path(), [(70_000, "a:1".to_owned())].into()),
        RaftConfig::new(1, dir.path(), [(1, String::new())].into()),
        RaftConfig {
            election_timeout_ms: 300..200,
            ..RaftConfig::new(1, dir.path(), members.clone())
        },
        RaftConfig {
            heartbeat_ms: 500,
            ..RaftConfig::new(1, dir.path(), members.clone())
        },
    ];
    for config in refused {
        let started = myriad_raft::MetaRaft::start(config.clone(), NoTransport).await;
        assert!(
            matches!(started, Err(myriad_raft::StartError::Config(_))),
            "{config:?}"
        );
    }
    let cluster = Cluster::start(1, test_config).await;
    cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    let huge = myriad_meta::Command::TmpPut {
        name: "huge".to_owned(),
        data: vec![0; myriad_raft::limits::COMMAND_BYTES_MAX + 1],
        create_only: false,
    };
    assert!(matches!(
        cluster.node(1).write(huge).await,
        Err(RaftWriteError::TooLarge { .. })
    ));
    assert_eq!(cluster.write(name_command(0)).await, Response::Done);
}

/// A transport for nodes that never need one.
struct NoTransport;

impl myriad_raft::RaftTransport for NoTransport {
    async fn call(
        &self,
        target: u64,
        _request: Vec<u8>,
        _timeout: Duration,
    ) -> Result<Vec<u8>, myriad_raft::TransportError> {
        Err(myriad_raft::TransportError::Unreachable {
            target,
            reason: "no transport".to_owned(),
        })
    }
}

/// Every member's apply observer sees the same commands in the same (log) order, with
/// strictly increasing indices, also for writes issued concurrently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_observers_see_every_command_in_log_order_on_every_member() {
    let cluster = Cluster::start(3, test_config).await;
    cluster.wait_for_leader(None, WAIT_MAX).await.unwrap();
    // One write first: it returns once the leader is established and committing.
    assert_eq!(cluster.write(name_command(0)).await, Response::Done);
    let raft = cluster.current_leader().expect("a leader").clone();
    let writes = (1..40).map(|index| {
        let raft = raft.clone();
        tokio::spawn(async move { raft.write(name_command(index)).await })
    });
    for write in futures_util::future::join_all(writes).await {
        assert_eq!(write.unwrap().unwrap(), Response::Done);
    }
    cluster.wait_converged().await;
    let observed = cluster.observed.lock().unwrap().clone();
    assert_eq!(
        observed.len(),
        3,
        "every member observed: {:?}",
        observed.keys()
    );
    let first = &observed[&1];
    let names = first
        .iter()
        .filter(|(_, text)| text.contains("name"))
        .count();
    assert_eq!(names, 40, "{first:?}");
    for (member, seen) in &observed {
        assert!(
            seen.windows(2).all(|pair| pair[0].0 < pair[1].0),
            "member {member} saw indices out of order: {seen:?}"
        );
        assert_eq!(seen, first, "member {member} saw another sequence");
    }
}
