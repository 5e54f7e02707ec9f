//! Round trips of every encoded openraft type, and decoders fed garbage and damaged
//! encodings (they must fail cleanly, never panic).

use std::collections::{BTreeMap, BTreeSet};

use myriad_meta::{Capabilities, Command, MetaState, Role};
use myriad_raft::codec::*;
use myriad_raft::limits::{APPEND_ENTRIES_MAX, LOG_INDEX_MAX, NODE_ID_MAX, TERM_MAX};
use myriad_raft::log_store::{read_frame, Frame, LogRecord};
use myriad_raft::state_machine::{decode_snapshot_file, encode_snapshot_file};
use myriad_raft::types::*;
use myriad_types::codec::{Decoder, Encoder};
use myriad_types::{ChunkId, NodeId};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use proptest::prelude::*;

fn leader_id() -> impl Strategy<Value = LeaderId> {
    (0..=TERM_MAX, 0..=NODE_ID_MAX).prop_map(|(term, node_id)| LeaderId { term, node_id })
}

fn vote() -> impl Strategy<Value = Vote> {
    (leader_id(), any::<bool>()).prop_map(|(leader_id, committed)| Vote {
        leader_id,
        committed,
    })
}

fn log_id() -> impl Strategy<Value = LogId> {
    (leader_id(), 0..=LOG_INDEX_MAX).prop_map(|(leader_id, index)| LogId { leader_id, index })
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        ("[a-z0-9/]{1,64}", any::<u64>()).prop_map(|(name, raw)| Command::NameRegister {
            name,
            cid: ChunkId::from_raw(raw),
        }),
        (
            "[a-z]{1,16}",
            proptest::collection::vec(any::<u8>(), 0..300),
            any::<bool>()
        )
            .prop_map(|(name, data, create_only)| Command::TmpPut {
                name,
                data,
                create_only,
            }),
        (
            "[0-9.:]{1,21}",
            any::<u16>(),
            proptest::option::of(any::<u16>())
        )
            .prop_map(|(address, rack, reclaim)| Command::Join {
                role: Role::Peer,
                address,
                capabilities: Capabilities::default(),
                rack,
                switch: rack / 2,
                reclaim: reclaim.map(NodeId),
            }),
        (
            any::<u16>(),
            any::<u32>(),
            proptest::collection::vec(any::<u16>(), 0..8)
        )
            .prop_map(|(owner, zone, backups)| Command::ZoneSet {
                owner: NodeId(owner),
                zone,
                backups: backups.into_iter().map(NodeId).collect(),
            }),
        (any::<u16>(), any::<u32>()).prop_map(|(node, incarnation)| Command::Fail {
            node: NodeId(node),
            incarnation,
        }),
    ]
}

fn membership() -> impl Strategy<Value = Membership> {
    (
        proptest::collection::btree_set(1..20u64, 1..6),
        proptest::option::of(proptest::collection::btree_set(1..20u64, 1..6)),
        proptest::collection::btree_set(1..40u64, 0..4),
        "[a-z0-9.:]{1,30}",
    )
        .prop_map(|(voters, joint, learners, address)| {
            let mut configs = vec![voters];
            configs.extend(joint);
            let nodes: BTreeMap<u64, SuperpeerNode> = configs
                .iter()
                .flatten()
                .chain(&learners)
                .map(|&id| (id, SuperpeerNode::new(format!("{address}-{id}"))))
                .collect();
            Membership::new(configs, nodes).unwrap()
        })
}

fn payload() -> impl Strategy<Value = EntryPayload> {
    prop_oneof![
        Just(EntryPayload::Blank),
        command().prop_map(EntryPayload::Normal),
        membership().prop_map(EntryPayload::Membership),
    ]
}

fn entry() -> impl Strategy<Value = Entry> {
    (log_id(), payload()).prop_map(|(log_id, payload)| Entry { log_id, payload })
}

fn stored_membership() -> impl Strategy<Value = StoredMembership> {
    (proptest::option::of(log_id()), membership())
        .prop_map(|(log_id, membership)| StoredMembership::new(log_id, membership))
}

fn snapshot_meta() -> impl Strategy<Value = SnapshotMeta> {
    (proptest::option::of(log_id()), stored_membership()).prop_map(
        |(last_log_id, last_membership)| SnapshotMeta {
            last_log_id,
            last_membership,
        },
    )
}

fn append_request() -> impl Strategy<Value = AppendEntriesRequest<TypeConfig>> {
    (
        vote(),
        proptest::option::of(log_id()),
        proptest::collection::vec(entry(), 0..6),
        proptest::option::of(log_id()),
    )
        .prop_map(
            |(vote, prev_log_id, entries, leader_commit)| AppendEntriesRequest {
                vote,
                prev_log_id,
                entries,
                leader_commit,
            },
        )
}

fn vote_request() -> impl Strategy<Value = VoteRequest<TypeConfig>> {
    (vote(), proptest::option::of(log_id()), any::<bool>()).prop_map(|(vote, last, transfer)| {
        let mut request = VoteRequest::new(vote, last);
        request.leadership_transfer = transfer;
        request
    })
}

fn request() -> impl Strategy<Value = RpcRequest> {
    prop_oneof![
        append_request().prop_map(RpcRequest::AppendEntries),
        vote_request().prop_map(RpcRequest::Vote),
        vote_request().prop_map(RpcRequest::PreVote),
        (
            vote(),
            snapshot_meta(),
            proptest::collection::vec(any::<u8>(), 0..200)
        )
            .prop_map(
                |(vote, meta, data)| RpcRequest::InstallSnapshot(SnapshotRequest {
                    vote,
                    meta,
                    data
                })
            ),
    ]
}

fn reply() -> impl Strategy<Value = RpcReply> {
    prop_oneof![
        Just(RpcReply::AppendEntries(AppendEntriesResponse::Success)),
        Just(RpcReply::AppendEntries(AppendEntriesResponse::Conflict)),
        proptest::option::of(log_id()).prop_map(|log_id| RpcReply::AppendEntries(
            AppendEntriesResponse::PartialSuccess(log_id)
        )),
        vote().prop_map(|vote| RpcReply::AppendEntries(AppendEntriesResponse::HigherVote(vote))),
        (vote(), proptest::option::of(log_id()), any::<bool>()).prop_map(
            |(vote, last, granted)| RpcReply::Vote(VoteResponse::new(vote, last, granted))
        ),
        vote().prop_map(|vote| RpcReply::Snapshot(SnapshotResponse::new(vote))),
        "\\PC{0,40}".prop_map(RpcReply::Refused),
    ]
}

fn record() -> impl Strategy<Value = LogRecord> {
    prop_oneof![
        entry().prop_map(LogRecord::Append),
        proptest::option::of(log_id()).prop_map(LogRecord::TruncateAfter),
        log_id().prop_map(LogRecord::Purge),
        proptest::option::of(log_id()).prop_map(LogRecord::Committed),
        vote().prop_map(LogRecord::Vote),
    ]
}

/// Requests have no `PartialEq`; their canonical encoding stands in for equality.
fn same_request(a: &RpcRequest, b: &RpcRequest) -> bool {
    a.to_bytes() == b.to_bytes() && format!("{a:?}") == format!("{b:?}")
}

/// Decodes every kind of encoding from `bytes`; none may panic.
fn decode_everything(bytes: &[u8]) {
    let _ = RpcRequest::from_bytes(bytes);
    let _ = RpcReply::from_bytes(bytes);
    let _ = LogRecord::from_bytes(bytes);
    let _ = read_frame(bytes);
    let _ = decode_snapshot_file(bytes);
    let _ = decode_entry(&mut Decoder::from_slice(bytes));
    let _ = decode_membership(&mut Decoder::from_slice(bytes));
    let _ = decode_snapshot_meta(&mut Decoder::from_slice(bytes));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn scalars_round_trip(vote in vote(), log_id in log_id(), optional in proptest::option::of(log_id())) {
        let mut out = Encoder::new();
        encode_vote(&mut out, &vote);
        encode_log_id(&mut out, &log_id);
        encode_option_log_id(&mut out, optional.as_ref());
        let bytes = out.into_vec();
        let mut reader = Decoder::from_slice(&bytes);
        prop_assert_eq!(decode_vote(&mut reader).unwrap(), vote);
        prop_assert_eq!(decode_log_id(&mut reader).unwrap(), log_id);
        prop_assert_eq!(decode_option_log_id(&mut reader).unwrap(), optional);
        reader.finish().unwrap();
    }

    #[test]
    fn entries_and_memberships_round_trip(entry in entry(), stored in stored_membership(), meta in snapshot_meta()) {
        let mut out = Encoder::new();
        encode_entry(&mut out, &entry);
        encode_stored_membership(&mut out, &stored);
        encode_snapshot_meta(&mut out, &meta);
        let bytes = out.into_vec();
        let mut reader = Decoder::from_slice(&bytes);
        prop_assert_eq!(decode_entry(&mut reader).unwrap(), entry);
        prop_assert_eq!(decode_stored_membership(&mut reader).unwrap(), stored);
        prop_assert_eq!(decode_snapshot_meta(&mut reader).unwrap(), meta);
        reader.finish().unwrap();
    }

    #[test]
    fn requests_round_trip(request in request()) {
        let bytes = request.to_bytes();
        let decoded = RpcRequest::from_bytes(&bytes).unwrap();
        prop_assert!(same_request(&decoded, &request));
        if let (RpcRequest::AppendEntries(a), RpcRequest::AppendEntries(b)) = (&decoded, &request) {
            prop_assert_eq!(&a.entries, &b.entries);
            prop_assert_eq!(a.vote, b.vote);
            prop_assert_eq!(a.prev_log_id, b.prev_log_id);
            prop_assert_eq!(a.leader_commit, b.leader_commit);
        }
    }

    #[test]
    fn replies_round_trip(reply in reply()) {
        prop_assert_eq!(RpcReply::from_bytes(&reply.to_bytes()).unwrap(), reply);
    }

    #[test]
    fn records_and_frames_round_trip(record in record()) {
        prop_assert_eq!(LogRecord::from_bytes(&record.to_bytes()).unwrap(), record.clone());
        let frame = record.to_frame().unwrap();
        prop_assert_eq!(read_frame(&frame), Frame::Record(&frame[8..], frame.len()));
        // Every proper prefix of a frame is torn, never a record.
        for cut in 1..frame.len() {
            prop_assert_eq!(read_frame(&frame[..cut]), Frame::Torn);
        }
    }

    #[test]
    fn snapshot_files_round_trip(meta in snapshot_meta(), names in proptest::collection::vec("[a-z]{1,12}", 0..10)) {
        let mut state = MetaState::new();
        for (index, name) in names.iter().enumerate() {
            state.apply(&Command::NameRegister { name: name.clone(), cid: ChunkId::from_raw(index as u64) });
        }
        let data = state.snapshot();
        let file = encode_snapshot_file(&meta, &data).unwrap();
        let (decoded_meta, decoded_data, decoded_state) = decode_snapshot_file(&file).unwrap();
        prop_assert_eq!(decoded_meta, meta);
        prop_assert_eq!(&decoded_data, &data);
        prop_assert_eq!(decoded_state, state);
        // Any single flipped byte is detected.
        for index in 0..file.len() {
            let mut damaged = file.clone();
            damaged[index] ^= 0x40;
            prop_assert!(decode_snapshot_file(&damaged).is_err());
        }
    }

    #[test]
    fn decoders_survive_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        decode_everything(&bytes);
        let mut versioned = vec![RPC_VERSION];
        versioned.extend_from_slice(&bytes);
        decode_everything(&versioned);
    }

    #[test]
    fn decoders_survive_damaged_encodings(request in request(), record in record(), position in any::<usize>(), value in any::<u8>(), cut in any::<usize>()) {
        for mut bytes in [request.to_bytes(), record.to_bytes()] {
            let position = position % bytes.len();
            bytes[position] = value;
            decode_everything(&bytes);
            decode_everything(&bytes[..cut % (bytes.len() + 1)]);
        }
    }
}

#[test]
fn hostile_counts_are_refused_before_allocation() {
    // An AppendEntries claiming more entries than allowed.
    let mut out = Encoder::new();
    out.put_u8(RPC_VERSION);
    out.put_u8(1);
    encode_vote(&mut out, &Vote::new(1, 1));
    out.put_u8(0);
    out.put_u8(0);
    out.put_varint(APPEND_ENTRIES_MAX as u64 + 1);
    assert!(RpcRequest::from_bytes(&out.into_vec()).is_err());
    // A snapshot claiming a huge length with nothing behind it.
    let mut out = Encoder::new();
    out.put_u8(RPC_VERSION);
    out.put_u8(4);
    encode_vote(&mut out, &Vote::new(1, 1));
    encode_snapshot_meta(
        &mut out,
        &SnapshotMeta {
            last_log_id: None,
            last_membership: StoredMembership::default(),
        },
    );
    out.put_varint(u64::from(u32::MAX));
    assert!(RpcRequest::from_bytes(&out.into_vec()).is_err());
    // A node ID beyond 16 bits.
    let mut out = Encoder::new();
    out.put_varint(7);
    out.put_varint(NODE_ID_MAX + 1);
    assert!(decode_leader_id(&mut Decoder::from_slice(&out.into_vec())).is_err());
    // Terms and indexes so large that openraft's arithmetic could overflow.
    let mut out = Encoder::new();
    out.put_varint(TERM_MAX + 1);
    out.put_varint(1);
    assert!(decode_leader_id(&mut Decoder::from_slice(&out.into_vec())).is_err());
    let mut out = Encoder::new();
    out.put_varint(1);
    out.put_varint(1);
    out.put_varint(LOG_INDEX_MAX + 1);
    assert!(decode_log_id(&mut Decoder::from_slice(&out.into_vec())).is_err());
}

#[test]
fn membership_without_a_voter_address_is_refused() {
    let mut out = Encoder::new();
    out.put_varint(1); // one voter set
    out.put_varint(2); // two voters
    out.put_varint(1);
    out.put_varint(2);
    out.put_varint(1); // one node with an address
    out.put_varint(1);
    out.put_str("a:1");
    assert!(decode_membership(&mut Decoder::from_slice(&out.into_vec())).is_err());
    let voters: BTreeSet<u64> = [1].into();
    let ok = Membership::new(
        vec![voters],
        BTreeMap::from([(1, SuperpeerNode::new("a:1"))]),
    )
    .unwrap();
    let mut out = Encoder::new();
    encode_membership(&mut out, &ok);
    assert_eq!(
        decode_membership(&mut Decoder::from_slice(&out.into_vec())).unwrap(),
        ok
    );
}

use myriad_types::digest::EncodingDigest as Digest;

/// Byte identity of the Raft RPC, log-file and snapshot-file formats across codec changes
/// (issue 16 moved them to `myriad_types::codec`): a fixed, seeded sample of requests,
/// replies, log records (and their frames) and snapshot files, folded into one digest
/// recorded with the codec that first wrote these formats, and again when the metadata
/// snapshot inside the files went to version 4 (its first byte; filling backups).
#[test]
fn encodings_match_the_recorded_digest() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut digest = Digest::new();
    let names = proptest::collection::vec("[a-z]{1,12}", 0..10);
    for _ in 0..300 {
        let request = request().new_tree(&mut runner).expect("a sample").current();
        digest.add(&request.to_bytes());
        let reply = reply().new_tree(&mut runner).expect("a sample").current();
        digest.add(&reply.to_bytes());
        let record = record().new_tree(&mut runner).expect("a sample").current();
        digest.add(&record.to_bytes());
        digest.add(&record.to_frame().expect("a frame"));
        let meta = snapshot_meta()
            .new_tree(&mut runner)
            .expect("a sample")
            .current();
        let mut state = MetaState::new();
        let sample = names.new_tree(&mut runner).expect("a sample").current();
        for (index, name) in sample.iter().enumerate() {
            state.apply(&Command::NameRegister {
                name: name.clone(),
                cid: ChunkId::from_raw(index as u64),
            });
        }
        digest.add(&encode_snapshot_file(&meta, &state.snapshot()).expect("a file"));
    }
    assert_eq!(
        digest,
        Digest {
            encodings: 1_500,
            bytes: 133_316,
            fnv: 0xf8e7a43fd74cb23d
        }
    );
}
