//! The chunk API against scripted peers (no memory manager): replies of the wrong shape
//! or length become `Protocol` errors, a peer that never answers becomes `Timeout`
//! within the call's timeout, blocking calls refuse to run inside a runtime, and the
//! range cache routes by the latest lookup.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::chunk::{ChunkOptions, Chunks};
use myriad_client::directory::Directory;
use myriad_client::ClientError;
use myriad_meta::LookupRange;
use myriad_net::{Config, Endpoint, Handlers, Incoming};
use myriad_proto::chunk::{ChunkReply, ChunkRequest, ItemError};
use myriad_types::{ChunkId, NodeId, LOCAL_ID_MAX};

const SECRET: &str = "chunk-protocol-test";

struct Creators;

impl Directory for Creators {
    fn local_node(&self) -> NodeId {
        NodeId(100)
    }

    async fn lookup(&self, cid: ChunkId) -> Result<LookupRange, ClientError> {
        Ok(LookupRange {
            creator: cid.creator(),
            first: 0,
            last: LOCAL_ID_MAX,
            owner: cid.creator(),
        })
    }

    fn is_alive(&self, _node: NodeId) -> bool {
        true
    }
}

fn config(node: u16) -> Config {
    Config::new(NodeId(node), "127.0.0.1:0".parse().unwrap(), SECRET)
}

/// A peer (node 1) answering every chunk request with `answer(request)`.
fn scripted_peer(
    answer: impl Fn(ChunkRequest) -> Option<Bytes> + Send + Sync + 'static,
) -> Endpoint {
    let mut handlers = Handlers::new();
    handlers
        .register(myriad_proto::types::CHUNK, move |incoming: Incoming| {
            let Ok(request) = ChunkRequest::decode(incoming.payload.clone()) else {
                return;
            };
            if let Some(reply) = answer(request) {
                let _ = incoming.respond(reply);
            }
        })
        .unwrap();
    Endpoint::start(config(1), handlers).unwrap()
}

fn client(peer: &Endpoint, timeout: Duration) -> (Endpoint, Chunks<Creators>) {
    let endpoint = Endpoint::start(config(100), Handlers::new()).unwrap();
    endpoint.set_address(NodeId(1), peer.local_addr());
    let options = ChunkOptions {
        timeout,
        ..ChunkOptions::default()
    };
    let chunks = Chunks::new(endpoint.handle(), Arc::new(Creators), options);
    (endpoint, chunks)
}

fn cid(local_id: u64) -> ChunkId {
    ChunkId::new(NodeId(1), local_id).unwrap()
}

#[test]
fn wrong_replies_are_protocol_errors() {
    let peer = scripted_peer(|request| match request {
        // Garbage bytes.
        ChunkRequest::Get { cids } if cids.len() == 1 => Some(Bytes::from_static(&[0xee, 1])),
        // One item too few.
        ChunkRequest::Get { .. } => Some(ChunkReply::Data(vec![Ok(Bytes::new())]).encode()),
        // The wrong reply kind.
        ChunkRequest::Put { .. } => Some(ChunkReply::Sizes(vec![Ok(1)]).encode()),
        ChunkRequest::Stats => Some(ChunkReply::Malformed("no idea".into()).encode()),
        _ => Some(ChunkReply::Failed(ItemError::Internal("scripted".into())).encode()),
    });
    let (_endpoint, chunks) = client(&peer, Duration::from_secs(2));
    let api = chunks.blocking();
    assert!(matches!(api.get(cid(1)), Err(ClientError::Protocol(_))));
    let batch = api.get_batch(&[cid(1), cid(2)]);
    assert!(
        batch
            .iter()
            .all(|r| matches!(r, Err(ClientError::Protocol(_)))),
        "{batch:?}"
    );
    assert!(matches!(
        api.put(cid(1), Bytes::from_static(b"x")),
        Err(ClientError::Protocol(_))
    ));
    assert!(matches!(
        api.stats(NodeId(1)),
        Err(ClientError::Protocol(_))
    ));
    assert!(matches!(
        api.create(NodeId(1), 8),
        Err(ClientError::Server {
            node: NodeId(1),
            ..
        })
    ));
}

#[test]
fn a_silent_peer_times_out_within_the_timeout() {
    let peer = scripted_peer(|_| None);
    let (_endpoint, chunks) = client(&peer, Duration::from_millis(300));
    let started = Instant::now();
    let result = chunks.blocking().get(cid(1));
    assert!(
        matches!(result, Err(ClientError::Timeout { .. })),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
}

/// Every item ended with the owner's refusal (`Server`), not a timeout.
fn assert_all_refused(result: &[Result<Bytes, ClientError>]) {
    assert!(
        result
            .iter()
            .all(|r| matches!(r, Err(ClientError::Server { .. }))),
        "{result:?}"
    );
}

/// A peer that keeps answering `NotOwner` (ownership moving, or views catching up during a
/// recovery) is followed, paced, until the call's timeout, which then ends the call.
#[test]
fn not_owner_forever_ends_at_the_timeout() {
    let peer = scripted_peer(|request| match request {
        ChunkRequest::Get { cids } => {
            Some(ChunkReply::Data(vec![Err(ItemError::NotOwner); cids.len()]).encode())
        }
        _ => None,
    });
    let (_endpoint, chunks) = client(&peer, Duration::from_secs(1));
    let started = Instant::now();
    assert_all_refused(&chunks.blocking().get_batch(&[cid(1), cid(2)]));
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(1500),
        "{elapsed:?}"
    );
}

/// A slow peer that refuses: the round still under way when the deadline comes times
/// out, and the call ends with the peer's last answer (the refusal), not a bare timeout.
#[test]
fn a_refusal_outlasts_a_retry_cut_by_the_deadline() {
    let mut handlers = Handlers::new();
    handlers
        .register(myriad_proto::types::CHUNK, |incoming: Incoming| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(400));
                if let Ok(ChunkRequest::Get { cids }) =
                    ChunkRequest::decode(incoming.payload.clone())
                {
                    let reply = ChunkReply::Data(vec![Err(ItemError::NotOwner); cids.len()]);
                    let _ = incoming.respond(reply.encode());
                }
            });
        })
        .unwrap();
    let peer = Endpoint::start(config(1), handlers).unwrap();
    let (_endpoint, chunks) = client(&peer, Duration::from_secs(1));
    let started = Instant::now();
    assert_all_refused(&chunks.blocking().get_batch(&[cid(1), cid(2)]));
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
}

#[test]
fn blocking_calls_refuse_to_run_inside_a_runtime() {
    let peer = scripted_peer(|_| None);
    let (_endpoint, chunks) = client(&peer, Duration::from_millis(200));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let result = runtime.block_on(async { chunks.blocking().status(cid(1)) });
    assert!(
        matches!(result, Err(ClientError::InvalidArgument(_))),
        "{result:?}"
    );
}

#[test]
fn cache_routes_by_the_latest_range() {
    let peer = scripted_peer(|_| None);
    let (_endpoint, chunks) = client(&peer, Duration::from_millis(200));
    assert_eq!(chunks.owner_of(cid(50)), NodeId(1));
    let range = |first, last, owner| LookupRange {
        creator: NodeId(1),
        first,
        last,
        owner: NodeId(owner),
    };
    chunks.remember(range(10, 100, 2));
    assert_eq!(chunks.owner_of(cid(50)), NodeId(2));
    assert_eq!(chunks.owner_of(cid(101)), NodeId(1));
    // A newer, overlapping answer replaces the old range.
    chunks.remember(range(40, 60, 3));
    assert_eq!(chunks.owner_of(cid(50)), NodeId(3));
    assert_eq!(
        chunks.owner_of(cid(20)),
        NodeId(1),
        "the replaced range is gone"
    );
    chunks.clear_cache();
    assert_eq!(chunks.owner_of(cid(50)), NodeId(1));
}
