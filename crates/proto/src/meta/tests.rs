//! Round trips of every message and robustness of every decoder.

use super::*;
use myriad_meta::{BarrierOutcome, NodeState};
use proptest::collection::vec;
use proptest::prelude::*;

fn node() -> impl Strategy<Value = NodeId> {
    any::<u16>().prop_map(NodeId)
}

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9/_.-]{1,40}"
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Superpeer), Just(Role::Peer), Just(Role::Client)]
}

fn record() -> impl Strategy<Value = NodeRecord> {
    (
        node(),
        role(),
        "[0-9.:]{1,30}",
        any::<u8>(),
        any::<u16>(),
        any::<u16>(),
        prop_oneof![
            Just(NodeState::Alive),
            any::<u64>().prop_map(|epoch| NodeState::Failed { epoch }),
            Just(NodeState::Left)
        ],
        any::<u32>(),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                id,
                role,
                address,
                caps,
                rack,
                switch,
                state,
                incarnation,
                joined_epoch,
                released,
            )| {
                NodeRecord {
                    id,
                    role,
                    address,
                    capabilities: Capabilities(caps),
                    rack,
                    switch,
                    state,
                    incarnation,
                    joined_epoch,
                    released,
                }
            },
        )
}

fn meta_error() -> impl Strategy<Value = MetaError> {
    prop_oneof![
        Just(MetaError::NodeIdsExhausted),
        node().prop_map(MetaError::UnknownNode),
        name().prop_map(MetaError::NameNotFound),
        any::<u32>().prop_map(MetaError::BarrierNotFound),
        Just(MetaError::TmpFull),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (role(), "[0-9.:]{1,30}", proptest::option::of(1u16..0xfeff)).prop_map(
            |(role, address, reclaim)| Command::Join {
                role,
                address,
                capabilities: Capabilities::ALL,
                rack: 1,
                switch: 2,
                reclaim: reclaim.map(NodeId),
            }
        ),
        (node(), any::<u32>()).prop_map(|(node, incarnation)| Command::Fail { node, incarnation }),
        (name(), any::<u64>()).prop_map(|(name, raw)| Command::NameRegister {
            name,
            cid: ChunkId::from_raw(raw)
        }),
        (any::<u32>(), node(), any::<u64>()).prop_map(|(id, node, value)| Command::BarrierSignOn {
            id,
            node,
            value
        }),
        (name(), vec(any::<u8>(), 0..64), any::<bool>()).prop_map(|(name, data, create_only)| {
            Command::TmpPut {
                name,
                data,
                create_only,
            }
        }),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        Just(Response::Done),
        (node(), any::<u32>(), any::<u64>()).prop_map(|(id, incarnation, epoch)| {
            Response::Joined {
                id,
                incarnation,
                epoch,
            }
        }),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            proptest::option::of(vec((node(), any::<u64>()), 0..5))
        )
            .prop_map(|(round, signed, size, released)| Response::Barrier(
                BarrierOutcome {
                    round,
                    signed,
                    size,
                    released
                }
            )),
        meta_error().prop_map(Response::Error),
    ]
}

fn request() -> impl Strategy<Value = MetaRequest> {
    prop_oneof![
        command().prop_map(MetaRequest::Write),
        any::<u64>().prop_map(|raw| MetaRequest::Lookup(ChunkId::from_raw(raw))),
        node().prop_map(MetaRequest::LookupTree),
        name().prop_map(MetaRequest::NameGet),
        Just(MetaRequest::NameList),
        name().prop_map(MetaRequest::TmpGet),
        Just(MetaRequest::TmpList),
        any::<u32>().prop_map(MetaRequest::BarrierStatus),
        Just(MetaRequest::Nodes),
        node().prop_map(MetaRequest::Zones),
        node().prop_map(MetaRequest::Bases),
        node().prop_map(MetaRequest::ZonesDue),
        Just(MetaRequest::Status),
    ]
}

fn reply() -> impl Strategy<Value = MetaReply> {
    prop_oneof![
        response().prop_map(MetaReply::Response),
        (node(), any::<u64>(), any::<u64>(), node()).prop_map(|(creator, first, last, owner)| {
            MetaReply::Lookup(LookupRange {
                creator,
                first,
                last,
                owner,
            })
        }),
        vec((any::<u64>(), any::<u64>(), node()), 0..5).prop_map(MetaReply::LookupTree),
        proptest::option::of(any::<u64>())
            .prop_map(|raw| MetaReply::Name(raw.map(ChunkId::from_raw))),
        vec((name(), any::<u64>()), 0..5).prop_map(|names| MetaReply::Names(
            names
                .into_iter()
                .map(|(name, raw)| (name, ChunkId::from_raw(raw)))
                .collect()
        )),
        proptest::option::of(vec(any::<u8>(), 0..64)).prop_map(MetaReply::Tmp),
        vec((name(), any::<u64>()), 0..5).prop_map(MetaReply::TmpList),
        proptest::option::of((
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            vec((node(), any::<u64>()), 0..5)
        ))
        .prop_map(|status| MetaReply::Barrier(status.map(
            |(size, round, signed, last_released)| BarrierStatus {
                size,
                round,
                signed,
                last_released,
            }
        ))),
        vec(record(), 0..5).prop_map(MetaReply::Nodes),
        vec((any::<u32>(), vec(node(), 0..4)), 0..4).prop_map(MetaReply::Zones),
        (any::<u32>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
            |(zone_base, zones_end, lid_base, lids_reserved)| MetaReply::Bases(PeerBases {
                zone_base,
                zones_end,
                lid_base,
                lids_reserved,
            })
        ),
        (
            node(),
            any::<u64>(),
            proptest::option::of(node()),
            any::<u64>(),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
            vec((node(), "[0-9.:]{1,20}"), 0..5)
        )
            .prop_map(
                |(node, epoch, leader, term, last_log_index, last_applied_index, members)| {
                    MetaReply::Status(StatusReply {
                        node,
                        epoch,
                        leader,
                        term,
                        last_log_index,
                        last_applied_index,
                        members,
                    })
                }
            ),
        proptest::option::of(node()).prop_map(|leader| MetaReply::NotLeader { leader }),
        ".{0,40}".prop_map(MetaReply::Unavailable),
    ]
}

fn join_reply() -> impl Strategy<Value = JoinReply> {
    prop_oneof![
        (
            node(),
            any::<u32>(),
            any::<u64>(),
            vec(record(), 0..5),
            any::<u32>()
        )
            .prop_map(|(id, incarnation, epoch, nodes, lease_ms)| JoinReply::Ok {
                id,
                incarnation,
                epoch,
                nodes,
                lease_ms,
            }),
        proptest::option::of(node()).prop_map(|leader| JoinReply::NotLeader { leader }),
        meta_error().prop_map(JoinReply::Refused),
        ".{0,40}".prop_map(JoinReply::Unavailable),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        record().prop_map(Event::NodeJoined),
        node().prop_map(Event::NodeFailed),
        node().prop_map(Event::NodeLeft),
        (node(), any::<u64>(), any::<u64>(), node()).prop_map(|(creator, first, last, owner)| {
            Event::OwnerChanged {
                creator,
                first,
                last,
                owner,
            }
        }),
    ]
}

proptest! {
    #[test]
    fn meta_request_round_trips(request in request()) {
        prop_assert_eq!(MetaRequest::decode(request.encode()), Ok(request));
    }

    #[test]
    fn meta_reply_round_trips(reply in reply()) {
        prop_assert_eq!(MetaReply::decode(reply.encode()), Ok(reply));
    }

    #[test]
    fn join_request_round_trips(
        role in role(),
        address in "[0-9.:]{1,30}",
        caps in any::<u8>(),
        rack in any::<u16>(),
        switch in any::<u16>(),
        reclaim in proptest::option::of(node()),
    ) {
        let request = JoinRequest { role, address, capabilities: Capabilities(caps), rack, switch, reclaim };
        prop_assert_eq!(JoinRequest::decode(request.encode()), Ok(request));
    }

    #[test]
    fn join_reply_round_trips(reply in join_reply()) {
        prop_assert_eq!(JoinReply::decode(reply.encode()), Ok(reply));
    }

    #[test]
    fn small_messages_round_trip(
        epoch in any::<u64>(),
        acked in any::<u64>(),
        lease_ms in any::<u32>(),
        node in node(),
    ) {
        let heartbeat = Heartbeat { epoch, acked, lease_ms };
        prop_assert_eq!(Heartbeat::decode(heartbeat.encode()), Ok(heartbeat));
        let reply = HeartbeatReply { epoch, nonce: acked };
        prop_assert_eq!(HeartbeatReply::decode(reply.encode()), Ok(reply));
        prop_assert_eq!(FailureReport::decode(FailureReport { node }.encode()), Ok(FailureReport { node }));
    }

    #[test]
    fn event_push_round_trips(epoch in any::<u64>(), event in event()) {
        let push = EventPush { epoch, event };
        prop_assert_eq!(EventPush::decode(push.encode()), Ok(push));
    }

    #[test]
    fn barrier_released_round_trips(
        id in any::<u32>(),
        round in any::<u64>(),
        values in vec((node(), any::<u64>()), 0..10),
    ) {
        let message = BarrierReleased { id, round, values };
        prop_assert_eq!(BarrierReleased::decode(message.encode()), Ok(message));
    }

    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..256)) {
        fuzz_decode(&bytes);
    }

    #[test]
    fn mutated_messages_never_panic(reply in reply(), index in any::<usize>(), byte in any::<u8>()) {
        let mut bytes = reply.encode().to_vec();
        if !bytes.is_empty() {
            let index = index % bytes.len();
            bytes[index] = byte;
        }
        fuzz_decode(&bytes);
        bytes.truncate(bytes.len() / 2);
        fuzz_decode(&bytes);
    }
}

#[test]
fn trailing_bytes_are_refused() {
    let mut bytes = MetaRequest::Status.encode().to_vec();
    bytes.push(0);
    assert!(MetaRequest::decode(Bytes::from(bytes)).is_err());
}

#[test]
fn huge_counts_are_refused_before_allocating() {
    // Nodes reply claiming 2^40 records in a few bytes.
    let mut out = Encoder::new();
    out.put_u8(9).put_varint(1 << 40);
    assert!(matches!(
        MetaReply::decode(out.finish()),
        Err(ProtoError::TooLarge { .. })
    ));
    let mut out = Encoder::new();
    out.put_u8(9).put_varint(1000);
    assert!(matches!(
        MetaReply::decode(out.finish()),
        Err(ProtoError::Codec(_))
    ));
}

#[test]
fn join_reply_refused_must_carry_an_error() {
    let mut out = Encoder::new();
    out.put_u8(3).put_bytes(&Response::Done.to_bytes());
    assert!(matches!(
        JoinReply::decode(out.finish()),
        Err(ProtoError::Invalid { .. })
    ));
}

/// Byte identity of every metadata-family message across codec changes: a seeded sample
/// folded into one digest (see `crate::digest`).
#[test]
fn encodings_match_the_recorded_digest() {
    use crate::digest::{sample, Digest};
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut digest = Digest::new();
    let join_request = (
        role(),
        "[0-9.:]{1,30}",
        any::<u8>(),
        any::<u16>(),
        any::<u16>(),
        proptest::option::of(node()),
    );
    let small = (any::<u64>(), any::<u64>(), any::<u32>(), node());
    let released = (
        any::<u32>(),
        any::<u64>(),
        vec((node(), any::<u64>()), 0..10),
    );
    for _ in 0..300 {
        digest.add(&sample(&mut runner, &request()).encode());
        digest.add(&sample(&mut runner, &reply()).encode());
        digest.add(&sample(&mut runner, &join_reply()).encode());
        let (role, address, caps, rack, switch, reclaim) = sample(&mut runner, &join_request);
        let request = JoinRequest {
            role,
            address,
            capabilities: Capabilities(caps),
            rack,
            switch,
            reclaim,
        };
        digest.add(&request.encode());
        let (epoch, acked, lease_ms, node) = sample(&mut runner, &small);
        digest.add(
            &Heartbeat {
                epoch,
                acked,
                lease_ms,
            }
            .encode(),
        );
        digest.add(
            &HeartbeatReply {
                epoch,
                nonce: acked,
            }
            .encode(),
        );
        digest.add(&FailureReport { node }.encode());
        let event = sample(&mut runner, &event());
        digest.add(&EventPush { epoch, event }.encode());
        let (id, round, values) = sample(&mut runner, &released);
        digest.add(&BarrierReleased { id, round, values }.encode());
    }
    assert_eq!(
        digest,
        Digest {
            encodings: 2_700,
            bytes: 72_423,
            fnv: 0x72fb51adfa5241c1
        }
    );
}
