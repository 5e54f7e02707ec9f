//! Conformance vectors for the Java client (`clients/java`): the Rust encoders' bytes of
//! one case per request and reply form the Java client speaks (frame header, handshake
//! greeting and proofs, chunk requests and replies, migrations, metadata requests,
//! replies, joins, heartbeats, events, barrier releases), written to
//! `clients/java/client/src/test/resources/conformance/vectors.txt` (`name<TAB>hex`).
//!
//! This test fails when the checked-in file differs from what the encoders produce now, so
//! a change of any encoding the Java client depends on is noticed here first; the Java
//! tests (`ConformanceTest`) encode the same requests and must produce the same bytes, and
//! decode every reply to the values listed there. Regenerate after an intended change with
//! `MYRIAD_UPDATE_VECTORS=1 cargo test -p myriad-proto --test java_vectors` (and update
//! the Java client).

use bytes::Bytes;
use myriad_meta::{
    BarrierOutcome, Capabilities, Command, LookupRange, MetaError, NodeRecord, NodeState,
    PeerBases, Response, Role,
};
use myriad_net::wire::{
    acceptor_proof, connector_proof, Fragment, FrameHeader, Greeting, Kind, NONCE_BYTES,
};
use myriad_proto::chunk::{ChunkReply, ChunkRequest, ChunkStats, ItemError};
use myriad_proto::meta::{
    BarrierReleased, BarrierStatus, Event, EventPush, Heartbeat, HeartbeatReply, JoinReply,
    JoinRequest, MetaReply, MetaRequest, StatusReply,
};
use myriad_proto::migrate::{MigrateReply, MigrateRequest};
use myriad_types::{ChunkId, NodeId};

const VECTORS: &str = "../../clients/java/client/src/test/resources/conformance/vectors.txt";

fn cid(creator: u16, local: u64) -> ChunkId {
    ChunkId::new(NodeId(creator), local).expect("a 48-bit local ID")
}

fn pattern(len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>())
}

fn node(id: u16, role: Role, address: &str, state: NodeState) -> NodeRecord {
    NodeRecord {
        id: NodeId(id),
        role,
        address: address.to_owned(),
        capabilities: Capabilities(7),
        rack: 3,
        switch: 4,
        state,
        incarnation: 2,
        joined_epoch: 300,
        released: false,
    }
}

fn chunk_requests() -> Vec<(&'static str, Bytes)> {
    let a = cid(1, 5);
    let b = cid(0xffff, myriad_types::LOCAL_ID_MAX);
    vec![
        (
            "chunk.create",
            ChunkRequest::Create {
                durability: 1,
                sizes: vec![64, 0, 300],
            },
        ),
        (
            "chunk.create_with_data",
            ChunkRequest::CreateWithData {
                durability: 2,
                payloads: vec![Bytes::from_static(b"abc"), Bytes::new(), pattern(200)],
            },
        ),
        ("chunk.get", ChunkRequest::Get { cids: vec![a, b] }),
        (
            "chunk.put",
            ChunkRequest::Put {
                durability: 3,
                items: vec![(a, Bytes::from_static(b"xyz")), (b, pattern(130))],
            },
        ),
        (
            "chunk.remove",
            ChunkRequest::Remove {
                durability: 0,
                cids: vec![a, b],
            },
        ),
        (
            "chunk.insert",
            ChunkRequest::Insert {
                durability: 1,
                items: vec![(a, Bytes::from_static(b"q"))],
            },
        ),
        (
            "chunk.read_at",
            ChunkRequest::ReadAt {
                cid: a,
                offset: 300,
                len: 5,
            },
        ),
        (
            "chunk.write_at",
            ChunkRequest::WriteAt {
                durability: 2,
                cid: a,
                offset: 128,
                data: Bytes::from_static(b"hello"),
            },
        ),
        (
            "chunk.resize",
            ChunkRequest::Resize {
                durability: 0,
                cid: b,
                size: 70_000,
            },
        ),
        (
            "chunk.lock",
            ChunkRequest::Lock {
                cid: a,
                write: true,
                timeout_ms: 1500,
            },
        ),
        (
            "chunk.unlock",
            ChunkRequest::Unlock {
                cid: a,
                write: false,
            },
        ),
        ("chunk.status", ChunkRequest::Status { cids: vec![b] }),
        (
            "chunk.list",
            ChunkRequest::List {
                creator: Some(NodeId(2)),
                max: 1000,
            },
        ),
        (
            "chunk.list_all",
            ChunkRequest::List {
                creator: None,
                max: 5,
            },
        ),
        ("chunk.stats", ChunkRequest::Stats),
    ]
    .into_iter()
    .map(|(name, request)| (name, request.encode()))
    .collect()
}

fn chunk_replies() -> Vec<(&'static str, Bytes)> {
    vec![
        (
            "chunk.reply.created",
            ChunkReply::Created(vec![cid(1, 5), cid(2, 1 << 40)]),
        ),
        (
            "chunk.reply.data",
            ChunkReply::Data(vec![
                Ok(Bytes::from_static(b"abc")),
                Err(ItemError::NotFound),
                Err(ItemError::NotOwner),
                Ok(pattern(150)),
                Err(ItemError::Invalid("bad offset".into())),
                Err(ItemError::Internal("ünïcode".into())),
            ]),
        ),
        (
            "chunk.reply.statuses",
            ChunkReply::Statuses(vec![
                Ok(()),
                Err(ItemError::TooLarge),
                Err(ItemError::OutOfMemory),
                Err(ItemError::LockTimeout),
            ]),
        ),
        (
            "chunk.reply.sizes",
            ChunkReply::Sizes(vec![Ok(64), Err(ItemError::NotFound), Ok(1 << 20)]),
        ),
        (
            "chunk.reply.ranges",
            ChunkReply::Ranges {
                ranges: vec![(cid(1, 0), cid(1, 9)), (cid(3, 7), cid(3, 7))],
                truncated: true,
            },
        ),
        (
            "chunk.reply.stats",
            ChunkReply::Stats(ChunkStats {
                chunks: 1,
                payload_bytes: 200,
                used_bytes: 300,
                free_bytes: 400,
                region_bytes: 70_000,
                rereplication_pending: 6,
                requests_served: 1_000_000,
            }),
        ),
        (
            "chunk.reply.failed",
            ChunkReply::Failed(ItemError::OutOfMemory),
        ),
        (
            "chunk.reply.malformed",
            ChunkReply::Malformed("truncated".into()),
        ),
    ]
    .into_iter()
    .map(|(name, reply)| (name, reply.encode()))
    .collect()
}

fn meta_requests() -> Vec<(&'static str, Bytes)> {
    let write = |command| MetaRequest::Write(command);
    vec![
        ("meta.leave", write(Command::Leave { node: NodeId(300) })),
        (
            "meta.name_register",
            write(Command::NameRegister {
                name: "name-ü".into(),
                cid: cid(1, 5),
            }),
        ),
        (
            "meta.name_remove",
            write(Command::NameRemove { name: "n".into() }),
        ),
        (
            "meta.barrier_alloc",
            write(Command::BarrierAlloc { size: 200 }),
        ),
        (
            "meta.barrier_sign_on",
            write(Command::BarrierSignOn {
                id: 3,
                node: NodeId(0x1234),
                value: u64::MAX - 1,
            }),
        ),
        (
            "meta.barrier_resize",
            write(Command::BarrierResize { id: 3, size: 5 }),
        ),
        ("meta.barrier_free", write(Command::BarrierFree { id: 129 })),
        (
            "meta.tmp_put",
            write(Command::TmpPut {
                name: "blob".into(),
                data: vec![1, 2, 3],
                create_only: true,
            }),
        ),
        (
            "meta.tmp_remove",
            write(Command::TmpRemove {
                name: "blob".into(),
            }),
        ),
        ("meta.lookup", MetaRequest::Lookup(cid(2, 77))),
        ("meta.lookup_tree", MetaRequest::LookupTree(NodeId(2))),
        ("meta.name_get", MetaRequest::NameGet("name".into())),
        ("meta.name_list", MetaRequest::NameList),
        ("meta.tmp_get", MetaRequest::TmpGet("blob".into())),
        ("meta.tmp_list", MetaRequest::TmpList),
        ("meta.barrier_status", MetaRequest::BarrierStatus(300)),
        ("meta.nodes", MetaRequest::Nodes),
        ("meta.zones", MetaRequest::Zones(NodeId(2))),
        ("meta.status", MetaRequest::Status),
    ]
    .into_iter()
    .map(|(name, request)| (name, request.encode()))
    .collect()
}

fn meta_replies() -> Vec<(&'static str, Bytes)> {
    let nodes = vec![
        node(1, Role::Superpeer, "127.0.0.1:4000", NodeState::Alive),
        node(
            2,
            Role::Peer,
            "127.0.0.1:4001",
            NodeState::Failed { epoch: 9 },
        ),
        node(0x300, Role::Client, "10.0.0.1:5", NodeState::Left),
    ];
    vec![
        ("meta.reply.done", MetaReply::Response(Response::Done)),
        (
            "meta.reply.barrier_allocated",
            MetaReply::Response(Response::BarrierAllocated(7)),
        ),
        (
            "meta.reply.barrier_released",
            MetaReply::Response(Response::Barrier(BarrierOutcome {
                round: 4,
                signed: 2,
                size: 2,
                released: Some(vec![(NodeId(5), 11), (NodeId(300), u64::MAX)]),
            })),
        ),
        (
            "meta.reply.barrier_waiting",
            MetaReply::Response(Response::Barrier(BarrierOutcome {
                round: 4,
                signed: 1,
                size: 2,
                released: None,
            })),
        ),
        (
            "meta.reply.error",
            MetaReply::Response(Response::Error(MetaError::TmpExists("blob".into()))),
        ),
        (
            "meta.reply.error_zone",
            MetaReply::Response(Response::Error(MetaError::ZoneNotFound {
                owner: NodeId(2),
                zone: 300,
            })),
        ),
        (
            "meta.reply.lookup",
            MetaReply::Lookup(LookupRange {
                creator: NodeId(2),
                first: 0,
                last: 1 << 40,
                owner: NodeId(3),
            }),
        ),
        (
            "meta.reply.lookup_tree",
            MetaReply::LookupTree(vec![(0, 9, NodeId(5)), (20, 300, NodeId(6))]),
        ),
        ("meta.reply.name", MetaReply::Name(Some(cid(1, 5)))),
        ("meta.reply.name_none", MetaReply::Name(None)),
        (
            "meta.reply.names",
            MetaReply::Names(vec![("a".into(), cid(1, 1)), ("b".into(), cid(2, 2))]),
        ),
        ("meta.reply.tmp", MetaReply::Tmp(Some(vec![9, 8, 7]))),
        ("meta.reply.tmp_none", MetaReply::Tmp(None)),
        (
            "meta.reply.tmp_list",
            MetaReply::TmpList(vec![("blob".into(), 3), ("big".into(), 1 << 20)]),
        ),
        (
            "meta.reply.barrier",
            MetaReply::Barrier(Some(BarrierStatus {
                size: 3,
                round: 2,
                signed: 1,
                last_released: vec![(NodeId(5), 1), (NodeId(6), 2)],
            })),
        ),
        ("meta.reply.nodes", MetaReply::Nodes(nodes.clone())),
        (
            "meta.reply.zones",
            MetaReply::Zones(vec![(0, vec![NodeId(3), NodeId(4)]), (300, vec![])]),
        ),
        (
            "meta.reply.status",
            MetaReply::Status(StatusReply {
                node: NodeId(1),
                epoch: 12,
                leader: Some(NodeId(2)),
                term: 3,
                last_log_index: Some(500),
                last_applied_index: None,
                members: vec![(NodeId(1), "127.0.0.1:4000".into())],
            }),
        ),
        (
            "meta.reply.not_leader",
            MetaReply::NotLeader {
                leader: Some(NodeId(2)),
            },
        ),
        (
            "meta.reply.unavailable",
            MetaReply::Unavailable("no quorum: x".into()),
        ),
        (
            "meta.reply.bases",
            MetaReply::Bases(PeerBases {
                zone_base: 1,
                zones_end: 2,
                lid_base: 3,
                lids_reserved: 4,
            }),
        ),
    ]
    .into_iter()
    .map(|(name, reply)| (name, reply.encode()))
    .chain([
        (
            "join.request",
            JoinRequest {
                role: Role::Client,
                address: "127.0.0.1:4000".into(),
                capabilities: Capabilities(7),
                rack: 1,
                switch: 2,
                reclaim: None,
            }
            .encode(),
        ),
        (
            "join.request_reclaim",
            JoinRequest {
                role: Role::Peer,
                address: "h:1".into(),
                capabilities: Capabilities(3),
                rack: 0,
                switch: 0,
                reclaim: Some(NodeId(9)),
            }
            .encode(),
        ),
        (
            "join.reply.ok",
            JoinReply::Ok {
                id: NodeId(0x0102),
                incarnation: 3,
                epoch: 200,
                nodes,
                lease_ms: 800,
            }
            .encode(),
        ),
        (
            "join.reply.not_leader",
            JoinReply::NotLeader { leader: None }.encode(),
        ),
        (
            "join.reply.refused",
            JoinReply::Refused(MetaError::NodeIdsExhausted).encode(),
        ),
        (
            "join.reply.unavailable",
            JoinReply::Unavailable("stopped: bye".into()).encode(),
        ),
        (
            "heartbeat",
            Heartbeat {
                epoch: 7,
                acked: 300,
                lease_ms: 800,
            }
            .encode(),
        ),
        (
            "heartbeat.reply",
            HeartbeatReply {
                epoch: 300,
                nonce: 5,
            }
            .encode(),
        ),
    ])
    .collect()
}

fn events() -> Vec<(&'static str, Bytes)> {
    let push = |epoch, event| EventPush { epoch, event }.encode();
    vec![
        (
            "event.joined",
            push(
                5,
                Event::NodeJoined(node(7, Role::Peer, "127.0.0.1:9", NodeState::Alive)),
            ),
        ),
        ("event.failed", push(6, Event::NodeFailed(NodeId(7)))),
        ("event.left", push(300, Event::NodeLeft(NodeId(8)))),
        (
            "event.owner_changed",
            push(
                301,
                Event::OwnerChanged {
                    creator: NodeId(2),
                    first: 10,
                    last: 20,
                    owner: NodeId(3),
                },
            ),
        ),
        (
            "migrate.request",
            MigrateRequest {
                first: cid(2, 5),
                last: cid(2, 300),
                to: NodeId(3),
            }
            .encode(),
        ),
        ("migrate.reply.moved", MigrateReply::Moved(296).encode()),
        (
            "migrate.reply.failed",
            MigrateReply::Failed("not the owner".into()).encode(),
        ),
        (
            "barrier.released",
            BarrierReleased {
                id: 3,
                round: 9,
                values: vec![(NodeId(5), 1), (NodeId(6), 2)],
            }
            .encode(),
        ),
    ]
}

fn wire() -> Vec<(&'static str, Bytes)> {
    let header = FrameHeader {
        kind: Kind::Request,
        ordered: true,
        fragment: Fragment::Last,
        type_id: 0x11,
        subtype: 0x22,
        message_id: 0x0403_0201,
        payload_bytes: 256,
    };
    let response = FrameHeader {
        kind: Kind::Response,
        ordered: false,
        fragment: Fragment::Whole,
        type_id: 20,
        subtype: 0,
        message_id: 7,
        payload_bytes: 10,
    };
    let connector = Greeting {
        node: 0x0102,
        instance: 0x1122_3344_5566_7788,
        nonce: [0xab; NONCE_BYTES],
        lane: false,
    }
    .encode();
    let acceptor = Greeting {
        node: 1,
        instance: 42,
        nonce: [7; NONCE_BYTES],
        lane: false,
    }
    .encode();
    vec![
        ("frame.request", Bytes::copy_from_slice(&header.encode())),
        ("frame.response", Bytes::copy_from_slice(&response.encode())),
        ("greeting.connector", Bytes::copy_from_slice(&connector)),
        ("greeting.acceptor", Bytes::copy_from_slice(&acceptor)),
        (
            "proof.acceptor",
            Bytes::copy_from_slice(&acceptor_proof(b"myriad", &connector, &acceptor)),
        ),
        (
            "proof.connector",
            Bytes::copy_from_slice(&connector_proof(b"myriad", &connector, &acceptor)),
        ),
    ]
}

fn render() -> String {
    let mut out = String::from(
        "# Conformance vectors: the Rust encoders' bytes (crates/proto/tests/java_vectors.rs).\n\
         # name<TAB>hex. Regenerate: MYRIAD_UPDATE_VECTORS=1 cargo test -p myriad-proto --test java_vectors\n",
    );
    let all = wire()
        .into_iter()
        .chain(chunk_requests())
        .chain(chunk_replies())
        .chain(meta_requests())
        .chain(meta_replies())
        .chain(events());
    for (name, bytes) in all {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("{name}\t{hex}\n"));
    }
    out
}

#[test]
fn checked_in_java_vectors_match_the_rust_encoders() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(VECTORS);
    let now = render();
    if std::env::var_os("MYRIAD_UPDATE_VECTORS").is_some() {
        std::fs::write(&path, &now).expect("write the vectors");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    for (line_now, line_file) in now.lines().zip(checked_in.lines()) {
        assert_eq!(
            line_now,
            line_file,
            "{} differs from the Rust encoders; regenerate with MYRIAD_UPDATE_VECTORS=1 and update the Java client",
            path.display()
        );
    }
    assert_eq!(
        now.lines().count(),
        checked_in.lines().count(),
        "{} has a different number of vectors; regenerate with MYRIAD_UPDATE_VECTORS=1",
        path.display()
    );
}
