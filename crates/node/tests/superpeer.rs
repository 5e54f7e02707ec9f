//! In-process superpeer scenarios: joining, ID reuse, events, barriers, metadata services,
//! failure detection, the data directory lock.

use std::sync::Arc;
use std::time::Duration;

use myriad_client::membership::Membership;
use myriad_membership::MembershipError;
use myriad_meta::{Command, MetaError, NodeState, Response, Role};
use myriad_net::{Endpoint, Handlers};
use myriad_node::config::NodeError;
use myriad_node::superpeer::Superpeer;
use myriad_proto::meta::{Event, MetaReply, MetaRequest};
use myriad_testing::cluster::TestCluster;
use myriad_types::{ChunkId, NodeId};

/// A one-superpeer test cluster and a runtime for the raw memberships the tests join.
struct Cluster {
    inner: TestCluster,
    runtime: tokio::runtime::Runtime,
}

impl Cluster {
    fn start() -> Cluster {
        Cluster {
            inner: TestCluster::builder().superpeers(1).start(),
            runtime: runtime(),
        }
    }

    fn join(&self, role: Role) -> (Endpoint, Arc<Membership>) {
        let mut config = self.inner.join_config(role);
        config.request_timeout = Duration::from_secs(10);
        self.runtime
            .block_on(Membership::join(config, Handlers::new()))
            .unwrap()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn joins_get_distinct_ids_and_client_ids_are_reused_after_leave() {
    let cluster = Cluster::start();
    let (_a_net, a) = cluster.join(Role::Client);
    let (_b_net, b) = cluster.join(Role::Client);
    let (_p_net, p) = cluster.join(Role::Peer);
    let ids = [a.node_id(), b.node_id(), p.node_id()];
    assert!(
        ids.iter().all(|id| id.0 != 1),
        "a superpeer ID was given out: {ids:?}"
    );
    assert_ne!(ids[0], ids[1]);
    assert_ne!(ids[1], ids[2]);
    assert_ne!(ids[0], ids[2]);
    // The join reply carried the table: the superpeer and everyone before.
    let record = p.node(a.node_id()).unwrap();
    assert_eq!(record.role, Role::Client);
    assert_eq!(p.node(NodeId(1)).unwrap().role, Role::Superpeer);

    // A client's ID goes to the next joiner after it left.
    cluster.runtime.block_on(a.leave()).unwrap();
    let (_c_net, c) = cluster.join(Role::Client);
    assert_eq!(c.node_id(), a.node_id());
    assert_eq!(c.node(c.node_id()).unwrap().incarnation, 2);

    // A peer's ID is not reused until released.
    cluster.runtime.block_on(p.leave()).unwrap();
    let (_q_net, q) = cluster.join(Role::Peer);
    assert_ne!(q.node_id(), p.node_id());
    cluster
        .runtime
        .block_on(q.write(Command::ReleaseId { node: p.node_id() }))
        .unwrap();
    let (_r_net, r) = cluster.join(Role::Peer);
    assert_eq!(r.node_id(), p.node_id());
}

#[test]
fn events_reach_members_and_update_their_tables() {
    let cluster = Cluster::start();
    let (_a_net, a) = cluster.join(Role::Peer);
    let mut events = a.subscribe();
    let (b_net, b) = cluster.join(Role::Client);
    let id = b.node_id();
    let joined = cluster.runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok(Event::NodeJoined(record)) = events.recv().await {
                    if record.id == id {
                        return record;
                    }
                }
            }
        })
        .await
    });
    assert_eq!(joined.unwrap().role, Role::Client);
    assert!(a
        .node(id)
        .is_some_and(|record| record.state == NodeState::Alive));
    assert_eq!(a.epoch(), b.epoch());
    assert_eq!(a.net().address(id), Some(b_net.local_addr()));
    cluster.runtime.block_on(b.leave()).unwrap();
    let left = cluster.runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok(Event::NodeLeft(node)) = events.recv().await {
                    return node;
                }
            }
        })
        .await
    });
    assert_eq!(left.unwrap(), id);
    assert_eq!(a.node(id).unwrap().state, NodeState::Left);
}

#[test]
fn barrier_of_three_releases_with_every_value() {
    let cluster = Cluster::start();
    let members: Vec<_> = (0..3).map(|_| cluster.join(Role::Peer)).collect();
    let barrier = match cluster
        .runtime
        .block_on(members[0].1.write(Command::BarrierAlloc { size: 3 }))
        .unwrap()
    {
        Response::BarrierAllocated(id) => id,
        other => panic!("unexpected {other:?}"),
    };
    let results = cluster.runtime.block_on(async {
        let waits = members.iter().enumerate().map(|(index, (_, membership))| {
            let membership = membership.clone();
            tokio::spawn(async move {
                membership
                    .barrier_sign_on(barrier, 100 + index as u64, Duration::from_secs(10))
                    .await
            })
        });
        futures_util::future::join_all(waits).await
    });
    let mut expected: Vec<(NodeId, u64)> = members
        .iter()
        .enumerate()
        .map(|(index, (_, membership))| (membership.node_id(), 100 + index as u64))
        .collect();
    expected.sort();
    for result in results {
        let mut values = result.unwrap().unwrap();
        values.sort();
        assert_eq!(values, expected);
    }
    // Signing on twice to the same round is refused.
    let membership = &members[0].1;
    let first = cluster
        .runtime
        .block_on(membership.write(Command::BarrierSignOn {
            id: barrier,
            node: membership.node_id(),
            value: 1,
        }));
    assert!(first.is_ok());
    let second = cluster
        .runtime
        .block_on(membership.write(Command::BarrierSignOn {
            id: barrier,
            node: membership.node_id(),
            value: 1,
        }));
    assert!(matches!(
        second,
        Err(MembershipError::Meta(MetaError::AlreadySignedOn(_)))
    ));
}

#[test]
fn nameservice_and_temporary_storage_through_membership() {
    let cluster = Cluster::start();
    let (_net, client) = cluster.join(Role::Client);
    let cid = ChunkId::new(NodeId(7), 42).unwrap();
    cluster.runtime.block_on(async {
        client
            .write(Command::NameRegister {
                name: "answer".into(),
                cid,
            })
            .await
            .unwrap();
        assert_eq!(
            client
                .request(MetaRequest::NameGet("answer".into()))
                .await
                .unwrap(),
            MetaReply::Name(Some(cid))
        );
        assert_eq!(
            client
                .request(MetaRequest::NameGet("other".into()))
                .await
                .unwrap(),
            MetaReply::Name(None)
        );
        client
            .write(Command::TmpPut {
                name: "blob".into(),
                data: b"hello".to_vec(),
                create_only: true,
            })
            .await
            .unwrap();
        let again = client
            .write(Command::TmpPut {
                name: "blob".into(),
                data: b"x".to_vec(),
                create_only: true,
            })
            .await;
        assert!(matches!(
            again,
            Err(MembershipError::Meta(MetaError::TmpExists(_)))
        ));
        assert_eq!(
            client
                .request(MetaRequest::TmpGet("blob".into()))
                .await
                .unwrap(),
            MetaReply::Tmp(Some(b"hello".to_vec()))
        );
        assert_eq!(
            client.request(MetaRequest::TmpList).await.unwrap(),
            MetaReply::TmpList(vec![("blob".into(), 5)])
        );
        match client.request(MetaRequest::Status).await.unwrap() {
            MetaReply::Status(status) => {
                assert_eq!(status.leader, Some(NodeId(1)));
                assert_eq!(status.members.len(), 1);
            }
            other => panic!("unexpected {other:?}"),
        }
        // Lookup through the node directory: the creator owns its chunks.
        let range = client.lookup(cid).await.unwrap();
        assert_eq!(range.owner, NodeId(7));
    });
}

#[test]
fn silent_peer_is_declared_failed_and_members_hear_of_it() {
    let cluster = Cluster::start();
    let (_a_net, a) = cluster.join(Role::Client);
    let mut events = a.subscribe();
    let (p_net, p) = cluster.join(Role::Peer);
    let id = p.node_id();
    let started = std::time::Instant::now();
    // The peer vanishes: its endpoint closes and answers nothing more.
    drop(p_net);
    let failed = cluster.runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok(Event::NodeFailed(node)) = events.recv().await {
                    if node == id {
                        return;
                    }
                }
            }
        })
        .await
    });
    assert!(failed.is_ok(), "no failure event within 5 s");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(
        a.node(id).unwrap().state,
        NodeState::Failed { .. }
    ));
    assert!(a.net().is_fenced(id));
}

#[test]
fn second_superpeer_on_the_same_directory_is_refused() {
    let cluster = Cluster::start();
    // The running superpeer's own configuration: same node, same directory.
    let config = cluster.inner.superpeer_config(0);
    match Superpeer::start(config) {
        Err(NodeError::DataDirLocked(_)) => {}
        other => panic!("expected DataDirLocked, got {other:?}"),
    }
}

#[test]
fn join_blocking_works_from_a_plain_thread() {
    let cluster = Cluster::start();
    let config = cluster.inner.join_config(Role::Client);
    let (endpoint, membership) = Membership::join_blocking(config, Handlers::new()).unwrap();
    assert_ne!(membership.node_id(), NodeId(1));
    assert_eq!(endpoint.node_id(), membership.node_id());
    assert!(membership.nodes().len() >= 2);
}

#[test]
fn followers_answer_not_leader_and_clients_follow_to_the_leader() {
    let cluster = TestCluster::builder().superpeers(3).start();
    let members = cluster.seeds();
    let runtime = runtime();
    let config = cluster.join_config(Role::Peer);
    let (_endpoint, peer) = runtime
        .block_on(Membership::join(config, Handlers::new()))
        .unwrap();
    assert!(
        peer.node_id().0 > 3,
        "got a superpeer's ID: {}",
        peer.node_id()
    );
    // Every superpeer was registered before the peer's join.
    for (id, _) in &members {
        assert_eq!(peer.node(*id).unwrap().role, Role::Superpeer);
    }
    let leader = cluster.leader().node_id();
    let follower = members
        .iter()
        .map(|(id, _)| *id)
        .find(|id| *id != leader)
        .unwrap();
    // A follower learns the leader from its heartbeats (within a few of them).
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let reply = loop {
        let reply = runtime
            .block_on(peer.net().request(
                follower,
                myriad_proto::types::META_REQUEST,
                MetaRequest::Nodes.encode(),
                Duration::from_secs(2),
            ))
            .unwrap();
        let reply = MetaReply::decode(reply).unwrap();
        if reply != (MetaReply::NotLeader { leader: None }) || std::time::Instant::now() > deadline
        {
            break reply;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        reply,
        MetaReply::NotLeader {
            leader: Some(leader)
        }
    );
    // Membership follows it.
    match runtime.block_on(peer.request(MetaRequest::Nodes)).unwrap() {
        MetaReply::Nodes(nodes) => assert_eq!(nodes.len(), 4),
        other => panic!("unexpected {other:?}"),
    }
}
