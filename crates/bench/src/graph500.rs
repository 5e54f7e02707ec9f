//! `myriad bench graph500`: Graph500's BFS benchmark on a compute group.
//!
//! # What it measures
//! A local cluster of `peers + 1` peers starts (one peer is the compute group's master,
//! `peers` are its slaves and hold the graph), or `--cluster DIR` uses a running one with a
//! group that already has its master and slaves. Then, as compute tasks (see
//! `myriad_graph::task`):
//! 1. `graph.load`: each slave generates its share of the Kronecker edge list (scale,
//!    edge factor, seed), the edges go to their owners and become vertex chunks; the load
//!    time is the task's wall time seen here, the rate input edges per second, the memory
//!    per input edge the chunk store's bytes (and the BFS's rows) over the edge count;
//! 2. `graph.roots`: `roots` random roots of nonzero degree;
//! 3. `graph.bfs` in batches of 8 roots (a progress line per batch): one BFS per root,
//!    its time the slowest slave's time between the barriers around it, always
//!    validated; TEPS = input edges in the root's component / time.
//!
//! Printed: harmonic-mean MTEPS (Graph500's summary), min/median/max, load time and
//! rate, bytes per edge; the ratio to the reference figures (MPI v3 41.2 MTEPS at
//! scale 20; OpenMP CSR 709 MTEPS at scale 18, the shared-memory bound). The last line
//! with `--json` is the summary: `scale`, `edgefactor`, `peers`, `roots`, `validated`
//! (every root passed on every slave), `mteps_hmean`, `mteps_min`, `mteps_median`,
//! `mteps_max`, `load_secs`, `bytes_per_edge`, `csr_bytes_per_edge`, `threads`.
//!
//! With `--local`, the same kernel then runs in this process on the whole graph (one
//! part, every core, the same roots, validated): the shared-memory bound of this code, and
//! the distributed/local ratio. That run holds the whole edge list in one process.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::{ProgressBar, ProgressStyle};
use myriad_client::client::Client;
use myriad_compute::client::{find_master, group_status, set_role, submit};
use myriad_compute::wire::{ScriptEnd, SubmitReply};
use myriad_compute::{Role, TaskScript};
use myriad_graph::gen::Kronecker;
use myriad_graph::task::{LoadReport, RootReport};
use myriad_graph::validate::validate;
use myriad_launcher::LocalCluster;
use myriad_types::NodeId;
use serde_json::json;

use crate::report::emit;

/// The reference: Graph500 v3 MPI BFS, scale 20, one rank, on this machine kind.
pub const REFERENCE_MPI_MTEPS: f64 = 41.2;
/// The reference: Graph500 v2 OpenMP CSR BFS, scale 18, two threads.
pub const REFERENCE_OPENMP_MTEPS: f64 = 709.0;

/// Roots per `graph.bfs` task (one progress line each).
const ROOTS_PER_TASK: usize = 8;

/// Options of `myriad bench graph500`.
#[derive(clap::Args, Debug, Clone)]
pub struct Graph500Args {
    /// log2 of the vertex count.
    #[arg(long, default_value_t = 16)]
    pub scale: u32,
    /// Edges per vertex.
    #[arg(long, default_value_t = 16)]
    pub edgefactor: u32,
    /// BFS roots (random, nonzero degree).
    #[arg(long, default_value_t = 64)]
    pub roots: usize,
    /// Slaves holding the graph (the local cluster has one more peer: the master).
    #[arg(long, default_value_t = 2)]
    pub peers: usize,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// BFS worker threads per slave (default: cores over slaves).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Top-down only (no direction optimization), for comparison.
    #[arg(long)]
    pub top_down: bool,
    /// Also run the same kernel in this process on one part with every core, from the same
    /// roots and validated (the shared-memory bound of this BFS; holds the whole graph).
    #[arg(long)]
    pub local: bool,
    /// Memory of each peer in MiB (default: enough for the graph's chunks).
    #[arg(long)]
    pub peer_memory_mb: Option<u64>,
    /// Use the running cluster in this directory (its group `--group` must have a master
    /// and `--peers` slaves) instead of starting one.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// The compute group.
    #[arg(long, default_value_t = 1)]
    pub group: u16,
    /// Directory of the started cluster (default: a fresh one under the temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// Starts `peers + 1` peers with the compute group (the lowest node ID is the master).
fn start_cluster(args: &Graph500Args, dir: &std::path::Path) -> Result<LocalCluster, String> {
    let config = format!(
        "[backup]\nreplication = 0\n[compute]\ngroup = {}\nrole = \"slave\"\n",
        args.group
    );
    // Chunks: 4 bytes per directed edge, a header and the degree per vertex, slack.
    let vertices = 1u64 << args.scale.min(40);
    let bytes = (vertices * u64::from(args.edgefactor) * 8 + vertices * 32) * 3 / 2;
    let estimate = bytes / args.peers.max(1) as u64 / (1 << 20) + 128;
    let memory = args.peer_memory_mb.unwrap_or(estimate);
    let (cluster, _) =
        crate::cluster::start_local(dir, "graph500.toml", &config, args.peers.max(1) + 1, memory)?;
    Ok(cluster)
}

/// Makes the lowest peer the master and waits for `slaves` slaves.
fn form_group(client: &Client, cluster: &LocalCluster, args: &Graph500Args) -> Result<(), String> {
    let mut peers: Vec<NodeId> = cluster
        .nodes()
        .iter()
        .filter(|node| node.role == myriad_launcher::NodeRole::Peer)
        .map(|node| NodeId(node.node_id))
        .collect();
    peers.sort_unstable();
    let master = *peers.first().ok_or("the cluster has no peer")?;
    set_role(client, master, args.group, Role::Master).map_err(|e| e.to_string())?;
    wait_for_slaves(client, args.group, args.peers)
}

fn wait_for_slaves(client: &Client, group: u16, want: usize) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let have = group_status(client, group).map(|status| status.slaves.len());
        if have.as_ref().is_ok_and(|&n| n >= want) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "group {group} did not get {want} slaves ({have:?})"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `task` with JSON `params` on exactly `slaves` slaves of `group`; the values.
pub fn run_task(
    client: &Client,
    group: u16,
    slaves: usize,
    task: &str,
    params: serde_json::Value,
    timeout: Duration,
) -> Result<Vec<Bytes>, String> {
    let mut script = TaskScript::single(
        task,
        Bytes::from(params.to_string()),
        slaves as u32,
        slaves as u32,
    );
    script.group = group;
    script.task_timeout_ms = timeout.as_millis() as u64;
    script.slaves_wait_ms = 20_000;
    let reply: SubmitReply =
        submit(client, &script, timeout + Duration::from_secs(30)).map_err(|e| e.to_string())?;
    match reply.end {
        ScriptEnd::Finished => {}
        ScriptEnd::Aborted(why) | ScriptEnd::Failed(why) => {
            return Err(format!("{task} failed: {why}"))
        }
    }
    reply
        .tasks
        .into_iter()
        .next()
        .map(|outcome| outcome.values)
        .ok_or_else(|| format!("{task}: no outcome"))
}

fn parse<T: serde::de::DeserializeOwned>(task: &str, value: &[u8]) -> Result<T, String> {
    serde_json::from_slice(value).map_err(|e| format!("{task} answered {e}"))
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph500Figures {
    /// Harmonic mean, min, median, max MTEPS.
    pub mteps: [f64; 4],
    /// Whether every root validated on every slave.
    pub validated: bool,
    /// Seconds of the load task.
    pub load_secs: f64,
    /// Input edges.
    pub edges: u64,
    /// Chunk-store bytes per input edge.
    pub bytes_per_edge: f64,
    /// BFS-row bytes per input edge.
    pub csr_bytes_per_edge: f64,
    /// Roots run.
    pub roots: usize,
    /// The roots, in order.
    pub root_ids: Vec<u32>,
}

/// Harmonic mean, min, median, max of `values`.
pub fn summarize(values: &[f64]) -> [f64; 4] {
    if values.is_empty() {
        return [0.0; 4];
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let hmean = sorted.len() as f64 / sorted.iter().map(|v| 1.0 / v.max(1e-12)).sum::<f64>();
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    [hmean, sorted[0], median, sorted[n - 1]]
}

/// Follows a running `graph.load` until `loading` turns false: a progress bar of the vertex
/// chunks the slaves `nodes` hold (from their chunk statistics, polled every 200 ms) out of
/// the graph's `vertices`, on stderr and only when it is a terminal (indicatif hides it
/// otherwise). A slave whose statistics cannot be read counts as before; the bar never
/// decides anything.
fn follow_load(client: &Client, nodes: &[NodeId], vertices: u64, loading: &AtomicBool) {
    let count = || -> u64 {
        nodes
            .iter()
            .filter_map(|&node| client.blocking().chunks().stats(node).ok())
            .map(|stats| stats.chunks)
            .sum()
    };
    // The load drops an earlier graph of the same name first: count from the lowest seen.
    let mut floor = count();
    let bar = ProgressBar::new(vertices);
    bar.set_style(
        ProgressStyle::with_template(
            "graph500: load {bar:30} {pos}/{len} vertex chunks ({per_sec}, {elapsed})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    while loading.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(200));
        let now = count();
        floor = floor.min(now);
        bar.set_position((now - floor).min(vertices));
    }
    bar.finish_and_clear();
}

/// Loads, picks roots, runs and validates the BFS on `group`'s `peers` slaves, printing
/// progress to stderr.
pub fn run_on_group(client: &Client, args: &Graph500Args) -> Result<Graph500Figures, String> {
    let (group, slaves) = (args.group, args.peers.max(1));
    let long = Duration::from_secs(3600);
    eprintln!(
        "graph500: loading scale {} edgefactor {} on {slaves} slaves ...",
        args.scale, args.edgefactor
    );
    let started = Instant::now();
    let params = json!({"name": "graph500", "scale": args.scale, "edgefactor": args.edgefactor,
                        "seed": args.seed});
    let nodes = group_status(client, group).map_or_else(|_| Vec::new(), |status| status.slaves);
    let vertices = 1u64.checked_shl(args.scale).unwrap_or(u64::MAX);
    let loading = AtomicBool::new(true);
    let values = std::thread::scope(|scope| {
        scope.spawn(|| follow_load(client, &nodes, vertices, &loading));
        let values = run_task(client, group, slaves, "graph.load", params, long);
        loading.store(false, Ordering::Release);
        values
    })?;
    let load_secs = started.elapsed().as_secs_f64();
    let loads: Vec<LoadReport> = values
        .iter()
        .map(|v| parse("graph.load", v))
        .collect::<Result<_, _>>()?;
    let edges = loads.first().map_or(0, |l| l.edges);
    let chunk_bytes: u64 = loads.iter().map(|l| l.chunk_bytes).sum();
    let csr_bytes: u64 = loads.iter().map(|l| l.csr_bytes).sum();
    eprintln!(
        "graph500: loaded {edges} edges in {load_secs:.2} s ({:.2} M edges/s), {} vertex chunks",
        edges as f64 / load_secs.max(1e-9) / 1e6,
        loads.iter().map(|l| l.local_vertices).sum::<u64>()
    );
    let slowest = |phase: fn(&LoadReport) -> f64| loads.iter().map(phase).fold(0.0, f64::max);
    eprintln!(
        "graph500: load phases, slowest slave: generate {:.2} s, distribute {:.2} s, \
         rows {:.2} s, chunks {:.2} s, rows from chunks {:.2} s",
        slowest(|l| l.generate_secs),
        slowest(|l| l.distribute_secs),
        slowest(|l| l.rows_secs),
        slowest(|l| l.chunks_secs),
        slowest(|l| l.index_secs)
    );
    let params = json!({"name": "graph500", "count": args.roots, "seed": args.seed});
    let values = run_task(client, group, slaves, "graph.roots", params, long)?;
    let roots: Vec<u32> = parse("graph.roots", values.first().ok_or("no roots")?)?;
    let mut mteps = Vec::with_capacity(roots.len());
    let mut validated = !roots.is_empty();
    for (batch_index, batch) in roots.chunks(ROOTS_PER_TASK).enumerate() {
        let params = json!({"name": "graph500", "roots": batch, "threads": args.threads,
                            "direction_optimizing": !args.top_down, "validate": true});
        let values = run_task(client, group, slaves, "graph.bfs", params, long)?;
        let per_slave: Vec<Vec<RootReport>> = values
            .iter()
            .map(|v| parse("graph.bfs", v))
            .collect::<Result<_, _>>()?;
        for (i, &root) in batch.iter().enumerate() {
            let reports: Vec<&RootReport> = per_slave
                .iter()
                .filter_map(|reports| reports.get(i))
                .collect();
            let secs = reports.iter().map(|r| r.secs).fold(0.0, f64::max);
            let edges = reports.first().map_or(0, |r| r.edges);
            let valid = reports.len() == slaves && reports.iter().all(|r| r.valid);
            if !valid {
                let why: Vec<&str> = reports.iter().filter_map(|r| r.error.as_deref()).collect();
                eprintln!("graph500: root {root} FAILED validation: {why:?}");
            }
            validated &= valid;
            mteps.push(edges as f64 / secs.max(1e-9) / 1e6);
        }
        let done = (batch_index * ROOTS_PER_TASK + batch.len()).min(roots.len());
        eprintln!(
            "graph500: BFS {done}/{} roots, last {:.1} MTEPS",
            roots.len(),
            mteps.last().copied().unwrap_or(0.0)
        );
    }
    let _ = run_task(
        client,
        group,
        slaves,
        "graph.drop",
        json!({"name": "graph500"}),
        long,
    );
    Ok(Graph500Figures {
        mteps: summarize(&mteps),
        validated,
        load_secs,
        edges,
        bytes_per_edge: chunk_bytes as f64 / edges.max(1) as f64,
        csr_bytes_per_edge: csr_bytes as f64 / edges.max(1) as f64,
        roots: mteps.len(),
        root_ids: roots,
    })
}

/// Runs the benchmark (see the module documentation).
pub fn run(args: &Graph500Args) -> Result<(), String> {
    let temporary = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (figures, _cluster) = match &args.cluster {
        Some(dir) => {
            let info = LocalCluster::open(dir).map_err(|e| e.to_string())?;
            let secret = info.secret().map_err(|e| e.to_string())?;
            let client = Client::connect(info.superpeers(), secret).map_err(|e| e.to_string())?;
            find_master(&client, args.group).map_err(|e| e.to_string())?;
            wait_for_slaves(&client, args.group, args.peers)?;
            let figures = run_on_group(&client, args);
            client.shutdown();
            (figures?, None)
        }
        None => {
            let dir = args
                .dir
                .clone()
                .unwrap_or_else(|| temporary.path().to_path_buf());
            let cluster = start_cluster(args, &dir)?;
            let secret = cluster.secret().map_err(|e| e.to_string())?;
            let client =
                Client::connect(cluster.superpeers(), secret).map_err(|e| e.to_string())?;
            let figures =
                form_group(&client, &cluster, args).and_then(|()| run_on_group(&client, args));
            client.shutdown();
            (figures?, Some(cluster))
        }
    };
    // The local line first: with --json the summary stays the last line.
    if args.local {
        local_bound(args, &figures)?;
    }
    print_figures(args, &figures);
    Ok(())
}

/// The same kernel in this process, one part, every core: MTEPS per root.
fn local_bound(args: &Graph500Args, distributed: &Graph500Figures) -> Result<(), String> {
    use myriad_graph::bfs::{bfs, BfsOptions, Solo};
    use myriad_graph::csr::{local_pairs, Adjacency, Partition};
    let kronecker = Kronecker::new(args.scale, args.edgefactor, args.seed);
    kronecker.check()?;
    let perm = kronecker.permutation();
    let edges: Vec<_> = kronecker.edges(&perm, 0, u64::MAX).collect();
    let partition = Partition::new(kronecker.vertices(), 1);
    let adjacency = Adjacency::from_pairs(
        kronecker.vertices() as usize,
        0,
        &local_pairs(&partition, 0, &edges),
    );
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let options = BfsOptions {
        threads,
        direction_optimizing: !args.top_down,
        ..BfsOptions::default()
    };
    let mut mteps = Vec::new();
    let mut validated = true;
    for &root in &distributed.root_ids {
        let started = Instant::now();
        let outcome =
            bfs(&Solo, &partition, &adjacency, root, &options).map_err(|e| e.to_string())?;
        let secs = started.elapsed().as_secs_f64();
        match validate(&outcome.parents, root, &edges) {
            Ok(in_component) => mteps.push(in_component as f64 / secs.max(1e-9) / 1e6),
            Err(error) => {
                eprintln!("graph500: local BFS from {root} failed validation: {error}");
                validated = false;
            }
        }
    }
    let [hmean, min, median, max] = summarize(&mteps);
    let ratio = distributed.mteps[0] / hmean.max(1e-9);
    emit(
        args.json,
        json!({"bench": "graph500", "case": "local", "scale": args.scale, "threads": threads,
               "roots": mteps.len(), "validated": validated, "mteps_hmean": hmean,
               "mteps_min": min, "mteps_median": median, "mteps_max": max,
               "distributed_to_local": ratio}),
        format!(
            "local   same kernel in one process, {threads} threads, {} roots: {hmean:.1} MTEPS \
             harmonic mean (min {min:.1}, median {median:.1}, max {max:.1}); validated: \
             {validated}; distributed/local {ratio:.2}",
            mteps.len()
        ),
    );
    Ok(())
}

fn print_figures(args: &Graph500Args, figures: &Graph500Figures) {
    let [hmean, min, median, max] = figures.mteps;
    let threads = args
        .threads
        .unwrap_or(std::thread::available_parallelism().map_or(1, usize::from) / args.peers.max(1));
    let load = figures.edges as f64 / figures.load_secs.max(1e-9) / 1e6;
    emit(
        args.json,
        json!({"bench": "graph500", "case": "load", "scale": args.scale,
               "edges": figures.edges, "load_secs": figures.load_secs,
               "load_medges_per_sec": load, "bytes_per_edge": figures.bytes_per_edge,
               "csr_bytes_per_edge": figures.csr_bytes_per_edge}),
        format!(
            "load    scale {} edgefactor {}: {} edges in {:.2} s ({load:.2} M edges/s); \
             {:.1} chunk bytes/edge (+ {:.1} bytes/edge of BFS rows)",
            args.scale,
            args.edgefactor,
            figures.edges,
            figures.load_secs,
            figures.bytes_per_edge,
            figures.csr_bytes_per_edge
        ),
    );
    emit(
        args.json,
        json!({"bench": "graph500", "case": "bfs", "roots": figures.roots,
               "validated": figures.validated, "mteps_hmean": hmean, "mteps_min": min,
               "mteps_median": median, "mteps_max": max,
               "ratio_to_mpi_reference": hmean / REFERENCE_MPI_MTEPS,
               "ratio_to_openmp_reference": hmean / REFERENCE_OPENMP_MTEPS}),
        format!(
            "bfs     {} roots on {} slaves ({} threads each{}): {hmean:.1} MTEPS harmonic mean \
             (min {min:.1}, median {median:.1}, max {max:.1}); validated: {}; \
             {:.2}x the MPI reference (41.2), {:.2}x the OpenMP bound (709, scale 18)",
            figures.roots,
            args.peers,
            threads.max(1),
            if args.top_down { ", top-down only" } else { "" },
            figures.validated,
            hmean / REFERENCE_MPI_MTEPS,
            hmean / REFERENCE_OPENMP_MTEPS
        ),
    );
    if args.json {
        println!(
            "{}",
            json!({"bench": "graph500", "case": "summary", "scale": args.scale,
                   "edgefactor": args.edgefactor, "peers": args.peers, "roots": figures.roots,
                   "validated": figures.validated, "mteps_hmean": hmean, "mteps_min": min,
                   "mteps_median": median, "mteps_max": max, "load_secs": figures.load_secs,
                   "bytes_per_edge": figures.bytes_per_edge,
                   "csr_bytes_per_edge": figures.csr_bytes_per_edge,
                   "threads": threads.max(1), "top_down_only": args.top_down})
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harmonic_mean_and_order_statistics() {
        let [h, min, median, max] = summarize(&[1.0, 2.0, 4.0]);
        assert!((h - 3.0 / 1.75).abs() < 1e-12);
        assert_eq!((min, median, max), (1.0, 2.0, 4.0));
        assert_eq!(summarize(&[]), [0.0; 4]);
        assert_eq!(summarize(&[1.0, 3.0])[2], 2.0);
    }
}
