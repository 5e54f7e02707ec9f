//! Roles enforced, in one process over real sockets (a superpeer, two peers with R = 1,
//! a client): a client that sends a peer-to-peer or superpeer-internal message type
//! (replication, acknowledgements, recovery, Raft, membership events, heartbeats, barrier
//! releases, monitoring reports) loses its connection before any handler runs; the node
//! goes on serving that same client over a new connection, and nothing changed: the
//! chunks, the node table and the leader are as before. A type clients may send (the
//! recovery status) is answered. A peer's shutdown request to a superpeer is refused the
//! same way. Cluster-internal metadata commands (a failure verdict,
//! another node's leave) from a client are refused by the superpeer; the client API's
//! (temporary storage) are not.

use std::time::Duration;

use bytes::Bytes;
use myriad_membership::MembershipError;
use myriad_meta::{Command, MetaError, Role};
use myriad_net::{MessageType, NetError};
use myriad_proto::types;
use myriad_replication::wire;
use myriad_testing::cluster::TestCluster;
use myriad_types::NodeId;

/// How long one refused request may take to fail (the connection closes at once).
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn a_client_cannot_send_peer_or_superpeer_internal_types() {
    let cluster = TestCluster::builder()
        .superpeers(1)
        .peers(2)
        .replication(1)
        .zone_bytes(8 << 10)
        .start();
    let client = cluster.client();
    let me = client.node_id();
    let peers = cluster.peer_ids();
    let superpeer = cluster.leader().node_id();
    // Every peer knows this node as a client (its join event arrived).
    cluster.wait_until(
        Duration::from_secs(10),
        "the peers to know the client",
        || {
            cluster
                .live_peers()
                .all(|peer| peer.membership().role_of(me) == Some(Role::Client))
        },
    );

    let blocking = client.blocking();
    let chunks = blocking.chunks();
    let values: Vec<Bytes> = (0..8u8)
        .map(|i| Bytes::from(vec![i; 64 + usize::from(i)]))
        .collect();
    let cids = chunks
        .create_with_data(peers[0], values.clone())
        .expect("create");
    let nodes_before = node_table(client.membership());
    let epoch_before = cluster.leader().epoch();

    let refused: [(NodeId, MessageType, &str); 10] = [
        (peers[0], wire::REPLICATE, "replication to a backup"),
        (peers[0], wire::ACK, "a backup's acknowledgement"),
        (peers[0], types::RECOVER, "a recovery order"),
        (peers[0], types::EVENT, "a membership event to a peer"),
        (
            peers[0],
            types::HEARTBEAT,
            "a superpeer's heartbeat to a peer",
        ),
        (
            peers[0],
            types::BARRIER_RELEASED,
            "a barrier release to a peer",
        ),
        (superpeer, types::RAFT_RPC, "a Raft RPC"),
        (superpeer, types::EVENT, "an event to a superpeer"),
        (
            superpeer,
            types::BARRIER_RELEASED,
            "a barrier release to a superpeer",
        ),
        (
            superpeer,
            types::MONITOR_REPORT,
            "a monitoring report to a superpeer",
        ),
    ];
    let net = client.membership().net();
    // Payloads a handler would act on or answer if it ran: a request of each type.
    let payload = Bytes::from_static(&[0u8; 32]);
    for (target, message_type, what) in refused {
        let result = net.request_blocking(target, message_type, payload.clone(), REFUSAL_TIMEOUT);
        assert!(
            matches!(result, Err(NetError::ConnectionLost(node)) if node == target),
            "{what} from a client: {result:?}"
        );
        // The node keeps serving, this very client too (over a new connection).
        for (cid, value) in cids.iter().zip(&values) {
            assert_eq!(
                &chunks.get(*cid).expect("get after a refusal"),
                value,
                "{what}"
            );
        }
    }

    // Cluster-internal metadata commands are refused for a client (the superpeer answers
    // with an error and commits nothing); the client API's commands are not.
    let runtime = net.runtime();
    let membership = std::sync::Arc::clone(client.membership());
    let incarnation = membership.node(peers[0]).expect("peer record").incarnation;
    let fail = runtime.block_on(membership.write(Command::Fail {
        node: peers[0],
        incarnation,
    }));
    assert!(
        matches!(fail, Err(MembershipError::Meta(MetaError::InvalidArgument(ref reason))) if reason.contains("clients may not")),
        "a client's failure verdict: {fail:?}"
    );
    let own_leave = runtime.block_on(membership.write(Command::Leave { node: peers[1] }));
    assert!(own_leave.is_err(), "a client made another node leave");
    runtime
        .block_on(membership.write(Command::TmpPut {
            name: "roles".into(),
            data: b"allowed".to_vec(),
            create_only: false,
        }))
        .expect("a client may use temporary storage");

    // A peer may not stop a superpeer (an operator's terminal, a client, may:
    // `nodeshutdown`): its connection closes and the superpeer's flag stays clear.
    let peer = cluster.live_peers().next().expect("a live peer");
    let result = peer.membership().net().request_blocking(
        superpeer,
        types::NODE_SHUTDOWN,
        Bytes::new(),
        REFUSAL_TIMEOUT,
    );
    assert!(
        matches!(result, Err(NetError::ConnectionLost(node)) if node == superpeer),
        "a shutdown request from a peer: {result:?}"
    );
    assert!(!cluster.leader().shutdown_requested());

    // A type clients may send is answered.
    net.request_blocking(
        superpeer,
        types::RECOVERY_STATUS,
        Bytes::new(),
        REFUSAL_TIMEOUT,
    )
    .expect("a client may ask the recovery status");

    // Nothing changed: the same nodes, alive, the same leader, the chunks intact (also
    // through a new client).
    assert_eq!(
        cluster.leader().epoch(),
        epoch_before,
        "no membership change"
    );
    assert_eq!(node_table(client.membership()), nodes_before);
    assert_eq!(
        node_table(cluster.peer(0).membership()),
        nodes_before,
        "the peer's view"
    );
    assert_eq!(cluster.leader().node_id(), superpeer);
    let other = cluster.new_client(|_| {});
    for (cid, value) in cids.iter().zip(&values) {
        assert_eq!(&other.blocking().chunks().get(*cid).expect("get"), value);
    }
}

/// The node table as `membership` sees it: ID, role and state of every node, by ID.
fn node_table(membership: &myriad_membership::Membership) -> Vec<(NodeId, Role, String)> {
    let mut nodes: Vec<(NodeId, Role, String)> = membership
        .nodes()
        .into_iter()
        .map(|record| (record.id, record.role, format!("{:?}", record.state)))
        .collect();
    nodes.sort_by_key(|(id, _, _)| *id);
    nodes
}
