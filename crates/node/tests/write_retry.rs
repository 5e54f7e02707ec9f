//! A client's metadata write whose leader dies after committing it but before its answer
//! arrives must not be sent again behind the client's back: by the time the retry reaches
//! the new leader, another client may have overwritten the value, and applying the old
//! write a second time would bring back a value that was already replaced (the name read
//! `A`, then `B`, then `A` again: not linearizable). The client reports the outcome as
//! unknown instead.

use std::thread;
use std::time::{Duration, Instant};

use myriad_client::ClientError;
use myriad_testing::cluster::TestCluster;
use myriad_types::ChunkId;

const NAME: &str = "register";

#[test]
fn a_write_whose_leader_dies_before_answering_is_not_applied_again_later() {
    let mut cluster = TestCluster::builder().superpeers(3).peers(0).start();
    let first = cluster.new_client(|config| config.join.request_timeout = Duration::from_secs(8));
    let second = cluster.new_client(|_| {});
    let (old_a, new_b) = (ChunkId::from_raw(0xa), ChunkId::from_raw(0xb));
    let leader = cluster.leader().node_id();
    let index = cluster
        .superpeers()
        .position(|superpeer| superpeer.node_id() == leader)
        .expect("the leader is running");

    // The first client's link to the leader is slow: its write commits, its answer lags.
    cluster
        .link(leader, first.node_id())
        .delay(700)
        .expect("a delaying transport");
    let writer = {
        let first = first.clone();
        thread::spawn(move || first.blocking().name_register(NAME, old_a))
    };
    cluster.wait_until(Duration::from_secs(10), "the first write committed", || {
        second.blocking().name_get(NAME).ok().flatten() == Some(old_a)
    });
    // Whatever the first client sends next reaches the other superpeers late.
    for other in cluster
        .superpeers()
        .map(|s| s.node_id())
        .collect::<Vec<_>>()
    {
        if other != leader {
            cluster
                .link(other, first.node_id())
                .delay(1500)
                .expect("a delaying transport");
        }
    }
    // The leader dies with the answer still on its way.
    cluster.stop_superpeer(index);

    // Another client replaces the value through the new leader.
    let deadline = Instant::now() + Duration::from_secs(10);
    while second.blocking().name_register(NAME, new_b).is_err() {
        assert!(Instant::now() < deadline, "no new leader took the write");
        thread::sleep(Duration::from_millis(50));
    }
    let outcome = writer.join().expect("the writer");
    // Its answer was lost with the leader: an unknown outcome, not a success or a refusal.
    assert!(
        matches!(outcome, Err(ClientError::Timeout { .. })),
        "{outcome:?}"
    );
    // Long enough for any retry of the first write to have landed.
    thread::sleep(Duration::from_secs(2));
    let now = second.blocking().name_get(NAME).expect("a read");
    assert_eq!(
        now,
        Some(new_b),
        "the first write (outcome {outcome:?}) was applied again after it was replaced"
    );
}
