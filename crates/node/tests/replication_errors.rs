//! A change the replicator cannot make as durable as asked is answered with an error,
//! while the change stays in the master's memory (the documented contract of
//! `ChunkService` with a replicator).

use std::sync::Arc;

use bytes::Bytes;
use myriad_mem::{MemoryConfig, MemoryManager};
use myriad_net::{Config, Endpoint, Handlers};
use myriad_node::peer::ChunkService;
use myriad_node::replication::MemorySource;
use myriad_proto::chunk::{ChunkReply, ChunkRequest, ItemError, DURABILITY_REPLICATED};
use myriad_replication::{
    BackupCandidates, Candidate, RegisterFuture, RegistryError, Replicator, ReplicatorConfig,
    ZoneRegistry,
};
use myriad_types::{ChunkId, NodeId};

struct Refusing;

impl ZoneRegistry for Refusing {
    fn register(&self, _owner: NodeId, _zone: u32, _backups: Vec<NodeId>) -> RegisterFuture {
        Box::pin(async { Err(RegistryError("the superpeers said no".to_owned())) })
    }
}

struct OneCandidate;

impl BackupCandidates for OneCandidate {
    fn candidates(&self) -> Vec<Candidate> {
        vec![Candidate {
            node: NodeId(9),
            rack: 0,
            switch: 0,
        }]
    }
}

#[test]
fn replication_failure_is_an_item_error_and_memory_keeps_the_change() {
    let me = NodeId(3);
    let endpoint = Endpoint::start(
        Config::new(me, "127.0.0.1:0".parse().unwrap(), "s"),
        Handlers::new(),
    )
    .unwrap();
    let mem = Arc::new(
        MemoryManager::new(MemoryConfig {
            node_id: me,
            region_bytes: 1 << 20,
            ..MemoryConfig::default()
        })
        .unwrap(),
    );
    let mut config = ReplicatorConfig::new(me);
    config.replication = 1;
    config.wait_timeout = std::time::Duration::from_secs(2);
    let replicator = Replicator::new(
        config,
        endpoint.handle(),
        Arc::new(OneCandidate),
        Arc::new(Refusing),
        Arc::new(MemorySource::new(Arc::clone(&mem))),
    )
    .unwrap();
    let service = ChunkService::new(Arc::clone(&mem), me)
        .with_replication(Arc::new(replicator), endpoint.runtime());
    // Created in memory, but the zone's registration fails: the create reports it.
    let reply = service.execute(
        me,
        ChunkRequest::CreateWithData {
            durability: DURABILITY_REPLICATED,
            payloads: vec![Bytes::from_static(b"one")],
        },
    );
    match reply {
        ChunkReply::Failed(ItemError::Internal(reason)) => {
            assert!(reason.contains("not replicated"), "{reason}");
            assert!(reason.contains("said no"), "{reason}");
        }
        other => panic!("expected an internal error, got {other:?}"),
    }
    let cid = ChunkId::new(me, 0).unwrap();
    assert_eq!(mem.read_with(cid, <[u8]>::to_vec).unwrap(), b"one");
    let reply = service.execute(
        me,
        ChunkRequest::Put {
            durability: DURABILITY_REPLICATED,
            items: vec![(cid, Bytes::from_static(b"two"))],
        },
    );
    match reply {
        ChunkReply::Statuses(statuses) => {
            assert!(
                matches!(&statuses[0], Err(ItemError::Internal(_))),
                "{statuses:?}"
            )
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(mem.read_with(cid, <[u8]>::to_vec).unwrap(), b"two");
    drop(service);
    endpoint.shutdown();
}
