//! The metadata state machine: scenario tests for each service and a model-based property
//! test over random command sequences (snapshots, encodings, refusals).

use myriad_meta::limits::*;
use myriad_meta::*;
use myriad_types::{ChunkId, NodeId, LOCAL_ID_MAX};
use proptest::prelude::*;

fn join(state: &mut MetaState, role: Role, reclaim: Option<NodeId>) -> Response {
    state.apply(&Command::Join {
        role,
        address: "127.0.0.1:7000".to_owned(),
        capabilities: Capabilities::ALL,
        rack: 0,
        switch: 0,
        reclaim,
    })
}

fn joined_id(response: Response) -> NodeId {
    match response {
        Response::Joined { id, .. } => id,
        other => panic!("expected a join, got {other:?}"),
    }
}

#[test]
fn client_ids_are_reused_only_after_the_client_is_gone() {
    let mut state = MetaState::new();
    let first = joined_id(join(&mut state, Role::Client, None));
    let second = joined_id(join(&mut state, Role::Client, None));
    assert_ne!(first, second);
    assert_eq!(
        state.apply(&Command::Leave { node: first }),
        Response::Epoch(3)
    );
    let third = joined_id(join(&mut state, Role::Client, None));
    assert_eq!(third, first, "a gone client's ID goes to the next node");
    assert_eq!(state.node(third).map(|r| r.incarnation), Some(2));
}

#[test]
fn peer_ids_stay_reserved_for_their_chunks_until_released() {
    let mut state = MetaState::new();
    let peer = joined_id(join(&mut state, Role::Peer, None));
    assert!(matches!(
        state.apply(&Command::Fail {
            node: peer,
            incarnation: 0
        }),
        Response::Epoch(_)
    ));
    assert!(matches!(
        state.node(peer).map(|r| r.state),
        Some(NodeState::Failed { .. })
    ));
    let stranger = joined_id(join(&mut state, Role::Client, None));
    assert_ne!(
        stranger, peer,
        "chunks created by the failed peer keep its ID"
    );
    // The peer itself comes back with its data directory and gets its ID again.
    let back = joined_id(join(&mut state, Role::Peer, Some(peer)));
    assert_eq!(back, peer);
    assert_eq!(state.node(peer).map(|r| r.incarnation), Some(2));
    // After an orderly leave and an operator's release, the ID is free for anyone.
    state.apply(&Command::Leave { node: peer });
    assert_eq!(
        state.apply(&Command::ReleaseId { node: peer }),
        Response::Done
    );
    let next = joined_id(join(&mut state, Role::Client, None));
    assert_eq!(next, peer);
}

#[test]
fn a_reclaim_by_another_role_is_refused_and_changes_nothing() {
    let mut state = MetaState::new();
    let peer = joined_id(join(&mut state, Role::Peer, None));
    let before = state.clone();
    assert_eq!(
        join(&mut state, Role::Client, Some(peer)),
        Response::Error(MetaError::ReclaimRefused(peer))
    );
    assert_eq!(state, before);
}

#[test]
fn a_verdict_on_an_earlier_incarnation_does_not_hit_a_restarted_node() {
    let mut state = MetaState::new();
    let peer = joined_id(join(&mut state, Role::Peer, None));
    assert_eq!(state.node(peer).map(|record| record.incarnation), Some(1));
    // The peer restarts with its data directory before any verdict: incarnation 2.
    joined_id(join(&mut state, Role::Peer, Some(peer)));
    assert_eq!(state.node(peer).map(|record| record.incarnation), Some(2));
    let before = state.clone();
    assert_eq!(
        state.apply(&Command::Fail {
            node: peer,
            incarnation: 1
        }),
        Response::Error(MetaError::NodeNotAlive(peer))
    );
    assert_eq!(state, before, "a refused verdict changes nothing");
    let epoch = state.epoch();
    assert_eq!(
        state.apply(&Command::Fail {
            node: peer,
            incarnation: 2
        }),
        Response::Epoch(epoch + 1)
    );
    assert!(matches!(
        state.node(peer).map(|record| record.state),
        Some(NodeState::Failed { .. })
    ));
}

#[test]
fn failures_raise_the_epoch_once() {
    let mut state = MetaState::new();
    let peer = joined_id(join(&mut state, Role::Peer, None));
    let epoch = state.epoch();
    assert_eq!(
        state.apply(&Command::Fail {
            node: peer,
            incarnation: 0
        }),
        Response::Epoch(epoch + 1)
    );
    assert_eq!(
        state.apply(&Command::Fail {
            node: peer,
            incarnation: 0
        }),
        Response::Error(MetaError::NodeNotAlive(peer))
    );
    assert_eq!(state.epoch(), epoch + 1);
}

#[test]
fn lookup_follows_recovered_ranges() {
    let mut state = MetaState::new();
    let dead = joined_id(join(&mut state, Role::Peer, None));
    let restorer = joined_id(join(&mut state, Role::Peer, None));
    let cid = ChunkId::new(dead, 5000).unwrap();
    assert_eq!(state.lookup(cid).owner, dead);
    state.apply(&Command::SetOwner {
        creator: dead,
        first: 0,
        last: 9999,
        owner: restorer,
    });
    let range = state.lookup(cid);
    assert_eq!((range.first, range.last, range.owner), (0, 9999, restorer));
    assert_eq!(
        state.lookup(ChunkId::new(dead, 10_000).unwrap()).owner,
        dead
    );
    assert!(matches!(
        state.apply(&Command::SetOwner {
            creator: dead,
            first: 10,
            last: 5,
            owner: restorer
        }),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert_eq!(
        state.apply(&Command::SetOwner {
            creator: dead,
            first: 0,
            last: 5,
            owner: NodeId(999)
        }),
        Response::Error(MetaError::UnknownNode(NodeId(999)))
    );
}

#[test]
fn nameservice_keeps_long_names() {
    let mut state = MetaState::new();
    let name = "social-graph/vertex-index/partition-0042/replica-primary-ab";
    assert!(name.len() > 5);
    let cid = ChunkId::new(NodeId(3), 77).unwrap();
    assert_eq!(
        state.apply(&Command::NameRegister {
            name: name.to_owned(),
            cid
        }),
        Response::Done
    );
    assert_eq!(state.name_get(name), Some(cid));
    let too_long = "x".repeat(NAME_BYTES_MAX + 1);
    assert!(matches!(
        state.apply(&Command::NameRegister {
            name: too_long,
            cid
        }),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert_eq!(
        state.apply(&Command::NameRemove {
            name: "missing".to_owned()
        }),
        Response::Error(MetaError::NameNotFound("missing".to_owned()))
    );
}

#[test]
fn barrier_releases_every_value_when_the_last_participant_signs_on() {
    let mut state = MetaState::new();
    let Response::BarrierAllocated(id) = state.apply(&Command::BarrierAlloc { size: 3 }) else {
        panic!("no barrier");
    };
    for (node, value) in [(1u16, 10u64), (2, 20)] {
        let Response::Barrier(outcome) = state.apply(&Command::BarrierSignOn {
            id,
            node: NodeId(node),
            value,
        }) else {
            panic!("sign-on refused");
        };
        assert_eq!(outcome.released, None);
    }
    assert_eq!(
        state.apply(&Command::BarrierSignOn {
            id,
            node: NodeId(2),
            value: 0
        }),
        Response::Error(MetaError::AlreadySignedOn(NodeId(2)))
    );
    let Response::Barrier(outcome) = state.apply(&Command::BarrierSignOn {
        id,
        node: NodeId(3),
        value: 30,
    }) else {
        panic!("sign-on refused");
    };
    assert_eq!(
        outcome.released,
        Some(vec![(NodeId(1), 10), (NodeId(2), 20), (NodeId(3), 30)])
    );
    let barrier = state.barrier(id).unwrap();
    assert_eq!((barrier.round, barrier.signed.len()), (1, 0));
    // Shrinking the barrier below the sign-ons releases the round at once.
    state.apply(&Command::BarrierSignOn {
        id,
        node: NodeId(1),
        value: 1,
    });
    let Response::Barrier(outcome) = state.apply(&Command::BarrierResize { id, size: 1 }) else {
        panic!("resize refused");
    };
    assert_eq!(outcome.released, Some(vec![(NodeId(1), 1)]));
    assert_eq!(state.apply(&Command::BarrierFree { id }), Response::Done);
    assert_eq!(
        state.apply(&Command::BarrierFree { id }),
        Response::Error(MetaError::BarrierNotFound(id))
    );
}

#[test]
fn tmp_storage_is_bounded() {
    let mut state = MetaState::new();
    let blob = vec![7u8; TMP_BLOB_BYTES_MAX];
    let fits = TMP_TOTAL_BYTES_MAX / TMP_BLOB_BYTES_MAX;
    for index in 0..fits {
        assert_eq!(
            state.apply(&Command::TmpPut {
                name: format!("blob-{index}"),
                data: blob.clone(),
                create_only: true
            }),
            Response::Done
        );
    }
    assert_eq!(
        state.apply(&Command::TmpPut {
            name: "one-more".to_owned(),
            data: vec![1],
            create_only: false
        }),
        Response::Error(MetaError::TmpFull)
    );
    assert_eq!(
        state.apply(&Command::TmpPut {
            name: "blob-0".to_owned(),
            data: vec![1],
            create_only: true
        }),
        Response::Error(MetaError::TmpExists("blob-0".to_owned()))
    );
    // Replacing a blob with a smaller one frees room.
    state.apply(&Command::TmpPut {
        name: "blob-0".to_owned(),
        data: vec![1],
        create_only: false,
    });
    assert_eq!(
        state.apply(&Command::TmpPut {
            name: "one-more".to_owned(),
            data: vec![1],
            create_only: false
        }),
        Response::Done
    );
    assert_eq!(state.tmp_get("blob-0"), Some(&[1u8][..]));
}

#[test]
fn zones_need_known_distinct_backups() {
    let mut state = MetaState::new();
    let owner = joined_id(join(&mut state, Role::Peer, None));
    let a = joined_id(join(&mut state, Role::Peer, None));
    let b = joined_id(join(&mut state, Role::Peer, None));
    assert_eq!(
        state.apply(&Command::ZoneSet {
            owner,
            zone: 0,
            backups: vec![a, b]
        }),
        Response::Done
    );
    assert!(matches!(
        state.apply(&Command::ZoneSet {
            owner,
            zone: 1,
            backups: vec![a, a]
        }),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert!(matches!(
        state.apply(&Command::ZoneSet {
            owner,
            zone: 1,
            backups: vec![owner]
        }),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert_eq!(state.zone(owner, 0), Some(&[a, b][..]));
    assert_eq!(state.zones_of(owner).count(), 1);
}

/// A backup added to a zone's list holds only part of the zone until its copy completes
/// (`ZoneFilled`): the first backups of a new zone are complete, added ones are filling,
/// across `ZoneSet`, `ZoneAdopt` and snapshots.
#[test]
fn a_backup_added_to_a_zone_is_filling_until_its_copy_completes() {
    let mut state = MetaState::new();
    let owner = joined_id(join(&mut state, Role::Peer, None));
    let [a, b, c, d] = [(); 4].map(|()| joined_id(join(&mut state, Role::Peer, None)));
    let set = |backups: Vec<NodeId>| Command::ZoneSet {
        owner,
        zone: 0,
        backups,
    };
    let filled = |backup: NodeId| Command::ZoneFilled {
        owner,
        zone: 0,
        backup,
    };
    assert_eq!(state.apply(&set(vec![a, b])), Response::Done);
    assert!(state.zone_filling(owner, 0).is_empty());
    // b fails and is replaced by c: c fills, a stays complete.
    assert_eq!(state.apply(&set(vec![a, c])), Response::Done);
    assert_eq!(state.zone_filling(owner, 0), &[c][..]);
    // Still filling when the order changes; complete once its copy is done.
    assert_eq!(state.apply(&set(vec![c, a, d])), Response::Done);
    assert_eq!(state.zone_filling(owner, 0), &[c, d][..]);
    let again = MetaState::from_snapshot(&state.snapshot()).unwrap();
    assert_eq!(again.zone_filling(owner, 0), &[c, d][..]);
    assert_eq!(state.apply(&filled(c)), Response::Done);
    assert_eq!(state.apply(&filled(c)), Response::Done, "idempotent");
    assert_eq!(state.zone_filling(owner, 0), &[d][..]);
    assert!(matches!(
        state.apply(&filled(b)),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert_eq!(
        state.apply(&Command::ZoneFilled {
            owner,
            zone: 9,
            backup: a
        }),
        Response::Error(MetaError::ZoneNotFound { owner, zone: 9 })
    );
    // The owner fails; a restores and adopts with c kept and b added: d (still filling)
    // dropped, b filling, c complete.
    state.apply(&Command::Fail {
        node: owner,
        incarnation: 0,
    });
    let adopt_by_a = |backups: Vec<NodeId>| Command::ZoneAdopt {
        owner,
        zone: 0,
        holder: a,
        backups,
    };
    assert_eq!(state.apply(&adopt_by_a(vec![c, b])), Response::Done);
    assert_eq!(state.zone_filling(owner, 0), &[b][..]);
    // A filling backup kept across an adoption stays filling.
    assert_eq!(state.apply(&adopt_by_a(vec![b, d])), Response::Done);
    assert_eq!(state.zone_filling(owner, 0), &[b, d][..]);
    assert!(state.zone_filling(owner, 5).is_empty());
}

/// Adoption (issue 6): a restorer takes over a failed peer's zone with the surviving
/// backups plus new ones; the zone keeps its log identity, is recovered when its holder
/// fails (not when its log owner restarts), and counts for the holder's zones.
#[test]
fn a_restorer_adopts_a_failed_peers_zone() {
    let mut state = MetaState::new();
    let owner = joined_id(join(&mut state, Role::Peer, None));
    let r = joined_id(join(&mut state, Role::Peer, None));
    let b = joined_id(join(&mut state, Role::Peer, None));
    let c = joined_id(join(&mut state, Role::Peer, None));
    let d = joined_id(join(&mut state, Role::Peer, None));
    for zone in [0, 1] {
        state.apply(&Command::ZoneSet {
            owner,
            zone,
            backups: vec![r, b, c],
        });
    }
    let adopt = |holder: NodeId, backups: Vec<NodeId>| Command::ZoneAdopt {
        owner,
        zone: 0,
        holder,
        backups,
    };
    // Not before the owner failed (the zone needs no recovery).
    assert!(matches!(
        state.apply(&adopt(r, vec![b, c, d])),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    state.apply(&Command::Fail {
        node: owner,
        incarnation: 0,
    });
    assert_eq!(state.zones_to_recover().count(), 2);
    // Refusals: unknown zone, holder among the backups, owner among them, the owner itself.
    assert_eq!(
        state.apply(&Command::ZoneAdopt {
            owner,
            zone: 7,
            holder: r,
            backups: vec![b],
        }),
        Response::Error(MetaError::ZoneNotFound { owner, zone: 7 })
    );
    for bad in [
        adopt(r, vec![b, r]),
        adopt(r, vec![b, owner]),
        adopt(r, vec![b, b]),
    ] {
        assert!(matches!(
            state.apply(&bad),
            Response::Error(MetaError::InvalidArgument(_))
        ));
    }
    assert!(matches!(
        state.apply(&adopt(owner, vec![b])),
        Response::Error(MetaError::NodeNotAlive(_))
    ));
    let owned = |holder: NodeId| Command::ZoneOwned {
        owner,
        zone: 0,
        holder,
    };
    assert!(matches!(
        state.apply(&owned(r)),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert_eq!(state.apply(&adopt(r, vec![b, c, d])), Response::Done);
    // Adopted, but not settled until the holder committed the CIDs' ownership.
    assert!(!state.zone_settled(owner, 0));
    assert!(matches!(
        state.apply(&owned(b)),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert_eq!(state.apply(&owned(r)), Response::Done);
    assert!(state.zone_settled(owner, 0));
    assert!(!state.zone_settled(owner, 1));
    assert!(MetaState::from_snapshot(&state.snapshot())
        .unwrap()
        .zone_settled(owner, 0));
    assert_eq!(state.zone(owner, 0), Some(&[b, c, d][..]));
    assert_eq!(state.zone_holder(owner, 0), Some(r));
    assert_eq!(state.zone_holder(owner, 1), Some(owner));
    assert!(!state.zone_needs_recovery(owner, 0));
    let held: Vec<(NodeId, u32)> = state.zones_held_by(r).map(|(o, z, _)| (o, z)).collect();
    assert_eq!(held, vec![(owner, 0)]);
    assert_eq!(state.zones_held_by(owner).count(), 1);
    // The log owner still lists it (log GC asks by log owner).
    assert_eq!(state.zones_of(owner).count(), 2);
    // Another restorer cannot take a zone held by a live peer; the holder may change its
    // backups; the owner may not register it again.
    assert!(matches!(
        state.apply(&adopt(b, vec![c, d])),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert_eq!(state.apply(&adopt(r, vec![b, d])), Response::Done);
    assert!(matches!(
        state.apply(&Command::ZoneSet {
            owner,
            zone: 0,
            backups: vec![b],
        }),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    // The log owner comes back: its adopted zone is not recovered again, and its new
    // incarnation numbers zones above it.
    let rejoined = join(&mut state, Role::Peer, Some(owner));
    assert!(matches!(rejoined, Response::Joined { id, .. } if id == owner));
    assert_eq!(state.bases(owner).zone_base, 2);
    let due: Vec<(NodeId, u32)> = state.zones_to_recover().map(|(o, z, _)| (o, z)).collect();
    assert_eq!(due, vec![(owner, 1)]);
    // The holder fails: the adopted zone is recovered again, and may be adopted anew
    // (a chained adoption).
    state.apply(&Command::Fail {
        node: r,
        incarnation: 0,
    });
    assert!(state.zone_needs_recovery(owner, 0));
    assert_eq!(state.apply(&adopt(b, vec![d])), Response::Done);
    assert_eq!(state.zone_holder(owner, 0), Some(b));
    assert!(!state.zone_settled(owner, 0), "a new holder settles anew");
    // A holder that restarts (new incarnation) lost the zone from memory.
    join(&mut state, Role::Peer, Some(b));
    assert!(state.zone_needs_recovery(owner, 0));
    let restored = MetaState::from_snapshot(&state.snapshot()).unwrap();
    assert_eq!(restored, state);
    assert_eq!(
        adopt(r, vec![b, c]).to_string(),
        format!("zone-adopt {owner}/0 by {r} backups {b} {c}")
    );
}

fn node_id() -> impl Strategy<Value = NodeId> {
    (0u16..6).prop_map(NodeId)
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-c]{1,3}".prop_map(String::from)]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (1u8..4, prop::option::of(node_id())).prop_map(|(role, reclaim)| Command::Join {
            role: [Role::Superpeer, Role::Peer, Role::Client][usize::from(role - 1)],
            address: format!("10.0.0.{role}:22221"),
            capabilities: Capabilities(role),
            rack: u16::from(role),
            switch: 1,
            reclaim,
        }),
        node_id().prop_map(|node| Command::Leave { node }),
        (node_id(), 0u32..3).prop_map(|(node, incarnation)| Command::Fail { node, incarnation }),
        node_id().prop_map(|node| Command::ReleaseId { node }),
        (node_id(), 0u64..100, 0u64..100, node_id()).prop_map(|(creator, a, b, owner)| {
            Command::SetOwner {
                creator,
                first: a,
                last: b,
                owner,
            }
        }),
        (name(), any::<u64>()).prop_map(|(name, raw)| Command::NameRegister {
            name,
            cid: ChunkId::from_raw(raw)
        }),
        name().prop_map(|name| Command::NameRemove { name }),
        (0u32..4).prop_map(|size| Command::BarrierAlloc { size }),
        (0u32..3, node_id(), any::<u64>()).prop_map(|(id, node, value)| Command::BarrierSignOn {
            id,
            node,
            value
        }),
        (0u32..3, 0u32..4).prop_map(|(id, size)| Command::BarrierResize { id, size }),
        (0u32..3).prop_map(|id| Command::BarrierFree { id }),
        (
            name(),
            prop::collection::vec(any::<u8>(), 0..16),
            any::<bool>()
        )
            .prop_map(|(name, data, create_only)| Command::TmpPut {
                name,
                data,
                create_only
            }),
        name().prop_map(|name| Command::TmpRemove { name }),
        (node_id(), 0u32..3, prop::collection::vec(node_id(), 0..4)).prop_map(
            |(owner, zone, backups)| Command::ZoneSet {
                owner,
                zone,
                backups
            }
        ),
        (node_id(), 0u32..3).prop_map(|(owner, zone)| Command::ZoneRemove { owner, zone }),
        (node_id(), 0u32..3, node_id()).prop_map(|(owner, zone, backup)| Command::ZoneFilled {
            owner,
            zone,
            backup
        }),
        (node_id(), 0u32..3, node_id()).prop_map(|(owner, zone, holder)| Command::ZoneOwned {
            owner,
            zone,
            holder
        }),
        (
            node_id(),
            0u32..3,
            node_id(),
            prop::collection::vec(node_id(), 0..4)
        )
            .prop_map(|(owner, zone, holder, backups)| Command::ZoneAdopt {
                owner,
                zone,
                holder,
                backups
            }),
        (
            node_id(),
            prop_oneof![0u64..100, Just(LOCAL_ID_MAX + 1), Just(u64::MAX)]
        )
            .prop_map(|(node, up_to)| Command::ReserveLids { node, up_to }),
        (node_id(), 0u32..3, node_id()).prop_map(|(failed, incarnation, fallback)| {
            Command::HandOver {
                failed,
                incarnation,
                fallback,
            }
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Every command and response survives its encoding; a refused command changes nothing;
    /// after every step the snapshot decodes to an equal state, and a replica that applies
    /// the decoded commands ends equal (byte-equal snapshots).
    #[test]
    fn random_commands_keep_replicas_and_snapshots_equal(
        commands in prop::collection::vec(command(), 1..60)
    ) {
        let mut leader = MetaState::new();
        let mut replica = MetaState::new();
        for command in &commands {
            let bytes = command.to_bytes();
            let decoded = Command::from_bytes(&bytes).expect("own encoding decodes");
            prop_assert_eq!(&decoded, command);
            let before = leader.clone();
            let response = leader.apply(command);
            let decoded_response = Response::from_bytes(&response.to_bytes());
            prop_assert_eq!(decoded_response, Ok(response.clone()));
            if matches!(response, Response::Error(_)) {
                prop_assert_eq!(&leader, &before);
            }
            prop_assert_eq!(replica.apply(&decoded), response);
            let snapshot = leader.snapshot();
            let restored = MetaState::from_snapshot(&snapshot).expect("own snapshot decodes");
            prop_assert_eq!(&restored, &leader);
        }
        prop_assert_eq!(leader.snapshot(), replica.snapshot());
    }

    /// Decoders return errors, never panic, on arbitrary or truncated input; whatever
    /// decodes has exactly one encoding (re-encoding gives the same bytes).
    #[test]
    fn decoders_survive_garbage(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(command) = Command::from_bytes(&bytes) {
            prop_assert_eq!(command.to_bytes(), bytes.clone());
        }
        if let Ok(response) = Response::from_bytes(&bytes) {
            prop_assert_eq!(response.to_bytes(), bytes.clone());
        }
        let _ = MetaState::from_snapshot(&bytes);
    }


    /// Every strict prefix of a valid encoding is refused.
    #[test]
    fn truncated_commands_are_refused(command in command()) {
        let bytes = command.to_bytes();
        for cut in 0..bytes.len() {
            prop_assert!(Command::from_bytes(&bytes[..cut]).is_err());
        }
    }
}

/// Every input of up to three bytes (the first byte below 64, which covers every tag)
/// that decodes has exactly one encoding: the tag is where two encodings of one command
/// or response could hide (the `decode_meta` fuzz target found tag 24 with incarnation 0).
#[test]
fn short_inputs_have_one_encoding() {
    let mut inputs: Vec<Vec<u8>> = vec![Vec::new()];
    for tag in 0u8..64 {
        inputs.push(vec![tag]);
        for a in 0..=255u8 {
            inputs.push(vec![tag, a]);
            for b in 0..=255u8 {
                inputs.push(vec![tag, a, b]);
            }
        }
    }
    for bytes in inputs {
        if let Ok(command) = Command::from_bytes(&bytes) {
            assert_eq!(command.to_bytes(), bytes, "command {command:?}");
        }
        if let Ok(response) = Response::from_bytes(&bytes) {
            assert_eq!(response.to_bytes(), bytes, "response {response:?}");
        }
    }
}

/// The fuzz finding behind `short_inputs_have_one_encoding`: a verdict on incarnation 0
/// is written with tag 3, so tag 24 naming incarnation 0 is refused.
#[test]
fn a_fail_verdict_has_one_encoding() {
    assert!(Command::from_bytes(&[24, 0, 0]).is_err());
    let any = Command::Fail {
        node: NodeId(0),
        incarnation: 0,
    };
    assert_eq!(any.to_bytes(), vec![3, 0]);
    let named = Command::Fail {
        node: NodeId(5),
        incarnation: 2,
    };
    assert_eq!(Command::from_bytes(&named.to_bytes()), Ok(named));
}

#[test]
fn provisional_ids_are_never_assigned_or_reclaimed() {
    let mut state = MetaState::new();
    assert_eq!(
        join(&mut state, Role::Peer, Some(NodeId(NODE_ID_MAX + 1))),
        Response::Error(MetaError::ReclaimRefused(NodeId(NODE_ID_MAX + 1)))
    );
    assert_eq!(
        join(&mut state, Role::Peer, Some(NodeId(0))),
        Response::Error(MetaError::ReclaimRefused(NodeId(0)))
    );
    assert_eq!(joined_id(join(&mut state, Role::Peer, None)), NodeId(1));
}

/// A restarted peer (same ID, new incarnation) numbers zones and local IDs above everything
/// its earlier incarnation registered or reserved; the old zones are then due for recovery
/// and its fresh local IDs route to it again.
#[test]
fn a_new_incarnation_starts_above_the_old_zones_and_local_ids() {
    let mut state = MetaState::new();
    let peer = joined_id(join(&mut state, Role::Peer, None));
    let backup = joined_id(join(&mut state, Role::Peer, None));
    let other = joined_id(join(&mut state, Role::Peer, None));
    assert_eq!(state.bases(peer), PeerBases::default());
    for zone in [0, 1, 4] {
        assert_eq!(
            state.apply(&Command::ZoneSet {
                owner: peer,
                zone,
                backups: vec![backup],
            }),
            Response::Done
        );
    }
    for up_to in [1 << 32, 1 << 20] {
        assert_eq!(
            state.apply(&Command::ReserveLids { node: peer, up_to }),
            Response::Done
        );
    }
    assert!(matches!(
        state.apply(&Command::ReserveLids {
            node: peer,
            up_to: LOCAL_ID_MAX + 2
        }),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert_eq!(state.zones_to_recover().count(), 0);
    // A recovery handed the peer's unused IDs to another peer while it was gone.
    state.apply(&Command::Fail {
        node: peer,
        incarnation: 0,
    });
    assert_eq!(state.zones_to_recover().count(), 3);
    state.apply(&Command::SetOwner {
        creator: peer,
        first: 0,
        last: LOCAL_ID_MAX,
        owner: other,
    });
    let rejoined = join(&mut state, Role::Peer, Some(peer));
    assert!(matches!(rejoined, Response::Joined { id, incarnation: 2, .. } if id == peer));
    assert_eq!(
        state.bases(peer),
        PeerBases {
            zone_base: 5,
            zones_end: 5,
            lid_base: 1 << 32,
            lids_reserved: 1 << 32,
        }
    );
    // Alive again, but its old zones still wait for recovery.
    let due: Vec<u32> = state
        .zones_to_recover()
        .map(|(owner, zone, _)| {
            assert_eq!(owner, peer);
            zone
        })
        .collect();
    assert_eq!(due, vec![0, 1, 4]);
    // Fresh IDs route to the new incarnation, old ones stay with the restorer.
    let cid = |lid: u64| ChunkId::new(peer, lid).unwrap();
    assert_eq!(state.lookup(cid(1 << 32)).owner, peer);
    assert_eq!(state.lookup(cid(LOCAL_ID_MAX)).owner, peer);
    assert_eq!(state.lookup(cid((1 << 32) - 1)).owner, other);
    // The old incarnation's zone numbers are closed to registrations.
    assert!(matches!(
        state.apply(&Command::ZoneSet {
            owner: peer,
            zone: 4,
            backups: vec![backup],
        }),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert_eq!(
        state.apply(&Command::ZoneSet {
            owner: peer,
            zone: 5,
            backups: vec![backup],
        }),
        Response::Done
    );
    assert!(!state.zone_needs_recovery(peer, 5));
    // A third incarnation without new reservations still starts above the second's zones.
    join(&mut state, Role::Peer, Some(peer));
    assert_eq!(state.bases(peer).zone_base, 6);
    assert_eq!(state.bases(peer).lid_base, 1 << 32);
    let restored = MetaState::from_snapshot(&state.snapshot()).unwrap();
    assert_eq!(restored, state);
}

/// The hand-over of a failed peer's leftover ranges: each goes to a neighbouring owner
/// (else the fallback), only its reserved own IDs count, and a rejoined peer keeps what
/// routes to it.
#[test]
fn leftover_ranges_go_to_neighbours_in_one_hand_over() {
    let mut state = MetaState::new();
    let failed = joined_id(join(&mut state, Role::Peer, None));
    let a = joined_id(join(&mut state, Role::Peer, None));
    let b = joined_id(join(&mut state, Role::Peer, None));
    state.apply(&Command::ReserveLids {
        node: failed,
        up_to: 1_000,
    });
    // Without a zone (no backups) its own IDs are not handed over.
    state.apply(&Command::Fail {
        node: failed,
        incarnation: 0,
    });
    assert!(state.leftover_ranges(failed, b).is_empty());
    join(&mut state, Role::Peer, Some(failed));
    state.apply(&Command::ReserveLids {
        node: failed,
        up_to: 1_000,
    });
    state.apply(&Command::ZoneSet {
        owner: failed,
        zone: 0,
        backups: vec![a],
    });
    for (first, last, owner) in [(1, 10, a), (12, 20, b)] {
        state.apply(&Command::SetOwner {
            creator: failed,
            first,
            last,
            owner,
        });
    }
    state.apply(&Command::SetOwner {
        creator: a,
        first: 5,
        last: 6,
        owner: failed,
    });
    let hand_over = Command::HandOver {
        failed,
        incarnation: 2,
        fallback: b,
    };
    // Not before the failure.
    assert!(matches!(
        state.apply(&hand_over),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    state.apply(&Command::Fail {
        node: failed,
        incarnation: 0,
    });
    assert_eq!(
        state.leftover_ranges(failed, b),
        vec![
            (failed, 0, 0, a),
            (failed, 11, 11, a),
            (failed, 21, 999, b),
            (a, 5, 6, a),
        ]
    );
    assert_eq!(state.apply(&hand_over), Response::Done);
    assert!(state.leftover_ranges(failed, b).is_empty());
    let cid = |creator, lid| ChunkId::new(creator, lid).unwrap();
    assert_eq!(state.lookup(cid(failed, 0)).owner, a);
    assert_eq!(state.lookup(cid(failed, 500)).owner, b);
    assert_eq!(
        state.lookup(cid(failed, 1_000)).owner,
        failed,
        "never handed out"
    );
    assert_eq!(state.lookup(cid(a, 5)).owner, a);
    // A rejoined peer (a new incarnation) is not handed over for the old one.
    state.apply(&Command::SetOwner {
        creator: a,
        first: 7,
        last: 7,
        owner: failed,
    });
    join(&mut state, Role::Peer, Some(failed));
    assert!(matches!(
        state.apply(&hand_over),
        Response::Error(MetaError::InvalidArgument(_))
    ));
    assert_eq!(state.lookup(cid(a, 7)).owner, failed);
}

use myriad_types::digest::EncodingDigest as Digest;

/// Byte identity of the disk and wire formats across codec changes (issue 16 moved them
/// to `myriad_types::codec`): a fixed, seeded sample of command sequences, every command,
/// every response and the snapshot after the last command, folded into one digest. The
/// expected digest was recorded with the codec that first wrote these formats, and again
/// when `ZoneFilled` and snapshot version 4 (filling backups) were added; a different
/// digest means a format changed.
#[test]
fn encodings_match_the_recorded_digest() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let sequences = prop::collection::vec(command(), 1..60);
    let mut digest = Digest::new();
    for _ in 0..200 {
        let commands = sequences.new_tree(&mut runner).expect("a sample").current();
        let mut state = MetaState::new();
        for command in &commands {
            digest.add(&command.to_bytes());
            digest.add(&state.apply(command).to_bytes());
        }
        digest.add(&state.snapshot());
    }
    assert_eq!(
        digest,
        Digest {
            encodings: 12_310,
            bytes: 97_702,
            fnv: 0x1beb30fc0bff69cb
        }
    );
}
