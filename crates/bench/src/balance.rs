//! `myriad bench balance`: a skewed workload before and after the load balancer.
//!
//! # What it measures
//! A local cluster of `peers` peers (no backups) holds `chunks` chunks, all created on the
//! first peer; `threads` client threads (one client each) read random batches of `batch`
//! of them, uniformly over all chunks, so the first peer serves every request and the
//! others idle. With `--hot-chunks N`, a share `--hot-share` of the reads goes to a hot
//! sub-range instead: the `N` chunks from the first one whose local ID starts a block of
//! 256 at a third of the chunks (the summary names it, `hot_first`/`hot_last`), so the
//! balancer has a hot range to find within the busy peer. The benchmark measures the reads per second for `seconds` (**before**),
//! runs balancing rounds ([`myriad_client::client::Client::balance_round`], each watching
//! the request rates for `window_ms`) while the load goes on until a round moves nothing
//! or `rounds` ran, then measures again (**after**). Each phase prints every peer's
//! request rate, each round the CID ranges it moved (`moved_ranges`, and whether they were
//! picked as hot ranges, `by_hot_ranges`); the summary (the last line with `--json`) has
//! `before_reads_per_sec`,
//! `after_reads_per_sec`, `speedup`, `moved_chunks`, `rounds`, `balance_ms`, and the
//! busiest peer's share of the requests before and after (`before_max_share`,
//! `after_max_share`). Nothing is asserted: on one machine, the peers share its cores with
//! the clients, so the gain shows how far one peer process was the bottleneck.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::client::{BalanceOptions, Client, PeerLoad};
use myriad_launcher::LocalCluster;
use myriad_types::{ChunkId, NodeId};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::report::emit;

/// Options of `myriad bench balance`.
#[derive(clap::Args, Debug, Clone)]
pub struct BalanceArgs {
    /// Peers of the local cluster.
    #[arg(long, default_value_t = 3)]
    pub peers: usize,
    /// Chunks, all created on the first peer.
    #[arg(long, default_value_t = 30_000)]
    pub chunks: usize,
    /// Bytes per chunk.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Client threads reading.
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// Chunks per read request (1: single gets; a batch over chunks of several owners is
    /// split into one request per owner, so batches make the request rates misleading).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Seconds of each measurement.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Most balancing rounds.
    #[arg(long, default_value_t = 6)]
    pub rounds: u32,
    /// Milliseconds each round watches the request rates.
    #[arg(long, default_value_t = 1_000)]
    pub window_ms: u64,
    /// Requests per second below which the balancer moves nothing.
    #[arg(long, default_value_t = 100.0)]
    pub min_rate: f64,
    /// Chunks of a hot sub-range (0: uniform reads only).
    #[arg(long, default_value_t = 0)]
    pub hot_chunks: usize,
    /// Share of the reads that go to the hot sub-range.
    #[arg(long, default_value_t = 0.6)]
    pub hot_share: f64,
    /// Memory of each peer in MiB.
    #[arg(long, default_value_t = 256)]
    pub peer_memory_mb: u64,
    /// Directory for the cluster (default: a temporary one).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// Runs the benchmark (see the module documentation).
pub fn run(args: &BalanceArgs) -> Result<(), String> {
    let temporary = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| temporary.path().to_path_buf());
    let (cluster, peers) = start_cluster(args, &dir)?;
    let secret = cluster.secret().map_err(|e| e.to_string())?;
    let client =
        Client::connect(cluster.superpeers(), secret.clone()).map_err(|e| e.to_string())?;
    let result = measure(args, &cluster, &client, &peers, &secret);
    client.shutdown();
    drop(cluster);
    result
}

fn start_cluster(
    args: &BalanceArgs,
    dir: &std::path::Path,
) -> Result<(LocalCluster, Vec<NodeId>), String> {
    let config = "[backup]\nreplication = 0\n";
    crate::cluster::start_local(
        dir,
        "balance-bench.toml",
        config,
        args.peers.max(2),
        args.peer_memory_mb,
    )
}

/// The load: `threads` readers counting the chunks they read into `reads`.
struct Load {
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(
        args: &BalanceArgs,
        cluster: &LocalCluster,
        cids: &Arc<Vec<ChunkId>>,
        hot: std::ops::Range<usize>,
        secret: &[u8],
    ) -> Result<Load, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for thread in 0..args.threads.max(1) {
            let client = Client::connect(cluster.superpeers(), secret.to_vec())
                .map_err(|e| e.to_string())?;
            let (stop, reads, errors, cids) = (
                Arc::clone(&stop),
                Arc::clone(&reads),
                Arc::clone(&errors),
                Arc::clone(cids),
            );
            let batch = args.batch.max(1);
            let (hot, hot_share) = (hot.clone(), args.hot_share.clamp(0.0, 1.0));
            threads.push(std::thread::spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(thread as u64);
                let mut picked = Vec::with_capacity(batch);
                while !stop.load(Ordering::Relaxed) {
                    picked.clear();
                    picked.extend((0..batch).map(|_| {
                        if !hot.is_empty() && rng.gen_bool(hot_share) {
                            cids[rng.gen_range(hot.clone())]
                        } else {
                            cids[rng.gen_range(0..cids.len())]
                        }
                    }));
                    let results = client.blocking().chunks().get_batch(&picked);
                    let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
                    reads.fetch_add(ok, Ordering::Relaxed);
                    errors.fetch_add(results.len() as u64 - ok, Ordering::Relaxed);
                }
                client.shutdown();
            }));
        }
        Ok(Load {
            stop,
            reads,
            errors,
            threads,
        })
    }

    /// Reads per second over `seconds`.
    fn rate(&self, seconds: u64) -> f64 {
        let (was, started) = (self.reads.load(Ordering::Relaxed), Instant::now());
        std::thread::sleep(Duration::from_secs(seconds.max(1)));
        (self.reads.load(Ordering::Relaxed) - was) as f64 / started.elapsed().as_secs_f64()
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
        self.errors.load(Ordering::Relaxed)
    }
}

/// The busiest peer's share of all requests, and the loads as text.
fn describe(loads: &[PeerLoad]) -> (f64, String) {
    let total: f64 = loads.iter().map(|l| l.requests_per_sec).sum();
    let max = loads.iter().map(|l| l.requests_per_sec).fold(0.0, f64::max);
    let text = loads
        .iter()
        .map(|l| {
            format!(
                "{} {:.0} req/s {} chunks",
                l.node, l.requests_per_sec, l.chunks
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    (max / total.max(1e-9), text)
}

fn measure(
    args: &BalanceArgs,
    cluster: &LocalCluster,
    client: &Client,
    peers: &[NodeId],
    secret: &[u8],
) -> Result<(), String> {
    let payload = Bytes::from(vec![0x5a; args.size.max(1)]);
    let mut cids = Vec::with_capacity(args.chunks);
    while cids.len() < args.chunks {
        let count = (args.chunks - cids.len()).min(10_000);
        cids.extend(
            client
                .blocking()
                .chunks()
                .create_with_data(peers[0], vec![payload.clone(); count])
                .map_err(|e| format!("creating chunks: {e}"))?,
        );
    }
    let hot = hot_range(&cids, args.hot_chunks);
    let cids = Arc::new(cids);
    let load = Load::start(args, cluster, &cids, hot.clone(), secret)?;
    // Two monitoring intervals, so the busy peer's report names its hot ranges.
    std::thread::sleep(Duration::from_secs(if hot.is_empty() { 1 } else { 4 }));
    let window = Duration::from_millis(args.window_ms);
    let result = phases(args, client, &load, window);
    let errors = load.stop();
    let mut summary = result?;
    summary["read_errors"] = json!(errors);
    if !hot.is_empty() {
        summary["hot_first"] = json!(cids[hot.start].to_string());
        summary["hot_last"] = json!(cids[hot.end - 1].to_string());
    }
    emit(
        args.json,
        summary.clone(),
        format!(
            "summary: {:.0} → {:.0} reads/s ({:.2}×), {} chunks moved in {} rounds ({} ms); busiest peer's share {:.2} → {:.2}; {} read errors",
            summary["before_reads_per_sec"].as_f64().unwrap_or(0.0),
            summary["after_reads_per_sec"].as_f64().unwrap_or(0.0),
            summary["speedup"].as_f64().unwrap_or(0.0),
            summary["moved_chunks"],
            summary["rounds"],
            summary["balance_ms"],
            summary["before_max_share"].as_f64().unwrap_or(0.0),
            summary["after_max_share"].as_f64().unwrap_or(0.0),
            errors,
        ),
    );
    Ok(())
}

/// Indices into `cids` of the hot sub-range: `chunks` chunks from the first one at or
/// after a third of them whose local ID starts a block of 256, if they are consecutive
/// CIDs of one creator (else, and for 0 chunks, empty).
fn hot_range(cids: &[ChunkId], chunks: usize) -> std::ops::Range<usize> {
    if chunks == 0 {
        return 0..0;
    }
    let Some(start) =
        (cids.len() / 3..cids.len()).find(|&i| cids[i].local_id().is_multiple_of(256))
    else {
        return 0..0;
    };
    let end = start + chunks;
    let consecutive = end <= cids.len()
        && cids[start..end]
            .windows(2)
            .all(|pair| pair[1].raw() == pair[0].raw() + 1);
    if consecutive {
        start..end
    } else {
        0..0
    }
}

/// Before, balancing, after; the summary object.
fn phases(
    args: &BalanceArgs,
    client: &Client,
    load: &Load,
    window: Duration,
) -> Result<serde_json::Value, String> {
    let before = load.rate(args.seconds);
    let (before_share, before_text) = describe(
        &client
            .blocking()
            .peer_loads(window)
            .map_err(|e| e.to_string())?,
    );
    emit(
        args.json,
        json!({"bench": "balance", "case": "before", "reads_per_sec": before, "max_share": before_share, "loads": before_text}),
        format!("before:  {before:>10.0} reads/s; {before_text}"),
    );
    let options = BalanceOptions {
        window,
        min_rate: args.min_rate,
        ..BalanceOptions::default()
    };
    let started = Instant::now();
    let (mut moved, mut rounds) = (0u64, 0u32);
    for round in 1..=args.rounds.max(1) {
        let outcome = client
            .blocking()
            .balance_round(&options)
            .map_err(|e| format!("balancing round {round}: {e}"))?;
        rounds = round;
        moved += outcome.moved;
        emit(
            args.json,
            json!({"bench": "balance", "case": "round", "round": round, "moved": outcome.moved,
                "moved_ranges": outcome.moved_ranges.iter().map(|(a, b)| [a.to_string(), b.to_string()]).collect::<Vec<_>>(),
                "by_hot_ranges": outcome.by_hot_ranges, "decision": outcome.decision}),
            format!("round {round}: {}", outcome.decision),
        );
        if outcome.moved == 0 {
            break;
        }
    }
    let balance_ms = started.elapsed().as_millis() as u64;
    std::thread::sleep(Duration::from_secs(1));
    let after = load.rate(args.seconds);
    let (after_share, after_text) = describe(
        &client
            .blocking()
            .peer_loads(window)
            .map_err(|e| e.to_string())?,
    );
    emit(
        args.json,
        json!({"bench": "balance", "case": "after", "reads_per_sec": after, "max_share": after_share, "loads": after_text}),
        format!("after:   {after:>10.0} reads/s; {after_text}"),
    );
    Ok(json!({
        "bench": "balance", "case": "summary", "peers": args.peers, "chunks": args.chunks,
        "threads": args.threads, "batch": args.batch, "hot_chunks": args.hot_chunks,
        "before_reads_per_sec": before, "after_reads_per_sec": after,
        "speedup": after / before.max(1e-9), "moved_chunks": moved, "rounds": rounds,
        "balance_ms": balance_ms, "before_max_share": before_share, "after_max_share": after_share,
    }))
}
