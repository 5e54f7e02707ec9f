//! Replication end to end, in one process: a superpeer, four peers (R = 2, 8 KiB zones,
//! logs on disk in temporary directories) and remote clients writing in every durability
//! mode. Every zone of every master is read back from each of its registered backups and
//! compared with the master's memory; then a backup leaves and its zones must get a
//! replacement, registered with the superpeer and re-replicated; and a peer crashes: its
//! zones are recovered and re-replicated, the zones it backed up get replacements.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use myriad_client::client::Client;
use myriad_proto::chunk::{DURABILITY_ASYNC, DURABILITY_DURABLE, DURABILITY_REPLICATED};
use myriad_replication::Durability;
use myriad_testing::cluster::TestCluster;
use myriad_types::{ChunkId, NodeId};
use parking_lot::Mutex;

const PEERS: usize = 4;
const ZONE_BYTES: u64 = 8 << 10;
const R: usize = 2;

/// One superpeer and four peers (R = 2, 8 KiB zones); one peer makes its memory resident
/// at start, while zones are written.
fn start() -> TestCluster {
    TestCluster::builder()
        .superpeers(1)
        .peers(PEERS)
        .zone_bytes(ZONE_BYTES)
        .replication(R)
        .configure_peers(|index, options| {
            options.backup.unreachable_timeout = Duration::from_secs(2);
            options.prefault_bytes = if index == 0 { 8 << 20 } else { 0 };
        })
        .start()
}

/// How many zones of the other live peers list `node` among their backups.
fn zones_backed_by(cluster: &TestCluster, client: &Client, node: NodeId) -> usize {
    cluster
        .live_peers()
        .filter(|peer| peer.node_id() != node)
        .map(|peer| {
            client
                .blocking()
                .zones(peer.node_id())
                .unwrap()
                .iter()
                .filter(|(_, backups)| backups.contains(&node))
                .count()
        })
        .sum()
}

/// A client whose chunk calls ask for `durability`.
fn client_asking(cluster: &TestCluster, durability: u8) -> Client {
    cluster.new_client(|config| {
        config.chunks.timeout = Duration::from_secs(20);
        config.chunks.durability = durability;
    })
}

fn payload(seed: u64, len: usize) -> Bytes {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Writes through `client` to every master peer: creates, puts, removes, a write-at and
/// a resize. Returns the model: what every chunk must hold (`None`: removed).
fn write_workload(
    client: &Client,
    masters: &[NodeId],
    seed: u64,
    model: &mut BTreeMap<ChunkId, Option<Bytes>>,
) {
    let blocking = client.blocking();
    let chunks = blocking.chunks();
    for (m, &master) in masters.iter().enumerate() {
        let data: Vec<Bytes> = (0..24)
            .map(|i| {
                payload(
                    seed * 1000 + m as u64 * 100 + i,
                    300 + (i as usize * 37) % 400,
                )
            })
            .collect();
        let cids = chunks.create_with_data(master, data.clone()).unwrap();
        for (cid, data) in cids.iter().zip(&data) {
            model.insert(*cid, Some(data.clone()));
        }
        // Put new bytes (same size) into every second chunk.
        let puts: Vec<(ChunkId, Bytes)> = cids
            .iter()
            .zip(&data)
            .step_by(2)
            .map(|(cid, old)| (*cid, payload(seed + cid.raw(), old.len())))
            .collect();
        for result in chunks.put_batch(&puts) {
            result.unwrap();
        }
        for (cid, data) in &puts {
            model.insert(*cid, Some(data.clone()));
        }
        // Remove every fifth chunk.
        let removed: Vec<ChunkId> = cids.iter().copied().skip(1).step_by(5).collect();
        for result in chunks.remove_batch(&removed) {
            result.unwrap();
        }
        for cid in &removed {
            model.insert(*cid, None);
        }
        // Write into one chunk and resize another.
        let target = cids[2];
        chunks
            .write_at(target, 3, Bytes::from_static(b"abcdef"))
            .unwrap();
        if let Some(Some(bytes)) = model.get_mut(&target) {
            let mut changed = bytes.to_vec();
            changed[3..9].copy_from_slice(b"abcdef");
            *bytes = changed.into();
        }
        let grown = cids[3];
        chunks.resize(grown, 900).unwrap();
        if let Some(Some(bytes)) = model.get_mut(&grown) {
            let mut changed = bytes.to_vec();
            changed.resize(900, 0);
            *bytes = changed.into();
        }
    }
}

/// For every zone of every live master, its backups per the superpeer, each backup's copy
/// read back and compared with the master's memory (and the model). Returns the number of
/// zones checked.
fn check_zones(
    cluster: &TestCluster,
    client: &Client,
    model: &BTreeMap<ChunkId, Option<Bytes>>,
    creators: &[NodeId],
) -> usize {
    let mut zones_checked = 0;
    for master in cluster.live_peers() {
        let owner = master.node_id();
        let replicator = master.replicator().expect("replicator");
        replicator.wait_all(Durability::Durable).unwrap();
        let mem = master.service().memory();
        // The master's memory, by zone: its own chunks and those it recovered.
        let mut expected: HashMap<u32, BTreeMap<u64, Vec<u8>>> = HashMap::new();
        let ranges = creators
            .iter()
            .flat_map(|creator| mem.chunk_ranges(*creator));
        for (first, last) in ranges {
            for raw in first.raw()..=last.raw() {
                let cid = ChunkId::from_raw(raw);
                let data = mem.read_with(cid, <[u8]>::to_vec).unwrap();
                // Memory agrees with what the clients wrote.
                assert_eq!(
                    model.get(&cid).cloned().flatten().as_deref(),
                    Some(&data[..]),
                    "{cid} in memory"
                );
                let zone = replicator.zone_of(cid).expect("every chunk has a zone");
                expected.entry(zone).or_default().insert(raw, data);
            }
        }
        let registered = client.blocking().zones(owner).unwrap();
        assert!(
            registered.len() >= 2,
            "{owner} should have several zones: {registered:?}"
        );
        // Every zone of the master, own or adopted (issue 6), under its log identity.
        let stats = replicator.stats();
        for zone in expected.keys() {
            assert!(
                stats.zones.iter().any(|z| z.zone == *zone),
                "zone {zone} of {owner} is unknown to its replicator"
            );
        }
        for zone_stats in &stats.zones {
            let zone = &zone_stats.zone;
            let (log_owner, log_zone) = zone_stats.adopted_from.unwrap_or((owner, *zone));
            let table = if log_owner == owner {
                registered.clone()
            } else {
                client.blocking().zones(log_owner).unwrap()
            };
            let Some((_, backups)) = table.iter().find(|(z, _)| *z == log_zone) else {
                panic!("zone {log_owner}/{log_zone} (local {zone} of {owner}) is not registered");
            };
            assert_eq!(
                Some(backups.clone()),
                replicator.backups_of(*zone),
                "registry and replicator agree on {log_owner}/{log_zone}"
            );
            assert!(!backups.contains(&owner), "{owner} backs its own zone");
            assert_eq!(backups.len(), R.min(cluster.live_peers().count() - 1));
            let want = expected.get(zone).cloned().unwrap_or_default();
            for backup in backups {
                let peer = cluster
                    .peer_by_id(*backup)
                    .unwrap_or_else(|| panic!("{owner}/{zone} lists dead backup {backup}"));
                let service = peer.backup_service().expect("backup capability");
                let got: Mutex<BTreeMap<u64, Vec<u8>>> = Mutex::new(BTreeMap::new());
                service
                    .recover_zone(log_owner, log_zone, &|chunks| {
                        let mut got = got.lock();
                        for chunk in chunks {
                            assert!(
                                got.insert(chunk.cid, chunk.payload.to_vec()).is_none(),
                                "a chunk recovered twice"
                            );
                        }
                    })
                    .unwrap();
                let got = got.into_inner();
                assert_eq!(
                    got.keys().collect::<Vec<_>>(),
                    want.keys().collect::<Vec<_>>(),
                    "CIDs of {log_owner}/{log_zone} on backup {backup}"
                );
                assert!(
                    got == want,
                    "bytes of {log_owner}/{log_zone} on backup {backup}"
                );
            }
            zones_checked += 1;
        }
    }
    zones_checked
}

#[test]
fn zones_on_backups_match_masters_and_survive_a_backup_leaving() {
    let mut cluster = start();
    let masters = cluster.peer_ids();
    let mut model = BTreeMap::new();
    for (seed, level) in [
        DURABILITY_ASYNC,
        DURABILITY_REPLICATED,
        DURABILITY_DURABLE,
        0,
    ]
    .into_iter()
    .enumerate()
    {
        let client = client_asking(&cluster, level);
        write_workload(&client, &masters, seed as u64 + 1, &mut model);
    }
    let client = cluster.client();
    let zones = check_zones(&cluster, &client, &model, &masters);
    assert!(zones >= 2 * PEERS, "only {zones} zones checked");
    // The `async` puts and removes of chunks in registered zones were served on the
    // peers' I/O threads, and their copies matched above like every other change.
    let inline: u64 = cluster
        .live_peers()
        .map(|peer| peer.service().changes_served_inline())
        .sum();
    assert!(inline > 0, "no async change was served inline");

    // A backup leaves: every zone it backed gets a replacement, registered and filled.
    let gone_index = PEERS - 1;
    let gone = cluster.peer(gone_index).node_id();
    let affected = zones_backed_by(&cluster, &client, gone);
    assert!(affected > 0, "the leaving peer backs no zone");
    cluster.stop_peer(gone_index);
    // The gone peer's own chunks are not checked any more (recovery is another issue).
    model.retain(|cid, _| cid.creator() != gone);
    cluster.wait_until(Duration::from_secs(20), "zones are re-replicated", || {
        cluster.live_peers().all(|peer| {
            let stats = peer.replicator().unwrap().stats();
            let registered = client.blocking().zones(peer.node_id()).unwrap_or_default();
            stats
                .zones
                .iter()
                .all(|z| z.registered && z.resyncs == 0 && !z.backups.contains(&gone))
                && registered
                    .iter()
                    .all(|(_, backups)| !backups.contains(&gone) && backups.len() == R)
        })
    });
    // Writes keep working in the strictest mode, and every copy matches again.
    let client = client_asking(&cluster, DURABILITY_DURABLE);
    let masters = cluster.peer_ids();
    write_workload(&client, &masters, 99, &mut model);
    let zones = check_zones(&cluster, &client, &model, &masters);
    assert!(zones >= 2 * (PEERS - 1), "only {zones} zones checked");
}

/// A peer crashes (no leave): its zones are recovered by their backups, each adopted by
/// its restorer (issue 6: same log identity, the surviving backups plus a new one, copied
/// only to the new one); the zones it backed up get replacements, registered and filled.
/// Afterwards every copy of every zone matches its holder's memory, the crashed peer's
/// chunks included, every chunk reads back with its latest value, and only the restorers'
/// own copies of the adopted zones' logs are deleted.
#[test]
fn a_crashed_peer_is_recovered_and_every_zone_is_replicated_again() {
    let mut cluster = start();
    let creators = cluster.peer_ids();
    let mut model = BTreeMap::new();
    for (seed, level) in [DURABILITY_DURABLE, DURABILITY_REPLICATED]
        .into_iter()
        .enumerate()
    {
        let client = client_asking(&cluster, level);
        write_workload(&client, &creators, seed as u64 + 11, &mut model);
    }
    for peer in cluster.live_peers() {
        peer.replicator()
            .unwrap()
            .wait_all(Durability::Durable)
            .unwrap();
    }
    let client = cluster.client();
    let crashed_index = 1;
    let crashed = cluster.peer(crashed_index).node_id();
    let crashed_zones = client.blocking().zones(crashed).unwrap();
    assert!(crashed_zones.len() >= 2, "{crashed_zones:?}");
    // Zones of the other peers that the crashed one backs: each gets one replacement.
    let backed = zones_backed_by(&cluster, &client, crashed);
    let resets = |cluster: &TestCluster| -> u64 {
        cluster
            .live_peers()
            .filter(|peer| peer.node_id() != crashed)
            .map(|peer| peer.backup_service().unwrap().resets())
            .sum()
    };
    let resets_before = resets(&cluster);
    cluster.kill_peer(crashed_index);

    cluster.wait_until(
        Duration::from_secs(30),
        "the crashed peer's zones are recovered",
        || {
            client.blocking().recovery_status().is_ok_and(|status| {
                let mine: Vec<_> = status.zones.iter().filter(|z| z.owner == crashed).collect();
                mine.len() == crashed_zones.len()
                    && mine
                        .iter()
                        .all(|z| z.state == myriad_proto::recovery::RecoveryState::Done)
            })
        },
    );
    cluster.wait_until(
        Duration::from_secs(30),
        "zones are replicated again",
        || {
            cluster.live_peers().all(|peer| {
                let stats = peer.replicator().unwrap().stats();
                let pending = client
                    .blocking()
                    .chunks()
                    .stats(peer.node_id())
                    .map_or(u64::MAX, |stats| stats.rereplication_pending);
                let mut registered = client.blocking().zones(peer.node_id()).unwrap_or_default();
                registered.extend(client.blocking().zones(crashed).unwrap_or_default());
                pending == 0
                    && stats
                        .zones
                        .iter()
                        .all(|z| z.registered && z.resyncs == 0 && !z.backups.contains(&crashed))
                    && registered
                        .iter()
                        .all(|(_, backups)| !backups.contains(&crashed) && backups.len() == R)
            })
        },
    );
    // Every backup added by a replacement or an adoption got its copy and was recorded as
    // holding the whole zone (`ZoneFilled`): none is left filling.
    cluster.wait_until(
        Duration::from_secs(15),
        "no zone has a backup still being filled",
        || {
            cluster.leader().raft().is_some_and(|raft| {
                raft.read_local(|state| {
                    state
                        .zones()
                        .all(|(owner, zone, _)| state.zone_filling(owner, zone).is_empty())
                })
            })
        },
    );
    // Every chunk, the crashed peer's included, reads back with its latest value.
    let all: Vec<ChunkId> = model.keys().copied().collect();
    for (cid, result) in all.iter().zip(client.blocking().chunks().get_batch(&all)) {
        let want = model.get(cid).cloned().flatten();
        match (result, want) {
            (Ok(data), Some(want)) => assert_eq!(data, want, "{cid}"),
            (Err(myriad_client::ClientError::NotFound(_)), None) => {}
            (other, want) => panic!("{cid}: {other:?}, expected {want:?}"),
        }
    }
    // The restorers' copies: recovered chunks are in zones of their new owners.
    let zones = check_zones(&cluster, &client, &model, &creators);
    assert!(zones >= 2 * (PEERS - 1), "only {zones} zones checked");
    let restored_on: usize = cluster
        .live_peers()
        .map(|peer| peer.service().memory().chunk_ranges(crashed).len())
        .sum();
    assert!(restored_on > 0, "no peer holds the crashed peer's chunks");
    // The recovered zones stay in the table, adopted (same numbers, never backed by the
    // crashed peer); a backup that is no longer listed (the restorer) deletes its log after
    // the (test) grace period, the listed ones keep theirs.
    let adopted = client.blocking().zones(crashed).unwrap();
    assert_eq!(
        adopted.iter().map(|(z, _)| *z).collect::<Vec<_>>(),
        crashed_zones.iter().map(|(z, _)| *z).collect::<Vec<_>>(),
        "the crashed peer's zones stay in the table, adopted"
    );
    let holders: usize = cluster
        .live_peers()
        .map(|peer| {
            let stats = peer.replicator().unwrap().stats();
            stats
                .zones
                .iter()
                .filter(|z| z.adopted_from.is_some_and(|(owner, _)| owner == crashed))
                .count()
        })
        .sum();
    assert_eq!(holders, adopted.len(), "each adopted zone has one holder");
    // Every write was durable on every backup before the crash, so each surviving backup
    // held the zone at its restorer's position (asked over the network) and was kept:
    // only the restorer's own place in the order was filled anew (one copy, started by a
    // reset, per adopted zone), plus one replacement per zone the crashed peer backed.
    assert_eq!(
        resets(&cluster) - resets_before,
        (crashed_zones.len() + backed) as u64,
        "copies started: {} adopted zones, {backed} zones backed by the crashed peer",
        crashed_zones.len()
    );
    for (zone, old_backups) in &crashed_zones {
        let holder = cluster
            .live_peers()
            .find(|peer| {
                peer.replicator()
                    .unwrap()
                    .stats()
                    .zones
                    .iter()
                    .any(|z| z.adopted_from == Some((crashed, *zone)))
            })
            .map(|peer| peer.node_id())
            .expect("a holder");
        let (_, now) = adopted
            .iter()
            .find(|(z, _)| z == zone)
            .expect("the adopted zone");
        for backup in old_backups.iter().filter(|&&b| b != holder) {
            assert!(
                now.contains(backup),
                "zone {zone}: surviving backup {backup} was not kept ({old_backups:?} -> {now:?})"
            );
        }
    }
    cluster.wait_until(
        Duration::from_secs(15),
        "unlisted copies of the crashed peer's zone logs are deleted",
        || {
            cluster.live_peers().all(|peer| {
                let me = peer.node_id();
                peer.backup_service()
                    .unwrap()
                    .zone_ids()
                    .iter()
                    .filter(|(owner, _)| *owner == crashed)
                    .all(|(_, zone)| {
                        adopted
                            .iter()
                            .any(|(z, backups)| z == zone && backups.contains(&me))
                    })
            })
        },
    );
    let zones = check_zones(&cluster, &client, &model, &creators);
    assert!(
        zones >= 2 * (PEERS - 1),
        "only {zones} zones checked after the deletions"
    );
}

/// A zone none of whose backups ever received a change (the owner's `async` creates were
/// all dropped on the way, then it crashed) holds nothing anywhere: every backup answers
/// `NotHeld` and the leader removes the zone at once as restored empty, instead of asking
/// again until its backup wait ends and reporting the zone lost.
#[test]
fn a_zone_no_backup_ever_received_is_removed_at_once_as_empty() {
    let mut cluster = start();
    let victim_index = 2;
    let victim = cluster.peer(victim_index).node_id();
    for peer in cluster.live_peers().filter(|peer| peer.node_id() != victim) {
        peer.membership()
            .net()
            .set_fault(victim, myriad_net::Fault::DropIncoming);
    }
    let client = client_asking(&cluster, DURABILITY_ASYNC);
    let data: Vec<Bytes> = (0..5).map(|i| payload(i, 64)).collect();
    let cids = client
        .blocking()
        .chunks()
        .create_with_data(victim, data)
        .unwrap();
    assert_eq!(cids.len(), 5);
    let admin = cluster.client();
    let zones = admin.blocking().zones(victim).unwrap();
    assert!(!zones.is_empty(), "the async creates registered a zone");
    cluster.kill_peer(victim_index);
    cluster.wait_until(
        Duration::from_secs(30),
        "the victim's zones are finished",
        || {
            admin.blocking().recovery_status().is_ok_and(|status| {
                let mine: Vec<_> = status.zones.iter().filter(|z| z.owner == victim).collect();
                !mine.is_empty()
                    && mine.iter().all(|z| {
                        matches!(
                            z.state,
                            myriad_proto::recovery::RecoveryState::Done
                                | myriad_proto::recovery::RecoveryState::Lost
                        )
                    })
            })
        },
    );
    let status = admin.blocking().recovery_status().unwrap();
    for zone in status.zones.iter().filter(|z| z.owner == victim) {
        assert_eq!(
            zone.state,
            myriad_proto::recovery::RecoveryState::Done,
            "zone {}: {zone:?}",
            zone.zone
        );
        assert_eq!(zone.chunks, 0);
        assert!(zone.detail.contains("no backup ever received"), "{zone:?}");
    }
    assert!(
        admin.blocking().zones(victim).unwrap().is_empty(),
        "the zones left the table"
    );
}

/// When the backups of a zone hold different prefixes of its history (`async` changes
/// reached one backup and not the other), the leader asks their zone positions and has
/// the one with the most restore the zone, whatever its place in the backup order: every
/// `async` change that reached a backup survives its owner's crash.
#[test]
fn the_backup_with_the_most_of_a_zone_restores_it() {
    let mut cluster = start();
    let victim_index = 2;
    let victim = cluster.peer(victim_index).node_id();
    let client = client_asking(&cluster, DURABILITY_ASYNC);
    let blocking = client.blocking();
    let chunks = blocking.chunks();
    let cids = chunks
        .create_with_data(victim, (0..5).map(|i| payload(i, 64)).collect())
        .unwrap();
    cluster
        .peer(victim_index)
        .replicator()
        .unwrap()
        .wait_all(Durability::Durable)
        .unwrap();
    let admin = cluster.client();
    let zone_of_chunks = cluster
        .peer(victim_index)
        .replicator()
        .unwrap()
        .zone_of(cids[0])
        .expect("a zone");
    let zones = admin.blocking().zones(victim).unwrap();
    let (zone, backups) = zones
        .iter()
        .find(|(zone, _)| *zone == zone_of_chunks)
        .cloned()
        .expect("the zone in the table");
    assert_eq!(backups.len(), 2, "{backups:?}");
    let (first, second) = (backups[0], backups[1]);
    let position = |node: NodeId| {
        cluster
            .live_peers()
            .find(|peer| peer.node_id() == node)
            .and_then(|peer| peer.backup_service().unwrap().position(victim, zone))
    };
    assert_eq!(position(first), Some(5));
    assert_eq!(position(second), Some(5));
    // The first backup in the order stops hearing from the owner; the second gets the
    // new values.
    cluster
        .live_peers()
        .find(|peer| peer.node_id() == first)
        .unwrap()
        .membership()
        .net()
        .set_fault(victim, myriad_net::Fault::DropIncoming);
    let news: Vec<(ChunkId, Bytes)> = cids
        .iter()
        .map(|&cid| (cid, payload(cid.raw() + 100, 64)))
        .collect();
    for result in chunks.put_batch(&news) {
        result.unwrap();
    }
    cluster.wait_until(
        Duration::from_secs(5),
        "the second backup applied the new values",
        || position(second) == Some(10),
    );
    assert_eq!(position(first), Some(5));
    cluster.kill_peer(victim_index);
    cluster.wait_until(Duration::from_secs(30), "the zone is recovered", || {
        admin.blocking().recovery_status().is_ok_and(|status| {
            status.zones.iter().any(|z| {
                z.owner == victim
                    && z.zone == zone
                    && z.state == myriad_proto::recovery::RecoveryState::Done
            })
        })
    });
    let status = admin.blocking().recovery_status().unwrap();
    let line = status
        .zones
        .iter()
        .find(|z| z.owner == victim && z.zone == zone)
        .unwrap();
    assert_eq!(line.restorer, Some(second), "{line:?}");
    let reader = cluster.client();
    let read = reader.blocking().chunks().get_batch(&cids);
    for ((cid, want), got) in news.iter().zip(read) {
        assert_eq!(got.expect("readable"), *want, "{cid}");
    }
}
