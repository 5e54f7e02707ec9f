//! Builds and runs the example binary as a whole cluster (1 superpeer, 3 peers, all of them
//! `chunk-scan` processes): its task runs on a compute group through its own terminal, its
//! job is delegated to the owners of the chunks, its application (started at boot by the
//! configuration and later from the terminal) reports through the temporary storage.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use chunk_scan::{record, CountWords};
use myriad_client::client::Client;
use myriad_compute::client::group_status;
use myriad_compute::Jobs;
use myriad_launcher::NodeRole;
use myriad_testing::process::{wait_until, Cluster, Myriad};
use myriad_types::NodeId;
use serde_json::Value;

const BINARY: &str = env!("CARGO_BIN_EXE_chunk-scan");
const WAIT: Duration = Duration::from_secs(15);

fn term(dir: &Path, line: &str) -> Value {
    let output = Myriad::new(BINARY, ["term", "--cluster"])
        .arg(dir)
        .arg("--json")
        .arg("-c")
        .arg(line)
        .timeout(Duration::from_secs(40))
        .run();
    assert_eq!(output.code(), Some(0), "term {line:?}: {output:#?}");
    serde_json::from_str(output.stdout.lines().next().unwrap_or("null")).expect("JSON")
}

#[test]
fn the_example_binary_runs_its_job_task_and_application() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::builder(BINARY, dir.path())
        .superpeers(1)
        .peers(3)
        .peer_memory_mb(64)
        .config(
            "[backup]\nreplication = 0\n[compute]\ngroup = 5\nrole = \"slave\"\n\
             apps = [\"example.report\"]\n",
        )
        .keep_logs_on_panic()
        .start();
    let cluster_dir = cluster.dir().to_path_buf();
    let mut peers: Vec<NodeId> = cluster
        .nodes()
        .iter()
        .filter(|node| node.role == NodeRole::Peer)
        .map(|node| NodeId(node.node_id))
        .collect();
    peers.sort_unstable();
    let secret = cluster.secret().expect("the cluster's secret file");
    let client = Client::connect(cluster.superpeers(), secret).expect("client joins");
    // The application configured in `compute.apps` ran once on every peer at boot, when
    // it held no chunks.
    for peer in &peers {
        let name = format!("report.{}", peer.0);
        wait_until(WAIT, "the boot report", || {
            client.blocking().tmp_get(&name).ok().flatten() == Some(Bytes::from_static(b"0"))
        });
    }
    let blocking = client.blocking();
    let chunks = blocking.chunks();

    // Records of kinds 1 and 2 on every peer, and one text chunk each.
    let mut expected_kind_2 = Vec::new();
    let mut texts = Vec::new();
    for (index, peer) in peers.iter().enumerate() {
        let records: Vec<Bytes> = (0..100u64)
            .map(|i| record(1 + i % 2, i * (index as u64 + 1)))
            .collect();
        chunks.create_with_data(*peer, records).expect("records");
        expected_kind_2.push(
            (0..100u64)
                .filter(|i| i % 2 == 1)
                .map(|i| i * (index as u64 + 1))
                .sum::<u64>(),
        );
        let words = "one two three four ".repeat(index + 1);
        texts.push((
            *peer,
            chunks
                .create_with_data(*peer, vec![Bytes::from(words)])
                .expect("text")[0],
        ));
    }

    // The task on a group of two slaves (the first peer is the master).
    term(&cluster_dir, &format!("compgrpjoin {} 5 master", peers[0]));
    wait_until(WAIT, "two slaves", || {
        group_status(&client, 5).is_ok_and(|s| s.slaves.len() == 2)
    });
    let outcome = term(
        &cluster_dir,
        "comptask 5 example.sum-of-kind '{\"kind\":2}' --slaves-min 2",
    );
    assert_eq!(outcome["state"], "finished", "{outcome:#}");
    let values: Vec<i64> = outcome["tasks"][0]["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|v| v.as_i64().expect("integer"))
        .collect();
    // Slaves are peers 1 and 2 (by node ID), each summing only its own records.
    let want: Vec<i64> = expected_kind_2[1..].iter().map(|sum| *sum as i64).collect();
    assert_eq!(values, want);

    // The job, delegated to each text chunk's owner.
    let jobs = Jobs::new(client.clone());
    for (index, (owner, cid)) in texts.iter().enumerate() {
        let (ran_on, words) = jobs
            .submit_to_owner(*cid, CountWords(*cid))
            .wait(WAIT)
            .expect("job");
        assert_eq!((ran_on, words), (*owner, 4 * (index as u64 + 1)));
    }

    // The application, started from the terminal, reports 101 chunks on peer 2.
    term(
        &cluster_dir,
        &format!("compapp {} example.report", peers[2]),
    );
    let name = format!("report.{}", peers[2].0);
    wait_until(WAIT, "the report", || {
        client.blocking().tmp_get(&name).ok().flatten() == Some(Bytes::from_static(b"101"))
    });
    client.shutdown();
}
