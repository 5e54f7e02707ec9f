//! Fencing of a partitioned peer, in one process (the test cluster harness, whose link
//! filter is the messaging layer's fault switch): a superpeer (fast failure detection) and
//! three peers (R = 2). The victim is cut off from the superpeer until it is declared
//! failed and its zone recovered; when the partition heals it must learn that it was
//! declared failed (the superpeer refuses it), stop serving (`NotOwner` to every request,
//! also in-process ones) and never overwrite the recovered data; clients' writes end at
//! the restorer.

use std::time::Duration;

use bytes::Bytes;
use myriad_meta::NodeState;
use myriad_proto::chunk::{ChunkReply, ChunkRequest, ItemError, DURABILITY_REPLICATED};
use myriad_testing::cluster::TestCluster;
use myriad_types::{ChunkId, NodeId};

/// The superpeer (node 1) with fast failure detection and three peers, R = 2.
fn start() -> TestCluster {
    TestCluster::builder()
        .superpeers(1)
        .peers(3)
        .replication(2)
        .failure_detection(Duration::from_millis(100), Duration::from_millis(600))
        .start()
}

fn payload(index: usize, version: u32) -> Bytes {
    Bytes::from(format!("chunk-{index:05}-v{version}"))
}

#[test]
fn a_partitioned_peer_is_fenced_and_cannot_overwrite_recovered_data() {
    let mut cluster = start();
    let client = cluster.new_client(|config| {
        config.chunks.timeout = Duration::from_secs(10);
        config.chunks.durability = DURABILITY_REPLICATED;
    });
    let chunks = client.blocking();
    let victim = cluster.peer(0);
    let victim_id = victim.node_id();
    let payloads = (0..500).map(|i| payload(i, 0)).collect();
    let cids: Vec<ChunkId> = chunks
        .chunks()
        .create_with_data(victim_id, payloads)
        .unwrap();

    // Cut the victim off from the superpeer (both directions) until the verdict.
    let superpeer = NodeId(1);
    cluster.link(victim_id, superpeer).partition();
    cluster.wait_until(
        Duration::from_secs(10),
        "the victim is declared failed",
        || {
            client
                .membership()
                .node(victim_id)
                .is_some_and(|record| matches!(record.state, NodeState::Failed { .. }))
        },
    );
    // Its chunks come back at a restorer; the client changes them there.
    for (index, result) in chunks.chunks().get_batch(&cids).into_iter().enumerate() {
        assert_eq!(result.expect("recovered chunk"), payload(index, 0));
    }
    let puts: Vec<(ChunkId, Bytes)> = cids
        .iter()
        .enumerate()
        .map(|(i, &cid)| (cid, payload(i, 1)))
        .collect();
    for result in chunks.chunks().put_batch(&puts) {
        result.expect("put at the restorer");
    }

    // Heal the partition: the victim must find out and stop serving.
    cluster.link(victim_id, superpeer).heal();
    cluster.wait_until(
        Duration::from_secs(10),
        "the victim learns its verdict",
        || victim.declared_failed().is_some(),
    );
    let line = victim.declared_failed().unwrap().to_owned();
    assert!(line.contains("declared failed"), "{line}");
    assert!(victim.service().is_declared_failed());
    // Its own (in-process) writes and reads are refused with NotOwner.
    let stale: Vec<(ChunkId, Bytes)> = cids[..20]
        .iter()
        .enumerate()
        .map(|(i, &cid)| (cid, payload(i, 9)))
        .collect();
    let reply = victim.service().execute(
        victim_id,
        ChunkRequest::Put {
            durability: 1,
            items: stale,
        },
    );
    let ChunkReply::Statuses(statuses) = reply else {
        panic!("unexpected reply {reply:?}");
    };
    assert!(statuses.iter().all(|s| *s == Err(ItemError::NotOwner)));
    let reply = victim.service().execute(
        victim_id,
        ChunkRequest::Get {
            cids: cids[..5].to_vec(),
        },
    );
    let ChunkReply::Data(items) = reply else {
        panic!("unexpected reply {reply:?}");
    };
    assert!(items.iter().all(|item| *item == Err(ItemError::NotOwner)));
    // Its in-process client cannot change anything either: the local service refuses, and
    // the superpeers refuse its lookups.
    let local = victim.client();
    let refused = local.blocking().chunks().put(cids[7], payload(7, 2));
    assert!(
        refused.is_err(),
        "the fenced peer's own client wrote: {refused:?}"
    );
    // The recovered data holds the restorers' versions, never the fenced peer's.
    for (index, result) in chunks.chunks().get_batch(&cids).into_iter().enumerate() {
        assert_eq!(result.expect("chunk"), payload(index, 1), "chunk {index}");
    }
    drop(local);
    cluster.stop_peer(0);
}

/// A restorer asked to recover a zone that had been adopted (a chained recovery) fences
/// the zone's failed holder as well as its log owner before it reads anything, so a holder
/// that was only cut off cannot write into the log being read. The zone here is unknown,
/// so the answer is "not held", but only after the fencing.
#[test]
fn a_restorer_fences_the_failed_holder_named_in_the_request() {
    let cluster = start();
    let restorer = cluster.peer(1);
    // Node IDs no member has: fencing them disturbs nothing else in this cluster.
    let (owner, holder) = (NodeId(0x0f00), NodeId(0x0f01));
    let request = myriad_proto::recovery::RecoverRequest {
        owner,
        zone: 7,
        holder: Some(holder),
        filling: Vec::new(),
    };
    // Sent as the superpeer leader sends it: recovery orders from anyone else are refused
    // (roles, docs/security.md).
    let reply = cluster
        .leader()
        .net()
        .request_blocking(
            restorer.node_id(),
            myriad_proto::types::RECOVER,
            request.encode(),
            Duration::from_secs(10),
        )
        .unwrap();
    assert!(matches!(
        myriad_proto::recovery::RecoverReply::decode(reply),
        Ok(myriad_proto::recovery::RecoverReply::NotHeld)
    ));
    let net = restorer.membership().net();
    assert!(net.is_fenced(owner), "the log owner is fenced");
    assert!(net.is_fenced(holder), "the failed holder is fenced");
    assert!(!net.is_fenced(cluster.peer(2).node_id()), "nobody else is");
}
