//! The nodes' Prometheus endpoints on a real local cluster (1 superpeer, 2 peers, each a
//! `myriad` process): `cluster.json` and `myriad cluster status` name every node's metrics
//! address, every node answers `GET /metrics` in the Prometheus text format (parsed with
//! the `prometheus-parse` crate), every family this issue asks for is there, and the
//! figures move after a workload of creates, gets and puts through a client.
//!
//! The cluster is SIGKILLed by the process harness when the test ends (also on a panic).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use myriad_client::client::{Client, ClientConfig};
use myriad_launcher::{NodeEntry, NodeRole};
use myriad_testing::process::{http_get, poll_until, Cluster, Myriad};
use prometheus_parse::{Scrape, Value};

/// Longest wait for one HTTP exchange.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Small zones and logs; one backup per zone (the other peer).
const CONFIG: &str = "\
[backup]
replication = 1
zone_mb = 1
segment_kb = 64
write_buffer_kb = 1024
primary_log_kb = 4096
";

/// Chunks the workload creates (and reads and writes once each).
const CHUNKS: usize = 400;

/// One node's scrape: the samples by metric name.
struct Metrics {
    node: String,
    samples: Vec<prometheus_parse::Sample>,
    types: BTreeMap<String, String>,
    /// The text as scraped (for failure messages).
    body: String,
}

impl Metrics {
    fn scrape(node: &NodeEntry) -> Metrics {
        let address = node
            .metrics
            .as_deref()
            .unwrap_or_else(|| panic!("{} has no metrics address", node.name));
        let (status, body) = http_get(address, "/metrics", HTTP_TIMEOUT)
            .unwrap_or_else(|error| panic!("scrape of {}: {error}", node.name));
        assert_eq!(status, 200, "{}: {body}", node.name);
        let types = body
            .lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| rest.split_once(' '))
            .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
            .collect();
        let scrape = Scrape::parse(body.lines().map(|line| Ok(line.to_owned())))
            .unwrap_or_else(|error| panic!("{}: not Prometheus text: {error}", node.name));
        assert!(
            !scrape.samples.is_empty(),
            "{}: no samples in {body}",
            node.name
        );
        Metrics {
            node: node.name.clone(),
            samples: scrape.samples,
            types,
            body,
        }
    }

    /// Checks that `family` is declared with `kind` and has at least one sample.
    fn has(&self, family: &str, kind: &str) {
        assert_eq!(
            self.types.get(family).map(String::as_str),
            Some(kind),
            "{}: family {family} of type {kind} missing; types: {:?}",
            self.node,
            self.types
        );
        let base = family.to_owned();
        assert!(
            self.samples.iter().any(|s| s.metric == base),
            "{}: no sample of {family}",
            self.node
        );
    }

    /// The value of the sample `metric` whose labels include `labels` (sums several).
    fn value(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        let matching: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.metric == metric)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
                Value::Histogram(buckets) => buckets.iter().map(|b| b.count).fold(0.0, f64::max),
                Value::Summary(_) => f64::NAN,
            })
            .collect();
        assert!(
            !matching.is_empty(),
            "{}: no sample {metric}{labels:?}",
            self.node
        );
        matching.iter().sum()
    }
}

const PEER_FAMILIES: &[(&str, &str)] = &[
    ("myriad_chunk_requests_total", "counter"),
    ("myriad_chunk_request_duration_seconds", "histogram"),
    ("myriad_net_messages_sent_total", "counter"),
    ("myriad_net_messages_received_total", "counter"),
    ("myriad_net_bytes_sent_total", "counter"),
    ("myriad_net_bytes_received_total", "counter"),
    ("myriad_mem_chunks", "gauge"),
    ("myriad_mem_payload_bytes", "gauge"),
    ("myriad_mem_free_bytes", "gauge"),
    ("myriad_mem_fragmentation_ratio", "gauge"),
    ("myriad_replication_zones", "gauge"),
    ("myriad_rereplication_pending_chunks", "gauge"),
    ("myriad_log_zones", "gauge"),
    ("myriad_log_free_segments", "gauge"),
    ("myriad_log_appended_entries_total", "counter"),
    ("myriad_log_bytes_written_total", "counter"),
    ("myriad_log_flushes_total", "counter"),
    ("myriad_log_cleaning_passes_total", "counter"),
    ("myriad_log_write_amplification", "gauge"),
    ("myriad_log_write_buffer_bytes", "gauge"),
    ("myriad_log_write_buffer_fill_ratio", "gauge"),
    ("myriad_log_write_buffer_busy_halves", "gauge"),
    ("process_cpu_seconds_total", "counter"),
    ("process_resident_memory_bytes", "gauge"),
];

/// Families with a sample per backup stream or zone: on a peer that owns zones.
const OWNER_FAMILIES: &[(&str, &str)] = &[
    ("myriad_replication_lag_ops", "gauge"),
    ("myriad_replication_durable_lag_ops", "gauge"),
    ("myriad_replication_unacknowledged_bytes", "gauge"),
    ("myriad_replication_resends_total", "counter"),
    ("myriad_replication_zone_lag_ops", "gauge"),
];

const SUPERPEER_FAMILIES: &[(&str, &str)] = &[
    ("myriad_raft_term", "gauge"),
    ("myriad_raft_is_leader", "gauge"),
    ("myriad_raft_leader", "gauge"),
    ("myriad_raft_committed_index", "gauge"),
    ("myriad_raft_applied_index", "gauge"),
    ("myriad_cluster_nodes", "gauge"),
    ("myriad_cluster_zones", "gauge"),
    ("myriad_recovery_zones", "gauge"),
    ("myriad_recovery_chunks_restored_total", "counter"),
    ("myriad_net_bytes_received_total", "counter"),
    ("process_cpu_seconds_total", "counter"),
    ("process_resident_memory_bytes", "gauge"),
];

#[test]
fn every_node_serves_metrics_that_move_under_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::builder(env!("CARGO_BIN_EXE_myriad"), dir.path())
        .superpeers(1)
        .peers(2)
        .peer_memory_mb(64)
        .config(CONFIG)
        .keep_logs_on_panic()
        .start();

    // cluster.json records every node's metrics address; `cluster status` prints it.
    let nodes = cluster.nodes().to_vec();
    for node in &nodes {
        let address = node.metrics.as_deref().expect("metrics address recorded");
        assert!(address.starts_with("127.0.0.1:"), "{address}");
        assert_ne!(address, node.address, "metrics is a port of its own");
    }
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cluster.dir().join("cluster.json")).expect("cluster.json"),
    )
    .expect("cluster.json is JSON");
    for node in json["nodes"].as_array().expect("nodes") {
        assert!(node["metrics"].is_string(), "key `metrics` in {node}");
    }
    let status = Myriad::new(env!("CARGO_BIN_EXE_myriad"), ["cluster", "status", "--dir"])
        .arg(cluster.dir())
        .timeout(Duration::from_secs(20))
        .run();
    status.assert_success("cluster status");
    assert!(status.stdout.contains("METRICS"), "{}", status.stdout);
    for node in &nodes {
        let address = node.metrics.as_deref().expect("metrics");
        assert!(
            status.stdout.contains(address),
            "{address} in {}",
            status.stdout
        );
    }

    let peers: Vec<&NodeEntry> = nodes.iter().filter(|n| n.role == NodeRole::Peer).collect();
    let superpeer = nodes
        .iter()
        .find(|n| n.role == NodeRole::Superpeer)
        .expect("a superpeer");
    let before_peers: Vec<Metrics> = peers.iter().map(|p| Metrics::scrape(p)).collect();
    let before_superpeer = Metrics::scrape(superpeer);
    // A 404 for anything else.
    let (code, _) = http_get(
        peers[0].metrics.as_deref().expect("metrics"),
        "/nothing",
        HTTP_TIMEOUT,
    )
    .expect("GET /nothing");
    assert_eq!(code, 404);

    // The workload: creates on the first peer (replicated to the second), gets and puts.
    let client = Client::connect_with(
        ClientConfig::new(cluster.superpeers())
            .with_secret_file(&cluster.secret_file())
            .expect("the cluster's secret file"),
    )
    .expect("client");
    let api = client.blocking();
    let chunks = api.chunks();
    let owner = myriad_types::NodeId(peers[0].node_id);
    let mut cids = Vec::new();
    for batch in 0..CHUNKS / 100 {
        let payloads: Vec<Bytes> = (0..100)
            .map(|i| Bytes::from(format!("{:<48}", format!("chunk {batch}-{i}"))))
            .collect();
        cids.extend(chunks.create_with_data(owner, payloads).expect("create"));
    }
    for result in chunks.get_batch(&cids) {
        result.expect("get");
    }
    for &cid in &cids {
        chunks
            .put(cid, Bytes::from(format!("{:<48}", "updated")))
            .expect("put");
    }

    // Every family is there, on every node.
    let after_peers: Vec<Metrics> = peers.iter().map(|p| Metrics::scrape(p)).collect();
    for metrics in &after_peers {
        for (family, kind) in PEER_FAMILIES {
            metrics.has(family, kind);
        }
    }
    // The first peer served the workload: counts, latencies, memory and bytes moved.
    let (was, now) = (&before_peers[0], &after_peers[0]);
    for (family, kind) in OWNER_FAMILIES {
        now.has(family, kind);
    }
    assert!(
        now.value(
            "myriad_replication_lag_ops",
            &[("backup", &peers[1].node_id.to_string())]
        ) >= 0.0,
        "a stream to the other peer"
    );
    let ok = |m: &Metrics, op: &str| {
        m.value(
            "myriad_chunk_requests_total",
            &[("op", op), ("result", "ok")],
        )
    };
    assert!(ok(now, "create_with_data") >= ok(was, "create_with_data") + (CHUNKS / 100) as f64);
    assert!(
        ok(now, "put") >= ok(was, "put") + CHUNKS as f64,
        "one put request per chunk"
    );
    assert!(ok(now, "get") > ok(was, "get"));
    // One request in 8 per thread is timed: at least that many puts in the histogram.
    let latency_count = |m: &Metrics| {
        m.value(
            "myriad_chunk_request_duration_seconds_count",
            &[("op", "put")],
        )
    };
    let timed = latency_count(now) - latency_count(was);
    assert!(timed >= (CHUNKS / 8) as f64, "{timed} puts timed");
    assert!(timed < CHUNKS as f64, "{timed} puts timed: all of them?");
    assert_eq!(
        now.value("myriad_chunk_request_duration_seconds", &[("op", "put")]),
        latency_count(now),
        "the +Inf bucket counts every timed put: {}",
        now.body
            .lines()
            .filter(|line| line.contains("op=\"put\""))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        now.value(
            "myriad_chunk_request_duration_seconds_sum",
            &[("op", "put")]
        ) > 0.0
    );
    assert!(now.value("myriad_mem_chunks", &[]) >= CHUNKS as f64);
    assert!(
        now.value("myriad_mem_payload_bytes", &[]) > was.value("myriad_mem_payload_bytes", &[])
    );
    assert!(
        now.value("myriad_net_bytes_received_total", &[])
            > was.value("myriad_net_bytes_received_total", &[]) + (CHUNKS * 20) as f64
    );
    assert!(now.value("myriad_replication_zones", &[]) >= 1.0);
    assert!(now.value("process_cpu_seconds_total", &[]) > 0.0);
    assert!(now.value("process_resident_memory_bytes", &[]) > 1e6);
    // The write buffer's fill is a fraction of its active half.
    let fill = now.value("myriad_log_write_buffer_fill_ratio", &[]);
    assert!((0.0..=1.0).contains(&fill), "fill ratio {fill}");
    assert!(now.value("myriad_log_write_buffer_busy_halves", &[]) <= 3.0);
    // The second peer keeps the backups: its log engine took every create and put.
    let backup_appends = |m: &Metrics| m.value("myriad_log_appended_entries_total", &[]);
    let backup = peers[1].name.clone();
    assert!(
        poll_until(Duration::from_secs(10), || {
            backup_appends(&Metrics::scrape(peers[1]))
                >= backup_appends(&before_peers[1]) + (2 * CHUNKS) as f64
        }),
        "{backup}'s log engine did not take the creates and puts"
    );

    // The superpeer: Raft figures, the node table, and the commits of the zone
    // registrations moved the committed index.
    let after_superpeer = Metrics::scrape(superpeer);
    for (family, kind) in SUPERPEER_FAMILIES {
        after_superpeer.has(family, kind);
    }
    assert_eq!(after_superpeer.value("myriad_raft_is_leader", &[]), 1.0);
    assert!(after_superpeer.value("myriad_raft_term", &[]) >= 1.0);
    assert_eq!(
        after_superpeer.value(
            "myriad_cluster_nodes",
            &[("role", "peer"), ("state", "alive")]
        ),
        2.0
    );
    assert!(
        after_superpeer.value("myriad_raft_committed_index", &[])
            > before_superpeer.value("myriad_raft_committed_index", &[]),
        "the workload's zone registration commits"
    );
    assert!(after_superpeer.value("myriad_cluster_zones", &[]) >= 1.0);
}
