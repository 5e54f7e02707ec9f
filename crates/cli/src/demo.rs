//! `myriad demo`: a local cluster on this machine, loaded and exercised through the client.
//!
//! Starts one superpeer and three peers as child processes (data under a temporary
//! directory, or `--dir`), joins as a client, loads a million 64-byte chunks spread over the
//! peers with a progress bar, runs a short mixed workload (single and batched gets and puts),
//! shows the nameservice, a barrier and temporary storage, prints a summary per peer (with
//! the backup zones each peer's chunks are replicated in, and their backup peers) and
//! shuts everything down: the client leaves, the nodes get SIGTERM. Before the summary, a
//! failure drill (skipped with `--no-failure` or a single peer): one peer is SIGKILLed,
//! the superpeer detects it and has its zones restored by their backups, and every chunk
//! it held is read back through the client and checked.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use myriad_client::client::{BlockingClient, Client};
use myriad_launcher::{LaunchSpec, LocalCluster};
use myriad_types::{ChunkId, NodeId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Options of `myriad demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Keep the cluster's data, logs and pid files here (default: a temporary directory
    /// removed at the end).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Chunks to load.
    #[arg(long, default_value_t = 1_000_000)]
    pub chunks: usize,
    /// Payload bytes per chunk.
    #[arg(long, default_value_t = 64)]
    pub chunk_bytes: usize,
    /// Number of peers.
    #[arg(long, default_value_t = 3)]
    pub peers: usize,
    /// Seconds of the mixed workload.
    #[arg(long, default_value_t = 3)]
    pub workload_seconds: u64,
    /// Skip the failure drill (a peer SIGKILLed and its chunks recovered from their
    /// backups).
    #[arg(long)]
    pub no_failure: bool,
}

/// Chunks per create or get/put batch during the load and the batched workload.
const BATCH: usize = 1_000;

fn value(index: u64, bytes: usize) -> Bytes {
    let mut data = vec![0u8; bytes];
    let seed = index.to_le_bytes();
    for (position, byte) in data.iter_mut().enumerate() {
        *byte = seed[position % 8] ^ (position as u8);
    }
    Bytes::from(data)
}

/// Runs the demo.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if args.chunk_bytes < 8 {
        bail!("--chunk-bytes must be at least 8");
    }
    if args.peers == 0 {
        bail!("--peers must be at least 1");
    }
    let temporary;
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            temporary = tempfile::Builder::new().prefix("myriad-demo-").tempdir()?;
            temporary.path().to_path_buf()
        }
    };
    println!(
        "Myriad demo: a local cluster of 1 superpeer and {} peers",
        args.peers
    );
    println!("cluster directory: {}\n", dir.display());

    let started = Instant::now();
    let binary = std::env::current_exe().context("locating the myriad binary")?;
    let mut spec = LaunchSpec::new(&dir, binary);
    spec.superpeers = 1;
    spec.peers = args.peers;
    spec.peer_memory_mb = Some(2048);
    // Owned: every node is killed if the demo fails half-way.
    let mut cluster = LocalCluster::start_owned(spec)?;
    println!(
        "started {} nodes in {:.1} s:",
        cluster.nodes().len(),
        started.elapsed().as_secs_f64()
    );
    for node in cluster.nodes() {
        println!(
            "  {:<12} node {:#06x}  {}  pid {}",
            node.name, node.node_id, node.address, node.pid
        );
    }
    let result = exercise(&mut cluster, args);
    println!("\nshutting down");
    let stopped = cluster.stop();
    result?;
    stopped?;
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn exercise(cluster: &mut LocalCluster, args: &DemoArgs) -> anyhow::Result<()> {
    let superpeers = cluster
        .superpeer_addresses()
        .into_iter()
        .map(|(id, address)| Ok((NodeId(id), address.parse()?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let client = Client::connect(superpeers, cluster.secret()?)?;
    let api = client.blocking();
    println!("\njoined as client {}", client.node_id());
    let peers: Vec<NodeId> = cluster.peer_ids();
    let cids = load(&api, args, &peers)?;
    let mut rng = SmallRng::seed_from_u64(7);
    spot_check(&api, args, &cids, &mut rng)?;
    mixed_workload(&api, args, &cids, &mut rng)?;
    metadata_services(&api, &cids)?;
    // Failure drill: a peer dies, its zones are restored by their backups.
    let mut alive = peers.clone();
    if args.no_failure {
        println!("\nfailure drill skipped (--no-failure)");
    } else if peers.len() < 2 {
        println!("\nfailure drill skipped: a single peer has no backups");
    } else {
        let victim = peers[0];
        failure_drill(cluster, &api, &cids, victim, args.chunk_bytes)?;
        alive.retain(|&peer| peer != victim);
    }
    print_summary(&api, &alive)?;
    client.shutdown();
    Ok(())
}

/// Loads `--chunks` chunks, [`BATCH`] per create call, round-robin over `peers`, with a
/// progress bar.
fn load(
    api: &BlockingClient<'_>,
    args: &DemoArgs,
    peers: &[NodeId],
) -> anyhow::Result<Vec<ChunkId>> {
    let bar = ProgressBar::new(args.chunks as u64);
    bar.set_style(ProgressStyle::with_template(
        "loading {bar:40} {pos}/{len} chunks  {per_sec}  eta {eta}",
    )?);
    let started = Instant::now();
    let mut cids: Vec<ChunkId> = Vec::with_capacity(args.chunks);
    while cids.len() < args.chunks {
        let count = BATCH.min(args.chunks - cids.len());
        let peer = peers[(cids.len() / BATCH) % peers.len()];
        let payloads: Vec<Bytes> = (0..count)
            .map(|offset| value((cids.len() + offset) as u64, args.chunk_bytes))
            .collect();
        let created = api.chunks().create_with_data(peer, payloads)?;
        cids.extend(created);
        bar.set_position(cids.len() as u64);
    }
    bar.finish_and_clear();
    let load = started.elapsed();
    println!(
        "loaded {} chunks of {} bytes in {:.2} s: {:.0} chunks/s ({} per create batch)",
        cids.len(),
        args.chunk_bytes,
        load.as_secs_f64(),
        cids.len() as f64 / load.as_secs_f64(),
        BATCH
    );
    Ok(cids)
}

/// Reads 1,000 random chunks back and checks their bytes.
fn spot_check(
    api: &BlockingClient<'_>,
    args: &DemoArgs,
    cids: &[ChunkId],
    rng: &mut SmallRng,
) -> anyhow::Result<()> {
    for _ in 0..1_000 {
        let index = rng.gen_range(0..cids.len());
        let data = api.chunks().get(cids[index])?;
        if data != value(index as u64, args.chunk_bytes) {
            bail!("chunk {} holds the wrong bytes", cids[index]);
        }
    }
    println!("checked 1,000 random chunks: every byte as written");
    Ok(())
}

/// Mixed workload: 95% gets, 5% puts; first single calls, then batches.
fn mixed_workload(
    api: &BlockingClient<'_>,
    args: &DemoArgs,
    cids: &[ChunkId],
    rng: &mut SmallRng,
) -> anyhow::Result<()> {
    let seconds = Duration::from_secs(args.workload_seconds.max(1));
    for batch in [1usize, 100] {
        let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
        let mut ops = 0u64;
        let mut puts = 0u64;
        let started = Instant::now();
        while started.elapsed() < seconds {
            let indexes: Vec<usize> = (0..batch).map(|_| rng.gen_range(0..cids.len())).collect();
            let call = Instant::now();
            if rng.gen_range(0..100) < 5 {
                let items: Vec<(ChunkId, Bytes)> = indexes
                    .iter()
                    .map(|&index| (cids[index], value(index as u64, args.chunk_bytes)))
                    .collect();
                if batch == 1 {
                    api.chunks().put(items[0].0, items[0].1.clone())?;
                } else {
                    for result in api.chunks().put_batch(&items) {
                        result?;
                    }
                }
                puts += batch as u64;
            } else if batch == 1 {
                api.chunks().get(cids[indexes[0]])?;
            } else {
                let wanted: Vec<ChunkId> = indexes.iter().map(|&index| cids[index]).collect();
                for result in api.chunks().get_batch(&wanted) {
                    result?;
                }
            }
            latency.saturating_record(call.elapsed().as_nanos() as u64);
            ops += batch as u64;
        }
        let elapsed = started.elapsed().as_secs_f64();
        println!(
            "mixed 95/5 get/put, batch {batch:>3}, 1 thread: {:>9.0} ops/s  ({} puts)  call latency p50 {:.1} us, p99 {:.1} us",
            ops as f64 / elapsed,
            puts,
            latency.value_at_quantile(0.5) as f64 / 1e3,
            latency.value_at_quantile(0.99) as f64 / 1e3,
        );
    }
    Ok(())
}

/// The metadata services: the nameservice, temporary storage and a barrier.
fn metadata_services(api: &BlockingClient<'_>, cids: &[ChunkId]) -> anyhow::Result<()> {
    api.name_register("demo.first", cids[0])?;
    let found = api.name_get("demo.first")?;
    println!("\nnameservice: demo.first -> {}", display_cid(found));
    api.tmp_put("demo.note", Bytes::from_static(b"kept by the superpeers"))?;
    let note = api.tmp_get("demo.note")?.unwrap_or_default();
    println!(
        "temporary storage: demo.note = {:?}",
        String::from_utf8_lossy(&note)
    );
    let barrier = api.barrier_alloc(1)?;
    let values = api.barrier_sign_on(barrier, 42, Duration::from_secs(5))?;
    let values: Vec<String> = values
        .iter()
        .map(|(node, value)| format!("{node}={value}"))
        .collect();
    println!(
        "barrier {barrier}: released with values [{}]",
        values.join(", ")
    );
    api.barrier_free(barrier)?;
    Ok(())
}

/// Summary per peer, with the backup zones its chunks are replicated in.
fn print_summary(api: &BlockingClient<'_>, alive: &[NodeId]) -> anyhow::Result<()> {
    println!(
        "\n{:<8} {:>10} {:>12} {:>10}  backup zones (zone: backups)",
        "peer", "chunks", "payload MB", "free MB"
    );
    for &peer in alive {
        let stats = api.chunks().stats(peer)?;
        let zones: Vec<String> = api
            .zones(peer)?
            .iter()
            .map(|(zone, backups)| {
                let backups: Vec<String> = backups.iter().map(ToString::to_string).collect();
                format!("{zone}: {}", backups.join(" "))
            })
            .collect();
        println!(
            "{:<8} {:>10} {:>12.1} {:>10.1}  {}",
            peer.to_string(),
            stats.chunks,
            stats.payload_bytes as f64 / 1e6,
            stats.free_bytes as f64 / 1e6,
            if zones.is_empty() {
                "none".to_owned()
            } else {
                zones.join(", ")
            }
        );
    }
    Ok(())
}

/// Most time the drill waits for the killed peer's chunks (detection, recovery, and the
/// client's own bounded waits, retried).
const DRILL_WAIT: Duration = Duration::from_secs(60);

/// SIGKILLs `victim`, then reads every chunk it created back (batched gets that wait,
/// bounded, while its zones are restored elsewhere) and checks each value; prints how
/// long the first and the last were unavailable and the leader's recovery table.
fn failure_drill(
    cluster: &mut LocalCluster,
    api: &BlockingClient<'_>,
    cids: &[ChunkId],
    victim: NodeId,
    chunk_bytes: usize,
) -> anyhow::Result<()> {
    let theirs: Vec<(usize, ChunkId)> = cids
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, cid)| cid.creator() == victim)
        .collect();
    println!(
        "\nfailure drill: SIGKILL to peer {victim}, which holds {} chunks",
        theirs.len()
    );
    cluster.kill(victim.0)?;
    let killed = Instant::now();
    let mut first_read: Option<Duration> = None;
    for part in theirs.chunks(BATCH) {
        let wanted: Vec<ChunkId> = part.iter().map(|&(_, cid)| cid).collect();
        let mut results = api.chunks().get_batch(&wanted);
        // The client waits a bounded time per call; a slow machine may need a few.
        while results.iter().any(Result::is_err) && killed.elapsed() < DRILL_WAIT {
            std::thread::sleep(Duration::from_millis(50));
            results = api.chunks().get_batch(&wanted);
        }
        for (&(index, cid), result) in part.iter().zip(results) {
            let data = result
                .with_context(|| format!("chunk {cid} of the killed peer after {DRILL_WAIT:?}"))?;
            if data != value(index as u64, chunk_bytes) {
                bail!("chunk {cid} holds the wrong bytes after the recovery");
            }
        }
        first_read.get_or_insert(killed.elapsed());
    }
    let all_read = killed.elapsed();
    println!(
        "  first chunks readable again {:.0} ms after the kill; all {} read back and \
         checked after {:.0} ms: every byte as written",
        first_read.unwrap_or(all_read).as_secs_f64() * 1e3,
        theirs.len(),
        all_read.as_secs_f64() * 1e3
    );
    let status = api.recovery_status()?;
    for zone in status.zones.iter().filter(|zone| zone.owner == victim) {
        println!(
            "  zone {} of {}: {:?} by {} ({} chunks, {} ms after the failure was committed)",
            zone.zone,
            zone.owner,
            zone.state,
            zone.restorer
                .map_or_else(|| "nobody".to_owned(), |node| node.to_string()),
            zone.chunks,
            zone.ms
        );
    }
    Ok(())
}

fn display_cid(cid: Option<ChunkId>) -> String {
    match cid {
        Some(cid) => cid.to_string(),
        None => "(not found)".to_owned(),
    }
}
